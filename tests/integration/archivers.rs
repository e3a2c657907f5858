//! Archiver backends written as WASM components, and the capabilities their grants give:
//! conformance of the Rust, Python and JavaScript archivers through `frostline plugin check`;
//! the whole archival protocol through a plugin target; and the sandbox: a plugin reaches
//! exactly what the grant for its content hash gives (a preopen, read-only or read-write, a
//! blob store, HTTP origins, and a loopback address only when the grant names it), nothing
//! outside it, nothing without it, and nothing once its bytes change.

use std::io::ErrorKind as IoErrorKind;
use std::path::{Path, PathBuf};

use frostline::Error;
use frostline::plugin::{PluginLimits, PluginSource, Role, builtin};

use crate::support::*;

/// A component built from `plugins/` by the build script (`dir_archiver`, `escape_archiver`).
fn guest_path(name: &str) -> PathBuf {
    Path::new(builtin::GUEST_DIR).join(format!("{name}.wasm"))
}

/// A Python or JavaScript example built by `plugins/examples/build.sh`.
fn example_path(file: &str) -> PathBuf {
    let dir = std::env::var("FROSTLINE_EXAMPLE_PLUGINS").unwrap_or_else(|_| {
        panic!(
            "FROSTLINE_EXAMPLE_PLUGINS is not set: run the tests with ./scripts/test, or build the examples with \
             `plugins/examples/build.sh DIR` and set FROSTLINE_EXAMPLE_PLUGINS=DIR"
        )
    });
    PathBuf::from(dir).join(file)
}

fn sha256_of(path: &Path) -> String {
    frostline::format::manifest::sha256_hex(&std::fs::read(path).unwrap())
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The same component with one more custom section: it behaves identically, but its content
/// hash differs.
fn modified_copy(original: &Path, to: &Path) {
    let mut bytes = std::fs::read(original).unwrap();
    let (name, payload) = (b"frostline-test", b"one byte changes the hash");
    let mut section = vec![name.len() as u8];
    section.extend_from_slice(name);
    section.extend_from_slice(payload);
    bytes.push(0); // custom section id
    bytes.push(section.len() as u8); // LEB128, below 128
    bytes.extend_from_slice(&section);
    std::fs::write(to, bytes).unwrap();
}

/// A policy directory beside a data directory, loaded through the real loader.
struct PolicyDir {
    root: tempfile::TempDir,
}

impl PolicyDir {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("policies")).unwrap();
        PolicyDir { root }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    fn load(&self, text: &str) -> frostline::Result<frostline::policy::PolicySet> {
        let policies = self.path("policies");
        std::fs::write(policies.join("tables.toml"), text).unwrap();
        frostline::policy::load(&policies, &self.path("data"), shared_host(), &frostline::settings::Settings::default())
    }

    fn refusal(&self, text: &str) -> String {
        match self.load(text) {
            Ok(_) => panic!("the policy was accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }
}

/// Folders for the sandbox tests: `granted/` (preopened read-write, with `inside.txt` and a
/// symbolic link `link` to `../outside/secret.txt`), `ro/` (with `ro.txt`), `outside/`
/// (never granted) and `cold/` (a native target).
struct Sandbox {
    dir: PolicyDir,
    escape: PathBuf,
    escape_hash: String,
}

impl Sandbox {
    fn new() -> Self {
        let dir = PolicyDir::new();
        for folder in ["granted", "ro", "outside", "cold"] {
            std::fs::create_dir_all(dir.path(folder)).unwrap();
        }
        std::fs::write(dir.path("granted/inside.txt"), "inside").unwrap();
        std::fs::write(dir.path("ro/ro.txt"), "read only").unwrap();
        std::fs::write(dir.path("outside/secret.txt"), "hunter2").unwrap();
        std::os::unix::fs::symlink("../outside/secret.txt", dir.path("granted/link")).unwrap();
        let escape = guest_path("escape_archiver");
        let escape_hash = sha256_of(&escape);
        Sandbox { dir, escape, escape_hash }
    }

    fn cold_target(&self) -> String {
        format!("[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", s(&self.dir.path("cold")))
    }

    /// Loads the escape archiver at `plugin` as a target with `probes` (TOML inline tables)
    /// under the extra policy text, and returns its report (one line per probe).
    fn probe_with(&self, plugin: &Path, extra: &str, probes: &[String]) -> String {
        let policy = format!(
            "{}\n[[target]]\nname = \"escape\"\nplugin = \"{}\"\nconfig = {{ probes = [{}] }}\n\n{extra}",
            self.cold_target(),
            s(plugin),
            probes.join(", ")
        );
        let message = self.dir.refusal(&policy);
        assert!(message.contains("refused its configuration"), "not a probe report: {message}");
        message
    }

    fn probe(&self, extra: &str, probes: &[String]) -> String {
        self.probe_with(&self.escape, extra, probes)
    }
}

fn probe(kind: &str, arg: &str) -> String {
    format!("{{ {kind} = \"{arg}\" }}")
}

/// The line of `report` for one probe, e.g. `read /data/x`.
fn line<'a>(report: &'a str, what: &str) -> &'a str {
    report
        .lines()
        .map(|l| l.split_once("configuration: ").map_or(l, |(_, rest)| rest))
        .find(|l| l.starts_with(&format!("{what}: ")))
        .unwrap_or_else(|| panic!("no line for `{what}` in:\n{report}"))
}

fn assert_allowed(report: &str, what: &str) {
    let l = line(report, what);
    assert!(l.contains(": ALLOWED") || l.contains(": ok"), "{what} should be allowed: {l}\n{report}");
}

fn assert_denied(report: &str, what: &str) {
    let l = line(report, what);
    assert!(l.contains(": denied") || l.contains(": err("), "{what} should be denied: {l}\n{report}");
}

#[test]
fn a_plugin_reaches_exactly_its_preopens_and_no_network() {
    let sb = Sandbox::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let secret = sb.dir.path("outside/secret.txt");
    let grant = format!(
        "[[grant]]\nsha256 = \"{}\"\npreopen = [{{ host = \"{}\", guest = \"/data\", mode = \"rw\" }}, \
         {{ host = \"{}\", guest = \"/ro\", mode = \"ro\" }}]\n",
        sb.escape_hash,
        s(&sb.dir.path("granted")),
        s(&sb.dir.path("ro"))
    );
    let report = sb.probe(
        &grant,
        &[
            probe("read", "/data/inside.txt"),
            probe("read", "/ro/ro.txt"),
            probe("write", "/data/written.txt"),
            probe("list", "/data"),
            probe("read", "/data/../outside/secret.txt"),
            probe("read", s(&secret)),
            probe("read", "/data/link"),
            probe("list", "/"),
            probe("write", "/data/../outside/evil.txt"),
            probe("write", "/ro/written.txt"),
            probe("connect", &format!("127.0.0.1:{port}")),
            probe("blob-put", "k"),
        ],
    );
    // Obeyed: what the grant gives works.
    assert_allowed(&report, "read /data/inside.txt");
    assert_allowed(&report, "read /ro/ro.txt");
    assert_allowed(&report, "write /data/written.txt");
    assert!(line(&report, "list /data").contains("inside.txt,link"), "{report}");
    assert_eq!(std::fs::read_to_string(sb.dir.path("granted/written.txt")).unwrap(), "escaped");
    // Violated: a file outside the preopen, by `..`, by host path or by a symbolic link.
    assert_denied(&report, "read /data/../outside/secret.txt");
    assert_denied(&report, &format!("read {}", s(&secret)));
    assert_denied(&report, "read /data/link");
    assert_denied(&report, "list /");
    assert!(!report.contains("hunter2"));
    // Violated: writing outside the preopen, or into a read-only one.
    assert_denied(&report, "write /data/../outside/evil.txt");
    assert_denied(&report, "write /ro/written.txt");
    assert!(!sb.dir.path("outside/evil.txt").exists());
    assert!(!sb.dir.path("ro/written.txt").exists());
    assert_eq!(std::fs::read_to_string(sb.dir.path("ro/ro.txt")).unwrap(), "read only");
    // Violated: a host that is not (and cannot be) listed.
    assert_denied(&report, &format!("connect 127.0.0.1:{port}"));
    assert_eq!(listener.accept().err().map(|e| e.kind()), Some(IoErrorKind::WouldBlock), "nothing connected");
    // A grant without blob_store gives no blob store.
    assert!(line(&report, "blob-put k").contains("not granted"), "{report}");
}

#[test]
fn without_a_grant_a_plugin_reaches_nothing() {
    let sb = Sandbox::new();
    let report = sb.probe(
        "",
        &[probe("read", "/data/inside.txt"), probe("list", "/"), probe("read", s(&sb.dir.path("outside/secret.txt")))],
    );
    assert_denied(&report, "read /data/inside.txt");
    assert_denied(&report, "list /");
    assert_denied(&report, &format!("read {}", s(&sb.dir.path("outside/secret.txt"))));
}

#[test]
fn the_blob_store_is_refused_without_a_grant_and_with_a_grant_for_another_hash() {
    let probes = [probe("blob-put", "escape/k"), probe("blob-get", "escape/k"), probe("blob-list", "escape/")];
    let sb = Sandbox::new();
    // No grant at all.
    let report = sb.probe("", &probes);
    for what in ["blob-put escape/k", "blob-get escape/k", "blob-list escape/"] {
        let l = line(&report, what);
        assert!(l.contains("Permanent") && l.contains("not granted"), "{l}");
        assert!(l.contains(&sb.escape_hash), "the refusal names the hash: {l}");
    }
    // A grant for another component's hash gives this one nothing.
    let other = sha256_of(&guest_path("dir_archiver"));
    let report = sb.probe(&format!("[[grant]]\nsha256 = \"{other}\"\nblob_store = \"cold\"\n"), &probes);
    for what in ["blob-put escape/k", "blob-get escape/k", "blob-list escape/"] {
        assert!(line(&report, what).contains("not granted"), "{report}");
    }
    assert!(!sb.dir.path("cold/escape").exists(), "nothing reached the target");
    // Obeyed: the grant for its own hash lends the target.
    let report = sb.probe(&format!("[[grant]]\nsha256 = \"{}\"\nblob_store = \"cold\"\n", sb.escape_hash), &probes);
    assert_allowed(&report, "blob-put escape/k");
    assert!(line(&report, "blob-get escape/k").contains("ok (7 bytes)"), "{report}");
    assert!(line(&report, "blob-list escape/").contains("ok (escape/k)"), "{report}");
    assert_eq!(std::fs::read(sb.dir.path("cold/escape/k")).unwrap(), b"escaped");
}

#[test]
fn grants_bind_to_the_content_hash_so_a_modified_component_loses_its_grant() {
    let sb = Sandbox::new();
    let grant = format!(
        "[[grant]]\nsha256 = \"{}\"\nblob_store = \"cold\"\npreopen = [{{ host = \"{}\", guest = \"/data\", mode = \"rw\" }}]\n",
        sb.escape_hash,
        s(&sb.dir.path("granted"))
    );
    let probes = [probe("read", "/data/inside.txt"), probe("blob-put", "k")];
    // The granted component reaches both.
    let report = sb.probe(&grant, &probes);
    assert_allowed(&report, "read /data/inside.txt");
    assert_allowed(&report, "blob-put k");
    // The same component with one custom section more: same behaviour, different hash, no grant.
    let modified = sb.dir.path("policies/escape-modified.wasm");
    modified_copy(&sb.escape, &modified);
    assert_ne!(sha256_of(&modified), sb.escape_hash);
    let report = sb.probe_with(&modified, &grant, &[probe("read", "/data/inside.txt"), probe("blob-put", "k2")]);
    assert_denied(&report, "read /data/inside.txt");
    assert!(line(&report, "blob-put k2").contains("not granted"), "{report}");
    assert!(!sb.dir.path("cold/k2").exists());

    // The Rust dir archiver, modified the same way, cannot open its root and is refused.
    let dir_archiver = guest_path("dir_archiver");
    let hash = sha256_of(&dir_archiver);
    let modified = sb.dir.path("policies/dir-modified.wasm");
    modified_copy(&dir_archiver, &modified);
    let message = sb.dir.refusal(&format!(
        "[[target]]\nname = \"d\"\nplugin = \"{}\"\n\n[[grant]]\nsha256 = \"{hash}\"\npreopen = [{{ host = \"{}\", guest = \"/data\", mode = \"rw\" }}]\n",
        s(&modified),
        s(&sb.dir.path("granted"))
    ));
    assert!(message.contains("cannot open root /data"), "{message}");
}

#[test]
fn grants_and_plugin_targets_are_parsed_strictly() {
    let dir = PolicyDir::new();
    std::fs::create_dir_all(dir.path("area")).unwrap();
    let hash = sha256_of(&guest_path("dir_archiver"));
    let dir_archiver = guest_path("dir_archiver");
    let plugin = s(&dir_archiver);
    let area = s(&dir.path("area")).to_string();
    let cold = format!("[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", s(&dir.path("cold")));
    let cases: Vec<(String, &str)> = vec![
        (format!("[[grant]]\nsha256 = \"{hash}\"\npreopens = []\n"), "unknown field `preopens`"),
        (
            format!(
                "[[grant]]\nsha256 = \"{hash}\"\npreopen = [{{ host = \"{area}\", guest = \"/d\", mode = \"rw\", extra = 1 }}]\n"
            ),
            "unknown field `extra`",
        ),
        (
            format!(
                "[[grant]]\nsha256 = \"{hash}\"\npreopen = [{{ host = \"{area}\", guest = \"/d\", mode = \"rwx\" }}]\n"
            ),
            "unknown variant `rwx`",
        ),
        (
            format!("[[grant]]\nsha256 = \"{hash}\"\npreopen = [{{ host = \"{area}\", guest = \"/d\" }}]\n"),
            "missing field `mode`",
        ),
        ("[[grant]]\nsha256 = \"abc\"\n".to_string(), "not 64 hexadecimal digits"),
        ("[[grant]]\nblob_store = \"cold\"\n".to_string(), "missing field `sha256`"),
        (
            format!("[[grant]]\nsha256 = \"{hash}\"\nblob_store = \"nowhere\"\n"),
            "blob_store `nowhere` is not a native target",
        ),
        (
            format!(
                "[[target]]\nname = \"d\"\nplugin = \"{plugin}\"\n\n[[grant]]\nsha256 = \"{hash}\"\nblob_store = \"d\"\n"
            ),
            "blob_store `d` is not a native target",
        ),
        (
            format!("[[grant]]\nsha256 = \"{hash}\"\n\n[[grant]]\nsha256 = \"{}\"\n", hash.to_uppercase()),
            "one grant per hash",
        ),
        (
            format!("[[grant]]\nsha256 = \"{hash}\"\nhttp_hosts = [\"example.com:443\"]\n"),
            "write it as scheme://host:port",
        ),
        (
            format!("[[grant]]\nsha256 = \"{hash}\"\nhttp_hosts = [\"https://example.com/bucket\"]\n"),
            "a path or query is not allowed",
        ),
        (
            format!("[[grant]]\nsha256 = \"{hash}\"\nhttp_hosts = [\"http://x:1\", \"HTTP://X:1/\"]\n"),
            "lists http://x:1 twice",
        ),
        (
            format!("[[grant]]\nsha256 = \"{hash}\"\nhttp_hosts = [\"http://x:1\"]\nhttp_body_limit_mib = 0\n"),
            "http_body_limit_mib = 0 is outside 1..=4096",
        ),
        (format!("[[grant]]\nsha256 = \"{hash}\"\nhttp_body_limit_mib = 8\n"), "without http_hosts limits nothing"),
        (
            format!(
                "[[grant]]\nsha256 = \"{hash}\"\nhttp_hosts = [\"http://x:1\"]\nhttp_private_hosts = [\"http://y:1\"]\n"
            ),
            "http_private_hosts lists http://y:1, which http_hosts does not",
        ),
        (
            format!(
                "[[grant]]\nsha256 = \"{hash}\"\nhttp_hosts = [\"http://10.0.0.5:1\"]\nhttp_private_hosts = [\"http://10.0.0.5:1\"]\n"
            ),
            "an IP address",
        ),
        (
            format!(
                "[[grant]]\nsha256 = \"{hash}\"\npreopen = [{{ host = \"{area}\", guest = \"data\", mode = \"rw\" }}]\n"
            ),
            "must be absolute",
        ),
        (
            format!(
                "[[grant]]\nsha256 = \"{hash}\"\npreopen = [{{ host = \"{area}\", guest = \"/a/../b\", mode = \"rw\" }}]\n"
            ),
            "must be absolute, without",
        ),
        (
            format!(
                "[[grant]]\nsha256 = \"{hash}\"\npreopen = [{{ host = \"{area}\", guest = \"/d\", mode = \"rw\" }}, {{ host = \"{area}\", guest = \"/d/\", mode = \"ro\" }}]\n"
            ),
            "preopened twice",
        ),
        (
            format!(
                "[[grant]]\nsha256 = \"{hash}\"\npreopen = [{{ host = \"missing\", guest = \"/d\", mode = \"ro\" }}]\n"
            ),
            "preopen directory",
        ),
        ("[[target]]\nname = \"x\"\n".to_string(), "needs `url` (a native store) or `plugin`"),
        (
            format!("[[target]]\nname = \"x\"\nurl = \"memory://\"\nplugin = \"{plugin}\"\n"),
            "sets both `url` and `plugin`",
        ),
        (
            format!("[[target]]\nname = \"x\"\nplugin = \"{plugin}\"\nsha256 = \"{}\"\n", "0".repeat(64)),
            "not the pinned",
        ),
        (
            format!("[[target]]\nname = \"x\"\nplugin = \"{}\"\n", s(&guest_path("calendar_utc"))),
            "implements bucket-strategy",
        ),
    ];
    for (text, expected) in cases {
        let message = dir.refusal(&format!("{cold}\n{text}"));
        assert!(message.contains(expected), "expected `{expected}` for:\n{text}\ngot: {message}");
        assert!(message.contains("tables.toml"), "the refusal names the file: {message}");
    }
    // An empty http_hosts grants nothing and is accepted; a read-write preopen is created.
    let fresh = dir.path("created-by-grant");
    dir.load(&format!(
        "{cold}\n[[grant]]\nsha256 = \"{hash}\"\nhttp_hosts = []\npreopen = [{{ host = \"{}\", guest = \"/d\", mode = \"rw\" }}]\n",
        s(&fresh)
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(fresh.is_dir());
}

#[test]
fn an_archiver_that_does_not_import_the_blob_store_still_links() {
    let engine = wasmtime::Engine::default();
    for name in ["memory_archiver", "dir_archiver"] {
        let bytes = std::fs::read(guest_path(name)).unwrap();
        let component = wasmtime::component::Component::new(&engine, &bytes).unwrap();
        let imports: Vec<String> =
            component.component_type().imports(&engine).map(|(name, _)| name.to_string()).collect();
        assert!(!imports.iter().any(|i| i.contains("blob-store")), "{name} imports {imports:?}");
    }
    let escape =
        wasmtime::component::Component::new(&engine, std::fs::read(guest_path("escape_archiver")).unwrap()).unwrap();
    assert!(escape.component_type().imports(&engine).any(|(name, _)| name == "frostline:plugin/blob-store@0.1.0"));
    // Both kinds load as archivers and answer.
    let memory = load(&test_plugin("memory_archiver"), Role::Archiver, PluginLimits::default());
    let archiver = frostline::plugin::archiver::WasmArchiver::new(memory, String::new()).unwrap();
    assert_eq!(archiver.put("k", b"v").unwrap(), frostline::plugin::archiver::BackendAnswer::Ok(()));
    let escape = load(&test_plugin("escape_archiver"), Role::Archiver, PluginLimits::default());
    frostline::plugin::archiver::WasmArchiver::new(escape, String::new()).unwrap();
}

/// Regression (issue: a plugin that sleeps is never stopped): an archiver that slept in `put`
/// stalled the pass, and passes are serialized, so archival stopped for every table. The sleep
/// now ends at the call's time limit, as a fault; the next call gets a fresh instance.
#[test]
fn an_archiver_that_sleeps_in_put_is_stopped_at_its_time_limit() {
    let limits = PluginLimits { call_ms: 300, ..Default::default() };
    let memory = load(&test_plugin("memory_archiver"), Role::Archiver, limits);
    let archiver = frostline::plugin::archiver::WasmArchiver::new(memory, String::new()).unwrap();
    let started = std::time::Instant::now();
    let err = archiver.put("a/sleep", b"v").unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed < std::time::Duration::from_secs(3), "stopped after {elapsed:?}, not at its limit");
    assert!(err.to_string().contains("time limit of 300 ms"), "{err}");
    assert_eq!(archiver.put("k", b"v").unwrap(), frostline::plugin::archiver::BackendAnswer::Ok(()));
}

/// Runs `frostline plugin check --role archiver` with the compiled cache of the tests.
fn plugin_check(plugin: &Path, extra: &[&str]) -> std::process::Output {
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache-cli");
    let mut args = vec!["plugin", "check", s(plugin), "--role", "archiver", "--seed", "11", "--cache-dir", s(&cache)];
    args.extend_from_slice(extra);
    run_frostline(&args)
}

#[test]
fn the_rust_dir_archiver_passes_conformance_with_a_read_write_preopen_only() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = guest_path("dir_archiver");
    let preopen = format!("{}:/data:rw", s(dir.path()));
    let out = plugin_check(&plugin, &["--preopen", &preopen]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("PASSED"));
    // It cleaned up: only its temporary folder is left, and it is empty.
    let left: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(left, [".tmp"]);
    assert_eq!(std::fs::read_dir(dir.path().join(".tmp")).unwrap().count(), 0);

    // Without the preopen it cannot even start; with a read-only one it refuses to start.
    let out = plugin_check(&plugin, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot open root /data"), "{}", text(&out.stderr));
    let out = plugin_check(&plugin, &["--preopen", &format!("{}:/data:ro", s(dir.path()))]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("not writable"), "{}", text(&out.stderr));
}

#[test]
fn the_python_and_javascript_wrappers_pass_conformance_over_a_file_target() {
    for (file, config) in
        [("gzip-archiver-py.wasm", r#"{"level": 9}"#), ("prefix-archiver-js.wasm", r#"{"prefix": "js/"}"#)]
    {
        let dir = tempfile::tempdir().unwrap();
        let config_file = dir.path().join("config.json");
        std::fs::write(&config_file, config).unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir_all(&store).unwrap();
        let url = format!("file://{}", s(&store));
        let plugin = example_path(file);
        let out = plugin_check(&plugin, &["--blob-store", &url, "--config", s(&config_file)]);
        assert_eq!(out.status.code(), Some(0), "{file}: {}{}", text(&out.stdout), text(&out.stderr));
        assert!(text(&out.stdout).contains("PASSED"), "{file}");
        // Without the blob store every call is refused, and the checks fail.
        let out = plugin_check(&plugin, &["--config", s(&config_file)]);
        assert_eq!(out.status.code(), Some(1), "{file}");
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(all.contains("not granted"), "{file}: {all}");
    }
}

const DAILY_TABLE: &str = r#"
[[table]]
id = "r"
target = "arch"
strategy = { plugin = "builtin:calendar-day-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1d" } }
"#;

/// Appends five days over three partitions, archives them through the table's target, reads
/// every record back and verifies every archived bucket.
fn archive_and_read_back(e: &TestEngine) {
    let input = records("2024-03-01T00:00:00Z", 5, 40);
    e.engine.append("r", input.clone()).unwrap();
    let report = e.pass();
    assert_eq!(report.errors, Vec::<String>::new());
    assert_eq!(report.archived, 15, "{report:?}");
    assert_eq!(e.query_all("r"), sorted(input));
    let verdicts = runtime()
        .block_on(frostline::archive::verify::verify(&e.engine.context(), Some("r".into()), None, |_| {}))
        .unwrap();
    assert_eq!(verdicts.len(), 15);
    assert!(verdicts.iter().all(|v| v.ok), "{verdicts:?}");
}

/// Every file under `dir`, relative, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                out.push(path.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn a_table_archives_through_the_rust_dir_archiver() {
    let area = tempfile::tempdir().unwrap();
    let plugin = guest_path("dir_archiver");
    let hash = sha256_of(&plugin);
    let policy = format!(
        "{DAILY_TABLE}\n[[target]]\nname = \"arch\"\nplugin = \"{}\"\nsha256 = \"{hash}\"\nconfig = {{ root = \"/archive\" }}\n\n\
         [[grant]]\nsha256 = \"{hash}\"\npreopen = [{{ host = \"{}\", guest = \"/archive\", mode = \"rw\" }}]\n",
        s(&plugin),
        s(area.path())
    );
    let e = TestEngine::new(&policy, "2024-03-10T00:00:00Z");
    assert!(e.backend("r").target().starts_with("plugin:"), "{}", e.backend("r").target());
    archive_and_read_back(&e);
    // The objects are plain files under the preopened directory, in the engine's layout.
    let files = files_under(area.path());
    let manifests = files.iter().filter(|f| f.contains("/manifest-")).count();
    assert_eq!(manifests, 15, "{files:#?}");
    assert!(files.iter().all(|f| f.starts_with("table=r/")), "{files:#?}");
    assert!(!files.iter().any(|f| f.starts_with(".tmp/")), "no write left half-done: {files:#?}");
    assert!(files.iter().any(|f| f.contains("/seg-")), "{files:#?}");
}

/// A table whose target is `plugin` wrapping the native target `cold`; returns the engine and
/// the folder of `cold`.
fn wrapped_engine(plugin: &Path, config: &str) -> (TestEngine, tempfile::TempDir) {
    let cold = tempfile::tempdir().unwrap();
    let hash = sha256_of(plugin);
    let policy = format!(
        "{DAILY_TABLE}\n[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n\n\
         [[target]]\nname = \"arch\"\nplugin = \"{}\"\nconfig = {config}\n\n\
         [[grant]]\nsha256 = \"{hash}\"\nblob_store = \"cold\"\n",
        s(cold.path()),
        s(plugin)
    );
    (TestEngine::new(&policy, "2024-03-10T00:00:00Z"), cold)
}

#[test]
fn a_table_archives_through_the_python_gzip_wrapper_over_a_file_target() {
    let (e, cold) = wrapped_engine(&example_path("gzip-archiver-py.wasm"), "{ level = 6 }");
    archive_and_read_back(&e);
    let files = files_under(cold.path());
    assert!(files.iter().filter(|f| f.contains("/manifest-")).count() == 15, "{files:#?}");
    for f in &files {
        let bytes = std::fs::read(cold.path().join(f)).unwrap();
        assert_eq!(&bytes[..2], &[0x1f, 0x8b], "{f} is stored gzip-compressed");
    }
}

#[test]
fn a_table_archives_through_the_javascript_prefix_wrapper_over_a_file_target() {
    let (e, cold) = wrapped_engine(&example_path("prefix-archiver-js.wasm"), "{ prefix = \"js-archive/\" }");
    archive_and_read_back(&e);
    let files = files_under(cold.path());
    assert!(files.iter().filter(|f| f.contains("/manifest-")).count() == 15, "{files:#?}");
    assert!(files.iter().all(|f| f.starts_with("js-archive/table=r/")), "{files:#?}");
}

#[test]
fn backend_errors_map_to_the_engines_errors() {
    use frostline::storage::{ArchiveBackend, PutOutcome};
    // `WasmArchiver` also has synchronous `get`, `delete` and `list` (the plugin's own calls),
    // so the backend's are named in full.
    let memory = load(&test_plugin("memory_archiver"), Role::Archiver, PluginLimits::default());
    let archiver = frostline::plugin::archiver::WasmArchiver::new(memory, String::new()).unwrap();
    runtime().block_on(async {
        assert_eq!(archiver.put_create("a/1", "x".into()).await.unwrap(), PutOutcome::Created);
        assert_eq!(archiver.put_create("a/1", "y".into()).await.unwrap(), PutOutcome::AlreadyExists);
        assert_eq!(ArchiveBackend::get(&archiver, "a/1").await.unwrap().as_deref(), Some(&b"x"[..]));
        assert_eq!(ArchiveBackend::get(&archiver, "a/missing").await.unwrap(), None, "not-found is None");
        ArchiveBackend::delete(&archiver, "a/missing").await.unwrap(); // not-found is Ok for delete
        for i in 2..2_005 {
            archiver.put_create(&format!("a/{i:05}"), "z".into()).await.unwrap();
        }
        let listed = ArchiveBackend::list(&archiver, "a/").await.unwrap();
        assert_eq!(listed.len(), 2_004, "listing pages through the plugin");
        assert!(listed.windows(2).all(|w| w[0].key < w[1].key));
    });
    // Permanent errors are errors; a plugin without its blob store answers permanent ones.
    let escape = load(&test_plugin("escape_archiver"), Role::Archiver, PluginLimits::default());
    let archiver = frostline::plugin::archiver::WasmArchiver::new(escape, String::new()).unwrap();
    let err = runtime().block_on(archiver.put_create("k", "x".into())).unwrap_err();
    assert!(matches!(&err, Error::Storage(m) if m.contains("stores nothing")), "{err}");
    let source = PluginSource::from_file(&guest_path("escape_archiver")).unwrap();
    assert!(source.name.ends_with("escape_archiver.wasm"));
}

/// A small HTTP object server on 127.0.0.1 (the protocol of the http-archiver example): objects
/// under `/o/{key}`, create-only puts (`If-None-Match: *`, `412` when the key exists), a listing
/// at `/o/?prefix=&after=&limit=`, and `/moved/{rest}` answering `307` to `{redirect}/o/{rest}`.
/// It records every request it receives.
struct ObjectServer {
    port: u16,
    state: std::sync::Arc<ObjectServerState>,
    _runtime: tokio::runtime::Runtime,
}

#[derive(Default)]
struct ObjectServerState {
    objects: std::sync::Mutex<std::collections::BTreeMap<String, Vec<u8>>>,
    requests: std::sync::Mutex<Vec<String>>,
    redirect: std::sync::Mutex<String>,
}

impl ObjectServer {
    fn start() -> ObjectServer {
        use axum::extract::{Path as UrlPath, Query, State};
        use axum::http::{HeaderMap, Method, StatusCode, Uri};
        use axum::response::IntoResponse;
        type Shared = std::sync::Arc<ObjectServerState>;

        async fn object(
            State(s): State<Shared>,
            method: Method,
            UrlPath(key): UrlPath<String>,
            headers: HeaderMap,
            body: axum::body::Bytes,
        ) -> axum::response::Response {
            let mut objects = s.objects.lock().unwrap();
            match method {
                Method::PUT => {
                    assert_eq!(headers.get("if-none-match").map(|v| v.as_bytes()), Some(&b"*"[..]));
                    if objects.contains_key(&key) {
                        return StatusCode::PRECONDITION_FAILED.into_response();
                    }
                    objects.insert(key, body.to_vec());
                    StatusCode::CREATED.into_response()
                }
                Method::GET => match objects.get(&key) {
                    Some(bytes) => bytes.clone().into_response(),
                    None => StatusCode::NOT_FOUND.into_response(),
                },
                Method::DELETE => match objects.remove(&key) {
                    Some(_) => StatusCode::NO_CONTENT.into_response(),
                    None => StatusCode::NOT_FOUND.into_response(),
                },
                _ => StatusCode::METHOD_NOT_ALLOWED.into_response(),
            }
        }
        async fn listing(
            State(s): State<Shared>,
            Query(q): Query<std::collections::HashMap<String, String>>,
        ) -> String {
            let prefix = q.get("prefix").cloned().unwrap_or_default();
            let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(1000);
            let objects = s.objects.lock().unwrap();
            let keys = objects
                .keys()
                .filter(|k| k.starts_with(&prefix) && q.get("after").is_none_or(|a| k.as_str() > a.as_str()))
                .take(limit);
            keys.map(|k| format!("{k}\n")).collect()
        }
        // Reads the request body before answering, as a server that redirects uploads must.
        async fn moved(State(s): State<Shared>, uri: Uri, _body: axum::body::Bytes) -> axum::response::Response {
            let rest = uri.path().strip_prefix("/moved/").unwrap_or_default();
            let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
            let to = format!("{}/o/{rest}{query}", s.redirect.lock().unwrap());
            (StatusCode::TEMPORARY_REDIRECT, [("location", to)]).into_response()
        }
        async fn record(
            State(s): State<Shared>,
            request: axum::extract::Request,
            next: axum::middleware::Next,
        ) -> axum::response::Response {
            s.requests.lock().unwrap().push(format!("{} {}", request.method(), request.uri()));
            next.run(request).await
        }

        let state = Shared::default();
        let app = axum::Router::new()
            .route("/o/", axum::routing::get(listing))
            .route("/o/{*key}", axum::routing::any(object))
            .route("/moved/", axum::routing::any(moved))
            .route("/moved/{*rest}", axum::routing::any(moved))
            .layer(axum::middleware::from_fn_with_state(state.clone(), record))
            .with_state(state.clone());
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let port = listener.local_addr().unwrap().port();
        runtime.spawn(async move { axum::serve(listener, app).await });
        ObjectServer { port, state, _runtime: runtime }
    }

    fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn requests(&self) -> Vec<String> {
        self.state.requests.lock().unwrap().clone()
    }

    fn keys(&self) -> Vec<String> {
        self.state.objects.lock().unwrap().keys().cloned().collect()
    }
}

/// `frostline plugin check` of the HTTP example archiver with `url` in its config and `extra`
/// arguments.
fn check_http_archiver(url: &str, extra: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(&config, format!("{{\"url\": \"{url}\"}}")).unwrap();
    let mut args = vec!["--config", s(&config)];
    args.extend_from_slice(extra);
    let out = plugin_check(&guest_path("http_archiver"), &args);
    (out.status.code(), format!("{}{}", text(&out.stdout), text(&out.stderr)))
}

#[test]
fn the_http_archiver_passes_conformance_against_an_origin_it_is_granted_and_nothing_without() {
    let server = ObjectServer::start();
    let url = format!("{}/o", server.origin());
    let (code, out) = check_http_archiver(&url, &["--http-host", &server.origin()]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("PASSED"), "{out}");
    assert!(server.requests().iter().any(|r| r.starts_with("PUT /o/")), "{:?}", server.requests());
    assert!(server.keys().is_empty(), "the checks remove their scratch keys: {:?}", server.keys());

    // Without a grant every request is refused by the host before it leaves.
    let before = server.requests().len();
    let (code, out) = check_http_archiver(&url, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("HttpRequestDenied") && out.contains("no http_hosts grant"), "{out}");
    assert_eq!(server.requests().len(), before, "no request reached the server");
}

#[test]
fn the_host_denies_an_unlisted_host_a_redirect_to_one_and_a_plain_http_downgrade() {
    let server = ObjectServer::start();
    let port = server.port;
    let granted = server.origin();
    let cases = [
        // Another name for the granted address is another origin: names are not resolved to
        // match a grant.
        (format!("http://localhost:{port}/o"), granted.clone(), "http://localhost"),
        // The grant names https; the plugin asks for http on the same host and port.
        (format!("http://127.0.0.1:{port}/o"), format!("https://127.0.0.1:{port}"), "not in the grant"),
    ];
    for (url, grant, why) in cases {
        let before = server.requests().len();
        let (code, out) = check_http_archiver(&url, &["--http-host", &grant]);
        assert_eq!(code, Some(1), "{url} with {grant}: {out}");
        assert!(out.contains("HttpRequestDenied") && out.contains(why), "{url} with {grant}: {out}");
        assert_eq!(server.requests().len(), before, "{url} with {grant}: no request reached the server");
    }

    // The server redirects to a host the grant does not list: the plugin follows the 307, and
    // the host refuses the second request, which never arrives.
    *server.state.redirect.lock().unwrap() = format!("http://localhost:{port}");
    let (code, out) = check_http_archiver(&format!("{granted}/moved"), &["--http-host", &granted]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("HttpRequestDenied") && out.contains("http://localhost"), "{out}");
    let requests = server.requests();
    assert!(requests.iter().any(|r| r.contains(" /moved/")), "{requests:?}");
    assert!(!requests.iter().any(|r| r.contains(" /o/")), "the redirected request never arrived: {requests:?}");

    // A redirect within the grant is followed.
    *server.state.redirect.lock().unwrap() = granted.clone();
    let (code, out) = check_http_archiver(&format!("{granted}/moved"), &["--http-host", &granted]);
    assert_eq!(code, Some(0), "{out}");
}

/// A table archived through the HTTP example archiver into `server`, with `extra` lines in its
/// grant.
fn http_archived_engine(server: &ObjectServer, extra_grant: &str) -> TestEngine {
    TestEngine::new(&http_archiver_policy(&server.origin(), extra_grant), "2024-03-10T00:00:00Z")
}

/// A daily table whose target is the HTTP example archiver at `{origin}/o`, granted `origin`
/// and `extra` lines.
fn http_archiver_policy(origin: &str, extra_grant: &str) -> String {
    let plugin = guest_path("http_archiver");
    let hash = sha256_of(&plugin);
    format!(
        "{DAILY_TABLE}\n[[target]]\nname = \"arch\"\nplugin = \"{}\"\nconfig = {{ url = \"{origin}/o\" }}\n\n\
         [[grant]]\nsha256 = \"{hash}\"\nhttp_hosts = [\"{origin}\"]\n{extra_grant}",
        s(&plugin),
    )
}

#[test]
fn a_granted_name_that_resolves_to_loopback_is_refused_without_explicit_permission() {
    let server = ObjectServer::start();
    let port = server.port;
    // `localhost` is granted by name, but the name resolves to a loopback address, which only
    // an address written in the grant, or http_private_hosts, allows.
    let origin = format!("http://localhost:{port}");
    let (code, out) = check_http_archiver(&format!("{origin}/o"), &["--http-host", &origin]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("DestinationIpProhibited"), "{out}");
    assert!(out.contains(&format!("{origin}: localhost resolves to ")) && out.contains("(loopback)"), "{out}");
    let literal = [format!("http://127.0.0.1:{port}"), format!("http://[::1]:{port}")];
    assert!(literal.iter().any(|l| out.contains(l.as_str())), "the refusal shows the address to write: {out}");
    assert!(out.contains("http_private_hosts"), "the refusal says how to allow the name: {out}");
    assert!(server.requests().is_empty(), "no request reached the server: {:?}", server.requests());

    // A policy with the same grant is refused at load: the archiver fails its checks.
    let dir = PolicyDir::new();
    let message = dir.refusal(&http_archiver_policy(&origin, ""));
    assert!(message.contains("DestinationIpProhibited"), "{message}");
    assert!(server.requests().is_empty(), "no request reached the server: {:?}", server.requests());
}

#[test]
fn a_granted_name_that_resolves_to_loopback_is_reached_when_the_grant_lists_it_in_http_private_hosts() {
    let server = ObjectServer::start();
    let origin = format!("http://localhost:{}", server.port);
    let policy = http_archiver_policy(&origin, &format!("http_private_hosts = [\"{origin}\"]\n"));
    let e = TestEngine::new(&policy, "2024-03-10T00:00:00Z");
    archive_and_read_back(&e);
    let keys = server.keys();
    assert_eq!(keys.iter().filter(|k| k.contains("/manifest-")).count(), 15, "{keys:#?}");
    assert!(server.requests().iter().any(|r| r.starts_with("PUT /o/table%3Dr/")), "{:?}", server.requests());
}

#[test]
fn a_table_archives_through_the_http_archiver_and_reads_back_whole() {
    let server = ObjectServer::start();
    let e = http_archived_engine(&server, "");
    archive_and_read_back(&e);
    let keys = server.keys();
    assert_eq!(keys.iter().filter(|k| k.contains("/manifest-")).count(), 15, "{keys:#?}");
    assert!(keys.iter().all(|k| k.starts_with("table=r/")), "{keys:#?}");
    assert!(keys.iter().any(|k| k.contains("/seg-")), "{keys:#?}");
}

#[test]
fn the_grants_http_body_limit_holds_and_is_enforced() {
    // One day of 300 records of about 12 KiB in three partitions: segments of about 1.2 MB,
    // past a 1 MiB limit.
    let big_bodies = |start: &str| {
        let mut input = records(start, 1, 300);
        for r in &mut input {
            r.body = format!("{{\"pad\":\"{}\"}}", "x".repeat(12 * 1024));
        }
        input
    };
    let server = ObjectServer::start();
    let e = http_archived_engine(&server, "http_body_limit_mib = 1\n");
    e.engine.append("r", big_bodies("2024-03-01T00:00:00Z")).unwrap();
    let report = e.pass();
    assert_eq!(report.archived, 0, "{report:?}");
    assert!(report.errors.iter().any(|err| err.contains("HttpRequestBodySize")), "{report:?}");
    assert!(server.keys().iter().all(|k| !k.contains("/manifest-")), "nothing was published: {:?}", server.keys());
    assert_eq!(e.query_all("r").len(), 300, "the records stay hot");

    // The default limit (256 MiB) lets the same bucket through.
    let server = ObjectServer::start();
    let e = http_archived_engine(&server, "");
    e.engine.append("r", big_bodies("2024-03-01T00:00:00Z")).unwrap();
    let report = e.pass();
    assert_eq!((report.archived, report.errors.clone()), (3, Vec::<String>::new()), "{report:?}");
    assert_eq!(e.query_all("r").len(), 300);
}

/// The dir archiver with a read-write preopen of `root` as `/archive`.
fn dir_archiver_over(root: &Path) -> frostline::plugin::archiver::WasmArchiver {
    use frostline::plugin::grants::{Capabilities, Preopen, PreopenMode};
    let loaded =
        load(&PluginSource::from_file(&guest_path("dir_archiver")).unwrap(), Role::Archiver, PluginLimits::default());
    let capabilities = Capabilities {
        preopens: vec![Preopen { host: root.to_path_buf(), guest: "/archive".into(), mode: PreopenMode::Rw }],
        blob_store: None,
        http: None,
    };
    frostline::plugin::archiver::WasmArchiver::with_capabilities(loaded, r#"{"root":"/archive"}"#.into(), capabilities)
        .unwrap()
}

/// Two conformance runs against one store at once, with the same seed (two reloads, a `policy
/// check` beside the engine, two engines sharing a target all do this) each pass: each run
/// writes under a scratch prefix of its own. Found under emulation, where a reload from the
/// policy watcher and one from the API ran together and refused each other.
#[test]
fn conformance_runs_at_once_against_one_store_leave_each_other_alone() {
    let area = tempfile::tempdir().unwrap();
    for round in 0..4 {
        let barrier = std::sync::Barrier::new(2);
        let reports: Vec<_> = std::thread::scope(|scope| {
            let runs: Vec<_> = (0..2)
                .map(|_| {
                    scope.spawn(|| {
                        let archiver = dir_archiver_over(area.path());
                        barrier.wait();
                        let now = frostline::clock::Clock::now(&frostline::clock::SystemClock);
                        frostline::plugin::conformance::check_archiver(&archiver, 0x00f1_0571, now).unwrap()
                    })
                })
                .collect();
            runs.into_iter().map(|run| run.join().unwrap()).collect()
        });
        for report in reports {
            assert!(report.passed(), "round {round}:\n{report}");
        }
    }
}

/// What an interrupted run left behind is removed by a later run once it is a day old (its
/// prefix carries its start time); a run younger than that may still be going, and is left alone.
#[test]
fn conformance_removes_what_old_interrupted_runs_left_and_only_that() {
    let area = tempfile::tempdir().unwrap();
    let now_micros = t("2026-12-01T12:00:00Z");
    let now = (now_micros / 1_000_000) as u64;
    let old = format!("frostline-conformance/{:010x}-00000000000000aa", now - 2 * 86_400);
    let young = format!("frostline-conformance/{:010x}-00000000000000bb", now - 60);
    // The layout of frostline before run prefixes had a start time: the seed alone.
    let seed_only = "frostline-conformance/0000000000f10571";
    for dir in [&old, &young, &seed_only.to_string()] {
        std::fs::create_dir_all(area.path().join(dir)).unwrap();
        std::fs::write(area.path().join(dir).join("a"), b"left behind").unwrap();
    }
    let report =
        frostline::plugin::conformance::check_archiver(&dir_archiver_over(area.path()), 7, now_micros).unwrap();
    assert!(report.passed(), "{report}");
    assert!(!area.path().join(&old).join("a").exists(), "a run two days old was not cleaned up");
    assert!(!area.path().join(seed_only).join("a").exists(), "the seed-only layout was not cleaned up");
    assert!(area.path().join(&young).join("a").exists(), "a run that may still be going was removed");
}

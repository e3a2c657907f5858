//! Archiver backends written as WASM components, and the capabilities their grants give:
//! conformance of the Rust, Python and JavaScript archivers through `frostline plugin check`;
//! the whole archival protocol through a plugin target; and the sandbox: a plugin reaches
//! exactly what the grant for its content hash gives (a preopen, read-only or read-write, and
//! a blob store), nothing outside it, nothing without it, and nothing once its bytes change.

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
            "http_hosts is not supported",
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
    let verdicts =
        runtime().block_on(frostline::archive::verify::verify(&e.engine, Some("r".into()), None, |_| {})).unwrap();
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

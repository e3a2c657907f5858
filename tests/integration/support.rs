//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

use frostline::plugin::{PluginHost, PluginLimits, PluginSource, Role, builtin};

/// A component built from `plugins/testing` by the build script.
pub fn test_plugin(name: &str) -> PluginSource {
    let path = Path::new(builtin::GUEST_DIR).join(format!("{name}.wasm"));
    PluginSource::from_file(&path).unwrap_or_else(|e| panic!("test plugin {name}: {e}"))
}

/// The Python and JavaScript examples, built by `plugins/examples/build.sh` into the folder
/// named by FROSTLINE_EXAMPLE_PLUGINS (the test script sets it).
pub fn example_plugin(file: &str) -> PluginSource {
    let dir = std::env::var("FROSTLINE_EXAMPLE_PLUGINS").unwrap_or_else(|_| {
        panic!(
            "FROSTLINE_EXAMPLE_PLUGINS is not set: run the tests with ./scripts/test, or build the examples with \
             `plugins/examples/build.sh DIR` and set FROSTLINE_EXAMPLE_PLUGINS=DIR"
        )
    });
    PluginSource::from_file(&PathBuf::from(dir).join(file)).unwrap_or_else(|e| panic!("{e}"))
}

/// The compiled-plugin cache beside the test binary: reruns skip compilation. The shared host
/// uses it, and so do the simulations' engines (`Settings::plugin_cache_dir`), which would
/// otherwise compile the built-ins again for every seed, rebuild and peer (half their time).
pub fn shared_plugin_cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")
}

/// One host per test binary keeps compile work down; tests that need their own cache make one.
pub fn shared_host() -> &'static PluginHost {
    static HOST: OnceLock<PluginHost> = OnceLock::new();
    HOST.get_or_init(|| PluginHost::new(Some(shared_plugin_cache())).expect("plugin host"))
}

pub fn load(
    source: &PluginSource,
    role: Role,
    limits: PluginLimits,
) -> std::sync::Arc<frostline::plugin::LoadedPlugin> {
    shared_host().load(source, role, limits).unwrap_or_else(|e| panic!("{e}"))
}

/// The path of the real binary under test: the one cargo built beside this test binary, or
/// `FROSTLINE_BIN` when set (a long run started from a saved copy of both binaries keeps
/// testing the same build while the working tree is rebuilt).
pub fn frostline_bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| std::env::var("FROSTLINE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_frostline").to_string()))
}

/// Runs the binary and returns its output.
pub fn run_frostline(args: &[&str]) -> Output {
    std::process::Command::new(frostline_bin()).args(args).output().expect("running frostline")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An engine on temporary directories with a manual clock.
pub struct TestEngine {
    pub engine: std::sync::Arc<frostline::engine::Engine>,
    pub clock: std::sync::Arc<frostline::clock::ManualClock>,
    /// Kept so the directories live as long as the engine.
    _dir: tempfile::TempDir,
    options: frostline::policy::LoadOptions,
    settings: frostline::settings::Settings,
}

/// An erasure request as the tests place it: `selector`, under the id `id`.
pub fn erasure_request(
    id: &str,
    selector: frostline::store::erasure::ErasureSelector,
) -> frostline::store::erasure::ErasureRequest {
    frostline::store::erasure::ErasureRequest {
        id: id.to_string(),
        selector,
        reason: "GDPR article 17 request 42".into(),
        requester: "dpo@example.com".into(),
        placed_at: 0,
        finished_at: None,
        buckets: Vec::new(),
        fleet: Vec::new(),
        answers_for: None,
    }
}

pub fn t(text: &str) -> i64 {
    frostline::model::time::parse_rfc3339(text).unwrap()
}

impl TestEngine {
    /// `policy` is the text of `policies/tables.toml`.
    pub fn new(policy: &str, now: &str) -> TestEngine {
        Self::open(policy, now, &[], Default::default()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like `new`, with more files in the policy directory (`(relative path, content)`, e.g.
    /// secret files) and load options (e.g. a wrapper around each target, which is still
    /// probed); returns the engine's refusal instead of panicking.
    pub fn open(
        policy: &str,
        now: &str,
        files: &[(&str, &str)],
        options: frostline::policy::LoadOptions,
    ) -> Result<TestEngine, frostline::error::Error> {
        Self::open_with_settings(policy, now, files, options, frostline::settings::Settings::default())
    }

    /// `open` with settings (the simulations seed the engine's random choices with their own).
    pub fn open_with_settings(
        policy: &str,
        now: &str,
        files: &[(&str, &str)],
        options: frostline::policy::LoadOptions,
        settings: frostline::settings::Settings,
    ) -> Result<TestEngine, frostline::error::Error> {
        let dir = tempfile::tempdir().unwrap();
        let policies = dir.path().join("policies");
        std::fs::create_dir_all(&policies).unwrap();
        std::fs::write(policies.join("tables.toml"), policy).unwrap();
        for (path, content) in files {
            let path = policies.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        let clock = frostline::clock::ManualClock::new(t(now));
        let engine = frostline::engine::Engine::open_with(
            &dir.path().join("data"),
            &policies,
            settings.clone(),
            clock.clone(),
            options.clone(),
        )?;
        Ok(TestEngine { engine, clock, _dir: dir, options, settings })
    }

    /// Closes the engine and opens its directories again (a clean restart; the clock goes on).
    pub fn restart(self) -> Result<TestEngine, frostline::error::Error> {
        self.reopen(false)
    }

    /// The engine stopped (closed) while `meanwhile` runs, then started again.
    pub fn stopped_while(self, meanwhile: impl FnOnce()) -> Result<TestEngine, frostline::error::Error> {
        self.reopen_with(|_| meanwhile())
    }

    /// A restart on a data directory whose database was lost and made anew (a new installation
    /// id): the policy directory and the targets remain (the default target's `archive/`
    /// folder inside the data directory too), everything else the directory held is gone.
    pub fn rebuild(self) -> Result<TestEngine, frostline::error::Error> {
        self.reopen(true)
    }

    /// A backup of the data directory as an operator takes one: the engine stopped, every file
    /// but the default target's `archive/` folder copied to `into`; the engine starts again.
    pub fn backup(self, into: &std::path::Path) -> Result<TestEngine, frostline::error::Error> {
        self.reopen_with(|data| {
            let _ = std::fs::remove_dir_all(into);
            copy_data_files(data, into);
        })
    }

    /// A restart on a data directory restored from a backup `backup` made the copy that went on
    /// (the targets stay as that copy left them).
    pub fn restore(self, backup: &std::path::Path) -> Result<TestEngine, frostline::error::Error> {
        self.reopen_with(|data| {
            remove_data_files(data);
            copy_data_files(backup, data);
        })
    }

    fn reopen(self, lose_data: bool) -> Result<TestEngine, frostline::error::Error> {
        self.reopen_with(|data| {
            if lose_data {
                remove_data_files(data);
            }
        })
    }

    /// Closes the engine, does `between` to its data directory, and opens it again.
    fn reopen_with(self, between: impl FnOnce(&std::path::Path)) -> Result<TestEngine, frostline::error::Error> {
        let TestEngine { engine, clock, _dir: dir, options, settings } = self;
        let policies = engine.policies().dir.clone();
        let data = engine.data_dir().to_path_buf();
        assert_eq!(std::sync::Arc::strong_count(&engine), 1, "the engine is still shared: it cannot close");
        drop(engine);
        between(&data);
        let engine =
            frostline::engine::Engine::open_with(&data, &policies, settings.clone(), clock.clone(), options.clone())?;
        Ok(TestEngine { engine, clock, _dir: dir, options, settings })
    }

    /// The data directory (the default target is its `archive/` folder).
    pub fn data_dir(&self) -> std::path::PathBuf {
        self.engine.data_dir().to_path_buf()
    }

    /// The policy directory.
    pub fn policies_dir(&self) -> std::path::PathBuf {
        self._dir.path().join("policies")
    }

    /// Replaces one table's archive backend (to inject faults).
    pub fn with_backend(&self, table: &str, backend: std::sync::Arc<dyn frostline::storage::ArchiveBackend>) {
        self.with_table(table, |old| frostline::policy::TablePolicy { backend, ..old.clone() });
    }

    /// Replaces one table's bucket strategy with what `wrap` makes of it (to inject faults).
    pub fn with_strategy(
        &self,
        table: &str,
        wrap: impl FnOnce(
            std::sync::Arc<dyn frostline::model::BucketStrategy>,
        ) -> std::sync::Arc<dyn frostline::model::BucketStrategy>,
    ) {
        self.with_table(table, |old| frostline::policy::TablePolicy {
            strategy: wrap(old.strategy.clone()),
            ..old.clone()
        });
    }

    /// Installs the running set with one table's policy replaced by `change` of it.
    fn with_table(
        &self,
        table: &str,
        change: impl FnOnce(&frostline::policy::TablePolicy) -> frostline::policy::TablePolicy,
    ) {
        let current = self.engine.policies();
        let mut tables = current.tables.clone();
        let old = tables.get(table).unwrap().clone();
        tables.insert(table.to_string(), std::sync::Arc::new(change(&old)));
        self.engine.install_policies(frostline::policy::PolicySet { tables, ..(*current).clone() }).unwrap();
    }

    pub fn backend(&self, table: &str) -> std::sync::Arc<dyn frostline::storage::ArchiveBackend> {
        self.engine.policies().tables.get(table).unwrap().backend.clone()
    }

    pub fn pass(&self) -> frostline::archive::PassReport {
        run_pass(&self.engine)
    }

    pub fn query_all(&self, table: &str) -> Vec<frostline::model::Record> {
        query_engine(&self.engine, table)
    }

    /// The first page of a query of every record of `table` (the expired ranges it reports
    /// included).
    pub fn first_page(&self, table: &str) -> frostline::query::QueryPage {
        runtime()
            .block_on(frostline::query::query(
                &self.engine.context(),
                frostline::query::QueryRequest { table: table.into(), ..Default::default() },
            ))
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// One archival pass of `engine` as worker `test-worker`.
pub fn run_pass(engine: &std::sync::Arc<frostline::engine::Engine>) -> frostline::archive::PassReport {
    runtime().block_on(frostline::archive::run_pass(&engine.context(), "test-worker")).unwrap()
}

/// Every record of a table, read page by page (a small page, so pagination is exercised).
pub fn query_engine(engine: &std::sync::Arc<frostline::engine::Engine>, table: &str) -> Vec<frostline::model::Record> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = runtime()
            .block_on(frostline::query::query(
                &engine.context(),
                frostline::query::QueryRequest { table: table.into(), limit: 97, cursor, ..Default::default() },
            ))
            .unwrap_or_else(|e| panic!("{e}"));
        out.extend(page.records);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
}

pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap())
}

/// Partition keys shaped as users' device keys are: a `/`, a `%`, an `=`, spaces and non-ASCII,
/// which every layout must carry through object keys, Hive folders and Delta paths. Key `n`
/// starts with `p{n}`, so they sort in the order of `n`, as the plain `p0`, `p1`, `p2` did.
pub const USER_KEYS: [&str; 3] = ["p0/site-a/sensor 1", "p1%2F=température", "p2 kühl/😀"];

/// Records over `days` days from `start`, `per_day` each, over a few partitions and tenants.
pub fn records(start: &str, days: i64, per_day: i64) -> Vec<frostline::model::Record> {
    let day = 86_400_000_000i64;
    let mut out = Vec::new();
    for d in 0..days {
        for i in 0..per_day {
            let n = d * per_day + i;
            out.push(frostline::model::Record {
                partition_key: format!("p{}", n % 3).into_bytes(),
                event_time: t(start) + d * day + i * 1_000_000,
                sort_key: format!("{n:06}").into_bytes(),
                tenant: Some(["acme", "globex"][(n % 2) as usize].to_string()),
                kind: Some("reading".into()),
                body: format!(r#"{{"n":{n},"v":"{}"}}"#, "x".repeat((n % 50) as usize)),
            });
        }
    }
    out
}

/// Sorts records the way queries return them.
pub fn sorted(mut records: Vec<frostline::model::Record>) -> Vec<frostline::model::Record> {
    records.sort_by(|a, b| {
        (a.event_time, &a.sort_key, &a.partition_key).cmp(&(b.event_time, &b.sort_key, &b.partition_key))
    });
    records
}

/// A certificate authority and a certificate it signed for `localhost` and `127.0.0.1` with
/// its key, made in the test (rcgen), as PEM and DER.
pub struct TestCertificates {
    pub ca_pem: String,
    pub ca_der: Vec<u8>,
    pub cert_pem: String,
    pub cert_der: Vec<u8>,
    pub key_pem: String,
    pub key_der: Vec<u8>,
}

pub fn test_certificates() -> TestCertificates {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let certificate = params.signed_by(&key, &ca, &ca_key).unwrap();
    TestCertificates {
        ca_pem: ca.pem(),
        ca_der: ca.der().to_vec(),
        cert_pem: certificate.pem(),
        cert_der: certificate.der().to_vec(),
        key_pem: key.serialize_pem(),
        key_der: key.serialize_der(),
    }
}

/// Everything in a data directory but the default target's `archive/` folder.
fn data_files(data: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(data)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.file_name() != Some(std::ffi::OsStr::new("archive")))
        .collect()
}

fn remove_data_files(data: &std::path::Path) {
    for path in data_files(data) {
        if path.is_dir() {
            std::fs::remove_dir_all(path).unwrap();
        } else {
            std::fs::remove_file(path).unwrap();
        }
    }
}

fn copy_data_files(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for path in data_files(from) {
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_data_files(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// A target whose listing of `prefix` names `count` more objects after the real ones, each made
/// by `make` from its number and never stored: what a memory test lists a large archive with,
/// without writing it. Everything else goes to `inner`.
#[derive(Debug)]
pub struct PaddedListing {
    pub inner: std::sync::Arc<dyn frostline::storage::ArchiveBackend>,
    pub prefix: &'static str,
    pub count: usize,
    pub make: fn(usize) -> frostline::storage::ObjectInfo,
}

#[async_trait::async_trait]
impl frostline::storage::ArchiveBackend for PaddedListing {
    fn target(&self) -> &str {
        self.inner.target()
    }

    async fn put_create(&self, key: &str, bytes: bytes::Bytes) -> frostline::Result<frostline::storage::PutOutcome> {
        self.inner.put_create(key, bytes).await
    }

    async fn get(&self, key: &str) -> frostline::Result<Option<bytes::Bytes>> {
        self.inner.get(key).await
    }

    async fn delete(&self, key: &str) -> frostline::Result<()> {
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> frostline::Result<Vec<frostline::storage::ObjectInfo>> {
        use futures::TryStreamExt as _;
        let mut listed: Vec<_> = self.list_stream(prefix).try_collect().await?;
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listed)
    }

    fn list_stream<'a>(
        &'a self,
        prefix: &'a str,
    ) -> futures::stream::BoxStream<'a, frostline::Result<frostline::storage::ObjectInfo>> {
        use futures::StreamExt as _;
        let count = if prefix == self.prefix { self.count } else { 0 };
        let make = self.make;
        self.inner.list_stream(prefix).chain(futures::stream::iter((0..count).map(move |n| Ok(make(n))))).boxed()
    }
}

/// Runs the test `name` again in a process of its own with `env`, and returns the peak resident
/// set (`VmHWM`, KiB) that the run printed with `print_peak`. The process has one malloc arena
/// (`MALLOC_ARENA_MAX=1`), so its peak follows what the code holds: with one arena per thread,
/// glibc keeps memory a thread freed for that thread, and which threads read what varies from
/// run to run (adopting 72 MiB of bodies peaked 8 to 17 MiB apart in runs of one binary).
pub fn peak_kib_of(name: &str, env: &[(&str, String)]) -> f64 {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env("MALLOC_ARENA_MAX", "1")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().find_map(|l| l.split_once("PEAK ")).expect(&stdout).1;
    line.trim_end_matches(" kB").trim().parse().unwrap()
}

/// Prints this process's peak resident set for `peak_kib_of`.
pub fn print_peak() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let peak = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).unwrap().trim().to_string();
    println!("PEAK {peak}");
}

/// The catalogs of `installation`'s archives of `table`, by file name (one per day its buckets
/// start on): when each was written, and the manifests it lists.
pub fn catalogs_of(
    backend: &std::sync::Arc<dyn frostline::storage::ArchiveBackend>,
    table: &str,
    installation: &str,
) -> std::collections::BTreeMap<String, (i64, Vec<String>)> {
    let folder = frostline::archive::catalog::catalogs_folder(table, installation);
    let mut out = std::collections::BTreeMap::new();
    for object in runtime().block_on(backend.list(&folder)).unwrap() {
        let bytes = runtime().block_on(backend.get(&object.key)).unwrap().unwrap();
        let catalog: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let manifests = catalog["manifests"].as_array().map_or_else(Vec::new, |manifests| {
            manifests.iter().map(|m| m["manifest_key"].as_str().unwrap().to_string()).collect()
        });
        out.insert(object.key[folder.len()..].to_string(), (catalog["generated_at"].as_i64().unwrap_or(0), manifests));
    }
    out
}

/// `policy` (its table on the default target) and the same with its table moved to a second
/// local target `t2`, both declaring `t2`: (t2's folder, on the default target, on `t2`).
pub fn policies_moving_to_t2(policy: &str) -> (tempfile::TempDir, String, String) {
    let t2 = tempfile::tempdir().unwrap();
    let target = format!("[[target]]\nname = \"t2\"\nurl = \"file://{}\"\n", t2.path().display());
    let on_t2 = format!("{target}{}", policy.replace("[[table]]", "[[table]]\ntarget = \"t2\""));
    (t2, format!("{target}{policy}"), on_t2)
}

/// The Python interpreter with the readers (DuckDB, pyarrow, polars, delta-rs) the tests read
/// archives with, as `scripts/install-python-tools` installs it.
pub fn python() -> String {
    std::env::var("FROSTLINE_PYTHON").unwrap_or_else(|_| {
        panic!("FROSTLINE_PYTHON is not set: run the tests with ./scripts/test (scripts/install-python-tools installs the readers)")
    })
}

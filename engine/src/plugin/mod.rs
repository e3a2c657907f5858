//! The sandboxed WebAssembly plugin host.
//!
//! Owns the wasmtime `Engine` and `Linker` (built once), the on-disk cache of compiled
//! components, per-call time limits (epoch interruption) and per-instance memory limits, and
//! the fault handling that turns a trap into a reported plugin fault and a fresh instance.
//! The role modules (`strategy`, `retention`, `archiver`) wrap a loaded component behind the
//! core traits and check every answer it gives.
//!
//! Imports the core (`model`, `error`); nothing above it (store, coordinator, API) is imported.

pub mod archiver;
pub mod bindings;
pub mod builtin;
pub mod cache;
pub mod conformance;
pub mod grants;
pub mod http;
pub mod instance;
pub mod precompile;
pub mod provenance;
pub mod retention;
mod state;
pub mod strategy;
pub mod waits;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, InstancePre, Linker, ResourceTable};
use wasmtime::{Config, Engine, ResourceLimiter};

use crate::error::{Error, Result};

pub use self::cache::CacheStats;
pub use self::grants::Capabilities;
use self::state::Budget;
pub use self::state::PluginState;

/// The contract package every plugin is built against.
pub const CONTRACT_PACKAGE: &str = "frostline:plugin";
/// The contract versions this host can run. See wit/README.md for the versioning rule.
pub const CONTRACT_VERSIONS_SUPPORTED: &[&str] = &["0.1.0"];
/// The version the host's own bindings were generated from.
pub const CONTRACT_VERSION: &str = "0.1.0";

/// The wasmtime this host is built with (pinned in engine/Cargo.toml; a unit test holds this
/// to Cargo.lock): the compiled-cache compatibility and the WASI versions follow from it.
pub const WASMTIME_VERSION: &str = "48.0.8";

pub const PLUGIN_CALL_MS_DEFAULT: u64 = 1_000;
pub const PLUGIN_CALL_MS_MAX: u64 = 60_000;
pub const PLUGIN_MEMORY_BYTES_DEFAULT: usize = 64 * 1024 * 1024;
pub const PLUGIN_MEMORY_BYTES_MIN: usize = 1024 * 1024;
pub const PLUGIN_MEMORY_BYTES_MAX: usize = 4 * 1024 * 1024 * 1024;
/// How often the epoch advances; a call overruns its deadline by at most about one tick.
pub const EPOCH_TICK_MS: u64 = 5;
/// Table elements a plugin instance may hold across all its tables (each costs a pointer on
/// the host).
pub const PLUGIN_TABLE_ELEMENTS_MAX: usize = 100_000;
/// Core instances, linear memories and tables one plugin instance may create. A component
/// made by componentize-py or jco holds a handful of each; the caps stop a component from
/// multiplying them.
pub const PLUGIN_INSTANCES_MAX: usize = 64;
pub const PLUGIN_MEMORIES_MAX: usize = 16;
pub const PLUGIN_TABLES_MAX: usize = 64;

/// The three plugin roles, one WIT world each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    BucketStrategy,
    RetentionPolicy,
    Archiver,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::BucketStrategy, Role::RetentionPolicy, Role::Archiver];

    /// The WIT world name.
    pub fn world(self) -> &'static str {
        match self {
            Role::BucketStrategy => "bucket-strategy",
            Role::RetentionPolicy => "retention-policy",
            Role::Archiver => "archiver",
        }
    }

    /// The interface the world exports, without package or version.
    pub fn interface(self) -> &'static str {
        match self {
            Role::BucketStrategy => "strategy",
            Role::RetentionPolicy => "policy",
            Role::Archiver => "backend",
        }
    }

    pub fn parse(text: &str) -> Result<Role> {
        Role::ALL.into_iter().find(|r| r.world() == text).ok_or_else(|| {
            Error::InvalidInput(format!(
                "unknown plugin role `{text}`; use one of bucket-strategy, retention-policy, archiver"
            ))
        })
    }

    fn from_interface(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.interface() == name)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.world())
    }
}

/// Per-plugin limits; both can be set per plugin in the policy directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PluginLimits {
    pub call_ms: u64,
    pub memory_bytes: usize,
}

impl Default for PluginLimits {
    fn default() -> Self {
        PluginLimits { call_ms: PLUGIN_CALL_MS_DEFAULT, memory_bytes: PLUGIN_MEMORY_BYTES_DEFAULT }
    }
}

impl PluginLimits {
    pub fn validate(&self) -> Result<()> {
        if self.call_ms == 0 || self.call_ms > PLUGIN_CALL_MS_MAX {
            return Err(Error::InvalidInput(format!(
                "time limit {} ms is outside 1..={PLUGIN_CALL_MS_MAX} ms",
                self.call_ms
            )));
        }
        if !(PLUGIN_MEMORY_BYTES_MIN..=PLUGIN_MEMORY_BYTES_MAX).contains(&self.memory_bytes) {
            return Err(Error::InvalidInput(format!(
                "memory limit {} bytes is outside {PLUGIN_MEMORY_BYTES_MIN}..={PLUGIN_MEMORY_BYTES_MAX} bytes",
                self.memory_bytes
            )));
        }
        Ok(())
    }

    fn deadline_ticks(&self) -> u64 {
        self.call_ms.div_ceil(EPOCH_TICK_MS) + 1
    }

    /// When a call that starts now must end, and the limit, for the waits in host calls.
    fn call_deadline(&self) -> (std::time::Instant, u64) {
        (std::time::Instant::now() + std::time::Duration::from_millis(self.call_ms), self.call_ms)
    }
}

/// A component's bytes and the name it is reported under (a path or `builtin:NAME`).
#[derive(Clone)]
pub struct PluginSource {
    pub name: String,
    pub bytes: Arc<[u8]>,
}

impl PluginSource {
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::PluginLoad {
            source_name: path.display().to_string(),
            reason: format!("cannot read the file: {e}"),
        })?;
        Ok(PluginSource { name: path.display().to_string(), bytes: bytes.into() })
    }
}

pub(crate) struct HostInner {
    engine: Engine,
    /// What strategies and retention policies may import.
    linker: Linker<PluginState>,
    /// The same and `wasi:http`, for archivers.
    archiver_linker: Linker<PluginState>,
    cache: cache::CompiledCache,
    ticker_stop: Arc<AtomicBool>,
}

impl Drop for HostInner {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

/// The wasmtime settings of every engine frostline makes: the host's, and the ones
/// `plugin compile --target` compiles with for another host. A change here that changes
/// compiled code must also change `precompile::ENGINE_SETTINGS`, which names precompiled
/// artifacts.
pub(crate) fn engine_config() -> Config {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config.wasm_component_model(true);
    // Off (as by default) on purpose: with them wasmtime may report a failed growth the
    // limiter never approved, and `Budget::grow_failed` would then give back an earlier
    // growth's charge.
    config.wasm_custom_page_sizes(false);
    config.wasm_memory64(false);
    config
}

/// The plugin host: build it once per process and load every plugin through it.
#[derive(Clone)]
pub struct PluginHost {
    inner: Arc<HostInner>,
}

impl PluginHost {
    /// A host whose compiled components are cached in `cache_dir` (`None`: in memory only),
    /// proven by the engine's own key beside it (`plugin::provenance`).
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Self> {
        Self::with_cache(cache_dir, None)
    }

    /// `new`, also accepting the artifacts proven by the operator's key in `operator_key_file`
    /// (FROSTLINE_PLUGIN_CACHE_KEY_FILE: what `plugin compile --key-file` made on a build
    /// host; the only artifacts, besides its built-ins, a build without a compiler runs).
    pub fn with_cache(cache_dir: Option<PathBuf>, operator_key_file: Option<&Path>) -> Result<Self> {
        let operator_key = operator_key_file
            .map(|path| provenance::ArtifactKey::from_file(path, provenance::KEY_FILE_ENV))
            .transpose()?;
        let engine = Engine::new(&engine_config())
            .map_err(|e| Error::Internal(format!("cannot create the wasm engine: {e}")))?;

        let linker = base_linker(&engine)?;
        let mut archiver_linker = base_linker(&engine)?;
        // Outgoing requests only to the origins the archiver's grant lists (plugin::http).
        wasmtime_wasi_http::p2::add_only_http_to_linker_sync(&mut archiver_linker)
            .map_err(|e| Error::Internal(format!("cannot link wasi:http: {e}")))?;

        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(engine.weak(), ticker_stop.clone());
        let cache = cache::CompiledCache::new(cache_dir, &engine, operator_key);
        Ok(PluginHost { inner: Arc::new(HostInner { engine, linker, archiver_linker, cache, ticker_stop }) })
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.inner.cache.stats()
    }

    /// Loads a component for `role`: checks it is a component, compiles it (or loads it from
    /// the compiled cache), checks that it implements the role's world at a supported
    /// contract version and that the host can satisfy its imports.
    pub fn load(&self, source: &PluginSource, role: Role, limits: PluginLimits) -> Result<Arc<LoadedPlugin>> {
        limits.validate().map_err(|e| Error::PluginLoad { source_name: source.name.clone(), reason: e.to_string() })?;
        check_component_header(&source.name, &source.bytes)?;
        let hash = hex::encode(Sha256::digest(&source.bytes));
        let component = self.inner.cache.load_or_compile(&self.inner.engine, &source.name, &hash, &source.bytes)?;
        check_world(&self.inner.engine, &source.name, &component, role)?;
        let linker = if role == Role::Archiver { &self.inner.archiver_linker } else { &self.inner.linker };
        let pre = linker.instantiate_pre(&component).map_err(|e| Error::PluginLoad {
            source_name: source.name.clone(),
            reason: format!(
                "it imports something frostline does not provide to a {role} ({e:#}); a plugin may import WASI 0.2, \
                 frostline:plugin/log and frostline:plugin/blob-store, and an archiver also wasi:http/outgoing-handler"
            ),
        })?;
        Ok(Arc::new(LoadedPlugin { name: source.name.clone(), hash, role, limits, pre, host: self.inner.clone() }))
    }
}

/// A compiled component that implements one role, ready to be instantiated.
pub struct LoadedPlugin {
    pub name: String,
    /// SHA-256 of the component's bytes, hex.
    pub hash: String,
    pub role: Role,
    pub limits: PluginLimits,
    pre: InstancePre<PluginState>,
    host: Arc<HostInner>,
}

impl LoadedPlugin {
    pub fn hash_short(&self) -> &str {
        &self.hash[..12]
    }

    /// A fresh store whose WASI context and blob store hold exactly `capabilities`.
    fn new_store(&self, capabilities: &Capabilities) -> Result<wasmtime::Store<PluginState>> {
        let state = PluginState {
            // Strategies and retention policies answer from their input alone (ARCHITECTURE.md).
            wasi: capabilities.wasi_ctx(self.role != Role::Archiver)?,
            blob_store: grants::BlobStoreBinding {
                grant: capabilities.blob_store.clone(),
                plugin_hash: self.hash.as_str().into(),
            },
            table: ResourceTable::new(),
            plugin_name: self.name.as_str().into(),
            plugin_hash_short: self.hash_short().into(),
            memory: Budget::new(self.limits.memory_bytes),
            table_elements: Budget::new(PLUGIN_TABLE_ELEMENTS_MAX),
            memory_refused_bytes: None,
            call_deadline: Some(self.limits.call_deadline()),
            http: wasmtime_wasi_http::WasiHttpCtx::new(),
            http_hooks: http::HttpHooks {
                grant: capabilities.http.clone(),
                call_ms: self.limits.call_ms,
                plugin_name: self.name.as_str().into(),
            },
        };
        let mut store = wasmtime::Store::new(&self.host.engine, state);
        store.limiter(|state| state as &mut dyn ResourceLimiter);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.limits.deadline_ticks());
        Ok(store)
    }
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.name)
            .field("hash", &self.hash)
            .field("role", &self.role)
            .field("limits", &self.limits)
            .finish()
    }
}

/// WASI 0.2 and frostline's imports, which every plugin may use.
fn base_linker(engine: &Engine) -> Result<Linker<PluginState>> {
    let mut linker: Linker<PluginState> = Linker::new(engine);
    // Python and JavaScript guests import WASI even when they use none of it; the context
    // each store gets grants nothing (no preopens, environment, arguments or sockets).
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
        .map_err(|e| Error::Internal(format!("cannot link WASI: {e}")))?;
    bindings::log_iface::add_to_linker::<_, wasmtime::component::HasSelf<_>>(&mut linker, |state| state)
        .map_err(|e| Error::Internal(format!("cannot link the log import: {e}")))?;
    // Linked for every plugin; a call answers "not granted" unless the instance was given a
    // blob store by its grant.
    bindings::blob_store_iface::add_to_linker::<_, wasmtime::component::HasSelf<_>>(&mut linker, |state| state)
        .map_err(|e| Error::Internal(format!("cannot link the blob-store import: {e}")))?;
    // A sleep or a blocking poll ends at the call's deadline, like guest code.
    waits::link(&mut linker)?;
    Ok(linker)
}

fn spawn_epoch_ticker(engine: wasmtime::EngineWeak, stop: Arc<AtomicBool>) {
    std::thread::Builder::new()
        .name("frostline-epoch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(EPOCH_TICK_MS));
                match engine.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => return,
                }
            }
        })
        .expect("spawning the epoch ticker thread");
}

const WASM_MAGIC: &[u8; 4] = b"\0asm";
/// Version and layer of a core module (version 1, layer 0).
const CORE_MODULE_VERSION: [u8; 4] = [0x01, 0x00, 0x00, 0x00];
/// Version and layer of a component (version 0x0d, layer 1).
const COMPONENT_VERSION: [u8; 4] = [0x0d, 0x00, 0x01, 0x00];

fn check_component_header(name: &str, bytes: &[u8]) -> Result<()> {
    let refuse = |reason: String| Err(Error::PluginLoad { source_name: name.to_string(), reason });
    if bytes.is_empty() {
        return refuse("the file is empty; expected a WebAssembly component".into());
    }
    if bytes.len() < 8 || &bytes[..4] != WASM_MAGIC {
        return refuse("the file is not WebAssembly (no \\0asm header); expected a WebAssembly component".into());
    }
    let version: [u8; 4] = bytes[4..8].try_into().expect("length checked");
    if version == CORE_MODULE_VERSION {
        return refuse(
            "it is a core WebAssembly module, not a component; build for wasm32-wasip2 or wrap it with `wasm-tools component new`".into(),
        );
    }
    if version != COMPONENT_VERSION {
        return refuse(format!(
            "unsupported WebAssembly binary version/layer {version:02x?}; expected a component ({COMPONENT_VERSION:02x?})"
        ));
    }
    Ok(())
}

/// Checks that the component exports the role's interface at a supported contract version,
/// and names what it found when it does not.
fn check_world(engine: &Engine, name: &str, component: &Component, role: Role) -> Result<()> {
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let wanted = format!("{CONTRACT_PACKAGE}/{}@{CONTRACT_VERSION}", role.interface());
    if exports.iter().any(|e| e == &wanted) {
        if !exports.iter().any(|e| e == "init") {
            return Err(Error::PluginLoad {
                source_name: name.to_string(),
                reason: "it exports no `init` function; every frostline world exports `init(config: string)`".into(),
            });
        }
        return Ok(());
    }
    let mut found_roles = Vec::new();
    for export in &exports {
        let Some(rest) = export.strip_prefix(&format!("{CONTRACT_PACKAGE}/")) else { continue };
        let (iface, version) = rest.split_once('@').unwrap_or((rest, "unversioned"));
        if let Some(found) = Role::from_interface(iface) {
            if found == role && !CONTRACT_VERSIONS_SUPPORTED.contains(&version) {
                return Err(Error::PluginLoad {
                    source_name: name.to_string(),
                    reason: format!(
                        "it was built for contract version {version} of {CONTRACT_PACKAGE}; this host supports {}; rebuild it against wit/ of this release",
                        CONTRACT_VERSIONS_SUPPORTED.join(", ")
                    ),
                });
            }
            found_roles.push(format!("{found} ({export})"));
        }
    }
    let reason = if found_roles.is_empty() {
        format!("it does not implement the {role} world: it exports [{}], not `{wanted}`", exports.join(", "))
    } else {
        format!("it implements {}, not the {role} world asked for", found_roles.join(", "))
    };
    Err(Error::PluginLoad { source_name: name.to_string(), reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1024 * 1024;

    #[test]
    fn the_wasmtime_version_named_is_the_one_cargo_lock_pins() {
        let lock = include_str!("../../../Cargo.lock");
        let pinned = lock
            .split("[[package]]")
            .find(|p| p.contains("\nname = \"wasmtime\"\n"))
            .and_then(|p| p.split("version = \"").nth(1))
            .and_then(|v| v.split('"').next());
        assert_eq!(pinned, Some(WASMTIME_VERSION));
    }

    /// The memory limit holds for an instance's memories together: two memories of 40 MiB
    /// each fit a 64 MiB limit alone, not together (each memory was checked on its own).
    #[test]
    fn the_memory_limit_counts_every_memory_of_the_instance() {
        let mut budget = Budget::new(64 * MIB);
        assert!(budget.grow(0, 40 * MIB), "the first memory fits");
        assert!(!budget.grow(0, 40 * MIB), "the second does not fit beside it");
        assert_eq!(budget.used, 40 * MIB, "a refused growth charges nothing");
        assert!(budget.grow(0, 24 * MIB), "up to the limit exactly");
        assert!(!budget.grow(40 * MIB, 40 * MIB + 1), "not one byte past it");
        assert!(budget.grow(24 * MIB, 24 * MIB), "a growth of nothing always fits");
    }

    /// A component from the text format, ready to instantiate in a store made as the host
    /// makes every plugin's (`LoadedPlugin::new_store`: the same limiter and caps), with
    /// `memory_bytes` as its memory limit.
    fn text_component(
        host: &PluginHost,
        wat: &str,
        memory_bytes: usize,
    ) -> (wasmtime::Store<PluginState>, InstancePre<PluginState>) {
        let bytes = wat::parse_str(wat).expect("valid component text");
        let component = Component::new(&host.inner.engine, &bytes).expect("the component compiles");
        let pre = host.inner.linker.instantiate_pre(&component).expect("it imports nothing");
        let plugin = LoadedPlugin {
            name: "text-component".into(),
            hash: hex::encode(Sha256::digest(&bytes)),
            role: Role::BucketStrategy,
            limits: PluginLimits { call_ms: 5_000, memory_bytes },
            pre: pre.clone(),
            host: host.inner.clone(),
        };
        (plugin.new_store(&Capabilities::none()).unwrap(), pre)
    }

    /// A core module with two memories of one page each, and `grow(pages)` that grows both.
    const TWO_MEMORIES: &str = r#"
        (component
          (core module $m
            (memory $a 1)
            (memory $b 1)
            (func (export "grow") (param $pages i32) (result i32)
              (drop (memory.grow $a (local.get $pages)))
              (memory.grow $b (local.get $pages))))
          (core instance $i (instantiate $m))
          (func (export "grow") (param "pages" u32) (result s32) (canon lift (core func $i "grow"))))
    "#;

    /// Two memories grown to 40 MiB each: together past a 64 MiB limit, the instance faults
    /// and the fault names the limit; under a 128 MiB limit the same growth runs.
    #[test]
    fn a_component_whose_memories_together_pass_the_limit_faults() {
        let host = PluginHost::new(None).unwrap();
        let pages_of_40_mib = (40 * MIB / 65_536) as u32;
        let grow = |memory_bytes: usize| {
            let (mut store, pre) = text_component(&host, TWO_MEMORIES, memory_bytes);
            let instance = pre.instantiate(&mut store).unwrap();
            let grow = instance.get_typed_func::<(u32,), (i32,)>(&mut store, "grow").unwrap();
            grow.call(&mut store, (pages_of_40_mib,)).map(|(previous,)| previous)
        };
        let fault = format!("{:#}", grow(64 * MIB).expect_err("two memories of 40 MiB pass 64 MiB together"));
        assert!(fault.contains("memory limit of 67108864 bytes exceeded"), "{fault}");
        assert_eq!(grow(128 * MIB).expect("they fit 128 MiB"), 1, "the second memory grew from one page");
    }

    /// A component with `count` core instances of a module with one memory each.
    fn memories_component(count: usize) -> String {
        let instances: String = (0..count).map(|i| format!("(core instance $i{i} (instantiate $m))\n")).collect();
        format!("(component (core module $m (memory 0)) {instances})")
    }

    /// `PLUGIN_MEMORIES_MAX` memories instantiate; one more is refused.
    #[test]
    fn the_number_of_memories_is_capped() {
        let host = PluginHost::new(None).unwrap();
        let instantiate = |count: usize| {
            let (mut store, pre) = text_component(&host, &memories_component(count), 64 * MIB);
            pre.instantiate(&mut store).map(drop)
        };
        instantiate(PLUGIN_MEMORIES_MAX).expect("up to the cap");
        let refused = format!("{:#}", instantiate(PLUGIN_MEMORIES_MAX + 1).expect_err("past the cap"));
        assert!(refused.contains("memory count"), "{refused}");
    }

    /// `wasi:http` is in the archivers' linker only: the example HTTP archiver links there and
    /// nowhere else.
    #[test]
    fn only_archivers_link_wasi_http() {
        let host = PluginHost::new(None).unwrap();
        let bytes = std::fs::read(std::path::Path::new(builtin::GUEST_DIR).join("http_archiver.wasm")).unwrap();
        let component = Component::new(&host.inner.engine, &bytes).unwrap();
        host.inner.archiver_linker.instantiate_pre(&component).expect("an archiver may import wasi:http");
        let Err(refused) = host.inner.linker.instantiate_pre(&component) else {
            panic!("a strategy's linker provided wasi:http");
        };
        let refused = format!("{refused:#}");
        assert!(refused.contains("wasi:http"), "{refused}");
    }

    /// A growth the limiter allowed but that failed (past the memory's own maximum, or the
    /// host out of memory) is given back.
    #[test]
    fn a_failed_growth_gives_its_charge_back() {
        let mut budget = Budget::new(64 * MIB);
        assert!(budget.grow(0, 10 * MIB));
        assert!(budget.grow(0, 50 * MIB));
        budget.grow_failed();
        assert_eq!(budget.used, 10 * MIB);
        assert!(budget.grow(0, 54 * MIB));
    }

    #[test]
    fn header_checks_name_the_problem() {
        let err = |bytes: &[u8]| check_component_header("x.wasm", bytes).unwrap_err().to_string();
        assert!(err(b"").contains("empty"));
        assert!(err(b"hello world").contains("not WebAssembly"));
        assert!(err(b"\0asm\x01\0\0\0").contains("core WebAssembly module"));
        assert!(check_component_header("x", b"\0asm\x0d\0\x01\0").is_ok());
    }

    #[test]
    fn limits_have_bounds() {
        assert!(PluginLimits::default().validate().is_ok());
        assert!(PluginLimits { call_ms: 0, ..Default::default() }.validate().is_err());
        assert!(PluginLimits { call_ms: PLUGIN_CALL_MS_MAX + 1, ..Default::default() }.validate().is_err());
        assert!(PluginLimits { memory_bytes: 1, ..Default::default() }.validate().is_err());
        assert!(PluginLimits { memory_bytes: PLUGIN_MEMORY_BYTES_MAX + 1, ..Default::default() }.validate().is_err());
    }
}

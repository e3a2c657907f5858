//! The policy directory: strict TOML files declaring tables, their plugins and archive
//! targets, validated as a whole into a `PolicySet` of ready-to-use plugins and backends.
//! (Hot reload and holds build on this; see policies/README.md for the format.)
//!
//! Imports the core, the plugin host and object storage.

pub mod check;
mod files;
pub mod grants;
mod holds;
mod plugins;
pub mod retired;
mod sinks;

pub use files::{EMPTY_MARKER, hash_files, policy_files};
pub use holds::released_holds;
pub use sinks::{SINK_TIMEOUT_MS_DEFAULT, SINK_TIMEOUT_MS_MAX, SinkConfig, SinkKind};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::format::Format;
use crate::model::{self, BucketStrategy, RetentionPolicy};
use crate::plugin::{PluginHost, PluginSource, Role, builtin};
use crate::settings::Settings;
use crate::storage::ArchiveBackend;
use crate::storage::probe::{GatedBackend, TargetProbe};
use crate::storage::target::TargetConfig;
use crate::store::schema::TableDeclaration;

/// The target every table uses unless it names another: a directory in the data directory.
pub const DEFAULT_TARGET: &str = "local";
/// Bound on `writable_buckets` (buckets are stepped through one by one to find the horizon).
pub const WRITABLE_BUCKETS_MAX: u32 = 10_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    table: Vec<RawTable>,
    #[serde(default)]
    target: Vec<RawTarget>,
    #[serde(default)]
    hold: Vec<holds::RawHold>,
    #[serde(default)]
    sink: Vec<sinks::RawSink>,
    #[serde(default)]
    grant: Vec<grants::RawGrant>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    id: String,
    strategy: Option<RawPlugin>,
    writable_buckets: Option<u32>,
    format: Option<Format>,
    retention: Option<RawPlugin>,
    target: Option<String>,
    /// Typed columns (`model::columns`).
    #[serde(default)]
    column: Vec<RawColumn>,
}

/// One `[[table.column]]`: `from` defaults to the pointer of the name (`/name`), `nullable` to
/// true and `on_mismatch` to `"refuse"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawColumn {
    name: String,
    #[serde(rename = "type")]
    kind: model::columns::ColumnType,
    from: Option<String>,
    nullable: Option<bool>,
    on_mismatch: Option<model::columns::OnMismatch>,
}

impl RawColumn {
    fn into_spec(self) -> model::columns::ColumnSpec {
        model::columns::ColumnSpec {
            from: self.from.unwrap_or_else(|| format!("/{}", self.name.replace('~', "~0").replace('/', "~1"))),
            name: self.name,
            kind: self.kind,
            nullable: self.nullable.unwrap_or(true),
            on_mismatch: self.on_mismatch.unwrap_or_default(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlugin {
    /// `builtin:NAME` or a path relative to the policy directory.
    plugin: String,
    sha256: Option<String>,
    config: Option<toml::Table>,
    time_limit_ms: Option<u64>,
    memory_limit_mib: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    name: String,
    /// A native store. Exactly one of `url` and `plugin` is set.
    url: Option<String>,
    /// A WASM archiver component (path relative to the policy directory); the fields below
    /// belong to it (see `grants::target_kind`).
    plugin: Option<String>,
    sha256: Option<String>,
    config: Option<toml::Table>,
    time_limit_ms: Option<u64>,
    memory_limit_mib: Option<u64>,
    /// `false` keeps the orphan sweep off this target (native or plugin): nothing on it is
    /// ever deleted as an orphan. For a target another tool also cleans, or one whose listings
    /// cost more than the objects they would free.
    sweep: Option<bool>,
    // Options of a `url` target, documented on `storage::target::TargetConfig`.
    endpoint: Option<String>,
    region: Option<String>,
    allow_http: Option<bool>,
    access_key_id_file: Option<PathBuf>,
    secret_access_key_file: Option<PathBuf>,
    session_token_file: Option<PathBuf>,
    service_account_file: Option<PathBuf>,
    account: Option<String>,
    access_key_file: Option<PathBuf>,
    use_emulator: Option<bool>,
    multipart_threshold_bytes: Option<u64>,
    max_retries: Option<usize>,
    retry_timeout_ms: Option<u64>,
    request_timeout_ms: Option<u64>,
}

/// One table, ready to use.
#[derive(Clone)]
pub struct TablePolicy {
    pub id: String,
    pub strategy: Arc<dyn BucketStrategy>,
    pub retention: Arc<dyn RetentionPolicy>,
    /// `lifecycle::policy_identity` of `retention` (component hash and effective config, the
    /// process-wide cutoff included): plans made under another identity are stale.
    pub retention_identity: String,
    pub writable_buckets: Option<u32>,
    pub format: Format,
    pub target_name: String,
    pub backend: Arc<dyn ArchiveBackend>,
    /// The file that declared it.
    pub file: PathBuf,
    /// What it was declared as, recorded in the store so that the table is still archived
    /// under it after it leaves the directory (`retired`).
    pub declaration: TableDeclaration,
    /// The file plugins of the declaration, kept in the data directory beside it.
    pub components: Vec<PluginSource>,
}

impl TablePolicy {
    /// Whether the table's archive is also a Delta Lake table: each publication and expiry is
    /// committed to its Delta log. Parquet tables on object-store targets, in builds with the
    /// `delta` feature (an archiver plugin is no object store delta-rs can write to).
    pub fn delta_log(&self) -> bool {
        cfg!(feature = "delta") && self.format == Format::Parquet && self.backend.object_store().is_some()
    }

    /// The table's typed columns (`[[table.column]]`).
    pub fn columns(&self) -> &[model::columns::ColumnSpec] {
        &self.declaration.columns
    }

    /// Where the table's new archives go.
    pub fn layout(&self) -> crate::storage::keys::Layout {
        if self.delta_log() { crate::storage::keys::Layout::Delta } else { crate::storage::keys::Layout::Hive }
    }
}

/// A whole, validated policy directory.
#[derive(Clone)]
pub struct PolicySet {
    pub tables: BTreeMap<String, Arc<TablePolicy>>,
    pub targets: BTreeMap<String, Arc<dyn ArchiveBackend>>,
    pub dir: PathBuf,
    /// Counts accepted sets since start: 1 for the set loaded at start.
    pub generation: u64,
    /// SHA-256 of every policy file, by file name.
    pub files: BTreeMap<String, String>,
    /// Every plugin the set loaded.
    pub plugins: Vec<PluginRecord>,
    /// Tables removed from the directory: kept (data, archival under their last definition)
    /// but refusing appends.
    pub retired: std::collections::BTreeSet<String>,
    /// Legal holds declared in the directory (synced into the store as `policy:` holds).
    pub holds: Vec<crate::store::schema::Hold>,
    pub sinks: Vec<SinkConfig>,
    /// The probe result of each native target, by name (shown in status).
    pub target_probes: BTreeMap<String, Arc<TargetProbe>>,
    /// Targets declared with `sweep = false`, by URL (`ArchiveBackend::target`): the orphan
    /// sweep leaves them alone.
    pub unswept_targets: std::collections::BTreeSet<String>,
}

/// Wraps a native target's backend before it is probed and used.
pub type TargetWrapper = Arc<dyn Fn(&str, Arc<dyn ArchiveBackend>) -> Arc<dyn ArchiveBackend> + Send + Sync>;

/// How a policy directory is loaded. The default is production; tests wrap targets (a lying or
/// faulty store) and still go through every check, the probe included.
#[derive(Clone, Default)]
pub struct LoadOptions {
    pub wrap_target: Option<TargetWrapper>,
}

impl std::fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions").field("wrap_target", &self.wrap_target.is_some()).finish()
    }
}

/// One plugin of a policy set, for status and audits.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PluginRecord {
    pub table: String,
    pub role: Role,
    pub plugin: String,
    pub sha256: String,
    pub time_limit_ms: u64,
    pub memory_limit_bytes: usize,
}

/// Random times asked of each strategy by the quick conformance checks at load.
pub const LOAD_CHECK_STRATEGY_TIMES: usize = 200;

impl PolicySet {
    /// The backend of the target an archive was written to (from its manifest): the table's
    /// own backend when it is still that target, else the target of that name (or, for
    /// manifests that predate target names, of that URL). An archive whose target is gone
    /// from the policy directory cannot be read, verified or expired: the error says so.
    pub fn archive_backend(
        &self,
        table: &TablePolicy,
        target: &model::ArchiveTarget,
    ) -> Result<Arc<dyn ArchiveBackend>> {
        let same = |name: &str, backend: &Arc<dyn ArchiveBackend>| {
            (target.name.is_empty() || target.name == name) && backend.target() == target.url
        };
        // Records without a target (tombstones of earlier versions) were on the table's.
        if target.url.is_empty() || same(&table.target_name, &table.backend) {
            return Ok(table.backend.clone());
        }
        self.targets.iter().find(|(name, backend)| same(name, backend)).map(|(_, b)| b.clone()).ok_or_else(|| {
            Error::StorageUnavailable(format!(
                "table `{}`: the archive lives on target {target}, which is not in the policy directory {}; \
                 declare that target again to read, verify or expire it",
                table.id,
                self.dir.display()
            ))
        })
    }

    pub fn table(&self, id: &str) -> Result<&Arc<TablePolicy>> {
        self.tables.get(id).ok_or_else(|| {
            Error::InvalidInput(format!(
                "no table `{id}` in the policy directory {}; declared tables: {}",
                self.dir.display(),
                self.tables.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })
    }
}

fn invalid(file: &Path, what: impl std::fmt::Display) -> Error {
    Error::InvalidInput(format!("{}: {what}", file.display()))
}

/// Loads every `*.toml` file of `dir`. The default target `local` is `data_dir/archive`
/// unless a file declares a target of that name.
pub fn load(dir: &Path, data_dir: &Path, host: &PluginHost, settings: &Settings) -> Result<PolicySet> {
    load_with(dir, data_dir, host, settings, &LoadOptions::default())
}

/// `load`, with options. Every native target is validated, built and probed
/// (`storage::probe`): one that breaks the protocol is refused, naming it and the check.
pub fn load_with(
    dir: &Path,
    data_dir: &Path,
    host: &PluginHost,
    settings: &Settings,
    options: &LoadOptions,
) -> Result<PolicySet> {
    let files = policy_files(dir)?;
    files::check_emptiness(dir, &files)?;
    let mut file_hashes = BTreeMap::new();
    let mut raw_tables: Vec<(PathBuf, RawTable)> = Vec::new();
    let mut holds = Vec::new();
    let mut sinks: Vec<SinkConfig> = Vec::new();
    let mut raw_targets: BTreeMap<String, (PathBuf, RawTarget)> = BTreeMap::new();
    let mut raw_grants = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).map_err(|e| invalid(file, format!("cannot read: {e}")))?;
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        file_hashes.insert(name, crate::format::manifest::sha256_hex(text.as_bytes()));
        let parsed: RawFile = toml::from_str(&text).map_err(|e| invalid(file, e))?;
        for target in parsed.target {
            if let Some((other, _)) = raw_targets.get(&target.name) {
                return Err(invalid(file, format!("target `{}` is also declared in {}", target.name, other.display())));
            }
            raw_targets.insert(target.name.clone(), (file.clone(), target));
        }
        raw_grants.extend(parsed.grant.into_iter().map(|g| (file.clone(), g)));
        for table in parsed.table {
            raw_tables.push((file.clone(), table));
        }
        for hold in parsed.hold {
            holds.push(holds::validate_hold(file, hold)?);
        }
        for sink in parsed.sink {
            let sink = sinks::validate_sink(dir, file, sink)?;
            if sinks.iter().any(|s| s.name == sink.name) {
                return Err(invalid(file, format!("sink `{}` is declared twice", sink.name)));
            }
            sinks.push(sink);
        }
    }
    raw_targets.entry(DEFAULT_TARGET.to_string()).or_insert_with(|| {
        let url = format!("file://{}", data_dir.join("archive").display());
        (dir.to_path_buf(), RawTarget::native(DEFAULT_TARGET, url))
    });

    let mut plugin_targets = Vec::new();
    let mut native_targets = Vec::new();
    let unswept_names: Vec<String> =
        raw_targets.iter().filter(|(_, (_, raw))| raw.sweep == Some(false)).map(|(name, _)| name.clone()).collect();
    for (name, (file, mut raw)) in raw_targets {
        let native = raw.take_native();
        match grants::target_kind(&file, raw)? {
            grants::TargetKind::Native(url) => native_targets.push((file, TargetConfig { url, ..native })),
            grants::TargetKind::Plugin(plugin) => {
                if let Some(option) = native.options_set().first() {
                    return Err(invalid(
                        &file,
                        format!("target `{name}`: option `{option}` belongs to a `url` target, not a plugin target"),
                    ));
                }
                plugin_targets.push((name, file, plugin))
            }
        }
    }
    let (mut targets, target_probes) = open_native_targets(dir, native_targets, options)?;
    // Grants lend native targets only; plugin targets are loaded with them afterwards.
    let native: Vec<String> = targets.keys().cloned().collect();
    let grants = grants::validate(dir, raw_grants, &native)?;
    let mut plugins = Vec::new();
    for (name, file, plugin) in plugin_targets {
        let (backend, record) = grants::load_plugin_target(host, dir, &file, &name, &plugin, &grants, &targets)?;
        plugins.push(record);
        targets.insert(name, backend);
    }

    let mut tables = BTreeMap::new();
    for (file, raw) in raw_tables {
        model::validate_table_id(&raw.id).map_err(|e| invalid(&file, e))?;
        if let Some(existing) = tables.get(&raw.id) {
            let existing: &Arc<TablePolicy> = existing;
            return Err(invalid(&file, format!("table `{}` is also declared in {}", raw.id, existing.file.display())));
        }
        if let Some(n) = raw.writable_buckets
            && (n == 0 || n > WRITABLE_BUCKETS_MAX)
        {
            return Err(invalid(
                &file,
                format!("table `{}`: writable_buckets = {n} is outside 1..={WRITABLE_BUCKETS_MAX}", raw.id),
            ));
        }
        let columns: Vec<model::columns::ColumnSpec> = raw.column.into_iter().map(RawColumn::into_spec).collect();
        model::columns::validate(&columns).map_err(|e| invalid(&file, format!("table `{}`: {e}", raw.id)))?;
        let target_name = raw.target.clone().unwrap_or_else(|| DEFAULT_TARGET.to_string());
        let backend = targets.get(&target_name).cloned().ok_or_else(|| {
            invalid(&file, format!("table `{}`: no target named `{target_name}`; declare it with [[target]]", raw.id))
        })?;
        let strategy_ref = raw.strategy.unwrap_or_else(|| RawPlugin::builtin(builtin::DEFAULT_STRATEGY));
        let retention_ref = raw.retention.unwrap_or_else(|| RawPlugin::builtin(builtin::DEFAULT_RETENTION));
        let context = |role: &str| format!("table `{}` {role}", raw.id);
        let strategy =
            plugins::load_plugin(host, dir, &file, &strategy_ref, Role::BucketStrategy, &context("strategy"), None)?;
        let retention = plugins::load_plugin(
            host,
            dir,
            &file,
            &retention_ref,
            Role::RetentionPolicy,
            &context("retention"),
            settings.eligible_before,
        )?;
        plugins.push(PluginRecord::of(&raw.id, &strategy.loaded));
        plugins.push(PluginRecord::of(&raw.id, &retention.loaded));
        let declaration = TableDeclaration {
            strategy: strategy.declaration.clone(),
            retention: retention.declaration.clone(),
            format: raw.format.unwrap_or_default(),
            writable_buckets: raw.writable_buckets,
            target_name,
            file: file.display().to_string(),
            columns,
        };
        let components = [&strategy, &retention].into_iter().filter_map(|p| p.component.clone()).collect();
        let table = build_table(&raw.id, &file, declaration, strategy, retention, backend, true)?;
        tables.insert(raw.id, Arc::new(TablePolicy { components, ..table }));
    }
    let unswept_targets =
        unswept_names.iter().filter_map(|name| targets.get(name)).map(|b| b.target().to_string()).collect();
    Ok(PolicySet {
        tables,
        targets,
        dir: dir.to_path_buf(),
        generation: 1,
        files: file_hashes,
        plugins,
        retired: Default::default(),
        holds,
        sinks,
        target_probes,
        unswept_targets,
    })
}

/// Instantiates a table's plugins into its policy. `check` runs the quick conformance checks
/// (at load; a table rebuilt from its recorded declaration passed them when it was declared).
fn build_table(
    id: &str,
    file: &Path,
    declaration: TableDeclaration,
    strategy: plugins::PolicyPlugin,
    retention: plugins::PolicyPlugin,
    backend: Arc<dyn ArchiveBackend>,
    check: bool,
) -> Result<TablePolicy> {
    let context = |role: &str| format!("table `{id}` {role}");
    let strategy = crate::plugin::strategy::WasmStrategy::new(strategy.loaded, strategy.config)
        .map_err(|e| invalid(file, format!("{}: {e}", context("strategy"))))?;
    if check {
        let report =
            crate::plugin::conformance::check_strategy_cases(&strategy, id.len() as u64, LOAD_CHECK_STRATEGY_TIMES)
                .map_err(|e| invalid(file, format!("{}: {e}", context("strategy"))))?;
        if !report.passed() {
            return Err(invalid(file, format!("{}: fails its conformance checks:\n{report}", context("strategy"))));
        }
    }
    let retention_identity = model::lifecycle::policy_identity(&retention.loaded.hash, &retention.config);
    let retention = crate::plugin::retention::WasmRetention::new(retention.loaded, retention.config)
        .map_err(|e| invalid(file, format!("{}: {e}", context("retention"))))?;
    if check {
        let report = crate::plugin::conformance::check_retention(&retention, id.len() as u64)
            .map_err(|e| invalid(file, format!("{}: {e}", context("retention"))))?;
        if !report.passed() {
            return Err(invalid(file, format!("{}: fails its conformance checks:\n{report}", context("retention"))));
        }
    }
    Ok(TablePolicy {
        id: id.to_string(),
        strategy: Arc::new(strategy),
        retention: Arc::new(retention),
        retention_identity,
        writable_buckets: declaration.writable_buckets,
        format: declaration.format,
        target_name: declaration.target_name.clone(),
        backend,
        file: file.to_path_buf(),
        declaration,
        components: Vec::new(),
    })
}

type NativeTargets = (BTreeMap<String, Arc<dyn ArchiveBackend>>, BTreeMap<String, Arc<TargetProbe>>);

/// Validates, builds and probes the native targets (concurrently). A target whose probe finds
/// broken semantics is refused; one that cannot be reached is accepted behind a gate that
/// holds its uploads until a later probe passes (an outage at start must not stop appends).
fn open_native_targets(
    dir: &Path,
    configs: Vec<(PathBuf, TargetConfig)>,
    options: &LoadOptions,
) -> Result<NativeTargets> {
    let mut opened = Vec::with_capacity(configs.len());
    for (file, config) in configs {
        let spec = config.validate(dir).map_err(|e| invalid(&file, format!("target `{}`: {e}", config.name)))?;
        let backend: Arc<dyn ArchiveBackend> = Arc::new(spec.build().map_err(|e| invalid(&file, e))?);
        let backend = match &options.wrap_target {
            Some(wrap) => wrap(&spec.name, backend),
            None => backend,
        };
        opened.push((file, spec, backend));
    }
    let backends: Vec<Arc<dyn ArchiveBackend>> = opened.iter().map(|(_, _, b)| b.clone()).collect();
    let outcomes = crate::storage::probe::probe_all_blocking(&backends)?;
    let (mut targets, mut probes) = (BTreeMap::new(), BTreeMap::new());
    for ((file, spec, backend), outcome) in opened.into_iter().zip(outcomes) {
        match &outcome.result {
            Err(failure) if !failure.unreachable => {
                return Err(invalid(
                    &file,
                    format!(
                        "target `{}` ({}) is refused: it would break the archival protocol: {failure}",
                        spec.name, spec.url
                    ),
                ));
            }
            Err(failure) => tracing::warn!(
                target_name = %spec.name, url = %spec.url, %failure,
                "target unreachable at load: accepted, but uploads to it wait until a probe passes"
            ),
            Ok(findings) if findings.keeps_deleted_versions => tracing::warn!(
                target_name = %spec.name, url = %spec.url,
                "target keeps deleted objects as noncurrent versions (bucket versioning): archives that expiry \
                 and erasure delete stay readable by version until a lifecycle rule on the bucket removes them \
                 (policies/README.md, \"Versioned buckets\")"
            ),
            Ok(_) => {
                tracing::debug!(target_name = %spec.name, elapsed_ms = outcome.elapsed_ms, "target passed its probe")
            }
        }
        let probe = TargetProbe::new(&spec.name, &spec.url, spec.endpoint_shown(), outcome);
        targets.insert(spec.name.clone(), GatedBackend::new(backend, probe.clone()) as Arc<dyn ArchiveBackend>);
        probes.insert(spec.name, probe);
    }
    Ok((targets, probes))
}

impl PluginRecord {
    fn of(table: &str, loaded: &crate::plugin::LoadedPlugin) -> Self {
        PluginRecord {
            table: table.to_string(),
            role: loaded.role,
            plugin: loaded.name.clone(),
            sha256: loaded.hash.clone(),
            time_limit_ms: loaded.limits.call_ms,
            memory_limit_bytes: loaded.limits.memory_bytes,
        }
    }
}

impl RawTarget {
    fn native(name: &str, url: String) -> Self {
        RawTarget { name: name.to_string(), url: Some(url), ..Default::default() }
    }

    /// Moves the options of a `url` target out (the plugin fields stay for `target_kind`).
    fn take_native(&mut self) -> TargetConfig {
        TargetConfig {
            endpoint: self.endpoint.take(),
            region: self.region.take(),
            allow_http: self.allow_http.take(),
            access_key_id_file: self.access_key_id_file.take(),
            secret_access_key_file: self.secret_access_key_file.take(),
            session_token_file: self.session_token_file.take(),
            service_account_file: self.service_account_file.take(),
            account: self.account.take(),
            access_key_file: self.access_key_file.take(),
            use_emulator: self.use_emulator.take(),
            multipart_threshold_bytes: self.multipart_threshold_bytes.take(),
            max_retries: self.max_retries.take(),
            retry_timeout_ms: self.retry_timeout_ms.take(),
            request_timeout_ms: self.request_timeout_ms.take(),
            ..TargetConfig::from_url(&self.name, self.url.as_deref().unwrap_or_default())
        }
    }
}

impl RawPlugin {
    fn builtin(name: &str) -> Self {
        RawPlugin { plugin: name.to_string(), sha256: None, config: None, time_limit_ms: None, memory_limit_mib: None }
    }
}

/// The result of the last reload attempt, shown in status.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReloadOutcome {
    pub at: model::Micros,
    pub accepted: bool,
    /// The active generation after the attempt.
    pub generation: u64,
    /// Why the reload was refused (file, field and reason), when it was.
    pub error: Option<String>,
    pub trigger: String,
    /// The policy holds an accepted reload released (their `[[hold]]` gone from the directory).
    pub released_holds: Vec<crate::store::schema::Hold>,
}

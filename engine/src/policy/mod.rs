//! The policy directory: strict TOML files declaring tables, their plugins and archive
//! targets, validated as a whole into a `PolicySet` of ready-to-use plugins and backends.
//! (Hot reload and holds build on this; see policies/README.md for the format.)
//!
//! Imports the core, the plugin host and object storage.

pub mod check;
pub mod grants;
pub mod retired;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::format::Format;
use crate::model::{self, BucketStrategy, RetentionPolicy};
use crate::plugin::{PluginHost, PluginLimits, PluginSource, Role, builtin};
use crate::settings::Settings;
use crate::storage::ArchiveBackend;
use crate::storage::probe::{GatedBackend, TargetProbe};
use crate::storage::target::TargetConfig;
use crate::store::schema::{PluginDeclaration, TableDeclaration};

/// The target every table uses unless it names another: a directory in the data directory.
pub const DEFAULT_TARGET: &str = "local";
/// The file whose presence says that a policy directory without policy files is meant to be
/// empty (no tables, no holds): without it such a directory is refused, at start and at reload,
/// and with it any policy file beside it is refused.
pub const EMPTY_MARKER: &str = ".frostline-empty";
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
    hold: Vec<RawHold>,
    #[serde(default)]
    sink: Vec<RawSink>,
    #[serde(default)]
    grant: Vec<grants::RawGrant>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHold {
    table: String,
    partition: Option<String>,
    tenant: Option<String>,
    bucket: Option<String>,
    reason: String,
    placed_by: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSink {
    name: String,
    kind: SinkKind,
    url: Option<String>,
    path: Option<PathBuf>,
    timeout_ms: Option<u64>,
    ca_file: Option<PathBuf>,
}

/// Where outbox events are delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// POST each event as JSON, with an `Idempotency-Key` header.
    Webhook,
    /// Append each event as one JSON line to a file (fsynced).
    Jsonl,
}

/// A validated outbox sink.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SinkConfig {
    pub name: String,
    pub kind: SinkKind,
    /// The webhook URL or the file path.
    pub destination: String,
    pub timeout_ms: u64,
    /// The PEM file of extra certificate authorities an `https://` webhook trusts besides the
    /// system's (`ca_file`, read when the policy loads).
    pub ca_file: Option<String>,
    /// The DER certificates of `ca_file`.
    #[serde(skip)]
    pub ca_certificates: Vec<Vec<u8>>,
}

pub const SINK_TIMEOUT_MS_DEFAULT: u64 = 5_000;
pub const SINK_TIMEOUT_MS_MAX: u64 = 60_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    id: String,
    strategy: Option<RawPlugin>,
    writable_buckets: Option<u32>,
    format: Option<Format>,
    retention: Option<RawPlugin>,
    target: Option<String>,
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
    check_emptiness(dir, &files)?;
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
            holds.push(validate_hold(file, hold)?);
        }
        for sink in parsed.sink {
            let sink = validate_sink(dir, file, sink)?;
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
        let target_name = raw.target.clone().unwrap_or_else(|| DEFAULT_TARGET.to_string());
        let backend = targets.get(&target_name).cloned().ok_or_else(|| {
            invalid(&file, format!("table `{}`: no target named `{target_name}`; declare it with [[target]]", raw.id))
        })?;
        let strategy_ref = raw.strategy.unwrap_or_else(|| RawPlugin::builtin(builtin::DEFAULT_STRATEGY));
        let retention_ref = raw.retention.unwrap_or_else(|| RawPlugin::builtin(builtin::DEFAULT_RETENTION));
        let context = |role: &str| format!("table `{}` {role}", raw.id);
        let strategy = load_plugin(host, dir, &file, &strategy_ref, Role::BucketStrategy, &context("strategy"), None)?;
        let retention = load_plugin(
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
        };
        let components = [&strategy, &retention].into_iter().filter_map(|p| p.component.clone()).collect();
        let table = build_table(&raw.id, &file, declaration, strategy, retention, backend, true)?;
        tables.insert(raw.id, Arc::new(TablePolicy { components, ..table }));
    }
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
    })
}

/// Instantiates a table's plugins into its policy. `check` runs the quick conformance checks
/// (at load; a table rebuilt from its recorded declaration passed them when it was declared).
fn build_table(
    id: &str,
    file: &Path,
    declaration: TableDeclaration,
    strategy: PolicyPlugin,
    retention: PolicyPlugin,
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
            Ok(()) => {
                tracing::debug!(target_name = %spec.name, elapsed_ms = outcome.elapsed_ms, "target passed its probe")
            }
        }
        let probe = TargetProbe::new(&spec.name, &spec.url, spec.endpoint_shown(), outcome);
        targets.insert(spec.name.clone(), GatedBackend::new(backend, probe.clone()) as Arc<dyn ArchiveBackend>);
        probes.insert(spec.name, probe);
    }
    Ok((targets, probes))
}

fn validate_hold(file: &Path, raw: RawHold) -> Result<crate::store::schema::Hold> {
    model::validate_table_id(&raw.table).map_err(|e| invalid(file, format!("hold: {e}")))?;
    let placed_by = raw.placed_by.unwrap_or_else(|| "policy".into());
    crate::store::schema::Hold::check_declared(&raw.reason, &placed_by)
        .map_err(|why| invalid(file, format!("hold on table `{}`: {why}", raw.table)))?;
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // A stable id, so a reload that keeps the hold keeps its id.
    let fingerprint = crate::format::manifest::sha256_hex(
        format!("{}\0{:?}\0{:?}\0{:?}\0{}", raw.table, raw.partition, raw.tenant, raw.bucket, raw.reason).as_bytes(),
    );
    Ok(crate::store::schema::Hold {
        id: format!("policy-{}", &fingerprint[..12]),
        table: raw.table,
        partition_key: raw.partition,
        tenant: raw.tenant,
        bucket_key: raw.bucket,
        reason: raw.reason,
        placed_by,
        placed_at: 0,
        source: format!("policy:{name}"),
    })
}

fn validate_sink(dir: &Path, file: &Path, raw: RawSink) -> Result<SinkConfig> {
    if !model::is_visible_ascii(&raw.name, 64) {
        return Err(invalid(file, format!("sink name `{}` must be 1 to 64 bytes of visible ASCII", raw.name)));
    }
    let timeout_ms = raw.timeout_ms.unwrap_or(SINK_TIMEOUT_MS_DEFAULT);
    if timeout_ms == 0 || timeout_ms > SINK_TIMEOUT_MS_MAX {
        return Err(invalid(file, format!("sink `{}`: timeout_ms must be 1..={SINK_TIMEOUT_MS_MAX}", raw.name)));
    }
    let destination = match (raw.kind, raw.url, raw.path) {
        (SinkKind::Webhook, Some(url), None) => {
            if !url.starts_with("http://") && !url.starts_with("https://") {
                return Err(invalid(file, format!("sink `{}`: url must start with http:// or https://", raw.name)));
            }
            url
        }
        (SinkKind::Jsonl, None, Some(path)) => {
            let path = if path.is_absolute() { path } else { dir.join(path) };
            path.display().to_string()
        }
        (SinkKind::Webhook, _, _) => {
            return Err(invalid(file, format!("sink `{}`: a webhook sink takes `url` (and no `path`)", raw.name)));
        }
        (SinkKind::Jsonl, _, _) => {
            return Err(invalid(file, format!("sink `{}`: a jsonl sink takes `path` (and no `url`)", raw.name)));
        }
    };
    let (ca_file, ca_certificates) = match raw.ca_file {
        None => (None, Vec::new()),
        Some(_) if raw.kind != SinkKind::Webhook || !destination.starts_with("https://") => {
            return Err(invalid(file, format!("sink `{}`: ca_file is for https:// webhooks only", raw.name)));
        }
        Some(path) => {
            let path = if path.is_absolute() { path } else { dir.join(path) };
            let certificates = crate::storage::trust::read_pem_certificates(&path)
                .map_err(|why| invalid(file, format!("sink `{}`: ca_file {}: {why}", raw.name, path.display())))?;
            (Some(path.display().to_string()), certificates)
        }
    };
    Ok(SinkConfig { name: raw.name, kind: raw.kind, destination, timeout_ms, ca_file, ca_certificates })
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

/// The policy files of `dir` (`*.toml`, not in subfolders), sorted. Every one must be
/// readable: a policy file that cannot be looked at (a dangling symbolic link, a file that
/// fails to stat) is an error naming it and the OS error, never skipped, since skipping it
/// would retire its tables and release its holds. Not policy files: folders, whatever their
/// name, and Emacs lock files (`.#name.toml`, dangling links by design).
pub fn policy_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let unreadable =
        |e: std::io::Error| Error::InvalidInput(format!("cannot read the policy directory {}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        let lock_file = path.file_name().is_some_and(|n| n.as_encoded_bytes().starts_with(b".#"));
        if path.extension().is_none_or(|e| e != "toml") || lock_file {
            continue;
        }
        // Follows a symbolic link, as reading the file will.
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => {}
            Ok(meta) if meta.is_file() => files.push(path),
            Ok(_) => {
                return Err(invalid(
                    &path,
                    "is not a regular file (a FIFO, socket or device): a policy file must be one; move it out of the policy directory",
                ));
            }
            Err(e) => {
                let link = std::fs::read_link(&path)
                    .map(|to| format!(" (a symbolic link to {})", to.display()))
                    .unwrap_or_default();
                return Err(invalid(
                    &path,
                    format!(
                        "cannot read this policy file{link}: {e}; restore or remove it (a policy file that cannot be \
                         read is never skipped: its tables would retire and its holds be released)"
                    ),
                ));
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Refuses a policy directory without policy files unless it holds `EMPTY_MARKER` (an
/// unmounted volume or a deploy that removed everything would otherwise retire every table and
/// release every policy hold), and one that holds both the marker and policy files.
fn check_emptiness(dir: &Path, files: &[PathBuf]) -> Result<()> {
    let marker = dir.join(EMPTY_MARKER);
    let marked = match std::fs::symlink_metadata(&marker) {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(invalid(&marker, format!("cannot read: {e}"))),
    };
    match (files.is_empty(), marked) {
        (true, false) => Err(Error::InvalidInput(format!(
            "the policy directory {} holds no policy files (*.toml): is it mounted, and was the deploy complete? \
             Loading it would retire every table and release every hold declared in it. If it is meant to be \
             empty, create the file {}",
            dir.display(),
            marker.display()
        ))),
        (false, true) => Err(Error::InvalidInput(format!(
            "the policy directory {} holds policy files ({}) and the marker {}, which says it is meant to be \
             empty: remove the marker (or the policy files)",
            dir.display(),
            files
                .iter()
                .map(|f| f.file_name().unwrap_or_default().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(", "),
            marker.display()
        ))),
        _ => Ok(()),
    }
}

/// The policy holds among `stored` (the store's holds) that installing `set` releases:
/// declared by the directory before, gone from it now. `Store::sync_policy_holds` releases
/// exactly these; a reload reports them and logs them at warn.
pub fn released_holds(stored: Vec<crate::store::schema::Hold>, set: &PolicySet) -> Vec<crate::store::schema::Hold> {
    stored
        .into_iter()
        .filter(|h| h.source.starts_with("policy:") && !set.holds.iter().any(|kept| kept.id == h.id))
        .collect()
}

/// SHA-256 of each policy file's content, by file name.
pub fn hash_files(dir: &Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for file in policy_files(dir)? {
        let bytes = std::fs::read(&file).map_err(|e| invalid(&file, format!("cannot read: {e}")))?;
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        out.insert(name, crate::format::manifest::sha256_hex(&bytes));
    }
    Ok(out)
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

/// A plugin loaded for a policy: the component, the config it is initialised with, how to
/// load it again (`declaration`) and, for a file plugin, its bytes.
struct PolicyPlugin {
    loaded: Arc<crate::plugin::LoadedPlugin>,
    config: String,
    declaration: PluginDeclaration,
    component: Option<PluginSource>,
}

fn load_plugin(
    host: &PluginHost,
    dir: &Path,
    file: &Path,
    raw: &RawPlugin,
    role: Role,
    context: &str,
    eligible_before: Option<model::Micros>,
) -> Result<PolicyPlugin> {
    let mut config = raw.config.clone().unwrap_or_default();
    // The process-wide cutoff applies to the built-in policy unless its config sets its own rule.
    if raw.plugin == builtin::DEFAULT_RETENTION
        && !config.contains_key("cutoff")
        && !config.contains_key("archive_after")
        && let Some(cutoff) = eligible_before
    {
        config.insert("cutoff".into(), toml::Value::String(model::time::format_rfc3339(cutoff)));
    }
    let config_json = if config.is_empty() {
        String::new()
    } else {
        serde_json::to_string(&config).map_err(|e| invalid(file, format!("{context}: config: {e}")))?
    };
    let (source, config) = if raw.plugin.starts_with(builtin::BUILTIN_PREFIX) {
        let b = builtin::find(&raw.plugin).ok_or_else(|| {
            let names: Vec<String> = builtin::BUILTINS.iter().map(|b| format!("builtin:{}", b.name)).collect();
            invalid(file, format!("{context}: unknown plugin `{}`; built-ins are {}", raw.plugin, names.join(", ")))
        })?;
        let config = b.effective_config(&config_json).map_err(|e| invalid(file, format!("{context}: {e}")))?;
        (b.source(), config)
    } else {
        let path = dir.join(&raw.plugin);
        (PluginSource::from_file(&path).map_err(|e| invalid(file, format!("{context}: {e}")))?, config_json)
    };
    if let Some(pin) = &raw.sha256 {
        let actual = crate::format::manifest::sha256_hex(&source.bytes);
        if !actual.eq_ignore_ascii_case(pin) {
            return Err(invalid(
                file,
                format!("{context}: `{}` has SHA-256 {actual}, not the pinned {pin}", raw.plugin),
            ));
        }
    }
    let mut limits = PluginLimits::default();
    if let Some(ms) = raw.time_limit_ms {
        limits.call_ms = ms;
    }
    if let Some(mib) = raw.memory_limit_mib {
        limits.memory_bytes = (mib as usize).saturating_mul(1024 * 1024);
    }
    let loaded = host.load(&source, role, limits).map_err(|e| invalid(file, format!("{context}: {e}")))?;
    let declaration = PluginDeclaration {
        plugin: raw.plugin.clone(),
        sha256: loaded.hash.clone(),
        config: config.clone(),
        call_ms: limits.call_ms,
        memory_bytes: limits.memory_bytes,
    };
    let component = (!raw.plugin.starts_with(builtin::BUILTIN_PREFIX)).then_some(source);
    Ok(PolicyPlugin { loaded, config, declaration, component })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for file in files {
            std::fs::write(dir.path().join(file), "").unwrap();
        }
        dir
    }

    #[test]
    fn a_dangling_policy_file_is_an_error_naming_it_and_why() {
        let dir = dir_with(&["tables.toml"]);
        std::os::unix::fs::symlink(dir.path().join("gone.toml"), dir.path().join("holds.toml")).unwrap();
        let error = policy_files(dir.path()).unwrap_err().to_string();
        assert!(error.contains("holds.toml") && error.contains("symbolic link to"), "{error}");
        assert!(error.contains("No such file or directory"), "{error}");
    }

    #[test]
    fn folders_other_files_and_emacs_lock_files_are_not_policy_files() {
        let dir = dir_with(&["b.toml", "a.toml", "notes.txt", "tables.toml~"]);
        std::fs::create_dir(dir.path().join("plugins.toml")).unwrap();
        // Emacs locks a file it edits with a dangling link.
        std::os::unix::fs::symlink("root@host.42:1700000000", dir.path().join(".#a.toml")).unwrap();
        let files = policy_files(dir.path()).unwrap();
        assert_eq!(files, [dir.path().join("a.toml"), dir.path().join("b.toml")]);
    }

    #[test]
    fn an_empty_directory_needs_the_marker_and_the_marker_needs_an_empty_directory() {
        let dir = dir_with(&[]);
        std::fs::create_dir(dir.path().join("sample")).unwrap();
        let error = check_emptiness(dir.path(), &policy_files(dir.path()).unwrap()).unwrap_err().to_string();
        assert!(error.contains("no policy files") && error.contains(EMPTY_MARKER), "{error}");
        std::fs::write(dir.path().join(EMPTY_MARKER), "").unwrap();
        check_emptiness(dir.path(), &policy_files(dir.path()).unwrap()).unwrap();
        std::fs::write(dir.path().join("tables.toml"), "").unwrap();
        let error = check_emptiness(dir.path(), &policy_files(dir.path()).unwrap()).unwrap_err().to_string();
        assert!(error.contains("tables.toml") && error.contains(EMPTY_MARKER), "{error}");
    }
}

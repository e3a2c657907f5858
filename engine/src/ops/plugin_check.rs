//! `plugin check`: load a component for a role and run that role's conformance checks, as
//! the engine would load it (limits, capabilities for an archiver), and for a strategy, the
//! bucket it answers for each of a list of times, checked as the engine checks it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::Micros;
use crate::plugin::grants::{BlobStoreGrant, Preopen, PreopenMode};
use crate::plugin::http::HttpGrant;
use crate::plugin::{self, Capabilities, PluginHost, PluginLimits, PluginSource, Role, builtin, conformance};

pub use crate::plugin::conformance::ConformanceReport;

/// What to check: a component file or `builtin:NAME`, for a role, with its configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PluginCheckRequest {
    pub plugin: String,
    /// bucket-strategy, retention-policy or archiver.
    pub role: String,
    /// Passed to the plugin's `init` (for a built-in, merged into its defaults).
    pub config: String,
    /// Seed for the random cases.
    pub seed: u64,
    /// The compiled-component cache, and the operator's key that proves precompiled artifacts.
    pub cache_dir: Option<PathBuf>,
    pub cache_key_file: Option<PathBuf>,
    /// Bucket strategies only: a file of times to map to buckets after the checks, one per
    /// line (RFC 3339 or integer microseconds; blank lines and `#` comments skipped).
    pub times_file: Option<PathBuf>,
    /// Archivers only: `HOST:GUEST:MODE` preopens, a native store URL lent to `blob-store`, and
    /// the `wasi:http` origins allowed.
    pub preopens: Vec<String>,
    pub blob_store: Option<String>,
    pub http_hosts: Vec<String>,
}

/// The checks' report, and the buckets asked for by `times`.
#[derive(Debug, Clone, Serialize)]
pub struct PluginCheckAnswer {
    pub report: ConformanceReport,
    pub buckets: Option<Vec<TimeBucket>>,
}

impl PluginCheckAnswer {
    /// Every check passed and every time got a bucket the engine accepts.
    pub fn passed(&self) -> bool {
        self.report.passed() && self.buckets.as_ref().is_none_or(|b| b.iter().all(|b| b.error.is_none()))
    }
}

/// Parses `HOST:GUEST:MODE` (the host path may itself contain `:`).
fn parse_preopen(text: &str) -> Result<Preopen> {
    let mut parts = text.rsplitn(3, ':');
    let (mode, guest, host) = match (parts.next(), parts.next(), parts.next()) {
        (Some(mode), Some(guest), Some(host)) if !host.is_empty() && guest.starts_with('/') => (mode, guest, host),
        _ => return Err(invalid(format!("--preopen `{text}`: expected HOST:GUEST:MODE, e.g. /srv/archive:/data:rw"))),
    };
    let mode = match mode {
        "ro" => PreopenMode::Ro,
        "rw" => PreopenMode::Rw,
        other => return Err(invalid(format!("--preopen `{text}`: mode `{other}` is neither ro nor rw"))),
    };
    let host = std::path::Path::new(host)
        .canonicalize()
        .map_err(|e| invalid(format!("--preopen `{text}`: host directory {host}: {e}")))?;
    Ok(Preopen { host, guest: guest.to_string(), mode })
}

fn invalid(message: String) -> Error {
    Error::InvalidInput(message)
}

fn capabilities(request: &PluginCheckRequest, role: Role) -> Result<Capabilities> {
    if role != Role::Archiver
        && (!request.preopens.is_empty() || request.blob_store.is_some() || !request.http_hosts.is_empty())
    {
        return Err(invalid(format!(
            "--preopen, --blob-store and --http-host are for archivers; a {role} is granted nothing"
        )));
    }
    let preopens = request.preopens.iter().map(|p| parse_preopen(p)).collect::<Result<Vec<_>>>()?;
    let blob_store = match &request.blob_store {
        Some(url) => Some(BlobStoreGrant {
            target: url.clone(),
            backend: std::sync::Arc::new(crate::storage::ObjectStoreBackend::from_url(url)?),
        }),
        None => None,
    };
    let http = HttpGrant::parse(&request.http_hosts, None)?;
    Ok(Capabilities { preopens, blob_store, http })
}

/// Runs the checks. `Err` when the request is wrong (an unknown role or built-in, a grant for
/// a role that takes none); `Ok(Err(why))` when the plugin could not even be loaded or
/// initialised.
pub fn run(request: &PluginCheckRequest) -> Result<std::result::Result<PluginCheckAnswer, Error>> {
    let role = Role::parse(&request.role)?;
    let (source, config) =
        match builtin::find(&request.plugin).filter(|_| request.plugin.starts_with(builtin::BUILTIN_PREFIX)) {
            Some(b) => (b.source(), b.effective_config(&request.config).map_err(invalid)?),
            None if request.plugin.starts_with(builtin::BUILTIN_PREFIX) => {
                let names: Vec<&str> = builtin::BUILTINS.iter().map(|b| b.name).collect();
                return Err(invalid(format!(
                    "unknown built-in `{}`; the built-ins are {}",
                    request.plugin,
                    names.join(", ")
                )));
            }
            None => (PluginSource::from_file(std::path::Path::new(&request.plugin))?, request.config.clone()),
        };
    let capabilities = capabilities(request, role)?;
    let times = match &request.times_file {
        Some(_) if role != Role::BucketStrategy => {
            return Err(invalid(format!("--times is for bucket strategies; a {role} does not map times to buckets")));
        }
        Some(path) => Some(read_times(path)?),
        None => None,
    };
    let host = PluginHost::with_cache(request.cache_dir.clone(), request.cache_key_file.as_deref())?;
    let report = match check_with(&host, &source, role, config.clone(), request.seed, capabilities) {
        Ok(report) => report,
        Err(e) => return Ok(Err(e)),
    };
    let buckets = match &times {
        Some(times) => {
            let loaded = host.load(&source, role, PluginLimits::default())?;
            let strategy = plugin::strategy::WasmStrategy::new(loaded, config)?;
            Some(buckets_for(&strategy, times)?)
        }
        None => None,
    };
    Ok(Ok(PluginCheckAnswer { report, buckets }))
}

/// The times of a `--times` file, in order.
fn read_times(path: &std::path::Path) -> Result<Vec<Micros>> {
    let text =
        std::fs::read_to_string(path).map_err(|e| invalid(format!("reading --times {}: {e}", path.display())))?;
    let mut times = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let time = crate::model::time::parse_time_arg(line).map_err(|e| {
            invalid(format!(
                "--times {} line {}: `{line}` is neither RFC 3339 nor integer microseconds ({e})",
                path.display(),
                n + 1
            ))
        })?;
        times.push(time);
    }
    if times.is_empty() {
        return Err(invalid(format!("--times {}: no times in the file", path.display())));
    }
    Ok(times)
}

/// One line of `--times`: the time asked about and the bucket answered, or why the engine
/// would refuse the answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TimeBucket {
    pub time: Micros,
    pub key: Option<String>,
    pub start: Option<Micros>,
    pub end: Option<Micros>,
    pub error: Option<String>,
}

impl std::fmt::Display for TimeBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::model::time::format_rfc3339;
        match (&self.key, self.start, self.end, &self.error) {
            (Some(key), Some(start), Some(end), None) => {
                write!(f, "{}  {key}  [{}, {})", format_rfc3339(self.time), format_rfc3339(start), format_rfc3339(end))
            }
            (_, _, _, error) => write!(f, "{}  REFUSED: {}", format_rfc3339(self.time), error.as_deref().unwrap_or("")),
        }
    }
}

/// Asks `strategy` for each time in one batch, as the engine does, and checks each answer as
/// the engine does (`check_descriptor`).
pub fn buckets_for(strategy: &plugin::strategy::WasmStrategy, times: &[Micros]) -> Result<Vec<TimeBucket>> {
    let answers = strategy.ask_uncached(times)?;
    Ok(times
        .iter()
        .zip(answers)
        .map(|(&time, answer)| match answer.and_then(|d| plugin::strategy::check_descriptor(time, &d).map(|()| d)) {
            Ok(d) => TimeBucket { time, key: Some(d.key), start: Some(d.start), end: Some(d.end), error: None },
            Err(error) => TimeBucket { time, key: None, start: None, end: None, error: Some(error) },
        })
        .collect())
}

/// Loads and checks one plugin; an error means it could not even be loaded or initialised.
pub fn check(
    host: &PluginHost,
    source: &PluginSource,
    role: Role,
    config: String,
    seed: u64,
) -> Result<conformance::ConformanceReport> {
    check_with(host, source, role, config, seed, Capabilities::none())
}

/// The same, with capabilities for an archiver (strategies and retention policies get none).
pub fn check_with(
    host: &PluginHost,
    source: &PluginSource,
    role: Role,
    config: String,
    seed: u64,
    capabilities: Capabilities,
) -> Result<conformance::ConformanceReport> {
    let mut limits = PluginLimits::default();
    if role == Role::Archiver {
        limits.call_ms = plugin::archiver::ARCHIVER_CALL_MS_DEFAULT;
    }
    let loaded = host.load(source, role, limits)?;
    match role {
        Role::BucketStrategy => {
            conformance::check_strategy(&plugin::strategy::WasmStrategy::new(loaded, config)?, seed)
        }
        Role::RetentionPolicy => {
            conformance::check_retention(&plugin::retention::WasmRetention::new(loaded, config)?, seed)
        }
        Role::Archiver => conformance::check_archiver(
            &plugin::archiver::WasmArchiver::with_capabilities(loaded, config, capabilities)?,
            seed,
            crate::clock::Clock::now(&crate::clock::SystemClock),
        ),
    }
}

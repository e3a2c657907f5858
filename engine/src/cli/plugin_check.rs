//! `frostline plugin check`: load a component for a role and run its conformance checks.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::plugin::grants::{BlobStoreGrant, Preopen, PreopenMode};
use crate::plugin::http::HttpGrant;
use crate::plugin::{self, Capabilities, PluginHost, PluginLimits, PluginSource, Role, builtin, conformance};

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// A component file, or `builtin:NAME`.
    pub plugin: String,
    /// The role to check: bucket-strategy, retention-policy or archiver.
    #[arg(long)]
    pub role: String,
    /// A file whose content is passed to the plugin's `init` (JSON for the built-ins).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Seed for the random cases (printed in the report, so a failure can be replayed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Directory of the compiled-component cache. Its artifacts are run only when proven by
    /// the key beside it (DIR.key, made at first use) or by --cache-key-file.
    #[arg(long, env = "FROSTLINE_PLUGIN_CACHE")]
    pub cache_dir: Option<PathBuf>,
    /// The key file given to `frostline plugin compile --key-file` where the cache's artifacts
    /// were precompiled (an edge build, without a compiler, runs no other precompiled plugin).
    #[arg(long, env = "FROSTLINE_PLUGIN_CACHE_KEY_FILE", value_name = "FILE")]
    pub cache_key_file: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Bucket strategies only: a file of event times, one per line (RFC 3339 or integer
    /// microseconds; blank lines and lines starting with `#` are skipped). After the checks,
    /// prints the bucket the strategy answers for each, checked as the engine checks it.
    #[arg(long, value_name = "FILE")]
    pub times: Option<PathBuf>,
    /// Archivers only: preopen a host directory, `HOST:GUEST:MODE` with MODE `ro` or `rw`
    /// (for example `/srv/archive:/data:rw`). Repeatable. Nothing is preopened otherwise.
    #[arg(long, value_name = "HOST:GUEST:MODE")]
    pub preopen: Vec<String>,
    /// Archivers only: lend this native store to the plugin's `blob-store` import
    /// (`file:///abs/dir`, `memory://`, ...). Without it the import answers "not granted".
    #[arg(long, value_name = "URL")]
    pub blob_store: Option<String>,
    /// Archivers only: allow outgoing `wasi:http` requests to this origin (`scheme://host:port`,
    /// as a grant's `http_hosts` entry). Repeatable. Every request is denied otherwise.
    #[arg(long, value_name = "ORIGIN")]
    pub http_host: Vec<String>,
}

/// Parses `HOST:GUEST:MODE` (the host path may itself contain `:`).
fn parse_preopen(text: &str) -> anyhow::Result<Preopen> {
    let mut parts = text.rsplitn(3, ':');
    let (mode, guest, host) = match (parts.next(), parts.next(), parts.next()) {
        (Some(mode), Some(guest), Some(host)) if !host.is_empty() && guest.starts_with('/') => (mode, guest, host),
        _ => anyhow::bail!("--preopen `{text}`: expected HOST:GUEST:MODE, e.g. /srv/archive:/data:rw"),
    };
    let mode = match mode {
        "ro" => PreopenMode::Ro,
        "rw" => PreopenMode::Rw,
        other => anyhow::bail!("--preopen `{text}`: mode `{other}` is neither ro nor rw"),
    };
    let host = std::path::Path::new(host)
        .canonicalize()
        .with_context(|| format!("--preopen `{text}`: host directory {host}"))?;
    Ok(Preopen { host, guest: guest.to_string(), mode })
}

fn capabilities(args: &CheckArgs, role: Role) -> anyhow::Result<Capabilities> {
    if role != Role::Archiver && (!args.preopen.is_empty() || args.blob_store.is_some() || !args.http_host.is_empty()) {
        anyhow::bail!("--preopen, --blob-store and --http-host are for archivers; a {role} is granted nothing");
    }
    let preopens = args.preopen.iter().map(|p| parse_preopen(p)).collect::<anyhow::Result<Vec<_>>>()?;
    let blob_store = match &args.blob_store {
        Some(url) => Some(BlobStoreGrant {
            target: url.clone(),
            backend: std::sync::Arc::new(crate::storage::ObjectStoreBackend::from_url(url)?),
        }),
        None => None,
    };
    let http = HttpGrant::parse(&args.http_host, None)?;
    Ok(Capabilities { preopens, blob_store, http })
}

pub fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let role = Role::parse(&args.role)?;
    let operator_config = match &args.config {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading --config {}", path.display()))?,
        None => String::new(),
    };
    let (source, config) =
        match builtin::find(&args.plugin).filter(|_| args.plugin.starts_with(builtin::BUILTIN_PREFIX)) {
            Some(b) => (b.source(), b.effective_config(&operator_config).map_err(anyhow::Error::msg)?),
            None if args.plugin.starts_with(builtin::BUILTIN_PREFIX) => {
                let names: Vec<&str> = builtin::BUILTINS.iter().map(|b| b.name).collect();
                anyhow::bail!("unknown built-in `{}`; the built-ins are {}", args.plugin, names.join(", "));
            }
            None => (PluginSource::from_file(std::path::Path::new(&args.plugin))?, operator_config),
        };
    let seed = args.seed.unwrap_or_else(rand::random);
    let capabilities = capabilities(&args, role)?;
    let times = match &args.times {
        Some(_) if role != Role::BucketStrategy => {
            anyhow::bail!("--times is for bucket strategies; a {role} does not map times to buckets")
        }
        Some(path) => Some(read_times(path)?),
        None => None,
    };
    let host = PluginHost::with_cache(args.cache_dir.clone(), args.cache_key_file.as_deref())?;
    let report = match check_with(&host, &source, role, config.clone(), seed, capabilities) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("FAILED: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    let buckets = match &times {
        Some(times) => {
            let loaded = host.load(&source, role, PluginLimits::default())?;
            let strategy = plugin::strategy::WasmStrategy::new(loaded, config)?;
            Some(buckets_for(&strategy, times)?)
        }
        None => None,
    };
    let buckets_passed = buckets.as_ref().is_none_or(|b| b.iter().all(|b| b.error.is_none()));
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        if let (Some(object), Some(buckets)) = (value.as_object_mut(), &buckets) {
            object.insert("buckets".into(), serde_json::to_value(buckets)?);
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        println!("{report}");
        for b in buckets.iter().flatten() {
            println!("{b}");
        }
    }
    Ok(if report.passed() && buckets_passed { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The times of a `--times` file, in order.
fn read_times(path: &std::path::Path) -> anyhow::Result<Vec<crate::model::Micros>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading --times {}", path.display()))?;
    let mut times = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let time = crate::model::time::parse_time_arg(line).map_err(|e| {
            anyhow::anyhow!(
                "--times {} line {}: `{line}` is neither RFC 3339 nor integer microseconds ({e})",
                path.display(),
                n + 1
            )
        })?;
        times.push(time);
    }
    anyhow::ensure!(!times.is_empty(), "--times {}: no times in the file", path.display());
    Ok(times)
}

/// One line of `--times`: the time asked about and the bucket answered, or why the engine
/// would refuse the answer.
#[derive(Debug, serde::Serialize)]
pub struct TimeBucket {
    pub time: crate::model::Micros,
    pub key: Option<String>,
    pub start: Option<crate::model::Micros>,
    pub end: Option<crate::model::Micros>,
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
pub fn buckets_for(
    strategy: &plugin::strategy::WasmStrategy,
    times: &[crate::model::Micros],
) -> crate::Result<Vec<TimeBucket>> {
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
) -> crate::Result<conformance::ConformanceReport> {
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
) -> crate::Result<conformance::ConformanceReport> {
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

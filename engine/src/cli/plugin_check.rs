//! `frostline plugin check`: load a component for a role and run its conformance checks.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::plugin::grants::{BlobStoreGrant, Preopen, PreopenMode};
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
    /// Directory of the compiled-component cache.
    #[arg(long, env = "FROSTLINE_PLUGIN_CACHE")]
    pub cache_dir: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Archivers only: preopen a host directory, `HOST:GUEST:MODE` with MODE `ro` or `rw`
    /// (for example `/srv/archive:/data:rw`). Repeatable. Nothing is preopened otherwise.
    #[arg(long, value_name = "HOST:GUEST:MODE")]
    pub preopen: Vec<String>,
    /// Archivers only: lend this native store to the plugin's `blob-store` import
    /// (`file:///abs/dir`, `memory://`, ...). Without it the import answers "not granted".
    #[arg(long, value_name = "URL")]
    pub blob_store: Option<String>,
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
    if role != Role::Archiver && (!args.preopen.is_empty() || args.blob_store.is_some()) {
        anyhow::bail!("--preopen and --blob-store are for archivers; a {role} is granted nothing");
    }
    let preopens = args.preopen.iter().map(|p| parse_preopen(p)).collect::<anyhow::Result<Vec<_>>>()?;
    let blob_store = match &args.blob_store {
        Some(url) => Some(BlobStoreGrant {
            target: url.clone(),
            backend: std::sync::Arc::new(crate::storage::ObjectStoreBackend::from_url(url)?),
        }),
        None => None,
    };
    Ok(Capabilities { preopens, blob_store })
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
    let host = PluginHost::new(args.cache_dir.clone())?;
    let report = match check_with(&host, &source, role, config, seed, capabilities) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("FAILED: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{report}");
    }
    Ok(if report.passed() { ExitCode::SUCCESS } else { ExitCode::from(1) })
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
        ),
    }
}

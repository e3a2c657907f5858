//! `frostline plugin check`: load a component for a role and run its conformance checks.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::plugin::{self, PluginHost, PluginLimits, PluginSource, Role, builtin, conformance};

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
    let host = PluginHost::new(args.cache_dir.clone())?;
    let report = match check(&host, &source, role, config, seed) {
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
    let loaded = host.load(source, role, PluginLimits::default())?;
    match role {
        Role::BucketStrategy => {
            conformance::check_strategy(&plugin::strategy::WasmStrategy::new(loaded, config)?, seed)
        }
        Role::RetentionPolicy => {
            conformance::check_retention(&plugin::retention::WasmRetention::new(loaded, config)?, seed)
        }
        Role::Archiver => conformance::check_archiver(&plugin::archiver::WasmArchiver::new(loaded, config)?, seed),
    }
}

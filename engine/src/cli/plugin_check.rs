//! `frostline plugin check`: load a component for a role and run its conformance checks.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::ops::plugin_check::PluginCheckRequest;

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

pub fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let config = match &args.config {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading --config {}", path.display()))?,
        None => String::new(),
    };
    let request = PluginCheckRequest {
        plugin: args.plugin,
        role: args.role,
        config,
        seed: args.seed.unwrap_or_else(rand::random),
        cache_dir: args.cache_dir,
        cache_key_file: args.cache_key_file,
        times_file: args.times,
        preopens: args.preopen,
        blob_store: args.blob_store,
        http_hosts: args.http_host,
    };
    let answer = match crate::ops::plugin_check::run(&request)? {
        Ok(answer) => answer,
        Err(e) => {
            eprintln!("FAILED: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    if args.json {
        let mut value = serde_json::to_value(&answer.report)?;
        if let (Some(object), Some(buckets)) = (value.as_object_mut(), &answer.buckets) {
            object.insert("buckets".into(), serde_json::to_value(buckets)?);
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        println!("{}", answer.report);
        for b in answer.buckets.iter().flatten() {
            println!("{b}");
        }
    }
    Ok(if answer.passed() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

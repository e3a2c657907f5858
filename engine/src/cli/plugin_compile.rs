//! `frostline plugin compile`: its arguments and what it prints; `ops::plugin_compile` does
//! the work.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::ops::plugin_compile::{CompileEvent, CompileRequest};

#[derive(Debug, clap::Args)]
pub struct CompileArgs {
    /// The host kind to compile for: `aarch64`, `x86_64`, or a Linux triple of either.
    #[arg(long)]
    pub target: String,
    /// Where to write the artifacts (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// The key that proves the artifacts to the engine that runs them: give the engine the same
    /// file (FROSTLINE_PLUGIN_CACHE_KEY_FILE or --plugin-cache-key-file), which runs no
    /// precompiled artifact its keys do not prove. Made (32 random bytes as hex, mode 0600) when
    /// missing; any file of at least 32 bytes serves. Needed for components, not for --builtins.
    #[arg(long, env = "FROSTLINE_PLUGIN_CACHE_KEY_FILE", value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Compile every component the policy files of this directory name.
    #[arg(long, value_name = "DIR")]
    pub policy_dir: Option<PathBuf>,
    /// Also write the built-ins, named by component (`calendar_utc.cwasm`, ...), for building
    /// an edge binary of this same source with FROSTLINE_PRECOMPILED_BUILTINS=OUT (they are
    /// embedded in it, which proves them: they carry no MAC).
    #[arg(long)]
    pub builtins: bool,
    /// Component files to compile.
    pub components: Vec<PathBuf>,
}

pub fn run(args: CompileArgs) -> anyhow::Result<ExitCode> {
    let request = CompileRequest {
        target: args.target,
        out: args.out,
        key_file: args.key_file,
        policy_dir: args.policy_dir,
        builtins: args.builtins,
        components: args.components,
    };
    crate::ops::plugin_compile::run(&request, |event| match event {
        CompileEvent::KeyMade { path } => eprintln!(
            "made a new key in {} (mode 0600): give the engine that runs these artifacts the same file, as \
             FROSTLINE_PLUGIN_CACHE_KEY_FILE or --plugin-cache-key-file, and keep it from anyone who should not sign \
             native code for it",
            path.display()
        ),
        CompileEvent::Signing { key_id, path } => {
            eprintln!("signing the artifacts with key {key_id} ({})", path.display())
        }
        CompileEvent::Compiled { name, bytes, triple, out, artifact_bytes, millis } => {
            println!("{name}: {bytes} bytes for {triple} -> {} ({artifact_bytes} bytes, {millis} ms)", out.display())
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

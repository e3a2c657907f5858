//! The `frostline` binary: parses the command line, sets up logging, runs the command and maps
//! its outcome to an exit code. All logic lives in the library.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use frostline::cli::{Cli, LogFormat};

fn main() -> ExitCode {
    // `--version` names the plugin contract, wasmtime and the built-ins' hashes; made once.
    let long_version: &'static str = Box::leak(frostline::cli::long_version().into_boxed_str());
    let matches = Cli::command().long_version(long_version).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let filter = tracing_subscriber::EnvFilter::try_from_env("FROSTLINE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    if let Err(error) = frostline::failpoints::setup_from_env() {
        eprintln!("error: {error}");
        return ExitCode::from(2);
    }
    match frostline::cli::run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            // 2 for usage and input errors (a name that does not exist included), 1 for everything
            // else, like most Unix tools.
            let kind = error
                .downcast_ref::<frostline::Error>()
                .map(frostline::Error::kind)
                .or_else(|| error.downcast_ref::<frostline::cli::client::ClientError>().map(|e| e.kind()));
            match kind {
                Some(frostline::ErrorKind::InvalidInput | frostline::ErrorKind::NotFound) => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}

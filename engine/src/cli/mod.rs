//! The command line: argument types (clap) and one function per command. Commands call the
//! library; they hold no engine logic of their own.

pub mod plugin_check;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(name = "frostline", version, about = "Hot-to-cold archival engine with WebAssembly policy plugins")]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Work with plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
}

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Load a component, check that it implements a role, and run that role's conformance checks.
    Check(plugin_check::CheckArgs),
}

/// Runs a parsed command; the exit code is the command's verdict.
pub fn run(cli: Cli) -> anyhow::Result<std::process::ExitCode> {
    match cli.command {
        Command::Plugin(PluginCommand::Check(args)) => plugin_check::run(args),
    }
}

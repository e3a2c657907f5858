//! The command line: argument types (clap) and one function per command. Commands call the
//! operations (`ops`) on a local engine, or reach a running one through `client` (HTTP);
//! they parse and print, and hold no engine logic of their own. Never imports `api`.

pub mod client;
pub mod erase;
pub mod ingest;
pub mod lifecycle;
pub mod plugin_check;
#[cfg(feature = "compiler")]
pub mod plugin_compile;
pub mod plugin_new;
pub mod policy_check;
pub mod remote;
pub mod status;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

use crate::ops::Engine;
use crate::ops::local::ArchiverArgs;

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

/// Where the engine keeps its state and reads its policies.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// The data directory (hot database, compiled plugin cache, default archive target).
    #[arg(long, env = "FROSTLINE_DATA", default_value = "frostline-data")]
    pub data: PathBuf,
    /// The policy directory.
    #[arg(long, env = "FROSTLINE_POLICIES", default_value = "policies")]
    pub policies: PathBuf,
    #[command(flatten)]
    pub archiver: ArchiverArgs,
}

impl EngineArgs {
    fn open(&self) -> anyhow::Result<Arc<Engine>> {
        Ok(crate::ops::local::open(&self.data, &self.policies, &self.archiver)?)
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the engine: archival passes every ARCHIVER_INTERVAL_SECONDS and the HTTP API, until
    /// Ctrl-C or SIGTERM.
    Run {
        #[command(flatten)]
        engine: EngineArgs,
        #[command(flatten)]
        api: crate::daemon::ServeArgs,
    },
    /// Append JSON-lines records from FILE (or stdin) to a table.
    Ingest {
        #[command(flatten)]
        engine: EngineArgs,
        #[arg(long)]
        table: String,
        /// A JSON-lines file, or `-` for stdin.
        file: Option<String>,
    },
    /// Print records of a table as JSON lines, across hot and archived buckets.
    Query {
        #[command(flatten)]
        engine: EngineArgs,
        #[arg(long)]
        table: String,
        #[arg(long)]
        partition: Option<String>,
        /// Only records of this tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Inclusive lower bound: RFC 3339 or integer microseconds.
        #[arg(long)]
        from: Option<String>,
        /// Exclusive upper bound: RFC 3339 or integer microseconds.
        #[arg(long)]
        to: Option<String>,
        #[arg(long, default_value_t = crate::ops::query::QUERY_LIMIT_DEFAULT)]
        limit: usize,
        /// The cursor printed by the previous page.
        #[arg(long)]
        cursor: Option<String>,
        /// Only records whose typed column meets this condition: `carrier=AA`,
        /// `dep_delay>=10`, `sched_dep<2024-01-02T00:00:00Z` (=, <, <=, >, >=). Repeat it for
        /// several; archived segments whose statistics rule one out are not read.
        #[arg(long = "where", value_name = "CONDITION")]
        conditions: Vec<String>,
    },
    /// Show tables, buckets per state, due work, deferrals and leases.
    Status {
        #[command(flatten)]
        engine: EngineArgs,
        #[arg(long)]
        json: bool,
    },
    /// Run archival passes.
    Archive {
        #[command(flatten)]
        engine: EngineArgs,
        /// Run one pass and exit.
        #[arg(long)]
        once: bool,
    },
    /// Ask the running engine of a data directory to reload its policy directory (SIGHUP).
    Reload {
        /// The data directory of the running engine.
        #[arg(long, env = "FROSTLINE_DATA", default_value = "frostline-data")]
        data: PathBuf,
    },
    /// Work with plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Check a policy directory before it goes live.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Place, lift and list legal holds.
    #[command(subcommand)]
    Hold(lifecycle::HoldCommand),
    /// Erase records everywhere they are kept (hot store and archives), and follow the receipts.
    #[command(subcommand)]
    Erase(erase::EraseCommand),
    /// Re-read every archived manifest and segment and check every hash and count (the scrub).
    Verify {
        #[command(flatten)]
        engine: EngineArgs,
        /// Only this table.
        #[arg(long)]
        table: Option<String>,
        /// Only a random sample of this many buckets.
        #[arg(long)]
        sample: Option<usize>,
        #[arg(long)]
        json: bool,
    },
    /// Delete archive objects that nothing references and that are older than the grace period.
    Sweep {
        #[command(flatten)]
        engine: EngineArgs,
        /// Count what would be deleted without deleting.
        #[arg(long)]
        dry_run: bool,
    },
    /// Take in the archives on the tables' targets that this data directory does not record
    /// (after rebuilding it, or restoring it from a backup while another copy went on): each is
    /// verified whole, then read, verified and expired like the engine's own. Run it with the
    /// engine stopped. Exit 0 when every archive found is recorded, 1 when some were left alone.
    Adopt {
        #[command(flatten)]
        engine: EngineArgs,
        /// Verify and count what would be adopted without recording anything.
        #[arg(long)]
        dry_run: bool,
        /// Also take in the archives of this installation id (a lost host, or the data
        /// directory this one replaces; repeatable). Without it, other installations' archives
        /// are left alone and listed: on a shared target they belong to live peers. A host that
        /// already adopted them holds a claim on the target, and adoption is refused unless it
        /// is named too.
        #[arg(long = "from-installation", value_name = "ID")]
        from_installations: Vec<String>,
    },
    /// Give the hot store's file back the space archival and erasure freed (redb keeps its
    /// high-water mark, and a freed page keeps what it held until reused): the live pages move
    /// to the front and the rest is truncated. Run it with the engine stopped.
    Compact {
        /// The data directory whose hot store to compact.
        #[arg(long, env = "FROSTLINE_DATA", default_value = "frostline-data")]
        data: PathBuf,
    },
    /// Work with the Delta Lake tables of Parquet archives.
    #[cfg(feature = "delta")]
    #[command(subcommand)]
    Delta(DeltaCommand),
}

#[cfg(feature = "delta")]
#[derive(Debug, Subcommand)]
pub enum DeltaCommand {
    /// Make this installation's files in each table's Delta log match its published
    /// manifests (what every pass does after publishing or expiring), writing the log anew
    /// when it is gone. A damaged log is refused: move its `_delta_log/` aside and run this on
    /// every installation that archives into the table. Run it with the engine stopped.
    #[command(visible_alias = "sync")]
    Rebuild {
        #[command(flatten)]
        engine: EngineArgs,
        /// Only this table.
        #[arg(long)]
        table: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy directory exactly as a reload would (plugins compiled, initialised and
    /// checked, targets probed); with --data, also against that data directory, printing the
    /// re-plan it would cause. Changes nothing. Exit 0 when it would be accepted, 1 otherwise.
    Check(policy_check::PolicyCheckArgs),
}

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Load a component, check that it implements a role, and run that role's conformance checks.
    Check(plugin_check::CheckArgs),
    /// Write a new plugin project (WIT, a working plugin, build and check scripts) for a role
    /// in Rust, Python or JavaScript.
    New(plugin_new::NewArgs),
    /// Precompile components for another host (an edge build has no compiler): the
    /// components of a policy directory and named files, each proven by an HMAC under
    /// --key-file (give the engine the same file as FROSTLINE_PLUGIN_CACHE_KEY_FILE), and with
    /// --builtins the built-ins for an edge build of this source.
    #[cfg(feature = "compiler")]
    Compile(plugin_compile::CompileArgs),
}

/// What `frostline --version` prints after the version (`ops::plugins::version_text`).
pub fn long_version() -> String {
    crate::ops::plugins::version_text()
}

/// A progress bar on a terminal; hidden otherwise (scripts and tests).
pub fn progress_bar(len: u64, what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(what.to_string());
    bar
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

/// Runs a parsed command; the exit code is the command's verdict.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Plugin(PluginCommand::Check(args)) => plugin_check::run(args),
        Command::Plugin(PluginCommand::New(args)) => plugin_new::run(args),
        #[cfg(feature = "compiler")]
        Command::Plugin(PluginCommand::Compile(args)) => plugin_compile::run(args),
        Command::Policy(PolicyCommand::Check(args)) => policy_check::run(args),
        Command::Hold(command) => lifecycle::run_hold(command),
        Command::Erase(command) => erase::run(command),
        Command::Verify { engine, table, sample, json } => lifecycle::run_verify(engine, table, sample, json),
        Command::Sweep { engine, dry_run } => lifecycle::run_sweep(engine, dry_run),
        Command::Compact { data } => {
            let compaction = crate::ops::local::compact(&data)?;
            println!("{}", serde_json::to_string(&compaction)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Adopt { engine, dry_run, from_installations } => {
            lifecycle::run_adopt(engine, dry_run, &from_installations)
        }
        #[cfg(feature = "delta")]
        Command::Delta(DeltaCommand::Rebuild { engine, table }) => lifecycle::run_delta_rebuild(engine, table),
        Command::Ingest { engine, table, file } => {
            let handle = remote::open(&engine)?;
            let columns = handle.columns(&table)?;
            let validated = match ingest::validate(file.as_deref(), columns.as_deref())? {
                ingest::Validation::Valid(validated) => validated,
                ingest::Validation::Malformed { reported, total } => {
                    for e in &reported {
                        eprintln!("{e}");
                    }
                    if total > reported.len() as u64 {
                        eprintln!("... and {} more", total - reported.len() as u64);
                    }
                    return Err(
                        crate::Error::InvalidInput(format!("{total} malformed line(s); nothing was written")).into()
                    );
                }
            };
            let bar = progress_bar(validated.records, "ingest");
            let outcome = ingest::append_batches(
                validated,
                |records, lines| handle.append_batch(&table, records, lines),
                |count| bar.inc(count as u64),
            );
            // Archival of the table resumes now, whether the ingest finished or stopped (a lease
            // not ended lapses by itself).
            let ended = handle.end_backfill(&table);
            let outcome = outcome?;
            ended?;
            bar.finish_and_clear();
            println!("{}", serde_json::to_string(&outcome)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Query { engine, table, partition, tenant, from, to, limit, cursor, conditions } => {
            let request = crate::cli::client::PageRequest {
                partition: partition.as_deref(),
                tenant: tenant.as_deref(),
                from: from.as_deref(),
                to: to.as_deref(),
                limit,
                cursor: cursor.as_deref(),
                conditions: &conditions,
            };
            let page = remote::open(&engine)?.query(&table, &request)?;
            // Buffered: stdout alone flushes at every line, a write call per record.
            let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
            for line in &page.lines {
                use std::io::Write;
                writeln!(out, "{line}")?;
            }
            std::io::Write::flush(&mut out)?;
            for gone in &page.expired {
                eprintln!("{gone}");
            }
            if let Some(c) = page.next_cursor {
                eprintln!("next cursor: {c}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { engine: args, json } => {
            let engine = match args.open() {
                Ok(engine) => engine,
                Err(e) if matches!(e.downcast_ref::<crate::Error>(), Some(crate::Error::AlreadyOpen { .. })) => {
                    // A running engine holds the database: ask its API, or, as a last resort,
                    // read the status file it publishes.
                    match crate::ops::wire::read_addr_file(&args.data)? {
                        Some(addr) => remote::status(
                            &crate::cli::client::Client::for_running_engine(&args.data, addr)?,
                            &args,
                            json,
                        )?,
                        None => {
                            let path = crate::ops::local::status_file(&args.data);
                            let text = std::fs::read_to_string(&path).with_context(|| {
                                format!("{e:#}; and its status file {} is unreadable", path.display())
                            })?;
                            println!("{text}");
                        }
                    }
                    return Ok(ExitCode::SUCCESS);
                }
                Err(e) => return Err(e),
            };
            let status = crate::ops::status::collect(&engine)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                status::print(&status);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Reload { data } => {
            let pid = crate::ops::local::signal_reload(&data)?;
            println!("asked process {pid} to reload; see `frostline status` for the result");
            Ok(ExitCode::SUCCESS)
        }
        Command::Archive { engine, once } => {
            if !once {
                anyhow::bail!("`archive` runs one pass with --once; use `frostline run` for continuous passes");
            }
            let (report, clean) = remote::open(&engine)?.archive_once()?;
            println!("{report}");
            Ok(if clean { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Run { engine, api } => {
            let serve = api.validate()?;
            let engine = engine.open()?;
            let runtime = runtime()?;
            let archive = crate::ops::passes::background_runtime(engine.settings().archive_concurrency)?;
            let result = runtime.block_on(crate::daemon::run(engine, serve, archive.handle().clone()));
            // Whatever is still running after a forced stop is abandoned, not waited for.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            archive.shutdown_timeout(std::time::Duration::from_secs(1));
            result.context("running the engine")?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

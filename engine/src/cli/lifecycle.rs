//! `frostline hold`, `frostline verify`, `frostline sweep` and `frostline adopt`: the retention
//! lifecycle's operator commands. While `frostline run` holds the data directory, `hold` and
//! `verify` go through its API (`cli::remote`); `sweep` and `adopt` need the directory itself.

use std::process::ExitCode;

use clap::Subcommand;

use super::{EngineArgs, remote, runtime};
use crate::ops::archives::BucketVerdict;

use crate::ops::holds::{HoldListing, HoldRequest};

#[derive(Debug, Subcommand)]
pub enum HoldCommand {
    /// Place a legal hold on a table, or on one partition, tenant or bucket of it.
    Place {
        #[command(flatten)]
        engine: EngineArgs,
        #[arg(long)]
        table: String,
        #[arg(long)]
        partition: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
        /// A bucket key, such as year:2024.
        #[arg(long)]
        bucket: Option<String>,
        #[arg(long)]
        reason: String,
        /// Who placed it (recorded with the hold).
        #[arg(long, env = "USER", default_value = "unknown")]
        by: String,
    },
    /// Lift a hold by id; what it covered is re-planned.
    Lift {
        #[command(flatten)]
        engine: EngineArgs,
        id: String,
        #[arg(long, env = "USER", default_value = "unknown")]
        by: String,
    },
    /// List holds (placed with the CLI and declared in the policy directory) and what they cover.
    List {
        #[command(flatten)]
        engine: EngineArgs,
        #[arg(long)]
        json: bool,
    },
}

fn print_holds(holds: &[HoldListing], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(holds)?);
        return Ok(());
    }
    for h in holds {
        println!(
            "{}  table={} partition={} tenant={} bucket={}  covers {} buckets  by {} ({}): {}",
            h.hold.id,
            h.hold.table,
            h.hold.partition_key.as_deref().unwrap_or("*"),
            h.hold.tenant.as_deref().unwrap_or("*"),
            h.hold.bucket_key.as_deref().unwrap_or("*"),
            h.covered_buckets,
            h.hold.placed_by,
            h.hold.source,
            h.hold.reason
        );
    }
    Ok(())
}

pub fn run_hold(command: HoldCommand) -> anyhow::Result<ExitCode> {
    match command {
        HoldCommand::Place { engine, table, partition, tenant, bucket, reason, by } => {
            let request = HoldRequest { table, partition, tenant, bucket, reason, placed_by: by };
            let placed = remote::open(&engine)?.place_hold(request)?;
            println!("{}", serde_json::to_string(&placed)?);
            Ok(ExitCode::SUCCESS)
        }
        HoldCommand::Lift { engine, id, by } => {
            let lifted = remote::open(&engine)?.lift_hold(id, by)?;
            println!("{}", serde_json::json!({"lifted": lifted}));
            Ok(ExitCode::SUCCESS)
        }
        HoldCommand::List { engine, json } => {
            let holds = remote::open(&engine)?.holds()?;
            print_holds(&holds, json)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub fn run_verify(
    engine: EngineArgs,
    table: Option<String>,
    sample: Option<usize>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let verdicts = remote::open(&engine)?.verify(table, sample)?;
    let failed = print_verdicts(&verdicts, json)?;
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Prints verdicts; the number that failed.
fn print_verdicts(verdicts: &[BucketVerdict], json: bool) -> anyhow::Result<usize> {
    let failed = verdicts.iter().filter(|v| !v.ok).count();
    if json {
        println!("{}", serde_json::to_string_pretty(verdicts)?);
    } else {
        for v in verdicts {
            match &v.error {
                None => println!("ok    {}  {} rows in {} segments", v.bucket, v.rows, v.segments),
                Some(e) => println!("FAIL  {}  {e}", v.bucket),
            }
        }
        println!("{} buckets verified, {failed} failed", verdicts.len());
    }
    Ok(failed)
}

pub fn run_sweep(engine: EngineArgs, dry_run: bool) -> anyhow::Result<ExitCode> {
    let engine = engine.open()?;
    let report = runtime()?.block_on(crate::ops::archives::sweep(&engine, dry_run))?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(ExitCode::SUCCESS)
}

/// `frostline delta rebuild`: one line of JSON per table; exit 1 when a table's sync failed.
#[cfg(feature = "delta")]
pub fn run_delta_rebuild(engine: EngineArgs, table: Option<String>) -> anyhow::Result<ExitCode> {
    let engine = engine.open()?;
    let rebuilt = runtime()?.block_on(crate::ops::archives::delta_rebuild(&engine, table.as_deref()))?;
    let mut clean = true;
    for table in rebuilt {
        match &table.error {
            None => println!("{}", serde_json::to_string(&table)?),
            Some(error) => {
                clean = false;
                eprintln!("table `{}`: {error}", table.sync.table);
            }
        }
    }
    Ok(if clean { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

pub fn run_adopt(engine: EngineArgs, dry_run: bool, from_installations: &[String]) -> anyhow::Result<ExitCode> {
    let engine = engine.open()?;
    let report = runtime()?.block_on(crate::ops::archives::adopt(&engine, dry_run, from_installations))?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(if report.conflicts.is_empty() && report.failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

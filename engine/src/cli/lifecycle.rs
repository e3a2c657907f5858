//! `frostline hold`, `frostline verify` and `frostline sweep`: the retention lifecycle's
//! operator commands.

use std::process::ExitCode;

use clap::Subcommand;

use super::{EngineArgs, progress_bar, runtime};
use crate::store::schema::Hold;

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

/// A hold with what it covers, for listings.
#[derive(Debug, serde::Serialize)]
pub struct HoldListing {
    #[serde(flatten)]
    pub hold: Hold,
    pub covered_buckets: u64,
}

pub fn list_holds(engine: &crate::engine::Engine) -> crate::Result<Vec<HoldListing>> {
    let mut holds = engine.store.holds()?;
    holds.extend(engine.policies().holds.iter().cloned());
    let buckets = engine.store.all_buckets()?;
    Ok(holds
        .into_iter()
        .map(|hold| {
            let covered_buckets = buckets.iter().filter(|b| hold.covers(b)).count() as u64;
            HoldListing { hold, covered_buckets }
        })
        .collect())
}

pub fn run_hold(command: HoldCommand) -> anyhow::Result<ExitCode> {
    match command {
        HoldCommand::Place { engine, table, partition, tenant, bucket, reason, by } => {
            let engine = engine.open()?;
            engine.policies().table(&table)?;
            if reason.trim().is_empty() {
                anyhow::bail!("--reason must say why the data is held");
            }
            let hold = Hold {
                id: format!("h-{:012x}", rand::random::<u64>() >> 16),
                table,
                partition_key: partition,
                tenant,
                bucket_key: bucket,
                reason,
                placed_by: by,
                placed_at: engine.clock.now(),
                source: "cli".into(),
            };
            let covered = engine.store.place_hold(hold.clone(), engine.clock.now())?;
            println!("{}", serde_json::json!({"id": hold.id, "covered_buckets": covered}));
            Ok(ExitCode::SUCCESS)
        }
        HoldCommand::Lift { engine, id, by } => {
            let engine = engine.open()?;
            if id.starts_with("policy-") {
                anyhow::bail!("hold `{id}` is declared in the policy directory: remove it there to lift it");
            }
            let hold = engine.store.lift_hold(id, by, engine.clock.now())?;
            println!("{}", serde_json::json!({"lifted": hold.id}));
            Ok(ExitCode::SUCCESS)
        }
        HoldCommand::List { engine, json } => {
            let engine = engine.open()?;
            let holds = list_holds(&engine)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&holds)?);
            } else {
                for h in &holds {
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
            }
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
    let engine = engine.open()?;
    let total = engine
        .store
        .all_buckets()?
        .iter()
        .filter(|b| matches!(b.state, crate::model::BucketState::Archived { .. }))
        .filter(|b| table.as_ref().is_none_or(|t| &b.id.table == t))
        .count();
    let bar = progress_bar(sample.map_or(total, |n| n.min(total)) as u64, "verify");
    let verdicts = runtime()?
        .block_on(crate::archive::verify::verify(&engine, table, sample, |done| bar.set_position(done as u64)))?;
    bar.finish_and_clear();
    let failed = verdicts.iter().filter(|v| !v.ok).count();
    if json {
        println!("{}", serde_json::to_string_pretty(&verdicts)?);
    } else {
        for v in &verdicts {
            match &v.error {
                None => println!("ok    {}  {} rows in {} segments", v.bucket, v.rows, v.segments),
                Some(e) => println!("FAIL  {}  {e}", v.bucket),
            }
        }
        println!("{} buckets verified, {failed} failed", verdicts.len());
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

pub fn run_sweep(engine: EngineArgs, dry_run: bool) -> anyhow::Result<ExitCode> {
    let engine = engine.open()?;
    let report = runtime()?.block_on(crate::archive::sweep::sweep(&engine, dry_run))?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(ExitCode::SUCCESS)
}

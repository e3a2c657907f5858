//! `frostline hold`, `frostline verify` and `frostline sweep`: the retention lifecycle's
//! operator commands. While `frostline run` holds the data directory, `hold` and `verify` go
//! through its API (`cli::remote`); `sweep` needs the directory itself.

use std::process::ExitCode;

use clap::Subcommand;

use super::{EngineArgs, progress_bar, remote, runtime};
use crate::archive::verify::BucketVerdict;
use crate::engine::Engine;
use crate::error::{Error, Result};
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
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct HoldListing {
    #[serde(flatten)]
    pub hold: Hold,
    pub covered_buckets: u64,
}

/// Every hold, placed (API, CLI) and declared (policy directory; the store keeps them in step
/// with the active set), with the buckets it covers.
pub fn list_holds(engine: &Engine) -> Result<Vec<HoldListing>> {
    let holds = engine.store.holds()?;
    let mut covered = vec![0u64; holds.len()];
    engine.store.visit_buckets(|b| {
        for (hold, count) in holds.iter().zip(&mut covered) {
            *count += u64::from(hold.covers(&b));
        }
        Ok(())
    })?;
    Ok(holds.into_iter().zip(covered).map(|(hold, covered_buckets)| HoldListing { hold, covered_buckets }).collect())
}

/// What placing a hold asks for: `frostline hold place`'s flags and `POST /v1/holds`'s body.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldRequest {
    pub table: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// A bucket key, such as year:2024.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    pub reason: String,
    pub placed_by: String,
}

/// A placed hold's id, the buckets it covers now, and what it did to expiries under way.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HoldPlaced {
    pub id: String,
    pub covered_buckets: u64,
    /// Buckets whose expiry had written its tombstone but deleted nothing: called off, held.
    #[serde(default)]
    pub expiries_called_off: Vec<String>,
    /// Buckets whose expiry had already started deleting objects: the hold is placed, but it
    /// cannot bring these archives back.
    #[serde(default)]
    pub too_late: Vec<String>,
}

/// Builds a hold from a request: checks it (the table must be declared, the reason and who
/// placed it must be given) and gives it a fresh id. The CLI (`source` = `cli`) and the API
/// (`api`) build holds only through this.
pub fn new_hold(engine: &Engine, request: HoldRequest, source: &str) -> Result<Hold> {
    engine.policies().table(&request.table)?;
    if request.reason.trim().is_empty() {
        return Err(Error::InvalidInput("a hold's reason must say why the data is held".into()));
    }
    if request.placed_by.trim().is_empty() {
        return Err(Error::InvalidInput("a hold must say who placed it".into()));
    }
    Ok(Hold {
        id: format!("h-{:012x}", rand::random::<u64>() >> 16),
        table: request.table,
        partition_key: request.partition,
        tenant: request.tenant,
        bucket_key: request.bucket,
        reason: request.reason,
        placed_by: request.placed_by,
        placed_at: engine.clock.now(),
        source: source.into(),
    })
}

/// Builds (`new_hold`) and places a hold.
pub fn place_hold(engine: &Engine, request: HoldRequest, source: &str) -> Result<HoldPlaced> {
    let hold = new_hold(engine, request, source)?;
    let id = hold.id.clone();
    let placement = engine.store.place_hold(hold, engine.clock.now())?;
    Ok(HoldPlaced {
        id,
        covered_buckets: placement.covered,
        expiries_called_off: placement.expiries_called_off,
        too_late: placement.too_late,
    })
}

/// Whether a hold id names a hold declared in the policy directory (lifted only there).
pub fn is_policy_hold(id: &str) -> bool {
    id.starts_with("policy-")
}

/// Lifts a placed hold; a policy-declared one is a conflict (remove it from the policy
/// directory instead).
pub fn lift_hold(engine: &Engine, id: String, by: String) -> Result<Hold> {
    if is_policy_hold(&id) {
        return Err(Error::Conflict(format!(
            "hold `{id}` is declared in the policy directory: remove it there (and reload) to lift it"
        )));
    }
    engine.store.lift_hold(id, by, engine.clock.now())
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
            if reason.trim().is_empty() {
                anyhow::bail!("--reason must say why the data is held");
            }
            let request = HoldRequest { table, partition, tenant, bucket, reason, placed_by: by };
            let placed = match remote::open(&engine)? {
                remote::Opened::Local(engine) => place_hold(&engine, request, "cli")?,
                remote::Opened::Remote(client) => client.place_hold(&request)?,
            };
            println!("{}", serde_json::to_string(&placed)?);
            Ok(ExitCode::SUCCESS)
        }
        HoldCommand::Lift { engine, id, by } => {
            if is_policy_hold(&id) {
                anyhow::bail!("hold `{id}` is declared in the policy directory: remove it there to lift it");
            }
            let lifted = match remote::open(&engine)? {
                remote::Opened::Local(engine) => lift_hold(&engine, id, by)?.id,
                remote::Opened::Remote(client) => client.lift_hold(&id, &by)?,
            };
            println!("{}", serde_json::json!({"lifted": lifted}));
            Ok(ExitCode::SUCCESS)
        }
        HoldCommand::List { engine, json } => {
            let holds = match remote::open(&engine)? {
                remote::Opened::Local(engine) => list_holds(&engine)?,
                remote::Opened::Remote(client) => client.holds()?,
            };
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
    let verdicts = match remote::open(&engine)? {
        remote::Opened::Local(engine) => {
            let total = engine
                .store
                .all_buckets()?
                .iter()
                .filter(|b| matches!(b.state, crate::model::BucketState::Archived { .. }))
                .filter(|b| table.as_ref().is_none_or(|t| &b.id.table == t))
                .count();
            let bar = progress_bar(sample.map_or(total, |n| n.min(total)) as u64, "verify");
            let verdicts = runtime()?.block_on(crate::archive::verify::verify(&engine, table, sample, |done| {
                bar.set_position(done as u64)
            }))?;
            bar.finish_and_clear();
            verdicts
        }
        remote::Opened::Remote(client) => client.verify(table.as_deref(), sample)?.verdicts,
    };
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
    let report = runtime()?.block_on(crate::archive::sweep::sweep(&engine, dry_run))?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(ExitCode::SUCCESS)
}

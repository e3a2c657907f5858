//! `frostline erase place|status`: erasure requests as an operator places and follows them.
//! While `frostline run` holds the data directory they go through its API (admin token);
//! otherwise they open the directory, and the next `frostline run` or `archive --once` carries
//! the request out.

use std::process::ExitCode;

use clap::Subcommand;

use super::{EngineArgs, remote};
use crate::ops::erasure::EraseRequest;
use crate::ops::erasure::{ErasureProgress, ErasureRequest, RecordIdentity};

#[derive(Debug, Subcommand)]
pub enum EraseCommand {
    /// Erase records from the hot store and every archive: by tenant, partition key or exact
    /// records, optionally within one table and a time range. Held buckets wait for their holds.
    Place {
        #[command(flatten)]
        engine: EngineArgs,
        #[arg(long)]
        table: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        partition: Option<String>,
        /// One record, as JSON: {"partition_key": "...", "event_time": MICROS, "sort_key": "..."}.
        /// Repeatable.
        #[arg(long = "record", value_name = "JSON")]
        records: Vec<String>,
        /// Event times from (inclusive): RFC 3339 or microseconds.
        #[arg(long)]
        from: Option<String>,
        /// Event times to (exclusive): RFC 3339 or microseconds.
        #[arg(long)]
        to: Option<String>,
        /// Why (the request it answers); kept with the receipt.
        #[arg(long)]
        reason: String,
        /// Who asks (kept with the receipt).
        #[arg(long, env = "USER", default_value = "unknown")]
        by: String,
        /// Count the hot rows, archived buckets and objects it would touch; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show requests and their receipts: what was erased where and when, which generations
    /// replaced which objects, and when their absence was proved. Exit 1 while one is open.
    Status {
        #[command(flatten)]
        engine: EngineArgs,
        /// One request; all of them without.
        id: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(command: EraseCommand) -> anyhow::Result<ExitCode> {
    match command {
        EraseCommand::Place { engine, table, tenant, partition, records, from, to, reason, by, dry_run } => {
            let records = records
                .iter()
                .map(|text| {
                    serde_json::from_str::<RecordIdentity>(text).map_err(|e| {
                        anyhow::anyhow!(
                            "--record `{text}`: {e}; give {{\"partition_key\": \"...\", \"event_time\": MICROS, \
                             \"sort_key\": \"...\"}}"
                        )
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let request =
                EraseRequest { table, tenant, partition, records, from, to, reason, requested_by: by, dry_run };
            let placed = remote::open(&engine)?.place_erasure(request)?;
            println!("{}", serde_json::to_string_pretty(&placed)?);
            Ok(ExitCode::SUCCESS)
        }
        EraseCommand::Status { engine, id, json } => {
            let requests = remote::open(&engine)?.erasures(id)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&requests)?);
            } else {
                requests.iter().for_each(print_request);
            }
            Ok(if requests.iter().any(ErasureRequest::is_open) { ExitCode::from(1) } else { ExitCode::SUCCESS })
        }
    }
}

fn print_request(request: &ErasureRequest) {
    let done = request.buckets.iter().filter(|b| b.progress == ErasureProgress::Done).count();
    let state = if request.is_open() { "open" } else { "finished" };
    println!(
        "{}  {state}  {done}/{} buckets  by {}: {}",
        request.id,
        request.buckets.len(),
        request.requester,
        request.reason
    );
    for target in &request.fleet {
        let finished: Vec<&str> = target.finished.iter().map(|r| r.installation.as_str()).collect();
        println!(
            "  on {}: finished by {} installation(s) [{}]; not yet by {} [{}]",
            target.target,
            finished.len(),
            finished.join(", "),
            target.behind.len(),
            target.behind.join(", ")
        );
    }
    for bucket in &request.buckets {
        let blocked = if bucket.blocked_by.is_empty() {
            String::new()
        } else {
            format!("  held by {}", bucket.blocked_by.join(", "))
        };
        println!(
            "  {}  {:?}  hot rows {}  archived rows {}  objects deleted {}{blocked}",
            bucket.bucket.display(),
            bucket.progress,
            bucket.hot_rows_erased,
            bucket.archived_rows_erased,
            bucket.deleted_objects.len()
        );
        if !bucket.versions_kept_on.is_empty() {
            println!(
                "    the deleted objects stay as noncurrent versions on {} (bucket versioning) until a lifecycle rule \
                 removes them",
                bucket.versions_kept_on.join(", ")
            );
        }
    }
}

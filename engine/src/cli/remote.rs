//! One process owns a data directory. When `frostline run` holds it, `ingest`, `query`,
//! `status`, `archive --once`, `hold place|lift|list` and `verify` go through the running
//! engine's HTTP API (the address is in `<data>/frostline.addr`, tokens in FROSTLINE_TOKEN and
//! FROSTLINE_ADMIN_TOKEN); otherwise they open the directory themselves.

use std::sync::Arc;

use anyhow::Context;

use super::EngineArgs;
use crate::cli::client::{Client, ClientError, PageRequest};
use crate::model::Record;
use crate::ops::Engine;
use crate::ops::archives::BucketVerdict;
use crate::ops::erasure::ErasureRequest;
use crate::ops::erasure::{EraseRequest, ErasurePlaced};
use crate::ops::holds::{HoldListing, HoldPlaced, HoldRequest};
use crate::ops::wire::AppendCounts;

/// The engine a command works on: the data directory opened here (`Arc<Engine>`), or the
/// running engine that holds it, through its API (`Client`). Each command is written once
/// against this; the two implementations below are the only place the paths differ.
pub trait EngineHandle {
    /// Appends one batch of `frostline ingest` atomically (through a running engine, as a
    /// backfill batch that holds the table's backfill lease, `store::backfill`), as `ops::records::parse_line` made them from
    /// `lines`, their JSON lines as the API takes them (at most `HTTP_RECORDS_PER_REQUEST_MAX`
    /// records and `HTTP_BODY_BYTES_MAX` bytes); neither path checks them again.
    fn append_batch(&self, table: &str, records: Vec<Record>, lines: &[u8]) -> anyhow::Result<AppendCounts>;
    /// One page of a query, as JSON lines, with the expired ranges it met (described) and the
    /// cursor of the next page.
    fn query(&self, table: &str, request: &PageRequest<'_>) -> anyhow::Result<QueryPage>;
    /// Passes until nothing more is claimable now: the report, and whether it was clean.
    fn archive_once(&self) -> anyhow::Result<(serde_json::Value, bool)>;
    /// Ends the backfill lease `append_batch` held (the ingest is over).
    fn end_backfill(&self, table: &str) -> anyhow::Result<()>;
    /// The table's typed columns (a data directory's policy, or a running engine's); `None`
    /// from an engine too old to say, which checks them per batch.
    fn columns(&self, table: &str) -> anyhow::Result<Option<Vec<crate::model::columns::ColumnSpec>>>;
    fn place_hold(&self, request: HoldRequest) -> anyhow::Result<HoldPlaced>;
    /// Lifts a hold; the id of the hold lifted.
    fn lift_hold(&self, id: String, by: String) -> anyhow::Result<String>;
    fn holds(&self) -> anyhow::Result<Vec<HoldListing>>;
    fn verify(&self, table: Option<String>, sample: Option<usize>) -> anyhow::Result<Vec<BucketVerdict>>;
    fn place_erasure(&self, request: EraseRequest) -> anyhow::Result<ErasurePlaced>;
    /// One erasure request (`Some(id)`) or all of them, with their receipts.
    fn erasures(&self, id: Option<String>) -> anyhow::Result<Vec<ErasureRequest>>;
}

/// One page of a query as a command prints it.
pub struct QueryPage {
    pub lines: Vec<String>,
    pub expired: Vec<String>,
    pub next_cursor: Option<String>,
}

impl EngineHandle for Arc<Engine> {
    fn append_batch(&self, table: &str, records: Vec<Record>, _lines: &[u8]) -> anyhow::Result<AppendCounts> {
        // No pass runs beside a command that opened the data directory itself: no lease.
        Ok(crate::ops::records::append(self, table, crate::model::CheckedRecords::parsed(records))?)
    }

    fn query(&self, table: &str, request: &PageRequest<'_>) -> anyhow::Result<QueryPage> {
        let request = crate::ops::query::QueryRequest {
            table: table.to_string(),
            partition_key: request.partition.map(|p| p.as_bytes().to_vec()),
            tenants: request.tenant.map(|t| std::collections::BTreeSet::from([t.to_string()])),
            from: request.from.map(crate::model::time::parse_time_arg).transpose()?,
            to: request.to.map(crate::model::time::parse_time_arg).transpose()?,
            limit: request.limit,
            cursor: request.cursor.map(str::to_string),
            conditions: request.conditions.to_vec(),
        };
        let page = super::runtime()?.block_on(crate::ops::query::query(self, request))?;
        Ok(QueryPage {
            lines: page.records.iter().map(crate::ops::records::record_json).collect(),
            expired: page.expired.iter().map(crate::ops::query::ExpiredRange::describe).collect(),
            next_cursor: page.next_cursor,
        })
    }

    fn archive_once(&self) -> anyhow::Result<(serde_json::Value, bool)> {
        let report = super::runtime()?.block_on(crate::ops::local::archive_once(self))?;
        let clean = report.deferred == 0 && report.errors.is_empty();
        Ok((serde_json::to_value(&report)?, clean))
    }

    fn end_backfill(&self, _table: &str) -> anyhow::Result<()> {
        Ok(())
    }

    fn columns(&self, table: &str) -> anyhow::Result<Option<Vec<crate::model::columns::ColumnSpec>>> {
        Ok(Some(self.policies().table(table)?.columns().to_vec()))
    }

    fn place_hold(&self, request: HoldRequest) -> anyhow::Result<HoldPlaced> {
        Ok(crate::ops::holds::place_hold(self, request, "cli")?)
    }

    fn lift_hold(&self, id: String, by: String) -> anyhow::Result<String> {
        Ok(crate::ops::holds::lift_hold(self, id, by)?.id)
    }

    fn holds(&self) -> anyhow::Result<Vec<HoldListing>> {
        Ok(crate::ops::holds::list_holds(self)?)
    }

    fn place_erasure(&self, request: EraseRequest) -> anyhow::Result<ErasurePlaced> {
        Ok(crate::ops::erasure::place_erasure(self, request)?)
    }

    fn erasures(&self, id: Option<String>) -> anyhow::Result<Vec<ErasureRequest>> {
        Ok(match id {
            Some(id) => vec![crate::ops::erasure::erasure(self, &id)?],
            None => crate::ops::erasure::list_erasures(self)?,
        })
    }

    fn verify(&self, table: Option<String>, sample: Option<usize>) -> anyhow::Result<Vec<BucketVerdict>> {
        let total = crate::ops::archives::verify_total(self, table.as_deref(), sample)?;
        let bar = super::progress_bar(total as u64, "verify");
        let report = super::runtime()?
            .block_on(crate::ops::archives::verify(self, table, sample, |done| bar.set_position(done as u64)))?;
        bar.finish_and_clear();
        Ok(report.verdicts)
    }
}

impl EngineHandle for Client {
    fn append_batch(&self, table: &str, _records: Vec<Record>, lines: &[u8]) -> anyhow::Result<AppendCounts> {
        Ok(self.append(table, lines, true)?)
    }

    fn query(&self, table: &str, request: &PageRequest<'_>) -> anyhow::Result<QueryPage> {
        let page = Client::query(self, table, request)?;
        Ok(QueryPage {
            lines: page.records.iter().map(|r| r.get().to_string()).collect(),
            expired: page.expired.iter().map(crate::ops::query::ExpiredRange::describe).collect(),
            next_cursor: page.next_cursor,
        })
    }

    fn archive_once(&self) -> anyhow::Result<(serde_json::Value, bool)> {
        let report = self.archive()?;
        let clean = report["deferred"].as_u64() == Some(0) && report["errors"].as_array().is_some_and(|e| e.is_empty());
        Ok((report, clean))
    }

    fn end_backfill(&self, table: &str) -> anyhow::Result<()> {
        Ok(Client::end_backfill(self, table)?)
    }

    fn columns(&self, table: &str) -> anyhow::Result<Option<Vec<crate::model::columns::ColumnSpec>>> {
        match Client::columns(self, table) {
            Ok(columns) => Ok(Some(columns)),
            // An engine from before the route answers 404 naming no route; it still checks
            // every batch it is sent.
            Err(ClientError::Refused { status: 404, ref message, .. }) if message.contains("no such route") => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn place_hold(&self, request: HoldRequest) -> anyhow::Result<HoldPlaced> {
        Ok(Client::place_hold(self, &request)?)
    }

    fn lift_hold(&self, id: String, by: String) -> anyhow::Result<String> {
        Ok(Client::lift_hold(self, &id, &by)?)
    }

    fn holds(&self) -> anyhow::Result<Vec<HoldListing>> {
        Ok(Client::holds(self)?)
    }

    fn place_erasure(&self, request: EraseRequest) -> anyhow::Result<ErasurePlaced> {
        Ok(Client::place_erasure(self, &request)?)
    }

    fn erasures(&self, id: Option<String>) -> anyhow::Result<Vec<ErasureRequest>> {
        Ok(Client::erasures(self, id.as_deref())?)
    }

    fn verify(&self, table: Option<String>, sample: Option<usize>) -> anyhow::Result<Vec<BucketVerdict>> {
        Ok(Client::verify(self, table.as_deref(), sample)?.verdicts)
    }
}

fn is_already_open(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<crate::Error>(), Some(crate::Error::AlreadyOpen { .. }))
}

/// Opens the data directory; when another process holds it and has published an API
/// address, connects to that instead.
pub fn open(args: &EngineArgs) -> anyhow::Result<Box<dyn EngineHandle>> {
    match args.open() {
        Ok(engine) => Ok(Box::new(engine)),
        Err(e) if is_already_open(&e) => match crate::ops::wire::read_addr_file(&args.data)? {
            Some(addr) => {
                tracing::debug!(%addr, "the data directory is held by a running engine; using its API");
                Ok(Box::new(Client::for_running_engine(&args.data, addr)?))
            }
            None => Err(e.context(format!(
                "the process holding it publishes no API address ({}); if it is `frostline run`, wait until it \
                 has started",
                args.data.join(crate::ops::wire::ADDR_FILE).display()
            ))),
        },
        Err(e) => Err(e),
    }
}

/// Prints the running engine's status; when its API cannot be reached, the status file it
/// last wrote.
pub fn status(client: &Client, args: &EngineArgs, json: bool) -> anyhow::Result<()> {
    match client.status() {
        Ok(status) => {
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                super::status::print(&status);
            }
            Ok(())
        }
        Err(e @ crate::cli::client::ClientError::Unreachable { .. }) => {
            let path = crate::ops::local::status_file(&args.data);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("{e}; and its status file {} is unreadable", path.display()))?;
            eprintln!("{e}; showing the status file it last wrote");
            println!("{text}");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

//! Backfill leases: `frostline ingest` into a running engine holds one on its table with every
//! batch, and while one is live no pass archives, re-archives or expires that table's buckets,
//! so a backfill that reaches archived buckets (late records) and history still hot gives each
//! bucket one generation, not one per batch. The ingest ends its lease when it finishes; one
//! that dies leaves it to lapse `BACKFILL_LEASE_SECONDS` after its last batch.

use std::collections::HashSet;

use redb::ReadableTable;

use crate::error::Result;
use crate::model::Micros;

use super::Store;
use super::schema::META;

/// How long a backfill batch keeps its table's archival paused.
pub const BACKFILL_LEASE_SECONDS: u64 = 120;
const PREFIX: &str = "backfill_lease:";

impl Store {
    /// Pauses archival of `table` until `until` (or later, if a lease runs longer already).
    pub fn hold_backfill(&self, table: &str, until: Micros) -> Result<()> {
        let key = format!("{PREFIX}{table}");
        self.write(move |txn| {
            let mut meta = txn.open_table(META)?;
            let current = meta.get(key.as_str())?.and_then(|v| v.value().try_into().ok().map(i64::from_be_bytes));
            if current.is_none_or(|c| c < until) {
                meta.insert(key.as_str(), until.to_be_bytes().as_slice())?;
            }
            Ok(())
        })
    }

    /// Ends `table`'s backfill lease (the ingest finished): its archival resumes at once.
    pub fn end_backfill(&self, table: &str) -> Result<()> {
        let key = format!("{PREFIX}{table}");
        self.write(move |txn| {
            txn.open_table(META)?.remove(key.as_str())?;
            Ok(())
        })
    }

    /// The tables a live backfill lease pauses at `now`.
    pub fn backfilling_tables(&self, now: Micros) -> Result<HashSet<String>> {
        let txn = self.read()?;
        let meta = txn.open_table(META)?;
        let mut out = HashSet::new();
        for entry in meta.range(PREFIX..)? {
            let (key, value) = entry?;
            let Some(table) = key.value().strip_prefix(PREFIX) else { break };
            let until = value.value().try_into().ok().map(i64::from_be_bytes).unwrap_or(Micros::MIN);
            if until > now {
                out.insert(table.to_string());
            }
        }
        Ok(out)
    }
}

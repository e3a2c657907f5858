//! Compaction of the hot store's file. redb never gives the pages it freed back to the file
//! system, so the file keeps its high-water mark after archival has deleted the hot rows; and a
//! freed page keeps what it held until a later write reuses it, erased records among them.
//! Compaction moves the live pages to the front of the file and truncates the rest.
//!
//! Two ways: `compact` on a file no process holds (`frostline compact`, the engine stopped),
//! and `Store::compact_in_place` in a running engine, which the pass loop calls when
//! `Store::space` finds enough of the file free (`ops::maintenance`). In place, the
//! compaction needs the database to itself: writes wait for it (their writer is stopped and
//! restarted after), reads that start meanwhile wait too, and the reads already under way are
//! waited for up to `COMPACT_READ_WAIT`; one that stays open longer makes it give up and try
//! again later, changing nothing. redb compacts in durable two-phase commits, so a kill in the middle leaves a file
//! that opens as after any crash.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

use super::{Store, start_writer};

/// How long a compaction in place waits for the reads already under way to end (new ones
/// wait for it): longer than a query page takes, far shorter than a pass.
pub const COMPACT_READ_WAIT: Duration = Duration::from_secs(2);

/// What compacting the hot store's file did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    pub file: String,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// How long writes and new reads waited for it (in place; 0 for a stopped engine's file).
    #[serde(default)]
    pub held_ms: u64,
}

/// The hot store's file and the part of it that holds no live page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreSpace {
    pub file_bytes: u64,
    /// Bytes of free pages: what a compaction would give back, about.
    pub free_bytes: u64,
    /// When it was measured (microseconds since the epoch, the engine's clock).
    pub measured_at: crate::model::Micros,
    /// Bytes of the pages of every table but the buckets' hot rows: what the store remembers
    /// of its buckets (their rows of metadata, indexes, manifests, tombstones) and its queues.
    #[serde(default)]
    pub metadata_bytes: u64,
    /// The buckets the store records, in every state (the status tallies), so that
    /// `metadata_bytes` can be read per bucket.
    #[serde(default)]
    pub buckets: u64,
}

impl StoreSpace {
    /// Metadata bytes per recorded bucket (`None` in a store that records none).
    pub fn metadata_bytes_per_bucket(&self) -> Option<u64> {
        self.metadata_bytes.checked_div(self.buckets)
    }
}

/// What `Store::compact_in_place` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum InPlace {
    Compacted(Compaction),
    /// Nothing was changed, and why (a read in progress, a store that refuses writes).
    Skipped {
        reason: String,
    },
}

/// Compacts the database file at `path` until redb finds nothing more to move. A missing file
/// is refused (nothing is created), as is a file another process holds (a running engine).
pub fn compact(path: &Path) -> Result<Compaction> {
    let size = |path: &Path| std::fs::metadata(path).map(|m| m.len());
    let bytes_before = size(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound(format!(
            "no hot store at {}: check --data (FROSTLINE_DATA) names the engine's data directory",
            path.display()
        )),
        _ => Error::io(path, e),
    })?;
    let cache_bytes = crate::settings::STORE_CACHE_MIB_DEFAULT as usize * 1024 * 1024;
    let mut db = super::open_database(path, cache_bytes)?;
    while db.compact().map_err(|e| Error::database(format!("compacting {}", path.display()), e))? {}
    drop(db);
    let bytes_after = size(path).map_err(|e| Error::io(path, e))?;
    tracing::info!(file = %path.display(), bytes_before, bytes_after, "hot store compacted");
    Ok(Compaction { file: path.display().to_string(), bytes_before, bytes_after, held_ms: 0 })
}

/// Compacts `db` once no read transaction is open, waiting for those under way until
/// `deadline` (no new one can start: the caller holds the handle).
fn compact_when_reads_end(
    db: &mut redb::Database,
    deadline: Instant,
) -> std::result::Result<bool, redb::CompactionError> {
    loop {
        match db.compact() {
            Err(redb::CompactionError::TransactionInProgress) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2));
            }
            done => return done,
        }
    }
}

fn file_bytes(path: &Path) -> Result<u64> {
    std::fs::metadata(path).map(|m| m.len()).map_err(|e| Error::io(path, e))
}

impl Store {
    /// Measures the file, its free pages and its metadata. redb counts them by walking every
    /// table's tree, so this reads every live page once, and the metadata's pages twice (from
    /// the cache where it can): call it seldom.
    pub fn space(&self, now: crate::model::Micros) -> Result<StoreSpace> {
        // A durable commit: one without an fsync would count as a read of the last durable
        // commit until the next one (and hold a compaction off).
        let (allocated_pages, page_size) = self.write(|txn| {
            let stats = txn.stats()?;
            Ok((stats.allocated_pages(), stats.page_size() as u64))
        })?;
        let (metadata_bytes, buckets) = self.metadata_bytes(page_size)?;
        let file_bytes = file_bytes(self.path())?;
        let space = StoreSpace {
            file_bytes,
            free_bytes: file_bytes.saturating_sub(allocated_pages * page_size),
            measured_at: now,
            metadata_bytes,
            buckets,
        };
        *self.inner.space.lock().expect("store space") = Some(space);
        Ok(space)
    }

    /// The bytes of the pages of every table but the buckets' rows tables, and the buckets
    /// recorded, read from one snapshot.
    fn metadata_bytes(&self, page_size: u64) -> Result<(u64, u64)> {
        use redb::{ReadableTable, ReadableTableMetadata, TableHandle};
        let txn = self.read()?;
        let mut bytes = 0;
        for table in txn.list_tables()? {
            if table.name().starts_with(super::keys::ROWS_TABLE_PREFIX) {
                continue;
            }
            let stats = txn.open_untyped_table(table)?.stats()?;
            bytes += (stats.leaf_pages() + stats.branch_pages()) * page_size;
        }
        let mut buckets = 0;
        for entry in txn.open_table(super::schema::STATE_TALLIES)?.iter()? {
            buckets += entry?.1.value().0;
        }
        Ok((bytes, buckets))
    }

    /// Compactions in place in this process, and the last one.
    pub fn compactions(&self) -> (u64, Option<Compaction>) {
        self.inner.compactions.lock().expect("compactions").clone()
    }

    /// What the last `space` found, if it ran in this process.
    pub fn last_space(&self) -> Option<StoreSpace> {
        *self.inner.space.lock().expect("store space")
    }

    /// Compacts the file of this open store (module documentation): writes and new reads wait
    /// for it; a read transaction that stays open `COMPACT_READ_WAIT` makes it give up,
    /// changing nothing.
    pub fn compact_in_place(&self) -> Result<InPlace> {
        let _maintenance = self.inner.maintenance.lock().expect("store maintenance");
        let started = Instant::now();
        // A commit without an fsync (`Store::write_undoable`) counts as a read of the last
        // durable one until a durable commit follows: make one, or no compaction could start.
        self.write(|_| Ok(()))?;
        let bytes_before = file_bytes(self.path())?;
        // Writes wait from here: `send` needs this slot, which gets a new writer at the end.
        let mut sender = self.inner.sender.lock().expect("sender");
        if let Some(reason) = self.poisoned() {
            return Ok(InPlace::Skipped { reason: format!("the store refuses writes: {reason}") });
        }
        if sender.take().is_none() {
            return Ok(InPlace::Skipped { reason: "the store has no writer (it is being reopened)".into() });
        }
        // The writer commits what it was sent, then ends with its channel.
        if let Some(writer) = self.inner.writer.lock().expect("writer").take() {
            let _ = writer.join();
        }
        // Reads that start from here wait for the handle.
        let mut slot = self.inner.db.write().expect("database handle");
        let mut shared = slot.take().expect("an open store has its database");
        let deadline = Instant::now() + COMPACT_READ_WAIT;
        let mut owned = loop {
            match Arc::try_unwrap(shared) {
                Ok(db) => break Ok(db),
                Err(back) if Instant::now() < deadline => {
                    shared = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(back) => break Err(back),
            }
        };
        let outcome = match owned.as_mut() {
            Err(_) => Ok(InPlace::Skipped { reason: "a read held the database handle".into() }),
            Ok(db) => match compact_when_reads_end(db, deadline) {
                Ok(_) => Ok(InPlace::Compacted(Compaction {
                    file: self.path().display().to_string(),
                    bytes_before,
                    bytes_after: file_bytes(self.path())?,
                    held_ms: started.elapsed().as_millis() as u64,
                })),
                Err(redb::CompactionError::TransactionInProgress) => Ok(InPlace::Skipped {
                    reason: format!("a read transaction stayed open for {} s", COMPACT_READ_WAIT.as_secs()),
                }),
                Err(e) => {
                    // The file is as a crash would leave it; reopening it repairs it.
                    let reason = format!("compacting {} failed: {e}", self.path().display());
                    self.inner.poisoned.set(reason.clone());
                    Err(Error::StorePoisoned(reason))
                }
            },
        };
        let db = owned.map_or_else(|shared| shared, Arc::new);
        *slot = Some(db.clone());
        drop(slot);
        if outcome.is_err() {
            // The recovery thread reopens the file once this maintenance ends.
            drop(sender);
            self.start_recovery();
            return outcome;
        }
        let (new_sender, writer) = match start_writer(db, self.inner.poisoned.clone()) {
            Ok(started) => started,
            Err(e) => {
                // Without a writer every write would fail for good: refuse them with the cause
                // and let the recovery thread reopen the store.
                self.inner.poisoned.set(format!("no writer after compacting {}: {e}", self.path().display()));
                drop(sender);
                self.start_recovery();
                return Err(e);
            }
        };
        *self.inner.writer.lock().expect("writer") = Some(writer);
        *sender = Some(new_sender);
        if let Ok(InPlace::Compacted(c)) = &outcome {
            let mut compactions = self.inner.compactions.lock().expect("compactions");
            *compactions = (compactions.0 + 1, Some(c.clone()));
            tracing::info!(
                file = %c.file, bytes_before = c.bytes_before, bytes_after = c.bytes_after, held_ms = c.held_ms,
                "hot store compacted in place"
            );
        }
        outcome
    }
}

//! Recovery from a failed commit (a full disk, an I/O error): the store refuses every write
//! from the failed commit on, visibly (`Error::StorePoisoned`, HTTP 503 with the cause and the
//! database's path), and reopens itself once the filesystem takes writes again.
//!
//! A failed commit acknowledged nothing (an append is acknowledged after its commit), and
//! redb refuses every later transaction of that instance, reads included. So the first write
//! refused for that reason starts one recovery thread, which probes the data directory's
//! filesystem (a file of `RECOVERY_PROBE_BYTES` written, synced and removed) after waits
//! doubling from 1 s to `RECOVERY_WAIT_MS_MAX`. Once a probe succeeds it stops the writer
//! thread, drops the database (readers then answer "being reopened" until it is back), waits
//! for read transactions in flight to end, opens the file again (redb repairs it on open to
//! the last durable commit, as after a crash: what undoable commits held since is undone,
//! which the protocol allows, ARCHITECTURE.md) and starts a new writer. The process never
//! has to be restarted by hand.

use std::time::{Duration, Instant};

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};

use super::{Store, init_schema, open_database, start_writer};

/// Bytes written (and synced) to prove that the data directory's filesystem takes writes
/// again; a reopen needs room for redb's repair and the next commits.
pub const RECOVERY_PROBE_BYTES: usize = 1024 * 1024;
/// The longest wait between two probes.
pub const RECOVERY_WAIT_MS_MAX: u64 = 30_000;
const RECOVERY_WAIT_MS_MIN: u64 = 1_000;
/// How long a reopen waits for read transactions in flight, which keep the file open.
const REOPEN_WAIT_FOR_READERS: Duration = Duration::from_secs(30);
/// Name of the probe file in the data directory.
const PROBE_FILE: &str = ".frostline-space-probe";

impl Store {
    /// Passes `outcome` through; a refusal because the store is poisoned starts the recovery.
    pub(super) fn recover_if_poisoned<T>(&self, outcome: Result<T>) -> Result<T> {
        if matches!(outcome, Err(Error::StorePoisoned(_))) {
            self.start_recovery();
        }
        outcome
    }

    pub(super) fn start_recovery(&self) {
        let mut slot = self.inner.recovery.lock().expect("recovery thread");
        if slot.as_ref().is_some_and(|running| !running.is_finished()) {
            return;
        }
        let store = Arc::downgrade(&self.inner);
        let spawned = std::thread::Builder::new().name("frostline-store-recovery".into()).spawn(move || {
            let mut wait = RECOVERY_WAIT_MS_MIN;
            loop {
                std::thread::sleep(Duration::from_millis(wait));
                wait = (wait * 2).min(RECOVERY_WAIT_MS_MAX);
                let Some(inner) = store.upgrade() else { return };
                let store = Store { inner };
                let Some(reason) = store.poisoned() else { return };
                let dir = store.path().parent().unwrap_or(store.path()).to_path_buf();
                if let Err(e) = probe_space(&dir) {
                    tracing::warn!(path = %dir.display(), error = %e, %reason, retry_in_ms = wait,
                        "the hot store still refuses writes: its filesystem does not take a write yet");
                    continue;
                }
                match store.reopen() {
                    Ok(()) => {
                        tracing::info!(path = %store.path().display(), %reason, "the hot store was reopened after a failed commit");
                        return;
                    }
                    Err(e) => tracing::warn!(path = %store.path().display(), error = %e, retry_in_ms = wait,
                        "reopening the hot store failed; trying again"),
                }
            }
        });
        match spawned {
            Ok(handle) => *slot = Some(handle),
            Err(e) => tracing::error!(error = %e, "cannot start the hot store's recovery thread"),
        }
    }

    /// Closes the poisoned database and opens it again, with a new writer.
    fn reopen(&self) -> Result<()> {
        let _maintenance = self.inner.maintenance.lock().expect("store maintenance");
        // Readers see "being reopened" from here; writes stay refused until the end.
        let old = self.inner.db.write().expect("database handle").take();
        self.inner.sender.lock().expect("sender").take();
        if let Some(writer) = self.inner.writer.lock().expect("writer").take() {
            let _ = writer.join();
        }
        drop(old);
        // A read transaction in flight keeps the old file open (and locked) until it ends.
        let started = Instant::now();
        let db = loop {
            match open_database(&self.inner.path, self.inner.cache_bytes) {
                Ok(db) => break db,
                Err(Error::AlreadyOpen { .. }) if started.elapsed() < REOPEN_WAIT_FOR_READERS => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e),
            }
        };
        init_schema(&db)?;
        let db = Arc::new(db);
        let (sender, writer) = start_writer(db.clone(), self.inner.poisoned.clone())?;
        *self.inner.writer.lock().expect("writer") = Some(writer);
        *self.inner.sender.lock().expect("sender") = Some(sender);
        *self.inner.db.write().expect("database handle") = Some(db);
        self.inner.poisoned.clear();
        Ok(())
    }
}

/// Writes, syncs and removes a probe file of `RECOVERY_PROBE_BYTES` in `dir`.
fn probe_space(dir: &Path) -> Result<()> {
    use std::io::Write as _;
    let path = dir.join(PROBE_FILE);
    let written = (|| {
        let mut file = std::fs::File::create(&path)?;
        file.write_all(&vec![0u8; RECOVERY_PROBE_BYTES])?;
        file.sync_all()
    })();
    let removed = std::fs::remove_file(&path);
    written.map_err(|e| Error::io(&path, e))?;
    removed.map_err(|e| Error::io(&path, e))
}

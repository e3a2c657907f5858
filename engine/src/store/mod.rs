//! The embedded hot store on redb: records, bucket metadata, the due index, manifests, upload
//! intents and the outbox, with every protocol transition as one fenced transaction.
//!
//! redb allows one writer at a time, so every write goes through one writer thread fed by a
//! channel. Appends that arrive together are committed in one transaction (group commit) and
//! each is acknowledged only after that commit returns. A failed commit poisons the store: it
//! refuses every later write, visibly, until the process reopens it. Reads use their own read
//! transactions and never wait for the writer.
//!
//! One file per concern: `writer` (the writer thread and group commit), `append` (an atomic
//! batch's checks and writes), `reads` (read transactions and `Snapshot`), `protocol` (the
//! fenced transitions of archival and expiry), `holds`, `outbox`; this file opens the store and
//! keeps the helpers every transaction shares (a bucket's metadata loaded, saved and
//! rescheduled through the lifecycle model, leases, table state). `schema` holds the tables
//! and their values, `encoding` the order-preserving keys, `upgrade` the move from an older
//! schema.
//!
//! Imports the core (`model`, `error`) and `format`'s manifest type; knows nothing of plugins,
//! object storage or the API.

mod adopt;
mod append;
pub mod backfill;
pub mod compact;
pub mod encoding;
pub mod erasure;
mod expiry;
pub mod fleet_key;
mod holds;
mod keys;
mod outbox;
mod ownership;
mod protocol;
mod publications;
mod reads;
mod recovery;
pub mod schema;
mod scratch;
pub mod tally;
mod upgrade;
mod writer;

pub use self::adopt::{Adoption, ArchiveFacts, HotRowsHeld, VerifiedArchive};
pub use self::append::{AppendBatch, AppendOutcome, PreparedRow};
pub use self::expiry::TOMBSTONE_PURGE_RETRY_US;
use self::holds::all_holds;
pub use self::holds::{HoldPlacement, PolicyHoldSync};
pub use self::ownership::BucketReferences;
pub use self::protocol::{CleanupSlice, PlanOutcome, Publication};
pub use self::publications::{BucketManifests, CatalogCursor};
pub use self::reads::{BucketChunk, DueWork, RangeOrder, Snapshot};
pub use self::recovery::{RECOVERY_PROBE_BYTES, RECOVERY_WAIT_MS_MAX};
use self::schema::{
    BUCKETS, BUCKETS_BY_END, BUCKETS_BY_TIME, BucketId, BucketMeta, DELIVERIES, DUE, EPOCHS, ERASURES, HOLDS, INTENTS,
    MANIFESTS, META, META_INSTALLATION_ID, META_PUBLICATION_CHANGES_SEQ, META_SCHEMA_VERSION, OUTBOX, PLAN_QUEUE,
    PUBLICATION_CHANGES, PlanClass, RELEASED, SCHEMA_VERSION, TABLES, TOMBSTONES, TableState, Tombstone,
    UNRECEIPTED_ERASURES, by_end_key, by_time_key, decode_value, due_key, encode_value, plan_queue_key,
};
pub use self::scratch::{AdoptionScratch, KnownKey, ListedManifest};
pub use self::writer::GROUP_COMMIT_REQUESTS_MAX;
use self::writer::{Poison, TxnFn, WriteRequest, writer_loop};

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableDatabase, ReadableTable, WriteTransaction};

use crate::error::{Error, Result};
use crate::model::invariants;
use crate::model::lifecycle::{self, BucketView, Lease, Step};
use crate::model::{BucketState, Micros};

struct StoreInner {
    /// `None` while the store is being reopened after a failed commit (`recovery`).
    db: std::sync::RwLock<Option<Arc<Database>>>,
    path: PathBuf,
    cache_bytes: usize,
    sender: Mutex<Option<mpsc::Sender<WriteRequest>>>,
    poisoned: Arc<Poison>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The thread that waits for space and reopens the store after a failed commit.
    recovery: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Held by whatever replaces the writer and the database handle (a reopen, a compaction in
    /// place), so that two of them never interleave.
    maintenance: Mutex<()>,
    /// What the last measure of the file's free pages found (`Store::space`).
    space: Mutex<Option<compact::StoreSpace>>,
    /// Compactions in place in this process, and the last one.
    compactions: Mutex<(u64, Option<compact::Compaction>)>,
}

impl Drop for StoreInner {
    fn drop(&mut self) {
        self.sender.lock().expect("sender").take();
        if let Some(handle) = self.writer.lock().expect("writer").take() {
            let _ = handle.join();
        }
    }
}

/// The hot store. Cheap to clone; all clones share one database and one writer.
#[derive(Clone)]
pub struct Store {
    inner: Arc<StoreInner>,
}

/// Opens (or creates) the database file, refusing one another process holds.
fn open_database(path: &Path, cache_bytes: usize) -> Result<Database> {
    redb::Builder::new().set_cache_size(cache_bytes).create(path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => {
            Error::AlreadyOpen { path: path.parent().unwrap_or(path).to_path_buf() }
        }
        other => Error::database(format!("opening {}", path.display()), other),
    })
}

/// Starts the writer thread of `db`.
fn start_writer(
    db: Arc<Database>,
    poisoned: Arc<Poison>,
) -> Result<(mpsc::Sender<WriteRequest>, std::thread::JoinHandle<()>)> {
    let (sender, receiver) = mpsc::channel();
    let writer = std::thread::Builder::new()
        .name("frostline-writer".into())
        .spawn(move || writer_loop(&db, receiver, &poisoned))
        .map_err(|e| Error::Internal(format!("cannot start the writer thread: {e}")))?;
    Ok((sender, writer))
}

impl Store {
    /// Opens (or creates) the database at `path`. A database held by another process is
    /// refused with a message that says so.
    pub fn open(path: &Path) -> Result<Store> {
        let default_mib = crate::settings::STORE_CACHE_MIB_DEFAULT as usize;
        Self::open_with_cache(path, default_mib * 1024 * 1024)
    }

    /// `open` with a page cache of `cache_bytes` (redb's own default is 1 GiB).
    pub fn open_with_cache(path: &Path, cache_bytes: usize) -> Result<Store> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        let db = Arc::new(open_database(path, cache_bytes)?);
        init_schema(&db)?;
        let poisoned = Arc::new(Poison::new(path));
        let (sender, writer) = start_writer(db.clone(), poisoned.clone())?;
        Ok(Store {
            inner: Arc::new(StoreInner {
                db: std::sync::RwLock::new(Some(db)),
                path: path.to_path_buf(),
                cache_bytes,
                sender: Mutex::new(Some(sender)),
                poisoned,
                writer: Mutex::new(Some(writer)),
                recovery: Mutex::new(None),
                maintenance: Mutex::new(()),
                space: Mutex::new(None),
                compactions: Mutex::new((0, None)),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// `Some(reason)` once a commit has failed; the store then refuses writes.
    pub fn poisoned(&self) -> Option<String> {
        self.inner.poisoned.reason()
    }

    fn send(&self, request: WriteRequest) -> Result<()> {
        let guard = self.inner.sender.lock().expect("sender");
        let Some(sender) = guard.as_ref() else {
            // Between a failed commit and the reopen, the writer is gone; say why.
            return Err(match self.poisoned() {
                Some(reason) => Error::StorePoisoned(reason),
                None => Error::Internal("the store is closed".into()),
            });
        };
        sender.send(request).map_err(|_| Error::Internal("the writer thread has stopped".into()))
    }

    /// Runs `f` in its own write transaction on the writer thread and commits it durably.
    pub fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&WriteTransaction) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.write_with(f, true)
    }

    /// Runs `f` in its own write transaction and commits it without waiting for the disk: the
    /// commit is visible at once and becomes durable with the next durable commit (an append,
    /// an upload intent, a publication), and a crash before that undoes it. Only for steps
    /// whose undoing loses nothing and that are followed by a durable commit before anything
    /// depends on them outside this process: a claim (no object is uploaded before the
    /// durable upload intent), a cleanup slice (the rows come back, the published manifest
    /// still holds them, and the next worker deletes them again).
    pub fn write_undoable<T: Send + 'static>(
        &self,
        f: impl FnOnce(&WriteTransaction) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.write_with(f, false)
    }

    fn write_with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&WriteTransaction) -> Result<T> + Send + 'static,
        durable: bool,
    ) -> Result<T> {
        let (reply, answer) = mpsc::sync_channel(1);
        let f: TxnFn = Box::new(move |txn| f(txn).map(|v| Box::new(v) as Box<dyn Any + Send>));
        let value = self
            .send(WriteRequest::Txn { f, durable, reply })
            .and_then(|()| answer.recv().map_err(|_| Error::Internal("the writer dropped a transaction".into()))?);
        let value = self.recover_if_poisoned(value)?;
        Ok(*value.downcast::<T>().expect("the writer returns what the closure made"))
    }

    pub fn read(&self) -> Result<redb::ReadTransaction> {
        // redb refuses reads after a failed commit too ("previous I/O error"): say why instead.
        if let Some(reason) = self.poisoned() {
            return Err(Error::StorePoisoned(reason));
        }
        let db = self.inner.db.read().expect("database handle").clone().ok_or_else(|| {
            Error::StorePoisoned(format!(
                "the store is being reopened after a failed commit ({})",
                self.poisoned().unwrap_or_default()
            ))
        })?;
        Ok(db.begin_read()?)
    }

    // ----- reads -----

    // ----- protocol transactions -----
}

fn load_tombstone(txn: &WriteTransaction, id: &BucketId) -> Result<Option<Tombstone>> {
    let t = txn.open_table(TOMBSTONES)?;
    t.get(id.encode().as_slice())?.map(|v| decode_value(v.value())).transpose()
}

fn init_schema(db: &Database) -> Result<()> {
    let txn = db.begin_write()?;
    let stored_version;
    {
        let mut meta = txn.open_table(META)?;
        let stored = meta.get(META_SCHEMA_VERSION)?.map(|v| v.value().to_vec());
        match stored {
            None => {
                meta.insert(META_SCHEMA_VERSION, SCHEMA_VERSION.to_be_bytes().as_slice())?;
                stored_version = SCHEMA_VERSION;
            }
            Some(bytes) => {
                let version = u32::from_be_bytes(
                    bytes.as_slice().try_into().map_err(|_| Error::Corruption("malformed schema version".into()))?,
                );
                if version > SCHEMA_VERSION {
                    return Err(Error::Corruption(format!(
                        "the data directory has schema version {version}, newer than this binary's {SCHEMA_VERSION}; \
                         run a newer frostline"
                    )));
                }
                stored_version = version;
            }
        }
        if meta.get(META_INSTALLATION_ID)?.is_none() {
            // Made once, when the data directory is created (or first opened by a version
            // that knows installation ids); a copy of `hot.redb` carries it along.
            let id = format!("{:016x}", rand::random::<u64>());
            meta.insert(META_INSTALLATION_ID, id.as_bytes())?;
        }
        // Create every table so readers never meet a missing one.
        txn.open_table(TABLES)?;
        txn.open_table(BUCKETS)?;
        txn.open_table(BUCKETS_BY_TIME)?;
        txn.open_table(DUE)?;
        txn.open_table(PLAN_QUEUE)?;
        txn.open_table(BUCKETS_BY_END)?;
        txn.open_table(MANIFESTS)?;
        txn.open_table(INTENTS)?;
        txn.open_table(OUTBOX)?;
        txn.open_table(DELIVERIES)?;
        txn.open_table(HOLDS)?;
        txn.open_table(TOMBSTONES)?;
        txn.open_table(EPOCHS)?;
        txn.open_table(RELEASED)?;
        txn.open_table(ERASURES)?;
        txn.open_table(UNRECEIPTED_ERASURES)?;
        txn.open_table(PUBLICATION_CHANGES)?;
        tally::Tallies::open(&txn)?;
    }
    erasure::index_open_requests(&txn)?;
    txn.commit()?;
    upgrade::upgrade(db, stored_version)
}

fn load_meta(txn: &WriteTransaction, id: &BucketId) -> Result<BucketMeta> {
    let t = txn.open_table(BUCKETS)?;
    let v = t.get(id.encode().as_slice())?.ok_or_else(|| Error::InvalidInput(format!("no bucket {id}")))?;
    decode_value(v.value())
}

/// Saves a bucket's row, and moves its status tallies from what the row it replaces counted
/// as (`tally`), in the same transaction.
fn save_meta(txn: &WriteTransaction, meta: &BucketMeta) -> Result<()> {
    let before = {
        let mut t = txn.open_table(BUCKETS)?;
        let previous = t.insert(meta.id.encode().as_slice(), encode_value(meta)?.as_slice())?;
        previous.map(|v| decode_value::<BucketMeta>(v.value()).map(|b| tally::Tally::of(&b))).transpose()?
    };
    tally::Tallies::open(txn)?.account(&meta.id, before, tally::Tally::of(meta))
}

/// What the lifecycle needs to know of a bucket beyond its own row, read in the caller's
/// transaction: the retention policy in force for its table, its expiry's tombstone and the
/// holds that cover it.
struct LifecycleInputs {
    policy: Option<String>,
    tombstone: Option<Tombstone>,
    covering: Vec<String>,
}

impl LifecycleInputs {
    fn load(txn: &WriteTransaction, meta: &BucketMeta) -> Result<Self> {
        Ok(Self {
            policy: table_policy(txn, &meta.id.table)?,
            tombstone: load_tombstone(txn, &meta.id)?,
            covering: covering_holds(txn, meta)?,
        })
    }

    fn view<'a>(&'a self, meta: &'a BucketMeta, now: Micros) -> BucketView<'a> {
        meta.view(self.policy.as_deref(), !self.covering.is_empty(), self.tombstone.as_ref(), now)
    }
}

/// Records one lifecycle step of the bucket: `lifecycle::apply` decides what it does, and this
/// writes the answer (state, lease, fencing generation, retry time, due-index entry, plan
/// queue). The one place a bucket's lifecycle changes, so no change can skip the state
/// machine's check; a refused step fails the transaction, which then changes nothing. The
/// caller saves the bucket.
fn record_step(txn: &WriteTransaction, meta: &mut BucketMeta, step: Step<'_>, now: Micros) -> Result<()> {
    let inputs = LifecycleInputs::load(txn, meta)?;
    record_step_with(txn, meta, &inputs, step, now)
}

/// `record_step` with the inputs the caller has already read in this transaction.
fn record_step_with(
    txn: &WriteTransaction,
    meta: &mut BucketMeta,
    inputs: &LifecycleInputs,
    step: Step<'_>,
    now: Micros,
) -> Result<()> {
    let transition = lifecycle::apply(&inputs.view(meta, now), step, now)
        .map_err(|why| Error::Internal(format!("bucket {}: {step:?} refused: {why}", meta.id)))?;
    let published_before = meta.has_published_archive();
    if transition.state != meta.state {
        meta.state = transition.state;
        meta.state_since = now;
    }
    match transition.lease {
        Lease::Keep => {}
        Lease::Take { owner, until } => {
            meta.lease_owner = Some(owner.to_string());
            meta.lease_expires_at = until;
        }
        Lease::Extend { until } => meta.lease_expires_at = until,
        Lease::Release => {
            meta.lease_owner = None;
            meta.lease_expires_at = now;
        }
    }
    if transition.fence {
        meta.generation += 1;
    }
    meta.next_retry_at = transition.next_retry_at;
    if meta.state == (BucketState::Archived { hot_deleted: true }) {
        // What parks a cleaned archive's expiry: the holds that cover it now.
        meta.held_by = inputs.covering.clone();
    }
    set_due(txn, meta, transition.due_at)?;
    if transition.needs_plan {
        queue_for_plan(txn, meta)?;
    }
    // A publication or an adoption records a manifest; an expiry begun, finished or called off
    // changes whether the bucket's archive is published.
    if matches!(step, Step::Publish | Step::Adopt) || meta.has_published_archive() != published_before {
        note_publication_change(txn, &meta.id)?;
    }
    Ok(())
}

/// Appends bucket `id` to `PUBLICATION_CHANGES`: `record_step` for a publication, an adoption
/// or an expiry, and the dropping of replaced manifests' copies (`ownership`), which changes
/// the files a Delta sync answers for.
fn note_publication_change(txn: &WriteTransaction, id: &BucketId) -> Result<()> {
    let mut meta = txn.open_table(META)?;
    let seq = meta
        .get(META_PUBLICATION_CHANGES_SEQ)?
        .and_then(|v| v.value().try_into().ok().map(u64::from_be_bytes))
        .unwrap_or(0)
        + 1;
    meta.insert(META_PUBLICATION_CHANGES_SEQ, seq.to_be_bytes().as_slice())?;
    txn.open_table(PUBLICATION_CHANGES)?
        .insert(publication_change_key(&id.table, seq).as_slice(), id.encode().as_slice())?;
    Ok(())
}

/// The key of a `PUBLICATION_CHANGES` entry: the table, then the sequence (in order).
fn publication_change_key(table: &str, seq: u64) -> Vec<u8> {
    let mut out = BucketId::table_prefix(table, None);
    encoding::put_u64(&mut out, seq);
    out
}

/// Moves the bucket's due-index entry to `due_at` (or removes it). Only `record_step` calls it.
fn set_due(txn: &WriteTransaction, meta: &mut BucketMeta, due_at: Option<Micros>) -> Result<()> {
    let mut due = txn.open_table(DUE)?;
    if let Some(old) = meta.due_at {
        due.remove(due_key(old, &meta.id).as_slice())?;
    }
    if let Some(at) = due_at {
        due.insert(due_key(at, &meta.id).as_slice(), ())?;
    }
    meta.due_at = due_at;
    Ok(())
}

fn check_lease(meta: &BucketMeta, owner: &str, generation: u64, now: Micros) -> Result<()> {
    invariants::lease_is_held(
        meta.lease_owner.as_deref(),
        meta.generation,
        meta.lease_expires_at,
        owner,
        generation,
        now,
    )
    .map_err(|detail| Error::LeaseLost { bucket: meta.id.display(), owner: owner.to_string(), generation, detail })
}

fn load_table_state(txn: &WriteTransaction, table: &str) -> Result<Option<TableState>> {
    let t = txn.open_table(TABLES)?;
    t.get(table)?.map(|v| decode_value(v.value())).transpose()
}

fn save_table_state(txn: &WriteTransaction, state: &TableState) -> Result<()> {
    txn.open_table(TABLES)?.insert(state.id.as_str(), encode_value(state)?.as_slice())?;
    Ok(())
}

/// The identity of the retention policy in force for a table, `None` when the table has no
/// definition in the policy directory.
fn table_policy(txn: &WriteTransaction, table: &str) -> Result<Option<String>> {
    Ok(retention_in_force(load_table_state(txn, table)?))
}

/// The retention identity a table's recorded state puts in force: none while the table has
/// no definition.
fn retention_in_force(state: Option<TableState>) -> Option<String> {
    state.filter(|s| s.unmanaged_since.is_none()).and_then(|s| s.retention)
}

fn save_tombstone(txn: &WriteTransaction, tombstone: &Tombstone) -> Result<()> {
    txn.open_table(TOMBSTONES)?.insert(tombstone.bucket.encode().as_slice(), encode_value(tombstone)?.as_slice())?;
    Ok(())
}

/// The ids of every stored hold that covers the bucket, read in the caller's transaction.
fn covering_holds(txn: &WriteTransaction, meta: &BucketMeta) -> Result<Vec<String>> {
    Ok(all_holds(txn)?.into_iter().filter(|h| h.covers(meta)).map(|h| h.id).collect())
}

/// Records a bucket the store has not held before in the indexes every bucket is in (by
/// start within its partition, by end within its table). The caller saves the bucket.
fn index_new_bucket(txn: &WriteTransaction, meta: &BucketMeta) -> Result<()> {
    txn.open_table(BUCKETS_BY_TIME)?.insert(by_time_key(&meta.id, meta.descriptor.start).as_slice(), ())?;
    txn.open_table(BUCKETS_BY_END)?.insert(by_end_key(&meta.id, meta.descriptor.end).as_slice(), ())?;
    Ok(())
}

/// Queues the bucket for a (new) retention plan, in its class by the order of its end
/// (`PLAN_QUEUE`).
fn queue_for_plan(txn: &WriteTransaction, meta: &BucketMeta) -> Result<()> {
    let key = plan_queue_key(PlanClass::of(meta.state), &meta.id, meta.descriptor.end);
    txn.open_table(PLAN_QUEUE)?.insert(key.as_slice(), ())?;
    Ok(())
}

/// Takes the bucket out of the plan queue (nothing when it is not queued). Both classes: the
/// bucket may have been archived since it was queued as hot.
fn dequeue_plan(txn: &WriteTransaction, meta: &BucketMeta) -> Result<()> {
    let mut queue = txn.open_table(PLAN_QUEUE)?;
    for class in PlanClass::ALL {
        queue.remove(plan_queue_key(class, &meta.id, meta.descriptor.end).as_slice())?;
    }
    Ok(())
}

/// Decides the bucket's due entry again under the policy in force (`Step::Reconcile`): queued
/// for a plan when its plan is stale and the plan decides its next step, parked while holds
/// cover it. The caller saves the bucket.
fn reconcile(txn: &WriteTransaction, meta: &mut BucketMeta, now: Micros) -> Result<()> {
    record_step(txn, meta, Step::Reconcile, now)
}

#[cfg(test)]
mod tests {
    use super::append::bucket_for_tests;
    use super::*;
    use crate::model::BucketDescriptor;

    const DAY: Micros = 86_400_000_000;

    /// Saves a bucket of table `t` that ends at day `end_day`, in `state`, and queues it for a
    /// plan, as a policy change does.
    fn queued(store: &Store, key: &str, end_day: i64, state: BucketState) -> BucketId {
        let id = BucketId { table: "t".into(), partition_key: b"site a/p%=\xc3\xa9".to_vec(), bucket_key: key.into() };
        let descriptor = BucketDescriptor { key: key.into(), start: (end_day - 1) * DAY, end: end_day * DAY };
        let mut meta = bucket_for_tests(id.clone(), &descriptor);
        meta.state = state;
        store
            .write(move |txn| {
                index_new_bucket(txn, &meta)?;
                queue_for_plan(txn, &meta)?;
                save_meta(txn, &meta)
            })
            .unwrap();
        id
    }

    #[test]
    fn a_large_archive_does_not_hold_back_the_plans_of_the_hot_buckets_behind_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("hot.redb")).unwrap();
        let archived = BucketState::Archived { hot_deleted: true };
        // After a policy change every bucket waits for a plan: 2,000 archived ones, each older
        // than the 10 hot ones (archival takes the oldest first).
        let old: Vec<BucketId> =
            (0..2_000).map(|n| queued(&store, &format!("old {n:04}"), 100 + n, archived)).collect();
        let hot: Vec<BucketId> =
            (0..10).rev().map(|n| queued(&store, &format!("new {n}"), 5_000 + n, BucketState::Hot)).collect();
        assert_eq!(store.unplanned_count().unwrap(), 2_010);

        // The first batch a pass plans holds every hot bucket, oldest first, beside the oldest
        // archived ones (ordered by end alone, it held 1,000 archived buckets and no hot one).
        let batch = store.unplanned(1_000).unwrap();
        assert_eq!(batch.len(), 1_000);
        let planned_hot: Vec<&BucketId> = batch.iter().filter(|id| id.bucket_key.starts_with("new")).collect();
        assert_eq!(planned_hot, hot.iter().rev().collect::<Vec<_>>());
        let planned_old: Vec<&BucketId> = batch.iter().filter(|id| id.bucket_key.starts_with("old")).collect();
        assert_eq!(planned_old, old[..990].iter().collect::<Vec<_>>());
        // The two classes take turns: neither waits for the other.
        assert!(batch[..20].iter().step_by(2).all(|id| id.bucket_key.starts_with("new")), "{:?}", &batch[..20]);

        // A bucket queued as hot and archived before its plan leaves the queue all the same.
        let first_hot = hot.last().unwrap().clone();
        store
            .write(move |txn| {
                let mut meta = load_meta(txn, &first_hot)?;
                meta.state = archived;
                dequeue_plan(txn, &meta)
            })
            .unwrap();
        assert_eq!(store.unplanned_count().unwrap(), 2_009);
    }
}

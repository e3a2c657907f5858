//! The embedded hot store on redb: records, bucket metadata, the due index, manifests, upload
//! intents and the outbox, with every protocol transition as one fenced transaction.
//!
//! redb allows one writer at a time, so every write goes through one writer thread fed by a
//! channel. Appends that arrive together are committed in one transaction (group commit) and
//! each is acknowledged only after that commit returns. A failed commit poisons the store: it
//! refuses every later write, visibly, until the process reopens it. Reads use their own read
//! transactions and never wait for the writer.
//!
//! Imports the core (`model`, `error`); knows nothing of plugins, object storage or the API.

pub mod encoding;
pub mod schema;

use std::any::Any;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, WriteTransaction};

use self::schema::*;
use crate::error::{Error, Result};
use crate::model::invariants;
use crate::model::lifecycle::{self, HoldEffect, NotClaimable, PlanBasis};
use crate::model::rows::{RowFields, RowSummary, RowSummer};
use crate::model::{BucketDescriptor, BucketState, Micros, Record, RetentionPlan};

/// Appends gathered into one transaction at most.
pub const GROUP_COMMIT_REQUESTS_MAX: usize = 256;

/// A record ready to append: its bucket is already known.
#[derive(Debug, Clone)]
pub struct PreparedRow {
    pub descriptor: BucketDescriptor,
    pub record: Record,
}

/// One atomic append: every row is applied or none is.
#[derive(Debug, Clone)]
pub struct AppendBatch {
    pub table: String,
    /// Fingerprint of the table's strategy, stored on new buckets.
    pub strategy: String,
    pub rows: Vec<PreparedRow>,
    /// For each bucket key in the batch, the start of the bucket `writable_buckets` steps after
    /// it: the bucket is too old to write once the partition has a bucket starting there or
    /// later. Absent when the table sets no limit.
    pub writable_horizons: Option<HashMap<String, Micros>>,
    pub writable_buckets: u32,
    pub now: Micros,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AppendOutcome {
    pub appended: u64,
    /// Records whose identity and body were already stored: accepted without change.
    pub duplicates: u64,
    /// Identical records whose bucket was archived since they were first appended (a re-run
    /// ingest): compared with the archive and accepted without change.
    pub already_archived: u64,
}

type TxnFn = Box<dyn FnOnce(&WriteTransaction) -> Result<Box<dyn Any + Send>> + Send>;

enum WriteRequest {
    Append { batch: AppendBatch, reply: mpsc::SyncSender<Result<AppendOutcome>> },
    Txn { f: TxnFn, reply: mpsc::SyncSender<Result<Box<dyn Any + Send>>> },
}

struct StoreInner {
    db: Arc<Database>,
    path: PathBuf,
    sender: Mutex<Option<mpsc::Sender<WriteRequest>>>,
    poisoned: Arc<Mutex<Option<String>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
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

fn db_err(e: impl std::fmt::Display) -> Error {
    Error::Database(e.to_string())
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
        let db = redb::Builder::new().set_cache_size(cache_bytes).create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => {
                Error::AlreadyOpen { path: path.parent().unwrap_or(path).to_path_buf() }
            }
            other => Error::Database(format!("cannot open {}: {other}", path.display())),
        })?;
        let db = Arc::new(db);
        init_schema(&db)?;
        let (sender, receiver) = mpsc::channel();
        let poisoned = Arc::new(Mutex::new(None));
        let writer = {
            let db = db.clone();
            let poisoned = poisoned.clone();
            std::thread::Builder::new()
                .name("frostline-writer".into())
                .spawn(move || writer_loop(&db, receiver, &poisoned))
                .map_err(|e| Error::Internal(format!("cannot start the writer thread: {e}")))?
        };
        Ok(Store {
            inner: Arc::new(StoreInner {
                db,
                path: path.to_path_buf(),
                sender: Mutex::new(Some(sender)),
                poisoned,
                writer: Mutex::new(Some(writer)),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// `Some(reason)` once a commit has failed; the store then refuses writes.
    pub fn poisoned(&self) -> Option<String> {
        self.inner.poisoned.lock().expect("poison flag").clone()
    }

    fn send(&self, request: WriteRequest) -> Result<()> {
        let guard = self.inner.sender.lock().expect("sender");
        let sender = guard.as_ref().ok_or_else(|| Error::Internal("the store is closed".into()))?;
        sender.send(request).map_err(|_| Error::Internal("the writer thread has stopped".into()))
    }

    /// Appends one batch atomically; returns after the commit that holds it.
    pub fn append(&self, batch: AppendBatch) -> Result<AppendOutcome> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.send(WriteRequest::Append { batch, reply })?;
        answer.recv().map_err(|_| Error::Internal("the writer dropped an append".into()))?
    }

    /// Runs `f` in its own write transaction on the writer thread and commits it.
    pub fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&WriteTransaction) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (reply, answer) = mpsc::sync_channel(1);
        let f: TxnFn = Box::new(move |txn| f(txn).map(|v| Box::new(v) as Box<dyn Any + Send>));
        self.send(WriteRequest::Txn { f, reply })?;
        let value = answer.recv().map_err(|_| Error::Internal("the writer dropped a transaction".into()))??;
        Ok(*value.downcast::<T>().expect("the writer returns what the closure made"))
    }

    pub fn read(&self) -> Result<redb::ReadTransaction> {
        self.inner.db.begin_read().map_err(db_err)
    }

    /// A read transaction to read several things from one instant (a query page, the sweep's
    /// reference set): nothing committed after it began is seen through it.
    pub fn snapshot(&self) -> Result<Snapshot> {
        Ok(Snapshot { txn: Arc::new(self.read()?) })
    }

    /// Every bucket of a table (or of one partition), in key order.
    pub fn buckets(&self, table: &str, partition_key: Option<&[u8]>) -> Result<Vec<BucketMeta>> {
        self.snapshot()?.buckets(table, partition_key)
    }

    /// Calls `visit` with every bucket of every table in key order, one at a time, from one
    /// read transaction: summaries over a million buckets without holding them all.
    pub fn visit_buckets(&self, visit: impl FnMut(BucketMeta) -> Result<()>) -> Result<()> {
        self.snapshot()?.visit_buckets(visit)
    }

    /// The hot rows of a bucket in clustering order, from `after` (exclusive) when given.
    pub fn rows(&self, id: &BucketId, after: Option<(Micros, &[u8])>, limit: usize) -> Result<Vec<Record>> {
        self.snapshot()?.rows(id, after, limit)
    }

    /// The newest recorded (that is, published) manifest of a bucket.
    pub fn latest_manifest(&self, id: &BucketId) -> Result<Option<crate::format::manifest::Manifest>> {
        self.snapshot()?.latest_manifest(id)
    }

    pub fn intents(&self) -> Result<Vec<UploadIntent>> {
        self.snapshot()?.intents()
    }

    pub fn tombstones(&self) -> Result<Vec<Tombstone>> {
        self.snapshot()?.tombstones()
    }

    // ----- reads -----

    pub fn table_state(&self, table: &str) -> Result<Option<TableState>> {
        let txn = self.read()?;
        let t = txn.open_table(TABLES).map_err(db_err)?;
        t.get(table).map_err(db_err)?.map(|v| decode_value(v.value())).transpose()
    }

    /// This data directory's installation id (made at its creation, never changed).
    pub fn installation_id(&self) -> Result<String> {
        let bytes = self
            .meta_value(META_INSTALLATION_ID)?
            .ok_or_else(|| Error::Corruption("the data directory has no installation id".into()))?;
        String::from_utf8(bytes).map_err(|_| Error::Corruption("the installation id is not UTF-8".into()))
    }

    pub fn bucket(&self, id: &BucketId) -> Result<Option<BucketMeta>> {
        let txn = self.read()?;
        let t = txn.open_table(BUCKETS).map_err(db_err)?;
        t.get(id.encode().as_slice()).map_err(db_err)?.map(|v| decode_value(v.value())).transpose()
    }

    /// Every bucket of every table.
    pub fn all_buckets(&self) -> Result<Vec<BucketMeta>> {
        let txn = self.read()?;
        let t = txn.open_table(BUCKETS).map_err(db_err)?;
        let mut out = Vec::new();
        for entry in t.iter().map_err(db_err)? {
            let (_, v) = entry.map_err(db_err)?;
            out.push(decode_value(v.value())?);
        }
        Ok(out)
    }

    /// Buckets whose action is due at or before `now`, soonest first, at most `limit`.
    pub fn due(&self, now: Micros, limit: usize) -> Result<Vec<(Micros, BucketId)>> {
        let txn = self.read()?;
        let t = txn.open_table(DUE).map_err(db_err)?;
        let end = due_key_bound(now);
        let mut out = Vec::new();
        for entry in t.range(..end.as_slice()).map_err(db_err)?.take(limit) {
            let (k, _) = entry.map_err(db_err)?;
            out.push(decode_due_key(k.value())?);
        }
        Ok(out)
    }

    /// The earliest due time in the index, for status (archival lag) and scheduling.
    pub fn earliest_due(&self) -> Result<Option<Micros>> {
        let txn = self.read()?;
        let t = txn.open_table(DUE).map_err(db_err)?;
        let first = t.first().map_err(db_err)?;
        first.map(|(k, _)| decode_due_key(k.value()).map(|(at, _)| at)).transpose()
    }

    pub fn due_count(&self, now: Micros) -> Result<u64> {
        let txn = self.read()?;
        let t = txn.open_table(DUE).map_err(db_err)?;
        let end = due_key_bound(now);
        let mut n = 0;
        for entry in t.range(..end.as_slice()).map_err(db_err)? {
            entry.map_err(db_err)?;
            n += 1;
        }
        Ok(n)
    }

    /// Buckets that have no retention plan yet, at most `limit`.
    pub fn unplanned(&self, limit: usize) -> Result<Vec<BucketId>> {
        let txn = self.read()?;
        let t = txn.open_table(UNPLANNED).map_err(db_err)?;
        let mut out = Vec::new();
        for entry in t.iter().map_err(db_err)?.take(limit) {
            let (k, _) = entry.map_err(db_err)?;
            out.push(BucketId::decode(&mut encoding::Reader::new(k.value()))?);
        }
        Ok(out)
    }

    pub fn manifest(&self, id: &BucketId, generation: u64) -> Result<Option<crate::format::manifest::Manifest>> {
        let txn = self.read()?;
        let t = txn.open_table(MANIFESTS).map_err(db_err)?;
        t.get(generation_key(id, generation).as_slice()).map_err(db_err)?.map(|v| decode_value(v.value())).transpose()
    }

    /// The published buckets of a table with their newest manifest, in key order. Reads the
    /// manifests, not every bucket: its cost follows what is archived, not what is hot.
    pub fn published(&self, table: &str) -> Result<Vec<(BucketMeta, crate::format::manifest::Manifest)>> {
        let txn = self.read()?;
        let manifests = txn.open_table(MANIFESTS).map_err(db_err)?;
        let buckets = txn.open_table(BUCKETS).map_err(db_err)?;
        let prefix = BucketId::table_prefix(table, None);
        let end = encoding::prefix_end(&prefix);
        let mut out: Vec<(BucketMeta, crate::format::manifest::Manifest)> = Vec::new();
        let mut newest: Option<(BucketId, Vec<u8>)> = None;
        // Generations of one bucket are adjacent and ascending: keep the last of each run.
        for entry in manifests.range(prefix.as_slice()..end.as_slice()).map_err(db_err)? {
            let (k, v) = entry.map_err(db_err)?;
            let id = BucketId::decode(&mut encoding::Reader::new(k.value()))?;
            if let Some((previous, bytes)) = newest.take()
                && previous != id
            {
                push_published(&buckets, previous, &bytes, &mut out)?;
            }
            newest = Some((id, v.value().to_vec()));
        }
        if let Some((id, bytes)) = newest {
            push_published(&buckets, id, &bytes, &mut out)?;
        }
        Ok(out)
    }

    pub fn meta_value(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let txn = self.read()?;
        let t = txn.open_table(META).map_err(db_err)?;
        Ok(t.get(name).map_err(db_err)?.map(|v| v.value().to_vec()))
    }

    pub fn set_meta_value(&self, name: &'static str, value: Vec<u8>) -> Result<()> {
        self.write(move |txn| {
            txn.open_table(META).map_err(db_err)?.insert(name, value.as_slice()).map_err(db_err)?;
            Ok(())
        })
    }

    pub fn outbox(&self, limit: usize) -> Result<Vec<OutboxEvent>> {
        let txn = self.read()?;
        let t = txn.open_table(OUTBOX).map_err(db_err)?;
        let mut out = Vec::new();
        for entry in t.iter().map_err(db_err)?.take(limit) {
            let (_, v) = entry.map_err(db_err)?;
            out.push(decode_value(v.value())?);
        }
        Ok(out)
    }

    pub fn outbox_len(&self) -> Result<u64> {
        let txn = self.read()?;
        txn.open_table(OUTBOX).map_err(db_err)?.len().map_err(db_err)
    }

    // ----- protocol transactions -----

    /// Records a table's strategy the first time it is seen; afterwards refuses a different one.
    /// Records the identity of its retention policy (`state.retention`): when it differs from
    /// the one recorded, or when the table returns after being absent from the policy
    /// directory, a reconciliation of every bucket of the table starts (each stale plan is
    /// made again before it acts; each bucket is rescheduled).
    pub fn register_table(&self, state: TableState) -> Result<TableState> {
        self.write(move |txn| {
            let existing = load_table_state(txn, &state.id)?;
            match existing {
                Some(existing) if !existing.strategy.same_as(&state.strategy) => Err(Error::Conflict(format!(
                    "table `{}` was created with strategy {} (config {}), not {} (config {}); a table's strategy \
                     never changes: create a new table id",
                    state.id,
                    existing.strategy.name,
                    existing.strategy.config,
                    state.strategy.name,
                    state.strategy.config
                ))),
                Some(mut existing) => {
                    let mut changed = false;
                    if existing.retention != state.retention || existing.unmanaged_since.is_some() {
                        existing.retention = state.retention.clone();
                        existing.unmanaged_since = None;
                        existing.reconcile_from = Some(Vec::new());
                        existing.reconcile_started_at = state.created_at;
                        changed = true;
                    }
                    if state.declaration.is_some() && existing.declaration != state.declaration {
                        existing.declaration = state.declaration;
                        changed = true;
                    }
                    if changed {
                        save_table_state(txn, &existing)?;
                    }
                    Ok(existing)
                }
                None => {
                    let state = TableState { reconcile_started_at: state.created_at, ..state };
                    save_table_state(txn, &state)?;
                    Ok(state)
                }
            }
        })
    }

    /// Marks every recorded table that is not in `present` as having no definition: its
    /// buckets leave the due index as passes meet them (`claim`) instead of blocking other
    /// tables' work, and wait, planned as they were, until the table returns.
    pub fn mark_unmanaged(&self, present: Vec<String>, now: Micros) -> Result<Vec<String>> {
        self.write(move |txn| {
            let mut states = Vec::new();
            {
                let t = txn.open_table(TABLES).map_err(db_err)?;
                for entry in t.iter().map_err(db_err)? {
                    let state: TableState = decode_value(entry.map_err(db_err)?.1.value())?;
                    if !present.contains(&state.id) && state.unmanaged_since.is_none() {
                        states.push(state);
                    }
                }
            }
            let mut marked = Vec::new();
            for mut state in states {
                state.unmanaged_since = Some(now);
                state.reconcile_from = None;
                save_table_state(txn, &state)?;
                push_outbox(txn, "table_unmanaged", None, now, serde_json::json!({"table": state.id}))?;
                marked.push(state.id);
            }
            Ok(marked)
        })
    }

    /// Every recorded table, in id order.
    pub fn table_states(&self) -> Result<Vec<TableState>> {
        let txn = self.read()?;
        let t = txn.open_table(TABLES).map_err(db_err)?;
        let mut out = Vec::new();
        for entry in t.iter().map_err(db_err)? {
            out.push(decode_value(entry.map_err(db_err)?.1.value())?);
        }
        Ok(out)
    }

    /// Stores the outcome of planning several buckets in one transaction: a plan is stored
    /// with its basis and the bucket rescheduled by the lifecycle model; a refusal (the
    /// policy's reason) is recorded on the bucket, which keeps waiting for a plan. A plan
    /// whose basis no longer matches the bucket (an append changed its facts meanwhile, or the
    /// policy was reloaded) is stored but the bucket stays queued, so it is planned again.
    pub fn set_plans(&self, outcomes: Vec<(BucketId, PlanOutcome)>, now: Micros) -> Result<()> {
        self.write(move |txn| {
            for (id, outcome) in outcomes {
                let mut meta = load_meta(txn, &id)?;
                match outcome {
                    Ok((plan, basis)) => {
                        txn.open_table(UNPLANNED).map_err(db_err)?.remove(id.encode().as_slice()).map_err(db_err)?;
                        meta.plan = Some(plan);
                        meta.plan_basis = Some(basis);
                        meta.last_error = meta.last_error.filter(|e| !e.starts_with("retention plan:"));
                        reconcile(txn, &mut meta, now)?;
                    }
                    Err(error) => meta.last_error = Some(format!("retention plan: {error}")),
                }
                save_meta(txn, &meta)?;
            }
            Ok(())
        })
    }

    /// Takes the next `limit` buckets of the table's running reconciliation (see
    /// `TableState::reconcile_from`), starting a periodic one when `REPLAN_PERIOD_US` has
    /// passed since the last: each is rescheduled by the lifecycle model and queued for a plan
    /// when its plan is stale. Returns how many buckets were visited.
    pub fn reconcile_step(&self, table: String, limit: usize, now: Micros) -> Result<u64> {
        self.write(move |txn| {
            let Some(mut state) = load_table_state(txn, &table)? else { return Ok(0) };
            if state.unmanaged_since.is_some() {
                return Ok(0);
            }
            if state.reconcile_from.is_none() && now - state.reconcile_started_at >= lifecycle::REPLAN_PERIOD_US {
                state.reconcile_from = Some(Vec::new());
                state.reconcile_started_at = now;
            }
            let Some(from) = state.reconcile_from.clone() else { return Ok(0) };
            let prefix = BucketId::table_prefix(&table, None);
            let end = encoding::prefix_end(&prefix);
            let start = if from.is_empty() { prefix.clone() } else { from };
            let mut metas: Vec<BucketMeta> = Vec::new();
            {
                let t = txn.open_table(BUCKETS).map_err(db_err)?;
                for entry in t.range(start.as_slice()..end.as_slice()).map_err(db_err)?.take(limit + 1) {
                    metas.push(decode_value(entry.map_err(db_err)?.1.value())?);
                }
            }
            state.reconcile_from = if metas.len() > limit { metas.pop().map(|m| m.id.encode()) } else { None };
            let visited = metas.len() as u64;
            for mut meta in metas {
                let before = meta.clone();
                reconcile(txn, &mut meta, now)?;
                if meta != before {
                    save_meta(txn, &meta)?;
                }
            }
            save_table_state(txn, &state)?;
            Ok(visited)
        })
    }

    /// Whether the table has a reconciliation running or due (a cheap read, so passes only
    /// write when there is work).
    pub fn reconcile_pending(&self, table: &str, now: Micros) -> Result<bool> {
        Ok(self.table_state(table)?.is_some_and(|s| {
            s.unmanaged_since.is_none()
                && (s.reconcile_from.is_some() || now - s.reconcile_started_at >= lifecycle::REPLAN_PERIOD_US)
        }))
    }

    /// Removes buckets of tables that have no definition from the plan queue (they are
    /// rescheduled by the reconciliation that starts when the table returns).
    pub fn drop_unplannable(&self, ids: Vec<BucketId>) -> Result<()> {
        self.write(move |txn| {
            let mut unplanned = txn.open_table(UNPLANNED).map_err(db_err)?;
            for id in ids {
                unplanned.remove(id.encode().as_slice()).map_err(db_err)?;
            }
            Ok(())
        })
    }

    /// Claims a due bucket for `owner` when the lifecycle model says a step may start: a
    /// hot bucket whose current plan says archive, a retry or a takeover, a pending cleanup,
    /// an expiry the current plan asks for and no hold covers, or an expiry to finish.
    /// Increments the generation (the fencing token). A bucket that may not start anything is
    /// left with the due entry the model gives it: queued for a plan when its plan is stale,
    /// parked (and an event written) when a hold covers it, taken out of the due index while
    /// its table has no definition.
    pub fn claim(&self, id: BucketId, owner: String, now: Micros, lease_us: Micros) -> Result<Option<BucketMeta>> {
        self.write(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            let Some(policy) = table_policy(txn, &id.table)? else {
                // No definition: nothing can be planned, archived or expired until it returns.
                if meta.due_at.is_some() {
                    meta.last_error = Some("the table is not in the policy directory; its buckets wait for it".into());
                    schedule(txn, &mut meta, None)?;
                    save_meta(txn, &meta)?;
                }
                return Ok(None);
            };
            let tombstone = load_tombstone(txn, &id)?;
            let covering = covering_holds(txn, &meta)?;
            let current = meta.plan_is_current(Some(&policy));
            let view = meta.view(current, !covering.is_empty(), tombstone.as_ref());
            match lifecycle::claimable(&view, now) {
                Ok(_) => {}
                Err(NotClaimable::Leased) => return Ok(None),
                Err(NotClaimable::Held) => {
                    park(txn, &mut meta, covering, now)?;
                    save_meta(txn, &meta)?;
                    return Ok(None);
                }
                Err(NotClaimable::NeedsPlan | NotClaimable::NotDue) => {
                    reconcile(txn, &mut meta, now)?;
                    save_meta(txn, &meta)?;
                    return Ok(None);
                }
            }
            if meta.state == BucketState::Hot {
                invariants::transition_is_allowed(meta.state, BucketState::Archiving).map_err(Error::Internal)?;
                meta_touch(&mut meta, now, Some(BucketState::Archiving));
            }
            meta.generation += 1;
            meta.lease_owner = Some(owner);
            meta.lease_expires_at = now + lease_us;
            meta.next_retry_at = None;
            // If this worker dies, the lease expiry is when another one takes over.
            let lease_expires_at = meta.lease_expires_at;
            schedule(txn, &mut meta, Some(lease_expires_at))?;
            save_meta(txn, &meta)?;
            Ok(Some(meta))
        })
    }

    /// Extends a held lease. Fails (and changes nothing) when the lease is no longer held.
    pub fn renew(&self, id: BucketId, owner: String, generation: u64, now: Micros, lease_us: Micros) -> Result<Micros> {
        self.write(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            check_lease(&meta, &owner, generation, now)?;
            meta.lease_expires_at = now + lease_us;
            let lease_expires_at = meta.lease_expires_at;
            schedule(txn, &mut meta, Some(lease_expires_at))?;
            save_meta(txn, &meta)?;
            Ok(meta.lease_expires_at)
        })
    }

    /// Records, before the first upload, which keys this claim is about to write.
    pub fn record_intent(&self, intent: UploadIntent, owner: String, now: Micros) -> Result<()> {
        self.write(move |txn| {
            let meta = load_meta(txn, &intent.bucket)?;
            check_lease(&meta, &owner, intent.generation, now)?;
            let key = generation_key(&intent.bucket, intent.generation);
            txn.open_table(INTENTS)
                .map_err(db_err)?
                .insert(key.as_slice(), encode_value(&intent)?.as_slice())
                .map_err(db_err)?;
            Ok(())
        })
    }

    /// The read cut-over: in one fenced transaction the bucket becomes
    /// `Archived{hot_deleted:false}`, the manifest is recorded and an outbox event written.
    pub fn publish(
        &self,
        id: BucketId,
        owner: String,
        generation: u64,
        now: Micros,
        manifest: crate::format::manifest::Manifest,
        manifest_key: String,
    ) -> Result<BucketMeta> {
        self.write(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            check_lease(&meta, &owner, generation, now)?;
            let next = BucketState::Archived { hot_deleted: false };
            invariants::transition_is_allowed(meta.state, next).map_err(Error::Internal)?;
            txn.open_table(MANIFESTS)
                .map_err(db_err)?
                .insert(generation_key(&id, generation).as_slice(), encode_value(&manifest)?.as_slice())
                .map_err(db_err)?;
            meta_touch(&mut meta, now, Some(next));
            meta.manifest_key = Some(manifest_key.clone());
            meta.archived_at = Some(now);
            meta.attempts = 0;
            meta.last_error = None;
            // Cleanup is due at once, and stays due if this worker dies.
            schedule(txn, &mut meta, Some(now))?;
            save_meta(txn, &meta)?;
            push_outbox(
                txn,
                "bucket_archived",
                Some(&meta),
                now,
                serde_json::json!({"manifest_key": manifest_key, "rows": manifest.summary.rows}),
            )?;
            Ok(meta)
        })
    }

    /// A failure before publication: the bucket stays fenced (`Archiving`), its lease is
    /// released and it is retried at `retry_at`.
    pub fn defer(
        &self,
        id: BucketId,
        owner: String,
        generation: u64,
        now: Micros,
        error: String,
        retry_at: Micros,
    ) -> Result<()> {
        self.write(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            if meta.lease_owner.as_deref() != Some(owner.as_str()) || meta.generation != generation {
                // Someone else owns it now; their outcome decides.
                return Ok(());
            }
            meta.attempts += 1;
            meta.last_error = Some(error.clone());
            meta.lease_owner = None;
            meta.lease_expires_at = now;
            meta.next_retry_at = Some(retry_at);
            schedule(txn, &mut meta, Some(retry_at))?;
            save_meta(txn, &meta)?;
            push_outbox(
                txn,
                "bucket_deferred",
                Some(&meta),
                now,
                serde_json::json!({"error": error, "retry_at": retry_at}),
            )
        })
    }

    /// Deletes the hot rows of a published bucket, in a separately fenced transaction that
    /// first checks the rows against the manifest's count, key range and checksum.
    pub fn cleanup(&self, id: BucketId, owner: String, generation: u64, now: Micros) -> Result<u64> {
        self.write(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            check_lease(&meta, &owner, generation, now)?;
            let next = BucketState::Archived { hot_deleted: true };
            invariants::transition_is_allowed(meta.state, next).map_err(Error::Internal)?;
            let manifest_generation = published_generation(txn, &id)?
                .ok_or_else(|| Error::Internal(format!("bucket {id} is published but has no manifest")))?;
            let manifest: crate::format::manifest::Manifest = {
                let t = txn.open_table(MANIFESTS).map_err(db_err)?;
                let v =
                    t.get(generation_key(&id, manifest_generation).as_slice()).map_err(db_err)?.ok_or_else(|| {
                        Error::Internal(format!("manifest of bucket {id} generation {manifest_generation} is missing"))
                    })?;
                decode_value(v.value())?
            };
            let mut records = txn.open_table(RECORDS).map_err(db_err)?;
            let prefix = id.encode();
            let end = encoding::prefix_end(&prefix);
            // One scan sums the rows and collects their keys; they are deleted only if the sum
            // matches the manifest. (redb 3.1's `retain_in` rewrites pages and measured about
            // four times slower than removing the collected keys.)
            let mut summer = RowSummer::default();
            let mut keys = Vec::with_capacity(meta.row_count as usize);
            for entry in records.range(prefix.as_slice()..end.as_slice()).map_err(db_err)? {
                let (k, v) = entry.map_err(db_err)?;
                let (event_time, sort_key) = decode_record_suffix(bucket_suffix(&id, &prefix, k.value())?)?;
                let row = decode_row_ref(v.value())?;
                summer.push_fields(RowFields {
                    partition_key: &id.partition_key,
                    event_time,
                    sort_key: &sort_key,
                    tenant: row.tenant,
                    kind: row.kind,
                    body: row.body,
                });
                keys.push(k.value().to_vec());
            }
            let hot: RowSummary = summer.finish();
            invariants::hot_rows_match_manifest(&hot, &manifest.summary)
                .map_err(|why| Error::Corruption(format!("refusing to delete the hot rows of {id}: {why}")))?;
            for (i, key) in keys.iter().enumerate() {
                if i == keys.len() / 2 {
                    crate::failpoints::hit("mid_cleanup")?;
                }
                records.remove(key.as_slice()).map_err(db_err)?;
            }
            drop(records);
            meta_touch(&mut meta, now, Some(next));
            meta.hot_deleted_at = Some(now);
            meta.lease_owner = None;
            meta.lease_expires_at = now;
            txn.open_table(INTENTS)
                .map_err(db_err)?
                .retain_in(prefix.as_slice()..end.as_slice(), |_, _| false)
                .map_err(db_err)?;
            // Next: the archive's expiry. Being archived is a fact the policy sees, so the
            // model queues the bucket for a plan made with it before anything is scheduled.
            reconcile(txn, &mut meta, now)?;
            save_meta(txn, &meta)?;
            push_outbox(txn, "hot_rows_deleted", Some(&meta), now, serde_json::json!({"rows": hot.rows}))?;
            Ok(hot.rows)
        })
    }

    /// Starts an archive's expiry under the bucket's fence. Re-checks every hold in the same
    /// transaction: a covered bucket is not expired (it is parked until the hold is lifted,
    /// and `Ok(None)` is returned). Otherwise the tombstone (the keys to delete and the target
    /// they live on) and an outbox event are written durably and the bucket becomes `Expired`
    /// before any object is deleted.
    pub fn begin_expiry(
        &self,
        id: BucketId,
        owner: String,
        generation: u64,
        now: Micros,
        keys: Vec<String>,
        target: ArchiveTarget,
    ) -> Result<Option<Tombstone>> {
        self.write(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            check_lease(&meta, &owner, generation, now)?;
            let covering = covering_holds(txn, &meta)?;
            if lifecycle::expiry_allowed(&covering).is_err() {
                // A legal hold beats every retention rule.
                park(txn, &mut meta, covering, now)?;
                meta.lease_owner = None;
                meta.lease_expires_at = now;
                save_meta(txn, &meta)?;
                return Ok(None);
            }
            invariants::transition_is_allowed(meta.state, BucketState::Expired).map_err(Error::Internal)?;
            let manifest_key = meta
                .manifest_key
                .clone()
                .ok_or_else(|| Error::Internal(format!("archived bucket {id} names no manifest")))?;
            let tombstone = Tombstone {
                bucket: id.clone(),
                bounds: meta.descriptor.clone(),
                manifest_key,
                keys,
                reason: meta.plan.as_ref().map(|p| p.reason.clone()).unwrap_or_else(|| "expire_at reached".into()),
                expired_at: now,
                completed_at: None,
                purge_at: None,
                target,
                deletes_started_at: None,
            };
            save_tombstone(txn, &tombstone)?;
            meta_touch(&mut meta, now, Some(BucketState::Expired));
            let lease_expires_at = meta.lease_expires_at;
            schedule(txn, &mut meta, Some(lease_expires_at))?;
            save_meta(txn, &meta)?;
            push_outbox(
                txn,
                "archive_expiring",
                Some(&meta),
                now,
                serde_json::json!({"manifest_key": tombstone.manifest_key, "reason": tombstone.reason,
                                   "target": tombstone.target.to_string()}),
            )?;
            Ok(Some(tombstone))
        })
    }

    /// The last moment a hold can stop an expiry: just before the first delete call, under the
    /// fence, every hold is checked again. A covered bucket's expiry is called off (the bucket
    /// returns to `Archived` under a new generation, parked) and `false` is returned;
    /// otherwise the tombstone records, durably, that deletions start, and `true` is returned.
    pub fn start_deletes(&self, id: BucketId, owner: String, generation: u64, now: Micros) -> Result<bool> {
        self.write(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            check_lease(&meta, &owner, generation, now)?;
            let mut tombstone = load_tombstone(txn, &id)?
                .ok_or_else(|| Error::Internal(format!("expired bucket {id} has no tombstone")))?;
            if tombstone.deletes_started_at.is_some() {
                return Ok(true);
            }
            let covering = covering_holds(txn, &meta)?;
            if lifecycle::expiry_allowed(&covering).is_err() {
                call_off_expiry(txn, &mut meta, covering, now)?;
                return Ok(false);
            }
            tombstone.deletes_started_at = Some(now);
            save_tombstone(txn, &tombstone)?;
            Ok(true)
        })
    }

    /// Records that every object of an expired archive is proved absent; the tombstone is
    /// kept until `purge_at`.
    pub fn complete_expiry(
        &self,
        id: BucketId,
        owner: String,
        generation: u64,
        now: Micros,
        purge_at: Micros,
    ) -> Result<()> {
        self.write(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            check_lease(&meta, &owner, generation, now)?;
            let mut tombstone = load_tombstone(txn, &id)?
                .ok_or_else(|| Error::Internal(format!("expired bucket {id} has no tombstone")))?;
            tombstone.completed_at = Some(now);
            tombstone.purge_at = Some(purge_at);
            txn.open_table(TOMBSTONES)
                .map_err(db_err)?
                .insert(id.encode().as_slice(), encode_value(&tombstone)?.as_slice())
                .map_err(db_err)?;
            meta.lease_owner = None;
            meta.lease_expires_at = now;
            schedule(txn, &mut meta, Some(purge_at))?;
            save_meta(txn, &meta)?;
            push_outbox(txn, "archive_expired", Some(&meta), now, serde_json::json!({"objects": tombstone.keys.len()}))
        })
    }

    /// Purges a completed tombstone whose replay period is over, when the bucket still says
    /// `Expired` and every sink has the events that tell of the expiry (they are still in the
    /// outbox otherwise, and the purge waits). The bucket's metadata stays, so queries still
    /// say the range expired.
    pub fn purge_tombstone(&self, id: BucketId, now: Micros) -> Result<bool> {
        self.write(move |txn| {
            let Some(tombstone) = load_tombstone(txn, &id)? else { return Ok(false) };
            let mut meta = load_meta(txn, &id)?;
            let pending = expiry_events_pending(txn, &id)?;
            if !lifecycle::tombstone_purgeable(meta.state, tombstone.progress(), pending, now) {
                if pending && tombstone.purge_at.is_some_and(|at| at <= now) {
                    // Ask again once the sinks have had time to take the events.
                    schedule(txn, &mut meta, Some(now + TOMBSTONE_PURGE_RETRY_US))?;
                    save_meta(txn, &meta)?;
                }
                return Ok(false);
            }
            txn.open_table(TOMBSTONES).map_err(db_err)?.remove(id.encode().as_slice()).map_err(db_err)?;
            schedule(txn, &mut meta, None)?;
            save_meta(txn, &meta)?;
            Ok(true)
        })
    }

    pub fn tombstone(&self, id: &BucketId) -> Result<Option<Tombstone>> {
        let txn = self.read()?;
        let t = txn.open_table(TOMBSTONES).map_err(db_err)?;
        t.get(id.encode().as_slice()).map_err(db_err)?.map(|v| decode_value(v.value())).transpose()
    }

    /// Places a hold, and tells what it did to each bucket it covers now: parks its expiry,
    /// calls off an expiry that has written its tombstone but deleted nothing yet, or comes
    /// too late for a bucket whose objects may already be deleted (listed in the answer).
    pub fn place_hold(&self, hold: Hold, now: Micros) -> Result<HoldPlacement> {
        self.write(move |txn| {
            {
                let mut holds = txn.open_table(HOLDS).map_err(db_err)?;
                if holds.get(hold.id.as_str()).map_err(db_err)?.is_some() {
                    return Err(Error::Conflict(format!("a hold with id `{}` already exists", hold.id)));
                }
                holds.insert(hold.id.as_str(), encode_value(&hold)?.as_slice()).map_err(db_err)?;
            }
            let placement = apply_hold(txn, &hold, now)?;
            let mut detail = serde_json::to_value(&hold).unwrap_or_default();
            detail["too_late"] = serde_json::json!(placement.too_late);
            push_outbox(txn, "hold_placed", None, now, detail)?;
            Ok(placement)
        })
    }

    /// Lifts a hold; the buckets it parked are rescheduled by the lifecycle model.
    pub fn lift_hold(&self, id: String, lifted_by: String, now: Micros) -> Result<Hold> {
        self.write(move |txn| {
            let hold: Hold = {
                let mut holds = txn.open_table(HOLDS).map_err(db_err)?;
                let removed = holds.remove(id.as_str()).map_err(db_err)?;
                match removed {
                    Some(v) => decode_value(v.value())?,
                    None => {
                        return Err(Error::InvalidInput(format!(
                            "no hold with id `{id}`; `frostline hold list` shows them"
                        )));
                    }
                }
            };
            release_hold(txn, &hold, now)?;
            let mut detail = serde_json::to_value(&hold).unwrap_or_default();
            detail["lifted_by"] = lifted_by.into();
            push_outbox(txn, "hold_lifted", None, now, detail)?;
            Ok(hold)
        })
    }

    /// Makes the store's policy holds (source `policy:`) exactly `active`, in one transaction:
    /// holds new to the directory are placed (as `place_hold` does), holds gone from it are
    /// released (their buckets rescheduled) with a `hold_released` event each. Every hold
    /// check reads the store, so a policy hold is in force in the same transaction that
    /// decides an expiry.
    pub fn sync_policy_holds(&self, active: Vec<Hold>, now: Micros) -> Result<PolicyHoldSync> {
        self.write(move |txn| {
            let stored: Vec<Hold> = all_holds(txn)?.into_iter().filter(|h| h.source.starts_with("policy:")).collect();
            let mut sync = PolicyHoldSync::default();
            for hold in &stored {
                if active.iter().any(|a| a.id == hold.id) {
                    continue;
                }
                txn.open_table(HOLDS).map_err(db_err)?.remove(hold.id.as_str()).map_err(db_err)?;
                release_hold(txn, hold, now)?;
                push_outbox(txn, "hold_released", None, now, serde_json::to_value(hold).unwrap_or_default())?;
                sync.released.push(hold.id.clone());
            }
            for hold in active {
                if stored.iter().any(|s| s.id == hold.id) {
                    continue;
                }
                let hold = Hold { placed_at: now, ..hold };
                txn.open_table(HOLDS)
                    .map_err(db_err)?
                    .insert(hold.id.as_str(), encode_value(&hold)?.as_slice())
                    .map_err(db_err)?;
                let placement = apply_hold(txn, &hold, now)?;
                let mut detail = serde_json::to_value(&hold).unwrap_or_default();
                detail["too_late"] = serde_json::json!(placement.too_late);
                push_outbox(txn, "hold_placed", None, now, detail)?;
                sync.placed.push(hold.id.clone());
                sync.too_late.extend(placement.too_late);
            }
            Ok(sync)
        })
    }

    pub fn holds(&self) -> Result<Vec<Hold>> {
        let txn = self.read()?;
        let t = txn.open_table(HOLDS).map_err(db_err)?;
        let mut out = Vec::new();
        for entry in t.iter().map_err(db_err)? {
            out.push(decode_value(entry.map_err(db_err)?.1.value())?);
        }
        Ok(out)
    }

    /// Records, for audits, that the orphan sweep deleted an object.
    pub fn note_orphan_deleted(&self, key: String, target: String, now: Micros) -> Result<()> {
        self.write(move |txn| {
            push_outbox(txn, "orphan_deleted", None, now, serde_json::json!({"key": key, "target": target}))
        })
    }

    /// Records that `sink` has delivered event `sequence`.
    pub fn record_delivery(&self, sink: String, sequence: u64, now: Micros) -> Result<()> {
        self.write(move |txn| {
            let key = delivery_key(&sink, sequence);
            txn.open_table(DELIVERIES).map_err(db_err)?.insert(key.as_slice(), now).map_err(db_err)?;
            Ok(())
        })
    }

    pub fn delivered(&self, sink: &str, sequence: u64) -> Result<bool> {
        let txn = self.read()?;
        let t = txn.open_table(DELIVERIES).map_err(db_err)?;
        Ok(t.get(delivery_key(sink, sequence).as_slice()).map_err(db_err)?.is_some())
    }

    /// Removes delivered outbox events and their delivery records.
    pub fn ack_outbox(&self, sequences: Vec<u64>) -> Result<()> {
        self.write(move |txn| {
            let mut t = txn.open_table(OUTBOX).map_err(db_err)?;
            let mut deliveries = txn.open_table(DELIVERIES).map_err(db_err)?;
            for s in sequences {
                t.remove(s.to_be_bytes().as_slice()).map_err(db_err)?;
                let mut stale: Vec<Vec<u8>> = Vec::new();
                for entry in deliveries.iter().map_err(db_err)? {
                    let key = entry.map_err(db_err)?.0.value().to_vec();
                    if key.ends_with(&s.to_be_bytes()) {
                        stale.push(key);
                    }
                }
                for k in stale {
                    deliveries.remove(k.as_slice()).map_err(db_err)?;
                }
            }
            Ok(())
        })
    }
}

fn delivery_key(sink: &str, sequence: u64) -> Vec<u8> {
    let mut out = Vec::new();
    encoding::put_bytes(&mut out, sink.as_bytes());
    encoding::put_u64(&mut out, sequence);
    out
}

fn load_tombstone(txn: &WriteTransaction, id: &BucketId) -> Result<Option<Tombstone>> {
    let t = txn.open_table(TOMBSTONES).map_err(db_err)?;
    t.get(id.encode().as_slice()).map_err(db_err)?.map(|v| decode_value(v.value())).transpose()
}

fn all_holds(txn: &WriteTransaction) -> Result<Vec<Hold>> {
    let t = txn.open_table(HOLDS).map_err(db_err)?;
    let mut out = Vec::new();
    for entry in t.iter().map_err(db_err)? {
        out.push(decode_value(entry.map_err(db_err)?.1.value())?);
    }
    Ok(out)
}

fn table_buckets(txn: &WriteTransaction, table: &str) -> Result<Vec<BucketMeta>> {
    let t = txn.open_table(BUCKETS).map_err(db_err)?;
    let prefix = BucketId::table_prefix(table, None);
    let end = encoding::prefix_end(&prefix);
    let mut out = Vec::new();
    for entry in t.range(prefix.as_slice()..end.as_slice()).map_err(db_err)? {
        out.push(decode_value(entry.map_err(db_err)?.1.value())?);
    }
    Ok(out)
}

fn due_key_bound(now: Micros) -> Vec<u8> {
    // Every due key at `now` starts with the encoded `now`; the bound is just past them.
    let mut bound = Vec::new();
    encoding::put_i64(&mut bound, now);
    encoding::prefix_end(&bound)
}

fn init_schema(db: &Database) -> Result<()> {
    let txn = db.begin_write().map_err(db_err)?;
    {
        let mut meta = txn.open_table(META).map_err(db_err)?;
        let stored = meta.get(META_SCHEMA_VERSION).map_err(db_err)?.map(|v| v.value().to_vec());
        match stored {
            None => {
                meta.insert(META_SCHEMA_VERSION, SCHEMA_VERSION.to_be_bytes().as_slice()).map_err(db_err)?;
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
            }
        }
        if meta.get(META_INSTALLATION_ID).map_err(db_err)?.is_none() {
            // Made once, when the data directory is created (or first opened by a version
            // that knows installation ids); a copy of `hot.redb` carries it along.
            let id = format!("{:016x}", rand::random::<u64>());
            meta.insert(META_INSTALLATION_ID, id.as_bytes()).map_err(db_err)?;
        }
        // Create every table so readers never meet a missing one.
        txn.open_table(TABLES).map_err(db_err)?;
        txn.open_table(RECORDS).map_err(db_err)?;
        txn.open_table(BUCKETS).map_err(db_err)?;
        txn.open_table(BUCKETS_BY_TIME).map_err(db_err)?;
        txn.open_table(DUE).map_err(db_err)?;
        txn.open_table(UNPLANNED).map_err(db_err)?;
        txn.open_table(MANIFESTS).map_err(db_err)?;
        txn.open_table(INTENTS).map_err(db_err)?;
        txn.open_table(OUTBOX).map_err(db_err)?;
        txn.open_table(DELIVERIES).map_err(db_err)?;
        txn.open_table(HOLDS).map_err(db_err)?;
        txn.open_table(TOMBSTONES).map_err(db_err)?;
    }
    txn.commit().map_err(db_err)
}

fn writer_loop(db: &Database, receiver: mpsc::Receiver<WriteRequest>, poisoned: &Mutex<Option<String>>) {
    while let Ok(first) = receiver.recv() {
        let mut group = vec![first];
        while group.len() < GROUP_COMMIT_REQUESTS_MAX {
            match receiver.try_recv() {
                Ok(request) => group.push(request),
                Err(_) => break,
            }
        }
        let mut appends = Vec::new();
        for request in group {
            match request {
                WriteRequest::Append { batch, reply } => appends.push((batch, reply)),
                WriteRequest::Txn { f, reply } => {
                    // Appends that arrived before this transaction commit first, in order.
                    commit_appends(db, std::mem::take(&mut appends), poisoned);
                    let _ = reply.send(run_txn(db, f, poisoned));
                }
            }
        }
        commit_appends(db, appends, poisoned);
    }
}

fn poison_check(poisoned: &Mutex<Option<String>>) -> Result<()> {
    match &*poisoned.lock().expect("poison flag") {
        Some(reason) => Err(Error::StorePoisoned(reason.clone())),
        None => Ok(()),
    }
}

fn commit(txn: WriteTransaction, poisoned: &Mutex<Option<String>>) -> Result<()> {
    txn.commit().map_err(|e| {
        let reason = format!("commit failed: {e}");
        tracing::error!(%reason, "the hot store refuses further writes until it is reopened");
        *poisoned.lock().expect("poison flag") = Some(reason.clone());
        Error::StorePoisoned(reason)
    })
}

fn run_txn(db: &Database, f: TxnFn, poisoned: &Mutex<Option<String>>) -> Result<Box<dyn Any + Send>> {
    poison_check(poisoned)?;
    let txn = db.begin_write().map_err(db_err)?;
    match f(&txn) {
        Ok(value) => {
            commit(txn, poisoned)?;
            Ok(value)
        }
        Err(e) => {
            let _ = txn.abort();
            Err(e)
        }
    }
}

type AppendReply = mpsc::SyncSender<Result<AppendOutcome>>;

fn commit_appends(db: &Database, appends: Vec<(AppendBatch, AppendReply)>, poisoned: &Mutex<Option<String>>) {
    if appends.is_empty() {
        return;
    }
    let fail_all = |appends: Vec<(AppendBatch, AppendReply)>, error: &dyn Fn() -> Error| {
        for (_, reply) in appends {
            let _ = reply.send(Err(error()));
        }
    };
    if let Err(e) = poison_check(poisoned) {
        let message = e.to_string();
        return fail_all(appends, &|| Error::StorePoisoned(message.clone()));
    }
    let txn = match db.begin_write() {
        Ok(txn) => txn,
        Err(e) => {
            let message = e.to_string();
            return fail_all(appends, &|| Error::Database(message.clone()));
        }
    };
    let mut outcomes = Vec::with_capacity(appends.len());
    for (batch, _) in &appends {
        outcomes.push(apply_batch(&txn, batch));
    }
    // A database error while applying (or undoing) a batch leaves the transaction's contents
    // uncertain: nothing of the group is committed, and every append in it is refused.
    if let Some(Err(Error::Database(message))) = outcomes.iter().find(|o| matches!(o, Err(Error::Database(_)))) {
        let message = format!("an append in the same commit failed in the database ({message}); nothing was written");
        let _ = txn.abort();
        return fail_all(appends, &|| Error::Database(message.clone()));
    }
    match commit(txn, poisoned) {
        Ok(()) => {
            for ((_, reply), outcome) in appends.into_iter().zip(outcomes) {
                let _ = reply.send(outcome);
            }
        }
        Err(e) => {
            let message = e.to_string();
            fail_all(appends, &|| Error::StorePoisoned(message.clone()));
        }
    }
}

/// Validates a whole batch against the transaction's state, then applies it. A refused batch
/// leaves no trace: its buckets are checked before any row is written, and a row that
/// conflicts with a stored one undoes the rows written before it.
fn apply_batch(txn: &WriteTransaction, batch: &AppendBatch) -> Result<AppendOutcome> {
    let mut records = txn.open_table(RECORDS).map_err(db_err)?;
    let mut buckets = txn.open_table(BUCKETS).map_err(db_err)?;
    let mut by_time = txn.open_table(BUCKETS_BY_TIME).map_err(db_err)?;

    // Phase 1: check the buckets (state, bounds, the ingest guard), touching nothing. Each
    // row's key and stored value are encoded once, and rows refer to their bucket by index:
    // no per-row clones.
    let mut ids: Vec<BucketId> = Vec::new();
    let mut prefixes: Vec<Vec<u8>> = Vec::new();
    let mut first_rows: Vec<&PreparedRow> = Vec::new();
    let mut id_index: HashMap<(&[u8], &str), usize> = HashMap::new();
    let mut rows: Vec<(usize, Vec<u8>, Vec<u8>, &PreparedRow)> = Vec::with_capacity(batch.rows.len());
    for row in &batch.rows {
        let identity = (row.record.partition_key.as_slice(), row.descriptor.key.as_str());
        let index = *id_index.entry(identity).or_insert_with(|| {
            let id = BucketId {
                table: batch.table.clone(),
                partition_key: row.record.partition_key.clone(),
                bucket_key: row.descriptor.key.clone(),
            };
            prefixes.push(id.encode());
            ids.push(id);
            first_rows.push(row);
            ids.len() - 1
        });
        let key = record_key_in(&prefixes[index], row.record.event_time, &row.record.sort_key);
        let value = encode_row(&StoredRowView::of(row))?;
        rows.push((index, key, value, row));
    }
    let mut metas: Vec<(BucketMeta, bool)> = Vec::with_capacity(ids.len());
    let mut newest_start: HashMap<Vec<u8>, Option<Micros>> = HashMap::new();
    for ((id, prefix), first_row) in ids.iter().zip(&prefixes).zip(&first_rows) {
        let existing: Option<BucketMeta> =
            buckets.get(prefix.as_slice()).map_err(db_err)?.map(|v| decode_value(v.value())).transpose()?;
        let is_new = existing.is_none();
        let meta = existing.unwrap_or_else(|| new_bucket_meta(id.clone(), &first_row.descriptor, batch));
        if !meta.state.accepts_appends() {
            return Err(Error::BucketFenced {
                table: id.table.clone(),
                bucket: id.display(),
                state: meta.state.to_string(),
            });
        }
        metas.push((meta, is_new));
    }
    for (index, _, _, row) in &rows {
        let stored = &metas[*index].0.descriptor;
        if row.descriptor != *stored {
            return Err(Error::Conflict(format!(
                "bucket {} is stored as [{}, {}) but the strategy now answers [{}, {})",
                ids[*index], stored.start, stored.end, row.descriptor.start, row.descriptor.end
            )));
        }
    }
    if let Some(horizons) = &batch.writable_horizons {
        for (id, (meta, _)) in ids.iter().zip(&metas) {
            let partition = id.partition_key.clone();
            let stored_newest = match newest_start.get(&partition) {
                Some(v) => *v,
                None => {
                    let prefix = BucketId::table_prefix(&id.table, Some(&id.partition_key));
                    let end = encoding::prefix_end(&prefix);
                    let last = by_time.range(prefix.as_slice()..end.as_slice()).map_err(db_err)?.next_back();
                    let v = match last {
                        Some(entry) => Some(decode_by_time_key(entry.map_err(db_err)?.0.value())?.1),
                        None => None,
                    };
                    newest_start.insert(partition.clone(), v);
                    v
                }
            };
            let batch_newest = ids
                .iter()
                .zip(&metas)
                .filter(|(other, _)| other.partition_key == partition)
                .map(|(_, (m, _))| m.descriptor.start)
                .max();
            let newest = stored_newest.max(batch_newest);
            if let (Some(horizon), Some(newest)) = (horizons.get(&id.bucket_key), newest)
                && newest >= *horizon
            {
                return Err(Error::BucketNotWritable {
                    table: id.table.clone(),
                    bucket: id.display(),
                    writable_buckets: batch.writable_buckets,
                });
            }
            let _ = meta;
        }
    }
    // Phase 2: apply. Each row is inserted directly and the value redb hands back tells a new
    // row from a duplicate (the same stored row, accepted unchanged) or a conflict (another
    // body). A conflict, or any error, undoes this batch's rows before it is refused: the
    // transaction may carry other batches, and a refused batch must leave no trace.
    let mut inserted: Vec<usize> = Vec::with_capacity(rows.len());
    let applied = insert_rows(&mut records, &ids, &rows, &mut inserted);
    let duplicates = match applied {
        Ok(duplicates) => duplicates,
        Err(e) => {
            for &i in &inserted {
                records.remove(rows[i].1.as_slice()).map_err(db_err)?;
            }
            return Err(e);
        }
    };
    for &i in &inserted {
        let (index, _, _, row) = &rows[i];
        let (meta, _) = &mut metas[*index];
        meta.tenant.observe(row.record.tenant.as_deref(), meta.row_count);
        meta.kind.observe(row.record.kind.as_deref(), meta.row_count);
        meta.row_count += 1;
        meta.byte_count += row.record.body.len() as u64;
    }
    let mut unplanned = txn.open_table(UNPLANNED).map_err(db_err)?;
    for ((id, prefix), (meta, is_new)) in ids.iter().zip(&prefixes).zip(&metas) {
        buckets.insert(prefix.as_slice(), encode_value(meta)?.as_slice()).map_err(db_err)?;
        if *is_new {
            by_time.insert(by_time_key(id, meta.descriptor.start).as_slice(), ()).map_err(db_err)?;
            unplanned.insert(prefix.as_slice(), ()).map_err(db_err)?;
        } else if meta.plan_basis.as_ref().is_some_and(|b| b.facts != lifecycle::facts_digest(&meta.facts())) {
            // The policy would now see other facts (a new kind or tenant joined, the size
            // crossed a class): the plan is stale and never acts before it is made again.
            unplanned.insert(prefix.as_slice(), ()).map_err(db_err)?;
        }
    }
    Ok(AppendOutcome { appended: inserted.len() as u64, duplicates, already_archived: 0 })
}

/// Inserts `rows`, noting in `inserted` the index of each row that was new, and returns how
/// many were duplicates. A duplicate's stored bytes are put back as they were (a row written
/// by an older version may encode the same content differently); a conflict puts them back
/// and is returned as the error. The caller undoes `inserted` on any error.
fn insert_rows(
    records: &mut redb::Table<&'static [u8], &'static [u8]>,
    ids: &[BucketId],
    rows: &[(usize, Vec<u8>, Vec<u8>, &PreparedRow)],
    inserted: &mut Vec<usize>,
) -> Result<u64> {
    let mut duplicates = 0;
    for (i, (index, key, value, row)) in rows.iter().enumerate() {
        let previous = records.insert(key.as_slice(), value.as_slice()).map_err(db_err)?.map(|v| v.value().to_vec());
        let Some(previous) = previous else {
            inserted.push(i);
            continue;
        };
        if previous == *value {
            duplicates += 1;
            continue;
        }
        records.insert(key.as_slice(), previous.as_slice()).map_err(db_err)?;
        if decode_value::<StoredRow>(&previous)? != stored_row(row) {
            return Err(identity_conflict(&ids[*index], row));
        }
        duplicates += 1;
    }
    Ok(duplicates)
}

/// A `StoredRow` borrowed from a prepared row: encodes exactly as `StoredRow` does.
#[derive(serde::Serialize)]
struct StoredRowView<'a> {
    tenant: Option<&'a str>,
    kind: Option<&'a str>,
    body: &'a str,
}

impl<'a> StoredRowView<'a> {
    fn of(row: &'a PreparedRow) -> Self {
        StoredRowView { tenant: row.record.tenant.as_deref(), kind: row.record.kind.as_deref(), body: &row.record.body }
    }
}

fn stored_row(row: &PreparedRow) -> StoredRow {
    StoredRow { tenant: row.record.tenant.clone(), kind: row.record.kind.clone(), body: row.record.body.clone() }
}

fn identity_conflict(id: &BucketId, row: &PreparedRow) -> Error {
    Error::Conflict(format!(
        "a record with identity (bucket {id}, event_time {}, sort_key `{}`) already exists with a different body, tenant or kind; \
         nothing in this batch was applied",
        row.record.event_time,
        String::from_utf8_lossy(&row.record.sort_key)
    ))
}

fn new_bucket_meta(id: BucketId, descriptor: &BucketDescriptor, batch: &AppendBatch) -> BucketMeta {
    BucketMeta {
        id,
        descriptor: descriptor.clone(),
        strategy: batch.strategy.clone(),
        state: BucketState::Hot,
        generation: 0,
        lease_owner: None,
        lease_expires_at: 0,
        attempts: 0,
        next_retry_at: None,
        last_error: None,
        manifest_key: None,
        row_count: 0,
        byte_count: 0,
        tenant: Shared::Unset,
        kind: Shared::Unset,
        plan: None,
        due_at: None,
        created_at: batch.now,
        state_since: batch.now,
        archived_at: None,
        hot_deleted_at: None,
        held_by: Vec::new(),
        plan_basis: None,
    }
}

fn scan_rows(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    id: &BucketId,
    after: Option<(Micros, &[u8])>,
    limit: usize,
) -> Result<Vec<Record>> {
    let prefix = id.encode();
    let end = encoding::prefix_end(&prefix);
    let start = match after {
        Some((t, sort_key)) => {
            let mut k = record_key(id, t, sort_key);
            k.push(0); // strictly after
            k
        }
        None => prefix.clone(),
    };
    let mut out = Vec::new();
    for entry in table.range(start.as_slice()..end.as_slice()).map_err(db_err)?.take(limit) {
        let (k, v) = entry.map_err(db_err)?;
        out.push(bucket_row(id, &prefix, k.value(), v.value())?);
    }
    Ok(out)
}

/// The part of a record key of bucket `id` after the bucket's encoded `prefix`.
fn bucket_suffix<'k>(id: &BucketId, prefix: &[u8], key: &'k [u8]) -> Result<&'k [u8]> {
    key.strip_prefix(prefix)
        .ok_or_else(|| Error::Corruption(format!("a record key under bucket {id} lacks the bucket's prefix")))
}

/// A row of bucket `id` (whose encoded prefix is `prefix`) from its key and stored value.
fn bucket_row(id: &BucketId, prefix: &[u8], key: &[u8], value: &[u8]) -> Result<Record> {
    let (event_time, sort_key) = decode_record_suffix(bucket_suffix(id, prefix, key)?)?;
    let row: StoredRow = decode_value(value)?;
    Ok(Record {
        partition_key: id.partition_key.clone(),
        event_time,
        sort_key,
        tenant: row.tenant,
        kind: row.kind,
        body: row.body,
    })
}

/// Adds a bucket and its newest manifest to `out` when the bucket is published (not expired).
fn push_published(
    buckets: &impl ReadableTable<&'static [u8], &'static [u8]>,
    id: BucketId,
    manifest: &[u8],
    out: &mut Vec<(BucketMeta, crate::format::manifest::Manifest)>,
) -> Result<()> {
    let Some(meta) = buckets.get(id.encode().as_slice()).map_err(db_err)? else { return Ok(()) };
    let meta: BucketMeta = decode_value(meta.value())?;
    if matches!(meta.state, BucketState::Archived { .. }) && meta.manifest_key.is_some() {
        out.push((meta, decode_value(manifest)?));
    }
    Ok(())
}

fn load_meta(txn: &WriteTransaction, id: &BucketId) -> Result<BucketMeta> {
    let t = txn.open_table(BUCKETS).map_err(db_err)?;
    let v =
        t.get(id.encode().as_slice()).map_err(db_err)?.ok_or_else(|| Error::InvalidInput(format!("no bucket {id}")))?;
    decode_value(v.value())
}

fn save_meta(txn: &WriteTransaction, meta: &BucketMeta) -> Result<()> {
    let mut t = txn.open_table(BUCKETS).map_err(db_err)?;
    t.insert(meta.id.encode().as_slice(), encode_value(meta)?.as_slice()).map_err(db_err)?;
    Ok(())
}

fn meta_touch(meta: &mut BucketMeta, now: Micros, state: Option<BucketState>) {
    if let Some(state) = state
        && state != meta.state
    {
        meta.state = state;
        meta.state_since = now;
    }
}

/// Moves the bucket's due-index entry to `due_at` (or removes it).
fn schedule(txn: &WriteTransaction, meta: &mut BucketMeta, due_at: Option<Micros>) -> Result<()> {
    let mut due = txn.open_table(DUE).map_err(db_err)?;
    if let Some(old) = meta.due_at {
        due.remove(due_key(old, &meta.id).as_slice()).map_err(db_err)?;
    }
    if let Some(at) = due_at {
        due.insert(due_key(at, &meta.id).as_slice(), ()).map_err(db_err)?;
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

/// The generation of the bucket's published manifest: the newest one recorded.
fn published_generation(txn: &WriteTransaction, id: &BucketId) -> Result<Option<u64>> {
    let t = txn.open_table(MANIFESTS).map_err(db_err)?;
    let prefix = id.encode();
    let end = encoding::prefix_end(&prefix);
    let last = t.range(prefix.as_slice()..end.as_slice()).map_err(db_err)?.next_back();
    match last {
        None => Ok(None),
        Some(entry) => {
            let (k, _) = entry.map_err(db_err)?;
            let mut r = encoding::Reader::new(&k.value()[prefix.len()..]);
            Ok(Some(r.u64()?))
        }
    }
}

fn push_outbox(
    txn: &WriteTransaction,
    kind: &str,
    meta: Option<&BucketMeta>,
    now: Micros,
    detail: serde_json::Value,
) -> Result<()> {
    let mut m = txn.open_table(META).map_err(db_err)?;
    let sequence = match m.get(META_OUTBOX_SEQUENCE).map_err(db_err)? {
        Some(v) => {
            u64::from_be_bytes(v.value().try_into().map_err(|_| Error::Corruption("outbox sequence".into()))?) + 1
        }
        None => 1,
    };
    m.insert(META_OUTBOX_SEQUENCE, sequence.to_be_bytes().as_slice()).map_err(db_err)?;
    let event = OutboxEvent {
        sequence,
        kind: kind.to_string(),
        bucket: meta.map(|m| m.id.clone()),
        generation: meta.map_or(0, |m| m.generation),
        at: now,
        detail,
    };
    txn.open_table(OUTBOX)
        .map_err(db_err)?
        .insert(sequence.to_be_bytes().as_slice(), encode_value(&event)?.as_slice())
        .map_err(db_err)?;
    Ok(())
}

/// What planning one bucket gave: its plan and what it was made from, or the policy's
/// refusal.
pub type PlanOutcome = std::result::Result<(RetentionPlan, PlanBasis), String>;

/// How long a tombstone whose expiry events are still waiting for a sink waits before its
/// purge is tried again.
pub const TOMBSTONE_PURGE_RETRY_US: Micros = 60 * 1_000_000;

/// What placing a hold did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct HoldPlacement {
    /// Buckets the hold covers now.
    pub covered: u64,
    /// Expiries that had written their tombstone but deleted nothing: called off.
    pub expiries_called_off: Vec<String>,
    /// Buckets whose expiry had started deleting objects: the hold cannot save them.
    pub too_late: Vec<String>,
}

/// What `Store::sync_policy_holds` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyHoldSync {
    pub placed: Vec<String>,
    pub released: Vec<String>,
    pub too_late: Vec<String>,
}

fn load_table_state(txn: &WriteTransaction, table: &str) -> Result<Option<TableState>> {
    let t = txn.open_table(TABLES).map_err(db_err)?;
    t.get(table).map_err(db_err)?.map(|v| decode_value(v.value())).transpose()
}

fn save_table_state(txn: &WriteTransaction, state: &TableState) -> Result<()> {
    txn.open_table(TABLES)
        .map_err(db_err)?
        .insert(state.id.as_str(), encode_value(state)?.as_slice())
        .map_err(db_err)?;
    Ok(())
}

/// The identity of the retention policy in force for a table, `None` when the table has no
/// definition in the policy directory.
fn table_policy(txn: &WriteTransaction, table: &str) -> Result<Option<String>> {
    Ok(load_table_state(txn, table)?.filter(|s| s.unmanaged_since.is_none()).and_then(|s| s.retention))
}

fn save_tombstone(txn: &WriteTransaction, tombstone: &Tombstone) -> Result<()> {
    txn.open_table(TOMBSTONES)
        .map_err(db_err)?
        .insert(tombstone.bucket.encode().as_slice(), encode_value(tombstone)?.as_slice())
        .map_err(db_err)?;
    Ok(())
}

/// The ids of every stored hold that covers the bucket, read in the caller's transaction.
fn covering_holds(txn: &WriteTransaction, meta: &BucketMeta) -> Result<Vec<String>> {
    Ok(all_holds(txn)?.into_iter().filter(|h| h.covers(meta)).map(|h| h.id).collect())
}

/// Sets the bucket's due entry to what the lifecycle model says under the policy in force,
/// queues it for a plan when its plan is stale and the plan decides its next step, and keeps
/// `held_by` equal to the holds that cover it. The caller saves the bucket.
fn reconcile(txn: &WriteTransaction, meta: &mut BucketMeta, now: Micros) -> Result<()> {
    let policy = table_policy(txn, &meta.id.table)?;
    let tombstone = load_tombstone(txn, &meta.id)?;
    let covering = covering_holds(txn, meta)?;
    let current = meta.plan_is_current(policy.as_deref());
    let refresh = !current || lifecycle::plan_refresh_due(meta.plan_basis.as_ref(), now);
    if policy.is_some()
        && refresh
        && matches!(meta.state, BucketState::Hot | BucketState::Archived { hot_deleted: true })
    {
        txn.open_table(UNPLANNED).map_err(db_err)?.insert(meta.id.encode().as_slice(), ()).map_err(db_err)?;
    }
    if meta.state == (BucketState::Archived { hot_deleted: true }) {
        meta.held_by = covering.clone();
    }
    let due = if policy.is_some() {
        lifecycle::next_due(&meta.view(current, !covering.is_empty(), tombstone.as_ref()), now)
    } else {
        None
    };
    schedule(txn, meta, due)
}

/// Parks a bucket's expiry behind the holds that cover it (an event tells when it is new).
fn park(txn: &WriteTransaction, meta: &mut BucketMeta, covering: Vec<String>, now: Micros) -> Result<()> {
    if meta.held_by != covering {
        push_outbox(txn, "expiry_parked", Some(meta), now, serde_json::json!({"holds": covering}))?;
    }
    meta.held_by = covering;
    schedule(txn, meta, None)
}

/// A hold placed after an expiry wrote its tombstone but before its first delete call: the
/// archive is whole, so the expiry is called off. The bucket returns to `Archived` under a
/// new generation (the expiring worker is fenced out) and is parked.
fn call_off_expiry(txn: &WriteTransaction, meta: &mut BucketMeta, covering: Vec<String>, now: Micros) -> Result<()> {
    let archived = BucketState::Archived { hot_deleted: true };
    invariants::transition_is_allowed(meta.state, archived).map_err(Error::Internal)?;
    txn.open_table(TOMBSTONES).map_err(db_err)?.remove(meta.id.encode().as_slice()).map_err(db_err)?;
    meta_touch(meta, now, Some(archived));
    meta.generation += 1;
    meta.lease_owner = None;
    meta.lease_expires_at = now;
    meta.next_retry_at = None;
    push_outbox(txn, "expiry_called_off", Some(meta), now, serde_json::json!({"holds": covering}))?;
    meta.held_by = covering;
    schedule(txn, meta, None)?;
    save_meta(txn, meta)
}

/// What a newly stored hold does to the buckets it covers (see `lifecycle::hold_effect`).
fn apply_hold(txn: &WriteTransaction, hold: &Hold, now: Micros) -> Result<HoldPlacement> {
    let mut placement = HoldPlacement::default();
    for mut meta in table_buckets(txn, &hold.table)? {
        if !hold.covers(&meta) {
            continue;
        }
        placement.covered += 1;
        let tombstone = load_tombstone(txn, &meta.id)?;
        match lifecycle::hold_effect(meta.state, tombstone.as_ref().map(Tombstone::progress)) {
            HoldEffect::Parks => {
                if meta.state == (BucketState::Archived { hot_deleted: true }) {
                    let covering = covering_holds(txn, &meta)?;
                    park(txn, &mut meta, covering, now)?;
                    save_meta(txn, &meta)?;
                }
            }
            HoldEffect::CancelsExpiry => {
                let covering = covering_holds(txn, &meta)?;
                call_off_expiry(txn, &mut meta, covering, now)?;
                placement.expiries_called_off.push(meta.id.display());
            }
            HoldEffect::TooLate => placement.too_late.push(meta.id.display()),
            HoldEffect::AlreadyExpired => {}
        }
    }
    Ok(placement)
}

/// After a hold is removed from the store: the buckets it parked are rescheduled.
fn release_hold(txn: &WriteTransaction, hold: &Hold, now: Micros) -> Result<()> {
    for mut meta in table_buckets(txn, &hold.table)? {
        if !meta.held_by.contains(&hold.id) {
            continue;
        }
        meta.held_by.retain(|h| h != &hold.id);
        reconcile(txn, &mut meta, now)?;
        save_meta(txn, &meta)?;
    }
    Ok(())
}

/// Whether an event telling of the bucket's expiry still waits in the outbox for a sink.
fn expiry_events_pending(txn: &WriteTransaction, id: &BucketId) -> Result<bool> {
    let t = txn.open_table(OUTBOX).map_err(db_err)?;
    for entry in t.iter().map_err(db_err)? {
        let event: OutboxEvent = decode_value(entry.map_err(db_err)?.1.value())?;
        if event.bucket.as_ref() == Some(id) && matches!(event.kind.as_str(), "archive_expiring" | "archive_expired") {
            return Ok(true);
        }
    }
    Ok(false)
}

/// One read transaction, shared by clones: everything read through it is from one instant.
#[derive(Clone)]
pub struct Snapshot {
    txn: Arc<redb::ReadTransaction>,
}

impl Snapshot {
    pub fn bucket(&self, id: &BucketId) -> Result<Option<BucketMeta>> {
        let t = self.txn.open_table(BUCKETS).map_err(db_err)?;
        t.get(id.encode().as_slice()).map_err(db_err)?.map(|v| decode_value(v.value())).transpose()
    }

    /// Every bucket of a table (or of one partition), in key order.
    pub fn buckets(&self, table: &str, partition_key: Option<&[u8]>) -> Result<Vec<BucketMeta>> {
        let t = self.txn.open_table(BUCKETS).map_err(db_err)?;
        let prefix = BucketId::table_prefix(table, partition_key);
        let end = encoding::prefix_end(&prefix);
        let mut out = Vec::new();
        for entry in t.range(prefix.as_slice()..end.as_slice()).map_err(db_err)? {
            let (_, v) = entry.map_err(db_err)?;
            out.push(decode_value(v.value())?);
        }
        Ok(out)
    }

    /// Calls `visit` with every bucket of every table in key order, one at a time.
    pub fn visit_buckets(&self, mut visit: impl FnMut(BucketMeta) -> Result<()>) -> Result<()> {
        let t = self.txn.open_table(BUCKETS).map_err(db_err)?;
        for entry in t.iter().map_err(db_err)? {
            let (_, v) = entry.map_err(db_err)?;
            visit(decode_value(v.value())?)?;
        }
        Ok(())
    }

    /// The hot rows of a bucket in clustering order, from `after` (exclusive) when given.
    pub fn rows(&self, id: &BucketId, after: Option<(Micros, &[u8])>, limit: usize) -> Result<Vec<Record>> {
        scan_rows(&self.txn.open_table(RECORDS).map_err(db_err)?, id, after, limit)
    }

    /// The newest recorded (that is, published) manifest of a bucket.
    pub fn latest_manifest(&self, id: &BucketId) -> Result<Option<crate::format::manifest::Manifest>> {
        let t = self.txn.open_table(MANIFESTS).map_err(db_err)?;
        let prefix = id.encode();
        let end = encoding::prefix_end(&prefix);
        let last = t.range(prefix.as_slice()..end.as_slice()).map_err(db_err)?.next_back();
        match last {
            Some(entry) => Ok(Some(decode_value(entry.map_err(db_err)?.1.value())?)),
            None => Ok(None),
        }
    }

    /// For each table and target that holds archives of buckets not yet expired, the buckets
    /// whose newest manifest lives there.
    pub fn archive_targets(&self) -> Result<std::collections::BTreeMap<(String, ArchiveTarget), Vec<String>>> {
        let mut out: std::collections::BTreeMap<(String, ArchiveTarget), Vec<String>> = Default::default();
        let mut archived = Vec::new();
        let open_expiries: std::collections::HashSet<BucketId> =
            self.tombstones()?.into_iter().filter(|t| t.completed_at.is_none()).map(|t| t.bucket).collect();
        self.visit_buckets(|meta| {
            if matches!(meta.state, BucketState::Archived { .. }) || open_expiries.contains(&meta.id) {
                archived.push(meta.id);
            }
            Ok(())
        })?;
        for id in archived {
            if let Some(manifest) = self.latest_manifest(&id)? {
                out.entry((id.table.clone(), manifest.archive_target())).or_default().push(id.display());
            }
        }
        Ok(out)
    }

    /// Calls `visit` with every recorded manifest.
    pub fn visit_manifests(
        &self,
        mut visit: impl FnMut(crate::format::manifest::Manifest) -> Result<()>,
    ) -> Result<()> {
        let t = self.txn.open_table(MANIFESTS).map_err(db_err)?;
        for entry in t.iter().map_err(db_err)? {
            visit(decode_value(entry.map_err(db_err)?.1.value())?)?;
        }
        Ok(())
    }

    pub fn intents(&self) -> Result<Vec<UploadIntent>> {
        let t = self.txn.open_table(INTENTS).map_err(db_err)?;
        let mut out = Vec::new();
        for entry in t.iter().map_err(db_err)? {
            out.push(decode_value(entry.map_err(db_err)?.1.value())?);
        }
        Ok(out)
    }

    pub fn tombstones(&self) -> Result<Vec<Tombstone>> {
        let t = self.txn.open_table(TOMBSTONES).map_err(db_err)?;
        let mut out = Vec::new();
        for entry in t.iter().map_err(db_err)? {
            out.push(decode_value(entry.map_err(db_err)?.1.value())?);
        }
        Ok(out)
    }
}

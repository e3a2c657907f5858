//! The protocol's transitions, each one fenced transaction that loads the bucket, asks the
//! lifecycle model and saves: tables registered and reconciled, plans stored, claim, lease
//! renewal, upload intent, publish, defer and cleanup (an expiry's steps are in `expiry`).

use redb::{ReadableTable, ReadableTableMetadata, WriteTransaction};

use crate::error::{Error, Result};
use crate::model::lifecycle::{NotClaimable, PlanBasis, Step};
use crate::model::{BucketState, Micros, RetentionPlan, lifecycle};

use super::erasure::ArchivedErased;
use super::holds::park;
use super::outbox::push_outbox;
use super::ownership::{release_intents, release_replaced};
use super::reads::rows_match_manifest;
use super::schema::{
    BUCKETS, BUCKETS_BY_END, BucketId, BucketMeta, INTENTS, MANIFESTS, TABLES, TableState, UploadIntent,
    decode_by_end_key, decode_value, encode_value, generation_key, rows_table, rows_table_name,
};
use super::{
    LifecycleInputs, Store, check_lease, dequeue_plan, encoding, load_meta, load_table_state, reconcile, record_step,
    record_step_with, save_meta, save_table_state,
};

impl Store {
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
                Some(existing)
                    if let (Some(recorded), Some(declared)) = (&existing.declaration, &state.declaration)
                        && let Err(why) =
                            crate::model::columns::check_evolution(&recorded.columns, &declared.columns) =>
                {
                    Err(Error::InvalidInput(format!("{}: table `{}`: {why}", declared.file, state.id)))
                }
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
                let t = txn.open_table(TABLES)?;
                for entry in t.iter()? {
                    let state: TableState = decode_value(entry?.1.value())?;
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
                        dequeue_plan(txn, &meta)?;
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
            // Oldest end first: after a policy change the buckets most likely due are queued
            // for their new plan before the others.
            let prefix = BucketId::table_prefix(&table, None);
            let end = encoding::prefix_end(&prefix);
            let start = if from.is_empty() { prefix.clone() } else { from };
            let mut keys: Vec<Vec<u8>> = Vec::new();
            {
                let t = txn.open_table(BUCKETS_BY_END)?;
                for entry in t.range(start.as_slice()..end.as_slice())?.take(limit + 1) {
                    keys.push(entry?.0.value().to_vec());
                }
            }
            state.reconcile_from = if keys.len() > limit { keys.pop() } else { None };
            let visited = keys.len() as u64;
            for key in keys {
                let mut meta = load_meta(txn, &decode_by_end_key(&key)?)?;
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

    /// Reconciles the buckets `ids` in one transaction (a pass found them due under a stale
    /// plan, `Store::due_work`): each leaves the due index and waits for a new plan, as the
    /// table's reconciliation would do when it reached them. A bucket forgotten meanwhile is
    /// passed over.
    pub fn reconcile_buckets(&self, ids: Vec<BucketId>, now: Micros) -> Result<()> {
        self.write(move |txn| {
            for id in &ids {
                let found = txn.open_table(BUCKETS)?.get(id.encode().as_slice())?.map(|v| decode_value(v.value()));
                let Some(meta) = found else { continue };
                let mut meta: BucketMeta = meta?;
                let before = meta.clone();
                reconcile(txn, &mut meta, now)?;
                if meta != before {
                    save_meta(txn, &meta)?;
                }
            }
            Ok(())
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
            for id in ids {
                dequeue_plan(txn, &load_meta(txn, &id)?)?;
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
        // Undoable: a crash before the claim's next durable commit (its upload intent, an
        // expiry's tombstone, a deferral) leaves the bucket as it was, and nothing was done
        // under the claim that outlives the process.
        self.write_undoable(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            let inputs = LifecycleInputs::load(txn, &meta)?;
            if inputs.policy.is_none() {
                // No definition: nothing can be planned, archived or expired until it returns.
                if meta.due_at.is_some() {
                    meta.last_error = Some("the table is not in the policy directory; its buckets wait for it".into());
                    record_step_with(txn, &mut meta, &inputs, Step::Reconcile, now)?;
                    save_meta(txn, &meta)?;
                }
                return Ok(None);
            }
            let claimable = lifecycle::claimable(&inputs.view(&meta, now), now);
            if let Err(why) = &claimable {
                tracing::debug!(bucket = %id, state = ?meta.state, ?why, due_at = ?meta.due_at, "not claimed");
            }
            match claimable {
                Ok(_) => {}
                Err(NotClaimable::Leased) => return Ok(None),
                Err(NotClaimable::Held) => {
                    park(txn, &mut meta, inputs.covering.clone(), now, false)?;
                    save_meta(txn, &meta)?;
                    return Ok(None);
                }
                Err(NotClaimable::NeedsPlan | NotClaimable::NotDue) => {
                    record_step_with(txn, &mut meta, &inputs, Step::Reconcile, now)?;
                    save_meta(txn, &meta)?;
                    return Ok(None);
                }
            }
            // If this worker dies, the lease expiry is when another one takes over.
            let claim = Step::Claim { owner: &owner, lease_until: now + lease_us };
            record_step_with(txn, &mut meta, &inputs, claim, now)?;
            save_meta(txn, &meta)?;
            Ok(Some(meta))
        })
    }

    /// Extends a held lease. Fails (and changes nothing) when the lease is no longer held.
    pub fn renew(&self, id: BucketId, owner: String, generation: u64, now: Micros, lease_us: Micros) -> Result<Micros> {
        self.write(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            check_lease(&meta, &owner, generation, now)?;
            record_step(txn, &mut meta, Step::Renew { lease_until: now + lease_us }, now)?;
            save_meta(txn, &meta)?;
            Ok(meta.lease_expires_at)
        })
    }

    /// Adds keys to the upload intent of this claim's generation (made by the first call),
    /// before anything is uploaded under them.
    pub fn record_intent(&self, intent: UploadIntent, owner: String, now: Micros) -> Result<()> {
        self.write(move |txn| {
            let meta = load_meta(txn, &intent.bucket)?;
            check_lease(&meta, &owner, intent.generation, now)?;
            let key = generation_key(&intent.bucket, intent.generation);
            let mut intents = txn.open_table(INTENTS)?;
            // A streamed archival adds its keys segment by segment to one intent.
            let mut recorded: UploadIntent = match intents.get(key.as_slice())? {
                Some(v) => decode_value(v.value())?,
                None => UploadIntent { keys: Vec::new(), ..intent.clone() },
            };
            for k in intent.keys {
                if !recorded.keys.contains(&k) {
                    recorded.keys.push(k);
                }
            }
            intents.insert(key.as_slice(), encode_value(&recorded)?.as_slice())?;
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
        publication: Publication,
    ) -> Result<BucketMeta> {
        let Publication { manifest, manifest_key, erased } = publication;
        self.write(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            check_lease(&meta, &owner, generation, now)?;
            // The bucket's counts are of its records, hot and archived.
            meta.row_count = meta.row_count.saturating_sub(erased.rows);
            meta.byte_count = meta.byte_count.saturating_sub(erased.body_bytes);
            super::erasure::count_erased(txn, &id, 0, erased)?;
            txn.open_table(MANIFESTS)?
                .insert(generation_key(&id, generation).as_slice(), encode_value(&manifest)?.as_slice())?;
            meta.manifest_key = Some(manifest_key.clone());
            meta.archived_at = Some(now);
            meta.attempts = 0;
            meta.last_error = None;
            record_step(txn, &mut meta, Step::Publish, now)?;
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

    /// An expiry whose deletes wait for the table's Delta log to drop the bucket's files
    /// (`archive::expiry::finish`): the lease is released and the bucket is due again at once,
    /// with no attempt counted and no error, as nothing failed.
    pub fn await_delta_log(&self, id: BucketId, owner: String, generation: u64, now: Micros) -> Result<()> {
        self.write(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            if meta.lease_owner.as_deref() != Some(owner.as_str()) || meta.generation != generation {
                return Ok(()); // someone else owns it now
            }
            record_step(txn, &mut meta, Step::Defer { retry_at: now }, now)?;
            save_meta(txn, &meta)
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
            record_step(txn, &mut meta, Step::Defer { retry_at }, now)?;
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

    /// One slice of a cleanup, under the fence. The cleanup deletes the hot rows of a published
    /// bucket in fenced transactions of at most a slice each, or drops a small bucket's rows
    /// table whole, so the single writer is never held for a whole large bucket: a bucket with
    /// at most `CLEANUP_DROP_WHOLE_SLICES` slices of rows left drops its rows table whole; a
    /// larger one deletes `slice_rows` rows, oldest first. The slice that removes the last row
    /// moves the bucket to `Archived{hot_deleted:true}`.
    ///
    /// The first slice makes the proof (invariant 9, `invariants::hot_rows_match_manifest`) in
    /// its own transaction, before it deletes anything: the published manifest's count, key
    /// range and checksum were summed as the snapshot streamed the rows in strictly increasing
    /// key order, so the table's length and its first and last keys are checked against them
    /// without reading the rows again (debug builds also re-read them for the checksum). Any
    /// difference refuses the cleanup and deletes nothing. The proof is recorded with the
    /// bucket (`cleanup_proven`): a claimed bucket accepts no appends, so its rows cannot change
    /// after the snapshot, and a cleanup that resumes after a crash or a takeover goes on
    /// deleting what is left (proving again against rows partly deleted would refuse forever).
    pub fn cleanup_slice(
        &self,
        id: &BucketId,
        owner: &str,
        generation: u64,
        now: Micros,
        slice_rows: usize,
    ) -> Result<CleanupSlice> {
        let (id, owner) = (id.clone(), owner.to_string());
        // Undoable: a slice lost in a crash puts rows back that the published manifest holds,
        // and the next worker deletes them again (proving again first if the proof was lost).
        self.write_undoable(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            check_lease(&meta, &owner, generation, now)?;
            // Only a published bucket is cleaned up (the state machine's other edges into
            // `archived` are adoption's and a called-off expiry's).
            if meta.state != (BucketState::Archived { hot_deleted: false }) {
                return Err(Error::Internal(format!("bucket {id} is {}, not published: no cleanup", meta.state)));
            }
            let published = published_generation(txn, &id)?
                .ok_or_else(|| Error::Internal(format!("bucket {id} is published but has no manifest")))?;
            let name = rows_table_name(&id);
            let mut records = txn.open_table(rows_table(&name))?;
            let published_manifest = || {
                recorded_manifest(txn, &id, published)?.ok_or_else(|| {
                    Error::Internal(format!("manifest of bucket {id} generation {published} is missing"))
                })
            };
            if meta.cleanup_proven != Some(published) {
                let manifest = published_manifest()?;
                rows_match_manifest(&records, &id, manifest.hot_rows())?
                    .map_err(|why| Error::Corruption(format!("refusing to delete the hot rows of {id}: {why}")))?;
                meta.cleanup_proven = Some(published);
            }
            let left = records.len()?;
            let whole = left <= (slice_rows as u64).saturating_mul(CLEANUP_DROP_WHOLE_SLICES);
            let deleted = if whole { left } else { slice_rows as u64 };
            if !whole {
                for i in 0..slice_rows {
                    if i == slice_rows / 2 {
                        crate::failpoints::hit("mid_cleanup")?;
                    }
                    records.pop_first()?;
                }
            }
            drop(records);
            let finished = whole;
            if finished {
                crate::failpoints::hit("mid_cleanup")?;
                txn.delete_table(rows_table(&name))?;
                meta.hot_deleted_at = Some(now);
                meta.cleanup_proven = None;
                // What earlier attempts uploaded and the published archive does not use is
                // this directory's to sweep; nothing else is.
                let manifest = published_manifest()?;
                release_intents(txn, &id, &manifest, meta.manifest_key.as_deref(), now)?;
                // A next generation replaced an archive: what that one used and this one does
                // not is released to the sweep, which deletes it after its grace period (a
                // query that read the old manifest a moment ago still finds its segments).
                if let Some(amends) = &manifest.amends {
                    release_replaced(txn, &id, amends, &manifest, meta.manifest_key.as_deref(), now)?;
                }
                // Next: the archive's expiry. Being archived is a fact the policy sees, so the
                // model queues the bucket for a plan made with it before anything is scheduled.
                record_step(txn, &mut meta, Step::HotRowsDeleted, now)?;
                push_outbox(txn, "hot_rows_deleted", Some(&meta), now, serde_json::json!({"rows": meta.row_count}))?;
            }
            save_meta(txn, &meta)?;
            Ok(CleanupSlice { deleted, finished })
        })
    }
}

/// Adds a bucket and its newest manifest to `out` when the bucket has a published archive (not
/// expired; rows appended since may wait for its next generation).
pub(super) fn push_published(
    buckets: &impl ReadableTable<&'static [u8], &'static [u8]>,
    id: BucketId,
    manifest: &[u8],
    out: &mut Vec<(BucketMeta, crate::format::manifest::Manifest)>,
) -> Result<()> {
    let Some(meta) = buckets.get(id.encode().as_slice())? else { return Ok(()) };
    let meta: BucketMeta = decode_value(meta.value())?;
    if meta.has_published_archive() {
        out.push((meta, decode_value(manifest)?));
    }
    Ok(())
}

/// The bucket's manifest of one generation, as recorded.
fn recorded_manifest(
    txn: &WriteTransaction,
    id: &BucketId,
    generation: u64,
) -> Result<Option<crate::format::manifest::Manifest>> {
    let t = txn.open_table(MANIFESTS)?;
    t.get(generation_key(id, generation).as_slice())?.map(|v| decode_value(v.value())).transpose()
}

/// The generation of the bucket's published manifest: the newest one recorded.
pub(super) fn published_generation(txn: &WriteTransaction, id: &BucketId) -> Result<Option<u64>> {
    let t = txn.open_table(MANIFESTS)?;
    let prefix = id.encode();
    let end = encoding::prefix_end(&prefix);
    let last = t.range(prefix.as_slice()..end.as_slice())?.next_back();
    match last {
        None => Ok(None),
        Some(entry) => {
            let (k, _) = entry?;
            let mut r = encoding::Reader::new(&k.value()[prefix.len()..]);
            Ok(Some(r.u64()?))
        }
    }
}

/// A cleanup drops a bucket's rows table whole (one transaction) once at most this many
/// slices of rows are left. Dropping a table frees its pages without visiting its rows: on the
/// reference machine a drop of 4 slices (40,000 rows) took 11 ms against 20 ms for one slice
/// deleted key by key, and a drop of 8 slices 36 ms against 21 ms (BENCHMARKS.md, scenario
/// `hot-layout`), so a drop of up to 4 slices holds the single writer no longer than a slice.
pub const CLEANUP_DROP_WHOLE_SLICES: u64 = 4;

/// What one slice of a cleanup did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanupSlice {
    pub deleted: u64,
    /// The last hot row is gone and the bucket is `Archived{hot_deleted:true}`.
    pub finished: bool,
}

/// What planning one bucket gave: its plan and what it was made from, or the policy's
/// refusal.
pub type PlanOutcome = std::result::Result<(RetentionPlan, PlanBasis), String>;

/// What a publication records: the generation's manifest and its key, and the archived records
/// it leaves out for an erasure (`erased`), which come off the bucket's counts and count for
/// the requests that named them in the publication, once, as the generation that holds them
/// stops being the one read (an attempt cut off before it would otherwise count them again).
#[derive(Debug, Clone)]
pub struct Publication {
    pub manifest: crate::format::manifest::Manifest,
    pub manifest_key: String,
    pub erased: ArchivedErased,
}

impl Publication {
    /// A publication that leaves no archived record out.
    pub fn new(manifest: crate::format::manifest::Manifest, manifest_key: impl Into<String>) -> Publication {
        Publication { manifest, manifest_key: manifest_key.into(), erased: ArchivedErased::default() }
    }
}

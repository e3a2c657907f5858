//! The archival coordinator (ARCHITECTURE.md, "The protocol"): a pass works on up to
//! `ARCHIVER_CONCURRENCY` due buckets at once, each in its own task under its own lease.
//!
//! claim (fenced lease, generation + 1) → snapshot (owner- and generation-checked), read and
//! encoded a segment at a time (`pipeline`) → per segment: its key added to the upload
//! intent, created conditionally, read back and verified → create the manifest the same way, last → publish (the read cut-over) → cleanup
//! (the fenced hot delete, checked against the manifest). The lease is renewed on the engine's
//! clock before each step (and by a timer while one step runs long); once a renewal fails no
//! further destructive step starts. A failure before
//! publication defers the bucket; a failure after it leaves cleanup pending for a retry or a
//! takeover. Each pass plans new buckets and runs due cleanups before it discovers new work.

pub mod adopt;
pub mod catalog;
#[cfg(feature = "delta")]
pub mod delta;
pub mod expiry;
pub mod outbox;
mod pipeline;
pub mod sweep;
pub mod verify;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt as _;

pub use crate::format::reader::{read_archive, read_manifest, verify_segment};

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::format::manifest::{MANIFEST_VERSION, Manifest, SegmentInfo, sha256_hex};
use crate::model::lifecycle::{self, PlanBasis};
use crate::model::{BucketFacts, BucketState, Micros};
use crate::policy::{PolicySet, TablePolicy};
use crate::storage::{ArchiveBackend, PutOutcome, keys};
use crate::store::PlanOutcome;
use crate::store::schema::{BucketId, BucketMeta, UploadIntent};

/// Buckets planned per pass at most, so a pass after a large ingest still reaches due work.
pub const PLAN_BUCKETS_PER_PASS_MAX: usize = 10_000;
/// Buckets planned per retention-policy call and store transaction.
pub const PLAN_BATCH_BUCKETS_MAX: usize = crate::plugin::retention::RETENTION_BATCH_BUCKETS_MAX;

/// What one pass did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct PassReport {
    pub planned: u64,
    /// Buckets whose schedule was checked against their plan (and queued when it was stale).
    pub reconciled: u64,
    pub plan_failures: u64,
    pub archived: u64,
    pub cleaned: u64,
    pub deferred: u64,
    pub rows_archived: u64,
    pub bytes_archived: u64,
    pub expired: u64,
    /// Expiries stopped by a legal hold.
    pub held: u64,
    pub tombstones_purged: u64,
    pub outbox_delivered: u64,
    pub orphans_deleted: u64,
    /// Every error the pass met and went on from, with its cause (`PassReport::error`).
    pub errors: Vec<String>,
    /// How many of `errors` there were of each kind (`PassErrorKind`), for the metrics.
    pub error_kinds: std::collections::BTreeMap<&'static str, u64>,
    /// Where the pass spent its time.
    pub seconds: PhaseSeconds,
}

/// What a pass error was about, as the metrics label it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassErrorKind {
    /// A bucket's archival, cleanup or expiry failed or was deferred.
    Bucket,
    Outbox,
    Catalog,
    DeltaLog,
    /// The orphan sweep stopped (another copy of the data directory, a listing that failed).
    Sweep,
}

impl PassErrorKind {
    pub fn label(self) -> &'static str {
        match self {
            PassErrorKind::Bucket => "bucket",
            PassErrorKind::Outbox => "outbox",
            PassErrorKind::Catalog => "catalog",
            PassErrorKind::DeltaLog => "delta_log",
            PassErrorKind::Sweep => "sweep",
        }
    }
}

/// A step of the protocol, as `PhaseSeconds` itemizes a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Asking the retention policies for plans and storing them.
    Plan,
    /// Reading the due index and the due buckets.
    Discover,
    Claim,
    /// The owner-checked read of a bucket's rows.
    Snapshot,
    /// Encoding segments, hashing them, building the manifest.
    Encode,
    RecordIntent,
    /// Conditional creates of the segments.
    Upload,
    /// Reading the segments back.
    ReadBack,
    /// Comparing what was read with what was written, its hash, and decoding every row.
    Verify,
    /// The manifest's create, read back and comparison.
    Manifest,
    Publish,
    /// The checked hot delete.
    Cleanup,
    /// Rewriting the tables' catalogs.
    Catalog,
    /// Syncing the tables' Delta logs after the pass (the syncs before expiries are not
    /// itemized, like the expiries).
    DeltaLog,
}

impl Phase {
    /// Every phase, in protocol order.
    pub const ALL: [Phase; 14] = [
        Phase::Plan,
        Phase::Discover,
        Phase::Claim,
        Phase::Snapshot,
        Phase::Encode,
        Phase::RecordIntent,
        Phase::Upload,
        Phase::ReadBack,
        Phase::Verify,
        Phase::Manifest,
        Phase::Publish,
        Phase::Cleanup,
        Phase::Catalog,
        Phase::DeltaLog,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Plan => "plan",
            Phase::Discover => "discover",
            Phase::Claim => "claim",
            Phase::Snapshot => "snapshot",
            Phase::Encode => "encode",
            Phase::RecordIntent => "record_intent",
            Phase::Upload => "upload",
            Phase::ReadBack => "read_back",
            Phase::Verify => "verify",
            Phase::Manifest => "manifest",
            Phase::Publish => "publish",
            Phase::Cleanup => "cleanup",
            Phase::Catalog => "catalog",
            Phase::DeltaLog => "delta_log",
        }
    }
}

/// Seconds a pass spent in each `Phase`, summed over its buckets (expiry, outbox and sweep are
/// not itemized; buckets worked on at once each count their own time, so the sum can exceed
/// the pass's wall time). Cheap enough to take always; the benchmark's breakdown of a pass reads it.
/// Serialized as an object from phase name to seconds.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct PhaseSeconds([f64; Phase::ALL.len()]);

impl PhaseSeconds {
    pub fn get(&self, phase: Phase) -> f64 {
        self.0[phase as usize]
    }

    fn add(&mut self, phase: Phase, seconds: f64) {
        self.0[phase as usize] += seconds;
    }

    /// Each phase's name and seconds, in protocol order.
    pub fn named(&self) -> Vec<(&'static str, f64)> {
        Phase::ALL.iter().map(|&phase| (phase.name(), self.get(phase))).collect()
    }

    fn add_all(&mut self, other: &PhaseSeconds) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            *mine += theirs;
        }
    }
}

impl serde::Serialize for PhaseSeconds {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = serializer.serialize_map(Some(Phase::ALL.len()))?;
        for phase in Phase::ALL {
            map.serialize_entry(phase.name(), &self.get(phase))?;
        }
        map.end()
    }
}

/// Laps of a stopwatch: each `lap` returns the seconds since the previous one.
struct Lap(Instant);

impl Lap {
    fn start() -> Lap {
        Lap(Instant::now())
    }

    fn lap(&mut self) -> f64 {
        let now = Instant::now();
        let seconds = now.duration_since(self.0).as_secs_f64();
        self.0 = now;
        seconds
    }
}

impl PassReport {
    /// Adds another pass's figures to these.
    pub fn add(&mut self, other: PassReport) {
        self.planned += other.planned;
        self.reconciled += other.reconciled;
        self.plan_failures += other.plan_failures;
        self.archived += other.archived;
        self.cleaned += other.cleaned;
        self.deferred += other.deferred;
        self.rows_archived += other.rows_archived;
        self.bytes_archived += other.bytes_archived;
        self.expired += other.expired;
        self.held += other.held;
        self.tombstones_purged += other.tombstones_purged;
        self.outbox_delivered += other.outbox_delivered;
        self.orphans_deleted += other.orphans_deleted;
        self.errors.extend(other.errors);
        for (kind, count) in other.error_kinds {
            *self.error_kinds.entry(kind).or_default() += count;
        }
        self.seconds.add_all(&other.seconds);
    }

    /// Records an error the pass went on from: logged at warn with its cause and counted by
    /// kind (`frostline_pass_errors_total{kind}`), so a pass that goes on is never silent.
    pub fn error(&mut self, kind: PassErrorKind, message: String) {
        tracing::warn!(kind = kind.label(), error = %message, "archival pass error");
        *self.error_kinds.entry(kind.label()).or_default() += 1;
        self.errors.push(message);
    }

    /// Whether the pass changed any bucket's state (another pass may find more to do).
    pub fn made_progress(&self) -> bool {
        self.planned + self.archived + self.cleaned + self.expired + self.tombstones_purged > 0
    }
}

/// Runs one pass: plan, then due work (cleanups first), at most `scan_limit` buckets.
pub async fn run_pass(engine: &Arc<Engine>, owner: &str) -> Result<PassReport> {
    let mut report = PassReport::default();
    let mut lap = Lap::start();
    // The epoch is recorded here, off the async threads, before any key is made with it.
    let recorder = engine.clone();
    blocking(move || recorder.writer().map(drop)).await?;
    plan_buckets(engine, &mut report).await?;
    report.seconds.add(Phase::Plan, lap.lap());
    // Outbox delivery runs before discovery; a sink that is down never blocks archival.
    match outbox::deliver(engine).await {
        Ok(n) => report.outbox_delivered = n,
        Err(e) => report.error(PassErrorKind::Outbox, format!("outbox: {e}")),
    }
    lap.lap();
    let now = engine.clock.now();
    let store = engine.store.clone();
    let limit = engine.settings.scan_limit;
    let mut metas = blocking(move || {
        let snapshot = store.snapshot()?;
        let mut metas = Vec::new();
        for (_, id) in store.due(now, limit)? {
            metas.extend(snapshot.bucket(&id)?);
        }
        Ok(metas)
    })
    .await?;
    // Pending cleanups first: a failing discovery or upload must not starve them.
    metas.sort_by_key(|m| !matches!(m.state, BucketState::Archived { hot_deleted: false }));
    report.seconds.add(Phase::Discover, lap.lap());
    // Up to `archive_concurrency` buckets at once, each its own task under its own lease and
    // fence (started in the order above, cleanups first); the store's single writer orders
    // their transactions.
    let mut outcomes = futures::stream::iter(metas)
        .map(|meta| {
            let (engine, owner) = (engine.clone(), owner.to_string());
            tokio::spawn(async move {
                let mut seconds = PhaseSeconds::default();
                let outcome = work_on(&engine, &owner, &meta, &mut seconds).await;
                (meta.id, outcome, seconds)
            })
        })
        .buffer_unordered(engine.settings.archive_concurrency.max(1));
    while let Some(joined) = outcomes.next().await {
        let (id, outcome, seconds) = joined.map_err(|e| Error::Internal(format!("an archival task failed: {e}")))?;
        report.seconds.add_all(&seconds);
        match outcome {
            Ok(Outcome::Archived { rows, bytes }) => {
                report.archived += 1;
                report.cleaned += 1;
                report.rows_archived += rows;
                report.bytes_archived += bytes;
            }
            Ok(Outcome::Cleaned) => report.cleaned += 1,
            Ok(Outcome::Expired) => report.expired += 1,
            Ok(Outcome::Held) => report.held += 1,
            Ok(Outcome::Purged) => report.tombstones_purged += 1,
            Ok(Outcome::Deferred(why)) => {
                report.deferred += 1;
                report.error(PassErrorKind::Bucket, format!("{id}: {why}"));
            }
            Ok(Outcome::NotClaimed) => {}
            Err(e) => report.error(PassErrorKind::Bucket, format!("{id}: {e}")),
        }
    }
    drop(outcomes);
    // The catalogs are derived from the manifests; refresh them when archives changed.
    if report.archived + report.expired > 0 {
        lap.lap();
        // A table with a Delta log has no catalog: its log lists its files, for every
        // installation that shares the target (each catalog would list one installation's).
        for (table, policy) in &engine.policies().tables {
            if policy.delta_log() {
                continue;
            }
            if let Err(e) = catalog::write(engine, table).await {
                report.error(PassErrorKind::Catalog, format!("catalog of `{table}`: {e}"));
            }
        }
        report.seconds.add(Phase::Catalog, lap.lap());
    }
    // The Delta logs too, and any whose last sync failed or that this process has not synced.
    #[cfg(feature = "delta")]
    {
        lap.lap();
        let changed = report.archived + report.expired > 0;
        for table in engine.policies().tables.values() {
            if let Some(Err(e)) = delta::sync_if_needed(engine, table, changed).await {
                report.error(PassErrorKind::DeltaLog, format!("Delta log of `{}`: {e}", table.id));
            }
        }
        report.seconds.add(Phase::DeltaLog, lap.lap());
    }
    // A failed reference check stops the sweep before it deletes anything.
    match sweep::sweep_if_due(engine).await {
        Ok(Some(swept)) => report.orphans_deleted = swept.deleted,
        Ok(None) => {}
        Err(e) => report.error(PassErrorKind::Sweep, format!("orphan sweep stopped: {e}")),
    }
    Ok(report)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Error::Internal(format!("blocking task failed: {e}")))?
}

/// Buckets a pass reconciles at most (rescheduled, and queued for a plan when theirs is stale),
/// over every table, after a policy change or every `REPLAN_PERIOD_US`.
pub const RECONCILE_BUCKETS_PER_PASS_MAX: usize = 10_000;
/// Buckets reconciled per store transaction: the writer is never held long, so appends wait
/// at most one such batch.
pub const RECONCILE_BATCH_BUCKETS_MAX: usize = 1_000;

/// Re-decides retention: first advances each table's reconciliation (after a reload that
/// changed its retention policy or the cutoff, when a table returns, and periodically), which
/// queues every bucket whose plan is stale; then asks each table's retention policy for a plan
/// for the queued buckets (new ones, and those whose facts or policy changed), in batches: one
/// policy call and one transaction per table and batch. A policy fault leaves the batch's
/// buckets queued (a stale or missing plan never acts) and is retried next pass.
async fn plan_buckets(engine: &Arc<Engine>, report: &mut PassReport) -> Result<()> {
    let policies = engine.policies();
    let now = engine.clock.now();
    let mut budget = RECONCILE_BUCKETS_PER_PASS_MAX;
    for table in policies.tables.keys() {
        while budget > 0 {
            let (store, id) = (engine.store.clone(), table.clone());
            if !blocking(move || store.reconcile_pending(&id, now)).await? {
                break;
            }
            let (store, id) = (engine.store.clone(), table.clone());
            let limit = budget.min(RECONCILE_BATCH_BUCKETS_MAX);
            let visited = blocking(move || store.reconcile_step(id, limit, now)).await?;
            report.reconciled += visited;
            budget = budget.saturating_sub(visited.max(1) as usize);
        }
    }
    let store = engine.store.clone();
    let ids = blocking(move || store.unplanned(PLAN_BUCKETS_PER_PASS_MAX)).await?;
    if ids.is_empty() {
        return Ok(());
    }
    for batch in ids.chunks(PLAN_BATCH_BUCKETS_MAX) {
        let (store, lookup) = (engine.store.clone(), batch.to_vec());
        let metas = blocking(move || {
            let snapshot = store.snapshot()?;
            let mut metas = Vec::with_capacity(lookup.len());
            for id in &lookup {
                metas.extend(snapshot.bucket(id)?);
            }
            Ok(metas)
        })
        .await?;
        // The plan queue is in key order, so a batch's buckets come table by table.
        for same_table in metas.chunk_by(|a, b| a.id.table == b.id.table) {
            let ids: Vec<BucketId> = same_table.iter().map(|m| m.id.clone()).collect();
            let Some(table) = policies.tables.get(&same_table[0].id.table).cloned() else {
                // No definition to plan with: the reconciliation that starts when the table
                // returns queues them again. Leaving them would stall the queue.
                let store = engine.store.clone();
                blocking(move || store.drop_unplannable(ids)).await?;
                continue;
            };
            let facts: Vec<BucketFacts> = same_table.iter().map(BucketMeta::facts).collect();
            let bases: Vec<PlanBasis> = facts
                .iter()
                .map(|f| PlanBasis {
                    policy: table.retention_identity.clone(),
                    facts: lifecycle::facts_digest(f),
                    planned_at: now,
                })
                .collect();
            let answers = blocking(move || Ok(table.retention.plan(now, &facts))).await?;
            let outcomes: Vec<(BucketId, PlanOutcome)> = match answers {
                Ok(plans) if plans.len() == ids.len() => ids
                    .into_iter()
                    .zip(plans.into_iter().zip(bases))
                    .map(|(id, (plan, basis))| (id, plan.map(|plan| (plan, basis))))
                    .collect(),
                Ok(plans) => {
                    let why = format!("answered {} plans for {} buckets", plans.len(), ids.len());
                    ids.into_iter().map(|id| (id, Err(why.clone()))).collect()
                }
                Err(e) => ids.into_iter().map(|id| (id, Err(e.to_string()))).collect(),
            };
            let planned = outcomes.iter().filter(|(_, o)| o.is_ok()).count() as u64;
            report.planned += planned;
            report.plan_failures += outcomes.len() as u64 - planned;
            let store = engine.store.clone();
            blocking(move || store.set_plans(outcomes, now)).await?;
        }
    }
    Ok(())
}

enum Outcome {
    Archived {
        rows: u64,
        bytes: u64,
    },
    Cleaned,
    Expired,
    Held,
    Deferred(String),
    NotClaimed,
    /// A finished expiry's tombstone, purged.
    Purged,
}

/// The lease renewal of one claim, driven by the injected clock: before each step, `check`
/// renews the lease when a renewal period has passed on the engine's clock since the last one
/// (so a simulation that advances the clock in the middle of a step renews, or loses, the
/// lease deterministically), and a background task does the same on a timer while one step
/// runs long in real time. Once a renewal fails, no further destructive step starts.
struct Heartbeat {
    lost: Arc<AtomicBool>,
    /// When the lease was last taken or renewed (engine clock).
    renewed_at: Arc<std::sync::atomic::AtomicI64>,
    renew: Arc<dyn Fn(Micros) -> Result<()> + Send + Sync>,
    engine: Arc<Engine>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Heartbeat {
    fn start(engine: &Arc<Engine>, id: BucketId, owner: String, generation: u64) -> Heartbeat {
        let lost = Arc::new(AtomicBool::new(false));
        let renewed_at = Arc::new(std::sync::atomic::AtomicI64::new(engine.clock.now()));
        let store = engine.store.clone();
        let lease_us = engine.settings.lease_us;
        let renew: Arc<dyn Fn(Micros) -> Result<()> + Send + Sync> = Arc::new(move |now| {
            crate::failpoints::hit("heartbeat")?;
            store.renew(id.clone(), owner.clone(), generation, now, lease_us).map(|_| ())
        });
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let period = std::time::Duration::from_micros(engine.settings.lease_renewal_us as u64);
        let task = {
            let (engine, lost, renewed_at, renew) = (engine.clone(), lost.clone(), renewed_at.clone(), renew.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stopped.changed() => return,
                        _ = tokio::time::sleep(period) => {}
                    }
                    let now = engine.clock.now();
                    let renew = renew.clone();
                    match blocking(move || renew(now)).await {
                        Ok(()) => renewed_at.store(now, Ordering::SeqCst),
                        Err(e) => {
                            tracing::warn!(error = %e, "lease renewal failed; no further destructive step will start");
                            lost.store(true, Ordering::SeqCst);
                            return;
                        }
                    }
                }
            })
        };
        Heartbeat { lost, renewed_at, renew, engine: engine.clone(), stop, task }
    }

    /// Before `step`: fails when a renewal has failed, and renews the lease first when it is
    /// due on the engine's clock.
    async fn check(&self, step: &str) -> Result<()> {
        let now = self.engine.clock.now();
        if !self.lost.load(Ordering::SeqCst)
            && now - self.renewed_at.load(Ordering::SeqCst) >= self.engine.settings.lease_renewal_us
        {
            let renew = self.renew.clone();
            match blocking(move || renew(now)).await {
                Ok(()) => self.renewed_at.store(now, Ordering::SeqCst),
                Err(e) => {
                    tracing::warn!(error = %e, step, "lease renewal failed; no further destructive step will start");
                    self.lost.store(true, Ordering::SeqCst);
                }
            }
        }
        self.check_held(step)
    }

    fn check_held(&self, step: &str) -> Result<()> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(Error::LeaseLost {
                bucket: String::new(),
                owner: String::new(),
                generation: 0,
                detail: format!("lease renewal failed before {step}"),
            });
        }
        Ok(())
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// One due bucket: a finished expiry's tombstone purged when its time has come, or the next
/// step of its archival or expiry.
async fn work_on(engine: &Arc<Engine>, owner: &str, meta: &BucketMeta, seconds: &mut PhaseSeconds) -> Result<Outcome> {
    if meta.state == BucketState::Expired {
        let (store, id, now) = (engine.store.clone(), meta.id.clone(), engine.clock.now());
        if blocking(move || store.purge_tombstone(id, now)).await? {
            return Ok(Outcome::Purged);
        }
    }
    archive_bucket(engine, owner, meta.id.clone(), seconds).await
}

async fn archive_bucket(
    engine: &Arc<Engine>,
    owner: &str,
    id: BucketId,
    seconds: &mut PhaseSeconds,
) -> Result<Outcome> {
    let policies = engine.policies();
    let Some(table) = policies.tables.get(&id.table).cloned() else {
        // The store knows the table has no definition: the claim takes the bucket out of
        // the due index (so it cannot stall other tables' work) and claims nothing.
        let (store, now) = (engine.store.clone(), engine.clock.now());
        let lease_us = engine.settings.lease_us;
        let (claim_id, claim_owner) = (id.clone(), owner.to_string());
        if let Some(meta) = blocking(move || store.claim(claim_id, claim_owner, now, lease_us)).await? {
            let store = engine.store.clone();
            let (owner, why) = (owner.to_string(), format!("table `{}` is not in the policy directory", id.table));
            let retry_at = now + engine.settings.retry_us;
            blocking(move || store.defer(id, owner, meta.generation, now, why, retry_at)).await?;
        }
        return Ok(Outcome::NotClaimed);
    };
    let now = engine.clock.now();
    let (store, claim_id, claim_owner, lease_us) =
        (engine.store.clone(), id.clone(), owner.to_string(), engine.settings.lease_us);
    let mut lap = Lap::start();
    let Some(meta) = blocking(move || store.claim(claim_id, claim_owner, now, lease_us)).await? else {
        return Ok(Outcome::NotClaimed);
    };
    seconds.add(Phase::Claim, lap.lap());
    let generation = meta.generation;
    let heartbeat = Heartbeat::start(engine, id.clone(), owner.to_string(), generation);
    let claimed = crate::failpoints::hit("after_claim");
    let span = tracing::info_span!("archive", bucket = %id, generation);
    let _enter = span.enter();
    let result = match (claimed, meta.state) {
        (Err(e), _) => Err(e),
        (Ok(()), BucketState::Archived { hot_deleted: true }) => {
            match expiry::expire(engine, &table, owner, &meta, &heartbeat).await {
                Ok(expiry::ExpiryOutcome::Expired) => Ok(Outcome::Expired),
                Ok(expiry::ExpiryOutcome::Held) => Ok(Outcome::Held),
                Err(e) => Err(e),
            }
        }
        (Ok(()), BucketState::Expired) => {
            let (store, tid) = (engine.store.clone(), id.clone());
            match blocking(move || store.tombstone(&tid)).await {
                Ok(Some(tombstone)) => {
                    expiry::finish(engine, &table, owner, generation, tombstone).await.map(|_| Outcome::Expired)
                }
                Ok(None) => Err(Error::Internal(format!("expired bucket {id} has no tombstone"))),
                Err(e) => Err(e),
            }
        }
        (Ok(()), BucketState::Archived { hot_deleted: false }) => {
            cleanup(engine, owner, &id, generation, &heartbeat, seconds).await.map(|_| Outcome::Cleaned)
        }
        (Ok(()), _) => match upload_and_publish(engine, &table, owner, &meta, &heartbeat, seconds).await {
            Ok((rows, bytes)) => cleanup(engine, owner, &id, generation, &heartbeat, seconds)
                .await
                .map(|_| Outcome::Archived { rows, bytes }),
            Err(e) => Err(e),
        },
    };
    heartbeat.stop().await;
    match result {
        Ok(outcome) => Ok(outcome),
        Err(e) => {
            // Before publication this defers the bucket (it stays fenced); after it, cleanup
            // stays pending. Either way the bucket is retried, never skipped.
            let why = e.to_string();
            tracing::warn!(error = %why, "deferring bucket");
            let store = engine.store.clone();
            let retry_at = engine.clock.now() + engine.settings.retry_us;
            let (owner, now) = (owner.to_string(), engine.clock.now());
            let why2 = why.clone();
            blocking(move || store.defer(id, owner, generation, now, why2, retry_at)).await?;
            Ok(Outcome::Deferred(why))
        }
    }
}

/// Snapshot, encode, upload, verify, manifest, publish, streamed: the rows are read and
/// encoded segment by segment (`pipeline`) while the previous segment is uploaded, read back
/// and verified. Each key is in the durable upload intent before its upload (invariant 10):
/// every segment's key is added to it as the segment comes, and the manifest's with the last
/// segment's. Returns rows and bytes archived.
async fn upload_and_publish(
    engine: &Arc<Engine>,
    table: &Arc<TablePolicy>,
    owner: &str,
    meta: &BucketMeta,
    heartbeat: &Heartbeat,
    seconds: &mut PhaseSeconds,
) -> Result<(u64, u64)> {
    let id = meta.id.clone();
    let generation = meta.generation;
    let (receiver, reader) = pipeline::start(engine.clone(), id.clone(), owner.to_string(), generation, table.format);
    let uploaded = upload_segments(engine, table, owner, meta, heartbeat, seconds, receiver).await;
    // The receiver is gone: a reader still running stops at its next segment.
    let read = reader.await.map_err(|e| Error::Internal(format!("the reader of bucket {id} failed: {e}")))?;
    let (segments, prepared) = uploaded?;
    let read = read?;
    seconds.add(Phase::Snapshot, read.snapshot_seconds);
    seconds.add(Phase::Encode, read.encode_seconds);
    let mut lap = Lap::start();
    let (manifest, manifest_bytes, manifest_key) = match prepared {
        Some(prepared) => prepared,
        None => {
            // No segment carried the summary: the bucket had no rows.
            let prepared = prepare_manifest(engine, table, meta, segments, read.summary)?;
            record_intent(engine, &id, generation, table, owner, vec![prepared.2.clone()]).await?;
            prepared
        }
    };
    lap.lap();
    heartbeat.check("the manifest upload").await?;
    let expected = manifest.clone();
    create_verified(table.backend.as_ref(), &manifest_key, manifest_bytes, None, |bytes| {
        let read = Manifest::from_bytes(bytes)?;
        if read != expected {
            return Err(Error::Corruption(format!(
                "manifest `{}` read back differs from what was written",
                manifest_key
            )));
        }
        Ok(())
    })
    .await?;
    crate::failpoints::hit("after_manifest")?;
    seconds.add(Phase::Manifest, lap.lap());
    heartbeat.check("publication").await?;
    crate::failpoints::hit("before_publish")?;
    let (rows_n, bytes_n) = (manifest.summary.rows, manifest.bytes);
    let (store, publish_owner, now) = (engine.store.clone(), owner.to_string(), engine.clock.now());
    let key = manifest_key.clone();
    blocking(move || store.publish(id, publish_owner, generation, now, manifest, key)).await?;
    seconds.add(Phase::Publish, lap.lap());
    crate::failpoints::hit("after_publish")?;
    tracing::info!(manifest = %manifest_key, rows = rows_n, bytes = bytes_n, "bucket published");
    Ok((rows_n, bytes_n))
}

/// A manifest ready to upload: the manifest, its bytes and its key.
type PreparedManifest = (Manifest, Bytes, String);

/// Uploads the segments `receiver` yields, in order, each after its key is in the upload
/// intent; verifies each read back. Returns the segments and, when the last one came, the
/// manifest made with it (its key already in the intent).
async fn upload_segments(
    engine: &Arc<Engine>,
    table: &Arc<TablePolicy>,
    owner: &str,
    meta: &BucketMeta,
    heartbeat: &Heartbeat,
    seconds: &mut PhaseSeconds,
    mut receiver: tokio::sync::mpsc::Receiver<pipeline::Encoded>,
) -> Result<(Vec<SegmentInfo>, Option<PreparedManifest>)> {
    let id = &meta.id;
    let prefix =
        keys::bucket_folder(table.layout(), &id.table, &engine.installation_id, &id.bucket_key, &id.partition_key);
    let writer = engine.writer()?;
    let mut segments: Vec<SegmentInfo> = Vec::new();
    let mut prepared = None;
    while let Some(pipeline::Encoded { segment, last }) = receiver.recv().await {
        let mut lap = Lap::start();
        let sha = sha256_hex(&segment.bytes);
        let sequence = segments.len();
        let key = keys::segment_key(&prefix, &writer, sequence, &sha, table.format.extension());
        let info = SegmentInfo {
            key: key.clone(),
            sha256: sha,
            bytes: segment.bytes.len() as u64,
            rows: segment.rows,
            min_event_time: segment.min_event_time,
            max_event_time: segment.max_event_time,
            summary: segment.summary,
        };
        segments.push(info.clone());
        let mut intent_keys = vec![key];
        if let Some(summary) = last {
            let manifest = prepare_manifest(engine, table, meta, segments.clone(), summary)?;
            intent_keys.push(manifest.2.clone());
            prepared = Some(manifest);
        }
        seconds.add(Phase::Encode, lap.lap());
        record_intent(engine, id, meta.generation, table, owner, intent_keys).await?;
        seconds.add(Phase::RecordIntent, lap.lap());
        heartbeat.check("a segment upload").await?;
        create_verified(table.backend.as_ref(), &info.key, Bytes::from(segment.bytes), Some(&mut *seconds), |bytes| {
            crate::failpoints::hit("after_segment_upload")?;
            // create_verified has compared the bytes with the payload and checked their hash
            // against the key; what is left is that they decode to the manifest's rows.
            crate::format::reader::check_segment_rows(table.format, &info, bytes)
        })
        .await?;
        crate::failpoints::hit("after_read_back")?;
    }
    Ok((segments, prepared))
}

/// The bucket's manifest over `segments` and the `summary` of all its rows.
fn prepare_manifest(
    engine: &Arc<Engine>,
    table: &Arc<TablePolicy>,
    meta: &BucketMeta,
    segments: Vec<SegmentInfo>,
    summary: crate::model::rows::RowSummary,
) -> Result<PreparedManifest> {
    let id = &meta.id;
    let manifest = Manifest {
        version: MANIFEST_VERSION,
        table: id.table.clone(),
        partition_key: String::from_utf8_lossy(&id.partition_key).into_owned(),
        bucket: meta.descriptor.clone(),
        strategy: format!("{} {}", table.strategy.identity().name, table.strategy.identity().fingerprint()),
        generation: meta.generation,
        format: table.format,
        schema: table.format.schema().to_string(),
        target: table.backend.target().to_string(),
        target_name: table.target_name.clone(),
        policy: meta.plan.clone(),
        summary,
        bytes: segments.iter().map(|s| s.bytes).sum(),
        segments,
        created_at: engine.clock.now(),
    };
    manifest.check_consistent()?;
    let bytes = Bytes::from(manifest.to_bytes());
    let prefix =
        keys::manifest_folder(table.layout(), &id.table, &engine.installation_id, &id.bucket_key, &id.partition_key);
    let key = keys::manifest_key(&prefix, &engine.writer()?, meta.generation, &sha256_hex(&bytes));
    Ok((manifest, bytes, key))
}

/// Adds `keys` to the durable upload intent of the bucket's generation (invariant 10: a key
/// is recorded before anything is uploaded under it).
async fn record_intent(
    engine: &Arc<Engine>,
    id: &BucketId,
    generation: u64,
    table: &Arc<TablePolicy>,
    owner: &str,
    keys: Vec<String>,
) -> Result<()> {
    let intent = UploadIntent {
        bucket: id.clone(),
        generation,
        target: table.backend.target().to_string(),
        keys,
        recorded_at: engine.clock.now(),
    };
    let (store, owner, now) = (engine.store.clone(), owner.to_string(), engine.clock.now());
    blocking(move || store.record_intent(intent, owner, now)).await
}

/// Creates `key` only if absent, then reads it back and verifies it. An existing object (a
/// retry, or an upload whose acknowledgement was lost) counts only if it is byte-identical;
/// an ambiguous failure is resolved by reading the object. With `seconds`, the upload, the
/// read back and the verification are timed into it.
async fn create_verified(
    backend: &dyn ArchiveBackend,
    key: &str,
    payload: Bytes,
    mut seconds: Option<&mut PhaseSeconds>,
    verify: impl Fn(&[u8]) -> Result<()>,
) -> Result<()> {
    let mut lap = Lap::start();
    let mut upload_error = None;
    match backend.put_create(key, payload.clone()).await {
        Ok(PutOutcome::Created) | Ok(PutOutcome::AlreadyExists) => {}
        Err(e) if e.is_retryable() => {
            tracing::warn!(key, error = %e, "upload outcome uncertain; reading the object back");
            upload_error = Some(e);
        }
        Err(e) => return Err(e),
    }
    if let Some(seconds) = seconds.as_deref_mut() {
        seconds.add(Phase::Upload, lap.lap());
    }
    let read = backend.get(key).await;
    // When the read fails too, the upload's error says more (an outage, a target not yet probed).
    let read = match (read, &upload_error) {
        (Err(read), Some(upload)) => Err(Error::StorageUnavailable(format!(
            "upload of `{key}` failed ({upload}), and so did reading it back ({read})"
        ))),
        (read, _) => read,
    };
    let stored = read?.ok_or_else(|| match upload_error {
        Some(e) => Error::StorageUnavailable(format!("object `{key}` is absent after an upload that failed: {e}")),
        None => Error::StorageUnavailable(format!("object `{key}` is absent after its upload")),
    })?;
    if let Some(seconds) = seconds.as_deref_mut() {
        seconds.add(Phase::ReadBack, lap.lap());
    }
    if stored != payload {
        return Err(Error::Corruption(format!(
            "object `{key}` read back ({} bytes, sha256 {}) differs from what was written ({} bytes, sha256 {}); it is never overwritten",
            stored.len(),
            sha256_hex(&stored),
            payload.len(),
            sha256_hex(&payload)
        )));
    }
    keys::check_content_address(key, &sha256_hex(&stored))?;
    let verified = verify(&stored);
    if let Some(seconds) = seconds {
        seconds.add(Phase::Verify, lap.lap());
    }
    verified
}

async fn cleanup(
    engine: &Arc<Engine>,
    owner: &str,
    id: &BucketId,
    generation: u64,
    heartbeat: &Heartbeat,
    seconds: &mut PhaseSeconds,
) -> Result<u64> {
    heartbeat.check("cleanup").await?;
    let mut lap = Lap::start();
    // Slice by slice, each its own fenced transaction, so appends interleave; the lease is
    // checked (and renewed when due) on the engine's clock before each. The first slice proves
    // the rows are the manifest's before it deletes any (invariant 9).
    let mut deleted = 0;
    loop {
        heartbeat.check("cleanup").await?;
        let (store, bucket, worker, now) = (engine.store.clone(), id.clone(), owner.to_string(), engine.clock.now());
        let slice_rows = engine.settings.cleanup_slice_rows;
        let slice = blocking(move || store.cleanup_slice(&bucket, &worker, generation, now, slice_rows)).await?;
        deleted += slice.deleted;
        if slice.finished {
            break;
        }
    }
    seconds.add(Phase::Cleanup, lap.lap());
    tracing::info!(rows = deleted, "hot rows deleted");
    Ok(deleted)
}

/// The backend of the target a published bucket's archive was written to, from the copy of
/// its manifest in the store (not the table's current target, which a reload may have moved).
pub async fn recorded_backend(
    engine: &Arc<Engine>,
    policies: &PolicySet,
    table: &TablePolicy,
    id: &BucketId,
) -> Result<Arc<dyn ArchiveBackend>> {
    let (store, lookup) = (engine.store.clone(), id.clone());
    let manifest = blocking(move || store.latest_manifest(&lookup))
        .await?
        .ok_or_else(|| Error::Internal(format!("bucket {id} has no recorded manifest")))?;
    policies.archive_backend(table, &manifest.archive_target())
}

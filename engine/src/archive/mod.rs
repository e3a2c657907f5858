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
//!
//! Here: the pass (`run_pass`) and its planning; one bucket's steps in `bucket`; what a pass
//! reports in `report`. Every function takes the pass's `Context`, never the `Engine`.

pub mod adopt;
mod bucket;
pub mod catalog;
#[cfg(feature = "delta")]
pub mod delta;
pub mod erase;
pub mod expiry;
pub mod fleet_erase;
pub mod outbox;
mod pipeline;
mod report;
pub mod sweep;
pub mod verify;

use std::sync::Arc;

use futures::StreamExt as _;

use self::bucket::{Outcome, work_on};
use self::report::Lap;
pub use self::report::{DeferralReason, PassErrorKind, PassReport, Phase, PhaseSeconds};
pub use crate::format::reader::{read_archive, read_manifest, read_segment, verify_segment};

use crate::engine::{Context, PreviousWork};
use crate::error::{Error, Result};
use crate::model::lifecycle::{self, PlanBasis};
use crate::model::{BucketFacts, BucketState, Micros};
use crate::policy::{PolicySet, TablePolicy};
use crate::storage::ArchiveBackend;
use crate::store::PlanOutcome;
use crate::store::schema::{BucketId, BucketMeta};

/// Buckets planned per pass at most, so a pass after a large ingest still reaches due work.
pub const PLAN_BUCKETS_PER_PASS_MAX: usize = 10_000;
/// The least time a pass may spend reconciling and planning after a pass that left no backlog
/// (the engine then waits its interval anyway, so planning takes nothing from archival). One
/// reconciliation step and one plan batch are always made, however long they take.
pub const PLAN_TIME_FLOOR_US: Micros = 500_000;
/// What the first pass of a life may spend reconciling and planning before it archives: a
/// start archives before it re-plans a large store, and a life killed within a second of its
/// start still archives something.
pub const PLAN_TIME_FIRST_PASS_US: Micros = 100_000;
/// While a backlog drains, a pass plans for at most this share of the due work before it
/// (numerator, denominator): archival keeps at least two thirds of the time.
pub const PLAN_SHARE_OF_BACKLOG: (Micros, Micros) = (1, 2);
/// Buckets planned per retention-policy call and store transaction.
pub const PLAN_BATCH_BUCKETS_MAX: usize = crate::plugin::retention::RETENTION_BATCH_BUCKETS_MAX;

/// Runs one pass: plan, then due work (cleanups first), at most `scan_limit` buckets.
pub async fn run_pass(ctx: &Arc<Context>, owner: &str) -> Result<PassReport> {
    let started = std::time::Instant::now();
    let mut report = PassReport::default();
    let mut lap = Lap::start();
    // The epoch is recorded here, off the async threads, before any key is made with it.
    let recorder = ctx.clone();
    blocking(move || recorder.writer().map(drop)).await?;
    let previous = *ctx.memory().planning.lock().expect("planning lock");
    plan_buckets(ctx, plan_budget(previous.previous_work), &mut report).await?;
    report.seconds.add(Phase::Plan, lap.lap());
    // Erasure requests first: those other installations placed on a shared target join this
    // store's (when it shares them), and an archive they name becomes due in this pass.
    if ctx.fleet_key().is_some() {
        for error in fleet_erase::exchange(ctx).await.1 {
            report.error(PassErrorKind::Erasure, error);
        }
    }
    erase_step(ctx, &mut report).await;
    report.seconds.add(Phase::Erasure, lap.lap());
    // Outbox delivery runs before discovery; a sink that is down never blocks archival.
    match outbox::deliver(ctx).await {
        Ok(n) => report.outbox_delivered = n,
        Err(e) => report.error(PassErrorKind::Outbox, format!("outbox: {e}")),
    }
    report.seconds.add(Phase::Outbox, lap.lap());
    let now = ctx.clock.now();
    let work_started = now;
    let store = ctx.store.clone();
    let limit = ctx.settings.scan_limit;
    let due = blocking(move || {
        // A table an ingest is backfilling waits for it (`store::backfill`).
        let backfilling = store.backfilling_tables(now)?;
        store.due_work(now, limit, &backfilling)
    })
    .await?;
    // Due under plans a policy change made stale: queued for new plans, not claimed.
    for batch in due.stale.chunks(RECONCILE_BATCH_BUCKETS_MAX) {
        let (store, ids) = (ctx.store.clone(), batch.to_vec());
        blocking(move || store.reconcile_buckets(ids, now)).await?;
        report.reconciled += batch.len() as u64;
    }
    let mut metas = due.ready;
    // Pending cleanups first: a failing discovery or upload must not starve them.
    metas.sort_by_key(|m| !matches!(m.state, BucketState::Archived { hot_deleted: false }));
    let due_work = !metas.is_empty();
    report.seconds.add(Phase::Discover, lap.lap());
    let awaiting_log = work_on_all(ctx, owner, metas, &mut report).await?;
    let work_micros = ctx.clock.now() - work_started;
    // The catalogs are derived from the manifests; refresh them when archives changed.
    if report.archived + report.expired + awaiting_log.len() as u64 > 0 {
        lap.lap();
        // A table with a Delta log has no catalog: its log lists its files, for every
        // installation that shares the target (each catalog would list one installation's).
        for (table, policy) in &ctx.policies.clone().tables {
            if policy.delta_log() {
                continue;
            }
            if let Err(e) = catalog::write(ctx, table).await {
                report.error(PassErrorKind::Catalog, format!("catalog of `{table}`: {e}"));
            }
        }
        report.seconds.add(Phase::Catalog, lap.lap());
    }
    // The Delta logs too, and any whose last sync failed or that this process has not synced.
    #[cfg(feature = "delta")]
    {
        lap.lap();
        let changed = report.archived + report.expired + awaiting_log.len() as u64 > 0;
        for table in ctx.policies.clone().tables.values() {
            match delta::sync_if_needed(ctx, table, changed).await {
                Some(Ok(sync)) => {
                    report.delta_buckets_read += sync.buckets_read as u64;
                    report.delta_files_compared += sync.files_compared as u64;
                    report.delta_commit_retries += sync.retried_commits as u64;
                }
                Some(Err(e)) => report.error(PassErrorKind::DeltaLog, format!("Delta log of `{}`: {e}", table.id)),
                None => {}
            }
        }
        report.seconds.add(Phase::DeltaLog, lap.lap());
    }
    // A table whose changes are dropped also loses what its syncs kept: should it have a log
    // again (a reload), its next sync starts from every manifest, not from changes never kept.
    // (A Delta sync's drop takes the table's catalog cursor with it, for the same reason.)
    #[cfg(feature = "delta")]
    {
        let with_log: std::collections::BTreeSet<&String> =
            ctx.policies.tables.values().filter(|t| t.delta_log()).map(|t| &t.id).collect();
        ctx.memory().delta_locks.lock().expect("delta sync locks").retain(|table, _| with_log.contains(table));
    }
    // The store lists the buckets whose publication changed for the Delta syncs and the
    // catalog writes; a table no longer defined has nobody to read its list.
    let read: std::collections::BTreeSet<String> = ctx.policies.tables.keys().cloned().collect();
    let store = ctx.store.clone();
    if let Err(e) = blocking(move || store.drop_unread_publication_changes(&read)).await {
        report.error(PassErrorKind::DeltaLog, format!("publication changes: {e}"));
    }
    // The expiries that waited for the sync above delete their objects now (a failed sync
    // leaves them waiting for the next pass's).
    if !awaiting_log.is_empty() {
        let metas = bucket_metas(ctx, awaiting_log).await?;
        let still_waiting = work_on_all(ctx, owner, metas, &mut report).await?;
        report.expiries_awaiting_log = still_waiting.len() as u64;
    }
    // And again once this pass's generations are published, cleaned and in the Delta log:
    // what they replaced is deleted now.
    lap.lap();
    erase_step(ctx, &mut report).await;
    report.seconds.add(Phase::Erasure, lap.lap());
    // A failed reference check stops the sweep before it deletes anything.
    match sweep::sweep_if_due(ctx).await {
        Ok(Some(swept)) => report.orphans_deleted = swept.deleted,
        Ok(None) => {}
        Err(e) => report.error(PassErrorKind::Sweep, format!("orphan sweep stopped: {e}")),
    }
    report.seconds.add(Phase::Sweep, lap.lap());
    report.wall_seconds = started.elapsed().as_secs_f64();
    // What paces the next pass's planning: whether this one leaves a backlog is decided as the
    // daemon decides whether the next pass follows at once (`PassReport::leaves_backlog`).
    *ctx.memory().planning.lock().expect("planning lock") = crate::engine::Planning {
        previous_work: if due_work {
            PreviousWork::Took { micros: work_micros, backlog: report.leaves_backlog(limit) }
        } else {
            PreviousWork::NothingDue
        },
        planned: report.planned,
    };
    Ok(report)
}

/// Works on `metas`, up to `archive_concurrency` buckets at once, each its own task under its
/// own lease and fence (started in the given order); the store's single writer orders their
/// transactions. Adds what each did to `report`; returns the expiries whose deletes wait for
/// their table's Delta log.
async fn work_on_all(
    ctx: &Arc<Context>,
    owner: &str,
    metas: Vec<BucketMeta>,
    report: &mut PassReport,
) -> Result<Vec<BucketId>> {
    let mut awaiting_log = Vec::new();
    let mut outcomes = futures::stream::iter(metas)
        .map(|meta| {
            let (ctx, owner, id) = (ctx.clone(), owner.to_string(), meta.id.clone());
            let task = tokio::spawn(async move {
                let mut seconds = PhaseSeconds::default();
                let outcome = work_on(&ctx, &owner, &meta, &mut seconds).await;
                (outcome, seconds)
            });
            async move { (id, task.await) }
        })
        .buffer_unordered(ctx.settings.archive_concurrency.max(1));
    while let Some((id, joined)) = outcomes.next().await {
        // A task that panicked fails its bucket, not the pass: the other buckets' tasks run
        // on and are counted, and the bucket is deferred like any failed one.
        let (outcome, seconds) = match joined {
            Ok(done) => done,
            Err(e) => {
                let why = format!("its archival task failed: {e}");
                if let Err(e) = defer_abandoned(ctx, owner, &id, &why).await {
                    report.error(PassErrorKind::Bucket, format!("{id}: deferring it: {e}"));
                }
                report.deferral(DeferralReason::TaskPanicked);
                report.error(PassErrorKind::Bucket, format!("{id}: {why}"));
                continue;
            }
        };
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
            Ok(Outcome::ExpiryAwaitsLog) => awaiting_log.push(id),
            Ok(Outcome::Held) => report.held += 1,
            Ok(Outcome::Purged) => report.tombstones_purged += 1,
            Ok(Outcome::Deferred(why, reason)) => {
                report.deferral(reason);
                report.error(PassErrorKind::Bucket, format!("{id}: {why}"));
            }
            Ok(Outcome::NotClaimed) => {}
            Err(e) => report.error(PassErrorKind::Bucket, format!("{id}: {e}")),
        }
    }
    Ok(awaiting_log)
}

/// Defers a bucket whose task ended without an outcome (it panicked): if this owner's claim
/// still holds it, the claim is released as a deferral, so the bucket is retried after the
/// retry delay rather than once the lease runs out. Passes of one owner never overlap, so the
/// claim can only be the task's.
async fn defer_abandoned(ctx: &Arc<Context>, owner: &str, id: &BucketId, why: &str) -> Result<()> {
    let (store, lookup) = (ctx.store.clone(), id.clone());
    let Some(meta) = blocking(move || store.bucket(&lookup)).await? else {
        return Ok(());
    };
    if meta.lease_owner.as_deref() != Some(owner) {
        return Ok(());
    }
    let (store, id, owner, why) = (ctx.store.clone(), id.clone(), owner.to_string(), why.to_string());
    let (now, retry_at) = (ctx.clock.now(), ctx.clock.now() + ctx.settings.retry_us);
    blocking(move || store.defer(id, owner, meta.generation, now, why, retry_at)).await
}

/// One step of every open erasure request (`erase::carry_out`); a failure is the pass's error
/// and is retried by the next pass.
async fn erase_step(ctx: &Arc<Context>, report: &mut PassReport) {
    match erase::carry_out(ctx).await {
        Ok(done) => report.erasure_buckets_done += done,
        Err(e) => report.error(PassErrorKind::Erasure, format!("erasure: {e}")),
    }
}

/// The buckets `ids` names, as one snapshot of the store has them (a forgotten one is left out).
async fn bucket_metas(ctx: &Arc<Context>, ids: Vec<BucketId>) -> Result<Vec<BucketMeta>> {
    let store = ctx.store.clone();
    blocking(move || {
        let snapshot = store.snapshot()?;
        let mut metas = Vec::with_capacity(ids.len());
        for id in &ids {
            metas.extend(snapshot.bucket(id)?);
        }
        Ok(metas)
    })
    .await
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

/// How long a pass may reconcile and plan, given what the previous pass of its life did.
/// While a backlog drains (the previous pass left one, `PassReport::leaves_backlog`, and the
/// next follows at once), at most `PLAN_SHARE_OF_BACKLOG` of the due work it did: so after a
/// policy change a pass still archives at least two thirds as fast as it would without one
/// (less the one step and batch always made, which matter only when the due work is tiny).
/// After a pass that left no backlog, as long as its due work took, `PLAN_TIME_FLOOR_US` at
/// least (the engine then waits its interval anyway). The first pass of a life, `PLAN_TIME_FIRST_PASS_US` (a
/// start archives before it re-plans a large store). After a pass that found nothing due, up
/// to the caps only, as planning is then all there is to do. One reconciliation step and one
/// plan batch are made whatever the budget.
pub(crate) fn plan_budget(previous: PreviousWork) -> Option<Micros> {
    let (share, of) = PLAN_SHARE_OF_BACKLOG;
    match previous {
        PreviousWork::NoPassYet => Some(PLAN_TIME_FIRST_PASS_US),
        PreviousWork::NothingDue => None,
        PreviousWork::Took { micros, backlog: true } => Some(micros * share / of),
        PreviousWork::Took { micros, backlog: false } => Some(micros.max(PLAN_TIME_FLOOR_US)),
    }
}

/// Re-decides retention, within `time_budget` (`plan_budget`) on the engine's clock: first
/// advances each table's reconciliation (after a reload that changed its retention policy or
/// the cutoff, when a table returns, and periodically), which queues every bucket whose plan
/// is stale, oldest end first; then asks each table's retention policy for a plan for the
/// queued buckets (new ones, and those whose facts or policy changed), oldest end first, in
/// batches: one policy call and one transaction per table and batch. A policy fault leaves the
/// batch's buckets queued (a stale or missing plan never acts) and is retried next pass.
async fn plan_buckets(ctx: &Arc<Context>, time_budget: Option<Micros>, report: &mut PassReport) -> Result<()> {
    let policies = ctx.policies.clone();
    let now = ctx.clock.now();
    let deadline = time_budget.map(|budget| now.saturating_add(budget));
    let out_of_time = || deadline.is_some_and(|deadline| ctx.clock.now() >= deadline);
    let mut budget = RECONCILE_BUCKETS_PER_PASS_MAX;
    let mut reconciled_once = false;
    for table in policies.tables.keys() {
        while budget > 0 && !(reconciled_once && out_of_time()) {
            let (store, id) = (ctx.store.clone(), table.clone());
            if !blocking(move || store.reconcile_pending(&id, now)).await? {
                break;
            }
            let (store, id) = (ctx.store.clone(), table.clone());
            let limit = budget.min(RECONCILE_BATCH_BUCKETS_MAX);
            let visited = blocking(move || store.reconcile_step(id, limit, now)).await?;
            reconciled_once = true;
            report.reconciled += visited;
            budget = budget.saturating_sub(visited.max(1) as usize);
        }
    }
    let store = ctx.store.clone();
    let ids = blocking(move || store.unplanned(PLAN_BUCKETS_PER_PASS_MAX)).await?;
    if ids.is_empty() {
        return Ok(());
    }
    for (index, batch) in ids.chunks(PLAN_BATCH_BUCKETS_MAX).enumerate() {
        if index > 0 && out_of_time() {
            break;
        }
        let mut metas = bucket_metas(ctx, batch.to_vec()).await?;
        // The queue is in order of the buckets' ends: one policy call per table of the batch.
        metas.sort_by(|a, b| a.id.table.cmp(&b.id.table));
        for same_table in metas.chunk_by(|a, b| a.id.table == b.id.table) {
            let ids: Vec<BucketId> = same_table.iter().map(|m| m.id.clone()).collect();
            let Some(table) = policies.tables.get(&same_table[0].id.table).cloned() else {
                // No definition to plan with: the reconciliation that starts when the table
                // returns queues them again. Leaving them would stall the queue.
                let store = ctx.store.clone();
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
            let store = ctx.store.clone();
            blocking(move || store.set_plans(outcomes, now)).await?;
        }
    }
    Ok(())
}

/// The backend of the target a published bucket's archive was written to, from the copy of
/// its manifest in the store (not the table's current target, which a reload may have moved).
pub async fn recorded_backend(
    ctx: &Arc<Context>,
    policies: &PolicySet,
    table: &TablePolicy,
    id: &BucketId,
) -> Result<Arc<dyn ArchiveBackend>> {
    let (store, lookup) = (ctx.store.clone(), id.clone());
    let manifest = blocking(move || store.latest_manifest(&lookup))
        .await?
        .ok_or_else(|| Error::Internal(format!("bucket {id} has no recorded manifest")))?;
    policies.archive_backend(table, &manifest.archive_target())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planning_takes_at_most_half_the_due_work_while_a_backlog_drains() {
        // A start archives before it re-plans a large store: a tenth of a second, not the floor.
        assert_eq!(plan_budget(PreviousWork::NoPassYet), Some(PLAN_TIME_FIRST_PASS_US));
        const { assert!(PLAN_TIME_FIRST_PASS_US < PLAN_TIME_FLOOR_US) };
        // Passes back to back through a backlog: half the due work before, however short it
        // was (the floor would make a pass of 300 ms of archival plan for 500).
        assert_eq!(plan_budget(PreviousWork::Took { micros: 300_000, backlog: true }), Some(150_000));
        assert_eq!(plan_budget(PreviousWork::Took { micros: 7_000_000, backlog: true }), Some(3_500_000));
        // No backlog: the engine waits its interval anyway; the floor, or as long as it took.
        assert_eq!(plan_budget(PreviousWork::Took { micros: 1_000, backlog: false }), Some(PLAN_TIME_FLOOR_US));
        assert_eq!(plan_budget(PreviousWork::Took { micros: 7_000_000, backlog: false }), Some(7_000_000));
        // Nothing was due: planning is all there is to do (bounded by the bucket caps).
        assert_eq!(plan_budget(PreviousWork::NothingDue), None);
    }

    #[test]
    fn a_pass_leaves_a_backlog_only_when_it_took_its_scan_limit_without_an_error() {
        let full = PassReport { archived: 64, cleaned: 64, ..PassReport::default() };
        assert!(full.leaves_backlog(64));
        assert!(!full.leaves_backlog(65));
        // A target down defers every bucket quickly: the daemon waits its interval, so the
        // next pass plans as after no backlog (the floor), not for half a few milliseconds.
        let mut failing = PassReport { deferred: 64, planned: 1, ..PassReport::default() };
        failing.error(PassErrorKind::Bucket, "target unreachable".into());
        assert!(!failing.leaves_backlog(64));
    }
}

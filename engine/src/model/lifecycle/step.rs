//! The one lifecycle step: what each thing that happens to a bucket does to its lifecycle (its
//! state, lease, fencing generation, retry time, due time, and whether it waits for a plan).
//! The store loads a bucket, asks `apply`, and saves the answer in the same transaction
//! (`store::record_step`): no other code changes a bucket's state or its due-index entry, so
//! every change passes the state machine's check and every due time is chosen here.

use super::{BucketView, claimable, next_due};
use crate::model::{BucketState, Micros, invariants};

/// Something that happens to a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<'a> {
    /// A worker takes the lease for the step `claimable` grants (a hot bucket becomes
    /// `Archiving`). The generation moves on: it is the fencing token. Due again when the lease
    /// runs out, so another worker takes over if this one dies.
    Claim { owner: &'a str, lease_until: Micros },
    /// The lease holder extends its lease.
    Renew { lease_until: Micros },
    /// A record is appended to a cleaned archive (a late record, a backfill): it waits in the
    /// hot store beside the archive, and the next archival, due at `republish_at` (the late
    /// grace after the first such record: those that follow join it), publishes a generation
    /// that holds both.
    LateRecord { republish_at: Micros },
    /// An erasure request matches the cleaned archive (or one waiting for its next generation):
    /// its next generation, without the erased records, is due at once (no late grace).
    Erase,
    /// The read cut-over: `Archiving` becomes `Archived{hot_deleted:false}`. The cleanup is due
    /// at once, and stays due if the worker dies.
    Publish,
    /// A failure before publication: the lease is released and the step is retried then.
    Defer { retry_at: Micros },
    /// The last hot row of a published bucket is deleted. Next: the archive's expiry, as its
    /// plan (made again with the archived facts) says.
    HotRowsDeleted,
    /// A verified archive found on a target stands in for the bucket (`frostline adopt`); the
    /// store has dropped the bucket's plan, which the policy makes again with the archive's facts.
    Adopt,
    /// An expiry's tombstone is written: the bucket is `Expired` before any object is deleted.
    /// Due when the lease runs out (another worker finishes the expiry).
    BeginExpiry,
    /// Every object of the expired archive is proved absent; the tombstone is purged from then.
    CompleteExpiry { purge_at: Micros },
    /// Another copy of the data directory expired the archive: recorded as an expiry completed
    /// (rows appended beside it since go with it).
    ArchiveGone { purge_at: Micros },
    /// Another copy started deleting the archive this copy began to expire: finish it now.
    DeletingElsewhere,
    /// A tombstone's purge waits for the sinks that have not taken its events yet.
    PurgeWaits { retry_at: Micros },
    /// The tombstone is purged: the lifecycle is over.
    TombstonePurged,
    /// Holds cover the bucket: its expiry is parked until they are lifted. `release_lease`: the
    /// expiring worker found them and gives its lease up.
    Park { release_lease: bool },
    /// A hold placed after the tombstone but before the first delete call: the expiry is called
    /// off, the bucket is `Archived` again under a new generation (fencing the expiring worker
    /// out) and parked.
    CallOffExpiry,
    /// Nothing happened to the bucket itself, but what its due time depends on may have (a new
    /// plan, a hold lifted, a policy change, the table's definition gone): decide it again.
    Reconcile,
}

impl Step<'_> {
    /// The states a step can happen in (`claimable` decides further for a claim).
    fn applies_to(&self, state: BucketState) -> bool {
        use BucketState::*;
        match self {
            Step::Claim { .. } | Step::Renew { .. } | Step::Defer { .. } | Step::Reconcile => true,
            // A publication retried under the same lease finds it done.
            Step::Publish => matches!(state, Archiving | Archived { hot_deleted: false }),
            Step::HotRowsDeleted => state == Archived { hot_deleted: false },
            Step::LateRecord { .. } => state == Archived { hot_deleted: true },
            Step::Erase => matches!(state, Archived { hot_deleted: true } | ArchivedPending),
            // An unknown bucket is recorded as the archive it adopts.
            Step::Adopt => matches!(state, Hot | Archiving | Archived { hot_deleted: true } | ArchivedPending),
            Step::BeginExpiry | Step::Park { .. } => state == Archived { hot_deleted: true },
            // Also with rows beside the archive, a next generation that cannot be made without
            // it, or a cleanup of the rows it holds that the other copy finished first.
            Step::ArchiveGone { .. } => matches!(state, Archived { .. } | ArchivedPending | Archiving),
            Step::CompleteExpiry { .. }
            | Step::DeletingElsewhere
            | Step::PurgeWaits { .. }
            | Step::TombstonePurged
            | Step::CallOffExpiry => state == Expired,
        }
    }
}

/// What a step does to the bucket's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease<'a> {
    Keep,
    Take { owner: &'a str, until: Micros },
    Extend { until: Micros },
    Release,
}

/// The lifecycle of a bucket after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition<'a> {
    pub state: BucketState,
    pub lease: Lease<'a>,
    /// The generation moves on (the fencing token).
    pub fence: bool,
    pub next_retry_at: Option<Micros>,
    /// The bucket's due-index entry; `None`: nothing is scheduled.
    pub due_at: Option<Micros>,
    /// The bucket waits for a (new) retention plan: the store queues it for one.
    pub needs_plan: bool,
}

/// Decides what `step` does to the bucket `view` describes at `now`. Refuses (changing
/// nothing) a claim `claimable` does not grant and a state change the state machine does not
/// have (`invariants::transition_is_allowed`).
pub fn apply<'a>(view: &BucketView<'_>, step: Step<'a>, now: Micros) -> Result<Transition<'a>, String> {
    use BucketState::*;
    if !step.applies_to(view.state) {
        return Err(format!("{step:?} does not apply to a {} bucket", view.state));
    }
    let at = |state: BucketState, due_at: Option<Micros>| Transition {
        state,
        lease: Lease::Keep,
        fence: false,
        next_retry_at: view.next_retry_at,
        due_at,
        needs_plan: false,
    };
    let transition = match step {
        Step::Claim { owner, lease_until } => {
            claimable(view, now).map_err(|why| format!("a {} bucket cannot be claimed now ({why:?})", view.state))?;
            let state = if matches!(view.state, Hot | ArchivedPending) { Archiving } else { view.state };
            Transition {
                lease: Lease::Take { owner, until: lease_until },
                fence: true,
                next_retry_at: None,
                ..at(state, Some(lease_until))
            }
        }
        Step::Renew { lease_until } => {
            Transition { lease: Lease::Extend { until: lease_until }, ..at(view.state, Some(lease_until)) }
        }
        Step::LateRecord { republish_at } => settle(
            view,
            // Fenced: an expiry claimed before the record came can no longer begin.
            Transition {
                lease: Lease::Release,
                fence: true,
                next_retry_at: (republish_at > now).then_some(republish_at),
                ..at(ArchivedPending, None)
            },
            now,
        ),
        // Fenced like a late record; the retry time is now, so `claimable` grants it at once.
        Step::Erase => settle(
            view,
            Transition { lease: Lease::Release, fence: true, next_retry_at: None, ..at(ArchivedPending, None) },
            now,
        ),
        Step::Publish => at(Archived { hot_deleted: false }, Some(now)),
        Step::Defer { retry_at } => {
            Transition { lease: Lease::Release, next_retry_at: Some(retry_at), ..at(view.state, Some(retry_at)) }
        }
        Step::HotRowsDeleted => {
            settle(view, Transition { lease: Lease::Release, ..at(Archived { hot_deleted: true }, None) }, now)
        }
        Step::Adopt => settle(
            view,
            Transition { lease: Lease::Release, next_retry_at: None, ..at(Archived { hot_deleted: true }, None) },
            now,
        ),
        Step::BeginExpiry => at(Expired, Some(view.lease_expires_at)),
        Step::CompleteExpiry { purge_at } | Step::ArchiveGone { purge_at } => {
            Transition { lease: Lease::Release, ..at(Expired, Some(purge_at)) }
        }
        Step::DeletingElsewhere => at(view.state, Some(now)),
        Step::PurgeWaits { retry_at } => at(view.state, Some(retry_at)),
        Step::TombstonePurged => at(view.state, None),
        Step::Park { release_lease } => {
            Transition { lease: if release_lease { Lease::Release } else { Lease::Keep }, ..at(view.state, None) }
        }
        Step::CallOffExpiry => Transition {
            lease: Lease::Release,
            fence: true,
            next_retry_at: None,
            ..at(Archived { hot_deleted: true }, None)
        },
        Step::Reconcile => settle(view, at(view.state, None), now),
    };
    if transition.state != view.state {
        invariants::transition_is_allowed(view.state, transition.state)?;
    }
    Ok(transition)
}

/// Completes a transition whose due time follows from the plan: the due index gets what
/// `next_due` says of the bucket after the step, and a bucket whose next step its plan decides
/// (archive a hot bucket, expire a cleaned archive) waits for a plan when its plan is stale or
/// old. A table without a definition schedules nothing.
fn settle<'a>(view: &BucketView<'_>, mut transition: Transition<'a>, now: Micros) -> Transition<'a> {
    let released = transition.lease == Lease::Release;
    let after = BucketView {
        state: transition.state,
        lease_owner: if released { None } else { view.lease_owner },
        lease_expires_at: if released { now } else { view.lease_expires_at },
        next_retry_at: transition.next_retry_at,
        ..*view
    };
    let planned_by_policy = matches!(after.state, BucketState::Hot | BucketState::Archived { hot_deleted: true });
    transition.needs_plan = after.managed && planned_by_policy && (!after.plan_current || after.plan_refresh_due);
    transition.due_at = if after.managed { next_due(&after, now) } else { None };
    transition
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RetentionPlan;
    use crate::model::lifecycle::ExpiryProgress;
    use crate::model::lifecycle::tests::view;

    const NOW: Micros = 1_000_000_000;

    #[test]
    fn a_bucket_goes_from_hot_to_purged_through_one_function() {
        let plan = RetentionPlan { archive_at: Some(NOW - 1), expire_at: Some(NOW + 10), reason: "t".into() };
        let hot = view(BucketState::Hot, Some(&plan));
        let claim = apply(&hot, Step::Claim { owner: "w", lease_until: NOW + 5 }, NOW).unwrap();
        assert_eq!((claim.state, claim.due_at, claim.fence), (BucketState::Archiving, Some(NOW + 5), true));
        assert_eq!(claim.lease, Lease::Take { owner: "w", until: NOW + 5 });

        let archiving =
            BucketView { lease_owner: Some("w"), lease_expires_at: NOW + 5, ..view(claim.state, Some(&plan)) };
        let published = apply(&archiving, Step::Publish, NOW).unwrap();
        assert_eq!((published.state, published.due_at), (BucketState::Archived { hot_deleted: false }, Some(NOW)));

        let pending = BucketView { state: published.state, ..archiving };
        let cleaned = apply(&pending, Step::HotRowsDeleted, NOW).unwrap();
        assert_eq!(cleaned.state, BucketState::Archived { hot_deleted: true });
        assert_eq!((cleaned.lease, cleaned.due_at, cleaned.needs_plan), (Lease::Release, Some(NOW + 10), false));
        // Being archived is a fact the policy sees: with the plan stale, the expiry waits for one.
        let stale = BucketView { plan_current: false, ..pending };
        let cleaned = apply(&stale, Step::HotRowsDeleted, NOW).unwrap();
        assert_eq!((cleaned.due_at, cleaned.needs_plan), (None, true));

        let archived = view(BucketState::Archived { hot_deleted: true }, Some(&plan));
        assert!(apply(&archived, Step::Claim { owner: "w", lease_until: NOW + 5 }, NOW).is_err(), "not due yet");
        let due = NOW + 10;
        let expiring = apply(&archived, Step::Claim { owner: "w", lease_until: due + 5 }, due).unwrap();
        assert_eq!(expiring.state, archived.state, "an expiry claim does not change the state");
        let leased = BucketView { lease_owner: Some("w"), lease_expires_at: due + 5, ..archived };
        let begun = apply(&leased, Step::BeginExpiry, due).unwrap();
        assert_eq!((begun.state, begun.due_at), (BucketState::Expired, Some(due + 5)));
        let expired = BucketView { state: BucketState::Expired, ..leased };
        let done = apply(&expired, Step::CompleteExpiry { purge_at: due + 100 }, due).unwrap();
        assert_eq!((done.lease, done.due_at), (Lease::Release, Some(due + 100)));
        assert_eq!(apply(&expired, Step::TombstonePurged, due + 100).unwrap().due_at, None);
    }

    #[test]
    fn an_erasure_sends_an_archive_to_its_next_generation_at_once_even_within_a_late_grace() {
        let plan = RetentionPlan { archive_at: Some(NOW - 10), expire_at: Some(NOW - 1), reason: "t".into() };
        let expiring = BucketView {
            lease_owner: Some("expirer"),
            lease_expires_at: NOW + 5,
            ..view(BucketState::Archived { hot_deleted: true }, Some(&plan))
        };
        let erase = apply(&expiring, Step::Erase, NOW).unwrap();
        assert_eq!((erase.state, erase.lease, erase.fence), (BucketState::ArchivedPending, Lease::Release, true));
        assert_eq!((erase.due_at, erase.next_retry_at), (Some(NOW), None));
        // Rows waiting out a late grace: the erasure pulls their generation forward.
        let graced = BucketView {
            state: BucketState::ArchivedPending,
            lease_owner: None,
            next_retry_at: Some(NOW + 300),
            ..expiring
        };
        assert!(apply(&graced, Step::Claim { owner: "w", lease_until: NOW + 5 }, NOW).is_err());
        let now_due = apply(&graced, Step::Erase, NOW).unwrap();
        assert_eq!((now_due.state, now_due.due_at), (BucketState::ArchivedPending, Some(NOW)));
        let pulled = BucketView { next_retry_at: now_due.next_retry_at, ..graced };
        assert!(apply(&pulled, Step::Claim { owner: "w", lease_until: NOW + 5 }, NOW).is_ok());
        for state in [BucketState::Hot, BucketState::Archiving, BucketState::Expired] {
            assert!(apply(&view(state, Some(&plan)), Step::Erase, NOW).is_err(), "{state}");
        }
    }

    #[test]
    fn a_late_record_reopens_an_archive_for_its_next_generation_and_fences_an_expiry_out() {
        let plan = RetentionPlan { archive_at: Some(NOW - 10), expire_at: Some(NOW - 1), reason: "t".into() };
        let expiring = BucketView {
            lease_owner: Some("expirer"),
            lease_expires_at: NOW + 5,
            ..view(BucketState::Archived { hot_deleted: true }, Some(&plan))
        };
        let late = apply(&expiring, Step::LateRecord { republish_at: NOW }, NOW).unwrap();
        assert_eq!((late.state, late.lease, late.fence), (BucketState::ArchivedPending, Lease::Release, true));
        assert_eq!((late.due_at, late.needs_plan), (Some(NOW), false), "without a grace, due at once");
        // With a grace, the next generation waits for it, and cannot be claimed before.
        let graced = apply(&expiring, Step::LateRecord { republish_at: NOW + 300 }, NOW).unwrap();
        assert_eq!((graced.state, graced.due_at), (BucketState::ArchivedPending, Some(NOW + 300)));
        let waiting = BucketView {
            state: BucketState::ArchivedPending,
            lease_owner: None,
            next_retry_at: graced.next_retry_at,
            ..expiring
        };
        assert!(apply(&waiting, Step::Claim { owner: "w", lease_until: NOW + 5 }, NOW).is_err(), "claimed early");
        assert!(apply(&waiting, Step::Claim { owner: "w", lease_until: NOW + 400 }, NOW + 300).is_ok());
        let pending = BucketView { state: BucketState::ArchivedPending, lease_owner: None, ..expiring };
        assert!(apply(&pending, Step::BeginExpiry, NOW).is_err(), "pending rows are archived before any expiry");
        let stale = BucketView { plan_current: false, ..pending };
        let claim = apply(&stale, Step::Claim { owner: "w", lease_until: NOW + 5 }, NOW).unwrap();
        assert_eq!(claim.state, BucketState::Archiving, "a next generation never waits for a plan");
        for closed in [BucketState::Hot, BucketState::Archiving, BucketState::Expired, BucketState::ArchivedPending] {
            let late = Step::LateRecord { republish_at: NOW };
            assert!(apply(&view(closed, Some(&plan)), late, NOW).is_err(), "{closed}");
        }
    }

    #[test]
    fn a_step_the_state_machine_does_not_have_changes_nothing() {
        let hot = view(BucketState::Hot, None);
        assert_eq!(apply(&hot, Step::Publish, NOW).unwrap_err(), "Publish does not apply to a hot bucket");
        assert!(apply(&hot, Step::BeginExpiry, NOW).is_err());
        // The state machine has expired -> archived (an expiry called off), not as a cleanup.
        assert!(apply(&view(BucketState::Expired, None), Step::HotRowsDeleted, NOW).is_err());
        // An archive another copy expired is recorded once.
        assert!(apply(&view(BucketState::Expired, None), Step::ArchiveGone { purge_at: NOW }, NOW).is_err());
        let purged = BucketView {
            expiry: Some(ExpiryProgress { completed: true, deletes_started: true, purge_at: Some(NOW) }),
            ..view(BucketState::Expired, None)
        };
        assert!(apply(&purged, Step::CallOffExpiry, NOW).is_ok(), "the caller decides when a hold comes too late");
        assert!(apply(&hot, Step::Claim { owner: "w", lease_until: NOW }, NOW).is_err(), "no plan, no claim");
    }

    #[test]
    fn a_table_without_a_definition_schedules_nothing_and_queues_nothing() {
        let plan = RetentionPlan { archive_at: Some(NOW), expire_at: None, reason: "t".into() };
        let unmanaged = BucketView { managed: false, plan_current: false, ..view(BucketState::Hot, Some(&plan)) };
        let t = apply(&unmanaged, Step::Reconcile, NOW).unwrap();
        assert_eq!((t.due_at, t.needs_plan), (None, false));
        let managed = BucketView { managed: true, ..unmanaged };
        assert!(apply(&managed, Step::Reconcile, NOW).unwrap().needs_plan);
        let refresh = BucketView { plan_current: true, plan_refresh_due: true, ..managed };
        let t = apply(&refresh, Step::Reconcile, NOW).unwrap();
        assert_eq!((t.due_at, t.needs_plan), (Some(NOW), true), "an old plan acts until it is made again");
    }
}

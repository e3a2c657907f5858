//! The bucket lifecycle as pure decisions: from what is known of a bucket (its state, its
//! retention plan and what that plan was made from, its lease, its holds, its tombstone) and
//! `now`, decide what may happen next and when. The store loads a bucket, asks these functions,
//! and saves what they answer, inside one transaction; nothing here touches redb or I/O.
//!
//! Retention is re-decided, never frozen (ARCHITECTURE.md, "Re-planning"): a plan records the
//! policy identity and the facts it was made from (`PlanBasis`); a plan whose basis differs from
//! the policy in force or from the bucket's current facts is stale and never acts: the bucket
//! is planned again first. A plan older than `REPLAN_PERIOD_US` is refreshed too, but keeps
//! acting until it is (nothing it depends on changed). Re-planning
//! may move an archive or an expiry earlier or later, but an expiry acts only on an archived
//! bucket (never before its archive exists) and never on a held one.

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::{BucketFacts, BucketState, Micros, RetentionPlan};

mod step;
pub use self::step::{Lease, Step, Transition, apply};

/// A plan older than this is made again even if nothing it depends on changed, so a policy
/// whose answer depends on `now` is asked again within this period. (It is a refresh, not an
/// invalidation: the old plan keeps acting until the new one is made.)
pub const REPLAN_PERIOD_US: Micros = 7 * super::time::MICROS_PER_DAY;

/// What a retention plan was made from. A plan is current only while all of it still holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanBasis {
    /// `policy_identity` of the retention policy that made the plan.
    pub policy: String,
    /// `facts_digest` of the facts the policy was shown.
    pub facts: String,
    pub planned_at: Micros,
}

/// The identity of a retention policy as a plan depends on it: the component's content hash
/// and its effective configuration (which carries the process-wide cutoff when it applies).
pub fn policy_identity(plugin_hash: &str, config: &str) -> String {
    let mut hasher = sha2::Sha256::new();
    hasher.update(plugin_hash.as_bytes());
    hasher.update([0]);
    hasher.update(config.as_bytes());
    hex::encode(&hasher.finalize()[..12])
}

/// The facts a retention policy can see, at the precision a plan depends on. Row and byte
/// counts enter as their power-of-two class, so a growing bucket is re-planned when its size
/// crosses a class (1, 2, 4, ... rows), not at every append. The state enters as hot or
/// archived: a claim or a cleanup does not by itself make a plan stale, an archival does.
pub fn facts_digest(facts: &BucketFacts) -> String {
    let archived =
        matches!(facts.state, BucketState::Archived { .. } | BucketState::ArchivedPending | BucketState::Expired);
    let mut hasher = sha2::Sha256::new();
    for part in [
        facts.table.as_bytes(),
        &facts.partition_key,
        facts.tenant.as_deref().unwrap_or("\0none").as_bytes(),
        facts.kind.as_deref().unwrap_or("\0none").as_bytes(),
        facts.bucket.key.as_bytes(),
    ] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.update(facts.bucket.start.to_be_bytes());
    hasher.update(facts.bucket.end.to_be_bytes());
    hasher.update([size_class(facts.row_count), size_class(facts.byte_count), u8::from(archived)]);
    if archived {
        hasher.update(facts.archived_at.unwrap_or(0).to_be_bytes());
    }
    hex::encode(&hasher.finalize()[..12])
}

/// 0 for 0, else 1 + floor(log2(n)).
pub fn size_class(n: u64) -> u8 {
    (u64::BITS - n.leading_zeros()) as u8
}

/// Whether a plan made on `basis` may still act for a bucket whose facts digest is
/// `facts` under the policy whose identity is `policy`.
pub fn plan_is_current(basis: Option<&PlanBasis>, policy: &str, facts: &str) -> bool {
    basis.is_some_and(|b| b.policy == policy && b.facts == facts)
}

/// Whether a plan is old enough to be refreshed (`REPLAN_PERIOD_US`).
pub fn plan_refresh_due(basis: Option<&PlanBasis>, now: Micros) -> bool {
    basis.is_some_and(|b| now - b.planned_at >= REPLAN_PERIOD_US)
}

/// An expiry in progress, as far as the lifecycle cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpiryProgress {
    /// Every object is proved absent.
    pub completed: bool,
    /// The first delete call may have been made: from here a hold can no longer stop it.
    pub deletes_started: bool,
    /// When a completed tombstone may be purged.
    pub purge_at: Option<Micros>,
}

/// What the lifecycle needs to know of one bucket.
#[derive(Debug, Clone, Copy)]
pub struct BucketView<'a> {
    pub state: BucketState,
    pub plan: Option<&'a RetentionPlan>,
    /// `plan_is_current` for this bucket under the policy in force.
    pub plan_current: bool,
    /// `plan_refresh_due`: the plan acts, but is made again.
    pub plan_refresh_due: bool,
    /// The bucket's table has a definition in the policy directory (nothing is planned or
    /// scheduled while it has none).
    pub managed: bool,
    pub lease_owner: Option<&'a str>,
    pub lease_expires_at: Micros,
    pub next_retry_at: Option<Micros>,
    /// Holds that cover the bucket now.
    pub held: bool,
    pub expiry: Option<ExpiryProgress>,
}

/// The step a claim starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Snapshot, upload, verify, publish (a first claim, a retry or a takeover).
    Archive,
    /// Delete the hot rows of a published bucket.
    Cleanup,
    /// Start an archive's expiry (holds are checked again in the same transaction).
    Expire,
    /// Finish an expiry whose tombstone is written.
    FinishExpiry,
}

/// Why a bucket cannot be claimed now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotClaimable {
    /// Its plan is stale (or missing): plan it again first.
    NeedsPlan,
    /// Another worker holds its lease.
    Leased,
    /// Its next step is not due yet (or it has none).
    NotDue,
    /// A legal hold parks it.
    Held,
}

impl BucketView<'_> {
    fn lease_free(&self, now: Micros) -> bool {
        self.lease_owner.is_none() || self.lease_expires_at <= now
    }

    fn retry_due(&self, now: Micros) -> bool {
        self.next_retry_at.is_none_or(|at| at <= now)
    }
}

/// Decides whether a worker may claim the bucket at `now`, and for which step. Work that
/// finishes a step already under way (a retry, a takeover, a pending cleanup, an expiry whose
/// tombstone is written) never waits for a plan; a step the plan decides (archive a hot
/// bucket, expire an archive) needs a current plan.
pub fn claimable(view: &BucketView<'_>, now: Micros) -> Result<Action, NotClaimable> {
    use BucketState::*;
    match view.state {
        Hot if !view.lease_free(now) => Err(NotClaimable::Leased),
        Hot => {
            if !view.plan_current {
                return Err(NotClaimable::NeedsPlan);
            }
            match view.plan.and_then(|p| p.archive_at) {
                Some(at) if at <= now => Ok(Action::Archive),
                _ => Err(NotClaimable::NotDue),
            }
        }
        Archiving if !view.lease_free(now) => Err(NotClaimable::Leased),
        Archiving if view.retry_due(now) => Ok(Action::Archive),
        Archiving => Err(NotClaimable::NotDue),
        // Rows wait beside a published archive: the next generation is work under way (its
        // plan already said archive), so it never waits for a plan.
        ArchivedPending if !view.lease_free(now) => Err(NotClaimable::Leased),
        ArchivedPending if view.retry_due(now) => Ok(Action::Archive),
        ArchivedPending => Err(NotClaimable::NotDue),
        Archived { hot_deleted: false } if !view.lease_free(now) => Err(NotClaimable::Leased),
        Archived { hot_deleted: false } if view.retry_due(now) => Ok(Action::Cleanup),
        Archived { hot_deleted: false } => Err(NotClaimable::NotDue),
        Archived { hot_deleted: true } => {
            if !view.lease_free(now) {
                return Err(NotClaimable::Leased);
            }
            if view.held {
                return Err(NotClaimable::Held);
            }
            if !view.plan_current {
                return Err(NotClaimable::NeedsPlan);
            }
            match view.plan.and_then(|p| p.expire_at) {
                Some(at) if at <= now && view.retry_due(now) => Ok(Action::Expire),
                _ => Err(NotClaimable::NotDue),
            }
        }
        Expired => match view.expiry {
            Some(progress) if !progress.completed => {
                if !view.lease_free(now) {
                    Err(NotClaimable::Leased)
                } else if view.retry_due(now) {
                    Ok(Action::FinishExpiry)
                } else {
                    Err(NotClaimable::NotDue)
                }
            }
            _ => Err(NotClaimable::NotDue),
        },
    }
}

/// When the bucket's next step is due, for the due index: the earliest time at which
/// `claimable` (or a tombstone purge) could answer yes, or `None` when nothing is scheduled
/// (no plan yet, a hold, never archived or never expired, the lifecycle is over).
pub fn next_due(view: &BucketView<'_>, now: Micros) -> Option<Micros> {
    use BucketState::*;
    let lease_or_retry = || {
        let lease = if view.lease_owner.is_some() { view.lease_expires_at } else { now };
        Some(lease.max(view.next_retry_at.unwrap_or(now)))
    };
    match view.state {
        Hot if view.plan_current => view.plan.and_then(|p| p.archive_at),
        Hot => None,
        Archiving | Archived { hot_deleted: false } | ArchivedPending => lease_or_retry(),
        Archived { hot_deleted: true } if view.held || !view.plan_current => None,
        Archived { hot_deleted: true } => {
            let expire_at = view.plan.and_then(|p| p.expire_at)?;
            let lease = if view.lease_owner.is_some() { view.lease_expires_at } else { expire_at };
            Some(expire_at.max(lease).max(view.next_retry_at.unwrap_or(expire_at)))
        }
        Expired => match view.expiry {
            Some(progress) if !progress.completed => lease_or_retry(),
            Some(progress) => progress.purge_at,
            None => None,
        },
    }
}

/// What the engine does next with a bucket, as the retention report names it: `plan`,
/// `archive`, `delete_hot`, `expire`, `held` (its expiry waits for holds) or `none`. `held`:
/// a hold covers the bucket now, or parked its expiry.
pub fn next_step(state: BucketState, plan: Option<&RetentionPlan>, held: bool) -> &'static str {
    use BucketState::*;
    match state {
        Hot if plan.is_none() => "plan",
        Hot if plan.is_some_and(|p| p.archive_at.is_some()) => "archive",
        Hot => "none",
        Archiving | ArchivedPending => "archive",
        Archived { hot_deleted: false } => "delete_hot",
        Archived { hot_deleted: true } => match plan.and_then(|p| p.expire_at) {
            Some(_) if held => "held",
            Some(_) => "expire",
            None => "none",
        },
        Expired => "none",
    }
}

/// Whether a bucket's archive may be deleted: only when no hold covers it. Returns the ids
/// of the covering holds otherwise (a legal hold beats every retention rule).
pub fn expiry_allowed(covering_holds: &[String]) -> Result<(), Vec<String>> {
    if covering_holds.is_empty() { Ok(()) } else { Err(covering_holds.to_vec()) }
}

/// What placing a hold does to a bucket whose expiry is under way: before the first delete
/// call the expiry is called off (the bucket returns to `Archived` and is parked); after it,
/// the hold cannot save the archive and the caller is told so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldEffect {
    /// The bucket is not being expired: the hold parks its expiry.
    Parks,
    /// The expiry had written its tombstone but deleted nothing: it is called off.
    CancelsExpiry,
    /// Objects may already be deleted: the hold comes too late for this bucket.
    TooLate,
    /// Already expired: nothing left to hold.
    AlreadyExpired,
}

pub fn hold_effect(state: BucketState, expiry: Option<ExpiryProgress>) -> HoldEffect {
    match (state, expiry) {
        (BucketState::Expired, Some(p)) if !p.completed && !p.deletes_started => HoldEffect::CancelsExpiry,
        (BucketState::Expired, Some(p)) if !p.completed => HoldEffect::TooLate,
        (BucketState::Expired, _) => HoldEffect::AlreadyExpired,
        _ => HoldEffect::Parks,
    }
}

/// Whether a completed tombstone may be purged: the bucket still says `Expired`, its purge
/// time has come and no sink still waits for the events that tell of the expiry.
pub fn tombstone_purgeable(
    state: BucketState,
    progress: ExpiryProgress,
    expiry_events_pending: bool,
    now: Micros,
) -> bool {
    state == BucketState::Expired
        && progress.completed
        && progress.purge_at.is_some_and(|at| at <= now)
        && !expiry_events_pending
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::BucketDescriptor;

    const NOW: Micros = 1_000_000_000;

    fn plan(archive_at: Option<Micros>, expire_at: Option<Micros>) -> RetentionPlan {
        RetentionPlan { archive_at, expire_at, reason: "test".into() }
    }

    /// A current plan's view of an unleased, unheld bucket of a managed table.
    pub(super) fn view(state: BucketState, plan: Option<&RetentionPlan>) -> BucketView<'_> {
        BucketView {
            state,
            plan,
            plan_current: true,
            plan_refresh_due: false,
            managed: true,
            lease_owner: None,
            lease_expires_at: 0,
            next_retry_at: None,
            held: false,
            expiry: None,
        }
    }

    fn facts() -> BucketFacts {
        BucketFacts {
            table: "t".into(),
            partition_key: b"p".to_vec(),
            tenant: None,
            kind: Some("debug".into()),
            bucket: BucketDescriptor { key: "day:2024-01-01".into(), start: 0, end: 10 },
            row_count: 5,
            byte_count: 100,
            state: BucketState::Hot,
            archived_at: None,
        }
    }

    #[test]
    fn a_stale_plan_never_archives_or_expires() {
        let p = plan(Some(NOW - 1), Some(NOW - 1));
        let mut hot = view(BucketState::Hot, Some(&p));
        assert_eq!(claimable(&hot, NOW), Ok(Action::Archive));
        hot.plan_current = false;
        assert_eq!(claimable(&hot, NOW), Err(NotClaimable::NeedsPlan));
        assert_eq!(next_due(&hot, NOW), None);
        let mut archived = view(BucketState::Archived { hot_deleted: true }, Some(&p));
        assert_eq!(claimable(&archived, NOW), Ok(Action::Expire));
        archived.plan_current = false;
        assert_eq!(claimable(&archived, NOW), Err(NotClaimable::NeedsPlan));
    }

    #[test]
    fn work_under_way_never_waits_for_a_plan() {
        for state in
            [BucketState::Archiving, BucketState::Archived { hot_deleted: false }, BucketState::ArchivedPending]
        {
            let mut v = view(state, None);
            v.plan_current = false;
            assert!(claimable(&v, NOW).is_ok(), "{state}");
        }
        let mut expiring = view(BucketState::Expired, None);
        expiring.plan_current = false;
        expiring.expiry = Some(ExpiryProgress { completed: false, deletes_started: true, purge_at: None });
        assert_eq!(claimable(&expiring, NOW), Ok(Action::FinishExpiry));
    }

    #[test]
    fn a_hold_parks_an_expiry_and_removes_it_from_the_schedule() {
        let p = plan(Some(0), Some(NOW - 1));
        let mut v = view(BucketState::Archived { hot_deleted: true }, Some(&p));
        v.held = true;
        assert_eq!(claimable(&v, NOW), Err(NotClaimable::Held));
        assert_eq!(next_due(&v, NOW), None);
        assert_eq!(expiry_allowed(&["h1".into()]), Err(vec!["h1".to_string()]));
        assert_eq!(expiry_allowed(&[]), Ok(()));
    }

    #[test]
    fn a_hold_cancels_an_expiry_only_before_its_first_delete() {
        let before = ExpiryProgress { completed: false, deletes_started: false, purge_at: None };
        let during = ExpiryProgress { deletes_started: true, ..before };
        let done = ExpiryProgress { completed: true, deletes_started: true, purge_at: Some(1) };
        assert_eq!(hold_effect(BucketState::Expired, Some(before)), HoldEffect::CancelsExpiry);
        assert_eq!(hold_effect(BucketState::Expired, Some(during)), HoldEffect::TooLate);
        assert_eq!(hold_effect(BucketState::Expired, Some(done)), HoldEffect::AlreadyExpired);
        assert_eq!(hold_effect(BucketState::Archived { hot_deleted: true }, None), HoldEffect::Parks);
    }

    #[test]
    fn facts_that_a_policy_sees_change_the_digest_and_others_do_not() {
        let base = facts_digest(&facts());
        let same_class = BucketFacts { row_count: 6, ..facts() };
        assert_eq!(facts_digest(&same_class), base, "5 and 6 rows are one size class");
        let bigger = BucketFacts { row_count: 8, ..facts() };
        assert_ne!(facts_digest(&bigger), base);
        let mixed = BucketFacts { kind: None, ..facts() };
        assert_ne!(facts_digest(&mixed), base, "invoices joining debug records re-plan the bucket");
        let claimed = BucketFacts { state: BucketState::Archiving, ..facts() };
        assert_eq!(facts_digest(&claimed), base, "a claim alone does not make a plan stale");
        let archived =
            BucketFacts { state: BucketState::Archived { hot_deleted: true }, archived_at: Some(7), ..facts() };
        assert_ne!(facts_digest(&archived), base, "an archival re-plans (archived-at is a fact)");
    }

    #[test]
    fn plans_are_stale_when_their_basis_changes_and_refreshed_when_old() {
        let basis = PlanBasis { policy: "p".into(), facts: "f".into(), planned_at: NOW };
        assert!(plan_is_current(Some(&basis), "p", "f"));
        assert!(!plan_is_current(Some(&basis), "p2", "f"));
        assert!(!plan_is_current(Some(&basis), "p", "f2"));
        assert!(!plan_is_current(None, "p", "f"));
        assert!(!plan_refresh_due(Some(&basis), NOW + REPLAN_PERIOD_US - 1));
        assert!(plan_refresh_due(Some(&basis), NOW + REPLAN_PERIOD_US), "old plans are refreshed");
    }

    #[test]
    fn tombstones_wait_for_their_state_time_and_sinks() {
        let done = ExpiryProgress { completed: true, deletes_started: true, purge_at: Some(NOW) };
        assert!(tombstone_purgeable(BucketState::Expired, done, false, NOW));
        assert!(!tombstone_purgeable(BucketState::Expired, done, true, NOW), "a sink still waits");
        assert!(!tombstone_purgeable(BucketState::Expired, done, false, NOW - 1));
        assert!(!tombstone_purgeable(BucketState::Archived { hot_deleted: true }, done, false, NOW));
        let open = ExpiryProgress { completed: false, ..done };
        assert!(!tombstone_purgeable(BucketState::Expired, open, false, NOW));
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        fn any_state() -> impl Strategy<Value = BucketState> {
            prop::sample::select(BucketState::ALL.to_vec())
        }

        fn any_time() -> impl Strategy<Value = Micros> {
            NOW - 1_000..NOW + 1_000
        }

        prop_compose! {
            fn any_view_parts()(
                state in any_state(),
                archive_at in prop::option::of(any_time()),
                expire_at in prop::option::of(any_time()),
                has_plan in any::<bool>(),
                plan_current in any::<bool>(),
                leased in any::<bool>(),
                lease_expires_at in any_time(),
                next_retry_at in prop::option::of(any_time()),
                held in any::<bool>(),
                expiry in prop::option::of((any::<bool>(), any::<bool>(), prop::option::of(any_time()))),
            ) -> (BucketState, Option<RetentionPlan>, bool, bool, Micros, Option<Micros>, bool, Option<ExpiryProgress>) {
                let plan = has_plan.then(|| plan(archive_at, expire_at));
                let expiry = expiry.map(|(completed, deletes_started, purge_at)| ExpiryProgress {
                    completed, deletes_started: deletes_started || completed, purge_at,
                });
                (state, plan, plan_current, leased, lease_expires_at, next_retry_at, held, expiry)
            }
        }

        proptest! {
            /// Whatever the bucket, the lifecycle never archives or expires on a stale plan,
            /// never expires a held bucket or one that is not archived and cleaned, never
            /// claims under a live lease of another worker, and the due index never promises
            /// a step earlier than `claimable` grants it.
            #[test]
            fn the_lifecycle_keeps_its_promises(
                (state, plan, plan_current, leased, lease_expires_at, next_retry_at, held, expiry) in any_view_parts(),
                now in any_time(),
            ) {
                let v = BucketView {
                    state,
                    plan: plan.as_ref(),
                    plan_current,
                    plan_refresh_due: false,
                    managed: true,
                    lease_owner: leased.then_some("w"),
                    lease_expires_at,
                    next_retry_at,
                    held,
                    expiry,
                };
                match claimable(&v, now) {
                    Ok(Action::Archive) if state == BucketState::Hot => prop_assert!(plan_current),
                    Ok(Action::Expire) => {
                        prop_assert!(plan_current && !held);
                        prop_assert_eq!(state, BucketState::Archived { hot_deleted: true });
                        prop_assert!(plan.as_ref().and_then(|p| p.expire_at).is_some_and(|at| at <= now));
                    }
                    _ => {}
                }
                if claimable(&v, now).is_ok() {
                    prop_assert!(!leased || lease_expires_at <= now, "claimed under a live lease");
                }
                // If the due index says "later", nothing is claimable before that time.
                if let Some(due) = next_due(&v, now)
                    && due > now
                {
                    prop_assert!(claimable(&v, now).is_err(), "claimable before its due time {due}");
                }
            }
        }
    }
}

//! What a pass reports: what it did, its errors by kind (logged and counted in the metrics),
//! and the seconds it spent in each phase.

use std::time::Instant;

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
    /// `deferred` by reason (`DeferralReason`), for the metrics.
    pub deferrals_by_reason: std::collections::BTreeMap<&'static str, u64>,
    pub rows_archived: u64,
    pub bytes_archived: u64,
    pub expired: u64,
    /// Expiries stopped by a legal hold.
    pub held: u64,
    /// Expiries whose deletes still wait for their table's Delta log at the pass's end (its
    /// sync failed); the next pass finishes them.
    pub expiries_awaiting_log: u64,
    pub tombstones_purged: u64,
    pub outbox_delivered: u64,
    pub orphans_deleted: u64,
    /// Buckets whose part of an erasure request was finished (hot rows deleted, or the
    /// replaced generations deleted and proved absent).
    pub erasure_buckets_done: u64,
    /// Buckets whose manifests the pass's Delta syncs read from the store (`delta::DeltaSync`):
    /// those whose publication changed, or every one a table ever archived when a sync made
    /// its index whole.
    pub delta_buckets_read: u64,
    /// Paths the pass's Delta syncs compared between the log and this installation's files
    /// (`delta::DeltaSync::files_compared`): those of the buckets and log entries that changed
    /// since the last sync, or every file when a sync compared them all.
    pub delta_files_compared: u64,
    /// Delta commits that lost a race with another writer of the log (or failed) and were
    /// made again after reading it (`delta::DeltaSync::retried_commits`).
    pub delta_commit_retries: u64,
    /// Every error the pass met and went on from, with its cause (`PassReport::error`).
    pub errors: Vec<String>,
    /// How many of `errors` there were of each kind (`PassErrorKind`), for the metrics.
    pub error_kinds: std::collections::BTreeMap<&'static str, u64>,
    /// Where the pass spent its time.
    pub seconds: PhaseSeconds,
    /// The pass's wall time, start to end (summed over passes in `add`).
    pub wall_seconds: f64,
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
    /// An erasure step failed (a target that could not be reached, an object still listed).
    Erasure,
}

impl PassErrorKind {
    pub const ALL: [PassErrorKind; 6] = [
        PassErrorKind::Bucket,
        PassErrorKind::Outbox,
        PassErrorKind::Catalog,
        PassErrorKind::DeltaLog,
        PassErrorKind::Sweep,
        PassErrorKind::Erasure,
    ];

    pub fn label(self) -> &'static str {
        match self {
            PassErrorKind::Bucket => "bucket",
            PassErrorKind::Outbox => "outbox",
            PassErrorKind::Catalog => "catalog",
            PassErrorKind::DeltaLog => "delta_log",
            PassErrorKind::Sweep => "sweep",
            PassErrorKind::Erasure => "erasure",
        }
    }
}

/// Why a bucket's archival, cleanup or expiry was deferred, as the metrics label it
/// (`frostline_archive_deferrals_total{reason}`), read from the error that deferred it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeferralReason {
    /// The target could not be reached, or answered with an outage.
    TargetUnavailable,
    /// The target refused a request for good (access denied, not supported).
    TargetRefused,
    /// A plugin trapped, ran out of time or memory, answered wrongly, or is suspended.
    PluginFault,
    /// What was read back does not match what was written, or a stored value does not parse.
    Corruption,
    /// The bucket's lease was lost, its fence moved, or its archive changed under the pass.
    LeaseOrFence,
    /// The data directory's disk or database failed (I/O, a store that refuses writes).
    LocalStore,
    /// The bucket's archival task panicked.
    TaskPanicked,
    /// Anything else (a refused input, an internal error).
    Other,
}

impl DeferralReason {
    pub const ALL: [DeferralReason; 8] = [
        DeferralReason::TargetUnavailable,
        DeferralReason::TargetRefused,
        DeferralReason::PluginFault,
        DeferralReason::Corruption,
        DeferralReason::LeaseOrFence,
        DeferralReason::LocalStore,
        DeferralReason::TaskPanicked,
        DeferralReason::Other,
    ];

    pub fn of(error: &crate::error::Error) -> DeferralReason {
        use crate::error::Error;
        match error {
            Error::StorageUnavailable(_) => DeferralReason::TargetUnavailable,
            Error::Storage(_) => DeferralReason::TargetRefused,
            Error::PluginFault { .. } | Error::PluginInvalidAnswer { .. } | Error::PluginSuspended { .. } => {
                DeferralReason::PluginFault
            }
            Error::Corruption(_) => DeferralReason::Corruption,
            Error::LeaseLost { .. }
            | Error::BucketFenced { .. }
            | Error::ArchiveChanged { .. }
            | Error::Conflict(_) => DeferralReason::LeaseOrFence,
            Error::Database { .. } | Error::Io { .. } | Error::StorePoisoned(_) => DeferralReason::LocalStore,
            _ => DeferralReason::Other,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            DeferralReason::TargetUnavailable => "target_unavailable",
            DeferralReason::TargetRefused => "target_refused",
            DeferralReason::PluginFault => "plugin_fault",
            DeferralReason::Corruption => "corruption",
            DeferralReason::LeaseOrFence => "lease_or_fence",
            DeferralReason::LocalStore => "local_store",
            DeferralReason::TaskPanicked => "task_panicked",
            DeferralReason::Other => "other",
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
    /// An archived bucket's expiry: its tombstone, the delete of its objects, the absence
    /// proved by listing (the Delta syncs it waits for are `DeltaLog`'s).
    Expiry,
    /// Rewriting the tables' catalogs.
    Catalog,
    /// Syncing the tables' Delta logs after the pass (the syncs an expiry makes before its
    /// deletes count as `Expiry`).
    DeltaLog,
    /// Carrying out open erasure requests (both steps of a pass).
    Erasure,
    /// Delivering outbox events.
    Outbox,
    /// The orphan sweep, when one is due.
    Sweep,
}

impl Phase {
    /// Every phase, in protocol order.
    pub const ALL: [Phase; 18] = [
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
        Phase::Expiry,
        Phase::Catalog,
        Phase::DeltaLog,
        Phase::Erasure,
        Phase::Outbox,
        Phase::Sweep,
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
            Phase::Expiry => "expiry",
            Phase::Catalog => "catalog",
            Phase::DeltaLog => "delta_log",
            Phase::Erasure => "erasure",
            Phase::Outbox => "outbox",
            Phase::Sweep => "sweep",
        }
    }
}

/// Seconds a pass spent in each `Phase`, summed over its buckets (buckets worked on at once each count their own time, so the sum can exceed
/// the pass's wall time). Cheap enough to take always; the benchmark's breakdown of a pass reads it.
/// Serialized as an object from phase name to seconds.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct PhaseSeconds([f64; Phase::ALL.len()]);

impl PhaseSeconds {
    pub fn get(&self, phase: Phase) -> f64 {
        self.0[phase as usize]
    }

    pub(super) fn add(&mut self, phase: Phase, seconds: f64) {
        self.0[phase as usize] += seconds;
    }

    /// Each phase's name and seconds, in protocol order.
    pub fn named(&self) -> Vec<(&'static str, f64)> {
        Phase::ALL.iter().map(|&phase| (phase.name(), self.get(phase))).collect()
    }

    pub(super) fn add_all(&mut self, other: &PhaseSeconds) {
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
pub(super) struct Lap(Instant);

impl Lap {
    pub(super) fn start() -> Lap {
        Lap(Instant::now())
    }

    pub(super) fn lap(&mut self) -> f64 {
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
        for (reason, count) in other.deferrals_by_reason {
            *self.deferrals_by_reason.entry(reason).or_default() += count;
        }
        self.delta_buckets_read += other.delta_buckets_read;
        self.delta_files_compared += other.delta_files_compared;
        self.delta_commit_retries += other.delta_commit_retries;
        self.erasure_buckets_done += other.erasure_buckets_done;
        self.rows_archived += other.rows_archived;
        self.bytes_archived += other.bytes_archived;
        self.expired += other.expired;
        self.held += other.held;
        // What still waits after the latest pass, not a sum: each pass retries the same ones.
        self.expiries_awaiting_log = other.expiries_awaiting_log;
        self.tombstones_purged += other.tombstones_purged;
        self.outbox_delivered += other.outbox_delivered;
        self.orphans_deleted += other.orphans_deleted;
        self.errors.extend(other.errors);
        for (kind, count) in other.error_kinds {
            *self.error_kinds.entry(kind).or_default() += count;
        }
        self.seconds.add_all(&other.seconds);
        self.wall_seconds += other.wall_seconds;
    }

    /// Records an error the pass went on from: logged at warn with its cause and counted by
    /// kind (`frostline_pass_errors_total{kind}`), so a pass that goes on is never silent.
    pub fn error(&mut self, kind: PassErrorKind, message: String) {
        tracing::warn!(kind = kind.label(), error = %message, "archival pass error");
        *self.error_kinds.entry(kind.label()).or_default() += 1;
        self.errors.push(message);
    }

    /// Counts a bucket deferred for `reason`.
    pub fn deferral(&mut self, reason: DeferralReason) {
        self.deferred += 1;
        *self.deferrals_by_reason.entry(reason.label()).or_default() += 1;
    }

    /// Due buckets the pass took and settled one way or another (archived or cleaned,
    /// expired, purged, deferred, held, or waiting for a Delta log): when this reaches the scan
    /// limit, more is likely due.
    pub fn buckets_worked(&self) -> u64 {
        self.cleaned + self.expired + self.tombstones_purged + self.deferred + self.held + self.expiries_awaiting_log
    }

    /// Whether the pass leaves a backlog, so the next pass follows at once: it took as many due
    /// buckets as `scan_limit` allows, made progress and met no error. A pass with an error (a
    /// target down defers every bucket it tries) does not, so failures are not retried at
    /// speed, and the next pass plans as after a pass without a backlog (`archive::plan_budget`).
    pub fn leaves_backlog(&self, scan_limit: usize) -> bool {
        self.errors.is_empty() && self.made_progress() && self.buckets_worked() >= scan_limit as u64
    }

    /// Whether the pass changed any bucket's state (another pass may find more to do).
    pub fn made_progress(&self) -> bool {
        self.planned + self.archived + self.cleaned + self.expired + self.tombstones_purged > 0
    }
}

//! The status read model: tables, buckets per state with the age of the oldest in each, due
//! work, deferrals with their reasons, lease holders, targets and the policy set in force.
//! One typed shape for `frostline status`, `GET /v1/status`, `status.json` and the metrics'
//! state gauges (`api::metrics` renders them from `collect`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::error::Result;
use crate::model::Micros;
use crate::model::time::format_rfc3339;

#[derive(Debug, Serialize, Deserialize)]
pub struct StateCount {
    pub buckets: u64,
    pub rows: u64,
    /// Seconds since the longest-standing bucket entered this state.
    pub oldest_age_seconds: i64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Deferral {
    pub bucket: String,
    pub attempts: u32,
    pub next_retry_at: Option<String>,
    pub error: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Lease {
    pub bucket: String,
    pub owner: String,
    pub generation: u64,
    pub expires_at: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TableStatus {
    pub id: String,
    pub strategy: String,
    pub retention: String,
    pub target: String,
    pub states: BTreeMap<String, StateCount>,
    /// Archived buckets whose expiry a legal hold parks.
    #[serde(default)]
    pub held_buckets: u64,
    /// The table's Delta log as this installation's last sync left it (Parquet tables with a
    /// Delta log, once synced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_log: Option<DeltaLogStatus>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct DeltaLogStatus {
    pub version: u64,
    pub synced_at: String,
    pub last_commit_at: Option<String>,
    pub error: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct PolicyStatus {
    pub dir: String,
    pub generation: u64,
    pub files: BTreeMap<String, String>,
    pub plugins: Vec<super::plugins::PluginStatus>,
    pub retired_tables: Vec<String>,
    pub last_reload: Option<super::plugins::ReloadOutcome>,
    /// Reloads since the engine started, accepted and refused.
    #[serde(default)]
    pub reloads_accepted: u64,
    #[serde(default)]
    pub reloads_refused: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    pub now: String,
    /// The data directory, resolved to an absolute path.
    #[serde(default)]
    pub data_dir: String,
    /// This data directory's installation id (in every object key it writes).
    #[serde(default)]
    pub installation_id: String,
    /// Tables with data that are not in the policy directory: their buckets wait for them.
    #[serde(default)]
    pub unmanaged_tables: Vec<String>,
    pub policy: PolicyStatus,
    pub tables: Vec<TableStatus>,
    pub due_now: u64,
    /// Seconds the oldest due action has waited (archival lag), 0 when nothing is due.
    pub oldest_due_age_seconds: i64,
    /// Buckets queued for a (new) retention plan: new buckets, and those whose policy or
    /// facts changed. A stale plan never acts, so these wait for their plan.
    pub unplanned_buckets: u64,
    /// Buckets the last pass of this engine planned (0 before its first pass).
    #[serde(default)]
    pub planned_last_pass: u64,
    /// Seconds until every queued bucket has a plan at the last pass's pace (one pass every
    /// `ARCHIVER_INTERVAL_SECONDS`): 0 when none waits, absent while the engine has not
    /// planned any yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_settle_estimate_seconds: Option<u64>,
    pub deferrals: Vec<Deferral>,
    pub leases: Vec<Lease>,
    pub outbox_backlog: u64,
    pub store_poisoned: Option<String>,
    /// Each native archive target and its probe (never a secret).
    #[serde(default)]
    pub targets: Vec<crate::storage::probe::TargetReport>,
    /// Why the orphan sweep stopped without deleting anything, until a sweep completes: proof
    /// that another copy of this data directory writes to a target (`archive::sweep`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_stopped: Option<SweepStopStatus>,
    /// Erasure requests not yet finished.
    #[serde(default)]
    pub erasures_open: u64,
    /// Buckets of open erasure requests that a legal hold keeps from being erased.
    #[serde(default)]
    pub erasure_buckets_blocked: u64,
    /// The hot store's file and the free space of its filesystem (absent where it cannot be
    /// read): a store that fills its disk refuses writes (`store_poisoned`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_disk: Option<StoreDisk>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct StoreDisk {
    /// Bytes of the hot store's file (`hot.redb`): it keeps its high-water mark until
    /// `frostline compact`.
    pub file_bytes: u64,
    /// Bytes of the filesystem the data directory lies on.
    pub filesystem_bytes: u64,
    /// Bytes of that filesystem an unprivileged writer may still use.
    pub available_bytes: u64,
    /// The file's free pages as this engine last measured them (`ops::maintenance`), and when;
    /// absent until the first measure (after the first pass that left no backlog).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_measured_at: Option<String>,
    /// Bytes of the file's pages that hold metadata (every table but the buckets' hot rows),
    /// and that per bucket recorded, as last measured with the free pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_bytes_per_bucket: Option<u64>,
    /// The buckets the store recorded at that measure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<u64>,
    /// Compactions in place since the engine started, and the last one.
    #[serde(default)]
    pub compactions: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_compaction: Option<crate::store::compact::Compaction>,
}

impl StoreDisk {
    /// Reads the sizes for the engine's data directory (`None` when either cannot be read).
    fn read(engine: &Engine) -> Option<StoreDisk> {
        let data = engine.data_dir();
        let file_bytes = std::fs::metadata(data.join(crate::engine::DATABASE_FILE)).ok()?.len();
        let fs = rustix::fs::statvfs(data).ok()?;
        let space = engine.store().last_space();
        let (compactions, last_compaction) = engine.store().compactions();
        Some(StoreDisk {
            file_bytes,
            filesystem_bytes: fs.f_blocks.saturating_mul(fs.f_frsize),
            available_bytes: fs.f_bavail.saturating_mul(fs.f_frsize),
            free_bytes: space.map(|s| s.free_bytes),
            free_measured_at: space.map(|s| format_rfc3339(s.measured_at)),
            metadata_bytes: space.map(|s| s.metadata_bytes),
            metadata_bytes_per_bucket: space.and_then(|s| s.metadata_bytes_per_bucket()),
            buckets: space.map(|s| s.buckets),
            compactions,
            last_compaction,
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SweepStopStatus {
    pub at: String,
    pub target: String,
    pub key: String,
    pub reason: String,
}

pub fn collect(engine: &Engine) -> Result<Status> {
    let now: Micros = engine.clock().now();
    let policies = engine.policies();
    // The store keeps these as tallies in the transaction of every change of a bucket, so a
    // status reads a few keys per table, not every bucket (`store::tally`).
    let mut tallies = engine.store().status_tallies(policies.tables.keys().map(String::as_str))?;
    let deferrals = tallies
        .deferred
        .iter()
        .map(|b| Deferral {
            bucket: b.id.display(),
            attempts: b.attempts,
            next_retry_at: b.next_retry_at.map(format_rfc3339),
            error: b.last_error.clone().unwrap_or_default(),
        })
        .collect();
    let leases = tallies
        .leased
        .iter()
        .filter(|b| b.lease_expires_at > now)
        .filter_map(|b| {
            Some(Lease {
                bucket: b.id.display(),
                owner: b.lease_owner.clone()?,
                generation: b.generation,
                expires_at: format_rfc3339(b.lease_expires_at),
            })
        })
        .collect();
    let mut tables = Vec::with_capacity(policies.tables.len());
    for (id, table) in &policies.tables {
        let tally = tallies.tables.remove(id).unwrap_or_default();
        let delta_log = engine.store().delta_log_state(id)?.map(|s| DeltaLogStatus {
            version: s.version,
            synced_at: format_rfc3339(s.synced_at),
            last_commit_at: s.last_commit_at.map(format_rfc3339),
            error: s.error,
        });
        tables.push(TableStatus {
            id: id.clone(),
            strategy: table.strategy.identity().name.clone(),
            retention: table.retention.name().to_string(),
            target: format!("{} ({})", table.target_name, table.backend.target()),
            states: tally
                .states
                .into_iter()
                .map(|(state, t)| {
                    let oldest_age_seconds = ((now - t.oldest_since) / 1_000_000).max(0);
                    (state, StateCount { buckets: t.buckets, rows: t.rows, oldest_age_seconds })
                })
                .collect(),
            held_buckets: tally.held,
            delta_log,
        });
    }
    let oldest_due_age_seconds = match engine.store().earliest_due()? {
        Some(at) if at <= now => (now - at) / 1_000_000,
        _ => 0,
    };
    let (reloads_accepted, reloads_refused) = engine.reload_counts();
    let policy = PolicyStatus {
        dir: policies.dir.display().to_string(),
        generation: policies.generation,
        files: policies.files.clone(),
        plugins: super::plugins::list(engine).plugins,
        retired_tables: policies.retired.iter().cloned().collect(),
        last_reload: engine.last_reload(),
        reloads_accepted,
        reloads_refused,
    };
    let unplanned_buckets = engine.store().unplanned_count()?;
    let planned_last_pass = engine.planned_last_pass();
    let open_erasures = engine.store().open_erasures()?;
    let erasure_buckets_blocked = open_erasures
        .iter()
        .flat_map(|request| &request.buckets)
        .filter(|bucket| bucket.progress == crate::store::erasure::ErasureProgress::Blocked)
        .count() as u64;
    let unmanaged_tables =
        engine.store().table_states()?.into_iter().filter(|t| t.unmanaged_since.is_some()).map(|t| t.id).collect();
    Ok(Status {
        now: format_rfc3339(now),
        data_dir: engine.data_dir().display().to_string(),
        installation_id: engine.installation_id().to_string(),
        unmanaged_tables,
        policy,
        tables,
        due_now: engine.store().due_count(now)?,
        oldest_due_age_seconds,
        unplanned_buckets,
        planned_last_pass,
        plan_settle_estimate_seconds: plan_settle_estimate(
            unplanned_buckets,
            planned_last_pass,
            (engine.settings().interval_us / 1_000_000).max(1) as u64,
        ),
        deferrals,
        leases,
        outbox_backlog: engine.store().outbox_len()?,
        store_poisoned: engine.store().poisoned(),
        targets: policies.target_probes.values().map(|p| p.report()).collect(),
        sweep_stopped: engine.store().sweep_stop()?.map(|stop| SweepStopStatus {
            at: format_rfc3339(stop.at),
            target: stop.target,
            key: stop.key,
            reason: stop.reason,
        }),
        erasures_open: open_erasures.len() as u64,
        erasure_buckets_blocked,
        store_disk: StoreDisk::read(engine),
    })
}

/// Writes the current status to `<data>/status.json` (atomically).
/// Seconds until `queued` buckets are planned when each pass plans `per_pass`, one pass every
/// `interval_seconds`; `None` when some wait and no pace is known.
pub fn plan_settle_estimate(queued: u64, per_pass: u64, interval_seconds: u64) -> Option<u64> {
    match (queued, per_pass) {
        (0, _) => Some(0),
        (_, 0) => None,
        (queued, per_pass) => Some(queued.div_ceil(per_pass).saturating_mul(interval_seconds)),
    }
}

pub fn write_status_file(engine: &Engine) -> Result<()> {
    let status = collect(engine)?;
    let path = engine.data_dir().join(crate::engine::STATUS_FILE);
    let tmp = engine.data_dir().join(format!("{}.tmp", crate::engine::STATUS_FILE));
    let bytes = serde_json::to_vec_pretty(&status).map_err(|e| crate::error::Error::Internal(e.to_string()))?;
    std::fs::write(&tmp, bytes).map_err(|e| crate::error::Error::io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| crate::error::Error::io(&path, e))
}

#[cfg(test)]
mod tests {
    use super::plan_settle_estimate;

    #[test]
    fn the_plan_queue_settles_at_the_last_passes_pace() {
        assert_eq!(plan_settle_estimate(0, 0, 15), Some(0), "nothing waits");
        assert_eq!(plan_settle_estimate(5, 0, 15), None, "no pace known yet");
        assert_eq!(plan_settle_estimate(25_000, 10_000, 15), Some(45), "three passes");
        assert_eq!(plan_settle_estimate(u64::MAX, 1, u64::MAX), Some(u64::MAX), "saturates");
    }
}

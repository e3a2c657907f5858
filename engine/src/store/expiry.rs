//! The steps of an expiry, each one fenced transaction: begin (holds re-checked, the
//! tombstone written before any object is deleted), start deleting, complete, and purge the
//! tombstone once its events are delivered.

use crate::error::{Error, Result};
use crate::model::lifecycle::{self, Step};
use crate::model::{ArchiveTarget, Micros};

use super::holds::{call_off_expiry, park};
use super::outbox::{expiry_events_pending, push_outbox};
use super::schema::{BucketId, MANIFESTS, TOMBSTONES, Tombstone, encode_value};
use super::{
    Store, check_lease, covering_holds, encoding, load_meta, load_tombstone, record_step, save_meta, save_tombstone,
};

impl Store {
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
                park(txn, &mut meta, covering, now, true)?;
                save_meta(txn, &meta)?;
                return Ok(None);
            }
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
            record_step(txn, &mut meta, Step::BeginExpiry, now)?;
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
            txn.open_table(TOMBSTONES)?.insert(id.encode().as_slice(), encode_value(&tombstone)?.as_slice())?;
            record_step(txn, &mut meta, Step::CompleteExpiry { purge_at }, now)?;
            save_meta(txn, &meta)?;
            push_outbox(txn, "archive_expired", Some(&meta), now, serde_json::json!({"objects": tombstone.keys.len()}))
        })
    }

    /// Purges a completed tombstone whose replay period is over, when the bucket still says
    /// `Expired` and every sink has the events that tell of the expiry (they are still in the
    /// outbox otherwise, and the purge waits). The bucket's row stays, so queries still say the
    /// range expired; the copies of its manifests go with the tombstone, so what an expired
    /// bucket keeps in the store does not grow with the generations it had.
    pub fn purge_tombstone(&self, id: BucketId, now: Micros) -> Result<bool> {
        self.write(move |txn| {
            let Some(tombstone) = load_tombstone(txn, &id)? else { return Ok(false) };
            let mut meta = load_meta(txn, &id)?;
            let pending = expiry_events_pending(txn, &id)?;
            if !lifecycle::tombstone_purgeable(meta.state, tombstone.progress(), pending, now) {
                if pending && tombstone.purge_at.is_some_and(|at| at <= now) {
                    // Ask again once the sinks have had time to take the events.
                    record_step(txn, &mut meta, Step::PurgeWaits { retry_at: now + TOMBSTONE_PURGE_RETRY_US }, now)?;
                    save_meta(txn, &meta)?;
                }
                return Ok(false);
            }
            txn.open_table(TOMBSTONES)?.remove(id.encode().as_slice())?;
            // Nothing reads them again: every object of the expired archive is proved absent
            // (a Delta table's log dropped its files before the first delete), the objects of
            // the generations it replaced were released when it was published (the sweep finds
            // them by their released keys), and the bucket's row keeps its state and manifest
            // key for queries and adoption.
            let prefix = id.encode();
            let end = encoding::prefix_end(&prefix);
            txn.open_table(MANIFESTS)?.retain_in(prefix.as_slice()..end.as_slice(), |_, _| false)?;
            record_step(txn, &mut meta, Step::TombstonePurged, now)?;
            save_meta(txn, &meta)?;
            Ok(true)
        })
    }
}

/// How long a tombstone whose expiry events are still waiting for a sink waits before its
/// purge is tried again.
pub const TOMBSTONE_PURGE_RETRY_US: Micros = 60 * 1_000_000;

//! Legal holds: placing, lifting and syncing them (those declared in the policy directory),
//! and what each does to the buckets it covers (parking an expiry, or calling one off).

use redb::{ReadableTable, WriteTransaction};

use crate::error::{Error, Result};
use crate::model::lifecycle::{HoldEffect, Step};
use crate::model::{BucketState, Micros, lifecycle};

use super::outbox::push_outbox;
use super::reads::table_buckets;
use super::schema::{BucketMeta, HOLDS, Hold, TOMBSTONES, Tombstone, decode_value, encode_value};
use super::{Store, covering_holds, load_tombstone, reconcile, record_step, save_meta};

impl Store {
    /// Places a hold, and tells what it did to each bucket it covers now: parks its expiry,
    /// calls off an expiry that has written its tombstone but deleted nothing yet, or comes
    /// too late for a bucket whose objects may already be deleted (listed in the answer).
    pub fn place_hold(&self, hold: Hold, now: Micros) -> Result<HoldPlacement> {
        self.write(move |txn| {
            {
                let mut holds = txn.open_table(HOLDS)?;
                if holds.get(hold.id.as_str())?.is_some() {
                    return Err(Error::Conflict(format!("a hold with id `{}` already exists", hold.id)));
                }
                holds.insert(hold.id.as_str(), encode_value(&hold)?.as_slice())?;
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
                let mut holds = txn.open_table(HOLDS)?;
                let removed = holds.remove(id.as_str())?;
                match removed {
                    Some(v) => decode_value(v.value())?,
                    None => {
                        return Err(Error::NotFound(format!(
                            "no hold with id `{id}`; `frostline hold list` (GET /v1/holds) lists them"
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
                txn.open_table(HOLDS)?.remove(hold.id.as_str())?;
                release_hold(txn, hold, now)?;
                push_outbox(txn, "hold_released", None, now, serde_json::to_value(hold).unwrap_or_default())?;
                sync.released.push(hold.id.clone());
            }
            for hold in active {
                if stored.iter().any(|s| s.id == hold.id) {
                    continue;
                }
                let hold = Hold { placed_at: now, ..hold };
                txn.open_table(HOLDS)?.insert(hold.id.as_str(), encode_value(&hold)?.as_slice())?;
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
        let t = txn.open_table(HOLDS)?;
        let mut out = Vec::new();
        for entry in t.iter()? {
            out.push(decode_value(entry?.1.value())?);
        }
        Ok(out)
    }
}

pub(super) fn all_holds(txn: &WriteTransaction) -> Result<Vec<Hold>> {
    let t = txn.open_table(HOLDS)?;
    let mut out = Vec::new();
    for entry in t.iter()? {
        out.push(decode_value(entry?.1.value())?);
    }
    Ok(out)
}

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

/// Parks a bucket's expiry behind the holds that cover it (an event tells when it is new).
/// `release_lease`: the expiring worker found the holds and gives its lease up.
pub(super) fn park(
    txn: &WriteTransaction,
    meta: &mut BucketMeta,
    covering: Vec<String>,
    now: Micros,
    release_lease: bool,
) -> Result<()> {
    if meta.held_by != covering {
        push_outbox(txn, "expiry_parked", Some(meta), now, serde_json::json!({"holds": covering}))?;
    }
    record_step(txn, meta, Step::Park { release_lease }, now)
}

/// A hold placed after an expiry wrote its tombstone but before its first delete call: the
/// archive is whole, so the expiry is called off. The bucket returns to `Archived` under a
/// new generation (the expiring worker is fenced out) and is parked.
pub(super) fn call_off_expiry(
    txn: &WriteTransaction,
    meta: &mut BucketMeta,
    covering: Vec<String>,
    now: Micros,
) -> Result<()> {
    txn.open_table(TOMBSTONES)?.remove(meta.id.encode().as_slice())?;
    record_step(txn, meta, Step::CallOffExpiry, now)?;
    push_outbox(txn, "expiry_called_off", Some(meta), now, serde_json::json!({"holds": covering}))?;
    save_meta(txn, meta)
}

/// What a newly stored hold does to the buckets it covers (see `lifecycle::hold_effect`).
pub(super) fn apply_hold(txn: &WriteTransaction, hold: &Hold, now: Micros) -> Result<HoldPlacement> {
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
                    park(txn, &mut meta, covering, now, false)?;
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
pub(super) fn release_hold(txn: &WriteTransaction, hold: &Hold, now: Micros) -> Result<()> {
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

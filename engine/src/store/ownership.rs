//! What this data directory can prove it wrote: the epochs of its lives that made object keys,
//! and the keys it released. The orphan sweep deletes an object only on this proof, never
//! because a listing shows an unreferenced key that merely carries this installation's id: a
//! copy of the data directory (a restored backup, a clone) carries the same id, and what the
//! other copy archived after they parted is unreferenced here but is the only copy of its
//! records.
//!
//! A key is released when a bucket's upload intents are dropped (the cleanup that finishes an
//! archival, an adoption): every key an intent recorded (so this directory uploaded under it,
//! invariant 10) that the bucket's published archive does not reference.

use std::collections::HashSet;

use redb::{ReadableTable, WriteTransaction};

use crate::error::{Error, Result};
use crate::model::Micros;

use super::outbox::push_outbox;
use super::reads::Snapshot;
use super::schema::{
    BucketId, EPOCHS, INTENTS, MANIFESTS, META, META_SWEEP_STOPPED, RELEASED, ReleasedKey, SweepStop, UploadIntent,
    decode_value, encode_value,
};
use super::{Store, encoding};

impl Store {
    /// Records `epoch` as one of this data directory's lives, durably, before any key made
    /// with it is uploaded. Recording it again changes nothing.
    pub fn record_epoch(&self, epoch: String, now: Micros) -> Result<()> {
        self.write(move |txn| {
            let mut epochs = txn.open_table(EPOCHS)?;
            if epochs.get(epoch.as_str())?.is_none() {
                epochs.insert(epoch.as_str(), now)?;
            }
            Ok(())
        })
    }

    /// Forgets a released key once the sweep deleted it (or found it gone), and writes the
    /// `orphan_deleted` event for audits in the same transaction when it was deleted.
    pub fn forget_released(&self, released: ReleasedKey, deleted: bool, now: Micros) -> Result<()> {
        self.write(move |txn| {
            txn.open_table(RELEASED)?.remove(released.store_key().as_slice())?;
            if deleted {
                let details = serde_json::json!({"key": released.key, "target": released.target});
                push_outbox(txn, "orphan_deleted", None, now, details)?;
            }
            Ok(())
        })
    }

    /// Records why the orphan sweep stopped (`None`: the last sweep completed).
    pub fn set_sweep_stop(&self, stop: Option<SweepStop>) -> Result<()> {
        self.write(move |txn| {
            let mut meta = txn.open_table(META)?;
            match stop {
                Some(stop) => {
                    let bytes = serde_json::to_vec(&stop).expect("a sweep stop serializes");
                    meta.insert(META_SWEEP_STOPPED, bytes.as_slice())?;
                }
                None => {
                    meta.remove(META_SWEEP_STOPPED)?;
                }
            }
            Ok(())
        })
    }

    /// Why the last orphan sweep stopped, while no sweep has completed since.
    pub fn sweep_stop(&self) -> Result<Option<SweepStop>> {
        let Some(bytes) = self.meta_value(META_SWEEP_STOPPED)? else { return Ok(None) };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Corruption(format!("the recorded sweep stop does not parse: {e}")))
    }
}

impl Snapshot {
    /// Every epoch this data directory recorded.
    pub fn epochs(&self) -> Result<HashSet<String>> {
        let t = self.txn().open_table(EPOCHS)?;
        let mut out = HashSet::new();
        for entry in t.iter()? {
            out.insert(entry?.0.value().to_string());
        }
        Ok(out)
    }

    /// Released keys, in target and key order, at most `limit`.
    pub fn released(&self, limit: usize) -> Result<Vec<ReleasedKey>> {
        let t = self.txn().open_table(RELEASED)?;
        let mut out = Vec::new();
        for entry in t.iter()?.take(limit) {
            out.push(decode_value(entry?.1.value())?);
        }
        Ok(out)
    }
}

/// Drops every upload intent of bucket `id` and releases each key they recorded that the
/// archive the bucket now has (`manifest`, stored at `manifest_key`) does not use.
pub(super) fn release_intents(
    txn: &WriteTransaction,
    id: &BucketId,
    manifest: &crate::format::manifest::Manifest,
    manifest_key: Option<&str>,
    now: Micros,
) -> Result<()> {
    let mut kept: HashSet<&str> = manifest.segments.iter().map(|s| s.key.as_str()).collect();
    kept.extend(manifest_key);
    let prefix = id.encode();
    let end = encoding::prefix_end(&prefix);
    let mut intents = txn.open_table(INTENTS)?;
    let mut released = txn.open_table(RELEASED)?;
    for entry in intents.range(prefix.as_slice()..end.as_slice())? {
        let intent: UploadIntent = decode_value(entry?.1.value())?;
        for key in intent.keys.into_iter().filter(|key| !kept.contains(key.as_str())) {
            let record = ReleasedKey { table: id.table.clone(), target: intent.target.clone(), key, released_at: now };
            released.insert(record.store_key().as_slice(), encode_value(&record)?.as_slice())?;
        }
    }
    intents.retain_in(prefix.as_slice()..end.as_slice(), |_, _| false)?;
    Ok(())
}

/// Releases what the archive a next generation replaced (`amends`) used and the new one
/// (`manifest`, at `manifest_key`) does not: its manifest and segments, on the target it was
/// written to. They were this directory's published (or adopted) archive until the new one was
/// published and its hot rows deleted; only then are they released.
pub(super) fn release_replaced(
    txn: &WriteTransaction,
    id: &BucketId,
    amends: &crate::format::manifest::Amendment,
    manifest: &crate::format::manifest::Manifest,
    manifest_key: Option<&str>,
    now: Micros,
) -> Result<()> {
    // The replaced archive is the one recorded before the newest (recorded generations are
    // this directory's fencing generations, which an adopted manifest's own need not be).
    let prefix = id.encode();
    let end = encoding::prefix_end(&prefix);
    let replaced: Option<crate::format::manifest::Manifest> = {
        let manifests = txn.open_table(MANIFESTS)?;
        let mut newest_first = manifests.range(prefix.as_slice()..end.as_slice())?.rev();
        let _newest = newest_first.next().transpose()?;
        newest_first.next().transpose()?.map(|(_, v)| decode_value(v.value())).transpose()?
    };
    let mut kept: HashSet<&str> = manifest.segments.iter().map(|s| s.key.as_str()).collect();
    kept.extend(manifest_key);
    // Anything but the archive the new one names as replaced is kept: an object left behind
    // costs storage, one deleted wrongly costs records.
    let Some(old) = replaced.filter(|old| old.generation == amends.generation) else {
        tracing::warn!(bucket = %id, replaced = %amends.manifest_key, "the replaced archive is not the one recorded; its objects are kept");
        return Ok(());
    };
    release_archive(txn, id, &old, &amends.manifest_key, &kept, now)
}

/// Releases the objects of archive `old` (at `old_key`) that `kept` does not name: its
/// segments and its manifest, on the target it was written to.
pub(super) fn release_archive(
    txn: &WriteTransaction,
    id: &BucketId,
    old: &crate::format::manifest::Manifest,
    old_key: &str,
    kept: &HashSet<&str>,
    now: Micros,
) -> Result<()> {
    let mut released = txn.open_table(RELEASED)?;
    let keys = old.segments.iter().map(|s| s.key.as_str()).chain([old_key]);
    for key in keys.filter(|key| !kept.contains(key)) {
        let record =
            ReleasedKey { table: id.table.clone(), target: old.target.clone(), key: key.to_string(), released_at: now };
        released.insert(record.store_key().as_slice(), encode_value(&record)?.as_slice())?;
    }
    Ok(())
}

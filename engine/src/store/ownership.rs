//! What this data directory can prove it wrote: the epochs of its lives that made object keys,
//! and the keys it released. The orphan sweep deletes an object only on this proof, never
//! because a listing shows an unreferenced key that merely carries this installation's id: a
//! copy of the data directory (a restored backup, a clone) carries the same id, and what the
//! other copy archived after they parted is unreferenced here but is the only copy of its
//! records.
//!
//! A key is released when a bucket's upload intents are dropped (the cleanup that finishes an
//! archival, an adoption): every key an intent recorded (so this directory uploaded under it,
//! invariant 10) that the bucket's published archive does not reference. So is every object of
//! an archive a next generation replaced; its manifest's copy is then dropped (a Delta table's
//! once a sync removed its files from the log), since the released keys name where its objects
//! lie: a bucket keeps one copy, whatever its generations.

use std::collections::HashSet;

use redb::{ReadableTable, ReadableTableMetadata, WriteTransaction};

use crate::error::{Error, Result};
use crate::model::Micros;

use super::outbox::push_outbox;
use super::reads::Snapshot;
use super::schema::{
    BUCKETS, BucketId, EPOCHS, INTENTS, MANIFESTS, META, META_INSTALLATION_SINCE, META_SWEEP_STOPPED, RELEASED,
    ReleasedKey, SweepStop, TOMBSTONES, Tombstone, UploadIntent, decode_value, encode_value,
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

    /// Records when this installation began, once: `now` for a data directory that holds
    /// nothing yet (no bucket, no life that wrote a key), `i64::MIN` ("always") for one that
    /// held data before this was recorded, whose beginning is unknown.
    pub fn record_installation_since(&self, now: Micros) -> Result<()> {
        self.write(move |txn| {
            let mut meta = txn.open_table(META)?;
            if meta.get(META_INSTALLATION_SINCE)?.is_some() {
                return Ok(());
            }
            let empty = txn.open_table(BUCKETS)?.is_empty()? && txn.open_table(EPOCHS)?.is_empty()?;
            let since = if empty { now } else { Micros::MIN };
            meta.insert(META_INSTALLATION_SINCE, since.to_be_bytes().as_slice())?;
            Ok(())
        })
    }

    /// When this installation began (`record_installation_since`; `Micros::MIN` when unknown).
    pub fn installation_since(&self) -> Result<Micros> {
        let Some(bytes) = self.meta_value(META_INSTALLATION_SINCE)? else { return Ok(Micros::MIN) };
        let bytes: [u8; 8] = bytes
            .try_into()
            .map_err(|_| Error::Corruption("the recorded beginning of the installation is malformed".into()))?;
        Ok(Micros::from_be_bytes(bytes))
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

/// What one bucket's records name on its targets, read from one snapshot: what the sweep must
/// keep of the keys released in the bucket's folders.
#[derive(Debug, Default)]
pub struct BucketReferences {
    /// Segments of its recorded archives (but those a newer recorded generation replaced), its
    /// manifest, keys its upload intents name and keys its unfinished expiry will delete.
    pub keys: HashSet<String>,
    /// The generation the database last issued for it.
    pub generation: u64,
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
        self.released_after(None, limit)
    }

    /// Released keys after `cursor` (the `store_key` of a released key), in target and key
    /// order, at most `limit`: where the incremental sweep goes on from.
    pub fn released_after(&self, cursor: Option<&[u8]>, limit: usize) -> Result<Vec<ReleasedKey>> {
        use std::ops::Bound;
        let t = self.txn().open_table(RELEASED)?;
        let from = cursor.map_or(Bound::Unbounded, Bound::Excluded);
        let mut out = Vec::new();
        for entry in t.range::<&[u8]>((from, Bound::Unbounded))?.take(limit) {
            out.push(decode_value(entry?.1.value())?);
        }
        Ok(out)
    }

    /// What bucket `id` references (see `BucketReferences`); the same rules as the full sweep's
    /// reference set, for one bucket.
    pub fn bucket_references(&self, id: &BucketId) -> Result<BucketReferences> {
        let mut out = BucketReferences::default();
        let manifests = self.manifests_of(id)?;
        let replaced: HashSet<u64> = manifests.iter().filter_map(|m| m.amends.as_ref().map(|a| a.generation)).collect();
        for manifest in manifests.into_iter().filter(|m| !replaced.contains(&m.generation)) {
            out.keys.extend(manifest.segments.into_iter().map(|s| s.key));
        }
        if let Some(meta) = self.bucket(id)? {
            out.generation = meta.generation;
            out.keys.extend(meta.manifest_key);
        }
        let prefix = id.encode();
        let end = encoding::prefix_end(&prefix);
        let intents = self.txn().open_table(INTENTS)?;
        for entry in intents.range(prefix.as_slice()..end.as_slice())? {
            let intent: UploadIntent = decode_value(entry?.1.value())?;
            out.keys.extend(intent.keys);
        }
        if let Some(tombstone) = self.txn().open_table(TOMBSTONES)?.get(prefix.as_slice())? {
            let tombstone: Tombstone = decode_value(tombstone.value())?;
            if tombstone.completed_at.is_none() {
                out.keys.extend(tombstone.keys);
            }
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
            let record = ReleasedKey {
                table: id.table.clone(),
                target: intent.target.clone(),
                key,
                released_at: now,
                bucket: Some(id.clone()),
            };
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
    release_archive(txn, id, &old, &amends.manifest_key, &kept, now)?;
    // Its copy (and any older one's) would otherwise stay for every generation the bucket ever
    // had. From here on its objects are found by their released keys, which name their target,
    // so the copy goes now, unless a Delta log may still list its files: the Delta sync drops
    // those copies once a commit of its has removed them (`drop_replaced_copies_after_sync`),
    // and this change sends it back to the bucket after the cleanup.
    if drop_replaced_copies(txn, id, |copy| !in_delta_table(copy))? > 0 {
        super::note_publication_change(txn, id)?;
    }
    Ok(())
}

/// Whether a Delta log may list archive `manifest`'s segments: they lie below its table's
/// Delta root (`keys::delta_table_root`).
pub(super) fn in_delta_table(manifest: &crate::format::manifest::Manifest) -> bool {
    let root = crate::storage::keys::delta_table_root(&manifest.table);
    manifest.segments.iter().any(|segment| segment.key.starts_with(&root))
}

/// Drops the copies of bucket `id`'s manifests older than its newest recorded one that `drop`
/// accepts. Returns how many older copies are left.
pub(super) fn drop_replaced_copies(
    txn: &WriteTransaction,
    id: &BucketId,
    drop: impl Fn(&crate::format::manifest::Manifest) -> bool,
) -> Result<usize> {
    let prefix = id.encode();
    let end = encoding::prefix_end(&prefix);
    let mut manifests = txn.open_table(MANIFESTS)?;
    let mut older: Vec<(Vec<u8>, bool)> = Vec::new();
    for entry in manifests.range(prefix.as_slice()..end.as_slice())? {
        let (key, value) = entry?;
        older.push((key.value().to_vec(), drop(&decode_value(value.value())?)));
    }
    older.pop(); // the newest stays: it is the published archive
    let mut left = 0;
    for (key, dropped) in older {
        if dropped {
            manifests.remove(key.as_slice())?;
        } else {
            left += 1;
        }
    }
    Ok(left)
}

impl Store {
    /// Drops the copies of the manifests each bucket's newest one replaced, after a Delta sync
    /// that read the bucket as `(id, newest)` (`newest`: the generation of its newest recorded
    /// manifest then) committed: every file of theirs that the sync's log listed is removed,
    /// so no reader of the log is sent to them, and their objects are found by their released
    /// keys. A bucket whose newest manifest changed since, or whose cleanup has not released
    /// the replaced archive yet, keeps its copies. Each bucket whose copies go is noted as a
    /// publication change, so the next sync's index drops their files too. Returns how many
    /// copies went.
    pub fn drop_replaced_copies_after_sync(&self, buckets: Vec<(BucketId, u64)>) -> Result<usize> {
        if buckets.is_empty() {
            return Ok(0);
        }
        self.write(move |txn| {
            let mut dropped = 0;
            for (id, newest) in &buckets {
                let meta: Option<super::schema::BucketMeta> = txn
                    .open_table(BUCKETS)?
                    .get(id.encode().as_slice())?
                    .map(|v| decode_value(v.value()))
                    .transpose()?;
                if !meta.as_ref().is_some_and(super::schema::BucketMeta::replaced_archives_released) {
                    continue;
                }
                let (copies, newest_recorded) = copies_and_newest(txn, id)?;
                if copies < 2 || newest_recorded.map(|m| m.generation) != Some(*newest) {
                    continue;
                }
                drop_replaced_copies(txn, id, |_| true)?;
                dropped += copies - 1;
                super::note_publication_change(txn, id)?;
            }
            Ok(dropped)
        })
    }
}

/// How many manifests are recorded for bucket `id`, and the newest of them.
fn copies_and_newest(
    txn: &WriteTransaction,
    id: &BucketId,
) -> Result<(usize, Option<crate::format::manifest::Manifest>)> {
    let prefix = id.encode();
    let end = encoding::prefix_end(&prefix);
    let manifests = txn.open_table(MANIFESTS)?;
    let copies = manifests.range(prefix.as_slice()..end.as_slice())?.count();
    let newest = manifests.range(prefix.as_slice()..end.as_slice())?.next_back().transpose()?;
    Ok((copies, newest.map(|(_, v)| decode_value(v.value())).transpose()?))
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
        let record = ReleasedKey {
            table: id.table.clone(),
            target: old.target.clone(),
            key: key.to_string(),
            released_at: now,
            bucket: Some(id.clone()),
        };
        released.insert(record.store_key().as_slice(), encode_value(&record)?.as_slice())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The incremental sweep pages through released keys from a cursor: every key once, in
    /// target and key order, whatever the page size; a row written before released keys named
    /// their bucket still reads (without one).
    #[test]
    fn released_keys_page_from_a_cursor_and_rows_without_a_bucket_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("hot.redb")).unwrap();
        let id = BucketId { table: "t".into(), partition_key: b"p".to_vec(), bucket_key: "day:2024-01-01".into() };
        let rows: Vec<ReleasedKey> = (0..7)
            .map(|n| ReleasedKey {
                table: "t".into(),
                target: format!("file:///target-{}", n % 2),
                key: format!("table=t/seg-{n}"),
                released_at: n,
                bucket: (n != 3).then(|| id.clone()),
            })
            .collect();
        let written = rows.clone();
        store
            .write(move |txn| {
                let mut released = txn.open_table(RELEASED)?;
                for row in &written {
                    released.insert(row.store_key().as_slice(), encode_value(row)?.as_slice())?;
                }
                Ok(())
            })
            .unwrap();
        // A row as an earlier version stored it: no `bucket` field at all.
        #[derive(serde::Serialize)]
        struct Earlier {
            table: &'static str,
            target: &'static str,
            key: &'static str,
            released_at: Micros,
        }
        let earlier = Earlier { table: "t", target: "file:///target-9", key: "table=t/old", released_at: 0 };
        let earlier_key = ReleasedKey {
            table: "t".into(),
            target: earlier.target.into(),
            key: earlier.key.into(),
            released_at: 0,
            bucket: None,
        }
        .store_key();
        store
            .write(move |txn| {
                txn.open_table(RELEASED)?.insert(earlier_key.as_slice(), encode_value(&earlier)?.as_slice())?;
                Ok(())
            })
            .unwrap();
        let snapshot = store.snapshot().unwrap();
        let everything = snapshot.released(100).unwrap();
        assert_eq!(everything.len(), 8);
        for page in 1..=8 {
            let (mut cursor, mut seen) = (None, Vec::new());
            loop {
                let got = snapshot.released_after(cursor.as_deref(), page).unwrap();
                cursor = got.last().map(ReleasedKey::store_key);
                let done = got.len() < page;
                seen.extend(got);
                if done {
                    break;
                }
            }
            assert_eq!(seen, everything, "pages of {page}");
        }
        assert_eq!(everything.iter().filter(|r| r.bucket.is_none()).count(), 2, "row 3 and the earlier row");
        assert_eq!(everything.last().unwrap().key, "table=t/old");
    }
}

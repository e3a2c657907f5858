//! Adoption: a verified archive found on a target, which this database does not record, is
//! taken in as the bucket's published archive (`frostline adopt`). It serves a data directory
//! rebuilt from nothing (the archives of the lost one) and one restored from a backup (the
//! archives the copy that went on running published after the backup was taken).

use std::collections::{BTreeSet, HashMap, HashSet};

use redb::{ReadableTable, WriteTransaction};
use sha2::{Digest, Sha256};

use crate::error::Result;
use crate::format::manifest::Manifest;
use crate::model::lifecycle::{self, Step};
use crate::model::{ArchiveTarget, BucketState, Micros, Record};

use super::outbox::push_outbox;
use super::ownership::{drop_replaced_copies, in_delta_table, release_archive, release_intents};
use super::schema::{
    BUCKETS, BucketId, BucketMeta, MANIFESTS, Shared, Tombstone, decode_row_key, decode_row_ref, decode_value,
    encode_value, generation_key, row_key, rows_table, rows_table_name,
};
use super::{
    LifecycleInputs, Store, index_new_bucket, load_meta, load_tombstone, record_step, save_meta, save_tombstone,
};

/// What adopting one archive did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adoption {
    /// The bucket was unknown; it is now archived (its hot rows deleted) under the manifest.
    Adopted,
    /// The bucket was hot or being archived, or a later generation of its archive stood in
    /// for it: its hot rows the archive holds were released, those it lacks are kept beside
    /// it for the bucket's next generation, and the bucket is archived under the manifest.
    Replaced { hot_rows: u64 },
    /// The database already records this manifest.
    Known,
    /// A generation the recorded archive replaced: its lineage names this manifest, and it
    /// holds every row of it. Nothing changed; the sweep deletes it once it was released.
    Superseded,
    /// The database records something the archive cannot stand in for; nothing changed.
    Conflict(String),
}

/// One archive to adopt, read back and verified a segment at a time: its manifest, what its rows
/// add up to, and how it holds the rows the bucket holds hot. Never its rows: a bucket larger
/// than the host's memory is adopted as any other.
pub struct VerifiedArchive {
    pub id: BucketId,
    pub manifest_key: String,
    pub manifest: Manifest,
    pub facts: ArchiveFacts,
    pub hot: HotRowsHeld,
}

/// What the rows of an archive add up to, observed one row at a time as they are verified: the
/// bucket's row and byte counts and the tenant and kind its retention decides on.
#[derive(Debug, Clone, Default)]
pub struct ArchiveFacts {
    pub rows: u64,
    pub body_bytes: u64,
    pub tenant: Shared,
    pub kind: Shared,
}

impl ArchiveFacts {
    pub fn observe(&mut self, row: &Record) {
        self.tenant.observe(row.tenant.as_deref(), self.rows);
        self.kind.observe(row.kind.as_deref(), self.rows);
        self.rows += 1;
        self.body_bytes += row.body.len() as u64;
    }
}

/// The bucket's hot rows when its archive was read (`Store::hot_rows_to_match`), by row key,
/// each with the digest of the content (tenant, kind, body) of the archive's row of that
/// identity, or `None` where the archive lacks it. Adoption compares each hot row with it in
/// its transaction: memory follows the hot rows' identities, not the archive.
#[derive(Debug, Clone, Default)]
pub struct HotRowsHeld {
    by_key: HashMap<Vec<u8>, Option<[u8; 32]>>,
    /// The event times of the first and last hot row: only the segments between hold any.
    span: Option<(Micros, Micros)>,
}

impl HotRowsHeld {
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Whether a segment of rows from `min` to `max` (event times) can hold a hot row's identity.
    pub fn overlaps(&self, min: Micros, max: Micros) -> bool {
        self.span.is_some_and(|(first, last)| min <= last && max >= first)
    }

    /// Records the content of an archived row, if the bucket holds its identity hot.
    pub fn observe(&mut self, row: &Record) {
        if let Some(slot) = self.by_key.get_mut(&row_key(row.event_time, &row.sort_key)) {
            *slot = Some(content_digest(row.tenant.as_deref(), row.kind.as_deref(), &row.body));
        }
    }
}

/// A digest of what a row holds besides its identity, the same for an archived and a hot row.
fn content_digest(tenant: Option<&str>, kind: Option<&str>, body: &str) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for field in [tenant, kind, Some(body)] {
        match field {
            None => hasher.update([0]),
            Some(value) => {
                hasher.update([1]);
                hasher.update((value.len() as u64).to_be_bytes());
                hasher.update(value.as_bytes());
            }
        }
    }
    hasher.finalize().into()
}

impl Store {
    /// The bucket's hot rows now, to be matched with an archive's before it is adopted
    /// (`HotRowsHeld::observe`): their keys only.
    pub fn hot_rows_to_match(&self, id: &BucketId) -> Result<HotRowsHeld> {
        let snapshot = self.snapshot()?;
        let Some(rows) = super::reads::open_rows(snapshot.txn(), id)? else { return Ok(HotRowsHeld::default()) };
        let first = rows.first()?.map(|(k, _)| decode_row_key(k.value())).transpose()?;
        let last = rows.last()?.map(|(k, _)| decode_row_key(k.value())).transpose()?;
        let mut by_key = HashMap::new();
        for entry in rows.iter()? {
            by_key.insert(entry?.0.value().to_vec(), None);
        }
        let span = first.zip(last).map(|((first, _), (last, _))| (first, last));
        Ok(HotRowsHeld { by_key, span })
    }

    /// Adopts one verified archive, in one transaction. An unknown bucket is recorded as
    /// archived; a hot or fenced bucket, or one whose recorded archive the archive succeeds,
    /// only when none of its hot rows is held by the archive with other content: the rows the
    /// archive holds byte for byte are deleted, as a cleanup would, and those it lacks stay
    /// beside it as late rows (records appended after the copies parted, or that the other copy
    /// erased), so the bucket's next generation holds them. Anything else is a conflict that
    /// changes nothing. Adopted buckets are queued for a retention plan made with their facts.
    pub fn adopt(&self, archive: VerifiedArchive, now: Micros) -> Result<Adoption> {
        self.write(move |txn| {
            let VerifiedArchive { id, manifest_key, manifest, facts, hot } = archive;
            let existing: Option<BucketMeta> =
                txn.open_table(BUCKETS)?.get(id.encode().as_slice())?.map(|v| decode_value(v.value())).transpose()?;
            let recorded = match &existing {
                Some(_) => latest_recorded(txn, &id)?,
                None => None,
            };
            let mut released = 0;
            let mut recorded_released = false;
            let mut kept = KeptRows::default();
            let mut meta = match existing {
                None => {
                    let mut meta = adopted_meta(&id, &manifest_key, &manifest, &facts, now);
                    index_new_bucket(txn, &meta)?;
                    meta.hot_deleted_at = Some(now);
                    meta
                }
                Some(meta) if meta.manifest_key.as_deref() == Some(manifest_key.as_str()) => return Ok(Adoption::Known),
                Some(_) if recorded.as_ref().is_some_and(|r| r.descends_from(&manifest_key)) => {
                    return Ok(Adoption::Superseded);
                }
                // A hot or fenced bucket whose every hot row is in the archive; or a next
                // generation of the archive this database records, published by another copy
                // of it (late records), holding every row of the one it replaces and those
                // added since (rows waiting beside the replaced one must all be in it too).
                Some(meta)
                    if matches!(meta.state, BucketState::Hot | BucketState::Archiving)
                        || succeeds(&meta, recorded.as_ref(), &manifest) =>
                {
                    if meta.descriptor != manifest.bucket {
                        return Ok(Adoption::Conflict(format!(
                            "bucket {id} is recorded as [{}, {}) but the archive covers [{}, {})",
                            meta.descriptor.start, meta.descriptor.end, manifest.bucket.start, manifest.bucket.end
                        )));
                    }
                    if meta.state != (BucketState::Archived { hot_deleted: true }) {
                        match release_hot_rows_held_by(txn, &id, &hot, &manifest_key)? {
                            Err(why) => return Ok(Adoption::Conflict(why)),
                            Ok((count, lacking)) => (released, kept) = (count, lacking),
                        }
                    }
                    release_intents(txn, &id, &manifest, Some(&manifest_key), now)?;
                    // A later generation of the recorded archive replaces it, as a cleanup's
                    // would: what the recorded one used and the new one does not is released.
                    if let (Some(recorded), Some(recorded_key)) = (&recorded, &meta.manifest_key)
                        && manifest.descends_from(recorded_key)
                    {
                        let mut kept: HashSet<&str> = manifest.segments.iter().map(|s| s.key.as_str()).collect();
                        kept.insert(manifest_key.as_str());
                        release_archive(txn, &id, recorded, recorded_key, &kept, now)?;
                        recorded_released = true;
                    }
                    let adopted = adopted_meta(&id, &manifest_key, &manifest, &facts, now);
                    let mut meta = meta;
                    // Later claims must not reuse a generation either copy has used.
                    meta.generation = meta.generation.max(manifest.generation);
                    meta.attempts = 0;
                    meta.last_error = None;
                    meta.manifest_key = adopted.manifest_key;
                    meta.row_count = adopted.row_count;
                    meta.byte_count = adopted.byte_count;
                    (meta.tenant, meta.kind) = (adopted.tenant, adopted.kind);
                    kept.fold_into(&mut meta.tenant, &mut meta.kind, adopted.row_count);
                    meta.archived_at = adopted.archived_at;
                    meta.hot_deleted_at = Some(now);
                    meta.plan = None;
                    meta.plan_basis = None;
                    meta.row_count += kept.rows;
                    meta.byte_count += kept.body_bytes;
                    meta
                }
                Some(meta) => {
                    return Ok(Adoption::Conflict(format!(
                        "bucket {id} is {} under {} (generation {}); the archive `{manifest_key}` (generation {}) \
                         cannot replace it",
                        meta.state,
                        meta.manifest_key.as_deref().unwrap_or("no manifest"),
                        meta.generation,
                        manifest.generation
                    )));
                }
            };
            txn.open_table(MANIFESTS)?
                .insert(generation_key(&id, meta.generation).as_slice(), encode_value(&manifest)?.as_slice())?;
            if recorded_released {
                // As a cleanup does: the released archive's copy goes (a Delta table's after a
                // sync, which the adoption's publication change sends to the bucket).
                drop_replaced_copies(txn, &id, |copy| !in_delta_table(copy))?;
            }
            // A stale plan never acts: the policy is asked again with the archive's facts.
            record_step(txn, &mut meta, Step::Adopt, now)?;
            if kept.rows > 0 {
                // The hot rows the archive lacks wait beside it, as late records do.
                record_step(txn, &mut meta, Step::LateRecord { republish_at: now }, now)?;
            }
            save_meta(txn, &meta)?;
            push_outbox(
                txn,
                "bucket_adopted",
                Some(&meta),
                now,
                serde_json::json!({"manifest_key": manifest_key, "rows": manifest.summary.rows, "hot_rows_released": released}),
            )?;
            Ok(if released > 0 { Adoption::Replaced { hot_rows: released } } else { Adoption::Adopted })
        })
    }

    /// Records that an archive this database published or adopted is gone from its target,
    /// which `frostline adopt` found by listing it: another copy of the data directory (the
    /// one that went on after the backup this one was restored from) expired it. The bucket
    /// becomes `Expired` under a completed tombstone that says so, as if this copy had expired
    /// it, so queries report the range as expired instead of failing on a missing manifest.
    /// Only a bucket still archived under exactly that manifest, its hot rows deleted, changes
    /// (`true`); anything else is left as it is.
    /// Records that the deletes of an expiry this data directory had begun but not started
    /// deleting have happened elsewhere: its archive's manifest is gone from the target (another
    /// copy of the data directory, which went on after this one was backed up, finished the
    /// expiry). From now on a hold is too late for it, as it would be had this copy started the
    /// deletes itself, so it can no longer bring back an archive that is gone; the expiry's next
    /// step deletes what may be left and completes it. `false` when the tombstone is not (or no
    /// longer) that expiry's.
    pub fn record_expiry_deleting_elsewhere(&self, id: BucketId, manifest_key: String, now: Micros) -> Result<bool> {
        self.write(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            let Some(mut tombstone) = load_tombstone(txn, &id)? else { return Ok(false) };
            if meta.state != BucketState::Expired
                || tombstone.manifest_key != manifest_key
                || tombstone.completed_at.is_some()
                || tombstone.deletes_started_at.is_some()
            {
                return Ok(false);
            }
            tombstone.deletes_started_at = Some(now);
            save_tombstone(txn, &tombstone)?;
            record_step(txn, &mut meta, Step::DeletingElsewhere, now)?;
            save_meta(txn, &meta)?;
            Ok(true)
        })
    }

    /// Records an archive another copy of this data directory expired as expired here (a
    /// completed tombstone that says why). Rows appended beside it since (late records, or a
    /// next generation that cannot be made without it) go with it: retention had expired their
    /// range, as the other copy decided, and a record for it is refused from now on.
    pub fn record_archive_gone(
        &self,
        id: BucketId,
        manifest_key: String,
        target: ArchiveTarget,
        now: Micros,
        purge_at: Micros,
    ) -> Result<bool> {
        self.write(move |txn| {
            let mut meta = load_meta(txn, &id)?;
            let gone = Step::ArchiveGone { purge_at };
            let inputs = LifecycleInputs::load(txn, &meta)?;
            if meta.manifest_key.as_deref() != Some(manifest_key.as_str())
                || lifecycle::apply(&inputs.view(&meta, now), gone, now).is_err()
            {
                return Ok(false);
            }
            let reason =
                "the archive is gone from its target: another copy of this data directory expired it".to_string();
            if meta.state != (BucketState::Archived { hot_deleted: true }) {
                txn.delete_table(rows_table(&rows_table_name(&id)))?;
            }
            save_tombstone(
                txn,
                &Tombstone {
                    bucket: id.clone(),
                    bounds: meta.descriptor.clone(),
                    manifest_key: manifest_key.clone(),
                    keys: Vec::new(),
                    reason: reason.clone(),
                    expired_at: now,
                    completed_at: Some(now),
                    purge_at: Some(purge_at),
                    target,
                    deletes_started_at: Some(now),
                },
            )?;
            record_step(txn, &mut meta, gone, now)?;
            save_meta(txn, &meta)?;
            push_outbox(
                txn,
                "archive_expired",
                Some(&meta),
                now,
                serde_json::json!({"manifest_key": manifest_key, "reason": reason, "objects": 0}),
            )?;
            Ok(true)
        })
    }
}

/// Whether `manifest` is a later generation of the cleaned archive `meta` records (`recorded`),
/// so that adopting it loses nothing: its lineage names the recorded archive's key. Generation
/// numbers alone prove nothing: a copy restored from a backup, or an installation that adopted
/// a stale generation of a lost one, reaches the same numbers on a fork of its own, whose
/// archive lacks the rows of the recorded one.
fn succeeds(meta: &BucketMeta, recorded: Option<&Manifest>, manifest: &Manifest) -> bool {
    let (Some(recorded_key), Some(recorded)) = (&meta.manifest_key, recorded) else {
        return false;
    };
    matches!(meta.state, BucketState::Archived { hot_deleted: true } | BucketState::ArchivedPending)
        && manifest.generation > recorded.generation
        && manifest.descends_from(recorded_key)
}

/// The newest manifest the database records for the bucket.
fn latest_recorded(txn: &WriteTransaction, id: &BucketId) -> Result<Option<Manifest>> {
    let manifests = txn.open_table(MANIFESTS)?;
    let prefix = id.encode();
    let end = super::encoding::prefix_end(&prefix);
    let last = manifests.range(prefix.as_slice()..end.as_slice())?.next_back();
    last.map(|entry| entry.map_err(Into::into).and_then(|(_, v)| decode_value(v.value()))).transpose()
}

/// The bucket an archive describes, archived and queued for a plan.
fn adopted_meta(
    id: &BucketId,
    manifest_key: &str,
    manifest: &Manifest,
    facts: &ArchiveFacts,
    now: Micros,
) -> BucketMeta {
    // The manifest names the strategy as "<name> <fingerprint>".
    let strategy = manifest.strategy.rsplit_once(' ').map_or(manifest.strategy.as_str(), |(_, f)| f);
    BucketMeta {
        id: id.clone(),
        descriptor: manifest.bucket.clone(),
        strategy: strategy.to_string(),
        state: BucketState::Archived { hot_deleted: true },
        generation: manifest.generation,
        lease_owner: None,
        lease_expires_at: 0,
        attempts: 0,
        next_retry_at: None,
        last_error: None,
        manifest_key: Some(manifest_key.to_string()),
        row_count: facts.rows,
        byte_count: facts.body_bytes,
        tenant: facts.tenant.clone(),
        kind: facts.kind.clone(),
        plan: None,
        due_at: None,
        created_at: now,
        state_since: now,
        archived_at: Some(manifest.created_at),
        hot_deleted_at: None,
        held_by: Vec::new(),
        plan_basis: None,
        cleanup_proven: None,
    }
}

/// The hot rows adoption keeps beside the archive it adopted, which lacks them.
#[derive(Debug, Default, Clone)]
struct KeptRows {
    rows: u64,
    body_bytes: u64,
    /// The distinct tenants and kinds they hold: the bucket's retention facts are the archive's
    /// and theirs together (an `invoice` kept beside archived `debug` records makes the bucket
    /// mixed, so it is never expired as all-`debug`).
    tenants: BTreeSet<Option<String>>,
    kinds: BTreeSet<Option<String>>,
}

impl KeptRows {
    /// Folds the kept rows' tenants and kinds into what the adopted archive's `archived_rows`
    /// rows share.
    fn fold_into(&self, tenant: &mut Shared, kind: &mut Shared, archived_rows: u64) {
        for (i, value) in self.tenants.iter().enumerate() {
            tenant.observe(value.as_deref(), archived_rows + i as u64);
        }
        for (i, value) in self.kinds.iter().enumerate() {
            kind.observe(value.as_deref(), archived_rows + i as u64);
        }
    }
}

/// Deletes the bucket's hot rows that the archive `manifest_key` holds exactly (`hot`, read
/// from it) and keeps those whose identity it lacks; returns how many were deleted and what was
/// kept. A hot row whose identity the archive holds with other content is a conflict, and so is
/// one added since the archive was read; either way nothing is deleted.
fn release_hot_rows_held_by(
    txn: &WriteTransaction,
    id: &BucketId,
    hot: &HotRowsHeld,
    manifest_key: &str,
) -> Result<std::result::Result<(u64, KeptRows), String>> {
    let name = rows_table_name(id);
    let mut records = txn.open_table(rows_table(&name))?;
    let mut held = Vec::new();
    let mut kept = KeptRows::default();
    for entry in records.iter()? {
        let (k, v) = entry?;
        let row = decode_row_ref(v.value())?;
        match hot.by_key.get(k.value()) {
            Some(Some(digest)) if *digest == content_digest(row.tenant, row.kind, row.body) => {
                held.push(k.value().to_vec())
            }
            Some(Some(_)) => {
                let (event_time, sort_key) = decode_row_key(k.value())?;
                return Ok(Err(format!(
                    "bucket {id} holds a hot row the archive `{manifest_key}` holds with other content (at \
                     {event_time}, sort key `{}`): the copies parted and each kept another record under one \
                     identity; the bucket is left as it is, and the archive stays on the target, not adopted",
                    String::from_utf8_lossy(&sort_key)
                )));
            }
            Some(None) => {
                kept.rows += 1;
                kept.body_bytes += row.body.len() as u64;
                kept.tenants.insert(row.tenant.map(str::to_string));
                kept.kinds.insert(row.kind.map(str::to_string));
            }
            None => {
                return Ok(Err(format!(
                    "bucket {id} took hot rows after its archive `{manifest_key}` was read: the bucket is left as it \
                     is; stop the engine and run adopt again"
                )));
            }
        }
    }
    let released = held.len() as u64;
    if kept.rows == 0 {
        // Every row is in the archive: the bucket's rows table goes whole.
        drop(records);
        txn.delete_table(rows_table(&name))?;
    } else {
        for key in held {
            records.remove(key.as_slice())?;
        }
    }
    Ok(Ok((released, kept)))
}

//! The orphan sweep: deletes what this data directory can prove it wrote and no longer
//! needs, and clears the targets' scratch folders (`.tmp/`, `.frostline-probe/`), each once
//! older than the grace period, in bounded pages.
//!
//! What it may delete in a table's folders is what the store released (`store::ownership`):
//! keys this data directory recorded in an upload intent before uploading under them, that the
//! bucket's published archive does not reference. An unreferenced object that merely carries
//! this installation's id in its key is never enough: a copy of the data directory (a restored
//! backup, a clone) carries the same id, and what the other copy archived after they parted is
//! unreferenced here while it is the only copy of its records. Objects of other installations,
//! or of none (written before ids), are never deleted.
//!
//! Before deleting anything it lists every folder it sweeps and looks for proof of such a copy:
//! a key of its own installation written in an epoch its database never recorded (or, for keys
//! written before epochs, a manifest generation it never issued). One stops the sweep,
//! deleting nothing; the stop is logged, recorded for `status` and the API until a sweep
//! completes, and resolved by an operator (`frostline adopt`, `archive::adopt`).
//!
//! What a listed object's bucket references (its recorded archives, upload intents and
//! unfinished expiry) is read from one read transaction (so a publish and cleanup cannot slip
//! between its parts); a released key that is referenced again is kept. If anything cannot be
//! read the sweep stops before deleting anything. A dry run counts without deleting. Each
//! deletion writes an `orphan_deleted` event.
//!
//! Two kinds of sweep share these rules. A **full** sweep (`sweep`) lists every folder of every
//! table on every target, a page at a time, reading each listed folder's bucket's references
//! as it meets the folder: its time is the archive's size, its memory a page of the listing,
//! the references of the last few thousand folders and the released keys it may delete (at
//! most `SWEEP_RELEASED_PER_RUN_MAX`), whatever the archive's size. It runs as
//! the first sweep of every life of the engine (a restored copy starts a life, and only a full
//! listing finds the other copy's keys wherever they lie), every
//! `ARCHIVER_SWEEP_FULL_INTERVAL_SECONDS`, and from `frostline sweep`. The sweeps between are
//! **incremental** (`sweep_released`): since only released keys are ever deleted, they read
//! the released keys from where the last one stopped (a cursor in the store, so a restart
//! resumes), list only the folders those keys lie in (looking there for the other copy's keys),
//! check each against its own bucket's references, and list the scratch folders. Their cost and
//! their memory follow what was released, not what is archived.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::blocking;
use crate::engine::Context;
use crate::error::{Error, Result};
use crate::model::{ArchiveTarget, Micros};
use futures::TryStreamExt as _;

use crate::storage::{ArchiveBackend, ObjectInfo, keys};
use crate::store::schema::{BucketId, ReleasedKey, SweepStop};
use crate::store::{BucketReferences, Snapshot, Store};

/// Objects deleted per sweep at most.
pub const SWEEP_DELETES_PER_RUN_MAX: usize = 1_000;
/// Released keys read per sweep at most (a larger backlog is worked off over several sweeps).
pub const SWEEP_RELEASED_PER_RUN_MAX: usize = 10_000;
pub const META_LAST_SWEEP: &str = "last_sweep_at";
/// When the last full sweep finished.
pub const META_LAST_FULL_SWEEP: &str = "last_full_sweep_at";
/// The released key the last incremental sweep stopped after (absent: from the first).
pub const META_SWEEP_CURSOR: &str = "sweep_cursor";

#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct SweepReport {
    pub dry_run: bool,
    /// A full sweep (every folder listed), not an incremental one.
    #[serde(default)]
    pub full: bool,
    pub listed: u64,
    pub referenced: u64,
    /// Unreferenced but younger than the grace period.
    pub too_young: u64,
    pub orphans: u64,
    /// Unreferenced objects another installation could own: never deleted.
    pub foreign: u64,
    /// Unreferenced objects of this installation that this data directory never released:
    /// nothing proves it wrote them (a copy of the data directory may have), so they are kept.
    pub unproven: u64,
    pub deleted: u64,
    pub orphan_keys: Vec<String>,
}

/// What a full sweep reads of the store before it lists: the targets (beyond the tables'
/// current ones) that hold archives, the released keys it may delete, and the epochs of this
/// data directory's lives. What each listed object's bucket references is read as the listing
/// meets it (`FolderReferences`).
struct SweepInputs {
    targets: BTreeSet<(String, ArchiveTarget)>,
    /// Released keys by (target URL, key).
    released: HashMap<(String, String), ReleasedKey>,
    epochs: HashSet<String>,
}

async fn sweep_inputs(ctx: &Arc<Context>) -> Result<SweepInputs> {
    let store = ctx.store.clone();
    blocking(move || {
        let snapshot = store.snapshot()?;
        let mut targets = BTreeSet::new();
        snapshot.visit_manifests(|manifest| {
            targets.insert((manifest.table.clone(), manifest.archive_target()));
            Ok(())
        })?;
        let released: HashMap<(String, String), ReleasedKey> = snapshot
            .released(SWEEP_RELEASED_PER_RUN_MAX)?
            .into_iter()
            .map(|r| ((r.target.clone(), r.key.clone()), r))
            .collect();
        // A replaced archive's manifest copy goes once its objects are released: their keys
        // say where they lie.
        for r in released.values() {
            targets.insert((r.table.clone(), ArchiveTarget { name: String::new(), url: r.target.clone() }));
        }
        Ok(SweepInputs { targets, released, epochs: snapshot.epochs()? })
    })
    .await
}

/// Folders whose bucket's references a full sweep keeps at once. A listing meets one folder's
/// objects together (object stores list in key order, a local directory folder by folder), so
/// each bucket is read about once per folder of it, however many buckets there are.
const FOLDERS_KEPT_MAX: usize = 4_096;
/// Objects a full sweep takes from a listing at a time.
const LISTING_PAGE_OBJECTS: usize = 1_000;

/// What the buckets of the folders a full sweep lists reference, read from the store when the
/// listing meets each folder and kept for the last `FOLDERS_KEPT_MAX` folders: the sweep's
/// memory follows a page of the listing, not the archive.
struct FolderReferences {
    store: Store,
    /// By folder; `None` for a folder that is no known bucket's.
    kept: HashMap<String, Option<Arc<BucketReferences>>>,
    /// The claimed buckets whose folders write a value as its hash (longer than
    /// `keys::KEY_VALUE_ENCODED_BYTES_MAX` encoded), by address: a folder's name does not say
    /// which bucket those are. Read once, when the first such folder is met.
    hashed: Option<Arc<HashMap<keys::FolderAddress, BucketId>>>,
}

impl FolderReferences {
    fn new(store: Store) -> FolderReferences {
        FolderReferences { store, kept: HashMap::new(), hashed: None }
    }

    /// What the bucket of `folder` (read by `read`) references; `None` when it is no bucket's.
    fn of(&self, folder: &str) -> Option<&BucketReferences> {
        self.kept.get(folder).and_then(|references| references.as_deref())
    }

    /// Reads, from one snapshot, the references of the folders of `objects` not kept yet. Each
    /// bucket's references are one transaction's, as the incremental sweep's are; an object
    /// referenced again after they were read was uploaded again, and is too young to delete.
    async fn read(&mut self, objects: &[ObjectInfo]) -> Result<()> {
        let missing: BTreeSet<&str> =
            objects.iter().map(|o| keys::folder_of(&o.key)).filter(|f| !self.kept.contains_key(*f)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        if self.kept.len() + missing.len() > FOLDERS_KEPT_MAX {
            self.kept.clear();
        }
        let folders: Vec<(String, FolderOf)> =
            missing.into_iter().map(|folder| (folder.to_string(), FolderOf::read(folder))).collect();
        let needs_hashed = self.hashed.is_none() && folders.iter().any(|(_, of)| matches!(of, FolderOf::Hashed(_)));
        let (store, hashed) = (self.store.clone(), self.hashed.clone());
        let (read, hashed) = blocking(move || {
            let snapshot = store.snapshot()?;
            let hashed = match hashed {
                None if needs_hashed => Some(Arc::new(hashed_folders(&snapshot)?)),
                hashed => hashed,
            };
            let mut read = Vec::with_capacity(folders.len());
            for (folder, of) in folders {
                let id = match of {
                    FolderOf::Bucket(id) => Some(id),
                    FolderOf::Hashed(address) => hashed.as_ref().and_then(|hashed| hashed.get(&address).cloned()),
                    FolderOf::Unknown => None,
                };
                let references = match id {
                    Some(id) => Some(Arc::new(snapshot.bucket_references(&id)?)),
                    None => None,
                };
                read.push((folder, references));
            }
            Ok((read, hashed))
        })
        .await?;
        self.hashed = hashed;
        self.kept.extend(read);
        Ok(())
    }
}

/// Which bucket a folder's name says it is (`keys::folder_address`).
enum FolderOf {
    Bucket(BucketId),
    /// The name writes a value as its hash: the store says which bucket (`hashed_folders`).
    Hashed(keys::FolderAddress),
    /// No bucket folder's name.
    Unknown,
}

impl FolderOf {
    fn read(folder: &str) -> FolderOf {
        match keys::folder_address(folder) {
            None => FolderOf::Unknown,
            Some(address) => match address.decode() {
                Some((table, bucket_key, partition_key)) => {
                    FolderOf::Bucket(BucketId { table, partition_key, bucket_key })
                }
                None => FolderOf::Hashed(address),
            },
        }
    }
}

/// The claimed buckets whose folders (in either layout, and where their manifest lies) write a
/// value as its hash, by address. Only a claimed bucket had a key written for it.
fn hashed_folders(snapshot: &Snapshot) -> Result<HashMap<keys::FolderAddress, BucketId>> {
    let mut out = HashMap::new();
    snapshot.visit_claimed_buckets(|meta| {
        let id = meta.id;
        let mut addresses: Vec<keys::FolderAddress> = [keys::Layout::Hive, keys::Layout::Delta]
            .into_iter()
            .map(|layout| keys::FolderAddress::of(layout, &id.table, &id.bucket_key, &id.partition_key))
            .collect();
        // Written where today's layout may no longer say (longer keys changed form).
        addresses.extend(meta.manifest_key.as_deref().and_then(|key| keys::folder_address(keys::folder_of(key))));
        for address in addresses.into_iter().filter(|address| address.decode().is_none()) {
            out.insert(address, id.clone());
        }
        Ok(())
    })?;
    Ok(out)
}

/// Why `key` proves that another copy of this data directory wrote to the target, when it does:
/// a key of its own installation that its bucket (`references`; `None` when its folder is no
/// known bucket's) does not reference, written in an epoch the database never recorded or
/// (keys written before epochs) under a manifest generation it never issued.
fn other_copy_evidence(
    key: &str,
    installation: &str,
    references: Option<&BucketReferences>,
    epochs: &HashSet<String>,
) -> Option<String> {
    if references.is_some_and(|references| references.keys.contains(key)) {
        return None;
    }
    let origin = keys::origin(key).filter(|o| !installation.is_empty() && o.installation == installation)?;
    match (origin.epoch, origin.generation) {
        (Some(epoch), _) if epochs.contains(epoch) => None,
        (Some(epoch), _) => Some(format!("written in epoch {epoch}, which this database never recorded")),
        (None, None) => None,
        (None, Some(generation)) => match references.map(|r| r.generation) {
            Some(known) if known >= generation => None,
            known => Some(format!(
                "generation {generation}; the database {}",
                known.map_or("does not know the bucket".to_string(), |g| format!("issued up to {g}"))
            )),
        },
    }
}

/// Whether `key` is a manifest's: deleted before any segment, wherever objects are deleted.
fn is_manifest(key: &str) -> bool {
    keys::origin(key).is_some_and(|origin| origin.generation.is_some())
}

/// An orphan a full sweep will delete once every folder is listed.
struct Doomed {
    backend: Arc<dyn ArchiveBackend>,
    key: String,
    released: Option<ReleasedKey>,
}

/// Keeps `doomed` within `SWEEP_DELETES_PER_RUN_MAX`, manifests first: once it is full, a
/// manifest takes the place of a segment. A sweep cut off by the limit then leaves segments no
/// manifest names, never a manifest whose segment is gone.
fn keep_doomed(doomed: &mut Vec<Doomed>, orphan: Doomed) {
    if doomed.len() < SWEEP_DELETES_PER_RUN_MAX {
        doomed.push(orphan);
    } else if is_manifest(&orphan.key)
        && let Some(segment) = doomed.iter_mut().find(|d| !is_manifest(&d.key))
    {
        *segment = orphan;
    }
}

pub async fn sweep(ctx: &Arc<Context>, dry_run: bool) -> Result<SweepReport> {
    let inputs = sweep_inputs(ctx).await?;
    let now = ctx.clock.now();
    let grace = ctx.settings.orphan_grace_us;
    let mut report = SweepReport { dry_run, full: true, ..Default::default() };
    let policies = ctx.policies.clone();
    // Every table's folder on its current target and on every target its archives were
    // written to, and every target's scratch folders (`.tmp/` of large uploads,
    // `.frostline-probe/`): nothing names a scratch object, so only the grace protects one.
    let mut folders: Vec<(Arc<dyn ArchiveBackend>, String, bool)> = Vec::new();
    for (id, table) in &policies.tables {
        let mut backends = vec![table.backend.clone()];
        for (_, target) in inputs.targets.iter().filter(|(t, _)| t == id) {
            // A target gone from the directory cannot be swept; its archives are refused
            // elsewhere (reads say so), and nothing is lost by leaving it alone.
            if let Ok(backend) = policies.archive_backend(table, target)
                && !backends.iter().any(|b| Arc::ptr_eq(b, &backend))
            {
                backends.push(backend);
            }
        }
        // Both layouts: archives written before the table's archive became a Delta table
        // stay where they were written.
        for backend in backends.into_iter().filter(|b| swept(&policies, b)) {
            folders.extend(keys::table_folders(id).map(|folder| (backend.clone(), folder, false)));
        }
    }
    for backend in policies.targets.values().filter(|b| swept(&policies, b)) {
        folders.extend(keys::SCRATCH_PREFIXES.iter().map(|scratch| (backend.clone(), scratch.to_string(), true)));
    }
    // Everything is listed, a page at a time, and checked for another copy, before anything is
    // deleted.
    let mut references = FolderReferences::new(ctx.store.clone());
    let mut doomed: Vec<Doomed> = Vec::new();
    // Released keys listed and referenced by nothing (the rest are forgotten below).
    let mut seen: HashSet<(String, String)> = HashSet::new();
    for (backend, prefix, scratch) in &folders {
        let mut pages = backend.list_stream(prefix).try_chunks(LISTING_PAGE_OBJECTS);
        while let Some(page) = pages.try_next().await.map_err(|e| e.1)? {
            if !scratch {
                references.read(&page).await?;
            }
            for object in page {
                if object.key.ends_with(super::catalog::CATALOG_FILE) || keys::in_delta_log(&object.key) {
                    continue; // derived, rewritten by every pass that changes archives
                }
                report.listed += 1;
                let bucket = if *scratch { None } else { references.of(keys::folder_of(&object.key)) };
                if !scratch
                    && let Some(why) = other_copy_evidence(&object.key, &ctx.installation_id, bucket, &inputs.epochs)
                {
                    return Err(stop_on_other_copy(ctx, backend.target(), object.key, why, now, dry_run).await);
                }
                if bucket.is_some_and(|bucket| bucket.keys.contains(&object.key)) {
                    report.referenced += 1;
                    continue;
                }
                let released_key = (backend.target().to_string(), object.key.clone());
                let released = inputs.released.get(&released_key);
                if released.is_some() {
                    seen.insert(released_key);
                }
                if !scratch && !keys::written_by(&object.key, &ctx.installation_id) {
                    report.foreign += 1;
                    continue;
                }
                if !scratch && released.is_none() {
                    report.unproven += 1;
                    continue;
                }
                let age = released
                    .map_or(now - object.last_modified, |r| (now - object.last_modified).min(now - r.released_at));
                if age < grace {
                    report.too_young += 1;
                    continue;
                }
                report.orphans += 1;
                let orphan = Doomed { backend: backend.clone(), key: object.key, released: released.cloned() };
                keep_doomed(&mut doomed, orphan);
            }
        }
    }
    // Manifests before everything else, as an expiry deletes: a sweep cut off between its
    // deletes (a failed call, a crash) then leaves segments no manifest names, never a
    // manifest whose segment is gone, which a data directory rebuilt later would find on the
    // target and take for a damaged archive.
    doomed.sort_by_key(|orphan| !is_manifest(&orphan.key));
    report.orphan_keys = doomed.iter().map(|orphan| orphan.key.clone()).collect();
    if dry_run {
        return Ok(report);
    }
    for orphan in doomed {
        delete_orphan(ctx, &orphan.backend, &orphan.key, orphan.released, now).await?;
        report.deleted += 1;
    }
    // Released keys no listing showed were deleted already (a sweep cut off after its delete
    // call, or an expiry); a referenced one is in use again. Either way, forgotten.
    for (key, released) in &inputs.released {
        let listed = |(backend, prefix, _): &(Arc<dyn ArchiveBackend>, String, bool)| {
            backend.target() == key.0 && key.1.starts_with(prefix.as_str())
        };
        if folders.iter().any(listed) && !seen.contains(key) {
            let (store, released) = (ctx.store.clone(), released.clone());
            blocking(move || store.forget_released(released, false, now)).await?;
        }
    }
    let store = ctx.store.clone();
    blocking(move || {
        store.set_meta_value(META_LAST_SWEEP, now.to_be_bytes().to_vec())?;
        store.set_meta_value(META_LAST_FULL_SWEEP, now.to_be_bytes().to_vec())?;
        store.set_sweep_stop(None)
    })
    .await?;
    ctx.memory().swept_fully.store(true, std::sync::atomic::Ordering::Release);
    Ok(report)
}

/// Records (unless `dry_run`) and logs why a sweep stopped: `key` on `target` was written by
/// another copy of this data directory. Returns the error the sweep ends with.
async fn stop_on_other_copy(
    ctx: &Arc<Context>,
    target: &str,
    key: String,
    reason: String,
    now: Micros,
    dry_run: bool,
) -> Error {
    let stop = SweepStop { at: now, target: target.to_string(), key, reason };
    tracing::warn!(target = %stop.target, key = %stop.key, reason = %stop.reason,
        "orphan sweep stopped: another copy of this data directory writes to this target");
    if !dry_run {
        let (store, recorded) = (ctx.store.clone(), stop.clone());
        if let Err(e) = blocking(move || store.set_sweep_stop(Some(recorded))).await {
            return e;
        }
    }
    Error::Conflict(format!(
        "orphan sweep stopped, nothing deleted: {} holds `{}` ({}), written by another copy of this data \
         directory (installation {}): a copy restored from a backup, or one copied elsewhere, that kept \
         archiving. Run only one copy of a data directory; archives of the other are not orphans: \
         `frostline adopt` (with the engine stopped) takes them in",
        stop.target, stop.key, stop.reason, ctx.installation_id
    ))
}

/// Whether the sweep may work on `backend`'s target (not declared with `sweep = false`).
fn swept(policies: &crate::policy::PolicySet, backend: &Arc<dyn ArchiveBackend>) -> bool {
    !policies.unswept_targets.contains(backend.target())
}

/// Deletes one orphan and records it: a released key is forgotten, a scratch object noted.
async fn delete_orphan(
    ctx: &Arc<Context>,
    backend: &Arc<dyn ArchiveBackend>,
    key: &str,
    released: Option<ReleasedKey>,
    now: Micros,
) -> Result<()> {
    crate::failpoints::hit("mid_sweep_delete")?;
    backend.delete(key).await?;
    tracing::info!(key = %key, "orphan deleted");
    let (store, key, target) = (ctx.store.clone(), key.to_string(), backend.target().to_string());
    match released {
        Some(released) => blocking(move || store.forget_released(released, true, now)).await,
        None => blocking(move || store.note_orphan_deleted(key, target, now)).await,
    }
}

/// The released keys of one folder of one target, in the order the store keeps them.
struct ReleasedFolder {
    target: String,
    folder: String,
    table: String,
    released: Vec<ReleasedKey>,
    /// What the folder's bucket references (`None`: released before keys named their bucket;
    /// a full sweep, which reads every reference, deletes those).
    references: Option<BucketReferences>,
}

/// The sweep between full ones (see the module documentation): the released keys after the
/// stored cursor, at most `SWEEP_RELEASED_PER_RUN_MAX`, folder by folder, and the scratch
/// folders. Stops, deleting nothing more, where a folder shows another copy's key.
pub async fn sweep_released(ctx: &Arc<Context>) -> Result<SweepReport> {
    let now = ctx.clock.now();
    let grace = ctx.settings.orphan_grace_us;
    let mut report = SweepReport::default();
    let store = ctx.store.clone();
    // The references are read before any listing, from one snapshot (as the full sweep's):
    // an object uploaded again after it is too young to delete.
    let (cursor_before, cursor_after, folders, epochs) = blocking(move || {
        // An empty cursor starts from the first released key.
        let cursor = store.meta_value(META_SWEEP_CURSOR)?.filter(|c| !c.is_empty());
        let snapshot = store.snapshot()?;
        let batch = snapshot.released_after(cursor.as_deref(), SWEEP_RELEASED_PER_RUN_MAX)?;
        let full_batch = batch.len() == SWEEP_RELEASED_PER_RUN_MAX;
        let mut folders: Vec<ReleasedFolder> = Vec::new();
        for released in batch {
            let folder = keys::folder_of(&released.key).to_string();
            match folders.last_mut() {
                Some(last) if last.target == released.target && last.folder == folder => last.released.push(released),
                _ => folders.push(ReleasedFolder {
                    target: released.target.clone(),
                    folder,
                    table: released.table.clone(),
                    released: vec![released],
                    references: None,
                }),
            }
        }
        for folder in &mut folders {
            // One folder holds one bucket's objects; rows released before rows named their
            // bucket take it from a row that does.
            if let Some(bucket) = folder.released.iter().find_map(|r| r.bucket.clone()) {
                folder.references = Some(snapshot.bucket_references(&bucket)?);
            }
        }
        // A batch that reached the end of the released keys starts the next sweep over.
        let next_cursor =
            full_batch.then(|| folders.last().and_then(|f| f.released.last()).map(ReleasedKey::store_key)).flatten();
        Ok((cursor, next_cursor, folders, snapshot.epochs()?))
    })
    .await?;
    let policies = ctx.policies.clone();
    let mut resume_after: Option<Vec<u8>> = None;
    let mut cut_short = false;
    for folder in folders {
        if report.deleted as usize >= SWEEP_DELETES_PER_RUN_MAX {
            cut_short = true;
            break;
        }
        let last_row = folder.released.last().map(ReleasedKey::store_key);
        let Some(bucket_references) = folder.references else {
            tracing::debug!(folder = %folder.folder, "released keys without their bucket: left to the full sweep");
            resume_after = last_row;
            continue;
        };
        // A table gone from the policy directory, or a target no longer declared, is left
        // alone (as the full sweep leaves it): nothing is lost by keeping an object.
        let target = ArchiveTarget { name: String::new(), url: folder.target.clone() };
        let backend = policies.tables.get(&folder.table).and_then(|t| policies.archive_backend(t, &target).ok());
        let Some(backend) = backend.filter(|b| swept(&policies, b)) else {
            resume_after = last_row;
            continue;
        };
        let listed = backend.list(&folder.folder).await?;
        let evidence = listed.iter().find_map(|object| {
            let why = other_copy_evidence(&object.key, &ctx.installation_id, Some(&bucket_references), &epochs)?;
            Some((object.key.clone(), why))
        });
        if let Some((key, why)) = evidence {
            return Err(stop_on_other_copy(ctx, backend.target(), key, why, now, false).await);
        }
        let present: HashMap<&str, &ObjectInfo> = listed.iter().map(|o| (o.key.as_str(), o)).collect();
        let mut released = folder.released;
        // Manifests before segments, as everywhere objects are deleted.
        released.sort_by_key(|r| keys::origin(&r.key).is_none_or(|o| o.generation.is_none()));
        for released in released {
            let object = present.get(released.key.as_str());
            if bucket_references.keys.contains(&released.key) || object.is_none() {
                // In use again, or deleted already (a sweep cut off after its delete call, an
                // expiry): either way, forgotten.
                report.referenced += u64::from(object.is_some());
                let store = ctx.store.clone();
                blocking(move || store.forget_released(released, false, now)).await?;
                continue;
            }
            let object = object.expect("present");
            report.listed += 1;
            if !keys::written_by(&released.key, &ctx.installation_id) {
                report.foreign += 1;
                continue;
            }
            if (now - object.last_modified).min(now - released.released_at) < grace {
                report.too_young += 1;
                continue;
            }
            report.orphans += 1;
            report.orphan_keys.push(released.key.clone());
            let key = released.key.clone();
            delete_orphan(ctx, &backend, &key, Some(released), now).await?;
            report.deleted += 1;
        }
        resume_after = last_row;
    }
    // Scratch folders hold what no record names; only the grace protects them.
    for backend in policies.targets.values().filter(|b| swept(&policies, b)) {
        for scratch in keys::SCRATCH_PREFIXES {
            for object in backend.list(scratch).await? {
                report.listed += 1;
                if now - object.last_modified < grace {
                    report.too_young += 1;
                    continue;
                }
                report.orphans += 1;
                if (report.deleted as usize) < SWEEP_DELETES_PER_RUN_MAX {
                    report.orphan_keys.push(object.key.clone());
                    delete_orphan(ctx, backend, &object.key, None, now).await?;
                    report.deleted += 1;
                }
            }
        }
    }
    // Cut short by the delete limit, the next sweep goes on after the last folder finished.
    let cursor = if cut_short { resume_after.or(cursor_before) } else { cursor_after };
    let store = ctx.store.clone();
    blocking(move || {
        store.set_meta_value(META_SWEEP_CURSOR, cursor.unwrap_or_default())?;
        store.set_meta_value(META_LAST_SWEEP, now.to_be_bytes().to_vec())
    })
    .await?;
    Ok(report)
}

/// Runs a sweep when `ARCHIVER_SWEEP_INTERVAL_SECONDS` have passed since the last one: a full
/// one when none finished in this life or the last is `ARCHIVER_SWEEP_FULL_INTERVAL_SECONDS`
/// old, else an incremental one.
pub async fn sweep_if_due(ctx: &Arc<Context>) -> Result<Option<SweepReport>> {
    let store = ctx.store.clone();
    let last = blocking(move || store.meta_value(META_LAST_SWEEP))
        .await?
        .and_then(|v| v.try_into().ok().map(i64::from_be_bytes));
    let now = ctx.clock.now();
    if last.is_some_and(|at| now - at < ctx.settings.sweep_interval_us) {
        return Ok(None);
    }
    let store = ctx.store.clone();
    let last_full = blocking(move || store.meta_value(META_LAST_FULL_SWEEP))
        .await?
        .and_then(|v| v.try_into().ok().map(i64::from_be_bytes));
    let full = !ctx.memory().swept_fully.load(std::sync::atomic::Ordering::Acquire)
        || last_full.is_none_or(|at| now - at >= ctx.settings.sweep_full_interval_us);
    if full { sweep(ctx, false).await.map(Some) } else { sweep_released(ctx).await.map(Some) }
}

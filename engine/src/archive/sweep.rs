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
//! The reference set is read from one read transaction (so a publish and cleanup cannot slip
//! between its parts); a released key that is referenced again is kept. If anything cannot be
//! read the sweep stops before deleting anything. A dry run counts without deleting. Each
//! deletion writes an `orphan_deleted` event.
//!
//! Two kinds of sweep share these rules. A **full** sweep (`sweep`) lists every folder of every
//! table on every target and reads every reference: its cost is the archive's size. It runs as
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
use crate::storage::{ArchiveBackend, ObjectInfo, keys};
use crate::store::BucketReferences;
use crate::store::schema::{ReleasedKey, SweepStop};

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

/// Keys that must never be swept, the targets (beyond the tables' current ones) that hold
/// archives, and what this data directory can prove it wrote, all read from one snapshot.
struct References {
    keys: HashSet<String>,
    targets: BTreeSet<(String, ArchiveTarget)>,
    /// The generation the database last issued for each bucket, by the folder of its manifests.
    generations: HashMap<String, u64>,
    /// The epochs of this data directory's lives.
    epochs: HashSet<String>,
    /// Released keys by (target URL, key).
    released: HashMap<(String, String), ReleasedKey>,
}

async fn references(ctx: &Arc<Context>) -> Result<References> {
    let (store, engine_installation) = (ctx.store.clone(), ctx.installation_id.clone());
    blocking(move || {
        let snapshot = store.snapshot()?;
        let mut keys = HashSet::new();
        let mut targets = BTreeSet::new();
        let mut generations = HashMap::new();
        // A generation that a newer recorded one replaced (late records) references nothing:
        // its objects were released when the newer one's hot rows were deleted, and only
        // released objects are ever deleted. The store keeps a bucket's manifests together,
        // oldest first, so one bucket's are held at a time, not every manifest of the store.
        let mut bucket: Vec<crate::format::manifest::Manifest> = Vec::new();
        snapshot.visit_manifests(|manifest| {
            targets.insert((manifest.table.clone(), manifest.archive_target()));
            let same_bucket = |m: &crate::format::manifest::Manifest| {
                (&m.table, &m.partition_key, &m.bucket.key)
                    == (&manifest.table, &manifest.partition_key, &manifest.bucket.key)
            };
            if bucket.last().is_some_and(|last| !same_bucket(last)) {
                reference_unreplaced(&mut bucket, &mut keys);
            }
            bucket.push(manifest);
            Ok(())
        })?;
        reference_unreplaced(&mut bucket, &mut keys);
        // Claimed buckets only: a bucket never claimed (hot, generation 0) had no key written
        // for it (the generations of keys start at 1), so an object in its folder is evidence
        // whether the folder is known with 0 or not at all. Reading the hot rows too cost a
        // store of mostly hot buckets its every row (and, keeping their folders, 1.2 GB over
        // 1,000,000).
        snapshot.visit_claimed_buckets(|meta| {
            keys.extend(meta.manifest_key.clone());
            for layout in [keys::Layout::Hive, keys::Layout::Delta] {
                let (id, installation) = (&meta.id, &engine_installation);
                let folder = keys::manifest_folder(layout, &id.table, installation, &id.bucket_key, &id.partition_key);
                generations.insert(folder, meta.generation);
            }
            if let Some(key) = &meta.manifest_key {
                // Written where today's layout may no longer say (longer keys changed form).
                generations.insert(keys::folder_of(key).to_string(), meta.generation);
            }
            Ok(())
        })?;
        for intent in snapshot.intents()? {
            keys.extend(intent.keys);
        }
        for tombstone in snapshot.tombstones()? {
            if tombstone.completed_at.is_none() {
                keys.extend(tombstone.keys);
            }
        }
        let released = snapshot
            .released(SWEEP_RELEASED_PER_RUN_MAX)?
            .into_iter()
            .map(|r| ((r.target.clone(), r.key.clone()), r))
            .collect();
        Ok(References { keys, targets, generations, epochs: snapshot.epochs()?, released })
    })
    .await
}

/// Puts in `keys` the segments of the manifests in `bucket` (a run of one table, partition
/// key as text and bucket key) that no other of them amends, and empties it. Two buckets
/// whose partition keys are not UTF-8 and read alike may share a run, as they shared an
/// identity before: only released keys are ever deleted, so nothing depends on it.
fn reference_unreplaced(bucket: &mut Vec<crate::format::manifest::Manifest>, keys: &mut HashSet<String>) {
    let replaced: HashSet<u64> = bucket.iter().filter_map(|m| m.amends.as_ref().map(|a| a.generation)).collect();
    for manifest in bucket.drain(..) {
        if !replaced.contains(&manifest.generation) {
            keys.extend(manifest.segments.into_iter().map(|s| s.key));
        }
    }
}

/// The first object of this installation that another copy of its data directory wrote: a
/// key of an epoch the database never recorded, or (keys written before epochs) a manifest
/// generation it never issued.
fn other_copy_evidence(listed: &[ObjectInfo], installation: &str, references: &References) -> Option<(String, String)> {
    listed.iter().filter(|object| !references.keys.contains(&object.key)).find_map(|object| {
        let origin =
            keys::origin(&object.key).filter(|o| !installation.is_empty() && o.installation == installation)?;
        let why = match (origin.epoch, origin.generation) {
            (Some(epoch), _) if references.epochs.contains(epoch) => return None,
            (Some(epoch), _) => format!("written in epoch {epoch}, which this database never recorded"),
            (None, None) => return None,
            (None, Some(generation)) => match references.generations.get(keys::folder_of(&object.key)) {
                Some(known) if *known >= generation => return None,
                known => format!(
                    "generation {generation}; the database {}",
                    known.map_or("does not know the bucket".to_string(), |g| format!("issued up to {g}"))
                ),
            },
        };
        Some((object.key.clone(), why))
    })
}

pub async fn sweep(ctx: &Arc<Context>, dry_run: bool) -> Result<SweepReport> {
    let references = references(ctx).await?;
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
        for (_, target) in references.targets.iter().filter(|(t, _)| t == id) {
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
    // Everything is listed, and checked for another copy, before anything is deleted.
    let mut listings = Vec::with_capacity(folders.len());
    for (backend, prefix, scratch) in &folders {
        let listed = backend.list(prefix).await?;
        if !scratch && let Some((key, why)) = other_copy_evidence(&listed, &ctx.installation_id, &references) {
            return Err(stop_on_other_copy(ctx, backend.target(), key, why, now, dry_run).await);
        }
        listings.push((backend, listed, *scratch));
    }
    // Manifests before everything else, as an expiry deletes: a sweep cut off between its
    // deletes (a failed call, the per-run limit, a crash) then leaves segments no manifest
    // names, never a manifest whose segment is gone, which a data directory rebuilt later
    // would find on the target and take for a damaged archive. (A local directory lists in no
    // particular order.)
    let mut objects: Vec<(Arc<dyn ArchiveBackend>, ObjectInfo, bool)> = listings
        .into_iter()
        .flat_map(|(backend, listed, scratch)| listed.into_iter().map(move |o| (backend.clone(), o, scratch)))
        .collect();
    objects.sort_by_key(|(_, object, _)| keys::origin(&object.key).is_none_or(|o| o.generation.is_none()));
    let mut seen: HashSet<(String, String)> = HashSet::new();
    for (backend, object, scratch) in objects {
        {
            if object.key.ends_with(super::catalog::CATALOG_FILE) || keys::in_delta_log(&object.key) {
                continue; // derived, rewritten by every pass that changes archives
            }
            report.listed += 1;
            if references.keys.contains(&object.key) {
                report.referenced += 1;
                continue;
            }
            let released_key = (backend.target().to_string(), object.key.clone());
            let released = references.released.get(&released_key);
            seen.insert(released_key);
            if !scratch && !keys::written_by(&object.key, &ctx.installation_id) {
                report.foreign += 1;
                continue;
            }
            if !scratch && released.is_none() {
                report.unproven += 1;
                continue;
            }
            let age =
                released.map_or(now - object.last_modified, |r| (now - object.last_modified).min(now - r.released_at));
            if age < grace {
                report.too_young += 1;
                continue;
            }
            report.orphans += 1;
            if report.orphan_keys.len() < SWEEP_DELETES_PER_RUN_MAX {
                report.orphan_keys.push(object.key.clone());
            }
            if !dry_run && (report.deleted as usize) < SWEEP_DELETES_PER_RUN_MAX {
                delete_orphan(ctx, &backend, &object.key, released.cloned(), now).await?;
                report.deleted += 1;
            }
        }
    }
    if !dry_run {
        // Released keys no listing showed were deleted already (a sweep cut off after its
        // delete call, or an expiry); a referenced one is in use again. Either way, forgotten.
        for (key, released) in &references.released {
            let listed = |(backend, prefix, _): &(Arc<dyn ArchiveBackend>, String, bool)| {
                backend.target() == key.0 && key.1.starts_with(prefix.as_str())
            };
            let listed_target = folders.iter().any(listed);
            if listed_target && (!seen.contains(key) || references.keys.contains(&key.1)) {
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
    }
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
    // Filled folder by folder with the folder's bucket's references.
    let mut references = References {
        keys: HashSet::new(),
        targets: BTreeSet::new(),
        generations: HashMap::new(),
        epochs,
        released: HashMap::new(),
    };
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
        references.keys = bucket_references.keys;
        references.generations = HashMap::from([(folder.folder.clone(), bucket_references.generation)]);
        if let Some((key, why)) = other_copy_evidence(&listed, &ctx.installation_id, &references) {
            return Err(stop_on_other_copy(ctx, backend.target(), key, why, now, false).await);
        }
        let present: HashMap<&str, &ObjectInfo> = listed.iter().map(|o| (o.key.as_str(), o)).collect();
        let mut released = folder.released;
        // Manifests before segments, as everywhere objects are deleted.
        released.sort_by_key(|r| keys::origin(&r.key).is_none_or(|o| o.generation.is_none()));
        for released in released {
            let object = present.get(released.key.as_str());
            if references.keys.contains(&released.key) || object.is_none() {
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

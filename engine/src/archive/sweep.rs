//! The orphan sweep: objects under a table's prefix that this installation wrote (their key
//! carries its installation id) and that no published manifest, no in-flight upload intent
//! and no unfinished expiry names, and objects in a target's scratch folders (`.tmp/`,
//! `.frostline-probe/`), older than the grace period, are deleted in bounded pages. Objects
//! another installation could own (another id, or none: written before ids) are never
//! deleted. Every target that holds one of the table's archives is swept, not only its
//! current one. The reference set is read first, from one read transaction (so a publish and
//! cleanup cannot slip between its parts); if it cannot be read the sweep stops before
//! deleting anything. A dry run counts without deleting. Each deletion writes an
//! `orphan_deleted` event.
//!
//! A data directory restored from a backup (or copied) shares its installation id with the
//! copy that went on running, but not its later archives: to it they look like orphans. So
//! before deleting anything the sweep looks for a manifest of its own installation with a
//! generation its database never issued (a later claim of the bucket than the database
//! records, or a bucket it does not know); one is proof of another copy, and the sweep stops,
//! deleting nothing, until an operator resolves it (`frostline adopt`, `archive::adopt`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::blocking;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::model::ArchiveTarget;
use crate::storage::{ArchiveBackend, ObjectInfo, keys};

/// Objects deleted per sweep at most.
pub const SWEEP_DELETES_PER_RUN_MAX: usize = 1_000;
pub const META_LAST_SWEEP: &str = "last_sweep_at";

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct SweepReport {
    pub dry_run: bool,
    pub listed: u64,
    pub referenced: u64,
    /// Unreferenced but younger than the grace period.
    pub too_young: u64,
    pub orphans: u64,
    /// Unreferenced objects another installation could own: never deleted.
    pub foreign: u64,
    pub deleted: u64,
    pub orphan_keys: Vec<String>,
}

/// Keys that must never be swept, and the targets (beyond the tables' current ones) that
/// hold archives, all read from one snapshot of the store.
struct References {
    keys: HashSet<String>,
    targets: BTreeSet<(String, ArchiveTarget)>,
    /// The generation the database last issued for each bucket, by the folder of its manifests.
    generations: HashMap<String, u64>,
}

async fn references(engine: &Arc<Engine>) -> Result<References> {
    let (store, engine_installation) = (engine.store.clone(), engine.installation_id.clone());
    blocking(move || {
        let snapshot = store.snapshot()?;
        let mut keys = HashSet::new();
        let mut targets = BTreeSet::new();
        let mut generations = HashMap::new();
        snapshot.visit_manifests(|manifest| {
            targets.insert((manifest.table.clone(), manifest.archive_target()));
            keys.extend(manifest.segments.into_iter().map(|s| s.key));
            Ok(())
        })?;
        snapshot.visit_buckets(|meta| {
            for layout in [keys::Layout::Hive, keys::Layout::Delta] {
                let (id, installation) = (&meta.id, &engine_installation);
                let folder = keys::manifest_folder(layout, &id.table, installation, &id.bucket_key, &id.partition_key);
                generations.insert(folder, meta.generation);
            }
            if let Some(key) = &meta.manifest_key {
                // Written where today's layout may no longer say (longer keys changed form).
                generations.insert(keys::folder_of(key).to_string(), meta.generation);
            }
            keys.extend(meta.manifest_key);
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
        Ok(References { keys, targets, generations })
    })
    .await
}

/// The first manifest of this installation that its database never issued, if any.
fn later_copy_evidence(
    listed: &[ObjectInfo],
    installation: &str,
    generations: &HashMap<String, u64>,
) -> Option<String> {
    listed.iter().find_map(|object| {
        let generation = keys::manifest_generation(&object.key, installation)?;
        match generations.get(keys::folder_of(&object.key)) {
            Some(known) if *known >= generation => None,
            known => Some(format!(
                "`{}` (generation {generation}; the database {})",
                object.key,
                known.map_or("does not know the bucket".to_string(), |g| format!("issued up to {g}"))
            )),
        }
    })
}

pub async fn sweep(engine: &Arc<Engine>, dry_run: bool) -> Result<SweepReport> {
    let References { keys: referenced, targets: archive_targets, generations } = references(engine).await?;
    let now = engine.clock.now();
    let grace = engine.settings.orphan_grace_us;
    let mut report = SweepReport { dry_run, ..Default::default() };
    let policies = engine.policies();
    // Every table's folder on its current target and on every target its archives were
    // written to, and every target's scratch folders (`.tmp/` of large uploads,
    // `.frostline-probe/`): nothing names a scratch object, so only the grace protects one.
    let mut folders: Vec<(Arc<dyn ArchiveBackend>, String, bool)> = Vec::new();
    for (id, table) in &policies.tables {
        let mut backends = vec![table.backend.clone()];
        for (_, target) in archive_targets.iter().filter(|(t, _)| t == id) {
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
        for backend in backends {
            folders.extend(keys::table_folders(id).map(|folder| (backend.clone(), folder, false)));
        }
    }
    for backend in policies.targets.values() {
        folders.extend(keys::SCRATCH_PREFIXES.iter().map(|scratch| (backend.clone(), scratch.to_string(), true)));
    }
    // Everything is listed, and checked for a later copy, before anything is deleted.
    let mut listings = Vec::with_capacity(folders.len());
    for (backend, prefix, scratch) in &folders {
        let listed = backend.list(prefix).await?;
        if !scratch && let Some(evidence) = later_copy_evidence(&listed, &engine.installation_id, &generations) {
            return Err(Error::Conflict(format!(
                "orphan sweep stopped, nothing deleted: {} holds {evidence}, written by another copy of this data \
                 directory (installation {}): a copy restored from a backup, or one copied elsewhere, that kept \
                 archiving. Run only one copy of a data directory; archives of the other are not orphans: \
                 `frostline adopt` (with the engine stopped) takes them in",
                backend.target(),
                engine.installation_id
            )));
        }
        listings.push((backend, listed, *scratch));
    }
    for (backend, listed, scratch) in listings {
        for object in listed {
            if object.key.ends_with(super::catalog::CATALOG_FILE) || keys::in_delta_log(&object.key) {
                continue; // derived, rewritten by every pass that changes archives
            }
            report.listed += 1;
            if referenced.contains(&object.key) {
                report.referenced += 1;
                continue;
            }
            if !scratch && !keys::written_by(&object.key, &engine.installation_id) {
                report.foreign += 1;
                continue;
            }
            if now - object.last_modified < grace {
                report.too_young += 1;
                continue;
            }
            report.orphans += 1;
            if report.orphan_keys.len() < SWEEP_DELETES_PER_RUN_MAX {
                report.orphan_keys.push(object.key.clone());
            }
            if !dry_run && (report.deleted as usize) < SWEEP_DELETES_PER_RUN_MAX {
                crate::failpoints::hit("mid_sweep_delete")?;
                backend.delete(&object.key).await?;
                report.deleted += 1;
                tracing::info!(key = %object.key, "orphan deleted");
                let (store, key, target) = (engine.store.clone(), object.key.clone(), backend.target().to_string());
                blocking(move || store.note_orphan_deleted(key, target, now)).await?;
            }
        }
    }
    if !dry_run {
        let store = engine.store.clone();
        blocking(move || store.set_meta_value(META_LAST_SWEEP, now.to_be_bytes().to_vec())).await?;
    }
    Ok(report)
}

/// Runs the sweep when `ARCHIVER_SWEEP_INTERVAL_SECONDS` have passed since the last one.
pub async fn sweep_if_due(engine: &Arc<Engine>) -> Result<Option<SweepReport>> {
    let store = engine.store.clone();
    let last = blocking(move || store.meta_value(META_LAST_SWEEP))
        .await?
        .and_then(|v| v.try_into().ok().map(i64::from_be_bytes));
    let now = engine.clock.now();
    if last.is_some_and(|at| now - at < engine.settings.sweep_interval_us) {
        return Ok(None);
    }
    sweep(engine, false).await.map(Some)
}

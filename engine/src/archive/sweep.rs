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

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use super::blocking;
use crate::engine::Engine;
use crate::error::Result;
use crate::model::ArchiveTarget;
use crate::storage::{ArchiveBackend, keys};

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
async fn references(engine: &Arc<Engine>) -> Result<(HashSet<String>, BTreeSet<(String, ArchiveTarget)>)> {
    let store = engine.store.clone();
    blocking(move || {
        let snapshot = store.snapshot()?;
        let mut keys = HashSet::new();
        let mut targets = BTreeSet::new();
        snapshot.visit_manifests(|manifest| {
            targets.insert((manifest.table.clone(), manifest.archive_target()));
            keys.extend(manifest.segments.into_iter().map(|s| s.key));
            Ok(())
        })?;
        snapshot.visit_buckets(|meta| {
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
        Ok((keys, targets))
    })
    .await
}

pub async fn sweep(engine: &Arc<Engine>, dry_run: bool) -> Result<SweepReport> {
    let (referenced, archive_targets) = references(engine).await?;
    let now = engine.clock.now();
    let grace = engine.settings.orphan_grace_us;
    let mut report = SweepReport { dry_run, ..Default::default() };
    let policies = engine.policies();
    // Every table's folder on its current target and on every target its archives were
    // written to, and every target's scratch folders (`.tmp/` of large uploads,
    // `.frostline-probe/`): nothing names a scratch object, so only the grace protects one.
    let mut folders: Vec<(Arc<dyn ArchiveBackend>, String, bool)> = Vec::new();
    for (id, table) in &policies.tables {
        folders.push((table.backend.clone(), keys::table_prefix(id), false));
        for (_, target) in archive_targets.iter().filter(|(t, _)| t == id) {
            // A target gone from the directory cannot be swept; its archives are refused
            // elsewhere (reads say so), and nothing is lost by leaving it alone.
            if let Ok(backend) = policies.archive_backend(table, target)
                && !folders.iter().any(|(b, p, _)| Arc::ptr_eq(b, &backend) && *p == keys::table_prefix(id))
            {
                folders.push((backend, keys::table_prefix(id), false));
            }
        }
    }
    for backend in policies.targets.values() {
        folders.extend(keys::SCRATCH_PREFIXES.iter().map(|scratch| (backend.clone(), scratch.to_string(), true)));
    }
    for (backend, prefix, scratch) in &folders {
        let listed = backend.list(prefix).await?;
        for object in listed {
            if object.key.ends_with(super::catalog::CATALOG_FILE) {
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

//! The orphan sweep: objects under a table's prefix that no published manifest, no in-flight
//! upload intent and no unfinished expiry names, and objects in a target's scratch folders
//! (`.tmp/`, `.frostline-probe/`), older than the grace period, are deleted in bounded pages.
//! The reference set is read first; if it cannot be read the sweep stops before deleting
//! anything. A dry run counts without deleting.

use std::collections::HashSet;
use std::sync::Arc;

use super::blocking;
use crate::engine::Engine;
use crate::error::Result;
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
    pub deleted: u64,
    pub orphan_keys: Vec<String>,
}

/// Keys that must never be swept.
async fn references(engine: &Arc<Engine>) -> Result<HashSet<String>> {
    let store = engine.store.clone();
    blocking(move || {
        let mut keys = HashSet::new();
        for manifest in store.all_manifests()? {
            keys.extend(manifest.segments.into_iter().map(|s| s.key));
        }
        store.visit_buckets(|meta| {
            keys.extend(meta.manifest_key);
            Ok(())
        })?;
        for intent in store.intents()? {
            keys.extend(intent.keys);
        }
        for tombstone in store.tombstones()? {
            if tombstone.completed_at.is_none() {
                keys.extend(tombstone.keys);
            }
        }
        Ok(keys)
    })
    .await
}

pub async fn sweep(engine: &Arc<Engine>, dry_run: bool) -> Result<SweepReport> {
    let referenced = references(engine).await?;
    let now = engine.clock.now();
    let grace = engine.settings.orphan_grace_us;
    let mut report = SweepReport { dry_run, ..Default::default() };
    let policies = engine.policies();
    // Every table's folder, and every target's scratch folders (`.tmp/` of large uploads,
    // `.frostline-probe/`): nothing names a scratch object, so only the grace protects one.
    let mut folders: Vec<(Arc<dyn ArchiveBackend>, String)> =
        policies.tables.iter().map(|(id, table)| (table.backend.clone(), keys::table_prefix(id))).collect();
    for backend in policies.targets.values() {
        folders.extend(keys::SCRATCH_PREFIXES.iter().map(|scratch| (backend.clone(), scratch.to_string())));
    }
    for (backend, prefix) in &folders {
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
            if now - object.last_modified < grace {
                report.too_young += 1;
                continue;
            }
            report.orphans += 1;
            if report.orphan_keys.len() < SWEEP_DELETES_PER_RUN_MAX {
                report.orphan_keys.push(object.key.clone());
            }
            if !dry_run && (report.deleted as usize) < SWEEP_DELETES_PER_RUN_MAX {
                backend.delete(&object.key).await?;
                report.deleted += 1;
                tracing::info!(key = %object.key, "orphan deleted");
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

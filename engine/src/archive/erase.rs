//! Carrying out erasure requests (`store::erasure`), a bucket at a time, from the pass.
//!
//! - A hot bucket nobody holds: its named rows are deleted in one transaction.
//! - A bucket with an archive: `Step::Erase` makes its next generation due at once. The
//!   archival (`bucket::upload_and_publish`) deletes the named hot rows under its lease and
//!   leaves the named archived rows out, then publishes, verifies and cleans up as for any
//!   generation; the replaced generations' objects are released.
//! - Once the bucket's archive was published by a claim made after the request (so without the
//!   named records) and its cleanup is done, every object this data directory released in the
//!   bucket's folders is deleted now, not after the sweep's grace (the Delta log commits their
//!   removes first), and a listing proves them absent. The receipt names the new archive, the
//!   replaced manifests, the deleted objects and when absence was proved.
//!
//! A bucket a hold covers is left alone and named as blocked; it resumes when the hold is
//! lifted. A bucket being archived or cleaned waits for a later pass.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use super::blocking;
use crate::engine::Context;
use crate::error::{Error, Result};
use crate::format::manifest::Manifest;
use crate::model::{ArchiveTarget, BucketState};
use crate::storage::{ArchiveBackend, keys};
use crate::store::erasure::{ErasureBucket, ErasureProgress, ErasureRequest, ErasureSelector, selectors_by_bucket};
use crate::store::schema::{BucketId, BucketMeta, Hold};

/// Advances every open request by one step per bucket; the buckets finished. The archives to
/// send to their next generation are scheduled in one transaction, and each request's changed
/// buckets are written in one.
pub async fn carry_out(ctx: &Arc<Context>) -> Result<u64> {
    let store = ctx.store.clone();
    let open: Vec<ErasureRequest> = blocking(move || store.open_erasures()).await?;
    if open.is_empty() {
        return Ok(0);
    }
    let store = ctx.store.clone();
    let (holds, epochs, sweep_stop) =
        blocking(move || Ok((store.holds()?, store.snapshot()?.epochs()?, store.sweep_stop()?))).await?;
    let step = Step { holds, epochs, sweep_stopped: sweep_stop.is_some(), selectors: selectors_by_bucket(&open) };
    let mut done = 0;
    let mut schedule = BTreeSet::new();
    for request in &open {
        let mut changed = Vec::new();
        for entry in request.buckets.iter().filter(|b| b.progress != ErasureProgress::Done) {
            let advanced = advance(ctx, &step, entry.clone(), &mut schedule).await?;
            if advanced != *entry {
                done += u64::from(advanced.progress == ErasureProgress::Done);
                changed.push(advanced);
            }
        }
        if !changed.is_empty() {
            let (store, id, now) = (ctx.store.clone(), request.id.clone(), ctx.clock.now());
            blocking(move || store.update_erasure_buckets(&id, changed, now)).await?;
        }
    }
    if !schedule.is_empty() {
        let (store, now) = (ctx.store.clone(), ctx.clock.now());
        blocking(move || store.schedule_erasure(schedule.into_iter().collect(), now)).await?;
    }
    Ok(done)
}

/// What every bucket's step of one `carry_out` reads, read once.
struct Step {
    holds: Vec<Hold>,
    /// The epochs of this data directory's lives: a key of this installation written in any
    /// other is another copy's (a restored backup's), never deleted here.
    epochs: HashSet<String>,
    /// The orphan sweep stopped on another copy's keys: nothing is deleted until it is resolved.
    sweep_stopped: bool,
    /// The selectors of the open requests, by the buckets they have not finished.
    selectors: BTreeMap<BucketId, Vec<ErasureSelector>>,
}

/// One bucket's next step; the entry as it stands after it. An archive to send to its next
/// generation is added to `schedule`.
async fn advance(
    ctx: &Arc<Context>,
    step: &Step,
    mut entry: ErasureBucket,
    schedule: &mut BTreeSet<BucketId>,
) -> Result<ErasureBucket> {
    let (store, id) = (ctx.store.clone(), entry.bucket.clone());
    let Some(meta) = blocking(move || store.bucket(&id)).await? else {
        return Ok(done(ctx, entry));
    };
    if meta.state == BucketState::Expired {
        // Its archive is deleted (or being deleted) by the expiry, with the rows beside it.
        return Ok(done(ctx, entry));
    }
    let held: Vec<String> = step.holds.iter().filter(|h| h.covers(&meta)).map(|h| h.id.clone()).collect();
    if !held.is_empty() {
        entry.progress = ErasureProgress::Blocked;
        entry.blocked_by = held;
        return Ok(entry);
    }
    entry.progress = ErasureProgress::Pending;
    entry.blocked_by.clear();
    match meta.state {
        BucketState::Hot => {
            let selectors = step.selectors.get(&meta.id).cloned().unwrap_or_default();
            let (store, id, now) = (ctx.store.clone(), meta.id.clone(), ctx.clock.now());
            match blocking(move || store.erase_hot_rows(&id, selectors, None, now)).await? {
                Some(erased) => {
                    entry.hot_rows_erased += erased;
                    Ok(done(ctx, entry))
                }
                None => Ok(entry),
            }
        }
        BucketState::Archived { hot_deleted: true } | BucketState::ArchivedPending => {
            let store = ctx.store.clone();
            let id = meta.id.clone();
            let manifest = blocking(move || store.latest_manifest(&id)).await?;
            let selectors = step.selectors.get(&meta.id).map(Vec::as_slice).unwrap_or_default();
            let rewritten = match manifest.filter(|m| m.generation > entry.placed_generation) {
                // The Delta log stops naming the replaced files before they are read or
                // deleted: the pass's sync (after its archival, before its second erasure
                // step) serves every bucket waiting here.
                Some(_) if log_lags(ctx, &meta)? => return Ok(entry),
                // Published by a later claim; proved by reading it back (hashes checked) that
                // it holds none of the named records: an archive another copy wrote, adopted
                // since, may have a higher generation and hold them all.
                Some(manifest) if holds_none(ctx, &meta, &manifest, selectors).await? => Some(manifest),
                _ => None,
            };
            match rewritten {
                Some(manifest) => {
                    delete_replaced(ctx, step, &meta, &manifest, &mut entry).await?;
                    Ok(done(ctx, entry))
                }
                None => {
                    // Already due (an earlier step scheduled it, or late rows past their grace):
                    // the archival will take it; scheduling again would only fence it again.
                    let due = meta.state == BucketState::ArchivedPending
                        && meta.next_retry_at.is_none_or(|at| at <= ctx.clock.now());
                    if !due {
                        schedule.insert(meta.id.clone());
                    }
                    Ok(entry)
                }
            }
        }
        // Being archived or cleaned up: a later pass finds it settled.
        _ => Ok(entry),
    }
}

/// Whether the bucket's table has a Delta log that may still name the files of the generations
/// its published archive replaced (`engine::DeltaCoverage`).
#[cfg_attr(not(feature = "delta"), allow(unused_variables))]
fn log_lags(ctx: &Arc<Context>, meta: &BucketMeta) -> Result<bool> {
    #[cfg(feature = "delta")]
    {
        let table = ctx.policies.table(&meta.id.table)?;
        if table.delta_log() {
            let published = meta.manifest_key.as_deref().unwrap_or_default();
            return Ok(!super::delta::replaced_files_dropped(ctx, &meta.id, published));
        }
    }
    Ok(false)
}

/// Whether the bucket's archive (`manifest`, read back from its target with every hash
/// checked) holds no record `selectors` name.
async fn holds_none(
    ctx: &Arc<Context>,
    meta: &BucketMeta,
    manifest: &Manifest,
    selectors: &[ErasureSelector],
) -> Result<bool> {
    let Some(key) = &meta.manifest_key else { return Ok(false) };
    let table = ctx.policies.table(&meta.id.table)?.clone();
    let backend = ctx.policies.archive_backend(&table, &manifest.archive_target())?;
    // Segment by segment, stopping at the first record named: never the whole bucket at once.
    let named = |row: &crate::model::Record| selectors.iter().any(|s| s.matches_record(&meta.id.table, row));
    let want = crate::format::reader::Want { rows: 1, bytes: usize::MAX };
    let found = crate::format::reader::read_archive_until(backend.as_ref(), key, None, None, named, want).await?;
    Ok(found.is_empty())
}

fn done(ctx: &Arc<Context>, mut entry: ErasureBucket) -> ErasureBucket {
    entry.progress = ErasureProgress::Done;
    entry.blocked_by.clear();
    entry.done_at = Some(ctx.clock.now());
    entry
}

/// Deletes what this data directory released in the bucket's folders (the generations the
/// erasure replaced, and earlier ones the sweep had not yet reached), then lists the folders to
/// prove them absent. Another copy's or installation's objects there are named, not deleted.
async fn delete_replaced(
    ctx: &Arc<Context>,
    step: &Step,
    meta: &BucketMeta,
    manifest: &Manifest,
    entry: &mut ErasureBucket,
) -> Result<()> {
    // The sweep's rule (ARCHITECTURE.md, "The ownership rule"): while another copy of this
    // data directory may write here, nothing is deleted, not even what this one released.
    if step.sweep_stopped {
        return Err(Error::Conflict(format!(
            "erasure of bucket {}: the orphan sweep stopped on another copy of this data directory's keys; \
             nothing is deleted until `frostline adopt` resolves it (`frostline status` names the key)",
            meta.id
        )));
    }
    let policies = ctx.policies.clone();
    let table = policies.table(&meta.id.table)?.clone();
    let id = &meta.id;
    let folders: Vec<String> = [keys::Layout::Hive, keys::Layout::Delta]
        .into_iter()
        .flat_map(|layout| {
            [
                keys::bucket_folder(layout, &id.table, &ctx.installation_id, &id.bucket_key, &id.partition_key),
                keys::manifest_folder(layout, &id.table, &ctx.installation_id, &id.bucket_key, &id.partition_key),
            ]
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    // What this data directory released in the bucket's folders, and every target the
    // bucket's generations were written to: the recorded manifests' and the released keys'
    // (a replaced archive's copy goes once its objects are released), and the table's own.
    let (store, bucket, table_id, wanted) = (ctx.store.clone(), id.clone(), id.table.clone(), folders.clone());
    let (targets, released) = blocking(move || {
        let mut targets: Vec<ArchiveTarget> =
            store.snapshot()?.manifests_of(&bucket)?.iter().map(Manifest::archive_target).collect();
        let released = store.released_under(&table_id, &wanted)?;
        targets.extend(released.iter().map(|key| ArchiveTarget { name: String::new(), url: key.target.clone() }));
        Ok((targets, released))
    })
    .await?;
    let mut backends: Vec<Arc<dyn ArchiveBackend>> = vec![table.backend.clone()];
    for target in &targets {
        if let Ok(backend) = policies.archive_backend(&table, target)
            && !backends.iter().any(|b| b.target() == backend.target())
        {
            backends.push(backend);
        }
    }
    // Before anything is deleted: a key of this installation from a life this data directory
    // never had is another copy's (a restored backup's); it stops the deletion, as the sweep's.
    for backend in &backends {
        for folder in &folders {
            for object in backend.list(folder).await? {
                if let Some(keys::Origin { installation, epoch: Some(epoch), .. }) = keys::origin(&object.key)
                    && installation == ctx.installation_id
                    && !step.epochs.contains(epoch)
                {
                    return Err(Error::Conflict(format!(
                        "erasure of bucket {id}: `{}` on {} was written by another copy of this data directory \
                         (epoch {epoch}, which this one never had); nothing is deleted until `frostline adopt` \
                         takes it in",
                        object.key,
                        backend.target()
                    )));
                }
            }
        }
    }
    let now = ctx.clock.now();
    for key in &released {
        let Some(backend) = backends.iter().find(|b| b.target() == key.target) else {
            return Err(Error::StorageUnavailable(format!(
                "erasure of bucket {id}: target {} of `{}` is not in the policy directory; declare it so the \
                 replaced objects can be deleted",
                key.target, key.key
            )));
        };
        crate::failpoints::hit("mid_erase_delete")?;
        backend.delete(&key.key).await?;
        entry.deleted_objects.push(key.key.clone());
        if backend.keeps_deleted_versions() && !entry.versions_kept_on.contains(&key.target) {
            entry.versions_kept_on.push(key.target.clone());
        }
    }
    // Absence proved by listing; what is left is the new archive's, or not this directory's.
    let referenced: BTreeSet<&str> =
        manifest.segments.iter().map(|s| s.key.as_str()).chain(meta.manifest_key.as_deref()).collect();
    let deleted: BTreeSet<&str> = released.iter().map(|k| k.key.as_str()).collect();
    entry.kept_unproven.clear();
    for backend in &backends {
        for folder in &folders {
            for object in backend.list(folder).await? {
                if deleted.contains(object.key.as_str()) {
                    return Err(Error::StorageUnavailable(format!(
                        "object `{}` is still listed after its deletion; the erasure will be retried",
                        object.key
                    )));
                }
                if !referenced.contains(object.key.as_str()) {
                    entry.kept_unproven.push(object.key);
                }
            }
        }
    }
    for key in released {
        let store = ctx.store.clone();
        blocking(move || store.forget_released(key, true, now)).await?;
    }
    entry.manifest_key = meta.manifest_key.clone();
    entry.replaced_manifests = manifest.amends.as_ref().map(|a| a.lineage.clone()).unwrap_or_default();
    entry.proved_absent_at = Some(ctx.clock.now());
    #[cfg(feature = "delta")]
    super::delta::forget_erasure(ctx, id);
    tracing::info!(bucket = %id, deleted = entry.deleted_objects.len(), "erasure: replaced objects deleted and proved absent");
    Ok(())
}

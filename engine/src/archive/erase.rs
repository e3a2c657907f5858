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

use std::collections::BTreeSet;
use std::sync::Arc;

use super::blocking;
use crate::engine::Context;
use crate::error::{Error, Result};
use crate::model::BucketState;
use crate::storage::{ArchiveBackend, keys};
use crate::store::erasure::{ErasureBucket, ErasureProgress, ErasureRequest};
use crate::store::schema::BucketMeta;

/// Advances every open request by one step per bucket; the buckets finished.
pub async fn carry_out(ctx: &Arc<Context>) -> Result<u64> {
    let store = ctx.store.clone();
    let open: Vec<ErasureRequest> =
        blocking(move || store.erasures()).await?.into_iter().filter(ErasureRequest::is_open).collect();
    let mut done = 0;
    for request in open {
        for entry in request.buckets.iter().filter(|b| b.progress != ErasureProgress::Done) {
            let advanced = advance(ctx, entry.clone()).await?;
            if advanced != *entry {
                done += u64::from(advanced.progress == ErasureProgress::Done);
                let (store, id, now) = (ctx.store.clone(), request.id.clone(), ctx.clock.now());
                blocking(move || store.update_erasure_bucket(&id, advanced, now)).await?;
            }
        }
    }
    Ok(done)
}

/// One bucket's next step; the entry as it stands after it.
async fn advance(ctx: &Arc<Context>, mut entry: ErasureBucket) -> Result<ErasureBucket> {
    let (store, id) = (ctx.store.clone(), entry.bucket.clone());
    let Some(meta) = blocking(move || store.bucket(&id)).await? else {
        return Ok(done(ctx, entry));
    };
    if meta.state == BucketState::Expired {
        // Its archive is deleted (or being deleted) by the expiry, with the rows beside it.
        return Ok(done(ctx, entry));
    }
    let store = ctx.store.clone();
    let held: Vec<String> =
        blocking(move || store.holds()).await?.into_iter().filter(|h| h.covers(&meta)).map(|h| h.id).collect();
    if !held.is_empty() {
        entry.progress = ErasureProgress::Blocked;
        entry.blocked_by = held;
        return Ok(entry);
    }
    entry.progress = ErasureProgress::Pending;
    entry.blocked_by.clear();
    match meta.state {
        BucketState::Hot => {
            let store = ctx.store.clone();
            let selectors = blocking({
                let meta = meta.clone();
                move || store.erasure_selectors(&meta)
            })
            .await?;
            let (store, id, now) = (ctx.store.clone(), meta.id.clone(), ctx.clock.now());
            // The count lands in the entry through the store; read it back with the others.
            if blocking(move || store.erase_hot_rows(&id, selectors, None, 0, now)).await?.is_some() {
                let erased = current(ctx, &entry).await?;
                return Ok(done(ctx, erased));
            }
            Ok(entry)
        }
        BucketState::Archived { hot_deleted: true } | BucketState::ArchivedPending => {
            let store = ctx.store.clone();
            let id = meta.id.clone();
            let manifest = blocking(move || store.latest_manifest(&id)).await?;
            let rewritten = manifest.as_ref().is_some_and(|m| m.generation > entry.placed_generation);
            if !rewritten {
                let (store, id, now) = (ctx.store.clone(), meta.id.clone(), ctx.clock.now());
                blocking(move || store.schedule_erasure(&id, now)).await?;
                return Ok(entry);
            }
            let manifest = manifest.expect("a rewritten bucket has a manifest");
            let mut entry = current(ctx, &entry).await?;
            delete_replaced(ctx, &meta, &manifest, &mut entry).await?;
            Ok(done(ctx, entry))
        }
        // Being archived or cleaned up: a later pass finds it settled.
        _ => Ok(entry),
    }
}

fn done(ctx: &Arc<Context>, mut entry: ErasureBucket) -> ErasureBucket {
    entry.progress = ErasureProgress::Done;
    entry.blocked_by.clear();
    entry.done_at = Some(ctx.clock.now());
    entry
}

/// The entry as the store has it now (the archival adds its counts there).
async fn current(ctx: &Arc<Context>, entry: &ErasureBucket) -> Result<ErasureBucket> {
    let store = ctx.store.clone();
    let requests = blocking(move || store.erasures()).await?;
    let counts = requests
        .iter()
        .flat_map(|r| r.buckets.iter())
        .filter(|b| b.bucket == entry.bucket && b.progress != ErasureProgress::Done)
        .map(|b| (b.hot_rows_erased, b.archived_rows_erased))
        .max()
        .unwrap_or((entry.hot_rows_erased, entry.archived_rows_erased));
    Ok(ErasureBucket { hot_rows_erased: counts.0, archived_rows_erased: counts.1, ..entry.clone() })
}

/// Deletes what this data directory released in the bucket's folders (the generations the
/// erasure replaced, and earlier ones the sweep had not yet reached), then lists the folders to
/// prove them absent. Another copy's or installation's objects there are named, not deleted.
async fn delete_replaced(
    ctx: &Arc<Context>,
    meta: &BucketMeta,
    manifest: &crate::format::manifest::Manifest,
    entry: &mut ErasureBucket,
) -> Result<()> {
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
    // The Delta log stops naming the replaced files before they are deleted.
    #[cfg(feature = "delta")]
    if table.delta_log() {
        super::delta::sync(ctx, &table).await?;
    }
    // Every target the bucket's generations were written to, and the table's own.
    let mut backends: Vec<Arc<dyn ArchiveBackend>> = vec![table.backend.clone()];
    let (store, bucket) = (ctx.store.clone(), id.clone());
    for recorded in blocking(move || store.snapshot()?.manifests_of(&bucket)).await? {
        if let Ok(backend) = policies.archive_backend(&table, &recorded.archive_target())
            && !backends.iter().any(|b| b.target() == backend.target())
        {
            backends.push(backend);
        }
    }
    let (store, table_id, wanted) = (ctx.store.clone(), id.table.clone(), folders.clone());
    let released = blocking(move || store.released_under(&table_id, &wanted)).await?;
    let now = ctx.clock.now();
    for key in &released {
        let Some(backend) = backends.iter().find(|b| b.target() == key.target) else {
            return Err(Error::StorageUnavailable(format!(
                "erasure of bucket {id}: target {} of `{}` is not in the policy directory; declare it so the \
                 replaced objects can be deleted",
                key.target, key.key
            )));
        };
        backend.delete(&key.key).await?;
        entry.deleted_objects.push(key.key.clone());
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
    tracing::info!(bucket = %id, deleted = entry.deleted_objects.len(), "erasure: replaced objects deleted and proved absent");
    Ok(())
}

//! Archive expiry, in the order that makes it provable: under the bucket's fence, re-check
//! every legal hold, then write the tombstone and an outbox event durably (the bucket becomes
//! `Expired`), then delete the objects, manifest first, then prove their absence by listing
//! (never by one failed read), then complete the tombstone. A crash anywhere is finished by
//! the next claim, which rereads the tombstone.
//!
//! On a table with a Delta log the objects are deleted only once a sync has committed the
//! removes of the bucket's files (a reader of the log's newest version is never sent to a
//! missing file). Rather than one sync per expiring bucket, whose cost grows with the table, an
//! expiry that finds the log not yet caught up releases its lease and waits (`AwaitsLog`);
//! the pass syncs each table once and then finishes all of them (`archive::run_pass`).

use std::sync::Arc;

use super::blocking;
use super::bucket::Heartbeat;
use crate::engine::Context;
use crate::error::{Error, Result};
use crate::policy::TablePolicy;
use crate::storage::keys;
use crate::store::schema::{BucketId, BucketMeta, Tombstone};

/// What an expiry step did.
pub(super) enum ExpiryOutcome {
    Expired,
    /// A legal hold covers the bucket; it is parked until the hold is lifted.
    Held,
    /// The tombstone is durable and the lease released; the deletes wait until the table's
    /// Delta log no longer lists the bucket's files. Due again at once.
    #[cfg_attr(not(feature = "delta"), allow(dead_code))] // only Delta tables wait
    AwaitsLog,
}

/// Starts (and finishes) the expiry of a published, cleaned bucket.
pub(super) async fn expire(
    ctx: &Arc<Context>,
    table: &Arc<TablePolicy>,
    owner: &str,
    meta: &BucketMeta,
    heartbeat: &Heartbeat,
) -> Result<ExpiryOutcome> {
    let store = ctx.store.clone();
    let id = meta.id.clone();
    let manifest = blocking(move || store.latest_manifest(&id))
        .await?
        .ok_or_else(|| Error::Internal(format!("archived bucket {} has no recorded manifest", meta.id)))?;
    let manifest_key = meta
        .manifest_key
        .clone()
        .ok_or_else(|| Error::Internal(format!("archived bucket {} names no manifest", meta.id)))?;
    // The manifest goes first: once it is gone no reader can be sent to a missing segment.
    let keys: Vec<String> =
        std::iter::once(manifest_key).chain(manifest.segments.iter().map(|s| s.key.clone())).collect();
    heartbeat.check("expiry").await?;
    let (store, id, owner_s, now) = (ctx.store.clone(), meta.id.clone(), owner.to_string(), ctx.clock.now());
    let generation = meta.generation;
    let target = manifest.archive_target();
    let Some(tombstone) = blocking(move || store.begin_expiry(id, owner_s, generation, now, keys, target)).await?
    else {
        tracing::info!(bucket = %meta.id, "expiry stopped by a legal hold");
        return Ok(ExpiryOutcome::Held);
    };
    #[cfg(feature = "delta")]
    if table.delta_log() {
        // Unpublished from here on: a sync that starts later drops the bucket's files.
        super::delta::take_expiry_ticket(ctx, &meta.id);
    }
    crate::failpoints::hit("after_expiry_tombstone")?;
    finish(ctx, table, owner, generation, tombstone).await
}

/// Deletes what a tombstone names on the target it records, proves absence by listing the
/// folders the objects were written to, completes the tombstone. Just before the first delete
/// call every hold is checked once more (`Store::start_deletes`): a hold placed since the
/// tombstone was written calls the expiry off, as long as nothing has been deleted.
pub(super) async fn finish(
    ctx: &Arc<Context>,
    table: &Arc<TablePolicy>,
    owner: &str,
    generation: u64,
    tombstone: Tombstone,
) -> Result<ExpiryOutcome> {
    let backend = ctx.policies.clone().archive_backend(table, &tombstone.target)?;
    let id: &BucketId = &tombstone.bucket;
    #[cfg(feature = "delta")]
    if table.delta_log() && !super::delta::expired_files_dropped(ctx, id) {
        let (store, bucket, owner, now) = (ctx.store.clone(), id.clone(), owner.to_string(), ctx.clock.now());
        blocking(move || store.await_delta_log(bucket, owner, generation, now)).await?;
        return Ok(ExpiryOutcome::AwaitsLog);
    }
    // Every folder the objects lie in (a Delta table keeps manifests apart from segments).
    let folders: std::collections::BTreeSet<String> =
        tombstone.keys.iter().map(|key| keys::folder_of(key).to_string()).collect();
    if tombstone.deletes_started_at.is_none() {
        // Reach the target before committing to delete: during an outage the expiry waits
        // here, where a hold can still call it off.
        backend.list(keys::folder_of(&tombstone.manifest_key)).await?;
        crate::failpoints::hit("before_start_deletes")?;
        let (store, bucket, owner, now) = (ctx.store.clone(), id.clone(), owner.to_string(), ctx.clock.now());
        if !blocking(move || store.start_deletes(bucket, owner, generation, now)).await? {
            tracing::info!(bucket = %id, "expiry called off by a legal hold placed before its first delete");
            #[cfg(feature = "delta")]
            super::delta::forget_expiry(ctx, id);
            return Ok(ExpiryOutcome::Held);
        }
    }
    for key in &tombstone.keys {
        backend.delete(key).await?;
        crate::failpoints::hit("mid_expiry_delete")?;
    }
    for folder in &folders {
        let listed = backend.list(folder).await?;
        if let Some(left) = listed.iter().find(|o| tombstone.keys.contains(&o.key)) {
            return Err(Error::StorageUnavailable(format!(
                "object `{}` is still listed after its deletion; the expiry will be retried",
                left.key
            )));
        }
    }
    let objects = tombstone.keys.len();
    let now = ctx.clock.now();
    let purge_at = now.saturating_add(ctx.settings.tombstone_retention_us);
    let (store, id, owner) = (ctx.store.clone(), id.clone(), owner.to_string());
    blocking(move || store.complete_expiry(id, owner, generation, now, purge_at)).await?;
    #[cfg(feature = "delta")]
    super::delta::forget_expiry(ctx, &tombstone.bucket);
    tracing::info!(bucket = %tombstone.bucket, objects, reason = %tombstone.reason, "archive expired");
    Ok(ExpiryOutcome::Expired)
}

//! One due bucket's step, under its own lease: archive it (claim, snapshot a segment at a time,
//! upload and verify each segment, create and verify the manifest, publish) and clean up its
//! hot rows, or the next step of its expiry. The lease is renewed on the engine's clock before
//! each step, and by a timer while one runs long (`Heartbeat`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use tracing::Instrument as _;

use super::report::{DeferralReason, Lap, Phase, PhaseSeconds};
use super::{blocking, expiry, pipeline};

use crate::engine::Context;
use crate::error::{Error, Result};
use crate::format::manifest::{Amendment, ErasuresAnswered, MANIFEST_VERSION, Manifest, SegmentInfo, sha256_hex};
use crate::model::{BucketState, Micros};
use crate::policy::TablePolicy;
use crate::storage::{ArchiveBackend, PutOutcome, keys};
use crate::store::Publication;
use crate::store::schema::{BucketId, BucketMeta, UploadIntent};

pub(super) enum Outcome {
    Archived {
        rows: u64,
        bytes: u64,
    },
    Cleaned,
    Expired,
    /// An expiry's deletes wait for the table's Delta log (`expiry::ExpiryOutcome::AwaitsLog`).
    ExpiryAwaitsLog,
    Held,
    /// Deferred for a retry: why, and the reason the metrics count it under.
    Deferred(String, DeferralReason),
    NotClaimed,
    /// A finished expiry's tombstone, purged.
    Purged,
}

impl From<expiry::ExpiryOutcome> for Outcome {
    fn from(outcome: expiry::ExpiryOutcome) -> Outcome {
        match outcome {
            expiry::ExpiryOutcome::Expired => Outcome::Expired,
            expiry::ExpiryOutcome::Held => Outcome::Held,
            expiry::ExpiryOutcome::AwaitsLog => Outcome::ExpiryAwaitsLog,
        }
    }
}

/// The lease renewal of one claim, driven by the injected clock: before each step, `check`
/// renews the lease when a renewal period has passed on the engine's clock since the last one
/// (so a simulation that advances the clock in the middle of a step renews, or loses, the
/// lease deterministically), and a background task does the same on a timer while one step
/// runs long in real time. Once a renewal fails, no further destructive step starts.
pub(super) struct Heartbeat {
    lost: Arc<AtomicBool>,
    /// When the lease was last taken or renewed (engine clock).
    renewed_at: Arc<std::sync::atomic::AtomicI64>,
    renew: Arc<dyn Fn(Micros) -> Result<()> + Send + Sync>,
    ctx: Arc<Context>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Heartbeat {
    fn start(ctx: &Arc<Context>, id: BucketId, owner: String, generation: u64) -> Heartbeat {
        let lost = Arc::new(AtomicBool::new(false));
        let renewed_at = Arc::new(std::sync::atomic::AtomicI64::new(ctx.clock.now()));
        let store = ctx.store.clone();
        let lease_us = ctx.settings.lease_us;
        let bucket = id.clone();
        let renew: Arc<dyn Fn(Micros) -> Result<()> + Send + Sync> = Arc::new(move |now| {
            crate::failpoints::hit("heartbeat")?;
            store.renew(id.clone(), owner.clone(), generation, now, lease_us).map(|_| ())
        });
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let period = std::time::Duration::from_micros(ctx.settings.lease_renewal_us as u64);
        let task = {
            let (ctx, lost, renewed_at, renew) = (ctx.clone(), lost.clone(), renewed_at.clone(), renew.clone());
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stopped.changed() => return,
                        _ = tokio::time::sleep(period) => {}
                    }
                    let now = ctx.clock.now();
                    let renew = renew.clone();
                    match blocking(move || renew(now)).await {
                        Ok(()) => renewed_at.store(now, Ordering::SeqCst),
                        Err(e) => {
                            lost.store(true, Ordering::SeqCst);
                            // A step of this very claim may have released the lease just before
                            // the task was stopped (an expiry that waits for the Delta log): the
                            // bucket then has no lease owner at this claim's generation, and
                            // nothing was lost. Another claim would have taken a later one.
                            let (store, bucket) = (ctx.store.clone(), bucket.clone());
                            let released = blocking(move || store.bucket(&bucket))
                                .await
                                .ok()
                                .flatten()
                                .is_some_and(|meta| meta.lease_owner.is_none() && meta.generation == generation);
                            if released {
                                tracing::debug!("lease released by this claim's own step; renewal stopped");
                            } else {
                                tracing::warn!(error = %e, "lease renewal failed; no further destructive step will start");
                            }
                            return;
                        }
                    }
                }
            })
        };
        Heartbeat { lost, renewed_at, renew, ctx: ctx.clone(), stop, task }
    }

    /// Before `step`: fails when a renewal has failed, and renews the lease first when it is
    /// due on the engine's clock.
    pub(super) async fn check(&self, step: &str) -> Result<()> {
        let now = self.ctx.clock.now();
        if !self.lost.load(Ordering::SeqCst)
            && now - self.renewed_at.load(Ordering::SeqCst) >= self.ctx.settings.lease_renewal_us
        {
            let renew = self.renew.clone();
            match blocking(move || renew(now)).await {
                Ok(()) => self.renewed_at.store(now, Ordering::SeqCst),
                Err(e) => {
                    tracing::warn!(error = %e, step, "lease renewal failed; no further destructive step will start");
                    self.lost.store(true, Ordering::SeqCst);
                }
            }
        }
        self.check_held(step)
    }

    fn check_held(&self, step: &str) -> Result<()> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(Error::LeaseLost {
                bucket: String::new(),
                owner: String::new(),
                generation: 0,
                detail: format!("lease renewal failed before {step}"),
            });
        }
        Ok(())
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// One due bucket: a finished expiry's tombstone purged when its time has come, or the next
/// step of its archival or expiry.
pub(super) async fn work_on(
    ctx: &Arc<Context>,
    owner: &str,
    meta: &BucketMeta,
    seconds: &mut PhaseSeconds,
) -> Result<Outcome> {
    if meta.state == BucketState::Expired {
        let (store, id, now) = (ctx.store.clone(), meta.id.clone(), ctx.clock.now());
        if blocking(move || store.purge_tombstone(id, now)).await? {
            return Ok(Outcome::Purged);
        }
    }
    archive_bucket(ctx, owner, meta.id.clone(), seconds).await
}

async fn archive_bucket(ctx: &Arc<Context>, owner: &str, id: BucketId, seconds: &mut PhaseSeconds) -> Result<Outcome> {
    let policies = ctx.policies.clone();
    let Some(table) = policies.tables.get(&id.table).cloned() else {
        // The store knows the table has no definition: the claim takes the bucket out of
        // the due index (so it cannot stall other tables' work) and claims nothing.
        let (store, now) = (ctx.store.clone(), ctx.clock.now());
        let lease_us = ctx.settings.lease_us;
        let (claim_id, claim_owner) = (id.clone(), owner.to_string());
        if let Some(meta) = blocking(move || store.claim(claim_id, claim_owner, now, lease_us)).await? {
            let store = ctx.store.clone();
            let (owner, why) = (owner.to_string(), format!("table `{}` is not in the policy directory", id.table));
            let retry_at = now + ctx.settings.retry_us;
            blocking(move || store.defer(id, owner, meta.generation, now, why, retry_at)).await?;
        }
        return Ok(Outcome::NotClaimed);
    };
    let now = ctx.clock.now();
    let (store, claim_id, claim_owner, lease_us) =
        (ctx.store.clone(), id.clone(), owner.to_string(), ctx.settings.lease_us);
    let mut lap = Lap::start();
    let Some(meta) = blocking(move || store.claim(claim_id, claim_owner, now, lease_us)).await? else {
        return Ok(Outcome::NotClaimed);
    };
    seconds.add(Phase::Claim, lap.lap());
    let generation = meta.generation;
    let heartbeat = Heartbeat::start(ctx, id.clone(), owner.to_string(), generation);
    let claimed = crate::failpoints::hit("after_claim");
    // The span goes with the future, never entered across an await: an entered span stays
    // the current span of the worker thread while other buckets' tasks run there.
    let span = tracing::info_span!("archive", bucket = %id, generation);
    async move {
        let result = match (claimed, meta.state) {
            (Err(e), _) => Err(e),
            (Ok(()), BucketState::Archived { hot_deleted: true }) => {
                let expired = expiry::expire(ctx, &table, owner, &meta, &heartbeat).await.map(Outcome::from);
                seconds.add(Phase::Expiry, lap.lap());
                expired
            }
            (Ok(()), BucketState::Expired) => {
                let (store, tid) = (ctx.store.clone(), id.clone());
                let finished = match blocking(move || store.tombstone(&tid)).await {
                    Ok(Some(tombstone)) => {
                        expiry::finish(ctx, &table, owner, generation, tombstone).await.map(Outcome::from)
                    }
                    Ok(None) => Err(Error::Internal(format!("expired bucket {id} has no tombstone"))),
                    Err(e) => Err(e),
                };
                seconds.add(Phase::Expiry, lap.lap());
                finished
            }
            (Ok(()), BucketState::Archived { hot_deleted: false }) => {
                cleanup(ctx, owner, &id, generation, &heartbeat, seconds).await.map(|_| Outcome::Cleaned)
            }
            (Ok(()), _) => match upload_and_publish(ctx, &table, owner, &meta, &heartbeat, seconds).await {
                Ok((rows, bytes)) => cleanup(ctx, owner, &id, generation, &heartbeat, seconds)
                    .await
                    .map(|_| Outcome::Archived { rows, bytes }),
                Err(e) => Err(e),
            },
        };
        heartbeat.stop().await;
        match result {
            Ok(outcome) => Ok(outcome),
            Err(e) => {
                // Before publication this defers the bucket (it stays fenced); after it, cleanup
                // stays pending. Either way the bucket is retried, never skipped.
                let (why, reason) = (e.to_string(), DeferralReason::of(&e));
                tracing::warn!(error = %why, reason = reason.label(), "deferring bucket");
                let store = ctx.store.clone();
                let retry_at = ctx.clock.now() + ctx.settings.retry_us;
                let (owner, now) = (owner.to_string(), ctx.clock.now());
                let why2 = why.clone();
                blocking(move || store.defer(id, owner, generation, now, why2, retry_at)).await?;
                Ok(Outcome::Deferred(why, reason))
            }
        }
    }
    .instrument(span)
    .await
}

/// Snapshot, encode, upload, verify, manifest, publish, streamed: the rows are read and
/// encoded segment by segment (`pipeline`) while the previous segment is uploaded, read back
/// and verified. Each key is in the durable upload intent before its upload (invariant 10):
/// every segment's key is added to it as the segment comes, and the manifest's with the last
/// segment's. Returns rows and bytes archived.
async fn upload_and_publish(
    ctx: &Arc<Context>,
    table: &Arc<TablePolicy>,
    owner: &str,
    meta: &BucketMeta,
    heartbeat: &Heartbeat,
    seconds: &mut PhaseSeconds,
) -> Result<(u64, u64)> {
    let id = meta.id.clone();
    let generation = meta.generation;
    // Open erasure requests that name the bucket: their hot rows are deleted under this lease
    // before the snapshot, and their archived rows left out of the next generation.
    let (store, claimed) = (ctx.store.clone(), meta.clone());
    let scope = blocking(move || store.erasure_scope(&claimed)).await?;
    // Where the engine shares erasures, the manifest says which requests it answers for.
    let answered = match ctx.fleet_key() {
        Some(_) => {
            let store = ctx.store.clone();
            let since = blocking(move || store.installation_since()).await?;
            Some(ErasuresAnswered { installation_since: since, requests: scope.answered })
        }
        None => None,
    };
    let selectors = scope.selectors;
    let erasing = !selectors.is_empty();
    let leave_out: Box<dyn Fn(&crate::model::Record) -> bool + Send> = {
        let (selectors, table_id) = (selectors.clone(), id.table.clone());
        Box::new(move |row| selectors.iter().any(|s| s.matches_record(&table_id, row)))
    };
    let (base, base_rows) = match published_base(ctx, table, meta, leave_out).await? {
        Some((base, rows)) => (Some(base), Some(rows)),
        None => (None, None),
    };
    if erasing {
        let (store, bucket, lease, now) =
            (ctx.store.clone(), id.clone(), Some((owner.to_string(), generation)), ctx.clock.now());
        let hot = blocking(move || store.erase_hot_rows(&bucket, selectors, lease, now)).await?;
        tracing::info!(hot = hot.unwrap_or(0), "erasure: hot records deleted before the next generation");
    }
    let (receiver, reader) =
        pipeline::start(ctx.clone(), id.clone(), owner.to_string(), generation, table.clone(), base_rows);
    let claimed = Claimed { owner, meta, base: base.as_ref(), answered: answered.as_ref() };
    let uploaded = upload_segments(ctx, table, claimed, heartbeat, seconds, receiver).await;
    // The receiver is gone: a reader still running stops at its next segment.
    let read = reader.await.map_err(|e| Error::Internal(format!("the reader of bucket {id} failed: {e}")))?;
    let (segments, prepared) = uploaded?;
    let read = read?;
    let archived_erased = read.erased;
    if erasing {
        tracing::info!(archived = archived_erased.rows, "erasure: archived records left out of the next generation");
    }
    seconds.add(Phase::Snapshot, read.snapshot_seconds);
    seconds.add(Phase::Encode, read.encode_seconds);
    let mut lap = Lap::start();
    let (manifest, manifest_bytes, manifest_key) = match prepared {
        Some(prepared) => prepared,
        None => {
            // No segment carried the summary: the bucket had no rows.
            let prepared = prepare_manifest(ctx, table, claimed, segments, read.summaries)?;
            record_intent(ctx, &id, generation, table, owner, vec![prepared.2.clone()]).await?;
            prepared
        }
    };
    lap.lap();
    heartbeat.check("the manifest upload").await?;
    let expected = manifest.clone();
    create_verified(table.backend.as_ref(), &manifest_key, manifest_bytes, None, |bytes| {
        let read = Manifest::from_bytes(bytes)?;
        if read != expected {
            return Err(Error::Corruption(format!(
                "manifest `{}` read back differs from what was written",
                manifest_key
            )));
        }
        Ok(())
    })
    .await?;
    crate::failpoints::hit("after_manifest")?;
    seconds.add(Phase::Manifest, lap.lap());
    heartbeat.check("publication").await?;
    crate::failpoints::hit("before_publish")?;
    let (rows_n, bytes_n) = (manifest.summary.rows, manifest.bytes);
    let (store, publish_owner, now) = (ctx.store.clone(), owner.to_string(), ctx.clock.now());
    let key = manifest_key.clone();
    let publication = Publication { manifest, manifest_key: key, erased: archived_erased };
    blocking(move || store.publish(id, publish_owner, generation, now, publication)).await?;
    seconds.add(Phase::Publish, lap.lap());
    // An erasure deletes the generations this one replaced once the Delta log no longer names
    // them: the ticket taken now is covered by this pass's sync, so the pass's second erasure
    // step deletes them.
    #[cfg(feature = "delta")]
    if erasing && table.delta_log() {
        super::delta::replaced_files_dropped(ctx, &meta.id, &manifest_key);
    }
    crate::failpoints::hit("after_publish")?;
    tracing::info!(manifest = %manifest_key, rows = rows_n, bytes = bytes_n, "bucket published");
    Ok((rows_n, bytes_n))
}

/// A manifest ready to upload: the manifest, its bytes and its key.
type PreparedManifest = (Manifest, Bytes, String);

/// Uploads the segments `receiver` yields, in order, each after its key is in the upload
/// intent; verifies each read back. Returns the segments and, when the last one came, the
/// manifest made with it (its key already in the intent).
async fn upload_segments(
    ctx: &Arc<Context>,
    table: &Arc<TablePolicy>,
    claimed: Claimed<'_>,
    heartbeat: &Heartbeat,
    seconds: &mut PhaseSeconds,
    mut receiver: tokio::sync::mpsc::Receiver<pipeline::Encoded>,
) -> Result<(Vec<SegmentInfo>, Option<PreparedManifest>)> {
    let Claimed { owner, meta, .. } = claimed;
    let id = &meta.id;
    let prefix =
        keys::bucket_folder(table.layout(), &id.table, &ctx.installation_id, &id.bucket_key, &id.partition_key);
    let writer = ctx.writer()?;
    let mut segments: Vec<SegmentInfo> = Vec::new();
    let mut prepared = None;
    while let Some(pipeline::Encoded { segment, last }) = receiver.recv().await {
        let mut lap = Lap::start();
        let sha = sha256_hex(&segment.bytes);
        let sequence = segments.len();
        let key = keys::segment_key(&prefix, &writer, sequence, &sha, table.format.extension());
        let info = SegmentInfo {
            key: key.clone(),
            sha256: sha,
            bytes: segment.bytes.len() as u64,
            rows: segment.rows,
            min_event_time: segment.min_event_time,
            max_event_time: segment.max_event_time,
            summary: segment.summary,
            columns: segment.columns,
        };
        segments.push(info.clone());
        let mut intent_keys = vec![key];
        if let Some(summaries) = last {
            let manifest = prepare_manifest(ctx, table, claimed, segments.clone(), summaries)?;
            intent_keys.push(manifest.2.clone());
            prepared = Some(manifest);
        }
        seconds.add(Phase::Encode, lap.lap());
        record_intent(ctx, id, meta.generation, table, owner, intent_keys).await?;
        seconds.add(Phase::RecordIntent, lap.lap());
        heartbeat.check("a segment upload").await?;
        create_verified(table.backend.as_ref(), &info.key, Bytes::from(segment.bytes), Some(&mut *seconds), |bytes| {
            crate::failpoints::hit("after_segment_upload")?;
            // create_verified has compared the bytes with the payload and checked their hash
            // against the key; what is left is that they decode to the manifest's rows.
            crate::format::reader::check_segment_rows(table.format, &info, bytes)
        })
        .await?;
        crate::failpoints::hit("after_read_back")?;
    }
    Ok((segments, prepared))
}

/// A bucket claimed for archival: by whom, as claimed, and the archive it starts from.
#[derive(Clone, Copy)]
struct Claimed<'a> {
    owner: &'a str,
    meta: &'a BucketMeta,
    base: Option<&'a Base>,
    /// The erasure requests the generation answers for, where the engine shares erasures.
    answered: Option<&'a ErasuresAnswered>,
}

/// The published archive a next generation starts from: its generation and manifest key.
struct Base {
    generation: u64,
    manifest_key: String,
    /// The keys of the generations it replaced, oldest first.
    lineage: Vec<String>,
}

/// When the claimed bucket has a published archive (rows were appended after it, and this
/// archival makes the next generation), that archive, and its rows to be read from the target
/// its manifest names as the merge reaches them (`pipeline::BaseRows`), without those
/// `leave_out` names. The manifest is read from the target and checked against its content
/// address.
async fn published_base(
    ctx: &Arc<Context>,
    table: &Arc<TablePolicy>,
    meta: &BucketMeta,
    leave_out: Box<dyn Fn(&crate::model::Record) -> bool + Send>,
) -> Result<Option<(Base, pipeline::BaseRows)>> {
    let Some(key) = meta.manifest_key.clone() else { return Ok(None) };
    let (store, id) = (ctx.store.clone(), meta.id.clone());
    let recorded = blocking(move || store.snapshot()?.latest_manifest(&id)).await?.ok_or_else(|| {
        Error::Internal(format!("bucket {} names archive `{key}` but has no recorded manifest", meta.id))
    })?;
    let backend = ctx.policies.archive_backend(table, &recorded.archive_target())?;
    let manifest = crate::format::reader::read_manifest(backend.as_ref(), &key).await?;
    let generation = recorded.generation;
    let lineage = recorded.amends.as_ref().map(|a| a.lineage.clone()).unwrap_or_default();
    let rows = pipeline::BaseRows::new(backend, key.clone(), manifest, leave_out);
    Ok(Some((Base { generation, manifest_key: key, lineage }, rows)))
}

/// The bucket's manifest over `segments` and the summaries of its rows; over `base`, it
/// records the generation it replaces and the hot rows it added.
fn prepare_manifest(
    ctx: &Arc<Context>,
    table: &Arc<TablePolicy>,
    claimed: Claimed<'_>,
    segments: Vec<SegmentInfo>,
    summaries: pipeline::Summaries,
) -> Result<PreparedManifest> {
    let Claimed { meta, base, answered, .. } = claimed;
    let amends = base.map(|base| Amendment {
        generation: base.generation,
        manifest_key: base.manifest_key.clone(),
        lineage: base.lineage.iter().chain([&base.manifest_key]).cloned().collect(),
        hot_rows: summaries.hot.clone(),
    });
    let summary = summaries.all;
    let id = &meta.id;
    let manifest = Manifest {
        version: MANIFEST_VERSION,
        table: id.table.clone(),
        partition_key: String::from_utf8_lossy(&id.partition_key).into_owned(),
        bucket: meta.descriptor.clone(),
        strategy: format!("{} {}", table.strategy.identity().name, table.strategy.identity().fingerprint()),
        generation: meta.generation,
        format: table.format,
        schema: table.format.schema_with(table.columns()),
        target: table.backend.target().to_string(),
        target_name: table.target_name.clone(),
        policy: meta.plan.clone(),
        summary,
        bytes: segments.iter().map(|s| s.bytes).sum(),
        segments,
        created_at: ctx.clock.now(),
        amends,
        erasures: answered.cloned(),
    };
    manifest.check_consistent()?;
    let bytes = Bytes::from(manifest.to_bytes());
    let prefix =
        keys::manifest_folder(table.layout(), &id.table, &ctx.installation_id, &id.bucket_key, &id.partition_key);
    let key = keys::manifest_key(&prefix, &ctx.writer()?, meta.generation, &sha256_hex(&bytes));
    Ok((manifest, bytes, key))
}

/// Adds `keys` to the durable upload intent of the bucket's generation (invariant 10: a key
/// is recorded before anything is uploaded under it).
async fn record_intent(
    ctx: &Arc<Context>,
    id: &BucketId,
    generation: u64,
    table: &Arc<TablePolicy>,
    owner: &str,
    keys: Vec<String>,
) -> Result<()> {
    let intent = UploadIntent {
        bucket: id.clone(),
        generation,
        target: table.backend.target().to_string(),
        keys,
        recorded_at: ctx.clock.now(),
    };
    let (store, owner, now) = (ctx.store.clone(), owner.to_string(), ctx.clock.now());
    blocking(move || store.record_intent(intent, owner, now)).await
}

/// Creates `key` only if absent, then reads it back and verifies it. An existing object (a
/// retry, or an upload whose acknowledgement was lost) counts only if it is byte-identical;
/// an ambiguous failure is resolved by reading the object. With `seconds`, the upload, the
/// read back and the verification are timed into it.
async fn create_verified(
    backend: &dyn ArchiveBackend,
    key: &str,
    payload: Bytes,
    mut seconds: Option<&mut PhaseSeconds>,
    verify: impl Fn(&[u8]) -> Result<()>,
) -> Result<()> {
    let mut lap = Lap::start();
    let mut upload_error = None;
    match backend.put_create(key, payload.clone()).await {
        Ok(PutOutcome::Created) | Ok(PutOutcome::AlreadyExists) => {}
        Err(e) if e.is_retryable() => {
            tracing::warn!(key, error = %e, "upload outcome uncertain; reading the object back");
            upload_error = Some(e);
        }
        Err(e) => return Err(e),
    }
    if let Some(seconds) = seconds.as_deref_mut() {
        seconds.add(Phase::Upload, lap.lap());
    }
    let read = backend.get(key).await;
    // When the read fails too, the upload's error says more (an outage, a target not yet probed).
    let read = match (read, &upload_error) {
        (Err(read), Some(upload)) => Err(Error::StorageUnavailable(format!(
            "upload of `{key}` failed ({upload}), and so did reading it back ({read})"
        ))),
        (read, _) => read,
    };
    let stored = read?.ok_or_else(|| match upload_error {
        Some(e) => Error::StorageUnavailable(format!("object `{key}` is absent after an upload that failed: {e}")),
        None => Error::StorageUnavailable(format!("object `{key}` is absent after its upload")),
    })?;
    if let Some(seconds) = seconds.as_deref_mut() {
        seconds.add(Phase::ReadBack, lap.lap());
    }
    if stored != payload {
        return Err(Error::Corruption(format!(
            "object `{key}` read back ({} bytes, sha256 {}) differs from what was written ({} bytes, sha256 {}); it is never overwritten",
            stored.len(),
            sha256_hex(&stored),
            payload.len(),
            sha256_hex(&payload)
        )));
    }
    keys::check_content_address(key, &sha256_hex(&stored))?;
    let verified = verify(&stored);
    if let Some(seconds) = seconds {
        seconds.add(Phase::Verify, lap.lap());
    }
    verified
}

async fn cleanup(
    ctx: &Arc<Context>,
    owner: &str,
    id: &BucketId,
    generation: u64,
    heartbeat: &Heartbeat,
    seconds: &mut PhaseSeconds,
) -> Result<u64> {
    heartbeat.check("cleanup").await?;
    let mut lap = Lap::start();
    // Slice by slice, each its own fenced transaction, so appends interleave; the lease is
    // checked (and renewed when due) on the engine's clock before each. The first slice proves
    // the rows are the manifest's before it deletes any (invariant 9).
    let mut deleted = 0;
    loop {
        heartbeat.check("cleanup").await?;
        let (store, bucket, worker, now) = (ctx.store.clone(), id.clone(), owner.to_string(), ctx.clock.now());
        let slice_rows = ctx.settings.cleanup_slice_rows;
        let slice = blocking(move || store.cleanup_slice(&bucket, &worker, generation, now, slice_rows)).await?;
        deleted += slice.deleted;
        if slice.finished {
            break;
        }
    }
    seconds.add(Phase::Cleanup, lap.lap());
    tracing::info!(rows = deleted, "hot rows deleted");
    Ok(deleted)
}

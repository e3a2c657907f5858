//! The read side of an archival: a claimed bucket's rows are read page by page, each page in a
//! read transaction that checks the lease first, and encoded into segments on a blocking
//! thread that runs at most `SEGMENTS_AHEAD` segments ahead of the uploads. Memory holds two
//! pages of rows and a few segments whatever the size of the bucket. The rows' summary
//! (count, key range, checksum) is summed on the way, for the manifest and for the cleanup's
//! proof (which relies on the rows having come in strictly increasing key order), and rides
//! on the last segment, so the manifest is made (and its key recorded in the upload intent)
//! before the last segment is uploaded.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::engine::Context;
use crate::error::{Error, Result};
use crate::format::{EncodedSegment, Format, SEGMENT_ROWS_MAX, encode_segments};
use crate::model::rows::{RowSummary, RowSummer};
use crate::model::{Micros, Record};
use crate::store::schema::BucketId;

/// Rows read per lease-checked read of the claimed bucket: one segment's worth at most.
pub const SNAPSHOT_PAGE_ROWS: usize = SEGMENT_ROWS_MAX;
/// Encoded segments waiting for their upload, at most: encoding the next segment overlaps
/// the upload of this one, and no more than that is held.
pub const SEGMENTS_AHEAD: usize = 1;

/// One encoded segment on its way to its upload; the bucket's last carries the summary of
/// all its rows.
pub struct Encoded {
    pub segment: EncodedSegment,
    pub last: Option<RowSummary>,
}

/// What the read side did: the summary of every row read, and the seconds spent reading and
/// encoding (they overlap the uploads).
pub struct ReadSide {
    pub summary: RowSummary,
    pub snapshot_seconds: f64,
    pub encode_seconds: f64,
}

/// Starts reading and encoding the claimed bucket `id` (as `owner`, `generation`) in `format`.
/// The receiver yields its segments in order; the handle ends with the read side's outcome.
/// Dropping the receiver stops the reader at its next segment.
pub fn start(
    ctx: Arc<Context>,
    id: BucketId,
    owner: String,
    generation: u64,
    format: Format,
) -> (mpsc::Receiver<Encoded>, JoinHandle<Result<ReadSide>>) {
    let (sender, receiver) = mpsc::channel(SEGMENTS_AHEAD);
    let reader = tokio::task::spawn_blocking(move || read_and_encode(&ctx, &id, &owner, generation, format, sender));
    (receiver, reader)
}

fn read_and_encode(
    ctx: &Context,
    id: &BucketId,
    owner: &str,
    generation: u64,
    format: Format,
    sender: mpsc::Sender<Encoded>,
) -> Result<ReadSide> {
    let mut summer = RowSummer::default();
    let (mut snapshot_seconds, mut encode_seconds) = (0.0, 0.0);
    let started = Instant::now();
    let mut page = read_page(ctx, id, owner, generation, None)?;
    crate::failpoints::hit("mid_snapshot")?;
    snapshot_seconds += started.elapsed().as_secs_f64();
    let mut summary = None;
    while !page.is_empty() {
        // The next page is read first, to know whether this one is the last.
        let started = Instant::now();
        let next = match page.last() {
            Some(last) if page.len() == SNAPSHOT_PAGE_ROWS => {
                read_page(ctx, id, owner, generation, Some((last.event_time, &last.sort_key)))?
            }
            _ => Vec::new(),
        };
        snapshot_seconds += started.elapsed().as_secs_f64();
        let started = Instant::now();
        for row in &page {
            summer.push(row);
        }
        let segments = encode_segments(format, &page)?;
        if next.is_empty() {
            // The cleanup's proof takes this summary for the table's rows only if the snapshot
            // read each row once, in key order (`invariants::hot_rows_match_manifest`).
            if !summer.strictly_increasing() {
                return Err(Error::Corruption(format!("the snapshot of bucket {id} read its rows out of key order")));
            }
            summary = Some(std::mem::take(&mut summer).finish());
        }
        encode_seconds += started.elapsed().as_secs_f64();
        let count = segments.len();
        for (i, segment) in segments.into_iter().enumerate() {
            let last = if i + 1 == count { summary.clone() } else { None };
            sender.blocking_send(Encoded { segment, last }).map_err(|_| {
                Error::Internal(format!("the uploads of bucket {id} stopped before its rows were read whole"))
            })?;
        }
        page = next;
    }
    Ok(ReadSide { summary: summary.unwrap_or_else(|| summer.finish()), snapshot_seconds, encode_seconds })
}

/// Up to `SNAPSHOT_PAGE_ROWS` rows of the bucket after `after`, read in one read transaction
/// that first checks the lease is still `owner`'s at `generation` on the engine's clock.
fn read_page(
    ctx: &Context,
    id: &BucketId,
    owner: &str,
    generation: u64,
    after: Option<(Micros, &[u8])>,
) -> Result<Vec<Record>> {
    let read = ctx.store.snapshot()?;
    let meta = read.bucket(id)?.ok_or_else(|| Error::Internal(format!("bucket {id} vanished")))?;
    crate::model::invariants::lease_is_held(
        meta.lease_owner.as_deref(),
        meta.generation,
        meta.lease_expires_at,
        owner,
        generation,
        ctx.clock.now(),
    )
    .map_err(|detail| Error::LeaseLost { bucket: id.display(), owner: owner.to_string(), generation, detail })?;
    read.rows(id, after, SNAPSHOT_PAGE_ROWS)
}

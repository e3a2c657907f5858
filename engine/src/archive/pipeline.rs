//! The read side of an archival: a claimed bucket's rows are read page by page, each page in a
//! read transaction that checks the lease first, and encoded into segments on a blocking
//! thread that runs at most `SEGMENTS_AHEAD` segments ahead of the uploads. Memory holds two
//! pages of rows (each bounded by rows and by bytes) and a few segments whatever the size of
//! the bucket and of its records. The rows' summary
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
use crate::format::{EncodedSegment, Format, SEGMENT_BYTES_MAX, SEGMENT_ROWS_MAX, encode_segments};
use crate::model::rows::{RowSummary, RowSummer};
use crate::model::{Micros, Record};
use crate::store::schema::BucketId;

/// Rows read per lease-checked read of the claimed bucket: one segment's worth at most, in
/// rows and in bytes (`Record::stored_bytes`; the row that crosses the bound is the page's
/// last), so a bucket of 1 MiB bodies is read 8 MiB at a time, not 10,000 rows at a time.
pub const SNAPSHOT_PAGE_ROWS: usize = SEGMENT_ROWS_MAX;
pub const SNAPSHOT_PAGE_BYTES: usize = SEGMENT_BYTES_MAX;
/// Encoded segments waiting for their upload, at most: encoding the next segment overlaps
/// the upload of this one, and no more than that is held.
pub const SEGMENTS_AHEAD: usize = 1;

/// One encoded segment on its way to its upload; the bucket's last carries the summaries of
/// its rows.
pub struct Encoded {
    pub segment: EncodedSegment,
    pub last: Option<Summaries>,
}

/// The summaries a manifest needs: of every row it holds, and of the hot rows among them (the
/// same rows for a first generation; for a next one, the rows merged into the last archive's).
#[derive(Debug, Clone)]
pub struct Summaries {
    pub all: RowSummary,
    pub hot: RowSummary,
}

/// What the read side did: the summaries of the rows read, and the seconds spent reading and
/// encoding (they overlap the uploads).
pub struct ReadSide {
    pub summaries: Summaries,
    pub snapshot_seconds: f64,
    pub encode_seconds: f64,
}

/// Starts reading and encoding the claimed bucket `id` (as `owner`, `generation`) in `format`,
/// merging its hot rows into `base` (the rows of its published archive, in clustering order)
/// when it has one. The receiver yields its segments in order; the handle ends with the read
/// side's outcome. Dropping the receiver stops the reader at its next segment.
pub fn start(
    ctx: Arc<Context>,
    id: BucketId,
    owner: String,
    generation: u64,
    format: Format,
    base: Vec<Record>,
) -> (mpsc::Receiver<Encoded>, JoinHandle<Result<ReadSide>>) {
    let (sender, receiver) = mpsc::channel(SEGMENTS_AHEAD);
    let reader =
        tokio::task::spawn_blocking(move || read_and_encode(&ctx, &id, &owner, generation, format, base, sender));
    (receiver, reader)
}

fn read_and_encode(
    ctx: &Context,
    id: &BucketId,
    owner: &str,
    generation: u64,
    format: Format,
    base: Vec<Record>,
    sender: mpsc::Sender<Encoded>,
) -> Result<ReadSide> {
    let (mut all, mut hot) = (RowSummer::default(), RowSummer::default());
    let mut base = base.into_iter().peekable();
    let (mut snapshot_seconds, mut encode_seconds) = (0.0, 0.0);
    let started = Instant::now();
    let mut page = read_page(ctx, id, owner, generation, None)?;
    crate::failpoints::hit("mid_snapshot")?;
    snapshot_seconds += started.elapsed().as_secs_f64();
    loop {
        // The next page is read first, to know whether this one is the last.
        let started = Instant::now();
        let next = match page.last() {
            Some(last) if page_is_full(&page) => {
                read_page(ctx, id, owner, generation, Some((last.event_time, &last.sort_key)))?
            }
            _ => Vec::new(),
        };
        let last_page = next.is_empty();
        snapshot_seconds += started.elapsed().as_secs_f64();
        let started = Instant::now();
        for row in &page {
            hot.push(row);
        }
        let rows = merge(id, &mut base, page, last_page)?;
        for row in &rows {
            all.push(row);
        }
        let segments = encode_segments(format, &rows)?;
        let summaries = if last_page {
            // The cleanup's proof takes the hot summary for the table's rows only if the
            // snapshot read each row once, in key order (`invariants::hot_rows_match_manifest`);
            // the merged rows must be in order too, each once.
            if !hot.strictly_increasing() || !all.strictly_increasing() {
                return Err(Error::Corruption(format!("the snapshot of bucket {id} read its rows out of key order")));
            }
            Some(Summaries { all: std::mem::take(&mut all).finish(), hot: std::mem::take(&mut hot).finish() })
        } else {
            None
        };
        encode_seconds += started.elapsed().as_secs_f64();
        let count = segments.len();
        for (i, segment) in segments.into_iter().enumerate() {
            let last = if i + 1 == count { summaries.clone() } else { None };
            sender.blocking_send(Encoded { segment, last }).map_err(|_| {
                Error::Internal(format!("the uploads of bucket {id} stopped before its rows were read whole"))
            })?;
        }
        if let Some(summaries) = summaries {
            return Ok(ReadSide { summaries, snapshot_seconds, encode_seconds });
        }
        page = next;
    }
}

/// The rows of one page of hot rows merged, in clustering order, with the rows of the published
/// archive that come before its last row (all that are left, on the last page). A hot row never
/// has the identity of an archived one (an append compares late records with the archive under
/// the generation it commits against), so one that has is refused here rather than archived
/// twice or in place of the other.
fn merge(
    id: &BucketId,
    base: &mut std::iter::Peekable<std::vec::IntoIter<Record>>,
    page: Vec<Record>,
    last_page: bool,
) -> Result<Vec<Record>> {
    if base.peek().is_none() {
        return Ok(page);
    }
    fn key(r: &Record) -> (Micros, &[u8]) {
        (r.event_time, r.sort_key.as_slice())
    }
    let mut out = Vec::with_capacity(page.len());
    for row in page {
        while let Some(archived) = base.next_if(|a| key(a) <= key(&row)) {
            if key(&archived) == key(&row) {
                return Err(Error::Conflict(format!(
                    "bucket {id} holds a hot row (event_time {}, sort_key `{}`) with the identity of an archived one; \
                     the next generation is not made",
                    row.event_time,
                    String::from_utf8_lossy(&row.sort_key)
                )));
            }
            out.push(archived);
        }
        out.push(row);
    }
    if last_page {
        out.extend(base);
    }
    Ok(out)
}

/// Whether a page stopped at a bound (`read_page`), so that more rows may follow it.
fn page_is_full(page: &[Record]) -> bool {
    page.len() == SNAPSHOT_PAGE_ROWS || page.iter().map(Record::stored_bytes).sum::<usize>() >= SNAPSHOT_PAGE_BYTES
}

/// Up to `SNAPSHOT_PAGE_ROWS` rows (and `SNAPSHOT_PAGE_BYTES`) of the bucket after `after`, read in one read transaction
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
    read.rows_within(id, after, SNAPSHOT_PAGE_ROWS, SNAPSHOT_PAGE_BYTES)
}

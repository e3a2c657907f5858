//! The read side of an archival: a claimed bucket's rows are read page by page, each page in a
//! read transaction that checks the lease first, and encoded into segments on a blocking
//! thread that runs at most `SEGMENTS_AHEAD` segments ahead of the uploads. A next generation
//! merges them with the published archive's rows, read one segment at a time (`BaseRows`).
//! Memory holds a page of hot rows, a segment of archived ones (each bounded by rows and by
//! bytes) and a few encoded segments whatever the size of the bucket and of its records. The
//! rows' summary
//! (count, key range, checksum) is summed on the way, for the manifest and for the cleanup's
//! proof (which relies on the rows having come in strictly increasing key order), and rides
//! on the last segment, so the manifest is made (and its key recorded in the upload intent)
//! before the last segment is uploaded.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::engine::Context;
use crate::error::{Error, Result};
use crate::format::manifest::Manifest;
use crate::format::reader::read_segment;
use crate::format::{EncodedSegment, SEGMENT_BYTES_MAX, SEGMENT_ROWS_MAX, encode_segments};
use crate::model::rows::{RowSummary, RowSummer};
use crate::model::{Micros, Record};
use crate::policy::TablePolicy;
use crate::storage::ArchiveBackend;
use crate::store::erasure::ArchivedErased;
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

/// What the read side did: the summaries of the rows read, the archived rows an erasure left
/// out, and the seconds spent reading and encoding (they overlap the uploads).
pub struct ReadSide {
    pub summaries: Summaries,
    pub erased: ArchivedErased,
    pub snapshot_seconds: f64,
    pub encode_seconds: f64,
}

/// The rows of the published archive a next generation starts from, read from its target one
/// segment at a time as the merge reaches them (every hash and row checksum checked), so a
/// late record for a bucket of gigabytes holds one segment of it, not the bucket. Rows an open
/// erasure names are left out and counted.
pub struct BaseRows {
    backend: Arc<dyn ArchiveBackend>,
    manifest_key: String,
    manifest: Manifest,
    next_segment: usize,
    current: VecDeque<Record>,
    leave_out: Box<dyn Fn(&Record) -> bool + Send>,
    read: u64,
    erased: ArchivedErased,
    /// Spent fetching and verifying segments.
    seconds: f64,
}

impl BaseRows {
    /// The rows of the archive `manifest` (read from `backend` at `manifest_key`), without those
    /// `leave_out` names.
    pub fn new(
        backend: Arc<dyn ArchiveBackend>,
        manifest_key: String,
        manifest: Manifest,
        leave_out: Box<dyn Fn(&Record) -> bool + Send>,
    ) -> BaseRows {
        BaseRows {
            backend,
            manifest_key,
            manifest,
            next_segment: 0,
            current: VecDeque::new(),
            leave_out,
            read: 0,
            erased: ArchivedErased::default(),
            seconds: 0.0,
        }
    }

    /// The next row, reading the next segment when the one in memory is used up.
    fn peek(&mut self) -> Result<Option<&Record>> {
        while self.current.is_empty() && self.next_segment < self.manifest.segments.len() {
            let started = Instant::now();
            let segment = &self.manifest.segments[self.next_segment];
            self.next_segment += 1;
            let rows = read_segment(self.backend.as_ref(), &self.manifest_key, self.manifest.format, segment);
            for row in crate::storage::block_on(rows)? {
                self.read += 1;
                if (self.leave_out)(&row) {
                    self.erased.rows += 1;
                    self.erased.body_bytes += row.body.len() as u64;
                } else {
                    self.current.push_back(row);
                }
            }
            self.seconds += started.elapsed().as_secs_f64();
        }
        Ok(self.current.front())
    }

    fn pop(&mut self) -> Option<Record> {
        self.current.pop_front()
    }

    /// Once every row was read: that they were as many as the manifest says; and what an
    /// erasure left out.
    fn finish(&self) -> Result<ArchivedErased> {
        if self.read != self.manifest.summary.rows || self.next_segment < self.manifest.segments.len() {
            return Err(Error::Corruption(format!(
                "archive `{}` read back {} rows where its manifest says {}",
                self.manifest_key, self.read, self.manifest.summary.rows
            )));
        }
        Ok(self.erased)
    }
}

/// Starts reading and encoding the claimed bucket `id` (as `owner`, `generation`) in `table`'s
/// format, with its typed columns,
/// merging its hot rows into `base` (the rows of its published archive, in clustering order)
/// when it has one. The receiver yields its segments in order; the handle ends with the read
/// side's outcome. Dropping the receiver stops the reader at its next segment.
pub fn start(
    ctx: Arc<Context>,
    id: BucketId,
    owner: String,
    generation: u64,
    table: Arc<TablePolicy>,
    base: Option<BaseRows>,
) -> (mpsc::Receiver<Encoded>, JoinHandle<Result<ReadSide>>) {
    let (sender, receiver) = mpsc::channel(SEGMENTS_AHEAD);
    let reader =
        tokio::task::spawn_blocking(move || read_and_encode(&ctx, &id, &owner, generation, &table, base, sender));
    (receiver, reader)
}

/// The claimed bucket's hot rows, page by page, each page lease-checked.
struct HotRows<'a> {
    ctx: &'a Context,
    id: &'a BucketId,
    owner: &'a str,
    generation: u64,
    page: VecDeque<Record>,
    /// No page read yet, or the last one stopped at a bound: more rows may follow.
    more: bool,
    last_key: Option<(Micros, Vec<u8>)>,
    seconds: f64,
}

impl HotRows<'_> {
    fn peek(&mut self) -> Result<Option<&Record>> {
        if self.page.is_empty() && self.more {
            let started = Instant::now();
            let first = self.last_key.is_none();
            let after = self.last_key.as_ref().map(|(t, k)| (*t, k.as_slice()));
            let page = read_page(self.ctx, self.id, self.owner, self.generation, after)?;
            if first {
                crate::failpoints::hit("mid_snapshot")?;
            }
            self.more = page_is_full(&page);
            if let Some(last) = page.last() {
                self.last_key = Some((last.event_time, last.sort_key.clone()));
            }
            self.page = page.into();
            self.seconds += started.elapsed().as_secs_f64();
        }
        Ok(self.page.front())
    }

    fn pop(&mut self) -> Option<Record> {
        self.page.pop_front()
    }
}

/// The identity of a row, its place in the bucket's clustering order.
fn identity(r: &Record) -> (Micros, &[u8]) {
    (r.event_time, r.sort_key.as_slice())
}

fn read_and_encode(
    ctx: &Context,
    id: &BucketId,
    owner: &str,
    generation: u64,
    table: &TablePolicy,
    mut base: Option<BaseRows>,
    sender: mpsc::Sender<Encoded>,
) -> Result<ReadSide> {
    // Without a base the merged rows are the hot rows, so one summer hashes them for both.
    let mut all = base.is_some().then(RowSummer::default);
    let mut hot = RowSummer::default();
    let mut hot_rows =
        HotRows { ctx, id, owner, generation, page: VecDeque::new(), more: true, last_key: None, seconds: 0.0 };
    let mut encode_seconds = 0.0;
    loop {
        // One chunk of the merged rows, bounded like a page. A hot row never has the identity
        // of an archived one (an append compares late records with the archive under the
        // generation it commits against), so one that has is refused rather than archived
        // twice or in place of the other.
        let mut chunk: Vec<Record> = Vec::new();
        let mut chunk_bytes = 0usize;
        while chunk.len() < SNAPSHOT_PAGE_ROWS && chunk_bytes < SNAPSHOT_PAGE_BYTES {
            let next_base = match base.as_mut() {
                Some(base) => base.peek()?,
                None => None,
            };
            let from_base = match (hot_rows.peek()?, next_base) {
                (None, None) => break,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some(h), Some(b)) => match identity(b).cmp(&identity(h)) {
                    std::cmp::Ordering::Less => true,
                    std::cmp::Ordering::Greater => false,
                    std::cmp::Ordering::Equal => {
                        return Err(Error::Conflict(format!(
                            "bucket {id} holds a hot row (event_time {}, sort_key `{}`) with the identity of an \
                             archived one; the next generation is not made",
                            h.event_time,
                            String::from_utf8_lossy(&h.sort_key)
                        )));
                    }
                },
            };
            let row = if from_base {
                base.as_mut().and_then(BaseRows::pop)
            } else {
                let row = hot_rows.pop();
                if let Some(row) = &row {
                    hot.push(row);
                }
                row
            };
            let row = row.expect("a peeked row is there");
            chunk_bytes += row.stored_bytes();
            if let Some(all) = all.as_mut() {
                all.push(&row);
            }
            chunk.push(row);
        }
        // The chunk is the last when nothing is left on either side.
        let last = hot_rows.peek()?.is_none()
            && match base.as_mut() {
                Some(base) => base.peek()?.is_none(),
                None => true,
            };
        let started = Instant::now();
        let segments = encode_segments(table.format, table.columns(), &chunk)?;
        drop(chunk);
        let summaries = if last {
            // The cleanup's proof takes the hot summary for the table's rows only if the
            // snapshot read each row once, in key order (`invariants::hot_rows_match_manifest`);
            // the merged rows must be in order too, each once.
            if !hot.strictly_increasing() || all.as_ref().is_some_and(|all| !all.strictly_increasing()) {
                return Err(Error::Corruption(format!("the snapshot of bucket {id} read its rows out of key order")));
            }
            let hot = std::mem::take(&mut hot).finish();
            let all = match all.take() {
                Some(all) => all.finish(),
                None => hot.clone(),
            };
            Some(Summaries { all, hot })
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
            let (erased, base_seconds) = match &base {
                Some(base) => (base.finish()?, base.seconds),
                None => (ArchivedErased::default(), 0.0),
            };
            let snapshot_seconds = hot_rows.seconds + base_seconds;
            return Ok(ReadSide { summaries, erased, snapshot_seconds, encode_seconds });
        }
    }
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

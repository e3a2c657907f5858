//! Reads across hot and cold: records of a table (or one partition) in `(event_time,
//! sort_key, partition_key)` order, hot buckets from redb and published ones through their
//! manifest with every hash checked, paginated by a cursor that names a position, not an
//! offset, so it stays correct when a bucket is archived between two pages.
//!
//! A page never omits a record silently: the buckets' states and their hot rows are read
//! from one read transaction of the store (a bucket published and cleaned meanwhile is still
//! read hot, as it was at that instant), archives are read from the target their manifest
//! records, and an archive that vanished because an expiry ran meanwhile is reported as an
//! expired range, never skipped.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::engine::Context;
use crate::error::{Error, Result};
use crate::format::manifest::Manifest;
use crate::format::reader::Want;
use crate::model::{BucketState, Micros, Record};
use crate::policy::{PolicySet, TablePolicy};
use crate::store::Snapshot;
use crate::store::schema::{BucketId, BucketMeta};

pub const QUERY_LIMIT_DEFAULT: usize = 1_000;
pub const QUERY_LIMIT_MAX: usize = 100_000;
/// A page holds records of at most this many bytes (`Record::stored_bytes`; always at least
/// one record), whatever its `limit`: a page of 100,000 records of 1 MiB bodies would
/// otherwise be 100 GB in memory and in one answer. A page cut by it has a `next_cursor`.
pub const QUERY_PAGE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Hot rows are read in slices of this many, so a page's reads stop near its byte bound.
const HOT_READ_ROWS: usize = 1_000;

#[derive(Debug, Clone, Default)]
pub struct QueryRequest {
    pub table: String,
    pub partition_key: Option<Vec<u8>>,
    /// Only records of these tenants (`None`: every record). A filter, not an index: the
    /// buckets in range are read as without it.
    pub tenants: Option<std::collections::BTreeSet<String>>,
    /// Inclusive lower bound on event time.
    pub from: Option<Micros>,
    /// Exclusive upper bound on event time.
    pub to: Option<Micros>,
    pub limit: usize,
    pub cursor: Option<String>,
    /// Conditions on the table's typed columns (`carrier=AA`, `dep_delay>=10`), all of which a
    /// record meets (`model::columns::Condition`). Archived segments whose statistics rule a
    /// condition out are not read.
    pub conditions: Vec<String>,
}

/// The position after the last record of a page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Cursor {
    t: Micros,
    s: String,
    p: String,
}

impl Cursor {
    fn encode(&self) -> String {
        hex::encode(serde_json::to_vec(self).expect("cursor serializes"))
    }

    fn decode(text: &str) -> Result<Cursor> {
        hex::decode(text)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| Error::InvalidInput(format!("`{text}` is not a cursor returned by a previous query")))
    }
}

fn order_key(r: &Record) -> (Micros, &[u8], &[u8]) {
    (r.event_time, &r.sort_key, &r.partition_key)
}

#[derive(Debug, Clone, Serialize)]
pub struct QueryPage {
    pub records: Vec<Record>,
    /// Present when more records may follow.
    pub next_cursor: Option<String>,
    /// Buckets in the requested range whose archives expired on purpose: their records are
    /// gone by retention, not missing.
    pub expired: Vec<ExpiredRange>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ExpiredRange {
    pub partition_key: String,
    pub bucket_key: String,
    pub start: Micros,
    pub end: Micros,
    pub expired_at: Micros,
    pub reason: String,
}

impl ExpiredRange {
    /// The line `frostline query` prints for it: expired on purpose, not missing, so it says
    /// when and why.
    pub fn describe(&self) -> String {
        let format = crate::model::time::format_rfc3339;
        format!(
            "expired: partition {} bucket {} [{}, {}) at {}: {}",
            self.partition_key,
            self.bucket_key,
            format(self.start),
            format(self.end),
            format(self.expired_at),
            self.reason
        )
    }
}

pub async fn query(ctx: &Arc<Context>, request: QueryRequest) -> Result<QueryPage> {
    let limit = if request.limit == 0 { QUERY_LIMIT_DEFAULT } else { request.limit };
    if limit > QUERY_LIMIT_MAX {
        return Err(Error::InvalidInput(format!("limit {limit} is above the maximum {QUERY_LIMIT_MAX}")));
    }
    let cursor = request.cursor.as_deref().map(Cursor::decode).transpose()?;
    let policies = ctx.policies.clone();
    let table = policies.table(&request.table)?.clone();
    let conditions = crate::model::columns::parse_conditions(&request.conditions, &table.id, table.columns())?;
    let store = ctx.store.clone();
    let lower = match (&cursor, request.from) {
        (Some(c), Some(f)) => Some(c.t.max(f)),
        (Some(c), None) => Some(c.t),
        (None, f) => f,
    };
    let snapshot = blocking(move || store.snapshot()).await?;
    // The buckets the range reaches, read from an index a chunk at a time, until the page is
    // full: a page costs the buckets it reads, not the table's history.
    let mut buckets = BucketsInRange {
        snapshot: snapshot.clone(),
        table: request.table.clone(),
        partition: request.partition_key.clone(),
        range: (lower, request.to),
        chunk: std::collections::VecDeque::new(),
        next: None,
        exhausted: false,
        order: crate::store::RangeOrder::ByStart,
    };
    let mut expired: Vec<ExpiredRange> = Vec::new();

    let filter = PageFilter {
        from: request.from,
        to: request.to,
        cursor,
        tenants: request.tenants.map(Arc::new),
        conditions: (!conditions.is_empty()).then(|| Arc::new(conditions)),
    };
    // A page needs `limit` records and one more to know that more follow. The page is kept in
    // order lazily: sorted (and cut to `want`) only when it may be full, so a page costs its
    // size plus the rows of the buckets it spans, not their product.
    let want = limit + 1;
    // Each bucket's read keeps a page's bytes and one record more; what the page collects is
    // cut back to its byte bound whenever it passes it (`settle`).
    let want_read = Want { rows: want, bytes: QUERY_PAGE_BYTES_MAX + 1 };
    let mut collected: Vec<Record> = Vec::new();
    let mut collected_bytes = 0usize;
    let mut sorted = true;
    while let Some((bucket, recorded)) = buckets.next().await? {
        if collected.len() >= limit || collected_bytes > QUERY_PAGE_BYTES_MAX {
            collected_bytes = settle(&mut collected, &mut sorted, want);
            let full = collected.len() >= limit || collected_bytes > QUERY_PAGE_BYTES_MAX;
            let later_start = buckets.order.later_buckets_start_at_or_after(&bucket);
            if full && later_start > collected[collected.len().min(limit) - 1].event_time {
                // Every later bucket starts after the last record a full page can hold.
                break;
            }
        }
        if bucket.state == BucketState::Expired {
            expired.push(ExpiredRange::of(&bucket));
            continue;
        }
        // A bucket with rows waiting for its next generation (late records) reads both: the
        // published archive and the hot rows, which never share an identity.
        let pending = bucket.has_published_archive() && !matches!(bucket.state, BucketState::Archived { .. });
        let mut rows = match bucket.state {
            _ if bucket.has_published_archive() => {
                match read_published(&policies, &table, &bucket, recorded, lower, &filter, want_read).await {
                    Ok(rows) => rows,
                    Err(e) => {
                        // An expiry that ran after the snapshot deletes what the snapshot still
                        // calls archived: that range expired on purpose, it is not corrupt.
                        let (store, id) = (ctx.store.clone(), bucket.id.clone());
                        match blocking(move || store.bucket(&id)).await? {
                            Some(now) if now.state == BucketState::Expired => {
                                expired.push(ExpiredRange::of(&now));
                                continue;
                            }
                            _ => return Err(e),
                        }
                    }
                }
            }
            _ => {
                let (snapshot, id, filter) = (snapshot.clone(), bucket.id.clone(), filter.clone());
                blocking(move || hot_rows(&snapshot, &id, lower, &filter, want_read)).await?
            }
        };
        if pending {
            let (snapshot, id, filter) = (snapshot.clone(), bucket.id.clone(), filter.clone());
            let hot = blocking(move || hot_rows(&snapshot, &id, lower, &filter, want_read)).await?;
            rows.extend(hot);
            rows.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
        }
        // A bucket's rows come in clustering order: at most `want` of them can be on the page.
        let before = collected.len();
        for row in rows.into_iter().filter(|r| filter.keeps(r)).take(want) {
            collected_bytes += row.stored_bytes();
            collected.push(row);
        }
        sorted &= before == 0;
    }
    settle(&mut collected, &mut sorted, want);
    // The page is the records in order up to `limit` and the byte bound (at least one); a
    // record beyond either says more follow.
    let mut page_bytes = 0usize;
    let fits = collected
        .iter()
        .take(limit)
        .position(|r| {
            page_bytes += r.stored_bytes();
            page_bytes > QUERY_PAGE_BYTES_MAX
        })
        .map_or(collected.len().min(limit), |over| over.max(1));
    let more = collected.len() > fits;
    collected.truncate(fits);
    if more && let Some(last) = collected.last() {
        // The expired ranges of the part of the range this page covers; the next page reports
        // those after it.
        expired.retain(|e| e.start <= last.event_time);
    }
    let next_cursor = if more || collected.len() == limit {
        collected.last().map(|r| {
            Cursor {
                t: r.event_time,
                s: String::from_utf8_lossy(&r.sort_key).into_owned(),
                p: String::from_utf8_lossy(&r.partition_key).into_owned(),
            }
            .encode()
        })
    } else {
        None
    };
    Ok(QueryPage { records: collected, next_cursor, expired })
}

/// The buckets a query's range reaches, read from the snapshot's index a chunk at a time
/// (`Snapshot::buckets_in_range`), each with the store's copy of its published manifest if it
/// has one, read in the same call: one hand-off to a blocking thread per chunk, not per bucket.
struct BucketsInRange {
    snapshot: Snapshot,
    table: String,
    partition: Option<Vec<u8>>,
    range: (Option<Micros>, Option<Micros>),
    chunk: std::collections::VecDeque<(BucketMeta, Option<Manifest>)>,
    next: Option<Vec<u8>>,
    exhausted: bool,
    /// The order of the last chunk read (the same for every chunk of one range).
    order: crate::store::RangeOrder,
}

impl BucketsInRange {
    async fn next(&mut self) -> Result<Option<(BucketMeta, Option<Manifest>)>> {
        while self.chunk.is_empty() && !self.exhausted {
            let (snapshot, table, partition, range, after) =
                (self.snapshot.clone(), self.table.clone(), self.partition.clone(), self.range, self.next.take());
            let (chunk, manifests) = blocking(move || {
                let chunk = snapshot.buckets_in_range(
                    &table,
                    partition.as_deref(),
                    range,
                    after.as_deref(),
                    QUERY_BUCKETS_PER_READ,
                )?;
                let manifests = chunk
                    .buckets
                    .iter()
                    .map(|b| if b.has_published_archive() { snapshot.latest_manifest(&b.id) } else { Ok(None) })
                    .collect::<Result<Vec<_>>>()?;
                Ok((chunk, manifests))
            })
            .await?;
            self.exhausted = chunk.next.is_none();
            self.next = chunk.next;
            self.order = chunk.order;
            self.chunk.extend(chunk.buckets.into_iter().zip(manifests));
        }
        Ok(self.chunk.pop_front())
    }
}

/// Buckets a query reads from the index at a time: a page that needs few reads few.
const QUERY_BUCKETS_PER_READ: usize = 256;

/// Puts the page in order and drops what cannot be on it: records past `want`, and past the
/// first record that takes the page over its byte bound (kept, to say more follow). Returns
/// the bytes of what is left.
fn settle(collected: &mut Vec<Record>, sorted: &mut bool, want: usize) -> usize {
    if !*sorted {
        collected.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
        *sorted = true;
    }
    collected.truncate(want);
    let mut bytes = 0usize;
    if let Some(over) = collected.iter().position(|r| {
        bytes += r.stored_bytes();
        bytes > QUERY_PAGE_BYTES_MAX
    }) {
        collected.truncate(over + 1);
    }
    bytes
}

/// Which records a page may hold: in the requested range, after the cursor, of the tenants
/// asked for, meeting its conditions.
#[derive(Clone)]
struct PageFilter {
    from: Option<Micros>,
    to: Option<Micros>,
    cursor: Option<Cursor>,
    tenants: Option<Arc<std::collections::BTreeSet<String>>>,
    conditions: Option<Arc<Vec<crate::model::columns::Condition>>>,
}

impl PageFilter {
    fn keeps(&self, r: &Record) -> bool {
        self.from.is_none_or(|f| r.event_time >= f)
            && self.to.is_none_or(|t| r.event_time < t)
            && self.cursor.as_ref().is_none_or(|c| order_key(r) > (c.t, c.s.as_bytes(), c.p.as_bytes()))
            && self.tenants.as_ref().is_none_or(|tenants| r.tenant.as_ref().is_some_and(|t| tenants.contains(t)))
            && self.conditions.as_ref().is_none_or(|conditions| {
                // The body, not a segment's typed column: hot rows and segments written before
                // a column was declared have none, and archival takes each value from the body.
                crate::model::columns::Body::parse(&r.body).is_ok_and(|body| conditions.iter().all(|c| c.holds(&body)))
            })
    }

    /// Whether an archived segment may hold a record the conditions keep (its statistics).
    fn may_hold(&self, segment: &crate::format::manifest::SegmentInfo) -> bool {
        self.conditions
            .as_ref()
            .is_none_or(|conditions| conditions.iter().all(|c| c.may_hold_in(&segment.columns, segment.rows)))
    }
}

/// Up to `want` rows of a hot bucket that the page may hold, in clustering order, read in
/// pages from `lower` on instead of the whole bucket.
fn hot_rows(
    snapshot: &Snapshot,
    id: &BucketId,
    lower: Option<Micros>,
    filter: &PageFilter,
    want: Want,
) -> Result<Vec<Record>> {
    let mut rows: Vec<Record> = Vec::new();
    let mut kept_bytes = 0usize;
    let slice = want.rows.min(HOT_READ_ROWS);
    // `rows` starts after its bound, exclusive: the empty sort key a microsecond before
    // `lower` precedes every row at `lower` (the filter drops the few before it).
    let mut bound: Option<(Micros, Vec<u8>)> = lower.map(|l| (l.saturating_sub(1), Vec::new()));
    loop {
        // A slice is bounded by the bytes the page may still take too: a slice of 1,000 rows of
        // 1 MiB bodies would otherwise be read whole to keep 16 MiB of it.
        let slice_bytes = want.bytes.saturating_sub(kept_bytes).max(1);
        let page = snapshot.rows_within(id, bound.as_ref().map(|(t, s)| (*t, s.as_slice())), slice, slice_bytes)?;
        let full = page.len() == slice || page.iter().map(Record::stored_bytes).sum::<usize>() >= slice_bytes;
        bound = page.last().map(|r| (r.event_time, r.sort_key.clone()));
        let past_end = page.last().is_some_and(|r| filter.to.is_some_and(|t| r.event_time >= t));
        for row in page.into_iter().filter(|r| filter.keeps(r)) {
            if rows.len() >= want.rows || kept_bytes >= want.bytes {
                return Ok(rows);
            }
            kept_bytes += row.stored_bytes();
            rows.push(row);
        }
        if !full || past_end || rows.len() >= want.rows || kept_bytes >= want.bytes {
            return Ok(rows);
        }
    }
}

/// Up to `want` rows of a published bucket that the page may hold, in clustering order, read
/// segment by segment from `lower` on (`read_segments_until`) from the target its manifest (as
/// recorded in the snapshot, the store's copy of the published object) names.
///
/// The copy stands for the object at the bucket's manifest key only when it is of the
/// generation that key names (the newest recorded copy is the published one, and a manifest is
/// written once). Any other copy, or none, means the store broke that rule somewhere (a file
/// edited by hand, a bug): the page then reads the manifest from the target, one GET, rather
/// than another generation's records.
async fn read_published(
    policies: &PolicySet,
    table: &TablePolicy,
    bucket: &BucketMeta,
    recorded: Option<Manifest>,
    lower: Option<Micros>,
    filter: &PageFilter,
    want: Want,
) -> Result<Vec<Record>> {
    let key = bucket
        .manifest_key
        .clone()
        .ok_or_else(|| Error::Internal(format!("bucket {} is archived but names no manifest", bucket.id)))?;
    let named = crate::storage::keys::manifest_origin(&key).map(|(_, generation)| generation);
    let (manifest, backend) = match recorded {
        Some(copy) if Some(copy.generation) == named => {
            let backend = policies.archive_backend(table, &copy.archive_target())?;
            (copy, backend)
        }
        other => {
            tracing::warn!(bucket = %bucket.id, manifest_key = %key,
                recorded_generation = ?other.as_ref().map(|m| m.generation),
                "the store's copy of the published manifest is not the one its key names; reading it from the target");
            // Where a generation is written: the table's target, unless it moved since; then
            // the one the copy names.
            let mut backends = vec![table.backend.clone()];
            if let Some(copy) = &other {
                backends.push(policies.archive_backend(table, &copy.archive_target())?);
            }
            let mut found = None;
            for backend in backends {
                if let Some(bytes) = backend.get(&key).await? {
                    found = Some((crate::format::reader::manifest_from_bytes(&key, &bytes)?, backend));
                    break;
                }
            }
            found.ok_or_else(|| {
                Error::Corruption(format!("published manifest `{key}` of bucket {} is missing", bucket.id))
            })?
        }
    };
    crate::format::reader::read_segments_until(
        backend.as_ref(),
        &key,
        &manifest,
        lower,
        filter.to,
        |segment| filter.may_hold(segment),
        |r| filter.keeps(r),
        want,
    )
    .await
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Error::Internal(format!("blocking task failed: {e}")))?
}

impl ExpiredRange {
    fn of(b: &BucketMeta) -> ExpiredRange {
        ExpiredRange {
            partition_key: String::from_utf8_lossy(&b.id.partition_key).into_owned(),
            bucket_key: b.id.bucket_key.clone(),
            start: b.descriptor.start,
            end: b.descriptor.end,
            expired_at: b.state_since,
            reason: b.plan.as_ref().map(|p| p.reason.clone()).unwrap_or_default(),
        }
    }
}

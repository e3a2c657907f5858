//! Reads: each in its own read transaction (never waiting for the writer), and `Snapshot`,
//! several reads that must agree taken from one.

use std::sync::Arc;

use redb::{ReadableTable, ReadableTableMetadata, WriteTransaction};

use crate::error::{Error, Result};
use crate::model::rows::{RowExtent, RowFields, RowSummary, RowSummer};
use crate::model::{ArchiveTarget, BucketState, Micros, Record, invariants};

use super::protocol::push_published;
use super::schema::{
    BUCKETS, BUCKETS_BY_END, BUCKETS_BY_TIME, BucketId, BucketMeta, DUE, INTENTS, MANIFESTS, META,
    META_INSTALLATION_ID, PLAN_QUEUE, PlanClass, StoredRow, TABLES, TOMBSTONES, TableState, Tombstone, UploadIntent,
    decode_by_end_key, decode_by_time_key, decode_due_key, decode_plan_queue_key, decode_row_key, decode_row_ref,
    decode_value, row_key, rows_table, rows_table_name,
};
use super::{Store, encoding};

impl Store {
    /// A read transaction to read several things from one instant (a query page, the sweep's
    /// reference set): nothing committed after it began is seen through it.
    pub fn snapshot(&self) -> Result<Snapshot> {
        Ok(Snapshot { txn: Arc::new(self.read()?) })
    }

    /// Every bucket of a table (or of one partition), in key order.
    pub fn buckets(&self, table: &str, partition_key: Option<&[u8]>) -> Result<Vec<BucketMeta>> {
        self.snapshot()?.buckets(table, partition_key)
    }

    /// Calls `visit` with every bucket of every table in key order, one at a time, from one
    /// read transaction: summaries over a million buckets without holding them all.
    pub fn visit_buckets(&self, visit: impl FnMut(BucketMeta) -> Result<()>) -> Result<()> {
        self.snapshot()?.visit_buckets(visit)
    }

    /// The hot rows of a bucket in clustering order, from `after` (exclusive) when given.
    pub fn rows(&self, id: &BucketId, after: Option<(Micros, &[u8])>, limit: usize) -> Result<Vec<Record>> {
        self.snapshot()?.rows(id, after, limit)
    }

    /// The newest recorded (that is, published) manifest of a bucket.
    pub fn latest_manifest(&self, id: &BucketId) -> Result<Option<crate::format::manifest::Manifest>> {
        self.snapshot()?.latest_manifest(id)
    }

    pub fn intents(&self) -> Result<Vec<UploadIntent>> {
        self.snapshot()?.intents()
    }

    pub fn tombstones(&self) -> Result<Vec<Tombstone>> {
        self.snapshot()?.tombstones()
    }

    pub fn table_state(&self, table: &str) -> Result<Option<TableState>> {
        let txn = self.read()?;
        let t = txn.open_table(TABLES)?;
        t.get(table)?.map(|v| decode_value(v.value())).transpose()
    }

    /// This data directory's installation id (made at its creation, never changed).
    pub fn installation_id(&self) -> Result<String> {
        let bytes = self
            .meta_value(META_INSTALLATION_ID)?
            .ok_or_else(|| Error::Corruption("the data directory has no installation id".into()))?;
        String::from_utf8(bytes).map_err(|_| Error::Corruption("the installation id is not UTF-8".into()))
    }

    pub fn bucket(&self, id: &BucketId) -> Result<Option<BucketMeta>> {
        let txn = self.read()?;
        let t = txn.open_table(BUCKETS)?;
        t.get(id.encode().as_slice())?.map(|v| decode_value(v.value())).transpose()
    }

    /// Every bucket of every table.
    pub fn all_buckets(&self) -> Result<Vec<BucketMeta>> {
        let txn = self.read()?;
        let t = txn.open_table(BUCKETS)?;
        let mut out = Vec::new();
        for entry in t.iter()? {
            let (_, v) = entry?;
            out.push(decode_value(v.value())?);
        }
        Ok(out)
    }

    /// Buckets whose action is due at or before `now`, soonest first, at most `limit`.
    pub fn due(&self, now: Micros, limit: usize) -> Result<Vec<(Micros, BucketId)>> {
        let txn = self.read()?;
        let t = txn.open_table(DUE)?;
        let end = due_key_bound(now);
        let mut out = Vec::new();
        for entry in t.range(..end.as_slice())?.take(limit) {
            out.push(decode_due_key(entry?.0.value())?);
        }
        Ok(out)
    }

    /// The work a pass takes: buckets due at or before `now`, soonest first, at most `limit`,
    /// without those of the tables in `skip` (paused by a backfill lease: they stay due, and
    /// other tables' work is not held up behind them). A bucket whose next step its
    /// plan decides but whose plan a policy change made stale is passed over and named in
    /// `stale` (for `reconcile_buckets`): claiming it would only queue it for a plan, and after a
    /// change that leaves thousands of them first in the index, a pass that claimed them would
    /// spend its whole scan limit on them and archive nothing. At most `DUE_SCAN_MAX` entries
    /// are read.
    pub fn due_work(&self, now: Micros, limit: usize, skip: &std::collections::HashSet<String>) -> Result<DueWork> {
        let txn = self.read()?;
        let (due, buckets, tables) = (txn.open_table(DUE)?, txn.open_table(BUCKETS)?, txn.open_table(TABLES)?);
        let mut policies: std::collections::HashMap<String, Option<String>> = Default::default();
        let mut work = DueWork::default();
        let end = due_key_bound(now);
        for entry in due.range(..end.as_slice())?.take(DUE_SCAN_MAX) {
            let (k, _) = entry?;
            let (_, id) = decode_due_key(k.value())?;
            if skip.contains(&id.table) {
                continue;
            }
            let Some(meta) =
                buckets.get(id.encode().as_slice())?.map(|v| decode_value::<BucketMeta>(v.value())).transpose()?
            else {
                continue;
            };
            let policy = match policies.get(&id.table) {
                Some(policy) => policy.clone(),
                None => {
                    let state: Option<TableState> =
                        tables.get(id.table.as_str())?.map(|v| decode_value(v.value())).transpose()?;
                    let policy = super::retention_in_force(state);
                    policies.insert(id.table.clone(), policy.clone());
                    policy
                }
            };
            // A table without a definition is left to the claim, which records why it waits.
            let decided_by_plan = matches!(meta.state, BucketState::Hot | BucketState::Archived { hot_deleted: true });
            if decided_by_plan && policy.is_some() && !meta.plan_is_current(policy.as_deref()) {
                work.stale.push(meta.id);
                continue;
            }
            work.ready.push(meta);
            if work.ready.len() == limit {
                break;
            }
        }
        Ok(work)
    }

    /// The earliest due time in the index, for status (archival lag) and scheduling.
    pub fn earliest_due(&self) -> Result<Option<Micros>> {
        let txn = self.read()?;
        let t = txn.open_table(DUE)?;
        let first = t.first()?;
        first.map(|(k, _)| decode_due_key(k.value()).map(|(at, _)| at)).transpose()
    }

    pub fn due_count(&self, now: Micros) -> Result<u64> {
        let txn = self.read()?;
        let t = txn.open_table(DUE)?;
        let end = due_key_bound(now);
        let mut n = 0;
        for entry in t.range(..end.as_slice())? {
            entry?;
            n += 1;
        }
        Ok(n)
    }

    /// Buckets queued for a (new) retention plan, at most `limit`: hot buckets (to archive)
    /// and archived ones (to expire) in turn, each class oldest end first, so any run of the
    /// answer holds both decisions while both wait (`PlanClass`).
    pub fn unplanned(&self, limit: usize) -> Result<Vec<BucketId>> {
        let txn = self.read()?;
        let t = txn.open_table(PLAN_QUEUE)?;
        let mut classes = Vec::with_capacity(PlanClass::ALL.len());
        for class in PlanClass::ALL {
            let (first, next) = ([class as u8], [class as u8 + 1]);
            let mut ids = Vec::new();
            for entry in t.range(first.as_slice()..next.as_slice())?.take(limit) {
                ids.push(decode_plan_queue_key(entry?.0.value())?);
            }
            classes.push(ids.into_iter());
        }
        // `limit` may be `usize::MAX` (every queued bucket): size by what was read.
        let mut out = Vec::with_capacity(classes.iter().map(ExactSizeIterator::len).sum());
        while out.len() < limit {
            let before = out.len();
            out.extend(classes.iter_mut().filter_map(Iterator::next));
            if out.len() == before {
                break;
            }
        }
        out.truncate(limit);
        Ok(out)
    }

    /// How many buckets are queued for a plan (read from the table's length, not counted).
    pub fn unplanned_count(&self) -> Result<u64> {
        let txn = self.read()?;
        Ok(txn.open_table(PLAN_QUEUE)?.len()?)
    }

    /// The published buckets of a table with their newest manifest, in key order. Reads the
    /// manifests, not every bucket: its cost follows what is archived, not what is hot.
    pub fn published(&self, table: &str) -> Result<Vec<(BucketMeta, crate::format::manifest::Manifest)>> {
        self.published_after(table, None, usize::MAX)
    }

    /// `published` a page at a time: at most `limit` buckets, those after the bucket `after`.
    pub fn published_after(
        &self,
        table: &str,
        after: Option<&BucketId>,
        limit: usize,
    ) -> Result<Vec<(BucketMeta, crate::format::manifest::Manifest)>> {
        let txn = self.read()?;
        let manifests = txn.open_table(MANIFESTS)?;
        let buckets = txn.open_table(BUCKETS)?;
        let prefix = BucketId::table_prefix(table, None);
        let end = encoding::prefix_end(&prefix);
        // Past every generation of `after`: its manifests' keys all start with its key.
        let start = after.map_or(prefix, |id| encoding::prefix_end(&id.encode()));
        let mut out: Vec<(BucketMeta, crate::format::manifest::Manifest)> = Vec::new();
        let mut newest: Option<(BucketId, Vec<u8>)> = None;
        // Generations of one bucket are adjacent and ascending: keep the last of each run.
        for entry in manifests.range(start.as_slice()..end.as_slice())? {
            let (k, v) = entry?;
            let id = BucketId::decode(&mut encoding::Reader::new(k.value()))?;
            if let Some((previous, bytes)) = newest.take()
                && previous != id
            {
                push_published(&buckets, previous, &bytes, &mut out)?;
                if out.len() >= limit {
                    return Ok(out);
                }
            }
            newest = Some((id, v.value().to_vec()));
        }
        if let Some((id, bytes)) = newest {
            push_published(&buckets, id, &bytes, &mut out)?;
        }
        Ok(out)
    }

    pub fn meta_value(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let txn = self.read()?;
        let t = txn.open_table(META)?;
        Ok(t.get(name)?.map(|v| v.value().to_vec()))
    }

    pub fn set_meta_value(&self, name: impl Into<String>, value: Vec<u8>) -> Result<()> {
        let name = name.into();
        self.write(move |txn| {
            txn.open_table(META)?.insert(name.as_str(), value.as_slice())?;
            Ok(())
        })
    }

    /// A table's Delta log as the last sync left it (`None` before the first).
    pub fn delta_log_state(&self, table: &str) -> Result<Option<super::schema::DeltaLogState>> {
        let Some(bytes) = self.meta_value(&format!("{}{table}", super::schema::META_DELTA_LOG_PREFIX))? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Corruption(format!("the recorded Delta log state of `{table}` does not parse: {e}")))
    }

    pub fn set_delta_log_state(&self, table: &str, state: &super::schema::DeltaLogState) -> Result<()> {
        let bytes = serde_json::to_vec(state).expect("a Delta log state serializes");
        self.set_meta_value(format!("{}{table}", super::schema::META_DELTA_LOG_PREFIX), bytes)
    }

    /// Every recorded table, in id order.
    pub fn table_states(&self) -> Result<Vec<TableState>> {
        let txn = self.read()?;
        let t = txn.open_table(TABLES)?;
        let mut out = Vec::new();
        for entry in t.iter()? {
            out.push(decode_value(entry?.1.value())?);
        }
        Ok(out)
    }

    pub fn tombstone(&self, id: &BucketId) -> Result<Option<Tombstone>> {
        let txn = self.read()?;
        let t = txn.open_table(TOMBSTONES)?;
        t.get(id.encode().as_slice())?.map(|v| decode_value(v.value())).transpose()
    }
}

pub(super) fn table_buckets(txn: &WriteTransaction, table: &str) -> Result<Vec<BucketMeta>> {
    let t = txn.open_table(BUCKETS)?;
    let prefix = BucketId::table_prefix(table, None);
    let end = encoding::prefix_end(&prefix);
    let mut out = Vec::new();
    for entry in t.range(prefix.as_slice()..end.as_slice())? {
        out.push(decode_value(entry?.1.value())?);
    }
    Ok(out)
}

/// Due-index entries a pass reads at most to find its work (`Store::due_work`).
pub const DUE_SCAN_MAX: usize = 10_000;

/// What a pass found due (`Store::due_work`).
#[derive(Debug, Default)]
pub struct DueWork {
    /// Buckets to work on, soonest due first.
    pub ready: Vec<BucketMeta>,
    /// Due under a plan a policy change made stale: to be queued for a new plan.
    pub stale: Vec<BucketId>,
}

pub(super) fn due_key_bound(now: Micros) -> Vec<u8> {
    // Every due key at `now` starts with the encoded `now`; the bound is just past them.
    let mut bound = Vec::new();
    encoding::put_i64(&mut bound, now);
    encoding::prefix_end(&bound)
}

/// At most `limit` rows of a bucket after `after`, and none once `bytes_max` bytes of them
/// (`Record::stored_bytes`) are read: the row that crosses the bound is the last.
pub(super) fn scan_rows(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    id: &BucketId,
    after: Option<(Micros, &[u8])>,
    limit: usize,
    bytes_max: usize,
) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    let rows = match after {
        Some((t, sort_key)) => {
            let mut start = row_key(t, sort_key);
            start.push(0); // strictly after
            table.range(start.as_slice()..)?
        }
        None => table.range::<&[u8]>(..)?,
    };
    for entry in rows.take(limit) {
        let (k, v) = entry?;
        let row = bucket_row(id, k.value(), v.value())?;
        bytes += row.stored_bytes();
        out.push(row);
        if bytes >= bytes_max {
            break;
        }
    }
    Ok(out)
}

/// A bucket's rows table in a read transaction; `None` when the bucket has no hot rows (its
/// table is made with its first row and dropped by its cleanup).
pub(super) fn open_rows(
    txn: &redb::ReadTransaction,
    id: &BucketId,
) -> Result<Option<redb::ReadOnlyTable<&'static [u8], &'static [u8]>>> {
    match txn.open_table(rows_table(&rows_table_name(id))) {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Invariant 9's proof over a bucket's rows table: its length and end keys against the
/// manifest's summary (`invariants::hot_rows_match_manifest`); debug builds also re-read every
/// row for the checksum, so the tests hold the proof to the full one. `Ok(Err(why))` when the
/// rows differ from the manifest.
pub(super) fn rows_match_manifest(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    id: &BucketId,
    manifest: &RowSummary,
) -> Result<std::result::Result<(), String>> {
    let first = table.first()?.map(|(k, _)| decode_row_key(k.value())).transpose()?;
    let last = table.last()?.map(|(k, _)| decode_row_key(k.value())).transpose()?;
    fn key(k: &Option<(Micros, Vec<u8>)>) -> Option<(Micros, &[u8])> {
        k.as_ref().map(|(t, s)| (*t, s.as_slice()))
    }
    let extent = RowExtent::new(table.len()?, key(&first), key(&last));
    if let Err(why) = invariants::hot_rows_match_manifest(&extent, manifest) {
        return Ok(Err(why));
    }
    if cfg!(debug_assertions) {
        return Ok(invariants::hot_rows_checksum_matches_manifest(&summarize_table(table, id)?, manifest));
    }
    Ok(Ok(()))
}

/// The summary (count, key range, checksum) of a bucket's rows table, read in one scan
/// without holding the rows.
fn summarize_table(table: &impl ReadableTable<&'static [u8], &'static [u8]>, id: &BucketId) -> Result<RowSummary> {
    let mut summer = RowSummer::default();
    for entry in table.iter()? {
        let (k, v) = entry?;
        let (event_time, sort_key) = decode_row_key(k.value())?;
        let row = decode_row_ref(v.value())?;
        summer.push_fields(RowFields {
            partition_key: &id.partition_key,
            event_time,
            sort_key: &sort_key,
            tenant: row.tenant,
            kind: row.kind,
            body: row.body,
        });
    }
    Ok(summer.finish())
}

/// A row of bucket `id` from its key and stored value.
pub(super) fn bucket_row(id: &BucketId, key: &[u8], value: &[u8]) -> Result<Record> {
    let (event_time, sort_key) = decode_row_key(key)?;
    let row: StoredRow = decode_value(value)?;
    Ok(Record {
        partition_key: id.partition_key.clone(),
        event_time,
        sort_key,
        tenant: row.tenant,
        kind: row.kind,
        body: row.body,
    })
}

/// A bucket ordered by its start, then its partition key (a listing's order), then its key.
struct ByStart((Micros, Vec<u8>, String), BucketMeta);

impl PartialEq for ByStart {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for ByStart {}
impl PartialOrd for ByStart {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ByStart {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

/// The buckets of a page's heap, in order.
fn sorted_page(page: std::collections::BinaryHeap<ByStart>) -> Vec<BucketMeta> {
    page.into_sorted_vec().into_iter().map(|b| b.1).collect()
}

/// The order `Snapshot::buckets_in_range` returns buckets in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeOrder {
    /// By start: no later bucket starts before the last one returned.
    ByStart,
    /// By end: no later bucket starts more than `longest` before the last one's end.
    ByEnd { longest: Micros },
}

impl RangeOrder {
    /// The earliest time a bucket after `bucket` (in this order) can start at.
    pub fn later_buckets_start_at_or_after(&self, bucket: &BucketMeta) -> Micros {
        match self {
            RangeOrder::ByStart => bucket.descriptor.start,
            RangeOrder::ByEnd { longest } => bucket.descriptor.end.saturating_sub(*longest),
        }
    }
}

/// A chunk of the buckets a time range reaches (`Snapshot::buckets_in_range`).
#[derive(Debug)]
pub struct BucketChunk {
    pub buckets: Vec<BucketMeta>,
    /// Where the next chunk goes on from (`None`: the range is exhausted).
    pub next: Option<Vec<u8>>,
    pub order: RangeOrder,
}

/// One read transaction, shared by clones: everything read through it is from one instant.
#[derive(Clone)]
pub struct Snapshot {
    txn: Arc<redb::ReadTransaction>,
}

impl Snapshot {
    pub(super) fn txn(&self) -> &redb::ReadTransaction {
        &self.txn
    }

    pub fn bucket(&self, id: &BucketId) -> Result<Option<BucketMeta>> {
        let t = self.txn.open_table(BUCKETS)?;
        t.get(id.encode().as_slice())?.map(|v| decode_value(v.value())).transpose()
    }

    /// The next at most `limit` buckets of `table` (of one partition, or of all) that can hold
    /// records at or after `lower` and before `upper`, read from an index, so a query reads
    /// the buckets its range reaches and not the table's history:
    ///
    /// - one partition's from `buckets_by_time`, in order of start, seeking to the table's
    ///   longest bucket before `lower` (no bucket that ends after `lower` starts earlier);
    /// - a whole table's from `buckets_by_end`, in order of end, from the first that ends after
    ///   `lower` to the first whose end is the longest bucket past `upper` (every later one
    ///   starts at or after `upper`).
    ///
    /// `after` goes on from where the previous chunk ended (`BucketChunk::next`), in the same
    /// snapshot.
    pub fn buckets_in_range(
        &self,
        table: &str,
        partition_key: Option<&[u8]>,
        (lower, upper): (Option<Micros>, Option<Micros>),
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<BucketChunk> {
        use std::ops::Bound;
        let Some(longest) = super::tally::longest_bucket(&self.txn, table)? else {
            return Ok(BucketChunk { buckets: Vec::new(), next: None, order: RangeOrder::ByStart });
        };
        let prefix = BucketId::table_prefix(table, partition_key);
        let at = |time: Micros| {
            let mut key = prefix.clone();
            encoding::put_i64(&mut key, time);
            key
        };
        let (order, index, first, end) = match partition_key {
            Some(_) => (
                RangeOrder::ByStart,
                BUCKETS_BY_TIME,
                lower.map(|l| at(l.saturating_sub(longest))),
                upper.map_or_else(|| encoding::prefix_end(&prefix), |u| at(u.saturating_add(longest))),
            ),
            None => (
                RangeOrder::ByEnd { longest },
                BUCKETS_BY_END,
                lower.map(|l| at(l.saturating_add(1))),
                upper.map_or_else(|| encoding::prefix_end(&prefix), |u| at(u.saturating_add(longest))),
            ),
        };
        let start = match (after, &first) {
            (Some(after), _) => Bound::Excluded(after),
            (None, Some(first)) => Bound::Included(first.as_slice()),
            (None, None) => Bound::Included(prefix.as_slice()),
        };
        let entries = self.txn.open_table(index)?;
        let buckets = self.txn.open_table(BUCKETS)?;
        let mut chunk = BucketChunk { buckets: Vec::new(), next: None, order };
        let mut visited: Option<Vec<u8>> = None;
        for entry in entries.range::<&[u8]>((start, Bound::Excluded(end.as_slice())))? {
            let key = entry?.0;
            if chunk.buckets.len() == limit {
                // More follow: the next chunk goes on after the last entry this one visited.
                chunk.next = visited;
                break;
            }
            visited = Some(key.value().to_vec());
            let id = match order {
                RangeOrder::ByStart => decode_by_time_key(key.value())?.0,
                RangeOrder::ByEnd { .. } => decode_by_end_key(key.value())?,
            };
            let row = buckets
                .get(id.encode().as_slice())?
                .ok_or_else(|| Error::Corruption(format!("a bucket index names bucket {id}, which is not stored")))?;
            let meta: BucketMeta = decode_value(row.value())?;
            let reaches =
                lower.is_none_or(|l| meta.descriptor.end > l) && upper.is_none_or(|u| meta.descriptor.start < u);
            if reaches {
                chunk.buckets.push(meta);
            }
        }
        Ok(chunk)
    }

    /// Every bucket of a table (or of one partition), in key order.
    pub fn buckets(&self, table: &str, partition_key: Option<&[u8]>) -> Result<Vec<BucketMeta>> {
        let t = self.txn.open_table(BUCKETS)?;
        let prefix = BucketId::table_prefix(table, partition_key);
        let end = encoding::prefix_end(&prefix);
        let mut out = Vec::new();
        for entry in t.range(prefix.as_slice()..end.as_slice())? {
            let (_, v) = entry?;
            out.push(decode_value(v.value())?);
        }
        Ok(out)
    }

    /// Up to `limit` buckets of `table` in `state`, by start, then partition and bucket key,
    /// from the tallies' index by state and start (schema 6); whether more are in the state.
    /// Reads the page's buckets and no other.
    pub fn buckets_in_state_by_start(
        &self,
        table: &str,
        state: BucketState,
        limit: usize,
    ) -> Result<(Vec<BucketMeta>, bool)> {
        super::tally::buckets_in_state_by_start(&self.txn, table, state.name(), limit)
    }

    /// `n` distinct ids, chosen at random, of the `count` (its tally) archived buckets of
    /// `table` in `state`, from the index by hash (schema 7): a small sample costs about `n`
    /// seeks, whatever `count` (`tally::sample_ids_in_state`).
    pub fn sample_archived_ids(
        &self,
        table: &str,
        state: BucketState,
        count: u64,
        n: usize,
        rng: &mut impl rand::Rng,
    ) -> Result<Vec<BucketId>> {
        super::tally::sample_ids_in_state(&self.txn, table, state.name(), count, n, rng)
    }

    /// Visits the ids of `table`'s buckets in `state` from the tallies' index by state (keys
    /// only: no bucket's row is read), longest in the state first.
    pub fn visit_ids_in_state(
        &self,
        table: &str,
        state: BucketState,
        visit: impl FnMut(BucketId) -> Result<()>,
    ) -> Result<()> {
        super::tally::visit_ids_in_state(&self.txn, table, state.name(), visit)
    }

    /// How many of `table`'s buckets are in `state`, from the tallies.
    pub fn count_in_state(&self, table: &str, state: BucketState) -> Result<u64> {
        Ok(super::tally::read_table(&self.txn, table)?.states.get(state.name()).map_or(0, |s| s.buckets))
    }

    /// The tables the store holds buckets of (a removed table's too), in name order.
    pub fn tallied_tables(&self) -> Result<Vec<String>> {
        super::tally::tallied_tables(&self.txn)
    }

    /// The first `limit` buckets of `table` by start then partition key, and whether more
    /// follow: walks `buckets_by_end` and stops once every later bucket starts after the last
    /// of the page (its end less the table's longest bucket), so a page reads about as many
    /// buckets as it holds.
    pub fn table_buckets_by_start(&self, table: &str, limit: usize) -> Result<(Vec<BucketMeta>, bool)> {
        let order = |b: &BucketMeta| (b.descriptor.start, b.id.partition_key.clone(), b.id.bucket_key.clone());
        // The smallest `limit` by order seen so far (the largest on top, to drop), and how many
        // were seen: more than `limit` means the page is cut.
        let mut page: std::collections::BinaryHeap<ByStart> = std::collections::BinaryHeap::new();
        let mut seen = 0usize;
        let mut after: Option<Vec<u8>> = None;
        loop {
            let chunk = self.buckets_in_range(table, None, (None, None), after.as_deref(), 1_024)?;
            let RangeOrder::ByEnd { longest } = chunk.order else { break };
            for meta in chunk.buckets {
                let later_start = meta.descriptor.end.saturating_sub(longest);
                if page.len() == limit && page.peek().is_none_or(|last| later_start > last.0.0) {
                    // This bucket and every later one come after the page.
                    return Ok((sorted_page(page), true));
                }
                seen += 1;
                page.push(ByStart(order(&meta), meta));
                if page.len() > limit {
                    page.pop();
                }
            }
            match chunk.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        Ok((sorted_page(page), seen > limit))
    }

    /// The buckets of one partition by start (`BUCKETS_BY_TIME`) that `keep` accepts, at most
    /// `limit`: reads the index up to the last one returned and only the rows of the buckets it
    /// visits, however many the partition holds.
    pub fn partition_buckets_by_start(
        &self,
        table: &str,
        partition_key: &[u8],
        limit: usize,
        keep: impl Fn(&BucketMeta) -> bool,
    ) -> Result<Vec<BucketMeta>> {
        let by_time = self.txn.open_table(BUCKETS_BY_TIME)?;
        let buckets = self.txn.open_table(BUCKETS)?;
        let prefix = BucketId::table_prefix(table, Some(partition_key));
        let end = encoding::prefix_end(&prefix);
        let mut out = Vec::new();
        for entry in by_time.range(prefix.as_slice()..end.as_slice())? {
            if out.len() >= limit {
                break;
            }
            let (id, _) = decode_by_time_key(entry?.0.value())?;
            let row = buckets
                .get(id.encode().as_slice())?
                .ok_or_else(|| Error::Corruption(format!("buckets_by_time names bucket {id}, which is not stored")))?;
            let meta: BucketMeta = decode_value(row.value())?;
            if keep(&meta) {
                out.push(meta);
            }
        }
        Ok(out)
    }

    /// Calls `visit` with every bucket of `table` in key order, one at a time.
    pub fn visit_table_buckets(&self, table: &str, mut visit: impl FnMut(BucketMeta) -> Result<()>) -> Result<()> {
        let t = self.txn.open_table(BUCKETS)?;
        let prefix = BucketId::table_prefix(table, None);
        let end = encoding::prefix_end(&prefix);
        for entry in t.range(prefix.as_slice()..end.as_slice())? {
            let (_, v) = entry?;
            visit(decode_value(v.value())?)?;
        }
        Ok(())
    }

    /// Calls `visit` with every bucket ever claimed for archival (in any state but hot), table
    /// by table and state by state, from the tallies' index by state. No state leads back to
    /// hot, so a hot bucket never had a key written for it nor a manifest: what looks for the
    /// archives' keys and generations reads these alone, at a cost that follows the archive,
    /// not the hot store (the full orphan sweep read 1,000,000 hot rows for 640 archives).
    pub fn visit_claimed_buckets(&self, mut visit: impl FnMut(BucketMeta) -> Result<()>) -> Result<()> {
        let buckets = self.txn.open_table(BUCKETS)?;
        for table in self.tallied_tables()? {
            for state in BucketState::ALL.into_iter().filter(|state| *state != BucketState::Hot) {
                self.visit_ids_in_state(&table, state, |id| {
                    let row = buckets.get(id.encode().as_slice())?.ok_or_else(|| {
                        Error::Corruption(format!("buckets_by_state names bucket {id}, which is not stored"))
                    })?;
                    visit(decode_value(row.value())?)
                })?;
            }
        }
        Ok(())
    }

    /// Calls `visit` with every bucket of every table in key order, one at a time.
    pub fn visit_buckets(&self, mut visit: impl FnMut(BucketMeta) -> Result<()>) -> Result<()> {
        let t = self.txn.open_table(BUCKETS)?;
        for entry in t.iter()? {
            let (_, v) = entry?;
            visit(decode_value(v.value())?)?;
        }
        Ok(())
    }

    /// The hot rows of a bucket in clustering order, from `after` (exclusive) when given.
    pub fn rows(&self, id: &BucketId, after: Option<(Micros, &[u8])>, limit: usize) -> Result<Vec<Record>> {
        self.rows_within(id, after, limit, usize::MAX)
    }

    /// `rows`, stopping too once `bytes_max` bytes of rows (`Record::stored_bytes`) are read:
    /// the row that crosses the bound is the last, so a page holds at least one row. What a
    /// page of a bucket of large bodies is bounded by.
    pub fn rows_within(
        &self,
        id: &BucketId,
        after: Option<(Micros, &[u8])>,
        limit: usize,
        bytes_max: usize,
    ) -> Result<Vec<Record>> {
        match open_rows(&self.txn, id)? {
            Some(table) => scan_rows(&table, id, after, limit, bytes_max),
            None => Ok(Vec::new()),
        }
    }

    /// The newest recorded (that is, published) manifest of a bucket.
    pub fn latest_manifest(&self, id: &BucketId) -> Result<Option<crate::format::manifest::Manifest>> {
        let t = self.txn.open_table(MANIFESTS)?;
        let prefix = id.encode();
        let end = encoding::prefix_end(&prefix);
        let last = t.range(prefix.as_slice()..end.as_slice())?.next_back();
        match last {
            Some(entry) => Ok(Some(decode_value(entry?.1.value())?)),
            None => Ok(None),
        }
    }

    /// Every recorded manifest of a bucket, oldest generation first.
    pub fn manifests_of(&self, id: &BucketId) -> Result<Vec<crate::format::manifest::Manifest>> {
        let t = self.txn.open_table(MANIFESTS)?;
        let prefix = id.encode();
        let end = encoding::prefix_end(&prefix);
        t.range(prefix.as_slice()..end.as_slice())?.map(|entry| decode_value(entry?.1.value())).collect()
    }

    /// For each table and target that holds archives of buckets not yet expired, the buckets
    /// whose newest manifest lives there.
    pub fn archive_targets(&self) -> Result<std::collections::BTreeMap<(String, ArchiveTarget), Vec<String>>> {
        let mut out: std::collections::BTreeMap<(String, ArchiveTarget), Vec<String>> = Default::default();
        let mut archived = Vec::new();
        let open_expiries: std::collections::HashSet<BucketId> =
            self.tombstones()?.into_iter().filter(|t| t.completed_at.is_none()).map(|t| t.bucket).collect();
        self.visit_claimed_buckets(|meta| {
            if meta.has_published_archive() || open_expiries.contains(&meta.id) {
                archived.push(meta.id);
            }
            Ok(())
        })?;
        for id in archived {
            if let Some(manifest) = self.latest_manifest(&id)? {
                out.entry((id.table.clone(), manifest.archive_target())).or_default().push(id.display());
            }
        }
        Ok(out)
    }

    /// Calls `visit` with every recorded manifest, bucket by bucket (in the order of their
    /// ids) and oldest generation first.
    pub fn visit_manifests(
        &self,
        mut visit: impl FnMut(crate::format::manifest::Manifest) -> Result<()>,
    ) -> Result<()> {
        let t = self.txn.open_table(MANIFESTS)?;
        for entry in t.iter()? {
            visit(decode_value(entry?.1.value())?)?;
        }
        Ok(())
    }

    /// Every manifest recorded for a bucket of `table`, with the bucket's id, bucket by bucket
    /// and oldest generation first.
    pub fn visit_table_manifests(
        &self,
        table: &str,
        mut visit: impl FnMut(BucketId, crate::format::manifest::Manifest) -> Result<()>,
    ) -> Result<()> {
        let t = self.txn.open_table(MANIFESTS)?;
        let prefix = BucketId::table_prefix(table, None);
        let end = encoding::prefix_end(&prefix);
        for entry in t.range(prefix.as_slice()..end.as_slice())? {
            let (k, v) = entry?;
            visit(BucketId::decode(&mut encoding::Reader::new(k.value()))?, decode_value(v.value())?)?;
        }
        Ok(())
    }

    pub fn intents(&self) -> Result<Vec<UploadIntent>> {
        let t = self.txn.open_table(INTENTS)?;
        let mut out = Vec::new();
        for entry in t.iter()? {
            out.push(decode_value(entry?.1.value())?);
        }
        Ok(out)
    }

    pub fn tombstones(&self) -> Result<Vec<Tombstone>> {
        let t = self.txn.open_table(TOMBSTONES)?;
        let mut out = Vec::new();
        for entry in t.iter()? {
            out.push(decode_value(entry?.1.value())?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::append::bucket_for_tests;
    use super::super::{index_new_bucket, save_meta};
    use super::*;
    use crate::model::BucketDescriptor;

    /// Saves bucket `meta` with manifests of generations 1 to `generations` recorded.
    fn save_with_manifests(store: &Store, meta: BucketMeta, descriptor: &BucketDescriptor, generations: u64) {
        let descriptor = descriptor.clone();
        store
            .write(move |txn| {
                index_new_bucket(txn, &meta)?;
                save_meta(txn, &meta)?;
                let mut manifests = txn.open_table(MANIFESTS)?;
                let id = &meta.id;
                for generation in 1..=generations {
                    let manifest = crate::format::manifest::Manifest {
                        version: 1,
                        table: id.table.clone(),
                        partition_key: String::from_utf8_lossy(&id.partition_key).into_owned(),
                        bucket: descriptor.clone(),
                        strategy: String::new(),
                        generation,
                        format: Default::default(),
                        schema: String::new(),
                        target: String::new(),
                        target_name: String::new(),
                        policy: None,
                        summary: crate::model::rows::summarize([]),
                        bytes: 0,
                        segments: Vec::new(),
                        created_at: 0,
                        amends: None,
                        erasures: None,
                    };
                    let key = super::super::schema::generation_key(id, generation);
                    manifests.insert(key.as_slice(), super::super::schema::encode_value(&manifest)?.as_slice())?;
                }
                Ok(())
            })
            .unwrap();
    }

    /// `published_after` pages through exactly what `published` returns, each bucket once with
    /// its newest generation, whatever the page size: buckets of one to three generations,
    /// recorded manifests of buckets that are not published between them, and keys with `/`,
    /// `%`, `=`, spaces and non-ASCII.
    #[test]
    fn published_buckets_page_through_once_each_with_their_newest_generation() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("hot.redb")).unwrap();
        let table = "t/a %=é";
        for i in 0..30u64 {
            let id = BucketId {
                table: table.into(),
                partition_key: format!("site {}/é%=", i % 4).into_bytes(),
                bucket_key: format!("day:{i:02}"),
            };
            let descriptor = BucketDescriptor { key: id.bucket_key.clone(), start: 0, end: 1 };
            let mut meta = bucket_for_tests(id.clone(), &descriptor);
            // Every fourth bucket is hot again with its manifests still recorded: never listed.
            if i % 4 != 3 {
                meta.state = BucketState::Archived { hot_deleted: true };
            }
            meta.manifest_key = Some(format!("manifest-{i}"));
            let generations = 1 + i % 3;
            save_with_manifests(&store, meta, &descriptor, generations);
        }
        let every = store.published(table).unwrap();
        let seen = |page: &[(BucketMeta, crate::format::manifest::Manifest)]| -> Vec<(String, u64)> {
            page.iter().map(|(meta, manifest)| (meta.id.display(), manifest.generation)).collect()
        };
        assert_eq!(every.len(), 23, "{:?}", seen(&every));
        assert!(every.iter().all(|(meta, m)| m.generation == 1 + meta.id.bucket_key[4..].parse::<u64>().unwrap() % 3));
        for limit in [1, 2, 5, 22, 23, 100] {
            let (mut paged, mut after) = (Vec::new(), None);
            for pages in 0.. {
                assert!(pages <= every.len(), "pages of {limit} never end");
                let page = store.published_after(table, after.as_ref(), limit).unwrap();
                assert!(page.len() <= limit, "page of {limit}");
                let Some((last, _)) = page.last() else { break };
                after = Some(last.id.clone());
                paged.extend(seen(&page));
            }
            assert_eq!(paged, seen(&every), "pages of {limit}");
        }
    }

    /// After a Delta sync, the copies of replaced manifests go only where the sync saw what is
    /// still true: the bucket's newest manifest is the one it read, and its cleanup released the
    /// archives that one replaced. A newer generation recorded since (whose own cleanup still
    /// needs the copy it replaced), a cleanup not done yet, a bucket unpublished since: each
    /// keeps every copy. Keys with `/`, `%`, `=`, spaces and non-ASCII.
    #[test]
    fn a_sync_drops_replaced_copies_only_of_buckets_it_read_as_they_still_are() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("hot.redb")).unwrap();
        let bucket = |i: u64, state: BucketState| {
            let id = BucketId {
                table: "t/a %=é".into(),
                partition_key: format!("site {i}/é%=").into_bytes(),
                bucket_key: format!("day:{i:02}"),
            };
            let descriptor = BucketDescriptor { key: id.bucket_key.clone(), start: 0, end: 1 };
            let mut meta = bucket_for_tests(id.clone(), &descriptor);
            meta.state = state;
            meta.manifest_key = Some(format!("manifest-{i}"));
            save_with_manifests(&store, meta, &descriptor, 3);
            id
        };
        let cleaned = bucket(0, BucketState::Archived { hot_deleted: true });
        let pending = bucket(1, BucketState::ArchivedPending);
        let not_cleaned = bucket(2, BucketState::Archived { hot_deleted: false });
        let expired = bucket(3, BucketState::Expired);
        let copies = |id: &BucketId| store.snapshot().unwrap().manifests_of(id).unwrap().len();
        let read_as =
            |generation: u64| [&cleaned, &pending, &not_cleaned, &expired].map(|id| (id.clone(), generation)).to_vec();
        // Read when generation 2 was the newest: generation 3 was recorded since.
        assert_eq!(store.drop_replaced_copies_after_sync(read_as(2)).unwrap(), 0);
        assert!([&cleaned, &pending, &not_cleaned, &expired].iter().all(|id| copies(id) == 3));
        let changes_before = store.publication_changes_seq().unwrap();
        assert_eq!(store.drop_replaced_copies_after_sync(read_as(3)).unwrap(), 4);
        assert_eq!((copies(&cleaned), copies(&pending)), (1, 1));
        assert_eq!((copies(&not_cleaned), copies(&expired)), (3, 3), "not cleaned up, or not published");
        let newest = store.snapshot().unwrap().latest_manifest(&cleaned).unwrap().unwrap();
        assert_eq!(newest.generation, 3, "the newest copy stays");
        assert_eq!(store.publication_changes_seq().unwrap(), changes_before + 2, "the next sync reads both again");
        assert_eq!(store.drop_replaced_copies_after_sync(read_as(3)).unwrap(), 0, "nothing more to drop");
    }

    /// The catalogs' reads by day (`published_start_days`, `published_starting_on`) answer
    /// what filtering `published` answers: buckets in every state (a next generation being
    /// archived keeps the last one published; hot, expired or unpublished ones are left out),
    /// several a day, days before 1970, keys with `/`, `%`, `=`, spaces and non-ASCII.
    #[test]
    fn the_published_buckets_of_a_day_are_those_that_start_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("hot.redb")).unwrap();
        let table = "t/a %=é";
        let day = crate::model::time::MICROS_PER_DAY;
        let states = [
            BucketState::Archived { hot_deleted: true },
            BucketState::Archived { hot_deleted: false },
            BucketState::ArchivedPending,
            BucketState::Archiving,
            BucketState::Hot,
            BucketState::Expired,
        ];
        for i in 0..60i64 {
            let id = BucketId {
                table: table.into(),
                partition_key: format!("site {}/é%=", i % 5).into_bytes(),
                bucket_key: format!("b:{i:02}"),
            };
            // Days -3 to 8, a few hours in; the 8th bucket of each six is an hour long.
            let start = (i % 12 - 3) * day + (i % 7) * 3_600_000_000;
            let descriptor = BucketDescriptor { key: id.bucket_key.clone(), start, end: start + day };
            let mut meta = bucket_for_tests(id.clone(), &descriptor);
            meta.state = states[i as usize % states.len()];
            // Every eleventh has no manifest key: nothing published, whatever its state.
            if i % 11 != 10 {
                meta.manifest_key = Some(format!("manifest-{i}"));
            }
            save_with_manifests(&store, meta, &descriptor, 2);
        }
        let every = store.published(table).unwrap();
        let day_of = |start: i64| start.div_euclid(day);
        let days: std::collections::BTreeSet<i64> =
            every.iter().map(|(meta, _)| day_of(meta.descriptor.start)).collect();
        assert!(days.contains(&-3) && days.len() >= 6 && every.len() > 30, "{days:?} {}", every.len());
        assert_eq!(store.published_start_days(table).unwrap(), days);
        for d in -5..11 {
            let mut expected: Vec<(String, u64)> = every
                .iter()
                .filter(|(meta, _)| day_of(meta.descriptor.start) == d)
                .map(|(meta, manifest)| (meta.id.display(), manifest.generation))
                .collect();
            expected.sort();
            let mut found: Vec<(String, u64)> = store
                .published_starting_on(table, d)
                .unwrap()
                .iter()
                .map(|(meta, manifest)| (meta.id.display(), manifest.generation))
                .collect();
            found.sort();
            assert_eq!(found, expected, "day {d}");
            assert!(found.iter().all(|(_, generation)| *generation == 2), "the newest generation");
        }
        assert!(store.published_start_days("t").unwrap().is_empty(), "another table's are its own");
    }

    /// Buckets of any lengths, overlapping within and across partitions (what a strategy
    /// plugin may make): the walks by index answer exactly what sorting and filtering every
    /// bucket answers, for ranges and pages of every size.
    #[test]
    fn the_walks_by_index_answer_what_every_bucket_sorted_answers_for_buckets_of_any_lengths() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("hot.redb")).unwrap();
        // Seeded: the same buckets every run.
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0x5eed);
        let mut next = move |below: u64| rand::Rng::random_range(&mut rng, 0..below);
        let table = "t/a %=é";
        let mut every = Vec::new();
        for i in 0..400 {
            let id = BucketId {
                table: table.into(),
                partition_key: format!("site {}/é%=", next(12)).into_bytes(),
                bucket_key: format!("k{i}"),
            };
            let start = next(10_000) as Micros - 2_000;
            // Mostly short, a few very long.
            let length = if next(20) == 0 { 1 + next(3_000) } else { 1 + next(200) } as Micros;
            let descriptor = BucketDescriptor { key: id.bucket_key.clone(), start, end: start + length };
            let meta = bucket_for_tests(id, &descriptor);
            every.push(meta.clone());
            store.write(move |txn| index_new_bucket(txn, &meta).and_then(|()| save_meta(txn, &meta))).unwrap();
        }
        let snapshot = store.snapshot().unwrap();
        let order = |b: &BucketMeta| (b.descriptor.start, b.id.partition_key.clone(), b.id.bucket_key.clone());
        every.sort_by_key(order);
        let names = |metas: &[BucketMeta]| metas.iter().map(|b| b.id.bucket_key.clone()).collect::<Vec<_>>();

        for limit in [1, 2, 7, 50, 399, 400, 1_000] {
            let (page, more) = snapshot.table_buckets_by_start(table, limit).unwrap();
            assert_eq!(names(&page), names(&every[..limit.min(every.len())]), "page of {limit}");
            assert_eq!(more, every.len() > limit, "page of {limit}");
        }

        let partitions: Vec<Vec<u8>> = (0..12).map(|p| format!("site {p}/é%=").into_bytes()).collect();
        for _ in 0..60 {
            let lower = (next(3) > 0).then(|| next(14_000) as Micros - 3_000);
            let upper = (next(3) > 0).then(|| lower.unwrap_or(-3_000) + next(4_000) as Micros);
            for partition in [None, Some(&partitions[next(12) as usize])] {
                let mut want: Vec<BucketMeta> = every
                    .iter()
                    .filter(|b| partition.is_none_or(|p| &b.id.partition_key == p))
                    .filter(|b| {
                        lower.is_none_or(|l| b.descriptor.end > l) && upper.is_none_or(|u| b.descriptor.start < u)
                    })
                    .cloned()
                    .collect();
                let mut got = Vec::new();
                let mut after: Option<Vec<u8>> = None;
                loop {
                    let chunk = snapshot
                        .buckets_in_range(table, partition.map(Vec::as_slice), (lower, upper), after.as_deref(), 5)
                        .unwrap();
                    assert!(chunk.buckets.len() <= 5);
                    // Within the order the chunk says: the query's early stop relies on it.
                    for pair in chunk.buckets.windows(2) {
                        let bound = chunk.order.later_buckets_start_at_or_after(&pair[0]);
                        assert!(pair[1].descriptor.start >= bound, "{:?} then {:?}", pair[0], pair[1]);
                    }
                    got.extend(chunk.buckets);
                    match chunk.next {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
                got.sort_by_key(order);
                want.sort_by_key(order);
                assert_eq!(names(&got), names(&want), "{partition:?} {lower:?}..{upper:?}");
            }
        }
    }

    /// A listing of one state's buckets pages through the index by state and start (schema 6):
    /// each page is what sorting every bucket of the state by start, partition and bucket key
    /// answers, through states entered, left and entered again, whatever the names.
    #[test]
    fn a_states_page_by_start_is_what_every_bucket_of_the_state_sorted_answers() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("hot.redb")).unwrap();
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0x57a7e);
        let mut next = move |below: u64| rand::Rng::random_range(&mut rng, 0..below);
        let table = "t/a %=é";
        let mut every = Vec::new();
        for i in 0..300 {
            let id = BucketId {
                table: table.into(),
                partition_key: format!("site {}/é%=", next(5)).into_bytes(),
                bucket_key: format!("k{i}"),
            };
            // Starts repeat, so the partition and the bucket key order the ties.
            let start = next(40) as Micros * 1_000 - 10_000;
            let descriptor = BucketDescriptor { key: id.bucket_key.clone(), start, end: start + 1_000 };
            let created = bucket_for_tests(id, &descriptor);
            let mut meta = created.clone();
            store.write(move |txn| index_new_bucket(txn, &created).and_then(|()| save_meta(txn, &created))).unwrap();
            // Two moves: into a state, then (for some) into another, as a lifecycle goes.
            for _ in 0..1 + next(2) {
                meta.state = BucketState::ALL[next(BucketState::ALL.len() as u64) as usize];
                meta.state_since += 1;
                let saved = meta.clone();
                store.write(move |txn| save_meta(txn, &saved)).unwrap();
            }
            every.push(meta);
        }
        assert_eq!(store.tally_differences().unwrap(), Vec::<String>::new());
        let order = |b: &BucketMeta| (b.descriptor.start, b.id.partition_key.clone(), b.id.bucket_key.clone());
        every.sort_by_key(order);
        let names = |metas: &[BucketMeta]| metas.iter().map(|b| b.id.bucket_key.clone()).collect::<Vec<_>>();
        let snapshot = store.snapshot().unwrap();
        for state in BucketState::ALL {
            let want: Vec<BucketMeta> = every.iter().filter(|b| b.state == state).cloned().collect();
            for limit in [0, 1, 7, want.len().saturating_sub(1), want.len(), want.len() + 1] {
                let (page, more) = snapshot.buckets_in_state_by_start(table, state, limit).unwrap();
                assert_eq!(names(&page), names(&want[..limit.min(want.len())]), "{state:?}, page of {limit}");
                assert_eq!(more, want.len() > limit, "{state:?}, page of {limit}");
            }
            let (other, _) = snapshot.buckets_in_state_by_start("t", state, 1_000).unwrap();
            assert!(other.is_empty(), "a table whose name begins the other's lists none of its buckets");
        }
    }

    /// The full orphan sweep, adoption and the reload's target check read the claimed buckets
    /// through the index by state: every bucket in every state but hot, each once, and no hot
    /// one, whatever the tables' names.
    #[test]
    fn the_claimed_buckets_are_every_bucket_but_the_hot_ones_each_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("hot.redb")).unwrap();
        for (t, table) in ["t/a %=é", "t b"].into_iter().enumerate() {
            for i in 0..60 {
                let id = BucketId {
                    table: table.into(),
                    partition_key: format!("site {}/é%=", i % 7).into_bytes(),
                    bucket_key: format!("k{i}"),
                };
                let descriptor = BucketDescriptor { key: id.bucket_key.clone(), start: i * 10, end: i * 10 + 10 };
                let mut meta = bucket_for_tests(id, &descriptor);
                let created = meta.clone();
                store
                    .write(move |txn| index_new_bucket(txn, &created).and_then(|()| save_meta(txn, &created)))
                    .unwrap();
                // Every state, the hot ones most often, as a store has them.
                meta.state = match (i as usize + t) % 9 {
                    n @ 0..=5 => BucketState::ALL[n],
                    _ => BucketState::Hot,
                };
                if meta.state != BucketState::Hot {
                    meta.generation = 1 + (i as u64 % 3);
                    meta.manifest_key = Some(format!("{table}/k{i}/manifest"));
                }
                store.write(move |txn| save_meta(txn, &meta)).unwrap();
            }
        }
        let snapshot = store.snapshot().unwrap();
        let mut claimed = Vec::new();
        snapshot
            .visit_claimed_buckets(|meta| {
                claimed.push((meta.id.display(), meta.state.name()));
                Ok(())
            })
            .unwrap();
        let mut want = Vec::new();
        snapshot
            .visit_buckets(|meta| {
                if meta.state != BucketState::Hot {
                    want.push((meta.id.display(), meta.state.name()));
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(want.len(), 70, "five claimed states of nine, 60 buckets in each of two tables");
        claimed.sort();
        want.sort();
        assert_eq!(claimed, want);
    }
}

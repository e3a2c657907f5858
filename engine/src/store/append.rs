//! Appends: the checks of one atomic batch (identity conflicts, fenced, archived and too-old
//! buckets, the bucket's facts) and the rows and metadata it writes.

use std::collections::HashMap;
use std::sync::mpsc;

use redb::{ReadableTable, WriteTransaction};

use crate::error::{Error, Result};
use crate::model::{BucketDescriptor, BucketState, Micros, Record, lifecycle};

use super::schema::{
    BUCKETS, BUCKETS_BY_END, BUCKETS_BY_TIME, BucketId, BucketMeta, PLAN_QUEUE, PlanClass, RowsTable, Shared,
    StoredRow, by_end_key, by_time_key, decode_by_time_key, decode_value, encode_row, encode_value, plan_queue_key,
    row_key, rows_table, rows_table_name,
};
use super::tally::{Tallies, Tally};
use super::writer::WriteRequest;
use super::{Store, encoding};

impl Store {
    /// Appends one batch atomically; returns after the commit that holds it.
    pub fn append(&self, batch: AppendBatch) -> Result<AppendOutcome> {
        let (reply, answer) = mpsc::sync_channel(1);
        let outcome = self
            .send(WriteRequest::Append { batch, reply })
            .and_then(|()| answer.recv().map_err(|_| Error::Internal("the writer dropped an append".into()))?);
        self.recover_if_poisoned(outcome)
    }
}

/// A record ready to append: its bucket is already known.
#[derive(Debug, Clone)]
pub struct PreparedRow {
    pub descriptor: BucketDescriptor,
    pub record: Record,
}

/// One atomic append: every row is applied or none is.
#[derive(Debug, Clone)]
pub struct AppendBatch {
    pub table: String,
    /// Fingerprint of the table's strategy, stored on new buckets.
    pub strategy: String,
    pub rows: Vec<PreparedRow>,
    /// For each bucket key in the batch, the start of the bucket `writable_buckets` steps after
    /// it: the bucket is too old to write once the partition has a bucket starting there or
    /// later. Absent when the table sets no limit.
    pub writable_horizons: Option<HashMap<String, Micros>>,
    pub writable_buckets: u32,
    pub now: Micros,
    /// For each bucket of the batch that has a published archive, the key of the manifest its
    /// rows were compared with (`Engine::split_archived`): the batch is refused with
    /// `ArchiveChanged` if the bucket has published another generation since, so a late record
    /// can never stand beside an archived record of the same identity.
    pub archives_checked: Vec<(BucketId, String)>,
    /// How long a bucket that takes its first late record waits before its next generation is
    /// due (`Settings::late_grace_us`).
    pub late_grace_us: Micros,
}

/// A bucket's row as an append of no rows at time 0 makes it: what the store's
/// tests start from.
#[cfg(test)]
pub(super) fn bucket_for_tests(id: BucketId, descriptor: &BucketDescriptor) -> BucketMeta {
    let batch = AppendBatch {
        table: id.table.clone(),
        strategy: "s".into(),
        rows: Vec::new(),
        writable_horizons: None,
        writable_buckets: 0,
        now: 0,
        archives_checked: Vec::new(),
        late_grace_us: 0,
    };
    new_bucket_meta(id, descriptor, &batch)
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AppendOutcome {
    pub appended: u64,
    /// Records whose identity and body were already stored: accepted without change.
    pub duplicates: u64,
    /// Identical records whose bucket was archived since they were first appended (a re-run
    /// ingest): compared with the archive and accepted without change.
    pub already_archived: u64,
    /// Values of declared columns that did not fit, stored as null under
    /// `on_mismatch = "null"` (`model::columns`).
    pub column_misses: u64,
}

/// Validates a whole batch against the transaction's state, then applies it. A refused batch
/// leaves no trace: its buckets are checked before any row is written, and a row that
/// conflicts with a stored one undoes the rows written before it.
pub(super) fn apply_batch(txn: &WriteTransaction, batch: &AppendBatch) -> Result<AppendOutcome> {
    let buckets = txn.open_table(BUCKETS)?;
    let by_time = txn.open_table(BUCKETS_BY_TIME)?;

    // Phase 1: check the buckets (state, bounds, the ingest guard), touching nothing. Each
    // row's key and stored value are encoded once, and rows refer to their bucket by index:
    // no per-row clones.
    let mut ids: Vec<BucketId> = Vec::new();
    let mut prefixes: Vec<Vec<u8>> = Vec::new();
    let mut first_rows: Vec<&PreparedRow> = Vec::new();
    let mut id_index: HashMap<(&[u8], &str), usize> = HashMap::new();
    let mut rows: Vec<(usize, Vec<u8>, Vec<u8>, &PreparedRow)> = Vec::with_capacity(batch.rows.len());
    for row in &batch.rows {
        let identity = (row.record.partition_key.as_slice(), row.descriptor.key.as_str());
        let index = *id_index.entry(identity).or_insert_with(|| {
            let id = BucketId {
                table: batch.table.clone(),
                partition_key: row.record.partition_key.clone(),
                bucket_key: row.descriptor.key.clone(),
            };
            prefixes.push(id.encode());
            ids.push(id);
            first_rows.push(row);
            ids.len() - 1
        });
        let key = row_key(row.record.event_time, &row.record.sort_key);
        let value = encode_row(&StoredRowView::of(row))?;
        rows.push((index, key, value, row));
    }
    let mut metas: Vec<(BucketMeta, bool)> = Vec::with_capacity(ids.len());
    // What each bucket's stored row counts as in the status tallies, before this batch.
    let mut tallied: Vec<Option<Tally>> = Vec::with_capacity(ids.len());
    let mut newest_start: HashMap<Vec<u8>, Option<Micros>> = HashMap::new();
    for ((id, prefix), first_row) in ids.iter().zip(&prefixes).zip(&first_rows) {
        let existing: Option<BucketMeta> =
            buckets.get(prefix.as_slice())?.map(|v| decode_value(v.value())).transpose()?;
        let is_new = existing.is_none();
        let meta = existing.unwrap_or_else(|| new_bucket_meta(id.clone(), &first_row.descriptor, batch));
        if meta.state == BucketState::Expired {
            let reason = meta.plan.as_ref().map(|p| p.reason.clone()).unwrap_or_default();
            return Err(Error::BucketExpired { table: id.table.clone(), bucket: id.display(), reason });
        }
        if !meta.state.accepts_appends() {
            return Err(Error::BucketFenced {
                table: id.table.clone(),
                bucket: id.display(),
                state: meta.state.to_string(),
            });
        }
        if meta.state.has_archive() {
            let checked = batch.archives_checked.iter().find(|(checked, _)| checked == id).map(|(_, key)| key);
            if checked != meta.manifest_key.as_ref() {
                return Err(Error::ArchiveChanged { bucket: id.display() });
            }
        }
        tallied.push((!is_new).then(|| Tally::of(&meta)));
        metas.push((meta, is_new));
    }
    for (index, _, _, row) in &rows {
        let stored = &metas[*index].0.descriptor;
        if row.descriptor != *stored {
            return Err(Error::Conflict(format!(
                "bucket {} is stored as [{}, {}) but the strategy now answers [{}, {})",
                ids[*index], stored.start, stored.end, row.descriptor.start, row.descriptor.end
            )));
        }
    }
    if let Some(horizons) = &batch.writable_horizons {
        for (id, (meta, _)) in ids.iter().zip(&metas) {
            let partition = id.partition_key.clone();
            let stored_newest = match newest_start.get(&partition) {
                Some(v) => *v,
                None => {
                    let prefix = BucketId::table_prefix(&id.table, Some(&id.partition_key));
                    let end = encoding::prefix_end(&prefix);
                    let last = by_time.range(prefix.as_slice()..end.as_slice())?.next_back();
                    let v = match last {
                        Some(entry) => Some(decode_by_time_key(entry?.0.value())?.1),
                        None => None,
                    };
                    newest_start.insert(partition.clone(), v);
                    v
                }
            };
            let batch_newest = ids
                .iter()
                .zip(&metas)
                .filter(|(other, _)| other.partition_key == partition)
                .map(|(_, (m, _))| m.descriptor.start)
                .max();
            let newest = stored_newest.max(batch_newest);
            if let (Some(horizon), Some(newest)) = (horizons.get(&id.bucket_key), newest)
                && newest >= *horizon
            {
                return Err(Error::BucketNotWritable {
                    table: id.table.clone(),
                    bucket: id.display(),
                    writable_buckets: batch.writable_buckets,
                });
            }
            let _ = meta;
        }
    }
    // Phase 2: apply. Each row is inserted directly and the value redb hands back tells a new
    // row from a duplicate (the same stored row, accepted unchanged) or a conflict (another
    // body). A conflict, or any error, undoes this batch's rows before it is refused: the
    // transaction may carry other batches, and a refused batch must leave no trace.
    // Each bucket's rows go to its own table (created with the bucket's first row).
    let names: Vec<String> = ids.iter().map(rows_table_name).collect();
    let mut tables = Vec::with_capacity(names.len());
    for name in &names {
        tables.push(txn.open_table(rows_table(name))?);
    }
    let mut inserted: Vec<usize> = Vec::with_capacity(rows.len());
    let applied = insert_rows(&mut tables, &ids, &rows, &mut inserted);
    let duplicates = match applied {
        Ok(duplicates) => duplicates,
        Err(e) => {
            for &i in &inserted {
                let (index, key, _, _) = &rows[i];
                tables[*index].remove(key.as_slice())?;
            }
            drop(tables);
            // A new bucket's table, or a cleaned archive's, was made by this batch alone: it
            // goes with it.
            for (name, (meta, is_new)) in names.iter().zip(&metas) {
                if *is_new || meta.state == (BucketState::Archived { hot_deleted: true }) {
                    txn.delete_table(rows_table(name))?;
                }
            }
            return Err(e);
        }
    };
    drop(tables);
    drop(buckets);
    drop(by_time);
    let mut grew = vec![false; metas.len()];
    for &i in &inserted {
        let (index, _, _, row) = &rows[i];
        grew[*index] = true;
        let (meta, _) = &mut metas[*index];
        meta.tenant.observe(row.record.tenant.as_deref(), meta.row_count);
        meta.kind.observe(row.record.kind.as_deref(), meta.row_count);
        meta.row_count += 1;
        meta.byte_count += row.record.body.len() as u64;
    }
    // A late record reopens a cleaned archive: its next generation is due after the grace,
    // counted from the first late record (those that follow join the same generation).
    let republish_at = batch.now.saturating_add(batch.late_grace_us);
    for ((meta, _), grew) in metas.iter_mut().zip(grew) {
        if grew && meta.state == (BucketState::Archived { hot_deleted: true }) {
            super::record_step(txn, meta, lifecycle::Step::LateRecord { republish_at }, batch.now)?;
        }
    }
    let mut buckets = txn.open_table(BUCKETS)?;
    let mut by_time = txn.open_table(BUCKETS_BY_TIME)?;
    // The indexes every bucket is in (`store::index_new_bucket`, inlined: `by_time` is open).
    let mut by_end = txn.open_table(BUCKETS_BY_END)?;
    let mut plan_queue = txn.open_table(PLAN_QUEUE)?;
    let mut tallies = Tallies::open(txn)?;
    for (((id, prefix), (meta, is_new)), before) in ids.iter().zip(&prefixes).zip(&metas).zip(tallied) {
        buckets.insert(prefix.as_slice(), encode_value(meta)?.as_slice())?;
        tallies.account(id, before, Tally::of(meta))?;
        if *is_new {
            by_time.insert(by_time_key(id, meta.descriptor.start).as_slice(), ())?;
            by_end.insert(by_end_key(id, meta.descriptor.end).as_slice(), ())?;
            plan_queue.insert(plan_queue_key(PlanClass::of(meta.state), id, meta.descriptor.end).as_slice(), ())?;
        } else if meta.plan_basis.as_ref().is_some_and(|b| b.facts != lifecycle::facts_digest(&meta.facts())) {
            // The policy would now see other facts (a new kind or tenant joined, the size
            // crossed a class): the plan is stale and never acts before it is made again.
            plan_queue.insert(plan_queue_key(PlanClass::of(meta.state), id, meta.descriptor.end).as_slice(), ())?;
        }
    }
    Ok(AppendOutcome { appended: inserted.len() as u64, duplicates, ..AppendOutcome::default() })
}

/// Inserts `rows`, noting in `inserted` the index of each row that was new, and returns how
/// many were duplicates. A duplicate's stored bytes are put back as they were (a row written
/// by an older version may encode the same content differently); a conflict puts them back
/// and is returned as the error. The caller undoes `inserted` on any error.
pub(super) fn insert_rows(
    tables: &mut [RowsTable<'_>],
    ids: &[BucketId],
    rows: &[(usize, Vec<u8>, Vec<u8>, &PreparedRow)],
    inserted: &mut Vec<usize>,
) -> Result<u64> {
    let mut duplicates = 0;
    for (i, (index, key, value, row)) in rows.iter().enumerate() {
        let records = &mut tables[*index];
        let previous = records.insert(key.as_slice(), value.as_slice())?.map(|v| v.value().to_vec());
        let Some(previous) = previous else {
            inserted.push(i);
            continue;
        };
        if previous == *value {
            duplicates += 1;
            continue;
        }
        records.insert(key.as_slice(), previous.as_slice())?;
        if decode_value::<StoredRow>(&previous)? != stored_row(row) {
            return Err(identity_conflict(&ids[*index], row));
        }
        duplicates += 1;
    }
    Ok(duplicates)
}

/// A `StoredRow` borrowed from a prepared row: encodes exactly as `StoredRow` does.
#[derive(serde::Serialize)]
pub(super) struct StoredRowView<'a> {
    tenant: Option<&'a str>,
    kind: Option<&'a str>,
    body: &'a str,
}

impl<'a> StoredRowView<'a> {
    fn of(row: &'a PreparedRow) -> Self {
        StoredRowView { tenant: row.record.tenant.as_deref(), kind: row.record.kind.as_deref(), body: &row.record.body }
    }
}

pub(super) fn stored_row(row: &PreparedRow) -> StoredRow {
    StoredRow { tenant: row.record.tenant.clone(), kind: row.record.kind.clone(), body: row.record.body.clone() }
}

pub(super) fn identity_conflict(id: &BucketId, row: &PreparedRow) -> Error {
    Error::Conflict(format!(
        "a record with identity (bucket {id}, event_time {}, sort_key `{}`) already exists with a different body, tenant or kind; \
         nothing in this batch was applied",
        row.record.event_time,
        String::from_utf8_lossy(&row.record.sort_key)
    ))
}

pub(super) fn new_bucket_meta(id: BucketId, descriptor: &BucketDescriptor, batch: &AppendBatch) -> BucketMeta {
    BucketMeta {
        id,
        descriptor: descriptor.clone(),
        strategy: batch.strategy.clone(),
        state: BucketState::Hot,
        generation: 0,
        lease_owner: None,
        lease_expires_at: 0,
        attempts: 0,
        next_retry_at: None,
        last_error: None,
        manifest_key: None,
        row_count: 0,
        byte_count: 0,
        tenant: Shared::Unset,
        kind: Shared::Unset,
        plan: None,
        due_at: None,
        created_at: batch.now,
        state_since: batch.now,
        archived_at: None,
        hot_deleted_at: None,
        held_by: Vec::new(),
        plan_basis: None,
        cleanup_proven: None,
    }
}

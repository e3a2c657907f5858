//! The key layouts of the store's tables (see the table in `schema`): each one built and read
//! back with the order-preserving encoding of `encoding`, so a range of keys is a range of
//! what they name (a bucket's rows by time, a table's buckets by start or by end, the due
//! index by time).

use redb::TableDefinition;

use super::encoding::{self, Reader};
use super::schema::BucketId;
use crate::error::{Error, Result};
use crate::model::{BucketState, Micros};

/// The name of the table that holds one bucket's hot rows: `rows ` and the hex of the bucket's
/// encoded id, so every bucket (any partition key or bucket key bytes) has its own name.
pub fn rows_table_name(bucket: &BucketId) -> String {
    format!("{ROWS_TABLE_PREFIX}{}", hex::encode(bucket.encode()))
}

/// How the name of every bucket's rows table begins (no other table's does).
pub const ROWS_TABLE_PREFIX: &str = "rows ";

/// The definition of a bucket's rows table, named by `rows_table_name`.
pub fn rows_table(name: &str) -> TableDefinition<'_, &'static [u8], &'static [u8]> {
    TableDefinition::new(name)
}

/// A bucket's rows table, open in a write transaction.
pub type RowsTable<'txn> = redb::Table<'txn, &'static [u8], &'static [u8]>;

/// A row's key within its bucket's table: event_time ‖ sort_key, in clustering order.
pub fn row_key(event_time: Micros, sort_key: &[u8]) -> Vec<u8> {
    // The time takes 8 bytes; an escaped sort key at most twice its length and a terminator.
    let mut out = Vec::with_capacity(8 + 2 * sort_key.len() + 2);
    encoding::put_i64(&mut out, event_time);
    encoding::put_bytes(&mut out, sort_key);
    out
}

/// The event time and sort key of a row key (`row_key`).
pub fn decode_row_key(key: &[u8]) -> Result<(Micros, Vec<u8>)> {
    let mut r = Reader::new(key);
    let event_time = r.i64()?;
    let sort_key = r.bytes()?;
    Ok((event_time, sort_key))
}

pub fn by_time_key(bucket: &BucketId, start: Micros) -> Vec<u8> {
    let mut out = BucketId::table_prefix(&bucket.table, Some(&bucket.partition_key));
    encoding::put_i64(&mut out, start);
    encoding::put_bytes(&mut out, bucket.bucket_key.as_bytes());
    out
}

pub fn decode_by_time_key(key: &[u8]) -> Result<(BucketId, Micros)> {
    let mut r = Reader::new(key);
    let table = String::from_utf8(r.bytes()?).map_err(|_| Error::Corruption("table id is not UTF-8".into()))?;
    let partition_key = r.bytes()?;
    let start = r.i64()?;
    let bucket_key = String::from_utf8(r.bytes()?).map_err(|_| Error::Corruption("bucket key is not UTF-8".into()))?;
    Ok((BucketId { table, partition_key, bucket_key }, start))
}

/// Which decision a queued plan is for: when to archive a hot bucket, or when to expire an
/// archived one. The plan queue keeps the two apart (the class is its key's first byte) and a
/// pass takes from both (`Store::unplanned`), so after a policy change a large archive, whose
/// buckets are the oldest, does not hold back the planning of the hot buckets behind it, and
/// a stream of new hot buckets does not hold back expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanClass {
    Archive = 0,
    Expire = 1,
}

impl PlanClass {
    pub const ALL: [PlanClass; 2] = [PlanClass::Archive, PlanClass::Expire];

    /// The decision a bucket in `state` waits for.
    pub fn of(state: BucketState) -> PlanClass {
        if state == BucketState::Hot { PlanClass::Archive } else { PlanClass::Expire }
    }
}

/// A bucket's key in `PLAN_QUEUE`: its class, its end, then its id (the end never changes, so
/// the key is known from the bucket and its class alone). Within a class the oldest end comes
/// first: the end is what every age-based rule counts from.
pub fn plan_queue_key(class: PlanClass, bucket: &BucketId, end: Micros) -> Vec<u8> {
    let mut out = vec![class as u8];
    out.extend_from_slice(&due_key(end, bucket));
    out
}

/// The bucket a `PLAN_QUEUE` key names.
pub fn decode_plan_queue_key(key: &[u8]) -> Result<BucketId> {
    let rest = key.get(1..).ok_or_else(|| Error::Corruption("empty plan queue key".into()))?;
    decode_due_key(rest).map(|(_, id)| id)
}

/// A bucket's key in `BUCKETS_BY_END`: its table, its end, then its id.
pub fn by_end_key(bucket: &BucketId, end: Micros) -> Vec<u8> {
    let mut out = BucketId::table_prefix(&bucket.table, None);
    encoding::put_i64(&mut out, end);
    out.extend_from_slice(&bucket.encode());
    out
}

/// The bucket a `BUCKETS_BY_END` key names.
pub fn decode_by_end_key(key: &[u8]) -> Result<BucketId> {
    let mut r = Reader::new(key);
    r.bytes()?;
    r.i64()?;
    BucketId::decode(&mut r)
}

pub fn due_key(due_at: Micros, bucket: &BucketId) -> Vec<u8> {
    let mut out = Vec::new();
    encoding::put_i64(&mut out, due_at);
    out.extend_from_slice(&bucket.encode());
    out
}

pub fn decode_due_key(key: &[u8]) -> Result<(Micros, BucketId)> {
    let mut r = Reader::new(key);
    let due_at = r.i64()?;
    Ok((due_at, BucketId::decode(&mut r)?))
}

pub fn generation_key(bucket: &BucketId, generation: u64) -> Vec<u8> {
    let mut out = bucket.encode();
    encoding::put_u64(&mut out, generation);
    out
}

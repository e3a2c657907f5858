//! The status tallies (schema 4, 5 for the longest bucket, 6 for each state's buckets by start, 7 for the archived buckets by hash): what `status` shows of the buckets, kept in the transaction
//! of every change of a bucket's row, so a status costs the same on 1,000 buckets and on
//! 1,000,000 instead of reading every bucket.
//!
//! - `STATE_TALLIES`: per table and state, how many buckets and how many rows;
//! - `BUCKETS_BY_STATE`: each bucket by table, state and the time it entered that state, so
//!   the longest-standing bucket of a state is the first key of its range;
//! - `HELD_TALLIES`: per table, the archived buckets whose expiry a hold parks;
//! - `DEFERRED_BUCKETS` and `LEASED_BUCKETS`: the buckets a status lists one by one (those
//!   whose step failed or was refused, and those under a lease), few on a healthy store;
//! - `LONGEST_BUCKETS` (schema 5): per table, the length of its longest bucket, which queries
//!   seek by (`Snapshot::buckets_in_range`);
//! - `BUCKETS_BY_STATE_AND_START` (schema 6): each bucket by table, state and start, the
//!   order a listing of one state's buckets pages in (`buckets_in_state_by_start`);
//! - `ARCHIVED_BY_HASH` (schema 7): each archived bucket by table, state and a hash of its id,
//!   where a verification's random sample seeks (`sample_ids_in_state`).
//!
//! Every write of a bucket's row goes through `save_meta` or the append's batch, and both
//! call `Tallies::account` with the row before and after; `Store::check_tallies` recomputes
//! everything from the rows, for the tests and the simulation.

use std::collections::BTreeMap;

use redb::{ReadableTable, ReadableTableMetadata, Table, WriteTransaction};

use super::encoding;
use super::schema::{
    ARCHIVED_BY_HASH, BUCKETS, BUCKETS_BY_STATE, BUCKETS_BY_STATE_AND_START, BucketId, BucketMeta, DEFERRED_BUCKETS,
    HELD_TALLIES, LEASED_BUCKETS, LONGEST_BUCKETS, META, META_SCHEMA_VERSION, META_TALLY_CURSOR, STATE_TALLIES,
    decode_value,
};
use crate::error::{Error, Result};
use crate::model::{BucketState, Micros};

/// Buckets tallied per transaction by the upgrades to schemas 4 to 7.
pub const TALLY_BUCKETS_PER_TRANSACTION: usize = 50_000;

/// What the tallies count of one bucket's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tally {
    state: &'static str,
    since: Micros,
    rows: u64,
    held: bool,
    deferred: bool,
    leased: bool,
    /// The bucket's length (end - start).
    span: Micros,
    start: Micros,
}

impl Tally {
    pub(super) fn of(meta: &BucketMeta) -> Self {
        Tally {
            state: meta.state.name(),
            since: meta.state_since,
            rows: meta.row_count,
            held: !meta.held_by.is_empty(),
            // What `status` lists as a deferral: a step that failed and will be retried, or a
            // plan that could not be made.
            deferred: meta.attempts > 0 || (meta.plan.is_none() && meta.last_error.is_some()),
            leased: meta.lease_owner.is_some(),
            span: meta.descriptor.end.saturating_sub(meta.descriptor.start),
            start: meta.descriptor.start,
        }
    }
}

/// The tally tables, open in one write transaction.
pub(super) struct Tallies<'txn> {
    states: Table<'txn, (&'static str, &'static str), (u64, u64)>,
    by_state: Table<'txn, &'static [u8], ()>,
    by_state_and_start: Table<'txn, &'static [u8], ()>,
    archived_by_hash: Table<'txn, &'static [u8], ()>,
    held: Table<'txn, &'static str, u64>,
    deferred: Table<'txn, &'static [u8], ()>,
    leased: Table<'txn, &'static [u8], ()>,
    longest: Table<'txn, &'static str, i64>,
}

impl<'txn> Tallies<'txn> {
    pub(super) fn open(txn: &'txn WriteTransaction) -> Result<Self> {
        Ok(Tallies {
            states: txn.open_table(STATE_TALLIES)?,
            by_state: txn.open_table(BUCKETS_BY_STATE)?,
            by_state_and_start: txn.open_table(BUCKETS_BY_STATE_AND_START)?,
            archived_by_hash: txn.open_table(ARCHIVED_BY_HASH)?,
            held: txn.open_table(HELD_TALLIES)?,
            deferred: txn.open_table(DEFERRED_BUCKETS)?,
            leased: txn.open_table(LEASED_BUCKETS)?,
            longest: txn.open_table(LONGEST_BUCKETS)?,
        })
    }

    /// Moves bucket `id` from what its row counted as (`before`, `None` for a new bucket) to
    /// what it counts as now.
    pub(super) fn account(&mut self, id: &BucketId, before: Option<Tally>, after: Tally) -> Result<()> {
        if before == Some(after) {
            return Ok(());
        }
        let table = id.table.as_str();
        match before {
            Some(b) if b.state == after.state => {
                self.add_state(table, after.state, 0, after.rows as i128 - b.rows as i128)?;
            }
            _ => {
                if let Some(b) = before {
                    self.add_state(table, b.state, -1, -(b.rows as i128))?;
                }
                self.add_state(table, after.state, 1, after.rows as i128)?;
            }
        }
        let encoded = id.encode();
        if before.map(|b| (b.state, b.since)) != Some((after.state, after.since)) {
            if let Some(b) = before {
                self.by_state.remove(by_state_key(table, b.state, b.since, &encoded).as_slice())?;
            }
            self.by_state.insert(by_state_key(table, after.state, after.since, &encoded).as_slice(), ())?;
        }
        if before.map(|b| (b.state, b.start)) != Some((after.state, after.start)) {
            if let Some(b) = before {
                self.by_state_and_start.remove(by_state_key(table, b.state, b.start, &encoded).as_slice())?;
            }
            self.by_state_and_start.insert(by_state_key(table, after.state, after.start, &encoded).as_slice(), ())?;
        }
        let hashed = |tally: Tally| is_sampled(tally.state).then_some(tally.state);
        if before.and_then(hashed) != hashed(after) {
            if let Some(state) = before.and_then(hashed) {
                self.archived_by_hash.remove(by_hash_key(table, state, &encoded).as_slice())?;
            }
            if let Some(state) = hashed(after) {
                self.archived_by_hash.insert(by_hash_key(table, state, &encoded).as_slice(), ())?;
            }
        }
        let held_before = before.is_some_and(|b| b.held);
        if held_before != after.held {
            let count = self.held.get(table)?.map(|v| v.value()).unwrap_or(0);
            let count = signed_add(count, if after.held { 1 } else { -1 }, table, "held buckets");
            self.held.insert(table, count)?;
        }
        set_member(&mut self.deferred, &encoded, before.is_some_and(|b| b.deferred), after.deferred)?;
        set_member(&mut self.leased, &encoded, before.is_some_and(|b| b.leased), after.leased)?;
        // Only ever lengthened: a shorter bucket, or one gone, leaves a bound that still holds.
        if before.map(|b| b.span) != Some(after.span)
            && self.longest.get(table)?.is_none_or(|longest| longest.value() < after.span)
        {
            self.longest.insert(table, after.span)?;
        }
        Ok(())
    }

    fn add_state(&mut self, table: &str, state: &str, buckets: i64, rows: i128) -> Result<()> {
        let (had_buckets, had_rows) = self.states.get((table, state))?.map(|v| v.value()).unwrap_or((0, 0));
        let buckets = signed_add(had_buckets, buckets as i128, table, state);
        let rows = signed_add(had_rows, rows, table, state);
        if buckets == 0 {
            self.states.remove((table, state))?;
        } else {
            self.states.insert((table, state), (buckets, rows))?;
        }
        Ok(())
    }
}

fn set_member(set: &mut Table<'_, &'static [u8], ()>, id: &[u8], was: bool, is: bool) -> Result<()> {
    match (was, is) {
        (false, true) => {
            set.insert(id, ())?;
        }
        (true, false) => {
            set.remove(id)?;
        }
        _ => {}
    }
    Ok(())
}

/// A count that would fall below zero means the tallies missed a change (a bug): the status
/// would be wrong, but refusing the write would stop archival for a figure, so it stops at
/// zero and says so (a debug build, which the tests and the simulation run, stops there).
fn signed_add(count: u64, delta: i128, table: &str, tally: &str) -> u64 {
    u64::try_from(count as i128 + delta).unwrap_or_else(|_| {
        debug_assert!(false, "the status tally of table {table:?}, {tally} falls below zero");
        tracing::error!(table, tally, "a status tally fell below zero; the status undercounts");
        0
    })
}

/// A bucket's key in `BUCKETS_BY_STATE` (`time`: when it entered its state) and in
/// `BUCKETS_BY_STATE_AND_START` (`time`: its start): its table, its state, the time, then its
/// encoded id.
fn by_state_key(table: &str, state: &str, time: Micros, encoded_id: &[u8]) -> Vec<u8> {
    let mut out = state_prefix(table, state);
    encoding::put_i64(&mut out, time);
    out.extend_from_slice(encoded_id);
    out
}

/// The states `ARCHIVED_BY_HASH` indexes: those of a published archive, which a verification
/// samples.
pub(super) const SAMPLED_STATES: [&str; 2] =
    [BucketState::Archived { hot_deleted: true }.name(), BucketState::Archived { hot_deleted: false }.name()];

fn is_sampled(state: &str) -> bool {
    SAMPLED_STATES.contains(&state)
}

/// A bucket's key in `ARCHIVED_BY_HASH`: its table, its state, the first 8 bytes of the
/// SHA-256 of its encoded id, then the encoded id.
fn by_hash_key(table: &str, state: &str, encoded_id: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    let mut out = state_prefix(table, state);
    out.extend_from_slice(&sha2::Sha256::digest(encoded_id)[..8]);
    out.extend_from_slice(encoded_id);
    out
}

fn state_prefix(table: &str, state: &str) -> Vec<u8> {
    let mut out = BucketId::table_prefix(table, None);
    encoding::put_bytes(&mut out, state.as_bytes());
    out
}

/// One state of a table as the tallies hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateTally {
    pub buckets: u64,
    pub rows: u64,
    /// When the longest-standing bucket entered the state.
    pub oldest_since: Micros,
}

/// A table's tallies: its buckets per state, and how many its holds park.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableTally {
    pub states: BTreeMap<String, StateTally>,
    pub held: u64,
}

/// Reads one table's tallies in a read transaction.
pub(super) fn read_table(txn: &redb::ReadTransaction, table: &str) -> Result<TableTally> {
    let states = txn.open_table(STATE_TALLIES)?;
    let by_state = txn.open_table(BUCKETS_BY_STATE)?;
    let mut out = TableTally {
        held: txn.open_table(HELD_TALLIES)?.get(table)?.map(|v| v.value()).unwrap_or(0),
        ..TableTally::default()
    };
    for entry in states.range((table, "")..)? {
        let (key, value) = entry?;
        let (entry_table, state) = key.value();
        if entry_table != table {
            break;
        }
        let (buckets, rows) = value.value();
        let prefix = state_prefix(table, state);
        let end = encoding::prefix_end(&prefix);
        let oldest = by_state.range(prefix.as_slice()..end.as_slice())?.next().transpose()?;
        let oldest_since = match oldest {
            Some((key, _)) => {
                let mut reader = encoding::Reader::new(&key.value()[prefix.len()..]);
                reader.i64()?
            }
            None => {
                return Err(Error::Corruption(format!(
                    "table {table:?} tallies {buckets} {state} buckets but indexes none"
                )));
            }
        };
        out.states.insert(state.to_string(), StateTally { buckets, rows, oldest_since });
    }
    Ok(out)
}

/// Up to `limit` buckets of `table` in state `state` (its name), by start, then partition and
/// bucket key, from `BUCKETS_BY_STATE_AND_START`; whether more are in the state. Reads the
/// page's rows and one key more.
pub(super) fn buckets_in_state_by_start(
    txn: &redb::ReadTransaction,
    table: &str,
    state: &str,
    limit: usize,
) -> Result<(Vec<BucketMeta>, bool)> {
    let (by_start, buckets) = (txn.open_table(BUCKETS_BY_STATE_AND_START)?, txn.open_table(BUCKETS)?);
    let prefix = state_prefix(table, state);
    let end = encoding::prefix_end(&prefix);
    let mut out = Vec::new();
    for entry in by_start.range(prefix.as_slice()..end.as_slice())? {
        if out.len() == limit {
            return Ok((out, true));
        }
        let (key, _) = entry?;
        out.push(indexed_bucket(&buckets, &key.value()[prefix.len() + 8..])?);
    }
    Ok((out, false))
}

/// The row of the bucket (its encoded id) that `BUCKETS_BY_STATE_AND_START` names; its absence
/// is corruption.
pub(super) fn indexed_bucket(
    buckets: &impl ReadableTable<&'static [u8], &'static [u8]>,
    encoded: &[u8],
) -> Result<BucketMeta> {
    let row = buckets.get(encoded)?.ok_or_else(|| {
        Error::Corruption(format!(
            "buckets_by_state_and_start names bucket {}, which is not stored",
            hex::encode(encoded)
        ))
    })?;
    decode_value(row.value())
}

/// Visits, by start, the starts and encoded ids of `table`'s buckets in state `state` (its
/// name) that start in `from..to`, from `BUCKETS_BY_STATE_AND_START`: keys only. `visit`
/// returns where to go on from: `None` to stop, or a start to seek to (past the days it has
/// seen, say).
pub(super) fn visit_starts_in_state(
    txn: &redb::ReadTransaction,
    table: &str,
    state: &str,
    from: Micros,
    to: Micros,
    mut visit: impl FnMut(Micros, &[u8]) -> Result<Option<Micros>>,
) -> Result<()> {
    let by_start = txn.open_table(BUCKETS_BY_STATE_AND_START)?;
    let prefix_len = state_prefix(table, state).len();
    let end = by_state_key(table, state, to, &[]);
    let mut next = from;
    'seek: while next < to {
        let start = by_state_key(table, state, next, &[]);
        for entry in by_start.range(start.as_slice()..end.as_slice())? {
            let (key, _) = entry?;
            let mut reader = encoding::Reader::new(&key.value()[prefix_len..]);
            let time = reader.i64()?;
            match visit(time, &key.value()[prefix_len + 8..])? {
                None => return Ok(()),
                Some(seek) if seek > time => {
                    next = seek;
                    continue 'seek;
                }
                Some(_) => {}
            }
        }
        break;
    }
    Ok(())
}

/// Visits the ids of `table`'s buckets in state `state` (its name) from `BUCKETS_BY_STATE`,
/// longest in the state first: keys only, no bucket's row is read.
pub(super) fn visit_ids_in_state(
    txn: &redb::ReadTransaction,
    table: &str,
    state: &str,
    mut visit: impl FnMut(BucketId) -> Result<()>,
) -> Result<()> {
    let by_state = txn.open_table(BUCKETS_BY_STATE)?;
    let prefix = state_prefix(table, state);
    let end = encoding::prefix_end(&prefix);
    for entry in by_state.range(prefix.as_slice()..end.as_slice())? {
        let (key, _) = entry?;
        let mut reader = encoding::Reader::new(&key.value()[prefix.len()..]);
        reader.i64()?;
        visit(BucketId::decode(&mut reader)?)?;
    }
    Ok(())
}

/// Keys a sample steps past a random point of `ARCHIVED_BY_HASH` before it takes one (a
/// random number below this). One random point would choose each bucket with a weight of
/// the gap between its hash and the one before, which is fixed and varies a hundredfold
/// between buckets; the mean of up to this many gaps varies far less, so every bucket is
/// checked about as often over repeated samples.
const SAMPLE_STEPS: u64 = 32;

/// `n` distinct ids, chosen at random, of the `count` buckets of `table` in state `state` (a
/// name of `SAMPLED_STATES`; `count` from its tally). A small sample seeks random points of
/// `ARCHIVED_BY_HASH` (about `n` seeks and `SAMPLE_STEPS` keys each, whatever `count`); one
/// of more than a quarter of the buckets walks the state's keys and picks exact positions.
/// Fewer than `n` if the index holds fewer.
pub(super) fn sample_ids_in_state(
    txn: &redb::ReadTransaction,
    table: &str,
    state: &str,
    count: u64,
    n: usize,
    rng: &mut impl rand::Rng,
) -> Result<Vec<BucketId>> {
    debug_assert!(is_sampled(state), "{state} buckets are not indexed by hash");
    let index = txn.open_table(ARCHIVED_BY_HASH)?;
    let prefix = state_prefix(table, state);
    let end = encoding::prefix_end(&prefix);
    let id_of = |key: &[u8]| BucketId::decode(&mut encoding::Reader::new(&key[prefix.len() + 8..]));
    let mut out = Vec::with_capacity(n.min(count as usize));
    if n as u64 >= count / 4 {
        let mut positions = rand::seq::index::sample(rng, count as usize, n.min(count as usize)).into_vec();
        positions.sort_unstable();
        let mut positions = positions.into_iter().peekable();
        for (position, entry) in index.range(prefix.as_slice()..end.as_slice())?.enumerate() {
            let Some(&next) = positions.peek() else { break };
            let (key, _) = entry?;
            if next == position {
                out.push(id_of(key.value())?);
                positions.next();
            }
        }
        return Ok(out);
    }
    let mut taken = std::collections::HashSet::with_capacity(n);
    while out.len() < n {
        let mut point = prefix.clone();
        point.extend_from_slice(&rng.random::<u64>().to_be_bytes());
        // Fewer steps than keys left untaken, so a step never runs past them all.
        let steps = rng.random_range(0..SAMPLE_STEPS.min(count - n as u64)) as usize;
        // From the point to the end of the state's keys, then around from their start.
        let keys = index
            .range(point.as_slice()..end.as_slice())?
            .chain(index.range(prefix.as_slice()..point.as_slice())?)
            .skip(steps);
        let mut found = false;
        for entry in keys {
            let (key, _) = entry?;
            if taken.insert(key.value().to_vec()) {
                out.push(id_of(key.value())?);
                found = true;
                break;
            }
        }
        if !found {
            break; // The index holds fewer than the tally: `check_tallies` says so.
        }
    }
    Ok(out)
}

/// The tables the tallies count buckets of, a removed table's included, in name order.
pub(super) fn tallied_tables(txn: &redb::ReadTransaction) -> Result<Vec<String>> {
    let states = txn.open_table(STATE_TALLIES)?;
    let mut tables: Vec<String> = Vec::new();
    for entry in states.iter()? {
        let (key, _) = entry?;
        let (table, _) = key.value();
        if tables.last().is_none_or(|last| last != table) {
            tables.push(table.to_string());
        }
    }
    Ok(tables)
}

/// The ids of the buckets in `DEFERRED_BUCKETS` or `LEASED_BUCKETS`, with their rows.
pub(super) fn members(txn: &redb::ReadTransaction, leased: bool) -> Result<Vec<BucketMeta>> {
    let set = txn.open_table(if leased { LEASED_BUCKETS } else { DEFERRED_BUCKETS })?;
    let buckets = txn.open_table(BUCKETS)?;
    let mut out = Vec::with_capacity(set.len()? as usize);
    for entry in set.iter()? {
        let (key, _) = entry?;
        let row = buckets.get(key.value())?.ok_or_else(|| {
            Error::Corruption(format!("a status tally names bucket {} that is not stored", hex::encode(key.value())))
        })?;
        out.push(decode_value(row.value())?);
    }
    Ok(out)
}

/// Tallies every stored bucket (the upgrades to schemas 4 to 6, and a rebuild): resumes after the
/// bucket `META_TALLY_CURSOR` names, in transactions of `TALLY_BUCKETS_PER_TRANSACTION`, each
/// moving the cursor with what it tallied, so a crash leaves no bucket counted twice or not
/// at all. Removes the cursor when done.
pub(super) fn tally_all(db: &redb::Database) -> Result<u64> {
    tally_from_cursor(db, TALLY_BUCKETS_PER_TRANSACTION, usize::MAX)
}

/// `tally_all` in transactions of `per_transaction` buckets, stopping after `transactions_max`
/// of them (the tests' crash).
fn tally_from_cursor(db: &redb::Database, per_transaction: usize, transactions_max: usize) -> Result<u64> {
    // Every open comes here: a read finds the usual case (no tally under way) without
    // beginning a write, which would wait for another process's or a compaction's.
    if redb::ReadableDatabase::begin_read(db)?.open_table(META)?.get(META_TALLY_CURSOR)?.is_none() {
        return Ok(0);
    }
    let mut tallied = 0u64;
    for _ in 0..transactions_max {
        let txn = db.begin_write()?;
        let done = {
            let mut meta = txn.open_table(META)?;
            let Some(cursor) = meta.get(META_TALLY_CURSOR)?.map(|v| v.value().to_vec()) else {
                return Ok(tallied);
            };
            let buckets = txn.open_table(BUCKETS)?;
            let mut tallies = Tallies::open(&txn)?;
            let range = if cursor.is_empty() {
                buckets.range::<&[u8]>(..)?
            } else {
                buckets.range::<&[u8]>((std::ops::Bound::Excluded(cursor.as_slice()), std::ops::Bound::Unbounded))?
            };
            let mut last = None;
            for entry in range.take(per_transaction) {
                let (key, value) = entry?;
                let bucket: BucketMeta = decode_value(value.value())?;
                tallies.account(&bucket.id, None, Tally::of(&bucket))?;
                tallied += 1;
                last = Some(key.value().to_vec());
            }
            match last {
                Some(key) => {
                    meta.insert(META_TALLY_CURSOR, key.as_slice())?;
                    false
                }
                None => {
                    meta.remove(META_TALLY_CURSOR)?;
                    true
                }
            }
        };
        txn.commit()?;
        if done {
            break;
        }
    }
    Ok(tallied)
}

/// Starts a tally of every bucket from empty tables (`tally_all` carries it out), recording
/// `version` in the same transaction: an older binary then refuses the directory instead of
/// writing rows the tallies would miss.
pub(super) fn begin_tally(db: &redb::Database, version: u32) -> Result<()> {
    let txn = db.begin_write()?;
    for table in [BUCKETS_BY_STATE, BUCKETS_BY_STATE_AND_START, ARCHIVED_BY_HASH, DEFERRED_BUCKETS, LEASED_BUCKETS] {
        txn.delete_table(table)?;
        txn.open_table(table)?;
    }
    txn.delete_table(STATE_TALLIES)?;
    txn.open_table(STATE_TALLIES)?;
    txn.delete_table(HELD_TALLIES)?;
    txn.open_table(HELD_TALLIES)?;
    txn.delete_table(LONGEST_BUCKETS)?;
    txn.open_table(LONGEST_BUCKETS)?;
    {
        let mut meta = txn.open_table(META)?;
        meta.insert(META_TALLY_CURSOR, [].as_slice())?;
        meta.insert(META_SCHEMA_VERSION, version.to_be_bytes().as_slice())?;
    }
    txn.commit()?;
    Ok(())
}

/// Differences between the stored tallies and the same recomputed from every bucket's row,
/// one line each (empty when they agree).
pub(super) fn differences(txn: &redb::ReadTransaction) -> Result<Vec<String>> {
    let mut tables: BTreeMap<String, TableTally> = BTreeMap::new();
    let mut deferred = std::collections::BTreeSet::new();
    let mut leased = std::collections::BTreeSet::new();
    let mut longest: BTreeMap<String, Micros> = BTreeMap::new();
    // Buckets whose entry in an index by state is not where their row says (with the lengths
    // checked below, each index then holds exactly the rows' entries).
    let (by_state, by_state_and_start, by_hash) = (
        txn.open_table(BUCKETS_BY_STATE)?,
        txn.open_table(BUCKETS_BY_STATE_AND_START)?,
        txn.open_table(ARCHIVED_BY_HASH)?,
    );
    let (mut misplaced_by_state, mut misplaced_by_start, mut misplaced_by_hash) = (0u64, 0u64, 0u64);
    let mut sampled = 0u64;
    for entry in txn.open_table(BUCKETS)?.iter()? {
        let (key, value) = entry?;
        let bucket: BucketMeta = decode_value(value.value())?;
        let tally = Tally::of(&bucket);
        let table_id = bucket.id.table.as_str();
        if by_state.get(by_state_key(table_id, tally.state, tally.since, key.value()).as_slice())?.is_none() {
            misplaced_by_state += 1;
        }
        if by_state_and_start.get(by_state_key(table_id, tally.state, tally.start, key.value()).as_slice())?.is_none() {
            misplaced_by_start += 1;
        }
        if is_sampled(tally.state) {
            sampled += 1;
            if by_hash.get(by_hash_key(table_id, tally.state, key.value()).as_slice())?.is_none() {
                misplaced_by_hash += 1;
            }
        }
        let table_longest = longest.entry(bucket.id.table.clone()).or_insert(0);
        *table_longest = (*table_longest).max(tally.span);
        let table = tables.entry(bucket.id.table.clone()).or_default();
        let state = table.states.entry(tally.state.to_string()).or_insert(StateTally {
            buckets: 0,
            rows: 0,
            oldest_since: Micros::MAX,
        });
        state.buckets += 1;
        state.rows += tally.rows;
        state.oldest_since = state.oldest_since.min(tally.since);
        table.held += u64::from(tally.held);
        if tally.deferred {
            deferred.insert(key.value().to_vec());
        }
        if tally.leased {
            leased.insert(key.value().to_vec());
        }
    }
    let mut out = Vec::new();
    let mut stored_tables: std::collections::BTreeSet<String> = tables.keys().cloned().collect();
    for entry in txn.open_table(STATE_TALLIES)?.iter()? {
        stored_tables.insert(entry?.0.value().0.to_string());
    }
    for entry in txn.open_table(HELD_TALLIES)?.iter()? {
        let (table, held) = entry?;
        if held.value() > 0 {
            stored_tables.insert(table.value().to_string());
        }
    }
    for table in &stored_tables {
        let stored = read_table(txn, table)?;
        let expected = tables.get(table).cloned().unwrap_or_default();
        if stored != expected {
            out.push(format!("table {table:?}: tallied {stored:?}, the rows say {expected:?}"));
        }
    }
    for (name, misplaced) in [
        ("buckets_by_state", misplaced_by_state),
        ("buckets_by_state_and_start", misplaced_by_start),
        ("archived_by_hash", misplaced_by_hash),
    ] {
        if misplaced > 0 {
            out.push(format!("{name} lacks the entry of {misplaced} buckets where their rows put it"));
        }
    }
    let bucket_count = txn.open_table(BUCKETS)?.len()?;
    for (name, index, expected) in [
        ("buckets_by_state", BUCKETS_BY_STATE, bucket_count),
        ("buckets_by_state_and_start", BUCKETS_BY_STATE_AND_START, bucket_count),
        ("archived_by_hash", ARCHIVED_BY_HASH, sampled),
    ] {
        let len = txn.open_table(index)?.len()?;
        if len != expected {
            out.push(format!("{name} holds {len} entries for {expected} buckets"));
        }
    }
    for (name, set, expected) in [("deferred", DEFERRED_BUCKETS, &deferred), ("leased", LEASED_BUCKETS, &leased)] {
        let mut stored = std::collections::BTreeSet::new();
        for entry in txn.open_table(set)?.iter()? {
            stored.insert(entry?.0.value().to_vec());
        }
        if &stored != expected {
            out.push(format!("{name}: {} tallied, {} in the rows", stored.len(), expected.len()));
        }
    }
    let stored_longest = txn.open_table(LONGEST_BUCKETS)?;
    for (table, span) in longest {
        let stored = stored_longest.get(table.as_str())?.map(|v| v.value());
        // At least the longest bucket stored (a bucket gone may have been longer).
        if stored.is_none_or(|stored| stored < span) {
            out.push(format!("table {table:?}: longest bucket tallied {stored:?}, the rows have one of {span}"));
        }
    }
    Ok(out)
}

/// The length of the longest bucket `table` ever had, in a read transaction.
pub(super) fn longest_bucket(txn: &redb::ReadTransaction, table: &str) -> Result<Option<Micros>> {
    Ok(txn.open_table(LONGEST_BUCKETS)?.get(table)?.map(|v| v.value()))
}

/// What a status reads of the tallies, from one read transaction.
#[derive(Debug, Default)]
pub struct StatusTallies {
    pub tables: BTreeMap<String, TableTally>,
    /// The buckets whose step failed and will be retried, or whose plan could not be made.
    pub deferred: Vec<BucketMeta>,
    /// The buckets under a lease (a status shows those whose lease has not expired).
    pub leased: Vec<BucketMeta>,
}

impl super::Store {
    /// The tallies of `tables`, and the deferred and leased buckets: what `status` shows of
    /// the buckets, read without visiting them.
    pub fn status_tallies<'a>(&self, tables: impl IntoIterator<Item = &'a str>) -> Result<StatusTallies> {
        let txn = self.read()?;
        let mut out = StatusTallies::default();
        for table in tables {
            out.tables.insert(table.to_string(), read_table(&txn, table)?);
        }
        out.deferred = members(&txn, false)?;
        out.leased = members(&txn, true)?;
        Ok(out)
    }

    /// The length of the longest bucket `table` ever had (`None`: it has had none).
    pub fn longest_bucket(&self, table: &str) -> Result<Option<Micros>> {
        longest_bucket(&self.read()?, table)
    }

    /// Where the stored tallies differ from the same recomputed from every bucket's row (empty
    /// when they agree): the check the tests and the simulation make after their steps.
    pub fn tally_differences(&self) -> Result<Vec<String>> {
        differences(&self.read()?)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Store;
    use super::super::append::bucket_for_tests;
    use super::super::{index_new_bucket, save_meta};
    use super::*;
    use crate::model::{BucketDescriptor, BucketState};

    /// A store of `n` buckets of two tables in several states, saved through `save_meta`.
    fn store_of(dir: &std::path::Path, n: usize) -> Store {
        let store = Store::open(&dir.join("hot.redb")).unwrap();
        for i in 0..n {
            let table = if i % 3 == 0 { "a/b %=é" } else { "t" };
            let id = BucketId {
                table: table.into(),
                partition_key: b"site a/p%=\xc3\xa9".to_vec(),
                bucket_key: format!("k {i}"),
            };
            let descriptor = BucketDescriptor { key: id.bucket_key.clone(), start: i as i64, end: i as i64 + 1 };
            let mut meta = bucket_for_tests(id, &descriptor);
            meta.row_count = i as u64 * 7;
            meta.state_since = 1_000 - i as i64;
            meta.state =
                [BucketState::Hot, BucketState::Archived { hot_deleted: true }, BucketState::Expired][(i / 2) % 3];
            if i % 4 == 0 {
                meta.held_by = vec!["legal".into()];
            }
            meta.attempts = u32::from(i % 5 == 0);
            if i % 6 == 0 {
                meta.lease_owner = Some("w".into());
            }
            store
                .write(move |txn| {
                    index_new_bucket(txn, &meta)?;
                    save_meta(txn, &meta)
                })
                .unwrap();
        }
        store
    }

    #[test]
    fn the_tallies_follow_every_saved_row_and_a_rebuild_cut_short_goes_on_from_its_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_of(dir.path(), 20);
        assert_eq!(store.tally_differences().unwrap(), Vec::<String>::new());
        let tallies = store.status_tallies(["t", "a/b %=é"]).unwrap();
        let t = &tallies.tables["t"];
        assert_eq!(t.states.values().map(|s| s.buckets).sum::<u64>(), 13);
        assert_eq!(tallies.deferred.len(), 4);
        assert_eq!(tallies.leased.len(), 4);
        let before = tallies.tables.clone();

        // Rebuilt from empty tables (an upgrade to this schema) and cut short after two
        // transactions of three buckets: the next open goes on from the cursor.
        let path = store.path().to_path_buf();
        drop(store);
        let db = redb::Database::open(&path).unwrap();
        begin_tally(&db, crate::store::schema::SCHEMA_VERSION).unwrap();
        assert_eq!(tally_from_cursor(&db, 3, 2).unwrap(), 6);
        drop(db);
        let store = Store::open(&path).unwrap();
        assert_eq!(store.tally_differences().unwrap(), Vec::<String>::new());
        assert_eq!(store.status_tallies(["t", "a/b %=é"]).unwrap().tables, before);
    }

    /// A sample seeks random points of the index by hash; over many samples every archived
    /// bucket is chosen about as often (with one step past the point instead of up to
    /// `SAMPLE_STEPS`, the least-chosen bucket of these is chosen about once), never one that
    /// left the archived states, and each bucket once per sample.
    #[test]
    fn a_sample_from_the_index_by_hash_checks_every_archived_bucket_about_as_often() {
        use rand::SeedableRng;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("hot.redb")).unwrap();
        let archived = BucketState::Archived { hot_deleted: true };
        let buckets = 260;
        for i in 0..buckets {
            let id = BucketId {
                table: "t".into(),
                partition_key: format!("site {}/p%=é {}", i % 7, i / 7).into_bytes(),
                bucket_key: format!("2024-01-{:02}", i % 28 + 1),
            };
            let descriptor = BucketDescriptor { key: id.bucket_key.clone(), start: i as i64, end: i as i64 + 1 };
            let mut meta = bucket_for_tests(id, &descriptor);
            meta.state = archived;
            store
                .write(move |txn| {
                    index_new_bucket(txn, &meta)?;
                    save_meta(txn, &meta)
                })
                .unwrap();
        }
        // Sixty leave the archived state, as an expiry or a late record takes them.
        let mut left = std::collections::BTreeSet::new();
        for meta in store.buckets("t", None).unwrap().into_iter().step_by(4).take(60) {
            left.insert(meta.id.clone());
            let mut meta = meta;
            meta.state = if left.len() % 2 == 0 { BucketState::Expired } else { BucketState::ArchivedPending };
            store.write(move |txn| save_meta(txn, &meta)).unwrap();
        }
        assert_eq!(store.tally_differences().unwrap(), Vec::<String>::new());
        let count = buckets as u64 - 60;
        let snapshot = store.snapshot().unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut chosen: std::collections::BTreeMap<BucketId, u32> = std::collections::BTreeMap::new();
        let draws = 20_000;
        for _ in 0..draws {
            for id in snapshot.sample_archived_ids("t", archived, count, 1, &mut rng).unwrap() {
                *chosen.entry(id).or_default() += 1;
            }
        }
        assert!(chosen.keys().all(|id| !left.contains(id)), "a sample chose a bucket no longer archived");
        assert_eq!(chosen.len() as u64, count, "every archived bucket is chosen at some point");
        let mean = f64::from(draws) / count as f64;
        let (least, most) = (chosen.values().min().unwrap(), chosen.values().max().unwrap());
        assert!(
            f64::from(*least) > mean / 4.0 && f64::from(*most) < mean * 4.0,
            "chosen between {least} and {most} times, against {mean:.0} on average"
        );
        // Each bucket once per sample, by seeks (a small sample) or by a walk (a large one).
        for n in [1, 10, 49, 50, 120, count as usize, count as usize + 5] {
            let ids = snapshot.sample_archived_ids("t", archived, count, n, &mut rng).unwrap();
            let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
            assert_eq!((ids.len(), distinct.len()), (n.min(count as usize), n.min(count as usize)), "{n}");
            assert!(ids.iter().all(|id| !left.contains(id)));
        }
    }
}

//! Schema upgrades, run by `Store::open` before anything else reads the database.
//!
//! Schema 1 kept every hot row in one `records` table keyed by bucket id ‖ event_time ‖
//! sort_key; schema 2 keeps each bucket's rows in a table of its own (`schema::rows_table`).
//! The upgrade first reads every key (one that names no bucket refuses the upgrade before
//! anything changes), records version 2 (so an older binary refuses the directory instead of
//! reading it half moved), then moves the rows in transactions of at most
//! `UPGRADE_ROWS_PER_TRANSACTION`, each deleting from `records` exactly what it inserted
//! elsewhere, and deletes the emptied table last. A crash anywhere leaves every row in exactly
//! one of the two places; the next open finds `records` still there and goes on.
//!
//! Schema 3 adds `buckets_by_end` (a table's buckets by their end: the order reconciliations
//! visit them in) and keeps the plan queue in that order (`plan_queue`, which replaces schema
//! 2's `unplanned`, kept in bucket key order). The upgrade indexes every bucket in
//! transactions of at most `UPGRADE_BUCKETS_PER_TRANSACTION` (inserting an entry twice is
//! harmless, so a crash only makes the next open start again), then in one last transaction
//! moves the plan queue, restarts any reconciliation under way (its position was a bucket
//! key) and records version 3.
//!
//! Schema 4 adds the status tallies (`tally`), schema 5 each table's longest bucket beside
//! them, schema 6 each state's buckets by start, and schema 7 each archived bucket by a hash
//! of its id: the upgrade to any of them records the new version with an empty cursor, then tallies
//! every bucket anew in transactions that each move the cursor, and removes the cursor last;
//! an open that finds the cursor goes on from it.

use redb::{Database, ReadableDatabase, ReadableTable};

use crate::error::{Error, Result};

use super::encoding;
use super::schema::{
    BUCKETS, BUCKETS_BY_END, BucketId, BucketMeta, META, META_SCHEMA_VERSION, PLAN_QUEUE, PlanClass, RowsTable,
    SCHEMA_1_RECORDS, SCHEMA_2_UNPLANNED, SCHEMA_VERSION, TABLES, TableState, by_end_key, decode_value, encode_value,
    plan_queue_key, rows_table, rows_table_name,
};

/// Rows moved per transaction: bounds the transaction's size on a database of any size.
pub const UPGRADE_ROWS_PER_TRANSACTION: usize = 50_000;
/// Buckets indexed per transaction by the upgrade to schema 3.
pub const UPGRADE_BUCKETS_PER_TRANSACTION: usize = 50_000;

/// Upgrades a database of an older schema in place; does nothing on a current one.
pub(super) fn upgrade(db: &Database, stored_version: u32) -> Result<()> {
    if stored_version < 2 {
        check_schema_1_keys(db)?;
        let txn = db.begin_write()?;
        txn.open_table(META)?.insert(META_SCHEMA_VERSION, 2u32.to_be_bytes().as_slice())?;
        txn.commit()?;
    }
    move_schema_1_records(db)?;
    if stored_version < 3 {
        index_buckets_by_end(db)?;
    }
    if stored_version < SCHEMA_VERSION {
        super::tally::begin_tally(db, SCHEMA_VERSION)?;
    }
    let started = std::time::Instant::now();
    let tallied = super::tally::tally_all(db)?;
    if tallied > 0 {
        tracing::info!(
            tallied,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "upgraded the store's tallies to schema {SCHEMA_VERSION}"
        );
    }
    Ok(())
}

/// The upgrade from schema 2 to 3 (see the module's doc).
fn index_buckets_by_end(db: &Database) -> Result<()> {
    let started = std::time::Instant::now();
    let mut from: Option<Vec<u8>> = None;
    let mut indexed = 0u64;
    loop {
        let txn = db.begin_write()?;
        let next = {
            let buckets = txn.open_table(BUCKETS)?;
            let mut by_end = txn.open_table(BUCKETS_BY_END)?;
            let mut range = match &from {
                Some(after) => {
                    buckets.range::<&[u8]>((std::ops::Bound::Excluded(after.as_slice()), std::ops::Bound::Unbounded))?
                }
                None => buckets.range::<&[u8]>(..)?,
            };
            let mut last = None;
            for entry in range.by_ref().take(UPGRADE_BUCKETS_PER_TRANSACTION) {
                let (key, value) = entry?;
                let meta: BucketMeta = decode_value(value.value())?;
                by_end.insert(by_end_key(&meta.id, meta.descriptor.end).as_slice(), ())?;
                indexed += 1;
                last = Some(key.value().to_vec());
            }
            last
        };
        txn.commit()?;
        if next.is_none() {
            break;
        }
        from = next;
    }
    let txn = db.begin_write()?;
    let mut queued = 0u64;
    let had_old_queue = match txn.open_table(SCHEMA_2_UNPLANNED) {
        Ok(old_queue) => {
            let buckets = txn.open_table(BUCKETS)?;
            let mut plan_queue = txn.open_table(PLAN_QUEUE)?;
            for entry in old_queue.iter()? {
                let (key, _) = entry?;
                // A queued bucket that is not stored has nothing to plan.
                if let Some(value) = buckets.get(key.value())? {
                    let meta: BucketMeta = decode_value(value.value())?;
                    plan_queue.insert(
                        plan_queue_key(PlanClass::of(meta.state), &meta.id, meta.descriptor.end).as_slice(),
                        (),
                    )?;
                    queued += 1;
                }
            }
            true
        }
        Err(redb::TableError::TableDoesNotExist(_)) => false,
        Err(e) => return Err(e.into()),
    };
    if had_old_queue {
        txn.delete_table(SCHEMA_2_UNPLANNED)?;
    }
    {
        let mut tables = txn.open_table(TABLES)?;
        let mut restarted = Vec::new();
        for entry in tables.iter()? {
            let (_, value) = entry?;
            let state: TableState = decode_value(value.value())?;
            if state.reconcile_from.as_ref().is_some_and(|from| !from.is_empty()) {
                restarted.push(state);
            }
        }
        for mut state in restarted {
            state.reconcile_from = Some(Vec::new());
            tables.insert(state.id.as_str(), encode_value(&state)?.as_slice())?;
        }
    }
    txn.open_table(META)?.insert(META_SCHEMA_VERSION, 3u32.to_be_bytes().as_slice())?;
    txn.commit()?;
    tracing::info!(
        buckets = indexed,
        queued,
        seconds = started.elapsed().as_secs_f64(),
        "upgraded the hot store from schema 2 to 3: buckets are indexed by their end and planned oldest first"
    );
    Ok(())
}

/// Reads every key of schema 1's `records` table before anything changes: a key that names no
/// bucket would stop the move half way, on a directory that says version 2 (which the older
/// binary refuses), so it is refused here while the directory still opens with that binary.
fn check_schema_1_keys(db: &Database) -> Result<()> {
    let read = db.begin_read()?;
    let records = match read.open_table(SCHEMA_1_RECORDS) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for (position, entry) in records.iter()?.enumerate() {
        let (key, _) = entry?;
        if let Err(e) = BucketId::decode(&mut encoding::Reader::new(key.value())) {
            return Err(Error::Corruption(format!(
                "the hot store's records table holds a key that names no bucket (row {position}, key {}: {e}); \
                 the upgrade to schema 2 did not start, and the data directory still opens with the frostline that \
                 wrote it: export its records with that version (`frostline query`) and ingest them into a new \
                 data directory",
                hex::encode(key.value())
            )));
        }
    }
    Ok(())
}

/// Moves every row of schema 1's `records` table into its bucket's rows table, if the table
/// is still there (a fresh upgrade, or one a crash cut short).
fn move_schema_1_records(db: &Database) -> Result<()> {
    let exists = {
        let read = db.begin_read()?;
        match read.open_table(SCHEMA_1_RECORDS) {
            Ok(_) => true,
            Err(redb::TableError::TableDoesNotExist(_)) => false,
            Err(e) => return Err(e.into()),
        }
    };
    if !exists {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let mut moved = 0u64;
    loop {
        let txn = db.begin_write()?;
        let batch = {
            let mut records = txn.open_table(SCHEMA_1_RECORDS)?;
            let mut batch: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            for entry in records.iter()?.take(UPGRADE_ROWS_PER_TRANSACTION) {
                let (k, v) = entry?;
                batch.push((k.value().to_vec(), v.value().to_vec()));
            }
            for (key, _) in &batch {
                records.remove(key.as_slice())?;
            }
            batch
        };
        if batch.is_empty() {
            txn.delete_table(SCHEMA_1_RECORDS)?;
            txn.commit()?;
            break;
        }
        // Rows arrive in key order, so each bucket's rows are consecutive: one table open at
        // a time.
        let mut current: Option<(Vec<u8>, RowsTable<'_>)> = None;
        for (key, value) in &batch {
            let mut reader = encoding::Reader::new(key);
            let id = BucketId::decode(&mut reader)?;
            let prefix = id.encode();
            if current.as_ref().is_none_or(|(open, _)| *open != prefix) {
                current = Some((prefix, txn.open_table(rows_table(&rows_table_name(&id)))?));
            }
            let (_, table) = current.as_mut().expect("opened above");
            table.insert(reader.rest(), value.as_slice())?;
        }
        drop(current);
        moved += batch.len() as u64;
        txn.commit()?;
    }
    tracing::info!(
        rows = moved,
        seconds = started.elapsed().as_secs_f64(),
        "upgraded the hot store from schema 1 to 2: each bucket's rows now live in a table of their own"
    );
    Ok(())
}

//! The catalogs: for each table and installation, one object per day on which its published
//! buckets start (UTC), `table=<table>/_catalogs/<installation>/<YYYY-MM-DD>_catalog.json`,
//! listing every manifest that installation published of those buckets with their bounds and
//! segments, so a reader (DuckDB, Spark, a script) finds every segment without listing every
//! bucket: the table's archive is the union of `table=<table>/_catalogs/*/*_catalog.json`. On a
//! target several installations share, each rewrites only its own, so none hides another's
//! archives. A table whose archive is a Delta table has none: its Delta log lists its files,
//! those of every installation sharing the target (`super::delta`).
//!
//! It is derived data, never the only copy of anything: it is written from the recorded
//! manifests after every pass that published or expired something, and after an adoption.
//! A write rewrites only the days whose buckets' publication changed since the last write
//! (`Store::publication_changes`, after the cursor the store keeps with them,
//! `Store::catalog_cursor`), each from the published buckets that start on it
//! (`Store::published_starting_on`), so its cost grows with what changed and one day's
//! buckets, not with the table's history, across restarts too. A write with no cursor (the
//! first of a table, the first to another target, or after a Delta log read and dropped the
//! changes) rewrites every day and deletes the days it no longer has, one day in memory at a
//! time. A crash between a write and its cursor writes the same days again. Backends are
//! create-only, so a rewrite deletes a day's catalog and creates the new one; a reader that
//! finds none in between can retry or list the manifests. The catalogs of earlier builds, one
//! per installation (`table=<table>/_catalogs/<installation>/_catalog.json`) or one per table
//! (`table=<table>/_catalog.json`, whichever installation wrote last), are deleted by a write
//! of every day.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;

use super::blocking;
use crate::engine::Context;
use crate::error::Result;
use crate::model::Micros;
use crate::model::time::MICROS_PER_DAY;
use crate::storage::PutOutcome;

/// How every catalog's file name ends (after its day), and the whole name of earlier builds'.
pub const CATALOG_FILE: &str = "_catalog.json";
pub const CATALOG_VERSION: u32 = 2;

#[derive(Debug, Clone, Serialize)]
pub struct CatalogEntry {
    pub manifest_key: String,
    pub partition_key: String,
    pub bucket_key: String,
    pub start: Micros,
    pub end: Micros,
    pub rows: u64,
    pub bytes: u64,
    pub format: crate::format::Format,
    pub segments: Vec<String>,
}

/// One day's catalog: the published buckets that start on `day`.
#[derive(Debug, Clone, Serialize)]
pub struct Catalog {
    pub version: u32,
    pub table: String,
    /// The UTC day its buckets start on, `YYYY-MM-DD`.
    pub day: String,
    pub generated_at: Micros,
    pub manifests: Vec<CatalogEntry>,
}

/// What one write of a table's catalogs did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CatalogWrite {
    /// Days whose catalog was written, or deleted for having no published bucket left.
    pub days: usize,
    /// Manifests the written days list.
    pub manifests: usize,
    /// Whether every day was written (the first write of a process, or to another target).
    pub whole: bool,
}

/// The folder below a table's folder that holds the installations' catalogs.
pub const CATALOGS_FOLDER: &str = "_catalogs/";

/// The folder of `installation`'s catalogs of `table`.
pub fn catalogs_folder(table: &str, installation: &str) -> String {
    format!("{}{CATALOGS_FOLDER}{installation}/", crate::storage::keys::table_prefix(table))
}

/// The catalog of `installation`'s archives of `table` whose buckets start on the day of `start`.
pub fn catalog_key(table: &str, installation: &str, start: Micros) -> String {
    day_catalog_key(table, installation, day_of(start))
}

/// The catalog of `installation`'s archives of `table` whose buckets start on UTC day number
/// `day` (a day number, not a time: a bucket may start as early as `Micros::MIN`, whose day
/// has no time of its own).
fn day_catalog_key(table: &str, installation: &str, day: i64) -> String {
    format!("{}{}{CATALOG_FILE}", catalogs_folder(table, installation), day_name(day))
}

/// The UTC day number `time` falls on.
fn day_of(time: Micros) -> i64 {
    time.div_euclid(MICROS_PER_DAY)
}

/// `YYYY-MM-DD` of UTC day number `day` (`day<number>` outside the calendar's range).
fn day_name(day: i64) -> String {
    let epoch = ::time::OffsetDateTime::UNIX_EPOCH.date().to_julian_day();
    i32::try_from(day)
        .ok()
        .and_then(|day| day.checked_add(epoch))
        .and_then(|julian| ::time::Date::from_julian_day(julian).ok())
        .map_or_else(
            || format!("day{day}"),
            |date| format!("{:04}-{:02}-{:02}", date.year(), u8::from(date.month()), date.day()),
        )
}

/// Earlier builds' catalogs: one per installation, and one per table.
fn earlier_catalog_keys(table: &str, installation: &str) -> [String; 2] {
    [
        format!("{}{CATALOG_FILE}", catalogs_folder(table, installation)),
        format!("{}{CATALOG_FILE}", crate::storage::keys::table_prefix(table)),
    ]
}

/// Writes the table's catalogs of the days whose publication changed since the last write,
/// or of every day (module documentation).
pub async fn write(ctx: &Arc<Context>, table: &str) -> Result<CatalogWrite> {
    let lock = ctx.memory().catalog_locks.lock().expect("catalog locks").entry(table.to_string()).or_default().clone();
    let _one_at_a_time = lock.lock().await;
    let backend = ctx.policies.clone().table(table)?.backend.clone();
    let target = backend.target().to_string();
    let (store, id, on) = (ctx.store.clone(), table.to_string(), target.clone());
    let (days, through, whole) = blocking(move || match store.catalog_cursor(&id)?.filter(|c| c.target == on) {
        Some(previous) => {
            let (changed, through) = store.publication_changes(&id, previous.changes_read)?;
            let mut days = BTreeSet::new();
            for (_, recorded) in &changed {
                days.extend(recorded.meta.iter().map(|meta| day_of(meta.descriptor.start)));
                days.extend(recorded.manifests.iter().map(|manifest| day_of(manifest.bucket.start)));
            }
            Ok((days, through, false))
        }
        // The changes are counted first: one made while the days are read is read again.
        None => {
            let through = store.publication_changes_seq()?;
            Ok((store.published_start_days(&id)?, through, true))
        }
    })
    .await?;
    let installation = ctx.installation_id.clone();
    let mut written = CatalogWrite { whole, ..CatalogWrite::default() };
    let mut stale = Vec::new();
    if whole {
        let wanted: BTreeSet<String> = days.iter().map(|day| day_catalog_key(table, &installation, *day)).collect();
        for object in backend.list(&catalogs_folder(table, &installation)).await? {
            if object.key.ends_with(CATALOG_FILE) && !wanted.contains(&object.key) {
                stale.push(object.key);
            }
        }
        for key in earlier_catalog_keys(table, &installation) {
            if !stale.contains(&key) {
                stale.push(key);
            }
        }
    }
    for day in days {
        let (store, id) = (ctx.store.clone(), table.to_string());
        let published = blocking(move || store.published_starting_on(&id, day)).await?;
        let key = day_catalog_key(table, &installation, day);
        backend.delete(&key).await?;
        written.days += 1;
        if published.is_empty() {
            continue;
        }
        let manifests: Vec<CatalogEntry> = published
            .into_iter()
            .filter_map(|(meta, manifest)| {
                Some(CatalogEntry {
                    manifest_key: meta.manifest_key?,
                    partition_key: manifest.partition_key.clone(),
                    bucket_key: meta.id.bucket_key,
                    start: manifest.bucket.start,
                    end: manifest.bucket.end,
                    rows: manifest.summary.rows,
                    bytes: manifest.bytes,
                    format: manifest.format,
                    segments: manifest.segments.iter().map(|s| s.key.clone()).collect(),
                })
            })
            .collect();
        written.manifests += manifests.len();
        let catalog = Catalog {
            version: CATALOG_VERSION,
            table: table.to_string(),
            day: day_name(day),
            generated_at: ctx.clock.now(),
            manifests,
        };
        let bytes = Bytes::from(serde_json::to_vec_pretty(&catalog).expect("a catalog serializes"));
        match backend.put_create(&key, bytes).await? {
            PutOutcome::Created => {}
            // Another write of this installation made it at the same moment, from the same state.
            PutOutcome::AlreadyExists => {}
        }
    }
    for key in stale {
        backend.delete(&key).await?;
    }
    // What the catalogs have taken in is dropped from the store's list of changes.
    let (store, id) = (ctx.store.clone(), table.to_string());
    blocking(move || store.catalogs_written(&id, &target, through)).await?;
    Ok(written)
}

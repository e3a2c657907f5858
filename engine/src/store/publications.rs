//! What a running engine's Delta sync and catalog writer read instead of every manifest ever
//! recorded: the buckets whose publication changed since they last looked
//! (`PUBLICATION_CHANGES`, written by `record_step`), each such bucket's manifests, and the
//! published buckets that start on one day (`BUCKETS_BY_STATE_AND_START`), so a sync costs
//! what changed, not the table's history (`archive::delta`, `archive::catalog`).

use redb::ReadableTable;

use crate::error::{Error, Result};
use crate::format::manifest::Manifest;
use crate::model::time::MICROS_PER_DAY;
use crate::model::{BucketState, Micros};

use super::Store;
use super::encoding::Reader;
use super::keys::generation_key;
use super::schema::{
    BUCKETS, BucketId, BucketMeta, MANIFESTS, META, META_PUBLICATION_CHANGES_SEQ, PUBLICATION_CHANGES,
};
use super::{decode_value, publication_change_key};

/// One bucket as the Delta sync needs it: every manifest recorded for it (oldest generation
/// first), and whether its newest is published.
#[derive(Debug, Clone)]
pub struct BucketManifests {
    pub meta: Option<BucketMeta>,
    pub manifests: Vec<Manifest>,
}

impl BucketManifests {
    /// The published manifest: the newest recorded, while the bucket has a published archive.
    pub fn published(&self) -> Option<&Manifest> {
        self.meta.as_ref().filter(|m| m.has_published_archive()).and(self.manifests.last())
    }
}

impl Store {
    /// The sequence of the last publication change written (0: none yet).
    pub fn publication_changes_seq(&self) -> Result<u64> {
        let txn = self.read()?;
        let meta = txn.open_table(META)?;
        Ok(meta
            .get(META_PUBLICATION_CHANGES_SEQ)?
            .and_then(|v| v.value().try_into().ok().map(u64::from_be_bytes))
            .unwrap_or(0))
    }

    /// The buckets of `table` whose publication changed after sequence `after`, each with its
    /// manifests, all read from one snapshot; and the sequence they run to (`after` if none).
    pub fn publication_changes(&self, table: &str, after: u64) -> Result<(Vec<(BucketId, BucketManifests)>, u64)> {
        let txn = self.read()?;
        let changes = txn.open_table(PUBLICATION_CHANGES)?;
        let (start, end) =
            (publication_change_key(table, after.saturating_add(1)), publication_change_key(table, u64::MAX));
        let mut ids = std::collections::BTreeSet::new();
        let mut last = after;
        for entry in changes.range(start.as_slice()..=end.as_slice())? {
            let (key, value) = entry?;
            let mut reader = Reader::new(key.value());
            reader.bytes()?;
            last = reader.u64()?;
            ids.insert(BucketId::decode(&mut Reader::new(value.value()))?);
        }
        let (buckets, manifests) = (txn.open_table(BUCKETS)?, txn.open_table(MANIFESTS)?);
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let meta: Option<BucketMeta> =
                buckets.get(id.encode().as_slice())?.map(|v| decode_value(v.value())).transpose()?;
            let (from, to) = (generation_key(&id, 0), generation_key(&id, u64::MAX));
            let mut recorded = Vec::new();
            for entry in manifests.range(from.as_slice()..=to.as_slice())? {
                recorded.push(decode_value(entry?.1.value())?);
            }
            out.push((id, BucketManifests { meta, manifests: recorded }));
        }
        Ok((out, last))
    }

    /// The days (UTC day numbers) on which `table`'s buckets that hold a published archive
    /// start, read from the index by state and start: one seek per day and state, no bucket's
    /// row.
    pub fn published_start_days(&self, table: &str) -> Result<std::collections::BTreeSet<i64>> {
        let txn = self.read()?;
        let mut days = std::collections::BTreeSet::new();
        for state in PUBLISHING_STATES {
            super::tally::visit_starts_in_state(&txn, table, state.name(), Micros::MIN, Micros::MAX, |start, _| {
                let day = start.div_euclid(MICROS_PER_DAY);
                days.insert(day);
                // On to the next day (none after the last one a start can fall on).
                Ok(day.checked_add(1).and_then(|next| next.checked_mul(MICROS_PER_DAY)))
            })?;
        }
        Ok(days)
    }

    /// `table`'s buckets that hold a published archive and start on day `day` (a UTC day
    /// number), each with its published manifest, by start, then partition and bucket key.
    pub fn published_starting_on(&self, table: &str, day: i64) -> Result<Vec<(BucketMeta, Manifest)>> {
        let from = day.saturating_mul(MICROS_PER_DAY);
        let to = day.saturating_add(1).saturating_mul(MICROS_PER_DAY);
        let txn = self.read()?;
        let (buckets, manifests) = (txn.open_table(BUCKETS)?, txn.open_table(MANIFESTS)?);
        let mut out = Vec::new();
        for state in PUBLISHING_STATES {
            super::tally::visit_starts_in_state(&txn, table, state.name(), from, to, |_, encoded| {
                let meta = super::tally::indexed_bucket(&buckets, encoded)?;
                if meta.has_published_archive() {
                    let (first, last) = (generation_key(&meta.id, 0), generation_key(&meta.id, u64::MAX));
                    // The newest manifest recorded is the published one.
                    if let Some(entry) = manifests.range(first.as_slice()..=last.as_slice())?.next_back() {
                        out.push((meta, decode_value(entry?.1.value())?));
                    }
                }
                Ok(Some(Micros::MIN))
            })?;
        }
        out.sort_by(|(a, _), (b, _)| {
            (a.descriptor.start, &a.id.partition_key, &a.id.bucket_key).cmp(&(
                b.descriptor.start,
                &b.id.partition_key,
                &b.id.bucket_key,
            ))
        });
        Ok(out)
    }

    /// Drops the publication changes of `table` up to sequence `through`: a Delta sync has read
    /// them. The table's catalog cursor goes with them, as its catalogs never saw them.
    pub fn drop_publication_changes(&self, table: &str, through: u64) -> Result<()> {
        let (start, end) = (publication_change_key(table, 0), publication_change_key(table, through));
        let cursor = catalog_cursor_key(table);
        self.write(move |txn| {
            let mut changes = txn.open_table(PUBLICATION_CHANGES)?;
            changes.retain_in(start.as_slice()..=end.as_slice(), |_, _| false)?;
            txn.open_table(META)?.remove(cursor.as_str())?;
            Ok(())
        })
    }

    /// Where `table`'s catalogs stand (`archive::catalog`): the target they were written to and
    /// the last publication change they took in; `None` until a write took in every day (or
    /// since changes they never saw were dropped).
    pub fn catalog_cursor(&self, table: &str) -> Result<Option<CatalogCursor>> {
        let txn = self.read()?;
        let meta = txn.open_table(META)?;
        let Some(value) = meta.get(catalog_cursor_key(table).as_str())? else { return Ok(None) };
        let mut reader = Reader::new(value.value());
        let changes_read = reader.u64()?;
        let target = String::from_utf8(reader.bytes()?)
            .map_err(|_| Error::Corruption(format!("the catalog cursor of table {table:?} names no target")))?;
        Ok(Some(CatalogCursor { target, changes_read }))
    }

    /// Records that `table`'s catalogs on `target` took in the publication changes up to
    /// `through`, and drops those changes, in one transaction.
    pub fn catalogs_written(&self, table: &str, target: &str, through: u64) -> Result<()> {
        let (start, end) = (publication_change_key(table, 0), publication_change_key(table, through));
        let cursor = catalog_cursor_key(table);
        let mut value = Vec::new();
        super::encoding::put_u64(&mut value, through);
        super::encoding::put_bytes(&mut value, target.as_bytes());
        self.write(move |txn| {
            let mut changes = txn.open_table(PUBLICATION_CHANGES)?;
            changes.retain_in(start.as_slice()..=end.as_slice(), |_, _| false)?;
            txn.open_table(META)?.insert(cursor.as_str(), value.as_slice())?;
            Ok(())
        })
    }

    /// Drops the publication changes of every table but those in `keep` (the tables whose
    /// Delta syncs read them): nobody reads the others. Writes only when there is something
    /// to drop.
    pub fn drop_unread_publication_changes(&self, keep: &std::collections::BTreeSet<String>) -> Result<()> {
        let unread = |txn: &redb::ReadTransaction| -> Result<bool> {
            let changes = txn.open_table(PUBLICATION_CHANGES)?;
            for entry in changes.iter()? {
                let (key, _) = entry?;
                let table = Reader::new(key.value()).bytes()?;
                if !keep.contains(String::from_utf8_lossy(&table).as_ref()) {
                    return Ok(true);
                }
            }
            Ok(false)
        };
        if !unread(&self.read()?)? {
            return Ok(());
        }
        let keep = keep.clone();
        self.write(move |txn| {
            let mut dropped = std::collections::BTreeSet::new();
            txn.open_table(PUBLICATION_CHANGES)?.retain(|key, _| {
                let table = Reader::new(key).bytes().map(|table| String::from_utf8_lossy(&table).into_owned());
                match table {
                    Ok(table) if keep.contains(&table) => true,
                    Ok(table) => {
                        dropped.insert(table);
                        false
                    }
                    Err(_) => false,
                }
            })?;
            let mut meta = txn.open_table(META)?;
            for table in dropped {
                meta.remove(catalog_cursor_key(&table).as_str())?;
            }
            Ok(())
        })
    }
}

/// The states in which a bucket can hold a published archive (`BucketMeta::has_published_archive`
/// says whether it does): a next generation being archived keeps the last one published.
const PUBLISHING_STATES: [BucketState; 4] = [
    BucketState::Archiving,
    BucketState::Archived { hot_deleted: false },
    BucketState::Archived { hot_deleted: true },
    BucketState::ArchivedPending,
];

/// Where a table's catalogs stand (`Store::catalog_cursor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogCursor {
    pub target: String,
    pub changes_read: u64,
}

/// The `META` key of `table`'s catalog cursor.
fn catalog_cursor_key(table: &str) -> String {
    format!("catalog_cursor/{table}")
}

//! What `frostline adopt` weighs, kept on disk instead of in memory: the manifests it lists on a
//! table's targets, by folder (so each bucket folder's manifests are weighed together over every
//! target), and the manifest keys the database records, replaced or released. A scratch redb
//! database in a temporary folder of the data directory holds them, written without fsyncs (it
//! is rebuilt by the next run) and removed when adoption ends, so adoption's memory follows one
//! page of folders, whatever the number of archives.

use std::ops::Bound;
use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::Store;
use super::schema::RELEASED;
use crate::error::Result;
use crate::model::Micros;

/// A manifest listed on a target: (folder, key, target's index in the run) → when it was
/// written. Keyed by folder first, so one folder's manifests on every target lie together.
const LISTED: TableDefinition<ListedKey, Micros> = TableDefinition::new("listed");
type ListedKey = (&'static str, &'static str, u32);
/// A manifest key the database knows (`KnownKey`), as a byte.
const KNOWN: TableDefinition<&str, u8> = TableDefinition::new("known");

/// The name of a run's scratch folder in the data directory starts with it.
const SCRATCH_PREFIX: &str = ".adopt-scratch-";
/// The scratch database's page cache: what it keeps in memory at most.
const SCRATCH_CACHE_BYTES: usize = 4 * 1024 * 1024;

/// What the database knows of a manifest key found on a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnownKey {
    /// A bucket's recorded archive.
    Recorded,
    /// A generation a recorded archive replaced (its lineage names it), or a key this data
    /// directory released: no candidate for adoption.
    Replaced,
}

/// One manifest found on a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedManifest {
    pub key: String,
    /// The index of the target it lies on, in the order adoption visits them.
    pub target: u32,
    pub written: Micros,
    /// What the database knows of it.
    pub known: Option<KnownKey>,
}

/// The scratch database of one run of adoption.
pub struct AdoptionScratch {
    db: Database,
    /// Removed with the database when the run ends.
    _dir: tempfile::TempDir,
}

impl AdoptionScratch {
    /// A new scratch database in a temporary folder of `data_dir`, holding the manifest keys
    /// `store` records, replaced or released, read from one snapshot.
    pub fn create(data_dir: &Path, store: &Store) -> Result<AdoptionScratch> {
        // A run that was killed left its folder behind; adoption runs with the engine stopped,
        // one at a time (the store is locked), so none of them is in use.
        for entry in std::fs::read_dir(data_dir).map_err(|e| crate::Error::io(data_dir, e))? {
            let path = entry.map_err(|e| crate::Error::io(data_dir, e))?.path();
            if path.file_name().is_some_and(|name| name.to_string_lossy().starts_with(SCRATCH_PREFIX)) {
                std::fs::remove_dir_all(&path).map_err(|e| crate::Error::io(&path, e))?;
            }
        }
        let dir = tempfile::Builder::new()
            .prefix(SCRATCH_PREFIX)
            .tempdir_in(data_dir)
            .map_err(|e| crate::Error::io(data_dir, e))?;
        let db = redb::Builder::new().set_cache_size(SCRATCH_CACHE_BYTES).create(dir.path().join("scratch.redb"))?;
        let scratch = AdoptionScratch { db, _dir: dir };
        scratch.record_known(store)?;
        Ok(scratch)
    }

    fn record_known(&self, store: &Store) -> Result<()> {
        let snapshot = store.snapshot()?;
        let txn = self.begin_write()?;
        {
            let mut known = txn.open_table(KNOWN)?;
            let mut mark = |key: &str, what: KnownKey| -> Result<()> {
                // A recorded archive stays recorded whatever else names its key.
                if what == KnownKey::Recorded || known.get(key)?.is_none() {
                    known.insert(key, what as u8)?;
                }
                Ok(())
            };
            snapshot.visit_claimed_buckets(|meta| {
                let Some(recorded) = &meta.manifest_key else { return Ok(()) };
                mark(recorded, KnownKey::Recorded)?;
                if let Some(amends) = snapshot.latest_manifest(&meta.id)?.and_then(|m| m.amends) {
                    mark(&amends.manifest_key, KnownKey::Replaced)?;
                    for key in &amends.lineage {
                        mark(key, KnownKey::Replaced)?;
                    }
                }
                Ok(())
            })?;
            // Manifests this data directory released (a claim's attempt that never published, a
            // replaced generation), which its sweep deletes: an expiry may have deleted a
            // segment they shared with the archive that replaced them.
            for entry in snapshot.txn().open_table(RELEASED)?.iter()? {
                let released: super::schema::ReleasedKey = super::schema::decode_value(entry?.1.value())?;
                mark(&released.key, KnownKey::Replaced)?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// Forgets the manifests listed so far (those of the previous table).
    pub fn clear_listed(&self) -> Result<()> {
        let txn = self.begin_write()?;
        txn.delete_table(LISTED)?;
        txn.commit()?;
        Ok(())
    }

    /// Records manifests listed on the target of index `target`: (key, written).
    pub fn add_listed(&self, target: u32, manifests: &[(String, Micros)]) -> Result<()> {
        let txn = self.begin_write()?;
        {
            let mut listed = txn.open_table(LISTED)?;
            for (key, written) in manifests {
                listed.insert((crate::storage::keys::folder_of(key), key.as_str(), target), *written)?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// The folders after `after` (all from the first when `None`), in order, each with every
    /// manifest listed in it: whole folders, until they hold at least `manifests_max`.
    pub fn folders_after(
        &self,
        after: Option<&str>,
        manifests_max: usize,
    ) -> Result<Vec<(String, Vec<ListedManifest>)>> {
        let txn = self.db.begin_read()?;
        let Some(listed) = open_listed(&txn)? else { return Ok(Vec::new()) };
        let known = txn.open_table(KNOWN)?;
        let from = after.map_or(Bound::Unbounded, |folder| Bound::Included((folder, "", 0)));
        let mut out: Vec<(String, Vec<ListedManifest>)> = Vec::new();
        let mut taken = 0;
        for entry in listed.range::<(&str, &str, u32)>((from, Bound::Unbounded))? {
            let (k, v) = entry?;
            let (folder, key, target) = k.value();
            if Some(folder) == after {
                continue;
            }
            let known = known
                .get(key)?
                .map(|v| if v.value() == KnownKey::Recorded as u8 { KnownKey::Recorded } else { KnownKey::Replaced });
            let found = ListedManifest { key: key.to_string(), target, written: v.value(), known };
            match out.last_mut() {
                Some((last, manifests)) if last == folder => manifests.push(found),
                _ if taken >= manifests_max => break,
                _ => out.push((folder.to_string(), vec![found])),
            }
            taken += 1;
        }
        Ok(out)
    }

    /// Whether `key` was listed on the target of index `target`.
    pub fn is_listed(&self, target: u32, key: &str) -> Result<bool> {
        let txn = self.db.begin_read()?;
        let Some(listed) = open_listed(&txn)? else { return Ok(false) };
        Ok(listed.get((crate::storage::keys::folder_of(key), key, target))?.is_some())
    }

    /// For each (target index, key) of `asked` (`None`: not asked, `false`), whether that key was
    /// listed on that target; from one read.
    pub fn are_listed(&self, asked: &[Option<(u32, String)>]) -> Result<Vec<bool>> {
        let txn = self.db.begin_read()?;
        let Some(listed) = open_listed(&txn)? else { return Ok(vec![false; asked.len()]) };
        let mut out = Vec::with_capacity(asked.len());
        for question in asked {
            out.push(match question {
                Some((target, key)) => {
                    listed.get((crate::storage::keys::folder_of(key), key.as_str(), *target))?.is_some()
                }
                None => false,
            });
        }
        Ok(out)
    }

    /// The manifests listed in `folder` on the target of index `target`.
    pub fn listed_in(&self, folder: &str, target: u32) -> Result<Vec<String>> {
        let txn = self.db.begin_read()?;
        let Some(listed) = open_listed(&txn)? else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for entry in listed.range::<(&str, &str, u32)>((folder, "", 0)..)? {
            let (k, _) = entry?;
            let (in_folder, key, on) = k.value();
            if in_folder != folder {
                break;
            }
            if on == target {
                out.push(key.to_string());
            }
        }
        Ok(out)
    }

    fn begin_write(&self) -> Result<redb::WriteTransaction> {
        let mut txn = self.db.begin_write()?;
        // Scratch: a crash loses nothing that the next run does not list again.
        txn.set_durability(redb::Durability::None)?;
        Ok(txn)
    }
}

/// The listed manifests' table; `None` before anything was listed.
fn open_listed(txn: &redb::ReadTransaction) -> Result<Option<redb::ReadOnlyTable<ListedKey, Micros>>> {
    match txn.open_table(LISTED) {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

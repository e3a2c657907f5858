//! `frostline adopt`: takes in the archives on a table's targets that the database does not
//! record, so that a data directory rebuilt from nothing, or restored from a backup while its
//! other copy went on archiving, reads, verifies and expires them again instead of leaving
//! them stranded (or, before the sweep's guard, deleting them as orphans).
//!
//! Every declared table's folder is listed on every target of the policy directory (a table's
//! archives may lie on a target it has since left). In each bucket folder the newest manifest
//! is read back and verified whole (content address, every segment's hash and row checksum,
//! the rows lie in the bucket and its partition, the manifest's own target resolves to the one
//! it was found on); if it fails, the next older one is tried. `store::adopt` then records it
//! in one transaction. A folder holding manifests of two installations is a conflict (two
//! writers of one table; which one is the archive is for an operator to say) and is left
//! alone, as is every bucket whose database record the archive cannot stand in for. A dry run
//! verifies and reports without recording. Run it with the engine stopped: it is a local
//! command on the data directory.
//!
//! Archives of another installation, in any layout, are taken in only when the operator names
//! it (`--from-installation`: a lost host): on a shared target the others belong to live
//! peers, whose retention and holds answer for them. Taking in a named installation's archives
//! on a target first leaves a claim there (`_frostline-adoptions/<installation>/<adopter>.json`,
//! created only if absent), and adoption is refused while another installation's claim stands
//! that is not itself named as lost: two hosts never both answer for one installation's
//! archives (two that claim at once both see the other's claim, withdraw their own and stop).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use super::{blocking, read_archive, read_manifest};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::storage::{ArchiveBackend, keys};
use crate::store::schema::BucketId;
use crate::store::{Adoption, VerifiedArchive};

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct AdoptReport {
    pub dry_run: bool,
    /// Bucket folders holding at least one manifest, over every table and target.
    pub folders: u64,
    /// Archives recorded as their bucket's (in a dry run: that would be).
    pub adopted: u64,
    /// Rows those archives hold.
    pub rows: u64,
    /// Hot rows released because an adopted archive holds each of them.
    pub hot_rows_released: u64,
    /// Folders whose newest verified manifest the database already records.
    pub known: u64,
    /// Buckets left alone, and why.
    pub conflicts: Vec<String>,
    /// Manifests that failed verification, and why (an older one of the folder may have been
    /// adopted instead).
    pub failures: Vec<String>,
    /// Installations whose archives lie in a shared Delta table's folders and were left alone
    /// (another host of a fleet, alive or not): named with `--from-installation` to be taken in.
    pub other_installations: BTreeSet<String>,
}

/// Takes in the archives this data directory does not record. Archives of another
/// installation, in any layout, are taken in only when it is named in `from_installations` (a
/// lost host) and no live host holds a claim on them: adopting a live host's archives would make
/// two engines answer for them.
pub async fn adopt(engine: &Arc<Engine>, dry_run: bool, from_installations: &[String]) -> Result<AdoptReport> {
    let policies = engine.policies();
    let known = recorded_manifest_keys(engine).await?;
    let mut report = AdoptReport { dry_run, ..Default::default() };
    let mut changed_tables = BTreeSet::new();
    // The claim on each (target, installation) adopted from, made once per run.
    let mut claims: BTreeMap<(String, String), std::result::Result<(), String>> = BTreeMap::new();
    for (table_id, table) in &policies.tables {
        let mut backends: Vec<&Arc<dyn ArchiveBackend>> = vec![&table.backend];
        for backend in policies.targets.values() {
            if !backends.iter().any(|b| Arc::ptr_eq(b, backend)) {
                backends.push(backend);
            }
        }
        for backend in backends {
            for (folder, mut manifests) in manifests_by_folder(backend.as_ref(), table_id).await? {
                report.folders += 1;
                let writers: BTreeSet<&str> = manifests.iter().map(|(writer, _, _)| writer.as_str()).collect();
                if writers.len() > 1 {
                    report.conflicts.push(format!(
                        "{} `{folder}` holds manifests of {} installations ({}): two writers of one table; \
                         left alone",
                        backend.target(),
                        writers.len(),
                        writers.iter().map(|w| if w.is_empty() { "none" } else { w }).collect::<Vec<_>>().join(", ")
                    ));
                    continue;
                }
                if let Some(writer) = writers.first().map(|w| w.to_string())
                    && !writer.is_empty()
                    && writer != engine.installation_id
                {
                    if !from_installations.contains(&writer) {
                        report.other_installations.insert(writer);
                        continue;
                    }
                    let claim = (backend.target().to_string(), writer.clone());
                    if !claims.contains_key(&claim) {
                        let outcome =
                            claim_adoption(engine, backend.as_ref(), &writer, from_installations, dry_run).await?;
                        claims.insert(claim.clone(), outcome);
                    }
                    if let Some(Err(why)) = claims.get(&claim) {
                        report.conflicts.push(format!("{} `{folder}`: {why}", backend.target()));
                        continue;
                    }
                }
                manifests.sort_by_key(|(_, generation, _)| std::cmp::Reverse(*generation));
                for (_, _, key) in manifests {
                    if known.contains(&key) {
                        report.known += 1;
                        break;
                    }
                    let archive = match read_verified(engine, table_id, backend, &folder, &key).await {
                        Ok(archive) => archive,
                        Err(e) => {
                            report.failures.push(format!("{}: `{key}`: {e}", backend.target()));
                            continue;
                        }
                    };
                    let rows = archive.rows.len() as u64;
                    if dry_run {
                        report.adopted += 1;
                        report.rows += rows;
                        break;
                    }
                    let (store, now) = (engine.store.clone(), engine.clock.now());
                    match blocking(move || store.adopt(archive, now)).await? {
                        Adoption::Adopted => {}
                        Adoption::Replaced { hot_rows } => report.hot_rows_released += hot_rows,
                        Adoption::Known => {
                            report.known += 1;
                            break;
                        }
                        Adoption::Conflict(why) => {
                            report.conflicts.push(why);
                            break;
                        }
                    }
                    // An archive of another copy of this data directory (its own installation,
                    // an epoch it never recorded): adopting it resolves that copy, so the
                    // sweep no longer stops on that epoch's keys (it still deletes only the
                    // keys this directory released).
                    if let Some(keys::Origin { installation, epoch: Some(epoch), .. }) = keys::origin(&key)
                        && installation == engine.installation_id
                    {
                        let (store, epoch, now) = (engine.store.clone(), epoch.to_string(), engine.clock.now());
                        blocking(move || store.record_epoch(epoch, now)).await?;
                    }
                    tracing::info!(key = %key, rows, "archive adopted");
                    report.adopted += 1;
                    report.rows += rows;
                    changed_tables.insert(table_id.clone());
                    break;
                }
            }
        }
    }
    for table in changed_tables {
        if !policies.table(&table)?.delta_log() {
            super::catalog::write(engine, &table).await?;
        }
    }
    Ok(report)
}

/// Where the claims on an installation's archives lie on a target.
pub const ADOPTIONS_PREFIX: &str = "_frostline-adoptions/";

/// One adopter's claim on another installation's archives on a target.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct AdoptionClaim {
    installation: String,
    adopted_by: String,
    at: crate::model::Micros,
}

/// Makes this installation the one that answers for `installation`'s archives on `backend`:
/// `Ok(Err(why))` when another installation, not itself named as lost, holds a claim. A dry
/// run only reads the claims.
async fn claim_adoption(
    engine: &Arc<Engine>,
    backend: &dyn ArchiveBackend,
    installation: &str,
    lost: &[String],
    dry_run: bool,
) -> Result<std::result::Result<(), String>> {
    let folder = format!("{ADOPTIONS_PREFIX}{installation}/");
    let own = format!("{folder}{}.json", engine.installation_id);
    if !dry_run {
        let claim = AdoptionClaim {
            installation: installation.to_string(),
            adopted_by: engine.installation_id.clone(),
            at: engine.clock.now(),
        };
        let bytes = serde_json::to_vec(&claim).expect("a claim serializes");
        backend.put_create(&own, bytes.into()).await?;
    }
    let rivals: Vec<String> = backend
        .list(&folder)
        .await?
        .into_iter()
        .filter_map(|o| o.key.strip_prefix(&folder)?.strip_suffix(".json").map(str::to_string))
        .filter(|adopter| *adopter != engine.installation_id && !lost.contains(adopter))
        .collect();
    if rivals.is_empty() {
        return Ok(Ok(()));
    }
    if !dry_run {
        backend.delete(&own).await?;
    }
    Ok(Err(format!(
        "installation {installation}'s archives are claimed by installation {} (`{folder}`): one installation \
         answers for them. If that host is lost too, name it with --from-installation; if it is alive, leave them \
         to it",
        rivals.join(", ")
    )))
}

/// Every manifest key the database records, from one read transaction.
async fn recorded_manifest_keys(engine: &Arc<Engine>) -> Result<HashSet<String>> {
    let store = engine.store.clone();
    blocking(move || {
        let mut keys = HashSet::new();
        store.snapshot()?.visit_buckets(|meta| {
            keys.extend(meta.manifest_key);
            Ok(())
        })?;
        Ok(keys)
    })
    .await
}

/// A table's manifests on one target, by the folder they lie in: (installation, generation, key).
async fn manifests_by_folder(
    backend: &dyn ArchiveBackend,
    table: &str,
) -> Result<BTreeMap<String, Vec<(String, u64, String)>>> {
    let mut folders: BTreeMap<String, Vec<(String, u64, String)>> = BTreeMap::new();
    for prefix in keys::table_folders(table) {
        for object in backend.list(&prefix).await? {
            if let Some((writer, generation)) = keys::manifest_origin(&object.key) {
                let entry = (writer.to_string(), generation, object.key.clone());
                folders.entry(keys::folder_of(&object.key).to_string()).or_default().push(entry);
            }
        }
    }
    Ok(folders)
}

/// Reads a manifest and every row of its segments back, verifying each, and checks that the
/// archive belongs where it was found.
async fn read_verified(
    engine: &Arc<Engine>,
    table: &str,
    backend: &Arc<dyn ArchiveBackend>,
    folder: &str,
    key: &str,
) -> Result<VerifiedArchive> {
    let manifest = read_manifest(backend.as_ref(), key).await?;
    if manifest.table != table {
        return Err(Error::Corruption(format!("the manifest names table `{}`", manifest.table)));
    }
    let policies = engine.policies();
    let recorded = policies.archive_backend(policies.table(table)?, &manifest.archive_target())?;
    if !Arc::ptr_eq(&recorded, backend) {
        return Err(Error::Conflict(format!(
            "the manifest records target {}, which the policy directory resolves to {}, not the target it lies on; \
             declare the target it records",
            manifest.archive_target(),
            recorded.target()
        )));
    }
    let rows = read_archive(backend.as_ref(), key, None, None).await?;
    let summary = crate::model::rows::summarize(&rows);
    if summary != manifest.summary {
        return Err(Error::Corruption("the row checksum of the segments differs from the manifest".into()));
    }
    let partition_key = rows.first().map(|r| r.partition_key.clone()).unwrap_or_default();
    if let Some(stray) =
        rows.iter().find(|r| r.partition_key != partition_key || !manifest.bucket.contains(r.event_time))
    {
        return Err(Error::Corruption(format!(
            "row at {} of partition `{}` lies outside the bucket [{}, {}) of partition `{}`",
            stray.event_time,
            String::from_utf8_lossy(&stray.partition_key),
            manifest.bucket.start,
            manifest.bucket.end,
            String::from_utf8_lossy(&partition_key)
        )));
    }
    let id = BucketId { table: table.to_string(), bucket_key: manifest.bucket.key.clone(), partition_key };
    let writer = keys::manifest_origin(key).map_or("", |(writer, _)| writer);
    let layouts = [keys::Layout::Hive, keys::Layout::Delta];
    if !layouts
        .iter()
        .any(|l| keys::manifest_folder(*l, &id.table, writer, &id.bucket_key, &id.partition_key) == folder)
    {
        return Err(Error::Corruption(format!(
            "the manifest describes bucket {id}, which does not live in `{folder}`"
        )));
    }
    Ok(VerifiedArchive { id, manifest_key: key.to_string(), manifest, rows })
}

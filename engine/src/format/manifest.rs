//! The manifest: the published description of one archived bucket. Created last, content-
//! addressed like the segments, and recorded in the hot store at publication.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Format;
use crate::error::{Error, Result};
use crate::model::rows::RowSummary;
use crate::model::{BucketDescriptor, Micros, RetentionPlan};

pub const MANIFEST_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentInfo {
    pub key: String,
    pub sha256: String,
    pub bytes: u64,
    pub rows: u64,
    pub min_event_time: Micros,
    pub max_event_time: Micros,
    pub summary: RowSummary,
    /// Statistics of the columns a Parquet segment carries beside the record (its typed
    /// columns, `tenant` and `kind`), which a Delta log's `add` action repeats; empty for other
    /// formats and in manifests written before they were kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<crate::model::columns::ColumnStats>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub table: String,
    pub partition_key: String,
    pub bucket: BucketDescriptor,
    /// The strategy that made the bucket: name, plugin hash, configuration fingerprint.
    pub strategy: String,
    pub generation: u64,
    pub format: Format,
    /// The columns of the segments' rows, in words, for readers that come without frostline.
    #[serde(default)]
    pub schema: String,
    /// Where the archive was written (store URL and prefix), so a table can move later.
    pub target: String,
    /// The name of that target in the policy directory (empty in manifests of earlier
    /// versions, which are matched by URL). Reads, verification and expiry use this target,
    /// not the table's current one.
    #[serde(default)]
    pub target_name: String,
    /// The retention plan in force when the bucket was archived, for audits.
    pub policy: Option<RetentionPlan>,
    pub summary: RowSummary,
    pub bytes: u64,
    pub segments: Vec<SegmentInfo>,
    pub created_at: Micros,
    /// Present on a generation that took in rows appended after an earlier generation was
    /// published (late records, a backfill): which archive it replaces, and the summary of the
    /// hot rows it added, which the cleanup proves before deleting them (invariant 9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amends: Option<Amendment>,
    /// Which shared erasure requests this generation answers for, so that a host adopting it
    /// once its writer is lost can tell which of them its rows still owe (`archive::adopt`).
    /// Absent in manifests of earlier versions, and where the writer did not share erasures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erasures: Option<ErasuresAnswered>,
}

/// What the writer of a generation knew of the fleet's erasure requests when it wrote it.
/// A request answers for its records when the writer took it up (it was carried out on the
/// bucket, or the bucket held none of its records then); a request the writer never heard of
/// may still name records of this generation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErasuresAnswered {
    /// When the writer's installation began: a request placed before then named none of its
    /// records, and the writer passed it over (`archive::fleet_erase`).
    pub installation_since: Micros,
    /// The requests open in the writer's store that may name a record of the bucket and that
    /// this generation answers for (the bucket's part is done, it was not matched when the
    /// request was placed, or this generation leaves the named records out), and those that
    /// finished and whose receipt the writer had not yet left on the target. A request that
    /// finished with its receipt on the target answers for every archive its writer wrote
    /// after it finished (`archive::adopt::receipt_answers_for`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<String>,
}

/// What a generation that replaces an earlier one took from where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Amendment {
    /// The generation it replaces and that generation's manifest key.
    pub generation: u64,
    pub manifest_key: String,
    /// The manifest keys of every earlier generation of this chain, oldest first, ending with
    /// `manifest_key`: a copy of the data directory that recorded any of them can tell this
    /// archive is its successor by key, not by generation number (a copy restored from a backup,
    /// or another installation that adopted a stale generation, reaches the same numbers on a
    /// fork of its own).
    #[serde(default)]
    pub lineage: Vec<String>,
    /// The hot rows merged into the replaced generation's rows (count, key range, checksum).
    pub hot_rows: RowSummary,
}

impl Manifest {
    /// Whether this archive is a later generation of the chain that went through `key`.
    pub fn descends_from(&self, key: &str) -> bool {
        self.amends.as_ref().is_some_and(|a| a.manifest_key == key || a.lineage.iter().any(|k| k == key))
    }

    /// The rows the hot store held for this archive: all of them for a first generation, the
    /// rows merged in for a later one.
    pub fn hot_rows(&self) -> &RowSummary {
        self.amends.as_ref().map_or(&self.summary, |a| &a.hot_rows)
    }
}

impl Manifest {
    /// The target this archive was written to.
    pub fn archive_target(&self) -> crate::model::ArchiveTarget {
        crate::model::ArchiveTarget { name: self.target_name.clone(), url: self.target.clone() }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a manifest always serializes")
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Manifest> {
        let manifest: Manifest =
            serde_json::from_slice(bytes).map_err(|e| Error::Corruption(format!("manifest does not parse: {e}")))?;
        if manifest.version > MANIFEST_VERSION {
            return Err(Error::Corruption(format!(
                "manifest version {} is newer than this binary's {MANIFEST_VERSION}",
                manifest.version
            )));
        }
        Ok(manifest)
    }

    /// Checks that the segments add up to the manifest's totals.
    pub fn check_consistent(&self) -> Result<()> {
        let rows: u64 = self.segments.iter().map(|s| s.rows).sum();
        let bytes: u64 = self.segments.iter().map(|s| s.bytes).sum();
        if rows != self.summary.rows || bytes != self.bytes {
            return Err(Error::Corruption(format!(
                "manifest totals rows={} bytes={} differ from its segments rows={rows} bytes={bytes}",
                self.summary.rows, self.bytes
            )));
        }
        if let Some(amends) = &self.amends
            && (amends.hot_rows.rows > self.summary.rows || amends.generation >= self.generation)
        {
            return Err(Error::Corruption(format!(
                "manifest of generation {} amends generation {} with {} hot rows of {} in all",
                self.generation, amends.generation, amends.hot_rows.rows, self.summary.rows
            )));
        }
        Ok(())
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

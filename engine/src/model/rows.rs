//! The row summary that ties a manifest to the hot rows it holds: count, first and last
//! clustering key, and a checksum over every row's canonical encoding. Segments, manifests and
//! the cleanup transaction compute it the same way (invariant 9).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{Micros, Record};

/// A position in a bucket's clustering order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClusteringKey {
    pub event_time: Micros,
    pub sort_key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowSummary {
    pub rows: u64,
    pub first: Option<ClusteringKey>,
    pub last: Option<ClusteringKey>,
    /// Hex SHA-256 over the canonical encoding of every row, in key order.
    pub checksum: String,
}

/// Accumulates a `RowSummary` one row at a time, in key order.
pub struct RowSummer {
    rows: u64,
    first: Option<ClusteringKey>,
    last: Option<ClusteringKey>,
    hasher: Sha256,
}

impl Default for RowSummer {
    fn default() -> Self {
        RowSummer { rows: 0, first: None, last: None, hasher: Sha256::new() }
    }
}

fn put_field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

fn put_optional(hasher: &mut Sha256, value: Option<&str>) {
    match value {
        None => hasher.update([0u8]),
        Some(v) => {
            hasher.update([1u8]);
            put_field(hasher, v.as_bytes());
        }
    }
}

impl RowSummer {
    pub fn push(&mut self, record: &Record) {
        let key = ClusteringKey {
            event_time: record.event_time,
            sort_key: String::from_utf8_lossy(&record.sort_key).into_owned(),
        };
        put_field(&mut self.hasher, &record.partition_key);
        self.hasher.update(record.event_time.to_be_bytes());
        put_field(&mut self.hasher, &record.sort_key);
        put_optional(&mut self.hasher, record.tenant.as_deref());
        put_optional(&mut self.hasher, record.kind.as_deref());
        put_field(&mut self.hasher, record.body.as_bytes());
        if self.first.is_none() {
            self.first = Some(key.clone());
        }
        self.last = Some(key);
        self.rows += 1;
    }

    pub fn finish(self) -> RowSummary {
        RowSummary {
            rows: self.rows,
            first: self.first,
            last: self.last,
            checksum: hex::encode(self.hasher.finalize()),
        }
    }
}

pub fn summarize<'a>(records: impl IntoIterator<Item = &'a Record>) -> RowSummary {
    let mut summer = RowSummer::default();
    for r in records {
        summer.push(r);
    }
    summer.finish()
}

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

/// One row's fields, borrowed: what the summary hashes.
#[derive(Debug, Clone, Copy)]
pub struct RowFields<'a> {
    pub partition_key: &'a [u8],
    pub event_time: Micros,
    pub sort_key: &'a [u8],
    pub tenant: Option<&'a str>,
    pub kind: Option<&'a str>,
    pub body: &'a str,
}

impl<'a> RowFields<'a> {
    pub fn of(record: &'a Record) -> Self {
        RowFields {
            partition_key: &record.partition_key,
            event_time: record.event_time,
            sort_key: &record.sort_key,
            tenant: record.tenant.as_deref(),
            kind: record.kind.as_deref(),
            body: &record.body,
        }
    }
}

/// Accumulates a `RowSummary` one row at a time, in key order.
pub struct RowSummer {
    rows: u64,
    first: Option<ClusteringKey>,
    /// The last row's clustering key, kept as bytes and turned into text once at the end.
    last: Option<(Micros, Vec<u8>)>,
    /// Whether every row came after the one before in clustering order (by the key's bytes).
    strictly_increasing: bool,
    hasher: Sha256,
}

impl Default for RowSummer {
    fn default() -> Self {
        RowSummer { rows: 0, first: None, last: None, strictly_increasing: true, hasher: Sha256::new() }
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

fn clustering_key(event_time: Micros, sort_key: &[u8]) -> ClusteringKey {
    ClusteringKey { event_time, sort_key: String::from_utf8_lossy(sort_key).into_owned() }
}

impl RowSummer {
    pub fn push(&mut self, record: &Record) {
        self.push_fields(RowFields::of(record));
    }

    pub fn push_fields(&mut self, row: RowFields<'_>) {
        put_field(&mut self.hasher, row.partition_key);
        self.hasher.update(row.event_time.to_be_bytes());
        put_field(&mut self.hasher, row.sort_key);
        put_optional(&mut self.hasher, row.tenant);
        put_optional(&mut self.hasher, row.kind);
        put_field(&mut self.hasher, row.body.as_bytes());
        if self.first.is_none() {
            self.first = Some(clustering_key(row.event_time, row.sort_key));
        }
        if let Some((time, sort_key)) = &self.last
            && (row.event_time, row.sort_key) <= (*time, sort_key.as_slice())
        {
            self.strictly_increasing = false;
        }
        let last = self.last.get_or_insert_with(|| (0, Vec::new()));
        last.0 = row.event_time;
        last.1.clear();
        last.1.extend_from_slice(row.sort_key);
        self.rows += 1;
    }

    /// Whether the rows pushed so far came in strictly increasing clustering order: then no
    /// row was seen twice, and rows that a table holds in that order are all of them exactly
    /// when their count is the table's length (what the cleanup's proof relies on).
    pub fn strictly_increasing(&self) -> bool {
        self.strictly_increasing
    }

    pub fn finish(self) -> RowSummary {
        RowSummary {
            rows: self.rows,
            first: self.first,
            last: self.last.map(|(event_time, sort_key)| clustering_key(event_time, &sort_key)),
            checksum: hex::encode(self.hasher.finalize()),
        }
    }
}

/// The count and the first and last clustering keys of a set of rows: what a table says of its
/// rows without reading the ones between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowExtent {
    pub rows: u64,
    pub first: Option<ClusteringKey>,
    pub last: Option<ClusteringKey>,
}

impl RowExtent {
    pub fn new(rows: u64, first: Option<(Micros, &[u8])>, last: Option<(Micros, &[u8])>) -> RowExtent {
        let key = |k: Option<(Micros, &[u8])>| k.map(|(event_time, sort_key)| clustering_key(event_time, sort_key));
        RowExtent { rows, first: key(first), last: key(last) }
    }
}

pub fn summarize<'a>(records: impl IntoIterator<Item = &'a Record>) -> RowSummary {
    let mut summer = RowSummer::default();
    for r in records {
        summer.push(r);
    }
    summer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(event_time: Micros, sort_key: &str) -> Record {
        Record {
            partition_key: b"p".to_vec(),
            event_time,
            sort_key: sort_key.as_bytes().to_vec(),
            tenant: None,
            kind: None,
            body: "{}".into(),
        }
    }

    #[test]
    fn a_summer_knows_whether_its_rows_came_in_strictly_increasing_key_order() {
        let in_order = |rows: &[Record]| {
            let mut summer = RowSummer::default();
            rows.iter().for_each(|r| summer.push(r));
            summer.strictly_increasing()
        };
        assert!(in_order(&[]));
        assert!(in_order(&[row(1, "b")]));
        assert!(in_order(&[row(1, "a"), row(1, "b"), row(2, "a")]));
        assert!(in_order(&[row(1, "a"), row(1, "a\0")]), "by the key's bytes");
        assert!(!in_order(&[row(1, "a"), row(1, "a")]), "a row seen twice");
        assert!(!in_order(&[row(1, "b"), row(1, "a")]));
        assert!(!in_order(&[row(2, "a"), row(1, "z")]));
        assert!(!in_order(&[row(1, "a"), row(2, "a"), row(3, "a"), row(3, "a")]), "anywhere in the run");
    }

    #[test]
    fn an_extent_names_the_same_keys_as_the_summary_of_the_same_rows() {
        let rows = [row(1, "a"), row(5, "b"), row(9, "c")];
        let summary = summarize(&rows);
        let extent = RowExtent::new(3, Some((1, b"a")), Some((9, b"c")));
        assert_eq!((extent.rows, &extent.first, &extent.last), (summary.rows, &summary.first, &summary.last));
    }
}

//! JSON-lines segments: one record per line, in clustering order. The body is embedded as raw
//! JSON, so a reader needs nothing but a JSON parser.

use serde::{Deserialize, Serialize};

use super::{SEGMENT_BYTES_MAX, SEGMENT_ROWS_MAX};
use crate::error::{Error, Result};
use crate::model::rows::{RowSummary, summarize};
use crate::model::{Micros, Record};

#[derive(Serialize, Deserialize)]
struct Line<'a> {
    partition_key: std::borrow::Cow<'a, str>,
    event_time: Micros,
    sort_key: std::borrow::Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    body: &'a serde_json::value::RawValue,
}

/// One encoded segment before upload.
pub struct EncodedSegment {
    pub bytes: Vec<u8>,
    pub rows: u64,
    pub min_event_time: Micros,
    pub max_event_time: Micros,
    pub summary: RowSummary,
}

/// Appends one record as a JSON line (with its newline) to `out`.
pub fn encode_line(record: &Record, out: &mut Vec<u8>) -> Result<()> {
    let body: &serde_json::value::RawValue =
        serde_json::from_str(&record.body).map_err(|e| Error::Corruption(format!("a stored body is not JSON: {e}")))?;
    let line = Line {
        partition_key: String::from_utf8_lossy(&record.partition_key),
        event_time: record.event_time,
        sort_key: String::from_utf8_lossy(&record.sort_key),
        tenant: record.tenant.as_deref().map(Into::into),
        kind: record.kind.as_deref().map(Into::into),
        body,
    };
    serde_json::to_writer(&mut *out, &line).map_err(|e| Error::Internal(format!("encoding a row: {e}")))?;
    out.push(b'\n');
    Ok(())
}

/// Splits rows (already in clustering order) into segments of at most `SEGMENT_ROWS_MAX`
/// rows and `SEGMENT_BYTES_MAX` bytes.
pub fn encode_segments(records: &[Record]) -> Result<Vec<EncodedSegment>> {
    let mut segments = Vec::new();
    let mut start = 0;
    let mut buffer = Vec::new();
    let mut line = Vec::new();
    for (i, record) in records.iter().enumerate() {
        line.clear();
        encode_line(record, &mut line)?;
        let full =
            i - start >= SEGMENT_ROWS_MAX || (!buffer.is_empty() && buffer.len() + line.len() > SEGMENT_BYTES_MAX);
        if full {
            segments.push(finish(&records[start..i], std::mem::take(&mut buffer)));
            start = i;
        }
        buffer.extend_from_slice(&line);
    }
    if start < records.len() {
        segments.push(finish(&records[start..], buffer));
    }
    Ok(segments)
}

fn finish(records: &[Record], bytes: Vec<u8>) -> EncodedSegment {
    EncodedSegment {
        bytes,
        rows: records.len() as u64,
        min_event_time: records.iter().map(|r| r.event_time).min().unwrap_or(0),
        max_event_time: records.iter().map(|r| r.event_time).max().unwrap_or(0),
        summary: summarize(records),
    }
}

/// Parses every line of a segment back into records.
pub fn decode_segment(bytes: &[u8]) -> Result<Vec<Record>> {
    let text = std::str::from_utf8(bytes).map_err(|e| Error::Corruption(format!("segment is not UTF-8: {e}")))?;
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line: Line<'_> = serde_json::from_str(raw)
            .map_err(|e| Error::Corruption(format!("segment line {} does not parse: {e}", n + 1)))?;
        out.push(Record {
            partition_key: line.partition_key.into_owned().into_bytes(),
            event_time: line.event_time,
            sort_key: line.sort_key.into_owned().into_bytes(),
            tenant: line.tenant.map(|c| c.into_owned()),
            kind: line.kind.map(|c| c.into_owned()),
            body: line.body.get().to_string(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: i64, body_len: usize) -> Record {
        Record {
            partition_key: b"p".to_vec(),
            event_time: i,
            sort_key: format!("{i:08}").into_bytes(),
            tenant: (i % 2 == 0).then(|| "acme".into()),
            kind: None,
            body: format!("{{\"x\":\"{}\"}}", "a".repeat(body_len)),
        }
    }

    #[test]
    fn segments_respect_row_and_byte_limits_and_round_trip() {
        let rows: Vec<Record> = (0..25_000).map(|i| record(i, 10)).collect();
        let segments = encode_segments(&rows).unwrap();
        assert_eq!(segments.iter().map(|s| s.rows).collect::<Vec<_>>(), vec![10_000, 10_000, 5_000]);
        let decoded: Vec<Record> = segments.iter().flat_map(|s| decode_segment(&s.bytes).unwrap()).collect();
        assert_eq!(decoded, rows);

        let big: Vec<Record> = (0..20).map(|i| record(i, 1024 * 1024)).collect();
        let segments = encode_segments(&big).unwrap();
        assert!(segments.iter().all(|s| s.bytes.len() <= SEGMENT_BYTES_MAX), "byte limit holds");
        assert!(segments.len() >= 3);
        assert_eq!(segments.iter().map(|s| s.rows).sum::<u64>(), 20);
    }
}

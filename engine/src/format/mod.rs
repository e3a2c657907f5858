//! Archive formats: how a bucket's rows become segments and how a manifest describes them.
//! Pure encoding and verification; no I/O. Every format round-trips every field exactly, and
//! every segment is split by the same rule, so the choice of format changes nothing else.

pub mod jsonl;
pub mod manifest;
pub mod msgpack;
pub mod parquet;
pub mod reader;

use crate::error::Result;
use crate::model::columns::{ColumnSpec, ColumnStats};
use crate::model::rows::{RowSummary, summarize};
use crate::model::{Micros, Record};

/// A segment holds at most this many rows...
pub const SEGMENT_ROWS_MAX: usize = 10_000;
/// ...and at most this many bytes of rows as JSON lines (a single larger row gets a segment of
/// its own). Compressed formats come out smaller than this.
pub const SEGMENT_BYTES_MAX: usize = 8 * 1024 * 1024;

/// The format of a table's segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// One JSON object per line; the body embedded as JSON.
    #[default]
    Jsonl,
    /// Apache Parquet, zstd-compressed, one row group per segment with statistics.
    Parquet,
    /// MessagePack: one array of rows per segment.
    Msgpack,
}

impl Format {
    pub fn extension(self) -> &'static str {
        match self {
            Format::Jsonl => "jsonl",
            Format::Parquet => "parquet",
            Format::Msgpack => "msgpack",
        }
    }

    /// The columns of a row in this format, recorded in every manifest.
    pub fn schema(self) -> &'static str {
        match self {
            Format::Jsonl | Format::Msgpack => {
                "partition_key: string, event_time: int64 (microseconds since the Unix epoch, UTC), sort_key: string, \
                 tenant: string?, kind: string?, body: JSON"
            }
            Format::Parquet => parquet::SCHEMA_DESCRIPTION,
        }
    }

    /// `schema`, with the typed columns a Parquet segment carries beside them.
    pub fn schema_with(self, columns: &[ColumnSpec]) -> String {
        let mut out = self.schema().to_string();
        if self == Format::Parquet {
            for column in columns {
                out.push_str(&format!(", {} {} (nullable, from `{}`)", column.name, column.kind.name(), column.from));
            }
        }
        out
    }

    pub fn encode(self, records: &[Record]) -> Result<Vec<u8>> {
        match self {
            Format::Jsonl => {
                let mut out = Vec::new();
                for r in records {
                    jsonl::encode_line(r, &mut out)?;
                }
                Ok(out)
            }
            Format::Parquet => parquet::encode(records, &[]).map(|(bytes, _)| bytes),
            Format::Msgpack => msgpack::encode(records),
        }
    }

    /// The row summary of a segment's bytes: JSON lines and Parquet are summed as they are
    /// read, without building records; MessagePack is decoded first.
    pub fn summarize(self, bytes: &[u8]) -> Result<RowSummary> {
        match self {
            Format::Jsonl => jsonl::summarize_segment(bytes),
            Format::Parquet => parquet::summarize_segment(bytes),
            Format::Msgpack => Ok(summarize(&self.decode(bytes)?)),
        }
    }

    pub fn decode(self, bytes: &[u8]) -> Result<Vec<Record>> {
        match self {
            Format::Jsonl => jsonl::decode_segment(bytes),
            Format::Parquet => parquet::decode(bytes),
            Format::Msgpack => msgpack::decode(bytes),
        }
    }
}

/// One encoded segment before upload.
pub struct EncodedSegment {
    pub bytes: Vec<u8>,
    pub rows: u64,
    pub min_event_time: Micros,
    pub max_event_time: Micros,
    pub summary: RowSummary,
    /// Statistics of the columns a Parquet segment carries beside the record (`ColumnStats`).
    pub columns: Vec<ColumnStats>,
}

/// Splits rows (already in clustering order) into segments of at most `SEGMENT_ROWS_MAX` rows
/// and `SEGMENT_BYTES_MAX` bytes of JSON lines, and encodes each in `format` (a Parquet
/// segment with the table's typed `columns`).
pub fn encode_segments(format: Format, columns: &[ColumnSpec], records: &[Record]) -> Result<Vec<EncodedSegment>> {
    let mut segments = Vec::new();
    let mut start = 0;
    // The segment's size as JSON lines, what the byte limit counts; a JSON-lines segment keeps
    // the lines themselves as its bytes, so that format is encoded once. The other formats
    // keep only the count: copying every line cost a Parquet pass a copy of each body.
    let mut lines = Vec::new();
    let mut lines_bytes = 0;
    let mut line = Vec::new();
    for (i, record) in records.iter().enumerate() {
        line.clear();
        jsonl::encode_line(record, &mut line)?;
        let full = i - start >= SEGMENT_ROWS_MAX || (lines_bytes > 0 && lines_bytes + line.len() > SEGMENT_BYTES_MAX);
        if full {
            segments.push(finish(format, columns, &records[start..i], std::mem::take(&mut lines))?);
            start = i;
            lines_bytes = 0;
        }
        lines_bytes += line.len();
        if format == Format::Jsonl {
            lines.extend_from_slice(&line);
        }
    }
    if start < records.len() {
        segments.push(finish(format, columns, &records[start..], lines)?);
    }
    Ok(segments)
}

fn finish(format: Format, columns: &[ColumnSpec], records: &[Record], lines: Vec<u8>) -> Result<EncodedSegment> {
    let (bytes, column_stats) = match format {
        Format::Jsonl => (lines, Vec::new()),
        Format::Parquet => parquet::encode(records, columns)?,
        Format::Msgpack => (format.encode(records)?, Vec::new()),
    };
    Ok(EncodedSegment {
        bytes,
        columns: column_stats,
        rows: records.len() as u64,
        min_event_time: records.iter().map(|r| r.event_time).min().unwrap_or(0),
        max_event_time: records.iter().map(|r| r.event_time).max().unwrap_or(0),
        summary: summarize(records),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: i64, body_len: usize) -> Record {
        Record {
            partition_key: "pé/1".as_bytes().to_vec(),
            event_time: i - 5,
            sort_key: format!("{i:08}").into_bytes(),
            tenant: (i % 2 == 0).then(|| "acme".into()),
            kind: (i % 3 == 0).then(|| "audit".into()),
            body: format!("{{\"x\":\"{}\",\"n\":[1,2.5,null,true]}}", "a".repeat(body_len)),
        }
    }

    #[test]
    fn every_format_round_trips_and_respects_the_limits() {
        let rows: Vec<Record> = (0..25_000).map(|i| record(i, 10)).collect();
        for format in [Format::Jsonl, Format::Parquet, Format::Msgpack] {
            let segments = encode_segments(format, &[], &rows).unwrap();
            assert_eq!(segments.iter().map(|s| s.rows).collect::<Vec<_>>(), vec![10_000, 10_000, 5_000], "{format:?}");
            let decoded: Vec<Record> = segments.iter().flat_map(|s| format.decode(&s.bytes).unwrap()).collect();
            assert_eq!(decoded, rows, "{format:?}");
            for segment in &segments {
                assert_eq!(format.summarize(&segment.bytes).unwrap(), segment.summary, "{format:?}");
            }
        }
        let big: Vec<Record> = (0..20).map(|i| record(i, 1024 * 1024)).collect();
        for format in [Format::Jsonl, Format::Parquet, Format::Msgpack] {
            let segments = encode_segments(format, &[], &big).unwrap();
            assert!(segments.len() >= 3, "{format:?}");
            assert!(segments.iter().all(|s| s.bytes.len() <= SEGMENT_BYTES_MAX), "{format:?}");
            assert_eq!(segments.iter().map(|s| s.rows).sum::<u64>(), 20);
            for segment in &segments {
                assert_eq!(format.summarize(&segment.bytes).unwrap(), segment.summary, "{format:?}");
            }
        }
    }

    /// A Parquet segment stores `body` without a dictionary (bodies are mostly unique, and a
    /// dictionary's per-row indices do not compress), while bodies that repeat still fold.
    #[test]
    fn a_parquet_segment_stores_bodies_without_a_dictionary_and_still_folds_repeated_ones() {
        use ::parquet::basic::Encoding;
        use ::parquet::file::reader::{FileReader, SerializedFileReader};
        let body_encodings = |bytes: &[u8]| {
            let reader = SerializedFileReader::new(bytes::Bytes::copy_from_slice(bytes)).unwrap();
            let row_group = reader.metadata().row_group(0);
            let body = row_group.columns().iter().find(|c| c.column_path().string() == "body").unwrap();
            body.encodings().collect::<Vec<Encoding>>()
        };
        let unique: Vec<Record> = (0..6_250).map(|i| record(i, 40)).collect();
        let segment = &encode_segments(Format::Parquet, &[], &unique).unwrap()[0];
        let encodings = body_encodings(&segment.bytes);
        assert!(
            !encodings.iter().any(|e| matches!(e, Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY)),
            "{encodings:?}"
        );
        let repeated: Vec<Record> =
            (0..10_000).map(|i| Record { body: r#"{"ok": true, "site": "a/%20=ü"}"#.into(), ..record(i, 0) }).collect();
        let segment = &encode_segments(Format::Parquet, &[], &repeated).unwrap()[0];
        assert!(segment.bytes.len() < 64 * 1024, "{} bytes for 10,000 rows of one body", segment.bytes.len());
        assert_eq!(Format::Parquet.decode(&segment.bytes).unwrap(), repeated);
    }

    /// Bodies of about 1 MiB, as users send them, with a typed column of a 1 KiB string and one
    /// of users' keys: each segment stays within its byte limit, round trips exactly, carries
    /// the typed values, and keeps no bound for the long string (a truncated one would lie).
    #[test]
    fn typed_columns_of_large_bodies_round_trip_and_keep_no_bound_for_a_long_string() {
        use crate::model::columns::{ColumnType, OnMismatch};
        let spec = |name: &str, kind| ColumnSpec { on_mismatch: OnMismatch::Null, ..ColumnSpec::nullable(name, kind) };
        let columns =
            [spec("note", ColumnType::String), spec("site", ColumnType::String), spec("n", ColumnType::Int64)];
        let rows: Vec<Record> = (0..12)
            .map(|i| Record {
                body: serde_json::json!({
                    "pad": "p".repeat(1024 * 1024),
                    "note": format!("{i}{}", "ü".repeat(512)),
                    "site": format!("site a/%20=ü {i}"),
                    "n": i,
                })
                .to_string(),
                ..record(i, 0)
            })
            .collect();
        let segments = encode_segments(Format::Parquet, &columns, &rows).unwrap();
        assert!(segments.len() >= 2, "1 MiB bodies fill segments by bytes");
        assert!(segments.iter().all(|s| s.bytes.len() <= SEGMENT_BYTES_MAX));
        let decoded: Vec<Record> = segments.iter().flat_map(|s| Format::Parquet.decode(&s.bytes).unwrap()).collect();
        assert_eq!(decoded, rows);
        let mut sites = Vec::new();
        for segment in &segments {
            let [note, site, n] = &segment.columns[2..] else { panic!("{:?}", segment.columns) };
            assert_eq!(
                (note.min.as_ref(), note.max.as_ref(), note.nulls),
                (None, None, 0),
                "a 1 KiB string keeps no bound"
            );
            assert!(site.min.is_some() && n.min.is_some() && n.max.is_some(), "{site:?} {n:?}");
            let reader = ::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
                bytes::Bytes::copy_from_slice(&segment.bytes),
            )
            .unwrap()
            .build()
            .unwrap();
            for batch in reader {
                let batch = batch.unwrap();
                let typed = batch.column_by_name("site").unwrap();
                let typed = typed.as_any().downcast_ref::<arrow_array::StringArray>().unwrap();
                sites.extend(typed.iter().map(|v| v.unwrap().to_string()));
            }
        }
        assert_eq!(sites, (0..12).map(|i| format!("site a/%20=ü {i}")).collect::<Vec<_>>());
    }

    #[test]
    fn corrupted_segments_do_not_decode_silently() {
        let rows: Vec<Record> = (0..100).map(|i| record(i, 10)).collect();
        for format in [Format::Parquet, Format::Msgpack] {
            let mut bytes = format.encode(&rows).unwrap();
            let cut = bytes.len() / 2;
            bytes.truncate(cut);
            assert!(format.decode(&bytes).is_err(), "{format:?}");
            assert!(format.summarize(&bytes).is_err(), "{format:?}");
        }
        // A body that is not JSON, past the reader's first batch of rows: a Parquet segment's
        // summary refuses it as its decode does, naming the row by its place in the segment.
        let mut rows: Vec<Record> = (0..2_000).map(|i| record(i, 3)).collect();
        rows[1_500].body = "{\"x\": tru".into();
        let (bytes, _) = parquet::encode(&rows, &[]).unwrap();
        for error in [Format::Parquet.decode(&bytes).unwrap_err(), Format::Parquet.summarize(&bytes).unwrap_err()] {
            assert!(error.to_string().contains("row 1501: body is not JSON"), "{error}");
        }
    }
}

//! Apache Parquet segments that other engines read directly (DuckDB, Spark, Trino): one row
//! group per segment, zstd compression (but for the columns of few values in a small
//! segment), row-group statistics, event time as TIMESTAMP(MICROS) adjusted to UTC, the body
//! as a JSON string.

use std::sync::Arc;

use arrow_array::builder::{StringBuilder, TimestampMicrosecondBuilder};
use arrow_array::{Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::error::{Error, Result};
use crate::model::Record;

pub const ZSTD_LEVEL: i32 = 3;
/// Rows from which every column of a segment is compressed. Below it the columns whose pages
/// are dictionary-encoded runs of a few values (`UNCOMPRESSED_WHEN_SMALL`) are not: a reader
/// makes a zstd codec (a compression and a decompression context) for each compressed column
/// of each file, which cost a read of many small day buckets more than those pages hold
/// (measured: 18 % of `frostline query` over 1,095 segments of 100 rows, whose
/// `partition_key`, `tenant` and `kind` pages are smaller uncompressed: 49 bytes against 67).
pub const SMALL_COLUMNS_COMPRESSED_ROWS_MIN: usize = 10_000;
/// The columns left uncompressed in a segment of fewer rows than that: one partition per
/// bucket, and tenants and kinds of a few values each.
const UNCOMPRESSED_WHEN_SMALL: [&str; 3] = ["partition_key", "tenant", "kind"];
pub const SCHEMA_DESCRIPTION: &str = "parquet: partition_key UTF8, event_time TIMESTAMP(MICROS, UTC), sort_key UTF8, \
     tenant UTF8 (nullable), kind UTF8 (nullable), body UTF8 (JSON text)";

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("partition_key", DataType::Utf8, false),
        Field::new("event_time", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
        Field::new("sort_key", DataType::Utf8, false),
        Field::new("tenant", DataType::Utf8, true),
        Field::new("kind", DataType::Utf8, true),
        Field::new("body", DataType::Utf8, false),
    ]))
}

fn encoding_error(e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("encoding a Parquet segment: {e}"))
}

pub fn encode(records: &[Record]) -> Result<Vec<u8>> {
    let mut partition = StringBuilder::new();
    let mut time = TimestampMicrosecondBuilder::new().with_timezone("UTC");
    let mut sort = StringBuilder::new();
    let mut tenant = StringBuilder::new();
    let mut kind = StringBuilder::new();
    let mut body = StringBuilder::new();
    for r in records {
        partition.append_value(String::from_utf8_lossy(&r.partition_key));
        time.append_value(r.event_time);
        sort.append_value(String::from_utf8_lossy(&r.sort_key));
        tenant.append_option(r.tenant.as_deref());
        kind.append_option(r.kind.as_deref());
        body.append_value(&r.body);
    }
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(partition.finish()),
            Arc::new(time.finish()),
            Arc::new(sort.finish()),
            Arc::new(tenant.finish()),
            Arc::new(kind.finish()),
            Arc::new(body.finish()),
        ],
    )
    .map_err(encoding_error)?;
    let mut properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL).map_err(encoding_error)?));
    if records.len() < SMALL_COLUMNS_COMPRESSED_ROWS_MIN {
        for name in UNCOMPRESSED_WHEN_SMALL {
            properties = properties.set_column_compression(ColumnPath::from(name), Compression::UNCOMPRESSED);
        }
    }
    let properties = properties
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_max_row_group_row_count(Some(crate::format::SEGMENT_ROWS_MAX))
        .set_created_by("frostline".into())
        .build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema(), Some(properties)).map_err(encoding_error)?;
    writer.write(&batch).map_err(encoding_error)?;
    writer.close().map_err(encoding_error)?;
    Ok(out)
}

fn corrupt(e: impl std::fmt::Display) -> Error {
    Error::Corruption(format!("Parquet segment does not parse: {e}"))
}

fn column<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> Result<&'a T> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or_else(|| corrupt(format!("column `{name}` is missing or has the wrong type")))
}

pub fn decode(bytes: &[u8]) -> Result<Vec<Record>> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(Bytes::copy_from_slice(bytes))
        .map_err(corrupt)?
        .build()
        .map_err(corrupt)?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(corrupt)?;
        let partition: &StringArray = column(&batch, "partition_key")?;
        let time: &TimestampMicrosecondArray = column(&batch, "event_time")?;
        let sort: &StringArray = column(&batch, "sort_key")?;
        let tenant: &StringArray = column(&batch, "tenant")?;
        let kind: &StringArray = column(&batch, "kind")?;
        let body: &StringArray = column(&batch, "body")?;
        for i in 0..batch.num_rows() {
            let text = body.value(i);
            serde_json::from_str::<&serde_json::value::RawValue>(text)
                .map_err(|e| corrupt(format!("row {i}: body is not JSON: {e}")))?;
            out.push(Record {
                partition_key: partition.value(i).as_bytes().to_vec(),
                event_time: time.value(i),
                sort_key: sort.value(i).as_bytes().to_vec(),
                tenant: (!tenant.is_null(i)).then(|| tenant.value(i).to_string()),
                kind: (!kind.is_null(i)).then(|| kind.value(i).to_string()),
                body: text.to_string(),
            });
        }
    }
    Ok(out)
}

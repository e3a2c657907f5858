//! Apache Parquet segments that other engines read directly (DuckDB, Spark, Trino): one row
//! group per segment, zstd compression (but for the columns of few values in a small
//! segment), row-group statistics, event time as TIMESTAMP(MICROS) adjusted to UTC, the body
//! as a JSON string.

use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Float64Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder};
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray, TimestampMicrosecondArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::error::{Error, Result};
use crate::model::Record;
use crate::model::columns::{ColumnSpec, ColumnStats, ColumnType, ColumnValue, Extractor, StatsBuilder};
use crate::model::rows::{RowFields, RowSummary, RowSummer};

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
/// The column written without a dictionary. A body is most often unique to its record, so a
/// dictionary repeats every value once and adds an index per row that does not compress:
/// measured over the typed benchmark's 32 segments of 6,250 flights-like rows, 6.70 MB with
/// it against 6.38 MB without. zstd still folds bodies that repeat (`format::tests`).
/// `sort_key` keeps its dictionary: it may repeat across times (one per sensor, say).
const PLAIN_BODY: &str = "body";
pub const SCHEMA_DESCRIPTION: &str = "parquet: partition_key UTF8, event_time TIMESTAMP(MICROS, UTC), sort_key UTF8, \
     tenant UTF8 (nullable), kind UTF8 (nullable), body UTF8 (JSON text)";

/// The segment's columns: frostline's own, then the table's typed columns in declaration order.
/// Typed columns are nullable whatever their declaration: rows appended before a column was
/// declared, or stored under `on_mismatch = "null"`, hold none.
fn schema(columns: &[ColumnSpec]) -> Arc<Schema> {
    let mut fields = vec![
        Field::new("partition_key", DataType::Utf8, false),
        Field::new("event_time", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
        Field::new("sort_key", DataType::Utf8, false),
        Field::new("tenant", DataType::Utf8, true),
        Field::new("kind", DataType::Utf8, true),
        Field::new("body", DataType::Utf8, false),
    ];
    fields.extend(columns.iter().map(|c| Field::new(&c.name, arrow_type(c.kind), true)));
    Arc::new(Schema::new(fields))
}

fn arrow_type(kind: ColumnType) -> DataType {
    match kind {
        ColumnType::String => DataType::Utf8,
        ColumnType::Int64 => DataType::Int64,
        ColumnType::Float64 => DataType::Float64,
        ColumnType::Bool => DataType::Boolean,
        ColumnType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
    }
}

/// One typed column's values as they are built.
enum TypedBuilder {
    String(StringBuilder),
    Int64(Int64Builder),
    Float64(Float64Builder),
    Bool(BooleanBuilder),
    Timestamp(TimestampMicrosecondBuilder),
}

impl TypedBuilder {
    fn new(kind: ColumnType) -> TypedBuilder {
        match kind {
            ColumnType::String => TypedBuilder::String(StringBuilder::new()),
            ColumnType::Int64 => TypedBuilder::Int64(Int64Builder::new()),
            ColumnType::Float64 => TypedBuilder::Float64(Float64Builder::new()),
            ColumnType::Bool => TypedBuilder::Bool(BooleanBuilder::new()),
            ColumnType::Timestamp => TypedBuilder::Timestamp(TimestampMicrosecondBuilder::new().with_timezone("UTC")),
        }
    }

    /// Appends `value` (of the column's type, or null).
    fn append(&mut self, value: &ColumnValue) {
        match (self, value) {
            (TypedBuilder::String(b), ColumnValue::String(v)) => b.append_value(v),
            (TypedBuilder::Int64(b), ColumnValue::Int64(v)) => b.append_value(*v),
            (TypedBuilder::Float64(b), ColumnValue::Float64(v)) => b.append_value(*v),
            (TypedBuilder::Bool(b), ColumnValue::Bool(v)) => b.append_value(*v),
            (TypedBuilder::Timestamp(b), ColumnValue::Timestamp(v)) => b.append_value(*v),
            (TypedBuilder::String(b), _) => b.append_null(),
            (TypedBuilder::Int64(b), _) => b.append_null(),
            (TypedBuilder::Float64(b), _) => b.append_null(),
            (TypedBuilder::Bool(b), _) => b.append_null(),
            (TypedBuilder::Timestamp(b), _) => b.append_null(),
        }
    }

    fn finish(self) -> ArrayRef {
        match self {
            TypedBuilder::String(mut b) => Arc::new(b.finish()),
            TypedBuilder::Int64(mut b) => Arc::new(b.finish()),
            TypedBuilder::Float64(mut b) => Arc::new(b.finish()),
            TypedBuilder::Bool(mut b) => Arc::new(b.finish()),
            TypedBuilder::Timestamp(mut b) => Arc::new(b.finish()),
        }
    }
}

fn encoding_error(e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("encoding a Parquet segment: {e}"))
}

/// Encodes `records` as one Parquet segment with the table's typed `columns`, each taken from
/// the body (null where it does not fit: `Extractor`). Returns the bytes and
/// the statistics of the typed columns, `tenant` and `kind` (`ColumnStats`).
pub fn encode(records: &[Record], columns: &[ColumnSpec]) -> Result<(Vec<u8>, Vec<ColumnStats>)> {
    let mut partition = StringBuilder::new();
    let mut time = TimestampMicrosecondBuilder::new().with_timezone("UTC");
    let mut sort = StringBuilder::new();
    let mut tenant = StringBuilder::new();
    let mut kind = StringBuilder::new();
    let mut body = StringBuilder::new();
    let mut typed: Vec<TypedBuilder> = columns.iter().map(|c| TypedBuilder::new(c.kind)).collect();
    let mut stats: Vec<StatsBuilder> = [("tenant", ColumnType::String), ("kind", ColumnType::String)]
        .into_iter()
        .chain(columns.iter().map(|c| (c.name.as_str(), c.kind)))
        .map(|(name, kind)| StatsBuilder::new(name, kind))
        .collect();
    let extractor = Extractor::new(columns);
    let mut values = Vec::with_capacity(columns.len());
    for r in records {
        partition.append_value(String::from_utf8_lossy(&r.partition_key));
        time.append_value(r.event_time);
        sort.append_value(String::from_utf8_lossy(&r.sort_key));
        tenant.append_option(r.tenant.as_deref());
        kind.append_option(r.kind.as_deref());
        body.append_value(&r.body);
        stats[0].add_text(r.tenant.as_deref());
        stats[1].add_text(r.kind.as_deref());
        if !columns.is_empty() {
            extractor.values(&r.body, &mut values);
            for ((value, builder), stats) in values.iter().zip(&mut typed).zip(&mut stats[2..]) {
                builder.append(value);
                stats.add(value);
            }
        }
    }
    let mut arrays: Vec<ArrayRef> = vec![
        Arc::new(partition.finish()),
        Arc::new(time.finish()),
        Arc::new(sort.finish()),
        Arc::new(tenant.finish()),
        Arc::new(kind.finish()),
        Arc::new(body.finish()),
    ];
    arrays.extend(typed.into_iter().map(TypedBuilder::finish));
    let schema = schema(columns);
    let batch = RecordBatch::try_new(schema.clone(), arrays).map_err(encoding_error)?;
    let mut properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL).map_err(encoding_error)?));
    if records.len() < SMALL_COLUMNS_COMPRESSED_ROWS_MIN {
        for name in UNCOMPRESSED_WHEN_SMALL {
            properties = properties.set_column_compression(ColumnPath::from(name), Compression::UNCOMPRESSED);
        }
    }
    let properties = properties
        .set_column_dictionary_enabled(ColumnPath::from(PLAIN_BODY), false)
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_max_row_group_row_count(Some(crate::format::SEGMENT_ROWS_MAX))
        .set_created_by("frostline".into())
        .build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema, Some(properties)).map_err(encoding_error)?;
    writer.write(&batch).map_err(encoding_error)?;
    writer.close().map_err(encoding_error)?;
    Ok((out, stats.into_iter().map(StatsBuilder::finish).collect()))
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

/// The record's columns, the only ones a decode reads: a table's typed columns are derived
/// from `body`, and reading them too cost every verification and query their bytes.
const RECORD_COLUMNS: [&str; 6] = ["partition_key", "event_time", "sort_key", "tenant", "kind", "body"];

pub fn decode(bytes: &[u8]) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for_each_row(bytes, |row| {
        out.push(Record {
            partition_key: row.partition_key.to_vec(),
            event_time: row.event_time,
            sort_key: row.sort_key.to_vec(),
            tenant: row.tenant.map(str::to_string),
            kind: row.kind.map(str::to_string),
            body: row.body.to_string(),
        })
    })?;
    Ok(out)
}

/// The row summary of a segment's bytes, summed from its columns without building records:
/// what a read-back verification compares with the manifest.
pub fn summarize_segment(bytes: &[u8]) -> Result<RowSummary> {
    let mut summer = RowSummer::default();
    for_each_row(bytes, |row| summer.push_fields(row))?;
    Ok(summer.finish())
}

/// Calls `visit` with each row of a segment, borrowed from its decoded columns, after checking
/// that the row's body is JSON.
fn for_each_row(bytes: &[u8], mut visit: impl FnMut(RowFields<'_>)) -> Result<()> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(Bytes::copy_from_slice(bytes)).map_err(corrupt)?;
    let record_columns = ProjectionMask::columns(builder.parquet_schema(), RECORD_COLUMNS);
    let reader = builder.with_projection(record_columns).build().map_err(corrupt)?;
    // Rows before the current batch: an error names a row by its place in the segment (from 1).
    let mut rows_before = 0;
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
                .map_err(|e| corrupt(format!("row {}: body is not JSON: {e}", rows_before + i + 1)))?;
            visit(RowFields {
                partition_key: partition.value(i).as_bytes(),
                event_time: time.value(i),
                sort_key: sort.value(i).as_bytes(),
                tenant: (!tenant.is_null(i)).then(|| tenant.value(i)),
                kind: (!kind.is_null(i)).then(|| kind.value(i)),
                body: text,
            });
        }
        rows_before += batch.num_rows();
    }
    Ok(())
}

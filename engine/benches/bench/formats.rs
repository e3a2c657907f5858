//! Scenario formats: archive size and throughput per segment format for the same records, and
//! a cold query of one bucket per format against the same query while it is hot.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, ensure};
use frostline::engine::Engine;
use frostline::model::time::MICROS_PER_DAY;

use crate::data::{
    APPEND_NOW_MICROS, ARCHIVE_NOW_MICROS, DATASET_START_MICROS, DATASET_TABLE, Dirs, MEGABYTE, dataset,
    passes_until_idle,
};
use crate::harness::{Bench, Figure, Unit};

const FORMAT_RECORDS_DEFAULT: usize = 50_000;
const FORMAT_RECORDS_FULL: usize = 200_000;
/// A cold query of one bucket should cost at most three times the same query while hot.
const COLD_QUERY_RATIO_MIN: f64 = 1.0 / 3.0;

fn format_policy_toml(format: &str) -> String {
    format!(
        "[[table]]\nid = \"{DATASET_TABLE}\"\nformat = \"{format}\"\nstrategy = {{ plugin = \"builtin:calendar-day-utc\" }}\n\
         retention = {{ plugin = \"builtin:eligible-before\", config = {{ archive_after = \"1s\" }} }}\n"
    )
}

/// Times a query of one bucket (one sensor, one day) and checks how many records it returned.
fn time_bucket_query(runtime: &tokio::runtime::Runtime, engine: &Arc<Engine>, expected: usize) -> Result<f64> {
    let request = frostline::query::QueryRequest {
        table: DATASET_TABLE.into(),
        partition_key: Some(b"sensor-000".to_vec()),
        from: Some(DATASET_START_MICROS),
        to: Some(DATASET_START_MICROS + MICROS_PER_DAY),
        limit: frostline::query::QUERY_LIMIT_MAX,
        cursor: None,
        tenants: None,
        conditions: Vec::new(),
    };
    let start = Instant::now();
    let page = runtime.block_on(frostline::query::query(&engine.context(), request))?;
    let millis = start.elapsed().as_secs_f64() * 1_000.0;
    ensure!(page.records.len() == expected, "the bucket query returned {} of {expected} records", page.records.len());
    Ok(millis)
}

pub fn formats(bench: &mut Bench) -> Result<()> {
    let count = if bench.options.full { FORMAT_RECORDS_FULL } else { FORMAT_RECORDS_DEFAULT };
    let records = dataset(count);
    let in_bucket = records
        .iter()
        .filter(|r| r.partition_key == b"sensor-000" && r.event_time < DATASET_START_MICROS + MICROS_PER_DAY)
        .count();
    // Throughput is counted in the same unit for every format: the records as JSON lines.
    let mut line = Vec::new();
    let mut input_bytes = 0usize;
    for r in &records {
        line.clear();
        frostline::format::jsonl::encode_line(r, &mut line)?;
        input_bytes += line.len();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    for format in ["jsonl", "parquet", "msgpack"] {
        let template = Dirs::new(&format_policy_toml(format))?;
        {
            let engine = template.open(APPEND_NOW_MICROS)?;
            for batch in records.chunks(frostline::engine::APPEND_BATCH_RECORDS_MAX) {
                engine.append(DATASET_TABLE, batch.to_vec())?;
            }
        }
        let (mut throughput, mut hot, mut cold) = (Vec::new(), Vec::new(), Vec::new());
        let mut archived_bytes = 0;
        for _ in 0..bench.options.repeats {
            let copy = template.copy()?;
            let engine = copy.open(APPEND_NOW_MICROS)?;
            hot.push(time_bucket_query(&runtime, &engine, in_bucket)?);
            drop(engine);
            let engine = copy.open(ARCHIVE_NOW_MICROS)?;
            let start = Instant::now();
            let report = runtime.block_on(passes_until_idle(&engine))?;
            let seconds = start.elapsed().as_secs_f64();
            ensure!(
                report.rows_archived == count as u64,
                "{format}: archived {} of {count} rows",
                report.rows_archived
            );
            throughput.push(input_bytes as f64 / MEGABYTE / seconds);
            archived_bytes = report.bytes_archived;
            cold.push(time_bucket_query(&runtime, &engine, in_bucket)?);
        }
        bench.push(Figure::new(
            bench.scenario,
            format!(
                "{format}: archive size of {count} records ({:.1} MB as JSON lines)",
                input_bytes as f64 / MEGABYTE
            ),
            Unit::Bytes,
            vec![archived_bytes as f64],
            1,
        ));
        bench.push(Figure::new(
            bench.scenario,
            format!("{format}: archive throughput (MB of JSON-lines input per second)"),
            Unit::MegabytesPerSecond,
            throughput,
            1,
        ));
        let hot = Figure::new(
            bench.scenario,
            format!("{format}: query one bucket ({in_bucket} records) while hot"),
            Unit::Millis,
            hot,
            1,
        );
        let cold = Figure::new(
            bench.scenario,
            format!("{format}: query the same bucket archived (cold)"),
            Unit::Millis,
            cold,
            1,
        )
        .against(&hot)
        .with_target(COLD_QUERY_RATIO_MIN, "a cold query of one bucket costs at most 3x the same query while hot");
        bench.push(hot);
        bench.push(cold);
    }
    Ok(())
}

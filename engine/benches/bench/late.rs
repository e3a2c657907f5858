//! Scenario late: what a late record costs.
//!
//! One bucket of 100,000 rows (one partition, one day, 200-byte bodies) is archived; then one
//! late record arrives, and the next pass publishes the bucket's next generation; then 1,000
//! late records arrive in one batch, and the next pass publishes the generation after. A next
//! generation reads the published archive back (every hash checked), merges the late rows in
//! and writes every segment anew, so its baseline is the first archival of the same bucket:
//! the same bytes archived for the first time. Bytes are those of the generation's segments as
//! its manifest records them, divided by the late records it took in.
//!
//! The append of a late record compares it with the archive (it may already be there, or
//! conflict with an archived body); its baseline is the append of one record to a hot bucket.
//! Every round builds its store anew, so each timed pass starts from the same state; the sweep
//! is not due in the timed passes (it is periodic work, timed in the scale scenario).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, ensure};
use frostline::archive;
use frostline::engine::Engine;
use frostline::model::Record;
use frostline::model::time::MICROS_PER_DAY;
use frostline::settings::Settings;

use crate::data::{ARCHIVE_NOW_MICROS, DATASET_START_MICROS, DATASET_TABLE, Dirs, TIMES_SEED, policy_toml};
use crate::data::{reading_body, splitmix64};
use crate::harness::{Bench, Figure, Unit};

/// Rows of the archived bucket.
const BUCKET_ROWS: usize = 100_000;
/// Late records in the second batch.
const LATE_BATCH: usize = 1_000;
/// Appends per `Engine::append` call while building the bucket.
const BUILD_BATCH: usize = 10_000;
const PARTITION: &str = "sensor-000";

pub fn late(bench: &mut Bench) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut samples = Samples::default();
    for round in 0..bench.options.repeats {
        run_round(&runtime, &mut samples).map_err(|e| e.context(format!("round {round}")))?;
    }
    let scenario = bench.scenario;
    let ms = |name: String, values: &[f64]| Figure::new(scenario, name, Unit::Millis, values.to_vec(), 1);
    let bytes = |name: String, values: &[f64]| Figure::new(scenario, name, Unit::Bytes, values.to_vec(), 1);
    let first = ms(format!("first archival of a {BUCKET_ROWS}-row bucket (one pass)"), &samples.first_ms);
    let one = ms(
        format!("next generation after 1 late record into the {BUCKET_ROWS}-row bucket (one pass)"),
        &samples.one_ms,
    )
    .against(&first);
    let batch = ms(
        format!("next generation after {LATE_BATCH} late records into the {BUCKET_ROWS}-row bucket (one pass)"),
        &samples.batch_ms,
    )
    .against(&first);
    let first_bytes =
        bytes(format!("bytes written by the first archival of the {BUCKET_ROWS}-row bucket"), &samples.first_bytes);
    let one_bytes =
        bytes("bytes rewritten per late record, 1 at once".to_string(), &samples.one_bytes).against(&first_bytes);
    let batch_bytes = bytes(format!("bytes rewritten per late record, {LATE_BATCH} at once"), &samples.batch_bytes)
        .against(&first_bytes);
    let hot_append = ms("Engine::append of 1 record to a hot bucket".to_string(), &samples.hot_append_ms);
    let late_append = ms(
        format!("Engine::append of 1 late record (compared with the {BUCKET_ROWS}-row archive)"),
        &samples.late_append_ms,
    )
    .against(&hot_append);
    for figure in [first, one, batch, first_bytes, one_bytes, batch_bytes, hot_append, late_append] {
        bench.push(figure);
    }
    Ok(())
}

/// Every round's samples, one per figure.
#[derive(Default)]
struct Samples {
    first_ms: Vec<f64>,
    one_ms: Vec<f64>,
    batch_ms: Vec<f64>,
    first_bytes: Vec<f64>,
    one_bytes: Vec<f64>,
    batch_bytes: Vec<f64>,
    hot_append_ms: Vec<f64>,
    late_append_ms: Vec<f64>,
}

/// Record `n` of the bucket: even `n` are archived first, odd ones arrive late.
fn bucket_record(n: usize, random: u64) -> Record {
    let step = MICROS_PER_DAY / (2 * BUCKET_ROWS as i64);
    Record {
        partition_key: PARTITION.as_bytes().to_vec(),
        event_time: DATASET_START_MICROS + n as i64 * step,
        sort_key: format!("evt-{n:010}").into_bytes(),
        tenant: None,
        kind: None,
        body: reading_body(PARTITION, n, random),
    }
}

fn run_round(runtime: &tokio::runtime::Runtime, samples: &mut Samples) -> Result<()> {
    let dirs = Dirs::new(&policy_toml("1d"))?;
    // The day after the bucket: it has ended and is not yet due, so the first pass plans it.
    // No late grace: each timed pass publishes the generation its late records make (the grace
    // decides how often a bucket is rewritten, not what one rewrite costs).
    let settings = Settings { sweep_interval_us: 365 * MICROS_PER_DAY, late_grace_us: 0, ..Settings::default() };
    let clock = frostline::clock::ManualClock::new(DATASET_START_MICROS + MICROS_PER_DAY + 1);
    let engine = Engine::open(&dirs.data(), &dirs.policies(), settings, clock.clone())?;
    let mut state = TIMES_SEED;
    let mut randoms: Vec<u64> = (0..2 * BUCKET_ROWS).map(|_| splitmix64(&mut state)).collect();
    let archived: Vec<Record> = (0..BUCKET_ROWS).map(|i| bucket_record(2 * i, randoms[2 * i])).collect();
    for chunk in archived.chunks(BUILD_BATCH) {
        engine.append(DATASET_TABLE, chunk.to_vec())?;
    }
    let planned = pass(runtime, &engine)?;
    ensure!(planned.archived == 0 && planned.errors.is_empty(), "the planning pass archived: {planned:?}");
    clock.set(ARCHIVE_NOW_MICROS);

    let (ms, report) = timed_pass(runtime, &engine)?;
    ensure!(report.archived == 1, "the first archival archived {} buckets: {:?}", report.archived, report.errors);
    samples.first_ms.push(ms);
    samples.first_bytes.push(generation_bytes(&engine)? as f64);

    // A hot bucket's append: a bucket that has not ended, so no pass plans or archives it.
    let mut hot = bucket_record(1, randoms[1]);
    hot.event_time = ARCHIVE_NOW_MICROS + MICROS_PER_DAY;
    let start = Instant::now();
    engine.append(DATASET_TABLE, vec![hot])?;
    samples.hot_append_ms.push(start.elapsed().as_secs_f64() * 1e3);

    let late = bucket_record(1, std::mem::take(&mut randoms[1]));
    let start = Instant::now();
    let outcome = engine.append(DATASET_TABLE, vec![late])?;
    samples.late_append_ms.push(start.elapsed().as_secs_f64() * 1e3);
    ensure!(outcome.appended == 1, "the late record was not appended: {outcome:?}");
    let (ms, report) = timed_pass(runtime, &engine)?;
    ensure!(report.archived >= 1, "no next generation after one late record: {:?}", report.errors);
    samples.one_ms.push(ms);
    samples.one_bytes.push(generation_bytes(&engine)? as f64);

    let batch: Vec<Record> = (1..=LATE_BATCH).map(|i| bucket_record(2 * i + 1, randoms[2 * i + 1])).collect();
    let outcome = engine.append(DATASET_TABLE, batch)?;
    ensure!(outcome.appended == LATE_BATCH as u64, "the late batch was not appended: {outcome:?}");
    let (ms, report) = timed_pass(runtime, &engine)?;
    ensure!(report.archived >= 1, "no next generation after {LATE_BATCH} late records: {:?}", report.errors);
    samples.batch_ms.push(ms);
    samples.batch_bytes.push(generation_bytes(&engine)? as f64 / LATE_BATCH as f64);
    let rows = engine.store().buckets(DATASET_TABLE, None)?.iter().map(|m| m.row_count).max().unwrap_or(0);
    ensure!(rows == (BUCKET_ROWS + 1 + LATE_BATCH) as u64, "the bucket holds {rows} rows after its generations");
    Ok(())
}

fn pass(runtime: &tokio::runtime::Runtime, engine: &Arc<Engine>) -> Result<archive::PassReport> {
    Ok(runtime.block_on(archive::run_pass(&engine.context(), &engine.new_owner_token()))?)
}

/// One pass, timed: milliseconds and its report (which must have no errors).
fn timed_pass(runtime: &tokio::runtime::Runtime, engine: &Arc<Engine>) -> Result<(f64, archive::PassReport)> {
    let start = Instant::now();
    let report = pass(runtime, engine)?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    ensure!(report.errors.is_empty(), "the pass failed: {}", report.errors.join("; "));
    Ok((ms, report))
}

/// The bytes of the segments of the archived bucket's newest generation.
fn generation_bytes(engine: &Arc<Engine>) -> Result<u64> {
    let store = engine.store();
    let meta = store
        .buckets(DATASET_TABLE, None)?
        .into_iter()
        .find(|m| m.descriptor.start == DATASET_START_MICROS)
        .ok_or_else(|| anyhow::anyhow!("the archived bucket is missing"))?;
    let manifest = store.latest_manifest(&meta.id)?.ok_or_else(|| anyhow::anyhow!("no manifest recorded"))?;
    Ok(manifest.bytes)
}

//! Scenario erase: what an erasure costs.
//!
//! 1,000 buckets (10 partitions × 100 days) of 100 rows each (200-byte bodies) are archived;
//! one row in a hundred belongs to tenant `erase-me`, one in every bucket. An erasure of that
//! tenant (1 % of the rows, every bucket touched) is placed and passes run until it is
//! finished: each bucket's next generation is written without the erased row, verified and
//! published, its hot side cleaned, and the replaced generation's objects deleted and proved
//! absent. The baseline is the first archival of the same 1,000 buckets, in passes run the same
//! way (until every bucket is archived): the same bytes archived for the first time. Bytes are those of
//! the buckets' newest generations, as their manifests record them.
//!
//! Measured in process, with the passes `frostline archive --once` runs; every round builds
//! its store anew.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, ensure};
use frostline::archive;
use frostline::engine::Engine;
use frostline::model::Record;
use frostline::model::time::MICROS_PER_DAY;
use frostline::settings::Settings;
use frostline::store::erasure::{ErasureRequest, ErasureSelector};

use crate::data::{ARCHIVE_NOW_MICROS, DATASET_START_MICROS, DATASET_TABLE, Dirs, TIMES_SEED, policy_toml};
use crate::data::{reading_body, splitmix64};
use crate::harness::{Bench, Figure, Unit};

const PARTITIONS: usize = 10;
const DAYS: usize = 100;
const ROWS_PER_BUCKET: usize = 100;
/// Every this-many-th row belongs to the erased tenant.
const ERASED_EVERY: usize = 100;
const TENANT: &str = "erase-me";

pub fn erase(bench: &mut Bench) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (mut first_ms, mut erase_ms, mut first_bytes, mut erase_bytes) = (vec![], vec![], vec![], vec![]);
    for round in 0..bench.options.repeats {
        let sample = run_round(&runtime).map_err(|e| e.context(format!("round {round}")))?;
        first_ms.push(sample.0);
        erase_ms.push(sample.1);
        first_bytes.push(sample.2);
        erase_bytes.push(sample.3);
    }
    let scenario = bench.scenario;
    let buckets = PARTITIONS * DAYS;
    let rows = buckets * ROWS_PER_BUCKET;
    let first = Figure::new(
        scenario,
        format!("first archival of {buckets} buckets ({rows} rows), passes until all are archived"),
        Unit::Millis,
        first_ms,
        1,
    );
    let erased = Figure::new(
        scenario,
        format!("erasure of 1 % of the rows across the {buckets} archived buckets, passes until finished"),
        Unit::Millis,
        erase_ms,
        1,
    )
    .against(&first);
    let first_b = Figure::new(
        scenario,
        format!("bytes written by the first archival of the {buckets} buckets"),
        Unit::Bytes,
        first_bytes,
        1,
    );
    let erase_b =
        Figure::new(scenario, "bytes written by the erasure's generations".to_string(), Unit::Bytes, erase_bytes, 1)
            .against(&first_b);
    for figure in [first, erased, first_b, erase_b] {
        bench.push(figure);
    }
    Ok(())
}

fn record(partition: usize, day: usize, i: usize, random: u64) -> Record {
    let step = MICROS_PER_DAY / ROWS_PER_BUCKET as i64;
    let key = format!("sensor-{partition:03}");
    let n = (day * PARTITIONS + partition) * ROWS_PER_BUCKET + i;
    Record {
        partition_key: key.as_bytes().to_vec(),
        event_time: DATASET_START_MICROS + day as i64 * MICROS_PER_DAY + i as i64 * step,
        sort_key: format!("evt-{n:010}").into_bytes(),
        tenant: Some(if i.is_multiple_of(ERASED_EVERY) { TENANT } else { "keep" }.to_string()),
        kind: None,
        body: reading_body(&key, n, random),
    }
}

/// One round: (first archival ms, erasure ms, first archival bytes, erasure bytes).
fn run_round(runtime: &tokio::runtime::Runtime) -> Result<(f64, f64, f64, f64)> {
    // Not due when planned (the planning pass archives nothing), due at ARCHIVE_NOW_MICROS.
    let dirs = Dirs::new(&policy_toml("400d"))?;
    let settings = Settings { sweep_interval_us: 365 * MICROS_PER_DAY, ..Settings::default() };
    let clock = frostline::clock::ManualClock::new(DATASET_START_MICROS + (DAYS as i64 + 1) * MICROS_PER_DAY);
    let engine = Engine::open(&dirs.data(), &dirs.policies(), settings, clock.clone())?;
    let mut state = TIMES_SEED;
    let mut batch = Vec::with_capacity(10_000);
    for day in 0..DAYS {
        for partition in 0..PARTITIONS {
            for i in 0..ROWS_PER_BUCKET {
                batch.push(record(partition, day, i, splitmix64(&mut state)));
            }
        }
        if batch.len() >= 10_000 {
            engine.append(DATASET_TABLE, std::mem::take(&mut batch))?;
        }
    }
    engine.append(DATASET_TABLE, batch)?;
    let planned = pass(runtime, &engine)?;
    ensure!(planned.archived == 0, "the planning pass archived: {planned:?}");
    clock.set(ARCHIVE_NOW_MICROS);

    let start = Instant::now();
    let mut archived = 0;
    // Until every bucket is archived (a pass may spend itself planning and archive none).
    for _ in 0..1_000 {
        archived += pass(runtime, &engine)?.archived;
        if archived == (PARTITIONS * DAYS) as u64 {
            break;
        }
    }
    let first_ms = start.elapsed().as_secs_f64() * 1e3;
    ensure!(archived == (PARTITIONS * DAYS) as u64, "the first archival archived {archived} buckets");
    let first_bytes = newest_bytes(&engine)?;

    let request = ErasureRequest {
        id: "e-bench".into(),
        selector: ErasureSelector { tenant: Some(TENANT.into()), ..Default::default() },
        reason: "bench".into(),
        requester: "bench".into(),
        placed_at: 0,
        finished_at: None,
        buckets: Vec::new(),
        fleet: Vec::new(),
        answers_for: None,
    };
    let start = Instant::now();
    engine.store().place_erasure(request, ARCHIVE_NOW_MICROS)?;
    let mut passes = 0;
    while engine.store().erasure("e-bench")?.is_some_and(|r| r.is_open()) {
        ensure!(passes < 1_000, "the erasure did not finish in {passes} passes");
        pass(runtime, &engine)?;
        passes += 1;
    }
    let erase_ms = start.elapsed().as_secs_f64() * 1e3;
    let left: u64 = engine.store().buckets(DATASET_TABLE, None)?.iter().map(|m| m.row_count).sum();
    let expected = (PARTITIONS * DAYS * (ROWS_PER_BUCKET - ROWS_PER_BUCKET / ERASED_EVERY)) as u64;
    ensure!(left == expected, "{left} rows after the erasure, not {expected}");
    Ok((first_ms, erase_ms, first_bytes as f64, newest_bytes(&engine)? as f64))
}

fn pass(runtime: &tokio::runtime::Runtime, engine: &Arc<Engine>) -> Result<archive::PassReport> {
    let report = runtime.block_on(archive::run_pass(&engine.context(), &engine.new_owner_token()))?;
    ensure!(report.errors.is_empty(), "the pass failed: {}", report.errors.join("; "));
    Ok(report)
}

/// The bytes of every bucket's newest generation.
fn newest_bytes(engine: &Arc<Engine>) -> Result<u64> {
    let store = engine.store();
    let mut bytes = 0;
    for meta in store.buckets(DATASET_TABLE, None)? {
        bytes += store.latest_manifest(&meta.id)?.map_or(0, |m| m.bytes);
    }
    Ok(bytes)
}

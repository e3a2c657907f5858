//! Scenario scale: what a pass costs as the hot store grows.
//!
//! A pass finds its work through the due index, so a store of 1,000,000 buckets of which 64
//! are due should pass nearly as fast as one of 1,000 buckets with the same 64 due. Both
//! stores are built the same way: for every timed pass, 64 old buckets (one day, partitions
//! `sensor-000` to `sensor-063`) that come due one day after another, and regular buckets
//! (1,000 partitions × enough days) that never come due. Each timed pass moves the clock to the
//! next old day, so exactly 64 buckets are due, archives them, and leaves the rest alone. The
//! stores are planned untimed first (passes with the clock before anything is due), as a
//! running engine has them.
//!
//! The full orphan sweep (daily by default) reads every bucket: it is periodic work, timed here
//! as a figure of its own, and the timed passes run with the sweep not due, as most passes of
//! a running engine do. The incremental sweep (hourly by default) reads only the keys released
//! since, and the status summary the store's tallies: each is timed on both stores, the large
//! against the small. So are two queries as users make them, of each store's last regular
//! day: one partition (one bucket in either store, which a query should find without reading
//! the partition's other 999 days in the large one), and every partition, a page of 100 records
//! (the same buckets in both: the regular buckets left over by the 1,000 partitions). And the
//! first page of 1,000 of the table's bucket listing, which should read about the page.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, ensure};
use frostline::archive;
use frostline::clock::ManualClock;
use frostline::engine::Engine;
use frostline::model::time::MICROS_PER_DAY;
use frostline::model::{Micros, Record};
use frostline::settings::Settings;
use frostline_civil::days_from_civil;

use crate::data::{Dirs, MEGABYTE, TIMES_SEED, passes_until_idle, reading_body, splitmix64};
use crate::harness::{Bench, Figure, Unit};

const SCALE_TABLE: &str = "readings";
/// Buckets in the large and the small store.
const BUCKETS_LARGE: usize = 1_000_000;
const BUCKETS_SMALL: usize = 1_000;
/// Buckets due in each timed pass.
const DUE_PER_PASS: usize = 64;
/// Partitions of the regular (never due) buckets.
const REGULAR_PARTITIONS: usize = 1_000;
/// A pass over the large store should take at most twice the pass over the small one.
const SCALE_RATIO_MIN: f64 = 0.5;
/// 2001-01-01: the first old day; old day `r` is due in timed pass `r`.
const OLD_START_MICROS: Micros = days_from_civil(2001, 1, 1) * MICROS_PER_DAY;
/// Regular buckets start here, long after the old days, and never come due.
const REGULAR_START_MICROS: Micros = days_from_civil(2010, 1, 1) * MICROS_PER_DAY;
/// Appends per `Engine::append` call while building a store.
const BUILD_BATCH: usize = 10_000;
pub fn scale(bench: &mut Bench) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let passes = bench.options.repeats;
    let large = ScaleStore::build(&runtime, BUCKETS_LARGE, passes)?;
    let small = ScaleStore::build(&runtime, BUCKETS_SMALL, passes)?;
    let (mut large_ms, mut small_ms) = (Vec::new(), Vec::new());
    for pass in 0..passes {
        // Alternate which goes first, so leftover disk work from one lands on both alike.
        let order = if pass % 2 == 0 { [&large, &small] } else { [&small, &large] };
        for store in order {
            let ms = store.timed_pass(&runtime, pass)?;
            if std::ptr::eq(store, &large) { large_ms.push(ms) } else { small_ms.push(ms) }
        }
    }
    let small_figure = Figure::new(
        bench.scenario,
        format!("pass over {BUCKETS_SMALL} buckets, {DUE_PER_PASS} due (archived), sweep not due"),
        Unit::Millis,
        small_ms,
        1,
    );
    let large_figure = Figure::new(
        bench.scenario,
        format!("pass over {BUCKETS_LARGE} buckets, {DUE_PER_PASS} due (archived), sweep not due"),
        Unit::Millis,
        large_ms,
        1,
    )
    .against(&small_figure)
    .with_target(SCALE_RATIO_MIN, "a pass over 1,000,000 buckets takes at most 2x a pass over 1,000 (same work due)");
    bench.push(small_figure);
    bench.push(large_figure);

    // Periodic work that reads every bucket, and the sweep between full ones, which reads
    // only what was released (nothing here): its cost should not grow with the store.
    let mut incremental_sweeps = Vec::new();
    let mut statuses = Vec::new();
    let mut partition_days = Vec::new();
    let mut table_days = Vec::new();
    let mut listings = Vec::new();
    let mut full_sweep_ms = 0.0;
    for store in [&small, &large] {
        let engine = store.open(store.clock_for_pass(passes))?;
        // The last regular day of the store: both stores have partition sensor-042 on it.
        let regular = store.buckets - old_buckets(passes);
        let day = REGULAR_START_MICROS + ((regular - 1) / REGULAR_PARTITIONS) as Micros * MICROS_PER_DAY;
        let day_buckets = (regular - 1) % REGULAR_PARTITIONS + 1;
        let query = |partition: Option<&str>, limit: usize| {
            let request = frostline::query::QueryRequest {
                table: SCALE_TABLE.into(),
                partition_key: partition.map(|p| p.as_bytes().to_vec()),
                from: Some(day),
                to: Some(day + MICROS_PER_DAY),
                limit,
                ..Default::default()
            };
            let page = runtime.block_on(frostline::query::query(&engine.context(), request))?;
            ensure!(!page.records.is_empty(), "the query of day {day} found no record");
            Ok(page.records.len())
        };
        partition_days.push(bench.time_each(
            format!("query of one partition and one day (frostline query) over {} buckets", store.buckets),
            Unit::Millis,
            bench.options.repeats,
            || Ok(()),
            |()| query(Some("sensor-042"), 1_000),
        )?);
        table_days.push(bench.time_each(
            format!(
                "query of one day of every partition ({day_buckets} buckets), a page of 100, over {} buckets",
                store.buckets
            ),
            Unit::Millis,
            bench.options.repeats,
            || Ok(()),
            |()| query(None, 100),
        )?);
        listings.push(bench.time_each(
            format!("first page of 1,000 of a table's bucket listing (GET .../buckets) over {} buckets", store.buckets),
            Unit::Millis,
            bench.options.repeats,
            || Ok(()),
            |()| {
                let request = frostline::ops::buckets::BucketsRequest {
                    table: SCALE_TABLE.into(),
                    state: None,
                    partition: None,
                    limit: 1_000,
                };
                let page = frostline::ops::buckets::list(&engine, request)?;
                ensure!(page.buckets.len() == 1_000.min(store.buckets), "a listing of {}", page.buckets.len());
                Ok(page.truncated)
            },
        )?);
        statuses.push(bench.time_each(
            format!("status summary (frostline status) over {} buckets", store.buckets),
            Unit::Millis,
            bench.options.repeats.min(3),
            || Ok(()),
            |()| Ok(frostline::ops::status::collect(&engine)?),
        )?);
        let sweep = bench.time_each(
            format!("orphan sweep over {} buckets", store.buckets),
            Unit::Millis,
            bench.options.repeats.min(3),
            || Ok(()),
            |()| Ok(runtime.block_on(archive::sweep::sweep(&engine.context(), true))?),
        )?;
        full_sweep_ms = sweep.median;
        bench.push(sweep);
        incremental_sweeps.push(bench.time_each(
            format!("incremental sweep over {} buckets, nothing released", store.buckets),
            Unit::Millis,
            bench.options.repeats.min(3),
            || Ok(()),
            |()| Ok(runtime.block_on(archive::sweep::sweep_released(&engine.context()))?),
        )?);
    }
    // Where a slow one goes: with nothing released no folder is listed.
    let sweep_note = format!(
        "With nothing released no folder is listed: what is left is reading the sweep's rows of `meta` and the \
         released keys after the cursor in the larger store (cold pages), and listing the scratch prefixes. It \
         replaces, between daily full sweeps, the full sweep over the same store ({full_sweep_ms:.0} ms here)."
    );
    for (mut pair, target, note) in [
        (
            incremental_sweeps,
            "an incremental sweep over 1,000,000 buckets takes at most 2x one over 1,000 (nothing released)",
            Some(sweep_note),
        ),
        (
            statuses,
            "a status over 1,000,000 buckets takes at most 2x one over 1,000 (the store's tallies, not a visit)",
            None,
        ),
        (
            partition_days,
            "a query of one partition and day over 1,000,000 buckets takes at most 2x one over 1,000 (one bucket read)",
            None,
        ),
        (
            listings,
            "the first page of a bucket listing over 1,000,000 buckets takes at most 2x the same over 1,000 (the \
             page's buckets read)",
            None,
        ),
        (
            table_days,
            "a query of one day of every partition over 1,000,000 buckets takes at most 2x the same over 1,000 (the \
             day's buckets read)",
            None,
        ),
    ] {
        let large = pair.pop().expect("the large store's");
        let small = pair.pop().expect("the small store's");
        let mut large = large.against(&small).with_target(SCALE_RATIO_MIN, target);
        if let Some(note) = note {
            large = large.with_note(note);
        }
        bench.push(small);
        bench.push(large);
    }
    drop((large, small));
    Ok(())
}

/// A store of `buckets` buckets built for `passes` timed passes.
struct ScaleStore {
    dirs: Dirs,
    buckets: usize,
}

impl ScaleStore {
    fn build(runtime: &tokio::runtime::Runtime, buckets: usize, passes: usize) -> Result<ScaleStore> {
        let old = old_buckets(passes);
        ensure!(buckets > old, "{buckets} buckets cannot hold {passes} passes of {DUE_PER_PASS} due buckets");
        let dirs = Dirs::new(&format!(
            "[[table]]\nid = \"{SCALE_TABLE}\"\nstrategy = {{ plugin = \"builtin:calendar-day-utc\" }}\n\
             retention = {{ plugin = \"builtin:eligible-before\", config = {{ archive_after = \"1d\" }} }}\n"
        ))?;
        let store = ScaleStore { dirs, buckets };
        let started = Instant::now();
        // Before the first old day ends: nothing is due while the store is built and planned.
        let engine = store.open(OLD_START_MICROS)?;
        let mut state = TIMES_SEED;
        let record = |partition: usize, day_start: Micros, n: usize, random: u64| {
            let sensor = format!("sensor-{partition:03}");
            Record {
                partition_key: sensor.clone().into_bytes(),
                event_time: day_start + (random % MICROS_PER_DAY as u64) as Micros,
                sort_key: format!("evt-{n:010}").into_bytes(),
                tenant: None,
                kind: None,
                body: reading_body(&sensor, n, random),
            }
        };
        let mut batch = Vec::with_capacity(BUILD_BATCH);
        for n in 0..buckets {
            let random = splitmix64(&mut state);
            batch.push(if n < old {
                record(n % DUE_PER_PASS, OLD_START_MICROS + (n / DUE_PER_PASS) as Micros * MICROS_PER_DAY, n, random)
            } else {
                let regular = n - old;
                let day = REGULAR_START_MICROS + (regular / REGULAR_PARTITIONS) as Micros * MICROS_PER_DAY;
                record(regular % REGULAR_PARTITIONS, day, n, random)
            });
            if batch.len() == BUILD_BATCH || n + 1 == buckets {
                engine.append(SCALE_TABLE, std::mem::take(&mut batch))?;
            }
        }
        let report = runtime.block_on(passes_until_idle(&engine))?;
        ensure!(report.archived == 0, "building the store archived {} buckets", report.archived);
        ensure!(report.errors.is_empty(), "planning failed: {}", report.errors.join("; "));
        let planned = engine.store().unplanned(1)?.is_empty();
        ensure!(planned, "buckets are left unplanned after the build");
        println!(
            "  (built and planned a store of {buckets} buckets in {:.1} s: {:.0} MB on disk)",
            started.elapsed().as_secs_f64(),
            dir_bytes(&store.dirs.data())? as f64 / MEGABYTE
        );
        Ok(store)
    }

    /// The clock of timed pass `pass`: just after old day `pass` is due (one day after it ends).
    fn clock_for_pass(&self, pass: usize) -> Micros {
        OLD_START_MICROS + (pass as Micros + 2) * MICROS_PER_DAY + 1
    }

    fn open(&self, now: Micros) -> Result<Arc<Engine>> {
        // The sweep is timed on its own; the timed passes run with it not due.
        let settings = Settings { sweep_interval_us: 365 * MICROS_PER_DAY, ..Settings::default() };
        Ok(Engine::open(&self.dirs.data(), &self.dirs.policies(), settings, ManualClock::new(now))?)
    }

    /// Opens the store at the clock of timed pass `pass` (untimed), runs one pass (timed) and
    /// checks it archived exactly the 64 buckets due. Milliseconds.
    fn timed_pass(&self, runtime: &tokio::runtime::Runtime, pass: usize) -> Result<f64> {
        let engine = self.open(self.clock_for_pass(pass))?;
        let owner = engine.new_owner_token();
        let start = Instant::now();
        let report = runtime.block_on(archive::run_pass(&engine.context(), &owner))?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        ensure!(
            report.archived == DUE_PER_PASS as u64 && report.errors.is_empty(),
            "pass {pass} over {} buckets archived {} (expected {DUE_PER_PASS}): {}",
            self.buckets,
            report.archived,
            report.errors.join("; ")
        );
        Ok(ms)
    }
}

/// The old buckets (due one day after another, one day per timed pass) of a store.
fn old_buckets(passes: usize) -> usize {
    passes * DUE_PER_PASS
}

fn dir_bytes(dir: &std::path::Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() { dir_bytes(&entry.path())? } else { meta.len() };
    }
    Ok(total)
}

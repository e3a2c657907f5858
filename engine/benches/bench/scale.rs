//! Scenario scale: what a pass costs as the hot store grows.
//!
//! A pass finds its work through the due index, so a store of 1,000,000 buckets of which 64
//! are due should pass nearly as fast as one of 1,000 buckets with the same 64 due. Both
//! stores are built the same way: for every timed pass, 64 old buckets (one day, partitions
//! `sensor-000` to `sensor-063`) that come due one day after another, and regular buckets
//! (1,000 partitions × enough days) that never come due. Each timed pass moves the clock to the
//! next old day, so exactly 64 buckets are due, archives them, and leaves the rest alone. The
//! stores are planned untimed first (passes with the clock before anything is due), as a
//! running engine has them. Then as many passes again, each right after a policy change (the
//! table's `archive_after` moves between 23 and 22 hours, so every plan is stale and the same
//! 64 buckets are due): the first pass after a change re-plans what it can and should still
//! archive at least half as fast as a pass without one. Every pass and every timed query,
//! listing, status and sweep below also has its peak memory taken (`with_peak_memory`).
//!
//! The full orphan sweep (daily by default) reads every bucket: it is periodic work, timed here
//! as a figure of its own, and the timed passes run with the sweep not due, as most passes of
//! a running engine do. The incremental sweep (hourly by default) reads only the keys released
//! since, and the status summary the store's tallies: each is timed on both stores, the large
//! against the small. So are two queries as users make them, of each store's last regular
//! day: one partition (one bucket in either store, which a query should find without reading
//! the partition's other 999 days in the large one), and every partition, a page of 100 records
//! (the same buckets in both: the regular buckets left over by the 1,000 partitions). And the
//! first page of 1,000 of the table's bucket listing and of 100 of its hot buckets' listing,
//! which should each read about the page, and a
//! verification of a random sample of 10 archived buckets, which should read about the sample.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use frostline::archive;
use frostline::clock::{Clock, ManualClock, SharedClock};
use frostline::engine::Engine;
use frostline::model::time::MICROS_PER_DAY;
use frostline::model::{Micros, Record};
use frostline::settings::Settings;
use frostline_civil::days_from_civil;

use crate::data::{Dirs, MEGABYTE, TIMES_SEED, dir_bytes, passes_until_idle, reading_body, splitmix64, verify_sample};
use crate::harness::{Bench, Figure, Unit, with_peak_memory};

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
/// Archived buckets a timed verification checks (of the old buckets the timed passes archived).
const VERIFY_SAMPLE: usize = 10;
/// Appends per `Engine::append` call while building a store.
const BUILD_BATCH: usize = 10_000;
pub fn scale(bench: &mut Bench) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let passes = bench.options.repeats;
    let large = ScaleStore::build(&runtime, BUCKETS_LARGE, passes)?;
    let small = ScaleStore::build(&runtime, BUCKETS_SMALL, passes)?;
    // Per store (large, small): the passes under the policy the store was planned with, then
    // the passes each right after a policy change.
    let stores = [&large, &small];
    let (mut steady, mut changed) =
        ([PassSamples::default(), PassSamples::default()], [PassSamples::default(), PassSamples::default()]);
    for pass in 0..2 * passes {
        // Each change differs from the policy before it, and makes the same 64 buckets due.
        let change = (pass >= passes).then_some(if pass % 2 == 0 { "23h" } else { "22h" });
        // Alternate which goes first, so leftover disk work from one lands on both alike.
        for i in if pass % 2 == 0 { [0, 1] } else { [1, 0] } {
            let timed = stores[i].timed_pass(&runtime, pass, change)?;
            let samples = if change.is_some() { &mut changed[i] } else { &mut steady[i] };
            samples.ms.push(timed.ms);
            samples.peak_mib.push(timed.peak_mib);
            samples.plan_ms.push(timed.plan_ms);
            samples.replanned.push(timed.replanned as f64);
        }
    }
    let [large_steady, small_steady] = steady;
    let [large_changed, small_changed] = changed;
    let mut peaks: Vec<Peak> = Vec::new();
    for (buckets, samples) in [(BUCKETS_SMALL, &small_steady), (BUCKETS_LARGE, &large_steady)] {
        peaks.push(Peak { work: PASS, buckets, mib: samples.peak_mib.clone() });
    }
    for (buckets, samples) in [(BUCKETS_SMALL, &small_changed), (BUCKETS_LARGE, &large_changed)] {
        peaks.push(Peak { work: PASS_AFTER_CHANGE, buckets, mib: samples.peak_mib.clone() });
    }
    let figure =
        |name: String, samples: &PassSamples| Figure::new(bench.scenario, name, Unit::Millis, samples.ms.clone(), 1);
    let small_figure = figure(pass_name(BUCKETS_SMALL), &small_steady);
    let large_figure = figure(pass_name(BUCKETS_LARGE), &large_steady).against(&small_figure).with_target(
        SCALE_RATIO_MIN,
        "a pass over 1,000,000 buckets takes at most 2x a pass over 1,000 (same work due)",
    );
    let after_change_target = "the first pass after a policy change archives at >= half the rate of a pass without one \
                               (the same buckets due)";
    let small_changed_figure = figure(pass_after_change_name(BUCKETS_SMALL), &small_changed)
        .against(&small_figure)
        .with_target(0.5, after_change_target);
    let large_changed_figure = figure(pass_after_change_name(BUCKETS_LARGE), &large_changed)
        .against(&large_figure)
        .with_target(0.5, after_change_target);
    let large_changed_against_small = Figure::new(
        bench.scenario,
        format!("{} (against the same over {BUCKETS_SMALL})", pass_after_change_name(BUCKETS_LARGE)),
        Unit::Millis,
        large_changed.ms.clone(),
        1,
    )
    .against(&small_changed_figure)
    .with_target(
        SCALE_RATIO_MIN,
        "a pass after a policy change over 1,000,000 buckets takes at most 2x the same over 1,000",
    )
    .with_note(format!(
        "Each timed pass is the first of a newly opened engine, whose clock runs: it plans for at most {} ms \
         (`PLAN_TIME_FIRST_PASS_US`; later passes of a life while a backlog drains, half the previous pass's due \
         work), finishing the batch it is in, before it archives, re-planning the oldest buckets first. Here the \
         plan phase took {:.0} \
         ms (median) and re-planned {:.0} buckets (reconciled and planned, median) over 1,000,000 buckets, against \
         {:.0} ms and {:.0} over 1,000 (all of them); the pass without a change plans nothing.",
        archive::PLAN_TIME_FIRST_PASS_US / 1_000,
        crate::harness::median(&large_changed.plan_ms),
        crate::harness::median(&large_changed.replanned),
        crate::harness::median(&small_changed.plan_ms),
        crate::harness::median(&small_changed.replanned),
    ));
    for figure in [small_figure, large_figure, small_changed_figure, large_changed_figure, large_changed_against_small]
    {
        bench.push(figure);
    }

    // Periodic work that reads every bucket, and the sweep between full ones, which reads
    // only what was released (nothing here): its cost should not grow with the store.
    let mut incremental_sweeps = Vec::new();
    let mut statuses = Vec::new();
    let mut partition_days = Vec::new();
    let mut table_days = Vec::new();
    let mut listings = Vec::new();
    let mut state_listings = Vec::new();
    let mut verifications = Vec::new();
    let mut full_sweeps = Vec::new();
    let mut full_sweep_ms = 0.0;
    for store in [&small, &large] {
        let engine = store.open(store.clock_for_pass(2 * passes))?;
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
        let buckets = store.buckets;
        // Times `run` as the figure `name` and takes the peak memory of all its runs as `work`'s.
        let mut timed = |work: &'static str, name: String, repeats: usize, run: &mut dyn FnMut() -> Result<()>| {
            let (figure, mib) =
                with_peak_memory(|| bench.time_each(name, Unit::Millis, repeats, || Ok(()), |()| run()))?;
            peaks.push(Peak { work, buckets, mib: vec![mib] });
            anyhow::Ok(figure)
        };
        let repeats = bench.options.repeats;
        partition_days.push(timed(
            "a query of one partition and one day",
            format!("query of one partition and one day (frostline query) over {buckets} buckets"),
            repeats,
            &mut || query(Some("sensor-042"), 1_000).map(drop),
        )?);
        table_days.push(timed(
            "a query of one day of every partition",
            format!(
                "query of one day of every partition ({day_buckets} buckets), a page of 100, over {buckets} buckets"
            ),
            repeats,
            &mut || query(None, 100).map(drop),
        )?);
        listings.push(timed(
            "the first page of a bucket listing",
            format!("first page of 1,000 of a table's bucket listing (GET .../buckets) over {buckets} buckets"),
            repeats,
            &mut || {
                let request = frostline::ops::buckets::BucketsRequest {
                    table: SCALE_TABLE.into(),
                    state: None,
                    partition: None,
                    limit: 1_000,
                };
                let page = frostline::ops::buckets::list(&engine, request)?;
                ensure!(page.buckets.len() == 1_000.min(buckets), "a listing of {}", page.buckets.len());
                Ok(())
            },
        )?);
        state_listings.push(timed(
            "the first page of one state's bucket listing",
            format!(
                "first page of 100 of one state's bucket listing (GET .../buckets?state=hot) over {buckets} buckets"
            ),
            repeats,
            &mut || {
                let request = frostline::ops::buckets::BucketsRequest {
                    table: SCALE_TABLE.into(),
                    state: Some("hot".into()),
                    partition: None,
                    limit: 100,
                };
                let page = frostline::ops::buckets::list(&engine, request)?;
                ensure!(page.buckets.len() == 100 && page.truncated, "a listing of {}", page.buckets.len());
                Ok(())
            },
        )?);
        verifications.push(timed(
            "a verification of a sample of 10",
            format!(
                "verification of a random sample of {VERIFY_SAMPLE} archived buckets (frostline verify --sample \
                 {VERIFY_SAMPLE}) over {buckets} buckets"
            ),
            repeats,
            &mut || verify_sample(&runtime, &engine, VERIFY_SAMPLE),
        )?);
        statuses.push(timed(
            "a status summary",
            format!("status summary (frostline status) over {buckets} buckets"),
            repeats.min(3),
            &mut || frostline::ops::status::collect(&engine).map(drop).map_err(Into::into),
        )?);
        let sweep = timed(
            "the full orphan sweep",
            format!("orphan sweep over {buckets} buckets"),
            repeats.min(3),
            &mut || runtime.block_on(archive::sweep::sweep(&engine.context(), true)).map(drop).map_err(Into::into),
        )?;
        full_sweep_ms = sweep.median;
        full_sweeps.push(sweep);
        incremental_sweeps.push(timed(
            "an incremental sweep",
            format!("incremental sweep over {buckets} buckets, nothing released"),
            repeats.min(3),
            &mut || runtime.block_on(archive::sweep::sweep_released(&engine.context())).map(drop).map_err(Into::into),
        )?);
    }
    for sweep in full_sweeps {
        bench.push(sweep);
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
            state_listings,
            "the first page of one state's bucket listing over 1,000,000 buckets takes at most 2x the same over \
             1,000 (the page's buckets read, not every bucket in the state)",
            None,
        ),
        (
            verifications,
            "a verification of a sample over 1,000,000 buckets takes at most 2x the same over 1,000 (the sample's \
             buckets read)",
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
    // The peak memory of each, the large store's against the small one's.
    let mut works: Vec<&'static str> = Vec::new();
    for peak in &peaks {
        if !works.contains(&peak.work) {
            works.push(peak.work);
        }
    }
    for work in works {
        let figure = |buckets: usize| -> Result<Figure> {
            let peak = peaks.iter().find(|p| p.work == work && p.buckets == buckets).context("a peak of each store")?;
            Ok(Figure::new(
                bench.scenario,
                format!("peak resident memory of the process during {work} over {buckets} buckets"),
                Unit::Mebibytes,
                peak.mib.clone(),
                1,
            ))
        };
        let small = figure(BUCKETS_SMALL)?;
        let large = figure(BUCKETS_LARGE)?.against(&small).with_target(
            SCALE_RATIO_MIN,
            "the peak memory of the same work over 1,000,000 buckets is at most 2x that over 1,000",
        );
        bench.push(small);
        bench.push(large);
    }
    drop((large, small));
    Ok(())
}

/// A clock that starts at a chosen time and runs with real time, as a started engine's does:
/// a manual clock stands still during a pass, so the time budget a pass plans within
/// (`archive::plan_budget`) would never run out.
#[derive(Debug)]
struct RunningClock {
    start: Micros,
    started: Instant,
}

impl Clock for RunningClock {
    fn now(&self) -> Micros {
        self.start + self.started.elapsed().as_micros() as Micros
    }
}

/// What the timed passes of one store took.
#[derive(Default)]
struct PassSamples {
    ms: Vec<f64>,
    /// The peak resident set of the process during each pass (`with_peak_memory`).
    peak_mib: Vec<f64>,
    /// Each pass's plan phase, and the buckets it reconciled and planned.
    plan_ms: Vec<f64>,
    replanned: Vec<f64>,
}

/// One timed pass.
struct TimedPass {
    ms: f64,
    peak_mib: f64,
    plan_ms: f64,
    replanned: u64,
}

/// The peak memory of one kind of work on one store.
struct Peak {
    work: &'static str,
    buckets: usize,
    mib: Vec<f64>,
}

/// The timed passes, as the memory figures name them.
const PASS: &str = "a pass (64 due)";
const PASS_AFTER_CHANGE: &str = "the first pass after a policy change (64 due)";

fn pass_name(buckets: usize) -> String {
    format!("pass over {buckets} buckets, {DUE_PER_PASS} due (archived), sweep not due")
}

fn pass_after_change_name(buckets: usize) -> String {
    format!("first pass after a policy change over {buckets} buckets, {DUE_PER_PASS} due (archived), sweep not due")
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
        let dirs = Dirs::new(&scale_policy("1d"))?;
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
        self.open_with(ManualClock::new(now))
    }

    fn open_with(&self, clock: SharedClock) -> Result<Arc<Engine>> {
        // The sweep is timed on its own; the timed passes run with it not due.
        let settings = Settings { sweep_interval_us: 365 * MICROS_PER_DAY, ..Settings::default() };
        Ok(Engine::open(&self.dirs.data(), &self.dirs.policies(), settings, clock)?)
    }

    /// Writes the policy with `change` as its `archive_after` when there is one, opens the
    /// store at the clock of timed pass `pass` (untimed), runs one pass (timed) and checks it
    /// archived exactly the 64 buckets due.
    fn timed_pass(&self, runtime: &tokio::runtime::Runtime, pass: usize, change: Option<&str>) -> Result<TimedPass> {
        if let Some(archive_after) = change {
            std::fs::write(self.dirs.policies().join("tables.toml"), scale_policy(archive_after))?;
        }
        // A clock that runs, as a started engine's does: its planning time budget then holds.
        let engine =
            self.open_with(Arc::new(RunningClock { start: self.clock_for_pass(pass), started: Instant::now() }))?;
        let owner = engine.new_owner_token();
        let ((report, ms), peak_mib) = with_peak_memory(|| {
            let start = Instant::now();
            let report = runtime.block_on(archive::run_pass(&engine.context(), &owner))?;
            Ok((report, start.elapsed().as_secs_f64() * 1e3))
        })?;
        ensure!(
            report.archived == DUE_PER_PASS as u64 && report.errors.is_empty(),
            "pass {pass} over {} buckets archived {} (expected {DUE_PER_PASS}): {}",
            self.buckets,
            report.archived,
            report.errors.join("; ")
        );
        if change.is_some() {
            ensure!(report.reconciled > 0, "the pass after a policy change re-planned nothing: {report:?}");
        }
        Ok(TimedPass {
            ms,
            peak_mib,
            plan_ms: report.seconds.get(archive::Phase::Plan) * 1e3,
            replanned: report.reconciled + report.planned,
        })
    }
}

/// The old buckets (due one day after another, one day per timed pass: `passes` with the
/// policy the store was planned with, then `passes` each after a policy change) of a store.
fn old_buckets(passes: usize) -> usize {
    2 * passes * DUE_PER_PASS
}

/// The table's policy: day buckets, archived `archive_after` after they end.
fn scale_policy(archive_after: &str) -> String {
    format!(
        "[[table]]\nid = \"{SCALE_TABLE}\"\nstrategy = {{ plugin = \"builtin:calendar-day-utc\" }}\n\
         retention = {{ plugin = \"builtin:eligible-before\", config = {{ archive_after = \"{archive_after}\" }} }}\n"
    )
}

//! Scenario scale-archived: what the work an engine repeats costs as its archive grows.
//!
//! The `scale` scenario grows the hot store; this one grows what was archived. Two stores are
//! built the same way, through passes as a running engine archives: day buckets of one record
//! each, of 1,000 partitions over one day and over 1,000 days (1,000 and 1,000,000 buckets: a
//! store that grew with its history), every one archived as JSON lines to a local directory
//! and its hot rows cleaned up. Then, on each store, what an
//! engine does over and over, which should cost about the same on both:
//!
//! - a pass with nothing due, and a pass that archives one new bucket;
//! - an incremental sweep after that archival (the keys it released), and `status`;
//! - a query of one archived partition and day (the manifest's copy and one segment), and a
//!   verification of a random sample of 10 archived buckets;
//! - the first page of the table's bucket listing;
//! - the store's metadata per archived bucket: `hot.redb` after an offline compaction
//!   (`frostline compact`), divided by the buckets.
//!
//! The full orphan sweep (daily by default) lists the whole archive by design: it is timed on
//! both stores as a figure of its own, with its peak memory, which should not grow with it.
//! `FROSTLINE_BENCH_ARCHIVED_BUCKETS` sets the large store's size (building 1,000,000 takes
//! the better part of an hour).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use frostline::archive;
use frostline::clock::ManualClock;
use frostline::engine::Engine;
use frostline::model::time::MICROS_PER_DAY;
use frostline::model::{Micros, Record};
use frostline::settings::Settings;

use crate::data::{
    ARCHIVE_NOW_MICROS, DATASET_START_MICROS, MEGABYTE, dir_bytes, passes_until_idle, reading_body, verify_sample,
};
use crate::harness::{Bench, Figure, Unit, with_peak_memory};

const TABLE: &str = "events";
const BUCKETS_SMALL: usize = 1_000;
const BUCKETS_LARGE_DEFAULT: usize = 1_000_000;
/// The large store's figures should cost at most twice the small store's.
const SCALE_RATIO_MIN: f64 = 0.5;
/// Buckets a timed verification checks.
const VERIFY_SAMPLE: usize = 10;
/// Appends per `Engine::append` call while building a store.
const BUILD_BATCH: usize = 10_000;
/// Partitions of each day: bucket `n` is partition `n % PARTITIONS` on day `n / PARTITIONS`.
const PARTITIONS: usize = 1_000;

pub fn scale_archived(bench: &mut Bench) -> Result<()> {
    let large_buckets = match std::env::var("FROSTLINE_BENCH_ARCHIVED_BUCKETS") {
        Ok(text) => text.parse::<usize>().ok().filter(|n| *n > BUCKETS_SMALL).with_context(|| {
            format!("FROSTLINE_BENCH_ARCHIVED_BUCKETS takes a number above {BUCKETS_SMALL}, not `{text}`")
        })?,
        Err(_) => BUCKETS_LARGE_DEFAULT,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut small = ArchivedStore::build(&runtime, BUCKETS_SMALL)?;
    let mut large = ArchivedStore::build(&runtime, large_buckets)?;
    let small_rows = small.measure(bench, &runtime)?;
    let large_rows = large.measure(bench, &runtime)?;
    for (small, large) in small_rows.into_iter().zip(large_rows) {
        let target = large.target;
        let mut large_figure = large.figure.against(&small.figure);
        if let Some(target) = target {
            large_figure = large_figure.with_target(SCALE_RATIO_MIN, target);
        }
        if let Some(note) = large.note {
            large_figure = large_figure.with_note(note);
        }
        bench.push(small.figure);
        bench.push(large_figure);
        if let (Some(small_mib), Some(large_mib)) = (small.peak_mib, large.peak_mib) {
            let peak = |buckets: usize, mib: f64| {
                Figure::new(
                    bench.scenario,
                    format!(
                        "peak resident memory of the process during {} over {buckets} archived buckets",
                        large.work
                    ),
                    Unit::Mebibytes,
                    vec![mib],
                    1,
                )
            };
            let small_peak = peak(small.buckets, small_mib);
            let large_peak = peak(large.buckets, large_mib).against(&small_peak).with_target(
                SCALE_RATIO_MIN,
                "the peak memory of the same work over 1,000,000 archived buckets is at most 2x that over 1,000",
            );
            bench.push(small_peak);
            bench.push(large_peak);
        }
    }
    Ok(())
}

/// One figure of one store, and the peak memory of the work it timed.
struct Measured {
    work: &'static str,
    buckets: usize,
    figure: Figure,
    peak_mib: Option<f64>,
    /// What the large store's figure should meet against the small store's.
    target: Option<&'static str>,
    note: Option<String>,
}

/// A store whose every bucket is archived.
struct ArchivedStore {
    root: tempfile::TempDir,
    buckets: usize,
    /// New buckets appended (and archived) since the build.
    added: usize,
}

impl ArchivedStore {
    fn build(runtime: &tokio::runtime::Runtime, buckets: usize) -> Result<ArchivedStore> {
        let root = tempfile::tempdir()?;
        std::fs::create_dir_all(root.path().join("policies"))?;
        std::fs::create_dir_all(root.path().join("cold"))?;
        std::fs::write(root.path().join("policies/tables.toml"), policy(&root.path().join("cold")))?;
        let store = ArchivedStore { root, buckets, added: 0 };
        let started = Instant::now();
        // Passes of 1,000 buckets, 8 at a time, as an operator drains a backlog.
        let build = Settings { scan_limit: 1_000, archive_concurrency: 8, ..Settings::default() };
        let engine = store.open_with(build)?;
        let mut batch = Vec::with_capacity(BUILD_BATCH);
        for n in 0..buckets {
            batch.push(bucket_record(&partition(n), day_start(n)));
            if batch.len() == BUILD_BATCH || n + 1 == buckets {
                engine.append(TABLE, std::mem::take(&mut batch))?;
            }
        }
        let appended = started.elapsed().as_secs_f64();
        let mut archived = 0;
        let mut reported = Instant::now();
        while archived < buckets {
            let report = runtime.block_on(passes_until_idle(&engine))?;
            ensure!(report.errors.is_empty() && report.archived > 0, "building the store: {report:?}");
            archived += report.archived as usize;
            if reported.elapsed().as_secs() >= 60 {
                let rate = archived as f64 / (started.elapsed().as_secs_f64() - appended);
                println!("  ({archived} of {buckets} buckets archived, {rate:.0} buckets/s)");
                reported = Instant::now();
            }
        }
        ensure!(archived == buckets, "archived {archived} of {buckets} buckets");
        // The events of the build (no sink: each acknowledged as soon as a pass reads it),
        // so the timed passes find the outbox as a settled engine has it.
        let owner = engine.new_owner_token();
        while engine.store().outbox_len()? > 0 {
            runtime.block_on(archive::run_pass(&engine.context(), &owner))?;
        }
        drop(engine);
        println!(
            "  (built a store of {buckets} archived buckets in {:.1} s, appends {appended:.1} s: {:.0} MB of \
             data directory)",
            started.elapsed().as_secs_f64(),
            dir_bytes(&store.data())? as f64 / MEGABYTE,
        );
        Ok(store)
    }

    /// Every figure of this store, in the same order on each store.
    fn measure(&mut self, bench: &Bench, runtime: &tokio::runtime::Runtime) -> Result<Vec<Measured>> {
        let buckets = self.buckets;
        let repeats = bench.options.repeats;
        let mut rows = Vec::new();
        // The sweep is timed on its own; the timed passes run with it not due, as most do.
        let settings = Settings { sweep_interval_us: 365 * MICROS_PER_DAY, ..Settings::default() };
        let engine = self.open_with(settings)?;
        let owner = engine.new_owner_token();
        // A life's first pass reconciles what the last one left: untimed, as on a running engine.
        runtime.block_on(archive::run_pass(&engine.context(), &owner))?;
        let mut timed = |work: &'static str,
                         name: String,
                         repeats: usize,
                         target: Option<&'static str>,
                         run: &mut dyn FnMut() -> Result<()>| {
            let (figure, mib) =
                with_peak_memory(|| bench.time_each(name, Unit::Millis, repeats, || Ok(()), |()| run()))?;
            rows.push(Measured { work, buckets, figure, peak_mib: Some(mib), target, note: None });
            anyhow::Ok(())
        };
        timed(
            "a pass with nothing due",
            format!("pass with nothing due over {buckets} archived buckets"),
            repeats,
            Some("a pass with nothing due over 1,000,000 archived buckets takes at most 2x one over 1,000"),
            &mut || {
                let report = runtime.block_on(archive::run_pass(&engine.context(), &owner))?;
                ensure!(report.archived == 0 && report.errors.is_empty(), "a pass with nothing due: {report:?}");

                Ok(())
            },
        )?;
        let added = &mut self.added;
        timed(
            "a pass that archives one new bucket",
            format!("pass that archives one new bucket over {buckets} archived buckets"),
            repeats,
            Some("a pass that archives one bucket over 1,000,000 archived buckets takes at most 2x one over 1,000"),
            &mut || {
                *added += 1;
                // A day of its own after the store's last.
                let day = day_start(buckets + *added * PARTITIONS);
                engine.append(TABLE, vec![bucket_record(&format!("new/{added:04}"), day)])?;
                let report = runtime.block_on(archive::run_pass(&engine.context(), &owner))?;
                ensure!(report.archived == 1 && report.errors.is_empty(), "one new bucket archived: {report:?}");
                Ok(())
            },
        )?;
        timed(
            "an incremental sweep",
            format!("incremental sweep (the keys the passes above released) over {buckets} archived buckets"),
            repeats.min(3),
            Some("an incremental sweep over 1,000,000 archived buckets takes at most 2x one over 1,000"),
            &mut || runtime.block_on(archive::sweep::sweep_released(&engine.context())).map(drop).map_err(Into::into),
        )?;
        timed(
            "a status summary",
            format!("status summary (frostline status) over {buckets} archived buckets"),
            repeats,
            Some("a status over 1,000,000 archived buckets takes at most 2x one over 1,000"),
            &mut || frostline::ops::status::collect(&engine).map(drop).map_err(Into::into),
        )?;
        timed(
            "a query of one archived partition and day",
            format!("query of one archived partition and day (frostline query) over {buckets} archived buckets"),
            repeats,
            Some("a query of one archived bucket over 1,000,000 archived buckets takes at most 2x one over 1,000"),
            &mut || {
                let request = frostline::query::QueryRequest {
                    table: TABLE.into(),
                    partition_key: Some(partition(buckets / 2).into_bytes()),
                    from: Some(day_start(buckets / 2)),
                    to: Some(day_start(buckets / 2) + MICROS_PER_DAY),
                    limit: 1_000,
                    ..Default::default()
                };
                let page = runtime.block_on(frostline::query::query(&engine.context(), request))?;
                ensure!(page.records.len() == 1, "the query found {} records, not 1", page.records.len());
                Ok(())
            },
        )?;
        timed(
            "a verification of a sample of 10",
            format!(
                "verification of a random sample of {VERIFY_SAMPLE} archived buckets (frostline verify --sample \
                 {VERIFY_SAMPLE}) over {buckets} archived buckets"
            ),
            repeats,
            Some("a verification of a sample over 1,000,000 archived buckets takes at most 2x the same over 1,000"),
            &mut || verify_sample(runtime, &engine, VERIFY_SAMPLE),
        )?;
        timed(
            "the first page of a bucket listing",
            format!(
                "first page of 1,000 of a table's bucket listing (GET .../buckets) over {buckets} archived buckets"
            ),
            repeats,
            Some("the first page of a listing over 1,000,000 archived buckets takes at most 2x the same over 1,000"),
            &mut || {
                let request = frostline::ops::buckets::BucketsRequest {
                    table: TABLE.into(),
                    state: None,
                    partition: None,
                    limit: 1_000,
                };
                let page = frostline::ops::buckets::list(&engine, request)?;
                ensure!(page.buckets.len() == 1_000, "a listing of {}", page.buckets.len());
                Ok(())
            },
        )?;
        // The daily reconciliation lists the whole archive by design: its time grows with it,
        // its memory should not.
        let mut sweep_report = None;
        timed(
            "the full orphan sweep",
            format!("full orphan sweep (frostline sweep) over {buckets} archived buckets"),
            1,
            None,
            &mut || {
                sweep_report = Some(runtime.block_on(archive::sweep::sweep(&engine.context(), false))?);
                Ok(())
            },
        )?;
        let sweep_report = sweep_report.context("the full sweep ran")?;
        ensure!(sweep_report.deleted == 0, "the full sweep deleted {} objects", sweep_report.deleted);
        rows.last_mut().expect("the sweep's row").note = Some(format!(
            "The full sweep lists every object of the table's archive ({} listed here): the daily reconciliation, \
             which the hourly incremental sweep above stands in for between runs.",
            sweep_report.listed
        ));
        drop(engine);

        // What the store keeps per archived bucket once compacted (`frostline compact`).
        let before = std::fs::metadata(self.data().join(frostline::engine::DATABASE_FILE))?.len();
        let compaction = self.compact()?;
        let per_bucket = compaction.bytes_after as f64 / (buckets + self.added) as f64;
        let figure = Figure::new(
            bench.scenario,
            format!("hot store bytes per archived bucket after `frostline compact` over {buckets} archived buckets"),
            Unit::Bytes,
            vec![per_bucket],
            1,
        );
        rows.push(Measured {
            work: "",
            buckets,
            figure,
            peak_mib: None,
            target: Some("the metadata kept per archived bucket over 1,000,000 of them is at most 2x that over 1,000"),
            note: Some(format!(
                "`hot.redb` was {:.1} MB before the compaction and {:.1} MB after ({:.0} bytes per archived bucket \
                 before).",
                before as f64 / MEGABYTE,
                compaction.bytes_after as f64 / MEGABYTE,
                before as f64 / (buckets + self.added) as f64
            )),
        });
        Ok(rows)
    }

    /// Compacts the closed store, waiting for the last engine's heartbeats to let it go.
    fn compact(&self) -> Result<frostline::ops::local::Compaction> {
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match frostline::ops::local::compact(&self.data()) {
                Ok(compaction) => return Ok(compaction),
                Err(e) if Instant::now() >= deadline => return Err(e).context("compacting the archived store"),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
            }
        }
    }

    fn data(&self) -> std::path::PathBuf {
        self.root.path().join("data")
    }

    /// Opens the engine, waiting for the last one's lease heartbeats to let go of the store.
    fn open_with(&self, settings: Settings) -> Result<Arc<Engine>> {
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let clock = ManualClock::new(ARCHIVE_NOW_MICROS + MICROS_PER_DAY);
            match Engine::open(&self.data(), &self.root.path().join("policies"), settings.clone(), clock) {
                Ok(engine) => return Ok(engine),
                Err(e) if Instant::now() >= deadline => return Err(e).context("opening the archived store"),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
            }
        }
    }
}

fn policy(cold: &std::path::Path) -> String {
    format!(
        "[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n[[table]]\nid = \"{TABLE}\"\nformat = \"jsonl\"\n\
         target = \"cold\"\nstrategy = {{ plugin = \"builtin:calendar-day-utc\" }}\n\
         retention = {{ plugin = \"builtin:eligible-before\", config = {{ archive_after = \"1s\" }} }}\n",
        cold.display()
    )
}

/// The partition of bucket `n`.
fn partition(n: usize) -> String {
    format!("site/{:03}", n % PARTITIONS)
}

/// The start of the day of bucket `n`.
fn day_start(n: usize) -> Micros {
    DATASET_START_MICROS + (n / PARTITIONS) as Micros * MICROS_PER_DAY
}

/// One record in a bucket of its own (partition `name`, the day that starts at `day`).
fn bucket_record(name: &str, day: Micros) -> Record {
    Record {
        partition_key: name.as_bytes().to_vec(),
        event_time: day,
        sort_key: b"0".to_vec(),
        tenant: None,
        kind: None,
        body: reading_body(name, 0, 0),
    }
}

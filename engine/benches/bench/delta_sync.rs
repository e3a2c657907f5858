//! Scenario delta-sync: what a Delta sync costs as the table's history grows.
//!
//! A running engine keeps an index of its files in the log between syncs and updates it from
//! the buckets whose publication changed (`archive::delta`), so the sync after one new
//! publication should cost nearly the same on a table of 100,000 archived buckets (files in
//! its log) as on one of 200. Both tables are built the same way (one bucket per partition, two records each,
//! archived to a local directory), then each timed round appends one record to a new bucket and
//! runs passes until idle: the figure is the passes' `delta_log` phase (the sync, its log read
//! and its commit). The first sync of a process makes the index from every manifest the table
//! ever recorded: timed on the large table by reopening the engine before the round, the
//! figure a sync cost before the index was kept.
//!
//! Last, `frostline sweep` (the release binary, a full orphan sweep as an operator runs it) on
//! each table: its peak resident set, which should not grow with the archive it lists.

use std::sync::Arc;

use anyhow::{Result, ensure};
use frostline::archive::Phase;
use frostline::clock::ManualClock;
use frostline::engine::Engine;
use frostline::model::Record;
use frostline::model::time::MICROS_PER_DAY;

use crate::data::{ARCHIVE_NOW_MICROS, DATASET_START_MICROS, Dirs, passes_until_idle, reading_body};
use crate::harness::{Bench, Figure, Unit};

const TABLE: &str = "events";
const BUCKETS_SMALL: usize = 200;
const BUCKETS_LARGE: usize = 100_000;
/// The sync on the large table should cost at most twice the one on the small table.
const SCALE_RATIO_MIN: f64 = 0.5;
/// The smallest page cache the hot store takes (`FROSTLINE_STORE_CACHE_MIB`).
const STORE_CACHE_MIB: u64 = 4;

fn policy(dir: &std::path::Path) -> String {
    format!(
        "[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n[[table]]\nid = \"{TABLE}\"\nformat = \"parquet\"\n\
         target = \"cold\"\nstrategy = {{ plugin = \"builtin:calendar-day-utc\" }}\n\
         retention = {{ plugin = \"builtin:eligible-before\", config = {{ archive_after = \"1s\" }} }}\n",
        dir.display()
    )
}

/// Two records in a bucket of its own (partition `name`, the data set's first day).
fn bucket_records(name: &str) -> Vec<Record> {
    (0..2)
        .map(|i| Record {
            partition_key: name.as_bytes().to_vec(),
            event_time: DATASET_START_MICROS + i * 1_000_000,
            sort_key: format!("{i}").into_bytes(),
            tenant: None,
            kind: None,
            body: reading_body(name, i as usize, i as u64),
        })
        .collect()
}

struct Table {
    dirs: Dirs,
    _cold: tempfile::TempDir,
    engine: Option<Arc<Engine>>,
    added: usize,
}

impl Table {
    fn build(runtime: &tokio::runtime::Runtime, buckets: usize) -> Result<Table> {
        let cold = tempfile::tempdir()?;
        let dirs = Dirs::new(&policy(cold.path()))?;
        let mut table = Table { dirs, _cold: cold, engine: None, added: 0 };
        // Built with passes of 1,000 buckets, 8 at a time: 100,000 buckets in passes of 64
        // take a quarter of an hour.
        let build_settings = frostline::settings::Settings {
            scan_limit: 1_000,
            archive_concurrency: 8,
            ..frostline::settings::Settings::default()
        };
        let engine = table.open_with(build_settings)?;
        for chunk in (0..buckets).collect::<Vec<_>>().chunks(1_000) {
            let records = chunk.iter().flat_map(|n| bucket_records(&format!("p{n:06}"))).collect();
            engine.append(TABLE, records)?;
        }
        let mut archived = 0;
        while archived < buckets {
            let report = runtime.block_on(passes_until_idle(&engine))?;
            ensure!(report.errors.is_empty() && report.archived > 0, "building the table: {report:?}");
            archived += report.archived as usize;
        }
        ensure!(archived == buckets, "built {archived} of {buckets} archived buckets");
        // The timed rounds run on the default settings, as an engine runs. The claims' lease
        // heartbeats hold the engine's context until they see their stop, a moment after the
        // last pass: the store opens again once they have.
        drop(engine);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while let Err(e) = table.open() {
            ensure!(std::time::Instant::now() < deadline, "reopening the built table: {e}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Ok(table)
    }

    /// The engine, opened anew when `fresh` (a new process's first sync makes its index whole).
    fn open(&mut self) -> Result<Arc<Engine>> {
        self.open_with(frostline::settings::Settings::default())
    }

    fn open_with(&mut self, settings: frostline::settings::Settings) -> Result<Arc<Engine>> {
        self.engine = None;
        let engine = Engine::open(
            &self.dirs.data(),
            &self.dirs.policies(),
            settings,
            ManualClock::new(ARCHIVE_NOW_MICROS + MICROS_PER_DAY),
        )?;
        self.engine = Some(engine.clone());
        Ok(engine)
    }

    /// One new bucket archived; the milliseconds its passes spent syncing the Delta log.
    fn one_publication(&mut self, runtime: &tokio::runtime::Runtime, fresh: bool) -> Result<f64> {
        let engine = match (&self.engine, fresh) {
            (Some(engine), false) => engine.clone(),
            _ => self.open()?,
        };
        self.added += 1;
        engine.append(TABLE, bucket_records(&format!("new{:06}", self.added)))?;
        let report = runtime.block_on(passes_until_idle(&engine))?;
        ensure!(report.archived == 1 && report.errors.is_empty(), "one new bucket archived: {report:?}");
        Ok(report.seconds.get(Phase::DeltaLog) * 1_000.0)
    }
}

pub fn delta_sync(bench: &mut Bench) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut small = Table::build(&runtime, BUCKETS_SMALL)?;
    let mut large = Table::build(&runtime, BUCKETS_LARGE)?;
    // One untimed round each: the first sync of the builds' processes is behind them, and the
    // log's newest checkpoint is written.
    small.one_publication(&runtime, false)?;
    large.one_publication(&runtime, false)?;
    let (mut small_ms, mut large_ms, mut whole_ms) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..bench.options.repeats {
        // Alternate which goes first, so leftover disk work from one lands on both alike.
        if round % 2 == 0 {
            small_ms.push(small.one_publication(&runtime, false)?);
            large_ms.push(large.one_publication(&runtime, false)?);
        } else {
            large_ms.push(large.one_publication(&runtime, false)?);
            small_ms.push(small.one_publication(&runtime, false)?);
        }
        whole_ms.push(large.one_publication(&runtime, true)?);
    }
    let small_figure = Figure::new(
        bench.scenario,
        format!("Delta sync of a running engine after one publication, {BUCKETS_SMALL} archived buckets"),
        Unit::Millis,
        small_ms,
        1,
    );
    let whole_figure = Figure::new(
        bench.scenario,
        format!(
            "the first Delta sync of a process after one publication, {BUCKETS_LARGE} archived buckets (every manifest read)"
        ),
        Unit::Millis,
        whole_ms,
        1,
    );
    let large_figure = Figure::new(
        bench.scenario,
        format!("Delta sync of a running engine after one publication, {BUCKETS_LARGE} archived buckets"),
        Unit::Millis,
        large_ms,
        1,
    )
    .against(&small_figure)
    .with_target(SCALE_RATIO_MIN, "a sync on 100,000 archived buckets costs at most twice one on 200")
    .with_note(
        "A running engine's sync reads only the log's new commits, updates its file index from the buckets \
         whose publication changed, and plans over the paths that changed on either side (`archive::delta::plan`). \
         What still grows with the table is every 10th commit's checkpoint (delta-rs loads every file's action \
         and writes them all): the maximum, not the median."
            .to_string(),
    );
    let kept_against_whole = Figure::new(
        bench.scenario,
        format!("Delta sync of a running engine after one publication, {BUCKETS_LARGE} archived buckets (against the first sync of a process)"),
        Unit::Millis,
        large_figure.samples.clone(),
        1,
    )
    .against(&whole_figure);
    bench.push(small_figure);
    bench.push(large_figure);
    bench.push(whole_figure);
    bench.push(kept_against_whole);
    full_sweep_peak(bench, &mut small, &mut large)
}

/// `frostline sweep` on each table (and the few buckets its timed rounds added), with its
/// engine closed: the peak resident set of the process and the time it took, as an operator
/// runs it, and again with the hot store's page cache at its smallest (`STORE_CACHE_MIB`), so
/// what the sweep itself holds shows apart from the cache (64 MiB by default, a fixed bound the
/// large table fills and the small one does not). Skipped without the release binary.
fn full_sweep_peak(bench: &mut Bench, small: &mut Table, large: &mut Table) -> Result<()> {
    let binary = match crate::data::release_binary() {
        Ok(binary) => binary,
        Err(reason) => {
            bench.skip(&["full orphan sweep"], reason);
            return Ok(());
        }
    };
    // (peak MiB, milliseconds) by table, then by cache.
    let mut measured = Vec::new();
    for table in [small, large] {
        table.engine = None;
        let mut by_cache = Vec::new();
        for cache in [None, Some(STORE_CACHE_MIB)] {
            let cache_text = cache.map(|mib| mib.to_string());
            let env: Vec<(&str, &str)> =
                cache_text.iter().map(|mib| ("FROSTLINE_STORE_CACHE_MIB", mib.as_str())).collect();
            // The claims' lease heartbeats hold the store a moment after the last pass.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let (status, peak_mib, seconds) = crate::footprint::run_with_peak_env(
                    &binary,
                    &["sweep"],
                    &table.dirs.data(),
                    &table.dirs.policies(),
                    &env,
                )?;
                if status == 0 {
                    by_cache.push((peak_mib, seconds * 1_000.0));
                    break;
                }
                ensure!(std::time::Instant::now() < deadline, "`frostline sweep` exited with status {status}");
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
        measured.push(by_cache);
    }
    for (cache, cache_label) in [(0, String::new()), (1, format!(", page cache {STORE_CACHE_MIB} MiB"))] {
        let peak = |buckets: usize, mib: f64| {
            Figure::new(
                bench.scenario,
                format!(
                    "peak resident memory of `frostline sweep` (full) over {buckets} archived buckets{cache_label}"
                ),
                Unit::Mebibytes,
                vec![mib],
                1,
            )
        };
        let small_peak = peak(BUCKETS_SMALL, measured[0][cache].0);
        let mut large_peak = peak(BUCKETS_LARGE, measured[1][cache].0).against(&small_peak);
        if cache == 1 {
            large_peak = large_peak.with_target(
                SCALE_RATIO_MIN,
                "what the full sweep holds over 100,000 archived buckets is at most twice what it holds over 200",
            );
        } else {
            large_peak = large_peak.with_note(format!(
                "Mostly the hot store's page cache ({} MiB by default, `FROSTLINE_STORE_CACHE_MIB`), which reading \
                 100,000 buckets' references fills and 200 do not, and memory freed by the reads that the process \
                 keeps (the figure varies between runs of one binary): the same sweeps with a cache of \
                 {STORE_CACHE_MIB} MiB are the rows below",
                frostline::settings::STORE_CACHE_MIB_DEFAULT
            ));
        }
        bench.push(small_peak);
        bench.push(large_peak);
    }
    for (buckets, by_cache) in [(BUCKETS_SMALL, &measured[0]), (BUCKETS_LARGE, &measured[1])] {
        bench.push(Figure::new(
            bench.scenario,
            format!("`frostline sweep` (full, a new process) over {buckets} archived buckets"),
            Unit::Millis,
            vec![by_cache[0].1],
            1,
        ));
    }
    Ok(())
}

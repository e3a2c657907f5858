//! frostline's benchmark harness:
//! `cargo bench --bench frostline-bench -- [--full] [--json FILE] [--only NAME] [--repeats N] [--list]`.
//!
//! No framework. Every timed figure is taken R times (`REPEATS_DEFAULT`, or `--repeats`) and
//! reported as median, min and max: the machines this runs on are shared and noisy, so the
//! median is the figure quoted. A per-operation figure loops its operation long enough
//! (`SAMPLE_MS_DEFAULT`, `SAMPLE_MS_FULL` with `--full`) to swamp the timer. Figures that are
//! compared (WASM against the same logic in native Rust) are sampled round by round, one
//! sample of each per round, so a burst of load elsewhere on the machine hits both alike; so are
//! whole runs compared with a baseline (appends against plain redb, a pass against the I/O
//! floor), one run of each per round.
//!
//! A ratio is `baseline median / figure median` for a duration and `figure median / baseline
//! median` for a rate (records/s, MB/s), so either way 1.0 is as fast as the baseline, 0.25
//! four times slower, 300 three hundred times faster. A figure may carry a target on its
//! ratio; `scripts/bench` lists missed targets at the top of BENCHMARKS.md, with a note on what
//! limits the figure when the scenario measured one.
//!
//! Adding a scenario: write a `fn(&mut Bench) -> Result<()>` that records figures through
//! `Bench::compare`, `Bench::time_each` and `Bench::push`, and add a row to `SCENARIOS`.
//!
//! `cargo bench` runs this binary from `engine/`, so a relative `--json` path is relative to
//! `engine/`; `scripts/bench` passes an absolute one.

use std::collections::HashMap;
use std::hint::black_box;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use frostline::archive::{self, PassReport};
use frostline::clock::ManualClock;
use frostline::engine::Engine;
use frostline::format::manifest::{MANIFEST_VERSION, Manifest, SegmentInfo, sha256_hex};
use frostline::model::rows::summarize;
use frostline::model::time::{MICROS_PER_DAY, MICROS_PER_SECOND, format_rfc3339};
use frostline::model::{BucketDescriptor, BucketStrategy as _, Micros, Record};
use frostline::plugin::builtin;
use frostline::plugin::retention::WasmRetention;
use frostline::plugin::strategy::WasmStrategy;
use frostline::plugin::{LoadedPlugin, PluginHost, PluginLimits, PluginSource, Role};
use frostline::settings::Settings;
use frostline::storage::{PutOutcome, keys};
use frostline::store::schema::{self, BucketId, BucketMeta, StoredRow, UploadIntent};
use frostline::store::{AppendBatch, PreparedRow};
use redb::{ReadableDatabase as _, ReadableTable as _, ReadableTableMetadata as _};
use serde::Serialize;
use sha2::{Digest as _, Sha256};

const REPEATS_DEFAULT: usize = 7;
/// How long one sample of a per-operation figure runs.
const SAMPLE_MS_DEFAULT: u64 = 40;
const SAMPLE_MS_FULL: u64 = 200;
/// How long the calibration (and warm-up) of a per-operation figure runs at least.
const CALIBRATE_MS: u64 = 20;
const SAMPLE_ITERATIONS_MAX: u64 = 100_000_000;
/// Times per batch in the `plugin-call` batch figures.
const BATCH_TIMES: usize = 1_000;
/// Extra batch sizes measured with `--full` (4,096 is the host's batch maximum).
const BATCH_TIMES_FULL: &[usize] = &[1, 10, 100, 4_096];
/// Compiling an interpreter component (12-18 MB) takes seconds, so without `--full` it is
/// repeated only this many times to keep the default run under two minutes.
const SLOW_COMPILE_REPEATS_DEFAULT: usize = 3;
const SLOW_COMPILE_BYTES_MIN: usize = 1024 * 1024;
/// The cached strategy path (descriptor cache hit) should be within 5% of native speed.
const CACHED_PATH_RATIO_MIN: f64 = 0.95;
/// Names a directory holding the Python and JavaScript example components.
const EXAMPLE_PLUGINS_ENV: &str = "FROSTLINE_EXAMPLE_PLUGINS";
/// Set by `scripts/bench` to the command line it was run with.
const COMMAND_ENV: &str = "FROSTLINE_BENCH_COMMAND";
/// Seed of the pseudo-random event times, fixed so every run asks about the same times.
const TIMES_SEED: u64 = 0x5eed_f205_71e0;

/// One named scenario.
struct Scenario {
    name: &'static str,
    about: &'static str,
    run: fn(&mut Bench) -> Result<()>,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "plugin-call",
        about: "host-to-guest call cost of the built-in calendar-year-utc strategy against the same function in native Rust",
        run: plugin_call,
    },
    Scenario {
        name: "plugin-load",
        about: "compiling, loading from the compiled cache and instantiating each plugin component",
        run: plugin_load,
    },
    Scenario {
        name: "append",
        about: "append throughput through Engine::append and `frostline ingest` against plain redb inserts of the same records with the same durability",
        run: append,
    },
    Scenario {
        name: "archive",
        about: "archive throughput of run_pass to the local-directory target against the floor for the same bytes (write, fsync, read back, SHA-256)",
        run: archive,
    },
    Scenario {
        name: "formats",
        about: "archive size and throughput per segment format for the same records, and a cold query of one bucket per format against the same query while the bucket is hot",
        run: formats,
    },
];

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("frostline-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let raw_args: Vec<String> = std::env::args().skip(1).collect();
    let options = Options::parse(&raw_args)?;
    if options.help {
        print!("{}", usage());
        return Ok(());
    }
    if options.list {
        for s in SCENARIOS {
            println!("{:<14} {}", s.name, s.about);
        }
        return Ok(());
    }
    let selected: Vec<&Scenario> =
        SCENARIOS.iter().filter(|s| options.only.is_empty() || options.only.iter().any(|o| o == s.name)).collect();

    let run_info = RunInfo::collect(&raw_args);
    println!("frostline-bench: {}", run_info.command);
    println!(
        "machine: {} ({} cores, {:.1} GiB), load average {}; commit {}; {}",
        run_info.machine.cpu_model,
        run_info.machine.nproc,
        run_info.machine.memory_bytes as f64 / GIB,
        run_info.machine.loadavg_start,
        run_info.commit,
        run_info.date
    );
    println!(
        "each figure: median of {} runs (min..max beside it); ratio to baseline: above 1 faster, below 1 slower",
        options.repeats
    );

    let started = Instant::now();
    let mut bench = Bench::new(options);
    let mut scenario_reports = Vec::new();
    for scenario in selected {
        println!("\n== {}: {}", scenario.name, scenario.about);
        print_header();
        bench.scenario = scenario.name;
        let scenario_started = Instant::now();
        (scenario.run)(&mut bench).with_context(|| format!("scenario `{}` failed", scenario.name))?;
        scenario_reports.push(ScenarioReport {
            name: scenario.name,
            about: scenario.about,
            seconds: scenario_started.elapsed().as_secs_f64(),
        });
    }
    let total_seconds = started.elapsed().as_secs_f64();

    let missed: Vec<&Figure> = bench.figures.iter().filter(|f| f.target.as_ref().is_some_and(|t| !t.met)).collect();
    println!();
    if missed.is_empty() {
        println!("targets: all met");
    } else {
        println!("targets missed:");
        for f in &missed {
            let target = f.target.as_ref().expect("filtered on target");
            let ratio = f.baseline.as_ref().map_or(f64::NAN, |b| b.ratio);
            println!(
                "  {} / {}: ratio {}, target >= {} ({})",
                f.scenario,
                f.name,
                ratio_text(ratio),
                target.ratio_min,
                target.about
            );
            if let Some(note) = &f.note {
                println!("    what limits it: {note}");
            }
        }
    }
    println!("total: {total_seconds:.1} s");

    if let Some(path) = &bench.options.json {
        let document = Document {
            schema: 1,
            tool: "frostline-bench",
            command: run_info.command,
            argv: run_info.argv,
            date: run_info.date,
            commit: run_info.commit,
            rustc: run_info.rustc,
            machine: Machine { loadavg_end: read_loadavg(), ..run_info.machine },
            options: OptionsReport {
                full: bench.options.full,
                repeats: bench.options.repeats,
                sample_ms: bench.sample_ms(),
                only: bench.options.only.clone(),
            },
            ratio_definition: RATIO_DEFINITION,
            total_seconds,
            scenarios: scenario_reports,
            figures: &bench.figures,
            skipped: &bench.skipped,
        };
        let text = serde_json::to_string_pretty(&document)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Command line

struct Options {
    full: bool,
    json: Option<PathBuf>,
    only: Vec<String>,
    repeats: usize,
    list: bool,
    help: bool,
}

fn usage() -> String {
    let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
    format!(
        "usage: cargo bench --bench frostline-bench -- [--full] [--json FILE] [--only NAME]... [--repeats N] [--list]\n\
         \n\
         --full        longer samples, every compile repeated R times, extra batch sizes,\n\
                       1,000,000 records in append and archive (default 100,000 and 200,000)\n\
         --json FILE   also write every figure as JSON (relative to engine/)\n\
         --only NAME   run only this scenario (repeatable, or comma-separated): {}\n\
         --repeats N   runs per figure (default {REPEATS_DEFAULT})\n\
         --list        list the scenarios\n\
         \n\
         {EXAMPLE_PLUGINS_ENV}=DIR adds the Python and JavaScript examples (DIR/iso-week-py.wasm,\n\
         DIR/fiscal-quarter-js.wasm, built by plugins/examples/build.sh DIR) to plugin-load.\n\
         append also times `frostline ingest` with $CARGO_TARGET_DIR/release/frostline (default: the\n\
         target directory of this binary; `cargo bench` and scripts/bench build it).\n",
        names.join(", ")
    )
}

impl Options {
    fn parse(args: &[String]) -> Result<Options> {
        let mut options =
            Options { full: false, json: None, only: Vec::new(), repeats: REPEATS_DEFAULT, list: false, help: false };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value =
                |flag: &str| args.next().cloned().with_context(|| format!("{flag} needs a value\n\n{}", usage()));
            match arg.as_str() {
                // `cargo bench` passes `--bench` to every bench binary.
                "--bench" => {}
                "--full" => options.full = true,
                "--list" => options.list = true,
                "-h" | "--help" => options.help = true,
                "--json" => options.json = Some(PathBuf::from(value("--json")?)),
                "--only" => options.only.extend(value("--only")?.split(',').map(|s| s.trim().to_string())),
                "--repeats" => {
                    let text = value("--repeats")?;
                    options.repeats = text
                        .parse()
                        .ok()
                        .filter(|n| *n >= 1)
                        .with_context(|| format!("--repeats takes a whole number of at least 1, not `{text}`"))?;
                }
                other => bail!("unknown argument `{other}`\n\n{}", usage()),
            }
        }
        for name in &options.only {
            ensure!(
                SCENARIOS.iter().any(|s| s.name == name),
                "unknown scenario `{name}` in --only; the scenarios are: {}",
                SCENARIOS.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
            );
        }
        Ok(options)
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring and recording

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
/// How every ratio is computed; the report quotes it.
const RATIO_DEFINITION: &str = "baseline median / figure median for a duration, figure median / baseline median for a \
     rate (records/s, MB/s): either way 1 = as fast as the baseline, below 1 slower, above 1 faster";

#[derive(Debug, Clone, Copy, Serialize)]
enum Unit {
    #[serde(rename = "ns/call")]
    NsPerCall,
    #[serde(rename = "ns/time")]
    NsPerTime,
    #[serde(rename = "us")]
    Micros,
    #[serde(rename = "ms")]
    Millis,
    #[serde(rename = "bytes")]
    Bytes,
    #[serde(rename = "records/s")]
    RecordsPerSecond,
    /// Megabytes (10^6 bytes) per second.
    #[serde(rename = "MB/s")]
    MegabytesPerSecond,
}

impl Unit {
    fn label(self) -> &'static str {
        match self {
            Unit::NsPerCall => "ns/call",
            Unit::NsPerTime => "ns/time",
            Unit::Micros => "us",
            Unit::Millis => "ms",
            Unit::Bytes => "bytes",
            Unit::RecordsPerSecond => "records/s",
            Unit::MegabytesPerSecond => "MB/s",
        }
    }

    /// A rate: more is faster, so its ratio to a baseline is figure / baseline.
    fn is_rate(self) -> bool {
        matches!(self, Unit::RecordsPerSecond | Unit::MegabytesPerSecond)
    }

    /// Converts a duration in nanoseconds into this unit.
    fn scale_ns(self, ns: f64) -> f64 {
        match self {
            Unit::NsPerCall | Unit::NsPerTime | Unit::Bytes => ns,
            Unit::Micros => ns / 1e3,
            Unit::Millis => ns / 1e6,
            Unit::RecordsPerSecond | Unit::MegabytesPerSecond => {
                panic!("a rate is work over a duration, not a scaled duration")
            }
        }
    }
}

#[derive(Debug, Serialize)]
struct Baseline {
    name: String,
    median: f64,
    /// `baseline.median / figure.median` for a duration, `figure.median / baseline.median` for
    /// a rate: above 1 is faster either way.
    ratio: f64,
}

#[derive(Debug, Serialize)]
struct Target {
    ratio_min: f64,
    met: bool,
    about: &'static str,
}

#[derive(Debug, Serialize)]
struct Figure {
    scenario: &'static str,
    name: String,
    unit: Unit,
    median: f64,
    min: f64,
    max: f64,
    /// Every sample, in the order taken, in `unit`.
    samples: Vec<f64>,
    /// Operations timed together in one sample (1 for one-shot figures).
    iterations_per_sample: u64,
    baseline: Option<Baseline>,
    target: Option<Target>,
    /// What limits the figure, when the scenario measured it (a phase breakdown).
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

impl Figure {
    fn new(scenario: &'static str, name: impl Into<String>, unit: Unit, samples: Vec<f64>, iterations: u64) -> Self {
        assert!(!samples.is_empty(), "a figure needs at least one sample");
        Figure {
            scenario,
            name: name.into(),
            unit,
            median: median(&samples),
            min: samples.iter().copied().fold(f64::INFINITY, f64::min),
            max: samples.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            samples,
            iterations_per_sample: iterations,
            baseline: None,
            target: None,
            note: None,
        }
    }

    /// Compares this figure with `baseline` (same unit): ratio = baseline median / this median
    /// for a duration, this median / baseline median for a rate.
    fn against(mut self, baseline: &Figure) -> Self {
        assert_eq!(self.unit.label(), baseline.unit.label(), "a baseline must have the same unit");
        let ratio = if self.unit.is_rate() { self.median / baseline.median } else { baseline.median / self.median };
        self.baseline = Some(Baseline { name: baseline.name.clone(), median: baseline.median, ratio });
        self
    }

    fn with_target(mut self, ratio_min: f64, about: &'static str) -> Self {
        let ratio = self.baseline.as_ref().expect("a target is on the ratio to a baseline").ratio;
        self.target = Some(Target { ratio_min, met: ratio >= ratio_min, about });
        self
    }

    fn met_target(&self) -> bool {
        self.target.as_ref().is_none_or(|t| t.met)
    }

    fn with_note(mut self, note: String) -> Self {
        self.note = Some(note);
        self
    }
}

/// The median of `samples` (the mean of the middle two for an even count).
fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 }
}

#[derive(Debug, Serialize)]
struct Skipped {
    scenario: &'static str,
    rows: Vec<String>,
    reason: String,
}

/// One operation to time: `run(n)` performs it `n` times.
struct Case<'a> {
    name: String,
    unit: Unit,
    /// Units of work per operation (times per batch), to report per time rather than per call.
    work_per_op: u64,
    run: Box<dyn FnMut(u64) -> Result<()> + 'a>,
}

fn case<'a>(
    name: impl Into<String>,
    unit: Unit,
    work_per_op: u64,
    mut op: impl FnMut() -> Result<()> + 'a,
) -> Case<'a> {
    Case {
        name: name.into(),
        unit,
        work_per_op,
        run: Box::new(move |n| {
            for _ in 0..n {
                op()?;
            }
            Ok(())
        }),
    }
}

struct Bench {
    options: Options,
    scenario: &'static str,
    figures: Vec<Figure>,
    skipped: Vec<Skipped>,
}

impl Bench {
    fn new(options: Options) -> Self {
        Bench { options, scenario: "", figures: Vec::new(), skipped: Vec::new() }
    }

    fn sample_ms(&self) -> u64 {
        if self.options.full { SAMPLE_MS_FULL } else { SAMPLE_MS_DEFAULT }
    }

    /// Times per-operation cases, one sample of each per round, R rounds. The figures come
    /// back in the order of `cases` for the caller to relate and `push`.
    fn compare(&self, mut cases: Vec<Case<'_>>) -> Result<Vec<Figure>> {
        let sample_ns = self.sample_ms() * 1_000_000;
        let mut iterations = Vec::with_capacity(cases.len());
        for c in &mut cases {
            iterations
                .push(calibrate(c.run.as_mut(), sample_ns).with_context(|| format!("while timing `{}`", c.name))?);
        }
        let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(self.options.repeats); cases.len()];
        for _ in 0..self.options.repeats {
            for ((c, &n), out) in cases.iter_mut().zip(&iterations).zip(&mut samples) {
                let start = Instant::now();
                (c.run)(n).with_context(|| format!("while timing `{}`", c.name))?;
                let elapsed_ns = start.elapsed().as_nanos() as f64;
                out.push(c.unit.scale_ns(elapsed_ns / (n * c.work_per_op) as f64));
            }
        }
        Ok(cases
            .into_iter()
            .zip(iterations)
            .zip(samples)
            .map(|((c, n), s)| Figure::new(self.scenario, c.name, c.unit, s, n))
            .collect())
    }

    /// Times `run` once per sample, `repeats` times; `setup` runs before each sample, untimed.
    /// Whatever `run` returns is dropped after the clock stops.
    fn time_each<S, T>(
        &self,
        name: impl Into<String>,
        unit: Unit,
        repeats: usize,
        mut setup: impl FnMut() -> Result<S>,
        mut run: impl FnMut(S) -> Result<T>,
    ) -> Result<Figure> {
        let name = name.into();
        let mut samples = Vec::with_capacity(repeats);
        for _ in 0..repeats {
            let input = setup().with_context(|| format!("while setting up `{name}`"))?;
            let start = Instant::now();
            let output = run(input).with_context(|| format!("while timing `{name}`"))?;
            samples.push(unit.scale_ns(start.elapsed().as_nanos() as f64));
            drop(output);
        }
        Ok(Figure::new(self.scenario, name, unit, samples, 1))
    }

    fn push(&mut self, figure: Figure) {
        print_row(&figure);
        self.figures.push(figure);
    }

    fn skip(&mut self, rows: &[&str], reason: String) {
        println!("  skipped {}: {reason}", rows.join(", "));
        self.skipped.push(Skipped {
            scenario: self.scenario,
            rows: rows.iter().map(|r| r.to_string()).collect(),
            reason,
        });
    }
}

/// Runs the operation for at least `CALIBRATE_MS` (which also warms it up) and returns how
/// many iterations fill one sample of `sample_ns`.
fn calibrate(run: &mut dyn FnMut(u64) -> Result<()>, sample_ns: u64) -> Result<u64> {
    run(1)?;
    let mut n: u64 = 1;
    loop {
        let start = Instant::now();
        run(n)?;
        let elapsed_ns = start.elapsed().as_nanos().max(1) as u64;
        if elapsed_ns >= CALIBRATE_MS * 1_000_000 || n >= SAMPLE_ITERATIONS_MAX {
            let per_op_ns = elapsed_ns as f64 / n as f64;
            return Ok(((sample_ns as f64 / per_op_ns).ceil() as u64).clamp(1, SAMPLE_ITERATIONS_MAX));
        }
        n = n.saturating_mul(2);
    }
}

const NAME_WIDTH: usize = 74;

fn print_header() {
    println!(
        "  {:<NAME_WIDTH$} {:>12} {:>12} {:>12} {:<7} {:>3}  ratio to baseline",
        "figure", "median", "min", "max", "unit", "n"
    );
}

fn print_row(f: &Figure) {
    let vs = match &f.baseline {
        Some(b) => format!("{} vs {}", ratio_text(b.ratio), b.name),
        None => String::new(),
    };
    let missed = match &f.target {
        Some(t) if !t.met => format!("  MISSES TARGET >= {}", t.ratio_min),
        _ => String::new(),
    };
    println!(
        "  {:<NAME_WIDTH$} {:>12} {:>12} {:>12} {:<7} {:>3}  {vs}{missed}",
        f.name,
        number(f.median),
        number(f.min),
        number(f.max),
        f.unit.label(),
        f.samples.len()
    );
    let _ = std::io::stdout().flush();
}

/// `0.126 (7.9x slower)`, `1.106`, `218.7`.
fn ratio_text(ratio: f64) -> String {
    if ratio < 1.0 { format!("{ratio:.3} ({:.1}x slower)", 1.0 / ratio) } else { number(ratio) }
}

/// A number with about four significant digits and no exponent.
fn number(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 100.0 {
        format!("{v:.1}")
    } else if v >= 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

// ---------------------------------------------------------------------------------------------
// The native calendar-year-utc strategy: the guest's logic, in the host, for comparison.

/// 0001-01-01T00:00:00Z and 10000-01-01T00:00:00Z: the guest's supported range.
const SUPPORTED_START_MICROS: Micros = days_from_civil(1, 1, 1) * MICROS_PER_DAY;
const SUPPORTED_END_MICROS: Micros = days_from_civil(10_000, 1, 1) * MICROS_PER_DAY;
/// Day 0 is 1970-01-01; Hinnant's algorithms count from 0000-03-01, this many days earlier.
const DAYS_0000_03_01_TO_EPOCH: i64 = 719_468;
const DAYS_PER_400_YEARS: i64 = 146_097;

/// What the native strategy answers: the same fields as the guest's descriptor.
#[derive(Debug, PartialEq, Eq)]
struct NativeBucket {
    key: String,
    start: Micros,
    end: Micros,
}

fn native_calendar_year_utc(t: Micros) -> std::result::Result<NativeBucket, String> {
    if !(SUPPORTED_START_MICROS..SUPPORTED_END_MICROS).contains(&t) {
        return Err(format!("event time {t} is outside years 0001 through 9999"));
    }
    let (year, _, _) = civil_from_days(t.div_euclid(MICROS_PER_DAY));
    Ok(NativeBucket {
        key: format!("year:{year:04}"),
        start: days_from_civil(year, 1, 1) * MICROS_PER_DAY,
        end: days_from_civil(year + 1, 1, 1) * MICROS_PER_DAY,
    })
}

fn native_batch(times: &[Micros]) -> std::result::Result<Vec<NativeBucket>, String> {
    times.iter().map(|&t| native_calendar_year_utc(t)).collect()
}

/// Days since 1970-01-01 of `year-month-day` (H. Hinnant's `days_from_civil`).
const fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let m = month as i64;
    let month_from_march = if m > 2 { m - 3 } else { m + 9 };
    let day_of_year = (153 * month_from_march + 2) / 5 + day as i64 - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * DAYS_PER_400_YEARS + day_of_era - DAYS_0000_03_01_TO_EPOCH
}

/// `(year, month, day)` of a day number counted from 1970-01-01 (H. Hinnant's `civil_from_days`).
const fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + DAYS_0000_03_01_TO_EPOCH;
    let era = z.div_euclid(DAYS_PER_400_YEARS);
    let day_of_era = z - era * DAYS_PER_400_YEARS;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 } as u32;
    let year = year_of_era + era * 400;
    (if month <= 2 { year + 1 } else { year }, month, day)
}

/// `count` pseudo-random times in [1970, 2100), unsorted: each falls in one of 130 years, so
/// consecutive times rarely share a bucket and both sides compute every answer.
fn spread_times(count: usize) -> Vec<Micros> {
    let span = (days_from_civil(2100, 1, 1) * MICROS_PER_DAY) as u64;
    let mut state = TIMES_SEED;
    (0..count).map(|_| (splitmix64(&mut state) % span) as Micros).collect()
}

/// `count` sorted times within 2025, like one batch of appends.
fn times_in_one_year(count: usize) -> Vec<Micros> {
    let start = days_from_civil(2025, 1, 1) * MICROS_PER_DAY;
    let span = (365 * MICROS_PER_DAY) as u64;
    let mut state = TIMES_SEED ^ 1;
    let mut times: Vec<Micros> = (0..count).map(|_| start + (splitmix64(&mut state) % span) as Micros).collect();
    times.sort_unstable();
    times
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------------------------------------
// Scenario plugin-call

fn calendar_year_strategy(host: &PluginHost) -> Result<WasmStrategy> {
    let builtin = builtin::find("calendar-year-utc").context("the built-in calendar-year-utc is missing")?;
    let loaded = host.load(&builtin.source(), Role::BucketStrategy, PluginLimits::default())?;
    let config = builtin.effective_config("").map_err(anyhow::Error::msg)?;
    Ok(WasmStrategy::new(loaded, config)?)
}

/// Checks that the guest and the native function give identical answers, so the comparison
/// is of equal work.
fn check_same_answers(strategy: &WasmStrategy, times: &[Micros]) -> Result<()> {
    let same = |t: Micros, d: &frostline::model::BucketDescriptor| -> Result<()> {
        let native = native_calendar_year_utc(t).map_err(anyhow::Error::msg)?;
        ensure!(
            (native.key.as_str(), native.start, native.end) == (d.key.as_str(), d.start, d.end),
            "native and WASM disagree at {t}: native {native:?}, WASM {d:?}"
        );
        Ok(())
    };
    let edges = [SUPPORTED_START_MICROS, -1, 0, 1, SUPPORTED_END_MICROS - 1];
    for &t in edges.iter().chain(times) {
        same(t, &strategy.ask_one_uncached(t)?.map_err(anyhow::Error::msg)?)?;
    }
    for (&t, d) in times.iter().zip(strategy.ask_uncached(times)?) {
        same(t, &d.map_err(anyhow::Error::msg)?)?;
    }
    for (&t, d) in times.iter().zip(strategy.buckets_for(times)?) {
        same(t, &d)?;
    }
    ensure!(native_calendar_year_utc(SUPPORTED_END_MICROS).is_err(), "native accepts a time past year 9999");
    ensure!(strategy.ask_one_uncached(SUPPORTED_END_MICROS)?.is_err(), "WASM accepts a time past year 9999");
    Ok(())
}

fn plugin_call(bench: &mut Bench) -> Result<()> {
    let host = PluginHost::new(None)?;
    let strategy = calendar_year_strategy(&host)?;
    let times = spread_times(BATCH_TIMES);
    // Also fills the descriptor cache with every bucket `times` falls in.
    check_same_answers(&strategy, &times)?;

    // One call per time: the raw cost of crossing the boundary.
    let mut next_wasm = times.iter().copied().cycle();
    let mut next_native = times.iter().copied().cycle();
    let [wasm_one, native_one]: [Figure; 2] = bench
        .compare(vec![
            case("WASM bucket-for, one call per time (ask_one_uncached)", Unit::NsPerCall, 1, || {
                let t = next_wasm.next().expect("cycle");
                let d = strategy.ask_one_uncached(black_box(t))?.map_err(anyhow::Error::msg)?;
                black_box(d);
                Ok(())
            }),
            case("native bucket_for", Unit::NsPerCall, 1, || {
                let t = next_native.next().expect("cycle");
                black_box(native_calendar_year_utc(black_box(t)).map_err(anyhow::Error::msg)?);
                Ok(())
            }),
        ])?
        .try_into()
        .expect("two cases");
    let wasm_one = wasm_one.against(&native_one);
    bench.push(native_one);
    bench.push(wasm_one);

    // Batches: the boundary cost shared by 1,000 times, and the host's descriptor cache.
    let mut batch_sizes = vec![BATCH_TIMES];
    if bench.options.full {
        batch_sizes.extend_from_slice(BATCH_TIMES_FULL);
    }
    for size in batch_sizes {
        let batch = spread_times(size);
        let [wasm, native]: [Figure; 2] = bench
            .compare(vec![
                case(
                    format!("WASM buckets-for, batch of {size}, 130 years (ask_uncached)"),
                    Unit::NsPerTime,
                    size as u64,
                    || {
                        black_box(strategy.ask_uncached(black_box(&batch))?);
                        Ok(())
                    },
                ),
                case(format!("native bucket_for, batch of {size}, 130 years"), Unit::NsPerTime, size as u64, || {
                    black_box(native_batch(black_box(&batch)).map_err(anyhow::Error::msg)?);
                    Ok(())
                }),
            ])?
            .try_into()
            .expect("two cases");
        let wasm = wasm.against(&native);
        bench.push(native);
        bench.push(wasm);
    }

    // The cached path: every time falls in a bucket the host already knows.
    let mut cached_sets = vec![("batch of 1000, 130 years", times.clone())];
    if bench.options.full {
        let one_year = times_in_one_year(BATCH_TIMES);
        strategy.buckets_for(&one_year)?;
        cached_sets.push(("batch of 1000, sorted, one year", one_year));
    }
    let calls = || strategy.counters().calls.load(Ordering::Relaxed);
    for (label, set) in cached_sets {
        let calls_before = calls();
        let [cached, native]: [Figure; 2] = bench
            .compare(vec![
                case(
                    format!("WASM strategy, cached path, {label} (buckets_for)"),
                    Unit::NsPerTime,
                    set.len() as u64,
                    || {
                        black_box(strategy.buckets_for(black_box(&set))?);
                        Ok(())
                    },
                ),
                case(format!("native bucket_for, {label}"), Unit::NsPerTime, set.len() as u64, || {
                    black_box(native_batch(black_box(&set)).map_err(anyhow::Error::msg)?);
                    Ok(())
                }),
            ])?
            .try_into()
            .expect("two cases");
        // The figure is of the cache only if the plugin was never asked while it was timed.
        let asked = calls() - calls_before;
        ensure!(asked == 0, "the cached path called the plugin {asked} times; its buckets were not all known");
        let cached = cached
            .against(&native)
            .with_target(CACHED_PATH_RATIO_MIN, "the cached strategy path runs at >= 95% of native speed");
        bench.push(native);
        bench.push(cached);
    }
    let faults = strategy.counters().faults.load(Ordering::Relaxed);
    ensure!(faults == 0, "the strategy faulted {faults} times during {} calls", calls());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Scenario plugin-load

/// A component to load, with the role and configuration it is instantiated with.
struct Subject {
    label: String,
    source: PluginSource,
    role: Role,
    config: String,
}

/// The example components looked for in `$FROSTLINE_EXAMPLE_PLUGINS`: file, label, config.
const EXAMPLES: &[(&str, &str, &str)] = &[
    ("iso-week-py.wasm", "iso-week-py (Python)", ""),
    ("fiscal-quarter-js.wasm", "fiscal-quarter-js (JavaScript)", r#"{"first_month": 4}"#),
];

fn subjects(bench: &mut Bench) -> Result<Vec<Subject>> {
    let mut out = Vec::new();
    for (name, label) in [
        ("calendar-year-utc", "calendar_utc (built-in, Rust)"),
        ("eligible-before", "eligible_before (built-in, Rust)"),
    ] {
        let builtin = builtin::find(name).with_context(|| format!("the built-in {name} is missing"))?;
        out.push(Subject {
            label: label.to_string(),
            source: builtin.source(),
            role: builtin.role,
            config: builtin.effective_config("").map_err(anyhow::Error::msg)?,
        });
    }
    let rows: Vec<&str> = EXAMPLES.iter().map(|(file, _, _)| *file).collect();
    match std::env::var_os(EXAMPLE_PLUGINS_ENV) {
        None => bench.skip(
            &rows,
            format!(
                "{EXAMPLE_PLUGINS_ENV} is not set; build the examples with `plugins/examples/build.sh DIR` \
                 and run with {EXAMPLE_PLUGINS_ENV}=DIR to include them"
            ),
        ),
        Some(dir) => {
            let dir = PathBuf::from(dir);
            for (file, label, config) in EXAMPLES {
                let path = dir.join(file);
                if !path.is_file() {
                    bench.skip(&[*file], format!("{EXAMPLE_PLUGINS_ENV}={} holds no {file}", dir.display()));
                    continue;
                }
                out.push(Subject {
                    label: label.to_string(),
                    source: PluginSource::from_file(&path)?,
                    role: Role::BucketStrategy,
                    config: config.to_string(),
                });
            }
        }
    }
    Ok(out)
}

fn plugin_load(bench: &mut Bench) -> Result<()> {
    let repeats = bench.options.repeats;
    let host_new = bench.time_each(
        "PluginHost::new (engine, linker, WASI)",
        Unit::Millis,
        repeats,
        || Ok(()),
        |()| Ok(PluginHost::new(None)?),
    )?;
    bench.push(host_new);

    for subject in subjects(bench)? {
        let bytes = subject.source.bytes.len();
        bench.push(Figure::new(bench.scenario, format!("{}: size", subject.label), Unit::Bytes, vec![bytes as f64], 1));

        let compile_repeats = if !bench.options.full && bytes >= SLOW_COMPILE_BYTES_MIN {
            SLOW_COMPILE_REPEATS_DEFAULT.min(repeats)
        } else {
            repeats
        };
        // The first compile's cache directory is kept for the cached loads.
        let mut cache_dir: Option<tempfile::TempDir> = None;
        let compile = bench.time_each(
            format!("{}: compile (new host, empty cache)", subject.label),
            Unit::Millis,
            compile_repeats,
            || {
                let dir = tempfile::tempdir()?;
                let host = PluginHost::new(Some(dir.path().to_path_buf()))?;
                Ok((dir, host))
            },
            |(dir, host)| {
                let loaded = host.load(&subject.source, subject.role, PluginLimits::default())?;
                let stats = host.cache_stats();
                ensure!(stats.compiled == 1 && stats.disk_hits == 0, "expected a compile, got {stats:?}");
                let dir = if cache_dir.is_none() {
                    cache_dir = Some(dir);
                    None
                } else {
                    Some(dir)
                };
                Ok((dir, host, loaded))
            },
        )?;
        let cache_path = cache_dir.as_ref().context("no compile ran")?.path().to_path_buf();

        let mut last_loaded: Option<Arc<LoadedPlugin>> = None;
        let cached = bench.time_each(
            format!("{}: cached load (new host, warm cache)", subject.label),
            Unit::Millis,
            repeats,
            || Ok(PluginHost::new(Some(cache_path.clone()))?),
            |host| {
                let loaded = host.load(&subject.source, subject.role, PluginLimits::default())?;
                let stats = host.cache_stats();
                ensure!(stats.disk_hits == 1 && stats.compiled == 0, "expected a cache hit, got {stats:?}");
                last_loaded = Some(loaded);
                Ok(host)
            },
        )?;
        let cached = cached.against(&compile);
        bench.push(compile);
        bench.push(cached);

        // What a cached load must still do whatever the cache holds: hash the component (its
        // identity) and read, verify and map the compiled artifact, which is larger.
        let artifact_bytes = std::fs::metadata(artifact_path(&cache_path)?)?.len();
        bench.push(Figure::new(
            bench.scenario,
            format!("{}: compiled artifact size", subject.label),
            Unit::Bytes,
            vec![artifact_bytes as f64],
            1,
        ));
        let [hash]: [Figure; 1] = bench
            .compare(vec![case(
                format!("{}: SHA-256 of the component (every load)", subject.label),
                Unit::Millis,
                1,
                || {
                    black_box(Sha256::digest(black_box(&subject.source.bytes[..])));
                    Ok(())
                },
            )])?
            .try_into()
            .expect("one case");
        bench.push(hash);
        let artifact_path = artifact_path(&cache_path)?;
        let [check]: [Figure; 1] = bench
            .compare(vec![case(
                format!("{}: read + SHA-256 of the artifact (cached)", subject.label),
                Unit::Millis,
                1,
                || {
                    let bytes = std::fs::read(black_box(&artifact_path))?;
                    black_box(Sha256::digest(&bytes));
                    Ok(())
                },
            )])?
            .try_into()
            .expect("one case");
        bench.push(check);

        let loaded = last_loaded.context("no cached load ran")?;
        let [instantiate]: [Figure; 1] = bench
            .compare(vec![case(
                format!("{}: instantiate + init ({})", subject.label, constructor_name(subject.role)),
                Unit::Micros,
                1,
                || instantiate(&loaded, subject.role, &subject.config),
            )])?
            .try_into()
            .expect("one case");
        bench.push(instantiate);
    }
    Ok(())
}

/// The one compiled artifact in a cache directory.
fn artifact_path(cache_dir: &Path) -> Result<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(cache_dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "cwasm") {
            found.push(path);
        }
    }
    ensure!(found.len() == 1, "expected one compiled artifact in {}, found {}", cache_dir.display(), found.len());
    Ok(found.remove(0))
}

fn constructor_name(role: Role) -> &'static str {
    match role {
        Role::BucketStrategy => "WasmStrategy::new",
        Role::RetentionPolicy => "WasmRetention::new",
        Role::Archiver => "archiver",
    }
}

fn instantiate(loaded: &Arc<LoadedPlugin>, role: Role, config: &str) -> Result<()> {
    match role {
        Role::BucketStrategy => drop(black_box(WasmStrategy::new(loaded.clone(), config.to_string())?)),
        Role::RetentionPolicy => drop(black_box(WasmRetention::new(loaded.clone(), config.to_string())?)),
        Role::Archiver => bail!("the archiver role is not benchmarked yet"),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The data set of the append and archive scenarios

/// The table both scenarios write, bucketed by UTC day.
const DATASET_TABLE: &str = "readings";
/// Records are spread over this many days and partitions, interleaved, so every batch of
/// appends touches every bucket and the strategy's descriptor cache is warm after the first.
const DATASET_DAYS: usize = 4;
const DATASET_PARTITIONS: usize = 8;
/// 2025-03-01T00:00:00Z, the first day of the data set.
const DATASET_START_MICROS: Micros = days_from_civil(2025, 3, 1) * MICROS_PER_DAY;
/// The clock while appending: the day after the data set.
const APPEND_NOW_MICROS: Micros = DATASET_START_MICROS + (DATASET_DAYS as Micros + 1) * MICROS_PER_DAY;
/// The clock of the archive passes: long after every record, so every bucket is due at once.
const ARCHIVE_NOW_MICROS: Micros = days_from_civil(2030, 1, 1) * MICROS_PER_DAY;
/// Every record body is a JSON object of exactly this many bytes.
const BODY_BYTES: usize = 200;
const APPEND_BATCH_RECORDS: usize = 1_000;
const APPEND_RECORDS_DEFAULT: usize = 100_000;
const APPEND_RECORDS_FULL: usize = 1_000_000;
const ARCHIVE_RECORDS_DEFAULT: usize = 200_000;
const ARCHIVE_RECORDS_FULL: usize = 1_000_000;
/// Appends should run at >= 70% of plain redb inserts of the same records.
const APPEND_RATIO_MIN: f64 = 0.7;
/// A pass should archive at >= 60% of the I/O floor for the same bytes.
const ARCHIVE_RATIO_MIN: f64 = 0.6;
/// Passes per archive run at most (one archives everything; the next finds nothing).
const ARCHIVE_PASSES_MAX: usize = 100;
const MEGABYTE: f64 = 1e6;
const CLI_ROW: &str = "frostline ingest (release binary)";
/// Instrumented runs of the append and archive breakdowns at most.
const BREAKDOWN_REPEATS: usize = 5;

/// `count` sensor readings: partition `sensor-NNN`, sort key `evt-NNNNNNNNNN` (an event id),
/// 200-byte JSON bodies. Record `n` falls on day `n % 4` and partition `(n / 4) % 8`; within a
/// bucket, times rise with `n`.
fn dataset(count: usize) -> Vec<Record> {
    let per_day = count.div_ceil(DATASET_DAYS).max(1) as Micros;
    let step = (MICROS_PER_DAY / per_day).max(1);
    let mut state = TIMES_SEED;
    (0..count)
        .map(|n| {
            let day = (n % DATASET_DAYS) as Micros;
            let slot = n / DATASET_DAYS;
            let sensor = format!("sensor-{:03}", slot % DATASET_PARTITIONS);
            let body = reading_body(&sensor, n, splitmix64(&mut state));
            Record {
                partition_key: sensor.into_bytes(),
                event_time: DATASET_START_MICROS + day * MICROS_PER_DAY + slot as Micros * step,
                sort_key: format!("evt-{n:010}").into_bytes(),
                tenant: None,
                kind: None,
                body,
            }
        })
        .collect()
}

/// A compact JSON object of exactly `BODY_BYTES` bytes (integers only, so it is canonical).
fn reading_body(sensor: &str, n: usize, random: u64) -> String {
    let millicelsius = (random % 40_000) as i64 - 5_000;
    let humidity_permille = (random >> 20) % 1_000;
    let mut body = format!(
        r#"{{"sensor":"{sensor}","seq":{n},"temperature_mc":{millicelsius},"humidity_pm":{humidity_permille},"status":"ok","note":""#
    );
    let pad = BODY_BYTES.checked_sub(body.len() + 2).expect("the fixed fields fit in a body");
    body.extend((0..pad).map(|i| char::from(b'a' + ((n + i) % 26) as u8)));
    body.push_str("\"}");
    debug_assert_eq!(body.len(), BODY_BYTES);
    body
}

/// The policy file: one day-bucketed table; buckets are archived `archive_after` after they end.
fn policy_toml(archive_after: &str) -> String {
    format!(
        "[[table]]\nid = \"{DATASET_TABLE}\"\nstrategy = {{ plugin = \"builtin:calendar-day-utc\" }}\n\
         retention = {{ plugin = \"builtin:eligible-before\", config = {{ archive_after = \"{archive_after}\" }} }}\n"
    )
}

/// A data directory and a policy directory in one temporary directory.
struct Dirs {
    root: tempfile::TempDir,
}

impl Dirs {
    fn new(policy: &str) -> Result<Dirs> {
        let dirs = Dirs { root: tempfile::tempdir()? };
        std::fs::create_dir_all(dirs.policies())?;
        std::fs::write(dirs.policies().join("tables.toml"), policy)?;
        Ok(dirs)
    }

    fn data(&self) -> PathBuf {
        self.root.path().join("data")
    }

    fn policies(&self) -> PathBuf {
        self.root.path().join("policies")
    }

    /// A copy of both directories (the engine that wrote them must be closed).
    fn copy(&self) -> Result<Dirs> {
        let copy = Dirs { root: tempfile::tempdir()? };
        copy_tree(self.root.path(), copy.root.path())?;
        Ok(copy)
    }

    fn open(&self, now: Micros) -> Result<Arc<Engine>> {
        Ok(Engine::open(&self.data(), &self.policies(), Settings::default(), ManualClock::new(now))?)
    }
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Adds the time since `mark` to `total` (seconds) and moves `mark` to now.
fn lap(total: &mut f64, mark: &mut Instant) {
    let now = Instant::now();
    *total += now.duration_since(*mark).as_secs_f64();
    *mark = now;
}

/// Seconds of each phase of one instrumented run, in order.
type Phases = Vec<(&'static str, f64)>;

/// Pushes the phases of instrumented runs (one `Phases` per run) as figures in ms, median over
/// the runs, and returns a note naming the phases that dominate and the share of those at
/// `floor_like` (the work the baseline does too).
fn push_phases(bench: &mut Bench, prefix: &str, runs: &[Phases], floor_like: &[usize]) -> String {
    let names: Vec<&str> = runs[0].iter().map(|(name, _)| *name).collect();
    let mut medians = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let samples: Vec<f64> = runs.iter().map(|run| run[i].1 * 1e3).collect();
        let figure = Figure::new(bench.scenario, format!("{prefix}: {name}"), Unit::Millis, samples, 1);
        medians.push(figure.median);
        bench.push(figure);
    }
    let totals: Vec<f64> = runs.iter().map(|run| run.iter().map(|(_, s)| s * 1e3).sum()).collect();
    let total = median(&totals);
    bench.push(Figure::new(bench.scenario, format!("{prefix}: all phases"), Unit::Millis, totals, 1));
    let mut ranked: Vec<(&str, f64)> = names.iter().copied().zip(medians.iter().copied()).collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    let top: Vec<String> =
        ranked.iter().take(3).map(|(name, ms)| format!("{name} {ms:.0} ms ({:.0}%)", 100.0 * ms / total)).collect();
    let mut note = format!("{prefix} (median of {} runs) takes {total:.0} ms, most in {}", runs.len(), top.join(", "));
    if !floor_like.is_empty() {
        let floor_ms: f64 = floor_like.iter().map(|&i| medians[i]).sum();
        let floor_names: Vec<&str> = floor_like.iter().map(|&i| names[i]).collect();
        note.push_str(&format!(
            "; the work the baseline also does ({}) is {floor_ms:.0} ms ({:.0}%)",
            floor_names.join(", "),
            100.0 * floor_ms / total
        ));
    }
    note
}

// ---------------------------------------------------------------------------------------------
// Scenario append

const PLAIN_RECORDS: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("records");

fn append(bench: &mut Bench) -> Result<()> {
    let count = if bench.options.full { APPEND_RECORDS_FULL } else { APPEND_RECORDS_DEFAULT };
    let records = dataset(count);
    let policy = policy_toml("7d");

    // The CLI reads the same records as JSON lines.
    let cli = match release_binary() {
        Ok(binary) => {
            let dir = tempfile::tempdir()?;
            let input = dir.path().join("records.jsonl");
            let mut text = String::with_capacity(count * 320);
            for r in &records {
                text.push_str(&serde_json::to_string(&serde_json::json!({
                    "partition_key": String::from_utf8_lossy(&r.partition_key),
                    "event_time": format_rfc3339(r.event_time),
                    "sort_key": String::from_utf8_lossy(&r.sort_key),
                    "body": serde_json::from_str::<&serde_json::value::RawValue>(&r.body)?,
                }))?);
                text.push('\n');
            }
            std::fs::write(&input, text)?;
            let empty = dir.path().join("empty.jsonl");
            std::fs::write(&empty, "")?;
            Some((binary, dir, input, empty))
        }
        Err(reason) => {
            bench.skip(&[CLI_ROW], reason);
            None
        }
    };

    let (mut engine_samples, mut redb_samples, mut cli_samples) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..bench.options.repeats {
        // Alternate which goes first, so leftover disk work from one lands on both alike.
        let engine_first = round % 2 == 0;
        for engine_turn in [engine_first, !engine_first] {
            if engine_turn {
                engine_samples.push(count as f64 / append_through_engine(&records, &policy)?);
            } else {
                redb_samples.push(count as f64 / append_plain_redb(&records)?);
            }
        }
        if let Some((binary, _, input, empty)) = &cli {
            cli_samples.push(count as f64 / ingest_through_cli(binary, input, empty, &policy, count)?);
        }
    }

    let redb = Figure::new(
        bench.scenario,
        format!("plain redb 3 insert, {count} records, one write transaction per {APPEND_BATCH_RECORDS}"),
        Unit::RecordsPerSecond,
        redb_samples,
        count as u64,
    );
    let engine = Figure::new(
        bench.scenario,
        format!("Engine::append, {count} records in batches of {APPEND_BATCH_RECORDS}"),
        Unit::RecordsPerSecond,
        engine_samples,
        count as u64,
    )
    .against(&redb)
    .with_target(APPEND_RATIO_MIN, "appends run at >= 70% of plain redb inserts of the same records");
    let cli = (!cli_samples.is_empty()).then(|| {
        Figure::new(
            bench.scenario,
            format!(
                "{CLI_ROW}, {count} records from a JSON-lines file (whole process: start, parse, batches of {})",
                frostline::engine::APPEND_BATCH_RECORDS_MAX
            ),
            Unit::RecordsPerSecond,
            cli_samples,
            count as u64,
        )
        .against(&redb)
    });

    bench.push(redb);
    let note = append_breakdown(bench, &records, &policy)?;
    let engine = if engine.met_target() { engine } else { engine.with_note(note) };
    bench.push(engine);
    if let Some(cli) = cli {
        bench.push(cli);
    }
    Ok(())
}

/// Seconds to append `records` in batches through a fresh engine (opened untimed).
fn append_through_engine(records: &[Record], policy: &str) -> Result<f64> {
    let dirs = Dirs::new(policy)?;
    let engine = dirs.open(APPEND_NOW_MICROS)?;
    let batches: Vec<Vec<Record>> = records.chunks(APPEND_BATCH_RECORDS).map(<[Record]>::to_vec).collect();
    let start = Instant::now();
    let mut appended = 0;
    for batch in batches {
        appended += engine.append(DATASET_TABLE, batch)?.appended;
    }
    let seconds = start.elapsed().as_secs_f64();
    ensure!(appended == records.len() as u64, "the engine appended {appended} of {} records", records.len());
    Ok(seconds)
}

/// Seconds to insert the same records into a plain redb table, key partition ‖ event_time ‖
/// sort_key, value the body, one write transaction per batch committed with the default
/// durability (Immediate: fsynced), as the engine's store commits.
fn append_plain_redb(records: &[Record]) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let db = redb::Database::create(dir.path().join("plain.redb"))?;
    let mut key = Vec::with_capacity(64);
    let start = Instant::now();
    for batch in records.chunks(APPEND_BATCH_RECORDS) {
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(PLAIN_RECORDS)?;
            for r in batch {
                key.clear();
                key.extend_from_slice(&r.partition_key);
                key.extend_from_slice(&r.event_time.to_be_bytes());
                key.extend_from_slice(&r.sort_key);
                table.insert(key.as_slice(), r.body.as_bytes())?;
            }
        }
        txn.commit()?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let stored = db.begin_read()?.open_table(PLAIN_RECORDS)?.len()?;
    ensure!(stored == records.len() as u64, "redb holds {stored} of {} records", records.len());
    Ok(seconds)
}

/// Seconds of `frostline ingest --table T FILE` on a fresh data directory. An untimed ingest of
/// an empty file first creates the database and compiles the plugins into its cache, as a
/// long-lived data directory has them.
fn ingest_through_cli(binary: &Path, input: &Path, empty: &Path, policy: &str, count: usize) -> Result<f64> {
    let dirs = Dirs::new(policy)?;
    let ingest = |file: &Path| -> Result<serde_json::Value> {
        let output = Command::new(binary)
            .arg("ingest")
            .arg("--data")
            .arg(dirs.data())
            .arg("--policies")
            .arg(dirs.policies())
            .args(["--table", DATASET_TABLE])
            .arg(file)
            .output()
            .with_context(|| format!("cannot run {}", binary.display()))?;
        ensure!(
            output.status.success(),
            "`frostline ingest` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        serde_json::from_slice(&output.stdout).context("`frostline ingest` printed no outcome")
    };
    ingest(empty)?;
    let start = Instant::now();
    let outcome = ingest(input)?;
    let seconds = start.elapsed().as_secs_f64();
    ensure!(outcome["appended"] == count, "`frostline ingest` reported {outcome}, expected {count} appended");
    Ok(seconds)
}

/// `$CARGO_TARGET_DIR/release/frostline` (the target directory defaults to the one this bench
/// binary was built in), or why it is not there.
fn release_binary() -> std::result::Result<PathBuf, String> {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => repo_root().join(dir),
        None => {
            let exe = std::env::current_exe().map_err(|e| format!("cannot locate the bench binary: {e}"))?;
            // <target>/release/deps/frostline_bench-HASH
            exe.ancestors().nth(3).map(Path::to_path_buf).ok_or("cannot locate the target directory")?
        }
    };
    let binary = target.join("release").join("frostline");
    if binary.is_file() {
        Ok(binary)
    } else {
        Err(format!(
            "{} is missing: build it with `cargo build --release` (scripts/bench does) to include the CLI row",
            binary.display()
        ))
    }
}

/// Plain redb doing, one step at a time, what the store's append does beyond the baseline's
/// insert: level 1 writes the store's record keys and MessagePack values, level 2 also looks
/// each key up first (the duplicate check), level 3 also reads, updates and writes the
/// metadata of every bucket a batch touches (`metas`: the store's metadata of these buckets,
/// used as the new buckets' first version). Level 0 is the baseline. Seconds for all records.
fn append_store_shaped(records: &[Record], metas: &HashMap<BucketId, BucketMeta>, level: u8) -> Result<f64> {
    if level == 0 {
        return append_plain_redb(records);
    }
    let descriptors: Vec<BucketDescriptor> = records.iter().map(|r| day_bucket(r.event_time)).collect();
    let dir = tempfile::tempdir()?;
    let db = redb::Database::create(dir.path().join("store-shaped.redb"))?;
    let start = Instant::now();
    for (batch, batch_descriptors) in records.chunks(APPEND_BATCH_RECORDS).zip(descriptors.chunks(APPEND_BATCH_RECORDS))
    {
        let txn = db.begin_write()?;
        {
            let mut rows = txn.open_table(schema::RECORDS)?;
            let mut touched: HashMap<BucketId, (BucketDescriptor, u64, u64)> = HashMap::new();
            for (r, descriptor) in batch.iter().zip(batch_descriptors) {
                let id = BucketId {
                    table: DATASET_TABLE.to_string(),
                    partition_key: r.partition_key.clone(),
                    bucket_key: descriptor.key.clone(),
                };
                let key = schema::record_key(&id, r.event_time, &r.sort_key);
                let value = schema::encode_value(&StoredRow {
                    tenant: r.tenant.clone(),
                    kind: r.kind.clone(),
                    body: r.body.clone(),
                })?;
                if level >= 2 {
                    ensure!(rows.get(key.as_slice())?.is_none(), "duplicate record key");
                }
                rows.insert(key.as_slice(), value.as_slice())?;
                if level >= 3 {
                    let entry = touched.entry(id).or_insert_with(|| (descriptor.clone(), 0, 0));
                    entry.1 += 1;
                    entry.2 += r.body.len() as u64;
                }
            }
            let mut buckets = txn.open_table(schema::BUCKETS)?;
            for (id, (descriptor, added_rows, added_bytes)) in touched {
                let encoded = id.encode();
                let stored: Option<BucketMeta> =
                    buckets.get(encoded.as_slice())?.map(|v| schema::decode_value(v.value())).transpose()?;
                let mut meta = match stored {
                    Some(meta) => meta,
                    None => {
                        let mut meta = metas.get(&id).context("no metadata for a bucket")?.clone();
                        ensure!(meta.descriptor == descriptor, "bucket {id} has another descriptor in the store");
                        meta.row_count = 0;
                        meta.byte_count = 0;
                        meta
                    }
                };
                meta.row_count += added_rows;
                meta.byte_count += added_bytes;
                buckets.insert(encoded.as_slice(), schema::encode_value(&meta)?.as_slice())?;
            }
        }
        txn.commit()?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let stored = db.begin_read()?.open_table(schema::RECORDS)?.len()?;
    ensure!(stored == records.len() as u64, "redb holds {stored} of {} records", records.len());
    Ok(seconds)
}

/// The calendar-day-utc bucket of `t`, computed natively.
fn day_bucket(t: Micros) -> BucketDescriptor {
    let day = t.div_euclid(MICROS_PER_DAY);
    let (year, month, day_of_month) = civil_from_days(day);
    BucketDescriptor {
        key: format!("day:{year:04}-{month:02}-{day_of_month:02}"),
        start: day * MICROS_PER_DAY,
        end: (day + 1) * MICROS_PER_DAY,
    }
}

/// Where an append run's time goes, sampled round by round (at most `BREAKDOWN_REPEATS` runs):
/// the phases of `Engine::append` (`append_phases`), and the store's append rebuilt on plain
/// redb one step at a time (`append_store_shaped`). Pushes the figures and returns the note.
fn append_breakdown(bench: &mut Bench, records: &[Record], policy: &str) -> Result<String> {
    const STEPS: [&str; 4] = [
        "plain redb insert, as the baseline",
        "+ the store's record keys and MessagePack values",
        "+ a get per row before its insert (the duplicate check)",
        "+ read, update and write each touched bucket's metadata per batch",
    ];
    let repeats = bench.options.repeats.min(BREAKDOWN_REPEATS);
    let mut runs = Vec::with_capacity(repeats);
    let mut steps = vec![Vec::with_capacity(repeats); STEPS.len()];
    for _ in 0..repeats {
        let (phases, metas) = append_phases(records, policy)?;
        runs.push(phases);
        for (level, out) in steps.iter_mut().enumerate() {
            out.push(append_store_shaped(records, &metas, level as u8)? * 1e3);
        }
    }
    let mut note = push_phases(bench, "instrumented Engine::append", &runs, &[]);
    let store_ms = median(&runs.iter().map(|r| r[2].1 * 1e3).collect::<Vec<_>>());
    let mut medians = Vec::new();
    for (name, samples) in STEPS.iter().zip(steps) {
        let figure = Figure::new(
            bench.scenario,
            format!("Store::append rebuilt on plain redb: {name}"),
            Unit::Millis,
            samples,
            records.len() as u64,
        );
        medians.push(figure.median);
        bench.push(figure);
    }
    note.push_str(&format!(
        "; rebuilt on plain redb ({:.0} ms), the store's keys and MessagePack values add {}, the duplicate-check \
         get per row {}, bucket metadata {}, and the rest of Store::append ({}) is the writer-thread hop, per-row \
         clones and hash maps",
        medians[0],
        delta_ms(medians[1] - medians[0]),
        delta_ms(medians[2] - medians[1]),
        delta_ms(medians[3] - medians[2]),
        delta_ms(store_ms - medians[3])
    ));
    Ok(note)
}

/// A difference of two medians: `+92 ms`, or `~0 ms` when it is within a few ms.
fn delta_ms(ms: f64) -> String {
    if ms.abs() < 5.0 { "~0 ms".to_string() } else { format!("{ms:+.0} ms") }
}

/// The phases of an append run, and the metadata of the buckets it wrote.
type AppendPhases = (Phases, HashMap<BucketId, BucketMeta>);

/// The parts of `Engine::append`, timed separately on a fresh engine: validation, the cached
/// strategy lookup and the store's append (writer thread, commit, fsync).
fn append_phases(records: &[Record], policy: &str) -> Result<AppendPhases> {
    let dirs = Dirs::new(policy)?;
    let engine = dirs.open(APPEND_NOW_MICROS)?;
    let table = engine.policies().table(DATASET_TABLE)?.clone();
    let mut seconds = [0.0; 3];
    for chunk in records.chunks(APPEND_BATCH_RECORDS) {
        let batch = chunk.to_vec();
        let mut mark = Instant::now();
        for r in &batch {
            r.validate()?;
            std::str::from_utf8(&r.partition_key)?;
            std::str::from_utf8(&r.sort_key)?;
            black_box(serde_json::from_str::<&serde_json::value::RawValue>(&r.body)?);
        }
        lap(&mut seconds[0], &mut mark);
        let times: Vec<Micros> = batch.iter().map(|r| r.event_time).collect();
        let descriptors = table.strategy.buckets_for(&times)?;
        lap(&mut seconds[1], &mut mark);
        let rows = batch.into_iter().zip(descriptors).map(|(record, descriptor)| PreparedRow { descriptor, record });
        let outcome = engine.store.append(AppendBatch {
            table: table.id.clone(),
            strategy: table.strategy.identity().fingerprint(),
            rows: rows.collect(),
            writable_horizons: None,
            writable_buckets: 0,
            now: engine.clock.now(),
        })?;
        lap(&mut seconds[2], &mut mark);
        ensure!(outcome.appended == chunk.len() as u64, "the store appended {outcome:?} of {}", chunk.len());
    }
    let metas = engine.store.all_buckets()?.into_iter().map(|m| (m.id.clone(), m)).collect();
    let phases = vec![
        ("validate (bounds, UTF-8 keys, body JSON)", seconds[0]),
        ("strategy buckets_for (cached WASM strategy)", seconds[1]),
        ("Store::append (writer thread: encode, insert rows and bucket metadata, commit)", seconds[2]),
    ];
    Ok((phases, metas))
}

// ---------------------------------------------------------------------------------------------
// Scenario archive

fn archive(bench: &mut Bench) -> Result<()> {
    let count = if bench.options.full { ARCHIVE_RECORDS_FULL } else { ARCHIVE_RECORDS_DEFAULT };
    // One ingest, copied before every run: each pass starts from the same hot store.
    let template = Dirs::new(&policy_toml("1s"))?;
    {
        let engine = template.open(APPEND_NOW_MICROS)?;
        for batch in dataset(count).chunks(frostline::engine::APPEND_BATCH_RECORDS_MAX) {
            engine.append(DATASET_TABLE, batch.to_vec())?;
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;

    let mut segments: Vec<Vec<u8>> = Vec::new();
    let mut archived_bytes = 0;
    let (mut engine_samples, mut floor_samples) = (Vec::new(), Vec::new());
    for round in 0..bench.options.repeats {
        // The first run finds the segment sizes; later rounds alternate which goes first.
        let floor_first = round % 2 == 1;
        if floor_first {
            floor_samples.push(archived_bytes as f64 / MEGABYTE / floor_once(&segments)?);
        }
        let copy = template.copy()?;
        let engine = copy.open(ARCHIVE_NOW_MICROS)?;
        let start = Instant::now();
        let report = runtime.block_on(passes_until_idle(&engine))?;
        let seconds = start.elapsed().as_secs_f64();
        ensure!(
            report.errors.is_empty() && report.deferred == 0,
            "the pass deferred {} buckets: {}",
            report.deferred,
            report.errors.join("; ")
        );
        ensure!(report.rows_archived == count as u64, "the pass archived {} of {count} rows", report.rows_archived);
        engine_samples.push(report.bytes_archived as f64 / MEGABYTE / seconds);
        drop(engine);
        if segments.is_empty() {
            segments = read_segments(&copy.data().join("archive"))?;
            archived_bytes = report.bytes_archived;
            let total: u64 = segments.iter().map(|s| s.len() as u64).sum();
            ensure!(total == archived_bytes, "the segments hold {total} bytes; the pass reported {archived_bytes}");
        }
        drop(copy);
        if !floor_first {
            floor_samples.push(archived_bytes as f64 / MEGABYTE / floor_once(&segments)?);
        }
    }

    let sizes: Vec<f64> = segments.iter().map(|s| s.len() as f64 / MEGABYTE).collect();
    let floor = Figure::new(
        bench.scenario,
        format!(
            "floor: write + fsync + read back + SHA-256 of {} files of the segments' sizes ({:.2}-{:.2} MB, {:.1} MB in all)",
            segments.len(),
            sizes.iter().copied().fold(f64::INFINITY, f64::min),
            sizes.iter().copied().fold(0.0, f64::max),
            archived_bytes as f64 / MEGABYTE
        ),
        Unit::MegabytesPerSecond,
        floor_samples,
        1,
    );
    let engine = Figure::new(
        bench.scenario,
        format!(
            "run_pass to the local directory, {count} rows in {} buckets ({:.1} MB of segments)",
            DATASET_DAYS * DATASET_PARTITIONS,
            archived_bytes as f64 / MEGABYTE
        ),
        Unit::MegabytesPerSecond,
        engine_samples,
        1,
    )
    .against(&floor)
    .with_target(ARCHIVE_RATIO_MIN, "a pass archives at >= 60% of the I/O floor for the same bytes");

    let mut runs = Vec::new();
    for _ in 0..bench.options.repeats.min(BREAKDOWN_REPEATS) {
        let copy = template.copy()?;
        let replay_engine = copy.open(ARCHIVE_NOW_MICROS)?;
        runs.push(archive_phases(&replay_engine, &runtime)?);
    }
    bench.push(floor);
    // Upload, read back and one hash of what was read are what the floor does too.
    let note = push_phases(bench, "instrumented replay of the pass", &runs, &[6, 7, 8]);
    let engine = if engine.met_target() { engine } else { engine.with_note(note) };
    bench.push(engine);
    Ok(())
}

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
    };
    let start = Instant::now();
    let page = runtime.block_on(frostline::query::query(engine, request))?;
    let millis = start.elapsed().as_secs_f64() * 1_000.0;
    ensure!(page.records.len() == expected, "the bucket query returned {} of {expected} records", page.records.len());
    Ok(millis)
}

fn formats(bench: &mut Bench) -> Result<()> {
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

/// Passes until one makes no progress, as `frostline archive --once` runs them.
async fn passes_until_idle(engine: &Arc<Engine>) -> Result<PassReport> {
    let owner = archive::new_owner_token();
    let mut total = PassReport::default();
    for _ in 0..ARCHIVE_PASSES_MAX {
        let r = archive::run_pass(engine, &owner).await?;
        let progressed = r.planned + r.archived + r.cleaned > 0;
        total.planned += r.planned;
        total.archived += r.archived;
        total.cleaned += r.cleaned;
        total.deferred += r.deferred;
        total.rows_archived += r.rows_archived;
        total.bytes_archived += r.bytes_archived;
        total.errors.extend(r.errors);
        if !progressed || r.deferred > 0 {
            break;
        }
    }
    Ok(total)
}

/// The bytes of every segment file under `dir`, in path order.
fn read_segments(dir: &Path) -> Result<Vec<Vec<u8>>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, out)?;
            } else if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("seg-")) {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut paths = Vec::new();
    walk(dir, &mut paths)?;
    paths.sort();
    ensure!(!paths.is_empty(), "the pass wrote no segments under {}", dir.display());
    paths.iter().map(|p| std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))).collect()
}

/// Seconds to write each segment's bytes (from memory) to its own file, fsync it, read it back
/// and SHA-256 it: the least any archiver must do with these bytes.
fn floor_once(segments: &[Vec<u8>]) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let start = Instant::now();
    for (i, bytes) in segments.iter().enumerate() {
        let path = dir.path().join(format!("seg-{i:05}"));
        let mut file = std::fs::File::create(&path)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        let read = std::fs::read(&path)?;
        ensure!(read.len() == bytes.len(), "read back {} of {} bytes", read.len(), bytes.len());
        black_box(Sha256::digest(&read));
    }
    Ok(start.elapsed().as_secs_f64())
}

/// One pass replayed step by step with the library's own pieces, in the order
/// `archive::run_pass` takes them, each step timed: where the pass spends its time. It mirrors
/// `archive::upload_and_publish` (and the planning and cleanup around it): change it with them.
fn archive_phases(engine: &Arc<Engine>, runtime: &tokio::runtime::Runtime) -> Result<Phases> {
    let names = [
        "plan (retention plugin, commit)",
        "claim (commit)",
        "snapshot (redb range read, decode rows)",
        "encode segments (JSON lines)",
        "hash segments, build manifest (row checksum)",
        "record upload intent (commit)",
        "upload segments (object_store create)",
        "read segments back",
        "hash what was read (SHA-256, content address)",
        "verify segments (SHA-256 again, parse every line, row checksum)",
        "manifest upload, read back, parse",
        "publish (commit)",
        "cleanup (scan, row checksum, delete rows, commit)",
        "catalog (rewritten from the manifests, once per pass)",
    ];
    let mut seconds = [0.0; 14];
    let owner = archive::new_owner_token();
    let store = &engine.store;
    let now = engine.clock.now();
    let policies = engine.policies();
    let table = policies.table(DATASET_TABLE)?;
    let backend = table.backend.clone();
    let ids = store.unplanned(usize::MAX)?;
    ensure!(!ids.is_empty(), "no bucket to archive");
    for id in ids {
        let meta = store.bucket(&id)?.context("bucket vanished")?;
        let mut mark = Instant::now();
        let plan = table.retention.plan(now, &[archive::facts_of(&meta)])?.pop().context("no plan")?;
        store.set_plan(id.clone(), plan.map_err(anyhow::Error::msg)?, now)?;
        lap(&mut seconds[0], &mut mark);
        let meta = store.claim(id.clone(), owner.clone(), now, engine.settings.lease_us)?.context("not claimable")?;
        let generation = meta.generation;
        lap(&mut seconds[1], &mut mark);
        let rows = store.rows(&id, None, usize::MAX)?;
        lap(&mut seconds[2], &mut mark);
        let encoded = frostline::format::encode_segments(table.format, &rows)?;
        lap(&mut seconds[3], &mut mark);
        let prefix = keys::bucket_prefix(&id.table, &id.bucket_key, &id.partition_key);
        let mut infos = Vec::new();
        let mut payloads = Vec::new();
        for (sequence, segment) in encoded.into_iter().enumerate() {
            let sha = sha256_hex(&segment.bytes);
            infos.push(SegmentInfo {
                key: keys::segment_key(&prefix, sequence, &sha, table.format.extension()),
                sha256: sha,
                bytes: segment.bytes.len() as u64,
                rows: segment.rows,
                min_event_time: segment.min_event_time,
                max_event_time: segment.max_event_time,
                summary: segment.summary,
            });
            payloads.push(Bytes::from(segment.bytes));
        }
        let manifest = Manifest {
            version: MANIFEST_VERSION,
            table: id.table.clone(),
            partition_key: String::from_utf8_lossy(&id.partition_key).into_owned(),
            bucket: meta.descriptor.clone(),
            strategy: format!("{} {}", table.strategy.identity().name, table.strategy.identity().fingerprint()),
            generation,
            format: table.format,
            schema: table.format.schema().to_string(),
            target: backend.target().to_string(),
            policy: meta.plan.clone(),
            summary: summarize(&rows),
            bytes: infos.iter().map(|s| s.bytes).sum(),
            segments: infos,
            created_at: now,
        };
        manifest.check_consistent()?;
        let manifest_bytes = Bytes::from(manifest.to_bytes());
        let manifest_key = keys::manifest_key(&prefix, generation, &sha256_hex(&manifest_bytes));
        lap(&mut seconds[4], &mut mark);
        let intent = UploadIntent {
            bucket: id.clone(),
            generation,
            target: backend.target().to_string(),
            keys: manifest.segments.iter().map(|s| s.key.clone()).chain([manifest_key.clone()]).collect(),
            recorded_at: now,
        };
        store.record_intent(intent, owner.clone(), now)?;
        lap(&mut seconds[5], &mut mark);
        for (info, payload) in manifest.segments.iter().zip(&payloads) {
            let outcome = runtime.block_on(backend.put_create(&info.key, payload.clone()))?;
            ensure!(outcome == PutOutcome::Created, "{} existed already", info.key);
            lap(&mut seconds[6], &mut mark);
            let stored = runtime.block_on(backend.get(&info.key))?.context("segment missing after upload")?;
            lap(&mut seconds[7], &mut mark);
            ensure!(stored == *payload, "{} differs from what was written", info.key);
            keys::check_content_address(&info.key, &sha256_hex(&stored))?;
            lap(&mut seconds[8], &mut mark);
            archive::verify_segment(table.format, info, &stored)?;
            lap(&mut seconds[9], &mut mark);
        }
        runtime.block_on(backend.put_create(&manifest_key, manifest_bytes.clone()))?;
        let stored = runtime.block_on(backend.get(&manifest_key))?.context("manifest missing after upload")?;
        keys::check_content_address(&manifest_key, &sha256_hex(&stored))?;
        ensure!(Manifest::from_bytes(&stored)? == manifest, "the manifest read back differs");
        lap(&mut seconds[10], &mut mark);
        store.publish(id.clone(), owner.clone(), generation, now, manifest, manifest_key)?;
        lap(&mut seconds[11], &mut mark);
        let deleted = store.cleanup(id.clone(), owner.clone(), generation, now)?;
        lap(&mut seconds[12], &mut mark);
        ensure!(deleted == rows.len() as u64, "cleanup deleted {deleted} of {} rows", rows.len());
    }
    let mut mark = Instant::now();
    runtime.block_on(archive::catalog::write(engine, DATASET_TABLE))?;
    lap(&mut seconds[13], &mut mark);
    Ok(names.into_iter().zip(seconds).collect())
}

// ---------------------------------------------------------------------------------------------
// Run information: machine, commit, date, command

#[derive(Serialize)]
struct Machine {
    cpu_model: String,
    nproc: usize,
    memory_bytes: u64,
    loadavg_start: String,
    loadavg_end: String,
}

struct RunInfo {
    command: String,
    argv: Vec<String>,
    date: String,
    commit: String,
    rustc: String,
    machine: Machine,
}

impl RunInfo {
    fn collect(raw_args: &[String]) -> RunInfo {
        let given: Vec<&str> = raw_args.iter().map(String::as_str).filter(|a| *a != "--bench").collect();
        let command = std::env::var(COMMAND_ENV).unwrap_or_else(|_| {
            let mut command = String::from("cargo bench --bench frostline-bench");
            if !given.is_empty() {
                command.push_str(" -- ");
                command.push_str(&given.join(" "));
            }
            command
        });
        RunInfo {
            command,
            argv: std::env::args().collect(),
            date: now_rfc3339(),
            commit: git_commit(),
            rustc: run_text("rustc", &["--version"]).unwrap_or_else(|| "unknown".into()),
            machine: Machine {
                cpu_model: cpu_model(),
                nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
                memory_bytes: memory_bytes(),
                loadavg_start: read_loadavg(),
                loadavg_end: String::new(),
            },
        }
    }
}

#[allow(clippy::disallowed_methods)] // A report says when it ran; this is not engine logic.
fn now_rfc3339() -> String {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format_rfc3339(since_epoch.as_secs() as Micros * MICROS_PER_SECOND)
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

fn run_text(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program).args(args).current_dir(repo_root()).output().ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// `git rev-parse --short HEAD`, with `-uncommitted` when the work tree has changes.
fn git_commit() -> String {
    let Some(commit) = run_text("git", &["rev-parse", "--short", "HEAD"]) else {
        return "unknown".into();
    };
    match run_text("git", &["status", "--porcelain"]) {
        Some(status) if status.is_empty() => commit,
        _ => format!("{commit}-uncommitted"),
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

fn read_loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

#[derive(Serialize)]
struct ScenarioReport {
    name: &'static str,
    about: &'static str,
    seconds: f64,
}

#[derive(Serialize)]
struct OptionsReport {
    full: bool,
    repeats: usize,
    sample_ms: u64,
    only: Vec<String>,
}

#[derive(Serialize)]
struct Document<'a> {
    schema: u32,
    tool: &'static str,
    command: String,
    argv: Vec<String>,
    date: String,
    commit: String,
    rustc: String,
    machine: Machine,
    options: OptionsReport,
    ratio_definition: &'static str,
    total_seconds: f64,
    scenarios: Vec<ScenarioReport>,
    figures: &'a [Figure],
    skipped: &'a [Skipped],
}

//! frostline's benchmark harness:
//! `cargo bench --bench frostline-bench -- [--full] [--json FILE] [--only NAME] [--repeats N] [--list]`.
//!
//! No framework. Every timed figure is taken R times (`REPEATS_DEFAULT`, or `--repeats`) and
//! reported as median, min and max: the machines this runs on are shared and noisy, so the
//! median is the figure quoted. A per-operation figure loops its operation long enough
//! (`SAMPLE_MS_DEFAULT`, `SAMPLE_MS_FULL` with `--full`) to swamp the timer. Figures that are
//! compared (WASM against the same logic in native Rust) are sampled round by round, one
//! sample of each per round, so a burst of load elsewhere on the machine hits both alike.
//!
//! A ratio is always `baseline median / figure median`: 1.0 is as fast as the baseline, 0.25
//! four times slower, 300 three hundred times faster. A figure may carry a target on its
//! ratio; `scripts/bench` lists missed targets at the top of BENCHMARKS.md.
//!
//! Adding a scenario: write a `fn(&mut Bench) -> Result<()>` that records figures through
//! `Bench::compare`, `Bench::time_each` and `Bench::push`, and add a row to `SCENARIOS`.
//!
//! `cargo bench` runs this binary from `engine/`, so a relative `--json` path is relative to
//! `engine/`; `scripts/bench` passes an absolute one.

use std::hint::black_box;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use frostline::model::BucketStrategy as _;
use frostline::model::Micros;
use frostline::model::time::{MICROS_PER_DAY, MICROS_PER_SECOND, format_rfc3339};
use frostline::plugin::builtin;
use frostline::plugin::retention::WasmRetention;
use frostline::plugin::strategy::WasmStrategy;
use frostline::plugin::{LoadedPlugin, PluginHost, PluginLimits, PluginSource, Role};
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

/// One named scenario. The lead adds append and archive scenarios here.
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
    // Append and archive scenarios go here.
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
        "each figure: median of {} runs (min..max beside it); ratio = baseline median / figure median",
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
            ratio_definition: "baseline median / figure median: 1 = as fast as the baseline, below 1 slower, above 1 faster",
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
         --full        longer samples, every compile repeated R times, extra batch sizes\n\
         --json FILE   also write every figure as JSON (relative to engine/)\n\
         --only NAME   run only this scenario (repeatable, or comma-separated): {}\n\
         --repeats N   runs per figure (default {REPEATS_DEFAULT})\n\
         --list        list the scenarios\n\
         \n\
         {EXAMPLE_PLUGINS_ENV}=DIR adds the Python and JavaScript examples (DIR/iso-week-py.wasm,\n\
         DIR/fiscal-quarter-js.wasm, built by plugins/examples/build.sh DIR) to plugin-load.\n",
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
}

impl Unit {
    fn label(self) -> &'static str {
        match self {
            Unit::NsPerCall => "ns/call",
            Unit::NsPerTime => "ns/time",
            Unit::Micros => "us",
            Unit::Millis => "ms",
            Unit::Bytes => "bytes",
        }
    }

    /// Converts a duration in nanoseconds into this unit.
    fn scale_ns(self, ns: f64) -> f64 {
        match self {
            Unit::NsPerCall | Unit::NsPerTime | Unit::Bytes => ns,
            Unit::Micros => ns / 1e3,
            Unit::Millis => ns / 1e6,
        }
    }
}

#[derive(Debug, Serialize)]
struct Baseline {
    name: String,
    median: f64,
    /// `baseline.median / figure.median`.
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
}

impl Figure {
    fn new(scenario: &'static str, name: impl Into<String>, unit: Unit, samples: Vec<f64>, iterations: u64) -> Self {
        assert!(!samples.is_empty(), "a figure needs at least one sample");
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len() / 2;
        let median = if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 };
        Figure {
            scenario,
            name: name.into(),
            unit,
            median,
            min: sorted[0],
            max: sorted[sorted.len() - 1],
            samples,
            iterations_per_sample: iterations,
            baseline: None,
            target: None,
        }
    }

    /// Compares this figure with `baseline` (same unit): ratio = baseline median / this median.
    fn against(mut self, baseline: &Figure) -> Self {
        assert_eq!(self.unit.label(), baseline.unit.label(), "a baseline must have the same unit");
        self.baseline = Some(Baseline {
            name: baseline.name.clone(),
            median: baseline.median,
            ratio: baseline.median / self.median,
        });
        self
    }

    fn with_target(mut self, ratio_min: f64, about: &'static str) -> Self {
        let ratio = self.baseline.as_ref().expect("a target is on the ratio to a baseline").ratio;
        self.target = Some(Target { ratio_min, met: ratio >= ratio_min, about });
        self
    }
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

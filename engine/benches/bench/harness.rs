//! Measuring and recording: figures with median, min and max, ratios to baselines, targets,
//! the per-operation sampler and the console table.

use std::io::Write as _;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::Options;

pub const REPEATS_DEFAULT: usize = 7;
/// How long one sample of a per-operation figure runs.
const SAMPLE_MS_DEFAULT: u64 = 40;
const SAMPLE_MS_FULL: u64 = 200;
/// How long the calibration (and warm-up) of a per-operation figure runs at least.
const CALIBRATE_MS: u64 = 20;
const SAMPLE_ITERATIONS_MAX: u64 = 100_000_000;

pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
/// How every ratio is computed; the report quotes it.
pub const RATIO_DEFINITION: &str = "baseline median / figure median for a duration or a size (bytes, MiB), figure median / \
     baseline median for a rate (records/s, MB/s): either way 1 = as good as the baseline, below 1 slower (or larger), \
     above 1 faster (or smaller)";

#[derive(Debug, Clone, Copy, Serialize)]
pub enum Unit {
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
    /// Resident memory, in mebibytes (2^20 bytes).
    #[serde(rename = "MiB")]
    Mebibytes,
    #[serde(rename = "records/s")]
    RecordsPerSecond,
    /// Megabytes (10^6 bytes) per second.
    #[serde(rename = "MB/s")]
    MegabytesPerSecond,
    /// CPU seconds per second of wall time: how many cores were kept busy.
    #[serde(rename = "cores")]
    Cores,
}

impl Unit {
    pub fn label(self) -> &'static str {
        match self {
            Unit::NsPerCall => "ns/call",
            Unit::NsPerTime => "ns/time",
            Unit::Micros => "us",
            Unit::Millis => "ms",
            Unit::Bytes => "bytes",
            Unit::Mebibytes => "MiB",
            Unit::RecordsPerSecond => "records/s",
            Unit::MegabytesPerSecond => "MB/s",
            Unit::Cores => "cores",
        }
    }

    /// A rate: more is faster, so its ratio to a baseline is figure / baseline.
    pub fn is_rate(self) -> bool {
        matches!(self, Unit::RecordsPerSecond | Unit::MegabytesPerSecond)
    }

    /// Converts a duration in nanoseconds into this unit.
    pub fn scale_ns(self, ns: f64) -> f64 {
        match self {
            Unit::NsPerCall | Unit::NsPerTime => ns,
            Unit::Micros => ns / 1e3,
            Unit::Millis => ns / 1e6,
            Unit::RecordsPerSecond | Unit::MegabytesPerSecond | Unit::Bytes | Unit::Mebibytes | Unit::Cores => {
                panic!("{} is not a duration", self.label())
            }
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Baseline {
    pub name: String,
    pub median: f64,
    /// `baseline.median / figure.median` for a duration, `figure.median / baseline.median` for
    /// a rate: above 1 is faster either way.
    pub ratio: f64,
}

/// What a figure must reach: a least ratio to its baseline, or a most value of its own.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_min: Option<f64>,
    /// In the figure's unit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    pub met: bool,
    pub about: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub scenario: &'static str,
    pub name: String,
    pub unit: Unit,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Every sample, in the order taken, in `unit`.
    pub samples: Vec<f64>,
    /// Operations timed together in one sample (1 for one-shot figures).
    pub iterations_per_sample: u64,
    pub baseline: Option<Baseline>,
    pub target: Option<Target>,
    /// What limits the figure, when the scenario measured it (a phase breakdown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Figure {
    pub fn new(
        scenario: &'static str,
        name: impl Into<String>,
        unit: Unit,
        samples: Vec<f64>,
        iterations: u64,
    ) -> Self {
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
    /// for a duration or a size, this median / baseline median for a rate.
    pub fn against(mut self, baseline: &Figure) -> Self {
        assert_eq!(self.unit.label(), baseline.unit.label(), "a baseline must have the same unit");
        let ratio = if self.unit.is_rate() { self.median / baseline.median } else { baseline.median / self.median };
        self.baseline = Some(Baseline { name: baseline.name.clone(), median: baseline.median, ratio });
        self
    }

    /// A target on the ratio to the baseline (set by `against` first).
    pub fn with_target(mut self, ratio_min: f64, about: &'static str) -> Self {
        let ratio = self.baseline.as_ref().expect("a target is on the ratio to a baseline").ratio;
        self.target = Some(Target { ratio_min: Some(ratio_min), max: None, met: ratio >= ratio_min, about });
        self
    }

    /// A target on the figure itself: its median at most `max`, in its unit.
    pub fn with_limit(mut self, max: f64, about: &'static str) -> Self {
        self.target = Some(Target { ratio_min: None, max: Some(max), met: self.median <= max, about });
        self
    }

    pub fn met_target(&self) -> bool {
        self.target.as_ref().is_none_or(|t| t.met)
    }

    pub fn with_note(mut self, note: String) -> Self {
        self.note = Some(note);
        self
    }
}

impl Target {
    /// `ratio >= 0.7` or `<= 200 ms`.
    pub fn describe(&self) -> String {
        match (self.ratio_min, self.max) {
            (Some(ratio_min), _) => format!("ratio >= {ratio_min}"),
            (None, Some(max)) => format!("<= {max}"),
            (None, None) => unreachable!("a target has a bound"),
        }
    }
}

/// The `q` quantile of `samples` (nearest rank).
pub fn percentile(samples: &mut [f64], q: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    let rank = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len());
    samples[rank - 1]
}

/// The median of `samples` (the mean of the middle two for an even count).
pub fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 }
}

#[derive(Debug, Serialize)]
pub struct Skipped {
    pub scenario: &'static str,
    pub rows: Vec<String>,
    pub reason: String,
}

/// One operation to time: `run(n)` performs it `n` times.
pub struct Case<'a> {
    pub name: String,
    pub unit: Unit,
    /// Units of work per operation (times per batch), to report per time rather than per call.
    pub work_per_op: u64,
    pub run: Box<dyn FnMut(u64) -> Result<()> + 'a>,
}

pub fn case<'a>(
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

pub struct Bench {
    pub options: Options,
    pub scenario: &'static str,
    pub figures: Vec<Figure>,
    pub skipped: Vec<Skipped>,
}

impl Bench {
    pub fn new(options: Options) -> Self {
        Bench { options, scenario: "", figures: Vec::new(), skipped: Vec::new() }
    }

    pub fn sample_ms(&self) -> u64 {
        if self.options.full { SAMPLE_MS_FULL } else { SAMPLE_MS_DEFAULT }
    }

    /// Times per-operation cases, one sample of each per round, R rounds. The figures come
    /// back in the order of `cases` for the caller to relate and `push`.
    pub fn compare(&self, mut cases: Vec<Case<'_>>) -> Result<Vec<Figure>> {
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
    pub fn time_each<S, T>(
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

    pub fn push(&mut self, figure: Figure) {
        print_row(&figure);
        self.figures.push(figure);
    }

    pub fn skip(&mut self, rows: &[&str], reason: String) {
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
pub fn calibrate(run: &mut dyn FnMut(u64) -> Result<()>, sample_ns: u64) -> Result<u64> {
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

pub fn print_header() {
    println!(
        "  {:<NAME_WIDTH$} {:>12} {:>12} {:>12} {:<7} {:>3}  ratio to baseline",
        "figure", "median", "min", "max", "unit", "n"
    );
}

pub fn print_row(f: &Figure) {
    let vs = match &f.baseline {
        Some(b) => format!("{} vs {}", ratio_text(b.ratio), b.name),
        None => String::new(),
    };
    let missed = match &f.target {
        Some(t) if !t.met => format!("  MISSES TARGET {}", t.describe()),
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
pub fn ratio_text(ratio: f64) -> String {
    if ratio < 1.0 { format!("{ratio:.3} ({:.1}x slower)", 1.0 / ratio) } else { number(ratio) }
}

/// A number with about four significant digits and no exponent.
pub fn number(v: f64) -> String {
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

/// Adds the time since `mark` to `total` (seconds) and moves `mark` to now.
pub fn lap(total: &mut f64, mark: &mut Instant) {
    let now = Instant::now();
    *total += now.duration_since(*mark).as_secs_f64();
    *mark = now;
}

/// Seconds of each phase of one instrumented run, in order.
pub type Phases = Vec<(&'static str, f64)>;

/// Pushes the phases of instrumented runs (one `Phases` per run) as figures in ms, median over
/// the runs, and returns a note naming the phases that dominate and the share of those at
/// `floor_like` (the work the baseline does too).
pub fn push_phases(bench: &mut Bench, prefix: &str, runs: &[Phases], floor_like: &[usize]) -> String {
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

/// Counts the heap the process holds, when `FROSTLINE_BENCH_HEAP` is set (read once): the
/// peak resident set says how high a piece of work took the process, this says how much of it
/// was live heap, to tell what the work holds from what the allocator keeps.
pub struct CountingAllocator;

static HEAP_COUNTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
static HEAP_BYTES: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);
static HEAP_PEAK: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

fn heap_counted() -> bool {
    // `var_os` allocates: the first call (made outside the allocator, by `with_peak_memory`)
    // decides; until then nothing is counted.
    HEAP_COUNTED.get().copied().unwrap_or(false)
}

// SAFETY: every call is passed to the system allocator unchanged; only counters are added.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let ptr = unsafe { std::alloc::System.alloc(layout) };
        if !ptr.is_null() && heap_counted() {
            let size = layout.size() as isize;
            let now = HEAP_BYTES.fetch_add(size, std::sync::atomic::Ordering::Relaxed) + size;
            HEAP_PEAK.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) };
        if heap_counted() {
            HEAP_BYTES.fetch_sub(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        if !new.is_null() && heap_counted() {
            if new_size >= layout.size() {
                let grown = (new_size - layout.size()) as isize;
                let now = HEAP_BYTES.fetch_add(grown, std::sync::atomic::Ordering::Relaxed) + grown;
                HEAP_PEAK.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
            } else {
                HEAP_BYTES.fetch_sub((layout.size() - new_size) as isize, std::sync::atomic::Ordering::Relaxed);
            }
        }
        new
    }
}

/// Runs `work` and returns what it returns with the peak resident set of this process
/// while it ran, in MiB: freed heap is given back and the peak reset to the resident set
/// first (glibc's `malloc_trim`, Linux's `clear_refs`), so the figure is the height `work`
/// reached from what the process holds anyway, not a peak left by earlier work.
pub fn with_peak_memory<T>(work: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    // SAFETY: malloc_trim only returns free heap pages to the system.
    unsafe { libc::malloc_trim(0) };
    std::fs::write("/proc/self/clear_refs", "5").context("cannot reset the peak resident set")?;
    // Heap counted from here (`CountingAllocator`); what was allocated before is freed
    // uncounted (the count may go below zero), so the figures are relative: the live heap's
    // rise during `work`.
    let counted = *HEAP_COUNTED.get_or_init(|| std::env::var_os("FROSTLINE_BENCH_HEAP").is_some());
    let heap_start = HEAP_BYTES.load(std::sync::atomic::Ordering::Relaxed);
    HEAP_PEAK.store(heap_start, std::sync::atomic::Ordering::Relaxed);
    let output = work()?;
    if counted {
        let peak = HEAP_PEAK.load(std::sync::atomic::Ordering::Relaxed);
        let end = HEAP_BYTES.load(std::sync::atomic::Ordering::Relaxed);
        eprintln!(
            "heap: peak {:.1} MiB above the start, {:+.1} MiB at the end",
            (peak - heap_start) as f64 / 1048576.0,
            (end - heap_start) as f64 / 1048576.0
        );
    }
    let status = std::fs::read_to_string("/proc/self/status").context("cannot read /proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .context("no VmHWM in /proc/self/status")?;
    Ok((output, kib / 1024.0))
}

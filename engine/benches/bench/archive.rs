//! Scenario archive: MB/s of a pass to the local-directory target against the I/O floor for
//! the same bytes (write, fsync, read back, SHA-256) and against restic backing up the same
//! records written out as files; when the floor target is missed, where the pass spends its
//! time, from the phase timings every pass reports (`PassReport::seconds`).

use std::hint::black_box;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use frostline::archive::Phase;
use frostline::model::{Micros, Record};
use frostline::settings::Settings;
use sha2::{Digest as _, Sha256};

use crate::data::{
    APPEND_NOW_MICROS, ARCHIVE_NOW_MICROS, DATASET_DAYS, DATASET_PARTITIONS, DATASET_TABLE, Dirs, MEGABYTE, dataset,
    passes_until_idle, policy_toml,
};
use crate::harness::{Bench, Figure, Phases, Unit, percentile, push_phases};

/// Rows of the `archive` scenario's data set, in 32 buckets.
const ARCHIVE_RECORDS: usize = 200_000;
/// Rows of the `archive-large` scenario's: ten times as many in the same 32 buckets, so each
/// bucket holds 62,500 rows (seven segments) and its cleanup slices rows before the drop.
const ARCHIVE_RECORDS_LARGE: usize = 2_000_000;
/// Rounds of `archive-large` at most (each copies a 2 GB hot store).
const ARCHIVE_LARGE_REPEATS_MAX: usize = 3;
/// A pass should archive at >= 60% of the I/O floor for the same bytes.
const ARCHIVE_RATIO_MIN: f64 = 0.6;
/// The password of the throwaway restic repositories.
const RESTIC_PASSWORD: &str = "frostline-bench";

pub fn archive(bench: &mut Bench) -> Result<()> {
    let runtime = pass_runtime()?;
    let template = pass_against_baselines(bench, &runtime, ARCHIVE_RECORDS, bench.options.repeats)?;
    appends_during_a_pass(bench, &template, &runtime)
}

/// The same figures as `archive` with ten times the rows in the same buckets: the ratio to
/// the floor must not fall as buckets grow.
pub fn archive_large(bench: &mut Bench) -> Result<()> {
    let runtime = pass_runtime()?;
    let repeats = bench.options.repeats.min(ARCHIVE_LARGE_REPEATS_MAX);
    pass_against_baselines(bench, &runtime, ARCHIVE_RECORDS_LARGE, repeats)?;
    Ok(())
}

/// The passes run where `frostline run` runs them: on the archival runtime, whose threads
/// yield the CPU to the rest of the process (`ops::passes::background_runtime`).
fn pass_runtime() -> Result<tokio::runtime::Runtime> {
    let threads = Settings::default().archive_concurrency;
    Ok(frostline::ops::passes::background_runtime(threads)?)
}

/// Appends `count` rows, then times `repeats` passes over copies of that hot store against
/// the I/O floor and restic for the segments they write, one of each per round; returns the
/// hot store.
fn pass_against_baselines(
    bench: &mut Bench,
    runtime: &tokio::runtime::Runtime,
    count: usize,
    repeats: usize,
) -> Result<Dirs> {
    // One ingest, copied before every run: each pass starts from the same hot store.
    let template = Dirs::new(&policy_toml("1s"))?;
    {
        let engine = template.open(APPEND_NOW_MICROS)?;
        for batch in dataset(count).chunks(frostline::engine::APPEND_BATCH_RECORDS_MAX) {
            engine.append(DATASET_TABLE, batch.to_vec())?;
        }
    }
    let restic = restic_binary();
    if let Err(reason) = &restic {
        bench.skip(&["restic backup"], reason.clone());
    }

    let mut segments: Vec<Vec<u8>> = Vec::new();
    let mut archived_bytes = 0;
    let (mut engine_samples, mut floor_samples, mut restic_samples) = (Vec::new(), Vec::new(), Vec::new());
    let mut phases: Vec<Phases> = Vec::new();
    for round in 0..repeats {
        // The first run finds the segments; later rounds alternate which goes first.
        let baselines_first = round % 2 == 1;
        let mut baselines = |segments: &[Vec<u8>], bytes: u64| -> Result<()> {
            floor_samples.push(bytes as f64 / MEGABYTE / floor_once(segments)?);
            if let Ok((binary, _)) = &restic {
                restic_samples.push(bytes as f64 / MEGABYTE / restic_once(binary, segments)?);
            }
            Ok(())
        };
        if baselines_first {
            baselines(&segments, archived_bytes)?;
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
        phases.push(report.seconds.named());
        drop(engine);
        if segments.is_empty() {
            segments = read_segments(&copy.data().join("archive"))?;
            archived_bytes = report.bytes_archived;
            let total: u64 = segments.iter().map(|s| s.len() as u64).sum();
            ensure!(total == archived_bytes, "the segments hold {total} bytes; the pass reported {archived_bytes}");
        }
        drop(copy);
        if !baselines_first {
            baselines(&segments, archived_bytes)?;
        }
    }

    let sizes: Vec<f64> = segments.iter().map(|s| s.len() as f64 / MEGABYTE).collect();
    let files = format!(
        "{} files of the segments' sizes ({:.2}-{:.2} MB, {:.1} MB in all)",
        segments.len(),
        sizes.iter().copied().fold(f64::INFINITY, f64::min),
        sizes.iter().copied().fold(0.0, f64::max),
        archived_bytes as f64 / MEGABYTE
    );
    let floor = Figure::new(
        bench.scenario,
        format!("floor: write + fsync + read back + SHA-256 of {files}"),
        Unit::MegabytesPerSecond,
        floor_samples,
        1,
    );
    let pass_name = format!(
        "run_pass to the local directory, {count} rows in {} buckets ({:.1} MB of segments)",
        DATASET_DAYS * DATASET_PARTITIONS,
        archived_bytes as f64 / MEGABYTE
    );
    let engine = Figure::new(bench.scenario, pass_name.clone(), Unit::MegabytesPerSecond, engine_samples.clone(), 1)
        .against(&floor)
        .with_target(ARCHIVE_RATIO_MIN, "a pass archives at >= 60% of the I/O floor for the same bytes");
    bench.push(floor);
    // The upload and the read back are what the floor does too.
    let floor_like = [Phase::Upload as usize, Phase::ReadBack as usize];
    let note = push_phases(bench, "phases of the timed passes", &phases, &floor_like);
    let engine = if engine.met_target() { engine } else { engine.with_note(note) };
    bench.push(engine);
    if let Ok((_, version)) = &restic {
        let restic = Figure::new(
            bench.scenario,
            format!("{version} backup of the same {files} to a new local repository (compressed, encrypted)"),
            Unit::MegabytesPerSecond,
            restic_samples,
            1,
        );
        let against_restic = Figure::new(
            bench.scenario,
            format!("{pass_name}, against restic"),
            Unit::MegabytesPerSecond,
            engine_samples,
            1,
        )
        .against(&restic)
        .with_target(RESTIC_RATIO_MIN, "a pass archives at >= 1.5x restic backing up the same bytes");
        bench.push(restic);
        bench.push(against_restic);
    }
    Ok(template)
}

/// Records per append in the appends-during-a-pass figures.
const LIVE_BATCH: usize = 1_000;
/// Batches appended without a pass, for the baseline.
const LIVE_BATCHES_BASELINE: usize = 100;
/// A pass should archive at >= 1.5x restic backing up the same bytes.
const RESTIC_RATIO_MIN: f64 = 1.5;
/// Appends over HTTP during a pass should run at >= 70% of the same without one.
const LIVE_RATIO_MIN: f64 = 0.7;
/// The slowest 1% of 1,000-record appends over HTTP during a pass should take under 50 ms.
const LIVE_P99_MS_MAX: f64 = 50.0;

/// One way of appending a batch: `Engine::append` in process, or a POST to the API.
type Append<'a> = dyn FnMut(Vec<Record>) -> Result<()> + 'a;

/// Appends of 1,000-record batches to today's bucket (never due) while a pass archives and
/// cleans up the template's 32 buckets, against the same appends without a pass, in the same
/// rounds: throughput and the 99th percentile of the latency, over HTTP (what the target is
/// about: an application appends through the API) and in process (`Engine::append`, without
/// the HTTP stack, to show what the store itself gives up).
fn appends_during_a_pass(bench: &mut Bench, template: &Dirs, runtime: &tokio::runtime::Runtime) -> Result<()> {
    let mut http = LiveSamples::default();
    let mut in_process = LiveSamples::default();
    let (mut one_worker_rates, mut busy_cores) = (Vec::new(), Vec::new());
    let mut next = 0usize;
    let mut batch = |n: usize| -> Vec<Record> {
        (0..n)
            .map(|_| {
                next += 1;
                Record {
                    partition_key: b"live".to_vec(),
                    event_time: ARCHIVE_NOW_MICROS - 3_600_000_000 + next as Micros,
                    sort_key: format!("live-{next:012}").into_bytes(),
                    tenant: None,
                    kind: None,
                    body: format!("{{\"n\":{next}}}"),
                }
            })
            .collect()
    };
    for _ in 0..bench.options.repeats {
        // What bounds appends during a pass: the same with the pass on one worker
        // (ARCHIVER_CONCURRENCY=1), and how many cores the process keeps busy meanwhile.
        let copy = template.copy()?;
        let one_worker = Settings { archive_concurrency: 1, ..Settings::default() };
        let engine = copy.open_with(ARCHIVE_NOW_MICROS, one_worker)?;
        let mut append = |records: Vec<Record>| -> Result<()> { Ok(engine.append(DATASET_TABLE, records).map(drop)?) };
        let (appended, seconds, _) = append_while_passing(&engine, runtime, &mut batch, &mut append)?;
        one_worker_rates.push(appended as f64 / seconds);
        drop(engine);

        let copy = template.copy()?;
        let engine = copy.open(ARCHIVE_NOW_MICROS)?;
        let mut append = |records: Vec<Record>| -> Result<()> { Ok(engine.append(DATASET_TABLE, records).map(drop)?) };
        in_process.alone(&mut batch, &mut append)?;
        let cpu_before = process_cpu_seconds();
        let live_seconds = in_process.live(&engine, runtime, &mut batch, &mut append)?;
        busy_cores.push((process_cpu_seconds() - cpu_before) / live_seconds);
        drop(engine);

        let copy = template.copy()?;
        let engine = copy.open(ARCHIVE_NOW_MICROS)?;
        let api = LocalApi::serve(&engine)?;
        let mut append = |records: Vec<Record>| api.append(&records);
        http.alone(&mut batch, &mut append)?;
        http.live(&engine, runtime, &mut batch, &mut append)?;
        api.stop()?;
    }
    let way = |http_or_not: bool| {
        if http_or_not {
            "POST /v1/tables/{table}/records (JSON lines over HTTP)"
        } else {
            "Engine::append (in process)"
        }
    };
    for (samples, over_http) in [(http, true), (in_process, false)] {
        let alone = Figure::new(
            bench.scenario,
            format!("{} of {LIVE_BATCH}-record batches, no pass running", way(over_http)),
            Unit::RecordsPerSecond,
            samples.alone_rates,
            LIVE_BATCH as u64,
        );
        let live = Figure::new(
            bench.scenario,
            format!(
                "{} of {LIVE_BATCH}-record batches while a pass archives and cleans up the 32 buckets",
                way(over_http)
            ),
            Unit::RecordsPerSecond,
            samples.live_rates,
            LIVE_BATCH as u64,
        )
        .against(&alone);
        let p99_alone = Figure::new(
            bench.scenario,
            format!("99th percentile latency of a {LIVE_BATCH}-record {}, no pass running", way(over_http)),
            Unit::Millis,
            samples.alone_p99,
            1,
        );
        let p99_live = Figure::new(
            bench.scenario,
            format!("99th percentile latency of a {LIVE_BATCH}-record {} while a pass runs", way(over_http)),
            Unit::Millis,
            samples.live_p99,
            1,
        );
        // The targets are about appends over HTTP; the in-process figures show the store alone.
        let (live, p99_live) = if over_http {
            (
                live.with_target(
                    LIVE_RATIO_MIN,
                    "appends over HTTP during a pass run at >= 70% of the same without one",
                ),
                p99_live.with_limit(
                    LIVE_P99_MS_MAX,
                    "a 1,000-record append over HTTP during a pass takes under 50 ms at the 99th percentile",
                ),
            )
        } else {
            (live, p99_live)
        };
        if !over_http {
            let one_worker = Figure::new(
                bench.scenario,
                format!(
                    "Engine::append (in process) of {LIVE_BATCH}-record batches while a pass on one worker \
                     (ARCHIVER_CONCURRENCY=1) archives the 32 buckets"
                ),
                Unit::RecordsPerSecond,
                std::mem::take(&mut one_worker_rates),
                LIVE_BATCH as u64,
            )
            .against(&alone);
            bench.push(alone);
            bench.push(live);
            bench.push(one_worker);
        } else {
            bench.push(alone);
            bench.push(live);
        }
        bench.push(p99_alone);
        bench.push(p99_live);
    }
    bench.push(Figure::new(
        bench.scenario,
        "cores the process keeps busy while in-process appends and a pass run (CPU seconds per second)",
        Unit::Cores,
        busy_cores,
        1,
    ));
    Ok(())
}

/// One way of appending's samples, a value per round.
#[derive(Default)]
struct LiveSamples {
    alone_rates: Vec<f64>,
    live_rates: Vec<f64>,
    alone_p99: Vec<f64>,
    live_p99: Vec<f64>,
}

impl LiveSamples {
    /// `LIVE_BATCHES_BASELINE` appends, no pass running.
    fn alone(&mut self, batch: &mut dyn FnMut(usize) -> Vec<Record>, append: &mut Append) -> Result<()> {
        let mut latencies = Vec::with_capacity(LIVE_BATCHES_BASELINE);
        let started = Instant::now();
        for _ in 0..LIVE_BATCHES_BASELINE {
            let records = batch(LIVE_BATCH);
            let t = Instant::now();
            append(records)?;
            latencies.push(t.elapsed().as_secs_f64() * 1e3);
        }
        self.alone_rates.push((LIVE_BATCHES_BASELINE * LIVE_BATCH) as f64 / started.elapsed().as_secs_f64());
        self.alone_p99.push(percentile(&mut latencies, 0.99));
        Ok(())
    }

    /// Appends while passes archive everything due; the seconds that took.
    fn live(
        &mut self,
        engine: &std::sync::Arc<frostline::engine::Engine>,
        runtime: &tokio::runtime::Runtime,
        batch: &mut dyn FnMut(usize) -> Vec<Record>,
        append: &mut Append,
    ) -> Result<f64> {
        let (appended, seconds, mut latencies) = append_while_passing(engine, runtime, batch, append)?;
        self.live_rates.push(appended as f64 / seconds);
        self.live_p99.push(percentile(&mut latencies, 0.99));
        Ok(seconds)
    }
}

/// Appends `LIVE_BATCH`-record batches from `batch` through `append` until passes have
/// archived everything due in `engine`: records appended, seconds, and each append's
/// milliseconds.
fn append_while_passing(
    engine: &std::sync::Arc<frostline::engine::Engine>,
    runtime: &tokio::runtime::Runtime,
    batch: &mut dyn FnMut(usize) -> Vec<Record>,
    append: &mut Append,
) -> Result<(usize, f64, Vec<f64>)> {
    let done = std::sync::atomic::AtomicBool::new(false);
    let mut latencies = Vec::new();
    let seconds = std::thread::scope(|scope| -> Result<f64> {
        let pass = scope.spawn(|| {
            let report = runtime.block_on(passes_until_idle(engine));
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            report
        });
        let started = Instant::now();
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            let records = batch(LIVE_BATCH);
            let t = Instant::now();
            append(records)?;
            latencies.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let seconds = started.elapsed().as_secs_f64();
        let report = pass.join().expect("the pass thread panicked")?;
        ensure!(report.errors.is_empty() && report.archived > 0, "the pass under appends: {report:?}");
        Ok(seconds)
    })?;
    ensure!(latencies.len() >= 10, "only {} appends ran during the pass", latencies.len());
    Ok((latencies.len() * LIVE_BATCH, seconds, latencies))
}

/// The engine's HTTP API on a free port of 127.0.0.1, served as `frostline run` serves it (no
/// tokens, on loopback, on a runtime of its own at normal priority while passes run on the
/// archival one), and a keep-alive client of it.
struct LocalApi {
    runtime: tokio::runtime::Runtime,
    url: String,
    agent: ureq::Agent,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl LocalApi {
    fn serve(engine: &std::sync::Arc<frostline::engine::Engine>) -> Result<LocalApi> {
        use frostline::api;
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let state = std::sync::Arc::new(api::ApiState {
            engine: engine.clone(),
            auth: api::auth::Auth::default(),
            metrics: std::sync::Arc::new(api::metrics::Metrics::new()?),
            passes: std::sync::Arc::new(frostline::ops::passes::Passes::new(
                engine.new_owner_token(),
                std::sync::Arc::new(|_| {}),
                None,
            )),
            stopping,
        });
        let settings = api::ServeSettings {
            listen: "127.0.0.1:0".parse()?,
            auth: state.auth.clone(),
            tls: None,
            max_connections: None,
            first_request_timeout: std::time::Duration::from_secs(
                api::connections::FIRST_REQUEST_TIMEOUT_SECONDS_DEFAULT,
            ),
        };
        let running = runtime.block_on(api::start(state, &settings))?;
        Ok(LocalApi {
            runtime,
            url: format!("http://{}/v1/tables/{DATASET_TABLE}/records", running.local_addr),
            agent: ureq::Agent::new_with_defaults(),
            stop,
            task: running.task,
        })
    }

    /// POSTs `records` as JSON lines; the answer must count them all as appended.
    fn append(&self, records: &[Record]) -> Result<()> {
        let mut body = String::with_capacity(records.len() * 120);
        for r in records {
            body.push_str(&serde_json::to_string(&serde_json::json!({
                "partition_key": String::from_utf8_lossy(&r.partition_key),
                "event_time": r.event_time,
                "sort_key": String::from_utf8_lossy(&r.sort_key),
                "body": serde_json::value::RawValue::from_string(r.body.clone())?,
            }))?);
            body.push('\n');
        }
        let answer: serde_json::Value = self
            .agent
            .post(&self.url)
            .header("Content-Type", "application/x-ndjson")
            .send(&body)
            .context("POST of a batch of records")?
            .body_mut()
            .read_to_string()
            .map(|text| serde_json::from_str(&text))??;
        ensure!(answer["appended"] == records.len(), "the API answered {answer}");
        Ok(())
    }

    fn stop(self) -> Result<()> {
        let _ = self.stop.send(true);
        self.runtime.block_on(self.task)??;
        Ok(())
    }
}

/// User and system CPU seconds of this process so far (getrusage).
fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// `restic` on the PATH and its version line, or why it cannot be used.
fn restic_binary() -> std::result::Result<(PathBuf, String), String> {
    let binary = PathBuf::from("restic");
    match Command::new(&binary).arg("version").output() {
        Ok(output) if output.status.success() => {
            let text = String::from_utf8_lossy(&output.stdout);
            // "restic 0.14.0 compiled with go1.19.8 on linux/amd64"
            let version = text.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
            Ok((binary, version))
        }
        Ok(output) => Err(format!("`restic version` failed: {}", String::from_utf8_lossy(&output.stderr).trim())),
        Err(e) => {
            Err(format!("restic is not on the PATH ({e}); scripts/bench installs Debian's package into .tools/restic"))
        }
    }
}

/// Seconds of `restic backup` of the segments written out as files, into a new repository
/// (initialized untimed), with its cache in the same temporary directory.
fn restic_once(binary: &Path, segments: &[Vec<u8>]) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let files = dir.path().join("records");
    std::fs::create_dir_all(&files)?;
    for (i, bytes) in segments.iter().enumerate() {
        std::fs::write(files.join(format!("bucket-{i:05}.jsonl")), bytes)?;
    }
    let repo = dir.path().join("repo");
    let restic = |args: &[&str]| -> Result<()> {
        let output = Command::new(binary)
            .args(args)
            .arg("--repo")
            .arg(&repo)
            .arg("--quiet")
            .env("RESTIC_PASSWORD", RESTIC_PASSWORD)
            .env("RESTIC_CACHE_DIR", dir.path().join("cache"))
            .output()
            .with_context(|| format!("cannot run {}", binary.display()))?;
        ensure!(
            output.status.success(),
            "`restic {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(())
    };
    restic(&["init"])?;
    let start = Instant::now();
    restic(&["backup", files.to_str().context("a temporary path is not UTF-8")?])?;
    Ok(start.elapsed().as_secs_f64())
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

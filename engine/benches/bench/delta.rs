//! Scenario delta: what the Delta log of a Parquet table's archive costs and gives.
//!
//! - Archive throughput of a Parquet table with its Delta log against the same table without
//!   one (its target wrapped so that it is no object store delta-rs can write to), the same
//!   records, a run of each per round.
//! - The cost of the Delta commit per publication: 1, 3 and 8 engines (installations) archive
//!   one table into one local directory at once, and into one moto S3 bucket when
//!   `FROSTLINE_MOTO_SERVER` names moto's server (`scripts/install-test-servers`), one bucket
//!   each per pass; each pass's `delta_log` phase is one commit (or more, when it lost a race).
//!   Reported as the median over rounds of each round's 50th and 95th percentile.
//! - Reading one year (365 daily segments) of the table through the Delta log with delta-rs's
//!   Python package against pyarrow reading the same Parquet files (found by listing), timed
//!   inside Python (`FROSTLINE_PYTHON`).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use frostline::archive::Phase;
use frostline::clock::ManualClock;
use frostline::engine::Engine;
use frostline::model::Record;
use frostline::model::time::MICROS_PER_DAY;
use frostline::policy::LoadOptions;
use frostline::storage::ArchiveBackend;

use crate::data::{
    APPEND_NOW_MICROS, ARCHIVE_NOW_MICROS, DATASET_START_MICROS, DATASET_TABLE, Dirs, MEGABYTE, dataset,
    passes_until_idle, reading_body,
};
use crate::harness::{Bench, Figure, Unit, percentile};

const RECORDS_DEFAULT: usize = 50_000;
const RECORDS_FULL: usize = 200_000;
/// The Delta log may cost at most a tenth of the archive throughput.
const WITH_LOG_RATIO_MIN: f64 = 0.9;
/// Passes (publications per engine) per round of the commit-cost figure.
const COMMITS_PER_ROUND: usize = 12;
const ENGINE_COUNTS: [usize; 3] = [1, 3, 8];
const YEAR_DAYS: i64 = 365;
const RECORDS_PER_DAY: usize = 200;
const PYTHON_ENV: &str = "FROSTLINE_PYTHON";

fn policy(target: &str) -> String {
    format!(
        "{target}[[table]]\nid = \"{DATASET_TABLE}\"\nformat = \"parquet\"\ntarget = \"cold\"\n\
         strategy = {{ plugin = \"builtin:calendar-day-utc\" }}\n\
         retention = {{ plugin = \"builtin:eligible-before\", config = {{ archive_after = \"1s\" }} }}\n"
    )
}

fn local_target(dir: &Path) -> String {
    format!("[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", dir.display())
}

/// A target that hides its object store: the table gets no Delta log (the baseline).
#[derive(Debug)]
struct WithoutDeltaLog(Arc<dyn ArchiveBackend>);

#[async_trait::async_trait]
impl ArchiveBackend for WithoutDeltaLog {
    fn target(&self) -> &str {
        self.0.target()
    }
    async fn put_create(&self, key: &str, bytes: bytes::Bytes) -> frostline::Result<frostline::storage::PutOutcome> {
        self.0.put_create(key, bytes).await
    }
    async fn put_create_staged(
        &self,
        key: &str,
        bytes: bytes::Bytes,
    ) -> frostline::Result<frostline::storage::PutOutcome> {
        self.0.put_create_staged(key, bytes).await
    }
    async fn get(&self, key: &str) -> frostline::Result<Option<bytes::Bytes>> {
        self.0.get(key).await
    }
    async fn delete(&self, key: &str) -> frostline::Result<()> {
        self.0.delete(key).await
    }
    async fn list(&self, prefix: &str) -> frostline::Result<Vec<frostline::storage::ObjectInfo>> {
        self.0.list(prefix).await
    }
}

fn open(dirs: &Dirs, now: i64, delta_log: bool) -> Result<Arc<Engine>> {
    let options = if delta_log {
        LoadOptions::default()
    } else {
        LoadOptions {
            wrap_target: Some(Arc::new(|_name: &str, backend: Arc<dyn ArchiveBackend>| {
                Arc::new(WithoutDeltaLog(backend)) as Arc<dyn ArchiveBackend>
            })),
        }
    };
    let engine = Engine::open_with(
        &dirs.data(),
        &dirs.policies(),
        frostline::settings::Settings::default(),
        ManualClock::new(now),
        options,
    )?;
    let table = engine.policies().table(DATASET_TABLE)?.clone();
    ensure!(table.delta_log() == delta_log, "the table's Delta log is {}, wanted {delta_log}", table.delta_log());
    Ok(engine)
}

pub fn delta(bench: &mut Bench) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    throughput(bench, &runtime)?;
    let local = tempfile::tempdir()?;
    commit_cost(bench, &runtime, "local target", &|round| {
        let dir = local.path().join(format!("round-{round}"));
        (local_target(&dir), Vec::new())
    })?;
    match std::env::var("FROSTLINE_MOTO_SERVER") {
        Ok(server) => {
            let moto = Moto::start(&server)?;
            commit_cost(bench, &runtime, "moto S3 bucket", &|round| moto.target(round))?;
        }
        Err(_) => bench.skip(
            &["Delta commit per publication on moto"],
            "FROSTLINE_MOTO_SERVER is not set (scripts/install-test-servers installs moto)".into(),
        ),
    }
    read_year(bench, &runtime)
}

/// moto's S3 server on a free local port, with one bucket; stopped when dropped.
struct Moto {
    child: std::process::Child,
    endpoint: String,
}

impl Moto {
    fn start(server: &str) -> Result<Moto> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(server)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .with_context(|| format!("starting {server}"))?;
        let moto = Moto { child, endpoint: format!("http://127.0.0.1:{port}") };
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        while ureq::get(&format!("{}/", moto.endpoint)).call().is_err() {
            ensure!(Instant::now() < deadline, "moto did not answer on port {port} within 60 s");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        ureq::put(&format!("{}/bench", moto.endpoint)).send_empty().context("creating the bucket")?;
        Ok(moto)
    }

    /// A target on a prefix of its own per round, and the secret files it names.
    fn target(&self, round: usize) -> (String, Vec<(&'static str, &'static str)>) {
        let toml = format!(
            "[[target]]\nname = \"cold\"\nurl = \"s3://bench/round-{round}\"\nendpoint = \"{}\"\n\
             region = \"us-east-1\"\nallow_http = true\naccess_key_id_file = \"secrets/key\"\n\
             secret_access_key_file = \"secrets/secret\"\n",
            self.endpoint
        );
        (toml, vec![("secrets/key", "bench"), ("secrets/secret", "bench-secret")])
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn throughput(bench: &mut Bench, runtime: &tokio::runtime::Runtime) -> Result<()> {
    let count = if bench.options.full { RECORDS_FULL } else { RECORDS_DEFAULT };
    let records = dataset(count);
    let mut input_bytes = 0usize;
    let mut line = Vec::new();
    for r in &records {
        line.clear();
        frostline::format::jsonl::encode_line(r, &mut line)?;
        input_bytes += line.len();
    }
    // The target lies inside the data directory, so a copy of the template copies it too.
    let template = Dirs::new("")?;
    std::fs::write(template.policies().join("tables.toml"), policy(&local_target(&template.data().join("cold"))))?;
    {
        let engine = open(&template, APPEND_NOW_MICROS, true)?;
        for batch in records.chunks(frostline::engine::APPEND_BATCH_RECORDS_MAX) {
            engine.append(DATASET_TABLE, batch.to_vec())?;
        }
    }
    let (mut with_log, mut without) = (Vec::new(), Vec::new());
    for _ in 0..bench.options.repeats {
        for (delta_log, samples) in [(true, &mut with_log), (false, &mut without)] {
            let copy = template.copy()?;
            // The copy's policy names the template's target: point it at the copy's own.
            std::fs::write(copy.policies().join("tables.toml"), policy(&local_target(&copy.data().join("cold"))))?;
            let engine = open(&copy, ARCHIVE_NOW_MICROS, delta_log)?;
            let start = Instant::now();
            let report = runtime.block_on(passes_until_idle(&engine))?;
            let seconds = start.elapsed().as_secs_f64();
            ensure!(report.rows_archived == count as u64, "archived {} of {count} rows", report.rows_archived);
            ensure!(report.errors.is_empty(), "{:?}", report.errors);
            samples.push(input_bytes as f64 / MEGABYTE / seconds);
        }
    }
    let without = Figure::new(
        bench.scenario,
        format!("parquet without a Delta log: archive throughput, {count} records (MB of JSON lines/s)"),
        Unit::MegabytesPerSecond,
        without,
        1,
    );
    let with_log = Figure::new(
        bench.scenario,
        "parquet with its Delta log: archive throughput (MB of JSON lines/s)",
        Unit::MegabytesPerSecond,
        with_log,
        1,
    )
    .against(&without)
    .with_target(WITH_LOG_RATIO_MIN, "the Delta log costs at most a tenth of the archive throughput");
    bench.push(without);
    bench.push(with_log);
    Ok(())
}

/// One record per day of `days` days from the dataset's start, for engine `n`.
fn daily(days: i64, per_day: usize, n: usize) -> Vec<Record> {
    let mut out = Vec::with_capacity(days as usize * per_day);
    for day in 0..days {
        for i in 0..per_day {
            let k = day as usize * per_day + i;
            out.push(Record {
                partition_key: b"sensor-000".to_vec(),
                event_time: DATASET_START_MICROS + day * MICROS_PER_DAY + i as i64 * 1_000_000,
                sort_key: format!("e{n}-{k:08}").into_bytes(),
                tenant: None,
                kind: None,
                body: reading_body("sensor-000", k, k as u64),
            });
        }
    }
    out
}

/// The target of one round (a fresh one each round) and the secret files it names.
type RoundTarget<'a> = &'a dyn Fn(usize) -> (String, Vec<(&'static str, &'static str)>);

fn commit_cost(bench: &mut Bench, runtime: &tokio::runtime::Runtime, on: &str, target: RoundTarget) -> Result<()> {
    let mut round = 0;
    for engines in ENGINE_COUNTS {
        let (mut p50, mut p95) = (Vec::new(), Vec::new());
        for _ in 0..bench.options.repeats {
            round += 1;
            let (target, secrets) = target(round);
            let fleet: Vec<(Dirs, Arc<Engine>, Arc<ManualClock>)> = (0..engines)
                .map(|n| -> Result<_> {
                    let dirs = Dirs::new(&policy(&target))?;
                    for (file, secret) in &secrets {
                        let path = dirs.policies().join(file);
                        std::fs::create_dir_all(path.parent().expect("a secret file lies in a folder"))?;
                        std::fs::write(path, secret)?;
                    }
                    let clock = ManualClock::new(APPEND_NOW_MICROS);
                    let engine = Engine::open_with(
                        &dirs.data(),
                        &dirs.policies(),
                        frostline::settings::Settings::default(),
                        clock.clone(),
                        LoadOptions::default(),
                    )?;
                    engine.append(DATASET_TABLE, daily(COMMITS_PER_ROUND as i64, 10, n))?;
                    Ok((dirs, engine, clock))
                })
                .collect::<Result<_>>()?;
            let mut samples = Vec::new();
            for day in 0..=COMMITS_PER_ROUND as i64 {
                // Day `day - 1` becomes due: one publication per engine per pass.
                let now = DATASET_START_MICROS + day * MICROS_PER_DAY + 1_000_000;
                let reports: Vec<frostline::archive::PassReport> = std::thread::scope(|scope| {
                    let handles: Vec<_> = fleet
                        .iter()
                        .map(|(_, engine, clock)| {
                            clock.set(now);
                            scope.spawn(|| runtime.block_on(frostline::archive::run_pass(&engine.context(), "bench")))
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().expect("a pass thread")).collect::<Result<_, _>>()
                })?;
                for report in reports {
                    ensure!(report.errors.is_empty(), "{:?}", report.errors);
                    if report.archived > 0 {
                        samples.push(report.seconds.get(Phase::DeltaLog) * 1e3);
                    }
                }
            }
            ensure!(samples.len() >= COMMITS_PER_ROUND * engines, "{} commits timed", samples.len());
            p50.push(percentile(&mut samples, 0.5));
            p95.push(percentile(&mut samples, 0.95));
            drop(fleet);
        }
        for (q, samples) in [("p50", p50), ("p95", p95)] {
            bench.push(Figure::new(
                bench.scenario,
                format!("Delta commit per publication, {engines} engine(s) on one {on}: {q}"),
                Unit::Millis,
                samples,
                1,
            ));
        }
    }
    Ok(())
}

fn read_year(bench: &mut Bench, runtime: &tokio::runtime::Runtime) -> Result<()> {
    let python = match std::env::var(PYTHON_ENV) {
        Ok(python) => python,
        Err(_) => {
            bench.skip(
                &["delta-rs read", "pyarrow read"],
                format!("{PYTHON_ENV} is not set (scripts/install-python-tools prints it)"),
            );
            return Ok(());
        }
    };
    let dirs = Dirs::new("")?;
    let target = dirs.data().join("cold");
    std::fs::write(dirs.policies().join("tables.toml"), policy(&local_target(&target)))?;
    let engine = open(&dirs, APPEND_NOW_MICROS, true)?;
    let records = daily(YEAR_DAYS, RECORDS_PER_DAY, 0);
    for batch in records.chunks(frostline::engine::APPEND_BATCH_RECORDS_MAX) {
        engine.append(DATASET_TABLE, batch.to_vec())?;
    }
    drop(engine);
    let engine = open(&dirs, ARCHIVE_NOW_MICROS, true)?;
    let report = runtime.block_on(passes_until_idle(&engine))?;
    ensure!(report.rows_archived == records.len() as u64, "archived {} rows", report.rows_archived);
    let script = r#"
import glob, sys, time
import pyarrow.parquet as pq
from deltalake import DeltaTable
root, runs, expected = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(runs):
    start = time.perf_counter()
    n = DeltaTable(root).to_pyarrow_table().num_rows
    delta = time.perf_counter() - start
    start = time.perf_counter()
    m = pq.read_table(sorted(glob.glob(f"{root}/installation=*/**/*.parquet", recursive=True))).num_rows
    files = time.perf_counter() - start
    assert n == m == expected, (n, m, expected)
    print(f"seconds {delta} {files}")
"#;
    let root = target.join("delta").join(DATASET_TABLE);
    let output = Command::new(&python)
        .args(["-c", script])
        .arg(&root)
        .args([bench.options.repeats.to_string(), records.len().to_string()])
        .output()
        .with_context(|| format!("running {python}"))?;
    ensure!(output.status.success(), "the read script failed: {}", String::from_utf8_lossy(&output.stderr));
    let (mut through_log, mut direct) = (Vec::new(), Vec::new());
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let mut fields = line.strip_prefix("seconds ").context("a timing line")?.split(' ');
        through_log.push(fields.next().context("delta-rs time")?.parse::<f64>()? * 1e3);
        direct.push(fields.next().context("pyarrow time")?.parse::<f64>()? * 1e3);
    }
    let direct = Figure::new(
        bench.scenario,
        format!("pyarrow reads one year ({} records, {YEAR_DAYS} segments) from the Parquet files", records.len()),
        Unit::Millis,
        direct,
        1,
    );
    let through_log = Figure::new(
        bench.scenario,
        "delta-rs (Python) reads the same year through the Delta log",
        Unit::Millis,
        through_log,
        1,
    )
    .against(&direct);
    bench.push(direct);
    bench.push(through_log);
    Ok(())
}

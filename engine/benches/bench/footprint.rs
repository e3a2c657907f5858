//! Scenario footprint: `frostline run` (the release binary) on the example policy directory,
//! as an operator starts it.
//!
//! Start-up is the time from spawning the process to its first answer on `/health`, with the
//! plugins already in the data directory's compiled cache (a first start, untimed, fills it).
//! Idle memory is the resident set two seconds after a start, once a pass has run. Then 1 GiB
//! of records (as JSON lines) is appended over HTTP while the engine's pass loop archives
//! them, `POST /v1/archive` finishes what is left, and the resident set is read again, with
//! its peak. Then `frostline ingest` of a 2 GiB file of JSON lines into a fresh data
//! directory, with the peak resident set of the process (its `VmHWM`). Last, `frostline
//! archive --once` of one year bucket holding 2 GiB of records, with its peak resident set,
//! and a query page of 1,000 records over that archived bucket, with the memory it takes.

use std::io::Read as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use frostline::cli::client::Client;
use frostline::model::time::{MICROS_PER_DAY, format_rfc3339};
use frostline_civil::days_from_civil;

use crate::data::{MEGABYTE, TIMES_SEED, reading_body, release_binary, repo_root, splitmix64};
use crate::harness::{Bench, Figure, GIB, Unit};

/// Start-up from the compiled cache should take under 200 ms.
const STARTUP_MS_MAX: f64 = 200.0;
/// Idle with the example policies, the engine should hold under 64 MiB resident.
const IDLE_MIB_MAX: f64 = 64.0;
/// How long after a start the idle resident set is read: past the first pass.
const IDLE_SETTLE: Duration = Duration::from_secs(2);
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes of JSON lines appended and archived before the second reading.
const ARCHIVE_BYTES: u64 = 1 << 30;
/// Lines per `POST /v1/tables/readings/records`.
const POST_LINES: usize = 10_000;
/// Partitions of the appended readings; each day of each is one bucket.
const PARTITIONS: usize = 16;
/// Readings per partition per day: 20,000 lines of ~300 bytes make a 6 MB bucket.
const PER_PARTITION_DAY: usize = 20_000;
const MIB: f64 = 1024.0 * 1024.0;
/// Bytes of JSON lines in the file `frostline ingest` reads.
const INGEST_BYTES: u64 = 2 << 30;
/// `frostline ingest` of a 2 GiB file should peak under 256 MiB resident.
const INGEST_PEAK_MIB_MAX: f64 = 256.0;
/// Archiving one bucket of 2 GiB of records should peak under 256 MiB resident.
const ARCHIVE_BUCKET_PEAK_MIB_MAX: f64 = 256.0;
/// A query page of 1,000 records should take under 64 MiB above a process that reads no rows.
const QUERY_PAGE_MIB_MAX: f64 = 64.0;
/// The one table of the one-bucket archive: a year bucket per partition, due a day after.
const YEAR_POLICY: &str = "[[table]]\nid = \"readings\"\nstrategy = { plugin = \"builtin:calendar-year-utc\" }\n\
                           retention = { plugin = \"builtin:eligible-before\", config = { archive_after = \"1d\" } }\n";

pub fn footprint(bench: &mut Bench) -> Result<()> {
    let binary = match release_binary() {
        Ok(binary) => binary,
        Err(reason) => {
            bench.skip(&["start-up", "resident memory"], reason);
            return Ok(());
        }
    };
    let data = tempfile::tempdir()?;
    let policies = repo_root().join("policies");
    // The first start compiles the plugins into the data directory's cache.
    Engine::start(&binary, data.path(), &policies)?.stop()?;

    let (mut startup_ms, mut idle_mib) = (Vec::new(), Vec::new());
    for _ in 0..bench.options.repeats {
        let started = Instant::now();
        let engine = Engine::start(&binary, data.path(), &policies)?;
        startup_ms.push(started.elapsed().as_secs_f64() * 1e3);
        std::thread::sleep(IDLE_SETTLE);
        idle_mib.push(engine.memory()?.resident_mib);
        engine.stop()?;
    }
    bench.push(
        Figure::new(
            bench.scenario,
            "start-up of `frostline run` to its first /health answer (example policies, compiled cache)",
            Unit::Millis,
            startup_ms,
            1,
        )
        .with_limit(STARTUP_MS_MAX, "start-up from the compiled cache takes under 200 ms"),
    );
    bench.push(
        Figure::new(
            bench.scenario,
            "resident memory idle, 2 s after start-up (example policies)",
            Unit::Mebibytes,
            idle_mib,
            1,
        )
        .with_limit(IDLE_MIB_MAX, "idle with the example policies in under 64 MiB"),
    );

    // The example policy has these records due at once, so the engine's pass loop archives
    // while they arrive; `POST /v1/archive` then runs passes until nothing is left.
    let engine = Engine::start(&binary, data.path(), &policies)?;
    let client = Client::new(engine.addr, None, None);
    let started = Instant::now();
    let (records, bytes) = append_readings(&client, ARCHIVE_BYTES)?;
    let append_seconds = started.elapsed().as_secs_f64();
    client.archive()?;
    let archived = archived_rows(&client)?;
    let total_seconds = started.elapsed().as_secs_f64();
    ensure!(archived == records, "{archived} of {records} records are archived");
    let memory = engine.memory()?;
    engine.stop()?;
    let label = format!("{:.2} GiB of JSON lines ({records} records)", bytes as f64 / GIB);
    bench.push(Figure::new(
        bench.scenario,
        format!("HTTP append of {label}, {POST_LINES} lines per request, archival running"),
        Unit::RecordsPerSecond,
        vec![records as f64 / append_seconds],
        records,
    ));
    bench.push(Figure::new(
        bench.scenario,
        format!("from the first append until all of {label} is archived (MB of JSON lines per second)"),
        Unit::MegabytesPerSecond,
        vec![bytes as f64 / MEGABYTE / total_seconds],
        1,
    ));
    bench.push(Figure::new(
        bench.scenario,
        format!("resident memory after appending and archiving {label}"),
        Unit::Mebibytes,
        vec![memory.resident_mib],
        1,
    ));
    bench.push(Figure::new(
        bench.scenario,
        format!("peak resident memory while appending and archiving {label}"),
        Unit::Mebibytes,
        vec![memory.peak_mib],
        1,
    ));
    ingest_peak(bench, &binary, &policies)?;
    archive_one_bucket_peak(bench, &binary)
}

/// `frostline ingest` of `INGEST_BYTES` of JSON lines into a fresh data directory: its peak
/// resident set and its rate.
fn ingest_peak(bench: &mut Bench, binary: &Path, policies: &Path) -> Result<()> {
    let scratch = tempfile::tempdir()?;
    let input = scratch.path().join("readings.jsonl");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&input)?);
    let (mut records, mut bytes) = (0u64, 0u64);
    let mut state = TIMES_SEED ^ 5;
    while bytes < INGEST_BYTES {
        let line = reading_line(records as usize, &mut state)?;
        std::io::Write::write_all(&mut file, &line)?;
        bytes += line.len() as u64;
        records += 1;
    }
    std::io::Write::flush(&mut file)?;
    drop(file);
    let data = scratch.path().join("data");
    let input_arg = input.to_str().context("the input path is not UTF-8")?;
    let (status, peak_mib, seconds) =
        run_with_peak(binary, &["ingest", "--table", "readings", input_arg], &data, policies)?;
    ensure!(status == 0, "`frostline ingest` exited with status {status}");
    let label = format!("{:.2} GiB of JSON lines ({records} records)", bytes as f64 / GIB);
    bench.push(
        Figure::new(
            bench.scenario,
            format!("peak resident memory of `frostline ingest` of a file of {label}"),
            Unit::Mebibytes,
            vec![peak_mib],
            1,
        )
        .with_limit(INGEST_PEAK_MIB_MAX, "`frostline ingest` of a 2 GiB file peaks under 256 MiB resident"),
    );
    bench.push(Figure::new(
        bench.scenario,
        format!("`frostline ingest` of a file of {label}"),
        Unit::RecordsPerSecond,
        vec![records as f64 / seconds],
        records,
    ));
    Ok(())
}

/// `frostline archive --once` of one bucket holding `INGEST_BYTES` of records (one partition,
/// one year, ingested first, untimed): the peak resident set of the archiving process, and
/// the rate of the whole pass (plan, archive, cleanup) in MB of JSON lines per second.
fn archive_one_bucket_peak(bench: &mut Bench, binary: &Path) -> Result<()> {
    let scratch = tempfile::tempdir()?;
    let policies = scratch.path().join("policies");
    std::fs::create_dir_all(&policies)?;
    std::fs::write(policies.join("tables.toml"), YEAR_POLICY)?;
    let input = scratch.path().join("readings.jsonl");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&input)?);
    let (mut records, mut bytes) = (0u64, 0u64);
    let mut state = TIMES_SEED ^ 7;
    let start = days_from_civil(2025, 1, 1) * MICROS_PER_DAY;
    while bytes < INGEST_BYTES {
        let n = records as usize;
        let line = serde_json::json!({
            "partition_key": "sensor-000",
            // Ten a second from the start of 2025: 2 GiB of readings stay inside the year.
            "event_time": format_rfc3339(start + n as i64 * 100_000),
            "sort_key": format!("evt-{n:012}"),
            "body": serde_json::from_str::<serde_json::Value>(&reading_body("sensor-000", n, splitmix64(&mut state)))?,
        });
        let mut line = serde_json::to_vec(&line)?;
        line.push(b'\n');
        std::io::Write::write_all(&mut file, &line)?;
        bytes += line.len() as u64;
        records += 1;
    }
    std::io::Write::flush(&mut file)?;
    drop(file);
    let data = scratch.path().join("data");
    let input_arg = input.to_str().context("the input path is not UTF-8")?;
    let (status, _, _) = run_with_peak(binary, &["ingest", "--table", "readings", input_arg], &data, &policies)?;
    ensure!(status == 0, "`frostline ingest` exited with status {status}");
    let (status, peak_mib, seconds) = run_with_peak(binary, &["archive", "--once"], &data, &policies)?;
    ensure!(status == 0, "`frostline archive --once` exited with status {status}");
    let status = Command::new(binary)
        .args(["status", "--json", "--data"])
        .arg(&data)
        .arg("--policies")
        .arg(&policies)
        .output()?;
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).context("`frostline status --json`")?;
    let archived = status["tables"][0]["states"]["archived"]["rows"].as_u64();
    ensure!(archived == Some(records), "the pass archived {archived:?} of {records} records: {status}");
    let label = format!("one bucket of {:.2} GiB of JSON lines ({records} records)", bytes as f64 / GIB);
    // A page of a query over the whole archived bucket, against a command that opens the same
    // store and policies but reads no rows (`status`): the memory the page itself takes.
    let query = ["query", "--table", "readings", "--from", "2025-01-01T00:00:00Z", "--to", "2026-01-01T00:00:00Z"];
    let (status, query_peak_mib, _) =
        run_with_peak(binary, &[&query[..], &["--limit", "1000"]].concat(), &data, &policies)?;
    ensure!(status == 0, "`frostline query` exited with status {status}");
    let (status, idle_peak_mib, _) = run_with_peak(binary, &["status"], &data, &policies)?;
    ensure!(status == 0, "`frostline status` exited with status {status}");
    bench.push(
        Figure::new(
            bench.scenario,
            format!("peak resident memory of `frostline archive --once` of {label}"),
            Unit::Mebibytes,
            vec![peak_mib],
            1,
        )
        .with_limit(ARCHIVE_BUCKET_PEAK_MIB_MAX, "archiving one bucket of 2 GiB peaks under 256 MiB resident"),
    );
    bench.push(
        Figure::new(
            bench.scenario,
            format!(
                "peak resident memory of `frostline query --limit 1000` over {label}, archived, above `frostline status` ({idle_peak_mib:.1} MiB)"
            ),
            Unit::Mebibytes,
            vec![query_peak_mib - idle_peak_mib],
            1,
        )
        .with_limit(QUERY_PAGE_MIB_MAX, "a query page of 1,000 records takes under 64 MiB whatever the bucket size"),
    );
    bench.push(Figure::new(
        bench.scenario,
        format!("`frostline archive --once` of {label} (MB of JSON lines per second, the whole pass)"),
        Unit::MegabytesPerSecond,
        vec![bytes as f64 / MEGABYTE / seconds],
        1,
    ));
    Ok(())
}

/// One reading as a JSON line (the shape `append_readings` posts).
fn reading_line(n: usize, state: &mut u64) -> Result<Vec<u8>> {
    let start = days_from_civil(2025, 1, 1) * MICROS_PER_DAY;
    let step = MICROS_PER_DAY / PER_PARTITION_DAY as i64;
    let (partition, slot) = (n % PARTITIONS, n / PARTITIONS);
    let sensor = format!("sensor-{partition:03}");
    let line = serde_json::json!({
        "partition_key": sensor,
        "event_time": format_rfc3339(start + slot as i64 * step),
        "sort_key": format!("evt-{n:012}"),
        "body": serde_json::from_str::<serde_json::Value>(&reading_body(&sensor, n, splitmix64(state)))?,
    });
    let mut out = serde_json::to_vec(&line)?;
    out.push(b'\n');
    Ok(out)
}

/// Runs `frostline ARGS --data DATA --policies POLICIES` to its end: its exit status, peak
/// resident set in MiB (`wait_with_peak`) and seconds.
pub fn run_with_peak(binary: &Path, args: &[&str], data: &Path, policies: &Path) -> Result<(i32, f64, f64)> {
    run_with_peak_env(binary, args, data, policies, &[])
}

/// `run_with_peak` with `env` set for the child.
pub fn run_with_peak_env(
    binary: &Path,
    args: &[&str],
    data: &Path,
    policies: &Path,
    env: &[(&str, &str)],
) -> Result<(i32, f64, f64)> {
    let started = Instant::now();
    let child = Command::new(binary)
        .args(args)
        .envs(env.iter().copied())
        .arg("--data")
        .arg(data)
        .arg("--policies")
        .arg(policies)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    let (status, peak_mib) = wait_with_peak(child)?;
    Ok((status, peak_mib, started.elapsed().as_secs_f64()))
}

/// Waits for a child and returns its exit status and peak resident set: `VmHWM` of its own
/// image, read from /proc every few milliseconds until it exits. (`wait4`'s `ru_maxrss`
/// would count the parent's pages the child shared between its spawn and its exec.)
fn wait_with_peak(mut child: Child) -> Result<(i32, f64)> {
    let status_path = PathBuf::from(format!("/proc/{}/status", child.id()));
    let mut peak_mib: f64 = 0.0;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok((status.code().unwrap_or(-1), peak_mib));
        }
        if let Ok(text) = std::fs::read_to_string(&status_path)
            && let Some(kib) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        {
            peak_mib = peak_mib.max(kib * 1024.0 / MIB);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Rows of the `readings` table in archived buckets, once no bucket of it is left to archive.
fn archived_rows(client: &Client) -> Result<u64> {
    let status = client.status()?;
    let table = status.tables.iter().find(|t| t.id == "readings").context("no `readings` table in the status")?;
    let pending: Vec<&String> = table.states.keys().filter(|state| state.as_str() != "archived").collect();
    let waiting: u64 = pending.iter().map(|state| table.states[*state].buckets).sum();
    ensure!(waiting == 0, "after POST /v1/archive, {waiting} buckets are still in {pending:?}");
    Ok(table.states.get("archived").map_or(0, |c| c.rows))
}

/// Appends readings to the example `readings` table until `bytes` of JSON lines are sent.
/// They fall in 2025, so the example policy (archive 7 days after the day ends) has them due.
fn append_readings(client: &Client, bytes: u64) -> Result<(u64, u64)> {
    let mut state = TIMES_SEED ^ 3;
    let (mut records, mut sent) = (0u64, 0u64);
    let mut body = Vec::with_capacity(POST_LINES * 320);
    let mut n = 0usize;
    while sent < bytes {
        body.clear();
        for _ in 0..POST_LINES {
            body.extend_from_slice(&reading_line(n, &mut state)?);
            n += 1;
        }
        let counts = client.append("readings", &body, false)?;
        ensure!(counts.appended == POST_LINES as u64, "appended {} of {POST_LINES}", counts.appended);
        records += counts.appended;
        sent += body.len() as u64;
    }
    Ok((records, sent))
}

/// A running `frostline run`.
pub(crate) struct Engine {
    child: Child,
    addr: SocketAddr,
}

pub(crate) struct Memory {
    pub(crate) resident_mib: f64,
    peak_mib: f64,
}

impl Engine {
    /// Spawns the engine and returns once `/health` answers.
    pub(crate) fn start(binary: &Path, data: &Path, policies: &Path) -> Result<Engine> {
        Self::start_under(None, binary, data, policies)
    }

    /// The same, the binary run by `emulator` (qemu-aarch64) when given.
    pub(crate) fn start_under(emulator: Option<&Path>, binary: &Path, data: &Path, policies: &Path) -> Result<Engine> {
        let addr_file = data.join(frostline::api::ADDR_FILE);
        let _ = std::fs::remove_file(&addr_file);
        let mut command = match emulator {
            Some(emulator) => {
                let mut command = Command::new(emulator);
                command.arg(binary);
                command
            }
            None => Command::new(binary),
        };
        let mut child = command
            .arg("run")
            .arg("--data")
            .arg(data)
            .arg("--policies")
            .arg(policies)
            .args(["--listen", "127.0.0.1:0"])
            .env_remove("FROSTLINE_TOKENS")
            .env_remove("FROSTLINE_ADMIN_TOKENS")
            .env("FROSTLINE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                let mut stderr = String::new();
                if let Some(mut pipe) = child.stderr.take() {
                    pipe.read_to_string(&mut stderr)?;
                }
                bail!("`frostline run` exited during start-up ({status}): {}", stderr.trim());
            }
            if let Some(addr) = std::fs::read_to_string(&addr_file).ok().and_then(|t| t.trim().parse().ok())
                && health(addr)
            {
                return Ok(Engine { child, addr });
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("`frostline run` did not answer /health within {START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The resident set and its peak, from /proc.
    pub(crate) fn memory(&self) -> Result<Memory> {
        let path = PathBuf::from(format!("/proc/{}/status", self.child.id()));
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let field = |name: &str| -> Result<f64> {
            let line = text.lines().find(|l| l.starts_with(name)).with_context(|| format!("no {name} in /proc"))?;
            let kib: f64 = line.split_whitespace().nth(1).context("malformed /proc status line")?.parse()?;
            Ok(kib * 1024.0 / MIB)
        };
        Ok(Memory { resident_mib: field("VmRSS:")?, peak_mib: field("VmHWM:")? })
    }

    /// SIGTERM, then waits for a clean exit.
    pub(crate) fn stop(mut self) -> Result<()> {
        // SAFETY: kill(2) on the pid of a child this process spawned and has not reaped.
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        ensure!(sent == 0, "cannot signal the engine: {}", std::io::Error::last_os_error());
        let status = self.child.wait()?;
        ensure!(status.success(), "`frostline run` stopped with {status}");
        Ok(())
    }
}

/// Whether `GET /health` answers 200.
fn health(addr: SocketAddr) -> bool {
    ureq::get(format!("http://{addr}/health")).call().is_ok()
}

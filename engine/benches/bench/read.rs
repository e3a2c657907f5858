//! Scenario read: ten years of one partition in day buckets, queried page by page (the largest
//! page) and written out as JSON lines, while hot and once archived as Parquet, in-process and
//! as users read it: `frostline query --limit 100000`, a new process per page following the
//! cursor, writing to a pipe. The baseline is DuckDB reading the same Parquet files as a DuckDB
//! user would name them (the table's data files for that partition, listed before the timer,
//! as a Delta log lists them; no Hive discovery) and writing the same records as JSON lines.
//! DuckDB runs under `FROSTLINE_PYTHON` (the interpreter `scripts/install-python-tools`
//! prepares for the tests); its figure is the time of the query inside Python, without the
//! interpreter's start-up. Without it the DuckDB row is skipped, and without the release
//! binary the CLI row.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use frostline::engine::Engine;
use frostline::model::time::MICROS_PER_DAY;
use frostline::model::{Micros, Record};
use frostline::query::{QUERY_LIMIT_MAX, QueryRequest};
use frostline_civil::days_from_civil;

use crate::data::{Dirs, TIMES_SEED, passes_until_idle, reading_body, release_binary, splitmix64};
use crate::harness::{Bench, Figure, Unit};

const TABLE: &str = "readings";
const PARTITION: &str = "sensor-000";
const YEARS: i64 = 10;
const RECORDS_PER_DAY_DEFAULT: usize = 100;
const RECORDS_PER_DAY_FULL: usize = 1_000;
/// 2015-01-01 to 2025-01-01.
const START_MICROS: Micros = days_from_civil(2015, 1, 1) * MICROS_PER_DAY;
const END_MICROS: Micros = days_from_civil(2015 + YEARS, 1, 1) * MICROS_PER_DAY;
const BUILD_BATCH: usize = 10_000;
/// The cold query should run at least half as fast as DuckDB on the same files.
const DUCKDB_RATIO_MIN: f64 = 0.5;
/// The page a user asks `frostline query` for.
const CLI_PAGE_RECORDS: usize = 100_000;
/// The interpreter with DuckDB installed.
const PYTHON_ENV: &str = "FROSTLINE_PYTHON";

pub fn read(bench: &mut Bench) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let per_day = if bench.options.full { RECORDS_PER_DAY_FULL } else { RECORDS_PER_DAY_DEFAULT };
    let days = ((END_MICROS - START_MICROS) / MICROS_PER_DAY) as usize;
    let count = days * per_day;
    let dirs = Dirs::new(&format!(
        "[[table]]\nid = \"{TABLE}\"\nformat = \"parquet\"\nstrategy = {{ plugin = \"builtin:calendar-day-utc\" }}\n\
         retention = {{ plugin = \"builtin:eligible-before\", config = {{ archive_after = \"1d\" }} }}\n"
    ))?;
    append_ten_years(&dirs.open(START_MICROS)?, per_day, count)?;
    let query_all = |engine: &Arc<Engine>| -> Result<u64> {
        let mut cursor = None;
        let (mut seen, mut out) = (0, Vec::with_capacity(64 << 20));
        loop {
            let request = QueryRequest {
                table: TABLE.into(),
                partition_key: Some(PARTITION.as_bytes().to_vec()),
                from: Some(START_MICROS),
                to: Some(END_MICROS),
                limit: QUERY_LIMIT_MAX,
                cursor,
                tenants: None,
                conditions: Vec::new(),
            };
            let page = runtime.block_on(frostline::query::query(&engine.context(), request))?;
            seen += page.records.len();
            out.clear();
            for record in &page.records {
                out.extend_from_slice(frostline::ops::records::record_json(record).as_bytes());
                out.push(b'\n');
            }
            cursor = page.next_cursor;
            if cursor.is_none() {
                break;
            }
        }
        ensure!(seen == count, "the ten-year query returned {seen} of {count} records");
        Ok(out.len() as u64)
    };
    let label = format!("{YEARS} years of one partition ({count} records in {days} day buckets) as JSON lines");
    let engine = dirs.open(START_MICROS)?;
    let hot = bench.time_each(
        format!("query {label}, all hot"),
        Unit::Millis,
        bench.options.repeats,
        || Ok(()),
        |()| query_all(&engine),
    )?;
    drop(engine);
    let engine = dirs.open(END_MICROS + 2 * MICROS_PER_DAY)?;
    let report = runtime.block_on(passes_until_idle(&engine))?;
    ensure!(report.archived == days as u64, "archived {} of {days} buckets", report.archived);
    let cold = bench.time_each(
        format!("query {label}, all archived (Parquet)"),
        Unit::Millis,
        bench.options.repeats,
        || Ok(()),
        |()| query_all(&engine),
    )?;
    drop(engine);
    let cli = match release_binary() {
        Ok(binary) => Some(bench.time_each(
            format!("frostline query --limit {CLI_PAGE_RECORDS}: {label}, all archived (Parquet), to a pipe"),
            Unit::Millis,
            bench.options.repeats,
            || Ok(()),
            |()| query_through_cli(&binary, &dirs, count),
        )?),
        Err(why) => {
            bench.skip(&["frostline query"], why);
            None
        }
    };
    let duckdb = match std::env::var(PYTHON_ENV) {
        Ok(python) => Some(duckdb_figure(bench, &python, &dirs.data().join("archive"), count)?),
        Err(_) => {
            bench.skip(&["DuckDB"], format!("{PYTHON_ENV} is not set (scripts/install-python-tools prints it)"));
            None
        }
    };
    let hot_against_cold = hot.against(&cold).with_target(1.0, "hot reads are at least as fast as archived ones");
    let against_duckdb = |figure: Figure, how: &'static str| match &duckdb {
        Some(duckdb) => figure.against(duckdb).with_target(DUCKDB_RATIO_MIN, how),
        None => figure,
    };
    bench.push(hot_against_cold);
    bench.push(against_duckdb(
        cold,
        "a ten-year query of archived Parquet runs at >= 0.5 of DuckDB on the same files (in-process)",
    ));
    if let Some(cli) = cli {
        bench.push(against_duckdb(
            cli,
            "a ten-year query of archived Parquet through the CLI runs at >= 0.5 of DuckDB on the same files",
        ));
    }
    if let Some(duckdb) = duckdb {
        bench.push(duckdb);
    }
    Ok(())
}

/// Every page of the ten-year query as a user pages it: `frostline query` run again with the
/// cursor the last page printed, its JSON lines read from a pipe. Returns the bytes read.
fn query_through_cli(binary: &Path, dirs: &Dirs, count: usize) -> Result<u64> {
    use std::io::Read;
    let (mut cursor, mut lines, mut bytes) = (None::<String>, 0usize, 0u64);
    let (from, to) =
        (frostline::model::time::format_rfc3339(START_MICROS), frostline::model::time::format_rfc3339(END_MICROS));
    loop {
        let mut command = Command::new(binary);
        command
            .arg("query")
            .arg("--data")
            .arg(dirs.data())
            .arg("--policies")
            .arg(dirs.policies())
            .args(["--table", TABLE, "--partition", PARTITION, "--from", &from, "--to", &to])
            .args(["--limit", &CLI_PAGE_RECORDS.to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some(cursor) = &cursor {
            command.args(["--cursor", cursor]);
        }
        let mut child = command.spawn().with_context(|| format!("cannot run {}", binary.display()))?;
        let mut out = Vec::with_capacity(64 << 20);
        child.stdout.take().context("the query's stdout")?.read_to_end(&mut out)?;
        let output = child.wait_with_output()?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        ensure!(output.status.success(), "frostline query failed: {stderr}");
        lines += out.iter().filter(|b| **b == b'\n').count();
        bytes += out.len() as u64;
        cursor = stderr.lines().find_map(|l| l.strip_prefix("next cursor: ")).map(str::to_string);
        if cursor.is_none() {
            break;
        }
    }
    ensure!(lines == count, "frostline query wrote {lines} of {count} records");
    Ok(bytes)
}

fn append_ten_years(engine: &Arc<Engine>, per_day: usize, count: usize) -> Result<()> {
    let mut state = TIMES_SEED ^ 2;
    let step = MICROS_PER_DAY / per_day as Micros;
    let mut batch = Vec::with_capacity(BUILD_BATCH);
    for n in 0..count {
        let random = splitmix64(&mut state);
        batch.push(Record {
            partition_key: PARTITION.as_bytes().to_vec(),
            event_time: START_MICROS + (n / per_day) as Micros * MICROS_PER_DAY + (n % per_day) as Micros * step,
            sort_key: format!("evt-{n:010}").into_bytes(),
            tenant: None,
            kind: None,
            body: reading_body(PARTITION, n, random),
        });
        if batch.len() == BUILD_BATCH || n + 1 == count {
            engine.append(TABLE, std::mem::take(&mut batch))?;
        }
    }
    Ok(())
}

/// DuckDB reading the partition's Parquet segments, named as a list, and writing the range as
/// JSON lines in query order, timed inside Python.
fn duckdb_figure(bench: &Bench, python: &str, archive: &Path, count: usize) -> Result<Figure> {
    let script = r#"
import glob, sys, tempfile, time, duckdb
root, table, partition, lo, hi, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
# The table's data files for the partition, as a Delta log lists them, named to DuckDB as a
# list: no Hive discovery over folders the query does not need.
files = sorted(glob.glob(f"{root}/delta/{table}/installation=*/bucket=*/partition={partition}/*.parquet"))
out = tempfile.NamedTemporaryFile(suffix=".jsonl")
query = f"""COPY (SELECT partition_key, epoch_us(event_time) AS event_time, sort_key, tenant, kind, body::JSON AS body
    FROM read_parquet({files!r}) WHERE event_time >= make_timestamp({lo}) AND event_time < make_timestamp({hi})
    ORDER BY event_time, sort_key, partition_key) TO '{out.name}' (FORMAT JSON)"""
for _ in range(runs):
    con = duckdb.connect()
    start = time.perf_counter()
    con.execute(query)
    print(f"seconds {time.perf_counter() - start}")
    con.close()
print(sum(1 for _ in open(out.name)), file=sys.stderr)
"#;
    let output = Command::new(python)
        .args(["-c", script])
        .arg(archive)
        .arg(TABLE)
        .arg(PARTITION)
        .args([START_MICROS.to_string(), END_MICROS.to_string(), bench.options.repeats.to_string()])
        .output()
        .with_context(|| format!("cannot run {python}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(output.status.success(), "DuckDB failed: {stderr}");
    let written: usize = stderr.trim().parse().with_context(|| format!("DuckDB printed no line count: {stderr}"))?;
    ensure!(written == count, "DuckDB wrote {written} of {count} records");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let samples = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("seconds "))
        .map(|s| s.trim().parse::<f64>().map(|s| s * 1e3))
        .collect::<std::result::Result<Vec<_>, _>>()
        .with_context(|| format!("DuckDB printed no timing: {stdout}"))?;
    ensure!(samples.len() == bench.options.repeats, "DuckDB printed {} timings: {stdout}", samples.len());
    Ok(Figure::new(
        bench.scenario,
        format!("DuckDB: the same {YEARS} years from the same Parquet files (listed), written as JSON lines"),
        Unit::Millis,
        samples,
        1,
    ))
}

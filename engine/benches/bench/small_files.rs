//! Scenario small-files: one year of day buckets of three partitions archived as Parquet (a
//! file per partition and day, 1,098 files, flights-like rows), read by the analytics engines
//! users point at the archive, against the same rows in one file. Each reader computes one
//! aggregate (the average of a JSON field per partition) over the day files, found by Hive
//! partition discovery below the Delta table root, and over the one file; the figures are the
//! query's time inside a warm process (the interpreter and Spark's JVM started once), so the
//! ratio is what the file count costs, the guidance docs/FLEET.md gives for bucket sizes.
//! DuckDB and polars run under `FROSTLINE_PYTHON`, Spark under `FROSTLINE_PYSPARK_PYTHON`
//! (`scripts/install-python-tools`, `scripts/install-pyspark`); a reader whose interpreter
//! is not set is skipped and says so.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use frostline::model::time::MICROS_PER_DAY;
use frostline::model::{Micros, Record};
use frostline_civil::days_from_civil;

use crate::data::{Dirs, TIMES_SEED, passes_until_idle, splitmix64};
use crate::harness::{Bench, Figure, Unit};

const TABLE: &str = "flights";
const CARRIERS: [&str; 3] = ["AA", "DL", "UA"];
/// 2024 (a leap year): 366 day buckets per carrier.
const START_MICROS: Micros = days_from_civil(2024, 1, 1) * MICROS_PER_DAY;
const DAYS: usize = 366;
/// Flights per carrier and day: 3 x 366 x 307 = 337,086 rows, about a year of nycflights13.
const FLIGHTS_PER_DAY: usize = 307;
const BUILD_BATCH: usize = 10_000;

pub fn small_files(bench: &mut Bench) -> Result<()> {
    let dirs = Dirs::new(&format!(
        "[[table]]\nid = \"{TABLE}\"\nformat = \"parquet\"\nstrategy = {{ plugin = \"builtin:calendar-day-utc\" }}\n\
         retention = {{ plugin = \"builtin:eligible-before\", config = {{ archive_after = \"1d\" }} }}\n"
    ))?;
    let engine = dirs.open(START_MICROS + (DAYS as Micros + 2) * MICROS_PER_DAY)?;
    let rows = append_a_year(&engine)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(passes_until_idle(&engine))?;
    ensure!(
        report.archived as usize == CARRIERS.len() * DAYS,
        "archived {} of {} buckets",
        report.archived,
        CARRIERS.len() * DAYS
    );
    drop(engine);
    let archive = dirs.data().join("archive");
    // The one file, written once by pyarrow (under FROSTLINE_PYTHON) from the day files.
    let Ok(python) = std::env::var("FROSTLINE_PYTHON") else {
        bench.skip(&["every reader"], "FROSTLINE_PYTHON is not set (scripts/bench installs it)".into());
        return Ok(());
    };
    let one_dir = tempfile::tempdir()?;
    let one = one_dir.path().join("one.parquet");
    let written = Command::new(&python)
        .args(["-c", ONE_FILE_SCRIPT])
        .arg(archive.join("delta").join(TABLE))
        .arg(&one)
        .output()
        .with_context(|| format!("cannot run {python}"))?;
    ensure!(written.status.success(), "writing the one file failed: {}", String::from_utf8_lossy(&written.stderr));
    for (reader, variable) in
        [("duckdb", "FROSTLINE_PYTHON"), ("polars", "FROSTLINE_PYTHON"), ("spark", "FROSTLINE_PYSPARK_PYTHON")]
    {
        let Ok(python) = std::env::var(variable) else {
            bench.skip(&[reader], format!("{variable} is not set (scripts/bench installs it)"));
            continue;
        };
        let (days, one_file) = reader_figures(bench, reader, &python, &archive, &one, rows)?;
        bench.push(one_file.clone());
        bench.push(days.against(&one_file));
    }
    Ok(())
}

/// Appends the year, returns the rows appended.
fn append_a_year(engine: &std::sync::Arc<frostline::engine::Engine>) -> Result<usize> {
    let mut state = TIMES_SEED ^ 7;
    let step = MICROS_PER_DAY / FLIGHTS_PER_DAY as Micros;
    let mut batch = Vec::with_capacity(BUILD_BATCH);
    let mut rows = 0;
    for day in 0..DAYS {
        for carrier in CARRIERS {
            for n in 0..FLIGHTS_PER_DAY {
                let random = splitmix64(&mut state);
                let dep_delay = (random % 120) as i64 - 15;
                let arr_delay = dep_delay + ((random >> 8) % 30) as i64 - 15;
                batch.push(Record {
                    partition_key: carrier.as_bytes().to_vec(),
                    event_time: START_MICROS + day as Micros * MICROS_PER_DAY + n as Micros * step,
                    sort_key: format!("{carrier}{:04}-{n:03}", (random >> 16) % 2_000).into_bytes(),
                    tenant: None,
                    kind: None,
                    body: format!(
                        r#"{{"carrier":"{carrier}","flight":{},"origin":"{}","dest":"{}","dep_delay":{dep_delay},"arr_delay":{arr_delay},"distance":{}}}"#,
                        (random >> 16) % 2_000,
                        ["EWR", "JFK", "LGA"][(random >> 24) as usize % 3],
                        ["ATL", "ORD", "LAX", "SFO", "MIA", "BOS"][(random >> 32) as usize % 6],
                        200 + (random >> 40) % 2_500
                    ),
                });
                rows += 1;
                if batch.len() == BUILD_BATCH {
                    engine.append(TABLE, std::mem::take(&mut batch))?;
                }
            }
        }
    }
    if !batch.is_empty() {
        engine.append(TABLE, batch)?;
    }
    Ok(rows)
}

/// Writes the rows of every day file below a Delta table root into one Parquet file.
const ONE_FILE_SCRIPT: &str = r#"
import glob, sys
import pyarrow as pa, pyarrow.parquet as pq
base, one = sys.argv[1], sys.argv[2]
files = sorted(glob.glob(f"{base}/installation=*/**/*.parquet", recursive=True))
pq.write_table(pa.concat_tables([pq.read_table(f, partitioning=None) for f in files]), one)
"#;

/// The reader's aggregate over the day files and over one file of the same rows, timed inside
/// one process, round by round (one sample of each per round, so load hits both alike).
fn reader_figures(
    bench: &Bench,
    reader: &str,
    python: &str,
    archive: &Path,
    one: &Path,
    rows: usize,
) -> Result<(Figure, Figure)> {
    let script = r#"
import glob, sys, time
reader, root, table, one, runs, rows = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
base = f"{root}/delta/{table}"
files = sorted(glob.glob(f"{base}/installation=*/**/*.parquet", recursive=True))
if reader == "duckdb":
    import duckdb
    con = duckdb.connect()
    def run(source):
        q = f"""SELECT partition_key, avg(CAST(json_extract(body, '$.dep_delay') AS DOUBLE)), count(*)
                FROM read_parquet({source}) GROUP BY partition_key"""
        return con.execute(q).fetchall()
    days, single = f"'{base}/installation=*/**/*.parquet', hive_partitioning = true", f"'{one}'"
elif reader == "polars":
    import polars as pl
    def run(source):
        return (pl.scan_parquet(source, hive_partitioning=source != one).group_by("partition_key")
                .agg(pl.col("body").str.json_path_match("$.dep_delay").cast(pl.Float64).mean(), pl.len())
                .collect().rows())
    days, single = f"{base}/installation=*/**/*.parquet", one
elif reader == "spark":
    from pyspark.sql import SparkSession, functions as F
    spark = (SparkSession.builder.master("local[*]").config("spark.ui.enabled", "false")
             .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    def run(source):
        df = (spark.read.option("basePath", base).parquet(f"{base}/installation=*") if source == "days"
              else spark.read.parquet(one))
        return (df.groupBy("partition_key")
                .agg(F.avg(F.get_json_object("body", "$.dep_delay").cast("double")), F.count("*")).collect())
    days, single = "days", one
else:
    sys.exit(f"unknown reader {reader}")
def counted(result):
    return sum(r[2] for r in result)
assert counted(run(days)) == rows and counted(run(single)) == rows, "a reader lost rows"
print(f"files {len(files)}")
for _ in range(runs):
    for name, source in [("days", days), ("one", single)]:
        start = time.perf_counter()
        run(source)
        print(f"{name} {time.perf_counter() - start}")
"#;
    let output = Command::new(python)
        .args(["-c", script, reader])
        .arg(archive)
        .arg(TABLE)
        .arg(one)
        .args([bench.options.repeats.to_string(), rows.to_string()])
        .output()
        .with_context(|| format!("cannot run {python}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(output.status.success(), "{reader} failed: {}{stdout}", String::from_utf8_lossy(&output.stderr));
    let samples = |name: &str| -> Result<Vec<f64>> {
        stdout
            .lines()
            .filter_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .map(|s| s.trim().parse::<f64>().map(|s| s * 1e3).with_context(|| format!("{reader} printed `{s}`")))
            .collect()
    };
    let files: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("files "))
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("{reader} printed no file count: {stdout}"))?;
    ensure!(files == CARRIERS.len() * DAYS, "{reader} found {files} files, not one per carrier and day");
    let (days, one) = (samples("days")?, samples("one")?);
    ensure!(
        days.len() == bench.options.repeats && one.len() == days.len(),
        "{reader} printed too few timings: {stdout}"
    );
    let label = match reader {
        "duckdb" => "DuckDB",
        "polars" => "polars",
        _ => "Spark (local mode, warm session)",
    };
    Ok((
        Figure::new(
            bench.scenario,
            format!("{label}: average dep_delay per carrier over {files} day files ({rows} rows)"),
            Unit::Millis,
            days,
            1,
        ),
        Figure::new(bench.scenario, format!("{label}: the same over one file of the same rows"), Unit::Millis, one, 1),
    ))
}

//! Scenario typed: what declared columns (`[[table.column]]`) cost and give. The archive pass
//! over the same flights-like rows with five typed columns against without any, round by
//! round (a fresh data directory per sample for each); and DuckDB computing the average
//! `dep_delay` per carrier over the archived table's files from the typed column against the
//! same through `json_extract` on `body`, as a user without declared columns writes it (one
//! warm process, round by round). DuckDB runs under `FROSTLINE_PYTHON`
//! (`scripts/install-python-tools`); without it that pair is skipped and says so.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use frostline::model::time::MICROS_PER_DAY;
use frostline::model::{Micros, Record};
use frostline_civil::days_from_civil;

use crate::data::{Dirs, TIMES_SEED, passes_until_idle, splitmix64};
use crate::harness::{Bench, Figure, Phases, Unit, push_phases};

const TABLE: &str = "flights";
const CARRIERS: [&str; 6] = ["AA", "B6", "DL", "EV", "UA", "WN"];
const START_MICROS: Micros = days_from_civil(2024, 1, 1) * MICROS_PER_DAY;
/// Day buckets of one partition: 32 buckets of 6,250 rows, the archive scenario's shape.
const DAYS: usize = 32;
const ROWS_PER_DAY: usize = 6_250;
const BUILD_BATCH: usize = 10_000;

const COLUMNS: &str = r#"
[[table.column]]
name = "carrier"
type = "string"

[[table.column]]
name = "dep_delay"
type = "int64"

[[table.column]]
name = "arr_delay"
type = "int64"

[[table.column]]
name = "distance"
type = "float64"

[[table.column]]
name = "sched_dep"
type = "timestamp"
"#;

fn policy(columns: &str) -> String {
    format!(
        "[[table]]\nid = \"{TABLE}\"\nformat = \"parquet\"\nstrategy = {{ plugin = \"builtin:calendar-day-utc\" }}\n\
         retention = {{ plugin = \"builtin:eligible-before\", config = {{ archive_after = \"1d\" }} }}\n{columns}"
    )
}

pub fn typed(bench: &mut Bench) -> Result<()> {
    let rows = flights();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (mut plain, mut typed) = (Vec::new(), Vec::new());
    let (mut plain_phases, mut typed_phases): (Vec<Phases>, Vec<Phases>) = (Vec::new(), Vec::new());
    let mut last_typed: Option<Dirs> = None;
    for _ in 0..bench.options.repeats {
        for (columns, samples, phases) in
            [("", &mut plain, &mut plain_phases), (COLUMNS, &mut typed, &mut typed_phases)]
        {
            let dirs = Dirs::new(&policy(columns))?;
            let engine = dirs.open(START_MICROS + (DAYS as Micros + 2) * MICROS_PER_DAY)?;
            for batch in rows.chunks(BUILD_BATCH) {
                engine.append(TABLE, batch.to_vec())?;
            }
            let start = Instant::now();
            let report = runtime.block_on(passes_until_idle(&engine))?;
            let seconds = start.elapsed().as_secs_f64();
            ensure!(report.archived as usize == DAYS, "archived {} of {DAYS} buckets", report.archived);
            samples.push(rows.len() as f64 / seconds);
            phases.push(report.seconds.named());
            drop(engine);
            if !columns.is_empty() {
                last_typed = Some(dirs);
            }
        }
    }
    let name = |what: &str| format!("archive pass, {} rows in {DAYS} day buckets (Parquet), {what}", rows.len());
    let plain = Figure::new(bench.scenario, name("no declared columns"), Unit::RecordsPerSecond, plain, 1);
    let typed = Figure::new(bench.scenario, name("five declared columns"), Unit::RecordsPerSecond, typed, 1)
        .against(&plain)
        .with_target(0.9, "the pass with a declared schema archives at >= 90% of the rate without one");
    let plain_note = push_phases(bench, "phases of the passes without declared columns", &plain_phases, &[]);
    let typed_note = push_phases(bench, "phases of the passes with five declared columns", &typed_phases, &[]);
    bench.push(plain);
    bench.push(typed.with_note(format!("{typed_note}; {plain_note}")));

    let Ok(python) = std::env::var("FROSTLINE_PYTHON") else {
        bench.skip(&["DuckDB"], "FROSTLINE_PYTHON is not set (scripts/bench installs it)".into());
        return Ok(());
    };
    let dirs = last_typed.context("a typed table was archived")?;
    let table_root = dirs.data().join("archive").join("delta").join(TABLE);
    let output = Command::new(&python)
        .args(["-c", DUCKDB_SCRIPT])
        .arg(&table_root)
        .args([bench.options.repeats.to_string(), rows.len().to_string()])
        .output()
        .with_context(|| format!("cannot run {python}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(output.status.success(), "DuckDB failed: {}{stdout}", String::from_utf8_lossy(&output.stderr));
    let samples = |name: &str| -> Result<Vec<f64>> {
        stdout
            .lines()
            .filter_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .map(|s| s.trim().parse::<f64>().map(|s| s * 1e3).with_context(|| format!("DuckDB printed `{s}`")))
            .collect()
    };
    let (from_body, from_column) = (samples("body")?, samples("typed")?);
    ensure!(from_body.len() == bench.options.repeats && from_column.len() == from_body.len(), "{stdout}");
    let body = Figure::new(
        bench.scenario,
        format!(
            "DuckDB: average dep_delay per carrier through json_extract on body, {} rows in {DAYS} files",
            rows.len()
        ),
        Unit::Millis,
        from_body,
        1,
    );
    let column = Figure::new(
        bench.scenario,
        format!("DuckDB: the same from the typed column dep_delay, {} rows in {DAYS} files", rows.len()),
        Unit::Millis,
        from_column,
        1,
    )
    .against(&body)
    .with_target(5.0, "an aggregate over a typed column runs >= 5x faster than through json_extract on body");
    bench.push(body);
    bench.push(column);
    Ok(())
}

/// Times both queries over the table's data files (listed, as a user with the Delta log's
/// file list writes it), one sample of each per round, after checking they agree.
const DUCKDB_SCRIPT: &str = r#"
import glob, sys, time
import duckdb
root, runs, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
files = sorted(glob.glob(f"{root}/installation=*/**/*.parquet", recursive=True))
con = duckdb.connect()
source = f"read_parquet({files!r})"
queries = {
    "body": f"""SELECT json_extract_string(body, '$.carrier') AS carrier,
                       avg(CAST(json_extract(body, '$.dep_delay') AS BIGINT)), count(*)
                FROM {source} GROUP BY 1 ORDER BY 1""",
    "typed": f"SELECT carrier, avg(dep_delay), count(*) FROM {source} GROUP BY 1 ORDER BY 1",
}
answers = {name: con.execute(q).fetchall() for name, q in queries.items()}
assert sum(r[2] for r in answers["typed"]) == rows, "DuckDB lost rows"
assert [(c, round(a, 6), n) for c, a, n in answers["body"]] == [(c, round(a, 6), n) for c, a, n in answers["typed"]], answers
for _ in range(runs):
    for name, q in queries.items():
        start = time.perf_counter()
        con.execute(q).fetchall()
        print(f"{name} {time.perf_counter() - start}")
"#;

/// The rows: one partition, `DAYS` days of `ROWS_PER_DAY` departures.
fn flights() -> Vec<Record> {
    let mut state = TIMES_SEED ^ 11;
    let step = MICROS_PER_DAY / ROWS_PER_DAY as Micros;
    let mut out = Vec::with_capacity(DAYS * ROWS_PER_DAY);
    for day in 0..DAYS {
        for n in 0..ROWS_PER_DAY {
            let random = splitmix64(&mut state);
            let carrier = CARRIERS[random as usize % CARRIERS.len()];
            let dep_delay = ((random >> 8) % 120) as i64 - 15;
            let arr_delay = dep_delay + ((random >> 16) % 30) as i64 - 15;
            let event_time = START_MICROS + day as Micros * MICROS_PER_DAY + n as Micros * step;
            out.push(Record {
                partition_key: b"JFK".to_vec(),
                event_time,
                sort_key: format!("{carrier}{:04}-{n:04}", (random >> 24) % 2_000).into_bytes(),
                tenant: None,
                kind: None,
                body: format!(
                    r#"{{"carrier":"{carrier}","flight":{},"dest":"{}","dep_delay":{dep_delay},"arr_delay":{arr_delay},"distance":{}.5,"sched_dep":"{}"}}"#,
                    (random >> 24) % 2_000,
                    ["ATL", "ORD", "LAX", "SFO", "MIA", "BOS"][(random >> 32) as usize % 6],
                    200 + (random >> 40) % 2_500,
                    frostline::model::time::format_rfc3339(event_time),
                ),
            });
        }
    }
    out
}

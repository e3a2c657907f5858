//! Typed columns (`[[table.column]]`): a table archived with a declared schema is read by
//! DuckDB, polars and delta-rs as typed columns that give the same aggregate as `body`, and
//! they read only the files a carrier or time predicate selects; a value that does not fit its
//! column refuses its batch (or is stored as null and counted); a column added on a running
//! engine reads as null in older files, and one removed or retyped is refused.

use std::process::Command;

use frostline::model::Record;
use frostline::ops::reload::reload;

use crate::support::*;

const CARRIERS: [&str; 3] = ["AA", "UA", "B6"];
/// Origins as partition keys, one with the characters users' keys have.
const ORIGINS: [&str; 3] = ["EWR", "JFK", "LGA t/%20=ü"];
const DAYS: i64 = 6;

const COLUMNS: &str = r#"
[[table.column]]
name = "carrier"
type = "string"

[[table.column]]
name = "dep_delay"
type = "int64"

[[table.column]]
name = "distance"
type = "float64"

[[table.column]]
name = "cancelled"
type = "bool"

[[table.column]]
name = "sched_dep"
type = "timestamp"
"#;

fn policy(target_dir: &std::path::Path, columns: &str) -> String {
    format!(
        r#"[[target]]
name = "cold"
url = "file://{}"

[[table]]
id = "flights"
format = "parquet"
target = "cold"
strategy = {{ plugin = "builtin:calendar-day-utc" }}
retention = {{ plugin = "builtin:eligible-before", config = {{ archive_after = "1d", expire_after = "3650d" }} }}
{columns}"#,
        target_dir.display()
    )
}

/// A departure, shaped as nycflights13's: `dep_delay` null for some (cancelled flights).
struct Flight {
    origin: &'static str,
    carrier: Option<&'static str>,
    sched_dep: i64,
    dep_delay: Option<i64>,
    distance: f64,
    flight: usize,
}

impl Flight {
    fn record(&self) -> Record {
        let mut body = serde_json::json!({
            "flight": self.flight,
            "distance": self.distance,
            "cancelled": self.dep_delay.is_none(),
            "sched_dep": frostline::model::time::format_rfc3339(self.sched_dep),
            "dep_delay": self.dep_delay,
        });
        if let Some(carrier) = self.carrier {
            body["carrier"] = carrier.into();
        }
        Record {
            partition_key: self.origin.as_bytes().to_vec(),
            event_time: self.sched_dep,
            sort_key: format!("{:06}", self.flight).into_bytes(),
            tenant: None,
            kind: Some("departure".into()),
            body: body.to_string(),
        }
    }
}

/// Six days of departures from three origins; one carrier (`YX`, after every other in byte order) flies on one day from one
/// origin only, and a few records name no carrier.
fn flights(first_day: i64, days: i64) -> Vec<Flight> {
    let day = 86_400_000_000i64;
    let mut out = Vec::new();
    for d in first_day..first_day + days {
        for (o, origin) in ORIGINS.iter().enumerate() {
            for i in 0..12usize {
                let n = out.len() + (d as usize) * 1_000;
                let carrier = match (d, o, i) {
                    (4, 1, 0..=2) => Some("YX"),
                    (_, _, 11) if n.is_multiple_of(5) => None,
                    _ => Some(CARRIERS[i % 3]),
                };
                out.push(Flight {
                    origin,
                    carrier,
                    sched_dep: t("2024-01-01T05:00:00Z") + d * day + i as i64 * 3_600_000_000,
                    dep_delay: (!n.is_multiple_of(7)).then_some((n as i64 * 37) % 180 - 20),
                    distance: 200.0 + (n % 13) as f64 * 101.5,
                    flight: n,
                });
            }
        }
    }
    out
}

/// avg and count of `dep_delay` per carrier, as the readers print them.
fn expected_aggregate(flights: &[Flight]) -> serde_json::Value {
    let mut groups: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
    for f in flights {
        let delays = groups.entry(f.carrier.unwrap_or("null").to_string()).or_default();
        delays.extend(f.dep_delay);
    }
    let out: serde_json::Map<String, serde_json::Value> = groups
        .into_iter()
        .map(|(carrier, delays)| {
            let avg = delays.iter().sum::<i64>() as f64 / delays.len() as f64;
            (carrier, serde_json::json!([avg, delays.len()]))
        })
        .collect();
    serde_json::Value::Object(out)
}

/// The same carriers with the same counts and averages (to 1e-9: readers sum in their order).
fn assert_same_aggregate(read: &serde_json::Value, expected: &serde_json::Value, reader: &str) {
    let (read, expected) = (read.as_object().unwrap(), expected.as_object().unwrap());
    assert_eq!(read.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>(), "{reader}");
    for (carrier, want) in expected {
        let got = &read[carrier];
        assert_eq!(got[1], want[1], "{reader}: count of {carrier}");
        let (got_avg, want_avg) = (got[0].as_f64().unwrap(), want[0].as_f64().unwrap());
        assert!((got_avg - want_avg).abs() < 1e-9, "{reader}: average of {carrier}: {got_avg} against {want_avg}");
    }
}

fn read(args: &[&str]) -> serde_json::Value {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/integration/readers/typed_columns.py");
    let out = Command::new(python()).arg(script).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

/// Archives every day of `records` (the clock moved past them).
fn archive_all(te: &TestEngine, records: Vec<Record>) {
    te.engine.append("flights", records).unwrap();
    te.clock.set(t("2024-02-01T00:00:00Z"));
    let mut archived = 0;
    for _ in 0..3 {
        let report = te.pass();
        assert!(report.errors.is_empty(), "{report:?}");
        archived += report.archived;
    }
    assert!(archived > 0);
}

/// The Delta log's commits, each as its actions.
fn commits(table_dir: &std::path::Path) -> Vec<Vec<serde_json::Value>> {
    let mut names: Vec<_> = std::fs::read_dir(table_dir.join("_delta_log"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|n| {
            let text = std::fs::read_to_string(table_dir.join("_delta_log").join(n)).unwrap();
            text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
        })
        .collect()
}

#[cfg(feature = "delta")]
#[test]
fn a_declared_schema_is_read_as_typed_columns_that_aggregate_as_body_does_and_prune_files() {
    let dir = tempfile::tempdir().unwrap();
    let te = TestEngine::new(&policy(dir.path(), COLUMNS), "2024-01-01T00:00:00Z");
    let flights = flights(0, DAYS);
    archive_all(&te, flights.iter().map(Flight::record).collect());
    let table_dir = dir.path().join("delta/flights");

    // The log's schema carries the columns, typed; each file's statistics bound them.
    let log = commits(&table_dir);
    let schema: serde_json::Value =
        serde_json::from_str(log[0].iter().find_map(|a| a.get("metaData")).unwrap()["schemaString"].as_str().unwrap())
            .unwrap();
    let types: Vec<(String, String)> = schema["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["name"].as_str().unwrap().to_string(), f["type"].as_str().unwrap().to_string()))
        .collect();
    for (name, kind) in [
        ("carrier", "string"),
        ("dep_delay", "long"),
        ("distance", "double"),
        ("cancelled", "boolean"),
        ("sched_dep", "timestamp"),
    ] {
        assert!(types.contains(&(name.to_string(), kind.to_string())), "{name}: {types:?}");
    }
    let adds: Vec<serde_json::Value> = log
        .iter()
        .flatten()
        .filter_map(|a| a.get("add"))
        .map(|a| serde_json::from_str(a["stats"].as_str().unwrap()).unwrap())
        .collect();
    assert_eq!(adds.len(), DAYS as usize * ORIGINS.len());
    for stats in &adds {
        for column in ["carrier", "dep_delay", "distance", "cancelled", "sched_dep"] {
            assert!(stats["nullCount"].get(column).is_some(), "{column}: {stats}");
        }
        assert!(stats["minValues"]["dep_delay"].as_i64().unwrap() <= stats["maxValues"]["dep_delay"].as_i64().unwrap());
    }

    // The same aggregate from the typed columns as from the JSON in `body`, in every reader,
    // and as computed here from the records appended.
    let expected = expected_aggregate(&flights);
    let aggregates = read(&["aggregate", table_dir.to_str().unwrap()]);
    for reader in ["duckdb_typed", "duckdb_body", "polars_typed", "polars_body", "deltalake_typed", "deltalake_body"] {
        assert_same_aggregate(&aggregates[reader], &expected, reader);
    }

    // A carrier that flew on one day from one origin is in one file; a day is in one file per
    // origin: the readers skip the others by the log's statistics.
    let pruned = read(&["prune", table_dir.to_str().unwrap(), "YX", "2024-01-03T00:00:00Z", "2024-01-04T00:00:00Z"]);
    assert_eq!(pruned["all"], DAYS * ORIGINS.len() as i64, "{pruned}");
    for reader in ["deltalake_carrier", "polars_carrier"] {
        assert_eq!(pruned[reader], 1, "{reader}: {pruned}");
    }
    for reader in ["deltalake_day", "polars_day"] {
        assert_eq!(pruned[reader], ORIGINS.len() as i64, "{reader}: {pruned}");
    }
    // DuckDB over the listed files skips row groups by the Parquet statistics: with the data
    // pages of every other file overwritten, it still finds the three flights.
    let duckdb = read(&["duckdb-prune", table_dir.to_str().unwrap(), "YX"]);
    assert_eq!(duckdb["spoiled"], DAYS * ORIGINS.len() as i64 - 1, "{duckdb}");
    assert_eq!((duckdb["found"].as_i64(), duckdb["unfiltered"].as_str()), (Some(3), Some("failed")), "{duckdb}");

    // The round trip stays exact: frostline reads back every record as appended.
    let appended: Vec<Record> = sorted(flights.iter().map(Flight::record).collect());
    assert_eq!(sorted(te.query_all("flights")), appended);
}

#[test]
fn a_value_that_does_not_fit_its_column_refuses_the_batch_or_is_stored_as_null_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let te = TestEngine::new(&policy(dir.path(), COLUMNS), "2024-01-01T00:00:00Z");
    let mut batch: Vec<Record> = flights(0, 1).iter().take(3).map(Flight::record).collect();
    let mut late = serde_json::from_str::<serde_json::Value>(&batch[1].body).unwrap();
    late["dep_delay"] = "late".into();
    batch[1].body = late.to_string();
    let error = te.engine.append("flights", batch.clone()).unwrap_err().to_string();
    assert!(error.contains("record 2: column `dep_delay` (int64, nullable, from `/dep_delay`)"), "{error}");
    assert!(error.contains("expects an integer within 64 bits, found a string \"late\""), "{error}");
    assert!(te.query_all("flights").is_empty(), "a refused batch writes nothing");
    // `frostline ingest` on the data directory checks the columns in its first pass: a file
    // with one such line writes nothing, and says which line.
    let lines: Vec<String> = flights(1, 1)
        .iter()
        .map(Flight::record)
        .chain([batch[1].clone()])
        .map(|r| frostline::ops::records::record_json(&r))
        .collect();
    let file = dir.path().join("flights.jsonl");
    std::fs::write(&file, lines.join("\n")).unwrap();
    let (data, policies) = (te.data_dir(), te.policies_dir());
    let te = te
        .stopped_while(|| {
            let out = run_frostline(&[
                "ingest",
                "--data",
                data.to_str().unwrap(),
                "--policies",
                policies.to_str().unwrap(),
                "--table",
                "flights",
                file.to_str().unwrap(),
            ]);
            let stderr = text(&out.stderr);
            assert!(!out.status.success(), "{stderr}");
            let line = lines.len();
            assert!(stderr.contains(&format!("line {line}: column `dep_delay`")), "{stderr}");
            assert!(stderr.contains("nothing was written"), "{stderr}");
        })
        .unwrap();
    assert!(te.query_all("flights").is_empty(), "an ingest refused in its first pass writes nothing");

    // Under on_mismatch = "null" the batch is taken, the value counted as a miss and archived as
    // null, while the body keeps it.
    let lenient = COLUMNS.replace("type = \"int64\"", "type = \"int64\"\non_mismatch = \"null\"");
    std::fs::write(te.policies_dir().join("tables.toml"), policy(dir.path(), &lenient)).unwrap();
    let outcome = reload(&te.engine, "test");
    assert!(outcome.accepted, "{outcome:?}");
    let appended = te.engine.append("flights", batch.clone()).unwrap();
    assert_eq!((appended.appended, appended.column_misses), (3, 1));
    te.clock.set(t("2024-02-01T00:00:00Z"));
    assert_eq!(te.pass().archived, 1, "the three flights leave one origin on one day");
    let store = te.engine.store();
    let snapshot = store.snapshot().unwrap();
    let mut nulls = 0;
    for meta in store.buckets("flights", None).unwrap() {
        for manifest in snapshot.manifests_of(&meta.id).unwrap() {
            for segment in &manifest.segments {
                nulls += segment.columns.iter().find(|c| c.name == "dep_delay").unwrap().nulls;
            }
        }
    }
    let delays_absent = batch.iter().filter(|r| r.body.contains("\"dep_delay\":null")).count() as u64;
    assert_eq!(nulls, 1 + delays_absent, "the miss and the flights without a delay");
    assert_eq!(sorted(te.query_all("flights")), sorted(batch), "the body keeps the value");
}

#[cfg(feature = "delta")]
#[test]
fn a_column_added_on_a_running_engine_reads_as_null_in_older_files_and_one_changed_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let carrier_only = "\n[[table.column]]\nname = \"carrier\"\ntype = \"string\"\n";
    let te = TestEngine::new(&policy(dir.path(), carrier_only), "2024-01-01T00:00:00Z");
    let older = flights(0, 2);
    archive_all(&te, older.iter().map(Flight::record).collect());
    let policy_file = te.policies_dir().join("tables.toml");

    // Added, nullable: a reload on the running engine takes it.
    let with_delay = format!("{carrier_only}\n[[table.column]]\nname = \"dep_delay\"\ntype = \"int64\"\n");
    std::fs::write(&policy_file, policy(dir.path(), &with_delay)).unwrap();
    let outcome = reload(&te.engine, "test");
    assert!(outcome.accepted, "{outcome:?}");
    let newer = flights(2, 2);
    archive_all(&te, newer.iter().map(Flight::record).collect());
    let table_dir = dir.path().join("delta/flights");
    let log = commits(&table_dir);
    let evolved: Vec<&Vec<serde_json::Value>> =
        log.iter().filter(|c| c[0]["commitInfo"]["operation"] == "ADD COLUMNS").collect();
    assert_eq!(evolved.len(), 1, "one metadata commit adds the column");
    let values = read(&["column", table_dir.to_str().unwrap(), "dep_delay"]);
    assert!(values["type"].as_str().unwrap().contains("long"), "{values}");
    let mut expected: Vec<(i64, String, Option<i64>)> = older
        .iter()
        .map(|f| (f.sched_dep, format!("{:06}", f.flight), None))
        .chain(newer.iter().map(|f| (f.sched_dep, format!("{:06}", f.flight), f.dep_delay)))
        .collect();
    expected.sort();
    let expected: Vec<serde_json::Value> = expected.into_iter().map(|(.., d)| serde_json::json!(d)).collect();
    for reader in ["polars", "deltalake"] {
        assert_eq!(values[reader].as_array().unwrap(), &expected, "{reader}");
    }

    // Removed, retyped or re-sourced: refused on reload and at start, naming the fix.
    for (changed, why) in [
        (carrier_only.to_string(), "no longer declared"),
        (with_delay.replace("type = \"int64\"", "type = \"float64\""), "changes from"),
        (
            with_delay.replace(
                "name = \"dep_delay\"\ntype = \"int64\"",
                "name = \"dep_delay\"\ntype = \"int64\"\nfrom = \"/delay\"",
            ),
            "changes from",
        ),
    ] {
        std::fs::write(&policy_file, policy(dir.path(), &changed)).unwrap();
        let outcome = reload(&te.engine, "test");
        assert!(!outcome.accepted);
        let error = outcome.error.unwrap();
        assert!(error.contains(why) && error.contains("declare a new table id"), "{error}");
    }
    let error = match te.restart() {
        Ok(_) => panic!("an engine started with a retyped column"),
        Err(e) => e.to_string(),
    };
    assert!(error.contains("changes from"), "{error}");
}

/// Every record of `flights` a query with `conditions` returns, page by page.
fn query_where(te: &TestEngine, conditions: &[&str]) -> frostline::error::Result<Vec<Record>> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let request = frostline::query::QueryRequest {
            table: "flights".into(),
            limit: 50,
            cursor,
            conditions: conditions.iter().map(|c| c.to_string()).collect(),
            ..Default::default()
        };
        let page = runtime().block_on(frostline::query::query(&te.engine.context(), request))?;
        out.extend(page.records);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(out),
        }
    }
}

#[test]
fn a_query_filters_on_typed_columns_hot_and_archived_and_reads_only_the_segments_that_may_match() {
    let dir = tempfile::tempdir().unwrap();
    let te = TestEngine::new(&policy(dir.path(), COLUMNS), "2024-01-01T00:00:00Z");
    let archived = flights(0, DAYS);
    archive_all(&te, archived.iter().map(Flight::record).collect());
    // A day more, hot.
    let hot = flights(DAYS, 1);
    te.engine.append("flights", hot.iter().map(Flight::record).collect()).unwrap();
    let all: Vec<&Flight> = archived.iter().chain(&hot).collect();
    let expect = |keep: &dyn Fn(&Flight) -> bool| sorted(all.iter().filter(|f| keep(f)).map(|f| f.record()).collect());

    let delayed = expect(&|f| f.carrier == Some("UA") && f.dep_delay.is_some_and(|d| d >= 100));
    assert!(!delayed.is_empty());
    assert_eq!(query_where(&te, &["carrier=UA", "dep_delay>=100"]).unwrap(), delayed);
    let morning = t("2024-01-03T08:00:00Z");
    assert_eq!(
        query_where(&te, &["sched_dep<2024-01-03T08:00:00Z", "cancelled=true"]).unwrap(),
        expect(&|f| f.sched_dep < morning && f.dep_delay.is_none())
    );
    assert_eq!(query_where(&te, &["distance>1000.5"]).unwrap(), expect(&|f| f.distance > 1000.5));
    let error = query_where(&te, &["gate=3"]).unwrap_err().to_string();
    assert!(error.contains("declares no column `gate`") && error.contains("carrier, dep_delay"), "{error}");

    // The one carrier that flew on one day from one origin is in one archived segment: with
    // every other segment gone from the target, the query still answers (it reads none of
    // them), where a query without the condition fails.
    let yx = expect(&|f| f.carrier == Some("YX"));
    assert_eq!(yx.len(), 3);
    let store = te.engine.store();
    let snapshot = store.snapshot().unwrap();
    let backend = te.backend("flights");
    let mut removed = 0;
    for meta in store.buckets("flights", None).unwrap() {
        let Some(manifest) = snapshot.latest_manifest(&meta.id).unwrap() else { continue };
        for segment in &manifest.segments {
            let holds_yx = segment.columns.iter().any(|c| c.name == "carrier" && c.max == Some("YX".into()));
            if !holds_yx {
                runtime().block_on(backend.delete(&segment.key)).unwrap();
                removed += 1;
            }
        }
    }
    assert_eq!(removed, DAYS * ORIGINS.len() as i64 - 1);
    assert_eq!(query_where(&te, &["carrier=YX"]).unwrap(), yx);
    assert!(query_where(&te, &[]).is_err(), "the deleted segments are read without the condition");

    // The CLI takes the same conditions.
    let data = te.data_dir();
    let policies = te.policies_dir();
    te.stopped_while(|| {
        let out = run_frostline(&[
            "query",
            "--data",
            data.to_str().unwrap(),
            "--policies",
            policies.to_str().unwrap(),
            "--table",
            "flights",
            "--where",
            "carrier=YX",
            "--where",
            "dep_delay>-1000",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let lines: Vec<serde_json::Value> =
            text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let expected: Vec<serde_json::Value> = yx
            .iter()
            .filter(|r| !r.body.contains("\"dep_delay\":null"))
            .map(|r| serde_json::from_str(&frostline::ops::records::record_json(r)).unwrap())
            .collect();
        assert_eq!(lines, expected);
    })
    .unwrap();
}

/// Two installations archive into one Delta table and declare a column under two types: the
/// second one's sync refuses to add its files, saying why, rather than give readers files that
/// contradict the table's schema; its archives are published all the same.
#[cfg(feature = "delta")]
#[test]
fn an_installation_declaring_a_column_under_another_type_adds_nothing_to_the_shared_delta_log() {
    let dir = tempfile::tempdir().unwrap();
    let carrier = |kind: &str| format!("\n[[table.column]]\nname = \"carrier\"\ntype = \"{kind}\"\n");
    let first = TestEngine::new(&policy(dir.path(), &carrier("string")), "2024-01-01T00:00:00Z");
    archive_all(&first, flights(0, 1).iter().map(Flight::record).collect());
    let table_dir = dir.path().join("delta/flights");
    let live_files = || {
        let mut live = std::collections::BTreeSet::new();
        for action in commits(&table_dir).into_iter().flatten() {
            if let Some(add) = action.get("add") {
                live.insert(add["path"].as_str().unwrap().to_string());
            } else if let Some(remove) = action.get("remove") {
                live.remove(remove["path"].as_str().unwrap());
            }
        }
        live
    };
    let files_before = live_files();
    assert_eq!(files_before.len(), ORIGINS.len());

    let second = TestEngine::new(&policy(dir.path(), &carrier("int64")), "2024-01-01T00:00:00Z");
    let records: Vec<Record> = flights(1, 1).iter().map(Flight::record).collect();
    // Its own appends are checked against its own declaration, which a string carrier does not
    // fit: these bodies carry none.
    let records: Vec<Record> = records
        .into_iter()
        .map(|mut r| {
            let mut body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
            body.as_object_mut().unwrap().remove("carrier");
            r.body = body.to_string();
            r
        })
        .collect();
    second.engine.append("flights", records).unwrap();
    second.clock.set(t("2024-02-01T00:00:00Z"));
    let report = second.pass();
    assert_eq!(report.archived, ORIGINS.len() as u64, "{report:?}");
    let errors = format!("{:?}", report.errors);
    assert!(errors.contains("holds column `carrier` as `string`") && errors.contains("declares it int64"), "{errors}");
    assert_eq!(live_files(), files_before, "nothing of the second installation in the log");
    assert_eq!(second.query_all("flights").len(), flights(1, 1).len(), "its archives read back through frostline");
}

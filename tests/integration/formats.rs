//! Archives other engines can read: every format round-trips through the protocol, and the
//! Parquet archive read by DuckDB and by pyarrow gives exactly the records `frostline query`
//! returns for the same range.

use std::path::Path;
use std::process::Command;

use crate::support::*;

fn policy(format: &str) -> String {
    format!(
        "[[table]]\nid = \"events\"\nformat = \"{format}\"\nstrategy = {{ plugin = \"builtin:calendar-month-utc\" }}\n\
         retention = {{ plugin = \"builtin:eligible-before\", config = {{ cutoff = \"2025-01-01T00:00:00Z\" }} }}\n"
    )
}

#[test]
fn every_format_archives_and_reads_back_identically() {
    for format in ["jsonl", "parquet", "msgpack"] {
        let e = TestEngine::new(&policy(format), "2026-01-01T00:00:00Z");
        let input = records("2024-10-01T00:00:00Z", 60, 7);
        e.engine.append("events", input.clone()).unwrap();
        let report = e.pass();
        assert_eq!(report.archived, 6, "{format}: two months of three partitions: {report:?}");
        assert_eq!(e.query_all("events"), sorted(input), "{format}");
        let verdicts =
            runtime().block_on(frostline::archive::verify::verify(&e.engine.context(), None, None, |_| {})).unwrap();
        assert!(verdicts.iter().all(|v| v.ok), "{format}: {verdicts:?}");
        let objects: Vec<_> = frostline::storage::keys::table_folders("events")
            .iter()
            .flat_map(|folder| runtime().block_on(e.backend("events").list(folder)).unwrap())
            .collect();
        assert!(objects.iter().any(|o| o.key.ends_with(&format!(".{format}"))), "{format}: segment extension");
        let catalogs = catalogs_of(&e.backend("events"), "events", e.engine.installation_id());
        if format == "parquet" {
            // Its archive is a Delta table, whose log lists its files instead.
            assert!(catalogs.is_empty(), "a Parquet table has no catalog: {catalogs:?}");
            let log = runtime().block_on(e.backend("events").list("delta/events/_delta_log/")).unwrap();
            assert!(log.iter().any(|o| o.key.ends_with("00000000000000000001.json")), "{log:?}");
            continue;
        }
        let listed: usize = catalogs.values().map(|(_, manifests)| manifests.len()).sum();
        assert_eq!(listed as u64, report.archived, "{format}: catalogs {catalogs:?}");
        let first = catalogs.keys().next().unwrap();
        let key =
            format!("{}{first}", frostline::archive::catalog::catalogs_folder("events", e.engine.installation_id()));
        let catalog: serde_json::Value =
            serde_json::from_slice(&runtime().block_on(e.backend("events").get(&key)).unwrap().unwrap()).unwrap();
        assert_eq!(catalog["manifests"][0]["format"], format);
    }
}

#[test]
fn the_read_path_skips_segments_outside_the_range() {
    let e = TestEngine::new(&policy("parquet"), "2026-01-01T00:00:00Z");
    // One partition, one month: 25,000 rows make three segments in time order.
    let start = t("2024-10-01T00:00:00Z");
    let input: Vec<frostline::model::Record> = (0..25_000i64)
        .map(|i| frostline::model::Record {
            partition_key: b"p".to_vec(),
            event_time: start + i * 100_000_000,
            sort_key: format!("{i:06}").into_bytes(),
            tenant: None,
            kind: None,
            body: format!("{{\"i\":{i}}}"),
        })
        .collect();
    e.engine.append("events", input).unwrap();
    assert_eq!(e.pass().archived, 1);
    let faulty = frostline::storage::faults::FaultyBackend::new(e.backend("events"));
    e.with_backend("events", faulty.clone());
    let page = runtime()
        .block_on(frostline::query::query(
            &e.engine.context(),
            frostline::query::QueryRequest {
                table: "events".into(),
                from: Some(start),
                to: Some(start + 3_600_000_000),
                ..Default::default()
            },
        ))
        .unwrap();
    assert_eq!(page.records.len(), 36);
    let reads = faulty.reads();
    let segments: Vec<&String> = reads.iter().filter(|k| k.contains("/seg-")).collect();
    assert_eq!(segments.len(), 1, "only the first segment is read: {reads:?}");
    assert!(segments[0].contains(&format!("seg-{}-00000-", e.engine.context().writer().unwrap())), "{segments:?}");
}

#[test]
fn duckdb_and_pyarrow_read_exactly_what_frostline_returns() {
    let root = tempfile::tempdir().unwrap();
    let policies = root.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("tables.toml"), policy("parquet")).unwrap();
    let data = root.path().join("data");
    let (p, d) = (policies.to_str().unwrap(), data.to_str().unwrap());
    let start = t("2023-01-01T00:00:00Z");
    let step = 2 * 365 * 86_400_000_000i64 / 2_000;
    let lines: String = (0..2_000i64)
        .map(|i| {
            let tenant = if i % 5 == 0 { String::new() } else { format!(",\"tenant\":\"t{}\"", i % 3) };
            format!(
                "{{\"partition_key\":\"site-{}\",\"event_time\":{},\"sort_key\":\"{i:05}\"{tenant},\"kind\":\"k\",\"body\":{{\"i\":{i},\"s\":\"é ✓ \\\"q\\\"\"}}}}\n",
                i % 3,
                start + i * step
            )
        })
        .collect();
    let input = root.path().join("in.jsonl");
    std::fs::write(&input, lines).unwrap();
    let run =
        |args: &[&str]| Command::new(frostline_bin()).args(args).args(["--data", d, "--policies", p]).output().unwrap();
    assert!(run(&["ingest", "--table", "events", input.to_str().unwrap()]).status.success());
    let archived = run(&["archive", "--once"]);
    assert!(archived.status.success(), "{}", text(&archived.stderr));
    let (from, to) = ("2023-03-15T00:00:00Z", "2024-08-01T00:00:00Z");
    let query = run(&["query", "--table", "events", "--from", from, "--to", to, "--limit", "100000"]);
    assert!(query.status.success(), "{}", text(&query.stderr));
    let expected: Vec<serde_json::Value> =
        text(&query.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(expected.len() > 1_000, "the range holds most records: {}", expected.len());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/integration/readers/read_parquet.py");
    for reader in ["duckdb", "pyarrow"] {
        let out = Command::new(python())
            .arg(&script)
            .args([reader, &data.join("archive").display().to_string(), "events"])
            .args([t(from).to_string(), t(to).to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{reader}: {}", text(&out.stderr));
        let got: Vec<serde_json::Value> = text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(got.len(), expected.len(), "{reader}: record count");
        assert_eq!(got, expected, "{reader}: records differ from `frostline query`");
    }
}

//! End to end through the real binary: ingest, archive, query and status on a data directory,
//! with every archived object checked against the hash in its name and in its manifest.

use std::path::Path;
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use crate::support::*;

const POLICY: &str = r#"
[[table]]
id = "events"
writable_buckets = 48
strategy = { plugin = "builtin:calendar-month-utc" }
retention = { plugin = "builtin:eligible-before" }
"#;

struct Dirs {
    _root: tempfile::TempDir,
    data: String,
    policies: String,
}

fn dirs(policy: &str) -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let policies = root.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("tables.toml"), policy).unwrap();
    Dirs { data: root.path().join("data").display().to_string(), policies: policies.display().to_string(), _root: root }
}

fn frostline(d: &Dirs, args: &[&str], stdin: Option<&str>) -> std::process::Output {
    frostline_with_fail_points(d, args, stdin, None)
}

/// `frostline` with `FROSTLINE_FAILPOINTS` set to `fail_points`, when given.
fn frostline_with_fail_points(
    d: &Dirs,
    args: &[&str],
    stdin: Option<&str>,
    fail_points: Option<&str>,
) -> std::process::Output {
    let mut command = Command::new(frostline_bin());
    match fail_points {
        Some(spec) => command.env("FROSTLINE_FAILPOINTS", spec),
        None => command.env_remove("FROSTLINE_FAILPOINTS"),
    };
    command
        .args(args)
        .args(["--data", &d.data, "--policies", &d.policies])
        .env("ARCHIVER_ELIGIBLE_BEFORE", "2025-01-01T00:00:00Z")
        .env_remove("ARCHIVER_KEEP_HOT_BUCKETS")
        .env_remove("ARCHIVER_ELIGIBLE_THROUGH_YEAR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    {
        use std::io::Write;
        let mut pipe = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            pipe.write_all(text.as_bytes()).unwrap();
        }
    }
    child.wait_with_output().unwrap()
}

/// About three years of records over four partitions and two tenants, as JSON lines.
fn three_years() -> (String, Vec<serde_json::Value>) {
    let mut lines = Vec::new();
    let start = t("2023-01-01T00:00:00Z");
    let step = 3 * 365 * 86_400_000_000i64 / 3_000;
    for i in 0..3_000i64 {
        let time = start + i * step + (i % 7) * 1_000;
        let value = serde_json::json!({
            "partition_key": format!("site-{}", i % 4),
            "event_time": if i % 2 == 0 { serde_json::json!(time) } else { serde_json::json!(frostline::model::time::format_rfc3339(time)) },
            "sort_key": format!("{i:05}"),
            "tenant": if i % 2 == 0 { "acme" } else { "globex" },
            "kind": "reading",
            "body": {"i": i, "text": "ünïcode ✓", "nested": {"a": [1, 2, {"b": null}]}},
        });
        lines.push(value);
    }
    let text = lines.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("\n");
    (text, lines)
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn files_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Directories on `POLICY` with `three_years()` ingested through the binary; the input lines.
fn three_years_ingested() -> (Dirs, Vec<serde_json::Value>) {
    let d = dirs(POLICY);
    let (input, lines) = three_years();
    let ingest = frostline(&d, &["ingest", "--table", "events", "-"], Some(&input));
    assert!(ingest.status.success(), "{}", text_of(&ingest));
    assert!(text(&ingest.stdout).contains("\"appended\":3000"), "{}", text(&ingest.stdout));
    (d, lines)
}

#[test]
fn ingest_archive_query_round_trip_through_the_binary() {
    let (d, lines) = three_years_ingested();

    let archive = frostline(&d, &["archive", "--once"], None);
    assert!(archive.status.success(), "{}", text_of(&archive));
    let report: serde_json::Value = serde_json::from_slice(&archive.stdout).unwrap();
    // 2023 and 2024 months end by the 2025-01-01 cutoff: 24 months x 4 partitions.
    assert_eq!(report["archived"], 96, "{report}");

    let status = frostline(&d, &["status", "--json"], None);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let states = &status["tables"][0]["states"];
    assert_eq!(states["archived"]["buckets"], 96, "{status}");
    let hot_rows = states["hot"]["rows"].as_u64().unwrap();
    let archived_rows = states["archived"]["rows"].as_u64().unwrap();
    assert_eq!(hot_rows + archived_rows, 3000);
    assert!(archived_rows > 1_900 && hot_rows > 900, "{status}");

    // The hot rows of archived buckets are gone: the database holds only the hot ones.
    drop(status);
    let query = frostline(&d, &["query", "--table", "events", "--limit", "100000"], None);
    assert!(query.status.success(), "{}", text_of(&query));
    let got: Vec<serde_json::Value> = text(&query.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut expected: Vec<serde_json::Value> = lines
        .iter()
        .map(|v| {
            let mut v = v.clone();
            let time = match &v["event_time"] {
                serde_json::Value::String(s) => t(s),
                n => n.as_i64().unwrap(),
            };
            v["event_time"] = time.into();
            v
        })
        .collect();
    expected.sort_by_key(|v| (v["event_time"].as_i64().unwrap(), v["sort_key"].as_str().unwrap().to_string()));
    assert_eq!(got.len(), 3000);
    assert_eq!(got, expected, "every record, identical, in order");

    // Pagination through the binary gives the same records.
    let mut paged = 0;
    let mut cursor: Option<String> = None;
    loop {
        let mut args = vec!["query", "--table", "events", "--limit", "700"];
        if let Some(c) = &cursor {
            args.extend(["--cursor", c.as_str()]);
        }
        let page = frostline(&d, &args, None);
        paged += text(&page.stdout).lines().count();
        cursor = text(&page.stderr).lines().find_map(|l| l.strip_prefix("next cursor: ").map(str::to_string));
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(paged, 3000);

    // Every object matches the hash in its name, and every segment its manifest entry.
    let mut files = Vec::new();
    files_under(&Path::new(&d.data).join("archive"), &mut files);
    // The catalogs are derived and rewritten; every other object is content-addressed.
    files.retain(|p| !p.to_string_lossy().ends_with(frostline::archive::catalog::CATALOG_FILE));
    let manifests: Vec<_> =
        files.iter().filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("manifest-")).collect();
    assert_eq!(manifests.len(), 96);
    let mut named = 0;
    for path in &files {
        let bytes = std::fs::read(path).unwrap();
        let name = path.file_name().unwrap().to_str().unwrap();
        let hash_in_name = name.split('.').next().unwrap().rsplit('-').next().unwrap();
        assert!(sha256_hex(&bytes).starts_with(hash_in_name), "{name}");
    }
    for manifest_path in manifests {
        let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(manifest_path).unwrap()).unwrap();
        for segment in manifest["segments"].as_array().unwrap() {
            let path = Path::new(&d.data).join("archive").join(segment["key"].as_str().unwrap());
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(sha256_hex(&bytes), segment["sha256"].as_str().unwrap());
            assert_eq!(bytes.len() as u64, segment["bytes"].as_u64().unwrap());
            named += 1;
        }
    }
    assert_eq!(named, files.len() - 96, "every segment is named by a manifest");
}

fn text_of(o: &std::process::Output) -> String {
    format!("stdout: {}\nstderr: {}", text(&o.stdout), text(&o.stderr))
}

/// A claim commits without waiting for the disk: nothing is uploaded under it before its
/// upload intent, which is durable. So a process killed right after claiming leaves the bucket
/// as it was, and the next process archives it at once rather than waiting out a dead owner's
/// lease (60 s by default).
#[test]
fn a_process_killed_right_after_a_claim_leaves_the_bucket_claimable_at_once() {
    let (d, _) = three_years_ingested();
    let killed = frostline_with_fail_points(&d, &["archive", "--once"], None, Some("after_claim=return(abort)"));
    assert!(!killed.status.success(), "the fail point killed the pass: {}", text_of(&killed));
    assert!(text(&killed.stderr).contains("after_claim"), "{}", text_of(&killed));
    let status = frostline(&d, &["status", "--json"], None);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let states = &status["tables"][0]["states"];
    assert_eq!(states["archiving"]["buckets"].as_u64().unwrap_or(0), 0, "no claim outlived the process: {states}");
    let archive = frostline(&d, &["archive", "--once"], None);
    assert!(archive.status.success(), "{}", text_of(&archive));
    let report: serde_json::Value = serde_json::from_slice(&archive.stdout).unwrap();
    assert_eq!(report["archived"], 96, "every due bucket, the one claimed before the kill too: {report}");
}

/// A bucket's task that panics (a bug, here a fail point's panic) fails that bucket, not the
/// pass: the pass archives every other due bucket, reports the one that failed by name, and
/// the next pass archives it.
#[test]
fn a_bucket_task_that_panics_fails_its_bucket_not_the_pass() {
    let (d, _) = three_years_ingested();
    let archive = ["archive", "--once", "--retry-seconds", "1"];
    let out = frostline_with_fail_points(&d, &archive, None, Some("after_claim=1*panic(a bug)"));
    assert_eq!(out.status.code(), Some(1), "a pass with an error exits 1: {}", text_of(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text_of(&out)));
    // One pass (a pass with a deferral ends `--once`): every other bucket it took.
    assert_eq!(report["archived"], frostline::settings::SCAN_LIMIT_DEFAULT - 1, "{report}");
    let errors = report["errors"].as_array().unwrap();
    assert_eq!((errors.len(), &report["deferred"]), (1, &1.into()), "{report}");
    let error = errors[0].as_str().unwrap();
    assert!(error.contains("events/") && error.contains("panicked") && error.contains("a bug"), "{error}");
    // Deferred like any failed bucket, its claim released: retried after the retry delay (1 s
    // here), not once its lease (60 s) runs out.
    let status = frostline(&d, &["status", "--json"], None);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["tables"][0]["states"]["archiving"]["buckets"], 1, "{status}");
    let started = std::time::Instant::now();
    loop {
        let again = frostline(&d, &archive, None);
        assert!(again.status.success(), "{}", text_of(&again));
        let status = frostline(&d, &["status", "--json"], None);
        let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        if status["tables"][0]["states"]["archived"]["buckets"] == 96 {
            break;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "never retried: {status}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn a_malformed_file_is_refused_whole_with_line_numbers() {
    let d = dirs(POLICY);
    let input = "{\"partition_key\":\"a\",\"event_time\":1,\"body\":{}}\n{\"partition_key\":\"a\",\"event_time\":\"soon\",\"body\":{}}\n";
    let out = frostline(&d, &["ingest", "--table", "events", "-"], Some(input));
    assert_eq!(out.status.code(), Some(2), "{}", text_of(&out));
    assert!(text(&out.stderr).contains("line 2:"), "{}", text_of(&out));
    assert!(text(&out.stderr).contains("nothing was written"));
    let status = frostline(&d, &["status", "--json"], None);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(status["tables"][0]["states"].as_object().unwrap().is_empty(), "{status}");
}

/// `ingest` reads its input in two streaming passes (validate, then append in batches of at
/// most 10,000 records); standard input is spooled between them. Every record of a
/// multi-batch input lands, from a pipe and from a file alike.
#[test]
fn ingest_streams_an_input_of_several_batches_from_stdin_and_from_a_file() {
    let d = dirs(POLICY);
    let start = t("2024-01-01T00:00:00Z");
    let input: String = (0..25_001i64)
        .map(|i| {
            format!(
                "{{\"partition_key\":\"p{}\",\"event_time\":{},\"body\":{{\"i\":{i}}}}}\r\n\n",
                i % 3,
                start + i * 1_000_000
            )
        })
        .collect();
    let out = frostline(&d, &["ingest", "--table", "events", "-"], Some(&input));
    assert!(out.status.success(), "{}", text_of(&out));
    let counts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(counts["appended"], 25_001, "{counts}");
    let file = Path::new(&d.data).parent().unwrap().join("records.jsonl");
    std::fs::write(&file, &input).unwrap();
    let out = frostline(&d, &["ingest", "--table", "events", file.to_str().unwrap()], None);
    assert!(out.status.success(), "{}", text_of(&out));
    let counts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((counts["appended"].as_u64(), counts["duplicates"].as_u64()), (Some(0), Some(25_001)), "{counts}");
}

/// Every malformed line is counted (the first 20 reported with their numbers), a line longer
/// than the limit is refused without being read whole, and nothing is written.
#[test]
fn every_malformed_line_is_counted_and_an_overlong_one_is_refused() {
    let d = dirs(POLICY);
    let good = "{\"partition_key\":\"a\",\"event_time\":1,\"body\":{}}\n";
    let mut input = good.repeat(3);
    input.push_str(&"not json\n".repeat(24));
    let long = format!("{{\"partition_key\":\"a\",\"event_time\":2,\"body\":\"{}\"}}\n", "x".repeat(16 << 20));
    input.push_str(&long);
    input.push_str(good);
    let out = frostline(&d, &["ingest", "--table", "events", "-"], Some(&input));
    assert_eq!(out.status.code(), Some(2), "{}", text_of(&out));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("line 4:") && stderr.contains("line 23:") && !stderr.contains("line 24:"), "{stderr}");
    assert!(stderr.contains("... and 5 more"), "{stderr}");
    assert!(stderr.contains("25 malformed line(s); nothing was written"), "{stderr}");
    // The overlong line is not among the first 20 reported; alone, it is named.
    let out = frostline(&d, &["ingest", "--table", "events", "-"], Some(&format!("{good}{long}{good}")));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("line 2: longer than 16777215 bytes") && !stderr.contains("line 3"), "{stderr}");
    let status = frostline(&d, &["status", "--json"], None);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(status["tables"][0]["states"].as_object().unwrap().is_empty(), "{status}");
}

#[test]
fn obsolete_settings_and_bad_lease_settings_are_refused_at_start() {
    let d = dirs(POLICY);
    let out = Command::new(frostline_bin())
        .args(["status", "--data", &d.data, "--policies", &d.policies])
        .env("ARCHIVER_KEEP_HOT_BUCKETS", "2")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("ARCHIVER_ELIGIBLE_BEFORE"), "{}", text(&out.stderr));
    let out = frostline(&d, &["status", "--lease-seconds", "30", "--lease-renewal-seconds", "30"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("shorter"), "{}", text(&out.stderr));
}

#[test]
fn a_second_process_on_the_same_data_directory_is_refused() {
    let d = dirs(POLICY);
    let mut run = Command::new(frostline_bin())
        .args(["run", "--data", &d.data, "--policies", &d.policies, "--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = run.stderr.take().unwrap();
    let mut reader = std::io::BufReader::new(stderr);
    let mut line = String::new();
    loop {
        line.clear();
        use std::io::BufRead;
        assert!(reader.read_line(&mut line).unwrap() > 0, "run exited early");
        if line.contains("frostline running") {
            break;
        }
    }
    // `ingest`, `query`, `status` and `archive --once` go through the running engine's API
    // (tests/integration/api.rs); a second engine is refused.
    let out = frostline(&d, &["run", "--listen", "127.0.0.1:0"], None);
    let _ = run.kill();
    let _ = run.wait();
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("already open in another process"), "{}", text_of(&out));
}

/// Polls `frostline status --json` (served from the running engine's status file) until
/// `check` holds, for at most 30 s.
/// `frostline run` on `d` with a pass every second and `env`, its output dropped.
fn run_engine(d: &Dirs, env: &[(&str, &str)]) -> std::process::Child {
    Command::new(frostline_bin())
        .args(["run", "--data", &d.data, "--policies", &d.policies, "--interval-seconds", "1"])
        .args(["--listen", "127.0.0.1:0"])
        .envs(env.iter().copied())
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// Stops a `run_engine` child with SIGTERM and waits (at most 15 s) for its exit.
fn stop_engine(run: &mut std::process::Child) -> std::process::ExitStatus {
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let started = std::time::Instant::now();
    loop {
        if let Some(code) = run.try_wait().unwrap() {
            return code;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(15), "no exit after SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Waits for the status file a running engine publishes once it holds the data directory:
/// until then `frostline status` reads the directory itself, and would race the engine for it.
fn wait_for_status_file(d: &Dirs) {
    let status_file = Path::new(&d.data).join("status.json");
    let started = std::time::Instant::now();
    while !status_file.exists() {
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "the engine did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn wait_for_status(d: &Dirs, what: &str, check: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = frostline(d, &["status", "--json"], None);
        if let Ok(status) = serde_json::from_slice::<serde_json::Value>(&out.stdout) {
            if check(&status) {
                return status;
            }
            if std::time::Instant::now() > deadline {
                panic!("timed out waiting for {what}; last status: {status}");
            }
        } else if std::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}; {}", text_of(&out));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn the_running_engine_hot_reloads_on_change_refuses_bad_sets_and_reloads_on_request() {
    let d = dirs(POLICY);
    let mut run = run_engine(&d, &[]);
    wait_for_status_file(&d);
    wait_for_status(&d, "the first status", |s| s["policy"]["generation"] == 1);

    std::fs::write(Path::new(&d.policies).join("more.toml"), "[[table]]\nid = \"metrics\"\n").unwrap();
    let status = wait_for_status(&d, "generation 2", |s| s["policy"]["generation"] == 2);
    assert_eq!(status["policy"]["files"].as_object().unwrap().len(), 2);
    assert!(status["tables"].as_array().unwrap().iter().any(|t| t["id"] == "metrics"));

    std::fs::write(Path::new(&d.policies).join("broken.toml"), "[[table]]\nid = ").unwrap();
    let status = wait_for_status(&d, "a refused reload", |s| s["policy"]["last_reload"]["accepted"] == false);
    let error = status["policy"]["last_reload"]["error"].as_str().unwrap();
    assert!(error.contains("broken.toml"), "{error}");
    assert_eq!(status["policy"]["generation"], 2, "the previous set stays active");

    std::fs::remove_file(Path::new(&d.policies).join("broken.toml")).unwrap();
    wait_for_status(&d, "generation 3", |s| s["policy"]["generation"] == 3);

    let out = Command::new(frostline_bin()).args(["reload", "--data", &d.data]).output().unwrap();
    assert!(out.status.success(), "{}", text_of(&out));
    let status = wait_for_status(&d, "a reload by SIGHUP", |s| s["policy"]["last_reload"]["trigger"] == "SIGHUP");
    assert_eq!(status["policy"]["generation"], 4);

    // A file in a subfolder that the policy names (a webhook's CA file): replacing it reloads
    // (the watch was not recursive, so this change went unseen).
    let certs = Path::new(&d.policies).join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let pem = || rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap().cert.pem();
    std::fs::write(certs.join("ca.pem"), pem()).unwrap();
    std::fs::write(
        Path::new(&d.policies).join("sink.toml"),
        "[[sink]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"https://localhost:9/x\"\nca_file = \"certs/ca.pem\"\n",
    )
    .unwrap();
    let status = wait_for_status(&d, "the sink loaded", |s| {
        s["policy"]["files"].as_object().is_some_and(|f| f.contains_key("sink.toml"))
            && s["policy"]["last_reload"]["accepted"] == true
    });
    let generation = status["policy"]["generation"].as_u64().unwrap();
    std::fs::write(certs.join("ca.pem"), pem()).unwrap();
    let status = wait_for_status(&d, "a reload for the subfolder's file", |s| {
        s["policy"]["generation"].as_u64().is_some_and(|g| g > generation)
    });
    assert_eq!(status["policy"]["last_reload"]["trigger"], "file change", "{status}");

    assert!(stop_engine(&mut run).success());
}

/// Regression: the default data directory is relative (`frostline-data`) and the default
/// target was built as `file://frostline-data/archive`, which the target check refuses, so
/// the README's "Using it" commands failed when run as written. They run here exactly as the
/// README shows them (no `--data`, no `--policies`), in a directory that holds only a copy of
/// the example policy directory and a records file.
#[test]
fn the_readmes_using_it_commands_work_as_written_in_an_empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    std::fs::create_dir_all(dir.path().join("policies")).unwrap();
    std::fs::copy(repo.join("policies/tables.toml"), dir.path().join("policies/tables.toml")).unwrap();
    std::fs::copy(repo.join("policies/sample/events.jsonl"), dir.path().join("records.jsonl")).unwrap();
    let run = |args: &str| {
        let output = std::process::Command::new(frostline_bin())
            .args(args.split_whitespace())
            .current_dir(dir.path())
            .env_remove("FROSTLINE_DATA")
            .env_remove("FROSTLINE_POLICIES")
            .output()
            .unwrap();
        assert!(output.status.success(), "`frostline {args}` failed: {}{}", text(&output.stdout), text(&output.stderr));
        text(&output.stdout)
    };
    let first = run("ingest --table events records.jsonl");
    run("archive --once");
    // Re-running an ingest is safe after its buckets were archived (the README says so).
    let again: serde_json::Value = serde_json::from_str(run("ingest --table events records.jsonl").trim()).unwrap();
    let first: serde_json::Value = serde_json::from_str(first.trim()).unwrap();
    assert!(again["already_archived"].as_u64().unwrap() > 0, "{again}");
    assert_eq!(again["appended"], 0, "{again}");
    assert_eq!(
        again["already_archived"].as_u64().unwrap() + again["duplicates"].as_u64().unwrap(),
        first["appended"].as_u64().unwrap(),
        "{again}"
    );
    let page = run("query --table events --from 2024-01-01T00:00:00Z --to 2025-01-01T00:00:00Z --limit 100");
    assert!(!page.trim().is_empty());
    let status = run("status --json");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let data = dir.path().join("frostline-data").canonicalize().unwrap();
    assert_eq!(std::path::Path::new(status["data_dir"].as_str().unwrap()).canonicalize().unwrap(), data);
    run("status");
    // Every archive on the target is this directory's own: nothing to adopt, exit 0.
    let adopt: serde_json::Value = serde_json::from_str(&run("adopt --dry-run")).unwrap();
    assert_eq!(adopt["adopted"], 0, "{adopt}");
    assert!(adopt["known"].as_u64().unwrap() > 0, "{adopt}");
    // Without a running engine, a policy check reads the store itself.
    let check: serde_json::Value =
        serde_json::from_str(&run("policy check policies --data frostline-data --json")).unwrap();
    assert_eq!(check["accepted"], true, "{check}");
    let events = check["preview"]["tables"].as_array().unwrap().iter().find(|t| t["table"] == "events").unwrap();
    assert_eq!(events["unchanged"], events["buckets_checked"], "the same directory re-plans nothing: {check}");
    run("verify --table events");
    run("sweep --dry-run");
    assert!(data.join("hot.redb").is_file());
}

#[test]
fn version_names_the_contract_wasmtime_and_every_builtin_by_hash() {
    let out = run_frostline(&["--version"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let version = text(&out.stdout);
    assert!(version.starts_with(&format!("frostline {}\n", env!("CARGO_PKG_VERSION"))), "{version}");
    assert!(version.contains(&format!("wasmtime {}\n", frostline::plugin::WASMTIME_VERSION)), "{version}");
    let contract =
        format!("plugin contract {}@{}", frostline::plugin::CONTRACT_PACKAGE, frostline::plugin::CONTRACT_VERSION);
    assert!(version.contains(&contract), "{version}");
    for builtin in frostline::plugin::builtin::BUILTINS {
        let line = format!("builtin:{} {} sha256 {}", builtin.name, builtin.role, sha256_hex(builtin.bytes));
        assert!(version.contains(&line), "{line} in {version}");
    }
    // `-V` stays one line, for scripts.
    let short = run_frostline(&["-V"]);
    assert_eq!(text(&short.stdout).trim(), format!("frostline {}", env!("CARGO_PKG_VERSION")));
}

/// Erasure as an operator runs it: a dry run counts and changes nothing; the request is placed,
/// `erase status` exits 1 while it is open; one `archive --once` carries it out; the receipt is
/// finished; queries return every other record; and no file on the target holds the tenant's
/// name or records (every generation they were in was deleted and proved absent).
#[test]
fn erasing_a_tenant_through_the_binary_leaves_no_byte_of_it_on_the_target() {
    let (d, lines) = three_years_ingested();
    let archive = frostline(&d, &["archive", "--once"], None);
    assert!(archive.status.success(), "{}", text_of(&archive));
    let target = Path::new(&d.data).join("archive");
    let holding = |needle: &str| {
        let mut files = Vec::new();
        files_under(&target, &mut files);
        files.retain(|p| std::fs::read(p).unwrap().windows(needle.len()).any(|w| w == needle.as_bytes()));
        files
    };
    assert!(!holding("\"acme\"").is_empty());

    let erase = ["erase", "place", "--tenant", "acme", "--reason", "erasure request 7", "--by", "dpo"];
    let dry = frostline(&d, &[&erase[..], &["--dry-run"]].concat(), None);
    assert!(dry.status.success(), "{}", text_of(&dry));
    let preview: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    // acme's records lie in two of the four partitions: 24 archived months each.
    assert_eq!(preview["preview"]["archived_buckets"], 48, "{preview}");
    let hot_acme = lines
        .iter()
        .filter(|v| v["tenant"] == "acme")
        .filter(|v| v["event_time"].as_i64().is_none_or(|time| time >= t("2025-01-01T00:00:00Z")))
        .filter(|v| v["event_time"].as_str().is_none_or(|time| t(time) >= t("2025-01-01T00:00:00Z")))
        .count();
    assert_eq!(preview["preview"]["hot_rows"], hot_acme as u64, "{preview}");
    assert!(!holding("\"acme\"").is_empty(), "a dry run changes nothing");
    let placed = frostline(&d, &erase, None);
    assert!(placed.status.success(), "{}", text_of(&placed));
    let placed: serde_json::Value = serde_json::from_slice(&placed.stdout).unwrap();
    let id = placed["request"]["id"].as_str().unwrap().to_string();
    let open = frostline(&d, &["erase", "status", &id], None);
    assert_eq!(open.status.code(), Some(1), "open: {}", text_of(&open));

    // With the request shared on the target too, as a fleet's hosts share it: the target then
    // holds it, named by digests under the fleet's key.
    let key_file = Path::new(&d.data).join("fleet.key");
    std::fs::write(&key_file, "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0\n").unwrap();
    let archive = frostline(&d, &["archive", "--once", "--share-erasures", key_file.to_str().unwrap()], None);
    assert!(archive.status.success(), "{}", text_of(&archive));
    let shared = target.join(format!("_frostline-erasures/{id}/request.json"));
    assert!(shared.exists(), "the request is shared on the target: {}", text_of(&archive));
    let status = frostline(&d, &["erase", "status", &id, "--json"], None);
    assert!(status.status.success(), "{}", text_of(&status));
    let receipt: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(receipt[0]["finished_at"].is_i64(), "{receipt}");

    let query = frostline(&d, &["query", "--table", "events", "--limit", "100000"], None);
    let got: Vec<serde_json::Value> = text(&query.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let globex = lines.iter().filter(|v| v["tenant"] == "globex").count();
    assert_eq!(got.len(), globex);
    assert!(got.iter().all(|v| v["tenant"] == "globex"));
    assert_eq!(holding("\"acme\""), Vec::<std::path::PathBuf>::new(), "the tenant's name or records on the target");
    assert_eq!(holding("acme"), Vec::<std::path::PathBuf>::new(), "the tenant's name, unquoted, on the target");
    let request = std::fs::read_to_string(&shared).unwrap();
    assert!(!request.contains("dpo") && !request.contains("erasure request 7"), "no requester or reason: {request}");
}

/// `frostline compact --data DIR`, as an operator runs it.
fn compact(data: &str) -> std::process::Output {
    Command::new(frostline_bin()).args(["compact", "--data", data]).output().unwrap()
}

/// The hot store's file keeps what its freed pages held (here: bodies of records whose hot rows
/// archival deleted) until redb reuses them; `frostline compact` moves the live pages to the
/// front and truncates the rest, after which no such body is left in the file and every record
/// still reads back. Erased records' hot rows are freed the same way.
#[test]
fn compaction_leaves_no_body_of_a_deleted_hot_row_in_the_hot_store() {
    let (d, lines) = three_years_ingested();
    let archive = frostline(&d, &["archive", "--once"], None);
    assert!(archive.status.success(), "{}", text_of(&archive));
    let database = Path::new(&d.data).join("hot.redb");
    let cutoff = t("2025-01-01T00:00:00Z");
    let bodies_in_file = |archived: bool| {
        // Lossy text, so the standard library's substring search (optimized even in a debug
        // build) does the looking: the needles are ASCII.
        let file = String::from_utf8_lossy(&std::fs::read(&database).unwrap()).into_owned();
        let time = |v: &serde_json::Value| match &v["event_time"] {
            serde_json::Value::String(s) => t(s),
            n => n.as_i64().unwrap(),
        };
        let needles =
            lines.iter().filter(|v| (time(v) < cutoff) == archived).map(|v| format!("{{\"i\":{},", v["body"]["i"]));
        needles.filter(|needle| file.contains(needle.as_str())).count()
    };
    // Usually some bodies linger in freed pages here; the pass's own later commits can reuse
    // every such page (a CI run under load found none left once), so their presence is
    // reported, not required: what compaction must do is leave none.
    let lingering = bodies_in_file(true);
    eprintln!("bodies of deleted hot rows in the file before compaction: {lingering}");
    let hot_before = bodies_in_file(false);
    assert!(hot_before > 0, "the records after the cutoff are still hot");
    let compacted = compact(&d.data);
    assert!(compacted.status.success(), "{}", text_of(&compacted));
    let report: serde_json::Value = serde_json::from_slice(&compacted.stdout).unwrap();
    assert!(report["bytes_before"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(bodies_in_file(true), 0, "bodies of deleted hot rows left in the hot store's file");
    assert_eq!(bodies_in_file(false), hot_before, "every hot row is still in the file");
    let query = frostline(&d, &["query", "--table", "events", "--limit", "100000"], None);
    assert!(query.status.success(), "{}", text_of(&query));
    assert_eq!(text(&query.stdout).lines().count(), lines.len(), "every record reads back after compaction");
}

/// Compaction needs the hot store to itself: it refuses a data directory a running engine holds
/// and one with no hot store (creating nothing), and says what to do.
#[test]
fn compaction_refuses_a_data_directory_in_use_or_without_a_hot_store() {
    let (d, _) = three_years_ingested();
    let database = Path::new(&d.data).join("hot.redb");
    let held = frostline::store::Store::open(&database).unwrap();
    let before = std::fs::read(&database).unwrap();
    let refused = compact(&d.data);
    assert!(!refused.status.success());
    assert!(text_of(&refused).contains("already open in another process"), "{}", text_of(&refused));
    assert!(std::fs::read(&database).unwrap() == before, "a refused compaction changes nothing");
    drop(held);

    let missing = Path::new(&d.data).join("no-such-directory");
    let refused = compact(&missing.display().to_string());
    assert!(!refused.status.success());
    assert!(text_of(&refused).contains("no hot store at"), "{}", text_of(&refused));
    assert!(!missing.exists(), "a refused compaction creates nothing");
    let done = compact(&d.data);
    assert!(done.status.success(), "{}", text_of(&done));
}

/// Issue 34 ("give the disk back"), as an operator runs it: `frostline run` archives what was
/// ingested, then compacts its own hot store in place, so the file falls under a tenth of its
/// peak with no restart, `status` says what it gave back, and every record still reads back.
/// Before, the file kept its high-water mark until the engine was stopped for `frostline
/// compact`.
#[test]
fn a_running_engine_compacts_its_hot_store_once_archival_freed_most_of_it() {
    let d = dirs(POLICY);
    let start = t("2023-01-01T00:00:00Z");
    let input: String = (0..6_000i64)
        .map(|i| {
            let line = serde_json::json!({
                "partition_key": format!("site a/%20=ü/{}", i % 4),
                "event_time": start + i * 2 * 365 * 86_400_000_000 / 6_000,
                "sort_key": format!("{i:05}"),
                "body": {"i": i, "pad": "x".repeat(2_000)},
            });
            line.to_string() + "\n"
        })
        .collect();
    let ingest = frostline(&d, &["ingest", "--table", "events", "-"], Some(&input));
    assert!(ingest.status.success(), "{}", text_of(&ingest));
    let database = Path::new(&d.data).join("hot.redb");
    let peak = std::fs::metadata(&database).unwrap().len();
    let mut run =
        run_engine(&d, &[("FROSTLINE_STORE_COMPACT_FREE_MIB", "1"), ("FROSTLINE_STORE_COMPACT_CHECK_SECONDS", "1")]);
    wait_for_status_file(&d);
    let status = wait_for_status(&d, "a compaction in place", |s| s["store_disk"]["compactions"].as_u64() >= Some(1));
    let compaction = &status["store_disk"]["last_compaction"];
    let after = std::fs::metadata(&database).unwrap().len();
    assert!(after * 10 < peak, "{after} bytes after, {peak} at the peak: {status}");
    assert!(compaction["bytes_after"].as_u64().unwrap() * 10 < peak, "{compaction}");
    assert!(status["store_disk"]["free_bytes"].is_u64(), "{status}");
    let states = &status["tables"][0]["states"];
    assert_eq!(states["archived"]["rows"], 6_000, "{status}");
    let query = frostline(&d, &["query", "--table", "events", "--limit", "100000"], None);
    assert!(query.status.success(), "{}", text_of(&query));
    assert_eq!(text(&query.stdout).lines().count(), 6_000, "every record reads back");
    assert!(stop_engine(&mut run).success());
}

/// The peak resident set of `child` until it exits (`VmHWM`, read from /proc every few
/// milliseconds), and its exit status.
fn wait_with_peak_mib(mut child: std::process::Child) -> (std::process::ExitStatus, u64) {
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0u64;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, peak_kib / 1024);
        }
        if let Ok(text) = std::fs::read_to_string(&status_path)
            && let Some(kib) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        {
            peak_kib = peak_kib.max(kib);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Runs the binary with `args` on `d` (and `env`) to its successful end; its peak resident set.
fn peak_mib_of(d: &Dirs, args: &[&str], env: &[(&str, &str)]) -> u64 {
    let child = Command::new(frostline_bin())
        .args(args)
        .args(["--data", &d.data, "--policies", &d.policies])
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (status, peak_mib) = wait_with_peak_mib(child);
    assert!(status.success(), "{args:?}: {status:?}");
    peak_mib
}

/// Issue 34 ("bytes, not only rows"): the pass read a claimed bucket 10,000 rows at a time
/// whatever their size, so a bucket of 1 MiB bodies (the largest a record may have) was read,
/// and encoded, whole: 300 records took the process to 657 MiB, and 10,000 would take 20 GiB.
/// Its pages are bounded by bytes too (8 MiB, one segment), so archiving 300 MiB of such
/// records stays within the memory of archiving small ones, and every record reads back. A
/// query read a hot bucket 1,000 rows at a time to fill a page of 16 MiB (349 MiB for this
/// one); its reads are bounded by what the page may still take. And a next generation (here
/// for a late record) and `frostline verify` read the archived rows whole: now a segment at a
/// time.
#[test]
fn archiving_a_bucket_of_the_largest_bodies_holds_a_page_of_bytes_not_of_rows() {
    let d = dirs(POLICY);
    let pad = "x".repeat(frostline::model::RECORD_BODY_BYTES_MAX - 100);
    let input: String = (0..300)
        .map(|i| {
            let time = t("2023-03-01T00:00:00Z") + i;
            format!(
                "{{\"partition_key\":\"site a/%20=ü\",\"event_time\":{time},\"sort_key\":\"{i:03}\",\"body\":{{\"i\":{i},\"pad\":\"{pad}\"}}}}\n"
            )
        })
        .collect();
    let ingest = frostline(&d, &["ingest", "--table", "events", "-"], Some(&input));
    assert!(ingest.status.success(), "{}", text_of(&ingest));
    drop(input);
    // A query page of the hot bucket is read 16 MiB at a time too, not 1,000 rows at a time.
    let query_peak_mib =
        peak_mib_of(&d, &["query", "--table", "events", "--limit", "1000"], &[("FROSTLINE_STORE_CACHE_MIB", "4")]);
    eprintln!("query of a page of the hot bucket: peak resident {query_peak_mib} MiB");
    assert!(query_peak_mib < 200, "a query page of the hot bucket held {query_peak_mib} MiB at its peak");
    // The store's page cache is bounded on its own (FROSTLINE_STORE_CACHE_MIB); at its minimum
    // it leaves what the pass itself holds to be seen.
    let archive_peak_mib = || {
        let env = [("FROSTLINE_STORE_CACHE_MIB", "4"), ("ARCHIVER_LATE_GRACE_SECONDS", "0")];
        peak_mib_of(&d, &["archive", "--once"], &env)
    };
    let peak_mib = archive_peak_mib();
    eprintln!("archive --once of 300 records of 1 MiB: peak resident {peak_mib} MiB");
    assert!(peak_mib < 200, "the pass held {peak_mib} MiB at its peak for a bucket of 300 MiB");
    // Pages of a query are bounded by bytes too (16 MiB): follow the cursors.
    let read_all = || {
        let mut read: Vec<serde_json::Value> = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut args = vec!["query", "--table", "events", "--limit", "1000"];
            if let Some(c) = &cursor {
                args.extend(["--cursor", c.as_str()]);
            }
            let query = frostline(&d, &args, None);
            assert!(query.status.success(), "{}", text_of(&query));
            read.extend(text(&query.stdout).lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()));
            cursor = text(&query.stderr).lines().find_map(|l| l.strip_prefix("next cursor: ")).map(str::to_string);
            if cursor.is_none() {
                return read;
            }
        }
    };
    let read = read_all();
    assert_eq!(read.len(), 300);
    assert!(
        read.iter().enumerate().all(|(i, r)| r["body"]["i"] == i && r["body"]["pad"].as_str() == Some(pad.as_str()))
    );

    // The scrub reads it a segment at a time too.
    let verify_peak_mib = peak_mib_of(&d, &["verify"], &[("FROSTLINE_STORE_CACHE_MIB", "4")]);
    eprintln!("verify of the bucket: peak resident {verify_peak_mib} MiB");
    assert!(verify_peak_mib < 200, "verify held {verify_peak_mib} MiB at its peak for a bucket of 300 MiB");

    // A late record for that bucket: its next generation merges it with the archived rows,
    // which it read whole into memory (with the hot rows' last page, the whole bucket again)
    // before they were read a segment at a time.
    let late = format!(
        "{{\"partition_key\":\"site a/%20=ü\",\"event_time\":{},\"sort_key\":\"late\",\"body\":{{\"i\":300}}}}\n",
        t("2023-03-02T00:00:00Z")
    );
    // The grace a late record waits before its next generation is set where it is appended.
    let ingest = Command::new(frostline_bin())
        .args(["ingest", "--table", "events", "-", "--data", &d.data, "--policies", &d.policies])
        .env("ARCHIVER_LATE_GRACE_SECONDS", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut child = ingest;
        child.stdin.take().unwrap().write_all(late.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text_of(&out));
    }
    let peak_mib = archive_peak_mib();
    eprintln!("archive --once of the next generation of 300 records of 1 MiB: peak resident {peak_mib} MiB");
    assert!(peak_mib < 200, "the next generation held {peak_mib} MiB at its peak for a bucket of 300 MiB");
    let read = read_all();
    assert_eq!(read.len(), 301);
    assert!(read.iter().enumerate().all(|(i, r)| r["body"]["i"] == i));
    let status = frostline(&d, &["status", "--json"], None);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["tables"][0]["states"]["archived"]["rows"], 301, "{status}");
    assert_eq!(status["tables"][0]["states"].as_object().unwrap().len(), 1, "every bucket archived: {status}");
}

//! The fleet archive: engines of three installations archive one Parquet table into one
//! target at once, and the Delta Lake table they commit to together is read by delta-rs's
//! Python package and by polars, record for record what `frostline query` returns on each
//! engine, on a local directory and on moto's S3. Expiry removes files from the log before
//! deleting them (an older version then fails honestly), commits are idempotent, the log is
//! checkpointed, and a lost log is rebuilt from the manifests.

use std::path::Path;
use std::process::Command;

use frostline::archive::delta::{DELTA_CHECKPOINT_INTERVAL, sync};
use frostline::model::Record;
use frostline::store::erasure::ErasureSelector;

use crate::object_stores::{KEY_ID, SECRET_FILES, SECRET_KEY, SESSION_TOKEN, Server, s3_target};
use crate::support::*;

const ENGINES: usize = 3;
const NOW: &str = "2024-03-01T12:00:00Z";

fn policy(target: &str) -> String {
    format!(
        r#"{target}
[[table]]
id = "events"
format = "parquet"
target = "cold"
strategy = {{ plugin = "builtin:calendar-day-utc" }}
retention = {{ plugin = "builtin:eligible-before", config = {{ archive_after = "1d", expire_after = "30d" }} }}
"#
    )
}

/// Where a test's table lives and how a reader outside frostline reaches it.
struct Fleet {
    /// The Delta table's URI for Python readers.
    uri: String,
    /// The environment those readers need (S3 endpoint and credentials).
    env: Vec<(String, String)>,
    /// The target's directory, when it is local (for the plain Parquet readers).
    local_root: Option<std::path::PathBuf>,
    engines: Vec<TestEngine>,
}

impl Fleet {
    fn open(policy: String, uri: String, env: Vec<(String, String)>, local_root: Option<std::path::PathBuf>) -> Fleet {
        let engines = (0..ENGINES)
            .map(|_| {
                TestEngine::open(&policy, NOW, &SECRET_FILES, Default::default()).unwrap_or_else(|e| panic!("{e}"))
            })
            .collect();
        Fleet { uri, env, local_root, engines }
    }

    /// Runs one pass on every engine at once.
    fn passes(&self) -> Vec<frostline::archive::PassReport> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = self.engines.iter().map(|e| scope.spawn(|| e.pass())).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn set_clock(&self, now: &str) {
        for e in &self.engines {
            e.clock.set(t(now));
        }
    }

    fn read(&self, reader: &str, version: Option<i64>) -> std::process::Output {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/integration/readers/read_delta.py");
        let mut command = Command::new(python());
        command.arg(&script).args([reader, &self.uri]).args(version.map(|v| v.to_string()));
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command.output().unwrap()
    }

    /// The records a Delta reader returns, as JSON values.
    fn records(&self, reader: &str, version: Option<i64>) -> Vec<serde_json::Value> {
        let out = self.read(reader, version);
        assert!(out.status.success(), "{reader}: {}", text(&out.stderr));
        text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// What every engine's `query` returns, as the Delta readers print it (with the partition
    /// columns each record's file carries).
    fn expected(&self) -> Vec<serde_json::Value> {
        let mut rows = Vec::new();
        for e in &self.engines {
            let buckets = e.engine.store().buckets("events", None).unwrap();
            for record in e.query_all("events") {
                let bucket = buckets
                    .iter()
                    .find(|m| m.id.partition_key == record.partition_key && m.descriptor.contains(record.event_time))
                    .expect("every record lies in a bucket");
                rows.push((record.clone(), e.engine.installation_id().to_string(), bucket.id.bucket_key.clone()));
            }
        }
        rows.sort_by(|(a, ..), (b, ..)| {
            (a.event_time, &a.sort_key, &a.partition_key).cmp(&(b.event_time, &b.sort_key, &b.partition_key))
        });
        rows.into_iter().map(|(r, installation, bucket)| as_json(&r, &installation, &bucket)).collect()
    }

    fn files(&self, version: Option<i64>) -> std::result::Result<usize, String> {
        let out = self.read("files", version);
        if !out.status.success() {
            return Err(text(&out.stderr));
        }
        Ok(text(&out.stdout).trim().parse().unwrap())
    }
}

fn as_json(r: &Record, installation: &str, bucket: &str) -> serde_json::Value {
    let mut v = serde_json::json!({
        "partition_key": String::from_utf8_lossy(&r.partition_key),
        "event_time": r.event_time,
        "sort_key": String::from_utf8_lossy(&r.sort_key),
    });
    if let Some(tenant) = &r.tenant {
        v["tenant"] = tenant.clone().into();
    }
    if let Some(kind) = &r.kind {
        v["kind"] = kind.clone().into();
    }
    v["body"] = serde_json::from_str(&r.body).unwrap();
    v["_delta"] = serde_json::json!({
        "installation": installation,
        "bucket": bucket,
        "partition": String::from_utf8_lossy(&r.partition_key),
    });
    v
}

/// Three days of records in three partitions, for engine `n`: the same buckets on every
/// engine, records of their own (`e<n>-` sort keys).
fn engine_records(n: usize) -> Vec<Record> {
    records("2024-03-01T00:00:00Z", 3, 12)
        .into_iter()
        .map(|mut r| {
            r.sort_key = format!("e{n}-{}", String::from_utf8_lossy(&r.sort_key)).into_bytes();
            r
        })
        .collect()
}

/// The whole life of a fleet archive on one target.
fn fleet_archive(fleet: Fleet) {
    for (n, e) in fleet.engines.iter().enumerate() {
        e.engine.append("events", engine_records(n)).unwrap();
    }
    fleet.passes(); // plans
    fleet.set_clock("2024-03-10T00:00:00Z");
    for report in fleet.passes() {
        assert_eq!(report.archived, 9, "three days of three partitions: {report:?}");
        assert!(report.errors.is_empty(), "{report:?}");
    }
    let expected = fleet.expected();
    assert_eq!(expected.len(), ENGINES * 36);
    for reader in ["deltalake", "polars"] {
        assert_eq!(fleet.records(reader, None), expected, "{reader} reads what the engines' queries return");
    }
    assert_eq!(fleet.files(None).unwrap(), ENGINES * 9, "one file per segment, none twice");
    if let Some(root) = &fleet.local_root {
        // Plain Parquet readers with Hive partitioning see the same records.
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/integration/readers/read_parquet.py");
        let without_delta: Vec<serde_json::Value> = expected
            .iter()
            .map(|r| {
                let mut r = r.clone();
                r.as_object_mut().unwrap().remove("_delta");
                r
            })
            .collect();
        // Spark in local mode too (scripts/install-pyspark, which scripts/test runs).
        let pyspark = std::env::var("FROSTLINE_PYSPARK_PYTHON").unwrap_or_else(|_| {
            panic!(
                "FROSTLINE_PYSPARK_PYTHON is not set: run the tests with ./scripts/test (scripts/install-pyspark \
                 installs PySpark)"
            )
        });
        let readers = [("duckdb", python()), ("pyarrow", python()), ("pyspark", pyspark)];
        for (reader, python) in readers {
            let out = Command::new(python)
                .arg(&script)
                .args([reader, &root.display().to_string(), "events", "0", &t("2100-01-01T00:00:00Z").to_string()])
                .output()
                .unwrap();
            assert!(out.status.success(), "{reader}: {}", text(&out.stderr));
            let got: Vec<serde_json::Value> =
                text(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            assert_eq!(got, without_delta, "{reader}");
        }
    }

    // Idempotent: a sync with nothing new commits nothing, on every engine.
    for e in &fleet.engines {
        let table = e.engine.policies().table("events").unwrap().clone();
        let report = runtime().block_on(sync(&e.engine.context(), &table)).unwrap();
        assert_eq!((report.added, report.removed, report.created), (0, 0, false), "{report:?}");
    }

    // A lost log is rebuilt from the manifests, each installation committing its own files.
    let backend = fleet.engines[0].backend("events");
    let log: Vec<String> =
        runtime().block_on(backend.list("delta/events/_delta_log/")).unwrap().into_iter().map(|o| o.key).collect();
    assert!(!log.is_empty());
    for key in &log {
        runtime().block_on(backend.delete(key)).unwrap();
    }
    assert!(fleet.files(None).is_err(), "the log is gone");
    for e in &fleet.engines {
        let table = e.engine.policies().table("events").unwrap().clone();
        let report = runtime().block_on(sync(&e.engine.context(), &table)).unwrap();
        assert_eq!(report.added, 9, "{report:?}");
    }
    assert_eq!(fleet.records("deltalake", None), expected, "the rebuilt log lists every file again");
    let before_expiry = versions(&fleet);

    // Expiry: the removes are committed before the objects go; the newest version lists
    // nothing, and the version before the removes still names the files, whose reading fails.
    fleet.set_clock("2024-04-15T00:00:00Z");
    for report in fleet.passes() {
        assert_eq!(report.expired, 9, "{report:?}");
        assert!(report.errors.is_empty(), "{report:?}");
    }
    assert_eq!(fleet.files(None).unwrap(), 0);
    // One commit of removes per installation and pass, not one per expired bucket: a sync
    // reads the whole log and every manifest, so a sync per bucket made a pass that expired a
    // few hundred buckets of a large table last many minutes.
    let commits = versions(&fleet) - before_expiry;
    assert!(commits <= ENGINES as i64, "{commits} commits for the expiry of 9 buckets on each of {ENGINES} engines");
    assert!(fleet.records("polars", None).is_empty());
    assert_eq!(fleet.files(Some(before_expiry)).unwrap(), ENGINES * 9, "time travel still lists the expired files");
    let old = fleet.read("deltalake", Some(before_expiry));
    assert!(!old.status.success(), "reading an expired version fails instead of returning part of it");
}

/// The newest version of the fleet's table, from its log.
fn versions(fleet: &Fleet) -> i64 {
    let backend = fleet.engines[0].backend("events");
    runtime()
        .block_on(backend.list("delta/events/_delta_log/"))
        .unwrap()
        .iter()
        .filter_map(|o| o.key.rsplit('/').next()?.strip_suffix(".json")?.parse::<i64>().ok())
        .max()
        .unwrap()
}

#[test]
fn three_engines_share_one_delta_table_on_a_local_directory() {
    let dir = tempfile::tempdir().unwrap();
    let target = format!("[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", dir.path().display());
    let uri = dir.path().join("delta/events").display().to_string();
    fleet_archive(Fleet::open(policy(&target), uri, Vec::new(), Some(dir.path().to_path_buf())));
}

/// A running engine's Delta sync reads the buckets whose publication changed since its last
/// sync, not every manifest the table ever recorded: its first sync reads every archived
/// bucket, each later one only what the pass before it published, expired or replaced (and a
/// debug build checks each update against a whole reading).
/// Three passes of `te` (plan, archive, clean up), none with an error: what they did, summed.
fn three_passes(te: &TestEngine) -> frostline::archive::PassReport {
    let mut sum = frostline::archive::PassReport::default();
    for _ in 0..3 {
        let report = te.pass();
        assert!(report.errors.is_empty(), "{report:?}");
        sum.archived += report.archived;
        sum.expired += report.expired;
        sum.delta_buckets_read += report.delta_buckets_read;
        sum.delta_files_compared += report.delta_files_compared;
    }
    sum
}

#[test]
fn a_running_engines_delta_sync_reads_and_compares_only_the_buckets_whose_publication_changed() {
    let dir = tempfile::tempdir().unwrap();
    let target = format!("[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", dir.path().display());
    let te = TestEngine::new(&policy(&target), "2024-01-15T00:00:00Z");
    // Three passes (plan, archive, clean up): the buckets they archived and the Delta syncs read.
    // Its plans compare the log's entries and the published files only where either changed:
    // each bucket here has one file.
    let passes = || {
        let sum = three_passes(&te);
        (sum.archived, sum.delta_buckets_read, sum.delta_files_compared)
    };
    te.engine.append("events", records("2024-01-01T00:00:00Z", 10, 6)).unwrap();
    assert_eq!(passes(), (30, 30, 30), "the first sync of a process reads every bucket");
    // One more day: its three buckets are all the next sync reads and compares (a plan over
    // every file would compare the log's 30 entries and the 33 published files).
    te.engine.append("events", records("2024-01-12T00:00:00Z", 1, 6)).unwrap();
    assert_eq!(passes(), (3, 3, 3), "only the day's three new buckets are read and compared");
    // A late record replaces one bucket's generation: that bucket is read again, no other, and
    // the plan compares its old file (listed) and its new one (published).
    let mut late = records("2024-01-03T00:00:00Z", 1, 1);
    late[0].sort_key = b"late".to_vec();
    te.engine.append("events", late).unwrap();
    te.clock.advance(3_600_000_000); // past the late grace
    assert_eq!(passes(), (1, 1, 2), "only the bucket that took the late record is read and compared");
    assert_eq!(te.engine.store().buckets("events", None).unwrap().len(), 33);
}

/// An operator moves a damaged log aside while the engine runs (docs/FLEET.md): the log the
/// engine's last sync left is gone, and the next sync writes a new one from version 0. The
/// engine kept the old log in memory between syncs; brought up to date from it, the new log
/// would hold the day's three files only and a gap where the old versions were. The kept log
/// is used only while the log still holds the commit it was left at; here the new one is read
/// whole and lists every file.
#[test]
fn a_log_moved_aside_under_a_running_engine_is_written_anew_with_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let target = format!("[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", dir.path().display());
    let te = TestEngine::new(&policy(&target), "2024-01-15T00:00:00Z");
    let passes = || three_passes(&te).archived;
    te.engine.append("events", records("2024-01-01T00:00:00Z", 10, 6)).unwrap();
    assert_eq!(passes(), 30);
    let table_dir = dir.path().join("delta/events");
    assert_eq!(live_files(&table_dir).len(), 30);
    std::fs::rename(table_dir.join("_delta_log"), table_dir.join("_delta_log.damaged")).unwrap();
    te.engine.append("events", records("2024-01-12T00:00:00Z", 1, 6)).unwrap();
    assert_eq!(passes(), 3);
    let files = live_files(&table_dir);
    assert_eq!(files.len(), 33, "the new log lists every published file: {files:#?}");
    for path in files.keys() {
        assert!(table_dir.join(percent_decode(path)).is_file(), "`{path}` is an object");
    }
    let mut versions: Vec<u64> = std::fs::read_dir(table_dir.join("_delta_log"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_str()?.strip_suffix(".json")?.parse().ok())
        .collect();
    versions.sort();
    assert_eq!(versions, (0..versions.len() as u64).collect::<Vec<_>>(), "no version is missing");
}

/// A reload that takes a table's Delta log away (here: its format is no longer Parquet) and a
/// later one that brings it back. Meanwhile archives expire without waiting for a log, and
/// nobody reads the table's publication changes, which every pass drops. The index the
/// engine's syncs kept from those changes would still want the expired files: the log would
/// go on listing files that are gone. A table whose changes are dropped loses its kept index,
/// so the sync after the log comes back reads every manifest and removes them.
#[test]
fn a_delta_log_taken_away_by_a_reload_and_brought_back_lists_no_file_expired_meanwhile() {
    use frostline::ops::reload::reload;
    let dir = tempfile::tempdir().unwrap();
    let target = format!("[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", dir.path().display());
    let te = TestEngine::new(&policy(&target), "2024-01-15T00:00:00Z");
    let passes = || {
        let sum = three_passes(&te);
        (sum.archived, sum.expired)
    };
    te.engine.append("events", records("2024-01-01T00:00:00Z", 10, 6)).unwrap();
    assert_eq!(passes(), (30, 0));
    let table_dir = dir.path().join("delta/events");
    assert_eq!(live_files(&table_dir).len(), 30);
    let policy_file = te.policies_dir().join("tables.toml");
    let parquet = std::fs::read_to_string(&policy_file).unwrap();
    assert!(parquet.contains(r#"format = "parquet""#), "{parquet}");
    std::fs::write(&policy_file, parquet.replace(r#"format = "parquet""#, r#"format = "jsonl""#)).unwrap();
    assert!(reload(&te.engine, "test").accepted);
    // Past `expire_after` of the first five days: their archives expire, with no log to wait for.
    te.clock.set(t("2024-02-05T12:00:00Z"));
    assert_eq!(passes(), (0, 15));
    std::fs::write(&policy_file, &parquet).unwrap();
    assert!(reload(&te.engine, "test").accepted);
    te.engine.append("events", records("2024-02-03T00:00:00Z", 1, 6)).unwrap();
    assert_eq!(passes(), (3, 0));
    let files = live_files(&table_dir);
    for path in files.keys() {
        assert!(table_dir.join(percent_decode(path)).is_file(), "the log lists `{path}`, which is gone");
    }
    assert_eq!(files.len(), 18, "the five days left and the new one: {files:#?}");
}

/// What the Python readers need to reach `server` (moto).
fn reader_env(server: &Server) -> Vec<(String, String)> {
    vec![
        ("AWS_ENDPOINT_URL".to_string(), server.endpoint()),
        ("AWS_ACCESS_KEY_ID".to_string(), KEY_ID.to_string()),
        ("AWS_SECRET_ACCESS_KEY".to_string(), SECRET_KEY.to_string()),
        ("AWS_SESSION_TOKEN".to_string(), SESSION_TOKEN.to_string()),
        ("AWS_REGION".to_string(), "us-east-1".to_string()),
    ]
}

#[test]
fn three_engines_share_one_delta_table_on_moto_s3() {
    let server = Server::moto();
    server.create_bucket("fleet");
    let env = reader_env(&server);
    let target = s3_target(&server.endpoint(), "fleet", "");
    fleet_archive(Fleet::open(policy(&target), "s3://fleet/archive/v1/delta/events".to_string(), env, None));
}

#[test]
fn the_log_is_checkpointed() {
    let dir = tempfile::tempdir().unwrap();
    let target = format!("[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", dir.path().display());
    let e = TestEngine::new(&policy(&target), NOW);
    // One day archived per pass: one commit each.
    let days = DELTA_CHECKPOINT_INTERVAL as i64 + 1;
    e.engine.append("events", records("2024-03-01T00:00:00Z", days, 1)).unwrap();
    for day in 0..=days {
        e.clock.set(t("2024-03-02T12:00:00Z") + day * 86_400_000_000);
        let report = e.pass();
        assert!(report.errors.is_empty(), "{report:?}");
    }
    // delta-rs checkpoints the version after every `interval` commits (version interval - 1).
    let log = dir.path().join("delta/events/_delta_log");
    let checkpoint = format!("{:020}.checkpoint.parquet", DELTA_CHECKPOINT_INTERVAL - 1);
    let names: Vec<_> = std::fs::read_dir(&log).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(log.join(&checkpoint).exists(), "{checkpoint} in {names:?}");
    assert!(log.join("_last_checkpoint").exists());
    let table = e.engine.policies().table("events").unwrap().clone();
    let report = runtime().block_on(sync(&e.engine.context(), &table)).unwrap();
    assert_eq!((report.added, report.removed), (0, 0), "read through the checkpoint, the log is whole: {report:?}");
    assert!(report.version >= DELTA_CHECKPOINT_INTERVAL as u64, "{report:?}");
}

/// A process killed just before its Delta commit, or just after it, leaves manifests the log
/// does not yet list, or a commit it never saw land: the next process's first pass catches the
/// log up, adds nothing twice, and `frostline delta sync` reports it in step.
#[test]
fn a_kill_around_a_delta_commit_is_caught_up_without_duplicates() {
    let root = tempfile::tempdir().unwrap();
    let (policies, data) = (root.path().join("policies"), root.path().join("data"));
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(
        policies.join("tables.toml"),
        "[[table]]\nid = \"events\"\nformat = \"parquet\"\nstrategy = { plugin = \"builtin:calendar-month-utc\" }\n\
         retention = { plugin = \"builtin:eligible-before\", config = { cutoff = \"2025-01-01T00:00:00Z\" } }\n\
         [[table]]\nid = \"notes\"\nstrategy = { plugin = \"builtin:calendar-month-utc\" }\n\
         retention = { plugin = \"builtin:eligible-before\", config = { cutoff = \"2025-01-01T00:00:00Z\" } }\n",
    )
    .unwrap();
    let (p, d) = (policies.to_str().unwrap(), data.to_str().unwrap());
    let run = |args: &[&str], failpoints: Option<&str>| {
        let mut command = Command::new(frostline_bin());
        command.args(args).args(["--data", d, "--policies", p]);
        match failpoints {
            Some(spec) => command.env("FROSTLINE_FAILPOINTS", spec),
            None => command.env_remove("FROSTLINE_FAILPOINTS"),
        };
        command.output().unwrap()
    };
    let files = || {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/integration/readers/read_delta.py");
        let out =
            Command::new(python()).arg(script).arg("files").arg(data.join("archive/delta/events")).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).trim().parse::<usize>().unwrap()
    };
    let input = root.path().join("in.jsonl");
    let month = |m: u32| -> String {
        (0..30)
            .map(|i| {
                format!(
                    "{{\"partition_key\":\"site\",\"event_time\":\"2024-{m:02}-02T00:00:{i:02}Z\",\"sort_key\":\"{i}\",\"body\":{{}}}}\n"
                )
            })
            .collect()
    };

    // Killed before the commit: the bucket is published, the log does not list it.
    std::fs::write(&input, month(1)).unwrap();
    assert!(run(&["ingest", "--table", "events", input.to_str().unwrap()], None).status.success());
    let killed = run(&["archive", "--once"], Some("before_delta_commit=return(abort)"));
    assert!(!killed.status.success(), "the fail point killed the pass: {}", text(&killed.stderr));
    assert!(text(&killed.stderr).contains("before_delta_commit"), "{}", text(&killed.stderr));
    assert_eq!(files(), 0, "published, not yet committed");
    // Killed after the commit of a second month: the log lists it, the process never knew.
    std::fs::write(&input, month(2)).unwrap();
    assert!(run(&["ingest", "--table", "events", input.to_str().unwrap()], None).status.success());
    let killed = run(&["archive", "--once"], Some("after_delta_commit=return(abort)"));
    assert!(!killed.status.success());
    assert_eq!(files(), 2, "the first pass of that process caught the first month up, then added the second");

    // The next process's first pass finds nothing to add twice.
    let pass = run(&["archive", "--once"], None);
    assert!(pass.status.success(), "{}", text(&pass.stderr));
    assert_eq!(files(), 2);
    let sync = run(&["delta", "rebuild"], None);
    assert!(sync.status.success(), "{}", text(&sync.stderr));
    let report: serde_json::Value = serde_json::from_str(text(&sync.stdout).trim()).unwrap();
    assert_eq!(
        (report["table"].as_str(), report["added"].as_u64(), report["removed"].as_u64()),
        (Some("events"), Some(0), Some(0))
    );

    // `status` shows the log's version and this installation's last commit (the killed
    // process never recorded its own: a third month is committed by a whole pass).
    std::fs::write(&input, month(3)).unwrap();
    assert!(run(&["ingest", "--table", "events", input.to_str().unwrap()], None).status.success());
    assert!(run(&["archive", "--once"], None).status.success());
    assert_eq!(files(), 3);
    let status = run(&["status", "--json"], None);
    assert!(status.status.success(), "{}", text(&status.stderr));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let tables = status["tables"].as_array().unwrap();
    let events = tables.iter().find(|t| t["id"] == "events").unwrap();
    assert_eq!(events["delta_log"]["version"].as_u64(), Some(2), "created, two months, the third: {events}");
    assert!(events["delta_log"]["last_commit_at"].is_string(), "{events}");
    assert!(events["delta_log"]["error"].is_null(), "{events}");
    assert!(tables.iter().find(|t| t["id"] == "notes").unwrap().get("delta_log").is_none());

    // A table without a Delta log is named as such.
    let refused = run(&["delta", "rebuild", "--table", "notes"], None);
    assert!(!refused.status.success());
    assert!(text(&refused.stderr).contains("has no Delta log: only Parquet tables"), "{}", text(&refused.stderr));
}

/// A fleet host whose data directory is lost: a new installation on the same policies leaves
/// the other hosts' archives alone (they may be alive), takes in the lost one's only when named,
/// and then answers for them in the log: their expiry removes them from it.
#[test]
fn a_lost_hosts_archives_are_adopted_only_when_named_and_expire_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let target = format!("[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", dir.path().display());
    let uri = dir.path().join("delta/events").display().to_string();
    let fleet = Fleet::open(policy(&target), uri, Vec::new(), None);
    for (n, e) in fleet.engines.iter().enumerate() {
        e.engine.append("events", engine_records(n)).unwrap();
    }
    fleet.passes();
    fleet.set_clock("2024-03-10T00:00:00Z");
    fleet.passes();
    assert_eq!(fleet.files(None).unwrap(), ENGINES * 9);
    let Fleet { uri, env, local_root, mut engines } = fleet;
    let lost = engines.pop().unwrap();
    let lost_id = lost.engine.installation_id().to_string();
    let alive: std::collections::BTreeSet<String> =
        engines.iter().map(|e| e.engine.installation_id().to_string()).collect();
    let replacement = lost.rebuild().unwrap();
    assert_ne!(replacement.engine.installation_id(), lost_id);

    let adopt = |from: &[String]| {
        runtime().block_on(frostline::archive::adopt::adopt(&replacement.engine.context(), false, from)).unwrap()
    };
    let report = adopt(&[]);
    assert_eq!(report.adopted, 0, "{report:?}");
    let mut others = alive.clone();
    others.insert(lost_id.clone());
    assert_eq!(report.other_installations, others, "every other host is named, none taken in");
    let report = adopt(std::slice::from_ref(&lost_id));
    assert_eq!(report.adopted, 9, "{report:?}");
    assert_eq!(report.other_installations, alive, "the live hosts' archives stay theirs");

    // Expiry everywhere: the replacement removes the adopted files from the log.
    engines.push(replacement);
    let fleet = Fleet { uri, env, local_root, engines };
    fleet.set_clock("2024-04-15T00:00:00Z");
    let mut expired = vec![0; ENGINES];
    for _ in 0..3 {
        for (n, report) in fleet.passes().into_iter().enumerate() {
            assert!(report.errors.is_empty(), "{report:?}");
            expired[n] += report.expired;
        }
    }
    assert_eq!(expired, vec![9; ENGINES]);
    assert_eq!(fleet.files(None).unwrap(), 0, "no expired file is left in the log");
}

/// Regression (issue: the Delta log drops another installation's files): one adopted manifest
/// below `installation=X/` made the whole folder the adopter's, so its syncs removed every file
/// of X it did not publish (X's own later files, X being alive), and a lite VACUUM then deleted
/// them: the only copy. A sync now removes only entries of files its own database recorded.
#[test]
fn a_sync_after_an_adoption_removes_nothing_of_the_live_installation_and_vacuum_keeps_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let target = format!("[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", dir.path().display());
    let uri = dir.path().join("delta/events").display().to_string();
    let mut fleet = Fleet::open(policy(&target), uri, Vec::new(), None);
    for (n, e) in fleet.engines.iter().enumerate() {
        e.engine.append("events", engine_records(n)).unwrap();
    }
    fleet.passes();
    fleet.set_clock("2024-03-10T00:00:00Z");
    fleet.passes();
    assert_eq!(fleet.files(None).unwrap(), ENGINES * 9);

    // A new host adopts the archives of a host that is in fact alive (named as lost by mistake).
    let adopter = TestEngine::open(&policy(&target), "2024-03-10T00:00:00Z", &SECRET_FILES, Default::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let live = fleet.engines[0].engine.installation_id().to_string();
    let report = runtime()
        .block_on(frostline::archive::adopt::adopt(&adopter.engine.context(), false, std::slice::from_ref(&live)))
        .unwrap();
    assert_eq!(report.adopted, 9, "{report:?}");
    fleet.engines.push(adopter);
    // The live host archives another day; then every host syncs its log.
    let later: Vec<Record> = records("2024-03-04T00:00:00Z", 1, 12)
        .into_iter()
        .map(|mut r| {
            r.sort_key = format!("late-{}", String::from_utf8_lossy(&r.sort_key)).into_bytes();
            r
        })
        .collect();
    fleet.engines[0].engine.append("events", later.clone()).unwrap();
    for report in fleet.passes() {
        assert!(report.errors.is_empty(), "{report:?}");
    }
    for e in &fleet.engines {
        let table = e.engine.policies().table("events").unwrap().clone();
        runtime().block_on(sync(&e.engine.context(), &table)).unwrap();
    }
    assert_eq!(fleet.files(None).unwrap(), ENGINES * 9 + 3, "the live host's later files stay in the log");

    let out = fleet.read("vacuum", None);
    assert!(out.status.success(), "vacuum: {}", text(&out.stderr));
    let deleted: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(deleted.is_empty(), "a lite VACUUM deletes nothing any installation's manifests name: {deleted:?}");
    let live_records = fleet.engines[0].query_all("events");
    assert_eq!(live_records.len(), 36 + 12, "the live host reads all it archived");
    let mut read = fleet.records("deltalake", None);
    let mut expected = fleet.expected();
    read.retain(|r| r["sort_key"].as_str().unwrap().starts_with("late-"));
    expected.retain(|r| r["sort_key"].as_str().unwrap().starts_with("late-"));
    assert_eq!(read.len(), 12);
    assert_eq!(read, expected);
}

/// Regression (issue: a restored backup drops the other copy's files from the Delta log): a
/// data directory restored from a backup shares its installation's folder with the copy that
/// went on; its sync took every file of that folder it did not publish for its own and
/// removed the other copy's later files, which a lite VACUUM then deleted. It now removes only
/// entries of files its own database recorded.
#[test]
fn a_restored_copys_sync_keeps_the_files_the_other_copy_archived_after_the_backup() {
    // A device key as users have them: a `/`, a `%`, a space and non-ASCII.
    const DEVICE: &str = "site-a/100% é";
    use crate::replan::{Site, copy_dir, record};
    use frostline::settings::Settings;
    let shared = tempfile::tempdir().unwrap();
    let target = format!("[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", shared.path().display());
    let site = Site::new(&policy(&target), "2024-03-01T12:00:00Z");
    let files = || {
        let uri = shared.path().join("delta/events").display().to_string();
        let fleet = Fleet { uri, env: Vec::new(), local_root: None, engines: Vec::new() };
        fleet.files(None).unwrap()
    };
    let engine = site.open(Settings::default());
    engine.append("events", vec![record(DEVICE, "2024-03-01T01:00:00Z", None)]).unwrap();
    site.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(crate::support::run_pass(&engine).archived, 1);
    drop(engine);
    let backup = site.root.path().join("backup");
    copy_dir(&site.data(), &backup);
    // The copy that goes on archives another bucket after the backup.
    let engine = site.open(Settings::default());
    engine.append("events", vec![record(DEVICE, "2024-03-03T01:00:00Z", None)]).unwrap();
    site.clock.set(t("2024-03-05T00:00:00Z"));
    assert_eq!(crate::support::run_pass(&engine).archived, 1);
    drop(engine);
    assert_eq!(files(), 2);
    // The backup replaces it and archives a record of its own for the same bucket.
    std::fs::remove_dir_all(site.data()).unwrap();
    copy_dir(&backup, &site.data());
    let restored = site.open(Settings::default());
    restored.append("events", vec![record(DEVICE, "2024-03-03T02:00:00Z", None)]).unwrap();
    assert_eq!(crate::support::run_pass(&restored).archived, 1);
    let table = restored.policies().table("events").unwrap().clone();
    runtime().block_on(sync(&restored.context(), &table)).unwrap();
    assert_eq!(files(), 3, "the other copy's later file stays in the log beside the restored copy's");
    let uri = shared.path().join("delta/events").display().to_string();
    let out = Fleet { uri, env: Vec::new(), local_root: None, engines: Vec::new() }.read("vacuum", None);
    assert!(out.status.success(), "vacuum: {}", text(&out.stderr));
    let deleted: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(deleted.is_empty(), "a lite VACUUM deletes nothing either copy archived: {deleted:?}");
}

/// What "done" means for the fleet archive: three engines, each a process with its own data
/// directory and installation, archive one table into one moto bucket at the same time, and
/// each is killed once just before and once just after a Delta commit (fail points that abort
/// the process, in rounds, so every engine dies on both sides of a commit while the others
/// race it). A last round without kills settles; then the Delta table, read by delta-rs's
/// Python package and by polars, holds exactly the union of the three engines' `frostline
/// query` answers, each file once, and a rebuild on any engine finds nothing to add.
#[test]
fn three_engines_killed_around_their_commits_share_one_delta_table_on_moto_s3() {
    const ROUNDS: usize = 4;
    let server = Server::moto();
    server.create_bucket("crashfleet");
    let root = tempfile::tempdir().unwrap();
    let policies = root.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    let target = s3_target(&server.endpoint(), "crashfleet", "");
    std::fs::write(
        policies.join("tables.toml"),
        format!(
            "{target}\n[[table]]\nid = \"events\"\nformat = \"parquet\"\ntarget = \"cold\"\n\
             strategy = {{ plugin = \"builtin:calendar-day-utc\" }}\n\
             retention = {{ plugin = \"builtin:eligible-before\", config = {{ cutoff = \"2025-01-01T00:00:00Z\" }} }}\n"
        ),
    )
    .unwrap();
    for (path, content) in SECRET_FILES {
        let path = policies.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    let data: Vec<_> = (0..ENGINES).map(|n| root.path().join(format!("data-{n}"))).collect();
    let command = |n: usize, args: &[&str], failpoints: Option<&str>| {
        let mut command = Command::new(frostline_bin());
        command.args(args).arg("--data").arg(&data[n]).arg("--policies").arg(&policies);
        match failpoints {
            Some(spec) => command.env("FROSTLINE_FAILPOINTS", spec),
            None => command.env_remove("FROSTLINE_FAILPOINTS"),
        };
        command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        command
    };
    let run = |n: usize, args: &[&str]| {
        let out = command(n, args, None).output().unwrap();
        assert!(out.status.success(), "engine {n} {args:?}: {}", text(&out.stderr));
        out
    };
    // Round r's records of engine n: one day of 2024 in two partitions, sort keys of its own.
    let ingest = |n: usize, round: usize| {
        let input = root.path().join(format!("in-{n}-{round}.jsonl"));
        let lines: String = (0..20)
            .map(|i| {
                format!(
                    "{{\"partition_key\":\"site-{}\",\"event_time\":\"2024-01-{:02}T00:00:{i:02}Z\",\"sort_key\":\"e{n}-{i}\",\"body\":{{\"n\":{i}}}}}\n",
                    i % 2,
                    round + 1
                )
            })
            .collect();
        std::fs::write(&input, lines).unwrap();
        run(n, &["ingest", "--table", "events", input.to_str().unwrap()]);
    };

    let mut killed = [[false; 2]; ENGINES];
    for round in 0..=ROUNDS {
        for n in 0..ENGINES {
            ingest(n, round);
        }
        // In the last round nobody dies; before it, engine `round` dies before its commit and
        // the next one after it, while the third archives beside them.
        let fail_point = |n: usize| match (round < ROUNDS).then(|| (n + ENGINES - round % ENGINES) % ENGINES) {
            Some(0) => Some("before_delta_commit"),
            Some(1) => Some("after_delta_commit"),
            _ => None,
        };
        let passes: Vec<_> = (0..ENGINES)
            .map(|n| {
                let spec = fail_point(n).map(|point| format!("{point}=return(abort)"));
                command(n, &["archive", "--once"], spec.as_deref()).spawn().unwrap()
            })
            .collect();
        for (n, pass) in passes.into_iter().enumerate() {
            let out = pass.wait_with_output().unwrap();
            match fail_point(n) {
                Some(point) => {
                    assert!(!out.status.success(), "engine {n} round {round}: {point} did not kill the pass");
                    assert!(text(&out.stderr).contains(point), "engine {n}: {}", text(&out.stderr));
                    killed[n][usize::from(point == "after_delta_commit")] = true;
                }
                None => assert!(out.status.success(), "engine {n} round {round}: {}", text(&out.stderr)),
            }
        }
    }
    assert_eq!(killed, [[true; 2]; ENGINES], "every engine died on both sides of a commit");

    // Nothing is missing from the log and nothing is in it twice.
    for n in 0..ENGINES {
        let out = run(n, &["delta", "rebuild"]);
        let report: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
        assert_eq!((report["added"].as_u64(), report["removed"].as_u64()), (Some(0), Some(0)), "engine {n}: {report}");
    }
    let mut expected = Vec::new();
    for n in 0..ENGINES {
        let status: serde_json::Value = serde_json::from_slice(&run(n, &["status", "--json"]).stdout).unwrap();
        let installation = status["installation_id"].as_str().unwrap().to_string();
        let page = run(n, &["query", "--table", "events", "--limit", "100000"]);
        for line in text(&page.stdout).lines() {
            let mut record: serde_json::Value = serde_json::from_str(line).unwrap();
            record["_delta"] = serde_json::json!({
                "installation": installation,
                "partition": record["partition_key"].clone(),
            });
            expected.push(record);
        }
    }
    assert_eq!(expected.len(), ENGINES * (ROUNDS + 1) * 20, "every engine answers for all it ingested");
    let key = |r: &serde_json::Value| {
        (
            r["event_time"].as_i64(),
            r["sort_key"].as_str().map(String::from),
            r["partition_key"].as_str().map(String::from),
        )
    };
    expected.sort_by_key(key);
    let env = [
        ("AWS_ENDPOINT_URL", server.endpoint()),
        ("AWS_ACCESS_KEY_ID", KEY_ID.to_string()),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
        ("AWS_SESSION_TOKEN", SESSION_TOKEN.to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
    ];
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/integration/readers/read_delta.py");
    let uri = "s3://crashfleet/archive/v1/delta/events";
    let read = |reader: &str| {
        let out = Command::new(python()).arg(&script).args([reader, uri]).envs(env.clone()).output().unwrap();
        assert!(out.status.success(), "{reader}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    assert_eq!(read("files").trim(), (ENGINES * (ROUNDS + 1) * 2).to_string(), "one file per bucket, none twice");
    for reader in ["deltalake", "polars"] {
        let mut buckets = std::collections::BTreeSet::new();
        let got: Vec<serde_json::Value> = read(reader)
            .lines()
            .map(|line| {
                let mut record: serde_json::Value = serde_json::from_str(line).unwrap();
                let bucket = record["_delta"].as_object_mut().unwrap().remove("bucket").unwrap();
                buckets.insert((record["_delta"]["installation"].clone().to_string(), bucket.to_string()));
                record
            })
            .collect();
        assert_eq!(got, expected, "{reader} reads the union of the engines' queries");
        assert_eq!(buckets.len(), ENGINES * (ROUNDS + 1), "{reader}: a day bucket per round and installation");
    }
}

/// Partition keys of the shapes device keys take, each needing something of the path
/// encoding: a `/` (the common shape), every character a URI or Hive reserves, a key that
/// already looks encoded (decoded twice it would be `/`), non-ASCII, Hive's null and its
/// escapes, and one whose folder is the hashed `~<sha>` form. `site` needs no encoding.
fn odd_partition_keys() -> Vec<String> {
    let mut keys: Vec<String> = [
        "site",
        "site-a/sensor-0",
        "100%",
        "%2F",
        "k=v",
        "#1",
        "why?",
        "two words",
        "it's \"quoted\"",
        "capteur-é/øst",
        "東京",
        "",
        "__HIVE_DEFAULT_PARTITION__",
        "_x",
        "~",
        "..",
    ]
    .map(String::from)
    .to_vec();
    keys.push("site/".repeat(30)); // 210 bytes encoded: written as `~<sha>`
    keys
}

/// A table archived from one engine on a local directory, two records per partition key.
fn odd_keys_fleet(dir: &Path) -> Fleet {
    let target = format!("[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", dir.display());
    let uri = dir.join("delta/events").display().to_string();
    odd_keys_archive(&target, uri, Vec::new(), Some(dir.to_path_buf()))
}

/// A table archived from one engine on `target`, two records per partition key.
fn odd_keys_archive(
    target: &str,
    uri: String,
    env: Vec<(String, String)>,
    local_root: Option<std::path::PathBuf>,
) -> Fleet {
    let e = TestEngine::open(&policy(target), NOW, &SECRET_FILES, Default::default()).unwrap_or_else(|e| panic!("{e}"));
    let keys = odd_partition_keys();
    let mut rows = Vec::new();
    for (n, key) in keys.iter().enumerate() {
        for i in 0..2 {
            rows.push(Record {
                partition_key: key.clone().into_bytes(),
                event_time: t("2024-03-01T00:00:00Z") + (n as i64 * 2 + i) * 1_000_000,
                sort_key: format!("{n:02}-{i}").into_bytes(),
                tenant: None,
                kind: None,
                body: format!(r#"{{"n":{n}}}"#),
            });
        }
    }
    e.engine.append("events", rows).unwrap();
    assert!(e.pass().errors.is_empty()); // plans
    e.clock.set(t("2024-03-10T00:00:00Z"));
    let report = e.pass();
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(report.archived, keys.len() as u64, "one bucket per partition key: {report:?}");
    Fleet { uri, env, local_root, engines: vec![e] }
}

/// What delta-rs returns: every record, with its real partition key as the `partition`
/// column (an empty key is a null partition value), as the log's `partitionValues` say.
fn odd_keys_expected(fleet: &Fleet) -> Vec<serde_json::Value> {
    let mut expected = fleet.expected();
    for record in &mut expected {
        if record["partition_key"] == "" {
            record["_delta"]["partition"] = serde_json::Value::Null;
        }
    }
    assert_eq!(expected.len(), 2 * odd_partition_keys().len());
    expected
}

/// The `partition` value a reader that takes partition values from the folder names, like
/// Hive (polars 2.1 does, ignoring the log's `partitionValues`), reads for `key`: the folder's
/// value decoded once, Hive's null name as null. That is the key itself except for the two
/// keys no folder name can give back: the literal `__HIVE_DEFAULT_PARTITION__` (its escaped
/// folder decodes to Hive's null) and a key whose folder is its hash.
fn partition_from_folder(key: &str) -> serde_json::Value {
    let value = percent_decode(&frostline::storage::keys::delta_partition_value(key.as_bytes()));
    if value == frostline::storage::keys::DELTA_NULL_PARTITION_VALUE {
        return serde_json::Value::Null;
    }
    if value != key {
        assert!(key == frostline::storage::keys::DELTA_NULL_PARTITION_VALUE || value.starts_with('~'), "{key:?}");
    }
    value.into()
}

/// Reads the table with delta-rs and polars: every record of every partition comes back.
fn assert_read_back(fleet: &Fleet, expected: &[serde_json::Value]) {
    assert_eq!(fleet.records("deltalake", None), expected, "deltalake reads every record of every partition");
    let from_folders: Vec<serde_json::Value> = expected
        .iter()
        .map(|record| {
            let mut record = record.clone();
            record["_delta"]["partition"] = partition_from_folder(record["partition_key"].as_str().unwrap());
            record
        })
        .collect();
    assert_eq!(fleet.records("polars", None), from_folders, "polars reads every record of every partition");
}

/// Decodes `%XX` escapes once (the Delta protocol's `path` is a URI).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match hex.filter(|_| bytes[i] == b'%').and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

/// The files the newest version of a local Delta table lists: raw `path` and partition
/// values of each `add` not removed since, replaying the JSON commits in order.
fn live_files(table_dir: &Path) -> std::collections::BTreeMap<String, serde_json::Value> {
    let log = table_dir.join("_delta_log");
    let mut commits: Vec<_> = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    commits.sort();
    let mut files = std::collections::BTreeMap::new();
    for commit in commits {
        for line in std::fs::read_to_string(&commit).unwrap().lines() {
            let action: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Some(add) = action.get("add") {
                files.insert(add["path"].as_str().unwrap().to_string(), add["partitionValues"].clone());
            } else if let Some(remove) = action.get("remove") {
                files.remove(remove["path"].as_str().unwrap());
            }
        }
    }
    files
}

/// Every file the log lists is its object's key percent-encoded once, and carries the real
/// partition key as its partition value.
fn assert_log_names_every_object(table_dir: &Path) {
    let keys = odd_partition_keys();
    let files = live_files(table_dir);
    assert_eq!(files.len(), keys.len(), "{files:#?}");
    assert!(files.keys().any(|path| path.contains("/partition=~")), "the long key's folder is its hash: {files:#?}");
    let mut partitions = std::collections::BTreeSet::new();
    for (path, values) in &files {
        let decoded = percent_decode(path);
        assert!(table_dir.join(&decoded).is_file(), "`{path}` decoded once is `{decoded}`, which is no object");
        assert_eq!(path, &decoded.replace('%', "%25"), "only a key's `%` is encoded, once");
        partitions.insert(values["partition"].as_str().unwrap_or("").to_string());
    }
    assert_eq!(partitions, keys.into_iter().collect(), "partition values are the real keys");
}

/// Regression: the log's `add.path` encoded a key's `%` twice more than once
/// (`partition=site-a%25252Fsensor-0` for the folder `partition=site-a%2Fsensor-0`), so
/// delta-rs and polars found no file of any partition whose key needs encoding.
#[test]
fn partition_keys_that_need_encoding_are_read_back_by_delta_readers() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = odd_keys_fleet(dir.path());
    assert_read_back(&fleet, &odd_keys_expected(&fleet));
    assert_log_names_every_object(&dir.path().join("delta/events"));
}

/// The same on S3 (moto), where a key's `%` travels URL-encoded in every request.
#[test]
fn partition_keys_that_need_encoding_are_read_back_by_delta_readers_on_moto_s3() {
    let server = Server::moto();
    server.create_bucket("odd");
    let env = reader_env(&server);
    let target = s3_target(&server.endpoint(), "odd", "");
    let fleet = odd_keys_archive(&target, "s3://odd/archive/v1/delta/events".to_string(), env, None);
    assert_read_back(&fleet, &odd_keys_expected(&fleet));
}

/// A table written before the fix: every `path` of its log is what the old encoding wrote
/// (the key's `%` encoded twice more: `%2F` as `%25252F`), from the log of `table_dir`.
fn encode_paths_as_before_the_fix(table_dir: &Path) {
    for entry in std::fs::read_dir(table_dir.join("_delta_log")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let mut text = String::new();
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let mut action: serde_json::Value = serde_json::from_str(line).unwrap();
            for kind in ["add", "remove"] {
                if let Some(file) = action.get_mut(kind) {
                    file["path"] = file["path"].as_str().unwrap().replace('%', "%25").into();
                }
            }
            text.push_str(&format!("{action}\n"));
        }
        std::fs::write(&path, text).unwrap();
    }
}

/// A log written with the doubly encoded paths is repaired in place by the next sync (what
/// `frostline delta rebuild` and a process's first pass run): one commit replaces each bad
/// path by the right one, the files of keys that need no encoding stay as they are, and the
/// readers read every record again.
#[test]
fn a_log_with_doubly_encoded_paths_is_repaired_by_the_next_sync() {
    let dir = tempfile::tempdir().unwrap();
    let table_dir = dir.path().join("delta/events");
    let mut fleet = odd_keys_fleet(dir.path());
    encode_paths_as_before_the_fix(&table_dir);
    // The log is one an earlier build wrote: the engine of this build starts on it.
    let restarted = fleet.engines.remove(0).restart().unwrap();
    fleet.engines.insert(0, restarted);
    let bad = live_files(&table_dir);
    let needing_encoding = bad.keys().filter(|p| p.contains('%')).count();
    assert!(needing_encoding < bad.len(), "some paths need no encoding, and stay as they are");
    assert!(bad.keys().any(|p| p.contains("partition=site-a%25252Fsensor-0/")), "{bad:#?}");
    let broken = fleet.read("deltalake", None);
    assert!(!broken.status.success(), "the old log cannot be read: {}", text(&broken.stdout));
    assert!(text(&broken.stderr).contains("No such file"), "{}", text(&broken.stderr));

    let e = &fleet.engines[0];
    let table = e.engine.policies().table("events").unwrap().clone();
    let report = runtime().block_on(sync(&e.engine.context(), &table)).unwrap();
    assert_eq!((report.repaired, report.added, report.removed), (needing_encoding, 0, 0), "{report:?}");
    // One commit, a remove and an add per file, none a change of the table's data.
    let commit = std::fs::read_to_string(table_dir.join(format!("_delta_log/{:020}.json", report.version))).unwrap();
    let actions: Vec<serde_json::Value> = commit.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(actions[0]["commitInfo"]["operation"], "FSCK", "{commit}");
    for kind in ["remove", "add"] {
        let files: Vec<_> = actions.iter().filter_map(|a| a.get(kind)).collect();
        assert_eq!(files.len(), needing_encoding, "{commit}");
        assert!(files.iter().all(|f| f["dataChange"] == false), "{commit}");
    }
    assert_log_names_every_object(&table_dir);
    assert_read_back(&fleet, &odd_keys_expected(&fleet));
    assert_eq!(fleet.files(None).unwrap(), odd_partition_keys().len());
    let again = runtime().block_on(sync(&e.engine.context(), &table)).unwrap();
    assert_eq!((again.repaired, again.added, again.removed), (0, 0, 0), "{again:?}");
}

/// Three engines that archived their records (nine buckets each) into one Delta table on a
/// local directory: the directory (kept alive), the table's folder and the fleet.
fn archived_fleet_on_a_local_directory() -> (tempfile::TempDir, std::path::PathBuf, Fleet) {
    let dir = tempfile::tempdir().unwrap();
    let target = format!("[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", dir.path().display());
    let table_dir = dir.path().join("delta/events");
    let fleet = Fleet::open(policy(&target), table_dir.display().to_string(), Vec::new(), None);
    for (n, e) in fleet.engines.iter().enumerate() {
        e.engine.append("events", engine_records(n)).unwrap();
    }
    fleet.passes();
    fleet.set_clock("2024-03-10T00:00:00Z");
    fleet.passes();
    (dir, table_dir, fleet)
}

/// A late record for an archived bucket (issue: archives that can change): the next
/// generation's file replaces the last one's in one commit (`UPDATE`, a remove and an add), so
/// delta-rs and polars read the bucket's rows before it or after it, never without them.
#[test]
fn a_late_record_replaces_its_buckets_file_in_one_delta_commit() {
    let (_dir, table_dir, fleet) = archived_fleet_on_a_local_directory();
    let before = live_files(&table_dir);
    assert_eq!(before.len(), ENGINES * 9);
    let e = &fleet.engines[0];
    let mut late = engine_records(0)[0].clone();
    late.sort_key = "late".into();
    late.event_time += 1;
    assert_eq!(e.engine.append("events", vec![late]).unwrap().appended, 1);
    assert_eq!(e.pass().archived, 0, "the next generation waits for the late grace");
    fleet.set_clock("2024-03-10T00:10:00Z");
    let report = e.pass();
    assert_eq!(report.archived, 1, "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    let version = versions(&fleet);
    let commit = std::fs::read_to_string(table_dir.join(format!("_delta_log/{version:020}.json"))).unwrap();
    let actions: Vec<serde_json::Value> = commit.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(actions[0]["commitInfo"]["operation"], "UPDATE", "{commit}");
    let removed: Vec<&str> =
        actions.iter().filter_map(|a| a.get("remove")).map(|r| r["path"].as_str().unwrap()).collect();
    let added: Vec<&str> = actions.iter().filter_map(|a| a.get("add")).map(|a| a["path"].as_str().unwrap()).collect();
    assert_eq!((removed.len(), added.len()), (1, 1), "{commit}");
    assert!(before.contains_key(removed[0]) && !before.contains_key(added[0]), "{commit}");
    let after = live_files(&table_dir);
    assert_eq!(after.len(), ENGINES * 9, "one file replaced, none added beside it");
    // The store keeps one manifest per bucket: the replaced archive's copy went once the sync
    // had removed its file from the log.
    let store = e.engine.store();
    for meta in store.buckets("events", None).unwrap() {
        let copies = store.snapshot().unwrap().manifests_of(&meta.id).unwrap().len();
        assert_eq!(copies, 1, "{}: {copies} manifests recorded", meta.id);
    }
    let expected = fleet.expected();
    assert_eq!(expected.len(), ENGINES * 36 + 1);
    for reader in ["deltalake", "polars"] {
        assert_eq!(fleet.records(reader, None), expected, "{reader} reads the late record with the others");
    }
}

/// Erasure in a Delta table: each bucket of engine 0 that held tenant `acme` gets a next
/// generation without its records, committed as a remove and an add, and only then are the
/// replaced files deleted; delta-rs and polars read every other record (the other engines'
/// `acme` records included: an erasure placed on one engine reaches its own archives), and no
/// live or deleted file of engine 0 holds an `acme` row.
#[test]
fn an_erasure_replaces_the_files_that_held_its_records_and_readers_see_none_of_them() {
    let (_dir, table_dir, fleet) = archived_fleet_on_a_local_directory();
    let before = live_files(&table_dir);
    let e = &fleet.engines[0];
    let selector = frostline::store::erasure::ErasureSelector { tenant: Some("acme".into()), ..Default::default() };
    let request = crate::support::erasure_request("e-delta", selector);
    use frostline::clock::Clock;
    e.engine.store().place_erasure(request, e.clock.now()).unwrap();
    let report = e.pass();
    assert!(report.errors.is_empty(), "{report:?}");
    let receipt = e.engine.store().erasure("e-delta").unwrap().unwrap();
    assert!(!receipt.is_open(), "{receipt:?}");
    let after = live_files(&table_dir);
    assert_eq!(after.len(), before.len(), "each file replaced, none added beside it");
    let replaced: Vec<&String> = before.keys().filter(|k| !after.contains_key(*k)).collect();
    assert_eq!(replaced.len(), 9, "engine 0's nine bucket files each held an acme record");
    for path in &replaced {
        let file = table_dir.join(percent_decode(path));
        assert!(!file.exists(), "the replaced file `{}` is deleted", file.display());
    }
    let expected = fleet.expected();
    let installation = e.engine.installation_id().to_string();
    assert_eq!(expected.len(), ENGINES * 36 - 18, "{installation}");
    for reader in ["deltalake", "polars"] {
        assert_eq!(fleet.records(reader, None), expected, "{reader} reads none of the erased records");
    }
}

/// An erasure placed on one engine of a fleet reaches every installation's archives on the
/// shared target, each installation erasing only its own objects (issue: archives that can
/// change, "a fleet forgets together"): three engines on one moto bucket, the third stopped
/// while the request is placed. The two running engines finish it and leave their receipts; the
/// request's fleet view names the third as behind; once it starts again its first pass picks the
/// request up and finishes it, and delta-rs and polars read no erased row.
#[test]
fn an_erasure_placed_on_one_engine_reaches_every_installation_on_the_shared_target() {
    use frostline::clock::Clock as _;
    let server = Server::moto();
    server.create_bucket("forget");
    let target = s3_target(&server.endpoint(), "forget", "");
    // Every host of the fleet is given the same key; the target names the request's values
    // only by digests under it.
    let key_dir = tempfile::tempdir().unwrap();
    let key_file = key_dir.path().join("fleet.key");
    std::fs::write(&key_file, "5f0c7e2a9b14d3e8a6c1f0b27d49e85a3c6b0f1e9d2a7c4b8e5f3a1d0c9b7e26\n").unwrap();
    let settings = frostline::settings::Settings { share_erasures: Some(key_file), ..Default::default() };
    let engines = (0..ENGINES)
        .map(|_| {
            TestEngine::open_with_settings(&policy(&target), NOW, &SECRET_FILES, Default::default(), settings.clone())
                .unwrap()
        })
        .collect();
    let uri = "s3://forget/archive/v1/delta/events".to_string();
    let mut fleet = Fleet { uri, env: reader_env(&server), local_root: None, engines };
    for (n, e) in fleet.engines.iter().enumerate() {
        e.engine.append("events", engine_records(n)).unwrap();
    }
    fleet.passes();
    fleet.set_clock("2024-03-10T00:00:00Z");
    for report in fleet.passes() {
        assert_eq!(report.archived, 9, "{report:?}");
    }
    let acme = |records: &[serde_json::Value]| records.iter().filter(|r| r["tenant"] == "acme").count();
    let before = fleet.records("deltalake", None);
    let per_engine = acme(&before) / ENGINES;
    assert!(per_engine > 0 && acme(&before) == ENGINES * per_engine, "each engine archived acme records");
    let installations: Vec<String> = fleet.engines.iter().map(|e| e.engine.context().installation_id.clone()).collect();

    let third = fleet.engines.pop().unwrap();
    let third = third
        .stopped_while(|| {
            let first = &fleet.engines[0];
            let selector = ErasureSelector { tenant: Some("acme".into()), ..Default::default() };
            let request = crate::support::erasure_request("e-fleet", selector);
            first.engine.store().place_erasure(request, first.clock.now()).unwrap();
            for _ in 0..3 {
                for report in fleet.passes() {
                    assert!(report.errors.is_empty(), "{report:?}");
                }
            }
            for e in &fleet.engines {
                let receipt = frostline::ops::erasure::erasure(&e.engine, "e-fleet").unwrap();
                assert!(!receipt.is_open(), "{receipt:?}");
                let [target] = receipt.fleet.as_slice() else { panic!("one shared target: {:?}", receipt.fleet) };
                let finished: Vec<&str> = target.finished.iter().map(|r| r.installation.as_str()).collect();
                assert_eq!(finished.len(), 2, "{target:?}");
                assert!(finished.contains(&installations[0].as_str()) && finished.contains(&installations[1].as_str()));
                assert_eq!(target.behind, vec![installations[2].clone()], "the stopped engine is behind");
                assert!(target.finished.iter().all(|r| r.archived_rows_erased == per_engine as u64), "{target:?}");
            }
        })
        .unwrap();
    // The target names the request only by digests: no object of the exchange holds the
    // tenant, and the request names no reason or requester.
    let backend = fleet.engines[0].backend("events");
    let shared = frostline::storage::block_on(backend.list("_frostline-erasures/")).unwrap();
    assert!(shared.iter().any(|o| o.key.ends_with("e-fleet/request.json")), "{shared:?}");
    for object in &shared {
        let bytes = frostline::storage::block_on(backend.get(&object.key)).unwrap().unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains("acme") && !text.contains("reason"), "{}: {text}", object.key);
    }
    // The stopped engine's archives still hold its acme records until it runs again.
    let read = fleet.records("deltalake", None);
    assert_eq!(acme(&read), per_engine, "only the stopped installation's acme rows are left");
    fleet.engines.push(third);
    for _ in 0..3 {
        for report in fleet.passes() {
            assert!(report.errors.is_empty(), "{report:?}");
        }
    }
    let receipt = frostline::ops::erasure::erasure(&fleet.engines[2].engine, "e-fleet").unwrap();
    assert!(!receipt.is_open(), "the restarted engine picked the request up and finished it: {receipt:?}");
    let [target] = receipt.fleet.as_slice() else { panic!("{:?}", receipt.fleet) };
    assert_eq!(target.finished.len(), ENGINES, "{target:?}");
    assert!(target.behind.is_empty(), "{target:?}");
    let expected = fleet.expected();
    assert_eq!(expected.len(), before.len() - ENGINES * per_engine, "every other record is still there");
    for reader in ["deltalake", "polars"] {
        let read = fleet.records(reader, None);
        assert_eq!(acme(&read), 0, "{reader} reads no erased row");
        assert_eq!(read, expected, "{reader}");
    }
}

//! The crash harness: the real binary, killed again and again (SIGKILL at random times, and
//! `abort()` at random fail points) while appends flow in over HTTP and passes run. After every
//! crash the harness reopens the data directory itself and checks the invariants against its
//! own record of every acknowledged append:
//!
//! - every acknowledged record is readable exactly once, with its exact body;
//! - a record whose append had no answer (the process died) is readable at most once, intact;
//! - no manifest names a missing or different object (every archive verifies);
//! - no object is ever overwritten (its bytes never change once seen);
//! - no bucket is published twice with different manifests;
//! - no hot row is gone without a published manifest holding it.
//!
//! CI runs `FROSTLINE_CRASHES` (default 50) crashes. The long run:
//!     FROSTLINE_CRASHES=1000 cargo test --test integration crash -- --nocapture

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use frostline::model::BucketState;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

use crate::support::*;

const CRASHES_DEFAULT: usize = 50;
const DAY_US: i64 = 86_400_000_000;
const POLICY: &str = r#"
[[table]]
id = "c"
strategy = { plugin = "builtin:calendar-day-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1s" } }
"#;

type Identity = (String, i64, String);

#[derive(Default)]
struct Model {
    acknowledged: BTreeMap<Identity, String>,
    /// Sent without an answer: may or may not have committed.
    unknown: BTreeMap<Identity, String>,
    next_day: i64,
}

fn spawn_engine(data: &Path, policies: &Path, failpoints: Option<&str>) -> Child {
    let _ = std::fs::remove_file(data.join("frostline.addr"));
    let mut command = Command::new(frostline_bin());
    command
        .args(["run", "--listen", "127.0.0.1:0", "--interval-seconds", "1", "--lease-seconds", "3"])
        .arg("--data")
        .arg(data)
        .arg("--policies")
        .arg(policies)
        .env_remove("FROSTLINE_TOKENS")
        .env_remove("FROSTLINE_ADMIN_TOKENS")
        .env("FROSTLINE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match failpoints {
        Some(spec) => command.env("FROSTLINE_FAILPOINTS", spec),
        None => command.env_remove("FROSTLINE_FAILPOINTS"),
    };
    command.spawn().expect("starting frostline run")
}

fn wait_for_addr(data: &Path, child: &mut Child) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(text) = std::fs::read_to_string(data.join("frostline.addr"))
            && !text.trim().is_empty()
        {
            return Some(text.trim().to_string());
        }
        if child.try_wait().unwrap().is_some() {
            return None; // died during start (a fail point can fire in the first pass)
        }
        assert!(Instant::now() < deadline, "the engine never published its address");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Appends batches until told to stop, recording what was acknowledged.
fn appender(addr: String, model: Arc<Mutex<Model>>, stop: Arc<AtomicBool>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into();
    while !stop.load(Ordering::SeqCst) {
        // A steady flow, not a flood: the point is appends racing passes, not load.
        std::thread::sleep(Duration::from_millis(rng.random_range(5..40)));
        let day = {
            let mut m = model.lock().unwrap();
            m.next_day += 1;
            m.next_day
        };
        // Every batch gets buckets of its own (a day of its own in its own partitions), all in
        // the past, so each is due as soon as it is planned.
        let base = t("2020-01-01T00:00:00Z") + (day % 1_000) * DAY_US;
        let round = day / 1_000;
        let batch: Vec<(Identity, String)> = (0..rng.random_range(5..30))
            .map(|i| {
                let id = (format!("r{round}-p{}", i % 2), base + i * 1_000_000, format!("s{i:03}"));
                let body = format!(r#"{{"day":{day},"i":{i},"pad":"{}"}}"#, "z".repeat(rng.random_range(0..200)));
                (id, body)
            })
            .collect();
        let lines: String = batch
            .iter()
            .map(|((p, t, s), body)| {
                format!(r#"{{"partition_key":"{p}","event_time":{t},"sort_key":"{s}","body":{body}}}"#) + "\n"
            })
            .collect();
        let sent = agent
            .post(&format!("http://{addr}/v1/tables/c/records"))
            .header("Content-Type", "application/x-ndjson")
            .send(lines);
        let mut m = model.lock().unwrap();
        match sent {
            Ok(response) if response.status().as_u16() == 200 => m.acknowledged.extend(batch),
            // Refused (for instance 503 while shutting down): nothing was written.
            Ok(_) => {}
            // No answer: the process may have died before or after the commit.
            Err(_) => {
                m.unknown.extend(batch);
                return;
            }
        }
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() { files_under(&path, out) } else { out.push(path) }
    }
}

/// The invariants, checked on a stopped engine's data directory.
fn check_invariants(
    data: &Path,
    policies: &Path,
    model: &mut Model,
    seen_objects: &mut HashMap<String, String>,
    published: &mut HashMap<String, String>,
    crash: usize,
) {
    // No object is ever overwritten.
    let archive = data.join("archive");
    let mut files = Vec::new();
    files_under(&archive, &mut files);
    for file in files {
        let Ok(bytes) = std::fs::read(&file) else { continue };
        let key = file.strip_prefix(&archive).unwrap().display().to_string();
        if key.contains("#") || key.ends_with(".tmp") || key.ends_with(frostline::archive::catalog::CATALOG_FILE) {
            continue; // object_store's in-progress temporary files
        }
        let hash = sha256_hex(&bytes);
        if let Some(previous) = seen_objects.insert(key.clone(), hash.clone()) {
            assert_eq!(previous, hash, "crash {crash}: object {key} was overwritten");
        }
    }
    let engine = frostline::engine::Engine::open(
        data,
        policies,
        frostline::settings::Settings::default(),
        Arc::new(frostline::clock::SystemClock),
    )
    .unwrap_or_else(|e| panic!("crash {crash}: reopening the data directory: {e}"));
    let backend = engine.policies().tables["c"].backend.clone();
    for meta in engine.store.buckets("c", None).unwrap() {
        if let Some(key) = &meta.manifest_key {
            // No bucket is published twice with different manifests.
            let bucket = meta.id.display();
            if let Some(previous) = published.insert(bucket.clone(), key.clone()) {
                assert_eq!(&previous, key, "crash {crash}: {bucket} published with two manifests");
            }
            // Every manifest names present, identical objects.
            let rows = runtime()
                .block_on(frostline::archive::read_archive(backend.as_ref(), key, None, None))
                .unwrap_or_else(|e| panic!("crash {crash}: archive of {bucket} does not verify: {e}"));
            assert_eq!(rows.len() as u64, meta.row_count, "crash {crash}: {bucket} row count");
        }
        if meta.state == (BucketState::Archived { hot_deleted: true }) {
            assert!(meta.manifest_key.is_some(), "crash {crash}: hot rows deleted without a manifest");
        } else if !matches!(meta.state, BucketState::Archived { .. }) {
            let hot = engine.store.rows(&meta.id, None, usize::MAX).unwrap();
            assert_eq!(hot.len() as u64, meta.row_count, "crash {crash}: hot rows of {} lost", meta.id);
        }
    }
    // Every acknowledged record readable exactly once, with its exact body. A long run holds
    // more records than one page, so every page is read.
    let mut found: BTreeMap<Identity, String> = BTreeMap::new();
    let mut cursor = None;
    loop {
        let page = runtime()
            .block_on(frostline::query::query(
                &engine,
                frostline::query::QueryRequest {
                    table: "c".into(),
                    limit: frostline::query::QUERY_LIMIT_MAX,
                    cursor,
                    ..Default::default()
                },
            ))
            .unwrap_or_else(|e| panic!("crash {crash}: query failed: {e}"));
        for r in page.records {
            let id =
                (String::from_utf8(r.partition_key).unwrap(), r.event_time, String::from_utf8(r.sort_key).unwrap());
            assert!(found.insert(id.clone(), r.body).is_none(), "crash {crash}: {id:?} read twice");
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    for (id, body) in &model.acknowledged {
        assert_eq!(found.get(id), Some(body), "crash {crash}: acknowledged record {id:?} missing or changed");
    }
    for (id, body) in &found {
        if model.acknowledged.contains_key(id) {
            continue;
        }
        let unknown = model.unknown.get(id);
        assert_eq!(unknown, Some(body), "crash {crash}: {id:?} was never appended");
    }
    // An unknown append that did commit is now known: it must stay readable from here on.
    let committed: Vec<Identity> = model.unknown.keys().filter(|id| found.contains_key(*id)).cloned().collect();
    for id in committed {
        let body = model.unknown.remove(&id).unwrap();
        model.acknowledged.insert(id, body);
    }
}

#[test]
fn crash_harness_loses_nothing_across_repeated_kills() {
    let crashes: usize =
        std::env::var("FROSTLINE_CRASHES").ok().and_then(|v| v.parse().ok()).unwrap_or(CRASHES_DEFAULT);
    let seed: u64 =
        std::env::var("FROSTLINE_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("crash harness: {crashes} crashes, seed {seed} (replay with FROSTLINE_CRASH_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let root = tempfile::tempdir().unwrap();
    let (data, policies) = (root.path().join("data"), root.path().join("policies"));
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("tables.toml"), POLICY).unwrap();
    let model = Arc::new(Mutex::new(Model::default()));
    let mut seen_objects = HashMap::new();
    let mut published = HashMap::new();
    let mut by_fail_point: BTreeMap<String, usize> = BTreeMap::new();

    for crash in 0..crashes {
        let point = frostline::failpoints::FAIL_POINTS[rng.random_range(0..frostline::failpoints::FAIL_POINTS.len())];
        // Half the runs die at a fail point, half at a random moment.
        let failpoints =
            (rng.random_range(0..2) == 0).then(|| format!("{point}={}%return(abort)", rng.random_range(20..80)));
        let mut child = spawn_engine(&data, &policies, failpoints.as_deref());
        let stop = Arc::new(AtomicBool::new(false));
        let appending = wait_for_addr(&data, &mut child).map(|addr| {
            let (model, stop) = (model.clone(), stop.clone());
            let seed = rng.random();
            std::thread::spawn(move || appender(addr, model, stop, seed))
        });
        let kill_after = Duration::from_millis(rng.random_range(300..2_500));
        let started = Instant::now();
        let how = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break format!("exited by itself ({status})");
            }
            if started.elapsed() >= kill_after {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                break "SIGKILL".to_string();
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        stop.store(true, Ordering::SeqCst);
        if let Some(handle) = appending {
            handle.join().unwrap();
        }
        let label = match &failpoints {
            Some(spec) if how.starts_with("exited") => format!("{} (fired)", spec.split('=').next().unwrap()),
            Some(_) => "SIGKILL (fail point armed, not reached)".to_string(),
            None => "SIGKILL".to_string(),
        };
        *by_fail_point.entry(label).or_default() += 1;
        let mut m = model.lock().unwrap();
        check_invariants(&data, &policies, &mut m, &mut seen_objects, &mut published, crash);
    }

    // Finally, with no faults: everything due is archived, and every record still reads back.
    let mut child = spawn_engine(&data, &policies, None);
    wait_for_addr(&data, &mut child).expect("final start");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let status = std::fs::read_to_string(data.join("status.json")).unwrap_or_default();
        let status: serde_json::Value = serde_json::from_str(&status).unwrap_or_default();
        let states = &status["tables"][0]["states"];
        let pending = ["hot", "archiving", "archived_cleanup_pending"]
            .iter()
            .map(|s| states[s]["buckets"].as_u64().unwrap_or(0))
            .sum::<u64>();
        if status.is_object() && pending == 0 {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let engine = frostline::engine::Engine::open(
                &data,
                &policies,
                frostline::settings::Settings::default(),
                Arc::new(frostline::clock::SystemClock),
            )
            .unwrap();
            let stuck: Vec<_> = engine
                .store
                .buckets("c", None)
                .unwrap()
                .into_iter()
                .filter(|b| !matches!(b.state, BucketState::Archived { hot_deleted: true }))
                .take(3)
                .collect();
            panic!("the final run never settled: {states}; for instance {stuck:#?}");
        }
    }
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    let mut m = model.lock().unwrap();
    check_invariants(&data, &policies, &mut m, &mut seen_objects, &mut published, crashes);
    eprintln!(
        "crash harness: {crashes} crashes; {} acknowledged records, {} buckets published, {} objects; by cause: {by_fail_point:?}",
        m.acknowledged.len(),
        published.len(),
        seen_objects.len()
    );
    assert!(published.len() > 10, "the harness must actually archive");
}

//! The data directory's disk: a full disk under a running engine (the data directory on a
//! small tmpfs filled to the last byte, then freed; mounting needs root, which CI and these
//! machines have; without it the test fails and says so, it is never skipped), and the disk
//! archival frees given back by a running engine.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use frostline::engine::Engine;
use frostline::error::Error;
use frostline::model::{BucketState, Record};
use frostline::settings::Settings;

use crate::support::*;

const POLICY: &str = r#"
[[table]]
id = "r"
strategy = { plugin = "builtin:calendar-day-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "3650d" } }
target = "cold"
"#;

/// A tmpfs of `mib` MiB mounted on a temporary directory, unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(mib: u64) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "this test mounts a {mib} MiB tmpfs as the data directory's disk and needs root to do so: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

fn batch(from: usize, n: usize) -> Vec<Record> {
    (from..from + n)
        .map(|i| Record {
            partition_key: format!("device/{}", i % 7).into_bytes(),
            event_time: t("2024-03-01T00:00:00Z") + i as i64 * 1_000_000,
            sort_key: format!("{i:08}").into_bytes(),
            tenant: None,
            kind: None,
            body: format!(r#"{{"i":{i},"pad":"{}"}}"#, "x".repeat(4_000)),
        })
        .collect()
}

/// Fills the filesystem of `dir` with one file until it refuses to grow.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![7u8; 64 * 1024];
    while file.write_all(&chunk).is_ok() {}
    let _ = file.sync_all();
    path
}

/// Regression (issue: a running engine never recovers from a full disk): after a failed
/// commit the store refused every append and every read until someone restarted the process,
/// which did not exit, so no supervisor did. Now the store reopens itself once its filesystem
/// takes writes again, and every acknowledged record is there.
#[test]
fn a_full_disk_refuses_appends_with_the_cause_and_the_store_reopens_itself_once_space_is_freed() {
    let disk = SmallDisk::mount(24);
    let root = tempfile::tempdir().unwrap();
    let (policies, cold) = (root.path().join("policies"), root.path().join("cold"));
    std::fs::create_dir_all(&policies).unwrap();
    let target = format!("\n[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", cold.display());
    std::fs::write(policies.join("tables.toml"), format!("{POLICY}{target}")).unwrap();
    let clock = frostline::clock::ManualClock::new(t("2024-03-02T00:00:00Z"));
    let data = disk.path().join("data");
    let engine = Engine::open(&data, &policies, Settings::default(), clock).unwrap_or_else(|e| panic!("{e}"));

    let mut acknowledged = 0;
    engine.append("r", batch(acknowledged, 50)).unwrap();
    acknowledged += 50;
    let filler = fill(disk.path());
    // Appends go on while redb has room inside its file; one commit finally fails.
    let refusal = loop {
        match engine.append("r", batch(acknowledged, 50)) {
            Ok(outcome) => {
                assert_eq!(outcome.appended, 50);
                acknowledged += 50;
                assert!(acknowledged < 20_000, "the disk never filled");
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(refusal, Error::StorePoisoned(_)), "{refusal}");
    let message = refusal.to_string();
    assert!(message.contains(&data.display().to_string()) && message.contains("free space"), "{message}");
    let again = engine.append("r", batch(acknowledged, 1)).unwrap_err();
    assert!(matches!(again, Error::StorePoisoned(_)), "writes stay refused while the disk is full: {again}");

    let read_while_full = runtime().block_on(frostline::query::query(
        &engine.context(),
        frostline::query::QueryRequest { table: "r".into(), limit: 10, ..Default::default() },
    ));
    // redb refuses reads after a failed commit, and cannot open the file again without writing
    // its repair: reads say why, as appends do, until the disk has room.
    let refused = read_while_full.expect_err("reads wait for the reopen");
    assert!(matches!(refused, Error::StorePoisoned(_)) && refused.to_string().contains("free space"), "{refused}");
    // Space comes back; no restart: the store reopens itself within its probe interval.
    std::fs::remove_file(filler).unwrap();
    let started = Instant::now();
    loop {
        match engine.append("r", batch(acknowledged, 50)) {
            Ok(_) => {
                acknowledged += 50;
                break;
            }
            Err(e) => {
                assert!(started.elapsed() < Duration::from_secs(60), "the store never reopened: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    assert!(engine.store().poisoned().is_none());
    let read = query_engine(&engine, "r");
    assert_eq!(read.len(), acknowledged, "every acknowledged record reads back");
    let mut expected = batch(0, acknowledged);
    expected.sort_by(|a, b| (a.event_time, &a.sort_key).cmp(&(b.event_time, &b.sort_key)));
    let mut read = read;
    read.sort_by(|a, b| (a.event_time, &a.sort_key).cmp(&(b.event_time, &b.sort_key)));
    assert!(read == expected, "the records read back are the ones acknowledged");
}

/// Records of 1 KiB, `per_day` on each of `days` days from 2024-01-01, on 7 partitions.
fn days_of_records(days: usize, per_day: usize) -> Vec<Record> {
    (0..days * per_day)
        .map(|i| Record {
            partition_key: format!("site a/%20=ü/{}", i % 7).into_bytes(),
            event_time: t("2024-01-01T00:00:00Z") + (i / per_day) as i64 * 86_400_000_000 + (i % per_day) as i64,
            sort_key: format!("{i:08}").into_bytes(),
            tenant: None,
            kind: None,
            body: format!(r#"{{"i":{i},"pad":"{}"}}"#, "x".repeat(1_000)),
        })
        .collect()
}

fn file_bytes(e: &TestEngine) -> u64 {
    std::fs::metadata(e.engine.store().path()).unwrap().len()
}

/// An engine whose compaction in place triggers at half the file free and 1 MiB.
fn compacting_engine(now: &str) -> TestEngine {
    let settings =
        Settings { store_compact_free_percent: 50, store_compact_free_bytes: 1024 * 1024, ..Default::default() };
    TestEngine::open_with_settings(&crate::replan::expiring_policy("3650d"), now, &[], Default::default(), settings)
        .unwrap()
}

/// Issue 34 ("give the disk back"): after every bucket was archived and cleaned, `hot.redb`
/// kept its high-water mark (redb never gives freed pages back), so on an edge host the disk
/// archival was meant to free stayed full until someone stopped the engine for `frostline
/// compact`. A running engine now compacts its store in place once enough of the file is free:
/// the file falls under a tenth of its peak, while appends and reads in other threads go on
/// (they wait for it) and every record reads back.
#[test]
fn a_running_engine_gives_back_the_disk_archival_freed_while_appends_and_reads_go_on() {
    let e = compacting_engine("2024-02-15T00:00:00Z");
    for chunk in days_of_records(30, 1_000).chunks(1_000) {
        e.engine.append("r", chunk.to_vec()).unwrap();
    }
    let peak = file_bytes(&e);
    for _ in 0..4 {
        let report = e.pass();
        assert!(report.errors.is_empty(), "{report:?}");
    }
    let buckets = e.engine.store().buckets("r", None).unwrap();
    assert!(buckets.iter().all(|b| b.state == BucketState::Archived { hot_deleted: true }), "{buckets:?}");
    let peak = peak.max(file_bytes(&e));
    assert!(file_bytes(&e) > peak / 2, "archival alone gives nothing back: {} of {peak}", file_bytes(&e));

    // Appends and reads go on in other threads while the store compacts.
    let stop = Arc::new(AtomicBool::new(false));
    let appender = {
        let (engine, stop) = (e.engine.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut acknowledged = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let record = Record {
                    partition_key: b"during".to_vec(),
                    event_time: t("2024-02-14T00:00:00Z") + acknowledged as i64,
                    sort_key: format!("{acknowledged:08}").into_bytes(),
                    tenant: None,
                    kind: None,
                    body: r#"{"during":true}"#.into(),
                };
                engine.append("r", vec![record]).unwrap();
                acknowledged += 1;
            }
            acknowledged
        })
    };
    let reader = {
        let (engine, stop) = (e.engine.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                engine.store().buckets("r", None).unwrap();
                reads += 1;
            }
            reads
        })
    };
    // Reads under way when it starts are waited for (new ones wait for it); one that stays
    // open would put it off, to be tried again as the pass loop does.
    let mut compacted = None;
    for _ in 0..50 {
        let upkeep = frostline::ops::maintenance::compact_if_worthwhile(&e.engine).unwrap();
        match upkeep.compaction {
            Some(frostline::ops::maintenance::InPlace::Compacted(c)) => {
                compacted = Some((upkeep.space, c));
                break;
            }
            Some(frostline::ops::maintenance::InPlace::Skipped { .. }) => std::thread::sleep(Duration::from_millis(20)),
            None => panic!("worth compacting: {upkeep:?}"),
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let acknowledged = appender.join().unwrap();
    assert!(reader.join().unwrap() > 0);
    let (space, compaction) = compacted.expect("compacted within 50 tries");
    assert!(space.free_bytes * 2 >= space.file_bytes, "{space:?}");
    let after = file_bytes(&e);
    assert!(after * 10 < peak, "{after} bytes after, {peak} at the peak: {compaction:?}");
    assert!(acknowledged > 0);

    // Every record reads back: the archived ones and each one acknowledged during it.
    let read = e.query_all("r");
    assert_eq!(read.len(), 30_000 + acknowledged, "{compaction:?}");
    let during = read.iter().filter(|r| r.partition_key == b"during").count();
    assert_eq!(during, acknowledged);
    eprintln!(
        "peak {peak} bytes; before {} ({} free); after {after}; writes and reads held {} ms; {acknowledged} appends \
         meanwhile",
        space.file_bytes, space.free_bytes, compaction.held_ms
    );
}

/// The compaction in place needs the database to itself: a read transaction that stays open
/// makes it give up and change nothing, and a store with nothing to give back is left alone.
#[test]
fn a_compaction_in_place_waits_for_no_open_read_and_is_left_out_when_not_worth_it() {
    let e = compacting_engine("2024-02-15T00:00:00Z");
    for chunk in days_of_records(3, 1_000).chunks(1_000) {
        e.engine.append("r", chunk.to_vec()).unwrap();
    }
    let upkeep = frostline::ops::maintenance::compact_if_worthwhile(&e.engine).unwrap();
    assert_eq!(upkeep.compaction, None, "nothing freed yet: {upkeep:?}");
    for _ in 0..4 {
        e.pass();
    }
    let before = file_bytes(&e);
    let open_read = e.engine.store().snapshot().unwrap();
    let outcome = e.engine.store().compact_in_place().unwrap();
    assert_eq!(
        outcome,
        frostline::ops::maintenance::InPlace::Skipped { reason: "a read transaction stayed open for 2 s".into() }
    );
    assert_eq!(file_bytes(&e), before);
    let mut late = days_of_records(1, 1);
    late[0].sort_key = b"written beside the open read".to_vec();
    e.engine.append("r", late).unwrap();
    drop(open_read);
    let outcome = e.engine.store().compact_in_place().unwrap();
    assert!(matches!(outcome, frostline::ops::maintenance::InPlace::Compacted(_)), "{outcome:?}");
    assert!(file_bytes(&e) < before);
    assert_eq!(e.query_all("r").len(), 3_001);
}

/// Found while measuring the store's free pages: under appends racing passes, a commit without
/// an fsync (a claim, a cleanup slice) freed a page a reader still walked. redb 3.1.3's
/// `begin_read` registered the read under the last committed transaction and read the data root
/// only afterwards, so a commit between the two left the reader protecting the wrong snapshot,
/// and two non-durable commits could reclaim pages of the tree it read (its debug assertion in
/// `TransactionalMemory::free_helper` panicked the writer thread about 1 run in 15; release builds
/// reused the page). redb 4.3.0 captures the snapshot under the header lock; frostline requires
/// redb 4.6 or a later 4.x.
/// docs/RELIABILITY.md ("A read racing a commit without an fsync") has the diagnosis.
#[test]
fn the_writer_survives_appends_racing_passes_and_space_measures() {
    let e = compacting_engine("2024-02-15T00:00:00Z");
    let stop = Arc::new(AtomicBool::new(false));
    let appender = {
        let (engine, stop) = (e.engine.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let mut batch = days_of_records(3, 10);
                for r in &mut batch {
                    r.sort_key = format!("{n:08}-{}", String::from_utf8_lossy(&r.sort_key)).into_bytes();
                    r.event_time += 200 * 86_400_000_000;
                }
                engine.append("r", batch).unwrap();
                n += 1;
            }
        })
    };
    for chunk in days_of_records(30, 100).chunks(500) {
        e.engine.append("r", chunk.to_vec()).unwrap();
    }
    for _ in 0..40 {
        e.pass();
        e.engine.store().space(0).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    appender.join().unwrap();
}

/// Issue 34 ("give the disk back", metadata bounded): `status` and the metrics show the
/// store's metadata in all and per bucket, measured with the free pages; an archived bucket
/// keeps its row, its index entries and a manifest per generation, and once it expired and its
/// tombstone was purged only its row and index entries: the measure falls.
#[test]
fn status_and_metrics_show_the_store_s_metadata_per_bucket_and_a_purge_lowers_it() {
    let settings = Settings { tombstone_retention_us: 86_400_000_000, ..Default::default() };
    let e = TestEngine::open_with_settings(
        &crate::replan::expiring_policy("100d"),
        "2024-03-01T00:00:00Z",
        &[],
        Default::default(),
        settings,
    )
    .unwrap();
    // 7 partitions × 60 days: 420 small buckets, where metadata is most of what a bucket keeps.
    for chunk in days_of_records(60, 7).chunks(1_000) {
        e.engine.append("r", chunk.to_vec()).unwrap();
    }
    let measure = |e: &TestEngine| {
        e.engine.store().space(e.engine.clock().now()).unwrap();
        frostline::ops::status::collect(&e.engine).unwrap().store_disk.unwrap()
    };
    let hot = measure(&e);
    e.pass(); // plan
    e.clock.set(t("2024-03-02T00:00:00Z"));
    while e.pass().archived > 0 {}
    let buckets = e.engine.store().buckets("r", None).unwrap();
    assert_eq!(buckets.len(), 420);
    assert!(buckets.iter().all(|b| b.state == BucketState::Archived { hot_deleted: true }));
    let archived = measure(&e);
    let per_bucket = archived.metadata_bytes_per_bucket.expect("measured");
    assert_eq!(per_bucket, archived.metadata_bytes.unwrap() / 420);
    // The figure this data set gives, with room for redb's page splits: a manifest copy and
    // a bucket row of under a KiB each, in pages that are about half full.
    assert!((1_024..=8_192).contains(&per_bucket), "{archived:?}");
    assert!(archived.metadata_bytes.unwrap() > hot.metadata_bytes.unwrap(), "{hot:?} then {archived:?}");

    let status = frostline::ops::status::collect(&e.engine).unwrap();
    let metrics = frostline::api::metrics::Metrics::new().unwrap().render(&status).unwrap();
    for line in [
        format!("frostline_store_metadata_bytes {}", archived.metadata_bytes.unwrap()),
        format!("frostline_store_metadata_bytes_per_bucket {per_bucket}"),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} not in\n{metrics}");
    }

    // Every bucket expires; a day later its tombstone is purged, and its manifests with it.
    e.clock.set(t("2024-06-15T00:00:00Z"));
    while e.pass().expired > 0 {}
    e.clock.set(t("2024-06-17T00:00:00Z"));
    let mut tombstones_purged = 0;
    loop {
        let report = e.pass();
        assert!(report.errors.is_empty(), "{report:?}");
        tombstones_purged += report.tombstones_purged;
        if report.tombstones_purged == 0 {
            break;
        }
    }
    assert_eq!(tombstones_purged, 420);
    let purged = measure(&e);
    assert!(
        purged.metadata_bytes.unwrap() * 10 < archived.metadata_bytes.unwrap() * 7,
        "the purge takes the manifests: {archived:?} then {purged:?}"
    );
    eprintln!(
        "metadata per bucket: {} bytes hot, {per_bucket} archived, {} expired and purged ({} buckets)",
        hot.metadata_bytes_per_bucket.unwrap(),
        purged.metadata_bytes_per_bucket.unwrap(),
        purged.buckets.unwrap_or_default()
    );
}

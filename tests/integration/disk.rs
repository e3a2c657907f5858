//! A full disk under a running engine: the data directory on a small tmpfs filled to the last
//! byte, then freed. Mounting needs root, which CI and these machines have; without it the
//! test fails and says so (it is never skipped).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use frostline::engine::Engine;
use frostline::error::Error;
use frostline::model::Record;
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

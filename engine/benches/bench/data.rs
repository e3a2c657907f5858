//! The records, directories and clocks the scenarios share, and the helpers that drive an
//! engine the way `frostline archive --once` does.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use frostline::archive::{self, PassReport};
use frostline::clock::ManualClock;
use frostline::engine::Engine;
use frostline::model::time::MICROS_PER_DAY;
use frostline::model::{Micros, Record};
use frostline::settings::Settings;
use frostline_civil::days_from_civil;

/// The table the append, archive and formats scenarios write, bucketed by UTC day.
pub const DATASET_TABLE: &str = "readings";
/// Records are spread over this many days and partitions, interleaved, so every batch of
/// appends touches every bucket and the strategy's descriptor cache is warm after the first.
pub const DATASET_DAYS: usize = 4;
pub const DATASET_PARTITIONS: usize = 8;
/// 2025-03-01T00:00:00Z, the first day of the data set.
pub const DATASET_START_MICROS: Micros = days_from_civil(2025, 3, 1) * MICROS_PER_DAY;
/// The clock while appending: the day after the data set.
pub const APPEND_NOW_MICROS: Micros = DATASET_START_MICROS + (DATASET_DAYS as Micros + 1) * MICROS_PER_DAY;
/// The clock of the archive passes: long after every record, so every bucket is due at once.
pub const ARCHIVE_NOW_MICROS: Micros = days_from_civil(2030, 1, 1) * MICROS_PER_DAY;
/// Every record body is a JSON object of exactly this many bytes.
pub const BODY_BYTES: usize = 200;
/// Passes per archive run at most (one archives everything; the next finds nothing).
const ARCHIVE_PASSES_MAX: usize = 1_000;
pub const MEGABYTE: f64 = 1e6;
/// Seed of the pseudo-random event times and bodies, fixed so every run uses the same data.
pub const TIMES_SEED: u64 = 0x5eed_f205_71e0;

/// `count` sensor readings: partition `sensor-NNN`, sort key `evt-NNNNNNNNNN` (an event id),
/// 200-byte JSON bodies. Record `n` falls on day `n % 4` and partition `(n / 4) % 8`; within a
/// bucket, times rise with `n`.
pub fn dataset(count: usize) -> Vec<Record> {
    let per_day = count.div_ceil(DATASET_DAYS).max(1) as Micros;
    let step = (MICROS_PER_DAY / per_day).max(1);
    let mut state = TIMES_SEED;
    (0..count)
        .map(|n| {
            let day = (n % DATASET_DAYS) as Micros;
            let slot = n / DATASET_DAYS;
            let sensor = format!("sensor-{:03}", slot % DATASET_PARTITIONS);
            let body = reading_body(&sensor, n, splitmix64(&mut state));
            Record {
                partition_key: sensor.into_bytes(),
                event_time: DATASET_START_MICROS + day * MICROS_PER_DAY + slot as Micros * step,
                sort_key: format!("evt-{n:010}").into_bytes(),
                tenant: None,
                kind: None,
                body,
            }
        })
        .collect()
}

/// A compact JSON object of exactly `BODY_BYTES` bytes (integers only, so it is canonical).
pub fn reading_body(sensor: &str, n: usize, random: u64) -> String {
    let millicelsius = (random % 40_000) as i64 - 5_000;
    let humidity_permille = (random >> 20) % 1_000;
    let mut body = format!(
        r#"{{"sensor":"{sensor}","seq":{n},"temperature_mc":{millicelsius},"humidity_pm":{humidity_permille},"status":"ok","note":""#
    );
    let pad = BODY_BYTES.checked_sub(body.len() + 2).expect("the fixed fields fit in a body");
    body.extend((0..pad).map(|i| char::from(b'a' + ((n + i) % 26) as u8)));
    body.push_str("\"}");
    debug_assert_eq!(body.len(), BODY_BYTES);
    body
}

/// The policy file: one day-bucketed table; buckets are archived `archive_after` after they end.
pub fn policy_toml(archive_after: &str) -> String {
    format!(
        "[[table]]\nid = \"{DATASET_TABLE}\"\nstrategy = {{ plugin = \"builtin:calendar-day-utc\" }}\n\
         retention = {{ plugin = \"builtin:eligible-before\", config = {{ archive_after = \"{archive_after}\" }} }}\n"
    )
}

/// A data directory and a policy directory in one temporary directory.
pub struct Dirs {
    root: tempfile::TempDir,
}

impl Dirs {
    pub fn new(policy: &str) -> Result<Dirs> {
        let dirs = Dirs { root: tempfile::tempdir()? };
        std::fs::create_dir_all(dirs.policies())?;
        std::fs::write(dirs.policies().join("tables.toml"), policy)?;
        Ok(dirs)
    }

    pub fn data(&self) -> PathBuf {
        self.root.path().join("data")
    }

    pub fn policies(&self) -> PathBuf {
        self.root.path().join("policies")
    }

    /// A copy of both directories (the engine that wrote them must be closed).
    pub fn copy(&self) -> Result<Dirs> {
        let copy = Dirs { root: tempfile::tempdir()? };
        copy_tree(self.root.path(), copy.root.path())?;
        Ok(copy)
    }

    pub fn open(&self, now: Micros) -> Result<Arc<Engine>> {
        self.open_with(now, Settings::default())
    }

    pub fn open_with(&self, now: Micros, settings: Settings) -> Result<Arc<Engine>> {
        Ok(Engine::open(&self.data(), &self.policies(), settings, ManualClock::new(now))?)
    }
}

pub fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Passes until one makes no progress, as `frostline archive --once` runs them.
pub async fn passes_until_idle(engine: &Arc<Engine>) -> Result<PassReport> {
    let owner = engine.new_owner_token();
    let mut total = PassReport::default();
    for _ in 0..ARCHIVE_PASSES_MAX {
        let report = archive::run_pass(&engine.context(), &owner).await?;
        let (progressed, deferred) = (report.made_progress(), report.deferred);
        total.add(report);
        if !progressed || deferred > 0 {
            break;
        }
    }
    Ok(total)
}

/// The repository's root directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// `$CARGO_TARGET_DIR/release/frostline` (the target directory defaults to the one this bench
/// binary was built in), or why it is not there.
pub fn release_binary() -> std::result::Result<PathBuf, String> {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => repo_root().join(dir),
        None => {
            let exe = std::env::current_exe().map_err(|e| format!("cannot locate the bench binary: {e}"))?;
            // <target>/release/deps/frostline_bench-HASH
            exe.ancestors().nth(3).map(Path::to_path_buf).ok_or("cannot locate the target directory")?
        }
    };
    let binary = target.join("release").join("frostline");
    if binary.is_file() {
        Ok(binary)
    } else {
        Err(format!("{} is missing: build it with `cargo build --release` (scripts/bench does)", binary.display()))
    }
}

/// The bytes of every file below `dir`.
pub fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() { dir_bytes(&entry.path())? } else { meta.len() };
    }
    Ok(total)
}

/// `frostline verify --sample n` as an operator runs it; fails unless `n` buckets verified.
pub fn verify_sample(runtime: &tokio::runtime::Runtime, engine: &Arc<Engine>, n: usize) -> Result<()> {
    let report = runtime.block_on(frostline::ops::archives::verify(engine, None, Some(n), |_| {}))?;
    anyhow::ensure!(
        report.verdicts.len() == n && report.failed == 0,
        "a verification of {} buckets, {} failed",
        report.verdicts.len(),
        report.failed
    );
    Ok(())
}

//! Scenario reload: from a file renamed into the policy directory to the new policy set
//! active, through the watcher `frostline run` runs (`ops::reload::start_watcher` and
//! `watch`, in this process), polling the active generation every millisecond.
//!
//! Three cases, each renamed `RENAMES_PER_ROUND` times a round, reported as the median over
//! rounds of each round's 50th and 95th percentile:
//! - a policy file whose plugins are built-ins;
//! - a plugin file replaced by one of two versions already in the compiled cache;
//! - a plugin file replaced by a version never seen, which is compiled.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use frostline::engine::Engine;
use frostline::plugin::builtin;

use crate::data::{ARCHIVE_NOW_MICROS, Dirs, policy_toml};
use crate::harness::{Bench, Figure, Unit, percentile};

/// Renames timed per case and round.
const RENAMES_PER_ROUND: usize = 10;
/// A reload with cached plugins should make the new set active within 250 ms at the median.
const RELOAD_CACHED_MS_MAX: f64 = 250.0;
/// How long to wait for a reload before calling the run failed.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The plugin file the plugin cases replace, relative to the policy directory.
const PLUGIN_FILE: &str = "plugins/retention.wasm";

/// A policy file declaring table `id`, whose retention (`retention`) archives buckets `days`
/// days after they end.
fn table(id: &str, retention: &str, days: usize) -> String {
    format!(
        "[[table]]\nid = \"{id}\"\nstrategy = {{ plugin = \"builtin:calendar-day-utc\" }}\n\
         retention = {{ plugin = \"{retention}\", config = {{ archive_after = \"{days}d\" }} }}\n"
    )
}

/// The built-in eligible-before component with a custom section appended: the same
/// behaviour under another SHA-256, so the compiled cache has never seen it.
fn retention_variant(version: u64) -> Result<Vec<u8>> {
    let builtin = builtin::find("eligible-before").context("the built-in eligible-before is missing")?;
    let mut bytes = builtin.bytes.to_vec();
    let name = b"frostline-bench";
    let payload = version.to_le_bytes();
    // A custom section: id 0, size, then the name (length-prefixed) and the payload; every
    // length here is under 128, so one LEB128 byte each.
    bytes.push(0);
    bytes.push((1 + name.len() + payload.len()) as u8);
    bytes.push(name.len() as u8);
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(&payload);
    Ok(bytes)
}

/// Writes `bytes` beside the policy directory and renames it to `relative` inside it, then
/// waits until the engine's policy generation passes `generation`: the milliseconds between.
fn rename_in(engine: &Engine, staging: &Path, dir: &Path, relative: &str, bytes: &[u8]) -> Result<f64> {
    let generation = engine.policies().generation;
    let staged = staging.join("staged");
    std::fs::write(&staged, bytes)?;
    let start = Instant::now();
    std::fs::rename(&staged, dir.join(relative))?;
    while engine.policies().generation == generation {
        if start.elapsed() > RELOAD_TIMEOUT {
            let last = engine.last_reload();
            anyhow::bail!("no reload within {RELOAD_TIMEOUT:?} of renaming {relative}; last reload: {last:?}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let elapsed = start.elapsed().as_secs_f64() * 1e3;
    // The outcome is recorded just after the set is installed.
    let active = engine.policies().generation;
    let outcome = loop {
        match engine.last_reload() {
            Some(outcome) if outcome.generation >= active => break outcome,
            _ if start.elapsed() > RELOAD_TIMEOUT => anyhow::bail!("the reload of {relative} recorded no outcome"),
            _ => std::thread::yield_now(),
        }
    };
    ensure!(outcome.accepted, "the reload of {relative} was refused: {:?}", outcome.error);
    Ok(elapsed)
}

pub fn reload(bench: &mut Bench) -> Result<()> {
    let dirs = Dirs::new(&policy_toml("1d"))?;
    let dir = dirs.policies();
    std::fs::create_dir_all(dir.join("plugins"))?;
    let cached = [retention_variant(0)?, retention_variant(1)?];
    std::fs::write(dir.join(PLUGIN_FILE), &cached[0])?;
    std::fs::write(dir.join("extra.toml"), table("extra", "builtin:eligible-before", 1))?;
    // The plugin cases replace the component this table's retention names.
    std::fs::write(dir.join("plugged.toml"), table("plugged", PLUGIN_FILE, 1))?;
    let engine = dirs.open(ARCHIVE_NOW_MICROS)?;
    let staging = tempfile::tempdir_in(dirs.data())?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let watcher = frostline::ops::reload::start_watcher(&dir)?;
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let task = runtime.spawn(frostline::ops::reload::watch(Arc::clone(&engine), watcher, stopping));

    let cases = ["built-in plugins", "a plugin file in the compiled cache", "a plugin file never compiled"];
    let mut p50: [Vec<f64>; 3] = Default::default();
    let mut p95: [Vec<f64>; 3] = Default::default();
    let mut renames = 0usize;
    let mut fresh = 2u64;
    // Both cached versions go through the cache once, untimed.
    for bytes in &cached {
        rename_in(&engine, staging.path(), &dir, PLUGIN_FILE, bytes)?;
    }
    for _ in 0..bench.options.repeats {
        let mut rounds: [Vec<f64>; 3] = Default::default();
        for _ in 0..RENAMES_PER_ROUND {
            renames += 1;
            let policy = table("extra", "builtin:eligible-before", 1 + renames % 7);
            rounds[0].push(rename_in(&engine, staging.path(), &dir, "extra.toml", policy.as_bytes())?);
            let bytes = &cached[renames % 2];
            rounds[1].push(rename_in(&engine, staging.path(), &dir, PLUGIN_FILE, bytes)?);
            fresh += 1;
            let bytes = retention_variant(fresh)?;
            rounds[2].push(rename_in(&engine, staging.path(), &dir, PLUGIN_FILE, &bytes)?);
        }
        for (case, samples) in rounds.iter_mut().enumerate() {
            p50[case].push(percentile(samples, 0.5));
            p95[case].push(percentile(samples, 0.95));
        }
    }
    stop.send(true).ok();
    runtime.block_on(task)??;

    for (case, about) in cases.iter().enumerate() {
        let name =
            |q: &str| format!("{q} from a file renamed into the policy directory to the new set active, {about}");
        let median = Figure::new(bench.scenario, name("p50"), Unit::Millis, p50[case].clone(), 1);
        let median = if case < 2 {
            median
                .with_limit(RELOAD_CACHED_MS_MAX, "a reload with cached plugins is active within 250 ms at the median")
        } else {
            median
        };
        bench.push(median);
        bench.push(Figure::new(bench.scenario, name("p95"), Unit::Millis, p95[case].clone(), 1));
    }
    Ok(())
}

//! Scenario edge: the release artifacts `scripts/release` wrote (FROSTLINE_RELEASE_DIR, by
//! default `dist/`), measured as the footprint scenario measures the release build: the
//! stripped size of each binary, and for the x86_64 ones start-up to the first `/health` answer
//! (example policies, compiled cache) and resident memory idle two seconds after. The lean
//! build is compared with the full build of the same target, the two started in turn, round by
//! round. The aarch64 builds are started under qemu-aarch64 (FROSTLINE_QEMU_AARCH64, or the one
//! scripts/release unpacked): their start-up is reported, with no target, since it measures the
//! emulator as much as frostline.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};

use crate::data::repo_root;
use crate::footprint::Engine;
use crate::harness::{Bench, Figure, Unit};

/// The lean edge build should be under 20 MB stripped.
const LEAN_BYTES_MAX: f64 = 20e6;
const IDLE_SETTLE: Duration = Duration::from_secs(2);
/// Starts under emulation, which are slow.
const EMULATED_STARTS: usize = 3;

pub fn edge(bench: &mut Bench) -> Result<()> {
    let dist = std::env::var_os("FROSTLINE_RELEASE_DIR").map(PathBuf::from).unwrap_or_else(|| repo_root().join("dist"));
    let artifacts = artifacts(&dist);
    if artifacts.is_empty() {
        bench.skip(&["edge"], format!("no release artifacts in {}: run scripts/release first", dist.display()));
        return Ok(());
    }
    let qemu = std::env::var_os("FROSTLINE_QEMU_AARCH64").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
        home.join(".cache/frostline/tools/qemu/usr/bin/qemu-aarch64-static")
    });
    let policies = repo_root().join("policies");
    for triple in ["x86_64-unknown-linux-musl", "aarch64-unknown-linux-musl"] {
        let full = artifacts.iter().find(|a| a.triple == triple && !a.lean);
        let lean = artifacts.iter().find(|a| a.triple == triple && a.lean);
        let emulator = triple.starts_with("aarch64").then_some(qemu.as_path());
        if emulator.is_some_and(|q| !q.is_file()) {
            bench.skip(
                &[triple],
                format!("{} is missing: scripts/release or scripts/prove-arm64 unpacks it", qemu.display()),
            );
            continue;
        }
        let present: Vec<&Artifact> = [full, lean].into_iter().flatten().collect();
        let binaries: Vec<&Path> = present.iter().map(|a| a.path.as_path()).collect();
        let starts = start_and_idle_round_by_round(bench, emulator, &binaries, &policies)?;
        let mut measured: Vec<(bool, [Figure; 3])> = Vec::new();
        for (artifact, (startup_ms, idle_mib)) in present.into_iter().zip(starts) {
            let kind = if artifact.lean { "lean" } else { "full" };
            let size = std::fs::metadata(&artifact.path)?.len() as f64;
            let under = if emulator.is_some() { ", under qemu-aarch64" } else { "" };
            measured.push((
                artifact.lean,
                [
                    Figure::new(bench.scenario, format!("{triple} {kind}: stripped size"), Unit::Bytes, vec![size], 1),
                    Figure::new(
                        bench.scenario,
                        format!("{triple} {kind}: start-up of `frostline run` to its first /health answer (example policies{under})"),
                        Unit::Millis,
                        startup_ms,
                        1,
                    ),
                    Figure::new(
                        bench.scenario,
                        format!("{triple} {kind}: resident memory idle, 2 s after start-up{under}"),
                        Unit::Mebibytes,
                        idle_mib,
                        1,
                    ),
                ],
            ));
        }
        let full_figures = measured.iter().find(|(lean, _)| !lean).map(|(_, f)| f);
        let mut pushes: Vec<Figure> = Vec::new();
        for (lean, figures) in &measured {
            for (i, figure) in figures.iter().enumerate() {
                // Resident memory under qemu is the emulator's as much as frostline's.
                if emulator.is_some() && i == 2 {
                    continue;
                }
                let mut figure = figure.clone();
                if *lean && let Some(full) = full_figures {
                    figure = figure.against(&full[i]);
                }
                if *lean && i == 0 {
                    figure = figure.with_limit(LEAN_BYTES_MAX, "the lean edge build is under 20 MB stripped");
                }
                pushes.push(figure);
            }
        }
        for figure in pushes {
            bench.push(figure);
        }
    }
    Ok(())
}

/// Start-up times and idle resident memory of each binary over the scenario's repeats (fewer
/// under emulation), one start of each per round, so load from elsewhere on the machine hits
/// the full and the lean build alike.
fn start_and_idle_round_by_round(
    bench: &Bench,
    emulator: Option<&Path>,
    binaries: &[&Path],
    policies: &Path,
) -> Result<Vec<(Vec<f64>, Vec<f64>)>> {
    let mut data_dirs = Vec::new();
    for binary in binaries {
        let data = tempfile::tempdir()?;
        // The first start fills the compiled cache (a full build) and is not timed.
        Engine::start_under(emulator, binary, data.path(), policies)?.stop()?;
        data_dirs.push(data);
    }
    let repeats = if emulator.is_some() { EMULATED_STARTS } else { bench.options.repeats };
    ensure!(repeats > 0, "no start-up measured: --repeats must be at least 1");
    let mut measured = vec![(Vec::new(), Vec::new()); binaries.len()];
    for _ in 0..repeats {
        for ((binary, data), (startup_ms, idle_mib)) in binaries.iter().zip(&data_dirs).zip(&mut measured) {
            let started = Instant::now();
            let engine = Engine::start_under(emulator, binary, data.path(), policies)?;
            startup_ms.push(started.elapsed().as_secs_f64() * 1e3);
            std::thread::sleep(IDLE_SETTLE);
            idle_mib.push(engine.memory()?.resident_mib);
            engine.stop()?;
        }
    }
    Ok(measured)
}

struct Artifact {
    path: PathBuf,
    triple: &'static str,
    lean: bool,
}

/// `frostline-VERSION-TRIPLE[-lean]` binaries in `dist`.
fn artifacts(dist: &Path) -> Vec<Artifact> {
    let Ok(entries) = std::fs::read_dir(dist) else { return Vec::new() };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("frostline-") {
            continue;
        }
        for triple in ["x86_64-unknown-linux-musl", "aarch64-unknown-linux-musl"] {
            if name.ends_with(&format!("{triple}-lean")) || name.ends_with(triple) {
                found.push(Artifact { path: entry.path(), triple, lean: name.ends_with("-lean") });
            }
        }
    }
    found
}

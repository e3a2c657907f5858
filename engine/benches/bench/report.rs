//! What a run was: machine, commit, date and command, and the JSON document `scripts/bench`
//! turns into BENCHMARKS.md.

use std::process::Command;

use frostline::model::Micros;
use frostline::model::time::{MICROS_PER_SECOND, format_rfc3339};
use serde::Serialize;

use crate::data::repo_root;
use crate::harness::{Figure, Skipped};

/// Set by `scripts/bench` to the command line it was run with.
const COMMAND_ENV: &str = "FROSTLINE_BENCH_COMMAND";

#[derive(Serialize)]
pub struct Machine {
    pub cpu_model: String,
    pub nproc: usize,
    pub memory_bytes: u64,
    pub loadavg_start: String,
    pub loadavg_end: String,
}

pub struct RunInfo {
    pub command: String,
    pub argv: Vec<String>,
    pub date: String,
    pub commit: String,
    pub rustc: String,
    pub machine: Machine,
}

impl RunInfo {
    pub fn collect(raw_args: &[String]) -> RunInfo {
        let given: Vec<&str> = raw_args.iter().map(String::as_str).filter(|a| *a != "--bench").collect();
        let command = std::env::var(COMMAND_ENV).unwrap_or_else(|_| {
            let mut command = String::from("cargo bench --bench frostline-bench");
            if !given.is_empty() {
                command.push_str(" -- ");
                command.push_str(&given.join(" "));
            }
            command
        });
        RunInfo {
            command,
            argv: std::env::args().collect(),
            date: now_rfc3339(),
            commit: git_commit(),
            rustc: run_text("rustc", &["--version"]).unwrap_or_else(|| "unknown".into()),
            machine: Machine {
                cpu_model: cpu_model(),
                nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
                memory_bytes: memory_bytes(),
                loadavg_start: read_loadavg(),
                loadavg_end: String::new(),
            },
        }
    }
}

#[allow(clippy::disallowed_methods)] // A report says when it ran; this is not engine logic.
fn now_rfc3339() -> String {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format_rfc3339(since_epoch.as_secs() as Micros * MICROS_PER_SECOND)
}

fn run_text(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program).args(args).current_dir(repo_root()).output().ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// `git rev-parse --short HEAD`, with `-uncommitted` when the work tree has changes.
fn git_commit() -> String {
    let Some(commit) = run_text("git", &["rev-parse", "--short", "HEAD"]) else {
        return "unknown".into();
    };
    match run_text("git", &["status", "--porcelain"]) {
        Some(status) if status.is_empty() => commit,
        _ => format!("{commit}-uncommitted"),
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

pub fn read_loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

#[derive(Serialize)]
pub struct ScenarioReport {
    pub name: &'static str,
    pub about: &'static str,
    pub seconds: f64,
}

#[derive(Serialize)]
pub struct OptionsReport {
    pub full: bool,
    pub repeats: usize,
    pub sample_ms: u64,
    pub only: Vec<String>,
}

#[derive(Serialize)]
pub struct Document<'a> {
    pub schema: u32,
    pub tool: &'static str,
    pub command: String,
    pub argv: Vec<String>,
    pub date: String,
    pub commit: String,
    pub rustc: String,
    pub machine: Machine,
    pub options: OptionsReport,
    pub ratio_definition: &'static str,
    pub total_seconds: f64,
    pub scenarios: Vec<ScenarioReport>,
    pub figures: &'a [Figure],
    pub skipped: &'a [Skipped],
}

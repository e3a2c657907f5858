//! frostline's benchmark harness:
//! `cargo bench --bench frostline-bench -- [--full] [--json FILE] [--only NAME] [--repeats N] [--list]`.
//!
//! `harness` times and records figures; `data` builds the records and directories the
//! scenarios share; `native` holds the built-in strategies' logic in native Rust, the
//! baseline of the plugin figures; each other module is one or two scenarios; `report`
//! describes the run (machine, commit, command) in the JSON `scripts/bench` turns into
//! BENCHMARKS.md.
//!
//! No framework. Every timed figure is taken R times (`REPEATS_DEFAULT`, or `--repeats`) and
//! reported as median, min and max: the machines this runs on are shared and noisy, so the
//! median is the figure quoted. A per-operation figure loops its operation long enough
//! (`SAMPLE_MS_DEFAULT`, `SAMPLE_MS_FULL` with `--full`) to swamp the timer. Figures that are
//! compared (WASM against the same logic in native Rust) are sampled round by round, one
//! sample of each per round, so a burst of load elsewhere on the machine hits both alike; so are
//! whole runs compared with a baseline (appends against plain redb, a pass against the I/O
//! floor), one run of each per round.
//!
//! A ratio is `baseline median / figure median` for a duration or a size (bytes, MiB) and
//! `figure median / baseline median` for a rate (records/s, MB/s), so either way 1.0 is as good
//! as the baseline, 0.25 four times slower (or larger), 300 three hundred times faster. A figure
//! may carry a target on its ratio; `scripts/bench` lists missed targets at the top of
//! BENCHMARKS.md, with a note on what limits the figure when the scenario measured one.
//!
//! Adding a scenario: write a `fn(&mut Bench) -> Result<()>` that records figures through
//! `Bench::compare`, `Bench::time_each` and `Bench::push` in a module of its own, and add a
//! row to `SCENARIOS`.
//!
//! `cargo bench` runs this binary from `engine/`, so a relative `--json` path is relative to
//! `engine/`; `scripts/bench` passes an absolute one.

mod append;
mod archive;
mod data;
mod delta;
mod delta_sync;
mod edge;
mod erase;
mod footprint;
mod formats;
mod harness;
mod late;
mod layout;
mod native;
mod plugins;
mod read;
mod reload;
mod report;
mod scale;
mod scale_archived;
mod small_files;
mod typed;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

use crate::harness::{Bench, Figure, RATIO_DEFINITION, REPEATS_DEFAULT, print_header, ratio_text};
use crate::report::{Document, Machine, OptionsReport, RunInfo, ScenarioReport, read_loadavg};

/// One named scenario.
struct Scenario {
    name: &'static str,
    about: &'static str,
    run: fn(&mut Bench) -> Result<()>,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "plugin-call",
        about: "host-to-guest call cost of each plugin role: the built-in calendar-year-utc strategy against the same function in native Rust, the eligible-before retention policy, a WASM archiver",
        run: plugins::plugin_call,
    },
    Scenario {
        name: "plugin-load",
        about: "compiling, loading from the compiled cache and instantiating each plugin component",
        run: plugins::plugin_load,
    },
    Scenario {
        name: "append",
        about: "append throughput through Engine::append and `frostline ingest` against plain redb inserts of the same records with the same durability, and with the WASM strategy against the same strategy in native Rust",
        run: append::append,
    },
    Scenario {
        name: "delta-sync",
        about: "a running engine's Delta sync after one new publication on a table of 100,000 archived buckets (files in its log) against one of 200, and against the first sync of a process (which reads every manifest)",
        run: delta_sync::delta_sync,
    },
    Scenario {
        name: "delta",
        about: "the Delta log of a Parquet table: archive throughput with it against without, the commit per publication with 1, 3 and 8 engines sharing a target, and delta-rs reading a year through the log against pyarrow reading the files",
        run: delta::delta,
    },
    Scenario {
        name: "archive",
        about: "archive throughput of run_pass to the local-directory target against the floor for the same bytes (write, fsync, read back, SHA-256), and against restic backing up the same records as files",
        run: archive::archive,
    },
    Scenario {
        name: "archive-large",
        about: "the archive scenario's pass against the floor and restic with 2,000,000 rows in the same 32 buckets (at most 3 rounds)",
        run: archive::archive_large,
    },
    Scenario {
        name: "erase",
        about: "an erasure of 1 % of the rows across 1,000 archived buckets (one row in each): passes until it is finished (next generations, replaced objects deleted and proved absent), against the first archival of the same buckets",
        run: erase::erase,
    },
    Scenario {
        name: "late",
        about: "a late record into an archived 100,000-row bucket: the pass that publishes its next generation (1 and 1,000 late records) and the bytes it rewrites, against the first archival of the same bucket; the append of a late record against one to a hot bucket",
        run: late::late,
    },
    Scenario {
        name: "hot-layout",
        about: "deleting archived buckets' hot rows from redb: key by key from one table (schema 1), redb's range primitives, and dropping a table per bucket (schema 2), with the longest write transaction of each",
        run: layout::hot_layout,
    },
    Scenario {
        name: "formats",
        about: "archive size and throughput per segment format for the same records, and a cold query of one bucket per format against the same query while the bucket is hot",
        run: formats::formats,
    },
    Scenario {
        name: "scale",
        about: "a pass over 1,000,000 buckets of which 64 are due against a pass over 1,000 buckets with the same 64 due",
        run: scale::scale,
    },
    Scenario {
        name: "scale-archived",
        about: "the work an engine repeats (passes, sweeps, status, a query, a verification, the metadata per bucket) on a store of 1,000,000 archived buckets against one of 1,000",
        run: scale_archived::scale_archived,
    },
    Scenario {
        name: "read",
        about: "a query across ten years of one partition written as JSON lines, hot and archived as Parquet, against DuckDB reading the same Parquet files",
        run: read::read,
    },
    Scenario {
        name: "small-files",
        about: "one year of day buckets of three partitions (1,098 Parquet files) against one file of the same rows, read by DuckDB, polars and Spark computing one aggregate",
        run: small_files::small_files,
    },
    Scenario {
        name: "typed",
        about: "declared columns: the archive pass over 200,000 flights-like rows with five typed columns against without, and DuckDB's average per carrier from a typed column against json_extract on body over the same files",
        run: typed::typed,
    },
    Scenario {
        name: "reload",
        about: "from a file renamed into the policy directory to the new set active, through the watcher `frostline run` runs: built-in plugins, a cached plugin file, a plugin file never compiled (p50 and p95)",
        run: reload::reload,
    },
    Scenario {
        name: "footprint",
        about: "start-up time of `frostline run` from the compiled cache, resident memory idle with the example policies and after archiving 1 GiB",
        run: footprint::footprint,
    },
    Scenario {
        name: "edge",
        about: "the release artifacts of scripts/release: stripped size of the full and lean builds per target, start-up to /health and idle memory (x86_64), start-up under qemu-aarch64 (aarch64)",
        run: edge::edge,
    },
];

/// Counts live heap for `with_peak_memory` when `FROSTLINE_BENCH_HEAP` is set.
#[global_allocator]
static ALLOCATOR: harness::CountingAllocator = harness::CountingAllocator;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("frostline-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let raw_args: Vec<String> = std::env::args().skip(1).collect();
    let options = Options::parse(&raw_args)?;
    if options.help {
        print!("{}", usage());
        return Ok(());
    }
    if options.list {
        for s in SCENARIOS {
            println!("{:<14} {}", s.name, s.about);
        }
        return Ok(());
    }
    let selected: Vec<&Scenario> =
        SCENARIOS.iter().filter(|s| options.only.is_empty() || options.only.iter().any(|o| o == s.name)).collect();

    let run_info = RunInfo::collect(&raw_args);
    println!("frostline-bench: {}", run_info.command);
    println!(
        "machine: {} ({} cores, {:.1} GiB), load average {}; commit {}; {}",
        run_info.machine.cpu_model,
        run_info.machine.nproc,
        run_info.machine.memory_bytes as f64 / harness::GIB,
        run_info.machine.loadavg_start,
        run_info.commit,
        run_info.date
    );
    println!(
        "each figure: median of {} runs (min..max beside it); ratio to baseline: above 1 faster, below 1 slower",
        options.repeats
    );

    let started = Instant::now();
    let mut bench = Bench::new(options);
    let mut scenario_reports = Vec::new();
    for scenario in selected {
        println!("\n== {}: {}", scenario.name, scenario.about);
        print_header();
        bench.scenario = scenario.name;
        let scenario_started = Instant::now();
        (scenario.run)(&mut bench).with_context(|| format!("scenario `{}` failed", scenario.name))?;
        scenario_reports.push(ScenarioReport {
            name: scenario.name,
            about: scenario.about,
            seconds: scenario_started.elapsed().as_secs_f64(),
        });
    }
    let total_seconds = started.elapsed().as_secs_f64();

    let missed: Vec<&Figure> = bench.figures.iter().filter(|f| f.target.as_ref().is_some_and(|t| !t.met)).collect();
    println!();
    if missed.is_empty() {
        println!("targets: all met");
    } else {
        println!("targets missed:");
        for f in &missed {
            let target = f.target.as_ref().expect("filtered on target");
            let measured = match &f.baseline {
                Some(b) if target.ratio_min.is_some() => format!("ratio {}", ratio_text(b.ratio)),
                _ => format!("{} {}", harness::number(f.median), f.unit.label()),
            };
            println!("  {} / {}: {measured}, target {} ({})", f.scenario, f.name, target.describe(), target.about);
            if let Some(note) = &f.note {
                println!("    what limits it: {note}");
            }
        }
    }
    println!("total: {total_seconds:.1} s");

    if let Some(path) = &bench.options.json {
        let document = Document {
            schema: 1,
            tool: "frostline-bench",
            command: run_info.command,
            argv: run_info.argv,
            date: run_info.date,
            commit: run_info.commit,
            rustc: run_info.rustc,
            machine: Machine { loadavg_end: read_loadavg(), ..run_info.machine },
            options: OptionsReport {
                full: bench.options.full,
                repeats: bench.options.repeats,
                sample_ms: bench.sample_ms(),
                only: bench.options.only.clone(),
            },
            ratio_definition: RATIO_DEFINITION,
            total_seconds,
            scenarios: scenario_reports,
            figures: &bench.figures,
            skipped: &bench.skipped,
        };
        let text = serde_json::to_string_pretty(&document)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Command line

pub struct Options {
    pub full: bool,
    pub json: Option<PathBuf>,
    pub only: Vec<String>,
    pub repeats: usize,
    pub list: bool,
    pub help: bool,
}

fn usage() -> String {
    let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
    format!(
        "usage: cargo bench --bench frostline-bench -- [--full] [--json FILE] [--only NAME]... [--repeats N] [--list]\n\
         \n\
         --full        longer samples, every compile repeated R times, extra batch sizes,\n\
                       1,000,000 records in append (default 100,000)\n\
                       and ten years of 1,000 records a day in the range query (default 100)\n\
         --json FILE   also write every figure as JSON (relative to engine/)\n\
         --only NAME   run only this scenario (repeatable, or comma-separated): {}\n\
         --repeats N   runs per figure (default {REPEATS_DEFAULT})\n\
         --list        list the scenarios\n\
         \n\
         {}=DIR adds the Python and JavaScript examples (DIR/iso-week-py.wasm,\n\
         DIR/fiscal-quarter-js.wasm, built by plugins/examples/build.sh DIR) to plugin-load.\n\
         append and footprint run $CARGO_TARGET_DIR/release/frostline (default: the target directory\n\
         of this binary; scripts/bench builds it). archive compares with `restic` when it is on the\n\
         PATH (scripts/bench installs Debian's package into .tools/restic).\n",
        names.join(", "),
        plugins::EXAMPLE_PLUGINS_ENV
    )
}

impl Options {
    fn parse(args: &[String]) -> Result<Options> {
        let mut options =
            Options { full: false, json: None, only: Vec::new(), repeats: REPEATS_DEFAULT, list: false, help: false };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value =
                |flag: &str| args.next().cloned().with_context(|| format!("{flag} needs a value\n\n{}", usage()));
            match arg.as_str() {
                // `cargo bench` passes `--bench` to every bench binary.
                "--bench" => {}
                "--full" => options.full = true,
                "--list" => options.list = true,
                "-h" | "--help" => options.help = true,
                "--json" => options.json = Some(PathBuf::from(value("--json")?)),
                "--only" => options.only.extend(value("--only")?.split(',').map(|s| s.trim().to_string())),
                "--repeats" => {
                    let text = value("--repeats")?;
                    options.repeats = text
                        .parse()
                        .ok()
                        .filter(|n| *n >= 1)
                        .with_context(|| format!("--repeats takes a whole number of at least 1, not `{text}`"))?;
                }
                other => bail!("unknown argument `{other}`\n\n{}", usage()),
            }
        }
        for name in &options.only {
            ensure!(
                SCENARIOS.iter().any(|s| s.name == name),
                "unknown scenario `{name}` in --only; the scenarios are: {}",
                SCENARIOS.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
            );
        }
        Ok(options)
    }
}

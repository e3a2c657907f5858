//! Scenarios plugin-call (the host-to-guest cost of each role) and plugin-load (compile,
//! cached load and instantiation per component and language).

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, bail, ensure};
use frostline::model::time::MICROS_PER_DAY;
use frostline::model::{BucketFacts, BucketState, BucketStrategy as _, Micros, RetentionPolicy as _};
use frostline::plugin::archiver::{BackendAnswer, WasmArchiver};
use frostline::plugin::builtin;
use frostline::plugin::retention::WasmRetention;
use frostline::plugin::strategy::WasmStrategy;
use frostline::plugin::{LoadedPlugin, PluginHost, PluginLimits, PluginSource, Role};
use frostline_civil::days_from_civil;
use sha2::{Digest as _, Sha256};

use crate::data::{TIMES_SEED, splitmix64};
use crate::harness::{Bench, Figure, Unit, case};
use crate::native::{CalendarUnit, SUPPORTED_END_MICROS, SUPPORTED_START_MICROS, calendar_bucket, calendar_year_batch};

/// Times per batch in the `plugin-call` batch figures.
const BATCH_TIMES: usize = 1_000;
/// Extra batch sizes measured with `--full` (4,096 is the host's batch maximum).
const BATCH_TIMES_FULL: &[usize] = &[1, 10, 100, 4_096];
/// Compiling an interpreter component (12-18 MB) takes seconds, so without `--full` it is
/// repeated only this many times to keep the default run short.
const SLOW_COMPILE_REPEATS_DEFAULT: usize = 3;
const SLOW_COMPILE_BYTES_MIN: usize = 1024 * 1024;
/// The cached strategy path (descriptor cache hit) should be within 5% of native speed.
const CACHED_PATH_RATIO_MIN: f64 = 0.95;
/// Names a directory holding the Python and JavaScript example components.
pub const EXAMPLE_PLUGINS_ENV: &str = "FROSTLINE_EXAMPLE_PLUGINS";
/// Buckets per retention `plan` call in the batch figure (the host's batch maximum).
const PLAN_BATCH_BUCKETS: usize = frostline::plugin::retention::RETENTION_BATCH_BUCKETS_MAX;
/// Object sizes of the archiver figures.
const ARCHIVER_OBJECT_BYTES: &[usize] = &[1024, 64 * 1024];

/// `count` pseudo-random times in [1970, 2100), unsorted: each falls in one of 130 years, so
/// consecutive times rarely share a bucket and both sides compute every answer.
fn spread_times(count: usize) -> Vec<Micros> {
    let span = (days_from_civil(2100, 1, 1) * MICROS_PER_DAY) as u64;
    let mut state = TIMES_SEED;
    (0..count).map(|_| (splitmix64(&mut state) % span) as Micros).collect()
}

/// `count` sorted times within 2025, like one batch of appends.
fn times_in_one_year(count: usize) -> Vec<Micros> {
    let start = days_from_civil(2025, 1, 1) * MICROS_PER_DAY;
    let span = (365 * MICROS_PER_DAY) as u64;
    let mut state = TIMES_SEED ^ 1;
    let mut times: Vec<Micros> = (0..count).map(|_| start + (splitmix64(&mut state) % span) as Micros).collect();
    times.sort_unstable();
    times
}

fn calendar_year_strategy(host: &PluginHost) -> Result<WasmStrategy> {
    let builtin = builtin::find("calendar-year-utc").context("the built-in calendar-year-utc is missing")?;
    let loaded = host.load(&builtin.source(), Role::BucketStrategy, PluginLimits::default())?;
    let config = builtin.effective_config("").map_err(anyhow::Error::msg)?;
    Ok(WasmStrategy::new(loaded, config)?)
}

/// Checks that the guest and the native function give identical answers, so the comparison
/// is of equal work.
fn check_same_answers(strategy: &WasmStrategy, times: &[Micros]) -> Result<()> {
    let same = |t: Micros, d: &frostline::model::BucketDescriptor| -> Result<()> {
        let native = calendar_bucket(CalendarUnit::Year, t).map_err(anyhow::Error::msg)?;
        ensure!(native == *d, "native and WASM disagree at {t}: native {native:?}, WASM {d:?}");
        Ok(())
    };
    let edges = [SUPPORTED_START_MICROS, -1, 0, 1, SUPPORTED_END_MICROS - 1];
    for &t in edges.iter().chain(times) {
        same(t, &strategy.ask_one_uncached(t)?.map_err(anyhow::Error::msg)?)?;
    }
    for (&t, d) in times.iter().zip(strategy.ask_uncached(times)?) {
        same(t, &d.map_err(anyhow::Error::msg)?)?;
    }
    for (&t, d) in times.iter().zip(strategy.buckets_for(times)?) {
        same(t, &d)?;
    }
    ensure!(calendar_bucket(CalendarUnit::Year, SUPPORTED_END_MICROS).is_err(), "native accepts a time past year 9999");
    ensure!(strategy.ask_one_uncached(SUPPORTED_END_MICROS)?.is_err(), "WASM accepts a time past year 9999");
    Ok(())
}

pub fn plugin_call(bench: &mut Bench) -> Result<()> {
    let host = PluginHost::new(None)?;
    let strategy = calendar_year_strategy(&host)?;
    let times = spread_times(BATCH_TIMES);
    // Also fills the descriptor cache with every bucket `times` falls in.
    check_same_answers(&strategy, &times)?;

    // One call per time: the raw cost of crossing the boundary.
    let mut next_wasm = times.iter().copied().cycle();
    let mut next_native = times.iter().copied().cycle();
    let [wasm_one, native_one]: [Figure; 2] = bench
        .compare(vec![
            case("WASM bucket-for, one call per time (ask_one_uncached)", Unit::NsPerCall, 1, || {
                let t = next_wasm.next().expect("cycle");
                let d = strategy.ask_one_uncached(black_box(t))?.map_err(anyhow::Error::msg)?;
                black_box(d);
                Ok(())
            }),
            case("native bucket_for", Unit::NsPerCall, 1, || {
                let t = next_native.next().expect("cycle");
                black_box(calendar_bucket(CalendarUnit::Year, black_box(t)).map_err(anyhow::Error::msg)?);
                Ok(())
            }),
        ])?
        .try_into()
        .expect("two cases");
    let wasm_one = wasm_one.against(&native_one);
    bench.push(native_one);
    bench.push(wasm_one);

    // Batches: the boundary cost shared by 1,000 times, and the host's descriptor cache.
    let mut batch_sizes = vec![BATCH_TIMES];
    if bench.options.full {
        batch_sizes.extend_from_slice(BATCH_TIMES_FULL);
    }
    for size in batch_sizes {
        let batch = spread_times(size);
        let [wasm, native]: [Figure; 2] = bench
            .compare(vec![
                case(
                    format!("WASM buckets-for, batch of {size}, 130 years (ask_uncached)"),
                    Unit::NsPerTime,
                    size as u64,
                    || {
                        black_box(strategy.ask_uncached(black_box(&batch))?);
                        Ok(())
                    },
                ),
                case(format!("native bucket_for, batch of {size}, 130 years"), Unit::NsPerTime, size as u64, || {
                    black_box(calendar_year_batch(black_box(&batch)).map_err(anyhow::Error::msg)?);
                    Ok(())
                }),
            ])?
            .try_into()
            .expect("two cases");
        let wasm = wasm.against(&native);
        bench.push(native);
        bench.push(wasm);
    }

    // The cached path: every time falls in a bucket the host already knows.
    let mut cached_sets = vec![("batch of 1000, 130 years", times.clone())];
    if bench.options.full {
        let one_year = times_in_one_year(BATCH_TIMES);
        strategy.buckets_for(&one_year)?;
        cached_sets.push(("batch of 1000, sorted, one year", one_year));
    }
    let calls = || strategy.counters().calls.load(Ordering::Relaxed);
    for (label, set) in cached_sets {
        let calls_before = calls();
        let [cached, native]: [Figure; 2] = bench
            .compare(vec![
                case(
                    format!("WASM strategy, cached path, {label} (buckets_for)"),
                    Unit::NsPerTime,
                    set.len() as u64,
                    || {
                        black_box(strategy.buckets_for(black_box(&set))?);
                        Ok(())
                    },
                ),
                case(format!("native bucket_for, {label}"), Unit::NsPerTime, set.len() as u64, || {
                    black_box(calendar_year_batch(black_box(&set)).map_err(anyhow::Error::msg)?);
                    Ok(())
                }),
            ])?
            .try_into()
            .expect("two cases");
        // The figure is of the cache only if the plugin was never asked while it was timed.
        let asked = calls() - calls_before;
        ensure!(asked == 0, "the cached path called the plugin {asked} times; its buckets were not all known");
        let cached = cached
            .against(&native)
            .with_target(CACHED_PATH_RATIO_MIN, "the cached strategy path runs at >= 95% of native speed");
        bench.push(native);
        bench.push(cached);
    }
    let faults = strategy.counters().faults.load(Ordering::Relaxed);
    ensure!(faults == 0, "the strategy faulted {faults} times during {} calls", calls());
    retention_calls(bench, &host)?;
    archiver_calls(bench, &host)
}

/// What an archiver answered, without its payload.
fn describe<T>(answer: &BackendAnswer<T>) -> String {
    match answer {
        BackendAnswer::Ok(_) => "an answer of the wrong size".into(),
        BackendAnswer::NotFound => "not found".into(),
        BackendAnswer::AlreadyExists => "already exists".into(),
        BackendAnswer::Transient(e) => format!("transient error: {e}"),
        BackendAnswer::Permanent(e) => format!("permanent error: {e}"),
    }
}

/// The built-in eligible-before policy's `plan`: one bucket per call (the raw boundary cost of
/// the role) and the host's largest batch (the cost per bucket as the pass plans them).
fn retention_calls(bench: &mut Bench, host: &PluginHost) -> Result<()> {
    let builtin = builtin::find("eligible-before").context("the built-in eligible-before is missing")?;
    let loaded = host.load(&builtin.source(), Role::RetentionPolicy, PluginLimits::default())?;
    let config = builtin.effective_config(r#"{"archive_after": "7d"}"#).map_err(anyhow::Error::msg)?;
    let retention = WasmRetention::new(loaded, config)?;
    let now = days_from_civil(2026, 1, 1) * MICROS_PER_DAY;
    let facts: Vec<BucketFacts> = (0..PLAN_BATCH_BUCKETS as Micros)
        .map(|day| {
            let start = now - (day + 1) * MICROS_PER_DAY;
            BucketFacts {
                table: "readings".into(),
                partition_key: format!("sensor-{:03}", day % 64).into_bytes(),
                tenant: None,
                kind: None,
                bucket: frostline::model::BucketDescriptor {
                    key: frostline::model::time::format_rfc3339(start),
                    start,
                    end: start + MICROS_PER_DAY,
                },
                row_count: 1_000,
                byte_count: 200_000,
                state: BucketState::Hot,
                archived_at: None,
            }
        })
        .collect();
    // Every answer must be a plan, or the figure would time refusals.
    for plan in retention.plan(now, &facts)? {
        plan.map_err(|reason| anyhow::anyhow!("eligible-before refused a bucket: {reason}"))?;
    }
    let mut next = facts.iter().cycle();
    let figures = bench.compare(vec![
        case("eligible-before plan, one bucket per call", Unit::NsPerCall, 1, || {
            let one = std::slice::from_ref(next.next().expect("cycle"));
            black_box(retention.plan(now, black_box(one))?);
            Ok(())
        }),
        case(
            format!("eligible-before plan, batch of {PLAN_BATCH_BUCKETS} buckets (per bucket)"),
            Unit::NsPerTime,
            PLAN_BATCH_BUCKETS as u64,
            || {
                black_box(retention.plan(now, black_box(&facts))?);
                Ok(())
            },
        ),
    ])?;
    for figure in figures {
        bench.push(figure);
    }
    Ok(())
}

/// A WASM archiver (the test suite's memory archiver, which keeps objects in its own linear
/// memory): get, create + delete, and list, per call, for small and larger objects. What is
/// timed is the boundary and the copies across it, not a storage medium.
fn archiver_calls(bench: &mut Bench, host: &PluginHost) -> Result<()> {
    let path = Path::new(builtin::GUEST_DIR).join("memory_archiver.wasm");
    let loaded = host.load(&PluginSource::from_file(&path)?, Role::Archiver, PluginLimits::default())?;
    let archiver = WasmArchiver::new(loaded, String::new())?;
    let expect_ok = |answer: BackendAnswer<()>, what: &str| -> Result<()> {
        match answer {
            BackendAnswer::Ok(()) => Ok(()),
            other => bail!("{what}: the archiver answered {other:?}"),
        }
    };
    for index in 0..100 {
        expect_ok(archiver.put(&format!("listed/{index:04}"), b"x")?, "put")?;
    }
    let mut payloads = Vec::new();
    for &size in ARCHIVER_OBJECT_BYTES {
        let key = format!("object-{size}");
        let payload = vec![0x5a_u8; size];
        expect_ok(archiver.put(&key, &payload)?, "put")?;
        payloads.push((size, key, payload));
    }
    let mut cases = Vec::new();
    for (size, key, payload) in &payloads {
        let archiver = &archiver;
        cases.push(case(
            format!("archiver get, {} KiB object", size / 1024),
            Unit::NsPerCall,
            1,
            move || match archiver.get(black_box(key))? {
                BackendAnswer::Ok(bytes) if bytes.len() == payload.len() => Ok(()),
                other => bail!("get `{key}`: {}", describe(&other)),
            },
        ));
        let fresh = format!("fresh-{size}");
        cases.push(case(
            format!("archiver put (create-only) + delete, {} KiB object", size / 1024),
            Unit::NsPerCall,
            1,
            move || {
                expect_ok(archiver.put(&fresh, black_box(payload))?, "put")?;
                expect_ok(archiver.delete(&fresh)?, "delete")
            },
        ));
    }
    let archiver_ref = &archiver;
    cases.push(case("archiver list, 100 keys", Unit::NsPerCall, 1, move || {
        match archiver_ref.list("listed/", None, 1_000)? {
            BackendAnswer::Ok(keys) if keys.len() == 100 => Ok(()),
            other => bail!("list: {}", describe(&other)),
        }
    }));
    for figure in bench.compare(cases)? {
        bench.push(figure);
    }
    let faults = archiver.counters().faults.load(Ordering::Relaxed);
    ensure!(faults == 0, "the archiver faulted {faults} times");
    Ok(())
}

/// A component to load, with the role and configuration it is instantiated with.
struct Subject {
    label: String,
    source: PluginSource,
    role: Role,
    config: String,
}

/// The example components looked for in `$FROSTLINE_EXAMPLE_PLUGINS`: file, label, config.
const EXAMPLES: &[(&str, &str, &str)] = &[
    ("iso-week-py.wasm", "iso-week-py (Python)", ""),
    ("fiscal-quarter-js.wasm", "fiscal-quarter-js (JavaScript)", r#"{"first_month": 4}"#),
];

fn subjects(bench: &mut Bench) -> Result<Vec<Subject>> {
    let mut out = Vec::new();
    for (name, label) in [
        ("calendar-year-utc", "calendar_utc (built-in, Rust)"),
        ("eligible-before", "eligible_before (built-in, Rust)"),
    ] {
        let builtin = builtin::find(name).with_context(|| format!("the built-in {name} is missing"))?;
        out.push(Subject {
            label: label.to_string(),
            source: builtin.source(),
            role: builtin.role,
            config: builtin.effective_config("").map_err(anyhow::Error::msg)?,
        });
    }
    let rows: Vec<&str> = EXAMPLES.iter().map(|(file, _, _)| *file).collect();
    match std::env::var_os(EXAMPLE_PLUGINS_ENV) {
        None => bench.skip(
            &rows,
            format!(
                "{EXAMPLE_PLUGINS_ENV} is not set; build the examples with `plugins/examples/build.sh DIR` \
                 and run with {EXAMPLE_PLUGINS_ENV}=DIR to include them"
            ),
        ),
        Some(dir) => {
            let dir = PathBuf::from(dir);
            for (file, label, config) in EXAMPLES {
                let path = dir.join(file);
                if !path.is_file() {
                    bench.skip(&[*file], format!("{EXAMPLE_PLUGINS_ENV}={} holds no {file}", dir.display()));
                    continue;
                }
                out.push(Subject {
                    label: label.to_string(),
                    source: PluginSource::from_file(&path)?,
                    role: Role::BucketStrategy,
                    config: config.to_string(),
                });
            }
        }
    }
    Ok(out)
}

pub fn plugin_load(bench: &mut Bench) -> Result<()> {
    let repeats = bench.options.repeats;
    let host_new = bench.time_each(
        "PluginHost::new (engine, linker, WASI)",
        Unit::Millis,
        repeats,
        || Ok(()),
        |()| Ok(PluginHost::new(None)?),
    )?;
    bench.push(host_new);

    for subject in subjects(bench)? {
        let bytes = subject.source.bytes.len();
        bench.push(Figure::new(bench.scenario, format!("{}: size", subject.label), Unit::Bytes, vec![bytes as f64], 1));

        let compile_repeats = if !bench.options.full && bytes >= SLOW_COMPILE_BYTES_MIN {
            SLOW_COMPILE_REPEATS_DEFAULT.min(repeats)
        } else {
            repeats
        };
        // The first compile's cache directory is kept for the cached loads.
        let mut cache_dir: Option<tempfile::TempDir> = None;
        let compile = bench.time_each(
            format!("{}: compile (new host, empty cache)", subject.label),
            Unit::Millis,
            compile_repeats,
            || {
                let dir = tempfile::tempdir()?;
                let host = PluginHost::new(Some(dir.path().to_path_buf()))?;
                Ok((dir, host))
            },
            |(dir, host)| {
                let loaded = host.load(&subject.source, subject.role, PluginLimits::default())?;
                let stats = host.cache_stats();
                ensure!(stats.compiled == 1 && stats.disk_hits == 0, "expected a compile, got {stats:?}");
                let dir = if cache_dir.is_none() {
                    cache_dir = Some(dir);
                    None
                } else {
                    Some(dir)
                };
                Ok((dir, host, loaded))
            },
        )?;
        let cache_path = cache_dir.as_ref().context("no compile ran")?.path().to_path_buf();

        let mut last_loaded: Option<Arc<LoadedPlugin>> = None;
        let cached = bench.time_each(
            format!("{}: cached load (new host, warm cache)", subject.label),
            Unit::Millis,
            repeats,
            || Ok(PluginHost::new(Some(cache_path.clone()))?),
            |host| {
                let loaded = host.load(&subject.source, subject.role, PluginLimits::default())?;
                let stats = host.cache_stats();
                ensure!(stats.disk_hits == 1 && stats.compiled == 0, "expected a cache hit, got {stats:?}");
                last_loaded = Some(loaded);
                Ok(host)
            },
        )?;
        let cached = cached.against(&compile);
        bench.push(compile);
        bench.push(cached);

        // What a cached load must still do whatever the cache holds: hash the component (its
        // identity) and read, verify and map the compiled artifact, which is larger.
        let artifact_bytes = std::fs::metadata(artifact_path(&cache_path)?)?.len();
        bench.push(Figure::new(
            bench.scenario,
            format!("{}: compiled artifact size", subject.label),
            Unit::Bytes,
            vec![artifact_bytes as f64],
            1,
        ));
        let [hash]: [Figure; 1] = bench
            .compare(vec![case(
                format!("{}: SHA-256 of the component (every load)", subject.label),
                Unit::Millis,
                1,
                || {
                    black_box(Sha256::digest(black_box(&subject.source.bytes[..])));
                    Ok(())
                },
            )])?
            .try_into()
            .expect("one case");
        bench.push(hash);
        let artifact_path = artifact_path(&cache_path)?;
        let [check]: [Figure; 1] = bench
            .compare(vec![case(
                format!("{}: read + SHA-256 of the artifact (cached)", subject.label),
                Unit::Millis,
                1,
                || {
                    let bytes = std::fs::read(black_box(&artifact_path))?;
                    black_box(Sha256::digest(&bytes));
                    Ok(())
                },
            )])?
            .try_into()
            .expect("one case");
        bench.push(check);

        let loaded = last_loaded.context("no cached load ran")?;
        let [instantiate]: [Figure; 1] = bench
            .compare(vec![case(
                format!("{}: instantiate + init ({})", subject.label, constructor_name(subject.role)),
                Unit::Micros,
                1,
                || instantiate(&loaded, subject.role, &subject.config),
            )])?
            .try_into()
            .expect("one case");
        bench.push(instantiate);
    }
    Ok(())
}

/// The one compiled artifact in a cache directory.
fn artifact_path(cache_dir: &Path) -> Result<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(cache_dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "cwasm") {
            found.push(path);
        }
    }
    ensure!(found.len() == 1, "expected one compiled artifact in {}, found {}", cache_dir.display(), found.len());
    Ok(found.remove(0))
}

fn constructor_name(role: Role) -> &'static str {
    match role {
        Role::BucketStrategy => "WasmStrategy::new",
        Role::RetentionPolicy => "WasmRetention::new",
        Role::Archiver => "WasmArchiver::new",
    }
}

fn instantiate(loaded: &Arc<LoadedPlugin>, role: Role, config: &str) -> Result<()> {
    match role {
        Role::BucketStrategy => drop(black_box(WasmStrategy::new(loaded.clone(), config.to_string())?)),
        Role::RetentionPolicy => drop(black_box(WasmRetention::new(loaded.clone(), config.to_string())?)),
        Role::Archiver => drop(black_box(WasmArchiver::new(loaded.clone(), config.to_string())?)),
    }
    Ok(())
}

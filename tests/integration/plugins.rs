//! The plugin host: conformance of the built-ins and examples, limits (each an obeyed and a
//! violated case), refusals, the sandbox, answer checks and the compiled cache.

use std::time::{Duration, Instant};

use frostline::model::BucketStrategy;
use frostline::plugin::strategy::WasmStrategy;
use frostline::plugin::{PluginHost, PluginLimits, PluginSource, Role, builtin};
use frostline::{Error, ErrorKind};

use crate::support::*;

fn hostile(mode: &str, limits: PluginLimits) -> WasmStrategy {
    let loaded = load(&test_plugin("hostile_strategy"), Role::BucketStrategy, limits);
    WasmStrategy::new(loaded, format!(r#"{{"mode":"{mode}"}}"#)).unwrap_or_else(|e| panic!("{e}"))
}

fn check_passes(source: &PluginSource, role: Role, config: &str) {
    let report = frostline::ops::plugin_check::check(shared_host(), source, role, config.to_string(), 42)
        .unwrap_or_else(|e| panic!("{}: {e}", source.name));
    assert!(report.passed(), "{report}");
}

#[test]
fn builtin_strategies_pass_conformance() {
    for name in ["calendar-year-utc", "calendar-month-utc", "calendar-day-utc"] {
        let b = builtin::find(name).unwrap();
        check_passes(&b.source(), Role::BucketStrategy, &b.effective_config("").unwrap());
    }
}

#[test]
fn builtin_retention_passes_conformance_with_overrides() {
    let b = builtin::find("eligible-before").unwrap();
    check_passes(&b.source(), Role::RetentionPolicy, "");
    let config = r#"{"expire_after":"3650d","tenants":{"acme":{"archive_after":"30d"}},"kinds":{"audit":{"expire_after":"1y"}}}"#;
    check_passes(&b.source(), Role::RetentionPolicy, config);
}

#[test]
fn memory_archiver_passes_conformance() {
    check_passes(&test_plugin("memory_archiver"), Role::Archiver, "");
}

#[test]
fn python_and_javascript_strategies_pass_conformance() {
    check_passes(&example_plugin("iso-week-py.wasm"), Role::BucketStrategy, "");
    check_passes(&example_plugin("fiscal-quarter-js.wasm"), Role::BucketStrategy, r#"{"first_month":4}"#);
}

#[test]
fn calendar_keys_are_canonical_across_edges() {
    let b = builtin::find("calendar-day-utc").unwrap();
    let s = WasmStrategy::new(
        load(&b.source(), Role::BucketStrategy, PluginLimits::default()),
        b.effective_config("").unwrap(),
    )
    .unwrap();
    let t = |s: &str| frostline::model::time::parse_rfc3339(s).unwrap();
    assert_eq!(s.bucket_for(t("2024-02-29T23:59:59.999999Z")).unwrap().key, "day:2024-02-29");
    assert_eq!(s.bucket_for(-1).unwrap().key, "day:1969-12-31");
    assert_eq!(s.bucket_for(t("9999-12-31T12:00:00Z")).unwrap().key, "day:9999-12-31");
    let err = s.bucket_for(t("0000-12-31T00:00:00Z")).unwrap_err().to_string();
    assert!(err.contains("supported range"), "{err}");
}

#[test]
fn endless_loop_is_stopped_within_twice_the_deadline_and_next_call_works() {
    let limits = PluginLimits { call_ms: 200, ..Default::default() };
    let s = hostile("normal", limits);
    // Obeyed: an ordinary call well inside the limit.
    assert_eq!(s.ask_one_uncached(0).unwrap().unwrap().key, "hour:0");
    // Violated: an endless loop.
    let started = Instant::now();
    let err = s.ask_one_uncached(-1).unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_millis(400), "stopped after {elapsed:?}");
    assert_eq!(err.kind(), ErrorKind::PluginFault);
    let message = err.to_string();
    assert!(message.contains("hostile_strategy") && message.contains("time limit of 200 ms"), "{message}");
    // The instance was replaced: the next call works.
    assert_eq!(s.ask_one_uncached(3_600_000_000).unwrap().unwrap().key, "hour:1");
}

/// Regression (issue: a plugin that sleeps is never stopped): a sleep is a clock subscription
/// and a blocking poll, a host call where the epoch deadline never fires, so a strategy that
/// slept held its instance (and every append to its table) for as long as it liked.
#[test]
fn a_strategy_that_sleeps_is_stopped_at_its_time_limit_and_the_next_call_works() {
    let limits = PluginLimits { call_ms: 200, ..Default::default() };
    let s = hostile("normal", limits);
    let started = Instant::now();
    let err = s.ask_one_uncached(-4).unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(2), "stopped after {elapsed:?}, not at its limit");
    assert_eq!(err.kind(), ErrorKind::PluginFault);
    let message = err.to_string();
    assert!(message.contains("time limit of 200 ms") && message.contains("waited"), "{message}");
    assert_eq!(s.ask_one_uncached(3_600_000_000).unwrap().unwrap().key, "hour:1");
}

#[test]
fn unbounded_allocation_is_stopped_at_the_memory_limit() {
    let limits = PluginLimits { memory_bytes: 16 * 1024 * 1024, ..Default::default() };
    let s = hostile("normal", limits);
    let err = s.ask_one_uncached(-2).unwrap_err().to_string();
    assert!(err.contains("out of memory") && err.contains("16777216"), "{err}");
    assert!(s.ask_one_uncached(5).unwrap().is_ok(), "a fresh instance serves the next call");
}

#[test]
fn memory_within_the_limit_is_allowed() {
    // Obeyed: the same plugin grows to a few MiB while instantiating and answering, far below 64 MiB.
    let s = hostile("normal", PluginLimits::default());
    for i in 0..100 {
        assert!(s.ask_one_uncached(i * 3_600_000_000).unwrap().is_ok());
    }
}

#[test]
fn trap_is_reported_with_the_plugin_name_and_hash() {
    let s = hostile("normal", PluginLimits::default());
    let err = s.ask_one_uncached(-3).unwrap_err();
    let Error::PluginFault { plugin, hash, call, cause } = &err else { panic!("{err}") };
    assert!(plugin.ends_with("hostile_strategy.wasm"));
    assert_eq!(hash.len(), 12);
    assert_eq!(call, "bucket-for");
    assert!(cause.contains("trap"), "{cause}");
    assert!(s.ask_one_uncached(7).unwrap().is_ok());
}

#[test]
fn repeated_faults_suspend_the_plugin() {
    let s = hostile("normal", PluginLimits::default());
    for _ in 0..frostline::plugin::instance::PLUGIN_FAULTS_BEFORE_SUSPEND {
        assert!(matches!(s.ask_one_uncached(-3), Err(Error::PluginFault { .. })));
    }
    let err = s.ask_one_uncached(7).unwrap_err();
    assert!(matches!(err, Error::PluginSuspended { .. }), "{err}");
}

/// Invalid answers count towards the crash-loop breaker as faults do: five in a row suspend
/// the plugin. (A call that returned cleared the count before its answer was checked, so
/// invalid answers alone never suspended it.)
#[test]
fn repeated_invalid_answers_suspend_the_plugin() {
    let s = hostile("bad-key", PluginLimits::default());
    for _ in 0..frostline::plugin::instance::PLUGIN_FAULTS_BEFORE_SUSPEND {
        let err = s.buckets_for(&[10]).unwrap_err();
        assert!(matches!(err, Error::PluginInvalidAnswer { .. }), "{err}");
    }
    let err = s.buckets_for(&[10]).unwrap_err();
    assert!(matches!(err, Error::PluginSuspended { .. }), "{err}");
}

/// An accepted answer starts the count again: four faults, an answer, four faults do not
/// suspend the plugin.
#[test]
fn an_accepted_answer_starts_the_fault_count_again() {
    let s = hostile("normal", PluginLimits::default());
    let faults = frostline::plugin::instance::PLUGIN_FAULTS_BEFORE_SUSPEND - 1;
    for round in 0..2 {
        for _ in 0..faults {
            assert!(matches!(s.ask_one_uncached(-3), Err(Error::PluginFault { .. })), "round {round}");
        }
        assert!(s.ask_one_uncached(7).unwrap().is_ok(), "round {round}: not suspended");
    }
}

#[test]
fn invalid_answers_are_refused_by_the_host() {
    for (mode, expected) in
        [("bad-contains", "does not contain"), ("bad-order", "not before end"), ("bad-key", "not canonical")]
    {
        let s = hostile(mode, PluginLimits::default());
        let err = s.buckets_for(&[10]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PluginFault, "{mode}");
        assert!(err.to_string().contains(expected), "{mode}: {err}");
    }
}

#[test]
fn unstable_strategy_fails_conformance() {
    let report = frostline::ops::plugin_check::check(
        shared_host(),
        &test_plugin("hostile_strategy"),
        Role::BucketStrategy,
        r#"{"mode":"unstable"}"#.into(),
        7,
    )
    .unwrap();
    assert!(!report.passed());
}

#[test]
fn refusals_name_the_file_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty.wasm", vec![], "empty"),
        ("text.wasm", b"this is not wasm".to_vec(), "not WebAssembly"),
        ("core.wasm", b"\0asm\x01\0\0\0".to_vec(), "core WebAssembly module"),
    ];
    for (name, bytes, expected) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let err = shared_host()
            .load(&PluginSource::from_file(&path).unwrap(), Role::BucketStrategy, PluginLimits::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(name) && err.contains(expected), "{err}");
    }
    let other_world = shared_host()
        .load(&test_plugin("memory_archiver"), Role::BucketStrategy, PluginLimits::default())
        .unwrap_err()
        .to_string();
    assert!(
        other_world.contains("memory_archiver.wasm") && other_world.contains("implements archiver"),
        "{other_world}"
    );
    let wrong_version = shared_host()
        .load(&test_plugin("wrong_version"), Role::BucketStrategy, PluginLimits::default())
        .unwrap_err()
        .to_string();
    assert!(
        wrong_version.contains("wrong_version.wasm") && wrong_version.contains("contract version 9.0.0"),
        "{wrong_version}"
    );
}

#[test]
fn init_refusal_is_a_configuration_error() {
    let loaded = load(&test_plugin("hostile_strategy"), Role::BucketStrategy, PluginLimits::default());
    let err = WasmStrategy::new(loaded, r#"{"mode":"refuse"}"#.into()).err().unwrap();
    assert!(
        matches!(&err, Error::PluginConfig { message, .. } if message.contains("refused by configuration")),
        "{err}"
    );
    let b = builtin::find("eligible-before").unwrap();
    let loaded = load(&b.source(), Role::RetentionPolicy, PluginLimits::default());
    let err =
        frostline::plugin::retention::WasmRetention::new(loaded, r#"{"expire_after":"0s"}"#.into()).err().unwrap();
    assert!(err.to_string().contains("expire_after"), "{err}");
}

fn probe(config: &str) -> String {
    let loaded = load(&test_plugin("hostile_strategy"), Role::BucketStrategy, PluginLimits::default());
    match WasmStrategy::new(loaded, config.to_string()) {
        Err(Error::PluginConfig { message, .. }) => message,
        other => panic!("expected the probe's report, got {:?}", other.err()),
    }
}

#[test]
fn plugin_cannot_read_files_see_the_environment_or_open_sockets() {
    let fs = probe(r#"{"mode":"probe-fs"}"#);
    assert!(fs.contains("probe-fs: denied"), "{fs}");
    // SAFETY: tests in this binary do not read this variable concurrently.
    unsafe { std::env::set_var("FROSTLINE_SECRET_FOR_TEST", "hunter2") };
    let env = probe(r#"{"mode":"probe-env"}"#);
    assert_eq!(env, "probe-env: vars=0 args=0");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let net = probe(&format!(r#"{{"mode":"probe-net","port":{port}}}"#));
    assert!(net.contains("probe-net: denied"), "{net}");
}

/// Strategies and retention policies answer from their input alone: their WASI clocks stand
/// still at the Unix epoch and their random bytes are zeros, so two instances see the same time
/// and the same random keys, and a strategy whose keys carry the wall clock answers alike twice
/// (it failed its conformance check as unstable when it saw the real clock).
#[test]
fn strategies_see_a_stopped_clock_and_zero_random_so_two_calls_answer_alike() {
    let first = probe(r#"{"mode":"probe-time"}"#);
    assert_eq!(
        first,
        "probe-time: wall=0 monotonic_elapsed=0ns random_hash=".to_string() + first.rsplit('=').next().unwrap()
    );
    assert_eq!(probe(r#"{"mode":"probe-time"}"#), first, "a second instance sees the same time and randomness");

    let report = frostline::ops::plugin_check::check(
        shared_host(),
        &test_plugin("hostile_strategy"),
        Role::BucketStrategy,
        r#"{"mode":"clock-key"}"#.into(),
        7,
    )
    .unwrap();
    // (Its planted traps at t = -1, -2, -3 fail another check in every mode.)
    let stable = report.checks.iter().find(|c| c.name == "same answer when asked again").unwrap();
    assert!(stable.passed && stable.cases > 1_000, "{stable:?}");
    let loaded = load(&test_plugin("hostile_strategy"), Role::BucketStrategy, PluginLimits::default());
    let strategy = WasmStrategy::new(loaded, r#"{"mode":"clock-key"}"#.into()).unwrap();
    // Past the descriptor cache: the component itself is asked twice.
    let once = strategy.ask_one_uncached(3_600_000_000).unwrap().unwrap();
    assert_eq!(once.key, "hour:1:wall0");
    assert_eq!(strategy.ask_one_uncached(3_600_000_000).unwrap().unwrap(), once);
}

/// `--plugin-cache-dir` (`Settings::plugin_cache_dir`): the engines of two data directories
/// share one cache folder, with the engine's key beside it; the second compiles nothing, and
/// neither data directory holds a cache of its own.
#[test]
fn two_data_directories_share_one_plugin_cache_folder() {
    const POLICY: &str = "[[table]]\nid = \"events\"\nstrategy = { plugin = \"builtin:calendar-month-utc\" }\n\
                          retention = { plugin = \"builtin:eligible-before\" }\n";
    let cache = tempfile::tempdir().unwrap();
    let folder = cache.path().join("compiled");
    let settings = frostline::settings::Settings { plugin_cache_dir: Some(folder.clone()), ..Default::default() };
    let open = || {
        TestEngine::open_with_settings(POLICY, "2024-01-01T00:00:00Z", &[], Default::default(), settings.clone())
            .unwrap()
    };
    let first = open();
    let compiled = first.engine.host().cache_stats().compiled;
    assert!(compiled > 0, "the first engine compiles the built-ins it runs");
    assert!(cache.path().join("compiled.key").is_file(), "the engine's own key sits beside the folder");
    let second = open();
    let stats = second.engine.host().cache_stats();
    assert_eq!((stats.compiled, stats.disk_hits), (0, compiled), "the second engine loads what the first compiled");
    for engine in [&first, &second] {
        assert!(!engine.data_dir().join("plugin-cache").exists(), "a data directory holds no cache of its own");
    }
}

#[test]
fn compiled_cache_is_used_on_the_second_load_and_corrupt_entries_are_recompiled() {
    let cache = tempfile::tempdir().unwrap();
    let source = builtin::find("calendar-year-utc").unwrap().source();
    let first = PluginHost::new(Some(cache.path().to_path_buf())).unwrap();
    first.load(&source, Role::BucketStrategy, PluginLimits::default()).unwrap();
    assert_eq!(first.cache_stats().compiled, 1);
    assert_eq!(first.cache_stats().disk_hits, 0);

    let second = PluginHost::new(Some(cache.path().to_path_buf())).unwrap();
    let started = Instant::now();
    second.load(&source, Role::BucketStrategy, PluginLimits::default()).unwrap();
    let cached_load = started.elapsed();
    assert_eq!(second.cache_stats().compiled, 0, "second load must not compile");
    assert_eq!(second.cache_stats().disk_hits, 1);
    eprintln!("cached load took {cached_load:?}");

    for entry in std::fs::read_dir(cache.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "cwasm") {
            let mut bytes = std::fs::read(&path).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0xff;
            std::fs::write(&path, bytes).unwrap();
        }
    }
    let third = PluginHost::new(Some(cache.path().to_path_buf())).unwrap();
    let loaded = third.load(&source, Role::BucketStrategy, PluginLimits::default()).unwrap();
    assert_eq!(third.cache_stats().rejected, 1);
    assert_eq!(third.cache_stats().compiled, 1);
    let s = WasmStrategy::new(loaded, r#"{"unit":"year"}"#.into()).unwrap();
    assert_eq!(s.bucket_for(0).unwrap().key, "year:1970");
}

/// The artifact the cache in `dir` holds for `source`, and the name it would hold `other`'s under.
fn artifact_of(dir: &std::path::Path, source: &PluginSource, other: &PluginSource) -> (std::path::PathBuf, String) {
    use sha2::Digest as _;
    let hash = hex::encode(sha2::Sha256::digest(&source.bytes));
    let path = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "cwasm") && p.to_string_lossy().contains(&hash))
        .unwrap_or_else(|| panic!("no artifact of {} in {}", source.name, dir.display()));
    let name =
        path.file_name().unwrap().to_string_lossy().replace(&hash, &hex::encode(sha2::Sha256::digest(&other.bytes)));
    (path, name)
}

/// Regression (issue: precompiled artifacts are trusted by file name): whoever could write into
/// the plugin cache could put there the artifact of a component of theirs (valid wasmtime bytes)
/// named for another one, with the SHA-256 beside it the cache used to write, and the engine ran
/// their code in its place, with its grants. Such an artifact is refused and the component
/// recompiled from its own bytes; so is one with a proof taken from another component's
/// artifact, or proven by a key the engine does not hold. The log says why each was refused.
#[test]
fn a_planted_artifact_is_refused_and_recompiled_never_run() {
    use sha2::Digest as _;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("plugin-cache");
    let theirs = test_plugin("hostile_strategy");
    let victim = builtin::find("calendar-year-utc").unwrap().source();
    let compiling = PluginHost::new(Some(cache.clone())).unwrap();
    compiling.load(&theirs, Role::BucketStrategy, PluginLimits::default()).unwrap();
    let (artifact, planted_name) = artifact_of(&cache, &theirs, &victim);
    let planted = cache.join(&planted_name);
    let bytes = std::fs::read(&artifact).unwrap();
    std::fs::write(&planted, &bytes).unwrap();
    std::fs::write(planted.with_extension("cwasm.sha256"), hex::encode(sha2::Sha256::digest(&bytes))).unwrap();

    let host = PluginHost::new(Some(cache.clone())).unwrap();
    let loaded = host.load(&victim, Role::BucketStrategy, PluginLimits::default()).unwrap();
    assert_eq!(host.cache_stats().disk_hits, 0, "the planted artifact was run as {}", victim.name);
    assert_eq!((host.cache_stats().rejected, host.cache_stats().compiled), (1, 1));
    let strategy = WasmStrategy::new(loaded, r#"{"unit":"year"}"#.into()).unwrap();
    assert_eq!(strategy.bucket_for(0).unwrap().key, "year:1970");
    // What the engine compiled it proved with its own key, made beside the cache for its owner
    // only, and it loads that artifact; the old digest is gone.
    let key = dir.path().join("plugin-cache.key");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    assert!(!planted.with_extension("cwasm.sha256").exists());
    let proven = PluginHost::new(Some(cache.clone())).unwrap();
    proven.load(&victim, Role::BucketStrategy, PluginLimits::default()).unwrap();
    assert_eq!((proven.cache_stats().disk_hits, proven.cache_stats().compiled), (1, 0));

    let stranger = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(stranger.path(), "a key the engine was never given, 32 bytes or more").unwrap();
    let stranger = frostline::plugin::provenance::ArtifactKey::from_file(stranger.path(), "test").unwrap();
    let proof = |path: &std::path::Path| path.with_extension("cwasm.hmac");
    for (how, proof_text, says) in [
        (
            "the proof of their artifact, renamed with it",
            std::fs::read_to_string(proof(&artifact)).unwrap(),
            "its MAC does not verify under key".to_string(),
        ),
        (
            "a proof under a key the engine does not hold",
            stranger.prove(&planted_name, &bytes),
            format!("it was signed with key {}, which is not a key this engine holds", stranger.id()),
        ),
        ("an older frostline's digest", String::new(), "it has only a SHA-256 beside it".to_string()),
    ] {
        std::fs::write(&planted, &bytes).unwrap();
        if proof_text.is_empty() {
            std::fs::remove_file(proof(&planted)).unwrap();
            std::fs::write(planted.with_extension("cwasm.sha256"), hex::encode(sha2::Sha256::digest(&bytes))).unwrap();
        } else {
            std::fs::write(proof(&planted), &proof_text).unwrap();
        }
        let checked = run_frostline(&[
            "plugin",
            "check",
            "builtin:calendar-year-utc",
            "--role",
            "bucket-strategy",
            "--seed",
            "1",
            "--cache-dir",
            cache.to_str().unwrap(),
        ]);
        let stderr = text(&checked.stderr);
        assert_eq!(checked.status.code(), Some(0), "{how}: {}{stderr}", text(&checked.stdout));
        assert!(stderr.contains("compiled plugin cache entry refused, not run; recompiling"), "{how}: {stderr}");
        assert!(stderr.contains(&says) && stderr.contains(&planted_name), "{how}: {stderr}");
        assert_ne!(std::fs::read(&planted).unwrap(), bytes, "{how}: the planted artifact was kept");
    }

    // An operator's key that cannot be read stops the host, naming the setting.
    let missing = dir.path().join("no-such.key");
    let Err(refused) = PluginHost::with_cache(Some(cache.clone()), Some(&missing)) else { panic!("no key, no host") };
    assert!(refused.to_string().contains("FROSTLINE_PLUGIN_CACHE_KEY_FILE"), "{refused}");
}

#[test]
fn descriptor_cache_calls_the_plugin_only_for_unknown_buckets() {
    let b = builtin::find("calendar-year-utc").unwrap();
    let s = WasmStrategy::new(
        load(&b.source(), Role::BucketStrategy, PluginLimits::default()),
        b.effective_config("").unwrap(),
    )
    .unwrap();
    let calls_before = s.counters().calls.load(std::sync::atomic::Ordering::Relaxed);
    let times: Vec<i64> = (0..10_000).map(|i| i * 1_000_000_000).collect(); // ~116 days
    s.buckets_for(&times).unwrap();
    s.buckets_for(&times).unwrap();
    let calls = s.counters().calls.load(std::sync::atomic::Ordering::Relaxed) - calls_before;
    assert_eq!(calls, 1, "one batch call for the unknown years, none for known ones");
}

/// `plugin check --times FILE` prints the bucket a strategy answers for each time, checked as
/// the engine checks it, and fails on an answer the engine would refuse.
#[test]
fn plugin_check_prints_the_buckets_for_chosen_times() {
    let times = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(times.path(), "# leap day, as text and as microseconds\n2024-02-29T12:00:00Z\n\n1709208000000000\n")
        .unwrap();
    let file = times.path().to_str().unwrap();
    let ok =
        run_frostline(&["plugin", "check", "builtin:calendar-month-utc", "--role", "bucket-strategy", "--times", file]);
    assert_eq!(ok.status.code(), Some(0), "{}{}", text(&ok.stdout), text(&ok.stderr));
    let line = "2024-02-29T12:00:00Z  month:2024-02  [2024-02-01T00:00:00Z, 2024-03-01T00:00:00Z)";
    assert_eq!(text(&ok.stdout).matches(line).count(), 2, "{}", text(&ok.stdout));

    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), r#"{"mode":"bad-key"}"#).unwrap();
    let hostile = format!("{}/hostile_strategy.wasm", builtin::GUEST_DIR);
    let refused = run_frostline(&[
        "plugin",
        "check",
        &hostile,
        "--role",
        "bucket-strategy",
        "--config",
        config.path().to_str().unwrap(),
        "--times",
        file,
    ]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(text(&refused.stdout).contains("2024-02-29T12:00:00Z  REFUSED: bucket key"), "{}", text(&refused.stdout));

    std::fs::write(times.path(), "2024-02-29T12:00:00Z\nyesterday\n").unwrap();
    let bad_line =
        run_frostline(&["plugin", "check", "builtin:calendar-month-utc", "--role", "bucket-strategy", "--times", file]);
    assert_ne!(bad_line.status.code(), Some(0));
    assert!(text(&bad_line.stderr).contains("line 2: `yesterday`"), "{}", text(&bad_line.stderr));
    let wrong_role =
        run_frostline(&["plugin", "check", "builtin:eligible-before", "--role", "retention-policy", "--times", file]);
    assert_ne!(wrong_role.status.code(), Some(0));
    assert!(text(&wrong_role.stderr).contains("--times is for bucket strategies"), "{}", text(&wrong_role.stderr));
}

#[test]
fn plugin_check_command_exits_zero_on_pass_and_one_on_fail() {
    let ok =
        run_frostline(&["plugin", "check", "builtin:calendar-month-utc", "--role", "bucket-strategy", "--seed", "3"]);
    assert_eq!(ok.status.code(), Some(0), "{}{}", text(&ok.stdout), text(&ok.stderr));
    assert!(text(&ok.stdout).contains("PASSED"));
    let path = format!("{}/wrong_version.wasm", builtin::GUEST_DIR);
    let bad = run_frostline(&["plugin", "check", &path, "--role", "bucket-strategy"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stderr).contains("contract version 9.0.0"), "{}", text(&bad.stderr));
    let unstable = format!("{}/hostile_strategy.wasm", builtin::GUEST_DIR);
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), r#"{"mode":"unstable"}"#).unwrap();
    let failing = run_frostline(&[
        "plugin",
        "check",
        &unstable,
        "--role",
        "bucket-strategy",
        "--config",
        config.path().to_str().unwrap(),
    ]);
    assert_eq!(failing.status.code(), Some(1));
    assert!(text(&failing.stdout).contains("FAIL"), "{}", text(&failing.stdout));
}

/// `frostline plugin new` for every role in every language writes a project whose own
/// `build.sh` builds a component that passes `frostline plugin check` (the script runs it).
/// The Python and JavaScript builds reuse the componentizers `plugins/examples/build.sh`
/// installed (./scripts/test runs it first); the Rust builds fetch wit-bindgen from crates.io.
#[test]
fn plugin_new_writes_projects_that_build_and_pass_plugin_check_in_every_language() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let componentize_py = repo.join("plugins/examples/.tools/venv/bin/componentize-py");
    let componentize_js = repo.join("plugins/examples/fiscal-quarter-js/node_modules/.bin/componentize-js");
    for tool in [&componentize_py, &componentize_js] {
        assert!(
            tool.exists(),
            "{} is missing: run the tests with ./scripts/test, or run plugins/examples/build.sh DIR first",
            tool.display()
        );
    }
    let dir = tempfile::tempdir().unwrap();
    // One target directory for the three Rust projects, kept between runs.
    let rust_target = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("scaffold-target");
    let plugin_new = |name: &str, role: &str, lang: &str| {
        let dir = dir.path().to_str().unwrap();
        run_frostline(&["plugin", "new", name, "--role", role, "--lang", lang, "--dir", dir])
    };
    for lang in ["rust", "python", "js"] {
        for role in ["bucket-strategy", "retention-policy", "archiver"] {
            let name = format!("my-{lang}-{role}");
            let made = plugin_new(&name, role, lang);
            assert_eq!(made.status.code(), Some(0), "{}{}", text(&made.stdout), text(&made.stderr));
            let project = dir.path().join(&name);
            let started = std::time::Instant::now();
            let built = std::process::Command::new(project.join("build.sh"))
                .env("FROSTLINE", frostline_bin())
                .env("COMPONENTIZE_PY", &componentize_py)
                .env("COMPONENTIZE_JS", &componentize_js)
                .env("CARGO_TARGET_DIR", &rust_target)
                .output()
                .unwrap();
            let output = format!("{}{}", text(&built.stdout), text(&built.stderr));
            assert_eq!(built.status.code(), Some(0), "{lang} {role}: {output}");
            assert!(output.contains("PASSED"), "{lang} {role}: {output}");
            eprintln!("{lang} {role}: built and checked in {:.1} s", started.elapsed().as_secs_f64());
        }
    }
    // A second project of the same name is refused and the first is untouched.
    let again = plugin_new("my-rust-archiver", "archiver", "rust");
    assert_ne!(again.status.code(), Some(0));
    assert!(text(&again.stderr).contains("already exists"), "{}", text(&again.stderr));
}

/// The C example (`plugins/examples/hour-c`, built by `plugins/examples/build.sh`): it passes
/// every check, answers UTC hours across the epoch and leap days, refuses times outside its
/// range and a config it does not know, and imports nothing but the contract's log.
#[test]
fn the_c_strategy_passes_conformance_and_answers_utc_hours() {
    let source = example_plugin("hour-c.wasm");
    check_passes(&source, Role::BucketStrategy, "");
    check_passes(&source, Role::BucketStrategy, " { } ");
    let loaded = load(&source, Role::BucketStrategy, PluginLimits::default());
    let s = WasmStrategy::new(loaded.clone(), String::new()).unwrap();
    let t = |s: &str| frostline::model::time::parse_rfc3339(s).unwrap();
    let hour = 3_600_000_000;
    let bucket = s.bucket_for(t("2024-02-29T13:30:00Z")).unwrap();
    assert_eq!(
        (bucket.key.as_str(), bucket.start, bucket.end),
        ("hour:2024-02-29T13", t("2024-02-29T13:00:00Z"), t("2024-02-29T14:00:00Z"))
    );
    assert_eq!(s.bucket_for(-1).unwrap().key, "hour:1969-12-31T23");
    assert_eq!(s.bucket_for(0).unwrap().key, "hour:1970-01-01T00");
    assert_eq!(s.bucket_for(t("9999-12-31T23:59:59.999999Z")).unwrap().key, "hour:9999-12-31T23");
    assert_eq!(s.bucket_for(t("0001-01-01T00:00:00Z")).unwrap().key, "hour:0001-01-01T00");
    let err = s.bucket_for(t("0001-01-01T00:00:00Z") - 1).unwrap_err().to_string();
    assert!(err.contains("years 0001 to 9999") && err.contains("-62135596800000001"), "{err}");
    // A batch with one refused time is refused whole, naming it, and the plugin frees the
    // keys it made before it: 100 such batches of 1,000 new hours each would leak about 3 MiB,
    // three times the 1 MiB limit this instance runs under.
    let tight = WasmStrategy::new(
        load(&source, Role::BucketStrategy, PluginLimits { memory_bytes: 1024 * 1024, ..Default::default() }),
        String::new(),
    )
    .unwrap();
    for batch in 0..100_i64 {
        let mut times: Vec<i64> = (0..1_000).map(|i| (batch * 1_000 + i) * hour).collect();
        times.push(253_402_300_800_000_000);
        let err = tight.buckets_for(&times).unwrap_err().to_string();
        assert!(err.contains("253402300800000000"), "batch {batch}: {err}");
    }
    let times: Vec<i64> = (0..1_000).map(|i| i * hour).collect();
    let keys: Vec<String> = s.buckets_for(&times).unwrap().into_iter().map(|b| b.key).collect();
    assert_eq!((keys[0].as_str(), keys[999].as_str()), ("hour:1970-01-01T00", "hour:1970-02-11T15"));

    let Err(refused) = WasmStrategy::new(loaded, r#"{"hours": 2}"#.into()) else { panic!("a config was accepted") };
    assert!(refused.to_string().contains("the config must be empty or {}"), "{refused}");
    let bytes = std::fs::read(&source.name).unwrap();
    assert!(bytes.len() < 64 * 1024, "{} bytes", bytes.len());
}

/// `plugin compile --target` writes, for another host, the artifacts an edge build loads: the
/// components a policy directory names (built-ins skipped) and named files, under the compiled
/// cache's names, each proven by --key-file (made, for its owner only, when missing), and with
/// `--builtins` the built-ins by component name (no proof: the binary that embeds them proves
/// them) with the hash of the component each was made from (what the edge build's build
/// script checks).
#[test]
fn plugin_compile_writes_artifacts_for_another_host() {
    use frostline::plugin::precompile::Target;
    use frostline::plugin::provenance::{self, ArtifactKey};
    use sha2::Digest as _;
    let policies = tempfile::tempdir().unwrap();
    let hostile = std::fs::read(format!("{}/hostile_strategy.wasm", builtin::GUEST_DIR)).unwrap();
    std::fs::create_dir(policies.path().join("plugins")).unwrap();
    std::fs::write(policies.path().join("plugins/hostile.wasm"), &hostile).unwrap();
    std::fs::write(
        policies.path().join("tables.toml"),
        "[[table]]\nid = \"a\"\nstrategy = { plugin = \"plugins/hostile.wasm\" }\n\
         [[table]]\nid = \"b\"\nstrategy = { plugin = \"builtin:calendar-day-utc\" }\n",
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("edge.key");
    let memory = format!("{}/memory_archiver.wasm", builtin::GUEST_DIR);
    let args = ["plugin", "compile", "--target", "aarch64", "--out", out_dir, "--builtins", "--policy-dir"];
    let key_args = ["--key-file", key_file.to_str().unwrap()];
    let ran = run_frostline(&[&args[..], &[policies.path().to_str().unwrap(), memory.as_str()], &key_args].concat());
    assert_eq!(ran.status.code(), Some(0), "{}{}", text(&ran.stdout), text(&ran.stderr));
    assert!(text(&ran.stderr).contains("made a new key in"), "{}", text(&ran.stderr));
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key_file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let key = ArtifactKey::from_file(&key_file, "test").unwrap();

    let target = Target::parse("aarch64").unwrap();
    let mut written: Vec<String> =
        std::fs::read_dir(out.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    written.sort();
    let artifact = |bytes: &[u8]| target.artifact_name(&hex::encode(sha2::Sha256::digest(bytes)));
    let components = [artifact(&hostile), artifact(&std::fs::read(&memory).unwrap())];
    let mut expected: Vec<String> = components.iter().flat_map(|name| [name.clone(), format!("{name}.hmac")]).collect();
    expected.extend(
        ["calendar_utc.cwasm", "eligible_before.cwasm", "calendar_utc.wasm.sha256", "eligible_before.wasm.sha256"]
            .map(String::from),
    );
    expected.sort();
    assert_eq!(written, expected);
    for name in &components {
        let bytes = std::fs::read(out.path().join(name)).unwrap();
        let proof = std::fs::read_to_string(out.path().join(format!("{name}.hmac"))).unwrap();
        assert_eq!(provenance::verify(std::slice::from_ref(&key), name, &bytes, &proof).unwrap().id(), key.id());
    }
    let (_, calendar) = builtin::COMPONENTS[0];
    let made_from = std::fs::read_to_string(out.path().join("calendar_utc.wasm.sha256")).unwrap();
    assert_eq!(made_from, hex::encode(sha2::Sha256::digest(calendar)));
    // The same key file signs again (it is not made anew); without one, components are refused.
    let again = run_frostline(
        &[&["plugin", "compile", "--target", "aarch64", "--out", out_dir][..], &key_args[..], &[memory.as_str()]]
            .concat(),
    );
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert!(!text(&again.stderr).contains("made a new key"), "{}", text(&again.stderr));
    assert_eq!(ArtifactKey::from_file(&key_file, "test").unwrap().id(), key.id());

    // Bad input names what is wrong and writes nothing.
    let empty = tempfile::tempdir().unwrap();
    let empty_dir = empty.path().to_str().unwrap();
    for (args, says) in [
        (
            vec!["--target", "riscv64", "--out", empty_dir, "--builtins"],
            "frostline's edge builds are for aarch64 and x86_64",
        ),
        (vec!["--target", "aarch64", "--out", empty_dir], "nothing to compile"),
        (
            vec!["--target", "aarch64", "--out", empty_dir, "/nonexistent.wasm"],
            "reading the component /nonexistent.wasm",
        ),
        (vec!["--target", "aarch64", "--out", empty_dir, "Cargo.toml"], "not WebAssembly"),
        (vec!["--target", "aarch64", "--out", empty_dir, "--no-key", memory.as_str()], "--key-file FILE is needed"),
    ] {
        // Every case but the last names the key file.
        let with_key = match args.iter().position(|a| *a == "--no-key") {
            Some(at) => [&args[..at], &args[at + 1..]].concat(),
            None => [&key_args[..], &args[..]].concat(),
        };
        let refused = run_frostline(&[&["plugin", "compile"][..], &with_key].concat());
        assert_ne!(refused.status.code(), Some(0), "{args:?}");
        assert!(text(&refused.stderr).contains(says), "{args:?}: {}", text(&refused.stderr));
    }
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0, "a refused compile wrote something");
}

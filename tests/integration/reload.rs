//! Policy reload: all or nothing. Each refusal keeps the previous set active and says which
//! file and what; an accepted set gets a new generation; a removed table is retired.

use std::path::PathBuf;

use frostline::model::Record;
use frostline::ops::reload::reload;

use crate::support::*;

const BASE: &str = r#"
[[table]]
id = "r"
strategy = { plugin = "builtin:calendar-day-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1d" } }
"#;

fn policy_dir(e: &TestEngine) -> PathBuf {
    e.engine.policies().dir.clone()
}

fn write(e: &TestEngine, file: &str, text: &str) {
    std::fs::write(policy_dir(e).join(file), text).unwrap();
}

fn one_record(day: &str) -> Vec<Record> {
    vec![Record {
        partition_key: b"p".to_vec(),
        event_time: t(day),
        sort_key: day.as_bytes().to_vec(),
        tenant: None,
        kind: None,
        body: "{}".into(),
    }]
}

fn assert_refused(e: &TestEngine, expected: &[&str]) {
    let outcome = reload(&e.engine, "test");
    assert!(!outcome.accepted, "{outcome:?}");
    let error = outcome.error.unwrap();
    for part in expected {
        assert!(error.contains(part), "`{part}` not in: {error}");
    }
    assert_eq!(e.engine.policies().generation, 1, "the previous set stays active");
    e.engine.append("r", one_record("2024-03-09T01:00:00Z")).unwrap();
    assert!(!e.engine.last_reload().unwrap().accepted);
}

#[test]
fn an_accepted_reload_swaps_the_whole_set_and_bumps_the_generation() {
    let e = TestEngine::new(BASE, "2024-03-10T00:00:00Z");
    write(&e, "more.toml", "[[table]]\nid = \"s\"\n");
    let outcome = reload(&e.engine, "test");
    assert!(outcome.accepted, "{outcome:?}");
    let set = e.engine.policies();
    assert_eq!(set.generation, 2);
    assert!(set.tables.contains_key("s") && set.tables.contains_key("r"));
    assert_eq!(set.files.len(), 2);
    assert!(set.plugins.iter().all(|p| p.sha256.len() == 64));
    e.engine.append("s", one_record("2024-03-09T01:00:00Z")).unwrap();
}

#[test]
fn a_changed_strategy_for_a_table_with_buckets_is_refused() {
    let e = TestEngine::new(BASE, "2024-03-10T00:00:00Z");
    e.engine.append("r", one_record("2024-03-09T00:00:00Z")).unwrap();
    write(&e, "tables.toml", &BASE.replace("calendar-day-utc", "calendar-month-utc"));
    assert_refused(&e, &["tables.toml", "table `r`", "new table id"]);
}

#[test]
fn a_mismatched_pin_is_refused() {
    let e = TestEngine::new(BASE, "2024-03-10T00:00:00Z");
    write(
        &e,
        "tables.toml",
        &BASE.replace(
            r#"plugin = "builtin:calendar-day-utc""#,
            &format!(r#"plugin = "builtin:calendar-day-utc", sha256 = "{}""#, "ab".repeat(32)),
        ),
    );
    assert_refused(&e, &["tables.toml", "not the pinned"]);
}

#[test]
fn a_plugin_that_refuses_its_config_is_refused() {
    let e = TestEngine::new(BASE, "2024-03-10T00:00:00Z");
    write(&e, "tables.toml", &BASE.replace(r#"archive_after = "1d""#, r#"archive_after = "0s""#));
    assert_refused(&e, &["tables.toml", "archive_after"]);
}

#[test]
fn a_plugin_that_fails_its_checks_is_refused() {
    let e = TestEngine::new(BASE, "2024-03-10T00:00:00Z");
    std::fs::copy(
        format!("{}/hostile_strategy.wasm", frostline::plugin::builtin::GUEST_DIR),
        policy_dir(&e).join("hostile.wasm"),
    )
    .unwrap();
    write(
        &e,
        "more.toml",
        "[[table]]\nid = \"h\"\nstrategy = { plugin = \"hostile.wasm\", config = { mode = \"bad-order\" } }\n",
    );
    assert_refused(&e, &["more.toml", "table `h` strategy"]);
}

#[test]
fn a_half_written_file_is_refused_and_the_completed_file_accepted() {
    let e = TestEngine::new(BASE, "2024-03-10T00:00:00Z");
    let full = "[[table]]\nid = \"s\"\nstrategy = { plugin = \"builtin:calendar-day-utc\" }\n";
    write(&e, "more.toml", &full[..30]);
    assert_refused(&e, &["more.toml"]);
    write(&e, "more.toml", full);
    assert!(reload(&e.engine, "test").accepted);
    assert_eq!(e.engine.policies().generation, 2);
}

/// A file still being written in a subfolder while a reload runs (a plugin being copied in)
/// refuses the reload, naming the file; once it settles the reload is accepted. (Only the
/// top folder's `*.toml` files were checked, so this reload went ahead.)
#[test]
fn a_file_still_being_written_in_a_subfolder_refuses_the_reload() {
    use std::io::Write as _;
    use std::sync::atomic::{AtomicBool, Ordering};
    let e = TestEngine::new(BASE, "2024-03-10T00:00:00Z");
    let plugins = policy_dir(&e).join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, path) = (stop.clone(), plugins.join("next.wasm"));
        std::thread::spawn(move || {
            let mut file = std::fs::File::create(path).unwrap();
            while !stop.load(Ordering::SeqCst) {
                file.write_all(&[0u8; 1024]).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    let outcome = reload(&e.engine, "test");
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    assert!(!outcome.accepted, "{outcome:?}");
    let error = outcome.error.unwrap_or_default();
    assert!(error.contains("still being written") && error.contains("plugins/next.wasm"), "{error}");
    assert_eq!(e.engine.policies().generation, 1);
    assert!(reload(&e.engine, "test").accepted, "accepted once the file settled");
}

/// The running watcher never loads a policy file that is still open for writing, however long
/// its writer pauses, and loads it once it is closed; a file renamed into the directory is
/// loaded without waiting. (The earlier watcher reloaded 300 ms after the last change and
/// paused 200 ms: this file's first half, a valid table alone, became the active set.)
#[test]
fn the_watcher_waits_for_a_file_open_for_writing_to_be_closed() {
    use std::io::Write as _;
    use std::time::{Duration, Instant};
    let e = TestEngine::new(BASE, "2024-03-10T00:00:00Z");
    let dir = policy_dir(&e);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let watcher = frostline::ops::reload::start_watcher(&dir).unwrap();
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let task = runtime.spawn(frostline::ops::reload::watch(e.engine.clone(), watcher, stopping));
    let wait_for_generation = |generation: u64| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while e.engine.policies().generation < generation {
            assert!(Instant::now() < deadline, "generation {generation} never became active");
            std::thread::sleep(Duration::from_millis(5));
        }
    };

    let mut file = std::fs::File::create(dir.join("more.toml")).unwrap();
    file.write_all(b"[[table]]\nid = \"s\"\n").unwrap();
    std::thread::sleep(Duration::from_millis(1_000));
    assert_eq!(e.engine.policies().generation, 1, "a file still open for writing was loaded");
    file.write_all(b"[[table]]\nid = \"t\"\n").unwrap();
    drop(file);
    wait_for_generation(2);
    let set = e.engine.policies();
    assert!(set.tables.contains_key("s") && set.tables.contains_key("t"), "{:?}", set.tables.keys());

    let staged = e.engine.data_dir().join("staged.toml");
    std::fs::write(&staged, "[[table]]\nid = \"u\"\n").unwrap();
    std::fs::rename(&staged, dir.join("staged.toml")).unwrap();
    wait_for_generation(3);
    assert!(e.engine.policies().tables.contains_key("u"));
    assert!(e.engine.last_reload().unwrap().accepted);

    stop.send(true).unwrap();
    runtime.block_on(task).unwrap().unwrap();
}

#[test]
fn unknown_fields_and_duplicate_tables_are_refused_with_file_and_field() {
    let e = TestEngine::new(BASE, "2024-03-10T00:00:00Z");
    write(&e, "more.toml", "[[table]]\nid = \"s\"\nretension = {}\n");
    assert_refused(&e, &["more.toml", "retension", "line 3"]);
    write(&e, "more.toml", "[[table]]\nid = \"r\"\n");
    assert_refused(&e, &["more.toml", "table `r` is also declared in", "tables.toml"]);
}

#[test]
fn a_removed_table_is_retired_keeps_its_data_and_is_still_archived() {
    let e = TestEngine::new(BASE, "2024-03-01T12:00:00Z");
    let input = records("2024-03-01T00:00:00Z", 1, 6);
    e.engine.append("r", input.clone()).unwrap();
    e.pass(); // plans; not due yet
    write(&e, "tables.toml", "[[table]]\nid = \"s\"\n");
    assert!(reload(&e.engine, "test").accepted);
    assert!(e.engine.policies().retired.contains("r"));
    let err = e.engine.append("r", one_record("2024-03-01T05:00:00Z")).unwrap_err().to_string();
    assert!(err.contains("removed from the policy directory"), "{err}");
    e.clock.set(t("2024-03-10T00:00:00Z"));
    assert_eq!(e.pass().archived, 3, "its buckets are archived under its last definition");
    assert_eq!(e.query_all("r"), sorted(input));
}

/// Reloads that arrive together (the policy watcher's and one from the API, found under
/// emulation) run one after the other: each is accepted with its own generation, and an
/// archiver target's load checks, which write to its store, do not meet.
#[test]
fn reloads_that_arrive_together_run_one_after_the_other() {
    let area = tempfile::tempdir().unwrap();
    let plugin = std::path::Path::new(frostline::plugin::builtin::GUEST_DIR).join("dir_archiver.wasm");
    let hash = frostline::format::manifest::sha256_hex(&std::fs::read(&plugin).unwrap());
    let policy = format!(
        "{BASE}target = \"arch\"\n\n[[target]]\nname = \"arch\"\nplugin = \"{}\"\nconfig = {{ root = \"/archive\" }}\n\n\
         [[grant]]\nsha256 = \"{hash}\"\npreopen = [{{ host = \"{}\", guest = \"/archive\", mode = \"rw\" }}]\n",
        plugin.display(),
        area.path().display()
    );
    let e = TestEngine::new(&policy, "2024-03-10T00:00:00Z");
    let before = e.engine.policies().generation;
    let barrier = std::sync::Barrier::new(2);
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let reloads: Vec<_> = ["watcher", "api"]
            .into_iter()
            .map(|trigger| {
                let (engine, barrier) = (&e.engine, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    reload(engine, trigger)
                })
            })
            .collect();
        reloads.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for outcome in &outcomes {
        assert!(outcome.accepted, "{outcome:?}");
    }
    let mut generations: Vec<u64> = outcomes.iter().map(|o| o.generation).collect();
    generations.sort();
    assert_eq!(generations, [before + 1, before + 2], "each reload has a generation of its own");
    assert_eq!(e.engine.policies().generation, before + 2);
}

/// A hold on one bucket of `r`, declared in the tables file.
const HELD: &str = r#"
[[hold]]
table = "r"
bucket = "day:2024-03-09"
reason = "litigation 7"
"#;

/// A second policy file: another table, and a hold on it.
const MORE_HELD: &str = r#"
[[table]]
id = "s"

[[hold]]
table = "s"
reason = "audit 2024"
"#;

/// The ids of the policy holds in the store (what `frostline hold list` shows).
fn policy_holds(e: &TestEngine) -> Vec<String> {
    let listing = frostline::ops::holds::list_holds(&e.engine).unwrap();
    let mut ids: Vec<String> =
        listing.into_iter().filter(|h| h.hold.source.starts_with("policy:")).map(|h| h.hold.id).collect();
    ids.sort();
    ids
}

/// An engine directory pair with an empty policy directory, opened with `Engine::open`.
fn open_on(root: &std::path::Path) -> Result<std::sync::Arc<frostline::engine::Engine>, String> {
    frostline::engine::Engine::open(
        &root.join("data"),
        &root.join("policies"),
        frostline::settings::Settings::default(),
        frostline::clock::ManualClock::new(t("2024-03-10T00:00:00Z")),
    )
    .map_err(|e| e.to_string())
}

/// A policy file that cannot be read (a dangling symbolic link: a deploy that relinked it
/// before its target arrived) refuses the reload, naming the file and the OS error; the
/// previous set stays, every policy hold stays in the store, and a start on the directory is
/// refused the same way. (The loader skipped such a file silently, and the reload released
/// the holds it declared.)
#[test]
fn an_unreadable_policy_file_refuses_the_reload_and_the_start_and_keeps_its_holds() {
    let e = TestEngine::open(
        &format!("{BASE}{HELD}"),
        "2024-03-10T00:00:00Z",
        &[("more.toml", MORE_HELD)],
        Default::default(),
    )
    .unwrap();
    let held = policy_holds(&e);
    assert_eq!(held.len(), 2, "{held:?}");
    let dir = policy_dir(&e);
    std::fs::remove_file(dir.join("more.toml")).unwrap();
    std::os::unix::fs::symlink(dir.join("releases/42/more.toml"), dir.join("more.toml")).unwrap();

    assert_refused(&e, &["more.toml", "No such file or directory"]);
    let set = e.engine.policies();
    assert!(set.tables.contains_key("s") && set.retired.is_empty(), "the previous set stays");
    assert_eq!(set.holds.len(), 2);
    assert_eq!(policy_holds(&e), held, "the holds stay in the store");

    let refusal = match e.restart() {
        Ok(_) => panic!("the engine started on a directory with an unreadable policy file"),
        Err(e) => e.to_string(),
    };
    assert!(refusal.contains("more.toml") && refusal.contains("No such file or directory"), "{refusal}");
}

/// A policy directory with no policy file (every file removed, or an unmounted mount point)
/// is refused at reload and at start, saying how to mean it; with the marker file it loads
/// (the tables retire, the holds are released, and the reload says so). The marker beside a
/// policy file is a contradiction, refused too. (An empty directory loaded silently and
/// released every policy hold.)
#[test]
fn an_empty_policy_directory_is_refused_unless_it_is_marked_empty() {
    let marker = frostline::policy::EMPTY_MARKER;
    let e = TestEngine::new(&format!("{BASE}{HELD}"), "2024-03-10T00:00:00Z");
    let held = policy_holds(&e);
    assert_eq!(held.len(), 1);
    let dir = policy_dir(&e);
    std::fs::remove_file(dir.join("tables.toml")).unwrap();
    assert_refused(&e, &["no policy files", marker]);
    assert_eq!(policy_holds(&e), held, "the hold stays in the store");

    std::fs::write(dir.join(marker), "").unwrap();
    let outcome = reload(&e.engine, "test");
    assert!(outcome.accepted, "{outcome:?}");
    assert!(e.engine.policies().retired.contains("r"));
    assert_eq!(outcome.released_holds.iter().map(|h| h.id.clone()).collect::<Vec<_>>(), held);
    assert!(policy_holds(&e).is_empty());

    write(&e, "tables.toml", BASE);
    let outcome = reload(&e.engine, "test");
    assert!(!outcome.accepted, "{outcome:?}");
    let error = outcome.error.unwrap();
    assert!(error.contains(marker) && error.contains("tables.toml"), "{error}");
    assert_eq!(e.engine.policies().generation, 2, "the previous set stays active");
}

/// The same at start: an empty directory (a subfolder does not count) is refused with the
/// marker to create; with the marker the engine opens with no tables; the marker beside a
/// policy file is refused.
#[test]
fn a_start_on_an_empty_policy_directory_is_refused_unless_it_is_marked_empty() {
    let marker = frostline::policy::EMPTY_MARKER;
    let root = tempfile::tempdir().unwrap();
    let policies = root.path().join("policies");
    std::fs::create_dir_all(policies.join("sample")).unwrap();
    let refusal = open_on(root.path()).err().expect("the engine started on an empty policy directory");
    assert!(refusal.contains("no policy files") && refusal.contains(marker), "{refusal}");

    std::fs::write(policies.join(marker), "").unwrap();
    let engine = open_on(root.path()).unwrap();
    assert!(engine.policies().tables.is_empty());
    drop(engine);

    std::fs::write(policies.join("tables.toml"), BASE).unwrap();
    let refusal = open_on(root.path()).err().expect("the engine started beside the marker");
    assert!(refusal.contains(marker) && refusal.contains("tables.toml"), "{refusal}");
}

/// A writer for `tracing` that keeps what is written.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A reload that releases a policy hold (its `[[hold]]` removed) is accepted, and says so:
/// the outcome lists the released holds and a warning is logged naming them (and `policy
/// check` lists them beforehand). A reload that keeps every hold lists none. (The hold was
/// released in silence.)
#[test]
fn a_reload_that_releases_policy_holds_is_accepted_and_says_so() {
    let e = TestEngine::new(&format!("{BASE}{HELD}"), "2024-03-10T00:00:00Z");
    let held = policy_holds(&e);
    assert_eq!(held.len(), 1);
    write(&e, "tables.toml", BASE);
    // `frostline policy check --data` says it before the reload.
    let engine = &e.engine;
    let check = frostline::policy::check::check_dir(
        &policy_dir(&e),
        engine.data_dir(),
        engine.host(),
        engine.settings(),
        Some(engine.store()),
        t("2024-03-10T00:00:00Z"),
    );
    assert!(check.accepted, "{check:?}");
    assert_eq!(check.released_holds.iter().map(|h| h.id.clone()).collect::<Vec<_>>(), held);
    assert!(check.render().contains(&format!("RELEASES policy hold {}", held[0])), "{}", check.render());
    let log = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let log = log.clone();
            move || log.clone()
        })
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let outcome = tracing::subscriber::with_default(subscriber, || reload(&e.engine, "test"));
    assert!(outcome.accepted, "{outcome:?}");
    let released: Vec<String> = outcome.released_holds.iter().map(|h| h.id.clone()).collect();
    assert_eq!(released, held);
    assert_eq!(outcome.released_holds[0].reason, "litigation 7");
    assert!(policy_holds(&e).is_empty());
    let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(log.contains("WARN") && log.contains("releases") && log.contains(&held[0]), "{log}");

    write(&e, "tables.toml", &format!("{BASE}{HELD}"));
    let outcome = reload(&e.engine, "test");
    assert!(outcome.accepted && outcome.released_holds.is_empty(), "{outcome:?}");
    write(&e, "more.toml", "[[table]]\nid = \"s\"\n");
    let outcome = reload(&e.engine, "test");
    assert!(outcome.accepted && outcome.released_holds.is_empty(), "a reload that keeps the hold: {outcome:?}");
}

//! Retention that is re-decided, not frozen: every lifecycle path an operator takes on a
//! running engine (move the cutoff, lengthen or shorten retention, mix record kinds into a
//! bucket, remove a table, move a table to another target, place a hold while an expiry runs,
//! share a target between installations) keeps every record and leaves no bucket stuck.
//! Each test pins a failure of an earlier version, named in its doc.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use frostline::clock::{Clock, ManualClock};
use frostline::engine::Engine;
use frostline::model::{BucketState, Record};
use frostline::ops::reload::reload;
use frostline::settings::Settings;
use frostline::storage::faults::{Fault, FaultyBackend, Op};
use frostline::store::schema::Hold;

use crate::support::*;

const DAY_US: i64 = 86_400_000_000;

/// A data directory and a policy directory that outlive the engines opened on them, so a
/// test can restart with other settings or another policy directory.
pub(crate) struct Site {
    pub(crate) root: tempfile::TempDir,
    pub(crate) clock: Arc<ManualClock>,
}

impl Site {
    pub(crate) fn new(policy: &str, now: &str) -> Site {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("policies")).unwrap();
        std::fs::write(root.path().join("policies/tables.toml"), policy).unwrap();
        Site { root, clock: ManualClock::new(t(now)) }
    }

    pub(crate) fn data(&self) -> PathBuf {
        self.root.path().join("data")
    }

    pub(crate) fn policies(&self) -> PathBuf {
        self.root.path().join("policies")
    }

    pub(crate) fn write_policy(&self, text: &str) {
        std::fs::write(self.policies().join("tables.toml"), text).unwrap();
    }

    pub(crate) fn open(&self, settings: Settings) -> Arc<Engine> {
        Engine::open(&self.data(), &self.policies(), settings, self.clock.clone()).unwrap_or_else(|e| panic!("{e}"))
    }
}

fn states(engine: &Engine, table: &str) -> Vec<BucketState> {
    engine.store().buckets(table, None).unwrap().into_iter().map(|b| b.state).collect()
}

pub(crate) fn record(partition: &str, time: &str, kind: Option<&str>) -> Record {
    Record {
        partition_key: partition.as_bytes().to_vec(),
        event_time: t(time),
        sort_key: format!("{time}-{}", kind.unwrap_or("-")).into_bytes(),
        tenant: None,
        kind: kind.map(str::to_string),
        body: r#"{"x":1}"#.into(),
    }
}

const CUTOFF_POLICY: &str = r#"
[[table]]
id = "r"
strategy = { plugin = "builtin:calendar-year-utc" }
"#;

/// Regression: a bucket's plan was made once; moving `ARCHIVER_ELIGIBLE_BEFORE` forward never
/// archived buckets planned under the old cutoff.
#[test]
fn moving_the_cutoff_forward_archives_buckets_planned_under_the_old_one() {
    let site = Site::new(CUTOFF_POLICY, "2025-06-01T00:00:00Z");
    let old = Settings { eligible_before: Some(t("2023-01-01T00:00:00Z")), ..Settings::default() };
    let engine = site.open(old);
    engine
        .append("r", vec![record("p", "2022-05-01T00:00:00Z", None), record("p", "2023-05-01T00:00:00Z", None)])
        .unwrap();
    let report = run_pass(&engine);
    assert_eq!(report.archived, 1, "only 2022 is before the old cutoff: {report:?}");
    drop(engine);
    // The operator moves the cutoff to 2024 and restarts.
    let new = Settings { eligible_before: Some(t("2024-01-01T00:00:00Z")), ..Settings::default() };
    let engine = site.open(new);
    let report = run_pass(&engine);
    assert_eq!(report.archived, 1, "2023 is now before the cutoff: {report:?}");
    assert_eq!(states(&engine, "r"), vec![BucketState::Archived { hot_deleted: true }; 2]);
    assert_eq!(query_engine(&engine, "r").len(), 2);
}

pub(crate) fn expiring_policy(expire_after: &str) -> String {
    format!(
        r#"
[[table]]
id = "r"
strategy = {{ plugin = "builtin:calendar-day-utc" }}
retention = {{ plugin = "builtin:eligible-before", config = {{ archive_after = "1d", expire_after = "{expire_after}" }} }}
"#
    )
}

/// Regression: a reload that lengthened `expire_after` (a compliance change) never reached
/// existing archives: they expired on the old schedule.
#[test]
fn a_reload_that_lengthens_retention_reaches_existing_archives() {
    let site = Site::new(&expiring_policy("30d"), "2024-03-01T12:00:00Z");
    let engine = site.open(Settings::default());
    engine.append("r", vec![record("p", "2024-03-01T01:00:00Z", None)]).unwrap();
    site.clock.set(t("2024-03-05T00:00:00Z"));
    assert_eq!(run_pass(&engine).archived, 1);
    site.write_policy(&expiring_policy("365d"));
    assert!(reload(&engine, "test").accepted);
    // Past the old expiry, well before the new one.
    site.clock.set(t("2024-05-01T00:00:00Z"));
    let report = run_pass(&engine);
    assert_eq!(report.expired, 0, "{report:?}");
    assert_eq!(query_engine(&engine, "r").len(), 1);
    let meta = engine.store().buckets("r", None).unwrap().remove(0);
    assert_eq!(meta.plan.unwrap().expire_at, Some(t("2024-03-02T00:00:00Z") + 365 * DAY_US));
    // And shortening it again takes effect too (an expiry may move earlier once archived).
    site.write_policy(&expiring_policy("30d"));
    assert!(reload(&engine, "test").accepted);
    let report = run_pass(&engine); // re-plans, then expires what is due under the new plan
    assert_eq!(report.expired, 1, "{report:?}");
}

const KIND_POLICY: &str = r#"
[[table]]
id = "r"
strategy = { plugin = "builtin:calendar-day-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1d", expire_after = "3650d", kinds = { debug = { expire_after = "2d" } } } }
"#;

/// Regression: a bucket planned when it held only `kind = "debug"` records kept the debug
/// expiry after invoices joined it, and the invoices were deleted with it.
#[test]
fn a_bucket_planned_for_debug_records_is_replanned_when_invoices_join() {
    let site = Site::new(KIND_POLICY, "2024-03-01T12:00:00Z");
    let engine = site.open(Settings::default());
    engine.append("r", vec![record("p", "2024-03-01T01:00:00Z", Some("debug"))]).unwrap();
    run_pass(&engine); // planned with the debug expiry
    let planned = engine.store().buckets("r", None).unwrap().remove(0).plan.unwrap();
    assert_eq!(planned.expire_at, Some(t("2024-03-04T00:00:00Z")));
    engine.append("r", vec![record("p", "2024-03-01T02:00:00Z", Some("invoice"))]).unwrap();
    site.clock.set(t("2024-03-10T00:00:00Z"));
    run_pass(&engine); // archives (under the re-made plan)
    run_pass(&engine);
    let report = run_pass(&engine);
    assert_eq!(report.expired, 0, "the invoice must not expire with the debug records: {report:?}");
    let meta = engine.store().buckets("r", None).unwrap().remove(0);
    assert_eq!(meta.state, BucketState::Archived { hot_deleted: true });
    assert_eq!(meta.plan.unwrap().expire_at, Some(t("2024-03-02T00:00:00Z") + 3650 * DAY_US));
    assert_eq!(query_engine(&engine, "r").len(), 2);
}

const ONE_TABLE: &str = r#"
[[table]]
id = "kept"
strategy = { plugin = "builtin:calendar-day-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1d" } }
"#;

/// Regression: after a restart without a removed table, its due buckets were never claimed and
/// never rescheduled; discovery takes the oldest due entries first, so they stopped archival
/// for every other table. Here the table cannot be archived under its last declaration (its
/// target left with it), so it is unmanaged and its buckets wait.
#[test]
fn a_table_removed_with_its_target_never_blocks_the_others_and_resumes_when_it_returns() {
    let site = Site::new("", "2024-01-01T00:00:00Z");
    let elsewhere = site.root.path().join("elsewhere");
    let two_tables = format!(
        "[[target]]\nname = \"elsewhere\"\nurl = \"file://{}\"\n{}target = \"elsewhere\"\n{ONE_TABLE}",
        elsewhere.display(),
        GONE_TABLE.replace("{strategy}", "builtin:calendar-day-utc").replace("{config}", "")
    );
    site.write_policy(&two_tables);
    let settings = Settings { scan_limit: 4, ..Settings::default() };
    let engine = site.open(settings.clone());
    let old: Vec<Record> = (0..10).map(|d| record("p", &day(2023, d), None)).collect();
    engine.append("gone", old.clone()).unwrap();
    // Planned: all due, older than anything of `kept`; the scan limit archives 4 of them.
    assert_eq!(run_pass(&engine).archived, 4);
    drop(engine);
    site.write_policy(ONE_TABLE);
    let engine = site.open(settings.clone());
    engine.append("kept", vec![record("p", "2023-12-30T00:00:00Z", None)]).unwrap();
    for _ in 0..5 {
        run_pass(&engine);
    }
    assert_eq!(states(&engine, "kept"), vec![BucketState::Archived { hot_deleted: true }]);
    let gone = states(&engine, "gone");
    assert_eq!(gone.iter().filter(|s| **s == BucketState::Hot).count(), 6, "{gone:?}");
    let status = frostline::ops::status::collect(&engine).unwrap();
    assert_eq!(status.unmanaged_tables, vec!["gone".to_string()]);
    drop(engine);
    // The table comes back: its buckets are rescheduled and archived.
    site.write_policy(&two_tables);
    let engine = site.open(settings);
    for _ in 0..5 {
        run_pass(&engine);
    }
    assert_eq!(states(&engine, "gone"), vec![BucketState::Archived { hot_deleted: true }; 10]);
    assert_eq!(query_engine(&engine, "gone").len(), 10);
}

const GONE_TABLE: &str = r#"
[[table]]
id = "gone"
strategy = { plugin = "{strategy}"{config} }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1d" } }
"#;

/// Regression: a table removed from the policy directory was retired only in memory; after a
/// restart its buckets were never archived (the plugin file it was declared with may be gone
/// too). It is archived under its last declaration, refuses appends, and blocks no one.
#[test]
fn a_table_removed_before_a_restart_is_archived_under_its_last_declaration() {
    let site = Site::new("", "2024-01-01T00:00:00Z");
    // A file plugin (the bytes of a built-in, under a file name), removed with the table.
    let component = frostline::plugin::builtin::find("builtin:calendar-day-utc").unwrap().source();
    std::fs::write(site.policies().join("calendar.wasm"), &component.bytes[..]).unwrap();
    site.write_policy(&format!(
        "{}{ONE_TABLE}",
        GONE_TABLE.replace("{strategy}", "calendar.wasm").replace("{config}", r#", config = { unit = "day" }"#)
    ));
    let settings = Settings { scan_limit: 4, ..Settings::default() };
    let engine = site.open(settings.clone());
    let old: Vec<Record> = (0..10).map(|d| record("p", &day(2023, d), None)).collect();
    engine.append("gone", old.clone()).unwrap();
    let report = run_pass(&engine);
    assert_eq!(report.archived, 4, "{report:?}");
    drop(engine);

    site.write_policy(ONE_TABLE);
    std::fs::remove_file(site.policies().join("calendar.wasm")).unwrap();
    let engine = site.open(settings);
    let status = frostline::ops::status::collect(&engine).unwrap();
    assert_eq!(status.policy.retired_tables, vec!["gone".to_string()]);
    assert!(status.unmanaged_tables.is_empty(), "{:?}", status.unmanaged_tables);
    let refused = engine.append("gone", vec![record("p", &day(2023, 20), None)]).unwrap_err().to_string();
    assert!(refused.contains("removed from the policy directory"), "{refused}");
    engine.append("kept", vec![record("p", "2023-12-30T00:00:00Z", None)]).unwrap();
    for _ in 0..5 {
        run_pass(&engine);
    }
    assert_eq!(states(&engine, "gone"), vec![BucketState::Archived { hot_deleted: true }; 10]);
    assert_eq!(states(&engine, "kept"), vec![BucketState::Archived { hot_deleted: true }]);
    assert_eq!(query_engine(&engine, "gone").len(), 10);
    // A reload keeps it retired (rebuilt again from its declaration).
    site.write_policy(&format!("{ONE_TABLE}\n"));
    let outcome = reload(&engine, "test");
    assert!(outcome.accepted, "{outcome:?}");
    assert!(engine.policies().retired.contains("gone"));
}

fn day(year: i32, d: i64) -> String {
    frostline::model::time::format_rfc3339(t(&format!("{year}-01-01T00:00:00Z")) + d * DAY_US + 3_600_000_000)
}

pub(crate) fn moved_policy(dirs: &[&Path], table_target: &str) -> String {
    let mut text = format!(
        r#"
[[table]]
id = "r"
strategy = {{ plugin = "builtin:calendar-day-utc" }}
retention = {{ plugin = "builtin:eligible-before", config = {{ archive_after = "1d", expire_after = "10d" }} }}
target = "{table_target}"
"#
    );
    for (i, dir) in dirs.iter().enumerate() {
        text.push_str(&format!("\n[[target]]\nname = \"t{i}\"\nurl = \"file://{}\"\n", dir.display()));
    }
    text
}

pub(crate) fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().contains("table=") && !path.to_string_lossy().ends_with("_catalog.json") {
                out.push(path);
            }
        }
    }
    out
}

/// Regression: archives were read, verified and expired on the table's current target, so a
/// reload that moved the table made old archives unreadable, and expiry "proved absence" on
/// the wrong store while the data stayed.
#[test]
fn a_table_moved_to_another_target_keeps_its_old_archives_readable_and_expires_them_there() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let site = Site::new(&moved_policy(&[a.path(), b.path()], "t0"), "2024-03-01T12:00:00Z");
    let engine = site.open(Settings::default());
    engine.append("r", vec![record("p", "2024-03-01T01:00:00Z", None)]).unwrap();
    site.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(run_pass(&engine).archived, 1);
    assert_eq!(files_under(a.path()).len(), 2);
    site.write_policy(&moved_policy(&[a.path(), b.path()], "t1"));
    assert!(reload(&engine, "test").accepted);
    engine.append("r", vec![record("p", "2024-03-02T01:00:00Z", None)]).unwrap();
    site.clock.set(t("2024-03-04T00:00:00Z"));
    assert_eq!(run_pass(&engine).archived, 1);
    assert_eq!(files_under(b.path()).len(), 2, "new archives go to the new target");
    assert_eq!(query_engine(&engine, "r").len(), 2, "the old archive is still read from the old target");
    let verdicts =
        runtime().block_on(frostline::archive::verify::verify(&engine.context(), None, None, |_| {})).unwrap();
    assert!(verdicts.iter().all(|v| v.ok), "{verdicts:?}");
    // Dropping the old target while it holds an archive is refused, naming the bucket.
    site.write_policy(&moved_policy(&[b.path()], "t0"));
    let refused = reload(&engine, "test");
    assert!(!refused.accepted);
    assert!(refused.error.as_deref().unwrap().contains("r/p/day:2024-03-01"), "{refused:?}");
    site.write_policy(&moved_policy(&[a.path(), b.path()], "t1"));
    assert!(reload(&engine, "test").accepted);
    // Expiry deletes each archive where it lives.
    site.clock.set(t("2024-04-01T00:00:00Z"));
    let report = run_pass(&engine);
    assert_eq!(report.expired, 2, "{report:?}");
    assert!(files_under(a.path()).is_empty(), "{:?}", files_under(a.path()));
    assert!(files_under(b.path()).is_empty(), "{:?}", files_under(b.path()));
}

/// Regression: a legal hold placed after the tombstone was written lost: the deletion went on
/// (during a target outage the window was unbounded) while the hold API reported the bucket
/// as covered.
#[test]
fn a_hold_placed_during_an_expiry_outage_calls_the_expiry_off() {
    // The target goes down: the expiry writes its tombstone, then cannot reach the store.
    let (e, faulty) = expiring_with_faults(&[Op::List, Op::Delete]);
    let report = e.pass();
    assert_eq!(report.expired, 0, "{report:?}");
    let id = e.engine.store().buckets("r", None).unwrap().remove(0).id;
    assert_eq!(e.engine.store().bucket(&id).unwrap().unwrap().state, BucketState::Expired);
    // Legal places a hold while the store is down.
    let placement = e.engine.store().place_hold(hold("r"), e.clock.now()).unwrap();
    assert_eq!(placement.expiries_called_off, vec![id.display()]);
    assert!(placement.too_late.is_empty());
    let meta = e.engine.store().bucket(&id).unwrap().unwrap();
    assert_eq!(meta.state, BucketState::Archived { hot_deleted: true });
    assert!(e.engine.store().tombstone(&id).unwrap().is_none());
    // The store comes back: nothing is deleted, the record still reads.
    faulty.clear();
    e.clock.set(t("2024-04-10T00:00:00Z"));
    for _ in 0..3 {
        assert_eq!(e.pass().expired, 0);
    }
    assert_eq!(e.query_all("r").len(), 1);
}

/// Once deletions have started, a hold cannot bring the archive back; the answer says so.
#[test]
fn a_hold_placed_after_deletions_started_is_answered_honestly() {
    // Listing works (the expiry commits to delete), then every delete fails.
    let (e, _faulty) = expiring_with_faults(&[Op::Delete]);
    e.pass();
    let id = e.engine.store().buckets("r", None).unwrap().remove(0).id;
    assert!(e.engine.store().tombstone(&id).unwrap().unwrap().deletes_started_at.is_some());
    let placement = e.engine.store().place_hold(hold("r"), e.clock.now()).unwrap();
    assert_eq!(placement.too_late, vec![id.display()]);
    assert!(placement.expiries_called_off.is_empty());
}

/// One archived bucket whose expiry is due, on a target whose `failing` operations fail.
fn expiring_with_faults(failing: &[Op]) -> (TestEngine, Arc<FaultyBackend>) {
    let e = TestEngine::new(&expiring_policy("10d"), "2024-03-01T12:00:00Z");
    e.engine.append("r", vec![record("p", "2024-03-01T01:00:00Z", None)]).unwrap();
    e.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    let faulty = FaultyBackend::new(e.backend("r"));
    e.with_backend("r", faulty.clone());
    for op in failing {
        faulty.add(*op, "", Fault::Error, None);
    }
    e.clock.set(t("2024-04-01T00:00:00Z"));
    e.pass(); // re-plans after the archival, then starts the expiry
    (e, faulty)
}

fn hold(table: &str) -> Hold {
    Hold {
        id: "h-legal".into(),
        table: table.into(),
        partition_key: None,
        tenant: None,
        bucket_key: None,
        reason: "litigation".into(),
        placed_by: "legal@example.com".into(),
        placed_at: 0,
        source: "cli".into(),
    }
}

/// Regression: the orphan sweep took every unreferenced object under a table's prefix for its
/// own, so two installations archiving to one target deleted each other's archives.
#[test]
fn two_installations_on_one_target_never_sweep_each_others_archives() {
    let shared = tempfile::tempdir().unwrap();
    let policy = format!(
        r#"
[[table]]
id = "r"
strategy = {{ plugin = "builtin:calendar-day-utc" }}
retention = {{ plugin = "builtin:eligible-before", config = {{ archive_after = "1d" }} }}
target = "shared"

[[target]]
name = "shared"
url = "file://{}"
"#,
        shared.path().display()
    );
    let (first, second) = (Site::new(&policy, "2024-03-01T12:00:00Z"), Site::new(&policy, "2024-03-01T12:00:00Z"));
    let (a, b) = (first.open(Settings::default()), second.open(Settings::default()));
    assert_ne!(a.installation_id(), b.installation_id());
    a.append("r", vec![record("p", "2024-03-01T01:00:00Z", None)]).unwrap();
    b.append("r", vec![record("p", "2024-03-01T01:00:00Z", None)]).unwrap();
    for (site, engine) in [(&first, &a), (&second, &b)] {
        site.clock.set(t("2024-03-03T00:00:00Z"));
        assert_eq!(run_pass(engine).archived, 1);
    }
    // Identical records, but each installation wrote objects of its own.
    assert_eq!(files_under(shared.path()).len(), 4);
    for (site, engine) in [(&first, &a), (&second, &b)] {
        site.clock.set(t("2024-06-01T00:00:00Z"));
        let swept = runtime().block_on(frostline::archive::sweep::sweep(&engine.context(), false)).unwrap();
        assert_eq!(swept.deleted, 0, "{swept:?}");
        assert_eq!(swept.foreign, 2, "{swept:?}");
    }
    assert_eq!(files_under(shared.path()).len(), 4);
    assert_eq!(query_engine(&a, "r").len(), 1);
    assert_eq!(query_engine(&b, "r").len(), 1);
}

/// Regression (issue: the `_catalog.json` of a table outside Delta on a shared target was
/// rewritten by each installation with only its own archives, so its readers saw one host's
/// data): each installation now keeps a catalog of its own, and together they list every
/// archive.
#[test]
fn each_installation_on_a_shared_target_keeps_a_catalog_of_its_own() {
    let shared = tempfile::tempdir().unwrap();
    let policy = moved_policy(&[shared.path()], "t0");
    let (first, second) = (Site::new(&policy, "2024-03-01T12:00:00Z"), Site::new(&policy, "2024-03-01T12:00:00Z"));
    let (a, b) = (first.open(Settings::default()), second.open(Settings::default()));
    for (site, engine) in [(&first, &a), (&second, &b)] {
        engine.append("r", vec![record("p", "2024-03-01T01:00:00Z", None)]).unwrap();
        site.clock.set(t("2024-03-03T00:00:00Z"));
        assert_eq!(run_pass(engine).archived, 1);
    }
    let mut listed = Vec::new();
    for engine in [&a, &b] {
        let key = frostline::archive::catalog::catalog_key("r", engine.installation_id(), t("2024-03-01T00:00:00Z"));
        assert!(key.ends_with("/2024-03-01_catalog.json"), "{key}");
        let text = std::fs::read_to_string(shared.path().join(&key)).unwrap_or_else(|e| panic!("{key}: {e}"));
        let catalog: serde_json::Value = serde_json::from_str(&text).unwrap();
        let manifests = catalog["manifests"].as_array().unwrap();
        assert_eq!(manifests.len(), 1, "{catalog}");
        let manifest = manifests[0]["manifest_key"].as_str().unwrap().to_string();
        assert!(manifest.contains(engine.installation_id()), "{manifest}");
        listed.push(manifest);
    }
    assert_ne!(listed[0], listed[1], "together the catalogs list both installations' archives");
    assert!(!shared.path().join("table=r/_catalog.json").exists(), "no catalog of one host stands for the table");
}

/// Regression (issue 34, measured by the scale-archived benchmark: a pass that archived one
/// bucket beside 20,000 archived ones took 16 times as long as beside 1,000): every pass that
/// published rewrote the table's whole catalog from every recorded manifest. A pass now
/// rewrites the catalogs of the days whose buckets' publication changed, and deletes those of
/// days left with none, across restarts too; a write of every day (the first, or one whose
/// changes a Delta log dropped) agrees with them and deletes what earlier builds wrote.
#[test]
fn a_pass_rewrites_only_the_catalogs_of_the_days_that_changed() {
    let e = TestEngine::new(&expiring_policy("30d"), "2024-03-01T12:00:00Z");
    let installation = e.engine.installation_id().to_string();
    let folder = frostline::archive::catalog::catalogs_folder("r", &installation);
    // A day this installation has no bucket of, and an earlier build's single catalog.
    for stale in ["2023-01-01_catalog.json", "_catalog.json"] {
        let (backend, key) = (e.backend("r"), format!("{folder}{stale}"));
        runtime().block_on(backend.put_create(&key, bytes::Bytes::from_static(b"{}"))).unwrap();
    }
    let day = |n: u32| format!("2024-02-{n:02}T06:00:00Z");
    for n in 1..=20 {
        e.engine.append("r", USER_KEYS[..2].iter().map(|key| record(key, &day(n), None)).collect()).unwrap();
    }
    assert_eq!(e.pass().archived, 40);
    let first = catalogs_of(&e.backend("r"), "r", &installation);
    assert_eq!(first.len(), 20, "one catalog per day, none of a day without buckets: {first:?}");
    assert!(first.values().all(|(_, manifests)| manifests.len() == 2), "{first:?}");
    assert!(first.contains_key("2024-02-05_catalog.json"), "{first:?}");

    // A late record (a next generation of 5 February, once the late grace is over) and a new
    // day (28 February).
    let mut late = record(USER_KEYS[0], &day(5), None);
    late.sort_key = b"late".to_vec();
    e.engine.append("r", vec![late, record(USER_KEYS[2], &day(28), None)]).unwrap();
    let written = t("2024-03-02T12:00:00Z") + frostline::settings::LATE_GRACE_SECONDS_DEFAULT as i64 * 1_000_000;
    e.clock.set(written);
    assert_eq!(e.pass().archived, 2);
    let second = catalogs_of(&e.backend("r"), "r", &installation);
    let rewritten = |catalogs: &std::collections::BTreeMap<String, (i64, Vec<String>)>, at: i64| -> Vec<String> {
        catalogs.iter().filter(|(_, (written, _))| *written == at).map(|(name, _)| name.clone()).collect()
    };
    assert_eq!(rewritten(&second, written), ["2024-02-05_catalog.json", "2024-02-28_catalog.json"], "{second:?}");
    assert_ne!(second["2024-02-05_catalog.json"].1, first["2024-02-05_catalog.json"].1, "the new generation is listed");
    assert_eq!(second.len(), 21);

    // 1 and 2 February expire: their catalogs go, the others stay as they were.
    e.clock.set(t("2024-03-04T12:00:00Z"));
    let mut expired = 0;
    for _ in 0..5 {
        expired += e.pass().expired;
    }
    assert_eq!(expired, 4);
    let third = catalogs_of(&e.backend("r"), "r", &installation);
    assert!(!third.contains_key("2024-02-01_catalog.json") && !third.contains_key("2024-02-02_catalog.json"));
    assert_eq!(third.len(), 19, "{third:?}");
    assert!(third.iter().all(|(name, listed)| second[name] == *listed), "untouched days stay as written");

    // After a restart, a new day is the only one written.
    let e = e.restart().unwrap();
    e.clock.set(t("2024-03-04T13:00:00Z"));
    e.engine.append("r", vec![record(USER_KEYS[1], "2024-03-01T06:00:00Z", None)]).unwrap();
    assert_eq!(e.pass().archived, 1);
    let fourth = catalogs_of(&e.backend("r"), "r", &installation);
    assert_eq!(rewritten(&fourth, t("2024-03-04T13:00:00Z")), ["2024-03-01_catalog.json"], "{fourth:?}");
    assert_eq!(fourth.len(), 20);

    // A Delta sync's drop of the changes takes the cursor: the next write is of every day,
    // and lists what the writes of changed days did, every published manifest once.
    e.engine.store().drop_publication_changes("r", 0).unwrap();
    let whole = runtime().block_on(frostline::archive::catalog::write(&e.engine.context(), "r")).unwrap();
    assert!(whole.whole && whole.days == 20 && whole.manifests == 38, "{whole:?}");
    let listed = |catalogs: std::collections::BTreeMap<String, (i64, Vec<String>)>| {
        catalogs
            .into_iter()
            .map(|(name, (_, manifests))| (name, manifests))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let after = listed(catalogs_of(&e.backend("r"), "r", &installation));
    assert_eq!(after, listed(fourth));
    let recorded: std::collections::BTreeSet<String> =
        e.engine.store().published("r").unwrap().into_iter().map(|(meta, _)| meta.manifest_key.unwrap()).collect();
    assert_eq!(after.into_values().flatten().collect::<std::collections::BTreeSet<_>>(), recorded);
}

/// Regression: a partition key whose encoded form exceeded a file name (255 bytes) failed the
/// upload forever and left the bucket fenced, refusing appends.
#[test]
fn the_longest_partition_key_archives_to_a_local_directory() {
    let e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    let long = "ü/".repeat(frostline::model::PARTITION_KEY_BYTES_MAX / 3);
    assert!(long.len() <= frostline::model::PARTITION_KEY_BYTES_MAX);
    e.engine
        .append("r", vec![record(&long, "2024-03-01T01:00:00Z", None), record("", "2024-03-01T01:00:00Z", None)])
        .unwrap();
    e.clock.set(t("2024-03-03T00:00:00Z"));
    let report = e.pass();
    assert_eq!(report.archived, 2, "{report:?}");
    let read = e.query_all("r");
    assert_eq!(read.len(), 2);
    assert!(read.iter().any(|r| r.partition_key == long.as_bytes()));
}

/// Regression: a query read the buckets' states in one transaction and their hot rows in
/// another; a bucket published and cleaned in between was silently missing from the page.
#[test]
fn queries_racing_archival_never_miss_a_record() {
    let e = TestEngine::new(&expiring_policy("3650d"), "2023-12-01T00:00:00Z");
    let all = records("2024-01-01T00:00:00Z", 40, 25);
    e.engine.append("r", all.clone()).unwrap();
    assert_eq!(e.pass().archived, 0); // planned, nothing due yet
    e.clock.set(t("2024-03-01T12:00:00Z"));
    let engine = e.engine.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut pages = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let page = runtime()
                    .block_on(frostline::query::query(
                        &engine.context(),
                        frostline::query::QueryRequest {
                            table: "r".into(),
                            limit: frostline::query::QUERY_LIMIT_MAX,
                            ..Default::default()
                        },
                    ))
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(page.records.len(), 1_000, "a page omitted records while buckets were archived");
                pages += 1;
            }
            pages
        })
    };
    let mut archived = 0;
    for _ in 0..10 {
        let report = e.pass();
        assert!(report.errors.is_empty(), "{report:?}");
        archived += report.archived;
    }
    assert_eq!(archived, 40 * 3);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let pages = reader.join().unwrap();
    assert!(pages > 0);
    assert_eq!(sorted(e.query_all("r")), sorted(all));
}

/// Regression: re-running an ingest after its buckets were archived was refused (409) instead
/// of recognising the identical records it holds.
#[test]
fn a_rerun_ingest_after_archival_is_recognised_record_by_record() {
    let e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    let first = vec![record("p", "2024-03-01T01:00:00Z", None), record("p", "2024-03-01T02:00:00Z", None)];
    e.engine.append("r", first.clone()).unwrap();
    e.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    // The same records again, with one for a hot bucket: all accepted, nothing rewritten.
    let mut again = first.clone();
    again.push(record("p", "2024-03-03T01:00:00Z", None));
    let outcome = e.engine.append("r", again).unwrap();
    assert_eq!((outcome.appended, outcome.duplicates, outcome.already_archived), (1, 0, 2), "{outcome:?}");
    // Another body under an archived identity is a conflict, and nothing of the batch is written.
    let mut changed = first[0].clone();
    changed.body = r#"{"x":2}"#.into();
    let err = e.engine.append("r", vec![record("p", "2024-03-03T02:00:00Z", None), changed]).unwrap_err();
    assert!(matches!(err, frostline::Error::Conflict(_)), "{err}");
    assert!(err.to_string().contains("already archived"), "{err}");
    // A record the archived bucket does not hold is a late record: it joins the bucket's next
    // generation (`generations` tests that in full).
    let late = e.engine.append("r", vec![record("p", "2024-03-01T03:00:00Z", None)]).unwrap();
    assert_eq!(late.appended, 1, "{late:?}");
    assert_eq!(e.query_all("r").len(), 4);
}

/// Regression: a table's strategy identity compared the path its plugin file was loaded from,
/// so moving the policy directory (or renaming the file) refused to start the engine, as if
/// the strategy had changed.
#[test]
fn a_policy_directory_moved_elsewhere_keeps_its_file_strategies() {
    let site = Site::new("", "2024-01-01T00:00:00Z");
    let component = frostline::plugin::builtin::find("builtin:calendar-day-utc").unwrap().source();
    std::fs::write(site.policies().join("calendar.wasm"), &component.bytes[..]).unwrap();
    let policy =
        GONE_TABLE.replace("{strategy}", "calendar.wasm").replace("{config}", r#", config = { unit = "day" }"#);
    site.write_policy(&policy);
    let engine = site.open(Settings::default());
    engine.append("gone", vec![record("p", &day(2023, 1), None)]).unwrap();
    drop(engine);
    let moved = site.root.path().join("moved-policies");
    std::fs::rename(site.policies(), &moved).unwrap();
    std::fs::rename(moved.join("calendar.wasm"), moved.join("calendar-v1.wasm")).unwrap();
    std::fs::write(moved.join("tables.toml"), policy.replace("calendar.wasm", "calendar-v1.wasm")).unwrap();
    let engine =
        Engine::open(&site.data(), &moved, Settings::default(), site.clock.clone()).unwrap_or_else(|e| panic!("{e}"));
    engine.append("gone", vec![record("p", &day(2023, 2), None)]).unwrap();
    assert_eq!(query_engine(&engine, "gone").len(), 2);
}

pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A data directory backed up while its one bucket was hot, and the copy that went on and
/// archived it: returns the site (the copy that went on) and the backup's data directory.
/// A site whose engine archived one record of `partition` (2024-03-01) under `policy`, and a
/// backup of its data directory taken then, with the engine stopped.
pub(crate) fn backed_up_after_archiving(policy: &str, partition: &str) -> (Site, PathBuf) {
    let site = Site::new(policy, "2024-03-01T12:00:00Z");
    let engine = site.open(Settings::default());
    engine.append("r", vec![record(partition, "2024-03-01T01:00:00Z", None)]).unwrap();
    site.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(run_pass(&engine).archived, 1);
    drop(engine);
    let backup = site.root.path().join("backup");
    copy_dir(&site.data(), &backup);
    (site, backup)
}

pub(crate) fn restored_copy(shared: &Path) -> (Site, PathBuf) {
    restored_copy_of(&moved_policy(&[shared], "t0"), record("p", "2024-03-01T01:00:00Z", None))
}

/// `restored_copy` of a site under `policy` whose one bucket holds `first`.
pub(crate) fn restored_copy_of(policy: &str, first: Record) -> (Site, PathBuf) {
    let site = Site::new(policy, "2024-03-01T12:00:00Z");
    let engine = site.open(Settings::default());
    engine.append("r", vec![first]).unwrap();
    drop(engine);
    let backup = site.root.path().join("backup");
    copy_dir(&site.data(), &backup);
    let engine = site.open(Settings::default());
    site.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(run_pass(&engine).archived, 1);
    drop(engine);
    (site, backup)
}

/// Regression: a data directory restored from a backup shares its installation id with the
/// copy that went on archiving after the backup; its orphan sweep took that copy's later
/// archives for its own orphans and deleted them. The sweep now finds a manifest generation
/// its database never issued, and stops before deleting anything.
#[test]
fn a_data_directory_restored_from_a_backup_never_sweeps_the_archives_of_the_copy_that_went_on() {
    let shared = tempfile::tempdir().unwrap();
    let (site, backup) = restored_copy(shared.path());
    let archived = files_under(shared.path());
    assert_eq!(archived.len(), 2, "a segment and its manifest: {archived:?}");

    // The restored copy, years later (every object is past the grace period).
    site.clock.set(t("2030-01-01T00:00:00Z"));
    let restored = Engine::open(&backup, &site.policies(), Settings::default(), site.clock.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let refused =
        runtime().block_on(frostline::archive::sweep::sweep(&restored.context(), false)).unwrap_err().to_string();
    assert!(
        refused.contains("another copy of this data directory") && refused.contains("nothing deleted"),
        "{refused}"
    );
    assert_eq!(files_under(shared.path()), archived, "nothing was deleted");
    drop(restored);
    let engine = site.open(Settings::default());
    assert_eq!(query_engine(&engine, "r").len(), 1);
}

/// Regression (issue: a restored backup sweeps away the copy that went on): the sweep's guard
/// compared generation numbers only, and a restored copy that archives the same bucket again
/// reaches the same generation, so once the other copy's objects were past the grace period a
/// pass deleted them: every record archived after the backup was lost. The objects now carry
/// the epoch of the life that wrote them, and the sweep deletes only keys its own database
/// released.
#[test]
fn a_restored_copy_that_archives_the_same_bucket_again_never_deletes_the_other_copys_archive() {
    // A device key as users have them: a `/`, a `%`, a space and non-ASCII.
    const DEVICE: &str = "site-a/100% é";
    let shared = tempfile::tempdir().unwrap();
    let (site, backup) =
        backed_up_after_archiving(&moved_policy(&[shared.path()], "t0").replace("10d", "3650d"), DEVICE);

    // The copy that goes on archives a bucket after the backup was taken.
    let engine = site.open(Settings::default());
    let later = record(DEVICE, "2024-03-03T01:00:00Z", None);
    engine.append("r", vec![later.clone()]).unwrap();
    site.clock.set(t("2024-03-05T00:00:00Z"));
    assert_eq!(run_pass(&engine).archived, 1);
    drop(engine);
    let went_on = files_under(shared.path());
    assert_eq!(went_on.len(), 4, "{went_on:?}");

    // The backup replaces it, takes one record for the same bucket and archives it too.
    std::fs::remove_dir_all(site.data()).unwrap();
    copy_dir(&backup, &site.data());
    let restored = site.open(Settings::default());
    restored.append("r", vec![record(DEVICE, "2024-03-03T02:00:00Z", None)]).unwrap();
    assert_eq!(run_pass(&restored).archived, 1);
    let generations: Vec<u64> = restored.store().buckets("r", None).unwrap().iter().map(|b| b.generation).collect();
    assert_eq!(generations, vec![1, 1], "the same generation numbers as the copy that went on");

    // Years later every object is past the grace period; passes run as usual.
    site.clock.set(t("2030-01-01T00:00:00Z"));
    let report = run_pass(&restored);
    assert!(
        report.errors.iter().any(|e| e.contains("another copy of this data directory")),
        "the pass says why its sweep stopped: {report:?}"
    );
    assert_eq!(report.error_kinds.get("sweep"), Some(&1), "{report:?}");
    let status = frostline::ops::status::collect(&restored).unwrap();
    let stop = status.sweep_stopped.expect("status names the stopped sweep");
    assert!(stop.reason.contains("never recorded"), "{stop:?}");
    let left = files_under(shared.path());
    for object in &went_on {
        assert!(left.contains(object), "{} was deleted", object.display());
    }
    // The record archived after the backup is still there to adopt: its manifest and segment.
    let later_bucket: Vec<_> = left.iter().filter(|p| p.to_string_lossy().contains("2024-03-03")).collect();
    assert_eq!(later_bucket.len(), 4, "both copies' archives of the bucket: {later_bucket:?}");
}

/// The re-plan preview of `frostline policy check --data` streams a table's buckets in batches
/// from one read transaction; every bucket is counted once across batch boundaries.
#[test]
fn the_replan_preview_counts_every_bucket_across_batches() {
    let site = Site::new(&expiring_policy("1000d"), "2024-01-01T00:00:00Z");
    let engine = site.open(Settings::default());
    // 1,201 daily buckets: two full batches of the preview and a partial one.
    let records: Vec<Record> = (0..1_201).map(|d| record("p", &day(2020, d), None)).collect();
    engine.append("r", records).unwrap();
    run_pass(&engine); // plans them all
    site.write_policy(&expiring_policy("3650d"));
    let set = frostline::policy::load(&site.policies(), &site.data(), engine.host(), engine.settings()).unwrap();
    let preview = frostline::policy::check::preview(&set, engine.store(), site.clock.now()).unwrap();
    let table = &preview.tables[0];
    assert_eq!(table.buckets_checked, 1_201, "{table:?}");
    assert_eq!(table.expire_later, 1_201, "{table:?}");
}

fn archiving_policy(archive_after: &str) -> String {
    format!(
        r#"
[[table]]
id = "r"
strategy = {{ plugin = "builtin:calendar-day-utc" }}
retention = {{ plugin = "builtin:eligible-before", config = {{ archive_after = "{archive_after}" }} }}
"#
    )
}

/// Regression: after a policy change a reconciliation visited a table's buckets in key order,
/// and the plan queue was in key order too, so on a store of more buckets than a pass
/// re-plans the buckets the change made due waited behind every partition that sorts before
/// theirs: the first pass after the change (and every pass until the whole store was
/// re-planned) archived nothing. Buckets are now reconciled and planned oldest end first.
#[test]
fn a_pass_after_a_policy_change_plans_and_archives_the_oldest_buckets_first() {
    use frostline::archive::PLAN_BUCKETS_PER_PASS_MAX;
    let site = Site::new(&archiving_policy("1000d"), "2024-06-01T12:00:00Z");
    let engine = site.open(Settings::default());
    // Twice as many recent buckets as a pass re-plans, one per partition, in partitions that
    // sort before the old ones' (and awkward keys, as devices name them).
    let recent = 2 * PLAN_BUCKETS_PER_PASS_MAX;
    let mut records: Vec<Record> =
        (0..recent).map(|n| record(&format!("a site/{n:05}%=é"), "2024-06-01T00:00:00Z", None)).collect();
    let old: Vec<Record> = (0..10).map(|d| record("zz/old", &day(2023, d), None)).collect();
    records.extend(old.iter().cloned());
    for chunk in records.chunks(5_000) {
        engine.append("r", chunk.to_vec()).unwrap();
    }
    // Plan everything under the first policy: nothing is due.
    while !engine.store().unplanned(1).unwrap().is_empty() {
        assert_eq!(run_pass(&engine).archived, 0);
    }
    site.write_policy(&archiving_policy("30d"));
    assert!(reload(&engine, "test").accepted);
    let report = run_pass(&engine);
    assert_eq!(
        report.archived,
        old.len() as u64,
        "the first pass after the change archives the old buckets: {report:?}"
    );
    assert!(report.reconciled <= PLAN_BUCKETS_PER_PASS_MAX as u64, "the re-planning is bounded: {report:?}");
    // The rest is re-planned by later passes, and nothing recent is archived.
    while !engine.store().unplanned(1).unwrap().is_empty()
        || engine.store().table_state("r").unwrap().unwrap().reconcile_from.is_some()
    {
        assert_eq!(run_pass(&engine).archived, 0);
    }
    let archived =
        engine.store().buckets("r", None).unwrap().into_iter().filter(|b| b.state != BucketState::Hot).count();
    assert_eq!(archived, old.len());
}

/// Regression: a policy change leaves every bucket due under its old plan in the due index
/// until the table's reconciliation reaches it, and a pass took the first `scan_limit` of them
/// and claimed each, only to find its plan stale and queue it for a new one: while more
/// stale entries lay before the buckets already planned under the new policy, every pass
/// archived nothing (a crash-harness store of 37,000 buckets spent its first six passes, 25
/// seconds, after each change this way). A pass now passes over stale entries, queues them for
/// a plan in batches, and archives what is due under current plans.
#[test]
fn a_pass_after_a_policy_change_archives_though_stale_plans_are_due_before_the_new_ones() {
    use frostline::settings::SCAN_LIMIT_DEFAULT;
    let site = Site::new(&archiving_policy("400d"), "2023-08-01T00:00:00Z");
    let engine = site.open(Settings::default());
    // 60 partitions of 200 days: more buckets than a pass reconciles, so after the change the
    // newest stay due under their old plan (end + 400 days) before the oldest, planned anew
    // (end + 600 days).
    let records: Vec<Record> =
        (0..200).flat_map(|d| (0..60).map(move |p| record(&format!("dev/{p:02} %=é"), &day(2023, d), None))).collect();
    for chunk in records.chunks(5_000) {
        engine.append("r", chunk.to_vec()).unwrap();
    }
    while !engine.store().unplanned(1).unwrap().is_empty() {
        assert_eq!(run_pass(&engine).archived, 0, "nothing is due under the first plans yet");
    }
    site.clock.set(t("2026-01-01T00:00:00Z"));
    site.write_policy(&archiving_policy("600d"));
    assert!(reload(&engine, "test").accepted);
    let first = run_pass(&engine);
    assert_eq!(first.archived, SCAN_LIMIT_DEFAULT as u64, "the first pass after the change: {first:?}");
    // The stale entries it passed over were queued for a plan beside the reconciliation's.
    assert!(first.reconciled as usize > frostline::archive::RECONCILE_BUCKETS_PER_PASS_MAX, "{first:?}");
    let second = run_pass(&engine);
    assert_eq!(second.archived, SCAN_LIMIT_DEFAULT as u64, "{second:?}");
}

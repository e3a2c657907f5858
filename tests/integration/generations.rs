//! Archives that change: a record that arrives after its bucket was archived (a device that was
//! offline, a backfill) is accepted, read at once beside the archive, and archived by the next
//! pass as the bucket's next generation: a manifest that holds the union, verified and
//! published like the first, after which the late rows are cleaned up with the same proof and
//! the replaced generation's objects are released to the orphan sweep. A bucket whose archive
//! expired stays closed, and says why.

use frostline::Error;
use frostline::clock::Clock;
use frostline::model::{BucketState, Record};

use crate::replan::expiring_policy;
use crate::support::*;

const DAY_US: i64 = 86_400_000_000;
/// The default ARCHIVER_LATE_GRACE_SECONDS, in microseconds.
const LATE_GRACE_US: i64 = frostline::settings::LATE_GRACE_SECONDS_DEFAULT as i64 * 1_000_000;

/// A partition key as users have them: a slash, a percent sign, an equals sign, a space and
/// non-ASCII text.
const PARTITION: &str = "site a/%20=ü";

fn record(time: &str, sort_key: &str, body: &str) -> Record {
    Record {
        partition_key: PARTITION.as_bytes().to_vec(),
        event_time: t(time),
        sort_key: sort_key.as_bytes().to_vec(),
        tenant: Some("acme".into()),
        kind: None,
        body: body.into(),
    }
}

/// An engine on `policy` whose late records make the next generation at the next pass.
fn without_late_grace(policy: &str) -> TestEngine {
    let settings = frostline::settings::Settings { late_grace_us: 0, ..Default::default() };
    TestEngine::open_with_settings(policy, "2024-03-01T12:00:00Z", &[], Default::default(), settings).unwrap()
}

fn objects(e: &TestEngine) -> Vec<String> {
    runtime().block_on(e.backend("r").list("")).unwrap().into_iter().map(|o| o.key).collect()
}

#[test]
fn a_late_record_for_an_archived_bucket_is_read_at_once_and_archived_as_the_next_generation() {
    let e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    let first = vec![
        record("2024-03-01T01:00:00Z", "a", r#"{"n":1}"#),
        record("2024-03-01T03:00:00Z", "c", r#"{"n":3}"#),
        record("2024-03-01T05:00:00Z", "e", &format!("\"{}\"", "x".repeat(100_000))),
    ];
    e.engine.append("r", first.clone()).unwrap();
    e.pass(); // plan
    e.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    let store = e.engine.store().clone();
    let id = store.buckets("r", None).unwrap()[0].id.clone();
    let archived = store.bucket(&id).unwrap().unwrap();
    assert_eq!(archived.state, BucketState::Archived { hot_deleted: true });
    let first_manifest = store.latest_manifest(&id).unwrap().unwrap();
    let first_key = archived.manifest_key.clone().unwrap();
    let mut first_objects: Vec<String> = first_manifest.segments.iter().map(|s| s.key.clone()).collect();
    first_objects.push(first_key.clone());
    let listed = objects(&e);
    assert!(first_objects.iter().all(|k| listed.contains(k)), "{listed:?}");

    // A month later, two late records arrive with one the archive already holds.
    e.clock.set(t("2024-04-01T00:00:00Z"));
    let late = vec![record("2024-03-01T02:00:00Z", "b", r#"{"n":2}"#), record("2024-03-01T06:00:00Z", "f", "{}")];
    let mut batch = late.clone();
    batch.push(first[1].clone());
    let outcome = e.engine.append("r", batch).unwrap();
    assert_eq!((outcome.appended, outcome.duplicates, outcome.already_archived), (2, 0, 1), "{outcome:?}");
    assert_eq!(store.bucket(&id).unwrap().unwrap().state, BucketState::ArchivedPending);
    // The same late record again is a duplicate; another body under an archived identity, or
    // under a pending one, is a conflict, and nothing of that batch is written.
    let again = e.engine.append("r", vec![late[0].clone()]).unwrap();
    assert_eq!((again.appended, again.duplicates), (0, 1), "{again:?}");
    for changed in [record("2024-03-01T01:00:00Z", "a", r#"{"n":9}"#), record("2024-03-01T02:00:00Z", "b", "{}")] {
        let err = e.engine.append("r", vec![record("2024-03-01T07:00:00Z", "g", "{}"), changed]).unwrap_err();
        assert!(matches!(err, Error::Conflict(_)), "{err}");
    }
    let mut expected = sorted(first.iter().chain(&late).cloned().collect());
    assert_eq!(e.query_all("r"), expected, "queries read the archive and the pending rows, in order, once");

    // The next generation waits for the late grace; then a pass publishes it: the union,
    // verified, then the late rows cleaned.
    assert_eq!(e.pass().archived, 0, "published before the late grace ran out");
    e.clock.advance(LATE_GRACE_US);
    let report = e.pass();
    assert_eq!(report.archived, 1, "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    let meta = store.bucket(&id).unwrap().unwrap();
    assert_eq!(meta.state, BucketState::Archived { hot_deleted: true });
    assert_ne!(meta.manifest_key.as_ref(), Some(&first_key));
    let manifest = store.latest_manifest(&id).unwrap().unwrap();
    assert!(manifest.generation > first_manifest.generation);
    assert_eq!(manifest.summary.rows, 5);
    let amends = manifest.amends.clone().expect("the next generation names what it replaces");
    assert_eq!((amends.generation, amends.manifest_key.as_str()), (first_manifest.generation, first_key.as_str()));
    assert_eq!(amends.hot_rows.rows, 2);
    assert!(store.rows(&id, None, usize::MAX).unwrap().is_empty(), "the late rows were cleaned up");
    let copies = store.snapshot().unwrap().manifests_of(&id).unwrap();
    assert_eq!(
        copies.iter().map(|m| m.generation).collect::<Vec<_>>(),
        vec![manifest.generation],
        "the cleanup dropped the replaced archive's copy"
    );
    assert_eq!(e.query_all("r"), expected);
    let read = runtime()
        .block_on(frostline::format::reader::read_archive(
            e.backend("r").as_ref(),
            meta.manifest_key.as_ref().unwrap(),
            None,
            None,
        ))
        .unwrap();
    assert_eq!(read, expected, "the archive alone holds every record");

    // The replaced generation's objects are released, and the sweep deletes them after its
    // grace period; the new generation's stay.
    e.clock.set(frostline::clock::SystemClock.now() + 2 * DAY_US);
    let swept = runtime().block_on(frostline::archive::sweep::sweep(&e.engine.context(), false)).unwrap();
    assert_eq!(swept.deleted as usize, first_objects.len(), "{swept:?}");
    let left = objects(&e);
    assert!(first_objects.iter().all(|k| !left.contains(k)), "{left:?}");
    assert_eq!(e.query_all("r"), expected);

    // A third generation works the same way.
    let third = record("2024-03-01T00:00:00Z", "0", "{}");
    e.engine.append("r", vec![third.clone()]).unwrap();
    e.clock.advance(LATE_GRACE_US);
    assert_eq!(e.pass().archived, 1);
    expected.insert(0, third);
    assert_eq!(e.query_all("r"), expected);
    assert_eq!(store.latest_manifest(&id).unwrap().unwrap().summary.rows, 6);
}

#[test]
fn a_record_for_a_bucket_whose_archive_expired_is_refused_and_says_why() {
    let e = TestEngine::new(&expiring_policy("3d"), "2024-03-01T12:00:00Z");
    e.engine.append("r", vec![record("2024-03-01T01:00:00Z", "a", "{}")]).unwrap();
    e.pass();
    e.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    e.clock.set(t("2024-03-10T00:00:00Z"));
    let expired: u64 = (0..3).map(|_| e.pass().expired).sum();
    assert_eq!(expired, 1);
    let err = e.engine.append("r", vec![record("2024-03-01T02:00:00Z", "b", "{}")]).unwrap_err();
    assert!(matches!(err, Error::BucketExpired { .. }), "{err}");
    assert!(err.to_string().contains("expired by retention"), "{err}");
    assert_eq!(e.query_all("r"), Vec::new());
}

/// The manifests in the folder of the only bucket of table `r` on the default target.
fn manifests(e: &TestEngine) -> Vec<String> {
    objects(e).into_iter().filter(|k| k.contains("/manifest-")).collect()
}

/// Regression (lifecycle simulation, seed 3 × 1,000 operations): adoption took an archive for
/// the next generation of the one a restored copy records when it amended a generation at least
/// as new and the recorded archive was gone. Generation numbers prove nothing across copies: a
/// copy restored from an older backup forks the same numbers. Here the copy restored from the
/// newer backup recorded generation 2, which the copy that went on expired; a fork made from the
/// older backup (generations 2 and 3 over generation 1, without record `b`) was adopted in its
/// place, so `b` was gone while its range read as archived. Now an archive succeeds a recorded
/// one only when its lineage names that archive's key: the fork is a conflict left on the
/// target, and the expiry is recorded.
#[test]
fn a_restored_copy_never_adopts_a_fork_for_the_next_generation_of_its_archive() {
    let backups = tempfile::tempdir().unwrap();
    let (older, newer) = (backups.path().join("older"), backups.path().join("newer"));
    let mut e = TestEngine::new(&expiring_policy("10d"), "2024-03-01T12:00:00Z");
    let a = record("2024-03-01T01:00:00Z", "a", "{}");
    e.engine.append("r", vec![a.clone()]).unwrap();
    e.pass();
    e.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    e = e.backup(&older).unwrap();
    // A late record: generation 2 amends generation 1, and the newer backup records it.
    e.engine.append("r", vec![record("2024-03-01T02:00:00Z", "b", "{}")]).unwrap();
    e.clock.advance(LATE_GRACE_US);
    assert_eq!(e.pass().archived, 1);
    e = e.backup(&newer).unwrap();
    let recorded = e.engine.store().buckets("r", None).unwrap()[0].manifest_key.clone().unwrap();

    // A copy restored from the older backup makes a fork of its own: generations 2 and 3 over
    // generation 1, with late records `c` and `d` and without `b`.
    e = e.restore(&older).unwrap();
    for late in [record("2024-03-01T03:00:00Z", "c", "{}"), record("2024-03-01T04:00:00Z", "d", "{}")] {
        e.engine.append("r", vec![late]).unwrap();
        e.clock.advance(LATE_GRACE_US);
        assert_eq!(e.pass().archived, 1);
    }
    let fork: Vec<String> = manifests(&e).into_iter().filter(|k| *k != recorded).collect();
    assert_eq!(fork.len(), 3, "generation 1 and the fork's two: {fork:?}");

    // The copy that went on from the newer backup expires the bucket, its generation 2 with it.
    e = e.restore(&newer).unwrap();
    e.clock.set(t("2024-03-20T00:00:00Z"));
    let expired: u64 = (0..3).map(|_| e.pass().expired).sum();
    assert_eq!(expired, 1);
    assert!(!manifests(&e).contains(&recorded), "the expiry deleted generation 2");

    // Restored from the newer backup again, the copy records generation 2, which is gone.
    e = e.restore(&newer).unwrap();
    let report = runtime().block_on(frostline::archive::adopt::adopt(&e.engine.context(), false, &[])).unwrap();
    assert_eq!(report.adopted, 0, "no archive in the folder follows generation 2: {report:?}");
    assert_eq!(report.gone.len(), 1, "{report:?}");
    assert!(report.failures.is_empty(), "{report:?}");
    let meta = &e.engine.store().buckets("r", None).unwrap()[0];
    assert_eq!(meta.state, BucketState::Expired, "the expiry the other copy made is recorded");
    let page = e.first_page("r");
    assert!(page.records.is_empty(), "{page:?}");
    assert_eq!(page.expired.len(), 1, "the range reads as expired, not as the fork's records: {page:?}");
    for key in &fork {
        assert!(manifests(&e).contains(key), "the fork's `{key}` stays on the target");
    }
}

/// A late record is compared with the segments whose event times cover it, not the whole
/// archive (the late scenario of BENCHMARKS.md measured a 100,000-row bucket read whole for
/// each late append): an archive of three segments still finds the identical record in its
/// last segment and the changed body in its middle one, and takes the late record.
#[test]
fn a_late_record_is_compared_with_the_segments_that_cover_it() {
    let e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    let rows = 2 * frostline::format::SEGMENT_ROWS_MAX + 500;
    let at = |n: usize| {
        let time = t("2024-03-01T00:00:00Z") + n as i64 * 2_000_000;
        Record { event_time: time, ..record("2024-03-01T00:00:00Z", &format!("k{n:06}"), &format!("{{\"n\":{n}}}")) }
    };
    let archived: Vec<Record> = (0..rows).map(|n| at(2 * n)).collect();
    for chunk in archived.chunks(5_000) {
        e.engine.append("r", chunk.to_vec()).unwrap();
    }
    e.pass();
    e.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    let id = e.engine.store().buckets("r", None).unwrap()[0].id.clone();
    assert_eq!(e.engine.store().latest_manifest(&id).unwrap().unwrap().segments.len(), 3);

    let last = archived[rows - 1].clone();
    let mut changed = archived[frostline::format::SEGMENT_ROWS_MAX + 7].clone();
    changed.body = "{\"changed\":true}".into();
    let err = e.engine.append("r", vec![at(1), changed]).unwrap_err();
    assert!(matches!(err, Error::Conflict(_)), "a changed body in the middle segment: {err}");
    let outcome = e.engine.append("r", vec![at(2 * rows - 3), last]).unwrap();
    assert_eq!((outcome.appended, outcome.already_archived), (1, 1), "{outcome:?}");
    assert_eq!(e.engine.store().bucket(&id).unwrap().unwrap().state, BucketState::ArchivedPending);
}

/// Late records that trickle in are gathered into one generation per late grace
/// (ARCHIVER_LATE_GRACE_SECONDS, counted from the first): a next generation rewrites the
/// whole bucket, so one per record would rewrite it once per pass. Reads see each record at
/// once. With a grace of 0 the next pass publishes.
#[test]
fn late_records_within_the_grace_make_one_generation() {
    let e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    e.engine.append("r", vec![record("2024-03-01T01:00:00Z", "a", "{}")]).unwrap();
    e.pass();
    e.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    let store = e.engine.store().clone();
    let id = store.buckets("r", None).unwrap()[0].id.clone();
    let first = store.bucket(&id).unwrap().unwrap().manifest_key.unwrap();

    e.engine.append("r", vec![record("2024-03-01T02:00:00Z", "b", "{}")]).unwrap();
    assert_eq!(e.pass().archived, 0);
    e.clock.advance(LATE_GRACE_US - 1_000_000);
    e.engine.append("r", vec![record("2024-03-01T03:00:00Z", "c", "{}")]).unwrap();
    assert_eq!(e.pass().archived, 0, "a later record does not start the grace again, nor end it");
    assert_eq!(e.query_all("r").len(), 3, "reads see the late records while they wait");
    e.clock.advance(1_000_000);
    assert_eq!(e.pass().archived, 1, "due when the grace of the first late record ran out");
    let manifest = store.latest_manifest(&id).unwrap().unwrap();
    let amends = manifest.amends.expect("a next generation");
    assert_eq!((amends.manifest_key.as_str(), amends.hot_rows.rows), (first.as_str(), 2), "one generation for both");
    assert_eq!(amends.lineage, vec![first]);

    let settings = frostline::settings::Settings { late_grace_us: 0, ..Default::default() };
    let at_once = TestEngine::open_with_settings(
        &expiring_policy("3650d"),
        "2024-03-01T12:00:00Z",
        &[],
        Default::default(),
        settings,
    )
    .unwrap();
    at_once.engine.append("r", vec![record("2024-03-01T01:00:00Z", "a", "{}")]).unwrap();
    at_once.pass();
    at_once.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(at_once.pass().archived, 1);
    at_once.engine.append("r", vec![record("2024-03-01T02:00:00Z", "b", "{}")]).unwrap();
    assert_eq!(at_once.pass().archived, 1, "a grace of 0 publishes at the next pass");
}

/// Regression (lifecycle simulation at a20d484, seeds 16906725213614718770 and
/// 8634406492624016800 × 200 operations): adoption named a generation that the recorded archive
/// replaced as another copy's archive "that cannot replace it" or "with other rows", left on
/// the target, though the recorded archive's lineage holds it and every one of its rows. Its
/// objects were released when the next generation was published, and the sweep deletes them,
/// as it must; the report told an operator an archive was kept that was not. Now an archive
/// the recorded one descends from counts as replaced, not as a conflict: on the target it was
/// moved away from (the store's check) and beside its successor in one folder (the fork check).
#[test]
fn adoption_counts_a_generation_the_recorded_archive_replaced_as_replaced_not_a_conflict() {
    let mut e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    e.engine.append("r", vec![record("2024-03-01T01:00:00Z", "a", "{}")]).unwrap();
    e.pass();
    e.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    let first = manifests(&e);
    assert_eq!(first.len(), 1);

    // The table moves to another target; two late records make generations 2 and 3 there.
    let t2 = tempfile::tempdir().unwrap();
    let moved = expiring_policy("3650d").replace("[[table]]", "[[table]]\ntarget = \"t2\"");
    let target = format!("[[target]]\nname = \"t2\"\nurl = \"file://{}\"\n", t2.path().display());
    std::fs::write(e.policies_dir().join("tables.toml"), format!("{target}{moved}")).unwrap();
    e = e.restart().unwrap();
    for late in [record("2024-03-01T02:00:00Z", "b", "{}"), record("2024-03-01T03:00:00Z", "c", "{}")] {
        e.engine.append("r", vec![late]).unwrap();
        e.clock.advance(LATE_GRACE_US);
        assert_eq!(e.pass().archived, 1);
    }
    let on_t2 = manifests(&e);
    assert_eq!(on_t2.len(), 2, "generations 2 and 3, before any sweep: {on_t2:?}");
    assert!(!on_t2.contains(&first[0]), "generation 1 stays on the first target");

    let recorded = e.engine.store().buckets("r", None).unwrap()[0].manifest_key.clone();
    let report = runtime().block_on(frostline::archive::adopt::adopt(&e.engine.context(), false, &[])).unwrap();
    assert!(report.conflicts.is_empty(), "replaced generations are no conflict: {report:?}");
    assert!(report.failures.is_empty(), "{report:?}");
    assert_eq!((report.adopted, report.known, report.superseded), (0, 1, 2), "{report:?}");
    assert_eq!(e.engine.store().buckets("r", None).unwrap()[0].manifest_key, recorded, "unchanged");
    assert_eq!(e.query_all("r").len(), 3);
}

/// Regression (lifecycle simulation, seeds 14110081527287138056 and 16314023887982348757 of the
/// 10,000-seed run at d98519a): after a restore, the copy that went on had amended a bucket
/// twice; the restored copy took the same identity with another body and amended its own
/// generation once, under a lower generation number. When that database was lost and rebuilt,
/// adoption tried the folder's manifests by generation number and took the stale copy's last
/// generation: the record
/// read back with the body the restored copy had replaced, and the late record it never had.
/// Generation numbers do not order forks; the copy that wrote last ran last. Now the head written
/// last is adopted and the other fork's head is named as a conflict that stays on the target.
#[test]
fn a_rebuilt_data_directory_adopts_the_fork_of_the_copy_that_ran_last() {
    let backups = tempfile::tempdir().unwrap();
    let backup = backups.path().join("backup");
    let mut e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    e.engine.append("r", vec![record("2024-03-01T01:00:00Z", "a", "{}")]).unwrap();
    e.pass();
    e.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    e = e.backup(&backup).unwrap();
    // The copy that goes on: two late records, two more generations.
    for late in [record("2024-03-01T02:00:00Z", "b", r#"{"v":1}"#), record("2024-03-01T03:00:00Z", "c", "{}")] {
        e.engine.append("r", vec![late]).unwrap();
        e.clock.advance(LATE_GRACE_US);
        assert_eq!(e.pass().archived, 1);
    }
    let stale: Vec<String> = manifests(&e);
    // Restored from the backup, the copy takes `b` with another body: its own generation 2.
    e = e.restore(&backup).unwrap();
    e.engine.append("r", vec![record("2024-03-01T02:00:00Z", "b", r#"{"v":2}"#)]).unwrap();
    e.clock.advance(LATE_GRACE_US);
    assert_eq!(e.pass().archived, 1);
    let living = e.engine.store().buckets("r", None).unwrap()[0].manifest_key.clone().unwrap();
    let served = e.query_all("r");
    assert_eq!(served.len(), 2);

    // Its database is lost; the new installation adopts what the lost one archived.
    let lost = e.engine.installation_id().to_string();
    e = e.rebuild().unwrap();
    let report = runtime().block_on(frostline::archive::adopt::adopt(&e.engine.context(), false, &[lost])).unwrap();
    assert_eq!(report.adopted, 1, "{report:?}");
    assert!(report.failures.is_empty(), "{report:?}");
    assert_eq!(e.engine.store().buckets("r", None).unwrap()[0].manifest_key.as_deref(), Some(living.as_str()));
    assert_eq!(e.query_all("r"), served, "the records of the copy that ran last, as it served them");
    // The stale fork's head is named, and stays on the target.
    let generation = |key: &String| frostline::storage::keys::manifest_origin(key).map(|(_, g)| g);
    let head = stale.iter().max_by_key(|k| generation(k)).expect("the stale fork's last generation");
    assert!(generation(&living) < generation(head), "the stale fork counted further: {living} {head}");
    assert_eq!(report.conflicts.len(), 1, "{report:?}");
    assert!(report.conflicts[0].contains(head.as_str()), "{report:?}");
    assert!(manifests(&e).contains(head));
}

/// Regression (lifecycle simulation, seed 624806462434409201 of the 10,000-seed run at d0599b0):
/// after a restore, the copy that went on had archived a bucket's next generation on the
/// table's second target, and the restored copy its own on the first. When that database was
/// lost, the table was on the second target again; adoption chose the head written last only
/// among the manifests of one target, visiting the table's current target first, so it took
/// the stale fork there, and the restored copy's archive on the other target "could not replace
/// it": a record read back with the body the restored copy had replaced. Now a bucket's
/// manifests on every target are weighed together.
#[test]
fn a_rebuilt_data_directory_adopts_the_fork_written_last_whichever_target_it_lies_on() {
    let backups = tempfile::tempdir().unwrap();
    let backup = backups.path().join("backup");
    let t2 = tempfile::tempdir().unwrap();
    let on_t1 = expiring_policy("3650d");
    let target = format!("[[target]]\nname = \"t2\"\nurl = \"file://{}\"\n", t2.path().display());
    let on_t2 = format!("{target}{}", on_t1.replace("[[table]]", "[[table]]\ntarget = \"t2\""));
    let mut e = TestEngine::new(&format!("{target}{on_t1}"), "2024-03-01T12:00:00Z");
    e.engine.append("r", vec![record("2024-03-01T01:00:00Z", "a", "{}")]).unwrap();
    e.pass();
    e.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    e = e.backup(&backup).unwrap();
    // The copy that goes on moves the table to t2 and archives `b` there: generation 2.
    std::fs::write(e.policies_dir().join("tables.toml"), &on_t2).unwrap();
    e = e.restart().unwrap();
    e.engine.append("r", vec![record("2024-03-01T02:00:00Z", "b", r#"{"v":1}"#)]).unwrap();
    e.clock.advance(LATE_GRACE_US);
    assert_eq!(e.pass().archived, 1);
    let stale = runtime().block_on(e.backend("r").list("")).unwrap();
    let stale: Vec<String> = stale.into_iter().map(|o| o.key).filter(|k| k.contains("/manifest-")).collect();
    assert_eq!(stale.len(), 1, "the stale fork's generation 2, on t2: {stale:?}");
    // Restored from the backup with the table back on t1, the copy takes `b` with another body.
    std::fs::write(e.policies_dir().join("tables.toml"), format!("{target}{on_t1}")).unwrap();
    e = e.restore(&backup).unwrap();
    e.engine.append("r", vec![record("2024-03-01T02:00:00Z", "b", r#"{"v":2}"#)]).unwrap();
    e.clock.advance(LATE_GRACE_US);
    assert_eq!(e.pass().archived, 1);
    let living = e.engine.store().buckets("r", None).unwrap()[0].manifest_key.clone().unwrap();
    let served = e.query_all("r");
    assert_eq!(served.len(), 2);

    // The table moves to t2 again; then the database is lost and the new one adopts.
    std::fs::write(e.policies_dir().join("tables.toml"), &on_t2).unwrap();
    let lost = e.engine.installation_id().to_string();
    e = e.rebuild().unwrap();
    let report = runtime().block_on(frostline::archive::adopt::adopt(&e.engine.context(), false, &[lost])).unwrap();
    assert!(report.failures.is_empty(), "{report:?}");
    assert_eq!(report.adopted, 1, "{report:?}");
    let adopted = e.engine.store().buckets("r", None).unwrap()[0].manifest_key.clone();
    assert_eq!(adopted.as_deref(), Some(living.as_str()), "the head written last, on t1: {report:?}");
    assert_eq!(e.query_all("r"), served, "the records of the copy that ran last, as it served them");
    // The stale fork's head is named, and stays on t2.
    assert_eq!(report.conflicts.len(), 1, "{report:?}");
    assert!(report.conflicts[0].contains(stale[0].as_str()), "{report:?}");
    assert!(t2.path().join(&stale[0]).is_file());
}

/// A backfill into a running engine (`frostline ingest`, whose batches hold their table's
/// backfill lease) makes one generation per bucket however long it runs and whatever the passes
/// do meanwhile: history it brings to archived buckets (late records) and to buckets still hot
/// waits until the lease lapses, `BACKFILL_LEASE_SECONDS` after the last batch; then one pass
/// archives each bucket once. Before, a pass between batches archived a bucket the next batch
/// added to again.
#[test]
fn a_backfill_while_passes_run_makes_one_generation_per_bucket() {
    use frostline::model::CheckedRecords;
    use frostline::ops::records::append_backfill;
    let lease_us = frostline::store::backfill::BACKFILL_LEASE_SECONDS as i64 * 1_000_000;
    let e = TestEngine::new(&expiring_policy("3650d"), "2024-03-05T12:00:00Z");
    e.engine
        .append("r", vec![record("2024-03-02T01:00:00Z", "a", "{}"), record("2024-03-03T01:00:00Z", "a", "{}")])
        .unwrap();
    assert_eq!((0..2).map(|_| e.pass().archived).sum::<u64>(), 2);
    let store = e.engine.store().clone();
    let first: std::collections::BTreeMap<String, u64> = store
        .buckets("r", None)
        .unwrap()
        .into_iter()
        .map(|m| (m.id.bucket_key.clone(), store.latest_manifest(&m.id).unwrap().unwrap().generation))
        .collect();

    // Three batches of history, a pass after each, two minutes apart.
    for batch in 0..3 {
        let records = ["2024-03-01", "2024-03-02", "2024-03-03"]
            .iter()
            .map(|day| record(&format!("{day}T0{}:00:00Z", batch + 2), &format!("b{batch}"), "{}"))
            .collect();
        append_backfill(&e.engine, "r", CheckedRecords::check(records).unwrap()).unwrap();
        // Within the lease; by the third batch past the late grace of the first one's records.
        e.clock.advance(lease_us - 1);
        let report = e.pass();
        assert_eq!(report.archived, 0, "batch {batch}: a pass archived during the backfill: {report:?}");
        assert!(report.errors.is_empty(), "{report:?}");
    }
    assert!(3 * (lease_us - 1) > LATE_GRACE_US, "the backfill outlasts the late grace");
    assert_eq!(e.query_all("r").len(), 11, "the backfilled records read at once");
    e.clock.advance(LATE_GRACE_US.max(lease_us));
    let report = e.pass();
    assert_eq!(report.archived, 3, "one generation per bucket once the lease lapsed: {report:?}");
    for meta in store.buckets("r", None).unwrap() {
        let manifest = store.latest_manifest(&meta.id).unwrap().unwrap();
        match first.get(&meta.id.bucket_key) {
            Some(generation) => assert_eq!(manifest.amends.as_ref().unwrap().generation, *generation),
            None => assert!(manifest.amends.is_none(), "day 1 archived once, as a first generation"),
        }
        assert_eq!(meta.state, BucketState::Archived { hot_deleted: true });
    }
    assert_eq!(e.pass().archived, 0);
    assert_eq!(e.query_all("r").len(), 11);
}

/// What an archived bucket keeps in the store is bounded: the copy of its published manifest,
/// not one per generation (each cleanup drops the copy of the archive it replaced, whose
/// objects its released keys name from then on). Once it expires: its row (queries still say
/// the range expired), and, until its tombstone is purged, the tombstone and that copy, which
/// the purge takes with it.
#[test]
fn a_purged_tombstone_takes_the_copies_of_every_generation_s_manifest_with_it() {
    let e = without_late_grace(&expiring_policy("10d"));
    e.engine.append("r", vec![record("2024-03-01T01:00:00Z", "a", r#"{"n":1}"#)]).unwrap();
    e.pass(); // plan
    e.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    // Two late records, two more generations.
    for (n, sort_key) in ["b", "c"].iter().enumerate() {
        e.engine.append("r", vec![record("2024-03-01T02:00:00Z", sort_key, &format!(r#"{{"late":{n}}}"#))]).unwrap();
        assert_eq!(e.pass().archived, 1);
    }
    let store = e.engine.store().clone();
    let id = store.buckets("r", None).unwrap()[0].id.clone();
    let recorded = |id| store.snapshot().unwrap().manifests_of(id).unwrap().len();
    assert_eq!(recorded(&id), 1, "each cleanup drops the copy of the archive it replaced");

    e.clock.set(t("2024-03-20T00:00:00Z"));
    assert_eq!(e.pass().expired, 1);
    assert_eq!(recorded(&id), 1, "the tombstone's replay period keeps it");
    e.clock.advance(frostline::settings::TOMBSTONE_RETENTION_SECONDS_DEFAULT as i64 * 1_000_000 + DAY_US);
    let report = e.pass();
    assert_eq!(report.tombstones_purged, 1, "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(recorded(&id), 0, "the purge took every generation's manifest");
    let meta = store.bucket(&id).unwrap().unwrap();
    assert_eq!(meta.state, BucketState::Expired, "the row stays");

    // Queries still say the range expired, appends for it are refused, and the next passes
    // (their sweeps) find nothing amiss.
    let page = e.first_page("r");
    assert!(page.records.is_empty());
    assert_eq!(page.expired.len(), 1);
    let refused = e.engine.append("r", vec![record("2024-03-01T04:00:00Z", "d", "{}")]);
    assert!(matches!(refused, Err(Error::BucketExpired { .. })), "{refused:?}");
    let report = e.pass();
    assert!(report.errors.is_empty(), "{report:?}");
    assert!(e.engine.store().tally_differences().unwrap().is_empty());
}

/// A query reads a published bucket's segments from the store's copy of its manifest only while
/// that copy is of the generation the bucket's manifest key names. A store whose copy is of
/// another generation (a file edited by hand, a bug) makes the page read the published manifest
/// from the target, so it still holds the late record, instead of the replaced generation's
/// records alone.
#[test]
fn a_query_reads_the_published_manifest_from_the_target_when_the_store_s_copy_is_of_another_generation() {
    use redb::{ReadableDatabase as _, ReadableTable as _, ReadableTableMetadata as _};
    let e = without_late_grace(&expiring_policy("3650d"));
    let first = record("2024-03-01T01:00:00Z", "a", r#"{"n":1}"#);
    e.engine.append("r", vec![first.clone()]).unwrap();
    e.pass(); // plan
    e.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    let id = e.engine.store().buckets("r", None).unwrap()[0].id.clone();
    let first_key = e.engine.store().bucket(&id).unwrap().unwrap().manifest_key.unwrap();
    let late = record("2024-03-01T02:00:00Z", "b", "{}");
    e.engine.append("r", vec![late.clone()]).unwrap();
    assert_eq!(e.pass().archived, 1, "the next generation");
    let expected = vec![first, late];
    assert_eq!(e.query_all("r"), expected);

    // The store's copy is replaced by the first generation's manifest (still on the target:
    // the sweep's grace keeps its objects).
    let replaced = runtime().block_on(frostline::format::reader::read_manifest(e.backend("r").as_ref(), &first_key));
    let replaced = frostline::store::schema::encode_value(&replaced.unwrap()).unwrap();
    let data = e.data_dir();
    let e = e
        .stopped_while(|| {
            let db = redb::Database::open(data.join("hot.redb")).unwrap();
            let newest = {
                let read = db.begin_read().unwrap();
                let manifests = read.open_table(frostline::store::schema::MANIFESTS).unwrap();
                assert_eq!(manifests.len().unwrap(), 1, "one copy: the published manifest's");
                manifests.last().unwrap().unwrap().0.value().to_vec()
            };
            let write = db.begin_write().unwrap();
            write
                .open_table(frostline::store::schema::MANIFESTS)
                .unwrap()
                .insert(newest.as_slice(), replaced.as_slice())
                .unwrap();
            write.commit().unwrap();
        })
        .unwrap();
    assert_eq!(e.query_all("r"), expected, "the published generation is read, from the target");
}

/// The full orphan sweep deletes a replaced generation written to the table's previous target:
/// the generation's manifest copy was dropped when its objects were released, and the released
/// keys alone say where they lie.
#[test]
fn the_full_sweep_deletes_a_replaced_generation_on_the_tables_previous_target() {
    let (_t2, on_default, on_t2) = policies_moving_to_t2(&expiring_policy("3650d"));
    let mut e = TestEngine::new(&on_default, "2024-03-01T12:00:00Z");
    let first = record("2024-03-01T01:00:00Z", "a", r#"{"n":1}"#);
    e.engine.append("r", vec![first.clone()]).unwrap();
    e.pass(); // plan
    e.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    let on_first: Vec<String> = objects(&e).into_iter().filter(|k| !k.contains("/_catalogs/")).collect();
    assert_eq!(on_first.len(), 2, "a segment and a manifest: {on_first:?}");
    std::fs::write(e.policies_dir().join("tables.toml"), &on_t2).unwrap();
    e = e.restart().unwrap();
    let late = record("2024-03-01T02:00:00Z", "b", "{}");
    e.engine.append("r", vec![late.clone()]).unwrap();
    e.clock.advance(LATE_GRACE_US);
    assert_eq!(e.pass().archived, 1, "the second generation, on t2");
    let id = e.engine.store().buckets("r", None).unwrap()[0].id.clone();
    assert_eq!(e.engine.store().snapshot().unwrap().manifests_of(&id).unwrap().len(), 1);

    e.clock.set(frostline::clock::SystemClock.now() + 2 * DAY_US);
    let swept = runtime().block_on(frostline::archive::sweep::sweep(&e.engine.context(), false)).unwrap();
    assert_eq!(swept.deleted, 2, "{swept:?}");
    let old_target = e.data_dir().join("archive");
    for key in &on_first {
        assert!(!old_target.join(key).exists(), "`{key}` is left on the previous target");
    }
    assert_eq!(e.query_all("r"), vec![first, late]);
}

//! `frostline adopt`: a data directory rebuilt from nothing, or restored from a backup while
//! its other copy went on archiving, takes in the archives on its tables' targets, verified
//! whole, and reads, verifies and expires them as its own; an archive it cannot stand behind
//! is left alone and named.

use std::sync::Arc;
use std::time::Duration;

use frostline::archive::adopt::{AdoptReport, adopt};
use frostline::engine::Engine;
use frostline::model::Record;
use frostline::ops::reload::reload;
use frostline::settings::Settings;
use frostline::storage::faults::{Fault, FaultyBackend, Op};

use crate::replan::{
    Site, backed_up_after_archiving, copy_dir, files_under, moved_policy, record, restored_copy, restored_copy_of,
};
use crate::support::*;

fn adopt_now(engine: &Arc<Engine>, dry_run: bool) -> AdoptReport {
    adopt_from(engine, dry_run, &[])
}

fn adopt_from(engine: &Arc<Engine>, dry_run: bool, lost: &[&str]) -> AdoptReport {
    let lost: Vec<String> = lost.iter().map(|id| id.to_string()).collect();
    runtime().block_on(adopt(&engine.context(), dry_run, &lost)).unwrap_or_else(|e| panic!("{e}"))
}

fn sweep(engine: &Arc<Engine>) -> frostline::Result<frostline::archive::sweep::SweepReport> {
    runtime().block_on(frostline::archive::sweep::sweep(&engine.context(), false))
}

/// Regression: a data directory rebuilt from nothing never read its tables' archives again
/// (there was no way to take them in), so they could be neither queried nor expired.
#[test]
fn a_rebuilt_data_directory_adopts_the_archives_of_the_lost_one_on_every_target() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let site = Site::new(&moved_policy(&[a.path(), b.path()], "t0"), "2024-03-01T12:00:00Z");
    let engine = site.open(Settings::default());
    let written = vec![
        record("p", "2024-03-01T01:00:00Z", Some("invoice")),
        record("q", "2024-03-01T02:00:00Z", None),
        record("p", "2024-03-02T01:00:00Z", None),
    ];
    engine.append("r", written[..2].to_vec()).unwrap();
    site.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(run_pass(&engine).archived, 2);
    // The table moves; its next archive lies on the other target.
    site.write_policy(&moved_policy(&[a.path(), b.path()], "t1"));
    assert!(reload(&engine, "test").accepted);
    engine.append("r", written[2..].to_vec()).unwrap();
    site.clock.set(t("2024-03-04T00:00:00Z"));
    assert_eq!(run_pass(&engine).archived, 1);
    let lost = engine.installation_id().to_string();
    drop(engine);
    let archived = (files_under(a.path()), files_under(b.path()));
    assert_eq!((archived.0.len(), archived.1.len()), (4, 2));

    // The data directory is lost; a new one starts on the same policy directory.
    std::fs::remove_dir_all(site.data()).unwrap();
    let engine = site.open(Settings::default());
    assert!(query_engine(&engine, "r").is_empty());
    // Another installation's archives are taken in only when it is named (a lost one).
    let unnamed = adopt_now(&engine, true);
    assert_eq!(unnamed.adopted, 0, "{unnamed:?}");
    assert_eq!(unnamed.other_installations.iter().collect::<Vec<_>>(), vec![&lost], "{unnamed:?}");
    let preview = adopt_from(&engine, true, &[&lost]);
    assert_eq!((preview.adopted, preview.rows), (3, 3), "{preview:?}");
    assert!(query_engine(&engine, "r").is_empty(), "a dry run records nothing");

    let report = adopt_from(&engine, false, &[&lost]);
    assert_eq!((report.adopted, report.rows, report.known), (3, 3, 0), "{report:?}");
    assert!(report.conflicts.is_empty() && report.failures.is_empty(), "{report:?}");
    let mut read = query_engine(&engine, "r");
    read.sort_by_key(|r| r.event_time);
    assert_eq!(read, written);
    let verdicts =
        runtime().block_on(frostline::archive::verify::verify(&engine.context(), None, None, |_| {})).unwrap();
    assert_eq!(verdicts.len(), 3);
    assert!(verdicts.iter().all(|v| v.ok), "{verdicts:?}");
    let again = adopt_from(&engine, false, &[&lost]);
    assert_eq!((again.adopted, again.known), (0, 3), "adoption is idempotent: {again:?}");

    // The new installation never sweeps what another wrote ...
    let swept = sweep(&engine).unwrap();
    assert_eq!(swept.deleted, 0, "{swept:?}");
    assert_eq!((files_under(a.path()), files_under(b.path())), archived);
    // ... but adopted archives are its own to expire, each on the target it lies on.
    site.clock.set(t("2024-04-01T00:00:00Z"));
    let expired = run_pass(&engine).expired + run_pass(&engine).expired;
    assert_eq!(expired, 3);
    assert!(files_under(a.path()).is_empty() && files_under(b.path()).is_empty());
}

/// An archive whose segment no longer matches its manifest is never adopted; the report names
/// it and the command fails.
#[test]
fn an_archive_that_fails_verification_is_never_adopted() {
    let shared = tempfile::tempdir().unwrap();
    let site = Site::new(&moved_policy(&[shared.path()], "t0"), "2024-03-01T12:00:00Z");
    let engine = site.open(Settings::default());
    engine.append("r", vec![record("p", "2024-03-01T01:00:00Z", None)]).unwrap();
    site.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(run_pass(&engine).archived, 1);
    let lost = engine.installation_id().to_string();
    drop(engine);
    let segment = files_under(shared.path()).into_iter().find(|f| f.to_string_lossy().contains("/seg-")).unwrap();
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&segment, bytes).unwrap();

    std::fs::remove_dir_all(site.data()).unwrap();
    let engine = site.open(Settings::default());
    let report = adopt_from(&engine, false, &[&lost]);
    assert_eq!(report.adopted, 0, "{report:?}");
    assert_eq!(report.failures.len(), 1, "{report:?}");
    assert!(report.failures[0].contains("manifest-") && report.failures[0].contains("sha256"), "{report:?}");
    assert!(engine.store().buckets("r", None).unwrap().is_empty());
}

/// Regression: a data directory restored from a backup could only stop its sweep (another
/// copy's archives look like its own orphans); nothing resolved it. Adoption takes the later
/// archive in, releasing the hot rows it holds, and the sweep runs again.
#[test]
fn a_restored_data_directory_adopts_what_its_other_copy_archived_and_sweeps_again() {
    let shared = tempfile::tempdir().unwrap();
    let (site, backup) = restored_copy(shared.path());
    let archived = files_under(shared.path());
    site.clock.set(t("2024-03-05T00:00:00Z"));
    let restored = Engine::open(&backup, &site.policies(), Settings::default(), site.clock.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(sweep(&restored).is_err(), "the sweep's guard stops it first");

    let report = adopt_now(&restored, false);
    assert_eq!((report.adopted, report.hot_rows_released), (1, 1), "{report:?}");
    assert!(report.conflicts.is_empty(), "{report:?}");
    assert_eq!(
        restored.store().buckets("r", None).unwrap()[0].state,
        frostline::model::BucketState::Archived { hot_deleted: true }
    );
    assert_eq!(query_engine(&restored, "r"), vec![record("p", "2024-03-01T01:00:00Z", None)]);
    let swept = sweep(&restored).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(swept.deleted, 0, "{swept:?}");
    assert_eq!(files_under(shared.path()), archived);
}

/// Adopting what another copy of the data directory archived resolves that copy: the sweep no
/// longer stops on its epoch, and still keeps what it left unreferenced (nothing proves this
/// directory wrote it). Before, a leftover object of the other copy stopped every later sweep.
#[test]
fn after_adopting_the_other_copys_archives_the_sweep_runs_again_and_keeps_its_leftovers() {
    let shared = tempfile::tempdir().unwrap();
    let (site, backup) = restored_copy(shared.path());
    // A leftover of the copy that went on: an object of its epoch that nothing references.
    let segment = files_under(shared.path()).into_iter().find(|f| f.to_string_lossy().contains("/seg-")).unwrap();
    let name = segment.file_name().unwrap().to_string_lossy().to_string();
    let leftover = segment.with_file_name(name.replacen("-00000-", "-00007-", 1));
    std::fs::copy(&segment, &leftover).unwrap();
    site.clock.set(t("2030-01-01T00:00:00Z"));
    let restored = Engine::open(&backup, &site.policies(), Settings::default(), site.clock.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(sweep(&restored).is_err(), "the other copy's epoch stops the sweep");
    let report = adopt_now(&restored, false);
    assert_eq!(report.adopted, 1, "{report:?}");
    let swept = sweep(&restored).unwrap_or_else(|e| panic!("the sweep still stops after the adoption: {e}"));
    assert_eq!((swept.deleted, swept.unproven), (0, 1), "{swept:?}");
    assert!(leftover.exists() && segment.exists());
    assert!(frostline::ops::status::collect(&restored).unwrap().sweep_stopped.is_none(), "the stop is cleared");
}

/// Regression: a data directory restored from a backup records archives its other copy has
/// expired since, and every query of the table failed on the missing manifest (a "data
/// corruption" error) for good. Adoption now finds the manifest gone from its target and
/// records the bucket as expired, saying so, and the query reports the range as expired.
#[test]
fn a_restored_copy_records_the_archives_its_other_copy_expired_as_expired() {
    let shared = tempfile::tempdir().unwrap();
    let partition = "site 7/α%=b";
    let (site, backup) = backed_up_after_archiving(&moved_policy(&[shared.path()], "t0"), partition);
    // The copy that went on expires the archive (expire_after = 10d).
    let engine = site.open(Settings::default());
    site.clock.set(t("2024-03-20T00:00:00Z"));
    let expired: u64 = (0..3).map(|_| run_pass(&engine).expired).sum();
    assert_eq!(expired, 1);
    drop(engine);
    assert!(files_under(shared.path()).is_empty(), "the archive is gone");

    let restored = Engine::open(&backup, &site.policies(), Settings::default(), site.clock.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let read = |engine: &Arc<Engine>| {
        let request = frostline::query::QueryRequest { table: "r".into(), ..Default::default() };
        runtime().block_on(frostline::query::query(&engine.context(), request))
    };
    let failed = read(&restored).expect_err("before adopting, the restored copy reads a manifest that is gone");
    assert!(failed.to_string().contains("is missing"), "{failed}");

    let report = adopt_now(&restored, true);
    assert_eq!(report.gone.len(), 1, "a dry run names it: {report:?}");
    assert!(read(&restored).is_err(), "a dry run changes nothing");
    let report = adopt_now(&restored, false);
    assert!(report.conflicts.is_empty() && report.failures.is_empty(), "{report:?}");
    assert_eq!(report.gone.len(), 1, "{report:?}");
    assert!(report.gone[0].contains("manifest-"), "{report:?}");
    let meta = &restored.store().buckets("r", None).unwrap()[0];
    assert_eq!(meta.state, frostline::model::BucketState::Expired);
    let tombstone = restored.store().tombstone(&meta.id).unwrap().expect("a tombstone says why");
    assert!(tombstone.completed_at.is_some() && tombstone.reason.contains("another copy"), "{tombstone:?}");
    let page = read(&restored).unwrap_or_else(|e| panic!("after adopting, the query works: {e}"));
    assert!(page.records.is_empty());
    assert_eq!(page.expired.len(), 1, "the range is reported expired: {page:?}");
    assert_eq!(page.expired[0].partition_key, partition);
    assert!(adopt_now(&restored, false).gone.is_empty(), "adopting again finds nothing new");
}

/// Regression: a restored copy that archived a bucket again before its operator adopted kept
/// the other copy's archive of it (rightly) but its sweep stopped on that archive's epoch for
/// good, since only the epochs of adopted archives were recorded. Adopting now resolves every
/// epoch of this installation it finds; the sweep runs again and still keeps the other archive.
#[test]
fn a_restored_copy_that_archived_a_bucket_again_sweeps_again_after_adopting_and_keeps_the_other_archive() {
    let shared = tempfile::tempdir().unwrap();
    let (site, backup) = restored_copy(shared.path());
    let theirs = files_under(shared.path());
    let restored = Engine::open(&backup, &site.policies(), Settings::default(), site.clock.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(run_pass(&restored).archived, 1, "the restored copy archives the bucket itself");
    assert!(sweep(&restored).is_err(), "the other copy's epoch stops the sweep");

    let report = adopt_now(&restored, false);
    assert_eq!((report.adopted, report.known), (0, 1), "its own archive, written last, comes first: {report:?}");
    let swept = sweep(&restored).unwrap_or_else(|e| panic!("the sweep still stops after adopting: {e}"));
    assert_eq!(swept.deleted, 0, "{swept:?}");
    for file in &theirs {
        assert!(file.exists(), "the other copy's {} was deleted", file.display());
    }
    assert_eq!(query_engine(&restored, "r"), vec![record("p", "2024-03-01T01:00:00Z", None)]);
}

/// A data directory restored from a backup taken before its one bucket was archived by the copy
/// that went on (`restored_copy`), open, with a row appended after the copies parted.
fn restored_with_a_late_row(shared: &std::path::Path) -> (Site, Arc<Engine>, Record) {
    let (site, backup) = restored_copy(shared);
    let restored = Engine::open(&backup, &site.policies(), Settings::default(), site.clock.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let late = record("p", "2024-03-01T05:00:00Z", None);
    restored.append("r", vec![late.clone()]).unwrap();
    (site, restored, late)
}

/// A restored copy that took appends after the copies parted holds rows the other copy's
/// archive lacks: adoption takes the archive, releases the hot row it holds and keeps the one
/// it lacks beside it, so nothing is lost and the next generation holds both.
#[test]
fn adoption_never_releases_a_hot_row_the_archive_lacks() {
    let shared = tempfile::tempdir().unwrap();
    let (site, restored, late) = restored_with_a_late_row(shared.path());

    let report = adopt_now(&restored, false);
    assert_eq!((report.adopted, report.hot_rows_released), (1, 1), "{report:?}");
    assert!(report.conflicts.is_empty() && report.gone.is_empty(), "{report:?}");
    let meta = &restored.store().buckets("r", None).unwrap()[0];
    assert_eq!(meta.state, frostline::model::BucketState::ArchivedPending, "the late row waits beside the archive");
    let expected = vec![record("p", "2024-03-01T01:00:00Z", None), late];
    let read = |engine: &Arc<Engine>| {
        let mut read = query_engine(engine, "r");
        read.sort_by_key(|r| r.event_time);
        read
    };
    assert_eq!(read(&restored), expected);
    site.clock.set(t("2024-03-05T00:00:00Z"));
    assert_eq!(run_pass(&restored).archived, 1, "the next generation holds both");
    assert_eq!(read(&restored), expected);
}

/// Adoption learns how the archive holds the bucket's hot rows before its transaction, reading
/// again the segments that can hold them: a hot row appended in between (an engine left running
/// on the data directory) could be released unread or kept unmatched, so the bucket is named
/// as a conflict and nothing changes; adopted again with nothing appending, every row is kept.
#[test]
fn a_hot_row_appended_while_adoption_reads_the_archive_leaves_the_bucket_for_the_next_run() {
    let shared = tempfile::tempdir().unwrap();
    let (_site, restored, late) = restored_with_a_late_row(shared.path());
    // The first read of the archive's segment verifies it; the second, which matches the hot
    // rows, waits while another row is appended (3 s: an append takes milliseconds, but the
    // test machines are loaded).
    let current = restored.policies();
    let mut tables = current.tables.clone();
    let faulty = FaultyBackend::new(tables["r"].backend.clone());
    faulty.add(Op::Get, "seg-", Fault::Delay(Duration::ZERO), Some(1));
    faulty.add(Op::Get, "seg-", Fault::Delay(Duration::from_secs(3)), Some(1));
    let table = frostline::policy::TablePolicy { backend: faulty.clone(), ..(*tables["r"]).clone() };
    tables.insert("r".into(), Arc::new(table));
    restored.install_policies(frostline::policy::PolicySet { tables, ..(*current).clone() }).unwrap();
    let adoption = std::thread::spawn({
        let restored = restored.clone();
        move || adopt_now(&restored, false)
    });
    while faulty.fired().len() < 2 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let later = record("p", "2024-03-01T06:00:00Z", None);
    restored.append("r", vec![later.clone()]).unwrap();
    let report = adoption.join().unwrap();
    assert_eq!((report.adopted, report.hot_rows_released), (0, 0), "{report:?}");
    assert!(report.conflicts.iter().any(|c| c.contains("took hot rows after its archive")), "{report:?}");
    let meta = &restored.store().buckets("r", None).unwrap()[0];
    assert_eq!((meta.state, meta.row_count), (frostline::model::BucketState::Hot, 3), "nothing changed");

    let report = adopt_now(&restored, false);
    assert_eq!((report.adopted, report.hot_rows_released), (1, 1), "{report:?}");
    let mut read = query_engine(&restored, "r");
    read.sort_by_key(|r| r.event_time);
    assert_eq!(read, vec![record("p", "2024-03-01T01:00:00Z", None), late, later]);
}

/// Regression (found by the lifecycle simulation at 0a4a692, seed 9140057477744648234): an
/// adoption that kept a hot row the archive lacks took the bucket's retention facts from the
/// archive alone, so an `invoice` appended to a restored copy beside the other copy's archived
/// `debug` record left the bucket planned as all-`debug`, and its expiry deleted the invoice,
/// which no policy expires. The kept rows' kinds and tenants now count.
#[test]
fn adoption_that_keeps_a_hot_row_counts_its_kind_in_the_buckets_retention() {
    let shared = tempfile::tempdir().unwrap();
    let policy = moved_policy(&[shared.path()], "t0")
        .replace(r#"expire_after = "10d""#, r#"expire_after = "1000d", kinds = { debug = { expire_after = "2d" } }"#);
    let (site, backup) = restored_copy_of(&policy, record(USER_KEYS[1], "2024-03-01T01:00:00Z", Some("debug")));
    let restored = Engine::open(&backup, &site.policies(), Settings::default(), site.clock.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    restored.append("r", vec![record(USER_KEYS[1], "2024-03-01T05:00:00Z", Some("invoice"))]).unwrap();
    let report = adopt_now(&restored, false);
    assert_eq!((report.adopted, report.hot_rows_released), (1, 1), "{report:?}");
    let meta = &restored.store().buckets("r", None).unwrap()[0];
    assert_eq!(meta.kind, frostline::store::schema::Shared::Mixed, "the kept invoice counts: {meta:?}");

    // Long past the debug records' expiry, long before the invoice's: the bucket's next
    // generation is published and nothing expires.
    site.clock.set(t("2024-03-20T00:00:00Z"));
    for _ in 0..3 {
        let report = run_pass(&restored);
        assert!(report.errors.is_empty(), "{report:?}");
    }
    let read = query_engine(&restored, "r");
    assert_eq!(read.len(), 2, "the archived debug record and the kept invoice: {read:?}");
}

/// Regression (the crash harness's fleet mode, 1,000 kills at 0a4a692, crash 628): a data
/// directory backed up after a bucket's archive was published and before its hot rows were
/// cleaned up, restored after the copy that went on cleaned up and expired that archive.
/// Adoption left the bucket as a conflict ("gone, but its hot rows are not yet deleted"), so it
/// stayed published under a manifest that is gone: its reads failed for good. It is recorded
/// as expired by the other copy now, its hot rows going with it, as the rows beside any archive
/// the other copy expired do.
#[test]
fn a_restored_copy_whose_cleanup_was_pending_records_the_archive_the_other_copy_expired() {
    let shared = tempfile::tempdir().unwrap();
    let site = Site::new(&moved_policy(&[shared.path()], "t0"), "2024-03-01T12:00:00Z");
    let engine = site.open(Settings::default());
    engine.append("r", vec![record(USER_KEYS[1], "2024-03-01T01:00:00Z", None)]).unwrap();
    drop(engine);
    let backup = site.root.path().join("backup");
    copy_dir(&site.data(), &backup);
    // Planned (not yet due) in the backup, as in the original.
    let restored = Engine::open(&backup, &site.policies(), Settings::default(), site.clock.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(run_pass(&restored).archived, 0);
    drop(restored);
    let engine = site.open(Settings::default());
    site.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(run_pass(&engine).archived, 1);
    let (meta, manifest) = engine.store().published("r").unwrap().remove(0);
    let key = meta.manifest_key.clone().unwrap();

    // The backup as it would be had it been taken between publication and cleanup: the same
    // claim (generation 1) and publication, the hot row still there.
    let restored = Engine::open(&backup, &site.policies(), Settings::default(), site.clock.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let now = t("2024-03-03T00:00:00Z");
    let claimed = restored.store().claim(meta.id.clone(), "w".into(), now, 1).unwrap().expect("due");
    assert_eq!(claimed.generation, manifest.generation);
    let publication = frostline::store::Publication::new(manifest, key.clone());
    restored.store().publish(meta.id.clone(), "w".into(), claimed.generation, now, publication).unwrap();
    drop(restored);

    // The copy that went on expires the archive and deletes its objects.
    site.clock.set(t("2024-03-20T00:00:00Z"));
    for _ in 0..3 {
        run_pass(&engine);
    }
    assert_eq!(engine.store().buckets("r", None).unwrap()[0].state, frostline::model::BucketState::Expired);
    assert!(files_under(shared.path()).iter().all(|f| !f.to_string_lossy().contains("manifest-")), "expired");
    drop(engine);

    let restored = Engine::open(&backup, &site.policies(), Settings::default(), site.clock.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let report = adopt_now(&restored, false);
    assert!(report.conflicts.is_empty(), "{report:?}");
    assert_eq!(report.gone.len(), 1, "{report:?}");
    let meta = &restored.store().buckets("r", None).unwrap()[0];
    assert_eq!(meta.state, frostline::model::BucketState::Expired, "{meta:?}");
    assert!(query_engine(&restored, "r").is_empty(), "the range reads as expired");
    assert!(run_pass(&restored).errors.is_empty());
}

/// Regression (issue: `adopt` takes in a live peer's archives on a shared target): outside
/// Delta tables another installation's archives were adopted whenever the bucket was unknown,
/// so the adopter's retention expired a live peer's objects; and two hosts that both adopted a
/// lost installation both answered for its archives. Now another installation is adopted from
/// only when named, and only by the one host that claims it on the target.
#[test]
fn adoption_beside_a_live_peer_takes_nothing_of_its_and_one_host_answers_for_a_lost_one() {
    let shared = tempfile::tempdir().unwrap();
    let policy = moved_policy(&[shared.path()], "t0");
    let peer = Site::new(&policy, "2024-03-01T12:00:00Z");
    let peer_engine = peer.open(Settings::default());
    peer_engine.append("r", vec![record("site-a/sensor 0", "2024-03-01T01:00:00Z", None)]).unwrap();
    peer.clock.set(t("2024-03-03T00:00:00Z"));
    assert_eq!(run_pass(&peer_engine).archived, 1);
    let peer_id = peer_engine.installation_id().to_string();
    let archived = files_under(shared.path());

    // A host beside the live peer: nothing of the peer's is adopted, the peer is named.
    let (first, second) = (Site::new(&policy, "2024-03-05T00:00:00Z"), Site::new(&policy, "2024-03-05T00:00:00Z"));
    let (one, two) = (first.open(Settings::default()), second.open(Settings::default()));
    let report = adopt_now(&one, false);
    assert_eq!(report.adopted, 0, "{report:?}");
    assert!(report.other_installations.contains(&peer_id), "{report:?}");
    assert!(one.store().buckets("r", None).unwrap().is_empty());

    // The peer is lost; the first host adopts it, and the second host cannot adopt it too.
    drop(peer_engine);
    let report = adopt_from(&one, false, &[&peer_id]);
    assert_eq!((report.adopted, report.rows), (1, 1), "{report:?}");
    let refused = adopt_from(&two, false, &[&peer_id]);
    assert_eq!(refused.adopted, 0, "{refused:?}");
    assert!(
        refused.conflicts.iter().any(|c| c.contains("claimed by installation") && c.contains(one.installation_id())),
        "{refused:?}"
    );
    assert!(adopt_from(&two, true, &[&peer_id]).adopted == 0, "a dry run sees the claim too");
    // Once the first host is named as lost as well, the second takes over.
    let report = adopt_from(&two, false, &[&peer_id, one.installation_id()]);
    assert_eq!(report.adopted, 1, "{report:?}");
    assert_eq!(query_engine(&two, "r").len(), 1);
    assert_eq!(files_under(shared.path()), archived, "nothing was deleted");
}

/// Adoption reads an archive a segment at a time (issue 34: "`verify` and `adopt` stream"): it
/// held every row of the archive it verified, so a data directory rebuilt on a host with less
/// memory than its largest bucket could not take that bucket in. Adopting a bucket of 72 MiB
/// of bodies, beside hot rows of the rebuilt data directory that the archive holds (released)
/// and lacks (kept), must peak less than 24 MiB higher than adopting one of 8 MiB. Each
/// adoption runs in a process of its own (this test, run again with `FROSTLINE_ADOPT_SITE`),
/// whose peak resident set (`VmHWM`) it reports.
#[test]
fn adoption_reads_an_archive_a_segment_at_a_time() {
    const NAME: &str = "adopt::adoption_reads_an_archive_a_segment_at_a_time";
    const NOW: &str = "2024-03-05T00:00:00Z";
    let partition = format!("{} = 50% ü/x", USER_KEYS[0]);
    let written = |i: usize| {
        // 64 KiB of varied text: compression keeps no segment small that the rows are not.
        let mut state = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let blob: String = (0..64 * 1024)
            .map(|_| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                char::from(b"0123456789abcdef"[(state >> 60) as usize])
            })
            .collect();
        Record {
            partition_key: partition.clone().into_bytes(),
            event_time: t("2024-03-01T00:00:00Z") + i as i64 * 1_000_000,
            sort_key: format!("k/{i:05} %=").into_bytes(),
            tenant: Some("tenant-a".into()),
            kind: None,
            body: format!(r#"{{"i":{i},"blob":"{blob}"}}"#),
        }
    };
    if let Ok(root) = std::env::var("FROSTLINE_ADOPT_SITE") {
        let records: usize = std::env::var("FROSTLINE_ADOPT_RECORDS").unwrap().parse().unwrap();
        let lost = std::env::var("FROSTLINE_ADOPT_LOST").unwrap();
        let root = std::path::Path::new(&root);
        let clock = frostline::clock::ManualClock::new(t(NOW));
        let engine = Engine::open(&root.join("data"), &root.join("policies"), Settings::default(), clock)
            .unwrap_or_else(|e| panic!("{e}"));
        let report = adopt_from(&engine, false, &[&lost]);
        assert_eq!((report.adopted, report.rows, report.hot_rows_released), (1, records as u64, 2), "{report:?}");
        assert!(report.conflicts.is_empty() && report.failures.is_empty(), "{report:?}");
        // The peak of the adoption, before the query below reads the bucket back whole.
        print_peak();
        let meta = &engine.store().buckets("r", None).unwrap()[0];
        assert_eq!(meta.state, frostline::model::BucketState::ArchivedPending, "the row it lacks waits beside it");
        assert_eq!(meta.row_count, records as u64 + 1, "{meta:?}");
        let mut read = query_engine(&engine, "r");
        read.sort_by_key(|r| r.event_time);
        assert_eq!(read.len(), records + 1);
        assert!(read[..records].iter().enumerate().all(|(i, r)| *r == written(i)), "the archive reads back whole");
        return;
    }
    let peak_kib = |records: usize| -> f64 {
        let cold = tempfile::tempdir().unwrap();
        let site = Site::new(&moved_policy(&[cold.path()], "t0"), "2024-03-01T12:00:00Z");
        let engine = site.open(Settings::default());
        for batch in (0..records).collect::<Vec<_>>().chunks(64) {
            engine.append("r", batch.iter().map(|i| written(*i)).collect()).unwrap();
        }
        site.clock.set(t(NOW));
        assert_eq!(run_pass(&engine).archived, 1);
        let lost = engine.installation_id().to_string();
        drop(engine);
        // The data directory is lost; the new one has taken two records the archive holds and
        // one it lacks before the operator adopts.
        std::fs::remove_dir_all(site.data()).unwrap();
        let engine = site.open(Settings::default());
        let mut new = written(records);
        new.sort_key = b"k/new".to_vec();
        engine.append("r", vec![written(0), written(1), new]).unwrap();
        drop(engine);
        let site_root = site.root.path().to_string_lossy().into_owned();
        peak_kib_of(
            NAME,
            &[
                ("FROSTLINE_ADOPT_SITE", site_root),
                ("FROSTLINE_ADOPT_RECORDS", records.to_string()),
                ("FROSTLINE_ADOPT_LOST", lost),
            ],
        )
    };
    let (small, large) = (peak_kib(128), peak_kib(1_152));
    let grown_mib = (large - small) / 1024.0;
    println!("adoption peaks: {small} KiB (8 MiB of bodies), {large} KiB (72 MiB)");
    assert!(grown_mib < 24.0, "peaks {small} and {large} KiB: {grown_mib:.1} MiB more for 64 MiB more of bodies");
}

/// One of a vast number of a lost host's manifests listed beside the table's real archive
/// (`PaddedListing`): a thousand to a folder, as its years of day buckets would be.
fn lost_hosts_manifest(n: usize) -> frostline::storage::ObjectInfo {
    use frostline::storage::keys;
    let folder = keys::bucket_prefix("r", &format!("day:{}", n / 1_000), "p/ü %=".as_bytes());
    frostline::storage::ObjectInfo {
        key: keys::manifest_key(&folder, "lost-host", (n % 1_000 + 1) as u64, &"ab".repeat(32)),
        size: 2_000,
        last_modified: 0,
    }
}

/// Adoption's memory follows a page of folders, not the target (issue 34: "`adopt` streams"):
/// it held every manifest a table's listings named, by folder, and the keys of every archive the
/// database records. Over 300,000 more listed manifests its process must peak less than 24 MiB
/// higher than over 1,000. Each adoption runs in a process of its own (this test, run again with
/// `FROSTLINE_ADOPT_MANIFESTS`), whose peak resident set (`VmHWM`) it reports.
#[test]
fn adoptions_memory_does_not_grow_with_the_manifests_it_lists() {
    const NAME: &str = "adopt::adoptions_memory_does_not_grow_with_the_manifests_it_lists";
    if let Some(manifests) = std::env::var("FROSTLINE_ADOPT_MANIFESTS").ok().and_then(|n| n.parse::<usize>().ok()) {
        let cold = tempfile::tempdir().unwrap();
        let site = Site::new(&moved_policy(&[cold.path()], "t0"), "2024-03-01T12:00:00Z");
        let engine = site.open(Settings::default());
        engine.append("r", vec![record(USER_KEYS[1], "2024-03-01T01:00:00Z", None)]).unwrap();
        site.clock.set(t("2024-03-03T00:00:00Z"));
        assert_eq!(run_pass(&engine).archived, 1);
        let current = engine.policies();
        let mut tables = current.tables.clone();
        let inner = tables["r"].backend.clone();
        let padded = Arc::new(PaddedListing { inner, prefix: "table=r/", count: manifests, make: lost_hosts_manifest });
        let table = frostline::policy::TablePolicy { backend: padded, ..(*tables["r"]).clone() };
        tables.insert("r".into(), Arc::new(table));
        engine.install_policies(frostline::policy::PolicySet { tables, ..(*current).clone() }).unwrap();
        let report = adopt_now(&engine, false);
        assert_eq!((report.known, report.adopted, report.folders), (1, 0, 1 + manifests as u64 / 1_000), "{report:?}");
        assert_eq!(report.other_installations.iter().collect::<Vec<_>>(), vec!["lost-host"], "{report:?}");
        assert!(report.gone.is_empty() && report.conflicts.is_empty(), "{report:?}");
        print_peak();
        return;
    }
    let peak_kib = |manifests: usize| peak_kib_of(NAME, &[("FROSTLINE_ADOPT_MANIFESTS", manifests.to_string())]);
    let (small, large) = (peak_kib(1_000), peak_kib(301_000));
    let grown_mib = (large - small) / 1024.0;
    println!("adoption peaks: {small} KiB (1,000 manifests listed), {large} KiB (301,000)");
    assert!(grown_mib < 24.0, "peaks {small} and {large} KiB: {grown_mib:.1} MiB more for 300,000 more manifests");
}

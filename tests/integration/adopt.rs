//! `frostline adopt`: a data directory rebuilt from nothing, or restored from a backup while
//! its other copy went on archiving, takes in the archives on its tables' targets, verified
//! whole, and reads, verifies and expires them as its own; an archive it cannot stand behind
//! is left alone and named.

use std::sync::Arc;

use frostline::archive::adopt::{AdoptReport, adopt};
use frostline::engine::Engine;
use frostline::ops::reload::reload;
use frostline::settings::Settings;

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

/// A restored copy that took appends after the copies parted holds rows the other copy's
/// archive lacks: adoption takes the archive, releases the hot row it holds and keeps the one
/// it lacks beside it, so nothing is lost and the next generation holds both.
#[test]
fn adoption_never_releases_a_hot_row_the_archive_lacks() {
    let shared = tempfile::tempdir().unwrap();
    let (site, backup) = restored_copy(shared.path());
    let restored = Engine::open(&backup, &site.policies(), Settings::default(), site.clock.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let late = record("p", "2024-03-01T05:00:00Z", None);
    restored.append("r", vec![late.clone()]).unwrap();

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

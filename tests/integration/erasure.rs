//! Erasure that reaches the archive: a durable request names records (a tenant, a partition
//! key or exact identities, within a table and a time range); the pass deletes the hot rows it
//! names, publishes each archived bucket's next generation without them, deletes the replaced
//! generations' objects at once and proves them absent by listing, and keeps a receipt. A legal
//! hold beats erasure until it is lifted.

use frostline::clock::Clock;
use frostline::model::{BucketState, Record};
use frostline::store::erasure::{ErasureProgress, ErasureRequest, ErasureSelector, RecordIdentity};

use crate::replan::expiring_policy;
use crate::support::*;

/// A partition key as users have them: a slash, a percent sign, an equals sign, a space and
/// non-ASCII text.
const PARTITION: &str = "site a/%20=ü";
/// The default ARCHIVER_LATE_GRACE_SECONDS, in microseconds.
const LATE_GRACE_US: i64 = frostline::settings::LATE_GRACE_SECONDS_DEFAULT as i64 * 1_000_000;

fn record(time: &str, sort_key: &str, tenant: &str) -> Record {
    record_in(PARTITION, time, sort_key, tenant)
}

fn record_in(partition: &str, time: &str, sort_key: &str, tenant: &str) -> Record {
    // A large body that names its tenant, so the raw bytes can be searched for.
    let body = format!("{{\"who\":\"{tenant}-{sort_key}\",\"pad\":\"{}\"}}", "x".repeat(4_000));
    Record {
        partition_key: partition.as_bytes().to_vec(),
        event_time: t(time),
        sort_key: sort_key.as_bytes().to_vec(),
        tenant: Some(tenant.into()),
        kind: None,
        body,
    }
}

fn request(selector: ErasureSelector) -> ErasureRequest {
    erasure_request(&format!("e-{:x}", rand::random::<u32>()), selector)
}

/// Every file under `dir` whose bytes hold `needle`.
fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read(&path).unwrap().windows(needle.len()).any(|w| w == needle.as_bytes()) {
                found.push(path);
            }
        }
    }
    found
}

fn target_dir(e: &TestEngine) -> std::path::PathBuf {
    let url = e.backend("r").target().to_string();
    std::path::PathBuf::from(url.strip_prefix("file://").expect("a local target"))
}

/// An engine whose one bucket (record `a` of tenant acme) is archived, backed up into `dir`.
fn archived_with_a_backup(dir: &std::path::Path) -> TestEngine {
    let e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    e.engine.append("r", vec![record("2024-03-01T01:00:00Z", "a", "acme")]).unwrap();
    e.pass();
    e.clock.set(t("2024-03-04T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    e.backup(dir).unwrap()
}

fn passes_until_finished(e: &TestEngine, id: &str) -> ErasureRequest {
    for _ in 0..6 {
        let report = e.pass();
        assert!(report.errors.is_empty(), "{report:?}");
        let request = e.engine.store().erasure(id).unwrap().unwrap();
        if !request.is_open() {
            return request;
        }
    }
    panic!("erasure {id} still open: {:?}", e.engine.store().erasure(id).unwrap());
}

#[test]
fn erasing_a_tenant_reaches_hot_rows_and_every_generation_of_its_archives() {
    let e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    let all = vec![
        record("2024-03-01T01:00:00Z", "a", "acme"),
        record("2024-03-01T02:00:00Z", "b", "globex"),
        record("2024-03-02T01:00:00Z", "c", "acme"),
        record("2024-03-02T02:00:00Z", "d", "globex"),
    ];
    e.engine.append("r", all.clone()).unwrap();
    e.pass();
    e.clock.set(t("2024-03-04T00:00:00Z"));
    assert_eq!(e.pass().archived, 2);
    // A late record makes day 1's second generation; the first is released, not yet swept.
    e.engine.append("r", vec![record("2024-03-01T03:00:00Z", "e", "acme")]).unwrap();
    e.clock.advance(LATE_GRACE_US);
    assert_eq!(e.pass().archived, 1);
    // Day 4 stays hot.
    let hot = vec![record("2024-03-04T01:00:00Z", "f", "acme"), record("2024-03-04T02:00:00Z", "g", "globex")];
    e.engine.append("r", hot.clone()).unwrap();
    let target = target_dir(&e);
    assert!(files_holding(&target, "acme-a").len() >= 2, "both generations of day 1 hold `a`");

    let selector = ErasureSelector { tenant: Some("acme".into()), ..Default::default() };
    let preview = e.engine.store().preview_erasure(&selector).unwrap();
    assert_eq!((preview.buckets, preview.hot_rows, preview.archived_buckets), (3, 1, 2), "{preview:?}");
    assert!(!files_holding(&target, "acme-a").is_empty(), "a preview changes nothing");

    let placed = e.engine.store().place_erasure(request(selector), e.clock.now()).unwrap();
    assert_eq!(placed.buckets.len(), 3);
    let receipt = passes_until_finished(&e, &placed.id);

    let globex: Vec<Record> =
        all.iter().chain(&hot).filter(|r| r.tenant.as_deref() == Some("globex")).cloned().collect();
    assert_eq!(e.query_all("r"), sorted(globex), "every other record reads back exactly");
    for needle in ["acme-a", "acme-c", "acme-e", "acme-f"] {
        assert_eq!(files_holding(&target, needle), Vec::<std::path::PathBuf>::new(), "`{needle}` on the target");
    }
    assert!(!files_holding(&target, "globex-b").is_empty());
    let erased: u64 = receipt.buckets.iter().map(|b| b.hot_rows_erased + b.archived_rows_erased).sum();
    assert_eq!(erased, 4, "{receipt:?}");
    for bucket in &receipt.buckets {
        assert_eq!(bucket.progress, ErasureProgress::Done, "{bucket:?}");
        let meta = e.engine.store().bucket(&bucket.bucket).unwrap().unwrap();
        if meta.manifest_key.is_some() {
            assert_eq!(meta.state, BucketState::Archived { hot_deleted: true });
            assert!(bucket.proved_absent_at.is_some() && !bucket.deleted_objects.is_empty(), "{bucket:?}");
            assert_eq!(bucket.manifest_key, meta.manifest_key);
            assert!(bucket.kept_unproven.is_empty(), "{bucket:?}");
        }
    }
    // Day 1's receipt names both generations it replaced.
    assert!(receipt.buckets.iter().any(|b| b.replaced_manifests.len() == 2), "{receipt:?}");
    // The buckets' counts are of the records left (status and the retention report read them).
    let counted: u64 = e.engine.store().buckets("r", None).unwrap().iter().map(|m| m.row_count).sum();
    assert_eq!(counted, 3);
    // After a restart nothing comes back.
    let e = e.restart().unwrap();
    assert_eq!(e.query_all("r").len(), 3);
}

/// Regression (the crash harness in an optimised build, crash 14 of seed 7167404510672086901):
/// the archival that erases archived records took them off the bucket's counts when it began,
/// before its generation was published. Cut off there (a failed upload, a kill), the bucket
/// counted fewer records than its published archive held, and every retry took them off again.
/// Now they come off in the publication of the generation that leaves them out, once.
#[test]
fn an_erasure_whose_next_generation_fails_before_publication_counts_each_record_once() {
    use frostline::storage::faults::{Fault, FaultyBackend, Op};
    let e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    let all = vec![
        record("2024-03-01T01:00:00Z", "a", "acme"),
        record("2024-03-01T02:00:00Z", "b", "globex"),
        record("2024-03-01T03:00:00Z", "c", "acme"),
        record("2024-03-01T04:00:00Z", "d", "globex"),
    ];
    e.engine.append("r", all.clone()).unwrap();
    e.pass();
    e.clock.set(t("2024-03-04T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    let faulty = FaultyBackend::new(e.backend("r"));
    e.with_backend("r", faulty.clone());
    faulty.add(Op::Put, "manifest-", Fault::Error, None);
    let selector = ErasureSelector { tenant: Some("acme".into()), ..Default::default() };
    let placed = e.engine.store().place_erasure(request(selector), e.clock.now()).unwrap();
    // Two attempts at the next generation fail before their publication.
    let count = || e.engine.store().buckets("r", None).unwrap()[0].row_count;
    for _ in 0..2 {
        let report = e.pass();
        assert_eq!(report.deferred, 1, "{report:?}");
        assert_eq!(count(), 4, "the published archive still holds every record");
        assert_eq!(e.query_all("r"), sorted(all.clone()));
        e.clock.advance(16_000_000);
    }
    faulty.clear();
    let receipt = passes_until_finished(&e, &placed.id);
    let erased: u64 = receipt.buckets.iter().map(|b| b.hot_rows_erased + b.archived_rows_erased).sum();
    assert_eq!(erased, 2, "{receipt:?}");
    assert_eq!(count(), 2, "the records left");
    assert_eq!(e.query_all("r").len(), 2);
}

#[test]
fn an_erasure_by_identity_takes_exactly_the_records_it_names() {
    let e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    let all = vec![record("2024-03-01T01:00:00Z", "a", "acme"), record("2024-03-01T02:00:00Z", "b", "acme")];
    e.engine.append("r", all.clone()).unwrap();
    e.pass();
    e.clock.set(t("2024-03-04T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    let identity =
        RecordIdentity { partition_key: PARTITION.into(), event_time: t("2024-03-01T02:00:00Z"), sort_key: "b".into() };
    let selector = ErasureSelector { identities: vec![identity], ..Default::default() };
    let placed = e.engine.store().place_erasure(request(selector), e.clock.now()).unwrap();
    passes_until_finished(&e, &placed.id);
    assert_eq!(e.query_all("r"), vec![all[0].clone()]);
    assert!(files_holding(&target_dir(&e), "acme-b").is_empty());
}

#[test]
fn a_hold_beats_an_erasure_until_it_is_lifted() {
    let e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    e.engine.append("r", vec![record("2024-03-01T01:00:00Z", "a", "acme")]).unwrap();
    e.pass();
    e.clock.set(t("2024-03-04T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    let hold = frostline::store::schema::Hold {
        id: "h-litigation".into(),
        table: "r".into(),
        partition_key: None,
        tenant: Some("acme".into()),
        bucket_key: None,
        reason: "litigation".into(),
        placed_by: "counsel".into(),
        placed_at: 0,
        source: "cli".into(),
    };
    e.engine.store().place_hold(hold, e.clock.now()).unwrap();
    let selector = ErasureSelector { tenant: Some("acme".into()), ..Default::default() };
    let placed = e.engine.store().place_erasure(request(selector), e.clock.now()).unwrap();
    for _ in 0..3 {
        e.pass();
    }
    let request = e.engine.store().erasure(&placed.id).unwrap().unwrap();
    assert!(request.is_open());
    assert_eq!(request.buckets[0].progress, ErasureProgress::Blocked);
    assert_eq!(request.buckets[0].blocked_by, vec!["h-litigation".to_string()]);
    assert_eq!(e.query_all("r").len(), 1, "a held record is not erased");
    assert!(!files_holding(&target_dir(&e), "acme-a").is_empty());

    e.engine.store().lift_hold("h-litigation".into(), "counsel".into(), e.clock.now()).unwrap();
    passes_until_finished(&e, &placed.id);
    assert!(e.query_all("r").is_empty());
    let left = files_holding(&target_dir(&e), "acme-a");
    let receipt = e.engine.store().erasure(&placed.id).unwrap().unwrap();
    assert!(left.is_empty(), "{left:?} {receipt:?}");
}

#[test]
fn an_erasure_that_names_nothing_to_select_by_is_refused_and_changes_nothing() {
    let e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    e.engine.append("r", vec![record("2024-03-01T01:00:00Z", "a", "acme")]).unwrap();
    let everything = ErasureSelector { table: Some("r".into()), ..Default::default() };
    let err = e.engine.store().place_erasure(request(everything), e.clock.now()).unwrap_err();
    assert!(err.to_string().contains("--tenant"), "{err}");
    let backwards = ErasureSelector {
        tenant: Some("acme".into()),
        from: Some(t("2024-03-02T00:00:00Z")),
        to: Some(t("2024-03-01T00:00:00Z")),
        ..Default::default()
    };
    let err = e.engine.store().place_erasure(request(backwards), e.clock.now()).unwrap_err();
    assert!(err.to_string().contains("time range is empty"), "{err}");
    assert!(e.engine.store().erasures().unwrap().is_empty());
    assert_eq!(e.query_all("r").len(), 1);
}

/// Regression (lifecycle simulation with erasures, seed 0 × 300): an erasure that takes every
/// record of a bucket leaves an archive without rows, and adoption after a rebuild read the
/// bucket's partition from its first row: the empty archive was refused as corrupt ("describes
/// bucket r//day:…, which does not live in …"). The partition comes from the manifest then.
#[test]
fn an_archive_an_erasure_emptied_is_adopted_after_a_rebuild() {
    let e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    e.engine
        .append("r", vec![record("2024-03-01T01:00:00Z", "a", "acme"), record("2024-03-02T01:00:00Z", "b", "globex")])
        .unwrap();
    e.pass();
    e.clock.set(t("2024-03-04T00:00:00Z"));
    assert_eq!(e.pass().archived, 2);
    let selector = ErasureSelector { tenant: Some("acme".into()), ..Default::default() };
    let placed = e.engine.store().place_erasure(request(selector), e.clock.now()).unwrap();
    passes_until_finished(&e, &placed.id);
    let lost = e.engine.installation_id().to_string();
    let e = e.rebuild().unwrap();
    let report = runtime().block_on(frostline::archive::adopt::adopt(&e.engine.context(), false, &[lost])).unwrap();
    assert!(report.failures.is_empty() && report.conflicts.is_empty(), "{report:?}");
    assert_eq!(report.adopted, 2, "{report:?}");
    assert_eq!(e.query_all("r"), vec![record("2024-03-02T01:00:00Z", "b", "globex")]);
}

/// An archive adopted after the request was placed (here: the next generation a copy that went
/// on published, taken in by a restored copy) has a higher generation than the bucket had at
/// placement, yet holds the named records. A bucket's part is done only when its archive,
/// read back, holds none of them: this one is rewritten too.
#[test]
fn an_archive_adopted_after_the_request_is_erased_too() {
    let backups = tempfile::tempdir().unwrap();
    let mut e = archived_with_a_backup(backups.path());
    // The copy that goes on publishes generation 2 (a late record), holding `a` too.
    e.engine.append("r", vec![record("2024-03-01T02:00:00Z", "b", "globex")]).unwrap();
    e.clock.advance(LATE_GRACE_US);
    assert_eq!(e.pass().archived, 1);
    // Restored, the copy records generation 1; the erasure is placed, then generation 2 adopted.
    e = e.restore(backups.path()).unwrap();
    let selector = ErasureSelector { tenant: Some("acme".into()), ..Default::default() };
    let placed = e.engine.store().place_erasure(request(selector), e.clock.now()).unwrap();
    let report = runtime().block_on(frostline::archive::adopt::adopt(&e.engine.context(), false, &[])).unwrap();
    assert_eq!(report.adopted, 1, "{report:?}");
    passes_until_finished(&e, &placed.id);
    assert_eq!(e.query_all("r"), vec![record("2024-03-01T02:00:00Z", "b", "globex")]);
    let left = files_holding(&target_dir(&e), "acme-a");
    let receipt = e.engine.store().erasure(&placed.id).unwrap().unwrap();
    assert!(left.is_empty(), "{left:?} {receipt:?}");
}

/// The ownership rule holds for erasure as for the sweep: in a restored copy, whose other copy
/// went on archiving the bucket in a life the restored one never had, the erasure deletes
/// nothing (the pass says why, and the request stays open) until `frostline adopt` resolves it.
#[test]
fn an_erasure_deletes_nothing_beside_another_copys_keys() {
    let backups = tempfile::tempdir().unwrap();
    let mut e = archived_with_a_backup(backups.path());
    // The copy that goes on lives again (a new epoch) and archives a next generation.
    e = e.restart().unwrap();
    e.engine.append("r", vec![record("2024-03-01T02:00:00Z", "b", "globex")]).unwrap();
    e.clock.advance(LATE_GRACE_US);
    assert_eq!(e.pass().archived, 1);
    let other: Vec<String> = runtime()
        .block_on(e.backend("r").list(""))
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .filter(|k| k.contains("/manifest-"))
        .collect();
    e = e.restore(backups.path()).unwrap();
    let selector = ErasureSelector { tenant: Some("acme".into()), ..Default::default() };
    let placed = e.engine.store().place_erasure(request(selector), e.clock.now()).unwrap();
    let mut errors = Vec::new();
    for _ in 0..3 {
        errors.extend(e.pass().errors);
    }
    assert!(errors.iter().any(|err| err.contains("erasure") && err.contains("another copy")), "{errors:?}");
    assert!(e.engine.store().erasure(&placed.id).unwrap().unwrap().is_open());
    let listed: Vec<String> = runtime().block_on(e.backend("r").list("")).unwrap().into_iter().map(|o| o.key).collect();
    for key in &other {
        assert!(listed.contains(key), "the other copy's `{key}` is kept");
    }
}

/// A pass and every claim read only the open requests, through an index of their ids (a store
/// of many finished requests decodes none of them), and a data directory written before the
/// index builds it when it is first opened: an open request placed then is still carried out.
#[test]
fn only_open_requests_are_read_and_a_directory_written_before_their_index_builds_it() {
    let backup = tempfile::tempdir().unwrap();
    let e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    let both = vec![record("2024-03-01T01:00:00Z", "a", "acme"), record("2024-03-01T02:00:00Z", "b", "globex")];
    e.engine.append("r", both.clone()).unwrap();
    let tenant = |t: &str| ErasureSelector { tenant: Some(t.into()), ..Default::default() };
    let first = e.engine.store().place_erasure(request(tenant("acme")), e.clock.now()).unwrap();
    passes_until_finished(&e, &first.id);
    let second = e.engine.store().place_erasure(request(tenant("globex")), e.clock.now()).unwrap();
    let open_ids =
        |e: &TestEngine| e.engine.store().open_erasures().unwrap().into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(open_ids(&e), vec![second.id.clone()]);
    assert_eq!(e.engine.store().erasures().unwrap().len(), 2);

    // The same data directory as a version before the index left it: no index, no mark.
    let e = e.backup(backup.path()).unwrap();
    {
        let db = redb::Database::open(backup.path().join("hot.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        assert!(txn.delete_table(redb::TableDefinition::<&str, ()>::new("open_erasures")).unwrap());
        let mut meta = txn.open_table(redb::TableDefinition::<&str, &[u8]>::new("meta")).unwrap();
        assert!(meta.remove("open_erasures_indexed").unwrap().is_some());
        drop(meta);
        txn.commit().unwrap();
    }
    let e = e.restore(backup.path()).unwrap();
    assert_eq!(open_ids(&e), vec![second.id.clone()], "the index is built at the first open");
    passes_until_finished(&e, &second.id);
    assert!(open_ids(&e).is_empty());
    assert_eq!(e.query_all("r"), Vec::<Record>::new(), "both tenants' records are erased");
}

/// Engines that share one local target and their erasure requests (`--share-erasures`, one
/// fleet key), each with a data directory of its own.
struct Fleet {
    shared: tempfile::TempDir,
    _key_dir: tempfile::TempDir,
    settings: frostline::settings::Settings,
}

impl Fleet {
    fn new() -> Fleet {
        let shared = tempfile::tempdir().unwrap();
        let key_dir = tempfile::tempdir().unwrap();
        let key_file = key_dir.path().join("fleet.key");
        std::fs::write(&key_file, "5f0c7e2a9b14d3e8a6c1f0b27d49e85a3c6b0f1e9d2a7c4b8e5f3a1d0c9b7e26\n").unwrap();
        let settings = frostline::settings::Settings { share_erasures: Some(key_file), ..Default::default() };
        Fleet { shared, _key_dir: key_dir, settings }
    }

    fn open(&self, now: &str) -> TestEngine {
        self.open_with_retention(now, r#"archive_after = "1d", expire_after = "3650d""#)
    }

    /// `open` with the table's retention configured by `retention` (the plugin's config).
    fn open_with_retention(&self, now: &str, retention: &str) -> TestEngine {
        let policy = format!(
            r#"[[target]]
name = "shared"
url = "file://{}"

[[table]]
id = "r"
target = "shared"
strategy = {{ plugin = "builtin:calendar-day-utc" }}
retention = {{ plugin = "builtin:eligible-before", config = {{ {retention} }} }}
"#,
            self.shared.path().display()
        );
        TestEngine::open_with_settings(&policy, now, &[], Default::default(), self.settings.clone()).unwrap()
    }

    /// Four passes at `at`, none with an error.
    fn settle(e: &TestEngine, at: &str) {
        e.clock.set(t(at));
        for _ in 0..4 {
            let report = e.pass();
            assert!(report.errors.is_empty(), "{report:?}");
        }
    }

    /// The tenant of every record the engine reads, sorted.
    fn tenants(e: &TestEngine) -> Vec<String> {
        let mut read: Vec<String> = e.query_all("r").into_iter().map(|r| r.tenant.unwrap()).collect();
        read.sort();
        read
    }
}

/// Regression (found reading `archive::fleet_erase`): a host that joins a fleet after an erasure
/// request was placed on the shared target took the request up at its first pass and erased
/// every matching record it held, records appended after the request that nobody asked to erase
/// (a tenant whose later records are new, lawful data). A request placed before an installation
/// began is now passed over; a host that existed but was stopped when it was placed still takes
/// it up and erases what it held.
#[test]
fn a_host_that_joins_after_a_shared_erasure_keeps_the_records_appended_since() {
    let fleet = Fleet::new();
    let first = fleet.open("2024-03-01T12:00:00Z");
    let stopped = fleet.open("2024-03-01T12:00:00Z");
    for (e, n) in [(&first, "1"), (&stopped, "2")] {
        let batch = vec![
            record("2024-03-01T01:00:00Z", &format!("a{n}"), "acme"),
            record("2024-03-01T02:00:00Z", &format!("g{n}"), "globex"),
        ];
        e.engine.append("r", batch).unwrap();
        Fleet::settle(e, "2024-03-05T00:00:00Z");
    }
    let selector = ErasureSelector { tenant: Some("acme".into()), ..Default::default() };
    let placed = first.engine.store().place_erasure(request(selector), first.clock.now()).unwrap();
    Fleet::settle(&first, "2024-03-05T01:00:00Z");
    assert!(!first.engine.store().erasure(&placed.id).unwrap().unwrap().is_open(), "finished and shared");
    assert_eq!(Fleet::tenants(&first), ["globex"]);

    // A host that joins the fleet a day later: acme is a customer again, and its records stay.
    let joiner = fleet.open("2024-03-06T00:00:00Z");
    joiner.engine.append("r", vec![record("2024-03-06T01:00:00Z", "a3", "acme")]).unwrap();
    Fleet::settle(&joiner, "2024-03-06T00:30:00Z");
    Fleet::settle(&joiner, "2024-03-10T00:00:00Z");
    assert!(joiner.engine.store().erasures().unwrap().is_empty(), "not taken up by a host that began after it");
    assert_eq!(Fleet::tenants(&joiner), ["acme"], "the record appended after the request reads back");
    assert!(
        joiner
            .engine
            .store()
            .buckets("r", None)
            .unwrap()
            .iter()
            .all(|b| matches!(b.state, BucketState::Archived { .. })),
        "and was archived"
    );

    // Lost in turn, the joiner is replaced by a host that adopts its archive: published after
    // the request by a host that never took it up, it holds only records appended since, and
    // keeps them.
    let joiner_id = joiner.engine.installation_id().to_string();
    joiner.clock.set(t("2024-03-11T00:00:00Z"));
    let rebuilt = joiner.rebuild().unwrap();
    let report =
        runtime().block_on(frostline::archive::adopt::adopt(&rebuilt.engine.context(), false, &[joiner_id])).unwrap();
    assert_eq!(report.adopted, 1, "{report:?}");
    Fleet::settle(&rebuilt, "2024-03-11T00:00:00Z");
    assert_eq!(Fleet::tenants(&rebuilt), ["acme"], "what the joiner appended after the request stays");
    assert!(rebuilt.engine.store().erasures().unwrap().is_empty(), "{:?}", rebuilt.engine.store().erasures());

    // The host that was stopped when the request was placed takes it up when it runs again.
    Fleet::settle(&stopped, "2024-03-10T00:00:00Z");
    assert_eq!(Fleet::tenants(&stopped), ["globex"], "a host that existed at the request erases what it held");
}

/// Regression (the gap issue 33's last stops named): a host rebuilt after its installation was
/// lost adopts the lost one's archives, and a shared request the lost installation had not
/// carried out (it was stopped when the request was placed) never reached them: the rebuilt
/// host passed the request over, as it began after it, so the records stayed readable on the
/// target for good and the request's status named the lost installation as behind forever.
/// Now adoption sees that the lost installation's manifest does not answer for the request,
/// and places a request here for exactly the records it names in those archives: the passes
/// erase them, leave the receipt in the lost installation's name, and keep every record
/// appended here since, in the adopted bucket and beside it.
#[test]
fn a_host_that_adopts_a_lost_installations_archives_erases_what_a_shared_request_still_names_in_them() {
    let fleet = Fleet::new();
    let placer = fleet.open("2024-03-01T12:00:00Z");
    let lost = fleet.open("2024-03-01T12:00:00Z");
    // Each host archives partitions of its own (one table's folders have one writer each).
    const LOST: &str = "site b/%41=ø";
    let in_lost = |time: &str, sort_key: &str, tenant: &str| record_in(LOST, time, sort_key, tenant);
    for (e, n, partition) in [(&placer, "1", PARTITION), (&lost, "2", LOST)] {
        let batch = vec![
            record_in(partition, "2024-03-01T01:00:00Z", &format!("a{n}"), "acme"),
            record_in(partition, "2024-03-01T02:00:00Z", &format!("g{n}"), "globex"),
        ];
        e.engine.append("r", batch).unwrap();
        Fleet::settle(e, "2024-03-05T00:00:00Z");
    }
    // `lost` is stopped; acme's records are erased on the other host, which shares the request.
    let selector = ErasureSelector { tenant: Some("acme".into()), ..Default::default() };
    let placed = placer.engine.store().place_erasure(request(selector), placer.clock.now()).unwrap();
    Fleet::settle(&placer, "2024-03-05T01:00:00Z");
    assert!(!placer.engine.store().erasure(&placed.id).unwrap().unwrap().is_open());
    assert_eq!(files_holding(fleet.shared.path(), "acme-a1").len(), 0, "the placer's own archive is erased");
    assert!(!files_holding(fleet.shared.path(), "acme-a2").is_empty(), "the stopped host's is not yet");

    // `lost` never runs again: its data directory is rebuilt, and the new installation appends
    // acme records (lawful: acme is a customer again) before and after adopting.
    let lost_id = lost.engine.installation_id().to_string();
    lost.clock.set(t("2024-03-06T00:00:00Z"));
    let rebuilt = lost.rebuild().unwrap();
    rebuilt.engine.append("r", vec![in_lost("2024-03-06T01:00:00Z", "a3", "acme")]).unwrap();
    let context = rebuilt.engine.context();
    let dry =
        runtime().block_on(frostline::archive::adopt::adopt(&context, true, std::slice::from_ref(&lost_id))).unwrap();
    assert_eq!(dry.erasures_owed.len(), 1, "{dry:?}");
    assert!(rebuilt.engine.store().erasures().unwrap().is_empty(), "a dry run places nothing");
    // An adoption cut off after it recorded the archive and before it placed what the archive
    // owes: run again, it finds the archive recorded and places the request then, once.
    let adopt =
        || runtime().block_on(frostline::archive::adopt::adopt(&context, false, std::slice::from_ref(&lost_id)));
    fail::cfg("before_owed_erasures", "return").unwrap();
    let cut = adopt();
    fail::remove("before_owed_erasures");
    assert!(cut.is_err(), "{cut:?}");
    assert!(rebuilt.engine.store().erasures().unwrap().is_empty());
    let report = adopt().unwrap();
    assert_eq!((report.adopted, report.known), (0, 1), "recorded by the run cut off: {report:?}");
    assert_eq!(report.erasures_owed.len(), 1, "{report:?}");
    let again = adopt().unwrap();
    assert_eq!(rebuilt.engine.store().erasures().unwrap().len(), 1, "placed once, whatever the runs: {again:?}");
    assert!(report.erasures_unknown.is_empty(), "{report:?}");
    rebuilt.engine.append("r", vec![in_lost("2024-03-01T05:00:00Z", "a4", "acme")]).unwrap();
    Fleet::settle(&rebuilt, "2024-03-06T00:30:00Z");
    Fleet::settle(&rebuilt, "2024-03-10T00:00:00Z");

    let mut read: Vec<String> =
        rebuilt.query_all("r").iter().map(|r| String::from_utf8(r.sort_key.clone()).unwrap()).collect();
    read.sort();
    assert_eq!(read, ["a3", "a4", "g2"], "the adopted acme record is erased, the ones appended since stay");
    let local = rebuilt.engine.store().erasures().unwrap();
    assert_eq!(local.len(), 1, "{local:?}");
    assert!(!local[0].is_open(), "{local:?}");
    assert_eq!(local[0].selector.identities.len(), 1, "exactly the adopted record: {local:?}");
    let left = files_holding(fleet.shared.path(), "acme-a2");
    assert!(left.is_empty(), "no object on the target holds the erased record: {left:?}");
    assert!(!files_holding(fleet.shared.path(), "acme-a4").is_empty(), "the late record is archived");

    // The request's status names nobody as behind: the lost installation's receipt was left by
    // the host that adopted its archives, and the rebuilt one, which began after the request,
    // left its own.
    let progress =
        runtime().block_on(frostline::archive::fleet_erase::progress(&placer.engine.context(), &placed.id)).unwrap();
    assert_eq!(progress.len(), 1, "{progress:?}");
    assert!(progress[0].behind.is_empty(), "{progress:?}");
    let by_lost = progress[0].finished.iter().find(|r| r.installation == lost_id).expect("a receipt for `lost`");
    assert_eq!(by_lost.left_by.as_deref(), Some(rebuilt.engine.installation_id()), "{by_lost:?}");
    assert_eq!(by_lost.archived_rows_erased, 1, "{by_lost:?}");
}

/// Regression (the lifecycle simulation, seed 12589289491793546748): a copy restored from a
/// backup archived a bucket itself and left the other copy's archive of it on the target as a
/// conflict (it holds a record the restored copy never had); retention then expired the
/// restored copy's archive, and a shared request erasing the tenant finished there with a
/// receipt, though the other copy's archive still held the tenant's records. When that data
/// directory was lost in turn, the host rebuilt from nothing adopted the other copy's archive
/// (the only one left in the folder) and took the receipt as proof that the installation had
/// answered for every archive of its own: the erased records read back. A receipt now answers
/// only for the archives its writer wrote after it finished the request (their manifests no
/// longer name it); an earlier one speaks for itself, and what the request names in it is owed.
#[test]
fn a_receipt_does_not_answer_for_another_copys_archive_that_its_writer_never_erased() {
    let fleet = Fleet::new();
    let backups = tempfile::tempdir().unwrap();
    let backup = backups.path().join("backup");
    // `debug` records expire after 5 days, the others after ten years.
    let retention = r#"archive_after = "1d", expire_after = "3650d", kinds = { debug = { expire_after = "5d" } }"#;
    let mut e = fleet.open_with_retention("2024-03-01T12:00:00Z", retention);
    let with_kind = |sort_key: &str, kind: Option<&str>| Record {
        kind: kind.map(str::to_string),
        ..record(&format!("2024-03-01T0{}:00:00Z", sort_key.len()), sort_key, "acme")
    };
    e.engine.append("r", vec![with_kind("x", Some("debug"))]).unwrap();
    e = e.backup(&backup).unwrap();

    // The copy that goes on takes `yy` (kept for ten years) and archives the bucket.
    e.engine.append("r", vec![with_kind("yy", None)]).unwrap();
    Fleet::settle(&e, "2024-03-03T00:00:00Z");
    let fork = e.engine.store().buckets("r", None).unwrap()[0].manifest_key.clone().unwrap();

    // Restored, the copy archives the bucket itself (only `x`, `debug`), names the other copy's
    // archive a conflict and leaves it on the target, then expires its own archive.
    e = e.restore(&backup).unwrap();
    for _ in 0..4 {
        // Its sweep stops, naming the other copy, until the adoption below.
        let report = e.pass();
        assert!(report.errors.iter().all(|e| e.contains("another copy of this data directory")), "{report:?}");
    }
    let report = runtime().block_on(frostline::archive::adopt::adopt(&e.engine.context(), false, &[])).unwrap();
    assert!(report.conflicts.iter().any(|c| c.contains(&fork)), "{report:?}");
    Fleet::settle(&e, "2024-03-09T00:00:00Z");
    assert_eq!(e.engine.store().buckets("r", None).unwrap()[0].state, BucketState::Expired);
    assert!(!files_holding(fleet.shared.path(), "acme-yy").is_empty(), "the conflict stays on the target");

    // The tenant's records are erased here; the request finishes, with a receipt.
    let selector = ErasureSelector { tenant: Some("acme".into()), ..Default::default() };
    let placed = e.engine.store().place_erasure(request(selector), e.clock.now()).unwrap();
    passes_until_finished(&e, &placed.id);
    Fleet::settle(&e, "2024-03-09T01:00:00Z");

    // The data directory is lost; the host rebuilt adopts its archives, the fork among them.
    let lost = e.engine.installation_id().to_string();
    let rebuilt = e.rebuild().unwrap();
    let context = rebuilt.engine.context();
    let report =
        runtime().block_on(frostline::archive::adopt::adopt(&context, false, std::slice::from_ref(&lost))).unwrap();
    assert_eq!(report.adopted, 1, "{report:?}");
    assert_eq!(report.erasures_owed.len(), 1, "the fork still owes the request: {report:?}");
    Fleet::settle(&rebuilt, "2024-03-09T02:00:00Z");
    assert_eq!(rebuilt.query_all("r"), Vec::<Record>::new(), "no erased record reads back");
    let left = files_holding(fleet.shared.path(), "acme-yy");
    assert!(left.is_empty(), "no object on the target holds an erased record: {left:?}");
}

/// Erases the records of `PARTITION` at these (time, sort key) identities, and waits for it.
fn erase_identities(e: &TestEngine, identities: &[(&str, &str)]) {
    let identities = identities
        .iter()
        .map(|(time, sort_key)| RecordIdentity {
            partition_key: PARTITION.into(),
            event_time: t(time),
            sort_key: (*sort_key).into(),
        })
        .collect();
    let selector = ErasureSelector { identities, ..Default::default() };
    let placed = e.engine.store().place_erasure(request(selector), e.clock.now()).unwrap();
    passes_until_finished(e, &placed.id);
}

/// Regression (the crash harness's fleet mode, seed 17498238750178325163): a copy restored
/// from a backup taken while late rows waited beside a bucket's archive, after the copy that
/// went on erased one of those rows and a record of the archive (publishing the next generation
/// and deleting the one the backup records), refused that generation ("holds hot rows the
/// archive lacks") and then recorded the bucket as expired, since its own archive was gone:
/// every record of the bucket read as expired though no retention had expired it. Adoption
/// now takes the later generation (its lineage names the recorded archive) and keeps the hot
/// rows it lacks beside it, for the bucket's next generation: nothing the restored copy held is
/// lost, and only what the other copy's erasure took from the archive is gone (an erasure
/// placed after a backup is placed again after restoring it, docs/FLEET.md).
#[test]
fn a_restored_copy_adopts_the_generation_that_erased_a_row_it_holds_and_keeps_the_row() {
    let backups = tempfile::tempdir().unwrap();
    let backup = backups.path().join("backup");
    let mut e = TestEngine::new(&expiring_policy("3650d"), "2024-03-01T12:00:00Z");
    let archived = vec![record("2024-03-01T01:00:00Z", "a", "acme"), record("2024-03-01T02:00:00Z", "b", "acme")];
    e.engine.append("r", archived.clone()).unwrap();
    e.pass();
    e.clock.set(t("2024-03-04T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    let late = vec![record("2024-03-01T03:00:00Z", "late-1", "acme"), record("2024-03-01T04:00:00Z", "late-2", "acme")];
    e.engine.append("r", late.clone()).unwrap();
    e = e.backup(&backup).unwrap();
    let recorded = e.engine.store().buckets("r", None).unwrap()[0].manifest_key.clone().unwrap();

    // The copy that went on erases `a` (archived) and `late-1` (waiting beside the archive):
    // its next generation holds `b` and `late-2`, and the generation the backup records is gone.
    erase_identities(&e, &[("2024-03-01T01:00:00Z", "a"), ("2024-03-01T03:00:00Z", "late-1")]);
    assert_eq!(e.query_all("r"), vec![archived[1].clone(), late[1].clone()]);
    assert!(!files_holding(&target_dir(&e), "acme-a").iter().any(|f| f.to_string_lossy().contains(".parquet")));

    // Restored, the copy records the gone generation and holds both late rows hot.
    e = e.restore(&backup).unwrap();
    let report = runtime().block_on(frostline::archive::adopt::adopt(&e.engine.context(), false, &[])).unwrap();
    assert_eq!((report.adopted, report.hot_rows_released), (1, 1), "{report:?}");
    assert!(report.conflicts.is_empty() && report.gone.is_empty() && report.failures.is_empty(), "{report:?}");
    let meta = &e.engine.store().buckets("r", None).unwrap()[0];
    assert_eq!(meta.state, BucketState::ArchivedPending, "`late-1` waits beside the adopted generation");
    assert_ne!(meta.manifest_key.as_deref(), Some(recorded.as_str()));
    assert_eq!(meta.row_count, 3);
    let expected = vec![archived[1].clone(), late[0].clone(), late[1].clone()];
    assert_eq!(e.query_all("r"), expected);
    // The next generation holds them all, and the late row is cleaned up.
    e.clock.advance(LATE_GRACE_US);
    assert_eq!(e.pass().archived, 1);
    let meta = &e.engine.store().buckets("r", None).unwrap()[0];
    assert_eq!(meta.state, BucketState::Archived { hot_deleted: true });
    assert_eq!(e.query_all("r"), expected);
}

/// What adoption cannot resolve it leaves as it is, and never calls expired: here the restored
/// copy holds a late row under an identity whose record the copy that went on erased and then
/// took again with another body, so the later generation holds that identity with other
/// content (a conflict), and the generation the restored copy records is gone. The bucket is
/// named twice among the conflicts (the later generation, and the gone one it replaced), not
/// recorded as expired: no retention expired it.
#[test]
fn a_restored_copy_never_records_as_expired_an_archive_that_a_later_generation_replaced() {
    let backups = tempfile::tempdir().unwrap();
    let backup = backups.path().join("backup");
    // Objects are stamped with real time, the engine's clock is in 2024: any age will do.
    let settings = frostline::settings::Settings { orphan_grace_us: i64::MIN, ..Default::default() };
    let mut e = TestEngine::open_with_settings(
        &expiring_policy("3650d"),
        "2024-03-01T12:00:00Z",
        &[],
        Default::default(),
        settings,
    )
    .unwrap();
    e.engine.append("r", vec![record("2024-03-01T01:00:00Z", "a", "acme")]).unwrap();
    e.pass();
    e.clock.set(t("2024-03-04T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    let late = record("2024-03-01T03:00:00Z", "late", "acme");
    e.engine.append("r", vec![late.clone()]).unwrap();
    e = e.backup(&backup).unwrap();

    // The copy that went on erases `a` and `late`, then takes `late` again with another body.
    erase_identities(&e, &[("2024-03-01T01:00:00Z", "a"), ("2024-03-01T03:00:00Z", "late")]);
    let again = record("2024-03-01T03:00:00Z", "late", "globex");
    e.engine.append("r", vec![again.clone()]).unwrap();
    e.clock.advance(LATE_GRACE_US);
    assert_eq!(e.pass().archived, 1);
    assert_eq!(e.query_all("r"), vec![again]);
    // Its sweep deletes the generations it replaced, once past the grace period.
    let swept = runtime().block_on(frostline::archive::sweep::sweep(&e.engine.context(), false)).unwrap();
    assert!(swept.deleted > 0, "{swept:?}");

    e = e.restore(&backup).unwrap();
    let report = runtime().block_on(frostline::archive::adopt::adopt(&e.engine.context(), false, &[])).unwrap();
    assert_eq!(report.adopted, 0, "{report:?}");
    assert!(report.gone.is_empty(), "{report:?}");
    assert_eq!(report.conflicts.len(), 2, "{report:?}");
    assert!(report.conflicts.iter().any(|c| c.contains("with other content")), "{report:?}");
    assert!(report.conflicts.iter().any(|c| c.contains("replaced by")), "{report:?}");
    let meta = &e.engine.store().buckets("r", None).unwrap()[0];
    assert_eq!(meta.state, BucketState::ArchivedPending, "left as it is, not expired");
}

/// An erasure reaches a generation written to the table's previous target. The table moved
/// from the default target to `t2` between the bucket's first generation and its second; the
/// first's manifest copy was dropped when the second's cleanup released its objects, so the
/// released keys alone say the first lies on the old target. The erasure deletes it there,
/// proves it absent, and leaves no byte of the erased records on either target.
#[test]
fn an_erasure_deletes_a_replaced_generation_on_the_tables_previous_target() {
    let (t2, on_default, on_t2) = policies_moving_to_t2(&expiring_policy("3650d"));
    let mut e = TestEngine::new(&on_default, "2024-03-01T12:00:00Z");
    let first_target = target_dir(&e);
    e.engine.append("r", vec![record("2024-03-01T01:00:00Z", "a", "acme")]).unwrap();
    e.pass();
    e.clock.set(t("2024-03-04T00:00:00Z"));
    assert_eq!(e.pass().archived, 1);
    std::fs::write(e.policies_dir().join("tables.toml"), &on_t2).unwrap();
    e = e.restart().unwrap();
    e.engine.append("r", vec![record("2024-03-01T02:00:00Z", "b", "globex")]).unwrap();
    e.clock.advance(LATE_GRACE_US);
    assert_eq!(e.pass().archived, 1, "the second generation, on t2");
    let id = e.engine.store().buckets("r", None).unwrap()[0].id.clone();
    assert_eq!(e.engine.store().snapshot().unwrap().manifests_of(&id).unwrap().len(), 1, "one copy recorded");
    assert!(!files_holding(&first_target, "acme-a").is_empty(), "the first generation waits for the sweep");

    let selector = ErasureSelector { tenant: Some("acme".into()), ..Default::default() };
    let placed = e.engine.store().place_erasure(request(selector), e.clock.now()).unwrap();
    let receipt = passes_until_finished(&e, &placed.id);
    assert_eq!(receipt.buckets.len(), 1);
    let bucket = &receipt.buckets[0];
    assert_eq!(bucket.progress, ErasureProgress::Done, "{bucket:?}");
    assert!(bucket.proved_absent_at.is_some(), "{bucket:?}");
    for dir in [&first_target, &t2.path().to_path_buf()] {
        assert_eq!(files_holding(dir, "acme-a"), Vec::<std::path::PathBuf>::new(), "`acme-a` under {}", dir.display());
    }
    assert_eq!(e.query_all("r"), vec![record("2024-03-01T02:00:00Z", "b", "globex")]);
}

//! The archival protocol through the library, with a manual clock and the fault-injecting
//! store: every phase can fail and every record stays readable; stale workers are refused;
//! the fence, the ingest guard, idempotent appends and group commit hold.

use frostline::archive::Phase;
use frostline::clock::Clock;

use frostline::model::{BucketState, Record};
use frostline::storage::faults::{Fault, FaultyBackend, Op};
use frostline::store::Publication;
use frostline::store::schema::{BucketId, SCHEMA_VERSION};
use frostline::{Error, ErrorKind};

use crate::support::*;

const DAILY: &str = r#"
[[table]]
id = "r"
strategy = { plugin = "builtin:calendar-day-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1d" } }
"#;

/// A manifest of `rows` for driving the store's fenced transactions directly.
fn manifest_of(
    descriptor: &frostline::model::BucketDescriptor,
    generation: u64,
    rows: &[Record],
) -> frostline::format::manifest::Manifest {
    frostline::format::manifest::Manifest {
        version: 1,
        table: "r".into(),
        partition_key: "p0".into(),
        bucket: descriptor.clone(),
        strategy: "test".into(),
        generation,
        format: frostline::format::Format::Jsonl,
        schema: String::new(),
        target: "memory://".into(),
        target_name: String::new(),
        policy: None,
        summary: frostline::model::rows::summarize(rows),
        bytes: 0,
        segments: vec![],
        created_at: 0,
        amends: None,
        erasures: None,
    }
}

fn states(e: &TestEngine) -> Vec<BucketState> {
    e.engine.store().buckets("r", None).unwrap().into_iter().map(|b| b.state).collect()
}

fn hot_rows(e: &TestEngine) -> usize {
    e.engine
        .store()
        .buckets("r", None)
        .unwrap()
        .iter()
        .map(|b| e.engine.store().rows(&b.id, None, usize::MAX).unwrap().len())
        .sum()
}

#[test]
fn a_pass_archives_due_buckets_and_every_record_reads_back_identically() {
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    let input = records("2024-03-01T00:00:00Z", 5, 40);
    e.engine.append("r", input.clone()).unwrap();
    e.engine.append("r", records("2024-03-09T00:00:00Z", 1, 10)).unwrap();
    let report = e.pass();
    // Days 1-5 ended more than a day ago; day 9 ends at the 10th, due on the 11th.
    assert_eq!(report.archived, 15, "{report:?}");
    assert_eq!(report.errors, Vec::<String>::new());
    let archived = states(&e).iter().filter(|s| **s == BucketState::Archived { hot_deleted: true }).count();
    assert_eq!(archived, 15);
    assert_eq!(hot_rows(&e), 10, "only the hot day keeps hot rows");
    let mut expected = input;
    expected.extend(records("2024-03-09T00:00:00Z", 1, 10));
    assert_eq!(e.query_all("r"), sorted(expected));
}

fn assert_fault_defers_then_recovers(fault_op: Op, key_part: &str, fault: Fault) {
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    let faulty = FaultyBackend::new(e.backend("r"));
    e.with_backend("r", faulty.clone());
    let input = records("2024-03-01T00:00:00Z", 1, 30);
    e.engine.append("r", input.clone()).unwrap();
    faulty.add(fault_op, key_part, fault.clone(), None);
    let report = e.pass();
    assert!(!faulty.fired().is_empty(), "{fault_op:?} {fault:?} never fired");
    assert_eq!(report.archived, 0, "{fault_op:?} {key_part} {fault:?}: {report:?}");
    assert_eq!(report.deferred, 3, "{report:?}");
    assert!(states(&e).iter().all(|s| *s == BucketState::Archiving), "fenced while deferred");
    assert_eq!(e.query_all("r"), sorted(input.clone()), "every record readable while deferred");
    let deferred = e.engine.store().buckets("r", None).unwrap();
    assert!(deferred.iter().all(|b| b.attempts == 1 && b.last_error.is_some()));
    // Not retried before ARCHIVER_RETRY_SECONDS.
    assert_eq!(e.pass().archived, 0);
    faulty.clear();
    e.clock.advance(16_000_000);
    let report = e.pass();
    assert_eq!(report.archived, 3, "{report:?}");
    assert_eq!(hot_rows(&e), 0);
    assert_eq!(e.query_all("r"), sorted(input));
}

#[test]
fn a_failed_segment_upload_defers_and_a_later_pass_completes() {
    assert_fault_defers_then_recovers(Op::Put, "seg-", Fault::Error);
}

#[test]
fn a_failed_manifest_upload_defers_and_a_later_pass_completes() {
    assert_fault_defers_then_recovers(Op::Put, "manifest-", Fault::Error);
}

#[test]
fn a_corrupted_read_back_defers_and_a_later_pass_completes() {
    assert_fault_defers_then_recovers(Op::Get, "seg-", Fault::CorruptRead);
}

#[test]
fn a_failed_read_back_defers_and_a_later_pass_completes() {
    assert_fault_defers_then_recovers(Op::Get, "manifest-", Fault::Error);
}

#[test]
fn a_lost_acknowledgement_is_resolved_by_reading_the_object() {
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    let faulty = FaultyBackend::new(e.backend("r"));
    e.with_backend("r", faulty.clone());
    let input = records("2024-03-01T00:00:00Z", 1, 30);
    e.engine.append("r", input.clone()).unwrap();
    faulty.add(Op::Put, "", Fault::LandThenError, None);
    let report = e.pass();
    assert_eq!(report.archived, 3, "uploads landed; reading them back resolves the doubt: {report:?}");
    assert_eq!(e.query_all("r"), sorted(input));
}

#[test]
fn an_existing_object_with_other_bytes_is_never_overwritten() {
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    let input = records("2024-03-01T00:00:00Z", 1, 3);
    e.engine.append("r", input.clone()).unwrap();
    // Archive once in a scratch engine to learn a segment key, then plant different bytes there.
    let scratch = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    scratch.engine.append("r", input.clone()).unwrap();
    scratch.pass();
    let key = scratch
        .engine
        .store()
        .buckets("r", None)
        .unwrap()
        .iter()
        .map(|b| {
            let m = runtime()
                .block_on(frostline::archive::read_manifest(
                    scratch.backend("r").as_ref(),
                    b.manifest_key.as_ref().unwrap(),
                ))
                .unwrap();
            m.segments[0].key.clone()
        })
        .next()
        .unwrap()
        // The same key as this engine would write: its own installation id and epoch in the name.
        .replace(&scratch.engine.context().writer().unwrap(), &e.engine.context().writer().unwrap());
    runtime().block_on(e.backend("r").put_create(&key, bytes::Bytes::from_static(b"planted"))).unwrap();
    let report = e.pass();
    assert_eq!(report.deferred, 1, "{report:?}");
    assert!(report.errors[0].contains("never overwritten"), "{:?}", report.errors);
    let planted = runtime().block_on(e.backend("r").get(&key)).unwrap().unwrap();
    assert_eq!(&planted[..], b"planted");
    assert_eq!(e.query_all("r"), sorted(input));
}

#[test]
fn cleanup_refuses_when_hot_rows_differ_from_the_manifest() {
    // Pins invariant 9: a peer deleted rows its snapshot did not contain. An extra row appears
    // (a bug elsewhere) after the manifest was made: the table's length says so.
    assert_cleanup_refuses(|table, descriptor| {
        let key = frostline::store::schema::row_key(descriptor.start + 1, b"extra");
        table.insert(key.as_slice(), stored_row("{}").as_slice()).unwrap();
    });
    // A row's key changes: the table's end keys say so.
    assert_cleanup_refuses(|table, descriptor| {
        let (_, value) = table.pop_first().unwrap().map(|(k, v)| (k.value().to_vec(), v.value().to_vec())).unwrap();
        let key = frostline::store::schema::row_key(descriptor.start, b"");
        table.insert(key.as_slice(), value.as_slice()).unwrap();
    });
}

/// The cleanup's proof reads the table's length and end keys (the snapshot summed the rows in
/// key order, and a claimed bucket takes no appends); a debug build, and so every test, also
/// re-reads the rows for the checksum, which is what sees a body changed in place.
#[cfg(debug_assertions)]
#[test]
fn cleanup_in_a_debug_build_also_refuses_a_row_changed_in_place() {
    assert_cleanup_refuses(|table, _| {
        let (key, _) = table.pop_last().unwrap().map(|(k, v)| (k.value().to_vec(), v.value().to_vec())).unwrap();
        table.insert(key.as_slice(), stored_row("{\"changed\":true}").as_slice()).unwrap();
    });
}

fn stored_row(body: &str) -> Vec<u8> {
    frostline::store::schema::encode_value(&frostline::store::schema::StoredRow {
        tenant: None,
        kind: None,
        body: body.into(),
    })
    .unwrap()
}

/// Publishes a bucket of three rows with a manifest of them, lets `change` alter its rows
/// table, and checks that the cleanup refuses, deleting nothing.
fn assert_cleanup_refuses(
    change: impl FnOnce(&mut frostline::store::schema::RowsTable<'_>, &frostline::model::BucketDescriptor) + Send + 'static,
) {
    let input = records("2024-03-01T00:00:00Z", 1, 3);
    let lease = 60_000_000;
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    e.engine.append("r", input.clone()).unwrap();
    let store = e.engine.store().clone();
    e.clock.set(t("2024-03-01T12:00:00Z"));
    e.pass(); // plans, nothing due yet
    e.clock.set(t("2024-03-10T00:00:00Z"));
    let id = store.buckets("r", None).unwrap()[0].id.clone();
    let claimed = store.claim(id.clone(), "w".into(), e.clock.now(), lease).unwrap().unwrap();
    let rows = store.rows(&id, None, usize::MAX).unwrap();
    let manifest = manifest_of(&claimed.descriptor, claimed.generation, &rows);
    store.publish(id.clone(), "w".into(), claimed.generation, e.clock.now(), Publication::new(manifest, "m")).unwrap();
    let table = frostline::store::schema::rows_table_name(&id);
    let descriptor = claimed.descriptor.clone();
    store
        .write(move |txn| {
            change(&mut txn.open_table(frostline::store::schema::rows_table(&table)).unwrap(), &descriptor);
            Ok(())
        })
        .unwrap();
    let before = store.rows(&id, None, usize::MAX).unwrap();
    let err = clean_up(&store, &id, "w", claimed.generation, e.clock.now(), 2).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DataCorruption, "{err}");
    assert!(err.to_string().contains("refusing to delete the hot rows"), "{err}");
    assert_eq!(store.rows(&id, None, usize::MAX).unwrap(), before, "nothing deleted");
    let meta = store.bucket(&id).unwrap().unwrap();
    assert_eq!(meta.state, BucketState::Archived { hot_deleted: false });
    assert_eq!(meta.cleanup_proven, None, "no proof recorded");
}

/// A whole cleanup as a worker runs it: slices until the last (the first proves); the rows deleted.
fn clean_up(
    store: &frostline::store::Store,
    id: &BucketId,
    owner: &str,
    generation: u64,
    now: i64,
    slice_rows: usize,
) -> frostline::Result<u64> {
    let mut deleted = 0;
    loop {
        let slice = store.cleanup_slice(id, owner, generation, now, slice_rows)?;
        deleted += slice.deleted;
        if slice.finished {
            return Ok(deleted);
        }
    }
}

/// The names of the hot store's rows tables (one per bucket with hot rows).
fn rows_tables(store: &frostline::store::Store) -> Vec<String> {
    use redb::TableHandle as _;
    store
        .write(|txn| {
            Ok(txn.list_tables().unwrap().map(|t| t.name().to_string()).filter(|n| n.starts_with("rows ")).collect())
        })
        .unwrap()
}

/// Schema 2 keeps each bucket's rows in a table of its own. A cleanup with at most four slices
/// of rows left drops the table in one transaction (on schema 1, 20 rows in slices of 5 took
/// four slices); a larger bucket is deleted slice by slice until then. Either way the bucket's
/// table is gone afterwards and the other buckets' rows are untouched.
#[test]
fn a_cleanup_drops_a_small_buckets_rows_table_whole_and_slices_a_large_one() {
    for (rows, slices) in [
        (20usize, vec![(20, true)]),
        (21, vec![(5, false), (16, true)]),
        (33, vec![(5, false), (5, false), (5, false), (18, true)]),
    ] {
        // Three partitions of `rows` rows each: the first bucket (p0) is cleaned up.
        let (e, id, a) = one_bucket_claimed_by_a(records("2024-03-01T00:00:00Z", 1, rows as i64 * 3));
        let store = e.engine.store().clone();
        let hot = store.rows(&id, None, usize::MAX).unwrap();
        assert_eq!(hot.len(), rows);
        assert!(rows_tables(&store).contains(&frostline::store::schema::rows_table_name(&id)));
        let others = rows_tables(&store).len() - 1;
        assert_eq!(others, 2);
        let manifest = manifest_of(&a.descriptor, a.generation, &hot);
        store.publish(id.clone(), "A".into(), a.generation, e.clock.now(), Publication::new(manifest, "m")).unwrap();
        let mut done = Vec::new();
        loop {
            let slice = store.cleanup_slice(&id, "A", a.generation, e.clock.now(), 5).unwrap();
            done.push((slice.deleted, slice.finished));
            if slice.finished {
                break;
            }
        }
        assert_eq!(done, slices, "{rows} rows");
        assert!(store.rows(&id, None, usize::MAX).unwrap().is_empty());
        assert!(!rows_tables(&store).contains(&frostline::store::schema::rows_table_name(&id)), "the table is gone");
        assert_eq!(rows_tables(&store).len(), others, "the other buckets keep their tables");
        assert_eq!(store.bucket(&id).unwrap().unwrap().state, BucketState::Archived { hot_deleted: true });
    }
}

/// A refused batch leaves no trace, not even an empty rows table for a bucket it would have
/// made.
#[test]
fn a_refused_batch_leaves_no_rows_table_behind() {
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    let first = records("2024-03-01T00:00:00Z", 1, 1);
    e.engine.append("r", first.clone()).unwrap();
    let tables = rows_tables(e.engine.store());
    let mut batch = records("2024-03-02T00:00:00Z", 1, 1);
    batch.push(Record { body: r#"{"changed":1}"#.into(), ..first[0].clone() });
    assert_eq!(e.engine.append("r", batch).unwrap_err().kind(), ErrorKind::Conflict);
    assert_eq!(rows_tables(e.engine.store()), tables);
    assert_eq!(e.engine.store().buckets("r", None).unwrap().len(), 1);
    assert_eq!(e.query_all("r"), first);
}

/// A backend that checks, before each upload of a segment or manifest, that the key is in one
/// of the store's upload intents (invariant 10), and lists those uploads.
struct IntentChecked {
    inner: std::sync::Arc<dyn frostline::storage::ArchiveBackend>,
    store: frostline::store::Store,
    uploads: std::sync::Mutex<Vec<String>>,
    unrecorded: std::sync::Mutex<Vec<String>>,
}

impl std::fmt::Debug for IntentChecked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntentChecked").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl IntentChecked {
    fn check(&self, key: &str) {
        if key.ends_with("_catalog.json") {
            return; // the catalogs are rewritten, not an archival's objects
        }
        let recorded = self.store.intents().unwrap().iter().any(|intent| intent.keys.iter().any(|k| k == key));
        if !recorded {
            self.unrecorded.lock().unwrap().push(key.to_string());
        }
        self.uploads.lock().unwrap().push(key.to_string());
    }
}

#[async_trait::async_trait]
impl frostline::storage::ArchiveBackend for IntentChecked {
    fn target(&self) -> &str {
        self.inner.target()
    }
    async fn put_create(&self, key: &str, bytes: bytes::Bytes) -> frostline::Result<frostline::storage::PutOutcome> {
        self.check(key);
        self.inner.put_create(key, bytes).await
    }
    async fn put_create_staged(
        &self,
        key: &str,
        bytes: bytes::Bytes,
    ) -> frostline::Result<frostline::storage::PutOutcome> {
        self.check(key);
        self.inner.put_create_staged(key, bytes).await
    }
    async fn get(&self, key: &str) -> frostline::Result<Option<bytes::Bytes>> {
        self.inner.get(key).await
    }
    async fn delete(&self, key: &str) -> frostline::Result<()> {
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> frostline::Result<Vec<frostline::storage::ObjectInfo>> {
        self.inner.list(prefix).await
    }
}

/// `rows` records of one bucket (partition p0, 2024-03-01), in clustering order.
fn one_bucket_of(rows: i64) -> Vec<Record> {
    (0..rows)
        .map(|n| Record {
            partition_key: b"p0".to_vec(),
            event_time: t("2024-03-01T00:00:00Z") + n * 1_000,
            sort_key: format!("{n:06}").into_bytes(),
            tenant: None,
            kind: None,
            body: format!(r#"{{"n":{n}}}"#),
        })
        .collect()
}

/// The pass streams a bucket: its rows are read and encoded a segment at a time, and each key
/// joins the upload intent before its upload (invariant 10), the manifest's with the last
/// segment's. A bucket of 25,000 rows is three segments, uploaded in order, then the manifest;
/// every row reads back.
#[test]
fn a_streamed_pass_records_every_key_in_the_intent_before_its_upload() {
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    let input = one_bucket_of(25_000);
    let checked = std::sync::Arc::new(IntentChecked {
        inner: e.backend("r"),
        store: e.engine.store().clone(),
        uploads: Default::default(),
        unrecorded: Default::default(),
    });
    e.with_backend("r", checked.clone());
    e.engine.append("r", input.clone()).unwrap();
    let report = e.pass();
    assert_eq!((report.archived, report.rows_archived), (1, 25_000), "{report:?}");
    assert!(checked.unrecorded.lock().unwrap().is_empty(), "uploaded before recorded: {:?}", checked.unrecorded);
    let uploads = checked.uploads.lock().unwrap().clone();
    let kinds: Vec<&str> =
        uploads.iter().map(|k| if k.contains("/manifest-") { "manifest" } else { "segment" }).collect();
    assert_eq!(kinds, ["segment", "segment", "segment", "manifest"], "{uploads:?}");
    for (i, key) in uploads.iter().take(3).enumerate() {
        assert!(key.contains(&format!("-{i:05}-")), "segment {i} in order: {key}");
    }
    assert_eq!(e.query_all("r"), input);
}

/// An upload that fails in the middle of a streamed bucket stops its reader, defers the
/// bucket with nothing published, and the next pass archives it whole.
#[test]
fn an_upload_failing_mid_stream_defers_the_bucket_and_the_next_pass_finishes_it() {
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    let input = one_bucket_of(25_000);
    let faulty = FaultyBackend::new(e.backend("r"));
    e.with_backend("r", faulty.clone());
    faulty.add(Op::Put, "-00001-", Fault::Error, Some(1));
    e.engine.append("r", input.clone()).unwrap();
    let report = e.pass();
    assert_eq!((report.archived, report.deferred), (0, 1), "{report:?}");
    let id = e.engine.store().buckets("r", None).unwrap()[0].id.clone();
    assert!(e.engine.store().latest_manifest(&id).unwrap().is_none(), "nothing published");
    assert_eq!(e.query_all("r"), input, "the hot rows are all there");
    e.clock.advance(3_600_000_000);
    let report = e.pass();
    assert_eq!((report.archived, report.rows_archived), (1, 25_000), "{report:?}");
    assert_eq!(e.query_all("r"), input);
}

/// A query page over an archived bucket reads its segments one at a time and stops once the
/// page is full. A page of 100 records from the start of a bucket of three segments reads the
/// manifest and the first segment only (it read all three before); a page from the middle
/// reads the segment that holds it; every record still reads back page by page.
#[test]
fn a_query_page_holds_at_most_its_byte_bound_and_its_pages_hold_every_record_once() {
    use frostline::model::RECORD_BODY_BYTES_MAX;
    use frostline::query::{QUERY_PAGE_BYTES_MAX, QueryRequest, query};
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    // Bodies just under the 1 MiB a record may hold: 16 of them fit in a page, 17 do not.
    let day = |date: &str, n: usize| -> Vec<frostline::model::Record> {
        (0..n)
            .map(|i| frostline::model::Record {
                partition_key: "site/α b%=".as_bytes().to_vec(),
                event_time: t(date) + i as i64 * 1_000_000,
                sort_key: format!("{date}-{i:03}").into_bytes(),
                tenant: Some("acme".into()),
                kind: None,
                body: format!(r#"{{"i":{i},"pad":"{}"}}"#, "x".repeat(RECORD_BODY_BYTES_MAX - 100)),
            })
            .collect()
    };
    let (first, second, hot) =
        (day("2024-03-01T00:00:00Z", 15), day("2024-03-08T00:00:00Z", 20), day("2024-03-10T00:00:00Z", 20));
    e.engine.append("r", first.iter().chain(&second).cloned().collect()).unwrap();
    assert_eq!(e.pass().archived, 2);
    e.engine.append("r", hot.clone()).unwrap();
    let page = |from: Option<i64>, to: Option<i64>, cursor: Option<String>| {
        let request = QueryRequest { table: "r".into(), from, to, limit: 1_000, cursor, ..Default::default() };
        runtime().block_on(query(&e.engine.context(), request)).unwrap()
    };
    // Holds: a day of 15 records (15 MiB) is one page, with nothing after it.
    let one = page(Some(t("2024-03-01T00:00:00Z")), Some(t("2024-03-02T00:00:00Z")), None);
    assert_eq!(one.records, first);
    assert_eq!(one.next_cursor, None);
    // Enforced: 55 records of 1 MiB, archived and hot, come in pages of at most 16 MiB, each
    // record once and in order.
    let (mut read, mut cursor, mut pages) = (Vec::new(), None, 0);
    loop {
        let next = page(None, None, cursor);
        let bytes: usize = next.records.iter().map(|r| r.stored_bytes()).sum();
        assert!(bytes <= QUERY_PAGE_BYTES_MAX, "page {pages}: {bytes} bytes");
        assert!(!next.records.is_empty(), "page {pages} is empty");
        pages += 1;
        read.extend(next.records);
        match next.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let expected: Vec<_> = first.iter().chain(&second).chain(&hot).cloned().collect();
    assert_eq!(read.len(), expected.len());
    assert!(read == expected, "every record once, in order");
    assert_eq!(pages, 4, "55 records of 1 MiB, 16 a page");
}

/// A query page reads the archived segments it needs and no other object.
#[test]
fn a_query_page_reads_only_the_archived_segments_it_needs() {
    use frostline::query::{QueryRequest, query};
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    let faulty = FaultyBackend::new(e.backend("r"));
    e.with_backend("r", faulty.clone());
    let input = one_bucket_of(25_000);
    e.engine.append("r", input.clone()).unwrap();
    assert_eq!(e.pass().archived, 1);
    let page_reads = |from: Option<i64>| {
        let before = faulty.reads().len();
        let request = QueryRequest { table: "r".into(), from, limit: 100, ..Default::default() };
        let page = runtime().block_on(query(&e.engine.context(), request)).unwrap();
        (page.records, faulty.reads()[before..].to_vec())
    };
    // The segment it needs and nothing else: its list of segments is the store's copy of the
    // published manifest (a manifest is written once), not a read of the object.
    let (records, reads) = page_reads(None);
    assert_eq!(records, input[..100]);
    assert_eq!(reads.len(), 1, "{reads:?}");
    assert!(reads[0].contains("-00000-"), "{reads:?}");
    let (records, reads) = page_reads(Some(input[15_000].event_time));
    assert_eq!(records, input[15_000..15_100]);
    assert_eq!(reads.len(), 1, "{reads:?}");
    assert!(reads[0].contains("-00001-"), "{reads:?}");
    assert_eq!(e.query_all("r"), input);
}

const LEASE_US: i64 = 60_000_000;

/// An engine whose first bucket, planned and due, worker "A" has claimed for `LEASE_US`.
fn one_bucket_claimed_by_a(input: Vec<Record>) -> (TestEngine, BucketId, frostline::store::schema::BucketMeta) {
    let e = TestEngine::new(DAILY, "2024-03-01T12:00:00Z");
    e.engine.append("r", input).unwrap();
    e.pass(); // plan only
    e.clock.set(t("2024-03-10T00:00:00Z"));
    let id = e.engine.store().buckets("r", None).unwrap()[0].id.clone();
    let a = e.engine.store().claim(id.clone(), "A".into(), e.clock.now(), LEASE_US).unwrap().unwrap();
    (e, id, a)
}

/// A cleanup deletes in fenced slices after one proof, recorded with the bucket: one that was
/// cut off after a slice (a crash, a lost lease) is finished by the next worker from the
/// proof, not proven again against rows that are already partly gone, and the worker that lost
/// the lease deletes nothing more.
#[test]
fn a_cleanup_cut_off_between_slices_is_finished_by_the_next_worker() {
    let one_partition: Vec<Record> =
        records("2024-03-01T00:00:00Z", 1, 90).into_iter().filter(|r| r.partition_key == b"p0").collect();
    let (e, id, a) = one_bucket_claimed_by_a(one_partition);
    let (store, lease) = (e.engine.store().clone(), LEASE_US);
    let rows = store.rows(&id, None, usize::MAX).unwrap();
    assert_eq!(rows.len(), 30);
    store
        .publish(
            id.clone(),
            "A".into(),
            a.generation,
            e.clock.now(),
            Publication::new(manifest_of(&a.descriptor, a.generation, &rows), "m"),
        )
        .unwrap();
    let first = store.cleanup_slice(&id, "A", a.generation, e.clock.now(), 3).unwrap();
    assert_eq!((first.deleted, first.finished), (3, false));
    assert_eq!(store.rows(&id, None, usize::MAX).unwrap().len(), 27);
    // A stops here; B takes the cleanup over after A's lease.
    e.clock.advance(lease + 1);
    let b = store.claim(id.clone(), "B".into(), e.clock.now(), lease).unwrap().unwrap();
    let stale = store.cleanup_slice(&id, "A", a.generation, e.clock.now(), 3);
    assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
    assert_eq!(clean_up(&store, &id, "B", b.generation, e.clock.now(), 3).unwrap(), 27);
    let meta = store.bucket(&id).unwrap().unwrap();
    assert_eq!(meta.state, BucketState::Archived { hot_deleted: true });
    assert_eq!(meta.cleanup_proven, None);
    assert!(store.rows(&id, None, usize::MAX).unwrap().is_empty());
}

#[test]
fn a_stale_worker_can_neither_publish_nor_delete() {
    let (e, id, a) = one_bucket_claimed_by_a(records("2024-03-01T00:00:00Z", 1, 3));
    let (store, lease) = (e.engine.store().clone(), LEASE_US);
    assert!(store.claim(id.clone(), "B".into(), e.clock.now(), lease).unwrap().is_none(), "lease held");
    // A stalls past its lease; B takes over with a new generation.
    e.clock.advance(lease + 1);
    let b = store.claim(id.clone(), "B".into(), e.clock.now(), lease).unwrap().unwrap();
    assert_eq!(b.generation, a.generation + 1);
    let rows = store.rows(&id, None, usize::MAX).unwrap();
    let manifest = |generation| manifest_of(&a.descriptor, generation, &rows);
    let stale = store.publish(
        id.clone(),
        "A".into(),
        a.generation,
        e.clock.now(),
        Publication::new(manifest(a.generation), "ma"),
    );
    assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
    let stale = clean_up(&store, &id, "A", a.generation, e.clock.now(), 2);
    assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
    // A worker with the right owner but an old generation is refused too.
    let stale = store.publish(
        id.clone(),
        "B".into(),
        a.generation,
        e.clock.now(),
        Publication::new(manifest(a.generation), "ma"),
    );
    assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
    store
        .publish(id.clone(), "B".into(), b.generation, e.clock.now(), Publication::new(manifest(b.generation), "mb"))
        .unwrap();
    assert_eq!(clean_up(&store, &id, "B", b.generation, e.clock.now(), 2).unwrap(), rows.len() as u64);
    let meta = store.bucket(&id).unwrap().unwrap();
    assert_eq!(meta.manifest_key.as_deref(), Some("mb"));
    assert_eq!(meta.state, BucketState::Archived { hot_deleted: true });
}

#[test]
fn a_pending_cleanup_is_taken_over_after_the_lease_expires() {
    let e = TestEngine::new(DAILY, "2024-03-01T12:00:00Z");
    let input = records("2024-03-01T00:00:00Z", 1, 3);
    e.engine.append("r", input.clone()).unwrap();
    e.pass();
    e.clock.set(t("2024-03-10T00:00:00Z"));
    // Worker A publishes, then dies before cleanup.
    let store = e.engine.store().clone();
    let id = store.buckets("r", None).unwrap()[0].id.clone();
    let a = store.claim(id.clone(), "A".into(), e.clock.now(), 60_000_000).unwrap().unwrap();
    let rows = store.rows(&id, None, usize::MAX).unwrap();
    let manifest = manifest_of(&a.descriptor, a.generation, &rows);
    store.publish(id.clone(), "A".into(), a.generation, e.clock.now(), Publication::new(manifest, "ma")).unwrap();
    // A dies here. Its lease expires; the next pass claims the pending cleanup and finishes it.
    e.clock.advance(61_000_000);
    let report = e.pass();
    assert!(report.cleaned >= 1, "{report:?}");
    let meta = store.bucket(&id).unwrap().unwrap();
    assert_eq!(meta.state, BucketState::Archived { hot_deleted: true });
    assert!(meta.generation > a.generation);
}

#[test]
fn appends_to_an_archiving_bucket_are_refused_and_change_nothing() {
    let e = TestEngine::new(DAILY, "2024-03-01T12:00:00Z");
    e.engine.append("r", records("2024-03-01T00:00:00Z", 1, 3)).unwrap();
    e.pass();
    e.clock.set(t("2024-03-10T00:00:00Z"));
    let store = e.engine.store().clone();
    let id = store.buckets("r", None).unwrap()[0].id.clone();
    store.claim(id.clone(), "A".into(), e.clock.now(), 60_000_000).unwrap().unwrap();
    let before = store.rows(&id, None, usize::MAX).unwrap();
    let late = Record {
        partition_key: id.partition_key.clone(),
        event_time: t("2024-03-01T05:00:00Z"),
        sort_key: b"late".to_vec(),
        tenant: None,
        kind: None,
        body: "{}".into(),
    };
    let elsewhere = Record { event_time: t("2024-03-05T05:00:00Z"), ..late.clone() };
    let err = e.engine.append("r", vec![elsewhere, late]).unwrap_err();
    assert!(matches!(err, Error::BucketFenced { .. }), "{err}");
    assert_eq!(store.rows(&id, None, usize::MAX).unwrap(), before);
    assert_eq!(store.buckets("r", None).unwrap().len(), 3, "the other record of the refused batch was not applied");
}

#[test]
fn identical_duplicates_are_accepted_and_different_bodies_conflict() {
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    let input = records("2024-03-01T00:00:00Z", 1, 5);
    assert_eq!(e.engine.append("r", input.clone()).unwrap().appended, 5);
    let again = e.engine.append("r", input.clone()).unwrap();
    assert_eq!((again.appended, again.duplicates), (0, 5));
    let mut changed = input.clone();
    changed[2].body = r#"{"different":true}"#.into();
    changed.push(Record { sort_key: b"new".to_vec(), ..input[0].clone() });
    let err = e.engine.append("r", changed).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert_eq!(e.query_all("r"), sorted(input), "nothing of the refused batch applied");
}

#[test]
fn a_conflict_after_new_rows_undoes_them_and_keeps_the_stored_row() {
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    let input = records("2024-03-01T00:00:00Z", 1, 5);
    e.engine.append("r", input.clone()).unwrap();
    // New rows first, in the conflicting row's bucket and in a new one, then the conflict.
    let mut batch = vec![
        Record { sort_key: b"new-1".to_vec(), ..input[2].clone() },
        Record { event_time: input[0].event_time + 86_400_000_000, sort_key: b"new-2".to_vec(), ..input[0].clone() },
    ];
    batch.push(Record { body: r#"{"different":true}"#.into(), ..input[2].clone() });
    let err = e.engine.append("r", batch).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert_eq!(e.query_all("r"), sorted(input.clone()), "the refused batch left no row and changed none");
    assert_eq!(e.engine.store().buckets("r", None).unwrap().iter().map(|b| b.row_count).sum::<u64>(), 5);

    // The same identity twice in one batch with different bodies: refused whole.
    let twice = vec![
        Record { sort_key: b"twice".to_vec(), ..input[0].clone() },
        Record { sort_key: b"twice".to_vec(), body: r#"{"other":1}"#.into(), ..input[0].clone() },
    ];
    assert_eq!(e.engine.append("r", twice).unwrap_err().kind(), ErrorKind::Conflict);
    assert_eq!(e.query_all("r"), sorted(input.clone()));

    // Concurrent batches share a transaction: the refused one leaves no trace, the other lands.
    let good: Vec<Record> =
        (0..200).map(|n| Record { sort_key: format!("good-{n:03}").into_bytes(), ..input[1].clone() }).collect();
    let mut bad: Vec<Record> =
        (0..200).map(|n| Record { sort_key: format!("bad-{n:03}").into_bytes(), ..input[3].clone() }).collect();
    bad.push(Record { body: r#"{"different":true}"#.into(), ..input[3].clone() });
    let (good_result, bad_result) = std::thread::scope(|scope| {
        let good = scope.spawn(|| e.engine.append("r", good.clone()));
        let bad = scope.spawn(|| e.engine.append("r", bad));
        (good.join().unwrap(), bad.join().unwrap())
    });
    assert_eq!(good_result.unwrap().appended, 200);
    assert_eq!(bad_result.unwrap_err().kind(), ErrorKind::Conflict);
    let mut expected = input;
    expected.extend(good);
    assert_eq!(e.query_all("r"), sorted(expected));
}

#[test]
fn rows_stored_in_the_older_named_form_read_and_deduplicate_unchanged() {
    // Rows were first stored as named MessagePack maps; they are now written as arrays. A row
    // in the older form reads back, an identical append is a duplicate that leaves its bytes
    // as they were, and a different body is a conflict.
    use frostline::store::schema::{StoredRow, encode_value, row_key, rows_table, rows_table_name};
    use redb::ReadableTable as _;
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    let input = records("2024-03-01T00:00:00Z", 1, 1);
    e.engine.append("r", input.clone()).unwrap();
    let id = e.engine.store().buckets("r", None).unwrap()[0].id.clone();
    let key = row_key(input[0].event_time, &input[0].sort_key);
    let table = rows_table_name(&id);
    let named = encode_value(&StoredRow {
        tenant: input[0].tenant.clone(),
        kind: input[0].kind.clone(),
        body: input[0].body.clone(),
    })
    .unwrap();
    let stored_bytes = |e: &TestEngine| {
        let (key, table) = (key.clone(), table.clone());
        e.engine
            .store()
            .write(move |txn| {
                Ok(txn.open_table(rows_table(&table)).unwrap().get(key.as_slice()).unwrap().unwrap().value().to_vec())
            })
            .unwrap()
    };
    let (k, v, name) = (key.clone(), named.clone(), table.clone());
    e.engine
        .store()
        .write(move |txn| {
            txn.open_table(rows_table(&name)).unwrap().insert(k.as_slice(), v.as_slice()).unwrap();
            Ok(())
        })
        .unwrap();
    assert_eq!(e.query_all("r"), input);
    let again = e.engine.append("r", input.clone()).unwrap();
    assert_eq!((again.appended, again.duplicates), (0, 1));
    assert_eq!(stored_bytes(&e), named, "a duplicate leaves the stored bytes as they were");
    let changed = vec![Record { body: r#"{"changed":1}"#.into(), ..input[0].clone() }];
    assert_eq!(e.engine.append("r", changed).unwrap_err().kind(), ErrorKind::Conflict);
    assert_eq!(stored_bytes(&e), named);
    assert_eq!(e.query_all("r"), input);
}

/// A table `r` of UTC-day buckets where only the `n` newest buckets of a partition take
/// appends.
fn day_table_with_writable_buckets(n: u32) -> TestEngine {
    let policy = format!(
        "[[table]]\nid = \"r\"\nwritable_buckets = {n}\nstrategy = {{ plugin = \"builtin:calendar-day-utc\" }}\n"
    );
    TestEngine::new(&policy, "2024-03-10T00:00:00Z")
}

/// One record of partition `p` at `day` (RFC 3339).
fn day_record(day: &str) -> Record {
    Record {
        partition_key: b"p".to_vec(),
        event_time: t(day),
        sort_key: day.as_bytes().to_vec(),
        tenant: None,
        kind: None,
        body: "1".into(),
    }
}

#[test]
fn writable_buckets_guard_refuses_old_buckets_and_accepts_recent_ones() {
    let e = day_table_with_writable_buckets(2);
    e.engine.append("r", vec![day_record("2024-03-05T00:00:00Z")]).unwrap();
    // Obeyed: the previous day is among the 2 newest buckets.
    e.engine.append("r", vec![day_record("2024-03-04T10:00:00Z")]).unwrap();
    // Violated: two days back is not.
    let err = e.engine.append("r", vec![day_record("2024-03-03T10:00:00Z")]).unwrap_err();
    assert!(matches!(err, Error::BucketNotWritable { writable_buckets: 2, .. }), "{err}");
    // Another partition has its own newest buckets.
    e.engine.append("r", vec![Record { partition_key: b"q".to_vec(), ..day_record("2024-03-03T10:00:00Z") }]).unwrap();
}

/// A strategy that faults while the engine looks ahead for `writable_buckets` refuses the
/// batch with the fault and writes nothing. (The fault was taken as "no newer bucket exists",
/// and the record went into a bucket the guard refuses.)
#[test]
fn a_strategy_fault_while_looking_ahead_refuses_the_batch() {
    /// Delegates, but faults for every time from `from` on.
    struct FaultsFrom {
        real: std::sync::Arc<dyn frostline::model::BucketStrategy>,
        from: i64,
    }
    impl frostline::model::BucketStrategy for FaultsFrom {
        fn identity(&self) -> &frostline::model::StrategyIdentity {
            self.real.identity()
        }
        fn buckets_for(&self, times: &[i64]) -> frostline::Result<Vec<frostline::model::BucketDescriptor>> {
            if times.iter().any(|&t| t >= self.from) {
                return Err(Error::PluginFault {
                    plugin: "faulty".into(),
                    hash: "0".into(),
                    call: "buckets-for".into(),
                    cause: "trap: injected".into(),
                });
            }
            self.real.buckets_for(times)
        }
    }
    let e = day_table_with_writable_buckets(1);
    e.engine.append("r", vec![day_record("2024-03-05T00:00:00Z")]).unwrap();
    e.with_strategy("r", |real| std::sync::Arc::new(FaultsFrom { real, from: t("2024-03-05T00:00:00Z") }));
    // 2024-03-04 is no longer the newest bucket; finding that out asks about 2024-03-05.
    let err = e.engine.append("r", vec![day_record("2024-03-04T10:00:00Z")]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PluginFault, "{err}");
    assert_eq!(e.query_all("r").len(), 1, "nothing of the refused batch is written");
}

#[test]
fn concurrent_appends_are_group_committed_and_all_acknowledged() {
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    let engine = e.engine.clone();
    let threads: Vec<_> = (0..8)
        .map(|w| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let r = Record {
                        partition_key: format!("w{w}").into_bytes(),
                        event_time: t("2024-03-09T00:00:00Z") + i,
                        sort_key: format!("{i}").into_bytes(),
                        tenant: None,
                        kind: None,
                        body: format!("{i}"),
                    };
                    engine.append("r", vec![r]).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(e.query_all("r").len(), 400);
}

#[test]
fn the_cursor_stays_correct_when_a_bucket_is_archived_between_pages() {
    let e = TestEngine::new(DAILY, "2024-03-01T12:00:00Z");
    let input = records("2024-03-01T00:00:00Z", 4, 25);
    e.engine.append("r", input.clone()).unwrap();
    e.pass(); // plans; nothing due yet
    let page = |cursor| {
        runtime()
            .block_on(frostline::query::query(
                &e.engine.context(),
                frostline::query::QueryRequest { table: "r".into(), limit: 30, cursor, ..Default::default() },
            ))
            .unwrap()
    };
    let first = page(None);
    e.clock.set(t("2024-03-20T00:00:00Z"));
    assert_eq!(e.pass().archived, 12, "every bucket archived between the pages");
    let mut seen = first.records.clone();
    let mut cursor = first.next_cursor;
    while let Some(c) = cursor {
        let p = page(Some(c));
        seen.extend(p.records);
        cursor = p.next_cursor;
    }
    assert_eq!(seen, sorted(input));
}

/// A hot bucket is read in pages from the cursor on, not whole: records sharing one event time
/// across partitions, far more than a page, are each read exactly once, hot and archived.
#[test]
fn pages_through_many_records_at_one_instant_read_each_once() {
    let e = TestEngine::new(DAILY, "2024-03-01T12:00:00Z");
    let at = t("2024-03-01T06:00:00Z");
    let input: Vec<Record> = (0..3)
        .flat_map(|p| {
            (0..400).map(move |i| Record {
                partition_key: format!("p{p}").into_bytes(),
                event_time: at,
                sort_key: format!("{:04}", i % 200 + p).into_bytes(),
                tenant: None,
                kind: None,
                body: format!("{{\"i\":{i}}}"),
            })
        })
        .filter({
            let mut seen = std::collections::HashSet::new();
            move |r| seen.insert((r.partition_key.clone(), r.sort_key.clone()))
        })
        .collect();
    e.engine.append("r", input.clone()).unwrap();
    let read_all = || {
        let (mut seen, mut cursor) = (Vec::new(), None);
        loop {
            let page = runtime()
                .block_on(frostline::query::query(
                    &e.engine.context(),
                    frostline::query::QueryRequest { table: "r".into(), limit: 7, cursor, ..Default::default() },
                ))
                .unwrap();
            assert!(page.records.len() <= 7);
            seen.extend(page.records);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return seen,
            }
        }
    };
    assert_eq!(read_all(), sorted(input.clone()), "hot");
    e.clock.set(t("2024-03-20T00:00:00Z"));
    assert_eq!(e.pass().archived, 3);
    assert_eq!(read_all(), sorted(input), "archived");
}

#[test]
fn a_retention_plugin_fault_defers_planning_and_never_archives() {
    // A bucket whose plan failed stays unplanned: it is never due, so nothing is archived.
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    e.engine.append("r", records("2024-03-01T00:00:00Z", 1, 3)).unwrap();
    let store = e.engine.store().clone();
    assert_eq!(store.unplanned(100).unwrap().len(), 3);
    let id: BucketId = store.unplanned(1).unwrap()[0].clone();
    store.set_plans(vec![(id.clone(), Err("policy fault".into()))], 0).unwrap();
    assert_eq!(store.unplanned(100).unwrap().len(), 3, "a failed plan leaves the bucket unplanned");
    assert!(store.due(i64::MAX, 100).unwrap().is_empty(), "unplanned buckets are never due");
}

#[test]
fn a_pass_plans_at_most_its_limit_in_batches_and_the_next_pass_plans_the_rest() {
    use frostline::archive::PLAN_BUCKETS_PER_PASS_MAX;
    // One record per day: more buckets than a pass may plan. Nothing is due yet.
    let extra = 7;
    let buckets = PLAN_BUCKETS_PER_PASS_MAX + extra;
    let e = TestEngine::new(DAILY, "2000-01-01T00:00:00Z");
    let day = 86_400_000_000i64;
    let input: Vec<Record> = (0..buckets as i64)
        .map(|n| Record {
            partition_key: b"p0".to_vec(),
            event_time: t("2000-01-01T00:00:00Z") + n * day,
            sort_key: format!("{n:06}").into_bytes(),
            tenant: None,
            kind: None,
            body: "{}".into(),
        })
        .collect();
    e.engine.append("r", input).unwrap();
    let first = e.pass();
    assert_eq!(first.planned, PLAN_BUCKETS_PER_PASS_MAX as u64, "the limit holds: {first:?}");
    assert_eq!(e.engine.store().unplanned(usize::MAX).unwrap().len(), extra, "the limit is enforced");
    let second = e.pass();
    assert_eq!(second.planned, extra as u64);
    assert!(e.engine.store().unplanned(1).unwrap().is_empty());
    // Every bucket got the plan eligible-before gives it: due a day after it ends.
    let due = e.engine.store().due(i64::MAX, usize::MAX).unwrap();
    assert_eq!(due.len(), buckets);
    for (at, id) in due {
        let meta = e.engine.store().bucket(&id).unwrap().unwrap();
        assert_eq!(at, meta.descriptor.end + day, "{id}");
    }
}

#[test]
fn a_pass_reports_where_its_time_went() {
    let expiring = DAILY.replace("archive_after = \"1d\"", "archive_after = \"1d\", expire_after = \"20d\"");
    let e = TestEngine::new(&expiring, "2024-03-10T00:00:00Z");
    e.engine.append("r", records("2024-03-01T00:00:00Z", 2, 20)).unwrap();
    let report = e.pass();
    assert_eq!(report.archived, 6, "{report:?}");
    for (name, seconds) in report.seconds.named() {
        // Nothing is due to expire yet: the pass below times the expiries.
        if name != "expiry" {
            assert!(seconds > 0.0, "{name} took no time in a pass that archived: {:?}", report.seconds);
        }
    }
    e.clock.set(t("2024-05-01T00:00:00Z"));
    let expired = e.pass();
    assert!(expired.expired > 0, "{expired:?}");
    assert!(expired.seconds.get(Phase::Expiry) > 0.0, "expiry took no time in a pass that expired: {expired:?}");
    let json = serde_json::to_value(&report).unwrap();
    assert!(json["seconds"]["upload"].as_f64().unwrap() > 0.0, "the report names its phases: {json}");
    // A pass with nothing to do spends nothing archiving.
    let idle = e.pass();
    assert_eq!(idle.archived, 0);
    for phase in [Phase::Snapshot, Phase::Upload, Phase::Cleanup] {
        assert_eq!(idle.seconds.get(phase), 0.0, "{phase:?}");
    }
}

#[test]
fn a_newer_schema_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hot.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(frostline::store::schema::META)
            .unwrap()
            .insert("schema_version", 99u32.to_be_bytes().as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let err = frostline::store::Store::open(&path).err().unwrap().to_string();
    assert!(err.contains("schema version 99") && err.contains("newer"), "{err}");
}

#[test]
fn a_database_written_by_this_schema_reopens_with_its_rows() {
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    let input = records("2024-03-01T00:00:00Z", 1, 5);
    e.engine.append("r", input).unwrap();
    let path = e.engine.store().path().to_path_buf();
    drop(e.engine);
    let store = frostline::store::Store::open(&path).unwrap();
    assert_eq!(store.buckets("r", None).unwrap().iter().map(|b| b.row_count).sum::<u64>(), 5);
}

fn schema_1_fixture() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    schema_fixture(1)
}

/// A copy of `tests/fixtures/schema-N` (a data directory written by schema N, see its README)
/// in a fresh directory, `(dir, data, policies)`, with its archive put back where its
/// manifests say it is, `/tmp/frostline-fixture-schema-N/archive` (the URL its policy gives
/// the target `local`; every copy of the fixture shares those read-only objects).
fn schema_fixture(schema: u32) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    fn copy(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &to.join(entry.file_name()));
            } else {
                // Written aside and renamed: a test reading the shared archive never sees a
                // half-copied object.
                let aside = to.join(format!(".{}.{}", entry.file_name().to_string_lossy(), std::process::id()));
                std::fs::copy(entry.path(), &aside).unwrap();
                std::fs::rename(&aside, to.join(entry.file_name())).unwrap();
            }
        }
    }
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/fixtures/schema-{schema}"));
    let dir = tempfile::tempdir().unwrap();
    copy(&fixture.join("data"), &dir.path().join("data"));
    copy(&fixture.join("policies"), &dir.path().join("policies"));
    copy(&fixture.join("archive"), std::path::Path::new(&format!("/tmp/frostline-fixture-schema-{schema}/archive")));
    let (data, policies) = (dir.path().join("data"), dir.path().join("policies"));
    (dir, data, policies)
}

/// Opens a copy of a schema fixture whose table now archives to a target of the test's own
/// ("targets move, archives stay": the fixture's archives, shared by every copy, are still
/// read on `local`, which stays declared), on a clock after its hot buckets are due.
fn open_fixture_archiving_to_a_fresh_target(
    data: &std::path::Path,
    policies: &std::path::Path,
) -> std::sync::Arc<frostline::engine::Engine> {
    let fresh = format!("file://{}", data.parent().unwrap().join("fresh").display());
    let policy = std::fs::read_to_string(policies.join("tables.toml")).unwrap().replace(
        "[[table]]\nid = \"r\"",
        &format!("[[target]]\nname = \"fresh\"\nurl = \"{fresh}\"\n\n[[table]]\nid = \"r\"\ntarget = \"fresh\""),
    );
    assert!(policy.contains("target = \"fresh\""), "{policy}");
    std::fs::write(policies.join("tables.toml"), policy).unwrap();
    let clock = frostline::clock::ManualClock::new(t("2026-12-10T00:00:00Z"));
    frostline::engine::Engine::open_with(data, policies, Default::default(), clock, Default::default()).unwrap()
}

/// What `frostline query` answers for every record of the fixture's table, as the schema-1
/// binary was asked when the fixture was made.
fn query_fixture(data: &std::path::Path, policies: &std::path::Path) -> String {
    let (data, policies) = (data.to_str().unwrap(), policies.to_str().unwrap());
    let out = run_frostline(&[
        "query",
        "--data",
        data,
        "--policies",
        policies,
        "--table",
        "r",
        "--from",
        "2000-01-01T00:00:00Z",
        "--to",
        "2100-01-01T00:00:00Z",
        "--limit",
        "1000",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

fn schema_1_answer() -> String {
    schema_answer(1)
}

fn schema_answer(schema: u32) -> String {
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/fixtures/schema-{schema}/query.jsonl"));
    std::fs::read_to_string(fixture).unwrap()
}

/// The schema version a database records, and whether schema 1's `records` table is in it.
fn schema_of(data: &std::path::Path) -> (u32, bool) {
    use redb::{ReadableDatabase as _, TableHandle as _};
    let db = redb::Database::open(data.join("hot.redb")).unwrap();
    let read = db.begin_read().unwrap();
    let meta = read.open_table(frostline::store::schema::META).unwrap();
    let version = u32::from_be_bytes(meta.get("schema_version").unwrap().unwrap().value().try_into().unwrap());
    let records = read.list_tables().unwrap().any(|t| t.name() == "records");
    (version, records)
}

/// Upgrade path: a data directory written by schema 1 (every hot row in one `records` table,
/// made by 64ac5b4) is upgraded in place by the first open. The query answers byte for byte
/// what the schema-1 binary answered, no `records` table is left, and the hot buckets then
/// archive and clean up as schema-2 buckets (their tables dropped).
#[test]
fn a_data_directory_written_by_schema_1_is_upgraded_in_place() {
    let (_dir, data, policies) = schema_1_fixture();
    assert_eq!(schema_of(&data), (1, true));
    assert_eq!(query_fixture(&data, &policies), schema_1_answer());
    assert_eq!(schema_of(&data), (SCHEMA_VERSION, false));
    assert_eq!(query_fixture(&data, &policies), schema_1_answer(), "a second open changes nothing");

    let engine = open_fixture_archiving_to_a_fresh_target(&data, &policies);
    assert_eq!(rows_tables(engine.store()).len(), 3, "one table per hot bucket");
    // Passes plan the hot buckets (with their new target), then archive them.
    let reports: Vec<_> = (0..3).map(|_| run_pass(&engine)).collect();
    assert!(reports.iter().all(|r| r.errors.is_empty()), "{reports:?}");
    assert_eq!(reports.iter().map(|r| r.archived).sum::<u64>(), 3, "{reports:?}");
    assert!(rows_tables(engine.store()).is_empty());
    drop(engine);
    assert_eq!(query_fixture(&data, &policies), schema_1_answer());
}

/// A schema-1 directory whose `records` table holds a key that names no bucket is refused
/// before the upgrade changes anything: it stays at version 1 with every row in place, so the
/// binary that wrote it still opens it, and the error says what to do.
#[test]
fn a_schema_1_key_that_names_no_bucket_refuses_the_upgrade_before_it_starts() {
    let (_dir, data, _policies) = schema_1_fixture();
    {
        let db = redb::Database::open(data.join("hot.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(frostline::store::schema::SCHEMA_1_RECORDS)
            .unwrap()
            .insert(b"\xffnot a bucket".as_slice(), b"".as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let err = frostline::store::Store::open(&data.join("hot.redb")).err().unwrap().to_string();
    assert!(err.contains("names no bucket") && err.contains("did not start"), "{err}");
    assert_eq!(schema_of(&data), (1, true), "nothing changed");
}

/// An upgrade cut short (the process died after recording version 2 and moving some rows) is
/// finished by the next open: each row was in exactly one of the two places, and all of them
/// read back.
#[test]
fn a_schema_upgrade_cut_short_goes_on_at_the_next_open() {
    use redb::ReadableTable as _;
    let (_dir, data, policies) = schema_1_fixture();
    {
        let db = redb::Database::open(data.join("hot.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(frostline::store::schema::META)
            .unwrap()
            .insert("schema_version", 2u32.to_be_bytes().as_slice())
            .unwrap();
        // Move the first bucket's rows as the upgrade does, and stop.
        let mut records = txn.open_table(frostline::store::schema::SCHEMA_1_RECORDS).unwrap();
        let first: Vec<(Vec<u8>, Vec<u8>)> = records
            .iter()
            .unwrap()
            .take(2)
            .map(|e| e.unwrap())
            .map(|(k, v)| (k.value().to_vec(), v.value().to_vec()))
            .collect();
        assert_eq!(first.len(), 2);
        for (key, value) in &first {
            let mut reader = frostline::store::encoding::Reader::new(key);
            let id = BucketId::decode(&mut reader).unwrap();
            let name = frostline::store::schema::rows_table_name(&id);
            txn.open_table(frostline::store::schema::rows_table(&name))
                .unwrap()
                .insert(reader.rest(), value.as_slice())
                .unwrap();
            records.remove(key.as_slice()).unwrap();
        }
        drop(records);
        txn.commit().unwrap();
    }
    assert_eq!(schema_of(&data), (2, true));
    assert_eq!(query_fixture(&data, &policies), schema_1_answer());
    assert_eq!(schema_of(&data), (SCHEMA_VERSION, false));
}

/// Upgrade path: a data directory written by schema 2 (made by 7173ff8: the plan queue in
/// bucket key order, no index by end; partition keys with a space, `/`, `%`, `=` and
/// non-ASCII) is upgraded to schema 3 by the first open: every bucket is indexed by its end,
/// the buckets schema 2 had queued for a plan are in the new queue (and schema 2's queue is
/// gone), the query answers byte for byte what the schema-2 binary answered, and the hot
/// buckets then plan and archive.
#[test]
fn a_data_directory_written_by_schema_2_is_upgraded_in_place() {
    use redb::{ReadableDatabase as _, ReadableTableMetadata as _, TableHandle as _};
    let (_dir, data, policies) = schema_fixture(2);
    assert_eq!(schema_of(&data).0, 2);
    assert_eq!(query_fixture(&data, &policies), schema_answer(2));
    assert_eq!(schema_of(&data).0, SCHEMA_VERSION);
    {
        let db = redb::Database::open(data.join("hot.redb")).unwrap();
        let read = db.begin_read().unwrap();
        assert!(!read.list_tables().unwrap().any(|t| t.name() == "unplanned"), "schema 2's queue is gone");
        let buckets = read.open_table(frostline::store::schema::BUCKETS).unwrap().len().unwrap();
        assert_eq!(buckets, 15, "12 archived buckets and 3 hot ones");
        assert_eq!(read.open_table(frostline::store::schema::BUCKETS_BY_END).unwrap().len().unwrap(), buckets);
        assert_eq!(read.open_table(frostline::store::schema::PLAN_QUEUE).unwrap().len().unwrap(), 3, "the hot ones");
    }
    assert_eq!(query_fixture(&data, &policies), schema_answer(2), "a second open changes nothing");
    let engine = open_fixture_archiving_to_a_fresh_target(&data, &policies);
    let report = run_pass(&engine);
    assert!(report.errors.is_empty(), "{report:?}");
    // The policy changed (a new target), so every bucket is planned again; the hot ones archive.
    assert_eq!((report.planned, report.archived), (15, 3), "{report:?}");
    drop(engine);
    assert_eq!(query_fixture(&data, &policies), schema_answer(2));
}

/// Upgrade path: a data directory written by schema 3 (made by eb1585c, before the status
/// tallies; partition keys with a space, `/`, `%`, `=` and non-ASCII) is upgraded to the
/// current schema by the first open: the status reads from the tallies what the schema-3
/// binary counted by visiting every bucket (12 archived buckets of 24 rows, 3 hot of 6), the
/// tallies agree with the rows, the query answers byte for byte what the schema-3 binary
/// answered, and after the hot buckets archive the tallies have followed them.
#[test]
fn a_data_directory_written_by_schema_3_is_upgraded_in_place() {
    upgraded_in_place_with_its_tallies(3);
}

/// The same for a data directory written by schema 4 (made by bcdeea7: the tallies without
/// each table's longest bucket, which the upgrade to schema 5 counts, and the queries seek by).
#[test]
fn a_data_directory_written_by_schema_4_is_upgraded_in_place() {
    upgraded_in_place_with_its_tallies(4);
}

/// The same for a data directory written by schema 5 (made by 2da8f67: the tallies
/// without the index of each state's buckets by start, which the upgrade to schema 6 builds
/// and a listing of one state pages through).
#[test]
fn a_data_directory_written_by_schema_5_is_upgraded_in_place() {
    upgraded_in_place_with_its_tallies(5);
}

/// The same for a data directory written by schema 6 (made by d64124c: the tallies without
/// the index of the archived buckets by hash, which the upgrade to schema 7 builds and a
/// verification's sample seeks).
#[test]
fn a_data_directory_written_by_schema_6_is_upgraded_in_place() {
    upgraded_in_place_with_its_tallies(6);
}

fn upgraded_in_place_with_its_tallies(schema: u32) {
    let (_dir, data, policies) = schema_fixture(schema);
    assert_eq!(schema_of(&data).0, schema);
    assert_eq!(query_fixture(&data, &policies), schema_answer(schema));
    assert_eq!(schema_of(&data).0, SCHEMA_VERSION);
    let counts = |engine: &frostline::engine::Engine| -> Vec<(String, u64, u64)> {
        assert_eq!(engine.store().tally_differences().unwrap(), Vec::<String>::new());
        let status = frostline::ops::status::collect(engine).unwrap();
        status.tables[0].states.iter().map(|(state, c)| (state.clone(), c.buckets, c.rows)).collect()
    };
    let engine = open_fixture_archiving_to_a_fresh_target(&data, &policies);
    assert_eq!(counts(&engine), [("archived".to_string(), 12, 24), ("hot".to_string(), 3, 6)]);
    // One state's buckets page by start, then partition (schema 6's index, built by the upgrade).
    let page = |state: &str, limit| {
        let request = frostline::ops::buckets::BucketsRequest {
            table: "r".into(),
            state: Some(state.into()),
            partition: None,
            limit,
        };
        let page = frostline::ops::buckets::list(&engine, request).unwrap();
        let places = page.buckets.iter().map(|b| (b.place.start.clone(), b.place.partition_key.clone()));
        (places.collect::<Vec<_>>(), page.truncated)
    };
    let (archived, more) = page("archived", 4);
    assert!(more, "12 archived buckets, a page of 4");
    let days_and_partitions: Vec<(&str, String)> = ["p0", "p1", "p2", "p0"]
        .iter()
        .enumerate()
        .map(|(i, p)| (if i < 3 { "2024-03-01" } else { "2024-03-02" }, format!("site a/{p}%=é")))
        .collect();
    assert_eq!(
        archived.iter().map(|(start, partition)| (&start[..10], partition.clone())).collect::<Vec<_>>(),
        days_and_partitions
    );
    assert_eq!(page("hot", 10).0.len(), 3);
    // A sample of 2 of the 12 seeks schema 7's index by hash, built by the upgrade.
    let verdicts =
        runtime().block_on(frostline::archive::verify::verify(&engine.context(), Some("r".into()), Some(2), |_| {}));
    let verdicts = verdicts.unwrap();
    assert_eq!(verdicts.iter().filter(|v| v.ok && v.rows == 2).count(), 2, "{verdicts:?}");
    let report = run_pass(&engine);
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!((report.archived, report.cleaned), (3, 3), "{report:?}");
    assert_eq!(counts(&engine), [("archived".to_string(), 15, 30)]);
    assert_eq!(engine.store().longest_bucket("r").unwrap(), Some(86_400_000_000), "day buckets");
    drop(engine);
    assert_eq!(query_fixture(&data, &policies), schema_answer(schema), "a second open changes nothing");
}

#[test]
fn a_second_open_of_the_same_database_is_refused() {
    let e = TestEngine::new(DAILY, "2024-03-10T00:00:00Z");
    let err = frostline::store::Store::open(e.engine.store().path()).err().unwrap();
    assert!(matches!(err, Error::AlreadyOpen { .. }), "{err}");
    assert!(err.to_string().contains("already open in another process"));
}

/// Regression: the lease was renewed only by a real-time timer, while leases expire on the
/// engine's clock; a claim whose steps took longer than the lease on that clock lost it even
/// though each step was short. Renewal now follows the engine's clock at every step: two
/// uploads that each take 45 s (lease 60 s, renewal every 20 s) keep the lease; one that
/// takes longer than the whole lease loses it, and a later pass completes.
#[test]
fn the_lease_is_renewed_on_the_engines_clock_and_lost_when_a_step_outlasts_it() {
    // One bucket at a time: a stall moves the one clock every concurrent claim runs on.
    let settings = frostline::settings::Settings { archive_concurrency: 1, ..Default::default() };
    let e = TestEngine::open_with_settings(DAILY, "2024-03-10T00:00:00Z", &[], Default::default(), settings)
        .unwrap_or_else(|err| panic!("{err}"));
    let faulty = FaultyBackend::new(e.backend("r"));
    faulty.set_clock(e.clock.clone());
    e.with_backend("r", faulty.clone());
    let input = records("2024-03-01T00:00:00Z", 1, 10);
    e.engine.append("r", input.clone()).unwrap();
    faulty.add(Op::Put, "", Fault::Stall(45_000_000), Some(2));
    let report = e.pass();
    assert!(report.archived > 0 && report.errors.is_empty(), "renewed between the two slow uploads: {report:?}");
    let buckets = report.archived;

    let more = records("2024-03-02T00:00:00Z", 1, 10);
    e.engine.append("r", more.clone()).unwrap();
    faulty.add(Op::Put, "", Fault::Stall(61_000_000), Some(1));
    let report = e.pass();
    assert_eq!(report.archived, buckets - 1, "the other buckets are claimed after the stall: {report:?}");
    assert!(report.errors.iter().any(|err| err.contains("lease")), "the lease was lost: {report:?}");
    e.clock.advance(120_000_000);
    let report = e.pass();
    assert_eq!(report.archived, 1, "a later pass takes the bucket over: {report:?}");
    let mut all = input;
    all.extend(more);
    assert_eq!(e.query_all("r"), sorted(all));
}

/// Every random choice of the engine (owner tokens, hold ids, verify samples) comes from one
/// source that `Settings::random_seed` seeds, so a simulation seed replays them.
#[test]
fn the_engines_random_choices_replay_with_its_seed() {
    let open = |seed: u64| {
        let settings = frostline::settings::Settings { random_seed: Some(seed), ..Default::default() };
        TestEngine::open_with_settings(DAILY, "2024-03-10T00:00:00Z", &[], Default::default(), settings).unwrap()
    };
    let choices = |e: &TestEngine| {
        let request = frostline::ops::holds::HoldRequest {
            table: "r".into(),
            partition: None,
            tenant: None,
            bucket: None,
            reason: "audit".into(),
            placed_by: "test".into(),
        };
        let hold = frostline::ops::holds::place_hold(&e.engine, request, "test").unwrap();
        (e.engine.new_owner_token(), hold.id)
    };
    let (a, b, c) = (open(7), open(7), open(8));
    assert_eq!(choices(&a), choices(&b));
    assert_ne!(choices(&a), choices(&c));
}

/// A listing (and a retention report) of one partition reads that partition's buckets from
/// the index by start, up to its page: it answers exactly what the table-wide listing answers
/// for the partition (the same buckets in the same order, the state filter, the page's cut
/// and `truncated`), for partition keys with `/`, `%`, `=`, spaces and non-ASCII.
#[test]
fn a_partition_listing_answers_what_the_table_listing_answers_for_it() {
    use frostline::ops::buckets::{BucketsRequest, RetentionRequest, list, retention};
    let e = TestEngine::new(DAILY, "2024-03-20T00:00:00Z");
    let mut input = records("2024-03-10T00:00:00Z", 12, 3);
    for r in &mut input {
        r.partition_key = USER_KEYS[usize::from(r.partition_key[1] - b'0')].as_bytes().to_vec();
    }
    e.engine.append("r", input).unwrap();
    let report = e.pass();
    assert!(report.archived > 0 && report.errors.is_empty(), "{report:?}");
    for key in USER_KEYS {
        for state in [None, Some("hot"), Some("archived")] {
            let everything = list(
                &e.engine,
                BucketsRequest { table: "r".into(), state: state.map(str::to_string), partition: None, limit: 10_000 },
            )
            .unwrap();
            let of_key = of_partition(&everything.buckets, key);
            assert!(!of_key.is_empty(), "{key} {state:?}");
            for limit in [1, 3, of_key.len(), 1_000] {
                let page = list(
                    &e.engine,
                    BucketsRequest {
                        table: "r".into(),
                        state: state.map(str::to_string),
                        partition: Some(key.into()),
                        limit,
                    },
                )
                .unwrap();
                let got = of_partition(&page.buckets, key);
                assert_eq!(got.len(), page.buckets.len(), "only the partition's");
                assert_eq!(got, of_key[..limit.min(of_key.len())], "{key} {state:?} {limit}");
                assert_eq!(page.truncated, of_key.len() > limit, "{key} {state:?} {limit}");
            }
        }
        let everything =
            retention(&e.engine, RetentionRequest { table: "r".into(), partition: None, limit: 10_000 }).unwrap();
        let of_key = of_partition(&everything.buckets, key);
        let page = retention(&e.engine, RetentionRequest { table: "r".into(), partition: Some(key.into()), limit: 5 })
            .unwrap();
        assert_eq!(page.buckets.len(), 5);
        assert_eq!(of_partition(&page.buckets, key), of_key[..5], "{key}");
        assert!(page.truncated);
    }
}

/// The entries of a listing that name partition `key`, as JSON (as the API answers them).
fn of_partition<T: serde::Serialize>(entries: &[T], key: &str) -> Vec<serde_json::Value> {
    entries.iter().map(|b| serde_json::to_value(b).unwrap()).filter(|v| v["partition_key"] == key).collect()
}

/// A query reads the buckets its range reaches from an index (one partition's by start, from
/// the table's longest bucket before the range; a table's by end), a chunk at a time until the
/// page is full, instead of every bucket of the table: it answers exactly the records of the
/// range, in order, page after page, hot and archived, for partition keys with `/`, `%`, `=`,
/// spaces and non-ASCII, and with month buckets that start before the range and reach into it.
#[test]
fn a_query_answers_every_record_of_its_range_from_the_buckets_the_range_reaches() {
    let policy = r#"
[[table]]
id = "m"
strategy = { plugin = "builtin:calendar-month-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1d" } }

[[table]]
id = "d"
strategy = { plugin = "builtin:calendar-day-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1d" } }
"#;
    let e = TestEngine::new(policy, "2024-04-20T00:00:00Z");
    // Every 7 hours from January to June 2024 (months and days of every length), in each
    // partition, with two records at each instant in one of them.
    let mut input = Vec::new();
    let start = t("2024-01-01T00:00:00Z");
    for n in 0..(182 * 24 / 7) {
        for (p, key) in USER_KEYS.iter().enumerate() {
            let copies = if p == 0 { 2 } else { 1 };
            for c in 0..copies {
                input.push(Record {
                    partition_key: key.as_bytes().to_vec(),
                    event_time: start + n as i64 * 7 * 3_600_000_000,
                    sort_key: format!("s{n:05}-{c}").into_bytes(),
                    tenant: None,
                    kind: None,
                    body: format!(r#"{{"n":{n},"p":{p}}}"#),
                });
            }
        }
    }
    for table in ["m", "d"] {
        for chunk in input.chunks(1_000) {
            e.engine.append(table, chunk.to_vec()).unwrap();
        }
    }
    let mut archived = 0;
    loop {
        let report = e.pass();
        assert!(report.errors.is_empty(), "{report:?}");
        archived += report.archived;
        if !report.made_progress() {
            break;
        }
    }
    // January to March in months, and 1 January to 18 April in days, in 3 partitions.
    assert_eq!(archived, 3 * 3 + 109 * 3, "the months and days before April are archived");
    let ranges = [
        (None, None),
        (Some("2024-02-14T13:00:00Z"), Some("2024-03-16T05:00:00Z")),
        (Some("2024-03-31T23:00:00Z"), None),
        (None, Some("2024-02-01T00:00:00Z")),
        (Some("2024-04-30T20:00:00Z"), Some("2024-05-01T10:00:00Z")),
        (Some("2024-06-29T00:00:00Z"), Some("2030-01-01T00:00:00Z")),
        (Some("2025-01-01T00:00:00Z"), None),
    ];
    let partitions = [None, Some(USER_KEYS[0]), Some(USER_KEYS[2])];
    for table in ["m", "d"] {
        for (from, to) in ranges {
            for partition in partitions {
                let expected: Vec<Record> = sorted(
                    input
                        .iter()
                        .filter(|r| {
                            from.is_none_or(|f| r.event_time >= t(f))
                                && to.is_none_or(|u| r.event_time < t(u))
                                && partition.is_none_or(|p| r.partition_key == p.as_bytes())
                        })
                        .cloned()
                        .collect(),
                );
                // Pages of one record only where they are few (each is a query).
                let limits = [1, 7, 500, 100_000].into_iter().filter(|&l| l > 1 || expected.len() <= 200);
                for limit in limits {
                    let mut got = Vec::new();
                    let mut cursor = None;
                    loop {
                        let request = frostline::query::QueryRequest {
                            table: table.into(),
                            partition_key: partition.map(|p| p.as_bytes().to_vec()),
                            from: from.map(t),
                            to: to.map(t),
                            limit,
                            cursor: cursor.take(),
                            ..Default::default()
                        };
                        let page = runtime().block_on(frostline::query::query(&e.engine.context(), request)).unwrap();
                        assert!(page.records.len() <= limit);
                        got.extend(page.records);
                        match page.next_cursor {
                            Some(next) => cursor = Some(next),
                            None => break,
                        }
                        assert!(got.len() <= expected.len() + 1, "{table} {from:?} {to:?} {partition:?} {limit}");
                    }
                    let same = got == expected;
                    assert!(same, "{table} {from:?} {to:?} {partition:?} {limit}: {} of {}", got.len(), expected.len());
                }
            }
        }
    }
}

/// A table-wide listing (and retention report) pages its buckets by start then partition key
/// from the index by end, and a listing of one state from the tallies' index by state: each
/// answers exactly what sorting every bucket of the table answers (the same buckets in the same
/// order, the state filter, the page's cut and `truncated`), with month and day buckets and
/// partition keys with `/`, `%`, `=`, spaces and non-ASCII.
#[test]
fn a_table_listing_answers_what_sorting_every_bucket_answers() {
    use frostline::ops::buckets::{BucketsRequest, RetentionRequest, list, retention};
    let policy = r#"
[[table]]
id = "m"
strategy = { plugin = "builtin:calendar-month-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1d", expire_after = "60d" } }

[[table]]
id = "d"
strategy = { plugin = "builtin:calendar-day-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1d", expire_after = "60d" } }
"#;
    let e = TestEngine::new(policy, "2024-04-20T00:00:00Z");
    let mut input = Vec::new();
    for n in 0..(150 * 24 / 17) {
        for (p, key) in USER_KEYS.iter().enumerate() {
            // Partition 1 starts later: the tables' buckets do not all line up.
            if p == 1 && n < 100 {
                continue;
            }
            input.push(Record {
                partition_key: key.as_bytes().to_vec(),
                event_time: t("2024-01-01T00:00:00Z") + n as i64 * 17 * 3_600_000_000,
                sort_key: format!("s{n:05}").into_bytes(),
                tenant: None,
                kind: None,
                body: "{}".into(),
            });
        }
    }
    for table in ["m", "d"] {
        e.engine.append(table, input.clone()).unwrap();
    }
    while e.pass().made_progress() {}
    let key = |v: &serde_json::Value| (v["partition_key"].clone(), v["bucket_key"].clone(), v["state"].clone());
    for table in ["m", "d"] {
        let mut every = e.engine.store().buckets(table, None).unwrap();
        every.sort_by(|a, b| (a.descriptor.start, &a.id.partition_key).cmp(&(b.descriptor.start, &b.id.partition_key)));
        let states: std::collections::BTreeSet<&str> = every.iter().map(|b| b.state.name()).collect();
        assert!(states.len() >= 3, "{table}: {states:?}");
        for state in [None, Some("hot"), Some("archived"), Some("expired"), Some("archiving")] {
            let matching: Vec<_> = every
                .iter()
                .filter(|b| state.is_none_or(|s| b.state.name() == s))
                .map(|b| serde_json::json!({"partition_key": String::from_utf8_lossy(&b.id.partition_key), "bucket_key": b.id.bucket_key, "state": b.state.name()}))
                .map(|v| key(&v))
                .collect();
            for limit in [1, 3, 50, matching.len(), 10_000] {
                let request =
                    BucketsRequest { table: table.into(), state: state.map(str::to_string), partition: None, limit };
                let page = list(&e.engine, request).unwrap();
                let got: Vec<_> = page.buckets.iter().map(|b| key(&serde_json::to_value(b).unwrap())).collect();
                let want = &matching[..limit.min(matching.len())];
                assert_eq!(got, want, "{table} {state:?} {limit}");
                assert_eq!(page.truncated, matching.len() > limit, "{table} {state:?} {limit}");
            }
        }
        for limit in [1, 7, every.len(), 10_000] {
            let page = retention(&e.engine, RetentionRequest { table: table.into(), partition: None, limit }).unwrap();
            let got: Vec<_> = page.buckets.iter().map(|b| key(&serde_json::to_value(b).unwrap())).collect();
            let want: Vec<_> = every[..limit.min(every.len())]
                .iter()
                .map(|b| key(&serde_json::json!({"partition_key": String::from_utf8_lossy(&b.id.partition_key), "bucket_key": b.id.bucket_key, "state": b.state.name()})))
                .collect();
            assert_eq!(got, want, "{table} retention {limit}");
            assert_eq!(page.truncated, every.len() > limit);
        }
    }
}

/// `verify` checks every archived bucket of the store or of one table, or a random sample of
/// them: chosen from the tallies' index by state, so a sample reads about itself (the scale
/// benchmark times a sample over 1,000,000 buckets against one over 1,000).
#[test]
fn a_verification_checks_every_archived_bucket_or_a_random_sample_of_them() {
    use frostline::archive::verify::verify;
    use std::collections::BTreeSet;
    let policy = r#"
[[table]]
id = "a"
strategy = { plugin = "builtin:calendar-day-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1d" } }

[[table]]
id = "b"
strategy = { plugin = "builtin:calendar-day-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1d" } }
"#;
    let e = TestEngine::new(policy, "2024-01-12T00:00:00Z");
    // Ten days of each partition: the first nine archive, the last stays hot.
    let input: Vec<Record> = (0..10)
        .flat_map(|day| {
            USER_KEYS.iter().map(move |key| Record {
                partition_key: key.as_bytes().to_vec(),
                event_time: t("2024-01-02T12:00:00Z") + day * 86_400_000_000,
                sort_key: format!("s{day}").into_bytes(),
                tenant: None,
                kind: None,
                body: format!("{{\"day\":{day}}}"),
            })
        })
        .collect();
    for table in ["a", "b"] {
        e.engine.append(table, input.clone()).unwrap();
    }
    while e.pass().made_progress() {}
    let archived = |table: &str| -> BTreeSet<String> {
        let buckets = e.engine.store().buckets(table, None).unwrap();
        assert!(buckets.iter().any(|b| b.state == BucketState::Hot), "{table} keeps hot buckets");
        buckets.iter().filter(|b| matches!(b.state, BucketState::Archived { .. })).map(|b| b.id.display()).collect()
    };
    let (in_a, in_b) = (archived("a"), archived("b"));
    assert_eq!((in_a.len(), in_b.len()), (27, 27));
    let checked = |table: Option<&str>, sample: Option<usize>| -> Vec<String> {
        let verdicts =
            runtime().block_on(verify(&e.engine.context(), table.map(str::to_string), sample, |_| {})).unwrap();
        assert!(verdicts.iter().all(|v| v.ok && v.rows == 1), "{verdicts:?}");
        let total = frostline::ops::archives::verify_total(&e.engine, table, sample).unwrap();
        assert_eq!(total, verdicts.len(), "the progress bar's length");
        verdicts.into_iter().map(|v| v.bucket).collect()
    };
    let every: BTreeSet<String> = checked(None, None).into_iter().collect();
    assert_eq!(every, in_a.union(&in_b).cloned().collect());
    assert_eq!(checked(Some("a"), None).into_iter().collect::<BTreeSet<_>>(), in_a);
    assert!(checked(Some("nope"), None).is_empty());
    for sample in [0, 1, 5, 27, 30] {
        for table in [Some("a"), None] {
            let chosen = checked(table, Some(sample));
            let distinct: BTreeSet<String> = chosen.iter().cloned().collect();
            let of = if table.is_some() { &in_a } else { &every };
            assert_eq!(chosen.len(), sample.min(of.len()), "{table:?} {sample}");
            assert_eq!(distinct.len(), chosen.len(), "a sample checks each bucket once: {chosen:?}");
            assert!(distinct.is_subset(of), "{table:?} {sample}: {chosen:?}");
        }
    }
    // Each sample is drawn afresh, from every archived bucket alike.
    let drawn: BTreeSet<String> = (0..40).flat_map(|_| checked(None, Some(1))).collect();
    assert!(drawn.len() > 10, "40 samples of one drew only {drawn:?}");
    assert!(drawn.iter().any(|b| in_b.contains(b)) && drawn.iter().any(|b| in_a.contains(b)), "{drawn:?}");
}

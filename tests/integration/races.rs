//! Races inside one engine: two workers for one bucket, one stalled past its lease. Exactly
//! one publication; the stale worker's publish and delete are refused.

use std::time::Duration;

use frostline::model::BucketState;
use frostline::storage::faults::{Fault, FaultyBackend, Op};

use crate::support::*;

const DAILY: &str = r#"
[[table]]
id = "r"
strategy = { plugin = "builtin:calendar-day-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1d" } }
"#;

#[test]
fn two_workers_racing_for_one_bucket_publish_exactly_once() {
    let e = TestEngine::new(DAILY, "2024-03-01T12:00:00Z");
    let input: Vec<_> =
        records("2024-03-01T00:00:00Z", 1, 30).into_iter().filter(|r| r.partition_key == b"p0").collect();
    e.engine.append("r", input.clone()).unwrap();
    e.pass(); // plan
    e.clock.set(t("2024-03-10T00:00:00Z"));
    let faulty = FaultyBackend::new(e.backend("r"));
    e.with_backend("r", faulty.clone());
    // Worker A stalls in its first segment upload for a while (real time).
    faulty.add(Op::Put, "seg-", Fault::Delay(Duration::from_millis(1500)), Some(1));
    let engine = e.engine.clone();
    let clock = e.clock.clone();
    let (a, b) = runtime().block_on(async move {
        let a = tokio::spawn({
            let engine = engine.clone();
            async move { frostline::archive::run_pass(&engine.context(), "worker-A").await }
        });
        // While A is stalled, its lease runs out and B takes the bucket over.
        tokio::time::sleep(Duration::from_millis(300)).await;
        clock.advance(engine.settings().lease_us + 1_000_000);
        let b = frostline::archive::run_pass(&engine.context(), "worker-B").await;
        (a.await.unwrap(), b)
    });
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(b.archived, 1, "B publishes: {b:?}");
    assert_eq!(a.archived, 0, "A is refused: {a:?}");
    assert!(a.errors.iter().any(|e| e.contains("lease")), "A's refusal names the lease: {a:?}");
    let buckets = e.engine.store().buckets("r", None).unwrap();
    assert_eq!(buckets.len(), 1);
    let meta = &buckets[0];
    assert_eq!(meta.state, BucketState::Archived { hot_deleted: true });
    assert_eq!(meta.generation, 2, "B's generation published");
    assert!(meta.manifest_key.as_ref().unwrap().contains("-g0000000002-"));
    let published =
        e.engine.store().outbox(1000).unwrap().into_iter().filter(|ev| ev.kind == "bucket_archived").count();
    assert_eq!(published, 1, "exactly one publication");
    assert_eq!(meta.attempts, 0, "A's late deferral did not touch B's bucket");
    assert_eq!(e.query_all("r"), sorted(input));
}

/// A pass works on up to `ARCHIVER_CONCURRENCY` buckets at once, each under its own claim:
/// uploads of different buckets overlap, every bucket is archived once (generation 1), and one
/// bucket at a time never overlaps.
#[test]
fn a_pass_archives_several_buckets_at_once_each_under_its_own_claim() {
    for concurrency in [1, 4] {
        let settings = frostline::settings::Settings { archive_concurrency: concurrency, ..Default::default() };
        let e = TestEngine::open_with_settings(DAILY, "2024-03-01T12:00:00Z", &[], Default::default(), settings)
            .unwrap_or_else(|err| panic!("{err}"));
        let input = records("2024-03-01T00:00:00Z", 8, 3);
        e.engine.append("r", input.clone()).unwrap();
        e.pass(); // plan
        e.clock.set(t("2024-03-20T00:00:00Z"));
        let faulty = FaultyBackend::new(e.backend("r"));
        e.with_backend("r", faulty.clone());
        // Every manifest upload takes a while, so buckets worked on at once overlap in it.
        faulty.add(Op::Put, "manifest-", Fault::Delay(Duration::from_millis(100)), None);
        let report = e.pass();
        assert!(report.errors.is_empty(), "{report:?}");
        let buckets = e.engine.store().buckets("r", None).unwrap();
        assert_eq!(report.archived as usize, buckets.len(), "{report:?}");
        assert!(buckets.iter().all(|b| b.state == BucketState::Archived { hot_deleted: true } && b.generation == 1));
        if concurrency == 1 {
            assert_eq!(faulty.puts_in_flight_max(), 1);
        } else {
            assert!(faulty.puts_in_flight_max() > 1, "uploads never overlapped");
            assert!(faulty.puts_in_flight_max() <= concurrency);
        }
        assert_eq!(sorted(query_engine(&e.engine, "r")), sorted(input));
    }
}

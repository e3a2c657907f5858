//! A seeded randomized run of the coordinator against a reference model (a BTreeMap of every
//! acknowledged append), with a manual clock and the fault-injecting store: errors, latency,
//! corrupted reads and writes that land but report failure (lost acknowledgements).
//!
//! Replay one seed:   FROSTLINE_SIM_SEED=1234 cargo test --test integration simulation
//! More seeds or ops: FROSTLINE_SIM_SEEDS=200 FROSTLINE_SIM_OPS=5000 cargo test --test integration simulation

use std::collections::BTreeMap;
use std::time::Duration;

use frostline::model::{BucketState, Record};
use frostline::storage::faults::{Fault, FaultyBackend, Op};
use frostline::{Error, ErrorKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::support::*;

const SIM_SEEDS_DEFAULT: u64 = 12;
const SIM_OPS_DEFAULT: usize = 2_000;
const DAY_US: i64 = 86_400_000_000;

const POLICY: &str = r#"
[[table]]
id = "r"
strategy = { plugin = "builtin:calendar-day-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1d" } }
"#;

type Identity = (Vec<u8>, i64, Vec<u8>);

fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn simulation_matches_the_reference_model() {
    let ops = env_number("FROSTLINE_SIM_OPS").unwrap_or(SIM_OPS_DEFAULT);
    let seeds: Vec<u64> = match env_number::<u64>("FROSTLINE_SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let count = env_number("FROSTLINE_SIM_SEEDS").unwrap_or(SIM_SEEDS_DEFAULT);
            // Fresh seeds each run, printed on failure; plus fixed ones that always run.
            let base: u64 = rand::random();
            (0..count).map(|i| if i < 4 { i } else { base.wrapping_add(i) }).collect()
        }
    };
    for seed in seeds {
        if let Err(why) = std::panic::catch_unwind(|| run_seed(seed, ops)) {
            let message = why
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| why.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!(
                "simulation seed {seed} failed: {message}\nreplay with: FROSTLINE_SIM_SEED={seed} FROSTLINE_SIM_OPS={ops} \
                 cargo test --test integration simulation"
            );
        }
    }
}

fn random_batch(rng: &mut StdRng, base: i64, now: i64) -> Vec<Record> {
    let n = rng.random_range(1..=12);
    let horizon_days = ((now - base) / DAY_US + 3).clamp(1, 40);
    (0..n)
        .map(|_| Record {
            partition_key: format!("p{}", rng.random_range(0..3)).into_bytes(),
            event_time: base + rng.random_range(0..horizon_days) * DAY_US + rng.random_range(0..24) * 3_600_000_000,
            sort_key: format!("k{}", rng.random_range(0..6)).into_bytes(),
            tenant: None,
            kind: None,
            body: format!(r#"{{"v":{}}}"#, rng.random_range(0..3)),
        })
        .collect()
}

fn random_fault(rng: &mut StdRng) -> (Op, &'static str, Fault) {
    let op = [Op::Put, Op::Get, Op::Put, Op::Get, Op::List][rng.random_range(0..5)];
    let key = ["seg-", "manifest-", ""][rng.random_range(0..3)];
    let fault = match rng.random_range(0..4) {
        0 => Fault::Error,
        1 => Fault::LandThenError,
        2 => Fault::CorruptRead,
        _ => Fault::Delay(Duration::from_millis(rng.random_range(1..20))),
    };
    (op, key, fault)
}

fn check_reads(e: &TestEngine, model: &BTreeMap<Identity, String>, faults_active: bool, seed: u64, op: usize) {
    let mut got = Vec::new();
    let mut cursor = None;
    loop {
        let page = runtime().block_on(frostline::query::query(
            &e.engine,
            frostline::query::QueryRequest {
                table: "r".into(),
                limit: 53,
                cursor: cursor.clone(),
                ..Default::default()
            },
        ));
        match page {
            Ok(page) => {
                got.extend(page.records);
                match page.next_cursor {
                    Some(c) => cursor = Some(c),
                    None => break,
                }
            }
            // A read through a faulty store may fail, loudly; it must never be wrong.
            Err(_) if faults_active => return,
            Err(err) => panic!("seed {seed} op {op}: query failed without faults: {err}"),
        }
    }
    let expected: Vec<(Identity, String)> = {
        let mut v: Vec<_> = model.iter().map(|(k, b)| (k.clone(), b.clone())).collect();
        v.sort_by(|a, b| (a.0.1, &a.0.2, &a.0.0).cmp(&(b.0.1, &b.0.2, &b.0.0)));
        v
    };
    let actual: Vec<(Identity, String)> =
        got.into_iter().map(|r| ((r.partition_key, r.event_time, r.sort_key), r.body)).collect();
    assert_eq!(actual.len(), expected.len(), "seed {seed} op {op}: record count differs");
    assert_eq!(actual, expected, "seed {seed} op {op}: records differ from the model");
}

fn run_seed(seed: u64, ops: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let base = t("2024-01-01T00:00:00Z");
    let e = TestEngine::new(POLICY, "2024-01-01T00:00:00Z");
    let faulty = FaultyBackend::new(e.backend("r"));
    e.with_backend("r", faulty.clone());
    let mut model: BTreeMap<Identity, String> = BTreeMap::new();
    let mut faults_active = false;
    for op in 0..ops {
        match rng.random_range(0..100) {
            0..45 => {
                let batch = random_batch(&mut rng, base, e.engine.clock.now());
                let mut staged: BTreeMap<Identity, String> = BTreeMap::new();
                let mut conflict_expected = false;
                for r in &batch {
                    let id = (r.partition_key.clone(), r.event_time, r.sort_key.clone());
                    let known = staged.get(&id).or(model.get(&id));
                    if known.is_some_and(|b| b != &r.body) {
                        conflict_expected = true;
                    }
                    staged.entry(id).or_insert_with(|| r.body.clone());
                }
                match e.engine.append("r", batch) {
                    Ok(_) => {
                        assert!(!conflict_expected, "seed {seed} op {op}: a conflicting batch was accepted");
                        model.extend(staged);
                    }
                    Err(err) if err.kind() == ErrorKind::Conflict && matches!(err, Error::Conflict(_)) => {
                        assert!(conflict_expected, "seed {seed} op {op}: unexpected conflict: {err}");
                    }
                    Err(Error::BucketFenced { .. }) => {}
                    Err(err) => panic!("seed {seed} op {op}: append failed: {err}"),
                }
            }
            45..55 => e.clock.advance(rng.random_range(0..3 * DAY_US)),
            55..72 => {
                let report = runtime()
                    .block_on(frostline::archive::run_pass(&e.engine, &format!("w{}", rng.random_range(0..2))))
                    .unwrap_or_else(|err| panic!("seed {seed} op {op}: pass failed: {err}"));
                if !faults_active {
                    assert_eq!(report.deferred, 0, "seed {seed} op {op}: deferral without faults: {report:?}");
                }
                e.clock.advance(20_000_000); // past ARCHIVER_RETRY_SECONDS
            }
            72..80 => {
                let (op_kind, key, fault) = random_fault(&mut rng);
                faulty.add(op_kind, key, fault, Some(rng.random_range(1..4)));
                faults_active = true;
            }
            80..86 => {
                faulty.clear();
                faults_active = false;
            }
            _ => check_reads(&e, &model, faults_active, seed, op),
        }
    }
    // Settle: no faults, everything due is archived, and the model still holds.
    faulty.clear();
    e.clock.advance(60 * DAY_US);
    for _ in 0..50 {
        let report = runtime().block_on(frostline::archive::run_pass(&e.engine, "final")).unwrap();
        e.clock.advance(20_000_000);
        if report.archived + report.cleaned + report.planned == 0 && report.deferred == 0 {
            break;
        }
    }
    check_reads(&e, &model, false, seed, ops);
    for meta in e.engine.store.buckets("r", None).unwrap() {
        assert_eq!(meta.state, BucketState::Archived { hot_deleted: true }, "seed {seed}: {} not settled", meta.id);
        assert!(e.engine.store.rows(&meta.id, None, usize::MAX).unwrap().is_empty(), "seed {seed}: hot rows left");
        let archived = runtime()
            .block_on(frostline::archive::read_archive(
                faulty.as_ref(),
                meta.manifest_key.as_ref().unwrap(),
                None,
                None,
            ))
            .unwrap_or_else(|err| panic!("seed {seed}: archive of {} unreadable: {err}", meta.id));
        assert_eq!(archived.len() as u64, meta.row_count, "seed {seed}: {} row count", meta.id);
    }
}

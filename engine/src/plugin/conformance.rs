//! Conformance checks per role, run by `frostline plugin check` (and, later, by every policy
//! reload before a plugin is swapped in). They ask a plugin thousands of questions whose
//! answers can be checked against each other, and report every kind of failure found.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::archiver::{BackendAnswer, WasmArchiver};
use super::retention::check_plan;
use super::strategy::{WasmStrategy, check_descriptor};
use super::{LoadedPlugin, Role};
use crate::error::Result;
use crate::model::time::{MICROS_PER_DAY, parse_rfc3339};
use crate::model::{BucketDescriptor, BucketFacts, BucketState, Micros, RetentionPolicy};

/// Random times asked of a strategy, on top of the edge cases.
pub const STRATEGY_RANDOM_TIMES: usize = 3_000;
/// Random buckets shown to a retention policy.
pub const RETENTION_RANDOM_BUCKETS: usize = 500;
/// Failures described per check; the rest are counted.
const FAILURE_DETAILS_MAX: usize = 5;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    pub name: &'static str,
    pub passed: bool,
    /// How many cases the check covered.
    pub cases: usize,
    pub failures: usize,
    pub details: Vec<String>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ConformanceReport {
    pub plugin: String,
    pub hash: String,
    pub role: Role,
    pub seed: u64,
    pub checks: Vec<Check>,
}

impl ConformanceReport {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.passed)
    }
}

impl std::fmt::Display for ConformanceReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "plugin  {}", self.plugin)?;
        writeln!(f, "sha256  {}", self.hash)?;
        writeln!(f, "role    {} (contract {}@{})", self.role, super::CONTRACT_PACKAGE, super::CONTRACT_VERSION)?;
        writeln!(f, "seed    {}", self.seed)?;
        for check in &self.checks {
            let mark = if check.passed { "ok  " } else { "FAIL" };
            writeln!(f, "  {mark} {:<44} {} cases, {} failures", check.name, check.cases, check.failures)?;
            for d in &check.details {
                writeln!(f, "         {d}")?;
            }
        }
        let verdict = if self.passed() { "PASSED" } else { "FAILED" };
        write!(
            f,
            "{verdict}: {} of {} checks passed",
            self.checks.iter().filter(|c| c.passed).count(),
            self.checks.len()
        )
    }
}

#[derive(Default)]
struct Tally {
    cases: usize,
    failures: usize,
    details: Vec<String>,
}

impl Tally {
    fn case(&mut self, outcome: std::result::Result<(), String>) {
        self.cases += 1;
        if let Err(detail) = outcome {
            self.failures += 1;
            if self.details.len() < FAILURE_DETAILS_MAX {
                self.details.push(detail);
            }
        }
    }

    fn finish(self, name: &'static str) -> Check {
        Check { name, passed: self.failures == 0, cases: self.cases, failures: self.failures, details: self.details }
    }
}

fn report(plugin: &LoadedPlugin, seed: u64, checks: Vec<Check>) -> ConformanceReport {
    ConformanceReport { plugin: plugin.name.clone(), hash: plugin.hash.clone(), role: plugin.role, seed, checks }
}

fn t(text: &str) -> Micros {
    parse_rfc3339(text).expect("valid constant")
}

/// Times every calendar-like strategy must get right: epoch, leap days, year ends, extremes.
fn edge_times() -> Vec<Micros> {
    let mut times = vec![0, -1, 1, i64::MIN, i64::MAX, i64::MIN + 1, i64::MAX - 1];
    for text in [
        "1970-01-01T00:00:00Z",
        "1969-12-31T23:59:59.999999Z",
        "1900-02-28T23:59:59Z",
        "1900-03-01T00:00:00Z",
        "2000-02-29T00:00:00Z",
        "2000-02-29T23:59:59.999999Z",
        "2024-02-29T12:00:00Z",
        "2023-12-31T23:59:59.999999Z",
        "2024-01-01T00:00:00Z",
        "2038-01-19T03:14:08Z",
        "2100-03-01T00:00:00Z",
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59.999999Z",
    ] {
        times.push(t(text));
    }
    times
}

/// Runs the strategy checks. The years 1970 to 2100 must always be answered; outside them a
/// strategy may refuse a time with an error (a supported range), but never trap.
pub fn check_strategy(strategy: &WasmStrategy, seed: u64) -> Result<ConformanceReport> {
    check_strategy_cases(strategy, seed, STRATEGY_RANDOM_TIMES)
}

/// The strategy checks with `random_times` random times (a quick check uses fewer).
pub fn check_strategy_cases(strategy: &WasmStrategy, seed: u64, random_times: usize) -> Result<ConformanceReport> {
    let typical = t("1970-01-01T00:00:00Z")..t("2100-01-01T00:00:00Z");
    let wide = t("0001-01-01T00:00:00Z")..t("9999-12-31T00:00:00Z");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut times = edge_times();
    for _ in 0..random_times / 2 {
        times.push(rng.random_range(typical.clone()));
    }
    for _ in 0..random_times / 2 {
        times.push(rng.random_range(wide.clone()));
    }

    let mut contains = Tally::default();
    let mut stable = Tally::default();
    let mut own_start = Tally::default();
    let mut next_adjacent = Tally::default();
    let mut prev_adjacent = Tally::default();
    let mut batch_agrees = Tally::default();
    let mut typical_answered = Tally::default();
    let mut unique_keys = Tally::default();
    let mut refused = 0usize;
    let mut keys: HashMap<String, (Micros, Micros)> = HashMap::new();

    let mut answered: Vec<(Micros, BucketDescriptor)> = Vec::new();
    // A fault (trap, timeout, out of memory) fails this check and the case is skipped; the
    // other checks go on, so one report shows everything that is wrong.
    let no_faults = std::cell::RefCell::new(Tally::default());
    let ask = |t: Micros| -> std::result::Result<std::result::Result<BucketDescriptor, String>, ()> {
        match strategy.ask_one_uncached(t) {
            Ok(answer) => {
                no_faults.borrow_mut().case(Ok(()));
                Ok(answer)
            }
            Err(e) => {
                no_faults.borrow_mut().case(Err(format!("t={t}: {e}")));
                Err(())
            }
        }
    };
    for &time in &times {
        let Ok(single) = ask(time) else { continue };
        let d = match single {
            Ok(d) => d,
            Err(message) => {
                refused += 1;
                if typical.contains(&time) {
                    typical_answered.case(Err(format!("t={time}: refused a time in 1970..2100: {message}")));
                }
                continue;
            }
        };
        if typical.contains(&time) {
            typical_answered.case(Ok(()));
        }
        answered.push((time, d.clone()));
        contains.case(check_descriptor(time, &d));
        let Ok(again) = ask(time) else { continue };
        stable.case(if again.as_ref() == Ok(&d) { Ok(()) } else { Err(format!("t={time}: {d:?} then {again:?}")) });
        let Ok(at_start) = ask(d.start) else { continue };
        own_start.case(if at_start.as_ref() == Ok(&d) {
            Ok(())
        } else {
            Err(format!("t={time}: asked for its own start {} got {at_start:?}, expected {d:?}", d.start))
        });
        if let Ok(Ok(next)) = ask(d.end) {
            next_adjacent.case(adjacent(&d, &next));
        }
        if let Some(before) = d.start.checked_sub(1)
            && let Ok(Ok(prev)) = ask(before)
        {
            prev_adjacent.case(adjacent(&prev, &d));
        }
        match keys.get(&d.key) {
            Some(&(s, e)) if (s, e) != (d.start, d.end) => {
                unique_keys.case(Err(format!("key `{}` names both [{s}, {e}) and [{}, {})", d.key, d.start, d.end)))
            }
            _ => {
                keys.insert(d.key.clone(), (d.start, d.end));
                unique_keys.case(Ok(()));
            }
        }
    }
    // The batch call is all-or-nothing, so it is asked only about times answered one by one.
    let answered_times: Vec<Micros> = answered.iter().map(|(t, _)| *t).collect();
    let batch = match strategy.ask_uncached(&answered_times) {
        Ok(batch) => batch,
        Err(e) => {
            no_faults.borrow_mut().case(Err(format!("buckets-for: {e}")));
            Vec::new()
        }
    };
    for ((time, single), batched) in answered.iter().zip(batch) {
        batch_agrees.case(if batched.as_ref() == Ok(single) {
            Ok(())
        } else {
            Err(format!("t={time}: bucket-for answered {single:?} but buckets-for answered {batched:?}"))
        });
    }
    let mut checks = vec![
        no_faults.into_inner().finish("never traps, times out or runs out of memory"),
        typical_answered.finish("answers every time in 1970..2100"),
        contains.finish("bucket contains its time, start < end, key canonical"),
        stable.finish("same answer when asked again"),
        own_start.finish("same answer when asked for its own start"),
        next_adjacent.finish("next bucket starts where this one ends"),
        prev_adjacent.finish("previous bucket ends where this one starts"),
        batch_agrees.finish("buckets-for agrees with bucket-for"),
        unique_keys.finish("one key names one bucket"),
    ];
    checks.push(Check {
        name: "refusals outside the supported range (informational)",
        passed: true,
        cases: times.len(),
        failures: 0,
        details: vec![format!("{refused} times refused with an error")],
    });
    Ok(report(strategy.plugin(), seed, checks))
}

fn adjacent(earlier: &BucketDescriptor, later: &BucketDescriptor) -> std::result::Result<(), String> {
    if earlier.end == later.start {
        Ok(())
    } else if earlier.end > later.start {
        Err(format!("{earlier:?} overlaps {later:?}"))
    } else {
        Err(format!("gap between {earlier:?} and {later:?}"))
    }
}

/// Runs the retention checks on random bucket facts: plans are deterministic for the same
/// facts and time, pass the host's plan checks, and never expire before archiving.
pub fn check_retention(policy: &super::retention::WasmRetention, seed: u64) -> Result<ConformanceReport> {
    let mut rng = StdRng::seed_from_u64(seed);
    let tenants = [None, Some("acme"), Some("globex"), Some("initech")];
    let kinds = [None, Some("audit"), Some("metric"), Some("trace")];
    let mut facts = Vec::with_capacity(RETENTION_RANDOM_BUCKETS);
    for i in 0..RETENTION_RANDOM_BUCKETS {
        let start = rng.random_range(t("1950-01-01T00:00:00Z")..t("2090-01-01T00:00:00Z"));
        let length = [MICROS_PER_DAY, 31 * MICROS_PER_DAY, 366 * MICROS_PER_DAY][i % 3];
        facts.push(BucketFacts {
            table: "conformance".into(),
            partition_key: format!("p{}", i % 7).into_bytes(),
            tenant: tenants[rng.random_range(0..tenants.len())].map(str::to_string),
            kind: kinds[rng.random_range(0..kinds.len())].map(str::to_string),
            bucket: BucketDescriptor { key: format!("conformance:{i}"), start, end: start + length },
            row_count: rng.random_range(0..1_000_000),
            byte_count: rng.random_range(0..1_000_000_000),
            state: BucketState::Hot,
            archived_at: None,
        });
    }
    let now_values = [t("2026-11-30T00:00:00Z"), t("1999-06-01T00:00:00Z"), t("2080-01-01T00:00:00Z")];
    let mut deterministic = Tally::default();
    let mut sane = Tally::default();
    let mut answered = Tally::default();
    for now in now_values {
        let first = policy.plan(now, &facts);
        let second = policy.plan(now, &facts);
        let (first, second) = match (first, second) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                sane.case(Err(format!("now={now}: {e}")));
                continue;
            }
        };
        for ((fact, a), b) in facts.iter().zip(&first).zip(&second) {
            deterministic.case(if a == b {
                Ok(())
            } else {
                Err(format!("now={now} bucket {}: {a:?} then {b:?}", fact.bucket.key))
            });
            match a {
                Ok(plan) => {
                    answered.case(Ok(()));
                    sane.case(check_plan(plan).map_err(|r| format!("bucket {}: {r}", fact.bucket.key)));
                }
                Err(message) => answered.case(Err(format!("bucket {}: refused: {message}", fact.bucket.key))),
            }
        }
    }
    Ok(report(
        policy.plugin(),
        seed,
        vec![
            answered.finish("plans every ordinary bucket"),
            deterministic.finish("same plan for the same facts and time"),
            sane.finish("plans pass the host checks (no expiry before archive)"),
        ],
    ))
}

/// Where every conformance run keeps its scratch keys, each run under a folder of its own.
pub const CONFORMANCE_PREFIX: &str = "frostline-conformance/";
/// A run's folder older than this is what an interrupted run left, and a later run removes it.
/// A run lasts at most a few dozen calls of at most `PLUGIN_CALL_MS_MAX` each (under half an
/// hour); a day leaves room for clocks that disagree between engines sharing a store.
pub const CONFORMANCE_LEFTOVER_SECS: u64 = 86_400;

/// Runs the archiver checks against scratch keys: put, get, list and delete round-trip, and
/// create-only semantics hold. The keys are under a prefix of this run's own, made of its start
/// time and a random number: runs at once against one store (two reloads, a `policy check`
/// beside the engine, engines sharing a target) never meet, whatever their seeds. Cleans up
/// after itself, and first removes what interrupted runs left (`remove_leftovers`). `now` is
/// the wall clock's time (the system clock's: leftovers age in the store, in real time).
pub fn check_archiver(archiver: &WasmArchiver, seed: u64, now: crate::model::Micros) -> Result<ConformanceReport> {
    let started = u64::try_from(now / 1_000_000).unwrap_or(0);
    remove_leftovers(archiver, started)?;
    let prefix = format!("{CONFORMANCE_PREFIX}{started:010x}-{:016x}/", rand::random::<u64>());
    let key = |name: &str| format!("{prefix}{name}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut big = vec![0u8; 1024 * 1024];
    rng.fill(&mut big[..]);
    let small = b"frostline conformance".to_vec();

    let mut round_trip = Tally::default();
    let mut create_only = Tally::default();
    let mut listing = Tally::default();
    let mut deletion = Tally::default();

    for (name, bytes) in [("a", &small), ("b-empty", &Vec::new()), ("c-large", &big)] {
        let put = archiver.put(&key(name), bytes)?;
        round_trip.case(if put == BackendAnswer::Ok(()) { Ok(()) } else { Err(format!("put {name}: {put:?}")) });
        let got = archiver.get(&key(name))?;
        round_trip.case(match got {
            BackendAnswer::Ok(b) if &b == bytes => Ok(()),
            BackendAnswer::Ok(b) => Err(format!("get {name}: {} bytes back for {} put", b.len(), bytes.len())),
            other => Err(format!("get {name}: {other:?}")),
        });
    }
    let again = archiver.put(&key("a"), b"overwritten")?;
    create_only.case(if again == BackendAnswer::AlreadyExists {
        Ok(())
    } else {
        Err(format!("a second put of an existing key answered {again:?}, expected already-exists"))
    });
    let after = archiver.get(&key("a"))?;
    create_only.case(if after == BackendAnswer::Ok(small.clone()) {
        Ok(())
    } else {
        Err("a second put changed the stored bytes".to_string())
    });
    let missing = archiver.get(&key("missing"))?;
    round_trip.case(if missing == BackendAnswer::NotFound {
        Ok(())
    } else {
        Err(format!("get of a missing key: {missing:?}"))
    });

    let all = vec![key("a"), key("b-empty"), key("c-large")];
    for (after, limit, expected) in [
        (None, 10, all.clone()),
        (Some(key("a")), 10, all[1..].to_vec()),
        (None, 1, all[..1].to_vec()),
        (Some(key("c-large")), 10, vec![]),
    ] {
        let listed = archiver.list(&prefix, after.as_deref(), limit)?;
        listing.case(if listed == BackendAnswer::Ok(expected.clone()) {
            Ok(())
        } else {
            Err(format!("list after={after:?} limit={limit}: {listed:?}, expected {expected:?}"))
        });
    }
    for name in ["a", "b-empty", "c-large"] {
        let deleted = archiver.delete(&key(name))?;
        deletion.case(if deleted == BackendAnswer::Ok(()) {
            Ok(())
        } else {
            Err(format!("delete {name}: {deleted:?}"))
        });
        let gone = archiver.get(&key(name))?;
        deletion.case(if gone == BackendAnswer::NotFound {
            Ok(())
        } else {
            Err(format!("get after delete {name}: {gone:?}"))
        });
    }
    let listed = archiver.list(&prefix, None, 10)?;
    deletion.case(if listed == BackendAnswer::Ok(vec![]) {
        Ok(())
    } else {
        Err(format!("list after deleting all: {listed:?}"))
    });

    Ok(report(
        archiver.plugin(),
        seed,
        vec![
            round_trip.finish("put and get round-trip (empty, small, 1 MiB)"),
            create_only.finish("create-only: a second put is refused, bytes kept"),
            listing.finish("list honours prefix, after and limit"),
            deletion.finish("delete removes, and absence is listed"),
        ],
    ))
}

/// Deletes the keys of runs that started more than `CONFORMANCE_LEFTOVER_SECS` before `now`,
/// and of the layout before run folders had a start time (`{seed:016x}/`). Keys it cannot
/// read a start time from otherwise are left alone: they are not a run's. Looks at the first
/// 1,000 keys under the prefix, so a store full of leftovers is cleaned over several loads.
fn remove_leftovers(archiver: &WasmArchiver, now: u64) -> Result<()> {
    const PAGE: u32 = 100;
    const PAGES_MAX: usize = 10;
    let mut after: Option<String> = None;
    let mut stale = Vec::new();
    for _ in 0..PAGES_MAX {
        let BackendAnswer::Ok(keys) = archiver.list(CONFORMANCE_PREFIX, after.as_deref(), PAGE)? else {
            // An archiver that cannot list answers so in the listing check itself.
            return Ok(());
        };
        let full_page = keys.len() == PAGE as usize;
        after = keys.last().cloned();
        stale.extend(keys.into_iter().filter(|key| {
            let Some(rest) = key.strip_prefix(CONFORMANCE_PREFIX) else { return false };
            let run = rest.split('/').next().unwrap_or_default();
            let is_hex = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit());
            match run.split_once('-') {
                Some((time, nonce)) if time.len() == 10 && is_hex(time) && is_hex(nonce) => {
                    let started = u64::from_str_radix(time, 16).unwrap_or(u64::MAX);
                    now.saturating_sub(started) > CONFORMANCE_LEFTOVER_SECS
                }
                None => run.len() == 16 && is_hex(run),
                Some(_) => false,
            }
        }));
        if !full_page {
            break;
        }
    }
    for key in stale {
        archiver.delete(&key)?;
    }
    Ok(())
}

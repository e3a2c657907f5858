//! Test-only bucket strategy `hostile-strategy`: misbehaves on request so that the host's tests
//! can prove its limits (time, memory, traps), its checks of strategy answers, and its sandbox.
//! Never use it in a real policy.
//!
//! Config `{"mode": "...", "port": 1234}`; empty means `normal`. In every mode `bucket-for`
//! loops forever for t = -1, allocates without bound for t = -2, panics for t = -3 and sleeps
//! for a minute (a WASI clock subscription and a blocking poll, in a host call) for t = -4; other
//! times get one-hour buckets `hour:<n>`, bent as the mode asks.

mod bindings {
    wit_bindgen::generate!({ path: "../../../wit", world: "bucket-strategy" });
}

use std::cell::Cell;
use std::hint::black_box;

use bindings::exports::frostline::plugin::strategy::Guest as StrategyGuest;
use bindings::frostline::plugin::log::{Level, log};
use bindings::frostline::plugin::types::{BucketDescriptor, TimestampMicros};
use serde::Deserialize;

const MICROS_PER_HOUR: i64 = 3_600_000_000;
const BOMB_CHUNK_BYTES: usize = 1 << 20;
/// Writing one byte per page is enough to make the memory real.
const PAGE_BYTES: usize = 4096;

const TIME_LOOP_FOREVER: i64 = -1;
const TIME_ALLOCATE_FOREVER: i64 = -2;
const TIME_PANIC: i64 = -3;
const TIME_SLEEP: i64 = -4;

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum Mode {
    #[default]
    Normal,
    BadContains,
    BadOrder,
    BadKey,
    Unstable,
    Refuse,
    Log,
    ProbeFs,
    ProbeEnv,
    ProbeNet,
    /// `init` reports the wall clock, the monotonic clock and the first random hash keys.
    ProbeTime,
    /// Bucket keys carry the wall clock's nanoseconds: stable only if the clock is.
    ClockKey,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    mode: Mode,
    /// Only for `probe-net`: the 127.0.0.1 port to try.
    port: Option<u16>,
}

thread_local! {
    static MODE: Cell<Mode> = const { Cell::new(Mode::Normal) };
    static CALLS: Cell<u64> = const { Cell::new(0) };
}

fn loop_forever() -> ! {
    // black_box makes every iteration observable, so the optimizer cannot drop the loop.
    let mut spins = 0_u64;
    loop {
        spins = black_box(spins.wrapping_add(1));
    }
}

fn allocate_forever() -> ! {
    let mut kept: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut chunk = vec![0_u8; BOMB_CHUNK_BYTES];
        for i in (0..BOMB_CHUNK_BYTES).step_by(PAGE_BYTES) {
            chunk[i] = 1;
        }
        kept.push(black_box(chunk));
        black_box(&kept);
    }
}

fn probe_fs() -> String {
    let file = std::fs::read_to_string("/etc/hostname");
    let dir = std::fs::read_dir("/");
    match (file, dir) {
        (Err(file_error), Err(dir_error)) => {
            format!("probe-fs: denied (read /etc/hostname: {file_error}; read_dir /: {dir_error})")
        }
        (file, dir) => {
            let mut seen = Vec::new();
            if let Ok(text) = file {
                seen.push(format!("/etc/hostname = {:?}", text.trim()));
            }
            if let Ok(entries) = dir {
                let names: Vec<String> =
                    entries.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
                seen.push(format!("/ lists {names:?}"));
            }
            format!("probe-fs: ALLOWED ({})", seen.join("; "))
        }
    }
}

fn probe_env() -> String {
    // The _os variants count without panicking on non-UTF-8 entries.
    format!("probe-env: vars={} args={}", std::env::vars_os().count(), std::env::args_os().count())
}

fn probe_net(port: u16) -> String {
    match std::net::TcpStream::connect(("127.0.0.1", port)) {
        Ok(_) => "probe-net: ALLOWED".to_string(),
        Err(e) => format!("probe-net: denied ({e})"),
    }
}

/// Nanoseconds since the Unix epoch on the wall clock the host gives.
#[allow(clippy::disallowed_methods)] // reading the host's clock is what this probe is for
fn wall_nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

fn probe_time() -> String {
    use std::hash::BuildHasher as _;
    let started = std::time::Instant::now();
    // The first RandomState of a thread takes its keys from the host's random source.
    let hash = std::collections::hash_map::RandomState::new().hash_one(42u64);
    format!("probe-time: wall={} monotonic_elapsed={:?} random_hash={hash}", wall_nanos(), started.elapsed())
}

fn bucket_for(mode: Mode, t: i64) -> Result<BucketDescriptor, String> {
    match t {
        TIME_LOOP_FOREVER => loop_forever(),
        TIME_ALLOCATE_FOREVER => allocate_forever(),
        TIME_PANIC => panic!("hostile trap requested"),
        TIME_SLEEP => std::thread::sleep(std::time::Duration::from_secs(60)),
        _ => {}
    }
    let unrepresentable = || format!("the hour bucket of {t} does not fit in i64 microseconds");
    let hour = t.div_euclid(MICROS_PER_HOUR);
    let start = hour.checked_mul(MICROS_PER_HOUR).ok_or_else(unrepresentable)?;
    let end = start.checked_add(MICROS_PER_HOUR).ok_or_else(unrepresentable)?;
    let mut bucket = BucketDescriptor { key: format!("hour:{hour}"), start, end };
    match mode {
        Mode::BadContains => {
            bucket.key = format!("hour:{}", hour + 1);
            bucket.start = end;
            bucket.end = end.checked_add(MICROS_PER_HOUR).ok_or_else(unrepresentable)?;
        }
        Mode::BadOrder => bucket.end = bucket.start,
        Mode::BadKey => bucket.key.clear(),
        Mode::ClockKey => bucket.key = format!("hour:{hour}:wall{}", wall_nanos()),
        Mode::Unstable => {
            let call = CALLS.get();
            CALLS.set(call.wrapping_add(1));
            bucket.key = format!("hour:{hour}:call{call}");
        }
        _ => {}
    }
    Ok(bucket)
}

struct Component;

impl bindings::Guest for Component {
    fn init(config: String) -> Result<(), String> {
        let config: Config = if config.trim().is_empty() {
            Config::default()
        } else {
            serde_json::from_str(&config).map_err(|e| format!("hostile-strategy config: {e}"))?
        };
        match config.mode {
            Mode::Refuse => return Err("refused by configuration".into()),
            Mode::Log => log(Level::Info, "hello from hostile"),
            // The probes report through init's error, the one string the host test can read.
            Mode::ProbeFs => return Err(probe_fs()),
            Mode::ProbeEnv => return Err(probe_env()),
            Mode::ProbeTime => return Err(probe_time()),
            Mode::ProbeNet => {
                let port = config.port.ok_or("probe-net needs the config field \"port\"")?;
                return Err(probe_net(port));
            }
            _ => {}
        }
        MODE.set(config.mode);
        Ok(())
    }
}

impl StrategyGuest for Component {
    fn bucket_for(event_time: TimestampMicros) -> Result<BucketDescriptor, String> {
        bucket_for(MODE.get(), event_time)
    }

    fn buckets_for(event_times: Vec<TimestampMicros>) -> Result<Vec<BucketDescriptor>, String> {
        let mode = MODE.get();
        event_times.into_iter().map(|t| bucket_for(mode, t)).collect()
    }
}

bindings::export!(Component with_types_in bindings);

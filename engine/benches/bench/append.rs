//! Scenario append: records/s through `Engine::append` and `frostline ingest` against plain
//! redb inserts of the same rows with the same durability; the same appends with the WASM
//! strategy against the same strategy in native Rust; and, when a target is missed, where
//! the time goes (the phases of an append, and the store's append rebuilt on plain redb one
//! step at a time).

use std::collections::HashMap;
use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use frostline::model::time::format_rfc3339;
use frostline::model::{BucketDescriptor, Micros, Record};
use frostline::policy::{PolicySet, TablePolicy};
use frostline::store::schema::{self, BucketId, BucketMeta, StoredRow};
use frostline::store::{AppendBatch, PreparedRow};
use redb::{ReadableDatabase as _, ReadableTable as _, ReadableTableMetadata as _, TableHandle as _};

use crate::data::{APPEND_NOW_MICROS, DATASET_TABLE, Dirs, dataset, policy_toml, release_binary};
use crate::harness::{Bench, Figure, Phases, Unit, lap, median, push_phases};
use crate::native::{CalendarUnit, NativeCalendar, calendar_bucket};

const APPEND_BATCH_RECORDS: usize = 1_000;
const APPEND_RECORDS_DEFAULT: usize = 100_000;
const APPEND_RECORDS_FULL: usize = 1_000_000;
/// Appends should run at >= 70% of plain redb inserts of the same records.
const APPEND_RATIO_MIN: f64 = 0.7;
/// Appends with the WASM strategy should run at >= 95% of the same with a native strategy.
const STRATEGY_RATIO_MIN: f64 = 0.95;
const CLI_ROW: &str = "frostline ingest (release binary)";
/// Instrumented runs of the breakdown at most.
const BREAKDOWN_REPEATS: usize = 5;

const PLAIN_RECORDS: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("records");

pub fn append(bench: &mut Bench) -> Result<()> {
    let count = if bench.options.full { APPEND_RECORDS_FULL } else { APPEND_RECORDS_DEFAULT };
    let records = dataset(count);
    let policy = policy_toml("7d");

    // The CLI reads the same records as JSON lines.
    let cli = match release_binary() {
        Ok(binary) => {
            let dir = tempfile::tempdir()?;
            let input = dir.path().join("records.jsonl");
            let mut text = String::with_capacity(count * 320);
            for r in &records {
                text.push_str(&serde_json::to_string(&serde_json::json!({
                    "partition_key": String::from_utf8_lossy(&r.partition_key),
                    "event_time": format_rfc3339(r.event_time),
                    "sort_key": String::from_utf8_lossy(&r.sort_key),
                    "body": serde_json::from_str::<&serde_json::value::RawValue>(&r.body)?,
                }))?);
                text.push('\n');
            }
            std::fs::write(&input, text)?;
            let empty = dir.path().join("empty.jsonl");
            std::fs::write(&empty, "")?;
            Some((binary, dir, input, empty))
        }
        Err(reason) => {
            bench.skip(&[CLI_ROW], reason);
            None
        }
    };

    let (mut engine_samples, mut redb_samples, mut cli_samples) = (Vec::new(), Vec::new(), Vec::new());
    let mut native_samples = Vec::new();
    for round in 0..bench.options.repeats {
        // Alternate which goes first, so leftover disk work from one lands on both alike.
        let engine_first = round % 2 == 0;
        for engine_turn in [engine_first, !engine_first] {
            if engine_turn {
                engine_samples.push(count as f64 / append_through_engine(&records, &policy, Strategy::Wasm)?);
            } else {
                redb_samples.push(count as f64 / append_plain_redb(&records)?);
            }
        }
        native_samples.push(count as f64 / append_through_engine(&records, &policy, Strategy::Native)?);
        if let Some((binary, _, input, empty)) = &cli {
            cli_samples.push(count as f64 / ingest_through_cli(binary, input, empty, &policy, count)?);
        }
    }

    let redb = Figure::new(
        bench.scenario,
        format!("plain redb 4 insert, {count} records, one write transaction per {APPEND_BATCH_RECORDS}"),
        Unit::RecordsPerSecond,
        redb_samples,
        count as u64,
    );
    let engine = Figure::new(
        bench.scenario,
        format!("Engine::append, {count} records in batches of {APPEND_BATCH_RECORDS}"),
        Unit::RecordsPerSecond,
        engine_samples,
        count as u64,
    )
    .against(&redb)
    .with_target(APPEND_RATIO_MIN, "appends run at >= 70% of plain redb inserts of the same records");
    let native = Figure::new(
        bench.scenario,
        format!("Engine::append, {count} records, the table's strategy replaced by native Rust"),
        Unit::RecordsPerSecond,
        native_samples,
        count as u64,
    );
    let with_wasm = Figure::new(
        bench.scenario,
        format!("Engine::append, {count} records, with the built-in WASM strategy (descriptor cache)"),
        Unit::RecordsPerSecond,
        engine.samples.clone(),
        count as u64,
    )
    .against(&native)
    .with_target(STRATEGY_RATIO_MIN, "appends with the WASM strategy run at >= 95% of the same with native Rust");
    let cli = (!cli_samples.is_empty()).then(|| {
        Figure::new(
            bench.scenario,
            format!(
                "{CLI_ROW}, {count} records from a JSON-lines file (whole process: start, parse, batches of {})",
                frostline::engine::APPEND_BATCH_RECORDS_MAX
            ),
            Unit::RecordsPerSecond,
            cli_samples,
            count as u64,
        )
        .against(&redb)
    });

    bench.push(redb);
    let note = append_breakdown(bench, &records, &policy)?;
    let engine = if engine.met_target() { engine } else { engine.with_note(note) };
    bench.push(engine);
    if let Some(cli) = cli {
        bench.push(cli);
    }
    bench.push(native);
    bench.push(with_wasm);
    Ok(())
}

/// Which strategy the table uses while appending.
#[derive(Clone, Copy)]
enum Strategy {
    /// The built-in calendar-day-utc component, as the policy file names it.
    Wasm,
    /// The same logic in native Rust, installed in place of the component.
    Native,
}

/// Replaces the strategy of every table in the engine's policy set with the native calendar-day
/// strategy under the same identity, so the store sees the same strategy.
fn install_native_strategy(engine: &frostline::engine::Engine) -> Result<()> {
    let active = engine.policies();
    let mut set: PolicySet = (*active).clone();
    for table in set.tables.values_mut() {
        let native = NativeCalendar { unit: CalendarUnit::Day, identity: table.strategy.identity().clone() };
        *table = Arc::new(TablePolicy { strategy: Arc::new(native), ..(**table).clone() });
    }
    engine.install_policies(set)?;
    Ok(())
}

/// Seconds to append `records` in batches through a fresh engine (opened untimed).
fn append_through_engine(records: &[Record], policy: &str, strategy: Strategy) -> Result<f64> {
    let dirs = Dirs::new(policy)?;
    let engine = dirs.open(APPEND_NOW_MICROS)?;
    if let Strategy::Native = strategy {
        install_native_strategy(&engine)?;
    }
    let batches: Vec<Vec<Record>> = records.chunks(APPEND_BATCH_RECORDS).map(<[Record]>::to_vec).collect();
    let start = Instant::now();
    let mut appended = 0;
    for batch in batches {
        appended += engine.append(DATASET_TABLE, batch)?.appended;
    }
    let seconds = start.elapsed().as_secs_f64();
    ensure!(appended == records.len() as u64, "the engine appended {appended} of {} records", records.len());
    Ok(seconds)
}

/// Seconds to insert the same records into a plain redb table, key partition ‖ event_time ‖
/// sort_key, value the body, one write transaction per batch committed with the default
/// durability (Immediate: fsynced), as the engine's store commits.
fn append_plain_redb(records: &[Record]) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let db = redb::Database::create(dir.path().join("plain.redb"))?;
    let mut key = Vec::with_capacity(64);
    let start = Instant::now();
    for batch in records.chunks(APPEND_BATCH_RECORDS) {
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(PLAIN_RECORDS)?;
            for r in batch {
                key.clear();
                key.extend_from_slice(&r.partition_key);
                key.extend_from_slice(&r.event_time.to_be_bytes());
                key.extend_from_slice(&r.sort_key);
                table.insert(key.as_slice(), r.body.as_bytes())?;
            }
        }
        txn.commit()?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let stored = db.begin_read()?.open_table(PLAIN_RECORDS)?.len()?;
    ensure!(stored == records.len() as u64, "redb holds {stored} of {} records", records.len());
    Ok(seconds)
}

/// Seconds of `frostline ingest --table T FILE` on a fresh data directory. An untimed ingest of
/// an empty file first creates the database and compiles the plugins into its cache, as a
/// long-lived data directory has them.
fn ingest_through_cli(binary: &Path, input: &Path, empty: &Path, policy: &str, count: usize) -> Result<f64> {
    let dirs = Dirs::new(policy)?;
    let ingest = |file: &Path| -> Result<serde_json::Value> {
        let output = Command::new(binary)
            .arg("ingest")
            .arg("--data")
            .arg(dirs.data())
            .arg("--policies")
            .arg(dirs.policies())
            .args(["--table", DATASET_TABLE])
            .arg(file)
            .output()
            .with_context(|| format!("cannot run {}", binary.display()))?;
        ensure!(
            output.status.success(),
            "`frostline ingest` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        serde_json::from_slice(&output.stdout).context("`frostline ingest` printed no outcome")
    };
    ingest(empty)?;
    let start = Instant::now();
    let outcome = ingest(input)?;
    let seconds = start.elapsed().as_secs_f64();
    ensure!(outcome["appended"] == count, "`frostline ingest` reported {outcome}, expected {count} appended");
    Ok(seconds)
}

/// Plain redb doing, one step at a time, what the store's append does beyond the baseline's
/// insert: level 1 writes the store's row keys and MessagePack values into each bucket's rows
/// table, level 2 also checks
/// the value each insert hands back (the duplicate check), level 3 also reads, updates and writes the
/// metadata of every bucket a batch touches (`metas`: the store's metadata of these buckets,
/// used as the new buckets' first version). Level 0 is the baseline. Seconds for all records.
fn append_store_shaped(records: &[Record], metas: &HashMap<BucketId, BucketMeta>, level: u8) -> Result<f64> {
    if level == 0 {
        return append_plain_redb(records);
    }
    let descriptors: Vec<BucketDescriptor> = records
        .iter()
        .map(|r| calendar_bucket(CalendarUnit::Day, r.event_time).map_err(anyhow::Error::msg))
        .collect::<Result<_>>()?;
    let dir = tempfile::tempdir()?;
    let db = redb::Database::create(dir.path().join("store-shaped.redb"))?;
    let start = Instant::now();
    for (batch, batch_descriptors) in records.chunks(APPEND_BATCH_RECORDS).zip(descriptors.chunks(APPEND_BATCH_RECORDS))
    {
        let txn = db.begin_write()?;
        {
            let mut tables: HashMap<String, redb::Table<&[u8], &[u8]>> = HashMap::new();
            let mut touched: HashMap<BucketId, (BucketDescriptor, u64, u64)> = HashMap::new();
            for (r, descriptor) in batch.iter().zip(batch_descriptors) {
                let id = BucketId {
                    table: DATASET_TABLE.to_string(),
                    partition_key: r.partition_key.clone(),
                    bucket_key: descriptor.key.clone(),
                };
                let name = schema::rows_table_name(&id);
                if !tables.contains_key(&name) {
                    let table = txn.open_table(schema::rows_table(&name))?;
                    tables.insert(name.clone(), table);
                }
                let rows = tables.get_mut(&name).expect("opened above");
                let key = schema::row_key(r.event_time, &r.sort_key);
                let value = schema::encode_row(&StoredRow {
                    tenant: r.tenant.clone(),
                    kind: r.kind.clone(),
                    body: r.body.clone(),
                })?;
                let previous = rows.insert(key.as_slice(), value.as_slice())?;
                if level >= 2 {
                    // As the store does: the value insert hands back tells a duplicate.
                    ensure!(previous.map(|v| v.value().to_vec()).is_none(), "duplicate record key");
                }
                if level >= 3 {
                    let entry = touched.entry(id).or_insert_with(|| (descriptor.clone(), 0, 0));
                    entry.1 += 1;
                    entry.2 += r.body.len() as u64;
                }
            }
            let mut buckets = txn.open_table(schema::BUCKETS)?;
            for (id, (descriptor, added_rows, added_bytes)) in touched {
                let encoded = id.encode();
                let stored: Option<BucketMeta> =
                    buckets.get(encoded.as_slice())?.map(|v| schema::decode_value(v.value())).transpose()?;
                let mut meta = match stored {
                    Some(meta) => meta,
                    None => {
                        let mut meta = metas.get(&id).context("no metadata for a bucket")?.clone();
                        ensure!(meta.descriptor == descriptor, "bucket {id} has another descriptor in the store");
                        meta.row_count = 0;
                        meta.byte_count = 0;
                        meta
                    }
                };
                meta.row_count += added_rows;
                meta.byte_count += added_bytes;
                buckets.insert(encoded.as_slice(), schema::encode_value(&meta)?.as_slice())?;
            }
        }
        txn.commit()?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let read = db.begin_read()?;
    let mut stored = 0;
    for handle in read.list_tables()? {
        if handle.name().starts_with("rows ") {
            stored += read.open_table(schema::rows_table(handle.name()))?.len()?;
        }
    }
    ensure!(stored == records.len() as u64, "redb holds {stored} of {} records", records.len());
    Ok(seconds)
}

/// Where an append run's time goes, sampled round by round (at most `BREAKDOWN_REPEATS` runs):
/// the phases of `Engine::append` (`append_phases`), and the store's append rebuilt on plain
/// redb one step at a time (`append_store_shaped`). Pushes the figures and returns the note.
fn append_breakdown(bench: &mut Bench, records: &[Record], policy: &str) -> Result<String> {
    const STEPS: [&str; 4] = [
        "plain redb insert, as the baseline",
        "+ the store's record keys and MessagePack values",
        "+ the duplicate check on the value each insert hands back",
        "+ read, update and write each touched bucket's metadata per batch",
    ];
    let repeats = bench.options.repeats.min(BREAKDOWN_REPEATS);
    let mut runs = Vec::with_capacity(repeats);
    let mut steps = vec![Vec::with_capacity(repeats); STEPS.len()];
    for _ in 0..repeats {
        let (phases, metas) = append_phases(records, policy)?;
        runs.push(phases);
        for (level, out) in steps.iter_mut().enumerate() {
            out.push(append_store_shaped(records, &metas, level as u8)? * 1e3);
        }
    }
    let mut note = push_phases(bench, "instrumented Engine::append", &runs, &[]);
    let store_ms = median(&runs.iter().map(|r| r[2].1 * 1e3).collect::<Vec<_>>());
    let mut medians = Vec::new();
    for (name, samples) in STEPS.iter().zip(steps) {
        let figure = Figure::new(
            bench.scenario,
            format!("Store::append rebuilt on plain redb: {name}"),
            Unit::Millis,
            samples,
            records.len() as u64,
        );
        medians.push(figure.median);
        bench.push(figure);
    }
    let rest = store_ms - medians[3];
    let rest = if rest < -5.0 {
        format!("Store::append itself measured {} less than the rebuilt steps (noise between runs)", delta_ms(-rest))
    } else {
        format!("the rest of Store::append ({}) is the writer-thread hop and the batch's bookkeeping", delta_ms(rest))
    };
    note.push_str(&format!(
        "; rebuilt on plain redb ({:.0} ms), the store's keys and MessagePack values add {}, the duplicate check \
         {}, bucket metadata {}, and {rest}",
        medians[0],
        delta_ms(medians[1] - medians[0]),
        delta_ms(medians[2] - medians[1]),
        delta_ms(medians[3] - medians[2]),
    ));
    Ok(note)
}

/// A difference of two medians: `+92 ms`, or `~0 ms` when it is within a few ms.
fn delta_ms(ms: f64) -> String {
    if ms.abs() < 5.0 { "~0 ms".to_string() } else { format!("{ms:+.0} ms") }
}

/// The phases of an append run, and the metadata of the buckets it wrote.
type AppendPhases = (Phases, HashMap<BucketId, BucketMeta>);

/// The parts of `Engine::append`, timed separately on a fresh engine: validation, the cached
/// strategy lookup and the store's append (writer thread, commit, fsync).
fn append_phases(records: &[Record], policy: &str) -> Result<AppendPhases> {
    let dirs = Dirs::new(policy)?;
    let engine = dirs.open(APPEND_NOW_MICROS)?;
    let table = engine.policies().table(DATASET_TABLE)?.clone();
    let mut seconds = [0.0; 3];
    for chunk in records.chunks(APPEND_BATCH_RECORDS) {
        let batch = chunk.to_vec();
        let mut mark = Instant::now();
        for r in &batch {
            r.validate()?;
            std::str::from_utf8(&r.partition_key)?;
            std::str::from_utf8(&r.sort_key)?;
            black_box(serde_json::from_str::<&serde_json::value::RawValue>(&r.body)?);
        }
        lap(&mut seconds[0], &mut mark);
        let times: Vec<Micros> = batch.iter().map(|r| r.event_time).collect();
        let descriptors = table.strategy.buckets_for(&times)?;
        lap(&mut seconds[1], &mut mark);
        let rows = batch.into_iter().zip(descriptors).map(|(record, descriptor)| PreparedRow { descriptor, record });
        let outcome = engine.store().append(AppendBatch {
            table: table.id.clone(),
            strategy: table.strategy.identity().fingerprint(),
            rows: rows.collect(),
            writable_horizons: None,
            writable_buckets: 0,
            now: engine.clock().now(),
            archives_checked: Vec::new(),
            late_grace_us: 0,
        })?;
        lap(&mut seconds[2], &mut mark);
        ensure!(outcome.appended == chunk.len() as u64, "the store appended {outcome:?} of {}", chunk.len());
    }
    let metas = engine.store().all_buckets()?.into_iter().map(|m| (m.id.clone(), m)).collect();
    let phases = vec![
        ("validate (bounds, UTF-8 keys, body JSON)", seconds[0]),
        ("strategy buckets_for (cached WASM strategy)", seconds[1]),
        ("Store::append (writer thread: encode, insert rows and bucket metadata, commit)", seconds[2]),
    ];
    Ok((phases, metas))
}

//! Scenario hot-layout: the ways redb can delete one archived bucket's hot rows, measured on
//! plain redb with the store's key shapes, which chose schema 2's layout (a table per bucket):
//! key by key in slices of `SLICE_ROWS` from one table of every row (schema 1), redb's range
//! primitives on that table (`retain_in`, `extract_from_if`), and dropping the bucket's own
//! table. Each is timed over every bucket of the data set, with its longest single write
//! transaction (how long it holds the single writer, so how long an append may wait). Then a
//! drop of a bucket of 1 to 8 slices of rows is weighed against one slice deleted key by key:
//! how large a bucket the cleanup may drop whole within a slice's hold of the writer.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use frostline::store::schema::{BucketId, row_key};
use redb::{Database, ReadableDatabase as _, ReadableTable as _, ReadableTableMetadata as _, TableDefinition};

use crate::harness::{Bench, Figure, Unit};

const ROWS_DEFAULT: usize = 200_000;
const ROWS_FULL: usize = 2_000_000;
const BUCKETS: usize = 32;
/// As the engine's default `ARCHIVER_CLEANUP_SLICE_ROWS`.
const SLICE_ROWS: usize = 10_000;
/// About the size of a record of the benchmark data set.
const BODY_BYTES: usize = 300;

const ONE_TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");

#[derive(Clone, Copy, PartialEq)]
enum Method {
    KeyByKey,
    RetainIn,
    ExtractFromIf,
    DropTable,
}

impl Method {
    fn describe(self) -> &'static str {
        match self {
            Method::KeyByKey => "one table, remove key by key in slices (schema 1)",
            Method::RetainIn => "one table, retain_in over each slice's key range",
            Method::ExtractFromIf => "one table, extract_from_if drained a slice at a time",
            Method::DropTable => "a table per bucket, delete_table (schema 2)",
        }
    }
}

fn bucket(b: usize) -> BucketId {
    BucketId {
        table: "readings".into(),
        partition_key: b"sensor-0001".to_vec(),
        bucket_key: format!("day:2024-03-{b:02}"),
    }
}

/// Fills a new database with `rows` rows over `BUCKETS` buckets in `method`'s layout, then
/// deletes every bucket's rows; returns (seconds for all deletions, longest write transaction).
fn run(method: Method, rows: usize) -> Result<(f64, Duration)> {
    let dir = tempfile::tempdir()?;
    let db = Database::create(dir.path().join("layout.redb"))?;
    let body = vec![b'x'; BODY_BYTES];
    let per_bucket = rows / BUCKETS;
    let names: Vec<String> = (0..BUCKETS).map(|b| frostline::store::schema::rows_table_name(&bucket(b))).collect();
    for (b, name) in names.iter().enumerate() {
        let prefix = bucket(b).encode();
        for chunk in (0..per_bucket).collect::<Vec<_>>().chunks(SLICE_ROWS) {
            let txn = db.begin_write()?;
            {
                let mut table = if method == Method::DropTable {
                    txn.open_table(TableDefinition::new(name))?
                } else {
                    txn.open_table(ONE_TABLE)?
                };
                for &i in chunk {
                    let suffix = row_key(i as i64 * 1_000_000, format!("{i:08}").as_bytes());
                    let key = if method == Method::DropTable { suffix } else { [prefix.as_slice(), &suffix].concat() };
                    table.insert(key.as_slice(), body.as_slice())?;
                }
            }
            txn.commit()?;
        }
    }
    let started = Instant::now();
    let mut longest = Duration::ZERO;
    for (b, name) in names.iter().enumerate() {
        let prefix = bucket(b).encode();
        let end = frostline::store::encoding::prefix_end(&prefix);
        loop {
            let txn_started = Instant::now();
            let txn = db.begin_write()?;
            let finished = match method {
                Method::DropTable => {
                    txn.delete_table(TableDefinition::<&[u8], &[u8]>::new(name))?;
                    true
                }
                Method::KeyByKey => {
                    let mut table = txn.open_table(ONE_TABLE)?;
                    let keys: Vec<Vec<u8>> = table
                        .range(prefix.as_slice()..end.as_slice())?
                        .take(SLICE_ROWS + 1)
                        .map(|e| e.map(|(k, _)| k.value().to_vec()))
                        .collect::<Result<_, _>>()?;
                    for key in keys.iter().take(SLICE_ROWS) {
                        table.remove(key.as_slice())?;
                    }
                    keys.len() <= SLICE_ROWS
                }
                Method::RetainIn => {
                    let mut table = txn.open_table(ONE_TABLE)?;
                    let stop = table
                        .range(prefix.as_slice()..end.as_slice())?
                        .nth(SLICE_ROWS)
                        .transpose()?
                        .map(|(k, _)| k.value().to_vec());
                    let finished = stop.is_none();
                    let stop = stop.unwrap_or_else(|| end.clone());
                    table.retain_in(prefix.as_slice()..stop.as_slice(), |_, _| false)?;
                    finished
                }
                Method::ExtractFromIf => {
                    let mut table = txn.open_table(ONE_TABLE)?;
                    let taken =
                        table.extract_from_if(prefix.as_slice()..end.as_slice(), |_, _| true)?.take(SLICE_ROWS).count();
                    taken < SLICE_ROWS
                }
            };
            txn.commit()?;
            longest = longest.max(txn_started.elapsed());
            if finished {
                break;
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let read = db.begin_read()?;
    if method != Method::DropTable {
        let left = read.open_table(ONE_TABLE)?.len()?;
        ensure!(left == 0, "{}: {left} rows left after the cleanup", method.describe());
    }
    Ok((seconds, longest))
}

/// Milliseconds to drop one bucket's table of `rows` rows, and to delete one slice of
/// `SLICE_ROWS` rows key by key (oldest first, as the cleanup does) from another of the same size.
fn drop_against_slice(rows: usize) -> Result<(f64, f64)> {
    let dir = tempfile::tempdir()?;
    let db = Database::create(dir.path().join("drop.redb"))?;
    let body = vec![b'x'; BODY_BYTES];
    let (dropped, sliced) =
        (TableDefinition::<&[u8], &[u8]>::new("dropped"), TableDefinition::<&[u8], &[u8]>::new("sliced"));
    for table in [dropped, sliced] {
        let txn = db.begin_write()?;
        {
            let mut t = txn.open_table(table)?;
            for i in 0..rows {
                t.insert(row_key(i as i64 * 1_000_000, format!("{i:08}").as_bytes()).as_slice(), body.as_slice())?;
            }
        }
        txn.commit()?;
    }
    let started = Instant::now();
    let txn = db.begin_write()?;
    txn.delete_table(dropped)?;
    txn.commit()?;
    let drop_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let txn = db.begin_write()?;
    {
        let mut t = txn.open_table(sliced)?;
        for _ in 0..SLICE_ROWS.min(rows) {
            t.pop_first()?;
        }
    }
    txn.commit()?;
    Ok((drop_ms, started.elapsed().as_secs_f64() * 1e3))
}

/// Bucket sizes, in slices, at which a drop is weighed against one slice deleted key by key:
/// what `CLEANUP_DROP_WHOLE_SLICES` was chosen by.
const DROP_SIZES_IN_SLICES: [usize; 4] = [1, 2, 4, 8];

pub fn hot_layout(bench: &mut Bench) -> Result<()> {
    let rows = if bench.options.full { ROWS_FULL } else { ROWS_DEFAULT };
    let methods = [Method::KeyByKey, Method::RetainIn, Method::ExtractFromIf, Method::DropTable];
    let mut seconds: Vec<Vec<f64>> = vec![Vec::new(); methods.len()];
    let mut longest: Vec<Vec<f64>> = vec![Vec::new(); methods.len()];
    for round in 0..bench.options.repeats {
        // Rotate the order, so load from elsewhere lands on every method alike.
        for k in 0..methods.len() {
            let i = (k + round) % methods.len();
            let (s, l) = run(methods[i], rows)?;
            seconds[i].push(s * 1e3);
            longest[i].push(l.as_secs_f64() * 1e3);
        }
    }
    let what = format!("{rows} rows in {BUCKETS} buckets, slices of {SLICE_ROWS}");
    let baseline = Figure::new(
        bench.scenario,
        format!("delete every bucket's hot rows, {}, {what}", methods[0].describe()),
        Unit::Millis,
        seconds[0].clone(),
        1,
    );
    for (i, method) in methods.iter().enumerate().skip(1) {
        let figure = Figure::new(
            bench.scenario,
            format!("delete every bucket's hot rows, {}, {what}", method.describe()),
            Unit::Millis,
            seconds[i].clone(),
            1,
        )
        .against(&baseline);
        bench.push(figure);
    }
    bench.push(baseline);
    for (i, method) in methods.iter().enumerate() {
        bench.push(Figure::new(
            bench.scenario,
            format!("longest write transaction of that cleanup, {}, {what}", method.describe()),
            Unit::Millis,
            longest[i].clone(),
            1,
        ));
    }
    for slices in DROP_SIZES_IN_SLICES {
        let rows = slices * SLICE_ROWS;
        let (mut drops, mut one_slice) = (Vec::new(), Vec::new());
        for _ in 0..bench.options.repeats {
            let (drop_ms, slice_ms) = drop_against_slice(rows)?;
            drops.push(drop_ms);
            one_slice.push(slice_ms);
        }
        let slice = Figure::new(
            bench.scenario,
            format!("one slice of {SLICE_ROWS} rows deleted key by key (pop_first) from a bucket table of {rows} rows"),
            Unit::Millis,
            one_slice,
            1,
        );
        let dropped = Figure::new(
            bench.scenario,
            format!("delete_table of a bucket table of {rows} rows ({slices} slices), one write transaction"),
            Unit::Millis,
            drops,
            1,
        )
        .against(&slice);
        bench.push(slice);
        bench.push(dropped);
    }
    Ok(())
}

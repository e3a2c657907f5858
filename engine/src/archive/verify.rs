//! `frostline verify`, the scrub: re-reads every published manifest and segment (of one
//! table, or a random sample), checks every hash, count and row checksum, and reports per
//! bucket. The buckets to check are chosen from the tallies' indexes (keys only: every
//! archived bucket by state, or a random sample by seeking random points of the index by
//! hash), and their rows read a few hundred at a time from fresh snapshots: a verification
//! of a sample reads about the sample, and none holds the store open while it reads the
//! archives.

use std::sync::Arc;

use rand::SeedableRng;

use super::{blocking, read_manifest, read_segment};
use crate::engine::Context;
use crate::error::Result;
use crate::model::BucketState;
use crate::store::schema::BucketId;
use crate::store::{Snapshot, Store};

/// The states of a published bucket, whose archive a verification reads.
const VERIFIED_STATES: [BucketState; 2] =
    [BucketState::Archived { hot_deleted: true }, BucketState::Archived { hot_deleted: false }];

/// Buckets whose rows are read per snapshot while verifying.
const VERIFY_CHUNK_BUCKETS: usize = 256;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BucketVerdict {
    pub bucket: String,
    pub manifest_key: String,
    pub rows: u64,
    pub segments: usize,
    pub ok: bool,
    pub error: Option<String>,
}

/// How many archived buckets `table` (every table: `None`) holds, from the tallies.
pub fn archived_count(store: &Store, table: Option<&str>) -> Result<u64> {
    Ok(archived_slots(&store.snapshot()?, table)?.iter().map(|(_, _, count)| count).sum())
}

/// The tables and states a verification of `table` (every table: `None`) reads, each with
/// how many archived buckets it holds, from the tallies.
fn archived_slots(snapshot: &Snapshot, table: Option<&str>) -> Result<Vec<(String, BucketState, u64)>> {
    let tables = match table {
        Some(table) => vec![table.to_string()],
        None => snapshot.tallied_tables()?,
    };
    let mut slots = Vec::new();
    for table in tables {
        for state in VERIFIED_STATES {
            let count = snapshot.count_in_state(&table, state)?;
            if count > 0 {
                slots.push((table.clone(), state, count));
            }
        }
    }
    Ok(slots)
}

/// The archived buckets a verification checks: every one of `table` (every table: `None`),
/// or `sample` of them chosen at random. A sample draws how many come from each table and
/// state by their tallies, then seeks that many random points of the index by hash: it reads
/// about the sample's keys, whatever the archive's size. Keys only; it holds the chosen ids.
pub fn chosen(store: &Store, table: Option<&str>, sample: Option<usize>, seed: u64) -> Result<Vec<BucketId>> {
    let snapshot = store.snapshot()?;
    let slots = archived_slots(&snapshot, table)?;
    let total: u64 = slots.iter().map(|(_, _, count)| count).sum();
    let mut ids = Vec::new();
    let Some(sample) = sample else {
        for (table, state, _) in &slots {
            snapshot.visit_ids_in_state(table, *state, |id| {
                ids.push(id);
                Ok(())
            })?;
        }
        return Ok(ids);
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Positions over every archived bucket, counted per slot: each slot's share of the sample
    // is drawn as a uniform sample of the whole would draw it.
    let mut shares = vec![0usize; slots.len()];
    for position in rand::seq::index::sample(&mut rng, total as usize, sample.min(total as usize)) {
        let mut before = 0;
        for (share, (_, _, count)) in shares.iter_mut().zip(&slots) {
            if (position as u64) < before + count {
                *share += 1;
                break;
            }
            before += count;
        }
    }
    for ((table, state, count), share) in slots.iter().zip(shares) {
        if share > 0 {
            ids.extend(snapshot.sample_archived_ids(table, *state, *count, share, &mut rng)?);
        }
    }
    Ok(ids)
}

/// Verifies archived buckets; `on_bucket` is called after each (progress). A bucket that
/// stopped being archived between its choice and its check (expired, erased, or taking a
/// next generation) is passed over.
pub async fn verify(
    ctx: &Arc<Context>,
    table: Option<String>,
    sample: Option<usize>,
    on_bucket: impl Fn(usize),
) -> Result<Vec<BucketVerdict>> {
    let (store, seed) = (ctx.store.clone(), ctx.random_u64());
    let ids = blocking(move || chosen(&store, table.as_deref(), sample, seed)).await?;
    let total = ids.len();
    let policies = ctx.policies.clone();
    let mut verdicts = Vec::with_capacity(total);
    let mut done = 0;
    for chunk in ids.chunks(VERIFY_CHUNK_BUCKETS) {
        let (store, chunk) = (ctx.store.clone(), chunk.to_vec());
        let metas = blocking(move || {
            let snapshot = store.snapshot()?;
            chunk.iter().map(|id| snapshot.bucket(id)).collect::<Result<Vec<_>>>()
        })
        .await?;
        for meta in metas {
            done += 1;
            let Some(meta) = meta.filter(|m| matches!(m.state, BucketState::Archived { .. })) else {
                on_bucket(done);
                continue;
            };
            let key = meta.manifest_key.clone().unwrap_or_default();
            let mut verdict = BucketVerdict {
                bucket: meta.id.display(),
                manifest_key: key.clone(),
                rows: 0,
                segments: 0,
                ok: false,
                error: None,
            };
            let outcome: Result<()> = async {
                let table = policies.table(&meta.id.table)?;
                let backend = super::recorded_backend(ctx, &policies, table, &meta.id).await?;
                let manifest = read_manifest(backend.as_ref(), &key).await?;
                verdict.segments = manifest.segments.len();
                // Segment by segment, each checked against its entry and summed on the way: one
                // segment in memory, whatever the size of the bucket.
                let mut summer = crate::model::rows::RowSummer::default();
                for segment in &manifest.segments {
                    for row in read_segment(backend.as_ref(), &key, manifest.format, segment).await? {
                        summer.push(&row);
                        verdict.rows += 1;
                    }
                }
                if verdict.rows != meta.row_count || manifest.summary.rows != meta.row_count {
                    return Err(crate::Error::Corruption(format!(
                        "the bucket records {} rows, the manifest {} and the segments hold {}",
                        meta.row_count, manifest.summary.rows, verdict.rows
                    )));
                }
                let summary = summer.finish();
                if summary != manifest.summary {
                    return Err(crate::Error::Corruption(
                        "row checksum of the segments differs from the manifest".into(),
                    ));
                }
                Ok(())
            }
            .await;
            match outcome {
                Ok(()) => verdict.ok = true,
                Err(e) => verdict.error = Some(e.to_string()),
            }
            verdicts.push(verdict);
            on_bucket(done);
        }
    }
    Ok(verdicts)
}

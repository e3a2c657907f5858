//! `frostline verify`, the scrub: re-reads every published manifest and segment (of one
//! table, or a random sample), checks every hash, count and row checksum, and reports per
//! bucket.

use std::sync::Arc;

use rand::seq::SliceRandom;

use super::{blocking, read_manifest, verify_segment};
use crate::engine::Context;
use crate::error::Result;
use crate::model::BucketState;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BucketVerdict {
    pub bucket: String,
    pub manifest_key: String,
    pub rows: u64,
    pub segments: usize,
    pub ok: bool,
    pub error: Option<String>,
}

/// Verifies archived buckets; `on_bucket` is called after each (progress).
pub async fn verify(
    ctx: &Arc<Context>,
    table: Option<String>,
    sample: Option<usize>,
    on_bucket: impl Fn(usize),
) -> Result<Vec<BucketVerdict>> {
    let store = ctx.store.clone();
    let mut buckets = blocking(move || store.all_buckets()).await?;
    buckets
        .retain(|b| matches!(b.state, BucketState::Archived { .. }) && table.as_ref().is_none_or(|t| &b.id.table == t));
    if let Some(n) = sample {
        buckets.shuffle(&mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(ctx.random_u64()));
        buckets.truncate(n);
    }
    let total = buckets.len();
    let policies = ctx.policies.clone();
    let mut verdicts = Vec::with_capacity(total);
    for (i, meta) in buckets.into_iter().enumerate() {
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
                let bytes = backend.get(&segment.key).await?.ok_or_else(|| {
                    crate::Error::Corruption(format!("segment `{}` named by `{key}` is missing", segment.key))
                })?;
                for row in verify_segment(manifest.format, segment, &bytes)? {
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
                return Err(crate::Error::Corruption("row checksum of the segments differs from the manifest".into()));
            }
            Ok(())
        }
        .await;
        match outcome {
            Ok(()) => verdict.ok = true,
            Err(e) => verdict.error = Some(e.to_string()),
        }
        verdicts.push(verdict);
        on_bucket(i + 1);
    }
    Ok(verdicts)
}

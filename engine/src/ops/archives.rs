//! Work on the archives an operator asks for: verify them, sweep the orphans, adopt what a
//! lost or restored data directory left on its targets, and rebuild a Delta log.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::error::Result;

pub use crate::archive::adopt::AdoptReport;
pub use crate::archive::sweep::SweepReport;
pub use crate::archive::verify::BucketVerdict;

/// The answer of a verification: a verdict per archived bucket checked, and how many failed.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct VerifyReport {
    pub verdicts: Vec<BucketVerdict>,
    pub failed: usize,
}

/// How many buckets a verification of `table` (every table: `None`) would check, `sample`
/// limiting it: the length of a progress bar.
pub fn verify_total(engine: &Engine, table: Option<&str>, sample: Option<usize>) -> Result<usize> {
    let total = crate::archive::verify::archived_count(engine.store(), table)? as usize;
    Ok(sample.map_or(total, |n| n.min(total)))
}

/// Reads back archived buckets (all, or a random `sample`) and checks every hash;
/// `on_bucket` is told how many are done.
pub async fn verify(
    engine: &Arc<Engine>,
    table: Option<String>,
    sample: Option<usize>,
    on_bucket: impl Fn(usize),
) -> Result<VerifyReport> {
    let verdicts = crate::archive::verify::verify(&engine.context(), table, sample, on_bucket).await?;
    let failed = verdicts.iter().filter(|v| !v.ok).count();
    Ok(VerifyReport { verdicts, failed })
}

/// The orphan sweep, now (`archive::sweep`): deletes only what this installation released.
pub async fn sweep(engine: &Arc<Engine>, dry_run: bool) -> Result<SweepReport> {
    crate::archive::sweep::sweep(&engine.context(), dry_run).await
}

/// Takes in the archives on the targets that this data directory does not record
/// (`archive::adopt`); other installations' only when named.
pub async fn adopt(engine: &Arc<Engine>, dry_run: bool, from_installations: &[String]) -> Result<AdoptReport> {
    crate::archive::adopt::adopt(&engine.context(), dry_run, from_installations).await
}

/// What a sync of one table's Delta log changed.
#[cfg(feature = "delta")]
pub use crate::archive::delta::DeltaSync;

/// One table's Delta log after a rebuild, or why it failed.
#[cfg(feature = "delta")]
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct DeltaRebuild {
    #[serde(flatten)]
    pub sync: DeltaSync,
    /// Why the sync failed, and how to start the log over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Syncs the Delta log of `table` (every table that has one: `None`) with what this
/// installation publishes, repairing entries earlier builds wrote.
#[cfg(feature = "delta")]
pub async fn delta_rebuild(engine: &Arc<Engine>, table: Option<&str>) -> Result<Vec<DeltaRebuild>> {
    let context = engine.context();
    let policies = &context.policies;
    let tables: Vec<_> = match table {
        Some(id) => {
            let table = policies.table(id)?.clone();
            if !table.delta_log() {
                return Err(crate::Error::InvalidInput(format!(
                    "table `{id}` has no Delta log: only Parquet tables on object-store targets have one"
                )));
            }
            vec![table]
        }
        None => policies.tables.values().filter(|t| t.delta_log()).cloned().collect(),
    };
    let mut out = Vec::with_capacity(tables.len());
    for table in tables {
        out.push(match crate::archive::delta::sync(&context, &table).await {
            Ok(sync) => DeltaRebuild { sync, error: None },
            Err(e) => DeltaRebuild {
                sync: DeltaSync { table: table.id.clone(), ..DeltaSync::default() },
                error: Some(format!(
                    "{e}\nif the log is damaged, move {}_delta_log/ on target `{}` aside and run `frostline delta \
                     rebuild` on every installation that archives into the table",
                    crate::storage::keys::delta_table_root(&table.id),
                    table.target_name
                )),
            },
        });
    }
    Ok(out)
}

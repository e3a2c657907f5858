//! Legal holds declared in policy files (`[[hold]]`): checked when the policy loads, with a
//! stable id so a reload that keeps a hold keeps its id, and the ones a new set releases.

use std::path::Path;

use serde::Deserialize;

use super::{PolicySet, invalid};
use crate::error::Result;
use crate::model;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHold {
    table: String,
    partition: Option<String>,
    tenant: Option<String>,
    bucket: Option<String>,
    reason: String,
    placed_by: Option<String>,
}

pub(super) fn validate_hold(file: &Path, raw: RawHold) -> Result<crate::store::schema::Hold> {
    model::validate_table_id(&raw.table).map_err(|e| invalid(file, format!("hold: {e}")))?;
    let placed_by = raw.placed_by.unwrap_or_else(|| "policy".into());
    crate::store::schema::Hold::check_declared(&raw.reason, &placed_by)
        .map_err(|why| invalid(file, format!("hold on table `{}`: {why}", raw.table)))?;
    let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // A stable id, so a reload that keeps the hold keeps its id.
    let fingerprint = crate::format::manifest::sha256_hex(
        format!("{}\0{:?}\0{:?}\0{:?}\0{}", raw.table, raw.partition, raw.tenant, raw.bucket, raw.reason).as_bytes(),
    );
    Ok(crate::store::schema::Hold {
        id: format!("policy-{}", &fingerprint[..12]),
        table: raw.table,
        partition_key: raw.partition,
        tenant: raw.tenant,
        bucket_key: raw.bucket,
        reason: raw.reason,
        placed_by,
        placed_at: 0,
        source: format!("policy:{name}"),
    })
}

/// The policy holds among `stored` (the store's holds) that installing `set` releases:
/// declared by the directory before, gone from it now. `Store::sync_policy_holds` releases
/// exactly these; a reload reports them and logs them at warn.
pub fn released_holds(stored: Vec<crate::store::schema::Hold>, set: &PolicySet) -> Vec<crate::store::schema::Hold> {
    stored
        .into_iter()
        .filter(|h| h.source.starts_with("policy:") && !set.holds.iter().any(|kept| kept.id == h.id))
        .collect()
}

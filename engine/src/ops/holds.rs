//! Legal holds as a user places, lists and lifts them (the CLI locally, the API remotely):
//! the request's validation, the listing with what each hold covers, and the rule that a hold
//! declared in the policy directory is lifted only there.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::store::schema::Hold;

/// A hold with what it covers, for listings.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct HoldListing {
    #[serde(flatten)]
    pub hold: Hold,
    pub covered_buckets: u64,
}

/// Every hold, placed (API, CLI) and declared (policy directory; the store keeps them in step
/// with the active set), with the buckets it covers.
pub fn list_holds(engine: &Engine) -> Result<Vec<HoldListing>> {
    let holds = engine.store().holds()?;
    let mut covered = vec![0u64; holds.len()];
    engine.store().visit_buckets(|b| {
        for (hold, count) in holds.iter().zip(&mut covered) {
            *count += u64::from(hold.covers(&b));
        }
        Ok(())
    })?;
    Ok(holds.into_iter().zip(covered).map(|(hold, covered_buckets)| HoldListing { hold, covered_buckets }).collect())
}

/// What placing a hold asks for: `frostline hold place`'s flags and `POST /v1/holds`'s body.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldRequest {
    pub table: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// A bucket key, such as year:2024.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    pub reason: String,
    pub placed_by: String,
}

/// A placed hold's id, the buckets it covers now, and what it did to expiries under way.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HoldPlaced {
    pub id: String,
    pub covered_buckets: u64,
    /// Buckets whose expiry had written its tombstone but deleted nothing: called off, held.
    #[serde(default)]
    pub expiries_called_off: Vec<String>,
    /// Buckets whose expiry had already started deleting objects: the hold is placed, but it
    /// cannot bring these archives back.
    #[serde(default)]
    pub too_late: Vec<String>,
}

/// Builds a hold from a request: checks it (the table must be declared, the reason and who
/// placed it must be given) and gives it a fresh id. The CLI (`source` = `cli`) and the API
/// (`api`) build holds only through this.
pub fn new_hold(engine: &Engine, request: HoldRequest, source: &str) -> Result<Hold> {
    engine.policies().table(&request.table)?;
    Hold::check_declared(&request.reason, &request.placed_by).map_err(Error::InvalidInput)?;
    Ok(Hold {
        id: format!("h-{:012x}", engine.random_u64() >> 16),
        table: request.table,
        partition_key: request.partition,
        tenant: request.tenant,
        bucket_key: request.bucket,
        reason: request.reason,
        placed_by: request.placed_by,
        placed_at: engine.clock().now(),
        source: source.into(),
    })
}

/// Builds (`new_hold`) and places a hold.
pub fn place_hold(engine: &Engine, request: HoldRequest, source: &str) -> Result<HoldPlaced> {
    let hold = new_hold(engine, request, source)?;
    let id = hold.id.clone();
    let placement = engine.store().place_hold(hold, engine.clock().now())?;
    Ok(HoldPlaced {
        id,
        covered_buckets: placement.covered,
        expiries_called_off: placement.expiries_called_off,
        too_late: placement.too_late,
    })
}

/// Whether a hold id names a hold declared in the policy directory (lifted only there).
pub fn is_policy_hold(id: &str) -> bool {
    id.starts_with("policy-")
}

/// The hold with this id, if there is one.
pub fn find_hold(engine: &Engine, id: &str) -> Result<Option<Hold>> {
    Ok(engine.store().holds()?.into_iter().find(|h| h.id == id))
}

/// Lifts a placed hold; a policy-declared one is a conflict (remove it from the policy
/// directory instead).
pub fn lift_hold(engine: &Engine, id: String, by: String) -> Result<Hold> {
    if is_policy_hold(&id) {
        return Err(Error::Conflict(format!(
            "hold `{id}` is declared in the policy directory: remove it there (and reload) to lift it"
        )));
    }
    engine.store().lift_hold(id, by, engine.clock().now())
}

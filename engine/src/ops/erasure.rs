//! Erasure requests as a user places and follows them (`frostline erase` locally, the API
//! remotely): the request's validation and its receipt. The pass carries requests out
//! (`archive::erase`); ARCHITECTURE.md, "Erasure", says what stays where.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::model::time::parse_time_arg;
pub use crate::store::erasure::{
    ErasureBucket, ErasurePreview, ErasureProgress, ErasureRequest, ErasureSelector, RecordIdentity,
};

/// What placing an erasure asks for: `frostline erase place`'s flags and `POST /v1/erasures`'s
/// body. Times are RFC 3339 (or what `--from` and `--to` of a query take).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EraseRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Exact records: partition key, event time (microseconds) and sort key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub records: Vec<RecordIdentity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    pub reason: String,
    pub requested_by: String,
    /// Count what it would touch; change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// A placed request (with the buckets it matched), or what a dry run counted.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ErasurePlaced {
    pub dry_run: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<ErasurePreview>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<ErasureRequest>,
}

/// Checks a request (a declared table if one is named, a reason and a requester, a selector
/// that names something, times that parse) and places it, or counts it in a dry run.
pub fn place_erasure(engine: &Engine, request: EraseRequest) -> Result<ErasurePlaced> {
    if let Some(table) = &request.table {
        engine.policies().table(table)?;
    }
    if request.reason.trim().is_empty() || request.requested_by.trim().is_empty() {
        return Err(Error::InvalidInput(
            "an erasure's `reason` (why, such as the request it answers) and `requested_by` (who asks) must both be \
             given; nothing was placed"
                .into(),
        ));
    }
    let time = |name: &str, value: &Option<String>| {
        value.as_deref().map(parse_time_arg).transpose().map_err(|e| Error::InvalidInput(format!("`{name}`: {e}")))
    };
    let selector = ErasureSelector {
        table: request.table,
        tenant: request.tenant,
        partition_key: request.partition,
        identities: request.records,
        from: time("from", &request.from)?,
        to: time("to", &request.to)?,
        keyed: None,
    };
    if request.dry_run {
        let preview = engine.store().preview_erasure(&selector)?;
        return Ok(ErasurePlaced { dry_run: true, preview: Some(preview), request: None });
    }
    let placed = ErasureRequest {
        id: format!("e-{:012x}", engine.random_u64() >> 16),
        selector,
        reason: request.reason,
        requester: request.requested_by,
        placed_at: 0,
        finished_at: None,
        buckets: Vec::new(),
        fleet: Vec::new(),
        answers_for: None,
    };
    let placed = engine.store().place_erasure(placed, engine.clock().now())?;
    tracing::info!(request = %placed.id, buckets = placed.buckets.len(), "erasure request placed");
    Ok(ErasurePlaced { dry_run: false, preview: None, request: Some(placed) })
}

/// Every request with its receipt, newest first.
pub fn list_erasures(engine: &Engine) -> Result<Vec<ErasureRequest>> {
    let mut all = engine.store().erasures()?;
    all.sort_by_key(|r| std::cmp::Reverse(r.placed_at));
    Ok(all)
}

/// One request with its receipt, and what the targets it shares with other installations say
/// of it (`fleet`: who finished it, who has not). A target that cannot be read leaves its part
/// out, with a warning; the local receipt still answers.
pub fn erasure(engine: &Engine, id: &str) -> Result<ErasureRequest> {
    let mut request = engine
        .store()
        .erasure(id)?
        .ok_or_else(|| Error::NotFound(format!("no erasure request `{id}`; `frostline erase status` lists them")))?;
    if engine.settings().share_erasures.is_some() {
        match crate::storage::block_on(crate::archive::fleet_erase::progress(&engine.context(), id)) {
            Ok(fleet) => request.fleet = fleet,
            Err(e) => tracing::warn!(request = id, error = %e, "cannot read the shared targets' receipts"),
        }
    }
    Ok(request)
}

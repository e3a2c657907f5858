//! Reads of records across hot and cold, in the shapes both ways in use: the typed request, a
//! page, and the page's JSON as `GET /v1/tables/{table}/records` sends it.

use std::sync::Arc;

use crate::engine::Engine;
use crate::error::{Error, Result};

pub use crate::query::{ExpiredRange, QUERY_LIMIT_DEFAULT, QUERY_LIMIT_MAX, QueryPage, QueryRequest};

/// One page of a query (`query::query`: hot rows and verified archives, expired ranges named).
pub async fn query(engine: &Arc<Engine>, request: QueryRequest) -> Result<QueryPage> {
    crate::query::query(&engine.context(), request).await
}

/// The page as the API sends it: `{"records": [...], "next_cursor": ..., "expired": [...]}`,
/// each record in its JSON-lines shape with the body byte for byte.
pub fn page_json(page: &QueryPage) -> Result<String> {
    let mut body = String::from("{\"records\":[");
    for (i, r) in page.records.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&super::records::record_json(r));
    }
    body.push_str("],\"next_cursor\":");
    body.push_str(&serde_json::to_string(&page.next_cursor).map_err(|e| Error::Internal(e.to_string()))?);
    // Ranges whose archives expired on purpose: gone by retention, not missing.
    body.push_str(",\"expired\":");
    body.push_str(&serde_json::to_string(&page.expired).map_err(|e| Error::Internal(e.to_string()))?);
    body.push('}');
    Ok(body)
}

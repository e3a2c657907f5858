//! The erasure routes (admin): place a request (or count it, `dry_run`), list requests with
//! their receipts, read one. The work is `ops::erasure`'s; the pass carries requests out. A
//! token limited to tenants places, lists and reads only requests that name one of its tenants
//! (and, limited to tables, one of its tables).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::auth::forbidden;
use super::handlers::{Shared, blocking, read_body, unprocessable};
use super::{ApiError, Scope};
use crate::ops;

/// A request is within a token's reach when it names one of the token's tenants (and tables):
/// a request that names no tenant reaches every tenant's records.
fn check_request(scope: &Scope, table: Option<&str>, tenant: Option<&str>) -> Result<(), ApiError> {
    match table {
        Some(table) => scope.check_table(table)?,
        None if scope.tables.is_some() => {
            return Err(forbidden(
                "the erasure request names no table, so it reaches every table; this token is limited to tables: \
                 name one",
            ));
        }
        None => {}
    }
    scope.check_tenant(tenant, "the erasure request")
}

pub(super) async fn place(
    State(state): Shared,
    Extension(scope): Extension<Arc<Scope>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&headers, body).await?;
    let request: ops::erasure::EraseRequest = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "the body is not an erasure {{\"table\"?, \"tenant\"?, \"partition\"?, \"records\"?, \"from\"?, \"to\"?, \
             \"reason\", \"requested_by\", \"dry_run\"?}}: {e}"
        ))
    })?;
    check_request(&scope, request.table.as_deref(), request.tenant.as_deref())?;
    let dry_run = request.dry_run;
    // A well-formed request that is refused (nothing to select by, no reason) is 422.
    let placed =
        blocking(move || Ok(ops::erasure::place_erasure(&state.engine, request))).await?.map_err(|refusal| {
            match refusal.kind() {
                crate::ErrorKind::InvalidInput => unprocessable(refusal.to_string()),
                _ => ApiError::from(refusal),
            }
        })?;
    let status = if dry_run { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, Json(placed)).into_response())
}

pub(super) async fn list(State(state): Shared, Extension(scope): Extension<Arc<Scope>>) -> Result<Response, ApiError> {
    let mut erasures = blocking(move || ops::erasure::list_erasures(&state.engine)).await?;
    // A request taken from a shared target names its tenant only by a digest: beyond a
    // limited token.
    erasures.retain(|r| {
        scope.is_unlimited()
            || (r.selector.keyed.is_none()
                && check_request(&scope, r.selector.table.as_deref(), r.selector.tenant.as_deref()).is_ok())
    });
    Ok(Json(serde_json::json!({ "erasures": erasures })).into_response())
}

pub(super) async fn one(
    State(state): Shared,
    Extension(scope): Extension<Arc<Scope>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let erasure = blocking(move || ops::erasure::erasure(&state.engine, &id)).await?;
    if !scope.is_unlimited() {
        if erasure.selector.keyed.is_some() {
            // Taken from a shared target, it names its tenant only by a digest.
            return Err(forbidden(format!(
                "erasure request `{}` was taken from a shared target and names its tenant only by a digest; a \
                 limited token cannot read it",
                erasure.id
            )));
        }
        check_request(&scope, erasure.selector.table.as_deref(), erasure.selector.tenant.as_deref())?;
    }
    Ok(Json(erasure).into_response())
}

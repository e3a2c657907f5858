//! The erasure routes (admin): place a request (or count it, `dry_run`), list requests with
//! their receipts, read one. The work is `ops::erasure`'s; the pass carries requests out.

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::ApiError;
use super::handlers::{Shared, blocking, read_body, unprocessable};
use crate::ops;

pub(super) async fn place(State(state): Shared, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let bytes = read_body(&headers, body).await?;
    let request: ops::erasure::EraseRequest = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "the body is not an erasure {{\"table\"?, \"tenant\"?, \"partition\"?, \"records\"?, \"from\"?, \"to\"?, \
             \"reason\", \"requested_by\", \"dry_run\"?}}: {e}"
        ))
    })?;
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

pub(super) async fn list(State(state): Shared) -> Result<Response, ApiError> {
    let erasures = blocking(move || ops::erasure::list_erasures(&state.engine)).await?;
    Ok(Json(serde_json::json!({ "erasures": erasures })).into_response())
}

pub(super) async fn one(State(state): Shared, path: Result<Path<String>, PathRejection>) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let erasure = blocking(move || ops::erasure::erasure(&state.engine, &id)).await?;
    Ok(Json(erasure).into_response())
}

//! One handler per route of `ROUTES`. Handlers parse and check the request, run engine work
//! (on a blocking thread when it blocks) and shape the answer; they hold no engine logic.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::{
    ApiError, ApiState, BUCKETS_LIMIT_DEFAULT, BUCKETS_LIMIT_MAX, HTTP_BODY_BYTES_MAX, HTTP_BODY_DRAIN_BYTES_MAX,
    HTTP_BODY_DRAIN_SECONDS_MAX, HTTP_RECORD_ERRORS_REPORTED_MAX, HTTP_RECORDS_PER_REQUEST_MAX, RecordError, Route,
    RouteId,
};
use crate::error::{Error, ErrorKind};
use crate::model::time::{format_rfc3339, parse_time_arg};
use crate::model::{BucketState, Record};

type Shared = State<Arc<ApiState>>;

/// The handler of a route, for its method.
pub(super) fn method_router(route: &Route) -> MethodRouter<Arc<ApiState>> {
    let filter = match route.method {
        "GET" => MethodFilter::GET,
        "POST" => MethodFilter::POST,
        other => panic!("route {} uses method {other}; only GET and POST are served", route.path),
    };
    match route.id {
        RouteId::Health => on(filter, health),
        RouteId::Metrics => on(filter, metrics),
        RouteId::Append => on(filter, append),
        RouteId::Query => on(filter, query),
        RouteId::Buckets => on(filter, buckets),
        RouteId::Status => on(filter, status),
        RouteId::Plugins => on(filter, plugins),
        RouteId::LastReload => on(filter, last_reload),
        RouteId::Reload => on(filter, reload),
        RouteId::Archive => on(filter, archive),
    }
}

pub(super) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route; docs/API.md lists them")
}

/// Runs blocking engine work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> crate::Result<T> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::from(Error::Internal(format!("blocking task failed: {e}"))))?
        .map_err(ApiError::from)
}

/// The table named in the path, if the active policy set declares it.
fn known_table(state: &ApiState, path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(table) = path.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if !state.engine.policies().tables.contains_key(&table) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no table `{table}` in the policy directory; GET /v1/status lists the tables"),
        ));
    }
    Ok(table)
}

fn query_params<T>(params: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    params.map(|Query(p)| p).map_err(|e| ApiError::bad_request(e.body_text()))
}

async fn health(State(state): Shared) -> Response {
    match state.engine.store.poisoned() {
        None => Json(serde_json::json!({"status": "ok"})).into_response(),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"status": "unavailable", "reason": format!("the store refuses writes: {why}")})),
        )
            .into_response(),
    }
}

async fn metrics(State(state): Shared) -> Result<Response, ApiError> {
    let text = blocking(move || state.metrics.render(&state.engine)).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

/// Reads the body, refusing it with 413 once it passes `HTTP_BODY_BYTES_MAX`. The rest of a
/// refused body is read and dropped (up to `HTTP_BODY_DRAIN_BYTES_MAX`, for at most
/// `HTTP_BODY_DRAIN_SECONDS_MAX`) so a client still sending it sees the answer instead of a
/// reset connection; a body declared larger than that is refused at once.
async fn read_body(headers: &HeaderMap, body: Body) -> Result<Vec<u8>, ApiError> {
    let too_large = || {
        ApiError::limit(
            StatusCode::PAYLOAD_TOO_LARGE,
            "HTTP_BODY_BYTES_MAX",
            HTTP_BODY_BYTES_MAX,
            format!(
                "the request body is larger than HTTP_BODY_BYTES_MAX ({HTTP_BODY_BYTES_MAX} bytes); nothing was \
                 written: send smaller batches"
            ),
        )
    };
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > HTTP_BODY_DRAIN_BYTES_MAX as u64) {
        return Err(too_large());
    }
    let mut stream = body.into_data_stream();
    let mut out = Vec::with_capacity(declared.unwrap_or(0).min(HTTP_BODY_BYTES_MAX as u64) as usize);
    let mut seen = 0usize;
    let mut over = declared.is_some_and(|n| n > HTTP_BODY_BYTES_MAX as u64);
    while !over && let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        seen += chunk.len();
        over = seen > HTTP_BODY_BYTES_MAX;
        if !over {
            out.extend_from_slice(&chunk);
        }
    }
    if !over {
        return Ok(out);
    }
    drop(out);
    let drain = async {
        while let Some(Ok(chunk)) = stream.next().await {
            seen += chunk.len();
            if seen > HTTP_BODY_DRAIN_BYTES_MAX {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(HTTP_BODY_DRAIN_SECONDS_MAX), drain).await;
    Err(too_large())
}

fn too_many_records(count: usize) -> ApiError {
    ApiError::limit(
        StatusCode::UNPROCESSABLE_ENTITY,
        "HTTP_RECORDS_PER_REQUEST_MAX",
        HTTP_RECORDS_PER_REQUEST_MAX,
        format!(
            "the request holds {count} records, more than HTTP_RECORDS_PER_REQUEST_MAX \
             ({HTTP_RECORDS_PER_REQUEST_MAX}); nothing was written: send smaller batches"
        ),
    )
}

/// Parses a batch: a JSON array of records, or JSON lines (blank lines skipped), each record
/// in the shape `frostline ingest` reads. Any invalid record refuses the whole batch.
pub(super) fn parse_batch(bytes: &[u8]) -> Result<Vec<Record>, ApiError> {
    let text =
        std::str::from_utf8(bytes).map_err(|e| ApiError::bad_request(format!("the request body is not UTF-8: {e}")))?;
    let mut records = Vec::new();
    let mut errors = Vec::new();
    if text.trim_start().starts_with('[') {
        let items: Vec<&serde_json::value::RawValue> = serde_json::from_str(text).map_err(|e| {
            ApiError::bad_request(format!("the request body is neither a JSON array of records nor JSON lines: {e}"))
        })?;
        if items.len() > HTTP_RECORDS_PER_REQUEST_MAX {
            return Err(too_many_records(items.len()));
        }
        for (index, item) in items.iter().enumerate() {
            match crate::cli::ingest::parse_line(item.get()) {
                Ok(r) => records.push(r),
                Err(e) => errors.push(RecordError { line: None, index: Some(index), reason: reason_of(&e) }),
            }
        }
    } else {
        let count = text.lines().filter(|l| !l.trim().is_empty()).count();
        if count > HTTP_RECORDS_PER_REQUEST_MAX {
            return Err(too_many_records(count));
        }
        for (n, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            match crate::cli::ingest::parse_line(raw) {
                Ok(r) => records.push(r),
                Err(e) => errors.push(RecordError { line: Some(n + 1), index: None, reason: reason_of(&e) }),
            }
        }
    }
    if errors.is_empty() {
        return Ok(records);
    }
    let mut refusal = ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_input",
        format!("{} invalid record(s); nothing was written", errors.len()),
    );
    refusal.body.invalid_records = Some(errors.len());
    errors.truncate(HTTP_RECORD_ERRORS_REPORTED_MAX);
    refusal.body.records = errors;
    Err(refusal)
}

/// An error's message without the kind prefix its `Display` carries.
fn reason_of(error: &Error) -> String {
    match error {
        Error::InvalidInput(message) => message.clone(),
        other => other.to_string(),
    }
}

async fn append(
    State(state): Shared,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let table = known_table(&state, path)?;
    let outcome: Result<crate::store::AppendOutcome, ApiError> = async {
        let bytes = read_body(&headers, body).await?;
        let records = parse_batch(&bytes)?;
        drop(bytes);
        let engine = state.engine.clone();
        // Acknowledged only after `Engine::append` returns, that is after the commit.
        tokio::task::spawn_blocking(move || engine.append(&table, records))
            .await
            .map_err(|e| ApiError::from(Error::Internal(format!("append task failed: {e}"))))?
            .map_err(|e| {
                let mut refusal = ApiError::from_engine(&e);
                // A record the table cannot take (no bucket for its time, a retired table).
                if e.kind() == ErrorKind::InvalidInput {
                    refusal.status = StatusCode::UNPROCESSABLE_ENTITY;
                }
                refusal
            })
    }
    .await;
    match outcome {
        Ok(outcome) => {
            state.metrics.records_appended.inc_by(outcome.appended);
            state.metrics.records_duplicate.inc_by(outcome.duplicates);
            Ok(Json(outcome).into_response())
        }
        Err(refusal) => {
            let reason = match (&refusal.body.error.limit, refusal.status) {
                (Some(_), StatusCode::PAYLOAD_TOO_LARGE) => "body_too_large".to_string(),
                (Some(_), _) => "too_many_records".to_string(),
                (None, _) => refusal.body.error.kind.clone(),
            };
            state.metrics.record_refusal(&reason);
            Err(refusal)
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QueryParams {
    partition: Option<String>,
    from: Option<String>,
    to: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

async fn query(
    State(state): Shared,
    path: Result<Path<String>, PathRejection>,
    params: Result<Query<QueryParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let table = known_table(&state, path)?;
    let params = query_params(params)?;
    let request = crate::query::QueryRequest {
        table,
        partition_key: params.partition.map(String::into_bytes),
        from: params.from.as_deref().map(parse_time_arg).transpose()?,
        to: params.to.as_deref().map(parse_time_arg).transpose()?,
        limit: params.limit.unwrap_or(crate::query::QUERY_LIMIT_DEFAULT),
        cursor: params.cursor,
    };
    let page = crate::query::query(&state.engine, request).await?;
    // Records in the JSON-lines shape, bodies byte for byte.
    let mut body = String::from("{\"records\":[");
    for (i, r) in page.records.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&crate::cli::record_json(r));
    }
    body.push_str("],\"next_cursor\":");
    body.push_str(&serde_json::to_string(&page.next_cursor).map_err(|e| Error::Internal(e.to_string()))?);
    body.push('}');
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketsParams {
    state: Option<String>,
    partition: Option<String>,
    limit: Option<usize>,
}

/// One bucket as the API shows it; times are RFC 3339.
#[derive(Debug, Serialize)]
struct BucketView {
    partition_key: String,
    bucket_key: String,
    start: String,
    end: String,
    state: &'static str,
    state_since: String,
    generation: u64,
    rows: u64,
    bytes: u64,
    lease_owner: Option<String>,
    lease_expires_at: Option<String>,
    attempts: u32,
    next_retry_at: Option<String>,
    last_error: Option<String>,
    due_at: Option<String>,
    manifest_key: Option<String>,
    archived_at: Option<String>,
}

#[derive(Debug, Serialize)]
struct BucketsPage {
    table: String,
    buckets: Vec<BucketView>,
    /// More buckets matched than `limit`.
    truncated: bool,
}

async fn buckets(
    State(state): Shared,
    path: Result<Path<String>, PathRejection>,
    params: Result<Query<BucketsParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let table = known_table(&state, path)?;
    let params = query_params(params)?;
    let wanted = match params.state.as_deref() {
        None => None,
        Some(name) => Some(BucketState::ALL.into_iter().find(|s| s.name() == name).ok_or_else(|| {
            ApiError::bad_request(format!(
                "unknown state `{name}`; use one of {}",
                BucketState::ALL.map(|s| s.name()).join(", ")
            ))
        })?),
    };
    let limit = params.limit.unwrap_or(BUCKETS_LIMIT_DEFAULT);
    if limit == 0 || limit > BUCKETS_LIMIT_MAX {
        return Err(ApiError::bad_request(format!("limit must be 1 to {BUCKETS_LIMIT_MAX} (BUCKETS_LIMIT_MAX)")));
    }
    let (store, id, partition) = (state.engine.store.clone(), table.clone(), params.partition.clone());
    let mut metas = blocking(move || store.buckets(&id, partition.as_deref().map(str::as_bytes))).await?;
    metas.retain(|b| wanted.is_none_or(|s| b.state == s));
    metas.sort_by(|a, b| (a.descriptor.start, &a.id.partition_key).cmp(&(b.descriptor.start, &b.id.partition_key)));
    let truncated = metas.len() > limit;
    metas.truncate(limit);
    let views: Vec<BucketView> = metas
        .into_iter()
        .map(|b| BucketView {
            partition_key: String::from_utf8_lossy(&b.id.partition_key).into_owned(),
            bucket_key: b.id.bucket_key.clone(),
            start: format_rfc3339(b.descriptor.start),
            end: format_rfc3339(b.descriptor.end),
            state: b.state.name(),
            state_since: format_rfc3339(b.state_since),
            generation: b.generation,
            rows: b.row_count,
            bytes: b.byte_count,
            lease_expires_at: b.lease_owner.as_ref().map(|_| format_rfc3339(b.lease_expires_at)),
            lease_owner: b.lease_owner,
            attempts: b.attempts,
            next_retry_at: b.next_retry_at.map(format_rfc3339),
            last_error: b.last_error,
            due_at: b.due_at.map(format_rfc3339),
            manifest_key: b.manifest_key,
            archived_at: b.archived_at.map(format_rfc3339),
        })
        .collect();
    Ok(Json(BucketsPage { table, buckets: views, truncated }).into_response())
}

async fn status(State(state): Shared) -> Result<Response, ApiError> {
    let status = blocking(move || crate::cli::status::collect(&state.engine)).await?;
    Ok(Json(status).into_response())
}

#[derive(Debug, Serialize)]
struct PluginView {
    #[serde(flatten)]
    record: crate::policy::PluginRecord,
    #[serde(flatten)]
    counts: Option<crate::model::CallCounts>,
}

async fn plugins(State(state): Shared) -> Json<PluginsPage> {
    let policies = state.engine.policies();
    let views: Vec<PluginView> = policies
        .plugins
        .iter()
        .map(|record| {
            let table = policies.tables.get(&record.table);
            let counts = table.and_then(|t| match record.role {
                crate::plugin::Role::BucketStrategy => t.strategy.call_counts(),
                crate::plugin::Role::RetentionPolicy => t.retention.call_counts(),
                crate::plugin::Role::Archiver => None,
            });
            PluginView { record: record.clone(), counts }
        })
        .collect();
    Json(PluginsPage { generation: policies.generation, plugins: views })
}

#[derive(Debug, Serialize)]
struct PluginsPage {
    generation: u64,
    plugins: Vec<PluginView>,
}

#[derive(Debug, Serialize)]
struct LastReload {
    generation: u64,
    last_reload: Option<crate::policy::reload::ReloadOutcome>,
}

async fn last_reload(State(state): Shared) -> Json<LastReload> {
    Json(LastReload { generation: state.engine.policies().generation, last_reload: state.engine.last_reload() })
}

async fn reload(State(state): Shared) -> Result<Response, ApiError> {
    let outcome = blocking(move || {
        let outcome = crate::policy::reload::reload(&state.engine, "api");
        if let Err(e) = state.engine.write_status_file() {
            tracing::warn!(error = %e, "cannot write the status file");
        }
        Ok(outcome)
    })
    .await?;
    let status = if outcome.accepted { StatusCode::OK } else { StatusCode::UNPROCESSABLE_ENTITY };
    Ok((status, Json(outcome)).into_response())
}

async fn archive(State(state): Shared) -> Result<Response, ApiError> {
    let report = state.passes.run_until_idle(&state.engine, &state.stopping).await?;
    let engine = state.engine.clone();
    let _ = tokio::task::spawn_blocking(move || {
        if let Err(e) = engine.write_status_file() {
            tracing::warn!(error = %e, "cannot write the status file");
        }
    })
    .await;
    Ok(Json(report).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_json_lines_or_an_array_and_refused_whole() {
        let lines = b"{\"partition_key\":\"a\",\"event_time\":1,\"body\":{}}\n\n{\"partition_key\":\"b\",\"event_time\":2,\"body\":[1]}\n";
        assert_eq!(parse_batch(lines).unwrap().len(), 2);
        let array = b" [ {\"partition_key\":\"a\",\"event_time\":1,\"body\":{\n  \"x\": \"a b\\\"\\n\"\n}} ]";
        let records = parse_batch(array).unwrap();
        // The body keeps its lines here; `Engine::append` stores multi-line bodies on one line.
        assert_eq!(crate::model::one_line_json(&records[0].body), "{\"x\":\"a b\\\"\\n\"}");
        let bad = b"{\"partition_key\":\"a\",\"event_time\":1,\"body\":{}}\nnope\n{\"partition_key\":\"a\",\"event_time\":\"x\",\"body\":1}";
        let refusal = parse_batch(bad).unwrap_err();
        assert_eq!(refusal.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(refusal.body.invalid_records, Some(2));
        assert_eq!(refusal.body.records.iter().map(|r| r.line).collect::<Vec<_>>(), vec![Some(2), Some(3)]);
        let bad = b"[{\"partition_key\":\"a\",\"event_time\":1,\"body\":{}}, 7]";
        assert_eq!(parse_batch(bad).unwrap_err().body.records[0].index, Some(1));
        assert_eq!(parse_batch(b"[1, 2").unwrap_err().status, StatusCode::BAD_REQUEST);
    }

    fn streamed(megabytes: usize) -> Body {
        let chunk = bytes::Bytes::from(vec![b'\n'; 1024 * 1024]);
        Body::from_stream(futures::stream::iter((0..megabytes).map(move |_| Ok::<_, std::io::Error>(chunk.clone()))))
    }

    #[tokio::test]
    async fn the_body_limit_holds_and_is_enforced_on_a_streamed_body() {
        let megabytes = HTTP_BODY_BYTES_MAX / (1024 * 1024);
        assert_eq!(read_body(&HeaderMap::new(), streamed(megabytes)).await.unwrap().len(), HTTP_BODY_BYTES_MAX);
        let refusal = read_body(&HeaderMap::new(), streamed(megabytes + 1)).await.unwrap_err();
        assert_eq!(refusal.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(refusal.body.error.limit.unwrap().name, "HTTP_BODY_BYTES_MAX");
    }

    #[test]
    fn the_records_limit_holds_and_is_enforced() {
        let line = "{\"partition_key\":\"a\",\"event_time\":1,\"body\":{}}\n";
        let at_limit = line.repeat(HTTP_RECORDS_PER_REQUEST_MAX);
        assert_eq!(parse_batch(at_limit.as_bytes()).unwrap().len(), HTTP_RECORDS_PER_REQUEST_MAX);
        let over = line.repeat(HTTP_RECORDS_PER_REQUEST_MAX + 1);
        let refusal = parse_batch(over.as_bytes()).unwrap_err();
        assert_eq!(refusal.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(refusal.body.error.limit.unwrap().name, "HTTP_RECORDS_PER_REQUEST_MAX");
    }
}

//! One handler per route of `ROUTES`. Handlers parse and check the request, call its operation
//! in `ops` (on a blocking thread when it blocks) and send the answer; they hold no engine
//! logic.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use axum::{Extension, Json};
use futures::StreamExt;
use serde::Deserialize;

use super::{
    ApiError, ApiState, BUCKETS_LIMIT_DEFAULT, BUCKETS_LIMIT_MAX, HTTP_BODY_BYTES_MAX, HTTP_BODY_DRAIN_BYTES_MAX,
    HTTP_BODY_DRAIN_SECONDS_MAX, HTTP_RECORD_ERRORS_REPORTED_MAX, HTTP_RECORDS_PER_REQUEST_MAX, RecordError, Route,
    RouteId, Scope,
};
use crate::error::{Error, ErrorKind};
use crate::model::time::parse_time_arg;
use crate::ops;

pub(super) type Shared = State<Arc<ApiState>>;

/// The handler of a route, for its method.
pub(super) fn method_router(route: &Route) -> MethodRouter<Arc<ApiState>> {
    let filter = match route.method {
        "GET" => MethodFilter::GET,
        "POST" => MethodFilter::POST,
        "DELETE" => MethodFilter::DELETE,
        other => panic!("route {} uses method {other}; only GET, POST and DELETE are served", route.path),
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
        RouteId::Holds => on(filter, holds),
        RouteId::PlaceHold => on(filter, place_hold),
        RouteId::LiftHold => on(filter, lift_hold),
        RouteId::Retention => on(filter, retention),
        RouteId::Columns => on(filter, columns),
        RouteId::Verify => on(filter, verify),
        RouteId::PolicyCheck => on(filter, policy_check),
        RouteId::Erasures => on(filter, super::erasures::list),
        RouteId::PlaceErasure => on(filter, super::erasures::place),
        RouteId::Erasure => on(filter, super::erasures::one),
    }
}

pub(super) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route; docs/API.md lists them")
}

/// Runs blocking engine work off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::Result<T> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::from(Error::Internal(format!("blocking task failed: {e}"))))?
        .map_err(ApiError::from)
}

/// The table named in the path, if the active policy set declares it.
fn known_table(state: &ApiState, path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(table) = path.map_err(|e| ApiError::bad_request(e.body_text()))?;
    check_table(state, &table)?;
    Ok(table)
}

/// `Ok` when the active policy set declares `table`, else the 404 answer.
fn check_table(state: &ApiState, table: &str) -> Result<(), ApiError> {
    if state.engine.policies().tables.contains_key(table) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no table `{table}` in the policy directory; GET /v1/status lists the tables"),
    ))
}

/// A limit parameter of a listing: default `BUCKETS_LIMIT_DEFAULT`, 1 to `BUCKETS_LIMIT_MAX`.
fn listing_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(BUCKETS_LIMIT_DEFAULT);
    if limit == 0 || limit > BUCKETS_LIMIT_MAX {
        return Err(ApiError::bad_request(format!("limit must be 1 to {BUCKETS_LIMIT_MAX} (BUCKETS_LIMIT_MAX)")));
    }
    Ok(limit)
}

fn query_params<T>(params: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    params.map(|Query(p)| p).map_err(|e| ApiError::bad_request(e.body_text()))
}

async fn health(State(state): Shared) -> Response {
    match state.engine.store().poisoned() {
        None => Json(serde_json::json!({"status": "ok"})).into_response(),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"status": "unavailable", "reason": format!("the store refuses writes: {why}")})),
        )
            .into_response(),
    }
}

async fn metrics(State(state): Shared) -> Result<Response, ApiError> {
    let text = blocking(move || state.metrics.render(&ops::status::collect(&state.engine)?)).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response())
}

/// Reads the body, refusing it with 413 once it passes `HTTP_BODY_BYTES_MAX`. The rest of a
/// refused body is read and dropped (up to `HTTP_BODY_DRAIN_BYTES_MAX`, for at most
/// `HTTP_BODY_DRAIN_SECONDS_MAX`) so a client still sending it sees the answer instead of a
/// reset connection; a body declared larger than that is refused at once.
pub(super) async fn read_body(headers: &HeaderMap, body: Body) -> Result<Vec<u8>, ApiError> {
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
pub(super) fn parse_batch(bytes: &[u8]) -> Result<crate::model::CheckedRecords, ApiError> {
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
            match ops::records::parse_line(item.get()) {
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
            match ops::records::parse_line(raw) {
                Ok(r) => records.push(r),
                Err(e) => errors.push(RecordError { line: Some(n + 1), index: None, reason: reason_of(&e) }),
            }
        }
    }
    if errors.is_empty() {
        // `parse_line` validated each record and parsed its body: nothing is checked twice.
        return Ok(crate::model::CheckedRecords::parsed(records));
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

/// `?backfill=true`: the batch is part of a backfill (`frostline ingest`), which holds the
/// table's backfill lease (`ops::records::append_backfill`); `?backfill=end`, with no records,
/// ends the lease.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendParams {
    backfill: Option<Backfill>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum Backfill {
    #[serde(rename = "true")]
    Batch,
    #[serde(rename = "end")]
    End,
}

/// The tenant of every record of a batch is within the token's reach, or the batch is refused
/// whole, naming the first record beyond it.
fn check_batch_tenants(scope: &Scope, records: &crate::model::CheckedRecords) -> Result<(), ApiError> {
    if scope.tenants.is_none() {
        return Ok(());
    }
    match records.iter().position(|r| !scope.allows_tenant(r.tenant.as_deref())) {
        None => Ok(()),
        Some(index) => {
            let what = format!("record {} of the batch (nothing was written)", index + 1);
            scope.check_tenant(records.iter().nth(index).and_then(|r| r.tenant.as_deref()), &what)
        }
    }
}

async fn append(
    State(state): Shared,
    Extension(scope): Extension<Arc<Scope>>,
    path: Result<Path<String>, PathRejection>,
    params: Result<Query<AppendParams>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let table = known_table(&state, path)?;
    let backfill = query_params(params)?.backfill;
    let outcome: Result<ops::wire::AppendCounts, ApiError> = async {
        let bytes = read_body(&headers, body).await?;
        if backfill == Some(Backfill::End) {
            if !bytes.iter().all(u8::is_ascii_whitespace) {
                return Err(ApiError::bad_request("`backfill=end` ends a backfill and takes no records"));
            }
            let engine = state.engine.clone();
            blocking(move || ops::records::end_backfill(&engine, &table)).await?;
            return Ok(ops::wire::AppendCounts::default());
        }
        let records = parse_batch(&bytes)?;
        drop(bytes);
        check_batch_tenants(&scope, &records)?;
        let engine = state.engine.clone();
        // Acknowledged only after `ops::records::append` returns, that is after the commit.
        tokio::task::spawn_blocking(move || match backfill {
            Some(_) => ops::records::append_backfill(&engine, &table, records),
            None => ops::records::append(&engine, &table, records),
        })
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
            state.metrics.column_misses.inc_by(outcome.column_misses);
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
    tenant: Option<String>,
    from: Option<String>,
    to: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

/// A query's parameters and its conditions: `where` may repeat, one condition each, which a
/// plain query string struct cannot take.
fn query_params_and_conditions(raw: Option<&str>) -> Result<(QueryParams, Vec<String>), ApiError> {
    let (conditions, rest): (Vec<_>, Vec<_>) =
        form_urlencoded::parse(raw.unwrap_or_default().as_bytes()).into_owned().partition(|(name, _)| name == "where");
    let rest = form_urlencoded::Serializer::new(String::new()).extend_pairs(rest).finish();
    let params = serde_urlencoded::from_str::<QueryParams>(&rest)
        .map_err(|e| ApiError::bad_request(format!("Failed to deserialize query string: {e}")))?;
    Ok((params, conditions.into_iter().map(|(_, condition)| condition).collect()))
}

async fn query(
    State(state): Shared,
    Extension(scope): Extension<Arc<Scope>>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let table = known_table(&state, path)?;
    let (params, conditions) = query_params_and_conditions(raw.as_deref())?;
    if let Some(tenant) = &params.tenant {
        scope.check_tenant(Some(tenant), "the query")?;
    }
    // A token limited to tenants reads its tenants' records only, whatever the query names.
    let tenants = match (params.tenant, &scope.tenants) {
        (Some(tenant), _) => Some(std::collections::BTreeSet::from([tenant])),
        (None, limited) => limited.clone(),
    };
    let named_partition = params.partition.is_some();
    let request = ops::query::QueryRequest {
        table,
        partition_key: params.partition.map(String::into_bytes),
        tenants,
        from: params.from.as_deref().map(parse_time_arg).transpose()?,
        to: params.to.as_deref().map(parse_time_arg).transpose()?,
        limit: params.limit.unwrap_or(ops::query::QUERY_LIMIT_DEFAULT),
        cursor: params.cursor,
        conditions,
    };
    let mut page = ops::query::query(&state.engine, request).await?;
    if scope.tenants.is_some() && !named_partition {
        // Expired ranges name partitions, which may be other tenants': a limited token hears
        // of them only for a partition it named.
        page.expired.clear();
    }
    let body = ops::query::page_json(&page)?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketsParams {
    state: Option<String>,
    partition: Option<String>,
    limit: Option<usize>,
}

async fn buckets(
    State(state): Shared,
    path: Result<Path<String>, PathRejection>,
    params: Result<Query<BucketsParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let table = known_table(&state, path)?;
    let params = query_params(params)?;
    let request = ops::buckets::BucketsRequest {
        table,
        state: params.state,
        partition: params.partition,
        limit: listing_limit(params.limit)?,
    };
    let page = blocking(move || ops::buckets::list(&state.engine, request)).await?;
    Ok(Json(page).into_response())
}

async fn status(State(state): Shared) -> Result<Response, ApiError> {
    let status = blocking(move || ops::status::collect(&state.engine)).await?;
    Ok(Json(status).into_response())
}

async fn plugins(State(state): Shared) -> Json<ops::plugins::PluginsPage> {
    Json(ops::plugins::list(&state.engine))
}

async fn last_reload(State(state): Shared) -> Json<ops::plugins::LastReload> {
    Json(ops::plugins::last_reload(&state.engine))
}

async fn reload(State(state): Shared) -> Result<Response, ApiError> {
    let outcome = blocking(move || {
        let outcome = ops::reload::reload(&state.engine, "api");
        if let Err(e) = ops::status::write_status_file(&state.engine) {
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
        if let Err(e) = ops::status::write_status_file(&engine) {
            tracing::warn!(error = %e, "cannot write the status file");
        }
    })
    .await;
    Ok(Json(report).into_response())
}

/// A hold is within a token's reach when its table and its tenant are (a hold of a whole table
/// or partition, naming no tenant, covers every tenant's records: beyond a limited token).
fn hold_within(scope: &Scope, table: &str, tenant: Option<&str>) -> bool {
    scope.allows_table(table) && scope.allows_tenant(tenant)
}

async fn holds(State(state): Shared, Extension(scope): Extension<Arc<Scope>>) -> Result<Response, ApiError> {
    let mut holds = blocking(move || ops::holds::list_holds(&state.engine)).await?;
    holds.retain(|h| hold_within(&scope, &h.hold.table, h.hold.tenant.as_deref()));
    Ok(Json(ops::wire::HoldsPage { holds }).into_response())
}

pub(super) fn unprocessable(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", message)
}

async fn place_hold(
    State(state): Shared,
    Extension(scope): Extension<Arc<Scope>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&headers, body).await?;
    let request: ops::holds::HoldRequest = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "the body is not a hold {{\"table\", \"partition\"?, \"tenant\"?, \"bucket\"?, \"reason\", \"placed_by\"}}: {e}"
        ))
    })?;
    check_table(&state, &request.table)?;
    scope.check_table(&request.table)?;
    scope.check_tenant(request.tenant.as_deref(), "the hold")?;
    // A well-formed request whose hold is refused (no reason, no author) is 422.
    let placed =
        blocking(move || Ok(ops::holds::place_hold(&state.engine, request, "api"))).await?.map_err(|refusal| {
            match refusal.kind() {
                crate::ErrorKind::InvalidInput => unprocessable(refusal.to_string()),
                _ => ApiError::from(refusal),
            }
        })?;
    Ok((StatusCode::CREATED, Json(placed)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LiftParams {
    by: Option<String>,
}

async fn lift_hold(
    State(state): Shared,
    Extension(scope): Extension<Arc<Scope>>,
    path: Result<Path<String>, PathRejection>,
    params: Result<Query<LiftParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let params = query_params(params)?;
    if !scope.is_unlimited() {
        let (engine, wanted) = (state.engine.clone(), id.clone());
        // An unknown id is lifted below, which answers 404.
        if let Some(hold) = blocking(move || ops::holds::find_hold(&engine, &wanted)).await? {
            scope.check_table(&hold.table)?;
            scope.check_tenant(hold.tenant.as_deref(), &format!("hold `{}`", hold.id))?;
        }
    }
    let by = params.by.map(|b| b.trim().to_string()).filter(|b| !b.is_empty()).unwrap_or_else(|| "api".into());
    // One transaction decides: a policy hold is 409, an unknown id 404 (`ErrorKind::NotFound`).
    let hold = blocking(move || ops::holds::lift_hold(&state.engine, id, by)).await?;
    Ok(Json(serde_json::json!({"lifted": hold.id, "hold": hold})).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetentionParams {
    partition: Option<String>,
    limit: Option<usize>,
}

async fn retention(
    State(state): Shared,
    path: Result<Path<String>, PathRejection>,
    params: Result<Query<RetentionParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let table = known_table(&state, path)?;
    let params = query_params(params)?;
    let request =
        ops::buckets::RetentionRequest { table, partition: params.partition, limit: listing_limit(params.limit)? };
    let page = blocking(move || ops::buckets::retention(&state.engine, request)).await?;
    Ok(Json(page).into_response())
}

/// The table's typed columns as its policy declares them: what `frostline ingest` checks a
/// file against before it sends a batch, so that a file with a value a column refuses writes
/// nothing. Not tenant data: any token that may write or read the table may ask.
async fn columns(State(state): Shared, path: Result<Path<String>, PathRejection>) -> Result<Response, ApiError> {
    let table = known_table(&state, path)?;
    let columns = ops::policy::table_columns(&state.engine, &table)?;
    Ok(Json(columns).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifyParams {
    table: Option<String>,
    sample: Option<usize>,
}

async fn verify(
    State(state): Shared,
    params: Result<Query<VerifyParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let params = query_params(params)?;
    if let Some(table) = &params.table {
        check_table(&state, table)?;
    }
    if params.sample == Some(0) {
        return Err(ApiError::bad_request("sample must be at least 1 (or left out to verify every archived bucket)"));
    }
    let report = ops::archives::verify(&state.engine, params.table, params.sample, |_| {}).await?;
    Ok(Json(report).into_response())
}

/// The body of `POST /v1/policy/check`: the directory to check (default: the engine's own).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyCheckRequest {
    dir: Option<std::path::PathBuf>,
}

/// A dry-run reload: the directory is checked exactly as a reload would check it, against the
/// running engine's store, with the re-plan it would cause. Nothing changes; a refusal is an
/// answer (`accepted: false`), not an error.
async fn policy_check(State(state): Shared, body: axum::body::Bytes) -> Result<Response, ApiError> {
    let request: PolicyCheckRequest = if body.iter().all(u8::is_ascii_whitespace) {
        PolicyCheckRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("the body must be {{\"dir\": PATH}}: {e}")))?
    };
    let report = blocking(move || ops::policy::check_against(&state.engine, request.dir.as_deref())).await?;
    Ok(Json(report).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_takes_one_condition_per_where_parameter_beside_its_other_parameters() {
        let (params, conditions) =
            query_params_and_conditions(Some("where=carrier%3DAA&limit=5&where=dep_delay%3E%3D10&partition=a%2Fb"))
                .unwrap();
        assert_eq!(conditions, ["carrier=AA", "dep_delay>=10"]);
        assert_eq!((params.limit, params.partition.as_deref()), (Some(5), Some("a/b")));
        assert_eq!(query_params_and_conditions(None).unwrap().1, Vec::<String>::new());
        let unknown = query_params_and_conditions(Some("wher=carrier%3DAA")).unwrap_err();
        assert!(unknown.body.error.message.contains("unknown field `wher`"), "{}", unknown.body.error.message);
    }

    #[test]
    fn a_batch_is_json_lines_or_an_array_and_refused_whole() {
        let lines = b"{\"partition_key\":\"a\",\"event_time\":1,\"body\":{}}\n\n{\"partition_key\":\"b\",\"event_time\":2,\"body\":[1]}\n";
        assert_eq!(parse_batch(lines).unwrap().len(), 2);
        let array = b" [ {\"partition_key\":\"a\",\"event_time\":1,\"body\":{\n  \"x\": \"a b\\\"\\n\"\n}} ]";
        let records = parse_batch(array).unwrap().into_inner();
        // A multi-line body is stored on one line (whitespace inside strings kept).
        assert_eq!(records[0].body, "{\"x\":\"a b\\\"\\n\"}");
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

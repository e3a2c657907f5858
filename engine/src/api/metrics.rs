//! Prometheus metrics (`GET /metrics`, text format 0.0.4) and the request log.
//!
//! Counters of events the engine sees as they happen (appends, refusals, passes, HTTP
//! requests) live in a registry for the life of the process. What is state rather than an
//! event (buckets by state, the outbox backlog, the archival lag, plugin call counters, reload
//! counts) is read from the engine at each scrape, so it is never stale.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use super::ApiState;
use super::auth::RouteTemplate;
use crate::error::{Error, Result};
use crate::model::BucketState;
use crate::ops::passes::PassReport;
use crate::ops::status::Status;

/// Upper bounds of the pass-duration histogram, in seconds: an idle pass takes milliseconds,
/// a pass of a large backlog minutes.
const PASS_SECONDS_BUCKETS: [f64; 14] =
    [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];

fn internal(e: prometheus::Error) -> Error {
    Error::Internal(format!("metrics: {e}"))
}

/// The process-lifetime counters.
pub struct Metrics {
    registry: Registry,
    pub records_appended: IntCounter,
    pub records_duplicate: IntCounter,
    /// Values of declared columns stored as null (`on_mismatch = "null"`).
    pub column_misses: IntCounter,
    /// Refused appends by reason: an error kind, or `body_too_large` / `too_many_records`.
    pub append_refusals: IntCounterVec,
    passes: IntCounter,
    pass_failures: IntCounter,
    buckets_planned: IntCounter,
    plan_failures: IntCounter,
    buckets_archived: IntCounter,
    buckets_cleaned: IntCounter,
    /// Deferrals by `DeferralReason`.
    deferrals: IntCounterVec,
    delta_commit_retries: IntCounter,
    buckets_expired: IntCounter,
    expiries_held: IntCounter,
    orphans_deleted: IntCounter,
    /// Errors passes went on from, by `PassErrorKind`.
    pass_errors: IntCounterVec,
    buckets_reconciled: IntCounter,
    rows_archived: IntCounter,
    bytes_archived: IntCounter,
    pass_seconds: Histogram,
    http_requests: IntCounterVec,
    http_seconds: HistogramVec,
}

impl Metrics {
    pub fn new() -> Result<Metrics> {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| -> Result<IntCounter> {
            let c = IntCounter::with_opts(Opts::new(name, help)).map_err(internal)?;
            registry.register(Box::new(c.clone())).map_err(internal)?;
            Ok(c)
        };
        let append_refusals = IntCounterVec::new(
            Opts::new("frostline_append_refusals_total", "Append requests refused, by reason."),
            &["reason"],
        )
        .map_err(internal)?;
        registry.register(Box::new(append_refusals.clone())).map_err(internal)?;
        let http_requests = IntCounterVec::new(
            Opts::new("frostline_http_requests_total", "HTTP requests answered, by method, route and status."),
            &["method", "route", "status"],
        )
        .map_err(internal)?;
        registry.register(Box::new(http_requests.clone())).map_err(internal)?;
        let http_seconds = HistogramVec::new(
            HistogramOpts::new("frostline_http_request_duration_seconds", "HTTP request latency, by route."),
            &["route"],
        )
        .map_err(internal)?;
        registry.register(Box::new(http_seconds.clone())).map_err(internal)?;
        let pass_errors = IntCounterVec::new(
            Opts::new(
                "frostline_pass_errors_total",
                "Errors archival passes met and went on from (each also logged at warn), by kind: bucket, outbox, \
                 catalog, delta_log, sweep, erasure.",
            ),
            &["kind"],
        )
        .map_err(internal)?;
        registry.register(Box::new(pass_errors.clone())).map_err(internal)?;
        let deferrals = IntCounterVec::new(
            Opts::new(
                "frostline_archive_deferrals_total",
                "Bucket archivals, cleanups and expiries deferred for a retry, by reason: target_unavailable, \
                 target_refused, plugin_fault, corruption, lease_or_fence, local_store, task_panicked, other.",
            ),
            &["reason"],
        )
        .map_err(internal)?;
        registry.register(Box::new(deferrals.clone())).map_err(internal)?;
        // Every kind from 0, so that `increase()` over the series sees the first error (a
        // series that appears at 1 has no increase) and an alert on it can fire.
        for kind in crate::ops::passes::PassErrorKind::ALL {
            pass_errors.with_label_values(&[kind.label()]);
        }
        for reason in crate::ops::passes::DeferralReason::ALL {
            deferrals.with_label_values(&[reason.label()]);
        }
        let pass_seconds = Histogram::with_opts(
            HistogramOpts::new("frostline_archive_pass_duration_seconds", "Wall time of archival passes that ran.")
                .buckets(PASS_SECONDS_BUCKETS.to_vec()),
        )
        .map_err(internal)?;
        registry.register(Box::new(pass_seconds.clone())).map_err(internal)?;
        // process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds and the
        // rest of the standard set, read from /proc at each scrape.
        #[cfg(target_os = "linux")]
        registry.register(Box::new(prometheus::process_collector::ProcessCollector::for_self())).map_err(internal)?;
        Ok(Metrics {
            pass_seconds,
            pass_errors,
            records_appended: counter("frostline_records_appended_total", "Records appended and committed.")?,
            records_duplicate: counter(
                "frostline_records_duplicate_total",
                "Records accepted unchanged because an identical record was already stored.",
            )?,
            column_misses: counter(
                "frostline_column_misses_total",
                "Values of declared columns that did not fit and were stored as null (on_mismatch = \"null\"); \
                 the body keeps them.",
            )?,
            append_refusals,
            passes: counter("frostline_archive_passes_total", "Archival passes run.")?,
            pass_failures: counter("frostline_archive_pass_failures_total", "Archival passes that failed as a whole.")?,
            buckets_planned: counter("frostline_archive_buckets_planned_total", "Buckets given a retention plan.")?,
            plan_failures: counter(
                "frostline_archive_plan_failures_total",
                "Retention plans refused or failed (the bucket stays unplanned and is retried).",
            )?,
            buckets_archived: counter("frostline_archive_buckets_archived_total", "Buckets archived and published.")?,
            buckets_cleaned: counter(
                "frostline_archive_buckets_cleaned_total",
                "Buckets whose hot rows were deleted.",
            )?,
            deferrals,
            delta_commit_retries: counter(
                "frostline_delta_commit_retries_total",
                "Delta log commits that lost a race with another writer (or failed) and were made again after \
                 reading the log.",
            )?,
            buckets_expired: counter(
                "frostline_buckets_expired_total",
                "Archives expired (objects deleted, absence proved).",
            )?,
            expiries_held: counter(
                "frostline_expiries_held_total",
                "Expiries a legal hold stopped when they were about to start or delete.",
            )?,
            orphans_deleted: counter("frostline_orphans_deleted_total", "Objects the orphan sweep deleted.")?,
            buckets_reconciled: counter(
                "frostline_buckets_reconciled_total",
                "Buckets whose schedule was checked against their plan after a policy change or periodically.",
            )?,
            rows_archived: counter("frostline_archive_rows_total", "Rows archived.")?,
            bytes_archived: counter("frostline_archive_bytes_total", "Bytes of segments archived.")?,
            http_requests,
            http_seconds,
            registry,
        })
    }

    /// Feeds one pass's outcome.
    pub fn record_pass(&self, result: &Result<PassReport>) {
        self.passes.inc();
        match result {
            Ok(r) => {
                self.pass_seconds.observe(r.wall_seconds);
                self.buckets_planned.inc_by(r.planned);
                self.plan_failures.inc_by(r.plan_failures);
                self.buckets_archived.inc_by(r.archived);
                self.buckets_cleaned.inc_by(r.cleaned);
                for (reason, count) in &r.deferrals_by_reason {
                    self.deferrals.with_label_values(&[reason]).inc_by(*count);
                }
                self.delta_commit_retries.inc_by(r.delta_commit_retries);
                self.buckets_expired.inc_by(r.expired);
                self.expiries_held.inc_by(r.held);
                self.orphans_deleted.inc_by(r.orphans_deleted);
                for (kind, count) in &r.error_kinds {
                    self.pass_errors.with_label_values(&[kind]).inc_by(*count);
                }
                self.buckets_reconciled.inc_by(r.reconciled);
                self.rows_archived.inc_by(r.rows_archived);
                self.bytes_archived.inc_by(r.bytes_archived);
            }
            Err(_) => self.pass_failures.inc(),
        }
    }

    pub fn record_refusal(&self, reason: &str) {
        self.append_refusals.with_label_values(&[reason]).inc();
    }

    /// The text exposition: the counters above and the engine's state now, as the status
    /// read model (`ops::status::collect`, which reads the store: on a blocking thread) has it.
    pub fn render(&self, status: &Status) -> Result<String> {
        let scrape = scrape_families(status)?;
        let mut families = self.registry.gather();
        families.extend(scrape.gather());
        let mut out = Vec::new();
        TextEncoder::new().encode(&families, &mut out).map_err(internal)?;
        String::from_utf8(out).map_err(|e| Error::Internal(format!("metrics text: {e}")))
    }
}

/// Families computed from the engine at scrape time.
fn scrape_families(status: &Status) -> Result<Registry> {
    let registry = Registry::new();
    let gauge_vec = |name: &str, help: &str, labels: &[&str]| -> Result<IntGaugeVec> {
        let g = IntGaugeVec::new(Opts::new(name, help), labels).map_err(internal)?;
        registry.register(Box::new(g.clone())).map_err(internal)?;
        Ok(g)
    };
    let gauge = |name: &str, help: &str| -> Result<IntGauge> {
        let g = IntGauge::with_opts(Opts::new(name, help)).map_err(internal)?;
        registry.register(Box::new(g.clone())).map_err(internal)?;
        Ok(g)
    };
    let counter_vec = |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec> {
        let c = IntCounterVec::new(Opts::new(name, help), labels).map_err(internal)?;
        registry.register(Box::new(c.clone())).map_err(internal)?;
        Ok(c)
    };

    let buckets = gauge_vec("frostline_buckets", "Buckets by table and state.", &["table", "state"])?;
    let rows = gauge_vec("frostline_bucket_rows", "Rows in buckets, by table and state.", &["table", "state"])?;
    let held = gauge_vec("frostline_buckets_held", "Archived buckets whose expiry a legal hold parks.", &["table"])?;
    for table in &status.tables {
        for state in BucketState::ALL {
            let count = table.states.get(state.name());
            let labels = [table.id.as_str(), state.name()];
            buckets.with_label_values(&labels).set(count.map_or(0, |c| c.buckets as i64));
            rows.with_label_values(&labels).set(count.map_or(0, |c| c.rows as i64));
        }
        held.with_label_values(&[table.id.as_str()]).set(table.held_buckets as i64);
    }
    gauge(
        "frostline_tables_unmanaged",
        "Tables with data that are not in the policy directory (their buckets wait for them).",
    )?
    .set(status.unmanaged_tables.len() as i64);
    gauge("frostline_buckets_awaiting_plan", "Buckets queued for a (new) retention plan.")?
        .set(status.unplanned_buckets as i64);
    gauge("frostline_due_buckets", "Buckets whose next action is due now.")?.set(status.due_now as i64);
    gauge("frostline_archival_lag_seconds", "Seconds the oldest due bucket has waited; 0 when none is due.")?
        .set(status.oldest_due_age_seconds);
    gauge("frostline_outbox_backlog", "Outbox events not yet delivered.")?.set(status.outbox_backlog as i64);
    gauge("frostline_store_poisoned", "1 when the hot store refuses writes after a failed commit.")?
        .set(i64::from(status.store_poisoned.is_some()));
    gauge("frostline_policy_generation", "Generation of the active policy set.")?.set(status.policy.generation as i64);
    gauge("frostline_buckets_deferred", "Buckets whose archival, cleanup or expiry waits for a retry.")?
        .set(status.deferrals.len() as i64);
    gauge(
        "frostline_sweep_stopped",
        "1 while the orphan sweep is stopped: another copy of this data directory writes.",
    )?
    .set(i64::from(status.sweep_stopped.is_some()));
    gauge("frostline_erasure_requests_open", "Erasure requests not yet finished.")?.set(status.erasures_open as i64);
    gauge(
        "frostline_erasure_buckets_blocked",
        "Buckets of open erasure requests that a legal hold keeps as they are.",
    )?
    .set(status.erasure_buckets_blocked as i64);
    if let Some(disk) = &status.store_disk {
        gauge("frostline_store_file_bytes", "Bytes of the hot store's file (hot.redb).")?.set(disk.file_bytes as i64);
        gauge("frostline_store_filesystem_bytes", "Bytes of the filesystem the data directory lies on.")?
            .set(disk.filesystem_bytes as i64);
        gauge("frostline_store_filesystem_available_bytes", "Bytes of that filesystem still available to the engine.")?
            .set(disk.available_bytes as i64);
        if let Some(free) = disk.free_bytes {
            gauge(
                "frostline_store_free_bytes",
                "Bytes of the hot store's file in free pages, as last measured (a compaction gives them back).",
            )?
            .set(free as i64);
        }
        if let Some(metadata) = disk.metadata_bytes {
            gauge(
                "frostline_store_metadata_bytes",
                "Bytes of the hot store's pages that hold metadata (every table but the buckets' hot rows), as last \
                 measured.",
            )?
            .set(metadata as i64);
        }
        if let Some(per_bucket) = disk.metadata_bytes_per_bucket {
            gauge(
                "frostline_store_metadata_bytes_per_bucket",
                "The hot store's metadata bytes per bucket it records (hot, archived and expired), as last measured.",
            )?
            .set(per_bucket as i64);
        }
        gauge("frostline_store_compactions", "Compactions of the hot store in place since the engine started.")?
            .set(disk.compactions as i64);
    }
    let target_up = gauge_vec(
        "frostline_target_up",
        "1 when the archive target's last probe passed, 0 while it is unreachable or failed.",
        &["target"],
    )?;
    for target in &status.targets {
        target_up.with_label_values(&[target.name.as_str()]).set(i64::from(target.probe == "ok"));
    }
    let delta_version =
        gauge_vec("frostline_delta_log_version", "The Delta log's version after the last sync.", &["table"])?;
    let delta_failing =
        gauge_vec("frostline_delta_log_sync_failing", "1 when the table's last Delta sync failed.", &["table"])?;
    for table in &status.tables {
        if let Some(log) = &table.delta_log {
            delta_version.with_label_values(&[table.id.as_str()]).set(log.version as i64);
            delta_failing.with_label_values(&[table.id.as_str()]).set(i64::from(log.error.is_some()));
        }
    }

    let reloads = counter_vec("frostline_policy_reloads_total", "Policy reloads since start, by result.", &["result"])?;
    reloads.with_label_values(&["accepted"]).inc_by(status.policy.reloads_accepted);
    reloads.with_label_values(&["refused"]).inc_by(status.policy.reloads_refused);

    let labels = ["table", "role", "plugin", "sha256"];
    let calls = counter_vec(
        "frostline_plugin_calls_total",
        "Calls into a plugin instance of the active policy set (reset when a reload replaces it).",
        &labels,
    )?;
    let faults = counter_vec(
        "frostline_plugin_faults_total",
        "Plugin traps, timeouts, out-of-memory and invalid answers, of the active policy set.",
        &labels,
    )?;
    let invalid = counter_vec(
        "frostline_plugin_invalid_answers_total",
        "Plugin answers the host refused, of the active policy set.",
        &labels,
    )?;
    for plugin in &status.policy.plugins {
        let Some(counts) = plugin.counts else { continue };
        let record = &plugin.record;
        let role = record.role.to_string();
        let values = [record.table.as_str(), role.as_str(), record.plugin.as_str(), record.sha256.as_str()];
        calls.with_label_values(&values).inc_by(counts.calls);
        faults.with_label_values(&values).inc_by(counts.faults);
        invalid.with_label_values(&values).inc_by(counts.invalid_answers);
    }
    Ok(registry)
}

/// Outermost middleware: logs every request (method, path, status, latency) and counts it
/// by its route template (never the raw path, which would make unbounded label sets).
pub async fn observe(State(state): State<Arc<ApiState>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    let elapsed = started.elapsed();
    let route = response.extensions().get::<RouteTemplate>().map(|r| r.0.as_str()).unwrap_or("unmatched");
    let status = response.status().as_u16();
    state.metrics.http_requests.with_label_values(&[method.as_str(), route, &status.to_string()]).inc();
    state.metrics.http_seconds.with_label_values(&[route]).observe(elapsed.as_secs_f64());
    tracing::info!(
        method = %method,
        path = %path,
        status,
        latency_ms = (elapsed.as_secs_f64() * 1_000_000.0).round() / 1_000.0,
        "http request"
    );
    response
}

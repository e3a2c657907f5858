//! Outbox delivery: every event is delivered at least once to every configured sink (an
//! HTTP webhook with an idempotency key per event, or a JSON-lines file), and deleted only
//! after every delivery is recorded. A sink that is down is backed off; it delays its own
//! deliveries and never blocks archival.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use super::blocking;
use crate::engine::Context;
use crate::error::{Error, Result};
use crate::policy::{SinkConfig, SinkKind};
use crate::store::schema::OutboxEvent;

/// Events read from the outbox and delivered at a time.
pub const OUTBOX_EVENTS_PER_BATCH: usize = 500;
/// Events a pass completes at most: batch after batch, while every sink took the last batch
/// whole, so a backlog drains at the sinks' pace (and at once with no sink), not a batch per
/// pass, which an engine archiving more than that per pass outgrows.
pub const OUTBOX_EVENTS_PER_PASS_MAX: usize = 100_000;
/// How long a pass goes on delivering after its first batch: a webhook answers one request
/// per event, so a large backlog to a slow sink would otherwise hold the pass (and archival
/// after it) for as long as the sink takes; the rest waits for the next pass.
pub const OUTBOX_DELIVERY_SECONDS_MAX: u64 = 5;
pub const SINK_BACKOFF_MS_MIN: u64 = 1_000;
pub const SINK_BACKOFF_MS_MAX: u64 = 300_000;

/// The JSON document a sink receives for an event.
pub fn event_json(event: &OutboxEvent, sink: &str) -> serde_json::Value {
    serde_json::json!({
        "idempotency_key": format!("frostline-{}-{}", sink, event.sequence),
        "sequence": event.sequence,
        "kind": event.kind,
        "table": event.bucket.as_ref().map(|b| b.table.clone()),
        "partition_key": event.bucket.as_ref().map(|b| String::from_utf8_lossy(&b.partition_key).into_owned()),
        "bucket_key": event.bucket.as_ref().map(|b| b.bucket_key.clone()),
        "generation": event.generation,
        "at": crate::model::time::format_rfc3339(event.at),
        "detail": event.detail,
    })
}

/// The HTTP client of one webhook, made on its first delivery and again when its
/// configuration changes: its timeout, and for `https://` rustls trusting the system's
/// certificate authorities and the sink's `ca_file`. Kept, so deliveries reuse connections and
/// the trust store is built once.
fn webhook_agent(ctx: &Context, sink: &SinkConfig) -> ureq::Agent {
    let mut agents = ctx.memory().webhook_agents.lock().expect("webhook agents");
    if let Some((config, agent)) = agents.get(&sink.name)
        && config == sink
    {
        return agent.clone();
    }
    let agent = new_webhook_agent(sink);
    agents.insert(sink.name.clone(), (sink.clone(), agent.clone()));
    agent
}

fn new_webhook_agent(sink: &SinkConfig) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_millis(sink.timeout_ms)))
        // A redirect is answered as a failed delivery (`deliver_one`): following it would
        // re-send the event as a body-less GET, whose 200 would count it delivered.
        .max_redirects(0)
        .tls_config(crate::storage::trust::tls_config(&sink.ca_certificates))
        .build()
        .into()
}

/// Delivers `events` to `sink` in order; returns the sequences delivered, and the failure that
/// stopped the rest, if one did. A JSON-lines file takes them all in one write and one sync
/// (a pass's events cost one fsync, not one each); a webhook takes one request per event,
/// each with its idempotency key.
fn deliver_batch(ctx: &Context, sink: &SinkConfig, events: &[OutboxEvent]) -> (Vec<u64>, Option<Error>) {
    match sink.kind {
        SinkKind::Webhook => {
            let mut done = Vec::with_capacity(events.len());
            for event in events {
                let body = event_json(event, &sink.name);
                let key = body["idempotency_key"].as_str().unwrap_or_default().to_string();
                let sent = webhook_agent(ctx, sink)
                    .post(&sink.destination)
                    .header("Content-Type", "application/json")
                    .header("Idempotency-Key", &key)
                    .send(body.to_string())
                    .map_err(|e| Error::StorageUnavailable(format!("sink `{}`: {e}", sink.name)))
                    .and_then(|response| delivered(sink, &response));
                match sent {
                    Ok(()) => done.push(event.sequence),
                    Err(e) => return (done, Some(e)),
                }
            }
            (done, None)
        }
        SinkKind::Jsonl => {
            let mut lines = String::new();
            for event in events {
                lines.push_str(&event_json(event, &sink.name).to_string());
                lines.push('\n');
            }
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&sink.destination)
                .and_then(|mut file| {
                    file.write_all(lines.as_bytes())?;
                    file.sync_data()
                })
                .map_err(|e| Error::io(&sink.destination, e));
            match written {
                Ok(()) => (events.iter().map(|e| e.sequence).collect(), None),
                // Some lines may have reached the file: they are delivered again, as at least
                // once allows (each carries its idempotency key).
                Err(e) => (Vec::new(), Some(e)),
            }
        }
    }
}

/// Whether a webhook's answer acknowledges the event: a 2xx does; anything else (a redirect
/// included, with its location in the error) is a failed delivery, retried with backoff.
fn delivered(sink: &SinkConfig, response: &ureq::http::Response<ureq::Body>) -> Result<()> {
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let location = response
        .headers()
        .get(ureq::http::header::LOCATION)
        .map(|l| format!(" to `{}`", String::from_utf8_lossy(l.as_bytes())))
        .unwrap_or_default();
    Err(Error::StorageUnavailable(format!(
        "sink `{}`: answered {status}{location}; a webhook must answer 2xx, and redirects are not followed: point the \
         sink's url at the final address",
        sink.name
    )))
}

/// Delivers pending events a batch at a time, up to `OUTBOX_EVENTS_PER_PASS_MAX` and for at
/// most `OUTBOX_DELIVERY_SECONDS_MAX` after the first batch; returns how
/// many events were completed (delivered everywhere). It stops after a batch that a sink did
/// not take whole (down, backed off, or failing part-way): the next batch would begin with the
/// same events.
pub async fn deliver(ctx: &Arc<Context>) -> Result<u64> {
    let started = std::time::Instant::now();
    let budget = Duration::from_secs(OUTBOX_DELIVERY_SECONDS_MAX);
    let mut completed = 0u64;
    while (completed as usize) < OUTBOX_EVENTS_PER_PASS_MAX {
        let (read, done) = deliver_batch_of_outbox(ctx).await?;
        completed += done;
        if read < OUTBOX_EVENTS_PER_BATCH || done < read as u64 || started.elapsed() >= budget {
            break;
        }
    }
    Ok(completed)
}

/// Delivers the outbox's first `OUTBOX_EVENTS_PER_BATCH` events to every sink not backed off;
/// returns how many it read and how many were completed.
async fn deliver_batch_of_outbox(ctx: &Arc<Context>) -> Result<(usize, u64)> {
    let store = ctx.store.clone();
    let events = blocking(move || store.outbox(OUTBOX_EVENTS_PER_BATCH)).await?;
    if events.is_empty() {
        return Ok((0, 0));
    }
    let read = events.len();
    let sequences: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    let sinks = ctx.policies.clone().sinks.clone();
    let backoffs = &ctx.memory().sink_backoffs;
    // An event is deleted only once every sink has recorded its delivery.
    let mut everywhere: std::collections::HashSet<u64> = sequences.iter().copied().collect();
    for sink in &sinks {
        let key = sink.name.clone();
        let (store, name, among) = (ctx.store.clone(), sink.name.clone(), sequences.clone());
        let already = blocking(move || store.delivered_among(&name, &among)).await?;
        let pending: Vec<OutboxEvent> = events.iter().filter(|e| !already.contains(&e.sequence)).cloned().collect();
        let now = ctx.clock.now();
        if pending.is_empty() || backoffs.lock().expect("backoffs").get(&key).is_some_and(|(until, _)| now < *until) {
            everywhere.retain(|s| already.contains(s));
            continue;
        }
        let (engine, sink_config) = (ctx.clone(), sink.clone());
        let (done, failure) = blocking(move || Ok(deliver_batch(&engine, &sink_config, &pending))).await?;
        everywhere.retain(|s| already.contains(s) || done.contains(s));
        if !done.is_empty() {
            // Delivered but not yet recorded: a crash here delivers the events again.
            crate::failpoints::hit("after_outbox_delivery")?;
            let (store, name, now) = (ctx.store.clone(), sink.name.clone(), ctx.clock.now());
            blocking(move || store.record_deliveries(name, done, now)).await?;
        }
        let mut map = backoffs.lock().expect("backoffs");
        match failure {
            None => {
                map.remove(&key);
            }
            Some(e) => {
                let failures = map.get(&key).map_or(0, |(_, n)| *n) + 1;
                let delay_ms = (SINK_BACKOFF_MS_MIN << failures.min(16)).min(SINK_BACKOFF_MS_MAX);
                map.insert(key.clone(), (ctx.clock.now() + delay_ms as i64 * 1_000, failures));
                tracing::warn!(sink = %sink.name, error = %e, retry_in_ms = delay_ms, "outbox delivery failed");
            }
        }
    }
    let done: Vec<u64> = sequences.into_iter().filter(|s| everywhere.contains(s)).collect();
    let completed = done.len() as u64;
    if !done.is_empty() {
        let store = ctx.store.clone();
        blocking(move || store.ack_outbox(done)).await?;
    }
    Ok((read, completed))
}

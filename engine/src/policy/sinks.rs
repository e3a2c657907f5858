//! Outbox sinks declared in policy files (`[[sink]]`): where events are delivered, checked
//! when the policy loads.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::invalid;
use crate::error::Result;
use crate::model;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSink {
    name: String,
    kind: SinkKind,
    url: Option<String>,
    path: Option<PathBuf>,
    timeout_ms: Option<u64>,
    ca_file: Option<PathBuf>,
}

/// Where outbox events are delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// POST each event as JSON, with an `Idempotency-Key` header.
    Webhook,
    /// Append each event as one JSON line to a file (fsynced).
    Jsonl,
}

/// A validated outbox sink.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SinkConfig {
    pub name: String,
    pub kind: SinkKind,
    /// The webhook URL or the file path.
    pub destination: String,
    pub timeout_ms: u64,
    /// The PEM file of extra certificate authorities an `https://` webhook trusts besides the
    /// system's (`ca_file`, read when the policy loads).
    pub ca_file: Option<String>,
    /// The DER certificates of `ca_file`.
    #[serde(skip)]
    pub ca_certificates: Vec<Vec<u8>>,
}

pub const SINK_TIMEOUT_MS_DEFAULT: u64 = 5_000;
pub const SINK_TIMEOUT_MS_MAX: u64 = 60_000;

pub(super) fn validate_sink(dir: &Path, file: &Path, raw: RawSink) -> Result<SinkConfig> {
    if !model::is_visible_ascii(&raw.name, 64) {
        return Err(invalid(file, format!("sink name `{}` must be 1 to 64 bytes of visible ASCII", raw.name)));
    }
    let timeout_ms = raw.timeout_ms.unwrap_or(SINK_TIMEOUT_MS_DEFAULT);
    if timeout_ms == 0 || timeout_ms > SINK_TIMEOUT_MS_MAX {
        return Err(invalid(file, format!("sink `{}`: timeout_ms must be 1..={SINK_TIMEOUT_MS_MAX}", raw.name)));
    }
    let destination = match (raw.kind, raw.url, raw.path) {
        (SinkKind::Webhook, Some(url), None) => {
            if !url.starts_with("http://") && !url.starts_with("https://") {
                return Err(invalid(file, format!("sink `{}`: url must start with http:// or https://", raw.name)));
            }
            url
        }
        (SinkKind::Jsonl, None, Some(path)) => {
            let path = if path.is_absolute() { path } else { dir.join(path) };
            path.display().to_string()
        }
        (SinkKind::Webhook, _, _) => {
            return Err(invalid(file, format!("sink `{}`: a webhook sink takes `url` (and no `path`)", raw.name)));
        }
        (SinkKind::Jsonl, _, _) => {
            return Err(invalid(file, format!("sink `{}`: a jsonl sink takes `path` (and no `url`)", raw.name)));
        }
    };
    let (ca_file, ca_certificates) = match raw.ca_file {
        None => (None, Vec::new()),
        Some(_) if raw.kind != SinkKind::Webhook || !destination.starts_with("https://") => {
            return Err(invalid(file, format!("sink `{}`: ca_file is for https:// webhooks only", raw.name)));
        }
        Some(path) => {
            let path = if path.is_absolute() { path } else { dir.join(path) };
            let certificates = crate::storage::trust::read_pem_certificates(&path)
                .map_err(|why| invalid(file, format!("sink `{}`: ca_file {}: {why}", raw.name, path.display())))?;
            (Some(path.display().to_string()), certificates)
        }
    };
    Ok(SinkConfig { name: raw.name, kind: raw.kind, destination, timeout_ms, ca_file, ca_certificates })
}

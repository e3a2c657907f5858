//! A small blocking client of the API, for the CLI: while an engine runs on a data directory,
//! `ingest`, `query`, `status`, `archive --once`, `hold place|lift|list` and `verify` go
//! through it. Tokens come from
//! FROSTLINE_TOKEN and FROSTLINE_ADMIN_TOKEN.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use crate::error::ErrorKind;

/// What can go wrong talking to a running engine.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The running engine refused the request.
    #[error("the running engine at {addr} answered {status}: {message}")]
    Refused { addr: String, status: u16, kind: ErrorKind, message: String },

    /// The running engine's API could not be reached.
    #[error("cannot reach the running engine's API at {addr}: {reason}")]
    Unreachable { addr: String, reason: String },

    /// The engine answered something this client cannot read (another version?).
    #[error("unexpected answer from {addr}: {reason}")]
    Unexpected { addr: String, reason: String },
}

impl ClientError {
    /// The public kind, as for the engine's own errors (exit codes follow it).
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClientError::Refused { kind, .. } => *kind,
            ClientError::Unreachable { .. } => ErrorKind::Unavailable,
            ClientError::Unexpected { .. } => ErrorKind::Internal,
        }
    }
}

type Result<T> = std::result::Result<T, ClientError>;
use crate::ops::archives::VerifyReport;
use crate::ops::wire::{AppendCounts, ErrorBody, HoldsPage};

/// How long connecting to the running engine may take.
pub const CLIENT_CONNECT_SECONDS_MAX: u64 = 5;

/// The running engine's API.
pub struct Client {
    addr: SocketAddr,
    /// `http`, or `https` when the engine serves TLS.
    scheme: &'static str,
    token: Option<String>,
    admin_token: Option<String>,
    agent: ureq::Agent,
}

/// One page of a query: each record as its JSON text (the JSON-lines shape, body byte for byte).
#[derive(Debug, Deserialize)]
pub struct Page {
    pub records: Vec<Box<serde_json::value::RawValue>>,
    pub next_cursor: Option<String>,
    /// Ranges the page met whose archives expired on purpose.
    pub expired: Vec<crate::ops::query::ExpiredRange>,
}

/// The query of one page.
#[derive(Debug, Default, Clone)]
pub struct PageRequest<'a> {
    pub partition: Option<&'a str>,
    pub tenant: Option<&'a str>,
    pub from: Option<&'a str>,
    pub to: Option<&'a str>,
    pub limit: usize,
    pub cursor: Option<&'a str>,
    /// Conditions on typed columns (`carrier=AA`), each sent as a `where` parameter.
    pub conditions: &'a [String],
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

impl Client {
    /// A plain-HTTP client of the API at `addr`.
    pub fn new(addr: SocketAddr, token: Option<String>, admin_token: Option<String>) -> Client {
        Client::with_tls(addr, token, admin_token, None)
    }

    /// A client of the API at `addr`; over TLS trusting the system's authorities and `tls`
    /// (DER certificates) when `tls` is given.
    pub fn with_tls(
        addr: SocketAddr,
        token: Option<String>,
        admin_token: Option<String>,
        tls: Option<&[Vec<u8>]>,
    ) -> Client {
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(CLIENT_CONNECT_SECONDS_MAX)));
        if let Some(extra) = tls {
            config = config.tls_config(crate::ops::wire::tls_config(extra));
        }
        let scheme = if tls.is_some() { "https" } else { "http" };
        Client {
            addr,
            scheme,
            token: non_empty(token),
            admin_token: non_empty(admin_token),
            agent: config.build().into(),
        }
    }

    /// The client of the engine running on `data_dir` at `addr` (its `frostline.addr`), with
    /// the tokens of FROSTLINE_TOKEN and FROSTLINE_ADMIN_TOKEN; over TLS when the engine
    /// serves it (`frostline.tls`), trusting the certificate chain it serves, the system's
    /// authorities and FROSTLINE_CA_FILE.
    pub fn for_running_engine(data_dir: &std::path::Path, addr: SocketAddr) -> crate::Result<Client> {
        let (token, admin) = (std::env::var("FROSTLINE_TOKEN").ok(), std::env::var("FROSTLINE_ADMIN_TOKEN").ok());
        let marker = data_dir.join(crate::ops::wire::TLS_FILE);
        let served = match std::fs::read_to_string(&marker) {
            Ok(path) => std::path::PathBuf::from(path.trim()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Client::new(addr, token, admin)),
            Err(e) => return Err(crate::Error::io(&marker, e)),
        };
        // The chain may be unreadable to this user (a key directory closed to it): the system's
        // authorities and FROSTLINE_CA_FILE may still verify the engine.
        let mut trusted = crate::ops::wire::read_pem_certificates(&served).unwrap_or_else(|why| {
            eprintln!(
                "note: the running engine's certificate chain {} {why}; trusting the system's authorities and \
                 FROSTLINE_CA_FILE only",
                served.display()
            );
            Vec::new()
        });
        if let Some(ca_file) = std::env::var_os("FROSTLINE_CA_FILE") {
            let ca_file = std::path::PathBuf::from(ca_file);
            trusted.extend(crate::ops::wire::read_pem_certificates(&ca_file).map_err(|why| {
                crate::Error::InvalidInput(format!("FROSTLINE_CA_FILE {}: {why}", ca_file.display()))
            })?);
        }
        Ok(Client::with_tls(addr, token, admin, Some(&trusted)))
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn unexpected(&self, e: impl std::fmt::Display) -> ClientError {
        ClientError::Unexpected { addr: self.addr.to_string(), reason: e.to_string() }
    }

    fn unreachable(&self, e: impl std::fmt::Display) -> ClientError {
        ClientError::Unreachable { addr: self.addr.to_string(), reason: e.to_string() }
    }

    /// Sends a request; a 2xx answer's body is returned, anything else becomes an error with
    /// the server's kind and message. Admin routes send the admin token (else the ordinary one).
    fn send(&self, method: &str, path_and_query: &str, body: Option<(&str, &[u8])>, admin: bool) -> Result<String> {
        let url = format!("{}://{}{path_and_query}", self.scheme, self.addr);
        let token = if admin {
            self.admin_token.as_ref().or(self.token.as_ref())
        } else {
            self.token.as_ref().or(self.admin_token.as_ref())
        };
        let authorization = token.map(|t| format!("Bearer {t}"));
        let response = match method {
            "GET" => {
                let mut request = self.agent.get(&url);
                if let Some(value) = &authorization {
                    request = request.header("Authorization", value);
                }
                request.call()
            }
            "DELETE" => {
                let mut request = self.agent.delete(&url);
                if let Some(value) = &authorization {
                    request = request.header("Authorization", value);
                }
                request.call()
            }
            _ => {
                let mut request = self.agent.post(&url);
                if let Some(value) = &authorization {
                    request = request.header("Authorization", value);
                }
                match body {
                    Some((content_type, bytes)) => request.header("Content-Type", content_type).send(bytes),
                    None => request.send_empty(),
                }
            }
        };
        let mut response = response.map_err(|e| self.unreachable(e))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(u64::MAX)
            .read_to_string()
            .map_err(|e| self.unreachable(format!("reading the answer: {e}")))?;
        if (200..300).contains(&status) {
            return Ok(text);
        }
        let (kind, mut message) = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => {
                // The API's own kinds (`unauthorized`, `limit_exceeded`...) are the caller's to fix.
                let kind = serde_json::from_value(serde_json::Value::String(body.error.kind.clone()))
                    .unwrap_or(ErrorKind::InvalidInput);
                let mut message = body.error.message;
                for r in &body.records {
                    match (r.line, r.index) {
                        (Some(line), _) => message.push_str(&format!("\n  line {line}: {}", r.reason)),
                        (_, Some(index)) => message.push_str(&format!("\n  record {index}: {}", r.reason)),
                        _ => message.push_str(&format!("\n  {}", r.reason)),
                    }
                }
                (kind, message)
            }
            Err(_) => (ErrorKind::Internal, text),
        };
        if status == 401 || status == 403 {
            message.push_str(if admin {
                "; set FROSTLINE_ADMIN_TOKEN to an admin token of the running engine"
            } else {
                "; set FROSTLINE_TOKEN to a token of the running engine"
            });
        }
        Err(ClientError::Refused { addr: self.addr.to_string(), status, kind, message })
    }

    fn json<T: serde::de::DeserializeOwned>(&self, text: &str) -> Result<T> {
        serde_json::from_str(text).map_err(|e| self.unexpected(e))
    }

    /// Appends JSON lines (at most `HTTP_RECORDS_PER_REQUEST_MAX` records and
    /// `HTTP_BODY_BYTES_MAX` bytes): one atomic append.
    /// Appends one batch; as part of a backfill (`?backfill=true`, which holds the table's
    /// backfill lease) when `backfill`.
    pub fn append(&self, table: &str, json_lines: &[u8], backfill: bool) -> Result<AppendCounts> {
        let query = if backfill { "?backfill=true" } else { "" };
        let path = format!("/v1/tables/{}/records{query}", percent_encode(table));
        let text = self.send("POST", &path, Some(("application/x-ndjson", json_lines)), false)?;
        self.json(&text)
    }

    /// Ends the table's backfill lease (an ingest finished).
    pub fn end_backfill(&self, table: &str) -> Result<()> {
        let path = format!("/v1/tables/{}/records?backfill=end", percent_encode(table));
        self.send("POST", &path, Some(("application/x-ndjson", b"")), false)?;
        Ok(())
    }

    pub fn query(&self, table: &str, request: &PageRequest<'_>) -> Result<Page> {
        let mut path = format!("/v1/tables/{}/records?limit={}", percent_encode(table), request.limit);
        for (name, value) in [
            ("partition", request.partition),
            ("tenant", request.tenant),
            ("from", request.from),
            ("to", request.to),
            ("cursor", request.cursor),
        ] {
            if let Some(value) = value {
                path.push_str(&format!("&{name}={}", percent_encode(value)));
            }
        }
        for condition in request.conditions {
            path.push_str(&format!("&where={}", percent_encode(condition)));
        }
        let text = self.send("GET", &path, None, false)?;
        self.json(&text)
    }

    pub fn status(&self) -> Result<crate::ops::status::Status> {
        let text = self.send("GET", "/v1/status", None, false)?;
        self.json(&text)
    }

    /// Runs passes until idle now; the `PassReport` as JSON.
    pub fn archive(&self) -> Result<serde_json::Value> {
        let text = self.send("POST", "/v1/archive", None, true)?;
        self.json(&text)
    }

    /// The table's typed columns as the running engine's policy declares them.
    pub fn columns(&self, table: &str) -> Result<Vec<crate::model::columns::ColumnSpec>> {
        let text = self.send("GET", &format!("/v1/tables/{}/columns", percent_encode(table)), None, false)?;
        Ok(self.json::<crate::ops::policy::TableColumns>(&text)?.columns)
    }

    /// Every hold, placed and policy-declared, with the buckets each covers.
    pub fn holds(&self) -> Result<Vec<crate::ops::holds::HoldListing>> {
        let text = self.send("GET", "/v1/holds", None, false)?;
        Ok(self.json::<HoldsPage>(&text)?.holds)
    }

    /// A dry-run reload of `dir` (admin): what a reload would say, and what it would re-plan.
    pub fn check_policies(&self, dir: &std::path::Path) -> Result<crate::ops::policy::CheckReport> {
        let body = serde_json::to_vec(&serde_json::json!({"dir": dir}))
            .map_err(|e| self.unexpected(format!("encoding the request: {e}")))?;
        let text = self.send("POST", "/v1/policy/check", Some(("application/json", &body)), true)?;
        self.json(&text)
    }

    /// Places a hold (admin).
    pub fn place_hold(&self, request: &crate::ops::holds::HoldRequest) -> Result<crate::ops::holds::HoldPlaced> {
        let body = serde_json::to_vec(request).map_err(|e| self.unexpected(format!("encoding the hold: {e}")))?;
        let text = self.send("POST", "/v1/holds", Some(("application/json", &body)), true)?;
        self.json(&text)
    }

    /// Places an erasure request, or counts it in a dry run (admin).
    pub fn place_erasure(
        &self,
        request: &crate::ops::erasure::EraseRequest,
    ) -> Result<crate::ops::erasure::ErasurePlaced> {
        let body = serde_json::to_vec(request).map_err(|e| self.unexpected(format!("encoding the erasure: {e}")))?;
        let text = self.send("POST", "/v1/erasures", Some(("application/json", &body)), true)?;
        self.json(&text)
    }

    /// One erasure request or all of them, with their receipts (admin).
    pub fn erasures(&self, id: Option<&str>) -> Result<Vec<crate::ops::erasure::ErasureRequest>> {
        match id {
            Some(id) => {
                let text = self.send("GET", &format!("/v1/erasures/{}", percent_encode(id)), None, true)?;
                Ok(vec![self.json(&text)?])
            }
            None => {
                let text = self.send("GET", "/v1/erasures", None, true)?;
                #[derive(serde::Deserialize)]
                struct Page {
                    erasures: Vec<crate::ops::erasure::ErasureRequest>,
                }
                Ok(self.json::<Page>(&text)?.erasures)
            }
        }
    }

    /// Lifts a hold (admin); the id lifted.
    pub fn lift_hold(&self, id: &str, by: &str) -> Result<String> {
        let path = format!("/v1/holds/{}?by={}", percent_encode(id), percent_encode(by));
        let text = self.send("DELETE", &path, None, true)?;
        let answer: serde_json::Value = self.json(&text)?;
        Ok(answer["lifted"].as_str().unwrap_or(id).to_string())
    }

    /// Verifies archived buckets (admin): of one table, or a random sample.
    pub fn verify(&self, table: Option<&str>, sample: Option<usize>) -> Result<VerifyReport> {
        let mut params = Vec::new();
        if let Some(table) = table {
            params.push(format!("table={}", percent_encode(table)));
        }
        if let Some(sample) = sample {
            params.push(format!("sample={sample}"));
        }
        let path =
            if params.is_empty() { "/v1/verify".to_string() } else { format!("/v1/verify?{}", params.join("&")) };
        let text = self.send("POST", &path, None, true)?;
        self.json(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding_keeps_only_unreserved_characters() {
        assert_eq!(percent_encode("2024-01-01T00:00:00Z"), "2024-01-01T00%3A00%3A00Z");
        assert_eq!(percent_encode("a b/ü"), "a%20b%2F%C3%BC");
    }
}

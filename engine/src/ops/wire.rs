//! The HTTP API's answer bodies that both sides share: the engine serialises them (`api`), the
//! CLI's client of a running engine reads them (`cli::client`); with the request limits both
//! keep and the file that says where a running engine listens.

use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One record the API refused, by its 1-based line (JSON lines) or 0-based index (JSON array).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordError {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub reason: String,
}

/// A named limit an answer refers to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitInfo {
    pub name: String,
    pub value: u64,
}

/// The body of every error answer: `{"error": {kind, message, limit?}, "invalid_records"?,
/// "records"?}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_records: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub records: Vec<RecordError>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// `invalid_input`, `conflict`, `unavailable`, `plugin_fault`, `data_corruption`,
    /// `internal`, `not_found`, `method_not_allowed`, `unauthorized`, `forbidden` or
    /// `limit_exceeded`.
    pub kind: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitInfo>,
}

/// Counts of one append, as the API reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct AppendCounts {
    pub appended: u64,
    pub duplicates: u64,
    /// Identical records found in their bucket's archive (a re-run ingest).
    #[serde(default)]
    pub already_archived: u64,
    /// Values of declared columns that did not fit their column and are stored as null (the
    /// column is declared with `on_mismatch = "null"`; the body keeps the value). Left out of
    /// the answer when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub column_misses: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The answer of `GET /v1/holds`.
#[derive(Debug, Deserialize, Serialize)]
pub struct HoldsPage {
    pub holds: Vec<crate::ops::holds::HoldListing>,
}

/// The trust the CLI's client of a running engine shares with the object-store clients: the
/// system's roots plus the certificates an operator adds, read from PEM.
pub use crate::storage::trust::{read_pem_certificates, tls_config};

/// A request body larger than this is refused with 413.
pub const HTTP_BODY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// The rest of a refused body is read (and dropped) up to this many bytes, so a client that
/// is still sending it receives the 413 answer; a body declared larger is refused at once.
pub const HTTP_BODY_DRAIN_BYTES_MAX: usize = 2 * HTTP_BODY_BYTES_MAX;
/// ...for at most this long.
pub const HTTP_BODY_DRAIN_SECONDS_MAX: u64 = 10;
/// An append of more records than this is refused with 422. Not above the engine's atomic
/// batch, so every accepted request is one atomic append.
pub const HTTP_RECORDS_PER_REQUEST_MAX: usize = 10_000;
const _: () = assert!(HTTP_RECORDS_PER_REQUEST_MAX <= crate::engine::APPEND_BATCH_RECORDS_MAX);
/// File in the data directory holding the running engine's API address (`host:port`, one line).
pub const ADDR_FILE: &str = "frostline.addr";
/// Written beside `ADDR_FILE` while the running engine serves TLS: the path of the
/// certificate chain it serves, which the local CLI trusts (with the system's authorities and
/// `FROSTLINE_CA_FILE`).
pub const TLS_FILE: &str = "frostline.tls";

/// The address a client on this host should use: an unspecified address (0.0.0.0, ::)
/// becomes the loopback address of its family.
pub fn client_addr(bound: SocketAddr) -> SocketAddr {
    let ip = match bound.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    SocketAddr::new(ip, bound.port())
}

/// Writes `<data>/frostline.addr` atomically.
pub fn write_addr_file(data_dir: &Path, bound: SocketAddr) -> Result<()> {
    let path = data_dir.join(ADDR_FILE);
    let tmp = data_dir.join(format!("{ADDR_FILE}.tmp"));
    std::fs::write(&tmp, format!("{}\n", client_addr(bound))).map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))
}

/// The address in `<data>/frostline.addr`, if the file exists.
pub fn read_addr_file(data_dir: &Path) -> Result<Option<SocketAddr>> {
    let path = data_dir.join(ADDR_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|e| Error::InvalidInput(format!("{} does not hold an address: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(&path, e)),
    }
}

//! The engine's error model: one precise internal enum whose messages carry their context,
//! folded into a small set of public kinds that tell a caller what to do next.
//!
//! May import only the pure core (`model`).

use std::path::PathBuf;

/// What a caller should do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request or input is wrong; fix it and retry.
    InvalidInput,
    /// The request contradicts existing state (a different body for an existing identity,
    /// a fenced bucket); nothing was changed.
    Conflict,
    /// A dependency is unavailable for now; retrying later may succeed.
    Unavailable,
    /// A plugin trapped, ran out of time or memory, or answered something invalid.
    PluginFault,
    /// Stored data does not match what was written.
    DataCorruption,
    /// A bug or an unexpected state; report it.
    Internal,
}

/// Every error the engine produces.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid input: {0}")]
    InvalidInput(String),

    #[error("conflict: {0}")]
    Conflict(String),

    #[error(
        "bucket is fenced: table=`{table}` bucket=`{bucket}` state={state}; appends are refused once archival has started"
    )]
    BucketFenced { table: String, bucket: String, state: String },

    #[error(
        "bucket is too old to write: table=`{table}` bucket=`{bucket}`; only the {writable_buckets} newest buckets of a partition accept appends (writable_buckets)"
    )]
    BucketNotWritable { table: String, bucket: String, writable_buckets: u32 },

    #[error("lease lost: bucket=`{bucket}` expected owner=`{owner}` generation={generation}: {detail}")]
    LeaseLost { bucket: String, owner: String, generation: u64, detail: String },

    #[error("plugin `{plugin}` ({hash}) fault in `{call}`: {cause}")]
    PluginFault { plugin: String, hash: String, call: String, cause: String },

    #[error("plugin `{plugin}` ({hash}) answered `{call}` with an invalid result: {reason}")]
    PluginInvalidAnswer { plugin: String, hash: String, call: String, reason: String },

    #[error("plugin `{plugin}` is suspended after {faults} consecutive faults; next attempt in {retry_in_ms} ms")]
    PluginSuspended { plugin: String, faults: u32, retry_in_ms: u64 },

    #[error("cannot load plugin from {source_name}: {reason}")]
    PluginLoad { source_name: String, reason: String },

    #[error("plugin `{plugin}` refused its configuration: {message}")]
    PluginConfig { plugin: String, message: String },

    #[error("object store unavailable: {0}")]
    StorageUnavailable(String),

    #[error("object store error: {0}")]
    Storage(String),

    #[error("data corruption: {0}")]
    Corruption(String),

    #[error("the store refuses writes after a failed commit ({0}); restart the engine to reopen it")]
    StorePoisoned(String),

    #[error(
        "data directory {path} is already open in another process; stop that process or use another --data directory"
    )]
    AlreadyOpen { path: PathBuf },

    #[error("database error: {0}")]
    Database(String),

    #[error("I/O error at {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },

    #[error("internal error: {0}")]
    Internal(String),

    /// A running engine's HTTP API refused a request (the CLI talking to it).
    #[error("the running engine at {addr} answered {status}: {message}")]
    Api { addr: String, status: u16, kind: ErrorKind, message: String },

    /// The running engine's HTTP API could not be reached.
    #[error("cannot reach the running engine's API at {addr}: {reason}")]
    ApiUnreachable { addr: String, reason: String },
}

impl Error {
    /// Folds the precise error into the public kind that tells the caller what to do.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidInput(_) | Error::PluginConfig { .. } | Error::PluginLoad { .. } => ErrorKind::InvalidInput,
            Error::Conflict(_)
            | Error::BucketFenced { .. }
            | Error::BucketNotWritable { .. }
            | Error::LeaseLost { .. }
            | Error::AlreadyOpen { .. } => ErrorKind::Conflict,
            Error::StorageUnavailable(_) | Error::StorePoisoned(_) => ErrorKind::Unavailable,
            Error::PluginFault { .. } | Error::PluginInvalidAnswer { .. } | Error::PluginSuspended { .. } => {
                ErrorKind::PluginFault
            }
            Error::Corruption(_) => ErrorKind::DataCorruption,
            Error::Storage(_) | Error::Database(_) | Error::Io { .. } | Error::Internal(_) => ErrorKind::Internal,
            Error::Api { kind, .. } => *kind,
            Error::ApiUnreachable { .. } => ErrorKind::Unavailable,
        }
    }

    /// Whether retrying the same operation later may succeed. The one place that decides.
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind(), ErrorKind::Unavailable | ErrorKind::PluginFault | ErrorKind::DataCorruption)
            || matches!(self, Error::Storage(_) | Error::Io { .. })
    }

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

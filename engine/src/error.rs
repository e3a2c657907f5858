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
    /// What the request names (a hold, a table) does not exist.
    NotFound,
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

    #[error("not found: {0}")]
    NotFound(String),

    #[error(
        "bucket is fenced: table=`{table}` bucket=`{bucket}` state={state}; appends are refused once archival has started"
    )]
    BucketFenced { table: String, bucket: String, state: String },

    #[error(
        "bucket is closed: table=`{table}` bucket=`{bucket}`: its archive expired by retention ({reason}); a record for \
         it is refused, since the retention policy decided this time range is no longer kept"
    )]
    BucketExpired { table: String, bucket: String, reason: String },

    #[error(
        "bucket `{bucket}` published another archive generation while this batch was compared with the last one; \
         nothing in this batch was applied: send it again"
    )]
    ArchiveChanged { bucket: String },

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

    #[error("the hot store is unavailable after a failed commit: {0}")]
    StorePoisoned(String),

    #[error(
        "data directory {path} is already open in another process; stop that process or use another --data directory"
    )]
    AlreadyOpen { path: PathBuf },

    /// redb failed; `context` says what was being done when it is not obvious from the caller.
    /// Shared (`Arc`) so one failure can answer every append of a group commit.
    #[error("database error{}: {source}", context_note(.context))]
    Database { context: String, source: std::sync::Arc<redb::Error> },

    #[error("I/O error at {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },

    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// Folds the precise error into the public kind that tells the caller what to do.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidInput(_) | Error::PluginConfig { .. } | Error::PluginLoad { .. } => ErrorKind::InvalidInput,
            Error::Conflict(_)
            | Error::BucketFenced { .. }
            | Error::BucketExpired { .. }
            | Error::ArchiveChanged { .. }
            | Error::BucketNotWritable { .. }
            | Error::LeaseLost { .. }
            | Error::AlreadyOpen { .. } => ErrorKind::Conflict,
            Error::StorageUnavailable(_) | Error::StorePoisoned(_) => ErrorKind::Unavailable,
            Error::PluginFault { .. } | Error::PluginInvalidAnswer { .. } | Error::PluginSuspended { .. } => {
                ErrorKind::PluginFault
            }
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::Corruption(_) => ErrorKind::DataCorruption,
            Error::Storage(_) | Error::Database { .. } | Error::Io { .. } | Error::Internal(_) => ErrorKind::Internal,
        }
    }

    /// Whether retrying the same operation later may succeed: an outage, a plugin fault, a
    /// corrupt read, a local I/O error. The one place that decides; a store's refusal
    /// (`Storage`: access denied, not supported, not found) is permanent, and so is an upload
    /// it refused (its outcome is known: nothing was written).
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind(), ErrorKind::Unavailable | ErrorKind::PluginFault | ErrorKind::DataCorruption)
            || matches!(self, Error::Io { .. })
    }

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn context_note(context: &str) -> String {
    if context.is_empty() { String::new() } else { format!(" ({context})") }
}

impl Error {
    /// A redb failure, with what was being done.
    pub fn database(context: impl Into<String>, source: impl Into<redb::Error>) -> Error {
        Error::Database { context: context.into(), source: std::sync::Arc::new(source.into()) }
    }
}

/// Every redb error converts, so store code uses `?` and keeps the error as the source.
macro_rules! from_redb {
    ($($error:ty),*) => {$(
        impl From<$error> for Error {
            fn from(e: $error) -> Error {
                Error::database(String::new(), e)
            }
        }
    )*};
}
from_redb!(
    redb::Error,
    redb::StorageError,
    redb::TableError,
    redb::DatabaseError,
    redb::TransactionError,
    redb::CommitError,
    redb::CompactionError,
    redb::SetDurabilityError,
    redb::SavepointError
);

//! Object storage: the backend trait the coordinator speaks to, its object_store
//! implementation (local directory, S3-compatible, GCS, Azure Blob, memory; built from the
//! policy directory's targets in `target`), the probe that refuses a store which would break
//! the protocol (`probe`), the key layout, a fault-injecting decorator for tests, and the
//! certificate authorities frostline's own HTTPS clients trust (`trust`).
//!
//! Imports the core; knows nothing of redb or the coordinator.

pub mod faults;
pub mod keys;
pub mod probe;
pub mod target;
pub mod trust;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt as _, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::error::{Error, Result};
use target::{MULTIPART_PART_BYTES, MULTIPART_THRESHOLD_BYTES, Redactor};

/// Threads of the runtime that does remote stores' HTTP.
pub const IO_RUNTIME_THREADS: usize = 2;

/// Waits for a backend future from synchronous code: a blocking thread (a plugin call, an
/// append), or a thread with no runtime at all (the CLI before it starts one), which uses a
/// small runtime of its own for the life of the process.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        // On a blocking thread `block_in_place` is a no-op; on a worker it hands the worker's
        // other tasks over first, so the executor keeps running.
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| handle.block_on(future))
        }
        Ok(handle) => handle.block_on(future),
        Err(_) => fallback_runtime().block_on(future),
    }
}

fn fallback_runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("frostline-blocking-io")
            .enable_all()
            .build()
            .expect("building the fallback I/O runtime")
    })
}

/// The runtime on which every remote store does its HTTP, for the life of the process. Callers
/// on any runtime (a pass, a query, the probe at load on a short-lived one) only await
/// results, so pooled connections never belong to a runtime that has gone.
pub fn io_runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: std::sync::OnceLock<std::result::Result<tokio::runtime::Runtime, String>> =
        std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(IO_RUNTIME_THREADS)
                .thread_name("frostline-io")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Error::Internal(format!("cannot start the storage I/O runtime: {e}")))
}

/// What a conditional create did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    Created,
    /// Something is already stored under the key; the caller must compare it.
    AlreadyExists,
}

/// A blob store as the archival protocol needs it. The engine owns keys and every check.
#[async_trait]
pub trait ArchiveBackend: Send + Sync + std::fmt::Debug {
    /// Where objects go (store URL and prefix), recorded in manifests.
    fn target(&self) -> &str;
    /// Creates `key` only if absent; durable when it returns `Created`.
    async fn put_create(&self, key: &str, bytes: Bytes) -> Result<PutOutcome>;
    /// Like `put_create`, through the path large objects take whatever the size (for object
    /// stores: a multipart upload to a temporary key, then a conditional copy), so the probe
    /// can check it with a few bytes. Backends with a single path need not override it.
    async fn put_create_staged(&self, key: &str, bytes: Bytes) -> Result<PutOutcome> {
        self.put_create(key, bytes).await
    }
    /// `None` when the key does not exist.
    async fn get(&self, key: &str) -> Result<Option<Bytes>>;
    async fn delete(&self, key: &str) -> Result<()>;
    /// Every object under `prefix`, in ascending key order.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>>;
    /// Every object under `prefix`, as the store returns them page by page (in no particular
    /// order: a local directory lists folder by folder), for listings too large to hold. Backends
    /// whose store returns a whole listing at once need not override it.
    fn list_stream<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectInfo>> {
        futures::stream::once(self.list(prefix))
            .map_ok(|listed| futures::stream::iter(listed.into_iter().map(Ok)))
            .try_flatten()
            .boxed()
    }
    /// The object store under the target's root, for a table format's own writer (the Delta
    /// log); `None` for targets that are not object stores (archiver plugins).
    fn object_store(&self) -> Option<Arc<dyn ObjectStore>> {
        None
    }
    /// The directory of a local target (the object store's root on disk).
    fn local_dir(&self) -> Option<std::path::PathBuf> {
        None
    }
    /// The target keeps deleted objects as noncurrent versions (its probe found it,
    /// `probe::ProbeFindings`): a delete here hides the bytes but does not remove them.
    fn keeps_deleted_versions(&self) -> bool {
        false
    }
}

/// One listed object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    /// Last modification, microseconds since the epoch (the store's clock).
    pub last_modified: crate::model::Micros,
}

/// The one place that decides what an object_store error means for the protocol.
pub fn classify(error: object_store::Error, key: &str) -> Error {
    classify_scrubbed(error, key, &Redactor::default())
}

/// `classify`, with every known secret scrubbed from the message.
pub fn classify_scrubbed(error: object_store::Error, key: &str, redactor: &Redactor) -> Error {
    use object_store::Error as E;
    let text = |message: String| redactor.scrub(message);
    match error {
        E::NotFound { .. } => Error::Storage(format!("`{key}` not found")),
        E::AlreadyExists { .. } | E::Precondition { .. } => Error::Conflict(format!("`{key}` already exists")),
        E::InvalidPath { source } => Error::InvalidInput(text(format!("invalid object key `{key}`: {source}"))),
        // Wrong credentials or a missing feature are not outages: retrying will not help, and
        // the probe refuses such a target instead of waiting for it.
        e @ (E::PermissionDenied { .. } | E::Unauthenticated { .. }) => {
            Error::Storage(text(format!("`{key}`: access denied: {e}")))
        }
        e @ (E::NotSupported { .. } | E::NotImplemented { .. } | E::UnknownConfigurationKey { .. }) => {
            Error::Storage(text(format!("`{key}`: not supported by this store: {e}")))
        }
        other => Error::StorageUnavailable(text(format!("`{key}`: {other}"))),
    }
}

/// An `ArchiveBackend` over any object_store (already under the target's prefix).
#[derive(Debug, Clone)]
pub struct ObjectStoreBackend {
    store: Arc<dyn ObjectStore>,
    target: String,
    multipart_threshold_bytes: u64,
    redactor: Redactor,
    /// For a local directory: object_store writes files without fsync, so the backend syncs
    /// each new object and its directories before it reports it created (durable on Ok).
    local_fsync: Option<Arc<object_store::local::LocalFileSystem>>,
}

impl ObjectStoreBackend {
    pub fn new(store: Arc<dyn ObjectStore>, target: impl Into<String>) -> Self {
        ObjectStoreBackend {
            store,
            target: target.into(),
            multipart_threshold_bytes: MULTIPART_THRESHOLD_BYTES,
            redactor: Redactor::default(),
            local_fsync: None,
        }
    }

    /// Makes every created object durable on a local file system (fsync of the file and of
    /// each directory up to the store's root).
    pub fn with_local_fsync(mut self, local: Arc<object_store::local::LocalFileSystem>) -> Self {
        self.local_fsync = Some(local);
        self
    }

    async fn sync_local(&self, key: &str) -> Result<()> {
        let Some(local) = &self.local_fsync else { return Ok(()) };
        let root = local.path_to_filesystem(&object_path("probe")?).map_err(|e| self.fail_write(e, key))?;
        let root = root.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
        let file = local.path_to_filesystem(&object_path(key)?).map_err(|e| self.fail_write(e, key))?;
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::File::open(&file)?.sync_all()?;
            let mut dir = file.parent();
            while let Some(d) = dir {
                std::fs::File::open(d)?.sync_all()?;
                if d == root || !d.starts_with(&root) {
                    break;
                }
                dir = d.parent();
            }
            Ok(())
        })
        .await
        .map_err(|e| Error::Internal(format!("fsync task failed: {e}")))?
        .map_err(|e| Error::StorageUnavailable(format!("cannot fsync `{key}`: {e}")))
    }

    /// Objects larger than `bytes` take the multipart path.
    pub fn with_multipart_threshold(mut self, bytes: u64) -> Self {
        self.multipart_threshold_bytes = bytes;
        self
    }

    /// Secrets to scrub from this backend's error messages.
    pub fn with_redactor(mut self, redactor: Redactor) -> Self {
        self.redactor = redactor;
        self
    }

    /// Builds a backend from a URL with no options: `file:///abs/dir` (created if missing),
    /// `memory://`, or a remote URL configured from the environment.
    pub fn from_url(url: &str) -> Result<Self> {
        target::TargetConfig::from_url("adhoc", url)
            .validate(std::path::Path::new("."))
            .map_err(|e| Error::InvalidInput(format!("archive target `{url}`: {e}")))?
            .build()
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    pub fn multipart_threshold_bytes(&self) -> u64 {
        self.multipart_threshold_bytes
    }

    fn fail(&self, error: object_store::Error, key: &str) -> Error {
        classify_scrubbed(error, key, &self.redactor)
    }

    /// A write answered NotFound: the bucket or container is missing.
    fn fail_write(&self, error: object_store::Error, key: &str) -> Error {
        match error {
            object_store::Error::NotFound { .. } => Error::Storage(format!(
                "`{key}`: the store answered NotFound to a write: does the bucket or container exist?"
            )),
            other => self.fail(other, key),
        }
    }

    /// Uploads `bytes` in parts to a new temporary key; aborts the upload on failure.
    async fn upload_parts(&self, temporary: &ObjectPath, bytes: Bytes) -> std::result::Result<(), object_store::Error> {
        let mut upload = self.store.put_multipart(temporary).await?;
        let mut parts = Vec::with_capacity(bytes.len().div_ceil(MULTIPART_PART_BYTES).max(1));
        let mut offset = 0;
        loop {
            let end = (offset + MULTIPART_PART_BYTES).min(bytes.len());
            parts.push(upload.put_part(PutPayload::from_bytes(bytes.slice(offset..end))));
            offset = end;
            if offset >= bytes.len() {
                break;
            }
        }
        let uploaded = match futures::future::try_join_all(parts).await {
            Ok(_) => upload.complete().await.map(|_| ()),
            Err(e) => Err(e),
        };
        if uploaded.is_err()
            && let Err(e) = upload.abort().await
        {
            tracing::warn!(key = %temporary, error = %self.redactor.scrub(e.to_string()), "cannot abort a failed multipart upload");
        }
        uploaded
    }
}

fn object_path(key: &str) -> Result<ObjectPath> {
    ObjectPath::parse(key).map_err(|e| Error::InvalidInput(format!("invalid object key `{key}`: {e}")))
}

#[async_trait]
impl ArchiveBackend for ObjectStoreBackend {
    fn target(&self) -> &str {
        &self.target
    }

    fn object_store(&self) -> Option<Arc<dyn ObjectStore>> {
        Some(self.store.clone())
    }

    fn local_dir(&self) -> Option<std::path::PathBuf> {
        let local = self.local_fsync.as_ref()?;
        // The root is the folder of any top-level key.
        let probe = local.path_to_filesystem(&ObjectPath::from("probe")).ok()?;
        probe.parent().map(std::path::Path::to_path_buf)
    }

    async fn put_create(&self, key: &str, bytes: Bytes) -> Result<PutOutcome> {
        let outcome = if bytes.len() as u64 > self.multipart_threshold_bytes {
            self.put_create_staged(key, bytes).await?
        } else {
            let options = PutOptions { mode: PutMode::Create, ..Default::default() };
            match self.store.put_opts(&object_path(key)?, PutPayload::from_bytes(bytes), options).await {
                Ok(_) => PutOutcome::Created,
                Err(object_store::Error::AlreadyExists { .. }) | Err(object_store::Error::Precondition { .. }) => {
                    PutOutcome::AlreadyExists
                }
                Err(e) => return Err(self.fail_write(e, key)),
            }
        };
        // An existing object may be one a crashed attempt wrote and never synced: sync it too.
        self.sync_local(key).await?;
        Ok(outcome)
    }

    /// A multipart upload cannot be conditional in object_store: upload to a temporary key,
    /// copy it to `key` only if `key` is absent, then delete the temporary object. An existing
    /// `key` is reported like a conditional create's (the caller reads and compares).
    async fn put_create_staged(&self, key: &str, bytes: Bytes) -> Result<PutOutcome> {
        let destination = object_path(key)?;
        let temporary_key = keys::temporary_key(rand::random());
        let temporary = object_path(&temporary_key)?;
        self.upload_parts(&temporary, bytes).await.map_err(|e| self.fail_write(e, &temporary_key))?;
        let copied = self.store.copy_if_not_exists(&temporary, &destination).await;
        // The temporary object is garbage whatever the copy did; one left behind (a failed
        // delete, a crash) is unreferenced and the orphan sweep deletes it after its grace.
        if let Err(e) = self.store.delete(&temporary).await {
            tracing::warn!(key = %temporary_key, error = %self.fail(e, &temporary_key), "temporary object left for the orphan sweep");
        }
        match copied {
            Ok(()) => Ok(PutOutcome::Created),
            Err(object_store::Error::AlreadyExists { .. }) | Err(object_store::Error::Precondition { .. }) => {
                Ok(PutOutcome::AlreadyExists)
            }
            Err(e) => Err(self.fail(e, key)),
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        match self.store.get(&object_path(key)?).await {
            Ok(result) => Ok(Some(result.bytes().await.map_err(|e| self.fail(e, key))?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.fail(e, key)),
        }
    }

    async fn delete(&self, key: &str) -> Result<()> {
        match self.store.delete(&object_path(key)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.fail(e, key)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let mut objects: Vec<ObjectInfo> = self.list_stream(prefix).try_collect().await?;
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
    }

    fn list_stream<'a>(&'a self, prefix: &'a str) -> BoxStream<'a, Result<ObjectInfo>> {
        let trimmed = prefix.trim_end_matches('/');
        let path = match trimmed {
            "" => None,
            trimmed => match object_path(trimmed) {
                Ok(path) => Some(path),
                Err(e) => return futures::stream::once(async { Err(e) }).boxed(),
            },
        };
        self.store
            .list(path.as_ref())
            .map_ok(|meta| ObjectInfo {
                key: meta.location.to_string(),
                size: meta.size,
                last_modified: meta.last_modified.timestamp_micros(),
            })
            .map_err(move |e| self.fail(e, prefix))
            // The store lists by whole path segments; keep exactly the keys under `prefix` as written.
            .try_filter(move |o| std::future::ready(o.key.starts_with(prefix)))
            .boxed()
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;

    /// Access denied and unsupported operations are permanent wherever retryability is asked:
    /// the archival step (`is_retryable`) and the plugin contract (`kind`, which the blob store
    /// binding maps to transient only for `Unavailable`).
    #[test]
    fn a_stores_refusal_is_permanent_and_an_outage_is_not() {
        let denied = classify(object_store::Error::PermissionDenied { path: "k".into(), source: "no".into() }, "k");
        assert!(!denied.is_retryable(), "{denied}");
        assert_ne!(denied.kind(), crate::ErrorKind::Unavailable);
        let unsupported =
            classify(object_store::Error::NotImplemented { operation: "put".into(), implementer: "test".into() }, "k");
        assert!(!unsupported.is_retryable(), "{unsupported}");
        let outage = classify(object_store::Error::Generic { store: "S3", source: "connection reset".into() }, "k");
        assert!(outage.is_retryable() && outage.kind() == crate::ErrorKind::Unavailable, "{outage}");
        let db = crate::Error::database("reading", redb::StorageError::Corrupted("page".into()));
        assert!(std::error::Error::source(&db).is_some(), "the redb error is kept as the source");
        assert_eq!(crate::Error::NotFound("hold".into()).kind(), crate::ErrorKind::NotFound);
    }
}

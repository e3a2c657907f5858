//! Capabilities: what a plugin may use beyond computing. Default-deny: a plugin instance gets
//! a WASI context with nothing in it (no preopened directory, environment, arguments or
//! sockets) and a blob store that answers every call with `permanent("not granted: ...")`.
//! The policy directory's `[[grant]]` for a plugin's content hash fills in [`Capabilities`]
//! (see `policy::grants`); only archiver targets receive them.
//!
//! The blob store is a host import implemented over a native target's `ArchiveBackend`. The
//! backend is async and the import is sync: plugin calls run on blocking threads (never on the
//! async executor), so the import waits for the backend there.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use wasmtime_wasi::{FsPerms, WasiCtx};

use super::bindings::blob_store_iface;
use super::bindings::wit_types::BackendError;
use super::http::HttpGrant;
use crate::error::{Error, ErrorKind, Result};
use crate::storage::{ArchiveBackend, PutOutcome};

/// Keys the blob store accepts at most, in bytes (object stores allow about 1 KiB).
pub const BLOB_KEY_BYTES_MAX: usize = 1024;

/// How a preopened directory may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PreopenMode {
    /// Read files and list directories only.
    Ro,
    /// Also create, write, rename and remove.
    Rw,
}

impl PreopenMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PreopenMode::Ro => "ro",
            PreopenMode::Rw => "rw",
        }
    }
}

/// A host directory shown to the plugin under a guest path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Preopen {
    pub host: PathBuf,
    pub guest: String,
    pub mode: PreopenMode,
}

/// A native target lent to the plugin through the `blob-store` import.
#[derive(Clone)]
pub struct BlobStoreGrant {
    /// The `[[target]]` name, for messages.
    pub target: String,
    pub backend: Arc<dyn ArchiveBackend>,
}

impl std::fmt::Debug for BlobStoreGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlobStoreGrant({} = {})", self.target, self.backend.target())
    }
}

/// Everything one plugin instance is granted. `Default` grants nothing.
#[derive(Debug, Clone, Default)]
pub struct Capabilities {
    pub preopens: Vec<Preopen>,
    pub blob_store: Option<BlobStoreGrant>,
    /// Origins an archiver may send `wasi:http` requests to, and its body limit.
    pub http: Option<Arc<HttpGrant>>,
}

impl Capabilities {
    /// Nothing granted.
    pub fn none() -> Self {
        Capabilities::default()
    }

    pub fn is_empty(&self) -> bool {
        self.preopens.is_empty() && self.blob_store.is_none() && self.http.is_none()
    }

    /// A WASI context with exactly the granted directories (and still no environment,
    /// arguments or sockets). With `deterministic` (strategies and retention policies, whose
    /// answers must be functions of their input) the clocks stand still at the Unix epoch and
    /// every random byte is zero, so two calls with the same input answer alike.
    pub(crate) fn wasi_ctx(&self, deterministic: bool) -> Result<WasiCtx> {
        let mut builder = WasiCtx::builder();
        if deterministic {
            builder
                .wall_clock(StoppedClock)
                .monotonic_clock(StoppedClock)
                .secure_random(ZeroRandom)
                .insecure_random(ZeroRandom)
                .insecure_random_seed(0);
        }
        for p in &self.preopens {
            let perms = match p.mode {
                PreopenMode::Ro => FsPerms::ReadOnly,
                PreopenMode::Rw => FsPerms::ReadWrite,
            };
            builder
                .preopened_dir(&p.host, &p.guest, perms)
                .map_err(|e| Error::Storage(format!("cannot preopen {} as {}: {e:#}", p.host.display(), p.guest)))?;
        }
        Ok(builder.build())
    }

    /// One line for logs and status: `preopen /srv/a -> /data (rw); blob store cold`.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .preopens
            .iter()
            .map(|p| format!("preopen {} -> {} ({})", p.host.display(), p.guest, p.mode.as_str()))
            .collect();
        if let Some(b) = &self.blob_store {
            parts.push(format!("blob store `{}`", b.target));
        }
        if let Some(http) = &self.http {
            parts.push(http.describe());
        }
        if parts.is_empty() { "nothing".to_string() } else { parts.join("; ") }
    }
}

/// A clock that always reads zero: the Unix epoch on the wall, no time passed on the monotonic
/// clock.
struct StoppedClock;

impl wasmtime_wasi::HostWallClock for StoppedClock {
    fn resolution(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(1)
    }
    fn now(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

impl wasmtime_wasi::HostMonotonicClock for StoppedClock {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        0
    }
}

/// A random source whose every byte is zero.
struct ZeroRandom;

impl rand_core::TryRng for ZeroRandom {
    type Error = std::convert::Infallible;
    fn try_next_u32(&mut self) -> std::result::Result<u32, Self::Error> {
        Ok(0)
    }
    fn try_next_u64(&mut self) -> std::result::Result<u64, Self::Error> {
        Ok(0)
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> std::result::Result<(), Self::Error> {
        dst.fill(0);
        Ok(())
    }
}

/// What a plugin instance's `blob-store` import is bound to.
pub(crate) struct BlobStoreBinding {
    pub(crate) grant: Option<BlobStoreGrant>,
    /// The plugin's full content hash, named in the refusal.
    pub(crate) plugin_hash: Arc<str>,
}

impl BlobStoreBinding {
    fn backend(&self) -> std::result::Result<&Arc<dyn ArchiveBackend>, BackendError> {
        match &self.grant {
            Some(grant) => Ok(&grant.backend),
            None => Err(BackendError::Permanent(format!(
                "not granted: no [[grant]] with a blob_store for this plugin's sha256 {}",
                self.plugin_hash
            ))),
        }
    }
}

fn check_key(key: &str) -> std::result::Result<(), BackendError> {
    if key.is_empty() || key.len() > BLOB_KEY_BYTES_MAX {
        return Err(BackendError::Permanent(format!("invalid key: must be 1 to {BLOB_KEY_BYTES_MAX} bytes")));
    }
    Ok(())
}

/// The one place that turns the engine's storage errors into the contract's.
fn to_backend_error(e: Error) -> BackendError {
    match e.kind() {
        ErrorKind::Unavailable => BackendError::Transient(e.to_string()),
        _ => BackendError::Permanent(e.to_string()),
    }
}

impl blob_store_iface::Host for super::PluginState {
    fn put(&mut self, key: String, bytes: Vec<u8>) -> std::result::Result<(), BackendError> {
        let backend = self.blob_store.backend()?;
        check_key(&key)?;
        match crate::storage::block_on(backend.put_create(&key, Bytes::from(bytes))) {
            Ok(PutOutcome::Created) => Ok(()),
            Ok(PutOutcome::AlreadyExists) => Err(BackendError::AlreadyExists),
            Err(e) => Err(to_backend_error(e)),
        }
    }

    fn get(&mut self, key: String) -> std::result::Result<Vec<u8>, BackendError> {
        let backend = self.blob_store.backend()?;
        check_key(&key)?;
        match crate::storage::block_on(backend.get(&key)) {
            Ok(Some(bytes)) => Ok(bytes.to_vec()),
            Ok(None) => Err(BackendError::NotFound),
            Err(e) => Err(to_backend_error(e)),
        }
    }

    fn delete(&mut self, key: String) -> std::result::Result<(), BackendError> {
        let backend = self.blob_store.backend()?;
        check_key(&key)?;
        crate::storage::block_on(backend.delete(&key)).map_err(to_backend_error)
    }

    fn list(
        &mut self,
        prefix: String,
        after: Option<String>,
        limit: u32,
    ) -> std::result::Result<Vec<String>, BackendError> {
        let backend = self.blob_store.backend()?;
        let objects = crate::storage::block_on(backend.list(&prefix)).map_err(to_backend_error)?;
        // `list` returns every object under the prefix in ascending order.
        Ok(objects
            .into_iter()
            .map(|o| o.key)
            .filter(|k| k.starts_with(&prefix) && after.as_ref().is_none_or(|a| k > a))
            .take(limit as usize)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_names_every_grant() {
        assert_eq!(Capabilities::none().describe(), "nothing");
        let caps = Capabilities {
            preopens: vec![Preopen { host: "/srv/a".into(), guest: "/data".into(), mode: PreopenMode::Ro }],
            blob_store: None,
            http: None,
        };
        assert_eq!(caps.describe(), "preopen /srv/a -> /data (ro)");
        let http = HttpGrant {
            origins: vec![super::super::http::HttpOrigin::parse("http://127.0.0.1:9000").unwrap()],
            body_bytes_max: 2 * 1024 * 1024,
        };
        let caps = Capabilities { http: Some(Arc::new(http)), ..Capabilities::none() };
        assert_eq!(caps.describe(), "http to http://127.0.0.1:9000 (bodies up to 2 MiB)");
    }

    #[test]
    fn storage_errors_map_to_transient_or_permanent() {
        assert!(matches!(to_backend_error(Error::StorageUnavailable("x".into())), BackendError::Transient(_)));
        assert!(matches!(to_backend_error(Error::Storage("x".into())), BackendError::Permanent(_)));
        assert!(matches!(to_backend_error(Error::InvalidInput("x".into())), BackendError::Permanent(_)));
    }
}

//! The probe of an archive target: before a target holds an archive, check under a private
//! prefix (`.frostline-probe/<nonce>/`) the semantics the archival protocol relies on.
//!
//! Checks, in order (each named in a refusal):
//!
//! - `create-if-absent`: a create of a fresh key succeeds;
//! - `read-after-write`: reading it right away returns exactly the bytes written;
//! - `create-only`: a second create of the same key reports AlreadyExists and leaves the first
//!   bytes (a store that silently overwrites on a conditional create fails here);
//! - `staged-create-only`: the same two checks through the path large segments take (a
//!   multipart upload to a temporary key, then a conditional copy);
//! - `list`: listing the probe prefix returns both objects with their sizes;
//! - `delete`: deleted objects read as absent and are no longer listed.
//!
//! Besides passing, a probe learns whether the store keeps what it deletes (`ProbeFindings`):
//! on an S3 bucket with versioning on, a delete only hides the object behind a marker and its
//! bytes stay readable by version id. frostline cannot delete versions through the object
//! store client, so such a target is accepted and flagged (a warning at load, `status`, the API
//! and every erasure receipt): what expiry and erasure delete there stays as noncurrent versions
//! until the bucket's lifecycle rule removes them (policies/README.md, "Versioned buckets").
//!
//! A store that answers but breaks a check is refused (policy loading fails, at start and on
//! reload, naming the target and the check). A store that cannot be reached (an outage, not a
//! wrong answer) is accepted but gated: `GatedBackend` refuses uploads to it, which defers
//! archival, and probes again with backoff until it passes. Reads are never gated.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{ArchiveBackend, ObjectInfo, PutOutcome, keys};
use crate::error::{Error, ErrorKind, Result};

/// First wait before an unreachable target is probed again; doubles to the maximum.
pub const PROBE_BACKOFF_MS_MIN: u64 = 1_000;
pub const PROBE_BACKOFF_MS_MAX: u64 = 60_000;
/// Size of each probe object.
pub const PROBE_OBJECT_BYTES: usize = 64;

/// One check of the probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    CreateIfAbsent,
    ReadAfterWrite,
    CreateOnly,
    StagedCreateOnly,
    List,
    Delete,
}

impl Check {
    pub fn name(self) -> &'static str {
        match self {
            Check::CreateIfAbsent => "create-if-absent",
            Check::ReadAfterWrite => "read-after-write",
            Check::CreateOnly => "create-only",
            Check::StagedCreateOnly => "staged-create-only",
            Check::List => "list",
            Check::Delete => "delete",
        }
    }
}

/// Why a probe did not pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeFailure {
    /// The check that failed (`Check::name`).
    pub check: String,
    pub reason: String,
    /// The store could not be reached (an outage): nothing was learned about its semantics.
    pub unreachable: bool,
}

impl std::fmt::Display for ProbeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.unreachable { "could not be completed (unreachable)" } else { "failed" };
        write!(f, "check `{}` {what}: {}", self.check, self.reason)
    }
}

/// What a passed probe learned of a target that an operator must know.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeFindings {
    /// A deleted object still reads by its version id (S3 versioning): deleted archives stay
    /// as noncurrent versions until a lifecycle rule removes them.
    pub keeps_deleted_versions: bool,
}

fn broken(check: Check, reason: impl Into<String>) -> ProbeFailure {
    ProbeFailure { check: check.name().into(), reason: reason.into(), unreachable: false }
}

fn failed_call(check: Check, error: Error) -> ProbeFailure {
    ProbeFailure {
        check: check.name().into(),
        reason: error.to_string(),
        unreachable: error.kind() == ErrorKind::Unavailable,
    }
}

fn payload(label: &str) -> Bytes {
    let mut bytes = format!("frostline probe {label} {:032x}\n", rand::random::<u128>()).into_bytes();
    bytes.resize(PROBE_OBJECT_BYTES, b'.');
    Bytes::from(bytes)
}

/// Runs every check against `backend` under a fresh probe prefix, and removes what it wrote.
pub async fn probe(backend: &dyn ArchiveBackend) -> std::result::Result<ProbeFindings, ProbeFailure> {
    let prefix = keys::probe_prefix(rand::random());
    let plain = keys::probe_key(&prefix, "create");
    let staged = keys::probe_key(&prefix, "staged");
    let result = run_checks(backend, &prefix, &plain, &staged).await;
    if result.is_err() {
        for key in [&plain, &staged] {
            // Best effort; a leftover is a scratch object the orphan sweep clears.
            let _ = backend.delete(key).await;
        }
    }
    result
}

async fn run_checks(
    backend: &dyn ArchiveBackend,
    prefix: &str,
    plain: &str,
    staged: &str,
) -> std::result::Result<ProbeFindings, ProbeFailure> {
    let (first, second) = (payload("first"), payload("second"));

    match backend.put_create(plain, first.clone()).await.map_err(|e| failed_call(Check::CreateIfAbsent, e))? {
        PutOutcome::Created => {}
        PutOutcome::AlreadyExists => {
            return Err(broken(
                Check::CreateIfAbsent,
                format!("a create of the fresh key `{plain}` reported AlreadyExists"),
            ));
        }
    }
    read_back(backend, Check::ReadAfterWrite, plain, &first, "the object just created").await?;

    match backend.put_create(plain, second.clone()).await.map_err(|e| failed_call(Check::CreateOnly, e))? {
        PutOutcome::AlreadyExists => {}
        PutOutcome::Created => {
            return Err(broken(
                Check::CreateOnly,
                format!(
                    "a second create of `{plain}` reported Created: the store overwrites on a conditional create, \
                     so it cannot guarantee that an archived object is never replaced"
                ),
            ));
        }
    }
    read_back(backend, Check::CreateOnly, plain, &first, "after a refused second create, the object").await?;

    match backend.put_create_staged(staged, first.clone()).await.map_err(|e| failed_call(Check::StagedCreateOnly, e))? {
        PutOutcome::Created => {}
        PutOutcome::AlreadyExists => {
            return Err(broken(
                Check::StagedCreateOnly,
                format!("a staged create of the fresh key `{staged}` reported AlreadyExists"),
            ));
        }
    }
    read_back(backend, Check::StagedCreateOnly, staged, &first, "the object just created through a staged upload")
        .await?;
    match backend.put_create_staged(staged, second).await.map_err(|e| failed_call(Check::StagedCreateOnly, e))? {
        PutOutcome::AlreadyExists => {}
        PutOutcome::Created => {
            return Err(broken(
                Check::StagedCreateOnly,
                format!(
                    "a second staged create (multipart upload, then copy-if-not-exists) of `{staged}` reported \
                     Created: the store's conditional copy overwrites"
                ),
            ));
        }
    }
    read_back(backend, Check::StagedCreateOnly, staged, &first, "after a refused second staged create, the object")
        .await?;

    let listed = backend.list(prefix).await.map_err(|e| failed_call(Check::List, e))?;
    for key in [plain, staged] {
        match listed.iter().find(|o| o.key == key) {
            Some(o) if o.size == first.len() as u64 => {}
            Some(o) => {
                return Err(broken(
                    Check::List,
                    format!("`{key}` is listed with {} bytes, not the {} stored", o.size, first.len()),
                ));
            }
            None => {
                let found: Vec<&str> = listed.iter().map(|o| o.key.as_str()).collect();
                return Err(broken(Check::List, format!("listing `{prefix}` misses `{key}` (found {found:?})")));
            }
        }
    }

    let version = current_version(backend, plain).await;
    for key in [plain, staged] {
        backend.delete(key).await.map_err(|e| failed_call(Check::Delete, e))?;
        if backend.get(key).await.map_err(|e| failed_call(Check::Delete, e))?.is_some() {
            return Err(broken(Check::Delete, format!("`{key}` still reads after its delete")));
        }
    }
    let left = backend.list(prefix).await.map_err(|e| failed_call(Check::Delete, e))?;
    if !left.is_empty() {
        let keys: Vec<&str> = left.iter().map(|o| o.key.as_str()).collect();
        return Err(broken(Check::Delete, format!("deleted objects are still listed: {keys:?}")));
    }
    let keeps_deleted_versions = match version {
        Some(version) => reads_by_version(backend, plain, &version).await.is_some_and(|bytes| bytes == first),
        None => false,
    };
    Ok(ProbeFindings { keeps_deleted_versions })
}

/// The version id the store gives `key`'s current object, if it versions objects (S3's
/// `x-amz-version-id`; `null` is the id of an object written while versioning was off or
/// suspended, which a delete removes).
async fn current_version(backend: &dyn ArchiveBackend, key: &str) -> Option<String> {
    let store = backend.object_store()?;
    use object_store::ObjectStoreExt as _;
    let meta = store.head(&super::object_path(key).ok()?).await.ok()?;
    meta.version.filter(|v| v != "null")
}

/// The bytes of one version of `key`, if the store still serves it.
async fn reads_by_version(backend: &dyn ArchiveBackend, key: &str, version: &str) -> Option<Bytes> {
    let store = backend.object_store()?;
    let options = object_store::GetOptions { version: Some(version.to_string()), ..Default::default() };
    store.get_opts(&super::object_path(key).ok()?, options).await.ok()?.bytes().await.ok()
}

async fn read_back(
    backend: &dyn ArchiveBackend,
    check: Check,
    key: &str,
    expected: &Bytes,
    what: &str,
) -> std::result::Result<(), ProbeFailure> {
    match backend.get(key).await.map_err(|e| failed_call(check, e))? {
        Some(bytes) if bytes == expected => Ok(()),
        Some(bytes) => Err(broken(
            check,
            format!("{what} `{key}` reads {} bytes that differ from the {} first written", bytes.len(), expected.len()),
        )),
        None => Err(broken(check, format!("{what} `{key}` reads as absent"))),
    }
}

/// Probes every backend concurrently and waits for all, from synchronous code (policy loading
/// runs on a plain or a blocking thread). Remote stores do their I/O on the storage runtime,
/// so the short-lived runtime used here only awaits.
pub fn probe_all_blocking(backends: &[Arc<dyn ArchiveBackend>]) -> Result<Vec<ProbeOutcome>> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<Vec<ProbeOutcome>> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| Error::Internal(format!("cannot start a runtime for the target probes: {e}")))?;
                Ok(runtime.block_on(futures::future::join_all(backends.iter().map(|b| ProbeOutcome::of(b.as_ref())))))
            })
            .join()
            .map_err(|_| Error::Internal("the target probe thread panicked".into()))?
    })
}

/// One probe run's result and duration.
#[derive(Debug, Clone)]
pub struct ProbeOutcome {
    pub result: std::result::Result<ProbeFindings, ProbeFailure>,
    pub elapsed_ms: u64,
}

impl ProbeOutcome {
    pub async fn of(backend: &dyn ArchiveBackend) -> ProbeOutcome {
        let started = Instant::now();
        let result = probe(backend).await;
        ProbeOutcome { result, elapsed_ms: started.elapsed().as_millis() as u64 }
    }
}

/// What `frostline status` shows of a target: never a secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetReport {
    pub name: String,
    pub url: String,
    pub endpoint: Option<String>,
    /// `ok`, `unreachable` (accepted; uploads wait until a probe passes) or `failed`.
    pub probe: String,
    pub check: Option<String>,
    pub reason: Option<String>,
    pub attempts: u32,
    pub last_probe_ms: u64,
    pub seconds_since_probe: u64,
    /// The store keeps deleted objects as noncurrent versions (`ProbeFindings`).
    #[serde(default)]
    pub keeps_deleted_versions: bool,
}

#[derive(Debug)]
struct ProbeState {
    result: std::result::Result<ProbeFindings, ProbeFailure>,
    attempts: u32,
    elapsed_ms: u64,
    at: Instant,
}

/// A target's probe result, shared by its gate and the status.
#[derive(Debug)]
pub struct TargetProbe {
    pub name: String,
    pub url: String,
    pub endpoint: Option<String>,
    state: Mutex<ProbeState>,
    /// One re-probe at a time.
    retry: tokio::sync::Mutex<()>,
}

impl TargetProbe {
    pub fn new(name: &str, url: &str, endpoint: Option<String>, outcome: ProbeOutcome) -> Arc<TargetProbe> {
        Arc::new(TargetProbe {
            name: name.to_string(),
            url: url.to_string(),
            endpoint,
            state: Mutex::new(ProbeState {
                result: outcome.result,
                attempts: 1,
                elapsed_ms: outcome.elapsed_ms,
                at: Instant::now(),
            }),
            retry: tokio::sync::Mutex::new(()),
        })
    }

    pub fn passed(&self) -> bool {
        self.state.lock().expect("probe state").result.is_ok()
    }

    /// Whether the last probe that passed found deleted objects kept as versions.
    pub fn keeps_deleted_versions(&self) -> bool {
        self.state.lock().expect("probe state").result.as_ref().is_ok_and(|f| f.keeps_deleted_versions)
    }

    pub fn failure(&self) -> Option<ProbeFailure> {
        self.state.lock().expect("probe state").result.clone().err()
    }

    pub fn report(&self) -> TargetReport {
        let state = self.state.lock().expect("probe state");
        let (probe, check, reason) = match &state.result {
            Ok(_) => ("ok", None, None),
            Err(f) => {
                (if f.unreachable { "unreachable" } else { "failed" }, Some(f.check.clone()), Some(f.reason.clone()))
            }
        };
        TargetReport {
            name: self.name.clone(),
            url: self.url.clone(),
            endpoint: self.endpoint.clone(),
            probe: probe.into(),
            check,
            reason,
            attempts: state.attempts,
            last_probe_ms: state.elapsed_ms,
            seconds_since_probe: state.at.elapsed().as_secs(),
            keeps_deleted_versions: state.result.as_ref().is_ok_and(|f| f.keeps_deleted_versions),
        }
    }

    fn backoff(attempts: u32) -> Duration {
        let shift = attempts.saturating_sub(1).min(16);
        Duration::from_millis(PROBE_BACKOFF_MS_MIN.saturating_mul(1 << shift).min(PROBE_BACKOFF_MS_MAX))
    }

    fn closed(&self) -> Error {
        let failure = self.failure().map(|f| f.to_string()).unwrap_or_default();
        Error::StorageUnavailable(format!(
            "target `{}` ({}) has not passed its probe ({failure}); uploads to it wait until it does",
            self.name, self.url
        ))
    }

    /// Ok once the target has passed a probe; otherwise probes `backend` again when the
    /// backoff allows, and refuses while it fails.
    async fn open(&self, backend: &dyn ArchiveBackend) -> Result<()> {
        if self.passed() {
            return Ok(());
        }
        let _one_at_a_time = self.retry.lock().await;
        let waiting = {
            let state = self.state.lock().expect("probe state");
            if state.result.is_ok() {
                return Ok(());
            }
            state.at.elapsed() < Self::backoff(state.attempts)
        };
        if waiting {
            return Err(self.closed());
        }
        let outcome = ProbeOutcome::of(backend).await;
        {
            let mut state = self.state.lock().expect("probe state");
            state.attempts += 1;
            state.elapsed_ms = outcome.elapsed_ms;
            state.at = Instant::now();
            state.result = outcome.result;
            match &state.result {
                Ok(_) => tracing::info!(target = %self.name, attempts = state.attempts, "target passed its probe"),
                Err(f) => tracing::warn!(target = %self.name, failure = %f, "target still fails its probe"),
            }
        }
        if self.passed() { Ok(()) } else { Err(self.closed()) }
    }
}

/// A backend whose uploads wait until its target has passed a probe. Reads, lists and deletes
/// pass through: they cannot break an archive, and queries of published archives must work.
#[derive(Debug)]
pub struct GatedBackend {
    inner: Arc<dyn ArchiveBackend>,
    probe: Arc<TargetProbe>,
}

impl GatedBackend {
    pub fn new(inner: Arc<dyn ArchiveBackend>, probe: Arc<TargetProbe>) -> Arc<GatedBackend> {
        Arc::new(GatedBackend { inner, probe })
    }

    pub fn probe(&self) -> &Arc<TargetProbe> {
        &self.probe
    }
}

#[async_trait]
impl ArchiveBackend for GatedBackend {
    fn target(&self) -> &str {
        self.inner.target()
    }

    fn object_store(&self) -> Option<Arc<dyn object_store::ObjectStore>> {
        self.inner.object_store()
    }

    fn local_dir(&self) -> Option<std::path::PathBuf> {
        self.inner.local_dir()
    }

    fn keeps_deleted_versions(&self) -> bool {
        self.probe.keeps_deleted_versions()
    }

    async fn put_create(&self, key: &str, bytes: Bytes) -> Result<PutOutcome> {
        self.probe.open(self.inner.as_ref()).await?;
        self.inner.put_create(key, bytes).await
    }

    async fn put_create_staged(&self, key: &str, bytes: Bytes) -> Result<PutOutcome> {
        self.probe.open(self.inner.as_ref()).await?;
        self.inner.put_create_staged(key, bytes).await
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        self.inner.get(key).await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.inner.list(prefix).await
    }

    fn list_stream<'a>(&'a self, prefix: &'a str) -> futures::stream::BoxStream<'a, Result<ObjectInfo>> {
        self.inner.list_stream(prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::ObjectStoreBackend;
    use crate::storage::faults::{CreateIgnored, Fault, FaultyBackend, Op};

    fn memory() -> Arc<dyn ArchiveBackend> {
        Arc::new(ObjectStoreBackend::from_url("memory://").unwrap())
    }

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    }

    #[test]
    fn a_conforming_store_passes_and_is_left_clean() {
        let backend = memory();
        run(probe(backend.as_ref())).unwrap();
        assert!(run(backend.list("")).unwrap().is_empty());
        let dir = tempfile::tempdir().unwrap();
        let local: Arc<dyn ArchiveBackend> =
            Arc::new(ObjectStoreBackend::from_url(&format!("file://{}", dir.path().display())).unwrap());
        run(probe(local.as_ref())).unwrap();
        assert!(run(local.list("")).unwrap().is_empty());
    }

    #[test]
    fn a_store_that_overwrites_on_create_is_refused_at_the_create_only_check() {
        for (liar, check) in [
            (CreateIgnored::overwriting(memory()), Check::CreateOnly),
            (CreateIgnored::overwriting_but_reporting_exists(memory()), Check::CreateOnly),
            (CreateIgnored::staged_only(memory()), Check::StagedCreateOnly),
        ] {
            let failure = run(probe(liar.as_ref())).unwrap_err();
            assert_eq!(failure.check, check.name(), "{failure}");
            assert!(!failure.unreachable);
            assert!(run(liar.list("")).unwrap().is_empty(), "the probe cleans up after a failure");
        }
    }

    #[test]
    fn an_outage_is_unreachable_and_a_wrong_read_is_a_failure() {
        let faulty = FaultyBackend::new(memory());
        faulty.add(Op::Put, "", Fault::Error, Some(1));
        let failure = run(probe(faulty.as_ref())).unwrap_err();
        assert_eq!((failure.check.as_str(), failure.unreachable), ("create-if-absent", true));
        faulty.add(Op::Get, "", Fault::CorruptRead, Some(1));
        let failure = run(probe(faulty.as_ref())).unwrap_err();
        assert_eq!((failure.check.as_str(), failure.unreachable), ("read-after-write", false));
        faulty.add(Op::List, "", Fault::Error, Some(1));
        assert_eq!(run(probe(faulty.as_ref())).unwrap_err().check, "list");
        run(probe(faulty.as_ref())).unwrap();
    }

    #[test]
    fn the_gate_holds_uploads_until_a_probe_passes() {
        let faulty = FaultyBackend::new(memory());
        faulty.add(Op::Put, "", Fault::Error, Some(1));
        let outcome = run(ProbeOutcome::of(faulty.as_ref()));
        let probe = TargetProbe::new("t", "memory://", None, outcome);
        assert_eq!(probe.report().probe, "unreachable");
        let gated = GatedBackend::new(faulty.clone(), probe.clone());
        // Within the backoff, uploads are refused without asking the store.
        let err = run(gated.put_create("k", Bytes::from_static(b"x"))).unwrap_err();
        assert!(err.to_string().contains("has not passed its probe") && err.is_retryable(), "{err}");
        assert_eq!(run(gated.get("k")).unwrap(), None, "reads pass through");
        std::thread::sleep(Duration::from_millis(PROBE_BACKOFF_MS_MIN + 50));
        assert_eq!(run(gated.put_create("k", Bytes::from_static(b"x"))).unwrap(), PutOutcome::Created);
        let report = probe.report();
        assert_eq!((report.probe.as_str(), report.attempts), ("ok", 2));
    }

    #[test]
    fn backoff_doubles_to_its_bound() {
        assert_eq!(TargetProbe::backoff(1), Duration::from_millis(PROBE_BACKOFF_MS_MIN));
        assert_eq!(TargetProbe::backoff(2), Duration::from_millis(2 * PROBE_BACKOFF_MS_MIN));
        assert_eq!(TargetProbe::backoff(40), Duration::from_millis(PROBE_BACKOFF_MS_MAX));
    }
}

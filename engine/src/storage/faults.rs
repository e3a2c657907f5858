//! A fault-injecting `ArchiveBackend` decorator for tests: errors, latency, corrupted reads, a
//! write that lands but reports failure (a lost acknowledgement), and a write that does not
//! land at all. Rules match an operation and a key substring and fire a bounded number of times.
//!
//! `CreateIgnored` is a lying store: it ignores the create-only mode, as some S3-compatible
//! servers do, so tests can show that the probe refuses such a store.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::{ArchiveBackend, ObjectInfo, PutOutcome};
use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Put,
    Get,
    Delete,
    List,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Fail without doing anything.
    Error,
    /// Do the operation, then report failure (a lost acknowledgement).
    LandThenError,
    /// Return bytes with one bit flipped (reads only).
    CorruptRead,
    /// Wait, then do the operation.
    Delay(Duration),
    /// The operation takes this long on the injected clock (`FaultyBackend::set_clock`): the
    /// clock advances, then the operation runs. Leases expire and heartbeats fall due in the
    /// middle of a step, deterministically.
    Stall(crate::model::Micros),
}

#[derive(Debug, Clone)]
pub struct FaultRule {
    pub op: Op,
    /// The rule applies to keys containing this text ("" matches every key).
    pub key_contains: String,
    pub fault: Fault,
    /// How many more times it fires; `None` is forever.
    pub remaining: Option<u32>,
}

#[derive(Debug)]
pub struct FaultyBackend {
    inner: Arc<dyn ArchiveBackend>,
    rules: Mutex<Vec<FaultRule>>,
    fired: Mutex<Vec<(Op, String, Fault)>>,
    reads: Mutex<Vec<String>>,
    clock: Mutex<Option<Arc<crate::clock::ManualClock>>>,
    /// Uploads under way now, and the most there ever were at once.
    puts_in_flight: std::sync::atomic::AtomicUsize,
    puts_in_flight_max: std::sync::atomic::AtomicUsize,
}

impl FaultyBackend {
    pub fn new(inner: Arc<dyn ArchiveBackend>) -> Arc<Self> {
        Arc::new(FaultyBackend {
            inner,
            rules: Mutex::new(Vec::new()),
            fired: Mutex::new(Vec::new()),
            reads: Mutex::new(Vec::new()),
            clock: Mutex::new(None),
            puts_in_flight: Default::default(),
            puts_in_flight_max: Default::default(),
        })
    }

    /// The most uploads that were ever under way at once (to observe concurrency).
    pub fn puts_in_flight_max(&self) -> usize {
        self.puts_in_flight_max.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The clock that `Fault::Stall` advances.
    pub fn set_clock(&self, clock: Arc<crate::clock::ManualClock>) {
        *self.clock.lock().expect("clock") = Some(clock);
    }

    fn stall(&self, by: crate::model::Micros) {
        if let Some(clock) = self.clock.lock().expect("clock").as_ref() {
            clock.advance(by);
        }
    }

    pub fn add(&self, op: Op, key_contains: &str, fault: Fault, times: Option<u32>) {
        self.rules.lock().expect("rules").push(FaultRule {
            op,
            key_contains: key_contains.to_string(),
            fault,
            remaining: times,
        });
    }

    pub fn clear(&self) {
        self.rules.lock().expect("rules").clear();
    }

    /// Every key read with `get`, in order (to observe what a read path touches).
    pub fn reads(&self) -> Vec<String> {
        self.reads.lock().expect("reads").clone()
    }

    /// Every fault that fired, in order.
    pub fn fired(&self) -> Vec<(Op, String, Fault)> {
        self.fired.lock().expect("fired").clone()
    }

    fn take(&self, op: Op, key: &str) -> Option<Fault> {
        let mut rules = self.rules.lock().expect("rules");
        let index = rules.iter().position(|r| r.op == op && key.contains(&r.key_contains) && r.remaining != Some(0))?;
        let rule = &mut rules[index];
        if let Some(n) = rule.remaining.as_mut() {
            *n -= 1;
        }
        let fault = rule.fault.clone();
        self.fired.lock().expect("fired").push((op, key.to_string(), fault.clone()));
        Some(fault)
    }

    fn injected(op: Op, key: &str) -> Error {
        Error::StorageUnavailable(format!("injected fault: {op:?} `{key}`"))
    }

    async fn inner_put(&self, key: &str, bytes: Bytes, staged: bool) -> Result<PutOutcome> {
        if staged { self.inner.put_create_staged(key, bytes).await } else { self.inner.put_create(key, bytes).await }
    }

    async fn put_with_faults(&self, key: &str, bytes: Bytes, staged: bool) -> Result<PutOutcome> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.puts_in_flight.fetch_add(1, SeqCst) + 1;
        self.puts_in_flight_max.fetch_max(now, SeqCst);
        let outcome = self.put_with_faults_counted(key, bytes, staged).await;
        self.puts_in_flight.fetch_sub(1, SeqCst);
        outcome
    }

    async fn put_with_faults_counted(&self, key: &str, bytes: Bytes, staged: bool) -> Result<PutOutcome> {
        match self.take(Op::Put, key) {
            Some(Fault::Error) => Err(Self::injected(Op::Put, key)),
            Some(Fault::LandThenError) => {
                self.inner_put(key, bytes, staged).await?;
                Err(Self::injected(Op::Put, key))
            }
            Some(Fault::Delay(d)) => {
                tokio::time::sleep(d).await;
                self.inner_put(key, bytes, staged).await
            }
            Some(Fault::Stall(by)) => {
                self.stall(by);
                self.inner_put(key, bytes, staged).await
            }
            _ => self.inner_put(key, bytes, staged).await,
        }
    }
}

/// How a `CreateIgnored` store lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lie {
    /// Every create overwrites and reports Created (s3rver, Garage).
    Overwrite,
    /// Every create overwrites but reports AlreadyExists when something was there.
    OverwriteReportingExists,
    /// Plain creates are honoured; staged creates (the conditional copy) overwrite.
    StagedOverwrite,
}

/// A store that ignores the create-only mode: what the probe must refuse.
#[derive(Debug)]
pub struct CreateIgnored {
    inner: Arc<dyn ArchiveBackend>,
    lie: Lie,
}

impl CreateIgnored {
    pub fn overwriting(inner: Arc<dyn ArchiveBackend>) -> Arc<Self> {
        Arc::new(CreateIgnored { inner, lie: Lie::Overwrite })
    }

    pub fn overwriting_but_reporting_exists(inner: Arc<dyn ArchiveBackend>) -> Arc<Self> {
        Arc::new(CreateIgnored { inner, lie: Lie::OverwriteReportingExists })
    }

    pub fn staged_only(inner: Arc<dyn ArchiveBackend>) -> Arc<Self> {
        Arc::new(CreateIgnored { inner, lie: Lie::StagedOverwrite })
    }

    async fn overwrite(&self, key: &str, bytes: Bytes) -> Result<PutOutcome> {
        let existed = self.inner.get(key).await?.is_some();
        self.inner.delete(key).await?;
        self.inner.put_create(key, bytes).await?;
        Ok(if existed && self.lie == Lie::OverwriteReportingExists {
            PutOutcome::AlreadyExists
        } else {
            PutOutcome::Created
        })
    }
}

#[async_trait]
impl ArchiveBackend for CreateIgnored {
    fn target(&self) -> &str {
        self.inner.target()
    }

    async fn put_create(&self, key: &str, bytes: Bytes) -> Result<PutOutcome> {
        match self.lie {
            Lie::StagedOverwrite => self.inner.put_create(key, bytes).await,
            Lie::Overwrite | Lie::OverwriteReportingExists => self.overwrite(key, bytes).await,
        }
    }

    async fn put_create_staged(&self, key: &str, bytes: Bytes) -> Result<PutOutcome> {
        self.overwrite(key, bytes).await
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
}

#[async_trait]
impl ArchiveBackend for FaultyBackend {
    fn target(&self) -> &str {
        self.inner.target()
    }

    fn object_store(&self) -> Option<Arc<dyn object_store::ObjectStore>> {
        self.inner.object_store()
    }

    fn local_dir(&self) -> Option<std::path::PathBuf> {
        self.inner.local_dir()
    }

    async fn put_create(&self, key: &str, bytes: Bytes) -> Result<PutOutcome> {
        self.put_with_faults(key, bytes, false).await
    }

    async fn put_create_staged(&self, key: &str, bytes: Bytes) -> Result<PutOutcome> {
        self.put_with_faults(key, bytes, true).await
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        self.reads.lock().expect("reads").push(key.to_string());
        match self.take(Op::Get, key) {
            Some(Fault::Error) | Some(Fault::LandThenError) => Err(Self::injected(Op::Get, key)),
            Some(Fault::CorruptRead) => Ok(self.inner.get(key).await?.map(|b| {
                let mut v = b.to_vec();
                if let Some(first) = v.first_mut() {
                    *first ^= 0x01;
                } else {
                    v.push(b'!');
                }
                Bytes::from(v)
            })),
            Some(Fault::Delay(d)) => {
                tokio::time::sleep(d).await;
                self.inner.get(key).await
            }
            Some(Fault::Stall(by)) => {
                self.stall(by);
                self.inner.get(key).await
            }
            None => self.inner.get(key).await,
        }
    }

    async fn delete(&self, key: &str) -> Result<()> {
        match self.take(Op::Delete, key) {
            Some(Fault::Error) => Err(Self::injected(Op::Delete, key)),
            Some(Fault::LandThenError) => {
                self.inner.delete(key).await?;
                Err(Self::injected(Op::Delete, key))
            }
            Some(Fault::Stall(by)) => {
                self.stall(by);
                self.inner.delete(key).await
            }
            _ => self.inner.delete(key).await,
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        match self.take(Op::List, prefix) {
            Some(Fault::Error) => Err(Self::injected(Op::List, prefix)),
            _ => self.inner.list(prefix).await,
        }
    }
}

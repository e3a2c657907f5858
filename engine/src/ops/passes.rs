//! Archival passes inside the running engine ("archive now" and the periodic loop): they take
//! turns through one lock (never two passes of one worker at once), and every report goes to
//! one observer (the API's metrics).
//!
//! They run on a runtime of their own (`background_runtime`) whose threads run
//! `ARCHIVE_THREAD_NICE` below the rest of the process: on a host whose cores are busy,
//! appends and queries get the CPU first, and an idle host still gives the pass every core.

use std::sync::Arc;

use crate::archive::run_pass;
pub use crate::archive::{DeferralReason, PassErrorKind, PassReport};
use crate::engine::Engine;
use crate::error::Result;

/// How many steps of Unix nice the archival threads run below the rest of the process.
/// A thread holding redb's single writer (a cleanup slice, a publish) must still get CPU
/// while appends wait for that writer, so the step is moderate: at nice 10 the scheduler gives
/// a busy archival thread about a tenth of a core next to one busy thread at nice 0 (19 would
/// give it about 1.5%), so a 20 ms slice takes about 0.2 s at worst.
pub const ARCHIVE_THREAD_NICE: i32 = 10;

/// The runtime the running engine's passes run on: `threads` worker threads and a blocking
/// pool of its own, every thread `ARCHIVE_THREAD_NICE` steps nicer than the process.
pub fn background_runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("frostline-archive")
        .enable_all()
        .on_thread_start(lower_this_threads_priority)
        .build()
}

/// Raises this thread's nice value by `ARCHIVE_THREAD_NICE` (Linux sets nice per thread).
/// Raising needs no privilege; if it fails the thread runs at the process's priority.
fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and getpriority/setpriority on this thread's own id read and change
        // only this thread's scheduling priority. getpriority can return -1 as a value, so
        // errno is cleared first and checked after.
        unsafe {
            let tid = libc::gettid() as libc::id_t;
            *libc::__errno_location() = 0;
            let current = libc::getpriority(libc::PRIO_PROCESS, tid);
            if current == -1 && *libc::__errno_location() != 0 {
                return;
            }
            let nicer = (current + ARCHIVE_THREAD_NICE).min(19);
            if libc::setpriority(libc::PRIO_PROCESS, tid, nicer) != 0 {
                tracing::debug!(nice = nicer, "cannot lower an archival thread's priority; it runs at the process's");
            }
        }
    }
}

/// Passes one `archive --once` runs at most.
pub const PASSES_UNTIL_IDLE_MAX: usize = 1_000;

/// One `archive --once`: passes until nothing more is claimable right now (a pass looks at
/// most `scan_limit` buckets, and planning can make more due), bounded so it always ends.
/// Stops early, between passes, when `stopping` fires. `observe` sees every pass's report.
pub async fn run_until_idle(
    engine: &Arc<Engine>,
    owner: &str,
    stopping: Option<&tokio::sync::watch::Receiver<bool>>,
    observe: &(dyn Fn(&Result<PassReport>) + Sync),
) -> Result<PassReport> {
    let mut total = PassReport::default();
    for _ in 0..PASSES_UNTIL_IDLE_MAX {
        if stopping.is_some_and(|s| *s.borrow()) {
            break;
        }
        let result = run_pass(&engine.context(), owner).await;
        observe(&result);
        let r = result?;
        let progressed = r.made_progress();
        // Deferred buckets, and expiries waiting for a Delta log whose sync failed, are
        // retried later, not by another pass now.
        let deferred = r.deferred + r.expiries_awaiting_log > 0;
        total.add(r);
        if !progressed || deferred {
            break;
        }
    }
    Ok(total)
}

/// The running engine's passes, serialized and counted, run on `runtime` (the archival
/// runtime, or the caller's when `None`).
pub struct Passes {
    owner: String,
    lock: tokio::sync::Mutex<()>,
    observe: PassObserver,
    runtime: Option<tokio::runtime::Handle>,
}

/// Sees the outcome of every pass.
pub type PassObserver = Arc<dyn Fn(&Result<PassReport>) + Send + Sync>;

impl Passes {
    pub fn new(owner: String, observe: PassObserver, runtime: Option<tokio::runtime::Handle>) -> Passes {
        Passes { owner, lock: tokio::sync::Mutex::new(()), observe, runtime }
    }

    /// Runs `pass` on the archival runtime, or here without one.
    async fn on_runtime<F>(&self, pass: F) -> Result<PassReport>
    where
        F: std::future::Future<Output = Result<PassReport>> + Send + 'static,
    {
        match &self.runtime {
            Some(runtime) => runtime
                .spawn(pass)
                .await
                .map_err(|e| crate::error::Error::Internal(format!("the archival pass task failed: {e}")))?,
            None => pass.await,
        }
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// One pass (the periodic loop).
    pub async fn run_once(&self, engine: &Arc<Engine>) -> Result<PassReport> {
        let _turn = self.lock.lock().await;
        let (engine, owner) = (engine.clone(), self.owner.clone());
        let result = self.on_runtime(async move { run_pass(&engine.context(), &owner).await }).await;
        (self.observe)(&result);
        result
    }

    /// Passes until idle (`POST /v1/archive`, `frostline archive --once` against a running
    /// engine).
    pub async fn run_until_idle(
        &self,
        engine: &Arc<Engine>,
        stopping: &tokio::sync::watch::Receiver<bool>,
    ) -> Result<PassReport> {
        let _turn = self.lock.lock().await;
        let (engine, owner, stopping, observe) =
            (engine.clone(), self.owner.clone(), stopping.clone(), self.observe.clone());
        self.on_runtime(async move { run_until_idle(&engine, &owner, Some(&stopping), &|r| observe(r)).await }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    fn this_threads_nice() -> i32 {
        // SAFETY: reads this thread's priority only.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    /// Every thread of the archival runtime, workers and blocking pool alike, runs
    /// `ARCHIVE_THREAD_NICE` below the thread that made it (or at 19).
    #[cfg(target_os = "linux")]
    #[test]
    fn archival_threads_run_below_the_rest_of_the_process() {
        let here = this_threads_nice();
        let runtime = background_runtime(2).unwrap();
        let (worker, blocking) = runtime.block_on(async {
            let worker = tokio::spawn(async { this_threads_nice() }).await.unwrap();
            let blocking = tokio::task::spawn_blocking(this_threads_nice).await.unwrap();
            (worker, blocking)
        });
        let expected = (here + ARCHIVE_THREAD_NICE).min(19);
        assert_eq!((worker, blocking), (expected, expected), "the caller runs at nice {here}");
        assert_eq!(this_threads_nice(), here, "the caller's own priority is unchanged");
    }
}

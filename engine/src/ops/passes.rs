//! Archival passes inside the running engine ("archive now" and the periodic loop): they take
//! turns through one lock (never two passes of one worker at once), and every report goes to
//! one observer (the API's metrics).

use std::sync::Arc;

use crate::archive::{PassReport, run_pass};
use crate::engine::Engine;
use crate::error::Result;

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
        let result = run_pass(engine, owner).await;
        observe(&result);
        let r = result?;
        let progressed = r.made_progress();
        let deferred = r.deferred > 0;
        total.add(r);
        if !progressed || deferred {
            break;
        }
    }
    Ok(total)
}

/// The running engine's passes, serialized and counted.
pub struct Passes {
    owner: String,
    lock: tokio::sync::Mutex<()>,
    observe: PassObserver,
}

/// Sees the outcome of every pass.
pub type PassObserver = Box<dyn Fn(&Result<PassReport>) + Send + Sync>;

impl Passes {
    pub fn new(owner: String, observe: PassObserver) -> Passes {
        Passes { owner, lock: tokio::sync::Mutex::new(()), observe }
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// One pass (the periodic loop).
    pub async fn run_once(&self, engine: &Arc<Engine>) -> Result<PassReport> {
        let _turn = self.lock.lock().await;
        let result = run_pass(engine, &self.owner).await;
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
        run_until_idle(engine, &self.owner, Some(stopping), &|r| (self.observe)(r)).await
    }
}

//! The injected clock. Production code asks a `Clock`; tests drive a `ManualClock`.
//! This is the only module allowed to read the system time (see clippy.toml).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::model::Micros;

pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Micros;

    /// Waits `pause` of this clock's time: real time for the system clock, none for a manual
    /// one (its time moves only when told to). For waits whose length is a policy, such as a
    /// reload's stability pause, so a simulation does not spend real time on them.
    fn pause(&self, pause: std::time::Duration) {
        std::thread::sleep(pause);
    }
}

pub type SharedClock = Arc<dyn Clock>;

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)]
    fn now(&self) -> Micros {
        let since_epoch =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("the system clock is after 1970");
        since_epoch.as_micros() as Micros
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    pub fn new(now: Micros) -> Arc<Self> {
        Arc::new(ManualClock { now: AtomicI64::new(now) })
    }

    pub fn set(&self, now: Micros) {
        self.now.store(now, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Micros) {
        self.now.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.now.load(Ordering::SeqCst)
    }

    fn pause(&self, _pause: std::time::Duration) {}
}

//! One live instance of a loaded plugin, with its configuration, its fault handling and its
//! crash-loop breaker.
//!
//! A call runs under the plugin's epoch deadline and memory limit. A trap, a timeout or an
//! out-of-memory drops the instance (wasmtime refuses further calls into a trapped instance)
//! and is reported as a plugin fault naming the plugin, its hash, the call and the cause; the
//! next call instantiates afresh and calls `init` again. A plugin that keeps faulting is
//! suspended with exponential backoff so it cannot burn the host's CPU in a loop.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::{Capabilities, LoadedPlugin, PluginState};
use crate::error::{Error, Result};

/// Consecutive faults after which a plugin is suspended.
pub const PLUGIN_FAULTS_BEFORE_SUSPEND: u32 = 5;
pub const PLUGIN_SUSPEND_MS_MIN: u64 = 1_000;
pub const PLUGIN_SUSPEND_MS_MAX: u64 = 300_000;

/// What the generated bindings of each world provide to the instance wrapper.
pub(crate) trait WorldBindings: Sized + Send + 'static {
    fn instantiate(pre: &InstancePre<PluginState>, store: &mut Store<PluginState>) -> wasmtime::Result<Self>;
    fn call_init(&self, store: &mut Store<PluginState>, config: &str) -> wasmtime::Result<Result<(), String>>;
}

/// Counters shown in status and metrics.
#[derive(Debug, Default)]
pub struct PluginCounters {
    pub calls: AtomicU64,
    pub faults: AtomicU64,
    pub invalid_answers: AtomicU64,
    pub instantiations: AtomicU64,
}

impl PluginCounters {
    pub fn snapshot(&self) -> crate::model::CallCounts {
        crate::model::CallCounts {
            calls: self.calls.load(Ordering::Relaxed),
            faults: self.faults.load(Ordering::Relaxed),
            invalid_answers: self.invalid_answers.load(Ordering::Relaxed),
        }
    }
}

struct Slot<W> {
    live: Option<(Store<PluginState>, W)>,
    consecutive_faults: u32,
    suspended_until: Option<Instant>,
    /// The last call returned an answer that has not been refused (yet): the next call starts
    /// the fault count again. The count is not cleared when the guest returns, since the host
    /// checks the answer after that and an invalid answer counts as a fault.
    answered: bool,
}

pub(crate) struct PluginInstance<W> {
    pub(crate) plugin: Arc<LoadedPlugin>,
    pub(crate) config: String,
    /// What every instance of it is given (nothing unless a grant says otherwise).
    pub(crate) capabilities: Capabilities,
    slot: Mutex<Slot<W>>,
    pub(crate) counters: PluginCounters,
}

impl<W: WorldBindings> PluginInstance<W> {
    /// Instantiates the plugin and calls `init(config)`. A refusal is a configuration error
    /// carrying the plugin's own message.
    pub(crate) fn new(plugin: Arc<LoadedPlugin>, config: String) -> Result<Self> {
        Self::with_capabilities(plugin, config, Capabilities::none())
    }

    /// The same, with the capabilities a grant gives.
    pub(crate) fn with_capabilities(
        plugin: Arc<LoadedPlugin>,
        config: String,
        capabilities: Capabilities,
    ) -> Result<Self> {
        let instance = PluginInstance {
            plugin,
            config,
            capabilities,
            slot: Mutex::new(Slot { live: None, consecutive_faults: 0, suspended_until: None, answered: false }),
            counters: PluginCounters::default(),
        };
        let live = instance.instantiate()?;
        instance.slot.lock().expect("plugin slot").live = Some(live);
        Ok(instance)
    }

    fn instantiate(&self) -> Result<(Store<PluginState>, W)> {
        self.counters.instantiations.fetch_add(1, Ordering::Relaxed);
        let mut store = self
            .plugin
            .new_store(&self.capabilities)
            .map_err(|e| self.fault("instantiate", format!("cannot set up its capabilities: {e}")))?;
        let bindings = W::instantiate(&self.plugin.pre, &mut store)
            .map_err(|e| self.fault("instantiate", classify(&e, store.data(), &self.plugin)))?;
        match bindings.call_init(&mut store, &self.config) {
            Ok(Ok(())) => Ok((store, bindings)),
            Ok(Err(message)) => Err(Error::PluginConfig { plugin: self.plugin.name.clone(), message }),
            Err(e) => Err(self.fault("init", classify(&e, store.data(), &self.plugin))),
        }
    }

    fn fault(&self, call: &str, cause: String) -> Error {
        Error::PluginFault {
            plugin: self.plugin.name.clone(),
            hash: self.plugin.hash_short().to_string(),
            call: call.to_string(),
            cause,
        }
    }

    /// Runs one call into the guest under the plugin's limits.
    pub(crate) fn call<R>(
        &self,
        call: &str,
        f: impl FnOnce(&W, &mut Store<PluginState>) -> wasmtime::Result<R>,
    ) -> Result<R> {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        let mut slot = self.slot.lock().expect("plugin slot");
        if let Some(until) = slot.suspended_until {
            let now = Instant::now();
            if now < until {
                return Err(Error::PluginSuspended {
                    plugin: self.plugin.name.clone(),
                    faults: slot.consecutive_faults,
                    retry_in_ms: (until - now).as_millis() as u64,
                });
            }
            slot.suspended_until = None;
        }
        if std::mem::take(&mut slot.answered) {
            slot.consecutive_faults = 0;
        }
        if slot.live.is_none() {
            match self.instantiate() {
                Ok(live) => slot.live = Some(live),
                Err(e) => {
                    self.note_fault_locked(&mut slot);
                    return Err(e);
                }
            }
        }
        let (store, bindings) = slot.live.as_mut().expect("instantiated above");
        store.set_epoch_deadline(self.plugin.limits.deadline_ticks());
        store.data_mut().memory_refused_bytes = None;
        store.data_mut().call_deadline = Some(self.plugin.limits.call_deadline());
        match f(bindings, store) {
            Ok(value) => {
                slot.answered = true;
                Ok(value)
            }
            Err(e) => {
                let cause = classify(&e, store.data(), &self.plugin);
                // A trapped instance refuses further calls: discard it; the next call starts fresh.
                slot.live = None;
                self.note_fault_locked(&mut slot);
                tracing::warn!(plugin = %self.plugin.name, hash = %self.plugin.hash_short(), call, %cause, "plugin fault");
                Err(self.fault(call, cause))
            }
        }
    }

    /// Records an answer the host refused; it counts towards the crash-loop breaker.
    pub(crate) fn invalid_answer(&self, call: &str, reason: String) -> Error {
        self.counters.invalid_answers.fetch_add(1, Ordering::Relaxed);
        let mut slot = self.slot.lock().expect("plugin slot");
        slot.answered = false;
        self.note_fault_locked(&mut slot);
        tracing::warn!(plugin = %self.plugin.name, hash = %self.plugin.hash_short(), call, %reason, "plugin answer refused");
        Error::PluginInvalidAnswer {
            plugin: self.plugin.name.clone(),
            hash: self.plugin.hash_short().to_string(),
            call: call.to_string(),
            reason,
        }
    }

    fn note_fault_locked(&self, slot: &mut Slot<W>) {
        self.counters.faults.fetch_add(1, Ordering::Relaxed);
        slot.consecutive_faults += 1;
        if slot.consecutive_faults >= PLUGIN_FAULTS_BEFORE_SUSPEND {
            let doublings = (slot.consecutive_faults - PLUGIN_FAULTS_BEFORE_SUSPEND).min(16);
            let backoff_ms = (PLUGIN_SUSPEND_MS_MIN << doublings).min(PLUGIN_SUSPEND_MS_MAX);
            slot.suspended_until = Some(Instant::now() + Duration::from_millis(backoff_ms));
            tracing::error!(
                plugin = %self.plugin.name,
                faults = slot.consecutive_faults,
                backoff_ms,
                "plugin suspended after repeated faults"
            );
        }
    }
}

fn classify(error: &wasmtime::Error, state: &PluginState, plugin: &LoadedPlugin) -> String {
    if let Some(asked) = state.memory_refused_bytes {
        return format!(
            "out of memory: asked for {asked} bytes, over its memory limit of {} bytes",
            plugin.limits.memory_bytes
        );
    }
    if let Some(trap) = error.downcast_ref::<wasmtime::Trap>() {
        if *trap == wasmtime::Trap::Interrupt {
            return format!("timed out: exceeded its time limit of {} ms", plugin.limits.call_ms);
        }
        return format!("trap: {trap}: {error:#}");
    }
    format!("{error:#}")
}

//! The state each plugin instance's store carries (WASI, wasi:http, the blob store binding,
//! the limiter's budgets, the call deadline), and the host traits wasmtime calls on it: the
//! resource limiter that holds an instance's memories and tables to their limits together,
//! and the log interface.

use std::sync::Arc;

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::{PLUGIN_INSTANCES_MAX, PLUGIN_MEMORIES_MAX, PLUGIN_TABLES_MAX, bindings, grants, http};

/// The state each plugin instance's store carries: WASI with only what its grant gives (nothing
/// by default), the blob store it is bound to (if any), the limiter, and the names used to tag
/// its log lines.
pub struct PluginState {
    pub(super) wasi: WasiCtx,
    pub(super) blob_store: grants::BlobStoreBinding,
    pub(super) table: ResourceTable,
    pub(super) plugin_name: Arc<str>,
    pub(super) plugin_hash_short: Arc<str>,
    /// Bytes of every linear memory of the instance together, against its memory limit.
    pub(super) memory: Budget,
    /// Elements of every table of the instance together.
    pub(super) table_elements: Budget,
    /// Set when the limiter refused a memory growth, so the fault names the cause.
    pub(super) memory_refused_bytes: Option<usize>,
    /// When the call in progress (or the instantiation) must end, and its limit in ms: every
    /// wait in a host call ends there too (`waits`).
    pub(super) call_deadline: Option<(std::time::Instant, u64)>,
    /// `wasi:http` (linked for archivers only): its context, and the hooks that hold the
    /// grant's origins and limits.
    pub(super) http: wasmtime_wasi_http::WasiHttpCtx,
    pub(super) http_hooks: http::HttpHooks,
}

/// A limit on the sum of several growing resources (an instance's memories, or its tables):
/// each growth is charged its difference, so the limit holds for the instance as a whole, not
/// per memory.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    pub(super) max: usize,
    pub(super) used: usize,
    /// The charge of the growth last allowed, given back if that growth fails after all.
    pub(super) last_charge: usize,
}

impl Budget {
    pub(super) fn new(max: usize) -> Budget {
        Budget { max, used: 0, last_charge: 0 }
    }

    /// Charges a growth from `current` to `desired`; `false` (charging nothing) when the sum
    /// would pass the limit.
    pub(super) fn grow(&mut self, current: usize, desired: usize) -> bool {
        let charge = desired.saturating_sub(current);
        match self.used.checked_add(charge) {
            Some(used) if used <= self.max => {
                self.used = used;
                self.last_charge = charge;
                true
            }
            _ => false,
        }
    }

    /// The growth last allowed did not happen.
    pub(super) fn grow_failed(&mut self) {
        self.used -= std::mem::take(&mut self.last_charge);
    }
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl wasmtime_wasi_http::WasiHttpView for PluginState {
    fn http(&mut self) -> wasmtime_wasi_http::WasiHttpCtxView<'_> {
        wasmtime_wasi_http::WasiHttpCtxView { ctx: &mut self.http, table: &mut self.table, hooks: &mut self.http_hooks }
    }
}

impl ResourceLimiter for PluginState {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if !self.memory.grow(current, desired) {
            let asked = self.memory.used.saturating_add(desired.saturating_sub(current));
            self.memory_refused_bytes = Some(asked);
            // An error (not `Ok(false)`) traps at once, so a guest cannot swallow the refusal
            // and carry on in a degraded state.
            return Err(wasmtime::format_err!(
                "memory limit of {} bytes exceeded (its memories together asked for {asked})",
                self.memory.max
            ));
        }
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.memory.grow_failed();
        Ok(())
    }

    fn table_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(self.table_elements.grow(current, desired))
    }

    fn table_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.table_elements.grow_failed();
        Ok(())
    }

    fn instances(&self) -> usize {
        PLUGIN_INSTANCES_MAX
    }

    fn memories(&self) -> usize {
        PLUGIN_MEMORIES_MAX
    }

    fn tables(&self) -> usize {
        PLUGIN_TABLES_MAX
    }
}

impl bindings::log_iface::Host for PluginState {
    fn log(&mut self, level: bindings::log_iface::Level, message: String) {
        use bindings::log_iface::Level;
        let plugin = &*self.plugin_name;
        let hash = &*self.plugin_hash_short;
        match level {
            Level::Trace => tracing::trace!(plugin, hash, "{message}"),
            Level::Debug => tracing::debug!(plugin, hash, "{message}"),
            Level::Info => tracing::info!(plugin, hash, "{message}"),
            Level::Warn => tracing::warn!(plugin, hash, "{message}"),
            Level::Error => tracing::error!(plugin, hash, "{message}"),
        }
    }
}

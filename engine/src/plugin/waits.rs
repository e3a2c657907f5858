//! Waits inside a plugin call are bounded by the call's time limit.
//!
//! The epoch deadline interrupts guest code only: a guest that sleeps (`subscribe-duration`
//! then `poll`, which is what `std::thread::sleep` and `time.sleep` compile to) or waits on any
//! other pollable blocks in a host call, where no epoch check runs. WASI is linked in sync
//! mode, so `wasi:io/poll`'s `poll` and `pollable.block` are replaced here by versions that
//! wait at most until the call's deadline (`PluginState::call_deadline`, set for each call and
//! for instantiation) and then trap, which drops the instance like any other timeout. Every
//! other WASI function is wasmtime-wasi's own; the streams' blocking calls only wait on
//! pollables of their own, which plugins reach only through the grants' HTTP bodies (bounded by
//! `plugin::http`) and empty standard streams.

use std::time::Instant;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::bindings::sync::io::poll as sync_poll;
use wasmtime_wasi::runtime::in_tokio;
use wasmtime_wasi_io::bindings::wasi::io::poll as async_poll;
use wasmtime_wasi_io::poll::DynPollable;

use super::PluginState;
use crate::error::{Error, Result};

/// A store's resource table and the deadline of the call in progress.
pub struct BoundedWaits<'a> {
    table: &'a mut ResourceTable,
    deadline: Option<(Instant, u64)>,
}

struct HasBoundedWaits;

impl HasData for HasBoundedWaits {
    type Data<'a> = BoundedWaits<'a>;
}

impl BoundedWaits<'_> {
    /// Runs `wait` until it is done or the call's deadline passes, whichever is first.
    fn bounded<T>(
        deadline: Option<(Instant, u64)>,
        what: &str,
        wait: impl Future<Output = wasmtime::Result<T>>,
    ) -> wasmtime::Result<T> {
        let Some((deadline, call_ms)) = deadline else { return in_tokio(wait) };
        let left = deadline.saturating_duration_since(Instant::now());
        in_tokio(async { tokio::time::timeout(left, wait).await }).unwrap_or_else(|_| {
            Err(wasmtime::Error::msg(format!(
                "time limit of {call_ms} ms exceeded while the plugin waited in {what} (a sleep or a blocking poll)"
            )))
        })
    }
}

impl sync_poll::Host for BoundedWaits<'_> {
    fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        let deadline = self.deadline;
        Self::bounded(deadline, "wasi:io/poll.poll", async_poll::Host::poll(self.table, pollables))
    }
}

impl sync_poll::HostPollable for BoundedWaits<'_> {
    fn ready(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        sync_poll::HostPollable::ready(self.table, pollable)
    }

    fn block(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        let deadline = self.deadline;
        Self::bounded(deadline, "wasi:io/poll.pollable.block", async_poll::HostPollable::block(self.table, pollable))
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        sync_poll::HostPollable::drop(self.table, pollable)
    }
}

/// Replaces `wasi:io/poll` in `linker` (which already holds wasmtime-wasi's) with the bounded
/// version.
pub fn link(linker: &mut Linker<PluginState>) -> Result<()> {
    linker.allow_shadowing(true);
    let linked = sync_poll::add_to_linker::<PluginState, HasBoundedWaits>(linker, |state| BoundedWaits {
        table: &mut state.table,
        deadline: state.call_deadline,
    });
    linker.allow_shadowing(false);
    linked.map_err(|e| Error::Internal(format!("cannot link the bounded wasi:io/poll: {e}")))
}

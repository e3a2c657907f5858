//! frostline's one integration-test binary: shared helpers in `support`, one module per
//! capability. End-to-end tests drive the real `frostline` binary.

mod adopt;
mod api;
mod archival;
mod archivers;
mod columns;
mod crash;
#[cfg(feature = "delta")]
mod delta;
mod disk;
mod e2e;
mod erasure;
mod formats;
mod generations;
mod layers;
mod lifecycle;
mod object_stores;
mod plugins;
mod races;
mod reload;
mod replan;
mod simulation;
mod support;

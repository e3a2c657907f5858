//! frostline's one integration-test binary: shared helpers in `support`, one module per
//! capability. End-to-end tests drive the real `frostline` binary.

mod archival;
mod e2e;
mod plugins;
mod races;
mod reload;
mod simulation;
mod support;

//! The operations a user can ask of an engine, whoever asks: one function per operation,
//! taking a typed request and returning a typed answer (`Serialize` and `Deserialize`, so the
//! HTTP API sends it and the CLI's client reads it back as the same type). `cli` parses
//! arguments and prints, `api` maps HTTP to these and errors to status codes; both import
//! only `ops`, `error` and `model` from the engine (`tests/integration/layers.rs`), and
//! neither imports the other.

pub mod archives;
pub mod buckets;
pub mod erasure;
pub mod holds;
pub mod local;
pub mod maintenance;
pub mod passes;
pub mod plugin_check;
#[cfg(feature = "compiler")]
pub mod plugin_compile;
pub mod plugins;
pub mod policy;
pub mod query;
pub mod records;
pub mod reload;
pub mod status;
pub mod wire;

/// The handle every operation takes: an open data directory with its policy set.
pub use crate::engine::Engine;

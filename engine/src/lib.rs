//! frostline: a hot-to-cold archival engine with WebAssembly policy plugins.
//!
//! Layers, inner to outer (each imports only the ones before it):
//! `model` and `error` (the pure core) → `plugin`, `store`, `storage`, `format` (adapters) →
//! `policy`, `archive` (the coordinator), `query` → `engine` (the runtime) → `api` (HTTP) →
//! `daemon` (`frostline run`) and `cli`.
//! ARCHITECTURE.md at the repository root describes them.

pub mod api;
pub mod archive;
pub mod cli;
pub mod clock;
pub mod daemon;
pub mod engine;
pub mod error;
pub mod failpoints;
pub mod format;
pub mod model;
pub mod plugin;
pub mod policy;
pub mod query;
pub mod settings;
pub mod storage;
pub mod store;

pub use error::{Error, ErrorKind, Result};

//! frostline: a hot-to-cold archival engine with WebAssembly policy plugins.
//!
//! Layers, inner to outer (each imports only the ones before it):
//! `model` and `error` (the pure core) → `plugin`, `store`, `storage`, `format` (adapters) →
//! `policy`, `archive` (the coordinator), `query` → `runtime` → `cli`.
//! ARCHITECTURE.md at the repository root describes them.

pub mod cli;
pub mod error;
pub mod model;
pub mod plugin;

pub use error::{Error, ErrorKind, Result};

//! frostline: a hot-to-cold archival engine with WebAssembly policy plugins.
//!
//! Layers, inner to outer (`LAYERS`; each module imports only modules of the layers before
//! it, or of its own layer without a cycle; `tests/integration/layers.rs` checks every import):
//!
//! 1. `error`, `model`, `clock`, `settings`, `failpoints`: the pure core and its vocabulary;
//! 2. `format`, `storage`, `store`, `plugin`: the adapters (encodings, object stores, redb,
//!    WebAssembly);
//! 3. `policy`: a policy directory loaded into a validated set (no runtime);
//! 4. `engine`: the runtime every operation shares (store, active policy set, plugin host,
//!    clock) and the append path;
//! 5. `archive`, `query`: the archival protocol and reads across hot and cold;
//! 6. `ops`: the operations a user asks for (status, holds, reload, passes, wire forms);
//! 7. `api` (HTTP), `daemon` (`frostline run`), `cli`: the ways in. `api` and `cli` never
//!    import each other: the CLI reaches a running engine through its own HTTP client.
//!
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
pub mod ops;
pub mod plugin;
pub mod policy;
pub mod query;
pub mod settings;
pub mod storage;
pub mod store;

pub use error::{Error, ErrorKind, Result};

/// The crate's layers, inner to outer (see the crate documentation).
pub const LAYERS: &[&[&str]] = &[
    &["error", "model", "clock", "settings", "failpoints"],
    &["format", "storage", "store", "plugin"],
    &["policy"],
    &["engine"],
    &["archive", "query"],
    &["ops"],
    &["api", "daemon", "cli"],
];

/// Pairs of one layer that must not import each other, in either direction, though a one-way
/// import would keep the graph acyclic: the HTTP API and the CLI are two ways into the same
/// operations.
pub const LAYER_SEPARATED: &[(&str, &str)] = &[("api", "cli")];

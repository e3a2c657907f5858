//! Upkeep of a running engine's data directory: the hot store gives back the pages archival,
//! expiry and erasure freed (`Store::compact_in_place`) once enough of its file is free
//! (`FROSTLINE_STORE_COMPACT_FREE_PERCENT` and `_MIB`), measured at most every
//! `FROSTLINE_STORE_COMPACT_CHECK_SECONDS`. The pass loop calls it between passes, never while
//! a backlog is being worked through.

use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::error::Result;
pub use crate::store::compact::{Compaction, InPlace, StoreSpace};

/// What one look at the hot store found and did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upkeep {
    pub space: StoreSpace,
    /// `None`: not worth compacting (or compaction in place is off).
    pub compaction: Option<InPlace>,
}

/// Whether a store of `space` is worth compacting under the engine's settings.
pub fn worth_compacting(engine: &Engine, space: &StoreSpace) -> bool {
    let settings = engine.settings();
    settings.store_compact_free_percent > 0
        && space.free_bytes >= settings.store_compact_free_bytes
        && u128::from(space.free_bytes) * 100
            >= u128::from(space.file_bytes) * u128::from(settings.store_compact_free_percent)
}

/// Measures the hot store and compacts it in place if it is worth it.
pub fn compact_if_worthwhile(engine: &Engine) -> Result<Upkeep> {
    let space = engine.store().space(engine.clock().now())?;
    let compaction = if worth_compacting(engine, &space) { Some(engine.store().compact_in_place()?) } else { None };
    if let Some(InPlace::Compacted(_)) = &compaction {
        engine.store().space(engine.clock().now())?;
    }
    Ok(Upkeep { space, compaction })
}

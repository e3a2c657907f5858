//! Compaction of the hot store's file (`frostline compact`). redb never gives the pages it
//! freed back to the file system, so the file keeps its high-water mark after archival has
//! deleted the hot rows; and a freed page keeps what it held until a later write reuses it,
//! erased records among them. Compaction moves the live pages to the front of the file and
//! truncates the rest. It needs the file to itself: run it with the engine stopped.

use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};

/// What compacting the hot store's file did.
#[derive(Debug, Clone, Serialize)]
pub struct Compaction {
    pub file: String,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Compacts the database file at `path` until redb finds nothing more to move. A missing file
/// is refused (nothing is created), as is a file another process holds (a running engine).
pub fn compact(path: &Path) -> Result<Compaction> {
    let size = |path: &Path| std::fs::metadata(path).map(|m| m.len());
    let bytes_before = size(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound(format!(
            "no hot store at {}: check --data (FROSTLINE_DATA) names the engine's data directory",
            path.display()
        )),
        _ => Error::io(path, e),
    })?;
    let cache_bytes = crate::settings::STORE_CACHE_MIB_DEFAULT as usize * 1024 * 1024;
    let mut db = super::open_database(path, cache_bytes)?;
    while db.compact().map_err(|e| Error::database(format!("compacting {}", path.display()), e))? {}
    drop(db);
    let bytes_after = size(path).map_err(|e| Error::io(path, e))?;
    tracing::info!(file = %path.display(), bytes_before, bytes_after, "hot store compacted");
    Ok(Compaction { file: path.display().to_string(), bytes_before, bytes_after })
}

//! Policy checks: what a reload of a directory would say, without changing anything. Against
//! a running engine (its store, with the re-plan the directory would cause), against a data
//! directory no engine holds, or the directory alone. And what a table declares that clients
//! check their input against (its typed columns).

use std::path::Path;

use crate::clock::{Clock as _, SystemClock};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::settings::ArchiverArgs;

pub use crate::policy::check::CheckReport;

/// A table's typed columns as its policy declares them (`GET /v1/tables/{table}/columns`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TableColumns {
    pub table: String,
    pub columns: Vec<crate::model::columns::ColumnSpec>,
}

/// The typed columns of `table` in the policy set in force.
pub fn table_columns(engine: &Engine, table: &str) -> Result<TableColumns> {
    let columns = engine.policies().table(table)?.columns().to_vec();
    Ok(TableColumns { table: table.to_string(), columns })
}

/// A dry-run reload of `dir` (the engine's own policy directory: `None`) against this engine.
/// A refusal is an answer (`accepted: false`), not an error.
pub fn check_against(engine: &Engine, dir: Option<&Path>) -> Result<CheckReport> {
    let dir = dir.unwrap_or(&engine.policies().dir).to_path_buf();
    let dir = std::path::absolute(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok(crate::policy::check::check_dir(
        &dir,
        engine.data_dir(),
        engine.host(),
        engine.settings(),
        Some(engine.store()),
        engine.clock().now(),
    ))
}

/// Checks `dir` with no running engine: alone (its default `local` target probed in a scratch
/// folder), or against the store of the data directory `data`. A data directory a running
/// engine holds is `Error::AlreadyOpen`: ask that engine (`check_against`, through its API).
pub fn check_offline(dir: &Path, data: Option<&Path>, archiver: &ArchiverArgs) -> Result<CheckReport> {
    let settings = archiver.validate()?;
    let dir = std::path::absolute(dir).map_err(|e| Error::io(dir, e))?;
    let now = SystemClock.now();
    let Some(data) = data else {
        let scratch = std::env::temp_dir().join(format!("frostline-policy-check-{}", std::process::id()));
        let host = crate::plugin::PluginHost::new(None)?;
        let report = crate::policy::check::check_dir(&dir, &scratch, &host, &settings, None, now);
        let _ = std::fs::remove_dir_all(&scratch);
        return Ok(report);
    };
    let data = std::path::absolute(data).map_err(|e| Error::io(data, e))?;
    let database = data.join(crate::engine::DATABASE_FILE);
    if !database.is_file() {
        return Err(Error::InvalidInput(format!(
            "{} holds no frostline data (no {}); check the --data path",
            data.display(),
            database.display()
        )));
    }
    let store = crate::store::Store::open(&database)?;
    let host = crate::plugin::PluginHost::with_cache(
        Some(settings.plugin_cache_dir(&data)),
        settings.plugin_cache_key_file.as_deref(),
    )?;
    Ok(crate::policy::check::check_dir(&dir, &data, &host, &settings, Some(&store), now))
}

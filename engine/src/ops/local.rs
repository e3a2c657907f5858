//! A data directory opened by the command itself (no engine runs on it), and what the files a
//! running engine publishes in it say: its status file, its process id.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::clock::SystemClock;
use crate::engine::Engine;
use crate::error::{Error, Result};

pub use crate::engine::APPEND_BATCH_RECORDS_MAX;
pub use crate::settings::ArchiverArgs;
pub use crate::store::compact::Compaction;

/// Opens a data directory with its policy directory on the system clock.
/// `Error::AlreadyOpen` when a running engine holds it: reach that engine through its API.
pub fn open(data: &Path, policies: &Path, archiver: &ArchiverArgs) -> Result<Arc<Engine>> {
    let settings = archiver.validate()?;
    Engine::open(data, policies, settings, Arc::new(SystemClock))
}

/// Compacts the hot store of the data directory `data` (`frostline compact`, the engine
/// stopped): the file gives back the pages archival and erasure freed, and keeps none of what
/// they held.
pub fn compact(data: &Path) -> Result<Compaction> {
    crate::store::compact::compact(&data.join(crate::engine::DATABASE_FILE))
}

/// The status file a running engine rewrites (`ops::status::write_status_file`).
pub fn status_file(data: &Path) -> PathBuf {
    data.join(crate::engine::STATUS_FILE)
}

/// Passes until nothing more is claimable now (`frostline archive --once`).
pub async fn archive_once(engine: &Arc<Engine>) -> Result<super::passes::PassReport> {
    let owner = engine.new_owner_token();
    super::passes::run_until_idle(engine, &owner, None, &|_| {}).await
}

/// Asks the engine running on `data` to reload its policy directory (SIGHUP); the process id
/// signalled. Only an engine that holds the database is signalled: a pid file left by a
/// crashed engine could name an unrelated process by now.
pub fn signal_reload(data: &Path) -> Result<i32> {
    match crate::store::Store::open(&data.join(crate::engine::DATABASE_FILE)) {
        Err(Error::AlreadyOpen { .. }) => {}
        Ok(_) => {
            return Err(Error::NotFound(format!(
                "no engine is running on {}; start one with `frostline run`",
                data.display()
            )));
        }
        Err(e) => return Err(e),
    }
    let path = data.join(crate::engine::PID_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::NotFound(format!("no running engine: cannot read {}: {e}", path.display())))?;
    let pid: i32 =
        text.trim().parse().map_err(|_| Error::Internal(format!("{} does not hold a process id", path.display())))?;
    // SAFETY: kill(2) with a valid signal number has no memory-safety preconditions.
    if unsafe { libc::kill(pid, libc::SIGHUP) } != 0 {
        return Err(Error::Internal(format!("cannot signal process {pid}: {}", std::io::Error::last_os_error())));
    }
    Ok(pid)
}

//! Fail points at every step of the archival protocol, for crash and fault testing.
//!
//! Compiled into debug builds (every test build) and out of release builds. Switched on at
//! start by `FROSTLINE_FAILPOINTS`, in the `fail` crate's syntax, `;`-separated:
//!
//! ```text
//! FROSTLINE_FAILPOINTS="after_claim=return(error);after_publish=30%return(abort)"
//! ```
//!
//! `return(error)` makes the step fail with an error; `return(abort)` kills the process on the
//! spot (no destructors, no flush: like SIGKILL); every other `fail` action (`sleep(ms)`,
//! `pause`, `panic`, counts and probabilities) works as documented by that crate.

use crate::error::{Error, Result};

/// Every fail point, in protocol order.
pub const FAIL_POINTS: &[&str] = &[
    "after_claim",
    "mid_snapshot",
    "after_segment_upload",
    "after_read_back",
    "after_manifest",
    "before_publish",
    "after_publish",
    "mid_cleanup",
    "heartbeat",
    // Expiry: after the tombstone, before the last hold check and the first delete; and
    // between two deletes.
    "after_expiry_tombstone",
    "before_start_deletes",
    "mid_expiry_delete",
    // Holds of a new policy set, before they are written to the store.
    "before_policy_holds_sync",
    // Outbox: a sink has the event, the store does not know yet.
    "after_outbox_delivery",
    // The orphan sweep, before each delete.
    "mid_sweep_delete",
    // An erasure, before each delete of an object its bucket's new generation replaced.
    "mid_erase_delete",
    // A Delta log sync, before and after each commit.
    "before_delta_commit",
    "after_delta_commit",
    // Adoption, between recording the archives and placing the erasures they owe.
    "before_owed_erasures",
];

pub const FAILPOINTS_ENV: &str = "FROSTLINE_FAILPOINTS";

/// Configures fail points from `FROSTLINE_FAILPOINTS`. Refuses unknown names, so a typo in a
/// crash test cannot silently test nothing.
pub fn setup_from_env() -> Result<()> {
    let Ok(spec) = std::env::var(FAILPOINTS_ENV) else { return Ok(()) };
    if !cfg!(debug_assertions) {
        return Err(Error::InvalidInput(format!(
            "{FAILPOINTS_ENV} is set but this is a release build, which has no fail points; use a debug build"
        )));
    }
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, actions) = entry
            .split_once('=')
            .ok_or_else(|| Error::InvalidInput(format!("{FAILPOINTS_ENV}: `{entry}` is not NAME=ACTIONS")))?;
        if !FAIL_POINTS.contains(&name) {
            return Err(Error::InvalidInput(format!(
                "{FAILPOINTS_ENV}: unknown fail point `{name}`; the fail points are {}",
                FAIL_POINTS.join(", ")
            )));
        }
        fail::cfg(name, actions).map_err(|e| Error::InvalidInput(format!("{FAILPOINTS_ENV}: `{entry}`: {e}")))?;
        tracing::warn!(fail_point = name, actions, "fail point armed");
    }
    Ok(())
}

/// Evaluates a fail point: `Ok(())` unless it is armed.
#[cfg(debug_assertions)]
pub fn hit(name: &'static str) -> Result<()> {
    match fail::eval(name, |arg| arg) {
        None => Ok(()),
        Some(Some(arg)) if arg == "abort" => {
            eprintln!("fail point `{name}`: aborting the process");
            std::process::abort()
        }
        Some(_) => Err(Error::StorageUnavailable(format!("fail point `{name}` fired"))),
    }
}

/// The crash harness's short orphan grace: `FROSTLINE_TEST_ORPHAN_GRACE_SECONDS` replaces
/// `ARCHIVER_ORPHAN_GRACE_SECONDS` and its one-hour floor, so that the sweep deletes what it
/// may within a run of a few seconds. Debug builds only, like the fail points.
#[cfg(debug_assertions)]
pub fn orphan_grace_seconds_override() -> Option<u64> {
    std::env::var("FROSTLINE_TEST_ORPHAN_GRACE_SECONDS").ok().and_then(|v| v.parse().ok())
}

/// Release builds honour no test override.
#[cfg(not(debug_assertions))]
pub fn orphan_grace_seconds_override() -> Option<u64> {
    None
}

/// Release builds carry no fail points.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn hit(_name: &'static str) -> Result<()> {
    Ok(())
}

//! Named invariants, checked before a write and after a read-back (numbered as in docs/RELIABILITY.md, which maps each to the tests that attack it).
//! Each returns a message that names what was violated, so a refusal explains itself.

use super::{BucketState, Micros};

/// Invariant 4: only the current lease owner, at the current generation, before its lease
/// expires, may publish or delete.
pub fn lease_is_held(
    owner: Option<&str>,
    generation: u64,
    lease_expires_at: Micros,
    expected_owner: &str,
    expected_generation: u64,
    now: Micros,
) -> Result<(), String> {
    if owner != Some(expected_owner) {
        return Err(format!("lease owner is {owner:?}, not `{expected_owner}`"));
    }
    if generation != expected_generation {
        return Err(format!("generation is {generation}, not {expected_generation}"));
    }
    if now >= lease_expires_at {
        return Err(format!("lease expired at {lease_expires_at} (now {now})"));
    }
    Ok(())
}

/// The state machine: a transition that does not exist is refused.
pub fn transition_is_allowed(from: BucketState, to: BucketState) -> Result<(), String> {
    if from.can_transition_to(to) { Ok(()) } else { Err(format!("no transition from {from} to {to}")) }
}

/// Invariant 9: the hot rows about to be deleted are exactly the rows the manifest holds.
///
/// The manifest's summary (count, key range, checksum) was summed while the snapshot streamed
/// the claimed bucket's rows, which it read in strictly increasing clustering order from the
/// bucket's rows table; a claimed bucket never accepts another append (no state leads back to
/// `Hot`), so the table has held those rows ever since. What is left to prove at the cleanup is
/// that the snapshot saw all of them: the table's length equals the summary's count and its
/// first and last keys are the summary's. A strictly increasing sequence of `n` keys drawn from
/// a table of `n` keys is the whole table, so the checksum the snapshot summed is the checksum
/// of the rows the cleanup deletes, without reading them a second time.
pub fn hot_rows_match_manifest(hot: &super::rows::RowExtent, manifest: &super::rows::RowSummary) -> Result<(), String> {
    if hot.rows != manifest.rows {
        return Err(format!("hot rows {} != manifest rows {}", hot.rows, manifest.rows));
    }
    if hot.first != manifest.first || hot.last != manifest.last {
        return Err(format!(
            "hot key range {:?}..{:?} != manifest key range {:?}..{:?}",
            hot.first, hot.last, manifest.first, manifest.last
        ));
    }
    Ok(())
}

/// The full form of invariant 9's proof, reading every row again: the checksum of the hot rows
/// equals the manifest's. Debug builds run it after `hot_rows_match_manifest`, so every test
/// holds the streamed proof to the re-read it replaces.
pub fn hot_rows_checksum_matches_manifest(
    hot: &super::rows::RowSummary,
    manifest: &super::rows::RowSummary,
) -> Result<(), String> {
    if hot.rows != manifest.rows || hot.first != manifest.first || hot.last != manifest.last {
        return Err(format!(
            "hot rows re-read {:?}..{:?} ({}) != manifest {:?}..{:?} ({})",
            hot.first, hot.last, hot.rows, manifest.first, manifest.last, manifest.rows
        ));
    }
    if hot.checksum != manifest.checksum {
        return Err(format!("hot row checksum {} != manifest row checksum {}", hot.checksum, manifest.checksum));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_workers_are_refused() {
        assert!(lease_is_held(Some("a"), 3, 100, "a", 3, 99).is_ok());
        assert!(lease_is_held(Some("a"), 3, 100, "a", 3, 100).unwrap_err().contains("expired"));
        assert!(lease_is_held(Some("a"), 4, 100, "a", 3, 50).unwrap_err().contains("generation"));
        assert!(lease_is_held(Some("b"), 3, 100, "a", 3, 50).unwrap_err().contains("owner"));
        assert!(lease_is_held(None, 3, 100, "a", 3, 50).is_err());
    }
}

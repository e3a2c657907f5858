//! Test-only archiver backend `memory-archiver`: blobs live in a `BTreeMap` in guest memory, so
//! they vanish with the instance. Lets the host's tests drive the archiver contract without a
//! real store. Config: empty (or `{}`). A `put` of a key ending in `/sleep` sleeps for a minute
//! first (a WASI clock subscription and a blocking poll), for the host's time-limit tests.

mod bindings {
    wit_bindgen::generate!({ path: "../../../wit", world: "archiver" });
}

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Bound;

use bindings::exports::frostline::plugin::backend::Guest as BackendGuest;
use bindings::frostline::plugin::types::BackendError;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {}

thread_local! {
    static BLOBS: RefCell<BTreeMap<String, Vec<u8>>> = const { RefCell::new(BTreeMap::new()) };
}

fn list(blobs: &BTreeMap<String, Vec<u8>>, prefix: &str, after: Option<&str>, limit: u32) -> Vec<String> {
    // Keys with the prefix are one contiguous run of the sorted map, so start at the later of
    // the prefix and `after` and stop at the first key without the prefix.
    let from = match after {
        Some(after) if after >= prefix => Bound::Excluded(after),
        _ => Bound::Included(prefix),
    };
    blobs
        .range::<str, _>((from, Bound::Unbounded))
        .map(|(key, _)| key)
        .take_while(|key| key.starts_with(prefix))
        .take(limit as usize)
        .cloned()
        .collect()
}

struct Component;

impl bindings::Guest for Component {
    fn init(config: String) -> Result<(), String> {
        if !config.trim().is_empty() {
            serde_json::from_str::<Config>(&config).map_err(|e| format!("memory-archiver config: {e}"))?;
        }
        Ok(())
    }
}

impl BackendGuest for Component {
    fn put(key: String, bytes: Vec<u8>) -> Result<(), BackendError> {
        if key.ends_with("/sleep") {
            std::thread::sleep(std::time::Duration::from_secs(60));
        }
        BLOBS.with_borrow_mut(|blobs| {
            if blobs.contains_key(&key) {
                return Err(BackendError::AlreadyExists);
            }
            blobs.insert(key, bytes);
            Ok(())
        })
    }

    fn get(key: String) -> Result<Vec<u8>, BackendError> {
        BLOBS.with_borrow(|blobs| blobs.get(&key).cloned().ok_or(BackendError::NotFound))
    }

    fn delete(key: String) -> Result<(), BackendError> {
        BLOBS.with_borrow_mut(|blobs| blobs.remove(&key).map(|_| ()).ok_or(BackendError::NotFound))
    }

    fn list(prefix: String, after: Option<String>, limit: u32) -> Result<Vec<String>, BackendError> {
        Ok(BLOBS.with_borrow(|blobs| list(blobs, &prefix, after.as_deref(), limit)))
    }
}

bindings::export!(Component with_types_in bindings);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_bounds() {
        let blobs: BTreeMap<String, Vec<u8>> =
            ["a", "b/1", "b/2", "b/3", "c"].into_iter().map(|k| (k.to_string(), vec![])).collect();
        assert_eq!(list(&blobs, "b/", None, 10), ["b/1", "b/2", "b/3"]);
        assert_eq!(list(&blobs, "b/", Some("b/1"), 10), ["b/2", "b/3"]);
        assert_eq!(list(&blobs, "b/", Some("a"), 2), ["b/1", "b/2"]);
        assert_eq!(list(&blobs, "b/", Some("b/3"), 10), Vec::<String>::new());
        assert_eq!(list(&blobs, "b/", Some("zz"), 10), Vec::<String>::new());
        assert_eq!(list(&blobs, "", Some("b/2"), 10), ["b/3", "c"]);
        assert_eq!(list(&blobs, "", None, 0), Vec::<String>::new());
    }
}

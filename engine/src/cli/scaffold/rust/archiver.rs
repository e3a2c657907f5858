//! {{name}}: a frostline archiver. It passes every call to the blob store the engine lends
//! it (a native target named by the policy's `[[grant]]` for this component's SHA-256).
//! Replace the calls with your own store; keep `put` create-only and durable when it answers
//! ok, and answer errors as `BackendError` values, never by trapping.
//!
//! Config: empty or `{}`.

mod bindings {
    wit_bindgen::generate!({ path: "wit", world: "archiver" });
}

use bindings::exports::frostline::plugin::backend::Guest as BackendGuest;
use bindings::frostline::plugin::blob_store;
use bindings::frostline::plugin::log::{Level, log};
use bindings::frostline::plugin::types::BackendError;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {}

struct Component;

impl bindings::Guest for Component {
    fn init(config: String) -> Result<(), String> {
        if !config.trim().is_empty() {
            serde_json::from_str::<Config>(&config).map_err(|e| format!("{{name}} config: {e}"))?;
        }
        log(Level::Info, "{{name}} initialised");
        Ok(())
    }
}

impl BackendGuest for Component {
    fn put(key: String, bytes: Vec<u8>) -> Result<(), BackendError> {
        blob_store::put(&key, &bytes)
    }

    fn get(key: String) -> Result<Vec<u8>, BackendError> {
        blob_store::get(&key)
    }

    fn delete(key: String) -> Result<(), BackendError> {
        blob_store::delete(&key)
    }

    fn list(prefix: String, after: Option<String>, limit: u32) -> Result<Vec<String>, BackendError> {
        blob_store::list(&prefix, after.as_deref(), limit)
    }
}

bindings::export!(Component with_types_in bindings);

//! The fleet's key for erasure requests on shared targets (`archive::fleet_erase`). A request
//! names people: a tenant, a partition key, sort keys. On a shared target it names them only
//! as HMAC-SHA256 digests under a key every host of the fleet is given (`--share-erasures
//! FILE`), so the target never holds what it erases, and an engine that takes the request up
//! matches its records by digesting their values under the same key.
//!
//! Keys are registered here, process-wide, by their id when an engine starts: a selector names
//! the id of its key, and is matched deep in the store and the pass, where no engine context
//! reaches. An engine refuses to start while it holds an open request whose key it was not
//! given (`Store::check_fleet_keys`), so a registered key is there for every match.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{LazyLock, RwLock};

use ring::hmac;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// A key holds at least this many bytes.
pub const FLEET_KEY_BYTES_MIN: usize = 32;

/// What every digest covers before its field and value, so it cannot be taken for another use
/// of the same key.
const DOMAIN: &[u8] = b"frostline shared erasure value v1\n";

/// A fleet key: the key itself and a short id that names it in requests and messages (16 hex
/// digits of a SHA-256 of the key, which tells nothing about it).
#[derive(Clone)]
pub struct FleetKey {
    key: hmac::Key,
    id: String,
}

impl std::fmt::Debug for FleetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetKey").field("id", &self.id).finish_non_exhaustive()
    }
}

impl FleetKey {
    /// The key from its material: a key file's content, without surrounding whitespace.
    pub fn from_material(material: &[u8]) -> std::result::Result<FleetKey, String> {
        let material = material.trim_ascii();
        if material.len() < FLEET_KEY_BYTES_MIN {
            return Err(format!(
                "it holds {} bytes, fewer than the {FLEET_KEY_BYTES_MIN} a key needs (make one with `openssl rand -hex \
                 32` and give the same file to every host of the fleet)",
                material.len()
            ));
        }
        let mut id = Sha256::new();
        id.update(b"frostline fleet key id\n");
        id.update(material);
        Ok(FleetKey { key: hmac::Key::new(hmac::HMAC_SHA256, material), id: hex::encode(&id.finalize()[..8]) })
    }

    /// The key in the file `path` (`--share-erasures`, ARCHIVER_SHARE_ERASURES).
    pub fn from_file(path: &Path) -> Result<FleetKey> {
        let material = std::fs::read(path).map_err(|e| {
            Error::InvalidInput(format!(
                "ARCHIVER_SHARE_ERASURES: cannot read the fleet key {}: {e}; it names a file holding the key every host \
                 of the fleet shares",
                path.display()
            ))
        })?;
        Self::from_material(&material).map_err(|why| {
            Error::InvalidInput(format!(
                "ARCHIVER_SHARE_ERASURES: the fleet key {} is not usable: {why}",
                path.display()
            ))
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The digest of `value` as the selector field `field` names it, in hex.
    pub fn digest(&self, field: &str, value: &[u8]) -> String {
        let mut context = hmac::Context::with_key(&self.key);
        context.update(DOMAIN);
        context.update(field.as_bytes());
        context.update(b"\n");
        context.update(value);
        hex::encode(context.sign().as_ref())
    }
}

static FLEET_KEYS: LazyLock<RwLock<HashMap<String, FleetKey>>> = LazyLock::new(Default::default);

/// Makes `key` known to every selector that names its id.
pub fn register(key: &FleetKey) {
    FLEET_KEYS.write().expect("fleet keys").insert(key.id.clone(), key.clone());
}

/// The registered key with id `id`.
pub fn registered(id: &str) -> Option<FleetKey> {
    FLEET_KEYS.read().expect("fleet keys").get(id).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_shorter_than_32_bytes_is_refused_and_a_digest_depends_on_key_field_and_value() {
        let why = FleetKey::from_material(b"  short\n").unwrap_err();
        assert!(why.contains("fewer than the 32") && why.contains("openssl rand -hex 32"), "{why}");
        let key = FleetKey::from_material(&[b'k'; 32]).unwrap();
        let other = FleetKey::from_material(&[b'o'; 32]).unwrap();
        assert_ne!(key.id(), other.id());
        assert_eq!(key.digest("tenant", b"acme"), key.digest("tenant", b"acme"));
        assert_ne!(key.digest("tenant", b"acme"), other.digest("tenant", b"acme"));
        assert_ne!(key.digest("tenant", b"acme"), key.digest("partition_key", b"acme"));
        assert_ne!(key.digest("tenant", b"acme"), key.digest("tenant", b"acme2"));
        assert!(!key.digest("tenant", b"acme").contains("acme"));
        assert!(!format!("{key:?}").contains("kkkk"), "the key is not printed");
    }
}

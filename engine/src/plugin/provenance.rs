//! Who compiled an artifact. A compiled artifact is native code: deserializing it runs
//! whatever its author compiled, with the grants of the component its name claims. A digest
//! beside it proves only that it is whole, so every artifact carries instead an HMAC-SHA256,
//! under a key its reader holds, over its file name (the component's SHA-256 and the engine key)
//! and its bytes; an artifact is deserialized only when that MAC verifies under a key the
//! reader was given.
//!
//! The keys: the engine's own, made at first use beside its cache directory
//! (`<data>/plugin-cache.key`, 32 random bytes as hex, mode 0600), for what a full build compiles
//! itself; and the operator's, a file given to `frostline plugin compile --key-file` on a build
//! host and to the engine (FROSTLINE_PLUGIN_CACHE_KEY_FILE), for what was compiled elsewhere.
//! The lean edge build, which has no compiler, has only the operator's. Built-ins precompiled
//! into a binary need no MAC: being in the binary proves them.

use std::path::{Path, PathBuf};

use ring::hmac;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;

use crate::error::{Error, Result};

/// The setting that names the operator's key file (`--plugin-cache-key-file` for the engine's
/// commands, `--cache-key-file` for `plugin check`, `--key-file` for `plugin compile`).
pub const KEY_FILE_ENV: &str = "FROSTLINE_PLUGIN_CACHE_KEY_FILE";

/// A key holds at least this many bytes.
pub const KEY_BYTES_MIN: usize = 32;

/// What the proof file beside an artifact starts with.
const PROOF_SCHEME: &str = "hmac-sha256";

/// What every MAC covers before the artifact's name and bytes (so it cannot be taken for
/// another use of the same key).
const DOMAIN: &[u8] = b"frostline compiled plugin artifact v1\n";

/// A key that proves artifacts: the key itself, a short id that names it in proofs and messages
/// (16 hex digits of a SHA-256 of the key, which tells nothing about it), and where it came from.
pub struct ArtifactKey {
    key: hmac::Key,
    id: String,
    origin: String,
}

impl std::fmt::Debug for ArtifactKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArtifactKey").field("id", &self.id).field("origin", &self.origin).finish_non_exhaustive()
    }
}

impl ArtifactKey {
    /// A key from its material: the content of a key file, without surrounding whitespace.
    fn from_material(material: &[u8], origin: String) -> std::result::Result<ArtifactKey, String> {
        let material = material.trim_ascii();
        if material.len() < KEY_BYTES_MIN {
            return Err(format!(
                "it holds {} bytes, fewer than the {KEY_BYTES_MIN} a key needs (make one with `openssl rand -hex 32`)",
                material.len()
            ));
        }
        let mut id = Sha256::new();
        id.update(b"frostline plugin cache key id\n");
        id.update(material);
        let id = hex::encode(&id.finalize()[..8]);
        Ok(ArtifactKey { key: hmac::Key::new(hmac::HMAC_SHA256, material), id, origin })
    }

    /// The operator's key from its file, which must exist. `setting` names how it was given.
    pub fn from_file(path: &Path, setting: &str) -> Result<ArtifactKey> {
        let material = std::fs::read(path).map_err(|e| {
            Error::InvalidInput(format!("{setting}: cannot read the plugin cache key {}: {e}", path.display()))
        })?;
        Self::from_material(&material, format!("{setting} {}", path.display())).map_err(|why| {
            Error::InvalidInput(format!("{setting}: the plugin cache key {} is not usable: {why}", path.display()))
        })
    }

    /// The key in `path`, made there first (32 random bytes as hex, mode 0600) when there is
    /// none; `true` when it was made now. Two processes that make it at once agree on one: the
    /// key is written to a file of its own and linked into place only where none is.
    pub fn load_or_create(path: &Path, origin: &str) -> std::result::Result<(ArtifactKey, bool), String> {
        let made = match std::fs::read(path) {
            Ok(_) => false,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                create_key_file(path).map_err(|e| format!("cannot make {}: {e}", path.display()))?
            }
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let material = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let key = Self::from_material(&material, format!("{origin} {}", path.display()))
            .map_err(|why| format!("{} is not usable: {why}", path.display()))?;
        Ok((key, made))
    }

    /// 16 hex digits that name the key.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The key's id and where it came from, for messages.
    pub fn describe(&self) -> String {
        format!("key {} ({})", self.id, self.origin)
    }

    fn mac(&self, artifact_name: &str, bytes: &[u8]) -> hmac::Tag {
        let mut context = hmac::Context::with_key(&self.key);
        context.update(DOMAIN);
        context.update(artifact_name.as_bytes());
        context.update(b"\n");
        context.update(bytes);
        context.sign()
    }

    /// The proof file's content for the artifact `bytes` named `artifact_name`.
    pub fn prove(&self, artifact_name: &str, bytes: &[u8]) -> String {
        format!("{PROOF_SCHEME} {} {}\n", self.id, hex::encode(self.mac(artifact_name, bytes).as_ref()))
    }
}

/// Writes 32 random bytes, as hex, to a new file at `path` readable by its owner only; `false`
/// when another process made one first.
fn create_key_file(path: &Path) -> std::io::Result<bool> {
    use ring::rand::SecureRandom as _;
    let mut material = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut material)
        .map_err(|_| std::io::Error::other("the operating system gave no random bytes"))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("key-tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let linked = write_and_link(&tmp, path, hex::encode(material).as_bytes());
    let _ = std::fs::remove_file(&tmp);
    linked
}

/// Writes `bytes` to the new file `tmp` (mode 0600, on disk before it is linked), then links it
/// at `path` unless something is there already (`false`).
fn write_and_link(tmp: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    match std::fs::hard_link(tmp, path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// The engine's own key for the cache directory `cache_dir`: the file beside it, named for it
/// (`<data>/plugin-cache.key`). Not inside it: whoever may put files into the cache must not
/// be able to replace the key that proves them.
pub fn own_key_path(cache_dir: &Path) -> PathBuf {
    let mut name = cache_dir.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "plugin-cache".into());
    name.push(".key");
    cache_dir.with_file_name(name)
}

/// The proof beside an artifact: `NAME.cwasm.hmac`.
pub fn proof_path(artifact: &Path) -> PathBuf {
    artifact.with_extension("cwasm.hmac")
}

/// The SHA-256 an older frostline wrote beside an artifact (it proves no author).
pub fn legacy_digest_path(artifact: &Path) -> PathBuf {
    artifact.with_extension("cwasm.sha256")
}

/// The key among `keys` under which `proof` (a proof file's content) proves the artifact
/// `bytes` named `artifact_name`, or why none does.
pub fn verify<'k>(
    keys: &'k [ArtifactKey],
    artifact_name: &str,
    bytes: &[u8],
    proof: &str,
) -> std::result::Result<&'k ArtifactKey, String> {
    let fields: Vec<&str> = proof.split_ascii_whitespace().collect();
    let [PROOF_SCHEME, id, mac] = fields[..] else {
        return Err(format!("its proof is not `{PROOF_SCHEME} KEY_ID MAC`"));
    };
    let Some(key) = keys.iter().find(|k| k.id == id) else {
        return Err(format!("it was signed with key {id}, which is not a key this engine holds ({})", describe(keys)));
    };
    let expected = key.mac(artifact_name, bytes);
    let matches = hex::decode(mac).is_ok_and(|mac| bool::from(mac.as_slice().ct_eq(expected.as_ref())));
    if !matches {
        return Err(format!(
            "its MAC does not verify under {}: its bytes or its name are not what that key signed (an artifact of \
             another component renamed, or a changed one)",
            key.describe()
        ));
    }
    Ok(key)
}

/// The keys, for messages.
pub fn describe(keys: &[ArtifactKey]) -> String {
    if keys.is_empty() {
        return format!(
            "it holds none: give it the key file the artifacts were compiled with, as {KEY_FILE_ENV} or \
             --plugin-cache-key-file"
        );
    }
    keys.iter().map(ArtifactKey::describe).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(material: &str, origin: &str) -> ArtifactKey {
        ArtifactKey::from_material(material.as_bytes(), origin.into()).unwrap()
    }

    #[test]
    fn a_proof_verifies_under_its_key_and_name_only() {
        let ours = key(&"a".repeat(64), "ours");
        let theirs = key(&"b".repeat(64), "theirs");
        let proof = ours.prove("x-1.cwasm", b"code");
        assert_eq!(verify(std::slice::from_ref(&ours), "x-1.cwasm", b"code", &proof).unwrap().id(), ours.id());
        let both = [theirs, ours];
        assert_eq!(verify(&both, "x-1.cwasm", b"code", &proof).unwrap().origin, "ours");

        let renamed = verify(&both, "y-1.cwasm", b"code", &proof).unwrap_err();
        assert!(renamed.contains("does not verify under key") && renamed.contains("(ours)"), "{renamed}");
        let changed = verify(&both, "x-1.cwasm", b"c0de", &proof).unwrap_err();
        assert!(changed.contains("does not verify"), "{changed}");
        let unknown = verify(&both[..1], "x-1.cwasm", b"code", &proof).unwrap_err();
        assert!(unknown.contains("not a key this engine holds") && unknown.contains("(theirs)"), "{unknown}");
        let none = verify(&[], "x-1.cwasm", b"code", &proof).unwrap_err();
        assert!(none.contains(KEY_FILE_ENV), "{none}");
        for bad in ["", "sha256 abc", "hmac-sha256 x", proof.replace("hmac-sha256", "hmac-md5").as_str()] {
            assert!(verify(&both, "x-1.cwasm", b"code", bad).unwrap_err().contains("is not"), "{bad}");
        }
        // Surrounding whitespace (an editor's newline) is not part of a key.
        assert_eq!(key(&format!("{}\n", "a".repeat(64)), "ours").id(), both[1].id());
        let short = ArtifactKey::from_material(b"0123456789", String::new()).unwrap_err();
        assert!(short.contains("fewer than the 32"), "{short}");
    }

    #[test]
    fn the_own_key_is_made_once_for_its_owner_only_beside_the_cache() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("plugin-cache");
        let path = own_key_path(&cache);
        assert_eq!(path, dir.path().join("plugin-cache.key"));
        let (first, made) = ArtifactKey::load_or_create(&path, "own").unwrap();
        assert!(made);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{mode:o}");
        assert_eq!(std::fs::read(&path).unwrap().len(), 64);
        let (again, made) = ArtifactKey::load_or_create(&path, "own").unwrap();
        assert!(!made);
        assert_eq!(first.id(), again.id());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "a temporary file was left");
        std::fs::write(&path, "short").unwrap();
        let err = ArtifactKey::load_or_create(&path, "own").unwrap_err();
        assert!(err.contains("not usable"), "{err}");
        let missing = ArtifactKey::from_file(&dir.path().join("nope"), KEY_FILE_ENV).unwrap_err().to_string();
        assert!(missing.contains(KEY_FILE_ENV) && missing.contains("cannot read"), "{missing}");
    }
}

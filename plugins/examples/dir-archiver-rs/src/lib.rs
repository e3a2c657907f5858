//! Example archiver backend `dir-archiver`: stores each object as a file under a directory the
//! policy preopens for it, read-write. It sees nothing else of the host.
//!
//! Config `{"root": "/data"}` (the guest path of the preopen; empty config means `/data`).
//!
//! Layout: a key's `/`-separated segments become folders and a file, each segment
//! percent-encoded outside `A-Z a-z 0-9 - _ . = : ,` (and a leading `.`), so
//! `table=t/bucket=year:2024/seg-00001.jsonl` is the file `<root>/table=t/bucket=year:2024/seg-00001.jsonl`.
//! Names starting with `.` are never objects: `<root>/.tmp/` holds writes in progress. As with
//! any file system, a key cannot be both an object and a folder of other keys (`a` and `a/b`);
//! the second put of such a pair answers `permanent`. Keys with empty segments are refused.
//!
//! Writes are create-only and durable: the bytes go to a new file in `.tmp/` (created with
//! `create_new`, written, fsynced), which is then hard-linked to the key's name (linking never
//! replaces an existing file, so a second put of a key answers `already-exists`, atomically),
//! and the folder is fsynced. A crash leaves at most a stray file in `.tmp/`, never a partial
//! object; `init` removes strays older than an hour.

mod bindings {
    wit_bindgen::generate!({ path: "../../../wit", world: "archiver" });
}

use std::cell::{Cell, RefCell};
use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::hash::BuildHasher;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bindings::exports::frostline::plugin::backend::Guest as BackendGuest;
use bindings::frostline::plugin::types::BackendError;
use serde::Deserialize;

const KEY_BYTES_MAX: usize = 1024;
const TMP_DIR: &str = ".tmp";
const STRAY_AGE: Duration = Duration::from_secs(3600);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_root")]
    root: String,
}

fn default_root() -> String {
    "/data".to_string()
}

thread_local! {
    static ROOT: RefCell<Option<PathBuf>> = const { RefCell::new(None) };
    static TMP_COUNTER: Cell<u64> = const { Cell::new(0) };
}

fn root() -> Result<PathBuf, BackendError> {
    ROOT.with_borrow(|r| r.clone()).ok_or_else(|| BackendError::Permanent("dir-archiver: init was not called".into()))
}

/// Whether a byte stays itself in a file name (a leading `.` does not).
fn is_safe(byte: u8, first: bool) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'=' | b':' | b',') || (byte == b'.' && !first)
}

fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for (i, b) in segment.bytes().enumerate() {
        if is_safe(b, i == 0) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The segment a file name stands for, if it is one `encode` produces.
fn decode(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = name.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let segment = String::from_utf8(out).ok()?;
    (encode(&segment) == name).then_some(segment)
}

/// The encoded folder and file names of a key.
fn names(key: &str) -> Result<Vec<String>, BackendError> {
    if key.is_empty() || key.len() > KEY_BYTES_MAX {
        return Err(BackendError::Permanent(format!("dir-archiver: a key is 1 to {KEY_BYTES_MAX} bytes")));
    }
    key.split('/')
        .map(|segment| {
            if segment.is_empty() {
                Err(BackendError::Permanent(format!("dir-archiver: key `{key}` has an empty segment")))
            } else {
                Ok(encode(segment))
            }
        })
        .collect()
}

fn path_of(root: &Path, names: &[String]) -> PathBuf {
    let mut path = root.to_path_buf();
    path.extend(names);
    path
}

/// I/O errors a retry cannot fix are permanent; the rest (a full disk, an interrupted call)
/// may pass.
fn io_error(what: &str, e: &io::Error) -> BackendError {
    use io::ErrorKind as K;
    let message = format!("dir-archiver: {what}: {e}");
    match e.kind() {
        K::PermissionDenied
        | K::ReadOnlyFilesystem
        | K::InvalidInput
        | K::InvalidFilename
        | K::NotADirectory
        | K::IsADirectory
        | K::AlreadyExists
        | K::Unsupported => BackendError::Permanent(message),
        _ => BackendError::Transient(message),
    }
}

/// Errors that mean "no object here" (a missing file, or a path through or onto a folder).
fn is_absent(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory | io::ErrorKind::IsADirectory)
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes `bytes` to a new file in `.tmp/` and fsyncs it.
fn write_temp(root: &Path, bytes: &[u8]) -> Result<PathBuf, BackendError> {
    for _ in 0..100 {
        let n = TMP_COUNTER.get();
        TMP_COUNTER.set(n.wrapping_add(1));
        // RandomState is seeded from WASI's random numbers: unique across instances too.
        let path = root.join(TMP_DIR).join(format!("{:016x}-{n}", RandomState::new().hash_one(n)));
        let mut file = match File::options().write(true).create_new(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_error("cannot create a temporary file", &e)),
        };
        let written = file.write_all(bytes).and_then(|()| file.sync_all());
        if let Err(e) = written {
            let _ = fs::remove_file(&path);
            return Err(io_error("cannot write a temporary file", &e));
        }
        return Ok(path);
    }
    Err(BackendError::Transient("dir-archiver: no free temporary file name".into()))
}

fn put(key: &str, bytes: &[u8]) -> Result<(), BackendError> {
    let root = root()?;
    let names = names(key)?;
    let target = path_of(&root, &names);
    let folder = target.parent().expect("a key has at least one segment").to_path_buf();
    if fs::symlink_metadata(&target).is_ok() {
        return Err(BackendError::AlreadyExists);
    }
    let make_folder = || {
        fs::create_dir_all(&folder).map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists | io::ErrorKind::NotADirectory => BackendError::Permanent(format!(
                "dir-archiver: cannot store `{key}`: a part of its path is already an object"
            )),
            _ => io_error(&format!("cannot create the folder of `{key}`"), &e),
        })
    };
    make_folder()?;
    let temp = write_temp(&root, bytes)?;
    let mut linked = fs::hard_link(&temp, &target);
    if linked.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::NotFound) {
        // The folder was pruned by a delete in between: make it again, once.
        make_folder()?;
        linked = fs::hard_link(&temp, &target);
    }
    let _ = fs::remove_file(&temp);
    match linked {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(BackendError::AlreadyExists),
        Err(e) => return Err(io_error(&format!("cannot store `{key}`"), &e)),
    }
    fsync_dir(&folder).map_err(|e| io_error(&format!("cannot fsync the folder of `{key}`"), &e))
}

fn get(key: &str) -> Result<Vec<u8>, BackendError> {
    let path = path_of(&root()?, &names(key)?);
    match fs::read(&path) {
        Ok(bytes) => Ok(bytes),
        Err(e) if is_absent(&e) => Err(BackendError::NotFound),
        Err(e) => Err(io_error(&format!("cannot read `{key}`"), &e)),
    }
}

fn delete(key: &str) -> Result<(), BackendError> {
    let root = root()?;
    let path = path_of(&root, &names(key)?);
    match fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Err(BackendError::NotFound),
        Err(e) if is_absent(&e) => return Err(BackendError::NotFound),
        Err(e) => return Err(io_error(&format!("cannot delete `{key}`"), &e)),
    }
    fs::remove_file(&path).map_err(|e| io_error(&format!("cannot delete `{key}`"), &e))?;
    let folder = path.parent().expect("a key has at least one segment");
    fsync_dir(folder).map_err(|e| io_error(&format!("cannot fsync the folder of `{key}`"), &e))?;
    // Prune folders left empty, up to the root; a folder that is not empty stays.
    let mut dir = folder;
    while dir != root && fs::remove_dir(dir).is_ok() {
        dir = match dir.parent() {
            Some(parent) => parent,
            None => break,
        };
    }
    Ok(())
}

/// Every key in `dir` (whose key prefix is `base`), recursively.
fn walk(dir: &Path, base: &str, out: &mut Vec<String>) -> Result<(), BackendError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if is_absent(&e) => return Ok(()),
        Err(e) => return Err(io_error("cannot list a folder", &e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_error("cannot list a folder", &e))?;
        let name = entry.file_name();
        // Not ours: temporary files, names `encode` never makes, symbolic links.
        let Some(segment) = name.to_str().and_then(decode) else { continue };
        let file_type = entry.file_type().map_err(|e| io_error("cannot list a folder", &e))?;
        let key = if base.is_empty() { segment } else { format!("{base}/{segment}") };
        if file_type.is_dir() {
            walk(&entry.path(), &key, out)?;
        } else if file_type.is_file() {
            out.push(key);
        }
    }
    Ok(())
}

fn list(prefix: &str, after: Option<&str>, limit: u32) -> Result<Vec<String>, BackendError> {
    let root = root()?;
    // Start in the deepest folder the prefix names completely: `a/b/c` starts in `a/b`.
    let mut segments: Vec<&str> = prefix.split('/').collect();
    segments.pop();
    if segments.iter().any(|s| s.is_empty()) {
        return Ok(Vec::new()); // no key has an empty segment
    }
    let start = path_of(&root, &segments.iter().map(|s| encode(s)).collect::<Vec<_>>());
    let mut keys = Vec::new();
    walk(&start, &segments.join("/"), &mut keys)?;
    keys.retain(|k| k.starts_with(prefix) && after.is_none_or(|a| k.as_str() > a));
    keys.sort_unstable();
    keys.truncate(limit as usize);
    Ok(keys)
}

/// Removes writes that a crash interrupted, once they are older than `STRAY_AGE` (younger ones
/// may belong to another instance's write in progress). Ages are measured on the file
/// system's clock: against the modification time of a file made now.
fn remove_strays(root: &Path) {
    let Ok(marker) = write_temp(root, b"") else { return };
    let now = fs::metadata(&marker).and_then(|m| m.modified());
    let _ = fs::remove_file(&marker);
    let (Ok(now), Ok(entries)) = (now, fs::read_dir(root.join(TMP_DIR))) else { return };
    for entry in entries.flatten() {
        let modified = entry.metadata().and_then(|m| m.modified());
        if modified.is_ok_and(|t| now.duration_since(t).is_ok_and(|age| age > STRAY_AGE)) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

struct Component;

impl bindings::Guest for Component {
    fn init(config: String) -> Result<(), String> {
        let config: Config = if config.trim().is_empty() {
            Config { root: default_root() }
        } else {
            serde_json::from_str(&config).map_err(|e| format!("dir-archiver config: {e}"))?
        };
        let root = PathBuf::from(&config.root);
        match fs::metadata(&root) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(format!("dir-archiver: root {} is not a directory", config.root)),
            Err(e) => {
                return Err(format!(
                    "dir-archiver: cannot open root {} ({e}); grant it with a read-write preopen for this plugin's sha256",
                    config.root
                ));
            }
        }
        let tmp = root.join(TMP_DIR);
        match fs::create_dir(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(format!(
                    "dir-archiver: root {} is not writable ({e}); the preopen must be read-write (mode = \"rw\")",
                    config.root
                ));
            }
        }
        remove_strays(&root);
        ROOT.set(Some(root));
        Ok(())
    }
}

impl BackendGuest for Component {
    fn put(key: String, bytes: Vec<u8>) -> Result<(), BackendError> {
        put(&key, &bytes)
    }

    fn get(key: String) -> Result<Vec<u8>, BackendError> {
        get(&key)
    }

    fn delete(key: String) -> Result<(), BackendError> {
        delete(&key)
    }

    fn list(prefix: String, after: Option<String>, limit: u32) -> Result<Vec<String>, BackendError> {
        list(&prefix, after.as_deref(), limit)
    }
}

bindings::export!(Component with_types_in bindings);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_never_start_with_a_dot() {
        for segment in ["table=t", "bucket=year:2024", "seg-00001-ab.jsonl", ".tmp", "..", "a b/c", "%2F", "é", "x~"] {
            let name = encode(segment);
            assert!(!name.starts_with('.'), "{name}");
            assert!(!name.contains('/'), "{name}");
            assert_eq!(decode(&name).as_deref(), Some(segment), "{name}");
        }
        assert_eq!(encode("bucket=year:2024"), "bucket=year:2024");
        assert_eq!(encode(".hidden.txt"), "%2Ehidden.txt");
        assert_eq!(decode(".tmp"), None);
        assert_eq!(decode("%2e"), None, "only the canonical spelling is an object");
        assert_eq!(decode("%zz"), None);
    }

    #[test]
    fn keys_with_empty_segments_are_refused() {
        for key in ["", "/a", "a/", "a//b"] {
            assert!(matches!(names(key), Err(BackendError::Permanent(_))), "{key:?}");
        }
        assert_eq!(names("a/b").unwrap(), ["a", "b"]);
    }
}

//! The files of a policy directory: which ones are policy files (every one readable, never
//! skipped), when an empty directory is meant, and their content hashes for status.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::invalid;
use crate::error::{Error, Result};

/// The file whose presence says that a policy directory without policy files is meant to be
/// empty (no tables, no holds): without it such a directory is refused, at start and at reload,
/// and with it any policy file beside it is refused.
pub const EMPTY_MARKER: &str = ".frostline-empty";
/// The policy files of `dir` (`*.toml`, not in subfolders), sorted. Every one must be
/// readable: a policy file that cannot be looked at (a dangling symbolic link, a file that
/// fails to stat) is an error naming it and the OS error, never skipped, since skipping it
/// would retire its tables and release its holds. Not policy files: folders, whatever their
/// name, and Emacs lock files (`.#name.toml`, dangling links by design).
pub fn policy_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let unreadable =
        |e: std::io::Error| Error::InvalidInput(format!("cannot read the policy directory {}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        let lock_file = path.file_name().is_some_and(|n| n.as_encoded_bytes().starts_with(b".#"));
        if path.extension().is_none_or(|e| e != "toml") || lock_file {
            continue;
        }
        // Follows a symbolic link, as reading the file will.
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => {}
            Ok(meta) if meta.is_file() => files.push(path),
            Ok(_) => {
                return Err(invalid(
                    &path,
                    "is not a regular file (a FIFO, socket or device): a policy file must be one; move it out of the policy directory",
                ));
            }
            Err(e) => {
                let link = std::fs::read_link(&path)
                    .map(|to| format!(" (a symbolic link to {})", to.display()))
                    .unwrap_or_default();
                return Err(invalid(
                    &path,
                    format!(
                        "cannot read this policy file{link}: {e}; restore or remove it (a policy file that cannot be \
                         read is never skipped: its tables would retire and its holds be released)"
                    ),
                ));
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Refuses a policy directory without policy files unless it holds `EMPTY_MARKER` (an
/// unmounted volume or a deploy that removed everything would otherwise retire every table and
/// release every policy hold), and one that holds both the marker and policy files.
pub(super) fn check_emptiness(dir: &Path, files: &[PathBuf]) -> Result<()> {
    let marker = dir.join(EMPTY_MARKER);
    let marked = match std::fs::symlink_metadata(&marker) {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(invalid(&marker, format!("cannot read: {e}"))),
    };
    match (files.is_empty(), marked) {
        (true, false) => Err(Error::InvalidInput(format!(
            "the policy directory {} holds no policy files (*.toml): is it mounted, and was the deploy complete? \
             Loading it would retire every table and release every hold declared in it. If it is meant to be \
             empty, create the file {}",
            dir.display(),
            marker.display()
        ))),
        (false, true) => Err(Error::InvalidInput(format!(
            "the policy directory {} holds policy files ({}) and the marker {}, which says it is meant to be \
             empty: remove the marker (or the policy files)",
            dir.display(),
            files
                .iter()
                .map(|f| f.file_name().unwrap_or_default().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(", "),
            marker.display()
        ))),
        _ => Ok(()),
    }
}

/// SHA-256 of each policy file's content, by file name.
pub fn hash_files(dir: &Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for file in policy_files(dir)? {
        let bytes = std::fs::read(&file).map_err(|e| invalid(&file, format!("cannot read: {e}")))?;
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        out.insert(name, crate::format::manifest::sha256_hex(&bytes));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for file in files {
            std::fs::write(dir.path().join(file), "").unwrap();
        }
        dir
    }

    #[test]
    fn a_dangling_policy_file_is_an_error_naming_it_and_why() {
        let dir = dir_with(&["tables.toml"]);
        std::os::unix::fs::symlink(dir.path().join("gone.toml"), dir.path().join("holds.toml")).unwrap();
        let error = policy_files(dir.path()).unwrap_err().to_string();
        assert!(error.contains("holds.toml") && error.contains("symbolic link to"), "{error}");
        assert!(error.contains("No such file or directory"), "{error}");
    }

    #[test]
    fn folders_other_files_and_emacs_lock_files_are_not_policy_files() {
        let dir = dir_with(&["b.toml", "a.toml", "notes.txt", "tables.toml~"]);
        std::fs::create_dir(dir.path().join("plugins.toml")).unwrap();
        // Emacs locks a file it edits with a dangling link.
        std::os::unix::fs::symlink("root@host.42:1700000000", dir.path().join(".#a.toml")).unwrap();
        let files = policy_files(dir.path()).unwrap();
        assert_eq!(files, [dir.path().join("a.toml"), dir.path().join("b.toml")]);
    }

    #[test]
    fn an_empty_directory_needs_the_marker_and_the_marker_needs_an_empty_directory() {
        let dir = dir_with(&[]);
        std::fs::create_dir(dir.path().join("sample")).unwrap();
        let error = check_emptiness(dir.path(), &policy_files(dir.path()).unwrap()).unwrap_err().to_string();
        assert!(error.contains("no policy files") && error.contains(EMPTY_MARKER), "{error}");
        std::fs::write(dir.path().join(EMPTY_MARKER), "").unwrap();
        check_emptiness(dir.path(), &policy_files(dir.path()).unwrap()).unwrap();
        std::fs::write(dir.path().join("tables.toml"), "").unwrap();
        let error = check_emptiness(dir.path(), &policy_files(dir.path()).unwrap()).unwrap_err().to_string();
        assert!(error.contains("tables.toml") && error.contains(EMPTY_MARKER), "{error}");
    }
}

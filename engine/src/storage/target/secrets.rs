//! Credentials of a target: read from named files (bounded in size, never printed), and the
//! `Redactor` that scrubs every known secret from text that may reach a log, a status or an
//! API answer.

use std::path::Path;
use std::sync::Arc;

/// A secret file larger than this is refused (a service account file is a few KiB).
pub const SECRET_FILE_BYTES_MAX: u64 = 64 * 1024;

/// Environment variables whose values are credentials: scrubbed from messages when set.
pub(super) const SECRET_ENV: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_MASTER_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_TOKEN",
    "AZURE_CLIENT_SECRET",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
];
/// Secrets shorter than this are not scrubbed (they would mangle every message).
const REDACT_BYTES_MIN: usize = 6;

/// A credential read from a file: it never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Scrubs known secrets from text that may reach a log, a status or an API answer.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Arc<Vec<String>>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        let mut secrets: Vec<String> = secrets.into_iter().filter(|s| s.len() >= REDACT_BYTES_MIN).collect();
        // Longest first, so a secret containing another is scrubbed whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Redactor { secrets: Arc::new(secrets) }
    }

    pub fn scrub(&self, text: String) -> String {
        if !self.secrets.iter().any(|s| text.contains(s.as_str())) {
            return text;
        }
        let mut out = text;
        for secret in self.secrets.iter() {
            out = out.replace(secret.as_str(), "***");
        }
        out
    }
}

pub(super) fn read_secret(policy_dir: &Path, option: &str, path: &Path) -> std::result::Result<Secret, String> {
    let path = if path.is_absolute() { path.to_path_buf() } else { policy_dir.join(path) };
    let size =
        std::fs::metadata(&path).map_err(|e| format!("option `{option}`: cannot read {}: {e}", path.display()))?;
    if size.len() > SECRET_FILE_BYTES_MAX {
        return Err(format!(
            "option `{option}`: {} holds {} bytes, more than {SECRET_FILE_BYTES_MAX}",
            path.display(),
            size.len()
        ));
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("option `{option}`: cannot read {}: {e}", path.display()))?;
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("option `{option}`: {} is empty", path.display()));
    }
    Ok(Secret(text.to_string()))
}

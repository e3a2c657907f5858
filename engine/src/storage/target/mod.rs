//! Archive targets: the `[[target]]` sections of the policy directory, parsed strictly, validated
//! into a `TargetSpec` and built into an object_store backend under the target's prefix.
//!
//! Schemes: `file:///abs/dir` (the default target), `s3://bucket/prefix` (any S3-compatible
//! endpoint), `gs://bucket/prefix`, `az://container/prefix` and `memory://` (tests). Credentials
//! come from named files (read at load) or from the environment (the AWS_*, AZURE_* and GOOGLE_*
//! variables object_store knows); never from the URL. Every secret is kept in a `Redactor` that
//! scrubs it from the backend's error messages, and no secret is ever formatted into a message,
//! a log line, a manifest or the status.

use std::path::{Path, PathBuf};

use serde::Deserialize;

mod build;
mod secrets;

pub use secrets::{Redactor, SECRET_FILE_BYTES_MAX, Secret};
use secrets::{SECRET_ENV, read_secret};

/// Objects larger than this are uploaded in parts (to a temporary key, then copied
/// conditionally to their final key); smaller ones with one conditional put.
pub const MULTIPART_THRESHOLD_BYTES: u64 = 5 * 1024 * 1024;
pub const MULTIPART_THRESHOLD_BYTES_MIN: u64 = 1024;
/// S3's largest single put.
pub const MULTIPART_THRESHOLD_BYTES_MAX: u64 = 5 * 1024 * 1024 * 1024;
/// Size of each part of a multipart upload (S3's smallest part, except the last).
pub const MULTIPART_PART_BYTES: usize = 5 * 1024 * 1024;

/// Retries of one request to a remote store (object_store's retry with backoff).
pub const MAX_RETRIES_DEFAULT: usize = 3;
pub const MAX_RETRIES_MAX: usize = 10;
/// How long one request is retried at most. Short, because the protocol defers and retries a
/// whole bucket later; a long wait here only holds a pass up.
pub const RETRY_TIMEOUT_MS_DEFAULT: u64 = 15_000;
pub const RETRY_TIMEOUT_MS_MAX: u64 = 300_000;
/// How long one HTTP request may take (a part of up to 5 MiB must fit).
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 60_000;
pub const REQUEST_TIMEOUT_MS_MIN: u64 = 100;
pub const REQUEST_TIMEOUT_MS_MAX: u64 = 600_000;
pub const CONNECT_TIMEOUT_MS: u64 = 5_000;

/// Azurite's documented development account, used with `use_emulator = true`.
pub const EMULATOR_ACCOUNT: &str = "devstoreaccount1";
/// Azurite's documented, public development key (not a secret).
pub const EMULATOR_ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
pub const EMULATOR_ENDPOINT_DEFAULT: &str = "http://127.0.0.1:10000";

/// One `[[target]]` section as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    pub name: String,
    pub url: String,
    /// s3, az: the service endpoint (`http://127.0.0.1:9000`), for S3-compatible stores and
    /// emulators.
    pub endpoint: Option<String>,
    /// s3: the region (default: AWS_REGION / AWS_DEFAULT_REGION, else us-east-1).
    pub region: Option<String>,
    /// s3, az: allow plain HTTP to the endpoint.
    pub allow_http: Option<bool>,
    /// s3: files holding the access key id, the secret access key and an optional session token.
    pub access_key_id_file: Option<PathBuf>,
    pub secret_access_key_file: Option<PathBuf>,
    pub session_token_file: Option<PathBuf>,
    /// gs: the service account JSON file.
    pub service_account_file: Option<PathBuf>,
    /// az: the storage account name, and a file holding its access key.
    pub account: Option<String>,
    pub access_key_file: Option<PathBuf>,
    /// az: talk to Azurite (its development account and key unless `account` and
    /// `access_key_file` say otherwise; `endpoint` defaults to http://127.0.0.1:10000).
    pub use_emulator: Option<bool>,
    /// Objects above this size take the multipart path (default 5 MiB).
    pub multipart_threshold_bytes: Option<u64>,
    /// s3, gs, az: retries of one request, and how long it is retried at most.
    pub max_retries: Option<usize>,
    pub retry_timeout_ms: Option<u64>,
    /// s3, gs, az: how long one request may take.
    pub request_timeout_ms: Option<u64>,
}

/// Where a target's objects live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Local { dir: PathBuf },
    Memory,
    S3 { bucket: String },
    Gcs { bucket: String },
    Azure { container: String },
}

impl Location {
    fn scheme(&self) -> &'static str {
        match self {
            Location::Local { .. } => "file",
            Location::Memory => "memory",
            Location::S3 { .. } => "s3",
            Location::Gcs { .. } => "gs",
            Location::Azure { .. } => "az",
        }
    }
}

/// Request limits of a remote target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    pub max_retries: usize,
    pub retry_timeout_ms: u64,
    pub request_timeout_ms: u64,
}

/// A validated target, ready to build.
#[derive(Debug, Clone)]
pub struct TargetSpec {
    pub name: String,
    /// The URL as configured (it never holds a credential), recorded in manifests.
    pub url: String,
    pub location: Location,
    /// Every key of the target lives under it ("" for none).
    pub prefix: String,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub allow_http: Option<bool>,
    pub account: Option<String>,
    pub use_emulator: bool,
    pub multipart_threshold_bytes: u64,
    pub limits: RequestLimits,
    access_key_id: Option<Secret>,
    secret_access_key: Option<Secret>,
    session_token: Option<Secret>,
    service_account: Option<Secret>,
    access_key: Option<Secret>,
}

impl TargetConfig {
    /// A target with a URL and no options (the default `local` target).
    pub fn from_url(name: &str, url: &str) -> Self {
        TargetConfig {
            name: name.to_string(),
            url: url.to_string(),
            endpoint: None,
            region: None,
            allow_http: None,
            access_key_id_file: None,
            secret_access_key_file: None,
            session_token_file: None,
            service_account_file: None,
            account: None,
            access_key_file: None,
            use_emulator: None,
            multipart_threshold_bytes: None,
            max_retries: None,
            retry_timeout_ms: None,
            request_timeout_ms: None,
        }
    }

    /// The options that are set (a plugin target may set none of them).
    pub fn options_set(&self) -> Vec<&'static str> {
        [
            ("endpoint", self.endpoint.is_some()),
            ("region", self.region.is_some()),
            ("allow_http", self.allow_http.is_some()),
            ("access_key_id_file", self.access_key_id_file.is_some()),
            ("secret_access_key_file", self.secret_access_key_file.is_some()),
            ("session_token_file", self.session_token_file.is_some()),
            ("service_account_file", self.service_account_file.is_some()),
            ("account", self.account.is_some()),
            ("access_key_file", self.access_key_file.is_some()),
            ("use_emulator", self.use_emulator.is_some()),
            ("multipart_threshold_bytes", self.multipart_threshold_bytes.is_some()),
            ("max_retries", self.max_retries.is_some()),
            ("retry_timeout_ms", self.retry_timeout_ms.is_some()),
            ("request_timeout_ms", self.request_timeout_ms.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect()
    }

    /// Checks every option against the URL's scheme and reads the named secret files (relative
    /// paths are relative to `policy_dir`). The message names the option and the fix, never a
    /// secret and never the URL text after its scheme when that could hold one.
    pub fn validate(&self, policy_dir: &Path) -> std::result::Result<TargetSpec, String> {
        if !crate::model::is_visible_ascii(&self.name, 64) {
            return Err(format!("target name `{}` must be 1 to 64 bytes of visible ASCII", self.name));
        }
        let (location, prefix) = parse_url(&self.url)?;
        let scheme = location.scheme();
        let only = |option: &str, present: bool, schemes: &[&str]| -> std::result::Result<(), String> {
            if present && !schemes.contains(&scheme) {
                let list: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
                return Err(format!("option `{option}` applies to {} targets, not to {scheme}://", list.join(" and ")));
            }
            Ok(())
        };
        only("endpoint", self.endpoint.is_some(), &["s3", "az"])?;
        only("region", self.region.is_some(), &["s3"])?;
        only("allow_http", self.allow_http.is_some(), &["s3", "az"])?;
        only("access_key_id_file", self.access_key_id_file.is_some(), &["s3"])?;
        only("secret_access_key_file", self.secret_access_key_file.is_some(), &["s3"])?;
        only("session_token_file", self.session_token_file.is_some(), &["s3"])?;
        only("service_account_file", self.service_account_file.is_some(), &["gs"])?;
        only("account", self.account.is_some(), &["az"])?;
        only("access_key_file", self.access_key_file.is_some(), &["az"])?;
        only("use_emulator", self.use_emulator.is_some(), &["az"])?;
        let remote = ["s3", "gs", "az"];
        only("max_retries", self.max_retries.is_some(), &remote)?;
        only("retry_timeout_ms", self.retry_timeout_ms.is_some(), &remote)?;
        only("request_timeout_ms", self.request_timeout_ms.is_some(), &remote)?;

        if let Some(endpoint) = &self.endpoint {
            check_endpoint(endpoint)?;
        }
        if self.access_key_id_file.is_some() != self.secret_access_key_file.is_some() {
            return Err("options `access_key_id_file` and `secret_access_key_file` go together: set both, or neither \
                 (then the AWS_* environment variables are used)"
                .into());
        }
        if self.session_token_file.is_some() && self.access_key_id_file.is_none() {
            return Err("option `session_token_file` needs `access_key_id_file` and `secret_access_key_file`".into());
        }
        let multipart_threshold_bytes = self.multipart_threshold_bytes.unwrap_or(MULTIPART_THRESHOLD_BYTES);
        if !(MULTIPART_THRESHOLD_BYTES_MIN..=MULTIPART_THRESHOLD_BYTES_MAX).contains(&multipart_threshold_bytes) {
            return Err(format!(
                "multipart_threshold_bytes = {multipart_threshold_bytes} is outside \
                 {MULTIPART_THRESHOLD_BYTES_MIN}..={MULTIPART_THRESHOLD_BYTES_MAX}"
            ));
        }
        let limits = RequestLimits {
            max_retries: self.max_retries.unwrap_or(MAX_RETRIES_DEFAULT),
            retry_timeout_ms: self.retry_timeout_ms.unwrap_or(RETRY_TIMEOUT_MS_DEFAULT),
            request_timeout_ms: self.request_timeout_ms.unwrap_or(REQUEST_TIMEOUT_MS_DEFAULT),
        };
        if limits.max_retries > MAX_RETRIES_MAX {
            return Err(format!("max_retries = {} is outside 0..={MAX_RETRIES_MAX}", limits.max_retries));
        }
        if limits.retry_timeout_ms == 0 || limits.retry_timeout_ms > RETRY_TIMEOUT_MS_MAX {
            return Err(format!(
                "retry_timeout_ms = {} is outside 1..={RETRY_TIMEOUT_MS_MAX}",
                limits.retry_timeout_ms
            ));
        }
        if !(REQUEST_TIMEOUT_MS_MIN..=REQUEST_TIMEOUT_MS_MAX).contains(&limits.request_timeout_ms) {
            return Err(format!(
                "request_timeout_ms = {} is outside {REQUEST_TIMEOUT_MS_MIN}..={REQUEST_TIMEOUT_MS_MAX}",
                limits.request_timeout_ms
            ));
        }
        if let Some(account) = &self.account
            && (account.is_empty() || !account.bytes().all(|b| b.is_ascii_alphanumeric()))
        {
            return Err(format!("account `{account}` must be a storage account name (letters and digits)"));
        }
        if let Some(region) = &self.region
            && (region.is_empty() || !region.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        {
            return Err(format!("region `{region}` must be letters, digits and `-`"));
        }
        let read = |option: &str, path: &Option<PathBuf>| match path {
            Some(path) => read_secret(policy_dir, option, path).map(Some),
            None => Ok(None),
        };
        Ok(TargetSpec {
            name: self.name.clone(),
            url: self.url.clone(),
            location,
            prefix,
            endpoint: self.endpoint.as_ref().map(|e| e.trim_end_matches('/').to_string()),
            region: self.region.clone(),
            allow_http: self.allow_http,
            account: self.account.clone(),
            use_emulator: self.use_emulator.unwrap_or(false),
            multipart_threshold_bytes,
            limits,
            access_key_id: read("access_key_id_file", &self.access_key_id_file)?,
            secret_access_key: read("secret_access_key_file", &self.secret_access_key_file)?,
            session_token: read("session_token_file", &self.session_token_file)?,
            service_account: read("service_account_file", &self.service_account_file)?,
            access_key: read("access_key_file", &self.access_key_file)?,
        })
    }
}

/// `scheme://bucket/prefix` into a location and a prefix.
fn parse_url(url: &str) -> std::result::Result<(Location, String), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err("url must be file:///absolute/dir, s3://bucket/prefix, gs://bucket/prefix, \
                    az://container/prefix or memory://"
            .into());
    };
    let check_prefix = |prefix: &str| -> std::result::Result<String, String> {
        let prefix = prefix.trim_matches('/');
        if prefix.is_empty() {
            return Ok(String::new());
        }
        object_store::path::Path::parse(prefix)
            .map(|p| p.to_string())
            .map_err(|e| format!("the url's prefix `{prefix}` is not a valid object path: {e}"))
    };
    match scheme {
        "file" => {
            if !rest.starts_with('/') {
                return Err(format!("url `{url}`: a file:// target needs an absolute path (file:///var/lib/...)"));
            }
            Ok((Location::Local { dir: PathBuf::from(rest) }, String::new()))
        }
        "memory" => Ok((Location::Memory, check_prefix(rest)?)),
        "s3" | "gs" | "az" => {
            // Never echo the rest of the URL: it could hold a credential.
            if rest.contains(['@', '?', '#']) {
                return Err(format!(
                    "a {scheme}:// url must not carry credentials, a query or a fragment; \
                     name secret files in the target's options or use the environment"
                ));
            }
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty()
                || !bucket.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
            {
                return Err(format!(
                    "url `{url}`: `{bucket}` is not a valid bucket or container name (letters, digits, `-`, `.`, `_`)"
                ));
            }
            let bucket = bucket.to_string();
            let location = match scheme {
                "s3" => Location::S3 { bucket },
                "gs" => Location::Gcs { bucket },
                _ => Location::Azure { container: bucket },
            };
            Ok((location, check_prefix(prefix)?))
        }
        other => Err(format!(
            "scheme `{other}://` is not supported: use file://, s3://, gs://, az:// or memory:// \
             (a WASM archiver plugin can reach any other store)"
        )),
    }
}

fn check_endpoint(endpoint: &str) -> std::result::Result<(), String> {
    let rest = endpoint.strip_prefix("http://").or_else(|| endpoint.strip_prefix("https://"));
    match rest {
        None => Err("option `endpoint` must start with http:// or https://".into()),
        Some(rest) if rest.contains(['@', '?', '#']) => {
            Err("option `endpoint` must not carry credentials, a query or a fragment".into())
        }
        Some("") => Err("option `endpoint` names no host".into()),
        Some(_) => Ok(()),
    }
}

impl TargetSpec {
    /// Every secret this target may use, from its files and from the environment.
    pub fn redactor(&self) -> Redactor {
        let files = [
            &self.access_key_id,
            &self.secret_access_key,
            &self.session_token,
            &self.service_account,
            &self.access_key,
        ]
        .into_iter()
        .flatten()
        .map(|s| s.expose().to_string());
        let mut secrets: Vec<String> = files.collect();
        // A service account file's private key appears in it line by line.
        if let Some(account) = &self.service_account
            && let Ok(json) = serde_json::from_str::<serde_json::Value>(account.expose())
        {
            for field in ["private_key", "private_key_id"] {
                if let Some(value) = json.get(field).and_then(|v| v.as_str()) {
                    secrets.push(value.to_string());
                    secrets.extend(value.lines().filter(|l| !l.starts_with("-----")).map(str::to_string));
                }
            }
        }
        secrets.extend(SECRET_ENV.iter().filter_map(|name| std::env::var(name).ok()));
        Redactor::new(secrets)
    }

    /// The endpoint shown in status (it holds no credential).
    pub fn endpoint_shown(&self) -> Option<String> {
        match (&self.location, self.use_emulator) {
            (Location::Azure { .. }, true) => {
                Some(self.endpoint.clone().unwrap_or_else(|| EMULATOR_ENDPOINT_DEFAULT.to_string()))
            }
            _ => self.endpoint.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> std::result::Result<TargetConfig, String> {
        toml::from_str::<TargetConfig>(text).map_err(|e| e.to_string())
    }

    fn validate(text: &str, dir: &Path) -> std::result::Result<TargetSpec, String> {
        config(text)?.validate(dir)
    }

    #[test]
    fn urls_parse_into_locations_and_prefixes() {
        let dir = Path::new("/nonexistent");
        let s3 = validate("name = \"a\"\nurl = \"s3://bucket/archive/one/\"", dir).unwrap();
        assert_eq!(s3.location, Location::S3 { bucket: "bucket".into() });
        assert_eq!(s3.prefix, "archive/one");
        let gs = validate("name = \"a\"\nurl = \"gs://b\"", dir).unwrap();
        assert_eq!((gs.location, gs.prefix.as_str()), (Location::Gcs { bucket: "b".into() }, ""));
        let az = validate("name = \"a\"\nurl = \"az://c/p\"\nuse_emulator = true", dir).unwrap();
        assert_eq!((az.location.clone(), az.prefix.as_str()), (Location::Azure { container: "c".into() }, "p"));
        assert_eq!(az.endpoint_shown().as_deref(), Some(EMULATOR_ENDPOINT_DEFAULT));
        let file = validate("name = \"a\"\nurl = \"file:///var/lib/x\"", dir).unwrap();
        assert_eq!(file.location, Location::Local { dir: "/var/lib/x".into() });
        assert_eq!(validate("name = \"a\"\nurl = \"memory://\"", dir).unwrap().location, Location::Memory);
        assert_eq!(s3.multipart_threshold_bytes, MULTIPART_THRESHOLD_BYTES);
        assert_eq!(s3.limits.max_retries, MAX_RETRIES_DEFAULT);
    }

    #[test]
    fn bad_urls_and_options_are_refused_with_the_fix() {
        let dir = Path::new("/nonexistent");
        let cases = [
            ("url = \"ftp://x\"", "not supported"),
            ("url = \"s3://\"", "not a valid bucket"),
            ("url = \"s3://b/a//b\"", "not a valid object path"),
            ("url = \"file://relative\"", "absolute path"),
            ("url = \"s3://b\"\nservice_account_file = \"f\"", "applies to gs:// targets"),
            ("url = \"gs://b\"\nendpoint = \"http://h\"", "applies to s3:// and az:// targets"),
            ("url = \"file:///x\"\nmax_retries = 1", "applies to s3:// and gs:// and az://"),
            ("url = \"s3://b\"\nendpoint = \"h:9000\"", "must start with http"),
            ("url = \"s3://b\"\naccess_key_id_file = \"k\"", "go together"),
            ("url = \"s3://b\"\nmax_retries = 11", "outside 0..=10"),
            ("url = \"s3://b\"\nretry_timeout_ms = 0", "outside 1..="),
            ("url = \"s3://b\"\nrequest_timeout_ms = 10", "outside 100..="),
            ("url = \"s3://b\"\nregion = \"us east\"", "region"),
            ("url = \"az://c\"\naccount = \"a-b\"", "storage account name"),
            (
                "url = \"s3://b\"\naccess_key_id_file = \"missing-id\"\nsecret_access_key_file = \"missing\"",
                "cannot read",
            ),
        ];
        for (text, expected) in cases {
            let err = validate(&format!("name = \"t\"\n{text}"), dir).unwrap_err();
            assert!(err.contains(expected), "{text}: {err}");
        }
        let err = config("name = \"t\"\nurl = \"s3://b\"\nsecret_key = \"x\"").unwrap_err();
        assert!(err.contains("unknown field `secret_key`"), "{err}");
    }

    #[test]
    fn the_multipart_threshold_is_bounded() {
        let dir = Path::new("/nonexistent");
        let at = |n: u64| validate(&format!("name = \"t\"\nurl = \"memory://\"\nmultipart_threshold_bytes = {n}"), dir);
        assert_eq!(at(MULTIPART_THRESHOLD_BYTES_MIN).unwrap().multipart_threshold_bytes, MULTIPART_THRESHOLD_BYTES_MIN);
        assert!(at(MULTIPART_THRESHOLD_BYTES_MAX).is_ok());
        assert!(at(MULTIPART_THRESHOLD_BYTES_MIN - 1).unwrap_err().contains("outside"));
        assert!(at(MULTIPART_THRESHOLD_BYTES_MAX + 1).unwrap_err().contains("outside"));
    }

    #[test]
    fn credentials_in_a_url_are_refused_without_echoing_them() {
        let dir = Path::new("/nonexistent");
        for url in ["s3://AKIDSECRET:hunter2hunter2@bucket/p", "az://c/p?sig=hunter2hunter2", "gs://b/p#hunter2hunter2"]
        {
            let err = validate(&format!("name = \"t\"\nurl = \"{url}\""), dir).unwrap_err();
            assert!(err.contains("must not carry credentials"), "{err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
        let err =
            validate("name = \"t\"\nurl = \"s3://b\"\nendpoint = \"http://u:hunter2hunter2@h\"", dir).unwrap_err();
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn secrets_come_from_files_and_never_print() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("id"), "AKIDEXAMPLE123\n").unwrap();
        std::fs::write(dir.path().join("secret"), "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n").unwrap();
        std::fs::write(dir.path().join("empty"), "\n").unwrap();
        let text = "name = \"t\"\nurl = \"s3://b/p\"\nendpoint = \"http://127.0.0.1:1\"\nallow_http = true\n\
                    access_key_id_file = \"id\"\nsecret_access_key_file = \"secret\"";
        let spec = validate(text, dir.path()).unwrap();
        assert_eq!(spec.secret_access_key.as_ref().unwrap().expose(), "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY");
        let debug = format!("{spec:?}");
        assert!(!debug.contains("wJalrXUtnFEMI") && !debug.contains("AKIDEXAMPLE123"), "{debug}");
        let scrubbed =
            spec.redactor().scrub("signed with wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY by AKIDEXAMPLE123".into());
        assert_eq!(scrubbed, "signed with *** by ***");
        let backend = spec.build().unwrap();
        assert!(!format!("{backend:?}").contains("wJalrXUtnFEMI"));
        let err = validate(&text.replace("\"secret\"", "\"empty\""), dir.path()).unwrap_err();
        assert!(err.contains("is empty"), "{err}");
    }

    #[test]
    #[cfg(feature = "gcs")]
    fn gcs_targets_build_from_a_service_account_file() {
        // No emulator accepts object_store's GCS writes here, so gs:// is covered by parsing
        // and building; `disable_oauth` and `gcs_base_url` are object_store's testing fields.
        let dir = tempfile::tempdir().unwrap();
        let account = r#"{"private_key": "", "private_key_id": "", "client_email": "archiver@example.iam.gserviceaccount.com",
                          "disable_oauth": true, "gcs_base_url": "http://127.0.0.1:1"}"#;
        std::fs::write(dir.path().join("sa.json"), account).unwrap();
        let text = "name = \"g\"\nurl = \"gs://bucket/archive\"\nservice_account_file = \"sa.json\"\nmax_retries = 0";
        let spec = validate(text, dir.path()).unwrap();
        let backend = spec.build().unwrap();
        assert_eq!(crate::storage::ArchiveBackend::target(&backend), "gs://bucket/archive");
        let err = validate(&text.replace("sa.json", "absent.json"), dir.path()).unwrap_err();
        assert!(err.contains("service_account_file") && err.contains("absent.json"), "{err}");
        std::fs::write(dir.path().join("bad.json"), "not json at all, private").unwrap();
        let err = validate(&text.replace("sa.json", "bad.json"), dir.path()).unwrap().build().unwrap_err().to_string();
        assert!(err.contains("target `g`") && !err.contains("not json at all"), "{err}");
    }
}

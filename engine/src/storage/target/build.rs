//! Building a validated target into its object_store client: the local directory (with the
//! fsyncs object_store leaves out), S3, GCS and Azure with their credentials, retries and
//! time-outs, on the process's storage runtime.

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;

use super::{CONNECT_TIMEOUT_MS, Location, TargetSpec};
#[cfg(feature = "azure")]
use super::{EMULATOR_ACCOUNT, EMULATOR_ACCOUNT_KEY, EMULATOR_ENDPOINT_DEFAULT};
use crate::error::{Error, Result};
use crate::storage::ObjectStoreBackend;

impl TargetSpec {
    /// Builds the backend. Remote stores do their HTTP on the process's storage runtime
    /// (`super::io_runtime`), so any caller's runtime may drive them.
    pub fn build(&self) -> Result<ObjectStoreBackend> {
        let redactor = self.redactor();
        let failed = |e: object_store::Error| {
            Error::InvalidInput(redactor.scrub(format!("target `{}`: cannot build its object store: {e}", self.name)))
        };
        // object_store's local store does not fsync what it writes; the backend does (below).
        let mut local_fs = None;
        let store: Arc<dyn ObjectStore> = match &self.location {
            Location::Local { dir } => {
                std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
                // Deleting an object removes the folders it leaves empty (probe runs, expiries).
                let local = object_store::local::LocalFileSystem::new_with_prefix(dir).map_err(failed)?;
                let local = Arc::new(local.with_automatic_cleanup(true));
                local_fs = Some(local.clone());
                local
            }
            Location::Memory => Arc::new(object_store::memory::InMemory::new()),
            Location::S3 { bucket } => Arc::new(self.s3(bucket)?.build().map_err(failed)?),
            #[cfg(feature = "gcs")]
            Location::Gcs { bucket } => Arc::new(self.gcs(bucket)?.build().map_err(failed)?),
            #[cfg(feature = "azure")]
            Location::Azure { container } => Arc::new(self.azure(container)?.build().map_err(failed)?),
            #[cfg(not(all(feature = "gcs", feature = "azure")))]
            #[allow(unreachable_patterns)]
            Location::Gcs { .. } | Location::Azure { .. } => return Err(self.not_in_this_build()),
        };
        let store: Arc<dyn ObjectStore> = if self.prefix.is_empty() {
            store
        } else {
            Arc::new(object_store::prefix::PrefixStore::new(store, self.prefix.as_str()))
        };
        let backend = ObjectStoreBackend::new(store, self.url.clone())
            .with_multipart_threshold(self.multipart_threshold_bytes)
            .with_redactor(redactor);
        Ok(match local_fs {
            Some(local) => backend.with_local_fsync(local),
            None => backend,
        })
    }

    fn retry(&self) -> object_store::RetryConfig {
        object_store::RetryConfig {
            max_retries: self.limits.max_retries,
            retry_timeout: Duration::from_millis(self.limits.retry_timeout_ms),
            ..Default::default()
        }
    }

    fn timeouts(&self) -> [(object_store::ClientConfigKey, String); 2] {
        use object_store::ClientConfigKey as K;
        [
            (K::Timeout, format!("{}ms", self.limits.request_timeout_ms)),
            (K::ConnectTimeout, format!("{CONNECT_TIMEOUT_MS}ms")),
        ]
    }

    fn connector() -> Result<object_store::client::SpawnedReqwestConnector> {
        Ok(object_store::client::SpawnedReqwestConnector::new(crate::storage::io_runtime()?.handle().clone()))
    }

    fn s3(&self, bucket: &str) -> Result<object_store::aws::AmazonS3Builder> {
        use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut, S3CopyIfNotExists};
        let files = self.access_key_id.is_some();
        // The AWS_* variables apply, except credentials when the target names credential files
        // (a session token from the environment must not pair with keys from files).
        let credential = [AmazonS3ConfigKey::AccessKeyId, AmazonS3ConfigKey::SecretAccessKey, AmazonS3ConfigKey::Token];
        let mut builder = AmazonS3Builder::new();
        for (key, value) in env_config::<AmazonS3ConfigKey>("AWS_") {
            if !(files && credential.contains(&key)) {
                builder = builder.with_config(key, value);
            }
        }
        let mut builder = builder
            .with_bucket_name(bucket)
            // `If-None-Match: *` on puts, and a conditional CompleteMultipartUpload for copies:
            // the two create-only writes the protocol relies on (the probe checks both).
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_copy_if_not_exists(S3CopyIfNotExists::Multipart)
            .with_retry(self.retry())
            .with_http_connector(Self::connector()?);
        for (key, value) in self.timeouts() {
            builder = builder.with_config(AmazonS3ConfigKey::Client(key), value);
        }
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint).with_virtual_hosted_style_request(false);
        }
        if let Some(region) = &self.region {
            builder = builder.with_region(region);
        }
        if let Some(allow) = self.allow_http {
            builder = builder.with_allow_http(allow);
        }
        if let (Some(id), Some(secret)) = (&self.access_key_id, &self.secret_access_key) {
            builder = builder.with_access_key_id(id.expose()).with_secret_access_key(secret.expose());
            if let Some(token) = &self.session_token {
                builder = builder.with_token(token.expose());
            }
        }
        Ok(builder)
    }

    /// A `gs://` or `az://` target in a build without that client (the lean edge build).
    #[cfg(not(all(feature = "gcs", feature = "azure")))]
    fn not_in_this_build(&self) -> Error {
        let (scheme, feature) = match self.location {
            Location::Gcs { .. } => ("gs", "gcs"),
            _ => ("az", "azure"),
        };
        Error::InvalidInput(format!(
            "target `{}`: this frostline was built without the `{feature}` feature (an edge build), so it cannot \
             reach {scheme}:// targets; run the full build for this target, or archive through a WASM archiver plugin",
            self.name
        ))
    }

    #[cfg(feature = "gcs")]
    fn gcs(&self, bucket: &str) -> Result<object_store::gcp::GoogleCloudStorageBuilder> {
        use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
        // The GOOGLE_* variables apply, except credentials when the target names its file.
        let files = self.service_account.is_some();
        let credential = [
            GoogleConfigKey::ServiceAccount,
            GoogleConfigKey::ServiceAccountKey,
            GoogleConfigKey::ApplicationCredentials,
        ];
        let mut builder = if files { GoogleCloudStorageBuilder::new() } else { GoogleCloudStorageBuilder::from_env() };
        if files {
            for (key, value) in env_config::<GoogleConfigKey>("GOOGLE_") {
                if !credential.contains(&key) {
                    builder = builder.with_config(key, value);
                }
            }
        }
        let mut builder =
            builder.with_bucket_name(bucket).with_retry(self.retry()).with_http_connector(Self::connector()?);
        for (key, value) in self.timeouts() {
            builder = builder.with_config(GoogleConfigKey::Client(key), value);
        }
        if let Some(account) = &self.service_account {
            // The file's content, read (and size-checked) at load.
            builder = builder.with_service_account_key(account.expose());
        }
        Ok(builder)
    }

    #[cfg(feature = "azure")]
    fn azure(&self, container: &str) -> Result<object_store::azure::MicrosoftAzureBuilder> {
        use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
        let mut builder = MicrosoftAzureBuilder::from_env()
            .with_container_name(container)
            .with_retry(self.retry())
            .with_http_connector(Self::connector()?);
        for (key, value) in self.timeouts() {
            builder = builder.with_config(AzureConfigKey::Client(key), value);
        }
        if self.use_emulator {
            // Azurite serves accounts by path (`<endpoint>/<account>/<container>`); with the
            // account in the endpoint, object_store needs no process-wide emulator variable.
            let account = self.account.clone().unwrap_or_else(|| EMULATOR_ACCOUNT.to_string());
            let key = self.access_key.as_ref().map_or(EMULATOR_ACCOUNT_KEY, |k| k.expose());
            let endpoint = self.endpoint.clone().unwrap_or_else(|| EMULATOR_ENDPOINT_DEFAULT.to_string());
            builder = builder
                .with_config(AzureConfigKey::UseEmulator, "false")
                .with_account(&account)
                .with_access_key(key)
                .with_endpoint(format!("{endpoint}/{account}"))
                .with_allow_http(self.allow_http.unwrap_or(true));
        } else {
            if let Some(account) = &self.account {
                builder = builder.with_account(account);
            }
            if let Some(key) = &self.access_key {
                builder = builder.with_access_key(key.expose());
            }
            if let Some(endpoint) = &self.endpoint {
                builder = builder.with_endpoint(endpoint.clone());
            }
            if let Some(allow) = self.allow_http {
                builder = builder.with_allow_http(allow);
            }
        }
        Ok(builder)
    }
}

/// The configuration object_store's `from_env` would read: variables starting with `prefix`
/// whose lower-cased name is a config key.
fn env_config<K: std::str::FromStr>(prefix: &str) -> Vec<(K, String)> {
    std::env::vars_os()
        .filter_map(|(key, value)| Some((key.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(key, _)| key.starts_with(prefix))
        .filter_map(|(key, value)| Some((key.to_ascii_lowercase().parse::<K>().ok()?, value)))
        .collect()
}

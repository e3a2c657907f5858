//! The API's optional TLS listener (`--tls-cert`, `--tls-key`), for hosts without a reverse
//! proxy: rustls on ring (the provider object_store already brings), HTTP/1.1.
//!
//! The certificate chain and key are read at start and again on SIGHUP (`ApiTls::reload`): a
//! new pair serves every handshake after it, and a pair that cannot serve (unreadable, not
//! PEM, a key that does not match the certificate) is refused with the reason while the one
//! in use goes on. Handshakes run in their own tasks, each bounded by
//! `TLS_HANDSHAKE_SECONDS_MAX` and at most `TLS_HANDSHAKES_MAX` at once, so a client that never
//! finishes one holds up no other. The connection cap and the first-request timeout
//! (`connections`) wrap this listener as they wrap the plain one: the cap below it (a
//! connection counts from its accept), the timeout above it (it runs from the end of the
//! handshake).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::serve::Listener;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

use crate::error::{Error, Result};

/// A client has this long to finish its TLS handshake.
pub const TLS_HANDSHAKE_SECONDS_MAX: u64 = 10;
/// Connections whose handshake finished, waiting for the server to take them.
const READY_CONNECTIONS_MAX: usize = 64;
/// Handshakes under way at once: each holds a socket for up to `TLS_HANDSHAKE_SECONDS_MAX`,
/// so a flood of connections that never finish one waits here (the connection cap,
/// `connections::CappedListener`, bounds the sockets held in all).
pub const TLS_HANDSHAKES_MAX: usize = 256;

/// The certificate chain and key the API serves, reloadable.
pub struct ApiTls {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl std::fmt::Debug for ApiTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiTls").field("cert", &self.cert).field("key", &self.key).finish_non_exhaustive()
    }
}

impl ApiTls {
    /// Reads the chain and key; refuses a pair that cannot serve, naming the file and why.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<ApiTls>> {
        let pair = certified_key(cert, key)?;
        Ok(Arc::new(ApiTls { cert: cert.to_path_buf(), key: key.to_path_buf(), current: RwLock::new(Arc::new(pair)) }))
    }

    /// The certificate chain file served (the local CLI trusts what it holds).
    pub fn cert_path(&self) -> &Path {
        &self.cert
    }

    /// Reads the files again; the new pair serves every handshake from now on. On an error
    /// the pair in use stays.
    pub fn reload(&self) -> Result<()> {
        let pair = certified_key(&self.cert, &self.key)?;
        *self.current.write().expect("tls pair") = Arc::new(pair);
        Ok(())
    }

    /// rustls's server configuration, taking its certificate from `self` at each handshake.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Internal(format!("TLS configuration: {e}")))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for ApiTls {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("tls pair").clone())
    }
}

fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey> {
    let refuse = |path: &Path, why: String| {
        Error::InvalidInput(format!(
            "TLS: {}: {why}; give --tls-cert a PEM certificate chain and --tls-key its PEM private key",
            path.display()
        ))
    };
    let cert_pem = std::fs::read(cert).map_err(|e| refuse(cert, format!("cannot be read ({e})")))?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| refuse(cert, format!("is not a PEM certificate chain ({e})")))?;
    if chain.is_empty() {
        return Err(refuse(cert, "holds no certificate (-----BEGIN CERTIFICATE-----)".into()));
    }
    let key_pem = std::fs::read(key).map_err(|e| refuse(key, format!("cannot be read ({e})")))?;
    let private =
        PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| refuse(key, format!("holds no PEM private key ({e})")))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&private)
        .map_err(|e| refuse(key, format!("is not a key rustls can sign with ({e})")))?;
    let pair = CertifiedKey::new(chain, signing);
    pair.keys_match()
        .map_err(|e| refuse(key, format!("does not match the certificate in {} ({e})", cert.display())))?;
    Ok(pair)
}

/// A listener whose connections are handed over once their TLS handshake has finished. The
/// inner listener is the API's `connections::CappedListener`, so a connection counts against
/// the cap from its accept on, handshake included.
pub struct TlsListener<L: Listener> {
    ready: mpsc::Receiver<(TlsStream<L::Io>, SocketAddr)>,
    local_addr: SocketAddr,
}

impl<L: Listener<Addr = SocketAddr>> TlsListener<L> {
    /// Accepts on `inner` in a task of its own, which ends when the listener is dropped.
    /// `inner` handles its accept errors (axum's TCP listener logs them and pauses a second).
    pub fn new(mut inner: L, config: Arc<rustls::ServerConfig>) -> std::io::Result<TlsListener<L>> {
        let local_addr = inner.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let (sender, ready) = mpsc::channel(READY_CONNECTIONS_MAX);
        let handshakes = Arc::new(tokio::sync::Semaphore::new(TLS_HANDSHAKES_MAX));
        tokio::spawn(async move {
            loop {
                let permit = tokio::select! {
                    _ = sender.closed() => return,
                    permit = handshakes.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
                };
                let (stream, peer) = tokio::select! {
                    _ = sender.closed() => return,
                    accepted = inner.accept() => accepted,
                };
                let (acceptor, sender) = (acceptor.clone(), sender.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    let handshake = acceptor.accept(stream);
                    match tokio::time::timeout(Duration::from_secs(TLS_HANDSHAKE_SECONDS_MAX), handshake).await {
                        Ok(Ok(tls)) => {
                            let _ = sender.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, local_addr })
    }
}

impl<L: Listener<Addr = SocketAddr>> Listener for TlsListener<L> {
    type Io = TlsStream<L::Io>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accepting task is gone only once the listener is; never reached.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

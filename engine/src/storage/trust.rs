//! The certificate authorities frostline's own HTTPS clients trust (webhook sinks, the CLI
//! reaching a running engine over TLS): the system's, through rustls-native-certs (the
//! platform store, or the files `SSL_CERT_FILE` and `SSL_CERT_DIR` name), plus certificates a
//! caller adds from PEM files.

use std::path::Path;
use std::sync::{Arc, OnceLock};

/// The system's certificate authorities as DER, loaded once; unreadable ones are logged and
/// skipped.
pub fn system_roots() -> &'static [Vec<u8>] {
    static ROOTS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let loaded = rustls_native_certs::load_native_certs();
        for error in &loaded.errors {
            tracing::warn!(%error, "a system certificate authority could not be loaded");
        }
        loaded.certs.iter().map(|c| c.to_vec()).collect()
    })
}

/// The certificates of a PEM file, as DER; an unreadable file, a malformed one or one without
/// a certificate is refused with the reason.
pub fn read_pem_certificates(path: &Path) -> std::result::Result<Vec<Vec<u8>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot be read ({e})"))?;
    let mut certificates = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item.map_err(|e| format!("is not valid PEM ({e})"))? {
            ureq::tls::PemItem::Certificate(certificate) => certificates.push(certificate.der().to_vec()),
            _ => return Err("holds something other than certificates (a key?); give it only CA certificates".into()),
        }
    }
    if certificates.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
    }
    Ok(certificates)
}

/// ureq's TLS configuration trusting the system's authorities and `extra` (DER).
pub fn tls_config(extra: &[Vec<u8>]) -> ureq::tls::TlsConfig {
    let roots: Vec<ureq::tls::Certificate<'static>> =
        system_roots().iter().chain(extra).map(|der| ureq::tls::Certificate::from_der(der).to_owned()).collect();
    ureq::tls::TlsConfig::builder().root_certs(ureq::tls::RootCerts::Specific(Arc::new(roots))).build()
}

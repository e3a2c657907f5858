//! What an archiver's `[[grant]]` allows over `wasi:http`: origins (`scheme://host:port`,
//! compared exactly as written), which of them may resolve to private addresses, and the
//! body limit.

use std::net::IpAddr;
use std::sync::Arc;

use super::{HTTP_BODY_BYTES_DEFAULT, HTTP_BODY_MIB_MAX};
use crate::error::{Error, Result};

/// One origin a grant allows: scheme, host and port, as the operator wrote them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpOrigin {
    pub scheme: String,
    /// Lower-case; an IPv6 address keeps its brackets.
    pub host: String,
    pub port: u16,
    /// The grant also lists this origin in `http_private_hosts`: its name may resolve to
    /// loopback, link-local or private addresses. (An IP literal needs no such permission: the
    /// grant names the address itself.)
    pub private_allowed: bool,
}

impl HttpOrigin {
    /// Parses `http://host:port` or `https://host[:port]` (the port defaults by scheme). A path
    /// other than `/`, a query, user information or another scheme is refused, since a grant
    /// names where a plugin may connect, not what it may ask for there.
    pub fn parse(text: &str) -> Result<HttpOrigin> {
        let refuse = |why: &str| {
            Err(Error::InvalidInput(format!(
                "http_hosts entry `{text}`: {why}; write it as scheme://host:port, e.g. https://archive.example:443 or \
                 http://127.0.0.1:9000"
            )))
        };
        let uri: http::Uri = match text.parse() {
            Ok(uri) => uri,
            Err(e) => return refuse(&format!("not a URL ({e})")),
        };
        let scheme = match uri.scheme_str() {
            Some(s @ ("http" | "https")) => s.to_string(),
            Some(other) => return refuse(&format!("scheme `{other}` is neither http nor https")),
            None => return refuse("no scheme"),
        };
        let Some(authority) = uri.authority() else { return refuse("no host") };
        if authority.as_str().contains('@') {
            return refuse("user information is not allowed");
        }
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return refuse("a path or query is not allowed");
        }
        if authority.host().is_empty() {
            return refuse("no host");
        }
        Ok(HttpOrigin {
            port: authority.port_u16().unwrap_or(default_port(&scheme)),
            host: authority.host().to_ascii_lowercase(),
            scheme,
            private_allowed: false,
        })
    }

    /// The origin a request goes to, when its URI names one.
    pub(super) fn of_request(uri: &http::Uri) -> Option<HttpOrigin> {
        let scheme = uri.scheme_str()?.to_ascii_lowercase();
        let authority = uri.authority()?;
        Some(HttpOrigin {
            port: authority.port_u16().unwrap_or(default_port(&scheme)),
            host: authority.host().to_ascii_lowercase(),
            scheme,
            private_allowed: false,
        })
    }

    /// The same scheme, host and port (whatever either allows).
    pub(super) fn same_origin(&self, other: &HttpOrigin) -> bool {
        (&self.scheme, &self.host, self.port) == (&other.scheme, &other.host, other.port)
    }

    /// The address the host names, when it is an IP literal (`127.0.0.1`, `[::1]`).
    pub fn ip_literal(&self) -> Option<IpAddr> {
        let host = self.host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(&self.host);
        host.parse().ok()
    }
}

impl std::fmt::Display for HttpOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
    }
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "https" { 443 } else { 80 }
}

/// What a grant allows over HTTP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGrant {
    pub origins: Vec<HttpOrigin>,
    /// Bytes of one request body or one response body, at most.
    pub body_bytes_max: u64,
}

impl HttpGrant {
    /// The HTTP part of a grant without `http_private_hosts` (`frostline plugin check
    /// --http-host`): see `parse_with_private`.
    pub fn parse(hosts: &[String], body_limit_mib: Option<u64>) -> Result<Option<Arc<HttpGrant>>> {
        Self::parse_with_private(hosts, &[], body_limit_mib)
    }

    /// The HTTP part of a grant: each origin well formed and listed once; each of
    /// `private_hosts` (origins whose names may resolve to loopback, link-local or private
    /// addresses) a name, listed once and also in `hosts`; the body limit within range (and
    /// only beside origins).
    pub fn parse_with_private(
        hosts: &[String],
        private_hosts: &[String],
        body_limit_mib: Option<u64>,
    ) -> Result<Option<Arc<HttpGrant>>> {
        if hosts.is_empty() {
            return match (body_limit_mib, private_hosts.is_empty()) {
                (Some(_), _) => Err(Error::InvalidInput(
                    "http_body_limit_mib without http_hosts limits nothing; list the origins the plugin may reach in \
                     http_hosts, or remove http_body_limit_mib"
                        .into(),
                )),
                (None, false) => Err(Error::InvalidInput(
                    "http_private_hosts without http_hosts allows nothing; list every origin the plugin may reach in \
                     http_hosts, and in http_private_hosts those of them whose names resolve to loopback, link-local \
                     or private addresses"
                        .into(),
                )),
                (None, true) => Ok(None),
            };
        }
        let mut origins: Vec<HttpOrigin> = Vec::new();
        for host in hosts {
            let origin = HttpOrigin::parse(host)?;
            if origins.iter().any(|o| o.same_origin(&origin)) {
                return Err(Error::InvalidInput(format!("http_hosts lists {origin} twice")));
            }
            origins.push(origin);
        }
        let mut private: Vec<HttpOrigin> = Vec::new();
        for host in private_hosts {
            let origin = HttpOrigin::parse(host)?;
            if private.iter().any(|o| o.same_origin(&origin)) {
                return Err(Error::InvalidInput(format!("http_private_hosts lists {origin} twice")));
            }
            if origin.ip_literal().is_some() {
                return Err(Error::InvalidInput(format!(
                    "http_private_hosts lists {origin}, an IP address: an address written in http_hosts is reached \
                     whatever its range, so list it there only"
                )));
            }
            let Some(granted) = origins.iter_mut().find(|o| o.same_origin(&origin)) else {
                return Err(Error::InvalidInput(format!(
                    "http_private_hosts lists {origin}, which http_hosts does not; list it in http_hosts too \
                     (http_private_hosts only lets an origin of http_hosts resolve to private addresses)"
                )));
            };
            granted.private_allowed = true;
            private.push(origin);
        }
        let body_bytes_max = match body_limit_mib {
            None => HTTP_BODY_BYTES_DEFAULT,
            Some(mib @ 1..=HTTP_BODY_MIB_MAX) => mib * 1024 * 1024,
            Some(other) => {
                return Err(Error::InvalidInput(format!(
                    "http_body_limit_mib = {other} is outside 1..={HTTP_BODY_MIB_MAX}"
                )));
            }
        };
        Ok(Some(Arc::new(HttpGrant { origins, body_bytes_max })))
    }

    pub fn describe(&self) -> String {
        let origins: Vec<String> = self
            .origins
            .iter()
            .map(|o| if o.private_allowed { format!("{o} (private addresses allowed)") } else { o.to_string() })
            .collect();
        format!("http to {} (bodies up to {} MiB)", origins.join(", "), self.body_bytes_max / (1024 * 1024))
    }
}

//! Outgoing HTTP for archiver plugins (`wasi:http/outgoing-handler`), under grants.
//!
//! Only the archiver world links `wasi:http` (a strategy or retention policy that imports it is
//! refused at load), and an archiver may reach only the origins its `[[grant]]` lists in
//! `http_hosts`: `scheme://host:port`, compared exactly as written, so a grant for
//! `https://store.example:443` allows neither `http://store.example:80` (a plain-HTTP
//! downgrade) nor another name for the same address. Default deny: without a grant every
//! request fails with `HTTP-request-denied` before any connection is made.
//!
//! The host resolves names and connects itself (the guest never picks an address), never
//! follows a redirect (a 3xx reaches the guest, and a request to its `Location` is checked
//! like any other), bounds every wait by the plugin's time limit (a host call is not
//! interrupted by the epoch deadline, so each wait needs its own), and counts the bytes of
//! each request body and each response body against the grant's limit.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt as _;
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use crate::error::{Error, Result};

/// How long a connection may take to open, at most (the plugin's time limit may be shorter).
pub const HTTP_CONNECT_TIMEOUT_MS_MAX: u64 = 10_000;
/// Bytes of one request body or one response body, by default (`http_body_limit_mib`).
pub const HTTP_BODY_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// The largest `http_body_limit_mib` a grant may set.
pub const HTTP_BODY_MIB_MAX: u64 = 4096;

/// One origin a grant allows: scheme, host and port, as the operator wrote them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpOrigin {
    pub scheme: String,
    /// Lower-case; an IPv6 address keeps its brackets.
    pub host: String,
    pub port: u16,
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
        })
    }

    /// The origin a request goes to, when its URI names one.
    fn of_request(uri: &http::Uri) -> Option<HttpOrigin> {
        let scheme = uri.scheme_str()?.to_ascii_lowercase();
        let authority = uri.authority()?;
        Some(HttpOrigin {
            port: authority.port_u16().unwrap_or(default_port(&scheme)),
            host: authority.host().to_ascii_lowercase(),
            scheme,
        })
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
    /// The HTTP part of a grant: each origin well formed and listed once, the body limit within
    /// range (and only beside origins).
    pub fn parse(hosts: &[String], body_limit_mib: Option<u64>) -> Result<Option<Arc<HttpGrant>>> {
        if hosts.is_empty() {
            return match body_limit_mib {
                Some(_) => Err(Error::InvalidInput(
                    "http_body_limit_mib without http_hosts limits nothing; list the origins the plugin may reach in \
                     http_hosts, or remove http_body_limit_mib"
                        .into(),
                )),
                None => Ok(None),
            };
        }
        let mut origins: Vec<HttpOrigin> = Vec::new();
        for host in hosts {
            let origin = HttpOrigin::parse(host)?;
            if origins.contains(&origin) {
                return Err(Error::InvalidInput(format!("http_hosts lists {origin} twice")));
            }
            origins.push(origin);
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
        let origins: Vec<String> = self.origins.iter().map(ToString::to_string).collect();
        format!("http to {} (bodies up to {} MiB)", origins.join(", "), self.body_bytes_max / (1024 * 1024))
    }
}

/// The `wasi:http` hooks of one plugin instance: its grant (if any), its time limit, and its
/// name for the log lines that say why a request was refused.
pub(crate) struct HttpHooks {
    pub grant: Option<Arc<HttpGrant>>,
    pub call_ms: u64,
    pub plugin_name: Arc<str>,
}

type ResponseFuture = Box<
    dyn Future<
            Output = std::result::Result<
                (http::Response<WasiBody>, Box<dyn Future<Output = std::result::Result<(), HttpError>> + Send>),
                HttpError,
            >,
        > + Send,
>;

impl HttpHooks {
    /// The grant that allows a request to `uri`, or why there is none (logged, and answered
    /// `HTTP-request-denied`).
    fn allow(&self, uri: &http::Uri) -> std::result::Result<Arc<HttpGrant>, String> {
        let Some(grant) = &self.grant else {
            return Err(format!("{uri}: the plugin has no http_hosts grant"));
        };
        let Some(origin) = HttpOrigin::of_request(uri) else {
            return Err(format!("{uri}: the request names no scheme and host"));
        };
        if grant.origins.contains(&origin) {
            Ok(grant.clone())
        } else {
            let granted: Vec<String> = grant.origins.iter().map(ToString::to_string).collect();
            Err(format!("{origin} is not in the grant's http_hosts ({})", granted.join(", ")))
        }
    }

    /// The guest's timeouts, none longer than the plugin's time limit (and the connect timeout
    /// not longer than `HTTP_CONNECT_TIMEOUT_MS_MAX`).
    fn bounded(&self, asked: Option<RequestOptions>) -> RequestOptions {
        let call = Duration::from_millis(self.call_ms);
        let connect_max = call.min(Duration::from_millis(HTTP_CONNECT_TIMEOUT_MS_MAX));
        let asked = asked.unwrap_or_default();
        let within = |asked: Option<Duration>, max: Duration| Some(asked.map_or(max, |a| a.min(max)));
        RequestOptions {
            connect_timeout: within(asked.connect_timeout, connect_max),
            first_byte_timeout: within(asked.first_byte_timeout, call),
            between_bytes_timeout: within(asked.between_bytes_timeout, call),
        }
    }
}

impl WasiHttpHooks for HttpHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = std::result::Result<(), HttpError>> + Send>,
    ) -> ResponseFuture {
        let grant = match self.allow(request.uri()) {
            Ok(grant) => grant,
            Err(why) => {
                tracing::warn!(plugin = &*self.plugin_name, "outgoing HTTP request denied: {why}");
                return Box::new(async { Err(HttpError::HttpRequestDenied) });
            }
        };
        let options = self.bounded(options);
        let max = grant.body_bytes_max;
        let request = request.map(|body| limited(body, max, HttpError::HttpRequestBodySize(Some(max))));
        Box::new(async move {
            let (response, io) = wasmtime_wasi_http::default_send_request(request, Some(options)).await?;
            let response =
                response.map(|body| limited(body.boxed_unsync(), max, HttpError::HttpResponseBodySize(Some(max))));
            Ok((response, Box::new(io) as Box<dyn Future<Output = _> + Send>))
        })
    }

    fn p2_error_from_hyper(&mut self, err: &hyper::Error) -> ErrorCode {
        error_code_of(err)
    }
}

/// The `wasi:http` error code for a failed exchange: a body stopped at the grant's limit says so
/// (hyper reports it as a failed request, with the limit's error as the cause).
fn error_code_of(err: &hyper::Error) -> ErrorCode {
    let limit = std::error::Error::source(err).and_then(|cause| cause.downcast_ref::<HttpError>());
    match limit {
        Some(HttpError::HttpRequestBodySize(n)) => ErrorCode::HttpRequestBodySize(*n),
        Some(HttpError::HttpResponseBodySize(n)) => ErrorCode::HttpResponseBodySize(*n),
        _ => {
            tracing::warn!("outgoing HTTP request failed: {err}");
            ErrorCode::HttpProtocolError
        }
    }
}

/// `body`, failing with `too_large` once more than `max` bytes have passed.
fn limited(body: WasiBody, max: u64, too_large: HttpError) -> WasiBody {
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    let mut too_large = Some(too_large);
    http_body_util::Limited::new(body, max)
        .map_err(move |e| match e.downcast::<HttpError>() {
            Ok(inner) => *inner,
            Err(_) => too_large.take().unwrap_or(HttpError::HttpProtocolError),
        })
        .boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes for a body already in memory.
    fn full(bytes: &'static [u8]) -> WasiBody {
        http_body_util::Full::new(bytes::Bytes::from_static(bytes)).map_err(|never| match never {}).boxed_unsync()
    }

    fn hooks(origins: &[&str]) -> HttpHooks {
        HttpHooks {
            grant: Some(Arc::new(HttpGrant {
                origins: origins.iter().map(|o| HttpOrigin::parse(o).unwrap()).collect(),
                body_bytes_max: 16,
            })),
            call_ms: 2_000,
            plugin_name: "test".into(),
        }
    }

    #[test]
    fn origins_parse_with_default_ports_and_refuse_what_is_not_an_origin() {
        let o = HttpOrigin::parse("https://Store.Example").unwrap();
        assert_eq!((o.scheme.as_str(), o.host.as_str(), o.port), ("https", "store.example", 443));
        assert_eq!(HttpOrigin::parse("http://127.0.0.1:9000/").unwrap().port, 9000);
        for bad in
            ["ftp://x:1", "127.0.0.1:9000", "http://u:p@x:1", "http://x:1/bucket", "http://x:1/?a=b", "nonsense url"]
        {
            let e = HttpOrigin::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("scheme://host:port"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_request_is_allowed_only_to_an_origin_listed_exactly() {
        let h = hooks(&["https://store.example:8443", "http://127.0.0.1:9000"]);
        let allow = |uri: &str| h.allow(&uri.parse().unwrap()).is_ok();
        assert!(allow("https://store.example:8443/o/a"));
        assert!(allow("http://127.0.0.1:9000/o/a?x=1"));
        assert!(!allow("http://store.example:8443/o/a"), "a plain-HTTP downgrade");
        assert!(!allow("https://store.example/o/a"), "another port");
        assert!(!allow("http://localhost:9000/o/a"), "another name for a granted address");
        assert!(!allow("http://127.0.0.2:9000/o/a"), "another host");
        let denied = h.allow(&"http://localhost:9000/".parse().unwrap()).unwrap_err();
        assert!(denied.contains("http://localhost:9000") && denied.contains("http://127.0.0.1:9000"), "{denied}");
        let ungranted = HttpHooks { grant: None, call_ms: 1, plugin_name: "x".into() };
        assert!(ungranted.allow(&"http://127.0.0.1:9000/".parse().unwrap()).unwrap_err().contains("no http_hosts"));
    }

    #[test]
    fn timeouts_are_bounded_by_the_plugins_time_limit() {
        let h = hooks(&["http://127.0.0.1:1"]);
        let asked = RequestOptions { first_byte_timeout: Some(Duration::from_secs(3600)), ..Default::default() };
        let bounded = h.bounded(Some(asked));
        assert_eq!(bounded.first_byte_timeout, Some(Duration::from_millis(2_000)));
        assert_eq!(bounded.between_bytes_timeout, Some(Duration::from_millis(2_000)));
        assert_eq!(bounded.connect_timeout, Some(Duration::from_millis(2_000)));
        let shorter = RequestOptions { connect_timeout: Some(Duration::from_millis(5)), ..Default::default() };
        assert_eq!(h.bounded(Some(shorter)).connect_timeout, Some(Duration::from_millis(5)));
    }

    #[tokio::test]
    async fn a_body_passes_up_to_the_limit_and_fails_past_it() {
        let at_limit = limited(full(b"0123456789abcdef"), 16, HttpError::HttpResponseBodySize(Some(16)));
        assert_eq!(at_limit.collect().await.unwrap().to_bytes().len(), 16);
        let past = limited(full(b"0123456789abcdefg"), 16, HttpError::HttpResponseBodySize(Some(16)));
        assert!(matches!(past.collect().await, Err(HttpError::HttpResponseBodySize(Some(16)))));
    }
}

//! Outgoing HTTP for archiver plugins (`wasi:http/outgoing-handler`), under grants.
//!
//! Only the archiver world links `wasi:http` (a strategy or retention policy that imports it is
//! refused at load), and an archiver may reach only the origins its `[[grant]]` lists in
//! `http_hosts`: `scheme://host:port`, compared exactly as written, so a grant for
//! `https://store.example:443` allows neither `http://store.example:80` (a plain-HTTP
//! downgrade) nor another name for the same address. Default deny: without a grant every
//! request fails with `HTTP-request-denied` before any connection is made.
//!
//! The host resolves names and connects itself (the guest never picks an address), and checks
//! every address a granted name resolves to: a loopback, link-local (the cloud metadata
//! service's 169.254.169.254 among them), private, shared or unspecified address, or an IPv6
//! form of one, fails the request with `destination-IP-prohibited` unless the grant names it
//! explicitly: the `http_hosts` entry is that IP address itself, or the origin is also listed
//! in the grant's `http_private_hosts`. Plain HTTP then connects to the addresses it checked,
//! never to a fresh resolution, so a name that answers differently the second time (DNS
//! rebinding) reaches nothing it was not checked for. HTTPS goes through wasmtime-wasi-http's
//! default sender (rustls with the Mozilla roots), which resolves the name again: there the
//! certificate check for the granted name is what binds the connection to it (see
//! `send_https`).
//!
//! The host never follows a redirect (a 3xx reaches the guest, and a request to its `Location`
//! is checked like any other), bounds every wait by the plugin's time limit (a host call is not
//! interrupted by the epoch deadline, so each wait needs its own), and counts the bytes of each
//! request body and each response body against the grant's limit.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt as _;
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

mod addresses;
mod grant;

pub use addresses::non_public;
use addresses::{check_addresses, resolve};
pub use grant::{HttpGrant, HttpOrigin};

/// How long a connection may take to open, at most (the plugin's time limit may be shorter).
pub const HTTP_CONNECT_TIMEOUT_MS_MAX: u64 = 10_000;
/// Bytes of one request body or one response body, by default (`http_body_limit_mib`).
pub const HTTP_BODY_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// The largest `http_body_limit_mib` a grant may set.
pub const HTTP_BODY_MIB_MAX: u64 = 4096;

/// The `wasi:http` hooks of one plugin instance: its grant (if any), its time limit, and its
/// name for the log lines that say why a request was refused.
pub(crate) struct HttpHooks {
    pub grant: Option<Arc<HttpGrant>>,
    pub call_ms: u64,
    pub plugin_name: Arc<str>,
}

/// What is left of an exchange once its response has arrived: the connection, driven to its end.
type IoFuture = Box<dyn Future<Output = std::result::Result<(), HttpError>> + Send>;

type ResponseFuture =
    Box<dyn Future<Output = std::result::Result<(http::Response<WasiBody>, IoFuture), HttpError>> + Send>;

impl HttpHooks {
    /// The grant that allows a request to `uri`, and its entry for the request's origin, or why
    /// there is none (logged, and answered `HTTP-request-denied`).
    fn allow(&self, uri: &http::Uri) -> std::result::Result<(Arc<HttpGrant>, HttpOrigin), String> {
        let Some(grant) = &self.grant else {
            return Err(format!("{uri}: the plugin has no http_hosts grant"));
        };
        let Some(origin) = HttpOrigin::of_request(uri) else {
            return Err(format!("{uri}: the request names no scheme and host"));
        };
        match grant.origins.iter().find(|o| o.same_origin(&origin)) {
            Some(granted) => Ok((grant.clone(), granted.clone())),
            None => {
                let granted: Vec<String> = grant.origins.iter().map(ToString::to_string).collect();
                Err(format!("{origin} is not in the grant's http_hosts ({})", granted.join(", ")))
            }
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
        let (grant, origin) = match self.allow(request.uri()) {
            Ok(allowed) => allowed,
            Err(why) => {
                tracing::warn!(plugin = &*self.plugin_name, "outgoing HTTP request denied: {why}");
                return Box::new(async { Err(HttpError::HttpRequestDenied) });
            }
        };
        let options = self.bounded(options);
        let plugin_name = self.plugin_name.clone();
        let max = grant.body_bytes_max;
        let request = request.map(|body| limited(body, max, HttpError::HttpRequestBodySize(Some(max))));
        Box::new(async move {
            // Resolving and connecting share the connect timeout, as in the default sender.
            let connect_timeout = options.connect_timeout.unwrap_or(Duration::from_millis(HTTP_CONNECT_TIMEOUT_MS_MAX));
            let deadline = tokio::time::Instant::now() + connect_timeout;
            let addresses = resolve(&origin, deadline).await?;
            if let Err(why) = check_addresses(&origin, &addresses) {
                tracing::warn!(plugin = &*plugin_name, "outgoing HTTP request refused: {why}");
                return Err(HttpError::DestinationIpProhibited);
            }
            let (response, io) = if origin.scheme == "https" {
                send_https(request, options).await?
            } else {
                send_plain(&addresses, deadline, request, options).await?
            };
            let response = response.map(|body| limited(body, max, HttpError::HttpResponseBodySize(Some(max))));
            Ok((response, io))
        })
    }

    fn p2_error_from_hyper(&mut self, err: &hyper::Error) -> ErrorCode {
        error_code_of(err)
    }
}

/// HTTPS through wasmtime-wasi-http's default sender: rustls with the Mozilla roots
/// (webpki-roots) and the granted name as the server name. That sender resolves the name
/// again, so an answer changed since `check_addresses` (DNS rebinding) is not checked; what
/// binds the connection to the granted name is its certificate, which must be valid for that
/// name: an address the name was rebound to receives a TCP connection and a TLS hello naming
/// the granted host, but no request, unless it holds a certificate for that name. (Connecting
/// to the checked addresses as `send_plain` does needs a TLS client of our own with the same
/// roots, and webpki-roots is not a dependency of the engine.)
async fn send_https(
    request: http::Request<WasiBody>,
    options: RequestOptions,
) -> std::result::Result<(http::Response<WasiBody>, IoFuture), HttpError> {
    let (response, io) = wasmtime_wasi_http::default_send_request(request, Some(options)).await?;
    Ok((response.map(|body| body.boxed_unsync()), Box::new(io)))
}

/// Plain HTTP to the addresses that were checked, never to a fresh resolution: tried in order
/// until one connects, by `deadline`. The exchange is the default sender's
/// (`default_send_request`, which takes a name rather than an address): an HTTP/1.1 handshake
/// within the connect timeout, the response head within the first-byte timeout, each next
/// frame of its body within the between-bytes timeout.
async fn send_plain(
    addresses: &[SocketAddr],
    deadline: tokio::time::Instant,
    mut request: http::Request<WasiBody>,
    options: RequestOptions,
) -> std::result::Result<(http::Response<WasiBody>, IoFuture), HttpError> {
    use std::pin::Pin;
    use std::task::{Poll, ready};

    // Always set, by `HttpHooks::bounded`.
    let limit = |asked: Option<Duration>| asked.unwrap_or(Duration::from_millis(HTTP_CONNECT_TIMEOUT_MS_MAX));
    let (connect_timeout, first_byte_timeout) = (limit(options.connect_timeout), limit(options.first_byte_timeout));
    // Tokio's interval panics on a zero period.
    let between_bytes_timeout = limit(options.between_bytes_timeout).max(Duration::from_nanos(1));

    let stream = match tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect(addresses)).await {
        Ok(stream) => stream.map_err(HttpError::Connect)?,
        Err(_) => return Err(HttpError::ConnectionTimeout),
    };
    let handshake = hyper::client::conn::http1::Builder::new().handshake(wasmtime_wasi_http::io::TokioIo::new(stream));
    let (mut sender, conn) =
        tokio::time::timeout(connect_timeout, handshake).await.map_err(|_| HttpError::ConnectionTimeout)??;

    // The request names its scheme and authority, which HTTP/1.1 sends only to a proxy (the
    // `Host` header carries the authority).
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
    *request.uri_mut() =
        http::Uri::builder().path_and_query(path).build().map_err(|_| HttpError::HttpRequestUriInvalid)?;

    let send = async move {
        let response = tokio::time::timeout(first_byte_timeout, sender.send_request(request))
            .await
            .map_err(|_| HttpError::ConnectionReadTimeout)??;
        let mut timeout = tokio::time::interval(between_bytes_timeout);
        timeout.reset();
        Ok::<_, HttpError>(response.map(|incoming| TimedBody { incoming, timeout }.boxed_unsync()))
    };
    let mut send = std::pin::pin!(send);
    let mut conn = Some(conn);
    // Wait for the response while driving the connection.
    let response = std::future::poll_fn(|cx| match send.as_mut().poll(cx) {
        Poll::Ready(result) => Poll::Ready(result),
        Poll::Pending => {
            let Some(driving) = conn.as_mut() else { return Poll::Pending };
            let ended = ready!(Pin::new(driving).poll(cx));
            conn = None;
            match ended {
                Ok(()) => send.as_mut().poll(cx),
                Err(err) => Poll::Ready(Err(HttpError::from(err))),
            }
        }
    })
    .await?;
    let io = async move {
        let Some(conn) = conn else { return Ok(()) };
        conn.await.map_err(|err| if err.is_timeout() { HttpError::HttpResponseTimeout } else { HttpError::from(err) })
    };
    Ok((response, Box::new(io)))
}

/// A response body whose next frame must arrive within the between-bytes timeout (as in the
/// default sender).
struct TimedBody {
    incoming: hyper::body::Incoming,
    timeout: tokio::time::Interval,
}

impl hyper::body::Body for TimedBody {
    type Data = bytes::Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<std::result::Result<hyper::body::Frame<bytes::Bytes>, HttpError>>> {
        use std::task::{Poll, ready};
        match std::pin::Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(if err.is_timeout() {
                HttpError::HttpResponseTimeout
            } else {
                HttpError::from(err)
            }))),
            Poll::Ready(Some(Ok(frame))) => {
                self.timeout.reset();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                ready!(self.timeout.poll_tick(cx));
                Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.incoming.size_hint()
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
    fn private_hosts_mark_their_origins_and_parse_strictly() {
        let hosts = ["http://minio.internal:9000".to_string(), "https://store.example".to_string()];
        let grant =
            HttpGrant::parse_with_private(&hosts, &["HTTP://Minio.Internal:9000/".into()], None).unwrap().unwrap();
        let allowed: Vec<bool> = grant.origins.iter().map(|o| o.private_allowed).collect();
        assert_eq!(allowed, [true, false]);
        assert_eq!(
            grant.describe(),
            "http to http://minio.internal:9000 (private addresses allowed), https://store.example:443 (bodies up to 256 MiB)"
        );
        let refusal = |private: &[&str], hosts: &[String]| {
            let private: Vec<String> = private.iter().map(ToString::to_string).collect();
            HttpGrant::parse_with_private(hosts, &private, None).unwrap_err().to_string()
        };
        let e = refusal(&["http://other.internal:9000"], &hosts);
        assert!(e.contains("http://other.internal:9000, which http_hosts does not"), "{e}");
        let e = refusal(&["http://minio.internal:9000", "http://minio.internal:9000/"], &hosts);
        assert!(e.contains("http_private_hosts lists http://minio.internal:9000 twice"), "{e}");
        let e = refusal(&["http://127.0.0.1:9000"], &["http://127.0.0.1:9000".into()]);
        assert!(e.contains("an IP address") && e.contains("list it there only"), "{e}");
        let e = refusal(&["http://minio.internal:9000"], &[]);
        assert!(e.contains("http_private_hosts without http_hosts"), "{e}");
        let e = refusal(&["minio.internal:9000"], &hosts);
        assert!(e.contains("scheme://host:port"), "{e}");
    }

    #[test]
    fn loopback_link_local_private_and_unspecified_addresses_are_told_from_public_ones() {
        let class = |text: &str| non_public(text.parse().unwrap());
        for (address, expected) in [
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("::1", "loopback"),
            ("169.254.169.254", "link-local"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("fc00::1", "private"),
            ("fd12:3456::1", "private"),
            ("fec0::1", "private"),
            ("100.64.0.1", "shared"),
            ("100.100.100.200", "shared"),
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "unspecified"),
            ("::", "unspecified"),
            ("255.255.255.255", "broadcast"),
            // IPv4 written as IPv6: mapped, compatible, NAT64.
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::ffff:10.0.0.1", "private"),
            ("::127.0.0.1", "loopback"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
        ] {
            assert_eq!(class(address), Some(expected), "{address}");
        }
        for public in [
            "93.184.216.34",
            "172.15.255.255",
            "172.32.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "169.253.1.1",
            "8.8.8.8",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert_eq!(class(public), None, "{public}");
        }
    }

    #[test]
    fn a_name_may_resolve_to_a_private_address_only_when_the_grant_names_it() {
        let at = |text: &str| -> Vec<SocketAddr> { vec![text.parse().unwrap()] };
        let name = HttpOrigin::parse("http://store.example:9000").unwrap();
        assert!(check_addresses(&name, &at("93.184.216.34:9000")).is_ok());
        for address in
            ["127.0.0.1:9000", "[::1]:9000", "169.254.169.254:9000", "10.0.0.5:9000", "[::ffff:127.0.0.1]:9000"]
        {
            let why = check_addresses(&name, &at(address)).unwrap_err();
            let ip = address.parse::<SocketAddr>().unwrap().ip().to_string();
            assert!(
                why.contains(&format!("store.example resolves to {ip} (")) && why.contains("http_private_hosts"),
                "{address}: {why}"
            );
        }
        // One private address among public ones is enough to refuse.
        let mixed: Vec<SocketAddr> = vec!["93.184.216.34:9000".parse().unwrap(), "127.0.0.1:9000".parse().unwrap()];
        let why = check_addresses(&name, &mixed).unwrap_err();
        assert!(why.contains("127.0.0.1 (loopback)") && why.contains("http://127.0.0.1:9000"), "{why}");
        // Named explicitly: by the address itself, or through http_private_hosts.
        let literal = HttpOrigin::parse("http://127.0.0.1:9000").unwrap();
        assert!(check_addresses(&literal, &at("127.0.0.1:9000")).is_ok());
        let literal6 = HttpOrigin::parse("http://[::1]:9000").unwrap();
        assert_eq!(literal6.ip_literal(), Some("::1".parse().unwrap()));
        let private = HttpOrigin { private_allowed: true, ..name };
        assert!(check_addresses(&private, &mixed).is_ok());
    }

    #[tokio::test]
    async fn an_ip_literal_is_not_looked_up_and_a_name_is() {
        let soon = tokio::time::Instant::now() + Duration::from_secs(5);
        let literal = HttpOrigin::parse("http://[::1]:9000").unwrap();
        assert_eq!(resolve(&literal, soon).await.unwrap(), ["[::1]:9000".parse().unwrap()]);
        let localhost = HttpOrigin::parse("http://localhost:9000").unwrap();
        let found = resolve(&localhost, soon).await.unwrap();
        assert!(!found.is_empty() && found.iter().all(|a| a.ip().is_loopback() && a.port() == 9000), "{found:?}");
        let why = check_addresses(&localhost, &found).unwrap_err();
        assert!(why.contains("localhost resolves to") && why.contains("(loopback)"), "{why}");
        let missing = HttpOrigin::parse("http://frostline-test.invalid:9000").unwrap();
        assert!(matches!(resolve(&missing, soon).await, Err(HttpError::DnsError { .. } | HttpError::DnsTimeout)));
    }

    /// A server on 127.0.0.1 that reads (the start of) one request, writes `answer`, and then
    /// holds the connection open without a word.
    async fn stalling_server(answer: &'static [u8]) -> SocketAddr {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = socket.read(&mut request).await;
            socket.write_all(answer).await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        address
    }

    fn get(address: SocketAddr) -> http::Request<WasiBody> {
        http::Request::get(format!("http://{address}/o/a")).header("host", address.to_string()).body(full(b"")).unwrap()
    }

    #[tokio::test]
    async fn plain_http_goes_to_the_checked_addresses_and_each_wait_ends_at_its_timeout() {
        let ms = Duration::from_millis;
        let options = RequestOptions {
            connect_timeout: Some(ms(2_000)),
            first_byte_timeout: Some(ms(200)),
            between_bytes_timeout: Some(ms(200)),
        };
        let deadline = || tokio::time::Instant::now() + ms(2_000);
        let started = std::time::Instant::now();

        // The request goes to the addresses given, not to what its URI names (a name that does
        // not resolve here); an address that refuses is passed over for the next one.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let whole = stalling_server(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        let mut named = get(whole);
        *named.uri_mut() = "http://frostline-test.invalid:1/o/a".parse().unwrap();
        let (response, io) = send_plain(&[closed, whole], deadline(), named, options).await.unwrap();
        tokio::spawn(std::pin::Pin::from(io));
        assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), &b"ok"[..]);
        let refused = send_plain(&[closed], deadline(), get(closed), options).await.err().unwrap();
        assert!(matches!(refused, HttpError::Connect(_)), "{refused:?}");

        // No answer: the first byte's wait ends.
        let silent = stalling_server(b"").await;
        let waited = send_plain(&[silent], deadline(), get(silent), options).await.err().unwrap();
        assert!(matches!(waited, HttpError::ConnectionReadTimeout), "{waited:?}");

        // Half a body: the wait between bytes ends.
        let half = stalling_server(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n01234").await;
        let (response, io) = send_plain(&[half], deadline(), get(half), options).await.unwrap();
        tokio::spawn(std::pin::Pin::from(io));
        let stalled = response.into_body().collect().await.err().unwrap();
        assert!(matches!(stalled, HttpError::ConnectionReadTimeout), "{stalled:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
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

//! Example archiver backend `http-archiver`: stores each object in an HTTP object server
//! through `wasi:http`, which the host links for archivers only and allows only to the origins
//! the plugin's `[[grant]]` lists in `http_hosts`.
//!
//! Config `{"url": "http://127.0.0.1:9000/objects"}`: the server's base URL (http or https; a
//! path prefix is kept, without a trailing `/`).
//!
//! The protocol (a small subset of WebDAV and S3 that most object servers can front):
//! - `PUT {url}/{key}` with `If-None-Match: *` stores the body; a 2xx answer means stored
//!   durably, `412` that the key exists (`already-exists`, left unchanged).
//! - `GET {url}/{key}` answers the bytes (`200`) or `404` (`not-found`).
//! - `DELETE {url}/{key}` answers 2xx, or `404` when there was nothing (both ok).
//! - `GET {url}/?prefix=P&after=A&limit=N` answers the keys that start with `P`, strictly after
//!   `A` when given, ascending, at most `N`, one per line (`text/plain`).
//!
//! Keys are percent-encoded in the path except for `/` and unreserved characters. A `307` or
//! `308` is followed (at most `REDIRECTS_MAX` times) by a new request to its `Location`, which
//! the host checks against the grant like any other: a redirect cannot lead the plugin to a
//! host the operator did not list. `5xx`, `408` and `429` answers, and failures to connect, are
//! transient (the engine retries); other answers and a request the host denies are permanent.

mod bindings {
    wit_bindgen::generate!({ path: "../../../wit", world: "archiver" });
}

use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::{Read as _, Write as _};

use bindings::exports::frostline::plugin::backend::Guest as BackendGuest;
use bindings::frostline::plugin::types::BackendError;
use serde::Deserialize;
use wasip2::http::outgoing_handler;
use wasip2::http::types::{ErrorCode, Fields, IncomingBody, Method, OutgoingBody, OutgoingRequest, Scheme};

const KEY_BYTES_MAX: usize = 1024;
/// Redirects followed for one call, at most.
const REDIRECTS_MAX: usize = 3;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    url: String,
}

/// The parsed base URL.
#[derive(Clone)]
struct Base {
    scheme: Scheme,
    authority: String,
    /// The path prefix, without a trailing `/` (may be empty).
    path: String,
}

thread_local! {
    static BASE: RefCell<Option<Base>> = const { RefCell::new(None) };
}

/// Splits `http[s]://authority[/path]`.
fn parse_url(url: &str) -> Result<Base, String> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (Scheme::Https, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (Scheme::Http, rest)
    } else {
        return Err(format!("http-archiver: url `{url}` must start with http:// or https://"));
    };
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("http-archiver: url `{url}` needs a host (and no user information)"));
    }
    if path.contains(['?', '#']) {
        return Err(format!("http-archiver: url `{url}` must not have a query or fragment"));
    }
    let path = path.trim_end_matches('/');
    let path = if path.is_empty() { String::new() } else { format!("/{path}") };
    Ok(Base { scheme, authority: authority.to_string(), path })
}

fn base() -> Result<Base, BackendError> {
    BASE.with_borrow(|b| b.clone()).ok_or_else(|| BackendError::Permanent("http-archiver: init was not called".into()))
}

/// Percent-encodes `text`, keeping unreserved characters and, with `keep_slash`, `/`.
fn encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn check_key(key: &str) -> Result<(), BackendError> {
    if key.is_empty() || key.len() > KEY_BYTES_MAX {
        return Err(BackendError::Permanent(format!("http-archiver: a key is 1 to {KEY_BYTES_MAX} bytes")));
    }
    Ok(())
}

/// An answer: status and body.
struct Answer {
    status: u16,
    location: Option<String>,
    body: Vec<u8>,
}

/// The transport's failures: denied by the host's grant check, and anything that cannot pass
/// on a retry, are permanent; a connection that failed or timed out is transient.
fn transport_error(what: &str, e: &ErrorCode) -> BackendError {
    let message = format!("http-archiver: {what}: {e:?}");
    match e {
        ErrorCode::HttpRequestDenied => BackendError::Permanent(format!(
            "{message} (the host refused it: the origin is not in the grant's http_hosts)"
        )),
        ErrorCode::DnsTimeout
        | ErrorCode::DnsError(_)
        | ErrorCode::DestinationNotFound
        | ErrorCode::DestinationUnavailable
        | ErrorCode::ConnectionRefused
        | ErrorCode::ConnectionTerminated
        | ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionReadTimeout
        | ErrorCode::ConnectionWriteTimeout
        | ErrorCode::ConnectionLimitReached
        | ErrorCode::HttpResponseIncomplete
        | ErrorCode::HttpResponseTimeout => BackendError::Transient(message),
        _ => BackendError::Permanent(message),
    }
}

/// Sends one request to `scheme://authority{path_and_query}` and reads the whole answer.
fn send_once(
    method: &Method,
    scheme: &Scheme,
    authority: &str,
    path_and_query: &str,
    headers: &[(&str, &[u8])],
    body: Option<&[u8]>,
) -> Result<Answer, BackendError> {
    let scheme_name = match scheme {
        Scheme::Http => "http",
        Scheme::Https => "https",
        Scheme::Other(other) => other.as_str(),
    };
    let what = format!("{method:?} {scheme_name}://{authority}{path_and_query}");
    let internal = |step: &str| BackendError::Permanent(format!("http-archiver: {what}: {step}"));
    let fields = Fields::new();
    for (name, value) in headers {
        fields.append(name, value).map_err(|e| internal(&format!("header {name}: {e:?}")))?;
    }
    let request = OutgoingRequest::new(fields);
    request.set_method(method).map_err(|()| internal("method"))?;
    request.set_scheme(Some(scheme)).map_err(|()| internal("scheme"))?;
    request.set_authority(Some(authority)).map_err(|()| internal("authority"))?;
    request.set_path_with_query(Some(path_and_query)).map_err(|()| internal("path"))?;
    let outgoing = request.body().map_err(|()| internal("request body"))?;
    // Sent first, so the host takes the body as it is written (it buffers little).
    let response = outgoing_handler::handle(request, None).map_err(|e| transport_error(&what, &e))?;
    // A server may answer (a redirect, a refusal) without reading the whole body, and the host
    // stops a body past the grant's limit: either way the write fails, and the answer (or the
    // host's error code) says why.
    let sent = match body {
        Some(bytes) if !bytes.is_empty() => write_body(&outgoing, bytes),
        _ => Ok(()),
    };
    let finished = match sent {
        Ok(()) => OutgoingBody::finish(outgoing, None).map_err(|e| transport_error(&what, &e)),
        Err(e) => {
            drop(outgoing);
            Err(BackendError::Transient(format!("http-archiver: {what}: sending: {e}")))
        }
    };
    let incoming = loop {
        match response.get() {
            Some(answer) => break answer,
            None => response.subscribe().block(),
        }
    };
    let incoming = incoming.map_err(|()| internal("response taken twice"))?.map_err(|e| transport_error(&what, &e))?;
    if let Err(e) = finished
        && !matches!(incoming.status(), 300..=599)
    {
        return Err(e);
    }
    let status = incoming.status();
    let location = incoming.headers().get("location").first().and_then(|v| String::from_utf8(v.clone()).ok());
    let consumed = incoming.consume().map_err(|()| internal("response body"))?;
    let mut stream = consumed.stream().map_err(|()| internal("response body stream"))?;
    let mut body = Vec::new();
    stream
        .read_to_end(&mut body)
        .map_err(|e| BackendError::Transient(format!("http-archiver: {what}: receiving: {e}")))?;
    drop(stream);
    drop(IncomingBody::finish(consumed));
    Ok(Answer { status, location, body })
}

fn write_body(outgoing: &OutgoingBody, bytes: &[u8]) -> std::io::Result<()> {
    let mut stream = outgoing.write().map_err(|()| std::io::Error::other("no request body stream"))?;
    stream.write_all(bytes)?;
    std::io::Write::flush(&mut stream)
}

/// Sends a request, following `307` and `308` redirects (each checked by the host).
fn send(
    method: Method,
    path_and_query: &str,
    headers: &[(&str, &[u8])],
    body: Option<&[u8]>,
) -> Result<Answer, BackendError> {
    let base = base()?;
    let (mut scheme, mut authority, mut target) = (base.scheme, base.authority, path_and_query.to_string());
    for _ in 0..=REDIRECTS_MAX {
        let answer = send_once(&method, &scheme, &authority, &target, headers, body)?;
        if !matches!(answer.status, 307 | 308) {
            return Ok(answer);
        }
        let location = answer.location.ok_or_else(|| {
            BackendError::Permanent(format!("http-archiver: {target}: a {} without a Location", answer.status))
        })?;
        let (url, query) = location.split_once('?').map_or((location.as_str(), None), |(u, q)| (u, Some(q)));
        let next = parse_url(url).map_err(BackendError::Permanent)?;
        (scheme, authority) = (next.scheme, next.authority);
        target = if next.path.is_empty() { "/".into() } else { next.path };
        if url.ends_with('/') {
            target.push('/');
        }
        if let Some(query) = query {
            target = format!("{target}?{query}");
        }
    }
    Err(BackendError::Permanent(format!("http-archiver: more than {REDIRECTS_MAX} redirects for {path_and_query}")))
}

/// Maps an answer that is not what the call expects.
fn unexpected(what: &str, answer: &Answer) -> BackendError {
    let text = String::from_utf8_lossy(&answer.body[..answer.body.len().min(200)]).into_owned();
    let message = format!("http-archiver: {what}: the server answered {}: {text}", answer.status);
    if answer.status >= 500 || answer.status == 408 || answer.status == 429 {
        BackendError::Transient(message)
    } else {
        BackendError::Permanent(message)
    }
}

fn object_path(key: &str) -> Result<String, BackendError> {
    check_key(key)?;
    Ok(format!("{}/{}", base()?.path, encode(key, true)))
}

fn put(key: &str, bytes: &[u8]) -> Result<(), BackendError> {
    let path = object_path(key)?;
    // No content-length: the body goes chunked, and the stream stays open until it is finished.
    let headers: [(&str, &[u8]); 2] = [("if-none-match", b"*"), ("content-type", b"application/octet-stream")];
    let answer = send(Method::Put, &path, &headers, Some(bytes))?;
    match answer.status {
        200..=299 => Ok(()),
        412 => Err(BackendError::AlreadyExists),
        _ => Err(unexpected(&format!("PUT {key}"), &answer)),
    }
}

fn get(key: &str) -> Result<Vec<u8>, BackendError> {
    let answer = send(Method::Get, &object_path(key)?, &[], None)?;
    match answer.status {
        200 => Ok(answer.body),
        404 => Err(BackendError::NotFound),
        _ => Err(unexpected(&format!("GET {key}"), &answer)),
    }
}

fn delete(key: &str) -> Result<(), BackendError> {
    let answer = send(Method::Delete, &object_path(key)?, &[], None)?;
    match answer.status {
        200..=299 | 404 => Ok(()),
        _ => Err(unexpected(&format!("DELETE {key}"), &answer)),
    }
}

fn list(prefix: &str, after: Option<&str>, limit: u32) -> Result<Vec<String>, BackendError> {
    let mut query = format!("{}/?prefix={}&limit={limit}", base()?.path, encode(prefix, false));
    if let Some(after) = after {
        let _ = write!(query, "&after={}", encode(after, false));
    }
    let answer = send(Method::Get, &query, &[], None)?;
    if answer.status != 200 {
        return Err(unexpected(&format!("list {prefix}"), &answer));
    }
    let text = String::from_utf8(answer.body)
        .map_err(|_| BackendError::Permanent("http-archiver: the listing is not UTF-8".into()))?;
    Ok(text.lines().filter(|line| !line.is_empty()).map(str::to_string).collect())
}

struct Component;

impl bindings::Guest for Component {
    fn init(config: String) -> Result<(), String> {
        let config: Config = serde_json::from_str(&config)
            .map_err(|e| format!("http-archiver: config must be {{\"url\": \"http://host:port/path\"}}: {e}"))?;
        let base = parse_url(&config.url)?;
        BASE.with_borrow_mut(|b| *b = Some(base));
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
    fn urls_split_into_scheme_authority_and_path() {
        let b = parse_url("http://127.0.0.1:9000/objects/").unwrap();
        assert!(matches!(b.scheme, Scheme::Http));
        assert_eq!((b.authority.as_str(), b.path.as_str()), ("127.0.0.1:9000", "/objects"));
        assert_eq!(parse_url("https://store.example").unwrap().path, "");
        for bad in ["ftp://x", "http://", "http://u@x/", "http://x/a?b"] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_are_percent_encoded_except_slashes_and_unreserved_characters() {
        assert_eq!(encode("table=t/bucket=year:2024/seg-1.jsonl", true), "table%3Dt/bucket%3Dyear%3A2024/seg-1.jsonl");
        assert_eq!(encode("a/b c", false), "a%2Fb%20c");
    }
}

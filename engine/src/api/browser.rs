//! The checks that keep a web browser on the same host from using the API on a page's behalf.
//!
//! Without tokens the engine serves only on loopback and treats every request as admin, so a
//! page open in a browser on that host could otherwise POST records (a `text/plain` body needs
//! no CORS preflight), place or lift holds, or, through DNS rebinding, read every record. With
//! no token configured, a request must name a loopback host in `Host` (a rebound name is not
//! one), and an `Origin` header, which browsers send on cross-origin requests, must be the
//! engine's own. With or without tokens, a state-changing request that carries a body or a
//! `Content-Type` must declare JSON or JSON lines, which a page cannot send across origins
//! without a preflight this API never grants.

use axum::http::{HeaderMap, Method, StatusCode, header};

use super::ApiError;

/// The media types a state-changing request may declare (parameters such as `charset` aside).
pub const STATE_CHANGE_CONTENT_TYPES: &[&str] =
    &["application/json", "application/x-ndjson", "application/jsonl", "application/json-lines"];

/// `Ok` when the request may go on; otherwise the 403 or 415 answer, saying why and what to do.
/// `tokens_configured`: whether the API requires tokens (then only the content-type rule
/// applies: a browser cannot attach the token without a preflight).
pub fn check(method: &Method, headers: &HeaderMap, tokens_configured: bool) -> Result<(), ApiError> {
    if !tokens_configured {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !is_loopback_host(host) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "without tokens the API answers only requests addressed to a loopback host (localhost, \
                     127.0.0.1, [::1]), not `Host: {host}`; to serve other names, configure tokens \
                     (FROSTLINE_TOKENS and FROSTLINE_ADMIN_TOKENS, or --token-file and --admin-token-file)"
                ),
            ));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("");
            let own = [format!("http://{host}"), format!("https://{host}")];
            if !own.iter().any(|o| o.eq_ignore_ascii_case(origin)) {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    format!(
                        "a request from the web origin `{origin}` is refused: without tokens the API answers \
                         only its own origin (http://{host}), so a web page cannot use it; call it from a \
                         program (which sends no Origin), or configure tokens (FROSTLINE_TOKENS and \
                         FROSTLINE_ADMIN_TOKENS)"
                    ),
                ));
            }
        }
    }
    let changes_state = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    let content_type = headers.get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or("(not text)"));
    let has_body = headers.get(header::TRANSFER_ENCODING).is_some()
        || headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).is_some_and(|length| length.trim() != "0");
    if changes_state && (has_body || content_type.is_some()) {
        let declared = content_type.unwrap_or("none");
        let media_type = declared.split(';').next().unwrap_or("").trim();
        if !STATE_CHANGE_CONTENT_TYPES.iter().any(|t| t.eq_ignore_ascii_case(media_type)) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!(
                    "a {method} with a body must declare it as JSON or JSON lines (Content-Type: {}), not `{declared}`; \
                     with curl, add -H 'Content-Type: application/json' (or application/x-ndjson for JSON lines)",
                    STATE_CHANGE_CONTENT_TYPES.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Whether a `Host` header value names this machine's loopback interface: `localhost`, an
/// address in 127.0.0.0/8 or `::1`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((address, port)) if port.is_empty() || port.starts_with(':') => address,
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if !name.contains(':') && port.chars().all(|c| c.is_ascii_digit()) => name,
            Some(_) => return false,
            None => host,
        }
    };
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn status(method: Method, pairs: &[(header::HeaderName, &str)], tokens: bool) -> u16 {
        match check(&method, &headers(pairs), tokens) {
            Ok(()) => 200,
            Err(e) => e.status.as_u16(),
        }
    }

    #[test]
    fn loopback_hosts_are_recognised_and_others_are_not() {
        for host in
            ["localhost", "LOCALHOST:7070", "127.0.0.1", "127.0.0.1:7070", "127.1.2.3:80", "[::1]", "[::1]:7070"]
        {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in
            ["", "example.com", "evil.localhost.example", "10.0.0.1:7070", "[::2]:7070", "127.0.0.1:x", "[::1]x", "::1"]
        {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn without_tokens_a_rebound_host_or_a_foreign_origin_is_refused() {
        let host = (header::HOST, "127.0.0.1:7070");
        assert_eq!(status(Method::GET, std::slice::from_ref(&host), false), 200);
        assert_eq!(status(Method::GET, &[(header::HOST, "attacker.example:7070")], false), 403);
        assert_eq!(status(Method::GET, &[], false), 403, "no Host at all");
        assert_eq!(status(Method::GET, &[host.clone(), (header::ORIGIN, "http://127.0.0.1:7070")], false), 200);
        assert_eq!(status(Method::GET, &[host.clone(), (header::ORIGIN, "https://evil.example")], false), 403);
        assert_eq!(status(Method::GET, &[host.clone(), (header::ORIGIN, "null")], false), 403);
        // With tokens, the token is the guard: a browser cannot attach it without a preflight.
        assert_eq!(status(Method::GET, &[(header::HOST, "archive.example:7070")], true), 200);
        assert_eq!(status(Method::GET, &[(header::ORIGIN, "https://evil.example")], true), 200);
    }

    #[test]
    fn a_state_change_must_declare_json_or_json_lines() {
        let host = (header::HOST, "localhost:7070");
        for tokens in [false, true] {
            let post = |pairs: &[(header::HeaderName, &str)]| {
                let mut all = vec![host.clone()];
                all.extend_from_slice(pairs);
                status(Method::POST, &all, tokens)
            };
            assert_eq!(post(&[(header::CONTENT_TYPE, "application/json"), (header::CONTENT_LENGTH, "2")]), 200);
            assert_eq!(
                post(&[(header::CONTENT_TYPE, "application/x-ndjson; charset=utf-8"), (header::CONTENT_LENGTH, "9")]),
                200
            );
            assert_eq!(post(&[]), 200, "no body, no Content-Type: archive now, reload");
            assert_eq!(post(&[(header::CONTENT_LENGTH, "0")]), 200);
            assert_eq!(post(&[(header::CONTENT_TYPE, "text/plain"), (header::CONTENT_LENGTH, "9")]), 415);
            assert_eq!(post(&[(header::CONTENT_TYPE, "application/x-www-form-urlencoded")]), 415);
            assert_eq!(post(&[(header::CONTENT_LENGTH, "9")]), 415, "a body without a Content-Type");
            assert_eq!(post(&[(header::TRANSFER_ENCODING, "chunked")]), 415);
            assert_eq!(status(Method::GET, &[host.clone(), (header::CONTENT_TYPE, "text/plain")], tokens), 200);
            assert_eq!(status(Method::DELETE, &[host.clone(), (header::CONTENT_TYPE, "text/plain")], tokens), 415);
        }
    }
}

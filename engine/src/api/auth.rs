//! Bearer tokens: loaded once at start from files and the environment, kept only as SHA-256
//! digests, and compared in constant time. Admin tokens are valid on every route; ordinary
//! tokens on every route but the admin ones. With no token configured at all, the API
//! requires none; `ServeArgs::validate` allows that only on a loopback address.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{ApiError, ApiState};
use crate::error::{Error, Result};

/// A token shorter than this is refused at start: it could be guessed.
pub const TOKEN_BYTES_MIN: usize = 16;
/// Tokens per file or variable at most (each request compares against all of them).
pub const TOKENS_MAX: usize = 1_000;

/// What a route requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No token (health).
    Public,
    /// Any valid token.
    Token,
    /// An admin token.
    Admin,
}

/// What a request's token grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Grant {
    None,
    Token,
    Admin,
}

type Digest32 = [u8; 32];

/// The configured tokens, as digests.
#[derive(Clone, Default)]
pub struct Auth {
    tokens: Arc<Vec<Digest32>>,
    admin_tokens: Arc<Vec<Digest32>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("tokens", &self.tokens.len())
            .field("admin_tokens", &self.admin_tokens.len())
            .finish()
    }
}

fn digest(token: &[u8]) -> Digest32 {
    Sha256::digest(token).into()
}

/// Tokens from a file (one per line, blank lines and `#` comments skipped) or a
/// comma-separated variable; `origin` names the source in errors.
fn parse_tokens(text: &str, separator: char, origin: &str) -> Result<Vec<Digest32>> {
    let mut out = Vec::new();
    for (n, raw) in text.split(separator).enumerate() {
        let token = raw.trim();
        if token.is_empty() || token.starts_with('#') {
            continue;
        }
        let place =
            if separator == '\n' { format!("{origin} line {}", n + 1) } else { format!("{origin} entry {}", n + 1) };
        if token.len() < TOKEN_BYTES_MIN {
            return Err(Error::InvalidInput(format!(
                "{place}: a token must be at least {TOKEN_BYTES_MIN} characters (TOKEN_BYTES_MIN); generate one with \
                 `openssl rand -hex 32`"
            )));
        }
        if !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(Error::InvalidInput(format!("{place}: a token must be visible ASCII without spaces")));
        }
        out.push(digest(token.as_bytes()));
    }
    if out.len() > TOKENS_MAX {
        return Err(Error::InvalidInput(format!("{origin}: {} tokens; at most {TOKENS_MAX} (TOKENS_MAX)", out.len())));
    }
    Ok(out)
}

fn load_set(file: Option<&Path>, variable: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<Digest32>> {
    let mut out = Vec::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::InvalidInput(format!("cannot read token file {}: {e}", path.display())))?;
        out.extend(parse_tokens(&text, '\n', &path.display().to_string())?);
    }
    if let Some(text) = env(variable) {
        out.extend(parse_tokens(&text, ',', variable)?);
    }
    Ok(out)
}

impl Auth {
    /// Loads `--token-file` and FROSTLINE_TOKENS, `--admin-token-file` and
    /// FROSTLINE_ADMIN_TOKENS.
    pub fn load(
        token_file: Option<&Path>,
        admin_token_file: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Auth> {
        Ok(Auth {
            tokens: Arc::new(load_set(token_file, "FROSTLINE_TOKENS", env)?),
            admin_tokens: Arc::new(load_set(admin_token_file, "FROSTLINE_ADMIN_TOKENS", env)?),
        })
    }

    /// No token is configured: every request is allowed (loopback only).
    pub fn is_disabled(&self) -> bool {
        self.tokens.is_empty() && self.admin_tokens.is_empty()
    }

    pub fn has_admin_tokens(&self) -> bool {
        !self.admin_tokens.is_empty()
    }

    /// What `token` grants. Every configured digest is compared, in constant time each, so the
    /// time taken does not depend on which token (if any) matched.
    pub fn grant(&self, token: Option<&str>) -> Grant {
        if self.is_disabled() {
            return Grant::Admin;
        }
        let Some(token) = token else { return Grant::None };
        let presented = digest(token.as_bytes());
        let matches = |set: &[Digest32]| {
            set.iter().fold(subtle::Choice::from(0u8), |found, d| found | d.ct_eq(&presented)).into()
        };
        let (admin, ordinary): (bool, bool) = (matches(&self.admin_tokens), matches(&self.tokens));
        if admin {
            Grant::Admin
        } else if ordinary {
            Grant::Token
        } else {
            Grant::None
        }
    }

    /// `Ok` when `grant` suffices for `access`; otherwise the 401 or 403 answer.
    pub fn check(&self, access: Access, grant: Grant) -> std::result::Result<(), ApiError> {
        match (access, grant) {
            (Access::Public, _) | (Access::Token, Grant::Token | Grant::Admin) | (Access::Admin, Grant::Admin) => {
                Ok(())
            }
            (_, Grant::None) => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a valid bearer token is required: send `Authorization: Bearer <token>`",
            )),
            (Access::Admin, Grant::Token) => {
                Err(ApiError::new(StatusCode::FORBIDDEN, "forbidden", "this route needs an admin token"))
            }
        }
    }
}

/// The bearer token of a request, if it sent one.
fn bearer(request: &Request) -> Option<&str> {
    let value = request.headers().get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The matched route template, passed to the request logger through the response.
#[derive(Debug, Clone)]
pub struct RouteTemplate(pub String);

/// Middleware on every matched route: refuses what a browser could send on a page's behalf
/// (`browser::check`), looks the route's access up in `ROUTES` and refuses a request whose
/// token does not suffice, before the handler runs (so a refused request changes nothing).
pub async fn authorise(State(state): State<Arc<ApiState>>, request: Request, next: Next) -> Response {
    let template = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_default();
    // axum answers HEAD with the GET handler: it needs what GET needs.
    let method = if request.method() == Method::HEAD { "GET" } else { request.method().as_str() };
    let mut response = match super::route_access(method, &template) {
        None => ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{} is not served on {template}", request.method()),
        )
        .into_response(),
        Some(access) => {
            let allowed = super::browser::check(request.method(), request.headers(), !state.auth.is_disabled())
                .and_then(|()| state.auth.check(access, state.auth.grant(bearer(&request))));
            match allowed {
                Ok(()) => next.run(request).await,
                Err(refusal) => refusal.into_response(),
            }
        }
    };
    response.extensions_mut().insert(RouteTemplate(template));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef-user";
    const ADMIN: &str = "0123456789abcdef-admin";

    fn auth() -> Auth {
        let env = |name: &str| match name {
            "FROSTLINE_TOKENS" => Some(format!(" {TOKEN} ,, ")),
            "FROSTLINE_ADMIN_TOKENS" => Some(ADMIN.to_string()),
            _ => None,
        };
        Auth::load(None, None, &env).unwrap()
    }

    #[test]
    fn tokens_grant_their_level_and_nothing_else() {
        let auth = auth();
        assert_eq!(auth.grant(Some(TOKEN)), Grant::Token);
        assert_eq!(auth.grant(Some(ADMIN)), Grant::Admin);
        assert_eq!(auth.grant(Some("0123456789abcdef-other")), Grant::None);
        assert_eq!(auth.grant(Some("")), Grant::None);
        assert_eq!(auth.grant(None), Grant::None);
        assert!(auth.check(Access::Token, Grant::Token).is_ok());
        assert!(auth.check(Access::Token, Grant::Admin).is_ok());
        assert_eq!(auth.check(Access::Admin, Grant::Token).unwrap_err().status, StatusCode::FORBIDDEN);
        assert_eq!(auth.check(Access::Token, Grant::None).unwrap_err().status, StatusCode::UNAUTHORIZED);
        assert!(auth.check(Access::Public, Grant::None).is_ok());
    }

    #[test]
    fn token_files_skip_comments_and_short_tokens_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, format!("# operators\n\n{TOKEN}\n")).unwrap();
        let auth = Auth::load(Some(&file), None, &|_| None).unwrap();
        assert_eq!(auth.grant(Some(TOKEN)), Grant::Token);
        assert!(!auth.has_admin_tokens());
        std::fs::write(&file, "short\n").unwrap();
        let err = Auth::load(Some(&file), None, &|_| None).unwrap_err().to_string();
        assert!(err.contains("line 1") && err.contains("TOKEN_BYTES_MIN"), "{err}");
    }

    #[test]
    fn without_tokens_everything_is_granted() {
        let auth = Auth::load(None, None, &|_| None).unwrap();
        assert!(auth.is_disabled());
        assert_eq!(auth.grant(None), Grant::Admin);
    }
}

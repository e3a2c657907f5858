//! Bearer tokens: read from files and the environment, kept only as SHA-256 digests, compared
//! in constant time, and read again from their files on SIGHUP and whenever a file changes
//! (`reload_tokens`), so rotation needs no restart. Admin tokens are valid on every route;
//! ordinary tokens on every route but the admin ones. A token in a file may be limited to
//! tenants, tables, and reading or writing (`Scope`): the middleware refuses what a route's
//! `Reach` puts beyond a token's scope before any handler runs, and the handlers of the routes
//! that name tenants (appends, queries, holds, erasures) check each one. With no token
//! configured at all, the API requires none; `ServeArgs::validate` allows that only on a
//! loopback address.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
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
/// Tenants or tables one token may be limited to, at most.
pub const SCOPE_NAMES_MAX: usize = 100;

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

/// How far a route's answer or effect reaches across tenants and tables, which decides what a
/// limited token may do there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Names no tenant, table or record (health, plugins, the last reload): any token.
    Nothing,
    /// One table as a whole (its buckets, its retention report): a token limited to tables
    /// must include it; a token limited to tenants is refused, as the answer covers every
    /// tenant's buckets.
    Table,
    /// Records, holds or erasure requests of tenants: a token limited to tables must include
    /// the table, and the handler checks every tenant against the token's scope.
    Tenants,
    /// Every table and tenant (metrics, status, reload, archive, verify, policy check): a
    /// limited token is refused.
    Everything,
}

/// What a request's token grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Grant {
    None,
    Token,
    Admin,
}

/// What a token may reach: all tenants and tables, reading and writing, unless its line in a
/// token file limits it (`TOKEN tenants=acme,globex tables=events access=read`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// `None`: every tenant. A record without a tenant belongs to none a limited token names.
    pub tenants: Option<BTreeSet<String>>,
    /// `None`: every table.
    pub tables: Option<BTreeSet<String>>,
    pub read: bool,
    pub write: bool,
}

impl Default for Scope {
    fn default() -> Self {
        Scope::UNLIMITED
    }
}

impl Scope {
    pub const UNLIMITED: Scope = Scope { tenants: None, tables: None, read: true, write: true };

    pub fn is_unlimited(&self) -> bool {
        *self == Scope::UNLIMITED
    }

    /// Whether records of `tenant` are within reach (a record without one is not, for a token
    /// limited to tenants).
    pub fn allows_tenant(&self, tenant: Option<&str>) -> bool {
        match (&self.tenants, tenant) {
            (None, _) => true,
            (Some(tenants), Some(tenant)) => tenants.contains(tenant),
            (Some(_), None) => false,
        }
    }

    pub fn allows_table(&self, table: &str) -> bool {
        self.tables.as_ref().is_none_or(|tables| tables.contains(table))
    }

    /// The 403 answer for `what` (a record, a hold, a request) of `tenant`, when the token
    /// cannot reach it.
    pub fn check_tenant(&self, tenant: Option<&str>, what: &str) -> std::result::Result<(), ApiError> {
        if self.allows_tenant(tenant) {
            return Ok(());
        }
        let named = match tenant {
            Some(tenant) => format!("tenant `{tenant}`"),
            None => "no tenant".to_string(),
        };
        Err(forbidden(format!("{what} names {named}; this token is limited to {}", self.tenants_named())))
    }

    pub fn check_table(&self, table: &str) -> std::result::Result<(), ApiError> {
        if self.allows_table(table) {
            return Ok(());
        }
        let tables = self.tables.iter().flatten().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", ");
        Err(forbidden(format!("table `{table}` is beyond this token, which is limited to tables {tables}")))
    }

    /// The token's tenants, for messages.
    pub fn tenants_named(&self) -> String {
        match &self.tenants {
            None => "every tenant".into(),
            Some(tenants) => {
                format!("tenants {}", tenants.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", "))
            }
        }
    }

    /// The refusal of a route that reaches as far as `reach`, with `method`, on `table`.
    fn check_route(&self, reach: Reach, method: &Method, table: Option<&str>) -> std::result::Result<(), ApiError> {
        if self.is_unlimited() {
            return Ok(());
        }
        let reads = matches!(*method, Method::GET | Method::HEAD);
        if reads && !self.read {
            return Err(forbidden("this token may only write (access=write)"));
        }
        if !reads && !self.write {
            return Err(forbidden("this token may only read (access=read)"));
        }
        let everything = "this route answers for every tenant and table; a token limited to tenants or tables \
                          cannot use it: use an unlimited token";
        match reach {
            Reach::Nothing => Ok(()),
            Reach::Everything => Err(forbidden(everything)),
            Reach::Table if self.tenants.is_some() => Err(forbidden(
                "this route answers for every tenant of the table; a token limited to tenants cannot use it",
            )),
            Reach::Table | Reach::Tenants => table.map_or(Ok(()), |table| self.check_table(table)),
        }
    }
}

pub(super) fn forbidden(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
}

type Digest32 = [u8; 32];

/// One configured token: its digest and what it may reach.
#[derive(Clone)]
struct TokenEntry {
    digest: Digest32,
    scope: Arc<Scope>,
}

/// The tokens in force.
#[derive(Clone, Default)]
struct TokenSets {
    tokens: Vec<TokenEntry>,
    admin_tokens: Vec<TokenEntry>,
}

/// Where the tokens come from: the files are read again on a reload, the variables are the
/// values the process started with.
#[derive(Debug, Clone, Default)]
struct TokenSources {
    token_file: Option<PathBuf>,
    admin_token_file: Option<PathBuf>,
    tokens_variable: Option<String>,
    admin_tokens_variable: Option<String>,
}

impl TokenSources {
    fn load(&self) -> Result<TokenSets> {
        Ok(TokenSets {
            tokens: load_set(self.token_file.as_deref(), "FROSTLINE_TOKENS", self.tokens_variable.as_deref())?,
            admin_tokens: load_set(
                self.admin_token_file.as_deref(),
                "FROSTLINE_ADMIN_TOKENS",
                self.admin_tokens_variable.as_deref(),
            )?,
        })
    }
}

/// The configured tokens, as digests; cloned handles share one set, which `reload` replaces.
#[derive(Clone, Default)]
pub struct Auth {
    sets: Arc<RwLock<Arc<TokenSets>>>,
    sources: Arc<TokenSources>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sets = self.current();
        f.debug_struct("Auth")
            .field("tokens", &sets.tokens.len())
            .field("admin_tokens", &sets.admin_tokens.len())
            .finish()
    }
}

fn digest(token: &[u8]) -> Digest32 {
    Sha256::digest(token).into()
}

/// A tenant or table name in a scope: percent-decoded, so names with commas, spaces or `=`
/// can be written (`%2C`, `%20`, `%3D`).
fn scope_name(raw: &str, place: &str) -> Result<String> {
    let name = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|e| Error::InvalidInput(format!("{place}: `{raw}` is not UTF-8 once percent-decoded: {e}")))?;
    if name.is_empty() {
        return Err(Error::InvalidInput(format!("{place}: an empty name in a list (remove the extra comma)")));
    }
    Ok(name.into_owned())
}

fn scope_names(value: &str, key: &str, place: &str) -> Result<BTreeSet<String>> {
    let names = value.split(',').map(|raw| scope_name(raw, place)).collect::<Result<BTreeSet<String>>>()?;
    if names.len() > SCOPE_NAMES_MAX {
        return Err(Error::InvalidInput(format!(
            "{place}: {} names in `{key}=`; at most {SCOPE_NAMES_MAX} (SCOPE_NAMES_MAX)",
            names.len()
        )));
    }
    Ok(names)
}

/// The scope after a token on its line: `tenants=a,b`, `tables=x`, `access=read|write`, each at
/// most once, separated by spaces.
fn parse_scope(words: &[&str], place: &str) -> Result<Scope> {
    let mut scope = Scope::UNLIMITED;
    let mut seen = BTreeSet::new();
    for word in words {
        let Some((key, value)) = word.split_once('=') else {
            return Err(Error::InvalidInput(format!(
                "{place}: `{word}` is not a limit; a token's line is `TOKEN [tenants=A,B] [tables=T] \
                 [access=read|write]`"
            )));
        };
        if !seen.insert(key) {
            return Err(Error::InvalidInput(format!("{place}: `{key}=` is given twice")));
        }
        match key {
            "tenants" => scope.tenants = Some(scope_names(value, key, place)?),
            "tables" => scope.tables = Some(scope_names(value, key, place)?),
            "access" => {
                (scope.read, scope.write) = match value {
                    "read" => (true, false),
                    "write" => (false, true),
                    "read-write" => (true, true),
                    other => {
                        return Err(Error::InvalidInput(format!(
                            "{place}: access `{other}` is none of read, write, read-write"
                        )));
                    }
                }
            }
            other => {
                return Err(Error::InvalidInput(format!(
                    "{place}: `{other}=` is not a limit; the limits are tenants=, tables= and access="
                )));
            }
        }
    }
    Ok(scope)
}

/// Tokens from a file (one per line, optionally followed by its limits; blank lines and `#`
/// comments skipped) or a comma-separated variable (unlimited tokens); `origin` names the
/// source in errors.
fn parse_tokens(text: &str, separator: char, origin: &str) -> Result<Vec<TokenEntry>> {
    let mut out = Vec::new();
    for (n, raw) in text.split(separator).enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let place =
            if separator == '\n' { format!("{origin} line {}", n + 1) } else { format!("{origin} entry {}", n + 1) };
        let words: Vec<&str> = line.split_whitespace().collect();
        let (token, limits) = words.split_first().expect("a line that is not blank has a word");
        if separator != '\n' && !limits.is_empty() {
            return Err(Error::InvalidInput(format!(
                "{place}: a token must be visible ASCII without spaces (limits are written in token files only)"
            )));
        }
        if token.len() < TOKEN_BYTES_MIN {
            return Err(Error::InvalidInput(format!(
                "{place}: a token must be at least {TOKEN_BYTES_MIN} characters (TOKEN_BYTES_MIN); generate one with \
                 `openssl rand -hex 32`"
            )));
        }
        if !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(Error::InvalidInput(format!("{place}: a token must be visible ASCII without spaces")));
        }
        out.push(TokenEntry { digest: digest(token.as_bytes()), scope: Arc::new(parse_scope(limits, &place)?) });
    }
    if out.len() > TOKENS_MAX {
        return Err(Error::InvalidInput(format!("{origin}: {} tokens; at most {TOKENS_MAX} (TOKENS_MAX)", out.len())));
    }
    Ok(out)
}

fn load_set(file: Option<&Path>, variable: &str, value: Option<&str>) -> Result<Vec<TokenEntry>> {
    let mut out = Vec::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::InvalidInput(format!("cannot read token file {}: {e}", path.display())))?;
        out.extend(parse_tokens(&text, '\n', &path.display().to_string())?);
    }
    if let Some(text) = value {
        out.extend(parse_tokens(text, ',', variable)?);
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
        let sources = TokenSources {
            token_file: token_file.map(Path::to_path_buf),
            admin_token_file: admin_token_file.map(Path::to_path_buf),
            tokens_variable: env("FROSTLINE_TOKENS"),
            admin_tokens_variable: env("FROSTLINE_ADMIN_TOKENS"),
        };
        let sets = sources.load()?;
        Ok(Auth { sets: Arc::new(RwLock::new(Arc::new(sets))), sources: Arc::new(sources) })
    }

    fn current(&self) -> Arc<TokenSets> {
        self.sets.read().expect("token sets").clone()
    }

    /// Reads the token files again and puts their tokens in force, returning how many ordinary
    /// and admin tokens there are now. A file that cannot be read or holds a bad line is
    /// refused with the line named, and so is a change that would leave no token at all (which
    /// would open the API to anyone): the tokens in force stay.
    pub fn reload(&self) -> Result<(usize, usize)> {
        let sets = self.sources.load()?;
        if sets.tokens.is_empty() && sets.admin_tokens.is_empty() && !self.is_disabled() {
            return Err(Error::InvalidInput(
                "the token files now hold no token, which would let every request in; the tokens in force stay \
                 (write at least one token, or restart without token files on a loopback address)"
                    .into(),
            ));
        }
        let counts = (sets.tokens.len(), sets.admin_tokens.len());
        *self.sets.write().expect("token sets") = Arc::new(sets);
        Ok(counts)
    }

    /// The token files, to watch for changes.
    pub fn files(&self) -> Vec<PathBuf> {
        self.sources.token_file.iter().chain(&self.sources.admin_token_file).cloned().collect()
    }

    /// No token is configured: every request is allowed (loopback only).
    pub fn is_disabled(&self) -> bool {
        let sets = self.current();
        sets.tokens.is_empty() && sets.admin_tokens.is_empty()
    }

    pub fn has_admin_tokens(&self) -> bool {
        !self.current().admin_tokens.is_empty()
    }

    /// What `token` grants, and its scope. Every configured digest is compared, in constant
    /// time each, so the time taken does not depend on which token (if any) matched.
    pub fn grant(&self, token: Option<&str>) -> (Grant, Arc<Scope>) {
        let sets = self.current();
        let unlimited = || Arc::new(Scope::UNLIMITED);
        if sets.tokens.is_empty() && sets.admin_tokens.is_empty() {
            return (Grant::Admin, unlimited());
        }
        let Some(token) = token else { return (Grant::None, unlimited()) };
        let presented = digest(token.as_bytes());
        let find = |set: &[TokenEntry]| {
            let mut found = None;
            for entry in set {
                let matched: bool = entry.digest.ct_eq(&presented).into();
                found = if matched { Some(entry.scope.clone()) } else { found };
            }
            found
        };
        let (admin, ordinary) = (find(&sets.admin_tokens), find(&sets.tokens));
        match (admin, ordinary) {
            (Some(scope), _) => (Grant::Admin, scope),
            (None, Some(scope)) => (Grant::Token, scope),
            (None, None) => (Grant::None, unlimited()),
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
            (Access::Admin, Grant::Token) => Err(forbidden("this route needs an admin token")),
        }
    }
}

/// Reads the token files again on every SIGHUP and whenever one of them changes (written in
/// place or replaced), until `stopping` fires; a set that is refused leaves the one in force.
pub async fn reload_tokens(auth: Auth, mut stopping: tokio::sync::watch::Receiver<bool>) {
    let files = auth.files();
    if files.is_empty() {
        return;
    }
    let Ok(mut hangup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        tracing::error!("cannot listen for SIGHUP: the token files will be read again only when they change");
        return;
    };
    let (changed, mut changes) = tokio::sync::mpsc::unbounded_channel::<()>();
    // The folders are watched, not the files: an editor or a secret manager replaces a file
    // by renaming another over it, which a watch on the file itself would not follow.
    let watched = files.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && event.paths.iter().any(|p| watched.iter().any(|f| p.file_name() == f.file_name()))
        {
            let _ = changed.send(());
        }
    });
    let _watcher = match watcher {
        Ok(mut watcher) => {
            use notify::Watcher;
            for file in &files {
                let folder = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
                if let Err(e) = watcher.watch(folder, notify::RecursiveMode::NonRecursive) {
                    tracing::warn!(folder = %folder.display(), error = %e, "cannot watch the token file's folder; \
                                   send SIGHUP after changing it");
                }
            }
            Some(watcher)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the token files; send SIGHUP after changing them");
            None
        }
    };
    loop {
        let why = tokio::select! {
            _ = stopping.changed() => return,
            _ = hangup.recv() => "SIGHUP",
            Some(()) = changes.recv() => {
                // A burst of events for one write: settle, then read once.
                tokio::time::sleep(std::time::Duration::from_millis(TOKEN_RELOAD_SETTLE_MS)).await;
                while changes.try_recv().is_ok() {}
                "a token file changed"
            }
        };
        let reloading = auth.clone();
        match tokio::task::spawn_blocking(move || reloading.reload()).await {
            Ok(Ok((tokens, admin))) => {
                tracing::info!(tokens, admin_tokens = admin, "{why}: the token files were read again")
            }
            Ok(Err(e)) => tracing::error!(error = %e, "{why}: the token files were refused; the tokens in force stay"),
            Err(e) => tracing::error!(error = %e, "{why}: reading the token files panicked"),
        }
    }
}

/// How long after a token file's change it is read: editors and secret managers write in
/// several steps.
pub const TOKEN_RELOAD_SETTLE_MS: u64 = 200;

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
/// (`browser::check`), looks the route up in `ROUTES` and refuses a request whose token does
/// not suffice or does not reach as far as the route (`Reach`), before the handler runs (so a
/// refused request changes nothing). The token's `Scope` goes to the handler as an extension.
pub async fn authorise(State(state): State<Arc<ApiState>>, request: Request, next: Next) -> Response {
    let template = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_default();
    // axum answers HEAD with the GET handler: it needs what GET needs.
    let method = if request.method() == Method::HEAD { "GET" } else { request.method().as_str() };
    let mut response = match super::route(method, &template) {
        None => ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{} is not served on {template}", request.method()),
        )
        .into_response(),
        Some(route) => {
            let (grant, scope) = state.auth.grant(bearer(&request));
            let (mut parts, body) = request.into_parts();
            // The table the path names, percent-decoded (a path that does not decode is refused
            // by the handler's own extractor; no table is within reach of a limited token then).
            let table = RawPathParams::from_request_parts(&mut parts, &()).await.ok().and_then(|params| {
                params.iter().find(|(name, _)| *name == "table").map(|(_, value)| value.to_string())
            });
            let mut request = Request::from_parts(parts, body);
            let table_named = route.path.contains("{table}");
            let allowed = super::browser::check(request.method(), request.headers(), !state.auth.is_disabled())
                .and_then(|()| state.auth.check(route.access, grant))
                .and_then(|()| match (&table, table_named) {
                    (None, true) if scope.tables.is_some() => Err(forbidden("the path's table cannot be read")),
                    _ => scope.check_route(route.reach, request.method(), table.as_deref()),
                });
            match allowed {
                Ok(()) => {
                    request.extensions_mut().insert(scope);
                    next.run(request).await
                }
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
        assert_eq!(auth.grant(Some(TOKEN)).0, Grant::Token);
        assert_eq!(auth.grant(Some(ADMIN)).0, Grant::Admin);
        assert_eq!(auth.grant(Some("0123456789abcdef-other")).0, Grant::None);
        assert_eq!(auth.grant(Some("")).0, Grant::None);
        assert_eq!(auth.grant(None).0, Grant::None);
        assert!(auth.grant(Some(TOKEN)).1.is_unlimited(), "a token of a variable is unlimited");
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
        assert_eq!(auth.grant(Some(TOKEN)).0, Grant::Token);
        assert!(!auth.has_admin_tokens());
        std::fs::write(&file, "short\n").unwrap();
        let err = Auth::load(Some(&file), None, &|_| None).unwrap_err().to_string();
        assert!(err.contains("line 1") && err.contains("TOKEN_BYTES_MIN"), "{err}");
    }

    #[test]
    fn without_tokens_everything_is_granted() {
        let auth = Auth::load(None, None, &|_| None).unwrap();
        assert!(auth.is_disabled());
        assert_eq!(auth.grant(None).0, Grant::Admin);
    }

    #[test]
    fn a_token_files_line_limits_its_token_and_bad_limits_are_refused_with_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        let limited = "0123456789abcdef-acme";
        std::fs::write(
            &file,
            format!(
                "{TOKEN}\n{limited}  tenants=acme,a%20b%2Cc  tables=events access=read # a comment is not a limit\n"
            ),
        )
        .unwrap();
        let err = Auth::load(Some(&file), None, &|_| None).unwrap_err().to_string();
        assert!(err.contains("line 2") && err.contains("`#` is not a limit"), "{err}");
        std::fs::write(&file, format!("{TOKEN}\n{limited}  tenants=acme,a%20b%2Cc  tables=events access=read\n"))
            .unwrap();
        let auth = Auth::load(Some(&file), None, &|_| None).unwrap();
        let (grant, scope) = auth.grant(Some(limited));
        assert_eq!(grant, Grant::Token);
        assert_eq!(scope.tenants, Some(BTreeSet::from(["acme".to_string(), "a b,c".to_string()])));
        assert_eq!(scope.tables, Some(BTreeSet::from(["events".to_string()])));
        assert!(scope.read && !scope.write);
        assert!(
            scope.allows_tenant(Some("a b,c")) && !scope.allows_tenant(Some("globex")) && !scope.allows_tenant(None)
        );
        assert!(auth.grant(Some(TOKEN)).1.is_unlimited());
        for (line, says) in [
            ("tenants=", "empty name"),
            ("tenants=a,,b", "empty name"),
            ("tenant=acme", "`tenant=` is not a limit"),
            ("access=admin", "none of read, write, read-write"),
            ("tenants=a tenants=b", "given twice"),
            ("acme", "is not a limit"),
            ("tenants=%FF", "not UTF-8"),
        ] {
            std::fs::write(&file, format!("{TOKEN}\n{limited} {line}\n")).unwrap();
            let err = Auth::load(Some(&file), None, &|_| None).unwrap_err().to_string();
            assert!(err.contains("line 2") && err.contains(says), "{line}: {err}");
        }
        // Limits are written in files: a variable's entry is one token.
        let env = |name: &str| (name == "FROSTLINE_TOKENS").then(|| format!("{limited} tenants=acme"));
        assert!(Auth::load(None, None, &env).unwrap_err().to_string().contains("entry 1"));
    }

    #[test]
    fn the_names_limit_holds_and_is_enforced() {
        let names = |n: usize| (0..n).map(|i| format!("t{i}")).collect::<Vec<_>>().join(",");
        let at = parse_scope(&[&format!("tenants={}", names(SCOPE_NAMES_MAX))], "line 1").unwrap();
        assert_eq!(at.tenants.unwrap().len(), SCOPE_NAMES_MAX);
        let err = parse_scope(&[&format!("tenants={}", names(SCOPE_NAMES_MAX + 1))], "line 1").unwrap_err();
        assert!(err.to_string().contains("SCOPE_NAMES_MAX"), "{err}");
    }

    #[test]
    fn a_route_refuses_what_reaches_beyond_a_limited_token() {
        let acme = Scope { tenants: Some(BTreeSet::from(["acme".into()])), ..Scope::UNLIMITED };
        let events = Scope { tables: Some(BTreeSet::from(["events".into()])), ..Scope::UNLIMITED };
        let reader = Scope { write: false, ..acme.clone() };
        let (get, post) = (Method::GET, Method::POST);
        let status = |scope: &Scope, reach, method: &Method, table| {
            scope.check_route(reach, method, table).err().map(|e| e.status.as_u16())
        };
        for reach in [Reach::Nothing, Reach::Table, Reach::Tenants, Reach::Everything] {
            assert_eq!(status(&Scope::UNLIMITED, reach, &post, Some("x")), None);
        }
        assert_eq!(status(&acme, Reach::Nothing, &get, None), None);
        assert_eq!(status(&acme, Reach::Tenants, &post, Some("x")), None, "the handler checks the tenants");
        assert_eq!(status(&acme, Reach::Table, &get, Some("x")), Some(403));
        assert_eq!(status(&acme, Reach::Everything, &get, None), Some(403));
        assert_eq!(status(&reader, Reach::Tenants, &get, Some("x")), None);
        assert_eq!(status(&reader, Reach::Tenants, &post, Some("x")), Some(403));
        assert_eq!(status(&events, Reach::Table, &get, Some("events")), None);
        assert_eq!(status(&events, Reach::Table, &get, Some("other")), Some(403));
        assert_eq!(status(&events, Reach::Tenants, &post, Some("other")), Some(403));
        assert_eq!(status(&events, Reach::Everything, &get, None), Some(403));
    }

    #[test]
    fn a_reload_puts_new_tokens_in_force_and_refuses_a_bad_or_empty_set() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
        let auth = Auth::load(Some(&file), None, &|_| None).unwrap();
        let clone = auth.clone();
        let rotated = "0123456789abcdef-rotated";
        std::fs::write(&file, format!("{rotated} tenants=acme\n")).unwrap();
        assert_eq!(auth.reload().unwrap(), (1, 0));
        assert_eq!(clone.grant(Some(TOKEN)).0, Grant::None, "every handle sees the new set");
        assert_eq!(clone.grant(Some(rotated)).0, Grant::Token);
        std::fs::write(&file, "short\n").unwrap();
        assert!(auth.reload().unwrap_err().to_string().contains("TOKEN_BYTES_MIN"));
        std::fs::write(&file, "# nothing\n").unwrap();
        assert!(auth.reload().unwrap_err().to_string().contains("would let every request in"));
        std::fs::remove_file(&file).unwrap();
        assert!(auth.reload().unwrap_err().to_string().contains("cannot read token file"));
        assert_eq!(clone.grant(Some(rotated)).0, Grant::Token, "the set in force stays");
        assert!(!auth.is_disabled());
    }
}

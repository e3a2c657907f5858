//! The HTTP API of the running engine (`frostline run --listen ADDR`): append, query across hot
//! and cold, status, buckets, the retention report, legal holds, plugins, policy reload,
//! archive now, verify, Prometheus metrics and health. docs/API.md describes it for callers and
//! docs/openapi.json formally; a test checks the file against the server built from `ROUTES`.
//!
//! Every route is declared once, in `ROUTES`, with the access it needs; the router and the
//! authorisation check are built from that list. `browser` refuses, before any handler runs,
//! what a web page could send on a browser's behalf. Blocking work (appends, store reads, reloads)
//! runs on blocking threads; an append is acknowledged only after `Engine::append` returns,
//! that is after its commit.
//!
//! Maps HTTP onto the operations (`ops`), the runtime (`engine`), `archive` and `query`, and
//! errors onto status codes; only the daemon imports it (the CLI talks to it over HTTP).

pub mod auth;
pub mod browser;
pub mod connections;
mod erasures;
mod handlers;
pub mod metrics;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::error::{Error, ErrorKind, Result};
use crate::ops::Engine;

pub use self::auth::{Access, Auth, Reach, Scope};
pub use self::metrics::Metrics;
pub use crate::ops::passes::Passes;

/// Where the API listens unless `--listen` says otherwise.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:7070";
/// Invalid records described in one refusal at most (the count of all of them is given).
pub const HTTP_RECORD_ERRORS_REPORTED_MAX: usize = 100;
/// Buckets listed by one request at most, and by default.
pub const BUCKETS_LIMIT_MAX: usize = 100_000;
pub const BUCKETS_LIMIT_DEFAULT: usize = 1_000;

/// Names a route; `handlers::method_router` maps each to its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteId {
    Health,
    Metrics,
    Append,
    Query,
    Buckets,
    Status,
    Plugins,
    LastReload,
    Reload,
    Archive,
    Holds,
    PlaceHold,
    LiftHold,
    Retention,
    Columns,
    Verify,
    PolicyCheck,
    Erasures,
    PlaceErasure,
    Erasure,
}

/// One route of the API.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub id: RouteId,
    /// `GET`, `POST` or `DELETE`.
    pub method: &'static str,
    /// The path template, with `{name}` parameters (axum's and OpenAPI's syntax).
    pub path: &'static str,
    pub access: Access,
    /// How far it reaches across tenants and tables: what a limited token may do there.
    pub reach: Reach,
}

/// Every route the server serves; the router and the authorisation check are built from it.
pub const ROUTES: &[Route] = &[
    Route { id: RouteId::Health, method: "GET", path: "/health", access: Access::Public, reach: Reach::Nothing },
    Route { id: RouteId::Metrics, method: "GET", path: "/metrics", access: Access::Token, reach: Reach::Everything },
    Route {
        id: RouteId::Append,
        method: "POST",
        path: "/v1/tables/{table}/records",
        access: Access::Token,
        reach: Reach::Tenants,
    },
    Route {
        id: RouteId::Query,
        method: "GET",
        path: "/v1/tables/{table}/records",
        access: Access::Token,
        reach: Reach::Tenants,
    },
    Route {
        id: RouteId::Buckets,
        method: "GET",
        path: "/v1/tables/{table}/buckets",
        access: Access::Token,
        reach: Reach::Table,
    },
    Route { id: RouteId::Status, method: "GET", path: "/v1/status", access: Access::Token, reach: Reach::Everything },
    Route { id: RouteId::Plugins, method: "GET", path: "/v1/plugins", access: Access::Token, reach: Reach::Nothing },
    Route { id: RouteId::LastReload, method: "GET", path: "/v1/reload", access: Access::Token, reach: Reach::Nothing },
    Route { id: RouteId::Reload, method: "POST", path: "/v1/reload", access: Access::Admin, reach: Reach::Everything },
    Route {
        id: RouteId::Archive,
        method: "POST",
        path: "/v1/archive",
        access: Access::Admin,
        reach: Reach::Everything,
    },
    Route { id: RouteId::Holds, method: "GET", path: "/v1/holds", access: Access::Token, reach: Reach::Tenants },
    Route { id: RouteId::PlaceHold, method: "POST", path: "/v1/holds", access: Access::Admin, reach: Reach::Tenants },
    Route {
        id: RouteId::LiftHold,
        method: "DELETE",
        path: "/v1/holds/{id}",
        access: Access::Admin,
        reach: Reach::Tenants,
    },
    Route {
        id: RouteId::Retention,
        method: "GET",
        path: "/v1/tables/{table}/retention",
        access: Access::Token,
        reach: Reach::Table,
    },
    Route {
        id: RouteId::Columns,
        method: "GET",
        path: "/v1/tables/{table}/columns",
        access: Access::Token,
        reach: Reach::Tenants,
    },
    Route { id: RouteId::Verify, method: "POST", path: "/v1/verify", access: Access::Admin, reach: Reach::Everything },
    Route {
        id: RouteId::PolicyCheck,
        method: "POST",
        path: "/v1/policy/check",
        access: Access::Admin,
        reach: Reach::Everything,
    },
    // Erasure requests and their receipts name tenants and partition keys: admin only (an
    // admin token limited to tenants sees and places its tenants' requests only).
    Route { id: RouteId::Erasures, method: "GET", path: "/v1/erasures", access: Access::Admin, reach: Reach::Tenants },
    Route {
        id: RouteId::PlaceErasure,
        method: "POST",
        path: "/v1/erasures",
        access: Access::Admin,
        reach: Reach::Tenants,
    },
    Route {
        id: RouteId::Erasure,
        method: "GET",
        path: "/v1/erasures/{id}",
        access: Access::Admin,
        reach: Reach::Tenants,
    },
];

/// The route of `method path_template`, or `None` for an unknown one.
pub fn route(method: &str, path_template: &str) -> Option<&'static Route> {
    ROUTES.iter().find(|r| r.method == method && r.path == path_template)
}

/// `frostline run`'s API flags. Tokens themselves come from files or the environment, never
/// from the command line (where `ps` would show them).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address of the HTTP API (`host:port`; port 0 picks a free port, written to
    /// `<data>/frostline.addr`).
    #[arg(long, env = "FROSTLINE_LISTEN", default_value = LISTEN_DEFAULT)]
    pub listen: String,
    /// File of bearer tokens, one per line (`#` starts a comment). Also: FROSTLINE_TOKENS,
    /// comma-separated.
    #[arg(long, env = "FROSTLINE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// File of admin bearer tokens (reload, archive now, holds, verify; valid on every route). Also:
    /// FROSTLINE_ADMIN_TOKENS, comma-separated.
    #[arg(long, env = "FROSTLINE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Serve the API over TLS with this PEM certificate chain (with --tls-key); read again on
    /// SIGHUP.
    #[arg(long, env = "FROSTLINE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert; read again on SIGHUP.
    #[arg(long, env = "FROSTLINE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Connections the API holds open at once (1 to 1048576); more wait in the kernel's queue.
    /// Default: the open-file limit less 256 kept for the engine's own files, at most 4096;
    /// never more than that limit allows.
    #[arg(long, env = "FROSTLINE_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Seconds a new connection has to send its first byte (after its TLS handshake) before
    /// it is closed (1 to 3600).
    #[arg(
        long,
        env = "FROSTLINE_FIRST_REQUEST_TIMEOUT_SECONDS",
        default_value_t = connections::FIRST_REQUEST_TIMEOUT_SECONDS_DEFAULT
    )]
    pub first_request_timeout_seconds: u64,
}

impl Default for ServeArgs {
    fn default() -> Self {
        ServeArgs {
            listen: LISTEN_DEFAULT.into(),
            token_file: None,
            admin_token_file: None,
            tls_cert: None,
            tls_key: None,
            max_connections: None,
            first_request_timeout_seconds: connections::FIRST_REQUEST_TIMEOUT_SECONDS_DEFAULT,
        }
    }
}

/// Validated API settings.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    pub listen: SocketAddr,
    pub auth: Auth,
    /// The certificate and key when the API serves TLS.
    pub tls: Option<Arc<tls::ApiTls>>,
    /// `--max-connections`; `None` derives the cap from the open-file limit
    /// (`connections::connection_cap`).
    pub max_connections: Option<usize>,
    /// A new connection that sends no byte for this long is closed.
    pub first_request_timeout: Duration,
}

impl ServeArgs {
    pub fn validate(&self) -> Result<ServeSettings> {
        self.validate_with(|name| std::env::var(name).ok())
    }

    /// Validates with an injectable environment lookup (for FROSTLINE_TOKENS and
    /// FROSTLINE_ADMIN_TOKENS).
    pub fn validate_with(&self, env: impl Fn(&str) -> Option<String>) -> Result<ServeSettings> {
        let listen: SocketAddr = self.listen.parse().map_err(|e| {
            Error::InvalidInput(format!(
                "--listen `{}` is not an address such as 127.0.0.1:7070 or [::1]:7070: {e}",
                self.listen
            ))
        })?;
        let auth = Auth::load(self.token_file.as_deref(), self.admin_token_file.as_deref(), &env)?;
        if auth.is_disabled() && !listen.ip().is_loopback() {
            return Err(Error::InvalidInput(format!(
                "refusing to serve the API on {listen} without tokens: set --token-file or FROSTLINE_TOKENS (and \
                 --admin-token-file or FROSTLINE_ADMIN_TOKENS for reload and archive), or listen on a loopback \
                 address such as 127.0.0.1"
            )));
        }
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(tls::ApiTls::load(cert, key)?),
            (None, None) => None,
            _ => {
                return Err(Error::InvalidInput(
                    "--tls-cert and --tls-key go together (FROSTLINE_TLS_CERT, FROSTLINE_TLS_KEY): give both, or \
                     neither to serve plain HTTP"
                        .into(),
                ));
            }
        };
        if let Some(n) = self.max_connections
            && !(1..=connections::CONNECTIONS_MAX).contains(&n)
        {
            return Err(Error::InvalidInput(format!(
                "FROSTLINE_MAX_CONNECTIONS (--max-connections) must be 1 to {}, not {n}",
                connections::CONNECTIONS_MAX
            )));
        }
        let seconds = self.first_request_timeout_seconds;
        if !(1..=connections::FIRST_REQUEST_TIMEOUT_SECONDS_MAX).contains(&seconds) {
            return Err(Error::InvalidInput(format!(
                "FROSTLINE_FIRST_REQUEST_TIMEOUT_SECONDS (--first-request-timeout-seconds) must be 1 to {}, not \
                 {seconds}",
                connections::FIRST_REQUEST_TIMEOUT_SECONDS_MAX
            )));
        }
        Ok(ServeSettings {
            listen,
            auth,
            tls,
            max_connections: self.max_connections,
            first_request_timeout: Duration::from_secs(seconds),
        })
    }
}

/// What every handler shares.
pub struct ApiState {
    pub engine: Arc<Engine>,
    pub auth: Auth,
    pub metrics: Arc<Metrics>,
    pub passes: Arc<Passes>,
    /// Fires when the engine begins to stop; long work in requests ends between passes.
    pub stopping: tokio::sync::watch::Receiver<bool>,
}

/// The router for `ROUTES`, with authorisation, request logging and metrics.
pub fn router(state: Arc<ApiState>) -> Router {
    let mut router: Router<Arc<ApiState>> = Router::new();
    for route in ROUTES {
        router = router.route(route.path, handlers::method_router(route));
    }
    router
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth::authorise))
        .fallback(handlers::not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), metrics::observe))
        .with_state(state)
}

/// A bound, serving API.
pub struct RunningApi {
    /// The address actually bound (the port is real even when port 0 was asked for).
    pub local_addr: SocketAddr,
    /// Ends after a graceful shutdown: no new connections, requests in flight finished.
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Binds `settings.listen` and serves until `state.stopping` fires, holding at most the
/// connections the soft open-file limit in force leaves room for (`connections`; the daemon
/// raises that limit first).
pub async fn start(state: Arc<ApiState>, settings: &ServeSettings) -> Result<RunningApi> {
    let listener = tokio::net::TcpListener::bind(settings.listen).await.map_err(|e| {
        Error::InvalidInput(format!(
            "cannot listen on {}: {e}; choose another address with --listen (port 0 picks a free one)",
            settings.listen
        ))
    })?;
    let local_addr = listener.local_addr().map_err(|e| Error::Internal(format!("bound address: {e}")))?;
    if settings.auth.is_disabled() {
        tracing::warn!(
            listen = %local_addr,
            "no API tokens are configured: the API on this loopback address requires none; set --token-file or \
             FROSTLINE_TOKENS to require them"
        );
    } else if !settings.auth.has_admin_tokens() {
        tracing::info!(
            "no admin tokens are configured: POST /v1/reload, /v1/archive, /v1/holds, /v1/verify and DELETE \
             /v1/holds/{{id}} are refused (403)"
        );
    }
    let open_files = connections::open_file_limits().map_or(connections::OPEN_FILES_ASSUMED, |(soft, _)| soft);
    let (cap, lowered) = connections::connection_cap(settings.max_connections, open_files);
    if lowered {
        tracing::warn!(
            asked = settings.max_connections,
            cap,
            open_files,
            reserved = connections::OPEN_FILES_RESERVED,
            "FROSTLINE_MAX_CONNECTIONS (--max-connections) is more than the open-file limit leaves room for; the API \
             holds at most {cap} connections (raise LimitNOFILE, or ulimit -n, to allow more)"
        );
    }
    tracing::info!(
        max_connections = cap,
        open_files,
        first_request_timeout_seconds = settings.first_request_timeout.as_secs(),
        "the API holds at most max_connections connections at once and closes one that sends nothing within \
         first_request_timeout_seconds"
    );
    let mut stopping = state.stopping.clone();
    let stopped = async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    };
    let app = router(state);
    let capped = connections::CappedListener::new(listener, cap);
    let timeout = settings.first_request_timeout;
    let task = match &settings.tls {
        None => {
            let listener = connections::FirstRequestListener::new(capped, timeout);
            tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(stopped).await })
        }
        Some(certificate) => {
            let listener = tls::TlsListener::new(capped, certificate.server_config()?)
                .map_err(|e| Error::Internal(format!("TLS listener: {e}")))?;
            let listener = connections::FirstRequestListener::new(listener, timeout);
            tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(stopped).await })
        }
    };
    Ok(RunningApi { local_addr, task })
}

pub use crate::ops::wire::{
    ADDR_FILE, ErrorBody, ErrorDetail, HTTP_BODY_BYTES_MAX, HTTP_BODY_DRAIN_BYTES_MAX, HTTP_BODY_DRAIN_SECONDS_MAX,
    HTTP_RECORDS_PER_REQUEST_MAX, LimitInfo, RecordError, client_addr, read_addr_file, write_addr_file,
};

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// Boxed: error answers are rare, and `Result`s carrying them stay small.
    pub body: Box<ErrorBody>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            body: Box::new(ErrorBody {
                error: ErrorDetail { kind: kind.into(), message: message.into(), limit: None },
                invalid_records: None,
                records: Vec::new(),
            }),
        }
    }

    pub fn limit(status: StatusCode, name: &str, value: usize, message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(status, "limit_exceeded", message);
        e.body.error.limit = Some(LimitInfo { name: name.into(), value: value as u64 });
        e
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_input", message)
    }

    /// The public kind of an engine error decides the status.
    pub fn from_engine(error: &Error) -> ApiError {
        let kind = error.kind();
        let status = match kind {
            ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::Unavailable | ErrorKind::PluginFault => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::DataCorruption | ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let name = serde_json::to_value(kind).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        ApiError::new(status, &name, error.to_string())
    }
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        ApiError::from_engine(&error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(*self.body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("5"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_tokens_is_refused_off_loopback_and_allowed_on_it() {
        let args = ServeArgs { listen: "0.0.0.0:7070".into(), ..Default::default() };
        let err = args.validate_with(|_| None).unwrap_err().to_string();
        assert!(err.contains("without tokens") && err.contains("FROSTLINE_TOKENS"), "{err}");
        let args = ServeArgs { listen: "127.0.0.1:0".into(), ..Default::default() };
        assert!(args.validate_with(|_| None).unwrap().auth.is_disabled());
        let args = ServeArgs { listen: "[::1]:0".into(), ..Default::default() };
        assert!(args.validate_with(|_| None).unwrap().auth.is_disabled());
        let tokens = |name: &str| (name == "FROSTLINE_TOKENS").then(|| "a-token-of-enough-length".to_string());
        let args = ServeArgs { listen: "0.0.0.0:7070".into(), ..Default::default() };
        assert!(!args.validate_with(tokens).unwrap().auth.is_disabled());
    }

    #[test]
    fn connection_settings_are_bounded() {
        let settings = ServeArgs::default().validate_with(|_| None).unwrap();
        assert_eq!(settings.max_connections, None);
        assert_eq!(settings.first_request_timeout, Duration::from_secs(10));
        for n in [0, connections::CONNECTIONS_MAX + 1] {
            let args = ServeArgs { max_connections: Some(n), ..Default::default() };
            let error = args.validate_with(|_| None).unwrap_err().to_string();
            assert!(error.contains("FROSTLINE_MAX_CONNECTIONS") && error.contains("1 to 1048576"), "{error}");
        }
        let args = ServeArgs { max_connections: Some(64), first_request_timeout_seconds: 1, ..Default::default() };
        let settings = args.validate_with(|_| None).unwrap();
        assert_eq!((settings.max_connections, settings.first_request_timeout), (Some(64), Duration::from_secs(1)));
        for seconds in [0, 3_601] {
            let args = ServeArgs { first_request_timeout_seconds: seconds, ..Default::default() };
            let error = args.validate_with(|_| None).unwrap_err().to_string();
            assert!(
                error.contains("FROSTLINE_FIRST_REQUEST_TIMEOUT_SECONDS") && error.contains("1 to 3600"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_bad_listen_address_names_the_flag() {
        let args = ServeArgs { listen: "localhost".into(), ..Default::default() };
        assert!(args.validate_with(|_| None).unwrap_err().to_string().contains("--listen"));
    }

    #[test]
    fn routes_are_unique_and_the_router_builds() {
        let mut seen = std::collections::BTreeSet::new();
        for r in ROUTES {
            assert!(seen.insert((r.method, r.path)), "{} {} is declared twice", r.method, r.path);
            assert!(["GET", "POST", "DELETE"].contains(&r.method));
            let _ = handlers::method_router(r);
        }
    }

    #[test]
    fn unspecified_addresses_are_written_as_loopback() {
        assert_eq!(client_addr("0.0.0.0:80".parse().unwrap()).to_string(), "127.0.0.1:80");
        assert_eq!(client_addr("[::]:80".parse().unwrap()).to_string(), "[::1]:80");
        assert_eq!(client_addr("10.1.2.3:80".parse().unwrap()).to_string(), "10.1.2.3:80");
    }
}

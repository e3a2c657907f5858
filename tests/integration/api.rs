//! The HTTP API end to end: the real binary (`frostline run --listen 127.0.0.1:0`, which writes
//! the port it bound into `<data>/frostline.addr`), tokens in its environment, driven over
//! HTTP and through the CLI. Waits poll with generous deadlines; nothing sleeps for
//! correctness.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use frostline::api::{HTTP_BODY_BYTES_MAX, HTTP_RECORDS_PER_REQUEST_MAX, ROUTES};

use crate::support::*;

const USER: &str = "user-token-0123456789abcdef";
const ADMIN: &str = "admin-token-0123456789abcdef";
const WRONG: &str = "wrong-token-0123456789abcdef";

const POLICY: &str = r#"
[[table]]
id = "events"
writable_buckets = 48
strategy = { plugin = "builtin:calendar-month-utc" }
retention = { plugin = "builtin:eligible-before" }
"#;

/// Generous: the machine may be loaded by parallel tests and builds.
const WAIT: Duration = Duration::from_secs(180);

/// Environment a test must not inherit.
const SCRUBBED: &[&str] = &[
    "FROSTLINE_TLS_CERT",
    "FROSTLINE_TLS_KEY",
    "FROSTLINE_CA_FILE",
    "FROSTLINE_TOKENS",
    "FROSTLINE_ADMIN_TOKENS",
    "FROSTLINE_TOKEN_FILE",
    "FROSTLINE_ADMIN_TOKEN_FILE",
    "FROSTLINE_TOKEN",
    "FROSTLINE_ADMIN_TOKEN",
    "FROSTLINE_LISTEN",
    "FROSTLINE_DATA",
    "FROSTLINE_POLICIES",
    "ARCHIVER_KEEP_HOT_BUCKETS",
    "ARCHIVER_ELIGIBLE_THROUGH_YEAR",
    "ARCHIVER_INTERVAL_SECONDS",
    "ARCHIVER_LEASE_SECONDS",
    "ARCHIVER_LEASE_RENEWAL_SECONDS",
    "FROSTLINE_MAX_CONNECTIONS",
    "FROSTLINE_FIRST_REQUEST_TIMEOUT_SECONDS",
];

struct Dirs {
    root: tempfile::TempDir,
    data: PathBuf,
    policies: PathBuf,
}

fn dirs() -> Dirs {
    let root = tempfile::tempdir().unwrap();
    let policies = root.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("tables.toml"), POLICY).unwrap();
    Dirs { data: root.path().join("data"), policies, root }
}

fn command(d: &Dirs) -> Command {
    let mut command = Command::new(frostline_bin());
    for name in SCRUBBED {
        command.env_remove(name);
    }
    command
        .env("ARCHIVER_ELIGIBLE_BEFORE", "2025-01-01T00:00:00Z")
        .env("FROSTLINE_DATA", &d.data)
        .env("FROSTLINE_POLICIES", &d.policies);
    command
}

/// A running `frostline run`, killed if the test ends without stopping it.
struct Server {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Server {
    /// Starts the engine with `args` and tokens USER and ADMIN (unless `tokens` is false).
    fn start(d: &Dirs, args: &[&str], tokens: bool) -> Server {
        Server::start_command(d, command(d), args, tokens)
    }

    /// `start` with a command the test prepared (`command(d)` with more environment, limits).
    fn start_command(d: &Dirs, mut command: Command, args: &[&str], tokens: bool) -> Server {
        let log = d.root.path().join(format!("run-{}.log", rand::random::<u32>()));
        let addr_file = d.data.join(frostline::api::ADDR_FILE);
        command
            .args(["run", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if tokens {
            command.env("FROSTLINE_TOKENS", USER).env("FROSTLINE_ADMIN_TOKENS", ADMIN);
        }
        let mut child = command.spawn().unwrap();
        let started = Instant::now();
        let addr = loop {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the engine exited at start ({status}): {}", std::fs::read_to_string(&log).unwrap_or_default());
            }
            if let Ok(text) = std::fs::read_to_string(&addr_file)
                && text.ends_with('\n')
            {
                break text.trim().to_string();
            }
            assert!(started.elapsed() < WAIT, "the engine did not start: {}", std::fs::read_to_string(&log).unwrap());
            std::thread::sleep(Duration::from_millis(50));
        };
        let server = Server { child, addr, log };
        server.wait_for("health", |s| s.get("/health", None).0 == 200);
        // Every test starts from an empty data directory; what it appends next must not race
        // the engine's start-up pass, which would archive whatever of it is due.
        server.wait_for_first_pass();
        server
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        http("GET", &self.url(path), token, None)
    }

    fn post(&self, path: &str, token: Option<&str>, body: Option<&str>) -> (u16, String) {
        http("POST", &self.url(path), token, body)
    }

    fn delete(&self, path: &str, token: Option<&str>) -> (u16, String) {
        http("DELETE", &self.url(path), token, None)
    }

    fn json(&self, path: &str) -> serde_json::Value {
        let (status, body) = self.get(path, Some(USER));
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// `json` with another token (an admin route).
    fn json_as(&self, path: &str, token: &str) -> serde_json::Value {
        let (status, body) = self.get(path, Some(token));
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    fn wait_for(&self, what: &str, check: impl Fn(&Server) -> bool) {
        let started = Instant::now();
        while !check(self) {
            assert!(started.elapsed() < WAIT, "timed out waiting for {what}; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every record of `events`, page by page.
    fn all_records(&self, page: usize) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/v1/tables/events/records?limit={page}");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let body = self.json(&path);
            out.extend(body["records"].as_array().unwrap().iter().cloned());
            match body["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => return out,
            }
        }
    }

    /// Waits until the pass the engine runs at start-up has finished, so a test's appends
    /// cannot race it (it would archive what is due in them).
    fn wait_for_first_pass(&self) {
        self.wait_for("the start-up pass", |s| {
            s.metrics()
                .lines()
                .find_map(|l| l.strip_prefix("frostline_archive_passes_total "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .is_some_and(|passes| passes >= 1.0)
        });
    }

    fn metrics(&self) -> String {
        let (status, body) = self.get("/metrics", Some(USER));
        assert_eq!(status, 200, "{body}");
        body
    }

    /// SIGTERM, then the exit status (bounded wait).
    fn terminate(&mut self) -> ExitStatus {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.wait_exit(Duration::from_secs(frostline::daemon::SHUTDOWN_SECONDS_MAX + 30))
    }

    fn wait_exit(&mut self, bound: Duration) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(started.elapsed() < bound, "no exit within {bound:?}; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into()
}

/// One request; the status and the body.
fn http(method: &str, url: &str, token: Option<&str>, body: Option<&str>) -> (u16, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let result = match method {
        "GET" => {
            let mut r = agent().get(url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.call()
        }
        "POST" => {
            let mut r = agent().post(url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            match body {
                // JSON for objects and arrays, JSON lines otherwise: the API refuses a body of
                // any other declared type (`api::browser`).
                Some(b) if b.starts_with('{') || b.starts_with('[') => {
                    r.header("Content-Type", "application/json").send(b)
                }
                Some(b) => r.header("Content-Type", "application/x-ndjson").send(b),
                None => r.send_empty(),
            }
        }
        "DELETE" => {
            let mut r = agent().delete(url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.call()
        }
        other => panic!("method {other}"),
    };
    let mut response = result.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = response.status().as_u16();
    let text = response.body_mut().with_config().limit(u64::MAX).read_to_string().unwrap();
    (status, text)
}

/// A DELETE or a PUT, which no route serves.
fn http_other(method: &str, url: &str, token: &str) -> u16 {
    let auth = format!("Bearer {token}");
    let response = match method {
        "DELETE" => agent().delete(url).header("Authorization", &auth).call(),
        "PUT" => agent().put(url).header("Authorization", &auth).send_empty(),
        other => panic!("method {other}"),
    };
    response.unwrap().status().as_u16()
}

fn value(metrics: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            let series = l.split_whitespace().next().unwrap_or_default();
            (series == name || series.starts_with(&format!("{name}{{")))
                && labels.iter().all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.split_whitespace().nth(1))
        .map(|v| v.parse().unwrap())
        .unwrap_or_else(|| panic!("no series {name} {labels:?} in:\n{metrics}"))
}

/// A record line, as `frostline ingest` reads it.
fn line(partition: &str, time: &str, sort: &str, body: &str) -> String {
    format!(r#"{{"partition_key":"{partition}","event_time":"{time}","sort_key":"{sort}","body":{body}}}"#)
}

/// Records over 2023 and 2024 (due at the 2025-01-01 cutoff) and a few in 2025 (hot).
fn sample_lines(n: usize) -> Vec<String> {
    let start = t("2023-01-01T00:00:00Z");
    let step = (t("2025-03-01T00:00:00Z") - start) / n as i64;
    (0..n)
        .map(|i| {
            let time = frostline::model::time::format_rfc3339(start + i as i64 * step);
            line(&format!("site-{}", i % 3), &time, &format!("{i:06}"), &format!(r#"{{"i":{i},"s":"ünï ✓"}}"#))
        })
        .collect()
}

fn count_records(server: &Server) -> usize {
    server.all_records(1_000).len()
}

#[test]
fn every_route_answers_good_input_and_refuses_bad_input() {
    let d = dirs();
    let server = Server::start(&d, &["--interval-seconds", "3600"], true);

    // health needs no token.
    let (status, body) = server.get("/health", None);
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));

    // append: JSON lines and a JSON array of the same shape.
    let lines = sample_lines(30);
    let (status, body) = server.post("/v1/tables/events/records", Some(USER), Some(&lines[..20].join("\n")));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        serde_json::json!({"appended": 20, "duplicates": 0, "already_archived": 0})
    );
    let array = format!("[\n  {}\n]", lines[20..].join(",\n  "));
    let (status, body) = server.post("/v1/tables/events/records", Some(USER), Some(&array));
    assert_eq!(status, 200, "{body}");
    // An identical duplicate is accepted unchanged.
    let (status, body) = server.post("/v1/tables/events/records", Some(USER), Some(&lines[0]));
    assert_eq!((status, body.as_str()), (200, r#"{"appended":0,"duplicates":1,"already_archived":0}"#));

    // A batch with an invalid record is refused whole, each bad record named.
    let bad = format!("{}\nnot json\n\n{}\n", lines[0], line("a", "yesterday", "x", "{}"));
    let fresh = line("new", "2024-06-01T00:00:00Z", "fresh", "{}");
    let (status, body) = server.post("/v1/tables/events/records", Some(USER), Some(&format!("{fresh}\n{bad}")));
    assert_eq!(status, 422, "{body}");
    let refusal: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(refusal["error"]["kind"], "invalid_input");
    assert_eq!(refusal["invalid_records"], 2);
    assert_eq!(refusal["records"][0]["line"], 3, "{refusal}");
    assert_eq!(refusal["records"][1]["line"], 5, "{refusal}");
    assert!(refusal["records"][1]["reason"].as_str().unwrap().contains("RFC 3339"), "{refusal}");
    let bad_array = format!("[{fresh}, 7]");
    let (status, body) = server.post("/v1/tables/events/records", Some(USER), Some(&bad_array));
    assert_eq!(status, 422, "{body}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["records"][0]["index"], 1);
    let (status, _) = server.post("/v1/tables/events/records", Some(USER), Some("[{\"partition_key\""));
    assert_eq!(status, 400);
    assert_eq!(count_records(&server), 30, "nothing of a refused batch was written");

    // A different body for an existing identity is a conflict.
    let conflicting = lines[0].replace(r#""i":0"#, r#""i":-1"#);
    let (status, body) = server.post("/v1/tables/events/records", Some(USER), Some(&conflicting));
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("\"kind\":\"conflict\""), "{body}");
    // An unknown table is 404.
    let (status, _) = server.post("/v1/tables/nope/records", Some(USER), Some(&lines[0]));
    assert_eq!(status, 404);

    // query: bounds, partition, pagination, bad parameters.
    let page = server.json("/v1/tables/events/records?limit=7");
    assert_eq!(page["records"].as_array().unwrap().len(), 7);
    assert!(page["next_cursor"].is_string());
    assert_eq!(page["records"][0]["body"], serde_json::json!({"i": 0, "s": "ünï ✓"}));
    let partition = server.json("/v1/tables/events/records?partition=site-1&limit=1000");
    assert_eq!(partition["records"].as_array().unwrap().len(), 10);
    assert!(partition["next_cursor"].is_null());
    let ranged = server.json("/v1/tables/events/records?from=2025-01-01T00:00:00Z&to=1900000000000000");
    assert!(
        ranged["records"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["event_time"].as_i64().unwrap() >= t("2025-01-01T00:00:00Z"))
    );
    for bad in [
        "/v1/tables/events/records?from=yesterday",
        "/v1/tables/events/records?cursor=zz",
        "/v1/tables/events/records?limit=100000000",
        "/v1/tables/events/records?colour=blue",
        "/v1/tables/events/buckets?state=melted",
        "/v1/tables/events/buckets?limit=0",
    ] {
        let (status, body) = server.get(bad, Some(USER));
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.contains("\"kind\":\"invalid_input\""), "{bad}: {body}");
    }
    assert_eq!(server.get("/v1/tables/nope/records", Some(USER)).0, 404);
    assert_eq!(server.get("/v1/tables/nope/buckets", Some(USER)).0, 404);
    assert_eq!(server.get("/v1/nothing-here", Some(USER)).0, 404);
    assert_eq!(http_other("DELETE", &server.url("/v1/status"), ADMIN), 405);
    assert_eq!(http_other("PUT", &server.url("/v1/tables/events/records"), ADMIN), 405);

    // buckets by state, status, plugins.
    let buckets = server.json("/v1/tables/events/buckets?state=hot");
    let hot = buckets["buckets"].as_array().unwrap();
    assert!(!hot.is_empty() && hot.iter().all(|b| b["state"] == "hot"), "{buckets}");
    assert_eq!(buckets["truncated"], false);
    let limited = server.json("/v1/tables/events/buckets?limit=2");
    assert_eq!(limited["buckets"].as_array().unwrap().len(), 2);
    assert_eq!(limited["truncated"], true);
    assert!(server.json("/v1/tables/events/buckets?state=archived")["buckets"].as_array().unwrap().is_empty());
    let status = server.json("/v1/status");
    assert_eq!(status["tables"][0]["id"], "events");
    assert_eq!(status["tables"][0]["states"]["hot"]["rows"], 30);
    let plugins = server.json("/v1/plugins");
    let list = plugins["plugins"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{plugins}");
    for p in list {
        assert_eq!(p["sha256"].as_str().unwrap().len(), 64, "{p}");
        assert!(p["time_limit_ms"].as_u64().unwrap() > 0 && p["memory_limit_bytes"].as_u64().unwrap() > 0, "{p}");
        assert!(p["calls"].as_u64().unwrap() > 0, "{p}");
    }

    // reload: the last result, an accepted one, a refused one.
    assert_eq!(server.json("/v1/reload"), serde_json::json!({"generation": 1, "last_reload": null}));
    let (status, body) = server.post("/v1/reload", Some(ADMIN), None);
    assert_eq!(status, 200, "{body}");
    let outcome: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((outcome["accepted"].as_bool(), outcome["generation"].as_u64()), (Some(true), Some(2)));
    std::fs::write(d.policies.join("broken.toml"), "[[table]]\nid = ").unwrap();
    // The watcher may race the request with its own reload; either way a refusal is recorded.
    let (status, body) = server.post("/v1/reload", Some(ADMIN), None);
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("broken.toml"), "{body}");
    let last = server.json("/v1/reload");
    assert_eq!(last["last_reload"]["accepted"], false, "{last}");
    assert_eq!(last["generation"], 2, "the previous set stays active");

    // archive now: the due buckets are archived and queries still see every record.
    let (status, body) = server.post("/v1/archive", Some(ADMIN), None);
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(report["archived"].as_u64().unwrap() > 0 && report["deferred"] == 0, "{report}");
    assert_eq!(count_records(&server), 30);
    // A late record for an archived bucket is appended and read at once beside the archive.
    let (status, body) = server.post(
        "/v1/tables/events/records",
        Some(USER),
        Some(&line("site-0", "2023-01-01T00:00:00Z", "late", "{}")),
    );
    assert_eq!((status, body.as_str()), (200, r#"{"appended":1,"duplicates":0,"already_archived":0}"#));
    assert_eq!(count_records(&server), 31);
    assert!(server.log().contains("http request") && server.log().contains("latency_ms"), "request log");
}

#[test]
fn auth_refuses_missing_wrong_and_non_admin_tokens_and_changes_nothing() {
    let d = dirs();
    let server = Server::start(&d, &["--interval-seconds", "3600"], true);
    let lines = sample_lines(12).join("\n");
    for route in ROUTES.iter().filter(|r| r.access != frostline::api::Access::Public) {
        let path = route.path.replace("{table}", "events").replace("{id}", "h-000000000001");
        for token in [None, Some(WRONG), Some(""), Some("Basic abc")] {
            let (status, body) = match route.method {
                "GET" => server.get(&path, token),
                "DELETE" => server.delete(&path, token),
                _ => server.post(&path, token, Some(&lines)),
            };
            assert_eq!(status, 401, "{} {path} with {token:?}: {body}", route.method);
            assert!(body.contains("\"kind\":\"unauthorized\""), "{body}");
        }
    }
    // A scheme other than Bearer is refused even with a valid token.
    let response =
        agent().get(server.url("/v1/status")).header("Authorization", format!("Basic {USER}")).call().unwrap();
    assert_eq!(response.status().as_u16(), 401);
    assert_eq!(response.headers().get("www-authenticate").unwrap(), "Bearer");
    assert_eq!(count_records(&server), 0, "no refused append wrote anything");

    // An ordinary token may not reload, archive, place a hold or verify.
    let (status, _) = server.post("/v1/tables/events/records", Some(USER), Some(&lines));
    assert_eq!(status, 200);
    let hold = r#"{"table":"events","reason":"audit","placed_by":"user"}"#;
    for (path, body) in [("/v1/reload", None), ("/v1/archive", None), ("/v1/holds", Some(hold)), ("/v1/verify", None)] {
        let (status, body) = server.post(path, Some(USER), body);
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("\"kind\":\"forbidden\""), "{body}");
    }
    assert_eq!(server.json("/v1/holds")["holds"], serde_json::json!([]), "no hold was placed");
    assert!(server.json("/v1/tables/events/buckets?state=archived")["buckets"].as_array().unwrap().is_empty());
    assert_eq!(server.json("/v1/reload")["last_reload"], serde_json::Value::Null, "no reload ran");
    // An admin token is valid on every route.
    assert_eq!(server.get("/v1/status", Some(ADMIN)).0, 200);
    assert_eq!(server.post("/v1/archive", Some(ADMIN), None).0, 200);
    assert!(!server.json("/v1/tables/events/buckets?state=archived")["buckets"].as_array().unwrap().is_empty());
}

#[test]
fn without_tokens_the_api_is_open_on_loopback_only() {
    let d = dirs();
    let out = command(&d).args(["run", "--listen", "0.0.0.0:0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("refusing to serve the API on 0.0.0.0:0 without tokens"),
        "{}",
        text(&out.stderr)
    );

    let short = command(&d).args(["run", "--listen", "127.0.0.1:0"]).env("FROSTLINE_TOKENS", "short").output().unwrap();
    assert_eq!(short.status.code(), Some(2));
    assert!(text(&short.stderr).contains("at least 16 characters"), "{}", text(&short.stderr));

    let mut server = Server::start(&d, &["--interval-seconds", "3600"], false);
    assert!(server.log().contains("no API tokens are configured"), "{}", server.log());
    assert_eq!(server.get("/v1/status", None).0, 200);
    assert_eq!(server.post("/v1/archive", None, None).0, 200);
    assert!(server.terminate().success());
}

/// One raw HTTP/1.1 request (`head` without the request line's CRLF or the blank line), so
/// a test can send the headers a browser would: the status and the body.
fn raw(addr: &str, head: &str, body: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(stream, "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = text(&answer);
    let status = answer.split_whitespace().nth(1).unwrap_or_default().parse().unwrap_or(0);
    (status, answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// Without tokens, what a web page could make a browser send is refused before any handler
/// runs: a name other than loopback in `Host` (DNS rebinding), a foreign `Origin`, a record
/// body declared as `text/plain` (no CORS preflight needed). Nothing is written; the same
/// requests from a program (loopback `Host`, no `Origin`, a JSON type) are served.
#[test]
fn without_tokens_a_browsers_requests_are_refused_and_change_nothing() {
    let d = dirs();
    let server = Server::start(&d, &["--interval-seconds", "3600"], false);
    let addr = server.addr.clone();
    let record = line("p", "2025-02-01T00:00:00Z", "000001", "1");
    let post = |host: &str, extra: &str| {
        raw(&addr, &format!("POST /v1/tables/events/records HTTP/1.1\r\nHost: {host}{extra}"), &record)
    };
    let (status, body) = raw(&addr, "GET /v1/status HTTP/1.1\r\nHost: rebound.example:7070", "");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("loopback host") && body.contains("FROSTLINE_TOKENS"), "{body}");
    let (status, body) = post(&addr, "\r\nContent-Type: application/x-ndjson\r\nOrigin: https://evil.example");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("web origin `https://evil.example`"), "{body}");
    let (status, body) = post(&addr, "\r\nContent-Type: text/plain");
    assert_eq!(status, 415, "{body}");
    assert!(body.contains("application/x-ndjson") && body.contains("text/plain"), "{body}");
    let (status, body) = raw(&addr, &format!("POST /v1/archive HTTP/1.1\r\nHost: {addr}\r\nOrigin: null"), "");
    assert_eq!(status, 403, "{body}");
    assert_eq!(count_records(&server), 0, "nothing refused was written");

    let (status, body) = post(&addr, "\r\nContent-Type: application/x-ndjson");
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(
        &format!("localhost:{}", addr.rsplit(':').next().unwrap()),
        &format!(
            "\r\nContent-Type: application/x-ndjson; charset=utf-8\r\nOrigin: http://localhost:{}",
            addr.rsplit(':').next().unwrap()
        ),
    );
    assert_eq!(status, 200, "its own origin is served: {body}");
    assert_eq!(count_records(&server), 1);
}

/// The status of `GET url` from a client trusting only `authority` (DER) and the system's
/// authorities; 0 when no answer came (a refused handshake, a plain-HTTP request to TLS).
fn https_status(url: &str, authority: &[u8]) -> u16 {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .tls_config(frostline::storage::trust::tls_config(&[authority.to_vec()]))
        .build()
        .into();
    agent.get(url).call().map(|r| r.status().as_u16()).unwrap_or(0)
}

/// Completes a TLS handshake with the engine at `addr` (trusting `authority`, DER), then sends
/// nothing: how long after the handshake the engine closed the connection.
fn tls_idle_until_closed(addr: &str, authority: &[u8]) -> Duration {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from(authority.to_vec())).unwrap();
    let config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let host = addr.rsplit_once(':').unwrap().0.to_string();
    let name = rustls::pki_types::ServerName::try_from(host).unwrap();
    let mut connection = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    while connection.is_handshaking() {
        connection.complete_io(&mut socket).unwrap();
    }
    let handshaken = Instant::now();
    let mut stream = rustls::Stream::new(&mut connection, &mut socket);
    match stream.read(&mut [0u8; 64]) {
        // A close (with or without close_notify), or a reset.
        Ok(0) => {}
        Ok(n) => panic!("the engine sent {n} bytes unasked"),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            panic!("the engine did not close an idle TLS connection within {WAIT:?}")
        }
        Err(_) => {}
    }
    handshaken.elapsed()
}

/// `--tls-cert` and `--tls-key` serve the API over TLS with a certificate made in the test:
/// a client trusting its authority is answered, plain HTTP and a client trusting another
/// authority are not; the local CLI reaches the engine over TLS (with FROSTLINE_CA_FILE);
/// SIGHUP reads a rotated pair, and a pair that cannot serve is refused while the one in use
/// goes on. A pair that cannot serve at start stops the start with the reason.
#[test]
fn the_api_serves_tls_and_reads_its_certificate_again_on_sighup() {
    let d = dirs();
    let dir = d.root.path();
    let TestCertificates { ca_pem, ca_der, cert_pem, key_pem, .. } = test_certificates();
    let (cert, key, ca_file) = (dir.join("api.pem"), dir.join("api.key"), dir.join("ca.pem"));
    std::fs::write(&cert, &cert_pem).unwrap();
    std::fs::write(&key, &key_pem).unwrap();
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let (cert_arg, key_arg) = (cert.to_str().unwrap(), key.to_str().unwrap());

    // Refused at start: a lone flag, a key of another certificate, a certificate file without one.
    let out = command(&d).args(["run", "--tls-cert", cert_arg]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--tls-key"), "{}", text(&out.stderr));
    let other_key = dir.join("other.key");
    std::fs::write(&other_key, rcgen::KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let out =
        command(&d).args(["run", "--tls-cert", cert_arg, "--tls-key", other_key.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("does not match the certificate"), "{}", text(&out.stderr));
    let out = command(&d).args(["run", "--tls-cert", key_arg, "--tls-key", key_arg]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("holds no certificate"), "{}", text(&out.stderr));

    let log = dir.join("tls-run.log");
    let mut child = command(&d)
        .args(["run", "--listen", "127.0.0.1:0", "--tls-cert", cert_arg, "--tls-key", key_arg])
        .args(["--first-request-timeout-seconds", "2"])
        .env("FROSTLINE_TOKENS", USER)
        .env("FROSTLINE_ADMIN_TOKENS", ADMIN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let addr_file = d.data.join(frostline::api::ADDR_FILE);
    let started = Instant::now();
    let addr = loop {
        if let Ok(text) = std::fs::read_to_string(&addr_file)
            && text.ends_with('\n')
        {
            break text.trim().to_string();
        }
        assert!(started.elapsed() < WAIT, "the engine did not start: {}", std::fs::read_to_string(&log).unwrap());
        std::thread::sleep(Duration::from_millis(50));
    };
    let health = format!("https://{addr}/health");
    let wait_for = |what: &str, check: &dyn Fn() -> bool| {
        let started = Instant::now();
        while !check() {
            assert!(started.elapsed() < WAIT, "{what}: {}", std::fs::read_to_string(&log).unwrap());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_for("the first answer over TLS", &|| https_status(&health, &ca_der) == 200);
    assert!(agent().get(&format!("http://{addr}/health")).call().is_err(), "plain HTTP is not served");
    // The first-request timeout runs from the end of the handshake.
    let idle = tls_idle_until_closed(&addr, &ca_der);
    assert!(idle >= Duration::from_millis(1_950) && idle < WAIT, "closed {idle:?} after the handshake");
    let other_der = test_certificates().ca_der;
    assert_eq!(https_status(&health, &other_der), 0, "a client trusting another authority refuses the certificate");

    // The local CLI reaches the running engine over TLS, trusting the authority it is given.
    let query = |ca: Option<&Path>| {
        let mut cli = command(&d);
        cli.args(["query", "--table", "events", "--limit", "1"]).env("FROSTLINE_TOKEN", USER);
        if let Some(ca) = ca {
            cli.env("FROSTLINE_CA_FILE", ca);
        }
        cli.output().unwrap()
    };
    let out = query(Some(&ca_file));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = query(None);
    assert!(!out.status.success(), "the served chain alone does not name its authority");
    assert!(text(&out.stderr).contains("cannot reach the running engine"), "{}", text(&out.stderr));

    // Rotation: a new pair under the same paths is read on SIGHUP.
    let TestCertificates { ca_der: new_der, cert_pem: new_cert, key_pem: new_key, .. } = test_certificates();
    std::fs::write(&cert, new_cert).unwrap();
    std::fs::write(&key, new_key).unwrap();
    let reload = command(&d).args(["reload"]).output().unwrap();
    assert!(reload.status.success(), "{}", text(&reload.stderr));
    wait_for("the rotated certificate", &|| https_status(&health, &new_der) == 200);
    assert_eq!(https_status(&health, &ca_der), 0, "the old certificate is no longer served");

    // A pair that cannot serve is refused on SIGHUP; the one in use goes on.
    std::fs::write(&key, "not a key").unwrap();
    let reload = command(&d).args(["reload"]).output().unwrap();
    assert!(reload.status.success(), "{}", text(&reload.stderr));
    wait_for("the refusal in the log", &|| {
        std::fs::read_to_string(&log).unwrap_or_default().contains("the new TLS certificate was refused")
    });
    assert_eq!(https_status(&health, &new_der), 200);

    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let stopped = Instant::now();
    let code = loop {
        if let Some(code) = child.try_wait().unwrap() {
            break code;
        }
        assert!(stopped.elapsed() < WAIT, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "{code:?}");
    assert!(!d.data.join(frostline::ops::wire::TLS_FILE).exists(), "the TLS marker goes with the engine");
}

#[test]
fn the_records_limit_holds_and_is_enforced() {
    let d = dirs();
    let server = Server::start(&d, &["--interval-seconds", "3600"], true);
    let record = |i: usize| line("p", "2025-02-01T00:00:00Z", &format!("{i:06}"), "1");
    let at_limit: Vec<String> = (0..HTTP_RECORDS_PER_REQUEST_MAX).map(record).collect();
    let (status, body) = server.post("/v1/tables/events/records", Some(USER), Some(&at_limit.join("\n")));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("\"appended\":{HTTP_RECORDS_PER_REQUEST_MAX}")), "{body}");

    let over: Vec<String> = (HTTP_RECORDS_PER_REQUEST_MAX..2 * HTTP_RECORDS_PER_REQUEST_MAX + 1).map(record).collect();
    for body in [over.join("\n"), format!("[{}]", over.join(","))] {
        let (status, answer) = server.post("/v1/tables/events/records", Some(USER), Some(&body));
        assert_eq!(status, 422, "{answer}");
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["error"]["kind"], "limit_exceeded");
        assert_eq!(answer["error"]["limit"]["name"], "HTTP_RECORDS_PER_REQUEST_MAX");
        assert_eq!(answer["error"]["limit"]["value"], HTTP_RECORDS_PER_REQUEST_MAX);
    }
    assert_eq!(count_records(&server), HTTP_RECORDS_PER_REQUEST_MAX, "nothing of the refused requests was written");
    let metrics = server.metrics();
    assert_eq!(value(&metrics, "frostline_append_refusals_total", &[("reason", "too_many_records")]), 2.0);
}

/// Sends a request head declaring `content_length` bytes, and no body: the server must answer
/// from the header alone.
fn post_declaring(addr: &str, path: &str, token: &str, content_length: usize) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/x-ndjson\r\n\
         Content-Length: {content_length}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = text(&answer);
    let status = answer.split_whitespace().nth(1).unwrap_or_default().parse().unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

#[test]
fn the_body_limit_holds_and_is_enforced() {
    let d = dirs();
    let server = Server::start(&d, &["--interval-seconds", "3600"], true);
    // Exactly HTTP_BODY_BYTES_MAX bytes: three records padded with blank lines.
    let records =
        (0..3).map(|i| line("p", "2025-02-01T00:00:00Z", &format!("{i}"), "{}")).collect::<Vec<_>>().join("\n");
    let mut body = records.clone();
    body.push_str(&"\n".repeat(HTTP_BODY_BYTES_MAX - body.len()));
    assert_eq!(body.len(), HTTP_BODY_BYTES_MAX);
    let (status, answer) = server.post("/v1/tables/events/records", Some(USER), Some(&body));
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("\"appended\":3"), "{answer}");

    // More is refused: at once when the declared length is far over the limit...
    let declared = frostline::api::HTTP_BODY_DRAIN_BYTES_MAX + 1;
    let (status, answer) = post_declaring(&server.addr, "/v1/tables/events/records", USER, declared);
    assert_eq!(status, 413, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["error"]["kind"], "limit_exceeded");
    assert_eq!(answer["error"]["limit"]["name"], "HTTP_BODY_BYTES_MAX");
    assert_eq!(answer["error"]["limit"]["value"], HTTP_BODY_BYTES_MAX);
    // ...and one byte over is read to its end and refused, so the client sees the answer.
    let mut over = body.replace("\"sort_key\":\"0\"", "\"sort_key\":\"9\"");
    over.push('\n');
    let (status, answer) = server.post("/v1/tables/events/records", Some(USER), Some(&over));
    assert_eq!(status, 413, "{answer}");
    assert!(answer.contains("HTTP_BODY_BYTES_MAX"), "{answer}");
    assert_eq!(count_records(&server), 3, "nothing of the refused bodies was written");
    assert_eq!(value(&server.metrics(), "frostline_append_refusals_total", &[("reason", "body_too_large")]), 2.0);
}

#[test]
fn metrics_change_as_work_happens() {
    let d = dirs();
    let server = Server::start(&d, &["--interval-seconds", "3600"], true);
    let before = server.metrics();
    assert_eq!(value(&before, "frostline_records_appended_total", &[]), 0.0);
    assert_eq!(value(&before, "frostline_buckets", &[("table", "events"), ("state", "hot")]), 0.0);
    assert_eq!(value(&before, "frostline_outbox_backlog", &[]), 0.0);
    assert_eq!(value(&before, "frostline_archival_lag_seconds", &[]), 0.0);

    let lines = sample_lines(40);
    assert_eq!(server.post("/v1/tables/events/records", Some(USER), Some(&lines.join("\n"))).0, 200);
    assert_eq!(server.post("/v1/tables/events/records", Some(USER), Some(&lines[0])).0, 200);
    assert_eq!(
        server.post("/v1/tables/events/records", Some(USER), Some(&lines[1].replace("\"i\":1", "\"i\":2"))).0,
        409
    );
    let appended = server.metrics();
    assert_eq!(value(&appended, "frostline_records_appended_total", &[]), 40.0);
    assert_eq!(value(&appended, "frostline_records_duplicate_total", &[]), 1.0);
    assert_eq!(value(&appended, "frostline_append_refusals_total", &[("reason", "conflict")]), 1.0);
    let hot = value(&appended, "frostline_buckets", &[("table", "events"), ("state", "hot")]);
    assert!(hot > 0.0);
    assert_eq!(value(&appended, "frostline_bucket_rows", &[("table", "events"), ("state", "hot")]), 40.0);
    assert!(
        value(&appended, "frostline_plugin_calls_total", &[("role", "bucket-strategy"), ("table", "events")]) > 0.0
    );
    assert_eq!(value(&appended, "frostline_plugin_faults_total", &[("role", "bucket-strategy")]), 0.0);
    assert!(
        value(
            &appended,
            "frostline_http_requests_total",
            &[("route", "/v1/tables/{table}/records"), ("status", "200")]
        ) >= 2.0
    );

    let (status, body) = server.post("/v1/archive", Some(ADMIN), None);
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    let archived = server.metrics();
    assert_eq!(value(&archived, "frostline_archive_rows_total", &[]), report["rows_archived"].as_f64().unwrap());
    assert!(value(&archived, "frostline_archive_rows_total", &[]) > 0.0);
    assert!(value(&archived, "frostline_archive_bytes_total", &[]) > 0.0);
    assert!(value(&archived, "frostline_archive_passes_total", &[]) >= 1.0);
    assert_eq!(value(&archived, "frostline_archive_buckets_archived_total", &[]), report["archived"].as_f64().unwrap());
    let archived_buckets = value(&archived, "frostline_buckets", &[("table", "events"), ("state", "archived")]);
    assert_eq!(archived_buckets, report["archived"].as_f64().unwrap());
    assert_eq!(value(&archived, "frostline_buckets", &[("table", "events"), ("state", "hot")]), hot - archived_buckets);
    // Nothing expired or swept; the archival made each plan stale (archived-at is a fact) and
    // the passes that ran until idle made them again.
    assert_eq!(value(&archived, "frostline_buckets_expired_total", &[]), 0.0);
    assert_eq!(value(&archived, "frostline_orphans_deleted_total", &[]), 0.0);
    assert_eq!(value(&archived, "frostline_tables_unmanaged", &[]), 0.0);
    assert_eq!(value(&archived, "frostline_buckets_awaiting_plan", &[]), 0.0);

    assert_eq!(server.post("/v1/reload", Some(ADMIN), None).0, 200);
    let reloaded = server.metrics();
    assert_eq!(value(&reloaded, "frostline_policy_reloads_total", &[("result", "accepted")]), 1.0);
    assert_eq!(value(&reloaded, "frostline_policy_generation", &[]), 2.0);
}

/// Runs a CLI command with `args`, `stdin` written to it, and returns what it printed.
fn run_cli(mut command: Command, args: &[&str], stdin: Option<&str>) -> std::process::Output {
    command.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut pipe = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        pipe.write_all(text.as_bytes()).unwrap();
    }
    drop(pipe);
    child.wait_with_output().unwrap()
}

/// Regression (issue: the API and the CLI drift apart): `frostline query` against a running
/// engine dropped the expired ranges the API returns (the client's page had no such field), so
/// a remote query silently omitted what a local one reports. Both now print the same.
#[test]
fn a_query_through_a_running_engine_reports_expired_ranges_as_a_local_one_does() {
    let d = dirs();
    std::fs::write(
        d.policies.join("tables.toml"),
        r#"
[[table]]
id = "events"
strategy = { plugin = "builtin:calendar-day-utc" }
retention = { plugin = "builtin:eligible-before", config = { archive_after = "1s", expire_after = "1d" } }
"#,
    )
    .unwrap();
    let cli = |args: &[&str], stdin: Option<&str>| {
        let mut command = command(&d);
        command.env_remove("ARCHIVER_ELIGIBLE_BEFORE").env("FROSTLINE_TOKEN", USER).env("FROSTLINE_ADMIN_TOKEN", ADMIN);
        run_cli(command, args, stdin)
    };
    // Two days of one device: the first expires, the second stays (its bucket is still hot:
    // only days that ended are archived).
    let lines = [
        line("site 7/α%=b", "2024-01-01T01:00:00Z", "a", r#"{"v":1}"#),
        line("site 7/α%=b", "2099-01-01T01:00:00Z", "b", r#"{"v":2}"#),
    ]
    .join("\n");
    let ingest = cli(&["ingest", "--table", "events", "-"], Some(&lines));
    assert!(ingest.status.success(), "{}", text(&ingest.stderr));
    for _ in 0..3 {
        let archive = cli(&["archive", "--once"], None);
        assert!(archive.status.success(), "{}", text(&archive.stderr));
    }
    let local = cli(&["query", "--table", "events"], None);
    assert!(local.status.success(), "{}", text(&local.stderr));
    assert!(text(&local.stderr).contains("expired: partition site 7/α%=b"), "{}", text(&local.stderr));
    assert_eq!(text(&local.stdout).lines().count(), 1, "{}", text(&local.stdout));

    let server = Server::start_command(
        &d,
        {
            let mut command = command(&d);
            command.env_remove("ARCHIVER_ELIGIBLE_BEFORE");
            command
        },
        &["--interval-seconds", "3600"],
        true,
    );
    let remote = cli(&["query", "--table", "events"], None);
    assert!(remote.status.success(), "{}", text(&remote.stderr));
    assert_eq!(text(&remote.stdout), text(&local.stdout));
    assert_eq!(text(&remote.stderr), text(&local.stderr), "a remote query reports what a local one does");
    drop(server);
}

#[test]
fn the_cli_goes_through_the_api_of_a_running_engine() {
    let d = dirs();
    let server = Server::start(&d, &["--interval-seconds", "3600"], true);
    let cli = |args: &[&str], stdin: Option<&str>, tokens: bool| {
        let mut command = command(&d);
        if tokens {
            command.env("FROSTLINE_TOKEN", USER).env("FROSTLINE_ADMIN_TOKEN", ADMIN);
        }
        run_cli(command, args, stdin)
    };
    let lines = sample_lines(250).join("\n");
    let ingest = cli(&["ingest", "--table", "events", "-"], Some(&lines), true);
    assert!(ingest.status.success(), "{}", text(&ingest.stderr));
    assert_eq!(text(&ingest.stdout).trim(), r#"{"appended":250,"duplicates":0,"already_archived":0}"#);
    assert_eq!(count_records(&server), 250, "the engine holds what the CLI ingested");

    let malformed = cli(&["ingest", "--table", "events", "-"], Some("{\"partition_key\":1}\n"), true);
    assert_eq!(malformed.status.code(), Some(2), "{}", text(&malformed.stderr));
    assert!(text(&malformed.stderr).contains("line 1"));

    let status = cli(&["status", "--json"], None, true);
    assert!(status.status.success(), "{}", text(&status.stderr));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["tables"][0]["states"]["hot"]["rows"], 250, "{status}");
    let human = cli(&["status"], None, true);
    assert!(text(&human.stdout).contains("table events"), "{}", text(&human.stdout));

    let archive = cli(&["archive", "--once"], None, true);
    assert!(archive.status.success(), "{}", text(&archive.stderr));
    let report: serde_json::Value = serde_json::from_slice(&archive.stdout).unwrap();
    assert!(report["archived"].as_u64().unwrap() > 0, "{report}");

    // A policy change checked before it goes live, through the running engine (a dry run):
    // giving the archives an expiry is reported bucket by bucket, and nothing changes.
    let proposed = d.root.path().join("proposed");
    std::fs::create_dir_all(&proposed).unwrap();
    std::fs::write(
        proposed.join("tables.toml"),
        POLICY.replace(
            "builtin:eligible-before\" }",
            "builtin:eligible-before\", config = { expire_after = \"3650d\" } }",
        ),
    )
    .unwrap();
    let data = d.data.display().to_string();
    let check = cli(&["policy", "check", proposed.to_str().unwrap(), "--data", &data, "--json"], None, true);
    assert!(check.status.success(), "{}{}", text(&check.stdout), text(&check.stderr));
    let check: serde_json::Value = serde_json::from_slice(&check.stdout).unwrap();
    let table = &check["preview"]["tables"][0];
    assert_eq!(table["expire_earlier"], report["archived"], "{check}");
    assert!(check["preview"]["changes"][0]["expire_at"][1].as_i64().is_some(), "{check}");
    let status = cli(&["status", "--json"], None, true);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["policy"]["generation"], 1, "a check reloads nothing: {status}");
    std::fs::write(proposed.join("tables.toml"), "[[table]]\nid = \"events\"\nbogus = 1\n").unwrap();
    let refused = cli(&["policy", "check", proposed.to_str().unwrap(), "--data", &data], None, true);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused.stdout));
    assert!(
        text(&refused.stdout).contains("REFUSED") && text(&refused.stdout).contains("bogus"),
        "{}",
        text(&refused.stdout)
    );

    // Pages through the CLI: every record once, hot and archived, in order.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut args = vec!["query", "--table", "events", "--limit", "37"];
        if let Some(c) = &cursor {
            args.extend(["--cursor", c.as_str()]);
        }
        let page = cli(&args, None, true);
        assert!(page.status.success(), "{}", text(&page.stderr));
        for l in text(&page.stdout).lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            seen.push(v["sort_key"].as_str().unwrap().to_string());
        }
        cursor = text(&page.stderr).lines().find_map(|l| l.strip_prefix("next cursor: ").map(str::to_string));
        if cursor.is_none() {
            break;
        }
    }
    let expected: Vec<String> = (0..250).map(|i| format!("{i:06}")).collect();
    assert_eq!(seen, expected);
    let ranged =
        cli(&["query", "--table", "events", "--from", "2025-01-01T00:00:00Z", "--partition", "site-0"], None, true);
    assert!(ranged.status.success(), "{}", text(&ranged.stderr));
    assert!(text(&ranged.stdout).lines().all(|l| l.contains("\"site-0\"")));

    // Without a token the API refuses, and says which variable to set.
    let refused = cli(&["status"], None, false);
    assert!(!refused.status.success());
    assert!(text(&refused.stderr).contains("FROSTLINE_TOKEN"), "{}", text(&refused.stderr));
    let refused = cli(&["archive", "--once"], None, false);
    assert!(text(&refused.stderr).contains("401"), "{}", text(&refused.stderr));
}

/// `frostline ingest` through a running engine checks every line against the table's typed
/// columns before it sends a batch, as it does on a data directory: a file whose last line a
/// column refuses, behind more than a batch of good ones, writes nothing and names the line.
/// The engine answers the declaration at `GET /v1/tables/{table}/columns`.
#[test]
fn ingest_through_a_running_engine_checks_typed_columns_before_it_sends_a_batch() {
    let d = dirs();
    let policy = format!("{POLICY}\n[[table.column]]\nname = \"i\"\ntype = \"int64\"\n");
    std::fs::write(d.policies.join("tables.toml"), policy).unwrap();
    let server = Server::start(&d, &["--interval-seconds", "3600"], true);
    assert_eq!(
        server.json("/v1/tables/events/columns"),
        serde_json::json!({"table": "events", "columns": [
            {"name": "i", "type": "int64", "from": "/i", "nullable": true, "on_mismatch": "refuse"}
        ]})
    );
    let (status, body) = server.get("/v1/tables/nowhere/columns", Some(USER));
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no table `nowhere`"), "{body}");

    let mut lines = sample_lines(12_000);
    lines.push(line("site a/%20=ü", "2024-06-01T00:00:00Z", "late", r#"{"i":"twelve"}"#));
    let mut command = command(&d);
    command.env("FROSTLINE_TOKEN", USER);
    let ingest = run_cli(command, &["ingest", "--table", "events", "-"], Some(&lines.join("\n")));
    let stderr = text(&ingest.stderr);
    assert_eq!(ingest.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("line 12001: column `i` (int64, nullable, from `/i`)"), "{stderr}");
    assert!(stderr.contains("nothing was written"), "{stderr}");
    assert_eq!(count_records(&server), 0, "no batch of the refused file was sent");
}

#[test]
fn the_openapi_file_matches_the_server() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    let spec: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(spec["openapi"].as_str().unwrap().starts_with("3."));
    let mut documented = BTreeSet::new();
    for (route, item) in spec["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "post", "put", "delete", "patch", "head", "options"].contains(&method.as_str()) {
                documented.insert((method.to_uppercase(), route.clone()));
            }
        }
    }
    let served: BTreeSet<(String, String)> =
        ROUTES.iter().map(|r| (r.method.to_string(), r.path.to_string())).collect();
    assert_eq!(documented, served, "docs/openapi.json and the server's routes differ");

    let d = dirs();
    let server = Server::start(&d, &["--interval-seconds", "3600"], true);
    let (status, body) =
        server.post("/v1/holds", Some(ADMIN), Some(r#"{"table":"events","reason":"spec","placed_by":"test"}"#));
    assert_eq!(status, 201, "{body}");
    let hold: serde_json::Value = serde_json::from_str(&body).unwrap();
    let (status, body) =
        server.post("/v1/erasures", Some(ADMIN), Some(r#"{"tenant":"t","reason":"spec","requested_by":"test"}"#));
    assert_eq!(status, 201, "{body}");
    let erasure: serde_json::Value = serde_json::from_str(&body).unwrap();
    for (method, route) in &documented {
        let id = if route.starts_with("/v1/erasures/") { &erasure["request"]["id"] } else { &hold["id"] };
        let url = route.replace("{table}", "events").replace("{id}", id.as_str().unwrap());
        let (status, body) = match method.as_str() {
            "GET" => server.get(&url, Some(ADMIN)),
            "DELETE" => server.delete(&url, Some(ADMIN)),
            _ => server.post(&url, Some(ADMIN), Some(&sample_lines(3).join("\n"))),
        };
        assert!(status != 404 && status != 405, "{method} {route} answered {status}: {body}");
        assert!(status < 500, "{method} {route} answered {status}: {body}");
    }
}

#[test]
fn sigterm_while_archiving_stops_in_bounds_and_a_restart_completes_the_work() {
    let d = dirs();
    // Small passes, so the stop lands between two of them with work left for the restart.
    let args = ["--interval-seconds", "3600", "--lease-seconds", "3", "--scan-limit", "8"];
    let mut server = Server::start(&d, &args, true);
    let lines = sample_lines(2_000);
    for chunk in lines.chunks(500) {
        let (status, body) = server.post("/v1/tables/events/records", Some(USER), Some(&chunk.join("\n")));
        assert_eq!(status, 200, "{body}");
    }
    let due = server.json("/v1/status");
    assert_eq!(due["tables"][0]["states"]["hot"]["rows"], 2_000);

    // POST /v1/archive runs passes until idle; SIGTERM arrives once the first bucket is out.
    let url = server.url("/v1/archive");
    let archiving = std::thread::spawn(move || http("POST", &url, Some(ADMIN), None));
    server.wait_for("a first archived bucket", |s| {
        let body = s.json("/v1/tables/events/buckets?state=archived&limit=1");
        !body["buckets"].as_array().unwrap().is_empty()
    });
    let signalled = Instant::now();
    let code = server.terminate();
    assert!(code.success(), "{code:?}; log:\n{}", server.log());
    assert!(
        signalled.elapsed() < Duration::from_secs(frostline::daemon::SHUTDOWN_SECONDS_MAX + 15),
        "stopped in {:?}",
        signalled.elapsed()
    );
    // The request in flight was answered before the server stopped.
    let (status, body) = archiving.join().unwrap();
    assert_eq!(status, 200, "{body}");
    let first_run: serde_json::Value = serde_json::from_str(&body).unwrap();
    eprintln!("archived before the stop: {}", first_run["archived"]);
    assert!(!d.data.join(frostline::api::ADDR_FILE).exists(), "the address file is removed at stop");
    assert!(!d.data.join(frostline::engine::PID_FILE).exists(), "the pid file is removed at stop");
    assert!(server.log().contains("SIGTERM: stopping") && server.log().contains("frostline stopped"));

    // A restart with passes every second finishes the work (a bucket left Archiving is taken
    // over after its 3 s lease).
    let server = Server::start(&d, &["--interval-seconds", "1", "--lease-seconds", "3"], true);
    server.wait_for("every due bucket archived", |s| {
        let status = s.json("/v1/status");
        let states = &status["tables"][0]["states"];
        let count = |state: &str| states[state]["buckets"].as_u64().unwrap_or(0);
        count("archiving") == 0 && count("archived_cleanup_pending") == 0 && count("hot") > 0 && status["due_now"] == 0
    });
    let status = server.json("/v1/status");
    // 2023 and 2024: 24 months in 3 partitions.
    assert_eq!(status["tables"][0]["states"]["archived"]["buckets"], 72, "{status}");
    assert_eq!(
        status["tables"][0]["states"]["archived"]["rows"].as_u64().unwrap()
            + status["tables"][0]["states"]["hot"]["rows"].as_u64().unwrap(),
        2_000,
        "{status}"
    );
    assert!(
        server.json("/v1/tables/events/buckets?state=hot")["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["start"].as_str().unwrap() >= "2025")
    );
    let records = server.all_records(700);
    let keys: Vec<String> = records.iter().map(|r| r["sort_key"].as_str().unwrap().to_string()).collect();
    let expected: Vec<String> = (0..2_000).map(|i| format!("{i:06}")).collect();
    assert_eq!(keys, expected, "every record, once, in order");
}

/// `events` archives at the 2025 cutoff and expires 30 days after a bucket ends; `audit` is
/// held by the policy directory.
const LIFECYCLE_POLICY: &str = r#"
[[table]]
id = "events"
writable_buckets = 48
strategy = { plugin = "builtin:calendar-month-utc" }
retention = { plugin = "builtin:eligible-before", config = { expire_after = "30d" } }

[[table]]
id = "audit"
strategy = { plugin = "builtin:calendar-month-utc" }
retention = { plugin = "builtin:eligible-before" }

[[hold]]
table = "audit"
reason = "regulator request"
"#;

fn lifecycle_dirs() -> Dirs {
    let d = dirs();
    std::fs::write(d.policies.join("tables.toml"), LIFECYCLE_POLICY).unwrap();
    d
}

/// The retention report's entries, by partition.
fn retention(server: &Server) -> Vec<serde_json::Value> {
    let report = server.json("/v1/tables/events/retention");
    assert_eq!(report["truncated"], false, "{report}");
    report["buckets"].as_array().unwrap().clone()
}

fn holds(server: &Server) -> Vec<serde_json::Value> {
    server.json("/v1/holds")["holds"].as_array().unwrap().clone()
}

#[test]
fn holds_retention_and_verify_over_the_api() {
    let d = lifecycle_dirs();
    let server = Server::start(&d, &["--interval-seconds", "3600"], true);
    let lines = sample_lines(60);
    let (status, body) = server.post("/v1/tables/events/records", Some(USER), Some(&lines.join("\n")));
    assert_eq!(status, 200, "{body}");

    // The policy-declared hold is listed from the start.
    let listed = holds(&server);
    assert_eq!(listed.len(), 1, "{listed:?}");
    let policy_hold = listed[0]["id"].as_str().unwrap().to_string();
    assert!(policy_hold.starts_with("policy-") && listed[0]["table"] == "audit", "{listed:?}");
    // Regression: the retention report added the policy's holds to the stored ones, which
    // already hold them, so each bucket of a held table listed the hold twice.
    // (Records of 2025, after the cutoff: they stay hot, so the verify below sees no audit archive.)
    let (status, body) =
        server.post("/v1/tables/audit/records", Some(USER), Some(&lines[lines.len() - 2..].join("\n")));
    assert_eq!(status, 200, "{body}");
    let audit = server.json("/v1/tables/audit/retention");
    let audit = audit["buckets"].as_array().unwrap();
    assert!(!audit.is_empty());
    for bucket in audit {
        assert_eq!(bucket["holds"], serde_json::json!([policy_hold]), "each hold once: {bucket}");
    }

    // Placing: bad input is refused and places nothing.
    let place = |body: &str, token: &str| server.post("/v1/holds", Some(token), Some(body));
    for (body, status) in [
        (r#"{"table":"nope","reason":"x","placed_by":"me"}"#, 404),
        (r#"{"table":"events","reason":"  ","placed_by":"me"}"#, 422),
        (r#"{"table":"events","reason":"x","placed_by":""}"#, 422),
        (r#"{"table":"events","placed_by":"me"}"#, 400),
        (r#"{"table":"events","reason":"x","placed_by":"me","colour":"blue"}"#, 400),
        ("not json", 400),
    ] {
        let (got, answer) = place(body, ADMIN);
        assert_eq!(got, status, "{body}: {answer}");
    }
    let (status, body) = place(r#"{"table":"events","reason":"x","placed_by":"me"}"#, USER);
    assert_eq!(status, 403, "{body}");
    assert_eq!(holds(&server).len(), 1, "no refused request placed a hold");

    // A hold on one partition.
    let (status, body) =
        place(r#"{"table":"events","partition":"site-0","reason":"litigation 42","placed_by":"legal"}"#, ADMIN);
    assert_eq!(status, 201, "{body}");
    let placed: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = placed["id"].as_str().unwrap().to_string();
    let site0 = retention(&server).iter().filter(|b| b["partition_key"] == "site-0").count() as u64;
    assert!(site0 > 0);
    assert_eq!(placed["covered_buckets"], site0, "{placed}");
    let listed = holds(&server);
    let ours = listed.iter().find(|h| h["id"] == id.as_str()).unwrap_or_else(|| panic!("{listed:?}"));
    assert_eq!(
        (&ours["partition_key"], &ours["source"], &ours["covered_buckets"]),
        (&"site-0".into(), &"api".into(), &site0.into())
    );
    for b in retention(&server) {
        let covered = b["holds"].as_array().unwrap().iter().any(|h| h == id.as_str());
        assert_eq!(covered, b["partition_key"] == "site-0", "{b}");
    }

    // The hold blocks nothing it should not: appends go on, every due bucket is archived, and
    // only the held partition's archives are kept past their expiry.
    let (status, body) = server.post(
        "/v1/tables/events/records",
        Some(USER),
        Some(&line("site-0", "2025-02-01T00:00:00Z", "late", "{}")),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.post("/v1/archive", Some(ADMIN), None);
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(report["archived"].as_u64().unwrap() > 0, "{report}");
    let entries = retention(&server);
    let old: Vec<&serde_json::Value> =
        entries.iter().filter(|b| b["end"].as_str().unwrap() <= "2025-01-01T00:00:00Z").collect();
    assert!(!old.is_empty());
    for b in &old {
        assert!(b["archived_at"].is_string() && b["archive_at"].is_string() && b["reason"].is_string(), "{b}");
        if b["partition_key"] == "site-0" {
            assert_eq!((&b["state"], &b["next"]), (&"archived".into(), &"held".into()), "{b}");
            assert_eq!(b["held_by"], serde_json::json!([id]), "{b}");
        } else {
            assert_eq!(b["state"], "expired", "{b}");
            assert!(b["expired_at"].is_string() && b["expiry_reason"].is_string(), "{b}");
        }
    }
    assert!(entries.iter().any(|b| b["state"] == "hot" && b["next"] != "held"), "{entries:?}");

    // The retention report's parameters.
    assert_eq!(server.json("/v1/tables/events/retention?limit=1")["buckets"].as_array().unwrap().len(), 1);
    assert_eq!(server.json("/v1/tables/events/retention?limit=1")["truncated"], true);
    let site1 = server.json("/v1/tables/events/retention?partition=site-1");
    assert!(site1["buckets"].as_array().unwrap().iter().all(|b| b["partition_key"] == "site-1"), "{site1}");
    for bad in ["/v1/tables/events/retention?limit=0", "/v1/tables/events/retention?colour=blue"] {
        assert_eq!(server.get(bad, Some(USER)).0, 400, "{bad}");
    }
    assert_eq!(server.get("/v1/tables/nope/retention", Some(USER)).0, 404);
    assert_eq!(server.get("/v1/tables/events/retention", None).0, 401);

    // Verify: every archive still held checks out.
    let (status, body) = server.post("/v1/verify", Some(ADMIN), None);
    assert_eq!(status, 200, "{body}");
    let verified: serde_json::Value = serde_json::from_str(&body).unwrap();
    let archived = entries.iter().filter(|b| b["state"] == "archived").count();
    assert_eq!(verified["verdicts"].as_array().unwrap().len(), archived, "{verified}");
    assert_eq!(verified["failed"], 0, "{verified}");
    let (status, body) = server.post("/v1/verify?table=events&sample=1", Some(ADMIN), None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["verdicts"].as_array().unwrap().len(), 1);
    for (path, status) in
        [("/v1/verify?table=nope", 404), ("/v1/verify?sample=0", 400), ("/v1/verify?colour=blue", 400)]
    {
        assert_eq!(server.post(path, Some(ADMIN), None).0, status, "{path}");
    }
    assert_eq!(server.post("/v1/verify", Some(USER), None).0, 403);

    // Lifting: a plain token cannot, a policy hold cannot, an unknown id is 404.
    let (status, body) = server.delete(&format!("/v1/holds/{id}"), Some(USER));
    assert_eq!(status, 403, "{body}");
    assert!(holds(&server).iter().any(|h| h["id"] == id.as_str()), "the hold is still there");
    let (status, body) = server.delete(&format!("/v1/holds/{policy_hold}"), Some(ADMIN));
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("policy directory"), "{body}");
    assert_eq!(server.delete("/v1/holds/h-000000000000", Some(ADMIN)).0, 404);
    assert_eq!(server.delete(&format!("/v1/holds/{id}?colour=blue"), Some(ADMIN)).0, 400);
    let (status, body) = server.delete(&format!("/v1/holds/{id}?by=legal%40example.com"), Some(ADMIN));
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["lifted"], id.as_str());
    assert_eq!(server.delete(&format!("/v1/holds/{id}"), Some(ADMIN)).0, 404, "lifted once");
    assert!(!holds(&server).iter().any(|h| h["id"] == id.as_str()));
    assert!(retention(&server).iter().all(|b| b["holds"].as_array().unwrap().is_empty()));

    // What it held is re-planned and expires on the next pass.
    let (status, body) = server.post("/v1/archive", Some(ADMIN), None);
    assert_eq!(status, 200, "{body}");
    for b in retention(&server).iter().filter(|b| b["end"].as_str().unwrap() <= "2025-01-01T00:00:00Z") {
        assert_eq!(b["state"], "expired", "{b}");
    }
}

#[test]
fn the_cli_places_lists_and_lifts_holds_and_verifies_through_a_running_engine() {
    let d = lifecycle_dirs();
    let server = Server::start(&d, &["--interval-seconds", "3600"], true);
    let cli = |args: &[&str], user: &str, admin: Option<&str>| {
        let mut command = command(&d);
        command.args(args).stdin(Stdio::null()).env("FROSTLINE_TOKEN", user);
        if let Some(admin) = admin {
            command.env("FROSTLINE_ADMIN_TOKEN", admin);
        }
        command.output().unwrap()
    };
    let (status, body) = server.post("/v1/tables/events/records", Some(USER), Some(&sample_lines(30).join("\n")));
    assert_eq!(status, 200, "{body}");

    let place = ["hold", "place", "--table", "events", "--partition", "site-1", "--reason", "audit", "--by", "ops"];
    let refused = cli(&place, USER, None);
    assert!(!refused.status.success());
    assert!(text(&refused.stderr).contains("FROSTLINE_ADMIN_TOKEN"), "{}", text(&refused.stderr));
    assert_eq!(holds(&server).len(), 1, "only the policy hold");

    let placed = cli(&place, USER, Some(ADMIN));
    assert!(placed.status.success(), "{}", text(&placed.stderr));
    let placed: serde_json::Value = serde_json::from_slice(&placed.stdout).unwrap();
    let id = placed["id"].as_str().unwrap().to_string();
    assert!(placed["covered_buckets"].as_u64().unwrap() > 0, "{placed}");
    let unknown = cli(&["hold", "place", "--table", "nope", "--reason", "x"], USER, Some(ADMIN));
    assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown.stderr));

    let listed = cli(&["hold", "list", "--json"], USER, None);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let ours = listed.as_array().unwrap().iter().find(|h| h["id"] == id.as_str()).unwrap();
    assert_eq!((&ours["placed_by"], &ours["covered_buckets"]), (&"ops".into(), &placed["covered_buckets"]));
    let human = cli(&["hold", "list"], USER, None);
    assert!(text(&human.stdout).contains(&id) && text(&human.stdout).contains("regulator request"));

    let policy_hold = listed.as_array().unwrap().iter().find(|h| h["table"] == "audit").unwrap()["id"].clone();
    let refused = cli(&["hold", "lift", policy_hold.as_str().unwrap()], USER, Some(ADMIN));
    assert!(!refused.status.success() && text(&refused.stderr).contains("policy directory"));
    let lifted = cli(&["hold", "lift", &id, "--by", "ops"], USER, Some(ADMIN));
    assert!(lifted.status.success(), "{}", text(&lifted.stderr));
    assert_eq!(text(&lifted.stdout).trim(), format!(r#"{{"lifted":"{id}"}}"#));
    assert!(!holds(&server).iter().any(|h| h["id"] == id.as_str()));
    let again = cli(&["hold", "lift", &id], USER, Some(ADMIN));
    assert!(!again.status.success() && text(&again.stderr).contains("no hold"), "{}", text(&again.stderr));

    assert_eq!(server.post("/v1/archive", Some(ADMIN), None).0, 200);
    let verified = cli(&["verify"], USER, Some(ADMIN));
    assert!(verified.status.success(), "{}{}", text(&verified.stdout), text(&verified.stderr));
    assert!(text(&verified.stdout).contains(", 0 failed"), "{}", text(&verified.stdout));
    let json = cli(&["verify", "--json", "--table", "events", "--sample", "1"], USER, Some(ADMIN));
    assert!(json.status.success(), "{}", text(&json.stderr));
    let verdicts: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(verdicts.as_array().unwrap().len() <= 1 && verdicts.as_array().unwrap().iter().all(|v| v["ok"] == true));
    let refused = cli(&["verify"], USER, None);
    assert!(!refused.status.success() && text(&refused.stderr).contains("403"), "{}", text(&refused.stderr));
}

/// `command(d)` whose process starts with an open-file soft limit of `soft` (the hard limit
/// unchanged), as under a shell's `ulimit -Sn` or a systemd unit without `LimitNOFILE`.
fn command_with_soft_open_files(d: &Dirs, soft: u64) -> Command {
    use std::os::unix::process::CommandExt as _;
    let mut command = command(d);
    // SAFETY: getrlimit and setrlimit are async-signal-safe and touch only the child's limits.
    unsafe {
        command.pre_exec(move || {
            let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit.rlim_cur = (soft as libc::rlim_t).min(limit.rlim_max);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
}

/// The soft and hard open-file limits of process `pid`, from `/proc/<pid>/limits`.
fn open_file_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let mut values = line["Max open files".len()..].split_whitespace().map(|v| v.parse::<u64>().unwrap());
    (values.next().unwrap(), values.next().unwrap())
}

/// Files process `pid` holds open now.
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|dir| dir.count()).unwrap_or(0)
}

/// `n` connections to `addr` that never send a byte.
fn idle_connections(addr: &str, n: usize) -> Vec<std::net::TcpStream> {
    (0..n).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect()
}

/// `GET /health` on a new connection, waiting at most `bound` for the whole answer: its
/// status, or why none came.
fn health_within(addr: &str, bound: Duration) -> Result<u16, String> {
    let started = Instant::now();
    let late = || format!("no answer within {bound:?}");
    let mut stream = std::net::TcpStream::connect_timeout(&addr.parse().unwrap(), bound)
        .map_err(|e| format!("cannot connect: {e}"))?;
    write!(stream, "GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("cannot send the request: {e}"))?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = bound.checked_sub(started.elapsed()).filter(|left| !left.is_zero()).ok_or_else(late)?;
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(late());
            }
            Err(e) => return Err(format!("the connection failed: {e}")),
        }
    }
    let answer = text(&answer);
    answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| format!("not HTTP: {answer:?}"))
}

/// A log without its colours (ANSI escape sequences).
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, then a final byte in @..~.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The last lines of a log, for a failure message.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Raises this test process's open-file soft limit to its hard limit: it holds hundreds of
/// connections.
fn raise_own_open_files() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// The issue "a thousand idle connections stop the API", at a smaller scale: the engine starts
/// with an open-file soft limit of 256 and receives more connections than that which never send
/// a byte. It raised its soft limit to the hard one at start (and said so), holds at most
/// `--max-connections` at once (the kernel's backlog queues the rest) and closes each that sends
/// nothing within the first-request timeout; so `/health` answers within seconds, and appends,
/// queries and archival go on while more idle connections keep arriving. The engine never holds
/// as many files as the limit it was started with.
#[test]
fn idle_connections_past_the_open_file_limit_leave_the_api_serving() {
    const SOFT: u64 = 256;
    const IDLE: usize = 300;
    const CAP: usize = 64;
    raise_own_open_files();
    let d = dirs();
    let mut command = command_with_soft_open_files(&d, SOFT);
    command.env("FROSTLINE_MAX_CONNECTIONS", CAP.to_string()).env("FROSTLINE_FIRST_REQUEST_TIMEOUT_SECONDS", "1");
    let server = Server::start_command(&d, command, &["--interval-seconds", "3600"], true);
    let pid = server.child.id();

    // More idle connections than the limit the engine was started with: /health is answered
    // once the idle ones ahead of it have been closed, about IDLE / CAP first-request timeouts.
    let idle = idle_connections(&server.addr, IDLE);
    let started = Instant::now();
    let bound = Duration::from_secs(30);
    let status = health_within(&server.addr, bound).unwrap_or_else(|e| {
        panic!("GET /health behind {IDLE} idle connections: {e}; the log ends:\n{}", tail(&server.log()))
    });
    assert_eq!(status, 200);
    eprintln!("/health answered {:?} after {IDLE} idle connections", started.elapsed());

    // The engine raised its soft limit to the hard one, and said so.
    let (soft, hard) = open_file_limits(pid);
    assert_eq!(soft, hard, "the soft open-file limit is raised to the hard one; log:\n{}", server.log());
    if hard > SOFT {
        let log = plain(&server.log());
        let said =
            format!("raised the open-file soft limit (RLIMIT_NOFILE) to the hard limit soft_before={SOFT} soft={hard}");
        assert!(log.contains(&said), "{}", tail(&log));
    }

    // Idle connections keep arriving, about 80 a second (more than the engine closes: it is at
    // its cap throughout), while records are appended, read and archived.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let (addr, stop) = (server.addr.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut held, mut most_files) = (Vec::new(), 0);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && held.len() < 2_000 {
                held.extend(idle_connections(&addr, 8));
                most_files = most_files.max(open_files(pid));
                std::thread::sleep(Duration::from_millis(100));
            }
            (held.len(), most_files)
        })
    };
    let lines = sample_lines(40);
    let (status, body) = server.post("/v1/tables/events/records", Some(USER), Some(&lines.join("\n")));
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.post("/v1/archive", Some(ADMIN), None);
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(report["archived"].as_u64().unwrap() > 0, "{report}");
    assert!(!server.json("/v1/tables/events/buckets?state=archived")["buckets"].as_array().unwrap().is_empty());
    assert_eq!(count_records(&server), 40, "hot and archived records are read back");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (flooded, most_files) = flood.join().unwrap();
    eprintln!("{flooded} more idle connections; the engine held at most {most_files} files");
    assert!(most_files < SOFT as usize, "the engine held {most_files} files, the cap is {CAP}");
    assert!(health_within(&server.addr, bound).is_ok());
    let log = server.log();
    assert!(!log.contains("Too many open files"), "{}", tail(&log));
    drop(idle);
}

/// At `--max-connections`, a further connection is not served until one held is closed, here
/// by the first-request timeout, since the held ones never send a byte; the server closes them
/// and counts them in its log. A connection that has sent its first byte is not timed out.
#[test]
fn the_connection_cap_holds_until_idle_connections_time_out() {
    const CAP: usize = 4;
    const TIMEOUT: Duration = Duration::from_secs(3);
    let d = dirs();
    let mut command = command(&d);
    command
        .env("FROSTLINE_MAX_CONNECTIONS", CAP.to_string())
        .env("FROSTLINE_FIRST_REQUEST_TIMEOUT_SECONDS", TIMEOUT.as_secs().to_string())
        .env("FROSTLINE_LOG", "info,frostline::api::connections=debug");
    let server = Server::start_command(&d, command, &["--interval-seconds", "3600"], true);

    // The held connections are ahead of the request in the kernel's queue: the engine takes
    // them first, and the request only once the first of them is closed.
    let opened = Instant::now();
    let mut idle = idle_connections(&server.addr, CAP);
    let status = health_within(&server.addr, WAIT).unwrap_or_else(|e| panic!("{e}; log:\n{}", tail(&server.log())));
    let waited = opened.elapsed();
    assert_eq!(status, 200);
    assert!(
        waited >= TIMEOUT - Duration::from_millis(50),
        "a request beyond the cap of {CAP} was answered after {waited:?}, before the first-request timeout \
         ({TIMEOUT:?}) closed any held connection"
    );
    for stream in &mut idle {
        stream.set_read_timeout(Some(WAIT)).unwrap();
        match stream.read(&mut [0u8; 64]) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("an idle connection was not closed by the engine: {other:?}"),
        }
    }
    server.wait_for("the count of idle connections closed", |s| {
        plain(&s.log())
            .lines()
            .any(|l| l.contains("closed a connection that sent nothing") && l.ends_with(&format!(" closed_idle={CAP}")))
    });

    // After the first byte, the first-request timeout no longer applies.
    let mut slow = std::net::TcpStream::connect(&server.addr).unwrap();
    write!(slow, "GET /health HTTP/1.1\r\n").unwrap();
    std::thread::sleep(TIMEOUT + Duration::from_secs(1));
    write!(slow, "Host: {}\r\nConnection: close\r\n\r\n", server.addr).unwrap();
    slow.set_read_timeout(Some(WAIT)).unwrap();
    let mut answer = Vec::new();
    let _ = slow.read_to_end(&mut answer);
    assert!(text(&answer).starts_with("HTTP/1.1 200"), "{:?}", text(&answer));
}

/// Erasure through the API: only an admin token places or reads requests (they name what they
/// erase); a dry run is 200 and changes nothing; a request with nothing to select by is 422; a
/// placed one is 201, carried out by the next archival, and its receipt reads back finished.
#[test]
fn an_erasure_placed_through_the_api_is_carried_out_and_its_receipt_reads_back() {
    let d = dirs();
    let server = Server::start(&d, &["--interval-seconds", "3600"], true);
    let lines = sample_lines(300);
    assert_eq!(server.post("/v1/tables/events/records", Some(USER), Some(&lines.join("\n"))).0, 200);
    assert_eq!(server.post("/v1/archive", Some(ADMIN), None).0, 200);
    let erase = r#"{"table":"events","partition":"site-1","reason":"request 9","requested_by":"dpo"}"#;
    for (status, _) in [server.post("/v1/erasures", Some(USER), Some(erase)), server.get("/v1/erasures", Some(USER))] {
        assert_eq!(status, 403);
    }
    let nothing = r#"{"table":"events","reason":"request 9","requested_by":"dpo"}"#;
    let (status, body) = server.post("/v1/erasures", Some(ADMIN), Some(nothing));
    assert_eq!(status, 422, "{body}");
    let dry = r#"{"table":"events","partition":"site-1","reason":"request 9","requested_by":"dpo","dry_run":true}"#;
    let (status, body) = server.post("/v1/erasures", Some(ADMIN), Some(dry));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"archived_buckets\""), "{body}");
    assert_eq!(server.json_as("/v1/erasures", ADMIN)["erasures"], serde_json::json!([]), "a dry run places nothing");
    assert_eq!(count_records(&server), 300);

    let (status, body) = server.post("/v1/erasures", Some(ADMIN), Some(erase));
    assert_eq!(status, 201, "{body}");
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["request"]["id"].as_str().unwrap().to_string();
    let (status, body) = server.post("/v1/archive", Some(ADMIN), None);
    assert_eq!(status, 200, "{body}\nlog:\n{}", server.log());
    let receipt = server.json_as(&format!("/v1/erasures/{id}"), ADMIN);
    assert!(receipt["finished_at"].is_i64(), "{receipt}");
    assert_eq!(count_records(&server), 200, "site-1's third of the records is gone");
    assert!(server.all_records(1_000).iter().all(|r| r["partition_key"] != "site-1"));
    assert_eq!(server.get("/v1/erasures/e-unknown", Some(ADMIN)).0, 404);
}

/// `?backfill=true` (what `frostline ingest` sends to a running engine) appends like any batch
/// and pauses the table's archival while the backfill goes on; an unknown parameter is refused
/// and writes nothing.
#[test]
fn a_backfill_batch_appends_and_pauses_the_tables_archival() {
    let d = dirs();
    let server = Server::start(&d, &["--interval-seconds", "3600"], true);
    let lines = sample_lines(30).join("\n");
    let (status, body) = server.post("/v1/tables/events/records?backfill=yes", Some(USER), Some(&lines));
    assert_eq!(status, 400, "{body}");
    let (status, body) = server.post("/v1/tables/events/records?backfil=true", Some(USER), Some(&lines));
    assert_eq!(status, 400, "{body}");
    assert_eq!(count_records(&server), 0);
    let (status, body) = server.post("/v1/tables/events/records?backfill=true", Some(USER), Some(&lines));
    assert_eq!(status, 200, "{body}");
    assert_eq!(count_records(&server), 30);
    let (status, report) = server.post("/v1/archive", Some(ADMIN), None);
    assert_eq!(status, 200, "{report}");
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["archived"], 0, "archival waits for the backfill: {report}");
    // The ingest ends it (`frostline ingest` does, finished or not): archival resumes at once.
    let (status, body) = server.post("/v1/tables/events/records?backfill=end", Some(USER), Some(&lines));
    assert_eq!(status, 400, "records with the end: {body}");
    let (status, body) = server.post("/v1/tables/events/records?backfill=end", Some(USER), Some(""));
    assert_eq!(status, 200, "{body}");
    let (_, report) = server.post("/v1/archive", Some(ADMIN), None);
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert!(report["archived"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(count_records(&server), 30);
}

/// The names of the metrics the queries in `text` use (`frostline_…` and the standard
/// `process_…`), as PromQL spells them.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (start, _) in text.match_indices(['f', 'p']) {
        let rest = &text[start..];
        let preceded_by_word = text[..start].chars().next_back().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if preceded_by_word || !(rest.starts_with("frostline_") || rest.starts_with("process_")) {
            continue;
        }
        let name: String =
            rest.chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
        names.insert(name);
    }
    names
}

fn packaging_file(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging").join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The alert rules load, and their unit tests pass, in Prometheus's own `promtool`
/// (scripts/install-promtool). A rule whose threshold or labels drift from its test fails here.
#[test]
fn the_alert_rules_pass_their_unit_tests_in_promtool() {
    let promtool = std::env::var("FROSTLINE_PROMTOOL").unwrap_or_else(|_| {
        panic!(
            "FROSTLINE_PROMTOOL is not set: run the tests with ./scripts/test (scripts/install-promtool installs it)"
        )
    });
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/prometheus");
    for args in [["check", "rules", "alerts.yml"], ["test", "rules", "alerts.test.yml"]] {
        let out = Command::new(&promtool).args(args).current_dir(&dir).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "promtool {}: {text}", args.join(" "));
        assert!(text.contains("SUCCESS"), "promtool {}: {text}", args.join(" "));
    }
    // Every rule has its test (the test file names each alert it checks).
    let rules = packaging_file("prometheus/alerts.yml");
    let tests = packaging_file("prometheus/alerts.test.yml");
    let alerts: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).collect();
    assert!(alerts.len() >= 10, "{alerts:?}");
    for alert in alerts {
        assert!(tests.contains(&format!("alertname: {alert}\n")), "alert {alert} has no test in alerts.test.yml");
    }
}

/// Every metric the dashboard (packaging/grafana) and the alert rules (packaging/prometheus)
/// query is one a running engine exports, and the counters they watch count: an expiry, an
/// orphan swept after a late record made a bucket's next generation, and a pass error when a
/// target's directory is replaced by a file. Before the error, the error series exist at 0,
/// so `increase()` sees the first one.
#[test]
fn the_dashboard_and_the_alert_rules_query_metrics_a_running_engine_exports_and_that_count() {
    let d = dirs();
    let broken = d.root.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    let retention = r#"{ plugin = "builtin:eligible-before", config = { archive_after = "1s", kinds = { debug = { expire_after = "2s" } } } }"#;
    std::fs::write(
        d.policies.join("tables.toml"),
        format!(
            r#"
[[target]]
name = "broken"
url = "file://{broken}"

[[table]]
id = "events"
writable_buckets = 48
strategy = {{ plugin = "builtin:calendar-month-utc" }}
retention = {retention}

[[table]]
id = "facts"
format = "parquet"
strategy = {{ plugin = "builtin:calendar-month-utc" }}
retention = {retention}

[[table.column]]
name = "v"
type = "int64"
on_mismatch = "null"

[[table]]
id = "doomed"
target = "broken"
strategy = {{ plugin = "builtin:calendar-month-utc" }}
retention = {retention}
"#,
            broken = broken.display()
        ),
    )
    .unwrap();
    let mut command = command(&d);
    command
        .env("FROSTLINE_TEST_ORPHAN_GRACE_SECONDS", "0")
        .env("ARCHIVER_SWEEP_INTERVAL_SECONDS", "1")
        .env("ARCHIVER_LATE_GRACE_SECONDS", "0");
    let server = Server::start_command(&d, command, &["--interval-seconds", "3600"], true);
    let started = server.metrics();
    for kind in ["bucket", "outbox", "catalog", "delta_log", "sweep", "erasure"] {
        assert_eq!(value(&started, "frostline_pass_errors_total", &[("kind", kind)]), 0.0, "{kind}");
    }
    let deferral_reasons = [
        "target_unavailable",
        "target_refused",
        "plugin_fault",
        "corruption",
        "lease_or_fence",
        "local_store",
        "task_panicked",
        "other",
    ];
    for reason in deferral_reasons {
        assert_eq!(value(&started, "frostline_archive_deferrals_total", &[("reason", reason)]), 0.0, "{reason}");
    }
    assert_eq!(value(&started, "frostline_delta_commit_retries_total", &[]), 0.0);

    let record = |partition: &str, time: &str, sort: &str, kind: &str| {
        let kind = if kind.is_empty() { String::new() } else { format!(r#","kind":"{kind}""#) };
        format!(
            r#"{{"partition_key":"{partition}","event_time":"{time}","sort_key":"{sort}"{kind},"body":{{"v":"{sort}"}}}}"#
        )
    };
    let events = [
        record("site/1", "2023-01-05T00:00:00Z", "a", ""),
        record("site/1", "2023-02-05T00:00:00Z", "b", ""),
        record("debug-1", "2023-01-06T00:00:00Z", "c", "debug"),
    ];
    assert_eq!(server.post("/v1/tables/events/records", Some(USER), Some(&events.join("\n"))).0, 200);
    // Its `v` is a string, not the int64 `facts` declares: stored as null and counted.
    assert_eq!(value(&started, "frostline_column_misses_total", &[]), 0.0);
    let fact = record("p", "2023-01-05T00:00:00Z", "f", "");
    let (status, answer) = server.post("/v1/tables/facts/records", Some(USER), Some(&fact));
    assert_eq!(
        (status, answer.as_str()),
        (200, r#"{"appended":1,"duplicates":0,"already_archived":0,"column_misses":1}"#)
    );
    assert_eq!(value(&server.metrics(), "frostline_column_misses_total", &[]), 1.0);
    assert_eq!(server.post("/v1/tables/events/records", Some(USER), Some("not json")).0, 422);
    let archive = |s: &Server| {
        let (status, body) = s.post("/v1/archive", Some(ADMIN), None);
        assert_eq!(status, 200, "{body}");
    };
    archive(&server);
    // A late record for the archived January bucket: its next generation replaces the first,
    // whose objects the sweep deletes (no grace period here).
    let late = record("site/1", "2023-01-20T00:00:00Z", "late", "");
    assert_eq!(server.post("/v1/tables/events/records", Some(USER), Some(&late)).0, 200);
    server.wait_for("an expiry and an orphan swept", |s| {
        archive(s);
        let m = s.metrics();
        value(&m, "frostline_buckets_expired_total", &[]) >= 1.0
            && value(&m, "frostline_orphans_deleted_total", &[]) >= 1.0
    });

    // The target's directory replaced by a file: the archival of a bucket there fails.
    std::fs::remove_dir_all(&broken).unwrap();
    std::fs::write(&broken, "not a directory").unwrap();
    let doomed = record("p", "2023-01-05T00:00:00Z", "d", "");
    assert_eq!(server.post("/v1/tables/doomed/records", Some(USER), Some(&doomed)).0, 200);
    server.wait_for("a pass error", |s| {
        archive(s);
        value(&s.metrics(), "frostline_pass_errors_total", &[("kind", "bucket")]) >= 1.0
    });
    // The failed archival was deferred, and counted under the target's reason.
    let deferred = server.metrics();
    let target_deferrals = value(&deferred, "frostline_archive_deferrals_total", &[("reason", "target_unavailable")])
        + value(&deferred, "frostline_archive_deferrals_total", &[("reason", "target_refused")]);
    assert!(target_deferrals >= 1.0, "{deferred}");
    assert_eq!(value(&deferred, "frostline_archive_deferrals_total", &[("reason", "other")]), 0.0);

    let scraped = server.metrics();
    let series: BTreeSet<&str> =
        scraped.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(['{', ' ']).next()).collect();
    assert!(value(&scraped, "frostline_archive_pass_duration_seconds_count", &[]) >= 3.0);
    assert!(value(&scraped, "frostline_store_file_bytes", &[]) > 0.0);
    assert!(value(&scraped, "process_resident_memory_bytes", &[]) > 0.0);
    assert_eq!(value(&scraped, "frostline_delta_log_sync_failing", &[("table", "facts")]), 0.0);
    let dashboard: serde_json::Value = serde_json::from_str(&packaging_file("grafana/frostline.json")).unwrap();
    let mut exprs = Vec::new();
    fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    match value {
                        serde_json::Value::String(s) if key == "expr" => out.push(s.clone()),
                        other => collect_exprs(other, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|item| collect_exprs(item, out)),
            _ => {}
        }
    }
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 20, "{exprs:?}");
    let rules = packaging_file("prometheus/alerts.yml");
    let rule_exprs: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("expr: ")).collect();
    for (source, text) in [
        ("packaging/grafana/frostline.json", exprs.join("\n")),
        ("packaging/prometheus/alerts.yml", rule_exprs.join("\n")),
    ] {
        let names = metric_names(&text);
        assert!(names.len() >= 10, "{source}: {names:?}");
        let missing: Vec<&String> = names.iter().filter(|name| !series.contains(name.as_str())).collect();
        assert!(
            missing.is_empty(),
            "{source} queries metrics the engine does not export: {missing:?}\nscrape:\n{scraped}"
        );
    }
}

/// Each bucket is archived in its own task, many at once, under a span that names it. The span
/// was entered with a guard held across awaits, so it stayed the current span of the worker
/// thread while other tasks ran there: their spans nested under it, and once it closed, the
/// next span made on that thread panicked the task (tracing-subscriber's registry asserts
/// this in every build), and with it the pass. Under the default log level, as operators run.
#[test]
fn concurrent_archival_under_the_default_log_level_panics_no_task_and_fails_no_pass() {
    let d = dirs();
    let mut command = command(&d);
    command.env_remove("FROSTLINE_LOG").env("ARCHIVER_CONCURRENCY", "16");
    let server = Server::start_command(&d, command, &["--interval-seconds", "3600", "--scan-limit", "1000"], true);
    // 30 partitions of 24 months each: 720 buckets, all due.
    let lines: Vec<String> = (0..2_160)
        .map(|i| {
            let time =
                frostline::model::time::format_rfc3339(t("2023-01-01T00:00:00Z") + (i / 30) * 10 * 86_400_000_000);
            line(&format!("site/{} %=ü", i % 30), &time, &format!("{i:06}"), &format!(r#"{{"i":{i}}}"#))
        })
        .collect();
    for chunk in lines.chunks(1_000) {
        let (status, body) = server.post("/v1/tables/events/records", Some(USER), Some(&chunk.join("\n")));
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = server.post("/v1/archive", Some(ADMIN), None);
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    // The log as an operator reads it, without its colours.
    let log = without_colours(&server.log());
    assert!(!log.contains("panicked") && !log.contains("pass failed"), "{log}");
    assert_eq!(report["errors"].as_array().map_or(0, Vec::len), 0, "{report}");
    let status = server.json("/v1/status");
    let states = &status["tables"][0]["states"];
    assert_eq!((&states["archived"]["buckets"], &states["archived"]["rows"]), (&720.into(), &2_160.into()), "{status}");
    // A bucket's log lines carry its own span, never another bucket's around it.
    assert!(!log.contains("}:archive{"), "{log}");
}

/// `text` without its terminal colour codes (ESC [ ... m).
fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

/// A running engine works through a backlog pass after pass, the interval only pacing it once
/// it has caught up: with passes every hour and 8 buckets a pass, 72 due buckets are archived
/// now, not 8 an hour (before, a pass waited out the interval whatever was left).
#[test]
fn a_backlog_is_archived_pass_after_pass_without_waiting_for_the_interval() {
    let d = dirs();
    let ingest = run_cli(command(&d), &["ingest", "--table", "events", "-"], Some(&sample_lines(2_000).join("\n")));
    assert!(ingest.status.success(), "{}", text(&ingest.stderr));
    let server = Server::start(&d, &["--interval-seconds", "3600", "--scan-limit", "8"], true);
    server.wait_for("every due bucket archived", |s| {
        let status = s.json("/v1/status");
        status["due_now"] == 0 && status["tables"][0]["states"]["archived"]["buckets"] == 72
    });
}

const ACME: &str = "acme-token-0123456789abcdef";
const ACME_READER: &str = "acme-reader-0123456789abcdef";
const ACME_ADMIN: &str = "acme-admin-0123456789abcdef";
const GLOBEX: &str = "globex-token-0123456789abcdef";

/// A record line of a tenant (`None`: no tenant).
fn tenant_line(tenant: Option<&str>, time: &str, sort: &str) -> String {
    let tenant = tenant.map(|t| format!(r#","tenant":"{t}""#)).unwrap_or_default();
    format!(
        r#"{{"partition_key":"site/α b%=","event_time":"{time}","sort_key":"{sort}"{tenant},"body":{{"s":"ünï ✓"}}}}"#
    )
}

/// The tenants of every record `token` reads of `events`, page by page (`extra`: more
/// parameters), or the refusal's status.
fn tenants_read(server: &Server, token: &str, extra: &str) -> Result<Vec<String>, (u16, String)> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/tables/events/records?limit=2{extra}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (status, body) = server.get(&path, Some(token));
        if status != 200 {
            return Err((status, body));
        }
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        out.extend(page["records"].as_array().unwrap().iter().map(|r| r["tenant"].as_str().unwrap_or("-").to_string()));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return Ok(out),
        }
    }
}

#[test]
fn tenant_limited_tokens_reach_only_their_tenants_and_are_read_again_when_their_file_changes() {
    let d = dirs();
    let (token_file, admin_file) = (d.root.path().join("tokens"), d.root.path().join("admin-tokens"));
    std::fs::write(
        &token_file,
        format!(
            "# everything\n{USER}\n{ACME} tenants=acme\n{ACME_READER} tenants=acme access=read\n\
             {GLOBEX} tenants=globex tables=events\n"
        ),
    )
    .unwrap();
    std::fs::write(&admin_file, format!("{ADMIN}\n{ACME_ADMIN} tenants=acme\n")).unwrap();
    let mut command = command(&d);
    command.env("FROSTLINE_TOKEN_FILE", &token_file).env("FROSTLINE_ADMIN_TOKEN_FILE", &admin_file);
    let server = Server::start_command(&d, command, &["--interval-seconds", "3600"], false);
    let append =
        |token: &str, lines: &[String]| server.post("/v1/tables/events/records", Some(token), Some(&lines.join("\n")));

    // Appends: a limited token writes its tenants' records only, and a batch with any other
    // record (another tenant's, or one without a tenant) is refused whole.
    let acme = |n: usize| tenant_line(Some("acme"), &format!("2025-02-0{}T00:00:00Z", n + 1), &format!("a{n}"));
    assert_eq!(append(ACME, &[acme(0), acme(1)]).0, 200);
    for (token, batch) in [
        (ACME, vec![acme(2), tenant_line(Some("globex"), "2025-02-01T00:00:00Z", "g9")]),
        (ACME, vec![acme(2), tenant_line(None, "2025-02-01T00:00:00Z", "n9")]),
        (GLOBEX, vec![acme(2)]),
    ] {
        let (status, body) = append(token, &batch);
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("nothing was written") && body.contains("limited to tenants"), "{body}");
    }
    let (status, body) = append(ACME_READER, &[acme(2)]);
    assert_eq!((status, body.contains("access=read")), (403, true), "{body}");
    assert_eq!(append(GLOBEX, &[tenant_line(Some("globex"), "2025-02-03T00:00:00Z", "g0")]).0, 200);
    assert_eq!(append(USER, &[tenant_line(None, "2025-02-04T00:00:00Z", "n0")]).0, 200);
    assert_eq!(count_records(&server), 4, "the refused batches wrote nothing");
    // A table's column declaration holds no records: every token that reaches the table reads it.
    for token in [ACME, ACME_READER, GLOBEX] {
        let (status, body) = server.get("/v1/tables/events/columns", Some(token));
        assert_eq!((status, body.as_str()), (200, r#"{"table":"events","columns":[]}"#));
    }

    // Queries: a limited token reads its tenants' records only, page by page, and may not name
    // another tenant.
    assert_eq!(tenants_read(&server, ACME, "").unwrap(), ["acme", "acme"]);
    assert_eq!(tenants_read(&server, ACME_READER, "&tenant=acme").unwrap(), ["acme", "acme"]);
    assert_eq!(tenants_read(&server, GLOBEX, "").unwrap(), ["globex"]);
    let (status, body) = tenants_read(&server, ACME, "&tenant=globex").unwrap_err();
    assert_eq!(status, 403, "{body}");
    assert_eq!(tenants_read(&server, USER, "&tenant=globex").unwrap(), ["globex"]);
    assert_eq!(tenants_read(&server, USER, "").unwrap().len(), 4);

    // Routes that answer for every tenant refuse a limited token; those that name none serve it.
    for path in ["/v1/status", "/metrics", "/v1/tables/events/buckets", "/v1/tables/events/retention"] {
        let (status, body) = server.get(path, Some(ACME));
        assert_eq!(status, 403, "{path}: {body}");
    }
    assert_eq!(server.get("/v1/plugins", Some(ACME)).0, 200);
    assert_eq!(server.get("/v1/tables/events/buckets", Some(GLOBEX)).0, 403, "limited to tenants too");
    assert_eq!(server.post("/v1/archive", Some(ACME_ADMIN), None).0, 403);

    // Holds: a limited admin token places and lifts its tenants' holds only, and lists only them.
    let hold = |tenant: Option<&str>| {
        let tenant = tenant.map(|t| format!(r#","tenant":"{t}""#)).unwrap_or_default();
        format!(r#"{{"table":"events"{tenant},"reason":"audit","placed_by":"ops"}}"#)
    };
    let (status, body) = server.post("/v1/holds", Some(ACME_ADMIN), Some(&hold(Some("acme"))));
    assert_eq!(status, 201, "{body}");
    let acme_hold = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"].as_str().unwrap().to_string();
    for tenant in [Some("globex"), None] {
        assert_eq!(server.post("/v1/holds", Some(ACME_ADMIN), Some(&hold(tenant))).0, 403, "{tenant:?}");
    }
    let (status, body) = server.post("/v1/holds", Some(ADMIN), Some(&hold(Some("globex"))));
    assert_eq!(status, 201, "{body}");
    let globex_hold = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"].as_str().unwrap().to_string();
    let held = |token: &str| -> Vec<String> {
        let holds = server.json_as("/v1/holds", token)["holds"].as_array().unwrap().clone();
        holds.iter().map(|h| h["id"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(held(ACME), std::slice::from_ref(&acme_hold));
    assert_eq!(held(USER).len(), 2);
    assert_eq!(server.delete(&format!("/v1/holds/{globex_hold}"), Some(ACME_ADMIN)).0, 403);
    assert_eq!(held(USER).len(), 2, "the refused lift changed nothing");
    assert_eq!(server.delete(&format!("/v1/holds/{acme_hold}"), Some(ACME_ADMIN)).0, 200);

    // Erasures: the same, for requests.
    let erasure = |tenant: &str| format!(r#"{{"tenant":"{tenant}","reason":"gdpr","requested_by":"dpo"}}"#);
    assert_eq!(server.post("/v1/erasures", Some(ACME_ADMIN), Some(&erasure("globex"))).0, 403);
    assert_eq!(count_records(&server), 4, "the refused erasure changed nothing");
    let (status, body) = server.post("/v1/erasures", Some(ADMIN), Some(&erasure("globex")));
    assert_eq!(status, 201, "{body}");
    let globex_request =
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["request"]["id"].as_str().unwrap().to_string();
    let (status, body) = server.post("/v1/erasures", Some(ACME_ADMIN), Some(&erasure("acme")));
    assert_eq!(status, 201, "{body}");
    let listed = server.json_as("/v1/erasures", ACME_ADMIN)["erasures"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["selector"]["tenant"], "acme");
    assert_eq!(server.json_as("/v1/erasures", ADMIN)["erasures"].as_array().unwrap().len(), 2);
    assert_eq!(server.get(&format!("/v1/erasures/{globex_request}"), Some(ACME_ADMIN)).0, 403);
    // A hold blocks an erasure of the buckets it covers: the operator lifts globex's first.
    assert_eq!(server.delete(&format!("/v1/holds/{globex_hold}"), Some(ADMIN)).0, 200);
    assert_eq!(server.post("/v1/archive", Some(ADMIN), None).0, 200, "the passes carry the requests out");

    // Rotation: the file is read again when it changes; a set that is refused (a bad line, or
    // no token at all) leaves the tokens in force.
    const ROTATED: &str = "acme-rotated-0123456789abcdef";
    let replace = |path: &Path, text: &str| {
        let next = path.with_extension("next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, path).unwrap();
    };
    replace(&token_file, &format!("{USER}\n{ROTATED} tenants=acme\n"));
    server.wait_for("the rotated token", |s| s.get("/v1/plugins", Some(ROTATED)).0 == 200);
    assert_eq!(server.get("/v1/plugins", Some(ACME)).0, 401, "the token taken out of the file is refused");
    assert_eq!(
        tenants_read(&server, ROTATED, "").unwrap(),
        Vec::<String>::new(),
        "acme's records were erased: {}",
        server.get("/v1/erasures", Some(ADMIN)).1
    );
    replace(&token_file, &format!("{USER}\nshort tenants=acme\n"));
    server.wait_for("the refusal of a bad line", |s| s.log().contains("the token files were refused"));
    assert_eq!(server.get("/v1/plugins", Some(ROTATED)).0, 200, "the tokens in force stay");
    std::fs::write(&admin_file, "").unwrap();
    replace(&token_file, "# emptied\n");
    server.wait_for("the refusal of no token", |s| s.log().contains("which would let every request in"));
    assert_eq!(server.get("/v1/plugins", Some(ROTATED)).0, 200, "an emptied file does not open the API");
    assert_eq!(server.get("/v1/plugins", None).0, 401);
    // SIGHUP reads them again too.
    replace(&token_file, &format!("{USER}\n"));
    std::fs::write(&admin_file, format!("{ADMIN}\n")).unwrap();
    server.wait_for("the restored files", |s| s.get("/v1/plugins", Some(ROTATED)).0 == 401);
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGHUP) };
    server.wait_for("SIGHUP", |s| s.log().contains("SIGHUP: the token files were read again"));
}

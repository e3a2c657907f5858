//! Native object storage targets against real servers the tests start on 127.0.0.1: moto's S3
//! server and Azurite (installed by scripts/install-test-servers, found through
//! FROSTLINE_MOTO_SERVER and FROSTLINE_AZURITE, which scripts/test sets). Each test starts its
//! own server on a free port and stops it when done. Also: the probe that refuses a store
//! which overwrites on a conditional create, outages and error answers (archival defers,
//! nothing is lost), and credentials that never reach a message or the status.
//!
//! GCS has no emulator here that accepts object_store's writes: gs:// is covered by the
//! configuration tests in engine/src/storage/target/mod.rs.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use frostline::model::Record;
use frostline::policy::LoadOptions;
use frostline::storage::faults::{CreateIgnored, Fault, FaultyBackend, Op};
use frostline::storage::{ArchiveBackend, ObjectInfo, PutOutcome};

use crate::support::{TestEngine, runtime, sorted, t, text};

const NOW: &str = "2026-03-01T00:00:00Z";
/// Secrets written to the policy directory's secret files; none may appear in any output.
pub(crate) const KEY_ID: &str = "AKIDFROSTLINETEST42";
pub(crate) const SECRET_KEY: &str = "fR0stL1ne/SecretAccessKey+NeverPrinted0123";
pub(crate) const SESSION_TOKEN: &str = "FrostlineSessionTokenNeverPrinted9876";
const SERVER_START_SECONDS_MAX: u64 = 60;
const RETRY_US: i64 = 15_000_000;

// ---------------------------------------------------------------------------------------------
// Servers

fn server_binary(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run the tests with ./scripts/test, which installs moto and Azurite \
             (scripts/install-test-servers) and sets FROSTLINE_MOTO_SERVER and FROSTLINE_AZURITE"
        )
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// A server process, killed (with its whole life's log kept for failures) when dropped.
pub(crate) struct Server {
    kind: &'static str,
    port: u16,
    child: Option<Child>,
    log: PathBuf,
    dir: tempfile::TempDir,
}

impl Server {
    pub(crate) fn moto() -> Server {
        Self::moto_on(free_port())
    }

    fn moto_on(port: u16) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let mut server = Server { kind: "moto", port, child: None, log: dir.path().join("server.log"), dir };
        server.start();
        server
    }

    fn azurite() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let mut server =
            Server { kind: "azurite", port: free_port(), child: None, log: dir.path().join("server.log"), dir };
        server.start();
        server
    }

    fn start(&mut self) {
        assert!(self.child.is_none(), "{} already runs", self.kind);
        let port = self.port.to_string();
        let mut command = match self.kind {
            "moto" => {
                let mut c = Command::new(server_binary("FROSTLINE_MOTO_SERVER"));
                c.args(["-H", "127.0.0.1", "-p", &port]);
                c
            }
            _ => {
                let location = self.dir.path().join("azurite");
                let mut c = Command::new(server_binary("FROSTLINE_AZURITE"));
                c.args(["--blobHost", "127.0.0.1", "--blobPort", &port, "--location"]).arg(&location).args([
                    "--disableTelemetry",
                    "--skipApiVersionCheck",
                    "--silent",
                ]);
                c
            }
        };
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        command.stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log);
        // The server dies with the test thread that started it, even if the test binary is killed.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self.child = Some(command.spawn().unwrap_or_else(|e| panic!("starting {}: {e}", self.kind)));
        let deadline = Instant::now() + Duration::from_secs(SERVER_START_SECONDS_MAX);
        let url = format!("http://127.0.0.1:{}/", self.port);
        loop {
            if agent().get(&url).call().is_ok() {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("{} exited with {status} while starting:\n{}", self.kind, self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "{} did not answer within {SERVER_START_SECONDS_MAX} s:\n{}",
                self.kind,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Nothing answers on the port any more.
        assert!(TcpStream::connect(("127.0.0.1", self.port)).is_err(), "{} still answers", self.kind);
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates a bucket (moto) or a container (Azurite): object_store cannot.
    pub(crate) fn create_bucket(&self, name: &str) {
        let (status, body) = match self.kind {
            "moto" => {
                let mut response = agent().put(&format!("{}/{name}", self.endpoint())).send_empty().unwrap();
                (response.status().as_u16(), response.body_mut().read_to_string().unwrap_or_default())
            }
            _ => azurite_create_container(self.port, name),
        };
        assert!((200..300).contains(&status), "creating {name} on {}: {status} {body}", self.kind);
    }

    /// Turns S3 versioning on for a moto bucket (moto routes the call only with an
    /// `Authorization` header, whose signature it does not check).
    fn enable_versioning(&self, bucket: &str) {
        let body = r#"<VersioningConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Status>Enabled</Status></VersioningConfiguration>"#;
        let response = agent()
            .put(&format!("{}/{bucket}?versioning", self.endpoint()))
            .header("Authorization", MOTO_UNCHECKED_AUTHORIZATION)
            .header("Content-Type", "application/xml")
            .send(body)
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "enabling versioning on {bucket}");
    }

    /// The keys of a moto bucket's noncurrent versions (what a delete kept).
    fn noncurrent_keys(&self, bucket: &str) -> BTreeSet<String> {
        let mut response = agent()
            .get(&format!("{}/{bucket}?versions", self.endpoint()))
            .header("Authorization", MOTO_UNCHECKED_AUTHORIZATION)
            .call()
            .unwrap();
        let xml = response.body_mut().read_to_string().unwrap();
        let element = |text: &str, name: &str| -> Option<String> {
            let start = text.find(&format!("<{name}>"))? + name.len() + 2;
            let end = text[start..].find(&format!("</{name}>"))? + start;
            Some(text[start..end].to_string())
        };
        xml.split("<Version>")
            .skip(1)
            .map(|version| version.split("</Version>").next().unwrap_or_default())
            .filter(|version| element(version, "IsLatest").as_deref() == Some("false"))
            .filter_map(|version| element(version, "Key"))
            .collect()
    }
}

/// An `Authorization` header moto accepts without checking its signature.
const MOTO_UNCHECKED_AUTHORIZATION: &str =
    "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00";

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(message);
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// `PUT ?restype=container` signed with the emulator account's shared key.
fn azurite_create_container(port: u16, container: &str) -> (u16, String) {
    use base64::Engine as _;
    use frostline::storage::target::{EMULATOR_ACCOUNT as ACCOUNT, EMULATOR_ACCOUNT_KEY};
    let date = time::OffsetDateTime::now_utc()
        .format(time::macros::format_description!(
            "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
        ))
        .unwrap();
    let version = "2021-10-04";
    let string_to_sign = format!(
        "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n/{ACCOUNT}/{ACCOUNT}/{container}\nrestype:container"
    );
    let key = base64::engine::general_purpose::STANDARD.decode(EMULATOR_ACCOUNT_KEY).unwrap();
    let signature = base64::engine::general_purpose::STANDARD.encode(hmac_sha256(&key, string_to_sign.as_bytes()));
    let mut response = agent()
        .put(&format!("http://127.0.0.1:{port}/{ACCOUNT}/{container}?restype=container"))
        .header("x-ms-date", &date)
        .header("x-ms-version", version)
        .header("Authorization", &format!("SharedKey {ACCOUNT}:{signature}"))
        .send_empty()
        .unwrap();
    (response.status().as_u16(), response.body_mut().read_to_string().unwrap_or_default())
}

// ---------------------------------------------------------------------------------------------
// Policies and data

/// Secret files for S3 targets, relative to the policy directory.
pub(crate) const SECRET_FILES: [(&str, &str); 3] =
    [("secrets/s3-key-id", KEY_ID), ("secrets/s3-secret", SECRET_KEY), ("secrets/s3-token", SESSION_TOKEN)];

pub(crate) fn s3_target(endpoint: &str, bucket: &str, extra: &str) -> String {
    format!(
        r#"
[[target]]
name = "cold"
url = "s3://{bucket}/archive/v1"
endpoint = "{endpoint}"
region = "us-east-1"
allow_http = true
access_key_id_file = "secrets/s3-key-id"
secret_access_key_file = "secrets/s3-secret"
session_token_file = "secrets/s3-token"
max_retries = 1
retry_timeout_ms = 2000
request_timeout_ms = 10000
{extra}
"#
    )
}

fn azure_target(endpoint: &str, container: &str, extra: &str) -> String {
    format!(
        r#"
[[target]]
name = "cold"
url = "az://{container}/archive/v1"
use_emulator = true
endpoint = "{endpoint}"
max_retries = 1
retry_timeout_ms = 2000
{extra}
"#
    )
}

/// One table on the target `cold`, monthly buckets, everything before 2025 due.
fn policy(target: &str) -> String {
    format!(
        r#"{target}
[[table]]
id = "metrics"
target = "cold"
strategy = {{ plugin = "builtin:calendar-month-utc" }}
retention = {{ plugin = "builtin:eligible-before", config = {{ cutoff = "2025-01-01T00:00:00Z" }} }}
"#
    )
}

/// `per_month` records in each of `months` months of 2024, over three partitions, with bodies
/// of about `body_bytes`.
fn monthly_records(months: u32, per_month: u32, body_bytes: usize) -> Vec<Record> {
    let mut out = Vec::new();
    for month in 1..=months {
        let start = t(&format!("2024-{month:02}-01T00:00:00Z"));
        for i in 0..per_month {
            let n = month * 1_000_000 + i;
            out.push(Record {
                partition_key: format!("host-{}", n % 3).into_bytes(),
                event_time: start + i as i64 * 1_000_000,
                sort_key: format!("{n:09}").into_bytes(),
                tenant: Some("acme".into()),
                kind: Some("reading".into()),
                body: format!(r#"{{"n":{n},"pad":"{}"}}"#, "x".repeat(body_bytes)),
            });
        }
    }
    out
}

fn open(policy: &str) -> TestEngine {
    TestEngine::open(policy, NOW, &SECRET_FILES, LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

fn append(te: &TestEngine, records: &[Record]) {
    te.engine.append("metrics", records.to_vec()).unwrap_or_else(|e| panic!("{e}"));
}

fn assert_all_readable(te: &TestEngine, records: &[Record]) {
    let read = te.query_all("metrics");
    assert_eq!(read.len(), records.len(), "every record reads back");
    assert_eq!(sorted(read), sorted(records.to_vec()));
}

fn verify(te: &TestEngine) -> usize {
    let verdicts =
        runtime().block_on(frostline::archive::verify::verify(&te.engine.context(), None, None, |_| {})).unwrap();
    for v in &verdicts {
        assert!(v.ok, "verify {}: {:?}", v.bucket, v.error);
    }
    verdicts.len()
}

fn status_json(te: &TestEngine) -> String {
    serde_json::to_string(&frostline::ops::status::collect(&te.engine).unwrap()).unwrap()
}

fn target_report(te: &TestEngine) -> frostline::storage::probe::TargetReport {
    frostline::ops::status::collect(&te.engine).unwrap().targets.into_iter().find(|t| t.name == "cold").unwrap()
}

fn list(backend: &dyn ArchiveBackend, prefix: &str) -> Vec<ObjectInfo> {
    runtime().block_on(backend.list(prefix)).unwrap()
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in [KEY_ID, SECRET_KEY, SESSION_TOKEN] {
        assert!(!text.contains(secret), "{what} shows a secret:\n{text}");
    }
}

// ---------------------------------------------------------------------------------------------
// The protocol against each server

/// Append, pass, query back every record, verify; then a second engine on the bucket's root
/// (the same target without its prefix) sees every key under `archive/v1/`.
fn whole_protocol(server: &Server, target: &str) {
    let te = open(&policy(target));
    let report = target_report(&te);
    assert_eq!(report.probe, "ok", "{report:?}");
    assert_no_secret("status", &status_json(&te));
    let records = monthly_records(3, 200, 40);
    append(&te, &records);
    let pass = te.pass();
    assert!(pass.errors.is_empty(), "{:?}\n{}", pass.errors, server.log_text());
    assert_eq!((pass.archived, pass.deferred), (9, 0), "three months by three partitions");
    assert_all_readable(&te, &records);
    assert_eq!(verify(&te), 9);
    let stored = list(te.backend("metrics").as_ref(), "table=metrics/");
    assert_eq!(stored.iter().filter(|o| o.key.contains("/manifest-")).count(), 9);
    assert!(list(te.backend("metrics").as_ref(), ".tmp/").is_empty());
    assert!(list(te.backend("metrics").as_ref(), ".frostline-probe/").is_empty());
    let root = open(&policy(&target.replace("/archive/v1", "")));
    let all = list(root.backend("metrics").as_ref(), "");
    assert!(!all.is_empty());
    assert!(all.iter().all(|o| o.key.starts_with("archive/v1/table=metrics/")), "{all:?}");
}

/// An S3 bucket with versioning keeps what a delete removes as a noncurrent version, which
/// frostline cannot delete through its object store client: the probe finds it, and `status`
/// and every erasure receipt say so, truthfully (moto's version listing holds each deleted
/// object). A bucket without versioning is not flagged.
#[test]
fn a_versioned_moto_bucket_is_flagged_and_its_erasure_receipts_say_deleted_objects_stay_as_versions() {
    use frostline::clock::Clock as _;
    use frostline::store::erasure::{ErasureSelector, RecordIdentity};
    let server = Server::moto();
    server.create_bucket("plain");
    server.create_bucket("versioned");
    server.enable_versioning("versioned");
    let plain = open(&policy(&s3_target(&server.endpoint(), "plain", "")));
    assert!(!target_report(&plain).keeps_deleted_versions, "{:?}", target_report(&plain));
    drop(plain);

    let te = open(&policy(&s3_target(&server.endpoint(), "versioned", "")));
    assert!(target_report(&te).keeps_deleted_versions, "{:?}", target_report(&te));
    assert!(status_json(&te).contains(r#""keeps_deleted_versions":true"#));
    let records = monthly_records(1, 20, 200);
    append(&te, &records);
    assert_eq!(te.pass().archived, 3, "one month of three partitions");
    let erased = &records[0];
    let selector = ErasureSelector {
        identities: vec![RecordIdentity {
            partition_key: text(&erased.partition_key),
            event_time: erased.event_time,
            sort_key: text(&erased.sort_key),
        }],
        ..Default::default()
    };
    let request = crate::support::erasure_request("versioned-1", selector);
    te.engine.store().place_erasure(request, te.clock.now()).unwrap();
    for _ in 0..6 {
        let report = te.pass();
        assert!(report.errors.is_empty(), "{:?}\n{}", report.errors, server.log_text());
        if !te.engine.store().erasure("versioned-1").unwrap().unwrap().is_open() {
            break;
        }
    }
    let receipt = te.engine.store().erasure("versioned-1").unwrap().unwrap();
    assert!(!receipt.is_open(), "{receipt:?}");
    let deleted: Vec<&String> = receipt.buckets.iter().flat_map(|b| &b.deleted_objects).collect();
    assert!(!deleted.is_empty(), "{receipt:?}");
    for bucket in receipt.buckets.iter().filter(|b| !b.deleted_objects.is_empty()) {
        assert_eq!(bucket.versions_kept_on, vec!["s3://versioned/archive/v1".to_string()], "{bucket:?}");
    }
    // The receipt tells the truth: each deleted object is still a noncurrent version.
    let kept = server.noncurrent_keys("versioned");
    for key in deleted {
        assert!(kept.contains(&format!("archive/v1/{key}")), "`{key}` is no noncurrent version: {kept:?}");
    }
    let left: Vec<Record> = records[1..].to_vec();
    assert_all_readable(&te, &left);
}

#[test]
fn moto_runs_the_whole_protocol() {
    let server = Server::moto();
    server.create_bucket("frostline");
    whole_protocol(&server, &s3_target(&server.endpoint(), "frostline", ""));
}

#[test]
fn azurite_runs_the_whole_protocol() {
    let server = Server::azurite();
    server.create_bucket("frostline");
    whole_protocol(&server, &azure_target(&server.endpoint(), "frostline", ""));
}

/// Segments above the threshold go through a multipart upload to `.tmp/` and a conditional
/// copy; a retry after a lost acknowledgement meets AlreadyExists on the copy and compares.
fn multipart(server: &Server, target: &str) {
    let te = open(&policy(target));
    // About 12 MiB in one bucket of one partition: segments of 8 MiB (two parts) and ~4 MiB.
    let records: Vec<Record> = monthly_records(1, 8_000, 1_500)
        .into_iter()
        .map(|mut r| {
            r.partition_key = b"big".to_vec();
            r
        })
        .collect();
    append(&te, &records);
    // The first large segment lands but its acknowledgement is lost, and so is the read that
    // would settle it: the bucket defers. Its retry uploads the segment again, meets
    // AlreadyExists on the conditional copy, reads the object and finds it identical.
    let faulty = FaultyBackend::new(te.backend("metrics"));
    let first_segment = format!("seg-{}-00000", te.engine.context().writer().unwrap());
    faulty.add(Op::Put, &first_segment, Fault::LandThenError, Some(1));
    faulty.add(Op::Get, &first_segment, Fault::Error, Some(1));
    te.with_backend("metrics", faulty.clone());
    let first = te.pass();
    assert_eq!((first.archived, first.deferred), (0, 1), "{:?}\n{}", first.errors, server.log_text());
    assert_all_readable(&te, &records);
    te.clock.advance(RETRY_US + 1);
    let second = te.pass();
    assert_eq!((second.archived, second.deferred), (1, 0), "{:?}\n{}", second.errors, server.log_text());
    let segments: Vec<ObjectInfo> =
        list(faulty.as_ref(), "table=metrics/").into_iter().filter(|o| o.key.contains("/seg-")).collect();
    assert!(segments.len() >= 2, "{segments:?}");
    assert!(segments.iter().all(|o| o.size > 64 * 1024), "every segment took the multipart path: {segments:?}");
    assert!(segments.iter().any(|o| o.size > 5 * 1024 * 1024), "one segment needed two parts: {segments:?}");
    assert_eq!(faulty.fired().len(), 2);
    assert!(list(faulty.as_ref(), ".tmp/").is_empty(), "temporary objects are deleted after the copy");
    assert_all_readable(&te, &records);
    assert_eq!(verify(&te), 1);

    // Figures for the record (printed with --nocapture): raw put+get through the backend, one
    // object at a time, with one conditional put and with the staged path; then a whole pass
    // (encode, upload, read back, verify, publish, hot delete) on the default 5 MiB threshold.
    let te2 =
        open(&policy(&target.replace("archive/v1", "archive/v2").replace("multipart_threshold_bytes = 65536", "")));
    let backend = te2.backend("metrics");
    let object = Bytes::from(vec![b'x'; 1 << 20]);
    for staged in [false, true] {
        let started = Instant::now();
        for i in 0..16 {
            let key = format!("bench/{staged}-{i}");
            let put = if staged {
                backend.put_create_staged(&key, object.clone())
            } else {
                backend.put_create(&key, object.clone())
            };
            assert_eq!(runtime().block_on(put).unwrap(), PutOutcome::Created);
            assert_eq!(runtime().block_on(backend.get(&key)).unwrap().unwrap().len(), object.len());
        }
        let path = if staged { "multipart upload + conditional copy" } else { "conditional put" };
        eprintln!("{}: 16 x 1 MiB {path} + get: {:.0} MiB/s", server.kind, 16.0 / started.elapsed().as_secs_f64());
    }
    append(&te2, &records);
    let started = Instant::now();
    let pass = te2.pass();
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(pass.archived, 1, "{:?}", pass.errors);
    eprintln!(
        "{}: a pass archived {:.1} MiB of segments ({} rows) in {seconds:.2} s: {:.0} MiB/s (debug build of the engine)",
        server.kind,
        pass.bytes_archived as f64 / 1048576.0,
        pass.rows_archived,
        pass.bytes_archived as f64 / 1048576.0 / seconds
    );
}

#[test]
fn moto_uploads_large_segments_in_parts_then_copies_them_conditionally() {
    let server = Server::moto();
    server.create_bucket("frostline");
    multipart(&server, &s3_target(&server.endpoint(), "frostline", "multipart_threshold_bytes = 65536"));
}

#[test]
fn azurite_uploads_large_segments_in_parts_then_copies_them_conditionally() {
    let server = Server::azurite();
    server.create_bucket("frostline");
    multipart(&server, &azure_target(&server.endpoint(), "frostline", "multipart_threshold_bytes = 65536"));
}

#[test]
fn a_local_target_takes_the_same_multipart_path() {
    let dir = tempfile::tempdir().unwrap();
    let target = format!(
        "[[target]]\nname = \"cold\"\nurl = \"file://{}\"\nmultipart_threshold_bytes = 1024\n",
        dir.path().display()
    );
    let te = open(&policy(&target));
    let records = monthly_records(2, 300, 100);
    append(&te, &records);
    let pass = te.pass();
    assert_eq!((pass.archived, pass.deferred), (6, 0), "{:?}", pass.errors);
    assert_all_readable(&te, &records);
    assert_eq!(verify(&te), 6);
    assert!(list(te.backend("metrics").as_ref(), ".tmp/").is_empty());
}

// ---------------------------------------------------------------------------------------------
// Errors and outages: archival defers, nothing is lost, and it completes later

#[test]
fn s3_error_answers_defer_and_the_retry_completes() {
    let server = Server::moto();
    server.create_bucket("frostline");
    let te = open(&policy(&s3_target(&server.endpoint(), "frostline", "")));
    let records = monthly_records(2, 100, 40);
    append(&te, &records);
    let faulty = FaultyBackend::new(te.backend("metrics"));
    faulty.add(Op::Put, "/seg-", Fault::Error, Some(2));
    faulty.add(Op::Put, "/manifest-", Fault::LandThenError, Some(1));
    faulty.add(Op::Get, "/seg-", Fault::CorruptRead, Some(1));
    te.with_backend("metrics", faulty.clone());
    let mut archived = 0;
    for _ in 0..6 {
        let pass = te.pass();
        archived += pass.archived;
        assert_all_readable(&te, &records);
        te.clock.advance(RETRY_US + 1);
    }
    assert_eq!(archived, 6, "every bucket archived once the faults stopped");
    assert_eq!(faulty.fired().len(), 4);
    assert_eq!(verify(&te), 6);
}

#[test]
fn moto_stopped_before_a_pass_defers_and_completes_after_its_restart() {
    let mut server = Server::moto();
    server.create_bucket("frostline");
    let te = open(&policy(&s3_target(&server.endpoint(), "frostline", "")));
    let records = monthly_records(2, 100, 40);
    append(&te, &records);
    server.stop();
    let pass = te.pass();
    assert_eq!((pass.archived, pass.deferred), (0, 6), "{:?}", pass.errors);
    assert_all_readable(&te, &records);
    let status = status_json(&te);
    assert!(status.contains("\"deferrals\":[{"), "{status}");
    assert_no_secret("status", &status);
    for error in &pass.errors {
        assert_no_secret("a deferral", error);
    }
    // moto keeps everything in memory: the restarted server is empty.
    server.start();
    server.create_bucket("frostline");
    te.clock.advance(RETRY_US + 1);
    let pass = te.pass();
    assert_eq!((pass.archived, pass.deferred), (6, 0), "{:?}", pass.errors);
    assert_all_readable(&te, &records);
    assert_eq!(verify(&te), 6);
}

/// Forwards to the inner backend; before the first manifest upload, runs `on_manifest` once.
#[derive(Debug)]
struct StopBeforeManifest {
    inner: Arc<dyn ArchiveBackend>,
    fired: AtomicBool,
    server: Arc<Mutex<Server>>,
}

#[async_trait::async_trait]
impl ArchiveBackend for StopBeforeManifest {
    fn target(&self) -> &str {
        self.inner.target()
    }
    async fn put_create(&self, key: &str, bytes: Bytes) -> frostline::error::Result<PutOutcome> {
        if key.contains("/manifest-") && !self.fired.swap(true, Ordering::SeqCst) {
            self.server.lock().unwrap().stop();
        }
        self.inner.put_create(key, bytes).await
    }
    async fn get(&self, key: &str) -> frostline::error::Result<Option<Bytes>> {
        self.inner.get(key).await
    }
    async fn delete(&self, key: &str) -> frostline::error::Result<()> {
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> frostline::error::Result<Vec<ObjectInfo>> {
        self.inner.list(prefix).await
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Server({} on {})", self.kind, self.port)
    }
}

#[test]
fn moto_stopped_in_the_middle_of_a_pass_defers_and_completes_after_its_restart() {
    let server = Server::moto();
    server.create_bucket("frostline");
    let te = open(&policy(&s3_target(&server.endpoint(), "frostline", "")));
    let records = monthly_records(2, 100, 40);
    append(&te, &records);
    let server = Arc::new(Mutex::new(server));
    // The first bucket's segment is uploaded and verified; the server dies before its manifest.
    te.with_backend(
        "metrics",
        Arc::new(StopBeforeManifest {
            inner: te.backend("metrics"),
            fired: AtomicBool::new(false),
            server: server.clone(),
        }),
    );
    let pass = te.pass();
    assert_eq!((pass.archived, pass.deferred), (0, 6), "{:?}", pass.errors);
    assert_all_readable(&te, &records);
    {
        let mut server = server.lock().unwrap();
        server.start();
        server.create_bucket("frostline");
    }
    te.clock.advance(RETRY_US + 1);
    let pass = te.pass();
    assert_eq!((pass.archived, pass.deferred), (6, 0), "{:?}", pass.errors);
    assert_all_readable(&te, &records);
    assert_eq!(verify(&te), 6);
}

#[test]
fn a_target_unreachable_at_start_is_accepted_and_gated_until_its_probe_passes() {
    let port = free_port();
    let te = open(&policy(&s3_target(&format!("http://127.0.0.1:{port}"), "frostline", "")));
    let report = target_report(&te);
    assert_eq!(
        (report.probe.as_str(), report.check.as_deref()),
        ("unreachable", Some("create-if-absent")),
        "{report:?}"
    );
    let records = monthly_records(1, 50, 40);
    append(&te, &records);
    let pass = te.pass();
    assert_eq!((pass.archived, pass.deferred), (0, 3), "{:?}", pass.errors);
    let deferrals: Vec<&String> = pass.errors.iter().filter(|e| e.starts_with("metrics/")).collect();
    assert_eq!(deferrals.len(), 3, "{:?}", pass.errors);
    assert!(deferrals.iter().all(|e| e.contains("has not passed its probe")), "{deferrals:?}");
    assert_all_readable(&te, &records);

    let server = Server::moto_on(port);
    server.create_bucket("frostline");
    // Past the probe's backoff (1 s after the first attempt, 2 s after the second).
    std::thread::sleep(Duration::from_millis(frostline::storage::probe::PROBE_BACKOFF_MS_MIN * 3));
    te.clock.advance(RETRY_US + 1);
    let pass = te.pass();
    assert_eq!((pass.archived, pass.deferred), (3, 0), "{:?}", pass.errors);
    assert_eq!(target_report(&te).probe, "ok");
    assert_all_readable(&te, &records);
    assert_eq!(verify(&te), 3);
}

// ---------------------------------------------------------------------------------------------
// The probe refuses a store that would break the protocol

fn liar_options(wrap: fn(Arc<dyn ArchiveBackend>) -> Arc<CreateIgnored>) -> LoadOptions {
    LoadOptions {
        wrap_target: Some(Arc::new(
            move |name: &str, backend: Arc<dyn ArchiveBackend>| {
                if name == "cold" { wrap(backend) as Arc<dyn ArchiveBackend> } else { backend }
            },
        )),
    }
}

#[test]
fn a_store_that_overwrites_on_a_conditional_create_is_refused_at_start_and_on_reload() {
    let target = "[[target]]\nname = \"cold\"\nurl = \"memory://\"\n";
    for (wrap, check) in [
        (CreateIgnored::overwriting as fn(_) -> _, "create-only"),
        (CreateIgnored::overwriting_but_reporting_exists, "create-only"),
        (CreateIgnored::staged_only, "staged-create-only"),
    ] {
        let err = TestEngine::open(&policy(target), NOW, &[], liar_options(wrap)).err().expect("refused").to_string();
        assert!(
            err.contains("target `cold` (memory://) is refused") && err.contains(&format!("check `{check}` failed")),
            "{err}"
        );
    }

    // On reload: the engine runs without the target; adding it is refused, the old set stays.
    let only_local = "[[table]]\nid = \"metrics\"\nstrategy = { plugin = \"builtin:calendar-month-utc\" }\n";
    let te = TestEngine::open(only_local, NOW, &[], liar_options(CreateIgnored::overwriting)).unwrap();
    std::fs::write(te.policies_dir().join("tables.toml"), policy(target)).unwrap();
    let outcome = frostline::ops::reload::reload(&te.engine, "test");
    assert!(!outcome.accepted);
    let error = outcome.error.unwrap();
    assert!(error.contains("target `cold`") && error.contains("check `create-only` failed"), "{error}");
    assert_eq!(te.engine.policies().generation, 1);
    assert_eq!(te.engine.policies().tables["metrics"].target_name, "local");
}

#[test]
fn a_real_s3_store_behind_a_lying_wrapper_is_refused() {
    let server = Server::moto();
    server.create_bucket("frostline");
    let err = TestEngine::open(
        &policy(&s3_target(&server.endpoint(), "frostline", "")),
        NOW,
        &SECRET_FILES,
        liar_options(CreateIgnored::overwriting),
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(err.contains("target `cold` (s3://frostline/archive/v1) is refused"), "{err}");
    assert!(err.contains("check `create-only` failed"), "{err}");
    assert_no_secret("the refusal", &err);
}

#[test]
fn a_missing_bucket_is_refused_naming_the_target_and_the_check() {
    let server = Server::moto();
    let err =
        TestEngine::open(&policy(&s3_target(&server.endpoint(), "absent", "")), NOW, &SECRET_FILES, Default::default())
            .err()
            .expect("refused")
            .to_string();
    assert!(err.contains("target `cold`") && err.contains("check `create-if-absent` failed"), "{err}");
    assert_no_secret("the refusal", &err);
}

// ---------------------------------------------------------------------------------------------
// Credentials never in messages, logs or the status

/// An HTTP server that answers every request with `status` and a body echoing the request's
/// headers, credentials included (as S3's SignatureDoesNotMatch does with the key id).
struct EchoServer {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EchoServer {
    fn start(status: &'static str) -> EchoServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(stream) = stream {
                    let _ = Self::answer(stream, status);
                }
            }
        });
        EchoServer { port, stop, thread: Some(thread) }
    }

    fn answer(mut stream: TcpStream, status: &str) -> std::io::Result<()> {
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut headers = String::new();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line == "\r\n" {
                break;
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().unwrap_or(0);
            }
            headers.push_str(&line);
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        let echo = format!("<Error><Code>Echo</Code><Message>{}</Message></Error>", headers.replace("\r\n", " | "));
        write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{echo}",
            echo.len()
        )
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run_binary(args: &[&str], dir: &Path) -> (bool, String) {
    let output = Command::new(crate::support::frostline_bin())
        .args(args)
        .current_dir(dir)
        .env("FROSTLINE_LOG", "debug")
        .output()
        .unwrap();
    (output.status.success(), format!("{}{}", text(&output.stdout), text(&output.stderr)))
}

#[test]
fn credentials_never_reach_the_status_the_logs_or_an_error() {
    // A server answering 503 with the request's headers: unreachable, accepted and gated.
    let unavailable = EchoServer::start("503 Service Unavailable");
    let te = open(&policy(&s3_target(&format!("http://127.0.0.1:{}", unavailable.port), "frostline", "")));
    let report = target_report(&te);
    assert_eq!(report.probe, "unreachable", "{report:?}");
    let status = status_json(&te);
    assert!(status.contains("s3://frostline/archive/v1") && status.contains("create-if-absent"), "{status}");
    assert_no_secret("status", &status);
    append(&te, &monthly_records(1, 10, 10));
    std::thread::sleep(Duration::from_millis(frostline::storage::probe::PROBE_BACKOFF_MS_MIN + 100));
    let pass = te.pass();
    assert_eq!(pass.deferred, 3, "{:?}", pass.errors);
    for error in &pass.errors {
        assert_no_secret("a deferral", error);
    }
    assert_no_secret("status after a pass", &status_json(&te));

    // The binary's status and logs (debug level), against the same server, on its own data
    // directory (the test's engine holds its own).
    let data = tempfile::tempdir().unwrap();
    let (ok, output) = run_binary(
        &[
            "status",
            "--data",
            &data.path().display().to_string(),
            "--policies",
            &te.policies_dir().display().to_string(),
        ],
        data.path(),
    );
    assert!(ok, "{output}");
    assert!(output.contains("probe UNREACHABLE at check create-if-absent"), "{output}");
    assert_no_secret("`frostline status` and its logs", &output);

    // A server answering 403 with the request's headers: refused at load, the error scrubbed.
    let denied = EchoServer::start("403 Forbidden");
    let err = TestEngine::open(
        &policy(&s3_target(&format!("http://127.0.0.1:{}", denied.port), "frostline", "")),
        NOW,
        &SECRET_FILES,
        Default::default(),
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(err.contains("access denied") && err.contains("***"), "the echoed credentials are scrubbed: {err}");
    assert_no_secret("the refusal", &err);
}

// ---------------------------------------------------------------------------------------------
// The orphan sweep and the scratch folders

#[test]
fn the_sweep_keeps_young_scratch_objects_and_deletes_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let target = format!("[[target]]\nname = \"cold\"\nurl = \"file://{}\"\n", dir.path().display());
    let te = open(&policy(&target));
    // The store stamps objects with the wall clock; the engine's clock starts there too.
    let wall_us = time::OffsetDateTime::now_utc().unix_timestamp_nanos() as i64 / 1_000;
    te.clock.set(wall_us);
    let backend = te.backend("metrics");
    for key in [".tmp/00000000000000aa", ".frostline-probe/00000000000000bb/create"] {
        let created = runtime().block_on(backend.put_create(key, Bytes::from_static(b"left behind by a crash")));
        assert_eq!(created.unwrap(), PutOutcome::Created);
    }
    let young = runtime().block_on(frostline::archive::sweep::sweep(&te.engine.context(), false)).unwrap();
    assert_eq!((young.too_young, young.deleted), (2, 0), "{young:?}");
    assert_eq!(list(backend.as_ref(), ".tmp/").len(), 1);
    te.clock.advance(te.engine.settings().orphan_grace_us + 1_000_000);
    let old = runtime().block_on(frostline::archive::sweep::sweep(&te.engine.context(), false)).unwrap();
    assert_eq!(old.deleted, 2, "{old:?}");
    assert!(list(backend.as_ref(), ".tmp/").is_empty());
    assert!(list(backend.as_ref(), ".frostline-probe/").is_empty());
}

//! Test-only archiver `escape-archiver`: tries to reach things and reports what happened, so
//! the host's tests can prove that a plugin gets exactly what its grant gives. Never use it in
//! a real policy.
//!
//! Config `{"probes": [...]}`, each probe one of
//! `{"read": "/path"}`, `{"write": "/path"}`, `{"list": "/path"}`, `{"connect": "127.0.0.1:PORT"}`,
//! `{"blob-put": "key"}`, `{"blob-get": "key"}`, `{"blob-list": "prefix"}`. `init` runs them in
//! order and, when there are any, returns one line per probe as its error (the one string a
//! host test can read): `read /x: ALLOWED (12 bytes)` or `read /x: denied (...)`, and for the
//! blob store `blob-put k: ok` or `blob-put k: err(...)`. With no probes it initialises, and
//! its backend answers every call with `permanent`.

mod bindings {
    wit_bindgen::generate!({ path: "../../../wit", world: "archiver" });
}

use std::io::Write as _;

use bindings::exports::frostline::plugin::backend::Guest as BackendGuest;
use bindings::frostline::plugin::blob_store;
use bindings::frostline::plugin::types::BackendError;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
enum Probe {
    Read(String),
    Write(String),
    List(String),
    Connect(String),
    BlobPut(String),
    BlobGet(String),
    BlobList(String),
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    probes: Vec<Probe>,
}

fn outcome<T>(what: String, result: std::io::Result<T>, detail: impl FnOnce(&T) -> String) -> String {
    match result {
        Ok(value) => format!("{what}: ALLOWED ({})", detail(&value)),
        Err(e) => format!("{what}: denied ({e})"),
    }
}

fn blob<T>(what: String, result: Result<T, BackendError>, detail: impl FnOnce(&T) -> String) -> String {
    match result {
        Ok(value) => format!("{what}: ok ({})", detail(&value)),
        Err(e) => format!("{what}: err({e:?})"),
    }
}

fn run(probe: &Probe) -> String {
    match probe {
        Probe::Read(path) => {
            outcome(format!("read {path}"), std::fs::read(path), |b: &Vec<u8>| format!("{} bytes", b.len()))
        }
        Probe::Write(path) => {
            let written = std::fs::File::options()
                .write(true)
                .create(true)
                .truncate(true)
                .open(path)
                .and_then(|mut f| f.write_all(b"escaped").and_then(|()| f.sync_all()));
            outcome(format!("write {path}"), written, |_| "7 bytes".into())
        }
        Probe::List(path) => outcome(
            format!("list {path}"),
            std::fs::read_dir(path).map(|entries| {
                let mut names: Vec<String> =
                    entries.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
                names.sort();
                names
            }),
            |names: &Vec<String>| names.join(","),
        ),
        Probe::Connect(address) => {
            outcome(format!("connect {address}"), std::net::TcpStream::connect(address.as_str()), |_| {
                "connected".into()
            })
        }
        Probe::BlobPut(key) => blob(format!("blob-put {key}"), blob_store::put(key, b"escaped"), |_| "stored".into()),
        Probe::BlobGet(key) => {
            blob(format!("blob-get {key}"), blob_store::get(key), |b: &Vec<u8>| format!("{} bytes", b.len()))
        }
        Probe::BlobList(prefix) => {
            blob(format!("blob-list {prefix}"), blob_store::list(prefix, None, 100), |keys: &Vec<String>| {
                keys.join(",")
            })
        }
    }
}

struct Component;

impl bindings::Guest for Component {
    fn init(config: String) -> Result<(), String> {
        let config: Config = if config.trim().is_empty() {
            Config::default()
        } else {
            serde_json::from_str(&config).map_err(|e| format!("escape-archiver config: {e}"))?
        };
        if config.probes.is_empty() {
            return Ok(());
        }
        Err(config.probes.iter().map(run).collect::<Vec<_>>().join("\n"))
    }
}

fn refuse<T>() -> Result<T, BackendError> {
    Err(BackendError::Permanent("escape-archiver stores nothing".into()))
}

impl BackendGuest for Component {
    fn put(_key: String, _bytes: Vec<u8>) -> Result<(), BackendError> {
        refuse()
    }

    fn get(_key: String) -> Result<Vec<u8>, BackendError> {
        refuse()
    }

    fn delete(_key: String) -> Result<(), BackendError> {
        refuse()
    }

    fn list(_prefix: String, _after: Option<String>, _limit: u32) -> Result<Vec<String>, BackendError> {
        refuse()
    }
}

bindings::export!(Component with_types_in bindings);

//! The retention lifecycle: archive expiry with tombstones, legal holds, outbox delivery to
//! sinks, the orphan sweep and the scrub.

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, Mutex};

use frostline::clock::Clock;
use frostline::model::BucketState;
use frostline::storage::faults::{Fault, FaultyBackend, Op};
use frostline::store::schema::Hold;

use crate::support::*;

const DAY_US: i64 = 86_400_000_000;

fn policy(extra: &str) -> String {
    format!(
        r#"
[[table]]
id = "r"
strategy = {{ plugin = "builtin:calendar-day-utc" }}
retention = {{ plugin = "builtin:eligible-before", config = {{ archive_after = "1d", expire_after = "30d" }} }}
{extra}"#
    )
}

/// Appends a day of records, archives them, and returns the engine ready for expiry.
fn archived_engine(extra: &str) -> TestEngine {
    let e = TestEngine::new(&policy(extra), "2024-03-01T12:00:00Z");
    e.engine.append("r", records("2024-03-01T00:00:00Z", 1, 9)).unwrap();
    e.pass(); // plan
    e.clock.set(t("2024-03-05T00:00:00Z"));
    let report = e.pass();
    assert_eq!(report.archived, 3, "{report:?}");
    e
}

fn objects(e: &TestEngine) -> Vec<String> {
    runtime()
        .block_on(e.backend("r").list("table=r/"))
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .filter(|k| !k.ends_with(frostline::archive::catalog::CATALOG_FILE))
        .collect()
}

#[test]
fn an_archive_expires_with_a_tombstone_and_queries_say_so() {
    let sink = tempfile::NamedTempFile::new().unwrap();
    let e = archived_engine(&format!(
        "[[sink]]\nname = \"audit\"\nkind = \"jsonl\"\npath = \"{}\"\n",
        sink.path().display()
    ));
    assert_eq!(objects(&e).len(), 6, "a segment and a manifest per bucket");
    // Not yet: expiry is 30 days after the bucket ends.
    e.clock.set(t("2024-03-20T00:00:00Z"));
    assert_eq!(e.pass().expired, 0);
    e.clock.set(t("2024-04-01T00:00:00Z"));
    let report = e.pass();
    assert_eq!(report.expired, 3, "{report:?}");
    assert!(objects(&e).is_empty(), "every object deleted");
    for meta in e.engine.store().buckets("r", None).unwrap() {
        assert_eq!(meta.state, BucketState::Expired);
        let tombstone = e.engine.store().tombstone(&meta.id).unwrap().expect("tombstone kept");
        assert!(tombstone.completed_at.is_some());
        assert_eq!(tombstone.keys.len(), 2);
        assert!(tombstone.keys[0].contains("manifest-"), "manifest deleted first");
        assert!(tombstone.reason.contains("expire_after=30d"), "{}", tombstone.reason);
    }
    let page = e.first_page("r");
    assert!(page.records.is_empty());
    assert_eq!(page.expired.len(), 3, "the query says the data expired, not that it is missing");
    assert!(page.expired[0].reason.contains("expire_after"));
    assert_eq!(page.expired[0].expired_at, t("2024-04-01T00:00:00Z"));
    // Events were delivered to the sink, in order, before being removed from the outbox.
    e.pass();
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(sink.path()).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let kinds: Vec<&str> = lines.iter().map(|l| l["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "archive_expiring").count(), 3, "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "archive_expired").count(), 3, "{kinds:?}");
    let first_expiring = kinds.iter().position(|k| *k == "archive_expiring").unwrap();
    let first_expired = kinds.iter().position(|k| *k == "archive_expired").unwrap();
    assert!(first_expiring < first_expired, "intent before completion");
    assert_eq!(e.engine.store().outbox_len().unwrap(), 0);

    // After the replay period the tombstones are purged; queries still say "expired".
    e.clock.advance(31 * DAY_US);
    let report = e.pass();
    assert_eq!(report.tombstones_purged, 3, "{report:?}");
    let meta = &e.engine.store().buckets("r", None).unwrap()[0];
    assert!(e.engine.store().tombstone(&meta.id).unwrap().is_none());
    let page = e.first_page("r");
    assert_eq!(page.expired.len(), 3);
}

fn hold(table: &str, partition: Option<&str>) -> Hold {
    Hold {
        id: format!("h-test-{}", partition.unwrap_or("all")),
        table: table.into(),
        partition_key: partition.map(str::to_string),
        tenant: None,
        bucket_key: None,
        reason: "litigation 2024-17".into(),
        placed_by: "legal@example.com".into(),
        placed_at: 0,
        source: "cli".into(),
    }
}

#[test]
fn a_legal_hold_beats_expiry_and_lifting_it_replans() {
    let e = archived_engine("");
    let placed = e.engine.store().place_hold(hold("r", Some("p1")), e.clock.now()).unwrap();
    assert_eq!(placed.covered, 1);
    e.clock.set(t("2024-04-01T00:00:00Z"));
    let report = e.pass();
    // The hold parked the bucket when it was placed: it is not even due.
    assert_eq!((report.expired, report.held), (2, 0), "{report:?}");
    assert_eq!(objects(&e).len(), 2, "the held bucket's archive is kept");
    let held: Vec<_> = e.engine.store().buckets("r", Some(b"p1")).unwrap();
    assert_eq!(held[0].state, BucketState::Archived { hot_deleted: true });
    assert_eq!(held[0].held_by, vec!["h-test-p1".to_string()]);
    assert_eq!(e.pass().expired, 0, "parked, not retried while held");
    e.engine.store().lift_hold("h-test-p1".into(), "legal@example.com".into(), e.clock.now()).unwrap();
    assert_eq!(e.pass().expired, 1, "lifting re-plans the bucket");
    assert!(objects(&e).is_empty());
}

#[test]
fn a_hold_placed_while_an_expiry_is_in_flight_wins() {
    let e = archived_engine("");
    e.clock.set(t("2024-03-20T00:00:00Z"));
    e.pass(); // the archived buckets are planned again (being archived is a fact)
    e.clock.set(t("2024-04-01T00:00:00Z"));
    let store = e.engine.store().clone();
    let id = store.buckets("r", Some(b"p0")).unwrap()[0].id.clone();
    let claimed = store.claim(id.clone(), "w".into(), e.clock.now(), 60_000_000).unwrap().unwrap();
    // The hold lands between the claim and the expiry's fenced transaction.
    store.place_hold(hold("r", None), e.clock.now()).unwrap();
    let tombstone = store
        .begin_expiry(id.clone(), "w".into(), claimed.generation, e.clock.now(), vec!["k".into()], Default::default())
        .unwrap();
    assert!(tombstone.is_none(), "the expiry re-checks holds under its fence");
    assert_eq!(store.bucket(&id).unwrap().unwrap().state, BucketState::Archived { hot_deleted: true });
    assert_eq!(objects(&e).len(), 6);
}

#[test]
fn a_hold_declared_in_the_policy_directory_holds_until_removed() {
    let hold_toml = "[[hold]]\ntable = \"r\"\nreason = \"regulator request\"\n";
    let e = archived_engine(hold_toml);
    e.clock.set(t("2024-04-01T00:00:00Z"));
    let report = e.pass();
    assert_eq!(report.expired, 0, "{report:?}");
    let parked = e.engine.store().buckets("r", None).unwrap();
    assert!(parked.iter().all(|b| b.held_by.len() == 1 && b.due_at.is_none()), "{parked:?}");
    let dir = e.engine.policies().dir.clone();
    std::fs::write(dir.join("tables.toml"), policy("")).unwrap();
    assert!(frostline::ops::reload::reload(&e.engine, "test").accepted);
    assert_eq!(e.pass().expired, 3, "removing the hold from the directory re-plans");
}

/// A minimal HTTP server that answers 200 and records each request's Idempotency-Key.
fn webhook_server() -> (String, Arc<Mutex<Vec<String>>>) {
    let (address, keys) = serve_webhook(None);
    (format!("http://{address}/events"), keys)
}

/// `webhook_server` on `127.0.0.1` and a free port, over TLS with `tls` when given; returns the
/// port's address.
fn serve_webhook(tls: Option<Arc<rustls::ServerConfig>>) -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let keys = Arc::new(Mutex::new(Vec::new()));
    let seen = keys.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let key = match &tls {
                None => answer_webhook(stream),
                Some(config) => {
                    let connection = rustls::ServerConnection::new(config.clone()).unwrap();
                    answer_webhook(rustls::StreamOwned::new(connection, stream))
                }
            };
            // A client that refused the certificate sent no request.
            if let Some(key) = key {
                seen.lock().unwrap().push(key);
            }
        }
    });
    (address, keys)
}

/// Reads one request, answers 200, and returns its Idempotency-Key (`None` when no request
/// arrived).
fn answer_webhook(mut stream: impl Read + Write) -> Option<String> {
    let mut reader = BufReader::new(&mut stream);
    let mut length = 0;
    let mut key = None;
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) if line == "\r\n" => break,
            Ok(_) => {}
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("idempotency-key:") {
            key = Some(line["idempotency-key:".len()..].trim().to_string());
        }
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    drop(reader);
    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    let _ = stream.flush();
    Some(key.unwrap_or_default())
}

/// Regression (issue: a webhook answered with a redirect was re-sent as a body-less GET, and a
/// 200 to that GET marked the event delivered and deleted it). A redirect is now a failed
/// delivery: the event stays in the outbox, and only POSTs ever reach the sink.
#[test]
fn a_webhook_that_redirects_has_not_received_the_event() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(&mut stream);
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut length = 0;
            loop {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if line == "\r\n" => break,
                    Ok(_) => {}
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            drop(reader);
            let answer: &[u8] = if request_line.starts_with("POST") {
                b"HTTP/1.1 302 Found\r\nlocation: /elsewhere\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            } else {
                b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            };
            seen.lock().unwrap().push(request_line.trim().to_string());
            let _ = stream.write_all(answer);
        }
    });
    let sink = format!("[[sink]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://{address}/events\"\n");
    let e = archived_engine(&sink);
    e.pass(); // delivers what the archival wrote
    assert!(e.engine.store().outbox_len().unwrap() >= 6, "no event counts as delivered to a redirect");
    let requests = requests.lock().unwrap().clone();
    assert!(!requests.is_empty(), "the sink was tried");
    assert!(requests.iter().all(|r| r.starts_with("POST /events")), "the redirect was not followed: {requests:?}");
}

/// Runs passes until every outbox event is delivered; a sink that failed is backed off first,
/// on the engine's clock, which moves a second between passes.
fn drain_outbox(e: &TestEngine) {
    let step_us = frostline::archive::outbox::SINK_BACKOFF_MS_MIN as i64 * 1_000;
    for _ in 0..600 {
        if e.engine.store().outbox_len().unwrap() == 0 {
            return;
        }
        e.clock.advance(step_us);
        e.pass();
    }
    panic!("the backlog never drained in 600 passes, 10 minutes of the engine's clock");
}

/// `count` buckets of one record each: `per_day` partitions (users' keys, with `/`, `%`, `=`,
/// spaces and non-ASCII) a day from 2024-03-01.
fn one_record_buckets(count: usize, per_day: usize) -> Vec<frostline::model::Record> {
    (0..count)
        .map(|n| frostline::model::Record {
            partition_key: format!("{} {}", USER_KEYS[n % 3], n % per_day).into_bytes(),
            event_time: t("2024-03-01T06:00:00Z") + (n / per_day) as i64 * DAY_US,
            sort_key: b"s".to_vec(),
            tenant: None,
            kind: None,
            body: format!("{{\"n\":{n}}}"),
        })
        .collect()
}

/// A backlog of more events than one batch drains in one pass once its sink takes them, and
/// at once with no sink: a pass goes on batch after batch while every sink takes each whole
/// (a pass used to take 500 events, so an engine archiving more than that per pass grew its
/// outbox without bound).
#[test]
fn a_backlog_of_events_drains_in_one_pass_with_or_without_a_sink() {
    let dir = tempfile::tempdir().unwrap();
    // Its folder does not exist yet: every delivery fails until it does.
    let sink_path = dir.path().join("not yet/events.jsonl");
    let settings = frostline::settings::Settings { scan_limit: 2_000, ..Default::default() };
    for with_sink in [true, false] {
        let extra = match with_sink {
            true => format!("[[sink]]\nname = \"audit\"\nkind = \"jsonl\"\npath = \"{}\"\n", sink_path.display()),
            false => String::new(),
        };
        let e = TestEngine::open_with_settings(
            &policy(&extra),
            "2024-03-01T12:00:00Z",
            &[],
            Default::default(),
            settings.clone(),
        )
        .unwrap();
        // 900 buckets: 450 partitions over two days.
        e.engine.append("r", one_record_buckets(900, 450)).unwrap();
        e.clock.set(t("2024-03-10T00:00:00Z"));
        let (mut archived, mut passes) = (0, 0);
        loop {
            let report = e.pass();
            archived += report.archived;
            passes += 1;
            if !report.made_progress() {
                break;
            }
        }
        assert_eq!(archived, 900);
        let backlog = e.engine.store().outbox_len().unwrap();
        if !with_sink {
            // The last pass, which found nothing to do, took every event the others made.
            assert_eq!(backlog, 0, "events left after {passes} passes");
            continue;
        }
        assert!(backlog >= 2 * 900, "every event waits for the sink: {backlog} after {passes} passes");
        std::fs::create_dir_all(sink_path.parent().unwrap()).unwrap();
        e.clock.advance(frostline::archive::outbox::SINK_BACKOFF_MS_MAX as i64 * 1_000);
        let report = e.pass();
        assert_eq!(report.outbox_delivered, backlog, "{report:?}");
        assert_eq!(e.engine.store().outbox_len().unwrap(), 0);
        let lines = std::fs::read_to_string(&sink_path).unwrap();
        let sequences: std::collections::BTreeSet<u64> = lines
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap()["sequence"].as_u64().unwrap())
            .collect();
        assert_eq!((lines.lines().count(), sequences.len()), (backlog as usize, backlog as usize), "each once");
    }
}

/// A pass stops delivering `OUTBOX_DELIVERY_SECONDS_MAX` after its first batch: a backlog
/// to a slow webhook (one request per event) goes on at the next pass instead of holding this
/// one, and archival after it, for as long as the sink takes.
#[test]
fn a_backlog_to_a_slow_webhook_is_delivered_over_passes_within_the_time_limit() {
    use frostline::archive::outbox::{OUTBOX_DELIVERY_SECONDS_MAX, OUTBOX_EVENTS_PER_BATCH};
    // Bound, not yet answering: deliveries time out and the sink backs off meanwhile.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let sink = format!(
        "[[sink]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://{address}/events\"\ntimeout_ms = 1000\n"
    );
    let settings = frostline::settings::Settings { scan_limit: 2_000, ..Default::default() };
    let e = TestEngine::open_with_settings(&policy(&sink), "2024-03-01T12:00:00Z", &[], Default::default(), settings)
        .unwrap();
    e.engine.append("r", one_record_buckets(1_000, 1_000)).unwrap();
    e.clock.set(t("2024-03-10T00:00:00Z"));
    while e.pass().made_progress() {}
    let backlog = e.engine.store().outbox_len().unwrap();
    assert!(backlog >= 2_000, "{backlog}");
    // Now it answers, 10 ms a request: the backlog takes at least twice the limit.
    assert!(backlog * 10 >= 2 * OUTBOX_DELIVERY_SECONDS_MAX * 1_000, "{backlog}");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::sleep(std::time::Duration::from_millis(10));
            answer_webhook(stream);
        }
    });
    let mut delivered = Vec::new();
    while e.engine.store().outbox_len().unwrap() > 0 && delivered.len() < 20 {
        e.clock.advance(frostline::archive::outbox::SINK_BACKOFF_MS_MAX as i64 * 1_000);
        delivered.push(e.pass().outbox_delivered);
    }
    assert_eq!(e.engine.store().outbox_len().unwrap(), 0, "delivered over passes: {delivered:?}");
    assert_eq!(delivered.iter().sum::<u64>(), backlog);
    // Without the limit the first pass takes the whole backlog, about 20 s of the sink's time.
    assert!(delivered.len() > 1, "the limit cut the first pass short: {delivered:?}");
    assert!(delivered[0] >= OUTBOX_EVENTS_PER_BATCH as u64, "a pass delivers a batch at least: {delivered:?}");
}

#[test]
fn a_sink_that_is_down_delays_delivery_but_never_blocks_archival() {
    // A port that nothing listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let sink =
        format!("[[sink]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"http://{dead}/events\"\ntimeout_ms = 500\n");
    let e = archived_engine(&sink);
    assert!(e.engine.store().outbox_len().unwrap() >= 6, "archival went on while the sink is down");
    let backlog = e.engine.store().outbox_len().unwrap();

    let (url, keys) = webhook_server();
    let dir = e.engine.policies().dir.clone();
    std::fs::write(
        dir.join("tables.toml"),
        policy(&format!("[[sink]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"{url}\"\n")),
    )
    .unwrap();
    assert!(frostline::ops::reload::reload(&e.engine, "test").accepted);
    // The sink is backed off after its failure; delivery resumes once the backoff passes.
    drain_outbox(&e);
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys.len() as u64, backlog, "each event delivered once here: {keys:?}");
    assert!(keys.iter().all(|k| k.starts_with("frostline-hook-")));
    let unique: std::collections::HashSet<_> = keys.iter().collect();
    assert_eq!(unique.len(), keys.len(), "one idempotency key per event");
}

/// On 2024-03-05, a worker claims bucket 2024-03-01 of `p0`, records an upload intent, uploads
/// one segment and dies; after its lease the next pass takes the bucket over and archives the
/// day's three buckets, releasing the dead worker's key. Returns that key (the orphan).
fn archive_leaving_a_released_orphan(e: &TestEngine) -> String {
    e.clock.set(t("2024-03-05T00:00:00Z"));
    let orphan = upload_as_a_worker_that_dies(e, b"p0");
    e.clock.advance(120_000_000);
    assert_eq!(e.pass().archived, 3);
    orphan
}

/// A worker claims bucket 2024-03-01 of `partition`, records an upload intent, uploads one
/// segment and dies. Returns the segment's key.
fn upload_as_a_worker_that_dies(e: &TestEngine, partition: &[u8]) -> String {
    let store = e.engine.store().clone();
    let backend = e.backend("r");
    let id = store.buckets("r", Some(partition)).unwrap()[0].id.clone();
    let claimed = store.claim(id.clone(), "w".into(), e.clock.now(), 60_000_000).unwrap().unwrap();
    let folder = frostline::storage::keys::bucket_prefix("r", "day:2024-03-01", partition);
    let orphan = format!("{folder}seg-{}-00009-0123456789abcdef.jsonl", e.engine.context().writer().unwrap());
    let intent = frostline::store::schema::UploadIntent {
        bucket: id,
        generation: claimed.generation,
        target: backend.target().to_string(),
        keys: vec![orphan.clone()],
        recorded_at: e.clock.now(),
    };
    store.record_intent(intent, "w".into(), e.clock.now()).unwrap();
    runtime().block_on(backend.put_create(&orphan, "x".into())).unwrap();
    orphan
}

/// The sweep deletes what this data directory released (a key its upload intent named that the
/// published archive does not use, as a worker that died after uploading leaves one), once
/// past the grace period; an object that merely carries this installation's id proves nothing
/// (a copy of the data directory may have written it), and another installation's is never
/// its own.
#[test]
fn the_orphan_sweep_deletes_only_old_objects_this_directory_released() {
    let e = TestEngine::new(&policy(""), "2024-03-01T12:00:00Z");
    e.engine.append("r", records("2024-03-01T00:00:00Z", 1, 9)).unwrap();
    e.pass(); // plan
    let orphan = archive_leaving_a_released_orphan(&e);
    let backend = e.backend("r");
    let folder = "table=r/bucket=day:2024-03-01/partition=p0/";
    let unproven = format!("{folder}seg-{}-00008-0123456789abcdef.jsonl", e.engine.installation_id());
    runtime().block_on(backend.put_create(&unproven, "y".into())).unwrap();
    let foreign = format!("{folder}seg-ffffffffffffffff-00009-0123456789abcdef.jsonl");
    runtime().block_on(backend.put_create(&foreign, "z".into())).unwrap();
    // Real time is what the store stamps objects with; the engine's clock decides their age.
    e.clock.set(frostline::clock::SystemClock.now());
    let young = runtime().block_on(frostline::archive::sweep::sweep(&e.engine.context(), false)).unwrap();
    assert_eq!((young.orphans, young.too_young, young.deleted), (0, 1, 0), "{young:?}");
    assert_eq!((young.foreign, young.unproven), (1, 1), "{young:?}");
    e.clock.advance(2 * DAY_US);
    let dry = runtime().block_on(frostline::archive::sweep::sweep(&e.engine.context(), true)).unwrap();
    assert_eq!((dry.orphans, dry.deleted, dry.referenced), (1, 0, 6), "{dry:?}");
    assert_eq!(objects(&e).len(), 9, "a dry run deletes nothing");
    let real = runtime().block_on(frostline::archive::sweep::sweep(&e.engine.context(), false)).unwrap();
    assert_eq!(real.deleted, 1, "{real:?}");
    let left = objects(&e);
    assert_eq!(left.len(), 8);
    assert!(left.contains(&foreign) && left.contains(&unproven), "{left:?}");
    assert!(!left.contains(&orphan));
    let again = runtime().block_on(frostline::archive::sweep::sweep(&e.engine.context(), false)).unwrap();
    assert_eq!((again.orphans, again.deleted), (0, 0), "the released key is forgotten once deleted: {again:?}");
    let verdicts =
        runtime().block_on(frostline::archive::verify::verify(&e.engine.context(), None, None, |_| {})).unwrap();
    assert!(verdicts.iter().all(|v| v.ok), "{verdicts:?}");
}

/// Between full sweeps the sweep lists only the folders of the keys this data directory
/// released, not the archive (issue "Cost that grows with change"): a late record's next
/// generation releases the one it replaced, and the sweep after it lists those objects and
/// deletes them, not the 30 buckets beside them. The first sweep of a life lists everything, and
/// so does one `ARCHIVER_SWEEP_FULL_INTERVAL_SECONDS` after the last full one.
#[test]
fn between_full_sweeps_the_sweep_lists_only_the_folders_of_released_keys() {
    use frostline::archive::sweep::sweep_if_due;
    let settings = frostline::settings::Settings { orphan_grace_us: 0, late_grace_us: 0, ..Default::default() };
    // The engine's clock runs at real time below (objects are stamped with it): nothing expires.
    let policy = policy("").replace("expire_after = \"30d\"", "expire_after = \"3650d\"");
    let e = TestEngine::open_with_settings(&policy, "2024-03-01T12:00:00Z", &[], Default::default(), settings).unwrap();
    let appended = records("2024-03-01T00:00:00Z", 10, 9);
    e.engine.append("r", appended.clone()).unwrap();
    e.pass(); // plan (and this life's first sweep: a full one)
    // Real time is what the store stamps objects with; the engine's clock decides their age.
    e.clock.set(frostline::clock::SystemClock.now() + 3_600_000_000);
    assert_eq!(e.pass().archived, 30);
    let archive = objects(&e);
    assert!(archive.len() >= 60, "a manifest and a segment a bucket: {}", archive.len());
    let sweep = || runtime().block_on(sweep_if_due(&e.engine.context())).unwrap();
    assert!(sweep().is_none(), "the pass swept; the next is an interval away");

    e.clock.advance(2 * 3_600_000_000);
    let nothing_released = sweep().expect("an interval after the last");
    assert!(!nothing_released.full, "{nothing_released:?}");
    assert_eq!((nothing_released.listed, nothing_released.deleted), (0, 0), "{nothing_released:?}");

    // A late record: its bucket's next generation replaces the first, whose objects are released.
    let store = e.engine.store().clone();
    let mut late = appended[0].clone();
    late.sort_key = b"late".to_vec();
    e.engine.append("r", vec![late]).unwrap();
    for _ in 0..3 {
        e.clock.advance(1_000_000);
        e.pass();
    }
    let released: Vec<String> = store.snapshot().unwrap().released(100).unwrap().into_iter().map(|r| r.key).collect();
    assert_eq!(released.len(), 2, "the first generation's manifest and segment: {released:?}");
    assert!(released.iter().all(|k| archive.contains(k)), "{released:?}");

    e.clock.advance(2 * 3_600_000_000);
    let swept = sweep().expect("an interval after the last");
    assert!(!swept.full, "{swept:?}");
    assert_eq!((swept.listed, swept.orphans, swept.deleted), (2, 2, 2), "only the released keys: {swept:?}");
    let left = objects(&e);
    assert!(released.iter().all(|k| !left.contains(k)), "{left:?}");
    assert!(store.snapshot().unwrap().released(100).unwrap().is_empty(), "forgotten once deleted");
    assert_eq!(e.query_all("r").len(), appended.len() + 1, "every record reads back");

    e.clock.advance(DAY_US);
    let daily = sweep().expect("an interval after the last");
    assert!(daily.full && daily.listed >= 60, "a day after the last full one: {daily:?}");
    e.clock.advance(2 * 3_600_000_000);
    assert!(!sweep().unwrap().full);
    drop(store);
    let e = e.restart().unwrap();
    e.clock.advance(2 * 3_600_000_000);
    let after_restart = runtime().block_on(sweep_if_due(&e.engine.context())).unwrap().unwrap();
    assert!(after_restart.full, "the first sweep of a life is full: {after_restart:?}");
}

/// A target declared with `sweep = false` is left alone by every sweep, full or incremental:
/// a key this data directory released there stays, past any grace.
#[test]
fn a_target_declared_with_sweep_off_is_never_swept() {
    let policy = policy("target = \"kept\"\n[[target]]\nname = \"kept\"\nurl = \"memory://\"\nsweep = false\n");
    let e = TestEngine::new(&policy, "2024-03-01T12:00:00Z");
    e.engine.append("r", records("2024-03-01T00:00:00Z", 1, 3)).unwrap();
    e.pass();
    let orphan = archive_leaving_a_released_orphan(&e);
    let (store, backend) = (e.engine.store().clone(), e.backend("r"));
    assert_eq!(store.snapshot().unwrap().released(10).unwrap().len(), 1, "the orphan is released");
    e.clock.set(frostline::clock::SystemClock.now() + 10 * DAY_US);
    let full = runtime().block_on(frostline::archive::sweep::sweep(&e.engine.context(), false)).unwrap();
    e.clock.advance(2 * 3_600_000_000);
    let incremental =
        runtime().block_on(frostline::archive::sweep::sweep_if_due(&e.engine.context())).unwrap().unwrap();
    assert!(!incremental.full, "{incremental:?}");
    for report in [full, incremental] {
        assert_eq!((report.listed, report.orphans, report.deleted), (0, 0, 0), "{report:?}");
    }
    let left = runtime().block_on(backend.list("table=r/")).unwrap();
    assert!(left.iter().any(|o| o.key == orphan), "{left:?}");
}

#[test]
fn the_sweep_spares_objects_an_in_flight_upload_named_and_stops_when_listing_fails() {
    let e = TestEngine::new(&policy(""), "2024-03-01T12:00:00Z");
    e.engine.append("r", records("2024-03-01T00:00:00Z", 1, 3)).unwrap();
    e.pass();
    e.clock.set(t("2024-03-05T00:00:00Z"));
    let store = e.engine.store().clone();
    let id = store.buckets("r", Some(b"p0")).unwrap()[0].id.clone();
    let claimed = store.claim(id.clone(), "w".into(), e.clock.now(), 3_600_000_000_000).unwrap().unwrap();
    // One of this installation's own keys: spared because the intent names it, not as foreign.
    let key = format!(
        "table=r/bucket=day:2024-03-01/partition=p0/seg-{}-00000-00000000deadbeef.jsonl",
        e.engine.installation_id()
    );
    store
        .record_intent(
            frostline::store::schema::UploadIntent {
                bucket: id,
                generation: claimed.generation,
                target: "t".into(),
                keys: vec![key.clone()],
                recorded_at: e.clock.now(),
            },
            "w".into(),
            e.clock.now(),
        )
        .unwrap();
    runtime().block_on(e.backend("r").put_create(&key, "in flight".into())).unwrap();
    e.clock.set(frostline::clock::SystemClock.now() + 10 * DAY_US);
    let report = runtime().block_on(frostline::archive::sweep::sweep(&e.engine.context(), false)).unwrap();
    assert_eq!((report.referenced, report.deleted), (1, 0), "{report:?}");

    let faulty = FaultyBackend::new(e.backend("r"));
    e.with_backend("r", faulty.clone());
    faulty.add(Op::List, "", Fault::Error, None);
    assert!(runtime().block_on(frostline::archive::sweep::sweep(&e.engine.context(), false)).is_err());
    faulty.clear();
    assert_eq!(objects(&e).len(), 1, "nothing deleted by a sweep that could not list");
}

#[test]
fn verify_reports_a_corrupted_segment_and_exits_non_zero() {
    let root = tempfile::tempdir().unwrap();
    let policies = root.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(
        policies.join("tables.toml"),
        "[[table]]\nid = \"events\"\nstrategy = { plugin = \"builtin:calendar-year-utc\" }\n",
    )
    .unwrap();
    let data = root.path().join("data");
    let (p, d) = (policies.to_str().unwrap(), data.to_str().unwrap());
    let lines: String = (0..20)
        .map(|i| format!("{{\"partition_key\":\"a\",\"event_time\":\"2020-0{}-01T00:00:00Z\",\"sort_key\":\"{i}\",\"body\":{{\"i\":{i}}}}}\n", 1 + i % 9))
        .collect();
    let input = root.path().join("in.jsonl");
    std::fs::write(&input, lines).unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(frostline_bin()).args(args).args(["--data", d, "--policies", p]).output().unwrap()
    };
    assert!(run(&["ingest", "--table", "events", input.to_str().unwrap()]).status.success());
    assert!(run(&["archive", "--once"]).status.success());
    let ok = run(&["verify"]);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stdout));
    assert!(text(&ok.stdout).contains("1 buckets verified, 0 failed"), "{}", text(&ok.stdout));
    let mut segments = Vec::new();
    for entry in walk(&data.join("archive")) {
        if entry.to_string_lossy().contains("seg-") {
            segments.push(entry);
        }
    }
    let mut bytes = std::fs::read(&segments[0]).unwrap();
    bytes[10] ^= 0x20;
    std::fs::write(&segments[0], bytes).unwrap();
    let bad = run(&["verify"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stdout).contains("FAIL"), "{}", text(&bad.stdout));
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { out.extend(walk(&path)) } else { out.push(path) }
    }
    out
}

/// `test_certificates` as the authority's PEM and rustls's server configuration serving the
/// certificate.
fn authority_and_server() -> (String, Arc<rustls::ServerConfig>) {
    let certificates = test_certificates();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![certificates.cert_der.into()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(certificates.key_der.into()),
        )
        .unwrap();
    (certificates.ca_pem, Arc::new(config))
}

/// An https webhook is delivered to over rustls. A server whose certificate no trusted
/// authority signed is refused (the event stays in the outbox, the sink backs off); once the
/// sink's `ca_file` names the authority, every event is delivered. (Before, https sinks were
/// refused at load.)
#[test]
fn an_https_webhook_trusts_its_ca_file_and_refuses_an_unknown_certificate() {
    let (ca_pem, server_config) = authority_and_server();
    let (address, keys) = serve_webhook(Some(server_config));
    let url = format!("https://localhost:{}/events", address.port());
    let e = archived_engine(&format!("[[sink]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"{url}\"\n"));
    let backlog = e.engine.store().outbox_len().unwrap();
    assert!(backlog >= 6, "the unknown certificate was refused: nothing was delivered");
    assert!(keys.lock().unwrap().is_empty());

    let dir = e.engine.policies().dir.clone();
    std::fs::write(dir.join("authority.pem"), &ca_pem).unwrap();
    let sink = format!("[[sink]]\nname = \"hook\"\nkind = \"webhook\"\nurl = \"{url}\"\nca_file = \"authority.pem\"\n");
    std::fs::write(dir.join("tables.toml"), policy(&sink)).unwrap();
    assert!(frostline::ops::reload::reload(&e.engine, "test").accepted);
    drain_outbox(&e);
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys.len() as u64, backlog, "each event delivered once over TLS: {keys:?}");
    assert!(keys.iter().all(|k| k.starts_with("frostline-hook-")), "{keys:?}");
}

/// A sink's `ca_file` that cannot serve is refused when the policy loads, with the file and
/// the reason, and nothing starts.
#[test]
fn a_ca_file_that_cannot_serve_is_refused_at_load_with_the_reason() {
    let ca_pem = test_certificates().ca_pem;
    let key_pem = rcgen::KeyPair::generate().unwrap().serialize_pem();
    let https = "url = \"https://localhost:9/events\"";
    for (sink, file, reason) in [
        (format!("kind = \"webhook\"\n{https}\nca_file = \"missing.pem\""), None, "cannot be read"),
        (format!("kind = \"webhook\"\n{https}\nca_file = \"ca.pem\""), Some("not a certificate"), "no PEM certificate"),
        (
            format!("kind = \"webhook\"\n{https}\nca_file = \"ca.pem\""),
            Some(key_pem.as_str()),
            "something other than certificates",
        ),
        (
            "kind = \"webhook\"\nurl = \"http://localhost:9/events\"\nca_file = \"ca.pem\"".to_string(),
            Some(ca_pem.as_str()),
            "for https:// webhooks only",
        ),
        ("kind = \"webhook\"\nurl = \"ftp://localhost/x\"".to_string(), None, "must start with http:// or https://"),
    ] {
        let root = tempfile::tempdir().unwrap();
        let policies = root.path().join("policies");
        std::fs::create_dir_all(&policies).unwrap();
        if let Some(content) = file {
            std::fs::write(policies.join("ca.pem"), content).unwrap();
        }
        std::fs::write(policies.join("tables.toml"), policy(&format!("[[sink]]\nname = \"hook\"\n{sink}\n"))).unwrap();
        let err = frostline::engine::Engine::open(
            &root.path().join("data"),
            &policies,
            frostline::settings::Settings::default(),
            frostline::clock::ManualClock::new(0),
        )
        .err()
        .unwrap_or_else(|| panic!("{sink}: accepted"))
        .to_string();
        assert!(err.contains("tables.toml") && err.contains("sink `hook`") && err.contains(reason), "{sink}: {err}");
    }
}

/// A target that lists segments before manifests (a local directory lists in no particular
/// order) and fails every delete after the first, as a sweep cut off between its deletes.
#[derive(Debug)]
struct SegmentsFirstOneDelete {
    inner: std::sync::Arc<dyn frostline::storage::ArchiveBackend>,
    deletes: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl frostline::storage::ArchiveBackend for SegmentsFirstOneDelete {
    fn target(&self) -> &str {
        self.inner.target()
    }
    async fn put_create(&self, key: &str, bytes: bytes::Bytes) -> frostline::Result<frostline::storage::PutOutcome> {
        self.inner.put_create(key, bytes).await
    }
    async fn get(&self, key: &str) -> frostline::Result<Option<bytes::Bytes>> {
        self.inner.get(key).await
    }
    async fn delete(&self, key: &str) -> frostline::Result<()> {
        if self.deletes.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 1 {
            return Err(frostline::error::Error::StorageUnavailable(format!("delete of `{key}` failed (injected)")));
        }
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> frostline::Result<Vec<frostline::storage::ObjectInfo>> {
        let mut listed = self.inner.list(prefix).await?;
        listed.sort_by_key(|o| !o.key.rsplit('/').next().is_some_and(|name| name.starts_with("seg-")));
        Ok(listed)
    }
}

/// The sweep deletes a replaced generation's manifest before its segments, as an expiry does:
/// a sweep cut off between its deletes leaves a segment no manifest names (deleted by a later
/// sweep), never a manifest whose segment is gone, which a data directory rebuilt later would
/// find on the target and report as a damaged archive (the lifecycle simulation met one).
#[test]
fn a_sweep_cut_off_between_its_deletes_never_leaves_a_manifest_without_its_segment() {
    let e = TestEngine::new(&policy(""), "2024-03-01T12:00:00Z");
    e.engine.append("r", records("2024-03-01T00:00:00Z", 1, 3)).unwrap();
    e.pass(); // plan
    e.clock.set(t("2024-03-05T00:00:00Z"));
    assert_eq!(e.pass().archived, 3);
    // A late record: p0's next generation replaces the first, whose manifest and segment are
    // released for the sweep.
    let mut late = records("2024-03-01T00:00:00Z", 1, 1);
    late[0].sort_key = b"late".to_vec();
    e.engine.append("r", late).unwrap();
    e.clock.advance(DAY_US);
    let report = e.pass();
    assert_eq!(report.archived, 1, "{report:?}");
    let before = objects(&e);
    e.with_backend(
        "r",
        std::sync::Arc::new(SegmentsFirstOneDelete { inner: e.backend("r"), deletes: Default::default() }),
    );
    // Real time is what the store stamps objects with; the engine's clock decides their age.
    e.clock.set(frostline::clock::SystemClock.now() + 2 * DAY_US);
    let cut_off = runtime().block_on(frostline::archive::sweep::sweep(&e.engine.context(), false));
    assert!(cut_off.is_err(), "the second delete fails: {cut_off:?}");
    let left = objects(&e);
    assert_eq!(left.len(), before.len() - 1, "one object deleted: {before:?} then {left:?}");
    for manifest in left.iter().filter(|k| k.rsplit('/').next().is_some_and(|n| n.starts_with("manifest-"))) {
        let bytes = runtime().block_on(e.backend("r").get(manifest)).unwrap().unwrap();
        let parsed: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        for segment in parsed["segments"].as_array().unwrap() {
            let key = segment["key"].as_str().unwrap();
            assert!(left.iter().any(|k| k == key), "`{manifest}` names `{key}`, which the sweep deleted");
        }
    }
}

/// Archives a day of records in a partition whose key encodes longer than a folder name may
/// be (written as its hash) beside `USER_KEYS`, and leaves a released orphan in the long key's
/// folder (as `archive_leaving_a_released_orphan`). Returns the orphan's key.
fn archive_a_hashed_folder_with_a_released_orphan(e: &TestEngine, long: &[u8]) -> String {
    let mut input = Vec::new();
    for (n, partition) in USER_KEYS.iter().map(|k| k.as_bytes()).chain([long]).enumerate() {
        for i in 0..3 {
            input.push(frostline::model::Record {
                partition_key: partition.to_vec(),
                event_time: t("2024-03-01T00:00:00Z") + i * 1_000_000,
                sort_key: format!("{n}-{i}").into_bytes(),
                tenant: None,
                kind: None,
                body: format!(r#"{{"n":{n},"body":"{}"}}"#, "b".repeat(4096)),
            });
        }
    }
    e.engine.append("r", input).unwrap();
    e.pass(); // plan
    e.clock.set(t("2024-03-05T00:00:00Z"));
    let orphan = upload_as_a_worker_that_dies(e, long);
    assert!(orphan.contains("partition=~"), "the long key's folder writes its hash: {orphan}");
    e.clock.advance(120_000_000);
    assert_eq!(e.pass().archived, 4);
    orphan
}

/// The full sweep reads each listed object's references from the object's bucket, named by its
/// folder. A folder that writes a value as its hash names no bucket by itself: the sweep finds
/// which one from the store, so the archive there counts as referenced (none of it unproven),
/// the released orphan beside it is deleted, and every record reads back.
#[test]
fn the_full_sweep_knows_the_bucket_of_a_folder_named_by_a_hash() {
    let e = TestEngine::new(&policy(""), "2024-03-01T12:00:00Z");
    let long = format!("site/{}%= kühl", "ü".repeat(40)).into_bytes();
    let orphan = archive_a_hashed_folder_with_a_released_orphan(&e, &long);
    let archive = objects(&e);
    e.clock.set(frostline::clock::SystemClock.now() + 2 * DAY_US);
    let report = runtime().block_on(frostline::archive::sweep::sweep(&e.engine.context(), false)).unwrap();
    assert_eq!(report.referenced as usize, archive.len() - 1, "all but the orphan: {report:?}");
    assert_eq!((report.unproven, report.foreign, report.orphans, report.deleted), (0, 0, 1, 1), "{report:?}");
    assert_eq!(report.orphan_keys, vec![orphan.clone()]);
    let left = objects(&e);
    assert_eq!(left.len(), archive.len() - 1);
    assert!(!left.contains(&orphan), "{left:?}");
    assert_eq!(e.query_all("r").len(), 12, "every record reads back");
    // A key of an epoch this database never recorded there is another copy's: the sweep stops.
    let folder = frostline::storage::keys::bucket_prefix("r", "day:2024-03-01", &long);
    let other = format!("{folder}seg-{}-eabcdefabcdefabcd-00001-0123456789abcdef.jsonl", e.engine.installation_id());
    runtime().block_on(e.backend("r").put_create(&other, "y".into())).unwrap();
    let stopped = runtime().block_on(frostline::archive::sweep::sweep(&e.engine.context(), false)).unwrap_err();
    assert!(stopped.to_string().contains(&other), "{stopped}");
}

/// One of a vast number of another installation's segments listed beside the table's real
/// archive (`PaddedListing`): a thousand to a folder, as a year of day buckets of a few
/// partitions would be.
fn foreign_segment(n: usize) -> frostline::storage::ObjectInfo {
    let folder = frostline::storage::keys::bucket_prefix("r", &format!("day:{}", n / 1_000), b"p/\xc3\xbc %=");
    frostline::storage::ObjectInfo {
        key: format!("{folder}seg-ffffffffffffffff-e0123456789abcdef-{n:05}-0123456789abcdef.parquet"),
        size: 1_000_000,
        last_modified: 0,
    }
}

/// The full sweep's memory follows a page of the listing, not the archive (issue "Cost that
/// grows with change"): over 300,000 more listed objects its process peaks less than 24 MiB
/// higher than over 1,000. Each sweep runs in a process of its own (this test, run again with
/// `FROSTLINE_SWEEP_OBJECTS`), whose peak resident set (`VmHWM`) it reports; a sweep that holds
/// each listing whole, as before af98729, peaked 101.5 MiB higher.
#[test]
fn the_full_sweeps_memory_does_not_grow_with_the_objects_it_lists() {
    const NAME: &str = "lifecycle::the_full_sweeps_memory_does_not_grow_with_the_objects_it_lists";
    if let Some(objects) = std::env::var("FROSTLINE_SWEEP_OBJECTS").ok().and_then(|n| n.parse().ok()) {
        let e = TestEngine::new(&policy(""), "2024-03-01T12:00:00Z");
        e.engine.append("r", records("2024-03-01T00:00:00Z", 1, 9)).unwrap();
        e.pass();
        e.clock.set(t("2024-03-05T00:00:00Z"));
        assert_eq!(e.pass().archived, 3);
        let padded = PaddedListing { inner: e.backend("r"), prefix: "table=r/", count: objects, make: foreign_segment };
        e.with_backend("r", Arc::new(padded));
        let report = runtime().block_on(frostline::archive::sweep::sweep(&e.engine.context(), false)).unwrap();
        assert_eq!(report.foreign as usize, objects, "{report:?}");
        print_peak();
        return;
    }
    let peak_kib = |objects: usize| peak_kib_of(NAME, &[("FROSTLINE_SWEEP_OBJECTS", objects.to_string())]);
    let (small, large) = (peak_kib(1_000), peak_kib(301_000));
    let grown_mib = (large - small) / 1024.0;
    assert!(grown_mib < 24.0, "peaks {small} and {large} KiB: {grown_mib:.1} MiB more for 300,000 more objects");
}

//! One process owns a data directory. When `frostline run` holds it, `ingest`, `query`,
//! `status`, `archive --once`, `hold place|lift|list` and `verify` go through the running
//! engine's HTTP API (the address is in `<data>/frostline.addr`, tokens in FROSTLINE_TOKEN and
//! FROSTLINE_ADMIN_TOKEN); otherwise they open the directory themselves.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;

use super::EngineArgs;
use crate::cli::client::{Client, PageRequest};
use crate::engine::Engine;
use crate::ops::wire::AppendCounts;
use crate::ops::wire::{HTTP_BODY_BYTES_MAX, HTTP_RECORDS_PER_REQUEST_MAX};

/// The data directory opened here, or the API of the engine that holds it.
pub enum Opened {
    Local(Arc<Engine>),
    Remote(Client),
}

fn is_already_open(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<crate::Error>(), Some(crate::Error::AlreadyOpen { .. }))
}

/// Opens the data directory; when another process holds it and has published an API
/// address, connects to that instead.
pub fn open(args: &EngineArgs) -> anyhow::Result<Opened> {
    match args.open() {
        Ok(engine) => Ok(Opened::Local(engine)),
        Err(e) if is_already_open(&e) => match crate::ops::wire::read_addr_file(&args.data)? {
            Some(addr) => {
                tracing::debug!(%addr, "the data directory is held by a running engine; using its API");
                Ok(Opened::Remote(Client::from_env(addr)))
            }
            None => Err(e.context(format!(
                "the process holding it publishes no API address ({}); if it is `frostline run`, wait until it \
                 has started",
                args.data.join(crate::ops::wire::ADDR_FILE).display()
            ))),
        },
        Err(e) => Err(e),
    }
}

/// Appends already-validated JSON lines in requests of at most `HTTP_RECORDS_PER_REQUEST_MAX`
/// records and `HTTP_BODY_BYTES_MAX` bytes, each one atomic append. A refused request stops
/// the command; the ones before it stay committed (re-running is safe: identical records are
/// accepted unchanged).
pub fn ingest(client: &Client, table: &str, text: &str) -> anyhow::Result<AppendCounts> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let bar = super::progress_bar(lines.len() as u64, "ingest");
    let mut total = AppendCounts::default();
    let mut batch: Vec<u8> = Vec::new();
    let mut count = 0usize;
    let mut flush = |batch: &mut Vec<u8>, count: &mut usize| -> anyhow::Result<()> {
        if *count == 0 {
            return Ok(());
        }
        let outcome = client.append(table, batch)?;
        total.appended += outcome.appended;
        total.duplicates += outcome.duplicates;
        total.already_archived += outcome.already_archived;
        bar.inc(*count as u64);
        batch.clear();
        *count = 0;
        Ok(())
    };
    for line in lines {
        if count == HTTP_RECORDS_PER_REQUEST_MAX || batch.len() + line.len() + 1 > HTTP_BODY_BYTES_MAX {
            flush(&mut batch, &mut count)?;
        }
        batch.extend_from_slice(line.as_bytes());
        batch.push(b'\n');
        count += 1;
    }
    flush(&mut batch, &mut count)?;
    bar.finish_and_clear();
    Ok(total)
}

/// Prints one page of records as JSON lines (and the next cursor on stderr), like the local
/// query.
pub fn query(client: &Client, table: &str, request: &PageRequest<'_>) -> anyhow::Result<()> {
    use std::io::Write;
    let page = client.query(table, request)?;
    let mut out = std::io::stdout().lock();
    for record in &page.records {
        writeln!(out, "{}", record.get())?;
    }
    if let Some(c) = page.next_cursor {
        eprintln!("next cursor: {c}");
    }
    Ok(())
}

/// Prints the running engine's status; when its API cannot be reached, the status file it
/// last wrote.
pub fn status(client: &Client, args: &EngineArgs, json: bool) -> anyhow::Result<()> {
    match client.status() {
        Ok(status) => {
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                super::status::print(&status);
            }
            Ok(())
        }
        Err(e @ crate::Error::ApiUnreachable { .. }) => {
            let path = args.data.join(crate::engine::STATUS_FILE);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("{e}; and its status file {} is unreadable", path.display()))?;
            eprintln!("{e}; showing the status file it last wrote");
            println!("{text}");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Asks the running engine for passes until idle now, and prints its report.
pub fn archive(client: &Client) -> anyhow::Result<ExitCode> {
    let report = client.archive()?;
    println!("{report}");
    let clean = report["deferred"].as_u64() == Some(0) && report["errors"].as_array().is_some_and(|e| e.is_empty());
    Ok(if clean { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

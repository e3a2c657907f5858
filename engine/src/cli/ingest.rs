//! `frostline ingest`: JSON lines from a file or stdin into a table.
//!
//! The whole input is parsed first. If any line is malformed, every bad line is reported with
//! its number and reason and nothing is written. Valid input is then appended in atomic batches
//! of up to 10,000 records; if a batch is refused (a conflict, a fenced or too-old bucket) the
//! batches before it stay committed and the command stops: running it again is safe, because
//! identical records are accepted unchanged.

use std::io::Read;

use crate::engine::{APPEND_BATCH_RECORDS_MAX, Engine};
use crate::error::Result;
use crate::model::Record;
pub use crate::ops::records::{REPORTED_BAD_LINES_MAX, parse_lines};

pub fn read_input(file: Option<&str>) -> anyhow::Result<String> {
    let mut text = String::new();
    match file {
        None | Some("-") => {
            std::io::stdin().read_to_string(&mut text)?;
        }
        Some(path) => {
            text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {path}: {e}"))?;
        }
    }
    Ok(text)
}

/// Appends parsed records in batches, with a progress bar on a terminal.
pub fn append_all(engine: &Engine, table: &str, records: Vec<Record>) -> Result<crate::store::AppendOutcome> {
    let bar = crate::cli::progress_bar(records.len() as u64, "ingest");
    let mut total = crate::store::AppendOutcome::default();
    for chunk in records.chunks(APPEND_BATCH_RECORDS_MAX) {
        let outcome = engine.append(table, chunk.to_vec())?;
        total.appended += outcome.appended;
        total.duplicates += outcome.duplicates;
        total.already_archived += outcome.already_archived;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    Ok(total)
}

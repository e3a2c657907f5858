//! `frostline ingest`: JSON lines from a file or stdin into a table, in bounded memory.
//!
//! Two streaming passes over the input. The first validates every line and counts them; if
//! any line is malformed, every bad line is reported with its number and reason (the first
//! `REPORTED_BAD_LINES_MAX`, then how many more) and nothing is written. Standard input, which
//! cannot be read twice, is copied to an anonymous temporary file during that pass. The second
//! pass reads the lines again and appends them in atomic batches of at most
//! `INGEST_BATCH_RECORDS_MAX` (10,000) records and `HTTP_BODY_BYTES_MAX` bytes of lines; if a batch is
//! refused (a conflict, a fenced or too-old bucket) the batches before it stay committed and
//! the command stops: running it again is safe, because identical records are accepted
//! unchanged. Memory holds one batch, whatever the size of the input. The input must not
//! change while the command runs; if the second pass finds a line that no longer parses, or
//! another number of lines, it stops there as a refused batch would.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Seek, Write};

use crate::model::Record;
use crate::model::columns::{ColumnSpec, check_record};
use crate::ops::local::APPEND_BATCH_RECORDS_MAX;
pub use crate::ops::records::{REPORTED_BAD_LINES_MAX, parse_line};
use crate::ops::wire::{AppendCounts, HTTP_BODY_BYTES_MAX, HTTP_RECORDS_PER_REQUEST_MAX};

/// The longest line read: a longer one cannot be sent in one request (nor hold a record
/// whose body fits `RECORD_BODY_BYTES_MAX`), and is reported without being held in memory.
pub const INGEST_LINE_BYTES_MAX: usize = HTTP_BODY_BYTES_MAX - 1;

/// Records per batch: one atomic append, locally or in one request to a running engine.
pub const INGEST_BATCH_RECORDS_MAX: usize = if APPEND_BATCH_RECORDS_MAX < HTTP_RECORDS_PER_REQUEST_MAX {
    APPEND_BATCH_RECORDS_MAX
} else {
    HTTP_RECORDS_PER_REQUEST_MAX
};

/// Input that passed validation, ready to be read again.
pub struct Validated {
    input: File,
    /// Non-blank lines, each a valid record.
    pub records: u64,
}

/// What the first pass found.
pub enum Validation {
    Valid(Validated),
    /// `reported` holds the first `REPORTED_BAD_LINES_MAX` errors, with line numbers.
    Malformed {
        reported: Vec<String>,
        total: u64,
    },
}

/// The first pass: validates every line of `file` (or of standard input for `None` or `-`),
/// and, when they are known (`columns`: the table's typed columns, from a data directory the
/// command opened), each record against them, so a value a column refuses writes nothing.
pub fn validate(file: Option<&str>, columns: Option<&[ColumnSpec]>) -> anyhow::Result<Validation> {
    let (source, mut spool): (Box<dyn Read>, Option<BufWriter<File>>) = match file {
        None | Some("-") => (Box::new(std::io::stdin().lock()), Some(BufWriter::new(tempfile::tempfile()?))),
        Some(path) => (Box::new(File::open(path).map_err(|e| anyhow::anyhow!("cannot read {path}: {e}"))?), None),
    };
    let mut lines = Lines::new(source);
    let (mut records, mut bad, mut reported) = (0u64, 0u64, Vec::new());
    while let Some((number, line)) = lines.next_line()? {
        let outcome = match line {
            Line::Text(text) => {
                if let Some(spool) = spool.as_mut() {
                    spool.write_all(text)?;
                    spool.write_all(b"\n")?;
                }
                if text.trim_ascii().is_empty() {
                    continue;
                }
                parse(text).and_then(|record| check_record(columns.unwrap_or_default(), &record).map(drop))
            }
            Line::TooLong => Err(format!("longer than {INGEST_LINE_BYTES_MAX} bytes")),
        };
        match outcome {
            Ok(()) => records += 1,
            Err(why) => {
                bad += 1;
                if reported.len() < REPORTED_BAD_LINES_MAX {
                    reported.push(format!("line {number}: {why}"));
                }
            }
        }
    }
    if bad > 0 {
        return Ok(Validation::Malformed { reported, total: bad });
    }
    let input = match (spool, file) {
        (Some(spool), _) => {
            let mut spooled = spool.into_inner().map_err(|e| e.into_error())?;
            spooled.rewind()?;
            spooled
        }
        (None, path) => File::open(path.unwrap_or_default())?,
    };
    Ok(Validation::Valid(Validated { input, records }))
}

/// One non-blank line as a record, or why it is not one.
fn parse(text: &[u8]) -> Result<Record, String> {
    let text = std::str::from_utf8(text).map_err(|e| format!("not UTF-8: {e}"))?;
    parse_line(text).map_err(|e| e.to_string())
}

/// The second pass: reads the validated lines again and hands them to `append` in batches
/// (the records, and their lines as the API takes them); `on_batch` sees each batch's size.
pub fn append_batches(
    validated: Validated,
    mut append: impl FnMut(Vec<Record>, &[u8]) -> anyhow::Result<AppendCounts>,
    mut on_batch: impl FnMut(usize),
) -> anyhow::Result<AppendCounts> {
    let mut lines = Lines::new(BufReader::new(validated.input));
    let mut total = AppendCounts::default();
    let mut records = Vec::new();
    let mut text: Vec<u8> = Vec::new();
    let mut read = 0u64;
    let mut flush = |records: &mut Vec<Record>, text: &mut Vec<u8>| -> anyhow::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let count = records.len();
        let outcome = append(std::mem::take(records), text)?;
        total.appended += outcome.appended;
        total.duplicates += outcome.duplicates;
        total.already_archived += outcome.already_archived;
        total.column_misses += outcome.column_misses;
        text.clear();
        on_batch(count);
        Ok(())
    };
    while let Some((number, line)) = lines.next_line()? {
        let Line::Text(line) = line else {
            anyhow::bail!("line {number} changed since it was validated; stopped there");
        };
        if line.trim_ascii().is_empty() {
            continue;
        }
        let record = parse(line)
            .map_err(|e| anyhow::anyhow!("line {number} changed since it was validated ({e}); stopped there"))?;
        if records.len() == INGEST_BATCH_RECORDS_MAX || text.len() + line.len() + 1 > HTTP_BODY_BYTES_MAX {
            flush(&mut records, &mut text)?;
        }
        records.push(record);
        text.extend_from_slice(line);
        text.push(b'\n');
        read += 1;
    }
    flush(&mut records, &mut text)?;
    if read != validated.records {
        anyhow::bail!("the input changed since it was validated: {} lines then, {read} now", validated.records);
    }
    Ok(total)
}

/// One line of input, without its line ending.
enum Line<'a> {
    Text(&'a [u8]),
    /// Longer than `INGEST_LINE_BYTES_MAX`: skipped, never held whole.
    TooLong,
}

/// Lines read one at a time into one reused buffer, numbered from 1.
struct Lines<R> {
    reader: BufReader<R>,
    buffer: Vec<u8>,
    number: u64,
}

impl<R: Read> Lines<R> {
    fn new(source: R) -> Self {
        Lines { reader: BufReader::with_capacity(1 << 20, source), buffer: Vec::new(), number: 0 }
    }

    fn next_line(&mut self) -> std::io::Result<Option<(u64, Line<'_>)>> {
        self.buffer.clear();
        let limit = INGEST_LINE_BYTES_MAX as u64 + 1;
        let read = (&mut self.reader).take(limit).read_until(b'\n', &mut self.buffer)?;
        if read == 0 {
            return Ok(None);
        }
        self.number += 1;
        if self.buffer.last() == Some(&b'\n') {
            self.buffer.pop();
            if self.buffer.last() == Some(&b'\r') {
                self.buffer.pop();
            }
        } else if self.buffer.len() as u64 == limit {
            // Skip the rest of the line without keeping it.
            loop {
                let available = self.reader.fill_buf()?;
                if available.is_empty() {
                    break;
                }
                match available.iter().position(|&b| b == b'\n') {
                    Some(end) => {
                        self.reader.consume(end + 1);
                        break;
                    }
                    None => {
                        let all = available.len();
                        self.reader.consume(all);
                    }
                }
            }
            return Ok(Some((self.number, Line::TooLong)));
        }
        Ok(Some((self.number, Line::Text(&self.buffer))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read_one_at_a_time_and_an_overlong_one_is_skipped_whole() {
        let long = "x".repeat(INGEST_LINE_BYTES_MAX + 10);
        let input = format!("a\r\n{long}\nb\n\nc");
        let mut lines = Lines::new(input.as_bytes());
        let mut seen = Vec::new();
        while let Some((_, line)) = lines.next_line().unwrap() {
            seen.push(match line {
                Line::Text(text) => String::from_utf8(text.to_vec()).unwrap(),
                Line::TooLong => "<too long>".into(),
            });
        }
        assert_eq!(seen, ["a", "<too long>", "b", "", "c"]);
        assert_eq!(lines.number, 5);
        // A line of exactly the limit is read.
        let exact = "y".repeat(INGEST_LINE_BYTES_MAX);
        let mut lines = Lines::new(exact.as_bytes());
        assert!(matches!(lines.next_line().unwrap(), Some((1, Line::Text(t))) if t.len() == INGEST_LINE_BYTES_MAX));
    }
}

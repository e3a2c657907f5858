//! Time as the engine sees it: i64 microseconds since the Unix epoch, UTC, and its text forms.

use crate::error::{Error, Result};

/// Microseconds since the Unix epoch, UTC.
pub type Micros = i64;

pub const MICROS_PER_SECOND: i64 = 1_000_000;
pub const MICROS_PER_DAY: i64 = 86_400 * MICROS_PER_SECOND;

/// Parses RFC 3339 (`2024-02-29T12:00:00Z`, any offset) into microseconds.
pub fn parse_rfc3339(text: &str) -> Result<Micros> {
    let parsed =
        ::time::OffsetDateTime::parse(text, &::time::format_description::well_known::Rfc3339).map_err(|e| {
            Error::InvalidInput(format!("`{text}` is not an RFC 3339 time ({e}); write it like 2024-02-29T12:00:00Z"))
        })?;
    i64::try_from(parsed.unix_timestamp_nanos() / 1_000)
        .map_err(|_| Error::InvalidInput(format!("`{text}` is outside the supported time range")))
}

/// Formats microseconds as RFC 3339 UTC; times outside the calendar's range print as numbers.
pub fn format_rfc3339(t: Micros) -> String {
    ::time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(t) * 1_000)
        .ok()
        .and_then(|dt| dt.format(&::time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| format!("{t}us"))
}

/// Parses either RFC 3339 text or an integer count of microseconds.
pub fn parse_time_arg(text: &str) -> Result<Micros> {
    match text.trim().parse::<i64>() {
        Ok(micros) => Ok(micros),
        Err(_) => parse_rfc3339(text.trim()),
    }
}

/// 1 January 00:00 UTC of the year before the year of `now`.
pub fn start_of_previous_year(now: Micros) -> Micros {
    let year =
        ::time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(now) * 1_000).map(|dt| dt.year()).unwrap_or(1970);
    let date = ::time::Date::from_calendar_date(year - 1, ::time::Month::January, 1).unwrap_or(::time::Date::MIN);
    let midnight = date.midnight().assume_utc();
    (midnight.unix_timestamp_nanos() / 1_000) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_and_accepts_offsets() {
        let t = parse_rfc3339("2024-02-29T12:00:00Z").unwrap();
        assert_eq!(format_rfc3339(t), "2024-02-29T12:00:00Z");
        assert_eq!(parse_rfc3339("2024-02-29T13:00:00+01:00").unwrap(), t);
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59.999999Z").unwrap(), -1);
        assert!(parse_rfc3339("yesterday").is_err());
        assert_eq!(parse_time_arg("-5").unwrap(), -5);
    }

    #[test]
    fn previous_year_start() {
        let now = parse_rfc3339("2026-11-30T05:00:00Z").unwrap();
        assert_eq!(format_rfc3339(start_of_previous_year(now)), "2025-01-01T00:00:00Z");
    }
}

//! Built-in bucket strategy `calendar-utc`: one bucket per UTC calendar year, month or day.
//!
//! Config `{"unit": "year" | "month" | "day"}`; an empty config means `year`. Keys are
//! `year:2024`, `month:2024-02` and `day:2024-02-29`. Supports years 0001 through 9999 so that
//! every key has exactly four year digits and sorts as text in time order.

mod bindings {
    wit_bindgen::generate!({ path: "../../../wit", world: "bucket-strategy" });
}

use std::cell::Cell;

use bindings::exports::frostline::plugin::strategy::Guest as StrategyGuest;
use bindings::frostline::plugin::types::{BucketDescriptor, TimestampMicros};
use frostline_civil::{MICROS_PER_DAY, civil_from_days, days_from_civil, format_utc};
use serde::Deserialize;

/// 0001-01-01T00:00:00Z, the first supported instant.
const SUPPORTED_START_MICROS: i64 = days_from_civil(1, 1, 1) * MICROS_PER_DAY;
/// 10000-01-01T00:00:00Z, the first instant after the supported range.
const SUPPORTED_END_MICROS: i64 = days_from_civil(10_000, 1, 1) * MICROS_PER_DAY;

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Unit {
    #[default]
    Year,
    Month,
    Day,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    unit: Unit,
}

thread_local! {
    // Year until init says otherwise, so a host that skips init still gets valid buckets.
    static UNIT: Cell<Unit> = const { Cell::new(Unit::Year) };
}

fn parse_config(config: &str) -> Result<Unit, String> {
    if config.trim().is_empty() {
        return Ok(Unit::default());
    }
    serde_json::from_str::<Config>(config).map(|c| c.unit).map_err(|e| format!("calendar-utc config: {e}"))
}

fn bucket_for(unit: Unit, t: i64) -> Result<BucketDescriptor, String> {
    if !(SUPPORTED_START_MICROS..SUPPORTED_END_MICROS).contains(&t) {
        return Err(format!(
            "event time {t} µs since the Unix epoch ({}) is outside the supported range \
             0001-01-01T00:00:00Z (inclusive) to 10000-01-01T00:00:00Z (exclusive), \
             i.e. years 0001 through 9999",
            format_utc(t)
        ));
    }
    let days = t.div_euclid(MICROS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    let (key, start_days, end_days) = match unit {
        Unit::Year => (format!("year:{year:04}"), days_from_civil(year, 1, 1), days_from_civil(year + 1, 1, 1)),
        Unit::Month => {
            let (next_year, next_month) = if month == 12 { (year + 1, 1) } else { (year, month + 1) };
            (
                format!("month:{year:04}-{month:02}"),
                days_from_civil(year, month, 1),
                days_from_civil(next_year, next_month, 1),
            )
        }
        Unit::Day => (format!("day:{year:04}-{month:02}-{day:02}"), days, days + 1),
    };
    // Cannot overflow: the supported range ends at 10000-01-01, far inside i64 microseconds.
    Ok(BucketDescriptor { key, start: start_days * MICROS_PER_DAY, end: end_days * MICROS_PER_DAY })
}

fn buckets_for(unit: Unit, times: &[i64]) -> Result<Vec<BucketDescriptor>, String> {
    let mut out: Vec<BucketDescriptor> = Vec::with_capacity(times.len());
    for (index, &t) in times.iter().enumerate() {
        // Batches are usually sorted, so the previous answer is most often the right one and
        // saves the calendar arithmetic and the key formatting.
        let cached = out.last().filter(|last| last.start <= t && t < last.end).cloned();
        match cached {
            Some(bucket) => out.push(bucket),
            None => out.push(bucket_for(unit, t).map_err(|e| format!("event time #{index}: {e}"))?),
        }
    }
    Ok(out)
}

struct Component;

impl bindings::Guest for Component {
    fn init(config: String) -> Result<(), String> {
        let unit = parse_config(&config)?;
        UNIT.set(unit);
        Ok(())
    }
}

impl StrategyGuest for Component {
    fn bucket_for(event_time: TimestampMicros) -> Result<BucketDescriptor, String> {
        bucket_for(UNIT.get(), event_time)
    }

    fn buckets_for(event_times: Vec<TimestampMicros>) -> Result<Vec<BucketDescriptor>, String> {
        buckets_for(UNIT.get(), &event_times)
    }
}

bindings::export!(Component with_types_in bindings);

#[cfg(test)]
mod tests {
    use super::*;

    const MICROS_PER_SECOND: i64 = 1_000_000;

    fn at(year: i64, month: u32, day: u32) -> i64 {
        days_from_civil(year, month, day) * MICROS_PER_DAY
    }

    fn check(unit: Unit, t: i64, key: &str, start: i64, end: i64) {
        let b = bucket_for(unit, t).unwrap();
        assert_eq!((b.key.as_str(), b.start, b.end), (key, start, end), "t = {t}");
        assert!(b.start <= t && t < b.end);
    }

    #[test]
    fn config() {
        assert_eq!(parse_config("").unwrap(), Unit::Year);
        assert_eq!(parse_config("{}").unwrap(), Unit::Year);
        assert_eq!(parse_config(r#"{"unit":"day"}"#).unwrap(), Unit::Day);
        let e = parse_config(r#"{"unit":"day","zone":"CET"}"#).unwrap_err();
        assert!(e.contains("zone"), "{e}");
        let e = parse_config(r#"{"unit":"week"}"#).unwrap_err();
        assert!(e.contains("week"), "{e}");
    }

    #[test]
    fn before_epoch() {
        check(Unit::Day, -1, "day:1969-12-31", at(1969, 12, 31), 0);
        check(Unit::Month, -1, "month:1969-12", at(1969, 12, 1), 0);
        check(Unit::Year, -1, "year:1969", at(1969, 1, 1), 0);
        check(Unit::Year, 0, "year:1970", 0, at(1971, 1, 1));
    }

    #[test]
    fn leap_years() {
        check(Unit::Day, at(2024, 2, 29) + 5, "day:2024-02-29", at(2024, 2, 29), at(2024, 3, 1));
        check(Unit::Month, at(2000, 2, 15), "month:2000-02", at(2000, 2, 1), at(2000, 3, 1));
        assert_eq!(at(2000, 3, 1) - at(2000, 2, 1), 29 * MICROS_PER_DAY);
        check(Unit::Month, at(1900, 2, 15), "month:1900-02", at(1900, 2, 1), at(1900, 3, 1));
        assert_eq!(at(1900, 3, 1) - at(1900, 2, 1), 28 * MICROS_PER_DAY);
        assert_eq!(at(2024, 1, 1), 1_704_067_200 * MICROS_PER_SECOND);
    }

    #[test]
    fn range_edges() {
        check(Unit::Year, SUPPORTED_START_MICROS, "year:0001", at(1, 1, 1), at(2, 1, 1));
        check(Unit::Day, SUPPORTED_END_MICROS - 1, "day:9999-12-31", at(9999, 12, 31), SUPPORTED_END_MICROS);
        for t in [SUPPORTED_START_MICROS - 1, SUPPORTED_END_MICROS, i64::MIN, i64::MAX] {
            let e = bucket_for(Unit::Year, t).unwrap_err();
            assert!(e.contains(&t.to_string()) && e.contains("0001"), "{e}");
        }
    }

    #[test]
    fn batch_matches_single() {
        let times = [-1, 0, 1, at(2024, 2, 29), at(2024, 2, 29) + 1, at(2024, 3, 1), -1];
        for unit in [Unit::Year, Unit::Month, Unit::Day] {
            let batch = buckets_for(unit, &times).unwrap();
            for (t, b) in times.iter().zip(&batch) {
                let single = bucket_for(unit, *t).unwrap();
                assert_eq!((&b.key, b.start, b.end), (&single.key, single.start, single.end));
            }
        }
        let e = buckets_for(Unit::Day, &[0, i64::MAX]).unwrap_err();
        assert!(e.starts_with("event time #1"), "{e}");
    }
}

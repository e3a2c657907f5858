//! Built-in retention policy `eligible-before`: decides when a bucket is archived (an age
//! after the bucket's end, an absolute cutoff, or by default once it ends before 1 January of
//! the previous year) and when its archive expires (an age after the bucket's end), with
//! per-tenant and per-kind overrides of both ages.
//!
//! Config (every field optional; an empty config means the default cutoff and no expiry):
//!
//! ```json
//! { "cutoff": "2025-01-01T00:00:00Z",
//!   "archive_after": "30d",
//!   "expire_after": "365d",
//!   "tenants": { "acme": { "archive_after": "7d", "expire_after": "90d" } },
//!   "kinds":   { "audit": { "expire_after": "10y" } } }
//! ```

mod bindings {
    wit_bindgen::generate!({ path: "../../../wit", world: "retention-policy" });
}

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;

use bindings::exports::frostline::plugin::policy::Guest as PolicyGuest;
use bindings::frostline::plugin::types::{BucketFacts, RetentionPlan, TimestampMicros};
use frostline_civil::{
    MICROS_PER_DAY, MICROS_PER_SECOND, SECONDS_PER_DAY, SECONDS_PER_HOUR, SECONDS_PER_MINUTE, civil_from_days,
    days_from_civil, days_in_month,
};
use serde::Deserialize;

/// The `y` unit is a fixed 365 days so that an age never depends on which years it spans.
const DAYS_PER_YEAR_UNIT: i64 = 365;
const AGE_SECONDS_MIN: i64 = 1;
/// Ten years including their leap days.
const AGE_DAYS_MAX: i64 = 3652;
const AGE_SECONDS_MAX: i64 = AGE_DAYS_MAX * SECONDS_PER_DAY;
const OVERRIDE_KEY_BYTES_MIN: usize = 1;
const OVERRIDE_KEY_BYTES_MAX: usize = 128;
/// How much of an invalid override key an error message quotes.
const QUOTED_KEY_CHARS_MAX: usize = 40;

/// An age as configured: its length, and its text for reasons (normalised, e.g. `030d` -> `30d`).
#[derive(Clone, Debug)]
struct Age {
    micros: i64,
    text: String,
}

#[derive(Clone, Debug)]
struct Cutoff {
    micros: i64,
    text: String,
}

#[derive(Clone, Debug, Default)]
struct Override {
    archive_after: Option<Age>,
    expire_after: Option<Age>,
}

#[derive(Clone, Debug, Default)]
struct Policy {
    cutoff: Option<Cutoff>,
    archive_after: Option<Age>,
    expire_after: Option<Age>,
    tenants: BTreeMap<String, Override>,
    kinds: BTreeMap<String, Override>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    cutoff: Option<String>,
    archive_after: Option<String>,
    expire_after: Option<String>,
    // Kept as JSON values and parsed one by one so an error can name the override's path.
    #[serde(default)]
    tenants: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    kinds: BTreeMap<String, serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverride {
    archive_after: Option<String>,
    expire_after: Option<String>,
}

thread_local! {
    // The defaults until init runs, so a host that skips init gets the documented behaviour.
    static POLICY: RefCell<Policy> = RefCell::new(Policy::default());
}

fn parse_policy(config: &str) -> Result<Policy, String> {
    if config.trim().is_empty() {
        return Ok(Policy::default());
    }
    let raw: RawPolicy = serde_json::from_str(config).map_err(|e| format!("eligible-before config: {e}"))?;
    if raw.cutoff.is_some() && raw.archive_after.is_some() {
        return Err("cutoff and archive_after are mutually exclusive: set at most one of them".into());
    }
    Ok(Policy {
        cutoff: raw
            .cutoff
            .map(|text| {
                parse_rfc3339(&text).map(|micros| Cutoff { micros, text: text.clone() }).map_err(|why| {
                    format!(
                        "cutoff: {text:?} is not an RFC 3339 time such as \
                             \"2025-01-01T00:00:00Z\" ({why})"
                    )
                })
            })
            .transpose()?,
        archive_after: parse_optional_age("archive_after", raw.archive_after)?,
        expire_after: parse_optional_age("expire_after", raw.expire_after)?,
        tenants: parse_overrides("tenants", raw.tenants)?,
        kinds: parse_overrides("kinds", raw.kinds)?,
    })
}

fn parse_overrides(
    section: &str,
    raw: BTreeMap<String, serde_json::Value>,
) -> Result<BTreeMap<String, Override>, String> {
    let mut out = BTreeMap::new();
    for (key, value) in raw {
        check_override_key(section, &key)?;
        let path = format!("{section}.{key}");
        let fields = RawOverride::deserialize(value).map_err(|e| format!("{path}: {e}"))?;
        let parsed = Override {
            archive_after: parse_optional_age(&format!("{path}.archive_after"), fields.archive_after)?,
            expire_after: parse_optional_age(&format!("{path}.expire_after"), fields.expire_after)?,
        };
        out.insert(key, parsed);
    }
    Ok(out)
}

fn check_override_key(section: &str, key: &str) -> Result<(), String> {
    let length_ok = (OVERRIDE_KEY_BYTES_MIN..=OVERRIDE_KEY_BYTES_MAX).contains(&key.len());
    if length_ok && key.bytes().all(|b| (0x21..=0x7E).contains(&b)) {
        return Ok(());
    }
    let quoted: String = key.chars().take(QUOTED_KEY_CHARS_MAX).collect();
    let ellipsis = if quoted.len() < key.len() { "..." } else { "" };
    Err(format!(
        "{section}: key {quoted:?}{ellipsis} ({} bytes) must be {OVERRIDE_KEY_BYTES_MIN} to \
         {OVERRIDE_KEY_BYTES_MAX} bytes of visible ASCII (0x21 to 0x7E, no spaces)",
        key.len()
    ))
}

fn parse_optional_age(field: &str, text: Option<String>) -> Result<Option<Age>, String> {
    text.map(|t| parse_age(field, &t)).transpose()
}

fn parse_age(field: &str, text: &str) -> Result<Age, String> {
    let digits_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    let unit_seconds = match unit {
        "s" => 1,
        "m" => SECONDS_PER_MINUTE,
        "h" => SECONDS_PER_HOUR,
        "d" => SECONDS_PER_DAY,
        "y" => DAYS_PER_YEAR_UNIT * SECONDS_PER_DAY,
        _ => 0,
    };
    if digits.is_empty() || unit_seconds == 0 {
        return Err(format!(
            "{field}: {text:?} is not a duration; expected <integer><unit> with unit s, m, h, \
             d or y (y = 365 days), e.g. \"30d\""
        ));
    }
    let too_long = || format!("{field}: {text} is above the maximum {AGE_DAYS_MAX}d (10 years)");
    // Digits only, so parsing fails only on overflow: far above the maximum anyway.
    let count: i64 = digits.parse().map_err(|_| too_long())?;
    let seconds = count.checked_mul(unit_seconds).ok_or_else(too_long)?;
    if seconds < AGE_SECONDS_MIN {
        return Err(format!("{field}: {text} is below the minimum {AGE_SECONDS_MIN}s"));
    }
    if seconds > AGE_SECONDS_MAX {
        return Err(too_long());
    }
    Ok(Age { micros: seconds * MICROS_PER_SECOND, text: format!("{count}{unit}") })
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` into microseconds since the epoch.
/// Digits past the microsecond are dropped, which is exact for the `end <= cutoff` test on
/// whole-microsecond bucket ends. Leap seconds (`:60`) are refused: the engine's clock has none.
fn parse_rfc3339(text: &str) -> Result<i64, String> {
    let b = text.as_bytes();
    let number = |from: usize, len: usize, what: &str| -> Result<i64, String> {
        let slice = b
            .get(from..from + len)
            .filter(|s| s.iter().all(u8::is_ascii_digit))
            .ok_or_else(|| format!("expected {len} digits of {what} at byte {from}"))?;
        Ok(slice.iter().fold(0, |acc, d| acc * 10 + i64::from(d - b'0')))
    };
    let separator = |at: usize, allowed: &[u8], what: &str| -> Result<(), String> {
        match b.get(at) {
            Some(c) if allowed.contains(c) => Ok(()),
            _ => Err(format!("expected {what} at byte {at}")),
        }
    };
    let year = number(0, 4, "year")?;
    separator(4, b"-", "'-'")?;
    let month = number(5, 2, "month")?;
    separator(7, b"-", "'-'")?;
    let day = number(8, 2, "day")?;
    separator(10, b"Tt ", "'T'")?;
    let hour = number(11, 2, "hour")?;
    separator(13, b":", "':'")?;
    let minute = number(14, 2, "minute")?;
    separator(16, b":", "':'")?;
    let second = number(17, 2, "second")?;
    let mut at = 19;
    let mut fraction_micros = 0;
    if b.get(at) == Some(&b'.') {
        at += 1;
        let digits = b[at..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return Err("expected digits after '.'".into());
        }
        for (i, d) in b[at..at + digits].iter().take(6).enumerate() {
            fraction_micros += i64::from(d - b'0') * 10_i64.pow(5 - i as u32);
        }
        at += digits;
    }
    let offset_seconds = match b.get(at) {
        Some(b'Z' | b'z') => {
            at += 1;
            0
        }
        Some(&sign @ (b'+' | b'-')) => {
            let offset_hour = number(at + 1, 2, "offset hours")?;
            separator(at + 3, b":", "':'")?;
            let offset_minute = number(at + 4, 2, "offset minutes")?;
            if offset_hour > 23 || offset_minute > 59 {
                return Err(format!("offset {offset_hour:02}:{offset_minute:02} out of range"));
            }
            at += 6;
            let magnitude = offset_hour * SECONDS_PER_HOUR + offset_minute * SECONDS_PER_MINUTE;
            if sign == b'+' { magnitude } else { -magnitude }
        }
        _ => {
            return Err(format!("expected 'Z' or an offset like +01:00 at byte {at}"));
        }
    };
    if at != b.len() {
        return Err(format!("unexpected text at byte {at}"));
    }
    if !(1..=12).contains(&month) {
        return Err(format!("month {month} out of range"));
    }
    let month = month as u32;
    if !(1..=i64::from(days_in_month(year, month))).contains(&day) {
        return Err(format!("day {day} out of range for {year:04}-{month:02}"));
    }
    if hour > 23 || minute > 59 {
        return Err(format!("time {hour:02}:{minute:02} out of range"));
    }
    if second > 59 {
        return Err(format!("second {second} out of range (leap seconds are not supported)"));
    }
    // Years 0000..=9999 with offsets below a day: all of this fits in i64 microseconds.
    let days = days_from_civil(year, month, day as u32);
    let seconds =
        days * SECONDS_PER_DAY + hour * SECONDS_PER_HOUR + minute * SECONDS_PER_MINUTE + second - offset_seconds;
    Ok(seconds * MICROS_PER_SECOND + fraction_micros)
}

/// Which rule set an age, for the plan's reason.
enum Source<'a> {
    Tenant(&'a str),
    Kind(&'a str),
    Global,
}

impl fmt::Display for Source<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Tenant(name) => write!(f, "tenant {name:?} override"),
            Source::Kind(name) => write!(f, "kind {name:?} override"),
            Source::Global => f.write_str("global"),
        }
    }
}

/// Jan 1 of the year after the first Jan 1 at or after `end`: from then on, "1 January of the
/// previous year" is at or after `end`. Saturates at the end of representable time.
fn default_archive_at(end: i64) -> i64 {
    let days = end.div_euclid(MICROS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    let starts_year = month == 1 && day == 1 && end.rem_euclid(MICROS_PER_DAY) == 0;
    let first_jan1_year = if starts_year { year } else { year + 1 };
    days_from_civil(first_jan1_year + 1, 1, 1).checked_mul(MICROS_PER_DAY).unwrap_or(i64::MAX)
}

impl Policy {
    /// Tenant override, then kind override, then the global value: the first that sets the
    /// field decides.
    fn select<'a>(
        &'a self,
        facts: &'a BucketFacts,
        field: fn(&Override) -> Option<&Age>,
        global: Option<&'a Age>,
    ) -> Option<(Source<'a>, &'a Age)> {
        let tenant = facts.tenant.as_deref().and_then(|name| {
            let age = self.tenants.get(name).and_then(field)?;
            Some((Source::Tenant(name), age))
        });
        let kind = || {
            facts.kind.as_deref().and_then(|name| {
                let age = self.kinds.get(name).and_then(field)?;
                Some((Source::Kind(name), age))
            })
        };
        tenant.or_else(kind).or_else(|| global.map(|age| (Source::Global, age)))
    }

    fn plan(&self, facts: &BucketFacts) -> RetentionPlan {
        let end = facts.bucket.end;
        let archive_after = self.select(facts, |o| o.archive_after.as_ref(), self.archive_after.as_ref());
        let (archive_at, archive_reason) = if let Some((source, age)) = archive_after {
            (Some(end.saturating_add(age.micros)), format!("{source} archive_after={}", age.text))
        } else if let Some(cutoff) = &self.cutoff {
            if end <= cutoff.micros {
                (Some(end), format!("cutoff {} (the bucket ends by then)", cutoff.text))
            } else {
                (None, format!("cutoff {} (the bucket ends after it: never)", cutoff.text))
            }
        } else {
            (Some(default_archive_at(end)), "default cutoff (1 January of the previous year)".to_string())
        };
        let expire_after = self.select(facts, |o| o.expire_after.as_ref(), self.expire_after.as_ref());
        let (expire_at, expire_reason) = match (expire_after, archive_at) {
            (None, _) => (None, "never".to_string()),
            (Some((source, age)), None) => {
                (None, format!("never ({source} expire_after={} but never archived)", age.text))
            }
            (Some((source, age)), Some(archive_at)) => {
                let expire_at = end.saturating_add(age.micros);
                if expire_at < archive_at {
                    (Some(archive_at), format!("{source} expire_after={}, raised to the archive time", age.text))
                } else {
                    (Some(expire_at), format!("{source} expire_after={}", age.text))
                }
            }
        };
        RetentionPlan { archive_at, expire_at, reason: format!("archive: {archive_reason}; expire: {expire_reason}") }
    }
}

struct Component;

impl bindings::Guest for Component {
    fn init(config: String) -> Result<(), String> {
        let policy = parse_policy(&config)?;
        POLICY.with_borrow_mut(|current| *current = policy);
        Ok(())
    }
}

impl PolicyGuest for Component {
    fn plan(_now: TimestampMicros, buckets: Vec<BucketFacts>) -> Vec<Result<RetentionPlan, String>> {
        // Plans are absolute instants, so they do not depend on `now`; the host compares them
        // with its clock.
        POLICY.with_borrow(|policy| buckets.iter().map(|facts| Ok(policy.plan(facts))).collect())
    }
}

bindings::export!(Component with_types_in bindings);

#[cfg(test)]
mod tests {
    use super::*;
    use bindings::frostline::plugin::types::{BucketDescriptor, BucketState};

    fn at(year: i64, month: u32, day: u32) -> i64 {
        days_from_civil(year, month, day) * MICROS_PER_DAY
    }

    fn facts(tenant: Option<&str>, kind: Option<&str>, start: i64, end: i64) -> BucketFacts {
        BucketFacts {
            table: "events".into(),
            partition_key: vec![],
            tenant: tenant.map(String::from),
            kind: kind.map(String::from),
            bucket: BucketDescriptor { key: "k".into(), start, end },
            row_count: 1,
            byte_count: 1,
            state: BucketState::Hot,
            archived_at: None,
        }
    }

    fn plan(config: &str, f: &BucketFacts) -> RetentionPlan {
        parse_policy(config).unwrap().plan(f)
    }

    #[test]
    fn default_cutoff() {
        let p = plan("", &facts(None, None, at(2023, 1, 1), at(2024, 1, 1)));
        assert_eq!(p.archive_at, Some(at(2025, 1, 1)));
        assert_eq!(p.expire_at, None);
        assert_eq!(p.reason, "archive: default cutoff (1 January of the previous year); expire: never");
        let p = plan("", &facts(None, None, at(2024, 1, 1), at(2024, 1, 2)));
        assert_eq!(p.archive_at, Some(at(2026, 1, 1)));
        let p = plan("{}", &facts(None, None, at(2024, 1, 1), at(2024, 1, 1) + 1));
        assert_eq!(p.archive_at, Some(at(2026, 1, 1)));
        let p = plan("", &facts(None, None, -2, -1));
        assert_eq!(p.archive_at, Some(at(1971, 1, 1)));
    }

    #[test]
    fn precedence_and_reason() {
        let config = r#"{"archive_after":"1d","expire_after":"365d",
            "tenants":{"acme":{"archive_after":"30d"}},
            "kinds":{"audit":{"archive_after":"2d","expire_after":"10y"}}}"#;
        let end = at(2024, 1, 1);
        let p = plan(config, &facts(Some("acme"), Some("audit"), 0, end));
        assert_eq!(p.archive_at, Some(end + 30 * MICROS_PER_DAY));
        assert_eq!(p.expire_at, Some(end + 3650 * MICROS_PER_DAY));
        assert_eq!(
            p.reason,
            "archive: tenant \"acme\" override archive_after=30d; \
             expire: kind \"audit\" override expire_after=10y"
        );
        let p = plan(config, &facts(Some("other"), Some("audit"), 0, end));
        assert_eq!(p.archive_at, Some(end + 2 * MICROS_PER_DAY));
        let p = plan(config, &facts(Some("acme"), None, 0, end));
        assert_eq!(p.reason, "archive: tenant \"acme\" override archive_after=30d; expire: global expire_after=365d");
        let p = plan(config, &facts(None, None, 0, end));
        assert_eq!(p.archive_at, Some(end + MICROS_PER_DAY));
        assert_eq!(p.expire_at, Some(end + 365 * MICROS_PER_DAY));
    }

    #[test]
    fn expire_not_before_archive() {
        let config = r#"{"archive_after":"30d","expire_after":"1d"}"#;
        let p = plan(config, &facts(None, None, 0, 100));
        assert_eq!(p.expire_at, p.archive_at);
        let p = plan(r#"{"expire_after":"1d"}"#, &facts(None, None, 0, at(2024, 1, 1)));
        assert_eq!(p.expire_at, Some(at(2025, 1, 1)));
    }

    #[test]
    fn absolute_cutoff() {
        let config = r#"{"cutoff":"2025-01-01T01:00:00+01:00","expire_after":"1d"}"#;
        let cutoff = at(2025, 1, 1);
        let p = plan(config, &facts(None, None, 0, cutoff));
        assert_eq!(p.archive_at, Some(cutoff));
        assert_eq!(p.expire_at, Some(cutoff + MICROS_PER_DAY));
        let p = plan(config, &facts(None, None, 0, cutoff + 1));
        assert_eq!((p.archive_at, p.expire_at), (None, None));
        // A tenant age wins over the absolute cutoff.
        let config = r#"{"cutoff":"2025-01-01T00:00:00Z","tenants":{"t":{"archive_after":"1s"}}}"#;
        let p = plan(config, &facts(Some("t"), None, 0, cutoff + 1));
        assert_eq!(p.archive_at, Some(cutoff + 1 + MICROS_PER_SECOND));
    }

    #[test]
    fn extremes_saturate() {
        let config = r#"{"archive_after":"10y","expire_after":"10y"}"#;
        for (start, end) in [(i64::MIN, i64::MIN), (i64::MAX, i64::MAX), (i64::MIN, i64::MAX)] {
            for config in ["", config, r#"{"cutoff":"9999-12-31T23:59:59.999999Z"}"#] {
                let p = plan(config, &facts(None, None, start, end));
                if let (Some(a), Some(e)) = (p.archive_at, p.expire_at) {
                    assert!(a <= e);
                }
            }
        }
        let p = plan("", &facts(None, None, 0, i64::MAX));
        assert_eq!(p.archive_at, Some(i64::MAX));
    }

    #[test]
    fn config_errors() {
        let err = |c: &str| parse_policy(c).unwrap_err();
        assert_eq!(
            err(r#"{"tenants":{"acme":{"expire_after":"0s"}}}"#),
            "tenants.acme.expire_after: 0s is below the minimum 1s"
        );
        assert!(err(r#"{"archive_after":"3653d"}"#).starts_with("archive_after: 3653d is above"));
        assert!(err(r#"{"archive_after":"11y"}"#).starts_with("archive_after: 11y is above"));
        assert!(err(r#"{"archive_after":"99999999999999999999y"}"#).contains("above"));
        assert!(parse_policy(r#"{"archive_after":"3652d","expire_after":"10y"}"#).is_ok());
        assert!(err(r#"{"archive_after":"30 d"}"#).starts_with("archive_after: \"30 d\""));
        assert!(err(r#"{"archive_after":"d"}"#).contains("not a duration"));
        assert!(err(r#"{"archive_after":"-1d"}"#).contains("not a duration"));
        assert!(err(r#"{"retain":"1d"}"#).contains("retain"));
        assert!(err(r#"{"kinds":{"k":{"cutoff":"x"}}}"#).starts_with("kinds.k: unknown field `cutoff`"));
        assert!(err(r#"{"tenants":{"a b":{}}}"#).starts_with("tenants: key \"a b\""));
        assert!(err(r#"{"tenants":{"":{}}}"#).starts_with("tenants: key \"\""));
        let long = "x".repeat(129);
        assert!(err(&format!(r#"{{"kinds":{{"{long}":{{}}}}}}"#)).starts_with("kinds: key"));
        assert!(parse_policy(&format!(r#"{{"kinds":{{"{}":{{}}}}}}"#, "x".repeat(128))).is_ok());
        assert!(err(r#"{"cutoff":"2025-01-01","archive_after":"1d"}"#).contains("mutually exclusive"));
        for bad in [
            "2025-01-01",
            "2025-13-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2025-01-01T24:00:00Z",
            "2025-01-01T00:00:60Z",
            "2025-01-01T00:00:00",
            "2025-01-01T00:00:00.Z",
            "2025-01-01T00:00:00+0100",
            "2025-01-01T00:00:00Zjunk",
        ] {
            assert!(err(&format!(r#"{{"cutoff":"{bad}"}}"#)).starts_with("cutoff: "), "{bad}");
        }
    }

    #[test]
    fn rfc3339() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59.9999999Z"), Ok(-1));
        assert_eq!(parse_rfc3339("2024-02-29t12:00:00.5z"), Ok(at(2024, 2, 29) + 43_200_500_000));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00-00:30"), Ok(1_800_000_000));
        assert_eq!(parse_rfc3339("0000-01-01T00:00:00Z"), Ok(at(0, 1, 1)));
    }
}

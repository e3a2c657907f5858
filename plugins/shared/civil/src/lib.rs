//! Proleptic Gregorian calendar arithmetic shared by the guest plugins, on day numbers and
//! microseconds since 1970-01-01T00:00:00Z. Hand-written (Howard Hinnant's `days_from_civil`
//! and `civil_from_days`, <https://howardhinnant.github.io/date_algorithms.html>) so that guests
//! stay small: a date crate would add tens of kilobytes to every component.
//!
//! Every function is exact for all day numbers that an `i64` microsecond timestamp can name
//! (about ±292,000 years) and for the years of those days plus or minus one.

use std::fmt::Write as _;

pub const MICROS_PER_SECOND: i64 = 1_000_000;
pub const SECONDS_PER_MINUTE: i64 = 60;
pub const SECONDS_PER_HOUR: i64 = 60 * SECONDS_PER_MINUTE;
pub const SECONDS_PER_DAY: i64 = 24 * SECONDS_PER_HOUR;
pub const MICROS_PER_DAY: i64 = SECONDS_PER_DAY * MICROS_PER_SECOND;

/// Day 0 is 1970-01-01; the algorithms count from 0000-03-01, this many days earlier.
const DAYS_0000_03_01_TO_EPOCH: i64 = 719_468;
const DAYS_PER_400_YEARS: i64 = 146_097;

/// Days since 1970-01-01 of `year-month-day` (month 1..=12, day 1..=31, not checked).
pub const fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    // Counting years from March puts the leap day last, so the month lengths before it
    // follow the fixed 153-days-per-5-months pattern.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let m = month as i64;
    let month_from_march = if m > 2 { m - 3 } else { m + 9 };
    let day_of_year = (153 * month_from_march + 2) / 5 + day as i64 - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * DAYS_PER_400_YEARS + day_of_era - DAYS_0000_03_01_TO_EPOCH
}

/// `(year, month, day)` of a day number counted from 1970-01-01.
pub const fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + DAYS_0000_03_01_TO_EPOCH;
    let era = z.div_euclid(DAYS_PER_400_YEARS);
    let day_of_era = z - era * DAYS_PER_400_YEARS;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 } as u32;
    let year = year_of_era + era * 400;
    (if month <= 2 { year + 1 } else { year }, month, day)
}

pub const fn is_leap_year(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

pub const fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Microseconds of a day number's midnight, `None` when it does not fit in an `i64`.
pub const fn micros_from_days(days: i64) -> Option<i64> {
    days.checked_mul(MICROS_PER_DAY)
}

/// The day number containing `micros`; floor division, so -1 µs is in 1969-12-31.
pub const fn days_from_micros(micros: i64) -> i64 {
    micros.div_euclid(MICROS_PER_DAY)
}

/// `micros` as an RFC 3339 UTC time for messages, e.g. `2024-02-29T12:00:00.000001Z`. Years
/// outside 0000..=9999 are written with their sign or extra digits rather than refused.
pub fn format_utc(micros: i64) -> String {
    let days = days_from_micros(micros);
    let micros_of_day = micros.rem_euclid(MICROS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    let seconds_of_day = micros_of_day / MICROS_PER_SECOND;
    let fraction_micros = micros_of_day % MICROS_PER_SECOND;
    let mut out = String::with_capacity(32);
    if year < 0 {
        let _ = write!(out, "-{:04}", -year);
    } else {
        let _ = write!(out, "{year:04}");
    }
    let _ = write!(
        out,
        "-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        seconds_of_day / SECONDS_PER_HOUR,
        seconds_of_day % SECONDS_PER_HOUR / SECONDS_PER_MINUTE,
        seconds_of_day % SECONDS_PER_MINUTE
    );
    if fraction_micros != 0 {
        let _ = write!(out, ".{fraction_micros:06}");
    }
    out.push('Z');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_days() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1, 1, 1), -719_162);
        assert_eq!(days_from_civil(10_000, 1, 1), 2_932_897);
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }

    #[test]
    fn round_trip_over_wide_range() {
        let mut expected = (-1_i64, 1_u32, 1_u32);
        let mut days = days_from_civil(-1, 1, 1);
        while days < days_from_civil(10_001, 1, 1) {
            assert_eq!(civil_from_days(days), expected);
            assert_eq!(days_from_civil(expected.0, expected.1, expected.2), days);
            let (y, m, d) = expected;
            expected = if d < days_in_month(y, m) {
                (y, m, d + 1)
            } else if m < 12 {
                (y, m + 1, 1)
            } else {
                (y + 1, 1, 1)
            };
            days += 1;
        }
    }

    #[test]
    fn extremes_do_not_overflow() {
        for micros in [i64::MIN, i64::MAX, 0, -1] {
            let days = days_from_micros(micros);
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(format_utc(i64::MIN), "-290308-12-21T19:59:05.224192Z");
        assert_eq!(format_utc(i64::MAX), "294247-01-10T04:00:54.775807Z");
    }

    #[test]
    fn leap_years() {
        assert!(is_leap_year(2000));
        assert!(!is_leap_year(1900));
        assert!(is_leap_year(2024));
        assert!(is_leap_year(0));
        assert!(is_leap_year(-4));
        assert_eq!(days_in_month(2024, 2), 29);
        assert_eq!(days_in_month(1900, 2), 28);
    }

    #[test]
    fn formats() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(-1), "1969-12-31T23:59:59.999999Z");
        assert_eq!(format_utc(days_from_civil(1, 1, 1) * MICROS_PER_DAY - 1), "0000-12-31T23:59:59.999999Z");
    }
}

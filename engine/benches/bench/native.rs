//! The built-in calendar strategies' logic in native Rust: the baseline the WASM figures are
//! compared with. It uses the guests' own calendar arithmetic (`frostline-civil`, the crate
//! the built-in components are compiled from), so both sides do the same work.

use frostline::model::time::MICROS_PER_DAY;
use frostline::model::{BucketDescriptor, BucketStrategy, Micros, StrategyIdentity};
use frostline_civil::{civil_from_days, days_from_civil};

/// 0001-01-01T00:00:00Z and 10000-01-01T00:00:00Z: the guest's supported range.
pub const SUPPORTED_START_MICROS: Micros = days_from_civil(1, 1, 1) * MICROS_PER_DAY;
pub const SUPPORTED_END_MICROS: Micros = days_from_civil(10_000, 1, 1) * MICROS_PER_DAY;

#[derive(Debug, Clone, Copy)]
pub enum CalendarUnit {
    Year,
    Day,
}

/// The bucket of `t`, as the built-in calendar-year-utc or calendar-day-utc answers.
pub fn calendar_bucket(unit: CalendarUnit, t: Micros) -> Result<BucketDescriptor, String> {
    if !(SUPPORTED_START_MICROS..SUPPORTED_END_MICROS).contains(&t) {
        return Err(format!("event time {t} is outside years 0001 through 9999"));
    }
    let days = t.div_euclid(MICROS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    let (key, start_days, end_days) = match unit {
        CalendarUnit::Year => (format!("year:{year:04}"), days_from_civil(year, 1, 1), days_from_civil(year + 1, 1, 1)),
        CalendarUnit::Day => (format!("day:{year:04}-{month:02}-{day:02}"), days, days + 1),
    };
    Ok(BucketDescriptor { key, start: start_days * MICROS_PER_DAY, end: end_days * MICROS_PER_DAY })
}

pub fn calendar_year_batch(times: &[Micros]) -> Result<Vec<BucketDescriptor>, String> {
    times.iter().map(|&t| calendar_bucket(CalendarUnit::Year, t)).collect()
}

/// A native strategy that stands in for a WASM one in a table's policy: same answers, same
/// identity (so the store sees the same strategy), no plugin and no descriptor cache.
pub struct NativeCalendar {
    pub unit: CalendarUnit,
    pub identity: StrategyIdentity,
}

impl BucketStrategy for NativeCalendar {
    fn identity(&self) -> &StrategyIdentity {
        &self.identity
    }

    fn buckets_for(&self, times: &[Micros]) -> frostline::error::Result<Vec<BucketDescriptor>> {
        times.iter().map(|&t| calendar_bucket(self.unit, t).map_err(frostline::error::Error::InvalidInput)).collect()
    }
}

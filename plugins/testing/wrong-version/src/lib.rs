//! Test-only bucket strategy `wrong-version`: a plain UTC year strategy built against contract
//! version 9.0.0, which no host supports, so the host's tests can check that such a component
//! is refused with a message naming both versions. The inline WIT copies the parts of
//! wit/plugin.wit that the bucket-strategy world needs; only the package version differs.

mod bindings {
    wit_bindgen::generate!({
        inline: r#"
            package frostline:plugin@9.0.0;

            interface types {
                type timestamp-micros = s64;

                record bucket-descriptor {
                    key: string,
                    start: timestamp-micros,
                    end: timestamp-micros,
                }
            }

            interface log {
                enum level {
                    trace,
                    debug,
                    info,
                    warn,
                    error,
                }

                log: func(level: level, message: string);
            }

            interface strategy {
                use types.{timestamp-micros, bucket-descriptor};

                bucket-for: func(event-time: timestamp-micros) -> result<bucket-descriptor, string>;
                buckets-for: func(event-times: list<timestamp-micros>) -> result<list<bucket-descriptor>, string>;
            }

            world bucket-strategy {
                import log;
                export init: func(config: string) -> result<_, string>;
                export strategy;
            }
        "#,
        world: "bucket-strategy",
    });
}

use bindings::exports::frostline::plugin::strategy::Guest as StrategyGuest;
use bindings::frostline::plugin::types::{BucketDescriptor, TimestampMicros};
use frostline_civil::{civil_from_days, days_from_civil, days_from_micros, micros_from_days};

fn year_bucket(t: i64) -> Result<BucketDescriptor, String> {
    let (year, _, _) = civil_from_days(days_from_micros(t));
    let start = micros_from_days(days_from_civil(year, 1, 1));
    let end = micros_from_days(days_from_civil(year + 1, 1, 1));
    match (start, end) {
        (Some(start), Some(end)) => Ok(BucketDescriptor { key: format!("year:{year:04}"), start, end }),
        _ => Err(format!("the year of {t} does not fit in i64 microseconds")),
    }
}

struct Component;

impl bindings::Guest for Component {
    fn init(_config: String) -> Result<(), String> {
        Ok(())
    }
}

impl StrategyGuest for Component {
    fn bucket_for(event_time: TimestampMicros) -> Result<BucketDescriptor, String> {
        year_bucket(event_time)
    }

    fn buckets_for(event_times: Vec<TimestampMicros>) -> Result<Vec<BucketDescriptor>, String> {
        event_times.into_iter().map(year_bucket).collect()
    }
}

bindings::export!(Component with_types_in bindings);

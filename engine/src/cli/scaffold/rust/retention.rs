//! {{name}}: a frostline retention policy. It archives a bucket `archive_after_days` days
//! after the bucket ends and never expires it. Replace `plan` with your own rule; keep it a
//! pure function of `now`, the bucket's facts and the config.
//!
//! Config: empty, `{}` or `{"archive_after_days": N}` with N from 0 to 36,500 (default 7).

mod bindings {
    wit_bindgen::generate!({ path: "wit", world: "retention-policy" });
}

use std::cell::Cell;

use bindings::exports::frostline::plugin::policy::Guest as PolicyGuest;
use bindings::frostline::plugin::log::{Level, log};
use bindings::frostline::plugin::types::{BucketFacts, RetentionPlan};
use serde::Deserialize;

const MICROS_PER_DAY: i64 = 86_400_000_000;
const ARCHIVE_AFTER_DAYS_MAX: i64 = 36_500;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_archive_after_days")]
    archive_after_days: i64,
}

fn default_archive_after_days() -> i64 {
    7
}

thread_local! {
    static ARCHIVE_AFTER_DAYS: Cell<i64> = const { Cell::new(7) };
}

struct Component;

impl bindings::Guest for Component {
    fn init(config: String) -> Result<(), String> {
        let config = if config.trim().is_empty() {
            Config { archive_after_days: default_archive_after_days() }
        } else {
            serde_json::from_str::<Config>(&config).map_err(|e| format!("{{name}} config: {e}"))?
        };
        if !(0..=ARCHIVE_AFTER_DAYS_MAX).contains(&config.archive_after_days) {
            return Err(format!(
                "{{name}} config: archive_after_days must be 0 to {ARCHIVE_AFTER_DAYS_MAX}, not {}",
                config.archive_after_days
            ));
        }
        ARCHIVE_AFTER_DAYS.set(config.archive_after_days);
        log(Level::Info, "{{name}} initialised");
        Ok(())
    }
}

impl PolicyGuest for Component {
    fn plan(_now: i64, buckets: Vec<BucketFacts>) -> Vec<Result<RetentionPlan, String>> {
        let days = ARCHIVE_AFTER_DAYS.get();
        buckets
            .iter()
            .map(|facts| {
                Ok(RetentionPlan {
                    archive_at: Some(facts.bucket.end.saturating_add(days * MICROS_PER_DAY)),
                    expire_at: None,
                    reason: format!("archive {days} days after the bucket ends; never expire"),
                })
            })
            .collect()
    }
}

bindings::export!(Component with_types_in bindings);

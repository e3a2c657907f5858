//! {{name}}: a frostline bucket strategy. It puts each event time into its UTC day, keyed
//! `day:<days since 1970-01-01>`. Replace `bucket_for` with your own rule; keep it a pure
//! function of the time and the config (the engine checks that it answers alike every time).
//!
//! Config: empty or `{}`.

mod bindings {
    wit_bindgen::generate!({ path: "wit", world: "bucket-strategy" });
}

use bindings::exports::frostline::plugin::strategy::Guest as StrategyGuest;
use bindings::frostline::plugin::log::{Level, log};
use bindings::frostline::plugin::types::BucketDescriptor;
use serde::Deserialize;

const MICROS_PER_DAY: i64 = 86_400_000_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {}

fn bucket_for(t: i64) -> Result<BucketDescriptor, String> {
    let day = t.div_euclid(MICROS_PER_DAY);
    let unrepresentable = || format!("{{name}}: the day of {t} does not fit in i64 microseconds");
    let start = day.checked_mul(MICROS_PER_DAY).ok_or_else(unrepresentable)?;
    let end = start.checked_add(MICROS_PER_DAY).ok_or_else(unrepresentable)?;
    Ok(BucketDescriptor { key: format!("day:{day}"), start, end })
}

struct Component;

impl bindings::Guest for Component {
    fn init(config: String) -> Result<(), String> {
        if !config.trim().is_empty() {
            serde_json::from_str::<Config>(&config).map_err(|e| format!("{{name}} config: {e}"))?;
        }
        log(Level::Info, "{{name}} initialised");
        Ok(())
    }
}

impl StrategyGuest for Component {
    fn bucket_for(event_time: i64) -> Result<BucketDescriptor, String> {
        bucket_for(event_time)
    }

    fn buckets_for(event_times: Vec<i64>) -> Result<Vec<BucketDescriptor>, String> {
        event_times.into_iter().map(bucket_for).collect()
    }
}

bindings::export!(Component with_types_in bindings);

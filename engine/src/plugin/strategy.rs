//! Bucket strategies run as WASM components, behind the core `BucketStrategy` trait.
//!
//! The host caches every descriptor a strategy returns and answers from the cache whenever a
//! time falls inside a known bucket, so the plugin is asked only about times outside the
//! buckets already known, in one batch call. Every answer is checked before it is cached.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::bindings::strategy_world::{BucketStrategy as StrategyBindings, BucketStrategyPre};
use super::instance::{PluginInstance, WorldBindings};
use super::{LoadedPlugin, PluginState};
use crate::error::{Error, Result};
use crate::model::{self, BucketDescriptor, Micros, StrategyIdentity};

/// Descriptors kept per strategy before the cache is cleared (a bound on host memory).
pub const STRATEGY_CACHE_ENTRIES_MAX: usize = 100_000;
/// Times sent to the plugin in one call.
pub const STRATEGY_BATCH_TIMES_MAX: usize = 4_096;

impl WorldBindings for StrategyBindings {
    fn instantiate(pre: &InstancePre<PluginState>, store: &mut Store<PluginState>) -> wasmtime::Result<Self> {
        BucketStrategyPre::new(pre.clone())?.instantiate(store)
    }

    fn call_init(&self, store: &mut Store<PluginState>, config: &str) -> wasmtime::Result<Result<(), String>> {
        StrategyBindings::call_init(self, store, config)
    }
}

/// A WASM bucket strategy with the host's descriptor cache in front of it.
pub struct WasmStrategy {
    instance: PluginInstance<StrategyBindings>,
    identity: StrategyIdentity,
    /// Known buckets by start time.
    cache: RwLock<BTreeMap<Micros, BucketDescriptor>>,
}

impl WasmStrategy {
    pub fn new(plugin: Arc<LoadedPlugin>, config: String) -> Result<Self> {
        let identity =
            StrategyIdentity { name: plugin.name.clone(), plugin_hash: plugin.hash.clone(), config: config.clone() };
        Ok(WasmStrategy {
            instance: PluginInstance::new(plugin, config)?,
            identity,
            cache: RwLock::new(BTreeMap::new()),
        })
    }

    pub fn plugin(&self) -> &Arc<LoadedPlugin> {
        &self.instance.plugin
    }

    pub fn counters(&self) -> &super::instance::PluginCounters {
        &self.instance.counters
    }

    /// Asks the plugin directly, bypassing the cache (conformance checks use this).
    pub fn ask_uncached(&self, times: &[Micros]) -> Result<Vec<std::result::Result<BucketDescriptor, String>>> {
        let answers = self
            .instance
            .call("buckets-for", |b, store| b.frostline_plugin_strategy().call_buckets_for(store, times))?;
        match answers {
            Ok(list) => {
                if list.len() != times.len() {
                    return Err(self.instance.invalid_answer(
                        "buckets-for",
                        format!("asked about {} times, answered {}", times.len(), list.len()),
                    ));
                }
                Ok(list.into_iter().map(|d| Ok(BucketDescriptor { key: d.key, start: d.start, end: d.end })).collect())
            }
            Err(message) => Ok(times.iter().map(|_| Err(message.clone())).collect()),
        }
    }

    /// Asks the plugin about one time through `bucket-for` (not the batch call).
    pub fn ask_one_uncached(&self, time: Micros) -> Result<std::result::Result<BucketDescriptor, String>> {
        let answer =
            self.instance.call("bucket-for", |b, store| b.frostline_plugin_strategy().call_bucket_for(store, time))?;
        Ok(answer.map(|d| BucketDescriptor { key: d.key, start: d.start, end: d.end }))
    }

    fn lookup(cache: &BTreeMap<Micros, BucketDescriptor>, t: Micros) -> Option<&BucketDescriptor> {
        cache.range(..=t).next_back().map(|(_, d)| d).filter(|d| d.contains(t))
    }

    fn check_answer(&self, t: Micros, d: &BucketDescriptor) -> std::result::Result<(), String> {
        check_descriptor(t, d)?;
        let cache = self.cache.read().expect("strategy cache");
        // A new bucket must not overlap a known one: neighbours neither overlap nor differ.
        if let Some((_, before)) = cache.range(..d.end).next_back()
            && before.end > d.start
            && before != d
        {
            return Err(format!(
                "bucket {} [{}, {}) overlaps the earlier answer {} [{}, {})",
                d.key, d.start, d.end, before.key, before.start, before.end
            ));
        }
        Ok(())
    }
}

/// The checks every descriptor must pass: it contains its time, is non-empty and has a
/// canonical key (1 to 128 bytes of visible ASCII).
pub fn check_descriptor(t: Micros, d: &BucketDescriptor) -> std::result::Result<(), String> {
    if d.start >= d.end {
        return Err(format!("bucket `{}` has start {} not before end {}", d.key, d.start, d.end));
    }
    if !d.contains(t) {
        return Err(format!("bucket `{}` [{}, {}) does not contain the time asked for, {t}", d.key, d.start, d.end));
    }
    if !model::is_visible_ascii(&d.key, model::BUCKET_KEY_BYTES_MAX) {
        return Err(format!(
            "bucket key `{}` is not canonical: it must be 1 to {} bytes of visible ASCII",
            d.key.escape_debug(),
            model::BUCKET_KEY_BYTES_MAX
        ));
    }
    Ok(())
}

impl model::BucketStrategy for WasmStrategy {
    fn identity(&self) -> &StrategyIdentity {
        &self.identity
    }

    fn call_counts(&self) -> Option<model::CallCounts> {
        Some(self.counters().snapshot())
    }

    fn buckets_for(&self, times: &[Micros]) -> Result<Vec<BucketDescriptor>> {
        let mut out: Vec<Option<BucketDescriptor>> = Vec::with_capacity(times.len());
        let mut misses: Vec<Micros> = Vec::new();
        {
            let cache = self.cache.read().expect("strategy cache");
            for &t in times {
                let hit = Self::lookup(&cache, t).cloned();
                if hit.is_none() && misses.last() != Some(&t) {
                    misses.push(t);
                }
                out.push(hit);
            }
        }
        if !misses.is_empty() {
            misses.sort_unstable();
            misses.dedup();
            // Answer the misses one batch at a time; after each batch, later misses may
            // already be covered by a bucket the batch returned.
            let mut fresh: BTreeMap<Micros, BucketDescriptor> = BTreeMap::new();
            let mut pending: &[Micros] = &misses;
            while !pending.is_empty() {
                let unknown: Vec<Micros> = {
                    let cache = self.cache.read().expect("strategy cache");
                    pending
                        .iter()
                        .take(STRATEGY_BATCH_TIMES_MAX)
                        .copied()
                        .filter(|t| Self::lookup(&cache, *t).is_none() && Self::lookup(&fresh, *t).is_none())
                        .collect()
                };
                pending = &pending[pending.len().min(STRATEGY_BATCH_TIMES_MAX)..];
                if unknown.is_empty() {
                    continue;
                }
                let answers = self.ask_uncached(&unknown)?;
                for (t, answer) in unknown.iter().zip(answers) {
                    let d = answer.map_err(|message| {
                        Error::InvalidInput(format!(
                            "strategy `{}` has no bucket for time {t} ({}): {message}",
                            self.identity.name,
                            model::time::format_rfc3339(*t)
                        ))
                    })?;
                    self.check_answer(*t, &d).map_err(|reason| self.instance.invalid_answer("buckets-for", reason))?;
                    let mut cache = self.cache.write().expect("strategy cache");
                    if cache.len() >= STRATEGY_CACHE_ENTRIES_MAX {
                        cache.clear();
                    }
                    cache.insert(d.start, d.clone());
                    fresh.insert(d.start, d);
                }
            }
            let cache = self.cache.read().expect("strategy cache");
            for (slot, &t) in out.iter_mut().zip(times) {
                if slot.is_none() {
                    // `fresh` holds this call's answers even if the shared cache was cleared.
                    let found = Self::lookup(&fresh, t).or_else(|| Self::lookup(&cache, t));
                    *slot = Some(
                        found
                            .cloned()
                            .ok_or_else(|| Error::Internal(format!("strategy answered no bucket for {t}")))?,
                    );
                }
            }
        }
        Ok(out.into_iter().map(|d| d.expect("filled above")).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(key: &str) -> BucketDescriptor {
        BucketDescriptor { key: key.to_string(), start: 0, end: 10 }
    }

    /// The test vectors of plugins/CONTRACT.md, section 2: every key a strategy may answer is
    /// accepted, with the object path segment it becomes; every other is refused.
    #[test]
    fn the_key_grammar_vectors_of_the_plugin_contract() {
        let long_slashes = format!("{}ab", "/".repeat(42));
        let hashed_slashes = format!("{}abc", "/".repeat(42));
        let valid: &[(&str, &str)] = &[
            ("year:2024", "year:2024"),
            ("month:2024-02", "month:2024-02"),
            ("day:2024-02-29", "day:2024-02-29"),
            ("week:2020-W53", "week:2020-W53"),
            ("fquarter:2025-Q1", "fquarter:2025-Q1"),
            ("A_b-c.d:e", "A_b-c.d:e"),
            ("..", ".."),
            ("a/b", "a%2Fb"),
            ("50%", "50%25"),
            ("~x", "%7Ex"),
            ("key=v,w", "key%3Dv%2Cw"),
            ("!", "%21"),
            ("\"q\"", "%22q%22"),
            ("tenant@acme", "tenant%40acme"),
            (&long_slashes, &format!("{}ab", "%2F".repeat(42))),
            (&hashed_slashes, "~1fbf24aa2978b8c8a1b11f4bb4045e9cb1addcc16da9befcde0e2ce47c493062"),
        ];
        for (key, segment) in valid {
            assert_eq!(check_descriptor(5, &bucket(key)), Ok(()), "{key}");
            let prefix = crate::storage::keys::bucket_prefix("t", key, b"p");
            assert_eq!(prefix, format!("table=t/bucket={segment}/partition=p/"), "{key}");
        }
        let a128 = "a".repeat(128);
        assert_eq!(check_descriptor(5, &bucket(&a128)), Ok(()));
        assert_eq!(
            crate::storage::keys::bucket_prefix("t", &a128, b"p"),
            format!("table=t/bucket={a128}/partition=p/")
        );
        let tildes = "~".repeat(128);
        assert_eq!(
            crate::storage::keys::bucket_prefix("t", &tildes, b"p"),
            "table=t/bucket=~ccd84e9b9272a277a771aedb433ce98d4a7014356b7e1adb6ce182aa0580e875/partition=p/"
        );

        let invalid = [
            String::new(),
            "year 2024".into(),
            "day:2024-02-29\n".into(),
            "a\tb".into(),
            "\0".into(),
            "\u{7f}".into(),
            "é".into(),
            "2024\u{2013}Q1".into(),
            "a\u{a0}".into(),
            "a".repeat(129),
            "é".repeat(64),
        ];
        for key in &invalid {
            let refused = check_descriptor(5, &bucket(key)).expect_err(key);
            assert!(refused.contains("is not canonical: it must be 1 to 128 bytes of visible ASCII"), "{refused}");
        }
    }

    #[test]
    fn a_descriptor_must_be_non_empty_and_contain_its_time() {
        assert!(check_descriptor(5, &BucketDescriptor { key: "k".into(), start: 5, end: 5 }).is_err());
        assert!(check_descriptor(10, &bucket("k")).unwrap_err().contains("does not contain the time asked for"));
        assert!(check_descriptor(0, &bucket("k")).is_ok());
    }
}

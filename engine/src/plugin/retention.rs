//! Retention policies run as WASM components, behind the core `RetentionPolicy` trait.
//! Plans are asked for in batches and every plan is checked before the scheduler sees it.

use std::sync::Arc;

use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::bindings::retention_world::{RetentionPolicy as PolicyBindings, RetentionPolicyPre};
use super::bindings::wit_types;
use super::instance::{PluginInstance, WorldBindings};
use super::{LoadedPlugin, PluginState};
use crate::error::Result;
use crate::model::{self, BucketFacts, BucketState, Micros, RetentionPlan};

/// Buckets sent to the policy in one call.
pub const RETENTION_BATCH_BUCKETS_MAX: usize = 1_000;
/// A plan's reason is recorded in manifests and tombstones; it is bounded.
pub const PLAN_REASON_BYTES_MAX: usize = 1_024;

impl WorldBindings for PolicyBindings {
    fn instantiate(pre: &InstancePre<PluginState>, store: &mut Store<PluginState>) -> wasmtime::Result<Self> {
        RetentionPolicyPre::new(pre.clone())?.instantiate(store)
    }

    fn call_init(&self, store: &mut Store<PluginState>, config: &str) -> wasmtime::Result<Result<(), String>> {
        PolicyBindings::call_init(self, store, config)
    }
}

pub struct WasmRetention {
    instance: PluginInstance<PolicyBindings>,
}

impl WasmRetention {
    pub fn new(plugin: Arc<LoadedPlugin>, config: String) -> Result<Self> {
        Ok(WasmRetention { instance: PluginInstance::new(plugin, config)? })
    }

    pub fn plugin(&self) -> &Arc<LoadedPlugin> {
        &self.instance.plugin
    }

    pub fn counters(&self) -> &super::instance::PluginCounters {
        &self.instance.counters
    }
}

/// The checks every plan must pass.
pub fn check_plan(plan: &RetentionPlan) -> std::result::Result<(), String> {
    if let Some(expire_at) = plan.expire_at {
        match plan.archive_at {
            None => return Err(format!("plans an expiry at {expire_at} for a bucket it never archives")),
            Some(archive_at) if expire_at < archive_at => {
                return Err(format!("plans the expiry ({expire_at}) before the archival ({archive_at})"));
            }
            Some(_) => {}
        }
    }
    if plan.reason.trim().is_empty() {
        return Err("gives no reason".into());
    }
    if plan.reason.len() > PLAN_REASON_BYTES_MAX {
        return Err(format!("gives a reason of {} bytes; the limit is {PLAN_REASON_BYTES_MAX}", plan.reason.len()));
    }
    Ok(())
}

fn to_wit(facts: &BucketFacts) -> wit_types::BucketFacts {
    wit_types::BucketFacts {
        table: facts.table.clone(),
        partition_key: facts.partition_key.clone(),
        tenant: facts.tenant.clone(),
        kind: facts.kind.clone(),
        bucket: wit_types::BucketDescriptor {
            key: facts.bucket.key.clone(),
            start: facts.bucket.start,
            end: facts.bucket.end,
        },
        row_count: facts.row_count,
        byte_count: facts.byte_count,
        state: match facts.state {
            BucketState::Hot => wit_types::BucketState::Hot,
            BucketState::Archiving => wit_types::BucketState::Archiving,
            BucketState::Archived { .. } | BucketState::ArchivedPending => wit_types::BucketState::Archived,
            BucketState::Expired => wit_types::BucketState::Expired,
        },
        archived_at: facts.archived_at,
    }
}

impl model::RetentionPolicy for WasmRetention {
    fn name(&self) -> &str {
        &self.instance.plugin.name
    }

    fn call_counts(&self) -> Option<model::CallCounts> {
        Some(self.counters().snapshot())
    }

    fn plan(&self, now: Micros, buckets: &[BucketFacts]) -> Result<Vec<std::result::Result<RetentionPlan, String>>> {
        let mut out = Vec::with_capacity(buckets.len());
        for chunk in buckets.chunks(RETENTION_BATCH_BUCKETS_MAX) {
            let wit_facts: Vec<wit_types::BucketFacts> = chunk.iter().map(to_wit).collect();
            let answers =
                self.instance.call("plan", |b, store| b.frostline_plugin_policy().call_plan(store, now, &wit_facts))?;
            if answers.len() != chunk.len() {
                return Err(self.instance.invalid_answer(
                    "plan",
                    format!("asked about {} buckets, answered {}", chunk.len(), answers.len()),
                ));
            }
            for answer in answers {
                let plan = answer.map(|p| RetentionPlan {
                    archive_at: p.archive_at,
                    expire_at: p.expire_at,
                    reason: p.reason,
                });
                if let Ok(plan) = &plan {
                    check_plan(plan).map_err(|reason| self.instance.invalid_answer("plan", reason))?;
                }
                out.push(plan);
            }
        }
        Ok(out)
    }
}

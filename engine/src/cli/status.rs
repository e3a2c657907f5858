//! `frostline status`: prints the status read model (`ops::status`).

use crate::ops::status::Status;

pub fn print(status: &Status) {
    println!("now {}", status.now);
    println!("data {} (installation {})", status.data_dir, status.installation_id);
    if !status.unmanaged_tables.is_empty() {
        println!(
            "tables not in the policy directory (their buckets wait for them): {}",
            status.unmanaged_tables.join(", ")
        );
    }
    if let Some(stop) = &status.sweep_stopped {
        println!(
            "ORPHAN SWEEP STOPPED at {}: {} holds `{}` ({}): another copy of this data directory writes there; \
             nothing is deleted until `frostline adopt` (engine stopped) resolves it",
            stop.at, stop.target, stop.key, stop.reason
        );
    }
    let p = &status.policy;
    println!(
        "policy generation {} from {} ({} files, {} plugins)",
        p.generation,
        p.dir,
        p.files.len(),
        p.plugins.len()
    );
    for (file, sha) in &p.files {
        println!("  file {file} sha256 {}", &sha[..16.min(sha.len())]);
    }
    for plugin in &p.plugins {
        let plugin = &plugin.record;
        println!(
            "  plugin {} {} {} sha256 {}",
            plugin.table,
            plugin.role,
            plugin.plugin,
            &plugin.sha256[..12.min(plugin.sha256.len())]
        );
    }
    if !p.retired_tables.is_empty() {
        println!("  retired tables (no appends, still archived): {}", p.retired_tables.join(", "));
    }
    if let Some(r) = &p.last_reload {
        if r.accepted {
            println!("  last reload: accepted ({})", r.trigger);
        } else {
            println!("  last reload: REFUSED ({}): {}", r.trigger, r.error.as_deref().unwrap_or_default());
        }
        if !r.released_holds.is_empty() {
            let ids: Vec<&str> = r.released_holds.iter().map(|h| h.id.as_str()).collect();
            println!("  it released policy holds (their [[hold]] left the directory): {}", ids.join(", "));
        }
    }
    for t in &status.targets {
        let endpoint = t.endpoint.as_deref().map(|e| format!(" at {e}")).unwrap_or_default();
        match t.probe.as_str() {
            "ok" => println!("target {} {}{endpoint}  probe ok ({} ms)", t.name, t.url, t.last_probe_ms),
            other => println!(
                "target {} {}{endpoint}  probe {} at check {} (attempt {}, {}s ago): {}; uploads to it wait until a probe passes",
                t.name,
                t.url,
                other.to_uppercase(),
                t.check.as_deref().unwrap_or("?"),
                t.attempts,
                t.seconds_since_probe,
                t.reason.as_deref().unwrap_or_default()
            ),
        }
        if t.keeps_deleted_versions {
            println!(
                "  it keeps deleted objects as noncurrent versions (bucket versioning): what expiry and erasure \
                 delete there stays readable by version until a lifecycle rule removes it"
            );
        }
    }
    for t in &status.tables {
        let retired = if p.retired_tables.contains(&t.id) { "  (retired)" } else { "" };
        println!("table {}  strategy={}  retention={}  target={}{retired}", t.id, t.strategy, t.retention, t.target);
        if t.states.is_empty() {
            println!("  (no buckets)");
        }
        for (state, c) in &t.states {
            println!(
                "  {state:<26} {:>6} buckets {:>10} rows   oldest {}s in state",
                c.buckets, c.rows, c.oldest_age_seconds
            );
        }
        if let Some(d) = &t.delta_log {
            let commit = d.last_commit_at.as_deref().unwrap_or("never");
            match &d.error {
                None => println!("  delta log version {}  last commit {commit}  synced {}", d.version, d.synced_at),
                Some(e) => println!(
                    "  delta log version {}  last commit {commit}  SYNC FAILED at {}: {e}",
                    d.version, d.synced_at
                ),
            }
        }
    }
    println!(
        "due now: {}  (oldest waiting {}s)   awaiting a plan: {}{}   outbox backlog: {}",
        status.due_now,
        status.oldest_due_age_seconds,
        status.unplanned_buckets,
        match status.plan_settle_estimate_seconds {
            Some(0) => String::new(),
            Some(seconds) => format!(" (planned in about {seconds}s)"),
            None => " (none planned yet)".to_string(),
        },
        status.outbox_backlog
    );
    for d in &status.deferrals {
        println!("deferred {}  attempts={}  retry at {:?}: {}", d.bucket, d.attempts, d.next_retry_at, d.error);
    }
    for l in &status.leases {
        println!("lease {}  owner={} generation={} expires {}", l.bucket, l.owner, l.generation, l.expires_at);
    }
    if let Some(p) = &status.store_poisoned {
        println!("STORE REFUSES WRITES: {p}");
    }
}

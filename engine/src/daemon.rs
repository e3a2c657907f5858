//! `frostline run`: the running engine. Wires the archival pass loop, the HTTP API and the
//! policy watcher; publishes its process id, API address and status in the data directory;
//! stops gracefully on SIGTERM or Ctrl-C within `SHUTDOWN_SECONDS_MAX`.
//!
//! At start the soft open-file limit is raised to the hard limit (`raise_open_file_limit`):
//! the API's connection cap is derived from it.
//!
//! Shutdown: the API stops accepting and finishes the requests in flight, the pass in flight
//! runs to its end (passes are never cancelled midway), the watcher stops. Whatever is still
//! running after `SHUTDOWN_SECONDS_MAX` is abandoned and the process exits; a bucket left
//! `Archiving` is taken over after its lease expires, as after a crash.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// `frostline run`'s API flags.
pub use crate::api::ServeArgs;
use crate::api::{self, ApiState, Metrics, Passes, ServeSettings};
use crate::engine::Engine;
use crate::error::{Error, Result};

/// After a stop signal, the process exits within this many seconds, whatever is in flight.
pub const SHUTDOWN_SECONDS_MAX: u64 = 30;

/// The pid and address files of a running engine; removed when it stops.
struct RunFiles {
    paths: Vec<PathBuf>,
}

impl RunFiles {
    fn write(data_dir: &Path, bound: SocketAddr, tls: Option<&api::tls::ApiTls>) -> Result<RunFiles> {
        let pid_path = data_dir.join(crate::engine::PID_FILE);
        std::fs::write(&pid_path, std::process::id().to_string()).map_err(|e| Error::io(&pid_path, e))?;
        let tls_path = data_dir.join(crate::ops::wire::TLS_FILE);
        let files = RunFiles { paths: vec![pid_path, data_dir.join(api::ADDR_FILE), tls_path.clone()] };
        match tls {
            // Written before the address, so a CLI that finds the address knows the scheme.
            Some(tls) => {
                let served = std::path::absolute(tls.cert_path()).map_err(|e| Error::io(tls.cert_path(), e))?;
                std::fs::write(&tls_path, served.display().to_string()).map_err(|e| Error::io(&tls_path, e))?;
            }
            None => {
                let _ = std::fs::remove_file(&tls_path);
            }
        }
        api::write_addr_file(data_dir, bound)?;
        Ok(files)
    }
}

impl Drop for RunFiles {
    fn drop(&mut self) {
        for path in &self.paths {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Runs the engine until SIGTERM or Ctrl-C.
/// Passes run on `archive` (`ops::passes::background_runtime`).
pub async fn run(engine: Arc<Engine>, serve: ServeSettings, archive: tokio::runtime::Handle) -> Result<()> {
    // Take over SIGTERM before anything else, so a stop during start-up is graceful too.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Error::Internal(format!("cannot listen for SIGTERM: {e}")))?;
    raise_open_file_limit();
    let metrics = Arc::new(Metrics::new()?);
    let observed = metrics.clone();
    let passes = Arc::new(Passes::new(
        engine.new_owner_token(),
        Arc::new(move |result| observed.record_pass(result)),
        Some(archive),
    ));
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let state = Arc::new(ApiState {
        engine: engine.clone(),
        auth: serve.auth.clone(),
        metrics,
        passes: passes.clone(),
        stopping: stopping.clone(),
    });
    let api = api::start(state, &serve).await?;
    let files = RunFiles::write(engine.data_dir(), api.local_addr, serve.tls.as_deref())?;
    if let Some(tls) = serve.tls.clone() {
        tokio::spawn(reload_certificate_on_sighup(tls, stopping.clone()));
    }
    tokio::spawn(api::auth::reload_tokens(serve.auth.clone(), stopping.clone()));
    let policy_watcher = crate::ops::reload::start_watcher(&engine.policies().dir)?;
    let watcher = tokio::spawn(crate::ops::reload::watch(engine.clone(), policy_watcher, stopping.clone()));
    crate::ops::status::write_status_file(&engine)?;
    tracing::info!(
        owner = passes.owner(),
        data = %engine.data_dir().display(),
        tables = engine.policies().tables.len(),
        listen = %api.local_addr,
        "frostline running"
    );
    let pass_loop = tokio::spawn(pass_loop(engine.clone(), passes, stopping.clone()));

    let mut server = api.task;
    let server_ended = tokio::select! {
        _ = tokio::signal::ctrl_c() => { tracing::info!("Ctrl-C: stopping"); None }
        _ = terminate.recv() => { tracing::info!("SIGTERM: stopping"); None }
        ended = &mut server => Some(ended),
    };
    let _ = stop.send(true);
    let drained = tokio::time::timeout(Duration::from_secs(SHUTDOWN_SECONDS_MAX), async {
        if server_ended.is_none() {
            log_end("the HTTP server", server.await);
        }
        log_end("the pass loop", pass_loop.await.map(Ok::<(), Error>));
        log_end("the policy watcher", watcher.await);
    })
    .await;
    if drained.is_err() {
        tracing::error!(
            "still busy {SHUTDOWN_SECONDS_MAX} s after the stop signal (SHUTDOWN_SECONDS_MAX); exiting with work in \
             flight: a bucket left Archiving is taken over when its lease expires"
        );
    }
    drop(files);
    tracing::info!("frostline stopped");
    match server_ended {
        Some(Ok(Ok(()))) | None => Ok(()),
        Some(Ok(Err(e))) => Err(Error::Internal(format!("the HTTP server failed: {e}"))),
        Some(Err(e)) => Err(Error::Internal(format!("the HTTP server panicked: {e}"))),
    }
}

/// Raises the process's soft open-file limit (RLIMIT_NOFILE) to its hard limit. Every API
/// connection takes a file descriptor beside those of the store, the object stores and the
/// plugins, and a service often starts with a soft limit of 1,024 (systemd's default;
/// packaging/frostline.service sets `LimitNOFILE`); `api::start` derives its connection cap
/// from the limit in force. Logs the old and the new value; a limit that cannot be raised is
/// logged at warn and the start goes on.
pub fn raise_open_file_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        let error = std::io::Error::last_os_error();
        tracing::warn!(%error, "cannot read the open-file limit (RLIMIT_NOFILE) to raise it");
        return;
    }
    let (soft_before, hard) = (limit.rlim_cur, limit.rlim_max);
    if soft_before >= hard {
        tracing::info!(soft = soft_before, hard, "the open-file soft limit (RLIMIT_NOFILE) is its hard limit already");
        return;
    }
    limit.rlim_cur = hard;
    // SAFETY: setrlimit reads only the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        let error = std::io::Error::last_os_error();
        tracing::warn!(
            %error,
            soft = soft_before,
            hard,
            "cannot raise the open-file soft limit (RLIMIT_NOFILE) to the hard limit; going on with the soft limit \
             (set LimitNOFILE in the systemd unit, or ulimit -n)"
        );
        return;
    }
    tracing::info!(soft_before, soft = hard, hard, "raised the open-file soft limit (RLIMIT_NOFILE) to the hard limit");
}

/// Reads the API's certificate and key again on every SIGHUP (the signal that also reloads the
/// policy directory), until `stopping` fires; a pair that cannot serve is refused and the one
/// in use goes on.
async fn reload_certificate_on_sighup(tls: Arc<api::tls::ApiTls>, mut stopping: tokio::sync::watch::Receiver<bool>) {
    let Ok(mut hangup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        tracing::error!("cannot listen for SIGHUP: the API's certificate will not be reloaded");
        return;
    };
    loop {
        tokio::select! {
            _ = stopping.changed() => return,
            _ = hangup.recv() => {}
        }
        let reloading = tls.clone();
        match tokio::task::spawn_blocking(move || reloading.reload()).await {
            Ok(Ok(())) => tracing::info!("SIGHUP: the API's TLS certificate and key were read again"),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "SIGHUP: the new TLS certificate was refused; the one in use stays")
            }
            Err(e) => tracing::error!(error = %e, "SIGHUP: reloading the TLS certificate panicked"),
        }
    }
}

fn log_end<E: std::fmt::Display>(
    what: &str,
    ended: std::result::Result<std::result::Result<(), E>, tokio::task::JoinError>,
) {
    match ended {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "{what} failed"),
        Err(e) => tracing::error!(error = %e, "{what} panicked"),
    }
}

/// The phases a pass spent a tenth of a second or more in, busiest first (`delta_log=2.31
/// upload=0.52`): where a slow pass went, in its log line.
fn busiest_phases(report: &crate::ops::passes::PassReport) -> String {
    let mut named: Vec<(&str, f64)> = report.seconds.named().into_iter().filter(|(_, s)| *s >= 0.1).collect();
    named.sort_by(|a, b| b.1.total_cmp(&a.1));
    named.iter().map(|(name, s)| format!("{name}={s:.2}")).collect::<Vec<_>>().join(" ")
}

/// A pass every `interval`, until `stopping` fires; a pass in flight runs to its end.
async fn pass_loop(engine: Arc<Engine>, passes: Arc<Passes>, mut stopping: tokio::sync::watch::Receiver<bool>) {
    let interval = Duration::from_micros(engine.settings().interval_us as u64);
    let mut status_writes = StatusWrites::default();
    let mut upkeep = StoreUpkeep::default();
    while !*stopping.borrow() {
        let started = std::time::Instant::now();
        // A pass that took as many due buckets as it may and met no error leaves a backlog: the
        // next pass starts at once. The interval paces an engine that has caught up, not one
        // working through a backlog (at the default 64 buckets a pass and 15 s, tiny buckets
        // were archived at about 4 a second however many waited). A pass with an error (a
        // target down defers every bucket it tries) waits, so failures are not retried at speed.
        let mut backlog = false;
        match passes.run_once(&engine).await {
            Ok(report) if report.made_progress() || report.deferred > 0 => {
                backlog = report.leaves_backlog(engine.settings().scan_limit);
                tracing::info!(
                    planned = report.planned,
                    reconciled = report.reconciled,
                    archived = report.archived,
                    cleaned = report.cleaned,
                    expired = report.expired,
                    deferred = report.deferred,
                    delivered = report.outbox_delivered,
                    rows = report.rows_archived,
                    seconds = format!("{:.3}", started.elapsed().as_secs_f64()),
                    phases = %busiest_phases(&report),
                    "pass finished"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "pass failed"),
        }
        if status_writes.due() {
            let status_engine = engine.clone();
            let started = std::time::Instant::now();
            let written =
                tokio::task::spawn_blocking(move || crate::ops::status::write_status_file(&status_engine)).await;
            status_writes.took(started.elapsed());
            if let Ok(Err(e)) = written {
                tracing::warn!(error = %e, "cannot write the status file");
            }
        }
        if backlog {
            continue;
        }
        if upkeep.due(&engine) {
            let upkeep_engine = engine.clone();
            match tokio::task::spawn_blocking(move || crate::ops::maintenance::compact_if_worthwhile(&upkeep_engine))
                .await
            {
                Ok(Ok(done)) => upkeep.record(&done),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "the hot store's upkeep failed");
                    upkeep.checked(false);
                }
                Err(e) => {
                    tracing::error!(error = %e, "the hot store's upkeep panicked");
                    upkeep.checked(false);
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stopping.wait_for(|stop| *stop) => break,
        }
    }
}

/// Paces the status file: never sooner after the last write than `STATUS_FILE_COST_FACTOR`
/// times what that write took. The summary reads the store's tallies (`store::tally`), so it
/// costs about the same on any store and the file is rewritten after every pass; the pace is a
/// guard for what still grows (a long list of deferrals, a slow disk), a tenth of a core at
/// most.
#[derive(Default)]
struct StatusWrites {
    last: Option<(std::time::Instant, Duration)>,
}

/// See `StatusWrites`.
const STATUS_FILE_COST_FACTOR: u32 = 10;

impl StatusWrites {
    fn due(&self) -> bool {
        self.last.is_none_or(|(at, took)| at.elapsed() >= took * STATUS_FILE_COST_FACTOR)
    }

    fn took(&mut self, took: Duration) {
        self.last = Some((std::time::Instant::now(), took));
    }
}

/// Paces the measure of the hot store's free pages (`ops::maintenance`): once the first pass
/// has worked through any backlog, then every `FROSTLINE_STORE_COMPACT_CHECK_SECONDS`; a
/// compaction put off by a read in progress is tried again after `UPKEEP_RETRY`.
#[derive(Default)]
struct StoreUpkeep {
    /// When the last check ended, and whether it asked to be tried again soon.
    last: Option<(std::time::Instant, bool)>,
}

/// See `StoreUpkeep`.
const UPKEEP_RETRY: Duration = Duration::from_secs(60);

impl StoreUpkeep {
    fn due(&self, engine: &Engine) -> bool {
        let every = Duration::from_micros(engine.settings().store_compact_check_us as u64);
        engine.settings().store_compact_free_percent > 0
            && self.last.is_none_or(|(at, soon)| at.elapsed() >= if soon { every.min(UPKEEP_RETRY) } else { every })
    }

    fn checked(&mut self, retry_soon: bool) {
        self.last = Some((std::time::Instant::now(), retry_soon));
    }

    fn record(&mut self, done: &crate::ops::maintenance::Upkeep) {
        use crate::ops::maintenance::InPlace;
        match &done.compaction {
            None => tracing::debug!(
                file_bytes = done.space.file_bytes,
                free_bytes = done.space.free_bytes,
                "the hot store is not worth compacting"
            ),
            // `Store::compact_in_place` logs what it gave back.
            Some(InPlace::Compacted(_)) => {}
            Some(InPlace::Skipped { reason }) => tracing::info!(
                file_bytes = done.space.file_bytes, free_bytes = done.space.free_bytes, %reason,
                "the hot store's compaction was put off"
            ),
        }
        self.checked(matches!(done.compaction, Some(InPlace::Skipped { .. })));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_file_waits_ten_times_what_its_last_write_took() {
        let mut writes = StatusWrites::default();
        assert!(writes.due(), "the first write is due at once");
        writes.took(Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(15));
        assert!(writes.due(), "a cheap write is due again after 10x its cost");
        writes.took(Duration::from_secs(60));
        assert!(!writes.due(), "an expensive write is not repeated before 10x its cost");
    }
}

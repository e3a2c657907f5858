//! Process settings (README.md, "Using it", lists them), as flags and environment variables, validated once
//! at start into typed values.

use crate::error::{Error, Result};
use crate::model::Micros;
use crate::model::time::MICROS_PER_SECOND;

pub const INTERVAL_SECONDS_DEFAULT: u64 = 15;
pub const LEASE_SECONDS_DEFAULT: u64 = 60;
pub const RETRY_SECONDS_DEFAULT: u64 = 15;
pub const SCAN_LIMIT_DEFAULT: usize = 64;
pub const SCAN_LIMIT_MAX: usize = 100_000;
pub const TOMBSTONE_RETENTION_SECONDS_DEFAULT: u64 = 30 * 86_400;
pub const ORPHAN_GRACE_SECONDS_DEFAULT: u64 = 86_400;
/// The orphan sweep never deletes an object younger than this.
pub const ORPHAN_GRACE_SECONDS_MIN: u64 = 3_600;
pub const SWEEP_INTERVAL_SECONDS_DEFAULT: u64 = 3_600;
/// How often the sweep lists every archive (`archive::sweep`): a day. The sweeps between
/// look only where released keys lie; the first sweep of every life is full too.
pub const SWEEP_FULL_INTERVAL_SECONDS_DEFAULT: u64 = 86_400;
/// How long a bucket that took a late record waits before its next generation is published.
/// A next generation rewrites the whole bucket (about the cost of its first archival, see
/// BENCHMARKS.md, scenario `late`), so late records that trickle in are gathered into one
/// generation per interval; reads see them at once either way.
pub const LATE_GRACE_SECONDS_DEFAULT: u64 = 300;
/// A week: longer would keep late rows hot past what an operator means by "late".
pub const LATE_GRACE_SECONDS_MAX: u64 = 7 * 86_400;
/// redb's page cache. redb's own default is 1 GiB, which an engine on an edge host would fill
/// with pages of rows it has long archived; 64 MiB holds the interior pages of a store of
/// millions of rows (see BENCHMARKS.md, footprint and append).
pub const STORE_CACHE_MIB_DEFAULT: u64 = 64;
pub const STORE_CACHE_MIB_MIN: u64 = 4;
pub const STORE_CACHE_MIB_MAX: u64 = 65_536;
/// Hot rows a cleanup deletes per transaction: the single writer is held for one slice, not
/// for a whole bucket, so appends interleave with the cleanup of a large bucket.
pub const CLEANUP_SLICE_ROWS_DEFAULT: usize = 10_000;
pub const CLEANUP_SLICE_ROWS_MAX: usize = 1_000_000;
/// A running engine compacts its hot store in place when at least this share of the file is
/// free pages (`ops::maintenance`; 0: never), and
pub const STORE_COMPACT_FREE_PERCENT_DEFAULT: u8 = 50;
pub const STORE_COMPACT_FREE_PERCENT_MAX: u8 = 99;
/// at least this many MiB are: below it, a compaction's pause buys too little.
pub const STORE_COMPACT_FREE_MIB_DEFAULT: u64 = 64;
/// How often a running engine measures the hot store's free pages, which reads every live page
/// once: an hour.
pub const STORE_COMPACT_CHECK_SECONDS_DEFAULT: u64 = 3_600;
/// Buckets a pass works on at once (each under its own lease and fence); by default one per
/// core the process may use.
pub const ARCHIVE_CONCURRENCY_MAX: usize = 64;

/// Settings that were replaced; setting one is refused with the way forward.
const OBSOLETE: &[(&str, &str)] = &[
    (
        "ARCHIVER_KEEP_HOT_BUCKETS",
        "it was replaced by ARCHIVER_ELIGIBLE_BEFORE (an RFC 3339 cutoff applied to bucket_end) and the retention policy's overrides",
    ),
    (
        "ARCHIVER_ELIGIBLE_THROUGH_YEAR",
        "it was replaced by ARCHIVER_ELIGIBLE_BEFORE: write ARCHIVER_ELIGIBLE_BEFORE=<year+1>-01-01T00:00:00Z",
    ),
];

#[derive(Debug, Clone, clap::Args)]
pub struct ArchiverArgs {
    /// Buckets ending at or before this RFC 3339 time are due (built-in retention only);
    /// default: 1 January of the previous UTC year.
    #[arg(long, env = "ARCHIVER_ELIGIBLE_BEFORE")]
    pub eligible_before: Option<String>,
    /// Seconds between archival passes.
    #[arg(long, env = "ARCHIVER_INTERVAL_SECONDS", default_value_t = INTERVAL_SECONDS_DEFAULT)]
    pub interval_seconds: u64,
    /// Lease length in seconds.
    #[arg(long, env = "ARCHIVER_LEASE_SECONDS", default_value_t = LEASE_SECONDS_DEFAULT)]
    pub lease_seconds: u64,
    /// Lease renewal period in seconds (default: a third of the lease).
    #[arg(long, env = "ARCHIVER_LEASE_RENEWAL_SECONDS")]
    pub lease_renewal_seconds: Option<u64>,
    /// Seconds before a deferred bucket is retried.
    #[arg(long, env = "ARCHIVER_RETRY_SECONDS", default_value_t = RETRY_SECONDS_DEFAULT)]
    pub retry_seconds: u64,
    /// Due buckets looked at per pass.
    #[arg(long, env = "ARCHIVER_SCAN_LIMIT", default_value_t = SCAN_LIMIT_DEFAULT)]
    pub scan_limit: usize,
    /// How long tombstones of expired archives are kept (the replay period), in seconds.
    #[arg(long, env = "ARCHIVER_TOMBSTONE_RETENTION_SECONDS", default_value_t = TOMBSTONE_RETENTION_SECONDS_DEFAULT)]
    pub tombstone_retention_seconds: u64,
    /// Objects no manifest or in-flight upload names are deleted once older than this (at least 3600).
    #[arg(long, env = "ARCHIVER_ORPHAN_GRACE_SECONDS", default_value_t = ORPHAN_GRACE_SECONDS_DEFAULT)]
    pub orphan_grace_seconds: u64,
    /// Seconds between orphan sweeps inside `run`.
    #[arg(long, env = "ARCHIVER_SWEEP_INTERVAL_SECONDS", default_value_t = SWEEP_INTERVAL_SECONDS_DEFAULT)]
    pub sweep_interval_seconds: u64,
    /// Seconds between full sweeps, which list every archive of every target; the sweeps between
    /// list only the folders of keys this data directory released. The first sweep of every
    /// start is full.
    #[arg(long, env = "ARCHIVER_SWEEP_FULL_INTERVAL_SECONDS", default_value_t = SWEEP_FULL_INTERVAL_SECONDS_DEFAULT)]
    pub sweep_full_interval_seconds: u64,
    /// Seconds a bucket that took a late record (or a backfill) waits before its next generation
    /// is published (0 to 604800; 0: the next pass). Records arriving meanwhile join the same
    /// generation; queries read them at once either way.
    #[arg(long, env = "ARCHIVER_LATE_GRACE_SECONDS", default_value_t = LATE_GRACE_SECONDS_DEFAULT)]
    pub late_grace_seconds: u64,
    /// Share erasure requests with the other installations on this engine's targets, and take
    /// theirs up (docs/FLEET.md, "Erasure across the fleet"), naming their values on the target
    /// only by digests under the key in FILE, which every host of the fleet is given (at least
    /// 32 bytes: `openssl rand -hex 32`). A request taken up erases what matches when it is
    /// taken up, so give it to every host of a fleet, and to no copy of a data directory
    /// restored beside the one that went on.
    #[arg(long, env = "ARCHIVER_SHARE_ERASURES", value_name = "FILE")]
    pub share_erasures: Option<std::path::PathBuf>,
    /// Memory for the hot store's page cache, in MiB (4 to 65536).
    #[arg(long, env = "FROSTLINE_STORE_CACHE_MIB", default_value_t = STORE_CACHE_MIB_DEFAULT)]
    pub store_cache_mib: u64,
    /// Hot rows a cleanup deletes per transaction (1 to 1,000,000); a bucket with at most four
    /// slices of rows left drops its rows table whole instead.
    #[arg(long, env = "ARCHIVER_CLEANUP_SLICE_ROWS", default_value_t = CLEANUP_SLICE_ROWS_DEFAULT)]
    pub cleanup_slice_rows: usize,
    /// Compact the hot store in place once this share of its file (in percent, 0 to 99; 0:
    /// never) is free pages that archival, expiry and erasure left, and at least
    /// FROSTLINE_STORE_COMPACT_FREE_MIB of it: writes and reads wait for the compaction.
    #[arg(long, env = "FROSTLINE_STORE_COMPACT_FREE_PERCENT", default_value_t = STORE_COMPACT_FREE_PERCENT_DEFAULT)]
    pub store_compact_free_percent: u8,
    /// The free MiB (at least 1) below which the hot store is never compacted in place.
    #[arg(long, env = "FROSTLINE_STORE_COMPACT_FREE_MIB", default_value_t = STORE_COMPACT_FREE_MIB_DEFAULT)]
    pub store_compact_free_mib: u64,
    /// Seconds between two measures of the hot store's free pages (each reads every live page).
    #[arg(long, env = "FROSTLINE_STORE_COMPACT_CHECK_SECONDS", default_value_t = STORE_COMPACT_CHECK_SECONDS_DEFAULT)]
    pub store_compact_check_seconds: u64,
    /// Buckets a pass works on at once (1 to 64; default: one per core).
    #[arg(long, env = "ARCHIVER_CONCURRENCY")]
    pub concurrency: Option<usize>,
    /// The key file given to `frostline plugin compile --key-file` where this engine's plugins
    /// were precompiled (an edge build, without a compiler, runs no other precompiled plugin):
    /// artifacts in DATA/plugin-cache are run only when proven by it or by the engine's own key,
    /// DATA/plugin-cache.key, made at first use for what the engine compiles itself.
    #[arg(long, env = "FROSTLINE_PLUGIN_CACHE_KEY_FILE", value_name = "FILE")]
    pub plugin_cache_key_file: Option<std::path::PathBuf>,
    /// Where compiled plugins are cached (default DATA/plugin-cache), with the engine's own key
    /// beside it (DIR.key): a folder several data directories of one host can share, or one
    /// an image ships precompiled artifacts in. Only artifacts its keys prove are ever run.
    #[arg(long, env = "FROSTLINE_PLUGIN_CACHE_DIR", value_name = "DIR")]
    pub plugin_cache_dir: Option<std::path::PathBuf>,
}

impl Default for ArchiverArgs {
    fn default() -> Self {
        ArchiverArgs {
            eligible_before: None,
            interval_seconds: INTERVAL_SECONDS_DEFAULT,
            lease_seconds: LEASE_SECONDS_DEFAULT,
            lease_renewal_seconds: None,
            retry_seconds: RETRY_SECONDS_DEFAULT,
            scan_limit: SCAN_LIMIT_DEFAULT,
            tombstone_retention_seconds: TOMBSTONE_RETENTION_SECONDS_DEFAULT,
            orphan_grace_seconds: ORPHAN_GRACE_SECONDS_DEFAULT,
            sweep_interval_seconds: SWEEP_INTERVAL_SECONDS_DEFAULT,
            sweep_full_interval_seconds: SWEEP_FULL_INTERVAL_SECONDS_DEFAULT,
            late_grace_seconds: LATE_GRACE_SECONDS_DEFAULT,
            share_erasures: None,
            store_cache_mib: STORE_CACHE_MIB_DEFAULT,
            cleanup_slice_rows: CLEANUP_SLICE_ROWS_DEFAULT,
            store_compact_free_percent: STORE_COMPACT_FREE_PERCENT_DEFAULT,
            store_compact_free_mib: STORE_COMPACT_FREE_MIB_DEFAULT,
            store_compact_check_seconds: STORE_COMPACT_CHECK_SECONDS_DEFAULT,
            concurrency: None,
            plugin_cache_key_file: None,
            plugin_cache_dir: None,
        }
    }
}

/// Validated settings with units in their names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub eligible_before: Option<Micros>,
    pub interval_us: Micros,
    pub lease_us: Micros,
    pub lease_renewal_us: Micros,
    pub retry_us: Micros,
    pub scan_limit: usize,
    pub tombstone_retention_us: Micros,
    pub orphan_grace_us: Micros,
    pub sweep_interval_us: Micros,
    /// Between full sweeps (the ones between look only where released keys lie).
    pub sweep_full_interval_us: Micros,
    /// How long a bucket with late records waits before its next generation (0: at once).
    pub late_grace_us: Micros,
    /// Erasure requests go through the shared targets (`archive::fleet_erase`), their values
    /// named there by digests under the key in this file (`store::fleet_key`).
    pub share_erasures: Option<std::path::PathBuf>,
    pub store_cache_bytes: usize,
    pub cleanup_slice_rows: usize,
    /// Compaction in place (`ops::maintenance`): the free share of the file in percent (0:
    /// never), the free bytes at least, and the time between two measures.
    pub store_compact_free_percent: u8,
    pub store_compact_free_bytes: u64,
    pub store_compact_check_us: Micros,
    pub archive_concurrency: usize,
    /// Seeds the engine's random choices (owner tokens, hold ids, verify samples). `None` (the
    /// binary's setting) draws the seed from the operating system; tests and the simulation
    /// set it so a seed replays the same choices.
    pub random_seed: Option<u64>,
    /// The operator's key that proves precompiled plugins (`plugin::provenance`).
    pub plugin_cache_key_file: Option<std::path::PathBuf>,
    /// The compiled-plugin cache; `None`: DATA/plugin-cache (`Settings::plugin_cache_dir`).
    pub plugin_cache_dir: Option<std::path::PathBuf>,
}

impl Settings {
    /// The compiled-plugin cache of the data directory `data_dir`.
    pub fn plugin_cache_dir(&self, data_dir: &std::path::Path) -> std::path::PathBuf {
        self.plugin_cache_dir.clone().unwrap_or_else(|| data_dir.join("plugin-cache"))
    }
}

impl Default for Settings {
    fn default() -> Self {
        ArchiverArgs::default().validate_with(|_| None).expect("defaults are valid")
    }
}

impl ArchiverArgs {
    pub fn validate(&self) -> Result<Settings> {
        self.validate_with(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Validates with an injectable environment lookup (for the obsolete settings).
    pub fn validate_with(&self, env: impl Fn(&str) -> Option<String>) -> Result<Settings> {
        for (name, why) in OBSOLETE {
            if env(name).is_some() {
                return Err(Error::InvalidInput(format!("{name} is no longer supported: {why}; unset it")));
            }
        }
        let positive = |name: &str, v: u64| {
            if v == 0 {
                Err(Error::InvalidInput(format!("{name} must be at least 1 second")))
            } else {
                Ok(v as i64 * MICROS_PER_SECOND)
            }
        };
        let lease_us = positive("ARCHIVER_LEASE_SECONDS", self.lease_seconds)?;
        let lease_renewal_us = match self.lease_renewal_seconds {
            Some(s) => positive("ARCHIVER_LEASE_RENEWAL_SECONDS", s)?,
            None => (lease_us / 3).max(1),
        };
        if lease_renewal_us >= lease_us {
            return Err(Error::InvalidInput(format!(
                "ARCHIVER_LEASE_RENEWAL_SECONDS ({}) must be shorter than ARCHIVER_LEASE_SECONDS ({}), or the lease \
                 lapses between renewals",
                lease_renewal_us / MICROS_PER_SECOND,
                self.lease_seconds
            )));
        }
        if self.scan_limit == 0 || self.scan_limit > SCAN_LIMIT_MAX {
            return Err(Error::InvalidInput(format!("ARCHIVER_SCAN_LIMIT must be 1 to {SCAN_LIMIT_MAX}")));
        }
        let eligible_before = match &self.eligible_before {
            Some(text) => Some(
                crate::model::time::parse_rfc3339(text)
                    .map_err(|e| Error::InvalidInput(format!("ARCHIVER_ELIGIBLE_BEFORE: {e}")))?,
            ),
            None => None,
        };
        let orphan_grace_seconds = crate::failpoints::orphan_grace_seconds_override();
        if orphan_grace_seconds.is_none() && self.orphan_grace_seconds < ORPHAN_GRACE_SECONDS_MIN {
            return Err(Error::InvalidInput(format!(
                "ARCHIVER_ORPHAN_GRACE_SECONDS must be at least {ORPHAN_GRACE_SECONDS_MIN}: an upload in flight must \
                 never look like an orphan"
            )));
        }
        if self.late_grace_seconds > LATE_GRACE_SECONDS_MAX {
            return Err(Error::InvalidInput(format!(
                "ARCHIVER_LATE_GRACE_SECONDS must be 0 to {LATE_GRACE_SECONDS_MAX} (seconds), not {}",
                self.late_grace_seconds
            )));
        }
        if !(STORE_CACHE_MIB_MIN..=STORE_CACHE_MIB_MAX).contains(&self.store_cache_mib) {
            return Err(Error::InvalidInput(format!(
                "FROSTLINE_STORE_CACHE_MIB must be {STORE_CACHE_MIB_MIN} to {STORE_CACHE_MIB_MAX} (MiB), not {}",
                self.store_cache_mib
            )));
        }
        if !(1..=CLEANUP_SLICE_ROWS_MAX).contains(&self.cleanup_slice_rows) {
            return Err(Error::InvalidInput(format!(
                "ARCHIVER_CLEANUP_SLICE_ROWS must be 1 to {CLEANUP_SLICE_ROWS_MAX} (rows per transaction), not {}",
                self.cleanup_slice_rows
            )));
        }
        if self.store_compact_free_percent > STORE_COMPACT_FREE_PERCENT_MAX {
            return Err(Error::InvalidInput(format!(
                "FROSTLINE_STORE_COMPACT_FREE_PERCENT must be 0 (never compact in place) to \
                 {STORE_COMPACT_FREE_PERCENT_MAX} (percent of the hot store's file), not {}",
                self.store_compact_free_percent
            )));
        }
        if self.store_compact_free_mib == 0 {
            return Err(Error::InvalidInput(
                "FROSTLINE_STORE_COMPACT_FREE_MIB must be at least 1 (MiB); to never compact in place, set \
                 FROSTLINE_STORE_COMPACT_FREE_PERCENT=0"
                    .into(),
            ));
        }
        let archive_concurrency = match self.concurrency {
            Some(n) if (1..=ARCHIVE_CONCURRENCY_MAX).contains(&n) => n,
            Some(n) => {
                return Err(Error::InvalidInput(format!(
                    "ARCHIVER_CONCURRENCY must be 1 to {ARCHIVE_CONCURRENCY_MAX} (buckets at once), not {n}"
                )));
            }
            None => std::thread::available_parallelism().map_or(1, |n| n.get()).min(ARCHIVE_CONCURRENCY_MAX),
        };
        Ok(Settings {
            store_cache_bytes: (self.store_cache_mib * 1024 * 1024) as usize,
            cleanup_slice_rows: self.cleanup_slice_rows,
            store_compact_free_percent: self.store_compact_free_percent,
            store_compact_free_bytes: self.store_compact_free_mib.saturating_mul(1024 * 1024),
            store_compact_check_us: positive(
                "FROSTLINE_STORE_COMPACT_CHECK_SECONDS",
                self.store_compact_check_seconds,
            )?,
            archive_concurrency,
            random_seed: None,
            plugin_cache_key_file: self.plugin_cache_key_file.clone(),
            plugin_cache_dir: self.plugin_cache_dir.clone(),
            tombstone_retention_us: positive("ARCHIVER_TOMBSTONE_RETENTION_SECONDS", self.tombstone_retention_seconds)?,
            orphan_grace_us: orphan_grace_seconds.unwrap_or(self.orphan_grace_seconds) as i64 * MICROS_PER_SECOND,
            sweep_interval_us: positive("ARCHIVER_SWEEP_INTERVAL_SECONDS", self.sweep_interval_seconds)?,
            sweep_full_interval_us: positive("ARCHIVER_SWEEP_FULL_INTERVAL_SECONDS", self.sweep_full_interval_seconds)?,
            late_grace_us: self.late_grace_seconds as i64 * MICROS_PER_SECOND,
            share_erasures: self.share_erasures.clone(),
            eligible_before,
            interval_us: positive("ARCHIVER_INTERVAL_SECONDS", self.interval_seconds)?,
            lease_us,
            lease_renewal_us,
            retry_us: positive("ARCHIVER_RETRY_SECONDS", self.retry_seconds)?,
            scan_limit: self.scan_limit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_cache_is_bounded_both_ways() {
        for mib in [STORE_CACHE_MIB_MIN, STORE_CACHE_MIB_DEFAULT, STORE_CACHE_MIB_MAX] {
            let args = ArchiverArgs { store_cache_mib: mib, ..Default::default() };
            assert_eq!(args.validate_with(|_| None).unwrap().store_cache_bytes, mib as usize * 1024 * 1024);
        }
        for mib in [0, STORE_CACHE_MIB_MIN - 1, STORE_CACHE_MIB_MAX + 1] {
            let args = ArchiverArgs { store_cache_mib: mib, ..Default::default() };
            let error = args.validate_with(|_| None).unwrap_err().to_string();
            assert!(error.contains("FROSTLINE_STORE_CACHE_MIB must be 4 to 65536"), "{error}");
        }
    }

    #[test]
    fn the_late_grace_is_bounded_and_zero_means_at_once() {
        for seconds in [0, LATE_GRACE_SECONDS_DEFAULT, LATE_GRACE_SECONDS_MAX] {
            let args = ArchiverArgs { late_grace_seconds: seconds, ..Default::default() };
            assert_eq!(args.validate_with(|_| None).unwrap().late_grace_us, seconds as i64 * MICROS_PER_SECOND);
        }
        let args = ArchiverArgs { late_grace_seconds: LATE_GRACE_SECONDS_MAX + 1, ..Default::default() };
        let error = args.validate_with(|_| None).unwrap_err().to_string();
        assert!(error.contains("ARCHIVER_LATE_GRACE_SECONDS must be 0 to 604800"), "{error}");
    }

    #[test]
    fn the_cleanup_slice_is_bounded_both_ways() {
        for rows in [1, CLEANUP_SLICE_ROWS_DEFAULT, CLEANUP_SLICE_ROWS_MAX] {
            let args = ArchiverArgs { cleanup_slice_rows: rows, ..Default::default() };
            assert_eq!(args.validate_with(|_| None).unwrap().cleanup_slice_rows, rows);
        }
        for rows in [0, CLEANUP_SLICE_ROWS_MAX + 1] {
            let args = ArchiverArgs { cleanup_slice_rows: rows, ..Default::default() };
            let error = args.validate_with(|_| None).unwrap_err().to_string();
            assert!(error.contains("ARCHIVER_CLEANUP_SLICE_ROWS must be 1 to 1000000"), "{error}");
        }
    }

    #[test]
    fn compaction_in_place_is_bounded_and_zero_percent_means_never() {
        for percent in [0, STORE_COMPACT_FREE_PERCENT_DEFAULT, STORE_COMPACT_FREE_PERCENT_MAX] {
            let args = ArchiverArgs { store_compact_free_percent: percent, ..Default::default() };
            assert_eq!(args.validate_with(|_| None).unwrap().store_compact_free_percent, percent);
        }
        let args =
            ArchiverArgs { store_compact_free_percent: STORE_COMPACT_FREE_PERCENT_MAX + 1, ..Default::default() };
        let error = args.validate_with(|_| None).unwrap_err().to_string();
        assert!(
            error.contains("FROSTLINE_STORE_COMPACT_FREE_PERCENT must be 0 (never compact in place) to 99"),
            "{error}"
        );
        let args = ArchiverArgs { store_compact_free_mib: 1, ..Default::default() };
        assert_eq!(args.validate_with(|_| None).unwrap().store_compact_free_bytes, 1024 * 1024);
        let args = ArchiverArgs { store_compact_free_mib: 0, ..Default::default() };
        let error = args.validate_with(|_| None).unwrap_err().to_string();
        assert!(error.contains("FROSTLINE_STORE_COMPACT_FREE_MIB must be at least 1"), "{error}");
        let args = ArchiverArgs { store_compact_check_seconds: 0, ..Default::default() };
        let error = args.validate_with(|_| None).unwrap_err().to_string();
        assert!(error.contains("FROSTLINE_STORE_COMPACT_CHECK_SECONDS must be at least 1 second"), "{error}");
    }

    #[test]
    fn concurrency_is_bounded_both_ways_and_defaults_to_the_cores() {
        for n in [1, 4, ARCHIVE_CONCURRENCY_MAX] {
            let args = ArchiverArgs { concurrency: Some(n), ..Default::default() };
            assert_eq!(args.validate_with(|_| None).unwrap().archive_concurrency, n);
        }
        for n in [0, ARCHIVE_CONCURRENCY_MAX + 1] {
            let args = ArchiverArgs { concurrency: Some(n), ..Default::default() };
            let error = args.validate_with(|_| None).unwrap_err().to_string();
            assert!(error.contains("ARCHIVER_CONCURRENCY must be 1 to 64"), "{error}");
        }
        let cores = std::thread::available_parallelism().unwrap().get().min(ARCHIVE_CONCURRENCY_MAX);
        assert_eq!(Settings::default().archive_concurrency, cores);
    }

    #[test]
    fn renewal_must_be_nonzero_and_shorter_than_the_lease() {
        let ok = ArchiverArgs { lease_seconds: 60, lease_renewal_seconds: Some(59), ..Default::default() };
        assert!(ok.validate_with(|_| None).is_ok());
        let equal = ArchiverArgs { lease_seconds: 60, lease_renewal_seconds: Some(60), ..Default::default() };
        assert!(equal.validate_with(|_| None).unwrap_err().to_string().contains("shorter"));
        let zero = ArchiverArgs { lease_renewal_seconds: Some(0), ..Default::default() };
        assert!(zero.validate_with(|_| None).is_err());
        assert_eq!(Settings::default().lease_renewal_us, 20 * MICROS_PER_SECOND);
    }

    #[test]
    fn obsolete_settings_point_to_eligible_before() {
        for name in ["ARCHIVER_KEEP_HOT_BUCKETS", "ARCHIVER_ELIGIBLE_THROUGH_YEAR"] {
            let err =
                ArchiverArgs::default().validate_with(|n| (n == name).then(|| "2".into())).unwrap_err().to_string();
            assert!(err.contains(name) && err.contains("ARCHIVER_ELIGIBLE_BEFORE"), "{err}");
        }
    }

    #[test]
    fn orphan_grace_has_a_floor_of_one_hour() {
        let ok = ArchiverArgs { orphan_grace_seconds: 3_600, ..Default::default() };
        assert!(ok.validate_with(|_| None).is_ok());
        let short = ArchiverArgs { orphan_grace_seconds: 3_599, ..Default::default() };
        assert!(short.validate_with(|_| None).unwrap_err().to_string().contains("at least 3600"));
    }

    #[test]
    fn eligible_before_must_be_rfc3339() {
        let bad = ArchiverArgs { eligible_before: Some("2024".into()), ..Default::default() };
        assert!(bad.validate_with(|_| None).unwrap_err().to_string().contains("ARCHIVER_ELIGIBLE_BEFORE"));
    }
}

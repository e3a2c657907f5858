//! The built-in plugins: WASM components built from `plugins/builtin` by the build script and
//! embedded in the binary. They take the same path through the host as anyone's plugin.

use super::{PluginSource, Role};

const CALENDAR_UTC_WASM: &[u8] = include_bytes!(concat!(env!("FROSTLINE_GUEST_DIR"), "/calendar_utc.wasm"));
const ELIGIBLE_BEFORE_WASM: &[u8] = include_bytes!(concat!(env!("FROSTLINE_GUEST_DIR"), "/eligible_before.wasm"));

/// The built-in components by file name (`plugin compile --builtins` writes one artifact each).
pub const COMPONENTS: &[(&str, &[u8])] =
    &[("calendar_utc", CALENDAR_UTC_WASM), ("eligible_before", ELIGIBLE_BEFORE_WASM)];

/// The built-ins compiled for this target at build time, in a build without a compiler (the
/// build script checked that each was made from the component embedded above).
#[cfg(not(feature = "compiler"))]
const PRECOMPILED: &[(&[u8], &[u8])] = &[
    (CALENDAR_UTC_WASM, include_bytes!(concat!(env!("FROSTLINE_PRECOMPILED_BUILTINS"), "/calendar_utc.cwasm"))),
    (ELIGIBLE_BEFORE_WASM, include_bytes!(concat!(env!("FROSTLINE_PRECOMPILED_BUILTINS"), "/eligible_before.cwasm"))),
];

/// The artifact embedded for the built-in component whose SHA-256 is `hash`; `None` in a build
/// with a compiler, which compiles the built-ins as any component.
pub(crate) fn precompiled(hash: &str) -> Option<&'static [u8]> {
    #[cfg(not(feature = "compiler"))]
    {
        use sha2::Digest as _;
        PRECOMPILED.iter().find(|(wasm, _)| hex::encode(sha2::Sha256::digest(wasm)) == hash).map(|(_, cwasm)| *cwasm)
    }
    #[cfg(feature = "compiler")]
    {
        let _ = hash;
        None
    }
}

/// Where the guest build put its components (the test-only ones included).
pub const GUEST_DIR: &str = env!("FROSTLINE_GUEST_DIR");

/// The prefix that names a built-in in policy files and on the command line.
pub use crate::model::BUILTIN_PREFIX;

/// The default bucket strategy.
pub const DEFAULT_STRATEGY: &str = "builtin:calendar-year-utc";
/// The default retention policy.
pub const DEFAULT_RETENTION: &str = "builtin:eligible-before";

/// One built-in: its component and, for the calendar variants, the configuration that makes
/// it that variant (operators cannot change it).
#[derive(Debug, Clone, Copy)]
pub struct Builtin {
    pub name: &'static str,
    pub role: Role,
    pub bytes: &'static [u8],
    pub fixed_config: Option<&'static str>,
}

pub const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "calendar-year-utc",
        role: Role::BucketStrategy,
        bytes: CALENDAR_UTC_WASM,
        fixed_config: Some(r#"{"unit":"year"}"#),
    },
    Builtin {
        name: "calendar-month-utc",
        role: Role::BucketStrategy,
        bytes: CALENDAR_UTC_WASM,
        fixed_config: Some(r#"{"unit":"month"}"#),
    },
    Builtin {
        name: "calendar-day-utc",
        role: Role::BucketStrategy,
        bytes: CALENDAR_UTC_WASM,
        fixed_config: Some(r#"{"unit":"day"}"#),
    },
    Builtin { name: "eligible-before", role: Role::RetentionPolicy, bytes: ELIGIBLE_BEFORE_WASM, fixed_config: None },
];

/// Resolves `builtin:NAME` (or a bare NAME) to a built-in.
pub fn find(name: &str) -> Option<&'static Builtin> {
    let bare = name.strip_prefix(BUILTIN_PREFIX).unwrap_or(name);
    BUILTINS.iter().find(|b| b.name == bare)
}

impl Builtin {
    pub fn source(&self) -> PluginSource {
        PluginSource { name: format!("{BUILTIN_PREFIX}{}", self.name), bytes: self.bytes.into() }
    }

    /// The configuration to pass to `init`: the fixed one, or the operator's.
    pub fn effective_config(&self, operator_config: &str) -> Result<String, String> {
        match self.fixed_config {
            Some(fixed) if operator_config.trim().is_empty() || operator_config.trim() == "{}" => Ok(fixed.to_string()),
            Some(_) => Err(format!(
                "builtin:{} takes no configuration; use builtin:calendar-year-utc, -month-utc or -day-utc",
                self.name
            )),
            None => Ok(operator_config.to_string()),
        }
    }
}

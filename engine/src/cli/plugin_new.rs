//! `frostline plugin new`: writes a buildable plugin project for a role in Rust, Python or
//! JavaScript: the contract's WIT, a working plugin to start from, a build script and a check
//! script that runs `frostline plugin check` on the result. The templates are in
//! `cli/scaffold/` and compiled into the binary, so the project matches the engine that made it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::ops::plugins::Role;

/// The bindings generator frostline's own Rust plugins are built with (plugins/Cargo.lock).
pub const WIT_BINDGEN_VERSION: &str = "0.61.1";
/// The Python and JavaScript componentizers frostline's examples are built and tested with
/// (plugins/examples/build.sh).
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";
pub const COMPONENTIZE_JS_VERSION: &str = "0.23.0";
/// A project name: what the files and the component are called.
const NAME_BYTES_MAX: usize = 64;

const CONTRACT_WIT: &str = include_str!("../../../wit/plugin.wit");

#[derive(Debug, clap::Args)]
pub struct NewArgs {
    /// The project's name: 1 to 64 of `a-z 0-9 -`, starting with a letter. The folder and the
    /// component (`NAME.wasm`) are named after it.
    pub name: String,
    /// The role: bucket-strategy, retention-policy or archiver.
    #[arg(long)]
    pub role: String,
    /// The language: rust, python or js.
    #[arg(long)]
    pub lang: String,
    /// Where to create the project folder (default: the current directory).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Rust,
    Python,
    JavaScript,
}

impl Language {
    pub fn parse(text: &str) -> anyhow::Result<Language> {
        match text {
            "rust" => Ok(Language::Rust),
            "python" | "py" => Ok(Language::Python),
            "js" | "javascript" => Ok(Language::JavaScript),
            other => bail!("--lang `{other}` is not one of rust, python, js"),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Language::Rust => "Rust",
            Language::Python => "Python",
            Language::JavaScript => "JavaScript",
        }
    }
}

/// Checks a project name: it becomes a folder, a file name, a crate or package name and
/// appears in messages, so it is kept to what is safe in all of them.
fn check_name(name: &str) -> anyhow::Result<()> {
    let fits = !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !fits {
        bail!(
            "plugin name `{}` is not valid: use 1 to {NAME_BYTES_MAX} of a-z, 0-9 and `-`, starting with a letter \
             (for example `weekly-buckets`)",
            name.escape_debug()
        );
    }
    Ok(())
}

/// The files of a project, by path relative to its folder, and whether each is executable.
pub fn project_files(name: &str, role: Role, language: Language) -> Vec<(String, String, bool)> {
    let world = role.world();
    let (template, app) = match (language, role) {
        (Language::Rust, Role::BucketStrategy) => (include_str!("scaffold/rust/strategy.rs"), "src/lib.rs"),
        (Language::Rust, Role::RetentionPolicy) => (include_str!("scaffold/rust/retention.rs"), "src/lib.rs"),
        (Language::Rust, Role::Archiver) => (include_str!("scaffold/rust/archiver.rs"), "src/lib.rs"),
        (Language::Python, Role::BucketStrategy) => (include_str!("scaffold/python/strategy.py"), "app.py"),
        (Language::Python, Role::RetentionPolicy) => (include_str!("scaffold/python/retention.py"), "app.py"),
        (Language::Python, Role::Archiver) => (include_str!("scaffold/python/archiver.py"), "app.py"),
        (Language::JavaScript, Role::BucketStrategy) => (include_str!("scaffold/js/strategy.js"), "app.js"),
        (Language::JavaScript, Role::RetentionPolicy) => (include_str!("scaffold/js/retention.js"), "app.js"),
        (Language::JavaScript, Role::Archiver) => (include_str!("scaffold/js/archiver.js"), "app.js"),
    };
    // An archiver stores through the blob store the engine lends it; the check lends it one
    // in memory.
    let check_args = if role == Role::Archiver { " --blob-store memory://" } else { "" };
    let usage = usage(name, role);
    let fill = |text: &str| {
        text.replace("{{name}}", name)
            .replace("{{crate}}", &name.replace('-', "_"))
            .replace("{{role}}", role.world())
            .replace("{{world}}", world)
            .replace("{{language}}", language.label())
            .replace("{{check_args}}", check_args)
            .replace("{{wit_bindgen}}", WIT_BINDGEN_VERSION)
            .replace("{{componentize_py}}", COMPONENTIZE_PY_VERSION)
            .replace("{{componentize_js}}", COMPONENTIZE_JS_VERSION)
            .replace("{{usage}}", &usage)
    };
    let mut files = vec![
        ("wit/plugin.wit".to_string(), CONTRACT_WIT.to_string(), false),
        ("README.md".to_string(), fill(include_str!("scaffold/README.md")), false),
        ("check.sh".to_string(), fill(include_str!("scaffold/check.sh")), true),
        (app.to_string(), fill(template), false),
    ];
    match language {
        Language::Rust => {
            files.push(("Cargo.toml".into(), fill(include_str!("scaffold/rust/Cargo.toml")), false));
            files.push(("build.sh".into(), fill(include_str!("scaffold/rust/build.sh")), true));
            files.push((".gitignore".into(), format!("/target\n/{name}.wasm\n"), false));
        }
        Language::Python => {
            files.push(("build.sh".into(), fill(include_str!("scaffold/python/build.sh")), true));
            files.push((".gitignore".into(), format!("/.tools\n/{name}.wasm\n__pycache__/\n"), false));
        }
        Language::JavaScript => {
            files.push(("package.json".into(), fill(include_str!("scaffold/js/package.json")), false));
            files.push(("build.sh".into(), fill(include_str!("scaffold/js/build.sh")), true));
            files.push((".gitignore".into(), format!("/node_modules\n/{name}.wasm\n"), false));
        }
    }
    files
}

/// How a policy directory names the plugin, for the project's README.
fn usage(name: &str, role: Role) -> String {
    let lines = match role {
        Role::BucketStrategy => format!(
            "[[table]]\nid = \"events\"\nstrategy = {{ plugin = \"{name}.wasm\" }}   # relative to the policy directory"
        ),
        Role::RetentionPolicy => format!(
            "[[table]]\nid = \"events\"\nretention = {{ plugin = \"{name}.wasm\", config = {{ archive_after_days = 7 }} }}"
        ),
        Role::Archiver => format!(
            "[[target]]\nname = \"cold\"\nurl = \"file:///srv/frostline/cold\"\n\n[[target]]\nname = \"{name}\"\n\
             plugin = \"{name}.wasm\"\n\n# The blob store this archiver stores through: granted to its SHA-256.\n\
             [[grant]]\nsha256 = \"<sha256sum {name}.wasm>\"\nblob_store = \"cold\"\n\n[[table]]\nid = \"events\"\n\
             target = \"{name}\""
        ),
    };
    lines.lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n")
}

/// Writes the project into `dir/<name>`, which must not exist yet.
pub fn write_project(dir: &Path, name: &str, role: Role, language: Language) -> anyhow::Result<PathBuf> {
    check_name(name)?;
    let root = dir.join(name);
    if root.exists() {
        bail!("{} already exists: choose another name or --dir; nothing was written", root.display());
    }
    let files = project_files(name, role, language);
    // Written into a temporary folder beside it and renamed into place, so a failure leaves
    // no half-made project.
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{name}-"))
        .tempdir_in(dir)
        .with_context(|| format!("writing into {}", dir.display()))?;
    for (path, text, executable) in &files {
        let file = staging.path().join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
        if *executable {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    std::fs::rename(staging.keep(), &root).with_context(|| format!("creating {}", root.display()))?;
    Ok(root)
}

pub fn run(args: NewArgs) -> anyhow::Result<ExitCode> {
    let role = Role::parse(&args.role)?;
    let language = Language::parse(&args.lang)?;
    let root = write_project(&args.dir, &args.name, role, language)?;
    println!("created {} ({} {role} plugin)", root.display(), language.label());
    println!("next: {}/build.sh   (builds {}.wasm and runs frostline plugin check on it)", root.display(), args.name);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_safe_everywhere_are_refused() {
        for good in ["a", "weekly-buckets", "s3-like2", &"a".repeat(NAME_BYTES_MAX)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "2fast", "-x", "Upper", "a_b", "a b", "a/b", "..", "é", &"a".repeat(NAME_BYTES_MAX + 1)] {
            let refused = check_name(bad).unwrap_err().to_string();
            assert!(refused.contains("is not valid: use 1 to 64 of a-z, 0-9 and `-`"), "{refused}");
        }
    }

    #[test]
    fn every_placeholder_is_filled() {
        for role in [Role::BucketStrategy, Role::RetentionPolicy, Role::Archiver] {
            for language in [Language::Rust, Language::Python, Language::JavaScript] {
                for (path, text, _) in project_files("my-plugin", role, language) {
                    // `{{}}` is an escaped `{}` inside Python f-strings and stays.
                    let left = text.replace("{{}}", "");
                    assert!(!left.contains("{{"), "{role} {language:?} {path}: {}", left);
                }
            }
        }
    }

    #[test]
    fn an_existing_folder_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        write_project(dir.path(), "p", Role::Archiver, Language::Rust).unwrap();
        let again = write_project(dir.path(), "p", Role::Archiver, Language::Rust).unwrap_err().to_string();
        assert!(again.contains("already exists") && again.contains("nothing was written"), "{again}");
        let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(entries.len(), 1, "no staging folder is left behind");
    }
}

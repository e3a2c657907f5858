//! `frostline policy check DIR [--data D] [--json]`: what a reload of DIR would say, without a
//! running engine or without changing one, and with `--data` the re-plan it would cause. A
//! data directory held by a running engine is checked through its API (a dry-run reload).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::clock::Clock as _;
use crate::policy::check::{CheckReport, check_dir};
use crate::settings::ArchiverArgs;

#[derive(Debug, clap::Args)]
pub struct PolicyCheckArgs {
    /// The policy directory to check.
    pub dir: PathBuf,
    /// A data directory: check against its store and print the re-plan the directory would
    /// cause. Without it only the directory itself is checked (its default `local` target is
    /// probed in a scratch folder).
    #[arg(long)]
    pub data: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub archiver: ArchiverArgs,
}

pub fn run(args: PolicyCheckArgs) -> anyhow::Result<ExitCode> {
    let settings = args.archiver.validate()?;
    let dir = std::path::absolute(&args.dir)?;
    let now = crate::clock::SystemClock.now();
    let report = match &args.data {
        None => {
            let scratch = std::env::temp_dir().join(format!("frostline-policy-check-{}", std::process::id()));
            let host = crate::plugin::PluginHost::new(None)?;
            let report = check_dir(&dir, &scratch, &host, &settings, None, now);
            let _ = std::fs::remove_dir_all(&scratch);
            report
        }
        Some(data) => {
            let data = std::path::absolute(data)?;
            let database = data.join(crate::engine::DATABASE_FILE);
            if !database.is_file() {
                anyhow::bail!(
                    "{} holds no frostline data (no {}); check the --data path",
                    data.display(),
                    database.display()
                );
            }
            match crate::store::Store::open(&database) {
                Ok(store) => {
                    let host = crate::plugin::PluginHost::with_cache(
                        Some(data.join("plugin-cache")),
                        settings.plugin_cache_key_file.as_deref(),
                    )?;
                    check_dir(&dir, &data, &host, &settings, Some(&store), now)
                }
                Err(crate::Error::AlreadyOpen { .. }) => match crate::ops::wire::read_addr_file(&data)? {
                    Some(addr) => crate::cli::client::Client::for_running_engine(&data, addr)?.check_policies(&dir)?,
                    None => anyhow::bail!(
                        "{} is held by another process that publishes no API address; if it is `frostline run`, \
                         wait until it has started",
                        data.display()
                    ),
                },
                Err(e) => return Err(e.into()),
            }
        }
    };
    print(&report, args.json)?;
    Ok(if report.accepted { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn print(report: &CheckReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(())
}

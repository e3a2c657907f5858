//! `frostline policy check DIR [--data D] [--json]`: what a reload of DIR would say, without a
//! running engine or without changing one, and with `--data` the re-plan it would cause. A
//! data directory held by a running engine is checked through its API (a dry-run reload).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::ops::local::ArchiverArgs;
use crate::ops::policy::CheckReport;

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
    let report = match crate::ops::policy::check_offline(&args.dir, args.data.as_deref(), &args.archiver) {
        Ok(report) => report,
        // A running engine holds the data directory: ask it for a dry-run reload.
        Err(crate::Error::AlreadyOpen { path }) => {
            let data = args.data.as_deref().unwrap_or(&path);
            match crate::ops::wire::read_addr_file(data)? {
                Some(addr) => crate::cli::client::Client::for_running_engine(data, addr)?
                    .check_policies(&std::path::absolute(&args.dir)?)?,
                None => anyhow::bail!(
                    "{} is held by another process that publishes no API address; if it is `frostline run`, wait \
                     until it has started",
                    data.display()
                ),
            }
        }
        Err(e) => return Err(e.into()),
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

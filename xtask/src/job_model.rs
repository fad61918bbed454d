//! `cargo xtask job-model`: the shipped job early-warning model (probe-user/job-model/),
//! rebuilt from the repository's job corpus (xtask/job-corpus/: `cargo xtask job-corpus`)
//! with `probe train --job`: its training runs fit it, its held-out runs judge it into the
//! report docs/job.md quotes. `--check` rebuilds into target/job-model-check and fails unless
//! every file equals the shipped one byte for byte (`cargo xtask test` runs it).
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};

use crate::{build, job_corpus::REPO_JOB_CORPUS};

/// Where the shipped job model lives, relative to the workspace.
pub const SHIPPED: &str = "probe-user/job-model";

#[derive(clap::Args)]
pub struct JobModelArgs {
    /// Rebuild into target/job-model-check and compare with the shipped files.
    #[arg(long)]
    pub check: bool,
    /// The probe binary to train with, built with `--features train` (default: such a
    /// release build, made here).
    #[arg(long, value_name = "FILE")]
    pub probe: Option<PathBuf>,
}

/// The runs of one split of the job corpus, relative to the workspace (so that the
/// manifest names them without this machine's paths), in order.
fn runs(root: &Path, part: &str) -> Result<Vec<String>> {
    let dir = root.join(REPO_JOB_CORPUS).join(part);
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("lab.json").is_file())
        .filter_map(|p| {
            Some(format!(
                "{REPO_JOB_CORPUS}/{part}/{}",
                p.file_name()?.to_str()?
            ))
        })
        .collect();
    v.sort();
    if v.is_empty() {
        bail!("{} holds no run", dir.display());
    }
    Ok(v)
}

pub fn run(args: JobModelArgs) -> Result<()> {
    crate::setup::run()?;
    let root = build::root();
    let bin = match &args.probe {
        Some(p) => {
            std::fs::canonicalize(p).with_context(|| format!("no probe at {}", p.display()))?
        }
        None => build::release_probe_with_training()?,
    };
    let shipped = root.join(SHIPPED);
    let out = if args.check {
        build::target_dir().join("job-model-check")
    } else {
        shipped.clone()
    };
    let _ = std::fs::remove_dir_all(&out);
    let train = runs(&root, "train")?;
    let held = runs(&root, "heldout")?;
    let mut c = std::process::Command::new(&bin);
    c.current_dir(&root)
        .args([
            "train",
            "--job",
            "--force",
            "--rounds",
            "100",
            "--name",
            "probe-job",
        ])
        .arg("--out")
        .arg(&out)
        .arg("--data")
        .args(&train)
        .arg("--heldout")
        .args(&held);
    println!("job-model: {}", build::display(&c));
    build::run(&mut c)?;
    if !args.check {
        println!("job-model: {} written", out.display());
        return Ok(());
    }
    crate::model::same_dir(
        &out,
        &shipped,
        "job model",
        "run `cargo xtask job-model` and commit",
    )?;
    println!(
        "job-model: the job corpus rebuilds {} byte for byte",
        SHIPPED
    );
    Ok(())
}

//! `cargo xtask model`: the built-in spike model, end to end and reproducibly: a lab corpus
//! (resumable), packed into the repository's compact corpus (xtask/model-corpus/: the
//! runs' features and observations, `probe features --compact`), features of its training
//! and held-out runs, `probe train` into probe-user/model/, and `probe eval` of it on the
//! held-out runs into docs/model/ (the figures docs/model.md quotes). `--no-lab` starts
//! from the repository's corpus, on any machine.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::build;

#[derive(clap::Args)]
pub struct ModelArgs {
    /// The raw lab corpus (made or completed here; an existing one is reused), default
    /// target/model-corpus; its runs are packed into xtask/model-corpus/.
    #[arg(long, value_name = "DIR")]
    pub corpus: Option<PathBuf>,
    /// Training runs of the corpus (plus a third as many held-out runs).
    #[arg(long, default_value_t = 24)]
    pub runs: u32,
    /// Seconds of traffic per run: 15 minutes, so that every window and baseline is full
    /// for most of each run, as in a daemon that has been running.
    #[arg(long, default_value_t = 900)]
    pub duration: u32,
    /// Label horizons of the model. 200 s runs cannot label a 120 s horizon usefully (an
    /// onset comes within 120 s of almost every tick): longer runs can.
    #[arg(long, default_value = "5s,15s,30s")]
    pub horizons: String,
    /// Record nothing: train and evaluate on the repository's compact corpus as it is.
    #[arg(long)]
    pub no_lab: bool,
    /// Rebuild from the repository's corpus (implies --no-lab) into target/model-check and
    /// fail unless the model files and the evaluation's results.json equal the shipped
    /// ones byte for byte (`cargo xtask test` runs this).
    #[arg(long)]
    pub check: bool,
    /// The probe binary to train and evaluate with, built with `--features train` (default:
    /// such a release build, made here). Training is LightGBM's (always optimised) and the
    /// features are the daemon's engine, so a debug build gives the same files, only slower.
    #[arg(long, value_name = "FILE")]
    pub probe: Option<PathBuf>,
}

/// Calm gaps of the corpus's runs, seconds.
const CALM: &str = "45-150";
/// The repository's compact corpus, relative to the workspace.
pub const REPO_CORPUS: &str = "xtask/model-corpus";
/// The lab's ranks only: not the loopback scrapes, nor other namespaces' traffic the
/// host-wide sock_ops program also sees.
const LAB_PEERS: &str = "10.232.";
/// The entity kinds the model learns on (train/spec.rs).
const KINDS: &str = "peer,interface";

/// Runs `probe ARGS` in `cwd` (the work directory: the manifest and the report then name
/// the tables without this machine's paths).
fn probe(bin: &Path, cwd: &Path, args: &[&str]) -> Result<()> {
    let mut c = Command::new(bin);
    c.args(args).current_dir(cwd);
    println!("model: {}", build::display(&c));
    build::run(&mut c)
}

/// The recordings (and ground truths) of one split of the corpus.
fn split(corpus: &Path, part: &str) -> Result<(Vec<String>, Vec<String>)> {
    let mut recs = Vec::new();
    let mut truth = Vec::new();
    let dir = corpus.join(part);
    let mut runs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("recording.parquet").is_file())
        .collect();
    runs.sort();
    for r in runs {
        recs.push(r.join("recording.parquet").display().to_string());
        let gt = r.join("ground_truth.jsonl");
        if gt.is_file() {
            truth.push(gt.display().to_string());
        }
    }
    if recs.is_empty() {
        bail!("{} holds no recorded run", dir.display());
    }
    Ok((recs, truth))
}

pub fn run(mut args: ModelArgs) -> Result<()> {
    crate::setup::run()?;
    args.no_lab |= args.check;
    let root = build::root();
    let corpus = args
        .corpus
        .clone()
        .unwrap_or_else(|| build::target_dir().join("model-corpus"));
    let bin = match &args.probe {
        Some(p) => {
            std::fs::canonicalize(p).with_context(|| format!("no probe at {}", p.display()))?
        }
        None => build::release_probe_with_training()?,
    };
    if !args.no_lab {
        let xtask = std::env::current_exe().context("locating xtask")?;
        let mut c = Command::new(xtask);
        c.args(["lab", "--corpus"])
            .arg(&corpus)
            .args(["--corpus-runs", &args.runs.to_string()])
            .args(["--duration", &args.duration.to_string()])
            // Calm stretches long enough for an onset to follow a calm baseline, and twice
            // as many gradual episodes as abrupt ones: lead time is learnt from build-ups.
            .args(["--calm", CALM, "--gradual-weight", "2"])
            // Runs the repository holds already are not recorded again.
            .arg("--corpus-packed")
            .arg(root.join(REPO_CORPUS))
            .arg("--probe")
            .arg(&bin);
        println!("model: {}", build::display(&c));
        build::run(&mut c)?;
    }
    let packed = root.join(REPO_CORPUS);
    if !args.no_lab {
        pack(&bin, &corpus, &packed)?;
    }
    let corpus = packed;
    let work = build::target_dir().join(if args.check {
        "model-check"
    } else {
        "model-work"
    });
    std::fs::create_dir_all(&work)?;
    let (train, _) = split(&corpus, "train")?;
    let (held, truth) = split(&corpus, "heldout")?;
    let train_table = "train.parquet".to_owned();
    let held_table = "heldout.parquet".to_owned();
    for (recs, out) in [(&train, &train_table), (&held, &held_table)] {
        let mut a = vec![
            "features",
            "--force",
            "--horizons",
            args.horizons.as_str(),
            "--out",
            out.as_str(),
            "--data",
        ];
        a.extend(recs.iter().map(String::as_str));
        probe(&bin, &work, &a)?;
    }
    let shipped_model = root.join("probe-user").join("model");
    let shipped_report = root.join("docs").join("model");
    let (model_dir, report) = if args.check {
        (work.join("model"), work.join("report"))
    } else {
        (shipped_model.clone(), shipped_report.clone())
    };
    clear(&model_dir, &["txt"], &["manifest.json"])?;
    clear(&report, &["svg"], &["report.md", "results.json"])?;
    let trained_on = format!(
        "lab corpus: {} training runs of {} s (3 patterns x 3 periods x 3 link rates, 4-8 ranks, 6 episode kinds)",
        train.len(),
        args.duration
    );
    probe(
        &bin,
        &work,
        &[
            "train",
            "--force",
            "--name",
            "probe-default",
            "--trained-on",
            &trained_on,
            "--data",
            &train_table,
            "--out",
            &model_dir.display().to_string(),
        ],
    )?;
    let mut a = vec![
        "eval".to_owned(),
        "--model".into(),
        model_dir.display().to_string(),
        "--out".into(),
        report.display().to_string(),
        "--data".into(),
        held_table.clone(),
    ];
    if !truth.is_empty() {
        a.push("--ground-truth".into());
        a.extend(truth);
    }
    probe(
        &bin,
        &work,
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
    )?;
    if args.check {
        return same_files(&model_dir, &shipped_model, &report, &shipped_report);
    }
    println!(
        "model: {} and {} written; rebuild probe to embed the new default model",
        model_dir.display(),
        report.join("report.md").display()
    );
    Ok(())
}

/// Removes what an earlier training or evaluation wrote to `dir` (files with one of
/// `exts`, or named in `names`): a model the gate now skips must not stay behind, nor its
/// plots.
fn clear(dir: &Path, exts: &[&str], names: &[&str]) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let p = e.path();
        let ext = p.extension().and_then(|x| x.to_str()).unwrap_or("");
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if exts.contains(&ext) || names.contains(&name) {
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        }
    }
    Ok(())
}

/// The rebuilt model and evaluation against the shipped ones: every model file (both ways:
/// none missing, none extra) and results.json, byte for byte.
fn same_files(model: &Path, shipped: &Path, report: &Path, shipped_report: &Path) -> Result<()> {
    const FIX: &str = "run `cargo xtask model --no-lab` and commit";
    let n = same_dir(model, shipped, "model", FIX)?;
    same_file(
        &report.join("results.json"),
        &shipped_report.join("results.json"),
        FIX,
    )?;
    println!(
        "model: the corpus rebuilds the shipped model ({n} files) and its evaluation byte for byte"
    );
    Ok(())
}

/// A rebuilt directory against the shipped one: the same files (none missing, none extra),
/// each byte for byte; `what` names it, `fix` says what to do. Returns how many files.
pub fn same_dir(built: &Path, shipped: &Path, what: &str, fix: &str) -> Result<usize> {
    let names = |d: &Path| -> Result<Vec<String>> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .with_context(|| format!("reading {}", d.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        Ok(v)
    };
    let (b, kept) = (names(built)?, names(shipped)?);
    if b != kept {
        bail!("the rebuilt {what} has files {b:?}, the shipped one {kept:?}: {fix}");
    }
    for n in &b {
        same_file(&built.join(n), &shipped.join(n), fix)?;
    }
    Ok(b.len())
}

fn same_file(a: &Path, b: &Path, fix: &str) -> Result<()> {
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    if read(a)? != read(b)? {
        bail!(
            "{} differs from the shipped {}: the repository's corpus no longer rebuilds it ({fix})",
            a.display(),
            b.display()
        );
    }
    Ok(())
}

/// Packs every recorded run of the raw corpus that the repository's corpus lacks into it
/// (`probe features --compact`: features and observations of the lab's peers and the
/// interface, the job log, the ground truth), with the lab's corpus.json.
fn pack(bin: &Path, raw: &Path, packed: &Path) -> Result<()> {
    let raw =
        &std::fs::canonicalize(raw).with_context(|| format!("no corpus at {}", raw.display()))?;
    for part in ["train", "heldout"] {
        let dst = packed.join(part);
        std::fs::create_dir_all(&dst).with_context(|| format!("creating {}", dst.display()))?;
        let (recs, _) = split(raw, part)?;
        for rec in recs {
            let run = Path::new(&rec)
                .parent()
                .and_then(Path::file_name)
                .context("a run's directory")?;
            if dst.join(run).join("recording.features.parquet").is_file() {
                continue;
            }
            let out = dst.display().to_string();
            let a = [
                "features",
                "--peers",
                LAB_PEERS,
                "--kinds",
                KINDS,
                "--compact",
                &out,
                "--data",
                &rec,
            ];
            probe(bin, packed, &a)?;
        }
    }
    let doc = raw.join("corpus.json");
    std::fs::copy(&doc, packed.join("corpus.json"))
        .with_context(|| format!("copying {}", doc.display()))?;
    Ok(())
}

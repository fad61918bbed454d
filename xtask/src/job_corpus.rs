//! `cargo xtask job-corpus`: the job's corpus, one probe per rank (the job's early warning
//! learns and is judged on it), recorded by the lab (resumable, over several sittings: it
//! takes hours of real time) and packed into the repository's compact form
//! (xtask/job-corpus/: per run and rank, the observations of the lab's peers, the
//! interface and the host, and the peers' busy spans, `probe features --compact --spans`;
//! rank 0's job log, the ground truth and lab.json). Runs the repository holds are not
//! recorded again, so a corpus grows session by session on machines that keep nothing.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use crate::build;

#[derive(clap::Args)]
pub struct JobCorpusArgs {
    /// The raw lab corpus (made or completed here; an existing one is reused), default
    /// target/job-corpus; its recorded runs are packed into xtask/job-corpus/.
    #[arg(long, value_name = "DIR")]
    pub corpus: Option<PathBuf>,
    /// Training runs of the corpus (plus a third as many held-out runs): 24 runs of 15
    /// minutes are the 6 hours of training and 2 hours held out the early warning needs.
    #[arg(long, default_value_t = 24)]
    pub runs: u32,
    /// Seconds of traffic per run.
    #[arg(long, default_value_t = 900)]
    pub duration: u32,
    /// Record nothing: pack the runs the raw corpus has finished.
    #[arg(long)]
    pub pack_only: bool,
    /// The probe binary to record and pack with (default: a release build, made here).
    #[arg(long, value_name = "FILE")]
    pub probe: Option<PathBuf>,
}

/// The repository's compact job corpus, relative to the workspace.
pub const REPO_JOB_CORPUS: &str = "xtask/job-corpus";
/// Calm gaps: at least a minute, so that every episode starts from a calm level a host's
/// own baseline can hold.
const CALM: &str = "60-150";
/// Every culprit kind, the compute straggler included, gradual and abrupt.
const KINDS: &str = "tbf,cross,loss,ramp,squeeze,incast,straggle";
/// The lab's ranks only (not the loopback scrapes).
const LAB_PEERS: &str = "10.232.";
/// The rows a host's job features read: its peers, its interface (the qdisc backlog and
/// drops) and the host row.
const KEEP_KINDS: &str = "peer,interface,host";

pub fn run(args: JobCorpusArgs) -> Result<()> {
    crate::setup::run()?;
    let root = build::root();
    let raw = args
        .corpus
        .clone()
        .unwrap_or_else(|| build::target_dir().join("job-corpus"));
    let bin = match &args.probe {
        Some(p) => {
            std::fs::canonicalize(p).with_context(|| format!("no probe at {}", p.display()))?
        }
        None => build::release_probe()?,
    };
    let packed = root.join(REPO_JOB_CORPUS);
    if !args.pack_only {
        let xtask = std::env::current_exe().context("locating xtask")?;
        let mut c = Command::new(xtask);
        c.args(["lab", "--release", "--corpus"])
            .arg(&raw)
            .arg("--probe-per-rank")
            .args(["--corpus-runs", &args.runs.to_string()])
            .args(["--duration", &args.duration.to_string()])
            .args(["--calm", CALM, "--gradual-weight", "2", "--kinds", KINDS])
            .arg("--corpus-packed")
            .arg(&packed)
            .arg("--probe")
            .arg(&bin);
        println!("job-corpus: {}", build::display(&c));
        // A failed run is reported by the lab; what was recorded is packed all the same.
        if let Err(e) = build::run(&mut c) {
            eprintln!("job-corpus: the lab failed ({e:#}); packing what it recorded");
        }
    }
    let n = pack(&bin, &raw, &packed)?;
    println!(
        "job-corpus: {n} run(s) packed into {}; commit them",
        packed.display()
    );
    Ok(())
}

/// The runs of the raw corpus that corpus.json says finished, as (split, run directory
/// name).
fn finished(raw: &Path) -> Result<Vec<(String, String)>> {
    let path = raw.join("corpus.json");
    let doc: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("{} is not JSON", path.display()))?;
    let mut out = Vec::new();
    for r in doc["runs"].as_array().into_iter().flatten() {
        let (Some(dir), Some("ok")) = (r["dir"].as_str(), r["status"].as_str()) else {
            continue;
        };
        let mut parts = dir.splitn(2, '/');
        if let (Some(split), Some(run)) = (parts.next(), parts.next()) {
            out.push((split.to_owned(), run.to_owned()));
        }
    }
    Ok(out)
}

/// The recordings of one run: rank 0's in the run's directory, rank i's in `rank<i>/`, as
/// (compact name, recording).
fn recordings(run: &Path) -> Vec<(String, PathBuf)> {
    let mut out = vec![(String::new(), run.join("recording.parquet"))];
    let mut ranks: Vec<(u32, PathBuf)> = std::fs::read_dir(run)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let i: u32 = name.strip_prefix("rank")?.parse().ok()?;
            let rec = e.path().join("recording.parquet");
            rec.is_file().then_some((i, rec))
        })
        .collect();
    ranks.sort();
    out.extend(ranks.into_iter().map(|(i, p)| (format!("rank{i}"), p)));
    out
}

/// Packs every finished run of the raw corpus that the repository lacks, each rank's
/// recording with `probe features --compact --spans`; returns how many it packed.
fn pack(bin: &Path, raw: &Path, packed: &Path) -> Result<usize> {
    let raw =
        &std::fs::canonicalize(raw).with_context(|| format!("no corpus at {}", raw.display()))?;
    let mut n = 0;
    for (split, run) in finished(raw)? {
        let src = raw.join(&split).join(&run);
        let dst = packed.join(&split).join(&run);
        if dst.join("recording.spans.parquet").is_file() || !src.is_dir() {
            continue;
        }
        // Rank 0 last: its spans mark the run packed.
        for (name, rec) in recordings(&src).into_iter().rev() {
            // Rank 0 goes to the run's own directory (the compact name is the run's), rank
            // i to `rank<i>/` inside it.
            let out = if name.is_empty() {
                packed.join(&split)
            } else {
                dst.clone()
            };
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let mut c = Command::new(bin);
            c.args(["features", "--force", "--spans", "--peers", LAB_PEERS])
                .args(["--kinds", KEEP_KINDS, "--compact"])
                .arg(&out)
                .arg("--data")
                .arg(&rec)
                .current_dir(packed);
            build::run(&mut c).with_context(|| format!("packing {}", rec.display()))?;
        }
        n += 1;
    }
    let doc = raw.join("corpus.json");
    if doc.is_file() {
        std::fs::create_dir_all(packed)?;
        std::fs::copy(&doc, packed.join("corpus.json"))
            .with_context(|| format!("copying {}", doc.display()))?;
    }
    Ok(n)
}

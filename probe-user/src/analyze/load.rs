//! A recording as `probe analyze` reads it: the observations, the burst events beside them,
//! and, for a lab run (a directory with `lab.json`), what the lab ran: pattern, ranks,
//! traingen's own iteration log and the congestion episodes' ground truth.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use serde::Deserialize;

use crate::{
    observe::{BurstEvent, Observation},
    record::{events_path, reader},
};

pub struct Recording {
    /// The file name without `.parquet`; a lab run's directory name.
    pub name: String,
    pub path: PathBuf,
    pub obs: Vec<Observation>,
    pub events: Vec<BurstEvent>,
    pub lab: Option<Lab>,
}

/// What a lab run did, from the files `cargo xtask lab --record` writes.
#[derive(Clone, Debug)]
pub struct Lab {
    pub pattern: String,
    pub ranks: usize,
    /// The recorded rank's own address (rank 0 in the lab).
    pub addr: Option<String>,
    /// traingen's logged iteration durations of rank 0, seconds.
    pub iterations: Vec<f64>,
    pub episodes: Vec<Episode>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Episode {
    pub kind: String,
    pub onset: String,
    pub t_start: f64,
    pub t_end: f64,
    #[serde(default)]
    pub rank: Option<usize>,
}

/// `REC` is a `probe record` file or a lab run's directory (holding `recording.parquet`).
pub fn resolve(rec: &Path) -> PathBuf {
    if rec.is_dir() {
        rec.join("recording.parquet")
    } else {
        rec.to_path_buf()
    }
}

pub fn name_of(path: &Path) -> String {
    let n = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = n.strip_suffix(".parquet").unwrap_or(&n).to_owned();
    if n == "recording" {
        if let Some(dir) = path.parent().and_then(Path::file_name) {
            return dir.to_string_lossy().into_owned();
        }
    }
    n
}

impl Recording {
    pub fn load(rec: &Path) -> Result<Recording> {
        let path = resolve(rec);
        if !path.exists() {
            bail!(
                "{} does not exist (give a `probe record` file or a lab run directory)",
                path.display()
            );
        }
        let obs: Vec<Observation> = reader::read(&path)?;
        if obs.is_empty() {
            bail!("{} holds no observations", path.display());
        }
        if obs.windows(2).any(|w| w[1].time_unix < w[0].time_unix) {
            bail!("{}: observations are not in time order", path.display());
        }
        let ev = events_path(&path);
        let events: Vec<BurstEvent> = if ev.exists() {
            reader::read(&ev)?
        } else {
            tracing::warn!(
                "{} is missing: no burst timing, phases or pattern order",
                ev.display()
            );
            Vec::new()
        };
        let lab = match path.parent().map(|d| d.join("lab.json")) {
            Some(f) if f.exists() => Some(read_lab(&f).with_context(|| {
                format!("{} looks like a lab run but does not read", f.display())
            })?),
            _ => None,
        };
        Ok(Recording {
            name: name_of(&path),
            path,
            obs,
            events,
            lab,
        })
    }

    pub fn start(&self) -> f64 {
        self.obs[0].time_unix
    }

    pub fn end(&self) -> f64 {
        self.obs[self.obs.len() - 1].time_unix
    }
}

#[derive(Deserialize)]
struct LabJson {
    pattern: String,
    ranks: usize,
    #[serde(default)]
    rank_info: Vec<RankInfo>,
}

#[derive(Deserialize)]
struct RankInfo {
    rank: usize,
    addr: String,
    log: String,
}

#[derive(Deserialize)]
struct Iteration {
    duration_s: f64,
}

fn read_lab(file: &Path) -> Result<Lab> {
    let dir = file.parent().unwrap_or(Path::new("."));
    let lab: LabJson = serde_json::from_slice(&std::fs::read(file)?)?;
    let rank0 = lab.rank_info.iter().find(|r| r.rank == 0);
    let mut iterations = Vec::new();
    if let Some(r) = rank0 {
        let log = dir.join(&r.log);
        if let Ok(text) = std::fs::read_to_string(&log) {
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let it: Iteration = serde_json::from_str(line)
                    .with_context(|| format!("a line of {} does not read", log.display()))?;
                iterations.push(it.duration_s);
            }
        }
    }
    let mut episodes = Vec::new();
    let gt = dir.join("ground_truth.jsonl");
    if let Ok(text) = std::fs::read_to_string(&gt) {
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            episodes.push(
                serde_json::from_str(line)
                    .with_context(|| format!("a line of {} does not read", gt.display()))?,
            );
        }
    }
    Ok(Lab {
        pattern: lab.pattern,
        ranks: lab.ranks,
        addr: rank0.map(|r| r.addr.clone()),
        iterations,
        episodes,
    })
}

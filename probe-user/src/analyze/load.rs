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
    /// The host's address as its recording kept it: the one address its training jobs'
    /// sockets used (`probe.jobs`), if there was exactly one.
    pub recorded_address: Option<String>,
}

/// What a lab run did, from the files `cargo xtask lab --record` writes.
#[derive(Clone, Debug)]
pub struct Lab {
    pub pattern: String,
    pub ranks: usize,
    /// The recorded rank's own address: rank 0's for the run's own recording, rank i's for
    /// its `rank<i>/` (one probe per rank).
    pub addr: Option<String>,
    /// Every rank's address, by rank.
    pub rank_addrs: Vec<String>,
    /// traingen's logged iteration durations of the recorded rank, seconds.
    pub iterations: Vec<f64>,
    pub episodes: Vec<Episode>,
}

pub use crate::dataset::job::Episode;

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

/// The one address a recording's jobs used (its `probe.jobs` metadata), if one.
fn recorded_address(path: &Path) -> Option<String> {
    let kv = reader::metadata(path).ok()?;
    let (_, v) = kv.into_iter().find(|(k, _)| k == crate::record::JOBS_KEY)?;
    let jobs: std::collections::BTreeMap<String, Vec<String>> = serde_json::from_str(&v).ok()?;
    let all: std::collections::BTreeSet<String> = jobs.into_values().flatten().collect();
    match all.len() {
        1 => all.into_iter().next(),
        _ => None,
    }
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
        let lab = match lab_file(&path) {
            Some((f, rank)) => Some(read_lab(&f, rank).with_context(|| {
                format!("{} looks like a lab run but does not read", f.display())
            })?),
            None => None,
        };
        let recorded_address = recorded_address(&path);
        Ok(Recording {
            name: name_of(&path),
            path,
            obs,
            events,
            lab,
            recorded_address,
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

/// A line of traingen's log; the job corpus keeps only each iteration's start and end.
#[derive(Deserialize)]
struct Iteration {
    duration_s: Option<f64>,
    t_start: Option<f64>,
    t_end: Option<f64>,
}

impl Iteration {
    fn duration(&self) -> Option<f64> {
        self.duration_s.or(Some(self.t_end? - self.t_start?))
    }
}

/// The lab run a recording belongs to, and its rank: a run's own `recording.parquet` is rank
/// 0's, `rank<i>/recording.parquet` rank i's (`cargo xtask lab --probe-per-rank`).
fn lab_file(recording: &Path) -> Option<(PathBuf, usize)> {
    let dir = recording.parent()?;
    if dir.join("lab.json").exists() {
        return Some((dir.join("lab.json"), 0));
    }
    let rank = dir
        .file_name()?
        .to_str()?
        .strip_prefix("rank")?
        .parse()
        .ok()?;
    let f = dir.parent()?.join("lab.json");
    f.exists().then_some((f, rank))
}

fn read_lab(file: &Path, rank: usize) -> Result<Lab> {
    let dir = file.parent().unwrap_or(Path::new("."));
    let lab: LabJson = serde_json::from_slice(&std::fs::read(file)?)?;
    let me = lab.rank_info.iter().find(|r| r.rank == rank);
    let mut rank_addrs = vec![String::new(); lab.ranks];
    for r in &lab.rank_info {
        if let Some(a) = rank_addrs.get_mut(r.rank) {
            a.clone_from(&r.addr);
        }
    }
    let mut iterations = Vec::new();
    if let Some(r) = me {
        let log = dir.join(&r.log);
        if let Ok(text) = std::fs::read_to_string(&log) {
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let it: Iteration = serde_json::from_str(line)
                    .with_context(|| format!("a line of {} does not read", log.display()))?;
                iterations.push(it.duration().with_context(|| {
                    format!("a line of {} has no iteration time", log.display())
                })?);
            }
        }
    }
    let episodes = crate::dataset::job::ground_truth(dir)?;
    Ok(Lab {
        pattern: lab.pattern,
        ranks: lab.ranks,
        addr: me.map(|r| r.addr.clone()),
        rank_addrs,
        iterations,
        episodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{columns, writer::RecordingWriter, JOBS_KEY};

    /// A recording names its host by its jobs' address only when they used exactly one.
    #[test]
    fn a_recording_knows_its_address_from_one_job_address() {
        let dir = std::env::temp_dir().join(format!("probe-recaddr-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, jobs, want) in [
            ("one", r#"{"ml/llama":["10.0.0.1"]}"#, Some("10.0.0.1")),
            (
                "two-jobs-one-address",
                r#"{"a":["10.0.0.1"],"b":["10.0.0.1"]}"#,
                Some("10.0.0.1"),
            ),
            ("two-addresses", r#"{"a":["10.0.0.1","10.0.1.1"]}"#, None),
            ("none", "{}", None),
        ] {
            let p = dir.join(format!("{name}.parquet"));
            let w =
                RecordingWriter::create(&p, columns::observations(), &[(JOBS_KEY, jobs.into())])
                    .unwrap();
            w.finish().unwrap();
            assert_eq!(recorded_address(&p).as_deref(), want, "{name}");
        }
        let p = dir.join("without.parquet");
        RecordingWriter::create(&p, columns::observations(), &[])
            .unwrap()
            .finish()
            .unwrap();
        assert_eq!(recorded_address(&p), None, "no probe.jobs");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

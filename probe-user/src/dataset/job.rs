//! `probe features --job`: the job rows of per-rank lab runs (`cargo xtask lab
//! --probe-per-rank`, the job corpus): every rank's recording replayed through the daemon's
//! own job feature stage ([`crate::features::job`]) tick by tick, with the job's labels from
//! the job's own log and the lab's ground truth, into one table (a row per rank per tick)
//! that `probe train --job` and pandas read.
//!
//! The job's slowdown is what the person running it feels: its iteration period (traingen's
//! log, [`JobLog::at`]) at least [`SLOWDOWN_FACTOR`] times its calm level, held for
//! [`SLOW_ON_S`], over after [`SLOW_OFF_S`] without; its onset is a slowdown after
//! [`QUIET_S`] of known calm. A row's forecast label is whether the job slows within each
//! horizon; rows while the job is slow, and for `QUIET_S` after, are masked (the detector's
//! time, and an onset could not be called there). The culprit label is whether an episode of
//! the lab's ground truth is under way on the row's rank.
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};
use serde::Deserialize;

use super::labels::{self, JobLog, LabelConfig};
use crate::{
    features::job::{self as fj, JobFeatures, JobRow},
    model::job::DIRECTIONS,
    observe::{spans::Span, Observation},
    record::{reader, writer::RecordingWriter},
};

/// The job has slowed: its iteration period at least this times its calm level.
pub const SLOWDOWN_FACTOR: f64 = 1.2;
/// ...for this long.
pub const SLOW_ON_S: f64 = 1.0;
/// A slowdown ends after this long at the calm pace.
pub const SLOW_OFF_S: f64 = 3.0;
/// Calm an onset needs before it; rows this long after a slowdown are masked.
pub const QUIET_S: f64 = 30.0;
/// The grid the job's pace is read on, seconds: a fraction of the shortest iteration.
const GRID_S: f64 = 0.1;

/// The calm pace: the quarter quantile of the iterations of the last 300 s (robust to a
/// slowdown that takes up most of them), known after 60 s of them.
fn pace_config() -> LabelConfig {
    LabelConfig {
        slowdown_factor: SLOWDOWN_FACTOR,
        ..LabelConfig::default()
    }
}

/// One sustained slowdown of the job, Unix seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Slowdown {
    pub start: f64,
    pub end: f64,
    /// Preceded by `QUIET_S` of known calm pace: an onset a forecast is judged on.
    pub onset: bool,
}

/// The job's slowdowns from its log, over `[from, to]`; and the times its pace is known
/// to be calm or slow (`known`: `(t, slow)` on the grid, for masking).
pub struct Pace {
    pub slowdowns: Vec<Slowdown>,
    grid: Vec<(f64, Option<bool>)>,
}

impl Pace {
    pub fn of(log: &JobLog, from: f64, to: f64) -> Pace {
        let cfg = pace_config();
        // Past the log's last iteration the job has ended (or its log has): time since
        // that iteration is no stall.
        let to = log.iterations.last().map_or(from, |it| to.min(it.1));
        let n = (((to - from) / GRID_S).floor().max(0.0) as usize) + 1;
        let t: Vec<f64> = (0..n).map(|i| from + i as f64 * GRID_S).collect();
        let raw: Vec<Option<bool>> = t
            .iter()
            .map(|&t| {
                let (period, calm) = log.at(t, &cfg)?;
                (calm > 0.0).then_some(period >= cfg.slowdown_factor * calm)
            })
            .collect();
        let ticks = |s: f64| ((s / GRID_S).round() as usize).max(1);
        let ev = labels::sustain(&raw, ticks(SLOW_ON_S), ticks(SLOW_OFF_S));
        let on = labels::onsets(&t, &ev, QUIET_S);
        let mut slowdowns = Vec::new();
        let mut i = 0;
        while i < n {
            if ev[i] != Some(true) {
                i += 1;
                continue;
            }
            let s = i;
            while i < n && ev[i] == Some(true) {
                i += 1;
            }
            slowdowns.push(Slowdown {
                start: t[s],
                end: t[i - 1],
                onset: on[s],
            });
        }
        Pace {
            slowdowns,
            grid: t.into_iter().zip(ev).collect(),
        }
    }

    /// The pace at `t`: slow, calm, or unknown (before the calm level, outside the log).
    pub fn slow_at(&self, t: f64) -> Option<bool> {
        let k = self.grid.partition_point(|(g, _)| *g <= t);
        self.grid.get(k.checked_sub(1)?)?.1
    }

    /// Seconds from `t` to the next onset, if one comes within `within`.
    pub fn next_onset(&self, t: f64, within: f64) -> Option<f64> {
        self.slowdowns
            .iter()
            .filter(|s| s.onset && s.start > t && s.start <= t + within)
            .map(|s| s.start - t)
            .next()
    }

    /// Whether a forecast made at `t` is judged: the pace is known and calm, and has been
    /// for `QUIET_S` (or since the log's calm level is first known).
    pub fn judged_at(&self, t: f64) -> bool {
        if self.slow_at(t) != Some(false) {
            return false;
        }
        !self
            .slowdowns
            .iter()
            .any(|s| s.start <= t && t < s.end + QUIET_S)
    }
}

/// A congestion episode of the lab's ground truth.
#[derive(Clone, Debug, Deserialize)]
pub struct Episode {
    pub kind: String,
    pub onset: String,
    pub t_start: f64,
    pub t_end: f64,
    #[serde(default)]
    pub rank: Option<usize>,
}

impl Episode {
    /// The direction its culprit is named with, as an index into [`DIRECTIONS`] (the
    /// `culprit_direction` label's value).
    pub fn direction(&self) -> Option<usize> {
        let d = direction_of(&self.kind)?;
        DIRECTIONS.iter().position(|x| *x == d)
    }
}

/// The direction of an episode kind's culprit, as the lab's live check has it: where the
/// queue or the loss sits, or `compute` for a straggler (None: a kind the lab does not make).
pub fn direction_of(kind: &str) -> Option<&'static str> {
    match kind {
        // A squeezed egress, or a sender's cross traffic filling its own egress.
        "tbf" | "squeeze" | "cross" | "ramp" => Some("egress"),
        // Its switch port (incast) or its input (loss): what reaches the host.
        "incast" | "loss" => Some("ingress"),
        "straggle" => Some("compute"),
        _ => None,
    }
}

/// The episodes of a lab run's `ground_truth.jsonl` (none if it has none).
pub fn ground_truth(dir: &Path) -> Result<Vec<Episode>> {
    let gt = dir.join("ground_truth.jsonl");
    let Ok(text) = std::fs::read_to_string(&gt) else {
        return Ok(Vec::new());
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line)
                .with_context(|| format!("a line of {} does not read", gt.display()))
        })
        .collect()
}

#[derive(Deserialize)]
struct LabJson {
    ranks: usize,
    #[serde(default)]
    rank_info: Vec<RankInfo>,
}

#[derive(Deserialize)]
struct RankInfo {
    rank: usize,
    addr: String,
}

/// One rank of a run: its address and its job rows.
pub struct Host {
    pub rank: usize,
    pub addr: String,
    pub rows: Vec<JobRow>,
}

/// A per-rank lab run as the job model sees it.
pub struct Run {
    pub name: String,
    pub hosts: Vec<Host>,
    pub pace: Pace,
    pub episodes: Vec<Episode>,
}

/// The recording of rank `r` in a run directory.
pub fn rank_recording(dir: &Path, r: usize) -> PathBuf {
    if r == 0 {
        dir.join("recording.parquet")
    } else {
        dir.join(format!("rank{r}")).join("recording.parquet")
    }
}

/// The job rows of one rank's recording: its observations and busy spans tick by tick
/// through a fresh job feature stage, as the daemon made them.
pub fn replay(obs: &[Observation], spans: &[Span]) -> Vec<JobRow> {
    let mut f = JobFeatures::new();
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < obs.len() {
        let t = obs[i].time_unix;
        let e = i + obs[i..].partition_point(|o| o.time_unix == t);
        while j < spans.len() && spans[j].tick_unix < t {
            j += 1;
        }
        let k = j + spans[j..].partition_point(|s| s.tick_unix == t);
        if let Some(r) = f.tick(t, &obs[i..e], &spans[j..k]) {
            out.push(r);
        }
        (i, j) = (e, k);
    }
    out
}

impl Run {
    /// Reads a run directory (or its `recording.parquet`): lab.json's ranks, each rank's
    /// recording and busy spans, the job log (`rank0.jsonl`) and the ground truth.
    pub fn load(path: &Path) -> Result<Run> {
        let dir = if path.is_dir() {
            path
        } else {
            path.parent().unwrap_or(Path::new("."))
        };
        let lab_file = dir.join("lab.json");
        let lab: LabJson = serde_json::from_slice(
            &std::fs::read(&lab_file)
                .with_context(|| format!("{} (a per-rank lab run?)", lab_file.display()))?,
        )
        .with_context(|| format!("{} does not read", lab_file.display()))?;
        let log_file = dir.join(super::JOB_LOG);
        let log = JobLog::parse(
            &std::fs::read_to_string(&log_file)
                .with_context(|| format!("reading the job log {}", log_file.display()))?,
        );
        let mut hosts = Vec::new();
        for r in 0..lab.ranks {
            let rec = rank_recording(dir, r);
            if !rec.exists() {
                if r == 0 {
                    bail!("{} is missing", rec.display());
                }
                // A run recorded with one probe: rank 0's view only.
                continue;
            }
            let addr = lab
                .rank_info
                .iter()
                .find(|i| i.rank == r)
                .map(|i| i.addr.clone())
                .with_context(|| format!("{} has no address for rank {r}", lab_file.display()))?;
            let obs: Vec<Observation> = reader::read(&rec)?;
            if obs.windows(2).any(|w| w[1].time_unix < w[0].time_unix) {
                bail!("{}: observations are not in time order", rec.display());
            }
            let sp = super::store::spans_path(&rec);
            let mut spans: Vec<Span> = if sp.exists() {
                reader::read(&sp)?
            } else {
                tracing::warn!(
                    "{} is missing: the job's busy spans stay empty",
                    sp.display()
                );
                Vec::new()
            };
            spans.sort_by(|a, b| a.tick_unix.total_cmp(&b.tick_unix));
            hosts.push(Host {
                rank: r,
                addr,
                rows: replay(&obs, &spans),
            });
        }
        let (from, to) = span(&hosts);
        if !from.is_finite() || !to.is_finite() {
            bail!("{}: no rank has a job peer", dir.display());
        }
        let pace = Pace::of(&log, from - 60.0, to + 60.0);
        let episodes = ground_truth(dir)?;
        Ok(Run {
            name: super::recording_name(&dir.join("recording.parquet")),
            hosts,
            pace,
            episodes,
        })
    }

    /// The first and last time any rank has a job row.
    pub fn span(&self) -> (f64, f64) {
        span(&self.hosts)
    }

    /// The labels of a row of rank `rank` at `t`, in [`label_names`] order.
    pub fn labels(&self, rank: usize, t: f64, horizons: &[Duration]) -> Vec<f64> {
        let judged = self.pace.judged_at(t);
        let mut out: Vec<f64> = horizons
            .iter()
            .map(|h| {
                if judged {
                    f64::from(self.pace.next_onset(t, h.as_secs_f64()).is_some() as u8)
                } else {
                    f64::NAN
                }
            })
            .collect();
        out.push(
            self.pace
                .slow_at(t)
                .map_or(f64::NAN, |s| f64::from(s as u8)),
        );
        out.push(if judged {
            self.pace.next_onset(t, NEXT_ONSET_S).unwrap_or(f64::NAN)
        } else {
            f64::NAN
        });
        let on = self
            .episodes
            .iter()
            .find(|e| e.rank == Some(rank) && e.t_start <= t && t <= e.t_end);
        out.push(f64::from(on.is_some() as u8));
        out.push(
            on.and_then(Episode::direction)
                .map_or(f64::NAN, |i| i as f64),
        );
        out
    }
}

fn span(hosts: &[Host]) -> (f64, f64) {
    let from = hosts
        .iter()
        .filter_map(|h| h.rows.first())
        .map(|r| r.time_unix)
        .fold(f64::INFINITY, f64::min);
    let to = hosts
        .iter()
        .filter_map(|h| h.rows.last())
        .map(|r| r.time_unix)
        .fold(f64::NEG_INFINITY, f64::max);
    (from, to)
}

/// How far `slowdown_in_s` looks.
const NEXT_ONSET_S: f64 = 60.0;

/// The label columns: `slows_within_{h}` per horizon, `slowed` (the job is slow now),
/// `slowdown_in_s`, `culprit` (an episode is under way on this host) and
/// `culprit_direction` (its direction's index in [`DIRECTIONS`], NaN without one).
pub fn label_names(horizons: &[Duration]) -> Vec<String> {
    let mut v: Vec<String> = horizons
        .iter()
        .map(|h| format!("slows_within_{}", crate::features::schema::label(*h)))
        .collect();
    v.extend(["slowed", "slowdown_in_s", "culprit", "culprit_direction"].map(String::from));
    v
}

/// The numeric columns: `rank`, `peers`, the job features, the labels.
pub fn columns(horizons: &[Duration]) -> Vec<String> {
    let mut v = vec!["rank".to_string(), "peers".to_string()];
    v.extend(fj::names());
    v.extend(label_names(horizons));
    v
}

/// `probe features --job`: the job table of the runs in `data` into `out`.
pub fn main(data: &[PathBuf], out: &Path, horizons: &[Duration]) -> Result<()> {
    let numeric = columns(horizons);
    let meta = [
        (
            "probe.features.horizons",
            horizons
                .iter()
                .map(|d| crate::features::schema::label(*d))
                .collect::<Vec<_>>()
                .join(","),
        ),
        ("probe.features.job", "1".to_string()),
        ("probe.version", env!("CARGO_PKG_VERSION").to_string()),
    ];
    // The features table's layout (keys, then numbers), so `probe train` and pandas read
    // it as they read the per-entity tables.
    let mut w = RecordingWriter::create(out, super::table(&numeric), &meta)?;
    let mut total = 0;
    for path in data {
        let run = Run::load(path).with_context(|| format!("reading {}", path.display()))?;
        let mut rows = Vec::new();
        for h in &run.hosts {
            for r in &h.rows {
                let mut values = vec![h.rank as f64, r.peers as f64];
                values.extend(&r.values);
                values.extend(run.labels(h.rank, r.time_unix, horizons));
                rows.push(super::Row {
                    recording: run.name.clone(),
                    time_unix: r.time_unix,
                    entity_kind: fj::JOB,
                    entity: h.addr.clone(),
                    values,
                });
            }
        }
        let onsets = run.pace.slowdowns.iter().filter(|s| s.onset).count();
        eprintln!(
            "features: {} -> {} job rows of {} ranks, {} slowdowns ({onsets} onsets)",
            path.display(),
            rows.len(),
            run.hosts.len(),
            run.pace.slowdowns.len()
        );
        total += rows.len();
        w.push(rows);
        w.flush()?;
    }
    w.finish()?;
    eprintln!(
        "features: {total} job rows, {} columns -> {}",
        numeric.len() + super::KEYS.len(),
        out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job log: 0.5 s iterations, slowed to `slow` s between `from` and `to`.
    fn log(until: f64, slow: f64, from: f64, to: f64) -> JobLog {
        let mut it = Vec::new();
        let mut t = 0.0;
        while t < until {
            let d = if t >= from && t < to { slow } else { 0.5 };
            it.push((t, t + d));
            t += d;
        }
        JobLog { iterations: it }
    }

    #[test]
    fn a_slowdown_is_the_jobs_own_pace_and_its_onset_needs_calm_before() {
        // Slowed 1.5x over 100-130 s and again at 140 s (10 s after: not an onset).
        let mut l = log(300.0, 0.75, 100.0, 130.0);
        for it in l.iterations.iter_mut() {
            if it.0 >= 140.0 && it.0 < 150.0 {
                it.1 = it.0 + 0.75;
            }
        }
        let pace = Pace::of(&l, 0.0, 300.0);
        let onsets: Vec<&Slowdown> = pace.slowdowns.iter().filter(|s| s.onset).collect();
        assert_eq!(onsets.len(), 1, "{:?}", pace.slowdowns);
        assert!((onsets[0].start - 100.75).abs() < 0.5, "{:?}", onsets[0]);
        assert_eq!(pace.slowdowns.len(), 2);
        // 1.1x is not a slowdown.
        assert!(Pace::of(&log(300.0, 0.55, 100.0, 130.0), 0.0, 300.0)
            .slowdowns
            .is_empty());
        // 10.75 s before the onset: within 15 s, not within 5 s.
        assert_eq!(pace.next_onset(90.0, 15.0).map(|d| d.round()), Some(11.0));
        assert!(pace.next_onset(90.0, 5.0).is_none());
        assert!(pace.judged_at(90.0));
        assert!(!pace.judged_at(110.0), "slow now");
        assert!(!pace.judged_at(150.0), "within 30 s after a slowdown");
        assert!(!pace.judged_at(30.0), "before the calm level is known");
    }

    /// A run of the job corpus: every rank's rows, and slowdowns that the job's own log
    /// shows and the lab's episodes caused.
    #[test]
    fn a_corpus_run_reads_as_the_job_and_its_slowdowns_are_the_episodes() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../xtask/job-corpus/train/000-ps-200ms-4096KiB-4r-500M-q50-seed1");
        let run = Run::load(&dir).unwrap();
        assert_eq!(run.hosts.len(), 4);
        for (r, h) in run.hosts.iter().enumerate() {
            assert_eq!(h.rank, r);
            assert_eq!(h.addr, format!("10.232.0.{}", r + 1));
            assert!(
                h.rows.len() > 800,
                "rank {r}: {} rows of a 900 s run",
                h.rows.len()
            );
        }
        // The job's log, read here on its own: each onset's iterations are >= 1.2x the
        // calm pace (the quarter quantile of the 300 s before).
        let log: Vec<(f64, f64)> = std::fs::read_to_string(dir.join("rank0.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (v["t_start"].as_f64().unwrap(), v["t_end"].as_f64().unwrap())
            })
            .collect();
        let onsets: Vec<f64> = run
            .pace
            .slowdowns
            .iter()
            .filter(|s| s.onset)
            .map(|s| s.start)
            .collect();
        assert!(onsets.len() >= 3, "{:?}", run.pace.slowdowns);
        for s in &onsets {
            let mut calm: Vec<f64> = log
                .iter()
                .filter(|(_, e)| *e > s - 300.0 && *e < s - 1.0)
                .map(|(a, e)| e - a)
                .collect();
            calm.sort_by(f64::total_cmp);
            let q = calm[calm.len() / 4];
            // The iterations around the onset: the one under way, or the one just finished.
            let slow = log
                .iter()
                .filter(|(a, e)| *e > s - 1.0 && *a < s + 1.0)
                .map(|(a, e)| e - a)
                .fold(0.0, f64::max);
            assert!(
                slow >= 1.2 * q,
                "onset at {s}: {slow} s against a calm {q} s"
            );
        }
        // Each onset falls in an episode of the ground truth (the lab slowed the job).
        for s in &onsets {
            assert!(
                run.episodes
                    .iter()
                    .any(|e| e.t_start - 1.0 <= *s && *s <= e.t_end + 10.0),
                "an onset at {s} outside every episode"
            );
        }
    }
}

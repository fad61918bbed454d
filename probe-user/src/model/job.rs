//! The job's early warning in the daemon: each tick the host's job row (the job feature
//! stage, [`crate::features::job`]) scored by the job models `probe train --job` writes
//! (`--job-model DIR`: `job.json` and a LightGBM text per target): the warning's score
//! (this host is where an episode is building), its threshold, and the probability that the
//! job slows within each horizon. rules/job.rules.yml turns the score into
//! `ProbeJobSlowdownForecast` when one host stands out (docs/job.md).
use std::path::Path;

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

use super::lgbm::Booster;
use crate::{
    features::job::{self as fj, JobFeatures, JobRow},
    observe::{spans, Observation, TickBursts},
};

/// The directions the warning is named with (rules/job.rules.yml), in the order of the
/// `culprit_direction` label's values.
pub const DIRECTIONS: [&str; 3] = ["egress", "ingress", "compute"];

/// The manifest `probe train --job` writes.
pub const MANIFEST: &str = "job.json";

#[derive(Deserialize)]
struct Manifest {
    name: String,
    features: Vec<String>,
    models: std::collections::BTreeMap<String, ModelEntry>,
    warning: WarningEntry,
    /// Absent in the manifests written before the warning had a direction.
    #[serde(default)]
    direction: Option<DirectionEntry>,
}

#[derive(Deserialize)]
struct DirectionEntry {
    /// Direction -> its model's file.
    models: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct ModelEntry {
    file: String,
}

#[derive(Deserialize)]
struct WarningEntry {
    model: String,
    threshold: f64,
}

/// The loaded job models.
pub struct JobModel {
    pub name: String,
    warning: Booster,
    pub threshold: f64,
    /// (horizon label, e.g. "15s", model).
    slows: Vec<(String, Booster)>,
    /// (direction, model): the warning's direction is the one scoring highest.
    directions: Vec<(String, Booster)>,
}

impl JobModel {
    pub fn load(dir: &Path) -> Result<JobModel> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {} (a directory written by probe train --job?)",
                path.display()
            )
        })?;
        let m: Manifest = serde_json::from_str(&text)
            .with_context(|| format!("{} does not read", path.display()))?;
        if m.features != fj::names() {
            bail!(
                "{}: the job models read other features than this probe computes (retrain them with this version's probe train --job)",
                path.display()
            );
        }
        let read = |file: &str| -> Result<Booster> {
            let p = dir.join(file);
            let t =
                std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            let b = Booster::parse(&t).with_context(|| format!("{} does not read", p.display()))?;
            if b.num_features() != fj::names().len() {
                bail!(
                    "{} reads {} features, not the job's {}",
                    p.display(),
                    b.num_features(),
                    fj::names().len()
                );
            }
            Ok(b)
        };
        let w = m
            .models
            .get(&m.warning.model)
            .with_context(|| format!("{}: no model {}", path.display(), m.warning.model))?;
        if !m.warning.threshold.is_finite() {
            bail!(
                "{}: the warning's threshold is not a number",
                path.display()
            );
        }
        let mut slows = Vec::new();
        for (target, e) in &m.models {
            if let Some(h) = target.strip_prefix("slows_within_") {
                slows.push((h.to_owned(), read(&e.file)?));
            }
        }
        slows.sort_by_key(|(h, _)| {
            crate::duration::parse_duration(h).unwrap_or(std::time::Duration::MAX)
        });
        let mut directions = Vec::new();
        for (d, file) in m.direction.iter().flat_map(|d| &d.models) {
            if !DIRECTIONS.contains(&d.as_str()) {
                bail!("{}: unknown direction {d:?}", path.display());
            }
            directions.push((d.clone(), read(file)?));
        }
        Ok(JobModel {
            name: m.name,
            warning: read(&w.file)?,
            threshold: m.warning.threshold,
            slows,
            directions,
        })
    }
}

/// This tick's job view.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct JobScores {
    /// The job's peers this tick.
    pub peers: usize,
    /// The warning's score (None without a model).
    pub warning_score: Option<f64>,
    pub warning_threshold: Option<f64>,
    /// (horizon, probability that the job slows within it).
    pub slowdown_probability: Vec<(String, f64)>,
    /// (direction, its model's score): the warning names the highest.
    pub direction_score: Vec<(String, f64)>,
    pub model: Option<String>,
}

/// The job stage's state: nothing to do without `--job-model` (the job's row has no other
/// reader in the daemon).
#[derive(Default)]
pub struct Job {
    features: JobFeatures,
    model: Option<JobModel>,
}

impl Job {
    pub fn new(model: Option<JobModel>) -> Self {
        Job {
            features: JobFeatures::new(),
            model,
        }
    }

    /// The job row of this tick, scored; None without a model or a job peer this tick.
    pub fn tick(
        &mut self,
        now: f64,
        obs: &[Observation],
        bursts: &TickBursts,
    ) -> Option<JobScores> {
        let m = self.model.as_ref()?;
        let spans = spans::spans(bursts);
        let row = self.features.tick(now, obs, &spans)?;
        Some(score(m, &row))
    }
}

/// Scored from the first tick, calm levels unknown (NaN) for a minute: as trained.
fn score(m: &JobModel, row: &JobRow) -> JobScores {
    JobScores {
        peers: row.peers,
        warning_score: Some(m.warning.predict(&row.values)),
        warning_threshold: Some(m.threshold),
        slowdown_probability: m
            .slows
            .iter()
            .map(|(h, b)| (h.clone(), b.predict(&row.values)))
            .collect(),
        direction_score: m
            .directions
            .iter()
            .map(|(d, b)| (d.clone(), b.predict(&row.values)))
            .collect(),
        model: Some(m.name.clone()),
    }
}

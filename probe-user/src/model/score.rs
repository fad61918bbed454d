//! The model stage: after the features, every entity of a kind the model knows is scored by
//! every model of that kind, each tick. Folded peers are scored too (the export drops their
//! series, the JSON keeps them).
use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use serde::Serialize;

use super::bundle::{base_now, Bundle, Task};
use crate::{features::FeatureRow, pipeline, snapshot::Snapshot};

/// One score of one entity: a spike probability, or a forecast.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Forecast {
    pub entity_kind: &'static str,
    pub entity: String,
    pub target: String,
    pub horizon_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spike_probability: Option<f64>,
    /// The model's threshold: at or above it the model alarms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtt_forecast_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throughput_forecast_bytes_per_s: Option<f64>,
}

/// What is loaded, for `probe_model_info` and the snapshot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInfo {
    pub model: String,
    pub source: String,
    pub trained_on: String,
    pub features: usize,
    pub models: usize,
}

/// A bundle bound to the daemon's feature schemas: for each model, where each of its
/// features sits in the row of its entity kind.
pub struct Bound {
    pub bundle: Bundle,
    /// Per entity kind (first-seen order): its schema names, the input gather (None when
    /// the model reads the schema as is), and the models of the kind.
    kinds: Vec<KindModels>,
}

struct KindModels {
    kind: String,
    schema: Vec<String>,
    gather: Option<Vec<usize>>,
    /// (index into bundle entries, base feature indices in the model's input order).
    models: Vec<(usize, Vec<usize>)>,
}

impl Bound {
    /// Checks the bundle against the schemas the daemon produces (`names` of each kind):
    /// every feature a model reads must exist.
    pub fn bind(bundle: Bundle, schemas: &[(&str, Vec<String>)]) -> anyhow::Result<Bound> {
        let m = &bundle.manifest;
        let mut kinds = Vec::new();
        for (kind, names) in &m.features {
            let Some((_, schema)) = schemas.iter().find(|(k, _)| k == kind) else {
                anyhow::bail!(
                    "model {}: entity kind {kind:?} is unknown to this probe",
                    bundle.source
                );
            };
            let gather = if names == schema {
                None
            } else {
                let mut g = Vec::with_capacity(names.len());
                for n in names {
                    match schema.iter().position(|s| s == n) {
                        Some(i) => g.push(i),
                        None => anyhow::bail!(
                            "model {}: unknown feature {n:?} for {kind} (trained with other [features] windows {:?}?)",
                            bundle.source,
                            m.windows
                        ),
                    }
                }
                Some(g)
            };
            let models = m
                .models
                .iter()
                .enumerate()
                .filter(|(_, e)| &e.entity_kind == kind)
                .map(|(i, e)| {
                    let base = e
                        .base
                        .iter()
                        .filter_map(|b| names.iter().position(|n| n == b))
                        .collect();
                    (i, base)
                })
                .collect();
            kinds.push(KindModels {
                kind: kind.clone(),
                schema: schema.clone(),
                gather,
                models,
            });
        }
        Ok(Bound { bundle, kinds })
    }

    pub fn info(&self) -> ModelInfo {
        let m = &self.bundle.manifest;
        ModelInfo {
            model: m.name.clone(),
            source: self.bundle.source.clone(),
            trained_on: m.trained_on.clone(),
            features: self.bundle.feature_count(),
            models: m.models.len(),
        }
    }

    /// Scores of one entity's feature row; false for a kind without models. `scratch`
    /// holds the gathered input between calls.
    pub fn score(&self, row: &FeatureRow, scratch: &mut Vec<f64>, out: &mut Vec<Forecast>) -> bool {
        let Some(k) = self.kinds.iter().find(|k| k.kind == row.entity_kind) else {
            return false;
        };
        // A schema other than the one bound (cannot happen within one daemon): skip.
        if row.schema.names.len() != k.schema.len() {
            return false;
        }
        let x: &[f64] = match &k.gather {
            None => &row.values,
            Some(g) => {
                scratch.clear();
                scratch.extend(g.iter().map(|&i| row.values[i]));
                scratch
            }
        };
        for (i, base) in &k.models {
            let e = &self.bundle.manifest.models[*i];
            let b = &self.bundle.boosters[*i];
            let mut f = Forecast {
                entity_kind: row.entity_kind,
                entity: row.entity.clone(),
                target: e.target.clone(),
                horizon_s: e.horizon_s,
                spike_probability: None,
                threshold: None,
                rtt_forecast_s: None,
                throughput_forecast_bytes_per_s: None,
            };
            match e.task {
                Task::Classifier => {
                    f.spike_probability = Some(b.predict(x)).filter(|p| p.is_finite());
                    f.threshold = e.threshold;
                }
                Task::Regressor => {
                    let Some(now) = base_now(base.iter().map(|&j| x[j])) else {
                        continue;
                    };
                    let v = Some(e.forecast(b.predict(x), now)).filter(|v| v.is_finite());
                    match e.target.as_str() {
                        "rtt_p99" => f.rtt_forecast_s = v,
                        _ => f.throughput_forecast_bytes_per_s = v,
                    }
                }
            }
            out.push(f);
        }
        true
    }
}

/// Where `probe run` keeps the model that serves; SIGHUP swaps it.
pub type Slot = Arc<Mutex<Option<Arc<Bound>>>>;

/// The pipeline stage.
pub struct Model {
    slot: Slot,
    scratch: Vec<f64>,
}

impl Model {
    pub fn new(slot: Slot) -> Self {
        Self {
            slot,
            scratch: Vec::new(),
        }
    }
}

impl pipeline::Stage for Model {
    fn name(&self) -> &'static str {
        "model"
    }

    fn run(&mut self, snap: &mut Snapshot) {
        let Some(bound) = self.slot.lock().ok().and_then(|g| g.clone()) else {
            return;
        };
        let t = Instant::now();
        let mut out = Vec::new();
        let mut scored = 0;
        for row in &snap.features {
            scored += u64::from(bound.score(row, &mut self.scratch, &mut out));
        }
        snap.model_entities = scored;
        snap.model_seconds = t.elapsed().as_secs_f64();
        snap.model = Some(bound.info());
        snap.forecasts = out;
    }
}

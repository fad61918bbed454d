//! The per-tick snapshot: the collectors' readings and every stage's product, assembled by
//! the pipeline. The exporter, the JSON API and `probe top` read only this.
use serde::Serialize;

pub use crate::collect::readings::*;
use crate::{features::FeatureRow, model::score, observe::Observation};

#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    /// What the collectors read (serialized inline: the JSON keeps one flat object).
    #[serde(flatten)]
    pub readings: Readings,
    /// This tick's observations of every entity, before the top-K fold.
    pub observations: Vec<Observation>,
    /// This tick's features of every entity (names in docs/features.md).
    pub features: Vec<FeatureRow>,
    /// Observations of entities the feature stage had no room for (cumulative).
    pub features_untracked: u64,
    /// Entities with feature state, and the bytes that state holds.
    pub features_entities: u64,
    pub features_state_bytes: u64,
    /// The spike model's scores of every scored entity (folded peers included).
    pub forecasts: Vec<score::Forecast>,
    /// The model that scored them (None: no model loaded).
    pub model: Option<score::ModelInfo>,
    /// Entities the model stage scored this tick, and how long it took.
    pub model_entities: u64,
    pub model_seconds: f64,
    /// The host's view of its training job, scored (None: no job peer this tick).
    pub job: Option<crate::model::job::JobScores>,
    /// How long each stage of this tick took, in the order they ran.
    pub stages: Vec<StageTime>,
    /// Seconds each stage has taken since the daemon started.
    pub stage_totals: Vec<StageTime>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StageTime {
    pub stage: &'static str,
    pub seconds: f64,
}

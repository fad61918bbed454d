//! Features: per entity, from the observations and burst events of each tick, with bounded
//! memory per entity. The same code runs in the daemon (live) and in `probe features`
//! (offline, replaying a recording), so a model sees in training what it sees in service.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One entity's feature values at one tick. `values` maps a feature name (docs/features.md)
/// to its value; a feature that is not known this tick is absent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FeatureRow {
    pub time_unix: f64,
    pub entity_kind: String,
    pub entity: String,
    pub values: BTreeMap<String, f64>,
}

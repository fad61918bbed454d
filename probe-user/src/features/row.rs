//! One entity's feature values at one tick, and their JSON form.
use std::sync::Arc;

use serde::{ser::SerializeMap as _, Serialize, Serializer};

use super::schema::Schema;

/// One entity's feature values at one tick, in its kind's schema order. NaN is a feature
/// not known this tick; the JSON form leaves it out.
#[derive(Clone, Debug)]
pub struct FeatureRow {
    pub time_unix: f64,
    pub entity_kind: &'static str,
    pub entity: String,
    pub schema: Arc<Schema>,
    pub values: Vec<f64>,
}

impl FeatureRow {
    pub fn get(&self, name: &str) -> Option<f64> {
        let v = *self.values.get(self.schema.index(name)?)?;
        (!v.is_nan()).then_some(v)
    }
}

/// `{"time_unix", "entity_kind", "entity", "values": {name: value}}` (docs/api.md).
impl Serialize for FeatureRow {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Values<'a>(&'a FeatureRow);
        impl Serialize for Values<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let known = self.0.values.iter().filter(|v| v.is_finite()).count();
                let mut m = s.serialize_map(Some(known))?;
                for (name, v) in self.0.schema.names.iter().zip(&self.0.values) {
                    if v.is_finite() {
                        m.serialize_entry(name, v)?;
                    }
                }
                m.end()
            }
        }
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("time_unix", &self.time_unix)?;
        m.serialize_entry("entity_kind", self.entity_kind)?;
        m.serialize_entry("entity", &self.entity)?;
        m.serialize_entry("values", &Values(self))?;
        m.end()
    }
}

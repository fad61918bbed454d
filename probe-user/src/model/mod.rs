//! The spike model: LightGBM text models, scored in Rust each tick (no C++ at run time), and
//! the directory format `probe train` writes and `probe run --model` reads (docs/model.md).
pub mod alarm;
pub mod bundle;
pub mod job;
pub mod lgbm;
pub mod score;

use std::path::Path;

use anyhow::Result;

use crate::{
    features::{schema::Schema, FeatureConfig},
    observe::ENTITY_KINDS,
};
use bundle::{Bundle, MANIFEST};
use score::Bound;

/// The default model, embedded at build time from `probe-user/model/` (`cargo xtask model`).
mod builtin {
    include!(concat!(env!("OUT_DIR"), "/builtin_model.rs"));
}

pub const BUILTIN: &str = "built-in";

/// The built-in model's files, or None when the build has none.
pub fn builtin_bundle() -> Option<Result<Bundle>> {
    let manifest = builtin::FILES.iter().find(|(n, _)| *n == MANIFEST)?.1;
    Some(Bundle::from_parts(BUILTIN, manifest, |file| {
        builtin::FILES
            .iter()
            .find(|(n, _)| *n == file)
            .map(|(_, t)| (*t).to_owned())
            .ok_or_else(|| anyhow::anyhow!("not embedded"))
    }))
}

/// The feature names the daemon produces per entity kind with `cfg`.
pub fn schemas(cfg: &FeatureConfig) -> Vec<(&'static str, Vec<String>)> {
    ENTITY_KINDS
        .iter()
        .map(|k| (*k, Schema::new(k, cfg).names))
        .collect()
}

/// Loads the model in `dir`, or the built-in one, and binds it to the features `cfg` makes.
/// Ok(None): no directory given and no built-in model in this build.
pub fn load(dir: Option<&Path>, cfg: &FeatureConfig) -> Result<Option<Bound>> {
    let bundle = match dir {
        Some(d) => Bundle::load(d)?,
        None => match builtin_bundle() {
            Some(b) => b?,
            None => return Ok(None),
        },
    };
    Bound::bind(bundle, &schemas(cfg)).map(Some)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{features::FeatureRow, observe::PEER};

    /// A model directory written by LightGBM's Python package on probe's peer features
    /// (tests/fixtures/python-model/make.py) loads into the daemon's model stage and scores
    /// each row as Python's `predict` did. Rows without RTT in the shortest window get no
    /// forecast from the stage (its presence gate); the booster still scores them as Python.
    #[test]
    fn a_python_lightgbm_model_scores_as_in_python() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/python-model");
        let cfg = FeatureConfig::default();
        let bound = load(Some(&dir), &cfg).unwrap().unwrap();
        assert_eq!(bound.info().trained_on, "LightGBM's Python package");
        let rows: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("rows.json")).unwrap()).unwrap();
        let schema = Arc::new(Schema::new(PEER, &cfg));
        let (mut scratch, mut worst, mut gated) = (score::Buffers::default(), 0.0f64, 0);
        let want = rows["predict"].as_array().unwrap();
        assert!(want.len() >= 20);
        let names = &bound.bundle.manifest.features[PEER];
        for (row, want) in rows["rows"].as_array().unwrap().iter().zip(want) {
            // The rows are in the model's order; the daemon's rows in its schema's (which
            // may have more features): placed by name, as the stage gathers them back.
            let x: Vec<f64> = row
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap_or(f64::NAN))
                .collect();
            let mut values = vec![f64::NAN; schema.len()];
            for (n, v) in names.iter().zip(&x) {
                values[schema.index(n).unwrap()] = *v;
            }
            let rtt_known = values[schema.index("rtt_p99_mean_5s").unwrap()].is_finite();
            let fr = FeatureRow {
                time_unix: 0.0,
                entity_kind: PEER,
                entity: "10.0.0.2".into(),
                schema: schema.clone(),
                values,
            };
            let mut out = Vec::new();
            bound.score(std::slice::from_ref(&fr), &mut scratch, &mut out);
            let got = if rtt_known {
                assert_eq!(out.len(), 1);
                out[0].spike_probability.unwrap()
            } else {
                assert_eq!(out, []);
                gated += 1;
                bound.bundle.boosters[0].predict(&x)
            };
            worst = worst.max((got - want.as_f64().unwrap()).abs());
        }
        assert!(worst < 1e-9, "max |probe - python| = {worst:e}");
        assert!(
            (1..want.len() / 2).contains(&gated),
            "{gated} rows without RTT"
        );
    }

    #[test]
    fn a_model_for_other_windows_is_refused_when_bound() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/python-model");
        let cfg = FeatureConfig {
            windows: vec![std::time::Duration::from_secs(10)],
            ..FeatureConfig::default()
        };
        let e = format!("{:#}", load(Some(&dir), &cfg).err().unwrap());
        assert!(e.contains("unknown feature") && !e.contains('\n'), "{e}");
    }
}

#[cfg(test)]
mod builtin_tests {
    use super::*;

    /// The committed default model loads and binds to the daemon's default features: a
    /// model regenerated with other windows or a damaged file fails here, not at start.
    #[test]
    fn the_builtin_model_loads_with_the_default_features() {
        let b = load(None, &FeatureConfig::default())
            .expect("the built-in model is valid")
            .expect("this build embeds probe-user/model/");
        let i = b.info();
        assert_eq!(i.source, BUILTIN);
        let m = &b.bundle.manifest;
        for t in ["rtt_spike", "rtt_p99", "throughput"] {
            assert!(
                m.models.iter().any(|e| e.target == t),
                "the built-in model has no {t} model"
            );
        }
        // Small enough to commit and to embed.
        let bytes: usize = builtin::FILES.iter().map(|(_, t)| t.len()).sum();
        assert!(bytes < 600 << 10, "the built-in model is {bytes} bytes");
    }
}

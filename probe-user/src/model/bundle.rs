//! A model directory: `manifest.json` (what each model is for, its threshold, the data it
//! saw) and one LightGBM text model per (entity kind, target, horizon). Loading checks
//! everything it can before a model may serve: a bad directory is one clear error.
use std::{collections::BTreeMap, path::Path};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

use super::lgbm::{Booster, Objective};

pub const MANIFEST: &str = "manifest.json";
pub const FORMAT: u32 = 1;

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Probability that the target's event starts within the horizon.
    Classifier,
    /// The target's value at t + horizon.
    Regressor,
}

/// One model of the directory.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Entry {
    /// The LightGBM text model, relative to the directory.
    pub file: String,
    pub entity_kind: String,
    /// rtt_spike, retrans_storm, queue_overflow, iteration_slowdown (classifiers); rtt_p99,
    /// throughput (regressors). `iteration_slowdown` is a peer classifier: the training
    /// job's iteration period rises to >= 1.3x its calm level within the horizon.
    pub target: String,
    /// As in the feature and label names ("5s").
    pub horizon: String,
    pub horizon_s: f64,
    pub task: Task,
    /// Classifiers: the probability at and above which the model alarms. With a
    /// `calibration` it is in the calibrated space (compared with
    /// [`Entry::probability`], not with the booster's raw output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    /// Classifiers: consecutive ticks at or above the threshold before the alarm is up
    /// (`model::alarm`; absent: 1, every tick at or above it).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub alarm_for_ticks: u32,
    /// Classifiers: Platt scaling of the booster's probability (absent: served as is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
    /// Regressors predict ln(eps + future) - ln(eps + base), base the sum of these
    /// features now: a forecast relative to the present generalises across links.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub base: Vec<String>,
    #[serde(default)]
    pub eps: f64,
    /// Held-out figures from training (informative).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub metrics: serde_json::Value,
}

/// Platt scaling on the logit of a classifier's raw probability:
/// p = 1 / (1 + exp(-(a * logit(raw) + b))), raw clamped to [1e-12, 1 - 1e-12]. `a > 0`
/// keeps the order of scores.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    pub a: f64,
    pub b: f64,
}

/// The log-odds of a probability, clamped away from 0 and 1 (`probe train` fits the
/// calibration on the same).
pub fn logit(p: f64) -> f64 {
    let r = p.clamp(1e-12, 1.0 - 1e-12);
    r.ln() - (-r).ln_1p()
}

pub fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

impl Calibration {
    /// The calibrated probability of the booster's raw probability `raw`.
    pub fn apply(&self, raw: f64) -> f64 {
        sigmoid(self.a * logit(raw) + self.b)
    }

    /// Why it cannot serve, if it cannot.
    fn fault(&self) -> Option<String> {
        if !(self.a.is_finite() && self.b.is_finite()) {
            Some(format!(
                "calibration a={} b={} is not finite",
                self.a, self.b
            ))
        } else if self.a <= 0.0 {
            Some(format!(
                "calibration a={} is not positive (it must keep the order of scores)",
                self.a
            ))
        } else {
            None
        }
    }
}

/// "Now" for a regressor: the sum of its base features' known values (None when none is
/// known). The daemon, `probe train` and `probe eval` all take it from here.
pub fn base_now(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| Some(acc.unwrap_or(0.0) + v))
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Entry {
    /// A classifier's alarm rule; None for a regressor.
    pub fn alarm_rule(&self) -> Option<super::alarm::Rule> {
        Some(super::alarm::Rule {
            threshold: self.threshold?,
            for_ticks: self.alarm_for_ticks,
        })
    }

    /// A classifier's probability from the booster's raw probability: calibrated when the
    /// manifest gives a calibration, else `raw`.
    pub fn probability(&self, raw: f64) -> f64 {
        match &self.calibration {
            Some(c) => c.apply(raw),
            None => raw,
        }
    }

    /// The forecast from the regressor's output and the base value now.
    pub fn forecast(&self, raw: f64, base: f64) -> f64 {
        ((self.eps + base) * raw.exp() - self.eps).max(0.0)
    }

    /// The regression target from the future value and the base now.
    pub fn target_of(&self, future: f64, base: f64) -> f64 {
        (self.eps + future).ln() - (self.eps + base).ln()
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Manifest {
    pub format: u32,
    pub name: String,
    /// One line for `probe_model_info{trained_on}`.
    pub trained_on: String,
    pub probe_version: String,
    /// Feature windows the models need (`[features] windows` must produce them).
    pub windows: Vec<String>,
    pub horizons: Vec<String>,
    /// Per entity kind: the feature names, in the order every model of that kind reads them.
    pub features: BTreeMap<String, Vec<String>>,
    pub models: Vec<Entry>,
    /// Baseline thresholds chosen on the same validation data as the models' thresholds,
    /// per "{target}_{horizon}" and baseline.
    #[serde(default)]
    pub baselines: BTreeMap<String, BTreeMap<String, f64>>,
    /// The baselines' alarm holds (model::alarm), chosen with their thresholds the way the
    /// models' are (absent: 1 tick).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub baseline_holds: BTreeMap<String, BTreeMap<String, u32>>,
    /// What the models saw: files, recordings, rows per split.
    #[serde(default)]
    pub data: serde_json::Value,
}

/// A parsed, checked model directory (not yet bound to the daemon's feature schemas).
#[derive(Debug, Clone)]
pub struct Bundle {
    pub manifest: Manifest,
    /// Where it came from: a directory, or "built-in".
    pub source: String,
    /// One per manifest entry, same order.
    pub boosters: Vec<Booster>,
}

impl Bundle {
    /// Reads and checks the directory `dir`.
    pub fn load(dir: &Path) -> Result<Bundle> {
        let d = dir.display();
        if !dir.is_dir() {
            bail!("model {d}: not a directory");
        }
        let text = std::fs::read_to_string(dir.join(MANIFEST))
            .with_context(|| format!("model {d}: cannot read {MANIFEST}"))?;
        let source = d.to_string();
        Self::from_parts(&source, &text, |file| {
            let p = dir.join(file);
            std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))
        })
    }

    /// Parses a manifest and its models (`read` returns a model file's text).
    pub fn from_parts(
        source: &str,
        manifest: &str,
        mut read: impl FnMut(&str) -> Result<String>,
    ) -> Result<Bundle> {
        let m: Manifest = serde_json::from_str(manifest)
            .map_err(|e| anyhow::anyhow!("model {source}: {MANIFEST} is malformed: {e}"))?;
        if m.format != FORMAT {
            bail!(
                "model {source}: manifest format {} (this probe reads {FORMAT})",
                m.format
            );
        }
        if m.models.is_empty() {
            bail!("model {source}: the manifest lists no models");
        }
        let mut boosters = Vec::with_capacity(m.models.len());
        for e in &m.models {
            let what = format!("model {source}: {}", e.file);
            if e.file.contains('/') || e.file.contains("..") {
                bail!("{what}: model files must sit in the directory itself");
            }
            let b =
                Booster::parse(&read(&e.file).map_err(|err| anyhow::anyhow!("{what}: {err:#}"))?)
                    .map_err(|err| anyhow::anyhow!("{what}: {err:#}"))?;
            check(&m, e, &b).map_err(|err| anyhow::anyhow!("{what}: {err}"))?;
            boosters.push(b);
        }
        Ok(Bundle {
            manifest: m,
            source: source.to_owned(),
            boosters,
        })
    }

    /// `probe_model_info{features}`: how many distinct features the models read.
    pub fn feature_count(&self) -> usize {
        self.manifest.features.values().map(Vec::len).sum()
    }
}

/// One model against its manifest entry.
fn check(m: &Manifest, e: &Entry, b: &Booster) -> std::result::Result<(), String> {
    let Some(names) = m.features.get(&e.entity_kind) else {
        return Err(format!(
            "the manifest lists no features for entity kind {:?}",
            e.entity_kind
        ));
    };
    if b.feature_names != *names {
        let n = b.feature_names.len();
        return Err(
            match b.feature_names.iter().zip(names).position(|(a, b)| a != b) {
                Some(i) => format!(
                "feature {i} is {:?} in the model but {:?} in the manifest (wrong feature list)",
                b.feature_names[i], names[i]
            ),
                None => format!(
                    "the model reads {n} features, the manifest lists {} (wrong feature count)",
                    names.len()
                ),
            },
        );
    }
    if b.num_features() != names.len() {
        return Err(format!(
            "the model's trees read {} features but it names {} (wrong feature count)",
            b.num_features(),
            names.len()
        ));
    }
    if !(e.horizon_s.is_finite() && e.horizon_s > 0.0) {
        return Err(format!(
            "horizon_s {} is not a positive number",
            e.horizon_s
        ));
    }
    match e.task {
        Task::Classifier => {
            if !matches!(
                b.objective,
                Objective::Binary { .. } | Objective::CrossEntropy
            ) {
                return Err(format!(
                    "a classifier needs a binary objective, not {:?}",
                    b.objective
                ));
            }
            match e.threshold {
                Some(t) if (0.0..=1.0).contains(&t) => {}
                t => return Err(format!("threshold {t:?} is not a probability")),
            }
            if !(1..=600).contains(&e.alarm_for_ticks) {
                return Err(format!(
                    "alarm_for_ticks {} is not between 1 and 600",
                    e.alarm_for_ticks
                ));
            }
            if let Some(f) = e.calibration.as_ref().and_then(Calibration::fault) {
                return Err(f);
            }
        }
        Task::Regressor => {
            if e.calibration.is_some() {
                return Err("a regressor takes no calibration".into());
            }
            if e.base.is_empty() || !(e.eps.is_finite() && e.eps > 0.0) {
                return Err("a regressor needs base features and eps > 0".into());
            }
            if let Some(f) = e.base.iter().find(|f| !names.contains(f)) {
                return Err(format!(
                    "base feature {f:?} is not among the model's features"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A LightGBM 4.7 binary model from its Python package (60 features `Column_i`).
    fn model_text() -> String {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lgbm/a_binary.txt");
        std::fs::read_to_string(p).unwrap()
    }

    fn manifest(names: usize, threshold: &str) -> String {
        let names: Vec<String> = (0..names).map(|i| format!("Column_{i}")).collect();
        format!(
            r#"{{"format": 1, "name": "t", "trained_on": "fixtures", "probe_version": "0",
                "windows": ["5s"], "horizons": ["5s"], "features": {{"peer": {}}},
                "models": [{{"file": "m.txt", "entity_kind": "peer", "target": "rtt_spike",
                  "horizon": "5s", "horizon_s": 5.0, "task": "classifier", "threshold": {threshold}}}]}}"#,
            serde_json::to_string(&names).unwrap()
        )
    }

    fn load(manifest: &str, model: &str) -> Result<Bundle> {
        Bundle::from_parts("t", manifest, |_| Ok(model.to_owned()))
    }

    /// The error as the daemon prints it: one line.
    fn err(r: Result<Bundle>) -> String {
        let e = format!("{:#}", r.expect_err("the bundle should be refused"));
        assert!(!e.contains('\n'), "not one line: {e}");
        e
    }

    #[test]
    fn a_good_bundle_loads() {
        let b = load(&manifest(60, "0.4"), &model_text()).unwrap();
        assert_eq!(b.boosters.len(), 1);
        assert_eq!(b.feature_count(), 60);
    }

    #[test]
    fn a_truncated_model_is_refused() {
        let t = model_text();
        let e = err(load(&manifest(60, "0.4"), &t[..t.len() / 2]));
        assert!(e.contains("m.txt"), "{e}");
    }

    #[test]
    fn a_wrong_feature_list_or_count_is_refused() {
        let m = manifest(60, "0.4").replace("\"Column_7\"", "\"rtt_p99_last\"");
        let e = err(load(&m, &model_text()));
        assert!(
            e.contains("wrong feature list") && e.contains("rtt_p99_last"),
            "{e}"
        );
        let e = err(load(&manifest(59, "0.4"), &model_text()));
        assert!(e.contains("wrong feature count"), "{e}");
    }

    #[test]
    fn nan_thresholds_are_refused() {
        // In a tree: LightGBM never writes one; a damaged file may.
        let t = model_text();
        let line = t.lines().find(|l| l.starts_with("threshold=")).unwrap();
        let bad = line.replacen(line.split(' ').nth(1).unwrap_or("x"), "nan", 1);
        let e = err(load(&manifest(60, "0.4"), &t.replacen(line, &bad, 1)));
        assert!(e.to_lowercase().contains("nan"), "{e}");
        // In the manifest: JSON has no NaN; an out-of-range threshold is named.
        err(load(&manifest(60, "NaN"), &t));
        let e = err(load(&manifest(60, "1.5"), &t));
        assert!(e.contains("threshold"), "{e}");
    }

    #[test]
    fn an_empty_or_missing_directory_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let e = format!("{:#}", Bundle::load(d.path()).unwrap_err());
        assert!(e.contains("manifest.json") && !e.contains('\n'), "{e}");
        let e = format!("{:#}", Bundle::load(&d.path().join("nope")).unwrap_err());
        assert!(e.contains("not a directory"), "{e}");
    }

    #[test]
    fn a_model_file_outside_the_directory_is_refused() {
        let m = manifest(60, "0.4").replace("\"m.txt\"", "\"../m.txt\"");
        assert!(err(load(&m, &model_text())).contains("directory itself"));
    }

    #[test]
    fn identity_calibration_is_raw_and_any_calibration_is_monotone() {
        let id = Calibration { a: 1.0, b: 0.0 };
        for raw in [1e-9, 0.01, 0.2, 0.5, 0.73, 0.99, 1.0 - 1e-9] {
            assert!(
                (id.apply(raw) - raw).abs() < 1e-12,
                "{raw}: {}",
                id.apply(raw)
            );
        }
        for c in [
            id,
            Calibration { a: 0.3, b: -2.0 },
            Calibration { a: 4.0, b: 1.5 },
        ] {
            let mut last = -1.0;
            for i in 0..=1000 {
                let p = c.apply(f64::from(i) / 1000.0);
                assert!(p.is_finite() && (0.0..=1.0).contains(&p), "{c:?}: {p}");
                assert!(p >= last, "{c:?} is not monotone at {i}");
                last = p;
            }
        }
        // Entry::probability: calibrated when given, raw when not.
        let b = load(&manifest(60, "0.4"), &model_text()).unwrap();
        let mut e = b.manifest.models[0].clone();
        assert_eq!(e.calibration, None);
        assert_eq!(e.probability(0.37), 0.37);
        e.calibration = Some(Calibration { a: 2.0, b: -1.0 });
        assert_eq!(
            e.probability(0.37),
            Calibration { a: 2.0, b: -1.0 }.apply(0.37)
        );
        assert!(e.probability(0.37) < 0.37);
    }

    fn calibrated(cal: &str) -> String {
        manifest(60, "0.4").replace(
            r#""threshold": 0.4"#,
            &format!(r#""threshold": 0.4, "calibration": {cal}"#),
        )
    }

    #[test]
    fn a_calibrated_classifier_loads_and_round_trips() {
        let b = load(&calibrated(r#"{"a": 0.8, "b": -0.25}"#), &model_text()).unwrap();
        let e = &b.manifest.models[0];
        assert_eq!(e.calibration, Some(Calibration { a: 0.8, b: -0.25 }));
        let back = serde_json::to_string(&b.manifest).unwrap();
        assert!(
            back.contains(r#""calibration":{"a":0.8,"b":-0.25}"#),
            "{back}"
        );
        // Without one, nothing is written.
        let b = load(&manifest(60, "0.4"), &model_text()).unwrap();
        assert!(!serde_json::to_string(&b.manifest)
            .unwrap()
            .contains("calibration"));
    }

    #[test]
    fn bad_calibrations_are_refused() {
        let t = model_text();
        for (cal, fault) in [
            (r#"{"a": 0.0, "b": 0.0}"#, "not positive"),
            (r#"{"a": -1.0, "b": 0.0}"#, "not positive"),
        ] {
            let e = err(load(&calibrated(cal), &t));
            assert!(e.contains("m.txt") && e.contains(fault), "{e}");
        }
        // JSON has no NaN or infinity: such a number does not parse.
        let e = err(load(&calibrated(r#"{"a": 1e999, "b": 0.0}"#), &t));
        assert!(e.contains("malformed"), "{e}");
        for c in [
            Calibration {
                a: f64::NAN,
                b: 0.0,
            },
            Calibration {
                a: 1.0,
                b: f64::INFINITY,
            },
        ] {
            assert!(c.fault().unwrap().contains("not finite"), "{c:?}");
        }
        assert_eq!(Calibration { a: 1.0, b: 0.0 }.fault(), None);
        // On a regressor.
        let m = calibrated(r#"{"a": 1.0, "b": 0.0}"#).replace(
            r#""task": "classifier""#,
            r#""task": "regressor", "base": ["Column_0"], "eps": 1.0"#,
        );
        let e = err(load(&m, &t));
        assert!(e.contains("regressor takes no calibration"), "{e}");
        assert!(load(
            &m.replace(r#", "calibration": {"a": 1.0, "b": 0.0}"#, ""),
            &t
        )
        .is_ok());
    }
}

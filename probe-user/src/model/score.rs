//! The model stage: after the features, every entity of a kind the model knows is scored by
//! every model of that kind, each tick, where there is a signal: a model whose presence
//! feature is not known this tick (a peer without RTT samples, an idle interface) makes no
//! forecast for the entity. Folded peers are scored too (the export drops their series, the
//! JSON keeps them).
use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use rustc_hash::FxHashMap;
use serde::Serialize;

use super::{
    alarm,
    bundle::{base_now, Bundle, Task},
};
use crate::{
    features::FeatureRow,
    observe::{INTERFACE, PEER},
};

/// One score of one entity: a spike probability, or a forecast.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Forecast {
    pub entity_kind: &'static str,
    /// Shared by the entity's forecasts (one allocation per entity and tick, not per model).
    pub entity: Arc<str>,
    pub target: Arc<str>,
    pub horizon_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spike_probability: Option<f64>,
    /// The model's threshold: the model alarms once the probability has been at or above
    /// it for its alarm rule's ticks in a row (`alarm`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    /// Classifiers: whether the alarm is up (model::alarm: the threshold held for the
    /// model's `alarm_for_ticks`). The one alarm of rules, dashboard and `probe top`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alarm: Option<bool>,
    /// The rule `alarm` follows (the model stage keeps each entity's run of ticks).
    #[serde(skip)]
    pub rule: Option<alarm::Rule>,
    /// The model's entry in its bundle (what keys the alarm's run of ticks).
    #[serde(skip)]
    pub entry: usize,
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
    models: Vec<BoundModel>,
}

/// One model of a kind.
struct BoundModel {
    /// Index into the bundle's entries.
    entry: usize,
    /// The entry's target, shared by its forecasts.
    target: Arc<str>,
    /// Base feature indices, in the model's input order.
    base: Vec<usize>,
    presence: Presence,
}

/// What must be known this tick for a model to score an entity: indices into the daemon's
/// feature row (not the model's input), resolved once when the bundle is bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presence {
    /// No gate (a target this probe has no rule for, or a schema without the feature).
    Always,
    /// The feature is known (finite).
    Known(usize),
    /// Either feature is known.
    EitherKnown(usize, usize),
    /// The feature is known and above 0.
    Positive(usize),
}

impl Presence {
    /// The gate of `target` for entities of `kind` whose rows are laid out as `schema`:
    /// - peer rtt_spike, retrans_storm, iteration_slowdown, rtt_p99: RTT samples in the
    ///   shortest window (`rtt_p99_mean_<W>` known);
    /// - throughput: traffic seen in the shortest window (`tx_bytes_mean_<W>` or
    ///   `rx_bytes_mean_<W>` known);
    /// - interface queue_overflow: the interface sent in the shortest window
    ///   (`tx_bytes_mean_<W>` known and > 0).
    fn resolve(kind: &str, target: &str, schema: &[String]) -> Presence {
        let at = |signal: &str| shortest_mean(schema, signal);
        let gate = match (kind, target) {
            (PEER, "rtt_spike" | "retrans_storm" | "iteration_slowdown" | "rtt_p99") => {
                at("rtt_p99").map(Presence::Known)
            }
            (_, "throughput") => match (at("tx_bytes"), at("rx_bytes")) {
                (Some(t), Some(r)) => Some(Presence::EitherKnown(t, r)),
                (Some(i), None) | (None, Some(i)) => Some(Presence::Known(i)),
                (None, None) => None,
            },
            (INTERFACE, "queue_overflow") => at("tx_bytes").map(Presence::Positive),
            _ => None,
        };
        gate.unwrap_or(Presence::Always)
    }

    fn holds(self, values: &[f64]) -> bool {
        let known = |i: usize| values.get(i).is_some_and(|v| v.is_finite());
        match self {
            Presence::Always => true,
            Presence::Known(i) => known(i),
            Presence::EitherKnown(i, j) => known(i) || known(j),
            Presence::Positive(i) => values.get(i).is_some_and(|v| v.is_finite() && *v > 0.0),
        }
    }
}

/// Where `{signal}_mean_<W>` sits in `schema`, W the shortest window it has.
fn shortest_mean(schema: &[String], signal: &str) -> Option<usize> {
    let prefix = format!("{signal}_mean_");
    schema
        .iter()
        .enumerate()
        .filter_map(|(i, n)| Some((window(n.strip_prefix(&prefix)?)?, i)))
        .min()
        .map(|(_, i)| i)
}

/// A window's label (`schema::label`: `5s`, `500ms`) back to milliseconds.
fn window(label: &str) -> Option<u64> {
    let d = crate::duration::parse_duration(label).ok()?;
    u64::try_from(d.as_millis()).ok()
}

impl Bound {
    /// Checks the bundle against the schemas the daemon produces (`names` of each kind):
    /// every feature a model reads must exist. Each model's presence gate is resolved here,
    /// against the kind's schema.
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
                .map(|(entry, e)| BoundModel {
                    entry,
                    target: e.target.as_str().into(),
                    base: e
                        .base
                        .iter()
                        .filter_map(|b| names.iter().position(|n| n == b))
                        .collect(),
                    presence: Presence::resolve(kind, &e.target, schema),
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

    /// Scores a tick's feature rows into `out`, row after row and each row's models in
    /// bundle order; returns how many rows were of a kind with models. A model whose
    /// presence feature is not known in a row adds nothing for it. Each model scores all
    /// its rows at once (`Booster::predict_many`), which keeps its trees in cache.
    pub fn score(&self, rows: &[FeatureRow], buf: &mut Buffers, out: &mut Vec<Forecast>) -> u64 {
        let Buffers {
            gathered,
            members,
            preds,
            batch,
            scored,
        } = buf;
        gathered.clear();
        preds.clear();
        scored.clear();
        scored.resize(rows.len(), None);
        for (ki, k) in self.kinds.iter().enumerate() {
            members.clear();
            // A schema other than the one bound (cannot happen within one daemon): skipped.
            members.extend((0..rows.len()).filter(|&i| {
                rows[i].entity_kind == k.kind && rows[i].schema.names.len() == k.schema.len()
            }));
            let nm = k.models.len();
            for &i in members.iter() {
                let at = k.gather.as_ref().map(|g| {
                    let at = gathered.len();
                    gathered.extend(g.iter().map(|&j| rows[i].values[j]));
                    at
                });
                scored[i] = Some(Scored {
                    kind: ki,
                    preds: preds.len(),
                    input: at,
                });
                preds.resize(preds.len() + nm, None);
            }
            for (mi, m) in k.models.iter().enumerate() {
                let (held, xs): (Vec<usize>, Vec<&[f64]>) = members
                    .iter()
                    .filter(|&&i| m.presence.holds(&rows[i].values))
                    .map(|&i| {
                        let s = scored[i].as_ref().expect("a member");
                        (i, s.model_input(k, gathered, &rows[i]))
                    })
                    .unzip();
                batch.clear();
                batch.resize(xs.len(), 0.0);
                self.bundle.boosters[m.entry].predict_many(&xs, batch);
                for (&i, &p) in held.iter().zip(batch.iter()) {
                    let at = scored[i].as_ref().expect("a member").preds + mi;
                    preds[at] = Some(p);
                }
            }
        }
        let mut entities = 0;
        for (i, s) in scored.iter().enumerate() {
            let Some(s) = s else { continue };
            entities += 1;
            let k = &self.kinds[s.kind];
            let x = s.model_input(k, gathered, &rows[i]);
            self.forecasts(
                &rows[i],
                k,
                &preds[s.preds..s.preds + k.models.len()],
                x,
                out,
            );
        }
        entities
    }

    /// The forecasts of one row from its models' predictions (None: presence not held)
    /// and its model input `x`.
    fn forecasts(
        &self,
        row: &FeatureRow,
        k: &KindModels,
        preds: &[Option<f64>],
        x: &[f64],
        out: &mut Vec<Forecast>,
    ) {
        let mut entity: Option<Arc<str>> = None;
        for (m, p) in k.models.iter().zip(preds) {
            let Some(p) = *p else { continue };
            let e = &self.bundle.manifest.models[m.entry];
            let mut f = Forecast {
                entity_kind: row.entity_kind,
                entity: entity
                    .get_or_insert_with(|| row.entity.as_str().into())
                    .clone(),
                target: m.target.clone(),
                horizon_s: e.horizon_s,
                spike_probability: None,
                threshold: None,
                alarm: None,
                rule: None,
                entry: m.entry,
                rtt_forecast_s: None,
                throughput_forecast_bytes_per_s: None,
            };
            match e.task {
                Task::Classifier => {
                    f.spike_probability = Some(e.probability(p)).filter(|p| p.is_finite());
                    f.threshold = e.threshold;
                    f.rule = e.alarm_rule();
                }
                Task::Regressor => {
                    let Some(now) = base_now(m.base.iter().map(|&j| x[j])) else {
                        continue;
                    };
                    let v = Some(e.forecast(p, now)).filter(|v| v.is_finite());
                    match e.target.as_str() {
                        "rtt_p99" => f.rtt_forecast_s = v,
                        _ => f.throughput_forecast_bytes_per_s = v,
                    }
                }
            }
            out.push(f);
        }
    }
}

/// Where a scored row's inputs and predictions are (`Bound::score`).
#[derive(Clone, Copy)]
struct Scored {
    /// Its kind among `Bound::kinds`.
    kind: usize,
    /// Where its models' predictions start in `Buffers::preds`.
    preds: usize,
    /// Where its gathered input starts in `Buffers::gathered` (None: the row's values).
    input: Option<usize>,
}

impl Scored {
    /// The row's input in its models' feature order: gathered, or the row's values.
    fn model_input<'a>(
        &self,
        k: &KindModels,
        gathered: &'a [f64],
        row: &'a FeatureRow,
    ) -> &'a [f64] {
        match (self.input, &k.gather) {
            (Some(at), Some(g)) => &gathered[at..at + g.len()],
            _ => &row.values,
        }
    }
}

/// The model stage's buffers, kept from tick to tick.
#[derive(Default)]
pub struct Buffers {
    gathered: Vec<f64>,
    /// The rows of the kind being scored.
    members: Vec<usize>,
    /// Per scored row and model of its kind: the prediction, None where the model's
    /// presence feature was not known.
    preds: Vec<Option<f64>>,
    /// One model's predictions.
    batch: Vec<f64>,
    /// Per row.
    scored: Vec<Option<Scored>>,
}

/// Where `probe run` keeps the model that serves; SIGHUP swaps it.
pub type Slot = Arc<Mutex<Option<Arc<Bound>>>>;

/// The pipeline stage.
pub struct Model {
    slot: Slot,
    buffers: Buffers,
    /// Each alarm's ticks in a row at or above its threshold, as of the last tick: an
    /// entity or model not scored this tick starts again from zero.
    streaks: FxHashMap<AlarmKey, u32>,
    /// Last tick's map, emptied, kept for its room.
    spare: FxHashMap<AlarmKey, u32>,
    /// The model whose bundle entries key `streaks`.
    scored_by: Option<Arc<Bound>>,
}

impl Model {
    pub fn new(slot: Slot) -> Self {
        Self {
            slot,
            buffers: Buffers::default(),
            streaks: FxHashMap::default(),
            spare: FxHashMap::default(),
            scored_by: None,
        }
    }
}

/// Which alarm a run of ticks belongs to: entity kind, entity, the model's bundle entry
/// (a swapped model starts every run again: `Model::score` clears them).
type AlarmKey = (&'static str, Arc<str>, usize);

/// What the model stage made of one tick.
#[derive(Debug)]
pub struct Scores {
    /// The scores of every scored entity.
    pub forecasts: Vec<Forecast>,
    /// The model that scored them.
    pub model: ModelInfo,
    /// Entities scored, and how long it took.
    pub entities: u64,
    pub seconds: f64,
}

impl Model {
    /// Scores this tick's feature rows; None while no model is loaded.
    pub fn score(&mut self, rows: &[FeatureRow]) -> Option<Scores> {
        let bound = self.slot.lock().ok().and_then(|g| g.clone())?;
        let t = Instant::now();
        if !self
            .scored_by
            .as_ref()
            .is_some_and(|b| Arc::ptr_eq(b, &bound))
        {
            self.streaks.clear();
            self.scored_by = Some(bound.clone());
        }
        let mut forecasts = Vec::new();
        let entities = bound.score(rows, &mut self.buffers, &mut forecasts);
        self.alarms(&mut forecasts);
        Some(Scores {
            forecasts,
            model: bound.info(),
            entities,
            seconds: t.elapsed().as_secs_f64(),
        })
    }
}

impl Model {
    /// Steps each classifier's alarm rule with this tick's probability.
    fn alarms(&mut self, forecasts: &mut [Forecast]) {
        let mut before = std::mem::replace(&mut self.streaks, std::mem::take(&mut self.spare));
        for f in forecasts {
            let (Some(rule), Some(p)) = (f.rule, f.spike_probability) else {
                continue;
            };
            let key = (f.entity_kind, f.entity.clone(), f.entry);
            let mut streak = before.remove(&key).unwrap_or(0);
            f.alarm = Some(rule.step(&mut streak, p));
            self.streaks.insert(key, streak);
        }
        // What was not scored this tick starts again from zero.
        before.clear();
        self.spare = before;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        features::{schema::Schema, FeatureConfig},
        model::bundle::Calibration,
    };

    /// A LightGBM text model of one leaf: it reads `names` and always says `leaf`.
    fn constant_model(names: &[String], objective: &str, leaf: f64) -> String {
        let n = names.len();
        format!(
            "tree\nversion=v4\nnum_class=1\nnum_tree_per_iteration=1\nlabel_index=0\n\
             max_feature_idx={}\nobjective={objective}\nfeature_names={}\nfeature_infos={}\n\n\
             Tree=0\nnum_leaves=1\nnum_cat=0\nsplit_feature=\nsplit_gain=\nthreshold=\n\
             decision_type=\nleft_child=\nright_child=\nleaf_value={leaf}\nleaf_weight=\n\
             leaf_count=10\ninternal_value=\ninternal_weight=\ninternal_count=\nis_linear=0\n\
             shrinkage=1\n\n\nend of trees\n",
            n - 1,
            names.join(" "),
            vec!["none"; n].join(" ")
        )
    }

    const LEAF: f64 = -1.0;
    const CAL: Calibration = Calibration { a: 2.0, b: 0.5 };

    /// Peer and interface models of every target on the default schemas.
    fn bound() -> Bound {
        let cfg = FeatureConfig::default();
        let schemas = crate::model::schemas(&cfg);
        let names = |k: &str| schemas.iter().find(|(n, _)| *n == k).unwrap().1.clone();
        let (peer, iface) = (names(PEER), names(INTERFACE));
        let classifier = |kind: &str, target: &str, cal: &str| {
            format!(
                r#"{{"file": "{kind}-{target}.txt", "entity_kind": "{kind}", "target": "{target}",
                    "horizon": "5s", "horizon_s": 5.0, "task": "classifier", "threshold": 0.5{cal}}}"#
            )
        };
        let regressor = |target: &str, base: &str, eps: f64| {
            format!(
                r#"{{"file": "peer-{target}.txt", "entity_kind": "peer", "target": "{target}",
                    "horizon": "5s", "horizon_s": 5.0, "task": "regressor", "base": {base}, "eps": {eps}}}"#
            )
        };
        let models = [
            classifier(
                PEER,
                "rtt_spike",
                &format!(r#", "calibration": {{"a": {}, "b": {}}}"#, CAL.a, CAL.b),
            ),
            classifier(PEER, "retrans_storm", ""),
            classifier(PEER, "iteration_slowdown", ""),
            classifier(INTERFACE, "queue_overflow", ""),
            regressor("rtt_p99", r#"["rtt_p99_last"]"#, 1e-4),
            regressor(
                "throughput",
                r#"["tx_bytes_last", "rx_bytes_last"]"#,
                1000.0,
            ),
        ];
        let manifest = format!(
            r#"{{"format": 1, "name": "t", "trained_on": "tests", "probe_version": "0",
                "windows": ["5s", "30s", "120s"], "horizons": ["5s"],
                "features": {{"peer": {}, "interface": {}}}, "models": [{}]}}"#,
            serde_json::to_string(&peer).unwrap(),
            serde_json::to_string(&iface).unwrap(),
            models.join(",")
        );
        let bundle = Bundle::from_parts("t", &manifest, |file| {
            Ok(match file {
                f if f.starts_with("interface-") => {
                    constant_model(&iface, "binary sigmoid:1", LEAF)
                }
                "peer-rtt_p99.txt" | "peer-throughput.txt" => {
                    constant_model(&peer, "regression", 0.0)
                }
                _ => constant_model(&peer, "binary sigmoid:1", LEAF),
            })
        })
        .unwrap();
        Bound::bind(bundle, &schemas).unwrap()
    }

    /// A row of `kind` with only `known` known.
    fn row(kind: &'static str, known: &[(&str, f64)]) -> FeatureRow {
        let schema = Arc::new(Schema::new(kind, &FeatureConfig::default()));
        let mut values = vec![f64::NAN; schema.len()];
        for (n, v) in known {
            values[schema.index(n).unwrap()] = *v;
        }
        FeatureRow {
            time_unix: 0.0,
            entity_kind: kind,
            entity: "e".into(),
            schema,
            values,
        }
    }

    fn targets(b: &Bound, r: &FeatureRow) -> Vec<String> {
        let mut out = Vec::new();
        assert_eq!(
            b.score(std::slice::from_ref(r), &mut Buffers::default(), &mut out),
            1
        );
        let mut t: Vec<String> = out.into_iter().map(|f| f.target.to_string()).collect();
        t.sort();
        t
    }

    const TRAFFIC: &[(&str, f64)] = &[
        ("tx_bytes_last", 1e6),
        ("rx_bytes_last", 2e5),
        ("tx_bytes_mean_5s", 1e6),
        ("rx_bytes_mean_5s", 2e5),
    ];

    #[test]
    fn the_alarm_is_up_once_the_threshold_held_for_its_ticks() {
        let mut b = bound();
        // retrans_storm's constant probability (sigmoid(-1) = 0.27) is above 0.2; its alarm
        // needs 3 ticks of it.
        for e in &mut b.bundle.manifest.models {
            if e.target == "retrans_storm" {
                e.threshold = Some(0.2);
                e.alarm_for_ticks = 3;
            }
        }
        let b = Arc::new(b);
        let slot: Slot = Arc::new(Mutex::new(Some(b.clone())));
        let mut m = Model::new(slot.clone());
        let rtt = row(PEER, &[("rtt_p99_mean_5s", 0.001)]);
        let alarm = |m: &mut Model, rows: &[FeatureRow]| {
            m.score(rows)
                .unwrap()
                .forecasts
                .iter()
                .find(|f| &*f.target == "retrans_storm")
                .map(|f| f.alarm)
        };
        assert_eq!(alarm(&mut m, std::slice::from_ref(&rtt)), Some(Some(false)));
        assert_eq!(alarm(&mut m, std::slice::from_ref(&rtt)), Some(Some(false)));
        assert_eq!(alarm(&mut m, std::slice::from_ref(&rtt)), Some(Some(true)));
        // A tick without the entity's score starts the run again.
        assert_eq!(alarm(&mut m, &[]), None);
        assert_eq!(alarm(&mut m, std::slice::from_ref(&rtt)), Some(Some(false)));
        // A model swapped in (SIGHUP) starts every run again: its entries are other models.
        alarm(&mut m, std::slice::from_ref(&rtt));
        assert_eq!(alarm(&mut m, std::slice::from_ref(&rtt)), Some(Some(true)));
        *slot.lock().unwrap() = Some(Arc::new(
            Bound::bind(
                b.bundle.clone(),
                &crate::model::schemas(&FeatureConfig::default()),
            )
            .unwrap(),
        ));
        assert_eq!(alarm(&mut m, std::slice::from_ref(&rtt)), Some(Some(false)));
        // Below the threshold (rtt_spike, 0.18 < 0.5): never up.
        let f = m.score(std::slice::from_ref(&rtt)).unwrap().forecasts;
        let spike = f.iter().find(|f| &*f.target == "rtt_spike").unwrap();
        assert_eq!(spike.alarm, Some(false));
    }

    #[test]
    fn a_peer_without_rtt_gets_no_rtt_forecast_but_a_throughput_one() {
        let b = bound();
        assert_eq!(targets(&b, &row(PEER, TRAFFIC)), ["throughput"]);
        // Only received traffic is traffic too.
        assert_eq!(
            targets(
                &b,
                &row(PEER, &[("rx_bytes_last", 5.0), ("rx_bytes_mean_5s", 5.0)])
            ),
            ["throughput"]
        );
        // RTT known in a longer window only: not this tick's signal.
        let mut known = TRAFFIC.to_vec();
        known.extend([("rtt_p99_last", 1e-3), ("rtt_p99_mean_30s", 1e-3)]);
        assert_eq!(targets(&b, &row(PEER, &known)), ["throughput"]);
        // Nothing at all: no forecast (the row still counts as one of a scored kind).
        assert_eq!(targets(&b, &row(PEER, &[])), Vec::<String>::new());
    }

    #[test]
    fn a_peer_with_rtt_gets_every_forecast() {
        let b = bound();
        let mut known = TRAFFIC.to_vec();
        known.extend([("rtt_p99_last", 2e-3), ("rtt_p99_mean_5s", 2e-3)]);
        let r = row(PEER, &known);
        assert_eq!(
            targets(&b, &r),
            [
                "iteration_slowdown",
                "retrans_storm",
                "rtt_p99",
                "rtt_spike",
                "throughput"
            ]
        );
        let mut out = Vec::new();
        b.score(std::slice::from_ref(&r), &mut Buffers::default(), &mut out);
        let p = |t: &str| {
            out.iter()
                .find(|f| &*f.target == t)
                .unwrap()
                .spike_probability
                .unwrap()
        };
        // Calibrated where the manifest says so, raw elsewhere.
        let raw = 1.0 / (1.0 + (-LEAF).exp());
        assert!((p("retrans_storm") - raw).abs() < 1e-12);
        assert!((p("rtt_spike") - CAL.apply(raw)).abs() < 1e-12);
        assert!(p("rtt_spike") != p("retrans_storm"));
        let rtt = out.iter().find(|f| &*f.target == "rtt_p99").unwrap();
        assert!((rtt.rtt_forecast_s.unwrap() - 2e-3).abs() < 1e-12);
    }

    #[test]
    fn an_idle_interface_gets_no_queue_forecast() {
        let b = bound();
        let q = |tx: f64| targets(&b, &row(INTERFACE, &[("tx_bytes_mean_5s", tx)]));
        assert_eq!(q(f64::NAN), Vec::<String>::new());
        assert_eq!(q(0.0), Vec::<String>::new());
        assert_eq!(q(1500.0), ["queue_overflow"]);
    }

    #[test]
    fn the_gate_is_the_shortest_window_of_the_schema() {
        let names: Vec<String> = ["rtt_p99_mean_30s", "rtt_p99_mean_500ms", "rtt_p99_mean_2s"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert_eq!(shortest_mean(&names, "rtt_p99"), Some(1));
        assert_eq!(shortest_mean(&names, "tx_bytes"), None);
        assert_eq!(window("120s"), Some(120_000));
        assert_eq!(window("500ms"), Some(500));
        assert_eq!(window("s"), None);
        assert_eq!(window("x5s"), None);
        let cfg = FeatureConfig {
            windows: vec![
                std::time::Duration::from_secs(2),
                std::time::Duration::from_secs(10),
            ],
            ..FeatureConfig::default()
        };
        let peer = Schema::new(PEER, &cfg);
        assert_eq!(
            Presence::resolve(PEER, "rtt_spike", &peer.names),
            Presence::Known(peer.index("rtt_p99_mean_2s").unwrap())
        );
        assert_eq!(
            Presence::resolve(PEER, "throughput", &peer.names),
            Presence::EitherKnown(
                peer.index("tx_bytes_mean_2s").unwrap(),
                peer.index("rx_bytes_mean_2s").unwrap()
            )
        );
        assert_eq!(
            Presence::resolve(PEER, "something_new", &peer.names),
            Presence::Always
        );
    }
}

/// The model stage's cost per scored entity per tick with the built-in model (or the model
/// directory in `MODEL`), on the feature rows of `features::cost` (the bench's shape), in a
/// release build: `cargo test --release -p probe-user scoring_cost -- --ignored --nocapture`.
#[cfg(test)]
mod cost {
    use super::*;
    use crate::features::{
        cost::{tick_inputs, TICKS},
        Engine, FeatureConfig,
    };

    /// The built-in model, and the feature rows of the bench's shape after 40 ticks.
    fn built_in_on_bench_rows() -> (Bound, Vec<FeatureRow>) {
        let cfg = FeatureConfig::default();
        let bound = crate::model::load(None, &cfg).unwrap().unwrap();
        let mut e = Engine::new(cfg);
        let mut rows = Vec::new();
        for t in 0..40 {
            let (now, obs, bursts) = tick_inputs(t);
            rows = e.tick(now, &obs, &bursts);
        }
        (bound, rows)
    }

    /// The stage scores a tick's rows together; each row's forecasts are the ones it gets
    /// scored alone, to the bit and in the same order (the bench's rows: peers with and
    /// without RTT, interfaces, the host).
    #[test]
    fn rows_scored_together_score_as_scored_alone() {
        let (bound, mut rows) = built_in_on_bench_rows();
        // Some peers without RTT in the shortest window: their RTT models are gated.
        let mut gated = 0;
        for r in rows.iter_mut().step_by(5) {
            if let Some(i) = r.schema.index("rtt_p99_mean_5s") {
                r.values[i] = f64::NAN;
                gated += 1;
            }
        }
        assert!(gated > 5);
        let (mut together, mut alone) = (Vec::new(), Vec::new());
        let mut buf = Buffers::default();
        let n = bound.score(&rows, &mut buf, &mut together);
        let mut m = 0;
        for r in &rows {
            m += bound.score(std::slice::from_ref(r), &mut buf, &mut alone);
        }
        assert_eq!(n, m);
        assert!(
            together.len() > rows.len() * 5,
            "{} forecasts",
            together.len()
        );
        let bits = |f: &Forecast| {
            [
                f.spike_probability,
                f.rtt_forecast_s,
                f.throughput_forecast_bytes_per_s,
            ]
            .map(|v| v.map(f64::to_bits))
        };
        assert_eq!(together.len(), alone.len());
        for (a, b) in together.iter().zip(&alone) {
            assert_eq!(
                (&a.entity, &a.target, a.horizon_s),
                (&b.entity, &b.target, b.horizon_s)
            );
            assert_eq!(bits(a), bits(b), "{} {}", a.entity, a.target);
        }
    }

    /// The stage's rows scored together against one at a time, alternating in one process:
    /// `cargo test --release -p probe-user scoring_batch_vs_alone -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, run in release"]
    fn scoring_batch_vs_alone() {
        let (bound, rows) = built_in_on_bench_rows();
        let mut buf = Buffers::default();
        let (mut a, mut b) = (0.0, 0.0);
        for round in 0..40 {
            for alone in [round % 2 == 0, round % 2 == 1] {
                let t = std::time::Instant::now();
                for _ in 0..50 {
                    let mut out = Vec::new();
                    if alone {
                        for r in &rows {
                            bound.score(std::slice::from_ref(r), &mut buf, &mut out);
                        }
                    } else {
                        bound.score(&rows, &mut buf, &mut out);
                    }
                    std::hint::black_box(out);
                }
                let us = t.elapsed().as_secs_f64() * 1e6 / (50 * rows.len()) as f64;
                if alone {
                    a += us
                } else {
                    b += us
                }
            }
        }
        eprintln!(
            "alone {:.2} us, together {:.2} us per row",
            a / 40.0,
            b / 40.0
        );
    }

    #[test]
    #[ignore = "a measurement, run in release"]
    fn scoring_cost() {
        let cfg = FeatureConfig::default();
        let dir = std::env::var_os("MODEL")
            .filter(|d| !d.is_empty())
            .map(std::path::PathBuf::from);
        let bound = crate::model::load(dir.as_deref(), &cfg).unwrap().unwrap();
        let mut stage = Model::new(Arc::new(Mutex::new(Some(Arc::new(bound)))));
        let mut e = Engine::new(cfg);
        let (mut spent, mut entities, mut forecasts) = (0.0, 0, 0);
        for t in 0..TICKS {
            let (now, obs, bursts) = tick_inputs(t);
            let rows = e.tick(now, &obs, &bursts);
            let s = stage.score(&rows).unwrap();
            spent += s.seconds;
            entities += s.entities;
            forecasts += s.forecasts.len();
        }
        eprintln!(
            "model stage: {:.2} us per scored entity per tick ({entities} entities, {forecasts} forecasts, {TICKS} ticks)",
            spent * 1e6 / entities as f64,
        );
    }
}

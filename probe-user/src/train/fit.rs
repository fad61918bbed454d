//! The LightGBM part of `probe train` (the `train` feature): fit, pick thresholds on
//! validation, check the Rust evaluator against LightGBM on the test rows, write the
//! directory.
use std::{collections::BTreeMap, path::Path};

use anyhow::{bail, Context as _, Result};
use lightgbm3::{Booster as Lgbm, Dataset};
use serde_json::json;

use super::{
    bag,
    crossfit::{self, FOLDS},
    split::{split, Part},
    TrainArgs,
};
use crate::{
    dataset::spec::{self, Spec, SPECS},
    dataset::table::FeatureTable,
    eval::{self, metrics, operating},
    features::{schema::Schema, FeatureConfig},
    model::{
        bundle::{Calibration, Entry, Manifest, Task, FORMAT, MANIFEST},
        lgbm::Booster,
    },
};

/// The Rust evaluator must agree with LightGBM to this on every test row.
const MAX_DIFF: f64 = 1e-9;

pub fn main(args: TrainArgs) -> Result<()> {
    if args.out.exists() && !args.force {
        bail!(
            "{} exists; choose another --out or pass --force to overwrite it",
            args.out.display()
        );
    }
    if !(0.01..=0.4).contains(&args.holdout) {
        bail!("--holdout must be between 0.01 and 0.4");
    }
    let table = FeatureTable::read_all(&args.data)?;
    if table.is_empty() {
        bail!("the features tables hold no rows");
    }
    let fcfg = FeatureConfig {
        windows: table.windows()?,
        ..FeatureConfig::default()
    };
    let horizons = table.horizons()?;
    let longest = horizons
        .iter()
        .filter_map(|h| crate::duration::parse_duration(h).ok())
        .max()
        .map_or(0.0, |d| d.as_secs_f64());
    let (parts, split_desc) = split(&table, args.holdout, longest);
    eprintln!("train: {} rows; split {split_desc}", table.len());

    let (models, texts) = fit_all(&args, &table, &parts, &fcfg, &horizons)?;
    let worst_diff = models.worst_diff;
    let manifest = manifest(&args, &table, &fcfg, &horizons, models, &parts, &split_desc)?;
    write_dir(&args.out, &manifest, &texts)?;
    eprintln!(
        "train: {} models -> {} (Rust evaluator vs LightGBM on test rows: max |diff| {worst_diff:.1e})",
        manifest.models.len(),
        args.out.display()
    );
    Ok(())
}

/// Every (model kind, horizon) fitted in turn: the models that pass, and their texts.
fn fit_all(
    args: &TrainArgs,
    table: &FeatureTable,
    parts: &[Part],
    fcfg: &FeatureConfig,
    horizons: &[String],
) -> Result<(Models, Vec<String>)> {
    let jobs: Vec<(&Spec, &String)> = SPECS
        .iter()
        .flat_map(|s| horizons.iter().map(move |h| (s, h)))
        .collect();
    let bar = progress(jobs.len() as u64);
    let mut features: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut entries = Vec::new();
    let mut texts = Vec::new();
    let mut baselines = BTreeMap::new();
    let mut baseline_holds = BTreeMap::new();
    let mut skipped = Vec::new();
    let mut worst_diff = 0.0f64;
    for (s, h) in jobs {
        bar.set_message(s.key(h));
        let names: Vec<String> = Schema::new(s.entity_kind, fcfg)
            .names
            .into_iter()
            .filter(|n| {
                // One feature list per kind: the regressors' base features stay in it.
                args.only.is_empty()
                    || args.only.iter().any(|p| n.contains(p.as_str()))
                    || SPECS
                        .iter()
                        .any(|x| x.entity_kind == s.entity_kind && x.base.contains(&n.as_str()))
            })
            .collect();
        match fit_one(args, table, parts, s, h, &names)? {
            Fitted::Skipped(why) => {
                say(&bar, format!("train: {} skipped: {why}", s.key(h)));
                skipped.push(json!({"model": s.key(h), "why": why}));
            }
            Fitted::Model {
                entry,
                text,
                diff,
                baselines: chosen,
            } => {
                say(
                    &bar,
                    format!(
                        "train: {} {}",
                        s.key(h),
                        serde_json::to_string(&entry.metrics)?
                    ),
                );
                worst_diff = worst_diff.max(diff);
                features.insert(s.entity_kind.to_owned(), names);
                if !chosen.is_empty() {
                    let key = s.key(h);
                    let thr = chosen.iter().map(|(n, o)| (n.clone(), o.threshold));
                    baselines.insert(key.clone(), thr.collect());
                    let holds = chosen.iter().map(|(n, o)| (n.clone(), o.for_ticks));
                    baseline_holds.insert(key, holds.collect());
                }
                entries.push(*entry);
                texts.push(text);
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    if entries.is_empty() {
        bail!(
            "no model could be trained: {}",
            serde_json::to_string(&skipped)?
        );
    }
    Ok((
        Models {
            features,
            entries,
            baselines,
            baseline_holds,
            skipped,
            worst_diff,
        },
        texts,
    ))
}

/// What the jobs produced, for the manifest.
struct Models {
    features: BTreeMap<String, Vec<String>>,
    entries: Vec<Entry>,
    baselines: BTreeMap<String, BTreeMap<String, f64>>,
    baseline_holds: BTreeMap<String, BTreeMap<String, u32>>,
    skipped: Vec<serde_json::Value>,
    worst_diff: f64,
}

/// The manifest of the trained models: what they are, and what they saw.
fn manifest(
    args: &TrainArgs,
    table: &FeatureTable,
    fcfg: &FeatureConfig,
    horizons: &[String],
    m: Models,
    parts: &[Part],
    split_desc: &str,
) -> Result<Manifest> {
    let recordings: std::collections::BTreeSet<&str> =
        table.recording.iter().map(String::as_str).collect();
    let files: Vec<String> = args.data.iter().map(|p| p.display().to_string()).collect();
    Ok(Manifest {
        format: FORMAT,
        name: args.name.clone(),
        trained_on: args.trained_on.clone().unwrap_or_else(|| {
            format!("{} recording(s) from {}", recordings.len(), files.join(" "))
        }),
        probe_version: env!("CARGO_PKG_VERSION").to_owned(),
        windows: fcfg
            .windows
            .iter()
            .map(|d| crate::features::schema::label(*d))
            .collect(),
        horizons: horizons.to_vec(),
        features: m.features,
        models: m.entries,
        baselines: m.baselines,
        baseline_holds: m.baseline_holds,
        data: json!({
            "files": files,
            "recordings": recordings,
            "rows": table.len(),
            "split": split_desc,
            "rows_per_part": {
                "train": parts.iter().filter(|p| **p == Part::Train).count(),
                "validation": parts.iter().filter(|p| **p == Part::Valid).count(),
                "test": parts.iter().filter(|p| **p == Part::Test).count(),
                "gap": parts.iter().filter(|p| **p == Part::Gap).count(),
            },
            "skipped": m.skipped,
            "max_abs_diff_rust_vs_lightgbm": m.worst_diff,
            // How every threshold here was chosen: `probe eval` reuses the baselines'
            // only if it judges at the same operating point.
            "alarm_budget": eval::ALARM_BUDGET,
        }),
    })
}

fn progress(n: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal as _;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(n);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("train {bar:30} {pos}/{len} models {msg}")
    {
        bar.set_style(style);
    }
    bar
}

/// A line above the progress bar, or on stderr when there is no bar.
fn say(bar: &indicatif::ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

enum Fitted {
    Skipped(String),
    Model {
        entry: Box<Entry>,
        text: String,
        diff: f64,
        baselines: BTreeMap<String, operating::OperatingPoint>,
    },
}

/// Rows of one part with a known label: (rows, labels as the model learns them).
fn rows_of(
    t: &FeatureTable,
    parts: &[Part],
    part: Part,
    s: &Spec,
    entry: &Entry,
    label: &[f64],
    reg: Option<&spec::RegressionColumns>,
) -> (Vec<usize>, Vec<f32>) {
    let mut rows = Vec::new();
    let mut y = Vec::new();
    for r in 0..t.len() {
        if parts[r] != part || t.entity_kind[r] != s.entity_kind {
            continue;
        }
        match s.task {
            Task::Classifier if label[r].is_finite() => {
                rows.push(r);
                y.push(label[r] as f32);
            }
            Task::Regressor => {
                if let Some((target, _)) = reg.and_then(|g| g.target(entry, r)) {
                    rows.push(r);
                    y.push(target as f32);
                }
            }
            _ => {}
        }
    }
    (rows, y)
}

fn fit_one(
    args: &TrainArgs,
    t: &FeatureTable,
    parts: &[Part],
    s: &Spec,
    h: &str,
    names: &[String],
) -> Result<Fitted> {
    let label = t.column(&s.label(h))?;
    let horizon_s = crate::duration::parse_duration(h)
        .map_err(|e| anyhow::anyhow!("horizon {h}: {e}"))?
        .as_secs_f64();
    let mut entry = Entry {
        file: s.file(h),
        entity_kind: s.entity_kind.to_owned(),
        target: s.target.to_owned(),
        horizon: h.to_owned(),
        horizon_s,
        task: s.task,
        threshold: None,
        alarm_for_ticks: 1,
        base: s.base.iter().map(|b| (*b).to_owned()).collect(),
        eps: s.eps,
        calibration: None,
        metrics: serde_json::Value::Null,
    };
    let reg = match s.task {
        Task::Regressor => Some(spec::RegressionColumns::new(t, &entry, label)?),
        Task::Classifier => None,
    };
    let train = rows_of(t, parts, Part::Train, s, &entry, label, reg.as_ref());
    let valid = rows_of(t, parts, Part::Valid, s, &entry, label, reg.as_ref());
    // Classifiers cross-fit where there are recordings enough: the shipped model then
    // learns from the validation recordings too.
    let folds = match s.task {
        Task::Classifier => crossfit::folds(t, parts),
        Task::Regressor => None,
    };
    let fit = match folds {
        Some(_) => {
            let mut both = train.clone();
            both.0.extend(&valid.0);
            both.1.extend(&valid.1);
            both
        }
        None => train.clone(),
    };
    let d = Data {
        t,
        parts,
        s,
        names,
        label,
        horizon_s,
        key: s.key(h),
        train,
        valid,
        test: rows_of(t, parts, Part::Test, s, &entry, label, reg.as_ref()),
        fit,
        folds,
    };
    if let Some(why) = d.too_little() {
        return Ok(Fitted::Skipped(why));
    }
    let (text, ours, diff) = d.train(args, &d.fit)?;
    let trees = ours.num_trees();
    if trees < 2 && !args.no_gate {
        return Ok(Fitted::Skipped(format!(
            "gate: {trees} tree(s): early stopping found nothing to learn beyond the prior"
        )));
    }
    let baselines = match s.task {
        Task::Classifier => match d.finish_classifier(args, &ours, &mut entry)? {
            Ok(b) => b,
            Err(why) => return Ok(Fitted::Skipped(why)),
        },
        Task::Regressor => {
            if let Some(why) = d.finish_regressor(args, &ours, &mut entry, reg.as_ref())? {
                return Ok(Fitted::Skipped(why));
            }
            BTreeMap::new()
        }
    };
    Ok(Fitted::Model {
        entry: Box::new(entry),
        text,
        diff,
        baselines,
    })
}

/// One model's rows and labels, by part.
struct Data<'a> {
    t: &'a FeatureTable,
    parts: &'a [Part],
    s: &'a Spec,
    names: &'a [String],
    label: &'a [f64],
    horizon_s: f64,
    /// `kind/target_horizon`, for messages.
    key: String,
    train: (Vec<usize>, Vec<f32>),
    valid: (Vec<usize>, Vec<f32>),
    test: (Vec<usize>, Vec<f32>),
    /// What the shipped model is fitted on: the training rows, or with `folds` the
    /// validation rows too.
    fit: (Vec<usize>, Vec<f32>),
    /// Cross-fitting (`crossfit`): the fold of each training and validation recording.
    folds: Option<BTreeMap<String, usize>>,
}

fn positives(y: &[f32]) -> usize {
    y.iter().filter(|v| **v > 0.5).count()
}

impl Data<'_> {
    /// Why there is too little to learn from, if there is.
    fn too_little(&self) -> Option<String> {
        let (tr, ytr) = &self.train;
        let (va, yva) = &self.valid;
        if self.s.task == Task::Classifier {
            (positives(ytr) < 5 || positives(yva) < 1).then(|| {
                format!(
                    "too few positives (train {}, validation {})",
                    positives(ytr),
                    positives(yva)
                )
            })
        } else {
            (tr.len() < 50 || va.is_empty())
                .then(|| format!("too few rows (train {}, validation {})", tr.len(), va.len()))
        }
    }

    /// Fits LightGBM on `rows` (early stopping on validation for forecasts); returns the
    /// model's text, the Rust evaluator's reading of it and its largest difference from
    /// LightGBM's own predictions on every test (or validation) row.
    fn train(
        &self,
        args: &TrainArgs,
        (tr, ytr): &(Vec<usize>, Vec<f32>),
    ) -> Result<(String, Booster, f64)> {
        let key = &self.key;
        let (va, yva) = &self.valid;
        let nf = self.names.len() as i32;
        let xtr = spec::matrix(self.t, self.names, tr)?;
        let xva = spec::matrix(self.t, self.names, va)?;
        let params = self.params(args);
        // Classifiers: a bag of boosters fitted with seeds 1..=N, as one model (`bag`).
        let seeds = match self.s.task {
            Task::Classifier => args.seeds.max(1),
            Task::Regressor => 1,
        };
        let mut texts = Vec::new();
        let mut lgbm = None;
        for seed in 1..=seeds {
            let mut dtr = Dataset::from_slice(&xtr, ytr, nf, true).context("LightGBM dataset")?;
            dtr.set_feature_names(self.names)
                .context("LightGBM feature names")?;
            let dva = Dataset::from_slice_with_reference(&xva, yva, nf, true, Some(&dtr))
                .context("LightGBM validation dataset")?;
            let mut p = params.clone();
            p["seed"] = json!(seed);
            let one = Lgbm::train_with_valid(dtr, Some(dva), &p)
                .with_context(|| format!("training {key}"))?;
            texts.push(one.save_string().context("saving the LightGBM model")?);
            lgbm = Some(one);
        }
        let text = bag::merge(&texts).with_context(|| format!("{key}: merging the bag"))?;
        let lgbm = match lgbm {
            Some(one) if seeds == 1 => one,
            _ => Lgbm::from_string(&text).with_context(|| format!("{key}: loading the bag"))?,
        };
        let ours = Booster::parse(&text)
            .with_context(|| format!("{key}: LightGBM wrote a model probe cannot read"))?;
        // The Rust evaluator against LightGBM's own predictions.
        let (rows, which) = if self.test.0.is_empty() {
            (va, "validation")
        } else {
            (&self.test.0, "test")
        };
        let x = spec::matrix(self.t, self.names, rows)?;
        let theirs = lgbm.predict(&x, nf, true).context("LightGBM predict")?;
        let diff = x
            .chunks(self.names.len())
            .map(|r| ours.predict(r))
            .zip(&theirs)
            .fold(0.0f64, |d, (a, b)| d.max((a - b).abs()));
        if diff.is_nan() || diff > MAX_DIFF {
            bail!(
                "{key}: the Rust evaluator differs from LightGBM by {diff:e} on the {which} rows (limit {MAX_DIFF:e})"
            );
        }
        Ok((text, ours, diff))
    }

    fn params(&self, args: &TrainArgs) -> serde_json::Value {
        let mut params = json!({
            "num_iterations": args.rounds,
            "early_stopping_rounds": 15,
            "learning_rate": 0.1,
            "num_leaves": args.leaves,
            "min_data_in_leaf": 40,
            "feature_fraction": 0.7,
            "bagging_fraction": 0.8,
            "bagging_freq": 1,
            "lambda_l2": 1.0,
            "max_bin": 63,
            "seed": 1,
            "deterministic": true,
            "num_threads": 2,
            "verbosity": -1,
        });
        match self.s.task {
            Task::Classifier => {
                // Spikes are rare: weight the positives up, by the square root of the
                // imbalance (full balancing made scores of calm rows too jumpy to threshold).
                let ytr = &self.fit.1;
                let (p, n) = (positives(ytr) as f64, (ytr.len() - positives(ytr)) as f64);
                params["objective"] = json!("binary");
                params["metric"] = json!("average_precision");
                params["scale_pos_weight"] = json!((n / p).sqrt().max(1.0));
                // Onsets are few and each recording's are alike: a validation split of a
                // few recordings stopped most models after 1-5 trees (near-constant), and
                // small leaves learnt single episodes. All rounds, big leaves, strong L2
                // and half the features per tree ranked held-out onsets better (docs/model.md).
                params
                    .as_object_mut()
                    .expect("params are an object")
                    .remove("early_stopping_rounds");
                // (A twentieth of the rows at most: a short recording still gets splits.)
                params["min_data_in_leaf"] = json!((ytr.len() / 20).clamp(1, 200));
                params["feature_fraction"] = json!(0.5);
                params["bagging_fraction"] = json!(0.7);
                params["lambda_l2"] = json!(10.0);
            }
            Task::Regressor => {
                // Forecasts gain little from long ensembles and cost the most bytes.
                params["num_iterations"] = json!(args.forecast_rounds);
                params["objective"] = json!("huber");
                params["alpha"] = json!(0.5);
                params["metric"] = json!("l1");
            }
        }
        params
    }

    /// The model's raw output on `rows`.
    fn raw(&self, ours: &Booster, rows: &[usize]) -> Result<Vec<f64>> {
        let x = spec::matrix(self.t, self.names, rows)?;
        Ok(x.chunks(self.names.len())
            .map(|r| ours.predict(r))
            .collect())
    }

    /// The series of the rows whose part is `keep` (every row of the kind, labelled or
    /// not): what the alarm rule runs over.
    fn series_of(&self, keep: impl Fn(Part) -> bool) -> Vec<Vec<usize>> {
        spec::series(self.t, self.s.entity_kind)
            .into_iter()
            .map(|rows| rows.into_iter().filter(|&r| keep(self.parts[r])).collect())
            .filter(|rows: &Vec<usize>| !rows.is_empty())
            .collect()
    }

    /// `ours`' raw output on the rows of `series`, one value per table row (NaN elsewhere).
    fn raw_at(&self, ours: &Booster, series: &[Vec<usize>], out: &mut [f64]) -> Result<()> {
        let all: Vec<usize> = series.iter().flatten().copied().collect();
        for (&r, raw) in all.iter().zip(self.raw(ours, &all)?) {
            out[r] = raw;
        }
        Ok(())
    }

    /// What stands for validation: the validation series with the model's raw output, or,
    /// cross-fitting, the training and validation series with each fold's rows scored by
    /// a model fitted on the other folds.
    fn validation(&self, args: &TrainArgs, ours: &Booster) -> Result<(Vec<Vec<usize>>, Vec<f64>)> {
        let mut raw = vec![f64::NAN; self.t.len()];
        let Some(folds) = &self.folds else {
            let series = self.series_of(|p| p == Part::Valid);
            self.raw_at(ours, &series, &mut raw)?;
            return Ok((series, raw));
        };
        let series = self.series_of(|p| matches!(p, Part::Train | Part::Valid));
        let fold = |r: usize| folds.get(&self.t.recording[r]).copied();
        for f in 0..FOLDS {
            let (rows, y): (Vec<usize>, Vec<f32>) = self
                .fit
                .0
                .iter()
                .zip(&self.fit.1)
                .filter(|(&r, _)| fold(r) != Some(f))
                .map(|(&r, &y)| (r, y))
                .unzip();
            let (_, model, _) = self.train(args, &(rows, y))?;
            let held: Vec<Vec<usize>> = series
                .iter()
                .filter(|s| fold(s[0]) == Some(f))
                .cloned()
                .collect();
            self.raw_at(&model, &held, &mut raw)?;
        }
        Ok((series, raw))
    }

    /// The calibrated probabilities of `raw` on the rows of `series`.
    fn probabilities(entry: &Entry, series: &[Vec<usize>], raw: &[f64]) -> Vec<f64> {
        let mut p = vec![f64::NAN; raw.len()];
        for &r in series.iter().flatten() {
            p[r] = entry.probability(raw[r]);
        }
        p
    }

    /// Calibration, the operating point (threshold and hold) on validation, the test
    /// figures and the gate; the baselines' thresholds, or why the model is skipped.
    fn finish_classifier(
        &self,
        args: &TrainArgs,
        ours: &Booster,
        entry: &mut Entry,
    ) -> Result<std::result::Result<BTreeMap<String, operating::OperatingPoint>, String>> {
        let (va, yva) = match self.folds {
            Some(_) => &self.fit,
            None => &self.valid,
        };
        let (te, yte) = &self.test;
        let lva: Vec<bool> = yva.iter().map(|v| *v > 0.5).collect();
        let lte: Vec<bool> = yte.iter().map(|v| *v > 0.5).collect();
        let (vseries, vraw) = self.validation(args, ours)?;
        // Calibrated on validation (Platt): the probability then means what it says, and
        // the threshold is one.
        let rva: Vec<f64> = va.iter().map(|&r| vraw[r]).collect();
        match metrics::platt(&rva, &lva) {
            Some((a, b)) if a > 0.0 => entry.calibration = Some(Calibration { a, b }),
            // A slope of 0 or below: higher scores mean fewer events on validation.
            Some((a, _)) if !args.no_gate => {
                return Ok(Err(format!(
                    "gate: it ranks the validation rows backwards (calibration slope {a:.3})"
                )))
            }
            _ => {}
        }
        let vp = Self::probabilities(entry, &vseries, &vraw);
        let op = operating::choose(self.t, &vseries, &vp, self.label, eval::ALARM_BUDGET);
        let op = match op {
            Some(op) => op,
            None if !args.no_gate => {
                return Ok(Err(format!(
                    "gate: no threshold keeps the alarm on at most {:.0}% of calm validation rows",
                    100.0 * eval::ALARM_BUDGET
                )))
            }
            // Ungated: alarm at the highest validation score only.
            None => operating::OperatingPoint {
                for_ticks: 1,
                threshold: va
                    .iter()
                    .map(|&r| vp[r])
                    .filter(|p| p.is_finite())
                    .fold(0.0, f64::max),
                false_alarms_per_hour: f64::NAN,
            },
        };
        entry.threshold = Some(op.threshold);
        entry.alarm_for_ticks = op.for_ticks;
        let tseries = self.series_of(|p| p == Part::Test);
        let mut traw = vec![f64::NAN; self.t.len()];
        self.raw_at(ours, &tseries, &mut traw)?;
        let tp = Self::probabilities(entry, &tseries, &traw);
        let pte: Vec<f64> = te.iter().map(|&r| tp[r]).collect();
        let held = operating::held_column(self.t, &tseries, &tp, op.for_ticks);
        let hte: Vec<f64> = te.iter().map(|&r| held[r]).collect();
        let c = metrics::Confusion::at(&hte, &lte, op.threshold);
        let (_, ece) = metrics::reliability(&pte, &lte, 10);
        let roc = metrics::roc_auc(&pte, &lte);
        let test_hours = te.len() as f64 * operating::median_tick(self.t, &tseries) / 3600.0;
        let test_fa = operating::false_alarms(&tseries, &held, op.threshold, self.label);
        entry.metrics = json!({
            "trees": ours.num_trees(),
            "operating_point": format!(
                "the lowest threshold alarming on at most {:.0}% of calm validation rows, held for the shortest of {:?} ticks with at most {} false alarms per entity-hour on validation",
                100.0 * eval::ALARM_BUDGET,
                operating::HOLDS,
                operating::MAX_FALSE_ALARMS_PER_HOUR
            ),
            "validation": match self.folds {
                Some(_) => format!("out-of-fold scores of the training and validation recordings ({FOLDS} folds by recording); the model is fitted on all of them"),
                None => "the validation split, scored by the model fitted on the training split".to_owned(),
            },
            "false_alarms_per_hour_validation": op.false_alarms_per_hour,
            "rows": {"train": self.fit.0.len(), "validation": va.len(), "test": te.len()},
            "positives": {"train": positives(&self.fit.1), "validation": positives(yva), "test": positives(yte)},
            "pr_auc_test": metrics::average_precision(&pte, &lte),
            "roc_auc_test": roc,
            "f1_test": c.f1(),
            "precision_test": c.precision(),
            "recall_test": c.recall(),
            "time_in_alarm_test": metrics::alarm_share(&hte, &lte, op.threshold),
            "false_alarms_per_hour_test": (test_hours > 0.0).then(|| test_fa as f64 / test_hours),
            "ece_test": ece,
        });
        // The baselines get their operating points the same way, on the same rows.
        let mut baselines = BTreeMap::new();
        let all = spec::series(self.t, self.s.entity_kind);
        for (name, col) in eval::baseline_columns(self.t, self.s, self.horizon_s, &all)? {
            // A baseline that never has a finite score gets none (eval then fits one on its
            // data and says so).
            if let Some(op) =
                operating::choose(self.t, &vseries, &col, self.label, eval::ALARM_BUDGET)
            {
                baselines.insert(name.to_owned(), op);
            }
        }
        if !args.no_gate {
            let why = match self.folds {
                Some(_) => self.gate_out_of_fold(va, &vp, &lva)?,
                None => gate(self.t, self.s, self.horizon_s, te, &pte, &lte, roc, "test")?,
            };
            if let Some(why) = why {
                return Ok(Err(format!("gate: {why}")));
            }
        }
        Ok(Ok(baselines))
    }

    /// Cross-fitting, the gate judges the out-of-fold scores of every training and
    /// validation recording (each scored by a model that never saw it): a test split of
    /// three or four recordings left intervals so wide that which targets shipped changed
    /// from one corpus to the next.
    fn gate_out_of_fold(
        &self,
        rows: &[usize],
        p: &[f64],
        label: &[bool],
    ) -> Result<Option<String>> {
        let score: Vec<f64> = rows.iter().map(|&r| p[r]).collect();
        let roc = metrics::roc_auc(&score, label);
        gate(
            self.t,
            self.s,
            self.horizon_s,
            rows,
            &score,
            label,
            roc,
            "out-of-fold",
        )
    }

    /// The test MAE in the target's own unit against persistence (the value now); why the
    /// model is skipped if it does not beat it.
    fn finish_regressor(
        &self,
        args: &TrainArgs,
        ours: &Booster,
        entry: &mut Entry,
        reg: Option<&spec::RegressionColumns>,
    ) -> Result<Option<String>> {
        let te = &self.test.0;
        let (mut m, mut p, mut n) = (0.0, 0.0, 0usize);
        for (&r, f) in te.iter().zip(self.raw(ours, te)?) {
            let base = reg.and_then(|g| g.base(r)).unwrap_or_default();
            m += (entry.forecast(f, base) - self.label[r]).abs();
            p += (base - self.label[r]).abs();
            n += 1;
        }
        entry.metrics = json!({
            "trees": ours.num_trees(),
            "rows": {"train": self.train.0.len(), "validation": self.valid.0.len(), "test": te.len()},
            "mae_test": (n > 0).then(|| m / n as f64),
            "mae_persistence_test": (n > 0).then(|| p / n as f64),
        });
        Ok((!args.no_gate && n > 0 && m >= p).then(|| {
            format!(
                "gate: test MAE {:.4e} is not below persistence's {:.4e}",
                m / n as f64,
                p / n as f64
            )
        }))
    }
}

/// Writes the models and then the manifest (a reader that sees the manifest sees the
/// models it names).
fn write_dir(dir: &Path, m: &Manifest, texts: &[String]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (e, text) in m.models.iter().zip(texts) {
        let p = dir.join(&e.file);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    let p = dir.join(MANIFEST);
    std::fs::write(&p, serde_json::to_string_pretty(m)? + "\n")
        .with_context(|| format!("writing {}", p.display()))
}

/// Why a classifier must not ship, judged on `rows` (`on` names them: the test split, or
/// the out-of-fold rows): a ranking at chance (ROC-AUC below 0.6), or a baseline it does
/// not beat on PR-AUC outside the bootstrap interval of the difference (resampling
/// recordings, or 60 s stretches of a single one).
#[allow(clippy::too_many_arguments)]
fn gate(
    t: &FeatureTable,
    s: &Spec,
    horizon_s: f64,
    rows: &[usize],
    score: &[f64],
    label: &[bool],
    roc: Option<f64>,
    on: &str,
) -> Result<Option<String>> {
    match roc {
        None => {
            return Ok(Some(format!(
                "the {on} rows hold one class only: nothing to judge"
            )))
        }
        Some(r) if r < MIN_ROC_AUC => {
            return Ok(Some(format!("{on} ROC-AUC {r:.3} is below {MIN_ROC_AUC}")))
        }
        Some(_) => {}
    }
    let (_, groups) = eval::bootstrap_groups(t, rows);
    let resample = metrics::Resample::new(&groups);
    let model = metrics::Ranked::new(score, label);
    for (name, base) in eval::baseline_scores(t, s, horizon_s, rows)? {
        let base = metrics::Ranked::new(&base, label);
        let samples = metrics::bootstrap(groups.len(), eval::BOOTSTRAP_REPS, 1, |drawn| {
            let w = resample.weights(drawn);
            Some(vec![
                model.average_precision(&w)? - base.average_precision(&w)?,
            ])
        });
        let d: Vec<f64> = samples.iter().map(|v| v[0]).collect();
        match metrics::interval(&d, eval::CONFIDENCE) {
            Some((lo, _)) if lo > 0.0 => {}
            ci => {
                return Ok(Some(format!(
                    "does not beat {name} on {on} PR-AUC outside the {:.0}% interval (model minus {name}: {})",
                    100.0 * eval::CONFIDENCE,
                    ci.map_or("no resample had both classes".into(), |(a, b)| format!("[{a:.3}, {b:.3}]"))
                )))
            }
        }
    }
    Ok(None)
}

/// A ranking below this on the test rows is too close to chance to page on.
const MIN_ROC_AUC: f64 = 0.6;

#[cfg(test)]
mod tests {
    use super::*;

    /// Four recordings of one peer, 1 s ticks: a calm RTT with small noise, and onset
    /// labels (every 37th tick after the first 100 positive) that the RTT says nothing about, or, if
    /// `informative`, that it shows as a 4 ms bump on the positive ticks.
    fn table(informative: bool) -> (FeatureTable, Vec<usize>, Vec<bool>) {
        let mut t = FeatureTable::default();
        let (mut x, mut now, mut y) = (Vec::new(), Vec::new(), Vec::new());
        let mut seed = 7u64;
        for rec in 0..4 {
            for i in 0..600 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let noise = (seed >> 40) as f64 / (1u64 << 24) as f64;
                t.recording.push(format!("r{rec}"));
                t.time_unix.push(1000.0 * f64::from(rec) + f64::from(i));
                t.entity_kind.push("peer".into());
                t.entity.push("p".into());
                // After the calm level's first minute, so that every baseline can score them.
                let positive = i >= 100 && i % 37 == 0;
                let bump = if informative && positive { 0.004 } else { 0.0 };
                x.push(0.002 + 0.0002 * noise + bump);
                now.push(0.0);
                y.push(positive);
            }
        }
        t.names = vec!["rtt_p99_last".into(), "rtt_spike_now".into()];
        t.columns = vec![x, now];
        let rows: Vec<usize> = (0..t.len()).collect();
        (t, rows, y)
    }

    #[test]
    fn the_gate_passes_skill_and_refuses_chance() {
        let (t, rows, y) = table(false);
        let s = spec::SPECS
            .iter()
            .find(|s| s.target == "rtt_spike")
            .unwrap();
        // A model that knows the onsets: it beats every baseline by far.
        let good: Vec<f64> = y.iter().map(|&p| if p { 0.9 } else { 0.1 }).collect();
        let roc = metrics::roc_auc(&good, &y);
        assert_eq!(
            gate(&t, s, 5.0, &rows, &good, &y, roc, "test").unwrap(),
            None
        );
        // A constant: chance, refused for its ranking.
        let flat = vec![0.3; y.len()];
        let roc = metrics::roc_auc(&flat, &y);
        let why = gate(&t, s, 5.0, &rows, &flat, &y, roc, "test")
            .unwrap()
            .unwrap();
        assert!(why.contains("ROC-AUC"), "{why}");
        // When the RTT itself shows the onsets, the EWMA rule ranks them as well as that
        // model: no win outside the interval, refused, naming the baseline.
        let (t, rows, y) = table(true);
        let roc = metrics::roc_auc(&good, &y);
        let why = gate(&t, s, 5.0, &rows, &good, &y, roc, "test").unwrap();
        assert!(
            why.as_deref().is_some_and(|w| w.contains("does not beat")),
            "{why:?}"
        );
    }
}

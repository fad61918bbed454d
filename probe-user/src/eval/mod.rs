//! `probe eval`: a model and the baselines, side by side, on held-out data: ranking (PR-AUC,
//! ROC-AUC), the operating point (precision, recall, F1 at the model's threshold), false
//! alarms per hour, and lead time before each event's onset, by onset kind when the lab's
//! ground truth is given. Regressors against persistence. A Markdown report and SVG plots.
pub mod baselines;
pub mod metrics;
pub mod plots;
mod report;

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::{bail, Context as _, Result};
use serde::Serialize;

use crate::{
    dataset::table::FeatureTable,
    model::{
        bundle::{Bundle, Entry, Task},
        lgbm::Booster,
    },
    train::spec::{self, Spec},
};

#[derive(clap::Args, Debug, Clone)]
pub struct EvalArgs {
    /// Held-out tables written by `probe features` (never the training data).
    #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
    pub data: Vec<PathBuf>,

    /// The model directory (`probe train --out`); default: the built-in model.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,

    /// Write report.md, results.json and the SVG plots here (default: the report to stdout).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// The lab's ground_truth.jsonl of each recording (matched by its directory's name),
    /// to report lead time for gradual onsets and detection delay for abrupt ones.
    #[arg(long, value_name = "FILE", num_args = 1..)]
    pub ground_truth: Vec<PathBuf>,
}

/// The baselines with a threshold learnt on validation, beside persistence.
pub const BASELINES: [&str; 3] = ["ewma", "zscore", "predict_linear"];
/// Thresholds are the best F1 among those alarming on at most this many rows per positive
/// row (`metrics::operating_threshold`).
pub const MAX_ALARM_RATIO: f64 = 2.0;
/// Persistence: "the event is on now", thresholded at one half.
pub const PERSISTENCE: &str = "persistence";

/// The baselines' scores at `rows` (any order) for a model of spec `s`, computed over each
/// entity's whole series (causal: a row's score uses only its past).
pub fn baseline_scores(
    t: &FeatureTable,
    s: &Spec,
    horizon_s: f64,
    rows: &[usize],
) -> Result<Vec<(&'static str, Vec<f64>)>> {
    let full = baseline_columns(t, s, horizon_s, &spec::series(t, s.entity_kind))?;
    Ok(full
        .into_iter()
        .map(|(n, col)| (n, rows.iter().map(|&r| col[r]).collect()))
        .collect())
}

/// Each baseline's score for every row of the table (NaN for rows of other kinds).
fn baseline_columns(
    t: &FeatureTable,
    s: &Spec,
    horizon_s: f64,
    series: &[Vec<usize>],
) -> Result<Vec<(&'static str, Vec<f64>)>> {
    let x = t.column(s.signal)?;
    let mut out: Vec<(&'static str, Vec<f64>)> = BASELINES
        .iter()
        .map(|n| (*n, vec![f64::NAN; t.len()]))
        .collect();
    for rows in series {
        let ts: Vec<f64> = rows.iter().map(|&r| t.time_unix[r]).collect();
        let xs: Vec<f64> = rows.iter().map(|&r| x[r]).collect();
        // The alarm rules an operator writes today: an EWMA well above its 5-minute
        // median, a 30 s z-score, and predict_linear over 30 s against the median.
        let median = baselines::trailing_median(&ts, &xs, 300.0, 10);
        let cols = [
            baselines::ewma_ratio(&ts, &xs, 5.0, 300.0),
            baselines::zscore(&ts, &xs, 30.0),
            baselines::ratio(
                &baselines::predict_linear(&ts, &xs, 30.0, horizon_s),
                &median,
            ),
        ];
        for ((_, dst), src) in out.iter_mut().zip(cols) {
            for (&r, v) in rows.iter().zip(src) {
                dst[r] = v;
            }
        }
    }
    Ok(out)
}

/// One scorer's figures for one (model, horizon).
#[derive(Debug, Clone, Serialize)]
pub struct Scored {
    pub name: String,
    pub threshold: f64,
    pub pr_auc: Option<f64>,
    pub roc_auc: Option<f64>,
    pub precision: Option<f64>,
    pub recall: Option<f64>,
    pub f1: Option<f64>,
    pub false_alarms_per_hour: f64,
    /// Per onset kind (gradual, abrupt, unlabelled, all): onsets, the share alarmed before
    /// the onset, the median lead (s) of those, the median detection delay (s) of the rest.
    pub onsets: BTreeMap<String, Onsets>,
    #[serde(skip)]
    pub curve: Vec<(f64, f64)>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Onsets {
    pub count: usize,
    pub caught_before: f64,
    pub median_lead_s: Option<f64>,
    pub median_delay_s: Option<f64>,
    pub missed: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClassResult {
    pub key: String,
    pub entity_kind: String,
    pub target: String,
    pub horizon: String,
    pub rows: usize,
    pub positives: usize,
    pub hours: f64,
    pub scorers: Vec<Scored>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RegResult {
    pub key: String,
    pub rows: usize,
    pub mae_model: f64,
    pub mae_persistence: f64,
    /// Weighted MAPE: sum |error| / sum |actual|, in percent.
    pub mape_model: f64,
    pub mape_persistence: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Results {
    pub model: String,
    pub trained_on: String,
    pub data: Vec<String>,
    pub recordings: usize,
    pub classifiers: Vec<ClassResult>,
    pub regressors: Vec<RegResult>,
}

/// Ground-truth episodes per recording: (start, end, "gradual" | "abrupt").
type Episodes = BTreeMap<String, Vec<(f64, f64, String)>>;

fn read_ground_truth(files: &[PathBuf]) -> Result<Episodes> {
    let mut out = Episodes::new();
    for f in files {
        let rec = f
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .with_context(|| format!("{}: cannot name its recording", f.display()))?;
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let v: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("{}:{}: not JSON", f.display(), i + 1))?;
            let (Some(a), Some(b)) = (v["t_start"].as_f64(), v["t_end"].as_f64()) else {
                bail!(
                    "{}:{}: an episode needs t_start and t_end",
                    f.display(),
                    i + 1
                );
            };
            let kind = v["onset"].as_str().unwrap_or("abrupt").to_owned();
            out.entry(rec.clone()).or_default().push((a, b, kind));
        }
    }
    Ok(out)
}

pub fn main(args: EvalArgs) -> Result<()> {
    let bundle = match &args.model {
        Some(d) => Bundle::load(d)?,
        None => crate::model::builtin_bundle()
            .context("this build has no built-in model: pass --model DIR")??,
    };
    let t = FeatureTable::read_all(&args.data)?;
    if t.is_empty() {
        bail!("the features tables hold no rows");
    }
    let truth = read_ground_truth(&args.ground_truth)?;
    let mut res = Results {
        model: format!("{} ({})", bundle.manifest.name, bundle.source),
        trained_on: bundle.manifest.trained_on.clone(),
        data: args.data.iter().map(|p| p.display().to_string()).collect(),
        recordings: t
            .recording
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        classifiers: Vec::new(),
        regressors: Vec::new(),
    };
    let mut timeline = None;
    for (e, b) in bundle.manifest.models.iter().zip(&bundle.boosters) {
        let Some(s) = spec::of(e) else {
            eprintln!(
                "eval: {} is not a model probe knows how to evaluate; skipped",
                e.file
            );
            continue;
        };
        let names = &bundle.manifest.features[&e.entity_kind];
        match e.task {
            Task::Classifier => {
                let (r, tl) = classifier(&t, s, e, b, names, &bundle, &truth)?;
                if timeline.is_none() && e.target == "rtt_spike" {
                    timeline = tl;
                }
                res.classifiers.push(r);
            }
            Task::Regressor => res.regressors.push(regressor(&t, s, e, b, names)?),
        }
    }
    let md = report::markdown(&res, args.out.is_some());
    match &args.out {
        None => print!("{md}"),
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            for c in &res.classifiers {
                let curves: Vec<plots::Curve> = c
                    .scorers
                    .iter()
                    .filter(|s| !s.curve.is_empty())
                    .map(|s| plots::Curve {
                        name: s.name.clone(),
                        points: s.curve.clone(),
                    })
                    .collect();
                plots::pr_curves(
                    &dir.join(report::pr_file(c)),
                    &format!("{}: precision and recall on held-out data", c.key),
                    &curves,
                )?;
            }
            if let Some(tl) = &timeline {
                report::timeline(dir, tl)?;
            }
            std::fs::write(dir.join("report.md"), &md)?;
            std::fs::write(
                dir.join("results.json"),
                serde_json::to_string_pretty(&res)? + "\n",
            )?;
            eprintln!("eval: report -> {}", dir.join("report.md").display());
        }
    }
    Ok(())
}

/// The series a timeline plot shows: the one with the most onsets.
pub struct TimelineData {
    pub title: String,
    pub t: Vec<f64>,
    pub value: Vec<f64>,
    pub events: Vec<bool>,
    pub score: Vec<f64>,
    pub threshold: f64,
    pub alarms: Vec<(String, Vec<bool>)>,
}

fn classifier(
    t: &FeatureTable,
    s: &Spec,
    e: &Entry,
    b: &Booster,
    names: &[String],
    bundle: &Bundle,
    truth: &Episodes,
) -> Result<(ClassResult, Option<TimelineData>)> {
    let label = t.column(&s.label(&e.horizon))?;
    let now = t.column(&s.now())?;
    let key = s.key(&e.horizon);
    // Every row of the kind is scored; metrics over rows whose label is known.
    let series = spec::series(t, s.entity_kind);
    let all: Vec<usize> = series.iter().flatten().copied().collect();
    let x = spec::matrix(t, names, &all)?;
    let mut score = vec![f64::NAN; t.len()];
    for (&r, row) in all.iter().zip(x.chunks(names.len())) {
        score[r] = b.predict(row);
    }
    let mut cols: Vec<(String, Vec<f64>, f64)> =
        vec![("model".into(), score, e.threshold.unwrap_or(0.5))];
    cols.push((PERSISTENCE.into(), now.to_vec(), 0.5));
    // A baseline without a validation threshold is marked: its threshold is the best on
    // this very data, which flatters it.
    let learnt = bundle.manifest.baselines.get(&key);
    let known: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&r| label[r].is_finite())
        .collect();
    let lb: Vec<bool> = known.iter().map(|&r| label[r] > 0.5).collect();
    for (name, col) in baseline_columns(t, s, e.horizon_s, &series)? {
        let thr = match learnt.and_then(|m| m.get(name)) {
            Some(t) => *t,
            // No validation threshold in the manifest: the best on this data, which
            // flatters the baseline (said in the report).
            None => {
                let sc: Vec<f64> = known.iter().map(|&r| col[r]).collect();
                metrics::operating_threshold(&sc, &lb, MAX_ALARM_RATIO)
                    .map_or(f64::INFINITY, |x| x.0)
            }
        };
        let shown = if learnt.and_then(|m| m.get(name)).is_some() {
            name.to_owned()
        } else {
            format!("{name} (threshold fit on this data)")
        };
        cols.push((shown, col, thr));
    }
    let hours: f64 = series
        .iter()
        .map(|rows| {
            let (a, z) = (t.time_unix[rows[0]], t.time_unix[rows[rows.len() - 1]]);
            (z - a) / 3600.0
        })
        .sum();
    let mut scorers = Vec::new();
    for (name, col, thr) in &cols {
        let sc: Vec<f64> = known.iter().map(|&r| col[r]).collect();
        let c = metrics::Confusion::at(&sc, &lb, *thr);
        let curve = if name == PERSISTENCE {
            Vec::new()
        } else {
            metrics::pr_curve(&sc, &lb)
                .iter()
                .map(|p| (p.recall, p.precision))
                .collect()
        };
        let (fa, onsets) = events(t, &series, col, *thr, now, e.horizon_s, truth);
        scorers.push(Scored {
            name: name.clone(),
            threshold: *thr,
            pr_auc: metrics::average_precision(&sc, &lb),
            roc_auc: metrics::roc_auc(&sc, &lb),
            precision: c.precision(),
            recall: c.recall(),
            f1: c.f1(),
            false_alarms_per_hour: if hours > 0.0 { fa as f64 / hours } else { 0.0 },
            onsets,
            curve,
        });
    }
    // The timeline: the series with the most onsets.
    let best = series.iter().max_by_key(|rows| {
        rows.windows(2)
            .filter(|w| now[w[1]] > 0.5 && now[w[0]] <= 0.5)
            .count()
    });
    let tl = best.map(|rows| {
        let t0 = t.time_unix[rows[0]];
        let value = t
            .column(s.signal)
            .map(|c| rows.iter().map(|&r| c[r] * 1e3).collect());
        TimelineData {
            title: format!(
                "{} {} ({}): {} within {}",
                t.recording[rows[0]], t.entity[rows[0]], s.entity_kind, s.target, e.horizon
            ),
            t: rows.iter().map(|&r| t.time_unix[r] - t0).collect(),
            value: value.unwrap_or_default(),
            events: rows.iter().map(|&r| now[r] > 0.5).collect(),
            score: rows.iter().map(|&r| cols[0].1[r]).collect(),
            threshold: cols[0].2,
            alarms: cols[1..]
                .iter()
                .map(|(n, c, thr)| (n.clone(), rows.iter().map(|&r| c[r] >= *thr).collect()))
                .collect(),
        }
    });
    Ok((
        ClassResult {
            key,
            entity_kind: e.entity_kind.clone(),
            target: e.target.clone(),
            horizon: e.horizon.clone(),
            rows: known.len(),
            positives: lb.iter().filter(|b| **b).count(),
            hours,
            scorers,
        },
        tl,
    ))
}

/// False alarms and onsets of one scorer over every series, onsets by kind.
fn events(
    t: &FeatureTable,
    series: &[Vec<usize>],
    col: &[f64],
    thr: f64,
    now: &[f64],
    horizon_s: f64,
    truth: &Episodes,
) -> (usize, BTreeMap<String, Onsets>) {
    let mut fa = 0;
    let mut leads: BTreeMap<String, Vec<metrics::Lead>> = BTreeMap::new();
    for rows in series {
        let ts: Vec<f64> = rows.iter().map(|&r| t.time_unix[r]).collect();
        let alarm: Vec<bool> = rows.iter().map(|&r| col[r] >= thr).collect();
        let state: Vec<bool> = rows.iter().map(|&r| now[r] > 0.5).collect();
        let onset: Vec<bool> = (0..rows.len())
            .map(|i| state[i] && i > 0 && !state[i - 1])
            .collect();
        fa += metrics::false_alarms(&ts, &alarm, &onset, horizon_s);
        let lt = metrics::lead_times(&ts, &alarm, &onset, horizon_s);
        let eps = truth.get(&t.recording[rows[0]]);
        for (i, l) in (0..rows.len()).filter(|&i| onset[i]).zip(lt) {
            let kind = match eps {
                None => "unlabelled".to_owned(),
                Some(eps) => eps
                    .iter()
                    .find(|(a, b, _)| ts[i] >= a - 5.0 && ts[i] <= b + 5.0)
                    .map_or("outside episodes".to_owned(), |e| e.2.clone()),
            };
            leads.entry(kind).or_default().push(l);
            leads.entry("all".into()).or_default().push(l);
        }
    }
    let onsets = leads
        .into_iter()
        .map(|(k, v)| {
            let (mut before, mut after) = (Vec::new(), Vec::new());
            for l in &v {
                match l {
                    // An alarm up for longer than the horizon before the onset was a
                    // false alarm for all but the last H seconds of it: the lead is H.
                    metrics::Lead::Before(s) => before.push(s.min(horizon_s)),
                    metrics::Lead::After(s) => after.push(*s),
                    metrics::Lead::Missed => {}
                }
            }
            let o = Onsets {
                count: v.len(),
                caught_before: before.len() as f64 / v.len().max(1) as f64,
                median_lead_s: crate::features::median(&mut before),
                median_delay_s: crate::features::median(&mut after),
                missed: v.iter().filter(|l| **l == metrics::Lead::Missed).count(),
            };
            (k, o)
        })
        .collect();
    (fa, onsets)
}

fn regressor(
    t: &FeatureTable,
    s: &Spec,
    e: &Entry,
    b: &Booster,
    names: &[String],
) -> Result<RegResult> {
    let label = t.column(&s.label(&e.horizon))?;
    let reg = spec::RegressionColumns::new(t, e, label)?;
    let rows: Vec<usize> = (0..t.len())
        .filter(|&r| t.entity_kind[r] == s.entity_kind)
        .filter(|&r| reg.target(e, r).is_some())
        .collect();
    let x = spec::matrix(t, names, &rows)?;
    let (mut m, mut p, mut sum_y) = (0.0, 0.0, 0.0);
    for (&r, row) in rows.iter().zip(x.chunks(names.len())) {
        let base = reg.base(r).unwrap_or_default();
        let f = e.forecast(b.predict(row), base);
        let y = label[r];
        m += (f - y).abs();
        p += (base - y).abs();
        sum_y += y.abs();
    }
    let n = rows.len().max(1) as f64;
    // Weighted MAPE (sum |error| / sum |actual|): a per-row MAPE explodes on the many
    // near-zero rows (an idle peer's throughput) and says nothing about the busy ones.
    let wape = |e: f64| {
        if sum_y > 0.0 {
            100.0 * e / sum_y
        } else {
            f64::NAN
        }
    };
    Ok(RegResult {
        key: s.key(&e.horizon),
        rows: rows.len(),
        mae_model: m / n,
        mae_persistence: p / n,
        mape_model: wape(m),
        mape_persistence: wape(p),
    })
}

//! `probe eval`: a model and the baselines, side by side, on held-out data: ranking (PR-AUC
//! with bootstrap intervals over recordings, ROC-AUC), the operating point (precision,
//! recall, time in alarm at each scorer's threshold), false alarms per entity-hour, lead
//! time or delay per event onset (by onset kind when the lab's ground truth is given), and
//! calibration. Regressors against persistence and mean reversion. A Markdown report and
//! SVG plots.
pub mod baselines;
pub mod job;
pub mod metrics;
pub mod operating;
pub mod plots;
mod report;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

use crate::{
    dataset::{
        labels::{self, Event},
        spec::{self, Spec},
        table::FeatureTable,
    },
    model::{
        bundle::{Bundle, Entry, Task},
        lgbm::Booster,
    },
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

    /// Also write every row the model scored as CSV (recording, entity kind, entity, time,
    /// model, probability, alarm): where and when it would have alarmed, to set against
    /// what happened in each recording.
    #[arg(long, value_name = "FILE")]
    pub alarms: Option<PathBuf>,
}

/// The baselines with a threshold learnt on validation: an EWMA of the label's signals
/// and `predict_linear` to the horizon, each as the label's own severity (same calm level,
/// same floors), a 30 s z-score of the signals, and "the event ended recently".
pub const BASELINES: [&str; 4] = ["ewma", "zscore", "predict_linear", "recent_event"];
/// The reference that alarms on every row: its PR-AUC is the prevalence.
pub const ALWAYS: &str = "always";
/// The operating point: every threshold (the model's and the baselines') is the lowest
/// that keeps the alarm on at most this share of the calm rows of validation.
pub const ALARM_BUDGET: f64 = 0.05;
/// Resamples of the recordings for the confidence intervals, and their level.
pub const BOOTSTRAP_REPS: usize = 200;
pub const CONFIDENCE: f64 = 0.95;

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
pub fn baseline_columns(
    t: &FeatureTable,
    s: &Spec,
    horizon_s: f64,
    series: &[Vec<usize>],
) -> Result<Vec<(&'static str, Vec<f64>)>> {
    let ev = Event::of(s.target)
        .with_context(|| format!("{} is not an event probe knows baselines for", s.target))?;
    let cfg = t.label_config();
    let signals: Vec<&[f64]> = ev
        .signals()
        .iter()
        .map(|n| t.column(n))
        .collect::<Result<_>>()?;
    let now = t.column(&s.now())?;
    let mut out: Vec<(&'static str, Vec<f64>)> = BASELINES
        .iter()
        .map(|n| (*n, vec![f64::NAN; t.len()]))
        .collect();
    for rows in series {
        let ts: Vec<f64> = rows.iter().map(|&r| t.time_unix[r]).collect();
        let xs: Vec<Vec<f64>> = signals
            .iter()
            .map(|c| rows.iter().map(|&r| c[r]).collect())
            .collect();
        let calm: Vec<Vec<f64>> = xs
            .iter()
            .map(|x| {
                if !ev.relative() {
                    return vec![0.0; ts.len()];
                }
                let known: Vec<Option<f64>> =
                    x.iter().map(|v| v.is_finite().then_some(*v)).collect();
                labels::calm_levels(&ts, &known, &cfg)
                    .into_iter()
                    .map(|c| c.unwrap_or(f64::NAN))
                    .collect()
            })
            .collect();
        // The label's severity of transformed signals, tick by tick.
        let severity = |f: &dyn Fn(&[f64]) -> Vec<f64>| -> Vec<f64> {
            let ys: Vec<Vec<f64>> = xs.iter().map(|x| f(x)).collect();
            (0..ts.len())
                .map(|i| {
                    let y: Vec<f64> = ys.iter().map(|y| y[i]).collect();
                    let c: Vec<f64> = calm.iter().map(|c| c[i]).collect();
                    ev.severity(&cfg, &y, &c)
                })
                .collect()
        };
        let z: Vec<Vec<f64>> = xs.iter().map(|x| baselines::zscore(&ts, x, 30.0)).collect();
        let mut last_on: Option<f64> = None;
        let recent: Vec<f64> = rows
            .iter()
            .zip(&ts)
            .map(|(&r, &ti)| {
                if now[r] > 0.5 {
                    last_on = Some(ti);
                }
                // Sooner after an event scores higher; never an event: unknown.
                last_on.map_or(f64::NAN, |l| -(ti - l))
            })
            .collect();
        let cols = [
            severity(&|x| baselines::ewma(&ts, x, 5.0)),
            (0..ts.len())
                .map(|i| z.iter().map(|z| z[i]).fold(f64::NAN, f64::max))
                .collect(),
            severity(&|x| baselines::predict_linear(&ts, x, 30.0, horizon_s)),
            recent,
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
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Scored {
    pub name: String,
    pub threshold: f64,
    pub pr_auc: Option<f64>,
    /// The bootstrap interval of the PR-AUC (resampling recordings).
    pub pr_auc_ci: Option<(f64, f64)>,
    /// Baselines: the interval of the model's PR-AUC minus this one's, on the same
    /// resamples; the model wins only if it lies above 0.
    pub model_minus_ci: Option<(f64, f64)>,
    pub roc_auc: Option<f64>,
    pub precision: Option<f64>,
    pub recall: Option<f64>,
    pub f1: Option<f64>,
    /// Share of the calm (known negative) rows in alarm.
    pub time_in_alarm: Option<f64>,
    /// Alarm episodes starting in a calm row (no onset within the horizon), per hour of
    /// known rows of one entity.
    pub false_alarms_per_hour: f64,
    /// Probability-valued scorers (the model): expected calibration error and the
    /// reliability curve on these rows.
    pub ece: Option<f64>,
    pub reliability: Vec<metrics::Bin>,
    /// Per onset kind (gradual, abrupt, unlabelled, all): onsets, the share alarmed before
    /// the onset, the median lead (s) of those, the median detection delay (s) of the rest.
    pub onsets: BTreeMap<String, Onsets>,
    #[serde(skip)]
    pub curve: Vec<(f64, f64)>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Onsets {
    pub count: usize,
    pub caught_before: f64,
    /// The bootstrap interval of `caught_before` (resampling recordings).
    pub caught_before_ci: Option<(f64, f64)>,
    /// Caught before, or detected at most one tick after.
    pub caught_within_1_tick: f64,
    pub median_lead_s: Option<f64>,
    pub median_delay_s: Option<f64>,
    pub missed: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClassResult {
    pub key: String,
    pub entity_kind: String,
    pub target: String,
    pub horizon: String,
    pub rows: usize,
    pub positives: usize,
    pub hours: f64,
    pub scorers: Vec<Scored>,
    /// Baselines the model beats on PR-AUC outside the interval, and those it does not.
    pub beats: Vec<String>,
    pub does_not_beat: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegResult {
    pub key: String,
    pub rows: usize,
    pub mae_model: f64,
    pub mae_persistence: f64,
    /// Mean reversion: the value's EWMA (30 s half-life) as the forecast.
    pub mae_ewma: f64,
    /// Weighted MAPE: sum |error| / sum |actual|, in percent.
    pub mape_model: f64,
    pub mape_persistence: f64,
    pub mape_ewma: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
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
        model: model_label(&bundle),
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
    let mut alarms = args
        .alarms
        .as_ref()
        .map(|_| String::from("recording,entity_kind,entity,time_unix,model,probability,alarm\n"));
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
                let (r, tl) = classifier(&t, s, e, b, names, &bundle, &truth, alarms.as_mut())?;
                if timeline.is_none() && e.target == "rtt_spike" {
                    timeline = tl;
                }
                res.classifiers.push(r);
            }
            Task::Regressor => res.regressors.push(regressor(&t, s, e, b, names)?),
        }
    }
    if let (Some(path), Some(csv)) = (&args.alarms, &alarms) {
        std::fs::write(path, csv).with_context(|| format!("writing {}", path.display()))?;
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
                let bins: Vec<(f64, f64)> = c
                    .scorers
                    .first()
                    .map(|m| {
                        m.reliability
                            .iter()
                            .map(|b| (b.predicted, b.observed))
                            .collect()
                    })
                    .unwrap_or_default();
                plots::reliability(
                    &dir.join(report::reliability_file(c)),
                    &format!("{}: calibration on held-out data", c.key),
                    &bins,
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

/// The model as a report names it: its name and its directory's name, not the path (a
/// report is compared across machines: the built-in model's is rebuilt and checked byte
/// for byte) and no local paths.
fn model_label(bundle: &Bundle) -> String {
    let dir = Path::new(&bundle.source)
        .file_name()
        .map_or(bundle.source.clone(), |n| n.to_string_lossy().into_owned());
    format!("{} ({dir})", bundle.manifest.name)
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

/// One scorer's column over the table, and its threshold.
struct Column {
    name: String,
    /// What is ranked (PR-AUC, ROC-AUC, calibration).
    score: Vec<f64>,
    /// What the threshold applies to: the score under the alarm rule's hold.
    alarm: Vec<f64>,
    threshold: f64,
}

#[allow(clippy::too_many_arguments)]
fn classifier(
    t: &FeatureTable,
    s: &Spec,
    e: &Entry,
    b: &Booster,
    names: &[String],
    bundle: &Bundle,
    truth: &Episodes,
    alarms: Option<&mut String>,
) -> Result<(ClassResult, Option<TimelineData>)> {
    let label = t.column(&s.label(&e.horizon))?;
    let now = t.column(&s.now())?;
    // Every row of the kind is scored; metrics over rows whose label is known.
    let series = spec::series(t, s.entity_kind);
    let (known, lb) = operating::known_rows(&series, label);
    let cols = columns(t, s, e, b, names, bundle, &series)?;
    if let Some(csv) = alarms {
        write_alarms(csv, t, &series, &s.key(&e.horizon), &cols[0]);
    }
    let judged = Judged {
        t,
        series: &series,
        known: &known,
        lb: &lb,
        label,
        onset: t.column(&s.onset())?,
        horizon_s: e.horizon_s,
        tick_s: operating::median_tick(t, &series),
        truth,
    };
    let (recs, groups) = bootstrap_groups(t, &known);
    let (mut scorers, caught_by_rec): (Vec<Scored>, Vec<_>) =
        cols.iter().map(|c| judged.scorer(c, &recs)).unzip();
    intervals(&mut scorers, &cols, &known, &lb, &groups, &caught_by_rec);
    let (mut beats, mut does_not_beat) = (Vec::new(), Vec::new());
    for sc in &scorers[1..] {
        if sc.name == ALWAYS {
            continue;
        }
        match sc.model_minus_ci {
            Some((lo, _)) if lo > 0.0 => beats.push(sc.name.clone()),
            _ => does_not_beat.push(sc.name.clone()),
        }
    }
    let tl = timeline_data(t, s, e, &series, now, &cols);
    Ok((
        ClassResult {
            key: s.key(&e.horizon),
            entity_kind: e.entity_kind.clone(),
            target: e.target.clone(),
            horizon: e.horizon.clone(),
            rows: known.len(),
            positives: lb.iter().filter(|b| **b).count(),
            hours: known.len() as f64 * judged.tick_s / 3600.0,
            scorers,
            beats,
            does_not_beat,
        },
        tl,
    ))
}

/// The model's rows as `--alarms` writes them.
fn write_alarms(csv: &mut String, t: &FeatureTable, series: &[Vec<usize>], key: &str, c: &Column) {
    use std::fmt::Write as _;
    for &r in series.iter().flatten() {
        let alarm = u8::from(c.alarm[r] >= c.threshold);
        let _ = writeln!(
            csv,
            "{},{},{},{:.3},{key},{},{alarm}",
            t.recording[r], t.entity_kind[r], t.entity[r], t.time_unix[r], c.score[r]
        );
    }
}

/// The scorers of one classifier: the model (its calibrated probability, alarming under
/// its rule), the baselines at their validation thresholds, and always-alarm.
fn columns(
    t: &FeatureTable,
    s: &Spec,
    e: &Entry,
    b: &Booster,
    names: &[String],
    bundle: &Bundle,
    series: &[Vec<usize>],
) -> Result<Vec<Column>> {
    let all: Vec<usize> = series.iter().flatten().copied().collect();
    let x = spec::matrix(t, names, &all)?;
    let mut score = vec![f64::NAN; t.len()];
    for (&r, row) in all.iter().zip(x.chunks(names.len())) {
        score[r] = e.probability(b.predict(row));
    }
    let mut cols = vec![Column {
        name: "model".into(),
        alarm: operating::held_column(t, series, &score, e.alarm_for_ticks),
        score,
        threshold: e.threshold.unwrap_or(f64::INFINITY),
    }];
    // The baselines' validation operating points, if the bundle chose them the way this
    // judges (a bundle from before the alarm budget has thresholds of other rules).
    let key = s.key(&e.horizon);
    let m = &bundle.manifest;
    let learnt = m
        .baselines
        .get(&key)
        .filter(|_| m.data["alarm_budget"].as_f64() == Some(ALARM_BUDGET));
    for (name, col) in baseline_columns(t, s, e.horizon_s, series)? {
        let (threshold, hold, shown) = match learnt.and_then(|b| b.get(name)) {
            Some(t) => {
                let hold = m.baseline_holds.get(&key).and_then(|h| h.get(name));
                (*t, hold.copied().unwrap_or(1), name.to_owned())
            }
            // No validation operating point in the manifest: the budget's on this very
            // data, which flatters the baseline (said in its name).
            None => {
                let label = t.column(&s.label(&e.horizon))?;
                let op = operating::choose(t, series, &col, label, ALARM_BUDGET);
                (
                    op.map_or(f64::INFINITY, |o| o.threshold),
                    op.map_or(1, |o| o.for_ticks),
                    format!("{name} (threshold fit on this data)"),
                )
            }
        };
        cols.push(Column {
            name: shown,
            alarm: operating::held_column(t, series, &col, hold),
            score: col,
            threshold,
        });
    }
    cols.push(Column {
        name: ALWAYS.into(),
        score: vec![1.0; t.len()],
        alarm: vec![1.0; t.len()],
        threshold: 1.0,
    });
    Ok(cols)
}

/// What every scorer of one classifier is judged on.
struct Judged<'a> {
    t: &'a FeatureTable,
    series: &'a [Vec<usize>],
    known: &'a [usize],
    lb: &'a [bool],
    label: &'a [f64],
    onset: &'a [f64],
    horizon_s: f64,
    tick_s: f64,
    truth: &'a Episodes,
}

impl Judged<'_> {
    /// One scorer's figures, and per bootstrap group its (onsets caught before, onsets).
    fn scorer(&self, c: &Column, recs: &[Group]) -> (Scored, Vec<(usize, usize)>) {
        let sc: Vec<f64> = self.known.iter().map(|&r| c.score[r]).collect();
        let alarm: Vec<f64> = self.known.iter().map(|&r| c.alarm[r]).collect();
        let conf = metrics::Confusion::at(&alarm, self.lb, c.threshold);
        let curve = if c.name == ALWAYS {
            Vec::new()
        } else {
            metrics::pr_curve(&sc, self.lb)
                .iter()
                .map(|p| (p.recall, p.precision))
                .collect()
        };
        let ev = events(
            self.t,
            self.series,
            &c.alarm,
            c.threshold,
            self.label,
            self.onset,
            self.horizon_s,
            self.truth,
        );
        let caught = recs
            .iter()
            .map(|g| {
                let o = ev
                    .onsets
                    .iter()
                    .filter(|o| g.holds(&o.recording, o.time_unix));
                o.fold((0, 0), |(k, n), o| {
                    (
                        k + usize::from(matches!(o.lead, metrics::Lead::Before(_))),
                        n + 1,
                    )
                })
            })
            .collect();
        let (reliability, ece) = if c.name == "model" {
            metrics::reliability(&sc, self.lb, 10)
        } else {
            (Vec::new(), None)
        };
        let hours = self.known.len() as f64 * self.tick_s / 3600.0;
        let scored = Scored {
            name: c.name.clone(),
            threshold: c.threshold,
            pr_auc: metrics::average_precision(&sc, self.lb),
            pr_auc_ci: None,
            model_minus_ci: None,
            roc_auc: metrics::roc_auc(&sc, self.lb),
            precision: conf.precision(),
            recall: conf.recall(),
            f1: conf.f1(),
            time_in_alarm: metrics::alarm_share(&alarm, self.lb, c.threshold),
            false_alarms_per_hour: if hours > 0.0 {
                ev.false_alarms as f64 / hours
            } else {
                0.0
            },
            ece,
            reliability,
            onsets: summarize(&ev.onsets, self.horizon_s, self.tick_s),
            curve,
        };
        (scored, caught)
    }
}

/// One group the bootstrap resamples: a recording, or a 60 s stretch of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Group<'a> {
    recording: &'a str,
    block: Option<i64>,
}

impl Group<'_> {
    fn holds(&self, recording: &str, time_unix: f64) -> bool {
        self.recording == recording
            && self
                .block
                .is_none_or(|b| b == (time_unix / BLOCK_S).floor() as i64)
    }
}

/// Stretches the bootstrap resamples when all the rows are of one recording.
const BLOCK_S: f64 = 60.0;

/// What the bootstrap resamples: the recordings of `rows`, or 60 s stretches when there is
/// a single recording; with each group's rows (their positions in `rows`).
pub fn bootstrap_groups<'a>(
    t: &'a FeatureTable,
    rows: &[usize],
) -> (Vec<Group<'a>>, Vec<Vec<usize>>) {
    let single = rows.iter().all(|&r| t.recording[r] == t.recording[rows[0]]);
    let mut by: BTreeMap<Group, Vec<usize>> = BTreeMap::new();
    for (k, &r) in rows.iter().enumerate() {
        let g = Group {
            recording: t.recording[r].as_str(),
            block: single.then(|| (t.time_unix[r] / BLOCK_S).floor() as i64),
        };
        by.entry(g).or_default().push(k);
    }
    by.into_iter().unzip()
}

/// Bootstrap intervals by recording: every scorer's PR-AUC, the model's lead over each
/// baseline on the same resamples, and each scorer's share of onsets caught before.
fn intervals(
    scorers: &mut [Scored],
    cols: &[Column],
    known: &[usize],
    lb: &[bool],
    groups: &[Vec<usize>],
    caught_by_rec: &[Vec<(usize, usize)>],
) {
    let n = cols.len();
    let resample = metrics::Resample::new(groups);
    let ranked: Vec<metrics::Ranked> = cols
        .iter()
        .map(|c| {
            let sc: Vec<f64> = known.iter().map(|&r| c.score[r]).collect();
            metrics::Ranked::new(&sc, lb)
        })
        .collect();
    let samples = metrics::bootstrap(groups.len(), BOOTSTRAP_REPS, 1, |drawn| {
        let w = resample.weights(drawn);
        let mut v = Vec::with_capacity(2 * n);
        for r in &ranked {
            v.push(r.average_precision(&w).unwrap_or(f64::NAN));
        }
        for per_rec in caught_by_rec {
            let (k, total) = drawn
                .iter()
                .fold((0, 0), |(k, m), &g| (k + per_rec[g].0, m + per_rec[g].1));
            v.push(if total > 0 {
                k as f64 / total as f64
            } else {
                f64::NAN
            });
        }
        Some(v)
    });
    let col = |j: usize| -> Vec<f64> { samples.iter().map(|v| v[j]).collect() };
    for (j, sc) in scorers.iter_mut().enumerate() {
        sc.pr_auc_ci = metrics::interval(&col(j), CONFIDENCE);
        if j > 0 {
            let d: Vec<f64> = samples.iter().map(|v| v[0] - v[j]).collect();
            sc.model_minus_ci = metrics::interval(&d, CONFIDENCE);
        }
        if let Some(all) = sc.onsets.get_mut("all") {
            all.caught_before_ci = metrics::interval(&col(n + j), CONFIDENCE);
        }
    }
}

/// The series a timeline plot shows: the one with the most onsets.
fn timeline_data(
    t: &FeatureTable,
    s: &Spec,
    e: &Entry,
    series: &[Vec<usize>],
    now: &[f64],
    cols: &[Column],
) -> Option<TimelineData> {
    let best = series.iter().max_by_key(|rows| {
        rows.windows(2)
            .filter(|w| now[w[1]] > 0.5 && now[w[0]] <= 0.5)
            .count()
    })?;
    let t0 = t.time_unix[best[0]];
    let value = t
        .column(s.signal)
        .map(|c| best.iter().map(|&r| c[r] * 1e3).collect());
    Some(TimelineData {
        title: format!(
            "{} {} ({}): {} within {}",
            t.recording[best[0]], t.entity[best[0]], s.entity_kind, s.target, e.horizon
        ),
        t: best.iter().map(|&r| t.time_unix[r] - t0).collect(),
        value: value.unwrap_or_default(),
        events: best.iter().map(|&r| now[r] > 0.5).collect(),
        score: best.iter().map(|&r| cols[0].alarm[r]).collect(),
        threshold: cols[0].threshold,
        alarms: cols[1..]
            .iter()
            .filter(|c| c.name != ALWAYS)
            .map(|c| {
                (
                    c.name.clone(),
                    best.iter().map(|&r| c.alarm[r] >= c.threshold).collect(),
                )
            })
            .collect(),
    })
}

/// One onset as a scorer saw it.
struct OnsetSeen {
    recording: String,
    time_unix: f64,
    kind: String,
    lead: metrics::Lead,
}

struct EventFigures {
    false_alarms: usize,
    onsets: Vec<OnsetSeen>,
}

/// The kind of an onset at `at` from the lab's episodes: within an episode (5 s of slack
/// either side), abrupt if the episode is, or if it came with the first step of a gradual
/// one (no build-up before it); gradual if a build-up preceded it. Also the episode's
/// index, so that only its first onset counts.
fn onset_kind(eps: Option<&Vec<(f64, f64, String)>>, at: f64) -> (String, Option<usize>) {
    let Some(eps) = eps else {
        return ("unlabelled".into(), None);
    };
    match eps
        .iter()
        .position(|(a, b, _)| at >= a - 5.0 && at <= b + 5.0)
    {
        None => ("outside episodes".into(), None),
        Some(k) => {
            let (start, _, kind) = &eps[k];
            let gradual = kind == "gradual" && at - start > GRADUAL_AFTER_S;
            let name = if gradual { "gradual" } else { "abrupt" };
            (name.into(), Some(k))
        }
    }
}

/// An onset this soon after a gradual episode's first step came with that step.
const GRADUAL_AFTER_S: f64 = 2.0;

/// False alarms and onsets of one scorer over every series.
#[allow(clippy::too_many_arguments)]
fn events(
    t: &FeatureTable,
    series: &[Vec<usize>],
    col: &[f64],
    thr: f64,
    label: &[f64],
    onset_col: &[f64],
    horizon_s: f64,
    truth: &Episodes,
) -> EventFigures {
    let mut out = EventFigures {
        false_alarms: operating::false_alarms(series, col, thr, label),
        onsets: Vec::new(),
    };
    for rows in series {
        let ts: Vec<f64> = rows.iter().map(|&r| t.time_unix[r]).collect();
        let alarm: Vec<bool> = rows.iter().map(|&r| col[r] >= thr).collect();
        let onset: Vec<bool> = rows.iter().map(|&r| onset_col[r] > 0.5).collect();
        let leads = metrics::lead_times(&ts, &alarm, &onset, horizon_s);
        let rec = &t.recording[rows[0]];
        let eps = truth.get(rec);
        let mut seen = std::collections::HashSet::new();
        for (i, lead) in (0..rows.len()).filter(|&i| onset[i]).zip(leads) {
            let (kind, episode) = onset_kind(eps, ts[i]);
            if episode.is_some_and(|k| !seen.insert(k)) {
                continue;
            }
            out.onsets.push(OnsetSeen {
                recording: rec.clone(),
                time_unix: ts[i],
                kind,
                lead,
            });
        }
    }
    out
}

/// Per onset kind and over all: caught before, lead, delay.
fn summarize(onsets: &[OnsetSeen], horizon_s: f64, tick_s: f64) -> BTreeMap<String, Onsets> {
    let mut by: BTreeMap<String, Vec<metrics::Lead>> = BTreeMap::new();
    for o in onsets {
        by.entry(o.kind.clone()).or_default().push(o.lead);
        by.entry("all".into()).or_default().push(o.lead);
    }
    by.into_iter()
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
            let quick = after.iter().filter(|d| **d <= tick_s * 1.01).count();
            let n = v.len().max(1) as f64;
            let o = Onsets {
                count: v.len(),
                caught_before: before.len() as f64 / n,
                caught_before_ci: None,
                caught_within_1_tick: (before.len() + quick) as f64 / n,
                median_lead_s: crate::stats::median(&mut before),
                median_delay_s: crate::stats::median(&mut after),
                missed: v.iter().filter(|l| **l == metrics::Lead::Missed).count(),
            };
            (k, o)
        })
        .collect()
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
    // Mean reversion: the EWMA of the value now over each series.
    let mut ewma = vec![f64::NAN; t.len()];
    for rows in spec::series(t, s.entity_kind) {
        let ts: Vec<f64> = rows.iter().map(|&r| t.time_unix[r]).collect();
        let xs: Vec<f64> = rows
            .iter()
            .map(|&r| reg.base(r).unwrap_or(f64::NAN))
            .collect();
        for (&r, v) in rows
            .iter()
            .zip(baselines::ewma(&ts, &xs, REVERSION_HALF_LIFE_S))
        {
            ewma[r] = v;
        }
    }
    let rows: Vec<usize> = (0..t.len())
        .filter(|&r| t.entity_kind[r] == s.entity_kind)
        .filter(|&r| reg.target(e, r).is_some())
        .collect();
    let x = spec::matrix(t, names, &rows)?;
    let (mut m, mut p, mut w, mut sum_y) = (0.0, 0.0, 0.0, 0.0);
    for (&r, row) in rows.iter().zip(x.chunks(names.len())) {
        let base = reg.base(r).unwrap_or_default();
        let f = e.forecast(b.predict(row), base);
        let y = label[r];
        m += (f - y).abs();
        p += (base - y).abs();
        w += (if ewma[r].is_finite() { ewma[r] } else { base } - y).abs();
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
        mae_ewma: w / n,
        mape_model: wape(m),
        mape_persistence: wape(p),
        mape_ewma: wape(w),
    })
}

/// Half-life of the mean-reversion baseline of the forecasts.
const REVERSION_HALF_LIFE_S: f64 = 30.0;

#[cfg(test)]
mod tests {
    use super::*;

    /// One peer series of one recording, 1 s ticks, with a label and onset column.
    fn table(label: &[f64], onset: &[f64]) -> FeatureTable {
        let n = label.len();
        FeatureTable {
            recording: vec!["r".into(); n],
            time_unix: (0..n).map(|i| 1000.0 + i as f64).collect(),
            entity_kind: vec!["peer".into(); n],
            entity: vec!["p".into(); n],
            names: vec!["l".into(), "o".into()],
            columns: vec![label.to_vec(), onset.to_vec()],
            ..FeatureTable::default()
        }
    }

    #[test]
    fn false_alarms_are_alarmed_calm_runs_and_onsets_are_caught_or_delayed() {
        const NAN: f64 = f64::NAN;
        // Calm 0..=9 (label 0), positives 10..=14 (an onset at 15 within 5 s), the event
        // 15..=19 (masked), calm again 20..=29.
        let mut label = vec![0.0; 10];
        label.extend([1.0; 5]);
        label.extend([NAN; 5]);
        label.extend([0.0; 10]);
        let mut onset = vec![0.0; 30];
        onset[15] = 1.0;
        let t = table(&label, &onset);
        let series = vec![(0..30).collect::<Vec<usize>>()];
        let score = |alarmed: &[usize]| -> Vec<f64> {
            (0..30)
                .map(|i| f64::from(u8::from(alarmed.contains(&i))))
                .collect()
        };
        let (l, o) = (t.column("l").unwrap(), t.column("o").unwrap());
        // Up from 12 to 17: caught 3 s before, no false alarm; a blip at 25 is one.
        let e = events(
            &t,
            &series,
            &score(&[12, 13, 14, 15, 16, 17, 25]),
            0.5,
            l,
            o,
            5.0,
            &Episodes::new(),
        );
        assert_eq!(e.false_alarms, 1);
        assert_eq!(e.onsets.len(), 1);
        assert_eq!(e.onsets[0].lead, metrics::Lead::Before(3.0));
        assert_eq!(e.onsets[0].kind, "unlabelled");
        // Always on: one false alarm per calm stretch (two), the onset caught by the horizon.
        let all: Vec<usize> = (0..30).collect();
        let e = events(&t, &series, &score(&all), 0.5, l, o, 5.0, &Episodes::new());
        assert_eq!(e.false_alarms, 2);
        assert_eq!(e.onsets[0].lead, metrics::Lead::Before(15.0));
        let s = summarize(&e.onsets, 5.0, 1.0);
        assert_eq!(s["all"].median_lead_s, Some(5.0));
        // Up only from 16: detected 1 s after, within one tick.
        let e = events(&t, &series, &score(&[16]), 0.5, l, o, 5.0, &Episodes::new());
        assert_eq!(e.onsets[0].lead, metrics::Lead::After(1.0));
        let s = summarize(&e.onsets, 5.0, 1.0);
        assert_eq!(
            (s["all"].caught_before, s["all"].caught_within_1_tick),
            (0.0, 1.0)
        );
    }

    #[test]
    fn onsets_are_classed_by_what_preceded_them() {
        let eps = vec![
            (100.0, 160.0, "gradual".to_string()),
            (300.0, 340.0, "abrupt".to_string()),
        ];
        let k = |at: f64| onset_kind(Some(&eps), at);
        assert_eq!(k(130.0), ("gradual".into(), Some(0)));
        // With the first step of a gradual episode: nothing built up before it.
        assert_eq!(k(101.0), ("abrupt".into(), Some(0)));
        assert_eq!(k(301.0), ("abrupt".into(), Some(1)));
        assert_eq!(k(344.0), ("abrupt".into(), Some(1)));
        assert_eq!(k(200.0), ("outside episodes".into(), None));
        assert_eq!(onset_kind(None, 1.0), ("unlabelled".into(), None));
    }

    #[test]
    fn one_recording_is_resampled_by_the_minute() {
        let t = table(&[0.0; 150], &[0.0; 150]);
        let rows: Vec<usize> = (0..150).collect();
        let (g, rows_of) = bootstrap_groups(&t, &rows);
        // 1000..1149 s: the minutes 16 (from 1000 s), 17, 18 and 19.
        assert_eq!(g.len(), 4);
        assert_eq!(rows_of.iter().map(Vec::len).sum::<usize>(), 150);
        assert!(g[0].holds("r", 1000.0) && !g[0].holds("r", 1080.0) && !g[0].holds("x", 1000.0));
        let mut t2 = t.clone();
        t2.recording[149] = "s".into();
        let (g, _) = bootstrap_groups(&t2, &rows);
        assert_eq!(g.len(), 2);
    }
}

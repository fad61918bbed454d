//! `probe train --job`: the job's early warning from per-rank lab runs (the job corpus).
//! Every rank's job rows (the job feature stage, as the daemon computes them) with the job's
//! labels; per target (`culprit`: an episode is under way on this host; `slows_within_{h}`:
//! the job slows within h) a LightGBM classifier fitted on the training runs, scored
//! out-of-fold there (folds by run) to choose the warning's threshold at the false-warning
//! budget, and judged once on the held-out runs against fair baselines (single job
//! features, the same rule and budget): row PR-AUC and the warning's episode figures with
//! bootstrap intervals by run. The culprit model is the warning's score (it ranks held-out
//! episodes far above the slowdown forecast, docs/job.md); the forecasts are gauges.
use std::{fmt::Write as _, time::Duration};

use anyhow::{bail, Context as _, Result};
use lightgbm3::{Booster as Lgbm, Dataset};
use serde_json::json;

use super::TrainArgs;
use crate::{
    dataset::job::{label_names, Run},
    eval::{
        job::{self as ej, Figures, HostScores, RuleConfig, RunVerdict},
        metrics,
    },
    features::job as fj,
    model::{job::DIRECTIONS, lgbm::Booster},
};

/// The rule shapes the warning may take (rules/job.rules.yml): (stand-out against the
/// job's median, ticks held). The one chosen is the one that, out of fold on the training
/// runs, warns the most gradual slowdowns before they happen with the right host named.
const SHAPES: &[(f64, usize)] = &[(2.0, 2), (2.0, 3), (2.0, 5), (3.0, 2), (3.0, 3), (3.0, 5)];
/// False warnings per job-hour of calm the threshold is chosen for.
pub const BUDGET: f64 = 1.0;
const FOLDS: usize = 3;
const REPS: usize = 1000;
const SEED: u64 = 50;

/// The single-feature baselines, each as its own score under the same rule.
const BASELINES: &[&str] = &[
    "job_srtt_max_over_calm",
    "job_srtt_over_calm",
    "job_span_max_over_calm",
    "job_srtt_max_trend",
];

fn horizons() -> Vec<Duration> {
    crate::dataset::labels::LabelConfig::default().horizons
}

/// The targets a model is fitted for: the forecasts, then the culprit.
fn targets() -> Vec<String> {
    label_names(&horizons())
        .into_iter()
        .filter(|n| n.starts_with("slows_within_") || n == "culprit")
        .collect()
}

/// One run's rows, flattened: per row its host, features and labels (the targets', then
/// one per direction: 1 if the culprit's episode has it, 0 if another, NaN without one),
/// and the direction the direction models give it (out of fold on training runs).
struct Rows {
    host: Vec<usize>,
    x: Vec<f64>,
    labels: Vec<Vec<f64>>,
    dir: Vec<Option<usize>>,
}

/// The label column of direction `d` in [`Rows::labels`].
fn direction_column(d: usize) -> usize {
    targets().len() + d
}

/// The label column of the culprit target.
fn culprit_column() -> usize {
    targets().len() - 1
}

fn rows_of(run: &Run) -> Rows {
    let hz = horizons();
    let names = label_names(&hz);
    let at = |t: &str| names.iter().position(|n| n == t).expect("a label");
    let want: Vec<usize> = targets().iter().map(|t| at(t)).collect();
    let dir = at("culprit_direction");
    let mut r = Rows {
        host: Vec::new(),
        x: Vec::new(),
        labels: Vec::new(),
        dir: Vec::new(),
    };
    for (h, host) in run.hosts.iter().enumerate() {
        for row in &host.rows {
            r.host.push(h);
            r.x.extend(&row.values);
            let l = run.labels(host.rank, row.time_unix, &hz);
            let mut v: Vec<f64> = want.iter().map(|&i| l[i]).collect();
            v.extend((0..DIRECTIONS.len()).map(|d| {
                if l[dir].is_finite() {
                    f64::from((l[dir] as usize == d) as u8)
                } else {
                    f64::NAN
                }
            }));
            r.labels.push(v);
            r.dir.push(None);
        }
    }
    r
}

fn params(rounds: u32, leaves: u32, y: &[f32]) -> serde_json::Value {
    let p = y.iter().filter(|v| **v > 0.5).count().max(1) as f64;
    let n = y.len() as f64 - p;
    json!({
        "objective": "binary",
        "num_iterations": rounds,
        "learning_rate": 0.06,
        "num_leaves": leaves,
        "min_data_in_leaf": 200,
        "feature_fraction": 0.7,
        "bagging_fraction": 0.8,
        "bagging_freq": 1,
        "lambda_l2": 5.0,
        "max_bin": 63,
        "scale_pos_weight": (n / p).sqrt().max(1.0),
        "seed": 1,
        "deterministic": true,
        "num_threads": 2,
        "verbosity": -1,
    })
}

/// Fits a classifier on the labelled rows of `runs` for target `k`.
fn fit(runs: &[&Rows], k: usize, args: &TrainArgs) -> Result<(String, Booster)> {
    let nf = fj::names().len();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for r in runs {
        for (i, l) in r.labels.iter().enumerate() {
            if l[k].is_finite() {
                x.extend_from_slice(&r.x[i * nf..(i + 1) * nf]);
                y.push(l[k] as f32);
            }
        }
    }
    if !y.iter().any(|v| *v > 0.5) {
        bail!("no positive row to learn from");
    }
    let mut d = Dataset::from_slice(&x, &y, nf as i32, true).context("LightGBM dataset")?;
    d.set_feature_names(&fj::names())
        .context("LightGBM feature names")?;
    let m = Lgbm::train(d, &params(args.rounds, args.leaves, &y)).context("LightGBM training")?;
    let text = m.save_string().context("saving the LightGBM model")?;
    let ours = Booster::parse(&text).context("LightGBM wrote a model probe cannot read")?;
    // The Rust evaluator against LightGBM's own predictions.
    let n = (y.len()).min(2000);
    let theirs = m
        .predict(&x[..n * nf], nf as i32, true)
        .context("LightGBM predict")?;
    let diff = x[..n * nf]
        .chunks(nf)
        .map(|r| ours.predict(r))
        .zip(&theirs)
        .fold(0.0f64, |d, (a, b)| d.max((a - b).abs()));
    if diff.is_nan() || diff > 1e-6 {
        bail!("the Rust evaluator differs from LightGBM by {diff:e}");
    }
    Ok((text, ours))
}

fn score(m: &Booster, r: &Rows) -> Vec<f64> {
    r.x.chunks(fj::names().len())
        .map(|x| m.predict(x))
        .collect()
}

fn host_scores(run: &Run, r: &Rows, s: &[f64]) -> Vec<HostScores> {
    let mut out: Vec<HostScores> = run
        .hosts
        .iter()
        .map(|h| HostScores {
            rank: h.rank,
            time_unix: h.rows.iter().map(|r| r.time_unix).collect(),
            score: Vec::with_capacity(h.rows.len()),
            direction: Vec::with_capacity(h.rows.len()),
        })
        .collect();
    for ((h, v), d) in r.host.iter().zip(s).zip(&r.dir) {
        out[*h]
            .score
            .push(if v.is_finite() { *v } else { f64::MIN });
        out[*h].direction.push(*d);
    }
    out
}

fn rule((stand_out, hold): (f64, usize), threshold: f64) -> RuleConfig {
    RuleConfig {
        threshold,
        stand_out,
        hold,
        grid_s: 1.0,
    }
}

fn verdicts(runs: &[Run], rows: &[Rows], scores: &[Vec<f64>], rule: RuleConfig) -> Vec<RunVerdict> {
    runs.iter()
        .zip(rows)
        .zip(scores)
        .enumerate()
        .map(|(i, ((run, r), s))| ej::judge(i, run, &ej::warnings(&host_scores(run, r, s), &rule)))
        .collect()
}

/// The shape of [`SHAPES`] that names the most gradual slowdowns right before they
/// happen on `runs` (out of fold), with its threshold.
fn choose(runs: &[Run], rows: &[Rows], scores: &[Vec<f64>]) -> ((f64, usize), f64, String) {
    let all = (0..runs.len()).collect::<Vec<_>>();
    let mut best: Option<((f64, usize), f64, f64)> = None;
    let mut said = String::new();
    for &shape in SHAPES {
        let thr = threshold(runs, rows, scores, shape);
        let f = ej::figures(&verdicts(runs, rows, scores, rule(shape, thr)), &all);
        let right = f.warned * f.right;
        let _ = writeln!(
            said,
            "| {}x, {} ticks | {thr:.4} | {:.2} | {:.2} | {:.2} | {:.2} |",
            shape.0, shape.1, f.warned, f.right, right, f.false_per_calm_hour
        );
        if right.is_finite() && best.is_none_or(|(_, _, b)| right > b) {
            best = Some((shape, thr, right));
        }
    }
    let (shape, thr, _) = best.unwrap_or((SHAPES[0], f64::INFINITY, 0.0));
    (shape, thr, said)
}

/// The lowest threshold whose warnings stay within the budget on `runs` (candidates: the
/// score quantiles of the rows of hosts with no episode under way).
fn threshold(runs: &[Run], rows: &[Rows], scores: &[Vec<f64>], shape: (f64, usize)) -> f64 {
    let mut calm: Vec<f64> = Vec::new();
    for (r, s) in rows.iter().zip(scores) {
        for (i, v) in s.iter().enumerate() {
            if v.is_finite() && r.labels[i][culprit_column()] == 0.0 {
                calm.push(*v);
            }
        }
    }
    calm.sort_by(f64::total_cmp);
    if calm.is_empty() {
        return f64::INFINITY;
    }
    let all = (0..runs.len()).collect::<Vec<_>>();
    for k in 1..=40 {
        // 1 - q from 0.1 down to 1e-5, log-spaced.
        let q = 1.0 - 0.1 * 10f64.powf(-(k as f64) / 10.0);
        let thr = calm[((calm.len() - 1) as f64 * q).round() as usize];
        let f = ej::figures(&verdicts(runs, rows, scores, rule(shape, thr)), &all);
        if f.false_per_calm_hour <= BUDGET {
            return thr;
        }
    }
    calm[calm.len() - 1] + 1e-9
}

/// Per (onset, kind) of the episodes that slowed the job: how many, warned before the
/// slowdown, right host among those, named within 10 s.
fn kinds(v: &[RunVerdict]) -> String {
    let mut by: std::collections::BTreeMap<(bool, &str), [usize; 4]> = Default::default();
    for e in v.iter().flat_map(|r| &r.episodes) {
        if e.slowed_after_s.is_none() {
            continue;
        }
        let c = by.entry((!e.gradual, e.kind.as_str())).or_default();
        c[0] += 1;
        c[1] += e.lead_s.is_some() as usize;
        c[2] += e.lead_right as usize;
        c[3] += e.named as usize;
    }
    let mut s = String::from("| onset | kind | slowed the job | warned before | right host | named within 10 s |\n|---|---|---|---|---|---|\n");
    for ((abrupt, kind), c) in by {
        let onset = if abrupt { "abrupt" } else { "gradual" };
        let _ = writeln!(
            s,
            "| {onset} | {kind} | {} | {} | {} | {} |",
            c[0], c[1], c[2], c[3]
        );
    }
    s
}

/// A statistic with its 95% bootstrap interval over the held-out runs.
fn with_ci(v: f64, samples: &[f64]) -> String {
    match metrics::interval(samples, 0.95) {
        Some((lo, hi)) => format!("{v:.2} [{lo:.2}, {hi:.2}]"),
        None => format!("{v:.2}"),
    }
}

/// PR-AUC of `s` on the rows of target `k` whose label is known, over the runs `drawn`.
fn pr_auc(rows: &[Rows], scores: &[Vec<f64>], k: usize, drawn: &[usize]) -> Option<f64> {
    let (mut s, mut y) = (Vec::new(), Vec::new());
    for &i in drawn {
        for (l, v) in rows[i].labels.iter().zip(&scores[i]) {
            if l[k].is_finite() {
                s.push(if v.is_finite() { *v } else { f64::MIN });
                y.push(l[k] > 0.5);
            }
        }
    }
    metrics::average_precision(&s, &y)
}

fn feature_scores(rows: &[Rows], name: &str) -> Vec<Vec<f64>> {
    let nf = fj::names().len();
    let c = fj::names()
        .iter()
        .position(|n| n == name)
        .expect("a job feature");
    rows.iter()
        .map(|r| r.x.chunks(nf).map(|x| x[c]).collect())
        .collect()
}

fn load(paths: &[std::path::PathBuf], what: &str) -> Result<Vec<Run>> {
    if paths.is_empty() {
        bail!("--job needs {what} runs");
    }
    paths
        .iter()
        .map(|p| Run::load(p).with_context(|| format!("reading {}", p.display())))
        .collect()
}

/// Out-of-fold scores of target `k` on the training runs, folds by run.
fn out_of_fold(trows: &[Rows], k: usize, args: &TrainArgs, target: &str) -> Result<Vec<Vec<f64>>> {
    let mut oof: Vec<Vec<f64>> = trows.iter().map(|r| vec![f64::NAN; r.host.len()]).collect();
    for f in 0..FOLDS {
        let fit_on: Vec<&Rows> = trows
            .iter()
            .enumerate()
            .filter(|(i, _)| i % FOLDS != f)
            .map(|(_, r)| r)
            .collect();
        let (_, m) = fit(&fit_on, k, args).with_context(|| format!("{target}, fold {f}"))?;
        for (i, r) in trows.iter().enumerate().filter(|(i, _)| i % FOLDS == f) {
            oof[i] = score(&m, r);
        }
    }
    Ok(oof)
}

/// Held-out PR-AUC of target `k`'s scores `hs` against each baseline, paired by run, into
/// the report; and whether it beats every baseline outside the interval.
fn ranking(
    hrows: &[Rows],
    hs: &[Vec<f64>],
    k: usize,
    target: &str,
    report: &mut String,
) -> Result<(f64, bool)> {
    let hall: Vec<usize> = (0..hrows.len()).collect();
    // Ranking: PR-AUC on held-out rows, against each baseline, paired by run.
    let base: Vec<(&str, Vec<Vec<f64>>)> = BASELINES
        .iter()
        .map(|b| (*b, feature_scores(hrows, b)))
        .collect();
    let boot = metrics::bootstrap(hrows.len(), REPS, SEED, |d| {
        let m = pr_auc(hrows, hs, k, d)?;
        let mut v = vec![m];
        for (_, b) in &base {
            v.push(m - pr_auc(hrows, b, k, d)?);
        }
        Some(v)
    });
    let col = |j: usize| boot.iter().map(|v| v[j]).collect::<Vec<f64>>();
    let ap = pr_auc(hrows, hs, k, &hall).unwrap_or(f64::NAN);
    let pos = {
        let (mut n, mut p) = (0usize, 0usize);
        for r in hrows {
            for l in &r.labels {
                if l[k].is_finite() {
                    n += 1;
                    p += (l[k] > 0.5) as usize;
                }
            }
        }
        p as f64 / n.max(1) as f64
    };
    writeln!(
        report,
        "## {target}\n\nheld-out PR-AUC {} (always-alarm {pos:.3})",
        with_ci(ap, &col(0))
    )?;
    let mut beats = true;
    for (j, (b, bs)) in base.iter().enumerate() {
        let d = ap - pr_auc(hrows, bs, k, &hall).unwrap_or(f64::NAN);
        let ci = metrics::interval(&col(j + 1), 0.95);
        beats &= ci.is_some_and(|(lo, _)| lo > 0.0);
        writeln!(report, "- minus {b}: {}", with_ci(d, &col(j + 1)))?;
    }
    Ok((ap, beats))
}

/// The index of the highest of `scores` (NaN lowest).
fn argmax(scores: impl Iterator<Item = f64>) -> Option<usize> {
    scores
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .fold(None, |b: Option<(usize, f64)>, (i, v)| match b {
            Some((_, bv)) if bv >= v => b,
            _ => Some((i, v)),
        })
        .map(|(i, _)| i)
}

/// Fills `rows`' directions from per-direction scores (`by[d][run][row]`).
fn set_directions(rows: &mut [Rows], by: &[Vec<Vec<f64>>]) {
    for (i, r) in rows.iter_mut().enumerate() {
        for (j, d) in r.dir.iter_mut().enumerate() {
            *d = argmax(by.iter().map(|s| s[i][j]));
        }
    }
}

/// On the rows of `drawn` where a culprit's episode is under way: the share whose direction
/// is right, and the share a constant direction `always` would get right.
fn direction_accuracy(rows: &[Rows], drawn: &[usize], always: usize) -> Option<(f64, f64)> {
    let (mut n, mut ok, mut base) = (0usize, 0usize, 0usize);
    for &i in drawn {
        let r = &rows[i];
        for (l, d) in r.labels.iter().zip(&r.dir) {
            let Some(truth) = (0..DIRECTIONS.len()).find(|&k| l[direction_column(k)] == 1.0) else {
                continue;
            };
            n += 1;
            ok += (*d == Some(truth)) as usize;
            base += (truth == always) as usize;
        }
    }
    (n > 0).then(|| (ok as f64 / n as f64, base as f64 / n as f64))
}

/// The direction models: one per direction, each fitted on the training rows where a
/// culprit's episode is under way (its direction against the others); a row's direction is
/// the one whose model scores it highest. Out of fold on the training runs (the rule's
/// shape and threshold are chosen with the directions the warning would carry), fitted on
/// all of them for the held-out runs and the daemon; judged on the held-out culprit rows
/// against the most common direction. Returns the manifest's entry.
fn directions(
    trows: &mut [Rows],
    hrows: &mut [Rows],
    args: &TrainArgs,
    out: &std::path::Path,
    report: &mut String,
) -> Result<serde_json::Value> {
    let mut oof = Vec::new();
    let mut held = Vec::new();
    let mut files = serde_json::Map::new();
    for (d, name) in DIRECTIONS.iter().enumerate() {
        let target = format!("direction_{name}");
        oof.push(out_of_fold(trows, direction_column(d), args, &target)?);
        let all: Vec<&Rows> = trows.iter().collect();
        let (text, m) = fit(&all, direction_column(d), args).with_context(|| target.clone())?;
        let file = format!("job-direction-{name}.txt");
        std::fs::write(out.join(&file), &text)?;
        files.insert((*name).to_string(), json!(file));
        held.push(hrows.iter().map(|r| score(&m, r)).collect::<Vec<_>>());
    }
    set_directions(trows, &oof);
    set_directions(hrows, &held);
    // The most common direction of the training runs' culprit rows: the constant baseline.
    let mut counts = [0usize; DIRECTIONS.len()];
    for l in trows.iter().flat_map(|r| &r.labels) {
        for (d, c) in counts.iter_mut().enumerate() {
            *c += (l[direction_column(d)] == 1.0) as usize;
        }
    }
    let always = (0..counts.len()).max_by_key(|&d| counts[d]).unwrap_or(0);
    let hall: Vec<usize> = (0..hrows.len()).collect();
    let (acc, base) = direction_accuracy(hrows, &hall, always).unwrap_or((f64::NAN, f64::NAN));
    let boot = metrics::bootstrap(hrows.len(), REPS, SEED, |d| {
        direction_accuracy(hrows, d, always).map(|(a, b)| vec![a, a - b])
    });
    let col = |j: usize| boot.iter().map(|v| v[j]).collect::<Vec<f64>>();
    writeln!(
        report,
        "## The warning's direction

held-out rows with a culprit's episode under way, its direction right: {} (always `{}`: {base:.2}; the models minus it: {})
",
        with_ci(acc, &col(0)),
        DIRECTIONS[always],
        with_ci(acc - base, &col(1)),
    )?;
    eprintln!(
        "train: direction: held-out accuracy {acc:.3} (always {}: {base:.3})",
        DIRECTIONS[always]
    );
    Ok(
        json!({"models": files, "heldout_accuracy": acc, "always": DIRECTIONS[always], "always_accuracy": base}),
    )
}

type Split<'a> = (&'a [Run], &'a [Rows]);
/// The rule's shape, the model's threshold, the held-out figures.
type Warning = (
    (f64, usize),
    f64,
    serde_json::Map<String, serde_json::Value>,
);

/// The warning (the culprit model's scores under the rule) and the baselines under the same
/// rule, each with its threshold from the training runs, judged on the held-out runs into
/// the report. Returns the rule's shape, the model's threshold and the figures.
fn judge_warning(
    (train, trows): Split,
    (held, hrows): Split,
    oof: &[Vec<f64>],
    hs: Vec<Vec<f64>>,
    report: &mut String,
) -> Result<Warning> {
    let hall: Vec<usize> = (0..held.len()).collect();
    let (shape, thr, shapes) = choose(train, trows, oof);
    let (stand_out, hold) = shape;
    let mut scorers: Vec<(String, f64, Vec<Vec<f64>>)> = vec![("model (culprit)".into(), thr, hs)];
    for b in BASELINES {
        let tb = feature_scores(trows, b);
        let t = threshold(train, trows, &tb, shape);
        scorers.push(((*b).into(), t, feature_scores(hrows, b)));
    }
    writeln!(
        report,
        "## The rule's shape, out of fold on the training runs\n\n| stand-out, held | threshold | gradual warned | right host of warned | warned right | false per calm job-hour |\n|---|---|---|---|---|---|\n{shapes}"
    )?;
    writeln!(
        report,
        "## The warning (rule: score >= threshold for {hold} ticks and >= {stand_out}x the median of the job's hosts; threshold chosen out of fold on the training runs for <= {BUDGET} false warning per calm job-hour), held out\n"
    )?;
    writeln!(report, "| scorer | threshold | gradual warned before slowdown | lead >= 5 s | median lead s | of warned: right host when training slowed | ... and direction | ... by the first name | median lead of the right name s | abrupt named within 10 s: host | ... and direction | false per calm job-hour | false in non-slowing episodes |")?;
    writeln!(
        report,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )?;
    let mut figures_json = serde_json::Map::new();
    let mut by_kind = String::new();
    for (n, (name, t, s)) in scorers.iter().enumerate() {
        let v = verdicts(held, hrows, s, rule(shape, *t));
        if n == 0 {
            by_kind = kinds(&v);
        }
        let f: Figures = ej::figures(&v, &hall);
        let boot = metrics::bootstrap(held.len(), REPS, SEED, |d| {
            let g = ej::figures(&v, d);
            Some(vec![
                g.warned,
                g.lead5,
                g.right,
                g.right_direction,
                g.first_right,
                g.abrupt_named,
                g.abrupt_named_direction,
                g.false_per_calm_hour,
            ])
        });
        let col = |j: usize| boot.iter().map(|v| v[j]).collect::<Vec<f64>>();
        writeln!(
            report,
            "| {name} | {t:.4} | {} of {} | {} | {:.1} | {} | {} | {} | {:.1} | {} of {} | {} | {} ({:.2} h) | {} |",
            with_ci(f.warned, &col(0)),
            f.gradual,
            with_ci(f.lead5, &col(1)),
            f.median_lead_s,
            with_ci(f.right, &col(2)),
            with_ci(f.right_direction, &col(3)),
            with_ci(f.first_right, &col(4)),
            f.median_right_lead_s,
            with_ci(f.abrupt_named, &col(5)),
            f.abrupt,
            with_ci(f.abrupt_named_direction, &col(6)),
            with_ci(f.false_per_calm_hour, &col(7)),
            f.calm_hours,
            f.false_in_episodes
        )?;
        figures_json.insert(
            name.clone(),
            json!({
                "threshold": t, "gradual": f.gradual, "warned": f.warned, "lead5": f.lead5,
                "median_lead_s": f.median_lead_s, "right_host": f.right,
                "right_host_and_direction": f.right_direction, "first_name_right": f.first_right,
                "median_right_lead_s": f.median_right_lead_s, "abrupt": f.abrupt,
                "abrupt_named": f.abrupt_named, "abrupt_named_direction": f.abrupt_named_direction, "false_per_calm_hour": f.false_per_calm_hour,
                "false_in_non_slowing_episodes": f.false_in_episodes, "calm_hours": f.calm_hours,
            }),
        );
    }
    writeln!(
        report,
        "\n### The model's warning by episode kind (held out)\n\n{by_kind}"
    )?;
    Ok((shape, thr, figures_json))
}

pub fn main(args: &TrainArgs) -> Result<()> {
    let out = &args.out;
    if out.join("job.json").exists() && !args.force {
        bail!(
            "{} holds a job model; pass --force to overwrite it",
            out.display()
        );
    }
    let train = load(&args.data, "training (--data)")?;
    let held = load(&args.heldout, "held-out (--heldout)")?;
    let mut trows: Vec<Rows> = train.iter().map(rows_of).collect();
    let mut hrows: Vec<Rows> = held.iter().map(rows_of).collect();
    let names = targets();
    let culprit = names.len() - 1;
    let mut report = String::new();
    let mut models = serde_json::Map::new();
    let mut refused = serde_json::Map::new();
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut warning = None;
    writeln!(
        report,
        "# The job's early warning: {} training runs, {} held out\n",
        train.len(),
        held.len()
    )?;
    for d in DIRECTIONS {
        let _ = std::fs::remove_file(out.join(format!("job-direction-{d}.txt")));
    }
    let mut direction_report = String::new();
    let direction = directions(&mut trows, &mut hrows, args, out, &mut direction_report)?;
    for (k, target) in names.iter().enumerate() {
        let oof = out_of_fold(&trows, k, args, target)?;
        let all: Vec<&Rows> = trows.iter().collect();
        let (text, m) = fit(&all, k, args).with_context(|| target.clone())?;
        let file = format!("job-{}.txt", target.replace('_', "-"));
        let _ = std::fs::remove_file(out.join(&file));
        let hs: Vec<Vec<f64>> = hrows.iter().map(|r| score(&m, r)).collect();
        let (ap, beats) = ranking(&hrows, &hs, k, target, &mut report)?;
        // A model that does not beat every baseline outside the interval is not shipped
        // (unless --no-gate): the daemon exports only the models in `models`.
        let entry = json!({"file": file, "heldout_pr_auc": ap, "beats_baselines": beats});
        if beats || args.no_gate {
            std::fs::write(out.join(&file), &text)?;
            models.insert(target.clone(), entry);
        } else if k == culprit {
            bail!("the warning's model (culprit) does not beat every baseline on the held-out runs (PR-AUC {ap:.3}); nothing written (--no-gate writes it anyway)");
        } else {
            writeln!(
                report,
                "Not shipped: it does not beat every baseline outside the interval."
            )?;
            refused.insert(target.clone(), entry);
        }
        if k == culprit {
            warning = Some((oof, hs));
        }
        writeln!(report)?;
        eprintln!("train: {target}: held-out PR-AUC {ap:.3}");
    }
    report.push_str(&direction_report);
    // The warning: the culprit model's score under the rule, threshold from out of fold.
    let (oof, hs) = warning.expect("the culprit target is last");
    let ((stand_out, hold), thr, figures_json) =
        judge_warning((&train, &trows), (&held, &hrows), &oof, hs, &mut report)?;
    let manifest = json!({
        "name": args.name,
        "features": fj::names(),
        "models": models,
        "refused": refused,
        "direction": direction,
        "warning": {"model": "culprit", "threshold": thr, "stand_out": stand_out, "hold_ticks": hold, "budget_per_calm_hour": BUDGET},
        "heldout": figures_json,
        "trained_on": args.data.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "heldout_runs": args.heldout.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
    });
    std::fs::write(
        out.join("job.json"),
        serde_json::to_string_pretty(&manifest)? + "\n",
    )?;
    std::fs::write(out.join("report.md"), &report)?;
    print!("{report}");
    eprintln!("train: job models and report -> {}", out.display());
    Ok(())
}

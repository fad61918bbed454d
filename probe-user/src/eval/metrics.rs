//! Metrics for one score vector against binary labels (PR curve, average precision,
//! ROC-AUC, confusion counts, best-F1 threshold), and event metrics for one entity's time
//! series (alarm episodes, false alarms, lead times).
//!
//! Conventions shared by every function here:
//! - higher score = more likely positive; "predicted positive" is `score >= threshold`;
//! - a NaN score counts as the lowest possible score (it is ranked like `-inf`, so it is
//!   predicted positive only at threshold `-inf`);
//! - `scores` and `labels` (and the time-series slices among themselves) must have the same
//!   length: a mismatch is a caller bug and panics.

use crate::model::bundle::{logit, sigmoid};

/// The score used for ranking: NaN is the lowest score, and -0.0 is folded into 0.0 so
/// that `total_cmp` and `==` agree on what a tie is.
fn key(s: f64) -> f64 {
    if s.is_nan() {
        f64::NEG_INFINITY
    } else if s == 0.0 {
        0.0
    } else {
        s
    }
}

/// One distinct score, as a threshold, with the cumulative counts of positives and
/// negatives scoring at or above it.
#[derive(Debug, Clone, Copy)]
struct Step {
    threshold: f64,
    tp: u64,
    fp: u64,
}

/// The thresholds in descending order (one per distinct score, ties as one step) with
/// cumulative counts, and the totals of positives and negatives. O(n log n).
fn steps(scores: &[f64], labels: &[bool]) -> (Vec<Step>, u64, u64) {
    assert_eq!(
        scores.len(),
        labels.len(),
        "scores and labels differ in length"
    );
    let mut order: Vec<(f64, bool)> = scores
        .iter()
        .map(|&s| key(s))
        .zip(labels.iter().copied())
        .collect();
    order.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut out: Vec<Step> = Vec::new();
    let (mut tp, mut fp) = (0u64, 0u64);
    for (i, &(s, y)) in order.iter().enumerate() {
        if y {
            tp += 1;
        } else {
            fp += 1;
        }
        // Emit a step only after the last member of a run of equal scores.
        if order.get(i + 1).is_none_or(|next| next.0 != s) {
            out.push(Step {
                threshold: s,
                tp,
                fp,
            });
        }
    }
    (out, tp, fp)
}

/// One point of a precision-recall curve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrPoint {
    pub threshold: f64,
    pub recall: f64,
    pub precision: f64,
}

/// The precision-recall curve: one point per distinct score, thresholds descending (so
/// recall is non-decreasing). Empty when there is no positive, where recall is undefined.
pub fn pr_curve(scores: &[f64], labels: &[bool]) -> Vec<PrPoint> {
    let (steps, pos, _) = steps(scores, labels);
    if pos == 0 {
        return Vec::new();
    }
    steps
        .iter()
        .map(|s| PrPoint {
            threshold: s.threshold,
            recall: s.tp as f64 / pos as f64,
            // Every step holds at least one sample, so tp + fp > 0.
            precision: s.tp as f64 / (s.tp + s.fp) as f64,
        })
        .collect()
}

/// Average precision, as sklearn's `average_precision_score`: the sum over thresholds of
/// (R_n - R_{n-1}) * P_n, with R_0 = 0 (a step function, no interpolation). None when
/// there is no positive.
pub fn average_precision(scores: &[f64], labels: &[bool]) -> Option<f64> {
    let (steps, pos, _) = steps(scores, labels);
    let mut ap = Precision::new(pos)?;
    for s in &steps {
        ap.step(s.tp, s.fp);
    }
    Some(ap.sum)
}

/// The running sum of average precision over steps in descending threshold order: one
/// place for its floating-point arithmetic, so that `Ranked` equals `average_precision`
/// bit for bit.
struct Precision {
    pos: u64,
    prev_recall: f64,
    sum: f64,
}

impl Precision {
    /// None without a positive, where recall is undefined.
    fn new(pos: u64) -> Option<Self> {
        (pos > 0).then_some(Precision {
            pos,
            prev_recall: 0.0,
            sum: 0.0,
        })
    }

    fn step(&mut self, tp: u64, fp: u64) {
        let recall = tp as f64 / self.pos as f64;
        // Every step holds at least one sample, so tp + fp > 0.
        let precision = tp as f64 / (tp + fp) as f64;
        self.sum += (recall - self.prev_recall) * precision;
        self.prev_recall = recall;
    }
}

/// One score vector ranked once for many resamples of its rows (a bootstrap): a resample
/// is a multiplicity per row, and its average precision is `average_precision` of the
/// resample's rows written out, bit for bit (the same tie groups give the same integer
/// counts), without sorting every resample: the intervals of `probe train` and `probe eval`
/// sort ~100,000 rows 200 times per scorer otherwise.
pub struct Ranked {
    /// (ranking key, label, row), by descending key.
    order: Vec<(f64, bool, usize)>,
}

impl Ranked {
    pub fn new(scores: &[f64], labels: &[bool]) -> Ranked {
        assert_eq!(
            scores.len(),
            labels.len(),
            "scores and labels differ in length"
        );
        let mut order: Vec<(f64, bool, usize)> = scores
            .iter()
            .zip(labels)
            .enumerate()
            .map(|(i, (&s, &y))| (key(s), y, i))
            .collect();
        order.sort_by(|a, b| b.0.total_cmp(&a.0));
        Ranked { order }
    }

    /// Average precision of the resample that holds row i `weight[i]` times; None when
    /// it holds no positive.
    pub fn average_precision(&self, weight: &[u64]) -> Option<f64> {
        let pos = self.order.iter().filter(|r| r.1).map(|r| weight[r.2]).sum();
        let mut ap = Precision::new(pos)?;
        // `stepped`: tp + fp at the last step.
        let (mut tp, mut fp, mut stepped) = (0u64, 0u64, 0u64);
        for (i, &(s, y, row)) in self.order.iter().enumerate() {
            if y {
                tp += weight[row];
            } else {
                fp += weight[row];
            }
            // A tie group is one step, and one the resample does not hold is none.
            if self.order.get(i + 1).is_none_or(|next| next.0 != s) && tp + fp > stepped {
                ap.step(tp, fp);
                stepped = tp + fp;
            }
        }
        Some(ap.sum)
    }
}

/// Each row's multiplicity in a resample of groups (`bootstrap` draws group indices):
/// `groups[g]` lists the rows of group g, every row in one group.
pub struct Resample {
    group_of: Vec<usize>,
    groups: usize,
}

impl Resample {
    pub fn new(groups: &[Vec<usize>]) -> Resample {
        let rows = groups.iter().map(Vec::len).sum();
        let mut group_of = vec![0; rows];
        for (g, members) in groups.iter().enumerate() {
            for &k in members {
                group_of[k] = g;
            }
        }
        Resample {
            group_of,
            groups: groups.len(),
        }
    }

    /// The multiplicity of every row when the groups `drawn` (with repeats) are drawn.
    pub fn weights(&self, drawn: &[usize]) -> Vec<u64> {
        let mut counts = vec![0u64; self.groups];
        for &g in drawn {
            counts[g] += 1;
        }
        self.group_of.iter().map(|&g| counts[g]).collect()
    }
}

/// ROC-AUC: the probability that a random positive scores above a random negative, ties
/// counting 1/2 (the Mann-Whitney U statistic divided by P*N). None without both classes.
pub fn roc_auc(scores: &[f64], labels: &[bool]) -> Option<f64> {
    let (steps, pos, neg) = steps(scores, labels);
    if pos == 0 || neg == 0 {
        return None;
    }
    // Twice U, in integers so that the only rounding is the final division: each positive
    // in a tie group beats every negative below the group and half-beats the group's own.
    let mut twice_u: u128 = 0;
    let (mut prev_tp, mut prev_fp) = (0u64, 0u64);
    for s in &steps {
        let p = (s.tp - prev_tp) as u128;
        let q = (s.fp - prev_fp) as u128;
        let below = (neg - s.fp) as u128;
        twice_u += p * (2 * below + q);
        (prev_tp, prev_fp) = (s.tp, s.fp);
    }
    Some(twice_u as f64 / (2.0 * pos as f64 * neg as f64))
}

/// Confusion counts at one threshold.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Confusion {
    pub tp: u64,
    pub fp: u64,
    pub fn_: u64,
    pub tn: u64,
}

impl Confusion {
    /// Counts with "predicted positive" = `score >= threshold` (NaN scores never are,
    /// unless the threshold is `-inf`).
    pub fn at(scores: &[f64], labels: &[bool], threshold: f64) -> Confusion {
        assert_eq!(
            scores.len(),
            labels.len(),
            "scores and labels differ in length"
        );
        let mut c = Confusion::default();
        for (&s, &y) in scores.iter().zip(labels) {
            match (key(s) >= threshold, y) {
                (true, true) => c.tp += 1,
                (true, false) => c.fp += 1,
                (false, true) => c.fn_ += 1,
                (false, false) => c.tn += 1,
            }
        }
        c
    }

    /// tp / (tp + fp); None when nothing is predicted positive.
    pub fn precision(&self) -> Option<f64> {
        let d = self.tp + self.fp;
        (d > 0).then(|| self.tp as f64 / d as f64)
    }

    /// tp / (tp + fn); None when there is no positive.
    pub fn recall(&self) -> Option<f64> {
        let d = self.tp + self.fn_;
        (d > 0).then(|| self.tp as f64 / d as f64)
    }

    /// 2tp / (2tp + fp + fn), which is the harmonic mean of precision and recall wherever
    /// both exist, and 0 (not undefined) when tp = 0 but there are positives or positive
    /// predictions. None only with neither positives nor positive predictions.
    pub fn f1(&self) -> Option<f64> {
        let d = 2 * self.tp + self.fp + self.fn_;
        (d > 0).then(|| (2 * self.tp) as f64 / d as f64)
    }
}

/// The operating point every alarm threshold (the model's and the baselines') is chosen
/// at: the lowest threshold that alarms on at most `budget` of the negative rows (the
/// share of calm time in alarm a pager can live with), so recall is as high as that budget
/// allows. `+inf` (never alarm) when even the highest score alarms on more: a scorer that
/// cannot tell calm rows apart (a constant) then never alarms instead of always.
pub fn budget_threshold(scores: &[f64], labels: &[bool], budget: f64) -> f64 {
    let (steps, _, neg) = steps(scores, labels);
    let allowed = (budget * neg as f64).floor() as u64;
    steps
        .iter()
        .take_while(|s| s.fp <= allowed)
        .filter(|s| s.threshold.is_finite())
        .last()
        .map_or(f64::INFINITY, |s| s.threshold)
}

/// Share of the negative rows alarmed at `threshold` (time in alarm when calm).
pub fn alarm_share(scores: &[f64], labels: &[bool], threshold: f64) -> Option<f64> {
    let c = Confusion::at(scores, labels, threshold);
    let neg = c.fp + c.tn;
    (neg > 0).then(|| c.fp as f64 / neg as f64)
}

/// Platt scaling on the logit of a probability: (a, b) such that
/// 1 / (1 + exp(-(a logit(p) + b))) is calibrated on these rows. Fitted by Newton's method
/// on the log loss with Platt's smoothed targets (so a separable set stays finite). None
/// without both classes.
pub fn platt(probs: &[f64], labels: &[bool]) -> Option<(f64, f64)> {
    let rows: Vec<(f64, bool)> = probs
        .iter()
        .zip(labels)
        .filter(|(p, _)| p.is_finite())
        .map(|(&p, &y)| (logit(p), y))
        .collect();
    let pos = rows.iter().filter(|r| r.1).count() as f64;
    let neg = rows.len() as f64 - pos;
    if pos == 0.0 || neg == 0.0 {
        return None;
    }
    let (hi, lo) = ((pos + 1.0) / (pos + 2.0), 1.0 / (neg + 2.0));
    let (mut a, mut b) = (1.0, 0.0);
    for _ in 0..100 {
        // Gradient and Hessian of the log loss in (a, b).
        let (mut ga, mut gb, mut haa, mut hab, mut hbb) = (0.0, 0.0, 1e-12, 0.0, 1e-12);
        for &(z, y) in &rows {
            let p = sigmoid(a * z + b);
            let d = p - if y { hi } else { lo };
            let w = p * (1.0 - p);
            ga += d * z;
            gb += d;
            haa += w * z * z;
            hab += w * z;
            hbb += w;
        }
        let det = haa * hbb - hab * hab;
        if det.abs() < 1e-300 {
            break;
        }
        let (da, db) = ((hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det);
        a -= da;
        b -= db;
        if da.abs() < 1e-10 && db.abs() < 1e-10 {
            break;
        }
    }
    (a.is_finite() && b.is_finite()).then_some((a, b))
}

/// One bin of a reliability curve: the mean predicted probability, the observed share of
/// positives, and the rows.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Bin {
    pub predicted: f64,
    pub observed: f64,
    pub rows: usize,
}

/// The reliability curve over `bins` equal-width probability bins (empty bins left out),
/// and the expected calibration error: the rows-weighted mean |predicted - observed|.
pub fn reliability(probs: &[f64], labels: &[bool], bins: usize) -> (Vec<Bin>, Option<f64>) {
    let mut acc = vec![(0.0, 0usize, 0usize); bins];
    for (&p, &y) in probs.iter().zip(labels) {
        if !p.is_finite() {
            continue;
        }
        let k = ((p.clamp(0.0, 1.0) * bins as f64) as usize).min(bins - 1);
        acc[k].0 += p;
        acc[k].1 += usize::from(y);
        acc[k].2 += 1;
    }
    let out: Vec<Bin> = acc
        .into_iter()
        .filter(|b| b.2 > 0)
        .map(|(sp, pos, n)| Bin {
            predicted: sp / n as f64,
            observed: pos as f64 / n as f64,
            rows: n,
        })
        .collect();
    let total: usize = out.iter().map(|b| b.rows).sum();
    let ece = (total > 0).then(|| {
        out.iter()
            .map(|b| b.rows as f64 * (b.predicted - b.observed).abs())
            .sum::<f64>()
            / total as f64
    });
    (out, ece)
}

/// A percentile bootstrap over `groups` groups (recordings): `reps` resamples of the
/// groups with replacement, each giving `stat` of the groups drawn (a group drawn twice is
/// there twice). Returns the statistics of every resample that gave them. Seeded, so a
/// report is the same on every run.
pub fn bootstrap<F>(groups: usize, reps: usize, seed: u64, stat: F) -> Vec<Vec<f64>>
where
    F: Fn(&[usize]) -> Option<Vec<f64>>,
{
    let mut state = seed;
    let mut next = move || {
        // splitmix64
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let n = groups as u64;
    let mut out = Vec::with_capacity(reps);
    let mut drawn = Vec::with_capacity(groups);
    for _ in 0..reps {
        drawn.clear();
        drawn.extend((0..n).map(|_| ((u128::from(next()) * u128::from(n)) >> 64) as usize));
        if let Some(v) = stat(&drawn) {
            out.push(v);
        }
    }
    out
}

/// The central `level` interval (e.g. 0.95) of samples, by percentiles; None if empty.
pub fn interval(samples: &[f64], level: f64) -> Option<(f64, f64)> {
    let mut samples: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    if samples.is_empty() {
        return None;
    }
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    Some((at((1.0 - level) / 2.0), at((1.0 + level) / 2.0)))
}

/// Maximal runs of consecutive alarmed ticks, as (first, last) indices, inclusive.
pub fn alarm_episodes(alarm: &[bool]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, &a) in alarm.iter().enumerate() {
        match (a, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i - 1));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, alarm.len() - 1));
    }
    out
}

/// Alarm episodes that announce no event: no onset at any tick i with
/// t[first] < t[i] <= t[last] + horizon_s. An onset at the episode's first tick does not
/// count: that alarm came with the event, not before it. O(n log n).
pub fn false_alarms(t: &[f64], alarm: &[bool], onset: &[bool], horizon_s: f64) -> usize {
    assert_eq!(t.len(), alarm.len(), "t and alarm differ in length");
    assert_eq!(t.len(), onset.len(), "t and onset differ in length");
    // Onset times are increasing with t, so the first onset after t[first] decides.
    let onsets: Vec<f64> = t
        .iter()
        .zip(onset)
        .filter(|(_, &o)| o)
        .map(|(&ti, _)| ti)
        .collect();
    alarm_episodes(alarm)
        .into_iter()
        .filter(|&(first, last)| {
            let k = onsets.partition_point(|&to| to <= t[first]);
            onsets.get(k).is_none_or(|&to| to > t[last] + horizon_s)
        })
        .count()
}

/// How one event onset was announced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lead {
    /// The alarm was already up at the tick before the onset, continuously for this many
    /// seconds (onset time minus the first tick of that alarm run).
    Before(f64),
    /// No alarm just before; the first alarm at or after the onset came this many seconds
    /// later (0 if the onset tick itself is alarmed).
    After(f64),
    /// No alarm from the onset to `max_delay_s` after it.
    Missed,
}

/// One `Lead` per onset, in order. See [`Lead`]; `max_delay_s` bounds how late an alarm
/// may come and still count as detecting the event. O(n).
pub fn lead_times(t: &[f64], alarm: &[bool], onset: &[bool], max_delay_s: f64) -> Vec<Lead> {
    let n = t.len();
    assert_eq!(n, alarm.len(), "t and alarm differ in length");
    assert_eq!(n, onset.len(), "t and onset differ in length");
    // run_start[i]: first tick of the alarm run containing i (meaningful where alarm[i]).
    let mut run_start = vec![0usize; n];
    for i in 0..n {
        run_start[i] = if i > 0 && alarm[i] && alarm[i - 1] {
            run_start[i - 1]
        } else {
            i
        };
    }
    // next_alarm[i]: first alarmed tick >= i, if any.
    let mut next_alarm = vec![None; n + 1];
    for i in (0..n).rev() {
        next_alarm[i] = if alarm[i] { Some(i) } else { next_alarm[i + 1] };
    }
    (0..n)
        .filter(|&i| onset[i])
        .map(|i| {
            if i > 0 && alarm[i - 1] {
                Lead::Before(t[i] - t[run_start[i - 1]])
            } else {
                match next_alarm[i] {
                    Some(k) if t[k] <= t[i] + max_delay_s => Lead::After(t[k] - t[i]),
                    _ => Lead::Missed,
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    /// ROC-AUC from its definition: count every (positive, negative) pair.
    fn auc_by_pairs(scores: &[f64], labels: &[bool]) -> f64 {
        let k = |s: f64| if s.is_nan() { f64::NEG_INFINITY } else { s };
        let (mut wins, mut pairs) = (0.0, 0.0);
        for (i, &yi) in labels.iter().enumerate() {
            for (j, &yj) in labels.iter().enumerate() {
                if yi && !yj {
                    pairs += 1.0;
                    let (a, b) = (k(scores[i]), k(scores[j]));
                    wins += if a > b {
                        1.0
                    } else if a == b {
                        0.5
                    } else {
                        0.0
                    };
                }
            }
        }
        wins / pairs
    }

    // sklearn's documented example: y = [0, 0, 1, 1], scores = [0.1, 0.4, 0.35, 0.8].
    const S: [f64; 4] = [0.1, 0.4, 0.35, 0.8];
    const Y: [bool; 4] = [false, false, true, true];

    #[test]
    fn pr_curve_by_hand() {
        // Descending: 0.8 (+), 0.4 (-), 0.35 (+), 0.1 (-).
        let c = pr_curve(&S, &Y);
        let want = [
            (0.8, 0.5, 1.0),
            (0.4, 0.5, 0.5),
            (0.35, 1.0, 2.0 / 3.0),
            (0.1, 1.0, 0.5),
        ];
        assert_eq!(c.len(), want.len());
        for (p, &(th, r, pr)) in c.iter().zip(&want) {
            assert_eq!(p.threshold, th);
            assert!(close(p.recall, r) && close(p.precision, pr), "{p:?}");
        }
    }

    #[test]
    fn pr_curve_ties_are_one_step_and_no_positive_is_empty() {
        let c = pr_curve(&[0.5, 0.5, 0.5, 0.2], &[true, false, false, true]);
        assert_eq!(c.len(), 2);
        assert_eq!(
            c[0],
            PrPoint {
                threshold: 0.5,
                recall: 0.5,
                precision: 1.0 / 3.0
            }
        );
        assert_eq!(
            c[1],
            PrPoint {
                threshold: 0.2,
                recall: 1.0,
                precision: 0.5
            }
        );
        assert!(pr_curve(&[0.1, 0.2], &[false, false]).is_empty());
    }

    #[test]
    fn average_precision_by_hand() {
        // 0.5 * 1 + 0.5 * 2/3 = 5/6, sklearn's documented 0.83.
        assert!(close(average_precision(&S, &Y).unwrap(), 5.0 / 6.0));
        // Perfect ranking: 1. All tied: one step at recall 1 with precision = prevalence.
        assert!(close(
            average_precision(&[0.9, 0.8, 0.1], &[true, true, false]).unwrap(),
            1.0
        ));
        assert!(close(
            average_precision(&[0.3; 4], &[true, false, false, false]).unwrap(),
            0.25
        ));
        assert_eq!(average_precision(&[0.1, 0.2], &[false, false]), None);
    }

    #[test]
    fn nan_scores_rank_lowest() {
        // NaN positive ranked last: steps 0.9 (+) R=.5 P=1; 0.2 (-) R=.5; NaN (+) R=1 P=2/3.
        let s = [f64::NAN, 0.9, 0.2];
        let y = [true, true, false];
        assert!(close(
            average_precision(&s, &y).unwrap(),
            0.5 + 0.5 * 2.0 / 3.0
        ));
        // The NaN positive loses to the negative (0.2): AUC = 1/2.
        assert!(close(roc_auc(&s, &y).unwrap(), 0.5));
        let c = Confusion::at(&s, &y, 0.0);
        assert_eq!(
            c,
            Confusion {
                tp: 1,
                fp: 1,
                fn_: 1,
                tn: 0
            }
        );
    }

    #[test]
    fn roc_auc_by_hand_and_as_mann_whitney() {
        // Pairs (pos, neg): 0.35>0.1, 0.35<0.4, 0.8>0.1, 0.8>0.4 -> 3/4.
        assert!(close(roc_auc(&S, &Y).unwrap(), 0.75));
        // Ties count 1/2: one pos and one neg at 0.5, another pos at 0.9 above both negs.
        let s = [0.5, 0.5, 0.9, 0.1];
        let y = [true, false, true, false];
        // pos 0.5: vs 0.5 tie (1/2), vs 0.1 win; pos 0.9: two wins -> 3.5 / 4.
        assert!(close(roc_auc(&s, &y).unwrap(), 3.5 / 4.0));
        // All tied: 1/2. One class only: None.
        assert!(close(
            roc_auc(&[1.0; 3], &[true, false, true]).unwrap(),
            0.5
        ));
        assert_eq!(roc_auc(&[0.1, 0.2], &[true, true]), None);
        // A larger case with many ties against the pair-counting definition.
        let s: Vec<f64> = (0..200).map(|i| ((i * 37) % 11) as f64 / 10.0).collect();
        let y: Vec<bool> = (0..200).map(|i| (i * 13) % 7 < 3).collect();
        assert!(close(roc_auc(&s, &y).unwrap(), auc_by_pairs(&s, &y)));
    }

    #[test]
    fn confusion_and_its_ratios() {
        // Threshold 0.35 predicts 0.4, 0.35, 0.8 positive: tp 2, fp 1, fn 0, tn 1.
        let c = Confusion::at(&S, &Y, 0.35);
        assert_eq!(
            c,
            Confusion {
                tp: 2,
                fp: 1,
                fn_: 0,
                tn: 1
            }
        );
        assert!(close(c.precision().unwrap(), 2.0 / 3.0));
        assert!(close(c.recall().unwrap(), 1.0));
        assert!(close(c.f1().unwrap(), 0.8)); // 2 * (2/3) * 1 / (2/3 + 1)
                                              // Nothing predicted positive: precision undefined, recall and F1 are 0.
        let c = Confusion::at(&S, &Y, 2.0);
        assert_eq!(c.precision(), None);
        assert_eq!(c.recall(), Some(0.0));
        assert_eq!(c.f1(), Some(0.0));
        // Precision 0 and recall 0: F1 is 0.
        let c = Confusion {
            tp: 0,
            fp: 3,
            fn_: 2,
            tn: 0,
        };
        assert_eq!(
            (c.precision(), c.recall(), c.f1()),
            (Some(0.0), Some(0.0), Some(0.0))
        );
        // No positives, no predictions: all undefined.
        let c = Confusion {
            tn: 5,
            ..Default::default()
        };
        assert_eq!((c.precision(), c.recall(), c.f1()), (None, None, None));
    }

    #[test]
    fn episodes() {
        assert_eq!(alarm_episodes(&[]), vec![]);
        assert_eq!(alarm_episodes(&[false, false]), vec![]);
        assert_eq!(
            alarm_episodes(&[true, true, false, true, false, false, true, true]),
            vec![(0, 1), (3, 3), (6, 7)]
        );
    }

    #[test]
    fn false_alarms_with_horizon() {
        let t: Vec<f64> = (0..12).map(|i| i as f64 * 10.0).collect();
        //            0      1     2      3      4      5      6      7      8      9     10     11
        let alarm = [
            true, true, false, false, false, true, false, false, false, true, false, false,
        ];
        let onset = [
            false, false, false, false, true, false, false, false, false, true, false, false,
        ];
        // Episode (0,1): t in (0, 10 + h]; the onset at t=40 is inside only if h >= 30.
        // Episode (5,5): onsets after t=50 -> 90, needs h >= 40.
        // Episode (9,9): the onset at its own first tick does not count; none after.
        assert_eq!(false_alarms(&t, &alarm, &onset, 0.0), 3);
        assert_eq!(false_alarms(&t, &alarm, &onset, 30.0), 2);
        assert_eq!(false_alarms(&t, &alarm, &onset, 40.0), 1);
        // An onset while the episode lasts (after its first tick) announces it.
        assert_eq!(
            false_alarms(&t[..3], &[true, true, true], &[false, false, true], 0.0),
            0
        );
    }

    #[test]
    fn lead_times_before_after_missed() {
        // Irregular ticks.
        let t = [0.0, 5.0, 7.0, 20.0, 21.0, 30.0, 40.0, 100.0];
        let alarm = [false, true, true, false, false, false, true, false];
        let onset = [false, false, false, true, true, true, false, true];
        let l = lead_times(&t, &alarm, &onset, 15.0);
        assert_eq!(
            l,
            vec![
                // Onset at 3 (t=20): tick 2 alarmed, its run started at tick 1 (t=5).
                Lead::Before(15.0),
                // Onset at 4 (t=21): tick 3 not alarmed; next alarm at t=40, 19 s > 15.
                Lead::Missed,
                // Onset at 5 (t=30): next alarm at t=40, within 15 s.
                Lead::After(10.0),
                // Onset at 7 (t=100): tick 6 alarmed, a run of one tick at t=40.
                Lead::Before(60.0),
            ]
        );
        // An alarm on the onset tick itself is a detection with zero delay; an onset at
        // tick 0 has no tick before it.
        assert_eq!(
            lead_times(&[0.0, 1.0], &[true, false], &[true, false], 0.0),
            vec![Lead::After(0.0)]
        );
    }

    #[test]
    fn the_budget_threshold_alarms_on_at_most_the_budget_of_calm_rows() {
        // 20 negatives scored 0..19, 5 positives scored 10.5..14.5.
        let mut sc: Vec<f64> = (0..20).map(f64::from).collect();
        let mut lb = vec![false; 20];
        sc.extend([10.5, 11.5, 12.5, 13.5, 14.5]);
        lb.extend([true; 5]);
        // 10% of 20 negatives: 2 may alarm (18 and 19): the threshold is 18.
        assert_eq!(budget_threshold(&sc, &lb, 0.1), 18.0);
        assert_eq!(alarm_share(&sc, &lb, 18.0), Some(0.1));
        // A constant never alarms rather than always.
        let flat = vec![0.3; 25];
        assert_eq!(budget_threshold(&flat, &lb, 0.05), f64::INFINITY);
        assert_eq!(alarm_share(&flat, &lb, f64::INFINITY), Some(0.0));
        // NaN scores never alarm; a budget of everything alarms at the lowest finite score.
        let mut with_nan = sc.clone();
        with_nan[0] = f64::NAN;
        assert_eq!(budget_threshold(&with_nan, &lb, 1.0), 1.0);
    }

    #[test]
    fn platt_scaling_calibrates_a_shifted_score() {
        // True probability q per row; the score is a distorted version of it.
        let mut probs = Vec::new();
        let mut labels = Vec::new();
        for k in 0..2000 {
            let q = (k % 100) as f64 / 100.0 * 0.8 + 0.1;
            let raw = sigmoid(2.0 * logit(q) + 1.5);
            // Deterministic labels with the right rate per q.
            let y = (k / 100) as f64 / 20.0 < q;
            probs.push(raw);
            labels.push(y);
        }
        let (a, b) = platt(&probs, &labels).unwrap();
        assert!(
            (a - 0.5).abs() < 0.1 && (b + 0.75).abs() < 0.15,
            "a {a} b {b}"
        );
        let cal: Vec<f64> = probs.iter().map(|&p| sigmoid(a * logit(p) + b)).collect();
        let (_, ece_raw) = reliability(&probs, &labels, 10);
        let (bins, ece) = reliability(&cal, &labels, 10);
        assert!(
            ece.unwrap() < 0.05 && ece_raw.unwrap() > 0.1,
            "{ece:?} {ece_raw:?}"
        );
        assert_eq!(bins.iter().map(|b| b.rows).sum::<usize>(), 2000);
        assert_eq!(platt(&[0.2, 0.3], &[false, false]), None);
    }

    /// A ranked resample's average precision is the written-out resample's, bit for bit:
    /// ties (within and across groups, and of NaN with -inf and 0 with -0), groups drawn
    /// twice or not at all, and resamples without a positive.
    #[test]
    fn ranked_resamples_equal_the_written_out_resample() {
        let scores: Vec<f64> = (0..60)
            .map(|i| match i % 7 {
                0 => f64::NAN,
                1 => f64::NEG_INFINITY,
                2 => -0.0,
                3 => 0.0,
                _ => ((i * 37) % 11) as f64 / 10.0,
            })
            .collect();
        let labels: Vec<bool> = (0..60).map(|i| i % 5 == 0 || i % 11 == 3).collect();
        let groups: Vec<Vec<usize>> = (0..6).map(|g| (g * 10..g * 10 + 10).collect()).collect();
        let ranked = Ranked::new(&scores, &labels);
        let resample = Resample::new(&groups);
        let compared = bootstrap(groups.len(), 300, 3, |drawn| {
            let rows: Vec<usize> = drawn.iter().flat_map(|&g| groups[g].clone()).collect();
            let s: Vec<f64> = rows.iter().map(|&k| scores[k]).collect();
            let y: Vec<bool> = rows.iter().map(|&k| labels[k]).collect();
            let want = average_precision(&s, &y);
            let got = ranked.average_precision(&resample.weights(drawn));
            assert_eq!(want.map(f64::to_bits), got.map(f64::to_bits), "{drawn:?}");
            Some(vec![])
        });
        assert_eq!(compared.len(), 300);
        // Only positives in group 0 (rows 0 and 3): some resamples hold none.
        let only_first: Vec<bool> = (0..60).map(|i| i == 0 || i == 3).collect();
        let ranked = Ranked::new(&scores, &only_first);
        assert_eq!(
            ranked.average_precision(&resample.weights(&[1, 2, 3])),
            None
        );
        assert_eq!(
            ranked
                .average_precision(&resample.weights(&[0, 0, 5]))
                .map(f64::to_bits),
            {
                let rows: Vec<usize> = [0, 0, 5].iter().flat_map(|&g| groups[g].clone()).collect();
                let s: Vec<f64> = rows.iter().map(|&k| scores[k]).collect();
                let y: Vec<bool> = rows.iter().map(|&k| only_first[k]).collect();
                average_precision(&s, &y).map(f64::to_bits)
            }
        );
    }

    #[test]
    fn the_bootstrap_is_seeded_and_its_interval_covers_the_spread() {
        let mean = |rows: &[usize]| {
            Some(vec![
                rows.iter().map(|&r| r as f64).sum::<f64>() / rows.len() as f64,
            ])
        };
        let a = bootstrap(10, 500, 7, mean);
        assert_eq!(a, bootstrap(10, 500, 7, mean));
        let m: Vec<f64> = a.iter().map(|v| v[0]).collect();
        let (lo, hi) = interval(&m, 0.95).unwrap();
        assert!(lo > 2.0 && lo < 4.5 && hi > 4.5 && hi < 7.0, "{lo} {hi}");
        assert_eq!(interval(&[], 0.95), None);
    }
}

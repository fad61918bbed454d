//! The operating point a classifier pages at: the alarm rule of `model::alarm` (a threshold
//! held for some ticks), chosen on validation rows under the alarm budget. `probe train`
//! chooses it, `probe eval` judges at it, the daemon alarms with it.
use super::metrics;
use crate::{dataset::table::FeatureTable, model::alarm};

/// The holds (ticks at or above the threshold before the alarm) `probe train` tries,
/// shortest first.
pub const HOLDS: &[u32] = &[1, 2, 3, 5, 8];

/// False alarms per entity-hour a pager can live with: the shortest hold whose validation
/// rate is within it is chosen.
pub const MAX_FALSE_ALARMS_PER_HOUR: f64 = 2.0;

/// The median spacing of the rows of each series (the recordings' tick).
pub fn median_tick(t: &FeatureTable, series: &[Vec<usize>]) -> f64 {
    let mut d: Vec<f64> = series
        .iter()
        .flat_map(|rows| {
            rows.windows(2)
                .map(|w| t.time_unix[w[1]] - t.time_unix[w[0]])
        })
        .filter(|d| *d > 0.0)
        .collect();
    crate::stats::median(&mut d).unwrap_or(1.0)
}

/// `score` (one value per table row) as the alarm rule with `for_ticks` sees it, series by
/// series ([`alarm::held`]): a row more than 1.5 ticks after the one before starts a new
/// run, as a tick without a score does in the daemon.
pub fn held_column(
    t: &FeatureTable,
    series: &[Vec<usize>],
    score: &[f64],
    for_ticks: u32,
) -> Vec<f64> {
    if for_ticks <= 1 {
        return score.to_vec();
    }
    let tick = median_tick(t, series);
    let mut out = vec![f64::NAN; score.len()];
    for rows in series {
        let p: Vec<f64> = rows.iter().map(|&r| score[r]).collect();
        let gap: Vec<bool> = rows
            .iter()
            .enumerate()
            .map(|(i, &r)| i > 0 && t.time_unix[r] - t.time_unix[rows[i - 1]] > 1.5 * tick)
            .collect();
        for (&r, h) in rows.iter().zip(alarm::held(&p, &gap, for_ticks)) {
            out[r] = h;
        }
    }
    out
}

/// Runs of alarmed calm rows (known negatives: no onset within the horizon), over every
/// series. An alarm that stays on counts once per calm stretch; alarms while an event is
/// on, or soon after it (label unknown), are neither true nor false.
pub fn false_alarms(
    series: &[Vec<usize>],
    alarm_score: &[f64],
    threshold: f64,
    label: &[f64],
) -> usize {
    series
        .iter()
        .map(|rows| {
            let calm_alarm: Vec<bool> = rows
                .iter()
                .map(|&r| alarm_score[r] >= threshold && label[r] == 0.0)
                .collect();
            metrics::alarm_episodes(&calm_alarm).len()
        })
        .sum()
}

/// The rows of `series` whose label is known, and their labels.
pub fn known_rows(series: &[Vec<usize>], label: &[f64]) -> (Vec<usize>, Vec<bool>) {
    let known: Vec<usize> = series
        .iter()
        .flatten()
        .copied()
        .filter(|&r| label[r].is_finite())
        .collect();
    let lb = known.iter().map(|&r| label[r] > 0.5).collect();
    (known, lb)
}

/// Where a classifier alarms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OperatingPoint {
    pub for_ticks: u32,
    pub threshold: f64,
    /// On the rows it was chosen on.
    pub false_alarms_per_hour: f64,
}

/// The operating point on `series` (validation rows; `score` per table row, `label` the
/// onset label, NaN where unknown): for each hold, the lowest threshold that keeps the
/// alarm on at most `budget` of the calm rows; of those, the shortest hold within
/// [`MAX_FALSE_ALARMS_PER_HOUR`], else the one with the fewest false alarms. None when no
/// threshold fits the budget at any hold.
pub fn choose(
    t: &FeatureTable,
    series: &[Vec<usize>],
    score: &[f64],
    label: &[f64],
    budget: f64,
) -> Option<OperatingPoint> {
    let (known, lb) = known_rows(series, label);
    let hours = known.len() as f64 * median_tick(t, series) / 3600.0;
    let mut best: Option<OperatingPoint> = None;
    for &k in HOLDS {
        let held = held_column(t, series, score, k);
        let sc: Vec<f64> = known.iter().map(|&r| held[r]).collect();
        let threshold = metrics::budget_threshold(&sc, &lb, budget);
        if !threshold.is_finite() {
            continue;
        }
        let fa = false_alarms(series, &held, threshold, label);
        let p = OperatingPoint {
            for_ticks: k,
            threshold,
            false_alarms_per_hour: if hours > 0.0 { fa as f64 / hours } else { 0.0 },
        };
        if p.false_alarms_per_hour <= MAX_FALSE_ALARMS_PER_HOUR {
            return Some(p);
        }
        if best.is_none_or(|b| p.false_alarms_per_hour < b.false_alarms_per_hour) {
            best = Some(p);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One series of 1 s ticks with `p` as scores and labels `y` (None: unknown).
    fn table(p: &[f64]) -> (FeatureTable, Vec<Vec<usize>>) {
        let mut t = FeatureTable::default();
        for i in 0..p.len() {
            t.recording.push("r".into());
            t.time_unix.push(i as f64);
            t.entity_kind.push("peer".into());
            t.entity.push("e".into());
        }
        (t, vec![(0..p.len()).collect()])
    }

    #[test]
    fn a_hold_is_chosen_when_single_ticks_flicker() {
        // Calm rows with a one-tick blip every 20 ticks; a positive stretch the score
        // stays high through.
        let mut p = vec![0.1; 600];
        let mut y = vec![0.0; 600];
        for i in (10..500).step_by(20) {
            p[i] = 0.9;
        }
        for i in 520..560 {
            p[i] = 0.9;
            y[i] = 1.0;
        }
        let (t, series) = table(&p);
        // Every blip is a false alarm at hold 1: 25 in 10 minutes, 150 an hour. With a hold
        // of 2 the blips never alarm, the stretch still does.
        let op = choose(&t, &series, &p, &y, 0.05).unwrap();
        assert_eq!(op.for_ticks, 2, "{op:?}");
        assert_eq!(op.false_alarms_per_hour, 0.0);
        let held = held_column(&t, &series, &p, op.for_ticks);
        assert!(held[530] >= op.threshold && held[30] < op.threshold);
    }

    #[test]
    fn false_alarms_count_calm_runs_once() {
        let p = [0.9, 0.9, 0.1, 0.9, 0.9, 0.9];
        let y = [0.0, 0.0, 0.0, 0.0, f64::NAN, 1.0];
        let (_, series) = table(&p);
        assert_eq!(false_alarms(&series, &p, 0.5, &y), 2);
    }
}

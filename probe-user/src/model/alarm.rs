//! When a classifier alarms: its probability at or above its threshold for `for_ticks`
//! ticks in a row (Prometheus's `for:`, at the daemon's tick, which a scrape every 15-60 s
//! could not evaluate). The daemon's `probe_spike_alarm`, `probe top`'s marks and
//! `probe eval`'s operating point all go through this one rule.

/// A classifier's alarm rule (from its manifest entry).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    pub threshold: f64,
    /// Consecutive ticks at or above the threshold before the alarm is up (>= 1).
    pub for_ticks: u32,
}

impl Rule {
    /// One tick: `streak` counts the ticks in a row at or above the threshold (kept by the
    /// caller per entity and model; a tick without a score resets it). True while alarmed.
    pub fn step(&self, streak: &mut u32, probability: f64) -> bool {
        if probability >= self.threshold {
            *streak = streak.saturating_add(1);
        } else {
            *streak = 0;
        }
        *streak >= self.for_ticks.max(1)
    }
}

/// The score whose threshold is the rule's alarm: over one entity's consecutive ticks, the
/// lowest probability of the last `for_ticks` (NaN until there are that many in a row, and
/// after a gap: `gap[i]` is true when tick i does not follow tick i - 1). `alarm(i)` =
/// `held(i) >= threshold`, so thresholds, alarm budgets and lead times are computed on it as
/// on a plain score.
pub fn held(probability: &[f64], gap: &[bool], for_ticks: u32) -> Vec<f64> {
    let k = for_ticks.max(1) as usize;
    let mut out = vec![f64::NAN; probability.len()];
    let mut run = 0;
    for i in 0..probability.len() {
        run = if i == 0 || gap[i] { 1 } else { run + 1 };
        if run >= k {
            // A tick without a score (NaN) breaks the run as the rule's reset does.
            let window = &probability[i + 1 - k..=i];
            if !window.iter().any(|p| p.is_nan()) {
                out[i] = window.iter().copied().fold(f64::INFINITY, f64::min);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alarm_needs_for_ticks_in_a_row() {
        let r = Rule {
            threshold: 0.5,
            for_ticks: 3,
        };
        let mut streak = 0;
        let got: Vec<bool> = [0.6, 0.7, 0.4, 0.6, 0.6, 0.9, 0.5, 0.1]
            .iter()
            .map(|&p| r.step(&mut streak, p))
            .collect();
        assert_eq!(got, [false, false, false, false, false, true, true, false]);
    }

    #[test]
    fn held_scores_alarm_exactly_where_the_rule_does() {
        let p = [
            0.6,
            0.7,
            0.4,
            0.6,
            0.6,
            0.9,
            0.5,
            0.1,
            0.8,
            0.8,
            f64::NAN,
            0.9,
        ];
        let mut gap = [false; 12];
        gap[8] = true; // tick 8 comes after a missing tick: its run starts again
        let h = held(&p, &gap, 3);
        for thr in [0.45, 0.55, 0.65] {
            let r = Rule {
                threshold: thr,
                for_ticks: 3,
            };
            let mut streak = 0;
            for i in 0..p.len() {
                if gap[i] {
                    streak = 0;
                }
                let alarmed = r.step(&mut streak, p[i]);
                assert_eq!(alarmed, h[i] >= thr, "tick {i} at {thr}: held {}", h[i]);
            }
        }
        assert!(
            h[9].is_nan(),
            "two ticks after the gap: not yet a run of three"
        );
        assert!(h[11].is_nan(), "a tick without a score breaks the run");
        assert_eq!(held(&p, &gap, 1)[..3], p[..3]);
    }
}

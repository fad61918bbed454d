//! Training labels, computed offline from one entity's observations in time order (they
//! need the future). Per horizon H: "a spike starts within (t, t+H]" for an RTT spike, a
//! retransmit storm and a queue overflow, and the RTT p99 and throughput at t+H as
//! regression targets. Definitions in docs/features.md.
use std::time::Duration;

use crate::{
    features::median,
    observe::{self as o, Observation},
};

#[derive(Clone, Debug, PartialEq)]
pub struct LabelConfig {
    pub horizons: Vec<Duration>,
    /// An RTT spike: the tick's RTT p99 above this times its rolling baseline...
    pub spike_factor: f64,
    /// ...and above this floor (seconds).
    pub rtt_floor_s: f64,
    /// The baseline: median of the RTT p99 over this much history before the tick.
    pub baseline: Duration,
    /// Ticks of history the baseline needs before any spike is called.
    pub baseline_min_ticks: usize,
    /// A retransmit storm: retransmits per second above this and above spike_factor times
    /// their own baseline.
    pub retrans_floor_per_s: f64,
    /// A queue overflow: a qdisc or interface dropping more than this per second...
    pub drops_floor_per_s: f64,
    /// ...or an interface's sojourn p99 above this (seconds).
    pub sojourn_threshold_s: f64,
}

impl Default for LabelConfig {
    fn default() -> Self {
        Self {
            horizons: vec![
                Duration::from_secs(5),
                Duration::from_secs(30),
                Duration::from_secs(120),
            ],
            spike_factor: 1.5,
            rtt_floor_s: 0.001,
            baseline: Duration::from_secs(300),
            baseline_min_ticks: 10,
            retrans_floor_per_s: 10.0,
            drops_floor_per_s: 1.0,
            sojourn_threshold_s: 0.02,
        }
    }
}

/// The events labels are made of.
pub const TARGETS: &[&str] = &["rtt_spike", "retrans_storm", "queue_overflow"];

/// Label column names, in the order [`label`] fills them: for each target its state now,
/// then per horizon the onset label; then per horizon the two regression targets.
pub fn names(cfg: &LabelConfig) -> Vec<String> {
    let h: Vec<String> = cfg
        .horizons
        .iter()
        .map(|d| crate::features::schema::label(*d))
        .collect();
    let mut out = Vec::new();
    for t in TARGETS {
        out.push(format!("{t}_now"));
        for h in &h {
            out.push(format!("{t}_{h}"));
        }
    }
    for h in &h {
        out.push(format!("rtt_p99_future_{h}"));
        out.push(format!("throughput_future_{h}"));
    }
    out
}

/// Per tick: is the value above `factor` x the median of the values in the `baseline`
/// seconds before it (needing `min` of them) and above `floor`? Unknown values are not.
fn above_baseline(t: &[f64], v: &[Option<f64>], cfg: &LabelConfig, floor: f64) -> Vec<bool> {
    let span = cfg.baseline.as_secs_f64();
    let mut out = vec![false; t.len()];
    let mut lo = 0;
    let mut hist = Vec::new();
    for i in 0..t.len() {
        while t[lo] < t[i] - span {
            lo += 1;
        }
        let Some(x) = v[i] else { continue };
        if x <= floor {
            continue;
        }
        hist.clear();
        hist.extend(v[lo..i].iter().flatten().copied());
        if hist.len() < cfg.baseline_min_ticks {
            continue;
        }
        out[i] = median(&mut hist).is_some_and(|m| x > cfg.spike_factor * m);
    }
    out
}

/// Each target's state per tick for one entity's rows (time order).
fn states(rows: &[&Observation], cfg: &LabelConfig) -> [Vec<bool>; 3] {
    let t: Vec<f64> = rows.iter().map(|r| r.time_unix).collect();
    let none = vec![false; rows.len()];
    let kind = rows.first().map_or("", |r| r.entity_kind.as_str());
    let rtt: Vec<Option<f64>> = rows.iter().map(|r| r.rtt_p99_s).collect();
    let re: Vec<Option<f64>> = rows.iter().map(|r| r.retransmits_per_s).collect();
    let spike = if kind == o::PEER {
        above_baseline(&t, &rtt, cfg, cfg.rtt_floor_s)
    } else {
        none.clone()
    };
    let storm = if kind == o::PEER {
        // A flat-zero baseline makes any retransmit "above it": the floor decides.
        above_baseline(&t, &re, cfg, cfg.retrans_floor_per_s)
    } else {
        none.clone()
    };
    let overflow = match kind {
        o::QDISC => rows
            .iter()
            .map(|r| {
                r.qdisc_drops_per_s
                    .is_some_and(|d| d > cfg.drops_floor_per_s)
            })
            .collect(),
        o::INTERFACE => rows
            .iter()
            .map(|r| {
                r.sojourn_p99_s.is_some_and(|s| s > cfg.sojourn_threshold_s)
                    || r.tx_dropped_per_s
                        .is_some_and(|d| d > cfg.drops_floor_per_s)
            })
            .collect(),
        _ => none,
    };
    [spike, storm, overflow]
}

/// Labels of every row of one entity (rows in time order), one vector per row in
/// [`names`] order; NaN where the future needed is past the end of the recording.
pub fn label(rows: &[&Observation], cfg: &LabelConfig, tick_s: f64) -> Vec<Vec<f64>> {
    let n = rows.len();
    let t: Vec<f64> = rows.iter().map(|r| r.time_unix).collect();
    let end = t.last().copied().unwrap_or(0.0);
    let states = states(rows, cfg);
    let onsets: Vec<Vec<bool>> = states
        .iter()
        .map(|s| (0..n).map(|i| s[i] && (i == 0 || !s[i - 1])).collect())
        .collect();
    let rtt: Vec<Option<f64>> = rows.iter().map(|r| r.rtt_p99_s).collect();
    let thr: Vec<Option<f64>> = rows.iter().map(|r| r.bytes_per_s()).collect();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut row = Vec::new();
        for (s, on) in states.iter().zip(&onsets) {
            row.push(if s[i] { 1.0 } else { 0.0 });
            for h in &cfg.horizons {
                let until = t[i] + h.as_secs_f64();
                let hit = (i + 1..n).take_while(|&j| t[j] <= until).any(|j| on[j]);
                row.push(if hit {
                    1.0
                } else if until > end + tick_s / 2.0 {
                    f64::NAN
                } else {
                    0.0
                });
            }
        }
        for h in &cfg.horizons {
            let at = t[i] + h.as_secs_f64();
            let j = nearest(&t, at, tick_s / 2.0);
            row.push(j.and_then(|j| rtt[j]).unwrap_or(f64::NAN));
            row.push(j.and_then(|j| thr[j]).unwrap_or(f64::NAN));
        }
        out.push(row);
    }
    out
}

/// Index of the time nearest `at` within `tol`.
fn nearest(t: &[f64], at: f64, tol: f64) -> Option<usize> {
    let i = t.partition_point(|&x| x < at);
    [i.checked_sub(1), Some(i)]
        .into_iter()
        .flatten()
        .filter(|&j| j < t.len() && (t[j] - at).abs() <= tol)
        .min_by(|&a, &b| (t[a] - at).abs().total_cmp(&(t[b] - at).abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(t: f64, rtt: f64) -> Observation {
        Observation {
            time_unix: t,
            entity_kind: o::PEER.into(),
            entity: "p".into(),
            rtt_p99_s: Some(rtt),
            tx_bytes_per_s: Some(t),
            ..Observation::default()
        }
    }

    #[test]
    fn an_rtt_spike_is_labelled_before_it_starts_and_not_after() {
        // Calm 2 ms for 60 ticks, 5 ms from tick 60 to 70, calm again.
        let rows: Vec<Observation> = (0..100)
            .map(|i| peer(i as f64, if (60..70).contains(&i) { 0.005 } else { 0.002 }))
            .collect();
        let refs: Vec<&Observation> = rows.iter().collect();
        let cfg = LabelConfig::default();
        let l = label(&refs, &cfg, 1.0);
        let names = names(&cfg);
        let col = |n: &str| names.iter().position(|x| x == n).unwrap();
        let (now, h5, h30) = (
            col("rtt_spike_now"),
            col("rtt_spike_5s"),
            col("rtt_spike_30s"),
        );
        assert_eq!(l[59][now], 0.0);
        assert_eq!(l[60][now], 1.0);
        // Onset at 60: ticks 55..=59 see it within 5 s, 54 does not; 60 itself does not
        // (the spike has started).
        assert_eq!(l[54][h5], 0.0);
        assert!((55..60).all(|i| l[i][h5] == 1.0));
        assert_eq!(l[60][h5], 0.0);
        assert_eq!(l[31][h30], 1.0);
        // The last ticks cannot know 30 s ahead: unknown, not 0.
        assert!(l[90][h30].is_nan());
        assert!(l[99][h5].is_nan());
        // Regression targets: the value at t + H.
        assert_eq!(l[50][col("rtt_p99_future_5s")], 0.002);
        assert_eq!(l[58][col("rtt_p99_future_5s")], 0.005);
        assert_eq!(l[10][col("throughput_future_30s")], 40.0);
        assert!(l[98][col("throughput_future_5s")].is_nan());
    }

    #[test]
    fn no_spike_without_a_baseline_or_below_the_floor() {
        let rows: Vec<Observation> = (0..40)
            .map(|i| {
                peer(
                    i as f64,
                    if i == 5 {
                        0.01
                    } else {
                        0.0001 + 1e-6 * i as f64
                    },
                )
            })
            .collect();
        let refs: Vec<&Observation> = rows.iter().collect();
        let cfg = LabelConfig::default();
        let l = label(&refs, &cfg, 1.0);
        // Tick 5 has only 5 ticks of history; later ticks are far below the 1 ms floor.
        assert!(l.iter().all(|r| r[0] == 0.0));
    }
}

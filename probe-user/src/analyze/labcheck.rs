//! A lab run checked against what the lab ran: the pattern it was told to run, traingen's
//! own median iteration time, and the abrupt congestion episodes against the change points
//! and the clusters.
use serde::Serialize;

use super::{load::Lab, Analysis};
use crate::stats::median;

/// The lab's pattern names, as `probe analyze` names them.
pub fn expected_pattern(lab: &str) -> &str {
    match lab {
        "ps" => super::pattern::PS,
        "ring" => super::pattern::RING,
        "pipeline" => super::pattern::PIPELINE,
        other => other,
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct EdgeCheck {
    pub episode: String,
    /// "start" or "end".
    pub edge: &'static str,
    pub time_unix: f64,
    /// Ticks from the edge to the nearest change point (None: no change point).
    pub nearest_ticks: Option<f64>,
    pub found: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct LabCheck {
    pub pattern_expected: String,
    pub pattern_found: String,
    pub pattern_ok: bool,
    pub traingen_median_s: f64,
    pub period_s: f64,
    pub period_error: f64,
    pub period_ok: bool,
    pub edges: Vec<EdgeCheck>,
    /// Share of the ticks inside abrupt episodes (after their first 5 s: the features are 5 s
    /// windows) in a non-calm cluster, and of the ticks outside every episode (and 6 s past
    /// its end) in the calm one.
    pub episode_ticks_not_calm: Option<f64>,
    pub calm_ticks_calm: Option<f64>,
}

pub const PERIOD_TOLERANCE: f64 = 0.10;
pub const EDGE_TICKS: f64 = 2.0;

pub fn check(a: &Analysis, lab: &Lab) -> LabCheck {
    let mut it = lab.iterations.clone();
    let traingen = median(&mut it).unwrap_or(f64::NAN);
    let err = (a.timing.period_s - traingen).abs() / traingen;
    let tick = a.series.tick_s;
    let mut edges = Vec::new();
    for e in lab.episodes.iter().filter(|e| e.onset == "abrupt") {
        for (edge, t) in [("start", e.t_start), ("end", e.t_end)] {
            let nearest = a
                .changes
                .iter()
                .map(|c| (c.time_unix - t) / tick)
                .min_by(|x, y| x.abs().total_cmp(&y.abs()));
            edges.push(EdgeCheck {
                episode: format!("{} on rank {}", e.kind, e.rank.unwrap_or(0)),
                edge,
                time_unix: t,
                nearest_ticks: nearest,
                // A tick's values cover the interval before it: an edge shows at the first
                // tick after it, up to a tick later than the edge itself.
                found: nearest.is_some_and(|n| n.abs() <= EDGE_TICKS + 1.0 && n > -EDGE_TICKS),
            });
        }
    }
    let (mut inside, mut calm) = (Vec::new(), Vec::new());
    if let Some(cl) = &a.clusters {
        let calm_id = cl.clusters.iter().find(|c| c.calm).map(|c| c.id);
        for (t, k) in cl.t.iter().zip(&cl.of_tick) {
            let Some(k) = k else { continue };
            let abrupt = lab
                .episodes
                .iter()
                .any(|e| e.onset == "abrupt" && e.t_start + 5.0 <= *t && *t <= e.t_end);
            let near = lab
                .episodes
                .iter()
                .any(|e| e.t_start - 1.0 <= *t && *t <= e.t_end + 6.0);
            if abrupt {
                inside.push(Some(*k) != calm_id);
            } else if !near {
                calm.push(Some(*k) == calm_id);
            }
        }
    }
    let share = |v: &[bool]| {
        (!v.is_empty()).then(|| v.iter().filter(|x| **x).count() as f64 / v.len() as f64)
    };
    let expected = expected_pattern(&lab.pattern).to_owned();
    LabCheck {
        pattern_ok: a.pattern.name == expected,
        pattern_expected: expected,
        pattern_found: a.pattern.name.to_owned(),
        traingen_median_s: traingen,
        period_s: a.timing.period_s,
        period_error: err,
        period_ok: err <= PERIOD_TOLERANCE,
        edges,
        episode_ticks_not_calm: share(&inside),
        calm_ticks_calm: share(&calm),
    }
}

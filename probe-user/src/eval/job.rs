//! The job's early warning judged against the lab's ground truth, as the person running the
//! job counts: per episode from when training slows (the job's own log), per job-hour of
//! calm for false warnings. The warning is the rule's (rules/job.rules.yml
//! `ProbeJobSlowdownForecast`) emulated on the job's hosts' scores: a host warns when its
//! score is at or over the threshold for [`RuleConfig::hold`] ticks in a row and stands out
//! against the job's hosts (at least `stand_out` times their median, its own included); the job's
//! warning starts when a first host warns and names the host with the highest score.
use std::collections::BTreeMap;

use crate::dataset::job::Run;

/// One host's score series.
pub struct HostScores {
    pub rank: usize,
    pub time_unix: Vec<f64>,
    pub score: Vec<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RuleConfig {
    pub threshold: f64,
    /// A host's score against the median of the job's hosts' at the same tick.
    pub stand_out: f64,
    /// Ticks in a row at or over the threshold.
    pub hold: usize,
    /// The common tick the hosts' series are put on (Prometheus' evaluation interval).
    pub grid_s: f64,
}

/// A job warning: when it started and the host it named.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Warning {
    pub time_unix: f64,
    pub rank: usize,
}

/// The rule's warnings on one job's hosts.
pub fn warnings(hosts: &[HostScores], cfg: &RuleConfig) -> Vec<Warning> {
    let mut grid: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
    for (h, s) in hosts.iter().enumerate() {
        for (t, v) in s.time_unix.iter().zip(&s.score) {
            let slot = grid
                .entry((t / cfg.grid_s).round() as i64)
                .or_insert_with(|| vec![f64::NAN; hosts.len()]);
            slot[h] = if slot[h].is_nan() {
                *v
            } else {
                slot[h].max(*v)
            };
        }
    }
    let mut run = vec![0usize; hosts.len()];
    let mut firing = false;
    let mut out = Vec::new();
    let mut known = Vec::with_capacity(hosts.len());
    for (k, v) in &grid {
        // The job's median at this tick, as the rule's `quantile by (training_job)`.
        known.clear();
        known.extend(v.iter().copied().filter(|x| x.is_finite()));
        let med = crate::stats::median(&mut known).unwrap_or(0.0);
        let mut best: Option<(f64, usize)> = None;
        for h in 0..hosts.len() {
            let hot = v[h] >= cfg.threshold && v[h] >= cfg.stand_out * med;
            run[h] = if hot { run[h] + 1 } else { 0 };
            if run[h] >= cfg.hold && best.is_none_or(|(b, _)| v[h] > b) {
                best = Some((v[h], h));
            }
        }
        match best {
            Some((_, h)) if !firing => {
                out.push(Warning {
                    time_unix: *k as f64 * cfg.grid_s,
                    rank: hosts[h].rank,
                });
                firing = true;
            }
            Some(_) => {}
            None => firing = false,
        }
    }
    out
}

/// A warning counts if the job slows within this long after it (the longest horizon, and
/// 10 s: the H + 10 s).
pub const FALSE_AFTER_S: f64 = 40.0;
/// Around an episode (before its start, after its end), time is not calm.
const EPISODE_BEFORE_S: f64 = 10.0;
const EPISODE_AFTER_S: f64 = 30.0;
/// A warning this long before an episode's start is still its.
const EARLY_S: f64 = 5.0;
/// An episode is named by a warning within this long after training slows.
pub const NAMED_WITHIN_S: f64 = 10.0;

/// One episode of the ground truth, judged.
#[derive(Clone, Debug)]
pub struct Judged {
    pub run: usize,
    pub kind: String,
    pub gradual: bool,
    pub rank: Option<usize>,
    /// Seconds from the episode's start to the job's slowdown, if it slowed.
    pub slowed_after_s: Option<f64>,
    /// Seconds between the first warning and the slowdown, if warned before it.
    pub lead_s: Option<f64>,
    /// That warning named the episode's host.
    pub lead_right: bool,
    /// A warning from before the episode to `NAMED_WITHIN_S` after the slowdown named the
    /// episode's host (the first such warning).
    pub named: bool,
}

/// A run's warnings against its ground truth.
#[derive(Clone, Debug, Default)]
pub struct RunVerdict {
    pub episodes: Vec<Judged>,
    /// Warnings with no slowdown within `FALSE_AFTER_S`, in calm time.
    pub false_calm: usize,
    /// ... and during (or just around) an episode that did not slow the job.
    pub false_in_episode: usize,
    pub calm_s: f64,
    pub warnings: usize,
}

fn in_episode(run: &Run, t: f64) -> bool {
    run.episodes
        .iter()
        .any(|e| e.t_start - EPISODE_BEFORE_S <= t && t <= e.t_end + EPISODE_AFTER_S)
}

/// Judges a run's warnings (`index`: the run's number in the report).
pub fn judge(index: usize, run: &Run, warns: &[Warning]) -> RunVerdict {
    let starts: Vec<f64> = run.pace.slowdowns.iter().map(|s| s.start).collect();
    let mut v = RunVerdict {
        warnings: warns.len(),
        ..RunVerdict::default()
    };
    for w in warns {
        let t = w.time_unix;
        if run.pace.slow_at(t) == Some(true) {
            continue; // the job is slow: a detection, not a forecast
        }
        if starts
            .iter()
            .any(|s| t - 1.0 <= *s && *s <= t + FALSE_AFTER_S)
        {
            continue;
        }
        if in_episode(run, t) {
            v.false_in_episode += 1;
        } else {
            v.false_calm += 1;
        }
    }
    let (from, to) = run.span();
    let mut t = from.ceil();
    while t <= to {
        if run.pace.slow_at(t) == Some(false) && !in_episode(run, t) {
            v.calm_s += 1.0;
        }
        t += 1.0;
    }
    for e in &run.episodes {
        let slow = starts
            .iter()
            .copied()
            .find(|s| e.t_start <= *s && *s <= e.t_end + NAMED_WITHIN_S);
        let mut j = Judged {
            run: index,
            kind: e.kind.clone(),
            gradual: e.onset == "gradual",
            rank: e.rank,
            slowed_after_s: slow.map(|s| s - e.t_start),
            lead_s: None,
            lead_right: false,
            named: false,
        };
        if let Some(s) = slow {
            let from = e.t_start - EARLY_S;
            if let Some(w) = warns
                .iter()
                .find(|w| from <= w.time_unix && w.time_unix < s)
            {
                j.lead_s = Some(s - w.time_unix);
                j.lead_right = Some(w.rank) == e.rank;
            }
            if let Some(w) = warns
                .iter()
                .find(|w| from <= w.time_unix && w.time_unix <= s + NAMED_WITHIN_S)
            {
                j.named = Some(w.rank) == e.rank;
            }
        }
        v.episodes.push(j);
    }
    v
}

/// The figures of a set of runs (those of `drawn`, with repeats, for a bootstrap).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    /// Gradual episodes that slowed the job.
    pub gradual: usize,
    /// ... warned before the slowdown.
    pub warned: f64,
    /// ... with a lead of at least 5 s.
    pub lead5: f64,
    pub median_lead_s: f64,
    /// Of those warned, the right host named.
    pub right: f64,
    /// Abrupt episodes that slowed the job...
    pub abrupt: usize,
    /// ... named (right host) within `NAMED_WITHIN_S` of the slowdown.
    pub abrupt_named: f64,
    pub false_per_calm_hour: f64,
    pub false_in_episodes: usize,
    pub calm_hours: f64,
}

pub fn figures(runs: &[RunVerdict], drawn: &[usize]) -> Figures {
    let eps: Vec<&Judged> = drawn
        .iter()
        .flat_map(|&r| &runs[r].episodes)
        .filter(|e| e.slowed_after_s.is_some())
        .collect();
    let share = |n: usize, of: usize| {
        if of == 0 {
            f64::NAN
        } else {
            n as f64 / of as f64
        }
    };
    let gradual: Vec<&&Judged> = eps.iter().filter(|e| e.gradual).collect();
    let warned: Vec<&&&Judged> = gradual.iter().filter(|e| e.lead_s.is_some()).collect();
    let mut leads: Vec<f64> = warned.iter().filter_map(|e| e.lead_s).collect();
    let abrupt: Vec<&&Judged> = eps.iter().filter(|e| !e.gradual).collect();
    let calm_s: f64 = drawn.iter().map(|&r| runs[r].calm_s).sum();
    let false_calm: usize = drawn.iter().map(|&r| runs[r].false_calm).sum();
    Figures {
        gradual: gradual.len(),
        warned: share(warned.len(), gradual.len()),
        lead5: share(leads.iter().filter(|l| **l >= 5.0).count(), gradual.len()),
        median_lead_s: crate::stats::median(&mut leads).unwrap_or(f64::NAN),
        right: share(warned.iter().filter(|e| e.lead_right).count(), warned.len()),
        abrupt: abrupt.len(),
        abrupt_named: share(abrupt.iter().filter(|e| e.named).count(), abrupt.len()),
        false_per_calm_hour: if calm_s > 0.0 {
            false_calm as f64 * 3600.0 / calm_s
        } else {
            f64::NAN
        },
        false_in_episodes: drawn.iter().map(|&r| runs[r].false_in_episode).sum(),
        calm_hours: calm_s / 3600.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(rank: usize, score: impl Fn(f64) -> f64) -> HostScores {
        let t: Vec<f64> = (0..100).map(|k| 1000.0 + k as f64).collect();
        HostScores {
            rank,
            score: t.iter().map(|t| score(*t)).collect(),
            time_unix: t,
        }
    }

    const RULE: RuleConfig = RuleConfig {
        threshold: 0.5,
        stand_out: 2.0,
        hold: 2,
        grid_s: 1.0,
    };

    #[test]
    fn a_host_warns_when_it_holds_over_the_threshold_and_stands_out() {
        let hosts = [
            host(0, |_| 0.1),
            host(1, |t| {
                if (1040.0..1060.0).contains(&t) {
                    0.9
                } else {
                    0.1
                }
            }),
            host(2, |_| 0.2),
        ];
        let w = warnings(&hosts, &RULE);
        assert_eq!(
            w,
            vec![Warning {
                time_unix: 1041.0,
                rank: 1
            }],
            "one warning, after two ticks, naming rank 1"
        );
        // Every host high at once: nobody stands out, no warning.
        let all = [host(0, |_| 0.9), host(1, |_| 0.9), host(2, |_| 0.8)];
        assert!(warnings(&all, &RULE).is_empty());
        // A single tick over is not held.
        let blip = [
            host(0, |t| if t == 1050.0 { 0.9 } else { 0.0 }),
            host(1, |_| 0.0),
        ];
        assert!(warnings(&blip, &RULE).is_empty());
    }
}

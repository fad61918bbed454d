//! The job's early warning judged against the lab's ground truth, as the person running the
//! job counts: per episode from when training slows (the job's own log), per job-hour of
//! calm for false warnings. The warning is the rule's (rules/job.rules.yml
//! `ProbeJobSlowdownForecast`) emulated on the job's hosts' scores: the job's highest-scoring
//! host warns when its score is at or over the threshold and stands out against the job's
//! hosts (at least `stand_out` times their median, its own included) for [`RuleConfig::hold`]
//! ticks in a row with the same direction. When another host (or direction) takes over, the
//! warning names it instead: what the person paged sees when training slows is the last name.
use std::collections::BTreeMap;

use crate::dataset::job::Run;

/// One host's score series, with the direction its warning would carry at each tick (an
/// index into [`crate::model::job::DIRECTIONS`]).
pub struct HostScores {
    pub rank: usize,
    pub time_unix: Vec<f64>,
    pub score: Vec<f64>,
    pub direction: Vec<Option<usize>>,
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

/// A job warning naming a host (and direction): when, and whether it is a new warning or
/// the name of one already under way changing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Warning {
    pub time_unix: f64,
    pub rank: usize,
    pub direction: Option<usize>,
    /// No host was named in the `hold + 1` ticks before: a new warning (what false
    /// warnings are counted of), not a change of name.
    pub new: bool,
}

/// The rule's warnings on one job's hosts: each time the name changes.
pub fn warnings(hosts: &[HostScores], cfg: &RuleConfig) -> Vec<Warning> {
    let mut grid: BTreeMap<i64, Vec<(f64, Option<usize>)>> = BTreeMap::new();
    for (h, s) in hosts.iter().enumerate() {
        for ((t, v), d) in s.time_unix.iter().zip(&s.score).zip(&s.direction) {
            let slot = grid
                .entry((t / cfg.grid_s).round() as i64)
                .or_insert_with(|| vec![(f64::NAN, None); hosts.len()]);
            if slot[h].0.is_nan() || *v > slot[h].0 {
                slot[h] = (*v, *d);
            }
        }
    }
    let mut run = vec![0usize; hosts.len()];
    let mut last_dir: Vec<Option<usize>> = vec![None; hosts.len()];
    let mut named: Option<(usize, Option<usize>)> = None;
    let mut last_named: Option<i64> = None;
    let mut out = Vec::new();
    let mut known = Vec::with_capacity(hosts.len());
    for (k, v) in &grid {
        // The job's median at this tick, as the rule's `quantile by (training_job)`, and
        // its highest host, as its `max by (training_job)`.
        known.clear();
        known.extend(v.iter().map(|x| x.0).filter(|x| x.is_finite()));
        let med = crate::stats::median(&mut known).unwrap_or(0.0);
        let top =
            (0..hosts.len())
                .filter(|&h| v[h].0.is_finite())
                .fold(None, |b: Option<usize>, h| match b {
                    Some(b) if v[b].0 >= v[h].0 => Some(b),
                    _ => Some(h),
                });
        let mut now = None;
        for h in 0..hosts.len() {
            let (x, d) = v[h];
            let hot = Some(h) == top && x >= cfg.threshold && x >= cfg.stand_out * med;
            // An alert's labels are its identity: a new direction is a new alert, pending
            // again.
            run[h] = match hot {
                true if d == last_dir[h] => run[h] + 1,
                true => 1,
                false => 0,
            };
            last_dir[h] = d;
            if run[h] >= cfg.hold {
                now = Some((h, d));
            }
        }
        match now {
            Some((h, d)) => {
                if named != Some((h, d)) {
                    out.push(Warning {
                        time_unix: *k as f64 * cfg.grid_s,
                        rank: hosts[h].rank,
                        direction: d,
                        new: last_named.is_none_or(|l| k - l > cfg.hold as i64 + 1),
                    });
                }
                named = Some((h, d));
                last_named = Some(*k);
            }
            None => named = None,
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
    /// The first warning named the episode's host.
    pub first_right: bool,
    /// The last name before the slowdown (what stands when training slows) was the
    /// episode's host; and its direction too.
    pub lead_right: bool,
    pub lead_right_direction: bool,
    /// Seconds between the first warning naming the episode's host and the slowdown.
    pub right_lead_s: Option<f64>,
    /// A warning from before the episode to `NAMED_WITHIN_S` after the slowdown named the
    /// episode's host; and its direction too.
    pub named: bool,
    pub named_direction: bool,
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
    for w in warns.iter().filter(|w| w.new) {
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
        let direction = e.direction();
        let mut j = Judged {
            run: index,
            kind: e.kind.clone(),
            gradual: e.onset == "gradual",
            rank: e.rank,
            slowed_after_s: slow.map(|s| s - e.t_start),
            lead_s: None,
            first_right: false,
            lead_right: false,
            lead_right_direction: false,
            right_lead_s: None,
            named: false,
            named_direction: false,
        };
        if let Some(s) = slow {
            let from = e.t_start - EARLY_S;
            let right = |w: &&Warning| Some(w.rank) == e.rank;
            let before: Vec<&Warning> = warns
                .iter()
                .filter(|w| from <= w.time_unix && w.time_unix < s)
                .collect();
            if let (Some(first), Some(last)) = (before.first(), before.last()) {
                j.lead_s = Some(s - first.time_unix);
                j.first_right = right(first);
                j.lead_right = right(last);
                j.lead_right_direction = j.lead_right && last.direction == direction;
                j.right_lead_s = before
                    .iter()
                    .copied()
                    .find(|w| right(w))
                    .map(|w| s - w.time_unix);
            }
            let by: Vec<&Warning> = warns
                .iter()
                .filter(|w| from <= w.time_unix && w.time_unix <= s + NAMED_WITHIN_S)
                .filter(right)
                .collect();
            j.named = !by.is_empty();
            j.named_direction = by.iter().any(|w| w.direction == direction);
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
    /// Of those warned, the right host named when training slowed (the last name); and
    /// with its direction; and by the first name.
    pub right: f64,
    pub right_direction: f64,
    pub first_right: f64,
    /// The median lead of the first warning naming the right host, of those it names.
    pub median_right_lead_s: f64,
    /// Abrupt episodes that slowed the job...
    pub abrupt: usize,
    /// ... named (right host; and direction) within `NAMED_WITHIN_S` of the slowdown.
    pub abrupt_named: f64,
    pub abrupt_named_direction: f64,
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
    let mut right_leads: Vec<f64> = warned
        .iter()
        .filter(|e| e.lead_right)
        .filter_map(|e| e.right_lead_s)
        .collect();
    let count = |v: &[&&&Judged], f: fn(&Judged) -> bool| v.iter().filter(|e| f(e)).count();
    let abrupt: Vec<&&Judged> = eps.iter().filter(|e| !e.gradual).collect();
    let calm_s: f64 = drawn.iter().map(|&r| runs[r].calm_s).sum();
    let false_calm: usize = drawn.iter().map(|&r| runs[r].false_calm).sum();
    Figures {
        gradual: gradual.len(),
        warned: share(warned.len(), gradual.len()),
        lead5: share(leads.iter().filter(|l| **l >= 5.0).count(), gradual.len()),
        median_lead_s: crate::stats::median(&mut leads).unwrap_or(f64::NAN),
        right: share(count(&warned, |e| e.lead_right), warned.len()),
        right_direction: share(count(&warned, |e| e.lead_right_direction), warned.len()),
        first_right: share(count(&warned, |e| e.first_right), warned.len()),
        median_right_lead_s: crate::stats::median(&mut right_leads).unwrap_or(f64::NAN),
        abrupt: abrupt.len(),
        abrupt_named: share(abrupt.iter().filter(|e| e.named).count(), abrupt.len()),
        abrupt_named_direction: share(
            abrupt.iter().filter(|e| e.named_direction).count(),
            abrupt.len(),
        ),
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
            direction: vec![Some(0); t.len()],
            time_unix: t,
        }
    }

    const RULE: RuleConfig = RuleConfig {
        threshold: 0.5,
        stand_out: 2.0,
        hold: 2,
        grid_s: 1.0,
    };

    fn at(t: f64, rank: usize, direction: usize, new: bool) -> Warning {
        Warning {
            time_unix: t,
            rank,
            direction: Some(direction),
            new,
        }
    }

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
            vec![at(1041.0, 1, 0, true)],
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

    #[test]
    fn the_warning_follows_the_jobs_highest_host_and_its_direction() {
        // Of six hosts, rank 0 warns first; rank 1 overtakes it (an incast's receiver after
        // its first sender); then rank 1's direction changes. Each is a change of name, not
        // a new warning.
        let mut hosts = [
            host(0, |t| {
                if (1040.0..1060.0).contains(&t) {
                    0.7
                } else {
                    0.1
                }
            }),
            host(1, |t| {
                if (1045.0..1070.0).contains(&t) {
                    0.9
                } else {
                    0.1
                }
            }),
            host(2, |_| 0.1),
            host(3, |_| 0.1),
            host(4, |_| 0.1),
            host(5, |_| 0.1),
        ];
        for (k, t) in hosts[1].time_unix.clone().iter().enumerate() {
            if *t >= 1055.0 {
                hosts[1].direction[k] = Some(1);
            }
        }
        assert_eq!(
            warnings(&hosts, &RULE),
            vec![
                at(1041.0, 0, 0, true),
                at(1046.0, 1, 0, false),
                at(1056.0, 1, 1, false),
            ]
        );
    }
}

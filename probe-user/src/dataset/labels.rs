//! Training labels, computed offline from one entity's observations in time order (they
//! need the future). Definitions in docs/features.md ("Labels"); in short:
//!
//! - An *event* is a sustained departure from a calm level: its raw condition (e.g. RTT
//!   p99 >= 2x the calm level and >= 1 ms above it) holds for `min_on` in a row, and it ends
//!   only after `min_off` in a row without it (hysteresis). The calm level is a low
//!   quantile of the signal over the `calm_window` before the tick, so that the noise of
//!   the signal itself (a p99) does not move it.
//! - An *onset* is an event that starts after at least `quiet` without the event.
//! - The onset label for horizon H at tick t: an onset in (t, t + H]. Rows while the event
//!   is on, within `quiet` after it, without `quiet` of known history, or whose horizon
//!   passes the end of the recording are unknown (NaN): they are neither a forecast nor a
//!   false alarm, and training and evaluation skip them.
//! - Targets: `rtt_spike`, `retrans_storm` (peers), `queue_overflow` (interfaces, qdiscs)
//!   from the observations; `iteration_slowdown` (peers) from the training job's own
//!   iteration log when there is one (the lab's traingen log: what the job's owner feels);
//!   and the RTT p99 and throughput at t + H as regression targets.
use std::time::Duration;

use crate::{
    observe::{self as o, Observation},
    stats::quantile,
};

#[derive(Clone, Debug, PartialEq)]
pub struct LabelConfig {
    pub horizons: Vec<Duration>,
    /// An RTT spike: the tick's RTT p99 at least this times its calm level...
    pub spike_factor: f64,
    /// ...and at least this much above it (seconds).
    pub rtt_margin_s: f64,
    /// The calm level: the `calm_quantile` of the signal over this much history before the
    /// tick.
    pub calm_window: Duration,
    pub calm_quantile: f64,
    /// History the calm level needs before any event is called.
    pub calm_min: Duration,
    /// An event holds its raw condition this long before it counts...
    pub min_on: Duration,
    /// ...and ends only after this long without it.
    pub min_off: Duration,
    /// Time without the event an onset needs before it; also how long after an event its
    /// rows stay masked.
    pub quiet: Duration,
    /// A retransmit storm: retransmits per second at least this and at least
    /// `spike_factor` times their calm level.
    pub retrans_floor_per_s: f64,
    /// A queue overflow: a qdisc or interface dropping more than this per second...
    pub drops_floor_per_s: f64,
    /// ...or an interface's sojourn p99 above this (seconds).
    pub sojourn_threshold_s: f64,
    /// An iteration slowdown: the job's iteration period at least this times its calm level.
    pub slowdown_factor: f64,
}

impl Default for LabelConfig {
    fn default() -> Self {
        Self {
            horizons: vec![
                Duration::from_secs(5),
                Duration::from_secs(15),
                Duration::from_secs(30),
            ],
            spike_factor: 2.0,
            rtt_margin_s: 0.001,
            calm_window: Duration::from_secs(300),
            calm_quantile: 0.25,
            calm_min: Duration::from_secs(60),
            min_on: Duration::from_secs(3),
            min_off: Duration::from_secs(3),
            quiet: Duration::from_secs(30),
            retrans_floor_per_s: 10.0,
            drops_floor_per_s: 1.0,
            sojourn_threshold_s: 0.02,
            slowdown_factor: 1.3,
        }
    }
}

/// The events labels are made of.
pub const TARGETS: &[&str] = &[
    "rtt_spike",
    "retrans_storm",
    "queue_overflow",
    "iteration_slowdown",
];

/// An event a classifier forecasts, and its raw condition as a *severity*: a number that
/// is at least 1 exactly when the condition holds. Labels and the baselines of `probe eval`
/// both go through it, so a baseline watches the same signals with the same floors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    RttSpike,
    RetransStorm,
    QueueOverflow,
    IterationSlowdown,
}

impl Event {
    pub const ALL: [Event; 4] = [
        Event::RttSpike,
        Event::RetransStorm,
        Event::QueueOverflow,
        Event::IterationSlowdown,
    ];

    pub fn target(self) -> &'static str {
        TARGETS[self as usize]
    }

    pub fn of(target: &str) -> Option<Event> {
        Event::ALL.into_iter().find(|e| e.target() == target)
    }

    /// The features (live, from the network) that carry the event's signals, in the order
    /// [`Event::severity`] takes them.
    pub fn signals(self) -> &'static [&'static str] {
        match self {
            Event::RttSpike => &["rtt_p99_last"],
            Event::RetransStorm => &["retransmits_last"],
            Event::QueueOverflow => &["sojourn_p99_last", "drops_last"],
            Event::IterationSlowdown => &["iteration_period_s"],
        }
    }

    /// Whether the condition is relative to the signal's calm level.
    pub fn relative(self) -> bool {
        !matches!(self, Event::QueueOverflow)
    }

    /// The severity of signal values `x` (one per [`Event::signals`]) against their calm
    /// levels (ignored unless [`Event::relative`]). NaN when a value or a needed calm
    /// level is unknown.
    pub fn severity(self, cfg: &LabelConfig, x: &[f64], calm: &[f64]) -> f64 {
        let rel = |x: f64, c: f64| x / (cfg.spike_factor * c);
        match self {
            // min of the two conditions; a calm level of 0 leaves the margin to decide.
            Event::RttSpike => rel(x[0], calm[0]).min((x[0] - calm[0]) / cfg.rtt_margin_s),
            Event::RetransStorm => rel(x[0], calm[0]).min(x[0] / cfg.retrans_floor_per_s),
            Event::QueueOverflow => {
                let s = x[0] / cfg.sojourn_threshold_s;
                let d = x[1] / cfg.drops_floor_per_s;
                // Either signal alone may be known (a link without a qdisc has no sojourn).
                match (s.is_nan(), d.is_nan()) {
                    (true, true) => f64::NAN,
                    _ => s.max(d),
                }
            }
            Event::IterationSlowdown => x[0] / (cfg.slowdown_factor * calm[0]),
        }
    }
}

/// Label column names, in the order [`label`] fills them: for each target its state now
/// and its onsets, then per horizon the onset label; then per horizon the two regression
/// targets.
pub fn names(cfg: &LabelConfig) -> Vec<String> {
    let h: Vec<String> = cfg
        .horizons
        .iter()
        .map(|d| crate::features::schema::label(*d))
        .collect();
    let mut out = Vec::new();
    for t in TARGETS {
        out.push(format!("{t}_now"));
        out.push(format!("{t}_onset"));
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

/// The training job's iterations, from its own log: (start, end) in Unix seconds, in
/// order of their end.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobLog {
    pub iterations: Vec<(f64, f64)>,
}

impl JobLog {
    /// Parses JSON lines with `t_start` and `t_end` (the lab's `rank<i>.jsonl`); lines
    /// without them are skipped.
    pub fn parse(text: &str) -> Self {
        let mut iterations: Vec<(f64, f64)> = text
            .lines()
            .filter_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                let (s, e) = (v["t_start"].as_f64()?, v["t_end"].as_f64()?);
                (s.is_finite() && e.is_finite() && e >= s).then_some((s, e))
            })
            .collect();
        iterations.sort_by(|a, b| a.1.total_cmp(&b.1));
        Self { iterations }
    }

    /// The iteration period at `t`: the last completed iteration's duration, or the time
    /// since it ended if the iteration under way has taken longer (a stall shows at once).
    /// With the calm level: the `q` quantile of the durations of the iterations completed
    /// in the `window` before `t`, if they span `min` of it.
    pub fn at(&self, t: f64, cfg: &LabelConfig) -> Option<(f64, f64)> {
        let k = self.iterations.partition_point(|it| it.1 <= t);
        let (s, e) = *self.iterations.get(k.checked_sub(1)?)?;
        let period = (e - s).max(t - e);
        let from = t - cfg.calm_window.as_secs_f64();
        let lo = self.iterations[..k].partition_point(|it| it.1 < from);
        let first = self.iterations.get(lo)?.0;
        if t - first < cfg.calm_min.as_secs_f64() {
            return None;
        }
        let mut d: Vec<f64> = self.iterations[lo..k]
            .iter()
            .map(|it| it.1 - it.0)
            .collect();
        Some((period, quantile(&mut d, cfg.calm_quantile)?))
    }
}

/// Per tick, the calm level of `v`: its `calm_quantile` over the `calm_window` before the
/// tick (the tick itself excluded), once the known values span `calm_min`.
pub fn calm_levels(t: &[f64], v: &[Option<f64>], cfg: &LabelConfig) -> Vec<Option<f64>> {
    let span = cfg.calm_window.as_secs_f64();
    let min = cfg.calm_min.as_secs_f64();
    let mut out = vec![None; t.len()];
    let mut lo = 0;
    let mut hist = Vec::new();
    for i in 0..t.len() {
        while t[lo] < t[i] - span {
            lo += 1;
        }
        let first_known = (lo..i).find(|&j| v[j].is_some());
        if first_known.is_none_or(|j| t[i] - t[j] < min) {
            continue;
        }
        hist.clear();
        hist.extend(v[lo..i].iter().flatten().copied());
        out[i] = quantile(&mut hist, cfg.calm_quantile);
    }
    out
}

/// Per tick: does `ev`'s condition hold on the signals `xs` (one series per signal)? None
/// while a calm level the event needs is unknown; an unknown value does not hold.
fn raw_of(ev: Event, t: &[f64], xs: &[Vec<Option<f64>>], cfg: &LabelConfig) -> Vec<Option<bool>> {
    let calm: Vec<Vec<Option<f64>>> = xs
        .iter()
        .map(|x| {
            if ev.relative() {
                calm_levels(t, x, cfg)
            } else {
                vec![Some(0.0); t.len()]
            }
        })
        .collect();
    (0..t.len())
        .map(|i| {
            let c: Vec<f64> = calm.iter().map(|c| c[i]).collect::<Option<_>>()?;
            let x: Vec<f64> = xs.iter().map(|x| x[i].unwrap_or(f64::NAN)).collect();
            Some(ev.severity(cfg, &x, &c) >= 1.0)
        })
        .collect()
}

/// Ticks in a duration at this tick, at least 1.
fn ticks(d: Duration, tick_s: f64) -> usize {
    ((d.as_secs_f64() / tick_s).round() as usize).max(1)
}

/// The sustained event from its raw condition: on from the first tick of `on` raw ticks in
/// a row, off from the first of `off` non-raw ticks in a row; None where the raw condition
/// is unknown (which breaks both runs).
pub fn sustain(raw: &[Option<bool>], on: usize, off: usize) -> Vec<Option<bool>> {
    let mut ev = vec![None; raw.len()];
    let (mut active, mut run) = (false, 0);
    for (i, r) in raw.iter().enumerate() {
        let Some(r) = *r else {
            (active, run) = (false, 0);
            continue;
        };
        if !active {
            run = if r { run + 1 } else { 0 };
            ev[i] = Some(false);
            if run >= on {
                active = true;
                ev[i + 1 - run..=i].fill(Some(true));
                run = 0;
            }
        } else {
            run = if r { 0 } else { run + 1 };
            ev[i] = Some(true);
            if run >= off {
                active = false;
                ev[i + 1 - run..=i].fill(Some(false));
                run = 0;
            }
        }
    }
    ev
}

/// Per tick: how long the event has been known to be off up to and including this tick
/// (0 while it is on or unknown).
fn calm_for(t: &[f64], ev: &[Option<bool>]) -> Vec<f64> {
    let mut out = vec![0.0; t.len()];
    let mut since: Option<f64> = None;
    for i in 0..t.len() {
        since = match ev[i] {
            Some(false) => since.or(Some(t[i])),
            _ => None,
        };
        out[i] = since.map_or(0.0, |s| t[i] - s);
    }
    out
}

/// Onsets of a sustained event: ticks where it turns on after `quiet` known calm.
pub fn onsets(t: &[f64], ev: &[Option<bool>], quiet: f64) -> Vec<bool> {
    let calm = calm_for(t, ev);
    (0..t.len())
        .map(|i| {
            ev[i] == Some(true)
                && i > 0
                && ev[i - 1] == Some(false)
                // The calm before it, measured to the tick before.
                && calm[i - 1] + (t[i] - t[i - 1]) >= quiet
        })
        .collect()
}

/// Each target's raw condition per tick for one entity's rows (time order), in
/// [`TARGETS`] order.
fn raw_states(
    rows: &[&Observation],
    cfg: &LabelConfig,
    job: Option<&JobLog>,
) -> Vec<Vec<Option<bool>>> {
    let t: Vec<f64> = rows.iter().map(|r| r.time_unix).collect();
    let kind = rows.first().map_or("", |r| r.entity_kind.as_str());
    let series = |f: fn(&Observation) -> Option<f64>| rows.iter().map(|r| f(r)).collect::<Vec<_>>();
    Event::ALL
        .iter()
        .map(|&ev| match (ev, kind) {
            (Event::RttSpike, o::PEER) => raw_of(ev, &t, &[series(|r| r.rtt_p99_s)], cfg),
            (Event::RetransStorm, o::PEER) => {
                raw_of(ev, &t, &[series(|r| r.retransmits_per_s)], cfg)
            }
            (Event::QueueOverflow, o::INTERFACE) => raw_of(
                ev,
                &t,
                &[
                    series(|r| r.sojourn_p99_s),
                    // Both directions, as the `drops` feature counts them.
                    series(|r| match (r.tx_dropped_per_s, r.rx_dropped_per_s) {
                        (None, None) => None,
                        (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
                    }),
                ],
                cfg,
            ),
            (Event::QueueOverflow, o::QDISC) => raw_of(
                ev,
                &t,
                &[vec![None; t.len()], series(|r| r.qdisc_drops_per_s)],
                cfg,
            ),
            (Event::IterationSlowdown, o::PEER) => match job {
                // The job's own period and calm level, not the signal's calm levels.
                Some(job) => t
                    .iter()
                    .map(|&t| {
                        let (period, calm) = job.at(t, cfg)?;
                        Some(ev.severity(cfg, &[period], &[calm]) >= 1.0)
                    })
                    .collect(),
                None => vec![None; t.len()],
            },
            _ => vec![None; t.len()],
        })
        .collect()
}

/// Labels of every row of one entity (rows in time order), one vector per row in
/// [`names`] order; NaN where a label is unknown (see the module's doc).
pub fn label(
    rows: &[&Observation],
    cfg: &LabelConfig,
    tick_s: f64,
    job: Option<&JobLog>,
) -> Vec<Vec<f64>> {
    let n = rows.len();
    let t: Vec<f64> = rows.iter().map(|r| r.time_unix).collect();
    let end = t.last().copied().unwrap_or(0.0);
    let quiet = cfg.quiet.as_secs_f64();
    let (on, off) = (ticks(cfg.min_on, tick_s), ticks(cfg.min_off, tick_s));
    let events: Vec<Vec<Option<bool>>> = raw_states(rows, cfg, job)
        .iter()
        .map(|raw| sustain(raw, on, off))
        .collect();
    let starts: Vec<Vec<bool>> = events.iter().map(|ev| onsets(&t, ev, quiet)).collect();
    let calm: Vec<Vec<f64>> = events.iter().map(|ev| calm_for(&t, ev)).collect();
    let rtt: Vec<Option<f64>> = rows.iter().map(|r| r.rtt_p99_s).collect();
    let thr: Vec<Option<f64>> = rows.iter().map(|r| r.bytes_per_s()).collect();
    let flag = |b: Option<bool>| b.map_or(f64::NAN, |b| if b { 1.0 } else { 0.0 });
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let mut row = Vec::new();
        for ((ev, st), calm) in events.iter().zip(&starts).zip(&calm) {
            row.push(flag(ev[i]));
            row.push(if ev[i].is_some() {
                flag(Some(st[i]))
            } else {
                f64::NAN
            });
            // Only a row in a calm stretch at least `quiet` long can precede an onset.
            let open = ev[i] == Some(false) && calm[i] >= quiet;
            for h in &cfg.horizons {
                let until = t[i] + h.as_secs_f64();
                row.push(if !open || until > end + tick_s / 2.0 {
                    f64::NAN
                } else if (i + 1..n).take_while(|&j| t[j] <= until).any(|j| st[j]) {
                    1.0
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

    fn labelled(rtt: impl Fn(usize) -> f64, n: usize) -> (Vec<Vec<f64>>, impl Fn(&str) -> usize) {
        let rows: Vec<Observation> = (0..n).map(|i| peer(i as f64, rtt(i))).collect();
        let refs: Vec<&Observation> = rows.iter().collect();
        let cfg = LabelConfig::default();
        let l = label(&refs, &cfg, 1.0, None);
        let names = names(&cfg);
        (l, move |n: &str| names.iter().position(|x| x == n).unwrap())
    }

    #[test]
    fn an_rtt_spike_is_labelled_before_it_starts_and_masked_while_on() {
        // Calm 2 ms for 100 ticks, 5 ms from tick 100 to 110, calm again.
        let (l, col) = labelled(
            |i| {
                if (100..110).contains(&i) {
                    0.005
                } else {
                    0.002
                }
            },
            200,
        );
        let (now, onset, h5, h30) = (
            col("rtt_spike_now"),
            col("rtt_spike_onset"),
            col("rtt_spike_5s"),
            col("rtt_spike_30s"),
        );
        // No calm level in the first minute: unknown.
        assert!(l[30][now].is_nan());
        assert_eq!(l[99][now], 0.0);
        assert_eq!(l[100][now], 1.0);
        assert_eq!(l[109][now], 1.0);
        assert_eq!(l[110][now], 0.0);
        assert_eq!(l[100][onset], 1.0);
        assert_eq!((0..200).filter(|&i| l[i][onset] == 1.0).count(), 1);
        // Onset at 100: ticks 95..=99 see it within 5 s, 94 does not.
        assert_eq!(l[94][h5], 0.0);
        assert!((95..100).all(|i| l[i][h5] == 1.0));
        assert_eq!(l[90][h30], 1.0);
        // While the spike is on, and for 30 s after it, rows are masked.
        assert!((100..140).all(|i| l[i][h5].is_nan()), "{:?}", &l[100..141]);
        assert_eq!(l[140][h5], 0.0);
        // Less than 30 s of calm history: unknown too.
        assert!(l[80][h5].is_nan());
        assert_eq!(l[90][h5], 0.0);
        // The last ticks cannot know 30 s ahead: unknown, not 0.
        assert!(l[190][h30].is_nan());
        assert!(l[199][h5].is_nan());
        // Regression targets: the value at t + H.
        assert_eq!(l[50][col("rtt_p99_future_5s")], 0.002);
        assert_eq!(l[98][col("rtt_p99_future_5s")], 0.005);
        assert_eq!(l[10][col("throughput_future_30s")], 40.0);
        assert!(l[198][col("throughput_future_5s")].is_nan());
    }

    #[test]
    fn a_flicker_is_no_event_and_a_dip_does_not_end_one() {
        // Two 2-tick blips (too short), then a spike with a 2-tick dip inside it.
        let (l, col) = labelled(
            |i| match i {
                100 | 101 | 120 | 121 => 0.005,
                140..=149 | 152..=160 => 0.005,
                _ => 0.002,
            },
            260,
        );
        let (now, onset) = (col("rtt_spike_now"), col("rtt_spike_onset"));
        assert!((95..140).all(|i| l[i][now] == 0.0));
        assert!((140..=160).all(|i| l[i][now] == 1.0), "the dip bridged");
        assert_eq!(l[161][now], 0.0);
        let starts: Vec<usize> = (0..260).filter(|&i| l[i][onset] == 1.0).collect();
        assert_eq!(starts, [140]);
    }

    #[test]
    fn an_event_soon_after_another_is_no_onset() {
        let (l, col) = labelled(
            |i| match i {
                100..=109 | 125..=134 | 180..=189 => 0.005,
                _ => 0.002,
            },
            260,
        );
        let onset = col("rtt_spike_onset");
        let starts: Vec<usize> = (0..260).filter(|&i| l[i][onset] == 1.0).collect();
        // 125 follows 15 s of calm; 180 follows 45 s.
        assert_eq!(starts, [100, 180]);
        let h5 = col("rtt_spike_5s");
        assert!((115..165).all(|i| l[i][h5].is_nan()));
        assert_eq!(l[165][h5], 0.0);
        assert!((175..180).all(|i| l[i][h5] == 1.0));
    }

    #[test]
    fn a_spike_needs_twice_the_calm_level_and_a_millisecond_more() {
        // 1.8x: no spike; 10x of 50 us (0.5 ms): below the 1 ms margin.
        let (l, col) = labelled(
            |i| {
                if (100..110).contains(&i) {
                    0.0036
                } else {
                    0.002
                }
            },
            150,
        );
        assert!((60..150).all(|i| l[i][col("rtt_spike_now")] == 0.0));
        let (l, col) = labelled(
            |i| {
                if (100..110).contains(&i) {
                    0.0005
                } else {
                    0.00005
                }
            },
            150,
        );
        assert!((60..150).all(|i| l[i][col("rtt_spike_now")] == 0.0));
    }

    #[test]
    fn sustain_needs_a_run_and_ends_after_a_calm_run() {
        let r = |s: &str| -> Vec<Option<bool>> {
            s.chars()
                .map(|c| match c {
                    '1' => Some(true),
                    '0' => Some(false),
                    _ => None,
                })
                .collect()
        };
        let show = |v: Vec<Option<bool>>| -> String {
            v.iter()
                .map(|b| match b {
                    Some(true) => '1',
                    Some(false) => '0',
                    None => '?',
                })
                .collect()
        };
        assert_eq!(show(sustain(&r("0110111001000"), 3, 3)), "0000111111000");
        assert_eq!(show(sustain(&r("011?1110"), 3, 3)), "000?1111");
        assert_eq!(show(sustain(&r("1111"), 1, 1)), "1111");
    }

    #[test]
    fn an_iteration_slowdown_comes_from_the_job_log() {
        // 0.25 s iterations; from t = 150 to 170 they take 0.5 s.
        let mut lines = String::new();
        let mut t = 0.0;
        while t < 300.0 {
            let d = if (150.0..170.0).contains(&t) {
                0.5
            } else {
                0.25
            };
            lines.push_str(&format!(
                "{{\"t_start\":{t},\"t_end\":{},\"iter\":1}}\n",
                t + d
            ));
            t += d;
        }
        lines.push_str("not json\n");
        let job = JobLog::parse(&lines);
        assert_eq!(job.iterations.len(), 1160);
        let rows: Vec<Observation> = (0..300).map(|i| peer(i as f64, 0.002)).collect();
        let refs: Vec<&Observation> = rows.iter().collect();
        let cfg = LabelConfig::default();
        let l = label(&refs, &cfg, 1.0, Some(&job));
        let names = names(&cfg);
        let col = |n: &str| names.iter().position(|x| x == n).unwrap();
        let (now, onset, h5) = (
            col("iteration_slowdown_now"),
            col("iteration_slowdown_onset"),
            col("iteration_slowdown_5s"),
        );
        let starts: Vec<usize> = (0..300).filter(|&i| l[i][onset] == 1.0).collect();
        assert_eq!(starts, [151]);
        assert!((152..170).all(|i| l[i][now] == 1.0));
        assert!((175..300).all(|i| l[i][now] == 0.0));
        assert!((146..151).all(|i| l[i][h5] == 1.0));
        // Without a job log the target is unknown.
        let l = label(&refs, &cfg, 1.0, None);
        assert!(l.iter().all(|r| r[now].is_nan() && r[h5].is_nan()));
        // A stall shows while it lasts, not only when the iteration ends.
        let stall = JobLog {
            iterations: (0..400)
                .map(|k| (k as f64 * 0.25, k as f64 * 0.25 + 0.25))
                .collect(),
        };
        let (p, calm) = stall.at(105.0, &cfg).unwrap();
        assert_eq!((p, calm), (5.0, 0.25));
    }
}

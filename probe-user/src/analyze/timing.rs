//! Timing of the job from the burst events: the iteration period (autocorrelation of the
//! bursts, the daemon's own `PeriodFinder`, over the whole recording), the iterations one by
//! one (so jitter, duty cycle and bytes per iteration are measured, not inferred), burst
//! size and duration distributions, and the phases inside one iteration: each direction of
//! each job peer folded onto the iteration.
use serde::Serialize;

use super::load::Recording;
use crate::{
    features::{
        bursts::{Burst, Bursts},
        period::{add_occupancy, Period, PeriodFinder, BIN_S},
    },
    stats::median,
};

/// A burst whose packets average less than this is ACKs, not data.
const DATA_PACKET_BYTES: f64 = 200.0;
/// Bins of one iteration in the phase profiles.
pub const PHASE_BINS: usize = 100;
/// A class is active in a phase bin above this share of its busiest bin.
const ACTIVE_SHARE: f64 = 0.25;

#[derive(Clone, Copy, Debug)]
pub struct Span {
    pub start: f64,
    pub end: f64,
    pub bytes: f64,
}

/// One direction of one peer's traffic: its data bursts, by start.
#[derive(Clone, Debug)]
pub struct Class {
    pub peer: String,
    pub tx: bool,
    pub bursts: Vec<Span>,
    pub bytes: f64,
}

impl Class {
    pub fn label(&self) -> String {
        if self.tx {
            format!("sends to {}", self.peer)
        } else {
            format!("receives from {}", self.peer)
        }
    }
}

/// The data bursts of the job's peers, one class per peer and direction, most bytes first.
pub fn classes(rec: &Recording, job: &[String]) -> Vec<Class> {
    let mut out: Vec<Class> = Vec::new();
    for e in &rec.events {
        if e.packets == 0 || (e.bytes as f64 / e.packets as f64) < DATA_PACKET_BYTES {
            continue;
        }
        if !job.iter().any(|p| **p == *e.peer) {
            continue;
        }
        let tx = &*e.direction == "egress";
        let span = Span {
            start: e.start_unix,
            end: e.start_unix + e.duration_s.max(0.0),
            bytes: e.bytes as f64,
        };
        match out.iter_mut().find(|c| *c.peer == *e.peer && c.tx == tx) {
            Some(c) => {
                c.bursts.push(span);
                c.bytes += span.bytes;
            }
            None => out.push(Class {
                peer: e.peer.to_string(),
                tx,
                bursts: vec![span],
                bytes: span.bytes,
            }),
        }
    }
    for c in &mut out {
        c.bursts.sort_by(|a, b| a.start.total_cmp(&b.start));
    }
    out.sort_by(|a, b| b.bytes.total_cmp(&a.bytes));
    out
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Iteration {
    pub start: f64,
    pub len: f64,
    pub bytes: f64,
    /// Time inside any job burst: the communication time of the iteration.
    pub busy_s: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Quantiles {
    pub n: usize,
    pub p10: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

pub fn quantiles(v: &mut [f64]) -> Quantiles {
    v.sort_by(f64::total_cmp);
    let q = |p: f64| {
        if v.is_empty() {
            f64::NAN
        } else {
            v[((v.len() - 1) as f64 * p).round() as usize]
        }
    };
    Quantiles {
        n: v.len(),
        p10: q(0.1),
        p50: q(0.5),
        p90: q(0.9),
        p99: q(0.99),
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Phase {
    /// Share of the iteration, from its start (the middle of its quietest phase).
    pub from: f64,
    pub to: f64,
    /// Classes active in it; empty is compute (no job traffic).
    pub active: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Profile {
    pub class: String,
    pub peer: String,
    pub tx: bool,
    /// Median data bytes per iteration.
    pub bytes_per_iteration: f64,
    /// Median over iterations of each phase bin's share inside a burst of this class.
    pub occupancy: Vec<f64>,
    /// Busy in some phases and idle in others: the job's rhythm (see `shaped`).
    pub shaped: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Timing {
    /// The autocorrelation period over the whole recording (NaN: none).
    pub acf_period_s: f64,
    pub acf_confidence: f64,
    /// The class whose burst groups mark the iterations.
    pub marker: Option<String>,
    #[serde(skip)]
    pub iterations: Vec<Iteration>,
    pub iteration_count: usize,
    /// Median iteration length (NaN without iterations).
    pub period_s: f64,
    pub period_p10_s: f64,
    pub period_p90_s: f64,
    /// (p90 - p10) / median of the iteration lengths.
    pub jitter_ratio: f64,
    /// Median absolute difference of successive iteration lengths, seconds.
    pub jitter_s: f64,
    /// Median share of an iteration spent communicating.
    pub duty_cycle: f64,
    pub bytes_per_iteration: f64,
    pub burst_bytes_tx: Quantiles,
    pub burst_bytes_rx: Quantiles,
    pub burst_seconds_tx: Quantiles,
    pub burst_seconds_rx: Quantiles,
    /// Job bursts by size: (lower bound in bytes, powers of 2), sent, received.
    pub size_histogram: Vec<(f64, usize, usize)>,
    pub profiles: Vec<Profile>,
    pub phases: Vec<Phase>,
}

/// Union of the spans (sorted by start) as disjoint intervals.
fn union(mut spans: Vec<Span>) -> Vec<(f64, f64)> {
    spans.sort_by(|a, b| a.start.total_cmp(&b.start));
    let mut out: Vec<(f64, f64)> = Vec::new();
    for s in spans {
        match out.last_mut() {
            Some(l) if s.start <= l.1 => l.1 = l.1.max(s.end),
            _ => out.push((s.start, s.end)),
        }
    }
    out
}

fn overlap(intervals: &[(f64, f64)], from: f64, to: f64) -> f64 {
    let first = intervals.partition_point(|i| i.1 <= from);
    intervals[first..]
        .iter()
        .take_while(|i| i.0 < to)
        .map(|i| i.1.min(to) - i.0.max(from))
        .filter(|d| *d > 0.0)
        .sum()
}

/// Adds the share of each bin of [from, from + len) covered by `spans` to `bins`, by the
/// daemon's own occupancy (features/period.rs).
fn fold(spans: &[Span], from: f64, len: f64, bins: &mut [f64]) {
    let w = len / bins.len() as f64;
    let first = spans.partition_point(|s| s.end <= from);
    for s in spans[first..]
        .iter()
        .take_while(|s| s.start < from + len)
        .filter(|s| s.end > from)
    {
        add_occupancy(bins, from, w, s.start, s.end);
    }
}

/// The period of some bursts by the daemon's period finder, over all of [start, end].
fn period_of<'a>(spans: impl Iterator<Item = &'a Span>, start: f64, end: f64) -> Period {
    let mut sorted: Vec<Span> = spans.copied().collect();
    sorted.sort_by(|a, b| a.start.total_cmp(&b.start));
    let mut bursts = Bursts::new(sorted.len().max(1), start - 1.0);
    for s in &sorted {
        bursts.add(Burst {
            start: s.start,
            end: s.end,
            bytes: s.bytes,
        });
    }
    PeriodFinder::default().estimate(&bursts, end, end - start + 1.0)
}

/// Share of the recording's 5-second windows in which the class has a burst: the job runs
/// throughout, cross traffic for a while.
fn coverage(c: &Class, start: f64, end: f64) -> f64 {
    let n = (((end - start) / 5.0).ceil() as usize).max(1);
    let mut hit = vec![false; n];
    for b in &c.bursts {
        let i = ((b.start - start) / 5.0).floor();
        if i >= 0.0 && (i as usize) < n {
            hit[i as usize] = true;
        }
    }
    hit.iter().filter(|h| **h).count() as f64 / n as f64
}

/// Whether period `p` is the period `t`, within a tenth of it.
fn near(p: f64, t: f64) -> bool {
    (p / t - 1.0).abs() <= 0.1
}

/// Whether period `p` is the job period `t` or a whole multiple of it, up to 8 (a class that
/// also carries other traffic, or a short window, may lock on to a multiple), within a tenth
/// of `t` (not of `p`: a short period must not collect every long one by a loose fit).
fn matches(p: f64, t: f64) -> bool {
    let r = p / t;
    let k = r.round();
    (1.0..=8.0).contains(&k) && (r - k).abs() <= 0.1
}

/// What each candidate class looked like on the way to the job's timing.
#[derive(Clone, Debug, Serialize)]
pub struct ClassCheck {
    pub class: String,
    pub bytes: f64,
    pub period_s: f64,
    pub period_confidence: f64,
    pub coverage: f64,
    /// Part of the job: its folded profile has a shape (busy in some phases, idle in others).
    pub job: bool,
}

/// The job's period, voted for by the classes' periods in every window (see below), and
/// those window periods per class (with each class's own rhythm of burst starts added).
fn vote_period(
    classes: &[Class],
    checks: &[ClassCheck],
    start: f64,
    end: f64,
) -> (Option<f64>, Vec<Vec<f64>>) {
    // The job's period is voted for: each class's period in each window of the recording
    // is a candidate, and every (class, window) whose period is it or a whole multiple of it
    // (a class that also carries cross traffic may lock on to a multiple) votes for it. The
    // job keeps its rhythm in every direction it uses, all the time; cross traffic comes
    // and goes, and its own rhythms (pacing) are in fewer directions or windows.
    // Each class's period over the whole recording is one more voter (and candidate).
    let mut windows = window_periods(classes, start, end);
    for (w, k) in windows.iter_mut().zip(checks) {
        w.push(k.period_s);
    }
    let mut candidates: Vec<f64> = windows
        .iter()
        .flatten()
        .copied()
        .filter(|t| t.is_finite())
        .collect();
    candidates.sort_by(f64::total_cmp);
    candidates.dedup_by(|a, b| (*a / *b - 1.0).abs() <= 0.02);
    let bytes_of = |t: f64| -> f64 {
        votes(&windows, t, false)
            .iter()
            .zip(classes)
            .map(|(v, c)| *v as f64 * c.bytes)
            .sum()
    };
    // Most votes for the period itself; then most votes counting multiples (a fundamental
    // that some windows saw only as a multiple); then bytes. Not multiples first: a short
    // rhythm (a paced cross-traffic flow) divides many periods by chance.
    let period = candidates.iter().copied().max_by(|a, b| {
        let total = |t: f64| votes(&windows, t, false).iter().sum::<usize>();
        let exact = |t: f64| votes(&windows, t, true).iter().sum::<usize>();
        exact(*a)
            .cmp(&exact(*b))
            .then(total(*a).cmp(&total(*b)))
            .then(bytes_of(*a).total_cmp(&bytes_of(*b)))
    });
    // Each class's rhythm of its burst starts alone joins its periods now, after the vote:
    // it may take the voted period down to a fraction (fundamental) and pick the marker, but
    // it is no candidate of its own. A 4-rank ring's bursts change length in a cycle of
    // four iterations, and both directions' occupancy may lock on to 2x or 4x everywhere
    // (CI, stop 30, twice); their starts keep the iteration.
    for (w, c) in windows.iter_mut().zip(classes) {
        w.push(onset_period(c, start, end));
    }
    let period = period.map(|t| fundamental(t, &windows));
    // Refined: the median of the window periods near it.
    let period = period.map(|t| {
        let mut near: Vec<f64> = windows
            .iter()
            .flatten()
            .copied()
            .filter(|p| p.is_finite() && near(*p, t))
            .collect();
        median(&mut near).unwrap_or(t)
    });
    (period, windows)
}

/// The iterations: cut at the burst groups of the class that keeps the period best (the
/// marker), then moved to the middle of the quietest phase; with every class folded onto
/// them.
fn cut_iterations(
    classes: &[Class],
    windows: &[Vec<f64>],
    period: Option<f64>,
) -> (Option<usize>, Vec<f64>, Vec<Profile>) {
    let best = period.and_then(|t| {
        // The marker: the class that keeps the period itself in most windows, then the
        // biggest.
        let v = votes(windows, t, true);
        let m = (0..classes.len()).filter(|&i| v[i] > 0).max_by(|&a, &b| {
            v[a].cmp(&v[b])
                .then(classes[a].bytes.total_cmp(&classes[b].bytes))
        })?;
        let starts = iteration_starts(&classes[m], t);
        let mut l: Vec<f64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
        let typical = median(&mut l).unwrap_or(f64::NAN);
        let profs = profiles(classes, &starts, typical);
        // Cut the iterations in the middle of their longest quiet stretch instead, so that
        // no phase wraps around the cut (a push just before the marker's pull).
        let Some(quiet) = quiet_middle(&profs) else {
            return Some((m, starts, profs));
        };
        let shift = quiet as f64 / PHASE_BINS as f64 * typical;
        let starts: Vec<f64> = starts.iter().map(|s| s + shift).collect();
        let profs = profiles(classes, &starts, typical);
        Some((m, starts, profs))
    });
    let (marker, starts, all_profiles) = match best {
        Some((m, starts, profs)) => (Some(m), starts, profs),
        None => (None, Vec::new(), Vec::new()),
    };
    (marker, starts, all_profiles)
}

/// The job's bursts by size, per power of two: (size, sent, received).
fn size_histogram(classes: &[Class], job: &[usize]) -> Vec<(f64, usize, usize)> {
    // Exponent -> (sent, received).
    let mut by_size: std::collections::BTreeMap<i32, (usize, usize)> = Default::default();
    for &i in job {
        for b in &classes[i].bursts {
            let e = by_size
                .entry(b.bytes.max(1.0).log2().floor() as i32)
                .or_default();
            if classes[i].tx {
                e.0 += 1;
            } else {
                e.1 += 1;
            }
        }
    }
    by_size
        .into_iter()
        .map(|(k, (tx, rx))| (f64::from(k).exp2(), tx, rx))
        .collect()
}

/// Each class's own period and coverage over the whole recording, not yet judged job or not.
fn class_checks(classes: &[Class], start: f64, end: f64) -> Vec<ClassCheck> {
    classes
        .iter()
        .map(|c| {
            let p = period_of(c.bursts.iter(), start, end);
            ClassCheck {
                class: c.label(),
                bytes: c.bytes,
                period_s: p.seconds,
                period_confidence: p.confidence,
                coverage: coverage(c, start, end),
                job: false,
            }
        })
        .collect()
}

/// Marks the classes that are the job's (shaped when folded, present about as long as the
/// others) in `checks`, and returns their indices.
fn mark_job(checks: &mut [ClassCheck], all_profiles: &[Profile]) -> Vec<usize> {
    for (k, prof) in checks.iter_mut().zip(all_profiles) {
        k.job = shaped(&prof.occupancy);
    }
    // The job runs through the recording: a shaped class present in far fewer of its
    // windows than the others is traffic that came and went (cross traffic that happened to
    // fold into a shape).
    let widest = checks
        .iter()
        .filter(|k| k.job)
        .map(|k| k.coverage)
        .fold(0.0, f64::max);
    for k in checks.iter_mut() {
        k.job &= k.coverage >= 0.8 * widest;
    }
    (0..checks.len()).filter(|&i| checks[i].job).collect()
}

/// The autocorrelation period of the job's classes together.
fn job_period(classes: &[Class], job: &[usize], start: f64, end: f64) -> Period {
    if job.is_empty() {
        Period::UNKNOWN
    } else {
        period_of(
            job.iter().flat_map(|&i| classes[i].bursts.iter()),
            start,
            end,
        )
    }
}

/// The profiles of the job's peers, each marked shaped if its class is the job's.
fn job_profiles(
    classes: &[Class],
    checks: &[ClassCheck],
    all_profiles: &[Profile],
    job: &[usize],
) -> Vec<Profile> {
    // Every class of a job peer, so that a direction that does not fold into a shape (a
    // reply merged with the request's ACKs into one long burst) still counts its bytes.
    let job_peers: Vec<&str> = job.iter().map(|&i| classes[i].peer.as_str()).collect();
    (0..classes.len())
        .filter(|&i| job_peers.contains(&classes[i].peer.as_str()))
        .map(|i| Profile {
            shaped: checks[i].job,
            ..all_profiles[i].clone()
        })
        .collect()
}

/// Quantiles of `measure` over the job's bursts in one direction (`tx`: sent).
fn burst_quantiles(
    classes: &[Class],
    job: &[usize],
    tx: bool,
    measure: impl Fn(&Span) -> f64,
) -> Quantiles {
    let mut v: Vec<f64> = job
        .iter()
        .filter(|&&i| classes[i].tx == tx)
        .flat_map(|&i| classes[i].bursts.iter().map(&measure))
        .collect();
    quantiles(&mut v)
}

/// What the iterations measure: their lengths, jitter, duty cycle and bytes.
struct IterationStats {
    lengths: Quantiles,
    /// Median absolute difference of successive lengths.
    jitter_s: f64,
    duty_cycle: f64,
    bytes: f64,
}

/// The iterations' length quantiles and the medians of their jitter, duty cycle and bytes.
fn iteration_stats(iterations: &[Iteration]) -> IterationStats {
    let mut lens: Vec<f64> = iterations.iter().map(|i| i.len).collect();
    let mut steps: Vec<f64> = iterations
        .windows(2)
        .map(|w| (w[1].len - w[0].len).abs())
        .collect();
    let mut duty: Vec<f64> = iterations.iter().map(|i| i.busy_s / i.len).collect();
    let mut bpi: Vec<f64> = iterations.iter().map(|i| i.bytes).collect();
    IterationStats {
        lengths: quantiles(&mut lens),
        jitter_s: median(&mut steps).unwrap_or(f64::NAN),
        duty_cycle: median(&mut duty).unwrap_or(f64::NAN),
        bytes: median(&mut bpi).unwrap_or(f64::NAN),
    }
}

/// The job's timing from the candidate classes (most bytes first): the period the classes
/// vote for; iterations cut at the burst groups of the class that keeps it best, moved to
/// the middle of the quietest phase; then every class folded onto the iterations, and the
/// ones with a shape there (and present about as long as the others) are the job's.
pub fn timing(rec: &Recording, classes: &[Class]) -> (Timing, Vec<ClassCheck>) {
    let (start, end) = (rec.start(), rec.end());
    let mut checks = class_checks(classes, start, end);
    let (period, windows) = vote_period(classes, &checks, start, end);
    let (marker, starts, all_profiles) = cut_iterations(classes, &windows, period);
    let job = mark_job(&mut checks, &all_profiles);
    let p = job_period(classes, &job, start, end);
    let job_spans: Vec<Span> = job
        .iter()
        .flat_map(|&i| classes[i].bursts.iter().copied())
        .collect();
    let iterations = iterations(&starts, &job_spans, end);
    let profiles = job_profiles(classes, &checks, &all_profiles, &job);
    let phases = phases(&profiles);
    let stats = iteration_stats(&iterations);
    let lq = &stats.lengths;
    let bytes = |s: &Span| s.bytes;
    let seconds = |s: &Span| s.end - s.start;
    let timing = Timing {
        size_histogram: size_histogram(classes, &job),
        acf_period_s: p.seconds,
        acf_confidence: p.confidence,
        marker: marker.map(|m| classes[m].label()),
        iteration_count: iterations.len(),
        period_s: lq.p50,
        period_p10_s: lq.p10,
        period_p90_s: lq.p90,
        jitter_ratio: (lq.p90 - lq.p10) / lq.p50,
        jitter_s: stats.jitter_s,
        duty_cycle: stats.duty_cycle,
        bytes_per_iteration: stats.bytes,
        burst_bytes_tx: burst_quantiles(classes, &job, true, bytes),
        burst_bytes_rx: burst_quantiles(classes, &job, false, bytes),
        burst_seconds_tx: burst_quantiles(classes, &job, true, seconds),
        burst_seconds_rx: burst_quantiles(classes, &job, false, seconds),
        iterations,
        profiles,
        phases,
    };
    (timing, checks)
}

/// The bin in the middle of the longest circular run of bins where no shaped class is
/// active; None if there is none or it already starts the iteration.
fn quiet_middle(profs: &[Profile]) -> Option<usize> {
    let act: Vec<Vec<bool>> = profs
        .iter()
        .filter(|p| shaped(&p.occupancy))
        .map(|p| active(&p.occupancy))
        .collect();
    if act.is_empty() {
        return None;
    }
    let busy: Vec<bool> = (0..PHASE_BINS).map(|b| act.iter().any(|a| a[b])).collect();
    let first_busy = busy.iter().position(|b| *b)?;
    // Walk once around from a busy bin, measuring quiet runs.
    let (mut best, mut best_len, mut run_start, mut run_len) = (0, 0, 0, 0);
    for k in 1..=PHASE_BINS {
        let b = (first_busy + k) % PHASE_BINS;
        if busy[b] {
            run_len = 0;
        } else {
            if run_len == 0 {
                run_start = b;
            }
            run_len += 1;
            if run_len > best_len {
                (best, best_len) = (run_start, run_len);
            }
        }
    }
    let mid = (best + best_len / 2) % PHASE_BINS;
    (best_len > 0 && mid != 0).then_some(mid)
}

/// Bins at least a quarter of the profile's busiest (and 2% busy).
pub fn active(occ: &[f64]) -> Vec<bool> {
    let max = occ.iter().copied().fold(0.0, f64::max);
    occ.iter()
        .map(|&x| max > 0.0 && x >= ACTIVE_SHARE * max && x >= 0.02)
        .collect()
}

/// A folded profile with a shape: busy somewhere (a median bin at least 10% inside a burst)
/// and idle somewhere else (a bin below half of that).
fn shaped(occ: &[f64]) -> bool {
    let max = occ.iter().copied().fold(0.0, f64::max);
    let min = occ.iter().copied().fold(f64::INFINITY, f64::min);
    max >= 0.1 && min <= 0.5 * max
}

/// How many of each class's periods (in its windows, over the recording, of its starts)
/// are `t` (`ratio_one`) or a whole multiple of it.
fn votes(windows: &[Vec<f64>], t: f64, ratio_one: bool) -> Vec<usize> {
    windows
        .iter()
        .map(|ps| {
            ps.iter()
                .filter(|p| {
                    p.is_finite()
                        && if ratio_one {
                            near(**p, t)
                        } else {
                            matches(**p, t)
                        }
                })
                .count()
        })
        .collect()
}

/// The period under `t`: the smallest whole fraction of it (1/2 to 1/8) that a class voting
/// for `t` also saw as its period, in a window, over the recording or in its burst starts
/// alone. Such a class saw both the rhythm and a multiple of it (a 4-rank ring's sends
/// repeat their pattern every four iterations and may peak highest there), so the fraction
/// is the iteration. A fraction that only other classes saw is left alone: a paced
/// cross-traffic flow can divide the period by chance.
fn fundamental(t: f64, windows: &[Vec<f64>]) -> f64 {
    windows
        .iter()
        .filter(|ps| ps.iter().any(|p| near(*p, t)))
        .flatten()
        .copied()
        .filter(|f| f.is_finite() && *f < t && matches(t, *f) && !near(*f, t))
        .min_by(f64::total_cmp)
        .unwrap_or(t)
}

/// The period of a class's burst starts alone, each marked as a burst of one bin: the
/// iteration's rhythm without the burst lengths, which may repeat over several iterations.
fn onset_period(c: &Class, start: f64, end: f64) -> f64 {
    let marks: Vec<Span> = c
        .bursts
        .iter()
        .map(|s| Span {
            end: s.start + BIN_S,
            ..*s
        })
        .collect();
    period_of(marks.iter(), start, end).seconds
}

/// Window length for the period votes.
const VOTE_WINDOW_S: f64 = 20.0;

/// The period of each class in each window of the recording (NaN: none there).
fn window_periods(classes: &[Class], start: f64, end: f64) -> Vec<Vec<f64>> {
    let n = (((end - start) / VOTE_WINDOW_S).floor() as usize).max(1);
    let w = (end - start) / n as f64;
    classes
        .iter()
        .map(|c| {
            (0..n)
                .map(|i| {
                    let (from, to) = (start + i as f64 * w, start + (i + 1) as f64 * w);
                    let a = c.bursts.partition_point(|s| s.start < from);
                    let b = c.bursts.partition_point(|s| s.start < to);
                    period_of(c.bursts[a..b].iter(), from, to).seconds
                })
                .collect()
        })
        .collect()
}

/// Iteration starts: the marker class's bursts grouped (a gap over a quarter period starts a
/// new group; a group starting within half a period of the previous one joins it).
fn iteration_starts(marker: &Class, period: f64) -> Vec<f64> {
    let mut starts: Vec<f64> = Vec::new();
    let mut last_end = f64::NEG_INFINITY;
    for b in &marker.bursts {
        if b.start - last_end > period / 4.0
            && starts.last().is_none_or(|s| b.start - s >= period / 2.0)
        {
            starts.push(b.start);
        }
        last_end = last_end.max(b.end);
    }
    starts
}

/// Each iteration runs from one start to the next; its bytes and busy time are the job's.
fn iterations(starts: &[f64], job: &[Span], end: f64) -> Vec<Iteration> {
    let busy = union(job.to_vec());
    let mut sorted = job.to_vec();
    sorted.sort_by(|a, b| a.start.total_cmp(&b.start));
    starts
        .windows(2)
        .filter(|w| w[1] <= end)
        .map(|w| {
            let (from, to) = (w[0], w[1]);
            let a = sorted.partition_point(|s| s.start < from);
            let b = sorted.partition_point(|s| s.start < to);
            Iteration {
                start: from,
                len: to - from,
                bytes: sorted[a..b].iter().map(|s| s.bytes).sum(),
                busy_s: overlap(&busy, from, to),
            }
        })
        .collect()
}

/// Each class folded onto the typical iterations (within 30% of the median length).
fn profiles(classes: &[Class], starts: &[f64], typical: f64) -> Vec<Profile> {
    // (start, length) of the iterations used.
    let used: Vec<(f64, f64)> = starts
        .windows(2)
        .map(|w| (w[0], w[1] - w[0]))
        .filter(|(_, len)| (len - typical).abs() <= 0.3 * typical)
        .collect();
    // The median over iterations of each bin's occupancy: traffic that shares a class with
    // the job for less than half the iterations (cross traffic, an incast) drops out.
    classes
        .iter()
        .map(|c| {
            let mut per_bin: Vec<Vec<f64>> = (0..PHASE_BINS)
                .map(|_| Vec::with_capacity(used.len()))
                .collect();
            let mut per_iter: Vec<f64> = Vec::with_capacity(used.len());
            let mut bins = vec![0.0; PHASE_BINS];
            for &(start, len) in &used {
                bins.iter_mut().for_each(|x| *x = 0.0);
                fold(&c.bursts, start, len, &mut bins);
                // Widened by a bin each way, so that a short burst that moves by a bin from
                // one iteration to the next still has a median.
                for (b, v) in per_bin.iter_mut().enumerate() {
                    let lo = b.saturating_sub(1);
                    let hi = (b + 1).min(PHASE_BINS - 1);
                    v.push(bins[lo..=hi].iter().copied().fold(0.0, f64::max).min(1.0));
                }
                let a = c.bursts.partition_point(|s| s.start < start);
                let b = c.bursts.partition_point(|s| s.start < start + len);
                per_iter.push(c.bursts[a..b].iter().map(|s| s.bytes).sum());
            }
            Profile {
                class: c.label(),
                peer: c.peer.clone(),
                tx: c.tx,
                bytes_per_iteration: median(&mut per_iter).unwrap_or(0.0),
                occupancy: per_bin
                    .iter_mut()
                    .map(|v| median(v).unwrap_or(0.0))
                    .collect(),
                shaped: false,
            }
        })
        .collect()
}

/// The phases: runs of phase bins with the same set of active classes.
fn phases(profiles: &[Profile]) -> Vec<Phase> {
    let profiles: Vec<&Profile> = profiles.iter().filter(|p| p.shaped).collect();
    let active: Vec<Vec<bool>> = profiles.iter().map(|p| active(&p.occupancy)).collect();
    let set = |b: usize| -> Vec<String> {
        profiles
            .iter()
            .zip(&active)
            .filter(|(_, a)| a[b])
            .map(|(p, _)| p.class.clone())
            .collect()
    };
    let mut phases: Vec<Phase> = Vec::new();
    for b in 0..PHASE_BINS {
        let s = set(b);
        match phases.last_mut() {
            Some(p) if p.active == s => p.to = (b + 1) as f64 / PHASE_BINS as f64,
            _ => phases.push(Phase {
                from: b as f64 / PHASE_BINS as f64,
                to: (b + 1) as f64 / PHASE_BINS as f64,
                active: s,
            }),
        }
    }
    // A one-bin phase between two others is the edge of a burst, not a phase: merge it
    // into the longer neighbour.
    let mut i = 1;
    while i + 1 < phases.len() {
        if phases[i].to - phases[i].from < 1.5 / PHASE_BINS as f64 {
            let into =
                if phases[i - 1].to - phases[i - 1].from >= phases[i + 1].to - phases[i + 1].from {
                    i - 1
                } else {
                    i + 1
                };
            if into < i {
                phases[i - 1].to = phases[i].to;
            } else {
                phases[i + 1].from = phases[i].from;
            }
            phases.remove(i);
            // Neighbours that now match join.
            if i < phases.len() && phases[i - 1].active == phases[i].active {
                phases[i - 1].to = phases[i].to;
                phases.remove(i);
            }
        } else {
            i += 1;
        }
    }
    phases
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_that_saw_the_period_and_its_multiple_gives_the_period() {
        // The lab's 4-rank ring (CI, stop 23): sends locked on to 4 x 0.223 s over the
        // recording and in its window, receives on 4x in the window and 1x overall.
        let w = vec![vec![0.8916, 0.8916], vec![0.8916, 0.2229]];
        assert_eq!(fundamental(0.8916, &w), 0.2229);
        // Down to the smallest fraction seen: 8T, 2T and T in one class.
        let w = vec![vec![1.6, 0.4], vec![1.6, 0.2, f64::NAN]];
        assert_eq!(fundamental(1.6, &w), 0.2);
    }

    #[test]
    fn a_fraction_only_other_classes_saw_is_not_the_period() {
        // A paced flow at 50 ms divides a 200 ms job period by chance: it votes only for 50.
        let w = vec![vec![0.2, 0.2], vec![0.05, 0.05]];
        assert_eq!(fundamental(0.2, &w), 0.2);
        // Not a whole fraction (0.2 / 0.07 = 2.86): no change either.
        let w = vec![vec![0.2, 0.07]];
        assert_eq!(fundamental(0.2, &w), 0.2);
    }
}

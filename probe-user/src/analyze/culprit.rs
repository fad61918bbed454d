//! The job's culprit, offline: which host slowed the job and which way, from the recordings
//! of its hosts, by the same scores and thresholds as the live alert `ProbeJobCulpritHost`
//! (rules/job.rules.yml, docs/job.md), evaluated once per tick as Prometheus would at that
//! interval. The recordings hold each host's per-peer srtt, RTT sample count, bytes and
//! retransmits, and its qdiscs' sojourn, which is what the rules read from `/metrics`.
//! Where a tick's figures stand in for a Prometheus window (a rate over 5 s, a sojourn
//! histogram over 5 s), the last 5 ticks' are combined; the differences are in docs/job.md.
use std::collections::BTreeMap;

use serde::Serialize;

use super::load::Recording;
use crate::observe::{INTERFACE, PEER};

// The rules' parameters; a test holds them against rules/job.rules.yml.
/// An srtt counts only while its connection took RTT samples, at least one a second over
/// the last 2 minutes (`probe:tcp_srtt_seconds:active`).
const ACTIVE_WINDOW_S: f64 = 120.0;
/// The calm level: this quantile of the last hour's active srtt, learnt while no host of the
/// job is named (for up to this long of a naming)...
const CALM_QUANTILE: f64 = 0.5;
const CALM_PAUSE_S: f64 = 600.0;
const CALM_WINDOW_S: f64 = 3600.0;
/// ...once it has this many samples.
const CALM_MIN_SAMPLES: usize = 20;
/// RTT over its calm level that names a host...
pub const RATIO: f64 = 2.0;
/// ...when it is also this many times the job's lowest host's.
const STAND_OUT: f64 = 2.0;
/// Share of its RTT that a host's own qdisc holds for its egress to be the queue.
const EGRESS_SHARE: f64 = 0.25;
/// Retransmits towards a host, as a share of the segments sent to it, and per second.
const LOSS_SHARE: f64 = 0.01;
const LOSS_RATE: f64 = 1.0;
/// The bytes of one segment (the MSS of a 1500-byte MTU).
const SEGMENT_BYTES: f64 = 1448.0;
/// The window of the rates, the sojourn histogram and the ingress score's minimum.
const WINDOW_S: f64 = 5.0;
/// How long a condition holds before the alert fires (`for:`).
const FOR_S: f64 = 2.0;
/// The compute branch (a straggler holds the job's bytes unread): more than this many bytes
/// (each peer's mean over `QUEUE_WINDOW_S`, summed), `UNREAD_STAND_OUT` times the job's
/// median host, held in more than `UNREAD_HELD` of the window's ticks, its RTT towards the
/// job at most `CALM_RTT` times calm, while the job moves less than `JOB_SLOWED` of its
/// calm bytes per second and the network does not explain it (see `conditions`).
const UNREAD_FLOOR: f64 = 65536.0;
const UNREAD_STAND_OUT: f64 = 4.0;
const UNREAD_HELD: f64 = 0.3;
const QUEUE_WINDOW_S: f64 = 10.0;
const CALM_RTT: f64 = 1.5;
pub const JOB_SLOWED: f64 = 0.8;
/// Namings of one host and direction this close together are one culprit episode.
pub const MERGE_S: f64 = 15.0;

/// One host of the job: its recording and the address its peers name it by.
pub struct Host<'a> {
    pub name: String,
    pub addr: String,
    pub rec: &'a Recording,
}

/// The scores of every host at every tick (NaN: not known), as the rules record them.
pub struct Scores {
    /// Start of tick 0 (Unix seconds) and the tick length.
    pub t0: f64,
    pub tick_s: f64,
    /// The hosts' addresses, in the order of every per-host vector.
    pub hosts: Vec<String>,
    pub as_sender: Vec<Vec<f64>>,
    pub as_receiver: Vec<Vec<f64>>,
    pub link: Vec<Vec<f64>>,
    pub egress_share: Vec<Vec<f64>>,
    pub retransmit_share: Vec<Vec<f64>>,
    pub retransmits: Vec<Vec<f64>>,
    /// Bytes host i holds unread, and unsent, in its sockets towards the job's hosts (each
    /// peer's mean over 10 s, summed), and the share of those 10 s's ticks it held any
    /// unread.
    pub unread: Vec<Vec<f64>>,
    pub unsent: Vec<Vec<f64>>,
    pub unread_held: Vec<Vec<f64>>,
    /// The job's pace (`probe:job_pace_ratio`): its bytes per second (every host towards
    /// the job's hosts, over 5 s) over their calm level (the median of the last hour's
    /// ticks no host was named at, once 20).
    pub job_pace: Vec<f64>,
    /// ratio[i][j][k]: host i's srtt towards host j over its calm level at tick k.
    pub ratio: Vec<Vec<Vec<f64>>>,
}

/// A stretch of time in which the alert named one host and direction.
#[derive(Serialize, Clone, Debug)]
pub struct Culprit {
    pub host: String,
    pub direction: &'static str,
    /// `queue`, `loss` or both, as the alert's `cause` label.
    pub causes: Vec<&'static str>,
    /// Unix seconds of the first and last tick it was named (firing).
    pub from_unix: f64,
    pub to_unix: f64,
    /// The tick its evidence was strongest, and the scores then.
    pub peak_unix: f64,
    pub evidence: Evidence,
    /// The host x host srtt ratio at the peak (rows send, columns receive; NaN: none).
    pub matrix: Vec<Vec<f64>>,
}

#[derive(Serialize, Clone, Debug)]
pub struct Evidence {
    pub as_sender: f64,
    pub as_receiver: f64,
    pub link: f64,
    pub egress_share: f64,
    pub retransmit_share: f64,
    pub retransmits_per_s: f64,
    pub unread_bytes: f64,
    pub job_pace: f64,
}

/// One host's recording on the common grid of ticks.
struct Grid {
    t0: f64,
    tick: f64,
    n: usize,
}

impl Grid {
    fn of(hosts: &[Host]) -> Grid {
        let mut intervals: Vec<f64> = hosts
            .iter()
            .flat_map(|h| h.rec.obs.iter().map(|o| o.interval_s))
            .filter(|x| x.is_finite() && *x > 0.0)
            .collect();
        let tick = crate::stats::median(&mut intervals).unwrap_or(1.0).max(0.1);
        let t0 = hosts
            .iter()
            .map(|h| h.rec.start())
            .fold(f64::INFINITY, f64::min);
        let t1 = hosts
            .iter()
            .map(|h| h.rec.end())
            .fold(f64::NEG_INFINITY, f64::max);
        let n = if t1 >= t0 {
            ((t1 - t0) / tick).round() as usize + 1
        } else {
            0
        };
        Grid { t0, tick, n }
    }

    fn index(&self, t: f64) -> Option<usize> {
        let k = ((t - self.t0) / self.tick).round();
        (k >= 0.0 && (k as usize) < self.n).then_some(k as usize)
    }

    /// Ticks in a window of `s` seconds.
    fn ticks(&self, s: f64) -> usize {
        ((s / self.tick).round() as usize).max(1)
    }
}

/// What one host saw of one peer, per tick.
struct Towards {
    srtt: Vec<f64>,
    samples: Vec<f64>,
    sent: Vec<f64>,
    retransmits: Vec<f64>,
    unread: Vec<f64>,
    unsent: Vec<f64>,
}

/// One host's view, per tick: towards each job host (by index), and its qdiscs' sojourn.
struct View {
    towards: BTreeMap<usize, Towards>,
    /// Median sojourn in the qdiscs of its busiest interface, and that tick's samples.
    sojourn: Vec<(f64, f64)>,
}

fn view(h: &Host, addrs: &[String], g: &Grid) -> View {
    let nan = || vec![f64::NAN; g.n];
    let mut towards = BTreeMap::new();
    let mut sojourn = vec![(f64::NAN, 0.0); g.n];
    for o in &h.rec.obs {
        let Some(k) = g.index(o.time_unix) else {
            continue;
        };
        // The sojourn in its qdiscs is recorded per interface.
        if o.entity_kind == INTERFACE {
            let (p50, n) = (o.sojourn_p50_s, o.sojourn_samples.unwrap_or(0));
            if let (Some(p), true) = (p50, n > 0) {
                let s = &mut sojourn[k];
                if s.0.is_nan() || p > s.0 {
                    *s = (p, n as f64);
                }
            }
            continue;
        }
        if o.entity_kind != PEER || o.entity == h.addr {
            continue;
        }
        let Some(j) = addrs.iter().position(|a| *a == o.entity) else {
            continue;
        };
        let t = towards.entry(j).or_insert_with(|| Towards {
            srtt: nan(),
            samples: nan(),
            sent: nan(),
            retransmits: nan(),
            unread: nan(),
            unsent: nan(),
        });
        t.srtt[k] = o.srtt_s.unwrap_or(f64::NAN);
        t.samples[k] = o.rtt_samples.map_or(f64::NAN, |x| x as f64);
        t.sent[k] = o.tx_bytes_per_s.unwrap_or(f64::NAN);
        t.retransmits[k] = o.retransmits_per_s.unwrap_or(f64::NAN);
        t.unread[k] = o.receive_queue_bytes.map_or(f64::NAN, |x| x as f64);
        t.unsent[k] = o.send_queue_bytes.map_or(f64::NAN, |x| x as f64);
    }
    View { towards, sojourn }
}

/// Prometheus's quantile of sorted values (`quantile`, `quantile_over_time`): linear
/// interpolation between the closest ranks.
fn interpolated(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let rank = q * (n - 1) as f64;
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            let w = rank - lo as f64;
            sorted[lo] * (1.0 - w) + sorted[hi.min(n - 1)] * w
        }
    }
}

fn median_of(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    interpolated(&v, 0.5)
}

/// The srtt while its connection takes RTT samples (`probe:tcp_srtt_seconds:active`): at
/// least one a second over the last 2 minutes, or over the recording's first ticks (as
/// `rate` extrapolates from the samples it has).
fn active(t: &Towards, g: &Grid) -> Vec<f64> {
    let w = g.ticks(ACTIVE_WINDOW_S);
    // A tick without the peer adds no sample.
    let count = |v: f64| if v.is_finite() { v.max(0.0) } else { 0.0 };
    let mut sum = 0.0;
    (0..g.n)
        .map(|k| {
            sum += count(t.samples[k]);
            if k >= w {
                sum -= count(t.samples[k - w]);
            }
            if sum / ((k + 1).min(w) as f64 * g.tick) >= 1.0 {
                t.srtt[k]
            } else {
                f64::NAN
            }
        })
        .collect()
}

/// The calm level of an active srtt: the median of its last hour's ticks that are not
/// `paused`, once it has 20 (`probe:tcp_srtt_seconds:active_baseline1h` over
/// `probe:tcp_srtt_seconds:active_calm`).
fn calm(srtt: &[f64], g: &Grid, paused: &[bool]) -> Vec<f64> {
    let w = g.ticks(CALM_WINDOW_S);
    let mut window: Vec<f64> = Vec::new();
    let mut out = Vec::with_capacity(srtt.len());
    let learnt = |k: usize| srtt[k].is_finite() && !paused[k];
    for k in 0..srtt.len() {
        if learnt(k) {
            let at = window.partition_point(|x| *x < srtt[k]);
            window.insert(at, srtt[k]);
        }
        if k >= w && learnt(k - w) {
            let old = srtt[k - w];
            let at = window.partition_point(|x| *x < old);
            window.remove(at);
        }
        out.push(if window.len() >= CALM_MIN_SAMPLES {
            interpolated(&window, CALM_QUANTILE)
        } else {
            f64::NAN
        });
    }
    out
}

/// The mean of the finite values among the last `w` ticks up to k.
fn recent_mean(v: &[f64], k: usize, w: usize) -> f64 {
    let xs: Vec<f64> = v[k + 1 - w.min(k + 1)..=k]
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .collect();
    if xs.is_empty() {
        f64::NAN
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Every host's scores at every tick. The calm levels learn only at ticks where no host was
/// named at the tick before (the live rules read the alert's `ALERTS_FOR_STATE` of the
/// last evaluation), and what is named depends on the calm levels: the pauses are found by
/// computing the scores again with the pauses they imply until nothing changes. Each tick
/// depends only on the ticks before it, so this ends (within as many rounds as ticks; on
/// the lab's runs after 1-3) at the pauses a tick-by-tick evaluation gives.
pub fn scores(hosts: &[Host]) -> Scores {
    let g = Grid::of(hosts);
    let addrs: Vec<String> = hosts.iter().map(|h| h.addr.clone()).collect();
    let views: Vec<View> = hosts.iter().map(|h| view(h, &addrs, &g)).collect();
    // Host i's active srtt towards host j, as (i, j, srtt).
    let active: Vec<(usize, usize, Vec<f64>)> = views
        .iter()
        .enumerate()
        .flat_map(|(i, v)| v.towards.iter().map(move |(&j, t)| (i, j, t)))
        .map(|(i, j, t)| (i, j, active(t, &g)))
        .collect();
    let mut paused = vec![false; g.n];
    loop {
        let sc = scores_paused(&g, &addrs, &views, &active, &paused);
        let next = pauses(&sc);
        if next == paused {
            return sc;
        }
        paused = next;
    }
}

/// The ticks whose srtt the calm levels do not learn: some host of the job was named at the
/// tick before (the alert pending or firing) and had been for at most 10 minutes.
fn pauses(sc: &Scores) -> Vec<bool> {
    let w = ((WINDOW_S / sc.tick_s).round() as usize).max(1);
    let n = sc.link.first().map_or(0, Vec::len);
    let mut out = vec![false; n];
    // Since which tick each (host, direction, cause) has held, as the alert's active time.
    let mut since: BTreeMap<(usize, &str, &str), usize> = BTreeMap::new();
    for (k, paused) in out.iter_mut().enumerate().skip(1) {
        let now: Vec<(usize, &str, &str)> = (0..sc.hosts.len())
            .flat_map(|i| {
                conditions(sc, i, k - 1, w)
                    .into_iter()
                    .map(move |(d, c)| (i, d, c))
            })
            .collect();
        since.retain(|key, _| now.contains(key));
        for key in now {
            since.entry(key).or_insert(k - 1);
        }
        // `time() - ALERTS_FOR_STATE < 600`, at tick k.
        *paused = since
            .values()
            .any(|&from| (k - from) as f64 * sc.tick_s < CALM_PAUSE_S);
    }
    out
}

fn scores_paused(
    g: &Grid,
    addrs: &[String],
    views: &[View],
    active: &[(usize, usize, Vec<f64>)],
    paused: &[bool],
) -> Scores {
    let m = addrs.len();
    let w = g.ticks(WINDOW_S);
    let nan = || vec![f64::NAN; g.n];
    let mut ratio = vec![vec![nan(); m]; m];
    let mut srtt = vec![vec![nan(); m]; m];
    for (i, j, s) in active {
        let c = calm(s, g, paused);
        ratio[*i][*j] = s.iter().zip(&c).map(|(a, b)| a / b).collect();
        srtt[*i][*j] = s.clone();
    }
    let column = |x: &Vec<Vec<Vec<f64>>>, i: usize, k: usize, row: bool| -> Vec<f64> {
        (0..m)
            .filter(|&j| j != i)
            .map(|j| if row { x[i][j][k] } else { x[j][i][k] })
            .collect()
    };
    let mut sc = Scores {
        t0: g.t0,
        tick_s: g.tick,
        hosts: addrs.to_vec(),
        as_sender: vec![nan(); m],
        as_receiver: vec![nan(); m],
        link: vec![nan(); m],
        egress_share: vec![nan(); m],
        retransmit_share: vec![nan(); m],
        retransmits: vec![nan(); m],
        unread: vec![nan(); m],
        unsent: vec![nan(); m],
        unread_held: vec![nan(); m],
        job_pace: nan(),
        ratio: Vec::new(),
    };
    queues(&mut sc, g, views);
    let rate: Vec<f64> = (0..g.n)
        .map(|k| {
            let each = views.iter().enumerate().flat_map(|(i, v)| {
                v.towards
                    .iter()
                    .filter(move |(j, _)| **j != i)
                    .map(move |(_, t)| recent_mean(&t.sent, k, w))
            });
            sum_known(each)
        })
        .collect();
    let calm_rate = calm(&rate, g, paused);
    sc.job_pace = rate.iter().zip(&calm_rate).map(|(a, b)| a / b).collect();
    for i in 0..m {
        for k in 0..g.n {
            let s = median_of(column(&ratio, i, k, true));
            let r = median_of(column(&ratio, i, k, false));
            sc.as_sender[i][k] = s;
            sc.as_receiver[i][k] = r;
            // (as_sender < as_receiver) or as_receiver.
            sc.link[i][k] = if s < r { s } else { r };
            // The median sojourn of the last 5 s (each tick's median, weighted by its
            // samples) over the host's median srtt towards the job.
            let soj: Vec<(f64, f64)> = views[i].sojourn[k + 1 - w.min(k + 1)..=k]
                .iter()
                .copied()
                .filter(|(p, n)| p.is_finite() && *n > 0.0)
                .collect();
            sc.egress_share[i][k] = weighted_median(soj) / median_of(column(&srtt, i, k, true));
            // Retransmits and segments the others sent towards it, per second over 5 s.
            let (mut retr, mut segs) = (f64::NAN, f64::NAN);
            for (j, v) in views.iter().enumerate() {
                if let Some(t) = v.towards.get(&i).filter(|_| j != i) {
                    let (a, b) = (
                        recent_mean(&t.retransmits, k, w),
                        recent_mean(&t.sent, k, w) / SEGMENT_BYTES,
                    );
                    if a.is_finite() {
                        retr = if retr.is_finite() { retr + a } else { a };
                    }
                    if b.is_finite() {
                        segs = if segs.is_finite() { segs + b } else { b };
                    }
                }
            }
            sc.retransmits[i][k] = retr;
            sc.retransmit_share[i][k] = retr / segs;
        }
    }
    sc.ratio = ratio;
    sc
}

/// The sum of the finite values (NaN when none is), as PromQL's `sum` of the series there.
fn sum_known(v: impl Iterator<Item = f64>) -> f64 {
    v.filter(|x| x.is_finite())
        .fold(f64::NAN, |s, x| if s.is_nan() { x } else { s + x })
}

/// Where the job's bytes wait, per host (`probe:job_host_unread_bytes:avg10s`,
/// `probe:job_host_unsent_bytes:avg10s`, `probe:job_host_unread:held`).
fn queues(sc: &mut Scores, g: &Grid, views: &[View]) {
    let w = g.ticks(QUEUE_WINDOW_S);
    for (i, v) in views.iter().enumerate() {
        let peers = || {
            v.towards
                .iter()
                .filter(move |(j, _)| **j != i)
                .map(|(_, t)| t)
        };
        let held: Vec<f64> = (0..g.n)
            .map(|k| {
                let s = sum_known(peers().map(|t| t.unread[k]));
                if s.is_nan() {
                    f64::NAN
                } else {
                    f64::from(u8::from(s > 0.0))
                }
            })
            .collect();
        for k in 0..g.n {
            sc.unread[i][k] = sum_known(peers().map(|t| recent_mean(&t.unread, k, w)));
            sc.unsent[i][k] = sum_known(peers().map(|t| recent_mean(&t.unsent, k, w)));
            sc.unread_held[i][k] = recent_mean(&held, k, w);
        }
    }
}

fn weighted_median(mut v: Vec<(f64, f64)>) -> f64 {
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = v.iter().map(|x| x.1).sum();
    let mut acc = 0.0;
    for (x, n) in &v {
        acc += n;
        if acc >= total / 2.0 {
            return *x;
        }
    }
    f64::NAN
}

/// What the alert's three branches say of host i at tick k: (direction, cause).
fn conditions(sc: &Scores, i: usize, k: usize, w: usize) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    let share = sc.egress_share[i][k];
    // Above STAND_OUT times the job's lowest host (itself included, so never the lowest).
    let stands_out = |x: &[Vec<f64>]| {
        let lowest = x
            .iter()
            .map(|h| h[k])
            .filter(|v| v.is_finite())
            .fold(f64::NAN, f64::min);
        x[i][k] > STAND_OUT * lowest
    };
    if sc.as_sender[i][k] > RATIO && share > EGRESS_SHARE && stands_out(&sc.as_sender) {
        out.push(("egress", "queue"));
    }
    let link_min = sc.link[i][k + 1 - w.min(k + 1)..=k]
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(f64::NAN, f64::min);
    // `unless ... > 0.25`: an unknown share does not rule it out.
    if link_min > RATIO && (share.is_nan() || share <= EGRESS_SHARE) && stands_out(&sc.link) {
        out.push(("ingress", "queue"));
    }
    // As PromQL's `max`: NaN left out, +Inf kept (a share of retransmits over no segment
    // sent in the window is +Inf there and here).
    let most = |x: &[Vec<f64>]| {
        x.iter()
            .map(|h| h[k])
            .filter(|v| !v.is_nan())
            .fold(f64::NAN, f64::max)
    };
    // The job's largest share: the ACKs a lossy input drops make its host retransmit
    // towards its own peers too, at a smaller share.
    let loss = sc.retransmit_share[i][k];
    if loss > LOSS_SHARE && sc.retransmits[i][k] > LOSS_RATE && loss >= most(&sc.retransmit_share) {
        out.push(("ingress", "loss"));
    }
    // Compute: the host holds the job's bytes unread (its peers' chunks wait for it to
    // read them), the most of the job's hosts (once the job slows, the others' phase lag
    // holds a chunk now and then: 0.1x the straggler's at 8 ranks) and more than any host
    // holds unsent (a slow link's sender would), while its own RTT is calm and the job as
    // a whole moves fewer bytes than at its calm pace (a
    // calm ring's phase lag also holds a chunk unread on one host, at full pace).
    let unread = sc.unread[i][k];
    let median_unread = median_of(sc.unread.iter().map(|h| h[k]).collect());
    // The network explains the job's slowing down when, in the last 10 s, over 1% of what
    // a host of the job was sent was retransmitted (the host before a lossy link is stuck
    // sending and leaves its own input unread), or when a host's own egress holds its
    // slowed RTT (the egress branch without its stand-out).
    let w10 = ((QUEUE_WINDOW_S / sc.tick_s).round() as usize).max(1);
    let lossy = sc.retransmit_share.iter().any(|h| {
        h[k + 1 - w10.min(k + 1)..=k]
            .iter()
            .any(|v| *v > LOSS_SHARE)
    });
    let queued = (0..sc.hosts.len())
        .any(|j| sc.as_sender[j][k] > RATIO && sc.egress_share[j][k] > EGRESS_SHARE);
    if !lossy
        && !queued
        && unread > UNREAD_FLOOR
        && unread > UNREAD_STAND_OUT * median_unread
        && unread >= most(&sc.unread)
        && unread > most(&sc.unsent)
        && sc.unread_held[i][k] > UNREAD_HELD
        && sc.as_sender[i][k] <= CALM_RTT
        && sc.job_pace[k] < JOB_SLOWED
    {
        out.push(("compute", "straggler"));
    }
    out
}

/// Every tick the alert would fire, per host: (tick, direction, cause).
pub fn firing(sc: &Scores) -> Vec<Vec<(usize, &'static str, &'static str)>> {
    let w = ((WINDOW_S / sc.tick_s).round() as usize).max(1);
    let hold = (FOR_S / sc.tick_s).ceil() as usize;
    let n = sc.link.first().map_or(0, Vec::len);
    (0..sc.hosts.len())
        .map(|i| {
            let mut run: BTreeMap<(&str, &str), usize> = BTreeMap::new();
            let mut out = Vec::new();
            for k in 0..n {
                let now = conditions(sc, i, k, w);
                run.retain(|key, _| now.contains(key));
                for c in now {
                    let r = run.entry(c).or_insert(0);
                    *r += 1;
                    if *r > hold {
                        out.push((k, c.0, c.1));
                    }
                }
            }
            out
        })
        .collect()
}

/// The culprit episodes: each host and direction's firing ticks, merged across gaps of up
/// to 15 s, with the evidence at the strongest tick.
pub fn culprits(sc: &Scores) -> Vec<Culprit> {
    let fired = firing(sc);
    let gap = (MERGE_S / sc.tick_s).round() as usize;
    let mut out = Vec::new();
    for (i, f) in fired.iter().enumerate() {
        for direction in ["egress", "ingress", "compute"] {
            let ticks: Vec<(usize, &'static str)> = f
                .iter()
                .filter(|x| x.1 == direction)
                .map(|x| (x.0, x.2))
                .collect();
            let mut start = 0;
            while start < ticks.len() {
                let mut end = start;
                while end + 1 < ticks.len() && ticks[end + 1].0 <= ticks[end].0 + gap {
                    end += 1;
                }
                out.push(culprit(sc, i, direction, &ticks[start..=end]));
                start = end + 1;
            }
        }
    }
    out.sort_by(|a, b| a.from_unix.total_cmp(&b.from_unix));
    out
}

fn culprit(
    sc: &Scores,
    i: usize,
    direction: &'static str,
    ticks: &[(usize, &'static str)],
) -> Culprit {
    let mut causes: Vec<&'static str> = ticks.iter().map(|t| t.1).collect();
    causes.sort();
    causes.dedup();
    // The strongest tick by the score that named it.
    let strength = |k: usize| match direction {
        "egress" => sc.as_sender[i][k],
        "compute" => sc.unread[i][k],
        _ => sc.link[i][k].max(100.0 * sc.retransmit_share[i][k]),
    };
    let peak = ticks
        .iter()
        .map(|t| t.0)
        .max_by(|a, b| strength(*a).total_cmp(&strength(*b)))
        .unwrap_or(ticks[0].0);
    let at = |k: usize| sc.t0 + k as f64 * sc.tick_s;
    Culprit {
        host: sc.hosts[i].clone(),
        direction,
        causes,
        from_unix: at(ticks[0].0),
        to_unix: at(ticks[ticks.len() - 1].0),
        peak_unix: at(peak),
        evidence: Evidence {
            as_sender: sc.as_sender[i][peak],
            as_receiver: sc.as_receiver[i][peak],
            link: sc.link[i][peak],
            egress_share: sc.egress_share[i][peak],
            retransmit_share: sc.retransmit_share[i][peak],
            retransmits_per_s: sc.retransmits[i][peak],
            unread_bytes: sc.unread[i][peak],
            job_pace: sc.job_pace[peak],
        },
        matrix: sc
            .ratio
            .iter()
            .map(|row| row.iter().map(|r| r[peak]).collect())
            .collect(),
    }
}

/// What the culprits said of one lab episode.
#[derive(Serialize, Debug)]
pub struct Verdict {
    pub kind: String,
    pub rank: usize,
    pub host: String,
    pub direction: &'static str,
    pub from_s: f64,
    pub to_s: f64,
    /// Seconds from the onset to the first tick naming the right host and direction, while
    /// it was on or up to 15 s after (None: never).
    pub named_after_s: Option<f64>,
    /// Other hosts and directions named then.
    pub also_named: Vec<(String, &'static str)>,
}

/// The culprits held against a lab run's ground truth.
#[derive(Serialize, Debug)]
pub struct LabVerdicts {
    pub episodes: Vec<Verdict>,
    /// Ticks some host was named while no episode was on (nor 15 s after one).
    pub calm_ticks_named: usize,
    pub calm_ticks: usize,
}

pub fn against_lab(sc: &Scores, lab: &super::load::Lab) -> LabVerdicts {
    let fired = firing(sc);
    let at = |k: usize| sc.t0 + k as f64 * sc.tick_s;
    let during = |e: &super::load::Episode, t: f64| t >= e.t_start && t <= e.t_end + MERGE_S;
    let episodes = lab
        .episodes
        .iter()
        .filter_map(|e| {
            let rank = e.rank?;
            let direction = crate::dataset::job::direction_of(&e.kind)?;
            let host = lab.rank_addrs.get(rank)?.clone();
            let mut named_after_s = None;
            let mut also_named = Vec::new();
            for (i, f) in fired.iter().enumerate() {
                for &(k, d, _) in f.iter().filter(|x| during(e, at(x.0))) {
                    if sc.hosts[i] == host && d == direction {
                        let after = at(k) - e.t_start;
                        named_after_s = Some(named_after_s.map_or(after, |a: f64| a.min(after)));
                    } else {
                        also_named.push((sc.hosts[i].clone(), d));
                    }
                }
            }
            also_named.sort();
            also_named.dedup();
            Some(Verdict {
                kind: e.kind.clone(),
                rank,
                host,
                direction,
                from_s: e.t_start - sc.t0,
                to_s: e.t_end - sc.t0,
                named_after_s,
                also_named,
            })
        })
        .collect();
    let n = sc.link.first().map_or(0, Vec::len);
    let calm: Vec<usize> = (0..n)
        .filter(|&k| !lab.episodes.iter().any(|e| during(e, at(k))))
        .collect();
    let calm_ticks_named = calm
        .iter()
        .filter(|&&k| fired.iter().any(|f| f.iter().any(|x| x.0 == k)))
        .count();
    LabVerdicts {
        episodes,
        calm_ticks_named,
        calm_ticks: calm.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::Observation;

    fn rec(name: &str, obs: Vec<Observation>) -> Recording {
        Recording {
            name: name.into(),
            path: name.into(),
            obs,
            events: Vec::new(),
            lab: None,
            recorded_address: None,
        }
    }

    /// Three hosts in a ring (a -> b -> c -> a), 1 s ticks for 200 s, each connection at
    /// 1 ms with 50 RTT samples a tick; from 120 s host b's egress queue holds 9 ms (its
    /// srtt towards c rises to 10 ms, its qdisc's median sojourn to 9 ms) and, as a queue
    /// on b's link delays both ways, a's srtt towards b rises too. With `loss_towards_c`,
    /// from 120 s b retransmits 4% of what it sends to c, and c 1.5% of what it sends to a.
    fn ring(loss_towards_c: bool) -> Vec<Recording> {
        let addr = ["10.0.0.1", "10.0.0.2", "10.0.0.3"];
        let mut out: Vec<Vec<Observation>> = vec![Vec::new(); 3];
        for k in 0..200 {
            let t = 1_000.0 + k as f64;
            let on = k >= 120;
            for (i, o) in out.iter_mut().enumerate() {
                let j = (i + 1) % 3;
                let slow = on && (i == 1 || j == 1);
                // c's input drops a's ACKs too: c retransmits 1.5% of what it sends to a.
                let retransmits = match (loss_towards_c && on, j, i) {
                    (true, 2, _) => 40.0,
                    (true, _, 2) => 15.0,
                    _ => 0.0,
                };
                o.push(Observation {
                    time_unix: t,
                    interval_s: 1.0,
                    entity_kind: PEER.into(),
                    entity: addr[j].into(),
                    srtt_s: Some(if slow { 0.010 } else { 0.001 }),
                    rtt_samples: Some(50),
                    tx_bytes_per_s: Some(1448.0 * 1000.0),
                    retransmits_per_s: Some(retransmits),
                    ..Observation::default()
                });
                o.push(Observation {
                    time_unix: t,
                    interval_s: 1.0,
                    entity_kind: INTERFACE.into(),
                    entity: "eth0".into(),
                    sojourn_samples: Some(100),
                    sojourn_p50_s: Some(if on && i == 1 { 0.009 } else { 0.000_01 }),
                    ..Observation::default()
                });
            }
        }
        out.into_iter()
            .enumerate()
            .map(|(i, o)| rec(addr[i], o))
            .collect()
    }

    fn hosts(recs: &[Recording]) -> Vec<Host<'_>> {
        recs.iter()
            .map(|r| Host {
                name: r.name.clone(),
                addr: r.name.clone(),
                rec: r,
            })
            .collect()
    }

    /// Four hosts in a ring, calm for 120 s (1 ms, 1,000 segments a second each, nothing
    /// queued); then host c holds 512 KiB of b's data unread and b 128 KiB unsent towards c
    /// (c's window is full), every RTT calm, and the job's bytes a second fall to
    /// `pace` of calm from 150 s; with `lossy`, b retransmits 4% of what it sends to c.
    fn straggler(pace: f64, lossy: bool) -> Vec<Recording> {
        let addr = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"];
        let mut out: Vec<Vec<Observation>> = vec![Vec::new(); 4];
        for k in 0..200 {
            let t = 1_000.0 + k as f64;
            let on = k >= 120;
            for (i, o) in out.iter_mut().enumerate() {
                let (next, prev) = ((i + 1) % 4, (i + 3) % 4);
                let rate = if k >= 150 { pace } else { 1.0 };
                o.push(Observation {
                    time_unix: t,
                    interval_s: 1.0,
                    entity_kind: PEER.into(),
                    entity: addr[next].into(),
                    srtt_s: Some(0.001),
                    rtt_samples: Some(50),
                    tx_bytes_per_s: Some(1448.0 * 1000.0 * rate),
                    retransmits_per_s: Some(if lossy && on && i == 1 { 40.0 } else { 0.0 }),
                    receive_queue_bytes: Some(0),
                    send_queue_bytes: Some(if on && i == 1 { 131_072 } else { 0 }),
                    ..Observation::default()
                });
                o.push(Observation {
                    time_unix: t,
                    interval_s: 1.0,
                    entity_kind: PEER.into(),
                    entity: addr[prev].into(),
                    receive_queue_bytes: Some(if on && i == 2 { 524_288 } else { 0 }),
                    send_queue_bytes: Some(0),
                    ..Observation::default()
                });
            }
        }
        out.into_iter()
            .enumerate()
            .map(|(i, o)| rec(addr[i], o))
            .collect()
    }

    /// The host that holds the job's bytes unread while the job slows is named compute,
    /// once the pace is under 0.8 of calm (the rate is a mean of 5 ticks: 0.7 at 152 at
    /// half pace, then held 2 s); the same unread bytes at the job's full pace (a calm ring's phase
    /// lag) or at 0.9 of it name nobody.
    #[test]
    fn names_the_host_the_job_waits_on_only_when_the_job_slowed() {
        let recs = straggler(0.5, false);
        let sc = scores(&hosts(&recs));
        assert!((sc.job_pace[140] - 1.0).abs() < 1e-9);
        assert!((sc.job_pace[160] - 0.5).abs() < 1e-9);
        assert_eq!(sc.unread[2][140], 524_288.0);
        assert_eq!(sc.unsent[1][140], 131_072.0);
        assert_eq!(sc.unread_held[2][140], 1.0);
        let c = culprits(&sc);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(
            (c[0].host.as_str(), c[0].direction),
            ("10.0.0.3", "compute")
        );
        assert_eq!(c[0].causes, ["straggler"]);
        assert_eq!(c[0].from_unix, 1_154.0);
        assert_eq!(c[0].evidence.unread_bytes, 524_288.0);
        for pace in [1.0, 0.9] {
            let recs = straggler(pace, false);
            let c = culprits(&scores(&hosts(&recs)));
            assert!(c.is_empty(), "pace {pace}: {c:?}");
        }
        // Loss into c explains the slowing down: c is named ingress, nobody compute.
        let recs = straggler(0.5, true);
        let c = culprits(&scores(&hosts(&recs)));
        let named: Vec<_> = c.iter().map(|c| (c.host.as_str(), c.direction)).collect();
        assert_eq!(named, [("10.0.0.3", "ingress")], "{c:?}");
    }

    #[test]
    fn names_the_host_whose_egress_holds_the_queue_and_no_other() {
        let recs = ring(false);
        let sc = scores(&hosts(&recs));
        assert_eq!(sc.tick_s, 1.0);
        // Calm: b's srtt towards c is at its calm level.
        assert!((sc.ratio[1][2][100] - 1.0).abs() < 1e-9);
        // The RTT is up 10x, 90% of it in b's qdisc.
        assert!((sc.as_sender[1][125] - 10.0).abs() < 1e-9);
        assert!((sc.egress_share[1][125] - 0.9).abs() < 1e-9);
        let c = culprits(&sc);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!((c[0].host.as_str(), c[0].direction), ("10.0.0.2", "egress"));
        assert_eq!(c[0].causes, ["queue"]);
        // The qdisc's share is a median of the last 5 s: over a quarter from 122 (3 of 5
        // ticks), then held for 2 s (`for: 2s`): firing from 124.
        assert_eq!(c[0].from_unix, 1_124.0);
        assert!((c[0].matrix[1][2] - 10.0).abs() < 1e-9);
        assert!(c[0].matrix[1][1].is_nan());
    }

    #[test]
    fn names_loss_towards_a_host_by_its_share_of_the_segments() {
        let recs = ring(true);
        let sc = scores(&hosts(&recs));
        // 40 retransmits a second of 1000 segments; towards a, over the threshold too but
        // not the job's largest share, 15.
        assert!((sc.retransmit_share[2][130] - 0.04).abs() < 1e-9);
        assert!((sc.retransmit_share[0][130] - 0.015).abs() < 1e-9);
        let c = culprits(&sc);
        let loss: Vec<&Culprit> = c.iter().filter(|c| c.causes.contains(&"loss")).collect();
        assert_eq!(loss.len(), 1, "{c:?}");
        assert_eq!(
            (loss[0].host.as_str(), loss[0].direction),
            ("10.0.0.3", "ingress")
        );
    }

    /// b's bytes towards c stop while its retransmits go on: c's share is +Inf, as in
    /// PromQL, and holds the job's largest share, so a (1.5%) is not named beside it.
    #[test]
    fn a_share_over_no_segment_is_the_largest() {
        let mut recs = ring(true);
        for o in recs[1].obs.iter_mut() {
            if o.entity == "10.0.0.3" && o.time_unix >= 1_120.0 {
                o.tx_bytes_per_s = Some(0.0);
            }
        }
        let sc = scores(&hosts(&recs));
        assert_eq!(sc.retransmit_share[2][130], f64::INFINITY);
        let named: Vec<String> = culprits(&sc)
            .into_iter()
            .filter(|c| c.causes.contains(&"loss"))
            .map(|c| c.host)
            .collect();
        assert_eq!(named, ["10.0.0.3"]);
    }

    #[test]
    fn no_culprit_before_the_calm_level_has_its_samples_nor_in_calm() {
        let recs = ring(false);
        let sc = scores(&hosts(&recs));
        // 19 samples: no calm level yet, no ratio.
        assert!(sc.ratio[1][2][18].is_nan());
        assert!(sc.ratio[1][2][19].is_finite());
        assert!(firing(&sc)
            .iter()
            .all(|f| f.iter().all(|(k, _, _)| *k >= 120)));
    }

    /// The parameters here are the alert's: each appears in rules/job.rules.yml as written.
    #[test]
    fn thresholds_are_the_rules() {
        let rules = include_str!("../../../rules/job.rules.yml");
        for needle in [
            format!("quantile_over_time({CALM_QUANTILE}, probe:tcp_srtt_seconds:active_calm[1h])"),
            format!(
                "count_over_time(probe:tcp_srtt_seconds:active_calm[1h]) >= {CALM_MIN_SAMPLES}"
            ),
            format!("ALERTS_FOR_STATE{{alertname=\"ProbeJobCulpritHost\"}} < {CALM_PAUSE_S}"),
            "min by (training_job) (probe:job_host_srtt_ratio:as_sender)".into(),
            "min by (training_job) (probe:job_host_link_score)".into(),
            format!("{STAND_OUT} * probe:job_srtt_ratio_as_sender:min"),
            format!("{STAND_OUT} * probe:job_link_score:min"),
            format!("probe:job_host_srtt_ratio:as_sender > {RATIO}"),
            format!("probe:job_host_egress_queue_share > {EGRESS_SHARE}"),
            format!("min_over_time(probe:job_host_link_score[{WINDOW_S}s]) > {RATIO}"),
            format!("probe:job_host_retransmit_share:as_receiver > {LOSS_SHARE}"),
            format!("probe:job_host_retransmits:as_receiver > {LOSS_RATE}"),
            ">= on (training_job) group_left\n              max by (training_job) (probe:job_host_retransmit_share:as_receiver)".into(),
            format!("/ {SEGMENT_BYTES}"),
            format!("for: {FOR_S}s"),
            format!("probe:job_host_unread_bytes:avg10s > {UNREAD_FLOOR}"),
            format!("{UNREAD_STAND_OUT} * quantile by (training_job) (0.5, probe:job_host_unread_bytes:avg10s)"),
            "max by (training_job) (probe:job_host_unsent_bytes:avg10s)".into(),
            ">= on (training_job) group_left\n              max by (training_job) (probe:job_host_unread_bytes:avg10s)".into(),
            format!("avg_over_time(probe:job_host_unread:held[{QUEUE_WINDOW_S}s]) > {UNREAD_HELD}"),
            // Offline the peer's queue stands for the job's: a recording is of one job's host.
            format!("avg_over_time(probe_job_receive_queue_bytes[{QUEUE_WINDOW_S}s])"),
            format!("probe:job_host_srtt_ratio:as_sender <= {CALM_RTT}"),
            format!("probe:job_pace_ratio < {JOB_SLOWED}"),
            format!("max_over_time(probe:job_host_retransmit_share:as_receiver[{QUEUE_WINDOW_S}s]) > {LOSS_SHARE}"),
            format!("probe:job_host_srtt_ratio:as_sender > {RATIO}\n                  and on (instance) probe:job_host_egress_queue_share > {EGRESS_SHARE}"),
            format!("quantile_over_time({CALM_QUANTILE}, probe:job_sent_segments:sum_rate5s_calm[1h])"),
            format!("count_over_time(probe:job_sent_segments:sum_rate5s_calm[1h]) >= {CALM_MIN_SAMPLES}"),
        ] {
            assert!(
                rules.contains(&needle),
                "rules/job.rules.yml lacks `{needle}`"
            );
        }
        let forecast = include_str!("../../../rules/forecast.rules.yml");
        assert!(forecast.contains("rate(probe_tcp_rtt_seconds_count[2m]))"));
        assert!(forecast.contains("(probe:tcp_rtt_samples:rate2m >= 1)"));
        assert_eq!(ACTIVE_WINDOW_S, 120.0);
        assert_eq!(CALM_WINDOW_S, 3600.0);
    }
}

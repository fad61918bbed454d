//! The host's view of the training job it serves, one row a tick: the job's peers
//! aggregated (their RTT, busy spans, socket queues, loss, the share of their link the job
//! does not get) and the host's queue, each against the host's own calm level and with its
//! trends, so that a job at another pace or link rate looks the same. The job's early
//! warning is scored on these rows; the daemon makes them from each tick's observations and
//! busy spans and `probe features --job` from a recording's (or a compact run's), by this
//! one code path.
//!
//! A job peer is a peer with one of the job's sockets this tick (a connection or socket
//! bytes): with the probe scoped to the job's cgroup, TC still counts every byte to that
//! address, the socket dump only the job's, which is how traffic from outside the job
//! shows (`foreign_share`).
//!
//! Calm levels are each signal's median over the last [`CALM_WINDOW_S`], once it has
//! [`CALM_MIN_S`] of history, recomputed every [`CALM_EVERY`] ticks: a per-tick value
//! pushed into a ring and a selection over it every few seconds, about 1 us a tick
//! amortized for the host's one job row.
use std::collections::VecDeque;

use crate::{
    observe::{self as o, spans::Span, Observation},
    stats::median,
};

/// The entity kind of the job rows.
pub const JOB: &str = "job";
/// History a calm level is taken over, seconds.
pub const CALM_WINDOW_S: f64 = 300.0;
/// History a calm level needs, seconds.
pub const CALM_MIN_S: f64 = 60.0;
/// Ticks between calm levels' recomputation.
pub const CALM_EVERY: u64 = 10;
/// The short trend: the mean of the last this many seconds against the same span before.
pub const TREND_S: f64 = 5.0;
/// The longest look back of a row's own features (its maximum).
pub const RECENT_S: f64 = 15.0;

/// One per-tick job signal.
pub struct JobSignal {
    pub name: &'static str,
    pub unit: &'static str,
    /// Compared to its calm level as a ratio (levels) or a difference (shares, which may
    /// be calm at 0).
    pub ratio: bool,
    /// A ratio's calm level is at least this: a job whose transfers are mostly under the
    /// spans' merge gap would otherwise read a 20 ms span as a hundredfold.
    pub floor: f64,
    pub what: &'static str,
    pub why: &'static str,
}

/// The signals, in row order.
pub const SIGNALS: &[JobSignal] = &[
    JobSignal {
        name: "srtt",
        floor: 1e-4,
        unit: "s",
        ratio: true,
        what: "median smoothed RTT of the job's peers",
        why: "a queue on the host's path slows every transfer of the job",
    },
    JobSignal {
        name: "srtt_max",
        floor: 1e-4,
        unit: "s",
        ratio: true,
        what: "largest smoothed RTT of any job peer",
        why: "one congested path stalls a synchronous step",
    },
    JobSignal {
        name: "span_max",
        floor: 0.01,
        unit: "s",
        ratio: true,
        what: "longest busy span (bursts less than 10 ms apart) of any job peer in the tick",
        why: "a transfer that takes longer is the slowdown before the iteration shows it",
    },
    JobSignal {
        name: "busy",
        floor: 0.01,
        unit: "1",
        ratio: true,
        what: "busy seconds of all job peers' spans per second of the tick",
        why: "communication stretching into the compute phase",
    },
    JobSignal {
        name: "egress_share",
        floor: 0.0,
        unit: "1",
        ratio: false,
        what: "share of the spans' bytes this host sent",
        why: "which way the host's traffic leans: a squeezed sender, an incast receiver",
    },
    JobSignal {
        name: "job_bytes",
        floor: 1e3,
        unit: "B/s",
        ratio: true,
        what: "the job's socket bytes per second to and from its peers, both directions, over the last 5 s",
        why: "a job that moves less per second is a job that has slowed",
    },
    JobSignal {
        name: "foreign_share",
        floor: 0.0,
        unit: "1",
        ratio: false,
        what: "share of the wire bytes to and from the job's peers that are not the job's sockets' (TC bytes against the socket dump's), over the last 5 s",
        why: "traffic from outside the job on the job's links",
    },
    JobSignal {
        name: "unread",
        floor: 0.0,
        unit: "B",
        ratio: false,
        what: "bytes received and not yet read by the job's sockets",
        why: "a host that does not keep up (compute straggler) holds the job's data unread",
    },
    JobSignal {
        name: "unsent",
        floor: 0.0,
        unit: "B",
        ratio: false,
        what: "bytes the job's sockets hold not yet acknowledged",
        why: "a slow path holds the sender's data",
    },
    JobSignal {
        name: "retransmit_share",
        floor: 0.0,
        unit: "1",
        ratio: false,
        what: "retransmitted segments over packets sent to the job's peers",
        why: "loss on the host's path",
    },
    JobSignal {
        name: "queue",
        floor: 0.0,
        unit: "s",
        ratio: false,
        what: "the host's qdisc backlog over its send rate: seconds of queue",
        why: "an egress squeeze queues on the host itself",
    },
    JobSignal {
        name: "foreign_tx_share",
        floor: 0.0,
        unit: "1",
        ratio: false,
        what: "share of the wire bytes sent to the job's peers that are not the job's sockets', over the last 5 s",
        why: "this host sends traffic from outside the job on the job's links (an incast's sender, cross traffic)",
    },
    JobSignal {
        name: "foreign_rx_share",
        floor: 0.0,
        unit: "1",
        ratio: false,
        what: "share of the wire bytes received from the job's peers that are not the job's sockets', over the last 5 s",
        why: "traffic from outside the job arrives on this host's link (an incast's receiver)",
    },
];

/// The features of each signal, in row order: (suffix, unit of the feature, definition).
pub const STATS: &[(&str, &str)] = &[
    ("", "the signal this tick"),
    (
        "_over_calm",
        "this tick against the calm level: a ratio for levels, a difference for shares",
    ),
    (
        "_trend",
        "the mean of the last 5 s minus that of the 5 s before, against the calm level as above",
    ),
    (
        "_peak_over_calm",
        "the largest value of the last 15 s against the calm level, as above",
    ),
];

/// Feature names, in row order: `job_{signal}{stat}`.
pub fn names() -> Vec<String> {
    SIGNALS
        .iter()
        .flat_map(|s| {
            STATS
                .iter()
                .map(move |(st, _)| format!("job_{}{st}", s.name))
        })
        .collect()
}

/// One tick's job features.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRow {
    pub time_unix: f64,
    /// Job peers this tick.
    pub peers: usize,
    /// In [`names`] order; NaN where not known.
    pub values: Vec<f64>,
}

/// One tick's signals, before the job state: the socket and wire byte rates are kept
/// apart, since the socket dump's counters move only on the ticks it reads (every few ticks
/// on a busy host: between reads the job's bytes read 0, then the sum of several ticks).
pub struct TickSignals {
    pub peers: usize,
    /// [`SIGNALS`] order, NaN where not known; `job_bytes` and `foreign_share` of this
    /// tick alone.
    pub values: Vec<f64>,
    /// Bytes per second: the job's sockets' sent and received, the wire's sent and received
    /// (TC) to and from the job's peers.
    pub bytes: [Option<f64>; 4],
}

const JOB_BYTES: usize = 5;
const FOREIGN_SHARE: usize = 6;
const FOREIGN_TX: usize = 11;
const FOREIGN_RX: usize = 12;

/// The per-tick signals of one tick, with its byte rates.
pub fn tick_signals(obs: &[Observation], spans: &[Span]) -> TickSignals {
    let job: Vec<&Observation> = obs
        .iter()
        .filter(|r| r.entity_kind == o::PEER && is_job_peer(r))
        .collect();
    let mut out = vec![f64::NAN; SIGNALS.len()];
    if job.is_empty() {
        return TickSignals {
            peers: 0,
            values: out,
            bytes: [None; 4],
        };
    }
    let mut srtt: Vec<f64> = job
        .iter()
        .filter_map(|r| r.srtt_s)
        .filter(|v| *v > 0.0)
        .collect();
    out[1] = srtt.iter().copied().fold(f64::NAN, f64::max);
    out[0] = median(&mut srtt).unwrap_or(f64::NAN);
    let interval = job.iter().map(|r| r.interval_s).fold(f64::NAN, f64::max);
    let is_job = |s: &&Span| job.iter().any(|r| *r.entity == *s.peer);
    let (mut longest, mut busy, mut bytes, mut egress) = (0i64, 0i64, 0u64, 0u64);
    for s in spans.iter().filter(is_job) {
        longest = longest.max(s.duration_us);
        busy += s.duration_us;
        bytes += s.bytes;
        egress += s.egress_bytes;
    }
    out[2] = longest as f64 / 1e6;
    if interval > 0.0 {
        out[3] = busy as f64 / 1e6 / interval;
    }
    if bytes > 0 {
        out[4] = egress as f64 / bytes as f64;
    }
    let bytes = [
        sum(job.iter().map(|r| r.socket_tx_bytes_per_s)),
        sum(job.iter().map(|r| r.socket_rx_bytes_per_s)),
        sum(job.iter().map(|r| r.tx_bytes_per_s)),
        sum(job.iter().map(|r| r.rx_bytes_per_s)),
    ];
    bytes_signals(&mut out, &[bytes], 1);
    out[7] = sum(job.iter().map(|r| r.receive_queue_bytes.map(|b| b as f64))).unwrap_or(f64::NAN);
    out[8] = sum(job.iter().map(|r| r.send_queue_bytes.map(|b| b as f64))).unwrap_or(f64::NAN);
    let retx = sum(job.iter().map(|r| r.retransmits_per_s));
    let sent = sum(job.iter().map(|r| r.tx_packets_per_s));
    if let (Some(r), Some(p)) = (retx, sent) {
        if p > 0.0 {
            out[9] = r / p;
        }
    }
    if let Some(h) = obs.iter().find(|r| r.entity_kind == o::HOST) {
        if let (Some(b), Some(tx)) = (h.qdisc_backlog_bytes, h.tx_bytes_per_s) {
            out[10] = if b == 0 {
                0.0
            } else if tx > 0.0 {
                b as f64 / tx
            } else {
                f64::NAN
            };
        }
    }
    TickSignals {
        peers: job.len(),
        values: out,
        bytes,
    }
}

/// The byte signals over ticks of byte rates (`bytes` entries, `ticks` of them with the
/// job's socket bytes known): the job's mean bytes per second, and the foreign shares.
fn bytes_signals(out: &mut [f64], bytes: &[[Option<f64>; 4]], ticks: usize) {
    let col = |i: usize| sum(bytes.iter().map(|b| b[i]));
    let (stx, srx, wtx, wrx) = (col(0), col(1), col(2), col(3));
    let both = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (None, None) => None,
        _ => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    };
    out[JOB_BYTES] = both(stx, srx).map_or(f64::NAN, |s| s / ticks.max(1) as f64);
    out[FOREIGN_SHARE] = foreign(both(stx, srx), both(wtx, wrx));
    out[FOREIGN_TX] = foreign(stx, wtx);
    out[FOREIGN_RX] = foreign(srx, wrx);
}

/// The share of the wire bytes that are not the sockets'.
fn foreign(sock: Option<f64>, wire: Option<f64>) -> f64 {
    match (sock, wire) {
        (Some(s), Some(w)) if w > 0.0 => (1.0 - s / w).clamp(0.0, 1.0),
        _ => f64::NAN,
    }
}

/// A peer with one of the job's sockets this tick.
fn is_job_peer(r: &Observation) -> bool {
    r.connections.unwrap_or(0) > 0
        || r.socket_tx_bytes_per_s.is_some()
        || r.socket_rx_bytes_per_s.is_some()
}

/// The sum of the known values; None if none is.
fn sum(v: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    v.fold(None, |acc, x| match x.filter(|x| x.is_finite()) {
        Some(x) => Some(acc.unwrap_or(0.0) + x),
        None => acc,
    })
}

/// The host's job state: the recent per-tick signals and their calm levels.
#[derive(Default)]
pub struct JobFeatures {
    history: VecDeque<(f64, Vec<f64>)>,
    /// The last `TREND_S` of (time, [`TickSignals::bytes`]).
    bytes: VecDeque<(f64, [Option<f64>; 4])>,
    scratch_bytes: Vec<[Option<f64>; 4]>,
    calm: Vec<f64>,
    ticks: u64,
    scratch: Vec<f64>,
}

impl JobFeatures {
    pub fn new() -> Self {
        Self::default()
    }

    /// The job row of one tick; None when the host has no job peer this tick (the job's
    /// history is kept: a pause between steps is not a new job).
    pub fn tick(&mut self, now: f64, obs: &[Observation], spans: &[Span]) -> Option<JobRow> {
        let TickSignals {
            peers,
            values: mut x,
            bytes,
        } = tick_signals(obs, spans);
        self.ticks += 1;
        if peers > 0 {
            self.bytes.push_back((now, bytes));
            while self.bytes.front().is_some_and(|(t, _)| now - t >= TREND_S) {
                self.bytes.pop_front();
            }
            self.scratch_bytes.clear();
            self.scratch_bytes.extend(self.bytes.iter().map(|b| b.1));
            let n = self
                .bytes
                .iter()
                .filter(|b| b.1[0].is_some() || b.1[1].is_some())
                .count();
            bytes_signals(&mut x, &self.scratch_bytes, n);
        }
        while self
            .history
            .front()
            .is_some_and(|(t, _)| now - t > CALM_WINDOW_S)
        {
            self.history.pop_front();
        }
        if self.calm.is_empty() || (self.ticks - 1).is_multiple_of(CALM_EVERY) {
            self.recalm(now);
        }
        if peers == 0 {
            return None;
        }
        self.history.push_back((now, x));
        Some(JobRow {
            time_unix: now,
            peers,
            values: self.row(now),
        })
    }

    /// Each signal's median over the history before this tick, if it spans `CALM_MIN_S`.
    fn recalm(&mut self, now: f64) {
        self.calm = vec![f64::NAN; SIGNALS.len()];
        let Some((first, _)) = self.history.front() else {
            return;
        };
        if now - first < CALM_MIN_S {
            return;
        }
        for (i, c) in self.calm.iter_mut().enumerate() {
            self.scratch.clear();
            self.scratch.extend(
                self.history
                    .iter()
                    .map(|(_, x)| x[i])
                    .filter(|v| v.is_finite()),
            );
            *c = median(&mut self.scratch).unwrap_or(f64::NAN);
        }
    }

    fn row(&self, now: f64) -> Vec<f64> {
        let mut out = Vec::with_capacity(SIGNALS.len() * STATS.len());
        let (_, last) = self.history.back().expect("pushed this tick");
        for (i, s) in SIGNALS.iter().enumerate() {
            let calm = self.calm.get(i).copied().unwrap_or(f64::NAN);
            let calm = if s.ratio && calm.is_finite() {
                calm.max(s.floor)
            } else {
                calm
            };
            let rel = |v: f64| {
                if s.ratio {
                    if calm > 0.0 {
                        v / calm
                    } else {
                        f64::NAN
                    }
                } else {
                    v - calm
                }
            };
            let mean_in = |from: f64, to: f64| {
                let (mut n, mut sum) = (0usize, 0.0);
                for (t, x) in self.history.iter().rev() {
                    if *t <= from {
                        break;
                    }
                    if *t <= to && x[i].is_finite() {
                        n += 1;
                        sum += x[i];
                    }
                }
                if n > 0 {
                    sum / n as f64
                } else {
                    f64::NAN
                }
            };
            let recent = mean_in(now - TREND_S, now);
            let before = mean_in(now - 2.0 * TREND_S, now - TREND_S);
            let trend = if s.ratio {
                if calm > 0.0 {
                    (recent - before) / calm
                } else {
                    f64::NAN
                }
            } else {
                recent - before
            };
            let max = self
                .history
                .iter()
                .rev()
                .take_while(|(t, _)| now - t < RECENT_S)
                .map(|(_, x)| x[i])
                .filter(|v| v.is_finite())
                .fold(f64::NAN, f64::max);
            out.extend([last[i], rel(last[i]), trend, rel(max)]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(addr: &str, srtt: f64, sock: Option<f64>, wire: f64) -> Observation {
        Observation {
            time_unix: 0.0,
            interval_s: 0.5,
            entity_kind: o::PEER.into(),
            entity: addr.into(),
            srtt_s: Some(srtt),
            connections: Some(1),
            socket_tx_bytes_per_s: sock,
            tx_bytes_per_s: Some(wire),
            tx_packets_per_s: Some(wire / 1500.0),
            retransmits_per_s: Some(0.0),
            receive_queue_bytes: Some(0),
            send_queue_bytes: Some(0),
            ..Observation::default()
        }
    }

    fn span(addr: &str, dur_us: i64, bytes: u64, egress: u64) -> Span {
        Span {
            peer: addr.into(),
            duration_us: dur_us,
            bytes,
            egress_bytes: egress,
            ..Span::default()
        }
    }

    #[test]
    fn the_job_is_its_sockets_peers_and_the_rest_of_their_bytes_is_foreign() {
        let mut outsider = peer("10.0.0.9", 0.050, None, 1e6);
        outsider.connections = Some(0);
        let obs = [
            peer("10.0.0.2", 0.002, Some(600.0), 1000.0),
            peer("10.0.0.3", 0.004, Some(400.0), 1000.0),
            peer("10.0.0.4", 0.010, Some(1000.0), 1000.0),
            outsider,
        ];
        let spans = [
            span("10.0.0.2", 100_000, 100, 25),
            span("10.0.0.3", 50_000, 100, 75),
            span("10.0.0.9", 400_000, 1_000_000, 0),
        ];
        let TickSignals {
            peers: n,
            values: x,
            ..
        } = tick_signals(&obs, &spans);
        assert_eq!(n, 3, "the outsider has no job socket");
        assert_eq!(x[0], 0.004, "median srtt of the job's peers");
        assert_eq!(x[1], 0.010, "its largest, the outsider's 50 ms left out");
        assert_eq!(x[2], 0.1, "the longest job span");
        assert!((x[3] - 0.3).abs() < 1e-12, "0.15 s busy in a 0.5 s tick");
        assert_eq!(x[4], 0.5, "egress share of the job spans' bytes");
        assert_eq!(x[5], 2000.0);
        assert!(
            (x[6] - 1.0 / 3.0).abs() < 1e-12,
            "1000 of 3000 wire bytes foreign"
        );
    }

    #[test]
    fn a_signal_is_held_against_the_hosts_own_calm_level() {
        let mut f = JobFeatures::new();
        let names = names();
        let at = |n: &str| names.iter().position(|x| x == n).unwrap();
        let mut last = None;
        // 100 s calm at 2 ms, then 10 s at 6 ms.
        for k in 0..220 {
            let t = k as f64 * 0.5;
            let srtt = if t < 100.0 { 0.002 } else { 0.006 };
            let obs = [peer("10.0.0.2", srtt, Some(1000.0), 1000.0)];
            last = f.tick(t, &obs, &[]);
            if k == 150 {
                let r = last.as_ref().unwrap();
                assert_eq!(r.values[at("job_srtt_over_calm")], 1.0);
                assert_eq!(r.values[at("job_srtt_trend")], 0.0);
            }
        }
        let r = last.unwrap();
        assert_eq!(r.values[at("job_srtt")], 0.006);
        // The calm level stays at the median of the history, calm still most of it.
        assert!((r.values[at("job_srtt_over_calm")] - 3.0).abs() < 1e-9);
        assert!((r.values[at("job_srtt_peak_over_calm")] - 3.0).abs() < 1e-9);
        assert_eq!(
            r.values[at("job_srtt_trend")],
            0.0,
            "flat for the last 10 s"
        );
        assert_eq!(
            r.values[at("job_foreign_share_over_calm")],
            0.0,
            "a share against its calm is a difference"
        );
    }

    #[test]
    fn no_calm_level_before_a_minute_of_history() {
        let mut f = JobFeatures::new();
        let obs = [peer("10.0.0.2", 0.002, Some(1.0), 1.0)];
        for k in 0..200 {
            let r = f.tick(k as f64 * 0.5, &obs, &[]).unwrap();
            let over = r.values[1];
            // Known from the first recomputation with 60 s behind it (tick 120, 60 s).
            assert_eq!(over.is_nan(), k < 120, "tick {k}");
        }
    }

    #[test]
    fn a_tick_without_job_peers_has_no_row() {
        let mut f = JobFeatures::new();
        assert!(f.tick(0.0, &[], &[]).is_none());
        let n = names();
        assert_eq!(n.len(), SIGNALS.len() * STATS.len());
        let unique: std::collections::HashSet<&String> = n.iter().collect();
        assert_eq!(unique.len(), n.len(), "feature names collide");
    }
}

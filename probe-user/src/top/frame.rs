//! One screenful of numbers, derived from the latest snapshot and the one before it. The
//! daemon's own per-tick rates (`observations`, `features`, `forecasts`) are used when it
//! sends them; an older daemon only sends cumulative counters, so the rates are computed here
//! from two consecutive snapshots. Both the terminal UI and `--once` draw a `Frame`.
use std::collections::BTreeMap;

use super::model::{Histogram, Row, Snapshot};

/// A peer whose RTT is this many times the median of the host's peers is a straggler (the
/// threshold of the ProbeStragglerPeer alert).
pub const STRAGGLER_RATIO: f64 = 3.0;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeerRow {
    pub peer: String,
    pub srtt: Option<f64>,
    pub rtt_p99: Option<f64>,
    pub min_rtt: Option<f64>,
    pub connections: Option<f64>,
    pub retransmits_per_s: Option<f64>,
    pub tx_bytes_per_s: Option<f64>,
    pub rx_bytes_per_s: Option<f64>,
    pub bursts_per_s: Option<f64>,
    /// Mean size of the bursts that ended in the last interval.
    pub burst_bytes: Option<f64>,
    pub iteration_period: Option<f64>,
    /// (horizon in seconds, spike probability, at or above the model's threshold), the
    /// highest over targets, shortest horizon first.
    pub spike: Vec<(f64, f64, bool)>,
    pub rtt_forecast: Option<f64>,
    /// RTT over the host's median peer RTT (the daemon's feature, else computed here).
    pub straggler_ratio: Option<f64>,
    /// Every feature of the peer, by name (the detail view).
    pub features: BTreeMap<String, f64>,
}

impl PeerRow {
    pub fn is_straggler(&self) -> bool {
        self.straggler_ratio.is_some_and(|r| r >= STRAGGLER_RATIO)
    }

    /// What "sorted by risk" sorts on: the highest spike probability, else how far the peer
    /// straggles, else its RTT. Higher is riskier; tiers keep a forecast above a heuristic.
    pub fn risk(&self) -> f64 {
        if let Some(p) = self.spike.iter().map(|s| s.1).reduce(f64::max) {
            return 2.0 + p;
        }
        if let Some(r) = self.straggler_ratio {
            return 1.0 + r.min(1e6) / 1e6;
        }
        self.srtt.unwrap_or(0.0).min(1.0)
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct IfaceRow {
    pub iface: String,
    pub tx_bytes_per_s: Option<f64>,
    pub rx_bytes_per_s: Option<f64>,
    pub dropped_per_s: Option<f64>,
    pub errors_per_s: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct QdiscRow {
    pub name: String,
    pub tx_bytes_per_s: Option<f64>,
    pub backlog_bytes: Option<f64>,
    pub backlog_packets: Option<f64>,
    pub drops_per_s: Option<f64>,
    pub sojourn_p99: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RdmaRow {
    pub port: String,
    pub tx_bytes_per_s: Option<f64>,
    pub rx_bytes_per_s: Option<f64>,
    pub cnp_sent_per_s: Option<f64>,
    pub cnp_handled_per_s: Option<f64>,
    pub ecn_marked_per_s: Option<f64>,
    pub transmit_wait_per_s: Option<f64>,
    pub errors_per_s: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProgramRow {
    pub program: String,
    /// Kernel time per run, in nanoseconds (over the last interval, else since load).
    pub ns_per_run: Option<f64>,
    pub runs_per_s: Option<f64>,
}

/// The probe itself: its cost and its health.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SelfRow {
    pub programs: Vec<ProgramRow>,
    pub cpu_per_s: Option<f64>,
    pub rss_bytes: Option<f64>,
    pub flows_tracked: Option<f64>,
    pub flow_evictions: Option<f64>,
    pub map_full: Vec<(String, u64)>,
    pub events_lost: Option<f64>,
    pub hooks_attached: usize,
    pub hooks: usize,
    pub hooks_missing: Vec<String>,
    pub peers_folded: Option<f64>,
    /// (stage, seconds) of the daemon's last tick.
    pub stages: Vec<(String, f64)>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Frame {
    pub api_version: Option<u64>,
    pub tick: Option<u64>,
    pub time_unix: f64,
    pub peers: Vec<PeerRow>,
    pub ifaces: Vec<IfaceRow>,
    pub qdiscs: Vec<QdiscRow>,
    pub drops: Vec<(String, Option<f64>)>,
    pub rdma: Vec<RdmaRow>,
    pub probe: SelfRow,
    /// Rates came from the daemon (`observations`) rather than from two snapshots here.
    pub daemon_rates: bool,
    /// The host's job view: its peers, the warning's score and threshold.
    pub job: Option<super::model::Job>,
}

/// Per-second rate of a cumulative counter; None without a previous value or across a
/// reset (the counter went back: the daemon restarted).
fn rate(now: u64, before: Option<u64>, dt: Option<f64>) -> Option<f64> {
    let (before, dt) = (before?, dt?);
    Some(now.checked_sub(before)? as f64 / dt)
}

/// The observation row of an entity, if the daemon sent observations.
fn obs<'a>(s: &'a Snapshot, kind: &str, entity: &str) -> Option<&'a Row> {
    s.observations
        .iter()
        .find(|r| r.entity_kind == kind && r.entity == entity)
}

pub fn build(now: &Snapshot, prev: Option<&Snapshot>) -> Frame {
    // Only an earlier snapshot counts, and not across a tick counter that went back (a
    // restart; counters that went back are caught per value by `rate`). Equal ticks pass:
    // daemons before the tick counter send 0.
    let prev = prev.filter(|p| {
        p.time_unix < now.time_unix && p.tick.zip(now.tick).is_none_or(|(a, b)| a <= b)
    });
    let dt = prev.map(|p| now.time_unix - p.time_unix);
    let mut peers = peers(now, prev, dt);
    mark_stragglers(&mut peers);
    Frame {
        api_version: now.api_version,
        tick: now.tick,
        time_unix: now.time_unix,
        peers,
        ifaces: ifaces(now, prev, dt),
        qdiscs: qdiscs(now, prev, dt),
        drops: drops(now, prev, dt),
        rdma: rdma(now),
        probe: probe_self(now, prev, dt),
        daemon_rates: !now.observations.is_empty(),
        job: now.job.clone(),
    }
}

fn peers(now: &Snapshot, prev: Option<&Snapshot>, dt: Option<f64>) -> Vec<PeerRow> {
    let mut names: Vec<&str> = now.peers.iter().map(|p| p.peer.as_str()).collect();
    names.extend(now.flows.iter().map(|f| f.peer.as_str()));
    names.extend(
        now.observations
            .iter()
            .filter(|r| r.entity_kind == "peer")
            .map(|r| r.entity.as_str()),
    );
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .filter(|n| !n.is_empty())
        .map(|name| peer(now, prev, dt, name))
        .collect()
}

fn peer(now: &Snapshot, prev: Option<&Snapshot>, dt: Option<f64>, name: &str) -> PeerRow {
    let p = now.peers.iter().find(|p| p.peer == name);
    let pp = prev.and_then(|s| s.peers.iter().find(|p| p.peer == name));
    let o = obs(now, "peer", name);
    let on = |k: &str| o.and_then(|r| r.num(k));
    // Sums of one peer's flows (every interface) in one direction, now and before.
    let flow_bytes = |s: &Snapshot, dir: &str| -> Option<u64> {
        let mut it = s
            .flows
            .iter()
            .filter(|f| f.peer == name && f.direction == dir)
            .peekable();
        it.peek()?;
        Some(it.map(|f| f.bytes).sum())
    };
    let flow_rate = |dir: &str| {
        rate(
            flow_bytes(now, dir).unwrap_or(0),
            prev.and_then(|s| flow_bytes(s, dir)),
            dt,
        )
    };
    let rtt_delta = p.zip(pp).and_then(|(p, pp)| p.rtt.since(&pp.rtt));
    let (bursts, burst_bytes) = burst_delta(now, prev, name);
    let bursts_per_s = on("bursts")
        .zip(o.and_then(|r| r.num("interval_s")))
        .map(|(n, i)| n / i)
        .or_else(|| Some(bursts? as f64 / dt?));
    let burst_size = match (on("bursts"), on("burst_bytes")) {
        (Some(n), Some(b)) if n > 0.0 => Some(b / n),
        (Some(_), _) => None,
        _ => match (bursts, burst_bytes) {
            (Some(n), Some(b)) if n > 0 => Some(b / n as f64),
            _ => None,
        },
    };
    let feats = now
        .features
        .iter()
        .find(|r| r.entity_kind == "peer" && r.entity == name);
    let features: BTreeMap<String, f64> = feats
        .map(|f| f.numbers().map(|(k, v)| (k.to_string(), v)).collect())
        .unwrap_or_default();
    let (spike, rtt_forecast) = forecasts(now, name);
    PeerRow {
        peer: name.to_string(),
        srtt: on("srtt_s").or(p.and_then(|p| p.srtt_seconds)),
        rtt_p99: on("rtt_p99_s").or(rtt_delta.and_then(|h| h.quantile(0.99))),
        min_rtt: on("min_rtt_s").or(p.and_then(|p| p.min_rtt_seconds)),
        connections: on("connections").or(p.and_then(|p| p.connections).map(|c| c as f64)),
        retransmits_per_s: on("retransmits_per_s")
            .or_else(|| rate(p?.retransmits?, pp.and_then(|pp| pp.retransmits), dt)),
        tx_bytes_per_s: on("tx_bytes_per_s").or_else(|| flow_rate("egress")),
        rx_bytes_per_s: on("rx_bytes_per_s").or_else(|| flow_rate("ingress")),
        bursts_per_s,
        burst_bytes: burst_size,
        iteration_period: features.get("iteration_period_s").copied(),
        spike,
        rtt_forecast,
        straggler_ratio: features.get("rtt_straggler_ratio").copied(),
        features,
    }
}

/// A peer's spike probabilities by horizon (shortest first; the highest over targets), and
/// its RTT forecast at the shortest horizon that has one.
fn forecasts(now: &Snapshot, name: &str) -> (Vec<(f64, f64, bool)>, Option<f64>) {
    let rows = now
        .forecasts
        .iter()
        .filter(|f| f.entity == name && (f.entity_kind.is_empty() || f.entity_kind == "peer"));
    let mut spike: Vec<(f64, f64, bool)> = Vec::new();
    let mut rtt: Option<(f64, f64)> = None;
    for f in rows {
        let h = f.horizon_s.unwrap_or(0.0);
        if let Some(p) = f.spike_probability {
            // The model's own alarm (its threshold held for its rule's ticks); a daemon
            // without the rule alarmed at the threshold.
            let alarm = f
                .alarm
                .unwrap_or_else(|| f.threshold.is_some_and(|t| p >= t));
            match spike.iter_mut().find(|s| s.0 == h) {
                Some(s) => (s.1, s.2) = (s.1.max(p), s.2 || alarm),
                None => spike.push((h, p, alarm)),
            }
        }
        if let Some(r) = f.rtt_forecast_s {
            if rtt.is_none_or(|(best, _)| h < best) {
                rtt = Some((h, r));
            }
        }
    }
    spike.sort_by(|a, b| a.0.total_cmp(&b.0));
    (spike, rtt.map(|x| x.1))
}

/// Bursts of one peer that ended between the two snapshots, and their bytes.
fn burst_delta(now: &Snapshot, prev: Option<&Snapshot>, name: &str) -> (Option<u64>, Option<f64>) {
    let Some(prev) = prev else {
        return (None, None);
    };
    let (mut n, mut bytes) = (0u64, 0f64);
    for b in now.bursts.iter().filter(|b| b.peer == name) {
        let before = prev
            .bursts
            .iter()
            .find(|x| x.peer == name && x.iface == b.iface && x.direction == b.direction);
        let (c0, h0) = before.map_or((0, Histogram::default()), |x| (x.count, x.bytes.clone()));
        let Some(dn) = b.count.checked_sub(c0) else {
            return (None, None);
        };
        n += dn;
        bytes += (b.bytes.sum - h0.sum).max(0.0);
    }
    (Some(n), Some(bytes))
}

/// Peers without the daemon's straggler feature get a ratio to the median srtt of the
/// host's busy peers (those with RTT samples in the last interval, i.e. a p99), when there
/// are at least three. A peer that only receives gets no RTT samples and keeps a stale srtt:
/// it must neither be flagged nor move the median (the same rule as rules/forecast.rules.yml).
fn mark_stragglers(peers: &mut [PeerRow]) {
    let busy = |p: &PeerRow| p.rtt_p99.and(p.srtt);
    let mut rtts: Vec<f64> = peers.iter().filter_map(busy).collect();
    if rtts.len() < 3 {
        return;
    }
    rtts.sort_by(f64::total_cmp);
    let median = rtts[rtts.len() / 2];
    if median <= 0.0 {
        return;
    }
    for p in peers.iter_mut().filter(|p| p.straggler_ratio.is_none()) {
        p.straggler_ratio = busy(p).map(|s| s / median);
    }
}

fn ifaces(now: &Snapshot, prev: Option<&Snapshot>, dt: Option<f64>) -> Vec<IfaceRow> {
    let mut names: Vec<&str> = now.interfaces.iter().map(String::as_str).collect();
    names.extend(now.links.iter().map(|l| l.iface.as_str()));
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let o = obs(now, "interface", name);
            let on = |k: &str| o.and_then(|r| r.num(k));
            let l = now.links.iter().find(|l| l.iface == name);
            let lp = prev.and_then(|s| s.links.iter().find(|l| l.iface == name));
            let r = |f: fn(&super::model::Link) -> u64| rate(f(l?), lp.map(f), dt);
            let sum = |a: Option<f64>, b: Option<f64>| Some(a? + b?);
            IfaceRow {
                iface: name.to_string(),
                tx_bytes_per_s: on("tx_bytes_per_s").or_else(|| r(|l| l.tx_bytes)),
                rx_bytes_per_s: on("rx_bytes_per_s").or_else(|| r(|l| l.rx_bytes)),
                dropped_per_s: sum(on("tx_dropped_per_s"), on("rx_dropped_per_s"))
                    .or_else(|| r(|l| l.tx_dropped + l.rx_dropped)),
                errors_per_s: sum(on("tx_errors_per_s"), on("rx_errors_per_s"))
                    .or_else(|| r(|l| l.tx_errors + l.rx_errors)),
            }
        })
        .collect()
}

fn qdiscs(now: &Snapshot, prev: Option<&Snapshot>, dt: Option<f64>) -> Vec<QdiscRow> {
    now.qdiscs
        .iter()
        .map(|q| {
            let name = q.entity();
            let o = obs(now, "qdisc", &name);
            let on = |k: &str| o.and_then(|r| r.num(k));
            let qp = prev.and_then(|s| s.qdiscs.iter().find(|x| x.entity() == name));
            // Sojourn is per interface: every qdisc of the interface shows it.
            let soj = |s: &Snapshot| s.sojourn.iter().find(|x| x.iface == q.iface).cloned();
            let soj_delta = soj(now)
                .zip(prev.and_then(soj))
                .and_then(|(a, b)| a.seconds.since(&b.seconds));
            let io = obs(now, "interface", &q.iface);
            QdiscRow {
                tx_bytes_per_s: on("tx_bytes_per_s")
                    .or_else(|| rate(q.sent_bytes, qp.map(|x| x.sent_bytes), dt)),
                backlog_bytes: on("qdisc_backlog_bytes").or(Some(q.backlog_bytes as f64)),
                backlog_packets: on("qdisc_backlog_packets").or(Some(q.backlog_packets as f64)),
                drops_per_s: on("qdisc_drops_per_s")
                    .or_else(|| rate(q.drops, qp.map(|x| x.drops), dt)),
                sojourn_p99: on("sojourn_p99_s")
                    .or_else(|| io.and_then(|r| r.num("sojourn_p99_s")))
                    .or_else(|| soj_delta.and_then(|h| h.quantile(0.99))),
                name,
            }
        })
        .collect()
}

fn drops(now: &Snapshot, prev: Option<&Snapshot>, dt: Option<f64>) -> Vec<(String, Option<f64>)> {
    let mut out: Vec<(String, Option<f64>)> = now
        .drops
        .iter()
        .map(|d| {
            let o = obs(now, "drop_reason", &d.reason).and_then(|r| r.num("drops_per_s"));
            let before = prev.and_then(|s| s.drops.iter().find(|x| x.reason == d.reason));
            // A reason absent before had no drops then.
            let before = before.map_or(prev.map(|_| 0), |b| Some(b.packets));
            (d.reason.clone(), o.or_else(|| rate(d.packets, before, dt)))
        })
        .collect();
    out.sort_by(|a, b| b.1.unwrap_or(0.0).total_cmp(&a.1.unwrap_or(0.0)));
    out
}

fn rdma(now: &Snapshot) -> Vec<RdmaRow> {
    let Some(r) = &now.rdma else {
        return Vec::new();
    };
    r.ports
        .iter()
        .map(|p| {
            let g = |k: &str| p.rates.get(k).copied();
            let errors = [
                "out_of_sequence_packets",
                "packet_sequence_errors",
                "local_ack_timeout_errors",
                "rnr_nak_retry_errors",
                "transmit_discards",
            ]
            .iter()
            .filter_map(|k| g(k))
            .reduce(|a, b| a + b);
            RdmaRow {
                port: format!("{}/{}", p.device, p.port),
                tx_bytes_per_s: g("transmit_bytes"),
                rx_bytes_per_s: g("receive_bytes"),
                cnp_sent_per_s: g("cnp_sent"),
                cnp_handled_per_s: g("cnp_handled"),
                ecn_marked_per_s: g("ecn_marked_packets"),
                transmit_wait_per_s: g("transmit_wait_ticks"),
                errors_per_s: errors,
            }
        })
        .collect()
}

fn probe_self(now: &Snapshot, prev: Option<&Snapshot>, dt: Option<f64>) -> SelfRow {
    let programs = now
        .programs
        .iter()
        .map(|p| {
            let before = prev.and_then(|s| s.programs.iter().find(|x| x.program == p.program));
            let per_run = match before {
                Some(b) if p.runs > b.runs => {
                    Some((p.run_seconds - b.run_seconds).max(0.0) / (p.runs - b.runs) as f64)
                }
                _ if p.runs > 0 => Some(p.run_seconds / p.runs as f64),
                _ => None,
            };
            ProgramRow {
                program: p.program.clone(),
                ns_per_run: per_run.map(|s| s * 1e9),
                runs_per_s: rate(p.runs, before.map(|b| b.runs), dt),
            }
        })
        .collect();
    let cpu = |s: &Snapshot| s.process.as_ref().and_then(|p| p.cpu_seconds);
    let missing: Vec<String> = now
        .hooks
        .iter()
        .filter(|h| !h.attached)
        .map(|h| h.hook.clone())
        .collect();
    SelfRow {
        programs,
        cpu_per_s: cpu(now)
            .zip(prev.and_then(cpu))
            .zip(dt)
            .map(|((a, b), dt)| (a - b).max(0.0) / dt),
        rss_bytes: now
            .process
            .as_ref()
            .and_then(|p| p.rss_bytes)
            .map(|b| b as f64),
        flows_tracked: now.flows_tracked.map(|x| x as f64),
        flow_evictions: now.flow_evictions.map(|x| x as f64),
        map_full: now
            .map_full
            .iter()
            .map(|m| (m.map.clone(), m.inserts_refused))
            .collect(),
        events_lost: now.events_lost.map(|x| x as f64),
        hooks_attached: now.hooks.len() - missing.len(),
        hooks: now.hooks.len(),
        hooks_missing: missing,
        peers_folded: now.peers_folded.map(|x| x as f64),
        stages: now
            .stages
            .iter()
            .map(|t| (t.stage.clone(), t.seconds))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn snap(v: serde_json::Value) -> Snapshot {
        serde_json::from_value(v).unwrap()
    }

    /// An old daemon: rates come from two snapshots.
    #[test]
    fn rates_from_two_snapshots() {
        let a = snap(json!({"tick": 1, "time_unix": 100.0,
            "flows": [{"iface": "v", "direction": "egress", "peer": "10.0.0.2", "bytes": 1000}],
            "peers": [{"peer": "10.0.0.2", "srtt_seconds": 0.001, "retransmits": 2}],
            "links": [{"iface": "v", "tx_bytes": 0, "rx_bytes": 0}],
            "drops": [{"reason": "NO_SOCKET", "packets": 1}]}));
        let b = snap(json!({"tick": 3, "time_unix": 102.0,
            "flows": [{"iface": "v", "direction": "egress", "peer": "10.0.0.2", "bytes": 5000},
                      {"iface": "v", "direction": "ingress", "peer": "10.0.0.2", "bytes": 10}],
            "peers": [{"peer": "10.0.0.2", "srtt_seconds": 0.002, "retransmits": 6}],
            "links": [{"iface": "v", "tx_bytes": 4000, "rx_bytes": 10}],
            "drops": [{"reason": "NO_SOCKET", "packets": 5}, {"reason": "NEW", "packets": 2}]}));
        let f = build(&b, Some(&a));
        let p = &f.peers[0];
        assert_eq!(p.tx_bytes_per_s, Some(2000.0));
        assert_eq!(
            p.rx_bytes_per_s, None,
            "no ingress before: unknown, not a spike"
        );
        assert_eq!(p.retransmits_per_s, Some(2.0));
        assert_eq!(p.srtt, Some(0.002));
        assert_eq!(f.ifaces[0].tx_bytes_per_s, Some(2000.0));
        assert_eq!(
            f.drops,
            vec![("NO_SOCKET".into(), Some(2.0)), ("NEW".into(), Some(1.0))]
        );
        // A restarted daemon (tick and counters back to small numbers): no rates, no panic.
        let f = build(&a, Some(&b));
        assert_eq!(f.peers[0].tx_bytes_per_s, None);
        assert!(!f.daemon_rates);
    }

    /// A new daemon: its observations, features and forecasts win over local deltas.
    #[test]
    fn daemon_rows_win() {
        let s = snap(json!({"tick": 2, "time_unix": 5.0,
            "peers": [{"peer": "a", "srtt_seconds": 0.001}],
            "observations": [{"entity_kind": "peer", "entity": "a", "interval_s": 0.5,
                "tx_bytes_per_s": 7.0, "bursts": 2, "burst_bytes": 3000, "rtt_p99_s": 0.004}],
            "features": [{"entity_kind": "peer", "entity": "a",
                "values": {"iteration_period_s": 0.3, "rtt_straggler_ratio": 3.5}}],
            "forecasts": [
                {"entity_kind": "peer", "entity": "a", "target": "rtt", "horizon_s": 10,
                 "spike_probability": 0.2, "threshold": 0.1},
                {"entity_kind": "peer", "entity": "a", "target": "rtt", "horizon_s": 1,
                 "spike_probability": 0.9, "rtt_forecast_s": 0.008},
                {"entity_kind": "peer", "entity": "a", "target": "retransmits", "horizon_s": 1,
                 "spike_probability": 0.3},
                {"entity_kind": "iface", "entity": "a", "target": "queue", "horizon_s": 1,
                 "spike_probability": 1.0}]}));
        let f = build(&s, None);
        let p = &f.peers[0];
        assert_eq!(p.tx_bytes_per_s, Some(7.0));
        assert_eq!(p.bursts_per_s, Some(4.0));
        assert_eq!(p.burst_bytes, Some(1500.0));
        assert_eq!(p.rtt_p99, Some(0.004));
        assert_eq!(p.iteration_period, Some(0.3));
        assert_eq!(p.spike, vec![(1.0, 0.9, false), (10.0, 0.2, true)]);
        assert_eq!(p.rtt_forecast, Some(0.008));
        assert!(p.is_straggler());
        assert!(p.risk() > 2.8);
        assert!(f.daemon_rates);
    }

    #[test]
    fn stragglers_against_the_median() {
        let row = |n: &str, s: f64, busy: bool| PeerRow {
            peer: n.into(),
            srtt: Some(s),
            rtt_p99: busy.then_some(s),
            ..Default::default()
        };
        let mut p = vec![
            row("a", 0.001, true),
            row("b", 0.0011, true),
            row("c", 0.005, true),
            row("receive-only", 0.04, false),
        ];
        mark_stragglers(&mut p);
        let flagged: Vec<bool> = p.iter().map(PeerRow::is_straggler).collect();
        assert_eq!(flagged, [false, false, true, false]);
        assert_eq!(p[3].straggler_ratio, None);
    }
}

//! From two consecutive snapshots to one tick of observations. The daemon's counters and
//! histograms are cumulative; an observation holds what happened between the two
//! snapshots: rates (increase over the interval), counts, and quantiles of the histogram
//! increase. Gauges (srtt, backlog, connections) are the later snapshot's values.
//!
//! A counter's increase is known only for a series present in both snapshots whose value did
//! not go down (a new series, or a daemon restart, gives null for that tick rather than a
//! spike).
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::observation::{self as c, Observation as Row};
use crate::{
    collect::{
        rdma::keys,
        readings::{QdiscSeries, Readings},
    },
    counter::Change,
};

/// A sum of counter increases; None until one is known.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Sum(Option<u64>);

impl Sum {
    /// Adds a counter's gain since `before`; nothing at a first reading or a restart.
    fn add(&mut self, now: u64, before: Option<u64>) {
        if let Some(d) = Change::of(now, before).gain() {
            self.0 = Some(self.0.unwrap_or(0) + d);
        }
    }

    fn rate(self, dt: f64) -> Option<f64> {
        self.0.map(|v| v as f64 / dt)
    }

    fn count(self) -> Option<i64> {
        self.0.map(|v| i64::try_from(v).unwrap_or(i64::MAX))
    }
}

#[derive(Default)]
struct PeerAcc {
    tx_bytes: Sum,
    rx_bytes: Sum,
    tx_packets: Sum,
    rx_packets: Sum,
    ce_packets: Sum,
    bursts: Sum,
    burst_bytes: Option<f64>,
    burst_seconds: Option<f64>,
}

fn add_opt(acc: &mut Option<f64>, v: f64) {
    *acc = Some(acc.unwrap_or(0.0) + v);
}

/// The rows of the tick `now`, given the snapshot before it. `now.time_unix` must be later.
pub fn derive(prev: &Readings, now: &Readings) -> Vec<Row> {
    let tick = Tick {
        prev,
        now,
        dt: now.time_unix - prev.time_unix,
    };
    let mut rows = Vec::new();
    tick.peers(&mut rows);
    tick.interfaces(&mut rows);
    tick.qdiscs(&mut rows);
    tick.rdma_ports(&mut rows);
    tick.drops_and_host(&mut rows);
    rows
}

/// Two consecutive readings and the interval between them.
struct Tick<'a> {
    prev: &'a Readings,
    now: &'a Readings,
    dt: f64,
}

impl<'a> Tick<'a> {
    /// An empty row of this tick.
    fn row(&self, kind: &'static str, entity: &str) -> Row {
        Row {
            time_unix: self.now.time_unix,
            interval_s: self.dt,
            entity_kind: kind.into(),
            entity: entity.to_string(),
            ..Row::default()
        }
    }

    /// A counter's rate over the interval; None at a first reading or a restart.
    fn rate(&self, now: u64, before: Option<u64>) -> Option<f64> {
        let mut s = Sum::default();
        s.add(now, before);
        s.rate(self.dt)
    }

    /// Per peer, its flows and bursts (per interface and direction, summed); every peer of
    /// the TCP view too.
    fn peer_traffic(&self) -> BTreeMap<&'a str, PeerAcc> {
        let (prev, now) = (self.prev, self.now);
        let mut peers: BTreeMap<&str, PeerAcc> = BTreeMap::new();
        let prev_flows: HashMap<(&str, &str, &str), _> = prev
            .flows
            .iter()
            .map(|f| ((f.iface.as_str(), f.direction, f.peer.as_str()), f))
            .collect();
        for f in &now.flows {
            let b = prev_flows.get(&(f.iface.as_str(), f.direction, f.peer.as_str()));
            let a = peers.entry(&f.peer).or_default();
            let (bytes, packets) = if f.direction == "egress" {
                (&mut a.tx_bytes, &mut a.tx_packets)
            } else {
                (&mut a.rx_bytes, &mut a.rx_packets)
            };
            bytes.add(f.bytes, b.map(|b| b.bytes));
            packets.add(f.packets, b.map(|b| b.packets));
            a.ce_packets.add(f.ce_packets, b.map(|b| b.ce_packets));
        }
        let prev_bursts: HashMap<(&str, &str, &str), _> = prev
            .bursts
            .iter()
            .map(|x| ((x.iface.as_str(), x.direction, x.peer.as_str()), x))
            .collect();
        for x in &now.bursts {
            let b = prev_bursts.get(&(x.iface.as_str(), x.direction, x.peer.as_str()));
            let a = peers.entry(&x.peer).or_default();
            a.bursts.add(x.count, b.map(|b| b.count));
            if let Some(h) = x.bytes.increase(b.map(|b| &b.bytes)) {
                add_opt(&mut a.burst_bytes, h.sum);
            }
            if let Some(h) = x.duration.increase(b.map(|b| &b.duration)) {
                add_opt(&mut a.burst_seconds, h.sum);
            }
        }
        for p in &now.peers {
            peers.entry(&p.peer).or_default();
        }
        peers
    }

    /// Peers: traffic, bursts and the TCP view.
    fn peers(&self, rows: &mut Vec<Row>) {
        let dt = self.dt;
        let prev_tcp: HashMap<&str, _> = self
            .prev
            .peers
            .iter()
            .map(|p| (p.peer.as_str(), p))
            .collect();
        let now_tcp: HashMap<&str, _> = self
            .now
            .peers
            .iter()
            .map(|p| (p.peer.as_str(), p))
            .collect();
        for (name, a) in &self.peer_traffic() {
            let mut r = self.row(c::PEER, name);
            r.tx_bytes_per_s = a.tx_bytes.rate(dt);
            r.rx_bytes_per_s = a.rx_bytes.rate(dt);
            r.tx_packets_per_s = a.tx_packets.rate(dt);
            r.rx_packets_per_s = a.rx_packets.rate(dt);
            r.ce_packets_per_s = a.ce_packets.rate(dt);
            r.bursts = a.bursts.count();
            r.burst_bytes = a.burst_bytes.map(|b| b.round() as i64);
            r.burst_seconds = a.burst_seconds;
            if let Some(p) = now_tcp.get(name) {
                let b = prev_tcp.get(name);
                r.srtt_s = p.srtt_seconds;
                r.min_rtt_s = p.min_rtt_seconds;
                r.connections = Some(p.connections.into());
                r.receive_queue_bytes = p.receive_queue_bytes.map(|b| b as i64);
                r.send_queue_bytes = p.send_queue_bytes.map(|b| b as i64);
                if let Some(h) = p.rtt.increase(b.map(|b| &b.rtt)) {
                    r.rtt_samples = Some(h.count as i64);
                    r.rtt_mean_s = (h.count > 0).then(|| h.sum / h.count as f64);
                    r.rtt_p50_s = h.quantile(0.5);
                    r.rtt_p90_s = h.quantile(0.9);
                    r.rtt_p99_s = h.quantile(0.99);
                }
                r.retransmits_per_s = self.rate(p.retransmits, b.map(|b| b.retransmits));
                r.socket_tx_bytes_per_s =
                    self.rate(p.socket_sent_bytes, b.map(|b| b.socket_sent_bytes));
                r.socket_rx_bytes_per_s =
                    self.rate(p.socket_received_bytes, b.map(|b| b.socket_received_bytes));
            }
            rows.push(r);
        }
    }

    /// Interfaces: link counters and qdisc sojourn time.
    fn interfaces(&self, rows: &mut Vec<Row>) {
        let (prev, now) = (self.prev, self.now);
        let mut ifaces: BTreeSet<&str> = now.interfaces.iter().map(String::as_str).collect();
        ifaces.extend(now.links.iter().map(|l| l.iface.as_str()));
        ifaces.extend(now.sojourn.iter().map(|s| s.iface.as_str()));
        for iface in ifaces {
            let mut r = self.row(c::INTERFACE, iface);
            if let Some(l) = now.links.iter().find(|l| l.iface == iface) {
                let b = prev.links.iter().find(|l| l.iface == iface);
                r.tx_bytes_per_s = self.rate(l.stats.tx_bytes, b.map(|b| b.stats.tx_bytes));
                r.rx_bytes_per_s = self.rate(l.stats.rx_bytes, b.map(|b| b.stats.rx_bytes));
                r.tx_packets_per_s = self.rate(l.stats.tx_packets, b.map(|b| b.stats.tx_packets));
                r.rx_packets_per_s = self.rate(l.stats.rx_packets, b.map(|b| b.stats.rx_packets));
                r.tx_errors_per_s = self.rate(l.stats.tx_errors, b.map(|b| b.stats.tx_errors));
                r.rx_errors_per_s = self.rate(l.stats.rx_errors, b.map(|b| b.stats.rx_errors));
                r.tx_dropped_per_s = self.rate(l.stats.tx_dropped, b.map(|b| b.stats.tx_dropped));
                r.rx_dropped_per_s = self.rate(l.stats.rx_dropped, b.map(|b| b.stats.rx_dropped));
            }
            if let Some(s) = now.sojourn.iter().find(|s| s.iface == iface) {
                let b = prev.sojourn.iter().find(|s| s.iface == iface);
                if let Some(h) = s.seconds.increase(b.map(|b| &b.seconds)) {
                    r.sojourn_samples = Some(h.count as i64);
                    r.sojourn_p50_s = h.quantile(0.5);
                    r.sojourn_p99_s = h.quantile(0.99);
                }
            }
            rows.push(r);
        }
    }

    /// Qdiscs: queue depth and counters of each qdisc on a monitored interface.
    fn qdiscs(&self, rows: &mut Vec<Row>) {
        let (prev, now) = (self.prev, self.now);
        let qname = |q: &QdiscSeries| format!("{}/{}/{}", q.iface, q.stats.kind, q.stats.handle);
        let prev_q: HashMap<String, _> = prev.qdiscs.iter().map(|q| (qname(q), q)).collect();
        let mut qdiscs: BTreeMap<String, _> = BTreeMap::new();
        for q in &now.qdiscs {
            qdiscs.insert(qname(q), q);
        }
        for (name, q) in qdiscs {
            let b = prev_q.get(&name);
            let mut r = self.row(c::QDISC, &name);
            r.tx_bytes_per_s = self.rate(q.stats.sent_bytes, b.map(|b| b.stats.sent_bytes));
            r.tx_packets_per_s = self.rate(q.stats.sent_packets, b.map(|b| b.stats.sent_packets));
            r.qdisc_backlog_packets = i64::try_from(q.stats.backlog_packets).ok();
            r.qdisc_backlog_bytes = i64::try_from(q.stats.backlog_bytes).ok();
            r.qdisc_drops_per_s = self.rate(q.stats.drops, b.map(|b| b.stats.drops));
            r.qdisc_overlimits_per_s = self.rate(q.stats.overlimits, b.map(|b| b.stats.overlimits));
            r.qdisc_requeues_per_s = self.rate(q.stats.requeues, b.map(|b| b.stats.requeues));
            rows.push(r);
        }
    }

    /// RDMA ports: the poller's own per-second rates over its last interval.
    fn rdma_ports(&self, rows: &mut Vec<Row>) {
        if let Some(rdma) = &self.now.rdma {
            let mut ports: Vec<_> = rdma.ports.iter().collect();
            ports.sort_by(|a, b| (&a.device, a.port).cmp(&(&b.device, b.port)));
            for p in ports {
                let mut r = self.row(c::RDMA_PORT, &format!("{}/{}", p.device, p.port));
                let get = |k: &str| p.rates.get(k).copied();
                r.tx_bytes_per_s = get(keys::TRANSMIT_BYTES);
                r.rx_bytes_per_s = get(keys::RECEIVE_BYTES);
                r.tx_packets_per_s = get(keys::TRANSMIT_PACKETS);
                r.rx_packets_per_s = get(keys::RECEIVE_PACKETS);
                r.rdma_transmit_wait_ticks_per_s = get(keys::TRANSMIT_WAIT_TICKS);
                r.rdma_transmit_discards_per_s = get(keys::TRANSMIT_DISCARDS);
                r.rdma_cnp_sent_per_s = get(keys::CNP_SENT);
                r.rdma_cnp_handled_per_s = get(keys::CNP_HANDLED);
                r.rdma_ecn_marked_packets_per_s = get(keys::ECN_MARKED_PACKETS);
                r.rdma_out_of_sequence_packets_per_s = get(keys::OUT_OF_SEQUENCE_PACKETS);
                r.rdma_packet_sequence_errors_per_s = get(keys::PACKET_SEQUENCE_ERRORS);
                r.rdma_local_ack_timeout_errors_per_s = get(keys::LOCAL_ACK_TIMEOUT_ERRORS);
                r.rdma_rnr_nak_retry_errors_per_s = get(keys::RNR_NAK_RETRY_ERRORS);
                r.rdma_link_downed_per_s = get(keys::LINK_DOWNED);
                rows.push(r);
            }
        }
    }

    /// Drops by reason, and the host's totals.
    fn drops_and_host(&self, rows: &mut Vec<Row>) {
        let (prev, now, dt) = (self.prev, self.now, self.dt);
        let prev_drops: HashMap<&str, u64> = prev
            .drops
            .iter()
            .map(|d| (d.reason.as_str(), d.packets))
            .collect();
        let mut total = Sum::default();
        let mut reasons: Vec<_> = now.drops.iter().collect();
        reasons.sort_by(|a, b| a.reason.cmp(&b.reason));
        for d in reasons {
            let before = prev_drops.get(d.reason.as_str()).copied();
            let mut s = Sum::default();
            s.add(d.packets, before);
            total.add(d.packets, before);
            let mut r = self.row(c::DROP_REASON, &d.reason);
            r.drops_per_s = s.rate(dt);
            rows.push(r);
        }
        let mut r = self.row(c::HOST, "host");
        host_totals(&mut r, rows);
        r.drops_per_s = total.rate(dt);
        r.flows_tracked = i64::try_from(now.flows_tracked).ok();
        let mut ev = Sum::default();
        ev.add(now.flow_evictions, Some(prev.flow_evictions));
        r.flow_evictions_per_s = ev.rate(dt);
        r.peers_folded = i64::try_from(now.peers_folded).ok();
        rows.push(r);
    }
}

/// The host row's throughput (sum over interface rows) and backlog (sum over qdisc rows);
/// null when no row of that kind knows it.
fn host_totals(host: &mut Row, rows: &[Row]) {
    let add = |acc: &mut Option<f64>, v: Option<f64>| {
        if let Some(v) = v {
            add_opt(acc, v);
        }
    };
    let mut backlog: Option<i64> = None;
    for r in rows {
        match r.entity_kind.as_str() {
            c::INTERFACE => {
                add(&mut host.tx_bytes_per_s, r.tx_bytes_per_s);
                add(&mut host.rx_bytes_per_s, r.rx_bytes_per_s);
            }
            c::QDISC => {
                if let Some(b) = r.qdisc_backlog_bytes {
                    backlog = Some(backlog.unwrap_or(0).saturating_add(b));
                }
            }
            _ => {}
        }
    }
    host.qdisc_backlog_bytes = backlog;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        collect::netlink::{LinkStats, QdiscStats},
        snapshot::{
            BurstSeries as Burst, DropSeries, FlowSeries as Flow, Histogram, LinkSeries,
            PeerSeries as Peer, SojournSeries as Sojourn,
        },
    };

    fn hist(counts: &[u64], sum: f64) -> Histogram {
        // log2 buckets of microseconds, cumulative.
        let mut cum = 0;
        let buckets = counts
            .iter()
            .enumerate()
            .map(|(i, n)| {
                cum += n;
                ((1u64 << (i + 1)) as f64 * 1e-6, cum)
            })
            .collect();
        Histogram {
            buckets,
            sum,
            count: cum,
        }
    }

    fn flow(dir: &'static str, peer: &str, bytes: u64) -> Flow {
        Flow {
            iface: "eth0".into(),
            direction: dir,
            peer: peer.into(),
            bytes,
            packets: bytes / 1000,
            ..Flow::default()
        }
    }

    fn peer(name: &str, srtt: f64, rtt: Histogram, retrans: u64) -> Peer {
        Peer {
            peer: name.into(),
            srtt_seconds: Some(srtt),
            min_rtt_seconds: Some(srtt / 2.0),
            connections: 1,
            rtt,
            retransmits: retrans,
            receive_queue_bytes: None,
            send_queue_bytes: None,
            socket_sent_bytes: 0,
            socket_received_bytes: 0,
        }
    }

    fn find<'a>(rows: &'a [Row], kind: &str, entity: &str) -> &'a Row {
        rows.iter()
            .find(|r| r.entity_kind == kind && r.entity == entity)
            .unwrap_or_else(|| panic!("no {kind} {entity} in {rows:#?}"))
    }

    #[test]
    fn quantiles_interpolate_inside_log2_buckets() {
        // 10 samples in [4, 8) us.
        let h = hist(&[0, 0, 10], 0.0);
        assert!((h.quantile(0.5).unwrap() - 6e-6).abs() < 1e-12);
        assert!((h.quantile(1.0).unwrap() - 8e-6).abs() < 1e-12);
        // First bucket: [1, 2) us.
        let h = hist(&[4], 0.0);
        assert!((h.quantile(0.5).unwrap() - 1.5e-6).abs() < 1e-12);
        // 90 fast, 10 slow: p50 fast, p99 slow.
        let h = hist(&[0, 90, 0, 0, 0, 0, 0, 0, 0, 0, 10], 0.0);
        assert!(h.quantile(0.5).unwrap() < 4e-6);
        assert!(h.quantile(0.99).unwrap() > 1e-3);
        assert_eq!(hist(&[0, 0], 0.0).quantile(0.5), None);
    }

    #[test]
    fn rates_counts_and_gauges_of_one_tick() {
        let prev = Readings {
            time_unix: 100.0,
            flows: vec![
                flow("egress", "10.0.0.2", 1_000_000),
                flow("ingress", "10.0.0.2", 500_000),
            ],
            peers: vec![peer(
                "10.0.0.2",
                0.003,
                hist(&[0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 60e-6),
                5,
            )],
            bursts: vec![Burst {
                iface: "eth0".into(),
                direction: "egress",
                peer: "10.0.0.2".into(),
                count: 3,
                bytes: hist(&[0, 0, 3], 20.0),
                duration: hist(&[0, 3], 9e-6),
            }],
            links: vec![LinkSeries {
                iface: "eth0".into(),
                stats: LinkStats {
                    tx_bytes: 10,
                    ..LinkStats::default()
                },
            }],
            qdiscs: vec![QdiscSeries {
                iface: "eth0".into(),
                stats: QdiscStats {
                    kind: "tbf".into(),
                    handle: "8001:".into(),
                    drops: 1,
                    sent_bytes: 100,
                    ..QdiscStats::default()
                },
            }],
            sojourn: vec![Sojourn {
                iface: "eth0".into(),
                seconds: hist(&[5, 0], 1e-5),
            }],
            drops: vec![DropSeries {
                reason: "NO_SOCKET".into(),
                packets: 7,
            }],
            ..Readings::default()
        };
        let mut now = prev.clone();
        now.time_unix = 102.0;
        now.flows[0].bytes += 4_000_000; // 2 MB/s out
        now.flows[0].packets += 4_000;
        now.flows.push(flow("egress", "10.0.0.9", 123)); // new: unknown rate
        now.peers[0] = peer(
            "10.0.0.2",
            0.012,
            hist(&[0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 20], 0.3),
            9,
        );
        now.bursts[0].count = 5;
        now.bursts[0].bytes = hist(&[0, 0, 5], 30.0);
        now.links[0].stats.tx_bytes = 30;
        now.qdiscs[0].stats.drops = 5;
        now.qdiscs[0].stats.backlog_bytes = 4096;
        now.qdiscs[0].stats.sent_bytes = 300;
        now.sojourn[0].seconds = hist(&[5, 4], 3e-5);
        now.drops[0].packets = 9;
        now.drops.push(DropSeries {
            reason: "TCP_CSUM".into(),
            packets: 1,
        });
        now.flows_tracked = 3;

        let rows = derive(&prev, &now);
        let p = find(&rows, c::PEER, "10.0.0.2");
        assert_eq!(p.interval_s, 2.0);
        assert_eq!(p.tx_bytes_per_s, Some(2_000_000.0));
        assert_eq!(p.tx_packets_per_s, Some(2_000.0));
        assert_eq!(p.rx_bytes_per_s, Some(0.0));
        assert_eq!(p.srtt_s, Some(0.012));
        assert_eq!(p.min_rtt_s, Some(0.006));
        assert_eq!(p.connections, Some(1));
        assert_eq!(p.rtt_samples, Some(20));
        // 20 new samples in the [8.192, 16.384) ms bucket.
        let p50 = p.rtt_p50_s.unwrap();
        assert!((0.008..0.0164).contains(&p50), "{p50}");
        assert!((p.rtt_mean_s.unwrap() - (0.3 - 60e-6) / 20.0).abs() < 1e-9);
        assert_eq!(p.retransmits_per_s, Some(2.0));
        assert_eq!(p.bursts, Some(2));
        assert_eq!(p.burst_bytes, Some(10));
        assert_eq!(p.burst_seconds, Some(0.0));
        let n = find(&rows, c::PEER, "10.0.0.9");
        assert_eq!(n.tx_bytes_per_s, None);
        assert_eq!(n.srtt_s, None);

        let i = find(&rows, c::INTERFACE, "eth0");
        assert_eq!(i.tx_bytes_per_s, Some(10.0));
        assert_eq!(i.sojourn_samples, Some(4));
        assert!(i.sojourn_p99_s.unwrap() > 2e-6);
        let q = find(&rows, c::QDISC, "eth0/tbf/8001:");
        assert_eq!(q.qdisc_drops_per_s, Some(2.0));
        assert_eq!(q.qdisc_backlog_bytes, Some(4096));
        assert_eq!(q.tx_bytes_per_s, Some(100.0));
        assert_eq!(
            find(&rows, c::DROP_REASON, "NO_SOCKET").drops_per_s,
            Some(1.0)
        );
        assert_eq!(find(&rows, c::DROP_REASON, "TCP_CSUM").drops_per_s, None);
        let h = find(&rows, c::HOST, "host");
        assert_eq!(h.drops_per_s, Some(1.0));
        assert_eq!(h.flows_tracked, Some(3));
        assert_eq!(h.tx_bytes_per_s, Some(10.0));
        assert_eq!(h.qdisc_backlog_bytes, Some(4096));
        // Every row carries the tick's time.
        assert!(rows.iter().all(|r| r.time_unix == 102.0));
    }

    #[test]
    fn a_counter_that_went_down_is_unknown_not_negative() {
        let prev = Readings {
            time_unix: 1.0,
            flows: vec![flow("egress", "a", 5000)],
            ..Readings::default()
        };
        let now = Readings {
            time_unix: 2.0,
            flows: vec![flow("egress", "a", 100)],
            ..Readings::default()
        };
        let rows = derive(&prev, &now);
        assert_eq!(find(&rows, c::PEER, "a").tx_bytes_per_s, None);
    }
}

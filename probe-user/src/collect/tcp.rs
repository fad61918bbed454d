//! Reads the sock_ops connection map and the per-peer TCP map each tick: per-peer smoothed
//! RTT, minimum RTT, RTT histogram and retransmitted segments.
use std::{collections::HashMap as StdHashMap, net::IpAddr};

use aya::maps::{HashMap, MapData};
use probe_ebpf::{ConnKey, ConnStats, PeerKey, PeerTcp, LOG2_BUCKETS, TCP_CLOSE};

use super::batch::MapReader;
use crate::snapshot::{ip_from_abi, peer_label, Histogram, PeerSeries};

#[derive(Debug, Clone, PartialEq, Eq)]
struct PeerTotals {
    rtt_buckets: [u64; LOG2_BUCKETS],
    rtt_count: u64,
    rtt_sum_us: u64,
    retrans_segs: u64,
}

impl Default for PeerTotals {
    fn default() -> Self {
        Self {
            rtt_buckets: [0; LOG2_BUCKETS],
            rtt_count: 0,
            rtt_sum_us: 0,
            retrans_segs: 0,
        }
    }
}

/// True when `now` cannot have grown from `before` (the LRU map dropped and recreated it).
fn recreated(now: &PeerTcp, before: &PeerTcp) -> bool {
    now.rtt_count < before.rtt_count
        || now.retrans_segs < before.retrans_segs
        || now.retrans_events < before.retrans_events
}

impl PeerTotals {
    fn add_delta(&mut self, now: &PeerTcp, before: Option<&PeerTcp>) {
        let zero = PeerTcp::default();
        let b = match before {
            Some(b) if !recreated(now, b) => b,
            _ => &zero,
        };
        for i in 0..LOG2_BUCKETS {
            self.rtt_buckets[i] += now.rtt_buckets[i].saturating_sub(b.rtt_buckets[i]);
        }
        self.rtt_count += now.rtt_count.saturating_sub(b.rtt_count);
        self.rtt_sum_us += now.rtt_sum_us.saturating_sub(b.rtt_sum_us);
        self.retrans_segs += now.retrans_segs.saturating_sub(b.retrans_segs);
    }
}

pub struct TcpCollector {
    conns: HashMap<MapData, ConnKey, ConnStats>,
    reader: MapReader,
    peers: HashMap<MapData, PeerKey, PeerTcp>,
    prev_peers: StdHashMap<PeerKey, PeerTcp>,
    totals: StdHashMap<IpAddr, PeerTotals>,
    prev_samples: StdHashMap<ConnKey, u64>,
}

#[derive(Default)]
struct ConnAgg {
    active_srtt_us: Option<u32>,
    open_srtt_us: Option<u32>,
    min_rtt_us: Option<u32>,
    open: u32,
}

impl TcpCollector {
    pub fn new(
        conns: HashMap<MapData, ConnKey, ConnStats>,
        reader: MapReader,
        peers: HashMap<MapData, PeerKey, PeerTcp>,
    ) -> Self {
        Self {
            conns,
            reader,
            peers,
            prev_peers: StdHashMap::new(),
            totals: StdHashMap::new(),
            prev_samples: StdHashMap::new(),
        }
    }

    pub fn tick(&mut self) -> Vec<PeerSeries> {
        let mut seen = StdHashMap::with_capacity(self.prev_peers.len());
        for item in self.peers.iter() {
            let Ok((k, v)) = item else { continue };
            let Some(peer) = ip_from_abi(k.family, &k.addr) else {
                continue;
            };
            self.totals
                .entry(peer)
                .or_default()
                .add_delta(&v, self.prev_peers.get(&k));
            seen.insert(k, v);
        }
        self.prev_peers = seen;

        let mut aggs: StdHashMap<IpAddr, ConnAgg> = StdHashMap::new();
        let mut samples = StdHashMap::with_capacity(self.prev_samples.len());
        let mut closed = Vec::new();
        let conns = &self.conns;
        let entries = self
            .reader
            .read(|| conns.iter().filter_map(Result::ok).collect());
        for (k, c) in entries {
            if c.state == TCP_CLOSE {
                closed.push(k);
                continue;
            }
            let Some(peer) = ip_from_abi(k.family, &k.raddr) else {
                continue;
            };
            let active =
                self.prev_samples.get(&k).is_none_or(|n| c.rtt_samples > *n) && c.rtt_samples > 0;
            samples.insert(k, c.rtt_samples);
            let a = aggs.entry(peer).or_default();
            a.open += 1;
            if c.srtt_us > 0 {
                a.open_srtt_us = a.open_srtt_us.max(Some(c.srtt_us));
                if active {
                    a.active_srtt_us = a.active_srtt_us.max(Some(c.srtt_us));
                }
            }
            if c.min_rtt_us > 0 && c.min_rtt_us != u32::MAX {
                a.min_rtt_us = Some(a.min_rtt_us.map_or(c.min_rtt_us, |m| m.min(c.min_rtt_us)));
            }
        }
        // Closed connections were read one last time above; free their slots.
        for k in closed {
            let _ = self.conns.remove(&k);
        }
        self.prev_samples = samples;

        let mut out: Vec<PeerSeries> = self
            .totals
            .iter()
            .map(|(peer, t)| {
                let a = aggs.remove(peer).unwrap_or_default();
                PeerSeries {
                    peer: peer_label(*peer),
                    srtt_seconds: a
                        .active_srtt_us
                        .or(a.open_srtt_us)
                        .map(|us| us as f64 * 1e-6),
                    min_rtt_seconds: a.min_rtt_us.map(|us| us as f64 * 1e-6),
                    connections: a.open,
                    rtt: Histogram::from_log2(&t.rtt_buckets, t.rtt_sum_us, 1e-6),
                    retransmits: t.retrans_segs,
                }
            })
            .collect();
        // Peers with open connections but no RTT sample or retransmit yet.
        for (peer, a) in aggs {
            out.push(PeerSeries {
                peer: peer_label(peer),
                srtt_seconds: a
                    .active_srtt_us
                    .or(a.open_srtt_us)
                    .map(|us| us as f64 * 1e-6),
                min_rtt_seconds: a.min_rtt_us.map(|us| us as f64 * 1e-6),
                connections: a.open,
                rtt: Histogram::from_log2(&[0; LOG2_BUCKETS], 0, 1e-6),
                retransmits: 0,
            });
        }
        out.sort_by(|a, b| a.peer.cmp(&b.peer));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_deltas_survive_recreation() {
        let mut t = PeerTotals::default();
        let mut a = PeerTcp::default();
        a.rtt_count = 10;
        a.rtt_buckets[3] = 10;
        a.retrans_segs = 4;
        t.add_delta(&a, None);
        let mut b = a;
        b.rtt_count = 15;
        b.rtt_buckets[3] = 15;
        b.retrans_segs = 6;
        t.add_delta(&b, Some(&a));
        assert_eq!((t.rtt_count, t.retrans_segs, t.rtt_buckets[3]), (15, 6, 15));
        // Recreated entry: counts restart from zero.
        let mut c = PeerTcp::default();
        c.rtt_count = 2;
        c.rtt_buckets[3] = 2;
        c.retrans_segs = 1;
        t.add_delta(&c, Some(&b));
        assert_eq!((t.rtt_count, t.retrans_segs, t.rtt_buckets[3]), (17, 7, 17));
    }
}

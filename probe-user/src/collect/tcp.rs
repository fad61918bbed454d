//! Reads the sock_ops connection map and the per-peer TCP map each tick: per-peer smoothed
//! RTT, minimum RTT, RTT histogram and retransmitted segments.
use std::net::IpAddr;

use aya::maps::{HashMap, MapData};
use probe_ebpf::{ConnKey, ConnStats, PeerKey, PeerTcp, LOG2_BUCKETS, TCP_CLOSE};
use rustc_hash::{FxHashMap, FxHashSet};

use super::{batch::MapReader, delta::DeltaTotals, top::TopN};
use crate::snapshot::{ip_from_abi, peer_label, ConnDetail, Histogram, PeerSeries};

/// Connections reported in the snapshot's slow_connections.
const TOP_CONNECTIONS: usize = 32;

/// PeerTcp as a flat counter vector for DeltaTotals: buckets, count, sum, segs, events.
fn flatten(p: &PeerTcp) -> Vec<u64> {
    let mut v = p.rtt_buckets.to_vec();
    v.extend([p.rtt_count, p.rtt_sum_us, p.retrans_segs, p.retrans_events]);
    v
}

const COUNT: usize = LOG2_BUCKETS;
const SUM_US: usize = LOG2_BUCKETS + 1;
const RETRANS_SEGS: usize = LOG2_BUCKETS + 2;

pub struct TcpCollector {
    conns: HashMap<MapData, ConnKey, ConnStats>,
    reader: MapReader<ConnKey, ConnStats>,
    peers: HashMap<MapData, PeerKey, PeerTcp>,
    peer_reader: MapReader<PeerKey, PeerTcp>,
    totals: DeltaTotals<PeerKey, IpAddr>,
    /// Each open connection's RTT sample count at its last reading, and the tick of that
    /// reading: one table updated in place (one lookup per connection per tick).
    samples: FxHashMap<ConnKey, (u64, u64)>,
    tick: u64,
    /// Open connections the full LRU map evicted, cumulative.
    evictions: u64,
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
        reader: MapReader<ConnKey, ConnStats>,
        peers: HashMap<MapData, PeerKey, PeerTcp>,
        peer_reader: MapReader<PeerKey, PeerTcp>,
    ) -> Self {
        Self {
            conns,
            reader,
            peers,
            peer_reader,
            totals: DeltaTotals::default(),
            samples: FxHashMap::default(),
            tick: 0,
            evictions: 0,
        }
    }

    /// Open connections the full map evicted since start (seen as an open connection that
    /// vanished from the map without closing).
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Per-peer series, and the open connections with the largest srtt.
    pub fn tick(&mut self) -> (Vec<PeerSeries>, Vec<ConnDetail>) {
        let mut slow = TopN::new(TOP_CONNECTIONS);
        let peers = &self.peers;
        let peer_entries = self
            .peer_reader
            .read(|| peers.iter().filter_map(Result::ok).collect());
        for (k, v) in peer_entries.iter() {
            if let Some(peer) = ip_from_abi(k.family, &k.addr) {
                self.totals.add(*k, peer, flatten(v));
            }
        }
        self.totals.finish();

        let mut aggs: FxHashMap<IpAddr, ConnAgg> = FxHashMap::default();
        self.tick += 1;
        let tick = self.tick;
        let mut closed = Vec::new();
        let conns = &self.conns;
        let entries = self
            .reader
            .read(|| conns.iter().filter_map(Result::ok).collect());
        for (k, c) in entries.iter() {
            if c.state == TCP_CLOSE {
                closed.push(*k);
                continue;
            }
            let Some(peer) = ip_from_abi(k.family, &k.raddr) else {
                continue;
            };
            let slot = self.samples.entry(*k).or_insert((0, 0));
            let active = (slot.1 == 0 || c.rtt_samples > slot.0) && c.rtt_samples > 0;
            *slot = (c.rtt_samples, tick);
            if c.srtt_us > 0 {
                slow.push(c.srtt_us.into(), (*k, *c));
            }
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
        // An open connection read last tick and gone now without having been read closed
        // was evicted by the full LRU map (its next RTT callback inserts it again, evicting
        // another). Evictions between two reads of a connection are not seen: a lower bound.
        let closed_now: FxHashSet<&ConnKey> = closed.iter().collect();
        let mut evicted = 0;
        self.samples.retain(|k, (_, seen)| {
            if *seen == tick {
                return true;
            }
            if !closed_now.contains(k) {
                evicted += 1;
            }
            false
        });
        self.evictions += evicted;
        // Closed connections were read one last time above; free their slots.
        for k in closed {
            let _ = self.conns.remove(&k);
        }

        let mut out: Vec<PeerSeries> = self
            .totals
            .totals()
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
                    rtt: Histogram::from_log2(&t[..COUNT], t[SUM_US], 1e-6),
                    retransmits: t[RETRANS_SEGS],
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
        let slow = slow
            .into_sorted()
            .into_iter()
            .filter_map(|(_, (k, c))| {
                Some(ConnDetail {
                    local: peer_label(ip_from_abi(k.family, &k.laddr)?),
                    peer: peer_label(ip_from_abi(k.family, &k.raddr)?),
                    local_port: k.lport,
                    peer_port: k.rport,
                    srtt_seconds: c.srtt_us as f64 * 1e-6,
                    min_rtt_seconds: c.min_rtt_us as f64 * 1e-6,
                    snd_cwnd: c.snd_cwnd,
                    packets_in_flight: c.packets_out,
                    retrans_in_flight: c.retrans_out,
                    total_retrans: c.total_retrans,
                    bytes_acked: c.bytes_acked,
                    bytes_received: c.bytes_received,
                    state: c.state,
                })
            })
            .collect();
        (out, slow)
    }
}

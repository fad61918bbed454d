//! Walks sock_ops' connection map at the ticks the flow collector walks the flow map
//! (every `flow_scan`), for what only it holds: the slowest open connections, evictions of
//! the full map, and closed entries to delete. Per-peer figures do not come from here:
//! sock_ops keeps them per peer (PEER_TCP, read each tick by tcp.rs), so a tick does not
//! read every connection.
use aya::maps::{HashMap, MapData};
use probe_ebpf::{ConnKey, ConnStats, TCP_CLOSE};
use rustc_hash::FxHashSet;

use super::{batch::MapReader, top::TopN};
use crate::snapshot::{ip_from_abi, peer_label, ConnDetail};

/// Connections reported in the snapshot's slow_connections.
const TOP_CONNECTIONS: usize = 32;

pub struct ConnWalk {
    conns: HashMap<MapData, ConnKey, ConnStats>,
    reader: MapReader<ConnKey, ConnStats>,
    /// The open connections of the last walk, by `conn_id` (8 bytes each instead of a
    /// 40-byte key: 20,000 sockets are ~0.3 MiB, not ~1.3), and the set the next walk fills
    /// (kept to reuse its table).
    open: FxHashSet<u64>,
    next: FxHashSet<u64>,
    /// The last walk's slowest connections, reported until the next.
    slow: Vec<ConnDetail>,
    /// Open connections the full LRU map evicted, cumulative.
    evictions: u64,
}

impl ConnWalk {
    pub fn new(
        conns: HashMap<MapData, ConnKey, ConnStats>,
        reader: MapReader<ConnKey, ConnStats>,
    ) -> Self {
        Self {
            conns,
            reader,
            open: FxHashSet::default(),
            next: FxHashSet::default(),
            slow: Vec::new(),
            evictions: 0,
        }
    }

    /// Open connections the full map evicted since start (seen as an open connection that
    /// vanished from the map between two walks without closing).
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// The open connections with the largest srtt, as of the last walk: this tick's if
    /// `walk` (the flow map was walked this tick, so `flow_scan_age_ticks` describes both).
    pub fn tick(&mut self, walk: bool) -> &[ConnDetail] {
        if walk {
            self.scan();
        }
        &self.slow
    }

    fn scan(&mut self) {
        let mut slow = TopN::new(TOP_CONNECTIONS);
        let mut closed = Vec::new();
        let open = &mut self.next;
        open.clear();
        let conns = &self.conns;
        self.reader.for_each(
            || conns.iter().filter_map(Result::ok).collect(),
            |k, c| {
                if c.state == TCP_CLOSE {
                    closed.push(*k);
                    return;
                }
                open.insert(conn_id(k));
                if c.srtt_us > 0 {
                    slow.push(c.srtt_us.into(), (*k, *c));
                }
            },
        );
        // An open connection of the last walk gone now without having been read closed was
        // evicted by the full LRU map (its next RTT callback inserts it again, evicting
        // another). Evictions between two reads of a connection are not seen: a lower bound.
        let closed_now: FxHashSet<u64> = closed.iter().map(conn_id).collect();
        self.evictions += self
            .open
            .iter()
            .filter(|k| !self.next.contains(*k) && !closed_now.contains(*k))
            .count() as u64;
        std::mem::swap(&mut self.open, &mut self.next);
        // Closed connections were read one last time above; free their slots.
        for k in closed {
            let _ = self.conns.remove(&k);
        }
        self.slow = slow
            .into_sorted()
            .into_iter()
            .filter_map(|(_, (k, c))| detail(&k, &c))
            .collect();
    }
}

/// A connection's identity between walks: a 64-bit SipHash of its key (two of 20,000
/// sockets collide with odds of about 1e-11; a collision only hides one eviction from a
/// count that is a lower bound anyway).
fn conn_id(k: &ConnKey) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(k)
}

fn detail(k: &ConnKey, c: &ConnStats) -> Option<ConnDetail> {
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
}

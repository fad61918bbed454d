//! Walks sock_ops' connection map at the ticks the flow collector walks the flow map
//! (every `flow_scan`), for what only it holds: the slowest open connections, evictions of
//! the full map, and closed entries to delete. Per-peer figures do not come from here:
//! sock_ops keeps them per peer (PEER_TCP, read each tick by tcp.rs), so a tick does not
//! read every connection.
//!
//! Only the slow tail needs per-connection state, so sock_ops keeps it only there: each
//! walk sets a floor (CONN_FLOOR, 3/4 of the srtt of the walk's connection ranked
//! TOP_CONNECTIONS) and a round trip below it does no per-connection work. So an entry at
//! or above the floor is as of its connection's last round trip. One below it is not: its
//! connection stopped refreshing it on the way down through the floor, and has stayed below
//! since. The walk neither reports nor keeps those; a connection that rises to the floor is
//! back at its next round trip. When fewer than TOP_CONNECTIONS entries are at or above the
//! floor (the slow tail got faster by more than a quarter between two walks, or the host has
//! few connections), the list is short for that walk and the next floor is 0: every
//! connection is tracked until the next walk.
//!
//! Where the kernel has map-element iterators the walk is selected in the kernel
//! (probe-ebpf iter.rs): the iterator writes only the open connections at or above the
//! floor and deletes the stale entries itself; else every entry is copied with batch
//! lookups and the stale ones deleted with a batch delete.
use aya::maps::{Array, HashMap, MapData};
use probe_ebpf::{pick, ConnKey, ConnPick, ConnStats, TCP_CLOSE};
use rustc_hash::FxHashSet;

use super::readings::{ip_from_abi, peer_label, ConnDetail};
use super::{batch::MapReader, mapping::Mapping, top::TopN};
use crate::bpf::select::Walk;

/// The connection-selection walk (bpf::select) and where it writes, read in place.
pub struct ConnSelect {
    walk: Walk,
    /// CONN_PICKS, as large as CONNS: mapped for each walk as far as the records written
    /// go, as a mapping of all of it would keep 6 MiB (at 65,536 connections) resident in
    /// the daemon (the kernel maps a BPF array's pages when it is mapped). A batch lookup
    /// of the records cost 250 ns each.
    picks: MapData,
    summary: Mapping,
}

impl ConnSelect {
    pub fn new(walk: Walk, picks: MapData, summary: &MapData) -> anyhow::Result<Self> {
        Ok(Self {
            walk,
            picks,
            summary: Mapping::new(summary, std::mem::size_of::<probe_ebpf::ConnWalk>(), false)?,
        })
    }
}

/// Connections reported in the snapshot's slow_connections.
const TOP_CONNECTIONS: usize = 32;

pub struct ConnWalk {
    conns: HashMap<MapData, ConnKey, ConnStats>,
    reader: MapReader<ConnKey, ConnStats>,
    floor_map: Array<MapData, u32>,
    /// The floor (srtt, us) sock_ops has been using since the last walk.
    floor: u32,
    /// The open connections the last walk kept (at or above the floor), by `conn_id` (8
    /// bytes each instead of a 40-byte key: 20,000 sockets are ~0.3 MiB, not ~1.3), and the
    /// set the next walk fills (kept to reuse its table).
    open: FxHashSet<u64>,
    next: FxHashSet<u64>,
    /// The last walk's slowest connections, reported until the next.
    slow: Vec<ConnDetail>,
    /// Open connections the full LRU map evicted, cumulative.
    evictions: u64,
    /// The connection-selection walk, when the kernel runs it.
    select: Option<ConnSelect>,
}

impl ConnWalk {
    pub fn new(
        conns: HashMap<MapData, ConnKey, ConnStats>,
        reader: MapReader<ConnKey, ConnStats>,
        floor_map: Array<MapData, u32>,
    ) -> Self {
        Self {
            conns,
            reader,
            floor_map,
            floor: 0,
            open: FxHashSet::default(),
            next: FxHashSet::default(),
            slow: Vec::new(),
            evictions: 0,
            select: None,
        }
    }

    /// Walks through the in-kernel selection from now on (see the module's comment).
    pub fn select_in_kernel(&mut self, select: ConnSelect) {
        self.select = Some(select);
    }

    /// Whether walks select in the kernel (false: batch lookups of every entry).
    pub fn selects_in_kernel(&self) -> bool {
        self.select.is_some()
    }

    /// Open connections the full map evicted since start (seen as an open connection that
    /// vanished from the map between two walks without closing; the walk's own deletions
    /// of entries below the floor are not evictions).
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// The floor the last walk set (srtt, us): sock_ops keeps the connections at or above it.
    pub fn floor_us(&self) -> u32 {
        self.floor
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
        let (last, kept) = (&mut self.open, &mut self.next);
        kept.clear();
        // Seen: not evicted, whatever this walk does with it.
        let mut keep = |k: &ConnKey, c: &ConnStats| {
            kept.insert(conn_id(k));
            if c.srtt_us > 0 {
                slow.push(c.srtt_us.into(), (*k, *c));
            }
        };
        let mut selected = false;
        if let Some(sel) = &mut self.select {
            // The walk deleted the stale entries (closed, or below the floor) after writing
            // their keys (GONE), and wrote the others (SLOW).
            let read = sel.walk.run(&[u64::from(self.floor)]).and_then(|_| {
                // SAFETY: CONN_WALK's value, mapped whole; the run has returned.
                let w: probe_ebpf::ConnWalk =
                    unsafe { std::ptr::read_volatile(sel.summary.ptr.as_ptr().cast()) };
                if w.full != 0 {
                    // Only if CONNS held more entries than its size while the walk ran.
                    tracing::debug!(
                        "CONN_PICKS filled up: some connections wait for the next walk"
                    );
                }
                let written = w.written as usize;
                if written == 0 {
                    return Ok(());
                }
                let map =
                    Mapping::new(&sel.picks, written * std::mem::size_of::<ConnPick>(), false)
                        .map_err(std::io::Error::other)?;
                let recs = map.ptr.as_ptr().cast::<ConnPick>();
                for i in 0..written {
                    // SAFETY: within the mapping, which holds the `written` records the run
                    // wrote.
                    let r: ConnPick = unsafe { std::ptr::read_volatile(recs.add(i)) };
                    last.remove(&conn_id(&r.key));
                    if r.kind & pick::SLOW != 0 {
                        keep(&r.key, &r.stats);
                    }
                }
                Ok(())
            });
            match read {
                Ok(()) => selected = true,
                Err(e) => {
                    tracing::warn!(
                        "the connection-selection walk failed ({e}); walking CONNS with batch lookups from now on"
                    );
                    self.select = None;
                }
            }
        }
        let mut closed = Vec::new();
        if !selected {
            let mut stale = Vec::new();
            let floor = self.floor;
            let conns = &self.conns;
            self.reader.for_each(
                || conns.iter().filter_map(Result::ok).collect(),
                |k, c| {
                    last.remove(&conn_id(k));
                    if c.state == TCP_CLOSE {
                        closed.push(*k);
                        return;
                    }
                    if c.srtt_us < floor {
                        stale.push(*k);
                        return;
                    }
                    keep(k, c);
                },
            );
            closed.append(&mut stale);
        }
        // A connection the last walk kept and this one did not see at all was evicted by the
        // full LRU map (its next round trip at or above the floor inserts it again, evicting
        // another). Evictions between two reads of a connection are not seen: a lower bound.
        self.evictions += last.len() as u64;
        std::mem::swap(&mut self.open, &mut self.next);
        // Closed connections were read one last time above, and entries below the floor are
        // stale: free their slots (thousands a walk at the bench's 10,000 connections, as
        // connections cross the floor).
        let conns = &mut self.conns;
        self.reader.delete(&closed, |k| {
            let _ = conns.remove(k);
        });
        let slow = slow.into_sorted();
        self.set_floor(next_floor(&slow));
        self.slow = slow
            .into_iter()
            .filter_map(|(_, (k, c))| detail(&k, &c))
            .collect();
    }

    fn set_floor(&mut self, floor: u32) {
        if floor == self.floor {
            return;
        }
        match self.floor_map.set(0, floor, 0) {
            Ok(()) => self.floor = floor,
            // sock_ops keeps the old floor: the next walk deletes by the floor it used.
            Err(e) => tracing::warn!("cannot set CONN_FLOOR: {e}"),
        }
    }
}

/// The floor for the next walk: 3/4 of the srtt of the last of the slowest connections, so
/// that the next walk finds a full list unless the slow tail's srtt falls by more than a
/// quarter meanwhile; 0 (every connection) while there are fewer than TOP_CONNECTIONS at or
/// above the floor. The fraction trades the connections tracked against how often a list
/// comes up short. With 10,000 connections of similar RTT (the bench), half the srtt keeps
/// ~8,000 of 20,000 sockets, 3/4 of it ~3,600 and 7/8 ~600; in tests/slow_connections.rs,
/// where srtt is a delayed ACK's ~2 ms and moves by 20% between walks, 7/8 came up short
/// at 6 walks of 27 and 3/4 at 3.
fn next_floor(slow: &[(u64, (ConnKey, ConnStats))]) -> u32 {
    if slow.len() < TOP_CONNECTIONS {
        return 0;
    }
    slow.last()
        .map_or(0, |(_, (_, c))| c.srtt_us - c.srtt_us / 4)
}

/// A connection's identity between walks: a 64-bit FxHash of its key, computed for every
/// entry of every walk (SipHash was 1% of the daemon's CPU). A collision (about 1 in 10^10
/// at 65,536 keys) only hides one eviction from a count that is a lower bound anyway.
fn conn_id(k: &ConnKey) -> u64 {
    use std::hash::BuildHasher;
    rustc_hash::FxBuildHasher.hash_one(k)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections that differ in any one field of their key, padding aside, have different
    /// ids.
    #[test]
    fn conn_ids_tell_keys_apart() {
        let base = probe_ebpf::ConnKey {
            laddr: [1, 2, 3, 4],
            raddr: [5, 6, 7, 8],
            lport: 40_000,
            rport: 5_201,
            family: probe_ebpf::AF_INET6,
            ..Default::default()
        };
        let variants = [
            probe_ebpf::ConnKey {
                laddr: [1, 2, 3, 5],
                ..base
            },
            probe_ebpf::ConnKey {
                raddr: [9, 6, 7, 8],
                ..base
            },
            probe_ebpf::ConnKey {
                lport: 40_001,
                ..base
            },
            probe_ebpf::ConnKey {
                rport: 5_202,
                ..base
            },
            probe_ebpf::ConnKey {
                family: probe_ebpf::AF_INET,
                ..base
            },
        ];
        assert_eq!(
            conn_id(&base),
            conn_id(&{ base }),
            "the same key, the same id"
        );
        let mut ids: Vec<u64> = variants.iter().map(conn_id).collect();
        ids.push(conn_id(&base));
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), variants.len() + 1);
    }

    fn slowest(srtts: &[u32]) -> Vec<(u64, (ConnKey, ConnStats))> {
        srtts
            .iter()
            .map(|&s| {
                let c = ConnStats {
                    srtt_us: s,
                    ..ConnStats::default()
                };
                (s.into(), (ConnKey::default(), c))
            })
            .collect()
    }

    #[test]
    fn the_floor_is_three_quarters_of_the_last_of_a_full_list_else_zero() {
        let full: Vec<u32> = (0..TOP_CONNECTIONS as u32)
            .map(|i| 9_000 - i * 100)
            .collect();
        // The last is 9,000 - 31 * 100 = 5,900 us; 3/4 of it, rounded up, is 4,425.
        assert_eq!(next_floor(&slowest(&full)), 4_425);
        assert_eq!(next_floor(&slowest(&[5; TOP_CONNECTIONS])), 4);
        assert_eq!(next_floor(&slowest(&full[1..])), 0);
        assert_eq!(next_floor(&[]), 0);
    }
}

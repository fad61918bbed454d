//! Reads the kernel's per-flow map each tick and turns it into monotonic per-peer counters.
//!
//! The kernel map holds one entry per flow and direction; entries come and go (LRU eviction
//! when full, and this collector deletes flows idle longer than `idle_timeout`). Counters
//! stay monotonic because only deltas since the previous tick are added to the per-series
//! totals; a recreated entry is recognised by its new `first_seen_ns`.
use std::{net::IpAddr, time::Instant};

use aya::maps::{HashMap, MapData, PerCpuHashMap};
use probe_ebpf::{FlowKey, FlowStats, IfaceKey, IfaceStats, DIR_EGRESS};
use rustc_hash::FxHashMap;

use super::{batch::MapReader, delta::LastSeen, top::TopN};

/// Flows reported in the snapshot's top_flows.
const TOP_FLOWS: usize = 32;
use crate::snapshot::ip_from_abi;

/// One exported series: traffic to/from one peer on one interface in one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SeriesKey {
    pub ifindex: u32,
    pub direction: u8,
    pub peer: IpAddr,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub bytes: u64,
    pub packets: u64,
    pub ce_packets: u64,
    pub ect_packets: u64,
}

/// What the flow collector keeps of a flow's last reading: its counters, and what tells a
/// recreated entry apart (48 bytes instead of the whole FlowStats: 20,000 flows at the
/// bench's 10,000 connections).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Reading {
    bytes: u64,
    packets: u64,
    ce_packets: u64,
    ect_packets: u64,
    first_seen_ns: u64,
    /// The collector's tick this reading is of.
    tick: u64,
}

impl Reading {
    fn of(v: &FlowStats, tick: u64) -> Self {
        Self {
            bytes: v.bytes,
            packets: v.packets,
            ce_packets: v.ce_packets,
            ect_packets: v.ect_packets,
            first_seen_ns: v.first_seen_ns,
            tick,
        }
    }
}

impl Totals {
    fn add_delta(&mut self, now: &FlowStats, before: Option<&Reading>) {
        let d = |n: u64, b: u64| n.saturating_sub(b);
        match before {
            Some(b) => {
                self.bytes += d(now.bytes, b.bytes);
                self.packets += d(now.packets, b.packets);
                self.ce_packets += d(now.ce_packets, b.ce_packets);
                self.ect_packets += d(now.ect_packets, b.ect_packets);
            }
            None => {
                self.bytes += now.bytes;
                self.packets += now.packets;
                self.ce_packets += now.ce_packets;
                self.ect_packets += now.ect_packets;
            }
        }
    }
}

pub struct FlowCollector {
    flows: HashMap<MapData, FlowKey, FlowStats>,
    reader: MapReader<FlowKey, FlowStats>,
    nonip: PerCpuHashMap<MapData, IfaceKey, IfaceStats>,
    /// Last reading of each flow.
    prev: FxHashMap<FlowKey, Reading>,
    totals: FxHashMap<SeriesKey, Totals>,
    /// Series whose flows are all gone are dropped after `delta::SERIES_IDLE`.
    last_seen: LastSeen<SeriesKey>,
    tick: u64,
    evictions: u64,
    idle_timeout_ns: u64,
}

/// What one tick of the flow collector yields.
pub struct FlowTick<'a> {
    pub totals: &'a FxHashMap<SeriesKey, Totals>,
    /// (ifindex, direction) -> (bytes, packets) of non-IP traffic, cumulative.
    pub nonip: Vec<(IfaceKey, IfaceStats)>,
    pub tracked: u64,
    pub evictions: u64,
    /// (bytes this tick, key, state) of the busiest flows.
    pub top: Vec<(u64, FlowKey, FlowStats)>,
    /// The last reading of each flow deleted this tick for idleness (its open burst, if any,
    /// has ended: see burst_events::unfinished).
    pub removed: Vec<(FlowKey, FlowStats)>,
}

pub fn peer_of(k: &FlowKey) -> Option<IpAddr> {
    let addr = if k.direction == DIR_EGRESS {
        &k.dst
    } else {
        &k.src
    };
    ip_from_abi(k.family, addr)
}

impl FlowCollector {
    pub fn new(
        flows: HashMap<MapData, FlowKey, FlowStats>,
        reader: MapReader<FlowKey, FlowStats>,
        nonip: PerCpuHashMap<MapData, IfaceKey, IfaceStats>,
        idle_timeout_ns: u64,
    ) -> Self {
        Self {
            flows,
            reader,
            nonip,
            prev: FxHashMap::default(),
            totals: FxHashMap::default(),
            last_seen: LastSeen::default(),
            tick: 0,
            evictions: 0,
            idle_timeout_ns,
        }
    }

    /// `now_ns` is CLOCK_MONOTONIC, the clock bpf_ktime_get_ns reads.
    pub fn tick(&mut self, now_ns: u64) -> FlowTick<'_> {
        self.tick += 1;
        let tick = self.tick;
        let mut idle = Vec::new();
        let mut top = TopN::new(TOP_FLOWS);
        let flows = &self.flows;
        // An entry evicted mid-walk is simply absent: counted as an eviction below.
        let entries = self
            .reader
            .read(|| flows.iter().filter_map(Result::ok).collect());
        // One lookup per flow in `prev`, updated in place; one in `totals`.
        for (k, v) in entries.iter() {
            let slot = self.prev.entry(*k).or_default();
            let before =
                (slot.tick != 0 && slot.first_seen_ns == v.first_seen_ns).then_some(&*slot);
            if let Some(peer) = peer_of(k) {
                let key = SeriesKey {
                    ifindex: k.ifindex,
                    direction: k.direction,
                    peer,
                };
                self.last_seen.touch(&key);
                self.totals.entry(key).or_default().add_delta(v, before);
            }
            let tick_bytes = v.bytes - before.map_or(0, |b| b.bytes.min(v.bytes));
            if tick_bytes > 0 {
                top.push(tick_bytes, (*k, *v));
            }
            *slot = Reading::of(v, tick);
            if now_ns.saturating_sub(v.last_seen_ns) > self.idle_timeout_ns {
                idle.push((*k, *v));
            }
        }
        // Idle flows were counted to their last byte: delete them from the kernel map.
        let mut removed = Vec::new();
        for (k, v) in idle {
            if self.flows.remove(&k).is_ok() {
                self.prev.remove(&k);
                removed.push((k, v));
            }
        }
        // Flows we had and the map no longer has were evicted by the kernel.
        let before = self.prev.len();
        self.prev.retain(|_, r| r.tick == tick);
        self.evictions += (before - self.prev.len()) as u64;
        for key in self.last_seen.expire(Instant::now()) {
            self.totals.remove(&key);
        }

        let nonip = self
            .nonip
            .iter()
            .filter_map(Result::ok)
            .map(|(k, per_cpu)| {
                let mut sum = IfaceStats::default();
                for v in per_cpu.iter() {
                    sum.bytes += v.bytes;
                    sum.packets += v.packets;
                }
                (k, sum)
            })
            .collect();
        FlowTick {
            totals: &self.totals,
            nonip,
            tracked: self.prev.len() as u64,
            evictions: self.evictions,
            top: top
                .into_sorted()
                .into_iter()
                .map(|(b, (k, v))| (b, k, v))
                .collect(),
            removed,
        }
    }

    /// Forgets an interface that went away: its series stop being exported.
    /// Its flows go from the kernel map too, rather than waiting to be idle.
    pub fn forget_interface(&mut self, ifindex: u32) {
        for k in self.prev.keys().filter(|k| k.ifindex == ifindex) {
            let _ = self.flows.remove(k);
        }
        self.totals.retain(|k, _| k.ifindex != ifindex);
        self.last_seen.forget(|k| k.ifindex != ifindex);
        self.prev.retain(|k, _| k.ifindex != ifindex);
        for direction in [probe_ebpf::DIR_INGRESS, probe_ebpf::DIR_EGRESS] {
            let _ = self.nonip.remove(&IfaceKey {
                ifindex,
                direction,
                ..IfaceKey::default()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(first: u64, bytes: u64) -> FlowStats {
        FlowStats {
            first_seen_ns: first,
            bytes,
            packets: bytes / 100,
            ..FlowStats::default()
        }
    }

    #[test]
    fn deltas_keep_counters_monotonic_across_recreation() {
        let mut t = Totals::default();
        t.add_delta(&stats(1, 1000), None);
        t.add_delta(&stats(1, 1500), Some(&Reading::of(&stats(1, 1000), 1)));
        assert_eq!(t.bytes, 1500);
        // Entry recreated (new first_seen): the caller passes no `before`.
        t.add_delta(&stats(9, 200), None);
        assert_eq!(t.bytes, 1700);
        assert_eq!(t.packets, 17);
    }

    #[test]
    fn peer_is_remote_side() {
        let mut k = FlowKey {
            family: probe_ebpf::AF_INET,
            direction: DIR_EGRESS,
            ..FlowKey::default()
        };
        k.src[0] = u32::from_ne_bytes([10, 0, 0, 1]);
        k.dst[0] = u32::from_ne_bytes([10, 0, 0, 2]);
        assert_eq!(peer_of(&k).unwrap().to_string(), "10.0.0.2");
        k.direction = probe_ebpf::DIR_INGRESS;
        assert_eq!(peer_of(&k).unwrap().to_string(), "10.0.0.1");
    }
}

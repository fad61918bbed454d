//! Walks the kernel's per-flow map every `flow_scan` ticks for what only it holds: the
//! busiest flows and their burst state, how many flows are tracked and evicted, and the
//! flows idle long enough to delete. The per-series counters are not read here: the kernel
//! keeps them per series as well (series.rs), so a tick does not read every flow.
//!
//! The map holds one entry per flow and direction; entries come and go (LRU eviction when
//! full, and this collector deletes flows idle longer than `idle_timeout`). A recreated
//! entry is recognised by its new `first_seen_ns`.

use aya::maps::{HashMap, MapData, PerCpuHashMap};
use probe_ebpf::{FlowKey, FlowStats, IfaceKey, IfaceStats};
use rustc_hash::FxHashMap;

use super::{
    batch::{key_id, MapReader},
    top::TopN,
};

/// Flows reported in the snapshot's top_flows.
const TOP_FLOWS: usize = 32;

/// What the flow collector keeps of a flow's last reading: its bytes, and what tells a
/// recreated entry apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Reading {
    bytes: u64,
    first_seen_ns: u64,
    /// The collector's tick this reading is of.
    tick: u64,
    ifindex: u32,
}

pub struct FlowCollector {
    flows: HashMap<MapData, FlowKey, FlowStats>,
    reader: MapReader<FlowKey, FlowStats>,
    nonip: PerCpuHashMap<MapData, IfaceKey, IfaceStats>,
    /// Last reading of each flow, by `key_id` (entries of 40 bytes instead of 72).
    prev: FxHashMap<u64, Reading>,
    tick: u64,
    /// Ticks between walks of the flow map (at least 1), and the tick of the last walk.
    scan_every: u64,
    last_scan: u64,
    /// What the last walk found, reported until the next (with `prev`'s size).
    top: Vec<(u64, FlowKey, FlowStats)>,
    evictions: u64,
    idle_timeout_ns: u64,
}

/// What one tick of the flow collector yields.
pub struct FlowTick<'a> {
    /// (ifindex, direction) -> (bytes, packets) of non-IP traffic, cumulative.
    pub nonip: Vec<(IfaceKey, IfaceStats)>,
    /// Ticks since the flow map was walked (0: this tick); `tracked`, `evictions` and `top`
    /// are that walk's.
    pub scan_age: u64,
    pub tracked: u64,
    pub evictions: u64,
    /// (bytes per tick since the walk before, key, state) of the busiest flows.
    pub top: &'a [(u64, FlowKey, FlowStats)],
    /// The last reading of each flow deleted this tick for idleness (its open burst, if any,
    /// has ended: see burst_events::unfinished).
    pub removed: Vec<(FlowKey, FlowStats)>,
}

impl FlowCollector {
    pub fn new(
        flows: HashMap<MapData, FlowKey, FlowStats>,
        reader: MapReader<FlowKey, FlowStats>,
        nonip: PerCpuHashMap<MapData, IfaceKey, IfaceStats>,
        idle_timeout_ns: u64,
        scan_every: u64,
    ) -> Self {
        Self {
            flows,
            reader,
            nonip,
            prev: FxHashMap::default(),
            tick: 0,
            scan_every: scan_every.max(1),
            last_scan: 0,
            top: Vec::new(),
            evictions: 0,
            idle_timeout_ns,
        }
    }

    /// `now_ns` is CLOCK_MONOTONIC, the clock bpf_ktime_get_ns reads.
    pub fn tick(&mut self, now_ns: u64) -> FlowTick<'_> {
        self.tick += 1;
        let mut removed = Vec::new();
        if self.last_scan == 0 || self.tick - self.last_scan >= self.scan_every {
            removed = self.scan(now_ns);
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
            nonip,
            scan_age: self.tick - self.last_scan,
            tracked: self.prev.len() as u64,
            evictions: self.evictions,
            top: &self.top,
            removed,
        }
    }

    /// One walk of the flow map; returns the flows it deleted for idleness.
    fn scan(&mut self, now_ns: u64) -> Vec<(FlowKey, FlowStats)> {
        let tick = self.tick;
        // Bytes per tick over the ticks since the last walk.
        let ticks = if self.last_scan == 0 {
            1
        } else {
            tick - self.last_scan
        };
        self.last_scan = tick;
        let mut idle = Vec::new();
        let mut top = TopN::new(TOP_FLOWS);
        let flows = &self.flows;
        let prev = &mut self.prev;
        let idle_timeout_ns = self.idle_timeout_ns;
        // An entry evicted mid-walk is simply absent: counted as an eviction below.
        // One lookup per flow in `prev`, updated in place.
        self.reader.for_each(
            || flows.iter().filter_map(Result::ok).collect(),
            |k, v| {
                let slot = prev.entry(key_id(k)).or_default();
                let before = (slot.tick != 0 && slot.first_seen_ns == v.first_seen_ns)
                    .then_some(slot.bytes.min(v.bytes));
                let moved = v.bytes - before.unwrap_or(0);
                if moved > 0 {
                    top.push(moved.div_ceil(ticks), (*k, *v));
                }
                *slot = Reading {
                    bytes: v.bytes,
                    first_seen_ns: v.first_seen_ns,
                    tick,
                    ifindex: k.ifindex,
                };
                if now_ns.saturating_sub(v.last_seen_ns) > idle_timeout_ns {
                    idle.push((*k, *v));
                }
            },
        );
        // Idle flows were counted to their last byte: delete them from the kernel map.
        let mut removed = Vec::new();
        for (k, v) in idle {
            if self.flows.remove(&k).is_ok() {
                self.prev.remove(&key_id(&k));
                removed.push((k, v));
            }
        }
        // Flows we had and the map no longer has were evicted by the kernel.
        let before = self.prev.len();
        self.prev.retain(|_, r| r.tick == tick);
        self.evictions += (before - self.prev.len()) as u64;
        self.top = top
            .into_sorted()
            .into_iter()
            .map(|(b, (k, v))| (b, k, v))
            .collect();
        removed
    }

    /// Forgets an interface that went away: its flows go from the kernel map too, rather
    /// than waiting to be idle. The map is read afresh: flows that came since the last walk
    /// are not in `prev`.
    pub fn forget_interface(&mut self, ifindex: u32) {
        let flows = &self.flows;
        let mut gone: Vec<FlowKey> = Vec::new();
        self.reader.for_each(
            || flows.iter().filter_map(Result::ok).collect(),
            |k, _| {
                if k.ifindex == ifindex {
                    gone.push(*k);
                }
            },
        );
        for k in &gone {
            let _ = self.flows.remove(k);
        }
        self.prev.retain(|_, r| r.ifindex != ifindex);
        self.top.retain(|(_, k, _)| k.ifindex != ifindex);
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

    /// Flows that differ in any one field of their key, padding aside, have different ids.
    #[test]
    fn key_ids_tell_flow_keys_apart() {
        let base = FlowKey {
            src: [1, 2, 3, 4],
            dst: [5, 6, 7, 8],
            sport: 40_000,
            dport: 5_201,
            ifindex: 3,
            family: probe_ebpf::AF_INET6,
            proto: 6,
            direction: probe_ebpf::DIR_EGRESS,
            _pad: 0,
        };
        let variants = [
            FlowKey {
                src: [1, 2, 3, 5],
                ..base
            },
            FlowKey {
                dst: [9, 6, 7, 8],
                ..base
            },
            FlowKey {
                sport: 40_001,
                ..base
            },
            FlowKey {
                dport: 5_202,
                ..base
            },
            FlowKey { ifindex: 4, ..base },
            FlowKey {
                family: probe_ebpf::AF_INET,
                ..base
            },
            FlowKey { proto: 17, ..base },
            FlowKey {
                direction: probe_ebpf::DIR_INGRESS,
                ..base
            },
        ];
        let mut ids: Vec<u64> = variants.iter().map(key_id).collect();
        ids.push(key_id(&base));
        assert_eq!(
            key_id(&base),
            key_id(&{ base }),
            "the same key, the same id"
        );
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), variants.len() + 1);
    }
}

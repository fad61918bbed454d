//! Walks the kernel's per-flow map every `flow_scan` ticks for what only it holds: the
//! busiest flows and their burst state, how many flows are tracked and evicted, and the
//! flows idle long enough to delete. The per-series counters are not read here: the kernel
//! keeps them per series as well (series.rs), so a tick does not read every flow.
//!
//! The walk keeps nothing per flow. TC marks each flow's bytes at its first packet after a
//! walk (FlowStats::mark_epoch, mark_bytes; the walk then bumps FLOW_EPOCH), so what moved
//! since the last walk is read off the entry itself; a recreated entry starts a new mark.
//!
//! The map holds one entry per flow and direction; entries come and go (LRU eviction when
//! full, and this collector deletes flows idle longer than `idle_timeout`). Evictions are
//! what TC created (FLOW_INSERTS) and neither this collector deleted nor a walk found.

use aya::maps::{Array, HashMap, MapData, PerCpuArray, PerCpuHashMap};
use probe_ebpf::{FlowKey, FlowStats, IfaceKey, IfaceStats};

use super::{batch::MapReader, top::TopN};

/// Flows reported in the snapshot's top_flows.
const TOP_FLOWS: usize = 32;

pub struct FlowCollector {
    flows: HashMap<MapData, FlowKey, FlowStats>,
    reader: MapReader<FlowKey, FlowStats>,
    nonip: PerCpuHashMap<MapData, IfaceKey, IfaceStats>,
    /// FLOW_EPOCH, and the epoch TC marks flows with until the walk after this one.
    epoch_map: Array<MapData, u32>,
    epoch: u32,
    /// Flow entries TC created, per CPU.
    inserts: PerCpuArray<MapData, u64>,
    /// Entries this collector deleted, over its life.
    deleted: u64,
    tick: u64,
    /// Ticks between walks of the flow map (at least 1), and the tick of the last walk.
    scan_every: u64,
    last_scan: u64,
    /// What the last walk found, reported until the next.
    tracked: u64,
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
        epoch_map: Array<MapData, u32>,
        inserts: PerCpuArray<MapData, u64>,
        idle_timeout_ns: u64,
        scan_every: u64,
    ) -> Self {
        // TC marks flows with what the map holds (0 when the programs were just loaded).
        let epoch = epoch_map.get(&0, 0).unwrap_or(0);
        Self {
            flows,
            reader,
            nonip,
            epoch_map,
            epoch,
            inserts,
            deleted: 0,
            tick: 0,
            scan_every: scan_every.max(1),
            last_scan: 0,
            tracked: 0,
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
            tracked: self.tracked,
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
        // Read before the walk: an entry created after this read and found by the walk
        // makes the evictions lag by one walk, never run ahead.
        let created = self.created();
        let mut idle = Vec::new();
        let mut top = TopN::new(TOP_FLOWS);
        let mut found = 0u64;
        let idle_timeout_ns = self.idle_timeout_ns;
        let epoch = self.epoch;
        let flows = &self.flows;
        // An entry evicted mid-walk is simply absent.
        self.reader.for_each(
            || flows.iter().filter_map(Result::ok).collect(),
            |k, v| {
                found += 1;
                // Marked in this epoch: it moved since the last walk; else it did not.
                if v.mark_epoch == epoch {
                    let moved = v.bytes.saturating_sub(v.mark_bytes);
                    if moved > 0 {
                        top.push(moved.div_ceil(ticks), (*k, *v));
                    }
                }
                if now_ns.saturating_sub(v.last_seen_ns) > idle_timeout_ns {
                    idle.push((*k, *v));
                }
            },
        );
        // From here on TC marks each flow afresh at its next packet. A packet between the
        // walk's read of its flow and this write is counted in neither walk's top flows (it
        // is in the flow's bytes): a window of the walk's length.
        self.epoch = self.epoch.wrapping_add(1);
        if let Err(e) = self.epoch_map.set(0, self.epoch, 0) {
            tracing::warn!("writing FLOW_EPOCH failed ({e}): the top flows' rates will read low");
        }
        // Idle flows were counted to their last byte: delete them from the kernel map.
        let mut removed = Vec::new();
        for (k, v) in idle {
            if self.flows.remove(&k).is_ok() {
                self.deleted += 1;
                found -= 1;
                removed.push((k, v));
            }
        }
        self.tracked = found;
        let gone = created.saturating_sub(self.deleted + found);
        self.evictions = self.evictions.max(gone);
        self.top = top
            .into_sorted()
            .into_iter()
            .map(|(b, (k, v))| (b, k, v))
            .collect();
        removed
    }

    /// Flow entries TC has created, summed over the CPUs.
    fn created(&self) -> u64 {
        self.inserts
            .get(&0, 0)
            .map(|per_cpu| per_cpu.iter().sum())
            .unwrap_or(0)
    }

    /// Forgets an interface that went away: its flows go from the kernel map too, rather
    /// than waiting to be idle. The map is read afresh: flows may have come since the last
    /// walk.
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
            if self.flows.remove(k).is_ok() {
                self.deleted += 1;
            }
        }
        self.tracked = self.tracked.saturating_sub(gone.len() as u64);
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

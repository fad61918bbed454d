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
//!
//! Where the kernel has map-element iterators, the walk is selected in the kernel
//! (probe-ebpf iter.rs): the iterator writes only the candidate top flows (moved more than a
//! threshold this collector sets from the last walk) and the idle flows (which it deletes),
//! then the count of entries visited; else every entry is copied with batch lookups.

use aya::maps::{Array, HashMap, MapData, PerCpuArray, PerCpuHashMap};
use std::mem::size_of;

use probe_ebpf::{
    pick, walk_bucket_floor, FlowKey, FlowPick, FlowStats, FlowWalk, IfaceKey, IfaceStats,
    PICKS_MAX, WALK_HIST,
};

use super::{batch::MapReader, mapping::Mapping, top::TopN};
use crate::bpf::select::Walk;

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
    /// The in-kernel selection, when the kernel has it.
    select: Option<FlowSelect>,
}

/// The flow-selection walk (bpf::select), where it writes, and the next walk's threshold.
pub struct FlowSelect {
    walk: Walk,
    /// FLOW_PICKS and FLOW_WALK, read in place.
    picks: Mapping,
    summary: Mapping,
    /// Bytes a flow must have moved since the last walk to be written: from the last walk's
    /// histogram, a threshold twice TOP_FLOWS flows passed; 0 writes every flow that moved.
    min_moved: u64,
}

impl FlowSelect {
    pub fn new(walk: Walk, picks: &MapData, summary: &MapData) -> anyhow::Result<Self> {
        Ok(Self {
            walk,
            picks: Mapping::new(picks, PICKS_MAX as usize * size_of::<FlowPick>(), false)?,
            // Writable: the histogram is zeroed here before each run.
            summary: Mapping::new(summary, size_of::<FlowWalk>(), true)?,
            min_moved: 0,
        })
    }
}

/// What one walk found, by either path.
struct Found {
    top: TopN<(FlowKey, FlowStats)>,
    idle: Vec<(FlowKey, FlowStats)>,
    /// Entries the walk visited, idle ones included.
    visited: u64,
}

/// The threshold that lets at least `want` of the flows in a walk's histogram through, at a
/// bucket boundary (`moved > threshold` is `moved >= floor`); 0 (every flow that moved) if
/// fewer moved.
fn threshold_from(hist: &[u32; WALK_HIST], want: usize) -> u64 {
    let mut above = 0usize;
    for i in (1..WALK_HIST).rev() {
        above += hist[i] as usize;
        if above >= want {
            return walk_bucket_floor(i) - 1;
        }
    }
    0
}

/// One run of the selection walk: its summary, its top flows and how many candidates it
/// wrote.
struct Run {
    summary: FlowWalk,
    top: TopN<(FlowKey, FlowStats)>,
    candidates: usize,
}

/// One run of the selection walk at `args`; its idle flows (deleted by it) are added to
/// `idle`.
fn select_once(
    sel: &mut FlowSelect,
    args: [u64; 4],
    ticks: u64,
    idle: &mut Vec<(FlowKey, FlowStats)>,
) -> std::io::Result<Run> {
    // SAFETY: FLOW_WALK's value, mapped whole and writable; no run is under way.
    unsafe { std::ptr::write_volatile(sel.summary.ptr.as_ptr().cast(), FlowWalk::default()) };
    sel.walk.run(&args)?;
    // SAFETY: FLOW_WALK's value, mapped whole; the run has returned and no other walk runs.
    let w: FlowWalk = unsafe { std::ptr::read_volatile(sel.summary.ptr.as_ptr().cast()) };
    let mut top = TopN::new(TOP_FLOWS);
    let mut candidates = 0;
    let written = (w.written as usize).min(PICKS_MAX as usize);
    let picks = sel.picks.ptr.as_ptr().cast::<FlowPick>();
    for i in 0..written {
        // SAFETY: within FLOW_PICKS' mapped values; the run wrote the first `written`.
        let r: FlowPick = unsafe { std::ptr::read_volatile(picks.add(i)) };
        if r.kind & pick::TOP != 0 {
            candidates += 1;
            let moved = r.stats.bytes.saturating_sub(r.stats.mark_bytes);
            top.push(moved.div_ceil(ticks), (r.key, r.stats));
        }
        if r.kind & pick::IDLE != 0 {
            idle.push((r.key, r.stats));
        }
    }
    Ok(Run {
        summary: w,
        top,
        candidates,
    })
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
            select: None,
        }
    }

    /// Walks through the in-kernel selection from now on (see the module's comment).
    pub fn select_in_kernel(&mut self, select: FlowSelect) {
        self.select = Some(select);
    }

    /// Whether walks select in the kernel (false: batch lookups of every entry).
    pub fn selects_in_kernel(&self) -> bool {
        self.select.is_some()
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
        let (found, deleted_in_kernel) = match self.select_walk(now_ns, ticks) {
            Some(found) => (found, true),
            None => (self.batch_walk(now_ns, ticks), false),
        };
        let Found {
            top, idle, visited, ..
        } = found;
        let mut found = visited;
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
            // The iterator deleted its idle flows after writing them.
            if deleted_in_kernel || self.flows.remove(&k).is_ok() {
                self.deleted += 1;
                found = found.saturating_sub(1);
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

    /// A walk with batch lookups of every entry.
    fn batch_walk(&mut self, now_ns: u64, ticks: u64) -> Found {
        let mut idle = Vec::new();
        let mut top = TopN::new(TOP_FLOWS);
        let mut visited = 0u64;
        let idle_timeout_ns = self.idle_timeout_ns;
        let epoch = self.epoch;
        let flows = &self.flows;
        // An entry evicted mid-walk is simply absent.
        self.reader.for_each(
            || flows.iter().filter_map(Result::ok).collect(),
            |k, v| {
                visited += 1;
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
        Found { top, idle, visited }
    }

    /// A walk selected in the kernel; None if there is no selection or it failed (then,
    /// one log line, and batch walks from now on).
    fn select_walk(&mut self, now_ns: u64, ticks: u64) -> Option<Found> {
        let sel = self.select.as_mut()?;
        let mut args = [
            now_ns,
            self.idle_timeout_ns,
            sel.min_moved,
            u64::from(self.epoch),
        ];
        let mut idle = Vec::new();
        let mut result = None;
        // Two runs at most. The threshold comes from the last walk; a run it let fewer than
        // TOP_FLOWS flows through (the top's rates fell by more than a quarter), or more
        // than FLOW_PICKS holds, is run again at the threshold its own histogram gives,
        // which lets TOP_FLOWS or more through. If that fills FLOW_PICKS too (thousands of
        // flows moved within a factor of two of the TOP_FLOWS-th), the list ends with
        // whichever of them the walk met first.
        for run in 0..2 {
            // Idle flows an earlier run deleted were visited by this walk too.
            let deleted_before = idle.len() as u64;
            match select_once(sel, args, ticks, &mut idle) {
                // A full run whose histogram gives no higher threshold (its candidates are
                // within a factor of two of each other) would fill the array again.
                Ok(Run {
                    summary: w,
                    candidates,
                    ..
                }) if run == 0
                    && ((candidates < TOP_FLOWS && args[2] > 0)
                        || (w.full != 0 && threshold_from(&w.hist, TOP_FLOWS) > args[2])) =>
                {
                    args[2] = threshold_from(&w.hist, TOP_FLOWS);
                }
                Ok(Run {
                    summary: w, top, ..
                }) => {
                    // The next walk lets through twice the list of this one: room for the
                    // top's rates to fall a little before a walk needs a second run.
                    sel.min_moved = threshold_from(&w.hist, 2 * TOP_FLOWS);
                    result = Some(Found {
                        top,
                        idle: Vec::new(),
                        visited: w.visited + deleted_before,
                    });
                    break;
                }
                Err(e) => {
                    tracing::warn!(
                        "the flow-selection walk failed ({e}); walking FLOWS with batch lookups from now on"
                    );
                    self.select = None;
                    return None;
                }
            }
        }
        let mut found = result?;
        found.idle = idle;
        Some(found)
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

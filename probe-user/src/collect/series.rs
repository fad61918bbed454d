//! Reads the per-series traffic counters the TC programs keep per CPU and turns them into
//! monotonic per-peer totals: the exported `probe_flow_*` series.
//!
//! The kernel counts every packet twice: in its flow's entry (FLOWS, walked only every
//! `flow_scan` for the per-flow detail, see flows.rs) and in its series' counters here: a
//! per-CPU table of slots (SERIES_SLOTS), and a per-CPU hash (SERIES) for a series that
//! found no free slot. A tick reads a few entries per series instead of every flow, so its
//! cost follows the number of peers, not of connections.
//!
//! Each CPU takes slots on its own, and a slot idle for `SERIES_STALE_NS` may be taken by
//! another series: totals are therefore sums of per-(slot, CPU) deltas, where a slot that
//! now holds another series (or went down) counts from zero.
use std::{net::IpAddr, time::Instant};

use aya::maps::{MapData, PerCpuArray, PerCpuHashMap};
use probe_ebpf::{BurstKey, SeriesSlot, SeriesStats};
use rustc_hash::FxHashMap;

use super::readings::ip_from_abi;
use super::{batch::MapReader, delta::LastSeen};
use crate::counter;

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

impl Totals {
    fn of_slot(s: &SeriesSlot) -> Self {
        Self {
            bytes: s.bytes,
            packets: s.packets,
            ce_packets: s.ce_packets,
            ect_packets: s.ect_packets,
        }
    }

    fn of_stats(s: &SeriesStats) -> Self {
        Self {
            bytes: s.bytes,
            packets: s.packets,
            ce_packets: s.ce_packets,
            ect_packets: s.ect_packets,
        }
    }

    fn plus(self, o: Self) -> Self {
        Self {
            bytes: self.bytes + o.bytes,
            packets: self.packets + o.packets,
            ce_packets: self.ce_packets + o.ce_packets,
            ect_packets: self.ect_packets + o.ect_packets,
        }
    }

    /// `self - before`, or all of `self` when a counter went down (the counts restarted).
    fn since(self, before: Option<Self>) -> Self {
        let [bytes, packets, ce_packets, ect_packets] =
            counter::increases_of(self.counters(), before.map(Self::counters));
        Self {
            bytes,
            packets,
            ce_packets,
            ect_packets,
        }
    }

    fn counters(self) -> [u64; 4] {
        [self.bytes, self.packets, self.ce_packets, self.ect_packets]
    }

    fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

fn series_of(
    ifindex: u32,
    family: u8,
    direction: u8,
    addr: &probe_ebpf::Addr,
) -> Option<SeriesKey> {
    Some(SeriesKey {
        ifindex,
        direction,
        peer: ip_from_abi(family, addr)?,
    })
}

/// Per-series totals from successive readings of the kernel's counters: SeriesCounters
/// without the maps.
struct Sums {
    /// Possible CPUs: the values per entry of a per-CPU map.
    cpus: usize,
    /// Last tick's reading of every slot, laid out as the kernel hands them over: slot-major,
    /// one value per CPU.
    prev_slots: Vec<SeriesSlot>,
    /// Each overflow entry's reading, summed over CPUs: last tick's, and this tick's so far.
    prev_overflow: FxHashMap<BurstKey, Totals>,
    overflow: FxHashMap<BurstKey, Totals>,
    totals: FxHashMap<SeriesKey, Totals>,
    /// Series that have not moved for `delta::SERIES_IDLE` are dropped.
    last_seen: LastSeen<SeriesKey>,
}

impl Sums {
    fn new(cpus: usize) -> Self {
        Self {
            cpus: cpus.max(1),
            prev_slots: Vec::new(),
            prev_overflow: FxHashMap::default(),
            overflow: FxHashMap::default(),
            totals: FxHashMap::default(),
            last_seen: LastSeen::default(),
        }
    }

    /// Slot `index` as each CPU holds it.
    fn slot(&mut self, index: u32, per_cpu: &[SeriesSlot]) {
        let cpus = self.cpus;
        let base = index as usize * cpus;
        if self.prev_slots.len() < base + cpus {
            self.prev_slots.resize(base + cpus, SeriesSlot::default());
        }
        for (c, now) in per_cpu.iter().take(cpus).enumerate() {
            let prev = &mut self.prev_slots[base + c];
            if now.tag == 0 {
                continue;
            }
            // The same series as last tick: its counts since; else all of them.
            let same = prev.tag == now.tag && prev.addr == now.addr;
            let delta = Totals::of_slot(now).since(same.then(|| Totals::of_slot(prev)));
            *prev = *now;
            let (ifindex, family, direction) = SeriesSlot::untag(now.tag);
            if let Some(key) = series_of(ifindex, family, direction, &now.addr) {
                self.add(key, delta);
            }
        }
    }

    /// Overflow entry `key` as each CPU holds it.
    fn overflow(&mut self, key: &BurstKey, per_cpu: &[SeriesStats]) {
        let sum = per_cpu
            .iter()
            .fold(Totals::default(), |t, v| t.plus(Totals::of_stats(v)));
        let delta = sum.since(self.prev_overflow.get(key).copied());
        self.overflow.insert(*key, sum);
        if let Some(series) = series_of(key.ifindex, key.family, key.direction, &key.addr) {
            self.add(series, delta);
        }
    }

    fn add(&mut self, key: SeriesKey, delta: Totals) {
        // A series that did not move neither keeps itself alive nor comes back.
        if delta.is_zero() {
            return;
        }
        self.last_seen.touch(&key);
        let t = self.totals.entry(key).or_default();
        *t = t.plus(delta);
    }

    /// Ends a tick at `now`: the series idle too long are dropped, and returned with the
    /// overflow entries they had.
    fn finish(&mut self, now: Instant) -> Vec<BurstKey> {
        self.prev_overflow = std::mem::take(&mut self.overflow);
        let gone = self.last_seen.expire(now);
        for k in &gone {
            self.totals.remove(k);
        }
        self.forget_overflow(|s| gone.contains(&s))
    }

    /// Forgets the overflow entries of the series `drop` picks; returns their keys.
    fn forget_overflow(&mut self, drop: impl Fn(SeriesKey) -> bool) -> Vec<BurstKey> {
        let keys: Vec<BurstKey> = self
            .prev_overflow
            .keys()
            .filter(|k| series_of(k.ifindex, k.family, k.direction, &k.addr).is_some_and(&drop))
            .copied()
            .collect();
        for k in &keys {
            self.prev_overflow.remove(k);
        }
        keys
    }
}

pub struct SeriesCounters {
    slots: PerCpuArray<MapData, SeriesSlot>,
    slot_reader: MapReader<u32, SeriesSlot>,
    overflow: PerCpuHashMap<MapData, BurstKey, SeriesStats>,
    overflow_reader: MapReader<BurstKey, SeriesStats>,
    sums: Sums,
}

impl SeriesCounters {
    pub fn new(
        cpus: usize,
        slots: PerCpuArray<MapData, SeriesSlot>,
        slot_reader: MapReader<u32, SeriesSlot>,
        overflow: PerCpuHashMap<MapData, BurstKey, SeriesStats>,
        overflow_reader: MapReader<BurstKey, SeriesStats>,
    ) -> Self {
        Self {
            slots,
            slot_reader,
            overflow,
            overflow_reader,
            sums: Sums::new(cpus),
        }
    }

    /// Reads the counters: every series' totals since it was first seen (or came back after
    /// being dropped for idleness).
    pub fn tick(&mut self) -> &FxHashMap<SeriesKey, Totals> {
        let cpus = self.sums.cpus;
        let sums = &mut self.sums;
        self.slot_reader
            .for_each_per_cpu_array(cpus, &self.slots, |&i, per_cpu| sums.slot(i, per_cpu));
        self.overflow_reader
            .for_each_per_cpu_map(cpus, &self.overflow, |k, per_cpu| sums.overflow(k, per_cpu));
        // An idle series' overflow entry goes too, making room; its slots just age.
        for k in self.sums.finish(Instant::now()) {
            let _ = self.overflow.remove(&k);
        }
        &self.sums.totals
    }

    /// Forgets an interface that went away: its series stop being exported. Its slots age
    /// out in the kernel; were the index reused, their counts would continue from here.
    pub fn forget_interface(&mut self, ifindex: u32) {
        self.sums.totals.retain(|k, _| k.ifindex != ifindex);
        self.sums.last_seen.forget(|k| k.ifindex != ifindex);
        self.sums.forget_overflow(|s| s.ifindex == ifindex);
        // From the map itself: an entry may have come since the last read.
        let gone: Vec<BurstKey> = self
            .overflow
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.ifindex == ifindex)
            .collect();
        for k in gone {
            let _ = self.overflow.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use probe_ebpf::{AF_INET, DIR_EGRESS, DIR_INGRESS};
    use std::time::Duration;

    fn v4(last: u8) -> probe_ebpf::Addr {
        [u32::from_ne_bytes([10, 0, 0, last]), 0, 0, 0]
    }

    fn slot(peer: u8, direction: u8, bytes: u64) -> SeriesSlot {
        SeriesSlot {
            addr: v4(peer),
            tag: SeriesSlot::tag(3, AF_INET, direction),
            bytes,
            packets: bytes / 100,
            ..SeriesSlot::default()
        }
    }

    fn key(peer: u8, direction: u8) -> SeriesKey {
        SeriesKey {
            ifindex: 3,
            direction,
            peer: IpAddr::from([10, 0, 0, peer]),
        }
    }

    fn bytes(s: &Sums, peer: u8, direction: u8) -> Option<u64> {
        s.totals.get(&key(peer, direction)).map(|t| t.bytes)
    }

    #[test]
    fn slots_add_up_over_cpus_and_a_taken_over_slot_counts_from_zero() {
        let mut s = Sums::new(2);
        let t0 = Instant::now();
        // Slot 5: peer .2 egress on CPU 0, peer .3 ingress on CPU 1; slot 9: .2 on CPU 1.
        s.slot(5, &[slot(2, DIR_EGRESS, 1000), slot(3, DIR_INGRESS, 500)]);
        s.slot(9, &[SeriesSlot::default(), slot(2, DIR_EGRESS, 200)]);
        s.finish(t0);
        assert_eq!(bytes(&s, 2, DIR_EGRESS), Some(1200));
        assert_eq!(bytes(&s, 3, DIR_INGRESS), Some(500));
        // Both grow; then CPU 1's slot 5 is taken over by peer .4, which starts from its own
        // count: .3 keeps what it had, .4 gets only its own.
        s.slot(5, &[slot(2, DIR_EGRESS, 1500), slot(3, DIR_INGRESS, 800)]);
        s.slot(9, &[SeriesSlot::default(), slot(2, DIR_EGRESS, 300)]);
        s.finish(t0);
        s.slot(5, &[slot(2, DIR_EGRESS, 1500), slot(4, DIR_INGRESS, 100)]);
        s.slot(9, &[SeriesSlot::default(), slot(2, DIR_EGRESS, 300)]);
        s.finish(t0);
        assert_eq!(bytes(&s, 2, DIR_EGRESS), Some(1800));
        assert_eq!(bytes(&s, 3, DIR_INGRESS), Some(800));
        assert_eq!(bytes(&s, 4, DIR_INGRESS), Some(100));
        assert_eq!(s.totals[&key(2, DIR_EGRESS)].packets, 15 + 3);
    }

    #[test]
    fn overflow_entries_add_in_and_idle_series_go_with_their_entries() {
        let mut s = Sums::new(2);
        let t0 = Instant::now();
        let k = BurstKey {
            addr: v4(7),
            ifindex: 3,
            family: AF_INET,
            direction: DIR_EGRESS,
            _pad: 0,
        };
        let st = |b: u64| SeriesStats {
            bytes: b,
            ..SeriesStats::default()
        };
        s.slot(1, &[slot(7, DIR_EGRESS, 50), SeriesSlot::default()]);
        s.overflow(&k, &[st(10), st(20)]);
        s.finish(t0);
        assert_eq!(bytes(&s, 7, DIR_EGRESS), Some(80));
        // Deleted and recreated in the kernel (lower than before): counted from zero.
        s.slot(1, &[slot(7, DIR_EGRESS, 50), SeriesSlot::default()]);
        s.overflow(&k, &[st(5), st(0)]);
        s.finish(t0);
        assert_eq!(bytes(&s, 7, DIR_EGRESS), Some(85));
        // Nothing moves for longer than SERIES_IDLE: the series goes, with its entry.
        s.slot(1, &[slot(7, DIR_EGRESS, 50), SeriesSlot::default()]);
        s.overflow(&k, &[st(5), st(0)]);
        let gone = s.finish(t0 + super::super::delta::SERIES_IDLE + Duration::from_secs(2));
        assert_eq!(bytes(&s, 7, DIR_EGRESS), None);
        assert_eq!(gone, vec![k]);
    }
}

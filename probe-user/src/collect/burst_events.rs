//! Burst ends streamed by the TC programs through the BURST_EVENTS ring buffer, one record
//! per ended burst (never per packet): the fine-grained timing a 1 s tick cannot see.
//!
//! Each tick drains what the ring holds at that moment without waiting (the kernel writes
//! with BPF_RB_NO_WAKEUP, nothing polls), converts the kernel's monotonic times to wall-clock
//! seconds and names interface and peer as the flow collector does. Lost events are counted
//! in two places: the kernel counts reservations the full ring refused (ERRORS slot
//! BURST_EVENTS_FULL), and this collector counts what it read beyond the per-tick cap.
//!
//! A flow's burst ends only when its next packet comes after the gap. The burst in progress
//! when the flow collector deletes an idle flow (idle for FLOW_IDLE_TIMEOUT, far longer than
//! any burst gap) has ended but no packet will say so: it is handed over from the flow's last
//! reading (`unfinished`), so a job's last burst before a pause is not lost. A flow the full
//! LRU map evicts takes its burst in progress with it (counted in probe_flow_evictions_total).
use std::{collections::HashMap, sync::Arc};

use aya::maps::{MapData, RingBuf};
use probe_ebpf::{Addr, BurstEnd, FlowKey, FlowStats, DIR_EGRESS, DIR_INGRESS};
use rustc_hash::FxHashMap;

use super::direction_label;
use crate::{
    observe::BurstEvent,
    snapshot::{ip_from_abi, peer_label},
};

pub struct BurstEventCollector {
    ring: RingBuf<MapData>,
    /// Events handed over per tick at most: a ring's worth (its bytes / 64-byte records).
    max_per_tick: usize,
    /// Events read beyond the per-tick cap and dropped, cumulative.
    dropped: u64,
}

impl BurstEventCollector {
    /// `ring_bytes`: the ring's size as loaded (`[maps] burst_events_bytes`).
    pub fn new(ring: RingBuf<MapData>, ring_bytes: u32) -> Self {
        Self {
            ring,
            max_per_tick: (ring_bytes / 64).max(1) as usize,
            dropped: 0,
        }
    }

    /// Takes the records the ring holds now; never waits. Hands every record to `each` (the
    /// per-peer histograms are folded from all of them), keeps at most a ring's worth as
    /// events and drops (counting) up to as many more, so that a tick's work is bounded even
    /// while the programs keep writing; anything beyond stays in the ring for the next tick.
    pub fn drain(&mut self, mut each: impl FnMut(&BurstEnd)) -> Vec<BurstEnd> {
        let mut out = Vec::new();
        for _ in 0..2 * self.max_per_tick {
            let Some(item) = self.ring.next() else {
                break;
            };
            let Some(r) = parse(&item) else {
                continue;
            };
            each(&r);
            if out.len() == self.max_per_tick {
                self.dropped += 1;
            } else {
                out.push(r);
            }
        }
        out
    }

    /// Events this collector dropped over the per-tick cap, since start.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// A record as the kernel wrote it, or None if it is too short (it never is: the programs
/// reserve exactly a BurstEnd).
pub fn parse(bytes: &[u8]) -> Option<BurstEnd> {
    if bytes.len() < std::mem::size_of::<BurstEnd>() {
        return None;
    }
    // SAFETY: long enough (checked above), and BurstEnd is Pod: any bytes are a valid value.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<BurstEnd>()) })
}

/// The burst in progress of a flow removed for idleness, from its last reading: it ended at
/// the flow's last packet. None if the flow had no burst open.
pub fn unfinished(k: &FlowKey, v: &FlowStats) -> Option<BurstEnd> {
    if v.burst_bytes == 0 {
        return None;
    }
    Some(BurstEnd {
        start_ns: v.burst_start_ns,
        duration_ns: v.last_seen_ns.saturating_sub(v.burst_start_ns),
        bytes: v.burst_bytes,
        packets: v.packets.saturating_sub(v.burst_start_packets),
        addr: if k.direction == DIR_EGRESS {
            k.dst
        } else {
            k.src
        },
        ifindex: k.ifindex,
        family: k.family,
        direction: k.direction,
        _pad: 0,
    })
}

fn clock_ns(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer; both clocks used here always exist.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// CLOCK_REALTIME - CLOCK_MONOTONIC in ns, sampled now (each tick, so that a clock step or
/// NTP slew is followed): add it to a bpf_ktime_get_ns time to get Unix time.
pub fn realtime_offset_ns() -> i64 {
    let m0 = clock_ns(libc::CLOCK_MONOTONIC);
    let r = clock_ns(libc::CLOCK_REALTIME);
    let m1 = clock_ns(libc::CLOCK_MONOTONIC);
    r - (m0 + (m1 - m0) / 2)
}

/// The snapshot's form of a record, with its interface and peer already named.
pub fn to_event(
    r: &BurstEnd,
    offset_ns: i64,
    iface: &Arc<str>,
    direction: &Arc<str>,
    peer: &Arc<str>,
) -> BurstEvent {
    BurstEvent {
        iface: iface.clone(),
        direction: direction.clone(),
        peer: peer.clone(),
        // Saturating, not `as i64`: a time past i64::MAX (only ever garbage) would wrap
        // negative and break the start order `events` sorts by.
        start_unix: i64::try_from(r.start_ns)
            .unwrap_or(i64::MAX)
            .saturating_add(offset_ns) as f64
            * 1e-9,
        duration_s: r.duration_ns as f64 * 1e-9,
        bytes: r.bytes,
        packets: r.packets,
        // Set by the collect stage once the tick's time is known.
        tick_unix: 0.0,
    }
}

/// Named events of `records`, in start order (ties by interface index, direction, address).
/// Records of interfaces not in `ifnames`
/// (detached this tick) or of an unknown address family are left out. Each label is made
/// once per tick and shared by its events: a busy tick has many bursts of few peers.
pub fn events(
    records: &[BurstEnd],
    offset_ns: i64,
    ifnames: &HashMap<u32, String>,
) -> Vec<BurstEvent> {
    let mut peers: FxHashMap<(u8, Addr), Option<Arc<str>>> = FxHashMap::default();
    let mut ifaces: FxHashMap<u32, Option<Arc<str>>> = FxHashMap::default();
    let directions: [Arc<str>; 2] = [DIR_INGRESS, DIR_EGRESS].map(|d| direction_label(d).into());
    // Sorted as (start, index) pairs, 16 bytes each, not as records or events: a tick's
    // 30,000 records are ~2 MB, and comparing through references to them was a cache miss
    // per comparison. Equal starts (rare) fall back to the rest of the key; records equal in
    // all of it are the same burst twice, and either order is the same output.
    let tie = |r: &BurstEnd| (r.ifindex, r.direction, r.family, r.addr);
    let mut order: Vec<(u64, u32)> = records
        .iter()
        .enumerate()
        .map(|(i, r)| (r.start_ns, i as u32))
        .collect();
    order.sort_unstable_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| tie(&records[a.1 as usize]).cmp(&tie(&records[b.1 as usize])))
    });
    let mut out = Vec::with_capacity(records.len());
    for r in order.iter().map(|&(_, i)| &records[i as usize]) {
        let iface = ifaces
            .entry(r.ifindex)
            .or_insert_with(|| ifnames.get(&r.ifindex).map(|n| n.as_str().into()));
        let Some(iface) = iface else {
            continue;
        };
        let peer = peers
            .entry((r.family, r.addr))
            .or_insert_with(|| ip_from_abi(r.family, &r.addr).map(|ip| peer_label(ip).into()));
        let direction = &directions[usize::from(r.direction == DIR_EGRESS)];
        if let Some(peer) = peer {
            out.push(to_event(r, offset_ns, iface, direction, peer));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use probe_ebpf::{AF_INET, AF_INET6};

    fn v4(a: [u8; 4]) -> probe_ebpf::Addr {
        [u32::from_ne_bytes(a), 0, 0, 0]
    }

    fn record(start_ns: u64, ifindex: u32, peer: [u8; 4]) -> BurstEnd {
        BurstEnd {
            start_ns,
            duration_ns: 2_500_000,
            bytes: 4_000_000,
            packets: 2_800,
            addr: v4(peer),
            ifindex,
            family: AF_INET,
            direction: DIR_EGRESS,
            _pad: 0,
        }
    }

    #[test]
    fn parses_the_kernel_layout() {
        let r = record(7, 3, [10, 0, 0, 2]);
        // SAFETY: a plain-data struct viewed as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&r as *const BurstEnd).cast::<u8>(),
                std::mem::size_of::<BurstEnd>(),
            )
        };
        assert_eq!(parse(bytes), Some(r));
        assert_eq!(parse(&bytes[..40]), None);
    }

    /// Found by the burst_events fuzz target: a start time past i64::MAX wrapped negative
    /// and came out before the record it was sorted after.
    #[test]
    fn keeps_start_order_past_i64_max() {
        let ifnames = HashMap::from([(3, "eth0".to_owned())]);
        let recs = [
            record(1, 3, [10, 0, 0, 2]),
            record(1 << 63, 3, [10, 0, 0, 2]),
        ];
        for offset in [0, -5_000_000_000, 1_700_000_000_000_000_000] {
            let ev = events(&recs, offset, &ifnames);
            assert_eq!(ev.len(), 2);
            assert!(ev[0].start_unix <= ev[1].start_unix, "{offset}: {ev:?}");
        }
    }

    #[test]
    fn names_converts_and_sorts() {
        let ifnames = HashMap::from([(3, "eth0".to_owned())]);
        let offset = 1_700_000_000_000_000_000i64 - 5_000_000_000;
        let recs = [
            record(6_000_000_000, 3, [10, 0, 0, 2]),
            record(5_000_000_000, 3, [10, 0, 0, 3]),
            // An interface that is not monitored: left out.
            record(5_500_000_000, 9, [10, 0, 0, 2]),
        ];
        let ev = events(&recs, offset, &ifnames);
        assert_eq!(ev.len(), 2);
        assert_eq!(&*ev[0].peer, "10.0.0.3");
        assert_eq!(ev[0].start_unix, 1_700_000_000.0);
        assert!((ev[1].start_unix - 1_700_000_001.0).abs() < 1e-6);
        assert_eq!(&*ev[1].iface, "eth0");
        assert_eq!(&*ev[1].direction, "egress");
        assert_eq!(ev[1].duration_s, 0.0025);
        assert_eq!((ev[1].bytes, ev[1].packets), (4_000_000, 2_800));
    }

    #[test]
    fn v4_mapped_v6_peers_are_named_like_flows() {
        let mut r = record(1, 3, [0, 0, 0, 0]);
        r.family = AF_INET6;
        r.addr = [
            0,
            0,
            u32::from_ne_bytes([0, 0, 0xff, 0xff]),
            u32::from_ne_bytes([10, 0, 0, 2]),
        ];
        let ifnames = HashMap::from([(3, "eth0".to_owned())]);
        assert_eq!(&*events(&[r], 0, &ifnames)[0].peer, "10.0.0.2");
        r.family = 0;
        assert!(events(&[r], 0, &ifnames).is_empty(), "unknown family");
    }

    #[test]
    fn an_idle_flows_open_burst_ends_at_its_last_packet() {
        let k = FlowKey {
            src: v4([10, 0, 0, 9]),
            dst: v4([10, 0, 0, 1]),
            ifindex: 3,
            family: AF_INET,
            direction: DIR_INGRESS,
            ..FlowKey::default()
        };
        let v = FlowStats {
            packets: 120,
            burst_start_packets: 100,
            burst_start_ns: 1_000,
            last_seen_ns: 4_000,
            burst_bytes: 30_000,
            ..FlowStats::default()
        };
        let b = unfinished(&k, &v).unwrap();
        assert_eq!(
            (b.start_ns, b.duration_ns, b.bytes, b.packets),
            (1_000, 3_000, 30_000, 20)
        );
        assert_eq!(b.addr, k.src, "ingress: the peer is the source");
        let idle = FlowStats {
            burst_bytes: 0,
            ..v
        };
        assert_eq!(unfinished(&k, &idle), None);
    }

    #[test]
    fn offset_is_realtime_minus_monotonic() {
        let off = realtime_offset_ns();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        let mono = clock_ns(libc::CLOCK_MONOTONIC);
        assert!((mono + off - now).abs() < 50_000_000);
    }
}

#[cfg(test)]
mod cost {
    use super::*;

    /// `cargo test --release -p probe-user burst_events_cost -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement, run in release"]
    fn burst_events_cost() {
        let ifnames = HashMap::from([(3, "veth201a".to_owned())]);
        let recs: Vec<BurstEnd> = (0..40_000u64)
            .map(|i| BurstEnd {
                start_ns: i * 25_000,
                duration_ns: 1000,
                bytes: 100,
                packets: 1,
                addr: [
                    u32::from_ne_bytes([10, 231, 201, 100 + (i % 64) as u8]),
                    0,
                    0,
                    0,
                ],
                ifindex: 3,
                family: probe_ebpf::AF_INET,
                direction: (i % 2) as u8,
                _pad: 0,
            })
            .collect();
        let t = std::time::Instant::now();
        let mut n = 0;
        for _ in 0..20 {
            let ev = events(&recs, 0, &ifnames);
            n += ev.len();
        }
        eprintln!(
            "events(): {:.2} ms per 40,000 records ({n})",
            t.elapsed().as_secs_f64() * 1e3 / 20.0
        );
    }
}

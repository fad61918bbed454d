//! Burst ends streamed by the TC programs through the per-CPU BURST_EVENTS rings
//! (`burst_ring`), one record per ended burst (never per packet): the fine-grained timing a
//! 1 s tick cannot see.
//!
//! A thread (`probe-ring`) drains the rings every DRAIN_CALM, every DRAIN_BUSY while they
//! fill fast, and each tick drains them once more and takes what was read since the last
//! tick. Nothing wakes user space, so a CPU's ring only has to hold 25 ms of that CPU's
//! burst ends on a busy host, not a tick's: 4,096 by default (163,840 a second per CPU).
//!
//! Every record read is folded into its peer's histograms (`BurstRecords`, exact counts);
//! MAX_EVENTS_PER_TICK are kept as events in full, and past that only the newest of each
//! (interface, direction, peer) that the feature stage can use (`burst_records::Limit`), so
//! the features of a busy tick are those of all its bursts; reading stops at twice the cap
//! until the next tick, so a tick's work is bounded even while the programs keep writing.
//! Lost events are counted in two places: the kernel counts records a full ring refused
//! (ERRORS slot BURST_EVENTS_FULL; the program folds those bursts into PEER_BURSTS itself),
//! and this collector counts what it read but could hold no longer (past the cap, more
//! than the tails hold); the ones past the cap that the features do not need are counted
//! apart (thinned). Kernel monotonic times become wall-clock seconds, and interface and
//! peer are named as the flow collector names them.
//!
//! A flow's burst ends only when its next packet comes after the gap. The burst in progress
//! when the flow collector deletes an idle flow (idle for FLOW_IDLE_TIMEOUT, far longer than
//! any burst gap) has ended but no packet will say so: it is handed over from the flow's last
//! reading (`unfinished`), so a job's last burst before a pause is not lost. A flow the full
//! LRU map evicts takes its burst in progress with it (counted in probe_flow_evictions_total).
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, PoisonError,
    },
    thread::JoinHandle,
    time::Duration,
};

use probe_ebpf::{Addr, BurstEnd, FlowKey, FlowStats, DIR_EGRESS, DIR_INGRESS};
use rustc_hash::FxHashMap;

use super::{
    burst_records::{BurstRecords, Limit, Row},
    burst_ring::BurstRing,
    direction_label,
    readings::{ip_from_abi, peer_label},
    tick_bursts::{BurstLabel, TickBurst, TickBursts},
};

/// How often the drain thread empties the rings between ticks: every 100 ms, and every
/// 25 ms once a drain found them more than half full (until one finds them less than an
/// eighth full). Waking 40 times a second cost 0.2% of a core at the bench's 10,000 flows.
pub const DRAIN_CALM: Duration = Duration::from_millis(100);
pub const DRAIN_BUSY: Duration = Duration::from_millis(25);

/// Whether the next drain comes after DRAIN_BUSY, given the last one's and how many
/// records were read of the rings' `capacity` since the thread's last drain.
fn busy_next(busy: bool, read: usize, capacity: usize) -> bool {
    if busy {
        read > capacity / 8
    } else {
        read > capacity / 2
    }
}

/// Events handed over in full per tick (262,144: a parameter server's 1,000 connections
/// each ending a burst every 4 ms); past it, the newest of each key (`Limit`). The
/// features keep a ring per peer and pass a busy peer's surplus through cheaply; 65,536
/// dropped two thirds of the bench's 185,000 a second, and flowgen on another machine made
/// 395,000 a second, a third of them over this cap.
pub const MAX_EVENTS_PER_TICK: usize = 1 << 18;

/// What the drains read since the last tick, and the rings they read it from.
struct Drained {
    ring: BurstRing,
    records: BurstRecords,
    limit: Limit,
    /// Records read since the last tick (reading stops at 2 x MAX_EVENTS_PER_TICK).
    read: usize,
    /// Records read past MAX_EVENTS_PER_TICK and not kept, since start: lost (more than
    /// the tails hold), or thinned (older than their key's newest).
    dropped: u64,
    thinned: u64,
    /// Records read by any drain (the thread's or a tick's) since the thread last looked:
    /// what sets its pace (a tick's drain just before the thread's must not slow it down).
    pace: usize,
}

impl Drained {
    fn drain(&mut self) {
        let Self {
            ring,
            records,
            read,
            pace,
            ..
        } = self;
        let budget = (2 * MAX_EVENTS_PER_TICK).saturating_sub(*read);
        let n = ring.read(budget, |cpu, s| records.fold_slot(cpu, s, true));
        *read += n;
        *pace += n;
    }

    /// The records read since the last tick, their reading finished.
    fn take(&mut self) -> BurstRecords {
        let mut r = std::mem::replace(&mut self.records, BurstRecords::limited(self.limit));
        r.finish();
        self.dropped += r.lost();
        self.thinned += r.thinned();
        self.read = 0;
        r
    }
}

pub struct BurstEventCollector {
    drained: Arc<Mutex<Drained>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn lock(m: &Mutex<Drained>) -> std::sync::MutexGuard<'_, Drained> {
    // A panic in a drain leaves the records consistent (each is pushed whole).
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl BurstEventCollector {
    /// Starts the drain thread. Without a thread (the system refused one) the ticks still
    /// drain, and a ring too small for a tick loses events (counted). `events_per_peer`:
    /// what the feature stage keeps of a peer's bursts (`features.events_per_peer`).
    pub fn new(ring: BurstRing, events_per_peer: usize) -> Self {
        let limit = Limit {
            cap: MAX_EVENTS_PER_TICK,
            per_key: events_per_peer + 1,
        };
        let drained = Arc::new(Mutex::new(Drained {
            ring,
            records: BurstRecords::limited(limit),
            limit,
            read: 0,
            dropped: 0,
            thinned: 0,
            pace: 0,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (d, s) = (drained.clone(), stop.clone());
        let capacity = lock(&drained).ring.capacity();
        let thread = std::thread::Builder::new()
            .name("probe-ring".into())
            .spawn(move || {
                let mut busy = false;
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(if busy { DRAIN_BUSY } else { DRAIN_CALM });
                    let n = {
                        let mut d = lock(&d);
                        d.drain();
                        std::mem::take(&mut d.pace)
                    };
                    busy = busy_next(busy, n, capacity);
                }
            })
            .map_err(|e| {
                tracing::warn!("burst events: no drain thread ({e}); draining once a tick")
            })
            .ok();
        Self {
            drained,
            stop,
            thread,
        }
    }

    /// Drains the rings once more and takes the records read since the last tick: the
    /// per-peer folds of all of them, and as events MAX_EVENTS_PER_TICK of them and the
    /// newest of each key past that.
    pub fn take(&mut self) -> BurstRecords {
        let mut d = lock(&self.drained);
        d.drain();
        d.take()
    }

    /// Events read past the per-tick cap and not kept, since start: (lost, thinned).
    pub fn dropped(&self) -> (u64, u64) {
        let d = lock(&self.drained);
        (d.dropped, d.thinned)
    }
}

impl Drop for BurstEventCollector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
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

/// A start as wall-clock seconds. Saturating, not `as i64`: a time past i64::MAX (only
/// ever garbage) would wrap negative and break the start order `events` sorts by.
fn start_unix(start_ns: u64, offset_ns: i64) -> f64 {
    i64::try_from(start_ns)
        .unwrap_or(i64::MAX)
        .saturating_add(offset_ns) as f64
        * 1e-9
}

/// The indices of `records`' rows in start order; equal starts (rare) in the order of the
/// rest of the key (rows equal in all of it are the same burst twice, and either order is
/// the same output).
fn start_order(records: &BurstRecords) -> Vec<u32> {
    let (lo, hi) = records.rows().iter().fold((u64::MAX, 0), |(lo, hi), r| {
        (lo.min(r.start_ns), hi.max(r.start_ns))
    });
    // A tick's starts span a second or two: as offsets from the first they fit a u32, and
    // the sort moves (u32, u32) pairs, half the bytes of (u64, u32) ones.
    if u32::try_from(hi.saturating_sub(lo)).is_ok() {
        sorted_by(records, |r| (r.start_ns - lo) as u32)
    } else {
        sorted_by(records, |r| r.start_ns)
    }
}

/// `start_order` by `key`, which orders rows as their starts do. Sorted as (key, index)
/// pairs, not as rows: a tick's 30,000 rows are 1.2 MB. A radix sort, which skips the
/// bytes all keys share: it was a third of the cost of a comparison sort, stable or not, on
/// nearly sorted starts (they come in end order).
fn sorted_by<K: radsort::Key + PartialEq>(
    records: &BurstRecords,
    key: impl Fn(&Row) -> K,
) -> Vec<u32> {
    let rows = records.rows();
    let mut order: Vec<(K, u32)> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (key(r), i as u32))
        .collect();
    radsort::sort_by_key(&mut order, |p| p.0);
    let tie = |i: u32| {
        let k = records.key(&rows[i as usize]);
        (k.ifindex, k.direction, k.family, k.addr)
    };
    for run in order.chunk_by_mut(|a, b| a.0 == b.0) {
        if run.len() > 1 {
            run.sort_by_key(|p| tie(p.1));
        }
    }
    order.into_iter().map(|(_, i)| i).collect()
}

/// The tick's events of `records`, in start order (ties by interface index, direction,
/// address), each (interface, direction, peer) named once. Records of interfaces not in
/// `ifnames` (detached this tick) or of an unknown address family are left out. The tick's
/// time is set by the collect stage once it is known.
pub fn events(
    records: &BurstRecords,
    offset_ns: i64,
    ifnames: &HashMap<u32, String>,
) -> TickBursts {
    let rows = records.rows();
    let order = start_order(records);
    let directions: [Arc<str>; 2] = [DIR_INGRESS, DIR_EGRESS].map(|d| direction_label(d).into());
    let mut ifaces: FxHashMap<u32, Option<Arc<str>>> = FxHashMap::default();
    let mut peers: FxHashMap<(u8, Addr), Option<Arc<str>>> = FxHashMap::default();
    // Each key's label index once named (None inside: it cannot be named), in the order of
    // the keys' first events.
    let mut named: Vec<Option<Option<u32>>> = vec![None; records.keys().len()];
    let mut labels = Vec::new();
    let mut events = Vec::with_capacity(rows.len());
    for r in order.iter().map(|&i| &rows[i as usize]) {
        let label = *named[r.key as usize].get_or_insert_with(|| {
            let k = records.key(r);
            let iface = ifaces
                .entry(k.ifindex)
                .or_insert_with(|| ifnames.get(&k.ifindex).map(|n| n.as_str().into()))
                .clone()?;
            let peer = peers
                .entry((k.family, k.addr))
                .or_insert_with(|| ip_from_abi(k.family, &k.addr).map(|ip| peer_label(ip).into()))
                .clone()?;
            let direction = directions[usize::from(k.direction == DIR_EGRESS)].clone();
            labels.push(BurstLabel {
                iface,
                direction,
                peer,
            });
            Some(labels.len() as u32 - 1)
        });
        let Some(label) = label else {
            continue;
        };
        events.push(TickBurst {
            label,
            start_unix: start_unix(r.start_ns, offset_ns),
            duration_s: r.duration_ns as f64 * 1e-9,
            bytes: r.bytes,
            packets: r.packets,
        });
    }
    // Sorted by start_ns above; start_unix is monotone in it (an integer sum, then a
    // conversion and a product that round monotonically).
    debug_assert!(TickBursts::in_start_order(&events));
    TickBursts {
        labels,
        events,
        tick_unix: 0.0,
        sorted: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drains speed up once the rings are half full and slow down below an eighth: a
    /// steady rate between the two keeps either pace.
    #[test]
    fn the_drain_speeds_up_when_the_rings_fill() {
        let cap = 8192;
        assert!(!busy_next(false, 4096, cap));
        assert!(busy_next(false, 4097, cap));
        // 28,000 burst ends a second: 2,800 per 100 ms drain, calm stays calm.
        assert!(!busy_next(false, 2800, cap));
        // 222,000 a second: 5,550 per 25 ms drain, busy stays busy.
        assert!(busy_next(true, 5550, cap));
        assert!(busy_next(true, 1025, cap));
        assert!(!busy_next(true, 1024, cap));
    }
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
            let ev = events(&BurstRecords::folded(&recs), offset, &ifnames).to_events();
            assert_eq!(ev.len(), 2);
            assert!(ev[0].start_unix <= ev[1].start_unix, "{offset}: {ev:?}");
        }
    }

    /// Equal starts come out in the order of the rest of the key (interface index,
    /// direction, family, address), whatever order the ring had them in.
    #[test]
    fn equal_starts_are_ordered_by_their_key() {
        let ifnames = HashMap::from([(3, "eth0".to_owned()), (4, "eth1".to_owned())]);
        let mut ingress = record(7, 3, [10, 0, 0, 1]);
        ingress.direction = DIR_INGRESS;
        let recs = [
            record(7, 4, [10, 0, 0, 1]),
            record(7, 3, [10, 0, 0, 9]),
            record(9, 3, [10, 0, 0, 1]),
            record(7, 3, [10, 0, 0, 2]),
            ingress,
        ];
        let ev = events(&BurstRecords::folded(&recs), 0, &ifnames).to_events();
        let got: Vec<(&str, &str, &str)> = ev
            .iter()
            .map(|e| (&*e.iface, &*e.direction, &*e.peer))
            .collect();
        assert_eq!(
            got,
            [
                ("eth0", "ingress", "10.0.0.1"),
                ("eth0", "egress", "10.0.0.2"),
                ("eth0", "egress", "10.0.0.9"),
                ("eth1", "egress", "10.0.0.1"),
                ("eth0", "egress", "10.0.0.1"),
            ]
        );
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
        let ev = events(&BurstRecords::folded(&recs), offset, &ifnames).to_events();
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
        assert_eq!(
            &*events(&BurstRecords::folded(&[r]), 0, &ifnames).to_events()[0].peer,
            "10.0.0.2"
        );
        r.family = 0;
        assert!(
            events(&BurstRecords::folded(&[r]), 0, &ifnames)
                .events
                .is_empty(),
            "unknown family"
        );
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

    /// `n` records of the bench's 64 peers, nearly sorted as they arrive: in end order,
    /// starts `step_ns` apart and up to 3 ms early; `direction` of the i-th.
    fn arriving(n: u64, step_ns: u64, direction: impl Fn(u64) -> u8) -> Vec<BurstEnd> {
        (0..n)
            .map(|i| BurstEnd {
                start_ns: 10_000_000 + i * step_ns
                    - (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) % 3_000_000,
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
                direction: direction(i),
                _pad: 0,
            })
            .collect()
    }

    /// `cargo test --release -p probe-user thinning_cost -- --ignored --nocapture`: a busy
    /// tick of 411,000 records over 128 keys (the bench's high-rate phase at a 2 s tick), as
    /// the drain files them past the cap: kept per key (`Limit`) or only folded.
    #[test]
    #[ignore = "a measurement, run in release"]
    fn thinning_cost() {
        let ifnames = HashMap::from([(3, "veth201a".to_owned())]);
        let recs = arriving(411_000, 4_800, |i| (i / 64 % 2) as u8);
        let limit = Limit {
            cap: MAX_EVENTS_PER_TICK,
            per_key: 513,
        };
        for _ in 0..8 {
            for thin in [false, true] {
                let t = std::time::Instant::now();
                let mut r = if thin {
                    BurstRecords::limited(limit)
                } else {
                    BurstRecords::default()
                };
                for (i, x) in recs.iter().enumerate() {
                    r.fold(x, thin || i < MAX_EVENTS_PER_TICK);
                }
                r.finish();
                let filed = t.elapsed();
                let n = events(&r, 0, &ifnames).events.len();
                eprintln!(
                    "thin {thin}: filed {:.2} ms, with events {:.2} ms ({n} events, {} thinned)",
                    filed.as_secs_f64() * 1e3,
                    t.elapsed().as_secs_f64() * 1e3,
                    r.thinned()
                );
            }
        }
    }

    /// `cargo test --release -p probe-user burst_events_cost -- --ignored --nocapture`:
    /// a tick of the bench's shape (64 peers, both directions), as the drain files it (and,
    /// beside it, filed by hashing each key) and as the tick names it.
    #[test]
    #[ignore = "a measurement, run in release"]
    fn burst_events_cost() {
        let ifnames = HashMap::from([(3, "veth201a".to_owned())]);
        let recs = arriving(40_000, 25_000, |i| (i % 2) as u8);
        // As the rings hand them over: two CPUs, each series in one slot of each.
        let slots: Vec<(usize, probe_ebpf::BurstSlot)> = recs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let series_slot = 1 + (i % 128) as u32 * 7;
                let (end, _pad) = (*r, 0);
                (
                    i / 7 % 2,
                    probe_ebpf::BurstSlot {
                        end,
                        series_slot,
                        _pad,
                    },
                )
            })
            .collect();
        let zero = std::time::Duration::ZERO;
        let (mut by_key, mut filed, mut named) = (zero, zero, zero);
        let mut n = 0;
        for _ in 0..20 {
            let t = std::time::Instant::now();
            std::hint::black_box(BurstRecords::folded(&recs));
            by_key += t.elapsed();
            let t = std::time::Instant::now();
            let mut records = BurstRecords::default();
            for (cpu, s) in &slots {
                records.fold_slot(*cpu, s, true);
            }
            filed += t.elapsed();
            let t = std::time::Instant::now();
            n += events(&records, 0, &ifnames).events.len();
            named += t.elapsed();
        }
        eprintln!(
            "per 40,000 records: filed by key {:.2} ms, by slot hint {:.2} ms; named and sorted {:.2} ms ({n})",
            by_key.as_secs_f64() * 1e3 / 20.0,
            filed.as_secs_f64() * 1e3 / 20.0,
            named.as_secs_f64() * 1e3 / 20.0
        );
    }
}

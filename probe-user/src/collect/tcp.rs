//! Reads sock_ops' per-peer TCP counters each tick, summing them over CPUs and over the two
//! places they live (each CPU's slot table PEER_SLOTS, and PEER_TCP for a peer that found no
//! slot there): the per-peer RTT histogram and retransmitted segments, the open
//! connections, and the tick's smoothed and minimum RTT. The connection map itself is walked
//! less often (conns.rs).
//!
//! The tick's RTT extremes live in two windows per entry, selected by an epoch this collector
//! writes to TCP_EPOCH before each read: the callbacks move on to the other window while
//! the one of the tick that ended is read (PeerTcp::windows).
use std::net::IpAddr;

use aya::maps::{Array, MapData, PerCpuArray, PerCpuHashMap};
use probe_ebpf::{PeerKey, PeerSlot, PeerTcp, LOG2_BUCKETS};
use rustc_hash::FxHashMap;

use super::readings::{ip_from_abi, peer_label, Histogram, PeerSeries};
use super::{batch::MapReader, delta::DeltaTotals};

const COUNT: usize = LOG2_BUCKETS;
const SUM_US: usize = LOG2_BUCKETS + 1;
const RETRANS_SEGS: usize = LOG2_BUCKETS + 2;

/// A peer's round trips in one tick: how many, the largest smoothed RTT a connection left at
/// one of them (as the connection-map walk reported before: the slowest active connection),
/// and the smallest minimum RTT.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Rtt {
    samples: u64,
    srtt_us: u32,
    min_rtt_us: Option<u32>,
}

impl Rtt {
    fn merge(self, o: Rtt) -> Rtt {
        Rtt {
            samples: self.samples + o.samples,
            srtt_us: self.srtt_us.max(o.srtt_us),
            min_rtt_us: match (self.min_rtt_us, o.min_rtt_us) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }

    fn srtt_seconds(&self) -> Option<f64> {
        (self.samples > 0).then_some(self.srtt_us as f64 * 1e-6)
    }
}

/// One entry's per-CPU values folded: the counters summed (as DeltaTotals takes them:
/// buckets, count, sum, retransmitted segments, retransmit events), the connections opened
/// and closed, and the RTT window of tick `epoch`.
#[derive(Debug, Default, PartialEq)]
struct Folded {
    counters: Vec<u64>,
    opened: u64,
    closed: u64,
    rtt: Rtt,
}

impl Folded {
    /// Open connections. A socket may open on one CPU and close on another, or open counted
    /// in a slot and close in PEER_TCP (its slots on that CPU were taken), so only a peer's
    /// sum over all its entries means anything; an entry the LRU map recreated can see
    /// closes of connections opened before it.
    fn open(&self) -> u64 {
        self.opened.saturating_sub(self.closed)
    }

    /// Adds another entry of the same peer (the counters stay with their own entry).
    fn merge(&mut self, o: &Folded) {
        self.opened += o.opened;
        self.closed += o.closed;
        self.rtt = self.rtt.merge(o.rtt);
    }
}

fn fold(per_cpu: &[PeerTcp], epoch: u32) -> Folded {
    let mut counters = vec![0u64; LOG2_BUCKETS + 4];
    let (mut opened, mut closed) = (0u64, 0u64);
    let mut rtt = Rtt::default();
    for v in per_cpu {
        for (c, b) in counters.iter_mut().zip(&v.rtt_buckets) {
            *c += b;
        }
        counters[COUNT] += v.rtt_count;
        counters[SUM_US] += v.rtt_sum_us;
        counters[RETRANS_SEGS] += v.retrans_segs;
        counters[LOG2_BUCKETS + 3] += v.retrans_events;
        opened += v.opened;
        closed += v.closed;
        let w = &v.windows[(epoch & 1) as usize];
        if w.epoch == epoch {
            rtt = rtt.merge(Rtt {
                samples: w.samples.into(),
                srtt_us: w.srtt_us,
                // The kernel's "no sample yet" is ~0.
                min_rtt_us: (w.min_rtt_us > 0 && w.min_rtt_us != u32::MAX).then_some(w.min_rtt_us),
            });
        }
    }
    Folded {
        counters,
        opened,
        closed,
        rtt,
    }
}

/// Where a peer's counters were read: PEER_TCP, or one CPU's slot (1 + cpu x slots + index).
/// Each place is its own DeltaTotals entry: a slot never restarts, a PEER_TCP entry may.
type Place = u32;

pub struct TcpCollector {
    slots: PerCpuArray<MapData, PeerSlot>,
    slot_reader: MapReader<u32, PeerSlot>,
    peers: PerCpuHashMap<MapData, PeerKey, PeerTcp>,
    reader: MapReader<PeerKey, PeerTcp>,
    epoch_map: Array<MapData, u32>,
    /// The epoch the callbacks are writing now.
    epoch: u32,
    cpus: usize,
    totals: DeltaTotals<(PeerKey, Place), IpAddr>,
    /// Each peer's round trips of its last tick with any, reported while it has open
    /// connections and no new round trip.
    last: FxHashMap<IpAddr, Rtt>,
}

impl TcpCollector {
    pub fn new(
        cpus: usize,
        slots: PerCpuArray<MapData, PeerSlot>,
        slot_reader: MapReader<u32, PeerSlot>,
        peers: PerCpuHashMap<MapData, PeerKey, PeerTcp>,
        reader: MapReader<PeerKey, PeerTcp>,
        mut epoch_map: Array<MapData, u32>,
    ) -> anyhow::Result<Self> {
        let epoch = 1;
        epoch_map.set(0, epoch, 0)?;
        Ok(Self {
            slots,
            slot_reader,
            peers,
            reader,
            epoch_map,
            epoch,
            cpus,
            totals: DeltaTotals::default(),
            last: FxHashMap::default(),
        })
    }

    /// Per-peer series of the tick that just ended.
    pub fn tick(&mut self) -> Vec<PeerSeries> {
        let ended = self.epoch;
        self.epoch = ended.wrapping_add(1);
        if let Err(e) = self.epoch_map.set(0, self.epoch, 0) {
            // The callbacks keep writing the ended window: the next read sees stale RTTs.
            tracing::warn!("cannot advance TCP_EPOCH: {e}");
        }
        let cpus = self.cpus;
        let mut peers: FxHashMap<IpAddr, Folded> = FxHashMap::default();
        let totals = &mut self.totals;
        let mut add = |k: &PeerKey, place: Place, per_cpu: &[PeerTcp]| {
            let Some(peer) = ip_from_abi(k.family, &k.addr) else {
                return;
            };
            let mut f = fold(per_cpu, ended);
            totals.add((*k, place), peer, std::mem::take(&mut f.counters));
            peers.entry(peer).or_default().merge(&f);
        };
        let n = self.slots.len();
        self.slot_reader
            .for_each_per_cpu_array(cpus, &self.slots, |&i, per_cpu| {
                // Each CPU takes its slots on its own: slot i may be a different peer on each.
                for (cpu, s) in per_cpu.iter().enumerate() {
                    if s.key.family != 0 {
                        let place = 1 + (cpu as u32).wrapping_mul(n).wrapping_add(i);
                        add(&s.key, place, std::slice::from_ref(&s.tcp));
                    }
                }
            });
        self.reader
            .for_each_per_cpu_map(cpus, &self.peers, |k, per_cpu| add(k, 0, per_cpu));
        self.totals.finish();
        let mut now: FxHashMap<IpAddr, (u64, Rtt)> = peers
            .into_iter()
            .map(|(peer, f)| (peer, (f.open(), f.rtt)))
            .collect();

        let last = &mut self.last;
        for (peer, (open, rtt)) in now.iter_mut() {
            if rtt.samples > 0 {
                last.insert(*peer, *rtt);
            } else if *open > 0 {
                *rtt = last.get(peer).copied().unwrap_or_default();
            }
        }
        last.retain(|p, _| now.get(p).is_some_and(|(open, _)| *open > 0));

        let series = |peer: IpAddr, open: u64, rtt: Rtt, t: Option<&Vec<u64>>| PeerSeries {
            peer: peer_label(peer),
            srtt_seconds: rtt.srtt_seconds(),
            min_rtt_seconds: rtt.min_rtt_us.map(|us| us as f64 * 1e-6),
            connections: open.try_into().unwrap_or(u32::MAX),
            rtt: match t {
                Some(t) => Histogram::from_log2(&t[..COUNT], t[SUM_US], 1e-6),
                None => Histogram::from_log2(&[0; LOG2_BUCKETS], 0, 1e-6),
            },
            retransmits: t.map_or(0, |t| t[RETRANS_SEGS]),
            // The sockets' dump fills them (sockets.rs).
            receive_queue_bytes: None,
            send_queue_bytes: None,
            socket_sent_bytes: 0,
            socket_received_bytes: 0,
        };
        let mut out: Vec<PeerSeries> = self
            .totals
            .totals()
            .iter()
            .map(|(peer, t)| {
                let (open, rtt) = now.remove(peer).unwrap_or_default();
                series(*peer, open, rtt, Some(t))
            })
            .collect();
        // Peers with open connections or a round trip whose counters have been idle longer
        // than DeltaTotals keeps a series.
        out.extend(
            now.into_iter()
                .filter(|(_, (open, rtt))| *open > 0 || rtt.samples > 0)
                .map(|(peer, (open, rtt))| series(peer, open, rtt, None)),
        );
        out.sort_by(|a, b| a.peer.cmp(&b.peer));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use probe_ebpf::RttWindow;

    fn cpu(opened: u64, closed: u64, window: Option<(u32, u32, u32, u32)>) -> PeerTcp {
        let mut v = PeerTcp {
            opened,
            closed,
            rtt_count: 1,
            ..PeerTcp::default()
        };
        if let Some((epoch, samples, srtt_us, min_rtt_us)) = window {
            v.windows[(epoch & 1) as usize] = RttWindow {
                epoch,
                samples,
                srtt_us,
                min_rtt_us,
            };
        }
        v
    }

    #[test]
    fn a_connection_may_open_on_one_cpu_and_close_on_another() {
        let f = fold(&[cpu(3, 0, None), cpu(0, 2, None)], 5);
        assert_eq!((f.open(), f.counters[COUNT]), (1, 2));
        // A recreated entry that sees more closes than opens reports none open, not a wrap.
        assert_eq!(fold(&[cpu(0, 2, None)], 5).open(), 0);
        // Opened in a slot, closed in PEER_TCP: the peer's sum is what counts.
        let mut slot = fold(&[cpu(2, 0, None)], 5);
        slot.merge(&fold(&[cpu(0, 1, None), cpu(0, 1, None)], 5));
        assert_eq!(slot.open(), 0);
    }

    #[test]
    fn only_the_ended_ticks_window_counts() {
        // CPU 0 and 3 wrote the ended tick (5), CPU 1 only an older one (3, same parity),
        // CPU 2 already the next (6).
        let f = fold(
            &[
                cpu(1, 0, Some((5, 2, 900, 400))),
                cpu(1, 0, Some((3, 9, 90_000, 100))),
                cpu(1, 0, Some((6, 1, 7_000, 50))),
                cpu(0, 0, Some((5, 1, 1_000, 300))),
            ],
            5,
        );
        assert_eq!(
            f.rtt,
            Rtt {
                samples: 3,
                srtt_us: 1_000,
                min_rtt_us: Some(300)
            }
        );
        assert_eq!(f.rtt.srtt_seconds(), Some(0.001));
        // No sample yet: the kernel's "no minimum" is not a minimum.
        let h = fold(&[cpu(1, 0, Some((5, 1, 900, u32::MAX)))], 5);
        assert_eq!(h.rtt.min_rtt_us, None);
        assert_eq!(fold(&[cpu(1, 0, None)], 5).rtt.srtt_seconds(), None);
    }
}

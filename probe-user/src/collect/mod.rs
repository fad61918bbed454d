//! Collectors: each reads one part of the kernel's state once per tick. `Collector::tick`
//! runs them all and assembles the snapshot.
pub mod assemble;
pub mod batch;
pub mod burst_events;
pub mod bursts;
pub mod delta;
pub mod drops;
pub mod flows;
pub mod netlink;
pub mod progstats;
pub mod rdma;
pub mod sojourn;
pub mod tcp;
pub mod top;

use std::{collections::HashMap, time::Duration};

use anyhow::{Context as _, Result};
use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    Ebpf,
};
use probe_ebpf::{errors, names, DIR_EGRESS};

use crate::snapshot::{
    ip_from_abi, peer_label, BurstSeries, DropSeries, FlowDetail, FlowSeries, MapFull, NonIpSeries,
    Snapshot, SojournSeries,
};

/// Flows idle this long are removed from the kernel map after their last count is read.
const FLOW_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Collector {
    flows: flows::FlowCollector,
    tcp: tcp::TcpCollector,
    bursts: bursts::BurstCollector,
    burst_events: burst_events::BurstEventCollector,
    drops: drops::DropCollector,
    sojourn: sojourn::SojournCollector,
    errors: PerCpuArray<MapData, u64>,
}

pub fn direction_label(d: u8) -> &'static str {
    if d == DIR_EGRESS {
        "egress"
    } else {
        "ingress"
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of bpf_ktime_get_ns.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Collector {
    /// Takes the maps out of the loaded object: the collector owns them from here on.
    pub fn new(ebpf: &mut Ebpf, drop_names: HashMap<u32, String>) -> Result<Self> {
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .with_context(|| format!("map {name} missing from the object"))
        };
        let flow_map = take(names::FLOWS)?;
        let flow_reader = batch::MapReader::new(batch::dup_fd(&flow_map));
        let flow_map = BpfHashMap::try_from(flow_map)?;
        let nonip = PerCpuHashMap::try_from(take(names::NONIP)?)?;
        let conns = take(names::CONNS)?;
        let conn_reader = batch::MapReader::new(batch::dup_fd(&conns));
        let conns = BpfHashMap::try_from(conns)?;
        let peers = take(names::PEER_TCP)?;
        let peer_reader = batch::MapReader::new(batch::dup_fd(&peers));
        let peers = BpfHashMap::try_from(peers)?;
        let bursts = take(names::PEER_BURSTS)?;
        let burst_reader = batch::MapReader::new(batch::dup_fd(&bursts));
        let bursts = BpfHashMap::try_from(bursts)?;
        let drops = PerCpuHashMap::try_from(take(names::DROPS)?)?;
        let sojourn = BpfHashMap::try_from(take(names::QDISC_SOJOURN)?)?;
        let errors = PerCpuArray::try_from(take(names::ERRORS)?)?;
        let ring = RingBuf::try_from(take(names::BURST_EVENTS)?)?;
        Ok(Self {
            bursts: bursts::BurstCollector::new(bursts, burst_reader),
            burst_events: burst_events::BurstEventCollector::new(ring),
            drops: drops::DropCollector::new(drops, drop_names),
            sojourn: sojourn::SojournCollector::new(sojourn),
            errors,
            flows: flows::FlowCollector::new(
                flow_map,
                flow_reader,
                nonip,
                FLOW_IDLE_TIMEOUT.as_nanos() as u64,
            ),
            tcp: tcp::TcpCollector::new(conns, conn_reader, peers, peer_reader),
        })
    }

    /// One pass over the maps. `ifnames` names the interfaces by index; traffic of an
    /// interface not in it (detached this tick) is left out.
    pub fn tick(&mut self, ifnames: &HashMap<u32, String>) -> Snapshot {
        let mut snap = Snapshot::default();
        let ft = self.flows.tick(monotonic_ns());
        for (k, t) in ft.totals {
            let Some(iface) = ifnames.get(&k.ifindex) else {
                continue;
            };
            snap.flows.push(FlowSeries {
                iface: iface.clone(),
                direction: direction_label(k.direction),
                peer: peer_label(k.peer),
                bytes: t.bytes,
                packets: t.packets,
                ce_packets: t.ce_packets,
                ect_packets: t.ect_packets,
            });
        }
        for (k, v) in ft.nonip {
            let Some(iface) = ifnames.get(&k.ifindex) else {
                continue;
            };
            snap.nonip.push(NonIpSeries {
                iface: iface.clone(),
                direction: direction_label(k.direction),
                bytes: v.bytes,
                packets: v.packets,
            });
        }
        for (tick_bytes, k, v) in ft.top {
            let (Some(iface), Some(src), Some(dst)) = (
                ifnames.get(&k.ifindex),
                ip_from_abi(k.family, &k.src),
                ip_from_abi(k.family, &k.dst),
            ) else {
                continue;
            };
            snap.top_flows.push(FlowDetail {
                iface: iface.clone(),
                direction: direction_label(k.direction),
                proto: k.proto,
                src: peer_label(src),
                dst: peer_label(dst),
                sport: k.sport,
                dport: k.dport,
                tick_bytes,
                bytes: v.bytes,
                packets: v.packets,
                bursts: v.bursts,
                burst_bytes: v.burst_bytes,
                last_burst_bytes: v.last_burst_bytes,
                last_burst_seconds: v.last_burst_ns as f64 * 1e-9,
                max_burst_bytes: v.max_burst_bytes,
            });
        }
        snap.flows_tracked = ft.tracked;
        snap.flow_evictions = ft.evictions;
        let mut ended = self.burst_events.drain();
        ended.extend(
            ft.removed
                .iter()
                .filter_map(|(k, v)| burst_events::unfinished(k, v)),
        );
        snap.burst_events =
            burst_events::events(&ended, burst_events::realtime_offset_ns(), ifnames);
        snap.flows.sort_by(|a, b| {
            (&a.iface, a.direction, &a.peer).cmp(&(&b.iface, b.direction, &b.peer))
        });
        snap.nonip
            .sort_by(|a, b| (&a.iface, a.direction).cmp(&(&b.iface, b.direction)));
        (snap.peers, snap.slow_connections) = self.tcp.tick();
        snap.conn_evictions = self.tcp.evictions();
        for (k, b) in self.bursts.tick() {
            let Some(iface) = ifnames.get(&k.ifindex) else {
                continue;
            };
            snap.bursts.push(BurstSeries {
                iface: iface.clone(),
                direction: direction_label(k.direction),
                peer: peer_label(k.peer),
                count: b.count,
                bytes: b.sizes,
                duration: b.durations,
            });
        }
        snap.bursts.sort_by(|a, b| {
            (&a.iface, a.direction, &a.peer).cmp(&(&b.iface, b.direction, &b.peer))
        });
        for (ifindex, h) in self.sojourn.tick() {
            if let Some(iface) = ifnames.get(&ifindex) {
                snap.sojourn.push(SojournSeries {
                    iface: iface.clone(),
                    seconds: h,
                });
            }
        }
        snap.sojourn.sort_by(|a, b| a.iface.cmp(&b.iface));
        snap.drops = self
            .drops
            .tick()
            .into_iter()
            .map(|(reason, packets)| DropSeries { reason, packets })
            .collect();
        snap.map_full = progstats::map_full(&self.errors)
            .into_iter()
            .map(|(map, n)| MapFull {
                map,
                inserts_refused: n,
            })
            .collect();
        let ring_full = snap
            .map_full
            .get(errors::BURST_EVENTS_FULL as usize)
            .map_or(0, |m| m.inserts_refused);
        snap.events_lost = ring_full + self.burst_events.dropped();
        snap
    }

    /// Forgets everything about an interface that went away.
    pub fn forget_interface(&mut self, ifindex: u32) {
        self.flows.forget_interface(ifindex);
        self.bursts.forget_interface(ifindex);
        self.sojourn.forget_interface(ifindex);
    }
}

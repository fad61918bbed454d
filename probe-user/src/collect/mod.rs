//! Collectors: each reads one part of the kernel's state once per tick. `Collector::tick`
//! runs them all and assembles the snapshot.
pub mod batch;
pub mod burst_events;
pub mod burst_records;
pub mod burst_ring;
pub mod bursts;
pub mod conns;
pub mod delta;
pub mod drops;
pub mod flows;
pub mod jobs;
pub mod mapping;
pub mod netlink;
pub mod progstats;
pub mod rdma;
pub mod readings;
pub mod series;
pub mod sockets;
pub mod sojourn;
pub mod sources;
pub mod tcp;
pub mod tick_bursts;
pub mod top;

use std::{collections::HashMap, time::Duration};

use anyhow::{Context as _, Result};
use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap},
    Ebpf,
};
use probe_ebpf::{errors, names, DIR_EGRESS};

use self::readings::{
    ip_from_abi, peer_label, BurstSeries, DropSeries, FlowDetail, FlowSeries, MapFull, NonIpSeries,
    Readings, SojournSeries,
};
use self::{burst_records::BurstRecords, burst_ring::BurstRing};
use crate::bpf::select;

/// Flows idle this long are removed from the kernel map after their last count is read.
const FLOW_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Collector {
    series: series::SeriesCounters,
    flows: flows::FlowCollector,
    tcp: tcp::TcpCollector,
    conns: conns::ConnWalk,
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

/// Maps the burst-end rings, sized as the loader left them (records per CPU: the array's
/// entries over the possible CPUs).
fn burst_ring(slots: aya::maps::Map, pos: aya::maps::Map, cpus: usize) -> Result<BurstRing> {
    let (aya::maps::Map::Array(slots), aya::maps::Map::Array(pos)) = (slots, pos) else {
        anyhow::bail!("the burst-end rings are not arrays");
    };
    let entries = slots.info().context("BURST_EVENTS")?.max_entries();
    let records = entries / u32::try_from(cpus.max(1)).unwrap_or(u32::MAX);
    BurstRing::new(&slots, &pos, cpus, records)
}

/// The selection walks (bpf::select) and the arrays they write to.
fn selection(ebpf: &mut Ebpf) -> Result<(flows::FlowSelect, conns::ConnSelect)> {
    let flow_walk = select::walk(ebpf, names::FLOW_SELECT)?;
    let conn_walk = select::walk(ebpf, names::CONN_SELECT)?;
    let mut array = |name: &str| match ebpf.take_map(name) {
        Some(aya::maps::Map::Array(d)) => Ok(d),
        _ => Err(anyhow::anyhow!("array {name} missing from the object")),
    };
    let (picks, summary) = (array(names::FLOW_PICKS)?, array(names::FLOW_WALK)?);
    let (conn_picks, conn_summary) = (array(names::CONN_PICKS)?, array(names::CONN_WALK)?);
    Ok((
        flows::FlowSelect::new(flow_walk, &picks, &summary)?,
        conns::ConnSelect::new(conn_walk, conn_picks, &conn_summary)?,
    ))
}

impl Collector {
    /// Takes the maps out of the loaded object: the collector owns them from here on.
    /// `flow_scan_ticks`: ticks between walks of the per-flow map (see flows.rs).
    /// `events_per_peer`: what the feature stage keeps of a peer's bursts.
    /// `select`: the selection walks are loaded (bpf::select): the walks of FLOWS and CONNS
    /// select in the kernel.
    pub fn new(
        ebpf: &mut Ebpf,
        drop_names: HashMap<u32, String>,
        flow_scan_ticks: u64,
        events_per_peer: usize,
        select: bool,
    ) -> Result<Self> {
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .with_context(|| format!("map {name} missing from the object"))
        };
        let flow_map = take(names::FLOWS)?;
        let flow_reader = batch::MapReader::new(batch::dup_fd(&flow_map));
        let flow_map = BpfHashMap::try_from(flow_map)?;
        let flow_epoch = aya::maps::Array::try_from(take(names::FLOW_EPOCH)?)?;
        let flow_inserts = PerCpuArray::try_from(take(names::FLOW_INSERTS)?)?;
        let nonip = PerCpuHashMap::try_from(take(names::NONIP)?)?;
        let cpus =
            aya::util::nr_cpus().map_err(|(path, e)| anyhow::anyhow!("reading {path}: {e}"))?;
        let slots = take(names::SERIES_SLOTS)?;
        let slot_reader = batch::MapReader::new(batch::dup_fd(&slots));
        let slots = PerCpuArray::try_from(slots)?;
        let overflow = take(names::SERIES)?;
        let overflow_reader = batch::MapReader::new(batch::dup_fd(&overflow));
        let overflow = PerCpuHashMap::try_from(overflow)?;
        let conns = take(names::CONNS)?;
        let conn_reader = batch::MapReader::new(batch::dup_fd(&conns));
        let conns = BpfHashMap::try_from(conns)?;
        let peer_slots = take(names::PEER_SLOTS)?;
        let peer_slot_reader = batch::MapReader::new(batch::dup_fd(&peer_slots));
        let peer_slots = PerCpuArray::try_from(peer_slots)?;
        let peers = take(names::PEER_TCP)?;
        let peer_reader = batch::MapReader::new(batch::dup_fd(&peers));
        let peers = PerCpuHashMap::try_from(peers)?;
        let tcp_epoch = aya::maps::Array::try_from(take(names::TCP_EPOCH)?)?;
        let conn_floor = aya::maps::Array::try_from(take(names::CONN_FLOOR)?)?;
        let bursts = take(names::PEER_BURSTS)?;
        let burst_reader = batch::MapReader::new(batch::dup_fd(&bursts));
        let bursts = BpfHashMap::try_from(bursts)?;
        let drops = PerCpuHashMap::try_from(take(names::DROPS)?)?;
        let sojourn = BpfHashMap::try_from(take(names::QDISC_SOJOURN)?)?;
        let errors = PerCpuArray::try_from(take(names::ERRORS)?)?;
        let ring = burst_ring(
            take(names::BURST_EVENTS)?,
            take(names::BURST_EVENTS_POS)?,
            cpus,
        )?;
        let selection = if select {
            selection(ebpf).map_err(|e| {
                tracing::warn!(
                    "the flow and connection maps are walked with batch lookups (every entry copied): {e:#}"
                )
            }).ok()
        } else {
            None
        };
        let mut collector = Self {
            series: series::SeriesCounters::new(
                cpus,
                slots,
                slot_reader,
                overflow,
                overflow_reader,
            ),
            bursts: bursts::BurstCollector::new(bursts, burst_reader),
            burst_events: burst_events::BurstEventCollector::new(ring, events_per_peer),
            drops: drops::DropCollector::new(drops, drop_names),
            sojourn: sojourn::SojournCollector::new(sojourn),
            errors,
            flows: flows::FlowCollector::new(
                flow_map,
                flow_reader,
                nonip,
                flow_epoch,
                flow_inserts,
                FLOW_IDLE_TIMEOUT.as_nanos() as u64,
                flow_scan_ticks,
            ),
            tcp: tcp::TcpCollector::new(
                cpus,
                peer_slots,
                peer_slot_reader,
                peers,
                peer_reader,
                tcp_epoch,
            )?,
            conns: conns::ConnWalk::new(conns, conn_reader, conn_floor),
        };
        if let Some((flow_select, conn_select)) = selection {
            collector.flows.select_in_kernel(flow_select);
            collector.conns.select_in_kernel(conn_select);
        }
        Ok(collector)
    }

    /// Whether the flow and connection walks select in the kernel now (a walk that fails
    /// turns its map back to batch lookups for good).
    pub fn selects_in_kernel(&self) -> bool {
        self.flows.selects_in_kernel() && self.conns.selects_in_kernel()
    }

    /// One pass over the maps. `ifnames` names the interfaces by index; traffic of an
    /// interface not in it (detached this tick) is left out.
    pub fn tick(&mut self, ifnames: &HashMap<u32, String>) -> Readings {
        let mut snap = Readings::default();
        self.read_series(&mut snap, ifnames);
        let records = self.read_flows(&mut snap, ifnames);
        snap.peers = self.tcp.tick();
        snap.slow_connections = self.conns.tick(snap.flow_scan_age_ticks == 0).to_vec();
        snap.conn_evictions = self.conns.evictions();
        snap.slow_connections_floor_seconds = self.conns.floor_us() as f64 * 1e-6;
        self.read_bursts(&mut snap, ifnames, &records);
        self.read_counters(&mut snap, ifnames);
        snap
    }

    /// Per (interface, direction, peer) traffic, in that order.
    fn read_series(&mut self, snap: &mut Readings, ifnames: &HashMap<u32, String>) {
        for (k, t) in self.series.tick() {
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
        snap.flows.sort_by(|a, b| {
            (&a.iface, a.direction, &a.peer).cmp(&(&b.iface, b.direction, &b.peer))
        });
    }

    /// The flow map: non-IP traffic, the busiest flows and the walk's figures (every
    /// `flow_scan`), and this tick's burst events, those of flows the walk removed
    /// included. Returns the burst records, which the burst histograms fold too.
    fn read_flows(&mut self, snap: &mut Readings, ifnames: &HashMap<u32, String>) -> BurstRecords {
        let ft = self.flows.tick(monotonic_ns());
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
        for &(tick_bytes, k, v) in ft.top {
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
        snap.flow_scan_age_ticks = ft.scan_age;
        snap.flows_tracked = ft.tracked;
        snap.flow_evictions = ft.evictions;
        let mut records = self.burst_events.take();
        for (k, v) in &ft.removed {
            if let Some(b) = burst_events::unfinished(k, v) {
                records.push(&b);
            }
        }
        snap.burst_events =
            burst_events::events(&records, burst_events::realtime_offset_ns(), ifnames);
        snap.nonip
            .sort_by(|a, b| (&a.iface, a.direction).cmp(&(&b.iface, b.direction)));
        records
    }

    /// Ended bursts per (interface, direction, peer), in that order.
    fn read_bursts(
        &mut self,
        snap: &mut Readings,
        ifnames: &HashMap<u32, String>,
        records: &BurstRecords,
    ) {
        for (k, b) in self.bursts.tick(records) {
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
    }

    /// Qdisc sojourn, drops by reason, full maps and lost burst events.
    fn read_counters(&mut self, snap: &mut Readings, ifnames: &HashMap<u32, String>) {
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
        let (dropped, thinned) = self.burst_events.dropped();
        snap.events_lost = ring_full + dropped;
        snap.events_thinned = thinned;
    }

    /// Forgets everything about an interface that went away.
    pub fn forget_interface(&mut self, ifindex: u32) {
        self.series.forget_interface(ifindex);
        self.flows.forget_interface(ifindex);
        self.bursts.forget_interface(ifindex);
        self.sojourn.forget_interface(ifindex);
    }
}

/// The collect stage's cost with the bench's map contents (10,000 connections to 64 peers:
/// 20,000 flow entries, 20,000 connection entries, all of them changed every tick). Creates
/// the maps (root), loads and attaches no program:
/// `cargo test --release -p probe-user collect_cost -- --ignored --nocapture`.
#[cfg(test)]
mod cost {
    use super::*;
    use aya::maps::Map;
    use probe_ebpf::{ConnKey, ConnStats, FlowKey, FlowStats, AF_INET, DIR_INGRESS};

    fn handle<K: aya::Pod, V: aya::Pod>(ebpf: &Ebpf, name: &str) -> BpfHashMap<MapData, K, V> {
        let fd = batch::dup_fd(ebpf.map(name).unwrap()).unwrap();
        BpfHashMap::try_from(Map::LruHashMap(MapData::from_fd(fd).unwrap())).unwrap()
    }

    fn v4(a: [u8; 4]) -> probe_ebpf::Addr {
        [u32::from_ne_bytes(a), 0, 0, 0]
    }

    /// The collector's cost per walk at 20,000 flow entries and 20,000 connections, the walks
    /// selected in the kernel beside the batch walks, in one run: two loads of the object
    /// fed the same entries, ticked in turn. Every flow moves a different number of bytes.
    #[test]
    #[ignore = "a measurement: root, release"]
    fn collect_cost() {
        let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).unwrap();
        let mut sides: Vec<_> = [false, true]
            .into_iter()
            .map(|select| {
                let mut ebpf = aya::EbpfLoader::new()
                    .load(crate::bpf::load::OBJECT)
                    .unwrap();
                if select {
                    crate::bpf::load::load_selection(&mut ebpf).unwrap();
                }
                let flows = handle::<FlowKey, FlowStats>(&ebpf, names::FLOWS);
                let conns = handle::<ConnKey, ConnStats>(&ebpf, names::CONNS);
                let collector = Collector::new(&mut ebpf, HashMap::new(), 1, 512, select).unwrap();
                (ebpf, flows, conns, collector, Duration::ZERO)
            })
            .collect();
        let ifnames = HashMap::from([(7, "veth201a".to_owned())]);
        let local = v4([10, 231, 201, 1]);
        let conn_keys: Vec<(ConnKey, ConnKey)> = (0..10_000u32)
            .map(|i| {
                let peer = v4([10, 231, 201, 100 + (i % 64) as u8]);
                let (lport, rport) = (10_000 + (i / 64) as u16, 5300 + (i % 4) as u16);
                let c = ConnKey {
                    laddr: local,
                    raddr: peer,
                    lport,
                    rport,
                    family: AF_INET,
                    ..ConnKey::default()
                };
                let s = ConnKey {
                    laddr: peer,
                    raddr: local,
                    lport: rport,
                    rport: lport,
                    ..c
                };
                (c, s)
            })
            .collect();
        let rss = || {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let kib = |k: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map_or(0.0, |v| {
                        v.trim().trim_end_matches(" kB").parse().unwrap_or(0.0)
                    })
            };
            (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
        };
        let before = rss();
        let ticks = 20u64;
        for t in 1..=ticks {
            let now = monotonic_ns();
            for (_, flows, conns, collector, spent) in &mut sides {
                for (i, (c, s)) in conn_keys.iter().enumerate() {
                    for (k, direction) in [(c, DIR_EGRESS), (c, DIR_INGRESS)] {
                        let (src, dst) = if direction == DIR_EGRESS {
                            (k.laddr, k.raddr)
                        } else {
                            (k.raddr, k.laddr)
                        };
                        let key = FlowKey {
                            src,
                            dst,
                            sport: k.lport,
                            dport: k.rport,
                            ifindex: 7,
                            family: AF_INET,
                            proto: 6,
                            direction,
                            ..FlowKey::default()
                        };
                        let moved = 98 + 2 * i as u64 + u64::from(direction);
                        let v = FlowStats {
                            bytes: moved * t,
                            packets: t,
                            // As TC marks it: the walk of tick t reads epoch t - 1.
                            mark_epoch: (t - 1) as u32,
                            mark_bytes: moved * (t - 1),
                            last_seen_ns: now,
                            bursts: t,
                            burst_start_ns: now,
                            burst_bytes: 98,
                            ..FlowStats::default()
                        };
                        flows.insert(key, v, 0).unwrap();
                    }
                    for k in [c, s] {
                        let v = ConnStats {
                            srtt_us: 50 + (t % 7) as u32,
                            min_rtt_us: 20,
                            state: 1,
                            bytes_acked: 32 * t,
                            bytes_received: 32 * t,
                            ..ConnStats::default()
                        };
                        conns.insert(*k, v, 0).unwrap();
                    }
                }
                let t0 = std::time::Instant::now();
                let snap = collector.tick(&ifnames);
                *spent += t0.elapsed();
                assert_eq!(snap.flows_tracked, 20_000);
            }
        }
        let after = rss();
        // The selection program's visit of every entry, with nothing to write: the part of
        // a selected walk no threshold saves.
        let visit = {
            let w = crate::bpf::select::walk(&sides[1].0, names::FLOW_SELECT).unwrap();
            let t0 = std::time::Instant::now();
            for _ in 0..10 {
                w.run(&[monotonic_ns(), u64::MAX, u64::MAX, ticks]).unwrap();
            }
            t0.elapsed().as_secs_f64() * 1e3 / 10.0
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3 / ticks as f64;
        let (batch, select) = (ms(sides[0].4), ms(sides[1].4));
        let kernel_ms: f64 = [names::FLOW_SELECT, names::CONN_SELECT]
            .iter()
            .map(|p| {
                let prog: &aya::programs::RawTracePoint =
                    sides[1].0.program(p).unwrap().try_into().unwrap();
                let info = prog.info().unwrap();
                info.run_time().as_secs_f64() * 1e3 / ticks as f64
            })
            .sum();
        eprintln!(
            "collect: {batch:.2} ms per tick with batch walks, {select:.2} ms selected in the kernel ({:.3}x; of which the selection programs {kernel_ms:.2} ms; visiting the 20,000 flow entries alone {visit:.2} ms); 20,000 flows, 20,000 connections, a walk every tick; process RSS {:.1} -> {:.1} MiB, peak {:.1} MiB",
            select / batch,
            before.0,
            after.0,
            after.1
        );
    }
}

/// The walks selected in the kernel against the batch walks, on the same entries: two
/// copies of the object, one with the selection programs, fed identical maps.
#[cfg(test)]
mod selection_tests;

//! The flow and connection walks selected in the kernel (bpf::select) against the batch
//! walks that copy every entry: two loads of the object, one running the selection
//! programs, the same entries written to both, and every walk's figures compared. Needs
//! root (CI runs as root); skipped otherwise.
use std::collections::HashMap;

use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use probe_ebpf::{names, ConnKey, ConnStats, FlowKey, FlowStats, AF_INET, DIR_EGRESS, TCP_CLOSE};

use super::{monotonic_ns, Collector, FLOW_IDLE_TIMEOUT};

struct Side {
    collector: Collector,
    flows: BpfHashMap<MapData, FlowKey, FlowStats>,
    conns: BpfHashMap<MapData, ConnKey, ConnStats>,
}

fn handle<K: aya::Pod, V: aya::Pod>(ebpf: &aya::Ebpf, name: &str) -> BpfHashMap<MapData, K, V> {
    let fd = super::batch::dup_fd(ebpf.map(name).unwrap()).unwrap();
    BpfHashMap::try_from(Map::LruHashMap(MapData::from_fd(fd).unwrap())).unwrap()
}

fn side(select: bool) -> Side {
    let mut ebpf = aya::EbpfLoader::new()
        .load(crate::bpf::load::OBJECT)
        .unwrap();
    if select {
        crate::bpf::load::load_selection(&mut ebpf).unwrap();
    }
    let flows = handle(&ebpf, names::FLOWS);
    let conns = handle(&ebpf, names::CONNS);
    let collector = Collector::new(&mut ebpf, HashMap::new(), 1, 64, select).unwrap();
    assert_eq!(collector.selects_in_kernel(), select);
    // The collector keeps what it needs of the object (maps, program fds).
    drop(ebpf);
    Side {
        collector,
        flows,
        conns,
    }
}

fn v4(a: [u8; 4]) -> probe_ebpf::Addr {
    [u32::from_ne_bytes(a), 0, 0, 0]
}

fn flow(i: u32) -> FlowKey {
    FlowKey {
        src: v4([10, 231, 1, 1]),
        dst: v4([10, 231, 2 + (i / 250) as u8, (i % 250) as u8]),
        sport: 20_000 + (i % 1000) as u16,
        dport: 5201,
        ifindex: 7,
        family: AF_INET,
        proto: 6,
        direction: DIR_EGRESS,
        ..FlowKey::default()
    }
}

fn conn(i: u32) -> ConnKey {
    ConnKey {
        laddr: v4([10, 231, 1, 1]),
        raddr: v4([10, 231, 3 + (i / 250) as u8, (i % 250) as u8]),
        lport: 30_000 + i as u16,
        rport: 5201,
        family: AF_INET,
        ..ConnKey::default()
    }
}

#[test]
fn selected_walks_match_the_batch_walks() {
    // SAFETY: a plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: loading BPF programs needs root (CI runs as root)");
        return;
    }
    let mut sides = [side(true), side(false)];
    let ifnames = HashMap::from([(7, "veth-sel".to_owned())]);
    let idle_ns = FLOW_IDLE_TIMEOUT.as_nanos() as u64;
    // 6,000 flows moving 100-149 bytes a walk and 40 moving 10 kB and more: the first walk
    // (threshold 0) fills FLOW_PICKS and is run again at its histogram's threshold; the
    // third has the top flows move a tenth of what they did, below the threshold the second
    // walk set, and is run again too. 100 flows are idle past the timeout at the second.
    let (bulk, top, idle) = (6_000u32, 40u32, 100u32);
    for t in 1..=3u64 {
        let now = monotonic_ns();
        for s in &mut sides {
            for i in 0..bulk + top + idle {
                let moved = if i < bulk {
                    100 + u64::from(i % 50)
                } else if i < bulk + top {
                    let m = 10_000 + 1_000 * u64::from(i - bulk);
                    if t == 3 {
                        m / 10
                    } else {
                        m
                    }
                } else {
                    7
                };
                let idle_now = i >= bulk + top && t >= 2;
                if idle_now && t == 3 {
                    continue; // deleted by the second walk, as the test checks below
                }
                let bytes = 1_000_000 * t + moved;
                let v = FlowStats {
                    bytes,
                    packets: t,
                    // As TC marks it: the walk of tick t reads epoch t - 1.
                    mark_epoch: (t - 1) as u32,
                    mark_bytes: bytes - moved,
                    last_seen_ns: if idle_now { now - 2 * idle_ns } else { now },
                    ..FlowStats::default()
                };
                s.flows.insert(flow(i), v, 0).unwrap();
            }
            // Connections with srtt 50 us to 3 ms, every seventh closed, a fifth of them
            // slower at each tick: the floor and the stale deletions move with them.
            for i in 0..3_000u32 {
                let c = ConnStats {
                    srtt_us: 50 + i + if i % 5 == t as u32 { 5_000 } else { 0 },
                    min_rtt_us: 20,
                    state: if i % 7 == 0 { TCP_CLOSE } else { 1 },
                    bytes_acked: u64::from(i) * t,
                    ..ConnStats::default()
                };
                // A connection the last walk deleted is inserted again, as sock_ops would
                // at its next round trip at or above the floor.
                s.conns.insert(conn(i), c, 0).unwrap();
            }
        }
        let [a, b] = &mut sides;
        let (sel, batch) = (a.collector.tick(&ifnames), b.collector.tick(&ifnames));
        assert!(
            a.collector.selects_in_kernel(),
            "walk {t} fell back to batch lookups"
        );
        assert_eq!(
            sel.flows_tracked, batch.flows_tracked,
            "walk {t}: flows tracked"
        );
        assert_eq!(sel.top_flows.len(), 32, "walk {t}: top flows");
        assert_eq!(sel.top_flows, batch.top_flows, "walk {t}: top flows");
        assert_eq!(sel.flow_evictions, batch.flow_evictions, "walk {t}");
        assert_eq!(
            sel.slow_connections, batch.slow_connections,
            "walk {t}: slow connections"
        );
        assert!(!sel.slow_connections.is_empty());
        assert_eq!(
            sel.slow_connections_floor_seconds, batch.slow_connections_floor_seconds,
            "walk {t}: floor"
        );
        assert_eq!(
            sel.conn_evictions, batch.conn_evictions,
            "walk {t}: conn evictions"
        );
        if t == 2 {
            // The idle flows were deleted from the kernel map by both walks.
            for s in &sides {
                for i in bulk + top..bulk + top + idle {
                    assert!(s.flows.get(&flow(i), 0).is_err(), "idle flow {i} kept");
                }
            }
            assert_eq!(sel.flows_tracked, u64::from(bulk + top));
        }
        // Both maps hold the same connections after the walks' deletions.
        let keys = |s: &Side| {
            let mut k: Vec<_> = s
                .conns
                .keys()
                .map(Result::unwrap)
                .map(|k| (k.raddr, k.lport))
                .collect();
            k.sort();
            k
        };
        assert_eq!(
            keys(&sides[0]),
            keys(&sides[1]),
            "walk {t}: connections left"
        );
    }
}

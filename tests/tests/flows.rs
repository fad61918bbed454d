//! Flow accounting against the interface's own counters: what probe counts on a veth, summed
//! over peers plus non-IP traffic, matches the veth's rx/tx bytes and packets within 1%.
//!
//! Offloads are off on both ends so that every skb is one wire packet (veth counters count
//! skbs; probe counts GSO super-packets as their segments). With offloads on, the reference is
//! a pfifo qdisc's `Sent` counters, which count GSO packets the same wire-equivalent way.
use probe_tests::iperf::{self, ClientOpts};
use probe_tests::ProbeOpts;
use probe_tests::{
    bpfmaps, cmd, kernel, netns, probe_iface_traffic, rel_diff, traffic, Metrics, Pair, PairOpts,
    Probe,
};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

const TOLERANCE: f64 = 0.01;

/// Bytes probe attributed to `peer` on `iface` per direction (ingress, egress).
fn peer_bytes(m: &Metrics, iface: &str, peer: &str) -> (f64, f64) {
    let b = |dir| {
        m.sum(
            "probe_flow_bytes_total",
            &[("iface", iface), ("direction", dir), ("peer", peer)],
        )
    };
    (b("ingress"), b("egress"))
}

fn flows_match_interface_counters(subnet: u8, ipv6: bool, client: ClientOpts) {
    cmd::require_root_and(&["ip", "nsenter", "iperf3", "ethtool", "ss"]);
    let pair = Pair::with(
        subnet,
        PairOpts {
            ipv6,
            no_offloads: true,
        },
    )
    .unwrap();
    let server_ip: IpAddr = if ipv6 {
        pair.ip6_b.unwrap().into()
    } else {
        pair.ip_b.into()
    };
    let peer = server_ip.to_string();
    let iface = pair.veth_a.as_str();
    let _server = iperf::Server::start(&pair.b, server_ip, iperf::PORT).unwrap();
    let probe = Probe::start(&pair.a, ProbeOpts::iface(iface));

    // Quiet link (static neighbours, no ND): the last tick's snapshot and the counters agree.
    probe.wait_ticks(2);
    let m0 = probe.metrics();
    let k0 = kernel::iface_counters(&pair.a, iface).unwrap();

    let report = iperf::run_client(&pair.a, server_ip, iperf::PORT, &client).unwrap();

    probe.wait_ticks(2);
    let m1 = probe.metrics();
    let k1 = kernel::iface_counters(&pair.a, iface).unwrap();

    let kernel_delta = k1 - k0;
    let probe_delta = probe_iface_traffic(&m1, iface) - probe_iface_traffic(&m0, iface);
    let rows: [(&str, f64, f64); 4] = [
        ("rx_bytes", probe_delta.rx_bytes, kernel_delta.rx_bytes),
        (
            "rx_packets",
            probe_delta.rx_packets,
            kernel_delta.rx_packets,
        ),
        ("tx_bytes", probe_delta.tx_bytes, kernel_delta.tx_bytes),
        (
            "tx_packets",
            probe_delta.tx_packets,
            kernel_delta.tx_packets,
        ),
    ];
    let mut table = format!(
        "iperf3 {client:?}: {:.0} Mbit/s\n{:<12} {:>16} {:>16} {:>9}\n",
        report.received_bps / 1e6,
        "counter",
        "probe",
        "veth",
        "diff"
    );
    for (name, p, k) in rows {
        table += &format!(
            "{name:<12} {p:>16.0} {k:>16.0} {:>8.4}%\n",
            100.0 * rel_diff(p, k)
        );
    }
    eprintln!("{table}");

    // The scenario really moved traffic both ways.
    assert!(
        kernel_delta.tx_packets > 10_000.0,
        "too little traffic\n{table}"
    );
    assert!(
        kernel_delta.rx_packets > 10.0,
        "no reverse traffic\n{table}"
    );
    for (name, p, k) in rows {
        assert!(
            rel_diff(p, k) <= TOLERANCE,
            "{name}: probe {p} vs veth {k} differ by more than {}%\n{table}",
            TOLERANCE * 100.0
        );
    }

    // Nearly all of it is attributed to the server's address.
    let (in0, out0) = peer_bytes(&m0, iface, &peer);
    let (in1, out1) = peer_bytes(&m1, iface, &peer);
    assert!(
        (out1 - out0) >= 0.99 * probe_delta.tx_bytes && (in1 - in0) >= 0.99 * probe_delta.rx_bytes,
        "peer=\"{peer}\" should carry the traffic: egress {} of {}, ingress {} of {}\npeers: {:?}",
        out1 - out0,
        probe_delta.tx_bytes,
        in1 - in0,
        probe_delta.rx_bytes,
        m1.label_values("probe_flow_bytes_total", "peer")
    );
}

#[test]
fn tcp_bytes_and_packets_match_veth_counters() {
    flows_match_interface_counters(11, false, ClientOpts::tcp(5));
}

#[test]
fn udp_bytes_and_packets_match_veth_counters() {
    flows_match_interface_counters(12, false, ClientOpts::udp(4, "400M"));
}

#[test]
fn tcp_over_ipv6_matches_veth_counters() {
    flows_match_interface_counters(13, true, ClientOpts::tcp(3));
}

/// With TSO/GSO on, probe's egress counts equal what a root pfifo qdisc counts: GSO
/// super-packets as their segments, each with its headers.
#[test]
fn tso_egress_matches_qdisc_counters() {
    cmd::require_root_and(&["ip", "nsenter", "iperf3", "tc", "ss"]);
    let pair = Pair::new(14).unwrap();
    let iface = pair.veth_a.as_str();
    kernel::add_counting_pfifo(&pair.a, iface).unwrap();
    let _server = iperf::Server::start(&pair.b, pair.ip_b.into(), iperf::PORT).unwrap();
    let probe = Probe::start(&pair.a, ProbeOpts::iface(iface));
    let root_fifo = || kernel::counting_pfifo(&pair.a, iface).unwrap();
    probe.wait_ticks(2);
    let m0 = probe.metrics();
    let q0 = root_fifo();
    let k0 = kernel::iface_counters(&pair.a, iface).unwrap();
    iperf::run_client(&pair.a, pair.ip_b.into(), iperf::PORT, &ClientOpts::tcp(4)).unwrap();
    probe.wait_ticks(2);
    let m1 = probe.metrics();
    let q1 = root_fifo();
    let k1 = kernel::iface_counters(&pair.a, iface).unwrap();

    let p = probe_iface_traffic(&m1, iface) - probe_iface_traffic(&m0, iface);
    let qb = (q1.sent_bytes - q0.sent_bytes) as f64;
    let qp = (q1.sent_packets - q0.sent_packets) as f64;
    let skbs = (k1 - k0).tx_packets;
    let table = format!(
        "egress bytes: probe {:.0} qdisc {qb:.0} ({:.4}%)\n\
         egress packets: probe {:.0} qdisc {qp:.0} ({:.4}%); veth skbs {skbs:.0}\n\
         qdisc drops {}",
        p.tx_bytes,
        100.0 * rel_diff(p.tx_bytes, qb),
        p.tx_packets,
        100.0 * rel_diff(p.tx_packets, qp),
        q1.dropped - q0.dropped
    );
    eprintln!("{table}");
    assert_eq!(q1.dropped, q0.dropped, "the qdisc dropped packets\n{table}");
    // The scenario really used GSO: fewer skbs than wire packets.
    assert!(qp > 1.5 * skbs, "no GSO super-packets seen\n{table}");
    assert!(rel_diff(p.tx_bytes, qb) <= TOLERANCE, "{table}");
    assert!(rel_diff(p.tx_packets, qp) <= TOLERANCE, "{table}");
}

/// Non-IP frames (a local experimental ethertype, sent through AF_PACKET) land in
/// `probe_nonip_*`, per direction, and match the veth's counters exactly.
#[test]
fn non_ip_frames_are_counted() {
    cmd::require_root_and(&["ip", "nsenter"]);
    let pair = Pair::new(15).unwrap();
    let iface = pair.veth_a.as_str();
    let probe = Probe::start(&pair.a, ProbeOpts::iface(iface));
    let nonip = |m: &Metrics, what: &str, dir: &str| {
        m.sum(
            &format!("probe_nonip_{what}_total"),
            &[("iface", iface), ("direction", dir)],
        )
    };
    probe.wait_ticks(2);
    let m0 = probe.metrics();
    let k0 = kernel::iface_counters(&pair.a, iface).unwrap();
    // 0x88b5: IEEE 802 local experimental ethertype.
    netns::send_raw_frames(&pair.a, iface, pair.mac_b, 0x88b5, 200, 1000).unwrap();
    netns::send_raw_frames(&pair.b, &pair.veth_b, pair.mac_a, 0x88b5, 100, 700).unwrap();
    probe.wait_ticks(2);
    let m1 = probe.metrics();
    let k1 = kernel::iface_counters(&pair.a, iface).unwrap();
    let k = k1 - k0;
    let p = probe_iface_traffic(&m1, iface) - probe_iface_traffic(&m0, iface);
    let got = (
        nonip(&m1, "packets", "egress") - nonip(&m0, "packets", "egress"),
        nonip(&m1, "bytes", "egress") - nonip(&m0, "bytes", "egress"),
        nonip(&m1, "packets", "ingress") - nonip(&m0, "packets", "ingress"),
        nonip(&m1, "bytes", "ingress") - nonip(&m0, "bytes", "ingress"),
    );
    eprintln!("non-IP deltas (egress pkts, bytes, ingress pkts, bytes): {got:?}; veth {k:?}");
    assert_eq!(got, (1000.0, 200_000.0, 700.0, 70_000.0));
    assert_eq!(p, k, "probe's totals vs the veth's counters");
}

/// More series than the per-CPU slot table holds (`series_slots = 64`; 100 peers x 2
/// directions = 200 series, so at least one CPU sees 100): the series that find no slot are
/// counted in the kernel's overflow map, and the totals still match the veth's counters
/// exactly.
#[test]
fn series_beyond_the_slot_table_match_veth_counters() {
    const SUBNET: u8 = 47;
    cmd::require_root_and(&["ip", "nsenter", "bpftool"]);
    let pair = Pair::new(SUBNET).unwrap();
    let iface = pair.veth_a.as_str();
    let peers: Vec<Ipv4Addr> = (10..110)
        .map(|h| Ipv4Addr::new(10, 231, SUBNET, h))
        .collect();
    pair.add_b_addresses(&peers).unwrap();
    // B answers every datagram: no ICMP rate limits in its namespace.
    pair.b.sysctl("net.ipv4.icmp_ratelimit", "0").unwrap();
    pair.b
        .sysctl("net.ipv4.icmp_msgs_per_sec", "100000")
        .unwrap();
    pair.b.sysctl("net.ipv4.icmp_msgs_burst", "100000").unwrap();
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cfg.path(), "[maps]\nseries_slots = 64\n").unwrap();
    let mut opts = ProbeOpts::iface(iface);
    opts.extra = vec!["--config".into(), cfg.path().to_string_lossy().into()];
    let probe = Probe::start(&pair.a, opts);
    probe.wait_ticks(2);
    let m0 = probe.metrics();
    let k0 = kernel::iface_counters(&pair.a, iface).unwrap();
    // UDP to a closed port: each datagram out brings an ICMP port unreachable back, so every
    // peer has an egress and an ingress series.
    for p in &peers {
        let dst = SocketAddr::new((*p).into(), 9);
        let sent = traffic::udp_send(&pair.a, dst, 3, 200, 1, Duration::from_millis(5)).unwrap();
        assert_eq!(sent, 3);
    }
    probe.wait_ticks(2);
    let m1 = probe.metrics();
    let k1 = kernel::iface_counters(&pair.a, iface).unwrap();
    let got = probe_iface_traffic(&m1, iface) - probe_iface_traffic(&m0, iface);
    let want = k1 - k0;
    eprintln!("probe {got:?}, veth {want:?}");
    assert_eq!(got, want, "probe's totals vs the veth's counters");
    for p in &peers {
        let (rx, tx) = peer_bytes(&m1, iface, &p.to_string());
        assert!(rx > 0.0 && tx > 0.0, "peer {p}: {rx} bytes in, {tx} out");
    }
    // The overflow map, as the kernel holds it, was used; and it refused nothing.
    let id = bpfmaps::held_map(probe.pid(), "SERIES").unwrap();
    let overflowed = bpfmaps::map_keys(id).unwrap().len();
    eprintln!("series in the overflow map: {overflowed}");
    assert!(overflowed > 0, "no series overflowed the 64-slot tables");
    assert_eq!(m1.sum("probe_map_full_total", &[("map", "SERIES")]), 0.0);
}

//! The flow map's tracked and evicted counts against the kernel's own view of the map. probe
//! runs with `[maps] flows = 64` and walks the map every tick; UDP datagrams from namespace A
//! to a bound socket in B make one egress entry each on A's veth (no replies, no ICMP).
//!
//! 1. Twenty flows, under the map's size: `probe_flows_tracked` is the entries bpftool lists
//!    in FLOWS, and `probe_flow_evictions_total` is 0.
//! 2. Two hundred more: every flow the test made and the map no longer holds was evicted, so
//!    the evictions are 220 minus the entries bpftool lists, and tracked is that listing.
use probe_tests::{bpfmaps, cmd, Pair, Probe, ProbeOpts};
use std::net::{SocketAddr, UdpSocket};

const SUBNET: u8 = 123;
const PORT: u16 = 5410;
const MAP: usize = 64;
const TICK: &str = "500ms";

/// One datagram from each of `n` new sockets (each its own source port, so its own flow).
/// The caller keeps them open: a closed socket's port may go to a later one, whose flow
/// would then not be new.
fn new_flows(pair: &Pair, dst: SocketAddr, n: usize) -> Vec<UdpSocket> {
    let socks: Vec<UdpSocket> = (0..n)
        .map(|_| {
            pair.a
                .enter(|| UdpSocket::bind("0.0.0.0:0"))
                .unwrap()
                .unwrap()
        })
        .collect();
    for s in &socks {
        s.send_to(b"flow", dst).unwrap();
    }
    socks
}

/// (tracked, evictions, refused inserts) as probe reports them, and the entries in FLOWS as
/// bpftool lists them.
fn sample(probe: &Probe) -> (f64, f64, f64, usize) {
    let m = probe.metrics();
    let id = bpfmaps::held_map(probe.pid(), "FLOWS").unwrap();
    let present = bpfmaps::map_keys(id).unwrap().len();
    (
        m.sum("probe_flows_tracked", &[]),
        m.sum("probe_flow_evictions_total", &[]),
        m.sum("probe_map_full_total", &[("map", "FLOWS")]),
        present,
    )
}

#[test]
fn tracked_and_evicted_flows_match_the_kernel_map() {
    cmd::require_root_and(&["ip", "nsenter", "bpftool"]);
    let pair = Pair::new(SUBNET).unwrap();
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        cfg.path(),
        format!("flow_scan = \"{TICK}\"\n[maps]\nflows = {MAP}\n"),
    )
    .unwrap();
    let mut opts = ProbeOpts::iface(&pair.veth_a).tick(TICK);
    opts.extra = vec!["--config".into(), cfg.path().to_string_lossy().into()];
    let probe = Probe::start(&pair.a, opts);
    let dst = SocketAddr::new(pair.ip_b.into(), PORT);
    // Bound, so B neither answers with ICMP nor adds flows of its own.
    let _sink = pair.b.enter(|| UdpSocket::bind(dst)).unwrap().unwrap();
    probe.wait_ticks(1);

    let mut open = new_flows(&pair, dst, 20);
    probe.wait_ticks(3);
    let (tracked1, ev1, refused1, present1) = sample(&probe);
    let mut report = format!(
        "phase 1: 20 flows; FLOWS holds {present1}; probe: {tracked1} tracked, {ev1} evictions, {refused1} refused\n"
    );
    assert_eq!(present1, 20, "{report}");
    assert_eq!(tracked1, present1 as f64, "{report}");
    assert_eq!(ev1, 0.0, "{report}");

    open.extend(new_flows(&pair, dst, 200));
    probe.wait_ticks(3);
    let (tracked2, ev2, refused2, present2) = sample(&probe);
    report += &format!(
        "phase 2: 220 flows; FLOWS holds {present2}; probe: {tracked2} tracked, {ev2} evictions, {refused2} refused"
    );
    eprintln!("{report}");
    assert!(present2 <= MAP, "{report}");
    assert_eq!(
        refused2, 0.0,
        "the LRU map evicts, it does not refuse\n{report}"
    );
    assert_eq!(tracked2, present2 as f64, "{report}");
    assert_eq!(ev2, (220 - present2) as f64, "{report}");
    // The same counts a while later: nothing moved, so no walk may count again.
    probe.wait_ticks(2);
    let (tracked3, ev3, _, present3) = sample(&probe);
    assert_eq!(
        (tracked3, ev3, present3),
        (tracked2, ev2, present2),
        "{report}"
    );
}

//! Retransmitted segments against `nstat` TcpRetransSegs: an nftables rule in B drops ~2% of
//! A's TCP segments to the iperf3 port; over the run, the increase of
//! `probe_tcp_retransmits_total{peer=B}` is within 5% of the increase of A's TcpRetransSegs
//! (A's only TCP peer is B), and both are well above zero.
//!
//! Two cases: offloads off on A (every skb, retransmitted or not, is one segment), and offloads
//! on (a retransmitted TSO skb carries several segments, which nstat counts one by one, and so
//! must probe).
use probe_tests::iperf::{self, ClientOpts};
use probe_tests::{cmd, kernel, netns, rel_diff, Pair, Probe, ProbeOpts};

const TOLERANCE: f64 = 0.05;
const MIN_RETRANSMITS: f64 = 50.0;

#[test]
fn single_segment_retransmits_match_nstat() {
    retransmits_match_nstat(31, false);
}

#[test]
fn tso_retransmits_match_nstat() {
    retransmits_match_nstat(32, true);
}

fn retransmits_match_nstat(subnet: u8, offloads: bool) {
    cmd::require_root_and(&["ip", "nsenter", "iperf3", "nft", "nstat", "ethtool"]);
    let pair = Pair::new(subnet).unwrap();
    if !offloads {
        netns::set_offloads(&pair.a, &pair.veth_a, false).unwrap();
    }
    let (a, b) = (pair.ip_a.to_string(), pair.ip_b.to_string());
    let port = iperf::PORT.to_string();
    // The table lives in B's namespace and goes away with it.
    pair.b.run(&["nft", "add", "table", "inet", "t"]).unwrap();
    pair.b
        .run(&[
            "nft",
            "add chain inet t c { type filter hook input priority 0; }",
        ])
        .unwrap();
    pair.b
        .run(&[
            "nft", "add", "rule", "inet", "t", "c", "ip", "saddr", &a, "tcp", "dport", &port,
            "numgen", "random", "mod", "100", "<", "2", "counter", "drop",
        ])
        .unwrap();
    let _server = iperf::Server::start(&pair.b, pair.ip_b.into(), iperf::PORT).unwrap();
    let probe = Probe::start(&pair.a, ProbeOpts::iface(&pair.veth_a));

    let probe_retrans = |p: &Probe| {
        p.metrics()
            .sum("probe_tcp_retransmits_total", &[("peer", &b)])
    };
    probe.wait_ticks(1);
    let p0 = probe_retrans(&probe);
    let n0 = kernel::nstat(&pair.a, "TcpRetransSegs").unwrap() as f64;

    let report =
        iperf::run_client(&pair.a, pair.ip_b.into(), iperf::PORT, &ClientOpts::tcp(5)).unwrap();

    probe.wait_ticks(2);
    let p1 = probe_retrans(&probe);
    let n1 = kernel::nstat(&pair.a, "TcpRetransSegs").unwrap() as f64;
    let drops = pair
        .b
        .run(&["nft", "list", "chain", "inet", "t", "c"])
        .unwrap();

    let (dp, dn) = (p1 - p0, n1 - n0);
    let summary = format!(
        "offloads {}: retransmitted segments: probe {dp} nstat {dn} ({:.2}%); \
         iperf3 {:.0} Mbit/s, its sender retransmits {:?}\n{drops}",
        if offloads { "on" } else { "off" },
        100.0 * rel_diff(dp, dn),
        report.received_bps / 1e6,
        report.retransmits
    );
    eprintln!("{summary}");
    assert!(
        dn > MIN_RETRANSMITS,
        "the drop rule produced too little loss\n{summary}"
    );
    assert!(
        dp > MIN_RETRANSMITS,
        "probe saw too few retransmits\n{summary}\n--- probe log ---\n{}",
        probe.log_tail(20)
    );
    assert!(
        rel_diff(dp, dn) <= TOLERANCE,
        "probe and nstat differ by more than {}%\n{summary}",
        TOLERANCE * 100.0
    );
}

//! Drops by reason against nftables' own counter: a rule in B's input chain,
//! `ip saddr A udp dport 5201 counter drop`, drops UDP datagrams that A sends (UDP, so no
//! retransmits or other side effects). The kernel frees each dropped packet with the reason
//! NETFILTER_DROP, which probe counts through `skb:kfree_skb`.
//!
//! `probe_drops_total` is host-wide: other traffic on the host may be dropped by netfilter
//! too, at the same time (other tests' drop rules, for instance). The rule's counter is the
//! truth: probe's delta must be at least the rule's count, and within 5% of it, and the rule
//! must have dropped more than 100 packets.
use probe_tests::nft::Table;
use probe_tests::{cmd, rel_diff, traffic, Metrics, Pair, Probe, ProbeOpts};
use std::net::SocketAddr;
use std::time::Instant;

const TOLERANCE: f64 = 0.05;
const DATAGRAMS: usize = 3000;
const REASON: &str = "NETFILTER_DROP";

fn netfilter_drops(m: &Metrics) -> f64 {
    m.sum("probe_drops_total", &[("reason", REASON)])
}

#[test]
fn netfilter_drops_match_the_rule_counter() {
    cmd::require_root_and(&["ip", "nsenter", "nft"]);
    let t_start = Instant::now();
    let pair = Pair::new(66).unwrap();
    let a = pair.ip_a.to_string();
    let table = Table::new(&pair.b, "probe_drops", "input", "input").unwrap();
    let rule = table
        .add_rule(&["ip", "saddr", &a, "udp", "dport", "5201", "counter", "drop"])
        .unwrap();
    let probe = Probe::start(&pair.a, ProbeOpts::iface(&pair.veth_a).tick("500ms"));
    probe.wait_ticks(1);
    let m0 = probe.metrics();
    let n0 = table.counter(rule).unwrap();
    assert_eq!(
        m0.get("probe_hook_attached", &[("hook", "kfree_skb")])
            .unwrap(),
        Some(1.0),
        "the kfree_skb tracepoint is not attached\n{}",
        probe.log_tail(20)
    );

    // Groups of 50 with a pause: no queue on the way overflows, so every datagram reaches
    // the rule (what the rule counts is the truth either way).
    let sent = traffic::udp_send(
        &pair.a,
        SocketAddr::new(pair.ip_b.into(), 5201),
        DATAGRAMS,
        200,
        50,
        std::time::Duration::from_millis(5),
    )
    .unwrap();
    probe.wait_ticks(2);
    let m1 = probe.metrics();
    let n1 = table.counter(rule).unwrap();

    let dp = netfilter_drops(&m1) - netfilter_drops(&m0);
    let dn = (n1.packets - n0.packets) as f64;
    let reasons: Vec<String> = m1
        .select("probe_drops_total", &[])
        .map(|s| {
            let r = s.labels.get("reason").cloned().unwrap_or_default();
            let before = m0.sum("probe_drops_total", &[("reason", &r)]);
            format!("{r}:+{}", s.value - before)
        })
        .collect();
    let report = format!(
        "{sent} datagrams sent; rule counter +{dn}; probe_drops_total{{reason=\"{REASON}\"}} \
         +{dp} ({:+.2}%)\nall reasons (delta): {}\n{}\ntest time {:.1} s",
        100.0 * (dp - dn) / dn,
        reasons.join(" "),
        table.listing().trim(),
        t_start.elapsed().as_secs_f64()
    );
    eprintln!("{report}");

    assert!(dn > 100.0, "the rule dropped too little\n{report}");
    assert!(
        dp >= dn,
        "probe counted fewer netfilter drops than the rule alone made\n{report}"
    );
    assert!(
        rel_diff(dp, dn) <= TOLERANCE,
        "probe and the rule's counter differ by more than {}%\n{report}",
        100.0 * TOLERANCE
    );
}

//! Smoothed RTT against `ss -tin`: a tbf bottleneck on A's egress queues the data connection's
//! packets for tens of milliseconds; probe's `probe_tcp_srtt_seconds{peer=B}` and the kernel's
//! srtt of that connection (`ss -tin` `rtt:SRTT/RTTVAR`), sampled together while the traffic
//! runs, have medians within 20% of each other.
use probe_tests::iperf::{self, ClientOpts};
use probe_tests::{cmd, kernel, median, rel_diff, Pair, Probe, ProbeOpts};
use std::time::Duration;

const TOLERANCE: f64 = 0.20;
const SAMPLES: usize = 8;

#[test]
fn srtt_matches_ss() {
    cmd::require_root_and(&["ip", "nsenter", "iperf3", "tc", "ss"]);
    let pair = Pair::new(21).unwrap();
    let iface = pair.veth_a.as_str();
    // 30 Mbit/s: with TSO on, TCP small queues keep ~2 GSO packets (~130 KB) in the tbf
    // queue, which is ~35 ms of queueing, steady.
    pair.a
        .run(&[
            "tc", "qdisc", "add", "dev", iface, "root", "tbf", "rate", "30mbit", "burst", "32kb",
            "latency", "100ms",
        ])
        .unwrap();
    let _server = iperf::Server::start(&pair.b, pair.ip_b.into(), iperf::PORT).unwrap();
    let probe = Probe::start(&pair.a, ProbeOpts::iface(iface));
    let peer = pair.ip_b.to_string();

    let client = iperf::Client::start(
        &pair.a,
        pair.ip_b.into(),
        iperf::PORT,
        &ClientOpts::tcp(SAMPLES as u32 + 5).congestion("cubic"),
    )
    .unwrap();
    // Past slow start, and at least two ticks of steady state.
    std::thread::sleep(Duration::from_secs(3));

    let mut probe_ms = Vec::new();
    let mut ss_ms = Vec::new();
    let mut log = String::from("sample  probe_ms  ss_ms  (all connections to B: port:srtt)\n");
    for i in 0..SAMPLES {
        let m = probe.metrics();
        let p = m
            .get("probe_tcp_srtt_seconds", &[("peer", &peer)])
            .unwrap()
            .map(|s| s * 1000.0);
        let conns = kernel::ss_tcp(&pair.a).unwrap();
        let s = kernel::busiest_conn(&conns, pair.ip_b.into(), Some(iperf::PORT))
            .and_then(|c| c.rtt_ms);
        // Every connection to B, for the log: srtt of the idle control connection too.
        let all: Vec<String> = conns
            .iter()
            .filter(|c| c.peer.ip() == std::net::IpAddr::from(pair.ip_b))
            .map(|c| format!("{}:{:?}/{:?}", c.local.port(), c.rtt_ms, c.rttvar_ms))
            .collect();
        let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        log += &format!(
            "{i:>6}  {:>8}  {:>8}  {}\n",
            show(p),
            show(s),
            all.join(" ")
        );
        if let Some(p) = p {
            probe_ms.push(p);
        }
        if let Some(s) = s {
            ss_ms.push(s);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let report = client.finish().unwrap();
    let hist_count = probe
        .metrics()
        .get("probe_tcp_rtt_seconds_count", &[("peer", &peer)])
        .unwrap();

    let (mp, ms) = (median(&probe_ms), median(&ss_ms));
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    eprintln!(
        "{log}median probe {} ms, ss {} ms; iperf3 {:.1} Mbit/s; rtt histogram count {}",
        show(mp),
        show(ms),
        report.received_bps / 1e6,
        show(hist_count)
    );
    assert_eq!(ss_ms.len(), SAMPLES, "ss lost the data connection\n{log}");
    let ms = ms.unwrap();
    assert!(
        ms >= 5.0,
        "the bottleneck did not build a queue (ss srtt {ms} ms)\n{log}"
    );
    assert_eq!(
        probe_ms.len(),
        SAMPLES,
        "probe_tcp_srtt_seconds{{peer=\"{peer}\"}} missing in some scrapes\n{log}\n\
         --- probe log ---\n{}",
        probe.log_tail(20)
    );
    let mp = mp.unwrap();
    assert!(
        rel_diff(mp, ms) <= TOLERANCE,
        "median srtt: probe {mp:.3} ms vs ss {ms:.3} ms, more than {}% apart\n{log}",
        TOLERANCE * 100.0
    );
    assert!(
        hist_count.unwrap_or(0.0) > 0.0,
        "probe_tcp_rtt_seconds{{peer=\"{peer}\"}} has no samples"
    );
}

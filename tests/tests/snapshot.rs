//! The JSON snapshot's per-connection and per-flow detail against the kernel's own view:
//! `slow_connections` vs `ss -tin` for the same socket (bytes acked, srtt), and `top_flows`
//! vs the veth's own transmit counter for the same traffic: its bytes since it began, and
//! its bytes per tick against the counter's rate between the last two walks.
//!
//! A tbf at 20 Mbit/s keeps the flow slow enough that reading the kernel a few milliseconds
//! after probe's tick moves the numbers by well under the tolerance; offloads are off so
//! the veth counts wire packets, as probe does. srtt under a filling and draining tbf queue
//! swings by tens of percent within one round trip, and probe's copy is refreshed once per
//! round trip (sock_ops' RTT callback), so srtt is compared as the median over several
//! ticks, each read right after the tick, not as one instant (one instant failed CI at 59
//! vs 42 ms). Both details come from probe's walks of its flow and connection maps (every
//! `flow_scan`, 5 s by default); the test sets `flow_scan` to one tick so that every tick
//! it compares is a walk.
use probe_tests::iperf::{self, ClientOpts};
use probe_tests::{cmd, kernel, median, rel_diff, Pair, PairOpts, Probe, ProbeOpts};
use serde_json::Value;
use std::time::{Duration, Instant};

/// Ticks whose srtt is compared.
const SRTT_SAMPLES: usize = 5;
/// The test's `flow_scan`, in ticks.
const FLOW_SCAN_TICKS: u32 = 1;

/// The next snapshot whose detail (`top_flows`, `slow_connections`) was read at its tick.
fn next_scan(probe: &Probe) -> Value {
    probe.next_walk(Duration::from_secs(5) * (FLOW_SCAN_TICKS + 1))
}

#[test]
fn connection_and_flow_detail_match_the_kernel() {
    cmd::require_root_and(&["ip", "nsenter", "iperf3", "tc", "ss", "ethtool"]);
    let pair = Pair::with(
        71,
        PairOpts {
            ipv6: false,
            no_offloads: true,
        },
    )
    .unwrap();
    let iface = pair.veth_a.as_str();
    pair.a
        .run(&[
            "tc", "qdisc", "add", "dev", iface, "root", "tbf", "rate", "20mbit", "burst", "256kb",
            "latency", "100ms",
        ])
        .unwrap();
    let _server = iperf::Server::start(&pair.b, pair.ip_b.into(), iperf::PORT).unwrap();
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cfg.path(), format!("flow_scan = \"{FLOW_SCAN_TICKS}s\"\n")).unwrap();
    let mut opts = ProbeOpts::iface(iface);
    opts.extra = vec!["--config".into(), cfg.path().to_string_lossy().into()];
    let probe = Probe::start(&pair.a, opts);
    probe.wait_ticks(1);
    let k0 = kernel::iface_counters(&pair.a, iface).unwrap();
    let client = iperf::Client::start(
        &pair.a,
        pair.ip_b.into(),
        iperf::PORT,
        &ClientOpts::tcp(4 + SRTT_SAMPLES as u32 + FLOW_SCAN_TICKS + 4),
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(4));

    // srtt: the same socket in both views, right after each of several ticks.
    let (mut probe_ms, mut ss_ms) = (Vec::new(), Vec::new());
    // The veth's transmit counter at the last of these walks, for the flow's rate below.
    let mut last = (Instant::now(), k0);
    for _ in 0..SRTT_SAMPLES - 1 {
        let snap = next_scan(&probe);
        last = (
            Instant::now(),
            kernel::iface_counters(&pair.a, iface).unwrap(),
        );
        let conns = kernel::ss_tcp(&pair.a).unwrap();
        if let Some(ss) = kernel::busiest_conn(&conns, pair.ip_b.into(), Some(iperf::PORT)) {
            let port = ss.local.port() as u64;
            let c = snap["slow_connections"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| {
                    c["peer"] == pair.ip_b.to_string().as_str()
                        && c["local_port"].as_u64() == Some(port)
                });
            if let (Some(c), Some(s)) = (c, ss.rtt_ms) {
                probe_ms.push(c["srtt_seconds"].as_f64().unwrap() * 1e3);
                ss_ms.push(s);
            }
        }
    }

    let snap = next_scan(&probe);
    let k1 = kernel::iface_counters(&pair.a, iface).unwrap();
    let since_last = last.0.elapsed();
    let conns = kernel::ss_tcp(&pair.a).unwrap();
    let ss = kernel::busiest_conn(&conns, pair.ip_b.into(), Some(iperf::PORT))
        .expect("ss lost the data connection")
        .clone();
    let peer = pair.ip_b.to_string();
    let port = ss.local.port() as u64;

    // The same socket in probe's view: matched by its ports.
    let c = snap["slow_connections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["peer"] == peer.as_str() && c["local_port"].as_u64() == Some(port))
        .unwrap_or_else(|| panic!("no connection :{port} -> {peer} in {snap:#}"))
        .clone();
    assert_eq!(c["peer_port"].as_u64(), Some(iperf::PORT as u64));
    let acked = c["bytes_acked"].as_f64().unwrap();
    eprintln!(
        "bytes acked: probe {acked} ss {}; srtt: probe {:.3} ms ss {:?} ms",
        ss.bytes_acked,
        c["srtt_seconds"].as_f64().unwrap() * 1e3,
        ss.rtt_ms
    );
    assert!(ss.bytes_acked > 5_000_000, "too little traffic: {ss:?}");
    // sock_ops refreshes bytes_acked once per round trip (~the tbf queue, <= 100 ms here).
    assert!(
        rel_diff(acked, ss.bytes_acked as f64) <= 0.10,
        "bytes acked: probe {acked} vs ss {}",
        ss.bytes_acked
    );
    probe_ms.push(c["srtt_seconds"].as_f64().unwrap() * 1e3);
    ss_ms.push(ss.rtt_ms.unwrap());
    let (srtt_ms, ss_srtt) = (median(&probe_ms).unwrap(), median(&ss_ms).unwrap());
    eprintln!("srtt per tick: probe {probe_ms:.1?} ms, ss {ss_ms:.1?} ms");
    assert!(
        probe_ms.len() >= SRTT_SAMPLES - 1,
        "the connection was not in both views at every tick"
    );
    assert!(
        rel_diff(srtt_ms, ss_srtt) <= 0.20,
        "srtt medians: probe {srtt_ms:.3} ms vs ss {ss_srtt:.3} ms"
    );

    // The data flow, egress on the veth, against the veth's own transmit counter since
    // before the traffic started (the only other egress is iperf3's small control flow).
    let f = snap["top_flows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| {
            f["iface"] == iface
                && f["direction"] == "egress"
                && f["dst"] == peer.as_str()
                && f["sport"].as_u64() == Some(port)
        })
        .unwrap_or_else(|| panic!("the data flow is not among top_flows: {snap:#}"))
        .clone();
    let bytes = f["bytes"].as_f64().unwrap();
    let tx = (k1 - k0).tx_bytes;
    eprintln!("flow bytes: probe {bytes} veth tx {tx}");
    assert!(
        rel_diff(bytes, tx) <= 0.05,
        "flow bytes: probe {bytes} vs veth tx {tx}"
    );
    // tick_bytes is what the flow sent between the last two walks, a tick apart; the tbf
    // holds it to a steady rate, which the veth's counter gives over the same stretch.
    let tick_bytes = f["tick_bytes"].as_f64().unwrap();
    let rate = (k1 - last.1).tx_bytes as f64 / since_last.as_secs_f64();
    let expected = rate * probe.opts.tick_duration().as_secs_f64();
    eprintln!("flow tick_bytes: probe {tick_bytes}, veth tx {expected:.0} per tick");
    assert!(
        rel_diff(tick_bytes, expected) <= 0.2,
        "tick_bytes {tick_bytes} vs the veth's {expected:.0} per tick"
    );
    client.finish().unwrap();
}

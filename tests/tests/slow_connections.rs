//! `slow_connections` against `ss` while sock_ops keeps per-connection state only for the
//! slow tail (the floor, `slow_connections_floor_seconds`: a round trip below it does no
//! per-connection work, and the walk drops entries below it).
//!
//! Forty connections from A to B send a few bytes every 100 ms through a tbf on A's veth.
//! 1. An iperf3 flow fills the tbf's queue: the forty wait behind it, their srtt rises to
//!    milliseconds, and the floor (3/4 of the srtt of the 32nd slowest) rises with them.
//! 2. The flow ends and the queue drains: their srtt falls through the floor within a few
//!    round trips. The floor must follow it down, and no walk may list a connection at an
//!    srtt it left behind (a walk that finds fewer than 32 connections at or above the floor
//!    lists only those, and the next floor is 0).
//!
//! At every walk (`flow_scan` is one tick here), each listed connection between the two
//! namespaces is compared with `ss` for the same socket, read right after the tick. iperf3's
//! own connections are left out: under a filling tbf queue their srtt swings by tens of
//! percent within one round trip (tests/snapshot.rs compares it as a median).
use probe_tests::iperf::{self, ClientOpts};
use probe_tests::{cmd, kernel, traffic, Netns, Pair, Probe, ProbeOpts};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const SUBNET: u8 = 73;
const PORT: u16 = 5410;
const CHATTER: usize = 40;
const BULK_SECONDS: u32 = 9;
const LIMIT: Duration = Duration::from_secs(60);
/// The walks are a tick apart (`flow_scan` is one tick here).
const WALK_WITHIN: Duration = Duration::from_secs(5);

/// Sends a few bytes on every connection every 100 ms until stopped (bounded by LIMIT).
fn chatter(mut conns: Vec<TcpStream>, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let deadline = Instant::now() + LIMIT;
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            for c in conns.iter_mut() {
                let _ = c.write_all(b"ping");
            }
            thread::sleep(Duration::from_millis(100));
        }
    })
}

/// Compares the walk's listed connections between the pair's addresses with `ss` in the
/// namespace of their local end; returns how many were compared and the floor (ms).
fn check(snap: &Value, pair: &Pair, phase: &str, report: &mut String) -> (usize, f64) {
    let ss: BTreeMap<IpAddr, Vec<kernel::SsConn>> = [
        (IpAddr::from(pair.ip_a), &pair.a),
        (IpAddr::from(pair.ip_b), &pair.b),
    ]
    .into_iter()
    .map(|(ip, ns): (IpAddr, &Netns)| (ip, kernel::ss_tcp(ns).unwrap()))
    .collect();
    let floor_ms = snap["slow_connections_floor_seconds"].as_f64().unwrap() * 1e3;
    let mut compared = 0;
    for c in snap["slow_connections"].as_array().unwrap() {
        let ip = |k: &str| c[k].as_str().and_then(|s| s.parse::<IpAddr>().ok());
        let (Some(local), Some(peer)) = (ip("local"), ip("peer")) else {
            continue;
        };
        let (lport, pport) = (
            c["local_port"].as_u64().unwrap(),
            c["peer_port"].as_u64().unwrap(),
        );
        if !ss.contains_key(&peer) || lport == iperf::PORT as u64 || pport == iperf::PORT as u64 {
            continue;
        }
        let Some(s) = ss.get(&local).and_then(|conns| {
            conns.iter().find(|s| {
                s.local.port() as u64 == lport && s.peer == SocketAddr::new(peer, pport as u16)
            })
        }) else {
            continue; // closed since
        };
        let Some(ss_ms) = s.rtt_ms else { continue };
        let probe_ms = c["srtt_seconds"].as_f64().unwrap() * 1e3;
        compared += 1;
        // One round trip between the tick and ss's read moves srtt by at most an eighth of
        // the sample's distance; ss prints microseconds.
        assert!(
            probe_ms <= ss_ms * 1.25 + 0.2 && probe_ms >= ss_ms * 0.8 - 0.2,
            "{phase}: {local}:{lport} -> {peer}:{pport}: probe srtt {probe_ms:.3} ms, ss \
             {ss_ms:.3} ms (floor {floor_ms:.3} ms)\n{report}"
        );
    }
    *report += &format!(
        "{phase}: floor {floor_ms:.3} ms, {} listed, {compared} compared with ss\n",
        snap["slow_connections"].as_array().unwrap().len()
    );
    (compared, floor_ms)
}

#[test]
fn the_slowest_connections_match_ss_as_the_floor_rises_and_falls() {
    cmd::require_root_and(&["ip", "nsenter", "iperf3", "tc", "ss"]);
    let pair = Pair::new(SUBNET).unwrap();
    let iface = pair.veth_a.as_str();
    pair.a
        .run(&[
            "tc", "qdisc", "add", "dev", iface, "root", "tbf", "rate", "20mbit", "burst", "256kb",
            "latency", "100ms",
        ])
        .unwrap();
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cfg.path(), "flow_scan = \"1s\"\n").unwrap();
    let mut opts = ProbeOpts::iface(iface);
    opts.extra = vec!["--config".into(), cfg.path().to_string_lossy().into()];
    let probe = Probe::start(&pair.a, opts);
    let dst = SocketAddr::new(pair.ip_b.into(), PORT);
    let _sink = traffic::TcpSinkMany::start(&pair.b, dst, LIMIT).unwrap();
    let conns: Vec<TcpStream> = (0..CHATTER)
        .map(|_| traffic::tcp_connect(&pair.a, dst, Duration::from_secs(2)).unwrap())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let chatter = chatter(conns, stop.clone());
    let _server = iperf::Server::start(&pair.b, pair.ip_b.into(), iperf::PORT).unwrap();
    let client = iperf::Client::start(
        &pair.a,
        pair.ip_b.into(),
        iperf::PORT,
        &ClientOpts::tcp(BULK_SECONDS),
    )
    .unwrap();
    thread::sleep(Duration::from_secs(3));

    // 1. Behind the queue.
    let mut report = String::new();
    let (mut compared, mut high) = (0, 0.0f64);
    for i in 0..4 {
        let (n, floor) = check(
            &probe.next_walk(WALK_WITHIN),
            &pair,
            &format!("queue, walk {i}"),
            &mut report,
        );
        compared += n;
        high = high.max(floor);
    }
    client.finish().unwrap();
    assert!(
        high > 1.0,
        "the floor never rose with the chatter's queueing delay\n{report}"
    );
    assert!(compared >= 32, "too few connections compared\n{report}");

    // 2. The queue drained.
    let drained: Vec<(usize, f64)> = (0..6)
        .map(|i| {
            check(
                &probe.next_walk(WALK_WITHIN),
                &pair,
                &format!("drained, walk {i}"),
                &mut report,
            )
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    chatter.join().unwrap();
    eprintln!("{report}");
    // Judged over the last three walks: any one walk may come up short (the chatter's srtt
    // moves by ~20% between walks, and a fall of more than a quarter empties the list once).
    // Without a queue the chatter's srtt is the receiver's delayed ACK, ~2 ms here.
    let end = &drained[drained.len() - 3..];
    assert!(
        end.iter().any(|&(_, f)| f > 0.0 && f < high / 2.0),
        "the floor did not follow the srtt down\n{report}"
    );
    assert!(
        end.iter().any(|&(n, _)| n >= 16),
        "too few connections compared at the end\n{report}"
    );
}

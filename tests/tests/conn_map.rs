//! A full connection map is counted, not silent, and does not change the open-connection
//! counts. probe runs with `[maps] conns = 32` and walks the map every tick (`flow_scan`);
//! the sock_ops program is host-wide, so both ends of every connection between the test's
//! two namespaces take an entry.
//!
//! 1. Six connections open (12 sockets, under the map's size) and three of them close:
//!    `probe_tcp_connection_evictions_total` stays 0 (a closed connection leaving the map is
//!    not an eviction), and `probe_tcp_connections` of the pair's two addresses is the
//!    sockets `ss` shows established in both namespaces.
//! 2. Forty more open in four waves a second apart (86 sockets), each sending a few bytes
//!    every 100 ms so that RTT callbacks keep inserting them: probe counts evictions, and
//!    `probe_tcp_connections` still equals `ss`'s count (sock_ops counts opens and closes per
//!    peer, not map entries).
use probe_tests::{cmd, kernel, traffic, Netns, Pair, Probe, ProbeOpts};
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::thread;
use std::time::Duration;

const SUBNET: u8 = 121;
const PORT: u16 = 5400;
const MAP: usize = 32;
const TICK: &str = "500ms";
const LIMIT: Duration = Duration::from_secs(60);

/// Established connections between the pair's addresses on PORT, seen from `ns`.
fn established(ns: &Netns, pair: &Pair) -> usize {
    kernel::ss_tcp(ns)
        .unwrap()
        .iter()
        .filter(|c| {
            let ends = [c.local, c.peer];
            c.state == "ESTAB"
                && ends.iter().any(|e| e.port() == PORT)
                && ends
                    .iter()
                    .all(|e| e.ip() == IpAddr::from(pair.ip_a) || e.ip() == IpAddr::from(pair.ip_b))
        })
        .count()
}

/// (evictions, open connections to the pair's two addresses): sock_ops is host-wide, so
/// other peers (the scrapes themselves, on loopback) are left out.
fn sample(probe: &Probe, pair: &Pair) -> (f64, f64) {
    let m = probe.metrics();
    let open = |ip: String| m.sum("probe_tcp_connections", &[("peer", ip.as_str())]);
    (
        m.sum("probe_tcp_connection_evictions_total", &[]),
        open(pair.ip_a.to_string()) + open(pair.ip_b.to_string()),
    )
}

/// Sends a few bytes on every connection, `rounds` times 100 ms apart.
fn chatter(conns: &mut [TcpStream], rounds: usize) {
    for _ in 0..rounds {
        for c in conns.iter_mut() {
            let _ = c.write_all(b"ping");
        }
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_full_connection_map_counts_evictions() {
    cmd::require_root_and(&["ip", "nsenter", "ss"]);
    let pair = Pair::new(SUBNET).unwrap();
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        cfg.path(),
        format!("flow_scan = \"{TICK}\"\n[maps]\nconns = {MAP}\n"),
    )
    .unwrap();
    let mut opts = ProbeOpts::iface(&pair.veth_a).tick(TICK);
    opts.extra = vec!["--config".into(), cfg.path().to_string_lossy().into()];
    let probe = Probe::start(&pair.a, opts);
    let dst = SocketAddr::new(pair.ip_b.into(), PORT);
    let _sink = traffic::TcpSinkMany::start(&pair.b, dst, LIMIT).unwrap();
    let connect = || traffic::tcp_connect(&pair.a, dst, Duration::from_secs(2)).unwrap();

    // 1. Under the map's size, with closes.
    let mut conns: Vec<TcpStream> = (0..6).map(|_| connect()).collect();
    chatter(&mut conns, 5);
    conns.truncate(3);
    chatter(&mut conns, 5);
    probe.wait_ticks(2);
    let (ev1, tracked1) = sample(&probe, &pair);
    let est1 = established(&pair.a, &pair);
    let mut report = format!(
        "phase 1: ss in A: {est1} established; probe: {tracked1} connections, {ev1} evictions\n"
    );
    assert_eq!(est1, 3, "{report}");
    let est1_b = established(&pair.b, &pair);
    assert_eq!(
        tracked1,
        (est1 + est1_b) as f64,
        "open connections: probe vs ss in A and B\n{report}"
    );
    assert_eq!(
        ev1, 0.0,
        "closed connections are not evictions, and 12 sockets fit in {MAP}\n{report}"
    );

    // 2. Past it.
    for wave in 1..=4 {
        conns.extend((0..10).map(|_| connect()));
        chatter(&mut conns, 10);
        let (ev, tracked) = sample(&probe, &pair);
        report += &format!(
            "wave {wave}: {} connections open; probe: {tracked} connections, {ev} evictions\n",
            conns.len()
        );
    }
    probe.wait_ticks(2);
    let (ev2, tracked2) = sample(&probe, &pair);
    let (est_a, est_b) = (established(&pair.a, &pair), established(&pair.b, &pair));
    report += &format!(
        "end: ss: {est_a} established in A, {est_b} in B; probe: {tracked2} connections, \
         {ev2} evictions"
    );
    eprintln!("{report}");
    assert_eq!((est_a, est_b), (43, 43), "{report}");
    assert!(
        est_a + est_b > MAP,
        "the test must hold more sockets than the map\n{report}"
    );
    assert!(
        ev2 > 0.0,
        "no eviction counted past the map's size\n{report}"
    );
    assert_eq!(
        tracked2,
        (est_a + est_b) as f64,
        "open connections: probe vs ss in A and B\n{report}"
    );
}

//! sock_ops keeps each peer's TCP counters in a per-CPU slot table (PEER_SLOTS) and sends a
//! peer that finds no slot on its CPU to the per-CPU hash map PEER_TCP. probe runs with
//! `[maps] peer_slots = 4`, and A opens two connections to each of 12 addresses of B: with
//! B's peer A that is 13 peers, so at least one CPU has more peers than slots and PEER_TCP is
//! used (checked with bpftool). Per peer, `probe_tcp_connections` must still equal the
//! sockets `ss` shows established, and every peer's round trips must be counted, first with
//! all connections open, then after half of them closed (a connection may open in a slot
//! and close in PEER_TCP, on another CPU).
use probe_tests::{bpfmaps, cmd, kernel, traffic, Netns, Pair, Probe, ProbeOpts};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::thread;
use std::time::Duration;

const SUBNET: u8 = 137;
const PORT: u16 = 5410;
const PEERS: u8 = 12;
const TICK: &str = "500ms";
const LIMIT: Duration = Duration::from_secs(60);

/// Established connections from `ns` to PORT, per peer address.
fn established(ns: &Netns) -> BTreeMap<IpAddr, usize> {
    let mut out = BTreeMap::new();
    for c in kernel::ss_tcp(ns).unwrap() {
        if c.state == "ESTAB" && c.peer.port() == PORT {
            *out.entry(c.peer.ip()).or_default() += 1;
        }
    }
    out
}

/// Sends a few bytes on every connection, `rounds` times 50 ms apart: each send is a round
/// trip, so an RTT callback.
fn chatter(conns: &mut [TcpStream], rounds: usize) {
    for _ in 0..rounds {
        for c in conns.iter_mut() {
            let _ = c.write_all(b"ping");
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Checks probe's per-peer connections and round trips against `ss` in A.
fn check(probe: &Probe, a: &Netns, peers: &[Ipv4Addr], want_each: usize, what: &str) {
    let m = probe.metrics();
    let ss = established(a);
    let mut report = format!("{what}:\n");
    let mut ok = true;
    for p in peers {
        let label = p.to_string();
        let open = m.sum("probe_tcp_connections", &[("peer", label.as_str())]);
        let rtts = m.sum("probe_tcp_rtt_seconds_count", &[("peer", label.as_str())]);
        let est = ss.get(&IpAddr::from(*p)).copied().unwrap_or(0);
        report += &format!("  {p}: ss {est} established; probe {open} open, {rtts} round trips\n");
        ok &= est == want_each && open == est as f64 && rtts > 0.0;
    }
    eprintln!("{report}");
    assert!(
        ok,
        "per peer, probe's open connections must equal ss's ({want_each} each) and its round trips be counted\n{report}"
    );
}

#[test]
fn peers_beyond_the_slot_table_are_counted_in_the_hash_map() {
    cmd::require_root_and(&["ip", "nsenter", "ss", "bpftool"]);
    let pair = Pair::new(SUBNET).unwrap();
    let peers: Vec<Ipv4Addr> = (10..10 + PEERS)
        .map(|h| Ipv4Addr::new(10, 231, SUBNET, h))
        .collect();
    pair.add_b_addresses(&peers).unwrap();
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cfg.path(), "[maps]\npeer_slots = 4\n").unwrap();
    let mut opts = ProbeOpts::iface(&pair.veth_a).tick(TICK);
    opts.extra = vec!["--config".into(), cfg.path().to_string_lossy().into()];
    let probe = Probe::start(&pair.a, opts);
    let any = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT);
    let _sink = traffic::TcpSinkMany::start(&pair.b, any, LIMIT).unwrap();

    let mut conns: Vec<TcpStream> = Vec::new();
    for p in &peers {
        for _ in 0..2 {
            let dst = SocketAddr::new((*p).into(), PORT);
            conns.push(traffic::tcp_connect(&pair.a, dst, Duration::from_secs(2)).unwrap());
        }
    }
    chatter(&mut conns, 20);
    probe.wait_ticks(2);
    check(&probe, &pair.a, &peers, 2, "all open");

    // Both CPUs' slots are taken and some peer's counters went to the hash map.
    let id = bpfmaps::held_map(probe.pid(), "PEER_TCP").unwrap();
    let in_map = bpfmaps::map_keys(id).unwrap().len();
    eprintln!("peers in PEER_TCP: {in_map}");
    assert!(in_map > 0, "no peer overflowed 4 slots per CPU");

    // One connection of each peer closes.
    let mut kept = Vec::new();
    for (i, c) in conns.into_iter().enumerate() {
        if i % 2 == 0 {
            kept.push(c);
        }
    }
    chatter(&mut kept, 20);
    probe.wait_ticks(3);
    check(&probe, &pair.a, &peers, 1, "one of each peer's two closed");
}

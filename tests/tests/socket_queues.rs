//! The sockets' queues (sock_diag) against `ss`.
//!
//! probe runs in namespace B. A's iperf3 client sends to B's server, and B's client sends to
//! A's server; then both servers are stopped (SIGSTOP), so B's socket from A's client fills
//! with bytes nobody reads (Recv-Q) and B's client's socket with bytes A does not take
//! (Send-Q). Once the queues hold still, probe's `probe_tcp_receive_queue_bytes` and
//! `probe_tcp_send_queue_bytes` for peer A must be what `ss` sums over B's connections to A,
//! read just before and just after the scrape. Then the bytes B's sockets carried to and
//! from A (`probe_tcp_socket_sent_bytes_total`, `..._received_bytes_total`) must be what
//! `ss -ti` shows as their `bytes_acked` and `bytes_received`: every connection opened after
//! probe's first read, so probe counts each one whole.
use std::{net::IpAddr, time::Duration};

use probe_tests::{
    cmd,
    iperf::{Client, ClientOpts, Server},
    kernel, Netns, Pair, Probe, ProbeOpts,
};

/// (Recv-Q, Send-Q) summed over `ns`'s established connections to `peer`, as `ss` shows them.
fn ss_queues(ns: &Netns, peer: IpAddr) -> (u64, u64) {
    let out = kernel::ss_established_to(ns, peer).unwrap();
    out.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((
                f.next()?.parse::<u64>().ok()?,
                f.next()?.parse::<u64>().ok()?,
            ))
        })
        .fold((0, 0), |(r, s), (a, b)| (r + a, s + b))
}

/// (bytes_acked, bytes_received) summed over `ns`'s established connections to `peer`, as
/// `ss -ti` shows them.
fn ss_carried(ns: &Netns, peer: IpAddr) -> (u64, u64) {
    kernel::ss_tcp(ns)
        .unwrap()
        .iter()
        .filter(|c| c.state == "ESTAB" && c.peer.ip() == peer)
        .fold((0, 0), |(s, r), c| {
            (s + c.bytes_acked, r + c.bytes_received)
        })
}

#[test]
fn a_peers_queued_bytes_are_what_ss_shows() {
    cmd::require_root_and(&["ip", "iperf3", "ss"]);
    let pair = Pair::new(76).unwrap();
    let (a, b) = (IpAddr::V4(pair.ip_a), IpAddr::V4(pair.ip_b));
    let mut server_b = Server::start(&pair.b, b, 5201).unwrap();
    let mut server_a = Server::start(&pair.a, a, 5202).unwrap();
    let probe = Probe::start(&pair.b, ProbeOpts::iface(&pair.veth_b).tick("500ms"));
    probe.wait_ticks(1);
    let _to_b = Client::start(&pair.a, b, 5201, &ClientOpts::tcp(30)).unwrap();
    let _to_a = Client::start(&pair.b, a, 5202, &ClientOpts::tcp(30)).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    server_b.child.signal(libc::SIGSTOP);
    server_a.child.signal(libc::SIGSTOP);

    // Bounded wait until both queues are full and hold still.
    let mut last = ss_queues(&pair.b, a);
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(250));
        let now = ss_queues(&pair.b, a);
        if now == last && now.0 > 0 && now.1 > 0 {
            break;
        }
        last = now;
    }
    // A read that costs more than a thousandth of the time is made every few ticks (the
    // last one stands in between: sockets::ticks_to_wait), so the scrape is retried, a
    // tick apart and boundedly, until probe has read since the queues held still; a read
    // from before then is the only way to differ from ss.
    let peer = a.to_string();
    let mut tries = 0;
    let m = loop {
        tries += 1;
        probe.wait_ticks(1);
        let before = ss_queues(&pair.b, a);
        let carried_before = ss_carried(&pair.b, a);
        let m = probe.metrics();
        let after = ss_queues(&pair.b, a);
        let carried_after = ss_carried(&pair.b, a);
        match check(&m, &peer, (before, after), (carried_before, carried_after)) {
            Ok(()) => break m,
            Err(e) if tries >= 12 => panic!("{e}\n{}", probe.log_tail(20)),
            Err(_) => {}
        }
    };
    assert_eq!(
        m.get("probe_source_up", &[("source", "sockets")]).unwrap(),
        Some(1.0)
    );
    server_b.child.signal(libc::SIGCONT);
    server_a.child.signal(libc::SIGCONT);
}

/// probe's queue gauges and carried-bytes counters for `peer` in `m` against ss's readings
/// just before and just after the scrape.
fn check(
    m: &probe_tests::metrics::Metrics,
    peer: &str,
    (before, after): ((u64, u64), (u64, u64)),
    (carried_before, carried_after): ((u64, u64), (u64, u64)),
) -> Result<(), String> {
    eprintln!("ss towards {peer}: (Recv-Q, Send-Q) {before:?} before the scrape, {after:?} after; (bytes_acked, bytes_received) {carried_before:?}, {carried_after:?}");
    assert!(
        before.0 > 100_000 && before.1 > 100_000,
        "both queues filled: {before:?}"
    );
    assert!(
        carried_before.0 > 1_000_000 && carried_before.1 > 1_000_000,
        "both directions carried data: {carried_before:?}"
    );
    let band = |was: u64, now: u64, slack: f64| {
        (
            was.min(now) as f64 * (1.0 - slack),
            was.max(now) as f64 * (1.0 + slack),
        )
    };
    for (name, (lo, hi)) in [
        (
            "probe_tcp_receive_queue_bytes",
            band(before.0, after.0, 0.0),
        ),
        ("probe_tcp_send_queue_bytes", band(before.1, after.1, 0.0)),
        // The queues hold still, so do the counts; 0.1% for a segment still in motion.
        (
            "probe_tcp_socket_sent_bytes_total",
            band(carried_before.0, carried_after.0, 0.001),
        ),
        (
            "probe_tcp_socket_received_bytes_total",
            band(carried_before.1, carried_after.1, 0.001),
        ),
    ] {
        let v = m.get(name, &[("peer", peer)]).map_err(|e| e.to_string())?;
        if !v.is_some_and(|v| v >= lo && v <= hi) {
            return Err(format!("{name}{{peer={peer}}} = {v:?}, ss: {lo}..={hi}"));
        }
    }
    Ok(())
}

//! `probe top` against a daemon that watches real traffic.
//!
//! A's veth carries three paced iperf3 TCP streams to three addresses of B (.2 at 4 Mbit/s,
//! .3 at 16, .4 at 48): three peers whose throughput order is the reverse of their address
//! order, so sorting by tx and by peer give opposite orders. The truth: the addresses the
//! test gave B, and iperf3's own report of what each stream carried.
//!
//! - `--once` prints one plain-text frame (no escape codes) listing the three peers, each
//!   with a tx rate within 35% of iperf3's (top counts headers, iperf3 payload; the frame is
//!   one tick, iperf3 the whole run).
//! - Driven in tmux: the peers appear with non-zero throughput, `s` changes the sort and the
//!   order follows, `/` filters, Enter opens the detail view, a daemon restart shows
//!   "reconnecting" then live data, a 40x12 terminal does not kill it, `q` exits 0 and leaves
//!   the terminal in canonical mode with echo on (checked by `stty` in the same pane).
use probe_tests::iperf::{self, ClientOpts};
use probe_tests::tmux::Tmux;
use probe_tests::{cmd, probe, Netns, Pair, Probe, ProbeOpts};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

const SUBNET: u8 = 111;
const SECONDS: u32 = 40;
/// (last octet of B's address, iperf3 pacing rate).
const STREAMS: [(u8, &str); 3] = [(2, "4M"), (3, "16M"), (4, "48M")];

fn addr(host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 231, SUBNET, host)
}

/// B answers on .3 and .4 too; A knows their MAC (no ARP on the link, as for .2).
fn add_addresses(pair: &Pair) {
    pair.add_b_addresses(&[addr(3), addr(4)]).unwrap();
}

struct Traffic {
    _servers: Vec<iperf::Server>,
    clients: Vec<(u8, iperf::Client)>,
}

fn start_traffic(pair: &Pair) -> Traffic {
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for (host, rate) in STREAMS {
        let ip = IpAddr::V4(addr(host));
        servers.push(iperf::Server::start(&pair.b, ip, iperf::PORT).unwrap());
        let mut o = ClientOpts::tcp(SECONDS);
        o.extra = vec!["-b".into(), rate.into()];
        clients.push((
            host,
            iperf::Client::start(&pair.a, ip, iperf::PORT, &o).unwrap(),
        ));
    }
    Traffic {
        _servers: servers,
        clients,
    }
}

fn top_command(ns: &Netns, port: u16, extra: &str) -> String {
    format!(
        "nsenter --net={} {} top --url http://127.0.0.1:{port} --interval 250ms {extra}",
        ns.path(),
        probe::probe_bin_checked()
    )
}

/// The rows of a screen that show an address of the test's subnet, in screen order, as last
/// octets. probe's socket view is host-wide, so A's own address (.1, the peer of B's iperf3
/// servers) is listed too.
fn subnet_rows(screen: &str) -> Vec<u8> {
    let prefix = format!("10.231.{SUBNET}.");
    screen
        .lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix(&prefix)?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .collect()
}

/// [`subnet_rows`] of the three iperf3 destinations only.
fn peer_order(screen: &str) -> Vec<u8> {
    subnet_rows(screen)
        .into_iter()
        .filter(|h| STREAMS.iter().any(|s| s.0 == *h))
        .collect()
}

/// The TX cell of a peer's row (`PEER SRTT P99 RTT RETX/s TX ...`), in bytes/s. The RTT
/// sparkline is one word (possibly empty), so TX is found as the first cell ending in B/s.
fn tx_of(screen: &str, host: u8) -> Option<f64> {
    let want = addr(host).to_string();
    let line = screen
        .lines()
        .find(|l| l.split_whitespace().next() == Some(want.as_str()))?;
    let cell = line.split_whitespace().find(|c| c.ends_with("B/s"))?;
    parse_si(cell.strip_suffix("B/s")?)
}

fn parse_si(s: &str) -> Option<f64> {
    let (num, mul) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1e3),
        'M' => (&s[..s.len() - 1], 1e6),
        'G' => (&s[..s.len() - 1], 1e9),
        _ => (s, 1.0),
    };
    Some(num.parse::<f64>().ok()? * mul)
}

fn once(pair: &Pair, port: u16) -> String {
    let out = cmd::output_within(
        &mut pair.a.command(&[
            &probe::probe_bin_checked(),
            "top",
            "--once",
            "--url",
            &format!("http://127.0.0.1:{port}"),
        ]),
        Duration::from_secs(20),
    )
    .unwrap();
    assert!(out.status.success(), "top --once failed: {}", out.stderr);
    out.stdout
}

#[test]
fn top_shows_live_peers_and_survives_restart_resize_and_quit() {
    cmd::require_root_and(&["ip", "tc", "iperf3", "tmux", "stty"]);
    let pair = Pair::new(SUBNET).unwrap();
    add_addresses(&pair);
    let opts = ProbeOpts::iface(&pair.veth_a).tick("500ms");
    let port = opts.port;
    let mut probe = Probe::start(&pair.a, opts.clone());
    let traffic = start_traffic(&pair);
    std::thread::sleep(Duration::from_secs(4));

    // --once: a plain frame with every peer and its rate.
    let frame = once(&pair, port);
    println!("--- top --once ---\n{frame}");
    assert!(!frame.contains('\x1b'), "escape codes in --once output");
    assert!(frame.starts_with("probe top "), "{frame}");
    let mut seen = subnet_rows(&frame);
    seen.sort();
    seen.dedup();
    assert!(
        seen == [2, 3, 4] || seen == [1, 2, 3, 4],
        "peers in --once are not the namespaces' addresses:\n{frame}"
    );
    let once_tx: Vec<f64> = STREAMS
        .iter()
        .map(|(h, _)| tx_of(&frame, *h).unwrap_or_else(|| panic!("no tx for .{h}:\n{frame}")))
        .collect();

    // The live view, with `stty` after it to show what state it left the terminal in.
    let shell = format!(
        "{}; echo \"TOP EXIT $?\"; echo \"TTY $(stty -a | tr ' ;' '\\n\\n' | grep -xE -- '-?(icanon|echo)' | tr '\\n' ' ')\"; sleep 60",
        top_command(&pair.a, port, "")
    );
    let t = Tmux::start(&shell, 160, 48).unwrap();
    let ours = |s: &str| peer_order(s).len() == 3;
    let screen = t
        .wait_for(
            "three peers with throughput",
            Duration::from_secs(15),
            |s| {
                ours(s)
                    && STREAMS
                        .iter()
                        .all(|(h, _)| tx_of(s, *h).is_some_and(|x| x > 0.0))
            },
        )
        .unwrap();
    println!("--- live ---\n{screen}");
    assert!(screen.contains(" live "), "{screen}");

    // Sort by tx (risk -> peer -> srtt -> p99 -> retx/s -> tx): fastest first.
    t.keys(&["s", "s", "s", "s", "s"]).unwrap();
    let screen = t
        .wait_for("sort by tx", Duration::from_secs(5), |s| {
            s.contains("sort: tx desc") && ours(s)
        })
        .unwrap();
    assert_eq!(peer_order(&screen), [4, 3, 2], "by tx:\n{screen}");
    // Back to sort by peer: ascending addresses.
    t.keys(&["S", "S", "S", "S"]).unwrap();
    let screen = t
        .wait_for("sort by peer", Duration::from_secs(5), |s| {
            s.contains("sort: peer") && ours(s)
        })
        .unwrap();
    assert_eq!(peer_order(&screen), [2, 3, 4], "by peer:\n{screen}");

    // Filter to one peer, then open its detail view.
    t.keys(&["/"]).unwrap();
    t.type_text(&format!("{SUBNET}.3")).unwrap();
    t.keys(&["Enter"]).unwrap();
    let screen = t
        .wait_for("the filter", Duration::from_secs(5), |s| {
            s.contains("Peers (1)") && peer_order(s) == [3]
        })
        .unwrap();
    println!("--- filtered ---\n{screen}");
    t.keys(&["Enter"]).unwrap();
    let detail = format!("Peer {}", addr(3));
    let screen = t
        .wait_for("the detail view", Duration::from_secs(5), |s| {
            s.contains(&detail)
        })
        .unwrap();
    println!("--- detail ---\n{screen}");
    assert!(screen.contains("srtt"), "{screen}");
    // One Escape at a time: two in a row read as one Alt-Escape.
    t.keys(&["Escape"]).unwrap();
    t.wait_for("the list again", Duration::from_secs(5), |s| {
        !s.contains(&detail)
    })
    .unwrap();
    t.keys(&["Escape"]).unwrap();
    t.wait_for("all peers again", Duration::from_secs(5), ours)
        .unwrap();

    // Daemon restart: "reconnecting", then data again.
    probe.terminate(Duration::from_secs(10));
    let screen = t
        .wait_for("reconnecting", Duration::from_secs(10), |s| {
            s.contains("reconnecting")
        })
        .unwrap();
    println!("--- daemon down ---\n{screen}");
    let probe2 = Probe::start(&pair.a, opts);
    let screen = t
        .wait_for(
            "live data after the restart",
            Duration::from_secs(20),
            |s| {
                s.contains(" live ")
                    && ours(s)
                    && STREAMS
                        .iter()
                        .all(|(h, _)| tx_of(s, *h).is_some_and(|x| x > 0.0))
            },
        )
        .unwrap();
    println!("--- daemon back ---\n{screen}");

    // A tiny terminal: still running, still drawing.
    t.resize(40, 12).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let tiny = t.capture().unwrap();
    println!("--- 40x12 ---\n{tiny}");
    assert!(!t.dead(), "top died at 40x12:\n{tiny}");
    assert!(tiny.contains("probe top"), "{tiny}");
    t.resize(160, 48).unwrap();
    t.wait_for("redraw at full size", Duration::from_secs(5), ours)
        .unwrap();

    // q: exit 0, alternate screen left, raw mode off.
    t.keys(&["q"]).unwrap();
    let screen = t
        .wait_for("top to exit", Duration::from_secs(10), |s| {
            s.contains("TTY ")
        })
        .unwrap();
    println!("--- after q ---\n{screen}");
    assert!(screen.contains("TOP EXIT 0"), "{screen}");
    assert!(
        screen.contains("TTY icanon echo"),
        "terminal not restored:\n{screen}"
    );
    assert_eq!(t.format("#{alternate_on}").unwrap(), "0");

    // Throughput against iperf3's own report of each stream.
    for ((host, client), shown) in traffic.clients.into_iter().zip(once_tx) {
        let r = client.finish().unwrap();
        let truth = r.received_bps / 8.0;
        let rel = (shown - truth).abs() / truth;
        println!(
            ".{host}: top {shown:.0} B/s, iperf3 {truth:.0} B/s ({:.0}%)",
            rel * 100.0
        );
        assert!(
            rel < 0.35,
            ".{host}: top shows {shown} B/s, iperf3 {truth} B/s"
        );
    }
    drop(probe2);
}

/// No daemon: `--once` fails with one line that names the URL; the live view says
/// "reconnecting" rather than exiting, and `q` still exits 0.
#[test]
fn top_without_a_daemon() {
    cmd::require_root_and(&["ip", "tmux"]);
    let ns = Netns::new().unwrap();
    let out = cmd::output_within(
        &mut ns.command(&[
            &probe::probe_bin_checked(),
            "top",
            "--once",
            "--url",
            "http://127.0.0.1:9464",
        ]),
        Duration::from_secs(20),
    )
    .unwrap();
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("127.0.0.1:9464") && out.stderr.trim().lines().count() == 1,
        "{}",
        out.stderr
    );
    let shell = format!(
        "{}; echo \"TOP EXIT $?\"; sleep 30",
        top_command(&ns, 9464, "")
    );
    let t = Tmux::start(&shell, 80, 24).unwrap();
    t.wait_for("reconnecting", Duration::from_secs(10), |s| {
        s.contains("reconnecting")
    })
    .unwrap();
    t.keys(&["q"]).unwrap();
    let s = t
        .wait_for("exit", Duration::from_secs(10), |s| s.contains("TOP EXIT"))
        .unwrap();
    assert!(s.contains("TOP EXIT 0"), "{s}");
}

//! Bursts against a generator that sends known bursts: one TCP connection from A to B carries
//! 20 bursts of 4 MiB, one every 200 ms (written in the test with std::net sockets made
//! inside the namespaces). probe runs with `--burst-gap 20ms`:
//! at veth speed a 4 MiB burst lasts a few ms and the packets inside it are microseconds
//! apart, while bursts are ~200 ms apart; a 20 ms gap is far longer than any gap inside a
//! burst and far shorter than the idle time between bursts, so each write is exactly one
//! burst. (The default 1 ms would also work on an idle host, but leaves no margin for a
//! sender descheduled for a millisecond on a busy 2-core machine.)
//!
//! A burst ends only when the flow's next packet comes after the gap, so the test accounts
//! for both ends explicitly:
//! - the handshake's egress packets (SYN, then the ACK of the SYN-ACK) form a burst of their
//!   own, 100 ms before the first data burst, which ends it: +1 burst, of known size;
//! - the last data burst ends only when a later packet comes: after the receiver has read
//!   everything, the test writes a 1-byte marker, which ends it and opens a burst that never
//!   ends before the final scrape (the connection stays open until then).
//!
//! So the delta of `probe_bursts_total{iface=veth,direction="egress",peer=B}` must be the
//! bursts sent + 1 (within 10%), and the mean size of the data bursts (delta of
//! `probe_burst_bytes_sum` minus the handshake burst, over the data bursts) must be within 10%
//! of their wire size. Wire size, from two sources: the root pfifo qdisc's `Sent` bytes
//! (which count a GSO packet as its segments with their headers, like probe), and the
//! arithmetic 4 MiB + one Ethernet/IP/TCP header (66 bytes with timestamps) per MSS. All
//! bursts' bytes together are flow bytes, so they must match the qdisc's bytes within 1%.
use probe_tests::histogram::Hist;
use probe_tests::{cmd, kernel, rel_diff, traffic, Metrics, Pair, Probe, ProbeOpts};
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const BURST: usize = 4 << 20;
const BURSTS: usize = 20;
const PERIOD: Duration = Duration::from_millis(200);
const GAP: &str = "20ms";
const TOLERANCE: f64 = 0.10;
/// The bytes of all bursts together are flow bytes: as exact as probe's byte counters.
const BYTES_TOLERANCE: f64 = 0.01;
const PORT: u16 = 5301;
/// Ethernet (14) + IPv4 (20) + TCP with the timestamp option (32).
const HEADERS: u64 = 14 + 20 + 32;

fn bursts(m: &Metrics, iface: &str, peer: &str) -> (f64, f64, f64) {
    let f = [("iface", iface), ("direction", "egress"), ("peer", peer)];
    (
        m.sum("probe_bursts_total", &f),
        m.sum("probe_burst_bytes_sum", &f),
        m.sum("probe_burst_bytes_count", &f),
    )
}

#[test]
fn bursts_match_the_generator() {
    cmd::require_root_and(&["ip", "nsenter", "tc"]);
    let t_start = Instant::now();
    let pair = Pair::new(65).unwrap();
    let iface = pair.veth_a.as_str();
    let peer = pair.ip_b.to_string();
    kernel::add_counting_pfifo(&pair.a, iface).unwrap();
    let fifo_sent = || kernel::counting_pfifo(&pair.a, iface).unwrap();
    let addr = SocketAddr::new(pair.ip_b.into(), PORT);
    let sink = traffic::TcpSink::start(&pair.b, addr, Duration::from_secs(30)).unwrap();
    let mut opts = ProbeOpts::iface(iface).tick("500ms");
    opts.extra = vec!["--burst-gap".into(), GAP.into()];
    let probe = Probe::start(&pair.a, opts);

    probe.wait_ticks(1);
    let m0 = probe.metrics();
    let q0 = fifo_sent();
    let mut stream = traffic::tcp_connect(&pair.a, addr, Duration::from_secs(5)).unwrap();
    let mss = traffic::tcp_mss(&stream).unwrap() as u64;
    // The handshake's burst stays apart from the first data burst.
    std::thread::sleep(Duration::from_millis(100));
    let q_hs = fifo_sent();
    let times = traffic::send_bursts(&mut stream, BURST, PERIOD, BURSTS).unwrap();
    sink.wait_for((BURST * BURSTS) as u64, Duration::from_secs(10))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let q1 = fifo_sent();
    // Ends the last data burst.
    stream.write_all(&[1]).unwrap();
    probe.wait_ticks(2);
    let m1 = probe.metrics();
    drop(stream);
    let received = sink.finish().unwrap();

    let (b0, s0, c0) = bursts(&m0, iface, &peer);
    let (b1, s1, c1) = bursts(&m1, iface, &peer);
    let (db, ds, dc) = (b1 - b0, s1 - s0, c1 - c0);
    let handshake = (q_hs.sent_bytes - q0.sent_bytes) as f64;
    let expected_count = (BURSTS + 1) as f64;
    let mean = (ds - handshake) / (dc - 1.0);
    let fifo_total = (q1.sent_bytes - q0.sent_bytes) as f64;
    let fifo_per_burst = (q1.sent_bytes - q_hs.sent_bytes) as f64 / BURSTS as f64;
    let segments = (BURST as u64).div_ceil(mss);
    let arithmetic = (BURST as u64 + segments * HEADERS) as f64;
    // For the log only (queues.rs asserts the histogram contract): where the bursts landed.
    let f = [
        ("iface", iface),
        ("direction", "egress"),
        ("peer", peer.as_str()),
    ];
    let hist = Hist::from_metrics(&m1, "probe_burst_bytes", &f);
    let in_4m_bucket = match (&hist, Hist::from_metrics(&m0, "probe_burst_bytes", &f)) {
        (Some(h1), Some(h0)) => h1.minus(&h0).count_between(4194304.0, 8388608.0),
        (Some(h1), None) => h1.count_between(4194304.0, 8388608.0),
        _ => f64::NAN,
    };
    let contract = hist.map(|h| h.contract_violations()).unwrap_or_default();
    let writes: Vec<u128> = times.iter().map(|(a, b)| (*b - *a).as_millis()).collect();
    let report = format!(
        "{BURSTS} bursts of {BURST} B every {PERIOD:?} (write times ms: {writes:?}); \
         received {received} B; mss {mss}\n\
         probe_bursts_total delta {db} (expected {expected_count}: {BURSTS} + the handshake's), \
         _count delta {dc}\n\
         burst bytes: sum delta {ds} vs pfifo {fifo_total} ({:+.3}%); handshake burst \
         {handshake} B (pfifo), mean data burst {mean:.0} B\n\
         wire size per burst: pfifo {fifo_per_burst:.0} B ({:+.2}%), arithmetic \
         {arithmetic:.0} B = payload + {segments} x {HEADERS} B ({:+.2}%)\n\
         probe_burst_bytes: {in_4m_bucket} new in (4 MiB, 8 MiB]; histogram contract: \
         {contract:?}\n\
         pfifo drops {}; test time {:.1} s",
        100.0 * (ds - fifo_total) / fifo_total,
        100.0 * (mean - fifo_per_burst) / fifo_per_burst,
        100.0 * (mean - arithmetic) / arithmetic,
        q1.dropped - q0.dropped,
        t_start.elapsed().as_secs_f64()
    );
    eprintln!("{report}");

    assert_eq!(received, (BURST * BURSTS) as u64 + 1, "{report}");
    assert!(
        rel_diff(db, expected_count) <= TOLERANCE,
        "burst count off by more than {}%\n{report}",
        100.0 * TOLERANCE
    );
    assert_eq!(
        db, dc,
        "probe_bursts_total and the histogram's _count differ\n{report}"
    );
    assert!(
        rel_diff(ds, fifo_total) <= BYTES_TOLERANCE,
        "the bytes of all bursts vs the qdisc's wire bytes: off by more than {}%\n{report}",
        100.0 * BYTES_TOLERANCE
    );
    assert!(
        rel_diff(mean, fifo_per_burst) <= TOLERANCE,
        "mean burst size vs the qdisc's wire bytes per burst: off by more than {}%\n{report}",
        100.0 * TOLERANCE
    );
    assert!(
        rel_diff(mean, arithmetic) <= TOLERANCE,
        "mean burst size vs 4 MiB + headers: off by more than {}%\n{report}",
        100.0 * TOLERANCE
    );
}

/// The per-peer histograms are folded in user space from the burst-end rings; a burst its
/// CPU's full ring refuses is folded by the TC program into PEER_BURSTS instead. With the rings
/// at their smallest (`[maps] burst_events_bytes_per_cpu = 4096`, 64 records per CPU, drained
/// every 100 ms) and 100 connections each ending a burst every 100 ms (200 records per round
/// with the ACK bursts coming back), most events are lost, and the counts must still be exact:
/// - each connection's egress ends 1 + ROUNDS bursts: the handshake (SYN, then the ACK of
///   the SYN-ACK, microseconds apart), then one per round of small writes 100 ms apart; the
///   last round's is ended by a 1-byte marker whose own burst never ends before the scrape;
/// - those bursts hold every egress byte the pfifo qdisc sent before the markers (within 1%).
#[test]
fn burst_counts_stay_exact_when_the_event_ring_is_full() {
    const CONNS: usize = 100;
    const ROUNDS: usize = 5;
    const RING_PORT: u16 = 5302;
    const RING_TOLERANCE: f64 = 0.02;
    cmd::require_root_and(&["ip", "nsenter", "tc"]);
    let pair = Pair::new(69).unwrap();
    let iface = pair.veth_a.as_str();
    let peer = pair.ip_b.to_string();
    kernel::add_counting_pfifo(&pair.a, iface).unwrap();
    let fifo_sent = || kernel::counting_pfifo(&pair.a, iface).unwrap().sent_bytes;
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cfg.path(), "[maps]\nburst_events_bytes_per_cpu = 4096\n").unwrap();
    let mut opts = ProbeOpts::iface(iface).tick("500ms");
    opts.extra = vec![
        "--burst-gap".into(),
        GAP.into(),
        "--config".into(),
        cfg.path().to_string_lossy().into(),
    ];
    let probe = Probe::start(&pair.a, opts);
    let addr = SocketAddr::new(pair.ip_b.into(), RING_PORT);
    let _sink = traffic::TcpSinkMany::start(&pair.b, addr, Duration::from_secs(60)).unwrap();

    probe.wait_ticks(1);
    let m0 = probe.metrics();
    let q0 = fifo_sent();
    let mut conns: Vec<_> = (0..CONNS)
        .map(|_| traffic::tcp_connect(&pair.a, addr, Duration::from_secs(5)).unwrap())
        .collect();
    for _ in 0..ROUNDS {
        std::thread::sleep(PERIOD / 2);
        for c in conns.iter_mut() {
            c.write_all(&[7u8; 100]).unwrap();
        }
    }
    std::thread::sleep(PERIOD / 2);
    let q1 = fifo_sent();
    for c in conns.iter_mut() {
        c.write_all(&[1]).unwrap();
    }
    probe.wait_ticks(2);
    let m1 = probe.metrics();
    drop(conns);

    let (b0, s0, c0) = bursts(&m0, iface, &peer);
    let (b1, s1, c1) = bursts(&m1, iface, &peer);
    let (db, ds, dc) = (b1 - b0, s1 - s0, c1 - c0);
    let lost = m1.sum("probe_events_lost_total", &[]) - m0.sum("probe_events_lost_total", &[]);
    let expected = (CONNS * (ROUNDS + 1)) as f64;
    let fifo = (q1 - q0) as f64;
    let report = format!(
        "{CONNS} connections x (handshake + {ROUNDS} rounds): probe_bursts_total delta {db} \
         (expected {expected}), _count delta {dc}; burst bytes {ds} vs pfifo {fifo} ({:+.3}%); \
         events lost {lost}",
        100.0 * (ds - fifo) / fifo
    );
    eprintln!("{report}");
    assert!(
        lost > expected / 2.0,
        "the 4 KiB rings should have lost most events\n{report}"
    );
    assert!(
        rel_diff(db, expected) <= RING_TOLERANCE,
        "burst count off by more than {}%\n{report}",
        100.0 * RING_TOLERANCE
    );
    assert_eq!(db, dc, "probe_bursts_total and _count differ\n{report}");
    assert!(
        rel_diff(ds, fifo) <= BYTES_TOLERANCE,
        "the bytes of all bursts vs the qdisc's: off by more than {}%\n{report}",
        100.0 * BYTES_TOLERANCE
    );
}

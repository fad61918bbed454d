//! Burst events (one per ended burst, streamed from the kernel through a ring buffer) against
//! a generator that sends known burst trains, and against the qdisc's wire counters.
//!
//! Two patterns, each on its own veth pair with its own probe: 20 bursts of 4 MiB one every
//! 200 ms, and 30 bursts of 1 MiB one every 100 ms, each written on one TCP connection from A
//! to B (std::net sockets made inside the namespaces). probe runs at a 500 ms tick with
//! `--burst-gap 30ms`: far longer than any gap inside a burst at veth speed, far shorter than
//! the idle time between bursts. The test reads `/api/v1/snapshot` every 100 ms, keeps each
//! tick's `burst_events` once (by the tick's `time_unix`; two snapshots seen more than 1.5
//! ticks apart fail the test, since the events of one between them would be unseen), and
//! checks:
//! - count: the data bursts sent, plus one for the handshake's egress packets (SYN, ACK),
//!   which form a burst of their own 100 ms before the first write. The last data burst is
//!   ended by a 1-byte marker written after the sink has read everything (that marker opens
//!   a burst that does not end before the test stops looking);
//! - timing: the median interval between consecutive data bursts' starts is the period
//!   within 5%, and each start is within 20 ms of the wall-clock time its write began (this
//!   checks the kernel-monotonic to Unix-time conversion);
//! - size: the events' bytes and packets summed equal the root pfifo qdisc's `Sent` bytes and
//!   packets over the same span within 1% (the qdisc counts a GSO packet as its segments
//!   with their headers, as probe does); the handshake event's bytes are the qdisc's bytes
//!   before the first write;
//! - `events_lost` stays 0.
use probe_tests::{cmd, kernel, median, netns, rel_diff, traffic, Pair, Probe, ProbeOpts};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const GAP: &str = "30ms";
const TICK: &str = "500ms";
const POLL: Duration = Duration::from_millis(100);
const PERIOD_TOLERANCE: f64 = 0.05;
const BYTES_TOLERANCE: f64 = 0.01;
/// How far an event's start may be from the wall-clock start of its write.
const START_SKEW: f64 = 0.020;

#[derive(Debug, Clone)]
struct Event {
    start: f64,
    duration: f64,
    bytes: u64,
    packets: u64,
}

/// What the poller saw: tick time (f64 bits, Unix seconds: positive, so they sort as the
/// times do) -> (events of the watched series, events_lost).
type Seen = BTreeMap<u64, (Vec<Event>, u64)>;

fn parse_tick(body: &str, iface: &str, peer: &str) -> Option<(u64, Vec<Event>, u64)> {
    let v: Value = serde_json::from_str(body).ok()?;
    let tick = v["time_unix"].as_f64().filter(|t| *t > 0.0)?.to_bits();
    let events = v["burst_events"]
        .as_array()?
        .iter()
        .filter(|e| e["iface"] == iface && e["direction"] == "egress" && e["peer"] == peer)
        .map(|e| Event {
            start: e["start_unix"].as_f64().unwrap_or(f64::NAN),
            duration: e["duration_s"].as_f64().unwrap_or(f64::NAN),
            bytes: e["bytes"].as_u64().unwrap_or(0),
            packets: e["packets"].as_u64().unwrap_or(0),
        })
        .collect();
    Some((tick, events, v["events_lost"].as_u64()?))
}

/// Reads the snapshot every POLL until `stop`, keeping each tick once.
fn poll(
    ns_path: String,
    addr: SocketAddr,
    iface: String,
    peer: String,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
) {
    while !stop.load(Ordering::Relaxed) {
        let r = netns::enter_path(&ns_path, || {
            probe_tests::http::get(addr, "/api/v1/snapshot", Duration::from_secs(2))
        });
        if let Ok(Ok(r)) = r {
            if let Some((tick, events, lost)) = parse_tick(&r.body, &iface, &peer) {
                seen.lock().unwrap().entry(tick).or_insert((events, lost));
            }
        }
        std::thread::sleep(POLL);
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn burst_events_match(subnet: u8, burst: usize, period: Duration, bursts: usize, port: u16) {
    cmd::require_root_and(&["ip", "nsenter", "tc"]);
    let t_start = Instant::now();
    let pair = Pair::new(subnet).unwrap();
    let iface = pair.veth_a.clone();
    let peer = pair.ip_b.to_string();
    // A FIFO that never drops, only for its wire-equivalent byte and packet counters.
    kernel::add_counting_pfifo(&pair.a, &iface).unwrap();
    let fifo = || kernel::counting_pfifo(&pair.a, &iface).unwrap();
    let addr = SocketAddr::new(pair.ip_b.into(), port);
    let sink = traffic::TcpSink::start(&pair.b, addr, Duration::from_secs(30)).unwrap();
    let mut opts = ProbeOpts::iface(&iface).tick(TICK);
    opts.extra = vec!["--burst-gap".into(), GAP.into()];
    let probe = Probe::start(&pair.a, opts);

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::new()));
    let poller = {
        let (ns, a, i, p, s, seen) = (
            pair.a.path(),
            probe.addr(),
            iface.clone(),
            peer.clone(),
            stop.clone(),
            seen.clone(),
        );
        std::thread::spawn(move || poll(ns, a, i, p, s, seen))
    };

    probe.wait_ticks(1);
    let q0 = fifo();
    let mut stream = traffic::tcp_connect(&pair.a, addr, Duration::from_secs(5)).unwrap();
    // The handshake's burst stays apart from the first data burst.
    std::thread::sleep(Duration::from_millis(100));
    let q_hs = fifo();
    // Instants of the writes, placed on the wall clock.
    let (mono0, wall0) = (Instant::now(), unix_now());
    let times = traffic::send_bursts(&mut stream, burst, period, bursts).unwrap();
    sink.wait_for((burst * bursts) as u64, Duration::from_secs(10))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let q1 = fifo();
    // Ends the last data burst.
    stream.write_all(&[1]).unwrap();
    probe.wait_ticks(2);
    stop.store(true, Ordering::Relaxed);
    poller.join().unwrap();
    drop(stream);
    let received = sink.finish().unwrap();

    let seen = seen.lock().unwrap().clone();
    let ticks: Vec<f64> = seen.keys().map(|t| f64::from_bits(*t)).collect();
    let tick_s = probe.opts.tick_duration().as_secs_f64();
    let missed: Vec<f64> = ticks
        .windows(2)
        .map(|w| w[1] - w[0])
        .filter(|d| *d > 1.5 * tick_s)
        .collect();
    let lost = seen.values().last().map_or(u64::MAX, |(_, l)| *l);
    let mut events: Vec<Event> = seen.into_values().flat_map(|(e, _)| e).collect();
    events.sort_by(|a, b| a.start.total_cmp(&b.start));

    let handshake_bytes = q_hs.sent_bytes - q0.sent_bytes;
    let fifo_bytes = q1.sent_bytes - q0.sent_bytes;
    let fifo_packets = q1.sent_packets - q0.sent_packets;
    let ev_bytes: u64 = events.iter().map(|e| e.bytes).sum();
    let ev_packets: u64 = events.iter().map(|e| e.packets).sum();
    let data: Vec<&Event> = events.iter().skip(1).collect();
    let intervals: Vec<f64> = data.windows(2).map(|w| w[1].start - w[0].start).collect();
    let median_interval = median(&intervals).unwrap_or(f64::NAN);
    let write_starts: Vec<f64> = times
        .iter()
        .map(|(t0, _)| wall0 + (*t0 - mono0).as_secs_f64())
        .collect();
    let skews: Vec<f64> = data
        .iter()
        .zip(&write_starts)
        .map(|(e, w)| e.start - w)
        .collect();
    let max_skew = skews.iter().fold(0.0f64, |m, s| m.max(s.abs()));
    let sizes: Vec<u64> = events.iter().map(|e| e.bytes).collect();
    let durations_ms: Vec<String> = events
        .iter()
        .map(|e| format!("{:.2}", e.duration * 1e3))
        .collect();
    let report = format!(
        "{bursts} bursts of {burst} B every {period:?}; received {received} B\n\
         {} ticks seen over {:.1} s (gaps over 1.5 ticks: {missed:?} s); events_lost {lost}\n\
         events {} (expected {} = {bursts} + the handshake's); sizes {sizes:?}\n\
         durations ms {durations_ms:?}\n\
         median interval {:.4} s (period {:.4} s, {:+.2}%); start - write start: max |{:.4}| s\n\
         bytes: events {ev_bytes} vs pfifo {fifo_bytes} ({:+.3}%); handshake event {} B vs \
         pfifo {handshake_bytes} B\n\
         packets: events {ev_packets} vs pfifo {fifo_packets} ({:+.3}%)\n\
         test time {:.1} s",
        ticks.len(),
        ticks.last().unwrap_or(&0.0) - ticks.first().unwrap_or(&0.0),
        events.len(),
        bursts + 1,
        median_interval,
        period.as_secs_f64(),
        100.0 * (median_interval - period.as_secs_f64()) / period.as_secs_f64(),
        max_skew,
        100.0 * (ev_bytes as f64 - fifo_bytes as f64) / fifo_bytes as f64,
        events.first().map_or(0, |e| e.bytes),
        100.0 * (ev_packets as f64 - fifo_packets as f64) / fifo_packets as f64,
        t_start.elapsed().as_secs_f64()
    );
    eprintln!("{report}");

    assert_eq!(received, (burst * bursts) as u64 + 1, "{report}");
    assert!(missed.is_empty(), "the poller missed ticks\n{report}");
    assert_eq!(lost, 0, "events were lost\n{report}");
    assert_eq!(events.len(), bursts + 1, "event count\n{report}");
    assert_eq!(
        events[0].bytes, handshake_bytes,
        "the first event is the handshake's burst\n{report}"
    );
    assert!(
        rel_diff(median_interval, period.as_secs_f64()) <= PERIOD_TOLERANCE,
        "median interval between burst starts off by more than {}%\n{report}",
        100.0 * PERIOD_TOLERANCE
    );
    assert!(
        max_skew <= START_SKEW,
        "an event's start is more than {START_SKEW} s from its write's start\n{report}"
    );
    assert!(
        rel_diff(ev_bytes as f64, fifo_bytes as f64) <= BYTES_TOLERANCE,
        "event bytes vs the qdisc's wire bytes: off by more than {}%\n{report}",
        100.0 * BYTES_TOLERANCE
    );
    assert!(
        rel_diff(ev_packets as f64, fifo_packets as f64) <= BYTES_TOLERANCE,
        "event packets vs the qdisc's packets: off by more than {}%\n{report}",
        100.0 * BYTES_TOLERANCE
    );
}

#[test]
fn events_match_a_4mib_200ms_train() {
    burst_events_match(88, 4 << 20, Duration::from_millis(200), 20, 5881);
}

#[test]
fn events_match_a_1mib_100ms_train() {
    burst_events_match(89, 1 << 20, Duration::from_millis(100), 30, 5891);
}

//! Queue depth and sojourn time against the kernel's own view of the qdisc.
//!
//! A tbf bottleneck (40 Mbit/s, burst 128 KiB, a 4 MiB limit so it queues rather than drops)
//! on A's egress carries three iperf3 TCP streams plus a UDP cross flow. TCP keeps a few GSO
//! super-packets per socket in the queue (TCP small queues), the UDP flow adds its
//! one-segment datagrams, so the queue holds tens of packets and a few hundred KB: tens of ms
//! of queueing.
//!
//! - Backlog. probe reads the qdisc stats once per tick (200 ms here), so "the same instant"
//!   is the tick's, not the scrape's: each sample pairs a scrape of /metrics with the
//!   snapshot it was rendered from (/api/v1/snapshot read before and after the scrape; the
//!   sample counts only if both name the same tick) and compares probe's
//!   `probe_qdisc_backlog_{packets,bytes}` with the `tc -s qdisc show` reading that a
//!   background sampler (one every ~10 ms) took nearest to that tick's `time_unix`. The
//!   median relative difference over ~10 ticks must be within 20%.
//! - Sojourn. Over the loaded interval, the mean of `probe_qdisc_sojourn_seconds` (delta of
//!   _sum over delta of _count) is in the tens of ms and agrees with Little's law on the tc
//!   readings of the same interval (mean backlog bytes / tbf rate) within a factor of 2;
//!   most packets fall in buckets above 8 ms; after the load stops, light traffic through
//!   the now empty qdisc has a mean sojourn near zero (< 1 ms). The histogram must keep the
//!   OpenMetrics contract (cumulative buckets, `+Inf` = `_count`).
//! - The sojourn of an interface is that interface's alone: the qdisc tracepoints fire for
//!   every device of the host, and interface indexes repeat across network namespaces, so a
//!   busy queue on a device with the same index in another namespace must not show up.
//!
//! The sojourn test gives its veth an unusual interface index (6201): the first veth of
//! every fresh namespace has index 2, like the veths of any test running beside this one.
use probe_tests::histogram::Hist;
use probe_tests::iperf::{self, ClientOpts};
use probe_tests::timeline::{self, Timeline};
use probe_tests::{
    cmd, kernel, link, median, rel_diff, traffic, Metrics, Netns, Pair, Probe, ProbeOpts,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const RATE: &str = "40mbit";
const RATE_BYTES_PER_S: f64 = 40e6 / 8.0;
const TOLERANCE: f64 = 0.20;
/// Ticks to compare, and attempts at a scrape whose tick is known, at most.
const PAIRS: usize = 10;
const ATTEMPTS: usize = 20;
const LOAD_SECONDS: u32 = 8;
const UDP_PORT: u16 = 5202;
const SOJOURN: &str = "probe_qdisc_sojourn_seconds";

/// What a qdisc holds.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Backlog {
    bytes: f64,
    packets: f64,
}

/// `tc -s qdisc show dev DEV`: the tbf qdisc's backlog.
fn tc_backlog(ns: &Netns, dev: &str) -> anyhow::Result<Backlog> {
    let q = kernel::qdiscs(ns, dev)?
        .into_iter()
        .find(|q| q.kind == "tbf")
        .ok_or_else(|| anyhow::anyhow!("no tbf qdisc on {dev}"))?;
    Ok(Backlog {
        bytes: q.backlog_bytes as f64,
        packets: q.backlog_packets as f64,
    })
}

/// probe's view of the tbf backlog on `iface` in a scrape.
fn probe_backlog(m: &Metrics, iface: &str) -> Option<Backlog> {
    let f = [("iface", iface), ("qdisc", "tbf")];
    Some(Backlog {
        bytes: m.get("probe_qdisc_backlog_bytes", &f).ok()??,
        packets: m.get("probe_qdisc_backlog_packets", &f).ok()??,
    })
}

/// The tick time (`time_unix`) of probe's latest snapshot.
fn snapshot_time(probe: &Probe) -> anyhow::Result<f64> {
    let r = probe.get("/api/v1/snapshot")?;
    let v: serde_json::Value = serde_json::from_str(&r.body)?;
    v.get("time_unix")
        .and_then(|t| t.as_f64())
        .ok_or_else(|| anyhow::anyhow!("no time_unix in the snapshot"))
}

/// A scrape together with the tick it was rendered from: snapshot, /metrics, snapshot; only
/// if both snapshots are of the same tick.
fn scrape_at_known_tick(probe: &Probe) -> Option<(f64, Metrics)> {
    let t0 = snapshot_time(probe).ok()?;
    let m = probe.try_metrics().ok()?;
    let t1 = snapshot_time(probe).ok()?;
    (t0 == t1).then_some((t0, m))
}

/// [`scrape_at_known_tick`], retried a few times (bounded).
fn scrape_with_tick(probe: &Probe) -> (f64, Metrics) {
    for _ in 0..10 {
        if let Some(x) = scrape_at_known_tick(probe) {
            return x;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no scrape matched its snapshot in 10 attempts")
}

/// A tbf bottleneck on `iface` (in `ns`) and traffic through it: 3 TCP streams and an 8 Mbit/s
/// UDP flow from A to B for [`LOAD_SECONDS`].
struct Load {
    _servers: [iperf::Server; 2],
    tcp: iperf::Client,
    udp: iperf::Client,
}

fn add_tbf(ns: &Netns, dev: &str) {
    ns.run(&[
        "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate", RATE, "burst",
        "128kb", "limit", "4mb",
    ])
    .unwrap();
}

impl Load {
    fn start(pair: &Pair) -> Load {
        let servers = [
            iperf::Server::start(&pair.b, pair.ip_b.into(), iperf::PORT).unwrap(),
            iperf::Server::start(&pair.b, pair.ip_b.into(), UDP_PORT).unwrap(),
        ];
        let mut tcp = ClientOpts::tcp(LOAD_SECONDS);
        tcp.extra = vec!["-P".into(), "3".into()];
        let tcp = iperf::Client::start(&pair.a, pair.ip_b.into(), iperf::PORT, &tcp).unwrap();
        let udp = iperf::Client::start(
            &pair.a,
            pair.ip_b.into(),
            UDP_PORT,
            &ClientOpts::udp(LOAD_SECONDS, "8M"),
        )
        .unwrap();
        Load {
            _servers: servers,
            tcp,
            udp,
        }
    }

    /// Waits for both clients; their throughput, Mbit/s.
    fn finish(self) -> (f64, f64) {
        let t = self.tcp.finish().unwrap();
        let u = self.udp.finish().unwrap();
        (t.received_bps / 1e6, u.received_bps / 1e6)
    }
}

fn assert_sojourn_hook(probe: &Probe) {
    let m = probe.metrics();
    assert_eq!(
        m.get("probe_hook_attached", &[("hook", "qdisc_sojourn")])
            .unwrap(),
        Some(1.0),
        "the qdisc tracepoints are not attached\n{}",
        probe.log_tail(20)
    );
}

/// Samples the tbf backlog with tc, back to back, while `body` runs.
fn with_tc_sampler<T>(ns: &Netns, dev: &str, body: impl FnOnce() -> T) -> (Timeline<Backlog>, T) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            timeline::sample(
                || tc_backlog(ns, dev),
                &stop,
                Duration::ZERO,
                Duration::from_secs(20),
                10_000,
            )
        });
        // Let the sampler start before the first tick that counts.
        std::thread::sleep(Duration::from_millis(100));
        let out = body();
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
        (sampler.join().expect("tc sampler panicked"), out)
    })
}

#[test]
fn backlog_matches_tc_at_the_same_tick() {
    cmd::require_root_and(&["ip", "nsenter", "iperf3", "tc"]);
    let t_start = Instant::now();
    let pair = Pair::new(61).unwrap();
    let iface = pair.veth_a.as_str();
    add_tbf(&pair.a, iface);
    let probe = Probe::start(&pair.a, ProbeOpts::iface(iface).tick("200ms"));
    let load = Load::start(&pair);
    // Past slow start, whose overshoot briefly fills the queue far beyond the steady state.
    std::thread::sleep(Duration::from_secs(2));

    let (tc_line, ticks) = with_tc_sampler(&pair.a, iface, || {
        let mut ticks: Vec<(f64, Backlog)> = Vec::new();
        for _ in 0..ATTEMPTS {
            if ticks.len() >= PAIRS {
                break;
            }
            if let Some((t, m)) = scrape_at_known_tick(&probe) {
                if let Some(b) = probe_backlog(&m, iface) {
                    if ticks.last().is_none_or(|(last, _)| *last != t) {
                        ticks.push((t, b));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(230));
        }
        ticks
    });
    let (tcp_mbps, udp_mbps) = load.finish();

    let mut table = format!(
        "tc readings: {} (median interval {:.1} ms); iperf3 TCP {tcp_mbps:.1} Mbit/s, UDP \
         {udp_mbps:.1} Mbit/s\n{:>14} {:>9} {:>9} {:>7} {:>8} {:>8} {:>7} {:>9}\n",
        tc_line.readings.len(),
        1e3 * tc_line.median_interval().unwrap_or(f64::NAN),
        "tick",
        "probe_B",
        "tc_B",
        "diff",
        "probe_p",
        "tc_p",
        "diff",
        "tc_dt_ms",
    );
    let (mut d_bytes, mut d_pkts) = (Vec::new(), Vec::new());
    let mut in_range = 0;
    for (t, b) in &ticks {
        let Some((r, dt)) = tc_line.nearest(*t) else {
            continue;
        };
        // Only a reading close to the tick is a reading of the same instant.
        if dt > 0.010 {
            table += &format!("{t:>14.3} no tc reading within 10 ms (nearest {dt:.3} s)\n");
            continue;
        }
        let (db, dp) = (
            rel_diff(b.bytes, r.value.bytes),
            rel_diff(b.packets, r.value.packets),
        );
        d_bytes.push(db);
        d_pkts.push(dp);
        // For the log: is probe's value inside the range tc showed within +-10 ms?
        let around: Vec<f64> = tc_line
            .overlapping(t - 0.010, t + 0.010)
            .map(|r| r.value.bytes)
            .collect();
        let lo = around.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = around.iter().copied().fold(0.0, f64::max);
        if (lo..=hi).contains(&b.bytes) {
            in_range += 1;
        }
        table += &format!(
            "{t:>14.3} {:>9.0} {:>9.0} {:>6.1}% {:>8.0} {:>8.0} {:>6.1}% {:>9.1}\n",
            b.bytes,
            r.value.bytes,
            100.0 * db,
            b.packets,
            r.value.packets,
            100.0 * dp,
            1e3 * (r.mid() - t)
        );
    }
    let (mb, mp) = (median(&d_bytes), median(&d_pkts));
    table += &format!(
        "median diff: bytes {:.1}%, packets {:.1}%; {in_range}/{} ticks inside tc's range \
         within +-10 ms; test time {:.1} s",
        100.0 * mb.unwrap_or(f64::NAN),
        100.0 * mp.unwrap_or(f64::NAN),
        d_bytes.len(),
        t_start.elapsed().as_secs_f64()
    );
    eprintln!("{table}");

    assert!(
        d_bytes.len() >= PAIRS / 2,
        "too few ticks paired with a tc reading\n{table}"
    );
    let mean_tc: f64 = ticks.iter().map(|(_, b)| b.bytes).sum::<f64>() / ticks.len() as f64;
    assert!(mean_tc > 50_000.0, "no queue built up in the tbf\n{table}");
    assert!(
        mb.unwrap() <= TOLERANCE,
        "backlog bytes: median difference above {}%\n{table}",
        100.0 * TOLERANCE
    );
    assert!(
        mp.unwrap() <= TOLERANCE,
        "backlog packets: median difference above {}%\n{table}",
        100.0 * TOLERANCE
    );
}

#[test]
fn sojourn_follows_the_queue() {
    cmd::require_root_and(&["ip", "nsenter", "iperf3", "tc"]);
    let t_start = Instant::now();
    let pair = Pair::new(62).unwrap();
    link::reindex_pair(&pair, 6201, 6202).unwrap();
    let iface = pair.veth_a.as_str();
    add_tbf(&pair.a, iface);
    let probe = Probe::start(&pair.a, ProbeOpts::iface(iface).tick("200ms"));
    assert_sojourn_hook(&probe);
    let hist = |m: &Metrics| Hist::from_metrics(m, SOJOURN, &[("iface", iface)]);

    let load = Load::start(&pair);
    std::thread::sleep(Duration::from_secs(2));
    let (tc_line, ((t0, m0), (t1, m1))) = with_tc_sampler(&pair.a, iface, || {
        let first = scrape_with_tick(&probe);
        std::thread::sleep(Duration::from_secs(3));
        (first, scrape_with_tick(&probe))
    });
    let (tcp_mbps, udp_mbps) = load.finish();

    // Little's law on tc's readings between the two ticks: mean backlog / service rate.
    let backlog: Vec<f64> = tc_line.overlapping(t0, t1).map(|r| r.value.bytes).collect();
    let tc_mean = backlog.iter().sum::<f64>() / backlog.len().max(1) as f64;
    let little = tc_mean / RATE_BYTES_PER_S;
    let (h0, h1) = (hist(&m0), hist(&m1));
    let loaded = match (&h0, &h1) {
        (Some(a), Some(b)) => b.minus(a),
        _ => panic!(
            "no {SOJOURN}{{iface=\"{iface}\"}} series under load\n{}",
            probe.log_tail(20)
        ),
    };
    let mean = loaded.mean();

    // After the load: the queue drains, then light traffic through the empty qdisc.
    probe.wait_ticks(2);
    let m2 = probe.metrics();
    let drained = tc_backlog(&pair.a, iface).unwrap();
    let sent = traffic::udp_send(
        &pair.a,
        SocketAddr::new(pair.ip_b.into(), 9),
        40,
        200,
        1,
        Duration::from_millis(20),
    )
    .unwrap();
    probe.wait_ticks(2);
    let m3 = probe.metrics();
    let idle = hist(&m3).unwrap().minus(&hist(&m2).unwrap());

    let violations = h1.as_ref().unwrap().contract_violations();
    let above_8ms = loaded.count_above(0.008);
    let report = format!(
        "iperf3 TCP {tcp_mbps:.1} Mbit/s, UDP {udp_mbps:.1} Mbit/s\n\
         under load ({:.1} s): {:.0} packets, mean sojourn {:.1} ms; tc: {} readings, mean \
         backlog {tc_mean:.0} B / {RATE} = {:.1} ms (probe/Little {:.2})\n\
         buckets: {:.0} of {:.0} packets above 8 ms\n\
         after the load: tc backlog {drained:?}; {sent} datagrams -> {:.0} samples, mean {:.3} ms\n\
         histogram contract: {}\nlast scrape's buckets: {:?}\ntest time {:.1} s",
        t1 - t0,
        loaded.count,
        1e3 * mean,
        backlog.len(),
        1e3 * little,
        mean / little,
        above_8ms,
        loaded.count,
        idle.count,
        1e3 * idle.mean(),
        if violations.is_empty() {
            "ok".to_string()
        } else {
            violations.join("; ")
        },
        h1.as_ref().unwrap().buckets,
        t_start.elapsed().as_secs_f64()
    );
    eprintln!("{report}");

    assert!(tc_mean > 50_000.0, "no queue built up in the tbf\n{report}");
    assert!(loaded.count > 1000.0, "too few sojourn samples\n{report}");
    assert!(
        mean >= 0.010,
        "the mean sojourn under load should be tens of ms\n{report}"
    );
    assert!(
        (0.5..=2.0).contains(&(mean / little)),
        "the mean sojourn and Little's law on tc's backlog disagree by more than 2x\n{report}"
    );
    assert!(
        idle.count >= sent as f64,
        "the light traffic after the load left too few sojourn samples\n{report}"
    );
    assert!(
        idle.mean() < 0.001,
        "the mean sojourn should fall back near zero once the queue is empty\n{report}"
    );
    assert!(
        violations.is_empty(),
        "{SOJOURN} breaks the histogram contract: {}\n{report}",
        violations.join("; ")
    );
    assert!(
        above_8ms >= 0.5 * loaded.count,
        "most packets should wait more than 8 ms under load\n{report}"
    );
}

#[test]
fn sojourn_counts_only_the_monitored_interface() {
    cmd::require_root_and(&["ip", "nsenter", "tc"]);
    // Two pairs whose A ends have the same interface index, each in its own namespace.
    let mine = Pair::new(63).unwrap();
    let other = Pair::new(64).unwrap();
    link::reindex_pair(&mine, 6300, 6301).unwrap();
    link::reindex_pair(&other, 6300, 6302).unwrap();
    // Both have a tbf queue; only the other one carries traffic.
    add_tbf(&mine.a, &mine.veth_a);
    add_tbf(&other.a, &other.veth_a);
    let iface = mine.veth_a.as_str();
    let probe = Probe::start(&mine.a, ProbeOpts::iface(iface).tick("200ms"));
    assert_sojourn_hook(&probe);
    let count = |m: &Metrics| m.sum(&format!("{SOJOURN}_count"), &[("iface", iface)]);
    probe.wait_ticks(1);
    // (+ 0.0: an empty sum is -0.0.)
    let c0 = count(&probe.metrics()) + 0.0;
    let q0 = kernel::qdiscs(&other.a, &other.veth_a).unwrap();
    let sent = traffic::udp_send(
        &other.a,
        SocketAddr::new(other.ip_b.into(), 9),
        300,
        1000,
        50,
        Duration::from_millis(10),
    )
    .unwrap();
    probe.wait_ticks(3);
    let c1 = count(&probe.metrics());
    let q1 = kernel::qdiscs(&other.a, &other.veth_a).unwrap();
    let through = |q: &[kernel::Qdisc]| {
        q.iter()
            .find(|q| q.kind == "tbf")
            .map_or(0, |q| q.sent_packets)
    };
    let other_pkts = through(&q1) - through(&q0);
    let mine_pkts = tc_backlog(&mine.a, iface).map(|b| b.packets).unwrap_or(0.0);
    let report = format!(
        "other namespace's {} (ifindex 6300): {sent} datagrams sent, its tbf passed \
         {other_pkts} packets; probe's {SOJOURN}_count{{iface=\"{iface}\"}} (ifindex 6300, \
         no traffic, backlog {mine_pkts}): {c0} -> {c1}",
        other.veth_a
    );
    eprintln!("{report}");
    assert!(
        other_pkts >= 300,
        "the other queue saw too little\n{report}"
    );
    assert_eq!(
        c1 - c0,
        0.0,
        "probe counted another namespace's qdisc traffic as {iface}'s: the sojourn \
         tracepoints key interfaces by ifindex alone\n{report}"
    );
}

//! The sources behind the collect stage's seam, against the kernel's own view.
//!
//! `probe_softnet_*` against `/proc/net/softnet_stat`, read by this test: every received
//! packet of a veth pair passes a CPU's backlog, so between two scrapes probe's
//! `processed` must grow by at least the datagrams B received, and each CPU's value must lie
//! between the file's value read before the tick the scrape shows and the one read after
//! the scrape. Every source is up and timed.
use probe_tests::{cmd, traffic, Metrics, Pair, Probe, ProbeOpts};
use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

const DATAGRAMS: usize = 2000;

/// cpu -> processed, straight from the file (the CPU's number is column 13 on kernels >= 5.10,
/// else the line's index).
fn processed_now() -> BTreeMap<String, f64> {
    let text = std::fs::read_to_string("/proc/net/softnet_stat").unwrap();
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            let cols: Vec<u64> = l
                .split_whitespace()
                .map(|c| u64::from_str_radix(c, 16).unwrap())
                .collect();
            let cpu = cols.get(12).copied().unwrap_or(i as u64);
            (cpu.to_string(), cols[0] as f64)
        })
        .collect()
}

fn processed_probe(m: &Metrics) -> BTreeMap<String, f64> {
    m.select("probe_softnet_processed_total", &[])
        .map(|s| (s.labels["cpu"].clone(), s.value))
        .collect()
}

#[test]
fn softnet_counters_follow_the_kernel_and_every_source_is_up() {
    cmd::require_root_and(&["ip", "nsenter"]);
    let pair = Pair::new(71).unwrap();
    let probe = Probe::start(&pair.a, ProbeOpts::iface(&pair.veth_a).tick("500ms"));
    probe.wait_ticks(1);

    let before = processed_now();
    probe.wait_ticks(1);
    let m0 = probe.metrics();
    let after = processed_now();
    let p0 = processed_probe(&m0);
    assert_eq!(
        p0.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "one series per CPU of /proc/net/softnet_stat\n{}",
        probe.log_tail(20)
    );
    for (cpu, v) in &p0 {
        assert!(
            before[cpu] <= *v && *v <= after[cpu],
            "cpu {cpu}: probe {v}, the file {} before the tick and {} after the scrape",
            before[cpu],
            after[cpu]
        );
    }
    for source in ["interfaces", "maps", "programs", "qdiscs", "softnet"] {
        assert_eq!(
            m0.get("probe_source_up", &[("source", source)]).unwrap(),
            Some(1.0),
            "source {source}\n{}",
            probe.log_tail(20)
        );
        let d = m0
            .get("probe_source_duration_seconds", &[("source", source)])
            .unwrap();
        assert!(
            d.is_some_and(|d| d >= 0.0),
            "source {source}: duration {d:?}"
        );
    }

    let sent = traffic::udp_send(
        &pair.a,
        SocketAddr::new(pair.ip_b.into(), 5201),
        DATAGRAMS,
        200,
        50,
        Duration::from_millis(2),
    )
    .unwrap();
    probe.wait_ticks(2);
    let m1 = probe.metrics();
    let sum = |m: &BTreeMap<String, f64>| m.values().sum::<f64>();
    let grown = sum(&processed_probe(&m1)) - sum(&p0);
    eprintln!("{sent} datagrams sent A -> B; probe_softnet_processed_total grew by {grown}");
    // B answers no UDP port 5201 with ICMP, which A's backlog processes too: only more.
    assert!(
        grown >= sent as f64,
        "{sent} datagrams crossed the veth pair, processed grew by {grown}"
    );
}

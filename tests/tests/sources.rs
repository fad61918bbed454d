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
    for source in [
        "interfaces",
        "maps",
        "programs",
        "sockets",
        "qdiscs",
        "softnet",
    ] {
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

/// (iface, address) pairs of the namespace as iproute2 lists them, without loopback and
/// link-local addresses (`scope link`/`host`): the addresses another host can name as a peer.
fn global_addresses(ns: &probe_tests::Netns) -> Vec<(String, String)> {
    let json = ns.run(&["ip", "-j", "address", "show"]).unwrap();
    let links: serde_json::Value = serde_json::from_str(&json).unwrap();
    let mut out = Vec::new();
    for link in links.as_array().unwrap() {
        for a in link["addr_info"].as_array().into_iter().flatten() {
            if a["scope"] == "global" {
                out.push((
                    link["ifname"].as_str().unwrap().to_owned(),
                    a["local"].as_str().unwrap().to_owned(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// `probe_host_info` and `probe_host_address_info` against the namespace's own view: the host
/// name `hostname` prints, the job given on the command line, and exactly the global
/// addresses `ip address` lists (IPv4 and IPv6), each on its interface.
#[test]
fn the_identity_source_names_the_host_and_every_address_a_peer_can_use() {
    cmd::require_root_and(&["ip", "nsenter", "hostname"]);
    let pair = Pair::with(
        72,
        probe_tests::PairOpts {
            ipv6: true,
            ..Default::default()
        },
    )
    .unwrap();
    let mut opts = ProbeOpts::iface(&pair.veth_a).tick("500ms");
    opts.extra = vec!["--training-job".into(), "ring-allreduce-7".into()];
    let probe = Probe::start(&pair.a, opts);
    probe.wait_ticks(2);
    let m = probe.metrics();
    let hostname = cmd::run(&mut cmd::command(&["hostname"])).unwrap();
    let host: Vec<_> = m.select("probe_host_info", &[]).collect();
    assert_eq!(host.len(), 1, "{}", probe.log_tail(20));
    assert_eq!(host[0].labels["hostname"], hostname.trim());
    assert_eq!(host[0].labels["training_job"], "ring-allreduce-7");
    assert_eq!(host[0].value, 1.0);

    let want = global_addresses(&pair.a);
    assert!(
        want.iter().any(|(_, a)| *a == pair.ip_a.to_string())
            && want.iter().any(|(_, a)| a.contains(':')),
        "the namespace has its IPv4 and IPv6 address: {want:?}"
    );
    let mut got: Vec<(String, String)> = m
        .select("probe_host_address_info", &[])
        .map(|s| (s.labels["iface"].clone(), s.labels["address"].clone()))
        .collect();
    got.sort();
    assert_eq!(got, want, "probe's addresses vs `ip -j address show`");
    assert_eq!(
        m.get("probe_source_up", &[("source", "identity")]).unwrap(),
        Some(1.0)
    );
}

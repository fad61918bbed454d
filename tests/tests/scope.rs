//! A probe scoped to one cgroup (`--cgroup`, as in a container or a pod) against the kernel's
//! own view.
//!
//! Namespace A runs two iperf3 clients to two addresses of B: one inside a cgroup the test
//! makes, one outside it. probe runs in A with `--cgroup` on the test's cgroup: its per-peer
//! TCP series (sock_ops) must cover the cgroup's connections, as `ss` counts them, and none of
//! the other client's, while TC still counts both peers' bytes on A's veth (the network
//! namespace is the scope of the TC hooks). The host-wide tracepoints are left out, without a
//! `probe_hook_attached` series to page on. A `--cgroup` that is not a cgroup is refused.
use std::{
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use probe_tests::{
    cgroup::TestCgroup, cmd, iperf, probe::probe_command, process::Child, Pair, Probe, ProbeOpts,
};

/// Established connections in A towards `dst` (the data and control connections of iperf3).
fn established_to(pair: &Pair, dst: Ipv4Addr) -> usize {
    let out = probe_tests::kernel::ss_established_to(&pair.a, dst.into()).unwrap();
    out.lines().filter(|l| !l.trim().is_empty()).count()
}

#[test]
fn a_scoped_probe_sees_its_cgroups_sockets_and_not_the_hosts() {
    cmd::require_root_and(&["ip", "nsenter", "iperf3", "ss"]);
    let pair = Pair::new(73).unwrap();
    let (inside, outside) = (pair.ip_b, Ipv4Addr::new(10, 231, 73, 3));
    pair.add_b_addresses(&[outside]).unwrap();
    let _s1 = iperf::Server::start(&pair.b, IpAddr::V4(inside), 5201).unwrap();
    let _s2 = iperf::Server::start(&pair.b, IpAddr::V4(outside), 5202).unwrap();
    let cg = TestCgroup::new("scope");
    let dir = cg.dir.to_str().unwrap().to_owned();

    let mut opts = ProbeOpts::iface(&pair.veth_a).tick("500ms");
    opts.extra = vec!["--cgroup".into(), dir.clone()];
    let probe = Probe::start(&pair.a, opts);
    probe.wait_ticks(1);

    let ns = pair.a.path();
    let net = format!("--net={ns}");
    let mut c1 = Child::spawn(
        "iperf3 -c (in the cgroup)",
        &mut cg.command(&[
            "nsenter",
            &net,
            "iperf3",
            "-c",
            &inside.to_string(),
            "-p",
            "5201",
            "-t",
            "6",
            "-b",
            "50M",
        ]),
    )
    .unwrap();
    let mut c2 = Child::spawn(
        "iperf3 -c (outside)",
        &mut pair.a.command(&[
            "iperf3",
            "-c",
            &outside.to_string(),
            "-p",
            "5202",
            "-t",
            "6",
            "-b",
            "50M",
        ]),
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    probe.wait_ticks(2);
    let m = probe.metrics();
    let (n_in, n_out) = (
        established_to(&pair, inside),
        established_to(&pair, outside),
    );
    let _ = (
        c1.wait_timeout(Duration::from_secs(15)),
        c2.wait_timeout(Duration::from_secs(15)),
    );
    eprintln!("ss: {n_in} connections to {inside} (in the cgroup), {n_out} to {outside}");
    assert!(n_in >= 2 && n_out >= 2, "both clients were connected");

    let (inside, outside) = (inside.to_string(), outside.to_string());
    let conns = m
        .get("probe_tcp_connections", &[("peer", &inside)])
        .unwrap();
    assert_eq!(
        conns,
        Some(n_in as f64),
        "the cgroup's connections, as ss counts them\n{}",
        probe.log_tail(20)
    );
    for name in [
        "probe_tcp_connections",
        "probe_tcp_srtt_seconds",
        "probe_tcp_retransmits_total",
    ] {
        assert!(
            m.select(name, &[("peer", &outside)]).next().is_none(),
            "{name} has the other client's peer {outside}: the scope leaks"
        );
    }
    // TC sees the namespace's traffic, both clients'.
    for peer in [&inside, &outside] {
        let bytes = m.sum(
            "probe_flow_bytes_total",
            &[("peer", peer), ("direction", "egress")],
        );
        assert!(bytes > 1e6, "egress bytes to {peer}: {bytes}");
    }
    assert_eq!(
        m.get("probe_hook_attached", &[("hook", "sock_ops")])
            .unwrap(),
        Some(1.0)
    );
    for hook in ["tcp_retransmit_skb", "kfree_skb"] {
        assert!(
            m.select("probe_hook_attached", &[("hook", hook)])
                .next()
                .is_none(),
            "{hook}: a scoped probe leaves it out without a series"
        );
    }
}

#[test]
fn a_scope_that_is_not_a_cgroup_is_refused_in_one_line() {
    cmd::require_root_and(&["ip", "nsenter"]);
    let pair = Pair::new(74).unwrap();
    let mut c = probe_command(
        &pair.a,
        &[
            "run".into(),
            "--interface".into(),
            pair.veth_a.clone(),
            "--cgroup".into(),
            "/proc".into(),
        ],
    );
    let out = cmd::output_within(&mut c, Duration::from_secs(30)).unwrap();
    let err = &out.stderr;
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--cgroup /proc: not a cgroup directory"),
        "{err}"
    );
}

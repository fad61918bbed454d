//! Interface hot-plug: probe runs in A with `--interface veth67a --interface 'hp*'` and a
//! 500 ms tick. A veth `hp0` (peer `hpb0` in B, 10.231.68.0/24) created after the daemon
//! started is attached within a tick: its traffic shows up in
//! `probe_flow_bytes_total{iface="hp0"}` within 3 s, and probe's programs sit on both of its
//! hooks (TCX links asked of the kernel, or tc filters in netlink mode). When `hp0` is
//! deleted: nothing stays behind (probe holds no TCX link for it, none defunct; in netlink
//! mode no clsact marker for it), no warning or error in probe's log, and within a tick no
//! series with `iface="hp0"` remains in /metrics. The daemon still serves (/healthz 200), still
//! counts the original interface, and attaches again when `hp0` comes back. Its entries
//! leave probe's kernel flow and burst maps too (read with bpftool), rather than staying
//! until LRU pressure evicts them: the daemon reads those maps whole every tick.
//!
//! The flows here are per interface of probe's own namespace (no host-wide TCP metric is
//! checked), so both modes share subnets 67 and 68.
use probe_tests::bpflinks::{self, HeldLink};
use probe_tests::bpfmaps;
use probe_tests::link::{self, End};
use probe_tests::probe::strip_ansi;
use probe_tests::{cmd, kernel, traffic, Hook, Metrics, Pair, Probe, ProbeOpts};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

const HP: &str = "hp0";
const TICK: &str = "500ms";
/// How long a change may take to show: a tick plus margin.
const BOUND: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(100);

fn hp_ip(host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 231, 68, host)
}

fn add_hp(pair: &Pair) {
    link::add_veth(
        &End {
            ns: &pair.a,
            name: HP.into(),
            index: None,
            ip: hp_ip(1),
            mac: [2, 0, 0x0a, 0xe7, 68, 1],
        },
        &End {
            ns: &pair.b,
            name: "hpb0".into(),
            index: None,
            ip: hp_ip(2),
            mac: [2, 0, 0x0a, 0xe7, 68, 2],
        },
        24,
    )
    .unwrap();
}

fn egress_bytes(m: &Metrics, iface: &str) -> f64 {
    m.sum(
        "probe_flow_bytes_total",
        &[("iface", iface), ("direction", "egress")],
    )
}

/// Every series that names `iface`.
fn series_of(m: &Metrics, iface: &str) -> Vec<String> {
    m.samples
        .iter()
        .filter(|s| s.labels.get("iface").map(String::as_str) == Some(iface))
        .map(|s| format!("{}{:?}", s.name, s.labels))
        .collect()
}

/// Polls (bounded) until probe's egress bytes on `iface` are > 0 and have grown between two
/// scrapes: (when they first showed, when they had grown).
fn wait_for_traffic(probe: &Probe, iface: &str) -> (Option<Duration>, Option<Duration>) {
    let t0 = Instant::now();
    let mut first: Option<(Duration, f64)> = None;
    while t0.elapsed() < BOUND {
        if let Ok(m) = probe.try_metrics() {
            let b = egress_bytes(&m, iface);
            match first {
                Some((at, was)) if b > was => return (Some(at), Some(t0.elapsed())),
                None if b > 0.0 => first = Some((t0.elapsed(), b)),
                _ => {}
            }
        }
        std::thread::sleep(POLL);
    }
    (first.map(|f| f.0), None)
}

/// Log lines at WARN or ERROR level.
/// Where the ifindex sits in the keys of probe's maps (probe_ebpf's ABI): FlowKey has two
/// 16-byte addresses and two ports before it. (PEER_BURSTS, keyed by interface too, holds
/// entries only while the burst ring is full: the daemon folds bursts from the ring.)
const MAPS_IFINDEX_AT: [(&str, usize); 1] = [("FLOWS", 36)];

/// Per map, how many of the entries probe holds in the kernel belong to `ifindex`.
fn kernel_entries_of(pid: u32, ifindex: u32) -> Vec<(&'static str, usize)> {
    MAPS_IFINDEX_AT
        .iter()
        .map(|(name, at)| {
            let id = bpfmaps::held_map(pid, name).unwrap();
            let keys = bpfmaps::map_keys(id).unwrap();
            let n = keys
                .iter()
                .filter(|k| bpfmaps::key_u32(k, *at) == Some(ifindex))
                .count();
            (*name, n)
        })
        .collect()
}

fn warnings(log: &str) -> Vec<String> {
    strip_ansi(log)
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .map(str::to_owned)
        .collect()
}

fn hotplug(mode: &str) {
    cmd::require_root_and(&["ip", "nsenter", "tc", "bpftool"]);
    let t_start = Instant::now();
    let pair = Pair::new(67).unwrap();
    let mut opts = ProbeOpts::iface(&pair.veth_a).tick(TICK).tc_attach(mode);
    opts.interfaces.push("hp*".into());
    let mut probe = Probe::start(&pair.a, opts);
    let pid = probe.pid();
    let tcx_before: Vec<HeldLink> = bpflinks::tcx_links(pid).unwrap();
    let hp_dst = SocketAddr::new(hp_ip(2).into(), 9);
    let mut report = format!(
        "mode {mode}: probe holds {} TCX link(s) at start\n",
        tcx_before.len()
    );

    for round in 1..=2 {
        // Plug.
        add_hp(&pair);
        let hp_index = link::ifindex(&pair.a, HP).unwrap();
        let trickle = traffic::UdpTrickle::start(
            &pair.a,
            hp_dst,
            200,
            Duration::from_millis(10),
            Duration::from_secs(10),
        )
        .unwrap();
        let (shown, seen) = wait_for_traffic(&probe, HP);
        let sent = trickle.stop();
        let att = kernel::tc_attachments(&pair.a, HP).unwrap();
        let tcx_hp: Vec<HeldLink> = bpflinks::tcx_links(pid)
            .unwrap()
            .into_iter()
            .filter(|l| l.ifindex == Some(hp_index))
            .collect();
        report += &format!(
            "round {round}: {HP} (ifindex {hp_index}) created; its traffic shown after {shown:?}, \
             growing after {seen:?} \
             ({sent} datagrams sent); programs: ingress {} egress {} (TCX ids {:?}/{:?}, \
             filters {}/{}); probe's TCX links on it: {}\n",
            att.programs(Hook::Ingress),
            att.programs(Hook::Egress),
            att.tcx_ingress,
            att.tcx_egress,
            att.filters_ingress.len(),
            att.filters_egress.len(),
            tcx_hp.len()
        );
        assert!(
            seen.is_some(),
            "{HP}'s traffic did not show up within {BOUND:?}\n{report}\n{}",
            probe.log_tail(20)
        );
        for hook in Hook::BOTH {
            assert_eq!(
                att.programs(hook),
                1,
                "one probe program on {HP} {}\n{report}{att:#?}",
                hook.as_str()
            );
        }
        match mode {
            "tcx" => {
                assert!(
                    !att.tcx_ingress.is_empty() && !att.tcx_egress.is_empty(),
                    "no TCX programs on {HP}\n{report}{att:#?}"
                );
                assert_eq!(tcx_hp.len(), 2, "probe's TCX links on {HP}\n{report}");
            }
            _ => assert!(
                att.clsact && !att.filters_ingress.is_empty() && !att.filters_egress.is_empty(),
                "no tc filters on {HP}\n{report}{att:#?}"
            ),
        }

        // The trickle's datagrams, 10 ms apart, are one flow and bursts of one datagram.
        let held = kernel_entries_of(pid, hp_index);
        report += &format!("round {round}: kernel entries of {HP} before deletion: {held:?}\n");
        assert!(
            held.iter().all(|(_, n)| *n > 0),
            "probe's flow map should hold {HP}'s flow\n{report}"
        );

        // Unplug.
        let log_mark = probe.stderr().len();
        link::del_link(&pair.a, HP).unwrap();
        let t_del = Instant::now();
        let mut left = Vec::new();
        while t_del.elapsed() < BOUND {
            left = probe
                .try_metrics()
                .map(|m| series_of(&m, HP))
                .unwrap_or_default();
            if left.is_empty() {
                break;
            }
            std::thread::sleep(POLL);
        }
        let gone_after = t_del.elapsed();
        // One more tick: nothing comes back.
        probe.wait_ticks(1);
        let m = probe.metrics();
        let left_later = series_of(&m, HP);
        let tcx_after = bpflinks::tcx_links(pid).unwrap();
        let held_after = kernel_entries_of(pid, hp_index);
        let marker = std::path::Path::new("/run/probe/clsact").join(HP);
        let new_log = probe.stderr()[log_mark..].to_string();
        report += &format!(
            "round {round}: {HP} deleted; its series gone after {gone_after:?}; probe's TCX \
             links now {:?}; log since: {:?}\n",
            tcx_after
                .iter()
                .map(|l| (l.link_id, l.ifindex))
                .collect::<Vec<_>>(),
            strip_ansi(&new_log).lines().collect::<Vec<_>>()
        );
        assert!(
            held_after.iter().all(|(_, n)| *n == 0),
            "probe's maps still hold entries of the deleted {HP}: {held_after:?}\n{report}"
        );
        assert!(
            left.is_empty() && left_later.is_empty(),
            "series with iface=\"{HP}\" remain after its deletion: {left:?} {left_later:?}\n{report}"
        );
        assert!(
            tcx_after
                .iter()
                .all(|l| l.ifindex != Some(hp_index) && l.ifindex != Some(0)),
            "probe still holds a TCX link of the deleted {HP}\n{report}"
        );
        assert_eq!(
            tcx_after.len(),
            tcx_before.len(),
            "probe's TCX links should be back to those of {}\n{report}",
            pair.veth_a
        );
        assert!(
            !marker.exists(),
            "a clsact marker for the deleted {HP} remains: {}\n{report}",
            marker.display()
        );
        assert!(
            warnings(&new_log).is_empty(),
            "probe logged warnings or errors when {HP} went away: {:?}\n{report}",
            warnings(&new_log)
        );
    }

    // Still serving, still counting the original interface.
    let health = probe.get("/healthz").unwrap();
    let before = egress_bytes(&probe.metrics(), &pair.veth_a);
    traffic::udp_send(
        &pair.a,
        SocketAddr::new(pair.ip_b.into(), 9),
        100,
        500,
        0,
        Duration::ZERO,
    )
    .unwrap();
    probe.wait_ticks(1);
    let after = egress_bytes(&probe.metrics(), &pair.veth_a);
    let all_warnings = warnings(&probe.stderr());
    report += &format!(
        "/healthz {}; {} egress bytes +{}; warnings in the whole log: {all_warnings:?}; test \
         time {:.1} s",
        health.status,
        pair.veth_a,
        after - before,
        t_start.elapsed().as_secs_f64()
    );
    eprintln!("{report}");
    assert_eq!(health.status, 200, "{report}");
    assert!(
        after - before >= 100.0 * 500.0,
        "{} is no longer counted\n{report}",
        pair.veth_a
    );
    assert!(probe.child.try_wait().is_none(), "probe exited\n{report}");
    assert!(
        all_warnings.is_empty(),
        "probe logged warnings or errors\n{report}"
    );
}

#[test]
fn tcx_attaches_to_new_interfaces_and_forgets_removed_ones() {
    hotplug("tcx");
}

#[test]
fn netlink_attaches_to_new_interfaces_and_forgets_removed_ones() {
    hotplug("netlink");
}

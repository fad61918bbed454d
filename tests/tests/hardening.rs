//! probe with the privileges of the hardened unit, `contrib/systemd/probe.service` (shown in
//! docs/install.md): uid 0 but only the capabilities its `CapabilityBoundingSet=` and
//! `AmbientCapabilities=` lines name (read from the file here), and no_new_privs
//! (`NoNewPrivileges=yes`). systemd is not PID 1 on the CI machines, so `setpriv` applies
//! the same sets.
//!
//! The kernel confirms the sets (`/proc/PID/status`); every hook attaches but the run-time
//! statistics (which need CAP_SYS_ADMIN, and say so); and what TC counts on the veth matches
//! the veth's own counters (iperf3 traffic, offloads off, within 1%).
use std::time::{Duration, Instant};

use probe_tests::iperf::{self, ClientOpts};
use probe_tests::probe::{probe_bin_checked, probe_command_with};
use probe_tests::process::Child;
use probe_tests::{
    cmd, http, kernel, probe_iface_traffic, rel_diff, Metrics, Pair, PairOpts, ProbeOpts,
};

const TRACEFS: &str = "/sys/kernel/tracing";
const UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../contrib/systemd/probe.service"
);

/// The unit's capabilities as a setpriv set ("-all,+bpf,...") and as the kernel's bit mask;
/// it must keep NoNewPrivileges and give the same set to both lines.
fn unit_capabilities() -> (String, u64) {
    let unit = std::fs::read_to_string(UNIT).unwrap();
    let line = |key: &str| -> Vec<String> {
        let l = unit
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("{UNIT} has no {key} line"));
        let mut v: Vec<String> = l.split_whitespace().map(str::to_owned).collect();
        v.sort();
        v
    };
    let caps = line("CapabilityBoundingSet=");
    assert_eq!(
        caps,
        line("AmbientCapabilities="),
        "{UNIT}: bounding and ambient differ"
    );
    assert!(
        unit.lines().any(|l| l.trim() == "NoNewPrivileges=yes"),
        "{UNIT}"
    );
    let bit = |c: &str| -> u32 {
        match c {
            "CAP_NET_ADMIN" => 12,
            "CAP_SYS_ADMIN" => 21,
            "CAP_PERFMON" => 38,
            "CAP_BPF" => 39,
            other => panic!("{UNIT}: {other} is not expected in probe's unit"),
        }
    };
    let set = std::iter::once("-all".to_owned())
        .chain(
            caps.iter()
                .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase())),
        )
        .collect::<Vec<_>>()
        .join(",");
    (set, caps.iter().fold(0, |m, c| m | 1u64 << bit(c)))
}

#[test]
fn install_md_shows_the_unit_file_as_it_is() {
    let unit = std::fs::read_to_string(UNIT).unwrap();
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/install.md"))
        .unwrap();
    assert!(
        doc.contains(&unit),
        "docs/install.md's unit differs from {UNIT}: copy it again"
    );
}

/// Unmounts tracefs on drop if this test mounted it.
struct Tracefs(bool);

impl Tracefs {
    /// The unit expects tracefs mounted (systemd's sys-kernel-tracing.mount): without
    /// CAP_SYS_ADMIN probe cannot mount it itself.
    fn ensure() -> Tracefs {
        if std::path::Path::new(TRACEFS).join("events").is_dir() {
            return Tracefs(false);
        }
        cmd::run(&mut cmd::command(&[
            "mount", "-t", "tracefs", "tracefs", TRACEFS,
        ]))
        .unwrap();
        Tracefs(true)
    }
}

impl Drop for Tracefs {
    fn drop(&mut self) {
        if self.0 {
            let _ = cmd::run(&mut cmd::command(&["umount", TRACEFS]));
        }
    }
}

/// A `CapXxx:` line of /proc/PID/status.
fn caps(status: &str, key: &str) -> u64 {
    let line = status
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in /proc/PID/status"));
    u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
}

#[test]
fn the_hardened_capability_set_is_enough() {
    cmd::require_root_and(&["ip", "nsenter", "setpriv", "iperf3", "ethtool", "mount"]);
    let _tracefs = Tracefs::ensure();
    let pair = Pair::with(
        101,
        PairOpts {
            ipv6: false,
            no_offloads: true,
        },
    )
    .unwrap();
    let iface = pair.veth_a.clone();
    let bin = probe_bin_checked();
    let opts = ProbeOpts::iface(&iface);
    let (sets, want) = unit_capabilities();
    let mut argv: Vec<String> = [
        "setpriv",
        &format!("--bounding-set={sets}"),
        &format!("--inh-caps={sets}"),
        &format!("--ambient-caps={sets}"),
        "--no-new-privs",
        &bin,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(opts.args());
    let (program, rest) = argv.split_first().unwrap();
    let mut child = Child::spawn("probe", &mut probe_command_with(program, &pair.a, rest)).unwrap();

    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], opts.port));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = child.try_wait() {
            panic!("probe exited with {st}:\n{}", child.stderr());
        }
        if matches!(http::get_in(&pair.a, addr, "/healthz", Duration::from_secs(2)), Ok(r) if r.status == 200)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "probe never became healthy:\n{}",
            child.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // What the kernel says the process holds.
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.pid())).unwrap();
    for key in ["CapEff:", "CapPrm:", "CapBnd:"] {
        assert_eq!(caps(&status, key), want, "{key} of probe:\n{status}");
    }
    assert!(
        status
            .lines()
            .any(|l| l.split_whitespace().eq(["NoNewPrivs:", "1"])),
        "{status}"
    );

    let scrape = || -> Metrics {
        let r = http::get_in(&pair.a, addr, "/metrics", Duration::from_secs(5)).unwrap();
        assert_eq!(r.status, 200);
        Metrics::parse(&r.body).unwrap()
    };
    let m = scrape();
    for hook in [
        "tc",
        "sock_ops",
        "tcp_retransmit_skb",
        "kfree_skb",
        "qdisc_sojourn",
    ] {
        assert_eq!(
            m.get("probe_hook_attached", &[("hook", hook)]).unwrap(),
            Some(1.0),
            "hook {hook} did not attach with the hardened capabilities:\n{}",
            child.stderr()
        );
    }
    assert_eq!(
        m.get("probe_hook_attached", &[("hook", "bpf_stats")])
            .unwrap(),
        Some(0.0)
    );
    assert!(
        child.stderr().contains("CAP_SYS_ADMIN"),
        "{}",
        child.stderr()
    );

    // TC counts what the veth counts.
    let _server = iperf::Server::start(&pair.b, pair.ip_b.into(), iperf::PORT).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let m0 = scrape();
    let k0 = kernel::iface_counters(&pair.a, &iface).unwrap();
    iperf::run_client(&pair.a, pair.ip_b.into(), iperf::PORT, &ClientOpts::tcp(3)).unwrap();
    std::thread::sleep(Duration::from_millis(2300));
    let m1 = scrape();
    let k1 = kernel::iface_counters(&pair.a, &iface).unwrap();
    let (p, k) = (
        probe_iface_traffic(&m1, &iface) - probe_iface_traffic(&m0, &iface),
        k1 - k0,
    );
    for (what, a, b) in [
        ("tx_packets", p.tx_packets, k.tx_packets),
        ("rx_packets", p.rx_packets, k.rx_packets),
        ("tx_bytes", p.tx_bytes, k.tx_bytes),
    ] {
        assert!(b > 1000.0, "too little traffic: {what} {b}");
        assert!(rel_diff(a, b) <= 0.01, "{what}: probe {a}, veth {b}");
    }
    child.terminate(Duration::from_secs(10));
}

//! Test harness for probe's integration tests (`tests/tests/*.rs`) and `cargo xtask bench`.
//!
//! The tests run real traffic between network namespaces that they create, start the `probe`
//! daemon in one of them, and compare what it exports with the kernel's own view of the same
//! traffic (interface counters, `ss -tin`, `nstat`, `tc`, `bpftool`). Everything they create is
//! removed on drop, also when a test panics: [`netns::Netns`] deletes its namespace and kills
//! what runs inside, [`process::Child`] SIGTERMs (then SIGKILLs) its process.
//!
//! They need root. Run them serially, with a probe built with every feature (`probe train`
//! is in the `train` feature; `cargo xtask test` builds it so):
//! `cargo build -p probe-user --all-features`, then
//! `PROBE_BIN=target/debug/probe cargo test -p probe-tests -- --test-threads=1`.
//!
//! Addressing: each test owns a subnet 10.231.X.0/24 (and fd00:231:X::/64), X distinct per
//! test, so that tests never see each other's peers in probe's host-wide socket metrics.
pub mod bpflinks;
pub mod bpfmaps;
pub mod cgroup;
pub mod cmd;
pub mod histogram;
pub mod http;
pub mod iperf;
pub mod kernel;
pub mod link;
pub mod metrics;
pub mod netns;
pub mod nft;
pub mod parquet;
pub mod probe;
pub mod process;
pub mod prometheus;
pub mod rdma;
pub mod timeline;
pub mod tmux;
pub mod traffic;

pub use kernel::{Hook, Traffic};
pub use metrics::Metrics;
pub use netns::{Netns, Pair, PairOpts};
pub use probe::{Probe, ProbeOpts};
pub use process::Child;

/// `|a - b| / |b|`: the relative difference of a measurement `a` from the reference `b`.
pub fn rel_diff(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        if a == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        (a - b).abs() / b.abs()
    }
}

/// The median of `v` (NaN-free); None if empty.
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// What probe counted on `iface`, per direction, summed over all peers plus non-IP traffic:
/// comparable with the interface's own counters.
pub fn probe_iface_traffic(m: &Metrics, iface: &str) -> Traffic {
    let sum = |metric: &str, dir: &str| {
        m.sum(
            &format!("probe_flow_{metric}_total"),
            &[("iface", iface), ("direction", dir)],
        ) + m.sum(
            &format!("probe_nonip_{metric}_total"),
            &[("iface", iface), ("direction", dir)],
        )
    };
    Traffic {
        rx_bytes: sum("bytes", "ingress"),
        rx_packets: sum("packets", "ingress"),
        tx_bytes: sum("bytes", "egress"),
        tx_packets: sum("packets", "egress"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_helpers() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(rel_diff(101.0, 100.0), 0.01);
        assert_eq!(rel_diff(0.0, 0.0), 0.0);
        assert!(rel_diff(1.0, 0.0).is_infinite());
    }

    #[test]
    fn iface_traffic_sums_flows_and_nonip() {
        let m = Metrics::parse(
            "probe_flow_bytes_total{iface=\"v\",direction=\"egress\",peer=\"10.0.0.2\"} 100\n\
             probe_flow_bytes_total{iface=\"v\",direction=\"egress\",peer=\"10.0.0.3\"} 50\n\
             probe_flow_bytes_total{iface=\"w\",direction=\"egress\",peer=\"10.0.0.3\"} 7\n\
             probe_nonip_bytes_total{iface=\"v\",direction=\"egress\"} 42\n\
             probe_flow_packets_total{iface=\"v\",direction=\"ingress\",peer=\"10.0.0.2\"} 3\n\
             probe_nonip_packets_total{iface=\"v\",direction=\"ingress\"} 1\n",
        )
        .unwrap();
        let t = probe_iface_traffic(&m, "v");
        assert_eq!(t.tx_bytes, 192.0);
        assert_eq!(t.rx_packets, 4.0);
        assert_eq!(t.rx_bytes, 0.0);
    }
}

//! OpenMetrics encoding of the latest snapshot with prometheus-client. Series are built at
//! scrape time from the snapshot, so a vanished peer or interface simply stops appearing.
//!
//! prometheus-client's text encoder appends `_total` to counter names, so counters are
//! declared here without it.
use std::sync::{Arc, RwLock};

use prometheus_client::{
    collector::Collector,
    encoding::{
        DescriptorEncoder, EncodeCounterValue, EncodeMetric as _, MetricEncoder, NoLabelSet,
    },
    metrics::{gauge::ConstGauge, MetricType},
    registry::Registry,
};

use crate::snapshot::Snapshot;

/// The snapshot the exporter serves; replaced whole at every tick.
pub type Latest = Arc<RwLock<Arc<Snapshot>>>;

#[derive(Debug)]
pub struct SnapshotCollector {
    latest: Latest,
}

pub fn registry(latest: Latest) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(SnapshotCollector { latest }));
    r
}

type Series<V> = (Vec<(&'static str, String)>, V);

/// A metric family from (labels, value) pairs. A series without labels is written bare
/// (`name 1`, not `name{} 1`).
fn family<V>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric_type: MetricType,
    series: impl IntoIterator<Item = Series<V>>,
    mut write: impl FnMut(&mut MetricEncoder<'_>, &V) -> std::fmt::Result,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, metric_type)?;
    for (labels, v) in series {
        if labels.is_empty() {
            write(&mut m, &v)?;
        } else {
            let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            write(&mut m.encode_family(&labels)?, &v)?;
        }
    }
    Ok(())
}

fn counter<V: EncodeCounterValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = Series<V>>,
) -> std::fmt::Result {
    family(enc, name, help, MetricType::Counter, series, |m, v| {
        m.encode_counter::<NoLabelSet, _, u64>(v, None)
    })
}

fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = Series<f64>>,
) -> std::fmt::Result {
    family(enc, name, help, MetricType::Gauge, series, |m, v| m.encode_gauge(v))
}

fn l(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let s = self.latest.read().map(|g| g.clone()).unwrap_or_default();
        encode_snapshot(&s, &mut enc)
    }
}

pub fn encode_snapshot(s: &Snapshot, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let info = ConstGauge::new(1i64);
    let version = env!("CARGO_PKG_VERSION");
    let mut m = enc.encode_descriptor(
        "probe_build_info",
        "probe's version; always 1",
        None,
        info.metric_type(),
    )?;
    info.encode(m.encode_family(&[("version", version)])?)?;

    let flow = |f: &crate::snapshot::FlowSeries| {
        l(&[("iface", &f.iface), ("direction", f.direction), ("peer", &f.peer)])
    };
    counter(
        enc,
        "probe_flow_bytes",
        "Bytes to/from a peer on an interface, wire-equivalent (GSO segments with their headers), from TC",
        s.flows.iter().map(|f| (flow(f), f.bytes)),
    )?;
    counter(
        enc,
        "probe_flow_packets",
        "Packets to/from a peer on an interface (GSO super-packets count as their segments), from TC",
        s.flows.iter().map(|f| (flow(f), f.packets)),
    )?;
    counter(
        enc,
        "probe_ecn_ce_packets",
        "Packets marked ECN Congestion Experienced",
        s.flows.iter().map(|f| (flow(f), f.ce_packets)),
    )?;
    counter(
        enc,
        "probe_ecn_capable_packets",
        "ECN-capable packets (ECT(0), ECT(1) or CE)",
        s.flows.iter().map(|f| (flow(f), f.ect_packets)),
    )?;
    let nonip = |n: &crate::snapshot::NonIpSeries| l(&[("iface", &n.iface), ("direction", n.direction)]);
    counter(
        enc,
        "probe_nonip_bytes",
        "Bytes of non-IP traffic (ARP, LLDP, ...) on an interface",
        s.nonip.iter().map(|n| (nonip(n), n.bytes)),
    )?;
    counter(
        enc,
        "probe_nonip_packets",
        "Packets of non-IP traffic on an interface",
        s.nonip.iter().map(|n| (nonip(n), n.packets)),
    )?;

    let peer = |p: &crate::snapshot::PeerSeries| l(&[("peer", &p.peer)]);
    gauge(
        enc,
        "probe_tcp_srtt_seconds",
        "Smoothed RTT to a peer: the largest among its connections active in the last tick",
        s.peers
            .iter()
            .filter_map(|p| p.srtt_seconds.map(|v| (peer(p), v))),
    )?;
    gauge(
        enc,
        "probe_tcp_min_rtt_seconds",
        "Smallest windowed minimum RTT among a peer's open connections",
        s.peers
            .iter()
            .filter_map(|p| p.min_rtt_seconds.map(|v| (peer(p), v))),
    )?;
    gauge(
        enc,
        "probe_tcp_connections",
        "Open TCP connections to a peer tracked by sock_ops",
        s.peers.iter().map(|p| (peer(p), p.connections as f64)),
    )?;
    let mut m = enc.encode_descriptor(
        "probe_tcp_rtt_seconds",
        "RTT samples to a peer, one per ACK that carried one (log2 buckets)",
        None,
        MetricType::Histogram,
    )?;
    for p in &s.peers {
        m.encode_family(&[("peer", p.peer.as_str())])?
            .encode_histogram::<NoLabelSet>(p.rtt.sum, p.rtt.count, &p.rtt.buckets, None)?;
    }
    counter(
        enc,
        "probe_tcp_retransmits",
        "Retransmitted TCP segments to a peer, all sockets",
        s.peers.iter().map(|p| (peer(p), p.retransmits)),
    )?;

    gauge(
        enc,
        "probe_flows_tracked",
        "Flow entries in the kernel map",
        [(vec![], s.flows_tracked as f64)],
    )?;
    counter(
        enc,
        "probe_flow_evictions",
        "Flows evicted from the full kernel map before their last counts were read",
        [(vec![], s.flow_evictions)],
    )?;
    counter(
        enc,
        "probe_bpf_run_seconds",
        "Time the kernel spent running a probe program (kernel BPF run-time statistics)",
        s.programs
            .iter()
            .map(|p| (l(&[("program", &p.program)]), p.run_seconds)),
    )?;
    counter(
        enc,
        "probe_bpf_runs",
        "Times the kernel ran a probe program",
        s.programs
            .iter()
            .map(|p| (l(&[("program", &p.program)]), p.runs)),
    )?;
    gauge(
        enc,
        "probe_hook_attached",
        "1 when a kernel hook is attached, 0 when the kernel refused it (see the log)",
        s.hooks
            .iter()
            .map(|h| (l(&[("hook", h.hook)]), if h.attached { 1.0 } else { 0.0 })),
    )?;
    Ok(())
}

/// The whole registry as OpenMetrics text.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        out.clear();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{FlowSeries, Histogram, PeerSeries};

    #[test]
    fn names_units_and_labels() {
        let snap = Snapshot {
            flows: vec![FlowSeries {
                iface: "eth0".into(),
                direction: "egress",
                peer: "10.0.0.2".into(),
                bytes: 1500,
                packets: 1,
                ..FlowSeries::default()
            }],
            peers: vec![PeerSeries {
                peer: "10.0.0.2".into(),
                srtt_seconds: Some(0.002),
                rtt: Histogram::from_log2(&[0, 3, 0], 10, 1e-6),
                retransmits: 7,
                ..PeerSeries::default()
            }],
            ..Snapshot::default()
        };
        let text = render(&registry(Arc::new(RwLock::new(Arc::new(snap)))));
        assert!(text.contains(
            "probe_flow_bytes_total{iface=\"eth0\",direction=\"egress\",peer=\"10.0.0.2\"} 1500"
        ), "{text}");
        assert!(text.contains("probe_tcp_retransmits_total{peer=\"10.0.0.2\"} 7"), "{text}");
        assert!(text.contains("probe_tcp_srtt_seconds{peer=\"10.0.0.2\"} 0.002"), "{text}");
        assert!(text.contains("probe_tcp_rtt_seconds_bucket{le=\"0.000004\",peer=\"10.0.0.2\"} 3")
            || text.contains("probe_tcp_rtt_seconds_bucket{peer=\"10.0.0.2\",le=\"0.000004\"} 3"), "{text}");
        assert!(text.contains("probe_build_info{version="), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}

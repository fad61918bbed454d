//! OpenMetrics encoding of the latest snapshot with prometheus-client. Series are built at
//! scrape time from the snapshot, so a vanished peer or interface simply stops appearing.
//!
//! prometheus-client's text encoder appends `_total` to counter names, so counters are
//! declared here without it.
use std::sync::{Arc, RwLock};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _, NoLabelSet},
    metrics::{gauge::ConstGauge, MetricType},
    registry::Registry,
};

use super::family::{counter, gauge, l};
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
    encode_traffic(s, enc)?;
    encode_tcp(s, enc)?;
    super::jobs::encode(s, enc)?;
    encode_maps_and_programs(s, enc)?;
    encode_bursts(s, enc)?;
    encode_queues(s, enc)?;
    encode_interfaces(s, enc)?;
    super::features::encode(s, enc)?;
    super::model::encode(s, enc)?;
    encode_health(s, enc)?;
    super::sources::encode(s, enc)?;
    Ok(())
}

/// Per (interface, direction, peer) traffic from TC, and the non-IP traffic.
fn encode_traffic(s: &Snapshot, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let flow = |f: &crate::snapshot::FlowSeries| {
        l(&[
            ("iface", &f.iface),
            ("direction", f.direction),
            ("peer", &f.peer),
        ])
    };
    counter(
        enc,
        "probe_flow_bytes",
        "Bytes to/from a peer on an interface, wire-equivalent (GSO segments with their headers), from TC",
        s.readings.flows.iter().map(|f| (flow(f), f.bytes)),
    )?;
    counter(
        enc,
        "probe_flow_packets",
        "Packets to/from a peer on an interface (GSO super-packets count as their segments), from TC",
        s.readings.flows.iter().map(|f| (flow(f), f.packets)),
    )?;
    counter(
        enc,
        "probe_ecn_ce_packets",
        "Packets marked ECN Congestion Experienced",
        s.readings.flows.iter().map(|f| (flow(f), f.ce_packets)),
    )?;
    counter(
        enc,
        "probe_ecn_capable_packets",
        "ECN-capable packets (ECT(0), ECT(1) or CE)",
        s.readings.flows.iter().map(|f| (flow(f), f.ect_packets)),
    )?;
    let nonip =
        |n: &crate::snapshot::NonIpSeries| l(&[("iface", &n.iface), ("direction", n.direction)]);
    counter(
        enc,
        "probe_nonip_bytes",
        "Bytes of non-IP traffic (ARP, LLDP, ...) on an interface",
        s.readings.nonip.iter().map(|n| (nonip(n), n.bytes)),
    )?;
    counter(
        enc,
        "probe_nonip_packets",
        "Packets of non-IP traffic on an interface",
        s.readings.nonip.iter().map(|n| (nonip(n), n.packets)),
    )?;
    Ok(())
}

/// The TCP view of each peer (sock_ops, tcp_retransmit_skb).
fn encode_tcp(s: &Snapshot, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let peer = |p: &crate::snapshot::PeerSeries| l(&[("peer", &p.peer)]);
    gauge(
        enc,
        "probe_tcp_srtt_seconds",
        "Smoothed RTT to a peer: the largest among its connections active in the last tick",
        s.readings
            .peers
            .iter()
            .filter_map(|p| p.srtt_seconds.map(|v| (peer(p), v))),
    )?;
    gauge(
        enc,
        "probe_tcp_min_rtt_seconds",
        "Smallest windowed minimum RTT among a peer's open connections",
        s.readings
            .peers
            .iter()
            .filter_map(|p| p.min_rtt_seconds.map(|v| (peer(p), v))),
    )?;
    gauge(
        enc,
        "probe_tcp_connections",
        "Open TCP connections to a peer tracked by sock_ops",
        s.readings
            .peers
            .iter()
            .map(|p| (peer(p), p.connections as f64)),
    )?;
    gauge(
        enc,
        "probe_tcp_receive_queue_bytes",
        "Bytes received from a peer that the application has not read yet (ss Recv-Q), at the tick",
        s.readings
            .peers
            .iter()
            .filter_map(|p| p.receive_queue_bytes.map(|v| (peer(p), v as f64))),
    )?;
    gauge(
        enc,
        "probe_tcp_send_queue_bytes",
        "Bytes written to a peer that it has not acknowledged yet (ss Send-Q), at the tick",
        s.readings
            .peers
            .iter()
            .filter_map(|p| p.send_queue_bytes.map(|v| (peer(p), v as f64))),
    )?;
    histogram_family(
        enc,
        "probe_tcp_rtt_seconds",
        "RTT samples to a peer, one per round trip per connection (log2 buckets)",
        s.readings.peers.iter().map(|p| (peer(p), &p.rtt)),
    )?;
    counter(
        enc,
        "probe_tcp_retransmits",
        "Retransmitted TCP segments to a peer, all sockets",
        s.readings.peers.iter().map(|p| (peer(p), p.retransmits)),
    )?;
    counter(
        enc,
        "probe_tcp_socket_sent_bytes",
        "Bytes probe's sockets (its cgroup's when scoped) sent to a peer and had acknowledged (tcpi_bytes_acked)",
        s.readings.peers.iter().map(|p| (peer(p), p.socket_sent_bytes)),
    )?;
    counter(
        enc,
        "probe_tcp_socket_received_bytes",
        "Bytes probe's sockets (its cgroup's when scoped) received from a peer (tcpi_bytes_received)",
        s.readings.peers.iter().map(|p| (peer(p), p.socket_received_bytes)),
    )?;
    Ok(())
}

/// The kernel maps' state and probe's programs as the kernel accounts them.
fn encode_maps_and_programs(s: &Snapshot, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    gauge(
        enc,
        "probe_flows_tracked",
        "Flow entries in the kernel map",
        [(vec![], s.readings.flows_tracked as f64)],
    )?;
    counter(
        enc,
        "probe_flow_evictions",
        "Flows evicted from the full kernel map before their last counts were read",
        [(vec![], s.readings.flow_evictions)],
    )?;
    counter(
        enc,
        "probe_tcp_connection_evictions",
        "Open TCP connections evicted from the full kernel connection map (raise maps.conns)",
        [(vec![], s.readings.conn_evictions)],
    )?;
    counter(
        enc,
        "probe_events_lost",
        "Burst events lost: the kernel's ring buffer was full, or a tick read more than it could hold",
        [(vec![], s.readings.events_lost)],
    )?;
    counter(
        enc,
        "probe_events_thinned",
        "Burst events of busy ticks kept for the features only: past the tick's cap, older than the newest the features use",
        [(vec![], s.readings.events_thinned)],
    )?;
    counter(
        enc,
        "probe_bpf_run_seconds",
        "Time the kernel spent running a probe program (kernel BPF run-time statistics)",
        s.readings
            .programs
            .iter()
            .map(|p| (l(&[("program", &p.program)]), p.run_seconds)),
    )?;
    counter(
        enc,
        "probe_bpf_runs",
        "Times the kernel ran a probe program",
        s.readings
            .programs
            .iter()
            .map(|p| (l(&[("program", &p.program)]), p.runs)),
    )?;
    Ok(())
}

/// Full maps, the fold, RDMA ports and the hooks.
fn encode_health(s: &Snapshot, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    counter(
        enc,
        "probe_map_full",
        "Inserts a full kernel map refused (the LRU flow map evicts instead; see probe_flow_evictions_total)",
        s.readings.map_full
            .iter()
            .map(|m| (l(&[("map", m.map)]), m.inserts_refused)),
    )?;
    gauge(
        enc,
        "probe_peers_folded",
        "Peers beyond the top-K whose traffic is reported as peer=\"other\"",
        [(vec![], s.readings.peers_folded as f64)],
    )?;
    if let Some(r) = &s.readings.rdma {
        crate::collect::rdma::encode_metrics(r, enc)?;
    }
    gauge(
        enc,
        "probe_hook_attached",
        "1 when a kernel hook is attached, 0 when the kernel refused it (see the log)",
        s.readings
            .hooks
            .iter()
            .map(|h| (l(&[("hook", h.hook)]), if h.attached { 1.0 } else { 0.0 })),
    )?;
    Ok(())
}

/// prometheus-client takes per-bucket counts and accumulates them itself; the snapshot
/// keeps cumulative counts (as the JSON API documents). The last log2 bucket also holds
/// everything above its bound, so it is exported as +Inf.
fn per_bucket(h: &crate::snapshot::Histogram) -> Vec<(f64, u64)> {
    let mut prev = 0;
    let n = h.buckets.len();
    h.buckets
        .iter()
        .enumerate()
        .map(|(i, (bound, cumulative))| {
            let count = cumulative.saturating_sub(prev);
            prev = *cumulative;
            (if i + 1 == n { f64::INFINITY } else { *bound }, count)
        })
        .collect()
}

fn histogram_family<'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Vec<(&'static str, String)>, &'a crate::snapshot::Histogram)>,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, h) in series {
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
            h.sum,
            h.count,
            &per_bucket(h),
            None,
        )?;
    }
    Ok(())
}

fn encode_bursts(s: &Snapshot, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let b = |b: &crate::snapshot::BurstSeries| {
        l(&[
            ("iface", &b.iface),
            ("direction", b.direction),
            ("peer", &b.peer),
        ])
    };
    counter(
        enc,
        "probe_bursts",
        "Bursts of a peer's traffic that ended (an idle gap longer than --burst-gap followed)",
        s.readings.bursts.iter().map(|x| (b(x), x.count)),
    )?;
    histogram_family(
        enc,
        "probe_burst_bytes",
        "Sizes of ended bursts in bytes (log2 buckets)",
        s.readings.bursts.iter().map(|x| (b(x), &x.bytes)),
    )?;
    histogram_family(
        enc,
        "probe_burst_duration_seconds",
        "Durations of ended bursts, first to last packet (log2 buckets)",
        s.readings.bursts.iter().map(|x| (b(x), &x.duration)),
    )
}

fn encode_queues(s: &Snapshot, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let q = |q: &crate::snapshot::QdiscSeries| {
        l(&[
            ("iface", &q.iface),
            ("qdisc", &q.stats.kind),
            ("handle", &q.stats.handle),
            ("parent", &q.stats.parent),
        ])
    };
    gauge(
        enc,
        "probe_qdisc_backlog_packets",
        "Packets queued in a qdisc (netlink qdisc stats)",
        s.readings
            .qdiscs
            .iter()
            .map(|x| (q(x), x.stats.backlog_packets as f64)),
    )?;
    gauge(
        enc,
        "probe_qdisc_backlog_bytes",
        "Bytes queued in a qdisc (netlink qdisc stats)",
        s.readings
            .qdiscs
            .iter()
            .map(|x| (q(x), x.stats.backlog_bytes as f64)),
    )?;
    counter(
        enc,
        "probe_qdisc_drops",
        "Packets a qdisc dropped",
        s.readings.qdiscs.iter().map(|x| (q(x), x.stats.drops)),
    )?;
    counter(
        enc,
        "probe_qdisc_overlimits",
        "Times a qdisc was over its limit (throttled or dropped)",
        s.readings.qdiscs.iter().map(|x| (q(x), x.stats.overlimits)),
    )?;
    counter(
        enc,
        "probe_qdisc_requeues",
        "Packets a qdisc requeued",
        s.readings.qdiscs.iter().map(|x| (q(x), x.stats.requeues)),
    )?;
    histogram_family(
        enc,
        "probe_qdisc_sojourn_seconds",
        "Time packets spent in an interface's root qdisc, enqueue to dequeue (log2 buckets)",
        s.readings
            .sojourn
            .iter()
            .map(|x| (l(&[("iface", &x.iface)]), &x.seconds)),
    )?;
    counter(
        enc,
        "probe_drops",
        "Packets the kernel dropped, by the kernel's drop reason (skb:kfree_skb, whole host)",
        s.readings
            .drops
            .iter()
            .map(|d| (l(&[("reason", &d.reason)]), d.packets)),
    )
}

fn encode_interfaces(s: &Snapshot, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    type Field = fn(&crate::collect::netlink::LinkStats) -> u64;
    let fields: [(&str, &str, Field); 8] = [
        (
            "probe_interface_receive_bytes",
            "Bytes received (link stats64)",
            |x| x.rx_bytes,
        ),
        (
            "probe_interface_transmit_bytes",
            "Bytes sent (link stats64)",
            |x| x.tx_bytes,
        ),
        (
            "probe_interface_receive_packets",
            "Packets received (link stats64)",
            |x| x.rx_packets,
        ),
        (
            "probe_interface_transmit_packets",
            "Packets sent (link stats64)",
            |x| x.tx_packets,
        ),
        (
            "probe_interface_receive_errors",
            "Receive errors (link stats64)",
            |x| x.rx_errors,
        ),
        (
            "probe_interface_transmit_errors",
            "Transmit errors (link stats64)",
            |x| x.tx_errors,
        ),
        (
            "probe_interface_receive_dropped",
            "Received packets dropped (link stats64)",
            |x| x.rx_dropped,
        ),
        (
            "probe_interface_transmit_dropped",
            "Packets dropped on transmit (link stats64)",
            |x| x.tx_dropped,
        ),
    ];
    for (name, help, f) in fields {
        counter(
            enc,
            name,
            help,
            s.readings
                .links
                .iter()
                .map(|x| (l(&[("iface", &x.iface)]), f(&x.stats))),
        )?;
    }
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
    use crate::snapshot::{FlowSeries, Histogram, PeerSeries, Readings};

    #[test]
    fn names_units_and_labels() {
        let snap = Snapshot {
            readings: Readings {
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
                    rtt: Histogram::from_log2(&[2, 3, 0, 1], 10, 1e-6),
                    retransmits: 7,
                    ..PeerSeries::default()
                }],
                ..Readings::default()
            },
            ..Snapshot::default()
        };
        let text = render(&registry(Arc::new(RwLock::new(Arc::new(snap)))));
        assert!(text.contains(
            "probe_flow_bytes_total{iface=\"eth0\",direction=\"egress\",peer=\"10.0.0.2\"} 1500"
        ), "{text}");
        assert!(
            text.contains("probe_tcp_retransmits_total{peer=\"10.0.0.2\"} 7"),
            "{text}"
        );
        assert!(
            text.contains("probe_tcp_srtt_seconds{peer=\"10.0.0.2\"} 0.002"),
            "{text}"
        );
        // Cumulative buckets, each sample counted once; the last bucket is +Inf == _count.
        let bucket = |le: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with("probe_tcp_rtt_seconds_bucket")
                        && l.contains(&format!("le=\"{le}\""))
                })
                .and_then(|l| l.rsplit(' ').next())
                .map(str::to_owned)
        };
        assert_eq!(bucket("0.000002").as_deref(), Some("2"), "{text}");
        assert_eq!(bucket("0.000004").as_deref(), Some("5"), "{text}");
        assert_eq!(bucket("0.000008").as_deref(), Some("5"), "{text}");
        assert_eq!(bucket("+Inf").as_deref(), Some("6"), "{text}");
        assert!(
            text.contains("probe_tcp_rtt_seconds_count{peer=\"10.0.0.2\"} 6"),
            "{text}"
        );
        assert!(text.contains("probe_build_info{version="), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    /// Names in a Markdown file: backticked `probe_...` tokens, `{a,b}` after an underscore
    /// expanded, a trailing `{labels}` dropped, wildcards (`*`, `<key>`) skipped.
    fn documented(md: &str) -> std::collections::BTreeSet<String> {
        fn expand(s: &str) -> Vec<String> {
            let Some(open) = s.find("_{") else {
                return vec![s.to_string()];
            };
            let close = open + s[open..].find('}').expect("closed brace");
            s[open + 2..close]
                .split(',')
                .flat_map(|alt| expand(&format!("{}_{alt}{}", &s[..open], &s[close + 1..])))
                .collect()
        }
        md.split('`')
            .skip(1)
            .step_by(2)
            .filter(|tok| tok.starts_with("probe_") && !tok.contains(['*', '<', ' ']))
            .flat_map(|tok| {
                let tok = match tok.rfind('{') {
                    Some(i) if i > 0 && !tok[..i].ends_with('_') => &tok[..i],
                    _ => tok,
                };
                expand(tok)
            })
            .filter(|n| !n.ends_with('_'))
            .collect()
    }

    #[test]
    fn docs_name_every_exported_metric_and_no_other() {
        // Every family is written even without series, RDMA's only with ports: a snapshot
        // with the fixture's ports renders them all.
        let snap = Snapshot {
            readings: Readings {
                rdma: Some(std::sync::Arc::new(
                    crate::collect::rdma::fixtures::snapshot(),
                )),
                ..Readings::default()
            },
            ..Snapshot::default()
        };
        let text = render(&registry(Arc::new(RwLock::new(Arc::new(snap)))));
        let mut exported = std::collections::BTreeSet::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            let (name, kind) = rest.split_once(' ').unwrap();
            exported.insert(match kind {
                "counter" => format!("{name}_total"),
                "info" => format!("{name}_info"),
                _ => name.to_string(),
            });
        }
        for s in crate::collect::sources::all(&crate::config::Config::default()) {
            for m in s.metrics() {
                exported.insert(match m.kind {
                    crate::collect::sources::Kind::Counter => format!("{}_total", m.name),
                    crate::collect::sources::Kind::Gauge => m.name.to_string(),
                });
            }
        }
        let docs = |f: &str| {
            std::fs::read_to_string(format!("{}/../docs/{f}", env!("CARGO_MANIFEST_DIR"))).unwrap()
        };
        let mut named = documented(&docs("metrics.md"));
        named.extend(documented(&docs("rdma.md")));
        let undocumented: Vec<_> = exported.difference(&named).collect();
        let gone: Vec<_> = named.difference(&exported).collect();
        assert!(
            undocumented.is_empty() && gone.is_empty(),
            "exported but not in docs/metrics.md (or rdma.md): {undocumented:?}\n\
             in the docs but not exported: {gone:?}"
        );
    }

    #[test]
    fn the_docs_reader_expands_and_strips() {
        let md = "`probe_a_{x,y}_{b,c}_total` `probe_r_total{device,port}` `probe_` \
                  `probe_rdma_*` `probe_t_total{stage=\"m\"}`";
        let got: Vec<_> = documented(md).into_iter().collect();
        assert_eq!(
            got,
            [
                "probe_a_x_b_total",
                "probe_a_x_c_total",
                "probe_a_y_b_total",
                "probe_a_y_c_total",
                "probe_r_total",
                "probe_t_total"
            ]
        );
    }
}

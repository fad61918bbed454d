//! The `probe_rdma_*` series, encoded from a snapshot by the daemon's prometheus-client
//! `Collector`. Names are passed without `_total`: the encoder appends it to counters.
//!
//! | series | type | labels |
//! |---|---|---|
//! | `probe_rdma_port_info` | info | device, port, link_layer, state, phys_state |
//! | `probe_rdma_port_rate_bits_per_second` | gauge | device, port |
//! | `probe_rdma_port_<key>_total` (see [`PORT_METRICS`]) | counter | device, port |
//! | `probe_rdma_port_counter_total` | counter | device, port, counter (other `counters/` files) |
//! | `probe_rdma_port_hw_counter_total` | counter | device, port, counter (other `hw_counters/` files) |
//! | `probe_rdma_port_counter_saturated` | gauge | device, port, counter (only saturated ones, value 1) |
//! | `probe_rdma_read_errors_total` | counter | none |

use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use super::counters::{Group, PORT_METRICS};
use super::{RdmaPort, RdmaSnapshot};

/// Label value for an attribute that could not be read.
const UNKNOWN: &str = "unknown";

/// Writes every RDMA series of `snapshot`. Families without samples are left out, except
/// `probe_rdma_read_errors_total`, which is always present.
pub fn encode_metrics(snapshot: &RdmaSnapshot, encoder: &mut DescriptorEncoder) -> fmt::Result {
    let ports: Vec<(&RdmaPort, String)> = snapshot
        .ports
        .iter()
        .map(|p| (p, p.port.to_string()))
        .collect();
    encode_info(&ports, encoder)?;
    encode_rates(&ports, encoder)?;
    encode_known_counters(&ports, encoder)?;
    encode_other_counters(&ports, encoder)?;
    encode_saturated(&ports, encoder)?;
    encoder
        .encode_descriptor(
            "probe_rdma_read_errors",
            "RDMA sysfs reads that failed (unsupported counter, I/O error, unparsable value) since start.",
            None,
            MetricType::Counter,
        )?
        .encode_counter::<NoLabelSet, _, u64>(&snapshot.read_errors_total, None)
}

/// `probe_rdma_port_info`: link layer and states of each port.
fn encode_info(ports: &[(&RdmaPort, String)], encoder: &mut DescriptorEncoder) -> fmt::Result {
    if !ports.is_empty() {
        let mut info = encoder.encode_descriptor(
            "probe_rdma_port",
            "RDMA port attributes (link layer, logical and physical state), value 1.",
            None,
            MetricType::Info,
        )?;
        for (p, port) in ports {
            let labels = [
                ("device", p.device.as_str()),
                ("port", port.as_str()),
                ("link_layer", p.link_layer.as_deref().unwrap_or(UNKNOWN)),
                ("state", p.state.as_deref().unwrap_or(UNKNOWN)),
                ("phys_state", p.phys_state.as_deref().unwrap_or(UNKNOWN)),
            ];
            info.encode_info(&labels)?;
        }
    }
    Ok(())
}

/// The ports' link rates.
fn encode_rates(ports: &[(&RdmaPort, String)], encoder: &mut DescriptorEncoder) -> fmt::Result {
    let with_rate: Vec<_> = ports
        .iter()
        .filter_map(|(p, port)| p.rate_bits_per_second.map(|r| (*p, port, r)))
        .collect();
    if !with_rate.is_empty() {
        let mut gauge = encoder.encode_descriptor(
            "probe_rdma_port_rate_bits_per_second",
            "RDMA port link rate in bits per second (sysfs rate).",
            None,
            MetricType::Gauge,
        )?;
        for (p, port, rate) in with_rate {
            let labels = [("device", p.device.as_str()), ("port", port.as_str())];
            gauge.encode_family(&labels)?.encode_gauge(&rate)?;
        }
    }
    Ok(())
}

/// The counters [`PORT_METRICS`] names, one family each.
fn encode_known_counters(
    ports: &[(&RdmaPort, String)],
    encoder: &mut DescriptorEncoder,
) -> fmt::Result {
    for metric in PORT_METRICS {
        let values: Vec<_> = ports
            .iter()
            .filter_map(|(p, port)| p.counter(metric.key).map(|v| (*p, port, v)))
            .collect();
        if values.is_empty() {
            continue;
        }
        let mut counter =
            encoder.encode_descriptor(metric.name, metric.help, None, MetricType::Counter)?;
        for (p, port, v) in values {
            let labels = [("device", p.device.as_str()), ("port", port.as_str())];
            counter
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
        }
    }
    Ok(())
}

/// Every other counter file, by group, labelled with its name.
fn encode_other_counters(
    ports: &[(&RdmaPort, String)],
    encoder: &mut DescriptorEncoder,
) -> fmt::Result {
    for (group, name, help) in [
        (
            Group::Counters,
            "probe_rdma_port_counter",
            "Other IB PerfMgt port counters (ports/N/counters/<counter>), in the counter's own unit.",
        ),
        (
            Group::HwCounters,
            "probe_rdma_port_hw_counter",
            "Other driver counters (ports/N/hw_counters/<counter>, names vary by driver), in the counter's own unit.",
        ),
    ] {
        let prefix = format!("{}/", group.dir());
        let values: Vec<_> = ports
            .iter()
            .flat_map(|(p, port)| {
                let prefix = prefix.as_str();
                p.counters.iter().filter_map(move |(k, v)| {
                    k.strip_prefix(prefix).map(|file| (*p, port, file, *v))
                })
            })
            .collect();
        if values.is_empty() {
            continue;
        }
        let mut counter = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (p, port, file, v) in values {
            let labels = [
                ("device", p.device.as_str()),
                ("port", port.as_str()),
                ("counter", file),
            ];
            counter
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
        }
    }
    Ok(())
}

/// The legacy counters stuck at their maximum.
fn encode_saturated(ports: &[(&RdmaPort, String)], encoder: &mut DescriptorEncoder) -> fmt::Result {
    if ports.iter().any(|(p, _)| !p.saturated.is_empty()) {
        let mut gauge = encoder.encode_descriptor(
            "probe_rdma_port_counter_saturated",
            "1 while a legacy port counter (ports/N/counters/<counter>) sits at its maximum and no longer counts; reset the port counters to resume.",
            None,
            MetricType::Gauge,
        )?;
        for (p, port) in ports {
            for file in &p.saturated {
                let labels = [
                    ("device", p.device.as_str()),
                    ("port", port.as_str()),
                    ("counter", file.as_str()),
                ];
                gauge.encode_family(&labels)?.encode_gauge(&1u32)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::collector::Collector;
    use prometheus_client::registry::Registry;

    /// How the daemon wires it: a collector that encodes the latest snapshot on each scrape.
    #[derive(Debug)]
    struct SnapshotCollector(RdmaSnapshot);

    impl Collector for SnapshotCollector {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
            encode_metrics(&self.0, &mut encoder)
        }
    }

    fn render(snapshot: RdmaSnapshot) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(SnapshotCollector(snapshot)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    fn sample<'a>(text: &'a str, series: &str) -> Option<&'a str> {
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .map(|l| &l[series.len() + 1..])
    }

    #[test]
    fn series_names_units_and_labels() {
        let text = render(super::super::fixtures::snapshot());
        let ib = r#"device="mlx5_0",port="1""#;
        let roce = r#"device="mlx5_1",port="1""#;
        let rxe = r#"device="rxe0",port="1""#;

        // Info series with the link layer, state and physical state.
        assert!(text.contains("# TYPE probe_rdma_port info\n"), "{text}");
        assert_eq!(
            sample(
                &text,
                r#"probe_rdma_port_info{device="mlx5_0",port="1",link_layer="InfiniBand",state="ACTIVE",phys_state="LinkUp"}"#
            ),
            Some("1")
        );
        assert_eq!(
            sample(
                &text,
                r#"probe_rdma_port_info{device="rxe0",port="1",link_layer="Ethernet",state="ACTIVE",phys_state="LinkUp"}"#
            ),
            Some("1")
        );
        // Link rate in bits per second.
        assert!(text.contains("# TYPE probe_rdma_port_rate_bits_per_second gauge\n"));
        assert_eq!(
            sample(
                &text,
                &format!("probe_rdma_port_rate_bits_per_second{{{ib}}}")
            ),
            Some("100000000000")
        );
        // Bytes, not words: (1_000_100 words) x 4.
        assert!(text.contains("# TYPE probe_rdma_port_transmit_bytes counter\n"));
        assert_eq!(
            sample(
                &text,
                &format!("probe_rdma_port_transmit_bytes_total{{{ib}}}")
            ),
            Some("4000400")
        );
        assert_eq!(
            sample(
                &text,
                &format!("probe_rdma_port_receive_bytes_total{{{ib}}}")
            ),
            Some("8000000")
        );
        assert_eq!(
            sample(
                &text,
                &format!("probe_rdma_port_transmit_packets_total{{{rxe}}}")
            ),
            Some("900")
        );
        assert_eq!(
            sample(
                &text,
                &format!("probe_rdma_port_transmit_wait_ticks_total{{{ib}}}")
            ),
            Some("4294967295")
        );
        // Congestion signals on the RoCE port only.
        assert_eq!(
            sample(&text, &format!("probe_rdma_port_cnp_sent_total{{{roce}}}")),
            Some("10")
        );
        assert_eq!(
            sample(
                &text,
                &format!("probe_rdma_port_cnp_handled_total{{{roce}}}")
            ),
            Some("30")
        );
        assert_eq!(
            sample(
                &text,
                &format!("probe_rdma_port_ecn_marked_packets_total{{{roce}}}")
            ),
            Some("20")
        );
        assert!(sample(&text, &format!("probe_rdma_port_cnp_sent_total{{{ib}}}")).is_none());
        for name in [
            "out_of_sequence_packets",
            "packet_sequence_errors",
            "local_ack_timeout_errors",
            "rnr_nak_retry_errors",
            "transmit_discards",
        ] {
            assert_eq!(
                sample(&text, &format!("probe_rdma_port_{name}_total{{{roce}}}")),
                Some("0"),
                "{name}"
            );
        }
        assert_eq!(
            sample(
                &text,
                &format!("probe_rdma_port_link_downed_total{{{roce}}}")
            ),
            Some("1")
        );
        // Everything else, generically, with the file name as the counter label.
        assert_eq!(
            sample(
                &text,
                &format!(r#"probe_rdma_port_hw_counter_total{{{roce},counter="rp_cnp_ignored"}}"#)
            ),
            Some("0")
        );
        assert_eq!(
            sample(
                &text,
                &format!(r#"probe_rdma_port_counter_total{{{ib},counter="unicast_xmit_packets"}}"#)
            ),
            Some("29991")
        );
        assert!(!text.contains(r#"counter="lifespan""#));
        assert!(!text.contains(r#"counter="np_cnp_sent""#));
        // The saturated counter is flagged.
        assert_eq!(
            sample(
                &text,
                &format!(r#"probe_rdma_port_counter_saturated{{{ib},counter="port_xmit_wait"}}"#)
            ),
            Some("1")
        );
        // The unreadable file, twice (once per poll).
        assert_eq!(sample(&text, "probe_rdma_read_errors_total"), Some("2"));
    }

    #[test]
    fn naming_conventions_hold_for_every_series() {
        let text = render(super::super::fixtures::snapshot());
        let mut types = std::collections::HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(name.starts_with("probe_rdma_"), "{name}");
                assert!(!name.ends_with("_total"), "{name}: the encoder adds _total");
                types.insert(name.to_owned(), kind.to_owned());
            } else if !line.starts_with('#') {
                let series = line.split(['{', ' ']).next().unwrap();
                assert!(series.starts_with("probe_rdma_"), "{line}");
                assert!(!series.contains("_total_total"), "{line}");
                assert!(!series.contains("words"), "{line}");
                let family = types
                    .keys()
                    .filter(|f| series.starts_with(f.as_str()))
                    .max_by_key(|f| f.len())
                    .unwrap_or_else(|| panic!("no family for {line}"));
                match types[family].as_str() {
                    "counter" => assert_eq!(series, format!("{family}_total"), "{line}"),
                    "info" => assert_eq!(series, format!("{family}_info"), "{line}"),
                    "gauge" => assert_eq!(series, family, "{line}"),
                    other => panic!("unexpected type {other}"),
                }
                if series != "probe_rdma_read_errors_total" {
                    assert!(
                        line.contains(r#"device=""#) && line.contains(r#"port=""#),
                        "{line}"
                    );
                }
                if line.contains("link_layer=") {
                    assert_eq!(
                        series, "probe_rdma_port_info",
                        "link_layer only on the info series"
                    );
                }
            }
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn empty_snapshot_exports_only_the_error_counter() {
        let text = render(RdmaSnapshot::default());
        assert_eq!(
            text,
            "# HELP probe_rdma_read_errors RDMA sysfs reads that failed (unsupported counter, I/O error, unparsable value) since start.\n\
             # TYPE probe_rdma_read_errors counter\n\
             probe_rdma_read_errors_total 0\n\
             # EOF\n"
        );
    }
}

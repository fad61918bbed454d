//! The JSON of `/api/v1/snapshot` as the recorder reads it (the API's contract, not the
//! daemon's in-memory types: unknown fields are ignored, missing ones default).
use std::{collections::BTreeMap, time::Duration};

use anyhow::Result;
use serde::Deserialize;

use crate::apiclient::Endpoint;

/// The daemon's latest snapshot.
pub fn snapshot(endpoint: &Endpoint, timeout: Duration) -> Result<Snapshot> {
    endpoint.get_json("/api/v1/snapshot", timeout)
}

// The JSON of /api/v1/snapshot (see src/snapshot.rs): only what the recorder uses.

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    pub time_unix: f64,
    pub tick_seconds: f64,
    pub interfaces: Vec<String>,
    pub flows: Vec<Flow>,
    pub peers: Vec<Peer>,
    pub flows_tracked: u64,
    pub flow_evictions: u64,
    pub bursts: Vec<Burst>,
    pub qdiscs: Vec<Qdisc>,
    pub sojourn: Vec<Sojourn>,
    pub drops: Vec<Drop>,
    pub links: Vec<Link>,
    pub peers_folded: u64,
    pub rdma: Option<Rdma>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Histogram {
    /// (upper bound, cumulative count).
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Flow {
    pub iface: String,
    pub direction: String,
    pub peer: String,
    pub bytes: u64,
    pub packets: u64,
    pub ce_packets: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Peer {
    pub peer: String,
    pub srtt_seconds: Option<f64>,
    pub min_rtt_seconds: Option<f64>,
    pub connections: u32,
    pub rtt: Histogram,
    pub retransmits: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Burst {
    pub iface: String,
    pub direction: String,
    pub peer: String,
    pub count: u64,
    pub bytes: Histogram,
    pub duration: Histogram,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Qdisc {
    pub iface: String,
    pub kind: String,
    pub handle: String,
    pub backlog_packets: u64,
    pub backlog_bytes: u64,
    pub drops: u64,
    pub overlimits: u64,
    pub requeues: u64,
    pub sent_bytes: u64,
    pub sent_packets: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Sojourn {
    pub iface: String,
    pub seconds: Histogram,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Drop {
    pub reason: String,
    pub packets: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Link {
    pub iface: String,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_errors: u64,
    pub tx_errors: u64,
    pub rx_dropped: u64,
    pub tx_dropped: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Rdma {
    pub ports: Vec<RdmaPort>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RdmaPort {
    pub device: String,
    pub port: u32,
    /// Per-second rates over the poller's last interval, by counter key.
    pub rates: BTreeMap<String, f64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn reads_the_daemons_json() {
        use crate::snapshot as d;
        let snap = d::Snapshot {
            time_unix: 1_700_000_000.5,
            tick_seconds: 1.0,
            flows: vec![d::FlowSeries {
                iface: "eth0".into(),
                direction: "egress",
                peer: "10.0.0.2".into(),
                bytes: 1000,
                packets: 10,
                ce_packets: 1,
                ect_packets: 2,
            }],
            peers: vec![d::PeerSeries {
                peer: "10.0.0.2".into(),
                srtt_seconds: Some(0.003),
                min_rtt_seconds: None,
                connections: 2,
                rtt: d::Histogram::from_log2(&[0, 3, 1], 20, 1e-6),
                retransmits: 4,
            }],
            qdiscs: vec![d::QdiscSeries {
                iface: "eth0".into(),
                stats: crate::collect::netlink::QdiscStats {
                    kind: "tbf".into(),
                    handle: "8001:".into(),
                    backlog_bytes: 77,
                    ..Default::default()
                },
            }],
            links: vec![d::LinkSeries {
                iface: "eth0".into(),
                stats: crate::collect::netlink::LinkStats {
                    tx_bytes: 5,
                    ..Default::default()
                },
            }],
            ..d::Snapshot::default()
        };
        let json = serde_json::to_vec(&snap).unwrap();
        let s: Snapshot = serde_json::from_slice(&json).unwrap();
        assert_eq!(s.time_unix, 1_700_000_000.5);
        assert_eq!(s.flows[0].direction, "egress");
        assert_eq!((s.flows[0].bytes, s.flows[0].ce_packets), (1000, 1));
        assert_eq!(s.peers[0].srtt_seconds, Some(0.003));
        assert_eq!(s.peers[0].rtt.count, 4);
        assert_eq!(s.peers[0].rtt.buckets[1], (4e-6, 3));
        assert_eq!(
            (s.qdiscs[0].kind.as_str(), s.qdiscs[0].backlog_bytes),
            ("tbf", 77)
        );
        assert_eq!(s.links[0].tx_bytes, 5);
        assert!(s.rdma.is_none());
    }
}

//! One entity at one tick: the row the observe stage makes, `probe record` stores and the
//! feature stage reads.
use serde::{Deserialize, Serialize};

/// Kinds of entity a row describes (the `entity_kind` column).
pub const PEER: &str = "peer";
pub const INTERFACE: &str = "interface";
pub const QDISC: &str = "qdisc";
pub const RDMA_PORT: &str = "rdma_port";
pub const DROP_REASON: &str = "drop_reason";
pub const HOST: &str = "host";

/// Every entity kind, in the order rows of one tick are written.
pub const ENTITY_KINDS: &[&str] = &[PEER, INTERFACE, QDISC, RDMA_PORT, DROP_REASON, HOST];

/// One entity at one tick. Rates are per second over `interval_s`; counts are of that
/// interval; gauges are the daemon's values at the tick. `None` is null: not applicable to
/// the entity kind, or not known this tick (see docs/recording.md).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Observation {
    pub time_unix: f64,
    pub interval_s: f64,
    pub entity_kind: String,
    pub entity: String,
    pub tx_bytes_per_s: Option<f64>,
    pub rx_bytes_per_s: Option<f64>,
    pub tx_packets_per_s: Option<f64>,
    pub rx_packets_per_s: Option<f64>,
    pub ce_packets_per_s: Option<f64>,
    pub srtt_s: Option<f64>,
    pub min_rtt_s: Option<f64>,
    pub rtt_samples: Option<i64>,
    pub rtt_mean_s: Option<f64>,
    pub rtt_p50_s: Option<f64>,
    pub rtt_p90_s: Option<f64>,
    pub rtt_p99_s: Option<f64>,
    pub retransmits_per_s: Option<f64>,
    pub connections: Option<i64>,
    pub receive_queue_bytes: Option<i64>,
    pub send_queue_bytes: Option<i64>,
    pub socket_tx_bytes_per_s: Option<f64>,
    pub socket_rx_bytes_per_s: Option<f64>,
    pub bursts: Option<i64>,
    pub burst_bytes: Option<i64>,
    pub burst_seconds: Option<f64>,
    pub tx_errors_per_s: Option<f64>,
    pub rx_errors_per_s: Option<f64>,
    pub tx_dropped_per_s: Option<f64>,
    pub rx_dropped_per_s: Option<f64>,
    pub sojourn_samples: Option<i64>,
    pub sojourn_p50_s: Option<f64>,
    pub sojourn_p99_s: Option<f64>,
    pub qdisc_backlog_packets: Option<i64>,
    pub qdisc_backlog_bytes: Option<i64>,
    pub qdisc_drops_per_s: Option<f64>,
    pub qdisc_overlimits_per_s: Option<f64>,
    pub qdisc_requeues_per_s: Option<f64>,
    pub rdma_transmit_wait_ticks_per_s: Option<f64>,
    pub rdma_transmit_discards_per_s: Option<f64>,
    pub rdma_cnp_sent_per_s: Option<f64>,
    pub rdma_cnp_handled_per_s: Option<f64>,
    pub rdma_ecn_marked_packets_per_s: Option<f64>,
    pub rdma_out_of_sequence_packets_per_s: Option<f64>,
    pub rdma_packet_sequence_errors_per_s: Option<f64>,
    pub rdma_local_ack_timeout_errors_per_s: Option<f64>,
    pub rdma_rnr_nak_retry_errors_per_s: Option<f64>,
    pub rdma_link_downed_per_s: Option<f64>,
    pub drops_per_s: Option<f64>,
    pub flows_tracked: Option<i64>,
    pub flow_evictions_per_s: Option<f64>,
    pub peers_folded: Option<i64>,
}

/// The sum of two optional values: null only when both are.
pub fn sum_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
    }
}

impl Observation {
    /// Bytes per second both ways (null when neither direction is known).
    pub fn bytes_per_s(&self) -> Option<f64> {
        sum_opt(self.tx_bytes_per_s, self.rx_bytes_per_s)
    }
}

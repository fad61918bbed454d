//! Observations: one typed row per entity (peer, interface, qdisc, RDMA port, drop reason,
//! host) per tick, in base units. The one input of the feature stage, live and offline:
//! the daemon derives them from consecutive snapshots, `probe record` stores exactly these
//! rows, and `probe features` reads them back.
mod derive;
mod tick_bursts;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use derive::derive;
pub use tick_bursts::{BurstLabel, TickBurst, TickBursts};

use crate::{pipeline, snapshot::Snapshot};

/// The observe stage: this tick's observations from this snapshot and the one before it.
/// The first tick has no observations (no interval to measure over).
#[derive(Default)]
pub struct Observe {
    prev: Option<Snapshot>,
}

impl pipeline::Stage for Observe {
    fn name(&self) -> &'static str {
        "observe"
    }

    fn run(&mut self, snap: &mut Snapshot) {
        // derive reads counters, never burst events: keeping a copy of a busy tick's tens of
        // thousands of events (three shared labels each) cost a copy and a drop every tick.
        let events = std::mem::take(&mut snap.burst_events);
        let now = snap.clone();
        snap.burst_events = events;
        if let Some(prev) = &self.prev {
            snap.observations = derive(prev, &now);
        }
        self.prev = Some(now);
    }
}

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

/// One burst of one flow that ended (an idle gap longer than `--burst-gap` followed it),
/// streamed from the kernel one event per burst. Times are wall-clock seconds. The labels
/// are shared, not copied: a busy tick carries tens of thousands of events of a few peers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BurstEvent {
    pub iface: Arc<str>,
    /// "egress" or "ingress".
    pub direction: Arc<str>,
    /// The remote address, as the `peer` label spells it.
    pub peer: Arc<str>,
    /// First packet of the burst (seconds since the Unix epoch).
    pub start_unix: f64,
    /// First to last packet.
    pub duration_s: f64,
    pub bytes: u64,
    pub packets: u64,
    /// Time of the tick that delivered the event (`time_unix` of its snapshot): a replay
    /// hands each tick the events the daemon handed it.
    pub tick_unix: f64,
}

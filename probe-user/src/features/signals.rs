//! The per-tick signals each entity kind is windowed over: which observation column, in what
//! unit, and why it may foretell a spike. The feature names are built from this table
//! (`schema`), and docs/features.md is checked against it.
use crate::observe::{self as o, sum_opt as sum, Observation};

pub struct Signal {
    pub name: &'static str,
    pub unit: &'static str,
    pub get: fn(&Observation) -> Option<f64>,
    /// What the per-tick value is.
    pub what: &'static str,
    /// Why it may predict a spike.
    pub why: &'static str,
}

fn int(v: Option<i64>) -> Option<f64> {
    v.map(|v| v as f64)
}

const PEER: &[Signal] = &[
    Signal {
        name: "rtt_p99",
        unit: "s",
        get: |r| r.rtt_p99_s,
        what: "99th percentile of the RTT samples of the tick (sock_ops histogram increase)",
        why: "the quantity a spike is defined on; its trend and spread lead it",
    },
    Signal {
        name: "rtt_mean",
        unit: "s",
        get: |r| r.rtt_mean_s,
        what: "mean of the RTT samples of the tick",
        why: "queueing raises the mean before the tail crosses the spike threshold",
    },
    Signal {
        name: "srtt",
        unit: "s",
        get: |r| r.srtt_s,
        what: "smoothed RTT of the peer's connections at the tick",
        why: "the kernel's own smoothed view, present even on ticks without new samples",
    },
    Signal {
        name: "tx_bytes",
        unit: "B/s",
        get: |r| r.tx_bytes_per_s,
        what: "bytes per second sent to the peer (wire bytes, all monitored interfaces)",
        why: "load toward the peer; bursts of it fill the bottleneck queue",
    },
    Signal {
        name: "rx_bytes",
        unit: "B/s",
        get: |r| r.rx_bytes_per_s,
        what: "bytes per second received from the peer",
        why: "a peer that slows down sends less; incast shows as many peers' rx rising",
    },
    Signal {
        name: "retransmits",
        unit: "1/s",
        get: |r| r.retransmits_per_s,
        what: "TCP retransmitted segments per second to the peer",
        why: "loss precedes and accompanies RTT spikes (timeouts, recovery)",
    },
    Signal {
        name: "ce_packets",
        unit: "1/s",
        get: |r| r.ce_packets_per_s,
        what: "packets per second carrying an ECN CE mark, both directions",
        why: "an AQM marks before the queue is long enough to drop",
    },
];

const INTERFACE: &[Signal] = &[
    Signal {
        name: "tx_bytes",
        unit: "B/s",
        get: |r| r.tx_bytes_per_s,
        what: "bytes per second the interface sent (link counters)",
        why: "utilisation of the link; a saturated link queues",
    },
    Signal {
        name: "rx_bytes",
        unit: "B/s",
        get: |r| r.rx_bytes_per_s,
        what: "bytes per second the interface received",
        why: "incoming load, incast",
    },
    Signal {
        name: "drops",
        unit: "1/s",
        get: |r| sum(r.tx_dropped_per_s, r.rx_dropped_per_s),
        what: "packets per second the interface dropped, both directions",
        why: "an overflowing queue drops, and drops cost retransmits and RTT",
    },
    Signal {
        name: "errors",
        unit: "1/s",
        get: |r| sum(r.tx_errors_per_s, r.rx_errors_per_s),
        what: "transmit and receive errors per second",
        why: "a failing link retransmits and stalls",
    },
    Signal {
        name: "sojourn_p99",
        unit: "s",
        get: |r| r.sojourn_p99_s,
        what: "99th percentile of the time packets spent in the root qdisc during the tick",
        why: "queueing delay is the part of RTT that spikes",
    },
];

const QDISC: &[Signal] = &[
    Signal {
        name: "backlog_bytes",
        unit: "B",
        get: |r| int(r.qdisc_backlog_bytes),
        what: "bytes queued in the qdisc at the tick",
        why: "a growing backlog is a growing queueing delay",
    },
    Signal {
        name: "backlog_packets",
        unit: "packets",
        get: |r| int(r.qdisc_backlog_packets),
        what: "packets queued in the qdisc at the tick",
        why: "as backlog_bytes, for queues limited in packets",
    },
    Signal {
        name: "drops",
        unit: "1/s",
        get: |r| r.qdisc_drops_per_s,
        what: "packets per second the qdisc dropped",
        why: "the queue is full",
    },
    Signal {
        name: "overlimits",
        unit: "1/s",
        get: |r| r.qdisc_overlimits_per_s,
        what: "overlimit events per second (a shaper held packets back)",
        why: "the shaper is the bottleneck: packets wait",
    },
    Signal {
        name: "tx_bytes",
        unit: "B/s",
        get: |r| r.tx_bytes_per_s,
        what: "bytes per second the qdisc sent",
        why: "throughput against the qdisc's rate",
    },
];

const RDMA_PORT: &[Signal] = &[
    Signal {
        name: "tx_bytes",
        unit: "B/s",
        get: |r| r.tx_bytes_per_s,
        what: "bytes per second the port sent",
        why: "load on the port",
    },
    Signal {
        name: "rx_bytes",
        unit: "B/s",
        get: |r| r.rx_bytes_per_s,
        what: "bytes per second the port received",
        why: "incoming load, incast",
    },
    Signal {
        name: "cnp_sent",
        unit: "1/s",
        get: |r| r.rdma_cnp_sent_per_s,
        what: "congestion notification packets sent per second (this host saw ECN marks)",
        why: "DCQCN's congestion signal, ahead of throughput loss",
    },
    Signal {
        name: "cnp_handled",
        unit: "1/s",
        get: |r| r.rdma_cnp_handled_per_s,
        what: "congestion notification packets handled per second (this host slowed down)",
        why: "the sender is being throttled",
    },
    Signal {
        name: "ecn_marked",
        unit: "1/s",
        get: |r| r.rdma_ecn_marked_packets_per_s,
        what: "ECN-marked RoCE packets received per second",
        why: "switch queues past their marking threshold",
    },
    Signal {
        name: "transmit_wait",
        unit: "ticks/s",
        get: |r| r.rdma_transmit_wait_ticks_per_s,
        what: "ticks per second the port had data but no credits to send",
        why: "back-pressure from the fabric",
    },
    Signal {
        name: "out_of_sequence",
        unit: "1/s",
        get: |r| r.rdma_out_of_sequence_packets_per_s,
        what: "out-of-sequence packets received per second",
        why: "loss or reordering in the fabric, go-back-N retransmits",
    },
    Signal {
        name: "ack_timeouts",
        unit: "1/s",
        get: |r| r.rdma_local_ack_timeout_errors_per_s,
        what: "local ACK timeouts per second",
        why: "lost packets waited out: the longest stalls",
    },
];

const HOST: &[Signal] = &[
    Signal {
        name: "tx_bytes",
        unit: "B/s",
        get: |r| r.tx_bytes_per_s,
        what: "bytes per second sent by all monitored interfaces",
        why: "the host's total load",
    },
    Signal {
        name: "rx_bytes",
        unit: "B/s",
        get: |r| r.rx_bytes_per_s,
        what: "bytes per second received by all monitored interfaces",
        why: "the host's total incoming load",
    },
    Signal {
        name: "backlog_bytes",
        unit: "B",
        get: |r| int(r.qdisc_backlog_bytes),
        what: "bytes queued in all qdiscs of monitored interfaces",
        why: "queueing anywhere on the host",
    },
    Signal {
        name: "drops",
        unit: "1/s",
        get: |r| r.drops_per_s,
        what: "packets per second the kernel dropped, every reason",
        why: "loss anywhere on the host",
    },
];

const DROP_REASON: &[Signal] = &[Signal {
    name: "drops",
    unit: "1/s",
    get: |r| r.drops_per_s,
    what: "packets per second the kernel dropped for this reason",
    why: "which drop path is active (queue full, no socket, netfilter)",
}];

/// The signals of an entity kind (empty for a kind the feature stage does not know).
pub fn of(kind: &str) -> &'static [Signal] {
    match kind {
        o::PEER => PEER,
        o::INTERFACE => INTERFACE,
        o::QDISC => QDISC,
        o::RDMA_PORT => RDMA_PORT,
        o::HOST => HOST,
        o::DROP_REASON => DROP_REASON,
        _ => &[],
    }
}

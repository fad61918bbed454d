//! The features an operator reads directly, as gauges per peer, and the pipeline's own cost
//! per stage. All features of every entity are in `/api/v1/snapshot`; only these few become
//! series, and only for peers that have their own series after the top-K fold.
use std::collections::HashSet;

use prometheus_client::encoding::DescriptorEncoder;

use super::family::{counter, gauge, l};
use crate::{fold::OTHER, observe::PEER, snapshot::Snapshot};

/// (metric, feature, help). The feature names are in docs/features.md.
pub const FEATURE_GAUGES: &[(&str, &str, &str)] = &[
    (
        "probe_iteration_period_seconds",
        "iteration_period_s",
        "The training iteration period of a peer's traffic, from burst timing (absent without a clear period)",
    ),
    (
        "probe_iteration_period_confidence",
        "iteration_period_confidence",
        "How regular that period is, 0 to 1",
    ),
    (
        "probe_burst_duty_cycle_ratio",
        "burst_duty_cycle_30s",
        "Share of the last 30 s a peer's traffic spent inside bursts",
    ),
    (
        "probe_rtt_straggler_ratio",
        "rtt_straggler_ratio",
        "A peer's RTT over the median RTT of all peers at the same tick (a straggler is far above 1)",
    ),
];

/// Peers with their own series after the top-K fold.
pub fn members(s: &Snapshot) -> HashSet<&str> {
    s.readings
        .peers
        .iter()
        .map(|p| p.peer.as_str())
        .chain(s.readings.flows.iter().map(|f| f.peer.as_str()))
        .filter(|p| *p != OTHER)
        .collect()
}

pub fn encode(s: &Snapshot, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let members = members(s);
    let peers: Vec<_> = s
        .features
        .iter()
        .filter(|f| f.entity_kind == PEER && members.contains(f.entity.as_str()))
        .collect();
    for (metric, feature, help) in FEATURE_GAUGES {
        gauge(
            enc,
            metric,
            help,
            peers.iter().filter_map(|f| {
                let v = f.get(feature)?;
                Some((l(&[("peer", &f.entity)]), v))
            }),
        )?;
    }
    gauge(
        enc,
        "probe_feature_entities",
        "Entities (peers, interfaces, qdiscs, RDMA ports, drop reasons, host) with feature state",
        [(vec![], s.features_entities as f64)],
    )?;
    gauge(
        enc,
        "probe_feature_state_bytes",
        "Memory the feature stage holds for those entities (fixed per entity)",
        [(vec![], s.features_state_bytes as f64)],
    )?;
    counter(
        enc,
        "probe_feature_entities_untracked",
        "Observations of entities beyond features.max_entities, which get no features",
        [(vec![], s.features_untracked)],
    )?;
    counter(
        enc,
        "probe_tick_stage_seconds",
        "Time each stage of the tick has taken since the daemon started (collect, observe, features, model, fold)",
        s.stage_totals
            .iter()
            .map(|t| (l(&[("stage", t.stage)]), t.seconds)),
    )?;
    gauge(
        enc,
        "probe_tick_duration_seconds",
        "How long each stage of the last tick took (collect, observe, features, model, fold)",
        s.stages
            .iter()
            .map(|t| (l(&[("stage", t.stage)]), t.seconds)),
    )
}

//! The JSON of `/api/v1/snapshot` as the recorder reads it: the tick's observations and
//! burst events, exactly as the daemon computed them (unknown fields are ignored).
use std::time::Duration;

use anyhow::{bail, Result};
use serde::Deserialize;

use crate::{
    apiclient::Endpoint,
    observe::{BurstEvent, Observation},
};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    pub tick: u64,
    pub time_unix: f64,
    pub tick_seconds: f64,
    /// None from a daemon older than the observe stage.
    pub observations: Option<Vec<Observation>>,
    pub burst_events: Vec<BurstEvent>,
    /// The training jobs the daemon found on its host (none from an older daemon).
    #[serde(default)]
    pub jobs: Vec<RecordedJob>,
}

/// A job as the snapshot names it: what a recording keeps of it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RecordedJob {
    pub name: String,
    #[serde(default)]
    pub addresses: Vec<String>,
}

/// The daemon's latest snapshot.
pub fn snapshot(endpoint: &Endpoint, timeout: Duration) -> Result<Snapshot> {
    let s: Snapshot = endpoint.get_json("/api/v1/snapshot", timeout)?;
    if s.observations.is_none() && s.time_unix > 0.0 {
        bail!(
            "{} serves no observations: the daemon is older than this recorder (upgrade probe run)",
            endpoint.url("/api/v1/snapshot")
        );
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_daemons_json_exactly() {
        use crate::snapshot as d;
        let obs = Observation {
            time_unix: 1_700_000_000.5,
            interval_s: 1.000_213_4,
            entity_kind: "peer".into(),
            entity: "10.0.0.2".into(),
            tx_bytes_per_s: Some(0.1 + 0.2),
            rtt_p99_s: Some(1.0 / 3.0),
            connections: Some(2),
            ..Observation::default()
        };
        let ev = BurstEvent {
            iface: "eth0".into(),
            direction: "egress".into(),
            peer: "10.0.0.2".into(),
            start_unix: 1_700_000_000.123_456_7,
            duration_s: 0.012_345,
            bytes: 4 << 20,
            packets: 2900,
            tick_unix: 1_700_000_000.5,
        };
        let snap = d::Snapshot {
            readings: d::Readings {
                tick: 7,
                time_unix: 1_700_000_000.5,
                tick_seconds: 1.0,
                burst_events: crate::observe::TickBursts::from_events(std::slice::from_ref(&ev)),
                ..d::Readings::default()
            },
            observations: vec![obs.clone()],
            ..d::Snapshot::default()
        };
        let json = serde_json::to_vec(&snap).unwrap();
        let s: Snapshot = serde_json::from_slice(&json).unwrap();
        assert_eq!(s.tick, 7);
        // Bit-equal through JSON: features replayed offline see what the daemon saw.
        assert_eq!(s.observations.unwrap(), vec![obs]);
        assert_eq!(s.burst_events, vec![ev]);
    }
}

//! Features: per entity, from the observations and burst events of each tick, with bounded
//! memory per entity. The same code runs in the daemon (live) and in `probe features`
//! (offline, replaying a recording), so a model sees in training what it sees in service.
//!
//! `signals` says what is windowed per entity kind, `schema` names the features, `window`,
//! `bursts` and `period` compute them, `engine` keeps the per-entity state and `row` is
//! what it hands on.
pub mod bursts;
mod engine;
pub mod job;
pub mod period;
mod row;
pub mod schema;
mod signals;
mod window;

pub use engine::Engine;
pub use row::FeatureRow;
pub use schema::{FeatureConfig, Schema};

use crate::observe::{Observation, TickBursts};

/// The features stage of the daemon.
pub struct Features {
    engine: Engine,
}

impl Features {
    pub fn new(cfg: FeatureConfig) -> Self {
        Self {
            engine: Engine::new(cfg),
        }
    }
}

/// What the feature stage made of one tick.
#[derive(Debug, Default)]
pub struct Output {
    /// This tick's features of every tracked entity.
    pub rows: Vec<FeatureRow>,
    /// Observations of entities the stage had no room for (cumulative).
    pub untracked: u64,
    /// Entities with feature state, and the bytes that state holds.
    pub entities: u64,
    pub state_bytes: u64,
}

impl Features {
    /// The features of one tick; None for a tick without observations (the first), which
    /// is not recorded either: skipping it keeps the live features and a replay the same.
    pub fn tick(
        &mut self,
        time_unix: f64,
        observations: &[Observation],
        bursts: &TickBursts,
    ) -> Option<Output> {
        if observations.is_empty() {
            return None;
        }
        let rows = self.engine.tick(time_unix, observations, bursts);
        Some(Output {
            rows,
            untracked: self.engine.untracked,
            entities: self.engine.entities() as u64,
            state_bytes: self.engine.state_bytes() as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::{BurstEvent, Observation, TickBursts, HOST, PEER};

    fn obs(t: f64, peer: &str, rtt: f64, tx: f64) -> Observation {
        Observation {
            time_unix: t,
            interval_s: 1.0,
            entity_kind: PEER.into(),
            entity: peer.into(),
            rtt_p99_s: Some(rtt),
            srtt_s: Some(rtt),
            tx_bytes_per_s: Some(tx),
            rx_bytes_per_s: Some(0.0),
            ..Observation::default()
        }
    }

    fn burst(peer: &str, start: f64) -> BurstEvent {
        BurstEvent {
            iface: "eth0".into(),
            direction: "egress".into(),
            peer: peer.into(),
            start_unix: start,
            duration_s: 0.05,
            bytes: 4 << 20,
            packets: 3000,
            tick_unix: 0.0,
        }
    }

    /// Ticks of 1 s with a 250 ms burst train toward peer "a", from t0.
    fn drive(
        engine: &mut Engine,
        t0: f64,
        ticks: usize,
        mut each: impl FnMut(usize, &[FeatureRow]),
    ) {
        for i in 0..ticks {
            let now = t0 + i as f64;
            let events: Vec<_> = (0..4)
                .map(|k| burst("a", now - 1.0 + 0.25 * k as f64 + 0.1))
                .collect();
            let mut rows = vec![
                obs(now, "a", 0.002 + 1e-4 * (i % 5) as f64, 1e8),
                obs(now, "b", 0.004, 5e7),
            ];
            rows.push(Observation {
                time_unix: now,
                entity_kind: HOST.into(),
                entity: "host".into(),
                tx_bytes_per_s: Some(1.5e8),
                qdisc_backlog_bytes: Some(1000),
                ..Observation::default()
            });
            let f = engine.tick(now, &rows, &TickBursts::from_events(&events));
            each(i, &f);
        }
    }

    /// The engine groups a tick's events by peer: whether a peer's events share one label
    /// (live) or each has its own (a replay's), and however peers interleave, the features
    /// are the same to the bit. A small ring (16) overflows, and out-of-order starts take the
    /// slow insert.
    #[test]
    fn grouping_events_by_peer_keeps_each_peers_sequence() {
        let cfg = FeatureConfig {
            events_per_peer: 16,
            ..FeatureConfig::default()
        };
        let (mut shared, mut separate) = (Engine::new(cfg.clone()), Engine::new(cfg));
        let labels: [std::sync::Arc<str>; 3] = ["a".into(), "b".into(), "c".into()];
        for t in 0..30 {
            let now = 1000.0 + t as f64;
            let spec: Vec<(usize, f64)> = (0..40)
                .map(|i| (i * 7 % 3, now - 1.0 + ((i * 13) % 40) as f64 / 40.0))
                .collect();
            let live: Vec<BurstEvent> = spec
                .iter()
                .map(|&(p, s)| BurstEvent {
                    peer: labels[p].clone(),
                    ..burst("", s)
                })
                .collect();
            let replay: Vec<BurstEvent> = spec.iter().map(|&(p, s)| burst(&labels[p], s)).collect();
            let rows: Vec<Observation> = ["a", "b", "c"]
                .iter()
                .map(|p| obs(now, p, 0.002, 1e8))
                .collect();
            let (x, y) = (
                shared.tick(now, &rows, &TickBursts::from_events(&live)),
                separate.tick(now, &rows, &TickBursts::from_events(&replay)),
            );
            let bits = |r: &FeatureRow| r.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(x.len(), 3);
            for (x, y) in x.iter().zip(&y) {
                assert_eq!(bits(x), bits(y), "tick {t}, {}", x.entity);
            }
        }
    }

    #[test]
    fn memory_per_entity_stays_constant_over_100k_ticks() {
        // The period every 500 ticks: the FFT is slow in a debug build, and its scratch is
        // shared, not per entity.
        let cfg = FeatureConfig {
            period_every: 500,
            ..FeatureConfig::default()
        };
        let mut e = Engine::new(cfg);
        drive(&mut e, 1000.0, 200, |_, _| {});
        let warm = e.state_bytes();
        drive(&mut e, 1200.0, 99_800, |_, _| {});
        assert_eq!(e.entities(), 3);
        assert_eq!(e.state_bytes(), warm, "state grew over 100,000 ticks");
        // What docs/features.md states per peer with the default config.
        assert!(warm / 2 < 32 * 1024, "{warm} bytes for 2 peers and a host");
    }

    #[test]
    fn peers_get_period_bursts_and_cross_features() {
        let mut e = Engine::new(FeatureConfig::default());
        let mut last = Vec::new();
        drive(&mut e, 1000.0, 40, |_, f| last = f.to_vec());
        let a = last.iter().find(|r| r.entity == "a").unwrap();
        let p = a.get("iteration_period_s").unwrap();
        assert!((p - 0.25).abs() / 0.25 < 0.05, "period {p}");
        assert!(a.get("iteration_period_confidence").unwrap() > 0.8);
        let duty = a.get("burst_duty_cycle_30s").unwrap();
        assert!((duty - 0.2).abs() < 0.01, "duty {duty}");
        assert!((a.get("burst_rate_30s").unwrap() - 4.0).abs() < 0.2);
        // a's srtt over the median of a and b.
        let s = a.get("rtt_straggler_ratio").unwrap();
        assert!(s < 1.0 && s > 0.5, "{s}");
        assert_eq!(a.get("throughput_share"), Some(1e8 / 1.5e8));
        assert_eq!(a.get("host_backlog_bytes"), Some(1000.0));
        let b = last.iter().find(|r| r.entity == "b").unwrap();
        assert!(b.get("iteration_period_s").is_none());
        assert_eq!(b.get("rtt_p99_std_120s"), Some(0.0));
        // The JSON form leaves out what is not known.
        let j = serde_json::to_value(b).unwrap();
        assert!(j["values"].get("iteration_period_s").is_none());
        assert_eq!(j["values"]["rtt_p99_last"], 0.004);
        assert_eq!(j["entity_kind"], "peer");
    }

    #[test]
    fn an_entity_gone_for_longer_than_the_longest_window_is_forgotten() {
        let mut e = Engine::new(FeatureConfig::default());
        e.tick(1.0, &[obs(1.0, "x", 0.001, 1.0)], &TickBursts::default());
        assert_eq!(e.entities(), 1);
        e.tick(
            100.0,
            &[obs(100.0, "y", 0.001, 1.0)],
            &TickBursts::default(),
        );
        assert_eq!(e.entities(), 2);
        e.tick(
            200.0,
            &[obs(200.0, "y", 0.001, 1.0)],
            &TickBursts::default(),
        );
        assert_eq!(e.entities(), 1);
    }

    #[test]
    fn entities_beyond_the_limit_are_counted_not_tracked() {
        let mut e = Engine::new(FeatureConfig {
            max_entities: 2,
            ..FeatureConfig::default()
        });
        let rows: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|p| obs(1.0, p, 0.001, 1.0))
            .collect();
        let f = e.tick(1.0, &rows, &TickBursts::default());
        assert_eq!(f.len(), 2);
        assert_eq!(e.untracked, 1);
    }
}

/// The engine's cost per entity per tick under the bench's shape (64 peers with ~300 burst
/// events per second each, plus interfaces and the host), in a release build:
/// `cargo test --release -p probe-user feature_cost -- --ignored --nocapture` (the model
/// stage's cost on the same rows: `scoring_cost`). `EV` sets the events per peer per tick.
#[cfg(test)]
pub(crate) mod cost {
    use super::*;
    use crate::observe::{BurstEvent, Observation, TickBursts, HOST, INTERFACE, PEER};
    use std::sync::Arc;

    /// Ticks of the measurements.
    pub const TICKS: usize = 300;

    /// The observations and burst events of tick `t` (1 s ticks from t = 1000 s).
    pub fn tick_inputs(t: usize) -> (f64, Vec<Observation>, TickBursts) {
        let peers: Vec<String> = (0..64)
            .map(|i| format!("10.9.{}.{}", i / 200, i % 200))
            .collect();
        let now = 1000.0 + t as f64;
        let mut obs: Vec<Observation> = peers
            .iter()
            .map(|p| Observation {
                time_unix: now,
                interval_s: 1.0,
                entity_kind: PEER.into(),
                entity: p.clone(),
                rtt_p99_s: Some(0.001 + 1e-5 * (t % 7) as f64),
                rtt_mean_s: Some(0.0008),
                srtt_s: Some(0.001),
                tx_bytes_per_s: Some(1e6),
                rx_bytes_per_s: Some(1e6),
                retransmits_per_s: Some(0.0),
                ce_packets_per_s: Some(0.0),
                ..Observation::default()
            })
            .collect();
        for kind in [INTERFACE, INTERFACE, HOST] {
            obs.push(Observation {
                time_unix: now,
                entity_kind: kind.into(),
                entity: format!("{kind}{}", obs.len()),
                tx_bytes_per_s: Some(1e8),
                ..Observation::default()
            });
        }
        let n_ev = std::env::var("EV")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300usize);
        // One label per peer per tick, shared by its events, as the collect stage names them.
        let labels: Vec<Arc<str>> = peers.iter().map(|p| p.as_str().into()).collect();
        let events: Vec<BurstEvent> = (0..peers.len() * n_ev)
            .map(|i| BurstEvent {
                peer: labels[i % peers.len()].clone(),
                start_unix: now - 1.0 + i as f64 / (peers.len() * n_ev) as f64,
                duration_s: 0.0001,
                bytes: 1500,
                packets: 1,
                ..BurstEvent::default()
            })
            .collect();
        // The collect stage builds the tick's TickBursts: not the feature stage's cost.
        (now, obs, TickBursts::from_events(&events))
    }

    #[test]
    #[ignore = "a measurement, run in release"]
    fn feature_cost() {
        let mut e = Engine::new(FeatureConfig::default());
        let mut spent = std::time::Duration::ZERO;
        let mut rows = 0;
        for t in 0..TICKS {
            let (now, obs, bursts) = tick_inputs(t);
            let t0 = std::time::Instant::now();
            let f = e.tick(now, &obs, &bursts);
            spent += t0.elapsed();
            rows += f.len();
        }
        eprintln!(
            "feature stage: {:.1} us per entity per tick ({} rows, {} ticks)",
            spent.as_secs_f64() * 1e6 / rows as f64,
            rows,
            TICKS
        );
    }
}

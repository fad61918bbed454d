//! The feature engine: one state per entity (its ring, EWMAs and, for peers, bursts and
//! period), fed one tick at a time with that tick's observations and burst events. The
//! daemon's feature stage and `probe features` both drive this, with the same inputs in
//! the same order, so they compute the same values bit for bit.
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::{
    bursts::{Burst, Bursts},
    period::{Period, PeriodFinder},
    row::FeatureRow,
    schema::{per_signal, FeatureConfig, Schema, BURST_STATS},
    signals,
    window::{signal_features, Ewma, Ring, Walk},
};
use crate::{
    observe::{self as o, Observation, TickBursts},
    stats::median,
};

struct Entity {
    ring: Ring,
    ewma: Ewma,
    last_seen: f64,
    /// Ticks with an observation so far.
    ticks: u64,
    /// Peers only.
    bursts: Option<Bursts>,
    period: Period,
}

pub struct Engine {
    cfg: FeatureConfig,
    windows: Vec<f64>,
    schemas: Vec<Arc<Schema>>,
    /// Per kind (in `ENTITY_KINDS` order), by name: looked up by `&str`, no key to build.
    entities: Vec<FxHashMap<String, Entity>>,
    periods: PeriodFinder,
    scratch: Vec<f64>,
    /// A tick's bursts by peer (`by_peer`), and the merge's room (`Bursts::extend`).
    groups: Vec<Vec<Burst>>,
    burst_scratch: Vec<Burst>,
    /// The ring walk of the entity whose row is being made.
    walk: Walk,
    /// Observations of entities beyond `max_entities`, not featurized (cumulative).
    pub untracked: u64,
}

/// Index of a known entity kind in `ENTITY_KINDS` (which orders schemas and entity maps).
fn kind_index(kind: &str) -> Option<usize> {
    o::ENTITY_KINDS.iter().position(|k| *k == kind)
}

/// The bursts of a tick grouped by peer, peers in the order they first appear and each
/// peer's bursts in theirs: a peer's burst state sees exactly the sequence it would see one
/// event at a time, with one entity lookup per peer instead of per event (30,000 events a
/// tick at the bench's 10,000 connections, 64 peers). Events point at their labels, so the
/// peer of each label is looked up once (labels are in the order of their first event, so
/// peers are too), and the events are read once, in order, into per-peer bursts:
/// `groups[i]` holds the bursts of the i-th peer returned. `groups` keeps its buffers from
/// tick to tick.
fn by_peer<'a>(bursts: &'a TickBursts, groups: &mut Vec<Vec<Burst>>) -> Vec<&'a str> {
    let mut peers: Vec<&str> = Vec::new();
    let mut by_name: FxHashMap<&str, usize> = FxHashMap::default();
    let group_of: Vec<usize> = bursts
        .labels
        .iter()
        .map(|l| {
            *by_name.entry(&l.peer).or_insert_with(|| {
                peers.push(&l.peer);
                peers.len() - 1
            })
        })
        .collect();
    if groups.len() < peers.len() {
        groups.resize_with(peers.len(), Vec::new);
    }
    for g in &mut groups[..peers.len()] {
        g.clear();
    }
    for ev in &bursts.events {
        groups[group_of[ev.label as usize]].push(Burst {
            start: ev.start_unix,
            end: ev.start_unix + ev.duration_s,
            bytes: ev.bytes as f64,
        });
    }
    peers
}

impl Engine {
    pub fn new(cfg: FeatureConfig) -> Self {
        let schemas = o::ENTITY_KINDS
            .iter()
            .map(|k| Arc::new(Schema::new(k, &cfg)))
            .collect();
        Self {
            windows: cfg.windows.iter().map(|w| w.as_secs_f64()).collect(),
            cfg,
            schemas,
            entities: o::ENTITY_KINDS
                .iter()
                .map(|_| FxHashMap::default())
                .collect(),
            periods: PeriodFinder::default(),
            scratch: Vec::new(),
            groups: Vec::new(),
            burst_scratch: Vec::new(),
            walk: Walk::default(),
            untracked: 0,
        }
    }

    /// Entities with state right now.
    pub fn entities(&self) -> usize {
        self.entities.iter().map(|m| m.len()).sum()
    }

    /// Heap bytes of all entity state (each entity's is fixed when it is made).
    pub fn state_bytes(&self) -> usize {
        self.entities
            .iter()
            .flat_map(|m| m.values())
            .map(|e| e.ring.bytes() + e.ewma.bytes() + e.bursts.as_ref().map_or(0, Bursts::bytes))
            .sum()
    }

    /// Heap bytes one entity of `kind` holds under `cfg` (docs/features.md states them).
    #[cfg(test)]
    pub fn entity_bytes(kind: &'static str, cfg: &FeatureConfig) -> usize {
        let mut e = Engine::new(cfg.clone());
        let n = crate::observe::Observation {
            entity_kind: kind.into(),
            entity: "x".into(),
            ..Default::default()
        };
        e.tick(1.0, &[n], &TickBursts::default());
        e.state_bytes()
    }

    fn entity(&mut self, k: usize, name: &str, now: f64) -> Option<&mut Entity> {
        let kind = o::ENTITY_KINDS[k];
        if !self.entities[k].contains_key(name) {
            if self.entities() >= self.cfg.max_entities {
                return None;
            }
            let nsig = signals::of(kind).len();
            let since = now - self.cfg.tick.as_secs_f64();
            self.entities[k].insert(
                name.to_owned(),
                Entity {
                    ring: Ring::new(self.cfg.ring_capacity(), nsig),
                    ewma: Ewma::new(nsig, &self.windows),
                    last_seen: now,
                    ticks: 0,
                    bursts: (kind == o::PEER).then(|| Bursts::new(self.cfg.events_per_peer, since)),
                    period: Period::UNKNOWN,
                },
            );
        }
        self.entities[k].get_mut(name)
    }

    /// One tick: folds in its burst events and observations (all of time `now`) and
    /// returns the features of every observed entity, in observation order.
    pub fn tick(&mut self, now: f64, obs: &[Observation], bursts: &TickBursts) -> Vec<FeatureRow> {
        let peer = kind_index(o::PEER).expect("peers are a kind");
        let mut groups = std::mem::take(&mut self.groups);
        let mut scratch = std::mem::take(&mut self.burst_scratch);
        for (name, group) in by_peer(bursts, &mut groups).into_iter().zip(&groups) {
            if let Some(e) = self.entity(peer, name, now) {
                e.last_seen = now;
                if let Some(b) = &mut e.bursts {
                    b.extend(group, &mut scratch);
                }
            }
        }
        self.groups = groups;
        self.burst_scratch = scratch;
        let mut tracked = Vec::with_capacity(obs.len());
        for r in obs {
            let Some(k) = kind_index(&r.entity_kind) else {
                continue;
            };
            let sig = signals::of(o::ENTITY_KINDS[k]);
            self.scratch.clear();
            self.scratch.extend(
                sig.iter()
                    .map(|s| (s.get)(r).filter(|v| v.is_finite()).unwrap_or(f64::NAN)),
            );
            let vals = std::mem::take(&mut self.scratch);
            match self.entity(k, &r.entity, now) {
                Some(e) => {
                    e.ring.push(now, &vals);
                    e.ewma.update(now, &vals);
                    e.last_seen = now;
                    e.ticks += 1;
                    tracked.push((k, r));
                }
                None => self.untracked += 1,
            }
            self.scratch = vals;
        }
        let cross = Cross::of(obs);
        let mut rows = Vec::with_capacity(tracked.len());
        for (k, r) in tracked {
            rows.push(self.row(k, r, now, &cross));
        }
        self.forget_stale(now);
        rows
    }

    fn row(&mut self, k: usize, r: &Observation, now: f64, cross: &Cross) -> FeatureRow {
        let schema = self.schemas[k].clone();
        let mut values = vec![f64::NAN; schema.len()];
        let per = per_signal(self.windows.len());
        let e = self.entities[k]
            .get_mut(r.entity.as_str())
            .expect("tracked this tick");
        self.walk.over(&e.ring, now, &self.windows);
        for s in 0..schema.signals {
            signal_features(
                &e.ring,
                &e.ewma,
                s,
                &self.walk,
                &mut values[s * per..(s + 1) * per],
            );
        }
        if let Some(b) = &e.bursts {
            // A peer's ring often covers less than the shortest window (512 events at 500
            // bursts a second): every window then starts where the history does and has the
            // same statistics, computed once.
            let n = BURST_STATS.len();
            let mut last: Option<(f64, usize)> = None;
            for (w, &len) in self.windows.iter().enumerate() {
                let at = schema.bursts_at + w * n;
                let from = b.window_start(now, len);
                match last {
                    Some((f, prev)) if f == from => values.copy_within(prev..prev + n, at),
                    _ => b.window(now, len, &mut values[at..at + n]),
                }
                last = Some((from, at));
            }
            if (e.ticks - 1).is_multiple_of(u64::from(self.cfg.period_every)) {
                e.period = self
                    .periods
                    .estimate(b, now, self.cfg.period_window.as_secs_f64());
            }
            let x = &mut values[schema.extras_at..];
            x[0] = e.period.seconds;
            x[1] = e.period.confidence;
            x[2] = ratio(r.srtt_s, cross.median_srtt);
            x[3] = ratio(r.bytes_per_s(), cross.peer_bytes);
            x[4] = cross.host_bytes;
            x[5] = cross.host_backlog;
        }
        FeatureRow {
            time_unix: now,
            entity_kind: schema.kind,
            entity: r.entity.clone(),
            schema,
            values,
        }
    }

    /// Entities not seen for longer than the longest window have nothing left in it.
    fn forget_stale(&mut self, now: f64) {
        let keep = self.cfg.longest() + 2.0 * self.cfg.tick.as_secs_f64();
        for m in &mut self.entities {
            m.retain(|_, e| now - e.last_seen <= keep);
        }
    }
}

fn ratio(a: Option<f64>, b: f64) -> f64 {
    match a {
        Some(a) if b > 0.0 => a / b,
        _ => f64::NAN,
    }
}

/// What a peer is compared against at the same tick.
struct Cross {
    median_srtt: f64,
    peer_bytes: f64,
    host_bytes: f64,
    host_backlog: f64,
}

impl Cross {
    fn of(obs: &[Observation]) -> Self {
        let mut srtt: Vec<f64> = obs
            .iter()
            .filter(|r| r.entity_kind == o::PEER)
            .filter_map(|r| r.srtt_s)
            .filter(|v| *v > 0.0)
            .collect();
        let median_srtt = median(&mut srtt).unwrap_or(f64::NAN);
        let peer_bytes = obs
            .iter()
            .filter(|r| r.entity_kind == o::PEER)
            .filter_map(Observation::bytes_per_s)
            .sum();
        let host = obs.iter().find(|r| r.entity_kind == o::HOST);
        Self {
            median_srtt,
            peer_bytes,
            host_bytes: host.and_then(Observation::bytes_per_s).unwrap_or(f64::NAN),
            host_backlog: host
                .and_then(|h| h.qdisc_backlog_bytes)
                .map_or(f64::NAN, |b| b as f64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::BurstEvent;

    #[test]
    fn events_group_by_peer_in_order_across_labels() {
        // Each event's start is its index, so the groups show which events they hold.
        let ev = |i: usize, peer: Arc<str>| BurstEvent {
            peer,
            start_unix: i as f64,
            duration_s: 0.5,
            bytes: 10 * i as u64,
            ..BurstEvent::default()
        };
        let a: Arc<str> = "a".into();
        let b: Arc<str> = "b".into();
        let events = [
            ev(0, b.clone()),
            ev(1, a.clone()),
            // Another interface: another label, the same peer.
            BurstEvent {
                iface: "eth1".into(),
                ..ev(2, "b".into())
            },
            ev(3, b.clone()),
            ev(4, a),
            ev(5, "c".into()),
        ];
        let events = TickBursts::from_events(&events);
        assert_eq!(events.labels.len(), 4);
        let mut groups = vec![Vec::new(); 5];
        let got: Vec<(&str, Vec<usize>)> = by_peer(&events, &mut groups)
            .into_iter()
            .zip(&groups)
            .map(|(p, bursts)| (p, bursts.iter().map(|b| b.start as usize).collect()))
            .collect();
        assert_eq!(
            got,
            [("b", vec![0, 2, 3]), ("a", vec![1, 4]), ("c", vec![5])]
        );
        // The buffers are emptied for the next tick, not added to.
        by_peer(&events, &mut groups);
        assert_eq!(groups[0].len(), 3);
        let first = groups[0][1];
        assert_eq!(
            first,
            Burst {
                start: 2.0,
                end: 2.5,
                bytes: 20.0
            }
        );
    }
}

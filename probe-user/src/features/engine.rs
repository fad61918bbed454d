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
    observe::{self as o, Observation, TickBurst, TickBursts},
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
    /// A tick's bursts by peer, kept from tick to tick.
    peer_bursts: PeerBursts,
    /// The ring walk of the entity whose row is being made.
    walk: Walk,
    /// Observations of entities beyond `max_entities`, not featurized (cumulative).
    pub untracked: u64,
}

/// The buffers of a tick's bursts by peer (`Engine::add_bursts`).
#[derive(Default)]
struct PeerBursts {
    /// `by_peer`'s groups.
    groups: Vec<Vec<Burst>>,
    /// `tails_by_peer`'s.
    tails: Vec<Vec<u32>>,
    left_out: Vec<Option<f64>>,
    /// One peer's tail as bursts, and the merge's room (`Bursts::extend`).
    tail: Vec<Burst>,
    scratch: Vec<Burst>,
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
    let (peers, group_of) = peers_of(bursts, groups);
    for ev in &bursts.events {
        groups[group_of[ev.label as usize]].push(burst(ev));
    }
    peers
}

/// `by_peer` for a tick whose events are in start order (`TickBursts::sorted`), with only what
/// a ring of `cap` can keep of each peer's: `tails[i]` holds the indices of the i-th peer's
/// last `cap` events, newest first, and `left_out[i]` the start of its last one not held,
/// if any (`Bursts::extend_tail`). The events are read from the newest back, and only until
/// every peer has `cap` and one more: a busy peer ends thousands of bursts a tick, and
/// copying and merging them all was most of the feature stage's cost (50-60 us per entity
/// per tick at 3,750 events per peer against 9-11 at 300; 22 now). Indices, not bursts:
/// 4 bytes written per event kept instead of 24, and each peer's bursts are made in one
/// buffer that stays in cache, not in one per peer that a busy tick has evicted since.
fn tails_by_peer<'a>(
    bursts: &'a TickBursts,
    cap: usize,
    tails: &mut Vec<Vec<u32>>,
    left_out: &mut Vec<Option<f64>>,
) -> Vec<&'a str> {
    let (peers, group_of) = peers_of(bursts, tails);
    left_out.clear();
    left_out.resize(peers.len(), None);
    let mut open = peers.len();
    for (i, ev) in bursts.events.iter().enumerate().rev() {
        if open == 0 {
            break;
        }
        let g = group_of[ev.label as usize];
        if tails[g].len() < cap {
            tails[g].push(i as u32);
        } else if left_out[g].is_none() {
            left_out[g] = Some(ev.start_unix);
            open -= 1;
        }
    }
    peers
}

/// The peers of a tick's events in the order of their first event, and the index among
/// them of each label's peer; `groups` emptied for them.
fn peers_of<'a, T>(bursts: &'a TickBursts, groups: &mut Vec<Vec<T>>) -> (Vec<&'a str>, Vec<usize>) {
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
    (peers, group_of)
}

fn burst(ev: &TickBurst) -> Burst {
    Burst {
        start: ev.start_unix,
        end: ev.start_unix + ev.duration_s,
        bytes: ev.bytes as f64,
    }
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
            peer_bursts: PeerBursts::default(),
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
        self.add_bursts(now, bursts, false);
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

    /// Folds a tick's burst events into their peers' rings: only the newest of each peer's
    /// when the events are in start order, all of them otherwise or when `whole` (the tests
    /// compare the two).
    fn add_bursts(&mut self, now: f64, bursts: &TickBursts, whole: bool) {
        let peer = kind_index(o::PEER).expect("peers are a kind");
        let cap = self.cfg.events_per_peer;
        let mut pb = std::mem::take(&mut self.peer_bursts);
        let newest = !whole && cap > 0 && bursts.sorted;
        let peers = if newest {
            tails_by_peer(bursts, cap, &mut pb.tails, &mut pb.left_out)
        } else {
            by_peer(bursts, &mut pb.groups)
        };
        for (i, name) in peers.into_iter().enumerate() {
            let Some(e) = self.entity(peer, name, now) else {
                continue;
            };
            e.last_seen = now;
            let Some(b) = &mut e.bursts else {
                continue;
            };
            if newest {
                pb.tail.clear();
                pb.tail.extend(
                    pb.tails[i]
                        .iter()
                        .rev()
                        .map(|&j| burst(&bursts.events[j as usize])),
                );
                b.extend_tail(pb.left_out[i], &pb.tail, &mut pb.scratch);
            } else {
                b.extend(&pb.groups[i], &mut pb.scratch);
            }
        }
        self.peer_bursts = pb;
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
    use crate::features::bursts::tests::{assert_same, Rng};
    use crate::observe::BurstEvent;

    /// In start order, the newest `cap` of each peer and the start of its last one left
    /// out.
    #[test]
    fn each_peer_keeps_its_newest_bursts() {
        let ev = |i: usize, peer: &str, iface: &str| BurstEvent {
            iface: iface.into(),
            peer: peer.into(),
            start_unix: i as f64,
            ..BurstEvent::default()
        };
        let events = [
            ev(0, "b", "eth0"),
            ev(1, "a", "eth0"),
            ev(2, "b", "eth1"),
            ev(3, "b", "eth0"),
            ev(4, "a", "eth0"),
            ev(5, "c", "eth0"),
        ];
        let events = TickBursts::from_events(&events);
        assert!(TickBursts::in_start_order(&events.events));
        let (mut tails, mut left_out) = (Vec::new(), Vec::new());
        let peers = tails_by_peer(&events, 2, &mut tails, &mut left_out);
        assert_eq!(peers, ["b", "a", "c"]);
        assert_eq!(tails[..3], [vec![3, 2], vec![4, 1], vec![5]]);
        assert_eq!(left_out, [Some(0.0), None, None]);
    }

    #[test]
    fn events_out_of_start_order_take_the_whole_path() {
        let ev = |start: f64| TickBurst {
            start_unix: start,
            ..TickBurst::default()
        };
        let order =
            |s: &[f64]| TickBursts::in_start_order(&s.iter().map(|&x| ev(x)).collect::<Vec<_>>());
        assert!(order(&[]) && order(&[1.0]) && order(&[1.0, 1.0, 2.0]));
        assert!(!order(&[2.0, 1.0]));
        // `extend` sorts by `total_cmp`, in which -0 comes before 0; NaNs sort at the ends.
        assert!(order(&[-0.0, 0.0]) && !order(&[0.0, -0.0]));
        assert!(!order(&[1.0, f64::NAN]) && !order(&[-f64::NAN, 1.0]));
    }

    /// Folding only each peer's newest bursts when a tick's events are in start order
    /// leaves every peer's bursts, coverage and features as folding all of them does, to
    /// the bit: random ticks of peers quiet and busy (up to 12 times the ring of 16), each
    /// over several labels, with equal starts and late bursts, and some ticks out of order.
    #[test]
    fn newest_bursts_only_give_the_features_all_of_them_give() {
        let cfg = FeatureConfig {
            events_per_peer: 16,
            period_every: 1,
            ..FeatureConfig::default()
        };
        let (mut newest, mut whole) = (Engine::new(cfg.clone()), Engine::new(cfg));
        let peers: Vec<Arc<str>> = (0..5).map(|i| format!("10.0.0.{i}").into()).collect();
        let ifaces: [Arc<str>; 2] = ["eth0".into(), "eth1".into()];
        let dirs: [Arc<str>; 2] = ["egress".into(), "ingress".into()];
        let mut rng = Rng(35);
        let (mut all_busy, mut out_of_order, mut id) = (0, 0, 0.0);
        for t in 0..120 {
            let now = 1000.0 + t as f64;
            let mut events = Vec::new();
            let busy = rng.below(3) == 0;
            let mut every_peer_over = true;
            for p in &peers {
                let n = match rng.below(if busy { 1 } else { 4 }) {
                    0 => 17 + rng.below(180),
                    1 => 10 + rng.below(15),
                    _ => rng.below(10),
                } as usize;
                every_peer_over &= n > 17;
                let bursts = crate::features::bursts::tests::batch(&mut rng, now, n, &mut id);
                events.extend(bursts.iter().map(|b| BurstEvent {
                    iface: ifaces[rng.below(2) as usize].clone(),
                    direction: dirs[rng.below(2) as usize].clone(),
                    peer: p.clone(),
                    start_unix: b.start,
                    duration_s: b.end - b.start,
                    bytes: b.bytes as u64,
                    packets: 1,
                    tick_unix: now,
                }));
            }
            // Peers interleave in start order; one tick in eight is left as it came.
            if rng.below(8) == 0 {
                out_of_order += 1;
            } else {
                events.sort_by(|a, b| a.start_unix.total_cmp(&b.start_unix));
                all_busy += usize::from(every_peer_over);
            }
            let events = TickBursts::from_events(&events);
            let obs: Vec<Observation> = peers
                .iter()
                .map(|p| Observation {
                    time_unix: now,
                    interval_s: 1.0,
                    entity_kind: o::PEER.into(),
                    entity: p.to_string(),
                    srtt_s: Some(0.001),
                    tx_bytes_per_s: Some(1e6 * (1.0 + rng.unit())),
                    ..Observation::default()
                })
                .collect();
            let x = newest.tick(now, &obs, &events);
            whole.add_bursts(now, &events, true);
            let y = whole.tick(now, &obs, &TickBursts::default());
            let bits = |r: &FeatureRow| r.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(x.len(), peers.len());
            for (x, y) in x.iter().zip(&y) {
                assert_eq!(x.entity, y.entity);
                assert_eq!(bits(x), bits(y), "tick {t}, {}", x.entity);
            }
            let k = kind_index(o::PEER).unwrap();
            for p in &peers {
                let (a, b) = (&newest.entities[k][&**p], &whole.entities[k][&**p]);
                let (a, b) = (a.bursts.as_ref().unwrap(), b.bursts.as_ref().unwrap());
                assert_same(a, b, now, &format!("tick {t}, {p}"));
            }
        }
        assert!(
            all_busy > 10 && out_of_order > 5,
            "{all_busy} {out_of_order}"
        );
    }

    /// A busy tick's events as the collector hands them over, past its cap only the newest
    /// of each key (`burst_records::Limit`), give every feature that all the tick's events
    /// give, to the bit: ring records of 3 peers, one over 2 interfaces and 2 directions, in
    /// the order the rings give them (end order: a long burst comes after later starts),
    /// with equal starts, ticks from none to twice the cap (what the drain reads at most).
    #[test]
    fn a_thinned_busy_tick_gives_the_features_of_all_its_bursts() {
        use crate::collect::{
            burst_events::events,
            burst_records::{BurstRecords, Limit},
        };
        use probe_ebpf::{BurstEnd, AF_INET, DIR_EGRESS, DIR_INGRESS};
        let cap = 16;
        let cfg = FeatureConfig {
            events_per_peer: cap,
            period_every: 1,
            ..FeatureConfig::default()
        };
        let limit = Limit {
            cap: 300,
            per_key: cap + 1,
        };
        let (mut thin, mut all) = (Engine::new(cfg.clone()), Engine::new(cfg));
        let ifnames =
            std::collections::HashMap::from([(3, "eth0".to_owned()), (4, "eth1".to_owned())]);
        let mut rng = Rng(36);
        let (mut thinned, mut kept, mut read) = (0, 0, 0);
        for t in 0..80u64 {
            let now = 1000 + t;
            // The drain reads at most twice the cap a tick.
            let n = match rng.below(4) {
                0 => rng.below(300),
                _ => 300 + rng.below(300),
            };
            let mut recs: Vec<(u64, BurstEnd)> = (0..n)
                .map(|i| {
                    // Peers 0 and 1 have one key (all their newest in it), peer 2 four.
                    let peer = rng.below(3) as u8;
                    // Starts on a 1/64 s grid over the last 1.5 s; some long bursts.
                    let start_ns =
                        (now * 1_000_000_000 - 1_500_000_000) + rng.below(96) * 15_625_000;
                    let duration_ns = if rng.below(8) == 0 {
                        rng.below(1_000_000_000)
                    } else {
                        rng.below(2_000_000)
                    };
                    let end = BurstEnd {
                        start_ns,
                        duration_ns,
                        bytes: 1 + i,
                        packets: 1,
                        addr: [u32::from_ne_bytes([10, 0, 0, peer]), 0, 0, 0],
                        ifindex: 3 + u32::from(peer > 1 && rng.below(2) == 0),
                        family: AF_INET,
                        direction: if peer > 1 && rng.below(2) == 0 {
                            DIR_INGRESS
                        } else {
                            DIR_EGRESS
                        },
                        _pad: 0,
                    };
                    (start_ns + duration_ns, end)
                })
                .collect();
            recs.sort_by_key(|r| r.0);
            let recs: Vec<BurstEnd> = recs.into_iter().map(|r| r.1).collect();
            let mut limited = BurstRecords::limited(limit);
            for r in &recs {
                limited.fold(r, true);
            }
            limited.finish();
            assert_eq!(limited.lost(), 0);
            thinned += limited.thinned();
            kept += limited.rows().len();
            read += recs.len();
            let (a, b) = (
                events(&limited, 0, &ifnames),
                events(&BurstRecords::folded(&recs), 0, &ifnames),
            );
            assert!(a.sorted && b.sorted);
            let obs: Vec<Observation> = (0..3)
                .map(|i| Observation {
                    time_unix: now as f64,
                    interval_s: 1.0,
                    entity_kind: o::PEER.into(),
                    entity: format!("10.0.0.{i}"),
                    srtt_s: Some(0.001),
                    ..Observation::default()
                })
                .collect();
            let x = thin.tick(now as f64, &obs, &a);
            let y = all.tick(now as f64, &obs, &b);
            let bits = |r: &FeatureRow| r.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for (x, y) in x.iter().zip(&y) {
                assert_eq!(bits(x), bits(y), "tick {t}, {}", x.entity);
            }
            let k = kind_index(o::PEER).unwrap();
            for (p, e) in &all.entities[k] {
                let (a, b) = (
                    thin.entities[k][p].bursts.as_ref().unwrap(),
                    e.bursts.as_ref().unwrap(),
                );
                assert_same(a, b, now as f64, &format!("tick {t}, {p}"));
            }
        }
        assert_eq!(kept as u64 + thinned, read as u64);
        assert!(thinned as usize > read / 10, "{thinned} of {read} thinned");
    }

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

//! Bounded cardinality. At most K peers (by recent traffic) have their own series; the rest
//! fold into `peer="other"`.
//!
//! Membership is sticky so that every counter stays monotonic: a peer keeps its series while
//! it is active and loses it only after `idle_ticks` without traffic; a newcomer gets a series
//! only when a slot is free. A non-member's traffic enters "other" as per-tick deltas, so
//! "other" only ever grows.
use std::collections::{HashMap, HashSet};

use crate::{
    collect::readings::{
        BurstSeries, FlowSeries, Histogram, JobPeer, JobSeries, PeerSeries, Readings,
    },
    config::Config,
    counter::Change,
    observe::{self, Observation},
};

/// A member peer that moved no traffic for this long gives its series up: as long as the
/// collectors keep an idle series.
const PEER_IDLE: std::time::Duration = crate::collect::delta::SERIES_IDLE;

/// The fold stage: top-K peers keep their series, the rest become peer="other". Runs after
/// the features, which see every peer.
pub struct Fold(PeerFolder);

impl Fold {
    pub fn new(cfg: &Config) -> Self {
        let idle_ticks = (PEER_IDLE.as_secs_f64() / cfg.tick.as_secs_f64()).ceil() as u64;
        Self(PeerFolder::new(cfg.top_peers, idle_ticks.max(1)))
    }
}

impl Fold {
    /// Folds this tick's readings in place, and tells the host's observation how many peers
    /// were folded.
    pub fn fold(&mut self, r: &mut Readings, observations: &mut [Observation]) {
        for iface in std::mem::take(&mut r.removed_interfaces) {
            self.0.forget_interface(&iface);
        }
        self.0.apply(r);
        let folded = i64::try_from(r.peers_folded).ok();
        if let Some(h) = observations
            .iter_mut()
            .find(|o| o.entity_kind == observe::HOST)
        {
            h.peers_folded = folded;
        }
    }
}

pub const OTHER: &str = "other";

type SeriesKey = (String, &'static str, String);

pub struct PeerFolder {
    k: usize,
    idle_ticks: u64,
    tick: u64,
    /// Member peer -> last tick it was active.
    members: HashMap<String, u64>,
    prev_flows: HashMap<SeriesKey, FlowSeries>,
    prev_peers: HashMap<String, PeerSeries>,
    prev_bursts: HashMap<SeriesKey, BurstSeries>,
    other_flows: HashMap<(String, &'static str), FlowSeries>,
    other_peer: Option<PeerSeries>,
    other_bursts: HashMap<(String, &'static str), BurstSeries>,
}

/// A job's peers without their own series become its one "other" peer (gauges: summed).
fn fold_job_peers(job: &mut JobSeries, members: &HashMap<String, u64>) {
    let mut other: Option<JobPeer> = None;
    job.peers.retain(|p| {
        if members.contains_key(&p.peer) {
            return true;
        }
        let o = other.get_or_insert_with(|| JobPeer {
            peer: OTHER.into(),
            ..JobPeer::default()
        });
        o.connections += p.connections;
        o.receive_queue_bytes += p.receive_queue_bytes;
        o.send_queue_bytes += p.send_queue_bytes;
        false
    });
    job.peers.extend(other);
}

/// What a cumulative histogram gained since `before`; all of it if the series is new or
/// restarted (as [`Change::increase`] reads a counter).
fn since(now: &Histogram, before: Option<&Histogram>) -> Histogram {
    now.increase(before).unwrap_or_else(|| now.clone())
}

fn fkey(f: &FlowSeries) -> SeriesKey {
    (f.iface.clone(), f.direction, f.peer.clone())
}

fn bkey(b: &BurstSeries) -> SeriesKey {
    (b.iface.clone(), b.direction, b.peer.clone())
}

impl PeerFolder {
    pub fn new(k: usize, idle_ticks: u64) -> Self {
        Self {
            k,
            idle_ticks,
            tick: 0,
            members: HashMap::new(),
            prev_flows: HashMap::new(),
            prev_peers: HashMap::new(),
            prev_bursts: HashMap::new(),
            other_flows: HashMap::new(),
            other_peer: None,
            other_bursts: HashMap::new(),
        }
    }

    pub fn apply(&mut self, snap: &mut Readings) {
        self.tick += 1;
        self.update_members(snap);
        // Taken out while the folds borrow self mutably; K names at most.
        let members = std::mem::take(&mut self.members);
        let mut folded: HashSet<String> = HashSet::new();
        snap.flows = self.fold_flows(std::mem::take(&mut snap.flows), &members, &mut folded);
        snap.peers = self.fold_peers(std::mem::take(&mut snap.peers), &members, &mut folded);
        snap.bursts = self.fold_bursts(std::mem::take(&mut snap.bursts), &members, &mut folded);
        for j in &mut snap.jobs {
            fold_job_peers(j, &members);
        }
        self.members = members;
        snap.peers_folded = folded.len() as u64;
    }

    /// Keeps the active members, drops those idle too long, and gives free slots to the
    /// busiest newcomers.
    fn update_members(&mut self, snap: &Readings) {
        // Activity this tick: bytes moved, plus RTT samples (~ one per acked segment) so that
        // peers seen only by sock_ops rank too.
        let mut activity: HashMap<String, u64> = HashMap::new();
        for f in &snap.flows {
            let before = self.prev_flows.get(&fkey(f)).map(|p| p.bytes);
            *activity.entry(f.peer.clone()).or_default() += Change::of(f.bytes, before).increase();
        }
        for p in &snap.peers {
            let before = self.prev_peers.get(&p.peer).map(|x| x.rtt.count);
            *activity.entry(p.peer.clone()).or_default() +=
                Change::of(p.rtt.count, before).increase() * 1500;
        }
        for (peer, a) in &activity {
            if *a > 0 {
                if let Some(last) = self.members.get_mut(peer) {
                    *last = self.tick;
                }
            }
        }
        let (tick, idle) = (self.tick, self.idle_ticks);
        self.members.retain(|_, last| tick - *last <= idle);
        let mut candidates: Vec<(&String, &u64)> = activity
            .iter()
            .filter(|(p, a)| **a > 0 && !self.members.contains_key(*p))
            .collect();
        candidates.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (peer, _) in candidates {
            if self.members.len() >= self.k {
                break;
            }
            self.members.insert(peer.clone(), self.tick);
        }
    }

    /// Flows: members' kept, the others' added to "other" per (interface, direction).
    fn fold_flows(
        &mut self,
        flows: Vec<FlowSeries>,
        members: &HashMap<String, u64>,
        folded: &mut HashSet<String>,
    ) -> Vec<FlowSeries> {
        let mut kept = Vec::with_capacity(flows.len());
        let mut prev_flows = HashMap::with_capacity(flows.len());
        for f in flows {
            let key = fkey(&f);
            if !members.contains_key(&f.peer) {
                folded.insert(f.peer.clone());
                let before = self.prev_flows.get(&key);
                let inc =
                    |now, of: fn(&FlowSeries) -> u64| Change::of(now, before.map(of)).increase();
                let o = self
                    .other_flows
                    .entry((f.iface.clone(), f.direction))
                    .or_insert_with(|| FlowSeries {
                        iface: f.iface.clone(),
                        direction: f.direction,
                        peer: OTHER.into(),
                        ..FlowSeries::default()
                    });
                o.bytes += inc(f.bytes, |b| b.bytes);
                o.packets += inc(f.packets, |b| b.packets);
                o.ce_packets += inc(f.ce_packets, |b| b.ce_packets);
                o.ect_packets += inc(f.ect_packets, |b| b.ect_packets);
            } else {
                kept.push(f.clone());
            }
            prev_flows.insert(key, f);
        }
        self.prev_flows = prev_flows;
        kept.extend(self.other_flows.values().cloned());
        kept
    }

    /// TCP peers: members' kept, the others merged into one "other" peer.
    fn fold_peers(
        &mut self,
        peers: Vec<PeerSeries>,
        members: &HashMap<String, u64>,
        folded: &mut HashSet<String>,
    ) -> Vec<PeerSeries> {
        let mut kept = Vec::with_capacity(peers.len());
        let mut prev_peers = HashMap::with_capacity(peers.len());
        let mut other_srtt: Option<f64> = None;
        let mut other_min: Option<f64> = None;
        let mut other_conns = 0;
        let (mut other_rq, mut other_sq) = (None, None);
        let mut any_other = false;
        for p in peers {
            if !members.contains_key(&p.peer) {
                any_other = true;
                folded.insert(p.peer.clone());
                let before = self.prev_peers.get(&p.peer);
                let o = self.other_peer.get_or_insert_with(|| PeerSeries {
                    peer: OTHER.into(),
                    ..PeerSeries::default()
                });
                o.rtt.merge(&since(&p.rtt, before.map(|b| &b.rtt)));
                o.retransmits +=
                    Change::of(p.retransmits, before.map(|b| b.retransmits)).increase();
                o.socket_sent_bytes +=
                    Change::of(p.socket_sent_bytes, before.map(|b| b.socket_sent_bytes)).increase();
                o.socket_received_bytes += Change::of(
                    p.socket_received_bytes,
                    before.map(|b| b.socket_received_bytes),
                )
                .increase();
                other_srtt = match (other_srtt, p.srtt_seconds) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
                other_min = match (other_min, p.min_rtt_seconds) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                other_conns += p.connections;
                other_rq = add_gauge(other_rq, p.receive_queue_bytes);
                other_sq = add_gauge(other_sq, p.send_queue_bytes);
            } else {
                kept.push(p.clone());
            }
            prev_peers.insert(p.peer.clone(), p);
        }
        self.prev_peers = prev_peers;
        if let Some(o) = &mut self.other_peer {
            o.srtt_seconds = other_srtt;
            o.min_rtt_seconds = other_min;
            o.connections = if any_other { other_conns } else { 0 };
            o.receive_queue_bytes = other_rq;
            o.send_queue_bytes = other_sq;
            kept.push(o.clone());
        }
        kept
    }

    /// Bursts: members' kept, the others added to "other" per (interface, direction).
    fn fold_bursts(
        &mut self,
        bursts: Vec<BurstSeries>,
        members: &HashMap<String, u64>,
        folded: &mut HashSet<String>,
    ) -> Vec<BurstSeries> {
        let mut kept = Vec::with_capacity(bursts.len());
        let mut prev_bursts = HashMap::with_capacity(bursts.len());
        for b in bursts {
            let key = bkey(&b);
            if !members.contains_key(&b.peer) {
                folded.insert(b.peer.clone());
                let before = self.prev_bursts.get(&key);
                let o = self
                    .other_bursts
                    .entry((b.iface.clone(), b.direction))
                    .or_insert_with(|| BurstSeries {
                        iface: b.iface.clone(),
                        direction: b.direction,
                        peer: OTHER.into(),
                        count: 0,
                        bytes: Histogram::default(),
                        duration: Histogram::default(),
                    });
                o.count += Change::of(b.count, before.map(|x| x.count)).increase();
                o.bytes.merge(&since(&b.bytes, before.map(|x| &x.bytes)));
                o.duration
                    .merge(&since(&b.duration, before.map(|x| &x.duration)));
            } else {
                kept.push(b.clone());
            }
            prev_bursts.insert(key, b);
        }
        self.prev_bursts = prev_bursts;
        kept.extend(self.other_bursts.values().cloned());
        kept
    }

    /// Drops "other" accumulators of an interface that went away.
    pub fn forget_interface(&mut self, iface: &str) {
        self.other_flows.retain(|(i, _), _| i != iface);
        self.other_bursts.retain(|(i, _), _| i != iface);
    }
}

/// A gauge summed over the peers folded into one: unknown only if it is for all of them.
fn add_gauge(sum: Option<u64>, v: Option<u64>) -> Option<u64> {
    match (sum, v) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(peer: &str, bytes: u64) -> FlowSeries {
        FlowSeries {
            iface: "eth0".into(),
            direction: "egress",
            peer: peer.into(),
            bytes,
            packets: bytes / 1000,
            ..FlowSeries::default()
        }
    }

    fn snap(flows: Vec<FlowSeries>) -> Readings {
        Readings {
            flows,
            ..Readings::default()
        }
    }

    fn bytes_of(s: &Readings, peer: &str) -> Option<u64> {
        s.flows.iter().find(|f| f.peer == peer).map(|f| f.bytes)
    }

    #[test]
    fn top_k_keeps_the_busiest_and_folds_the_rest_monotonically() {
        let mut f = PeerFolder::new(2, 3);
        let mut s = snap(vec![flow("a", 9000), flow("b", 5000), flow("c", 1000)]);
        f.apply(&mut s);
        assert_eq!(bytes_of(&s, "a"), Some(9000));
        assert_eq!(bytes_of(&s, "b"), Some(5000));
        assert_eq!(bytes_of(&s, "c"), None);
        assert_eq!(bytes_of(&s, OTHER), Some(1000));
        assert_eq!(s.peers_folded, 1);

        // c becomes the busiest, but a and b are still active: c stays folded.
        let mut s = snap(vec![flow("a", 9100), flow("b", 5100), flow("c", 50_000)]);
        f.apply(&mut s);
        assert_eq!(bytes_of(&s, "c"), None);
        assert_eq!(bytes_of(&s, OTHER), Some(50_000));

        // b goes idle for longer than idle_ticks: its slot goes to c.
        let mut last_other = 50_000;
        for i in 0..5 {
            let mut s = snap(vec![
                flow("a", 9200 + i),
                flow("b", 5100),
                flow("c", 60_000 + i),
            ]);
            f.apply(&mut s);
            let other = bytes_of(&s, OTHER).unwrap();
            assert!(other >= last_other, "other must not decrease");
            last_other = other;
        }
        let mut s = snap(vec![flow("a", 9300), flow("b", 5100), flow("c", 70_000)]);
        f.apply(&mut s);
        assert_eq!(bytes_of(&s, "c"), Some(70_000));
        assert_eq!(bytes_of(&s, "b"), None);
        assert!(bytes_of(&s, OTHER).unwrap() >= last_other);
    }

    #[test]
    fn a_jobs_peers_without_a_series_fold_into_its_other() {
        let mut f = PeerFolder::new(1, 3);
        let peer = |p: &str, rq| JobPeer {
            peer: p.into(),
            connections: 1,
            receive_queue_bytes: rq,
            send_queue_bytes: 0,
        };
        let mut s = snap(vec![flow("a", 9000), flow("c", 1000)]);
        s.jobs = vec![JobSeries {
            name: "llm".into(),
            peers: vec![peer("a", 1), peer("c", 2), peer("d", 4)],
            ..JobSeries::default()
        }];
        f.apply(&mut s);
        let o = JobPeer {
            peer: OTHER.into(),
            connections: 2,
            receive_queue_bytes: 6,
            send_queue_bytes: 0,
        };
        assert_eq!(s.jobs[0].peers, [peer("a", 1), o]);
    }

    #[test]
    fn a_folded_series_that_restarts_adds_what_it_holds_since() {
        let mut f = PeerFolder::new(1, 3);
        let mut s = snap(vec![flow("a", 9000), flow("c", 1000)]);
        f.apply(&mut s);
        assert_eq!(bytes_of(&s, OTHER), Some(1000));
        // c's series restarted (it came back after idling): its 300 bytes are new traffic.
        let mut s = snap(vec![flow("a", 9500), flow("c", 300)]);
        f.apply(&mut s);
        assert_eq!(bytes_of(&s, OTHER), Some(1300));
    }
}

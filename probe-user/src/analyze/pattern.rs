//! Naming the job's communication pattern from one host's view: how many peers carry the
//! job, whether each peer's bytes are one-way or both ways, whether a peer's two directions
//! run at once or one after the other (and which follows which closely), and whether the
//! peers move in step. Each pattern is scored against that evidence; the report gives the
//! scores, the evidence, and the best as the answer with its score as the confidence.
//!
//! What each pattern looks like from one of its hosts (S bytes per iteration):
//! - ring all-reduce: sends ~2S(N-1)/N to its successor while receiving as much from its
//!   predecessor, at once (two one-way peers; one peer both ways when N = 2);
//! - parameter server, the server: every worker pushes then pulls S, all in step (N-1
//!   two-way peers, receive then send); a worker: one two-way peer, send then receive soon;
//! - pipeline: activations one way, gradients back later (one two-way peer at either end of
//!   the pipeline, two in the middle, their directions in opposite order);
//! - tree / hierarchical all-reduce: children reduce into the host, the host into its parent,
//!   then the broadcast back down (three or more two-way peers, not all in the same order).
use serde::Serialize;

use super::timing::{Profile, PHASE_BINS};

#[derive(Clone, Debug, Serialize)]
pub struct PeerEvidence {
    pub peer: String,
    pub tx_bytes_per_iteration: f64,
    pub rx_bytes_per_iteration: f64,
    /// min/max of the two directions' bytes: 1 is both ways alike, 0 one-way.
    pub symmetry: f64,
    /// Overlap of the two directions' folded occupancy over the smaller one's (0..1).
    pub concurrency: f64,
    /// "send, then receive" or "receive, then send": which direction's activity comes
    /// first, by their circular centroids (a reply within half an iteration of its
    /// request); None for a one-way peer or directions centred together.
    pub order: Option<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Score {
    pub pattern: &'static str,
    pub score: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Pattern {
    /// ring, tree, parameter-server, pipeline, mixed or unknown.
    pub name: &'static str,
    /// The host's role where the pattern has roles (server, worker, first stage ...).
    pub role: Option<&'static str>,
    /// The best score (0..1).
    pub confidence: f64,
    pub scores: Vec<Score>,
    pub peers: Vec<PeerEvidence>,
    /// Sentences, one fact each.
    pub evidence: Vec<String>,
}

pub const RING: &str = "ring";
pub const TREE: &str = "tree";
pub const PS: &str = "parameter-server";
pub const PIPELINE: &str = "pipeline";
pub const MIXED: &str = "mixed";
/// Below this best score the answer is `mixed`.
const DECIDES: f64 = 0.5;

/// 0 at `lo`, 1 at `hi` (either order), linear between.
fn ramp(x: f64, lo: f64, hi: f64) -> f64 {
    if !x.is_finite() {
        return 0.0;
    }
    ((x - lo) / (hi - lo)).clamp(0.0, 1.0)
}

fn active(p: &Profile) -> Vec<bool> {
    super::timing::active(&p.occupancy)
}

/// Share of `a`'s active bins that are also active in `b`, over the smaller of the two.
fn co_active(a: &[bool], b: &[bool]) -> f64 {
    let both = a.iter().zip(b).filter(|(x, y)| **x && **y).count();
    let least = a
        .iter()
        .filter(|x| **x)
        .count()
        .min(b.iter().filter(|x| **x).count());
    if least == 0 {
        0.0
    } else {
        both as f64 / least as f64
    }
}

/// `a` with every active bin's neighbours within `k` bins active too (circularly).
fn widen(a: &[bool], k: usize) -> Vec<bool> {
    let n = a.len();
    (0..n)
        .map(|i| (0..=2 * k).any(|d| a[(i + n + d - k) % n]))
        .collect()
}

/// Circular centroid of a profile, in bins.
fn centroid(occ: &[f64]) -> f64 {
    let n = occ.len() as f64;
    let (mut x, mut y) = (0.0, 0.0);
    for (i, w) in occ.iter().enumerate() {
        let a = std::f64::consts::TAU * i as f64 / n;
        x += w * a.cos();
        y += w * a.sin();
    }
    y.atan2(x).rem_euclid(std::f64::consts::TAU) / std::f64::consts::TAU * n
}

/// Per peer of the job (by name), the evidence of its two directions, and when each
/// direction is active in the folded iteration (None for a direction without a shape).
#[allow(clippy::type_complexity)]
fn peer_evidence(
    profiles: &[Profile],
) -> (
    Vec<PeerEvidence>,
    Vec<Option<Vec<bool>>>,
    Vec<Option<Vec<bool>>>,
) {
    let mut peers: Vec<PeerEvidence> = Vec::new();
    let mut names: Vec<&str> = profiles.iter().map(|p| p.peer.as_str()).collect();
    names.sort();
    names.dedup();
    let mut tx_act: Vec<Option<Vec<bool>>> = Vec::new();
    let mut rx_act: Vec<Option<Vec<bool>>> = Vec::new();
    for peer in names {
        let tx = profiles.iter().find(|p| p.peer == peer && p.tx);
        let rx = profiles.iter().find(|p| p.peer == peer && !p.tx);
        let tb = tx.map_or(0.0, |p| p.bytes_per_iteration);
        let rb = rx.map_or(0.0, |p| p.bytes_per_iteration);
        let symmetry = if tb.max(rb) > 0.0 {
            tb.min(rb) / tb.max(rb)
        } else {
            0.0
        };
        let (concurrency, order) = match (tx.filter(|p| p.shaped), rx.filter(|p| p.shaped)) {
            (Some(t), Some(r)) => direction_overlap(t, r, symmetry),
            _ => (0.0, None),
        };
        let ta = tx.filter(|p| p.shaped).map(active);
        let ra = rx.filter(|p| p.shaped).map(active);
        peers.push(PeerEvidence {
            peer: peer.to_owned(),
            tx_bytes_per_iteration: tb,
            rx_bytes_per_iteration: rb,
            symmetry,
            concurrency,
            order,
        });
        tx_act.push(ta);
        rx_act.push(ra);
    }
    (peers, tx_act, rx_act)
}

/// How the two directions of a peer sit in the iteration: their overlap (0..1) and, for
/// a two-way peer, which comes first.
fn direction_overlap(t: &Profile, r: &Profile, symmetry: f64) -> (f64, Option<&'static str>) {
    let (ct, cr) = (centroid(&t.occupancy), centroid(&r.occupancy));
    // Where the send sits after the receive, in bins, in (-n/2, n/2].
    let n = PHASE_BINS as f64;
    let mut gap = (ct - cr).rem_euclid(n);
    if gap > n / 2.0 {
        gap -= n;
    }
    // Overlap of the two occupancies over the smaller one's mass: a phase
    // right after another touches it only at the edge.
    let both: f64 = t
        .occupancy
        .iter()
        .zip(&r.occupancy)
        .map(|(a, b)| a.min(*b))
        .sum();
    let least = t
        .occupancy
        .iter()
        .sum::<f64>()
        .min(r.occupancy.iter().sum::<f64>());
    let c = if least > 0.0 {
        (both / least).clamp(0.0, 1.0)
    } else {
        0.0
    };
    // The order shows in where the two directions' activity sits, even when
    // a request's ACKs and its reply merged into one long burst (then the
    // overlap says "at once" but the reply still comes later).
    let order = (symmetry > 0.3 && gap.abs() >= 2.0).then_some(if gap > 0.0 {
        "receive, then send"
    } else {
        "send, then receive"
    });
    (c, order)
}

/// Ring: two one-way peers in opposite directions, as many bytes each, at once; or, with
/// two ranks, one peer both ways at once.
fn ring_score(
    peers: &[PeerEvidence],
    tx_act: &[Option<Vec<bool>>],
    rx_act: &[Option<Vec<bool>>],
    evidence: &mut Vec<String>,
) -> f64 {
    let n = peers.len();
    if n == 2 {
        let (a, b) = (&peers[0], &peers[1]);
        let one_way = |p: &PeerEvidence| ramp(p.symmetry, 0.4, 0.1);
        let a_sends = a.tx_bytes_per_iteration > a.rx_bytes_per_iteration;
        let b_sends = b.tx_bytes_per_iteration > b.rx_bytes_per_iteration;
        let opposite = if a_sends != b_sends { 1.0 } else { 0.0 };
        let (sa, sb) = (
            a.tx_bytes_per_iteration.max(a.rx_bytes_per_iteration),
            b.tx_bytes_per_iteration.max(b.rx_bytes_per_iteration),
        );
        let balance = ramp(sa.min(sb) / sa.max(sb), 0.4, 0.8);
        // The sending to one overlaps the receiving from the other.
        let (send, recv) = if a_sends {
            (&tx_act[0], &rx_act[1])
        } else {
            (&tx_act[1], &rx_act[0])
        };
        let at_once = match (send, recv) {
            (Some(s), Some(r)) => co_active(s, r),
            _ => 0.0,
        };
        if opposite > 0.0 {
            evidence.push(format!(
                "one peer is sent to and the other received from, {:.0}% of the time at once",
                100.0 * at_once
            ));
        }
        one_way(a).min(one_way(b)) * opposite * balance * ramp(at_once, 0.3, 0.7)
    } else if n == 1 {
        sym(&peers[0]) * ramp(peers[0].concurrency, 0.3, 0.7)
    } else {
        0.0
    }
}

/// In step: the share of the peers whose receiving (widened by 3% of the iteration each
/// way) covers the phase where most of them receive.
fn in_step(peers: usize, rx_act: &[Option<Vec<bool>>]) -> f64 {
    let n = peers;
    if n >= 2 {
        let acts: Vec<Vec<bool>> = rx_act.iter().flatten().map(|a| widen(a, 3)).collect();
        let most = (0..PHASE_BINS)
            .map(|b| acts.iter().filter(|a| a[b]).count())
            .max()
            .unwrap_or(0);
        if acts.is_empty() {
            0.0
        } else {
            most as f64 / acts.len() as f64
        }
    } else {
        0.0
    }
}

/// The evidence's first line: the job's peers and how each talks.
fn describe(peers: &[PeerEvidence]) -> String {
    let n = peers.len();
    format!(
        "{n} peer(s) carry the job's data; {}",
        peers
            .iter()
            .map(|p| format!(
                "{}: {} ({:.0}% symmetric, directions {:.0}% concurrent{})",
                p.peer,
                if p.symmetry >= 0.5 {
                    "both ways"
                } else if p.tx_bytes_per_iteration > p.rx_bytes_per_iteration {
                    "sends"
                } else {
                    "receives"
                },
                100.0 * p.symmetry,
                100.0 * p.concurrency,
                p.order.map(|o| format!(", {o}")).unwrap_or_default()
            ))
            .collect::<Vec<_>>()
            .join("; ")
    )
}

/// Symmetric: as many bytes both ways.
fn sym(p: &PeerEvidence) -> f64 {
    ramp(p.symmetry, 0.3, 0.7)
}

/// Sequential: one direction after the other.
fn seq(p: &PeerEvidence) -> f64 {
    ramp(p.concurrency, 0.7, 0.4)
}

fn mean(v: Vec<f64>) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn recv_first(p: &PeerEvidence) -> f64 {
    if p.order == Some("receive, then send") {
        1.0
    } else {
        0.0
    }
}

fn send_first(p: &PeerEvidence) -> f64 {
    if p.order == Some("send, then receive") {
        1.0
    } else {
        0.0
    }
}

/// The scores of the patterns whose peers talk both ways.
struct TwoWay {
    ps_server: f64,
    ps_worker: f64,
    pipeline_end: f64,
    pipeline_mid: f64,
    tree: f64,
}

fn two_way_scores(peers: &[PeerEvidence], in_step: f64) -> TwoWay {
    let n = peers.len();
    // Over the peers whose order could be told (a direction that did not fold into a shape
    // has none), at least two of them.
    let ordered: Vec<&PeerEvidence> = peers.iter().filter(|p| p.order.is_some()).collect();
    let ps_server = if n >= 2 && ordered.len() >= 2 {
        mean(peers.iter().map(sym).collect())
            * mean(ordered.iter().map(|p| recv_first(p)).collect())
            * ramp(in_step, 0.3, 0.7)
    } else {
        0.0
    };
    // One two-way peer, one direction after the other: a parameter-server worker (send,
    // then the reply soon) or an end of a pipeline (the reply after the other stages).
    let single = if n == 1 {
        sym(&peers[0]) * seq(&peers[0])
    } else {
        0.0
    };
    let ps_worker = single * if n == 1 { send_first(&peers[0]) } else { 0.0 };
    let pipeline_end = single * if n == 1 { recv_first(&peers[0]) } else { 0.0 };
    // Middle of a pipeline: two two-way peers, one in each order, not in step.
    let pipeline_mid = if n == 2 {
        let orders = recv_first(&peers[0]) * send_first(&peers[1])
            + send_first(&peers[0]) * recv_first(&peers[1]);
        sym(&peers[0])
            * sym(&peers[1])
            * seq(&peers[0])
            * seq(&peers[1])
            * orders
            * ramp(in_step, 0.7, 0.3)
    } else {
        0.0
    };
    // Tree: three or more two-way peers, not all in the same order.
    let tree = if n >= 3 {
        let r = peers.iter().filter(|p| recv_first(p) > 0.0).count();
        let s = peers.iter().filter(|p| send_first(p) > 0.0).count();
        let mixed_orders = if r > 0 && s > 0 && r + s == n {
            1.0
        } else {
            0.0
        };
        mean(peers.iter().map(|p| sym(p) * seq(p)).collect()) * mixed_orders
    } else {
        0.0
    };
    TwoWay {
        ps_server,
        ps_worker,
        pipeline_end,
        pipeline_mid,
        tree,
    }
}

pub fn classify(profiles: &[Profile]) -> Pattern {
    let (peers, tx_act, rx_act) = peer_evidence(profiles);
    let n = peers.len();
    let mut evidence = vec![describe(&peers)];
    let ring = ring_score(&peers, &tx_act, &rx_act, &mut evidence);

    // Parameter server, server side: every peer both ways, receive then send, in step.
    let in_step = in_step(n, &rx_act);
    if n >= 2 {
        evidence.push(format!(
            "the peers' receiving is {:.0}% in step",
            100.0 * in_step
        ));
    }
    let TwoWay {
        ps_server,
        ps_worker,
        pipeline_end,
        pipeline_mid,
        tree,
    } = two_way_scores(&peers, in_step);

    let mut scores = vec![
        Score {
            pattern: RING,
            score: ring,
        },
        Score {
            pattern: PS,
            score: ps_server.max(ps_worker),
        },
        Score {
            pattern: PIPELINE,
            score: pipeline_end.max(pipeline_mid),
        },
        Score {
            pattern: TREE,
            score: tree,
        },
    ];
    scores.sort_by(|a, b| b.score.total_cmp(&a.score));
    let best = &scores[0];
    let (name, role) = if n == 0 {
        evidence.push("no periodic job traffic: no pattern".into());
        ("unknown", None)
    } else if best.score < DECIDES {
        (MIXED, None)
    } else {
        let role = match best.pattern {
            PS if ps_server >= ps_worker => Some("server"),
            PS => Some("worker"),
            PIPELINE if pipeline_mid > pipeline_end => Some("middle stage"),
            PIPELINE => Some("first or last stage"),
            TREE => Some("inner node"),
            _ => None,
        };
        (best.pattern, role)
    };
    Pattern {
        name,
        role,
        confidence: if n == 0 { 0.0 } else { best.score },
        scores,
        peers,
        evidence,
    }
}

//! Busy spans: a tick's burst events of each peer (every flow, both directions, every
//! interface) merged into the stretches the peer was busy, idle gaps shorter than
//! [`MERGE_GAP_US`] closed. A training host's peer ends hundreds of bursts a second (one per
//! 1 ms idle gap of each flow: ACK clocking splits a transfer), but is busy a few times an
//! iteration; its spans are what its burst timing is (the duty cycle, the idle gaps, the
//! iteration period) at a hundredth of the rows. They are what a job corpus keeps of the
//! burst events (`probe features --compact --spans`), so that features can be computed
//! again from a compact run. The merge is a function of the tick's events alone (no state
//! across ticks): spans of consecutive ticks may overlap or abut, as bursts do. Times are
//! whole microseconds (the kernel's nanoseconds, rounded): exact in any file, and ten
//! thousand times finer than the merge.
use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::TickBursts;

/// Idle gaps shorter than this (microseconds) are closed: the period finder's bin (10 ms)
/// and under a tenth of the shortest iteration the lab runs (100 ms of compute), so that
/// gaps inside one all-reduce step vanish and the idle time between steps and iterations
/// stays.
pub const MERGE_GAP_US: i64 = 10_000;

/// One busy span of one peer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Span {
    /// Time of the tick whose events it merges (`BurstEvent::tick_unix`).
    pub tick_unix: f64,
    /// The remote address, as the `peer` label spells it.
    pub peer: Arc<str>,
    /// First packet of its first burst, microseconds since the Unix epoch.
    pub start_us: i64,
    /// To the last packet of its last burst, microseconds.
    pub duration_us: i64,
    /// Bursts merged into it.
    pub bursts: u64,
    /// Their bytes, both directions.
    pub bytes: u64,
    /// Of which sent by this host.
    pub egress_bytes: u64,
    /// The largest of its bursts, bytes.
    pub max_burst_bytes: u64,
}

impl Span {
    pub fn end_us(&self) -> i64 {
        self.start_us + self.duration_us
    }
}

/// Seconds since the epoch as whole microseconds.
fn micros(s: f64) -> i64 {
    (s * 1e6).round() as i64
}

/// The busy spans of a tick's events: per peer, in the order of the peer's first event,
/// each peer's spans in start order. Events not in start order (a hand-made recording) are
/// sorted first; events with a NaN start are left out.
pub fn spans(bursts: &TickBursts) -> Vec<Span> {
    // Label index -> peer slot, peers in first-seen order.
    let mut slot_of_label: Vec<Option<u32>> = vec![None; bursts.labels.len()];
    let mut peers: Vec<Arc<str>> = Vec::new();
    let mut slot_of_peer: FxHashMap<&str, u32> = FxHashMap::default();
    for (i, l) in bursts.labels.iter().enumerate() {
        let s = *slot_of_peer.entry(&l.peer).or_insert_with(|| {
            peers.push(l.peer.clone());
            peers.len() as u32 - 1
        });
        slot_of_label[i] = Some(s);
    }
    let mut order: Vec<usize> = (0..bursts.events.len())
        .filter(|&i| bursts.events[i].start_unix.is_finite())
        .collect();
    if !bursts.sorted {
        order.sort_by(|&a, &b| {
            bursts.events[a]
                .start_unix
                .total_cmp(&bursts.events[b].start_unix)
        });
    }
    // Per peer, the span being merged and its end (its duration is set when it closes).
    let mut open: Vec<Option<(Span, i64)>> = vec![None; peers.len()];
    let mut done: Vec<Vec<Span>> = vec![Vec::new(); peers.len()];
    for i in order {
        let ev = &bursts.events[i];
        let label = &bursts.labels[ev.label as usize];
        let Some(p) = slot_of_label[ev.label as usize] else {
            continue;
        };
        let p = p as usize;
        let egress = if &*label.direction == "egress" {
            ev.bytes
        } else {
            0
        };
        let start = micros(ev.start_unix);
        let end = micros(ev.start_unix + ev.duration_s.max(0.0)).max(start);
        match &mut open[p] {
            Some((s, e)) if start <= *e + MERGE_GAP_US => {
                *e = (*e).max(end);
                s.bursts += 1;
                s.bytes += ev.bytes;
                s.egress_bytes += egress;
                s.max_burst_bytes = s.max_burst_bytes.max(ev.bytes);
            }
            slot => {
                if let Some(s) = slot.take() {
                    done[p].push(close(s));
                }
                *slot = Some((
                    Span {
                        tick_unix: bursts.tick_unix,
                        peer: peers[p].clone(),
                        start_us: start,
                        duration_us: 0,
                        bursts: 1,
                        bytes: ev.bytes,
                        egress_bytes: egress,
                        max_burst_bytes: ev.bytes,
                    },
                    end,
                ));
            }
        }
    }
    let mut out = Vec::new();
    for (mut d, o) in done.into_iter().zip(open) {
        d.extend(o.map(close));
        out.append(&mut d);
    }
    out
}

fn close((mut s, end): (Span, i64)) -> Span {
    s.duration_us = end - s.start_us;
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::BurstEvent;

    fn ev(peer: &str, dir: &str, start: f64, dur: f64, bytes: u64) -> BurstEvent {
        BurstEvent {
            iface: "eth0".into(),
            direction: dir.into(),
            peer: peer.into(),
            start_unix: start,
            duration_s: dur,
            bytes,
            packets: 1,
            tick_unix: 100.0,
        }
    }

    #[test]
    fn bursts_closer_than_the_gap_merge_per_peer_across_directions() {
        let a = "10.0.0.2";
        let b = "10.0.0.3";
        let events = [
            ev(a, "egress", 10.000, 0.002, 100),
            ev(b, "ingress", 10.001, 0.001, 7),
            // 5 ms after a's first ended: merged, from the other direction.
            ev(a, "ingress", 10.007, 0.003, 300),
            // Inside the span so far.
            ev(a, "egress", 10.008, 0.001, 50),
            // 20 ms of idle: a new span.
            ev(a, "egress", 10.030, 0.000, 10),
        ];
        let t = TickBursts::from_events(&events);
        assert!(t.sorted);
        let s = spans(&t);
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!(&*s[0].peer, a);
        assert_eq!((s[0].start_us, s[0].end_us()), (10_000_000, 10_010_000));
        assert_eq!(
            (
                s[0].bursts,
                s[0].bytes,
                s[0].egress_bytes,
                s[0].max_burst_bytes
            ),
            (3, 450, 150, 300)
        );
        assert_eq!(
            (s[1].start_us, s[1].bytes, s[1].bursts),
            (10_030_000, 10, 1)
        );
        assert_eq!(&*s[2].peer, b);
        assert_eq!((s[2].bytes, s[2].egress_bytes), (7, 0));
        assert!(s.iter().all(|x| x.tick_unix == 100.0));
        // Every burst's bytes are in exactly one span.
        let total: u64 = events.iter().map(|e| e.bytes).sum();
        assert_eq!(s.iter().map(|x| x.bytes).sum::<u64>(), total);
    }

    #[test]
    fn order_of_the_events_does_not_matter() {
        let mut events: Vec<BurstEvent> = (0..200)
            .map(|i| {
                let peer = ["10.0.0.2", "10.0.0.3"][i % 2];
                // Starts on an uneven grid: some gaps under 10 ms, some over.
                let start = 50.0 + (i * i % 97) as f64 * 0.004;
                ev(peer, "egress", start, (i % 3) as f64 * 0.001, i as u64)
            })
            .collect();
        let sorted = {
            let mut v = events.clone();
            v.sort_by(|a, b| a.start_unix.total_cmp(&b.start_unix));
            spans(&TickBursts::from_events(&v))
        };
        events.reverse();
        let t = TickBursts::from_events(&events);
        assert!(!t.sorted);
        let mut unsorted = spans(&t);
        // Peers come in first-seen order: compare per peer.
        unsorted.sort_by(|a, b| (&a.peer, a.start_us).cmp(&(&b.peer, b.start_us)));
        let mut expected = sorted;
        expected.sort_by(|a, b| (&a.peer, a.start_us).cmp(&(&b.peer, b.start_us)));
        // Bytes merged in another order sum the same; the spans are the same.
        assert_eq!(unsorted, expected);
        assert!(
            expected.len() > 2 && expected.len() < 100,
            "{}",
            expected.len()
        );
        // No two spans of a peer are within the merge gap of each other.
        for w in expected.windows(2) {
            if w[0].peer == w[1].peer {
                assert!(w[1].start_us > w[0].end_us() + MERGE_GAP_US);
            }
        }
    }

    #[test]
    fn no_events_no_spans() {
        assert!(spans(&TickBursts::default()).is_empty());
    }
}

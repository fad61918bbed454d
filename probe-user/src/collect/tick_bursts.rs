//! A tick's burst events as the daemon carries them: each (interface, direction, peer) label
//! once, and the events as 40-byte rows that point at their label. A busy tick has tens of
//! thousands of events of a few peers; as `BurstEvent`s (three shared labels each) they
//! cost three reference counts up and down per event and ~90 bytes each. The JSON API
//! spells every event out in full, as `BurstEvent` does, and a recording stores
//! `BurstEvent`s: `from_events` turns those back into this form for the feature stage, so
//! live and offline features go through one path.
use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde::{ser::SerializeSeq, Deserialize, Serialize, Serializer};

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

/// The labels events share.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BurstLabel {
    pub iface: Arc<str>,
    /// "egress" or "ingress".
    pub direction: Arc<str>,
    /// The remote address, as the `peer` label spells it.
    pub peer: Arc<str>,
}

/// One event: `BurstEvent` without its labels.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TickBurst {
    /// Index of its label in `TickBursts::labels`.
    pub label: u32,
    pub start_unix: f64,
    pub duration_s: f64,
    pub bytes: u64,
    pub packets: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct TickBursts {
    /// In the order of their first event, each used by at least one.
    pub labels: Vec<BurstLabel>,
    /// In start order.
    pub events: Vec<TickBurst>,
    /// Time of the tick that delivered them (`BurstEvent::tick_unix`).
    pub tick_unix: f64,
    /// `events` are in start order as `in_start_order` reads it: the collect stage sorts
    /// them, a replayed tick is checked. The feature stage then takes only the newest
    /// bursts of a busy peer; checking it there read every event of the tick (~7 us per
    /// entity per tick at 3,750 events per peer).
    pub sorted: bool,
}

impl TickBursts {
    pub fn label(&self, ev: &TickBurst) -> &BurstLabel {
        &self.labels[ev.label as usize]
    }

    /// The events spelled out, as the API and a recording have them.
    pub fn to_events(&self) -> Vec<BurstEvent> {
        self.events
            .iter()
            .map(|ev| {
                let l = self.label(ev);
                BurstEvent {
                    iface: l.iface.clone(),
                    direction: l.direction.clone(),
                    peer: l.peer.clone(),
                    start_unix: ev.start_unix,
                    duration_s: ev.duration_s,
                    bytes: ev.bytes,
                    packets: ev.packets,
                    tick_unix: self.tick_unix,
                }
            })
            .collect()
    }

    /// Whether events are in start order as `Bursts::extend` takes it (`total_cmp`), with
    /// no NaN start: then each peer's are too, and only its newest can stay in its ring.
    /// Anything else (a hand-made recording) takes the feature stage's whole path, which
    /// sorts each peer's. NaNs sort first or last, so the ends tell.
    pub fn in_start_order(events: &[TickBurst]) -> bool {
        let nan = |e: Option<&TickBurst>| e.is_some_and(|e| e.start_unix.is_nan());
        !nan(events.first())
            && !nan(events.last())
            && events
                .windows(2)
                .all(|w| w[0].start_unix.total_cmp(&w[1].start_unix).is_le())
    }

    /// One tick's events (all of one `tick_unix`), in their order, with equal labels
    /// shared.
    pub fn from_events(src: &[BurstEvent]) -> Self {
        let mut index: FxHashMap<(&str, &str, &str), u32> = FxHashMap::default();
        let mut labels = Vec::new();
        let events: Vec<TickBurst> = src
            .iter()
            .map(|ev| {
                let label = *index
                    .entry((&ev.iface, &ev.direction, &ev.peer))
                    .or_insert_with(|| {
                        labels.push(BurstLabel {
                            iface: ev.iface.clone(),
                            direction: ev.direction.clone(),
                            peer: ev.peer.clone(),
                        });
                        labels.len() as u32 - 1
                    });
                TickBurst {
                    label,
                    start_unix: ev.start_unix,
                    duration_s: ev.duration_s,
                    bytes: ev.bytes,
                    packets: ev.packets,
                }
            })
            .collect();
        Self {
            sorted: Self::in_start_order(&events),
            labels,
            events,
            tick_unix: src.first().map_or(0.0, |e| e.tick_unix),
        }
    }
}

/// `BurstEvent`'s JSON, borrowed.
#[derive(Serialize)]
struct EventJson<'a> {
    iface: &'a str,
    direction: &'a str,
    peer: &'a str,
    start_unix: f64,
    duration_s: f64,
    bytes: u64,
    packets: u64,
    tick_unix: f64,
}

impl Serialize for TickBursts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.events.len()))?;
        for ev in &self.events {
            let l = self.label(ev);
            seq.serialize_element(&EventJson {
                iface: &l.iface,
                direction: &l.direction,
                peer: &l.peer,
                start_unix: ev.start_unix,
                duration_s: ev.duration_s,
                bytes: ev.bytes,
                packets: ev.packets,
                tick_unix: self.tick_unix,
            })?;
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(iface: &str, peer: &str, start: f64) -> BurstEvent {
        BurstEvent {
            iface: iface.into(),
            direction: "egress".into(),
            peer: peer.into(),
            start_unix: start,
            duration_s: 0.25,
            bytes: 1500,
            packets: 1,
            tick_unix: 7.0,
        }
    }

    #[test]
    fn shares_equal_labels_and_spells_events_out_as_they_were() {
        let events = vec![
            ev("eth0", "10.0.0.2", 1.0),
            ev("eth0", "10.0.0.3", 2.0),
            ev("eth0", "10.0.0.2", 3.0),
            ev("eth1", "10.0.0.2", 4.0),
        ];
        let t = TickBursts::from_events(&events);
        assert_eq!(t.labels.len(), 3, "{t:?}");
        assert_eq!(t.events[0].label, t.events[2].label);
        assert_eq!(t.tick_unix, 7.0);
        assert_eq!(t.to_events(), events);
        // The JSON is BurstEvent's, field for field.
        assert_eq!(
            serde_json::to_value(&t).unwrap(),
            serde_json::to_value(&events).unwrap()
        );
        assert!(TickBursts::from_events(&[]).events.is_empty());
    }
}

//! Observations: one typed row per entity (peer, interface, qdisc, RDMA port, drop reason,
//! host) per tick, in base units. The one input of the feature stage, live and offline:
//! the daemon derives them from consecutive snapshots, `probe record` stores exactly these
//! rows, and `probe features` reads them back.
mod derive;
mod observation;
pub mod spans;

pub use crate::collect::tick_bursts::{BurstEvent, BurstLabel, TickBurst, TickBursts};
pub use derive::derive;
pub use observation::*;

use crate::collect::readings::Readings;

/// The observe stage: this tick's observations from this tick's readings and the ones before
/// them.
#[derive(Default)]
pub struct Observe {
    prev: Option<Readings>,
}

impl Observe {
    /// The observations of every entity; none on the first tick (no interval to measure
    /// over). `now.burst_events` is lent, not kept.
    pub fn observe(&mut self, now: &mut Readings) -> Vec<Observation> {
        // derive reads counters, never burst events: keeping a copy of a busy tick's tens of
        // thousands of events (three shared labels each) cost a copy and a drop every tick.
        let events = std::mem::take(&mut now.burst_events);
        let kept = now.clone();
        now.burst_events = events;
        let rows = match &self.prev {
            Some(prev) => derive(prev, &kept),
            None => Vec::new(),
        };
        self.prev = Some(kept);
        rows
    }
}

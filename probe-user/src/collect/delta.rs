//! Monotonic totals from kernel counters that can restart. An LRU map may evict an entry and
//! recreate it from zero; summing per-tick deltas (and taking a recreated entry's value as
//! its delta) keeps every exported counter monotonic.
//!
//! A series that has not moved for [`SERIES_IDLE`] is dropped, even while its kernel entry
//! stays (the per-peer histogram maps hold 16,384 peers and only evict under pressure):
//! without that, every peer ever seen would keep a series, and the daemon's memory and tick
//! would grow with peer churn for as long as it runs. An entry that moves again starts its
//! series from that move, which Prometheus reads as a counter reset; one that does not move
//! does not bring its series back.
use std::{
    hash::Hash,
    time::{Duration, Instant},
};

use rustc_hash::FxHashMap as HashMap;

use crate::counter;

/// How long a series outlives its last change; the fold stage keeps an idle peer's top-K
/// slot exactly as long (it reads this constant).
pub const SERIES_IDLE: Duration = Duration::from_secs(600);

/// When each series last moved (DeltaTotals) or had a kernel entry (the flow collector,
/// which deletes idle flows from the kernel map itself).
pub struct LastSeen<A> {
    seen: HashMap<A, Instant>,
    /// The time of the last `expire`: every series touched until the next one gets it.
    now: Instant,
}

impl<A> Default for LastSeen<A> {
    fn default() -> Self {
        Self {
            seen: HashMap::default(),
            now: Instant::now(),
        }
    }
}

impl<A: Eq + Hash + Clone> LastSeen<A> {
    /// `series` moved (or had an entry) this tick.
    pub fn touch(&mut self, series: &A) {
        match self.seen.get_mut(series) {
            Some(t) => *t = self.now,
            None => {
                self.seen.insert(series.clone(), self.now);
            }
        }
    }

    /// Ends a tick at `now`: the series not touched for longer than [`SERIES_IDLE`], which
    /// the caller drops.
    pub fn expire(&mut self, now: Instant) -> Vec<A> {
        self.now = now;
        let mut gone = Vec::new();
        self.seen.retain(|a, t| {
            let keep = now.saturating_duration_since(*t) <= SERIES_IDLE;
            if !keep {
                gone.push(a.clone());
            }
            keep
        });
        gone
    }

    pub fn forget(&mut self, keep: impl Fn(&A) -> bool) {
        self.seen.retain(|a, _| keep(a));
    }
}

/// Kernel entries keyed by `K` (the map key), totals keyed by `A` (the exported series).
/// Values are flat vectors of counters of a fixed length per use.
pub struct DeltaTotals<K, A> {
    prev: HashMap<K, Vec<u64>>,
    seen: HashMap<K, Vec<u64>>,
    totals: HashMap<A, Vec<u64>>,
    last_seen: LastSeen<A>,
}

impl<K: Eq + Hash, A: Eq + Hash> Default for DeltaTotals<K, A> {
    fn default() -> Self {
        Self {
            prev: HashMap::default(),
            seen: HashMap::default(),
            totals: HashMap::default(),
            last_seen: LastSeen::default(),
        }
    }
}

impl<K: Eq + Hash + Clone, A: Eq + Hash + Clone> DeltaTotals<K, A> {
    /// Adds entry `key`'s counters, read this tick, to series `series`.
    pub fn add(&mut self, key: K, series: A, now: Vec<u64>) {
        let before = self.prev.get(&key).map(Vec::as_slice);
        let delta = || counter::increases(&now, before);
        // An entry that did not move neither keeps its series alive nor brings it back.
        if delta().any(|d| d > 0) {
            self.last_seen.touch(&series);
            let t = self
                .totals
                .entry(series)
                .or_insert_with(|| vec![0; now.len()]);
            if t.len() < now.len() {
                t.resize(now.len(), 0);
            }
            for (v, d) in t.iter_mut().zip(delta()) {
                *v += d;
            }
        }
        self.seen.insert(key, now);
    }

    /// Adds counts that are deltas already (events', not a kernel counter's reading) to
    /// series `series`.
    pub fn add_delta(&mut self, series: A, delta: &[u64]) {
        self.last_seen.touch(&series);
        let t = self.totals.entry(series).or_default();
        if t.len() < delta.len() {
            t.resize(delta.len(), 0);
        }
        for (t, d) in t.iter_mut().zip(delta) {
            *t += d;
        }
    }

    /// Ends a tick: entries not seen this tick are forgotten, and series without an entry
    /// for [`SERIES_IDLE`] are dropped.
    pub fn finish(&mut self) {
        self.finish_at(Instant::now());
    }

    fn finish_at(&mut self, now: Instant) {
        self.prev = std::mem::take(&mut self.seen);
        for a in self.last_seen.expire(now) {
            self.totals.remove(&a);
        }
    }

    pub fn totals(&self) -> &HashMap<A, Vec<u64>> {
        &self.totals
    }

    /// The kernel entries read at the last tick.
    pub fn entries(&self) -> impl Iterator<Item = &K> {
        self.prev.keys()
    }

    pub fn retain(&mut self, keep: impl Fn(&A) -> bool) {
        self.totals.retain(|a, _| keep(a));
        self.last_seen.forget(keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_across_recreation() {
        let mut d: DeltaTotals<u32, &str> = DeltaTotals::default();
        d.add(1, "s", vec![10, 1]);
        d.finish();
        d.add(1, "s", vec![15, 1]);
        d.finish();
        assert_eq!(d.totals()["s"], vec![15, 1]);
        d.add(1, "s", vec![3, 0]); // recreated
        d.finish();
        assert_eq!(d.totals()["s"], vec![18, 1]);
        // Two kernel entries feeding one series.
        d.add(2, "s", vec![2, 2]);
        d.finish();
        assert_eq!(d.totals()["s"], vec![20, 3]);
    }

    #[test]
    fn deltas_and_kernel_readings_add_up_in_one_series() {
        let t0 = Instant::now();
        let mut d: DeltaTotals<u32, &str> = DeltaTotals::default();
        d.add_delta("s", &[3, 0]);
        d.add(1, "s", vec![10, 1]);
        d.finish_at(t0);
        assert_eq!(d.totals()["s"], vec![13, 1]);
        d.add_delta("s", &[0, 4]);
        d.add(1, "s", vec![12, 1]);
        d.finish_at(t0 + Duration::from_secs(1));
        assert_eq!(d.totals()["s"], vec![15, 5]);
        // A series fed by deltas alone expires like any other once they stop.
        d.add_delta("e", &[1]);
        d.finish_at(t0 + Duration::from_secs(2));
        d.finish_at(t0 + Duration::from_secs(3) + SERIES_IDLE);
        assert_eq!(d.totals().get("e"), None);
    }

    #[test]
    fn a_series_that_stops_moving_is_dropped_after_the_idle_time() {
        let t0 = Instant::now();
        let mut d: DeltaTotals<u32, &str> = DeltaTotals::default();
        d.add(1, "a", vec![5]);
        d.add(2, "b", vec![7]);
        d.add(3, "c", vec![1]);
        d.finish_at(t0);
        // a moves every second; b's entry stays but never moves; c's entry is gone.
        for s in 1..=SERIES_IDLE.as_secs() + 2 {
            d.add(1, "a", vec![5 + s]);
            d.add(2, "b", vec![7]);
            d.finish_at(t0 + Duration::from_secs(s));
        }
        let a_total = 5 + SERIES_IDLE.as_secs() + 2;
        assert_eq!(d.totals().get("a"), Some(&vec![a_total]));
        assert_eq!(d.totals().get("b"), None, "b did not move for SERIES_IDLE");
        assert_eq!(d.totals().get("c"), None, "c had no entry for SERIES_IDLE");
        // b's unchanged entry does not bring it back; its next move starts it again.
        d.add(2, "b", vec![7]);
        d.finish_at(t0 + SERIES_IDLE * 2);
        assert_eq!(d.totals().get("b"), None);
        d.add(2, "b", vec![9]);
        d.finish_at(t0 + SERIES_IDLE * 2 + Duration::from_secs(1));
        assert_eq!(d.totals().get("b"), Some(&vec![2]));
        // c's key comes back: a new series, from what the new entry holds.
        d.add(3, "c", vec![4]);
        d.finish_at(t0 + SERIES_IDLE * 3);
        assert_eq!(d.totals().get("c"), Some(&vec![4]));
    }
}

//! Monotonic totals from kernel counters that can restart. An LRU map may evict an entry and
//! recreate it from zero; summing per-tick deltas (and taking a recreated entry's value as
//! its delta) keeps every exported counter monotonic.
//!
//! A series whose kernel entries are all gone (evicted, or deleted as idle) is dropped after
//! [`SERIES_IDLE`]: without that, every peer ever seen would keep a series, and the daemon's
//! memory and tick would grow with peer churn for as long as it runs. A series that comes
//! back later starts from zero, which Prometheus reads as a counter reset.
use std::{
    hash::Hash,
    time::{Duration, Instant},
};

use rustc_hash::FxHashMap as HashMap;

/// How long a series outlives its last kernel entry (the fold stage keeps a top-K slot as
/// long: `fold::PEER_IDLE`).
pub const SERIES_IDLE: Duration = Duration::from_secs(600);

/// When each series last had a kernel entry.
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
    /// `series` had a kernel entry this tick.
    pub fn touch(&mut self, series: &A) {
        match self.seen.get_mut(series) {
            Some(t) => *t = self.now,
            None => {
                self.seen.insert(series.clone(), self.now);
            }
        }
    }

    /// Ends a tick at `now`: the series without a kernel entry for longer than
    /// [`SERIES_IDLE`], which the caller drops.
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
        let before = self.prev.get(&key);
        // Any counter going down means the entry was recreated: count it from zero.
        let reset =
            before.is_none_or(|b| b.len() != now.len() || now.iter().zip(b).any(|(n, b)| n < b));
        self.last_seen.touch(&series);
        let t = self
            .totals
            .entry(series)
            .or_insert_with(|| vec![0; now.len()]);
        if t.len() < now.len() {
            t.resize(now.len(), 0);
        }
        for (i, n) in now.iter().enumerate() {
            t[i] += if reset {
                *n
            } else {
                n - before.map_or(0, |b| b[i])
            };
        }
        self.seen.insert(key, now);
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
    fn a_series_without_entries_is_dropped_after_the_idle_time() {
        let t0 = Instant::now();
        let mut d: DeltaTotals<u32, &str> = DeltaTotals::default();
        d.add(1, "a", vec![5]);
        d.add(2, "b", vec![7]);
        d.finish_at(t0);
        // Only a's entry stays in the map, for longer than the idle time.
        for s in 1..=SERIES_IDLE.as_secs() + 2 {
            d.add(1, "a", vec![5 + s]);
            d.finish_at(t0 + Duration::from_secs(s));
        }
        assert_eq!(
            d.totals().get("a"),
            Some(&vec![5 + SERIES_IDLE.as_secs() + 2])
        );
        assert_eq!(
            d.totals().get("b"),
            None,
            "b had no entry for longer than SERIES_IDLE"
        );
        // b's key comes back: a new series, from what the entry holds.
        d.add(2, "b", vec![3]);
        d.finish_at(t0 + SERIES_IDLE * 2);
        assert_eq!(d.totals().get("b"), Some(&vec![3]));
    }
}

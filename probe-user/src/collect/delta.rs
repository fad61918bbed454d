//! Monotonic totals from kernel counters that can restart. An LRU map may evict an entry and
//! recreate it from zero; summing per-tick deltas (and taking a recreated entry's value as
//! its delta) keeps every exported counter monotonic.
use std::hash::Hash;

use rustc_hash::FxHashMap as HashMap;

/// Kernel entries keyed by `K` (the map key), totals keyed by `A` (the exported series).
/// Values are flat vectors of counters of a fixed length per use.
pub struct DeltaTotals<K, A> {
    prev: HashMap<K, Vec<u64>>,
    seen: HashMap<K, Vec<u64>>,
    totals: HashMap<A, Vec<u64>>,
}

impl<K: Eq + Hash, A: Eq + Hash> Default for DeltaTotals<K, A> {
    fn default() -> Self {
        Self {
            prev: HashMap::default(),
            seen: HashMap::default(),
            totals: HashMap::default(),
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

    /// Ends a tick: entries not seen this tick are forgotten.
    pub fn finish(&mut self) {
        self.prev = std::mem::take(&mut self.seen);
    }

    pub fn totals(&self) -> &HashMap<A, Vec<u64>> {
        &self.totals
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&A) -> bool) {
        self.totals.retain(|a, _| keep(a));
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
}

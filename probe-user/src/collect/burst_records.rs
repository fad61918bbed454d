//! The burst ends read in one tick, as the ring's drain files them: each (interface,
//! direction, peer) key once, with its peer histograms, and the records as 40-byte rows that
//! point at their key. One hash lookup per record serves both the histograms and the
//! naming of the events: the tick names each key once and the rows by index. (The drain
//! folded each record by its key, and the tick looked every record's key up a second time to
//! name it: tens of thousands of lookups a tick at 10,000 flows.)
use probe_ebpf::{log2_bucket, BurstEnd, BurstHist, BurstKey, BurstSlot, SERIES_SLOTS_DEFAULT};
use rustc_hash::FxHashMap;

/// Entries of the (CPU, series slot) cache, 16 KiB: the default series slots of up to four
/// CPUs each have their own entry; beyond that, slots share entries and a miss hashes.
const SLOT_CACHE: usize = 4 * SERIES_SLOTS_DEFAULT as usize;

/// A record without its key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Row {
    pub start_ns: u64,
    pub duration_ns: u64,
    pub bytes: u64,
    pub packets: u64,
    /// Index of its key in `BurstRecords::keys`.
    pub key: u32,
}

/// Rows kept in full (read order) up to a tick's `cap`; past it, per key only the newest
/// `per_key` by start (the later read first among equal starts). That is all the feature
/// stage uses of a tick: each peer's newest `events_per_peer` and the start of the one
/// before, which lie among the newest `events_per_peer + 1` of each of the peer's keys. So a
/// busy host's surplus costs the API and recordings events, never the features.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    pub cap: usize,
    pub per_key: usize,
}

/// The rows read past a tick's cap, in read order, and per key the (start, place) of the
/// newest of them so far: the candidates to keep.
#[derive(Default)]
struct Tails {
    rows: Vec<Row>,
    by_key: Vec<KeyTail>,
    /// Not kept as events this tick: older than their key's newest (`thinned`), or read
    /// while the tails held `cap` rows (`lost`).
    thinned: u64,
    lost: u64,
}

#[derive(Default)]
struct KeyTail {
    /// (start, index in `Tails::rows`) of at most 2 x `per_key` rows: its newest `per_key`
    /// are among them.
    newest: Vec<(u64, u32)>,
    /// Rows older than this were pushed out by `per_key` newer ones: not kept.
    floor: (u64, u32),
}

impl Tails {
    /// A row goes into `rows` unless its key already has `per_key` newer ones; a key's
    /// candidates are cut to its newest `per_key` once they are twice that (an O(n)
    /// selection over 16-byte pairs, never over rows). Rows come in about the order they
    /// end, so most go in: the cut keeps the work per row small. (Selecting among whole
    /// rows, or keeping each key's newest sorted, cost 67-110 ns a row past the cap;
    /// `thinning_cost`.)
    fn offer(&mut self, row: Row, limit: Limit) {
        if self.rows.len() >= limit.cap {
            self.lost += 1;
            return;
        }
        let k = row.key as usize;
        if self.by_key.len() <= k {
            self.by_key.resize_with(k + 1, KeyTail::default);
        }
        let tail = &mut self.by_key[k];
        // Its place in the read order: a later read of the same start is the newer.
        let at = (row.start_ns, self.rows.len() as u32);
        if at < tail.floor || limit.per_key == 0 {
            self.thinned += 1;
            return;
        }
        tail.newest.push(at);
        self.rows.push(row);
        if tail.newest.len() >= 2 * limit.per_key {
            self.thinned += tail.cut(limit.per_key) as u64;
        }
    }

    /// What is kept, in read order.
    fn into_rows(mut self, per_key: usize, out: &mut Vec<Row>) -> (u64, u64) {
        let mut kept: Vec<u32> = Vec::new();
        for t in &mut self.by_key {
            self.thinned += t.cut(per_key) as u64;
            kept.extend(t.newest.iter().map(|&(_, i)| i));
        }
        kept.sort_unstable();
        out.extend(kept.into_iter().map(|i| self.rows[i as usize]));
        (self.thinned, self.lost)
    }
}

impl KeyTail {
    /// Keeps the newest `n` candidates; returns how many went.
    fn cut(&mut self, n: usize) -> usize {
        let Some(cut) = self.newest.len().checked_sub(n).filter(|&c| c > 0) else {
            return 0;
        };
        self.newest.select_nth_unstable(cut);
        self.newest.drain(..cut);
        self.floor = self
            .floor
            .max(self.newest.iter().copied().min().unwrap_or_default());
        cut
    }
}

#[derive(Default)]
pub struct BurstRecords {
    ids: FxHashMap<BurstKey, u32>,
    /// In the order of their first record.
    keys: Vec<BurstKey>,
    /// Per key: the folded histograms of its ring records (`count` 0 for a key that only has
    /// records handed over by `push`).
    folds: Vec<BurstHist>,
    /// In the order they were read.
    rows: Vec<Row>,
    /// 1 + the key index of a ring record by where its CPU counted its series (the record's
    /// `series_slot`), empty until a record has one; checked against the key, since a slot
    /// can change series. It files most records without hashing their keys (hashing was
    /// most of the drain's cost).
    by_slot: Vec<u32>,
    /// None: every record kept is a row.
    limit: Option<Limit>,
    tails: Tails,
    /// Of this tick, once `finish`ed: records not kept as events (see `Tails`).
    thinned: u64,
    lost: u64,
}

fn key_of(r: &BurstEnd) -> BurstKey {
    BurstKey {
        addr: r.addr,
        ifindex: r.ifindex,
        family: r.family,
        direction: r.direction,
        _pad: 0,
    }
}

impl BurstRecords {
    /// Records kept as rows up to `limit.cap`, and past it as `Limit` says.
    pub fn limited(limit: Limit) -> Self {
        Self {
            limit: Some(limit),
            ..Self::default()
        }
    }

    /// Ring records, each folded and kept, as the drain files them.
    pub fn folded(records: &[BurstEnd]) -> Self {
        let mut t = Self::default();
        for r in records {
            t.fold(r, true);
        }
        t
    }

    fn id(&mut self, r: &BurstEnd) -> u32 {
        let Self {
            ids, keys, folds, ..
        } = self;
        *ids.entry(key_of(r)).or_insert_with(|| {
            keys.push(key_of(r));
            folds.push(BurstHist::default());
            keys.len() as u32 - 1
        })
    }

    fn row(r: &BurstEnd, key: u32) -> Row {
        Row {
            start_ns: r.start_ns,
            duration_ns: r.duration_ns,
            bytes: r.bytes,
            packets: r.packets,
            key,
        }
    }

    /// The key index of a record that CPU `cpu` wrote into its ring.
    fn id_in_ring(&mut self, cpu: usize, s: &BurstSlot) -> u32 {
        if s.series_slot == 0 {
            return self.id(&s.end);
        }
        if self.by_slot.is_empty() {
            self.by_slot = vec![0; SLOT_CACHE];
        }
        let at = (cpu as u32)
            .wrapping_mul(SERIES_SLOTS_DEFAULT)
            .wrapping_add(s.series_slot) as usize
            & (SLOT_CACHE - 1);
        if let Some(id) = self.by_slot[at].checked_sub(1) {
            if self.keys[id as usize] == key_of(&s.end) {
                return id;
            }
        }
        let id = self.id(&s.end);
        self.by_slot[at] = id + 1;
        id
    }

    /// Adds a record read from CPU `cpu`'s ring to its peer's histograms, and keeps it as
    /// an event if `keep`: `fold`, filed by the slot's hint.
    pub fn fold_slot(&mut self, cpu: usize, s: &BurstSlot, keep: bool) {
        let id = self.id_in_ring(cpu, s);
        self.fold_id(&s.end, id, keep);
    }

    /// Adds a ring record to its peer's histograms, and keeps it as an event if `keep`.
    pub fn fold(&mut self, r: &BurstEnd, keep: bool) {
        let id = self.id(r);
        self.fold_id(r, id, keep);
    }

    fn fold_id(&mut self, r: &BurstEnd, id: u32, keep: bool) {
        let h = &mut self.folds[id as usize];
        h.size_buckets[log2_bucket(r.bytes)] += 1;
        h.duration_buckets[log2_bucket(r.duration_ns)] += 1;
        // Wrapping, as the kernel's own folds into PEER_BURSTS: a record is whatever the
        // ring held (the burst_events fuzz target feeds sums past u64::MAX).
        h.count += 1;
        h.bytes = h.bytes.wrapping_add(r.bytes);
        h.duration_ns = h.duration_ns.wrapping_add(r.duration_ns);
        if !keep {
            return;
        }
        let row = Self::row(r, id);
        match self.limit {
            Some(limit) if self.rows.len() >= limit.cap => self.tails.offer(row, limit),
            _ => self.rows.push(row),
        }
    }

    /// Ends the tick's reading: the newest rows past the cap join the rows, after the rest
    /// (they were read after them).
    pub fn finish(&mut self) {
        let Some(limit) = self.limit else {
            return;
        };
        let (thinned, lost) =
            std::mem::take(&mut self.tails).into_rows(limit.per_key, &mut self.rows);
        self.thinned += thinned;
        self.lost += lost;
    }

    /// Records of this tick folded into the histograms but not kept as events: past the
    /// cap and older than their key's newest (thinned), or past what the tails hold (lost).
    pub fn thinned(&self) -> u64 {
        self.thinned
    }

    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Keeps an event without folding it (a burst the flow collector ended, which no ring
    /// record reports).
    pub fn push(&mut self, r: &BurstEnd) {
        let id = self.id(r);
        self.rows.push(Self::row(r, id));
    }

    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    pub fn key(&self, row: &Row) -> &BurstKey {
        &self.keys[row.key as usize]
    }

    pub fn keys(&self) -> &[BurstKey] {
        &self.keys
    }

    /// Each key's histograms of the ring records folded this tick.
    pub fn folds(&self) -> impl Iterator<Item = (&BurstKey, &BurstHist)> {
        self.keys
            .iter()
            .zip(&self.folds)
            .filter(|(_, h)| h.count > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use probe_ebpf::{AF_INET, DIR_EGRESS};

    fn rec(peer: u8, bytes: u64) -> BurstEnd {
        BurstEnd {
            start_ns: 5,
            duration_ns: 3_000,
            bytes,
            packets: 2,
            addr: [u32::from_ne_bytes([10, 0, 0, peer]), 0, 0, 0],
            ifindex: 2,
            family: AF_INET,
            direction: DIR_EGRESS,
            _pad: 0,
        }
    }

    #[test]
    fn one_key_per_peer_and_folds_only_of_folded_records() {
        let mut t = BurstRecords::default();
        t.fold(&rec(1, 1_000), true);
        t.fold(&rec(2, 10), false);
        t.fold(&rec(1, 3_000), true);
        t.push(&rec(3, 7));
        assert_eq!(t.keys().len(), 3);
        let keys: Vec<u32> = t.rows().iter().map(|r| r.key).collect();
        assert_eq!(keys, [0, 0, 2], "the unkept record has no row");
        assert_eq!(t.key(&t.rows()[2]).addr, rec(3, 7).addr);
        let folds: Vec<(u32, u64, u64)> = t
            .folds()
            .map(|(k, h)| (k.addr[0], h.count, h.bytes))
            .collect();
        assert_eq!(
            folds,
            [(rec(1, 0).addr[0], 2, 4_000), (rec(2, 0).addr[0], 1, 10)],
            "peer 3 was only pushed: no histogram"
        );
        let h = t.folds().next().unwrap().1;
        assert_eq!(h.size_buckets[log2_bucket(1_000)], 1);
        assert_eq!(h.duration_buckets[log2_bucket(3_000)], 2);
    }

    /// Past the cap, each key keeps its newest by start (the later read among equal starts),
    /// after the rows before the cap and in the order read; what the tails cannot hold is
    /// lost; every record is folded either way.
    #[test]
    fn past_the_cap_each_key_keeps_its_newest() {
        let at = |peer: u8, start_ns: u64, bytes: u64| BurstEnd {
            start_ns,
            ..rec(peer, bytes)
        };
        let mut t = BurstRecords::limited(Limit { cap: 6, per_key: 2 });
        let before = [
            at(1, 1, 1),
            at(2, 2, 2),
            at(1, 3, 3),
            at(3, 4, 4),
            at(1, 60, 5),
            at(2, 1, 6),
        ];
        let past = [
            at(1, 50, 10),
            at(1, 10, 11),
            at(2, 5, 12),
            at(1, 30, 13),
            at(1, 30, 14),
            at(1, 20, 15),
        ];
        for r in before.iter().chain(&past) {
            t.fold(r, true);
        }
        t.finish();
        let bytes: Vec<u64> = t.rows().iter().map(|r| r.bytes).collect();
        assert_eq!(bytes, [1, 2, 3, 4, 5, 6, 10, 12, 14]);
        assert_eq!((t.thinned(), t.lost()), (3, 0));
        assert_eq!(t.folds().map(|(_, h)| h.count).sum::<u64>(), 12);

        // Past the cap the tails hold as many rows as the cap (the drain reads no more than
        // twice the cap a tick): a fifth record finds them full.
        let mut t = BurstRecords::limited(Limit { cap: 2, per_key: 1 });
        for r in [
            at(1, 1, 1),
            at(2, 1, 2),
            at(1, 9, 3),
            at(2, 9, 4),
            at(3, 9, 5),
        ] {
            t.fold(&r, true);
        }
        t.finish();
        let bytes: Vec<u64> = t.rows().iter().map(|r| r.bytes).collect();
        assert_eq!(bytes, [1, 2, 3, 4]);
        assert_eq!((t.thinned(), t.lost()), (0, 1));
        assert_eq!(t.folds().map(|(_, h)| h.count).sum::<u64>(), 5);
    }

    /// Filing by the kernel's slot hint gives what filing by the key gives, whatever the
    /// hints are: right, shared by several keys (a slot that changed series), absent, or
    /// from CPUs whose cache entries collide (CPU 4's with CPU 0's).
    #[test]
    fn filing_by_slot_hint_matches_filing_by_key() {
        let slots: Vec<(usize, BurstSlot)> = (0..4_000u32)
            .map(|i| {
                let peer = (i * 7 % 13) as u8;
                let series_slot = match i % 4 {
                    0 => 0,
                    1 => u32::from(peer) + 1,
                    2 => 3,
                    _ => i * 31 % 1024 + 1,
                };
                let end = rec(peer, u64::from(i));
                (
                    i as usize % 5,
                    BurstSlot {
                        end,
                        series_slot,
                        _pad: 0,
                    },
                )
            })
            .collect();
        let (mut by_key, mut by_slot) = (BurstRecords::default(), BurstRecords::default());
        for (i, (cpu, s)) in slots.iter().enumerate() {
            let keep = i % 3 != 0;
            by_key.fold(&s.end, keep);
            by_slot.fold_slot(*cpu, s, keep);
        }
        assert_eq!(by_slot.keys().len(), 13);
        assert_eq!(by_key.keys(), by_slot.keys());
        assert_eq!(by_key.rows(), by_slot.rows());
        assert!(by_key.folds().eq(by_slot.folds()));
    }

    /// Found by the burst_events fuzz target: a ring record is any bytes, and two huge ones
    /// overflowed the fold's sums.
    #[test]
    fn folds_of_garbage_wrap() {
        let mut t = BurstRecords::default();
        let r = BurstEnd {
            duration_ns: u64::MAX,
            ..rec(1, u64::MAX)
        };
        t.fold(&r, false);
        t.fold(&r, false);
        let h = t.folds().next().unwrap().1;
        assert_eq!(
            (h.count, h.bytes, h.duration_ns),
            (2, u64::MAX - 1, u64::MAX - 1)
        );
    }
}

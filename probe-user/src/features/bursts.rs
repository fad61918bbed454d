//! A peer's recent bursts (one kernel event per ended burst, of any of its flows and either
//! direction), kept in a fixed ring sorted by start, and the burst statistics of a window:
//! rate, sizes, duty cycle and the idle gaps between bursts. Overlapping bursts of
//! different flows merge into one busy interval for the duty cycle and the gaps.
use std::collections::VecDeque;

use super::schema::BURST_STATS;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Burst {
    pub start: f64,
    pub end: f64,
    pub bytes: f64,
}

pub struct Bursts {
    cap: usize,
    /// Sorted by start.
    events: VecDeque<Burst>,
    /// Every burst that started after this time is in `events` (older ones were dropped for
    /// room, or came before the peer was first seen).
    covered_since: f64,
    /// The longest burst kept (an upper bound): a window's bursts start after its start
    /// minus this, so a window reads only the tail of the ring.
    longest: f64,
}

impl Bursts {
    pub fn new(cap: usize, since: f64) -> Self {
        Self {
            cap,
            events: VecDeque::with_capacity(cap),
            covered_since: since,
            longest: 0.0,
        }
    }

    /// Adds one ended burst.
    pub fn add(&mut self, b: Burst) {
        self.extend(&[b], &mut Vec::new());
    }

    /// Adds ended bursts, given in start order (a tick's events of the peer). Events come
    /// in end order, so a long burst can start before the last one kept: the kept ones
    /// that start after the first new one are taken out and merged back with the new ones
    /// in start order, one pass. (Inserting each late burst where it belongs, a scan and a
    /// shift of the ring each, was 10% of the daemon's CPU at 30,000 bursts a second.)
    /// `scratch` holds the kept ones meanwhile; the engine passes one for all its peers.
    pub fn extend(&mut self, bursts: &[Burst], scratch: &mut Vec<Burst>) {
        // A tick's events are in start order; anything else (a hand-made recording) is
        // sorted here first.
        if !bursts
            .windows(2)
            .all(|w| w[0].start.total_cmp(&w[1].start).is_le())
        {
            let mut sorted = bursts.to_vec();
            sorted.sort_by(|a, b| a.start.total_cmp(&b.start));
            return self.extend(&sorted, scratch);
        }
        let Some(first) = bursts.first() else {
            return;
        };
        // A kept burst with the same start as a new one stays before it.
        let cut = self.events.partition_point(|e| e.start <= first.start);
        if cut == self.events.len() {
            return self.append(bursts);
        }
        let tail = scratch;
        tail.clear();
        tail.extend(self.events.drain(cut..));
        let (mut i, mut j) = (0, 0);
        while i < tail.len() || j < bursts.len() {
            if j == bursts.len() || (i < tail.len() && tail[i].start <= bursts[j].start) {
                self.push(tail[i]);
                i += 1;
            } else {
                self.push(bursts[j]);
                j += 1;
            }
        }
    }

    /// `extend` with a batch in start order of which only the newest bursts are given:
    /// `tail`, the last `cap` or more, and `left_out`, the start of the newest one not given
    /// (None: the whole batch is given). It leaves the state the whole batch leaves (the same
    /// bursts, coverage and windows; `longest` may be lower, still a bound of what is kept):
    /// the tail's `cap` bursts all start at `left_out` or later and come after the left-out
    /// ones and after the kept ones that start no later (a kept burst stays before a new one
    /// of the same start), so all of those are pushed out, the last of them starting at
    /// `left_out` or later. Raising the coverage to `left_out` first is what pushing the
    /// left-out ones in and out again would do; the rest is the merge of the tail as before.
    /// A busy peer ends thousands of bursts a tick (3,750 at the bench's 1,000 flows x 1,000
    /// msg/s), of which a ring of 512 keeps the newest.
    pub fn extend_tail(&mut self, left_out: Option<f64>, tail: &[Burst], scratch: &mut Vec<Burst>) {
        if let Some(at) = left_out {
            debug_assert!(tail.len() >= self.cap, "{} of {}", tail.len(), self.cap);
            debug_assert!(tail.first().is_some_and(|b| at <= b.start));
            self.covered_since = self.covered_since.max(at);
        }
        self.extend(tail, scratch);
    }

    /// Appends bursts in start order that start no earlier than the last kept one: what
    /// `push` one by one leaves, without pushing the ones the same batch would push out
    /// again (a busy peer ends more bursts in a tick than the ring holds).
    fn append(&mut self, bursts: &[Burst]) {
        // Those before covered_since are dropped by push; they can only be the first ones.
        let skip = bursts.partition_point(|b| b.start < self.covered_since);
        let bursts = &bursts[skip..];
        let evicted = (self.events.len() + bursts.len()).saturating_sub(self.cap);
        if evicted > self.events.len() {
            // Every kept burst and the batch's first ones go: the last of them bounds what
            // is covered. `longest` stays an upper bound of what is kept.
            let gone = evicted - self.events.len();
            self.covered_since = self.covered_since.max(bursts[gone - 1].start);
            self.events.clear();
            for b in &bursts[gone..] {
                self.longest = self.longest.max(b.end - b.start);
                self.events.push_back(*b);
            }
        } else {
            for b in bursts {
                self.push(*b);
            }
        }
    }

    /// Appends a burst that starts no earlier than the last kept one, making room by
    /// dropping the oldest when the ring is full.
    fn push(&mut self, b: Burst) {
        if b.start < self.covered_since {
            return;
        }
        if self.events.len() == self.cap {
            if let Some(old) = self.events.pop_front() {
                self.covered_since = self.covered_since.max(old.start);
            }
            if b.start < self.covered_since {
                return;
            }
        }
        self.longest = self.longest.max(b.end - b.start);
        self.events.push_back(b);
    }

    pub fn covered_since(&self) -> f64 {
        self.covered_since
    }

    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = &Burst> {
        self.events.iter()
    }

    /// The bursts that may overlap (from, ..]: those that started after `from` minus the
    /// longest burst.
    pub fn since(&self, from: f64) -> impl Iterator<Item = &Burst> {
        let first = self
            .events
            .partition_point(|b| b.start < from - self.longest);
        self.events.range(first..).filter(move |b| b.end > from)
    }

    pub fn bytes(&self) -> usize {
        self.events.capacity() * std::mem::size_of::<Burst>()
    }

    /// Where the statistics of the window (now - w, now] start: the window's start, or the
    /// start of the history when that is later. Windows that start at the same point have
    /// the same statistics.
    pub fn window_start(&self, now: f64, w: f64) -> f64 {
        (now - w).max(self.covered_since)
    }

    /// Writes the burst statistics of the window (now - w, now] into `out`, in the order of
    /// `BURST_STATS`; NaN where not known (no history yet, no burst, too few gaps).
    pub fn window(&self, now: f64, w: f64, out: &mut [f64]) {
        debug_assert_eq!(out.len(), BURST_STATS.len());
        out.fill(f64::NAN);
        let from = self.window_start(now, w);
        let span = now - from;
        if span <= 0.0 {
            return;
        }
        let (mut count, mut sum, mut max) = (0.0, 0.0, f64::NEG_INFINITY);
        let (mut busy, mut gaps, mut gap_sum, mut gap_sq) = (0.0, 0.0, 0.0, 0.0);
        let mut cur: Option<(f64, f64)> = None;
        for b in self
            .events
            .iter()
            .filter(|b| b.end > from && b.start <= now)
        {
            if b.start > from {
                count += 1.0;
                sum += b.bytes;
                max = f64::max(max, b.bytes);
            }
            let (s, e) = (b.start.max(from), b.end.min(now));
            cur = match cur {
                Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
                Some((cs, ce)) => {
                    busy += ce - cs;
                    let g = s - ce;
                    gaps += 1.0;
                    gap_sum += g;
                    gap_sq += g * g;
                    Some((s, e))
                }
                None => Some((s, e)),
            };
        }
        if let Some((cs, ce)) = cur {
            busy += ce - cs;
        }
        out[0] = count / span;
        if count > 0.0 {
            out[1] = sum / count;
            out[2] = max;
        }
        out[3] = (busy / span).clamp(0.0, 1.0);
        if gaps > 0.0 {
            let mean = gap_sum / gaps;
            out[4] = mean;
            if gaps >= 2.0 && mean > 0.0 {
                let var = (gap_sq / gaps - mean * mean).max(0.0);
                out[5] = var.sqrt() / mean;
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small seeded generator (splitmix64): the property tests see the same cases on
    /// every run.
    pub(crate) struct Rng(pub u64);

    impl Rng {
        pub fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        pub fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        /// In [0, 1).
        pub fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// Two rings hold the same bursts, coverage and statistics to the bit: windows of
    /// several lengths at several times, and what `since` reads (which `longest` bounds).
    pub(crate) fn assert_same(a: &Bursts, b: &Bursts, now: f64, what: &str) {
        let bits = |x: &Bursts| -> Vec<[u64; 3]> {
            x.iter()
                .map(|b| [b.start.to_bits(), b.end.to_bits(), b.bytes.to_bits()])
                .collect()
        };
        assert_eq!(bits(a), bits(b), "{what}: bursts");
        assert_eq!(
            a.covered_since().to_bits(),
            b.covered_since().to_bits(),
            "{what}: covered since"
        );
        for x in [a, b] {
            assert!(
                x.iter().all(|b| b.end - b.start <= x.longest),
                "{what}: longest {} is not a bound",
                x.longest
            );
        }
        for t in [now, now - 0.3, now - 1.0, now + 0.5] {
            for w in [0.05, 0.5, 1.0, 3.0, 30.0] {
                let (mut x, mut y) = ([0.0; 6], [0.0; 6]);
                a.window(t, w, &mut x);
                b.window(t, w, &mut y);
                assert_eq!(
                    x.map(f64::to_bits),
                    y.map(f64::to_bits),
                    "{what}: window {w} at {t}"
                );
            }
            let since = |x: &Bursts, from: f64| -> Vec<u64> {
                x.since(from).map(|b| b.start.to_bits()).collect()
            };
            for from in [t - 0.2, t - 2.0, t - 10.0] {
                assert_eq!(since(a, from), since(b, from), "{what}: since {from}");
            }
        }
    }

    /// A tick's batch of `n` bursts in start order: mostly of the last second, some late
    /// (started long before: before what is kept, or before what is covered), many starting
    /// together (a grid of 1/32 s), some of no duration and some long. `bytes` numbers them,
    /// so that bursts of the same start are told apart.
    pub(crate) fn batch(rng: &mut Rng, now: f64, n: usize, id: &mut f64) -> Vec<Burst> {
        let mut v: Vec<Burst> = (0..n)
            .map(|_| {
                let age = match rng.below(10) {
                    0 => 1.0 + rng.unit() * 5.0,
                    1 => 1.0,
                    _ => rng.unit(),
                };
                let start = ((now - age) * 32.0).floor() / 32.0;
                let dur = match rng.below(4) {
                    0 => 0.0,
                    1 => rng.unit() * 2.0,
                    _ => rng.unit() * 0.01,
                };
                *id += 1.0;
                Burst {
                    start,
                    end: start + dur,
                    bytes: *id,
                }
            })
            .collect();
        v.sort_by(|a, b| a.start.total_cmp(&b.start));
        v
    }

    /// Given only the newest `cap` (or a few more) bursts of each batch and the start of the
    /// last one left out, a ring ends in the state the whole batches leave: over many
    /// random ticks, with equal starts, late bursts, bursts before the coverage, rings of 1
    /// to 64 and batches from none to 20 times the ring.
    #[test]
    fn the_newest_of_a_batch_leave_what_the_whole_batch_leaves() {
        let (mut truncated, mut late) = (0, 0);
        for seed in 0..6 {
            let mut rng = Rng(seed);
            for cap in [1, 2, 3, 16, 64] {
                let since = 999.0 + rng.unit();
                let (mut whole, mut newest) = (Bursts::new(cap, since), Bursts::new(cap, since));
                let (mut s1, mut s2) = (Vec::new(), Vec::new());
                let mut id = 0.0;
                for t in 0..150 {
                    let now = 1000.0 + t as f64;
                    let n = match rng.below(6) {
                        0 => 0,
                        1 => cap * (2 + rng.below(19) as usize),
                        _ => rng.below(2 * cap as u64 + 3) as usize,
                    };
                    let batch = batch(&mut rng, now, n, &mut id);
                    let last_kept = whole.iter().last().map(|b| b.start);
                    if batch
                        .first()
                        .zip(last_kept)
                        .is_some_and(|(b, k)| b.start < k)
                    {
                        late += 1;
                    }
                    whole.extend(&batch, &mut s1);
                    let keep = cap + rng.below(3) as usize;
                    if n > keep {
                        truncated += 1;
                        newest.extend_tail(
                            Some(batch[n - keep - 1].start),
                            &batch[n - keep..],
                            &mut s2,
                        );
                    } else {
                        newest.extend_tail(None, &batch, &mut s2);
                    }
                    assert_same(
                        &whole,
                        &newest,
                        now,
                        &format!("seed {seed}, ring {cap}, tick {t}"),
                    );
                }
            }
        }
        assert!(
            truncated > 1000 && late > 1000,
            "{truncated} truncated, {late} late"
        );
    }

    /// A batch larger than the ring, in order after what is kept, leaves what adding its
    /// bursts one by one leaves: the same bursts, the same coverage, the same windows.
    #[test]
    fn a_batch_larger_than_the_ring_is_as_if_added_one_by_one() {
        let burst = |i: usize| Burst {
            start: 10.0 + i as f64 * 0.01,
            end: 10.0 + i as f64 * 0.01 + 0.002 * (i % 5) as f64,
            bytes: (100 + i) as f64,
        };
        // Some before the history starts (dropped), then three ticks of 40, 10 and 70.
        let (mut batched, mut single) = (Bursts::new(32, 10.05), Bursts::new(32, 10.05));
        let mut i = 0;
        for n in [40, 10, 70] {
            let batch: Vec<Burst> = (i..i + n).map(burst).collect();
            i += n;
            batched.extend(&batch, &mut Vec::new());
            for b in &batch {
                single.add(*b);
            }
            assert_eq!(batched.covered_since(), single.covered_since());
            assert!(batched.iter().eq(single.iter()));
            let now = 10.0 + i as f64 * 0.01;
            for w in [0.1, 0.5, 5.0] {
                let (mut a, mut b) = ([0.0; 6], [0.0; 6]);
                batched.window(now, w, &mut a);
                single.window(now, w, &mut b);
                assert_eq!(a.map(f64::to_bits), b.map(f64::to_bits));
            }
        }
        assert_eq!(batched.iter().count(), 32);
    }

    fn train(period: f64, on: f64, n: usize) -> Bursts {
        let mut b = Bursts::new(512, 0.0);
        for i in 0..n {
            let s = 1.0 + i as f64 * period;
            b.add(Burst {
                start: s,
                end: s + on,
                bytes: 1000.0 * (1 + i % 2) as f64,
            });
        }
        b
    }

    #[test]
    fn a_regular_train_has_its_rate_duty_cycle_and_steady_gaps() {
        // 100 ms on every 250 ms for 40 s.
        let b = train(0.25, 0.1, 160);
        let mut out = [0.0; 6];
        b.window(41.0, 30.0, &mut out);
        assert!((out[0] - 4.0).abs() < 0.05, "rate {}", out[0]);
        assert!((out[1] - 1500.0).abs() < 10.0);
        assert_eq!(out[2], 2000.0);
        assert!((out[3] - 0.4).abs() < 0.01, "duty {}", out[3]);
        assert!((out[4] - 0.15).abs() < 1e-9, "gap {}", out[4]);
        assert!(out[5] < 1e-6, "cv {}", out[5]);
    }

    #[test]
    fn overlapping_bursts_of_two_flows_merge() {
        let mut b = Bursts::new(16, 0.0);
        b.add(Burst {
            start: 1.0,
            end: 2.0,
            bytes: 1.0,
        });
        b.add(Burst {
            start: 1.5,
            end: 2.5,
            bytes: 1.0,
        });
        b.add(Burst {
            start: 3.0,
            end: 3.5,
            bytes: 1.0,
        });
        let mut out = [0.0; 6];
        b.window(4.0, 4.0, &mut out);
        assert!((out[3] - 2.0 / 4.0).abs() < 1e-12, "duty {}", out[3]);
        assert_eq!(out[4], 0.5);
    }

    #[test]
    fn a_full_ring_drops_the_oldest_and_says_so() {
        let mut b = Bursts::new(16, 0.0);
        for i in 0..100 {
            b.add(Burst {
                start: i as f64,
                end: i as f64 + 0.5,
                bytes: 1.0,
            });
        }
        assert_eq!(b.iter().count(), 16);
        assert_eq!(b.covered_since(), 83.0);
        // The window is cut to what is covered: the rate stays right.
        let mut out = [0.0; 6];
        b.window(100.0, 30.0, &mut out);
        assert!((out[0] - 1.0).abs() < 0.07, "rate {}", out[0]);
        // Late events that start before what is covered are ignored; in order otherwise.
        b.add(Burst {
            start: 50.0,
            end: 99.0,
            bytes: 1.0,
        });
        b.add(Burst {
            start: 98.2,
            end: 98.3,
            bytes: 1.0,
        });
        let starts: Vec<f64> = b.iter().map(|e| e.start).collect();
        assert!(starts.windows(2).all(|w| w[0] <= w[1]), "{starts:?}");
    }

    #[test]
    fn a_tick_of_late_bursts_merges_in_start_order() {
        let burst = |start: f64, end: f64| Burst {
            start,
            end,
            bytes: start,
        };
        let mut b = Bursts::new(6, 0.0);
        let mut scratch = Vec::new();
        b.extend(
            &[
                burst(1.0, 1.1),
                burst(2.0, 2.1),
                burst(3.0, 3.1),
                burst(4.0, 4.1),
            ],
            &mut scratch,
        );
        // The next tick: one started long before (ended late), one ties with a kept start,
        // the rest are new; the ring holds 6, so the two oldest go.
        b.extend(
            &[
                burst(2.5, 5.0),
                burst(3.0, 5.1),
                burst(5.0, 5.2),
                burst(6.0, 6.1),
            ],
            &mut scratch,
        );
        let got: Vec<(f64, f64)> = b.iter().map(|e| (e.start, e.end)).collect();
        assert_eq!(
            got,
            [
                (2.5, 5.0),
                (3.0, 3.1),
                (3.0, 5.1),
                (4.0, 4.1),
                (5.0, 5.2),
                (6.0, 6.1)
            ]
        );
        assert_eq!(b.covered_since(), 2.0);
        // Before what is covered: dropped, and the rest still merge.
        b.extend(&[burst(1.5, 7.0), burst(6.5, 7.0)], &mut scratch);
        let starts: Vec<f64> = b.iter().map(|e| e.start).collect();
        assert_eq!(starts, [3.0, 3.0, 4.0, 5.0, 6.0, 6.5]);
        assert_eq!(b.covered_since(), 2.5);
        let mut out = [0.0; 6];
        b.window(7.0, 7.0, &mut out);
        assert!(out[2] >= 6.5, "max burst bytes {}", out[2]);
    }
}

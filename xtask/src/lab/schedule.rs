//! The seeded, reproducible schedule of congestion episodes.
//!
//! The same seed and the same run shape (duration, ranks, kinds, base link rate) always give
//! the same schedule. Episodes never overlap: a calm warm-up, then episode, calm gap,
//! episode, ... and a calm cool-down before the end. Kinds are dealt round-robin from a
//! freshly shuffled order, so even a short run sees every enabled kind.
use serde::Serialize;
use std::fmt;

/// splitmix64: a tiny, well-mixed, deterministic PRNG (Steele, Lea, Flood 2014).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn range_f64(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }

    /// Uniform in [0, n); `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        // Multiply-shift; the bias is negligible for the small n used here.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A tbf bottleneck tightened on one rank's egress, then relaxed.
    Tbf,
    /// iperf3 cross traffic from one rank to another.
    Cross,
    /// nftables random loss on one rank's input.
    Loss,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Tbf, Kind::Cross, Kind::Loss];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Tbf => "tbf",
            Kind::Cross => "cross",
            Kind::Loss => "loss",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What an episode does, with its parameters.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Params {
    Tbf {
        /// Rate while the episode lasts.
        rate_mbit: u32,
        /// Rate before and after (0: no limit).
        base_mbit: u32,
    },
    Cross {
        dst_rank: usize,
        streams: u32,
        port: u16,
    },
    Loss {
        percent: u32,
    },
}

/// One planned episode; offsets are seconds from the start of the traffic.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Episode {
    pub seq: usize,
    pub kind: Kind,
    /// The rank whose egress (tbf), traffic (cross: the sender) or input (loss) is hit.
    pub rank: usize,
    pub start_s: f64,
    pub end_s: f64,
    pub params: Params,
}

/// The shape of the run the schedule is made for.
#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    pub duration_s: f64,
    pub ranks: usize,
    pub kinds: Vec<Kind>,
    /// Base rate of every rank's egress in Mbit/s (0: no limit).
    pub link_mbit: u32,
    pub cross_port: u16,
}

impl Plan {
    /// Calm time before the first episode: the baseline.
    pub fn warmup_s(&self) -> f64 {
        (self.duration_s * 0.2).clamp(2.0, 10.0)
    }

    /// Calm time kept after the last episode.
    pub fn cooldown_s(&self) -> f64 {
        (self.duration_s * 0.05).clamp(1.0, 5.0)
    }

    /// Shortest episode (and shortest calm gap); the longest is 1.5 times as long.
    pub fn min_len_s(&self) -> f64 {
        (self.duration_s * 0.1).clamp(2.0, 30.0)
    }
}

fn round_ms(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Builds the schedule for `plan`. Empty when no kind is enabled or the run is too short.
pub fn build(plan: &Plan) -> Vec<Episode> {
    let mut rng = SplitMix64::new(plan.seed);
    let mut kinds: Vec<Kind> = plan.kinds.clone();
    kinds.sort();
    kinds.dedup();
    if kinds.is_empty() || plan.ranks < 2 {
        return Vec::new();
    }
    let (min_len, max_len) = (plan.min_len_s(), plan.min_len_s() * 1.5);
    let last_end = plan.duration_s - plan.cooldown_s();
    let mut deck: Vec<Kind> = Vec::new();
    let mut out = Vec::new();
    let mut t = plan.warmup_s();
    loop {
        let len = round_ms(rng.range_f64(min_len, max_len));
        let start = round_ms(t);
        if start + len > last_end {
            break;
        }
        if deck.is_empty() {
            deck = kinds.clone();
            rng.shuffle(&mut deck);
        }
        let kind = deck.pop().unwrap();
        let rank = rng.below(plan.ranks as u64) as usize;
        let params = match kind {
            Kind::Tbf => {
                let rate = if plan.link_mbit > 0 {
                    (plan.link_mbit / rng.pick(&[4, 8, 16])).max(10)
                } else {
                    rng.pick(&[50, 100, 200])
                };
                Params::Tbf {
                    rate_mbit: rate,
                    base_mbit: plan.link_mbit,
                }
            }
            Kind::Cross => {
                let other = rng.below(plan.ranks as u64 - 1) as usize;
                Params::Cross {
                    dst_rank: if other >= rank { other + 1 } else { other },
                    streams: rng.pick(&[2, 4]),
                    port: plan.cross_port,
                }
            }
            Kind::Loss => Params::Loss {
                percent: rng.pick(&[2, 5, 10]),
            },
        };
        out.push(Episode {
            seq: out.len(),
            kind,
            rank,
            start_s: start,
            end_s: round_ms(start + len),
            params,
        });
        t = start + len + rng.range_f64(min_len, max_len);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(seed: u64, duration_s: f64) -> Plan {
        Plan {
            seed,
            duration_s,
            ranks: 4,
            kinds: Kind::ALL.to_vec(),
            link_mbit: 1000,
            cross_port: 5201,
        }
    }

    #[test]
    fn splitmix64_reference_values() {
        // First outputs for seed 0 from the reference implementation.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(r.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn same_seed_same_schedule() {
        for seed in [0, 1, 42, u64::MAX] {
            for d in [20.0, 30.0, 300.0] {
                let a = build(&plan(seed, d));
                assert_eq!(a, build(&plan(seed, d)));
                assert!(!a.is_empty(), "seed {seed} duration {d}");
            }
        }
    }

    #[test]
    fn different_seeds_differ() {
        let a = build(&plan(1, 120.0));
        let b = build(&plan(2, 120.0));
        assert_ne!(a, b);
    }

    #[test]
    fn episodes_are_ordered_disjoint_and_inside_the_run() {
        for seed in 0..200 {
            let p = plan(seed, 30.0);
            let s = build(&p);
            let mut prev_end = p.warmup_s() - 1e-9;
            for (i, e) in s.iter().enumerate() {
                assert_eq!(e.seq, i);
                assert!(e.start_s >= prev_end, "overlap in seed {seed}: {s:?}");
                assert!(e.end_s > e.start_s);
                assert!(e.end_s <= p.duration_s - p.cooldown_s() + 1e-9);
                assert!(e.rank < p.ranks);
                match e.params {
                    Params::Cross { dst_rank, .. } => {
                        assert!(dst_rank < p.ranks && dst_rank != e.rank)
                    }
                    Params::Tbf {
                        rate_mbit,
                        base_mbit,
                    } => assert!(rate_mbit < base_mbit && rate_mbit >= 10),
                    Params::Loss { percent } => assert!((2..=10).contains(&percent)),
                }
                prev_end = e.end_s;
            }
        }
    }

    #[test]
    fn short_runs_see_every_kind() {
        // Three episodes fit in 20 s, and kinds are dealt from a shuffled deck.
        for seed in 0..50 {
            let s = build(&plan(seed, 20.0));
            assert!(s.len() >= 3, "seed {seed}: {s:?}");
            let mut kinds: Vec<_> = s.iter().take(3).map(|e| e.kind).collect();
            kinds.sort();
            assert_eq!(kinds, Kind::ALL.to_vec(), "seed {seed}");
        }
    }

    #[test]
    fn kinds_filter_and_degenerate_plans() {
        let mut p = plan(7, 60.0);
        p.kinds = vec![Kind::Loss];
        assert!(build(&p).iter().all(|e| e.kind == Kind::Loss));
        p.kinds.clear();
        assert!(build(&p).is_empty());
        let mut p = plan(7, 60.0);
        p.ranks = 1;
        assert!(build(&p).is_empty());
        assert!(build(&plan(7, 3.0)).is_empty());
    }
}

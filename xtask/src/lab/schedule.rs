//! The seeded, reproducible schedule of congestion episodes.
//!
//! The same seed and the same run shape (duration, ranks, kinds, base link rate) always give
//! the same schedule. Episodes never overlap: a calm warm-up, then episode, calm gap,
//! episode, ... and a calm cool-down before the end. Kinds are dealt round-robin from a
//! freshly shuffled order, so even a short run sees every enabled kind.
//!
//! Abrupt kinds (tbf, cross, loss) switch on in one go. Gradual kinds (ramp, squeeze,
//! incast) build up in planned steps over 10 to 60 s (less in short runs), then hold: a
//! spike model can only learn to forecast congestion that builds up. A schedule of abrupt
//! kinds only is the same as before gradual kinds existed (they draw nothing extra).
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
    /// Cross traffic from one rank to another that grows by one paced iperf3 flow per step.
    Ramp,
    /// A tbf on one rank's egress tightened step by step, then relaxed.
    Squeeze,
    /// Paced senders on other ranks aimed at one rank's switch port, one more per step.
    Incast,
    /// One rank computes several times slower (traingen `--straggle`): its network is
    /// innocent, its peers wait. Not in the default deck (`Kind::ALL`), so that the seeds of
    /// recorded corpora keep their schedules: ask for it with `--kinds`.
    Straggle,
}

/// How an episode switches on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Onset {
    /// In one go.
    Abrupt,
    /// In planned steps (`Episode::steps`).
    Gradual,
}

impl Onset {
    pub fn name(self) -> &'static str {
        match self {
            Onset::Abrupt => "abrupt",
            Onset::Gradual => "gradual",
        }
    }
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::Tbf,
        Kind::Cross,
        Kind::Loss,
        Kind::Ramp,
        Kind::Squeeze,
        Kind::Incast,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Tbf => "tbf",
            Kind::Cross => "cross",
            Kind::Loss => "loss",
            Kind::Ramp => "ramp",
            Kind::Squeeze => "squeeze",
            Kind::Incast => "incast",
            Kind::Straggle => "straggle",
        }
    }

    pub fn onset(self) -> Onset {
        match self {
            Kind::Tbf | Kind::Cross | Kind::Loss | Kind::Straggle => Onset::Abrupt,
            Kind::Ramp | Kind::Squeeze | Kind::Incast => Onset::Gradual,
        }
    }

    /// Kinds that run iperf3.
    pub fn needs_iperf3(self) -> bool {
        matches!(self, Kind::Cross | Kind::Ramp | Kind::Incast)
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
    Straggle {
        /// How many times longer the rank's compute takes.
        factor: u32,
    },
    Ramp {
        dst_rank: usize,
        /// Paced rate of all flows together once the ramp is full.
        rate_mbit: u32,
        /// Port of the first flow; flow i uses `port + i`.
        port: u16,
        /// Seconds from the first step to the last.
        build_s: f64,
    },
    Squeeze {
        /// Rate once the squeeze is full.
        rate_mbit: u32,
        /// Rate the steps start from (the base rate, or 2000 on unlimited links).
        from_mbit: u32,
        /// Rate before and after (0: no limit).
        base_mbit: u32,
        build_s: f64,
    },
    Incast {
        /// Paced rate of all senders together once the incast is full.
        rate_mbit: u32,
        /// Rate of the tbf the episode puts on the victim's switch port.
        port_mbit: u32,
        /// Port of the first flow; flow i uses `port + i`.
        port: u16,
        build_s: f64,
    },
}

/// What a gradual episode has reached after one of its steps.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Level {
    /// squeeze: the tbf rate; ramp and incast: the paced rate of all flows together.
    pub rate_mbit: u32,
    /// ramp and incast: the iperf3 flows running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flows: Option<u32>,
    /// incast: the rank whose sender this step adds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub src_rank: Option<usize>,
}

/// One planned step of a gradual episode.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Step {
    /// Offset from the start of the traffic.
    pub at_s: f64,
    #[serde(flatten)]
    pub level: Level,
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
    /// Gradual kinds: the steps, the first at `start_s`, the last (full) before `end_s`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<Step>,
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
    /// Calm gaps between episodes, and the warm-up, drawn from this range in seconds
    /// instead of following the episode length: a corpus needs calm stretches long enough
    /// for an onset to follow a calm baseline.
    pub calm_s: Option<(f64, f64)>,
    /// How many times each gradual kind is in the deck (abrupt kinds: once). 0 counts as 1.
    pub gradual_weight: usize,
}

impl Plan {
    /// Calm time before the first episode: the baseline.
    pub fn warmup_s(&self) -> f64 {
        let w = (self.duration_s * 0.2).clamp(2.0, 10.0);
        self.calm_s.map_or(w, |(lo, _)| w.max(lo))
    }

    /// Shortest and longest calm gap between two episodes.
    pub fn calm_range_s(&self) -> (f64, f64) {
        self.calm_s
            .unwrap_or((self.min_len_s(), self.min_len_s() * 1.5))
    }

    /// Calm time kept after the last episode.
    pub fn cooldown_s(&self) -> f64 {
        (self.duration_s * 0.05).clamp(1.0, 5.0)
    }

    /// Shortest episode (and shortest calm gap); the longest is 1.5 times as long.
    pub fn min_len_s(&self) -> f64 {
        (self.duration_s * 0.1).clamp(2.0, 30.0)
    }

    /// Shortest and longest build-up of a gradual episode: 10 to 60 s, but at most a third
    /// of the run, so a 30 s run still holds one (a 10 s build-up) and shorter runs build
    /// up faster.
    pub fn build_range_s(&self) -> (f64, f64) {
        let hi = (self.duration_s / 3.0).min(60.0);
        (hi.min(10.0), hi)
    }
}

/// Closest gap between two steps: tc and iperf3 need a moment, and the model a trend.
const MIN_STEP_GAP_S: f64 = 1.5;
/// Where a squeeze starts on unlimited links.
const UNLIMITED_FROM_MBIT: u32 = 2000;
/// The switch-port rate of an incast on unlimited links.
const UNLIMITED_PORT_MBIT: u32 = 1000;

fn round_ms(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn floor_ms(x: f64) -> f64 {
    (x * 1000.0).floor() / 1000.0
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
            deck = kinds
                .iter()
                .flat_map(|&k| {
                    let n = match k.onset() {
                        Onset::Gradual => plan.gradual_weight.max(1),
                        Onset::Abrupt => 1,
                    };
                    std::iter::repeat_n(k, n)
                })
                .collect();
            rng.shuffle(&mut deck);
        }
        // A gradual kind needs room for its build-up before its `len` at full strength.
        let room = last_end - start - len;
        let fits = |k: Kind| k.onset() == Onset::Abrupt || plan.build_range_s().0 <= room;
        let Some(kind) = deal(&mut deck, fits) else {
            break;
        };
        let rank = rng.below(plan.ranks as u64) as usize;
        let (params, steps, build) = match kind.onset() {
            Onset::Abrupt => (abrupt_params(plan, &mut rng, kind, rank), Vec::new(), 0.0),
            Onset::Gradual => {
                let build = floor_ms(
                    rng.range_f64(plan.build_range_s().0, plan.build_range_s().1)
                        .min(room),
                );
                let (params, levels) = gradual_levels(plan, &mut rng, kind, rank, build);
                (params, step_times(start, build, levels), build)
            }
        };
        out.push(Episode {
            seq: out.len(),
            kind,
            rank,
            start_s: start,
            end_s: round_ms(start + build + len),
            params,
            steps,
        });
        let (calm_lo, calm_hi) = plan.calm_range_s();
        t = start + build + len + rng.range_f64(calm_lo, calm_hi);
    }
    out
}

/// Takes the last kind of the deck that fits (the deck is dealt from its end).
fn deal(deck: &mut Vec<Kind>, fits: impl Fn(Kind) -> bool) -> Option<Kind> {
    let i = deck.iter().rposition(|&k| fits(k))?;
    Some(deck.remove(i))
}

/// The rank other than `rank` an episode aims at.
fn other_rank(rng: &mut SplitMix64, ranks: usize, rank: usize) -> usize {
    let other = rng.below(ranks as u64 - 1) as usize;
    if other >= rank {
        other + 1
    } else {
        other
    }
}

fn abrupt_params(plan: &Plan, rng: &mut SplitMix64, kind: Kind, rank: usize) -> Params {
    match kind {
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
        Kind::Cross => Params::Cross {
            dst_rank: other_rank(rng, plan.ranks, rank),
            streams: rng.pick(&[2, 4]),
            port: plan.cross_port,
        },
        Kind::Loss => Params::Loss {
            percent: rng.pick(&[2, 5, 10]),
        },
        Kind::Straggle => Params::Straggle {
            factor: rng.pick(&[2, 3, 4]),
        },
        Kind::Ramp | Kind::Squeeze | Kind::Incast => unreachable!("{kind} is gradual"),
    }
}

/// The parameters of a gradual episode and the level after each of its steps, the last
/// being its full strength.
fn gradual_levels(
    plan: &Plan,
    rng: &mut SplitMix64,
    kind: Kind,
    rank: usize,
    build_s: f64,
) -> (Params, Vec<Level>) {
    // 4 to 8 steps, fewer when the build-up is short.
    let most = (build_s / MIN_STEP_GAP_S).floor() as u32 + 1;
    let n = rng.pick(&[4, 5, 6, 8]).min(most).max(2);
    let link = plan.link_mbit;
    match kind {
        Kind::Ramp => {
            let dst_rank = other_rank(rng, plan.ranks, rank);
            let full = if link > 0 {
                link * rng.pick(&[2, 3, 4]) / 4
            } else {
                rng.pick(&[500, 1000, 2000])
            };
            // Every flow paced at 1 Mbit/s or more (iperf3 reads 0 as unlimited).
            let full = full.max(n);
            let levels = (1..=n)
                .map(|i| Level {
                    rate_mbit: share(full, i, n),
                    flows: Some(i),
                    src_rank: None,
                })
                .collect();
            let params = Params::Ramp {
                dst_rank,
                rate_mbit: full,
                port: plan.cross_port,
                build_s,
            };
            (params, levels)
        }
        Kind::Squeeze => {
            let (from, to) = if link > 0 {
                (link, (link / rng.pick(&[8, 16])).max(10))
            } else {
                (UNLIMITED_FROM_MBIT, rng.pick(&[50, 100, 200]))
            };
            let mut levels: Vec<Level> = geometric(from, to, n)
                .into_iter()
                .map(|rate_mbit| Level {
                    rate_mbit,
                    flows: None,
                    src_rank: None,
                })
                .collect();
            levels.dedup();
            let params = Params::Squeeze {
                rate_mbit: to,
                from_mbit: from,
                base_mbit: link,
                build_s,
            };
            (params, levels)
        }
        Kind::Incast => {
            let port_mbit = if link > 0 { link } else { UNLIMITED_PORT_MBIT };
            // The full incast offers 1, 1.5 or 2 times what the port carries.
            let full = (port_mbit * rng.pick(&[2, 3, 4]) / 2).max(n);
            let mut senders: Vec<usize> = (0..plan.ranks).filter(|&r| r != rank).collect();
            rng.shuffle(&mut senders);
            let levels = (1..=n)
                .map(|i| Level {
                    rate_mbit: share(full, i, n),
                    flows: Some(i),
                    src_rank: Some(senders[(i as usize - 1) % senders.len()]),
                })
                .collect();
            let params = Params::Incast {
                rate_mbit: full,
                port_mbit,
                port: plan.cross_port,
                build_s,
            };
            (params, levels)
        }
        Kind::Tbf | Kind::Cross | Kind::Loss | Kind::Straggle => {
            unreachable!("{kind} is abrupt")
        }
    }
}

/// `full` * i / n, rounded: the rate after step i of n equal increments.
fn share(full: u32, i: u32, n: u32) -> u32 {
    ((f64::from(full) * f64::from(i) / f64::from(n)).round() as u32).max(1)
}

/// n rates from `from` towards `to` in equal ratios, the first already below `from` and
/// the last exactly `to`: equal ratios are equal relative steps for the queue.
fn geometric(from: u32, to: u32, n: u32) -> Vec<u32> {
    let ratio = f64::from(to) / f64::from(from);
    (1..=n)
        .map(|i| {
            if i == n {
                to
            } else {
                (f64::from(from) * ratio.powf(f64::from(i) / f64::from(n))).round() as u32
            }
        })
        .collect()
}

/// Spreads the levels evenly over the build-up: the first at `start`, the last at
/// `start + build_s`.
fn step_times(start: f64, build_s: f64, levels: Vec<Level>) -> Vec<Step> {
    let gaps = levels.len().saturating_sub(1).max(1) as f64;
    levels
        .into_iter()
        .enumerate()
        .map(|(i, level)| Step {
            at_s: round_ms(start + build_s * i as f64 / gaps),
            level,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ABRUPT: [Kind; 3] = [Kind::Tbf, Kind::Cross, Kind::Loss];
    const GRADUAL: [Kind; 3] = [Kind::Ramp, Kind::Squeeze, Kind::Incast];

    /// A run with the abrupt kinds only (the schedule as it was before gradual kinds).
    fn plan(seed: u64, duration_s: f64) -> Plan {
        Plan {
            seed,
            duration_s,
            ranks: 4,
            kinds: ABRUPT.to_vec(),
            link_mbit: 1000,
            cross_port: 5201,
            calm_s: None,
            gradual_weight: 1,
        }
    }

    fn plan_with(seed: u64, duration_s: f64, kinds: &[Kind]) -> Plan {
        Plan {
            kinds: kinds.to_vec(),
            ..plan(seed, duration_s)
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
        for (seed, d) in (0..200).flat_map(|s| [(s, 30.0), (s, 90.0), (s, 400.0)]) {
            let p = plan_with(seed, d, &Kind::ALL);
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
                    Params::Ramp { dst_rank, .. } => {
                        assert!(dst_rank < p.ranks && dst_rank != e.rank)
                    }
                    Params::Squeeze {
                        rate_mbit,
                        from_mbit,
                        base_mbit,
                        ..
                    } => assert!(rate_mbit < from_mbit && from_mbit == base_mbit),
                    Params::Incast { port_mbit, .. } => assert_eq!(port_mbit, 1000),
                    Params::Straggle { .. } => panic!("straggle is not in Kind::ALL"),
                }
                assert_eq!(e.steps.is_empty(), e.kind.onset() == Onset::Abrupt, "{e:?}");
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
            assert_eq!(kinds, ABRUPT.to_vec(), "seed {seed}");
        }
    }

    /// Straggle episodes come only when asked for: the default deck, and so the schedule of
    /// every seed a corpus was recorded with, is the same as before the kind existed.
    #[test]
    fn straggle_only_when_asked() {
        assert!(!Kind::ALL.contains(&Kind::Straggle));
        let mut p = plan(7, 120.0);
        p.kinds = vec![Kind::Straggle];
        let s = build(&p);
        assert!(!s.is_empty());
        for e in &s {
            assert_eq!(e.kind, Kind::Straggle);
            assert!(
                matches!(e.params, Params::Straggle { factor } if (2..=4).contains(&factor)),
                "{e:?}"
            );
            assert!(e.steps.is_empty());
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
        for k in Kind::ALL {
            let s = build(&plan_with(7, 120.0, &[k]));
            assert!(!s.is_empty() && s.iter().all(|e| e.kind == k), "{k}: {s:?}");
        }
        let s = build(&plan_with(7, 300.0, &GRADUAL));
        assert!(s.iter().all(|e| e.kind.onset() == Onset::Gradual), "{s:?}");
    }

    #[test]
    fn abrupt_schedules_are_unchanged_by_gradual_kinds() {
        // Pinned from the schedule before gradual kinds existed: old seeds replay the same.
        let s = build(&plan(1, 20.0));
        let got: Vec<_> = s
            .iter()
            .map(|e| (e.kind, e.rank, e.start_s, e.end_s))
            .collect();
        assert_eq!(
            got,
            vec![
                (Kind::Loss, 1, 4.0, 6.567),
                (Kind::Cross, 2, 9.33, 12.207),
                (Kind::Tbf, 1, 14.611, 17.216),
            ]
        );
        let json = serde_json::to_string(&build(&plan(7, 90.0))).unwrap();
        assert_eq!(
            json,
            r#"[{"seq":0,"kind":"tbf","rank":2,"start_s":10.0,"end_s":20.754,"params":{"rate_mbit":125,"base_mbit":1000}},{"seq":1,"kind":"cross","rank":1,"start_s":30.876,"end_s":41.982,"params":{"dst_rank":0,"streams":2,"port":5201}},{"seq":2,"kind":"loss","rank":3,"start_s":51.448,"end_s":64.767,"params":{"percent":10}}]"#
        );
    }

    #[test]
    fn same_seed_same_gradual_schedule() {
        for seed in [0, 1, 42, u64::MAX] {
            for d in [30.0, 120.0, 600.0] {
                let p = plan_with(seed, d, &Kind::ALL);
                assert_eq!(build(&p), build(&p), "seed {seed} duration {d}");
            }
        }
    }

    /// Checks the steps of one gradual episode: they start at the episode's start, are
    /// evenly spaced and monotone, and reach the full level before the episode ends, with
    /// at least `min_len_s` at full strength.
    fn check_steps(p: &Plan, e: &Episode) {
        let (lo, hi) = p.build_range_s();
        let first = e.steps.first().expect("a gradual episode has steps");
        let last = e.steps.last().unwrap();
        assert_eq!(first.at_s, e.start_s, "{e:?}");
        let build = last.at_s - first.at_s;
        assert!(
            // The build-up is cut to whole milliseconds.
            build >= lo - 2e-3 && build <= hi + 1e-6,
            "build {build} not in {lo}..{hi}: {e:?}"
        );
        assert!(e.end_s - last.at_s >= p.min_len_s() - 1e-6, "{e:?}");
        assert!(e.steps.len() >= 2, "{e:?}");
        for w in e.steps.windows(2) {
            let gap = w[1].at_s - w[0].at_s;
            assert!(gap >= MIN_STEP_GAP_S - 2e-3 || e.steps.len() == 2, "{e:?}");
            let (a, b) = (&w[0].level, &w[1].level);
            match e.kind {
                Kind::Squeeze => assert!(b.rate_mbit < a.rate_mbit, "{e:?}"),
                _ => {
                    assert!(b.rate_mbit > a.rate_mbit, "{e:?}");
                    assert_eq!(b.flows, a.flows.map(|f| f + 1), "{e:?}");
                }
            }
        }
        match e.params {
            Params::Ramp {
                rate_mbit, build_s, ..
            } => {
                assert_eq!(last.level.rate_mbit, rate_mbit);
                assert_eq!(first.level.flows, Some(1));
                assert!((build_s - build).abs() < 1e-6, "{e:?}");
            }
            Params::Squeeze {
                rate_mbit,
                from_mbit,
                build_s,
                ..
            } => {
                assert_eq!(last.level.rate_mbit, rate_mbit);
                assert!(first.level.rate_mbit < from_mbit);
                assert!(rate_mbit * 8 <= from_mbit, "{e:?}");
                assert!((build_s - build).abs() < 1e-6, "{e:?}");
            }
            Params::Incast {
                rate_mbit, build_s, ..
            } => {
                assert_eq!(last.level.rate_mbit, rate_mbit);
                assert!((build_s - build).abs() < 1e-6, "{e:?}");
                for s in &e.steps {
                    let src = s.level.src_rank.expect("incast steps name their sender");
                    assert!(src != e.rank && src < p.ranks, "{e:?}");
                }
            }
            _ => panic!("abrupt params on a gradual episode: {e:?}"),
        }
    }

    #[test]
    fn gradual_episodes_build_up_monotonically_to_their_target() {
        for seed in 0..300 {
            for d in [20.0, 30.0, 60.0, 200.0, 900.0] {
                let p = plan_with(seed, d, &GRADUAL);
                for e in build(&p) {
                    check_steps(&p, &e);
                }
            }
        }
        // Unlimited links: a squeeze starts from 2000 Mbit/s, an incast port is 1000.
        let mut p = plan_with(3, 200.0, &GRADUAL);
        p.link_mbit = 0;
        for e in build(&p) {
            check_steps(&p, &e);
        }
    }

    #[test]
    fn build_ups_scale_with_the_run() {
        assert_eq!(plan(1, 30.0).build_range_s(), (10.0, 10.0));
        assert_eq!(plan(1, 90.0).build_range_s(), (10.0, 30.0));
        assert_eq!(plan(1, 600.0).build_range_s(), (10.0, 60.0));
        let (lo, hi) = plan(1, 15.0).build_range_s();
        assert_eq!((lo, hi), (5.0, 5.0));
        // Long runs use the whole 10-60 s range.
        let builds: Vec<f64> = (0..50)
            .flat_map(|seed| build(&plan_with(seed, 900.0, &GRADUAL)))
            .map(|e| e.steps.last().unwrap().at_s - e.start_s)
            .collect();
        assert!(builds.iter().any(|&b| b < 20.0) && builds.iter().any(|&b| b > 50.0));
    }

    #[test]
    fn a_30s_run_with_gradual_kinds_only_has_an_episode() {
        for seed in 0..500 {
            for kinds in [
                GRADUAL.to_vec(),
                vec![Kind::Ramp],
                vec![Kind::Squeeze],
                vec![Kind::Incast],
            ] {
                let p = plan_with(seed, 30.0, &kinds);
                let s = build(&p);
                assert!(!s.is_empty(), "seed {seed} {kinds:?}");
                assert!(s[0].steps.last().unwrap().at_s - s[0].start_s >= 10.0 - 1e-6);
            }
        }
    }

    #[test]
    fn long_mixed_runs_see_every_kind() {
        // Ten minutes with every kind hold six or more episodes, dealt from one deck.
        for seed in 0..50 {
            let s = build(&plan_with(seed, 600.0, &Kind::ALL));
            let mut kinds: Vec<Kind> = s.iter().map(|e| e.kind).collect();
            kinds.sort();
            kinds.dedup();
            assert_eq!(kinds, Kind::ALL.to_vec(), "seed {seed}: {s:?}");
        }
    }

    #[test]
    fn incast_with_two_ranks_repeats_the_only_sender() {
        let mut p = plan_with(5, 120.0, &[Kind::Incast]);
        p.ranks = 2;
        for e in build(&p) {
            check_steps(&p, &e);
            assert!(e.steps.iter().all(|s| s.level.src_rank == Some(1 - e.rank)));
        }
    }

    #[test]
    fn steps_serialize_flat() {
        let s = Step {
            at_s: 1.5,
            level: Level {
                rate_mbit: 250,
                flows: Some(2),
                src_rank: None,
            },
        };
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"at_s":1.5,"rate_mbit":250,"flows":2}"#
        );
    }

    #[test]
    fn calm_gaps_and_gradual_weight_shape_a_corpus_run() {
        let (mut gradual, mut abrupt) = (0, 0);
        for seed in 1..40 {
            let p = Plan {
                calm_s: Some((45.0, 150.0)),
                gradual_weight: 2,
                ..plan_with(seed, 900.0, &Kind::ALL)
            };
            let eps = build(&p);
            assert!(eps.len() >= 3, "seed {seed}: {} episodes", eps.len());
            assert!(eps[0].start_s >= 45.0);
            for w in eps.windows(2) {
                let gap = w[1].start_s - w[0].end_s;
                assert!(
                    (45.0 - 1e-3..=150.0 + 1e-3).contains(&gap),
                    "seed {seed}: gap {gap}"
                );
            }
            for e in &eps {
                match e.kind.onset() {
                    Onset::Gradual => gradual += 1,
                    Onset::Abrupt => abrupt += 1,
                }
            }
        }
        assert!(
            gradual > abrupt * 3 / 2,
            "{gradual} gradual, {abrupt} abrupt"
        );
    }
}

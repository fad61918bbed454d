//! The training iteration period of a peer's traffic, from its burst events: the bursts
//! become an occupancy series in 10 ms bins (share of each bin inside any burst), whose
//! autocorrelation (by FFT) peaks at the period. The highest peak wins, unless a whole
//! fraction of its lag (1/2, 1/3, ... down to the shortest period) also peaks nearly as
//! high, a peak counted with its higher neighbour (a period between two lags splits its
//! peak): then that shorter lag is the period and the highest was a multiple of it.
//! Sub-iteration rhythms (the steps of a ring all-reduce) peak lower and at lags that do
//! not divide the period, so they do not win.
//! The estimate is refined on the furthest multiple of the period still in range, which
//! divides the bin error by the number of periods spanned.
use rustfft::{num_complex::Complex, FftPlanner};

use super::bursts::Bursts;

/// Bin width of the occupancy series.
pub const BIN_S: f64 = 0.01;
/// Shortest period looked for.
const MIN_PERIOD_S: f64 = 0.03;
/// A period needs this many repeats in the window.
const MIN_CYCLES: usize = 3;
/// Less burst history than this says nothing yet.
const MIN_HISTORY_S: f64 = 1.0;
/// Autocorrelation below this is "no period".
pub const MIN_CONFIDENCE: f64 = 0.3;
/// A whole fraction of the highest peak's lag wins if its peak is at least this share of it.
const NEAR_BEST: f64 = 0.85;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Period {
    /// NaN without a clear period.
    pub seconds: f64,
    /// Autocorrelation at the period (0 to 1); NaN if there was too little history.
    pub confidence: f64,
}

impl Period {
    pub const UNKNOWN: Period = Period {
        seconds: f64::NAN,
        confidence: f64::NAN,
    };
}

/// Scratch space and FFT plans, shared by every peer.
pub struct PeriodFinder {
    planner: FftPlanner<f64>,
    bins: Vec<f64>,
    buf: Vec<Complex<f64>>,
    scratch: Vec<Complex<f64>>,
    acf: Vec<f64>,
}

impl Default for PeriodFinder {
    fn default() -> Self {
        Self {
            planner: FftPlanner::new(),
            bins: Vec::new(),
            buf: Vec::new(),
            scratch: Vec::new(),
            acf: Vec::new(),
        }
    }
}

impl PeriodFinder {
    /// The period of the bursts in the `window` seconds before `now`.
    pub fn estimate(&mut self, bursts: &Bursts, now: f64, window: f64) -> Period {
        let from = (now - window).max(bursts.covered_since());
        let n = ((now - from) / BIN_S).floor() as usize;
        let kmin = (MIN_PERIOD_S / BIN_S).ceil() as usize;
        if (n as f64) < MIN_HISTORY_S / BIN_S {
            return Period::UNKNOWN;
        }
        self.occupancy(bursts, from, n);
        if !self.autocorrelation(n) {
            // Never or always busy: nothing repeats.
            return Period {
                seconds: f64::NAN,
                confidence: 0.0,
            };
        }
        let kmax = n / MIN_CYCLES;
        let a = &self.acf;
        let peak = |k: usize| a[k] > a[k - 1] && a[k] >= a[k + 1] && a[k] > 0.0;
        let Some(top) = (kmin..kmax)
            .filter(|&k| peak(k))
            .max_by(|&x, &y| a[x].total_cmp(&a[y]))
        else {
            return Period {
                seconds: f64::NAN,
                confidence: 0.0,
            };
        };
        // A peak's height with its higher neighbour's: a period that is not a whole number
        // of bins splits a narrow peak over two lags, while its multiple (3 x 25.7 bins =
        // 77.0) may land on one, so single-lag heights would favour the multiple.
        let mass = |k: usize| a[k] + a[k - 1].max(a[k + 1]).max(0.0);
        // Down to the fundamental: a multiple of the period may peak highest, and a
        // fraction of it may itself be a multiple (top at 8T: 8T/4 = 2T, then 2T/2 = T).
        // Every fraction down to the shortest period is tried, smallest first: the highest
        // can be a prime multiple (17 x 21.4 bins = 364.1, the nearest to a whole lag).
        let mut k = top;
        while let Some(m) = (2..=k / kmin).rev().find_map(|d| {
            let centre = k as f64 / d as f64;
            let r = (centre * 0.05).max(1.0);
            let (lo, hi) = ((centre - r).ceil() as usize, (centre + r).floor() as usize);
            (lo.max(kmin)..=hi.min(kmax - 1))
                .filter(|&m| peak(m) && mass(m) >= NEAR_BEST * mass(top))
                .max_by(|&x, &y| a[x].total_cmp(&a[y]))
        }) {
            k = m;
        }
        let confidence = a[k].clamp(0.0, 1.0);
        if confidence < MIN_CONFIDENCE {
            return Period {
                seconds: f64::NAN,
                confidence,
            };
        }
        Period {
            seconds: refine(a, k, kmax) * BIN_S,
            confidence,
        }
    }

    /// Share of each bin of [from, from + n * BIN_S) inside a burst. A single-packet burst
    /// (no duration) still marks its bin a little.
    fn occupancy(&mut self, bursts: &Bursts, from: f64, n: usize) {
        self.bins.clear();
        self.bins.resize(n, 0.0);
        let to = from + n as f64 * BIN_S;
        for b in bursts.since(from).filter(|b| b.start < to) {
            add_occupancy(&mut self.bins, from, BIN_S, b.start, b.end);
        }
        for x in &mut self.bins {
            *x = x.min(1.0);
        }
    }

    /// Unbiased, normalised autocorrelation of the bins into `acf` (lags 0..n); false if
    /// the series is flat.
    fn autocorrelation(&mut self, n: usize) -> bool {
        let mean = self.bins.iter().sum::<f64>() / n as f64;
        // Never or always busy: no FFT needed to say nothing repeats.
        if mean <= 0.0 || self.bins.iter().all(|&x| x == self.bins[0]) {
            return false;
        }
        let m = (2 * n).next_power_of_two();
        self.buf.clear();
        self.buf
            .extend(self.bins.iter().map(|&x| Complex::new(x - mean, 0.0)));
        self.buf.resize(m, Complex::new(0.0, 0.0));
        let fwd = self.planner.plan_fft_forward(m);
        let inv = self.planner.plan_fft_inverse(m);
        let len = fwd
            .get_inplace_scratch_len()
            .max(inv.get_inplace_scratch_len());
        self.scratch.resize(len, Complex::new(0.0, 0.0));
        fwd.process_with_scratch(&mut self.buf, &mut self.scratch);
        for c in &mut self.buf {
            *c = Complex::new(c.norm_sqr(), 0.0);
        }
        inv.process_with_scratch(&mut self.buf, &mut self.scratch);
        let r0 = self.buf[0].re / n as f64;
        if r0 <= 1e-12 {
            return false;
        }
        self.acf.clear();
        self.acf
            .extend((0..n).map(|k| self.buf[k].re / (n - k) as f64 / r0));
        true
    }
}

/// Adds to `bins` (each `w` seconds wide, the first starting at `from`) the share of each
/// bin inside the burst [start, end], which must overlap them. A burst inside one bin marks
/// it at least 0.1: a single packet has no duration. `probe analyze` folds bursts onto
/// iterations with it too.
pub fn add_occupancy(bins: &mut [f64], from: f64, w: f64, start: f64, end: f64) {
    let n = bins.len();
    let to = from + n as f64 * w;
    let (s, e) = ((start - from).max(0.0), (end - from).min(to - from));
    let (first, last) = (((s / w) as usize).min(n - 1), ((e / w) as usize).min(n - 1));
    if first == last {
        bins[first] += ((e - s) / w).max(0.1);
        return;
    }
    bins[first] += (first + 1) as f64 - s / w;
    for x in &mut bins[first + 1..last] {
        *x += 1.0;
    }
    bins[last] += e / w - last as f64;
}

/// Vertex of the parabola through a[k-1], a[k], a[k+1], as a fractional lag.
fn vertex(a: &[f64], k: usize) -> f64 {
    let (l, c, r) = (a[k - 1], a[k], a[k + 1]);
    let d = l - 2.0 * c + r;
    if d >= 0.0 {
        return k as f64;
    }
    k as f64 + (0.5 * (l - r) / d).clamp(-0.5, 0.5)
}

/// The period in bins, from the peak at `k` and the furthest multiple of it below `kmax`
/// that still shows a peak.
fn refine(a: &[f64], k: usize, kmax: usize) -> f64 {
    let base = vertex(a, k);
    let mut best = base;
    for j in (2..=kmax / k).rev() {
        let centre = (base * j as f64).round() as usize;
        let r = (j / 2).max(1);
        let lo = centre.saturating_sub(r).max(1);
        let hi = (centre + r).min(a.len() - 2);
        if lo > hi {
            continue;
        }
        let m = (lo..=hi)
            .max_by(|&x, &y| a[x].total_cmp(&a[y]))
            .unwrap_or(centre);
        if m > lo && m < hi && a[m] >= 0.5 * a[k] {
            best = vertex(a, m) / j as f64;
            break;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::bursts::Burst;

    fn bursts(period: f64, on: f64, until: f64, jitter: impl Fn(usize) -> f64) -> Bursts {
        let mut b = Bursts::new(4096, 0.0);
        let mut t = 0.5;
        let mut i = 0;
        while t + on < until {
            let s = t + jitter(i);
            b.add(Burst {
                start: s,
                end: s + on,
                bytes: 1e6,
            });
            t += period;
            i += 1;
        }
        b
    }

    #[test]
    fn a_250_ms_burst_train_gives_a_quarter_second() {
        let b = bursts(0.25, 0.06, 20.0, |_| 0.0);
        let p = PeriodFinder::default().estimate(&b, 20.0, 16.0);
        assert!((p.seconds - 0.25).abs() / 0.25 < 0.05, "{p:?}");
        assert!(p.confidence > 0.8, "{p:?}");
    }

    #[test]
    fn jittered_and_split_iterations_keep_their_period() {
        // Each iteration: two bursts (reduce-scatter, all-gather) with a short gap between,
        // a few ms of pseudo-random jitter.
        let mut b = Bursts::new(4096, 0.0);
        for i in 0..90 {
            let t = 0.3 + i as f64 * 0.173 + 0.004 * (((i * 7919) % 11) as f64 / 10.0 - 0.5);
            b.add(Burst {
                start: t,
                end: t + 0.02,
                bytes: 1e6,
            });
            b.add(Burst {
                start: t + 0.03,
                end: t + 0.05,
                bytes: 1e6,
            });
        }
        let p = PeriodFinder::default().estimate(&b, 16.0, 16.0);
        assert!((p.seconds - 0.173).abs() / 0.173 < 0.05, "{p:?}");
    }

    #[test]
    fn a_narrow_train_off_the_bin_grid_keeps_its_fundamental() {
        // 7 ms bursts every 25.7 bins (a parameter server on a fast link): the peak at the
        // period splits over lags 25 and 26, while 3 periods (77.1 bins) land on one lag.
        let b = bursts(0.257, 0.007, 20.0, |i| 0.0005 * ((i * 7919) % 5) as f64);
        let p = PeriodFinder::default().estimate(&b, 20.0, 16.0);
        assert!((p.seconds - 0.257).abs() / 0.257 < 0.02, "{p:?}");
    }

    #[test]
    fn no_bursts_or_random_bursts_give_no_period() {
        let empty = Bursts::new(16, 0.0);
        let p = PeriodFinder::default().estimate(&empty, 20.0, 16.0);
        assert!(p.seconds.is_nan());
        let mut b = Bursts::new(4096, 0.0);
        let mut x: u64 = 12345;
        let mut t = 0.0;
        while t < 20.0 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            t += 0.005 + (x >> 40) as f64 / (1u64 << 24) as f64 * 0.3;
            b.add(Burst {
                start: t,
                end: t + 0.01,
                bytes: 1.0,
            });
        }
        let p = PeriodFinder::default().estimate(&b, 20.0, 16.0);
        assert!(p.seconds.is_nan() || p.confidence < 0.5, "{p:?}");
        // Too little history yet.
        let short = bursts(0.25, 0.06, 0.3, |_| 0.0);
        assert!(PeriodFinder::default()
            .estimate(&short, 0.3, 16.0)
            .confidence
            .is_nan());
    }
}

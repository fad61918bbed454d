//! Multi-scale windows over an entity's per-tick signals, in fixed memory: a ring of the
//! last ticks (time and one value per signal, NaN where a value was not known) and an EWMA
//! per signal and window. Every window's statistics come from one pass over the ring,
//! newest first, so all windows cost about what the longest one does.

/// The last `cap` ticks of one entity. Never grows after it is made. Values are stored
/// signal by signal, so one signal's walk over the ring reads contiguous memory.
pub struct Ring {
    /// Index of the next slot to write; the newest is the one before it.
    head: usize,
    len: usize,
    times: Box<[f64]>,
    /// `vals[s * cap + slot]`.
    vals: Box<[f64]>,
}

impl Ring {
    pub fn new(cap: usize, nsig: usize) -> Self {
        Self {
            head: 0,
            len: 0,
            times: vec![f64::NAN; cap].into_boxed_slice(),
            vals: vec![f64::NAN; cap * nsig].into_boxed_slice(),
        }
    }

    fn cap(&self) -> usize {
        self.times.len()
    }

    /// Appends one tick, overwriting the oldest when full.
    pub fn push(&mut self, t: f64, vals: &[f64]) {
        let (i, cap) = (self.head, self.cap());
        debug_assert_eq!(vals.len() * cap, self.vals.len());
        self.times[i] = t;
        for (s, v) in vals.iter().enumerate() {
            self.vals[s * cap + i] = *v;
        }
        self.head = (i + 1) % cap;
        self.len = (self.len + 1).min(cap);
    }

    /// Slots from the newest to the oldest: below the head backwards, then (once the ring
    /// has wrapped) the top of the buffer backwards.
    fn newest_first(&self) -> impl Iterator<Item = usize> {
        let wrapped = if self.len == self.cap() {
            self.head..self.cap()
        } else {
            0..0
        };
        (0..self.head).rev().chain(wrapped.rev())
    }

    /// Heap bytes held (constant for the ring's life).
    pub fn bytes(&self) -> usize {
        (self.times.len() + self.vals.len()) * std::mem::size_of::<f64>()
    }
}

/// EWMA of every signal for every window (time constant = the window), and a slow,
/// spike-resistant baseline per signal.
pub struct Ewma {
    windows: Box<[f64]>,
    /// Value per (signal, window); NaN until the signal's first value.
    vals: Box<[f64]>,
    /// Per signal: an EWMA with time constant [`BASELINE_S`] of the values clipped to
    /// [1/2, 2] x itself, so a spike barely moves it (the labels compare with a 5-minute
    /// median for the same reason).
    base: Box<[f64]>,
    /// Time of each signal's last value.
    times: Box<[f64]>,
}

/// Time constant of the baseline EWMA (s).
pub const BASELINE_S: f64 = 300.0;

impl Ewma {
    pub fn new(nsig: usize, windows: &[f64]) -> Self {
        Self {
            windows: windows.into(),
            vals: vec![f64::NAN; nsig * windows.len()].into_boxed_slice(),
            base: vec![f64::NAN; nsig].into_boxed_slice(),
            times: vec![f64::NAN; nsig].into_boxed_slice(),
        }
    }

    /// Folds in this tick's values (NaN: not known, skipped). The weight of a new value
    /// follows the time since that signal's previous one, so missed ticks weigh right.
    pub fn update(&mut self, t: f64, vals: &[f64]) {
        let nw = self.windows.len();
        for (s, &v) in vals.iter().enumerate() {
            if v.is_nan() {
                continue;
            }
            let prev_t = self.times[s];
            for (w, &len) in self.windows.iter().enumerate() {
                let e = &mut self.vals[s * nw + w];
                if e.is_nan() || prev_t.is_nan() {
                    *e = v;
                } else {
                    let alpha = 1.0 - (-(t - prev_t).max(0.0) / len).exp();
                    *e += alpha * (v - *e);
                }
            }
            let b = &mut self.base[s];
            if b.is_nan() || prev_t.is_nan() {
                *b = v;
            } else {
                let alpha = 1.0 - (-(t - prev_t).max(0.0) / BASELINE_S).exp();
                let (lo, hi) = if *b >= 0.0 {
                    (*b * 0.5, *b * 2.0)
                } else {
                    (*b * 2.0, *b * 0.5)
                };
                // A baseline of 0 (an idle signal) must still be able to move.
                let x = if *b == 0.0 { v } else { v.clamp(lo, hi) };
                *b += alpha * (x - *b);
            }
            self.times[s] = t;
        }
    }

    fn get(&self, s: usize, w: usize) -> f64 {
        self.vals[s * self.windows.len() + w]
    }

    fn baseline(&self, s: usize) -> f64 {
        self.base[s]
    }

    pub fn bytes(&self) -> usize {
        (self.windows.len() + self.vals.len() + self.base.len() + self.times.len())
            * std::mem::size_of::<f64>()
    }
}

/// Running sums over the samples of a window. Values are taken relative to a reference (the
/// newest value) and times relative to now, which keeps the sums of squares well
/// conditioned for signals like bytes per second.
#[derive(Clone, Copy)]
struct Acc {
    n: f64,
    sx: f64,
    sxx: f64,
    sy: f64,
    syy: f64,
    sxy: f64,
    min: f64,
    max: f64,
}

impl Default for Acc {
    fn default() -> Self {
        Self {
            n: 0.0,
            sx: 0.0,
            sxx: 0.0,
            sy: 0.0,
            syy: 0.0,
            sxy: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }
}

impl Acc {
    fn add(&mut self, x: f64, y: f64, v: f64) {
        self.n += 1.0;
        self.sx += x;
        self.sxx += x * x;
        self.sy += y;
        self.syy += y * y;
        self.sxy += x * y;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    /// (mean, std) of the values, given the reference they were taken against.
    fn moments(&self, reference: f64) -> (f64, f64) {
        let m = self.sy / self.n;
        let var = (self.syy / self.n - m * m).max(0.0);
        (reference + m, var.sqrt())
    }

    fn slope(&self) -> f64 {
        let d = self.n * self.sxx - self.sx * self.sx;
        if self.n < 2.0 || d <= 0.0 {
            return f64::NAN;
        }
        (self.n * self.sxy - self.sx * self.sy) / d
    }
}

/// Statistics of one signal over one window, in layout order.
pub const WINDOW_STATS: &[(&str, &str)] = &[
    ("mean", "mean of the tick values in the window"),
    (
        "std",
        "standard deviation (population) of the tick values in the window",
    ),
    ("min", "smallest tick value in the window"),
    ("max", "largest tick value in the window"),
    (
        "slope",
        "least-squares slope of the tick values against time in the window, per second",
    ),
    (
        "ewma",
        "exponentially weighted moving average with the window as time constant",
    ),
];

/// Features of a signal before its window statistics: last, z, rel.
pub const HEAD: usize = 3;

/// One entity's ring as of `now`, newest first, as far back as the longest window reaches:
/// each slot with its time relative to now, and where each window ends. Computed once per
/// entity and tick and shared by its signals, whose walks then do no time comparisons.
#[derive(Default)]
pub struct Walk {
    slots: Vec<usize>,
    dt: Vec<f64>,
    /// Per window, ascending: how many of `slots` it holds (a slot at time t is in a window
    /// w when `t > now - w`).
    cuts: Vec<usize>,
    /// The slot of this tick's values, when the newest slot is of time `now`.
    current: Option<usize>,
}

impl Walk {
    /// Walks `ring` back from `now` over `windows` (ascending lengths in seconds).
    pub fn over(&mut self, ring: &Ring, now: f64, windows: &[f64]) {
        self.slots.clear();
        self.dt.clear();
        self.cuts.clear();
        self.current = ring.newest_first().next().filter(|&i| ring.times[i] == now);
        let mut bound = now - windows[0];
        for i in ring.newest_first() {
            let t = ring.times[i];
            while t <= bound {
                self.cuts.push(self.slots.len());
                match windows.get(self.cuts.len()) {
                    Some(w) => bound = now - w,
                    None => return,
                }
            }
            self.slots.push(i);
            self.dt.push(t - now);
        }
        while self.cuts.len() < windows.len() {
            self.cuts.push(self.slots.len());
        }
    }
}

/// Writes signal `s`'s features into `out` (length `HEAD + 6 * windows`): last, z, rel,
/// then per window mean, std, min, max, slope, ewma, over the ring as `walk` walked it.
/// NaN marks a feature not known.
pub fn signal_features(ring: &Ring, ewma: &Ewma, s: usize, walk: &Walk, out: &mut [f64]) {
    let nstat = WINDOW_STATS.len();
    let windows = walk.cuts.len();
    debug_assert_eq!(out.len(), HEAD + nstat * windows);
    out.fill(f64::NAN);
    let cap = ring.cap();
    let vals = &ring.vals[s * cap..(s + 1) * cap];
    let last = walk.current.map_or(f64::NAN, |i| vals[i]);
    let mut reference = last;
    let mut acc = Acc::default();
    let mut from = 0;
    for (w, &cut) in walk.cuts.iter().enumerate() {
        for (&i, &dt) in walk.slots[from..cut].iter().zip(&walk.dt[from..cut]) {
            let v = vals[i];
            if v.is_nan() {
                continue;
            }
            if reference.is_nan() {
                reference = v;
            }
            acc.add(dt, v - reference, v);
        }
        from = cut;
        let o = &mut out[HEAD + w * nstat..HEAD + (w + 1) * nstat];
        if acc.n > 0.0 {
            let (mean, std) = acc.moments(reference);
            o[0] = mean;
            o[1] = std;
            o[2] = acc.min;
            o[3] = acc.max;
            o[4] = acc.slope();
        }
        o[5] = ewma.get(s, w);
    }
    out[0] = last;
    // z against the longest window (which includes this tick's value).
    let longest = HEAD + (windows - 1) * nstat;
    let (mean, std) = (out[longest], out[longest + 1]);
    if !last.is_nan() && !mean.is_nan() {
        out[1] = if std > mean.abs() * 1e-12 && std > 0.0 {
            (last - mean) / std
        } else {
            0.0
        };
    }
    // rel: the shortest window's EWMA over the slow baseline. Scale-free, so a model
    // learns "twice its usual" once for links of any speed or RTT.
    let ewma_short = out[HEAD + nstat - 1];
    let base = ewma.baseline(s);
    if base > 0.0 && !ewma_short.is_nan() {
        out[2] = ewma_short / base;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOWS: [f64; 3] = [5.0, 30.0, 120.0];

    /// Feeds `f(tick)` for ticks 1..=n at 1 s and returns the features at the last tick.
    fn run(n: usize, f: impl Fn(usize) -> f64) -> Vec<f64> {
        let mut ring = Ring::new(152, 1);
        let mut ewma = Ewma::new(1, &WINDOWS);
        for i in 1..=n {
            ring.push(i as f64, &[f(i)]);
            ewma.update(i as f64, &[f(i)]);
        }
        let mut out = vec![0.0; HEAD + 6 * 3];
        let mut walk = Walk::default();
        walk.over(&ring, n as f64, &WINDOWS);
        signal_features(&ring, &ewma, 0, &walk, &mut out);
        out
    }

    fn stat(out: &[f64], w: usize, stat: usize) -> f64 {
        out[HEAD + w * 6 + stat]
    }

    #[test]
    fn a_linear_ramp_gives_its_slope_in_every_window() {
        let out = run(200, |i| 3.0 + 0.25 * i as f64);
        for w in 0..3 {
            assert!(
                (stat(&out, w, 4) - 0.25).abs() < 1e-9,
                "window {w}: {out:?}"
            );
        }
        // The 5 s window holds ticks 196..=200.
        assert!((stat(&out, 0, 0) - (3.0 + 0.25 * 198.0)).abs() < 1e-9);
        assert_eq!(stat(&out, 0, 2), 3.0 + 0.25 * 196.0);
        assert_eq!(stat(&out, 0, 3), 3.0 + 0.25 * 200.0);
        assert_eq!(out[0], 53.0);
    }

    #[test]
    fn a_step_gives_a_large_z_score() {
        // Calm noise around 1 ms, then 3 ms at the last tick.
        let out = run(150, |i| {
            if i == 150 {
                0.003
            } else {
                0.001 + 1e-5 * ((i % 7) as f64 - 3.0)
            }
        });
        assert!(out[1] > 3.0, "z {}", out[1]);
        // Flat then nothing new: z is 0, not infinite.
        let out = run(50, |_| 7.0);
        assert_eq!(out[1], 0.0);
        assert_eq!(stat(&out, 2, 1), 0.0);
    }

    #[test]
    fn missing_values_are_skipped_and_old_ticks_leave_the_window() {
        let out = run(40, |i| if i % 2 == 0 { f64::NAN } else { i as f64 });
        // Last tick (40) has no value: last and z unknown, windows still known.
        assert!(out[0].is_nan() && out[1].is_nan());
        // 5 s window: ticks 36..=40, values at 37 and 39.
        assert_eq!(stat(&out, 0, 0), 38.0);
        assert_eq!(stat(&out, 0, 2), 37.0);
    }

    #[test]
    fn ewma_follows_a_step_with_the_window_as_time_constant() {
        let out = run(100, |i| if i > 95 { 1.0 } else { 0.0 });
        // Five 1 s steps into a 5 s time constant: 1 - e^-1 of the way.
        let e5 = stat(&out, 0, 5);
        let expect = 1.0 - (-1.0f64 / 5.0).exp().powi(5);
        assert!((e5 - expect).abs() < 1e-12, "{e5} vs {expect}");
        assert!(stat(&out, 2, 5) < 0.05);
    }

    #[test]
    fn the_baseline_shrugs_off_a_spike_and_rel_shows_it() {
        // 200 ticks at 2, then 5 ticks at 10: the short EWMA jumps, the baseline stays
        // near 2 (clipped inputs, 300 s time constant), so rel is far above 1.
        let mut ring = Ring::new(200, 1);
        let mut ewma = Ewma::new(1, &WINDOWS);
        for i in 1..=205 {
            let v = if i > 200 { 10.0 } else { 2.0 };
            ring.push(i as f64, &[v]);
            ewma.update(i as f64, &[v]);
        }
        assert!(
            (ewma.baseline(0) - 2.0).abs() < 0.05,
            "{}",
            ewma.baseline(0)
        );
        let mut out = vec![0.0; HEAD + 6 * 3];
        let mut walk = Walk::default();
        walk.over(&ring, 205.0, &WINDOWS);
        signal_features(&ring, &ewma, 0, &walk, &mut out);
        assert!(out[2] > 3.0, "rel {}", out[2]);
    }
}

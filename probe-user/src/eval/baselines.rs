//! The simple rules a model must beat, as series transforms per tick for one entity: a
//! time-aware EWMA, a z-score and Prometheus's `predict_linear` (`eval` scores their output
//! as the label's severity).
//!
//! Every function takes the series in time order (`t` in seconds, increasing; `x` the raw
//! signal, NaN = not observed that tick) and returns one score per tick, NaN when it cannot
//! say. All are causal (the score at tick i uses only ticks <= i), and windows are in
//! seconds of `t`, not in ticks, because ticks may be irregular.
use std::collections::VecDeque;

/// The score `zscore` gives when the window's spread rounds to 0 but x is off its mean
/// (a finite stand-in for +/- infinity, so that thresholds and sorting stay simple).
const ZSCORE_CAP: f64 = 1e6;

/// Time-aware EWMA: at each observation the past keeps weight 0.5^(dt / half_life_s),
/// dt being the time since the previous observation. Unobserved ticks carry the last
/// value; NaN before the first observation.
pub fn ewma(t: &[f64], x: &[f64], half_life_s: f64) -> Vec<f64> {
    assert_eq!(t.len(), x.len(), "t and x differ in length");
    let mut state: Option<(f64, f64)> = None; // (value, time of the last observation)
    t.iter()
        .zip(x)
        .map(|(&ti, &xi)| {
            if xi.is_finite() {
                state = Some(match state {
                    None => (xi, ti),
                    Some((e, tl)) => {
                        let w_new = 1.0 - 0.5f64.powf((ti - tl) / half_life_s);
                        // e + w (x - e) rather than (1-w) e + w x: a constant input then
                        // stays exactly constant.
                        (e + w_new * (xi - e), ti)
                    }
                });
            }
            state.map_or(f64::NAN, |(e, _)| e)
        })
        .collect()
}

/// Running sums over the finite points (t, x) of a sliding time window, kept relative to
/// a reference point (kt, kx) inside the window so that unix-time magnitudes do not
/// cancel away the precision, and recomputed from scratch once as many updates have gone
/// by as the window holds (amortised O(1)) so that rounding from adding and removing
/// cannot pile up over a long series.
#[derive(Default)]
struct WindowSums {
    idx: VecDeque<usize>,
    kt: f64,
    kx: f64,
    su: f64,
    sv: f64,
    suu: f64,
    suv: f64,
    svv: f64,
    updates: usize,
}

impl WindowSums {
    fn n(&self) -> f64 {
        self.idx.len() as f64
    }

    fn add(&mut self, u: f64, v: f64, sign: f64) {
        self.su += sign * u;
        self.sv += sign * v;
        self.suu += sign * u * u;
        self.suv += sign * u * v;
        self.svv += sign * v * v;
    }

    /// Enter tick i (if x[i] is finite) and drop the ticks at or before `t[i] - window_s`.
    fn slide(&mut self, t: &[f64], x: &[f64], i: usize, window_s: f64) {
        if x[i].is_finite() {
            if self.idx.is_empty() {
                // Start afresh: drop whatever rounding the emptied sums still hold.
                *self = WindowSums {
                    kt: t[i],
                    kx: x[i],
                    ..WindowSums::default()
                };
            }
            self.idx.push_back(i);
            self.add(t[i] - self.kt, x[i] - self.kx, 1.0);
            self.updates += 1;
        }
        while let Some(&j) = self.idx.front() {
            if t[j] > t[i] - window_s {
                break;
            }
            self.idx.pop_front();
            self.add(t[j] - self.kt, x[j] - self.kx, -1.0);
            self.updates += 1;
        }
        if self.updates > self.idx.len().max(16) {
            self.recompute(t, x);
        }
    }

    fn recompute(&mut self, t: &[f64], x: &[f64]) {
        let idx = std::mem::take(&mut self.idx);
        *self = WindowSums::default();
        if let Some(&j) = idx.front() {
            (self.kt, self.kx) = (t[j], x[j]);
        }
        for &j in &idx {
            self.add(t[j] - self.kt, x[j] - self.kx, 1.0);
        }
        self.idx = idx;
    }
}

/// (x[i] - mean) / std over the finite x in (t[i] - window_s, t[i]] (population std).
/// NaN when x[i] is not finite, with fewer than 3 values, or when all values are equal
/// (std = 0 and x = mean). If the spread rounds to 0 while x is off the mean, +/- 1e6.
/// O(n).
pub fn zscore(t: &[f64], x: &[f64], window_s: f64) -> Vec<f64> {
    assert_eq!(t.len(), x.len(), "t and x differ in length");
    let mut w = WindowSums::default();
    // First tick of the current run of equal finite values: the window holds one value
    // only if it starts at or after this tick. Checked exactly, not through rounding.
    let mut run_start = 0;
    let mut last: Option<f64> = None;
    let mut out = Vec::with_capacity(t.len());
    for i in 0..t.len() {
        w.slide(t, x, i, window_s);
        if x[i].is_finite() && last != Some(x[i]) {
            run_start = i;
            last = Some(x[i]);
        }
        if !x[i].is_finite() || w.idx.len() < 3 {
            out.push(f64::NAN);
            continue;
        }
        if w.idx.front().is_some_and(|&j| j >= run_start) {
            out.push(f64::NAN);
            continue;
        }
        let n = w.n();
        let dev = (x[i] - w.kx) - w.sv / n;
        let var = (w.svv / n - (w.sv / n).powi(2)).max(0.0);
        out.push(if var > 0.0 {
            dev / var.sqrt()
        } else if dev != 0.0 {
            ZSCORE_CAP.copysign(dev)
        } else {
            f64::NAN
        });
    }
    out
}

/// Prometheus's `predict_linear(v[window_s], horizon_s)` at each tick: the ordinary least
/// squares line through the finite points in (t[i] - window_s, t[i]], evaluated at
/// t[i] + horizon_s. NaN with fewer than 2 points. O(n).
pub fn predict_linear(t: &[f64], x: &[f64], window_s: f64, horizon_s: f64) -> Vec<f64> {
    assert_eq!(t.len(), x.len(), "t and x differ in length");
    let mut w = WindowSums::default();
    let mut out = Vec::with_capacity(t.len());
    for i in 0..t.len() {
        w.slide(t, x, i, window_s);
        if w.idx.len() < 2 {
            out.push(f64::NAN);
            continue;
        }
        let n = w.n();
        let (mu, mv) = (w.su / n, w.sv / n);
        let suu = w.suu - w.su * mu; // n * var(t)
        let suv = w.suv - w.su * mv; // n * cov(t, x)
        out.push(if suu > 0.0 {
            let slope = suv / suu;
            w.kx + mv + slope * ((t[i] + horizon_s - w.kt) - mu)
        } else {
            f64::NAN
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1.0)
    }

    /// Same length, NaN where expected NaN, close elsewhere.
    fn assert_series(got: &[f64], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len());
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let ok = if w.is_nan() {
                g.is_nan()
            } else {
                close(g, w, tol)
            };
            assert!(ok, "tick {i}: got {g}, want {w} (all: {got:?})");
        }
    }

    const NAN: f64 = f64::NAN;

    #[test]
    fn ewma_time_aware_by_hand() {
        // Half-life 10 s: after 10 s the past keeps 1/2, after 20 s 1/4.
        // 1 -> 1 + (3-1)/2 = 2 -> 2 + (5-2) * 3/4 = 4.25.
        assert_series(
            &ewma(&[0.0, 10.0, 30.0], &[1.0, 3.0, 5.0], 10.0),
            &[1.0, 2.0, 4.25],
            1e-12,
        );
        // An unobserved tick carries the value and does not restart the clock.
        assert_series(
            &ewma(
                &[0.0, 5.0, 10.0, 15.0, 20.0],
                &[NAN, 1.0, 3.0, NAN, 5.0],
                5.0,
            ),
            &[NAN, 1.0, 2.0, 2.0, 4.25],
            1e-12,
        );
    }

    #[test]
    fn zscore_known_window() {
        // The textbook set 2 4 4 4 5 5 7 9: mean 5, population std 2, so 9 is z = 2.
        let x = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        let t: Vec<f64> = (0..8).map(f64::from).collect();
        let z = zscore(&t, &x, 100.0);
        // Tick 2: {2, 4, 4}, mean 10/3, var 8/9: z = (2/3) / sqrt(8/9) = 1/sqrt(2).
        assert!(z[0].is_nan() && z[1].is_nan());
        assert!(close(z[2], 0.5f64.sqrt(), 1e-12), "{z:?}");
        assert!(close(z[7], 2.0, 1e-12), "{z:?}");
    }

    #[test]
    fn zscore_window_edges_nan_and_constant() {
        // (0, 3] leaves t=0 out: {1, 2, 3}, mean 2, var 2/3 -> z = 1 / sqrt(2/3).
        let z = zscore(&[0.0, 1.0, 2.0, 3.0], &[100.0, 1.0, 2.0, 3.0], 3.0);
        assert!(close(z[3], 1.5f64.sqrt(), 1e-12), "{z:?}");
        // Irregular ticks: at t=10, (7, 10] holds t=7.5, 9, 10 only.
        let z = zscore(&[0.0, 7.5, 9.0, 10.0], &[50.0, 1.0, 2.0, 3.0], 3.0);
        assert!(close(z[3], 1.5f64.sqrt(), 1e-12), "{z:?}");
        // NaN at the tick: NaN; NaN in the window: skipped.
        let z = zscore(&[0.0, 1.0, 2.0, 3.0, 4.0], &[1.0, NAN, 2.0, 3.0, NAN], 10.0);
        assert!(close(z[3], 1.5f64.sqrt(), 1e-12) && z[4].is_nan(), "{z:?}");
        // Constant: std 0 and x = mean -> NaN everywhere; a change afterwards scores.
        let z = zscore(&[0.0, 1.0, 2.0, 3.0, 4.0], &[0.1, 0.1, 0.1, 0.1, 0.3], 10.0);
        assert!(z[..4].iter().all(|v| v.is_nan()), "{z:?}");
        // {0.1 x4, 0.3}: mean 0.14, std 0.08 -> z = 2.
        assert!(close(z[4], 2.0, 1e-9), "{z:?}");
    }

    #[test]
    fn zscore_long_series_matches_two_pass() {
        // 100k irregular ticks at unix-time magnitudes with a small spread: the running
        // sums must agree with the definition computed directly.
        let mut seed = 12345u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let n = 100_000;
        let mut t = Vec::with_capacity(n);
        let mut x = Vec::with_capacity(n);
        let mut now = 1.7e9;
        for _ in 0..n {
            now += 0.5 + rnd();
            t.push(now);
            x.push(if rnd() < 0.05 {
                NAN
            } else {
                0.25 + 1e-5 * rnd()
            });
        }
        let w = 30.0;
        let z = zscore(&t, &x, w);
        for i in (1000..n).step_by(9973) {
            let v: Vec<f64> = (0..=i)
                .filter(|&j| t[j] > t[i] - w && x[j].is_finite())
                .map(|j| x[j])
                .collect();
            let m = v.iter().sum::<f64>() / v.len() as f64;
            let s = (v.iter().map(|a| (a - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
            let want = if x[i].is_finite() {
                (x[i] - m) / s
            } else {
                NAN
            };
            assert_series(&z[i..=i], &[want], 1e-6);
        }
    }

    #[test]
    fn predict_linear_on_a_ramp_is_exact() {
        // x = 2t at unix-time magnitudes and irregular ticks: 2 (t + h) from the 2nd tick.
        let t: Vec<f64> = [0.0, 1.0, 1.5, 4.0, 4.25, 9.0]
            .iter()
            .map(|d| 1.7e9 + d)
            .collect();
        let x: Vec<f64> = t.iter().map(|v| 2.0 * v).collect();
        let p = predict_linear(&t, &x, 5.0, 60.0);
        let mut want: Vec<f64> = t.iter().map(|v| 2.0 * (v + 60.0)).collect();
        want[0] = NAN;
        assert_series(&p, &want, 1e-12);
    }

    #[test]
    fn predict_linear_by_hand() {
        // (0,0), (1,1), (2,0): slope 0, mean 1/3.
        let p = predict_linear(&[0.0, 1.0, 2.0], &[0.0, 1.0, 0.0], 10.0, 100.0);
        assert!(close(p[2], 1.0 / 3.0, 1e-12), "{p:?}");
        // Window (t-3, t]. At t=2: (0,10), (1,1), (2,2): mean t 1, mean x 13/3,
        // Sxy = -(10 - 13/3) + (2 - 13/3) = -8, Stt = 2, slope -4: at t=3, 13/3 - 8.
        // At t=3: t=0 falls out; (1,1), (2,2), (3,3): 3 + h.
        let p = predict_linear(&[0.0, 1.0, 2.0, 3.0], &[10.0, 1.0, 2.0, 3.0], 3.0, 1.0);
        assert_series(&p, &[NAN, -8.0, 13.0 / 3.0 - 8.0, 4.0], 1e-12);
        // NaN points are skipped; one point is not a line.
        let p = predict_linear(&[0.0, 1.0, 2.0], &[1.0, NAN, 3.0], 10.0, 1.0);
        assert_series(&p, &[NAN, NAN, 4.0], 1e-12);
    }
}

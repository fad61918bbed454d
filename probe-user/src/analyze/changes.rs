//! Change points: where the job's behaviour changed, located to the tick. Each signal (RTT,
//! throughput, retransmits, iteration length; in logs, so a change is a ratio) is put on a
//! robust scale (its tick-to-tick noise); at every tick the medians of the `W`
//! ticks before and after are compared, and a tick where the difference peaks above the
//! threshold is a change point (the window method, with medians so that one odd tick is not
//! a change); the location is then refined, near the peak, with window means.
use serde::Serialize;

use super::series::Series;
use crate::stats::median;

/// Ticks on each side of a candidate.
const W: usize = 5;
/// Peak distance (the norm of the signals' differences in noise units) to be a change.
const THRESHOLD: f64 = 3.5;
/// The smallest scale of a signal, in log units (~10%): a flat signal's tiny wobble is not
/// a change.
const MIN_SCALE: f64 = 0.1;

#[derive(Clone, Debug, Serialize)]
pub struct Change {
    pub time_unix: f64,
    /// Seconds from the start of the recording.
    pub at_s: f64,
    pub strength: f64,
    /// "RTT x3.2", "iteration x1.8", ...: the signals that moved most, after/before.
    pub what: Vec<String>,
}

const NAMES: [&str; 4] = ["RTT", "throughput", "retransmits", "iteration"];

fn logs(s: &Series) -> Vec<Vec<f64>> {
    let l = |v: &[f64], off: f64| -> Vec<f64> {
        v.iter()
            .map(|x| {
                if x.is_finite() && *x >= 0.0 {
                    (x + off).ln()
                } else {
                    f64::NAN
                }
            })
            .collect()
    };
    vec![
        l(&s.srtt, 1e-5),
        l(&s.throughput, 1e3),
        l(&s.retransmits, 1.0),
        l(&s.iteration, 1e-3),
    ]
}

fn med(v: &[f64]) -> f64 {
    let mut x: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if x.len() * 2 < v.len() {
        return f64::NAN;
    }
    median(&mut x).unwrap_or(f64::NAN)
}

fn mean(v: &[f64]) -> f64 {
    let x: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if x.len() * 2 < v.len() || x.is_empty() {
        return f64::NAN;
    }
    x.iter().sum::<f64>() / x.len() as f64
}

/// The signals in logs, and each one's tick-to-tick noise (the MAD of the differences over
/// sqrt 2: unlike the MAD of the values, it is not inflated by the very regime changes
/// looked for).
struct Scaled {
    sig: Vec<Vec<f64>>,
    scales: Vec<f64>,
}

impl Scaled {
    fn new(s: &Series) -> Self {
        let sig = logs(s);
        let scales = sig
            .iter()
            .map(|v| {
                let diffs: Vec<f64> = v.windows(2).map(|w| (w[1] - w[0]).abs()).collect();
                (1.4826 * med(&diffs) / std::f64::consts::SQRT_2).max(MIN_SCALE)
            })
            .collect();
        Scaled { sig, scales }
    }

    /// The distance at each tick (NaN near the ends) between the `stat` of the W ticks
    /// before and of the W from it on, in noise units, over all signals.
    fn distance(&self, stat: fn(&[f64]) -> f64) -> Vec<f64> {
        let n = self.sig.first().map_or(0, Vec::len);
        (0..n)
            .map(|i| {
                if i < W || i + W > n {
                    return f64::NAN;
                }
                let (mut sum, mut k) = (0.0, 0);
                for (v, sc) in self.sig.iter().zip(&self.scales) {
                    let d = (stat(&v[i..i + W]) - stat(&v[i - W..i])) / sc;
                    if d.is_finite() {
                        sum += d * d;
                        k += 1;
                    }
                }
                if k == 0 {
                    f64::NAN
                } else {
                    sum.sqrt()
                }
            })
            .collect()
    }
}

/// The change points, and the distance (by window medians) at each tick.
pub fn changes(s: &Series) -> (Vec<Change>, Vec<f64>) {
    let scaled = Scaled::new(s);
    let d = scaled.distance(med);
    // Window medians find a change but flatten its peak over a few ticks (a median does not
    // move until half its window has); window means, within the peak's reach, say where.
    let dm = scaled.distance(mean);
    let sig = &scaled.sig;
    let n = d.len();
    let mut out = Vec::new();
    for i in 0..n {
        if d[i].is_nan() || d[i] < THRESHOLD {
            continue;
        }
        let lo = i.saturating_sub(W);
        let hi = (i + W).min(n - 1);
        // The highest in its neighbourhood (the first of equals).
        if (lo..=hi).any(|j| d[j] > d[i] || (d[j] == d[i] && j < i)) {
            continue;
        }
        let i = (i.saturating_sub(3)..=(i + 3).min(n - 1))
            .filter(|&j| dm[j].is_finite())
            .max_by(|&a, &b| dm[a].total_cmp(&dm[b]))
            .unwrap_or(i);
        if out.last().is_some_and(|c: &Change| c.time_unix >= s.t[i]) {
            continue;
        }
        let mut moved: Vec<(f64, String)> = sig
            .iter()
            .zip(NAMES)
            .filter_map(|(v, name)| {
                let r = (med(&v[i..(i + W).min(n)]) - med(&v[i.saturating_sub(W)..i])).exp();
                r.is_finite().then(|| {
                    let text = if r >= 1.0 {
                        format!("{name} x{r:.1}")
                    } else {
                        format!("{name} /{:.1}", 1.0 / r)
                    };
                    (r.ln().abs(), text)
                })
            })
            .filter(|(m, _)| *m >= 0.2)
            .collect();
        moved.sort_by(|a, b| b.0.total_cmp(&a.0));
        out.push(Change {
            time_unix: s.t[i],
            at_s: s.t[i] - s.t[0],
            strength: d[i],
            what: moved.into_iter().map(|(_, t)| t).collect(),
        });
    }
    (out, d)
}

//! Two jobs or runs side by side: period, jitter, duty cycle, bytes per iteration, burst
//! sizes, pattern, RTT under load and throughput; a difference is significant when a
//! Mann-Whitney U test on the per-iteration (or per-tick) samples gives p < 0.01 and the
//! medians differ by more than 5%.
use serde::Serialize;

use super::{timing, Analysis};
use crate::stats::median;

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub what: String,
    pub a: String,
    pub b: String,
    /// Two-sided p-value (None: not a sample comparison).
    pub p: Option<f64>,
    pub significant: bool,
}

/// Standard normal upper tail.
fn normal_sf(z: f64) -> f64 {
    0.5 * libm::erfc(z / std::f64::consts::SQRT_2)
}

/// Two-sided Mann-Whitney U p-value (normal approximation with tie correction).
pub fn mann_whitney(a: &[f64], b: &[f64]) -> Option<f64> {
    let a: Vec<f64> = a.iter().copied().filter(|x| x.is_finite()).collect();
    let b: Vec<f64> = b.iter().copied().filter(|x| x.is_finite()).collect();
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    if a.len() < 5 || b.len() < 5 {
        return None;
    }
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|x| (*x, true))
        .chain(b.iter().map(|x| (*x, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = all.len();
    let (mut r1, mut ties, mut i) = (0.0, 0.0, 0);
    while i < n {
        let mut j = i;
        while j + 1 < n && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let rank = (i + j) as f64 / 2.0 + 1.0;
        let k = (j - i + 1) as f64;
        ties += k * k * k - k;
        r1 += all[i..=j].iter().filter(|x| x.1).count() as f64 * rank;
        i = j + 1;
    }
    let u = r1 - n1 * (n1 + 1.0) / 2.0;
    let mu = n1 * n2 / 2.0;
    let nn = n1 + n2;
    let var = n1 * n2 / 12.0 * ((nn + 1.0) - ties / (nn * (nn - 1.0)));
    if var <= 0.0 {
        return Some(1.0);
    }
    let z = ((u - mu).abs() - 0.5).max(0.0) / var.sqrt();
    Some((2.0 * normal_sf(z)).min(1.0))
}

fn med(v: &[f64]) -> f64 {
    let mut x: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    median(&mut x).unwrap_or(f64::NAN)
}

/// RTT on the ticks that carry at least half the recording's median throughput.
fn rtt_under_load(a: &Analysis) -> Vec<f64> {
    let m = med(&a.series.throughput);
    a.series
        .srtt
        .iter()
        .zip(&a.series.throughput)
        .filter(|(_, t)| **t >= 0.5 * m)
        .map(|(r, _)| *r)
        .collect()
}

fn samples(what: &str, a: &[f64], b: &[f64], unit: &str, scale: f64, digits: usize) -> Row {
    let (ma, mb) = (med(a), med(b));
    let p = mann_whitney(a, b);
    let rel = (ma - mb).abs() / ma.abs().max(mb.abs());
    Row {
        what: what.to_owned(),
        a: format!(
            "{:.digits$} {unit} (n={})",
            ma * scale,
            a.iter().filter(|x| x.is_finite()).count()
        ),
        b: format!(
            "{:.digits$} {unit} (n={})",
            mb * scale,
            b.iter().filter(|x| x.is_finite()).count()
        ),
        p,
        significant: p.is_some_and(|p| p < 0.01) && rel > 0.05,
    }
}

pub fn compare(a: &Analysis, b: &Analysis) -> Vec<Row> {
    // One value per iteration of a recording.
    let per_iter = |x: &Analysis, f: fn(&timing::Iteration) -> f64| -> Vec<f64> {
        x.timing.iterations.iter().map(f).collect()
    };
    let lens = |x: &Analysis| per_iter(x, |i| i.len);
    let bytes = |x: &Analysis| per_iter(x, |i| i.bytes);
    let duty = |x: &Analysis| per_iter(x, |i| i.busy_s / i.len);
    let steps = |x: &Analysis| {
        x.timing
            .iterations
            .windows(2)
            .map(|w| (w[1].len - w[0].len).abs())
            .collect::<Vec<f64>>()
    };
    let pat = |x: &Analysis| {
        format!(
            "{}{} ({:.0}%)",
            x.pattern.name,
            x.pattern.role.map(|r| format!(", {r}")).unwrap_or_default(),
            100.0 * x.pattern.confidence
        )
    };
    vec![
        Row {
            what: "pattern".into(),
            a: pat(a),
            b: pat(b),
            p: None,
            significant: a.pattern.name != b.pattern.name,
        },
        samples("iteration period", &lens(a), &lens(b), "s", 1.0, 4),
        samples(
            "iteration jitter (|change| between iterations)",
            &steps(a),
            &steps(b),
            "ms",
            1e3,
            2,
        ),
        samples(
            "communication share (duty cycle)",
            &duty(a),
            &duty(b),
            "%",
            100.0,
            1,
        ),
        samples("bytes per iteration", &bytes(a), &bytes(b), "MB", 1e-6, 2),
        samples(
            "RTT under load (largest srtt)",
            &rtt_under_load(a),
            &rtt_under_load(b),
            "ms",
            1e3,
            2,
        ),
        samples(
            "throughput",
            &a.series.throughput,
            &b.series.throughput,
            "MB/s",
            1e-6,
            1,
        ),
        Row {
            what: "burst size p50 / p90 (sent)".into(),
            a: format!(
                "{:.0} / {:.0} B",
                a.timing.burst_bytes_tx.p50, a.timing.burst_bytes_tx.p90
            ),
            b: format!(
                "{:.0} / {:.0} B",
                b.timing.burst_bytes_tx.p50, b.timing.burst_bytes_tx.p90
            ),
            p: None,
            significant: false,
        },
        Row {
            what: "job peers".into(),
            a: a.matrix.job_peers().len().to_string(),
            b: b.matrix.job_peers().len().to_string(),
            p: None,
            significant: a.matrix.job_peers().len() != b.matrix.job_peers().len(),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mann_whitney_tells_shifted_samples_from_equal_ones() {
        let a: Vec<f64> = (0..50).map(|i| (i * 37 % 50) as f64).collect();
        let b: Vec<f64> = a.iter().map(|x| x + 25.0).collect();
        assert!(mann_whitney(&a, &b).unwrap() < 1e-4);
        let c: Vec<f64> = (0..50).map(|i| (i * 13 % 50) as f64).collect();
        assert!(mann_whitney(&a, &c).unwrap() > 0.5);
        assert!(mann_whitney(&a[..3], &c).is_none());
        // scipy.stats.mannwhitneyu([1,2,3,4,5,6],[4,5,6,7,8,9], method="asymptotic"): p=0.0364
        let p = mann_whitney(&[1., 2., 3., 4., 5., 6.], &[4., 5., 6., 7., 8., 9.]).unwrap();
        assert!((p - 0.0364).abs() < 0.001, "{p}");
    }
}

//! Ticks clustered by the job's feature vector (RTT, throughput, retransmits, iteration
//! length; logs, standardised) with k-means (linfa), k from 2 to 4 by the silhouette; each
//! cluster described against the calmest one (the lowest RTT) in words.
use linfa::{prelude::*, DatasetBase};
use linfa_clustering::KMeans;
use ndarray::Array2;
use rand_xoshiro::{rand_core::SeedableRng as _, Xoshiro256Plus};
use serde::Serialize;

use super::series::{Series, FEATURES};
use crate::stats::median;

#[derive(Clone, Debug, Serialize)]
pub struct Cluster {
    pub id: usize,
    pub ticks: usize,
    pub share: f64,
    /// "calm iterations", "congested: RTT x3.1, iteration x2.3", ...
    pub description: String,
    pub calm: bool,
    /// Median of each feature over the cluster's ticks (raw units).
    pub medians: Vec<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Clusters {
    pub k: usize,
    pub silhouette: f64,
    pub clusters: Vec<Cluster>,
    /// Tick times (Unix seconds) and, per tick, its cluster (None: no full vector).
    pub t: Vec<f64>,
    pub of_tick: Vec<Option<usize>>,
}

fn transform(f: &[f64; FEATURES]) -> Option<[f64; FEATURES]> {
    let l = |x: f64, off: f64| (x.is_finite() && x >= 0.0).then(|| (x + off).ln());
    Some([
        l(f[0], 1e-5)?,
        l(f[1], 1e-5)?,
        l(f[2], 1e3)?,
        l(f[3], 1.0)?,
        l(f[4], 1e-3)?,
    ])
}

fn silhouette(x: &Array2<f64>, labels: &[usize], k: usize) -> f64 {
    let n = x.nrows();
    // At most 1,500 points, evenly spaced: the silhouette is O(n^2).
    let step = n.div_ceil(1500).max(1);
    let idx: Vec<usize> = (0..n).step_by(step).collect();
    let dist = |a: usize, b: usize| -> f64 {
        x.row(a)
            .iter()
            .zip(x.row(b).iter())
            .map(|(p, q)| (p - q) * (p - q))
            .sum::<f64>()
            .sqrt()
    };
    let mut total = 0.0;
    for &i in &idx {
        let mut sum = vec![0.0; k];
        let mut cnt = vec![0usize; k];
        for &j in &idx {
            if i != j {
                sum[labels[j]] += dist(i, j);
                cnt[labels[j]] += 1;
            }
        }
        let own = labels[i];
        if cnt[own] == 0 {
            continue;
        }
        let a = sum[own] / cnt[own] as f64;
        let b = (0..k)
            .filter(|&c| c != own && cnt[c] > 0)
            .map(|c| sum[c] / cnt[c] as f64)
            .fold(f64::INFINITY, f64::min);
        if b.is_finite() {
            total += (b - a) / a.max(b);
        }
    }
    total / idx.len() as f64
}

/// What sets a cluster (medians `m`) apart from the calm one (`b`).
fn describe(m: &[f64], b: &[f64]) -> String {
    let ratio = |f: usize| m[f] / b[f];
    let mut parts = Vec::new();
    let (rtt, it, thr) = (ratio(0), ratio(4), ratio(2));
    if rtt.is_finite() && rtt >= 1.3 {
        parts.push(format!("RTT x{rtt:.1}"));
    }
    if it.is_finite() && (it >= 1.15 || it <= 0.87) {
        parts.push(format!("iteration x{it:.1}"));
    }
    if thr.is_finite() && (thr >= 1.3 || thr <= 0.77) {
        parts.push(format!("throughput x{thr:.2}"));
    }
    if m[3] >= 1.0 && m[3] >= 3.0 * b[3].max(0.1) {
        parts.push(format!("{:.0} retransmits/s", m[3]));
    }
    let congested = (rtt.is_finite() && rtt >= 1.5)
        || (it.is_finite() && it >= 1.3)
        || (m[3] >= 1.0 && m[3] >= 3.0 * b[3].max(0.1));
    let name = if congested {
        "congested"
    } else if thr.is_finite() && thr <= 0.2 {
        "idle"
    } else {
        "near calm"
    };
    if parts.is_empty() {
        name.to_owned()
    } else {
        format!("{name}: {}", parts.join(", "))
    }
}

/// k-means for k = 2..4 (seeded), the k with the best silhouette: (silhouette, k, labels).
fn best_kmeans(x: &Array2<f64>) -> Option<(f64, usize, Vec<usize>)> {
    let data = DatasetBase::from(x.clone());
    let mut best: Option<(f64, usize, Vec<usize>)> = None;
    for k in 2..=4 {
        let Ok(model) = KMeans::params_with_rng(k, Xoshiro256Plus::seed_from_u64(7))
            .n_runs(5)
            .max_n_iterations(300)
            .tolerance(1e-6)
            .fit(&data)
        else {
            continue;
        };
        let labels: Vec<usize> = model.predict(x).to_vec();
        let sil = silhouette(x, &labels, k);
        if best.as_ref().is_none_or(|b| sil > b.0) {
            best = Some((sil, k, labels));
        }
    }
    best
}

/// The ticks' features, with the slowest known iteration standing in for an unknown one.
fn with_slowest_iteration(s: &Series) -> Vec<[f64; FEATURES]> {
    // A tick without a known iteration is in a stretch where iterations could not be told
    // apart (stalled, or far slower than usual): the slowest known iteration stands in.
    let slowest = s
        .features
        .iter()
        .map(|f| f[4])
        .filter(|x| x.is_finite())
        .fold(f64::NAN, f64::max);
    s.features
        .iter()
        .map(|f| {
            let mut f = *f;
            if !f[4].is_finite() {
                f[4] = slowest;
            }
            f
        })
        .collect()
}

/// The transformed rows as a matrix, each column standardised (so no feature dominates).
fn standardised(rows: &[(usize, [f64; FEATURES])]) -> Array2<f64> {
    let mut x = Array2::<f64>::zeros((rows.len(), FEATURES));
    for (r, (_, v)) in rows.iter().enumerate() {
        for c in 0..FEATURES {
            x[[r, c]] = v[c];
        }
    }
    for c in 0..FEATURES {
        let col = x.column(c);
        let mean = col.mean().unwrap_or(0.0);
        let sd = col.std(0.0).max(0.05);
        x.column_mut(c).mapv_inplace(|v| (v - mean) / sd);
    }
    x
}

/// Median of each feature (raw units) over the given ticks.
fn feature_medians(features: &[[f64; FEATURES]], ticks: &[usize]) -> Vec<f64> {
    (0..FEATURES)
        .map(|f| {
            let mut v: Vec<f64> = ticks.iter().map(|&i| features[i][f]).collect();
            median(&mut v).unwrap_or(f64::NAN)
        })
        .collect()
}

/// Which of the clusters (by their `medians`) is the calm one, against the `overall` medians.
fn calmest(medians: &[Vec<f64>], overall: &[f64]) -> usize {
    // Calm: the cluster with the least trouble against the recording as a whole: low RTT,
    // short iterations, high throughput, few retransmits (a stall has a low RTT too, for
    // want of traffic, but no throughput).
    let trouble = |m: &[f64]| -> f64 {
        (m[0] / overall[0]).ln()
            + (m[4] / overall[4]).ln()
            + (overall[2] / m[2]).ln()
            + ((1.0 + m[3]) / (1.0 + overall[3])).ln()
    };
    (0..medians.len())
        .filter(|&c| trouble(&medians[c]).is_finite())
        .min_by(|&a, &b| trouble(&medians[a]).total_cmp(&trouble(&medians[b])))
        .unwrap_or(0)
}

/// Each cluster's size and medians, described against the calm one.
fn describe_clusters(medians: &[Vec<f64>], labels: &[usize], calm: usize) -> Vec<Cluster> {
    (0..medians.len())
        .map(|c| {
            let ticks = labels.iter().filter(|l| **l == c).count();
            let description = if c == calm {
                "calm iterations".to_owned()
            } else {
                describe(&medians[c], &medians[calm])
            };
            Cluster {
                id: c,
                ticks,
                share: ticks as f64 / labels.len() as f64,
                description,
                calm: c == calm,
                medians: medians[c].clone(),
            }
        })
        .collect()
}

pub fn cluster(s: &Series) -> Option<Clusters> {
    let features = with_slowest_iteration(s);
    let rows: Vec<(usize, [f64; FEATURES])> = features
        .iter()
        .enumerate()
        .filter_map(|(i, f)| Some((i, transform(f)?)))
        .collect();
    if rows.len() < 20 {
        return None;
    }
    let (sil, k, labels) = best_kmeans(&standardised(&rows))?;
    let mut of_tick = vec![None; s.t.len()];
    for ((i, _), l) in rows.iter().zip(&labels) {
        of_tick[*i] = Some(*l);
    }
    let medians: Vec<Vec<f64>> = (0..k)
        .map(|c| {
            let ticks: Vec<usize> = rows
                .iter()
                .zip(&labels)
                .filter(|(_, l)| **l == c)
                .map(|((i, _), _)| *i)
                .collect();
            feature_medians(&features, &ticks)
        })
        .collect();
    let all: Vec<usize> = rows.iter().map(|(i, _)| *i).collect();
    let calm = calmest(&medians, &feature_medians(&features, &all));
    Some(Clusters {
        k,
        silhouette: sil,
        clusters: describe_clusters(&medians, &labels, calm),
        t: s.t.clone(),
        of_tick,
    })
}

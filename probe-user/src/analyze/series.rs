//! The host's view of the job tick by tick, from the observations of the job's peers: the
//! signals change points are found on, and the feature vectors windows are clustered by
//! (the daemon's own features, replayed: one code path live and offline).
use super::{load::Recording, timing::Iteration};
use crate::{
    dataset::{recording_tick, replay},
    features::{FeatureConfig, FeatureRow},
    observe::PEER,
};

#[derive(serde::Serialize)]
pub struct Series {
    pub t: Vec<f64>,
    pub tick_s: f64,
    /// Largest smoothed RTT among the job's peers, seconds (NaN: none known).
    pub srtt: Vec<f64>,
    /// Bytes per second to and from the job's peers.
    pub throughput: Vec<f64>,
    /// Retransmits per second to the job's peers.
    pub retransmits: Vec<f64>,
    /// Length of the iteration under way at the tick, seconds (NaN: none).
    pub iteration: Vec<f64>,
    /// Per tick, the clustering vector from the features (NaN where unknown).
    #[serde(skip)]
    pub features: Vec<[f64; FEATURES]>,
}

pub const FEATURES: usize = 5;

fn fold_max(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        b
    } else if b.is_nan() {
        a
    } else {
        a.max(b)
    }
}

fn fold_sum(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        b
    } else if b.is_nan() {
        a
    } else {
        a + b
    }
}

pub fn series(rec: &Recording, job: &[String], iterations: &[Iteration]) -> Series {
    let mut t: Vec<f64> = rec.obs.iter().map(|o| o.time_unix).collect();
    t.dedup();
    let n = t.len();
    let index = |time: f64| t.partition_point(|x| *x < time);
    let (mut srtt, mut thr, mut retr) = (vec![f64::NAN; n], vec![f64::NAN; n], vec![f64::NAN; n]);
    for o in rec
        .obs
        .iter()
        .filter(|o| o.entity_kind == PEER && job.contains(&o.entity))
    {
        let i = index(o.time_unix);
        srtt[i] = fold_max(srtt[i], o.srtt_s.unwrap_or(f64::NAN));
        let b = match (o.tx_bytes_per_s, o.rx_bytes_per_s) {
            (Some(a), Some(b)) => a + b,
            _ => f64::NAN,
        };
        thr[i] = fold_sum(thr[i], b);
        retr[i] = fold_sum(retr[i], o.retransmits_per_s.unwrap_or(f64::NAN));
    }
    // The iteration under way at each tick: the last one that started by then. One over 4x
    // the median is not an iteration but a stretch where the iterations could not be told
    // apart (the marker direction busy with other traffic too): unknown.
    let typical = {
        let mut l: Vec<f64> = iterations.iter().map(|i| i.len).collect();
        crate::stats::median(&mut l).unwrap_or(f64::NAN)
    };
    let iteration: Vec<f64> = t
        .iter()
        .map(|&x| {
            let k = iterations.partition_point(|it| it.start <= x);
            if k == 0 {
                return f64::NAN;
            }
            let it = &iterations[k - 1];
            // Past the end of the last iteration: unknown.
            if x > it.start + 2.0 * it.len || it.len > 4.0 * typical {
                f64::NAN
            } else {
                it.len
            }
        })
        .collect();
    let tick = recording_tick(&rec.path, &rec.obs);
    let rows = replay(
        &rec.obs,
        &rec.events,
        FeatureConfig {
            tick,
            ..FeatureConfig::default()
        },
    );
    let mut features = vec![[f64::NAN; FEATURES]; n];
    let get = |r: &FeatureRow, name: &str| r.get(name).unwrap_or(f64::NAN);
    for r in rows
        .iter()
        .filter(|r| r.entity_kind == PEER && job.contains(&r.entity))
    {
        let i = index(r.time_unix);
        if i >= n {
            continue;
        }
        let f = &mut features[i];
        f[0] = fold_max(f[0], get(r, "srtt_mean_5s"));
        f[1] = fold_max(f[1], get(r, "rtt_p99_mean_5s"));
        f[2] = fold_sum(
            f[2],
            fold_sum(get(r, "tx_bytes_mean_5s"), get(r, "rx_bytes_mean_5s")),
        );
        f[3] = fold_sum(f[3], get(r, "retransmits_mean_5s"));
    }
    for (f, it) in features.iter_mut().zip(&iteration) {
        f[4] = *it;
    }
    Series {
        t,
        tick_s: tick.as_secs_f64(),
        srtt,
        throughput: thr,
        retransmits: retr,
        iteration,
        features,
    }
}

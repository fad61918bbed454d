//! The iteration period the feature stage finds in rank 0's traffic against traingen's own
//! log of its iterations, for each communication pattern: a calm 4-rank lab run recorded by
//! the probe, replayed with `probe features`, and the median `iteration_period_s` of the
//! peers that carry the job's traffic compared with the median iteration time rank 0
//! logged (within 10%).
use std::path::PathBuf;

use super::{
    record::tests::{read_recording, recorded_args, LAB},
    run, summary, Pattern,
};

const DURATION_S: f64 = 24.0;
/// Ticks before this many seconds are left out: the period needs a few seconds of bursts.
const WARMUP_S: f64 = 8.0;
const TOLERANCE: f64 = 0.10;

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

fn probe_bin() -> PathBuf {
    std::env::var_os("PROBE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::build::target_dir().join("debug").join("probe"))
}

/// (traingen's median iteration, the probe's median period) for one calm run.
fn periods(pattern: Pattern, period_ms: u64) -> (f64, f64) {
    let dir = std::env::temp_dir().join(format!(
        "lab-period-test-{}-{}",
        std::process::id(),
        pattern.name()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    run(recorded_args(&dir, pattern, 4, period_ms, DURATION_S))
        .expect("the lab runs with --record");
    let features = dir.join("features.parquet");
    let out = std::process::Command::new(probe_bin())
        .args(["features", "--data"])
        .arg(dir.join("recording.parquet"))
        .arg("--out")
        .arg(&features)
        .output()
        .expect("probe features runs");
    assert!(
        out.status.success(),
        "probe features: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let iters = summary::read_iters(&dir.join("rank0.jsonl")).expect("rank 0's log");
    let logged = median(iters.iter().map(|i| i.duration_s).collect()).expect("iterations");
    let (_, rows) = read_recording(&features);
    let t0 = rows.iter().map(|r| r.t).fold(f64::INFINITY, f64::min);
    // The job's peers: the ones rank 0 exchanged most of its bytes with.
    let bytes = |e: &str| -> f64 {
        rows.iter()
            .filter(|r| r.kind == "peer" && r.entity == e)
            .filter_map(|r| Some(r.num.get("tx_bytes_last")? + r.num.get("rx_bytes_last")?))
            .sum()
    };
    let mut peers: Vec<String> = rows
        .iter()
        .filter(|r| r.kind == "peer")
        .map(|r| r.entity.clone())
        .collect();
    peers.sort();
    peers.dedup();
    let most = peers.iter().map(|p| bytes(p)).fold(0.0, f64::max);
    let job: Vec<&String> = peers.iter().filter(|p| bytes(p) > 0.2 * most).collect();
    let found: Vec<f64> = rows
        .iter()
        .filter(|r| r.kind == "peer" && job.contains(&&r.entity) && r.t > t0 + WARMUP_S)
        .filter_map(|r| r.num.get("iteration_period_s").copied())
        .collect();
    eprintln!(
        "lab period test, {}: traingen median iteration {:.4} s over {} iterations; peers {job:?}: {} ticks with a period, median {:?}",
        pattern.name(),
        logged,
        iters.len(),
        found.len(),
        median(found.clone())
    );
    let _ = std::fs::remove_dir_all(&dir);
    (
        logged,
        median(found).expect("no iteration period found for the job's peers"),
    )
}

#[test]
fn the_period_matches_traingen_for_every_pattern() {
    if !crate::build::is_root() {
        eprintln!("skipped the_period_matches_traingen_for_every_pattern: it needs root");
        return;
    }
    let _turn = LAB.lock().unwrap_or_else(|e| e.into_inner());
    for (pattern, period_ms) in [
        (Pattern::Ring, 200),
        (Pattern::Pipeline, 150),
        (Pattern::Ps, 250),
    ] {
        let (logged, found) = periods(pattern, period_ms);
        assert!(
            (found - logged).abs() / logged <= TOLERANCE,
            "{}: period {found:.4} s, traingen's median iteration {logged:.4} s",
            pattern.name()
        );
    }
}

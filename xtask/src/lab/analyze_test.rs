//! `probe analyze` against what the lab ran. Six calm runs (ring, pipeline and parameter
//! server, at 4 and 6 ranks): the pattern is the lab's, and the period is within 10% of
//! traingen's own median iteration time (read here from rank 0's log); at 4 ranks, so is
//! the iteration period the feature stage finds in rank 0's job peers (the recording
//! replayed with `probe features`: the median `iteration_period_s` of the peers that carry
//! the job's traffic, after the first 8 s). One run with abrupt
//! tbf episodes: the start and end of every episode that slowed training by x1.3 or more
//! (traingen's own log) is a change point within 2 ticks of the time the lab logged (milder
//! ones are reported), and the episodes are a cluster of their own. Then the HTML report is
//! opened in headless Chromium: it loads, and its screenshot is not blank. A run found wrong
//! is run once more and must be right then; the first failure is printed and its directory
//! kept.
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{
    record::tests::{probe_ok, read_recording, recorded_args, LAB},
    run,
    schedule::Kind,
    summary, LabArgs, OnOff, Pattern,
};

const TOLERANCE: f64 = 0.10;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn lab_run(
    dir: &Path,
    pattern: Pattern,
    ranks: u16,
    period_ms: u64,
    duration: f64,
    kinds: Vec<Kind>,
) {
    let _ = std::fs::remove_dir_all(dir);
    run(LabArgs {
        seed: 3,
        episodes: if kinds.is_empty() {
            OnOff::Off
        } else {
            OnOff::On
        },
        kinds,
        ..recorded_args(dir, pattern, ranks, period_ms, duration)
    })
    .expect("the lab runs with --record");
}

/// `probe analyze DIR --out OUT`; the analysis of DIR.
fn analyze(dir: &Path, out: &Path) -> Value {
    probe_ok([
        "analyze".as_ref(),
        dir.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    let name = dir.file_name().unwrap();
    serde_json::from_slice(&std::fs::read(out.join(name).join("analysis.json")).unwrap()).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("lab-analyze-test-{}-{name}", std::process::id()))
}

/// Ticks before this many seconds are left out of the feature stage's period: it needs a
/// few seconds of bursts.
const PERIOD_WARMUP_S: f64 = 8.0;

/// The median iteration period the feature stage finds in the recording of `dir`, over the
/// peers that carry the job's traffic (those rank 0 exchanged most of its bytes with).
fn feature_period(dir: &Path) -> Option<f64> {
    let features = dir.join("features.parquet");
    probe_ok([
        "features".as_ref(),
        "--data".as_ref(),
        dir.join("recording.parquet").as_os_str(),
        "--out".as_ref(),
        features.as_os_str(),
    ]);
    let (_, rows) = read_recording(&features);
    let t0 = rows.iter().map(|r| r.t).fold(f64::INFINITY, f64::min);
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
        .filter(|r| r.kind == "peer" && job.contains(&&r.entity) && r.t > t0 + PERIOD_WARMUP_S)
        .filter_map(|r| r.num.get("iteration_period_s").copied())
        .collect();
    (!found.is_empty()).then(|| median(found))
}

/// One calm lab run of `pattern` analyzed: None if the pattern and the period are right,
/// else what was wrong, with the analysis's view of the peers and classes (why it chose no
/// job or another pattern).
fn calm_case(
    pattern: Pattern,
    ranks: u16,
    period_ms: u64,
    expected: &str,
    attempt: u32,
    out: &Path,
) -> Option<String> {
    let dir = tmp(&format!("{}-{ranks}-{attempt}", pattern.name()));
    lab_run(&dir, pattern, ranks, period_ms, 20.0, Vec::new());
    let a = analyze(&dir, out);
    let iters = summary::read_iters(&dir.join("rank0.jsonl")).expect("rank 0's log");
    let logged = median(iters.iter().map(|i| i.duration_s).collect());
    let found = a["timing"]["period_s"].as_f64().unwrap_or(f64::NAN);
    let name = a["pattern"]["name"].as_str().unwrap_or("");
    eprintln!(
        "analyze test, {} x{ranks}: pattern {name} ({:.2}), period {found:.4} s, traingen median {logged:.4} s ({} iterations)",
        pattern.name(),
        a["pattern"]["confidence"].as_f64().unwrap_or(0.0),
        iters.len()
    );
    let mut wrong = Vec::new();
    if name != expected {
        wrong.push(format!(
            "pattern {name}, expected {expected}: {}",
            a["pattern"]["evidence"]
        ));
    }
    if (found - logged).abs() / logged > TOLERANCE || !found.is_finite() {
        wrong.push(format!("period {found:.4} s, traingen {logged:.4} s"));
    }
    if ranks == 4 {
        let features = feature_period(&dir);
        eprintln!(
            "analyze test, {} x{ranks}: the feature stage's period {features:?}",
            pattern.name()
        );
        match features {
            Some(f) if (f - logged).abs() / logged <= TOLERANCE => {}
            f => wrong.push(format!(
                "the feature stage's period {f:?} s, traingen {logged:.4} s"
            )),
        }
    }
    if wrong.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
        return None;
    }
    // Kept, with its analysis beside it, for whoever reads this failure (CI's /tmp stays
    // on the machine for the next session).
    let kept = dir.join("analysis.json");
    let _ = std::fs::write(&kept, serde_json::to_vec_pretty(&a).unwrap_or_default());
    Some(format!(
        "{} x{ranks} (attempt {attempt}): {}; peers {}; classes {}; run kept in {}",
        pattern.name(),
        wrong.join("; "),
        a["matrix"]["peers"],
        a["classes"],
        dir.display()
    ))
}

/// A case that fails is run once more, and the test fails if it fails again. CI twice saw a
/// ring x4 run named `unknown` with no period; the kept directory of the second showed why:
/// the period vote picked 4x the iteration (the ring's sends peak there), and a marker cut
/// at 4x found no iterations. `timing::fundamental` mends that, with the rhythm of the
/// classes' burst starts since stop 31 (two recordings where every occupancy period was 2x
/// or 4x are kept in tests/fixtures/lab-ring4 and checked in tests/tests/analyze.rs). The rerun keeps a rare
/// failure from failing the suite while a broken analysis (wrong every time) still fails
/// it; the first failure is printed in full and its run directory kept, so that it can be
/// studied.
#[test]
fn analyze_names_the_pattern_and_period_of_every_lab_pattern() {
    if !crate::build::is_root() {
        eprintln!(
            "skipped analyze_names_the_pattern_and_period_of_every_lab_pattern: it needs root"
        );
        return;
    }
    let _turn = LAB.lock().unwrap_or_else(|e| e.into_inner());
    let out = tmp("out");
    let mut failures = Vec::new();
    for ranks in [4u16, 6] {
        for (pattern, period_ms, expected) in [
            (Pattern::Ring, 200, "ring"),
            (Pattern::Pipeline, 100, "pipeline"),
            (Pattern::Ps, 250, "parameter-server"),
        ] {
            let Some(first) = calm_case(pattern, ranks, period_ms, expected, 1, &out) else {
                continue;
            };
            eprintln!("analyze test: FAILED ONCE, running it again: {first}");
            if let Some(again) = calm_case(pattern, ranks, period_ms, expected, 2, &out) {
                failures.push(first);
                failures.push(again);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    assert!(failures.is_empty(), "{failures:#?}");
}

#[derive(serde::Deserialize)]
struct Truth {
    t_start: f64,
    t_end: f64,
    onset: String,
    seq: usize,
}

/// Episodes that slowed training by less than this (traingen's own iteration times, from
/// the lab's summary) are reported but not required as change points: the detector's noise
/// floor is a 10% move per signal, and a 250 Mbit/s tbf on one link of a ring at 1 Gbit/s
/// slows it by about x1.17 on a fast machine, which is found in most runs, not all.
const CLEAR_SLOWDOWN: f64 = 1.3;

/// Each episode's slowdown (mean iteration time over the calm mean) by seq, from the lab's
/// summary.json.
fn slowdowns(dir: &Path) -> std::collections::HashMap<usize, f64> {
    let s: Value =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
    s["summary"]["episodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e["seq"].as_u64()? as usize, e["slowdown"].as_f64()?)))
        .collect()
}

#[test]
fn analyze_finds_abrupt_episodes_as_change_points_and_a_cluster_and_its_report_renders() {
    if !crate::build::is_root() {
        eprintln!("skipped analyze_finds_abrupt_episodes...: it needs root");
        return;
    }
    let _turn = LAB.lock().unwrap_or_else(|e| e.into_inner());
    // As in the calm cases, a run wrong once is run again and must be right then: a full
    // suite once saw 17 of 25 calm ticks in the calm cluster (the bar is 70%), and the same
    // test alone right after put 25 of 25 there.
    let first = tbf_case(1);
    if first.is_empty() {
        return;
    }
    eprintln!("analyze test: FAILED ONCE, running it again: {first:#?}");
    let again = tbf_case(2);
    assert!(again.is_empty(), "{first:#?}\n{again:#?}");
}

/// One 100 s ring run with abrupt tbf episodes, analyzed: what was wrong (empty if nothing).
/// A failed run's directory is kept, with its analysis.
fn tbf_case(attempt: u32) -> Vec<String> {
    let dir = tmp(&format!("tbf-{attempt}"));
    let out = tmp(&format!("tbf-out-{attempt}"));
    lab_run(&dir, Pattern::Ring, 4, 200, 100.0, vec![Kind::Tbf]);
    let a = analyze(&dir, &out);
    let truth: Vec<Truth> = std::fs::read_to_string(dir.join("ground_truth.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|t: &Truth| t.onset == "abrupt")
        .collect();
    assert!(!truth.is_empty(), "the lab ran no abrupt episode");
    // The tick, from the recording's own tick times.
    let t: Vec<f64> = a["clusters"]["t"]
        .as_array()
        .expect("clusters")
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    let tick = median(t.windows(2).map(|w| w[1] - w[0]).collect());
    let changes: Vec<f64> = a["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["time_unix"].as_f64())
        .collect();
    let slowdown = slowdowns(&dir);
    let mut failures = Vec::new();
    let mut clear = 0;
    // Edges of clear episodes with no change point near them. One is allowed: the detector's
    // measured recall is 45 of 58 abrupt edges on runs it never saw (docs/analyze.md), and
    // a run's rare miss of one edge (CI once saw an x1.89 start missed while its end and
    // three other episodes were found) says nothing about a broken detector, which misses
    // most.
    let mut missed = Vec::new();
    for e in &truth {
        let x = slowdown.get(&e.seq).copied().unwrap_or(f64::NAN);
        let required = x >= CLEAR_SLOWDOWN;
        clear += usize::from(required);
        for (edge, at) in [("start", e.t_start), ("end", e.t_end)] {
            // A tick shows what happened in the interval before it: the first tick that can
            // show an edge is up to one tick after it. Within 2 ticks of that.
            let ok = changes
                .iter()
                .any(|c| *c - at >= -2.0 * tick && *c - at <= 3.0 * tick);
            eprintln!(
                "analyze test: episode {} {edge} (slowdown x{x:.2}{}) at {at:.1}: change points {:?}",
                e.seq,
                if required { "" } else { ", not required" },
                changes
                    .iter()
                    .map(|c| ((c - at) / tick * 10.0).round() / 10.0)
                    .filter(|d| d.abs() < 10.0)
                    .collect::<Vec<_>>()
            );
            if !ok && required {
                missed.push(format!(
                    "no change point within 2 ticks of the episode {edge} at {at:.1}"
                ));
            }
        }
    }
    if missed.len() > 1 {
        failures.extend(missed);
    }
    if clear < 2 {
        failures.push(format!(
            "only {clear} abrupt episode(s) slowed training by x{CLEAR_SLOWDOWN} or more: the run does not test the detector"
        ));
    }
    // Episode ticks (after their first 5 s: the features are 5 s windows) outside the calm
    // cluster; ticks outside every episode (and 6 s past its end) in it.
    let of: Vec<Option<u64>> = a["clusters"]["of_tick"]
        .as_array()
        .unwrap()
        .iter()
        .map(Value::as_u64)
        .collect();
    let calm = a["clusters"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["calm"] == true)
        .and_then(|c| c["id"].as_u64());
    let (mut inside, mut outside) = ((0, 0), (0, 0));
    for (t, k) in t.iter().zip(&of) {
        let Some(k) = k else { continue };
        if truth.iter().any(|e| e.t_start + 5.0 <= *t && *t <= e.t_end) {
            inside.0 += (Some(*k) != calm) as usize;
            inside.1 += 1;
        } else if !truth
            .iter()
            .any(|e| e.t_start - 1.0 <= *t && *t <= e.t_end + 6.0)
        {
            outside.0 += (Some(*k) == calm) as usize;
            outside.1 += 1;
        }
    }
    eprintln!("analyze test: episode ticks not calm {inside:?}, calm ticks calm {outside:?}");
    if inside.1 == 0 || (inside.0 as f64) < 0.7 * inside.1 as f64 {
        failures.push(format!(
            "episode ticks outside the calm cluster: {inside:?}"
        ));
    }
    if outside.1 == 0 || (outside.0 as f64) < 0.7 * outside.1 as f64 {
        failures.push(format!("calm ticks in the calm cluster: {outside:?}"));
    }
    screenshot(
        &out.join(dir.file_name().unwrap()).join("report.html"),
        &mut failures,
    );
    if failures.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&out);
    } else {
        failures.push(format!(
            "run kept in {}, its analysis in {}",
            dir.display(),
            out.display()
        ));
    }
    failures
}

/// Opens the report in headless Chromium: the page's DOM holds its figures, nothing was
/// logged as a console error, and a screenshot has far more than a blank page's colours.
fn screenshot(report: &Path, failures: &mut Vec<String>) {
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("chromium is installed (cargo xtask setup)");
    let profile = tempdir("chromium-profile");
    let png = report.with_file_name("screenshot.png");
    let url = format!("file://{}", report.display());
    let common = |c: &mut std::process::Command| {
        c.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()));
    };
    let mut dom = std::process::Command::new(chromium);
    common(&mut dom);
    let o = dom
        .args(["--dump-dom", &url])
        .output()
        .expect("chromium runs");
    let html = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    let figures = html.matches("<svg").count();
    if figures < 3 {
        failures.push(format!(
            "the report's DOM has {figures} SVG figures, expected 3"
        ));
    }
    for line in stderr
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
    {
        failures.push(format!("chromium logged: {line}"));
    }
    let mut shot = std::process::Command::new(chromium);
    common(&mut shot);
    let o = shot
        .arg(format!("--screenshot={}", png.display()))
        .arg("--window-size=1200,2400")
        .arg(&url)
        .output()
        .expect("chromium runs");
    let colours = distinct_colours(&png);
    eprintln!(
        "analyze test: screenshot {} has {colours} distinct colours",
        png.display()
    );
    if colours < 20 {
        failures.push(format!(
            "the screenshot has {colours} distinct colours: blank? {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    let _ = std::fs::remove_dir_all(&profile);
}

fn tempdir(name: &str) -> PathBuf {
    let d = tmp(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Distinct RGB colours in a PNG (0 if it does not decode).
fn distinct_colours(png: &Path) -> usize {
    let Ok(file) = std::fs::File::open(png) else {
        return 0;
    };
    let decoder = png::Decoder::new(std::io::BufReader::new(file));
    let Ok(mut reader) = decoder.read_info() else {
        return 0;
    };
    let mut buf = vec![0; reader.output_buffer_size()];
    let Ok(info) = reader.next_frame(&mut buf) else {
        return 0;
    };
    let step = info.color_type.samples();
    let mut seen = std::collections::HashSet::new();
    for px in buf[..info.buffer_size()].chunks(step) {
        if px.len() >= 3 {
            seen.insert((px[0], px[1], px[2]));
        }
    }
    seen.len()
}

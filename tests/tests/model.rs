//! The spike model end to end, on a recording this test makes: iperf3 between two
//! namespaces while a tbf bottleneck is put on and taken off the sender's interface four
//! times (each time the RTT jumps from well under a millisecond to tens of milliseconds:
//! an RTT spike by the labels' definition). Then `probe features` -> `probe train` ->
//! `probe eval` -> a daemon with `--model` serving `probe_spike_probability` on /metrics;
//! SIGHUP with a damaged model keeps the old one serving, SIGHUP with a good one swaps it;
//! and `probe run --model` with a bad directory is one clear line before anything starts.
use probe_tests::{
    cmd,
    iperf::{self, ClientOpts},
    probe::{self, assert_cli_error, run_to_exit},
    Pair, Probe, ProbeOpts,
};
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

const RECORD_S: u64 = 75;
/// Seconds after the start at which the bottleneck goes on, for 5 s each: 9 s of calm
/// between them, so that each is an onset under `--quiet 5s` (the labels' calm before an
/// onset), and the last falls in the validation part of the time split (after 70%).
const SPIKES_AT: [u64; 4] = [16, 30, 44, 58];

/// A fresh directory of the test `what`'s own: the tests of this file run in parallel
/// threads of one process, and a directory by pid alone was one test's to remove while the
/// other wrote into it.
fn dir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("probe-model-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn probe_cli(args: &[&str]) -> Command {
    let mut c = Command::new(probe::probe_bin_checked());
    c.args(args);
    c
}

fn run_ok(args: &[&str]) -> String {
    let o = run_to_exit(probe_cli(args), Duration::from_secs(300)).unwrap();
    assert!(
        o.status.success(),
        "probe {} failed:\n{}",
        args.join(" "),
        o.stderr
    );
    o.stderr
}

fn tbf(pair: &Pair, on: bool) {
    let iface = pair.veth_a.as_str();
    let argv: Vec<&str> = if on {
        vec![
            "tc", "qdisc", "replace", "dev", iface, "root", "tbf", "rate", "30mbit", "burst",
            "32kb", "latency", "100ms",
        ]
    } else {
        vec!["tc", "qdisc", "del", "dev", iface, "root"]
    };
    pair.a.run(&argv).unwrap();
}

/// Records RECORD_S seconds of iperf3 with the bottleneck episodes; returns the file.
fn record(pair: &Pair, d: &Path) -> PathBuf {
    let rec = d.join("rec.parquet");
    let _server = iperf::Server::start(&pair.b, pair.ip_b.into(), iperf::PORT).unwrap();
    let probe = Probe::start(&pair.a, ProbeOpts::iface(&pair.veth_a).tick("500ms"));
    let mut recorder = probe::start_recorder(&pair.a, &probe, &rec, RECORD_S).unwrap();
    let _client = iperf::Client::start(
        &pair.a,
        pair.ip_b.into(),
        iperf::PORT,
        &ClientOpts::tcp(RECORD_S as u32 + 5).congestion("cubic"),
    )
    .unwrap();
    let start = Instant::now();
    for at in SPIKES_AT {
        std::thread::sleep(Duration::from_secs(at).saturating_sub(start.elapsed()));
        tbf(pair, true);
        std::thread::sleep(Duration::from_secs(5));
        tbf(pair, false);
    }
    let status = recorder.wait_timeout(Duration::from_secs(RECORD_S + 20));
    assert!(
        status.is_some_and(|s| s.success()),
        "probe record failed: {}",
        recorder.stderr()
    );
    rec
}

#[test]
fn train_eval_serve_reload() {
    cmd::require_root_and(&["ip", "nsenter", "tc", "iperf3"]);
    let pair = Pair::new(87).unwrap();
    let d = dir("e2e");
    let rec = record(&pair, &d);
    let table = d.join("features.parquet");
    let model = d.join("model");
    let report = d.join("report");
    let (rec_s, table_s, model_s, report_s) = (
        rec.to_str().unwrap(),
        table.to_str().unwrap(),
        model.to_str().unwrap(),
        report.to_str().unwrap(),
    );
    // A 75 s recording: the calm level may settle in 10 s, and an onset may follow 5 s of
    // calm (the defaults, 60 s and 30 s, are for runs of many minutes).
    run_ok(&[
        "features",
        "--horizons",
        "5s",
        "--calm-min",
        "10s",
        "--quiet",
        "5s",
        "--data",
        rec_s,
        "--out",
        table_s,
    ]);
    let log = run_ok(&[
        "train",
        "--name",
        "e2e",
        "--trained-on",
        "the e2e test",
        // Plumbing, not skill: one recording's test split has no onset to judge by.
        "--no-gate",
        "--data",
        table_s,
        "--out",
        model_s,
    ]);
    eprintln!("{log}");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("manifest.json")).unwrap())
            .unwrap();
    let spike = manifest["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["target"] == "rtt_spike" && m["entity_kind"] == "peer")
        .unwrap_or_else(|| panic!("no RTT spike model was trained: {manifest}"));
    // The evaluator was checked against LightGBM on the test rows by `probe train`.
    assert!(
        manifest["data"]["max_abs_diff_rust_vs_lightgbm"]
            .as_f64()
            .unwrap()
            < 1e-9
    );
    let threshold = spike["threshold"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&threshold));

    run_ok(&[
        "eval", "--data", table_s, "--model", model_s, "--out", report_s,
    ]);
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    for needle in [
        "peer/rtt_spike_5s",
        "recent_event",
        "ewma",
        "zscore",
        "predict_linear",
        "always",
    ] {
        assert!(md.contains(needle), "the report lacks {needle}:\n{md}");
    }
    let svg = std::fs::read_to_string(report.join("pr-peer-rtt_spike-5s.svg")).unwrap();
    assert!(svg.starts_with("<svg") || svg.contains("<svg"));

    // A daemon with the model: probabilities and forecasts for the peer on /metrics.
    let serving = d.join("serving");
    copy_dir(&model, &serving);
    let mut opts = ProbeOpts::iface(&pair.veth_a).tick("500ms");
    opts.extra = vec!["--model".into(), serving.to_str().unwrap().into()];
    let mut daemon = Probe::start(&pair.a, opts);
    let _server = iperf::Server::start(&pair.b, pair.ip_b.into(), iperf::PORT + 1).unwrap();
    let _client = iperf::Client::start(
        &pair.a,
        pair.ip_b.into(),
        iperf::PORT + 1,
        &ClientOpts::tcp(20).congestion("cubic"),
    )
    .unwrap();
    let peer = pair.ip_b.to_string();
    let sel = [
        ("peer", peer.as_str()),
        ("target", "rtt_spike"),
        ("horizon", "5s"),
    ];
    let p = wait_for(&daemon, "probe_spike_probability", &sel);
    assert!((0.0..=1.0).contains(&p), "probability {p}");
    let m = daemon.metrics();
    assert_eq!(
        m.get(
            "probe_model_info",
            &[("model", "e2e"), ("trained_on", "the e2e test")]
        )
        .unwrap(),
        Some(1.0)
    );
    // A forecast needs this tick's RTT p99 (a tick with RTT samples).
    let rtt = wait_for(
        &daemon,
        "probe_rtt_forecast_seconds",
        &[("peer", peer.as_str()), ("horizon", "5s")],
    );
    assert!(rtt > 0.0 && rtt < 1.0, "rtt forecast {rtt}");

    // SIGHUP with a truncated model file: refused, the old model keeps serving.
    let file = serving.join(spike["file"].as_str().unwrap());
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, &text[..text.len() / 2]).unwrap();
    hup(&daemon);
    daemon.wait_ticks(3);
    let log = probe::strip_ansi(&daemon.stderr());
    assert!(
        log.contains("model reload failed") && log.contains("keeps serving"),
        "no reload error in the log:\n{}",
        daemon.log_tail(20)
    );
    let m = daemon.metrics();
    assert_eq!(
        m.get("probe_model_info", &[("model", "e2e")]).unwrap(),
        Some(1.0)
    );
    assert!(m.get("probe_spike_probability", &sel).unwrap().is_some());

    // SIGHUP with a good model under another name: swapped.
    std::fs::write(&file, &text).unwrap();
    let mf = serving.join("manifest.json");
    let renamed = std::fs::read_to_string(&mf)
        .unwrap()
        .replace("\"name\": \"e2e\"", "\"name\": \"e2e-reloaded\"");
    std::fs::write(&mf, renamed).unwrap();
    hup(&daemon);
    daemon.wait_ticks(3);
    let m = daemon.metrics();
    assert_eq!(
        m.get("probe_model_info", &[("model", "e2e-reloaded")])
            .unwrap(),
        Some(1.0),
        "{}",
        daemon.log_tail(20)
    );
    assert!(daemon.terminate(Duration::from_secs(10)).is_some());

    // A bad model directory is one line, before the daemon starts.
    let empty = d.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    for (dir, needles) in [
        (empty.clone(), vec!["model", "manifest.json"]),
        (d.join("missing"), vec!["model", "not a directory"]),
    ] {
        let o = run_to_exit(
            probe_cli(&[
                "run",
                "--listen",
                "127.0.0.1:0",
                "--model",
                dir.to_str().unwrap(),
            ]),
            Duration::from_secs(30),
        )
        .unwrap();
        assert_cli_error(&o, &needles);
    }
    let _ = std::fs::remove_dir_all(&d);
}

fn hup(p: &Probe) {
    // SAFETY: kill(2) on the daemon this test started.
    let r = unsafe { libc::kill(p.pid() as i32, libc::SIGHUP) };
    assert_eq!(r, 0, "kill -HUP failed");
}

fn wait_for(p: &Probe, name: &str, sel: &[(&str, &str)]) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(m) = p.try_metrics() {
            if let Ok(Some(v)) = m.get(name, sel) {
                return v;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no {name}{sel:?} within 30 s:\n{}",
            p.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// A held-out run of the repository's corpus (docs/model.md): never trained on, recorded by
/// the lab with the ground truth of its episodes (ground_truth.jsonl: when each congestion
/// episode began and ended, and whether it built up gradually).
const SKILL_RUN: &str = "xtask/model-corpus/heldout/001-ps-200ms-1024KiB-4r-1000M-q100-seed4";
/// The shipped models whose skill is checked: the RTT spike and the iteration slowdown at
/// the 15 s horizon.
const SKILL_MODELS: [&str; 2] = ["peer/rtt_spike_15s", "peer/iteration_slowdown_15s"];

/// The ground truth's episodes: (start, end, gradual).
fn episodes(run: &Path) -> Vec<(f64, f64, bool)> {
    std::fs::read_to_string(run.join("ground_truth.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["t_start"].as_f64().unwrap(),
                v["t_end"].as_f64().unwrap(),
                v["onset"] == "gradual",
            )
        })
        .collect()
}

/// The built-in model's skill, not only its plumbing: on a held-out lab run, it alarms
/// before the onset of a gradual episode's RTT spike, and never in the run's calm stretches
/// (by the lab's ground truth: a minute after an episode ended until 30 s before the next
/// began, once every window and baseline is full). Needs no root: `probe features` and
/// `probe eval --alarms` on the recording the repository holds.
#[test]
fn built_in_model_alarms_before_a_gradual_onset_and_not_when_calm() {
    let run = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(SKILL_RUN);
    let d = dir("built-in");
    let table = d.join("features.parquet");
    let (report, alarms) = (d.join("report"), d.join("alarms.csv"));
    let s = |p: &Path| p.display().to_string();
    run_ok(&[
        "features",
        "--horizons",
        "5s,15s,30s",
        "--out",
        &s(&table),
        "--data",
        &s(&run.join("recording.parquet")),
    ]);
    run_ok(&[
        "eval",
        "--data",
        &s(&table),
        "--ground-truth",
        &s(&run.join("ground_truth.jsonl")),
        "--out",
        &s(&report),
        "--alarms",
        &s(&alarms),
    ]);
    let eps = episodes(&run);
    assert!(eps.iter().any(|e| e.2), "{SKILL_RUN} has a gradual episode");

    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report.join("results.json")).unwrap())
            .unwrap();
    let csv = std::fs::read_to_string(&alarms).unwrap();
    for model in SKILL_MODELS {
        // Before the onset: at least one gradual onset alarmed before it began.
        let c = results["classifiers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["key"] == model)
            .unwrap_or_else(|| panic!("the built-in model ships {model}"));
        let gradual = &c["scorers"][0]["onsets"]["gradual"];
        let caught =
            gradual["caught_before"].as_f64().unwrap() * gradual["count"].as_f64().unwrap();
        assert!(
            caught >= 1.0,
            "{model} alarmed before none of the gradual onsets of {SKILL_RUN}: {gradual}"
        );

        // Not when calm: no alarm in the calm stretches the ground truth gives.
        let rows: Vec<(f64, bool)> = csv
            .lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (f[4] == model).then(|| (f[3].parse().unwrap(), f[6] == "1"))
            })
            .collect();
        let start = rows.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
        let calm: Vec<&(f64, bool)> = rows
            .iter()
            .filter(|(t, _)| {
                *t >= start + 300.0 && eps.iter().all(|e| *t < e.0 - 30.0 || *t > e.1 + 60.0)
            })
            .collect();
        let alarmed = calm.iter().filter(|r| r.1).count();
        assert!(calm.len() >= 200, "{} calm rows", calm.len());
        assert_eq!(
            alarmed,
            0,
            "{model} alarmed on {alarmed} of {} calm rows of {SKILL_RUN}",
            calm.len()
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

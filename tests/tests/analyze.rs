//! `probe analyze` on a recording this test makes (iperf3 from one namespace to another,
//! recorded by the daemon on the sender): the traffic matrix names the receiver as the peer
//! the host sends to, with the bytes iperf3 itself says it sent (plus headers); the recording
//! keeps the job the probe was given and the address its sockets used (the sender's, the
//! namespace's one address). And bad input
//! is one line: a missing recording, a file that is not Parquet. The pattern, period, change
//! point and report checks against a real training job are the lab's
//! (xtask/src/lab/analyze_test.rs).
use probe_tests::{
    cmd,
    iperf::{self, ClientOpts},
    probe::{self, assert_cli_error, run_to_exit},
    Pair, Probe, ProbeOpts,
};
use std::{path::PathBuf, process::Command, time::Duration};

const RECORD_S: u64 = 20;
const IPERF_S: u32 = 8;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("probe-analyze-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn analyze(args: &[&std::ffi::OsStr]) -> probe_tests::cmd::Output {
    let mut c = Command::new(probe::probe_bin_checked());
    c.arg("analyze").args(args);
    run_to_exit(c, Duration::from_secs(120)).unwrap()
}

#[test]
fn the_traffic_matrix_has_the_bytes_iperf3_sent() {
    cmd::require_root_and(&["ip", "nsenter", "iperf3"]);
    let pair = Pair::new(91).unwrap();
    let d = dir("iperf");
    let rec = d.join("iperf.parquet");
    let _server = iperf::Server::start(&pair.b, pair.ip_b.into(), iperf::PORT).unwrap();
    let mut opts = ProbeOpts::iface(&pair.veth_a);
    opts.extra = vec!["--training-job".into(), "iperf-job".into()];
    let probe = Probe::start(&pair.a, opts);
    let mut recorder = probe::start_recorder(&pair.a, &probe, &rec, RECORD_S).unwrap();
    // The first snapshot is the recording's baseline, and a peer's first tick has no rate
    // (it was not in the previous snapshot): make the peer known with a trickle (1 s of
    // UDP at 100 kbit/s, ~12 kB), then wait for a tick.
    std::thread::sleep(Duration::from_secs(2));
    iperf::run_client(
        &pair.a,
        pair.ip_b.into(),
        iperf::PORT,
        &ClientOpts::udp(1, "100K"),
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let report = iperf::run_client(
        &pair.a,
        pair.ip_b.into(),
        iperf::PORT,
        &ClientOpts::tcp(IPERF_S),
    )
    .unwrap();
    let status = recorder.wait_timeout(Duration::from_secs(RECORD_S + 20));
    assert!(
        status.is_some_and(|s| s.success()),
        "probe record failed: {}",
        recorder.stderr()
    );
    let jobs = probe_tests::parquet::meta(&rec, "probe.jobs").unwrap();
    assert_eq!(
        jobs.as_deref(),
        Some(format!("{{\"iperf-job\":[\"{}\"]}}", pair.ip_a).as_str()),
        "the recording's job and the address its sockets used"
    );
    let out = d.join("out");
    let o = analyze(&[rec.as_os_str(), "--out".as_ref(), out.as_os_str()]);
    assert!(o.status.success(), "probe analyze failed: {}", o.stderr);
    let a: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("iperf").join("analysis.json")).unwrap())
            .unwrap();
    let peers = a["matrix"]["peers"].as_array().unwrap();
    let b = pair.ip_b.to_string();
    let top = &peers[0];
    assert_eq!(top["peer"], b.as_str(), "the busiest peer: {peers:?}");
    assert_eq!(top["direction"], "sends", "{top}");
    let sent = top["tx_bytes"].as_f64().unwrap();
    eprintln!(
        "analyze: {sent:.0} bytes sent to {b}; iperf3 sent {:.0} payload bytes",
        report.sent_bytes
    );
    // Wire bytes: the payload plus Ethernet, IP and TCP headers (about 4.5% at a 1500-byte
    // MTU) and the trickle, never less than the payload.
    assert!(
        sent >= report.sent_bytes && sent <= 1.10 * report.sent_bytes,
        "probe's matrix says {sent:.0} bytes to {b}, iperf3 sent {:.0}",
        report.sent_bytes
    );
    for f in [
        "report.md",
        "report.html",
        "timeline.svg",
        "phases.svg",
        "burst-sizes.svg",
    ] {
        assert!(out.join("iperf").join(f).exists(), "{f} was not written");
    }
    drop(probe);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn bad_recordings_are_one_line() {
    let d = dir("bad");
    let missing = d.join("nope.parquet");
    let o = analyze(&[
        missing.as_os_str(),
        "--out".as_ref(),
        d.join("o").as_os_str(),
    ]);
    assert_cli_error(&o, &["nope.parquet", "does not exist"]);
    let junk = d.join("junk.parquet");
    std::fs::write(&junk, b"not a parquet file at all").unwrap();
    let o = analyze(&[junk.as_os_str(), "--out".as_ref(), d.join("o").as_os_str()]);
    assert_cli_error(&o, &["junk.parquet", "not a Parquet file"]);
    // A host's address for the job's culprits: NAME=ADDRESS, NAME one of the recordings.
    for (bad, said) in [
        ("junk", "expected NAME=ADDRESS"),
        ("junk=10.0.0", "expected NAME=ADDRESS"),
        ("other=10.0.0.1", "no recording is named `other`"),
    ] {
        let o = analyze(&[
            junk.as_os_str(),
            "--address".as_ref(),
            bad.as_ref(),
            "--out".as_ref(),
            d.join("o").as_os_str(),
        ]);
        assert_cli_error(&o, &[bad, said]);
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// Two recordings of the lab's calm 4-rank ring (`cargo xtask lab`, seed 3, 200 ms of
/// compute per iteration) on which the analysis once found 4x (no iterations, pattern
/// unknown) and 2x the iteration, kept with traingen's log of rank 0 from the same run.
/// The analysis must give the ring and traingen's median iteration within 10%.
#[test]
fn recorded_4_rank_rings_give_the_iteration_not_a_multiple() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/lab-ring4");
    let out = dir("ring4");
    for case in ["locked-on-4x", "locked-on-2x"] {
        let rec = fixtures.join(case);
        let o = analyze(&[rec.as_os_str(), "--out".as_ref(), out.as_os_str()]);
        assert!(o.status.success(), "probe analyze {case}: {}", o.stderr);
        let a: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join(case).join("analysis.json")).unwrap())
                .unwrap();
        let mut iters: Vec<f64> = std::fs::read_to_string(rec.join("rank0.jsonl"))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["duration_s"].as_f64())
            .collect();
        assert!(
            iters.len() > 50,
            "{case}: traingen's log has {}",
            iters.len()
        );
        iters.sort_by(f64::total_cmp);
        let logged = iters[iters.len() / 2];
        let found = a["timing"]["period_s"].as_f64().unwrap_or(f64::NAN);
        assert_eq!(a["pattern"]["name"], "ring", "{case}: {}", a["pattern"]);
        assert!(
            (found / logged - 1.0).abs() <= 0.1,
            "{case}: period {found} s, traingen's median iteration {logged} s"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

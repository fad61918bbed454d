//! The job's early warning live: namespace A runs two iperf3 clients to two addresses of B,
//! one inside a cgroup the test makes (the job), one outside it; probe runs in A scoped to
//! that cgroup with the shipped job model (probe-user/job-model/). The job's peers are the
//! remote addresses of the cgroup's established sockets (`ss` in A towards each address,
//! both clients connected), not the other client's; the threshold is the shipped model's (its
//! job.json); the score is a probability. A damaged job model is one clear line before
//! anything starts.
use std::{
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use probe_tests::{
    cgroup::TestCgroup,
    cmd, iperf,
    probe::{self, assert_cli_error, run_to_exit},
    process::Child,
    Pair, Probe, ProbeOpts,
};

const SUBNET: u8 = 141;

fn shipped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../probe-user/job-model")
}

/// Established connections in A towards `dst`.
fn established_to(pair: &Pair, dst: Ipv4Addr) -> usize {
    let out = probe_tests::kernel::ss_established_to(&pair.a, dst.into()).unwrap();
    out.lines().filter(|l| !l.trim().is_empty()).count()
}

#[test]
fn the_job_is_the_peers_of_its_cgroups_sockets_and_its_warning_is_scored() {
    cmd::require_root_and(&["ip", "nsenter", "iperf3", "ss"]);
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shipped().join("job.json")).unwrap())
            .unwrap();
    let threshold = manifest["warning"]["threshold"].as_f64().unwrap();
    let pair = Pair::new(SUBNET).unwrap();
    let (inside, outside) = (pair.ip_b, Ipv4Addr::new(10, 231, SUBNET, 3));
    pair.add_b_addresses(&[outside]).unwrap();
    let _s1 = iperf::Server::start(&pair.b, IpAddr::V4(inside), 5201).unwrap();
    let _s2 = iperf::Server::start(&pair.b, IpAddr::V4(outside), 5202).unwrap();
    let cg = TestCgroup::new("job");
    let mut opts = ProbeOpts::iface(&pair.veth_a).tick("500ms");
    opts.extra = vec![
        "--cgroup".into(),
        cg.dir.display().to_string(),
        "--job-model".into(),
        shipped().display().to_string(),
    ];
    let probe = Probe::start(&pair.a, opts);
    probe.wait_ticks(1);
    let net = format!("--net={}", pair.a.path());
    let (i, o) = (inside.to_string(), outside.to_string());
    let iperf = |addr: &str, port: &str| {
        vec!["iperf3", "-c", addr, "-p", port, "-t", "8", "-b", "50M"]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let job_argv: Vec<String> = ["nsenter".to_string(), net]
        .into_iter()
        .chain(iperf(&i, "5201"))
        .collect();
    let job_argv: Vec<&str> = job_argv.iter().map(String::as_str).collect();
    let mut c1 = Child::spawn("iperf3 -c (the job)", &mut cg.command(&job_argv)).unwrap();
    let other: Vec<String> = iperf(&o, "5202");
    let other: Vec<&str> = other.iter().map(String::as_str).collect();
    let mut c2 = Child::spawn("iperf3 -c (outside)", &mut pair.a.command(&other)).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    probe.wait_ticks(2);
    let m = probe.metrics();
    let (n_in, n_out) = (
        established_to(&pair, inside),
        established_to(&pair, outside),
    );
    let _ = (
        c1.wait_timeout(Duration::from_secs(20)),
        c2.wait_timeout(Duration::from_secs(20)),
    );
    eprintln!("ss in A: {n_in} connections to {inside} (the job's), {n_out} to {outside}");
    assert!(n_in >= 2 && n_out >= 2, "both clients were connected");
    assert_eq!(
        m.get("probe_job_peers", &[]).unwrap(),
        Some(1.0),
        "the job's one peer, not the other client's\n{}",
        probe.log_tail(20)
    );
    let t = m.get("probe_job_warning_threshold", &[]).unwrap();
    assert!(
        t.is_some_and(|t| (t - threshold).abs() < 1e-9),
        "threshold {t:?}, the shipped model's {threshold}"
    );
    let s = m.get("probe_job_warning_score", &[]).unwrap();
    assert!(
        s.is_some_and(|s| (0.0..=1.0).contains(&s)),
        "score {s:?}\n{}",
        probe.log_tail(20)
    );
    // One direction score per direction model the manifest names.
    let dirs = manifest["direction"]["models"].as_object().unwrap();
    assert_eq!(dirs.len(), 3, "egress, ingress and compute models ship");
    for d in dirs.keys() {
        let v = m
            .get(
                "probe_job_warning_direction_score",
                &[("direction", d.as_str())],
            )
            .unwrap();
        assert!(
            v.is_some_and(|v| (0.0..=1.0).contains(&v)),
            "{d}: direction score {v:?}"
        );
    }
}

#[test]
fn a_damaged_job_model_is_one_line_before_anything_starts() {
    let d = std::env::temp_dir().join(format!("probe-job-model-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let bad = d.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("job.json"), "{\"name\": \"cut off").unwrap();
    let other = d.join("other-features");
    std::fs::create_dir_all(&other).unwrap();
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shipped().join("job.json")).unwrap())
            .unwrap();
    m["features"] = serde_json::json!(["job_srtt"]);
    std::fs::write(other.join("job.json"), m.to_string()).unwrap();
    for (dir, needles) in [
        (d.join("missing"), vec!["job.json", "probe train --job"]),
        (bad, vec!["job.json", "does not read"]),
        (other, vec!["job.json", "other features"]),
    ] {
        let mut c = Command::new(probe::probe_bin_checked());
        c.args(["run", "--listen", "127.0.0.1:0", "--job-model"])
            .arg(&dir);
        let o = run_to_exit(c, Duration::from_secs(30)).unwrap();
        assert_cli_error(&o, &needles);
    }
    let _ = std::fs::remove_dir_all(&d);
}

//! The job's early warning live: probe in namespace B with the shipped job model
//! (probe-user/job-model/), iperf3 both ways with A. The job's peers are the remote
//! addresses of B's established sockets as `ss` shows them, read just before and just after
//! the scrape; the threshold is the shipped model's (its job.json); the score is a
//! probability. A damaged job model is one clear line before anything starts.
use std::{
    collections::BTreeSet,
    net::IpAddr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use probe_tests::{
    cmd,
    iperf::{Client, ClientOpts, Server},
    kernel,
    probe::{self, assert_cli_error, run_to_exit},
    Netns, Pair, Probe, ProbeOpts,
};

const SUBNET: u8 = 141;

fn shipped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../probe-user/job-model")
}

/// The remote addresses of `ns`'s established TCP connections, loopback left out (the
/// test's own scrapes).
fn ss_peers(ns: &Netns) -> BTreeSet<IpAddr> {
    kernel::ss_tcp(ns)
        .unwrap()
        .iter()
        .filter(|c| c.state == "ESTAB" && !c.peer.ip().is_loopback())
        .map(|c| c.peer.ip())
        .collect()
}

#[test]
fn the_job_is_the_peers_of_the_hosts_sockets_and_its_warning_is_scored() {
    cmd::require_root_and(&["ip", "iperf3", "ss"]);
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shipped().join("job.json")).unwrap())
            .unwrap();
    let threshold = manifest["warning"]["threshold"].as_f64().unwrap();
    let pair = Pair::new(SUBNET).unwrap();
    let (a, b) = (IpAddr::V4(pair.ip_a), IpAddr::V4(pair.ip_b));
    let _server_b = Server::start(&pair.b, b, 5201).unwrap();
    let _server_a = Server::start(&pair.a, a, 5202).unwrap();
    let mut opts = ProbeOpts::iface(&pair.veth_b).tick("500ms");
    opts.extra = vec!["--job-model".into(), shipped().display().to_string()];
    let probe = Probe::start(&pair.b, opts);
    probe.wait_ticks(1);
    let _to_b = Client::start(&pair.a, b, 5201, &ClientOpts::tcp(20)).unwrap();
    let _to_a = Client::start(&pair.b, a, 5202, &ClientOpts::tcp(20)).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    probe.wait_ticks(2);
    let before = ss_peers(&pair.b);
    let m = probe.metrics();
    let after = ss_peers(&pair.b);
    eprintln!("ss in B: established to {before:?} before the scrape, {after:?} after");
    assert_eq!(before, BTreeSet::from([a]), "B's connections are to A only");
    let peers = m.get("probe_job_peers", &[]).unwrap();
    assert_eq!(
        peers,
        Some(before.len().min(after.len()) as f64),
        "probe_job_peers against ss\n{}",
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

//! The feature stage, live and offline: a daemon watches a TCP connection that sends a
//! burst every 250 ms while `probe record` records it from its first tick; the test reads
//! the daemon's live features from `/api/v1/snapshot` every tick, then replays the
//! recording with `probe features` and checks that every live value is there, the same,
//! at the same tick for the same entity (the one-code-path contract). It also checks the
//! iteration period the daemon found against the sender's own schedule (250 ms), and that
//! the feature file carries the label columns.
use probe_tests::{cmd, netns, parquet, probe, traffic, Pair, Probe, ProbeOpts};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PERIOD: Duration = Duration::from_millis(250);
const BURSTS: usize = 96; // 24 s
const RECORD_S: u64 = 22;
/// Live and replayed values may differ by this much (relative); the contract is bit-equal.
const TOLERANCE: f64 = 1e-9;

/// tick time (bits) -> (entity_kind, entity) -> feature values.
type Live = BTreeMap<u64, BTreeMap<(String, String), Map<String, Value>>>;

fn poll(ns_path: String, addr: SocketAddr, stop: Arc<AtomicBool>, seen: Arc<Mutex<Live>>) {
    while !stop.load(Ordering::Relaxed) {
        let r = netns::enter_path(&ns_path, || {
            probe_tests::http::get(addr, "/api/v1/snapshot", Duration::from_secs(2))
        });
        if let Ok(Ok(r)) = r {
            if let Ok(v) = serde_json::from_str::<Value>(&r.body) {
                let mut rows = BTreeMap::new();
                for f in v["features"].as_array().into_iter().flatten() {
                    let key = (
                        f["entity_kind"].as_str().unwrap_or_default().to_owned(),
                        f["entity"].as_str().unwrap_or_default().to_owned(),
                    );
                    if let Some(vals) = f["values"].as_object() {
                        rows.insert(key, vals.clone());
                    }
                }
                if let (Some(t), false) = (v["time_unix"].as_f64(), rows.is_empty()) {
                    seen.lock().unwrap().entry(t.to_bits()).or_insert(rows);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(150));
    }
}

#[test]
fn live_features_equal_the_replay_of_the_recording() {
    cmd::require_root_and(&["ip", "nsenter", "tc"]);
    let pair = Pair::new(83).unwrap();
    let iface = pair.veth_a.clone();
    let peer = pair.ip_b.to_string();
    let dir = tempfile_dir();
    let rec = dir.join("rec.parquet");
    let out = dir.join("features.parquet");

    let addr = SocketAddr::new(pair.ip_b.into(), 5311);
    let sink = traffic::TcpSink::start(&pair.b, addr, Duration::from_secs(60)).unwrap();
    let probe = Probe::start(&pair.a, ProbeOpts::iface(&iface));
    // Record from the daemon's first observations, as the replay must start from them.
    let mut recorder = probe::start_recorder(&pair.a, &probe, &rec, RECORD_S).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let live = Arc::new(Mutex::new(Live::new()));
    let poller = {
        let (ns, a, s, l) = (pair.a.path(), probe.addr(), stop.clone(), live.clone());
        std::thread::spawn(move || poll(ns, a, s, l))
    };
    let mut stream = traffic::tcp_connect(&pair.a, addr, Duration::from_secs(5)).unwrap();
    traffic::send_bursts(&mut stream, 256 << 10, PERIOD, BURSTS).unwrap();
    let status = recorder.wait_timeout(Duration::from_secs(RECORD_S + 20));
    stop.store(true, Ordering::Relaxed);
    poller.join().unwrap();
    drop(stream);
    let _ = sink.finish();
    assert!(
        status.is_some_and(|s| s.success()),
        "probe record failed: {}",
        recorder.stderr()
    );
    let rec_log = recorder.stderr();
    assert!(
        !rec_log.contains("daemon ticks passed between polls"),
        "the recorder missed ticks, so the replay cannot match: {rec_log}"
    );

    let o = probe::run_to_exit(
        {
            let mut c = std::process::Command::new(probe::probe_bin_checked());
            c.args([
                "features",
                "--data",
                rec.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ]);
            c
        },
        Duration::from_secs(120),
    )
    .unwrap();
    assert!(o.status.success(), "probe features failed: {}", o.stderr);
    let rows = parquet::rows(&out).unwrap();
    let mut offline: BTreeMap<(u64, String, String), &Map<String, Value>> = BTreeMap::new();
    for r in &rows {
        let t = r["time_unix"].as_f64().unwrap().to_bits();
        let k = r["entity_kind"].as_str().unwrap().to_owned();
        let e = r["entity"].as_str().unwrap().to_owned();
        offline.insert((t, k, e), r);
    }

    let live = live.lock().unwrap();
    let (mut compared, mut exact, mut worst) = (0usize, 0usize, 0.0f64);
    let mut ticks_matched = 0;
    for (t, entities) in live.iter() {
        let mut tick_hit = false;
        for ((kind, entity), vals) in entities {
            let Some(off) = offline.get(&(*t, kind.clone(), entity.clone())) else {
                continue;
            };
            tick_hit = true;
            for (name, v) in vals {
                let a = v.as_f64().unwrap();
                let b = off.get(name).and_then(Value::as_f64).unwrap_or_else(|| {
                    panic!(
                        "{kind} {entity} at {}: {name} = {a} live, absent offline",
                        f64::from_bits(*t)
                    )
                });
                compared += 1;
                if a.to_bits() == b.to_bits() {
                    exact += 1;
                }
                let d = (a - b).abs() / a.abs().max(b.abs()).max(1.0);
                worst = worst.max(d);
                assert!(
                    d <= TOLERANCE,
                    "{kind} {entity} {name}: live {a} offline {b}"
                );
            }
            // Nothing known offline that the daemon did not know.
            let known_offline = off
                .iter()
                .filter(|(n, v)| !v.is_null() && !vals.contains_key(*n) && is_feature(n))
                .count();
            assert_eq!(
                known_offline, 0,
                "{kind} {entity}: offline knows features live did not"
            );
        }
        if tick_hit {
            ticks_matched += 1;
        }
    }
    eprintln!(
        "{} live ticks, {ticks_matched} matched offline; {compared} values compared, {exact} bit-equal, worst relative difference {worst:e}",
        live.len()
    );
    assert!(
        ticks_matched >= 12,
        "too few ticks compared: {ticks_matched}"
    );
    assert!(compared > 5_000, "too few values compared: {compared}");

    // The period the daemon found for B, late in the run, against the sender's schedule.
    let late: Vec<f64> = live
        .values()
        .rev()
        .take(5)
        .filter_map(|e| e.get(&("peer".to_string(), peer.clone()))?["iteration_period_s"].as_f64())
        .collect();
    eprintln!("iteration_period_s of the last ticks: {late:?}");
    assert!(
        !late.is_empty(),
        "no iteration period for {peer} at the end of the run"
    );
    // Most of them, not all: on a loaded 2-CPU machine the daemon's own tick (1 s) can
    // delay the sender enough that the detector takes a multiple (1 s) for a tick or two
    // (seen once in CI: 1.0, 1.0, then 0.25 for the last three ticks).
    let right = late
        .iter()
        .filter(|p| (**p - PERIOD.as_secs_f64()).abs() / PERIOD.as_secs_f64() <= 0.05)
        .count();
    assert!(
        right * 2 > late.len(),
        "period {late:?} s in the last ticks, sent every {PERIOD:?}"
    );
    // Labels are there (the future of the last ticks is unknown, so not all are set).
    let first = rows.first().unwrap();
    for l in [
        "rtt_spike_now",
        "rtt_spike_5s",
        "queue_overflow_30s",
        "rtt_p99_future_5s",
    ] {
        assert!(first.contains_key(l), "no label column {l}");
    }
    drop(probe);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Label columns are computed offline only.
fn is_feature(name: &str) -> bool {
    !(name.ends_with("_now")
        || name.contains("_future_")
        || [
            "rtt_spike_",
            "retrans_storm_",
            "queue_overflow_",
            "iteration_slowdown_",
        ]
        .iter()
        .any(|p| name.starts_with(p))
        || ["recording", "time_unix", "entity_kind", "entity"].contains(&name))
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("probe-features-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

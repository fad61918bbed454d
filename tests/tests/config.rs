//! `probe run --config FILE`. A bad file is a clean failure: a non-zero exit and exactly one
//! stderr line, `error: ...`, naming the offending key (an unknown key, a bad duration, an
//! out-of-range map size, a bad address). A good file is honoured, observed from outside:
//! probe serves on the file's `listen` address (and not on the default one), refreshes its
//! snapshot at the file's `tick` (measured from successive snapshot times), and monitors the
//! interfaces the file's `include`/`exclude` patterns select. Flags beat the file: `--listen`,
//! `--tick` and `--interface` replace the file's values.
//!
//! Every probe here runs in a namespace of its own with veths inside it (no addresses, no
//! traffic), so even a config wrongly accepted touches nothing outside.
use probe_tests::probe::{assert_cli_error, probe_command, run_to_exit, strip_ansi};
use probe_tests::{cmd, http, kernel, median, rel_diff, Child, Netns};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const EXIT_TIMEOUT: Duration = Duration::from_secs(15);
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(30);
/// A measured tick may run late on a busy machine; the values compared differ by 2.5x or more
/// (100 ms, 250 ms, the default 1 s).
const TICK_TOLERANCE: f64 = 0.30;

/// A config file under the temp dir, removed on drop.
struct ConfigFile(PathBuf);

impl ConfigFile {
    fn new(name: &str, text: &str) -> ConfigFile {
        let p = std::env::temp_dir().join(format!(
            "probe-test-config-{}-{name}.toml",
            std::process::id()
        ));
        std::fs::write(&p, text).unwrap();
        ConfigFile(p)
    }

    fn path(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A namespace with two veth pairs inside it, all up: mon0-mon1 and oth0-oth1.
fn namespace() -> Netns {
    let ns = Netns::new().unwrap();
    for (a, b) in [("mon0", "mon1"), ("oth0", "oth1")] {
        ns.run(&["ip", "link", "add", a, "type", "veth", "peer", "name", b])
            .unwrap();
        for d in [a, b] {
            ns.sysctl(&format!("net.ipv6.conf.{d}.disable_ipv6"), "1")
                .unwrap();
            ns.run(&["ip", "link", "set", d, "up"]).unwrap();
        }
    }
    ns
}

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `probe run --config FILE` must fail naming `needles`, leaving nothing attached.
fn rejected(name: &str, text: &str, needles: &[&str]) {
    cmd::require_root_and(&["ip", "nsenter", "tc"]);
    let ns = namespace();
    let file = ConfigFile::new(name, text);
    let out = run_to_exit(
        probe_command(&ns, &args(&["run", "--config", &file.path()])),
        EXIT_TIMEOUT,
    )
    .unwrap_or_else(|e| panic!("{e:#}: probe should reject the config\n{text}"));
    let line = assert_cli_error(&out, needles);
    eprintln!("{text:?} -> {line}");
    for dev in ["mon0", "oth0"] {
        let t = kernel::tc_attachments(&ns, dev).unwrap();
        assert!(
            t.is_clean(),
            "leftovers on {dev} after a bad config: {t:#?}"
        );
    }
}

#[test]
fn unknown_key_is_named() {
    rejected("unknown", "tick_rate = \"1s\"\n", &["tick_rate"]);
}

#[test]
fn unknown_key_in_a_table_is_named() {
    rejected(
        "unknown-nested",
        "[interfaces]\ninclude = [\"mon*\"]\nincluded = [\"x\"]\n",
        &["included"],
    );
}

#[test]
fn bad_tick_is_named() {
    rejected("tick", "tick = \"soon\"\n", &["tick"]);
}

#[test]
fn bad_map_size_is_named() {
    rejected("maps", "[maps]\nflows = 1\n", &["maps.flows"]);
}

#[test]
fn bad_listen_is_named() {
    rejected("listen", "listen = \"nowhere\"\n", &["listen"]);
}

/// A probe started with raw arguments, healthy on `addr`.
struct Running {
    child: Child,
}

impl Running {
    fn start(ns: &Netns, argv: &[&str], addr: SocketAddr) -> Running {
        let mut child = Child::spawn("probe", &mut probe_command(ns, &args(argv))).unwrap();
        let deadline = Instant::now() + HEALTHY_TIMEOUT;
        let mut last;
        loop {
            if let Some(st) = child.try_wait() {
                panic!("probe exited ({st}): {}", child.stderr());
            }
            match http::get_in(ns, addr, "/healthz", Duration::from_secs(2)) {
                Ok(r) if r.status == 200 => break,
                Ok(r) => last = format!("/healthz {}", r.status),
                Err(e) => last = format!("{e:#}"),
            }
            assert!(
                Instant::now() < deadline,
                "probe {argv:?} not healthy on {addr} within {HEALTHY_TIMEOUT:?} ({last})\n{}",
                strip_ansi(&child.stderr())
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Running { child }
    }

    fn stop(mut self) {
        let st = self.child.terminate(Duration::from_secs(10));
        assert!(
            st.is_some_and(|s| s.success()),
            "probe should exit 0 on SIGTERM: {st:?}\n{}",
            strip_ansi(&self.child.stderr())
        );
    }
}

/// The snapshot's JSON.
fn snapshot(ns: &Netns, addr: SocketAddr) -> serde_json::Value {
    let r = http::get_in(ns, addr, "/api/v1/snapshot", Duration::from_secs(5)).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).unwrap()
}

/// The interval between successive snapshots, measured: the median difference of distinct
/// `time_unix` values seen while polling every ~10 ms for 1.5 s.
fn measured_tick(ns: &Netns, addr: SocketAddr) -> f64 {
    let t0 = Instant::now();
    let mut times: Vec<f64> = Vec::new();
    while t0.elapsed() < Duration::from_millis(1500) {
        let t = snapshot(ns, addr)["time_unix"].as_f64().unwrap();
        if times.last() != Some(&t) {
            times.push(t);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // The first value may be older than the polling: use differences of later ones.
    let d: Vec<f64> = times.windows(2).skip(1).map(|w| w[1] - w[0]).collect();
    median(&d).unwrap_or(f64::NAN)
}

fn interfaces(snap: &serde_json::Value) -> Vec<String> {
    snap["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

/// Whether anything accepts TCP connections on `addr` in `ns`.
fn listening(ns: &Netns, addr: SocketAddr) -> bool {
    ns.enter(|| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok())
        .unwrap()
}

const GOOD: &str = "listen = \"127.0.0.1:9471\"\n\
                    tick = \"250ms\"\n\
                    [interfaces]\n\
                    include = [\"mon*\"]\n\
                    exclude = [\"mon1\"]\n";

#[test]
fn good_config_is_honoured_and_flags_override_it() {
    cmd::require_root_and(&["ip", "nsenter"]);
    let ns = namespace();
    let file = ConfigFile::new("good", GOOD);
    let file_addr: SocketAddr = "127.0.0.1:9471".parse().unwrap();
    let default_addr: SocketAddr = "127.0.0.1:9464".parse().unwrap();
    let flag_addr: SocketAddr = "127.0.0.1:9472".parse().unwrap();

    // The file alone.
    let p = Running::start(&ns, &["run", "--config", &file.path()], file_addr);
    let snap = snapshot(&ns, file_addr);
    let tick = measured_tick(&ns, file_addr);
    let ifaces = interfaces(&snap);
    let on_default = listening(&ns, default_addr);
    let metrics = http::get_in(&ns, file_addr, "/metrics", Duration::from_secs(5)).unwrap();
    eprintln!(
        "file only: serving on {file_addr}, default port open: {on_default}; tick_seconds {} \
         measured {tick:.3} s; interfaces {ifaces:?}",
        snap["tick_seconds"]
    );
    assert_eq!(metrics.status, 200);
    assert!(metrics.body.contains("probe_build_info"));
    assert!(
        !on_default,
        "probe also listens on the default {default_addr}"
    );
    assert_eq!(snap["tick_seconds"].as_f64(), Some(0.25));
    assert!(
        rel_diff(tick, 0.25) <= TICK_TOLERANCE,
        "snapshots every {tick:.3} s, the file says 250ms"
    );
    assert_eq!(ifaces, vec!["mon0"], "include mon*, exclude mon1");
    p.stop();

    // Flags beat the file: listen, tick, interfaces.
    let p = Running::start(
        &ns,
        &[
            "run",
            "--config",
            &file.path(),
            "--listen",
            "127.0.0.1:9472",
            "--tick",
            "100ms",
            "--interface",
            "oth0",
        ],
        flag_addr,
    );
    let snap = snapshot(&ns, flag_addr);
    let tick = measured_tick(&ns, flag_addr);
    let ifaces = interfaces(&snap);
    let on_file = listening(&ns, file_addr);
    eprintln!(
        "with flags: serving on {flag_addr}, file's port open: {on_file}; tick_seconds {} \
         measured {tick:.3} s; interfaces {ifaces:?}",
        snap["tick_seconds"]
    );
    assert!(!on_file, "--listen should replace the file's {file_addr}");
    assert_eq!(snap["tick_seconds"].as_f64(), Some(0.1));
    assert!(
        rel_diff(tick, 0.1) <= TICK_TOLERANCE,
        "snapshots every {tick:.3} s, --tick says 100ms"
    );
    assert_eq!(
        ifaces,
        vec!["oth0"],
        "--interface oth0 replaces the file's include"
    );
    p.stop();
}

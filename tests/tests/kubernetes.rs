//! The DaemonSet of contrib/kubernetes/probe-daemonset.yaml (contrib/kubernetes/README.md).
//!
//! - Its schema: every document passes `kubernetes-validate --strict` (the Kubernetes OpenAPI
//!   schemas, unknown fields refused) for the oldest and the newest Kubernetes the pinned
//!   validator bundles. The validator comes from PyPI into a venv under target/, made once
//!   and reused; without python3 or the package the tests say so and skip. (Its install
//!   could move to `cargo xtask setup`.)
//! - What it asks of probe, without a cluster: the init container and the daemon share
//!   privileges, mounts and config; the capabilities are the systemd unit's (which
//!   tests/tests/hardening.rs runs probe with); the probes and the scrape annotations name
//!   the port `--listen` uses. Then, as root, probe runs with the manifest's own arguments,
//!   its ConfigMap's probe.toml and exactly its capabilities with no_new_privs, in a network
//!   namespace shaped like a CNI node (uplinks beside pod veths and CNI devices): `--check`
//!   passes, and the daemon answers the manifest's health check on the node's address and
//!   monitors the uplinks and nothing else.
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use probe_tests::probe::{probe_bin_checked, run_to_exit};
use probe_tests::process::Child;
use probe_tests::{cmd, http, Metrics, Netns};
use serde_json::Value;

const MANIFEST: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../contrib/kubernetes/probe-daemonset.yaml"
);
const UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../contrib/systemd/probe.service"
);
/// The validator, pinned: it bundles the schemas of Kubernetes 1.25 to 1.37.
const VALIDATOR: &str = "kubernetes-validate==1.37.0";
const KUBERNETES: [&str; 2] = ["1.25", "1.37"];

/// The venv with the validator, made at most once per run; None (with the reason printed)
/// when python3 cannot make it or pip cannot install the package.
fn venv() -> Option<&'static Path> {
    static VENV: OnceLock<Option<PathBuf>> = OnceLock::new();
    VENV.get_or_init(|| match install_validator() {
        Ok(dir) => Some(dir),
        Err(why) => {
            eprintln!("SKIPPED: cannot install {VALIDATOR} into a venv: {why}");
            None
        }
    })
    .as_deref()
}

fn install_validator() -> Result<PathBuf, String> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("kubernetes-validate");
    let version = VALIDATOR.split("==").nth(1).unwrap();
    let installed = Command::new(dir.join("bin/kubernetes-validate"))
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == version);
    if installed {
        return Ok(dir);
    }
    let run = |c: &mut Command| -> Result<(), String> {
        let o = c
            .output()
            .map_err(|e| format!("{}: {e}", cmd::describe(c)))?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} exited {}: {}",
                cmd::describe(c),
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
    };
    run(Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&dir))?;
    run(Command::new(dir.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        VALIDATOR,
    ]))?;
    Ok(dir)
}

/// The manifest's documents as JSON, parsed by the venv's PyYAML.
fn documents(venv: &Path) -> Vec<Value> {
    let out = Command::new(venv.join("bin/python"))
        .args([
            "-c",
            "import json, sys, yaml\n\
             json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d], sys.stdout)",
            MANIFEST,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout).unwrap() {
        Value::Array(docs) => docs,
        other => panic!("not a list of documents: {other}"),
    }
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("{MANIFEST} has no {kind}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// What the pod runs, from the manifest.
struct Pod {
    daemon: Value,
    check: Value,
    config_toml: String,
    /// Where the ConfigMap is mounted.
    config_dir: String,
    /// `metrics`, the daemon's named port.
    port: u16,
}

impl Pod {
    fn from(docs: &[Value]) -> Pod {
        let spec = &kind(docs, "DaemonSet")["spec"]["template"]["spec"];
        let containers = spec["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1, "one container, probe");
        let daemon = containers[0].clone();
        let inits = spec["initContainers"].as_array().unwrap();
        let check = inits
            .iter()
            .find(|c| strings(&c["args"]).iter().any(|a| a == "--check"))
            .expect("an init container running `probe run --check`")
            .clone();
        let config_volume = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v.get("configMap").is_some())
            .expect("a ConfigMap volume");
        let cm_name = &config_volume["configMap"]["name"];
        let cm = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && &d["metadata"]["name"] == cm_name)
            .unwrap_or_else(|| panic!("no ConfigMap {cm_name}"));
        let config_dir = daemon["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == config_volume["name"])
            .expect("the ConfigMap is mounted")["mountPath"]
            .as_str()
            .unwrap()
            .to_owned();
        let port = daemon["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "metrics")
            .expect("a port named metrics")["containerPort"]
            .as_u64()
            .unwrap() as u16;
        Pod {
            daemon,
            check,
            config_toml: cm["data"]["probe.toml"].as_str().unwrap().to_owned(),
            config_dir,
            port,
        }
    }

    /// A container's args as the kubelet passes them (`$(HOST_IP)` expanded), with the
    /// ConfigMap's directory moved to `config_dir`.
    fn args(container: &Value, host_ip: &str, config_dir: &Path, from: &str) -> Vec<String> {
        strings(&container["args"])
            .into_iter()
            .map(|a| {
                a.replace("$(HOST_IP)", host_ip)
                    .replace(from, &config_dir.display().to_string())
            })
            .collect()
    }
}

#[test]
fn the_manifest_passes_the_kubernetes_schemas_strictly() {
    let Some(venv) = venv() else { return };
    let n = documents(venv).len();
    for version in KUBERNETES {
        let out = cmd::output_within(
            Command::new(venv.join("bin/kubernetes-validate"))
                .args(["--strict", "-k", version, MANIFEST]),
            Duration::from_secs(120),
        )
        .unwrap();
        // A kind the validator has no schema for is only a WARN, exit 0: count the passes.
        let passed = out
            .stdout
            .lines()
            .filter(|l| l.contains(" passed "))
            .count();
        assert!(
            out.status.success() && passed == n && !out.stdout.contains("WARN"),
            "Kubernetes {version}: {n} documents, {passed} passed:\n{}{}",
            out.stdout,
            out.stderr
        );
    }
}

#[test]
fn the_init_check_and_the_daemon_share_privileges_mounts_and_port() {
    let Some(venv) = venv() else { return };
    let docs = documents(venv);
    let pod = Pod::from(&docs);
    let ds = kind(&docs, "DaemonSet");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true);

    for key in [
        "image",
        "command",
        "env",
        "securityContext",
        "volumeMounts",
        "resources",
    ] {
        assert_eq!(pod.check[key], pod.daemon[key], "{key} differs");
    }
    let mut check_args = strings(&pod.check["args"]);
    check_args.retain(|a| a != "--check");
    assert_eq!(check_args, strings(&pod.daemon["args"]));

    // The capabilities are the hardened unit's, nothing more, and cannot grow.
    let sc = &pod.daemon["securityContext"];
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["runAsUser"], 0);
    let unit = std::fs::read_to_string(UNIT).unwrap();
    let unit_caps: BTreeSet<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit's CapabilityBoundingSet")
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_owned())
        .collect();
    let caps: BTreeSet<String> = strings(&sc["capabilities"]["add"]).into_iter().collect();
    assert_eq!(
        caps, unit_caps,
        "the manifest's capabilities against {UNIT}"
    );

    // Every volume is mounted, and every hostPath read-only but probe's own /run/probe.
    let mounts = pod.daemon["volumeMounts"].as_array().unwrap();
    for v in spec["volumes"].as_array().unwrap() {
        let m = mounts
            .iter()
            .find(|m| m["name"] == v["name"])
            .unwrap_or_else(|| panic!("volume {} is not mounted", v["name"]));
        if let Some(path) = v["hostPath"]["path"].as_str() {
            assert_eq!(m["mountPath"].as_str(), Some(path), "{v}");
            assert_eq!(m["readOnly"] == true, path != "/run/probe", "{m}");
        }
    }

    // The health checks and the scrape annotations use the port probe listens on.
    let listen = strings(&pod.daemon["args"])
        .into_iter()
        .find_map(|a| a.strip_prefix("--listen=").map(str::to_owned))
        .expect("--listen=ADDR:PORT");
    assert_eq!(listen, format!("$(HOST_IP):{}", pod.port));
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let get = &pod.daemon[probe]["httpGet"];
        assert_eq!(get["path"], "/healthz", "{probe}");
        assert_eq!(get["port"], "metrics", "{probe}");
    }
    let notes = &ds["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(notes["prometheus.io/scrape"], "true");
    assert_eq!(notes["prometheus.io/port"], pod.port.to_string());
    assert_eq!(notes["prometheus.io/path"], "/metrics");
}

/// The `what` line of `probe run --check`'s report: (level, detail).
fn report_line<'a>(out: &'a str, what: &str) -> (&'a str, &'a str) {
    out.lines()
        .find_map(|l| {
            let (level, rest) = l.split_once("  ")?;
            let detail = rest.trim_start().strip_prefix(what)?;
            Some((level.trim(), detail.trim()))
        })
        .unwrap_or_else(|| panic!("no `{what}` line in:\n{out}"))
}

/// The node's address in the test's namespace (10.231.144.0/24 is this test's).
const HOST_IP: &str = "10.231.144.1";
/// Interfaces named as on a node, as veth pairs (the name is what matters; not every kernel
/// here has the dummy device): the uplinks probe should monitor...
const UPLINKS: (&str, &str) = ("ens5", "eth1");
/// ...and a CNI's devices, which it should not: a pod veth and its Calico-named peer,
/// Cilium's and Flannel's devices, a bridge, NodeLocal DNSCache's.
const CNI: [(&str, &str); 4] = [
    ("veth3f2a", "cali3f2a"),
    ("lxc9d1c", "cilium_host"),
    ("flannel.1", "cni0"),
    ("vxlan.calico", "nodelocaldns"),
];

/// A network namespace with those interfaces, all up; the first uplink holds HOST_IP.
fn node() -> Netns {
    let ns = Netns::new().unwrap();
    for (a, b) in std::iter::once(UPLINKS).chain(CNI) {
        ns.run(&["ip", "link", "add", a, "type", "veth", "peer", "name", b])
            .unwrap();
        for name in [a, b] {
            ns.run(&["ip", "link", "set", name, "up"]).unwrap();
        }
    }
    ns.run(&[
        "ip",
        "addr",
        "add",
        &format!("{HOST_IP}/24"),
        "dev",
        UPLINKS.0,
    ])
    .unwrap();
    ns
}

/// `setpriv` with the container's privileges: uid 0, the bounding set of its
/// capabilities, no_new_privs (`allowPrivilegeEscalation: false`), then probe.
fn as_the_container(ns: &Netns, container: &Value, args: &[String]) -> Command {
    let sc = &container["securityContext"];
    let caps = strings(&sc["capabilities"]["add"])
        .iter()
        .map(|c| format!("+{}", c.to_lowercase()))
        .collect::<Vec<_>>()
        .join(",");
    let bin = probe_bin_checked();
    let bounding = format!("--bounding-set=-all,{caps}");
    let mut argv = vec!["setpriv", &bounding];
    if sc["allowPrivilegeEscalation"] == false {
        argv.push("--no-new-privs");
    }
    argv.push(&bin);
    argv.extend(args.iter().map(String::as_str));
    let mut c = ns.command(&argv);
    c.env_remove("RUST_LOG");
    c
}

#[test]
fn probe_runs_with_the_manifest_and_monitors_only_the_uplinks() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: running probe with the manifest needs root (network namespaces, eBPF)");
        return;
    }
    let Some(venv) = venv() else { return };
    cmd::require_root_and(&["ip", "nsenter", "setpriv"]);
    let pod = Pod::from(&documents(venv));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("probe.toml"), &pod.config_toml).unwrap();
    let args = |c: &Value| Pod::args(c, HOST_IP, dir.path(), &pod.config_dir);
    let ns = node();
    let uplinks: BTreeSet<String> = [UPLINKS.0, UPLINKS.1].map(str::to_owned).into();

    // The init container: `probe run --check` passes and names only the uplinks.
    let out = run_to_exit(
        as_the_container(&ns, &pod.check, &args(&pod.check)),
        Duration::from_secs(60),
    )
    .unwrap();
    let o = out.stdout.as_str();
    eprintln!("probe run --check, as the init container:\n{o}");
    assert!(out.status.success(), "{o}\n{}", out.stderr);
    let (level, names) = report_line(o, "interfaces");
    assert_eq!(level, "ok", "{o}");
    let names: BTreeSet<String> = names.split(", ").map(str::to_owned).collect();
    assert_eq!(names, uplinks, "{o}");
    assert_ne!(report_line(o, "privileges").0, "FAIL", "{o}");
    assert_eq!(
        report_line(o, "listen"),
        ("ok", format!("{HOST_IP}:{} is free", pod.port).as_str())
    );

    // The daemon: healthy on the node's address within the startup probe's budget, and
    // monitoring the uplinks only.
    let startup = &pod.daemon["startupProbe"];
    let budget = Duration::from_secs(
        startup["periodSeconds"].as_u64().unwrap() * startup["failureThreshold"].as_u64().unwrap(),
    );
    let mut child = Child::spawn(
        "probe",
        &mut as_the_container(&ns, &pod.daemon, &args(&pod.daemon)),
    )
    .unwrap();
    let addr: SocketAddr = format!("{HOST_IP}:{}", pod.port).parse().unwrap();
    let deadline = Instant::now() + budget;
    loop {
        if let Some(st) = child.try_wait() {
            panic!("probe exited with {st}:\n{}", child.stderr());
        }
        if matches!(http::get_in(&ns, addr, "/healthz", Duration::from_secs(2)), Ok(r) if r.status == 200)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/healthz not 200 within {budget:?}:\n{}",
            child.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = http::get_in(&ns, addr, "/metrics", Duration::from_secs(5)).unwrap();
    assert_eq!(r.status, 200);
    let m = Metrics::parse(&r.body).unwrap();
    assert_eq!(
        m.label_values("probe_interface_receive_bytes_total", "iface"),
        uplinks,
        "{}",
        child.stderr()
    );
    assert_eq!(
        m.get("probe_hook_attached", &[("hook", "tc")]).unwrap(),
        Some(1.0)
    );
    // The snapshot is off in the ConfigMap: it names every connection and flow.
    let snap = http::get_in(&ns, addr, "/api/v1/snapshot", Duration::from_secs(5)).unwrap();
    assert_eq!(snap.status, 404);
    let st = child.terminate(Duration::from_secs(10));
    assert!(
        st.is_some_and(|s| s.success()),
        "probe did not exit 0 on SIGTERM: {st:?}\n{}",
        child.stderr()
    );
}

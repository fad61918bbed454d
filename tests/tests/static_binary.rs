//! The static build that `cargo xtask dist` ships (and the package carries): an ELF with no
//! interpreter and no shared library, that runs where there is no libc at all. `probe run
//! --check` chrooted into an empty directory that holds only the binary and the kernel's
//! /proc, /sys and /dev (bind mounts in a private mount namespace: nothing of it reaches the
//! host) reports exactly what the same binary reports outside, with the same exit status.
//! Built without the `rdma-verbs` feature, it still finds RDMA devices and ports in sysfs.
//!
//! The binary: `$PROBE_STATIC_BIN` (`cargo xtask test` sets it to the debug static build it
//! packages), else `probe-<version>-x86_64-linux-musl` in target/dist/debug (`cargo xtask
//! dist --debug`) or target/dist (`cargo xtask dist`).
use probe_tests::probe::run_to_exit;
use probe_tests::rdma::{self, FakePort};
use probe_tests::{cmd, Netns, Pair, Probe, ProbeOpts};
use std::path::PathBuf;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

fn static_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("PROBE_STATIC_BIN") {
        let bin = PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "PROBE_STATIC_BIN={}: no such file",
            bin.display()
        );
        return bin;
    }
    let dist = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/dist");
    let name = format!("probe-{}-x86_64-linux-musl", env!("CARGO_PKG_VERSION"));
    [dist.join("debug").join(&name), dist.join(&name)]
        .into_iter()
        .find(|b| b.is_file())
        .expect("no static probe in target/dist: `cargo xtask dist --debug` builds one, or set PROBE_STATIC_BIN")
}

/// Sets up the root's mounts in the private namespace `unshare` made, then becomes the binary.
const CHROOT: &str = r#"set -e
r=$1; shift
for d in proc sys dev; do mount --rbind "/$d" "$r/$d"; done
exec chroot "$r" /probe "$@""#;

#[test]
fn the_static_binary_checks_the_host_alike_in_a_root_without_libc() {
    cmd::require_root_and(&["ip", "nsenter", "unshare", "chroot", "mount", "readelf"]);
    let bin = static_bin();
    let headers = cmd::run(cmd::command(&["readelf", "-lW"]).arg(&bin)).unwrap();
    assert!(
        !headers.contains("program interpreter"),
        "{} has an ELF interpreter:\n{headers}",
        bin.display()
    );
    let dynamic = cmd::run(cmd::command(&["readelf", "-dW"]).arg(&bin)).unwrap();
    assert!(
        !dynamic.contains("(NEEDED)"),
        "{} loads shared libraries:\n{dynamic}",
        bin.display()
    );
    if cmd::have("file") {
        let file = cmd::run(cmd::command(&["file", "-b"]).arg(&bin)).unwrap();
        eprintln!("file: {file}");
        assert!(file.contains("statically linked") || file.contains("static-pie linked"));
    }

    // One interface, in a namespace of its own, so that both runs see the same host.
    let ns = Netns::new().unwrap();
    ns.run(&[
        "ip", "link", "add", "st0", "type", "veth", "peer", "name", "st1",
    ])
    .unwrap();
    ns.run(&["ip", "link", "set", "st0", "up"]).unwrap();
    let args = [
        "run",
        "--check",
        "--interface",
        "st0",
        "--listen",
        "127.0.0.1:9464",
    ];

    let mut outside = ns.command(&[bin.to_str().unwrap()]);
    outside.args(args);
    let outside = run_to_exit(outside, TIMEOUT).unwrap();

    // The root: the binary and three mount points, nothing else (no libc, no loader, no /etc).
    let root = tempfile::tempdir().unwrap();
    for d in ["proc", "sys", "dev"] {
        std::fs::create_dir(root.path().join(d)).unwrap();
    }
    std::fs::copy(&bin, root.path().join("probe")).unwrap();
    let mut inside = ns.command(&[
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        CHROOT,
        "sh",
        root.path().to_str().unwrap(),
    ]);
    inside.args(args);
    let inside = run_to_exit(inside, TIMEOUT).unwrap();
    eprintln!(
        "outside: {}\n{}{}\ninside: {}\n{}{}",
        outside.status, outside.stdout, outside.stderr, inside.status, inside.stdout, inside.stderr
    );
    let mut entries: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert_eq!(entries, ["dev", "probe", "proc", "sys"]);

    assert!(
        outside.stdout.contains("interfaces  st0"),
        "{}",
        outside.stdout
    );
    assert_eq!(inside.status.code(), outside.status.code());
    assert_eq!(inside.stdout, outside.stdout);
    // The one-line error, when --check fails here (the log lines would carry times).
    let errors = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.starts_with("error"))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(errors(&inside.stderr), errors(&outside.stderr));
}

/// Without libibverbs, RDMA devices and ports come from sysfs: a fake RoCE port's counters
/// reach /metrics.
#[test]
fn the_static_binary_reads_rdma_ports_from_sysfs() {
    cmd::require_root_and(&["ip", "nsenter"]);
    let bin = static_bin();
    let pair = Pair::new(104).unwrap();
    let port = FakePort::start("mlx5_0").unwrap();
    port.set_rate(rdma::TRANSMIT_DATA, 2.5e7);
    let config = port.root().with_file_name("probe.toml");
    std::fs::write(
        &config,
        format!(
            "[rdma]\nsysfs_root = \"{}\"\ninterval = \"500ms\"\n",
            port.root().display()
        ),
    )
    .unwrap();
    let mut opts = ProbeOpts::iface(&pair.veth_a).tick("500ms").bin(&bin);
    opts.extra = vec!["--config".into(), config.display().to_string()];
    let probe = Probe::start(&pair.a, opts);
    let labels = [("device", "mlx5_0"), ("port", "1")];
    let mut bytes = 0.0;
    for _ in 0..40 {
        let m = probe.metrics();
        bytes = m.sum("probe_rdma_port_transmit_bytes_total", &labels);
        if bytes > 0.0 && m.sum("probe_rdma_port_info", &labels) == 1.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        bytes > 0.0,
        "no RDMA port counters from sysfs:\n{}",
        probe.log_tail(40)
    );
}

//! Error paths of `probe run`: each exits non-zero with exactly one stderr line, starting
//! `error: `, that names what is wrong; and leaves nothing attached behind.
use probe_tests::probe::{assert_cli_error, probe_bin_checked, probe_command, run_to_exit};
use probe_tests::{cmd, kernel, Pair, ProbeOpts};
use std::net::TcpListener;
use std::time::Duration;

/// An error exit should be quick; a probe that keeps running past this has ignored the error.
const EXIT_TIMEOUT: Duration = Duration::from_secs(20);

fn run(pair: &Pair, opts: &ProbeOpts) -> probe_tests::cmd::Output {
    run_to_exit(probe_command(&pair.a, &opts.args()), EXIT_TIMEOUT).unwrap()
}

fn assert_nothing_attached(pair: &Pair) {
    let t = kernel::tc_attachments(&pair.a, &pair.veth_a).unwrap();
    assert!(t.is_clean(), "leftovers after a failed start: {t:#?}");
}

#[test]
fn unknown_interface_is_named() {
    cmd::require_root_and(&["ip", "nsenter"]);
    let pair = Pair::new(51).unwrap();
    let out = run(&pair, &ProbeOpts::iface("doesnotexist0"));
    eprintln!("{}", assert_cli_error(&out, &["doesnotexist0"]));
}

#[test]
fn listen_address_in_use_is_named() {
    cmd::require_root_and(&["ip", "nsenter", "tc", "bpftool"]);
    let pair = Pair::new(52).unwrap();
    let opts = ProbeOpts::iface(&pair.veth_a);
    // Holds the port in A's namespace until the end of the test.
    let _holder = pair
        .a
        .enter(|| TcpListener::bind(("127.0.0.1", opts.port)))
        .unwrap()
        .unwrap();
    let out = run(&pair, &opts);
    eprintln!(
        "{}",
        assert_cli_error(&out, &[&format!("127.0.0.1:{}", opts.port)])
    );
    assert_nothing_attached(&pair);
}

#[test]
fn missing_privilege_names_the_capability() {
    cmd::require_root_and(&["ip", "nsenter", "setpriv"]);
    let pair = Pair::new(53).unwrap();
    let bin = probe_bin_checked();
    let unprivileged = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
    ];
    // The binary itself must be reachable by uid 65534, or the test would only show that.
    let mut can_exec: Vec<&str> = unprivileged.to_vec();
    can_exec.extend(["test", "-x", &bin]);
    assert!(
        pair.a.run(&can_exec).is_ok(),
        "uid 65534 cannot execute {bin}: put it where `nobody` can (e.g. /tmp) via PROBE_BIN"
    );
    let opts = ProbeOpts::iface(&pair.veth_a);
    let mut argv: Vec<&str> = unprivileged.to_vec();
    argv.push(&bin);
    let args = opts.args();
    argv.extend(args.iter().map(String::as_str));
    let out = cmd::output_within(&mut pair.a.command(&argv), EXIT_TIMEOUT).unwrap();
    let line = assert_cli_error(&out, &[]);
    eprintln!("{line}");
    let caps = ["CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON", "CAP_SYS_ADMIN"];
    assert!(
        caps.iter().any(|c| line.to_uppercase().contains(c)),
        "the error should name the missing capability (one of {caps:?}): {line}"
    );
    assert_nothing_attached(&pair);
}

#[test]
fn bad_tick_is_named() {
    cmd::require_root_and(&["ip", "nsenter"]);
    let pair = Pair::new(54).unwrap();
    let out = run(&pair, &ProbeOpts::iface(&pair.veth_a).tick("banana"));
    eprintln!("{}", assert_cli_error(&out, &["tick"]));
    assert_nothing_attached(&pair);
}

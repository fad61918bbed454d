//! `probe run --check` against what the host says through other tools: the kernel release
//! (`uname -r`), BTF (/sys/kernel/btf/vmlinux), the cgroup v2 mount (`findmnt`), the
//! interface it would attach to; and that it attaches nothing (`tc_attachments` of the veth
//! stay clean). A busy listen address and missing privileges are FAIL lines and exit 1.
use probe_tests::probe::{probe_bin_checked, probe_command, run_to_exit};
use probe_tests::{cmd, kernel, Pair, ProbeOpts};
use std::net::TcpListener;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);

fn check(pair: &Pair, opts: &ProbeOpts) -> cmd::Output {
    let mut args = opts.args();
    args.push("--check".into());
    run_to_exit(probe_command(&pair.a, &args), TIMEOUT).unwrap()
}

/// The line of `what` in the report: (level, detail).
fn line<'a>(out: &'a str, what: &str) -> (&'a str, &'a str) {
    out.lines()
        .find_map(|l| {
            let (level, rest) = l.split_once("  ")?;
            let rest = rest.trim_start();
            let detail = rest.strip_prefix(what)?;
            Some((level.trim(), detail.trim()))
        })
        .unwrap_or_else(|| panic!("no `{what}` line in:\n{out}"))
}

#[test]
fn check_reports_the_host_as_other_tools_see_it_and_attaches_nothing() {
    cmd::require_root_and(&["ip", "nsenter", "tc", "findmnt", "uname"]);
    let pair = Pair::new(102).unwrap();
    let opts = ProbeOpts::iface(&pair.veth_a);
    let out = check(&pair, &opts);
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    let o = out.stdout.as_str();

    let release = cmd::run(&mut cmd::command(&["uname", "-r"])).unwrap();
    assert_eq!(line(o, "kernel"), ("ok", release.trim()));
    let btf = std::path::Path::new("/sys/kernel/btf/vmlinux").is_file();
    assert_eq!(line(o, "BTF").0, if btf { "ok" } else { "FAIL" });
    let cg = cmd::run(&mut cmd::command(&[
        "findmnt", "-n", "-t", "cgroup2", "-o", "TARGET",
    ]))
    .unwrap();
    let cg = cg.lines().next().unwrap_or("").trim();
    if cg.is_empty() {
        assert_eq!(line(o, "cgroup v2").0, "warn");
    } else {
        assert!(
            line(o, "cgroup v2").1.starts_with(cg),
            "findmnt says {cg}:\n{o}"
        );
    }
    assert_eq!(line(o, "interfaces"), ("ok", pair.veth_a.as_str()));
    assert!(o.contains(&format!("programs on {}", pair.veth_a)), "{o}");
    assert!(o.lines().any(|l| l.starts_with("ready")), "{o}");

    let t = kernel::tc_attachments(&pair.a, &pair.veth_a).unwrap();
    assert!(t.is_clean(), "--check attached something: {t:#?}");
}

#[test]
fn check_fails_on_a_busy_port_and_without_privileges() {
    cmd::require_root_and(&["ip", "nsenter", "setpriv"]);
    let pair = Pair::new(103).unwrap();
    let opts = ProbeOpts::iface(&pair.veth_a);
    let _holder = pair
        .a
        .enter(|| TcpListener::bind(("127.0.0.1", opts.port)))
        .unwrap()
        .unwrap();
    let out = check(&pair, &opts);
    assert!(!out.status.success(), "{}", out.stdout);
    assert_eq!(line(&out.stdout, "listen").0, "FAIL", "{}", out.stdout);
    assert!(out.stderr.contains("listen"), "{}", out.stderr);

    // As nobody with no capabilities.
    let bin = probe_bin_checked();
    let mut args = ProbeOpts::iface(&pair.veth_a).args();
    let port = args.iter().position(|a| a == "--listen").unwrap() + 1;
    args[port] = "127.0.0.1:9465".into();
    let mut argv = vec![
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        &bin,
    ];
    argv.extend(args.iter().map(String::as_str));
    argv.push("--check");
    let out = cmd::output_within(&mut pair.a.command(&argv), TIMEOUT).unwrap();
    assert!(!out.status.success(), "{}", out.stdout);
    let (level, detail) = line(&out.stdout, "privileges");
    assert_eq!(level, "FAIL", "{}", out.stdout);
    assert!(detail.contains("CAP_BPF"), "{detail}");
}

//! No leftovers: after SIGTERM (and after SIGKILL followed by a fresh start and SIGTERM) the
//! monitored interface has no TCX program, no tc filter, no BPF entry in `bpftool net show`,
//! and no clsact qdisc unless one was there before probe started. Checked for both attach
//! modes, against three independent views (BPF_PROG_QUERY for TCX, `tc filter show`,
//! `bpftool net show`) and `tc qdisc show`.
use probe_tests::kernel::{self, TcAttachments};
use probe_tests::{cmd, Hook, Netns, Pair, Probe, ProbeOpts};
use std::time::Duration;

const GRACE: Duration = Duration::from_secs(10);

fn attachments(ns: &Netns, dev: &str) -> TcAttachments {
    kernel::tc_attachments(ns, dev).unwrap()
}

/// While probe runs, its programs are where the mode says.
fn assert_attached(ns: &Netns, dev: &str, mode: &str) -> TcAttachments {
    let t = attachments(ns, dev);
    for hook in Hook::BOTH {
        assert!(
            t.programs(hook) >= 1,
            "{mode}: nothing attached on {dev} {}: {t:#?}",
            hook.as_str()
        );
    }
    match mode {
        "tcx" => assert!(
            !t.tcx_ingress.is_empty() && !t.tcx_egress.is_empty(),
            "tcx mode but no TCX programs: {t:#?}"
        ),
        "netlink" => assert!(
            t.clsact && !t.filters_ingress.is_empty() && !t.filters_egress.is_empty(),
            "netlink mode but no clsact filters: {t:#?}"
        ),
        _ => unreachable!(),
    }
    t
}

fn terminate_cleanly(probe: &mut Probe) {
    let st = probe.terminate(GRACE);
    assert!(
        st.is_some_and(|s| s.success()),
        "probe should exit 0 on SIGTERM within {GRACE:?}, got {st:?}\n{}",
        probe.log_tail(20)
    );
}

fn sigterm_leaves_nothing(subnet: u8, mode: &str) {
    cmd::require_root_and(&["ip", "nsenter", "tc", "bpftool"]);
    let pair = Pair::new(subnet).unwrap();
    let dev = pair.veth_a.as_str();
    assert!(attachments(&pair.a, dev).is_clean());
    let mut probe = Probe::start(&pair.a, ProbeOpts::iface(dev).tc_attach(mode));
    assert_attached(&pair.a, dev, mode);
    terminate_cleanly(&mut probe);
    let after = attachments(&pair.a, dev);
    assert!(
        after.is_clean(),
        "{mode}: leftovers after SIGTERM: {after:#?}\n{}",
        probe.log_tail(20)
    );
}

#[test]
fn tcx_sigterm_leaves_nothing() {
    sigterm_leaves_nothing(41, "tcx");
}

#[test]
fn netlink_sigterm_leaves_nothing() {
    sigterm_leaves_nothing(42, "netlink");
}

#[test]
fn netlink_keeps_a_preexisting_clsact_qdisc() {
    cmd::require_root_and(&["ip", "nsenter", "tc", "bpftool"]);
    let pair = Pair::new(43).unwrap();
    let dev = pair.veth_a.as_str();
    pair.a
        .run(&["tc", "qdisc", "add", "dev", dev, "clsact"])
        .unwrap();
    let mut probe = Probe::start(&pair.a, ProbeOpts::iface(dev).tc_attach("netlink"));
    assert_attached(&pair.a, dev, "netlink");
    terminate_cleanly(&mut probe);
    let after = attachments(&pair.a, dev);
    assert!(
        after.is_clean_except_qdisc(),
        "leftover filters after SIGTERM: {after:#?}"
    );
    assert!(
        after.clsact,
        "probe removed a clsact qdisc it did not create: {after:#?}"
    );
}

fn sigkill_then_restart_leaves_nothing(subnet: u8, mode: &str) {
    cmd::require_root_and(&["ip", "nsenter", "tc", "bpftool"]);
    let pair = Pair::new(subnet).unwrap();
    let dev = pair.veth_a.as_str();
    let mut first = Probe::start(&pair.a, ProbeOpts::iface(dev).tc_attach(mode));
    assert_attached(&pair.a, dev, mode);
    first.kill();
    let after_kill = attachments(&pair.a, dev);
    eprintln!(
        "{mode}: after SIGKILL: {} ingress / {} egress program(s) left, clsact {}",
        after_kill.programs(Hook::Ingress),
        after_kill.programs(Hook::Egress),
        after_kill.clsact
    );

    let mut second = Probe::start(&pair.a, ProbeOpts::iface(dev).tc_attach(mode));
    let running = assert_attached(&pair.a, dev, mode);
    eprintln!(
        "{mode}: restarted: {} ingress / {} egress program(s)",
        running.programs(Hook::Ingress),
        running.programs(Hook::Egress)
    );
    terminate_cleanly(&mut second);
    let after = attachments(&pair.a, dev);
    assert!(
        after.is_clean(),
        "{mode}: leftovers after SIGKILL, restart and SIGTERM: {after:#?}\n{}",
        second.log_tail(20)
    );
}

#[test]
fn tcx_sigkill_then_restart_leaves_nothing() {
    sigkill_then_restart_leaves_nothing(44, "tcx");
}

#[test]
fn netlink_sigkill_then_restart_leaves_nothing() {
    sigkill_then_restart_leaves_nothing(45, "netlink");
}

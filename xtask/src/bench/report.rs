//! The bench's report: one Markdown document, every measured number next to the design's bar
//! with PASS/FAIL, then the details behind them.
use super::flows::Flows;
use super::throughput::Throughput;
use super::Programs;
use probe_tests::median;
use std::fmt::Write as _;

/// Throughput with probe over without (information: noisy on shared machines).
pub const BAR_RATIO: f64 = 0.97;
/// A TC program per packet with 10,000 cold flows (issue 12), ns...
pub const BAR_TC_NS: f64 = 250.0;
/// ... and as a multiple of an empty TC program on the same packets (DESIGN.md).
pub const BAR_TC_X_EMPTY: f64 = 3.0;
/// All probe programs together per wire packet: 10,000 small flows, and iperf3 bulk.
pub const BAR_ALL_NS_FLOWS: f64 = 400.0;
pub const BAR_ALL_NS_BULK: f64 = 15.0;
/// sock_ops per callback, ns.
pub const BAR_SOCKOPS_NS: f64 = 250.0;
/// Daemon CPU, percent of one core, with 10,000 active flows at a 1 s tick.
pub const BAR_CPU_PERCENT: f64 = 1.0;
/// Daemon peak RSS, MiB (issue 12 halves DESIGN.md's 64).
pub const BAR_RSS_MIB: f64 = 32.0;
/// Features and scoring of one entity for one tick, microseconds (issue 35 halved 20).
const BAR_FEATURE_US: f64 = 10.0;
/// Burst events lost before the daemon read them, percent of the bursts that ended.
const BAR_EVENTS_LOST_PERCENT: f64 = 1.0;
/// One scrape of 10,000 series, ms.
pub const BAR_SCRAPE_MS: f64 = 50.0;
pub const BAR_SCRAPE_SERIES: usize = 10_000;

const MIB: f64 = 1024.0 * 1024.0;

/// Where and when the bench ran.
#[derive(Debug, Default)]
pub struct Machine {
    pub date: String,
    pub kernel: String,
    pub cpus: usize,
    pub cpu_model: String,
    pub revision: String,
    pub load_before: String,
}

impl Machine {
    pub fn now() -> Machine {
        let sh = |argv: &[&str]| {
            probe_tests::cmd::run(&mut probe_tests::cmd::command(argv))
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        };
        let root = crate::build::root().to_string_lossy().into_owned();
        let mut revision = sh(&["git", "-C", &root, "rev-parse", "--short", "HEAD"]);
        if !sh(&["git", "-C", &root, "status", "--porcelain"]).is_empty() {
            revision.push_str(" + uncommitted changes");
        }
        Machine {
            date: sh(&["date", "-u", "+%Y-%m-%d %H:%M UTC"]),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model: std::fs::read_to_string("/proc/cpuinfo")
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
                .unwrap_or_default(),
            revision,
            load_before: loadavg(),
        }
    }
}

/// The 1, 5 and 15 minute load averages.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Debug, Default)]
pub struct Report {
    pub machine: Machine,
    pub throughput: Option<Throughput>,
    /// The flows phases: many slow flows, then few fast ones.
    pub flows: Vec<Flows>,
    pub load_after: String,
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "FAIL"
    }
}

/// `12345` -> `12,345`.
fn thousands(n: f64) -> String {
    let s = format!("{:.0}", n.abs());
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0.0 {
        out.insert(0, '-');
    }
    out
}

/// The direction of traffic a TC program sees: Some(true) egress, Some(false) ingress.
fn tc_direction(program: &str) -> Option<bool> {
    if !program.starts_with("tc_") && !program.starts_with("nop_") {
        None
    } else if program.contains("egress") {
        Some(true)
    } else if program.contains("ingress") {
        Some(false)
    } else {
        None
    }
}

/// A flows phase by its load: `10,000 active flows` (a message a second each),
/// `1,000 flows x 1,000 msg/s`, `10,000 idle flows`.
fn phase(f: &Flows) -> String {
    let n = thousands(f.established as f64);
    if f.walk == "batch" {
        format!("{n} active flows, batch walks (the old walk, for the ratio)")
    } else if f.idle {
        format!("{n} idle flows")
    } else if f.interval_ms == 1000 {
        format!("{n} active flows")
    } else {
        format!(
            "{n} flows x {} msg/s",
            thousands(1000.0 / f.interval_ms.max(1) as f64)
        )
    }
}

/// The phase's tick as the report names it ("1 s", "500 ms").
fn tick_label(f: &Flows) -> String {
    if f.tick_ms.is_multiple_of(1000) {
        format!("{} s", f.tick_ms / 1000)
    } else {
        format!("{} ms", f.tick_ms)
    }
}

/// The daemon's ticks in a phase's window.
fn ticks_in_window(f: &Flows) -> f64 {
    (f.window_seconds * 1000.0 / f.tick_ms.max(1) as f64)
        .round()
        .max(1.0)
}

/// The sum of every probe program's run time over a phase's window.
fn kernel_seconds(f: &Flows) -> f64 {
    f.bpf.values().map(|(t, _)| t).sum()
}

/// The bars are set for 10,000 active flows at a message a second each; the other phases
/// are reported beside them for information.
fn judge(f: &Flows, pass: bool) -> &'static str {
    if !f.idle && f.interval_ms == 1000 && f.tick_ms == 1000 && f.walk != "batch" {
        verdict(pass)
    } else {
        "info"
    }
}

/// ns per run of the empty program that saw the same packets as probe's program of
/// direction `egress`: the peer veth's hook of the other direction.
fn empty_ns(f: &Flows, egress: bool) -> Option<f64> {
    f.nop
        .iter()
        .find(|(n, _)| tc_direction(n) == Some(!egress))
        .and_then(|(_, st)| ns_per(st.run_ns as f64 * 1e-9, st.runs as f64))
}

fn ns_per(seconds: f64, n: f64) -> Option<f64> {
    (n > 0.0).then(|| seconds * 1e9 / n)
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

/// One row of the summary.
struct Check {
    what: String,
    value: String,
    bar: String,
    verdict: &'static str,
}

fn checks(r: &Report) -> Vec<Check> {
    let mut out = Vec::new();
    if let Some(t) = &r.throughput {
        let (mw, mp) = (median(&t.without), median(&t.with));
        if let (Some(mw), Some(mp)) = (mw, mp) {
            let ratio = mp / mw;
            out.push(Check {
                what: format!(
                    "iperf3 throughput with probe / without (medians of {} alternating rounds of {} s)",
                    t.without.len(),
                    t.seconds
                ),
                value: format!("{ratio:.3} ({:.2} / {:.2} Gbit/s)", mp / 1e9, mw / 1e9),
                bar: format!(">= {BAR_RATIO} (information: noisy here)"),
                verdict: "info",
            });
        }
    }
    for f in &r.flows {
        for (prog, (secs, runs)) in &f.bpf {
            let Some(per_run) = ns_per(*secs, *runs) else {
                continue;
            };
            if prog == "sockops_tcp" {
                let floor = f
                    .nop
                    .iter()
                    .find(|(n, _)| *n == super::nop::NopSockOps::NAME)
                    .and_then(|(_, st)| ns_per(st.run_ns as f64 * 1e-9, st.runs as f64));
                out.push(Check {
                    what: format!("`{prog}` ns per callback, {}", phase(f)),
                    value: match floor {
                        Some(e) => format!(
                            "{per_run:.1} (an empty sock_ops program: {e:.1}, {:.1}x)",
                            per_run / e
                        ),
                        None => format!("{per_run:.1}"),
                    },
                    bar: format!("<= {BAR_SOCKOPS_NS:.0}"),
                    verdict: judge(f, per_run <= BAR_SOCKOPS_NS),
                });
                continue;
            }
            let Some(egress) = tc_direction(prog) else {
                continue;
            };
            let wire = if egress {
                f.wire.tx_packets
            } else {
                f.wire.rx_packets
            };
            let floor = empty_ns(f, egress);
            let times = floor.map(|e| per_run / e);
            out.push(Check {
                what: format!(
                    "`{prog}` ns per packet, {} (run time / runs; {:.2} wire packets per run), and as a multiple of the empty program on the same packets",
                    phase(f),
                    wire / runs
                ),
                value: match (times, floor) {
                    (Some(x), Some(e)) => format!("{per_run:.1} ({x:.1}x the empty {e:.1})"),
                    _ => format!("{per_run:.1} (no empty program measured)"),
                },
                bar: format!("<= {BAR_TC_NS:.0} and <= {BAR_TC_X_EMPTY:.0}x"),
                verdict: judge(
                    f,
                    per_run <= BAR_TC_NS && times.is_some_and(|x| x <= BAR_TC_X_EMPTY),
                ),
            });
        }
        let wire = f.wire.rx_packets + f.wire.tx_packets;
        if let Some(all) = ns_per(kernel_seconds(f), wire) {
            out.push(Check {
                what: format!(
                    "all probe programs together, ns per wire packet, {}",
                    phase(f)
                ),
                value: format!("{all:.1}"),
                bar: format!("<= {BAR_ALL_NS_FLOWS:.0}"),
                verdict: judge(f, all <= BAR_ALL_NS_FLOWS),
            });
        }
    }
    if let Some(t) = &r.throughput {
        let busy: f64 = t.rounds.iter().map(|r| r.machine_busy_seconds).sum();
        let kernel: f64 = t.programs().values().map(|(s, _)| s).sum();
        if busy > 0.0 {
            out.push(Check {
                what: "probe's kernel CPU (all its programs' run time) / the machine's busy CPU, under iperf3".to_owned(),
                value: format!("{:.2}% ({kernel:.3} of {busy:.1} CPU s)", 100.0 * kernel / busy),
                bar: "-".to_owned(),
                verdict: "info",
            });
        }
        let (rx, tx) = t.wire_packets();
        if let Some(all) = ns_per(kernel, rx + tx) {
            out.push(Check {
                what: "all probe programs together, ns per wire packet, iperf3 bulk".to_owned(),
                value: format!("{all:.1}"),
                bar: format!("<= {BAR_ALL_NS_BULK:.0}"),
                verdict: verdict(all <= BAR_ALL_NS_BULK),
            });
        }
        for (prog, (secs, runs)) in &t.programs() {
            if prog == "sockops_tcp" {
                if let Some(per_run) = ns_per(*secs, *runs) {
                    out.push(Check {
                        what: format!("`{prog}` ns per callback, iperf3 bulk"),
                        value: format!("{per_run:.1}"),
                        bar: format!("<= {BAR_SOCKOPS_NS:.0}"),
                        verdict: verdict(per_run <= BAR_SOCKOPS_NS),
                    });
                }
                continue;
            }
            let Some(egress) = tc_direction(prog).filter(|_| *runs > 0.0) else {
                continue;
            };
            let wire = if egress { tx } else { rx };
            let Some(per_packet) = ns_per(*secs, wire) else {
                continue;
            };
            out.push(Check {
                what: format!(
                    "`{prog}` ns per wire packet under iperf3 ({:.1} wire packets per run: GSO)",
                    wire / runs
                ),
                value: format!("{per_packet:.1}"),
                bar: "-".to_owned(),
                verdict: "info",
            });
        }
    }
    for f in &r.flows {
        let flows = format!("{}, {} tick", phase(f), tick_label(f));
        if f.machine_busy_seconds > 0.0 {
            let share = 100.0 * kernel_seconds(f) / f.machine_busy_seconds;
            out.push(Check {
                what: format!(
                    "probe's kernel CPU (all its programs' run time) / the machine's busy CPU, {flows}"
                ),
                value: format!(
                    "{share:.2}% ({:.3} of {:.1} CPU s)",
                    kernel_seconds(f),
                    f.machine_busy_seconds
                ),
                bar: "-".to_owned(),
                verdict: "info",
            });
        }
        let cpu = 100.0 * f.cpu_seconds / f.window_seconds;
        out.push(Check {
            what: format!(
                "daemon CPU, {flows} (utime+stime over {:.0} s)",
                f.window_seconds
            ),
            value: format!("{cpu:.2}% of one core"),
            bar: format!("<= {BAR_CPU_PERCENT}%"),
            verdict: judge(f, cpu <= BAR_CPU_PERCENT),
        });
        // Microseconds per entity per tick (ticks in the window at the phase's tick).
        let per_entity =
            |seconds: f64, entities: f64| 1e6 * seconds / ticks_in_window(f) / entities;
        let features_us = per_entity(f.feature_seconds, f.feature_entities);
        if f.feature_entities > 0.0 {
            out.push(Check {
                what: format!(
                    "feature stage per entity per tick, {flows} ({:.0} entities)",
                    f.feature_entities
                ),
                value: format!("{features_us:.1} us"),
                bar: format!("<= {BAR_FEATURE_US:.0} us (with scoring)"),
                verdict: judge(f, features_us <= BAR_FEATURE_US),
            });
        }
        if f.model_entities > 0.0 {
            let us = per_entity(f.model_seconds, f.model_entities);
            let both = us + features_us;
            out.push(Check {
                what: format!(
                    "spike model scoring per scored entity per tick (all models), {flows} ({:.0} entities)",
                    f.model_entities
                ),
                value: format!("{us:.1} us (features + scoring {both:.1} us)"),
                bar: format!("<= {BAR_FEATURE_US:.0} us (features + scoring)"),
                verdict: judge(f, both <= BAR_FEATURE_US),
            });
        }
        let rss = f.peak_rss_bytes as f64 / MIB;
        out.push(Check {
            what: format!("daemon peak RSS (VmHWM), {flows}"),
            value: format!("{rss:.1} MiB"),
            bar: format!("<= {BAR_RSS_MIB:.0} MiB"),
            verdict: judge(f, rss <= BAR_RSS_MIB),
        });
        if f.burst_ends > 0.0 {
            // Every burst feature is computed from the events the daemon read.
            let lost = 100.0 * f.events_lost / f.burst_ends;
            out.push(Check {
                what: format!("burst events lost before the daemon read them, {flows}"),
                value: format!(
                    "{lost:.2}% ({} of {})",
                    thousands(f.events_lost),
                    thousands(f.burst_ends)
                ),
                bar: format!("<= {BAR_EVENTS_LOST_PERCENT}%"),
                verdict: if f.idle {
                    "info"
                } else {
                    verdict(lost <= BAR_EVENTS_LOST_PERCENT)
                },
            });
        }
        if let (Some(med), Some(max)) = (
            median(&f.scrape_seconds),
            f.scrape_seconds.iter().copied().reduce(f64::max),
        ) {
            let (med, max) = (med * 1e3, max * 1e3);
            out.push(Check {
                what: format!(
                    "/metrics scrape, {flows}: median (max) of {}, {} series",
                    f.scrape_seconds.len(),
                    thousands(f.series as f64)
                ),
                value: format!("{med:.1} ms ({max:.1} ms)"),
                bar: format!(
                    "< {BAR_SCRAPE_MS:.0} ms for {} series",
                    thousands(BAR_SCRAPE_SERIES as f64)
                ),
                verdict: if f.series < BAR_SCRAPE_SERIES {
                    "n/a (fewer series)"
                } else {
                    verdict(med < BAR_SCRAPE_MS)
                },
            });
        }
    }
    out
}

/// The results as a Markdown document (also readable as plain text).
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let m = &r.machine;
    let _ = writeln!(s, "## probe bench\n");
    let _ = writeln!(
        s,
        "{}; probe {} (release); kernel {}; {} CPUs ({}); load average {} before, {} after.\n",
        m.date, m.revision, m.kernel, m.cpus, m.cpu_model, m.load_before, r.load_after
    );
    let _ = writeln!(s, "| measure | value | bar | verdict |\n|---|---:|---|---|");
    for c in checks(r) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            c.what, c.value, c.bar, c.verdict
        );
    }
    if let Some(t) = &r.throughput {
        render_throughput(&mut s, t);
    }
    for f in &r.flows {
        render_flows(&mut s, f);
    }
    render_programs(&mut s, r);
    let _ = writeln!(
        s,
        "\nRun times are the kernel's BPF run-time statistics (kernel.bpf_stats_enabled, which \
         probe turns on while it runs): they include the statistics' own clock reads. The empty \
         TC programs (`nop_ingress`, `nop_egress`, loaded by the bench on the other end of the \
         veth) show what they report for a program that does nothing; so does the empty \
         sock_ops program (`nop_sockops`, on the cgroup v2 root beside probe's, run at the same \
         callbacks). A TC run handles one skb, which may be a GSO packet of several wire packets; \"per wire packet\" divides the run time by the \
         packets probe counted (GSO packets as their segments). sock_ops and the tracepoints \
         are host-wide: their runs include every socket and packet on the machine, not only \
         the bench's."
    );
    s
}

fn render_throughput(s: &mut String, t: &Throughput) {
    let _ = writeln!(
        s,
        "\n### Throughput\n\n{} rounds of {} s iperf3 TCP over a veth, offloads {}, alternately \
         without and with probe attached (even rounds start without).\n",
        t.without.len(),
        t.seconds,
        if t.no_offloads { "off" } else { "on" }
    );
    let _ = writeln!(
        s,
        "| round | without (Gbit/s) | with (Gbit/s) |\n|---:|---:|---:|"
    );
    for (i, (a, b)) in t.without.iter().zip(&t.with).enumerate() {
        let _ = writeln!(s, "| {} | {:.3} | {:.3} |", i + 1, a / 1e9, b / 1e9);
    }
    let cpu: f64 = t.rounds.iter().map(|r| r.cpu_seconds).sum();
    let wall: f64 = t.rounds.iter().map(|r| r.wall_seconds).sum();
    let rss = t.rounds.iter().map(|r| r.peak_rss_bytes).max().unwrap_or(0);
    let (rx, tx) = t.wire_packets();
    let all: f64 = t.programs().values().map(|(secs, _)| secs).sum();
    let iperf_seconds = t.seconds as f64 * t.rounds.len() as f64;
    let _ = writeln!(
        s,
        "\nAll probe programs together (TC, sock_ops, tracepoints) ran {:.0} ms in the {iperf_seconds:.0} s \
         of with-probe iperf3: {:.2}% of one core, {} ns per wire packet on the veth.",
        all * 1e3,
        100.0 * all / iperf_seconds,
        fmt_opt(ns_per(all, rx + tx), 1)
    );
    let _ = writeln!(
        s,
        "\nDuring the with-probe runs: daemon CPU {:.2}% of one core ({cpu:.2} s over {wall:.1} s, \
         start-up included), peak RSS {:.1} MiB; the veth carried {} skbs, {} wire packets.",
        100.0 * cpu / wall,
        rss as f64 / MIB,
        thousands(t.veth_skbs()),
        thousands(rx + tx)
    );
}

fn render_flows(s: &mut String, f: &Flows) {
    let _ = writeln!(s, "\n### Daemon with {}\n", phase(f));
    let _ = writeln!(s, "| measure | value |\n|---|---:|");
    let mut row = |k: &str, v: String| {
        let _ = writeln!(s, "| {k} | {v} |");
    };
    row(
        "connections established by flowgen",
        format!(
            "{} of {} in {:.2} s, to {} peer addresses x 4 ports",
            thousands(f.established as f64),
            thousands(f.conns as f64),
            f.connect_seconds,
            f.peers
        ),
    );
    row(
        "`probe_flows_tracked` (expected: 2 per connection, egress and ingress)",
        thousands(f.flows_tracked),
    );
    row("`probe_flow_evictions_total`", thousands(f.flow_evictions));
    row(
        "bursts ended over the window (`probe_bursts_total`), and of them lost as events (`probe_events_lost_total`)",
        format!(
            "{} ({}/s), {} lost",
            thousands(f.burst_ends),
            thousands(f.burst_ends / f.window_seconds.max(1e-9)),
            thousands(f.events_lost)
        ),
    );
    row(
        "of them read but kept for the features only, past a tick's cap (`probe_events_thinned_total`)",
        thousands(f.events_thinned),
    );
    row(
        "`probe_tcp_connections`, the bench's peers (expected: 2 per connection, both ends are on this host)",
        thousands(f.tcp_connections),
    );
    row(
        "`probe_tcp_connections`, all peers (host-wide; of them `peer=\"other\"`)",
        format!(
            "{} ({})",
            thousands(f.tcp_connections_all),
            thousands(f.tcp_connections_other)
        ),
    );
    row(
        "daemon CPU over the window (utime+stime)",
        format!(
            "{:.2} s in {:.1} s = {:.2}% of one core",
            f.cpu_seconds,
            f.window_seconds,
            100.0 * f.cpu_seconds / f.window_seconds
        ),
    );
    if !f.stage_seconds.is_empty() {
        let ticks = ticks_in_window(f);
        row(
            &format!(
                "daemon tick by stage, ms per {} tick (wall clock)",
                tick_label(f)
            ),
            f.stage_seconds
                .iter()
                .map(|(st, sec)| format!("{st} {:.2}", 1e3 * sec / ticks))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    row(
        "daemon RSS at the end of the window (VmRSS) / peak (VmHWM)",
        format!(
            "{:.1} / {:.1} MiB",
            f.rss_bytes as f64 / MIB,
            f.peak_rss_bytes as f64 / MIB
        ),
    );
    row(
        "veth packets over the window, rx / tx (probe's count; the veth's own)",
        format!(
            "{} / {} ({} / {})",
            thousands(f.wire.rx_packets),
            thousands(f.wire.tx_packets),
            thousands(f.veth.rx_packets),
            thousands(f.veth.tx_packets)
        ),
    );
    let wire = f.wire.rx_packets + f.wire.tx_packets;
    let all = kernel_seconds(f);
    row(
        "wire packets per second on the veth, rx + tx",
        thousands(wire / f.window_seconds.max(1e-9)),
    );
    row(
        "the machine's busy CPU over the window (/proc/stat, all CPUs); probe's programs' share",
        format!(
            "{:.1} CPU s; {:.3} s = {:.2}%",
            f.machine_busy_seconds,
            all,
            100.0 * all / f.machine_busy_seconds.max(1e-9)
        ),
    );
    row(
        "all probe programs together (TC, sock_ops, tracepoints), ns per wire packet on the veth",
        format!(
            "{} (both ends of every connection are on this host: sock_ops and the \
             tracepoints run for the client's and the server's socket)",
            fmt_opt(ns_per(all, wire), 1)
        ),
    );
    for (prog, (secs, runs)) in &f.bpf {
        let Some(egress) = tc_direction(prog) else {
            continue;
        };
        // The empty program that saw the same packets: the peer's hook of the other direction.
        let floor = empty_ns(f, egress);
        if let (Some(per_run), Some(floor)) = (ns_per(*secs, *runs), floor) {
            row(
                &format!("`{prog}` ns per run, and above the empty program's {floor:.1} ns on the same packets"),
                format!("{per_run:.1} ({:.1} above)", per_run - floor),
            );
        }
    }
    let mut sorted = f.scrape_seconds.clone();
    sorted.sort_by(f64::total_cmp);
    row(
        "/metrics scrapes: min / median / max",
        format!(
            "{:.1} / {:.1} / {:.1} ms ({} scrapes)",
            sorted.first().copied().unwrap_or(f64::NAN) * 1e3,
            median(&sorted).unwrap_or(f64::NAN) * 1e3,
            sorted.last().copied().unwrap_or(f64::NAN) * 1e3,
            sorted.len()
        ),
    );
    row(
        "last scrape: series / bytes",
        format!(
            "{} / {}",
            thousands(f.series as f64),
            thousands(f.scrape_bytes as f64)
        ),
    );
    if let Some(e) = &f.nop_error {
        row("empty programs (floor)", format!("not measured: {e}"));
    }
    if !f.flowgen_log.is_empty() {
        row("flowgen", f.flowgen_log.replace('\n', "; "));
    }
}

/// Every program of both phases: runs, ns per run, wire packets, ns per wire packet.
fn render_programs(s: &mut String, r: &Report) {
    let _ = writeln!(
        s,
        "\n### Kernel cost per program\n\n\
         | program | phase | runs | ns per run | wire packets | ns per wire packet |\n\
         |---|---|---:|---:|---:|---:|"
    );
    let mut rows = |phase: &str, progs: &Programs, rx: f64, tx: f64| {
        for (prog, (secs, runs)) in progs {
            // A program that never ran (e.g. the raw-IP variant on an Ethernet device) saw no
            // packets.
            let wire = tc_direction(prog)
                .filter(|_| *runs > 0.0)
                .map(|e| if e { tx } else { rx });
            let _ = writeln!(
                s,
                "| `{prog}` | {phase} | {} | {} | {} | {} |",
                thousands(*runs),
                fmt_opt(ns_per(*secs, *runs), 1),
                wire.map_or_else(|| "-".to_owned(), thousands),
                fmt_opt(wire.and_then(|w| ns_per(*secs, w)), 1),
            );
        }
    };
    if let Some(t) = &r.throughput {
        let (rx, tx) = t.wire_packets();
        rows("iperf3", &t.programs(), rx, tx);
    }
    for f in &r.flows {
        let phase = phase(f);
        rows(&phase, &f.bpf, f.wire.rx_packets, f.wire.tx_packets);
        // The empty TC programs sit on the other end of the veth: their ingress is A's
        // egress. The empty sock_ops program is on the cgroup v2 root, beside probe's.
        let nop: Programs = f
            .nop
            .iter()
            .map(|(n, st)| {
                let at = if tc_direction(n).is_some() {
                    "peer veth"
                } else {
                    "cgroup v2 root"
                };
                (
                    format!("{n} ({at})"),
                    (st.run_ns as f64 * 1e-9, st.runs as f64),
                )
            })
            .collect();
        // Swap the directions: the peer's ingress carries A's transmitted packets.
        rows(&phase, &nop, f.wire.tx_packets, f.wire.rx_packets);
    }
}

#[cfg(test)]
mod tests {
    use super::super::throughput::ProbeRound;
    use super::*;

    #[test]
    fn formats_thousands() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(20_001.4), "20,001");
        assert_eq!(thousands(-1_234_567.0), "-1,234,567");
    }

    #[test]
    fn renders_bars_and_verdicts() {
        let mut round = ProbeRound {
            cpu_seconds: 0.1,
            wall_seconds: 10.0,
            peak_rss_bytes: 20 << 20,
            ..Default::default()
        };
        round.bpf.insert("tc_egress_eth".into(), (0.5, 1e7));
        round.bpf.insert("tc_egress_rawip".into(), (0.0, 0.0));
        round.wire.tx_packets = 2e7;
        let mut flows = Flows {
            conns: 10_000,
            peers: 64,
            established: 10_000,
            interval_ms: 1000,
            tick_ms: 1000,
            cpu_seconds: 0.3,
            window_seconds: 20.0,
            machine_busy_seconds: 2.0,
            peak_rss_bytes: 80 << 20,
            scrape_seconds: vec![0.010, 0.030, 0.020],
            series: 12_000,
            stage_seconds: vec![("collect".into(), 0.2), ("features".into(), 0.05)],
            burst_ends: 600_000.0,
            events_lost: 12.0,
            events_thinned: 0.0,
            ..Default::default()
        };
        flows.bpf.insert("tc_ingress_eth".into(), (0.0012, 1e4));
        flows.bpf.insert("sockops_tcp".into(), (0.001, 1e4));
        flows.wire.rx_packets = 1e4;
        flows.nop.push((
            "nop_ingress",
            super::super::nop::RunStats {
                run_ns: 300_000,
                runs: 10_000,
            },
        ));
        flows.nop.push((
            "nop_egress",
            super::super::nop::RunStats {
                run_ns: 300_000,
                runs: 10_000,
            },
        ));
        flows.nop.push((
            "nop_sockops",
            super::super::nop::RunStats {
                run_ns: 400_000,
                runs: 10_000,
            },
        ));
        let mut hot = Flows {
            conns: 1_000,
            established: 1_000,
            interval_ms: 1,
            tick_ms: 1000,
            window_seconds: 20.0,
            machine_busy_seconds: 30.0,
            ..Default::default()
        };
        hot.bpf.insert("tc_ingress_eth".into(), (0.3, 1e6));
        hot.wire.rx_packets = 1e6;
        let r = Report {
            throughput: Some(Throughput {
                seconds: 1,
                without: vec![10e9, 12e9],
                with: vec![9.9e9, 11.8e9],
                rounds: vec![round],
                ..Default::default()
            }),
            flows: vec![flows, hot],
            ..Default::default()
        };
        let md = render(&r);
        assert!(
            md.contains(
                "| 0.986 (10.85 / 11.00 Gbit/s) | >= 0.97 (information: noisy here) | info |"
            ),
            "{md}"
        );
        // Under 250 ns but 4x the empty program's 30 ns: a fail.
        assert!(md.contains("`tc_ingress_eth` ns per packet, 10,000 active flows (run time / runs; 1.00 wire packets per run), and as a multiple of the empty program on the same packets | 120.0 (4.0x the empty 30.0) | <= 250 and <= 3x | FAIL |"), "{md}");
        assert!(
            md.contains(
                "| `sockops_tcp` ns per callback, 10,000 active flows | 100.0 (an empty sock_ops program: 40.0, 2.5x) | <= 250 | PASS |"
            ),
            "{md}"
        );
        assert!(md.contains("| all probe programs together, ns per wire packet, 10,000 active flows | 220.0 | <= 400 | PASS |"), "{md}");
        assert!(md.contains("| all probe programs together, ns per wire packet, iperf3 bulk | 25.0 | <= 15 | FAIL |"), "{md}");
        assert!(md.contains("`tc_egress_eth` ns per wire packet under iperf3 (2.0 wire packets per run: GSO) | 25.0 | - | info |"), "{md}");
        assert!(md.contains("| 1.50% of one core | <= 1% | FAIL |"), "{md}");
        // probe's programs: 2.2 ms of the machine's 2 busy CPU seconds; 0.3 s of 30 s.
        assert!(md.contains("| probe's kernel CPU (all its programs' run time) / the machine's busy CPU, 10,000 active flows, 1 s tick | 0.11% (0.002 of 2.0 CPU s) | - | info |"), "{md}");
        assert!(
            md.contains(
                "| daemon tick by stage, ms per 1 s tick (wall clock) | collect 10.00, features 2.50 |"
            ),
            "{md}"
        );
        // Only the 10,000-flow phase is judged.
        assert!(md.contains("`tc_ingress_eth` ns per packet, 1,000 flows x 1,000 msg/s (run time / runs; 1.00 wire packets per run), and as a multiple of the empty program on the same packets | 300.0 (no empty program measured) | <= 250 and <= 3x | info |"), "{md}");
        assert!(
            md.contains("| 1.00% (0.300 of 30.0 CPU s) | - | info |"),
            "{md}"
        );
        assert!(
            md.contains("### Daemon with 1,000 flows x 1,000 msg/s"),
            "{md}"
        );
        assert!(md.contains("| 80.0 MiB | <= 32 MiB | FAIL |"), "{md}");
        assert!(
            md.contains("(`probe_events_lost_total`) | 600,000 (30,000/s), 12 lost |"),
            "{md}"
        );
        assert!(
            md.contains("| 20.0 ms (30.0 ms) | < 50 ms for 10,000 series | PASS |"),
            "{md}"
        );
        assert!(
            md.contains("| `sockops_tcp` | 10,000 active flows | 10,000 | 100.0 | - | - |"),
            "{md}"
        );
        assert!(
            md.contains("| `nop_sockops (cgroup v2 root)` | 10,000 active flows | 10,000 | 40.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| `tc_egress_rawip` | iperf3 | 0 | - | - | - |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| `nop_ingress (peer veth)` | 10,000 active flows | 10,000 | 30.0 | 0 | - |"
            ),
            "{md}"
        );
        assert!(md.contains("| 2 | 12.000 | 11.800 |"), "{md}");
        assert!(
            md.contains("ran 500 ms in the 1 s of with-probe iperf3: 50.00% of one core, 25.0 ns per wire packet"),
            "{md}"
        );
    }
}

//! `cargo xtask bench`: probe's overhead, measured against the design's bars
//! (shared DESIGN.md, "Quality bars"; docs/benchmarks.md explains every number).
//!
//! Two namespaces joined by a veth (subnet 10.231.201.0/24), then three phases:
//! 1. Throughput: K rounds, each one iperf3 TCP run without probe and one with probe attached
//!    to the sender's veth (the order alternates between rounds, so drift hits both sides
//!    alike): the ratio of the medians (information: too noisy here to judge), and the
//!    kernel cost of each program under GSO-heavy traffic, per run and per wire packet (bar:
//!    all programs <= 15 ns per wire packet).
//! 2. Flows: probe at a 1 s tick, then `flowgen` opens 10,000 TCP connections from A to B
//!    (spread over `--flow-peers` addresses of B and 4 ports) and sends a small message on
//!    each every second. Over a steady window with no scrape: the daemon's CPU (utime+stime,
//!    bar: <= 1% of one core) and peak RSS (bar: <= 32 MiB), the cost per run and per packet
//!    of every program (bars: TC <= 250 ns and <= 3x the empty program, sock_ops <= 250 ns
//!    per callback, all programs <= 400 ns per wire packet), beside an empty TC program on
//!    the other end of the veth (the floor the run-time statistics report for doing nothing),
//!    and probe's kernel CPU as a share of the machine's busy CPU. Then timed /metrics
//!    scrapes (bar: < 50 ms for 10,000 series).
//! 3. Hot flows: the same with 1,000 connections sending every millisecond (as fast as
//!    flowgen can): what a parameter server or a pipeline stage looks like. Information:
//!    the bars are judged on phase 2.
//!
//! Prints one Markdown report (every number with its bar and PASS/FAIL) and writes it to
//! `--out` (default `target/bench.md`).
use anyhow::{bail, Context, Result};
use probe_tests::{netns, Metrics, Pair};
use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod flows;
mod nop;
mod report;
mod throughput;

/// The subnet (10.231.X.0/24) of the bench's namespaces; the integration tests use others.
const SUBNET: u8 = 201;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Path of a release probe binary.
    #[arg(long)]
    pub probe: Option<PathBuf>,
    /// Throughput rounds; each runs iperf3 once without and once with probe (0: skip).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Seconds of each iperf3 run.
    #[arg(long, default_value_t = 5)]
    pub seconds: u32,
    /// Turn TSO/GSO/GRO off on the veths, so that each TC program run is one wire packet.
    #[arg(long)]
    pub no_offloads: bool,
    /// Concurrent TCP connections of the flows phase (0: skip the phase).
    #[arg(long, default_value_t = 10_000)]
    pub flows: usize,
    /// Addresses (peers) the connections are spread over; sets the size of the scrape.
    #[arg(long, default_value_t = 64)]
    pub flow_peers: u8,
    /// Seconds of the steady window in which the daemon's CPU and the programs' cost are
    /// measured.
    #[arg(long, default_value_t = 20)]
    pub window: u64,
    /// Timed /metrics scrapes after the window.
    #[arg(long, default_value_t = 20)]
    pub scrapes: usize,
    /// Keep the connections open but idle instead of sending on each every second.
    #[arg(long)]
    pub idle_flows: bool,
    /// Connections of the high-rate phase (a parameter server or pipeline stage: few flows,
    /// many messages); 0 skips it.
    #[arg(long, default_value_t = 1_000)]
    pub hot_flows: usize,
    /// Milliseconds between two messages of one connection in the high-rate phase (flowgen
    /// sends as fast as it can when it cannot keep up; the report gives the packet rate).
    #[arg(long, default_value_t = 1)]
    pub hot_interval_ms: u64,
    /// The daemon's tick in the flows phases, in milliseconds. The bars are judged at the
    /// default 1 s; a longer tick hands over more burst events per tick (2000 makes a busy
    /// tick's events exceed the daemon's per-tick cap at the high-rate phase's load).
    #[arg(long, default_value_t = 1000)]
    pub tick_ms: u64,
    /// Path of a flowgen binary (default: build it in release).
    #[arg(long)]
    pub flowgen: Option<PathBuf>,
    /// Write the report here too (default: target/bench.md).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// program -> (run seconds, runs).
pub type Programs = BTreeMap<String, (f64, f64)>;

fn bpf_counters(m: &Metrics) -> Programs {
    let mut out = Programs::new();
    for s in m.select("probe_bpf_run_seconds_total", &[]) {
        if let Some(p) = s.labels.get("program") {
            out.entry(p.clone()).or_default().0 += s.value;
        }
    }
    for s in m.select("probe_bpf_runs_total", &[]) {
        if let Some(p) = s.labels.get("program") {
            out.entry(p.clone()).or_default().1 += s.value;
        }
    }
    out
}

/// `after - before`, per program.
fn bpf_deltas(before: &Programs, after: &Programs) -> Programs {
    after
        .iter()
        .map(|(prog, (t1, n1))| {
            let (t0, n0) = before.get(prog).copied().unwrap_or_default();
            (prog.clone(), (t1 - t0, n1 - n0))
        })
        .collect()
}

/// Busy seconds of all CPUs since boot: /proc/stat's first line, everything but idle and
/// iowait (guest time is already inside user time).
pub fn machine_busy_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    parse_busy(&stat).context("/proc/stat has no cpu line")
}

fn parse_busy(stat: &str) -> Option<f64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal
    let busy = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| v.get(i))
        .sum::<f64>();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(busy / if hz > 0.0 { hz } else { 100.0 })
}

pub fn run(args: BenchArgs) -> Result<()> {
    let bin = args
        .probe
        .clone()
        .context("--probe PATH: the release probe binary to measure")?;
    if !bin.is_file() {
        bail!("{} is not a file", bin.display());
    }
    let bin = std::fs::canonicalize(&bin)?.to_string_lossy().into_owned();
    if args.seconds == 0 || args.window == 0 {
        bail!("--seconds and --window must be at least 1");
    }
    if args.rounds == 0 && args.flows == 0 && args.hot_flows == 0 {
        bail!("nothing to do: --rounds 0, --flows 0 and --hot-flows 0");
    }
    if args.hot_interval_ms == 0 {
        bail!("--hot-interval-ms must be at least 1");
    }
    probe_tests::cmd::require_root_and(&["ip", "nsenter", "iperf3", "ethtool", "ss"]);
    let flowgen = match (&args.flowgen, args.flows.max(args.hot_flows)) {
        (_, 0) => None,
        (Some(p), _) => Some(std::fs::canonicalize(p)?),
        (None, _) => Some(build_flowgen()?),
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| crate::build::target_dir().join("bench.md"));

    let mut rep = report::Report {
        machine: report::Machine::now(),
        ..Default::default()
    };
    let pair = Pair::new(SUBNET)?;
    if args.no_offloads {
        netns::set_offloads(&pair.a, &pair.veth_a, false)?;
        netns::set_offloads(&pair.b, &pair.veth_b, false)?;
    }
    if args.rounds > 0 {
        rep.throughput = Some(throughput::run(
            &pair,
            &bin,
            args.rounds,
            args.seconds,
            args.no_offloads,
        )?);
    }
    if let Some(flowgen) = &flowgen {
        let many = flows::FlowOpts {
            conns: args.flows,
            peers: args.flow_peers,
            window: Duration::from_secs(args.window),
            scrapes: args.scrapes.max(1),
            idle: args.idle_flows,
            interval_ms: 1000,
            tick_ms: args.tick_ms.max(1),
            walk: "select",
        };
        let hot = flows::FlowOpts {
            conns: args.hot_flows,
            idle: false,
            interval_ms: args.hot_interval_ms,
            ..many.clone()
        };
        // The walk the kernel selection replaced, at the bars' load, for the ratio.
        let batch = flows::FlowOpts {
            walk: "batch",
            ..many.clone()
        };
        for o in [many, batch, hot].iter().filter(|o| o.conns > 0) {
            rep.flows.push(flows::run(&pair, &bin, flowgen, o)?);
        }
    }
    drop(pair);
    rep.load_after = report::loadavg();

    let text = report::render(&rep);
    println!("{text}");
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, &text).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

/// Builds flowgen in release and returns the path of the binary.
fn build_flowgen() -> Result<PathBuf> {
    let mut c = crate::build::cargo();
    c.args([
        "build",
        "--quiet",
        "--release",
        "-p",
        "xtask",
        "--bin",
        "flowgen",
        "--message-format=json-render-diagnostics",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    eprintln!("bench: building flowgen (release)");
    built_exe(c, "flowgen")
}

/// Runs a `cargo build --message-format=json...` and returns the executable of `target`.
fn built_exe(mut c: Command, target: &str) -> Result<PathBuf> {
    let mut child = c.spawn().context("running cargo build")?;
    let mut exe = None;
    let stdout = child.stdout.take().context("piped stdout")?;
    for line in BufReader::new(stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line?) else {
            continue;
        };
        if v["reason"] == "compiler-artifact" && v["target"]["name"] == target {
            if let Some(p) = v["executable"].as_str() {
                exe = Some(PathBuf::from(p));
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("building {target} failed ({status})");
    }
    let exe = exe.with_context(|| format!("cargo did not report the {target} executable"))?;
    if !Path::new(&exe).is_file() {
        bail!("{} is missing after the build", exe.display());
    }
    Ok(exe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_subtracts_bpf_counters_per_program() {
        let m = Metrics::parse(
            "probe_bpf_run_seconds_total{program=\"a\"} 0.25\n\
             probe_bpf_runs_total{program=\"a\"} 100\n\
             probe_bpf_runs_total{program=\"b\"} 0\n",
        )
        .unwrap();
        let c = bpf_counters(&m);
        assert_eq!(c["a"], (0.25, 100.0));
        assert_eq!(c["b"], (0.0, 0.0));
        let mut later = c.clone();
        later.insert("a".into(), (0.75, 300.0));
        later.insert("c".into(), (1.0, 10.0));
        let d = bpf_deltas(&c, &later);
        assert_eq!(d["a"], (0.5, 200.0));
        assert_eq!(d["c"], (1.0, 10.0));
    }

    #[test]
    fn busy_cpu_leaves_out_idle_and_iowait() {
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        // user nice system idle iowait irq softirq steal guest guest_nice
        let stat = "cpu  100 20 30 5000 70 4 6 10 50 0\ncpu0 1 2 3 4 5 6 7 8 9 0\n";
        assert_eq!(parse_busy(stat), Some(170.0 / hz));
        assert_eq!(parse_busy("intr 1 2 3\n"), None);
    }
}

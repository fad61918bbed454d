//! The daemon under many concurrent TCP flows at a 1 s tick (10,000 with a message a second
//! each, and 1,000 sending as fast as flowgen can, up to 1,000 messages a second each): its
//! CPU and memory, the kernel cost of every program per run and per packet (with an empty TC
//! program beside them as the floor), probe's kernel CPU as a share of the machine's busy
//! CPU, and the time of a /metrics scrape.
use super::nop::{NopSockOps, NopTc, RunStats};
use super::{bpf_counters, bpf_deltas, Programs};
use anyhow::{bail, Context, Result};
use probe_tests::process::{parse_status_kib, proc_usage, Child};
use probe_tests::{http, kernel, probe_iface_traffic, Metrics, Pair, Probe, ProbeOpts, Traffic};
use std::path::Path;
use std::time::{Duration, Instant};

/// Ports flowgen listens on in namespace B.
const PORTS: &str = "5300-5303";
/// The first host number of the extra addresses namespace B carries (one peer each).
const FIRST_PEER_HOST: u8 = 100;
/// Time after the last connection is established and before the measurement window: probe
/// has seen every flow for a few ticks by then.
const WARMUP: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct FlowOpts {
    pub conns: usize,
    /// Addresses in namespace B the connections are spread over (each one a peer).
    pub peers: u8,
    pub window: Duration,
    pub scrapes: usize,
    pub idle: bool,
    /// Each connection sends one message per this many milliseconds.
    pub interval_ms: u64,
    /// The daemon's tick.
    pub tick_ms: u64,
    /// `[maps] walk` of the daemon: "select" (the default) or "batch", the walk it replaced,
    /// run in the same bench for the ratio.
    pub walk: &'static str,
}

/// What the phase measured.
#[derive(Debug, Default)]
pub struct Flows {
    pub conns: usize,
    /// `[maps] walk` of the daemon.
    pub walk: &'static str,
    pub peers: u8,
    pub idle: bool,
    pub interval_ms: u64,
    pub tick_ms: u64,
    pub established: usize,
    pub connect_seconds: f64,
    /// The daemon's utime+stime over the window, and the window's length.
    pub cpu_seconds: f64,
    pub window_seconds: f64,
    /// Busy CPU seconds of the whole machine over the window, all CPUs (/proc/stat).
    pub machine_busy_seconds: f64,
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
    /// The feature stage's time over the window (probe_tick_stage_seconds_total) and the
    /// entities it featurized (probe_feature_entities at the end).
    pub feature_seconds: f64,
    pub feature_entities: f64,
    /// Wall seconds of each tick stage over the window (probe_tick_stage_seconds_total), by
    /// stage name: where the daemon's time goes, without a profiler.
    pub stage_seconds: Vec<(String, f64)>,
    /// Seconds the model stage took in the window, and the entities it scored (last tick).
    pub model_seconds: f64,
    pub model_entities: f64,
    pub flows_tracked: f64,
    pub flow_evictions: f64,
    /// Bursts that ended over the window (`probe_bursts_total`), and burst events lost
    /// (`probe_events_lost_total`: the ring was full, or a tick's cap was reached).
    pub burst_ends: f64,
    pub events_lost: f64,
    /// Burst events of busy ticks kept for the features only (`probe_events_thinned_total`).
    pub events_thinned: f64,
    /// probe_tcp_connections summed over the bench's own peers, of peer="other" (peers
    /// folded because they moved no traffic or exceeded top_peers), and over all peers.
    pub tcp_connections: f64,
    pub tcp_connections_other: f64,
    pub tcp_connections_all: f64,
    /// program -> (run seconds, runs) over the window.
    pub bpf: Programs,
    /// What probe counted on the veth over the window (wire packets).
    pub wire: Traffic,
    /// The veth's own counters over the window.
    pub veth: Traffic,
    /// The empty TC programs on the peer veth over the window.
    pub nop: Vec<(&'static str, RunStats)>,
    pub nop_error: Option<String>,
    /// Seconds of each timed scrape, and the size of the last one.
    pub scrape_seconds: Vec<f64>,
    pub series: usize,
    pub scrape_bytes: usize,
    /// flowgen's last lines.
    pub flowgen_log: String,
}

/// Adds `n` addresses to namespace B's veth (10.231.X.100 onwards; `replace`, so that a
/// later phase can add them again) and a permanent neighbour entry for each in namespace A:
/// `n` peers for probe, without ARP.
fn add_peer_addrs(pair: &Pair, n: u8) -> Result<String> {
    let o = pair.ip_b.octets();
    let last = FIRST_PEER_HOST as u16 + n as u16 - 1;
    if n == 0 || last > 254 {
        bail!("--flow-peers must be 1..={}", 255 - FIRST_PEER_HOST as u16);
    }
    let mac = pair
        .mac_b
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let (mut addrs, mut neighs) = (String::new(), String::new());
    for h in FIRST_PEER_HOST as u16..=last {
        let ip = format!("{}.{}.{}.{h}", o[0], o[1], o[2]);
        addrs.push_str(&format!("addr replace {ip}/32 dev {}\n", pair.veth_b));
        neighs.push_str(&format!(
            "neigh replace {ip} lladdr {mac} dev {} nud permanent\n",
            pair.veth_a
        ));
    }
    for (ns, batch) in [(&pair.b, addrs), (&pair.a, neighs)] {
        let file = std::env::temp_dir().join(format!(
            "probe-bench-{}-{}.ip",
            std::process::id(),
            ns.name()
        ));
        std::fs::write(&file, batch)?;
        let r = ns.run(&["ip", "-batch", &file.to_string_lossy()]);
        let _ = std::fs::remove_file(&file);
        r?;
    }
    Ok(format!(
        "{}.{}.{}.{FIRST_PEER_HOST}-{last}",
        o[0], o[1], o[2]
    ))
}

/// Waits (bounded) until `child` prints a stdout line starting with `prefix`; returns it.
fn wait_line(child: &mut Child, prefix: &str, timeout: Duration) -> Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(l) = child.stdout().lines().find(|l| l.starts_with(prefix)) {
            return Ok(l.to_owned());
        }
        if let Some(st) = child.try_wait() {
            bail!(
                "{} exited ({st}) before printing {prefix:?}: {}{}",
                child.name(),
                child.stdout(),
                child.stderr()
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "{} printed no {prefix:?} line within {timeout:?}",
                child.name()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `established K/N in T s (F failed)` -> (K, T).
fn parse_established(line: &str) -> Option<(usize, f64)> {
    let mut f = line.split_whitespace();
    let k = f.nth(1)?.split('/').next()?.parse().ok()?;
    let t = f.nth(1)?.parse().ok()?;
    Some((k, t))
}

fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(parse_status_kib(&status, "VmRSS")? * 1024)
}

fn nop_stats(nop: &Option<NopTc>, sockops: &Option<NopSockOps>) -> Vec<(&'static str, RunStats)> {
    let mut out = nop
        .as_ref()
        .and_then(|n| n.stats().map_err(|e| eprintln!("bench: {e:#}")).ok())
        .unwrap_or_default();
    if let Some(st) = sockops
        .as_ref()
        .and_then(|n| n.stats().map_err(|e| eprintln!("bench: {e:#}")).ok())
    {
        out.push((NopSockOps::NAME, st));
    }
    out
}

/// Times `n` scrapes of /metrics from inside probe's namespace, spread over different
/// phases of the tick; returns the durations and the last body.
fn timed_scrapes(pair: &Pair, probe: &Probe, n: usize) -> Result<(Vec<f64>, String)> {
    let addr = probe.addr();
    pair.a.enter(move || -> Result<(Vec<f64>, String)> {
        let mut times = Vec::with_capacity(n);
        let mut body = String::new();
        for i in 0..n {
            let t = Instant::now();
            let r = http::get(addr, "/metrics", Duration::from_secs(10))?;
            times.push(t.elapsed().as_secs_f64());
            if r.status != 200 {
                bail!("/metrics answered {}", r.status);
            }
            body = r.body;
            // 200..=490 ms apart: the scrapes land at many phases of the 1 s tick.
            std::thread::sleep(Duration::from_millis(200 + (i as u64 * 137) % 290));
        }
        Ok((times, body))
    })?
}

pub fn run(pair: &Pair, bin: &str, flowgen: &Path, o: &FlowOpts) -> Result<Flows> {
    let to = add_peer_addrs(pair, o.peers)?;
    let flowgen = flowgen.to_string_lossy().into_owned();
    // Everything after the connections are up, with room to spare; the bench stops flowgen
    // itself when it is done.
    let hold = WARMUP.as_secs() + o.window.as_secs() + o.scrapes as u64 + 30;
    let mut server = Child::spawn(
        "flowgen serve",
        &mut pair.b.command(&[
            &flowgen,
            "serve",
            "--ports",
            PORTS,
            "--seconds",
            &(hold + 120).to_string(),
            "--max-conns",
            &o.conns.to_string(),
        ]),
    )?;
    wait_line(&mut server, "listening", Duration::from_secs(10))?;

    let mut opts = ProbeOpts::iface(&pair.veth_a)
        .bin(bin)
        .tick(&format!("{}ms", o.tick_ms));
    // The daemon reads it at start only: removed once it is up.
    let config = std::env::temp_dir().join(format!("probe-bench-walk-{}.toml", std::process::id()));
    std::fs::write(&config, format!("[maps]\nwalk = \"{}\"\n", o.walk))?;
    opts.extra
        .extend(["--config".to_owned(), config.display().to_string()]);
    let mut probe = Probe::try_start(&pair.a, opts)?;
    let _ = std::fs::remove_file(&config);
    let pid = probe.pid();
    // The floor, on the other end of the same veth: the same packets, in the other direction.
    let (nop, mut nop_error) = match NopTc::attach(&pair.b, &pair.veth_b) {
        Ok(n) => (Some(n), None),
        Err(e) => {
            eprintln!("bench: no empty-program baseline: {e:#}");
            (None, Some(format!("{e:#}")))
        }
    };
    // And beside probe's sock_ops, on the same callbacks.
    let nop_sockops = match NopSockOps::attach() {
        Ok(n) => Some(n),
        Err(e) => {
            eprintln!("bench: no empty sock_ops baseline: {e:#}");
            nop_error = Some(match nop_error {
                Some(tc) => format!("{tc}; {e:#}"),
                None => format!("{e:#}"),
            });
            None
        }
    };

    let conns = o.conns.to_string();
    let hold_s = hold.to_string();
    let interval = o.interval_ms.to_string();
    let mut argv = vec![
        flowgen.as_str(),
        "connect",
        "--to",
        &to,
        "--ports",
        PORTS,
        "--conns",
        &conns,
        "--seconds",
        &hold_s,
        "--interval-ms",
        &interval,
    ];
    if o.idle {
        argv.push("--idle");
    }
    let mut client = Child::spawn("flowgen connect", &mut pair.a.command(&argv))?;
    let line = wait_line(&mut client, "established", Duration::from_secs(60))?;
    eprintln!("bench: flowgen {line}");
    let (established, connect_seconds) =
        parse_established(&line).with_context(|| format!("flowgen said {line:?}"))?;

    std::thread::sleep(WARMUP);
    let s0 = probe.try_metrics()?;
    let n0 = nop_stats(&nop, &nop_sockops);
    let k0 = kernel::iface_counters(&pair.a, &pair.veth_a)?;
    // The CPU window holds no scrape: only the daemon's own work with the flows.
    let u0 = proc_usage(pid)?;
    let m0 = super::machine_busy_seconds()?;
    let t0 = Instant::now();
    eprintln!(
        "bench: measuring the daemon for {} s with {established} flows",
        o.window.as_secs()
    );
    std::thread::sleep(o.window);
    let u1 = proc_usage(pid)?;
    let m1 = super::machine_busy_seconds()?;
    let window_seconds = t0.elapsed().as_secs_f64();
    let rss = rss_bytes(pid)?;
    let k1 = kernel::iface_counters(&pair.a, &pair.veth_a)?;
    let n1 = nop_stats(&nop, &nop_sockops);
    let s1 = probe.try_metrics()?;

    eprintln!("bench: timing {} scrapes", o.scrapes);
    let (scrape_seconds, body) = timed_scrapes(pair, &probe, o.scrapes)?;
    let last = Metrics::parse(&body)?;
    if let Some(st) = client.try_wait() {
        bail!(
            "flowgen connect ended early ({st}): {}{}",
            client.stdout(),
            client.stderr()
        );
    }
    let peak = proc_usage(pid)?.peak_rss_bytes;
    client.terminate(Duration::from_secs(5));
    let flowgen_log = client
        .stdout()
        .lines()
        .rev()
        .take(2)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    drop(nop);
    drop(nop_sockops);
    let st = probe.terminate(Duration::from_secs(10));
    if !st.is_some_and(|s| s.success()) {
        bail!(
            "probe did not exit 0 on SIGTERM ({st:?}):\n{}",
            probe.log_tail(20)
        );
    }
    drop(server);

    let prefix = {
        let o = pair.ip_a.octets();
        format!("{}.{}.{}.", o[0], o[1], o[2])
    };
    let tcp_ours: f64 = s1
        .select("probe_tcp_connections", &[])
        .filter(|s| s.labels.get("peer").is_some_and(|p| p.starts_with(&prefix)))
        .map(|s| s.value)
        .sum();
    let nop = n1
        .iter()
        .map(|(name, b)| {
            let a = n0
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, a)| *a)
                .unwrap_or_default();
            (
                *name,
                RunStats {
                    run_ns: b.run_ns - a.run_ns,
                    runs: b.runs - a.runs,
                },
            )
        })
        .collect();
    Ok(Flows {
        conns: o.conns,
        walk: o.walk,
        peers: o.peers,
        idle: o.idle,
        interval_ms: o.interval_ms,
        tick_ms: o.tick_ms,
        established,
        connect_seconds,
        cpu_seconds: u1.cpu_seconds - u0.cpu_seconds,
        window_seconds,
        machine_busy_seconds: m1 - m0,
        rss_bytes: rss,
        peak_rss_bytes: peak,
        stage_seconds: s1
            .label_values("probe_tick_stage_seconds_total", "stage")
            .into_iter()
            .map(|st| {
                let f = [("stage", st.as_str())];
                let d = s1.sum("probe_tick_stage_seconds_total", &f)
                    - s0.sum("probe_tick_stage_seconds_total", &f);
                (st, d)
            })
            .collect(),
        feature_seconds: s1.sum("probe_tick_stage_seconds_total", &[("stage", "features")])
            - s0.sum("probe_tick_stage_seconds_total", &[("stage", "features")]),
        feature_entities: s1.sum("probe_feature_entities", &[]),
        model_seconds: s1.sum("probe_tick_stage_seconds_total", &[("stage", "model")])
            - s0.sum("probe_tick_stage_seconds_total", &[("stage", "model")]),
        model_entities: s1.sum("probe_model_scored_entities", &[]),
        flows_tracked: s1.sum("probe_flows_tracked", &[]),
        flow_evictions: s1.sum("probe_flow_evictions_total", &[]),
        burst_ends: s1.sum("probe_bursts_total", &[]) - s0.sum("probe_bursts_total", &[]),
        events_lost: s1.sum("probe_events_lost_total", &[])
            - s0.sum("probe_events_lost_total", &[]),
        events_thinned: s1.sum("probe_events_thinned_total", &[])
            - s0.sum("probe_events_thinned_total", &[]),
        tcp_connections: tcp_ours,
        tcp_connections_other: s1.sum("probe_tcp_connections", &[("peer", "other")]),
        tcp_connections_all: s1.sum("probe_tcp_connections", &[]),
        bpf: bpf_deltas(&bpf_counters(&s0), &bpf_counters(&s1)),
        wire: probe_iface_traffic(&s1, &pair.veth_a) - probe_iface_traffic(&s0, &pair.veth_a),
        veth: k1 - k0,
        nop,
        nop_error,
        scrape_seconds,
        series: last.samples.len(),
        scrape_bytes: body.len(),
        flowgen_log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_flowgen_lines() {
        assert_eq!(
            parse_established("established 9998/10000 in 0.42 s (2 failed)"),
            Some((9998, 0.42))
        );
        assert_eq!(parse_established("listening on 4 ports"), None);
    }
}

//! Turning scheduled episodes on, stepping the gradual ones, turning them off, and what
//! the ground truth says about them.
use super::cmd;
use super::observe;
use super::schedule::{Episode, Kind, Level, Onset, Params};
use super::topo::{self, rank_addr, switch_port, Lab, ProcId, RANK_DEV};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The nftables table a loss episode adds in the rank's namespace.
const NFT_TABLE: &str = "lab_loss";
/// How long iperf3 clients get to print their report after SIGTERM.
const IPERF_STOP_GRACE: Duration = Duration::from_secs(2);

/// One line of `ground_truth.jsonl`.
#[derive(Clone, Debug, Serialize)]
pub struct Truth {
    /// Unix time the episode took effect (after its command completed); for a gradual
    /// episode, when its first step did.
    pub t_start: f64,
    /// Unix time it was undone (after the undo completed).
    pub t_end: f64,
    pub kind: Kind,
    pub rank: usize,
    pub params: Params,
    pub seq: usize,
    /// Planned offsets from the start of the traffic.
    pub planned_start_s: f64,
    pub planned_end_s: f64,
    /// What the episode itself reported (nft drop counter, iperf3 exit), if anything.
    pub observed: serde_json::Value,
    /// True if the lab was interrupted or failed while the episode was on.
    pub aborted: bool,
    pub onset: Onset,
    /// Gradual episodes: the steps as applied (`steps`, `t_full`, `planned_full_s`).
    #[serde(flatten)]
    pub gradual: Option<GradualTruth>,
}

/// A step of a gradual episode as applied.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Applied {
    /// Unix time the step took effect (after its command completed).
    pub t: f64,
    #[serde(flatten)]
    pub level: Level,
}

/// The ground truth of a gradual episode's build-up.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GradualTruth {
    /// Every step applied, in order; fewer than planned if the episode was cut short.
    pub steps: Vec<Applied>,
    /// When the last planned step took effect (null if the episode was cut short first).
    pub t_full: Option<f64>,
    /// The planned offset of the last step from the start of the traffic.
    pub planned_full_s: f64,
}

/// An episode that is on.
pub struct Active {
    pub ep: Episode,
    pub t_start: f64,
    /// iperf3 servers and clients (cross, ramp, incast), in start order.
    servers: Vec<ProcId>,
    clients: Vec<ProcId>,
    /// The client logs, one per flow, for the sender rate they report.
    client_logs: Vec<PathBuf>,
    /// Gradual episodes: the steps applied so far.
    applied: Vec<Applied>,
    /// squeeze: the rate tc reports after each step.
    tc_rates: Vec<Option<f64>>,
}

impl Active {
    fn new(ep: &Episode) -> Self {
        Self {
            ep: ep.clone(),
            t_start: 0.0,
            servers: Vec::new(),
            clients: Vec::new(),
            client_logs: Vec::new(),
            applied: Vec::new(),
            tc_rates: Vec::new(),
        }
    }
}

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn in_ns(ns: &str, argv: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).args(argv);
    c
}

fn log_to(c: &mut Command, path: &Path) -> Result<()> {
    let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    c.stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f);
    Ok(())
}

/// One iperf3 flow: a one-off server on `dst`'s address, a client in `src`'s namespace.
struct Flow {
    src: usize,
    dst: usize,
    port: u16,
    /// How the client sends: `-P N` streams, or `-b RATE` paced.
    shape: Vec<String>,
    /// The client's `-t`: it stops by itself even if nobody stops it.
    secs: u64,
    /// Logs go to `<name>-server.log` and `<name>-client.log`.
    name: String,
}

/// Starts a flow's server, waits until it listens, then starts its client.
fn start_flow(lab: &mut Lab, a: &mut Active, f: &Flow, out: &Path, congestion: &str) -> Result<()> {
    let dst_ns = lab.rank_ns(f.dst);
    let dst = rank_addr(f.dst).to_string();
    let port = f.port.to_string();
    let mut server = in_ns(
        &dst_ns,
        &[
            "iperf3",
            "-s",
            "-1",
            "-B",
            &dst,
            "-p",
            &port,
            "--idle-timeout",
            "15",
        ],
    );
    log_to(&mut server, &out.join(format!("{}-server.log", f.name)))?;
    a.servers
        .push(lab.spawn(&format!("iperf3 server ({})", f.name), server)?);
    wait_listening(&dst_ns, f.port, Duration::from_secs(5))?;
    let secs = f.secs.to_string();
    let mut argv = vec![
        "iperf3",
        "-c",
        &dst,
        "-p",
        &port,
        "-t",
        &secs,
        "--connect-timeout",
        "3000",
    ];
    argv.extend(f.shape.iter().map(String::as_str));
    if !congestion.is_empty() {
        argv.extend(["-C", congestion]);
    }
    let log = out.join(format!("{}-client.log", f.name));
    let mut client = in_ns(&lab.rank_ns(f.src), &argv);
    log_to(&mut client, &log)?;
    a.clients
        .push(lab.spawn(&format!("iperf3 client ({})", f.name), client)?);
    a.client_logs.push(log);
    Ok(())
}

/// Seconds an iperf3 client started at offset `from_s` must run to outlast the episode.
fn client_secs(ep: &Episode, from_s: f64) -> u64 {
    (ep.end_s - from_s).max(0.0).ceil() as u64 + 5
}

/// Turns `ep` on (a gradual episode: its first step). Logs go to `out`; iperf3 senders use
/// `congestion` (if set).
pub fn apply(lab: &mut Lab, ep: &Episode, out: &Path, congestion: &str) -> Result<Active> {
    let ns = lab.rank_ns(ep.rank);
    let mut a = Active::new(ep);
    match ep.params {
        Params::Tbf { rate_mbit, .. } => topo::set_tbf(&ns, rate_mbit)?,
        Params::Loss { percent } => {
            let rules = format!(
                "table inet {NFT_TABLE} {{\n\tchain input {{\n\t\ttype filter hook input priority 0; policy accept;\n\t\tnumgen random mod 100 < {percent} counter drop\n\t}}\n}}\n"
            );
            let file = out.join(format!("loss{}.nft", ep.seq));
            std::fs::write(&file, rules).with_context(|| format!("writing {}", file.display()))?;
            let file = file.to_string_lossy().into_owned();
            cmd::run(&["ip", "netns", "exec", &ns, "nft", "-f", &file])?;
        }
        Params::Cross {
            dst_rank,
            streams,
            port,
        } => {
            let flow = Flow {
                src: ep.rank,
                dst: dst_rank,
                port,
                shape: vec!["-P".into(), streams.to_string()],
                secs: client_secs(ep, ep.start_s),
                name: format!("cross{}", ep.seq),
            };
            start_flow(lab, &mut a, &flow, out, congestion)?;
        }
        // A limited switch port towards the victim: without it the bridge forwards at CPU
        // speed and nothing queues where an incast queues on a real switch. At the link
        // rate it changes nothing until the senders add up to more than one link.
        Params::Incast { port_mbit, .. } => {
            topo::set_tbf_on(&lab.switch_ns(), &switch_port(ep.rank), port_mbit)?
        }
        // The rank's traingen was started with this window (`--straggle`): nothing to do
        // on the network.
        Params::Ramp { .. } | Params::Squeeze { .. } | Params::Straggle { .. } => {}
    }
    if ep.kind.onset() == Onset::Gradual {
        step(lab, &mut a, out, congestion)?;
    }
    a.t_start = a.applied.first().map_or_else(unix_now, |s| s.t);
    Ok(a)
}

/// Applies the steps of a gradual episode that are due at `now_s` (an offset from the start
/// of the traffic) and returns them.
pub fn advance(
    lab: &mut Lab,
    a: &mut Active,
    now_s: f64,
    out: &Path,
    congestion: &str,
) -> Result<Vec<Applied>> {
    let mut done = Vec::new();
    while a
        .ep
        .steps
        .get(a.applied.len())
        .is_some_and(|s| now_s >= s.at_s)
    {
        step(lab, a, out, congestion)?;
        done.extend(a.applied.last().cloned());
    }
    Ok(done)
}

/// Starts the paced flow a ramp or incast step adds (the i-th uses `port + i`, i being the
/// steps applied so far) and returns when it started.
fn step_flow(
    lab: &mut Lab,
    a: &mut Active,
    (src, dst): (usize, usize),
    port: u16,
    name: &str,
    out: &Path,
    congestion: &str,
) -> Result<f64> {
    let i = a.applied.len();
    // The new flow offers what its step adds to the total.
    let prev_rate = i
        .checked_sub(1)
        .map_or(0, |j| a.ep.steps[j].level.rate_mbit);
    let added = a.ep.steps[i]
        .level
        .rate_mbit
        .saturating_sub(prev_rate)
        .max(1);
    let flow = Flow {
        src,
        dst,
        port: port + i as u16,
        shape: vec!["-b".to_string(), format!("{added}M")],
        secs: client_secs(&a.ep, a.ep.steps[i].at_s),
        name: name.to_string(),
    };
    start_flow(lab, a, &flow, out, congestion)?;
    Ok(unix_now())
}

/// Applies the next planned step of a gradual episode.
fn step(lab: &mut Lab, a: &mut Active, out: &Path, congestion: &str) -> Result<()> {
    let i = a.applied.len();
    let planned = a.ep.steps[i].clone();
    let seq = a.ep.seq;
    let t = match a.ep.params {
        Params::Squeeze { .. } => {
            let ns = lab.rank_ns(a.ep.rank);
            topo::set_tbf(&ns, planned.level.rate_mbit)?;
            let t = unix_now();
            let (name, what) = (format!("squeeze{seq}"), format!("step {i}"));
            let rate = log_qdisc(&ns, RANK_DEV, out, &name, &what)?;
            a.tc_rates.push(rate);
            t
        }
        Params::Ramp { dst_rank, port, .. } => {
            let name = format!("ramp{seq}-{i}");
            step_flow(lab, a, (a.ep.rank, dst_rank), port, &name, out, congestion)?
        }
        Params::Incast { port, .. } => {
            let src = planned
                .level
                .src_rank
                .context("an incast step without a sender")?;
            let name = format!("incast{seq}-{i}");
            step_flow(lab, a, (src, a.ep.rank), port, &name, out, congestion)?
        }
        Params::Tbf { .. }
        | Params::Cross { .. }
        | Params::Loss { .. }
        | Params::Straggle { .. } => {
            bail!("episode {seq} ({}) has no steps", a.ep.kind)
        }
    };
    a.applied.push(Applied {
        t,
        level: planned.level,
    });
    Ok(())
}

/// Appends what tc says about `dev`'s root qdisc to `<name>-tc.jsonl` and returns its rate:
/// the proof that a step took effect.
fn log_qdisc(ns: &str, dev: &str, out: &Path, name: &str, what: &str) -> Result<Option<f64>> {
    let (stats, raw) = observe::root_qdisc(ns, dev)?;
    let path = out.join(format!("{name}-tc.jsonl"));
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let line = serde_json::json!({"t": unix_now(), "what": what, "dev": dev, "qdisc": raw});
    writeln!(f, "{line}")?;
    Ok(stats.rate_mbit)
}

/// Stops the iperf3 flows of an episode (clients first, so they report and close, then
/// the one-off servers) and returns each client's sender rate.
fn stop_flows(lab: &mut Lab, a: &Active) -> Vec<Option<f64>> {
    lab.stop_all(&a.clients, IPERF_STOP_GRACE);
    lab.stop_all(&a.servers, IPERF_STOP_GRACE);
    a.client_logs
        .iter()
        .map(|log| iperf3_sender_mbit(&std::fs::read_to_string(log).unwrap_or_default()))
        .collect()
}

/// Turns the episode off and returns its ground-truth record (`out`: where `apply` wrote).
pub fn revert(lab: &mut Lab, a: Active, out: &Path, aborted: bool) -> Result<Truth> {
    let ns = lab.rank_ns(a.ep.rank);
    let mut observed = serde_json::json!({});
    // Processes first: they stop whatever else fails below.
    let sender_mbit = stop_flows(lab, &a);
    match a.ep.params {
        Params::Tbf { base_mbit, .. } | Params::Squeeze { base_mbit, .. } => {
            if base_mbit > 0 {
                topo::set_tbf(&ns, base_mbit)?
            } else {
                topo::clear_root_qdisc(&ns)?
            }
            if a.ep.kind == Kind::Squeeze {
                observed["tc_rate_mbit"] = serde_json::json!(a.tc_rates);
                let name = format!("squeeze{}", a.ep.seq);
                log_qdisc(&ns, RANK_DEV, out, &name, "undo")?;
            }
        }
        Params::Loss { .. } => {
            let listing = cmd::run(&[
                "ip", "netns", "exec", &ns, "nft", "list", "table", "inet", NFT_TABLE,
            ])?;
            if let Some(n) = nft_counter_packets(&listing) {
                observed["dropped_packets"] = n.into();
            }
            cmd::run(&[
                "ip", "netns", "exec", &ns, "nft", "delete", "table", "inet", NFT_TABLE,
            ])?;
        }
        Params::Cross { .. } => {
            if let Some(Some(mbit)) = sender_mbit.first() {
                observed["sender_mbit"] = (*mbit).into();
            }
        }
        Params::Ramp { .. } => observed["step_sender_mbit"] = serde_json::json!(sender_mbit),
        Params::Straggle { .. } => {}
        Params::Incast { .. } => {
            observed["step_sender_mbit"] = serde_json::json!(sender_mbit);
            let (sw, port) = (lab.switch_ns(), switch_port(a.ep.rank));
            let (stats, _) = observe::root_qdisc(&sw, &port)?;
            observed["port"] = serde_json::json!({
                "dev": port, "sent_bytes": stats.bytes, "drops": stats.drops,
                "overlimits": stats.overlimits,
            });
            topo::clear_root_qdisc_on(&sw, &port)?;
        }
    }
    Ok(truth(a, observed, aborted))
}

/// The ground-truth record of an episode that has just been undone.
fn truth(a: Active, observed: serde_json::Value, aborted: bool) -> Truth {
    let onset = a.ep.kind.onset();
    let gradual = (onset == Onset::Gradual).then(|| GradualTruth {
        t_full: (a.applied.len() == a.ep.steps.len())
            .then(|| a.applied.last().map(|s| s.t))
            .flatten(),
        planned_full_s: a.ep.steps.last().map_or(a.ep.start_s, |s| s.at_s),
        steps: a.applied,
    });
    Truth {
        t_start: a.t_start,
        t_end: unix_now(),
        kind: a.ep.kind,
        rank: a.ep.rank,
        params: a.ep.params,
        seq: a.ep.seq,
        planned_start_s: a.ep.start_s,
        planned_end_s: a.ep.end_s,
        observed,
        aborted,
        onset,
        gradual,
    }
}

fn wait_listening(ns: &str, port: u16, timeout: Duration) -> Result<()> {
    let filter = format!("sport = :{port}");
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        if cmd::interrupted() {
            bail!("interrupted");
        }
        let out = cmd::run(&["ss", "-N", ns, "-H", "-l", "-t", "-n", &filter])?;
        if !out.trim().is_empty() {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(50));
    }
    bail!("iperf3 server in {ns} did not listen on port {port} within {timeout:?}")
}

/// The sender bitrate of an iperf3 client's final `[SUM]` line (or its only stream's), in
/// Mbit/s.
pub fn iperf3_sender_mbit(log: &str) -> Option<f64> {
    let line = log
        .lines()
        .filter(|l| l.trim_end().ends_with("sender"))
        .max_by_key(|l| l.starts_with("[SUM]"))?;
    let toks: Vec<&str> = line.split_whitespace().collect();
    let i = toks.iter().position(|t| t.ends_with("bits/sec"))?;
    let v: f64 = toks.get(i.checked_sub(1)?)?.parse().ok()?;
    let scale = match toks[i].chars().next()? {
        'G' => 1e3,
        'M' => 1.0,
        'K' => 1e-3,
        _ => 1e-6,
    };
    Some((v * scale * 10.0).round() / 10.0)
}

/// The packet count of the first `counter` in an `nft list` output.
pub fn nft_counter_packets(listing: &str) -> Option<u64> {
    let mut it = listing.split_whitespace();
    while let Some(tok) = it.next() {
        if tok == "counter" && it.next() == Some("packets") {
            return it.next()?.parse().ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nft_counter() {
        let l = "table inet lab_loss {\n\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\t\tnumgen random mod 100 < 5 counter packets 42 bytes 6000 drop\n\t}\n}\n";
        assert_eq!(nft_counter_packets(l), Some(42));
        assert_eq!(nft_counter_packets("table inet x {}"), None);
    }

    fn gradual_episode() -> Episode {
        use crate::lab::schedule::Step;
        let level = |rate_mbit, flows| Level {
            rate_mbit,
            flows: Some(flows),
            src_rank: None,
        };
        Episode {
            seq: 3,
            kind: Kind::Ramp,
            rank: 1,
            start_s: 10.0,
            end_s: 25.0,
            params: Params::Ramp {
                dst_rank: 2,
                rate_mbit: 500,
                port: 5201,
                build_s: 10.0,
            },
            steps: vec![
                Step {
                    at_s: 10.0,
                    level: level(250, 1),
                },
                Step {
                    at_s: 20.0,
                    level: level(500, 2),
                },
            ],
        }
    }

    #[test]
    fn ground_truth_of_a_gradual_episode() {
        let ep = gradual_episode();
        let mut a = Active::new(&ep);
        for (t, s) in [(100.0, &ep.steps[0]), (110.0, &ep.steps[1])] {
            a.applied.push(Applied {
                t,
                level: s.level.clone(),
            });
        }
        a.t_start = 100.0;
        let v = serde_json::to_value(truth(a, serde_json::json!({}), false)).unwrap();
        assert_eq!(v["onset"], "gradual");
        assert_eq!(v["t_start"], 100.0);
        assert_eq!(v["t_full"], 110.0);
        assert_eq!(v["planned_full_s"], 20.0);
        assert_eq!(
            v["steps"],
            serde_json::json!([{"t":100.0,"rate_mbit":250,"flows":1},{"t":110.0,"rate_mbit":500,"flows":2}])
        );
        assert_eq!(v["params"]["rate_mbit"], 500);
    }

    #[test]
    fn a_cut_short_gradual_episode_has_no_t_full() {
        let ep = gradual_episode();
        let mut a = Active::new(&ep);
        a.applied.push(Applied {
            t: 100.0,
            level: ep.steps[0].level.clone(),
        });
        let v = serde_json::to_value(truth(a, serde_json::json!({}), true)).unwrap();
        assert_eq!(v["t_full"], serde_json::Value::Null);
        assert_eq!(v["steps"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn abrupt_ground_truth_only_gains_onset() {
        let ep = Episode {
            seq: 0,
            kind: Kind::Loss,
            rank: 1,
            start_s: 4.0,
            end_s: 6.567,
            params: Params::Loss { percent: 2 },
            steps: Vec::new(),
        };
        let mut a = Active::new(&ep);
        a.t_start = 1.5;
        let mut v =
            serde_json::to_value(truth(a, serde_json::json!({"dropped_packets": 64}), false))
                .unwrap();
        assert_eq!(v["onset"], "abrupt");
        assert!(v["t_end"].as_f64().unwrap() > 0.0);
        v.as_object_mut().unwrap().remove("t_end");
        // Exactly the fields of before, plus `onset`.
        assert_eq!(
            v,
            serde_json::json!({"t_start":1.5,"kind":"loss","rank":1,"params":{"percent":2},
                "seq":0,"planned_start_s":4.0,"planned_end_s":6.567,
                "observed":{"dropped_packets":64},"aborted":false,"onset":"abrupt"})
        );
    }

    #[test]
    fn iperf3_summary() {
        let log = "[  5]   0.00-2.85   sec  70.2 MBytes   206 Mbits/sec    0             sender\n[  5]   0.00-2.85   sec  0.00 Bytes  0.00 bits/sec                  receiver\n[SUM]   0.00-2.85   sec   280 MBytes   824 Mbits/sec    0             sender\n[SUM]   0.00-2.85   sec  0.00 Bytes  0.00 bits/sec                  receiver\n";
        assert_eq!(iperf3_sender_mbit(log), Some(824.0));
        let one = "[  5]   0.00-3.00   sec   350 MBytes  1.02 Gbits/sec    3             sender\n";
        assert_eq!(iperf3_sender_mbit(one), Some(1020.0));
        assert_eq!(iperf3_sender_mbit("iperf3: error"), None);
    }
}

//! Turning scheduled episodes on and off, and what the ground truth says about them.
use super::cmd;
use super::schedule::{Episode, Kind, Params};
use super::topo::{self, rank_addr, Lab, ProcId};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The nftables table a loss episode adds in the rank's namespace.
const NFT_TABLE: &str = "lab_loss";

/// One line of `ground_truth.jsonl`.
#[derive(Clone, Debug, Serialize)]
pub struct Truth {
    /// Unix time the episode took effect (after its command completed).
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
}

/// An episode that is on.
pub struct Active {
    pub ep: Episode,
    pub t_start: f64,
    /// Cross traffic: the iperf3 server and client.
    procs: Vec<ProcId>,
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

/// Turns `ep` on. Cross traffic logs go to `out`; its sender uses `congestion` (if set).
pub fn apply(lab: &mut Lab, ep: &Episode, out: &Path, congestion: &str) -> Result<Active> {
    let ns = lab.rank_ns(ep.rank);
    let mut procs = Vec::new();
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
            let dst_ns = lab.rank_ns(dst_rank);
            let dst = rank_addr(dst_rank).to_string();
            let port_s = port.to_string();
            let mut server = in_ns(
                &dst_ns,
                &[
                    "iperf3",
                    "-s",
                    "-1",
                    "-B",
                    &dst,
                    "-p",
                    &port_s,
                    "--idle-timeout",
                    "15",
                ],
            );
            log_to(
                &mut server,
                &out.join(format!("cross{}-server.log", ep.seq)),
            )?;
            procs.push(lab.spawn(&format!("iperf3 server (episode {})", ep.seq), server)?);
            wait_listening(&dst_ns, port, Duration::from_secs(5))?;
            let secs = ((ep.end_s - ep.start_s).ceil() as u64 + 5).to_string();
            let streams = streams.to_string();
            let mut argv = vec![
                "iperf3",
                "-c",
                &dst,
                "-p",
                &port_s,
                "-P",
                &streams,
                "-t",
                &secs,
                "--connect-timeout",
                "3000",
            ];
            if !congestion.is_empty() {
                argv.extend(["-C", congestion]);
            }
            let mut client = in_ns(&ns, &argv);
            log_to(
                &mut client,
                &out.join(format!("cross{}-client.log", ep.seq)),
            )?;
            procs.push(lab.spawn(&format!("iperf3 client (episode {})", ep.seq), client)?);
        }
    }
    Ok(Active {
        ep: ep.clone(),
        t_start: unix_now(),
        procs,
    })
}

/// Turns the episode off and returns its ground-truth record (`out`: where `apply` wrote).
pub fn revert(lab: &mut Lab, a: Active, out: &Path, aborted: bool) -> Result<Truth> {
    let ns = lab.rank_ns(a.ep.rank);
    let mut observed = serde_json::json!({});
    match a.ep.params {
        Params::Tbf { base_mbit, .. } => {
            if base_mbit > 0 {
                topo::set_tbf(&ns, base_mbit)?
            } else {
                topo::clear_root_qdisc(&ns)?
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
            // The client first (SIGTERM: it reports and closes), then the one-off server.
            for &id in a.procs.iter().rev() {
                lab.stop(id, Duration::from_secs(2));
            }
            let log = out.join(format!("cross{}-client.log", a.ep.seq));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(mbit) = iperf3_sender_mbit(&text) {
                observed["sender_mbit"] = mbit.into();
            }
        }
    }
    Ok(Truth {
        t_start: a.t_start,
        t_end: unix_now(),
        kind: a.ep.kind,
        rank: a.ep.rank,
        params: a.ep.params.clone(),
        seq: a.ep.seq,
        planned_start_s: a.ep.start_s,
        planned_end_s: a.ep.end_s,
        observed,
        aborted,
    })
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

    #[test]
    fn iperf3_summary() {
        let log = "[  5]   0.00-2.85   sec  70.2 MBytes   206 Mbits/sec    0             sender\n[  5]   0.00-2.85   sec  0.00 Bytes  0.00 bits/sec                  receiver\n[SUM]   0.00-2.85   sec   280 MBytes   824 Mbits/sec    0             sender\n[SUM]   0.00-2.85   sec  0.00 Bytes  0.00 bits/sec                  receiver\n";
        assert_eq!(iperf3_sender_mbit(log), Some(824.0));
        let one = "[  5]   0.00-3.00   sec   350 MBytes  1.02 Gbits/sec    3             sender\n";
        assert_eq!(iperf3_sender_mbit(one), Some(1020.0));
        assert_eq!(iperf3_sender_mbit("iperf3: error"), None);
    }
}

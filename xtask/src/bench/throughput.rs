//! iperf3 throughput without and with probe, alternating, and the kernel cost of probe's
//! programs under that (GSO-heavy) traffic.
use super::{bpf_counters, bpf_deltas, Programs};
use anyhow::{bail, Result};
use probe_tests::iperf::{self, ClientOpts};
use probe_tests::process::proc_usage;
use probe_tests::{kernel, probe_iface_traffic, Pair, Probe, ProbeOpts, Traffic};
use std::time::{Duration, Instant};

/// What one with-probe round measured.
#[derive(Debug, Default)]
pub struct ProbeRound {
    /// program -> (run seconds, runs) during the iperf3 run.
    pub bpf: Programs,
    /// Wire packets (GSO packets as their segments) on the veth over the same span, as
    /// probe counts them (`probe_flow_*` + `probe_nonip_*`; the flows tests check these
    /// against the kernel's counters).
    pub wire: Traffic,
    /// The veth's own counters (skbs) over the same span.
    pub veth: Traffic,
    pub cpu_seconds: f64,
    pub wall_seconds: f64,
    pub peak_rss_bytes: u64,
    /// Busy CPU seconds of the whole machine over the same span as `bpf`.
    pub machine_busy_seconds: f64,
}

/// All rounds.
#[derive(Debug, Default)]
pub struct Throughput {
    pub seconds: u32,
    pub no_offloads: bool,
    /// Received bits/s of each run without probe, and with.
    pub without: Vec<f64>,
    pub with: Vec<f64>,
    pub rounds: Vec<ProbeRound>,
}

fn iperf_round(pair: &Pair, seconds: u32) -> Result<f64> {
    let r = iperf::run_client(
        &pair.a,
        pair.ip_b.into(),
        iperf::PORT,
        &ClientOpts::tcp(seconds),
    )?;
    Ok(r.received_bps)
}

fn with_probe_round(pair: &Pair, bin: &str, seconds: u32) -> Result<(f64, ProbeRound)> {
    let mut probe = Probe::try_start(&pair.a, ProbeOpts::iface(&pair.veth_a).bin(bin))?;
    let pid = probe.pid();
    let t0 = Instant::now();
    let u0 = proc_usage(pid)?;
    probe.wait_ticks(1);
    let s0 = probe.try_metrics()?;
    let m0 = super::machine_busy_seconds()?;
    let k0 = kernel::iface_counters(&pair.a, &pair.veth_a)?;
    let bps = iperf_round(pair, seconds)?;
    probe.wait_ticks(2);
    let s1 = probe.try_metrics()?;
    let m1 = super::machine_busy_seconds()?;
    let k1 = kernel::iface_counters(&pair.a, &pair.veth_a)?;
    let wire = probe_iface_traffic(&s1, &pair.veth_a) - probe_iface_traffic(&s0, &pair.veth_a);
    let u1 = proc_usage(pid)?;
    let wall = t0.elapsed().as_secs_f64();
    let st = probe.terminate(Duration::from_secs(10));
    if !st.is_some_and(|s| s.success()) {
        bail!(
            "probe did not exit 0 on SIGTERM ({st:?}):\n{}",
            probe.log_tail(20)
        );
    }
    Ok((
        bps,
        ProbeRound {
            bpf: bpf_deltas(&bpf_counters(&s0), &bpf_counters(&s1)),
            wire,
            veth: k1 - k0,
            cpu_seconds: u1.cpu_seconds - u0.cpu_seconds,
            wall_seconds: wall,
            peak_rss_bytes: u1.peak_rss_bytes,
            machine_busy_seconds: m1 - m0,
        },
    ))
}

/// `rounds` rounds, each one run without and one with probe; the order alternates between
/// rounds, so drift hits both sides alike.
pub fn run(
    pair: &Pair,
    bin: &str,
    rounds: usize,
    seconds: u32,
    no_offloads: bool,
) -> Result<Throughput> {
    let _server = iperf::Server::start(&pair.b, pair.ip_b.into(), iperf::PORT)?;
    let mut t = Throughput {
        seconds,
        no_offloads,
        ..Default::default()
    };
    for i in 0..rounds {
        let probe_first = i % 2 == 1;
        for with_probe in [probe_first, !probe_first] {
            if with_probe {
                let (bps, r) = with_probe_round(pair, bin, seconds)?;
                t.with.push(bps);
                t.rounds.push(r);
            } else {
                t.without.push(iperf_round(pair, seconds)?);
            }
        }
        eprintln!(
            "bench: throughput round {}/{rounds}: without {:.2} Gbit/s, with {:.2} Gbit/s",
            i + 1,
            t.without[i] / 1e9,
            t.with[i] / 1e9
        );
    }
    Ok(t)
}

impl Throughput {
    /// program -> (run seconds, runs) summed over the with-probe rounds.
    pub fn programs(&self) -> Programs {
        let mut out = Programs::new();
        for r in &self.rounds {
            for (p, (t, n)) in &r.bpf {
                let e = out.entry(p.clone()).or_default();
                e.0 += t;
                e.1 += n;
            }
        }
        out
    }

    /// Wire packets probe counted on the veth during the with-probe runs (rx, tx).
    pub fn wire_packets(&self) -> (f64, f64) {
        (
            self.rounds.iter().map(|r| r.wire.rx_packets).sum(),
            self.rounds.iter().map(|r| r.wire.tx_packets).sum(),
        )
    }

    /// skbs the veth counted during the with-probe runs (rx + tx).
    pub fn veth_skbs(&self) -> f64 {
        self.rounds
            .iter()
            .map(|r| r.veth.rx_packets + r.veth.tx_packets)
            .sum()
    }
}

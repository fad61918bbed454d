//! The kernel's per-CPU receive statistics (`/proc/net/softnet_stat`): packets the backlog
//! dropped and the times the receive softirq ran out of budget. This is host-side
//! congestion no switch sees: a rank whose CPUs cannot keep up drops or delays its
//! gradients before TCP or a qdisc ever counts anything.
use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};

use super::{Kind, Metric, Sample, Source};

static PROCESSED: Metric = Metric {
    name: "probe_softnet_processed",
    help: "Packets the CPU's receive softirq processed (/proc/net/softnet_stat)",
    kind: Kind::Counter,
};
static DROPPED: Metric = Metric {
    name: "probe_softnet_dropped",
    help: "Packets dropped because the CPU's input backlog was full (netdev_max_backlog)",
    kind: Kind::Counter,
};
static SQUEEZED: Metric = Metric {
    name: "probe_softnet_times_squeezed",
    help: "Times the receive softirq stopped with work left (budget or time used up)",
    kind: Kind::Counter,
};
static BACKLOG: Metric = Metric {
    name: "probe_softnet_backlog_packets",
    help: "Packets waiting in the CPU's input backlog at the tick (kernels >= 5.10)",
    kind: Kind::Gauge,
};

pub struct Softnet {
    path: PathBuf,
}

impl Default for Softnet {
    fn default() -> Self {
        Self {
            path: PathBuf::from("/proc/net/softnet_stat"),
        }
    }
}

impl Source for Softnet {
    fn name(&self) -> &'static str {
        "softnet"
    }

    fn metrics(&self) -> &'static [&'static Metric] {
        static ALL: [&Metric; 4] = [&PROCESSED, &DROPPED, &SQUEEZED, &BACKLOG];
        &ALL
    }

    fn read(&mut self, out: &mut Vec<Sample>) -> Result<()> {
        let text = std::fs::read_to_string(&self.path)
            .with_context(|| format!("reading {}", self.path.display()))?;
        parse(&text, out)
    }
}

/// One line per online CPU, hexadecimal columns: processed, dropped, time_squeeze, five
/// unused, cpu_collision, received_rps, flow_limit_count, then (since 5.10) the backlog
/// length and the CPU's number. Older kernels have no CPU column: the line's index is the
/// CPU then (lines are not printed for offline CPUs there, so it can be off; newer kernels
/// say).
pub fn parse(text: &str, out: &mut Vec<Sample>) -> Result<()> {
    for (i, line) in text.lines().enumerate() {
        let cols = line
            .split_whitespace()
            .map(|c| u64::from_str_radix(c, 16))
            .collect::<Result<Vec<u64>, _>>()
            .with_context(|| format!("softnet_stat line {}: not hexadecimal: {line:?}", i + 1))?;
        if cols.len() < 3 {
            bail!(
                "softnet_stat line {}: {} columns, want >= 3",
                i + 1,
                cols.len()
            );
        }
        let cpu = cols.get(12).copied().unwrap_or(i as u64).to_string();
        let mut push = |metric, value: u64| {
            out.push(Sample {
                metric,
                labels: vec![("cpu", cpu.clone())],
                value: value as f64,
            })
        };
        push(&PROCESSED, cols[0]);
        push(&DROPPED, cols[1]);
        push(&SQUEEZED, cols[2]);
        if let Some(&backlog) = cols.get(11) {
            push(&BACKLOG, backlog);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(out: &[Sample], m: &Metric, cpu: &str) -> Option<f64> {
        out.iter()
            .find(|s| s.metric == m && s.labels[0].1 == cpu)
            .map(|s| s.value)
    }

    #[test]
    fn columns_of_a_6x_kernel() {
        // Read off this project's CI kernel (two CPUs), with drops and a backlog added.
        let text = "01c32c25 00000010 00000004 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000003 00000000 00000000 00000000\n\
                    0196a7cf 00000000 00000001 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001 00000000 00000000\n";
        let mut out = Vec::new();
        parse(text, &mut out).unwrap();
        assert_eq!(value(&out, &PROCESSED, "0"), Some(0x01c3_2c25 as f64));
        assert_eq!(value(&out, &DROPPED, "0"), Some(16.0));
        assert_eq!(value(&out, &SQUEEZED, "1"), Some(1.0));
        assert_eq!(value(&out, &BACKLOG, "0"), Some(3.0));
        assert_eq!(out.len(), 8);
    }

    #[test]
    fn an_old_kernel_has_no_cpu_column_and_bad_text_is_an_error() {
        let mut out = Vec::new();
        parse("00000005 00000000 00000002 0 0 0 0 0 0 0 0\n", &mut out).unwrap();
        assert_eq!(value(&out, &SQUEEZED, "0"), Some(2.0));
        assert_eq!(value(&out, &BACKLOG, "0"), None);
        let err = parse("zz 1 2\n", &mut Vec::new()).unwrap_err();
        assert!(
            format!("{err:#}").contains("line 1: not hexadecimal"),
            "{err:#}"
        );
    }
}

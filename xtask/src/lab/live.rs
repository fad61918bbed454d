//! `--prometheus`: a real Prometheus in the switch namespace scraping every rank's probe (as a
//! monitoring host on the job's network would) and evaluating `rules/`, every second. While
//! the ranks train, the lab logs the job's culprit alerts (`alerts.jsonl`) and the scores
//! behind them (`scores.jsonl`); at the end it holds them against the ground truth: which
//! episode was named, how soon, with which host and direction, and what was named while no
//! episode was on (docs/job.md, "How good it is").
use super::episodes::Truth;
use super::schedule::Kind;
use super::summary::{Iter, Summary};
use super::topo::{rank_addr, switch_addr, Lab};
use super::{record, JsonLines};
use anyhow::{bail, Result};
use probe_tests::prometheus::Prometheus;
use serde::Serialize;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// The alert that names a job's culprit host and direction (rules/job.rules.yml).
pub const CULPRIT_ALERT: &str = "ProbeJobCulpritHost";
/// Scrape and rule evaluation interval of the lab's Prometheus.
const INTERVAL: &str = "1s";
const PROM_PORT: u16 = 9090;
/// The job's scores, logged every second for tuning and for the report.
const SCORES: [&str; 7] = [
    "probe:job_host_link_score",
    "probe:job_host_srtt_ratio:as_sender",
    "probe:job_host_srtt_ratio:as_receiver",
    "probe:job_host_egress_queue_share",
    "probe:job_host_retransmits:as_receiver",
    "probe:job_host_retransmit_share:as_receiver",
    "probe:job_host_unread_bytes:avg10s",
];
/// How long after an episode ends its queues may still drain and its alert still fire
/// without counting as a false alarm.
pub const AFTER_GRACE_S: f64 = 15.0;

pub struct Live {
    prom: Prometheus,
    alerts: JsonLines,
    scores: JsonLines,
    next: Instant,
    ranks: usize,
    /// Every culprit alert seen firing.
    pub fired: Vec<Fired>,
}

/// A culprit alert seen firing.
pub struct Fired {
    /// Unix time.
    pub t: f64,
    pub rank: usize,
    pub direction: String,
    pub cause: String,
}

/// The rank a Prometheus `instance` label (`<rank address>:<port>`) stands for.
fn rank_of(instance: &str, ranks: usize) -> Option<usize> {
    let ip = instance.rsplit_once(':')?.0;
    (0..ranks).find(|&i| rank_addr(i).to_string() == ip)
}

impl Live {
    pub fn start(lab: &Lab, ranks: usize, out: &Path) -> Result<Live> {
        lab.address_switch()?;
        let targets: Vec<SocketAddr> = (0..ranks)
            .map(|i| SocketAddr::from((rank_addr(i), record::PORT)))
            .collect();
        let at = SocketAddr::from((switch_addr(), PROM_PORT));
        let ns = format!("/var/run/netns/{}", lab.switch_ns());
        let prom = Prometheus::start_in(&ns, at, &targets, INTERVAL)?;
        eprintln!("lab: Prometheus on {at} in the switch namespace, scraping {ranks} probes every {INTERVAL}");
        Ok(Live {
            prom,
            alerts: JsonLines::create(&out.join("alerts.jsonl"))?,
            scores: JsonLines::create(&out.join("scores.jsonl"))?,
            next: Instant::now(),
            ranks,
            fired: Vec::new(),
        })
    }

    /// Once a second: the culprit alerts and the scores, logged.
    pub fn tick(&mut self, now_unix: f64) -> Result<()> {
        if Instant::now() < self.next {
            return Ok(());
        }
        self.next = Instant::now() + Duration::from_secs(1);
        for a in self.prom.alerts()? {
            if a.name != CULPRIT_ALERT {
                continue;
            }
            self.alerts.write(&serde_json::json!({
                "t": now_unix, "state": a.state, "labels": a.labels,
            }))?;
            if a.state == "firing" {
                if let Some(r) = a.label("instance").and_then(|i| rank_of(i, self.ranks)) {
                    let label = |k| a.label(k).unwrap_or("").to_owned();
                    self.fired.push(Fired {
                        t: now_unix,
                        rank: r,
                        direction: label("direction"),
                        cause: label("cause"),
                    });
                }
            }
        }
        for name in SCORES {
            for (labels, v) in self.prom.query_values(name)? {
                let Some(r) = labels
                    .get("instance")
                    .and_then(|i| i.as_str())
                    .and_then(|i| rank_of(i, self.ranks))
                else {
                    continue;
                };
                self.scores.write(
                    &serde_json::json!({"t": now_unix, "score": name, "rank": r, "value": v}),
                )?;
            }
        }
        Ok(())
    }

    /// Rules that failed to evaluate are an error of the run, not a quiet empty score.
    pub fn finish(self) -> Result<()> {
        let bad = self.prom.unhealthy_rules()?;
        if !bad.is_empty() {
            bail!("rules failed to evaluate in the lab's Prometheus: {bad:?}");
        }
        Ok(())
    }
}

/// The host and direction an episode's culprit alert should name.
pub fn expected(t: &Truth) -> (usize, &'static str) {
    match t.kind {
        // A squeezed egress, or a sender's cross traffic filling its own egress.
        Kind::Tbf | Kind::Squeeze | Kind::Cross | Kind::Ramp => (t.rank, "egress"),
        // Its switch port (incast) or its input (loss): what reaches the host.
        Kind::Incast | Kind::Loss => (t.rank, "ingress"),
        // Slow to compute, its network innocent (no alert names it yet: docs/job.md).
        Kind::Straggle => (t.rank, "compute"),
    }
}

/// What the culprit alert said about one episode.
#[derive(Serialize, Debug)]
pub struct Verdict {
    pub seq: usize,
    pub kind: Kind,
    pub rank: usize,
    pub direction: &'static str,
    /// Mean iteration time during the episode over the calm mean (traingen's log).
    pub slowdown: Option<f64>,
    /// Seconds from the episode's onset to the end of the first iteration that took 1.2x
    /// the calm median or longer: when training slowed (a gradual episode's first steps
    /// may not slow it at all).
    pub slowed_after_s: Option<f64>,
    /// Seconds from the episode's onset to the first firing alert naming the right host and
    /// direction while it was on (None: never).
    pub named_after_s: Option<f64>,
    /// Other (host, direction) pairs named while it was on.
    pub also_named: Vec<(usize, String)>,
}

#[derive(Serialize, Debug)]
pub struct Report {
    pub episodes: Vec<Verdict>,
    /// Firing alerts seen while no episode was on (nor within the grace after one), as
    /// (seconds after the traffic started, rank, direction, cause).
    pub calm_alarms: Vec<(f64, usize, String, String)>,
}

/// What the report needs of the run besides the alerts.
pub struct Run<'a> {
    pub truths: &'a [Truth],
    /// Every rank's iterations (traingen's log).
    pub iters: &'a [Iter],
    /// The run's summary: its start, its calm iterations, each episode's slowdown.
    pub summary: &'a Summary,
}

/// Holds the alerts seen against the ground truth.
pub fn report(fired: &[Fired], run: &Run) -> Report {
    let (truths, t0) = (run.truths, run.summary.t0);
    let episodes = truths
        .iter()
        .filter(|t| !t.aborted)
        .map(|t| {
            let slowed_after_s = run.summary.calm.iterations.median_s.and_then(|calm| {
                run.iters
                    .iter()
                    .filter(|i| i.t_end >= t.t_start && i.t_end <= t.t_end)
                    .filter(|i| i.duration_s >= 1.2 * calm)
                    .map(|i| i.t_end - t.t_start)
                    .min_by(f64::total_cmp)
            });
            let slowdown = run
                .summary
                .episodes
                .iter()
                .find(|e| e.seq == t.seq)
                .and_then(|e| e.slowdown);
            let (rank, direction) = expected(t);
            let during = fired
                .iter()
                .filter(|f| f.t >= t.t_start && f.t <= t.t_end + AFTER_GRACE_S);
            let named_after_s = during
                .clone()
                .find(|f| f.rank == rank && f.direction == direction)
                .map(|f| f.t - t.t_start);
            let mut also_named: Vec<(usize, String)> = during
                .filter(|f| !(f.rank == rank && f.direction == direction))
                .map(|f| (f.rank, f.direction.clone()))
                .collect();
            also_named.sort();
            also_named.dedup();
            Verdict {
                seq: t.seq,
                kind: t.kind,
                rank,
                direction,
                slowdown,
                slowed_after_s,
                named_after_s,
                also_named,
            }
        })
        .collect();
    let calm_alarms = fired
        .iter()
        .filter(|f| {
            !truths
                .iter()
                .any(|t| f.t >= t.t_start && f.t <= t.t_end + AFTER_GRACE_S)
        })
        .map(|f| (f.t - t0, f.rank, f.direction.clone(), f.cause.clone()))
        .collect();
    Report {
        episodes,
        calm_alarms,
    }
}

/// The report as lines for the lab summary.
pub fn render(r: &Report) -> String {
    let mut s = String::from("culprit alerts (live, Prometheus):\n");
    for v in &r.episodes {
        let named = match v.named_after_s {
            Some(x) => format!("named after {x:.1} s"),
            None => "NOT named".to_owned(),
        };
        let slowed = match (v.slowdown, v.slowed_after_s) {
            (Some(x), Some(a)) => format!("training x{x:.2}, slowed after {a:.1} s"),
            (Some(x), None) => format!("training x{x:.2}"),
            _ => "training not measured".to_owned(),
        };
        let also = if v.also_named.is_empty() {
            String::new()
        } else {
            format!(", also named {:?}", v.also_named)
        };
        s += &format!(
            "  episode {} {} on rank {} ({}): {slowed}; {named}{also}\n",
            v.seq, v.kind, v.rank, v.direction
        );
    }
    s += &format!(
        "  calm alarms: {}{}\n",
        r.calm_alarms.len(),
        r.calm_alarms
            .first()
            .map(|(t, r, d, c)| format!(" (first at {t:.0} s: rank {r} {d} {c})"))
            .unwrap_or_default()
    );
    s
}

/// Writes the report beside the logs.
pub fn write(out: &Path, r: &Report) -> Result<()> {
    std::fs::write(out.join("live.json"), serde_json::to_vec_pretty(r)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prometheus names a target `address:port`; only the lab's own ranks count.
    #[test]
    fn instances_map_to_their_ranks() {
        let at = |i: usize| format!("{}:{}", rank_addr(i), record::PORT);
        assert_eq!(rank_of(&at(0), 4), Some(0));
        assert_eq!(rank_of(&at(3), 4), Some(3));
        assert_eq!(rank_of(&at(4), 4), None);
        assert_eq!(rank_of(&format!("{}:9090", switch_addr()), 4), None);
        assert_eq!(rank_of("no-port", 4), None);
    }
}

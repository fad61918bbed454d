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
use std::collections::{BTreeMap, BTreeSet};
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
    /// What the probes said of the jobs, over the run: (job, host) -> the ranks
    /// `probe_job_info` gave and the peers `probe_job_peer_info` named.
    pub seen: BTreeMap<(String, usize), JobSeen>,
}

/// A culprit alert seen firing.
pub struct Fired {
    /// Unix time.
    pub t: f64,
    pub job: String,
    pub rank: usize,
    pub direction: String,
    pub cause: String,
}

/// One host's view of one job, as its probe exported it at any time of the run.
#[derive(Serialize, Debug, Default, Clone, PartialEq)]
pub struct JobSeen {
    pub ranks: BTreeSet<String>,
    pub peers: BTreeSet<String>,
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
            seen: BTreeMap::new(),
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
                        job: label("training_job"),
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
        self.note_jobs()
    }

    /// The jobs each probe exports now, added to what it exported before.
    fn note_jobs(&mut self) -> Result<()> {
        for (series, label) in [("probe_job_info", "rank"), ("probe_job_peer_info", "peer")] {
            for (labels, _) in self.prom.query_values(series)? {
                let get = |k: &str| labels.get(k).and_then(|v| v.as_str()).unwrap_or("");
                let Some(host) = rank_of(get("instance"), self.ranks) else {
                    continue;
                };
                let seen = self
                    .seen
                    .entry((get("training_job").to_owned(), host))
                    .or_default();
                let set = if label == "rank" {
                    &mut seen.ranks
                } else {
                    &mut seen.peers
                };
                set.insert(get(label).to_owned());
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

/// What the culprit alert said about one episode, in one job that runs on its host (an
/// episode on a host two jobs share is judged in both).
#[derive(Serialize, Debug)]
pub struct Verdict {
    pub seq: usize,
    pub kind: Kind,
    pub job: String,
    /// The host (with one job, its rank).
    pub rank: usize,
    pub direction: &'static str,
    /// The job's mean iteration time during the episode over its calm mean (traingen's log).
    pub slowdown: Option<f64>,
    /// Seconds from the episode's onset to the end of the job's first iteration that took
    /// 1.2x its calm median or longer: when training slowed (a gradual episode's first
    /// steps may not slow it at all).
    pub slowed_after_s: Option<f64>,
    /// Seconds from the episode's onset to the first firing alert of this job naming the
    /// right host and direction while it was on (None: never).
    pub named_after_s: Option<f64>,
    /// Anything else named while it was on, in any job: (job, host, direction).
    pub also_named: Vec<(String, usize, String)>,
}

#[derive(Serialize, Debug)]
pub struct Report {
    pub episodes: Vec<Verdict>,
    /// Firing alerts seen while no episode was on (nor within the grace after one), as
    /// (seconds after the traffic started, job, host, direction, cause).
    pub calm_alarms: Vec<(f64, String, usize, String, String)>,
    /// What each host's probe exported of each job over the run (the jobs it found).
    pub jobs_seen: Vec<JobSeenAt>,
}

/// [`JobSeen`] with its job and host, for the report.
#[derive(Serialize, Debug)]
pub struct JobSeenAt {
    pub job: String,
    pub host: usize,
    #[serde(flatten)]
    pub seen: JobSeen,
}

/// One job of the run, as the report needs it.
pub struct JobRun {
    pub name: String,
    /// Its ranks' hosts.
    pub hosts: Vec<usize>,
    /// Its ranks' iterations (traingen's logs).
    pub iters: Vec<Iter>,
    /// Its summary: the run's start, its calm iterations, each episode's slowdown.
    pub summary: Summary,
}

/// Holds the alerts seen against the ground truth.
pub fn report(
    fired: &[Fired],
    truths: &[Truth],
    jobs: &[JobRun],
    seen: &BTreeMap<(String, usize), JobSeen>,
) -> Report {
    let t0 = jobs.first().map_or(0.0, |j| j.summary.t0);
    let mut episodes = Vec::new();
    for t in truths.iter().filter(|t| !t.aborted) {
        let (rank, direction) = expected(t);
        let during: Vec<&Fired> = fired
            .iter()
            .filter(|f| f.t >= t.t_start && f.t <= t.t_end + AFTER_GRACE_S)
            .collect();
        let on_host: Vec<&JobRun> = jobs.iter().filter(|j| j.hosts.contains(&rank)).collect();
        let right = |f: &Fired| {
            f.rank == rank && f.direction == direction && on_host.iter().any(|j| j.name == f.job)
        };
        let mut also_named: Vec<(String, usize, String)> = during
            .iter()
            .filter(|f| !right(f))
            .map(|f| (f.job.clone(), f.rank, f.direction.clone()))
            .collect();
        also_named.sort();
        also_named.dedup();
        for job in &on_host {
            episodes.push(verdict(t, job, &during, also_named.clone()));
        }
    }
    let calm_alarms = fired
        .iter()
        .filter(|f| {
            !truths
                .iter()
                .any(|t| f.t >= t.t_start && f.t <= t.t_end + AFTER_GRACE_S)
        })
        .map(|f| {
            (
                f.t - t0,
                f.job.clone(),
                f.rank,
                f.direction.clone(),
                f.cause.clone(),
            )
        })
        .collect();
    let jobs_seen = seen
        .iter()
        .map(|((job, host), s)| JobSeenAt {
            job: job.clone(),
            host: *host,
            seen: s.clone(),
        })
        .collect();
    Report {
        episodes,
        calm_alarms,
        jobs_seen,
    }
}

/// One episode in one job on its host.
fn verdict(
    t: &Truth,
    job: &JobRun,
    during: &[&Fired],
    also_named: Vec<(String, usize, String)>,
) -> Verdict {
    let (rank, direction) = expected(t);
    let slowed_after_s = job.summary.calm.iterations.median_s.and_then(|calm| {
        job.iters
            .iter()
            .filter(|i| i.t_end >= t.t_start && i.t_end <= t.t_end)
            .filter(|i| i.duration_s >= 1.2 * calm)
            .map(|i| i.t_end - t.t_start)
            .min_by(f64::total_cmp)
    });
    let slowdown = job
        .summary
        .episodes
        .iter()
        .find(|e| e.seq == t.seq)
        .and_then(|e| e.slowdown);
    let named_after_s = during
        .iter()
        .find(|f| f.job == job.name && f.rank == rank && f.direction == direction)
        .map(|f| f.t - t.t_start);
    Verdict {
        seq: t.seq,
        kind: t.kind,
        job: job.name.clone(),
        rank,
        direction,
        slowdown,
        slowed_after_s,
        named_after_s,
        also_named,
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
            "  episode {} {} on rank {} ({}) in {}: {slowed}; {named}{also}\n",
            v.seq, v.kind, v.rank, v.direction, v.job
        );
    }
    s += &format!(
        "  calm alarms: {}{}\n",
        r.calm_alarms.len(),
        r.calm_alarms
            .first()
            .map(|(t, j, r, d, c)| format!(" (first at {t:.0} s: rank {r} {d} {c} in {j})"))
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

    fn truth(seq: usize, rank: usize, t_start: f64, t_end: f64) -> Truth {
        Truth {
            t_start,
            t_end,
            kind: Kind::Tbf,
            rank,
            params: super::super::schedule::Params::Tbf {
                rate_mbit: 62,
                base_mbit: 1000,
            },
            seq,
            planned_start_s: t_start,
            planned_end_s: t_end,
            observed: serde_json::Value::Null,
            aborted: false,
            onset: super::super::schedule::Onset::Abrupt,
            gradual: None,
        }
    }

    fn job(name: &str, hosts: &[usize]) -> JobRun {
        let retrans = BTreeMap::new();
        JobRun {
            name: name.into(),
            hosts: hosts.to_vec(),
            iters: Vec::new(),
            summary: super::super::summary::summarize(&super::super::summary::Inputs {
                t0: 0.0,
                t_last: 100.0,
                ranks: hosts.len(),
                iters: &[],
                truth: &[],
                rtt: &[],
                retrans: &retrans,
                calm_retrans: None,
            }),
        }
    }

    fn fired(t: f64, job: &str, rank: usize) -> Fired {
        Fired {
            t,
            job: job.into(),
            rank,
            direction: "egress".into(),
            cause: "queue".into(),
        }
    }

    /// An episode is judged in every job on its host, each by its own alerts; an alert in a
    /// job the host is not in, or naming another host, is another host named, with its job.
    #[test]
    fn episodes_are_judged_in_the_jobs_on_their_host() {
        let jobs = [job("a", &[0, 1, 2, 3]), job("b", &[2, 3, 4, 5])];
        let truths = [truth(0, 2, 10.0, 20.0), truth(1, 4, 50.0, 60.0)];
        let alerts = [
            fired(14.0, "a", 2),
            fired(16.0, "b", 2),
            fired(55.0, "b", 4),
            fired(56.0, "a", 1),
            fired(90.0, "b", 5),
        ];
        let r = report(&alerts, &truths, &jobs, &BTreeMap::new());
        let got: Vec<(usize, &str, Option<f64>)> = r
            .episodes
            .iter()
            .map(|v| (v.seq, v.job.as_str(), v.named_after_s))
            .collect();
        assert_eq!(
            got,
            [
                (0, "a", Some(4.0)),
                (0, "b", Some(6.0)),
                (1, "b", Some(5.0))
            ]
        );
        assert!(r.episodes[0].also_named.is_empty());
        assert_eq!(
            r.episodes[2].also_named,
            [("a".to_owned(), 1, "egress".to_owned())]
        );
        assert_eq!(r.calm_alarms.len(), 1);
        assert_eq!((r.calm_alarms[0].1.as_str(), r.calm_alarms[0].2), ("b", 5));
    }
}

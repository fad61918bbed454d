//! `probe analyze`: a recording turned into an analysis of the training job it saw: who
//! talks to whom, the communication pattern with its evidence, the iteration timing and its
//! phases, clusters of time windows and the change points between them, and, with
//! `--compare`, how two runs differ. Lab runs are checked against what the lab ran.
//! docs/analyze.md.
mod changes;
mod cluster;
mod compare;
mod culprit;
mod labcheck;
mod load;
mod pattern;
mod plots;
mod report;
mod series;
mod timing;
mod traffic;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use serde::Serialize;

use load::Recording;

#[derive(clap::Args, Debug, Clone)]
pub struct AnalyzeArgs {
    /// Recordings of one job (`probe record` files, or lab run directories); several are
    /// taken as hosts of the same job.
    #[arg(value_name = "REC", required = true)]
    pub recordings: Vec<PathBuf>,

    /// Recordings of another job or run to compare with.
    #[arg(long, value_name = "REC", num_args = 1..)]
    pub compare: Vec<PathBuf>,

    /// The address a host's peers name it by, as NAME=ADDRESS (NAME: the recording's file
    /// name without `.parquet`); for recordings of several hosts whose own address cannot
    /// be inferred (lab runs know theirs, and so does a recording whose probe found its
    /// host's training jobs, which it keeps as `probe.jobs`, when they used one address).
    #[arg(long, value_name = "NAME=ADDRESS")]
    pub address: Vec<String>,

    /// Directory for the reports (created).
    #[arg(
        long,
        short = 'o',
        value_name = "DIR",
        default_value = "probe-analysis"
    )]
    pub out: PathBuf,
}

#[derive(Serialize)]
pub struct Analysis {
    pub recording: String,
    pub start_unix: f64,
    pub seconds: f64,
    pub ticks: usize,
    pub matrix: traffic::Matrix,
    pub timing: timing::Timing,
    pub pattern: pattern::Pattern,
    pub changes: Vec<changes::Change>,
    /// The per-tick signals (null: unknown) and the change distance.
    pub series: series::Series,
    pub distance: Vec<f64>,
    pub clusters: Option<cluster::Clusters>,
    /// How each busy peer direction was judged part of the job or not.
    pub classes: Vec<timing::ClassCheck>,
}

pub fn analyze(rec: &Recording) -> Analysis {
    let mut matrix = traffic::matrix(rec);
    let classes = timing::classes(rec, &matrix.candidates());
    let (timing, checks) = timing::timing(rec, &classes);
    let mut job: Vec<String> = timing.profiles.iter().map(|p| p.peer.clone()).collect();
    job.sort();
    job.dedup();
    matrix.mark_job(&job);
    let pattern = pattern::classify(&timing.profiles);
    let series = series::series(rec, &job, &timing.iterations);
    let (changes, distance) = changes::changes(&series);
    let clusters = cluster::cluster(&series);
    Analysis {
        recording: rec.name.clone(),
        start_unix: rec.start(),
        seconds: rec.end() - rec.start(),
        ticks: series.t.len(),
        matrix,
        timing,
        pattern,
        changes,
        distance,
        series,
        clusters,
        classes: checks,
    }
}

fn num(v: f64, digits: usize) -> String {
    if v.is_finite() {
        format!("{v:.digits$}")
    } else {
        "-".into()
    }
}

fn mb(v: f64) -> String {
    num(v / 1e6, 1)
}

/// A table row: burst size quantiles in kB.
fn durations(what: &str, q: &timing::Quantiles) -> Vec<String> {
    vec![
        format!("burst duration {what} p50 / p90"),
        format!("{} / {} ms", num(1e3 * q.p50, 2), num(1e3 * q.p90, 2)),
    ]
}

fn sizes(what: &str, q: &timing::Quantiles) -> Vec<String> {
    vec![
        format!("burst size {what} p10 / p50 / p90 / p99"),
        format!(
            "{} / {} / {} / {} kB (n={})",
            num(q.p10 / 1e3, 1),
            num(q.p50 / 1e3, 1),
            num(q.p90 / 1e3, 1),
            num(q.p99 / 1e3, 1),
            q.n
        ),
    ]
}

/// The report of one recording.
fn document(
    rec: &Recording,
    a: &Analysis,
    check: Option<&labcheck::LabCheck>,
) -> Result<report::Doc> {
    let mut d = report::Doc::new(format!("probe analyze: {}", a.recording));
    d.p(format!(
        "{:.0} s, {} ticks of {} s, from `{}`{}.",
        a.seconds,
        a.ticks,
        a.series.tick_s,
        rec.path.display(),
        rec.lab
            .as_ref()
            .map(|l| format!(", a lab run of {} ranks ({})", l.ranks, l.pattern))
            .unwrap_or_default()
    ));
    summary(&mut d, a);
    if let Some(c) = check {
        lab_check(&mut d, a, c);
    }
    who_talks(&mut d, a);
    pattern_section(&mut d, a);
    timing_section(&mut d, a)?;
    over_time(&mut d, rec, a)?;
    Ok(d)
}

/// The summary: pattern, period, communication share, changes.
fn summary(d: &mut report::Doc, a: &Analysis) {
    d.h(1, "Summary");
    let t = &a.timing;
    d.list(vec![
        format!(
            "Pattern: **{}**{} with confidence {:.0}%.",
            a.pattern.name,
            a.pattern.role.map(|r| format!(" ({r})")).unwrap_or_default(),
            100.0 * a.pattern.confidence
        ),
        format!(
            "Iteration period {} s (p10 {} s, p90 {} s, {} iterations); the autocorrelation of the bursts says {} s.",
            num(t.period_s, 4),
            num(t.period_p10_s, 4),
            num(t.period_p90_s, 4),
            t.iteration_count,
            num(t.acf_period_s, 4)
        ),
        format!(
            "Communication takes {}% of an iteration; {} MB move per iteration.",
            num(100.0 * t.duty_cycle, 1),
            mb(t.bytes_per_iteration)
        ),
        format!(
            "{} change point(s); {} cluster(s) of ticks.",
            a.changes.len(),
            a.clusters.as_ref().map_or(0, |c| c.k)
        ),
    ]);
}

/// What the lab ran against what was found.
fn lab_check(d: &mut report::Doc, a: &Analysis, c: &labcheck::LabCheck) {
    d.h(1, "Lab ground truth");
    let mut rows = vec![
        vec![
            "pattern".into(),
            c.pattern_expected.clone(),
            c.pattern_found.clone(),
            if c.pattern_ok { "yes" } else { "**no**" }.into(),
        ],
        vec![
            "iteration period".into(),
            format!("{} s (traingen's median)", num(c.traingen_median_s, 4)),
            format!(
                "{} s ({:+.1}%)",
                num(c.period_s, 4),
                100.0 * (c.period_s / c.traingen_median_s - 1.0)
            ),
            if c.period_ok {
                "yes (within 10%)"
            } else {
                "**no**"
            }
            .into(),
        ],
    ];
    for e in &c.edges {
        rows.push(vec![
            format!("{} {}", e.episode, e.edge),
            format!("abrupt, at {:.1} s", e.time_unix - a.start_unix),
            e.nearest_ticks.map_or("no change point".into(), |n| {
                format!("nearest change point {n:+.1} ticks")
            }),
            if e.found {
                "yes (within 2 ticks)"
            } else {
                "**no**"
            }
            .into(),
        ]);
    }
    if let (Some(x), Some(y)) = (c.episode_ticks_not_calm, c.calm_ticks_calm) {
        rows.push(vec![
            "clusters".into(),
            "abrupt episodes apart from calm".into(),
            format!(
                "{:.0}% of episode ticks outside the calm cluster, {:.0}% of calm ticks in it",
                100.0 * x,
                100.0 * y
            ),
            if x >= 0.7 && y >= 0.7 {
                "yes"
            } else {
                "**no**"
            }
            .into(),
        ]);
    }
    d.table(&["check", "the lab ran", "found", "agrees"], rows);
}

/// The traffic matrix from this host's side.
fn who_talks(d: &mut report::Doc, a: &Analysis) {
    d.h(1, "Who talks to whom");
    d.p("Bytes between this host and each peer over the recording (TC counters of the monitored interfaces). `typical` is the median rate over the ticks: cross traffic that only runs part of the time barely moves it. A job peer is one whose bursts repeat with the job's iteration.");
    d.table(
        &[
            "peer",
            "sent MB",
            "received MB",
            "share",
            "direction",
            "typical sent MB/s",
            "typical received MB/s",
            "job",
        ],
        a.matrix
            .peers
            .iter()
            .take(20)
            .map(|p| {
                vec![
                    p.peer.clone(),
                    mb(p.tx_bytes),
                    mb(p.rx_bytes),
                    format!("{:.1}%", 100.0 * p.share),
                    p.direction.into(),
                    mb(p.tx_typical),
                    mb(p.rx_typical),
                    if p.job { "yes" } else { "" }.into(),
                ]
            })
            .collect(),
    );
}

/// The pattern with its scores and evidence.
fn pattern_section(d: &mut report::Doc, a: &Analysis) {
    d.h(1, "Pattern");
    d.p(format!(
        "**{}**{}, confidence {:.0}%. Scores: {}.",
        a.pattern.name,
        a.pattern
            .role
            .map(|r| format!(" ({r})"))
            .unwrap_or_default(),
        100.0 * a.pattern.confidence,
        a.pattern
            .scores
            .iter()
            .map(|s| format!("{} {:.2}", s.pattern, s.score))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    d.list(a.pattern.evidence.clone());
}

/// Iteration timing, its phases and burst sizes, with figures.
fn timing_section(d: &mut report::Doc, a: &Analysis) -> Result<()> {
    let t = &a.timing;
    d.h(1, "Timing");
    d.table(
        &["measure", "value"],
        vec![
            vec!["iterations".into(), t.iteration_count.to_string()],
            vec![
                "period, median (p10 - p90)".into(),
                format!(
                    "{} s ({} - {} s)",
                    num(t.period_s, 4),
                    num(t.period_p10_s, 4),
                    num(t.period_p90_s, 4)
                ),
            ],
            vec![
                "jitter: (p90 - p10) / median".into(),
                format!("{}%", num(100.0 * t.jitter_ratio, 1)),
            ],
            vec![
                "jitter: median change between successive iterations".into(),
                format!("{} ms", num(1e3 * t.jitter_s, 2)),
            ],
            vec![
                "communication share of an iteration (duty cycle)".into(),
                format!("{}%", num(100.0 * t.duty_cycle, 1)),
            ],
            vec![
                "bytes per iteration (job peers, data bursts)".into(),
                format!("{} MB", mb(t.bytes_per_iteration)),
            ],
            sizes("sent", &t.burst_bytes_tx),
            sizes("received", &t.burst_bytes_rx),
            durations("sent", &t.burst_seconds_tx),
            durations("received", &t.burst_seconds_rx),
        ],
    );
    d.h(2, "Phases of one iteration");
    d.p(format!(
        "Iterations start at the quietest point of the traffic (found from `{}`); each job peer's direction is folded onto them.",
        t.marker.clone().unwrap_or_else(|| "-".into())
    ));
    d.table(
        &["from", "to", "what happens"],
        t.phases
            .iter()
            .map(|p| {
                vec![
                    format!("{:.0}%", 100.0 * p.from),
                    format!("{:.0}%", 100.0 * p.to),
                    if p.active.is_empty() {
                        "no job traffic (compute)".into()
                    } else {
                        p.active.join(", ")
                    },
                ]
            })
            .collect(),
    );
    let err = |e: Box<dyn std::error::Error>| anyhow::anyhow!("drawing a figure: {e}");
    d.figure("phases.svg", plots::phases(&a.recording, t).map_err(err)?);
    d.figure(
        "burst-sizes.svg",
        plots::burst_sizes(&a.recording, t).map_err(err)?,
    );
    Ok(())
}

/// Change points and clusters over time, with the lab's episodes shaded.
fn over_time(d: &mut report::Doc, rec: &Recording, a: &Analysis) -> Result<()> {
    let err = |e: Box<dyn std::error::Error>| anyhow::anyhow!("drawing a figure: {e}");
    d.h(1, "Over time: change points and clusters");
    d.p("Change points: ticks where the median of RTT, throughput, retransmits or iteration length over the 5 ticks after differs from the 5 before by more than the signals' tick-to-tick noise allows. Clusters: the ticks grouped by k-means on the daemon's own 5 s features (RTT, throughput, retransmits) and the iteration length; k by the silhouette.");
    d.table(
        &["at", "strength", "what changed"],
        a.changes
            .iter()
            .map(|c| {
                vec![
                    format!("{:.0} s", c.at_s),
                    format!("{:.1}", c.strength),
                    c.what.join(", "),
                ]
            })
            .collect(),
    );
    if let Some(cl) = &a.clusters {
        d.table(
            &["cluster", "ticks", "share", "description"],
            cl.clusters
                .iter()
                .map(|c| {
                    vec![
                        c.id.to_string(),
                        c.ticks.to_string(),
                        format!("{:.0}%", 100.0 * c.share),
                        c.description.clone(),
                    ]
                })
                .collect(),
        );
        d.p(format!("k = {}, silhouette {:.2}.", cl.k, cl.silhouette));
    }
    let spans: plots::Spans = rec
        .lab
        .iter()
        .flat_map(|l| l.episodes.iter())
        .map(|e| {
            (
                e.t_start - a.start_unix,
                e.t_end - a.start_unix,
                e.kind.clone(),
            )
        })
        .collect();
    if !spans.is_empty() {
        d.p("Shaded: the lab's congestion episodes. Red lines: change points.");
    }
    d.figure("timeline.svg", plots::timeline(a, &spans).map_err(err)?);
    Ok(())
}

fn write_doc(dir: &std::path::Path, d: &report::Doc) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (f, svg) in d.figures() {
        std::fs::write(dir.join(f), svg)?;
    }
    std::fs::write(dir.join("report.md"), d.markdown())?;
    std::fs::write(dir.join("report.html"), d.html())?;
    Ok(())
}

/// The job across hosts: the bytes each host sent to each address, and the hosts that
/// slowed it.
fn job_report(out: &Path, group: &[(Recording, Analysis)], addresses: &[String]) -> Result<()> {
    let hosts: Vec<(String, Option<String>, &traffic::Matrix)> = group
        .iter()
        .map(|(r, a)| {
            let given = addresses
                .iter()
                .find_map(|x| x.strip_prefix(&format!("{}=", r.name)))
                .map(str::to_owned);
            (
                r.name.clone(),
                given
                    .or_else(|| r.lab.as_ref().and_then(|l| l.addr.clone()))
                    .or_else(|| r.recorded_address.clone()),
                &a.matrix,
            )
        })
        .collect();
    let jm = traffic::job_matrix(&hosts);
    let mut d = report::Doc::new("probe analyze: the job across hosts");
    d.p("MB each host (row) sent to each address (column) over its recording.");
    let mut head = vec!["host"];
    head.extend(jm.addresses.iter().map(String::as_str));
    d.table(
        &head,
        jm.hosts
            .iter()
            .zip(&jm.bytes)
            .map(|(h, row)| {
                std::iter::once(h.clone())
                    .chain(row.iter().map(|b| mb(*b)))
                    .collect()
            })
            .collect(),
    );
    let dir = out.join("job");
    let culprits = culprit_section(&mut d, group, &jm.hosts)?;
    write_doc(&dir, &d)?;
    std::fs::write(dir.join("matrix.json"), serde_json::to_vec_pretty(&jm)?)?;
    if let Some(c) = culprits {
        std::fs::write(dir.join("culprits.json"), serde_json::to_vec_pretty(&c)?)?;
    }
    eprintln!("analyze: the job -> {}", dir.join("report.html").display());
    Ok(())
}

#[derive(Serialize)]
struct JobCulprits {
    culprits: Vec<culprit::Culprit>,
    lab_check: Option<culprit::LabVerdicts>,
}

/// The hosts that slowed the job, by the live alert's scores, each with a heat map.
fn culprit_section(
    d: &mut report::Doc,
    group: &[(Recording, Analysis)],
    names: &[String],
) -> Result<Option<JobCulprits>> {
    d.h(1, "Which host slowed the job, and which way");
    let hosts: Vec<culprit::Host> = group
        .iter()
        .zip(names)
        .filter(|(_, a)| a.parse::<std::net::IpAddr>().is_ok())
        .map(|((r, _), a)| culprit::Host {
            name: r.name.clone(),
            addr: a.clone(),
            rec: r,
        })
        .collect();
    if hosts.len() < 2 {
        d.p("Not known: fewer than two recordings with a known address (give each host's with `--address NAME=ADDRESS`).");
        return Ok(None);
    }
    let unnamed: Vec<&str> = group
        .iter()
        .filter(|(r, _)| !hosts.iter().any(|h| h.name == r.name))
        .map(|(r, _)| r.name.as_str())
        .collect();
    let sc = culprit::scores(&hosts);
    let found = culprit::culprits(&sc);
    d.p(format!(
        "The live alert `ProbeJobCulpritHost` (rules/job.rules.yml, docs/job.md) evaluated at every tick ({:.1} s) of {} hosts' recordings: a host is named **egress** when its RTT towards the job's hosts is over {}x its calm level (the median of the last hour, not learnt while the job is named) and over twice the job's lowest host's, and its own qdisc holds more than a quarter of it, **ingress** when its connections are slowed both ways while its qdisc is calm (the queue is on what reaches it), or when over 1% of the segments sent to it are retransmitted, the largest share of the job's hosts, **compute** when it holds the job's bytes unread in its sockets (over 64 KiB, 4x the job's median host, more than any host holds unsent) with its RTT calm while the job moves under {}x its calm bytes per second and no loss or egress queue in the job explains it. Namings of one host and direction less than {:.0} s apart are one row.{}",
        sc.tick_s,
        hosts.len(),
        culprit::RATIO,
        culprit::JOB_SLOWED,
        culprit::MERGE_S,
        if unnamed.is_empty() {
            String::new()
        } else {
            format!(" Left out, their address unknown: {}.", unnamed.join(", "))
        }
    ));
    let t0 = sc.t0;
    let rel = |t: f64| format!("{:.0} s", t - t0);
    d.table(
        &["host", "direction", "cause", "from", "to", "evidence at its peak"],
        found
            .iter()
            .map(|c| {
                let e = &c.evidence;
                vec![
                    format!("**{}**", c.host),
                    c.direction.into(),
                    c.causes.join(", "),
                    rel(c.from_unix),
                    rel(c.to_unix),
                    format!(
                        "at {}: RTT x{} as sender, x{} as receiver; own qdisc {}% of its RTT; retransmits {}% of the segments sent to it; {} kB unread; the job at {}x its calm pace",
                        rel(c.peak_unix),
                        num(e.as_sender, 1),
                        num(e.as_receiver, 1),
                        num(100.0 * e.egress_share, 0),
                        num(100.0 * e.retransmit_share, 2),
                        num(e.unread_bytes / 1e3, 0),
                        num(e.job_pace, 2)
                    ),
                ]
            })
            .collect(),
    );
    if found.is_empty() {
        d.p("No host was named.");
    }
    let err = |e: Box<dyn std::error::Error>| anyhow::anyhow!("drawing a figure: {e}");
    const MAPS: usize = 12;
    for (n, c) in found.iter().take(MAPS).enumerate() {
        let title = format!(
            "{} {} at {}: srtt over calm, host x host",
            c.host,
            c.direction,
            rel(c.peak_unix)
        );
        d.figure(
            format!("culprit-{}.svg", n + 1),
            plots::heat_map(&title, &sc.hosts, &c.matrix).map_err(err)?,
        );
    }
    if found.len() > MAPS {
        d.p(format!("Heat maps of the first {MAPS} only."));
    }
    let lab_check = group
        .iter()
        .find_map(|(r, _)| r.lab.as_ref())
        .map(|l| culprit::against_lab(&sc, l));
    if let Some(v) = &lab_check {
        lab_verdicts(d, v);
    }
    Ok(Some(JobCulprits {
        culprits: found,
        lab_check,
    }))
}

/// A lab run's episodes and what the culprits said of each.
fn lab_verdicts(d: &mut report::Doc, v: &culprit::LabVerdicts) {
    d.h(2, "Against the lab's episodes");
    d.p("Each episode's culprit is the host the lab acted on: its egress for a tbf, a squeeze or cross traffic it sends, its ingress for incast and loss, its compute for a straggler. Named: the first tick it was named while the episode was on or up to 15 s after.");
    d.table(
        &[
            "episode",
            "from",
            "to",
            "culprit",
            "named after",
            "others named",
        ],
        v.episodes
            .iter()
            .map(|e| {
                vec![
                    e.kind.clone(),
                    format!("{:.0} s", e.from_s),
                    format!("{:.0} s", e.to_s),
                    format!("rank {} ({}) {}", e.rank, e.host, e.direction),
                    e.named_after_s
                        .map_or("**no**".into(), |x| format!("{x:.0} s")),
                    e.also_named
                        .iter()
                        .map(|(h, d)| format!("{h} {d}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                ]
            })
            .collect(),
    );
    d.p(format!(
        "Calm: a host named in {} of {} ticks outside the episodes.",
        v.calm_ticks_named, v.calm_ticks
    ));
}

/// One recording against another: medians and a Mann-Whitney test per measure.
fn compare_report(
    out: &Path,
    (ra, a): &(Recording, Analysis),
    (rb, b): &(Recording, Analysis),
) -> Result<()> {
    let rows = compare::compare(a, b);
    let mut d = report::Doc::new(format!("probe analyze: {} against {}", ra.name, rb.name));
    d.p("Medians; p is a two-sided Mann-Whitney U test on the per-iteration (or per-tick) samples. A difference is significant at p < 0.01 with medians more than 5% apart.");
    d.table(
        &["", ra.name.as_str(), rb.name.as_str(), "p", "differs"],
        rows.iter()
            .map(|r| {
                vec![
                    r.what.clone(),
                    r.a.clone(),
                    r.b.clone(),
                    r.p.map_or("".into(), |p| format!("{p:.2e}")),
                    if r.significant { "**yes**" } else { "" }.into(),
                ]
            })
            .collect(),
    );
    let dir = out.join("compare");
    write_doc(&dir, &d)?;
    std::fs::write(dir.join("compare.json"), serde_json::to_vec_pretty(&rows)?)?;
    eprintln!(
        "analyze: comparison -> {}",
        dir.join("report.html").display()
    );
    Ok(())
}

pub fn main(args: AnalyzeArgs) -> Result<()> {
    let load = |paths: &[PathBuf]| -> Result<Vec<(Recording, Analysis)>> {
        paths
            .iter()
            .map(|p| {
                let rec = Recording::load(p)?;
                let a = analyze(&rec);
                Ok((rec, a))
            })
            .collect()
    };
    for x in &args.address {
        match x.split_once('=') {
            Some((name, addr)) if addr.parse::<std::net::IpAddr>().is_ok() => {
                if !args
                    .recordings
                    .iter()
                    .any(|p| load::name_of(&load::resolve(p)) == name)
                {
                    bail!("--address {x}: no recording is named `{name}`");
                }
            }
            _ => bail!("--address {x}: expected NAME=ADDRESS, e.g. host-a=10.0.0.1"),
        }
    }
    let group = load(&args.recordings)?;
    let other = load(&args.compare)?;
    let mut names: Vec<&str> = group
        .iter()
        .chain(&other)
        .map(|(r, _)| r.name.as_str())
        .collect();
    names.sort();
    if names.windows(2).any(|w| w[0] == w[1]) {
        bail!(
            "two recordings are both named `{}`: give them different file names",
            names.windows(2).find(|w| w[0] == w[1]).map_or("", |w| w[0])
        );
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    for (rec, a) in group.iter().chain(&other) {
        let check = rec.lab.as_ref().map(|l| labcheck::check(a, l));
        let d = document(rec, a, check.as_ref())?;
        let dir = args.out.join(&rec.name);
        write_doc(&dir, &d)?;
        let mut v = serde_json::to_value(a)?;
        v["lab_check"] = serde_json::to_value(&check)?;
        std::fs::write(dir.join("analysis.json"), serde_json::to_vec_pretty(&v)?)?;
        eprintln!(
            "analyze: {}: {}{} ({:.0}%), period {} s, {} change point(s) -> {}",
            rec.name,
            a.pattern.name,
            a.pattern.role.map(|r| format!(", {r}")).unwrap_or_default(),
            100.0 * a.pattern.confidence,
            num(a.timing.period_s, 4),
            a.changes.len(),
            dir.join("report.html").display()
        );
        if let Some(c) = &check {
            eprintln!(
                "analyze: {}: lab ran {}, traingen median {} s: pattern {}, period {:+.1}%",
                rec.name,
                c.pattern_expected,
                num(c.traingen_median_s, 4),
                if c.pattern_ok { "agrees" } else { "DISAGREES" },
                100.0 * (c.period_s / c.traingen_median_s - 1.0)
            );
        }
    }
    if group.len() > 1 {
        job_report(&args.out, &group, &args.address)?;
    }
    if let (Some(a), Some(b)) = (group.first(), other.first()) {
        compare_report(&args.out, a, b)?;
    }
    Ok(())
}

//! `cargo xtask lab`: a distributed-training traffic lab in network namespaces, with
//! seeded congestion episodes and a ground-truth log of them (docs/lab.md).
//!
//! N ranks, each a network namespace on a Linux bridge (itself in a switch namespace), run
//! the `traingen` generator (xtask/src/bin/traingen.rs). While they train, the lab switches
//! congestion episodes on and off on a seeded schedule and writes what it did, and when, to
//! `ground_truth.jsonl`. At the end it reports the iteration times in calm periods against
//! those during episodes. Every namespace (and with it every veth, bridge, qdisc and nft
//! table) is removed on every exit path: errors, panics, Ctrl-C, SIGTERM. `--corpus`
//! records many such runs for training the spike model (corpus.rs).
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

#[cfg(test)]
mod analyze_test;
pub(crate) mod cmd;
mod corpus;
mod episodes;
mod live;
mod observe;
mod record;

/// The lab's turn, for tests elsewhere in xtask that must not run while a lab records
/// (sock_ops is host-wide).
#[cfg(test)]
pub fn test_lock() -> std::sync::MutexGuard<'static, ()> {
    record::tests::LAB.lock().unwrap_or_else(|e| e.into_inner())
}
mod schedule;
mod summary;
mod timeline;
pub(crate) mod topo;

use episodes::unix_now;
use schedule::{Episode, Kind, Plan};
use timeline::Timeline;
use topo::{rank_addr, Lab, ProcId};

/// Port every traingen rank listens on.
const TRAIN_PORT: u16 = 29500;
/// Port of the iperf3 cross traffic (never the training port).
const CROSS_PORT: u16 = 5201;
/// The probes' configuration with --jobs 2 (in the output directory).
const JOBS_CONFIG: &str = "probe-jobs.toml";
/// How long after the planned end the ranks may take to finish their last iteration.
const FINISH_GRACE: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Data parallel: ring all-reduce.
    Ring,
    /// Model/pipeline parallel: activations forward, gradients back, between neighbours.
    Pipeline,
    /// Parameter server: rank 0 serves, the others push and pull.
    Ps,
}

impl Pattern {
    pub const ALL: [Pattern; 3] = [Pattern::Ring, Pattern::Pipeline, Pattern::Ps];

    fn name(self) -> &'static str {
        match self {
            Pattern::Ring => "ring",
            Pattern::Pipeline => "pipeline",
            Pattern::Ps => "ps",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// Runs ranks of a synthetic training job in network namespaces, with seeded congestion
/// episodes and a ground-truth log (needs root).
#[derive(clap::Args, Clone, Debug)]
pub struct LabArgs {
    /// Number of ranks (one network namespace each).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(2..=64))]
    pub ranks: u16,
    /// Communication pattern of the training job.
    #[arg(long, value_enum, default_value_t = Pattern::Ring)]
    pub pattern: Pattern,
    /// Bytes per iteration (all-reduce buffer, activation, or push/pull): 4194304, 4MiB, 500KB.
    #[arg(long, default_value = "4MiB", value_parser = parse_size)]
    pub size: u64,
    /// Compute gap of every iteration, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub period_ms: u64,
    /// Seconds of training traffic (of each run, with --corpus) [default: 30; 60 with --corpus].
    #[arg(long)]
    pub duration: Option<f64>,
    /// Seed of the episode schedule (same seed, same schedule); with --corpus, the first
    /// seed of the corpus.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Congestion episodes on or off.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub episodes: OnOff,
    /// Episode kinds to draw from (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Kind::ALL)]
    pub kinds: Vec<Kind>,
    /// Base rate of every rank's link in Mbit/s, a tbf on its egress (0: no limit).
    #[arg(long, default_value_t = 1000)]
    pub link_mbit: u32,
    /// Queue limit of every tbf the lab sets, as tbf's `latency` in milliseconds: how long a
    /// packet may wait before the tbf drops (the queue depth of the bottleneck).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub queue_ms: u32,
    /// Calm gaps between episodes (and the calm warm-up) in seconds, MIN-MAX [default: the
    /// episode length L to 1.5 L].
    #[arg(long, value_name = "MIN-MAX", value_parser = parse_range)]
    pub calm: Option<(f64, f64)>,
    /// How many times each gradual kind (ramp, squeeze, incast) is dealt per round of the
    /// episode deck; abrupt kinds once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub gradual_weight: u32,
    /// TCP congestion control of the training and cross-traffic connections, set per socket
    /// (empty: the namespace's default, which a new namespace inherits from the host).
    #[arg(long, default_value = "cubic")]
    pub congestion: String,
    /// Interval of the `ss` RTT samples in milliseconds (0: none).
    #[arg(long, default_value_t = 500)]
    pub sample_ms: u64,
    /// Where logs and the ground truth go (default: target/lab/<UTC timestamp>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Attach the probe to rank 0 and record its telemetry (`probe record`) into
    /// DIR/recording.parquet; every other output goes to DIR too (instead of --out).
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    pub record: Option<PathBuf>,
    /// With --record: one probe per rank, as one per host of a training job: each in its
    /// rank's namespace, scoped to the rank's own cgroup (`probe run --cgroup`, the rank's
    /// traingen runs in it) and labelled with the job (`--training-job lab-seed<SEED>`). Rank
    /// i records into DIR/rank<i>/ (rank 0 into DIR, as with one probe). With --corpus, every
    /// run so, with 4 or 8 ranks.
    #[arg(long)]
    pub probe_per_rank: bool,
    /// With --probe-per-rank: a real Prometheus in the switch namespace scrapes every rank's
    /// probe and evaluates rules/ every second; the job's culprit alerts and scores are
    /// logged (alerts.jsonl, scores.jsonl) and held against the ground truth (live.json).
    #[arg(long, requires = "probe_per_rank")]
    pub prometheus: bool,
    /// With --probe-per-rank: 2 runs a second training job beside the first, as a shared
    /// fleet does: as many ranks, on the first job's second half of hosts and as many more
    /// (4 ranks: the first job on hosts 0-3, the second on hosts 2-5), on its own port.
    /// Every rank runs in a cgroup of its own below its host's (`lab<pid>/r<host>/<job>/
    /// rank<rank>`), and each host's probe, scoped to its host's cgroup, is told no job: it
    /// finds each connection's job from its cgroup (`job_from_cgroup`).
    #[arg(long, default_value_t = 1, requires = "probe_per_rank",
          value_parser = clap::value_parser!(u8).range(1..=2))]
    pub jobs: u8,
    /// The probe binary for --record and --corpus (default: build it, in the profile of
    /// traingen).
    #[arg(long, value_name = "FILE")]
    pub probe: Option<PathBuf>,
    /// Record a corpus for the spike model: DIR/train/<run>/ and DIR/heldout/<run>/, each a
    /// --record directory, over patterns, periods, sizes and seeds, and DIR/corpus.json.
    /// Runs already recorded in DIR are skipped, so an interrupted corpus resumes.
    #[arg(
        long,
        value_name = "DIR",
        conflicts_with_all = ["out", "record", "pattern", "size", "period_ms", "episodes", "ranks", "link_mbit", "queue_ms"]
    )]
    pub corpus: Option<PathBuf>,
    /// With --corpus: the number of training runs; the held-out set has a third as many
    /// (at least one).
    #[arg(long, value_name = "N", default_value_t = 15, requires = "corpus",
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub corpus_runs: u32,
    /// With --corpus: runs already packed under DIR (DIR/<split>/<run>/, as `cargo xtask
    /// model` packs them into the repository) count as recorded, so a corpus resumed on
    /// another machine records only what the repository lacks.
    #[arg(long, value_name = "DIR", requires = "corpus")]
    pub corpus_packed: Option<PathBuf>,
    /// Build traingen in release mode (default: the profile xtask itself was built with).
    #[arg(long)]
    pub release: bool,
    /// Only remove namespaces left behind by a lab that was SIGKILLed, then exit.
    #[arg(long)]
    pub clean: bool,
}

impl LabArgs {
    /// Seconds of traffic of a run.
    pub fn duration_s(&self) -> f64 {
        self.duration
            .unwrap_or(if self.corpus.is_some() { 60.0 } else { 30.0 })
    }

    /// The training jobs of a run and the hosts each runs on (rank r of a job on the r-th of
    /// its hosts).
    pub fn job_plans(&self) -> Vec<JobPlan> {
        let n = usize::from(self.ranks);
        (0..usize::from(self.jobs))
            .map(|j| {
                let first = j * n.div_ceil(2);
                JobPlan {
                    name: match j {
                        0 => format!("lab-seed{}", self.seed),
                        _ => format!("lab-seed{}-job{j}", self.seed),
                    },
                    hosts: (first..first + n).collect(),
                    port: TRAIN_PORT + j as u16,
                    log_prefix: match j {
                        0 => String::new(),
                        _ => format!("job{j}-"),
                    },
                }
            })
            .collect()
    }
}

/// One training job of a lab run.
#[derive(Clone, Debug, Serialize)]
pub struct JobPlan {
    pub name: String,
    /// Its ranks' hosts, rank order.
    pub hosts: Vec<usize>,
    /// The port its ranks listen on.
    pub port: u16,
    /// Its ranks' logs are `<log_prefix>rank<r>.jsonl` (the first job's as with one job).
    #[serde(skip)]
    pub log_prefix: String,
}

impl JobPlan {
    pub fn log(&self, rank: usize) -> String {
        format!("{}rank{rank}.jsonl", self.log_prefix)
    }
}

/// How many hosts (rank namespaces) a run's jobs need.
fn host_count(jobs: &[JobPlan]) -> usize {
    jobs.iter()
        .flat_map(|j| j.hosts.iter())
        .max()
        .map_or(0, |h| h + 1)
}

/// Parses `MIN-MAX` seconds, 0 <= MIN <= MAX.
fn parse_range(s: &str) -> Result<(f64, f64), String> {
    let (lo, hi) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?}: expected MIN-MAX, e.g. 45-150"))?;
    let num = |x: &str| {
        x.trim()
            .parse::<f64>()
            .map_err(|_| format!("bad number {x:?} in {s:?}"))
    };
    let (lo, hi) = (num(lo)?, num(hi)?);
    if !(lo.is_finite() && hi.is_finite() && 0.0 <= lo && lo <= hi) {
        return Err(format!("{s:?}: need 0 <= MIN <= MAX"));
    }
    Ok((lo, hi))
}

/// Parses a byte count: a plain number, or with a suffix K/M/G (powers of 1000) or
/// Ki/Mi/Gi (powers of 1024), optionally followed by B.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let unit = unit.trim();
    let unit = unit
        .strip_suffix('B')
        .or_else(|| unit.strip_suffix('b'))
        .unwrap_or(unit);
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" => 1_000,
        "m" => 1_000_000,
        "g" => 1_000_000_000,
        "ki" => 1 << 10,
        "mi" => 1 << 20,
        "gi" => 1 << 30,
        _ => {
            return Err(format!(
                "bad size unit in {s:?} (use K, M, G, KiB, MiB, GiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("size {s:?} must be positive and fit in 64 bits"))
}

pub fn run(args: LabArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the lab creates network namespaces and needs root: run it as root (sudo -E cargo xtask lab)");
    }
    if args.clean {
        let n = topo::clean_stale()?;
        println!("removed {n} stale lab namespace(s)");
        return Ok(());
    }
    check_args(&args)?;
    check_tools(&args)?;
    cmd::install_signal_handlers()?;
    let stale = topo::stale_namespaces().unwrap_or_default();
    if !stale.is_empty() {
        eprintln!(
            "warning: namespaces left by a killed lab: {} (remove them with `cargo xtask lab --clean`)",
            stale.join(" ")
        );
    }

    let release = args.release || !cfg!(debug_assertions);
    let traingen = build_bin("xtask", "traingen", release)?;
    let probe = match (args.record.is_some() || args.corpus.is_some(), &args.probe) {
        (false, _) => None,
        (true, Some(p)) if p.is_file() => Some(p.canonicalize()?),
        (true, Some(p)) => bail!("--probe {}: no such file", p.display()),
        (true, None) => Some(build_bin("probe-user", "probe", release)?),
    };
    if cmd::interrupted() {
        bail!("interrupted");
    }
    if let (Some(dir), Some(probe)) = (&args.corpus, &probe) {
        return corpus::run(&args, dir, &traingen, probe);
    }
    let out = match (&args.record, &args.out) {
        (Some(p), _) | (None, Some(p)) => p.clone(),
        (None, None) => default_out_dir(),
    };
    run_one(&args, &out, &traingen, probe.as_deref())
}

fn check_args(args: &LabArgs) -> Result<()> {
    let d = args.duration_s();
    if !(d.is_finite() && d > 0.0 && d <= 86_400.0) {
        bail!("--duration must be between 0 and 86400 seconds");
    }
    if args.probe.is_some() && args.record.is_none() && args.corpus.is_none() {
        bail!("--probe is for --record or --corpus");
    }
    if args.probe_per_rank && args.record.is_none() && args.corpus.is_none() {
        bail!("--probe-per-rank is for --record or --corpus");
    }
    if args.jobs > 1 && args.corpus.is_some() {
        bail!("--jobs is for one --record run, not --corpus");
    }

    Ok(())
}

/// Fails early, naming the package, if a tool the run needs is missing.
fn check_tools(args: &LabArgs) -> Result<()> {
    let episodes_on = args.episodes == OnOff::On;
    let mut tools = vec!["ip", "tc", "ss"];
    if episodes_on && args.kinds.contains(&Kind::Loss) {
        tools.push("nft");
    }
    if episodes_on && args.kinds.iter().any(|k| k.needs_iperf3()) {
        tools.push("iperf3");
    }
    if args.record.is_some() || args.corpus.is_some() {
        tools.push("nsenter");
    }
    for t in tools {
        if !on_path(t) {
            bail!("`{t}` is not installed (apt-get install -y iproute2 nftables iperf3)");
        }
    }
    Ok(())
}

/// One lab run into `out` with binaries already built; the namespaces are gone when it
/// returns, whatever happened.
fn run_one(args: &LabArgs, out: &Path, traingen: &Path, probe: Option<&Path>) -> Result<()> {
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let out = out.canonicalize()?;
    let mut lab = Lab::new(host_count(&args.job_plans()));
    let result = drive(args, &mut lab, &out, traingen, probe);
    let problems = lab.teardown();
    for p in &problems {
        eprintln!("lab cleanup: {p}");
    }
    let left: Vec<&String> = problems
        .iter()
        .filter(|p| p.contains("still there"))
        .collect();
    match result {
        Err(e) => Err(e),
        Ok(()) if !left.is_empty() => bail!("cleanup failed: {left:?}"),
        Ok(()) => Ok(()),
    }
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

/// The workspace's target directory (CARGO_TARGET_DIR if set).
fn target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(d);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .join("target")
}

fn default_out_dir() -> PathBuf {
    let base = target_dir().join("lab").join(utc_stamp(unix_now() as i64));
    if base.exists() {
        PathBuf::from(format!("{}-{}", base.display(), std::process::id()))
    } else {
        base
    }
}

/// `YYYYmmdd-HHMMSS` in UTC (civil-from-days, H. Hinnant).
fn utc_stamp(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Builds binary `bin` of `package` with cargo and returns its path.
fn build_bin(package: &str, bin: &str, release: bool) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut c = Command::new(cargo);
    c.args(["build", "--quiet", "-p", package, "--bin", bin])
        .arg("--message-format=json-render-diagnostics")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if release {
        c.arg("--release");
    }
    eprintln!(
        "lab: building {bin} ({})",
        if release { "release" } else { "debug" }
    );
    let mut child = c
        .spawn()
        .with_context(|| format!("running cargo build for {bin}"))?;
    let mut exe = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let v: serde_json::Value = match serde_json::from_str(&line?) {
            Ok(v) => v,
            Err(_) => continue,
        };
        if v["reason"] == "compiler-artifact" && v["target"]["name"] == bin {
            if let Some(p) = v["executable"].as_str() {
                exe = Some(PathBuf::from(p));
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("building {bin} failed ({status})");
    }
    exe.with_context(|| format!("cargo did not report the {bin} executable"))
}

/// Everything the lab writes about the run itself (`lab.json`).
#[derive(Serialize)]
struct Meta<'a> {
    t0: f64,
    pattern: Pattern,
    ranks: usize,
    size_bytes: u64,
    period_ms: u64,
    duration_s: f64,
    seed: u64,
    episodes: bool,
    kinds: &'a [Kind],
    link_mbit: u32,
    tbf_latency_ms: u32,
    congestion: &'a str,
    train_port: u16,
    cross_port: u16,
    switch_ns: String,
    rank_info: Vec<RankInfo>,
    schedule: &'a [Episode],
    traingen: &'a Path,
    /// The probe binary recording rank 0 (--record), and where its recording goes.
    probe: Option<&'a Path>,
    recording: Option<&'static str>,
    /// Every rank's recording with --probe-per-rank (rank 0's alone otherwise).
    recordings: Vec<String>,
    /// The probes' `--training-job` with --probe-per-rank and one job.
    #[serde(skip_serializing_if = "Option::is_none")]
    training_job: Option<&'a str>,
    /// With --jobs 2: each job, its hosts (`rank_info` is then one per host, its first
    /// job's log) and its port; the probes found the jobs themselves.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    jobs: &'a [JobPlan],
}

#[derive(Serialize)]
struct RankInfo {
    rank: usize,
    ns: String,
    addr: String,
    dev: &'static str,
    log: String,
}

/// Appends JSON lines to a file, flushing each.
struct JsonLines(File);

impl JsonLines {
    fn create(path: &Path) -> Result<Self> {
        Ok(Self(
            OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(path)
                .with_context(|| format!("creating {}", path.display()))?,
        ))
    }

    fn write<T: Serialize>(&mut self, v: &T) -> Result<()> {
        let mut line = serde_json::to_vec(v)?;
        line.push(b'\n');
        self.0.write_all(&line)?;
        Ok(())
    }
}

/// RetransSegs summed over every rank's namespace.
fn retrans_total(lab: &Lab, ranks: usize) -> Option<u64> {
    (0..ranks)
        .map(|i| observe::tcp_retrans_segs(&lab.rank_ns(i)).ok())
        .sum()
}

fn drive(
    args: &LabArgs,
    lab: &mut Lab,
    out: &Path,
    traingen: &Path,
    probe: Option<&Path>,
) -> Result<()> {
    let n = args.ranks as usize;
    let jobs = args.job_plans();
    let hosts = host_count(&jobs);
    let started = Instant::now();
    topo::set_queue_ms(args.queue_ms);
    lab.build(args.link_mbit)?;
    if cmd::interrupted() {
        bail!("interrupted");
    }
    let plan = Plan {
        seed: args.seed,
        duration_s: args.duration_s(),
        ranks: hosts,
        kinds: args.kinds.clone(),
        link_mbit: args.link_mbit,
        cross_port: CROSS_PORT,
        calm_s: args.calm,
        gradual_weight: args.gradual_weight as usize,
    };
    let sched = if args.episodes == OnOff::On {
        schedule::build(&plan)
    } else {
        Vec::new()
    };
    eprintln!(
        "lab: {n} ranks ({}){}, {} bytes, {} ms compute, {} s, {} episode(s), base link {} Mbit/s, set up in {:.1} s -> {}",
        args.pattern.name(),
        if jobs.len() > 1 { format!(" x {} jobs on {hosts} hosts", jobs.len()) } else { String::new() },
        args.size,
        args.period_ms,
        args.duration_s(),
        sched.len(),
        args.link_mbit,
        started.elapsed().as_secs_f64(),
        out.display()
    );

    // The probes first: sock_ops tracks connections established after it attached.
    let recorders = start_probes(args, lab, &jobs, out, probe)?;
    let mut live = if args.prometheus {
        Some(live::Live::start(lab, hosts, out)?)
    } else {
        None
    };

    // Start the ranks.
    let t0 = unix_now();
    let t0_i = Instant::now();
    let mut rank_procs: Vec<ProcId> = Vec::with_capacity(n * jobs.len());
    for job in &jobs {
        start_ranks(args, lab, job, &sched, out, traingen, &mut rank_procs)?;
    }
    let meta = Meta {
        t0,
        pattern: args.pattern,
        ranks: n,
        size_bytes: args.size,
        period_ms: args.period_ms,
        duration_s: args.duration_s(),
        seed: args.seed,
        episodes: args.episodes == OnOff::On,
        kinds: &args.kinds,
        link_mbit: args.link_mbit,
        tbf_latency_ms: topo::queue_ms(),
        congestion: &args.congestion,
        train_port: TRAIN_PORT,
        cross_port: CROSS_PORT,
        switch_ns: lab.switch_ns(),
        rank_info: (0..hosts)
            .map(|i| RankInfo {
                rank: i,
                ns: lab.rank_ns(i),
                addr: rank_addr(i).to_string(),
                dev: topo::RANK_DEV,
                log: jobs
                    .iter()
                    .find_map(|j| j.hosts.iter().position(|&h| h == i).map(|r| j.log(r)))
                    .unwrap_or_default(),
            })
            .collect(),
        schedule: &sched,
        traingen,
        probe,
        recording: probe.map(|_| record::RECORDING),
        recordings: recorders
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let dir = record::rank_dir(Path::new(""), i);
                dir.join(record::RECORDING).to_string_lossy().into_owned()
            })
            .collect(),
        training_job: (args.probe_per_rank && jobs.len() == 1).then_some(jobs[0].name.as_str()),
        jobs: if jobs.len() > 1 { &jobs } else { &[] },
    };
    fs::write(out.join("lab.json"), serde_json::to_vec_pretty(&meta)?)?;

    let mut timeline = Timeline::new(&sched, out, &args.congestion, hosts, t0)?;
    let mut rtt_log = JsonLines::create(&out.join("rtt.jsonl"))?;
    let mut rtt: Vec<summary::RttSample> = Vec::new();
    let retrans_t0 = retrans_total(lab, hosts);

    let sample_every = Duration::from_millis(args.sample_ms);
    let mut next_sample = Duration::ZERO;
    let hard_end = Duration::from_secs_f64(args.duration_s()) + FINISH_GRACE;
    let mut failure: Option<anyhow::Error> = None;

    loop {
        if cmd::interrupted() {
            failure = Some(anyhow::anyhow!("interrupted"));
            break;
        }
        let mut running = 0;
        for &p in &rank_procs {
            match lab.poll(p) {
                None => running += 1,
                Some(s) if s.success() => {}
                Some(s) => {
                    failure = Some(anyhow::anyhow!(
                        "{} exited with {s} (see {}/rank*.stderr)",
                        lab.label(p),
                        out.display()
                    ));
                }
            }
        }
        for r in &recorders {
            if let Err(e) = r.check(lab) {
                failure = Some(e);
            }
        }
        if failure.is_some() || running == 0 {
            break;
        }
        let now = t0_i.elapsed();
        if now > hard_end {
            failure = Some(anyhow::anyhow!(
                "{running} rank(s) still running {FINISH_GRACE:?} after the planned end"
            ));
            break;
        }
        let step: Result<()> = (|| {
            timeline.tick(lab, now.as_secs_f64())?;
            if let Some(l) = live.as_mut() {
                l.tick(unix_now())?;
            }
            if !sample_every.is_zero() && now >= next_sample {
                next_sample = now + sample_every;
                sample_rtt(lab, hosts, &mut rtt_log, &mut rtt)?;
            }
            Ok(())
        })();
        if let Err(e) = step {
            failure = Some(e);
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    // Interrupted or failed mid-episode: undo it (best effort) and say so.
    timeline.abort(lab)?;
    let t_last = unix_now();
    // Ranks still running (failure or interrupt) are stopped by the teardown; give the
    // others a moment to flush their last line.
    for &p in &rank_procs {
        lab.wait(p, Duration::from_millis(200));
    }
    // The recorder finishes its file, the probe detaches; both must exit 0.
    let mut recorded = Vec::new();
    for (i, r) in recorders.into_iter().enumerate() {
        match r.stop(lab) {
            Ok(line) => recorded.push((i, line)),
            Err(e) if failure.is_none() => failure = Some(e),
            Err(e) => eprintln!("lab: {e:#}"),
        }
    }

    // The kernel's view of the traffic, before the namespaces go.
    let mut counters = BTreeMap::new();
    for i in 0..hosts {
        match observe::iface_counters(&lab.rank_ns(i), topo::RANK_DEV) {
            Ok(c) => {
                counters.insert(i, c);
            }
            Err(e) => eprintln!("lab: counters of rank {i}: {e:#}"),
        }
    }
    let retrans_end = retrans_total(lab, hosts);
    let Timeline {
        truths, retrans, ..
    } = timeline;
    let ep_retrans: u64 = retrans.values().sum();
    let calm_retrans = match (retrans_t0, retrans_end) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a).saturating_sub(ep_retrans)),
        _ => None,
    };

    // Each job's iterations and summary (the RTT samples are the first job's port's).
    let mut runs = Vec::with_capacity(jobs.len());
    for (j, job) in jobs.iter().enumerate() {
        let mut iters = Vec::new();
        for r in 0..job.hosts.len() {
            iters.extend(summary::read_iters(&out.join(job.log(r)))?);
        }
        let summary = summary::summarize(&summary::Inputs {
            t0,
            t_last,
            ranks: n,
            iters: &iters,
            truth: &truths,
            rtt: if j == 0 { &rtt } else { &[] },
            retrans: &retrans,
            calm_retrans,
        });
        runs.push(live::JobRun {
            name: job.name.clone(),
            hosts: job.hosts.clone(),
            iters,
            summary,
        });
    }
    let s = &runs[0].summary;
    let traffic: Vec<String> = counters
        .iter()
        .map(|(i, c)| {
            format!(
                "r{i} tx {:.1} MB rx {:.1} MB",
                c.tx_bytes as f64 / 1e6,
                c.rx_bytes as f64 / 1e6
            )
        })
        .collect();
    println!(
        "\nlab summary ({} ranks, {}, {} bytes, {} ms compute, seed {}, {:.1} s of traffic)",
        n,
        args.pattern.name(),
        args.size,
        args.period_ms,
        args.seed,
        t_last - t0
    );
    println!("traffic on {}: {}", topo::RANK_DEV, traffic.join(", "));
    print!("{}", summary::render(s));
    for r in &runs[1..] {
        println!("job {} (hosts {:?}):", r.name, r.hosts);
        print!("{}", summary::render(&r.summary));
    }
    for (i, line) in &recorded {
        println!("probe on rank {i}: {}", line.trim_start_matches("record: "));
    }
    if let Some(l) = live {
        let r = live::report(&l.fired, &truths, &runs, &l.seen);
        print!("{}", live::render(&r));
        live::write(out, &r)?;
        if let Err(e) = l.finish() {
            failure.get_or_insert(e);
        }
    }
    println!("output: {}", out.display());
    let others: Vec<_> = runs[1..]
        .iter()
        .map(|r| serde_json::json!({"job": r.name, "hosts": r.hosts, "summary": r.summary}))
        .collect();
    let report = serde_json::json!({
        "summary": s,
        "jobs": others,
        "counters": counters,
        "recording": recorded.iter().any(|(i, _)| *i == 0).then_some(record::RECORDING),
        "failure": failure.as_ref().map(|e| format!("{e:#}")),
    });
    fs::write(
        out.join("summary.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    match failure {
        Some(e) => Err(e),
        None if counters.values().any(|c| c.tx_bytes < args.size) => {
            bail!("a rank sent less than one iteration's worth of bytes: {counters:?}")
        }
        None => Ok(()),
    }
}

/// With --record: a probe and its recorder per host (--probe-per-rank) or on rank 0's host.
/// One job: each scoped to its rank's cgroup and told the job. Several: each scoped to its
/// host's cgroup, with the jobs' ranks in cgroups below it, and told none: it finds them.
fn start_probes(
    args: &LabArgs,
    lab: &mut Lab,
    jobs: &[JobPlan],
    out: &Path,
    probe: Option<&Path>,
) -> Result<Vec<record::Recorder>> {
    let Some(p) = probe else {
        return Ok(Vec::new());
    };
    let mut config = None;
    if args.probe_per_rank {
        lab.make_rank_cgroups()?;
        if jobs.len() > 1 {
            lab.make_job_cgroups(jobs)?;
            let file = out.join(JOBS_CONFIG);
            let template = format!("{}/*/{{job}}/rank{{rank}}", lab.cgroup_prefix());
            fs::write(&file, format!("job_from_cgroup = [{template:?}]\n"))
                .with_context(|| format!("writing {}", file.display()))?;
            config = Some(file);
        }
    }
    let hosts = if args.probe_per_rank {
        host_count(jobs)
    } else {
        1
    };
    let mut recorders = Vec::with_capacity(hosts);
    for i in 0..hosts {
        let cgroup = lab.rank_cgroup(i);
        let scope = record::Scope {
            rank: i,
            cgroup: cgroup.as_deref(),
            training_job: (args.probe_per_rank && jobs.len() == 1).then_some(jobs[0].name.as_str()),
            config: config.as_deref(),
        };
        recorders.push(record::start(lab, p, out, &scope)?);
    }
    Ok(recorders)
}

/// Starts one job's traingen ranks, each on its host, in its cgroup if the lab made them.
fn start_ranks(
    args: &LabArgs,
    lab: &mut Lab,
    job: &JobPlan,
    sched: &[Episode],
    out: &Path,
    traingen: &Path,
    procs: &mut Vec<ProcId>,
) -> Result<()> {
    let n = job.hosts.len();
    let peers = job
        .hosts
        .iter()
        .map(|&h| rank_addr(h).to_string())
        .collect::<Vec<_>>()
        .join(",");
    for (i, &host) in job.hosts.iter().enumerate() {
        let log = out.join(job.log(i));
        let err = out.join(job.log(i).replace(".jsonl", ".stderr"));
        // In its rank's cgroup, if the lab made them: the shell moves itself in, then
        // execs (same pid), so every socket of the rank is created inside it.
        let cgroup = lab
            .job_cgroup(host, &job.name, i)
            .or_else(|| lab.rank_cgroup(host));
        let mut c = match cgroup {
            Some(cg) => probe_tests::cgroup::command_in(&cg, &["ip"]),
            None => Command::new("ip"),
        };
        c.args(["netns", "exec", &lab.rank_ns(host)])
            .arg(traingen)
            .args(["--rank", &i.to_string(), "--world", &n.to_string()])
            .args(["--peers", &peers, "--port", &job.port.to_string()])
            .args([
                "--pattern",
                args.pattern.name(),
                "--size",
                &args.size.to_string(),
            ])
            .args(["--period-ms", &args.period_ms.to_string()])
            .args(straggle_args(sched, host))
            .args(["--duration", &args.duration_s().to_string()])
            .arg("--log")
            .arg(&log)
            .args(congestion_args(&args.congestion))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&err).with_context(|| format!("creating {}", err.display()))?);
        let label = match job.log_prefix.as_str() {
            "" => format!("traingen rank {i}"),
            _ => format!("traingen {} rank {i}", job.name),
        };
        procs.push(lab.spawn(&label, c)?);
    }
    Ok(())
}

/// `--straggle FROM:TO:FACTOR` for rank `rank`'s traingen, one per straggle episode of the
/// schedule on it (offsets from the start of the traffic, which is when traingen starts).
fn straggle_args(sched: &[Episode], rank: usize) -> Vec<String> {
    sched
        .iter()
        .filter(|e| e.rank == rank)
        .filter_map(|e| match e.params {
            schedule::Params::Straggle { factor } => {
                Some(format!("--straggle={}:{}:{factor}", e.start_s, e.end_s))
            }
            _ => None,
        })
        .collect()
}

/// `--congestion NAME` for traingen, nothing when empty.
fn congestion_args(cc: &str) -> Vec<String> {
    if cc.is_empty() {
        Vec::new()
    } else {
        vec!["--congestion".into(), cc.into()]
    }
}

/// One `ss` sample of every rank's training connections, to `rtt.jsonl` and `rtt`.
fn sample_rtt(
    lab: &Lab,
    n: usize,
    log: &mut JsonLines,
    rtt: &mut Vec<summary::RttSample>,
) -> Result<()> {
    let t = unix_now();
    for i in 0..n {
        for c in observe::ss_port(&lab.rank_ns(i), TRAIN_PORT)? {
            // A connection that has delivered real data, not just the hello.
            let sender = c.bytes_acked > 64 * 1024;
            log.write(&serde_json::json!({
                "t": t, "rank": i, "local": c.local, "peer": c.peer, "srtt_ms": c.srtt_ms,
                "rttvar_ms": c.rttvar_ms, "cwnd": c.cwnd, "retrans": c.retrans,
                "bytes_acked": c.bytes_acked, "bytes_received": c.bytes_received,
                "sender": sender,
            }))?;
            if let Some(srtt_ms) = c.srtt_ms {
                rtt.push(summary::RttSample {
                    t,
                    rank: i,
                    srtt_ms,
                    sender,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4194304"), Ok(4 << 20));
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("4Mi"), Ok(4 << 20));
        assert_eq!(parse_size("500KB"), Ok(500_000));
        assert_eq!(parse_size("1G"), Ok(1_000_000_000));
        assert_eq!(parse_size("2 KiB"), Ok(2048));
        assert!(parse_size("0").is_err());
        assert!(parse_size("4XB").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999GiB").is_err());
    }

    /// A straggle episode becomes a `--straggle` window of its rank's traingen, and only
    /// of its rank's.
    #[test]
    fn straggle_episodes_become_traingen_windows() {
        let ep = |rank, params| Episode {
            seq: 0,
            kind: Kind::Straggle,
            rank,
            start_s: 10.5,
            end_s: 20.25,
            params,
            steps: Vec::new(),
        };
        let sched = [
            ep(1, schedule::Params::Straggle { factor: 3 }),
            ep(2, schedule::Params::Loss { percent: 5 }),
        ];
        assert_eq!(straggle_args(&sched, 1), ["--straggle=10.5:20.25:3"]);
        assert!(straggle_args(&sched, 0).is_empty());
        assert!(straggle_args(&sched, 2).is_empty());
    }

    #[test]
    fn stamps() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        assert_eq!(utc_stamp(951_782_400), "20000229-000000");
        assert_eq!(utc_stamp(1_700_000_000), "20231114-221320");
    }

    #[test]
    fn args_parse() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            lab: LabArgs,
        }
        let t = T::try_parse_from(["t"]).unwrap().lab;
        assert_eq!(t.ranks, 4);
        assert_eq!(t.size, 4 << 20);
        assert_eq!(t.kinds, Kind::ALL.to_vec());
        let t = T::try_parse_from([
            "t",
            "--ranks",
            "8",
            "--kinds",
            "loss,tbf",
            "--episodes",
            "off",
        ])
        .unwrap()
        .lab;
        assert_eq!(t.ranks, 8);
        assert_eq!(t.kinds, vec![Kind::Loss, Kind::Tbf]);
        assert_eq!(t.episodes, OnOff::Off);
        assert!(T::try_parse_from(["t", "--ranks", "1"]).is_err());
        assert_eq!(t.duration_s(), 30.0);
        let t = T::try_parse_from(["t", "--kinds", "squeeze,ramp,incast"])
            .unwrap()
            .lab;
        assert_eq!(t.kinds, vec![Kind::Squeeze, Kind::Ramp, Kind::Incast]);
    }

    #[test]
    fn corpus_args() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            lab: LabArgs,
        }
        let t = T::try_parse_from(["t", "--corpus", "c"]).unwrap().lab;
        assert_eq!(t.corpus_runs, 15);
        assert_eq!(t.duration_s(), 60.0);
        let t = T::try_parse_from([
            "t",
            "--corpus",
            "c",
            "--corpus-runs",
            "2",
            "--duration",
            "25",
        ])
        .unwrap()
        .lab;
        assert_eq!((t.corpus_runs, t.duration_s()), (2, 25.0));
        // The corpus chooses patterns, periods and sizes itself, and where runs go.
        for clash in [
            ["--pattern", "ps"],
            ["--record", "x"],
            ["--period-ms", "5"],
            ["--out", "x"],
        ] {
            let argv = ["t", "--corpus", "c", clash[0], clash[1]];
            assert!(T::try_parse_from(argv).is_err(), "{clash:?}");
        }
        assert!(T::try_parse_from(["t", "--corpus-runs", "3"]).is_err());
        assert!(T::try_parse_from(["t", "--corpus", "c", "--corpus-runs", "0"]).is_err());
    }
}

/// A short real run: needs root, iproute2, nftables and iperf3, and about 15 s, hence
/// ignored by default: `cargo test -p xtask -- --ignored lab_short_run`.
#[cfg(test)]
mod run_tests {
    use super::*;

    #[test]
    #[ignore = "needs root and network namespaces; about 15 s"]
    fn lab_short_run() {
        let _turn = record::tests::LAB.lock().unwrap_or_else(|e| e.into_inner());
        let out = std::env::temp_dir().join(format!("lab-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&out);
        let args = LabArgs {
            ranks: 3,
            pattern: Pattern::Ring,
            size: 2 << 20,
            period_ms: 100,
            duration: Some(12.0),
            seed: 5,
            episodes: OnOff::On,
            kinds: vec![Kind::Loss, Kind::Tbf],
            link_mbit: 1000,
            queue_ms: topo::TBF_LATENCY_MS,
            calm: None,
            gradual_weight: 1,
            congestion: "cubic".into(),
            sample_ms: 250,
            out: Some(out.clone()),
            record: None,
            probe: None,
            probe_per_rank: false,
            prometheus: false,
            jobs: 1,
            corpus: None,
            corpus_packed: None,
            corpus_runs: 15,
            release: false,
            clean: false,
        };
        run(args).expect("the lab runs");

        // No namespace of ours is left.
        let prefix = format!("lab{}-", std::process::id());
        let left = topo::list_namespaces().unwrap();
        assert!(!left.iter().any(|n| n.starts_with(&prefix)), "{left:?}");

        // Every rank iterated and exchanged traffic.
        let report: serde_json::Value =
            serde_json::from_slice(&fs::read(out.join("summary.json")).unwrap()).unwrap();
        for r in 0..3 {
            let iters = summary::read_iters(&out.join(format!("rank{r}.jsonl"))).unwrap();
            assert!(iters.len() >= 10, "rank {r}: {} iterations", iters.len());
            let tx = report["counters"][r.to_string()]["tx_bytes"]
                .as_u64()
                .unwrap();
            assert!(tx >= 10 * (2 << 20) * 2 / 3, "rank {r} sent {tx} bytes");
        }

        // The ground truth lists the episodes, inside the run, and they hurt.
        let truth: Vec<serde_json::Value> = fs::read_to_string(out.join("ground_truth.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(!truth.is_empty());
        let t0 = report["summary"]["t0"].as_f64().unwrap();
        for t in &truth {
            let (a, b) = (t["t_start"].as_f64().unwrap(), t["t_end"].as_f64().unwrap());
            assert!(t0 < a && a < b && b < t0 + 12.5, "{t}");
            assert_eq!(t["aborted"], false);
        }
        let hurt = report["summary"]["episodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| {
                e["retrans_segs"].as_u64().unwrap_or(0) > 0
                    || e["slowdown"].as_f64().unwrap_or(0.0) > 1.15
            });
        assert!(
            hurt,
            "no episode raised retransmits or iteration times: {report}"
        );
        let _ = fs::remove_dir_all(&out);
    }
}

//! `cargo xtask soak --minutes N [--seed S] [--out DIR]`: the churn soak (issue 13).
//!
//! probe runs in a lab namespace (`lab<pid>-r0`, joined by a veth to `lab<pid>-sw`) with
//! small maps, a small top-K and a 1 s tick, while, at seeded random times: veth interfaces
//! appear and vanish, short TCP connections go to thousands of distinct peers (an AnyIP
//! range in the switch namespace), RDMA fixture devices come and go and their counter files
//! turn unreadable, scrapers hang up mid-response or say nothing, and the daemon gets
//! SIGHUP, SIGTERM-and-restart and SIGKILL-and-restart (alternating TCX and netlink attach
//! modes). Every second it samples the daemon (RSS, fds, CPU, tick, map fill, series) into
//! `timeline.jsonl`; at the end it writes `summary.md` and fails, one line per finding, on
//! growth that does not level off, a missed tick, leftovers in the kernel after a stop, or a
//! counter that went backwards on /metrics.
//!
//! Restarts happen in the first 45 % of the run only; the rest is one daemon lifetime, long
//! enough that growth can be judged on it (a restart resets RSS and fds, so a leak would
//! hide behind frequent restarts).
use crate::build;
use crate::lab::cmd;
use crate::lab::topo::{self, Lab, ProcId};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod churn_threads;
mod leftovers;
mod monotonic;
mod rdma_fixture;
mod report;
mod rng;

use churn_threads::Threads;
use monotonic::Monotonic;
use rdma_fixture::RdmaFixture;
use rng::Rng;

#[derive(clap::Args)]
pub struct SoakArgs {
    /// How long to run, in minutes (fractions allowed, e.g. 0.5).
    #[arg(long, default_value_t = 3.0)]
    pub minutes: f64,
    /// Seed of every random choice (same seed, same schedule of actions).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where the timeline, the daemon's log and the summary go (default target/soak/<time>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The probe binary (default: target/debug/probe, built first).
    #[arg(long)]
    pub probe: Option<PathBuf>,
}

/// The daemon's tick.
const TICK: Duration = Duration::from_secs(1);
/// Small maps, so that they fill.
const MAP_FLOWS: u32 = 256;
const MAP_CONNS: u32 = 128;
const MAP_PEERS: u32 = 64;
const TOP_PEERS: usize = 8;
/// Feature entities with state, fewer than the peers at a time: full seconds into a
/// lifetime. At the default (4,096) the engine's 2-minute memory of churned names fills
/// through the judged part of a 3-minute run (docs/contributing.md, "Soak").
const MAX_ENTITIES: usize = 128;
/// Where the daemon listens, inside its namespace.
const LISTEN_PORT: u16 = 9464;
/// Churn interfaces alive at once, at most.
const MAX_IFACES: usize = 16;
/// RDMA devices present at once, at most.
const MAX_RDMA: usize = 4;
/// Restarts only in this first part of the run.
const RESTART_PHASE: f64 = 0.45;
/// How long a stopped daemon may take to exit after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long the daemon may hold the TCX link of an interface that was deleted.
const DEFUNCT_LIMIT_S: f64 = 10.0;
/// Mean seconds between actions of each kind.
const MEAN_IFACE_S: f64 = 0.8;
const MEAN_RDMA_S: f64 = 5.0;
const MEAN_BREAK_S: f64 = 3.0;
const MEAN_SIGHUP_S: f64 = 15.0;
const MEAN_STOP_S: f64 = 20.0;

#[derive(Clone, Copy, PartialEq, Eq, Serialize, Debug)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Tcx,
    Netlink,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Tcx => "tcx",
            Mode::Netlink => "netlink",
        }
    }
    fn other(self) -> Mode {
        match self {
            Mode::Tcx => Mode::Netlink,
            Mode::Netlink => Mode::Tcx,
        }
    }
}

/// One running daemon.
struct Daemon {
    id: ProcId,
    pid: u32,
    mode: Mode,
    life: usize,
    /// BPF program and map ids it has held.
    progs: BTreeSet<u32>,
    maps: BTreeSet<u32>,
    /// (cpu ticks, when) at the previous sample, for the CPU share.
    last_cpu: Option<(u64, Instant)>,
}

/// One row of timeline.jsonl: the daemon once a second.
#[derive(Serialize, Clone, Default)]
pub struct Row {
    t: f64,
    life: usize,
    mode: &'static str,
    pid: u32,
    rss_kib: u64,
    fds: u64,
    /// CPU since the previous sample, % of one core.
    cpu_pct: f64,
    /// The daemon's own last tick: sum of `probe_tick_duration_seconds` over stages.
    tick_s: Option<f64>,
    /// Time since the daemon's last tick when the snapshot was asked for.
    since_tick_s: Option<f64>,
    snapshot_tick: Option<u64>,
    series: Option<usize>,
    flows_tracked: Option<f64>,
    flow_evictions: Option<f64>,
    map_full: Option<f64>,
    peers_folded: Option<f64>,
    feature_entities: Option<f64>,
    /// Observations refused for want of a feature table slot (cumulative in a lifetime).
    feature_untracked: Option<f64>,
    tcx_links: usize,
    /// TCX links whose interface is gone (ifindex 0), still held.
    defunct_links: usize,
    ifaces_live: usize,
    rdma_live: usize,
}

/// What happened, counted.
#[derive(Default, Serialize)]
pub struct Tally {
    ifaces_created: u64,
    ifaces_deleted: u64,
    rdma_added: u64,
    rdma_removed: u64,
    rdma_broken: u64,
    rdma_repaired: u64,
    sighup: u64,
    sigterm: u64,
    sigkill: u64,
    crashes: u64,
    stops_checked: u64,
    scrapes: u64,
    scrape_errors: u64,
    conns_ok: u64,
    conns_failed: u64,
    scrapes_cut: u64,
    scrapes_silent: u64,
    scrapes_half_request: u64,
    scrapes_refused: u64,
}

/// Findings, grouped by kind: the first occurrence in full and how many there were.
#[derive(Default)]
pub struct Failures {
    kinds: Vec<(String, String, u64)>,
}

impl Failures {
    fn add(&mut self, kind: &str, line: String) {
        eprintln!("soak: FAIL {kind}: {line}");
        if let Some(k) = self.kinds.iter_mut().find(|k| k.0 == kind) {
            k.2 += 1;
        } else {
            self.kinds.push((kind.to_string(), line, 1));
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.kinds
            .iter()
            .map(|(kind, first, n)| match n {
                1 => format!("{kind}: {first}"),
                n => format!("{kind}: {first} (and {} more)", n - 1),
            })
            .collect()
    }
}

pub fn run(args: SoakArgs) -> Result<()> {
    if !build::is_root() {
        bail!("the soak creates network namespaces and loads BPF: run it as root");
    }
    if !(args.minutes.is_finite() && args.minutes >= 0.1 && args.minutes <= 1440.0) {
        bail!("--minutes must be between 0.1 and 1440");
    }
    for tool in ["ip", "tc", "nsenter", "bpftool"] {
        if cmd::output(&[tool, "help"]).is_err() && cmd::output(&[tool, "--help"]).is_err() {
            bail!("`{tool}` is not installed (cargo xtask setup)");
        }
    }
    let probe = match &args.probe {
        Some(p) => p
            .canonicalize()
            .with_context(|| format!("--probe {}", p.display()))?,
        None => {
            let mut c = build::cargo();
            c.args(["build", "-p", "probe-user"]);
            build::run(&mut c)?;
            build::target_dir().join("debug").join("probe")
        }
    };
    cmd::install_signal_handlers()?;
    // Namespaces of a lab or soak that was SIGKILLed (only those whose process is gone).
    topo::clean_stale()?;
    let soak_dir = build::target_dir().join("soak");
    std::fs::create_dir_all(&soak_dir)?;
    let _lock = lock(&soak_dir.join(".lock"))?;
    let out = match &args.out {
        Some(o) => o.clone(),
        None => soak_dir.join(unix_now().floor().to_string()),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = out.canonicalize()?;
    println!(
        "soak: {} min, seed {}, probe {}, out {}",
        args.minutes,
        args.seed,
        probe.display(),
        out.display()
    );
    let mut lab = Lab::new(1);
    let result = soak(&args, &probe, &out, &mut lab);
    for p in lab.teardown() {
        eprintln!("soak cleanup: {p}");
    }
    let failures = result?;
    if !failures.is_empty() {
        for f in &failures {
            println!("FAIL {f}");
        }
        bail!("soak: {} kind(s) of failure (see above)", failures.len());
    }
    println!("soak: passed");
    Ok(())
}

/// An exclusive lock, waited for: two soaks at once would share the host-wide hooks
/// (sock_ops, tracepoints) and each would judge the other's load. (The lab's test_lock is
/// in-process, for xtask's own tests; this one spans processes.)
fn lock(path: &Path) -> Result<File> {
    use std::os::fd::AsRawFd;
    let f = File::create(path)?;
    // SAFETY: flock on an open fd.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        println!(
            "soak: waiting for another soak to finish (lock {})",
            path.display()
        );
        // SAFETY: as above; blocks until the other soak's process exits or unlocks.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error()).context("locking the soak");
        }
    }
    Ok(f)
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Exponentially distributed wait with `mean` seconds.
fn wait_s(rng: &mut Rng, mean: f64) -> Duration {
    Duration::from_secs_f64((-(1.0 - rng.unit()).ln() * mean).clamp(0.05, mean * 8.0))
}

struct Soak<'a> {
    lab: &'a mut Lab,
    probe: PathBuf,
    out: PathBuf,
    config: PathBuf,
    rank_ns: String,
    switch_ns: String,
    t0: Instant,
    rng: Rng,
    daemon: Option<Daemon>,
    lives: usize,
    /// Ids of a SIGKILLed netlink-mode daemon, whose filters legitimately outlive it: the
    /// next daemon must clear them, so they are checked at the next clean stop.
    pending_progs: BTreeSet<u32>,
    pending_maps: BTreeSet<u32>,
    bpffs_before: BTreeSet<String>,
    ifaces: Vec<String>,
    next_iface: u32,
    fixture: RdmaFixture,
    tally: Tally,
    monotonic: Monotonic,
    failures: Failures,
    rows: Vec<Row>,
    timeline: File,
    events: File,
    log: PathBuf,
    consecutive_scrape_errors: u32,
    /// TCX links of deleted interfaces the daemon holds: link id -> when first seen.
    defunct_since: std::collections::HashMap<u32, f64>,
}

fn soak(args: &SoakArgs, probe: &Path, out: &Path, lab: &mut Lab) -> Result<Vec<String>> {
    let duration = Duration::from_secs_f64(args.minutes * 60.0);
    lab.build(0).context("building the soak's namespaces")?;
    let (rank_ns, switch_ns) = (lab.rank_ns(0), lab.switch_ns());
    // The switch namespace answers for every address of 10.240.0.0/16 (AnyIP), so the
    // client reaches thousands of distinct peers without thousands of interfaces.
    cmd::run(&[
        "ip",
        "-n",
        &switch_ns,
        "addr",
        "add",
        "10.232.0.254/24",
        "dev",
        "br0",
    ])?;
    cmd::run(&[
        "ip",
        "-n",
        &switch_ns,
        "route",
        "add",
        "local",
        "10.240.0.0/16",
        "dev",
        "lo",
    ])?;
    cmd::run(&[
        "ip",
        "-n",
        &rank_ns,
        "route",
        "add",
        "10.240.0.0/16",
        "via",
        "10.232.0.254",
    ])?;
    let fixture = RdmaFixture::create(&out.join("sysfs"))?;
    let config = out.join("probe.toml");
    std::fs::write(&config, config_text(&fixture.class_dir()))?;
    let log = out.join("probe.log");
    let _ = std::fs::remove_file(&log);
    let mut s = Soak {
        lab,
        probe: probe.to_path_buf(),
        out: out.to_path_buf(),
        config,
        rank_ns: rank_ns.clone(),
        switch_ns: switch_ns.clone(),
        t0: Instant::now(),
        rng: Rng::new(args.seed, 0),
        daemon: None,
        lives: 0,
        pending_progs: BTreeSet::new(),
        pending_maps: BTreeSet::new(),
        bpffs_before: leftovers::bpffs_entries(),
        ifaces: Vec::new(),
        next_iface: 0,
        fixture,
        tally: Tally::default(),
        monotonic: Monotonic::default(),
        failures: Failures::default(),
        rows: Vec::new(),
        timeline: File::create(out.join("timeline.jsonl"))?,
        events: File::create(out.join("events.jsonl"))?,
        log,
        consecutive_scrape_errors: 0,
        defunct_since: Default::default(),
    };
    s.start_daemon(Mode::Tcx)?;
    let daemon_addr = SocketAddr::from(([127, 0, 0, 1], LISTEN_PORT));
    let threads = Threads::start(
        &ns_path(&switch_ns),
        &ns_path(&rank_ns),
        daemon_addr,
        args.seed,
    );
    let result = s.main_loop(duration, &threads);
    // The last stop is checked like every other.
    let stopped = s.stop(libc::SIGTERM);
    s.collect_thread_counts(&threads);
    drop(threads);
    s.collect_thread_counts_final();
    // Interrupted (Ctrl-C, SIGTERM): the figures so far are still worth a summary.
    let interrupted = result.is_err() && cmd::interrupted();
    if !interrupted {
        result?;
    }
    stopped?;
    let mut failures = s.failures;
    // A panic in any thread is a failure even if the daemon kept serving.
    let log = std::fs::read_to_string(&s.log).unwrap_or_default();
    if let Some(line) = log.lines().find(|l| l.contains("panicked at")) {
        let n = log.matches("panicked at").count();
        failures.add("panic", format!("{n} in probe.log, first: {}", line.trim()));
    }
    for line in report::growth_failures(&s.rows) {
        failures.add("growth", line);
    }
    let mut summary = format!(
        "{}\n{}",
        report::summary(args, &s.rows, &s.tally, &s.monotonic, &failures, s.lives),
        report::verdict_section(&failures.lines(), &s.monotonic)
    );
    if interrupted {
        let t = s.t0.elapsed().as_secs_f64();
        summary = format!("Interrupted after {t:.0} s: the figures cover that part.\n\n{summary}");
    }
    std::fs::write(s.out.join("summary.md"), &summary)?;
    println!("\n{summary}");
    if interrupted {
        bail!("interrupted (summary in {})", s.out.display());
    }
    Ok(failures.lines())
}

fn ns_path(ns: &str) -> String {
    format!("/var/run/netns/{ns}")
}

/// Small maps, top-K and feature table, so that they fill. The feature windows stay the
/// defaults: the built-in model needs them (and their rings are allocated whole per entity).
fn config_text(sysfs_root: &Path) -> String {
    format!(
        "# Written by cargo xtask soak.\n\
         listen = \"127.0.0.1:{LISTEN_PORT}\"\n\
         tick = \"{}s\"\n\
         top_peers = {TOP_PEERS}\n\
         [interfaces]\n\
         include = [\"eth0\", \"ch*\"]\n\
         [maps]\n\
         flows = {MAP_FLOWS}\n\
         conns = {MAP_CONNS}\n\
         peers = {MAP_PEERS}\n\
         [features]\n\
         max_entities = {MAX_ENTITIES}\n\
         [rdma]\n\
         enabled = true\n\
         sysfs_root = \"{}\"\n\
         interval = \"1s\"\n",
        TICK.as_secs(),
        sysfs_root.display()
    )
}

impl Soak<'_> {
    fn t(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn event(&mut self, what: &str, detail: &str) {
        let line = serde_json::json!({"t": (self.t() * 1000.0).round() / 1000.0, "what": what, "detail": detail});
        let _ = writeln!(self.events, "{line}");
    }

    fn main_loop(&mut self, duration: Duration, threads: &Threads) -> Result<()> {
        let t0 = self.t0;
        let restart_until = t0 + duration.mul_f64(RESTART_PHASE);
        let end = t0 + duration;
        let mut next_sample = Instant::now();
        let mut next_rdma_tick = Instant::now();
        let mut next_iface = Instant::now();
        let mut next_rdma = Instant::now();
        let mut next_break = Instant::now() + wait_s(&mut self.rng, MEAN_BREAK_S);
        let mut next_hup = Instant::now() + wait_s(&mut self.rng, MEAN_SIGHUP_S);
        // No stop in the first seconds: the first lifetime warms up too.
        let mut next_stop =
            t0 + Duration::from_secs(8) + wait_s(&mut self.rng, MEAN_STOP_S).min(TICK * 30);
        let mut stops = 0u64;
        loop {
            if cmd::interrupted() {
                bail!("interrupted");
            }
            let now = Instant::now();
            if now >= end {
                return Ok(());
            }
            self.check_alive()?;
            if now >= next_sample {
                next_sample += TICK;
                self.sample(threads);
            }
            if now >= next_rdma_tick {
                next_rdma_tick += TICK;
                self.fixture.advance(&mut self.rng)?;
            }
            if now >= next_iface {
                next_iface = now + wait_s(&mut self.rng, MEAN_IFACE_S);
                self.churn_iface()?;
            }
            if now >= next_rdma {
                next_rdma = now + wait_s(&mut self.rng, MEAN_RDMA_S);
                let add = self.fixture.live() == 0
                    || (self.fixture.live() < MAX_RDMA && self.rng.chance(0.5));
                if add {
                    let name = self.fixture.add()?;
                    self.event("rdma-add", &name);
                } else if let Some(name) = self.fixture.remove(&mut self.rng)? {
                    self.event("rdma-remove", &name);
                }
            }
            if now >= next_break {
                next_break = now + wait_s(&mut self.rng, MEAN_BREAK_S);
                if let Some(what) = self.fixture.break_or_repair(&mut self.rng)? {
                    self.event("rdma-file", &what);
                }
            }
            if now >= next_hup {
                next_hup = now + wait_s(&mut self.rng, MEAN_SIGHUP_S);
                if let Some(d) = &self.daemon {
                    cmd::signal(d.pid, libc::SIGHUP);
                    self.tally.sighup += 1;
                    self.event("sighup", &d.pid.to_string());
                }
            }
            if now >= next_stop && now < restart_until {
                next_stop = now + wait_s(&mut self.rng, MEAN_STOP_S).min(TICK * 40);
                // Alternate, so that a short run has both kinds.
                let sig = if stops.is_multiple_of(2) {
                    libc::SIGTERM
                } else {
                    libc::SIGKILL
                };
                stops += 1;
                let mode = self.daemon.as_ref().map_or(Mode::Tcx, |d| d.mode);
                self.stop(sig)?;
                // After a clean stop the other mode; after SIGKILL the same one, whose
                // leftovers the new daemon must take over and clear.
                self.start_daemon(if sig == libc::SIGTERM {
                    mode.other()
                } else {
                    mode
                })?;
            }
            let next = [
                next_sample,
                next_rdma_tick,
                next_iface,
                next_rdma,
                next_break,
                next_hup,
                next_stop.max(now),
                end,
            ]
            .into_iter()
            .min()
            .unwrap_or(end);
            std::thread::sleep(
                next.saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(100)),
            );
        }
    }

    fn start_daemon(&mut self, mode: Mode) -> Result<()> {
        let log = File::options().create(true).append(true).open(&self.log)?;
        let mut c = cmd::command(&["nsenter", &format!("--net={}", ns_path(&self.rank_ns))]);
        c.arg(&self.probe)
            .args(["run", "--config"])
            .arg(&self.config)
            .args(["--tc-attach", mode.as_str()])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let life = self.lives;
        self.lives += 1;
        let id = self.lab.spawn(&format!("probe (lifetime {life})"), c)?;
        // nsenter execs probe (no --fork): the child's pid is the daemon's.
        let pid = self.lab.pid(id);
        self.event(
            "start",
            &format!("lifetime {life}, pid {pid}, {}", mode.as_str()),
        );
        self.daemon = Some(Daemon {
            id,
            pid,
            mode,
            life,
            progs: BTreeSet::new(),
            maps: BTreeSet::new(),
            last_cpu: None,
        });
        self.monotonic.restart();
        self.defunct_since.clear();
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.lab.poll(id) {
                bail!(
                    "probe exited with {st} before it was healthy; log tail:\n{}",
                    self.log_tail(20)
                );
            }
            if let Ok(r) = self.get("/healthz") {
                if r.status == 200 {
                    break;
                }
            }
            if Instant::now() >= until {
                bail!(
                    "probe was not healthy within 30 s; log tail:\n{}",
                    self.log_tail(20)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.refresh_ids();
        Ok(())
    }

    fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    fn refresh_ids(&mut self) {
        if let Some(d) = &mut self.daemon {
            let (p, m) = leftovers::held_ids(d.pid);
            d.progs.extend(p);
            d.maps.extend(m);
        }
    }

    /// GET `path` from the daemon, from inside its namespace.
    fn get(&self, path: &str) -> Result<probe_tests::http::Response> {
        let addr = SocketAddr::from(([127, 0, 0, 1], LISTEN_PORT));
        probe_tests::netns::enter_path(&ns_path(&self.rank_ns), || {
            probe_tests::http::get(addr, path, Duration::from_secs(5))
        })?
    }

    /// A daemon that exited without being told to is a failure; a new one takes its place.
    fn check_alive(&mut self) -> Result<()> {
        let Some(d) = &self.daemon else {
            return Ok(());
        };
        let (id, mode, life) = (d.id, d.mode, d.life);
        if let Some(st) = self.lab.poll(id) {
            let t = self.t();
            let tail = self.log_tail(5);
            self.failures.add(
                "crash",
                format!(
                    "daemon (lifetime {life}) exited by itself with {st} at t={t:.0}s; log: {tail}"
                ),
            );
            self.tally.crashes += 1;
            self.event("crash", &st.to_string());
            self.daemon = None;
            self.start_daemon(mode)?;
        }
        Ok(())
    }

    /// Stops the daemon with `sig` and checks what it left in the kernel.
    fn stop(&mut self, sig: libc::c_int) -> Result<()> {
        self.refresh_ids();
        let Some(d) = self.daemon.take() else {
            return Ok(());
        };
        let (mut progs, mut maps) = (d.progs.clone(), d.maps.clone());
        let t = self.t();
        let what = if sig == libc::SIGTERM {
            self.tally.sigterm += 1;
            let st = self.lab.stop(d.id, STOP_GRACE);
            match st {
                Some(st) if st.success() => {}
                Some(st) => self.failures.add(
                    "unclean exit",
                    format!(
                        "daemon (lifetime {}) exited with {st} after SIGTERM at t={t:.0}s; log: {}",
                        d.life,
                        self.log_tail(3)
                    ),
                ),
                None => self.failures.add(
                    "unclean exit",
                    format!(
                        "daemon (lifetime {}) did not exit within {STOP_GRACE:?} of SIGTERM",
                        d.life
                    ),
                ),
            }
            "sigterm"
        } else {
            self.tally.sigkill += 1;
            cmd::signal(d.pid, libc::SIGKILL);
            self.lab.wait(d.id, Duration::from_secs(5));
            "sigkill"
        };
        self.event(what, &format!("lifetime {}, {}", d.life, d.mode.as_str()));
        if sig == libc::SIGKILL && d.mode == Mode::Netlink {
            // clsact filters are not tied to the process: they outlive a SIGKILL, and the
            // next daemon must clear them. Verified at the next clean stop.
            let left = leftovers::tc_leftovers(&self.rank_ns)?;
            self.event("left-after-sigkill", &format!("{} tc objects", left.len()));
            self.pending_progs.extend(progs);
            self.pending_maps.extend(maps);
            return Ok(());
        }
        if sig == libc::SIGTERM {
            progs.append(&mut std::mem::take(&mut self.pending_progs));
            maps.append(&mut std::mem::take(&mut self.pending_maps));
        }
        self.tally.stops_checked += 1;
        let mut found = leftovers::tc_leftovers(&self.rank_ns)?;
        found.extend(leftovers::live_bpf(&progs, &maps)?);
        let pins: Vec<String> = leftovers::bpffs_entries()
            .difference(&self.bpffs_before)
            .cloned()
            .collect();
        if !pins.is_empty() {
            found.push(format!("new entries under /sys/fs/bpf: {pins:?}"));
        }
        for f in found {
            self.failures.add(
                "leftover",
                format!(
                    "after {what} of lifetime {} ({}) at t={t:.0}s: {f}",
                    d.life,
                    d.mode.as_str()
                ),
            );
        }
        Ok(())
    }

    /// Creates or deletes a veth: its daemon-side end (`ch<N>`) is in the daemon's
    /// namespace, its peer in the switch namespace.
    fn churn_iface(&mut self) -> Result<()> {
        let create =
            self.ifaces.len() < 4 || (self.ifaces.len() < MAX_IFACES && self.rng.chance(0.5));
        if create {
            let name = format!("ch{}", self.next_iface);
            self.next_iface += 1;
            let peer = format!("{name}p");
            cmd::run(&[
                "ip",
                "-n",
                &self.switch_ns,
                "link",
                "add",
                &peer,
                "type",
                "veth",
                "peer",
                "name",
                &name,
                "netns",
                &self.rank_ns,
            ])?;
            cmd::run(&["ip", "-n", &self.switch_ns, "link", "set", &peer, "up"])?;
            cmd::run(&["ip", "-n", &self.rank_ns, "link", "set", &name, "up"])?;
            self.tally.ifaces_created += 1;
            self.event("iface-add", &name);
            self.ifaces.push(name);
        } else {
            let i = self.rng.below(self.ifaces.len() as u64) as usize;
            let name = self.ifaces.swap_remove(i);
            cmd::run(&["ip", "-n", &self.rank_ns, "link", "del", &name])?;
            self.tally.ifaces_deleted += 1;
            self.event("iface-del", &name);
        }
        Ok(())
    }

    /// One sample of the daemon: /proc, /metrics, the snapshot's tick.
    fn sample(&mut self, threads: &Threads) {
        self.collect_thread_counts(threads);
        let Some(d) = &self.daemon else {
            return;
        };
        let (pid, life, mode) = (d.pid, d.life, d.mode);
        let mut row = Row {
            t: (self.t() * 10.0).round() / 10.0,
            life,
            mode: mode.as_str(),
            pid,
            ifaces_live: self.ifaces.len(),
            rdma_live: self.fixture.live(),
            ..Row::default()
        };
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            row.rss_kib = probe_tests::process::parse_status_kib(&status, "VmRSS").unwrap_or(0);
        }
        row.fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
        if let Some(ticks) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| probe_tests::process::parse_stat_cpu_ticks(&s).ok())
        {
            // SAFETY: sysconf has no preconditions.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
            let now = Instant::now();
            let d = self.daemon.as_mut().expect("checked above");
            if let Some((t, at)) = d.last_cpu {
                let dt = now.duration_since(at).as_secs_f64();
                if dt > 0.0 {
                    row.cpu_pct =
                        ((ticks.saturating_sub(t)) as f64 / hz / dt * 1000.0).round() / 10.0;
                }
            }
            d.last_cpu = Some((ticks, now));
        }
        if let Ok(links) = probe_tests::bpflinks::tcx_links(pid) {
            row.tcx_links = links.len();
            let defunct: Vec<u32> = links
                .iter()
                .filter(|l| l.ifindex == Some(0))
                .map(|l| l.link_id)
                .collect();
            row.defunct_links = defunct.len();
            // A link whose interface is gone is released at the daemon's next look at the
            // interfaces; one held much longer is a leak (an fd and a program reference).
            self.defunct_since.retain(|id, _| defunct.contains(id));
            for id in defunct {
                let first = *self.defunct_since.entry(id).or_insert(row.t);
                if row.t - first > DEFUNCT_LIMIT_S && row.t - first <= DEFUNCT_LIMIT_S + 1.5 {
                    self.failures.add(
                        "leaked link",
                        format!(
                            "TCX link {id} of a deleted interface still held after {DEFUNCT_LIMIT_S} s (lifetime {life}, t={:.0}s)",
                            row.t
                        ),
                    );
                }
            }
        }
        // Every few samples: the ids it holds, for the leftover check at its stop.
        if self.rows.len().is_multiple_of(5) {
            self.refresh_ids();
        }
        let scraped = self.get("/metrics").and_then(|r| {
            if r.status != 200 {
                bail!("/metrics answered {}", r.status);
            }
            // The latest scrape, for a look at what the series are.
            let _ = std::fs::write(self.out.join("metrics.last.txt"), &r.body);
            probe_tests::Metrics::parse(&r.body)
        });
        let asked = unix_now();
        let snap = self.get("/api/v1/snapshot").and_then(|r| {
            if r.status != 200 {
                bail!("/api/v1/snapshot answered {}", r.status);
            }
            Ok(serde_json::from_str::<serde_json::Value>(&r.body)?)
        });
        self.tally.scrapes += 1;
        match (scraped, snap) {
            (Ok(m), Ok(snap)) => {
                self.consecutive_scrape_errors = 0;
                row.series = Some(m.samples.len());
                let stages: f64 = m
                    .select("probe_tick_duration_seconds", &[])
                    .map(|s| s.value)
                    .sum();
                row.tick_s = m.has("probe_tick_duration_seconds").then_some(stages);
                let one = |name: &str| m.has(name).then(|| m.sum(name, &[]));
                row.flows_tracked = one("probe_flows_tracked");
                row.flow_evictions = one("probe_flow_evictions_total");
                row.map_full = one("probe_map_full_total");
                row.peers_folded = one("probe_peers_folded");
                row.feature_entities = one("probe_feature_entities");
                row.feature_untracked = one("probe_feature_entities_untracked_total");
                self.monotonic.observe(&m);
                let tick = snap["tick"].as_u64();
                row.snapshot_tick = tick;
                // The first ticks after a start are not judged: nothing is late yet.
                if let (Some(tick), Some(at)) = (tick, snap["time_unix"].as_f64()) {
                    if tick >= 2 {
                        row.since_tick_s = Some(((asked - at) * 1000.0).round() / 1000.0);
                    }
                }
            }
            (a, b) => {
                self.tally.scrape_errors += 1;
                self.consecutive_scrape_errors += 1;
                let e = a
                    .err()
                    .or(b.err())
                    .map(|e| format!("{e:#}"))
                    .unwrap_or_default();
                if self.consecutive_scrape_errors == 5 {
                    let t = self.t();
                    self.failures.add(
                        "unresponsive",
                        format!("5 scrapes in a row failed (lifetime {life}, t={t:.0}s): {e}"),
                    );
                }
            }
        }
        let limit = 2.0 * TICK.as_secs_f64();
        if let Some(s) = row.tick_s.filter(|&s| s > limit) {
            self.failures.add(
                "missed tick",
                format!("the daemon's tick took {s:.3} s (> 2 x {TICK:?}) at t={:.0}s (lifetime {life})", row.t),
            );
        }
        if let Some(s) = row.since_tick_s.filter(|&s| s > limit) {
            self.failures.add(
                "missed tick",
                format!(
                    "no tick for {s:.3} s (> 2 x {TICK:?}) at t={:.0}s (lifetime {life})",
                    row.t
                ),
            );
        }
        if let Ok(line) = serde_json::to_string(&row) {
            let _ = writeln!(self.timeline, "{line}");
        }
        self.rows.push(row);
    }

    fn collect_thread_counts(&mut self, threads: &Threads) {
        use churn_threads::get;
        let c = &threads.counts;
        let t = &mut self.tally;
        t.conns_ok = get(&c.conns_ok);
        t.conns_failed = get(&c.conns_failed);
        t.scrapes_cut = get(&c.scrapes_cut);
        t.scrapes_silent = get(&c.scrapes_silent);
        t.scrapes_half_request = get(&c.scrapes_half_request);
        t.scrapes_refused = get(&c.scrapes_refused);
    }

    fn collect_thread_counts_final(&mut self) {
        let f = &self.fixture;
        self.tally.rdma_added = f.added;
        self.tally.rdma_removed = f.removed;
        self.tally.rdma_broken = f.broken;
        self.tally.rdma_repaired = f.repaired;
        let _ = writeln!(
            self.events,
            "{}",
            serde_json::to_string(&self.tally).unwrap_or_default()
        );
    }
}

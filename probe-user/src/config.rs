//! The daemon's configuration: built-in defaults, overridden by the TOML file, overridden by
//! flags. Unknown keys and bad values are errors that name the key.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::{bail, Context as _, Result};
use clap::{Args, ValueEnum};
use serde::Deserialize;

use crate::{duration::parse_duration, pathpattern::PathPattern};

/// The flags of `probe run`: each overrides the config file's key.
#[derive(Args, Debug, Default, Clone)]
pub struct RunArgs {
    /// TOML config file; flags given on the command line override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Interface to monitor (repeatable; `*` and `?` wildcards allowed). Default: every
    /// non-loopback interface that is up.
    #[arg(long = "interface", short = 'i', value_name = "NAME")]
    pub interfaces: Vec<String>,

    /// Address of the HTTP server (/metrics, /healthz, /api/v1/snapshot).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,

    /// How often maps are read and metrics refreshed, e.g. `1s`, `500ms`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub tick: Option<Duration>,

    /// Idle gap that ends a flow's burst, e.g. `1ms`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub burst_gap: Option<Duration>,

    /// How TC programs attach: TCX links (kernel >= 6.6; nothing survives the process),
    /// netlink (clsact qdisc + filters, visible to `tc filter show`), or auto.
    #[arg(long, value_enum, value_name = "MODE")]
    pub tc_attach: Option<TcAttach>,

    /// Forward the eBPF programs' own log messages (e.g. "map full") into this log.
    #[arg(long)]
    pub bpf_log: bool,

    /// TLS, mutual TLS and basic auth for the HTTP server: a YAML file with the keys of the
    /// Prometheus exporter-toolkit (tls_server_config, basic_auth_users), docs/install.md.
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub web_config: Option<PathBuf>,

    /// Do not serve /api/v1/snapshot (it names peers, connections and flows); /metrics and
    /// /healthz stay. `probe top` and `probe record` need it.
    #[arg(long = "web.disable-snapshot")]
    pub disable_snapshot: bool,

    /// Check the host and exit: privileges, kernel (BTF, TCX), cgroup v2, tracefs and each
    /// tracepoint, the listen address, the interfaces and what would be attached. Loads and
    /// attaches nothing; exit status 1 if probe run would not start.
    #[arg(long)]
    pub check: bool,

    /// Watch one cgroup v2 directory's sockets (a container's or a pod's) instead of the
    /// whole host: sock_ops attaches there, and the host-wide tracepoints (retransmits of
    /// every socket, drops by reason) are left out. Run probe in the container's network
    /// namespace too; docs/operations.md.
    #[arg(long, value_name = "DIR")]
    pub cgroup: Option<PathBuf>,

    /// The training job this host serves, exported as `probe_host_info{training_job}` so
    /// that the probes of one job can be selected and joined in PromQL.
    #[arg(long, value_name = "NAME")]
    pub training_job: Option<String>,

    /// Spike model directory (`probe train --out`). Default: the built-in model. SIGHUP
    /// reloads it; a bad model is refused and the previous one keeps serving.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,

    /// The job's early-warning models (`probe train --job --out`): scores this host's job
    /// row each tick into probe_job_warning_score and probe_job_slowdown_probability
    /// (docs/job.md). Default: none (the job's series are not exported).
    #[arg(long, value_name = "DIR")]
    pub job_model: Option<PathBuf>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TcAttach {
    #[default]
    Auto,
    Tcx,
    Netlink,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// Interface name patterns to monitor; empty means every non-loopback interface that is up.
    pub include: Vec<String>,
    /// Interface name patterns never to monitor.
    pub exclude: Vec<String>,
    pub listen: SocketAddr,
    /// `--web.config.file`: TLS and auth of the HTTP server.
    pub web_config: Option<PathBuf>,
    /// Serve /api/v1/snapshot.
    pub snapshot_api: bool,
    pub tick: Duration,
    /// How often the per-flow map is walked (top flows, tracked and evicted flow counts,
    /// idle flow deletion); the per-peer series are read every tick regardless.
    pub flow_scan: Duration,
    pub burst_gap: Duration,
    pub tc_attach: TcAttach,
    /// Peers with their own series; the rest fold into peer="other".
    pub top_peers: usize,
    pub maps: MapSizes,
    pub model: Option<PathBuf>,
    /// The job's early-warning models (`--job-model`).
    pub job_model: Option<PathBuf>,
    pub rdma: RdmaSettings,
    pub bpf_log: bool,
    /// `probe_host_info`'s training_job label.
    pub training_job: Option<String>,
    /// Scope: the cgroup whose sockets sock_ops watches (None: the whole host).
    pub cgroup: Option<PathBuf>,
    /// How each connection's training job is found from its socket's cgroup (`[jobs]`).
    pub jobs: JobSettings,
    /// The feature stage; its `tick` follows `tick`.
    pub features: FeatureConfig,
}

#[derive(Debug, Clone)]
pub struct RdmaSettings {
    pub enabled: bool,
    pub poller: RdmaConfig,
}

impl Default for RdmaSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            poller: RdmaConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MapSizes {
    pub flows: u32,
    pub conns: u32,
    /// Peers of the per-CPU TCP map; 0: sized by the number of possible CPUs
    /// (`MapSizes::peers_for`).
    pub peers: u32,
    /// Bytes of each CPU's BURST_EVENTS ring (64 per burst end); 0: sized by the number of
    /// possible CPUs (`MapSizes::burst_records_for`). A full ring loses events, not histogram
    /// counts (the programs then fold the burst in the kernel).
    pub burst_events_bytes_per_cpu: u32,
    /// Slots per CPU of the per-series counter table (a power of two); 0: sized by the
    /// number of possible CPUs (`MapSizes::series_slots_for`).
    pub series_slots: u32,
    /// Slots per CPU of sock_ops' per-peer table (a power of two); 0: sized by the number
    /// of possible CPUs (`MapSizes::peer_slots_for`). Peers beyond them go to the per-CPU
    /// TCP map, at a higher cost per round trip.
    pub peer_slots: u32,
    /// How the flow and connection maps are walked every `flow_scan`.
    pub walk: MapWalk,
}

/// How the flow and connection maps are walked (`[maps] walk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MapWalk {
    /// Programs in the kernel pick what the daemon keeps (bpf::select, Linux >= 5.13); batch
    /// lookups where the kernel refuses them.
    #[default]
    Select,
    /// Batch lookups copy every entry to user space.
    Batch,
}

impl Default for MapSizes {
    fn default() -> Self {
        Self {
            flows: probe_ebpf::FLOWS_MAX_ENTRIES,
            conns: probe_ebpf::CONNS_MAX_ENTRIES,
            peers: 0,
            burst_events_bytes_per_cpu: 0,
            series_slots: 0,
            peer_slots: 0,
            walk: MapWalk::Select,
        }
    }
}

/// The largest power of two at most `n` (0 for 0): a per-CPU share rounded down to a size
/// the kernel side can mask with.
fn pow2_at_most(n: u32) -> u32 {
    n.checked_ilog2().map_or(0, |b| 1 << b)
}

impl MapSizes {
    /// The series table's slots per CPU on a host with `cpus` possible CPUs: as configured,
    /// or by default as many as keep the whole table (read every tick) at 65,536 slots, 4 MiB,
    /// within 64 to SERIES_SLOTS_DEFAULT per CPU.
    pub fn series_slots_for(&self, cpus: usize) -> u32 {
        if self.series_slots != 0 {
            return self.series_slots;
        }
        pow2_at_most((65_536 / cpus.max(1)) as u32).clamp(64, probe_ebpf::SERIES_SLOTS_DEFAULT)
    }

    /// sock_ops' per-peer slots per CPU on a host with `cpus` possible CPUs: as configured,
    /// or by default as many as keep the whole table (read every tick) at 8,192 slots,
    /// 2.8 MiB, within 16 to PEER_SLOTS_PER_CPU per CPU.
    pub fn peer_slots_for(&self, cpus: usize) -> u32 {
        if self.peer_slots != 0 {
            return self.peer_slots;
        }
        pow2_at_most((8_192 / cpus.max(1)) as u32).clamp(16, probe_ebpf::PEER_SLOTS_PER_CPU)
    }

    /// Burst-end records per CPU on a host with `cpus` possible CPUs: as configured, or by
    /// default as many as keep all rings within 8 MiB of kernel memory, from 1,024 to
    /// BURST_EVENTS_PER_CPU_DEFAULT per CPU (a power of two). The rings are per CPU because a
    /// shared one costs every writer a lock; a CPU's ring must hold what that CPU's programs
    /// write in one 100 ms drain period.
    pub fn burst_records_for(&self, cpus: usize) -> u32 {
        let slot = std::mem::size_of::<probe_ebpf::BurstSlot>() as u32;
        if self.burst_events_bytes_per_cpu != 0 {
            return self.burst_events_bytes_per_cpu / slot;
        }
        let fit = ((8 << 20) / slot as usize / cpus.max(1)) as u32;
        pow2_at_most(fit).clamp(1_024, probe_ebpf::BURST_EVENTS_PER_CPU_DEFAULT)
    }

    /// Entries of the per-peer TCP map on a host with `cpus` possible CPUs: as configured,
    /// or by default PEERS_MAX_ENTRIES, fewer where that would take more than 64 MiB of
    /// kernel memory. The map is per-CPU and LRU, so the kernel allocates every entry's value
    /// for every possible CPU when it loads (16,384 x 336 bytes x 128 CPUs would be 704 MB).
    pub fn peers_for(&self, cpus: usize) -> u32 {
        if self.peers != 0 {
            return self.peers;
        }
        let per_entry = std::mem::size_of::<probe_ebpf::PeerTcp>() * cpus.max(1);
        let fit = ((64 << 20) / per_entry) as u32;
        fit.clamp(256, probe_ebpf::PEERS_MAX_ENTRIES)
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            include: Vec::new(),
            exclude: Vec::new(),
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            web_config: None,
            snapshot_api: true,
            tick: Duration::from_secs(1),
            flow_scan: Duration::from_secs(5),
            burst_gap: Duration::from_millis(1),
            tc_attach: TcAttach::Auto,
            top_peers: 256,
            maps: MapSizes::default(),
            model: None,
            job_model: None,
            rdma: RdmaSettings::default(),
            bpf_log: false,
            training_job: None,
            cgroup: None,
            jobs: JobSettings::default(),
            features: FeatureConfig::default(),
        }
    }
}

/// `[jobs]`: a connection's training job from its socket's cgroup path (docs/job.md).
#[derive(Debug, Clone)]
pub struct JobSettings {
    /// Templates tried before the built-in layouts (`job_from_cgroup`).
    pub from_cgroup: Vec<PathPattern>,
    /// Whether the built-in layouts (Kubernetes pods, Slurm jobs) are tried.
    pub builtin: bool,
    /// The kubelet's pod log directories (`<namespace>_<pod>_<uid>`), which name a pod.
    pub pod_logs: PathBuf,
    /// Jobs with their own series at most; the rest are counted (probe_jobs_folded).
    pub max_jobs: usize,
}

impl Default for JobSettings {
    fn default() -> Self {
        Self {
            from_cgroup: Vec::new(),
            builtin: true,
            pod_logs: PathBuf::from("/var/log/pods"),
            max_jobs: 16,
        }
    }
}

/// The file's shape. Durations are strings (`"1s"`) so they read like the flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    web: Option<FileWeb>,
    tick: Option<String>,
    flow_scan: Option<String>,
    burst_gap: Option<String>,
    tc_attach: Option<TcAttach>,
    top_peers: Option<usize>,
    model: Option<PathBuf>,
    job_model: Option<PathBuf>,
    training_job: Option<String>,
    cgroup: Option<PathBuf>,
    job_from_cgroup: Option<Vec<String>>,
    jobs: Option<FileJobs>,
    interfaces: Option<FileInterfaces>,
    maps: Option<MapSizes>,
    rdma: Option<FileRdma>,
    features: Option<FileFeatures>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileJobs {
    builtin: Option<bool>,
    pod_logs: Option<PathBuf>,
    max_jobs: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileWeb {
    config_file: Option<PathBuf>,
    snapshot: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFeatures {
    windows: Option<Vec<String>>,
    period_window: Option<String>,
    max_entities: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRdma {
    enabled: Option<bool>,
    sysfs_root: Option<PathBuf>,
    interval: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileInterfaces {
    #[serde(default)]
    include: Vec<String>,
    #[serde(default)]
    exclude: Vec<String>,
}

impl Config {
    /// Ticks between walks of the flow map: `flow_scan` rounded up to whole ticks.
    pub fn flow_scan_ticks(&self) -> u64 {
        let t = self.tick.as_nanos().max(1);
        self.flow_scan.as_nanos().div_ceil(t).max(1) as u64
    }

    /// Defaults, then the file named by `--config`, then the flags.
    pub fn resolve(args: &RunArgs) -> Result<Self> {
        let mut c = Config::default();
        if let Some(path) = &args.config {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?;
            c.apply_file(&text)
                .with_context(|| format!("config file {}", path.display()))?;
        }
        if !args.interfaces.is_empty() {
            c.include = args.interfaces.clone();
        }
        if let Some(v) = args.listen {
            c.listen = v;
        }
        if let Some(v) = &args.web_config {
            c.web_config = Some(v.clone());
        }
        c.snapshot_api &= !args.disable_snapshot;
        if let Some(v) = args.tick {
            c.tick = v;
        }
        if let Some(v) = args.burst_gap {
            c.burst_gap = v;
        }
        if let Some(v) = args.tc_attach {
            c.tc_attach = v;
        }
        if let Some(v) = &args.model {
            c.model = Some(v.clone());
        }
        if let Some(v) = &args.job_model {
            c.job_model = Some(v.clone());
        }
        if let Some(v) = &args.training_job {
            c.training_job = Some(v.clone());
        }
        if let Some(v) = &args.cgroup {
            c.cgroup = Some(v.clone());
        }
        c.bpf_log |= args.bpf_log;
        c.features.tick = c.tick;
        c.validate()?;
        Ok(c)
    }

    /// The defaults with a config file's text applied and checked, as `--config` reads it.
    pub fn from_toml(text: &str) -> Result<Config> {
        let mut c = Config::default();
        c.apply_file(text)?;
        c.features.tick = c.tick;
        c.validate()?;
        Ok(c)
    }

    fn apply_file(&mut self, text: &str) -> Result<()> {
        // toml's messages already name the key and line; keep them on one line.
        let f: FileConfig =
            toml::from_str(text).map_err(|e| anyhow::anyhow!(one_line(&e.to_string())))?;
        if let Some(v) = f.listen {
            self.listen = v
                .parse()
                .map_err(|_| anyhow::anyhow!("key `listen`: `{v}` is not an ADDR:PORT"))?;
        }
        if let Some(w) = f.web {
            if let Some(v) = w.config_file {
                self.web_config = Some(v);
            }
            if let Some(v) = w.snapshot {
                self.snapshot_api = v;
            }
        }
        if let Some(v) = f.tick {
            self.tick = parse_duration(&v).map_err(|e| anyhow::anyhow!("key `tick`: {e}"))?;
        }
        if let Some(v) = f.flow_scan {
            self.flow_scan =
                parse_duration(&v).map_err(|e| anyhow::anyhow!("key `flow_scan`: {e}"))?;
        }
        if let Some(v) = f.burst_gap {
            self.burst_gap =
                parse_duration(&v).map_err(|e| anyhow::anyhow!("key `burst_gap`: {e}"))?;
        }
        if let Some(v) = f.tc_attach {
            self.tc_attach = v;
        }
        if let Some(v) = f.top_peers {
            self.top_peers = v;
        }
        if let Some(v) = f.model {
            self.model = Some(v);
        }
        if let Some(v) = f.job_model {
            self.job_model = Some(v);
        }
        if let Some(v) = f.training_job {
            self.training_job = Some(v);
        }
        if let Some(v) = f.cgroup {
            self.cgroup = Some(v);
        }
        if let Some(ps) = f.job_from_cgroup {
            self.jobs.from_cgroup = ps
                .iter()
                .map(|p| PathPattern::parse(p))
                .collect::<Result<_>>()
                .map_err(|e| anyhow::anyhow!("key `job_from_cgroup`: {e}"))?;
        }
        if let Some(j) = f.jobs {
            self.apply_jobs(j)?;
        }
        if let Some(i) = f.interfaces {
            self.include = i.include;
            self.exclude = i.exclude;
        }
        if let Some(m) = f.maps {
            self.maps = m;
        }
        if let Some(r) = f.rdma {
            if let Some(v) = r.enabled {
                self.rdma.enabled = v;
            }
            if let Some(v) = r.sysfs_root {
                self.rdma.poller.sysfs_root = v;
            }
            if let Some(v) = r.interval {
                self.rdma.poller.interval =
                    parse_duration(&v).map_err(|e| anyhow::anyhow!("key `rdma.interval`: {e}"))?;
            }
        }
        if let Some(f) = f.features {
            if let Some(ws) = f.windows {
                self.features.windows = ws
                    .iter()
                    .map(|w| parse_duration(w))
                    .collect::<Result<_, _>>()
                    .map_err(|e| anyhow::anyhow!("key `features.windows`: {e}"))?;
            }
            if let Some(v) = f.period_window {
                self.features.period_window = parse_duration(&v)
                    .map_err(|e| anyhow::anyhow!("key `features.period_window`: {e}"))?;
            }
            if let Some(v) = f.max_entities {
                self.features.max_entities = v;
            }
        }
        Ok(())
    }

    fn apply_jobs(&mut self, j: FileJobs) -> Result<()> {
        if let Some(v) = j.builtin {
            self.jobs.builtin = v;
        }
        if let Some(v) = j.pod_logs {
            self.jobs.pod_logs = v;
        }
        if let Some(v) = j.max_jobs {
            if !(1..=1024).contains(&v) {
                bail!("key `jobs.max_jobs`: {v} is out of range (1 to 1024)");
            }
            self.jobs.max_jobs = v;
        }
        Ok(())
    }

    fn validate(&self) -> Result<()> {
        if self.tick < Duration::from_millis(10) {
            bail!("tick {:?} is too short (minimum 10ms)", self.tick);
        }
        if self.top_peers == 0 {
            bail!("key `top_peers` must be at least 1");
        }
        if let Some(j) = &self.training_job {
            // A label value: any UTF-8 would do, but an operator's typo should not page.
            if j.is_empty() || j.len() > 128 || j.chars().any(char::is_control) {
                bail!("key `training_job`: {j:?} must be 1 to 128 characters without control characters");
            }
        }
        for (k, v) in [
            ("maps.flows", self.maps.flows),
            ("maps.conns", self.maps.conns),
        ] {
            if !(16..=4_194_304).contains(&v) {
                bail!("key `{k}`: {v} is out of range (16 to 4194304)");
            }
        }
        let peers = self.maps.peers;
        if peers != 0 && !(16..=4_194_304).contains(&peers) {
            bail!("key `maps.peers`: {peers} must be 0 (sized by CPUs) or 16 to 4194304");
        }
        let slots = self.maps.series_slots;
        if slots != 0 && (!slots.is_power_of_two() || !(64..=65_536).contains(&slots)) {
            bail!(
                "key `maps.series_slots`: {slots} must be 0 (sized by CPUs) or a power of two from 64 to 65536"
            );
        }
        let slots = self.maps.peer_slots;
        if slots != 0
            && (!slots.is_power_of_two() || !(4..=probe_ebpf::PEER_SLOTS_PER_CPU).contains(&slots))
        {
            bail!(
                "key `maps.peer_slots`: {slots} must be 0 (sized by CPUs) or a power of two from 4 to {}",
                probe_ebpf::PEER_SLOTS_PER_CPU
            );
        }
        if self.flow_scan.is_zero() || self.flow_scan > Duration::from_secs(60) {
            bail!(
                "key `flow_scan`: {:?} is out of range (one tick to 60s)",
                self.flow_scan
            );
        }
        let ring = self.maps.burst_events_bytes_per_cpu;
        if ring != 0 && (!ring.is_power_of_two() || !(4096..=(64 << 20)).contains(&ring)) {
            bail!(
                "key `maps.burst_events_bytes_per_cpu`: {ring} must be 0 (sized by CPUs) or a power of two from 4096 to 67108864"
            );
        }
        self.features.validate().map_err(|e| anyhow::anyhow!(e))?;
        Ok(())
    }
}

/// toml renders errors over several lines (position, source excerpt, message); keep the
/// position and the message.
fn one_line(s: &str) -> String {
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    match (lines.first(), lines.last()) {
        (Some(first), Some(last)) if lines.len() > 1 => format!("{first}: {last}"),
        _ => s.trim().to_owned(),
    }
}

/// Shell-style wildcard match (`*`, `?`) for interface names.
pub fn name_matches(pattern: &str, name: &str) -> bool {
    fn rec(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => rec(&p[1..], n) || (!n.is_empty() && rec(p, &n[1..])),
            (Some(b'?'), Some(_)) => rec(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => rec(&p[1..], &n[1..]),
            _ => false,
        }
    }
    rec(pattern.as_bytes(), name.as_bytes())
}

pub fn is_pattern(s: &str) -> bool {
    s.contains(['*', '?'])
}

/// How features are computed. The daemon and `probe features` must use the same values to
/// compute the same features (the defaults, or the same `[features]` config section).
#[derive(Clone, Debug, PartialEq)]
pub struct FeatureConfig {
    /// Window lengths, ascending (defaults 5 s, 30 s, 120 s).
    pub windows: Vec<Duration>,
    /// The daemon's tick: sizes the fixed rings (the longest window's worth of ticks).
    pub tick: Duration,
    /// How much burst history the iteration period is estimated over.
    pub period_window: Duration,
    /// Re-estimate a peer's period every this many of its ticks (an FFT: too dear per tick).
    pub period_every: u32,
    /// Burst events kept per peer (the oldest go first).
    pub events_per_peer: usize,
    /// Entities tracked at once; more are not featurized (and counted).
    pub max_entities: usize,
}

impl Default for FeatureConfig {
    fn default() -> Self {
        Self {
            windows: vec![
                Duration::from_secs(5),
                Duration::from_secs(30),
                Duration::from_secs(120),
            ],
            tick: Duration::from_secs(1),
            period_window: Duration::from_secs(16),
            period_every: 5,
            events_per_peer: 512,
            max_entities: 4096,
        }
    }
}

impl FeatureConfig {
    /// Checks what the rest of the stage relies on; the error names the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.windows.is_empty() {
            return Err("key `features.windows`: give at least one window".into());
        }
        if self.windows.windows(2).any(|w| w[0] >= w[1]) {
            return Err("key `features.windows`: windows must be distinct and ascending".into());
        }
        if self.windows[0] < self.tick {
            return Err(format!(
                "key `features.windows`: the shortest window ({}) is shorter than the tick ({})",
                crate::duration::label(self.windows[0]),
                crate::duration::label(self.tick)
            ));
        }
        if self.max_entities == 0 || self.events_per_peer < 16 || self.period_every == 0 {
            return Err("key `features`: max_entities, events_per_peer (>= 16) and period_every must be positive".into());
        }
        Ok(())
    }

    /// Ring slots per entity: the longest window in ticks, with room for ticks that come
    /// early (a late tick followed by an on-time one).
    pub fn ring_capacity(&self) -> usize {
        let longest = self
            .windows
            .last()
            .copied()
            .unwrap_or_default()
            .as_secs_f64();
        let tick = self.tick.as_secs_f64().max(1e-3);
        ((longest / tick) * 1.25).ceil() as usize + 2
    }

    pub fn longest(&self) -> f64 {
        self.windows.last().map_or(0.0, Duration::as_secs_f64)
    }
}

/// Where and how often the RDMA poller reads counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaConfig {
    /// The sysfs class directory holding one entry per RDMA device. Point it at a fixture tree
    /// (same layout) to test or replay.
    pub sysfs_root: PathBuf,
    /// Time between two polls of the dedicated thread ([`spawn`]).
    pub interval: Duration,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        Self {
            sysfs_root: PathBuf::from(DEFAULT_SYSFS_ROOT),
            interval: Duration::from_secs(1),
        }
    }
}

/// The live system's RDMA class directory.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys/class/infiniband";

#[cfg(test)]
mod tests {
    use super::*;

    fn from_file(text: &str) -> Result<Config> {
        Config::from_toml(text)
    }

    #[test]
    fn file_values_apply() {
        let c = from_file(
            "listen = \"0.0.0.0:9000\"\ntick = \"500ms\"\ntop_peers = 8\n[interfaces]\ninclude = [\"eth*\"]\nexclude = [\"eth9\"]\n[maps]\nflows = 1024\n",
        )
        .unwrap();
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.tick, Duration::from_millis(500));
        assert_eq!(c.top_peers, 8);
        assert_eq!(c.include, vec!["eth*"]);
        assert_eq!(c.maps.flows, 1024);
        assert_eq!(c.maps.conns, probe_ebpf::CONNS_MAX_ENTRIES);
    }

    #[test]
    fn series_slots_and_flow_scan() {
        let d = MapSizes::default();
        // Sized by CPUs: the whole table within 65,536 slots, 64 to 1,024 per CPU.
        assert_eq!(d.series_slots_for(2), 1024);
        assert_eq!(d.series_slots_for(64), 1024);
        assert_eq!(d.series_slots_for(96), 512);
        assert_eq!(d.series_slots_for(256), 256);
        assert_eq!(d.series_slots_for(384), 128);
        assert_eq!(d.series_slots_for(4096), 64);
        // sock_ops' peer slots: the whole table within 8,192 slots, 16 to 256 per CPU.
        assert_eq!(d.peer_slots_for(2), 256);
        assert_eq!(d.peer_slots_for(32), 256);
        assert_eq!(d.peer_slots_for(64), 128);
        assert_eq!(d.peer_slots_for(4096), 16);
        // The per-CPU peer map: 16,384 peers up to 12 CPUs, then within 64 MiB.
        assert_eq!(d.peers_for(2), probe_ebpf::PEERS_MAX_ENTRIES);
        assert_eq!(d.peers_for(128), 1560);
        assert_eq!(d.peers_for(4096), 256);
        // The burst-end rings: 4,096 records per CPU up to 32 CPUs, then within 8 MiB, at
        // least 1,024 per CPU.
        assert_eq!(d.burst_records_for(2), 4096);
        assert_eq!(d.burst_records_for(32), 4096);
        assert_eq!(d.burst_records_for(48), 2048);
        assert_eq!(d.burst_records_for(128), 1024);
        assert_eq!(d.burst_records_for(4096), 1024);
        let c = from_file("[maps]\npeers = 64\n").unwrap();
        assert_eq!(c.maps.peers_for(128), 64);
        assert!(from_file("[maps]\npeers = 8\n").is_err());
        let c = from_file("flow_scan = \"2s\"\n[maps]\nseries_slots = 4096\n").unwrap();
        assert_eq!(c.maps.series_slots_for(384), 4096);
        assert_eq!(c.flow_scan_ticks(), 2);
        let c = from_file("tick = \"300ms\"\nflow_scan = \"1s\"\n").unwrap();
        assert_eq!(c.flow_scan_ticks(), 4);
        assert_eq!(Config::default().flow_scan_ticks(), 5);
        for bad in ["100", "32", "131072"] {
            let e = from_file(&format!("[maps]\nseries_slots = {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("maps.series_slots"), "{e}");
        }
        let e = from_file("flow_scan = \"2m\"\n").unwrap_err().to_string();
        assert!(e.contains("flow_scan"), "{e}");
    }

    #[test]
    fn errors_name_the_key() {
        let e = from_file("tick_rate = \"1s\"\n").unwrap_err().to_string();
        assert!(e.contains("tick_rate"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = from_file("tick = \"soon\"\n").unwrap_err().to_string();
        assert!(e.contains("tick"), "{e}");
        let e = from_file("[maps]\nflows = 1\n").unwrap_err().to_string();
        assert!(e.contains("maps.flows"), "{e}");
        for bad in ["1000", "2048", "134217728"] {
            let e = from_file(&format!("[maps]\nburst_events_bytes_per_cpu = {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("maps.burst_events_bytes_per_cpu"), "{e}");
        }
        let c = from_file("[maps]\nburst_events_bytes_per_cpu = 65536\n").unwrap();
        assert_eq!(c.maps.burst_records_for(64), 1024);
        // The key before the rings were per CPU is refused by name.
        let e = from_file("[maps]\nburst_events_bytes = 65536\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("burst_events_bytes"), "{e}");
        let e = from_file("listen = \"nowhere\"\n").unwrap_err().to_string();
        assert!(e.contains("listen"), "{e}");
    }

    #[test]
    fn feature_windows_from_the_file() {
        let c = from_file("[features]\nwindows = [\"10s\", \"1m\"]\nmax_entities = 9\n").unwrap();
        assert_eq!(
            c.features.windows,
            vec![Duration::from_secs(10), Duration::from_secs(60)]
        );
        assert_eq!(c.features.max_entities, 9);
        let e = from_file("[features]\nwindows = [\"1m\", \"10s\"]\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("features.windows") && e.contains("ascending"),
            "{e}"
        );
        let e = from_file("[features]\nwindows = [\"soon\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("features.windows"), "{e}");
    }

    #[test]
    fn wildcards() {
        assert!(name_matches("eth*", "eth0"));
        assert!(name_matches("*", "x"));
        assert!(name_matches("ib?", "ib0"));
        assert!(!name_matches("ib?", "ib10"));
        assert!(!name_matches("eth0", "eth01"));
    }

    /// The keys the config file accepts under `table` ("" for the top level), as serde
    /// itself lists them in its error for an unknown key ("expected one of `a`, `b`"): the
    /// file structs' own field lists, so they cannot drift from the code. None when `table`
    /// is not a table of the file (a scalar or list key).
    fn accepted_keys(table: &str) -> Option<Vec<String>> {
        const PROBE: &str = "no_such_key_for_the_test";
        let header = if table.is_empty() {
            String::new()
        } else {
            format!("[{table}]\n")
        };
        let e = toml::from_str::<FileConfig>(&format!("{header}{PROBE} = 0\n"))
            .err()?
            .to_string();
        let (_, expected) = e.split_once(&format!("unknown field `{PROBE}`, expected"))?;
        Some(
            expected
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect(),
        )
    }

    /// Every key of the file, dotted (`maps.flows`), tables walked recursively.
    fn file_keys(table: &str, out: &mut Vec<String>) {
        for k in accepted_keys(table).expect("a table of the config file") {
            let key = if table.is_empty() {
                k
            } else {
                format!("{table}.{k}")
            };
            if accepted_keys(&key).is_some() {
                file_keys(&key, out);
            } else {
                out.push(key);
            }
        }
    }

    /// docs/install.md has a table row for every long flag of `probe run` (and the global
    /// ones) and for every config key, and no row for a flag that does not exist: a flag or
    /// key added to the code without a line in the doc fails here.
    #[test]
    fn install_md_lists_every_flag_and_config_key() {
        use clap::CommandFactory as _;
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/install.md");
        let doc = std::fs::read_to_string(path).expect("docs/install.md exists");
        let rows: Vec<&str> = doc.lines().filter(|l| l.starts_with("| `")).collect();
        // A row's first cell names it: `--flag ARG`, or a key.
        let named = |row: &&str| row[3..].split(['`', ' ']).next().unwrap_or("").to_owned();

        let cli = crate::cli::Cli::command();
        let run = cli.find_subcommand("run").expect("probe run exists");
        let flags: Vec<String> = cli
            .get_arguments()
            .chain(run.get_arguments())
            .filter_map(|a| a.get_long())
            .filter(|l| !matches!(*l, "help" | "version"))
            .map(|l| format!("--{l}"))
            .collect();
        assert!(flags.len() >= 12, "{flags:?}");
        let flag_rows: Vec<String> = rows
            .iter()
            .map(named)
            .filter(|n| n.starts_with("--"))
            .collect();
        let missing: Vec<_> = flags.iter().filter(|f| !flag_rows.contains(f)).collect();
        let unknown: Vec<_> = flag_rows.iter().filter(|f| !flags.contains(f)).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "docs/install.md lacks a row for the flags {missing:?}; it has rows for flags \
             `probe run` does not take: {unknown:?}"
        );

        let mut keys = Vec::new();
        file_keys("", &mut keys);
        for k in ["listen", "maps.flows", "web.config_file", "rdma.interval"] {
            assert!(keys.iter().any(|x| x == k), "{k} not found in {keys:?}");
        }
        let key_rows: Vec<String> = rows.iter().map(named).collect();
        let missing: Vec<_> = keys.iter().filter(|k| !key_rows.contains(k)).collect();
        assert!(
            missing.is_empty(),
            "docs/install.md lacks a row (| `key` | default | meaning |) for the config keys {missing:?}"
        );
    }
}

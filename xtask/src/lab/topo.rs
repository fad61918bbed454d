//! The lab's network: one namespace per rank plus a switch namespace with a Linux bridge,
//! and the processes started inside them. Everything is removed on drop, whatever the exit
//! path; the lab only ever touches namespaces named after its own pid.
use super::cmd;
use anyhow::{bail, Context, Result};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::thread;
use std::time::{Duration, Instant};

/// The rank side of each veth.
pub const RANK_DEV: &str = "eth0";
/// How long children get between SIGTERM and SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(3);

/// The switch side of rank `i`'s veth (in the switch namespace): its egress is the switch
/// port towards rank `i`.
pub fn switch_port(i: usize) -> String {
    format!("v{i}")
}

/// Address of rank `i`: 10.232.0.(i+1).
pub fn rank_addr(i: usize) -> Ipv4Addr {
    assert!(i < 254);
    Ipv4Addr::new(10, 232, 0, i as u8 + 1)
}

/// The switch's own address on its bridge (`--prometheus`: where the lab's Prometheus
/// scrapes the ranks from, as a monitoring host on the same network would).
pub fn switch_addr() -> Ipv4Addr {
    Ipv4Addr::new(10, 232, 0, 254)
}

/// tbf burst for a rate: 4 ms worth of bytes, at least 128 KiB.
///
/// The floor matters. tbf checks a packet against its burst only when it is enqueued; a
/// packet longer than the burst that is already queued when the rate is tightened can
/// never gather enough tokens and blocks the queue until the burst grows again (seen: a
/// 2.5 s total stall). A veth GSO super-packet counts up to 64 KiB of payload plus the
/// headers of every segment (about 68 KiB), so every burst the lab uses stays above that.
pub fn tbf_burst_bytes(rate_mbit: u32) -> u64 {
    (u64::from(rate_mbit) * 1_000_000 / 8 / 250).max(128 * 1024)
}

/// The rate a tbf is opened to so that it empties before it is deleted (far above what a
/// veth carries here).
const DRAIN_MBIT: u32 = 10_000;

/// Queueing delay a tbf may add before it drops (the queue it holds), unless the run sets
/// another (`--queue-ms`).
pub const TBF_LATENCY_MS: u32 = 50;
static QUEUE_MS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(TBF_LATENCY_MS);

/// The tbf queue limit of this run, in ms: one per process, like the lab itself.
pub fn queue_ms() -> u32 {
    QUEUE_MS.load(std::sync::atomic::Ordering::Relaxed)
}

pub fn set_queue_ms(ms: u32) {
    QUEUE_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
}

/// A process the lab started.
struct Proc {
    label: String,
    child: Child,
    status: Option<std::process::ExitStatus>,
}

/// Handle to a process started with [`Lab::spawn`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcId(usize);

pub struct Lab {
    prefix: String,
    ranks: usize,
    /// Namespaces this lab created, in creation order.
    namespaces: Vec<String>,
    procs: Vec<Proc>,
    /// cgroup v2 directories this lab created (`lab<pid>`, then one per rank), when each
    /// rank is a host of its own (`--probe-per-rank`).
    cgroups: Vec<PathBuf>,
    torn_down: bool,
}

impl Lab {
    /// A lab named after this process: namespaces `lab<pid>-sw` and `lab<pid>-r<i>`.
    pub fn new(ranks: usize) -> Self {
        Self {
            prefix: format!("lab{}", std::process::id()),
            ranks,
            namespaces: Vec::new(),
            procs: Vec::new(),
            cgroups: Vec::new(),
            torn_down: false,
        }
    }

    pub fn switch_ns(&self) -> String {
        format!("{}-sw", self.prefix)
    }

    pub fn rank_ns(&self, i: usize) -> String {
        format!("{}-r{i}", self.prefix)
    }

    /// Gives the switch namespace an address on the ranks' network (its bridge).
    pub fn address_switch(&self) -> Result<()> {
        let addr = format!("{}/24", switch_addr());
        cmd::run(&[
            "ip",
            "-n",
            &self.switch_ns(),
            "addr",
            "add",
            &addr,
            "dev",
            "br0",
        ])?;
        Ok(())
    }

    /// A cgroup per rank, `<cgroup v2 mount>/lab<pid>/r<i>`, so that each rank's probe can
    /// watch that rank's sockets only (`probe run --cgroup`), as on a host of its own.
    pub fn make_rank_cgroups(&mut self) -> Result<()> {
        let root = cgroup2_mount()?.join(&self.prefix);
        std::fs::create_dir(&root)
            .with_context(|| format!("creating cgroup {}", root.display()))?;
        self.cgroups.push(root.clone());
        for i in 0..self.ranks {
            let dir = root.join(format!("r{i}"));
            std::fs::create_dir(&dir)
                .with_context(|| format!("creating cgroup {}", dir.display()))?;
            self.cgroups.push(dir);
        }
        Ok(())
    }

    /// Rank `i`'s cgroup, if the lab made them.
    pub fn rank_cgroup(&self, i: usize) -> Option<PathBuf> {
        (!self.cgroups.is_empty()).then(|| self.cgroups[0].join(format!("r{i}")))
    }

    /// The lab's cgroup directory, relative to the cgroup v2 mount (`lab<pid>`).
    pub fn cgroup_prefix(&self) -> &str {
        &self.prefix
    }

    /// With several jobs (`--jobs`): below each host's cgroup one per job running there and
    /// one per rank in it, `lab<pid>/r<host>/<job>/rank<rank>`, as a scheduler lays out the
    /// jobs it puts on a node. After `make_rank_cgroups`.
    pub fn make_job_cgroups(&mut self, jobs: &[super::JobPlan]) -> Result<()> {
        for job in jobs {
            for (r, &host) in job.hosts.iter().enumerate() {
                let Some(host_dir) = self.rank_cgroup(host) else {
                    bail!("the rank cgroups are made first");
                };
                let job_dir = host_dir.join(&job.name);
                for dir in [job_dir.clone(), job_dir.join(format!("rank{r}"))] {
                    std::fs::create_dir(&dir)
                        .with_context(|| format!("creating cgroup {}", dir.display()))?;
                    self.cgroups.push(dir);
                }
            }
        }
        Ok(())
    }

    /// Rank `rank` of `job`'s cgroup on host `host`, if the lab made it.
    pub fn job_cgroup(&self, host: usize, job: &str, rank: usize) -> Option<PathBuf> {
        let dir = self
            .rank_cgroup(host)?
            .join(job)
            .join(format!("rank{rank}"));
        self.cgroups.contains(&dir).then_some(dir)
    }

    fn add_ns(&mut self, name: String) -> Result<()> {
        cmd::run(&["ip", "netns", "add", &name]).with_context(|| {
            format!(
                "creating namespace {name} (a leftover of a killed lab? `cargo xtask lab --clean`)"
            )
        })?;
        self.namespaces.push(name);
        Ok(())
    }

    /// Builds the switch and the ranks. `link_mbit` > 0 puts a tbf of that rate on every
    /// rank's egress (the base link speed).
    pub fn build(&mut self, link_mbit: u32) -> Result<()> {
        let sw = self.switch_ns();
        self.add_ns(sw.clone())?;
        cmd::run(&["ip", "-n", &sw, "link", "set", "lo", "up"])?;
        cmd::run(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        cmd::run(&["ip", "-n", &sw, "link", "set", "br0", "up"])?;
        for i in 0..self.ranks {
            let ns = self.rank_ns(i);
            self.add_ns(ns.clone())?;
            let port = switch_port(i);
            let addr = format!("{}/24", rank_addr(i));
            // The veth is created inside the switch namespace with its peer moved straight
            // into the rank's namespace: no interface ever appears in the host namespace.
            cmd::run(&[
                "ip", "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", RANK_DEV,
                "netns", &ns,
            ])?;
            cmd::run(&["ip", "-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
            cmd::run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            cmd::run(&["ip", "-n", &ns, "addr", "add", &addr, "dev", RANK_DEV])?;
            cmd::run(&["ip", "-n", &ns, "link", "set", RANK_DEV, "up"])?;
            if link_mbit > 0 {
                set_tbf(&ns, link_mbit)?;
            }
        }
        Ok(())
    }

    /// Starts `c` (already aimed at a namespace) in its own process group and keeps it for
    /// cleanup.
    pub fn spawn(&mut self, label: &str, mut c: Command) -> Result<ProcId> {
        use std::os::unix::process::CommandExt;
        let child = c
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {label}"))?;
        self.procs.push(Proc {
            label: label.to_string(),
            child,
            status: None,
        });
        Ok(ProcId(self.procs.len() - 1))
    }

    /// The exit status of a process, if it has exited.
    pub fn poll(&mut self, id: ProcId) -> Option<std::process::ExitStatus> {
        let p = &mut self.procs[id.0];
        if p.status.is_none() {
            p.status = p.child.try_wait().ok().flatten();
        }
        p.status
    }

    /// The pid of a process started with [`Lab::spawn`].
    pub fn pid(&self, id: ProcId) -> u32 {
        self.procs[id.0].child.id()
    }

    pub fn label(&self, id: ProcId) -> &str {
        &self.procs[id.0].label
    }

    /// Stops a process: SIGTERM, then SIGKILL after `grace`. Returns its exit status.
    pub fn stop(&mut self, id: ProcId, grace: Duration) -> Option<std::process::ExitStatus> {
        if let Some(s) = self.poll(id) {
            return Some(s);
        }
        cmd::signal(self.procs[id.0].child.id(), libc::SIGTERM);
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if let Some(s) = self.poll(id) {
                return Some(s);
            }
            thread::sleep(Duration::from_millis(20));
        }
        let p = &mut self.procs[id.0];
        let _ = p.child.kill();
        p.status = p.child.wait().ok();
        p.status
    }

    /// Stops several processes together: SIGTERM to all, then SIGKILL to those still there
    /// after `grace`.
    pub fn stop_all(&mut self, ids: &[ProcId], grace: Duration) {
        for &id in ids {
            if self.poll(id).is_none() {
                cmd::signal(self.procs[id.0].child.id(), libc::SIGTERM);
            }
        }
        let until = Instant::now() + grace;
        for &id in ids {
            let left = until.saturating_duration_since(Instant::now());
            if self.wait(id, left).is_none() {
                self.stop(id, Duration::ZERO);
            }
        }
    }

    /// Waits up to `timeout` for a process to exit by itself.
    pub fn wait(&mut self, id: ProcId, timeout: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(s) = self.poll(id) {
                return Some(s);
            }
            if Instant::now() >= until {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops every process, kills whatever else still runs inside the lab's namespaces,
    /// and deletes the namespaces (which takes the veths, bridge, qdiscs and nft tables
    /// with them). Returns the problems met; safe to call twice.
    pub fn teardown(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.torn_down
            || (self.namespaces.is_empty() && self.procs.is_empty() && self.cgroups.is_empty())
        {
            return problems;
        }
        self.torn_down = true;
        // 1. Our own children: SIGTERM all at once, then SIGKILL the stragglers.
        for p in &mut self.procs {
            if p.status.is_none() && p.child.try_wait().ok().flatten().is_none() {
                cmd::signal(p.child.id(), libc::SIGTERM);
            }
        }
        let until = Instant::now() + TERM_GRACE;
        for p in &mut self.procs {
            loop {
                match p.child.try_wait() {
                    Ok(Some(s)) => {
                        p.status.get_or_insert(s);
                        break;
                    }
                    Ok(None) if Instant::now() < until => thread::sleep(Duration::from_millis(20)),
                    _ => {
                        let _ = p.child.kill();
                        let _ = p.child.wait();
                        problems.push(format!("{} needed SIGKILL", p.label));
                        break;
                    }
                }
            }
        }
        // 2. Anything else inside our namespaces (they are ours alone).
        for ns in &self.namespaces {
            if let Ok(out) = cmd::run(&["ip", "netns", "pids", ns]) {
                for pid in out.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
                    cmd::signal(pid, libc::SIGKILL);
                    problems.push(format!("killed stray pid {pid} in {ns}"));
                }
            }
        }
        // 2b. Our cgroups: kill what is left in them (cgroup.kill, kernels >= 5.14), then
        // remove them, ranks first.
        for dir in self.cgroups.iter().rev() {
            let _ = std::fs::write(dir.join("cgroup.kill"), "1");
            let until = Instant::now() + TERM_GRACE;
            while std::fs::remove_dir(dir).is_err() {
                if Instant::now() >= until {
                    problems.push(format!("cgroup {} is still there", dir.display()));
                    break;
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        // 3. The namespaces, ranks first, then the switch.
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = cmd::run(&["ip", "netns", "del", ns]) {
                problems.push(format!("{e:#}"));
            }
        }
        if let Ok(left) = list_namespaces() {
            for ns in left.iter().filter(|n| self.namespaces.contains(n)) {
                problems.push(format!("namespace {ns} is still there"));
            }
        }
        problems
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for p in self.teardown() {
            eprintln!("lab cleanup: {p}");
        }
    }
}

/// `tc qdisc replace ... root tbf` on a rank's egress.
pub fn set_tbf(ns: &str, rate_mbit: u32) -> Result<()> {
    set_tbf_on(ns, RANK_DEV, rate_mbit)
}

/// `tc qdisc replace ... root tbf` on `dev` in `ns`.
pub fn set_tbf_on(ns: &str, dev: &str, rate_mbit: u32) -> Result<()> {
    let rate = format!("{rate_mbit}mbit");
    let burst = tbf_burst_bytes(rate_mbit).to_string();
    let latency = format!("{}ms", queue_ms());
    cmd::run(&[
        "tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", &rate, "burst",
        &burst, "latency", &latency,
    ])?;
    Ok(())
}

/// Removes the root qdisc of a rank's egress (back to the default).
pub fn clear_root_qdisc(ns: &str) -> Result<()> {
    clear_root_qdisc_on(ns, RANK_DEV)
}

/// Removes the root qdisc of `dev` in `ns` (back to the default).
///
/// Deleting a qdisc drops whatever it holds (up to 50 ms of a tbf's queue: hundreds of
/// retransmits after the episode is over), so a tbf is first opened wide and given up to a
/// second to empty.
pub fn clear_root_qdisc_on(ns: &str, dev: &str) -> Result<()> {
    set_tbf_on(ns, dev, DRAIN_MBIT)?;
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        let empty = super::observe::root_qdisc(ns, dev).is_ok_and(|(q, _)| q.backlog == 0);
        if empty {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    cmd::run(&["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"])?;
    Ok(())
}

/// Names of all network namespaces (`ip netns list`).
pub fn list_namespaces() -> Result<Vec<String>> {
    let out = cmd::run(&["ip", "netns", "list"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// The pid in a lab namespace name (`lab<pid>-sw`, `lab<pid>-r<i>`), if it is one.
pub fn lab_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("lab")?;
    let (pid, tail) = rest.split_once('-')?;
    let ok_tail = tail == "sw"
        || tail
            .strip_prefix('r')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if !ok_tail || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Lab namespaces whose lab process is gone (left by a SIGKILLed lab).
pub fn stale_namespaces() -> Result<Vec<String>> {
    Ok(list_namespaces()?
        .into_iter()
        .filter(|n| lab_pid(n).is_some_and(|pid| !cmd::pid_alive(pid)))
        .collect())
}

/// Removes stale lab namespaces and the processes inside them.
pub fn clean_stale() -> Result<usize> {
    let stale = stale_namespaces()?;
    for ns in &stale {
        if let Ok(out) = cmd::run(&["ip", "netns", "pids", ns]) {
            for pid in out.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
                cmd::signal(pid, libc::SIGKILL);
            }
        }
    }
    // Ranks before switches, as the lab itself does.
    let mut order = stale.clone();
    order.sort_by_key(|n| n.ends_with("-sw"));
    for ns in &order {
        cmd::run(&["ip", "netns", "del", ns])?;
        eprintln!("removed stale namespace {ns}");
    }
    if list_namespaces()?.iter().any(|n| stale.contains(n)) {
        bail!("some stale namespaces could not be removed");
    }
    Ok(stale.len() + clean_stale_cgroups())
}

/// Removes the rank cgroups (`lab<pid>/r<i>`) of labs that are gone; how many labs' were.
fn clean_stale_cgroups() -> usize {
    let Ok(root) = cgroup2_mount() else { return 0 };
    let Ok(entries) = std::fs::read_dir(&root) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("lab").and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if cmd::pid_alive(pid) {
            continue;
        }
        let dir = e.path();
        let _ = std::fs::write(dir.join("cgroup.kill"), "1");
        if remove_cgroup_tree(&dir) {
            eprintln!("removed stale cgroup {}", dir.display());
            removed += 1;
        }
    }
    removed
}

/// Removes a cgroup and every cgroup below it (ranks, and jobs' ranks, before their
/// parents); whether it is gone.
fn remove_cgroup_tree(dir: &std::path::Path) -> bool {
    if let Ok(children) = std::fs::read_dir(dir) {
        for c in children.flatten().filter(|c| c.path().is_dir()) {
            remove_cgroup_tree(&c.path());
        }
    }
    std::fs::remove_dir(dir).is_ok()
}

/// The cgroup v2 mount (needed for --probe-per-rank).
pub fn cgroup2_mount() -> Result<PathBuf> {
    probe_tests::cgroup::cgroup2_mount().context("no cgroup v2 mount (needed for --probe-per-rank)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_namespace_names() {
        assert_eq!(lab_pid("lab123-sw"), Some(123));
        assert_eq!(lab_pid("lab123-r0"), Some(123));
        assert_eq!(lab_pid("lab9-r17"), Some(9));
        for other in [
            "prb12_0",
            "lab-r0",
            "lab12-r",
            "lab12-rx",
            "lab12-sw2",
            "lab12",
            "xlab1-sw",
        ] {
            assert_eq!(lab_pid(other), None, "{other}");
        }
        let lab = Lab::new(2);
        assert_eq!(lab_pid(&lab.rank_ns(1)), Some(std::process::id()));
        assert_eq!(lab_pid(&lab.switch_ns()), Some(std::process::id()));
    }

    #[test]
    fn addresses_and_bursts() {
        assert_eq!(rank_addr(0), Ipv4Addr::new(10, 232, 0, 1));
        assert_eq!(rank_addr(3), Ipv4Addr::new(10, 232, 0, 4));
        assert_eq!(tbf_burst_bytes(1000), 500_000);
        assert_eq!(tbf_burst_bytes(10), 128 * 1024);
        assert_eq!(tbf_burst_bytes(125), 128 * 1024);
    }
}

//! `probe run --check`: what `probe run` would find on this host and what it would attach,
//! without changing anything (no program loaded, nothing mounted or attached). Each line is
//! ok, warn (probe runs, with something off) or FAIL (probe would not start); any FAIL makes
//! the exit status 1.
use std::{net::TcpListener, path::Path};

use anyhow::{bail, Result};

use crate::{
    bpf::{load::TRACEPOINTS, tc::Mode},
    config::{Config, MapWalk},
    export::webconfig::WebConfig,
    host::{cgroup, iface, jobs, privilege, tracefs},
    model::score::Bound,
};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Ok,
    Warn,
    Fail,
}

struct Report {
    lines: Vec<(Level, &'static str, String)>,
}

impl Report {
    fn add(&mut self, level: Level, what: &'static str, detail: impl Into<String>) {
        self.lines.push((level, what, detail.into()));
    }
}

/// The oldest kernel the eBPF object loads on as built: mmapable arrays (5.5) and BPF atomics
/// with fetch (5.12), which the burst-end rings use.
const MIN_KERNEL: (u32, u32) = (5, 12);

/// (major, minor) of a kernel release string such as "6.18.44-cloud-amd64".
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

pub fn main(cfg: &Config, web: &WebConfig, model: Option<&Bound>) -> Result<()> {
    let mut r = Report { lines: Vec::new() };
    settings(&mut r, cfg, web, model);
    let sys_admin = host(&mut r, cfg);
    let tracepoints = tracepoints(&mut r, sys_admin, cfg.cgroup.is_some());
    let (mode, selected) = attachment(&mut r, cfg);
    r.print(&selected, mode, &tracepoints, cfg.cgroup.as_deref())
}

/// The settings: config, model, web and whether the listen address is free.
fn settings(r: &mut Report, cfg: &Config, web: &WebConfig, model: Option<&Bound>) {
    r.add(
        Level::Ok,
        "config",
        format!(
            "tick {:?}, listen {}, top_peers {}, maps flows {} conns {} peers {}",
            cfg.tick,
            cfg.listen,
            cfg.top_peers,
            cfg.maps.flows,
            cfg.maps.conns,
            // What the loader asks for: the default depends on the possible CPUs.
            cfg.maps.peers_for(aya::util::nr_cpus().unwrap_or(1))
        ),
    );
    match model {
        Some(b) => {
            let i = b.info();
            r.add(
                Level::Ok,
                "model",
                format!("{} from {}: {} models", i.model, i.source, i.models),
            );
        }
        None => r.add(
            Level::Warn,
            "model",
            "none (no built-in model and no --model): no spike probabilities or forecasts",
        ),
    }
    r.add(
        Level::Ok,
        "web",
        format!(
            "{}{}{}",
            if web.tls.is_some() { "https" } else { "http" },
            if web.auth.is_some() {
                ", basic auth"
            } else {
                ", no auth"
            },
            if cfg.snapshot_api {
                ", /api/v1/snapshot on"
            } else {
                ", /api/v1/snapshot off"
            }
        ),
    );
    match TcpListener::bind(cfg.listen) {
        Ok(_) => r.add(Level::Ok, "listen", format!("{} is free", cfg.listen)),
        Err(e) => r.add(Level::Fail, "listen", format!("{}: {e}", cfg.listen)),
    }
}

/// Privileges, kernel, BTF and cgroup v2; whether probe has CAP_SYS_ADMIN.
fn host(r: &mut Report, cfg: &Config) -> bool {
    let sys_admin = privilege::has_sys_admin();
    match privilege::check() {
        Ok(()) if sys_admin => r.add(Level::Ok, "privileges", "CAP_SYS_ADMIN (all of them)"),
        Ok(()) => r.add(
            Level::Warn,
            "privileges",
            "CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON; without CAP_SYS_ADMIN: no BPF run-time statistics and no tracefs mount",
        ),
        Err(e) => r.add(Level::Fail, "privileges", format!("{e:#}")),
    }

    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| format!("unknown ({e})"));
    match kernel_version(&release) {
        Some(v) if v < MIN_KERNEL => r.add(
            Level::Warn,
            "kernel",
            format!(
                "{release}: the eBPF programs need Linux >= {}.{} (mmapable arrays, BPF atomics with fetch) and will not load unless those were backported",
                MIN_KERNEL.0, MIN_KERNEL.1
            ),
        ),
        _ => r.add(Level::Ok, "kernel", release.clone()),
    }
    map_walk(r, cfg, kernel_version(&release));
    if Path::new("/sys/kernel/btf/vmlinux").is_file() {
        r.add(Level::Ok, "BTF", "/sys/kernel/btf/vmlinux");
    } else {
        r.add(
            Level::Fail,
            "BTF",
            "no /sys/kernel/btf/vmlinux: the eBPF object needs a kernel built with CONFIG_DEBUG_INFO_BTF",
        );
    }
    match cgroup::sock_ops_cgroup(cfg.cgroup.as_deref()) {
        Ok(p) if cfg.cgroup.is_some() => r.add(
            Level::Ok,
            "cgroup v2",
            format!("{} (scoped: sock_ops attaches to this cgroup)", p.display()),
        ),
        Ok(p) => r.add(
            Level::Ok,
            "cgroup v2",
            format!("{} (sock_ops attaches to its root)", p.display()),
        ),
        // A scope that does not exist is a typo: probe run refuses it.
        Err(e) if cfg.cgroup.is_some() => r.add(Level::Fail, "cgroup v2", format!("{e:#}")),
        Err(e) => r.add(
            Level::Warn,
            "cgroup v2",
            format!("{e:#}; per-connection RTT would be off"),
        ),
    }
    training_jobs(r, cfg);
    sys_admin
}

/// How each connection's training job would be found (docs/job.md).
fn training_jobs(r: &mut Report, cfg: &Config) {
    let j = &cfg.jobs;
    let line = match &cfg.training_job {
        Some(name) => format!("every connection's is {name:?} (--training-job)"),
        None if !j.builtin && j.from_cgroup.is_empty() => {
            "none: jobs.builtin = false and no job_from_cgroup".to_owned()
        }
        None => {
            let mut ways: Vec<String> = j
                .from_cgroup
                .iter()
                .map(|p| format!("{:?}", p.to_string()))
                .collect();
            if j.builtin {
                let pods = jobs::pod_names(&j.pod_logs).len();
                ways.push(format!(
                    "Kubernetes pods ({pods} pod log directories in {})",
                    j.pod_logs.display()
                ));
                ways.push("Slurm jobs".to_owned());
            }
            format!("from each socket's cgroup: {}", ways.join(", then "))
        }
    };
    r.add(Level::Ok, "training jobs", line);
}

/// How the flow and connection maps would be walked (`[maps] walk`).
fn map_walk(r: &mut Report, cfg: &Config, kernel: Option<(u32, u32)>) {
    match cfg.maps.walk {
        MapWalk::Batch => r.add(
            Level::Ok,
            "map walk",
            "batch lookups of every entry ([maps] walk = \"batch\")",
        ),
        // bpf_for_each_map_elem, which the selection programs call.
        MapWalk::Select if kernel.is_some_and(|v| v < (5, 13)) => r.add(
            Level::Warn,
            "map walk",
            "the selection programs need Linux >= 5.13 (bpf_for_each_map_elem): probe run would walk the maps with batch lookups of every entry",
        ),
        MapWalk::Select => r.add(
            Level::Ok,
            "map walk",
            "selected in the kernel (programs select_flows, select_conns, run on demand); batch lookups if the kernel refuses them",
        ),
    }
}

/// tracefs, without mounting it, and the tracepoints whose formats it has.
fn tracepoints(r: &mut Report, sys_admin: bool, scoped: bool) -> Vec<String> {
    let root = tracefs::mounted();
    match &root {
        Some(p) => r.add(Level::Ok, "tracefs", p.display().to_string()),
        None if sys_admin => r.add(
            Level::Ok,
            "tracefs",
            "not mounted; probe run mounts it at /sys/kernel/tracing",
        ),
        None if tracefs_in_mount_table() => r.add(
            Level::Warn,
            "tracefs",
            "mounted, but its events/ is not readable by this user: every tracepoint would be off",
        ),
        None => r.add(
            Level::Warn,
            "tracefs",
            "not mounted, and mounting it needs CAP_SYS_ADMIN: every tracepoint would be off (mount -t tracefs tracefs /sys/kernel/tracing)",
        ),
    }
    let mut tracepoints = Vec::new();
    for tp in TRACEPOINTS.iter().filter(|tp| !(scoped && tp.host_wide)) {
        let Some(root) = &root else { continue };
        match tracefs::EventFormat::read(root, tp.category, tp.event) {
            Ok(_) => tracepoints.push(format!("{}:{}", tp.category, tp.event)),
            Err(e) => r.add(Level::Warn, "tracepoint", format!("{e:#}: {}", tp.lost)),
        }
    }
    tracepoints
}

/// How TC programs would attach, and to which interfaces; RDMA devices.
fn attachment(r: &mut Report, cfg: &Config) -> (&'static str, Result<Vec<String>>) {
    let mode = match Mode::resolve(cfg.tc_attach) {
        Ok(Mode::Tcx) => "TCX links",
        Ok(Mode::Netlink) => "netlink filters on a clsact qdisc",
        Err(e) => {
            r.add(Level::Fail, "tc", format!("{e:#}"));
            "none"
        }
    };

    let selected = interfaces(cfg);
    match &selected {
        Ok(names) if names.is_empty() => r.add(
            Level::Warn,
            "interfaces",
            "none matches (or none is up): TCP metrics only until one appears",
        ),
        Ok(names) => r.add(Level::Ok, "interfaces", names.join(", ")),
        Err(e) => r.add(Level::Fail, "interfaces", format!("{e:#}")),
    }
    if cfg.rdma.enabled {
        let root = &cfg.rdma.poller.sysfs_root;
        let devices: Vec<String> = std::fs::read_dir(root)
            .map(|d| {
                d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                    .collect()
            })
            .unwrap_or_default();
        if devices.is_empty() {
            r.add(
                Level::Ok,
                "rdma",
                format!("no device under {}", root.display()),
            );
        } else {
            r.add(Level::Ok, "rdma", devices.join(", "));
        }
    }
    (mode, selected)
}

impl Report {
    /// Prints the checks and what would attach; an error names the failed checks.
    fn print(
        &self,
        selected: &Result<Vec<String>>,
        mode: &str,
        tracepoints: &[String],
        scope: Option<&std::path::Path>,
    ) -> Result<()> {
        for (level, what, detail) in &self.lines {
            let tag = match level {
                Level::Ok => "ok  ",
                Level::Warn => "warn",
                Level::Fail => "FAIL",
            };
            println!("{tag}  {what:<11} {detail}");
        }
        let mut attach = Vec::new();
        if let Ok(names) = selected {
            if !names.is_empty() {
                attach.push(format!(
                    "TC ingress and egress programs on {} ({mode})",
                    names.join(", ")
                ));
            }
        }
        attach.push(match scope {
            Some(dir) => format!(
                "sock_ops on cgroup {} (scoped: no host-wide tracepoints)",
                dir.display()
            ),
            None => "sock_ops on the cgroup v2 root".into(),
        });
        if !tracepoints.is_empty() {
            attach.push(format!("tracepoints {}", tracepoints.join(", ")));
        }
        println!("would attach: {}", attach.join("; "));

        let fails: Vec<&str> = self
            .lines
            .iter()
            .filter(|l| l.0 == Level::Fail)
            .map(|l| l.1)
            .collect();
        let warns = self.lines.iter().filter(|l| l.0 == Level::Warn).count();
        if !fails.is_empty() {
            bail!("probe run would not start here: {}", fails.join(", "));
        }
        println!("ready ({warns} warning(s))");
        Ok(())
    }
}

/// The interfaces `probe run` would attach to now.
fn interfaces(cfg: &Config) -> Result<Vec<String>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (conn, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(conn);
        let all = iface::from_dump(&iface::dump(&handle).await?);
        Ok(iface::select(cfg, &all)?
            .into_iter()
            .map(|i| i.name)
            .collect())
    })
}

fn tracefs_in_mount_table() -> bool {
    std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split_whitespace().nth(2) == Some("tracefs"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_compare_by_major_then_minor() {
        assert_eq!(kernel_version("6.18.44-cloud-amd64"), Some((6, 18)));
        assert_eq!(kernel_version("5.4.0-150-generic"), Some((5, 4)));
        assert_eq!(kernel_version("4.18.0-553.el8_10.x86_64"), Some((4, 18)));
        assert_eq!(kernel_version("unknown (No such file)"), None);
        assert!(kernel_version("5.10.0").unwrap() < MIN_KERNEL);
        assert!(kernel_version("5.12.1").unwrap() >= MIN_KERNEL);
        assert!(kernel_version("6.1.0").unwrap() >= MIN_KERNEL);
    }
}

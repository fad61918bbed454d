//! Loads the object with its globals patched, and attaches the host-wide hooks (sock_ops on
//! the cgroup v2 root, the retransmit tracepoint). Each hook that cannot attach is reported
//! by name and left out; the TC data plane is the only hook probe cannot run without.
use std::{fs::File, os::fd::OwnedFd};

use anyhow::{anyhow, Context as _, Result};
use aya::{
    programs::{links::CgroupAttachMode, SockOps, TracePoint},
    Ebpf, EbpfLoader,
};
use probe_ebpf::{globals, names};

use crate::{
    config::Config,
    host::{cgroup, tracefs},
};

/// The compiled eBPF object, embedded at build time by build.rs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/probe"));

/// Which host-wide hooks are attached. Exported as probe_hook_attached{hook}.
#[derive(Debug, Clone, Default)]
pub struct Hooks {
    pub sock_ops: bool,
    pub tcp_retransmit: bool,
    pub bpf_stats: bool,
}

pub struct Loaded {
    pub ebpf: Ebpf,
    pub hooks: Hooks,
    /// Holding this fd keeps the kernel's run-time statistics on; the kernel turns them off
    /// again when the last holder closes it, even if probe is killed.
    _stats: Option<OwnedFd>,
}

/// The first line of an error and its causes: a verifier log can run to thousands of lines.
pub fn first_line<E: std::error::Error + Send + Sync + 'static>(e: E) -> String {
    format!("{:#}", anyhow::Error::new(e))
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

impl Loaded {
    pub fn load(cfg: &Config) -> Result<Self> {
        let tracefs_root = tracefs::root();
        let retx = tracefs_root
            .as_ref()
            .map_err(|e| anyhow!("{e:#}"))
            .and_then(|root| tracefs::event_fields(root, "tcp", "tcp_retransmit_skb"));

        let gap_ns = u64::try_from(cfg.burst_gap.as_nanos()).unwrap_or(u64::MAX);
        let mut loader = EbpfLoader::new();
        loader
            .override_global(globals::BURST_GAP_NS, &gap_ns, true)
            .map_max_entries(names::FLOWS, cfg.maps.flows)
            .map_max_entries(names::CONNS, cfg.maps.conns)
            .map_max_entries(names::PEER_TCP, cfg.maps.peers);
        // Offsets are u32 globals; leaving them 0 disables the tracepoint program's work.
        let mut offsets = Vec::new();
        if let Ok(fields) = &retx {
            for (global, field) in [
                (globals::RETX_OFF_FAMILY, "family"),
                (globals::RETX_OFF_SPORT, "sport"),
                (globals::RETX_OFF_DPORT, "dport"),
                (globals::RETX_OFF_SADDR, "saddr"),
                (globals::RETX_OFF_DADDR, "daddr"),
                (globals::RETX_OFF_SADDR_V6, "saddr_v6"),
                (globals::RETX_OFF_DADDR_V6, "daddr_v6"),
            ] {
                let off = fields.get(field).map(|(o, _)| *o).unwrap_or(0);
                offsets.push((global, off));
            }
        }
        for (global, off) in &offsets {
            loader.override_global(global, off, true);
        }
        let mut ebpf = loader.load(OBJECT).map_err(|e| {
            anyhow!(
                "loading the eBPF object failed: {} (the kernel needs BTF and BPF support; run with --log debug for details)",
                first_line(e)
            )
        })?;
        tracing::debug!("eBPF object loaded ({} bytes)", OBJECT.len());

        let mut hooks = Hooks::default();
        match attach_sock_ops(&mut ebpf) {
            Ok(path) => {
                hooks.sock_ops = true;
                tracing::info!("sock_ops attached to cgroup v2 root {}", path);
            }
            Err(e) => tracing::warn!(
                "per-connection RTT is off: sock_ops could not attach: {e:#}; flow accounting and retransmits still work"
            ),
        }
        match retx.and_then(|_| attach_tracepoint(&mut ebpf)) {
            Ok(()) => hooks.tcp_retransmit = true,
            Err(e) => tracing::warn!(
                "retransmits of sockets opened before probe started are not counted: tracepoint tcp:tcp_retransmit_skb could not attach: {e:#}"
            ),
        }

        let stats = if crate::host::privilege::has_sys_admin() {
            match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
                Ok(fd) => {
                    hooks.bpf_stats = true;
                    Some(fd)
                }
                Err(e) => {
                    tracing::warn!("BPF run-time statistics are off: {e}");
                    None
                }
            }
        } else {
            tracing::warn!("BPF run-time statistics need CAP_SYS_ADMIN; probe_bpf_run_seconds_total stays 0");
            None
        };
        Ok(Self {
            ebpf,
            hooks,
            _stats: stats,
        })
    }
}

fn attach_sock_ops(ebpf: &mut Ebpf) -> Result<String> {
    let root = cgroup::cgroup2_mount()?;
    let cg = File::open(&root).with_context(|| format!("opening {}", root.display()))?;
    let prog: &mut SockOps = ebpf
        .program_mut(names::SOCK_OPS)
        .context("sock_ops program missing from the object")?
        .try_into()?;
    prog.load().map_err(|e| {
        tracing::debug!("{e}");
        anyhow!("kernel rejected sock_ops: {}", first_line(e))
    })?;
    // A BPF link (kernel >= 5.7) coexists with other programs on the cgroup whatever the
    // mode, and the kernel rejects link flags for cgroups: Single is the mode that works.
    prog.attach(cg, CgroupAttachMode::Single)
        .map_err(|e| anyhow!("attaching sock_ops: {}", first_line(e)))?;
    Ok(root.display().to_string())
}

fn attach_tracepoint(ebpf: &mut Ebpf) -> Result<()> {
    let prog: &mut TracePoint = ebpf
        .program_mut(names::TCP_RETRANSMIT)
        .context("tracepoint program missing from the object")?
        .try_into()?;
    prog.load()
        .map_err(|e| anyhow!("kernel rejected the tracepoint program: {}", first_line(e)))?;
    prog.attach("tcp", "tcp_retransmit_skb")
        .map_err(|e| anyhow!("{}", first_line(e)))?;
    Ok(())
}

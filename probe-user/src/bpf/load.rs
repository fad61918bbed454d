//! Loads the object with its globals patched, and attaches the host-wide hooks (sock_ops on
//! the cgroup v2 root, the retransmit tracepoint). Each hook that cannot attach is reported
//! by name and left out; the TC data plane is the only hook probe cannot run without.
use std::{collections::HashMap, fs::File, os::fd::OwnedFd, path::Path};

use anyhow::{anyhow, Context as _, Result};
use aya::{
    programs::{links::CgroupAttachMode, RawTracePoint, SockOps, TracePoint},
    Ebpf, EbpfLoader,
};
use probe_ebpf::{globals, names};

use crate::{
    config::{Config, MapWalk},
    host::{
        cgroup,
        tracefs::{self, EventFormat},
    },
};

/// The compiled eBPF object, embedded at build time by build.rs.
pub(crate) static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/probe-ebpf"));

/// The programs run on this machine's CPU: on x86-64 they publish a burst-end ring's head
/// with a plain store (see probe_ebpf::RingPos).
const STORES_ARE_ORDERED: u32 = cfg!(target_arch = "x86_64") as u32;

/// Which host-wide hooks are attached. Exported as probe_hook_attached{hook}.
#[derive(Debug, Clone, Default)]
pub struct Hooks {
    /// Scoped to a cgroup (`--cgroup`): the host-wide tracepoints are left out on purpose,
    /// so they are not reported as missing.
    pub scoped: bool,
    pub sock_ops: bool,
    pub tcp_retransmit: bool,
    pub kfree_skb: bool,
    pub qdisc: bool,
    pub bpf_stats: bool,
    /// `[maps] walk` asked for the selection iterators.
    pub map_select_wanted: bool,
    /// The selection iterators loaded (the collector links them to their maps).
    pub map_select: bool,
}

pub struct Loaded {
    pub ebpf: Ebpf,
    pub hooks: Hooks,
    /// Drop reason value -> the kernel's name for it, from the kfree_skb print format.
    pub drop_reasons: HashMap<u32, String>,
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
        let tp = TracepointOffsets::read();
        let mut ebpf = load_object(cfg, &tp)?;
        let mut hooks = attach(&mut ebpf, tp.results, cfg.cgroup.as_deref());
        let stats = enable_stats(&mut hooks);
        if cfg.maps.walk == MapWalk::Select {
            hooks.map_select_wanted = true;
            match load_selection(&mut ebpf) {
                Ok(()) => hooks.map_select = true,
                Err(e) => tracing::warn!(
                    "the flow and connection maps are walked with batch lookups (every entry copied): {e:#}"
                ),
            }
        }
        Ok(Self {
            ebpf,
            hooks,
            drop_reasons: tp.drop_reasons,
            _stats: stats,
        })
    }
}

/// Each tracepoint's field offsets, from tracefs, which become globals of its program (a 0
/// offset leaves that program idle), or why they could not be read.
struct TracepointOffsets {
    /// tcp_retransmit_skb, kfree_skb, qdisc_dequeue (the order of `TRACEPOINTS`).
    results: [Result<Vec<(&'static str, u32)>>; 3],
    drop_reasons: HashMap<u32, String>,
}

impl TracepointOffsets {
    fn read() -> Self {
        let root = tracefs::root();
        let event = |cat: &str, name: &str| -> Result<EventFormat> {
            let root = root.as_ref().map_err(|e| anyhow!("{e:#}"))?;
            EventFormat::read(root, cat, name)
        };
        let retx = event("tcp", "tcp_retransmit_skb").and_then(|f| {
            Ok(vec![
                (globals::RETX_OFF_FAMILY, f.offset("family")?),
                (globals::RETX_OFF_SPORT, f.offset("sport")?),
                (globals::RETX_OFF_DPORT, f.offset("dport")?),
                (globals::RETX_OFF_SADDR, f.offset("saddr")?),
                (globals::RETX_OFF_DADDR, f.offset("daddr")?),
                (globals::RETX_OFF_SADDR_V6, f.offset("saddr_v6")?),
                (globals::RETX_OFF_DADDR_V6, f.offset("daddr_v6")?),
            ])
        });
        let mut drop_reasons = HashMap::new();
        let drops = event("skb", "kfree_skb").and_then(|f| {
            drop_reasons = f.symbols("reason");
            Ok(vec![(globals::DROP_OFF_REASON, f.offset("reason")?)])
        });
        let qdisc = event("qdisc", "qdisc_dequeue")
            .and_then(|deq| Ok(vec![(globals::QDEQ_OFF_SKB, deq.offset("skbaddr")?)]));
        Self {
            results: [retx, drops, qdisc],
            drop_reasons,
        }
    }
}

/// The object, sized for this host's CPUs and `[maps]`, with the tracepoints' offsets.
fn load_object(cfg: &Config, tp: &TracepointOffsets) -> Result<Ebpf> {
    let gap_ns = u64::try_from(cfg.burst_gap.as_nanos()).unwrap_or(u64::MAX);
    let cpus = aya::util::nr_cpus().map_err(|(path, e)| anyhow!("reading {path}: {e}"))?;
    let slots = cfg.maps.series_slots_for(cpus);
    let slots_mask = slots - 1;
    let peer_slots = cfg.maps.peer_slots_for(cpus);
    let peer_slots_mask = peer_slots - 1;
    let burst_records = cfg.maps.burst_records_for(cpus);
    let burst_shift = burst_records.trailing_zeros();
    let cpus_u32 = u32::try_from(cpus).context("more CPUs than a map can index")?;
    let mut loader = loader_without_kernel_btf();
    loader
        .override_global(globals::BURST_GAP_NS, &gap_ns, true)
        .override_global(globals::SERIES_SLOTS_MASK, &slots_mask, true)
        .map_max_entries(names::SERIES_SLOTS, slots)
        .override_global(globals::PEER_SLOTS_MASK, &peer_slots_mask, true)
        .map_max_entries(names::PEER_SLOTS, peer_slots)
        .map_max_entries(names::FLOWS, cfg.maps.flows)
        .map_max_entries(names::CONNS, cfg.maps.conns)
        .map_max_entries(names::CONN_PICKS, cfg.maps.conns)
        .map_max_entries(names::PEER_TCP, cfg.maps.peers_for(cpus))
        .override_global(globals::BURST_EVENTS_SHIFT, &burst_shift, true)
        .override_global(globals::STORES_ARE_ORDERED, &STORES_ARE_ORDERED, true)
        .map_max_entries(
            names::BURST_EVENTS,
            burst_records
                .checked_mul(cpus_u32)
                .context("the burst-end rings are too large for one map")?,
        )
        .map_max_entries(names::BURST_EVENTS_POS, cpus_u32);
    let offsets: Vec<(&'static str, u32)> = tp
        .results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .flatten()
        .copied()
        .collect();
    for (global, off) in &offsets {
        loader.override_global(global, off, true);
    }
    let ebpf = loader.load(OBJECT).map_err(|e| {
        anyhow!(
            "loading the eBPF object failed: {} (the kernel needs BTF and BPF support; run with --log debug for details)",
            first_line(e)
        )
    })?;
    tracing::debug!("eBPF object loaded ({} bytes)", OBJECT.len());
    Ok(ebpf)
}

/// Attaches sock_ops (to `scope`, else the cgroup v2 root) and the tracepoints whose offsets
/// were read; a hook the kernel refuses is logged and left out. A scoped probe leaves out the
/// tracepoints that see every socket and packet of the host.
fn attach(
    ebpf: &mut Ebpf,
    tracepoints: [Result<Vec<(&'static str, u32)>>; 3],
    scope: Option<&Path>,
) -> Hooks {
    let mut hooks = Hooks {
        scoped: scope.is_some(),
        ..Hooks::default()
    };
    match attach_sock_ops(ebpf, scope) {
        Ok(path) => {
            hooks.sock_ops = true;
            tracing::info!("sock_ops attached to cgroup {}", path);
        }
        Err(e) => tracing::warn!(
            "per-connection RTT is off: sock_ops could not attach: {e:#}; flow accounting and retransmits still work"
        ),
    }
    if let Some(dir) = scope {
        tracing::info!(
            "scoped to cgroup {}: the host-wide tracepoints tcp:tcp_retransmit_skb and skb:kfree_skb are left out (retransmits come from sock_ops for the cgroup's sockets; drops by reason are not scoped)",
            dir.display()
        );
    }
    let attached: Vec<bool> = tracepoints
        .into_iter()
        .zip(&TRACEPOINTS)
        .map(|(offsets, tp)| {
            if scope.is_some() && tp.host_wide {
                return false;
            }
            match offsets.and_then(|_| attach_tracepoint(ebpf, tp.program, tp.category, tp.event)) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(
                        "{}: tracepoint {}:{}: {e:#}",
                        tp.lost,
                        tp.category,
                        tp.event
                    );
                    false
                }
            }
        })
        .collect();
    (hooks.tcp_retransmit, hooks.kfree_skb, hooks.qdisc) = (attached[0], attached[1], attached[2]);
    hooks
}

/// Turns the kernel's BPF run-time statistics on for as long as the returned fd is held.
fn enable_stats(hooks: &mut Hooks) -> Option<OwnedFd> {
    if crate::host::privilege::has_sys_admin() {
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
        tracing::warn!(
            "BPF run-time statistics need CAP_SYS_ADMIN; probe_bpf_run_seconds_total stays 0"
        );
        None
    }
}

/// An EbpfLoader that has not parsed the kernel's BTF. probe's programs have no CO-RE
/// relocations (a unit test checks the object), so they never need it; but aya 0.14's
/// `EbpfLoader::new` always parses /sys/kernel/btf/vmlinux, ~15 MB of heap for a few
/// hundred milliseconds, which set the daemon's peak RSS (30.4 MB idle against 15.0 MB
/// without it). So the loader is made in a short-lived thread with a mount namespace of its
/// own (private: nothing propagates to the host's), in which that file reads empty and the
/// parse fails at once. Without CAP_SYS_ADMIN, or wherever a step fails, the loader is made
/// as usual.
fn loader_without_kernel_btf() -> EbpfLoader<'static> {
    const VMLINUX: &std::ffi::CStr = c"/sys/kernel/btf/vmlinux";
    let made = std::thread::scope(|s| {
        s.spawn(|| -> std::io::Result<EbpfLoader<'static>> {
            let check = |r: libc::c_int| {
                if r == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            };
            // SAFETY: plain syscalls on constant, NUL-terminated paths; unshare only changes
            // this thread's view (CLONE_FS, which CLONE_NEWNS implies for a thread), and the
            // namespace goes when the thread ends.
            unsafe {
                check(libc::unshare(libc::CLONE_FS | libc::CLONE_NEWNS))?;
                check(libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                check(libc::mount(
                    c"/dev/null".as_ptr(),
                    VMLINUX.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
            }
            Ok(EbpfLoader::new())
        })
        .join()
    });
    match made {
        Ok(Ok(loader)) => loader,
        Ok(Err(e)) => {
            tracing::debug!("loading with aya's parse of the kernel BTF: {e}");
            EbpfLoader::new()
        }
        Err(_) => EbpfLoader::new(),
    }
}

/// A tracepoint probe attaches, and what is lost without it.
pub struct Tracepoint {
    pub category: &'static str,
    pub event: &'static str,
    pub program: &'static str,
    pub lost: &'static str,
    /// Sees every socket or packet of the host, whatever probe watches: left out when
    /// scoped to a cgroup.
    pub host_wide: bool,
}

/// In the order the loader reads their offsets; `probe run --check` lists the same.
pub const TRACEPOINTS: [Tracepoint; 3] = [
    Tracepoint {
        category: "tcp",
        event: "tcp_retransmit_skb",
        program: names::TCP_RETRANSMIT,
        lost: "retransmits of sockets opened before probe started are not counted",
        host_wide: true,
    },
    Tracepoint {
        category: "skb",
        event: "kfree_skb",
        program: names::KFREE_SKB,
        lost: "drops by reason are off",
        host_wide: true,
    },
    Tracepoint {
        category: "qdisc",
        event: "qdisc_dequeue",
        program: names::QDISC_DEQUEUE,
        lost: "qdisc sojourn time is off (backlog from netlink still works)",
        // Times only packets TC egress saw on the monitored interfaces.
        host_wide: false,
    },
];

/// Loads the two selection programs (bpf::select runs them; no kernel BTF needed: they
/// attach nowhere).
pub fn load_selection(ebpf: &mut Ebpf) -> Result<()> {
    for program in [names::FLOW_SELECT, names::CONN_SELECT] {
        let prog: &mut RawTracePoint = ebpf
            .program_mut(program)
            .with_context(|| format!("program {program} missing from the object"))?
            .try_into()?;
        prog.load().map_err(|e| {
            tracing::debug!("{e}");
            anyhow!("kernel rejected {program}: {}", first_line(e))
        })?;
    }
    Ok(())
}

fn attach_sock_ops(ebpf: &mut Ebpf, scope: Option<&Path>) -> Result<String> {
    let root = cgroup::sock_ops_cgroup(scope)?;
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

fn attach_tracepoint(ebpf: &mut Ebpf, program: &str, category: &str, name: &str) -> Result<()> {
    let prog: &mut TracePoint = ebpf
        .program_mut(program)
        .with_context(|| format!("program {program} missing from the object"))?
        .try_into()?;
    prog.load().map_err(|e| {
        tracing::debug!("{e}");
        anyhow!("kernel rejected {program}: {}", first_line(e))
    })?;
    prog.attach(category, name)
        .map_err(|e| anyhow!("{}", first_line(e)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The loader skips the kernel's BTF (loader_without_kernel_btf), and aya then skips CO-RE
    /// relocations without a word: a program that gains one must bring the parse back.
    #[test]
    fn the_object_has_no_core_relocations() {
        if super::OBJECT.is_empty() {
            return; // the fuzzing build's stand-in object
        }
        let obj = aya_obj::Object::parse(super::OBJECT).unwrap();
        assert!(
            !obj.has_btf_relocations(),
            "the eBPF object has CO-RE relocations: load it with the kernel's BTF (EbpfLoader::new)"
        );
    }
}

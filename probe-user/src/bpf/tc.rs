//! TC attachment per interface, and detachment that leaves nothing behind.
//!
//! Two modes. TCX links (kernel >= 6.6) belong to probe's file descriptors: the kernel
//! removes them when the process exits, however it exits. Netlink mode adds a clsact qdisc
//! (only if none exists) and filters; probe removes its filters on exit, removes the qdisc only
//! if it created it, and on start clears filters a killed predecessor left behind. A marker
//! under /run/probe remembers which clsact qdiscs probe created, across a crash.
use std::{collections::HashMap, path::PathBuf};

use anyhow::{anyhow, Context as _, Result};
use aya::{
    maps::{Array, MapData},
    programs::{
        tc::{self, NlOptions, SchedClassifierLinkId, TcAttachOptions, TcError},
        LinkOrder, SchedClassifier, TcAttachType,
    },
    util::KernelVersion,
    Ebpf,
};
use netlink_packet_route::tc::TcHandle;
use probe_ebpf::names;

use crate::{
    config::TcAttach,
    host::iface::{Iface, L2},
};

const MARKER_DIR: &str = "/run/probe/clsact";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Tcx,
    Netlink,
}

impl Mode {
    /// The mode `want` means on this kernel (TCX needs 6.6); `probe run --check` asks too.
    pub fn resolve(want: TcAttach) -> Result<Mode> {
        let tcx_ok = KernelVersion::current()
            .map(|v| v >= KernelVersion::new(6, 6, 0))
            .unwrap_or(false);
        Ok(match want {
            TcAttach::Tcx if !tcx_ok => {
                return Err(anyhow!(
                    "--tc-attach tcx needs kernel >= 6.6; use --tc-attach netlink or auto"
                ))
            }
            TcAttach::Tcx => Mode::Tcx,
            TcAttach::Netlink => Mode::Netlink,
            TcAttach::Auto if tcx_ok => Mode::Tcx,
            TcAttach::Auto => Mode::Netlink,
        })
    }
}

struct Attachment {
    iface: Iface,
    ingress: (&'static str, SchedClassifierLinkId),
    egress: (&'static str, SchedClassifierLinkId),
    created_clsact: bool,
}

pub struct TcAttacher {
    mode: Mode,
    attached: HashMap<u32, Attachment>,
    /// The kernel's set of interfaces whose qdisc sojourn time is measured, and what this
    /// side last wrote into each of its slots.
    qdisc_ifaces: Array<MapData, u32>,
    qdisc_slots: Vec<u32>,
    queued: std::collections::HashSet<u32>,
}

/// The slots of QDISC_IFACES for `ifindexes`: each in the first free slot of the
/// QDISC_IFACE_PROBES from `ifindex & (IFACES_MAX_ENTRIES - 1)`, as the TC program looks
/// for it. Returns the table and the ifindexes that found no slot.
fn qdisc_slots(ifindexes: &std::collections::HashSet<u32>) -> (Vec<u32>, Vec<u32>) {
    let size = probe_ebpf::IFACES_MAX_ENTRIES;
    let mut slots = vec![0u32; size as usize];
    let mut sorted: Vec<u32> = ifindexes.iter().copied().filter(|i| *i != 0).collect();
    sorted.sort_unstable();
    let mut left_out = Vec::new();
    for i in sorted {
        let free = (0..probe_ebpf::QDISC_IFACE_PROBES)
            .map(|p| (i.wrapping_add(p) & (size - 1)) as usize)
            .find(|&s| slots[s] == 0);
        match free {
            Some(s) => slots[s] = i,
            None => left_out.push(i),
        }
    }
    (slots, left_out)
}

fn programs(l2: L2) -> (&'static str, &'static str) {
    match l2 {
        L2::Ethernet => (names::TC_INGRESS_ETH, names::TC_EGRESS_ETH),
        L2::RawIp => (names::TC_INGRESS_RAWIP, names::TC_EGRESS_RAWIP),
    }
}

const ALL_PROGRAMS: [&str; 4] = [
    names::TC_INGRESS_ETH,
    names::TC_EGRESS_ETH,
    names::TC_INGRESS_RAWIP,
    names::TC_EGRESS_RAWIP,
];

fn marker(iface: &Iface) -> PathBuf {
    PathBuf::from(MARKER_DIR).join(&iface.name)
}

impl TcAttacher {
    /// Loads the four TC programs into the kernel and resolves the attach mode.
    pub fn new(ebpf: &mut Ebpf, want: TcAttach) -> Result<Self> {
        let mode = Mode::resolve(want)?;
        for name in ALL_PROGRAMS {
            let p: &mut SchedClassifier = ebpf
                .program_mut(name)
                .with_context(|| format!("program {name} missing from the object"))?
                .try_into()?;
            p.load().map_err(|e| {
                tracing::debug!("{e}");
                anyhow!(
                    "kernel rejected TC program {name}: {}",
                    e.to_string().lines().next().unwrap_or_default()
                )
            })?;
        }
        tracing::info!(
            "TC programs attach with {}",
            match mode {
                Mode::Tcx => "TCX links",
                Mode::Netlink => "a clsact qdisc and netlink filters",
            }
        );
        let qdisc_ifaces = Array::try_from(
            ebpf.take_map(names::QDISC_IFACES)
                .context("map QDISC_IFACES missing from the object")?,
        )?;
        Ok(Self {
            mode,
            attached: HashMap::new(),
            qdisc_ifaces,
            qdisc_slots: vec![0; probe_ebpf::IFACES_MAX_ENTRIES as usize],
            queued: Default::default(),
        })
    }

    pub fn is_attached(&self, ifindex: u32) -> bool {
        self.attached.contains_key(&ifindex)
    }

    pub fn attached(&self) -> impl Iterator<Item = &Iface> {
        self.attached.values().map(|a| &a.iface)
    }

    /// Attaches ingress and egress accounting to `iface`.
    pub fn attach(&mut self, ebpf: &mut Ebpf, iface: &Iface) -> Result<()> {
        let l2 = iface
            .l2
            .ok_or_else(|| anyhow!("interface {}: unsupported link type", iface.name))?;
        let (ing_name, eg_name) = programs(l2);
        let mut created_clsact = false;
        if self.mode == Mode::Netlink {
            created_clsact = self.prepare_netlink(iface)?;
        }
        let ingress = self
            .attach_one(ebpf, iface, ing_name, TcAttachType::Ingress)
            .inspect_err(|_| self.undo_clsact(iface, created_clsact))?;
        let egress = match self.attach_one(ebpf, iface, eg_name, TcAttachType::Egress) {
            Ok(l) => l,
            Err(e) => {
                let _ = prog(ebpf, ing_name).and_then(|p| Ok(p.detach(ingress)?));
                self.undo_clsact(iface, created_clsact);
                return Err(e);
            }
        };
        tracing::info!("attached to {} (ifindex {})", iface.name, iface.index);
        self.attached.insert(
            iface.index,
            Attachment {
                iface: iface.clone(),
                ingress: (ing_name, ingress),
                egress: (eg_name, egress),
                created_clsact,
            },
        );
        Ok(())
    }

    fn attach_one(
        &self,
        ebpf: &mut Ebpf,
        iface: &Iface,
        name: &str,
        at: TcAttachType,
    ) -> Result<SchedClassifierLinkId> {
        let options = match self.mode {
            Mode::Tcx => TcAttachOptions::TcxOrder(LinkOrder::default()),
            Mode::Netlink => TcAttachOptions::Netlink(NlOptions::default()),
        };
        prog(ebpf, name)?
            .attach_with_options(&iface.name, at, options)
            .map_err(|e| anyhow!("attaching {name} to {}: {e}", iface.name))
    }

    /// Netlink mode: clears filters a killed probe left, and makes sure a clsact qdisc is
    /// there. Returns whether probe owns that qdisc.
    fn prepare_netlink(&self, iface: &Iface) -> Result<bool> {
        for name in ALL_PROGRAMS {
            for at in [TcAttachType::Ingress, TcAttachType::Egress] {
                match tc::qdisc_detach_program(&iface.name, at, name) {
                    Ok(()) => tracing::info!(
                        "removed a stale {name} filter on {} left by an earlier probe",
                        iface.name
                    ),
                    Err(TcError::IoError(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => tracing::debug!("checking stale filters on {}: {e}", iface.name),
                }
            }
        }
        let owned_before = marker(iface).exists();
        match tc::qdisc_add_clsact(&iface.name) {
            Ok(()) => {
                let _ = std::fs::create_dir_all(MARKER_DIR)
                    .and_then(|_| std::fs::write(marker(iface), b"created by probe\n"));
                Ok(true)
            }
            Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {
                // Someone's clsact: ours only if a previous probe created it and was killed.
                Ok(owned_before)
            }
            Err(e) => Err(anyhow!("adding a clsact qdisc to {}: {e}", iface.name)),
        }
    }

    fn undo_clsact(&self, iface: &Iface, created: bool) {
        if created {
            remove_clsact(iface);
        }
    }

    /// Detaches from an interface that still exists (or just vanished: then the kernel has
    /// already dropped the filters and links, and errors are expected and quiet).
    pub fn detach(&mut self, ebpf: &mut Ebpf, ifindex: u32, vanished: bool) {
        let Some(a) = self.attached.remove(&ifindex) else {
            return;
        };
        if self.queued.remove(&ifindex) {
            self.write_queued();
        }
        for (name, link) in [a.ingress, a.egress] {
            let r = prog(ebpf, name).and_then(|p| Ok(p.detach(link)?));
            if let Err(e) = r {
                if !vanished {
                    tracing::warn!("detaching {name} from {}: {e:#}", a.iface.name);
                }
            }
        }
        if a.created_clsact && !vanished {
            remove_clsact(&a.iface);
        } else if vanished {
            let _ = std::fs::remove_file(marker(&a.iface));
        }
        tracing::info!("detached from {}", a.iface.name);
    }

    /// Sets which attached interfaces have a root qdisc that queues (not `noqueue`): only
    /// their egress packets are timed for sojourn, so a plain veth costs nothing extra.
    pub fn set_queued(&mut self, queued: &std::collections::HashSet<u32>) {
        let want: std::collections::HashSet<u32> = queued
            .iter()
            .copied()
            .filter(|i| self.attached.contains_key(i))
            .collect();
        if want != self.queued {
            self.queued = want;
            self.write_queued();
        }
    }

    /// Writes the slots of QDISC_IFACES that differ from what `queued` needs.
    fn write_queued(&mut self) {
        let (slots, left_out) = qdisc_slots(&self.queued);
        for i in left_out {
            tracing::warn!(
                "qdisc sojourn time for ifindex {i} is off: no free slot in QDISC_IFACES"
            );
        }
        for (s, (&new, old)) in slots.iter().zip(self.qdisc_slots.iter_mut()).enumerate() {
            if new == *old {
                continue;
            }
            match self.qdisc_ifaces.set(s as u32, new, 0) {
                Ok(()) => *old = new,
                Err(e) => tracing::warn!("qdisc sojourn time: writing QDISC_IFACES: {e}"),
            }
        }
    }

    pub fn detach_all(&mut self, ebpf: &mut Ebpf) {
        let all: Vec<u32> = self.attached.keys().copied().collect();
        for i in all {
            self.detach(ebpf, i, false);
        }
    }
}

fn prog<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier> {
    Ok(ebpf
        .program_mut(name)
        .with_context(|| format!("program {name} missing"))?
        .try_into()?)
}

/// Deletes the clsact qdisc (like `tc qdisc del dev X clsact`), which also drops any filters
/// still on it. Runs its own small netlink exchange on a throwaway runtime: it is called from
/// shutdown paths that may not be inside the daemon's runtime.
fn remove_clsact(iface: &Iface) {
    let index = iface.index as i32;
    let name = iface.name.clone();
    let r = std::thread::spawn(move || -> Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let (conn, handle, _) = rtnetlink::new_connection()?;
            tokio::spawn(conn);
            let mut req = handle.qdisc().del(index);
            req.message_mut().header.parent = TcHandle::CLSACT;
            req.message_mut().header.handle = TcHandle {
                major: 0xffff,
                minor: 0,
            };
            req.execute().await?;
            Ok(())
        })
    })
    .join();
    match r {
        Ok(Ok(())) => tracing::info!("removed the clsact qdisc probe added to {name}"),
        Ok(Err(e)) => tracing::warn!("removing the clsact qdisc from {name}: {e:#}"),
        Err(_) => tracing::warn!("removing the clsact qdisc from {name}: thread panicked"),
    }
    let _ = std::fs::remove_file(PathBuf::from(MARKER_DIR).join(&name));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_interfaces_take_the_slots_the_tc_program_probes() {
        let size = probe_ebpf::IFACES_MAX_ENTRIES;
        // 3, and four more that start at slot 3 (3 + k * size): they probe 3, 4, 5, 6.
        let set: std::collections::HashSet<u32> =
            [3, 3 + size, 3 + 2 * size, 3 + 3 * size, 3 + 4 * size, 9]
                .into_iter()
                .collect();
        let (slots, left_out) = qdisc_slots(&set);
        assert_eq!(&slots[3..7], &[3, 3 + size, 3 + 2 * size, 3 + 3 * size]);
        assert_eq!(left_out, vec![3 + 4 * size]);
        assert_eq!(slots[9], 9);
        assert_eq!(slots.iter().filter(|s| **s != 0).count(), 5);
        // The program's lookup, as tc.rs does it, finds each one placed.
        let found = |i: u32| {
            (0..probe_ebpf::QDISC_IFACE_PROBES)
                .map(|p| slots[(i.wrapping_add(p) & (size - 1)) as usize])
                .take_while(|v| *v != 0)
                .any(|v| v == i)
        };
        assert!(set
            .iter()
            .filter(|i| **i != 3 + 4 * size)
            .all(|i| found(*i)));
        assert!(!found(4) && !found(3 + 4 * size));
    }
}

//! The collect stage: one complete set of readings per tick. Scans interfaces (attaching to new
//! ones, detaching from vanished ones), reads the kernel maps off the async thread, and adds
//! link and qdisc statistics, RDMA ports, program statistics and hook status.
use std::{
    collections::{HashMap, HashSet},
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{anyhow, Result};
use aya::Ebpf;
use tokio::sync::watch;

use crate::{
    bpf::{Hooks, TcAttacher},
    collect::{
        jobs::{Attribution, JobTally},
        netlink, progstats,
        rdma::RdmaSnapshot,
        readings::{HookStatus, LinkSeries, QdiscSeries, Readings},
        sockets::SocketQueues,
        sources::{self, Source, SourceStatus},
        Collector,
    },
    config::Config,
    host::{
        cgroup,
        cgroup_tree::Subtree,
        iface,
        jobs::{Job, JobFinder},
    },
    lifecycle::Lifecycle,
};

pub struct Sources {
    /// Taken while the map walk runs on a blocking thread.
    collector: Option<Collector>,
    handle: rtnetlink::Handle,
    lifecycle: Lifecycle,
    rdma: Option<watch::Receiver<std::sync::Arc<RdmaSnapshot>>>,
    hooks: Vec<HookStatus>,
    tick: u64,
    /// The sources behind the `collect::sources` seam, and those failing now.
    host: Vec<Box<dyn Source>>,
    failing: Vec<&'static str>,
    /// The sockets' queues (sock_diag), read beside the maps; None if it cannot open.
    sockets: Option<SocketQueues>,
    sockets_failing: bool,
}

/// How a source built into the collect stage did this tick.
fn source_status(source: &'static str, up: bool, since: Instant) -> SourceStatus {
    SourceStatus {
        source,
        up,
        seconds: since.elapsed().as_secs_f64(),
    }
}

impl Sources {
    pub fn new(
        collector: Collector,
        handle: rtnetlink::Handle,
        rdma: Option<watch::Receiver<std::sync::Arc<RdmaSnapshot>>>,
        hooks: &Hooks,
        cfg: &crate::config::Config,
    ) -> Self {
        Self {
            collector: Some(collector),
            handle,
            lifecycle: Lifecycle::default(),
            rdma,
            hooks: hook_status(hooks),
            tick: 0,
            host: sources::all(cfg),
            failing: Vec::new(),
            sockets: open_sockets(cfg),
            sockets_failing: false,
        }
    }

    /// One tick's readings, unfolded (every peer has its own series).
    pub async fn read(
        &mut self,
        cfg: &Config,
        ebpf: &mut Ebpf,
        tc: &mut TcAttacher,
    ) -> Result<Readings> {
        let mut c = self
            .collector
            .take()
            .ok_or_else(|| anyhow!("collector lost by an earlier failed tick"))?;
        let mut removed = Vec::new();
        let mut status = Vec::new();
        let t = Instant::now();
        let links = match iface::dump(&self.handle).await {
            Ok(links) => {
                let all = iface::from_dump(&links);
                removed = self.lifecycle.reconcile(cfg, &all, ebpf, tc, &mut c);
                Some(links)
            }
            Err(e) => {
                tracing::warn!("interface scan failed: {e:#}");
                None
            }
        };
        status.push(source_status("interfaces", links.is_some(), t));
        let ifnames: HashMap<u32, String> =
            tc.attached().map(|i| (i.index, i.name.clone())).collect();
        // Map walks are syscalls: keep them off the async thread.
        let names = ifnames.clone();
        let mut q = self.sockets.take();
        let tick_s = cfg.tick.as_secs_f64();
        let t = Instant::now();
        let (c, q, mut snap, maps, queues) = tokio::task::spawn_blocking(move || {
            let mut s = c.tick(&names);
            let maps = source_status("maps", true, t);
            let t = Instant::now();
            let queues = q.as_mut().map(|q| (q.add_to(&mut s.peers, tick_s), t));
            (c, q, s, maps, queues)
        })
        .await
        .map_err(|e| anyhow!("collector thread failed: {e}"))?;
        // A selection walk that failed turned its map back to batch lookups.
        if let Some(h) = self.hooks.iter_mut().find(|h| h.hook == "map_select") {
            h.attached = c.selects_in_kernel();
        }
        self.collector = Some(c);
        if let Some(q) = &q {
            let (jobs, folded) = q.jobs();
            snap.jobs = jobs.to_vec();
            snap.jobs_folded = folded;
        }
        self.sockets = q;
        status.push(maps);
        if let Some((r, t)) = queues {
            match (&r, self.sockets_failing) {
                (Err(e), false) => tracing::warn!("socket queues: {e:#}"),
                (Ok(()), true) => tracing::info!("socket queues: read again"),
                _ => {}
            }
            self.sockets_failing = r.is_err();
            status.push(source_status("sockets", r.is_ok(), t));
        }

        self.tick += 1;
        snap.tick = self.tick;
        snap.time_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        snap.tick_seconds = cfg.tick.as_secs_f64();
        snap.burst_events.tick_unix = snap.time_unix;
        snap.removed_interfaces = removed;
        let mut ifaces: Vec<String> = ifnames.values().cloned().collect();
        ifaces.sort();
        snap.interfaces = ifaces;
        let t = Instant::now();
        snap.programs = progstats::read(ebpf);
        status.push(source_status("programs", true, t));
        snap.hooks = self.hooks.clone();
        if let Some(links) = &links {
            snap.links = netlink::links(links)
                .into_iter()
                .filter_map(|l| {
                    let iface = ifnames.get(&l.ifindex)?.clone();
                    Some(LinkSeries { iface, stats: l })
                })
                .collect();
            snap.links.sort_by(|a, b| a.iface.cmp(&b.iface));
        }
        let t = Instant::now();
        let up = self.qdiscs(&mut snap, &ifnames, tc).await;
        status.push(source_status("qdiscs", up, t));
        if let Some(rx) = &self.rdma {
            let t = Instant::now();
            snap.rdma = Some(rx.borrow().clone());
            // The poller thread is gone when its end of the channel is.
            status.push(source_status("rdma", rx.has_changed().is_ok(), t));
        }
        sources::read_all(
            &mut self.host,
            &mut self.failing,
            &mut snap.samples,
            &mut status,
        );
        snap.sources = status;
        Ok(snap)
    }

    async fn qdiscs(
        &self,
        snap: &mut Readings,
        ifnames: &HashMap<u32, String>,
        tc: &mut TcAttacher,
    ) -> bool {
        match netlink::qdiscs(&self.handle).await {
            Ok(q) => {
                // Sojourn is timed only where the root qdisc can queue.
                let queued: HashSet<u32> = q
                    .iter()
                    .filter(|q| q.parent == "root" && q.kind != "noqueue")
                    .map(|q| q.ifindex)
                    .collect();
                tc.set_queued(&queued);
                snap.qdiscs = q
                    .into_iter()
                    .filter_map(|q| {
                        let iface = ifnames.get(&q.ifindex)?.clone();
                        Some(QdiscSeries { iface, stats: q })
                    })
                    .collect();
                snap.qdiscs
                    .sort_by(|a, b| (&a.iface, &a.stats.handle).cmp(&(&b.iface, &b.stats.handle)));
                true
            }
            Err(e) => {
                tracing::warn!("{e:#}");
                false
            }
        }
    }
}

/// The sock_diag reader, scoped to `--cgroup`'s sockets. Without it the peers' queues are
/// unknown (null), which the log says once.
fn open_sockets(cfg: &Config) -> Option<SocketQueues> {
    let opened = cfg
        .cgroup
        .as_deref()
        .map(Subtree::new)
        .transpose()
        .and_then(|scope| SocketQueues::new(scope, job_tally(cfg)));
    match opened {
        Ok(q) => Some(q),
        Err(e) => {
            tracing::warn!("socket queues will not be read: {e:#}");
            None
        }
    }
}

/// How each socket's job is found: `--training-job` names it for all; else the cgroup
/// layouts (host::jobs), unless they are all turned off or there is no cgroup v2 mount.
fn job_tally(cfg: &Config) -> Option<JobTally> {
    let attribution = match &cfg.training_job {
        Some(name) => Attribution::Flag(std::sync::Arc::new(Job {
            name: name.clone(),
            rank: None,
            source: "flag",
        })),
        None if !cfg.jobs.builtin && cfg.jobs.from_cgroup.is_empty() => return None,
        None => match cgroup::cgroup2_mount() {
            Ok(root) => Attribution::Cgroups(JobFinder::new(root, &cfg.jobs)),
            Err(e) => {
                tracing::warn!("training jobs will not be found from cgroups: {e:#}");
                return None;
            }
        },
    };
    Some(JobTally::new(attribution, cfg.jobs.max_jobs))
}

/// The hooks to report; a scoped probe leaves the host-wide tracepoints out on purpose, so
/// they have no series (not a 0 that ProbeHookMissing would page on).
fn hook_status(h: &Hooks) -> Vec<HookStatus> {
    [
        ("tc", true, true),
        ("sock_ops", h.sock_ops, true),
        ("tcp_retransmit_skb", h.tcp_retransmit, !h.scoped),
        ("kfree_skb", h.kfree_skb, !h.scoped),
        ("qdisc_sojourn", h.qdisc, true),
        ("bpf_stats", h.bpf_stats, true),
        // Walking with batch lookups is the configured choice, not a missing hook.
        ("map_select", h.map_select, h.map_select_wanted),
    ]
    .into_iter()
    .filter(|&(_, _, wanted)| wanted)
    .map(|(hook, attached, _)| HookStatus { hook, attached })
    .collect()
}

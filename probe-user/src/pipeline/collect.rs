//! The collect stage: one complete set of readings per tick. Scans interfaces (attaching to new
//! ones, detaching from vanished ones), reads the kernel maps off the async thread, and adds
//! link and qdisc statistics, RDMA ports, program statistics and hook status.
use std::{
    collections::{HashMap, HashSet},
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{anyhow, Result};
use aya::Ebpf;
use tokio::sync::watch;

use crate::{
    bpf::{Hooks, TcAttacher},
    collect::{
        netlink, progstats,
        rdma::RdmaSnapshot,
        readings::{HookStatus, LinkSeries, QdiscSeries, Readings},
        Collector,
    },
    config::Config,
    host::iface,
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
}

impl Sources {
    pub fn new(
        collector: Collector,
        handle: rtnetlink::Handle,
        rdma: Option<watch::Receiver<std::sync::Arc<RdmaSnapshot>>>,
        hooks: &Hooks,
    ) -> Self {
        Self {
            collector: Some(collector),
            handle,
            lifecycle: Lifecycle::default(),
            rdma,
            hooks: hook_status(hooks),
            tick: 0,
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
        let ifnames: HashMap<u32, String> =
            tc.attached().map(|i| (i.index, i.name.clone())).collect();
        // Map walks are syscalls: keep them off the async thread.
        let names = ifnames.clone();
        let (c, mut snap) = tokio::task::spawn_blocking(move || {
            let s = c.tick(&names);
            (c, s)
        })
        .await
        .map_err(|e| anyhow!("collector thread failed: {e}"))?;
        self.collector = Some(c);

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
        snap.programs = progstats::read(ebpf);
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
        self.qdiscs(&mut snap, &ifnames, tc).await;
        snap.rdma = self.rdma.as_ref().map(|rx| rx.borrow().clone());
        Ok(snap)
    }

    async fn qdiscs(
        &self,
        snap: &mut Readings,
        ifnames: &HashMap<u32, String>,
        tc: &mut TcAttacher,
    ) {
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
            }
            Err(e) => tracing::warn!("{e:#}"),
        }
    }
}

fn hook_status(h: &Hooks) -> Vec<HookStatus> {
    [
        ("tc", true),
        ("sock_ops", h.sock_ops),
        ("tcp_retransmit_skb", h.tcp_retransmit),
        ("kfree_skb", h.kfree_skb),
        ("qdisc_sojourn", h.qdisc),
        ("bpf_stats", h.bpf_stats),
    ]
    .into_iter()
    .map(|(hook, attached)| HookStatus { hook, attached })
    .collect()
}

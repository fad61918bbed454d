//! `probe run`: the daemon. Order matters for clean failure: configuration and privilege
//! checks, then the listening socket (so "port in use" fails before touching the kernel),
//! then load and attach, then the tick loop until SIGINT/SIGTERM, then a full detach.
use std::{
    collections::HashMap,
    sync::{atomic::Ordering, Arc, RwLock},
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{anyhow, Context as _, Result};
use tokio::{
    net::TcpListener,
    signal::unix::{signal, SignalKind},
};

use crate::{
    bpf::{Loaded, TcAttacher},
    cli::RunArgs,
    collect::{netlink, progstats, rdma, Collector},
    config::Config,
    export::{
        http::{router, Shared},
        metrics::registry,
    },
    fold::PeerFolder,
    host::{iface, privilege},
    lifecycle::Lifecycle,
    snapshot::{HookStatus, LinkSeries, QdiscSeries, Snapshot},
};

/// A member peer that moved no traffic for this long gives its series up (see fold).
const PEER_IDLE: std::time::Duration = std::time::Duration::from_secs(600);

pub fn main(args: RunArgs) -> Result<()> {
    let cfg = Config::resolve(&args)?;
    privilege::check()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(daemon(cfg))
}

async fn daemon(cfg: Config) -> Result<()> {
    let listener = TcpListener::bind(cfg.listen).await.map_err(|e| {
        anyhow!(
            "cannot listen on {}: {e} (is another probe running? choose another address with --listen)",
            cfg.listen
        )
    })?;

    let (conn, handle, _) = rtnetlink::new_connection().context("opening rtnetlink")?;
    tokio::spawn(conn);
    let all = iface::from_dump(&iface::dump(&handle).await?);
    let selected = iface::select(&cfg, &all)?;
    if selected.is_empty() {
        tracing::warn!(
            "no interface to monitor yet (none matches, or none is up); TCP metrics still work"
        );
    }

    let mut loaded = Loaded::load(&cfg)?;
    let mut tc = TcAttacher::new(&mut loaded.ebpf, cfg.tc_attach)?;
    if cfg.bpf_log {
        if let Err(e) = crate::bpf::log::spawn(&mut loaded.ebpf) {
            tracing::warn!("--bpf-log: {e:#}");
        }
    }
    // From here on, every exit path detaches.
    let result = serve(&cfg, listener, &handle, &mut loaded, &mut tc, &selected).await;
    tc.detach_all(&mut loaded.ebpf);
    tracing::info!("detached; exiting");
    result
}

async fn serve(
    cfg: &Config,
    listener: TcpListener,
    handle: &rtnetlink::Handle,
    loaded: &mut Loaded,
    tc: &mut TcAttacher,
    selected: &[iface::Iface],
) -> Result<()> {
    for i in selected {
        tc.attach(&mut loaded.ebpf, i)?;
    }
    let mut collector = Some(Collector::new(
        &mut loaded.ebpf,
        std::mem::take(&mut loaded.drop_reasons),
    )?);
    let idle_ticks = (PEER_IDLE.as_secs_f64() / cfg.tick.as_secs_f64()).ceil() as u64;
    let mut folder = PeerFolder::new(cfg.top_peers, idle_ticks.max(1));
    let mut lifecycle = Lifecycle::default();
    let rdma = if cfg.rdma.enabled {
        match rdma::spawn(cfg.rdma.poller.clone()) {
            Ok(rx) => Some(rx),
            Err(e) => {
                tracing::warn!("RDMA counters are off: cannot start the poller thread: {e}");
                None
            }
        }
    } else {
        None
    };

    let latest = Arc::new(RwLock::new(Arc::new(Snapshot::default())));
    let shared = Arc::new(Shared {
        latest: latest.clone(),
        registry: registry(latest.clone()),
        ready: Default::default(),
    });
    let app = router(shared.clone());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stop_rx.await;
            })
            .await
    });
    tracing::info!(
        "serving http://{}/metrics (tick {:?}, {} interface(s))",
        cfg.listen,
        cfg.tick,
        selected.len()
    );

    let hooks = vec![
        HookStatus {
            hook: "tc",
            attached: true,
        },
        HookStatus {
            hook: "sock_ops",
            attached: loaded.hooks.sock_ops,
        },
        HookStatus {
            hook: "tcp_retransmit_skb",
            attached: loaded.hooks.tcp_retransmit,
        },
        HookStatus {
            hook: "tcp_probe",
            attached: loaded.hooks.tcp_probe,
        },
        HookStatus {
            hook: "kfree_skb",
            attached: loaded.hooks.kfree_skb,
        },
        HookStatus {
            hook: "qdisc_sojourn",
            attached: loaded.hooks.qdisc,
        },
        HookStatus {
            hook: "bpf_stats",
            attached: loaded.hooks.bpf_stats,
        },
    ];

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut ticker = tokio::time::interval(cfg.tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let result = loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = sigterm.recv() => break Ok(()),
            _ = sigint.recv() => break Ok(()),
        }
        let mut c = collector.take().expect("collector is returned every tick");
        let links = match iface::dump(handle).await {
            Ok(links) => {
                let all = iface::from_dump(&links);
                lifecycle.reconcile(cfg, &all, &mut loaded.ebpf, tc, &mut c, &mut folder);
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
        let (c, mut snap) = match tokio::task::spawn_blocking(move || {
            let s = c.tick(&names);
            (c, s)
        })
        .await
        {
            Ok(v) => v,
            Err(e) => break Err(anyhow!("collector thread failed: {e}")),
        };
        collector = Some(c);
        snap.time_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        snap.tick_seconds = cfg.tick.as_secs_f64();
        let mut ifaces: Vec<String> = ifnames.values().cloned().collect();
        ifaces.sort();
        snap.interfaces = ifaces;
        snap.programs = progstats::read(&loaded.ebpf);
        snap.hooks = hooks.clone();
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
        match netlink::qdiscs(handle).await {
            Ok(q) => {
                let queued: std::collections::HashSet<u32> = q
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
        folder.apply(&mut snap);
        snap.rdma = rdma.as_ref().map(|rx| rx.borrow().clone());
        if let Ok(mut g) = latest.write() {
            *g = Arc::new(snap);
        }
        shared.ready.store(true, Ordering::Release);
    };
    let _ = stop_tx.send(());
    let _ = server.await;
    result
}

//! `probe run`: the daemon. Order matters for clean failure: configuration and privilege
//! checks, then the listening socket (so "port in use" fails before touching the kernel),
//! then load and attach, then the tick loop until SIGINT/SIGTERM, then a full detach.
use std::{
    sync::{atomic::Ordering, Arc, Mutex, RwLock},
    time::Instant,
};

use anyhow::{anyhow, Context as _, Result};
use tokio::{
    net::TcpListener,
    signal::unix::{signal, SignalKind},
};

use crate::{
    bpf::{Loaded, TcAttacher},
    collect::{rdma, rdma::RdmaSnapshot, Collector},
    config::Config,
    config::RunArgs,
    export::{
        http::{router, Shared},
        metrics::registry,
        serve::{protect, serve as serve_http},
        webconfig::WebConfig,
    },
    host::{iface, privilege},
    model::{self, score::Slot},
    pipeline::{collect::Sources, Pipeline},
    snapshot::{Snapshot, StageTime},
};

type RdmaReceiver = tokio::sync::watch::Receiver<Arc<RdmaSnapshot>>;

pub fn main(args: RunArgs) -> Result<()> {
    one_malloc_arena();
    let cfg = Config::resolve(&args)?;
    // A bad model is a configuration error: say so before touching the kernel.
    let model = model::load(cfg.model.as_deref(), &cfg.features)?;
    let job_model = cfg
        .job_model
        .as_deref()
        .map(model::job::JobModel::load)
        .transpose()?;
    // So is a bad web config (a missing certificate, a password that is not a bcrypt hash).
    let web = match &cfg.web_config {
        Some(p) => WebConfig::load(p)?,
        None => WebConfig::default(),
    };
    if args.check {
        return crate::check::main(&cfg, &web, model.as_ref());
    }
    privilege::check()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let model = Arc::new(Mutex::new(model.map(Arc::new)));
    rt.block_on(daemon(cfg, web, model, job_model))
}

/// One glibc malloc arena for the whole daemon. By default each thread that allocates gets
/// its own arena, and each keeps what it freed: the collect stage runs on tokio's blocking
/// pool, so its tick buffers lived in a second arena beside the main heap's copy of the
/// snapshot. With one arena the threads take turns (they barely overlap: one tick at a
/// time) and peak RSS at 10,000 flows fell by ~6 MiB (docs/benchmarks-history.md). musl's malloc
/// (the static build, `cargo xtask dist`) has no per-thread arenas: nothing to set there.
fn one_malloc_arena() {
    // SAFETY: mallopt only sets a malloc parameter; called before any other thread exists.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1)
    };
}

async fn daemon(
    cfg: Config,
    web: WebConfig,
    model: Slot,
    job_model: Option<model::job::JobModel>,
) -> Result<()> {
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

    // A scope that is not a cgroup is a typo, not a host without sock_ops: refuse it.
    if let Some(dir) = &cfg.cgroup {
        crate::host::cgroup::sock_ops_cgroup(Some(dir))?;
    }
    let mut loaded = Loaded::load(&cfg)?;
    let mut tc = TcAttacher::new(&mut loaded.ebpf, cfg.tc_attach)?;
    if cfg.bpf_log {
        if let Err(e) = crate::bpf::log::spawn(&mut loaded.ebpf) {
            tracing::warn!("--bpf-log: {e:#}");
        }
    }
    // From here on, every exit path detaches.
    let result = serve(
        &cfg,
        &web,
        listener,
        &handle,
        &mut loaded,
        &mut tc,
        &selected,
        model,
        job_model,
    )
    .await;
    tc.detach_all(&mut loaded.ebpf);
    tracing::info!("detached; exiting");
    result
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    cfg: &Config,
    web: &WebConfig,
    listener: TcpListener,
    handle: &rtnetlink::Handle,
    loaded: &mut Loaded,
    tc: &mut TcAttacher,
    selected: &[iface::Iface],
    model: Slot,
    job_model: Option<model::job::JobModel>,
) -> Result<()> {
    for i in selected {
        tc.attach(&mut loaded.ebpf, i)?;
    }
    let collector = Collector::new(
        &mut loaded.ebpf,
        std::mem::take(&mut loaded.drop_reasons),
        cfg.flow_scan_ticks(),
        cfg.features.events_per_peer,
        loaded.hooks.map_select,
    )?;
    loaded.hooks.map_select = collector.selects_in_kernel();
    let mut sources = Sources::new(
        collector,
        handle.clone(),
        spawn_rdma(cfg),
        &loaded.hooks,
        cfg,
    );
    let mut pipeline = Pipeline::new(cfg, model.clone(), job_model);

    let latest = Arc::new(RwLock::new(Arc::new(Snapshot::default())));
    let shared = Arc::new(Shared {
        latest: latest.clone(),
        registry: registry(latest.clone()),
        ready: Default::default(),
    });
    let app = protect(router(shared.clone(), cfg.snapshot_api), web);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = {
        let web = web.clone();
        tokio::spawn(async move { serve_http(listener, app, &web, stop_rx).await })
    };
    log_model(&model);
    tracing::info!(
        "serving {}://{}/metrics{} (tick {:?}, {} interface(s))",
        if web.tls.is_some() { "https" } else { "http" },
        cfg.listen,
        if web.auth.is_some() {
            " with basic auth"
        } else {
            ""
        },
        cfg.tick,
        selected.len()
    );

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut ticker = tokio::time::interval(cfg.tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let result = loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = sigterm.recv() => break Ok(()),
            _ = sigint.recv() => break Ok(()),
            _ = sighup.recv() => {
                reload_model(cfg, &model);
                continue;
            }
        }
        let started = Instant::now();
        let readings = match sources.read(cfg, &mut loaded.ebpf, tc).await {
            Ok(r) => r,
            Err(e) => break Err(e),
        };
        let mut snap = Snapshot {
            readings,
            ..Snapshot::default()
        };
        snap.stages.push(StageTime {
            stage: "collect",
            seconds: started.elapsed().as_secs_f64(),
        });
        pipeline.run(&mut snap);
        if let Ok(mut g) = latest.write() {
            *g = Arc::new(snap);
        }
        shared.ready.store(true, Ordering::Release);
    };
    let _ = stop_tx.send(());
    let _ = server.await;
    result
}

/// What model serves. Loading is quiet (a bad model is the one line of a failed start);
/// this is logged once the daemon serves, and after each reload.
fn log_model(slot: &Slot) {
    match slot.lock().ok().and_then(|g| g.clone()) {
        Some(b) => {
            let i = b.info();
            tracing::info!(
                "model {} from {}: {} models over {} features, trained on {}",
                i.model, i.source, i.models, i.features, i.trained_on
            );
        }
        None => tracing::warn!("this build has no built-in model and none was given (--model DIR): no spike probabilities or forecasts"),
    }
}

/// SIGHUP: load the model again from where it came from; on any error the old one keeps
/// serving.
fn reload_model(cfg: &Config, slot: &Slot) {
    match model::load(cfg.model.as_deref(), &cfg.features) {
        Ok(m) => {
            if let Ok(mut g) = slot.lock() {
                *g = m.map(Arc::new);
            }
            log_model(slot);
        }
        Err(e) => {
            let old = slot
                .lock()
                .ok()
                .and_then(|g| g.as_ref().map(|b| b.info().source))
                .unwrap_or_else(|| "none".into());
            tracing::error!("model reload failed, the previous model ({old}) keeps serving: {e:#}");
        }
    }
}

fn spawn_rdma(cfg: &Config) -> Option<RdmaReceiver> {
    if !cfg.rdma.enabled {
        return None;
    }
    match rdma::spawn(cfg.rdma.poller.clone()) {
        Ok(rx) => Some(rx),
        Err(e) => {
            tracing::warn!("RDMA counters are off: cannot start the poller thread: {e}");
            None
        }
    }
}

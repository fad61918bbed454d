//! The HTTP endpoints: /metrics (OpenMetrics), /api/v1/snapshot (JSON), /healthz.
use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use axum::{
    extract::State,
    http::{header, StatusCode},
    response::IntoResponse,
    routing::get,
    Json, Router,
};
use prometheus_client::registry::Registry;

use super::metrics::{render, Latest};

pub struct Shared {
    pub latest: Latest,
    pub registry: Registry,
    /// Set once every hook is attached and the first tick has run.
    pub ready: AtomicBool,
}

/// The routes; `/api/v1/snapshot` only if `snapshot` (it names peers and connections).
pub fn router(shared: Arc<Shared>, snapshot: bool) -> Router {
    let r = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz));
    let r = if snapshot {
        r.route("/api/v1/snapshot", get(self::snapshot))
    } else {
        r.route("/api/v1/snapshot", get(snapshot_disabled))
    };
    r.with_state(shared)
}

async fn snapshot_disabled() -> impl IntoResponse {
    (
        StatusCode::NOT_FOUND,
        "/api/v1/snapshot is turned off on this host (--web.disable-snapshot or web.snapshot = false)\n",
    )
}

async fn metrics(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        render(&s.registry),
    )
}

async fn snapshot(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    let snap = s.latest.read().map(|g| g.clone()).unwrap_or_default();
    Json(snap)
}

async fn healthz(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}

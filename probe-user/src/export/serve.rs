//! Serving the endpoints: plain HTTP, or HTTPS (rustls) when the web config has
//! `tls_server_config`; basic auth and extra headers around every route.
use std::{sync::Arc, time::Duration};

use axum::{
    extract::{Request, State},
    http::{header, HeaderName, HeaderValue, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    Router,
};
use tokio::{io::AsyncWriteExt as _, net::TcpListener, sync::oneshot};

use super::webconfig::WebConfig;

/// A TLS client has this long to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The router with the web config's auth and headers applied.
pub fn protect(app: Router, web: &WebConfig) -> Router {
    let mut app = app;
    if !web.headers.is_empty() {
        let headers: Arc<Vec<(HeaderName, HeaderValue)>> = Arc::new(
            web.headers
                .iter()
                .filter_map(|(k, v)| Some((k.parse().ok()?, v.parse().ok()?)))
                .collect(),
        );
        app = app.layer(middleware::from_fn_with_state(headers, add_headers));
    }
    if let Some(auth) = &web.auth {
        app = app.layer(middleware::from_fn_with_state(auth.clone(), basic_auth));
    }
    app
}

async fn basic_auth(
    State(auth): State<Arc<super::webconfig::BasicAuth>>,
    req: Request,
    next: Next,
) -> Response {
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // bcrypt is slow on purpose: off the async thread.
    let ok = tokio::task::spawn_blocking(move || auth.allows(header.as_deref()))
        .await
        .unwrap_or(false);
    if ok {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic realm=\"probe\"")],
            "Unauthorized\n",
        )
            .into_response()
    }
}

async fn add_headers(
    State(headers): State<Arc<Vec<(HeaderName, HeaderValue)>>>,
    req: Request,
    next: Next,
) -> Response {
    let mut r = next.run(req).await;
    for (k, v) in headers.iter() {
        r.headers_mut().insert(k.clone(), v.clone());
    }
    r
}

/// Serves `app` on `listener` until `stop` fires.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    web: &WebConfig,
    stop: oneshot::Receiver<()>,
) -> std::io::Result<()> {
    let Some(tls) = web.tls.clone() else {
        return axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stop.await;
            })
            .await;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut stop = stop;
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut stop => return Ok(()),
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of fds and the like: wait rather than spin.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let mut tcp = tcp;
            // A plain HTTP request to the TLS port gets a plain answer that says so, as Go's
            // servers give, instead of a failed handshake.
            let mut first = [0u8; 1];
            if matches!(tcp.peek(&mut first).await, Ok(1) if first[0] != 0x16) {
                let _ = tcp
                    .write_all(b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
                    .await;
                return;
            }
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!("TLS handshake with {peer}: {e}");
                    return;
                }
                Err(_) => {
                    tracing::debug!("TLS handshake with {peer}: timed out");
                    return;
                }
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await
            {
                tracing::debug!("HTTPS connection with {peer}: {e}");
            }
        });
    }
}

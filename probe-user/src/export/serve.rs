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

/// A TLS client has this long to finish its handshake, and then to send each request's
/// headers.
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
            // The first byte and the handshake share one deadline: a client that connects
            // and says nothing does not hold a task and a descriptor for ever.
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(tcp, &acceptor)).await
            {
                Ok(Ok(Some(s))) => s,
                Ok(Ok(None)) => return,
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
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HANDSHAKE_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await
            {
                tracing::debug!("HTTPS connection with {peer}: {e}");
            }
        });
    }
}

/// The TLS stream; None if the client spoke plain HTTP (it got a plain answer saying so, as
/// Go's servers give, instead of a failed handshake).
async fn handshake(
    mut tcp: tokio::net::TcpStream,
    acceptor: &tokio_rustls::TlsAcceptor,
) -> std::io::Result<Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>> {
    let mut first = [0u8; 1];
    if tcp.peek(&mut first).await? == 1 && first[0] != 0x16 {
        tcp.write_all(b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
            .await?;
        return Ok(None);
    }
    acceptor.accept(tcp).await.map(Some)
}

//! Accepting and serving client connections: TCP, optionally TLS (ALPN picks h2 or
//! http/1.1), then hyper-util's auto builder (HTTP/1.1, or HTTP/2 by prior knowledge or ALPN)
//! with the proxy as the service. Each connection is watched for graceful shutdown.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::Shared;
use crate::config::Config;
use crate::proxy::{Conn, Proxy};

/// What every connection of one listener needs.
pub(super) struct AcceptCtx {
    pub(super) shared: Arc<Shared>,
    pub(super) builder: Arc<auto::Builder<TokioExecutor>>,
    /// set when `tls` is configured: every listener terminates TLS
    pub(super) tls: Option<TlsAcceptor>,
    /// a TLS handshake must finish within this (as a request head must)
    pub(super) handshake_timeout: Duration,
}

/// Accepts until `stop` changes. The graceful-shutdown handle stays in this loop (connection
/// tasks get only a `Watcher` each), so the caller can take it back once every loop ended.
pub(super) async fn accept_loop(
    listener: TcpListener,
    ctx: AcceptCtx,
    graceful: Arc<GracefulShutdown>,
    mut stop: watch::Receiver<bool>,
) {
    let ctx = Arc::new(ctx);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        let ctx = ctx.clone();
        let watcher = graceful.watcher();
        // the handshake runs in the connection's task, so a slow client never holds up accept
        tokio::spawn(async move {
            let conn = Conn {
                peer,
                tls: ctx.tls.is_some(),
            };
            match &ctx.tls {
                None => serve(stream, conn, &ctx, watcher).await,
                Some(acceptor) => match handshake(acceptor, stream, ctx.handshake_timeout).await {
                    Some(tls) => serve(tls, conn, &ctx, watcher).await,
                    None => tracing::debug!(%peer, "TLS handshake failed or timed out"),
                },
            }
        });
    }
}

async fn handshake(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    limit: Duration,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    match tokio::time::timeout(limit, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            None
        }
        Err(_) => None,
    }
}

/// Serves one connection until it closes; the proxy in force is loaded per request, so a
/// reload applies to the next request of a kept-alive connection.
async fn serve<I>(io: I, conn: Conn, ctx: &AcceptCtx, watcher: Watcher)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let shared = ctx.shared.clone();
    let service = service_fn(move |req| {
        let proxy: Arc<Proxy> = shared.proxy.load_full();
        async move { Ok::<_, Infallible>(proxy.handle(req, conn).await) }
    });
    let connection = ctx
        .builder
        .serve_connection_with_upgrades(TokioIo::new(io), service);
    if let Err(e) = watcher.watch(connection.into_owned()).await {
        tracing::debug!(peer = %conn.peer, error = %e, "connection ended with an error");
    }
}

pub(super) fn http_builder(config: &Config) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.timeouts.client_header)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    builder
}

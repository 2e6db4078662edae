//! Accepting and serving client connections: TCP, optionally TLS (ALPN picks h2 or
//! http/1.1), then hyper-util's auto builder (HTTP/1.1, or HTTP/2 by prior knowledge or ALPN)
//! with the proxy as the service.
//!
//! Connection-level hardening lives here: each connection's task enforces `client_header` and
//! `idle` ([`idle`]), drains on shutdown, and refuses ambiguous HTTP/1 framing before the
//! proxy sees a request ([`framing`]). hyper bounds the head (size and count of header lines)
//! and HTTP/2 (concurrent streams, reset floods).

mod framing;
mod idle;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulConnection, GracefulShutdown};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use self::idle::{Activity, Deadlines, Expired, Guarded, InFlight, Tracked};
use super::Shared;
use crate::config::Config;
use crate::proxy::{Conn, Proxy};

/// The largest request head (request line and headers) an HTTP/1 connection buffers; larger
/// gets 431. hyper's default is about 400 KiB, which thousands of half-sent heads would each
/// hold; 64 KiB is Envoy's order (60 KiB) and twice nginx's default (4 x 8 KiB buffers).
const MAX_HEAD_BYTES: usize = 64 * 1024;

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
/// tasks hold only a `Watcher` each, which is what its `shutdown` waits for), so the caller can
/// take it back once every loop ended.
pub(super) async fn accept_loop(
    listener: TcpListener,
    ctx: AcceptCtx,
    graceful: Arc<GracefulShutdown>,
    mut stop: watch::Receiver<bool>,
) {
    let timeouts = ctx.shared.config().timeouts;
    let deadlines = Deadlines {
        client_header: timeouts.client_header,
        idle: timeouts.idle,
    };
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
        let stop = stop.clone();
        // the handshake runs in the connection's task, so a slow client never holds up accept
        tokio::spawn(async move {
            let _counted_until_closed = watcher;
            let conn = Conn {
                peer,
                tls: ctx.tls.is_some(),
            };
            match &ctx.tls {
                None => serve(stream, conn, &ctx, deadlines, stop).await,
                // boxed, so that plain connections' tasks are not sized for a TLS session
                Some(acceptor) => {
                    let tls = async {
                        match handshake(acceptor, stream, ctx.handshake_timeout).await {
                            Some(tls) => serve(tls, conn, &ctx, deadlines, stop).await,
                            None => tracing::debug!(%peer, "TLS handshake failed or timed out"),
                        }
                    };
                    Box::pin(tls).await;
                }
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

/// Serves one connection until it closes, is cut off by its deadlines, or drains after
/// `stop`.
async fn serve<I>(
    io: I,
    conn: Conn,
    ctx: &AcceptCtx,
    deadlines: Deadlines,
    stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Activity::new(deadlines);
    let shared = ctx.shared.clone();
    let requests = activity.clone();
    // The proxy in force is loaded per request, so a reload applies to the next request of a
    // kept-alive connection.
    let service = service_fn(move |req| {
        let in_flight = InFlight::start(&requests, req.version());
        let proxy: Arc<Proxy> = shared.proxy.load_full();
        // Boxed: hyper keeps a slot the size of this future for the whole life of the
        // connection; boxed, the slot is a pointer and the request's state is freed when it
        // is answered, so an idle keep-alive connection holds none of it.
        Box::pin(async move {
            let resp = match framing::check(&req) {
                Ok(()) => proxy.handle(req, conn).await,
                Err(e) => {
                    tracing::debug!(peer = %conn.peer, error = %e, "request refused");
                    framing::refusal(&e)
                }
            };
            Ok::<_, Infallible>(resp.map(|body| Guarded::new(body, in_flight)))
        })
    });
    let io = TokioIo::new(Tracked::new(io, activity.clone()));
    // boxed: the connection is most of a connection task's memory, and a future moved through
    // two async fns (and `pin!`) would otherwise hold it in several slots
    let connection = Box::pin(ctx.builder.serve_connection_with_upgrades(io, service));
    let ended = drive(connection, &activity, deadlines, stop).await;
    match ended {
        Ended::Closed(Ok(())) => {}
        Ended::Closed(Err(e)) => {
            tracing::debug!(peer = %conn.peer, error = %e, "connection ended with an error");
        }
        Ended::HeadTimeout => {
            tracing::debug!(peer = %conn.peer, "no complete request head within client_header");
        }
    }
}

/// How a connection's task ended.
enum Ended<E> {
    /// hyper finished the connection
    Closed(Result<(), E>),
    /// cut off: a request head (or a new connection's first) outlasted `client_header`
    HeadTimeout,
}

/// Runs `connection` under its deadlines: graceful shutdown on `stop` or after `idle`, cut off
/// (dropped, closing the socket) when a head outlasts `client_header` or a graceful close does
/// not finish within it.
async fn drive<C>(
    mut connection: Pin<Box<C>>,
    activity: &Activity,
    deadlines: Deadlines,
    mut stop: watch::Receiver<bool>,
) -> Ended<C::Error>
where
    C: GracefulConnection,
{
    let timer = tokio::time::sleep(deadlines.client_header);
    tokio::pin!(timer);
    // set once a graceful close began (shutdown, or idle): hyper finishes what is in flight
    let mut closing = false;
    loop {
        tokio::select! {
            biased;
            ended = connection.as_mut() => return Ended::Closed(ended),
            _ = stop.wait_for(|stop| *stop), if !closing => {
                closing = true;
                connection.as_mut().graceful_shutdown();
            }
            () = activity.head_started() => {
                let next = activity.arm().unwrap_or_else(|_| Instant::now());
                timer.as_mut().reset(next);
            }
            () = &mut timer => match activity.arm() {
                Ok(next) => timer.as_mut().reset(next),
                Err(Expired::Head) => return Ended::HeadTimeout,
                Err(Expired::Idle) if !closing => {
                    closing = true;
                    connection.as_mut().graceful_shutdown();
                    // an HTTP/2 client gets this long to acknowledge the GOAWAY
                    let grace = Instant::now() + deadlines.client_header;
                    activity.arm_at(grace);
                    timer.as_mut().reset(grace);
                }
                Err(Expired::Idle) => return Ended::Closed(Ok(())),
            },
        }
    }
}

/// The HTTP server settings shared by every connection.
///
/// hyper's `header_read_timeout` is off: it would also end keep-alive pauses at
/// `client_header`; [`idle`] keeps both deadlines instead. hyper's other defaults already bound
/// what a client can make a connection hold: 100 header lines per head, and for HTTP/2 200
/// concurrent streams, 16 KiB of header list and 20 streams reset before being accepted (the
/// rapid-reset defence, answered with GOAWAY).
pub(super) fn http_builder(_config: &Config) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    builder
}

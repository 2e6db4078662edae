//! Accepting and serving client connections: TCP, optionally TLS, then HTTP/1.1 or HTTP/2
//! (by ALPN, or on cleartext by prior knowledge) with the proxy as the service.
//!
//! The protocol is chosen before hyper reads anything: by ALPN, or by peeking at a cleartext
//! connection's first bytes (the HTTP/2 preface or not), so hyper's HTTP/1 reader gets the
//! request from the socket whole. hyper-util's auto builder, which reads the first bytes itself
//! and hands them over first, is left for the rare connection that cannot be told yet (a partial
//! preface on cleartext): after its 24-byte first read hyper's read buffer grows from 8 to
//! 16 KiB and keeps that size while the connection is idle (measured with massif), the largest
//! part of an idle keep-alive connection's memory.
//!
//! Connection-level hardening lives here: each connection's task enforces `client_header` and
//! `idle` ([`idle`]), drains on shutdown, refuses ambiguous HTTP/1 framing before the proxy
//! sees a request ([`framing`]), and lingers when it closes before a request body was read, so
//! that the client reads the answer ([`linger`]). hyper bounds the head (size and count of
//! header lines) and HTTP/2 (concurrent streams, reset floods).

mod descriptors;
mod framing;
mod gate;
mod idle;
mod linger;
mod pass;
mod side;
mod workers;

pub(crate) use descriptors::Descriptors;
pub(crate) use side::{accept_loop as side_accept_loop, SideBounds};
pub(crate) use workers::Workers;

use std::cell::RefCell;
use std::convert::Infallible;
use std::fmt::Display;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use self::idle::{Activity, Deadlines, Expired, Guarded, InFlight, Tracked};
use crate::config::Timeouts;
use crate::proxy::{request_id, Conn, Proxy};

/// The largest request head (request line and headers) an HTTP/1 connection buffers; larger
/// gets 431. hyper's default is about 400 KiB, which thousands of half-sent heads would each
/// hold; 64 KiB is Envoy's order (60 KiB) and twice nginx's default (4 x 8 KiB buffers).
/// hyper's `max_buf_size` stops a head that is still arriving; its `max_header_size` also
/// refuses a whole head over the limit that one read brought in (the read buffer can grow past
/// `max_buf_size`); it also bounds chunked trailers (hyper's default there is 16 KiB).
/// hyper-util's auto builder has only the first.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// What connections read of the server in force. A reload swaps each part; a new connection
/// reads the timeouts and the TLS config, and each request reads the proxy.
pub(crate) struct Live {
    /// The routes, limits and upstreams in force. Swapped whole on reload; each request loads
    /// it once, so a request in flight finishes under the config it started with.
    pub(crate) proxy: ArcSwap<Proxy>,
    /// The `timeouts` in force: a reload applies them from the next connection on.
    pub(crate) timeouts: ArcSwap<Timeouts>,
    /// TLS termination for every listener, when `tls` is set: its certificate and key read
    /// again on each reload, so a renewed certificate is served without a restart.
    pub(crate) tls: Option<ArcSwap<rustls::ServerConfig>>,
}

/// What every connection of one listener needs.
pub(crate) struct AcceptCtx {
    pub(crate) live: Arc<Live>,
    pub(crate) http: Arc<Http>,
    /// the process's descriptors: a failed accept is reported there, once per episode
    pub(crate) descriptors: Arc<Descriptors>,
}

/// Accepts until `stop` changes. The graceful-shutdown handle stays in this loop (connection
/// tasks hold only a `Watcher` each, which is what its `shutdown` waits for), so the caller can
/// take it back once every loop ended.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    ctx: AcceptCtx,
    graceful: Arc<GracefulShutdown>,
    workers: Arc<Workers>,
    mut stop: watch::Receiver<bool>,
) {
    let ctx = Arc::new(ctx);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning, and say it once
                    if ctx.descriptors.accept_failed("proxy", &e) {
                        tokio::time::sleep(descriptors::BACK_OFF).await;
                    }
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        ctx.descriptors.accepted();
        let _ = stream.set_nodelay(true);
        // the deadlines in force when the connection came (a reload applies from the next)
        let timeouts = **ctx.live.timeouts.load();
        let deadlines = Deadlines {
            client_header: timeouts.client_header,
            idle: timeouts.idle,
            send: timeouts.send,
        };
        let ctx = ctx.clone();
        let watcher = graceful.watcher();
        let stop = stop.clone();
        // the handshake runs in the connection's task, so a slow client never holds up accept
        workers.spawn(stream, move |stream, worker| {
            connection(stream, peer, worker, ctx, deadlines, stop, watcher)
        });
    }
}

/// One connection's task, from its TLS handshake or first bytes to its close. It holds
/// `_counted_until_closed` until it ends, so that a graceful shutdown waits for it.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    worker: usize,
    ctx: Arc<AcceptCtx>,
    deadlines: Deadlines,
    stop: watch::Receiver<bool>,
    _counted_until_closed: Watcher,
) {
    let conn = Conn::new(peer, ctx.live.tls.is_some(), worker);
    let accepted = Instant::now();
    match &ctx.live.tls {
        None => {
            // the first bytes are owed within client_header, as the rest of the head
            let mut waiting = stop.clone();
            let speaks = tokio::select! {
                speaks = tokio::time::timeout(deadlines.client_header, sniff(&stream)) => speaks,
                _ = waiting.wait_for(|stop| *stop) => return,
            };
            let Ok(Ok(speaks)) = speaks else {
                tracing::debug!(%peer, "no request bytes within client_header");
                return;
            };
            let io = (stream, accepted);
            serve(io, speaks, conn, &ctx, deadlines, stop).await
        }
        // boxed, so that plain connections' tasks are not sized for a TLS session
        Some(config) => {
            // the certificate in force when the connection came
            let acceptor = TlsAcceptor::from(config.load_full());
            let tls = async {
                // (a TLS handshake must finish within client_header, as a head must;
                // one under way when shutdown starts is dropped, as a silent
                // cleartext connection is)
                let mut waiting = stop.clone();
                let shaken = tokio::select! {
                    shaken = handshake(&acceptor, stream, deadlines.client_header) => shaken,
                    _ = waiting.wait_for(|stop| *stop) => return,
                };
                match shaken {
                    Some(tls) => {
                        let speaks = alpn(&tls);
                        let io = (tls, Instant::now());
                        serve(io, speaks, conn, &ctx, deadlines, stop).await
                    }
                    None => tracing::debug!(%peer, "TLS handshake failed or timed out"),
                }
            };
            Box::pin(tls).await;
        }
    }
}

/// What a client speaking plain HTTP to a TLS listener is answered (as nginx and Go's server
/// answer it), rather than a TLS alert its HTTP parser cannot read.
const PLAIN_TO_TLS: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n\
    Content-Length: 75\r\nConnection: close\r\n\r\n\
    {\"error\":\"bad_request\",\"message\":\"a plain HTTP request sent to a TLS port\"}";

async fn handshake(
    acceptor: &TlsAcceptor,
    mut stream: TcpStream,
    limit: Duration,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let shake = async {
        // a TLS client's first byte is a handshake record's (22); an HTTP request's is the
        // first letter of its method
        let mut first = [0u8; 1];
        if stream.peek(&mut first).await.ok()? == 1 && first[0].is_ascii_uppercase() {
            use tokio::io::AsyncWriteExt;
            let _ = stream.write_all(PLAIN_TO_TLS).await;
            let _ = stream.shutdown().await;
            tracing::debug!("a plain HTTP request on a TLS listener: 400");
            return None;
        }
        match acceptor.accept(stream).await {
            Ok(tls) => Some(tls),
            Err(e) => {
                tracing::debug!(error = %e, "TLS handshake failed");
                None
            }
        }
    };
    tokio::time::timeout(limit, shake).await.ok().flatten()
}

/// The HTTP/2 connection preface (RFC 9113 §3.4), which a client speaking HTTP/2 by prior
/// knowledge sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a connection speaks, when known before hyper reads from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Speaks {
    Http1,
    Http2,
    /// not told yet: hyper-util's auto builder reads the first bytes and decides
    Unknown,
}

/// The protocol of a cleartext connection, from its first bytes, peeked (left in the socket for
/// hyper). Waits for the first bytes; `Http1` at end of stream (hyper then sees it closed).
async fn sniff(stream: &TcpStream) -> std::io::Result<Speaks> {
    let mut first = [0; H2_PREFACE.len()];
    let n = stream.peek(&mut first).await?;
    Ok(if first[..n] != H2_PREFACE[..n] || n == 0 {
        Speaks::Http1
    } else if n == H2_PREFACE.len() {
        Speaks::Http2
    } else {
        Speaks::Unknown // a part of the preface so far: peeking again would spin
    })
}

/// The protocol ALPN agreed on: HTTP/2 over TLS is only ever chosen by ALPN (RFC 9113 §3.3),
/// so without it the connection speaks HTTP/1.
fn alpn(tls: &tokio_rustls::server::TlsStream<TcpStream>) -> Speaks {
    match tls.get_ref().1.alpn_protocol() {
        Some(b"h2") => Speaks::Http2,
        _ => Speaks::Http1,
    }
}

/// Serves one connection (`io` and when it began to owe its first request head) until it
/// closes, is cut off by its deadlines, or drains after `stop`.
async fn serve<I>(
    (io, began): (I, Instant),
    speaks: Speaks,
    conn: Conn,
    ctx: &AcceptCtx,
    deadlines: Deadlines,
    stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Activity::new(deadlines, began);
    let live = ctx.live.clone();
    // (read with the connection's other timeouts: a reload applies from the next connection)
    let linger = live.timeouts.load().linger;
    let requests = activity.clone();
    // The proxy in force is looked up per request, so a reload applies to the next request of
    // a kept-alive connection. The connection holds it in a handle of its own, and a request
    // takes a reference to that handle: a reference to the proxy itself would write its count,
    // shared by every worker, twice per request, and the cores would pass that cache line back
    // and forth. The handle's count is written by this connection's worker only. An idle
    // connection keeps the proxy of its last request until its next one or its close (within
    // `timeouts.idle`): an older config's routes, not its pools, store or tunnels, which every
    // config shares.
    let held = RefCell::new(Arc::new(live.proxy.load_full()));
    let service_conn = conn.clone();
    let service = service_fn(move |req| {
        let in_flight = InFlight::start(&requests, req.version());
        let owed = linger::may_leave_body(&req);
        requests.linger_after(if owed { linger } else { Duration::ZERO });
        let proxy: Arc<Arc<Proxy>> = {
            let mut held = held.borrow_mut();
            let current = live.proxy.load();
            if !Arc::ptr_eq(&**held, &*current) {
                *held = Arc::new(Guard::into_inner(current));
            }
            held.clone()
        };
        let conn = service_conn.clone();
        // Boxed: hyper keeps a slot the size of this future for the whole life of the
        // connection; boxed, the slot is a pointer and the request's state is freed when it
        // is answered, so an idle keep-alive connection holds none of it.
        boxed_in_place(move || answer(req, proxy, conn, in_flight))
    });
    let io = TokioIo::new(Tracked::new(io, activity.clone()));
    // boxed: the connection is most of a connection task's memory, and a future moved through
    // two async fns (and `pin!`) would otherwise hold it in several slots
    let http = &ctx.http;
    match speaks {
        Speaks::Http1 => {
            let connection = Box::pin(http.h1.serve_connection(io, service).with_upgrades());
            let close = |c: Pin<&mut _>| http1::UpgradeableConnection::graceful_shutdown(c);
            let ended = drive(connection, close, &activity, deadlines, stop).await;
            report(ended, conn);
        }
        Speaks::Http2 => {
            let connection = Box::pin(http.h2.serve_connection(io, service));
            let close = |c: Pin<&mut _>| http2::Connection::graceful_shutdown(c);
            let ended = drive(connection, close, &activity, deadlines, stop).await;
            report(ended, conn);
        }
        Speaks::Unknown => {
            let connection = Box::pin(http.auto.serve_connection_with_upgrades(io, service));
            let close = |c: Pin<&mut _>| auto::UpgradeableConnection::graceful_shutdown(c);
            let ended = drive(connection, close, &activity, deadlines, stop).await;
            report(ended, conn);
        }
    }
}

/// One request of a connection: refused when its HTTP/1 framing is ambiguous, else handled by
/// `proxy`, a reference to the connection's handle (see `serve`). Its response body holds
/// `in_flight` until it ends.
// the handle's count is this connection's alone, unlike the proxy's own
#[allow(clippy::redundant_allocation)]
async fn answer(
    mut req: Request<Incoming>,
    proxy: Arc<Arc<Proxy>>,
    conn: Conn,
    in_flight: InFlight,
) -> Result<Response<Guarded<crate::proxy::Body>>, Infallible> {
    // before anything answers, so that every answer carries it, a refusal here too
    let id = request_id::keep_or_make(req.headers_mut());
    let resp = match framing::check(&req) {
        Ok(()) => {
            let handling = pass::Handling::start();
            let resp = proxy.handle(req, conn, id).await;
            pass::end_of_pass(handling).await;
            resp
        }
        Err(e) => {
            tracing::debug!(peer = %conn.peer, error = %e, "request refused");
            let mut resp = framing::refusal(&e);
            resp.headers_mut()
                .insert(request_id::X_REQUEST_ID.clone(), id);
            resp
        }
    };
    Ok(resp.map(|body| Guarded::new(body, in_flight)))
}

/// `Box::pin(make())`, with the box allocated before the future is made, so the compiler can
/// build the future in the box: `Box::pin` of a future made first copies all of its bytes
/// (the request's future is ~5 KB, mostly the room its later states need) from the stack.
fn boxed_in_place<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

/// Logs how a connection ended, when not by a clean close.
fn report<E: Display>(ended: Ended<E>, conn: Conn) {
    match ended {
        Ended::Closed(Ok(())) => {}
        Ended::Closed(Err(e)) => {
            tracing::debug!(peer = %conn.peer, error = %e, "connection ended with an error");
        }
        Ended::HeadTimeout => {
            tracing::debug!(peer = %conn.peer, "no complete request head within client_header");
        }
        Ended::SendTimeout => {
            tracing::debug!(peer = %conn.peer, "the client took no bytes within send");
        }
    }
}

/// How a connection's task ended.
enum Ended<E> {
    /// hyper finished the connection
    Closed(Result<(), E>),
    /// cut off: a request head (or a new connection's first) outlasted `client_header`
    HeadTimeout,
    /// cut off: the client took no bytes for `send`
    SendTimeout,
}

/// Runs `connection` under its deadlines: graceful shutdown on `stop` or after `idle`, cut off
/// (dropped, closing the socket) when a head outlasts `client_header`, the client takes no
/// bytes for `send`, or a graceful close does not finish within `client_header`.
async fn drive<C, E>(
    mut connection: Pin<Box<C>>,
    graceful_shutdown: impl Fn(Pin<&mut C>),
    activity: &Activity,
    deadlines: Deadlines,
    mut stop: watch::Receiver<bool>,
) -> Ended<E>
where
    C: Future<Output = Result<(), E>>,
{
    let first_head = activity.check().unwrap_or_else(|_| Instant::now());
    let timer = tokio::time::sleep_until(first_head);
    tokio::pin!(timer);
    // set once a graceful close began (shutdown, or idle): hyper finishes what is in flight
    let mut closing = false;
    // set when that close began at `idle`: the timer then holds its grace deadline
    let mut grace = false;
    // the deadlines and the stop signal are polled only when one of them woke the task
    let gate = gate::Gate::new();
    loop {
        let event = {
            let side = async {
                tokio::select! {
                    biased;
                    _ = stop.wait_for(|stop| *stop), if !closing => Side::Stop,
                    () = activity.sooner() => Side::Sooner,
                    () = &mut timer => Side::Timer,
                }
            };
            tokio::pin!(side);
            gate.open();
            let side = std::future::poll_fn(|cx| gate.poll(side.as_mut(), cx));
            tokio::select! {
                biased;
                ended = connection.as_mut() => return Ended::Closed(ended),
                event = side => event,
            }
        };
        match event {
            Side::Stop => {
                closing = true;
                activity.owe_nothing();
                graceful_shutdown(connection.as_mut());
            }
            // after idle, the timer holds the grace deadline: nothing moves it
            Side::Sooner if grace => {}
            Side::Sooner => {
                let next = activity.arm().unwrap_or_else(|_| Instant::now());
                timer.as_mut().reset(next);
            }
            Side::Timer => match activity.arm() {
                Ok(next) => timer.as_mut().reset(next),
                Err(Expired::Head) => return Ended::HeadTimeout,
                Err(Expired::Send) => return Ended::SendTimeout,
                Err(Expired::Idle) if !closing => {
                    closing = true;
                    grace = true;
                    activity.owe_nothing();
                    graceful_shutdown(connection.as_mut());
                    // an HTTP/2 client gets this long to acknowledge the GOAWAY
                    let until = Instant::now() + deadlines.client_header;
                    activity.arm_at(until);
                    timer.as_mut().reset(until);
                }
                Err(Expired::Idle) => return Ended::Closed(Ok(())),
            },
        }
    }
}

/// What woke a connection's task besides its HTTP work.
enum Side {
    /// the server is shutting down
    Stop,
    /// a deadline sooner than the timer's began (a request head, the connection idle, a
    /// write that found the socket full)
    Sooner,
    /// the deadline timer rang
    Timer,
}

/// The HTTP server settings shared by every connection: hyper's HTTP/1 and HTTP/2 builders, and
/// hyper-util's auto builder with the same settings for connections whose protocol is not known
/// before reading.
///
/// hyper's `header_read_timeout` is off: it would also end keep-alive pauses at
/// `client_header`; [`idle`] keeps both deadlines instead. hyper's other defaults already bound
/// what a client can make a connection hold: 100 header lines per head, and for HTTP/2 200
/// concurrent streams and 20 streams reset before being accepted (the rapid-reset defence,
/// answered with GOAWAY). A head may be 64 KiB in either protocol (HTTP/2's default header list
/// is 16 KiB: a request served over HTTP/1.1 would have got 431 over h2, which browsers pick).
pub(crate) struct Http {
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
    auto: auto::Builder<TokioExecutor>,
}

pub(crate) fn http_builder() -> Http {
    let mut h1 = http1::Builder::new();
    h1.timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_header_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new())
        .max_header_list_size(MAX_HEAD_BYTES as u32);
    let mut auto = auto::Builder::new(TokioExecutor::new());
    auto.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    auto.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEAD_BYTES as u32);
    Http { h1, h2, auto }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connection's first bytes tell its protocol and stay in the socket for hyper: an
    /// HTTP/1 request, the whole HTTP/2 preface, a part of it (not told yet), no bytes at all.
    #[tokio::test]
    async fn first_bytes_tell_the_protocol_and_stay_in_the_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cases: [(&[u8], Speaks); 5] = [
            (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", Speaks::Http1),
            (b"PRX", Speaks::Http1),
            (H2_PREFACE, Speaks::Http2),
            (&H2_PREFACE[..9], Speaks::Unknown),
            (b"", Speaks::Http1),
        ];
        for (sent, want) in cases {
            let mut client = TcpStream::connect(addr).await.unwrap();
            let (mut server, _) = listener.accept().await.unwrap();
            client.write_all(sent).await.unwrap();
            client.shutdown().await.unwrap();
            let told = sniff(&server).await.unwrap();
            assert_eq!(told, want, "{}", String::from_utf8_lossy(sent));
            let mut left = Vec::new();
            server.read_to_end(&mut left).await.unwrap();
            assert_eq!(left, sent, "the bytes are still there to read");
        }
    }
}

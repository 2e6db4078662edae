//! The admin listener's connections, served under the proxy listener's bounds.
//!
//! A connection to the admin listener owes its first bytes and its first request head within
//! `client_header`, as one to the proxy does; it closes after `idle` between requests, and an
//! HTTP/2 one gets its GOAWAY then. The same [`Activity`] keeps the deadlines and the same
//! [`drive`] enforces them. What the proxy listener does not need:
//!
//! * a cap, `admin.max_connections`: a connection past it is closed at once;
//! * the proxy's [`Descriptors`]: a connection that would leave the proxy less than its
//!   reserve is closed at once; while descriptors are short the listener does not accept at
//!   all, and its idle connections close.
//!
//! The service (the admin's answers) is the caller's; this module owns only the connections.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::{service_fn, Service};
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use super::descriptors::{Descriptors, BACK_OFF, QUIET};
use super::idle::{Activity, Deadlines, Guarded, InFlight, Tracked};
use super::{drive, sniff, Ended, Http, Speaks};
use crate::config::Timeouts;

/// How long shutdown waits for in-flight admin requests. Every answer is built in memory
/// without waiting on anything, so this only bounds a client that stops reading.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a listener that stopped accepting (descriptors short) looks again.
const PAUSED_LOOK: Duration = Duration::from_millis(100);

/// What bounds the connections of a side listener.
pub(crate) struct SideBounds {
    /// the `timeouts` in force, read for each new connection (a reload applies from the next)
    pub(crate) timeouts: Arc<dyn Fn() -> Timeouts + Send + Sync>,
    /// hyper's settings, the proxy listener's (the same bounds on heads)
    pub(crate) http: Arc<Http>,
    /// `admin.max_connections`
    pub(crate) max_connections: usize,
    /// the process's descriptors, shared with the proxy's accept loops
    pub(crate) descriptors: Arc<Descriptors>,
}

#[cfg(test)]
impl SideBounds {
    /// Bounds for a listener tested alone: `timeouts` fixed, hyper's default settings with
    /// timers, descriptors of its own.
    pub(crate) fn alone(timeouts: Timeouts, max_connections: usize) -> SideBounds {
        use hyper_util::rt::{TokioExecutor, TokioTimer};
        let mut h1 = http1::Builder::new();
        h1.timer(TokioTimer::new()).header_read_timeout(None);
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new());
        let mut auto = auto::Builder::new(TokioExecutor::new());
        auto.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(None);
        auto.http2().timer(TokioTimer::new());
        SideBounds {
            timeouts: Arc::new(move || timeouts),
            http: Arc::new(Http { h1, h2, auto }),
            max_connections,
            descriptors: Arc::new(Descriptors::default()),
        }
    }
}

/// Accepts on `listener` until `stop` says so, serving each connection with the service
/// `make(peer)` under `bounds`; then lets in-flight requests finish for a few seconds.
pub(crate) async fn accept_loop<M, S, B>(
    name: &'static str,
    listener: TcpListener,
    bounds: SideBounds,
    make: M,
    mut stop: watch::Receiver<bool>,
) where
    M: Fn(SocketAddr) -> S,
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let graceful = GracefulShutdown::new();
    let open = Arc::new(AtomicUsize::new(0));
    let mut refusing = Refusing::default();
    loop {
        if bounds.descriptors.short() {
            // not accepting: the connections wait in the backlog and hold no descriptor
            tokio::select! {
                () = tokio::time::sleep(PAUSED_LOOK) => continue,
                _ = stop.wait_for(|stop| *stop) => break,
            }
        }
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                if bounds.descriptors.accept_failed(name, &e) {
                    tokio::time::sleep(BACK_OFF).await;
                }
                continue;
            }
        };
        let held = open.load(Ordering::SeqCst);
        if held >= bounds.max_connections || !bounds.descriptors.admin_room() {
            refusing.refused(name, held >= bounds.max_connections);
            drop(stream);
            continue;
        }
        refusing.accepted(name);
        let counted = Counted::new(&open);
        let watcher = graceful.watcher();
        let t = (bounds.timeouts)();
        let deadlines = Deadlines {
            client_header: t.client_header,
            idle: t.idle,
            send: t.send,
        };
        let (http, stop, shed) = (
            bounds.http.clone(),
            stop.clone(),
            bounds.descriptors.shedding(),
        );
        let service = make(peer);
        tokio::spawn(async move {
            let _counted_until_closed = (watcher, counted);
            let ended = connection(stream, service, &http, deadlines, stop, shed).await;
            report(name, peer, ended);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(DRAIN_TIMEOUT) => {
            tracing::warn!(listener = name, after = ?DRAIN_TIMEOUT, "drain timed out; closing connections");
        }
    }
}

/// Whether a listener is closing new connections at once, so that it says so once when it
/// starts and once when it ends, not once per connection.
#[derive(Default)]
struct Refusing {
    /// when the last connection was refused, while an episode is under way
    since: Option<Instant>,
}

impl Refusing {
    fn refused(&mut self, name: &'static str, capped: bool) {
        if self.since.is_none() {
            let why = match capped {
                true => "max_connections reached",
                false => "descriptors kept for the proxy",
            };
            tracing::warn!(listener = name, why, "closing new connections at once");
        }
        self.since = Some(Instant::now());
    }

    fn accepted(&mut self, name: &'static str) {
        // ended once none was refused for a while: at the cap, every connection that closes
        // lets one in, which is not an end
        if self.since.is_some_and(|at| at.elapsed() >= QUIET) {
            self.since = None;
            tracing::info!(listener = name, "accepting connections again");
        }
    }
}

/// A connection counted towards the cap until it is dropped.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(open: &Arc<AtomicUsize>) -> Counted {
        open.fetch_add(1, Ordering::SeqCst);
        Counted(open.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How an admin connection ended: as a proxy connection can, or shed (`None`).
type Outcome = Option<Ended<Box<dyn std::error::Error + Send + Sync>>>;

/// Serves one connection: its protocol told from its first bytes (owed within
/// `client_header`), then hyper under the connection's deadlines; closed early when
/// descriptors run short while it has no request in flight.
async fn connection<S, B>(
    stream: TcpStream,
    service: S,
    http: &Http,
    deadlines: Deadlines,
    mut stop: watch::Receiver<bool>,
    mut shed: watch::Receiver<u64>,
) -> Outcome
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let accepted = Instant::now();
    shed.mark_unchanged();
    let speaks = tokio::select! {
        speaks = tokio::time::timeout(deadlines.client_header, sniff(&stream)) => speaks,
        _ = stop.wait_for(|stop| *stop) => return Some(Ended::Closed(Ok(()))),
        // (an error: the server is gone, and with it the shedding)
        Ok(()) = shed.changed() => return None,
    };
    let Ok(Ok(speaks)) = speaks else {
        return Some(Ended::HeadTimeout);
    };
    let activity = Activity::new(deadlines, accepted);
    let requests = activity.clone();
    let service = Arc::new(service);
    let service = service_fn(move |req: Request<Incoming>| {
        let in_flight = InFlight::start(&requests, req.version());
        let answered = service.call(req);
        async move {
            let resp = answered.await?;
            Ok::<_, Infallible>(resp.map(|body| Guarded::new(body, in_flight)))
        }
    });
    let io = TokioIo::new(Tracked::new(stream, activity.clone()));
    let run = (&activity, deadlines, stop, shed);
    match speaks {
        Speaks::Http1 => {
            let conn = Box::pin(http.h1.serve_connection(io, service));
            let close = |c: Pin<&mut _>| http1::Connection::graceful_shutdown(c);
            sheddable(conn, close, run).await
        }
        Speaks::Http2 => {
            let conn = Box::pin(http.h2.serve_connection(io, service));
            let close = |c: Pin<&mut _>| http2::Connection::graceful_shutdown(c);
            sheddable(conn, close, run).await
        }
        Speaks::Unknown => {
            let conn = Box::pin(http.auto.serve_connection(io, service));
            let close = |c: Pin<&mut _>| auto::Connection::graceful_shutdown(c);
            sheddable(conn, close, run).await
        }
    }
}

/// [`drive`]s `conn`, and drops it (closing the socket) when descriptors run short while it
/// has no request in flight.
async fn sheddable<C, E>(
    conn: Pin<Box<C>>,
    close: impl Fn(Pin<&mut C>),
    (activity, deadlines, stop, mut shed): (
        &Arc<Activity>,
        Deadlines,
        watch::Receiver<bool>,
        watch::Receiver<u64>,
    ),
) -> Outcome
where
    C: Future<Output = Result<(), E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let idle_when_shed = async {
        while shed.changed().await.is_ok() {
            if activity.idle() {
                return;
            }
        }
        std::future::pending().await
    };
    tokio::select! {
        ended = drive(conn, close, activity, deadlines, stop) => Some(match ended {
            Ended::Closed(r) => Ended::Closed(r.map_err(Into::into)),
            Ended::HeadTimeout => Ended::HeadTimeout,
            Ended::SendTimeout => Ended::SendTimeout,
        }),
        () = idle_when_shed => None,
    }
}

/// Logs how a connection ended, when not by a clean close.
fn report(name: &'static str, peer: SocketAddr, ended: Outcome) {
    match ended {
        Some(Ended::Closed(Ok(()))) => {}
        Some(Ended::Closed(Err(e))) => {
            tracing::debug!(listener = name, %peer, error = %e, "connection ended with an error");
        }
        Some(Ended::HeadTimeout) => {
            tracing::debug!(listener = name, %peer, "no complete request head within client_header");
        }
        Some(Ended::SendTimeout) => {
            tracing::debug!(listener = name, %peer, "the client took no bytes within send");
        }
        None => {
            tracing::debug!(listener = name, %peer, "idle connection closed: descriptors short")
        }
    }
}

//! HTTP/2 to upstreams: connections per target shared by every worker, each request a stream
//! on one of them.
//!
//! A target gets a slot here when its upstream speaks only HTTP/2, or when TLS chose `h2` on a
//! connection to it. A request takes a stream on the first of the slot's connections with one
//! free (as many as the peer's `SETTINGS_MAX_CONCURRENT_STREAMS`). When all are in use, one
//! request opens another connection, up to the upstream's `max_connections`; past that,
//! requests wait for a stream to end, and the wait is not the upstream being slow ([`Waits`]).
//! Connections open one at a time, so a burst opens one, not many.
//!
//! A connection is made when the peer's SETTINGS came, within the connect timeout (a peer that
//! accepts TCP and says nothing is a target that cannot be connected to). PINGs keep it
//! honest: one unanswered closes it. A connection that closed (the upstream's GOAWAY, an
//! error, a PING), idled past the pool's `idle`, or stayed silent while a request on it timed
//! out takes no new streams.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use http::uri::{Authority, PathAndQuery};
use http::{header, Request, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::Notify;

use super::dial::{H2Settings, Stream};
use super::peer::{Heard, Peer};
use super::{Key, UpstreamError};
use crate::proxy::h1::MAX_HEAD;
use crate::proxy::Body;

type Sender = http2::SendRequest<Body>;

/// The HTTP/2 connections of every worker, by target.
pub struct Conns {
    slots: Mutex<HashMap<Key, Arc<Slot>, foldhash::fast::RandomState>>,
    /// connections unused this long close
    idle_for: Duration,
    /// the peer's SETTINGS come within this, or the connection counts as not made
    connect: Duration,
    reaping: AtomicBool,
}

/// One target's connections.
#[derive(Default)]
pub(super) struct Slot {
    open: Mutex<Open>,
    /// a stream ended, a connection closed or was made, or one failed to open
    freed: Notify,
}

#[derive(Default)]
struct Open {
    conns: Vec<Arc<Conn>>,
    /// a request is opening a connection
    opening: bool,
}

/// One HTTP/2 connection.
pub(super) struct Conn {
    sender: Sender,
    peer: Arc<Peer>,
    /// streams open on it (requests sent whose response has not ended)
    streams: AtomicUsize,
    retired: AtomicBool,
    last_used: Mutex<Instant>,
}

impl Conn {
    fn usable(&self) -> bool {
        !self.retired.load(Ordering::Relaxed) && !self.sender.is_closed()
    }

    /// No new stream goes on it; those open finish or fail on their own.
    fn retire(&self) {
        if !self.retired.swap(true, Ordering::Relaxed) {
            tracing::debug!("upstream HTTP/2 connection retired");
        }
    }
}

/// What [`Slot::stream`] found.
pub(super) enum Acquired {
    /// a stream on an open connection
    Stream(StreamSlot),
    /// the caller opens a connection and hands it to [`Opening::made`]
    Open(Opening),
}

/// A stream taken on a connection: given back when dropped.
pub(super) struct StreamSlot {
    conn: Arc<Conn>,
    slot: Arc<Slot>,
}

impl StreamSlot {
    /// The connection's sender.
    pub(super) fn sender(&self) -> Sender {
        self.conn.sender.clone()
    }

    /// Its connection takes no new stream.
    pub(super) fn retire(&self) {
        self.conn.retire();
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.conn.streams.fetch_sub(1, Ordering::Relaxed);
        self.slot.freed.notify_waiters();
    }
}

/// The right to open a target's next connection; dropped without one, the next waiter may try.
pub(super) struct Opening {
    slot: Arc<Slot>,
}

impl Opening {
    /// `conn` joins the slot, with the caller's stream on it.
    pub(super) fn made(self, conn: Conn) -> StreamSlot {
        let conn = Arc::new(conn);
        conn.streams.store(1, Ordering::Relaxed);
        self.slot.lock().conns.push(conn.clone());
        StreamSlot {
            conn,
            slot: self.slot.clone(),
        }
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        self.slot.lock().opening = false;
        self.slot.freed.notify_waiters();
    }
}

/// One request's dealings with HTTP/2 connections: how long it waited for a stream (which is
/// not the upstream being slow), and the connection it went out on.
pub struct Waits {
    /// the longest a request waits for a stream
    limit: Duration,
    state: Mutex<WaitState>,
}

#[derive(Default)]
struct WaitState {
    since: Option<Instant>,
    waited: Duration,
    sent: Option<(Weak<Conn>, Instant)>,
}

impl Waits {
    /// A request that waits `limit` at most for a stream.
    pub fn new(limit: Duration) -> Waits {
        Waits {
            limit,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, WaitState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn waiting(&self, now: bool) {
        let mut s = self.state();
        match (now, s.since.take()) {
            (true, since) => s.since = Some(since.unwrap_or_else(Instant::now)),
            (false, Some(since)) => s.waited += since.elapsed(),
            (false, None) => {}
        }
    }

    pub(super) fn sent_on(&self, stream: &StreamSlot) {
        self.state().sent = Some((Arc::downgrade(&stream.conn), Instant::now()));
    }

    /// How long the request waited for a stream so far, and whether it still does.
    pub fn waited(&self) -> (Duration, bool) {
        let s = self.state();
        match s.since {
            Some(since) => (s.waited + since.elapsed(), true),
            None => (s.waited, false),
        }
    }

    /// The request got no response head in time: its connection, silent since the request
    /// went out, is retired (a connection that reads nothing while a request waits is
    /// wedged, and PINGs may not have told yet).
    pub fn timed_out(&self) {
        let s = self.state();
        if let Some((conn, at)) = &s.sent {
            if let Some(conn) = conn.upgrade() {
                if conn.peer.silent_since(*at) {
                    conn.retire();
                }
            }
        }
    }
}

impl Conns {
    /// No connections yet; those made close after `idle_for` unused, and count as made when
    /// the peer's SETTINGS came within `connect`.
    pub fn new(idle_for: Duration, connect: Duration) -> Conns {
        Conns {
            slots: Mutex::default(),
            idle_for,
            connect,
            reaping: AtomicBool::new(false),
        }
    }

    /// The connect timeout, which bounds the HTTP/2 handshake too.
    pub(super) fn connect(&self) -> Duration {
        self.connect
    }

    /// `target`'s slot: made when `make` (its upstream speaks only HTTP/2).
    pub(super) fn slot(self: &Arc<Self>, target: &Key, make: bool) -> Option<Arc<Slot>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = slots.get(target) {
            return Some(slot.clone());
        }
        if !make {
            return None;
        }
        let slot = Arc::new(Slot::default());
        slots.insert(target.clone(), slot.clone());
        if !self.reaping.swap(true, Ordering::Relaxed) {
            tokio::spawn(Conns::reap(Arc::downgrade(self), self.idle_for));
        }
        Some(slot)
    }

    /// Forgets `target`'s slot: TLS chose HTTP/1.1 on a new connection to it.
    pub(super) fn forget(&self, target: &Key) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.remove(target);
    }

    /// Closes the connections idle past `idle_for`, every half of it, until `conns` is gone.
    async fn reap(conns: Weak<Conns>, idle_for: Duration) {
        let every = (idle_for / 2).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(every).await;
            let Some(conns) = conns.upgrade() else {
                return;
            };
            let slots: Vec<Arc<Slot>> = {
                let slots = conns.slots.lock().unwrap_or_else(|e| e.into_inner());
                slots.values().cloned().collect()
            };
            for slot in slots {
                // (streams under way keep a connection open until they end)
                slot.lock().conns.retain(|c| {
                    let last = *c.last_used.lock().unwrap_or_else(|e| e.into_inner());
                    c.usable()
                        && (c.streams.load(Ordering::Relaxed) > 0 || last.elapsed() < idle_for)
                });
            }
        }
    }
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A stream on one of the slot's connections, or the right to open one; waits, within
    /// `waits`' limit, when neither is to be had.
    pub(super) async fn stream(
        self: &Arc<Self>,
        max_connections: usize,
        waits: Option<&Waits>,
    ) -> Result<Acquired, UpstreamError> {
        let limit = waits.map_or(Duration::from_secs(30), |w| w.limit);
        let deadline = tokio::time::Instant::now() + limit;
        let got = loop {
            let freed = self.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            if let Some(got) = self.try_stream(max_connections) {
                break got;
            }
            if let Some(w) = waits {
                w.waiting(true);
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                if let Some(w) = waits {
                    w.waiting(false);
                }
                return Err(UpstreamError::Busy(limit));
            }
        };
        if let Some(w) = waits {
            w.waiting(false);
        }
        Ok(got)
    }

    fn try_stream(self: &Arc<Self>, max_connections: usize) -> Option<Acquired> {
        let mut open = self.lock();
        open.conns.retain(|c| c.usable());
        let free = open
            .conns
            .iter()
            .find(|c| c.streams.load(Ordering::Relaxed) < c.peer.max_streams());
        if let Some(conn) = free {
            conn.streams.fetch_add(1, Ordering::Relaxed);
            *conn.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            return Some(Acquired::Stream(StreamSlot {
                conn: conn.clone(),
                slot: self.clone(),
            }));
        }
        if !open.opening && open.conns.len() < max_connections {
            open.opening = true;
            return Some(Acquired::Open(Opening { slot: self.clone() }));
        }
        None
    }
}

/// Starts HTTP/2 on `stream`: made once the peer's SETTINGS came, within `within`.
pub(super) async fn start(
    stream: Stream,
    settings: &H2Settings,
    within: Duration,
) -> Result<Conn, UpstreamError> {
    let peer = Peer::new();
    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        // response heads are bounded as over HTTP/1.1
        .max_header_list_size(MAX_HEAD as u32)
        // streamed bodies (gRPC) get the window they use
        .adaptive_window(true)
        // an idle connection is checked too: the next request must not find it dead
        .keep_alive_interval(settings.keepalive_interval)
        .keep_alive_timeout(settings.keepalive_timeout)
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(Heard::new(stream, peer.clone())))
        .await
        .map_err(UpstreamError::Http)?;
    let task = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "upstream HTTP/2 connection ended with an error");
        }
    });
    // hyper's handshake ends when tollgate's preface is written; the peer's comes after
    if tokio::time::timeout(within, peer.settled()).await.is_err() {
        task.abort();
        let e = format!("no HTTP/2 SETTINGS from the upstream within {within:?}");
        return Err(UpstreamError::Connect(e.into()));
    }
    Ok(Conn {
        sender,
        peer,
        streams: AtomicUsize::new(0),
        retired: AtomicBool::new(false),
        last_used: Mutex::new(Instant::now()),
    })
}

/// Whether an HTTP/2 stream failed unprocessed (RFC 9113 §8.7): above a GOAWAY's
/// `last_stream_id`, or refused with `REFUSED_STREAM`. A GOAWAY with an error code is not
/// taken as such: h2 reports it on every stream, processed or not.
pub(super) fn unprocessed(e: &UpstreamError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            let reason = h2.reason();
            return h2.is_remote()
                && ((h2.is_go_away() && reason == Some(h2::Reason::NO_ERROR))
                    || (h2.is_reset() && reason == Some(h2::Reason::REFUSED_STREAM)));
        }
        source = err.source();
    }
    false
}

/// Sends `req` on `sender`; the request back when the connection closed before taking it.
pub(super) async fn send(
    stream: &StreamSlot,
    req: Request<Body>,
) -> Result<hyper::Response<Incoming>, (UpstreamError, Option<Request<Body>>)> {
    match stream.sender().try_send_request(req).await {
        Ok(resp) => Ok(resp),
        Err(mut e) => {
            let unsent = e.take_message();
            Err((UpstreamError::Http(e.into_error()), unsent))
        }
    }
}

/// `req`, made ready for HTTP/2 to `target`: the URI carries scheme and authority (the
/// `:authority` is the `Host` the request would have had), and HTTP/1.1's framing goes.
pub(super) fn for_h2(req: &mut Request<Body>, target: &Key) {
    let host = req.headers_mut().remove(header::HOST);
    let authority = host
        .and_then(|h| Authority::try_from(h.as_bytes()).ok())
        .or_else(|| req.uri().authority().cloned())
        .unwrap_or_else(|| target.authority.clone());
    let path = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(target.scheme.clone());
    parts.authority = Some(authority);
    parts.path_and_query = Some(path);
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
    *req.version_mut() = Version::HTTP_2;
    // (a GET's body of unknown length was marked chunked for HTTP/1.1; HTTP/2 frames it)
    req.headers_mut().remove(header::TRANSFER_ENCODING);
}

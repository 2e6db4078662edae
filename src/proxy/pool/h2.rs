//! HTTP/2 to upstreams: one connection per target, shared by every worker, each request a
//! stream on it.
//!
//! A target gets a slot here when its upstream speaks only HTTP/2, or when TLS chose `h2` on a
//! connection to it. Requests to a target with a slot go over the slot's connection. The first
//! request makes the connection while the others wait for it, so a burst opens one, not many.
//! A connection that closed (the upstream's GOAWAY, an error) or idled past the pool's `idle`
//! is replaced by the next request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use http::uri::{Authority, PathAndQuery};
use http::{header, Request, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use super::dial::Stream;
use super::{Key, UpstreamError};
use crate::proxy::h1::MAX_HEAD;
use crate::proxy::Body;

type Sender = http2::SendRequest<Body>;

/// The HTTP/2 connections of every worker, one per target.
pub struct Conns {
    slots: Mutex<HashMap<Key, Arc<Slot>, foldhash::fast::RandomState>>,
    /// connections unused this long close
    idle_for: Duration,
    reaping: AtomicBool,
}

/// One target's connection: `None` until made, and again once it closed.
#[derive(Default)]
pub(super) struct Slot {
    conn: Arc<tokio::sync::Mutex<Option<Live>>>,
}

pub(super) struct Live {
    sender: Sender,
    last_used: Instant,
}

/// What [`Slot::sender`] found or made.
pub(super) enum Found {
    /// a connection to send on
    Sender(Sender),
    /// the slot needs a connection; the caller opens one and hands it to [`Slot::start`]
    Empty(tokio::sync::OwnedMutexGuard<Option<Live>>),
}

impl Conns {
    /// No connections yet; those made close after `idle_for` unused.
    pub fn new(idle_for: Duration) -> Conns {
        Conns {
            slots: Mutex::default(),
            idle_for,
            reaping: AtomicBool::new(false),
        }
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
                // (a slot whose connection is being made is busy, not idle)
                if let Ok(mut conn) = slot.conn.try_lock() {
                    let idle = conn
                        .as_ref()
                        .is_some_and(|live| live.last_used.elapsed() >= idle_for);
                    if idle {
                        // streams under way keep the connection open until they end
                        *conn = None;
                    }
                }
            }
        }
    }
}

impl Slot {
    /// The slot's open connection, or the slot itself, locked, for the caller to connect.
    pub(super) async fn sender(&self) -> Found {
        let mut conn = self.conn.clone().lock_owned().await;
        match conn.as_mut() {
            Some(live) if !live.sender.is_closed() => {
                live.last_used = Instant::now();
                Found::Sender(live.sender.clone())
            }
            _ => {
                *conn = None;
                Found::Empty(conn)
            }
        }
    }
}

/// Starts HTTP/2 on `stream` and keeps the connection in `slot`.
pub(super) async fn start(
    slot: &mut Option<Live>,
    stream: Stream,
) -> Result<Sender, UpstreamError> {
    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        // response heads are bounded as over HTTP/1.1
        .max_header_list_size(MAX_HEAD as u32)
        // streamed bodies (gRPC) get the window they use
        .adaptive_window(true)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(UpstreamError::Http)?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "upstream HTTP/2 connection ended with an error");
        }
    });
    *slot = Some(Live {
        sender: sender.clone(),
        last_used: Instant::now(),
    });
    Ok(sender)
}

/// Sends `req` on `sender`; the request back when the connection closed before taking it.
pub(super) async fn send(
    sender: &mut Sender,
    req: Request<Body>,
) -> Result<hyper::Response<Incoming>, (UpstreamError, Option<Request<Body>>)> {
    match sender.try_send_request(req).await {
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

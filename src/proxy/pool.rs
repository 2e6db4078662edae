//! tollgate's own pool of upstream connections, one per worker thread, over hyper's low-level
//! HTTP/1 client (`hyper::client::conn::http1`).
//!
//! A worker's requests only ever use its own pool, so the pool is a small map from target to a
//! stack of idle connections behind a mutex nobody else contends for. A connection goes back
//! on the stack when the response body has been read to its end (not before: HTTP/1 carries one
//! response at a time), is taken most-recently-used first, and is dropped when it has idled
//! past `idle` (checked on checkout, and by a reaper task while connections idle). A request
//! that a just-closed idle connection did not take (hyper hands it back unsent) goes out on the
//! next connection, as hyper-util's pool does.
//!
//! A request without a body to a cleartext target (most requests) goes over tollgate's own
//! HTTP/1.1 client instead (`h1`): the exchange is driven by the request's own task, with no
//! connection task between. Those connections have their own idle stacks, kept the same way.
//! A request on a reused one that finds it closed before any response byte (the upstream
//! closed it while it idled) goes out again, once, on a new connection when that is safe (see
//! [`Pool::exchange`]).
//!
//! HTTP/2 connections are shared by every worker, one per target ([`h2`]). How a connection
//! is made, and which HTTP version it speaks, is the target's upstream's [`Dial`].

mod dial;
mod h2;
mod peer;
mod pooled;
mod replay;

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use http::uri::{Authority, Scheme};
use http::{header, Method, Request, Response, StatusCode, Uri};
use hyper::body::{Body as HttpBody, Incoming};
use hyper::client::conn::http1;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tower_service::Service;

use super::h1;
use super::{Body, BoxError};
pub use dial::{Dial, H2Settings, Protocol};
use dial::{Opened, Stream};
pub use h2::{Conns as H2Conns, Waits};
pub use pooled::Pooled;
use pooled::{Back, Home};

/// Which HTTP/1 client carries a request without a body to an `http://` target. Every other
/// request goes over hyper's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Http1Client {
    /// tollgate's own ([`h1`]): the request's task drives the exchange
    #[default]
    Own,
    /// hyper's, as for every other request. The forwarding tests run through both.
    Library,
}

/// The head of a request without a body, to send it again: to another target, or on a new
/// connection.
pub(super) struct Resend {
    method: http::Method,
    uri: Uri,
    headers: http::HeaderMap,
}

impl Resend {
    pub(super) fn of(req: &Request<Body>) -> Resend {
        Resend {
            method: req.method().clone(),
            uri: req.uri().clone(),
            headers: req.headers().clone(),
        }
    }

    /// The same request, with an empty body.
    pub(super) fn request(self: Box<Self>) -> Request<Body> {
        let mut req = Request::new(http_body_util::BodyExt::boxed(
            http_body_util::BodyExt::map_err(http_body_util::Empty::new(), BoxError::from),
        ));
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.version_mut() = http::Version::HTTP_11;
        *req.headers_mut() = self.headers;
        req
    }
}

/// Idle connections kept per target and worker (as hyper-util's `pool_max_idle_per_host` was).
const MAX_IDLE: usize = 1024;

/// A target: scheme and authority, and how connections to it are made, hashed once (an
/// `Authority` hashes case-insensitively, byte by byte, and the pool looks a target up twice
/// per request). Two upstreams with the same target and different TLS settings or protocols
/// are two keys: they never share a connection.
#[derive(Debug, Clone)]
pub struct Key {
    scheme: Scheme,
    authority: Authority,
    dial: Arc<Dial>,
    hash: u64,
}

impl Key {
    /// The target at `scheme://authority`, connected to as `dial` says.
    pub fn new(scheme: Scheme, authority: Authority, dial: Arc<Dial>) -> Key {
        let via = Arc::as_ptr(&dial) as usize;
        let hash = foldhash::fast::FixedState::default().hash_one((&scheme, &authority, via));
        Key {
            scheme,
            authority,
            dial,
            hash,
        }
    }

    /// Its authority (`host:port`).
    pub fn authority(&self) -> &Authority {
        &self.authority
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        // The same bytes first: the pool compares a target with itself twice per request, and
        // `Authority`'s own comparison is case-insensitive, byte by byte. It still decides when
        // the bytes differ.
        self.hash == other.hash
            && Arc::ptr_eq(&self.dial, &other.dial)
            && self.scheme == other.scheme
            && (self.authority.as_str() == other.authority.as_str()
                || self.authority == other.authority)
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}
type Sender = http1::SendRequest<Body>;

/// One worker's upstream connections.
pub struct Pool {
    /// requests without a body to `http://` targets go over the own client
    own: bool,
    inner: Arc<Inner>,
}

struct Inner {
    /// TCP connections, before TLS
    tcp: HttpConnector,
    /// every worker's HTTP/2 connections
    h2: Arc<H2Conns>,
    idle_for: Duration,
    idle: IdleMap<Sender>,
    /// connections of tollgate's own client (`h1`), idle
    own_idle: IdleMap<h1::Conn>,
    reaping: AtomicBool,
}

struct Idle<C> {
    conn: C,
    since: Instant,
}

/// Why an upstream exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// no connection could be made (refused, timed out, TLS handshake failed)
    #[error("{0}")]
    Connect(#[source] BoxError),
    /// the same, for a request sent by hyper's client (one with a body, to a TLS target, or
    /// asking for an upgrade): none of it was read, and the request is handed back
    /// ([`UpstreamError::take_unsent`]) to be sent to another target
    #[error("{0}")]
    Unsent(#[source] BoxError, Box<Request<Body>>),
    /// the connection failed while sending the request or reading the response head
    #[error("{0}")]
    Http(#[source] hyper::Error),
    /// the same, on a connection of tollgate's own client
    #[error("{0}")]
    Exchange(#[source] h1::Error),
    /// the response uses what tollgate does not pass on (a transfer coding other than chunked)
    #[error("{0}")]
    Unsupported(&'static str),
    /// the target's scheme and authority make no URI to connect to
    #[error("target is not a URI")]
    NoAuthority,
    /// every HTTP/2 stream the target's connections allow stayed in use this long
    #[error("no HTTP/2 stream to the target came free within {0:?}")]
    Busy(Duration),
}

impl UpstreamError {
    /// Nothing reached the target: it could not be connected to.
    pub fn is_connect(&self) -> bool {
        matches!(self, UpstreamError::Connect(_) | UpstreamError::Unsent(..))
    }

    /// The request a failed connection left unsent, when the pool handed it back; the error
    /// stays the connection's.
    pub fn take_unsent(&mut self) -> Option<Box<Request<Body>>> {
        match std::mem::replace(self, UpstreamError::NoAuthority) {
            UpstreamError::Unsent(e, req) => {
                *self = UpstreamError::Connect(e);
                Some(req)
            }
            other => {
                *self = other;
                None
            }
        }
    }
}

impl Pool {
    /// A pool connecting through `tcp`, sharing `h2` with the other workers' pools;
    /// connections idle for longer than `idle` close. `http1` carries the requests without a
    /// body to `http://` targets.
    pub fn new(tcp: HttpConnector, h2: Arc<H2Conns>, idle: Duration, http1: Http1Client) -> Pool {
        Pool {
            own: http1 == Http1Client::Own,
            inner: Arc::new(Inner {
                tcp,
                h2,
                idle_for: idle,
                idle: Mutex::new(HashMap::default()),
                own_idle: Mutex::new(HashMap::default()),
                reaping: AtomicBool::new(false),
            }),
        }
    }

    /// Sends `req` (origin-form URI, as HTTP/1 sends it) to `target` over an idle connection
    /// to it, or a new one; the response's body hands the connection back when it has been
    /// read to the end.
    // (an `async` block, not an `async fn`: an `async fn` keeps its arguments twice in its
    // future, as arguments and as the body's own bindings — the request 240 bytes more)
    #[allow(clippy::manual_async_fn)] // the point: see above
    pub fn request<'a>(
        &'a self,
        target: &'a Key,
        mut req: Request<Body>,
        waits: Option<&'a Waits>,
    ) -> impl Future<Output = Result<Response<Pooled>, UpstreamError>> + Send + 'a {
        async move {
            let switching =
                req.method() == Method::CONNECT || req.headers().contains_key(header::UPGRADE);
            if self.own
                && target.scheme == Scheme::HTTP
                && !target.dial.h2_only()
                && req.body().is_end_stream()
                && !switching
            {
                return self.exchange(target, &req).await;
            }
            // (a cleartext target speaks HTTP/2 only when told to: no lookup for the others)
            let maybe_h2 = target.dial.h2_only()
                || (target.scheme == Scheme::HTTPS && target.dial.protocol() == Protocol::Auto);
            if maybe_h2 && !switching {
                if let Some(slot) = self.inner.h2.slot(target, target.dial.h2_only()) {
                    return Box::pin(self.over_h2(target, &slot, None, req, waits)).await;
                }
            }
            // A request without a body and with an idempotent method goes again, once, on a new
            // connection when a reused one closes before its response, as on the own client.
            let mut again = (req.body().is_end_stream() && req.method().is_idempotent())
                .then(|| Box::new(Resend::of(&req)));
            while let Some(mut sender) = self.checkout(target) {
                match sender.try_send_request(req).await {
                    Ok(resp) => return self.inner.pooled(resp, target.clone(), sender),
                    Err(mut e) => match e.take_message() {
                        // closed before the request was written: it goes out on the next one
                        Some(unsent) => req = unsent,
                        None if e.error().is_incomplete_message() && again.is_some() => {
                            req = again.take().expect("checked just above").request();
                            break;
                        }
                        None => return Err(UpstreamError::Http(e.into_error())),
                    },
                }
            }
            // boxed: a new connection is the rare case, and its future (TLS session and all)
            // would otherwise make every request's future, and its allocation, kilobytes larger
            let opened = match Box::pin(self.open(target, switching)).await {
                Ok(opened) => opened,
                // nothing of the request was read: it goes back, for another target
                Err(UpstreamError::Connect(e)) => {
                    return Err(UpstreamError::Unsent(e, Box::new(req)))
                }
                Err(e) => return Err(e),
            };
            if opened.h2 {
                // TLS chose HTTP/2: the target's requests go over this connection from now on
                let slot = self.inner.h2.slot(target, true).expect("made when asked");
                let over = self.over_h2(target, &slot, Some(opened.stream), req, waits);
                return Box::pin(over).await;
            }
            let mut sender = self.handshake(opened.stream).await?;
            match sender.send_request(req).await {
                Ok(resp) => self.inner.pooled(resp, target.clone(), sender),
                Err(e) => Err(UpstreamError::Http(e)),
            }
        }
    }

    /// Sends `req` over one of `target`'s HTTP/2 connections in `slot`: one with a stream
    /// free, else `opened`, else a new one. A request the connection closed on before taking
    /// it goes again, once; so does one the upstream did not process (GOAWAY, REFUSED_STREAM),
    /// on another connection. Should TLS choose HTTP/1.1 on a new connection, the target's
    /// slot goes and the request goes over HTTP/1.1.
    async fn over_h2(
        &self,
        target: &Key,
        slot: &Arc<h2::Slot>,
        mut opened: Option<Stream>,
        mut req: Request<Body>,
        waits: Option<&Waits>,
    ) -> Result<Response<Pooled>, UpstreamError> {
        h2::for_h2(&mut req, target);
        let settings = target.dial.h2_settings();
        let mut again = Some(replay::Again::keep(&mut req));
        let mut retried = false;
        loop {
            let stream = match slot.stream(settings.max_connections, waits).await? {
                h2::Acquired::Stream(stream) => stream,
                h2::Acquired::Open(opening) => {
                    let stream = match opened.take() {
                        Some(stream) => stream,
                        None => match self.open(target, false).await {
                            Ok(Opened { stream, h2: true }) => stream,
                            Ok(Opened { stream, h2: false }) => {
                                self.inner.h2.forget(target);
                                drop(opening);
                                return self.over_h1_instead(target, stream, req).await;
                            }
                            Err(UpstreamError::Connect(e)) => {
                                return Err(UpstreamError::Unsent(e, Box::new(req)))
                            }
                            Err(e) => return Err(e),
                        },
                    };
                    match h2::start(stream, &settings, self.inner.h2.connect()).await {
                        Ok(conn) => opening.made(conn),
                        // (a peer that sends no SETTINGS was not connected to)
                        Err(UpstreamError::Connect(e)) => {
                            return Err(UpstreamError::Unsent(e, Box::new(req)))
                        }
                        Err(e) => return Err(e),
                    }
                }
            };
            if let Some(waits) = waits {
                waits.sent_on(&stream);
            }
            match h2::send(&stream, req).await {
                Ok(resp) => {
                    let (parts, body) = resp.into_parts();
                    let body = Pooled::hyper(body, None, Some(stream));
                    return Ok(Response::from_parts(parts, body));
                }
                Err((_, Some(unsent))) if !retried => {
                    // (closing: the next try must not find it)
                    stream.retire();
                    retried = true;
                    req = unsent;
                }
                Err((e, None)) if h2::unprocessed(&e) => {
                    // RFC 9113 §8.7: not processed, so safe to send again, whatever the method
                    stream.retire();
                    drop(stream);
                    match again.take() {
                        Some(again) => match again.request().await {
                            Some(next) => req = next,
                            None => return Err(e),
                        },
                        None => return Err(e),
                    }
                    tracing::debug!(target = %target.authority, "upstream did not process an HTTP/2 stream: sent again");
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Sends `req` over HTTP/1.1 on `stream`, a new connection to `target` on which TLS chose
    /// HTTP/1.1 rather than HTTP/2.
    async fn over_h1_instead(
        &self,
        target: &Key,
        stream: Stream,
        mut req: Request<Body>,
    ) -> Result<Response<Pooled>, UpstreamError> {
        let mut sender = self.handshake(stream).await?;
        *req.version_mut() = http::Version::HTTP_11;
        match sender.send_request(req).await {
            Ok(resp) => self.inner.pooled(resp, target.clone(), sender),
            Err(e) => Err(UpstreamError::Http(e)),
        }
    }

    /// Sends `req` (no body, no protocol switch, a cleartext target) over tollgate's own
    /// client: on an idle connection to `target`, or a new one.
    ///
    /// A reused connection found closed before any byte of the response is most likely one the
    /// upstream closed while it idled (its keep-alive timeout): the request goes again, once,
    /// on a new connection, if it was not written whole or its method is idempotent (RFC 9110
    /// §9.2.2). An upstream that closes without answering a request it did read would see an
    /// idempotent one twice, never more.
    async fn exchange(
        &self,
        target: &Key,
        req: &Request<Body>,
    ) -> Result<Response<Pooled>, UpstreamError> {
        if let Some(conn) = self.checkout_own(target) {
            match conn.exchange(req, self.home(target)).await {
                Ok(resp) => return Ok(resp.map(Pooled::own)),
                Err(h1::Error::Closed { sent, .. }) if !sent || req.method().is_idempotent() => {}
                Err(e) => return Err(UpstreamError::Exchange(e)),
            }
        }
        let conn = Box::pin(self.connect_own(target)).await?;
        match conn.exchange(req, self.home(target)).await {
            Ok(resp) => Ok(resp.map(Pooled::own)),
            Err(e) => Err(UpstreamError::Exchange(e)),
        }
    }

    fn home(&self, key: &Key) -> Home {
        Home {
            pool: Arc::downgrade(&self.inner),
            key: key.clone(),
        }
    }

    /// The most recently used idle connection of the own client to `key` that is still open.
    fn checkout_own(&self, key: &Key) -> Option<h1::Conn> {
        loop {
            let mut idle = {
                let mut map = self
                    .inner
                    .own_idle
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                map.get_mut(key)?.pop()?
            };
            if idle.since.elapsed() < self.inner.idle_for && idle.conn.idle_and_open() {
                return Some(idle.conn);
            }
        }
    }

    /// A new connection of the own client to `target` (cleartext).
    async fn connect_own(&self, target: &Key) -> Result<h1::Conn, UpstreamError> {
        match self.open(target, false).await?.stream {
            Stream::Plain(tcp) => Ok(h1::Conn::new(tcp)),
            Stream::Tls(_) => Err(UpstreamError::NoAuthority),
        }
    }

    /// The most recently used idle connection to `key` that is still open and ready.
    fn checkout(&self, key: &Key) -> Option<Sender> {
        loop {
            let idle = {
                let mut map = self.inner.idle.lock().unwrap_or_else(|e| e.into_inner());
                map.get_mut(key)?.pop()?
            };
            if idle.since.elapsed() >= self.inner.idle_for || idle.conn.is_closed() {
                continue;
            }
            if idle.conn.is_ready() {
                return Some(idle.conn);
            }
            // Still finishing its last exchange (a request body the upstream answered before
            // reading, say): it comes back when it is ready, and this request does not wait.
            let mut back = Back {
                pool: Arc::downgrade(&self.inner),
                key: key.clone(),
                sender: idle.conn,
            };
            tokio::spawn(async move {
                if back.sender.ready().await.is_ok() {
                    back.give();
                }
            });
        }
    }

    /// HTTP/1.1 on a new connection, driven by a task of this worker.
    async fn handshake(&self, stream: Stream) -> Result<Sender, UpstreamError> {
        // (response heads are bounded as the own client bounds them)
        let (sender, connection) = http1::Builder::new()
            .max_buf_size(h1::MAX_HEAD)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(UpstreamError::Http)?;
        tokio::spawn(async move {
            if let Err(e) = connection.with_upgrades().await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    /// A new connection to `target`, TLS handshake done when its scheme is `https`; with
    /// `switching`, one that speaks HTTP/1.1.
    async fn open(&self, target: &Key, switching: bool) -> Result<Opened, UpstreamError> {
        let uri = Uri::builder()
            .scheme(target.scheme.clone())
            .authority(target.authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|_| UpstreamError::NoAuthority)?;
        let mut tcp = self.inner.tcp.clone();
        std::future::poll_fn(|cx| tcp.poll_ready(cx))
            .await
            .map_err(|e| UpstreamError::Connect(e.into()))?;
        let io = tcp
            .call(uri)
            .await
            .map_err(|e| UpstreamError::Connect(e.into()))?;
        target
            .dial
            .over(
                io.into_inner(),
                &target.scheme,
                &target.authority,
                switching,
            )
            .await
            .map_err(|e| UpstreamError::Connect(e.into()))
    }
}

/// Whether `Transfer-Encoding` names a coding other than `chunked`.
fn other_coding(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .any(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"chunked"))
}

impl Inner {
    /// `resp` with a body that hands `sender` back when it ends (at once when it is empty); a
    /// switched (upgraded) connection is not the pool's any more. A body in a transfer coding
    /// other than chunked is refused, as tollgate's own client refuses its head (hyper's takes
    /// the chunked coding off and leaves the others on the bytes); its connection is closed.
    fn pooled(
        self: &Arc<Inner>,
        resp: Response<Incoming>,
        key: Key,
        sender: Sender,
    ) -> Result<Response<Pooled>, UpstreamError> {
        if !resp.body().is_end_stream() && other_coding(resp.headers()) {
            return Err(UpstreamError::Unsupported(super::hop::OTHER_CODING));
        }
        let switched = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        let mut back = (!switched).then(|| Back {
            pool: Arc::downgrade(self),
            key,
            sender,
        });
        if resp.body().is_end_stream() {
            if let Some(back) = back.take() {
                back.give();
            }
        }
        Ok(resp.map(|body| Pooled::hyper(body, back, None)))
    }

    fn put(self: &Arc<Inner>, key: Key, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        push(&self.idle, key, sender, |idle| !idle.conn.is_closed());
        self.reap_later();
    }

    fn put_own(self: &Arc<Inner>, key: Key, conn: h1::Conn) {
        push(&self.own_idle, key, conn, |idle| idle.conn.idle_and_open());
        self.reap_later();
    }

    fn reap_later(self: &Arc<Inner>) {
        if !self.reaping.swap(true, Ordering::Relaxed) {
            tokio::spawn(reap(Arc::downgrade(self), self.idle_for));
        }
    }
}

type IdleMap<C> = Mutex<HashMap<Key, Vec<Idle<C>>, foldhash::fast::RandomState>>;

/// `conn` on top of `key`'s idle stack, unless the stack is full of connections that `open`
/// finds still open.
fn push<C>(map: &IdleMap<C>, key: Key, conn: C, open: impl FnMut(&mut Idle<C>) -> bool) {
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    let stack = map.entry(key).or_default();
    if stack.len() >= MAX_IDLE {
        stack.retain_mut(open);
        if stack.len() >= MAX_IDLE {
            return;
        }
    }
    stack.push(Idle {
        conn,
        since: Instant::now(),
    });
}

/// Drops the connections of `map` idle past `idle_for` or that `open` finds closed.
fn expire<C>(map: &IdleMap<C>, idle_for: Duration, mut open: impl FnMut(&mut Idle<C>) -> bool) {
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    for stack in map.values_mut() {
        stack.retain_mut(|idle| idle.since.elapsed() < idle_for && open(idle));
    }
    map.retain(|_, stack| !stack.is_empty());
}

/// Closes connections idle past `idle_for`, until the pool is gone.
async fn reap(pool: Weak<Inner>, idle_for: Duration) {
    let every = (idle_for / 2).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(every).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        expire(&pool.idle, idle_for, |idle| !idle.conn.is_closed());
        expire(&pool.own_idle, idle_for, |idle| idle.conn.idle_and_open());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(scheme: Scheme, authority: &str) -> Key {
        static DIAL: std::sync::OnceLock<Arc<Dial>> = std::sync::OnceLock::new();
        let dial = DIAL.get_or_init(Dial::for_tests).clone();
        Key::new(scheme, authority.parse().expect("test authority"), dial)
    }

    /// A target is one key whatever the case of its host (its hash is made once, as the
    /// authority compares); scheme and port tell targets apart.
    #[test]
    // (a key hashes and compares by its dial's address, never by what the dial holds)
    #[allow(clippy::mutable_key_type)]
    fn keys_compare_as_their_targets() {
        let mut map: HashMap<Key, u32, foldhash::fast::RandomState> = HashMap::default();
        map.insert(key(Scheme::HTTP, "api.example:8080"), 1);
        assert_eq!(map.get(&key(Scheme::HTTP, "API.Example:8080")), Some(&1));
        assert_eq!(map.get(&key(Scheme::HTTPS, "api.example:8080")), None);
        assert_eq!(map.get(&key(Scheme::HTTP, "api.example:8081")), None);
    }
}

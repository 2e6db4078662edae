//! Forwarding to the upstream: the worker's connection pool (`pool`), the request rewritten for the
//! upstream (target, path, hop-by-hop headers removed, `X-Forwarded-*` added), the response
//! streamed back. Bodies stream both ways and are never buffered whole. For an `Upgrade`
//! request (WebSocket) that the upstream accepts with 101, it hands back both connections'
//! sides, which become a byte tunnel ([`super::tunnel`]).
//!
//! Does not own routing, limits or the error responses: it reports a [`ProxyError`] and
//! `respond` turns it into a status.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{Either, FutureExt};
use http::header::{self, Entry, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;

use super::access::Report;
pub use super::hop::{strip_hop_by_hop, Message};
use super::pool::{
    Dial, H2Conns, Http1Client, Key, Pool, Pooled, Protocol, Resend, UpstreamError, Waits,
};
use super::tunnel::Tunnel;
use super::upload::{head_in_time, Upload};
use super::{Body, BoxError, ProxyError};
use hyper_util::client::legacy::connect::HttpConnector;

/// One pooled client per worker thread (`app::workers`): a client connection's requests go out
/// over the pool of the thread that serves it, so an upstream connection is only ever driven by
/// the thread whose requests use it (no cross-thread wake-up per request). HTTP/2 connections
/// are the exception: every worker shares one per target.
#[derive(Clone)]
pub struct UpstreamClients {
    pools: Arc<[Pool]>,
    /// how upstreams without `tls` settings connect, by protocol: made once, so that their
    /// connections outlive reloads
    defaults: Arc<[Arc<Dial>; 3]>,
}

/// TCP keepalive probes on upstream connections.
const UPSTREAM_KEEPALIVE: Duration = Duration::from_secs(60);

impl UpstreamClients {
    /// `workers` clients whose connections time out after `connect` and idle out after
    /// `idle`; `tls` is the TLS setup of upstreams without settings of their own.
    pub fn new(
        workers: usize,
        connect: Duration,
        idle: Duration,
        http1: Http1Client,
        tls: rustls::ClientConfig,
    ) -> UpstreamClients {
        let mut tcp = HttpConnector::new();
        // the TLS layer above handles `https://`; the TCP layer must accept it too
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(connect));
        tcp.set_keepalive(Some(UPSTREAM_KEEPALIVE));
        let h2 = Arc::new(H2Conns::new(idle, connect));
        let pools = (0..workers.max(1)).map(|_| Pool::new(tcp.clone(), h2.clone(), idle, http1));
        let dial = |protocol| Arc::new(Dial::new(protocol, tls.clone(), None));
        UpstreamClients {
            pools: pools.collect(),
            defaults: Arc::new([
                dial(Protocol::Http1),
                dial(Protocol::Http2),
                dial(Protocol::Auto),
            ]),
        }
    }

    /// How many workers there are pools for.
    pub fn workers(&self) -> usize {
        self.pools.len()
    }

    /// The pool of worker `worker`: keep-alive connections per target, shared by every route.
    pub fn of(&self, worker: usize) -> &Pool {
        &self.pools[worker % self.pools.len()]
    }

    /// How an upstream without `tls` settings of its own connects, speaking `protocol`.
    pub fn default_dial(&self, protocol: Protocol) -> Arc<Dial> {
        let i = match protocol {
            Protocol::Http1 => 0,
            Protocol::Http2 => 1,
            Protocol::Auto => 2,
        };
        self.defaults[i].clone()
    }
}

/// One upstream's targets, picked round robin. A target that could not be connected to, or
/// sent no response head to a request without a body within `upstream_response`, is left out
/// of the rotation for [`EJECT_FOR`] (a passive health check, as nginx's `max_fails=1`, which
/// counts errors and timeouts), unless every target is out; and a request without a body that
/// could not be connected goes once to another target (nothing of it was sent: as nginx's
/// `proxy_next_upstream error`).
#[derive(Debug)]
pub struct Targets {
    targets: Vec<Target>,
    next: AtomicUsize,
    clock: Instant,
}

/// One target of an upstream.
#[derive(Debug)]
struct Target {
    /// what the pool knows it by
    key: Key,
    /// its authority as a `Host` value
    host: HeaderValue,
    /// ms on [`Targets::now_ms`] until which it is left out; 0: in the rotation
    down_until: AtomicU64,
}

/// How long a target that refused (or timed out) a connection, or did not answer in time, is
/// left out of the rotation.
pub const EJECT_FOR: Duration = Duration::from_secs(2);

impl Targets {
    /// Targets from their URIs (`http://host:port`), connected to as `dial` says; entries
    /// without scheme or authority are refused by config validation before this point and
    /// skipped here.
    pub fn new(uris: &[Uri], dial: Arc<Dial>) -> Targets {
        let targets = uris
            .iter()
            .filter_map(|u| {
                let (scheme, authority) = (u.scheme()?, u.authority()?);
                Some(Target {
                    host: HeaderValue::from_str(authority.as_str()).ok()?,
                    key: Key::new(scheme.clone(), authority.clone(), dial.clone()),
                    down_until: AtomicU64::new(0),
                })
            })
            .collect();
        Targets {
            targets,
            next: AtomicUsize::new(0),
            clock: Instant::now(),
        }
    }

    /// ms since these targets were made, never 0 (0 means "in the rotation").
    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64 + 1
    }

    fn is_up(&self, i: usize, now: u64) -> bool {
        self.targets[i].down_until.load(Ordering::Relaxed) <= now
    }

    /// The next target in turn that is in the rotation; when none is, the next in turn.
    fn pick(&self) -> Option<usize> {
        let n = self.targets.len();
        if n <= 1 {
            // one target is the pick whether it is in the rotation or not: no turn to take (a
            // counter every worker writes per request) and no clock to read
            return (n == 1).then_some(0);
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| self.is_up(i, now))
            .or(Some(start % n))
    }

    /// A target other than `failed` that is in the rotation, for a second attempt.
    fn pick_other(&self, failed: usize) -> Option<usize> {
        let n = self.targets.len();
        let now = self.now_ms();
        (1..n)
            .map(|k| (failed + k) % n)
            .find(|&i| self.is_up(i, now))
    }

    /// Target `i` could not be connected to (or did not answer, `why`): leave it out for
    /// [`EJECT_FOR`].
    fn failed(&self, i: usize, upstream: &str, why: &str) {
        let until = self.now_ms() + EJECT_FOR.as_millis() as u64;
        if self.targets[i].down_until.swap(until, Ordering::Relaxed) == 0 {
            tracing::warn!(upstream, target = %self.targets[i].key.authority(),
                "upstream target {why}: left out of the rotation for {EJECT_FOR:?} at a time");
        }
    }

    /// The authority of target `i`, `host:port`, as the access log names it.
    pub fn authority(&self, i: usize) -> Option<&http::uri::Authority> {
        self.targets.get(i).map(|t| t.key.authority())
    }

    /// Target `i` answered: back in the rotation.
    fn succeeded(&self, i: usize, upstream: &str) {
        if self.targets[i].down_until.load(Ordering::Relaxed) != 0
            && self.targets[i].down_until.swap(0, Ordering::Relaxed) != 0
        {
            tracing::info!(upstream, target = %self.targets[i].key.authority(),
                "upstream target reachable again");
        }
    }
}

/// Why a target that could not be connected to is left out (for the log).
const UNREACHABLE: &str = "unreachable";

/// What the forward phase needs to know about the request beyond the request itself.
pub struct Forward<'a> {
    /// upstream name, for errors
    pub upstream: &'a str,
    /// its targets
    pub targets: &'a Targets,
    /// keep the client's Host
    pub preserve_host: bool,
    /// the path to send (normalised, prefix stripped)
    pub path: &'a str,
    /// the address appended to X-Forwarded-For: the TCP peer tollgate heard the request from
    /// (RFC 7239 §5.2 semantics, as nginx's `$proxy_add_x_forwarded_for`), not the client
    /// identity derived from X-Forwarded-For, which is already in the list
    pub client: &'a HeaderValue,
    /// `https` when the client came over TLS
    pub proto: &'static str,
    /// the `X-Real-IP` to send, the client tollgate identified; `None`: the client's own
    /// header goes on as it came (`forwarded_headers.x_real_ip: false`)
    pub real_ip: Option<HeaderValue>,
    /// append tollgate's element to `Forwarded` (`forwarded_headers.forwarded`)
    pub forwarded: bool,
    /// the TCP peer is a trusted proxy: the `X-Forwarded-Proto` and `X-Forwarded-Host` it sent
    /// (a TLS-terminating balancer's `https`) are kept rather than replaced, as Traefik and
    /// Envoy do for trusted hops
    pub trusted_peer: bool,
    /// past this without a response head: 504
    pub response_timeout: Duration,
    /// larger request bodies get 413
    pub max_body_size: Option<u64>,
    /// with the access log on: told the target that answered, and counts the request body
    pub report: Option<&'a Report>,
}

pub(super) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Sends `req` to a target of the upstream and returns its response, body streaming, and the
/// tunnel to open when the upstream switched protocols.
///
/// The request is taken apart and rewritten when this is called; the future returned holds the
/// exchange under way and not the request a second time (an `async fn` would keep its
/// arguments, and the rewritten request, in every state of its future: ~800 bytes per request).
pub(super) fn forward<'a>(
    client: &'a Pool,
    mut req: Request<Incoming>,
    f: &'a Forward<'a>,
) -> impl Future<Output = Result<(Response<Body>, Option<Tunnel>), ProxyError>> + Send + 'a {
    // Taken before the request is rewritten: the client side of a possible tunnel.
    let upgrade = upgrade_protocol(&req);
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    // The request can be sent again, to another target, when no connection could be made to
    // the first: nothing of it reached that target (as nginx's `proxy_next_upstream error`).
    // Without a body its head is kept for that, only when there is another target; with one,
    // the pool hands the request back unsent.
    let bodiless = hyper::body::Body::is_end_stream(req.body());
    let sent = f
        .targets
        .pick()
        .ok_or_else(|| ProxyError::NoTarget(f.upstream.to_string()))
        .and_then(|target| {
            let several = f.targets.targets.len() > 1;
            let (mut upstream_req, host_is_target) = rewrite(req, f, upgrade, target)?;
            // a body's upload is watched: the wait for the head starts when it has ended
            let upload = (!bodiless).then(|| {
                let body = std::mem::take(upstream_req.body_mut());
                let (watched, upload) = Upload::watch(body);
                *upstream_req.body_mut() = watched;
                upload
            });
            // boxed: kept only for a bodiless request to an upstream of several targets (which
            // pays for cloning its head anyway), and every other request's future would
            // otherwise keep room for it
            let again = several.then(|| Again {
                head: bodiless.then(|| Box::new(Resend::of(&upstream_req))),
                host_is_target,
            });
            let start = tokio::time::Instant::now();
            Ok((
                attempts(
                    client,
                    f,
                    target,
                    upstream_req,
                    again,
                    upload.clone(),
                    start,
                ),
                upload,
            ))
        });
    // (a combinator rather than an `async` block: the block would keep `sent` and the
    // exchange it awaits in two slots)
    match sent {
        Err(e) => Either::Left(std::future::ready(Err(e))),
        Ok((attempts, upload)) => Either::Right(
            attempts.map(move |(used, answer)| answered(f, used, answer, client_upgrade, upload)),
        ),
    }
}

/// What the client is sent for the upstream's answer to its request (`None`: no response
/// head in time): the response, its headers made the client's, or the error; and the tunnel
/// when the upstream switched protocols.
fn answered(
    f: &Forward<'_>,
    used: usize,
    answer: Option<Result<Response<Pooled>, UpstreamError>>,
    client_upgrade: Option<OnUpgrade>,
    upload: Option<Arc<Upload>>,
) -> Result<(Response<Body>, Option<Tunnel>), ProxyError> {
    let mut resp = match answer {
        None => {
            // a body that stalled waiting for the client is the client's doing
            if upload.is_some_and(|u| u.stalled_on_client()) {
                return Err(ProxyError::ClientBodyTimeout {
                    after: f.response_timeout,
                });
            }
            f.targets
                .failed(used, f.upstream, "sent no response head in time");
            return Err(ProxyError::UpstreamTimeout {
                upstream: f.upstream.to_string(),
                after: f.response_timeout,
            });
        }
        Some(Err(e)) => {
            if e.is_connect() {
                f.targets.failed(used, f.upstream, UNREACHABLE);
            }
            return Err(upstream_error(f.upstream, e));
        }
        Some(Ok(resp)) => {
            f.targets.succeeded(used, f.upstream);
            resp
        }
    };
    let tunnel = match client_upgrade {
        Some(client) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
            let upstream = hyper::upgrade::on(&mut resp);
            let proto = resp.headers().get(header::UPGRADE).cloned();
            Some((Tunnel { client, upstream }, proto))
        }
        _ => None,
    };
    let (mut parts, body) = resp.into_parts();
    // the client hears tollgate's HTTP version, not the upstream's (an HTTP/1.0 upstream
    // must not turn the client's HTTP/1.1 connection into 1.0)
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers, Message::Response);
    // a 204 has no content and states no length (RFC 9110 §8.6): hyper's HTTP/1 side leaves
    // the field out, its HTTP/2 side would pass on an upstream's
    if parts.status == StatusCode::NO_CONTENT {
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    let tunnel = tunnel.map(|(tunnel, proto)| {
        if let Some(proto) = proto {
            set_upgrade(&mut parts.headers, proto);
        }
        tunnel
    });
    let body = body.stalls_after(f.response_timeout);
    Ok((Response::from_parts(parts, body.boxed()), tunnel))
}

/// Sends `req` to `target`; when no connection could be made and the request can be sent
/// again (`again`), to another target once. Which target answered last, and how: `None` when
/// no response head came in time (`upload::head_in_time`, from `start`; the target named is
/// the one that stayed silent).
/// (An `async` block, as `Pool::request`, so the request is not held twice.)
#[allow(clippy::manual_async_fn)] // the point: see above
fn attempts<'a>(
    client: &'a Pool,
    f: &'a Forward<'a>,
    target: usize,
    req: Request<Body>,
    again: Option<Again>,
    upload: Option<Arc<Upload>>,
    start: tokio::time::Instant,
) -> impl Future<Output = (usize, Option<Result<Response<Pooled>, UpstreamError>>)> + Send + 'a {
    async move {
        let timeout = f.response_timeout;
        let waits = Waits::new(stream_wait(timeout));
        // (the first attempt, and its answer, are gone before the second attempt, so the
        // future holds no room for them while that attempt is under way)
        let (again, other) = {
            let key = &f.targets.targets[target].key;
            if let Some(report) = f.report {
                report.asked(target);
            }
            let first = std::pin::pin!(client.request(key, req, Some(&waits)));
            match head_in_time(first, upload.as_deref(), &waits, timeout, start).await {
                None => {
                    waits.timed_out();
                    return (target, None);
                }
                Some(Err(mut e)) if e.is_connect() => {
                    // the request again: from its head, or as the pool handed it back
                    let unsent = e.take_unsent();
                    let again = again.and_then(|again| {
                        let req = match (again.head, unsent) {
                            (Some(head), _) => head.request(),
                            (None, unsent) => *unsent?,
                        };
                        Some((req, again.host_is_target))
                    });
                    match again.zip(f.targets.pick_other(target)) {
                        Some(second) => second,
                        None => return (target, Some(Err(e))),
                    }
                }
                Some(result) => return (target, Some(result)),
            }
        };
        f.targets.failed(target, f.upstream, UNREACHABLE);
        let (mut again, host_is_target) = again;
        if host_is_target {
            let host = f.targets.targets[other].host.clone();
            again.headers_mut().insert(header::HOST, host);
        }
        // boxed: the rare second attempt would make every request's future larger. Its head is
        // awaited as the first's: the same deadline, moved on by a body still uploading.
        let waits = Waits::new(stream_wait(timeout));
        let key = &f.targets.targets[other].key;
        if let Some(report) = f.report {
            report.asked(other);
        }
        let mut second = Box::pin(client.request(key, again, Some(&waits)));
        let answer = head_in_time(second.as_mut(), upload.as_deref(), &waits, timeout, start).await;
        if answer.is_none() {
            waits.timed_out();
        }
        (other, answer)
    }
}

/// The longest a request waits for a stream on a target's HTTP/2 connections, with
/// `upstream_response` as `timeout`: apart from it, since a full connection is not a slow
/// upstream, and never under [`STREAM_WAIT`].
fn stream_wait(timeout: Duration) -> Duration {
    timeout.max(STREAM_WAIT)
}

/// See [`stream_wait`]: as long as the default `upstream_response`.
const STREAM_WAIT: Duration = Duration::from_secs(30);

/// How a request is sent again to another target when no connection could be made to the
/// first.
struct Again {
    /// without a body, its head, kept; with one, the request is what the pool hands back
    /// unsent ([`UpstreamError::take_unsent`])
    head: Option<Box<Resend>>,
    /// `Host` names the target (not the client's host), so it changes with the target
    host_is_target: bool,
}

/// The protocol an HTTP/1.1 request asks to switch to: WebSocket, when its `Connection` header
/// names `upgrade` (RFC 9110 §7.8) and its `Upgrade` header offers it. WebSocket is the one
/// protocol tunnelled, as Envoy and Traefik do by default. Any other is not passed on. Above
/// all `h2c`: its tunnel would carry requests past routing and limits to the upstream. Since
/// `Upgrade` is hop-by-hop, such a request goes on as a plain one. HTTP/2 has no upgrades.
fn upgrade_protocol<B>(req: &Request<B>) -> Option<HeaderValue> {
    if req.version() != Version::HTTP_11 {
        return None;
    }
    let asks = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    let websocket = || {
        req.headers()
            .get_all(header::UPGRADE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|offer| {
                let name = offer.trim().split('/').next().unwrap_or_default();
                name.eq_ignore_ascii_case("websocket")
            })
    };
    (asks && websocket()).then(|| HeaderValue::from_static("websocket"))
}

/// Puts back the two hop-by-hop headers an upgrade needs on the next hop.
fn set_upgrade(headers: &mut HeaderMap, proto: HeaderValue) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, proto);
}

fn upstream_error(upstream: &str, e: UpstreamError) -> ProxyError {
    let upstream = upstream.to_string();
    // a request body over max_body_size, or one the client sent malformed or cut short,
    // surfaces as the error of the body hyper was sending ("user body", with its cause)
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    let mut client_body = false;
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return ProxyError::BodyTooLarge;
        }
        client_body |= err
            .downcast_ref::<hyper::Error>()
            .is_some_and(|h| h.is_user() && err.source().is_some());
        source = err.source();
    }
    if client_body {
        return ProxyError::BadBody;
    }
    if let UpstreamError::Busy(_) = e {
        // (every stream in use: the target is busy, not down, and a retry may find one)
        return ProxyError::TooManyWaiting {
            upstream,
            retry_after_ms: 1000,
        };
    }
    if e.is_connect() {
        ProxyError::UpstreamConnect {
            upstream,
            source: e,
        }
    } else {
        ProxyError::Upstream {
            upstream,
            source: e,
        }
    }
}

/// The upstream request for target number `target`: origin-form URI (the pool is told the
/// target), HTTP/1.1, headers cleaned and `X-Forwarded-*` added; with `upgrade`, the `Upgrade`
/// handshake headers kept. Also whether its `Host` is the target's authority (rather than the
/// client's host).
fn rewrite(
    req: Request<Incoming>,
    f: &Forward<'_>,
    upgrade: Option<HeaderValue>,
    target: usize,
) -> Result<(Request<Body>, bool), ProxyError> {
    // (a body announced larger than `max_body_size` was refused before the limits)
    let (mut parts, body) = req.into_parts();
    let target_host = &f
        .targets
        .targets
        .get(target)
        .ok_or_else(|| ProxyError::NoTarget(f.upstream.to_string()))?
        .host;
    // An absolute-form target's authority wins over Host (RFC 9112 §3.2.2); for HTTP/2 the
    // URI carries :authority.
    let client_host = parts
        .uri
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        .or_else(|| parts.headers.get(header::HOST).cloned());
    // the client's path and query as they came when the path is sent unchanged (no copy)
    let path_and_query = match parts.uri.path_and_query() {
        // (an absolute-form target without a path, `http://host?q`, has `/` as its path but
        // not in its text: it is written out)
        Some(pq) if pq.path() == f.path && pq.as_str().starts_with('/') => pq.clone(),
        _ => match parts.uri.query() {
            Some(q) => PathAndQuery::try_from(format!("{}?{q}", f.path)),
            None => PathAndQuery::try_from(f.path),
        }
        .map_err(|_| ProxyError::BadRequest("malformed request path"))?,
    };
    parts.uri = Uri::from(path_and_query);
    if parts.version == Version::HTTP_2 {
        join_cookies(&mut parts.headers);
    }
    // an HTTP/2 request goes to the HTTP/1.1 upstream as HTTP/1.1
    parts.version = Version::HTTP_11;
    let headers = &mut parts.headers;
    strip_hop_by_hop(headers, Message::Request);
    if !hyper::body::Body::is_end_stream(&body) {
        // `Expect: 100-continue` was the client's with tollgate, which answers it (hyper sends
        // the 100 when the body is first read, once the limits admitted the request): the
        // upstream is not asked again (as nginx drops it)
        headers.remove(header::EXPECT);
        // A GET or HEAD with a body of unknown length (chunked, or HTTP/2 DATA without a
        // content-length) goes on chunked: hyper's client takes such a request to have no
        // body unless it is told, and would send none of it.
        if matches!(parts.method, Method::GET | Method::HEAD)
            && !headers.contains_key(header::CONTENT_LENGTH)
        {
            headers.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
        }
    }
    if let Some(proto) = upgrade {
        set_upgrade(headers, proto);
    }
    add_forwarding(headers, f, client_host.as_ref());
    let (host, host_is_target) = match (&client_host, f.preserve_host) {
        (Some(h), true) => (h.clone(), false),
        _ => (target_host.clone(), true),
    };
    headers.insert(header::HOST, host);
    let body: Body = match f.max_body_size {
        Some(max) => http_body_util::Limited::new(body, max as usize).boxed(),
        None => body.map_err(BoxError::from).boxed(),
    };
    let body = match f.report {
        Some(report) => report.count(body),
        None => body,
    };
    Ok((Request::from_parts(parts, body), host_is_target))
}

/// Adds what tells the upstream who asked and how: `X-Forwarded-For`, `X-Real-IP`,
/// `Forwarded`, `X-Forwarded-Proto` and `X-Forwarded-Host`; `client_host` is the host the client
/// asked for.
fn add_forwarding(headers: &mut HeaderMap, f: &Forward<'_>, client_host: Option<&HeaderValue>) {
    append_forwarded_for(headers, f.client);
    if let Some(client) = &f.real_ip {
        super::forwarded::set_real_ip(headers, client.clone());
    }
    if f.forwarded {
        super::forwarded::append_forwarded(headers, f.client, f.proto, client_host);
    }
    let keep =
        |headers: &HeaderMap, name: &HeaderName| f.trusted_peer && headers.contains_key(name);
    if !keep(headers, &X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(f.proto));
    }
    if let Some(host) = client_host.filter(|_| !keep(headers, &X_FORWARDED_HOST)) {
        headers.insert(X_FORWARDED_HOST.clone(), host.clone());
    }
}

/// The request's `Content-Length`, when it has one that parses.
pub(super) fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// HTTP/2 lets a client split `Cookie` into several fields; before the request goes on as
/// HTTP/1.1 they are joined with `"; "` into one (RFC 9113 §8.2.3), since HTTP/1.1 servers
/// read a single Cookie header (RFC 6265 §5.4).
fn join_cookies(headers: &mut HeaderMap) {
    let mut values = headers.get_all(header::COOKIE).iter();
    let (Some(first), Some(_)) = (values.next(), values.next()) else {
        return;
    };
    let mut joined = first.as_bytes().to_vec();
    for v in headers.get_all(header::COOKIE).iter().skip(1) {
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(v.as_bytes());
    }
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, v);
    }
}

/// `X-Forwarded-For: <existing>, <client>` (RFC 7239 §5.2 style list; existing lines joined).
/// Without an existing list, the client's value is used as it is (no copy).
fn append_forwarded_for(headers: &mut HeaderMap, client: &HeaderValue) {
    // one lookup of the name (hashed byte by byte: it is not one of `http`'s standard names)
    let mut entry = match headers.entry(&X_FORWARDED_FOR) {
        Entry::Vacant(vacant) => {
            vacant.insert(client.clone());
            return;
        }
        Entry::Occupied(occupied) => occupied,
    };
    let mut value = String::new();
    for v in entry.iter() {
        if let Ok(s) = v.to_str() {
            if !value.is_empty() {
                value.push_str(", ");
            }
            value.push_str(s);
        }
    }
    if value.is_empty() {
        entry.insert(client.clone());
        return;
    }
    value.push_str(", ");
    value.push_str(client.to_str().unwrap_or_default());
    if let Ok(v) = HeaderValue::try_from(value) {
        entry.insert(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).expect("test header name"),
                HeaderValue::from_str(v).expect("test header value"),
            );
        }
        h
    }

    /// Every hop-by-hop header goes, including those `Connection` names (any case, any line);
    /// end-to-end headers stay. A request keeps `te: trailers`, a response its `Trailer`.
    #[test]
    fn strips_every_hop_by_hop_header() {
        let all = headers(&[
            ("connection", "close, X-A"),
            ("connection", " x-b ,keep-alive"),
            ("x-a", "1"),
            ("x-b", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic x"),
            ("proxy-authenticate", "Basic"),
            ("proxy-connection", "keep-alive"),
            ("te", "deflate, Trailers"),
            ("trailer", "x-sum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("x-kept", "1"),
            ("content-length", "3"),
        ]);
        let left = |message| {
            let mut h = all.clone();
            strip_hop_by_hop(&mut h, message);
            // (the order of different names carries no meaning; removal may reorder them)
            let mut left: Vec<String> = h
                .iter()
                .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap()))
                .collect();
            left.sort_unstable();
            left
        };
        // the Content-Length of a message framed by Transfer-Encoding goes with it
        assert_eq!(left(Message::Request), ["te: trailers", "x-kept: 1"]);
        assert_eq!(left(Message::Response), ["trailer: x-sum", "x-kept: 1"]);
        let mut h = headers(&[("te", "gzip")]);
        strip_hop_by_hop(&mut h, Message::Request);
        assert!(h.is_empty(), "a TE without trailers goes");
        let mut h = headers(&[("connection", "keep-alive"), ("content-length", "3")]);
        strip_hop_by_hop(&mut h, Message::Request);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["content-length"], "kept when it frames the message");
    }

    /// Only an HTTP/1.1 request whose Connection names `upgrade` asks for an upgrade.
    #[test]
    fn recognises_upgrade_requests() {
        let offer = |version, upgrade: &str, connection: &str| {
            let mut b = Request::builder()
                .version(version)
                .header(header::UPGRADE, upgrade);
            if !connection.is_empty() {
                b = b.header(header::CONNECTION, connection);
            }
            b.body(()).expect("test request")
        };
        let req = |version, connection: &str| offer(version, "websocket", connection);
        let ws = Some(HeaderValue::from_static("websocket"));
        assert_eq!(upgrade_protocol(&req(Version::HTTP_11, "Upgrade")), ws);
        assert_eq!(
            upgrade_protocol(&req(Version::HTTP_11, "keep-alive, upgrade")),
            ws
        );
        assert_eq!(upgrade_protocol(&req(Version::HTTP_11, "")), None);
        // only WebSocket is tunnelled: an h2c upgrade would carry requests past the routes
        let h2c = offer(Version::HTTP_11, "h2c", "Upgrade, HTTP2-Settings");
        assert_eq!(upgrade_protocol(&h2c), None);
        let offers = offer(Version::HTTP_11, "foo/2, WebSocket", "upgrade");
        assert_eq!(upgrade_protocol(&offers), ws);
        assert_eq!(upgrade_protocol(&req(Version::HTTP_11, "upgrades")), None);
        assert_eq!(upgrade_protocol(&req(Version::HTTP_2, "upgrade")), None);
    }

    /// A target that could not be connected to is left out of the rotation (and is never the
    /// "other" target of a second attempt) until it answers again; with every target out, the
    /// rotation goes on over all of them.
    #[test]
    fn failed_targets_are_left_out_until_they_answer() {
        let uris: Vec<Uri> = [
            "http://127.0.0.1:1",
            "http://127.0.0.1:2",
            "http://127.0.0.1:3",
        ]
        .iter()
        .map(|u| u.parse().expect("test uri"))
        .collect();
        let t = Targets::new(&uris, Dial::for_tests());
        let picks: Vec<usize> = (0..6).filter_map(|_| t.pick()).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        t.failed(1, "api", UNREACHABLE);
        let picks: Vec<usize> = (0..6).filter_map(|_| t.pick()).collect();
        assert!(!picks.contains(&1), "{picks:?}");
        assert_eq!(t.pick_other(0), Some(2));
        assert_eq!(t.pick_other(2), Some(0));
        t.failed(0, "api", UNREACHABLE);
        t.failed(2, "api", UNREACHABLE);
        assert_eq!(t.pick_other(0), None);
        let picks: Vec<usize> = (0..3).filter_map(|_| t.pick()).collect();
        assert_eq!(picks.len(), 3, "all out: the rotation goes on");
        t.succeeded(1, "api");
        let picks: Vec<usize> = (0..3).filter_map(|_| t.pick()).collect();
        assert_eq!(picks, [1, 1, 1]);
        assert_eq!(Targets::new(&[], Dial::for_tests()).pick(), None);
    }

    /// Several Cookie fields become one, joined by `"; "` in order; one field is left alone.
    #[test]
    fn joins_split_cookies() {
        let mut h = headers(&[("cookie", "a=1"), ("cookie", "b=2; c=3"), ("cookie", "d=4")]);
        join_cookies(&mut h);
        let all: Vec<_> = h.get_all(header::COOKIE).iter().collect();
        assert_eq!(all, ["a=1; b=2; c=3; d=4"]);
        let mut h = headers(&[("cookie", "a=1")]);
        join_cookies(&mut h);
        assert_eq!(
            h.get(header::COOKIE).map(|v| v.as_bytes()),
            Some(&b"a=1"[..])
        );
    }

    /// X-Forwarded-For lines are joined in order and the address goes last.
    #[test]
    fn appends_to_x_forwarded_for() {
        let mut h = headers(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2"),
        ]);
        append_forwarded_for(&mut h, &HeaderValue::from_static("10.0.0.1"));
        let all: Vec<_> = h.get_all(&X_FORWARDED_FOR).iter().collect();
        assert_eq!(all, ["1.1.1.1, 2.2.2.2, 10.0.0.1"]);
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, &HeaderValue::from_static("::1"));
        assert_eq!(
            h.get(&X_FORWARDED_FOR).map(|v| v.as_bytes()),
            Some(&b"::1"[..])
        );
    }
}

//! The request path, as one function per phase, in the order they run ([`Proxy::phases`]):
//!
//! 1. **identify**: the client's address (trusted proxies, `X-Forwarded-For`). It runs first,
//!    so that a request no route takes is logged with its client too;
//! 2. **route**: read the path as the upstream will, pick the first matching route (404 when
//!    none);
//! 3. **limit**: each limit in order; the first denial answers 429 (leaky-bucket limits sleep);
//! 4. **pace**: the upstream's shared leaky bucket, sleeping the delay (503 past `max_delay`);
//! 5. **forward**: to a target, streaming both ways. Then what the pace phase left applies to
//!    the upstream's answer: back-pressure, and the adaptive pace's count;
//! 6. **respond**: the rate-limit headers of the route's limits on whatever came back.
//!
//! A request comes with its id ([`request_id`]), which goes upstream and back to the client.
//! Errors map to status codes in one place ([`ProxyError::status`]). This module knows the
//! store only through the [`Store`] trait.

pub mod access;
pub mod adapt;
mod charge;
mod error;
pub mod forward;
mod forwarded;
pub mod h1;
mod hop;
pub mod inflight;
mod limits;
mod owed;
pub mod pacing;
pub mod pool;
pub mod request_id;
pub mod respond;
pub mod slots;
mod tunnel;
mod upload;

use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use ipnet::IpNet;
use tokio_util::task::TaskTracker;

use crate::identity::{self, KeyContext};
use crate::metrics::{Metrics, RouteSeries};
use crate::routing::{
    self, AuthorityFault, PathMatch, PathPolicy, RequestParts, RequestPath, RouteTable,
};
use crate::store::Store;
use respond::Showing;

pub use error::ProxyError;
pub use forward::{Targets, UpstreamClients};
pub use forwarded::IdentityHeaders;
pub use limits::{Charge, Limit};
pub use pacing::Pacer;
pub use pool::{Dial, H2Settings, Http1Client, Protocol};
pub use respond::HeaderStyle;

/// Boxed error of a streamed body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of every response the proxy sends (and of requests it forwards).
pub type Body = BoxBody<Bytes, BoxError>;

/// A route, ready to serve.
pub struct Route {
    /// its name (metrics, keys, logs)
    pub name: Arc<str>,
    /// with `strip_prefix`, the prefix to remove before forwarding
    pub strip: Option<PathMatch>,
    /// `match.case_sensitive`: when `false`, limits key on the path in ASCII lowercase
    pub case_sensitive: bool,
    /// where matched requests go
    pub upstream: Arc<Upstream>,
    /// checked in order
    pub limits: Vec<Limit>,
    /// its request metrics, found once
    pub series: RouteSeries,
}

/// An upstream, ready to serve.
pub struct Upstream {
    /// its name
    pub name: Arc<str>,
    /// round-robin targets
    pub targets: Targets,
    /// forward the client's Host
    pub preserve_host: bool,
    /// outbound pacing, if any
    pub pacer: Option<Pacer>,
    /// the bound on requests in flight to it (`pace.concurrency`), if any
    pub inflight: Option<inflight::Inflight>,
    /// its response metrics, found once
    pub series: crate::metrics::UpstreamSeries,
}

impl Upstream {
    /// Whether a request may wait, or be refused, on its way to this upstream.
    pub fn paced(&self) -> bool {
        self.pacer.is_some() || self.inflight.is_some()
    }
}

/// Settings that apply to every request.
pub struct Settings {
    /// peers whose X-Forwarded-For is believed
    pub trusted_proxies: Vec<IpNet>,
    /// which rate-limit headers to send
    pub headers: HeaderStyle,
    /// the first part of every store key
    pub key_prefix: String,
    /// no response head within this: 504
    pub upstream_response: Duration,
    /// an upgraded (WebSocket) tunnel with no bytes either way for this long is closed
    pub tunnel_idle: Duration,
    /// larger request bodies: 413
    pub max_body_size: Option<u64>,
    /// how request paths are read: encoded slashes, `;parameters`
    pub paths: PathPolicy,
    /// what the access log writes of the path and the client
    pub access_log: access::LogSettings,
    /// whether `X-Real-IP` and `Forwarded` are tollgate's (`forwarded_headers`)
    pub identity_headers: IdentityHeaders,
}

/// Everything the request path needs; shared by all connections.
pub struct Proxy {
    /// the routes, first match wins
    pub routes: RouteTable<Route>,
    /// limiter state (Redis behind its failure policy, or memory)
    pub store: Arc<dyn Store>,
    /// the pooled upstream clients, one per worker thread
    pub clients: UpstreamClients,
    /// request-wide settings
    pub settings: Settings,
    /// the metrics every request records into
    pub metrics: Metrics,
    /// upgraded connections (WebSocket tunnels) and the drains of charged responses whose
    /// client left, shared across reloads so shutdown waits for them too
    pub tunnels: TaskTracker,
    /// the clients each limit refused most, for the console; shared across reloads
    pub refusals: Arc<crate::refusals::Refusals>,
    /// the concurrency slots this instance holds, and their renewer
    pub holders: Arc<slots::Holders>,
}

impl Proxy {
    /// The upstream named `name`, when a route uses it.
    pub fn upstream(&self, name: &str) -> Option<&Upstream> {
        self.routes
            .routes()
            .iter()
            .map(|(_, route)| &*route.upstream)
            .find(|u| &*u.name == name)
    }
}

/// How the connection reached tollgate.
#[derive(Debug, Clone)]
pub struct Conn {
    /// the TCP peer
    pub peer: SocketAddr,
    /// came over TLS
    pub tls: bool,
    /// the worker thread serving the connection: its requests use that worker's upstream pool
    pub worker: usize,
    /// the peer's address as a header value, appended to `X-Forwarded-For`: made once per
    /// connection rather than per request
    peer_value: HeaderValue,
}

impl Conn {
    /// A connection from `peer`, over TLS or not, served by worker `worker`.
    pub fn new(peer: SocketAddr, tls: bool, worker: usize) -> Conn {
        // a dual-stack listener reports IPv4 peers as `::ffff:a.b.c.d`: they are IPv4 clients,
        // and X-Forwarded-For and the logs say so
        let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
        let mut text = String::with_capacity(15);
        identity::push_ip(&mut text, peer.ip());
        Conn {
            peer,
            tls,
            worker,
            peer_value: HeaderValue::try_from(text)
                .expect("an IP address in text is a valid header value"),
        }
    }
}

/// What one request did, filled in by the phases: what the metrics and the access log read.
///
/// The names are borrowed from the proxy in force, not cloned. A clone of a name that every
/// worker shares would write its reference count, and the cores would pass that cache line
/// back and forth on every request.
#[derive(Default)]
struct Outcome<'a> {
    /// the matched route's name
    route: Option<&'a Arc<str>>,
    /// the matched route's request metrics
    series: Option<&'a RouteSeries>,
    /// the route's upstream
    upstream: Option<&'a Arc<str>>,
    client: Option<std::net::IpAddr>,
    /// what the limits decided, and how long they held the request back
    verdict: limits::Verdict<'a>,
    /// how long the upstream's pacing and slots held the request back
    pacing_delay: Duration,
    /// the rate the upstream's pacing gave the request's slot at, per second
    pace_rate: Option<f64>,
    /// the request's `X-Request-Id`, kept or made: forwarded, returned, logged
    request_id: Option<HeaderValue>,
    /// the access line, while the access log is on
    line: Option<Box<access::Line>>,
    /// the `error` code of the JSON answer when a phase failed, for the access log
    error: Option<&'static str>,
    /// when the request began to wait for the upstream's pacing and slots, while it waits
    waiting_since: Option<Instant>,
}

impl Outcome<'_> {
    /// Ends the wait for the upstream's pacing, if the request is waiting: it counts in the
    /// request's `pacing_delay` and in `tollgate_pacing_delay_seconds`, whatever ended it.
    fn waited(&mut self, metrics: &Metrics) {
        let (Some(since), Some(upstream)) = (self.waiting_since.take(), self.upstream) else {
            return;
        };
        let waited = since.elapsed();
        self.pacing_delay += waited;
        metrics.pacing_delay(upstream, waited);
    }

    /// Ends every wait still under way: the client left during it, so it counts up to now.
    fn left_waiting(&mut self, metrics: &Metrics) {
        self.verdict.left();
        self.waited(metrics);
    }

    /// How long the limits and the upstream's pacing held the request back, for the log.
    fn delayed(&self) -> Duration {
        self.verdict.held + self.pacing_delay
    }
}

impl Proxy {
    /// Serves one request through the phases, then records its metrics and access log line.
    /// Every answer, the proxy's own too, carries `request_id`, which the request carries
    /// already ([`request_id::keep_or_make`]).
    pub async fn handle(
        &self,
        req: Request<Incoming>,
        conn: Conn,
        request_id: HeaderValue,
    ) -> Response<Body> {
        let ending = Ending::of(&req);
        let started = Instant::now();
        let line = access::enabled()
            .then(|| access::Line::of(&req, started, self.settings.access_log, ending.grpc));
        let mut record = Record {
            proxy: self,
            started,
            outcome: Outcome {
                request_id: Some(request_id),
                line,
                ..Outcome::default()
            },
            answered: false,
        };
        // the limits' figures: the rate-limit headers of the response, whoever makes it (the
        // upstream, or the proxy when pacing, forwarding or the body fails)
        let mut shown = None;
        let result = self
            .phases(req, conn, &mut record.outcome, &mut shown)
            .await;
        record.outcome.error = result.as_ref().err().map(ProxyError::code);
        let (resp, counted) = self.respond(result, &record.outcome, shown.as_ref(), ending);
        match record.done(counted.as_u16(), resp.status().as_u16()) {
            Some(line) => line.follow(resp),
            None => resp,
        }
    }

    /// The phases in the order they run. Each takes what the ones before it found, and notes
    /// in `outcome` what the metrics and the access log need; the limits' figures go in
    /// `shown`.
    ///
    /// (An `async` block rather than an `async fn`, which would hold the request and the
    /// connection twice in its future: as arguments and as the body's bindings.)
    #[allow(clippy::manual_async_fn)] // the point: see above
    fn phases<'s, 'o>(
        &'s self,
        req: Request<Incoming>,
        conn: Conn,
        outcome: &'o mut Outcome<'s>,
        shown: &'o mut Option<Showing<'s>>,
    ) -> impl Future<Output = Result<Response<Body>, ProxyError>> + Send + use<'s, 'o> {
        async move {
            let client = self.identify(&req, &conn);
            outcome.client = Some(client.ip);
            // The URI is cloned, which copies reference counts only, so that the path can be
            // borrowed from it while the request itself moves on to the forward phase.
            let uri = req.uri().clone();
            // read once: routing and the limits' keys both need it
            let host = request_host(&req);
            let (route, path) = self.route(&req, &uri, host, outcome)?;
            // what the limits and the charges key on
            let key_path = key_path(route, &path);
            let ctx = KeyContext {
                ip: client.ip,
                headers: req.headers(),
                query: uri.query(),
                host,
                path: &key_path,
                route: &route.name,
            };
            self.refuse_too_large(&req)?;
            // A phase the route does not use is not entered: its future, kilobytes that
            // would be built and moved for nothing, is not made.
            let (owed, held) = if route.limits.is_empty() {
                (None, slots::Held::default())
            } else {
                match limits::check(&self.limiter(), route, &ctx, &mut outcome.verdict).await? {
                    limits::Checked::Denied(resp) => return Ok(resp),
                    limits::Checked::Admitted(admitted, owed, held) => {
                        *shown = admitted;
                        (owed, held)
                    }
                }
            };
            // A request refused here, or whose client goes away while it waits, has what its
            // limits took given back as `owed` is dropped, and its slots released as `held` is.
            let (paced, held) = if route.upstream.paced() {
                self.pace(route, outcome, held).await?
            } else {
                (None, held)
            };
            if let Some(owed) = owed {
                owed.paid();
            }
            // what the charged limits are owed once the response says what was used
            let (tasks, drain_for) = (&self.tunnels, self.settings.upstream_response);
            let charges = charge::Charges::of(&self.limiter(), route, &ctx, tasks, drain_for);
            let timed = outcome.line.is_some() || paced.is_some_and(|p| p.timed());
            let sent = timed.then(Instant::now);
            let line = outcome.line.as_deref_mut();
            let forwarded = self.forward(route, req, &path, &conn, &client, line).await;
            let (resp, tunnel) = self
                .upstream_answered(route, paced, sent, forwarded, outcome)
                .await?;
            let resp = match charges {
                Some(charges) => charges.read(resp, shown.as_mut()),
                None => resp,
            };
            // the slots are held until the response is finished, or an upgrade's tunnel closes
            Ok(match tunnel {
                Some(tunnel) => {
                    let (upstream, idle) = (&route.upstream.name, self.settings.tunnel_idle);
                    tunnel.open(&self.tunnels, upstream, idle, held);
                    resp
                }
                None => resp.map(|body| held.around(body)),
            })
        }
    }

    /// Identify: the client's address. It is the peer's, or the one a trusted proxy in front
    /// names in `X-Forwarded-For`. This runs first, so the access log names the client of a
    /// 404 or 400 too.
    fn identify<B>(&self, req: &Request<B>, conn: &Conn) -> Client {
        let trusted = &self.settings.trusted_proxies;
        let peer_trusted = identity::is_trusted(conn.peer.ip(), trusted);
        let ip = if peer_trusted {
            let xff = req.headers().get_all(&forward::X_FORWARDED_FOR);
            identity::forwarded_client(conn.peer.ip(), xff.iter(), trusted)
        } else {
            conn.peer.ip()
        };
        Client { ip, peer_trusted }
    }

    /// Route: the first route that matches the request, and its path read the way the upstream
    /// will read it (`paths`). A request line no route can serve as meant is refused with 400,
    /// and a request no route matches with 404.
    fn route<'s, 'u, B>(
        &'s self,
        req: &Request<B>,
        uri: &'u http::Uri,
        host: Option<&str>,
        outcome: &mut Outcome<'s>,
    ) -> Result<(&'s Route, RequestPath<'u>), ProxyError> {
        if let Some(why) = refused_request_line(req) {
            return Err(ProxyError::BadRequest(why));
        }
        let path = self
            .settings
            .paths
            .read(uri.path())
            .map_err(ProxyError::BadPath)?;
        let parts = RequestParts {
            host,
            path: path.matched(),
            method: req.method(),
            headers: req.headers(),
        };
        let route = self.routes.find(&parts).ok_or(ProxyError::NoRoute)?;
        outcome.route = Some(&route.name);
        outcome.series = Some(&route.series);
        outcome.upstream = Some(&route.upstream.name);
        Ok((route, path))
    }

    /// Refuses a body announced larger than `max_body_size`, before any limit counts it.
    fn refuse_too_large<B>(&self, req: &Request<B>) -> Result<(), ProxyError> {
        match (
            self.settings.max_body_size,
            forward::content_length(req.headers()),
        ) {
            (Some(max), Some(len)) if len > max => Err(ProxyError::BodyTooLarge),
            _ => Ok(()),
        }
    }

    /// What the limit phase, and the charges after it, use of the proxy.
    fn limiter(&self) -> limits::Limiter<'_> {
        limits::Limiter {
            store: &self.store,
            metrics: &self.metrics,
            holders: &self.holders,
            key_prefix: &self.settings.key_prefix,
            headers: self.settings.headers,
            refusals: &self.refusals,
        }
    }

    /// Pace, for an upstream that is paced or bounds its calls in flight: waits for the
    /// upstream's slot, if it is paced ([`Pacer::wait`]), then for a slot in flight to it, if
    /// they are bounded ([`inflight::Inflight::wait`]), added to `held`.
    /// Returns what the upstream's answer is read for ([`Proxy::upstream_answered`]), and the
    /// slots.
    ///
    /// The wait is measured however it ends: with the slots, refused, or with the client
    /// gone (then [`Record`] measures it, as the request is dropped).
    async fn pace<'s>(
        &self,
        route: &'s Route,
        outcome: &mut Outcome<'_>,
        mut held: slots::Held,
    ) -> Result<(Option<pacing::Answer<'s>>, slots::Held), ProxyError> {
        let upstream = &*route.upstream;
        outcome.waiting_since = Some(Instant::now());
        let waited = async {
            let mut answer = None;
            if let Some(pacer) = &upstream.pacer {
                let paced = pacer.answer(pacer.wait(&self.store).await?);
                // (logged also when the slot in flight is refused, or the client leaves)
                outcome.pace_rate = Some(paced.rate());
                answer = Some(paced);
            }
            if let Some(inflight) = &upstream.inflight {
                inflight.wait(&self.holders, &mut held).await?;
            }
            Ok(answer)
        }
        .await;
        outcome.waited(&self.metrics);
        Ok((waited?, held))
    }

    /// Forward: sends the request to one of the upstream's targets and streams the response
    /// back ([`forward::forward`]). The access line, when the log is on, learns the target.
    async fn forward(
        &self,
        route: &Route,
        req: Request<Incoming>,
        path: &RequestPath<'_>,
        conn: &Conn,
        client: &Client,
        line: Option<&mut access::Line>,
    ) -> Result<(Response<Body>, Option<tunnel::Tunnel>), ProxyError> {
        let forward_path = match &route.strip {
            Some(m) => path.strip(m),
            None => Cow::Borrowed(path.forwarded()),
        };
        // (the target asked is named from it, even if the client leaves before the answer)
        let report = line.map(|line| {
            line.forwarded_to = Some(route.upstream.clone());
            &line.report
        });
        let f = forward::Forward {
            upstream: &route.upstream.name,
            targets: &route.upstream.targets,
            preserve_host: route.upstream.preserve_host,
            path: &forward_path,
            client: &conn.peer_value,
            proto: if conn.tls { "https" } else { "http" },
            real_ip: self
                .settings
                .identity_headers
                .x_real_ip
                .then(|| client.header_value(conn)),
            forwarded: self.settings.identity_headers.forwarded,
            trusted_peer: client.peer_trusted,
            response_timeout: self.settings.upstream_response,
            max_body_size: self.settings.max_body_size,
            report,
        };
        forward::forward(self.clients.of(conn.worker), req, &f).await
    }

    /// Upstream answered: what the pace phase left applies to the upstream's answer, as
    /// pingora's `upstream_response_filter` does. An adaptive pace counts it; a paced
    /// upstream's 429 or 503 with `Retry-After` holds its schedule
    /// ([`Pacer::back_pressure`]). The access line notes the time to the response head.
    async fn upstream_answered<T>(
        &self,
        route: &Route,
        paced: Option<pacing::Answer<'_>>,
        sent: Option<Instant>,
        forwarded: Result<(Response<Body>, T), ProxyError>,
        outcome: &mut Outcome<'_>,
    ) -> Result<(Response<Body>, T), ProxyError> {
        if let (Some(paced), Some(sent)) = (paced, sent) {
            paced.observe(forwarded.as_ref().map(|(resp, _)| resp), sent);
        }
        if let Some(line) = outcome.line.as_deref_mut() {
            line.upstream_ttfb = sent.filter(|_| forwarded.is_ok()).map(|s| s.elapsed());
        }
        let answered = forwarded?;
        self.metrics.upstream_responded(&route.upstream.series);
        if let Some(paced) = paced {
            paced.back_pressure(&*self.store, &answered.0).await;
        }
        Ok(answered)
    }

    /// Respond: the upstream's response, or the proxy's answer to a phase's error, with the
    /// rate-limit headers of the route's limits, the request's id, and a close where the
    /// connection must end.
    ///
    /// Also the status the metrics count: the one sent, except for tollgate's own answer to a
    /// gRPC call (HTTP 200 with a `grpc-status`), counted as the status a plain HTTP client
    /// would have had (429 for a limit's refusal, 503 for pacing), so that the refusal and
    /// error figures count gRPC calls too.
    fn respond(
        &self,
        result: Result<Response<Body>, ProxyError>,
        outcome: &Outcome<'_>,
        shown: Option<&Showing<'_>>,
        mut ending: Ending,
    ) -> (Response<Body>, StatusCode) {
        let (mut resp, grpc) = match result {
            Ok(resp) => {
                let verdict = &outcome.verdict;
                let denied = verdict.decision == Some(crate::metrics::Decision::Denied);
                let grpc = (ending.grpc && denied).then(|| {
                    let limit = verdict.limit.map_or("-", |l| &**l);
                    let message = format!("rate limited by {limit}");
                    (GRPC_RESOURCE_EXHAUSTED, Cow::Owned(message))
                });
                (resp, grpc)
            }
            Err(err) => {
                self.report(&err, outcome);
                // a request body refused, malformed or stalled is not read to its end: the
                // connection ends with this answer, and says so, as nginx's 413 and 408 do
                ending.close |= ending.http1
                    && matches!(
                        err,
                        ProxyError::BodyTooLarge
                            | ProxyError::BadBody
                            | ProxyError::ClientBodyTimeout { .. }
                    );
                let grpc = ending
                    .grpc
                    .then(|| (err.grpc_status(), err.public_message()));
                (respond::error(&err), grpc)
            }
        };
        let counted = resp.status();
        if let Some((code, message)) = grpc {
            resp = respond::grpc(resp, code, &message);
        }
        if let Some(shown) = shown {
            respond::add_rate_headers(resp.headers_mut(), self.settings.headers, shown);
        }
        if let Some(id) = &outcome.request_id {
            let name = request_id::X_REQUEST_ID.clone();
            resp.headers_mut().insert(name, id.clone());
        }
        // An HTTP/1.0 client's response of no known length ends with its connection: say so,
        // as nginx does. hyper adds `keep-alive` to the `Connection` of a response to a
        // keep-alive request unless the response itself is HTTP/1.0, which it then closes.
        let unsized_for_http10 =
            ending.http10 && hyper::body::Body::size_hint(resp.body()).exact().is_none();
        if unsized_for_http10 {
            *resp.version_mut() = http::Version::HTTP_10;
        }
        if ending.close || unsized_for_http10 {
            resp.headers_mut()
                .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        (resp, counted)
    }

    /// Counts and logs a phase's error. The upstream's failures go out at warn with their
    /// cause, as nginx's error log does: the client's body says less. The rest (404s, 400s,
    /// refusals, a store outage the breaker logs) go out at debug.
    fn report(&self, err: &ProxyError, outcome: &Outcome<'_>) {
        if let (Some(kind), Some(upstream)) = (err.upstream_kind(), &outcome.upstream) {
            self.metrics.upstream_error(upstream, kind);
        }
        match err {
            ProxyError::UpstreamConnect { .. }
            | ProxyError::Upstream { .. }
            | ProxyError::UpstreamTimeout { .. } => {
                let cause = crate::error_line(err);
                tracing::warn!(error = %cause, "upstream failed; answered by the proxy")
            }
            _ => tracing::debug!(error = %err, "answered by the proxy"),
        }
    }
}

/// The path `route`'s limits key on: the matched path, in ASCII lowercase on a route that
/// ignores case, so that `/API/x` and `/api/x` count as one path.
fn key_path<'p>(route: &Route, path: &'p RequestPath<'_>) -> Cow<'p, str> {
    match route.case_sensitive {
        true => Cow::Borrowed(path.matched()),
        false => Cow::Owned(path.matched().to_ascii_lowercase()),
    }
}

/// Who sent the request, as the identify phase found.
struct Client {
    /// the client's address
    ip: std::net::IpAddr,
    /// the TCP peer is a trusted proxy: its `X-Forwarded-*` headers are kept
    peer_trusted: bool,
}

impl Client {
    /// The client's address as a header value: the connection's, made once, when the client
    /// is the peer (always, but behind a trusted proxy).
    fn header_value(&self, conn: &Conn) -> HeaderValue {
        if self.ip == conn.peer.ip() {
            return conn.peer_value.clone();
        }
        let mut text = String::with_capacity(15);
        identity::push_ip(&mut text, self.ip);
        HeaderValue::try_from(text).unwrap_or_else(|_| conn.peer_value.clone())
    }
}

/// The gRPC status of a call a limit refused.
const GRPC_RESOURCE_EXHAUSTED: u8 = 8;

/// How the request's answer is framed and its connection may end, read before the request
/// moves into the phases.
#[derive(Clone, Copy)]
struct Ending {
    http1: bool,
    http10: bool,
    /// the connection closes after the response
    close: bool,
    /// a gRPC call: tollgate's own answers are gRPC statuses
    grpc: bool,
}

impl Ending {
    fn of<B>(req: &Request<B>) -> Ending {
        let http1 = req.version() < http::Version::HTTP_2;
        Ending {
            http1,
            http10: req.version() == http::Version::HTTP_10,
            // an HTTP/1 CONNECT is refused, and the bytes after it, the tunnel's, are no
            // requests
            close: *req.method() == http::Method::CONNECT && http1,
            // (gRPC runs over HTTP/2 only: an HTTP/1 request never looks)
            grpc: !http1 && is_grpc(req),
        }
    }
}

/// Whether `req` is a gRPC call: its content type is `application/grpc`, alone or with a
/// `+format` or parameters. gRPC-Web, which carries its status in the body, is not.
fn is_grpc<B>(req: &Request<B>) -> bool {
    let Some(value) = req.headers().get(http::header::CONTENT_TYPE) else {
        return false;
    };
    let Some(rest) = value.as_bytes().strip_prefix(b"application/grpc") else {
        return false;
    };
    matches!(rest.first(), None | Some(b'+' | b';'))
}

/// A request's metrics, recorded when it is answered — or, when the client goes away first
/// (its connection closed, its HTTP/2 stream reset) and the request is dropped unanswered,
/// recorded then with status 499, nginx's "client closed request". Its access line, when the
/// log is on, is written when the response body ends, or then.
struct Record<'a> {
    proxy: &'a Proxy,
    started: Instant,
    outcome: Outcome<'a>,
    answered: bool,
}

/// The status recorded for a request its client abandoned (nginx's).
const CLIENT_CLOSED: u16 = 499;

impl Record<'_> {
    /// Records the metrics of an answer `counted` as `status` (see [`Proxy::respond`]) and sent
    /// with `sent`; the access line, when the log is on, with what the phases found.
    fn done(&mut self, status: u16, sent: u16) -> Option<Box<access::Line>> {
        self.answered = true;
        // (a client that left while its request waited for a limit or the upstream's pacing)
        self.outcome.left_waiting(&self.proxy.metrics);
        let elapsed = self.started.elapsed();
        let metrics = &self.proxy.metrics;
        let route = self.outcome.route.unwrap_or(metrics.no_route());
        match self.outcome.series {
            Some(series) => metrics.route_request(series, status, elapsed),
            None => metrics.request(route, status, elapsed),
        }
        let mut line = self.outcome.line.take()?;
        line.answered(&self.outcome, sent);
        Some(line)
    }
}

impl Drop for Record<'_> {
    fn drop(&mut self) {
        if !self.answered {
            if let Some(line) = self.done(CLIENT_CLOSED, CLIENT_CLOSED) {
                line.write(0, false);
            }
        }
    }
}

/// Why a request whose line hyper accepted is refused with 400, if it is:
///
/// * a method not written in upper case (methods are case-sensitive, RFC 9110 §9.1): `post`
///   matched against a route's `methods: [POST]` would pass by the limits meant for POST, and
///   the many applications that upper-case the method would serve it as one;
/// * an absolute-form target or `:authority` with user information (`http://u:p@host/`, which
///   RFC 9110 §4.2.4 and RFC 9113 §8.3.1 forbid: its host would not match a route's `host`),
///   a port out of range, or a scheme other than http and https;
/// * `CONNECT` (no tunnels to arbitrary addresses; its connection is closed after the answer,
///   see [`Proxy::handle`], so the bytes meant for the tunnel are not read as requests).
fn refused_request_line<B>(req: &Request<B>) -> Option<&'static str> {
    let method = req.method();
    if *method == http::Method::CONNECT {
        return Some("CONNECT is not served");
    }
    if !method
        .as_str()
        .bytes()
        .all(|b| b.is_ascii_uppercase() || b == b'-' || b == b'_')
    {
        return Some("malformed request method: methods are upper case");
    }
    let uri = req.uri();
    if !matches!(uri.scheme_str(), None | Some("http") | Some("https")) {
        return Some("malformed request target: the scheme is not http or https");
    }
    match uri
        .authority()
        .and_then(|a| routing::authority_fault(a.as_str()))?
    {
        AuthorityFault::UserInfo => Some("malformed request target: user information"),
        AuthorityFault::Port => Some("malformed request target: a port out of range"),
    }
}

/// The request's host: the URI's authority (absolute-form, or HTTP/2 `:authority`), which wins
/// over `Host` (RFC 9112 §3.2.2), else the `Host` header.
fn request_host<B>(req: &Request<B>) -> Option<&str> {
    req.uri().authority().map(|a| a.as_str()).or_else(|| {
        req.headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dual-stack listener reports an IPv4 client as `::ffff:a.b.c.d`: the connection holds
    /// it as IPv4, and X-Forwarded-For gets it so.
    #[test]
    fn ipv4_mapped_peers_are_ipv4() {
        let mapped: SocketAddr = "[::ffff:192.0.2.7]:5000".parse().unwrap();
        let conn = Conn::new(mapped, false, 0);
        assert_eq!(conn.peer, "192.0.2.7:5000".parse::<SocketAddr>().unwrap());
        assert_eq!(conn.peer_value, "192.0.2.7");
        let v6: SocketAddr = "[2001:db8::1]:5000".parse().unwrap();
        assert_eq!(Conn::new(v6, false, 0).peer_value, "2001:db8::1");
    }
}

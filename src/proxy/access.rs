//! The access log: one line per request at info, target `tollgate::access`, written when the
//! response body ends, or when the client goes away first.
//!
//! Only a request that arrives while the log is on carries what its line needs ([`Line`]): a
//! copy of its request line, a count of the bytes of its request body ([`Report`]) and of its
//! response body ([`LoggedBody`]). With the log off (`RUST_LOG=...,tollgate::access=off`) a
//! request pays one check of the filter. Metrics are not this module's: they are recorded when
//! the response head is ready.
//!
//! A gRPC call's line has its `grpc_status`: from the response head when the answer is
//! trailers-only (tollgate's own answers are), else from the trailers as the body passes.

use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::Authority;
use http::{HeaderValue, Method, Request, Response, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Body as _;

use super::{Body, BoxError, Outcome, Upstream};
use crate::body::{Observed, Observer};
use crate::metrics::Decision;

/// The target of every access line: `RUST_LOG=info,tollgate::access=off` turns the log off.
pub const TARGET: &str = "tollgate::access";

/// Whether the access log is on: the filter in force lets its lines through.
pub(super) fn enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::INFO)
}

/// What the access log writes of the client (`access_log.client`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientField {
    /// its address, as nginx's and Envoy's logs have it
    #[default]
    Address,
    /// the first 12 hex digits of the SHA-1 of its address, for logs that must not keep
    /// addresses: stable across instances, so one client's lines can still be followed
    Hash,
}

/// The access log's settings (`access_log`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogSettings {
    /// write the query after the path (it may hold tokens: off by default)
    pub query: bool,
    /// the client's address, or a hash of it
    pub client: ClientField,
}

/// What the forward phase tells the access log: the target asked last, and the bytes of the
/// request body read from the client.
#[derive(Debug, Default)]
pub struct Report {
    /// the target's index plus one; 0 while no target was asked
    target: AtomicUsize,
    /// the request body's bytes, counted as the upstream connection takes them (shared with
    /// that body, which the connection may outlive this request with)
    received: Arc<AtomicU64>,
}

impl Report {
    /// Target `index` of the upstream is asked: named in the line whatever comes of it, the
    /// client leaving before its answer too.
    pub(super) fn asked(&self, index: usize) {
        self.target.store(index + 1, Ordering::Relaxed);
    }

    /// The index of the target asked last, if one was.
    pub(super) fn target(&self) -> Option<usize> {
        self.target.load(Ordering::Relaxed).checked_sub(1)
    }

    /// `body`, counting its bytes into this report as they are read.
    pub(super) fn count(&self, body: Body) -> Body {
        Observed::new(body, Counted(self.received.clone())).boxed()
    }
}

/// Counts the bytes of a request body into its [`Report`] as they are read.
struct Counted(Arc<AtomicU64>);

impl Observer<Body> for Counted {
    fn data(&mut self, data: &Bytes, _: &Body) {
        self.0.fetch_add(data.len() as u64, Ordering::Relaxed);
    }
}

/// One request's access line: the request as it arrived, then what the phases found, then
/// the answer. Boxed, made only while the log is on.
pub(super) struct Line {
    started: Instant,
    settings: LogSettings,
    method: Method,
    uri: Uri,
    version: Version,
    host: Option<HeaderValue>,
    user_agent: Option<HeaderValue>,
    /// filled in by the forward phase
    pub(super) report: Report,
    /// the upstream the request is forwarded to: its targets name the one `report` gives
    pub(super) forwarded_to: Option<Arc<Upstream>>,
    /// from sending the request to the upstream's response head
    pub(super) upstream_ttfb: Option<Duration>,
    /// a gRPC call: its status is looked for in the response
    grpc: bool,
    /// the call's `grpc-status`, once the response head or trailers gave it
    grpc_status: Option<u32>,
    answer: Answer,
}

/// What the phases found and what was answered, owned: the line outlives the proxy's borrow.
#[derive(Default)]
struct Answer {
    status: u16,
    route: Option<Arc<str>>,
    upstream: Option<Arc<str>>,
    decision: Option<Decision>,
    limit: Option<Arc<str>>,
    pacing_delay: Duration,
    pace_rate: Option<f64>,
    client: Option<IpAddr>,
    request_id: Option<HeaderValue>,
    /// the `error` code of tollgate's own answer
    error: Option<&'static str>,
}

impl Line {
    /// The line of `req`, which arrived at `started`; `grpc`: it is a gRPC call.
    pub(super) fn of<B>(
        req: &Request<B>,
        started: Instant,
        settings: LogSettings,
        grpc: bool,
    ) -> Box<Line> {
        let host = match req.uri().authority() {
            Some(a) => HeaderValue::from_str(a.as_str()).ok(),
            None => req.headers().get(http::header::HOST).cloned(),
        };
        Box::new(Line {
            started,
            settings,
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            host,
            user_agent: req.headers().get(http::header::USER_AGENT).cloned(),
            report: Report::default(),
            forwarded_to: None,
            upstream_ttfb: None,
            grpc,
            grpc_status: None,
            answer: Answer::default(),
        })
    }

    /// Takes what the phases found (`outcome`) and the status answered.
    pub(super) fn answered(&mut self, outcome: &Outcome<'_>, status: u16) {
        self.answer = Answer {
            status,
            route: outcome.route.cloned(),
            upstream: outcome.upstream.cloned(),
            decision: outcome.verdict.decision,
            limit: outcome.verdict.limit.cloned(),
            pacing_delay: outcome.delayed(),
            pace_rate: outcome.pace_rate,
            client: outcome.client,
            request_id: outcome.request_id.clone(),
            error: outcome.error,
        };
    }

    /// `resp`, its body writing this line when it ends.
    pub(super) fn follow(mut self: Box<Line>, resp: Response<Body>) -> Response<Body> {
        self.read_grpc_status(resp.headers());
        resp.map(|body| {
            let logged = Logged {
                line: Some(self),
                sent: 0,
            };
            Observed::new(body, logged).boxed()
        })
    }

    /// Takes the call's `grpc-status` from `headers` (a trailers-only head, or the trailers),
    /// when this is a gRPC call and they hold one.
    fn read_grpc_status(&mut self, headers: &http::HeaderMap) {
        if !self.grpc {
            return;
        }
        let status = headers.get(GRPC_STATUS).and_then(|v| v.to_str().ok());
        if let Some(code) = status.and_then(|s| s.trim().parse().ok()) {
            self.grpc_status = Some(code);
        }
    }

    /// The target asked last, `host:port`, if one was.
    fn upstream_addr(&self) -> Option<&Authority> {
        let target = self.report.target()?;
        self.forwarded_to.as_ref()?.targets.authority(target)
    }

    /// Writes the line: `sent` bytes of the response body went out, all of it (`complete`) or
    /// not (the client went away, or the upstream's body failed).
    pub(super) fn write(self: Box<Line>, sent: u64, complete: bool) {
        let a = &self.answer;
        tracing::info!(
            target: TARGET,
            client = %ClientText(a.client, self.settings.client),
            method = %self.method,
            path = %PathText(&self.uri, self.settings.query),
            protocol = protocol(self.version),
            status = a.status,
            grpc_status = self.grpc_status,
            bytes_out = sent,
            user_agent = %Text(self.user_agent.as_ref()),
            host = %Text(self.host.as_ref()),
            route = or_dash(&a.route),
            upstream = or_dash(&a.upstream),
            upstream_addr = %self.upstream_addr().map_or("-", Authority::as_str),
            upstream_ttfb_ms = self.upstream_ttfb.map(millis),
            decision = a.decision.map_or("-", Decision::as_str),
            limit = or_dash(&a.limit),
            error = a.error,
            pacing_delay_ms = millis(a.pacing_delay),
            pace_rate = a.pace_rate,
            duration_ms = millis(self.started.elapsed()),
            bytes_in = self.report.received.load(Ordering::Relaxed),
            request_id = %Text(a.request_id.as_ref()),
            complete,
        );
    }
}

/// Writes a response body's access line when the body ends, or when it is dropped before its
/// end (the client went away, or the upstream's body failed).
struct Logged {
    /// taken when written
    line: Option<Box<Line>>,
    /// the body's bytes so far
    sent: u64,
}

impl Logged {
    fn write(&mut self, complete: bool) {
        if let Some(line) = self.line.take() {
            line.write(self.sent, complete);
        }
    }
}

impl Observer<Body> for Logged {
    fn data(&mut self, data: &Bytes, _: &Body) {
        self.sent += data.len() as u64;
    }

    fn trailers(&mut self, trailers: &http::HeaderMap, _: &Body) {
        if let Some(line) = &mut self.line {
            line.read_grpc_status(trailers);
        }
    }

    fn error(&mut self, error: BoxError, _: &mut Body, _: &mut Context<'_>) -> Poll<BoxError> {
        self.write(false);
        Poll::Ready(error)
    }

    fn end(&mut self) {
        self.write(true);
    }

    fn dropped(&mut self, body: &mut Body) {
        // (a body with nothing to send, as a HEAD's or a 204's, may be dropped unread: it is
        // whole all the same)
        self.write(body.is_end_stream());
    }
}

/// Where a gRPC call's status is: the trailers, or the head of a trailers-only answer.
const GRPC_STATUS: &str = "grpc-status";

/// A name, or `-` when there is none.
fn or_dash(name: &Option<Arc<str>>) -> &str {
    name.as_deref().unwrap_or("-")
}

/// `HTTP/1.0`, `HTTP/1.1`, `HTTP/2`, as the request came.
fn protocol(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_3 => "HTTP/3",
        _ => "-",
    }
}

/// A duration in ms with microsecond resolution, for log fields (no float noise).
fn millis(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// Bytes a client chose, as text: visible ASCII and spaces as they are, any other byte as
/// `\xNN`, so that no value can break a line or pass for another field. `-` when absent.
struct Text<'a>(Option<&'a HeaderValue>);

impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => f.write_str("-"),
            Some(v) => write_escaped(f, v.as_bytes()),
        }
    }
}

fn write_escaped(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !(0x20..=0x7e).contains(&b) {
            f.write_str(ascii(&bytes[start..i]))?;
            write!(f, "\\x{b:02x}")?;
            start = i + 1;
        }
    }
    f.write_str(ascii(&bytes[start..]))
}

/// A run of visible ASCII as a `str` (it is always UTF-8).
fn ascii(run: &[u8]) -> &str {
    std::str::from_utf8(run).unwrap_or_default()
}

/// The path as the client sent it, and its query when the settings keep it.
struct PathText<'a>(&'a Uri, bool);

impl fmt::Display for PathText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let PathText(uri, query) = self;
        write_escaped(f, uri.path().as_bytes())?;
        match uri.query() {
            Some(q) if *query => {
                f.write_str("?")?;
                write_escaped(f, q.as_bytes())
            }
            _ => Ok(()),
        }
    }
}

/// The client as the settings want it: the address, or its hash.
struct ClientText(Option<IpAddr>, ClientField);

impl fmt::Display for ClientText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientText(None, _) => f.write_str("-"),
            ClientText(Some(ip), ClientField::Address) => write!(f, "{ip}"),
            ClientText(Some(ip), ClientField::Hash) => f.write_str(&client_hash(ip)),
        }
    }
}

/// The first 12 hex digits of the SHA-1 of the client address: stable across instances, so
/// lines about one client can be followed, without writing the address itself.
fn client_hash(ip: &IpAddr) -> String {
    let digest = sha1_smol::Sha1::from(ip.to_string()).digest().to_string();
    digest[..12].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes a client chose are written as visible text: control bytes, and bytes beyond
    /// ASCII, as `\xNN`; the rest as they are.
    #[test]
    fn client_text_is_escaped() {
        let v = HeaderValue::from_bytes(b"curl/8 (x\"y\")\tcaf\xc3\xa9").unwrap();
        assert_eq!(
            Text(Some(&v)).to_string(),
            "curl/8 (x\"y\")\\x09caf\\xc3\\xa9"
        );
        assert_eq!(Text(None).to_string(), "-");
    }

    /// The query is written only when the settings keep it.
    #[test]
    fn the_query_is_left_out_unless_kept() {
        let uri: Uri = "/v1/items?token=secret".parse().unwrap();
        assert_eq!(PathText(&uri, false).to_string(), "/v1/items");
        assert_eq!(PathText(&uri, true).to_string(), "/v1/items?token=secret");
    }

    /// Only a gRPC call's line takes a `grpc-status`, and only one that is there.
    #[test]
    fn only_a_grpc_call_has_a_grpc_status() {
        let req = Request::new(());
        let mut headers = http::HeaderMap::new();
        headers.insert(GRPC_STATUS, HeaderValue::from_static("8"));
        let mut plain = Line::of(&req, Instant::now(), LogSettings::default(), false);
        plain.read_grpc_status(&headers);
        assert_eq!(plain.grpc_status, None);
        let mut call = Line::of(&req, Instant::now(), LogSettings::default(), true);
        call.read_grpc_status(&http::HeaderMap::new());
        assert_eq!(call.grpc_status, None);
        call.read_grpc_status(&headers);
        assert_eq!(call.grpc_status, Some(8));
    }

    /// The client is its address, or a hash of 12 hex digits that is the same every time.
    #[test]
    fn the_client_is_an_address_or_a_hash() {
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(
            ClientText(Some(ip), ClientField::Address).to_string(),
            "192.0.2.7"
        );
        let hash = ClientText(Some(ip), ClientField::Hash).to_string();
        assert_eq!(hash.len(), 12);
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(hash, client_hash(&ip));
        assert_ne!(hash, client_hash(&"192.0.2.8".parse().unwrap()));
    }
}

//! Forwarding to the upstream: the pooled hyper-util client, the request rewritten for the
//! upstream (target, path, hop-by-hop headers removed, `X-Forwarded-*` added), the response
//! streamed back. Bodies stream both ways and are never buffered whole.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::{Body, BoxError, ProxyError};

/// The pooled upstream client: keep-alive connections per target, shared by every route.
pub type UpstreamClient = Client<HttpConnector, Body>;

/// A client whose connections time out after `connect` and idle out after `idle`.
pub fn client(connect: Duration, idle: Duration) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect));
    connector.set_nodelay(true);
    connector.set_keepalive(Some(Duration::from_secs(60)));
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(idle)
        .pool_max_idle_per_host(1024)
        .build(connector)
}

/// One upstream's targets, picked round robin.
#[derive(Debug)]
pub struct Targets {
    targets: Vec<(Scheme, Authority)>,
    next: AtomicUsize,
}

impl Targets {
    /// Targets from their URIs (`http://host:port`); entries without scheme or authority are
    /// refused by config validation before this point and skipped here.
    pub fn new(uris: &[Uri]) -> Targets {
        let targets = uris
            .iter()
            .filter_map(|u| Some((u.scheme()?.clone(), u.authority()?.clone())))
            .collect();
        Targets {
            targets,
            next: AtomicUsize::new(0),
        }
    }

    fn pick(&self) -> Option<&(Scheme, Authority)> {
        if self.targets.is_empty() {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.targets.len();
        self.targets.get(i)
    }
}

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
    /// the client's address, appended to X-Forwarded-For
    pub client_ip: IpAddr,
    /// `https` when the client came over TLS
    pub proto: &'static str,
    /// past this without a response head: 504
    pub response_timeout: Duration,
    /// larger request bodies get 413
    pub max_body_size: Option<u64>,
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// Sends `req` to a target of the upstream and returns its response, body streaming.
pub async fn forward(
    client: &UpstreamClient,
    req: Request<Incoming>,
    f: &Forward<'_>,
) -> Result<Response<Body>, ProxyError> {
    let upstream_req = rewrite(req, f)?;
    let sent = client.request(upstream_req);
    let resp = match tokio::time::timeout(f.response_timeout, sent).await {
        Err(_) => {
            return Err(ProxyError::UpstreamTimeout {
                upstream: f.upstream.to_string(),
                after: f.response_timeout,
            })
        }
        Ok(Err(e)) => return Err(upstream_error(f.upstream, e)),
        Ok(Ok(resp)) => resp,
    };
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(
        parts,
        body.map_err(BoxError::from).boxed(),
    ))
}

fn upstream_error(upstream: &str, e: hyper_util::client::legacy::Error) -> ProxyError {
    let upstream = upstream.to_string();
    // a request body over max_body_size surfaces as the body's error
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return ProxyError::BodyTooLarge;
        }
        source = err.source();
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

/// The upstream request: target URI, HTTP/1.1, headers cleaned and `X-Forwarded-*` added.
fn rewrite(req: Request<Incoming>, f: &Forward<'_>) -> Result<Request<Body>, ProxyError> {
    let (mut parts, body) = req.into_parts();
    if let (Some(max), Some(len)) = (f.max_body_size, content_length(&parts.headers)) {
        if len > max {
            return Err(ProxyError::BodyTooLarge);
        }
    }
    let (scheme, authority) = f
        .targets
        .pick()
        .ok_or_else(|| ProxyError::NoTarget(f.upstream.to_string()))?;
    let client_host = parts.headers.get(header::HOST).cloned().or_else(|| {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    let path_and_query = match parts.uri.query() {
        Some(q) => PathAndQuery::try_from(format!("{}?{q}", f.path)),
        None => PathAndQuery::try_from(f.path),
    }
    .map_err(|_| ProxyError::BadPath)?;
    parts.uri = Uri::builder()
        .scheme(scheme.clone())
        .authority(authority.clone())
        .path_and_query(path_and_query)
        .build()
        .map_err(|_| ProxyError::BadPath)?;
    // an HTTP/2 request goes to the HTTP/1.1 upstream as HTTP/1.1
    parts.version = Version::HTTP_11;
    let headers = &mut parts.headers;
    strip_hop_by_hop(headers);
    append_forwarded_for(headers, f.client_ip);
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(f.proto));
    if let Some(host) = &client_host {
        headers.insert(X_FORWARDED_HOST.clone(), host.clone());
    }
    let host = match (&client_host, f.preserve_host) {
        (Some(h), true) => h.clone(),
        _ => HeaderValue::from_str(authority.as_str()).map_err(|_| ProxyError::BadPath)?,
    };
    headers.insert(header::HOST, host);
    let body: Body = match f.max_body_size {
        Some(max) => http_body_util::Limited::new(body, max as usize).boxed(),
        None => body.map_err(BoxError::from).boxed(),
    };
    Ok(Request::from_parts(parts, body))
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// `X-Forwarded-For: <existing>, <client>` (RFC 7239 §5.2 style list; existing lines joined).
fn append_forwarded_for(headers: &mut HeaderMap, ip: IpAddr) {
    let mut value = String::new();
    for v in headers.get_all(&X_FORWARDED_FOR) {
        if let Ok(s) = v.to_str() {
            if !value.is_empty() {
                value.push_str(", ");
            }
            value.push_str(s);
        }
    }
    if !value.is_empty() {
        value.push_str(", ");
    }
    value.push_str(&ip.to_string());
    if let Ok(v) = HeaderValue::try_from(value) {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
}

/// Removes hop-by-hop headers (RFC 9110 §7.6.1): `Connection` and every header it names,
/// `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove(&KEEP_ALIVE);
    headers.remove(header::PROXY_AUTHENTICATE);
    headers.remove(header::PROXY_AUTHORIZATION);
    let proxy: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    for name in proxy {
        headers.remove(name);
    }
}

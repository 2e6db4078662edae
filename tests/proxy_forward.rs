//! Routing and forwarding end to end: what reaches the upstream and what comes
//! back, `Upgrade` tunnels, the errors tollgate answers itself, round robin and pooling,
//! streaming without buffering, inbound HTTP/2 cleartext, and malformed requests. A real
//! upstream and tollgate in process; no Redis (the memory store is the default).

mod common;
common::both_http1_clients!();

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::{
    clear_of_hour_end, eventually, get, http_client, send, Answer, Proxy, Upstream, Yaml,
};

/// The body type of the harness's client (`common::send`).
type TestBody =
    http_body_util::combinators::BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A proxy config with one upstream `api` over `targets` and one route `api` on `/v1`.
/// `top` is added at the top level, `upstream` and `route` as keys of those entries.
fn config(targets: &[String], top: &str, upstream: &str, route: &str) -> String {
    Yaml::to(targets)
        .top(top)
        .upstream(upstream)
        .route("api", "/v1", route)
        .build()
}

/// Route option for tests that use the harness upstream's `/slow`, `/echo` and `/bytes`, which
/// it serves at its root: `/v1/echo` is forwarded as `/echo`.
const STRIP: &str = "strip_prefix: true";

fn empty() -> TestBody {
    full("")
}

fn full(text: impl Into<Bytes>) -> TestBody {
    Full::new(text.into())
        .map_err(|never| match never {})
        .boxed()
}

/// `total` bytes in chunks of `chunk`, with no length announced (sent chunked), made from one
/// shared buffer so the test itself never holds more than one chunk.
struct Repeat {
    chunk: Bytes,
    left: u64,
}

impl Repeat {
    fn body(total: u64, chunk: usize) -> TestBody {
        Repeat {
            chunk: Bytes::from(vec![b'u'; chunk]),
            left: total,
        }
        .boxed()
    }
}

impl hyper::body::Body for Repeat {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let n = self.left.min(self.chunk.len() as u64);
        self.left -= n;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..n as usize)))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        // deliberately unknown: the request goes out chunked
        SizeHint::default()
    }
}

/// Reads a response body to its end, counting bytes without keeping them.
async fn count_body(mut body: Incoming) -> u64 {
    let mut n = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("body frame");
        if let Some(data) = frame.data_ref() {
            n += data.len() as u64;
        }
    }
    n
}

fn json(answer: &Answer) -> serde_json::Value {
    assert_eq!(
        answer.header("content-type"),
        Some("application/json"),
        "{answer:?}"
    );
    serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("{e}: {}", answer.body))
}

/// Writes `request` on a fresh connection and reads until the peer closes (or 10 s pass).
async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

// ---------------------------------------------------------------------------------------------
// An upstream of this file's own, for what the harness's cannot show: it counts the TCP
// connections it accepts, answers `/v1/hop` with hop-by-hop headers, answers `/v1/drain`
// only after reading the whole request body (as most APIs do), with the number of bytes read,
// and switches `/v1/ws` with any `Upgrade` to a raw byte echo.

struct CountingUpstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    headers: Arc<Mutex<Vec<http::HeaderMap>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CountingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CountingUpstream {
    async fn start() -> CountingUpstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let headers = Arc::new(Mutex::new(Vec::new()));
        let (count, seen) = (accepted.clone(), headers.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let seen = seen.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        seen.lock().unwrap().push(req.headers().clone());
                        async move { Ok::<_, Infallible>(counting_handle(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades()
                        .await;
                });
            }
        });
        CountingUpstream {
            addr,
            accepted,
            headers,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn requests(&self) -> usize {
        self.headers.lock().unwrap().len()
    }
}

async fn counting_handle(mut req: Request<Incoming>) -> Response<TestBody> {
    match req.uri().path() {
        // any protocol asked for is accepted: what reaches it is the proxy's choice
        "/v1/ws" if req.headers().contains_key("upgrade") => {
            let proto = req.headers()["upgrade"].clone();
            let upgraded = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                let mut io = TokioIo::new(upgraded.await.expect("upgrade"));
                let mut buf = [0u8; 1024];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
            let mut resp = Response::new(empty());
            *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            resp.headers_mut()
                .insert("connection", "upgrade".parse().unwrap());
            resp.headers_mut().insert("upgrade", proto);
            resp
        }
        "/v1/hop" => {
            let mut resp = Response::new(full("hop"));
            let h = resp.headers_mut();
            for (k, v) in [
                ("connection", "x-up-secret"),
                ("x-up-secret", "1"),
                ("x-up-kept", "1"),
                ("keep-alive", "timeout=5"),
                ("proxy-authenticate", "Basic realm=\"up\""),
                ("proxy-x-up", "1"),
                ("trailer", "x-up-trailer"),
                ("upgrade", "foo/2"),
                ("te", "trailers"),
            ] {
                h.append(k, v.parse().unwrap());
            }
            resp
        }
        "/v1/drain" => match req.into_body().collect().await {
            Ok(body) => Response::new(full(body.to_bytes().len().to_string())),
            Err(_) => {
                let mut resp = Response::new(full("incomplete body"));
                *resp.status_mut() = StatusCode::BAD_REQUEST;
                resp
            }
        },
        _ => Response::new(full("ok")),
    }
}

// ---------------------------------------------------------------------------------------------
// 1. method, path and query

/// The method, the normalised path (dot segments resolved, slashes folded, `%2F` kept encoded
/// under `escaped_slashes: keep`) and the query reach the upstream.
#[tokio::test]
async fn forwards_method_normalised_path_and_query() {
    let upstream = Upstream::start().await;
    let keep = "paths: {escaped_slashes: keep}";
    let proxy = Proxy::start(&config(&[upstream.url()], keep, "", "")).await;
    let cases = [
        ("PATCH", "/v1/a/../b?x=1&y=%20z", "/v1/b?x=1&y=%20z"),
        ("GET", "//v1//x", "/v1/x"),
        ("DELETE", "/v1/a%2Fb/./c", "/v1/a%2Fb/c"),
        ("GET", "/v1/a%2fb?k=%2f", "/v1/a%2Fb?k=%2f"),
        ("PUT", "/v1/%7Euser/%61", "/v1/~user/a"),
        ("OPTIONS", "/v1/x/", "/v1/x/"),
    ];
    for (method, sent, _) in cases {
        let req = Request::builder()
            .method(method)
            .uri(proxy.url(sent))
            .body(empty())
            .unwrap();
        let a = send(req).await;
        assert_eq!(a.status, 200, "{method} {sent}: {a:?}");
        assert_eq!(a.body, "ok");
    }
    let seen = upstream.seen();
    assert_eq!(seen.len(), cases.len());
    for (seen, (method, sent, expected)) in seen.iter().zip(cases) {
        assert_eq!(seen.method, method, "{sent}");
        assert_eq!(seen.uri, expected, "{sent}");
    }
}

/// A path that climbs out of `/v1` is routed (and so refused) by its normal form: it never
/// reaches the upstream under `/v1`'s route.
#[tokio::test]
async fn dot_segments_cannot_borrow_another_route() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", "")).await;
    let a = get(&proxy.url("/v1/../admin"), &[]).await;
    assert_eq!(a.status, 404, "{a:?}");
    let a = get(&proxy.url("/v1/%2e%2e/admin"), &[]).await;
    assert_eq!(a.status, 404, "{a:?}");
    assert!(upstream.seen().is_empty());
}

/// With `strip_prefix: true`, `/v1/x?q=1` is forwarded as `/x?q=1` and `/v1` as `/`.
#[tokio::test]
async fn strip_prefix_forwards_the_rest_of_the_path() {
    let upstream = Upstream::start().await;
    let yaml = config(&[upstream.url()], "", "", "strip_prefix: true");
    let proxy = Proxy::start(&yaml).await;
    let cases = [
        ("/v1/x?q=1", "/x?q=1"),
        ("/v1", "/"),
        ("/v1/", "/"),
        ("/v1?q=2", "/?q=2"),
        ("/v1//a/../b/", "/b/"),
    ];
    for (sent, _) in cases {
        let a = get(&proxy.url(sent), &[]).await;
        assert_eq!(a.status, 200, "{sent}: {a:?}");
    }
    let seen: Vec<String> = upstream.seen().into_iter().map(|s| s.uri).collect();
    let expected: Vec<&str> = cases.iter().map(|(_, e)| *e).collect();
    assert_eq!(seen, expected);
}

// ---------------------------------------------------------------------------------------------
// 2. headers

/// Hop-by-hop request headers (Connection and what it names, Keep-Alive, Proxy-*, TE, Trailer,
/// Transfer-Encoding, Upgrade) do not reach the upstream, but for `TE: trailers`; end-to-end
/// ones do.
#[tokio::test]
async fn removes_hop_by_hop_request_headers() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", "")).await;
    // Raw bytes, so that exactly these headers are sent; `Chunked` (capitalised) is a spelling
    // the proxy's own hop would never produce, so it shows whether the header was forwarded.
    // (`gzip, chunked` is refused with 501, as nginx does: see tests/hardening.rs.)
    let request = "POST /v1/hop HTTP/1.1\r\n\
        Host: api.example.com\r\n\
        Connection: close, X-Secret, Keep-Alive\r\n\
        Connection: x-other-secret\r\n\
        X-Secret: 1\r\n\
        X-Other-Secret: 1\r\n\
        X-Kept: yes\r\n\
        Keep-Alive: timeout=5\r\n\
        Proxy-Authorization: Basic Zm9vOmJhcg==\r\n\
        Proxy-Connection: keep-alive\r\n\
        TE: trailers\r\n\
        Trailer: X-Checksum\r\n\
        Upgrade: foo/2\r\n\
        Transfer-Encoding: Chunked\r\n\
        \r\n\
        5\r\nhello\r\n0\r\n\r\n";
    let response = raw(proxy.addr, request.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    for gone in [
        "connection",
        "x-secret",
        "x-other-secret",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "trailer",
        "upgrade",
    ] {
        assert!(h.get(gone).is_none(), "{gone} was forwarded: {h:?}");
    }
    // a client that takes trailers says so to the upstream too: gRPC servers need it
    assert_eq!(h.get("te").unwrap(), "trailers");
    let te: Vec<_> = h.get_all("transfer-encoding").iter().collect();
    assert!(
        te.is_empty() || te == ["chunked"],
        "transfer-encoding was forwarded: {te:?}"
    );
    assert_eq!(h.get("x-kept").unwrap(), "yes");
}

/// Hop-by-hop response headers from the upstream do not reach the client; end-to-end ones do,
/// and `Trailer`, which names the trailer fields a client asking for them is sent.
#[tokio::test]
async fn removes_hop_by_hop_response_headers() {
    let upstream = CountingUpstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", "")).await;
    let a = get(&proxy.url("/v1/hop"), &[]).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, "hop");
    for gone in [
        "connection",
        "x-up-secret",
        "keep-alive",
        "proxy-authenticate",
        "proxy-x-up",
        "upgrade",
        "te",
    ] {
        assert!(a.header(gone).is_none(), "{gone} came back: {a:?}");
    }
    assert_eq!(a.header("x-up-kept"), Some("1"));
    assert_eq!(a.header("trailer"), Some("x-up-trailer"));
}

/// `X-Forwarded-For` gets the client's address appended to what the client sent (several lines
/// joined in order), `X-Forwarded-Proto` is `http`, `X-Forwarded-Host` is the client's Host, and
/// by default the client's Host is forwarded.
#[tokio::test]
async fn adds_x_forwarded_headers_and_preserves_host() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", "")).await;
    let a = get(
        &proxy.url("/v1/x"),
        &[
            ("host", "api.example.com"),
            ("x-forwarded-for", "203.0.113.7"),
            ("x-forwarded-for", "198.51.100.2, 192.0.2.1"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "spoofed.example"),
        ],
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    let a = get(&proxy.url("/v1/y"), &[]).await;
    assert_eq!(a.status, 200, "{a:?}");

    let seen = upstream.seen();
    let h = &seen[0].headers;
    let xff: Vec<_> = h.get_all("x-forwarded-for").iter().collect();
    assert_eq!(xff, ["203.0.113.7, 198.51.100.2, 192.0.2.1, 127.0.0.1"]);
    assert_eq!(h.get("x-forwarded-proto").unwrap(), "http");
    let xfh: Vec<_> = h.get_all("x-forwarded-host").iter().collect();
    assert_eq!(xfh, ["api.example.com"]);
    assert_eq!(h.get("host").unwrap(), "api.example.com");

    let h = &seen[1].headers;
    assert_eq!(h.get("x-forwarded-for").unwrap(), "127.0.0.1");
    let proxy_host = proxy.addr.to_string();
    assert_eq!(h.get("host").unwrap(), proxy_host.as_str());
    assert_eq!(h.get("x-forwarded-host").unwrap(), proxy_host.as_str());
}

/// With `preserve_host: false` the upstream gets the target's authority as Host, and the
/// client's Host still travels in `X-Forwarded-Host`.
#[tokio::test]
async fn preserve_host_false_sends_the_target_authority() {
    let upstream = Upstream::start().await;
    let yaml = config(&[upstream.url()], "", "preserve_host: false", "");
    let proxy = Proxy::start(&yaml).await;
    let a = get(&proxy.url("/v1/x"), &[("host", "api.example.com")]).await;
    assert_eq!(a.status, 200, "{a:?}");
    let seen = upstream.seen();
    let h = &seen[0].headers;
    assert_eq!(h.get("host").unwrap(), upstream.addr.to_string().as_str());
    assert_eq!(h.get("x-forwarded-host").unwrap(), "api.example.com");
}

/// Behind a trusted proxy, `X-Forwarded-For` still gets the TCP peer (the trusted proxy)
/// appended, not a second copy of the client address that identity took from the list.
#[tokio::test]
async fn x_forwarded_for_from_a_trusted_proxy_appends_the_peer() {
    let upstream = Upstream::start().await;
    let top = "trusted_proxies: [127.0.0.0/8]";
    let proxy = Proxy::start(&config(&[upstream.url()], top, "", "")).await;
    let a = get(&proxy.url("/v1/x"), &[("x-forwarded-for", "203.0.113.7")]).await;
    assert_eq!(a.status, 200, "{a:?}");
    // a TLS-terminating balancer's X-Forwarded-Proto and -Host are kept from a trusted peer
    let b = get(
        &proxy.url("/v1/y"),
        &[
            ("x-forwarded-for", "203.0.113.7"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "pub.example.com"),
        ],
    )
    .await;
    assert_eq!(b.status, 200, "{b:?}");
    let seen = upstream.seen();
    assert_eq!(
        seen[0].headers.get("x-forwarded-for").unwrap(),
        "203.0.113.7, 127.0.0.1"
    );
    let proxy_host = proxy.addr.to_string();
    assert_eq!(seen[0].headers.get("x-forwarded-proto").unwrap(), "http");
    assert_eq!(
        seen[0].headers.get("x-forwarded-host").unwrap(),
        proxy_host.as_str()
    );
    assert_eq!(seen[1].headers.get("x-forwarded-proto").unwrap(), "https");
    let xfh: Vec<_> = seen[1].headers.get_all("x-forwarded-host").iter().collect();
    assert_eq!(xfh, ["pub.example.com"]);
}

/// Sends a WebSocket upgrade request for `/v1/ws` on a new connection: the connection, and the
/// response head read from it (byte by byte: nothing after it).
async fn upgraded(proxy: &Proxy) -> (tokio::net::TcpStream, String) {
    let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(
        b"GET /v1/ws HTTP/1.1\r\nHost: api.example.com\r\n\
          Connection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut byte))
            .await
            .expect("101 in time")
            .unwrap();
        assert_eq!(n, 1, "closed after {:?}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    (s, String::from_utf8(head).unwrap())
}

/// An `Upgrade` request that the upstream accepts with 101 becomes a two-way byte tunnel; the
/// upstream sees the handshake headers and the client gets them back.
#[tokio::test]
async fn upgrade_requests_are_tunnelled_after_101() {
    let upstream = CountingUpstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", "")).await;
    let (mut s, head) = upgraded(&proxy).await;
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("\r\nupgrade: websocket\r\n"), "{head}");
    assert!(head.contains("\r\nconnection: upgrade\r\n"), "{head}");
    for message in [&b"ping"[..], b"a longer second message"] {
        s.write_all(message).await.unwrap();
        let mut back = vec![0u8; message.len()];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back))
            .await
            .expect("echo in time")
            .unwrap();
        assert_eq!(back, message);
    }
    let seen = upstream.headers.lock().unwrap().clone();
    assert_eq!(seen[0].get("upgrade").unwrap(), "websocket");
    assert_eq!(seen[0].get("connection").unwrap(), "upgrade");
}

/// A tunnel with no bytes either way for `timeouts.idle` is closed (as nginx closes one after
/// `proxy_read_timeout`); one in use stays open past it.
#[tokio::test]
async fn an_idle_tunnel_is_closed_after_idle() {
    let upstream = CountingUpstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "timeouts: {idle: 1s}", "", "")).await;
    let (mut s, head) = upgraded(&proxy).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head:?}");
    // in use for three times `idle`: open all along
    for _ in 0..10 {
        s.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back))
            .await
            .expect("echo in time")
            .expect("the tunnel is open");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // then silent: closed within two `idle`s (and some slack)
    let started = Instant::now();
    let mut rest = [0u8; 16];
    let end = tokio::time::timeout(Duration::from_secs(6), s.read(&mut rest))
        .await
        .expect("an idle tunnel is closed");
    assert!(matches!(end, Ok(0) | Err(_)), "{end:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
}

/// An upgrade to anything but WebSocket is not passed on (`h2c` above all: a tunnel would
/// carry later requests past the routes and limits): the request goes on as a plain one, and
/// bytes sent after it are read as the next request, routed like any other.
#[tokio::test]
async fn only_websocket_upgrades_are_tunnelled() {
    let upstream = CountingUpstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", "")).await;
    let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(
        b"GET /v1/ws HTTP/1.1\r\nHost: api.example.com\r\nConnection: Upgrade, HTTP2-Settings\r\n\
          Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n\
          GET /admin/secret HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while String::from_utf8_lossy(&got).matches("HTTP/1.1 ").count() < 2 {
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .expect("two answers in time")
            .unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(!text.contains(" 101 "), "{text}");
    // the second request was routed: no route for /admin
    assert!(text.contains("HTTP/1.1 404"), "{text}");
    let seen = upstream.headers.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "only the first request reached the upstream");
    assert!(seen[0].get("upgrade").is_none(), "{:?}", seen[0]);
    assert!(seen[0].get("http2-settings").is_none(), "{:?}", seen[0]);
}

// ---------------------------------------------------------------------------------------------
// 3. round robin and pooling

/// Two targets share the requests in turn: first, second, first, ...
#[tokio::test]
async fn round_robin_alternates_between_targets() {
    let first = Upstream::start().await;
    let second = Upstream::start().await;
    let proxy = Proxy::start(&config(&[first.url(), second.url()], "", "", "")).await;
    for i in 0..10 {
        let a = get(&proxy.url(&format!("/v1/rr/{i}")), &[]).await;
        assert_eq!(a.status, 200, "{a:?}");
    }
    let uris = |u: &Upstream| u.seen().into_iter().map(|s| s.uri).collect::<Vec<_>>();
    let even: Vec<String> = (0..10).step_by(2).map(|i| format!("/v1/rr/{i}")).collect();
    let odd: Vec<String> = (1..10).step_by(2).map(|i| format!("/v1/rr/{i}")).collect();
    assert_eq!(uris(&first), even);
    assert_eq!(uris(&second), odd);
}

/// Sequential requests, each from a new client connection, reuse a few pooled upstream
/// connections instead of opening one each.
#[tokio::test]
async fn upstream_connections_are_pooled_and_kept_alive() {
    let upstream = CountingUpstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", "")).await;
    for i in 0..50 {
        let a = get(&proxy.url(&format!("/v1/pool/{i}")), &[]).await;
        assert_eq!(a.status, 200, "{a:?}");
        // a body, so the pooled connection is handed back only after streaming it
        let a = send(
            Request::post(proxy.url("/v1/drain"))
                .body(full("abc"))
                .unwrap(),
        )
        .await;
        assert_eq!(a.body, "3");
    }
    assert_eq!(upstream.requests(), 100);
    let accepted = upstream.accepted();
    assert!(
        (1..=5).contains(&accepted),
        "100 sequential requests opened {accepted} upstream connections"
    );
}

/// An HTTP/1.1 upstream written by hand: answers `200 ok` to each bodiless request (chunked,
/// with a trailer, when `trailers`), closes each
/// connection `close_after` after answering when set (keep-alive announced all the same, as a
/// server whose keep-alive timeout is short does), and counts connections and those the proxy
/// closed; or answers with a script of raw responses (`scripted`).
struct RawUpstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    closed_by_proxy: Arc<AtomicUsize>,
    /// connections it closed itself, after a reply's `close_after`
    closed_by_upstream: Arc<AtomicUsize>,
    /// request heads read, on every connection
    heads_read: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a [`RawUpstream`] does for each request head it reads; `None` closes at once.
type Answering = Box<dyn Fn() -> Option<Reply> + Send + Sync>;

/// One answer of a [`RawUpstream`].
struct Reply {
    bytes: &'static [u8],
    /// waited before answering
    after: Duration,
    /// when set, the connection closes this long after the answer
    close_after: Option<Duration>,
}

impl RawUpstream {
    async fn start(close_after: Option<Duration>) -> RawUpstream {
        RawUpstream::serving(close_after, false).await
    }

    async fn serving(close_after: Option<Duration>, trailers: bool) -> RawUpstream {
        let answer: &'static [u8] = if trailers {
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-sum\r\n\r\n2\r\nok\r\n0\r\nx-sum: 1\r\n\r\n"
        } else {
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        };
        RawUpstream::answering(Box::new(move || {
            Some(Reply {
                bytes: answer,
                after: Duration::ZERO,
                close_after,
            })
        }))
        .await
    }

    /// Answers every request with a 204 that states a length (which a 204 must not).
    async fn serving_204() -> RawUpstream {
        RawUpstream::answering(Box::new(|| {
            Some(Reply {
                bytes: b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n",
                after: Duration::ZERO,
                close_after: None,
            })
        }))
        .await
    }

    /// Answers the requests it reads, on whatever connection, with the next response of
    /// `script`, closing the connection after those marked so.
    async fn scripted(script: Vec<(&'static str, bool)>) -> RawUpstream {
        let script = script
            .into_iter()
            .map(|(a, close)| (a, Duration::ZERO, close));
        RawUpstream::scripted_after(script.collect()).await
    }

    /// [`RawUpstream::scripted`], each answer after its wait; an empty answer closes the
    /// connection without one.
    async fn scripted_after(script: Vec<(&'static str, Duration, bool)>) -> RawUpstream {
        let script = Mutex::new(std::collections::VecDeque::from(script));
        RawUpstream::answering(Box::new(move || {
            let (answer, after, close) = script.lock().unwrap().pop_front()?;
            (!answer.is_empty()).then(|| Reply {
                bytes: answer.as_bytes(),
                after,
                close_after: close.then_some(Duration::ZERO),
            })
        }))
        .await
    }

    async fn answering(answering: Answering) -> RawUpstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let closed_by_proxy = Arc::new(AtomicUsize::new(0));
        let closed_by_upstream = Arc::new(AtomicUsize::new(0));
        let heads_read = Arc::new(AtomicUsize::new(0));
        let (count, closed) = (accepted.clone(), closed_by_proxy.clone());
        let closing = closed_by_upstream.clone();
        let read = heads_read.clone();
        let answering = Arc::new(answering);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let closed = closed.clone();
                let closing = closing.clone();
                let answering = answering.clone();
                let heads = read.clone();
                connections.spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let n = stream.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            closed.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            heads.fetch_add(1, Ordering::SeqCst);
                            let Some(reply) = answering() else {
                                return;
                            };
                            tokio::time::sleep(reply.after).await;
                            if stream.write_all(reply.bytes).await.is_err() {
                                return;
                            }
                            if let Some(after) = reply.close_after {
                                tokio::time::sleep(after).await;
                                drop(stream);
                                closing.fetch_add(1, Ordering::SeqCst);
                                return;
                            }
                        }
                    }
                });
            }
        });
        RawUpstream {
            addr,
            accepted,
            closed_by_proxy,
            closed_by_upstream,
            heads_read,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// An idle upstream connection the upstream has closed is not used: the next request goes out
/// on a new connection and is answered.
#[tokio::test]
async fn upstream_connections_closed_by_the_upstream_are_not_reused() {
    let upstream = RawUpstream::start(Some(Duration::from_millis(10))).await;
    let proxy = Proxy::start(&config(&[upstream.url()], "workers: 1", "", "")).await;
    for i in 0..8 {
        let a = get(&proxy.url(&format!("/v1/n{i}")), &[]).await;
        assert_eq!(a.status, 200, "request {i}: {a:?}");
        // the upstream has closed the connection
        eventually(Duration::from_secs(5), || async {
            upstream.closed_by_upstream.load(Ordering::SeqCst) == i + 1
        })
        .await;
    }
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 8);
}

/// A chunked response with trailers hands its upstream connection back too: sequential
/// requests share one connection.
#[tokio::test]
async fn upstream_connections_are_reused_after_responses_with_trailers() {
    let upstream = RawUpstream::serving(None, true).await;
    let proxy = Proxy::start(&config(&[upstream.url()], "workers: 1", "", "")).await;
    for i in 0..5 {
        let a = get(&proxy.url(&format!("/v1/t{i}")), &[]).await;
        assert_eq!((a.status, a.body.as_str()), (200, "ok"), "request {i}");
    }
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 1);
}

/// A response head larger than one read (40 KB of fields) reaches the client whole; one over
/// the 64 KiB the proxy holds for a head is a 502, and its connection is not used again.
#[tokio::test]
async fn large_response_heads_are_read_across_reads_up_to_a_limit() {
    let head = |field: usize| -> &'static str {
        let text = format!(
            "HTTP/1.1 200 OK\r\nX-Big: {}\r\nContent-Length: 2\r\n\r\nok",
            "v".repeat(field)
        );
        Box::leak(text.into_boxed_str())
    };
    let upstream = RawUpstream::scripted(vec![
        (head(40_000), false),
        (head(70_000), false),
        (head(10), false),
    ])
    .await;
    let proxy = Proxy::start(&config(&[upstream.url()], "workers: 1", "", "")).await;
    let a = get(&proxy.url("/v1/big"), &[]).await;
    assert_eq!((a.status, a.body.as_str()), (200, "ok"));
    assert_eq!(a.header("x-big").map(str::len), Some(40_000));
    let a = get(&proxy.url("/v1/too-big"), &[]).await;
    assert_eq!(
        (a.status, json(&a)["error"].as_str()),
        (502, Some("upstream_error"))
    );
    let a = get(&proxy.url("/v1/small"), &[]).await;
    assert_eq!((a.status, a.header("x-big")), (200, Some("vvvvvvvvvv")));
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 2);
}

/// A chunked response's trailer section is bounded as its head is: with 10 KB of trailer
/// fields the response ends whole; 80 KB, even when they come in one piece, cut it short, and
/// that upstream connection is not used again.
#[tokio::test]
async fn trailer_sections_are_bounded_as_heads_are() {
    let chunked = |fields: usize| -> &'static str {
        let trailers: String = (0..fields)
            .map(|i| format!("x-t{i}: {}\r\n", "v".repeat(990)))
            .collect();
        let text = format!(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n{trailers}\r\n"
        );
        Box::leak(text.into_boxed_str())
    };
    let upstream = RawUpstream::scripted(vec![
        (chunked(10), false),
        (chunked(80), false),
        (chunked(1), false),
    ])
    .await;
    let proxy = Proxy::start(&config(&[upstream.url()], "workers: 1", "", "")).await;
    // read raw: the test's own HTTP client would refuse trailers past 16 KiB by itself
    let fetch = |path: &'static str| async move {
        let mut conn = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nConnection: close\r\n\r\n");
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let read = conn.read_to_end(&mut got);
        let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
        String::from_utf8_lossy(&got).into_owned()
    };
    // the upstream declares no `Trailer` field, so none goes on to an HTTP/1.1 client: a whole
    // response ends "0\r\n\r\n"
    let small = fetch("/v1/small").await;
    assert!(
        small.starts_with("HTTP/1.1 200") && small.ends_with("ok\r\n0\r\n\r\n"),
        "{small}"
    );
    let big = fetch("/v1/big").await;
    assert!(
        big.starts_with("HTTP/1.1 200") && !big.ends_with("0\r\n\r\n"),
        "not cut short: {big}"
    );
    let next = fetch("/v1/next").await;
    assert!(next.ends_with("ok\r\n0\r\n\r\n"), "{next}");
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 2);
}

/// An upstream response with both Content-Length and Transfer-Encoding is framed by the
/// chunking (RFC 9112 §6.3): the client gets the whole body, with the stale Content-Length
/// gone, whether the request had a body (hyper's client) or not (the proxy's own).
#[tokio::test]
async fn a_response_with_content_length_and_chunking_is_framed_by_the_chunking() {
    let both = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    // (the POST's connection stays open: closed at once, with the body's byte perhaps still
    // unread, the upstream's kernel could reset it before the proxy read the answer)
    let upstream = RawUpstream::scripted(vec![(both, false), (both, true)]).await;
    let proxy = Proxy::start(&config(&[upstream.url()], "workers: 1", "", "")).await;
    for request in [
        &b"POST /v1/both HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx"[..],
        b"GET /v1/both HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    ] {
        let answer = raw(proxy.addr, request).await;
        let (head, body) = answer.split_once("\r\n\r\n").expect("a response head");
        assert!(head.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            !head.to_ascii_lowercase().contains("content-length: 3"),
            "{answer}"
        );
        let whole = body == "hello" || body == "5\r\nhello\r\n0\r\n\r\n";
        assert!(
            whole,
            "the whole body, framed one way or the other: {answer:?}"
        );
    }
}

/// Response bodies reach the client whole however the upstream frames them (chunked with
/// extensions, none for 204 or HEAD, after interim 1xx heads, until the connection closes), and
/// an upstream connection is reused after each of them except the one delimited by its close.
#[tokio::test]
async fn every_framing_of_a_response_body_is_forwarded() {
    let upstream = RawUpstream::scripted(vec![
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\nabcd\r\n6\r\nefghij\r\n0\r\n\r\n",
            false,
        ),
        ("HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n", false),
        ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", false),
        (
            "HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
            false,
        ),
        ("HTTP/1.0 200 OK\r\nX-Old: 1\r\n\r\nuntil the close", true),
        ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false),
    ])
    .await;
    let proxy = Proxy::start(&config(&[upstream.url()], "workers: 1", "", "")).await;
    let a = get(&proxy.url("/v1/chunked"), &[]).await;
    assert_eq!((a.status, a.body.as_str()), (200, "abcdefghij"));
    let a = get(&proxy.url("/v1/none"), &[]).await;
    assert_eq!(
        (a.status, a.body.as_str(), a.header("x-a")),
        (204, "", Some("1"))
    );
    let head = Request::head(proxy.url("/v1/head")).body(empty()).unwrap();
    let a = send(head).await;
    assert_eq!((a.status, a.header("content-length")), (200, Some("5")));
    let a = get(&proxy.url("/v1/interim"), &[]).await;
    assert_eq!((a.status, a.body.as_str()), (200, "hi"));
    let a = get(&proxy.url("/v1/old"), &[]).await;
    assert_eq!(
        (a.status, a.body.as_str(), a.header("x-old")),
        (200, "until the close", Some("1"))
    );
    let a = get(&proxy.url("/v1/after"), &[]).await;
    assert_eq!((a.status, a.body.as_str()), (200, "ok"));
    assert_eq!(
        upstream.accepted.load(Ordering::SeqCst),
        2,
        "reused but after the close"
    );
}

/// A response head that cannot be framed (two lengths) is a 502, and its connection is not
/// used again; a body cut short by the upstream is not passed off as whole.
#[tokio::test]
async fn unframeable_or_cut_responses_are_not_passed_on_as_whole() {
    let upstream = RawUpstream::scripted(vec![
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
            false,
        ),
        ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false),
        ("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", true),
        ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false),
    ])
    .await;
    let proxy = Proxy::start(&config(&[upstream.url()], "workers: 1", "", "")).await;
    let a = get(&proxy.url("/v1/two-lengths"), &[]).await;
    assert_eq!(
        (a.status, json(&a)["error"].as_str()),
        (502, Some("upstream_error"))
    );
    let a = get(&proxy.url("/v1/next"), &[]).await;
    assert_eq!((a.status, a.body.as_str()), (200, "ok"));
    let cut = Request::get(proxy.url("/v1/cut")).body(empty()).unwrap();
    let whole = match http_client().request(cut).await {
        Err(_) => false,
        Ok(resp) => resp.into_body().collect().await.is_ok(),
    };
    assert!(
        !whole,
        "a 10-byte body cut after 3 bytes came through as whole"
    );
    let a = get(&proxy.url("/v1/last"), &[]).await;
    assert_eq!((a.status, a.body.as_str()), (200, "ok"));
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 3);
}

/// An upstream (on a thread of its own) that answers each request head with 10 000 bytes
/// announced and 5 sent, then closes the connection, or with `hold`, keeps it open sending
/// nothing more.
fn short_body_upstream(hold: bool) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\nabcde");
            if hold {
                held.push(stream);
            }
        }
    });
    upstream
}

/// A short body cut by the upstream (10 000 bytes announced, 5 sent, then the close) reaches
/// the client as nginx passes it: the head and the 5 bytes, then the connection closes. Never
/// a close with no response at all (which a client may take as leave to send it again).
#[tokio::test]
async fn a_cut_body_reaches_the_client_with_its_head_then_the_close() {
    // (on a thread of its own: the answer and the close leave together, as they do from
    // most servers, and reach the proxy in one turn of its runtime)
    let upstream = short_body_upstream(false);
    let tries = 12;
    let proxy = Proxy::start(&config(&[upstream], "workers: 1", "", "")).await;
    for i in 0..tries {
        let answer = raw(
            proxy.addr,
            format!("GET /v1/cut{i} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 200 OK\r\n") && answer.ends_with("\r\n\r\nabcde"),
            "try {i}: {answer:?}"
        );
        assert!(answer.contains("content-length: 10000\r\n"), "{answer:?}");
    }
}

/// A body the upstream stops sending (5 bytes of 10 000, then nothing, the connection open) is
/// cut after `upstream_response` without a byte, as nginx's `proxy_read_timeout`: the client
/// gets the head and the 5 bytes, then the close, instead of both connections held for ever.
/// Both clients of the pool: a bodiless request's and one with a body.
#[tokio::test]
async fn a_body_the_upstream_stops_sending_is_cut_after_upstream_response() {
    let upstream = short_body_upstream(true);
    let timeouts = "timeouts: {upstream_response: 1s}";
    let proxy = Proxy::start(&config(&[upstream], timeouts, "", "")).await;
    for request in [
        "GET /v1/stall HTTP/1.1\r\nHost: x\r\n\r\n",
        "POST /v1/stall HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
    ] {
        let started = Instant::now();
        let answer = raw(proxy.addr, request.as_bytes()).await;
        assert!(
            answer.starts_with("HTTP/1.1 200 OK\r\n") && answer.ends_with("\r\n\r\nabcde"),
            "{request:?}: {answer:?}"
        );
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(6),
            "{request:?}: cut after {took:?}"
        );
    }
}

/// A request the upstream reads and then closes on without answering is sent again at most
/// once, on a new connection, and only when its method is idempotent: with two idle
/// connections, a GET is read twice and a DELETE too, a POST once.
#[tokio::test]
async fn a_request_met_by_a_close_is_sent_again_at_most_once() {
    // long enough that the two requests of a pair overlap on any machine: two connections
    let slow = Duration::from_millis(500);
    let ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    let mut script = Vec::new();
    for _ in 0..3 {
        // two requests at once make two connections; then each request is met by closes
        script.extend([(ok, slow, false), (ok, slow, false)]);
        script.extend([("", Duration::ZERO, false); 2]);
    }
    let upstream = RawUpstream::scripted_after(script).await;
    let proxy = Proxy::start(&config(&[upstream.url()], "workers: 1", "", "")).await;
    let mut read = 0;
    // connections after each round: a pair makes one new beside the idle one left (two at
    // first), and a resend goes on a new one
    for (method, sent, connections) in [("GET", 2, 3), ("DELETE", 2, 5), ("POST", 1, 6)] {
        let (url_a, url_b) = (proxy.url("/v1/a"), proxy.url("/v1/b"));
        let (a, b) = tokio::join!(get(&url_a, &[]), get(&url_b, &[]));
        assert_eq!(
            (a.status, b.status),
            (200, 200),
            "{method}: two idle connections"
        );
        read += 2;
        let req = Request::builder()
            .method(method)
            .uri(proxy.url("/v1/boom"))
            .body(empty())
            .unwrap();
        assert_eq!(send(req).await.status, 502, "{method}");
        read += sent;
        assert_eq!(
            upstream.heads_read.load(Ordering::SeqCst),
            read,
            "{method} sent {sent}"
        );
        let accepted = upstream.accepted.load(Ordering::SeqCst);
        assert_eq!(accepted, connections, "{method}: connections so far");
        if sent == 1 {
            // the unread close the script still holds for the next connection
            read += 1;
            let a = get(&proxy.url("/v1/c"), &[]).await;
            assert_eq!(a.status, 502);
        }
    }
}

/// Pooled upstream connections close after `timeouts.idle` without a request; the next
/// request opens a new one.
#[tokio::test]
async fn idle_upstream_connections_close_after_idle() {
    let upstream = RawUpstream::start(None).await;
    let top = "workers: 1\ntimeouts:\n  idle: 300ms";
    let proxy = Proxy::start(&config(&[upstream.url()], top, "", "")).await;
    for i in 0..3 {
        assert_eq!(get(&proxy.url(&format!("/v1/a{i}")), &[]).await.status, 200);
    }
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 1, "kept alive");
    // the proxy closes the idle upstream connection
    eventually(Duration::from_secs(3), || async {
        upstream.closed_by_proxy.load(Ordering::SeqCst) > 0
    })
    .await;
    assert_eq!(get(&proxy.url("/v1/again"), &[]).await.status, 200);
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 2);
}

// ---------------------------------------------------------------------------------------------
// 4. errors tollgate answers itself

/// No route: 404 with a JSON body.
#[tokio::test]
async fn no_route_is_404_json() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", "")).await;
    for path in ["/", "/v2/x", "/v1x"] {
        let a = get(&proxy.url(path), &[]).await;
        assert_eq!(a.status, 404, "{path}: {a:?}");
        assert_eq!(json(&a)["error"], "no_route");
    }
    assert!(upstream.seen().is_empty());
}

/// Bad percent-encoding in the path: 400 with a JSON body, nothing forwarded.
#[tokio::test]
async fn bad_percent_encoding_is_400() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", "")).await;
    for path in ["/v1/%zz", "/v1/a%2", "/v1/%g0/x"] {
        let a = get(&proxy.url(path), &[]).await;
        assert_eq!(a.status, 400, "{path}: {a:?}");
        assert_eq!(json(&a)["error"], "bad_request");
    }
    assert!(upstream.seen().is_empty());
}

/// A target that refuses connections: 502 with a JSON body.
#[tokio::test]
async fn refused_connection_is_502_json() {
    let held = common::DeadPort::new();
    let target = format!("http://127.0.0.1:{}", held.port());
    let proxy = Proxy::start(&config(&[target], "", "", "")).await;
    let a = get(&proxy.url("/v1/x"), &[]).await;
    assert_eq!(a.status, 502, "{a:?}");
    assert_eq!(json(&a)["error"], "upstream_unreachable");
    // the connection's own error (the target's address) is for the log, not the client
    assert_eq!(json(&a)["message"], "upstream api: connect failed");
}

/// No response head within `timeouts.upstream_response`: 504 with a JSON body, answered soon
/// after the timeout rather than when the upstream finally answers.
#[tokio::test]
async fn slow_upstream_is_504_after_the_response_timeout() {
    let upstream = Upstream::start().await;
    let top = "timeouts:\n  upstream_response: 300ms";
    let proxy = Proxy::start(&config(&[upstream.url()], top, "", STRIP)).await;
    let started = Instant::now();
    let a = get(&proxy.url("/v1/slow/2000"), &[]).await;
    let took = started.elapsed();
    assert_eq!(a.status, 504, "{a:?}");
    assert_eq!(json(&a)["error"], "upstream_timeout");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(1500),
        "answered after {took:?}"
    );
    // a fast request on the same route is unaffected
    let a = get(&proxy.url("/v1/slow/10"), &[]).await;
    assert_eq!(a.status, 200, "{a:?}");
}

/// A target that accepts connections but never answers is left out of the rotation after its
/// first 504 (as nginx's `max_fails` counts a timeout): the requests after it go to the target
/// that answers, instead of every other one waiting out the timeout. A request with a body
/// counts too once its body was sent whole: the time was the upstream's, not the upload's.
#[tokio::test]
async fn silent_target_is_left_out_after_a_response_timeout() {
    let upstream = Upstream::start().await;
    for with_body in [false, true] {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_url = format!("http://{}", silent.local_addr().unwrap());
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((stream, _)) = silent.accept().await {
                open.push(stream); // read nothing, answer nothing
            }
        });
        let top = "workers: 1\ntimeouts:\n  upstream_response: 300ms";
        let proxy = Proxy::start(&config(&[silent_url, upstream.url()], top, "", "")).await;
        // round robin starts at the silent target
        let first = if with_body {
            send(
                Request::post(proxy.url("/v1/upload"))
                    .body(full("abc"))
                    .unwrap(),
            )
            .await
        } else {
            get(&proxy.url("/v1/first"), &[]).await
        };
        assert_eq!(first.status, 504, "{first:?}");
        // (a request sent to the silent target would be a 504: the status tells where each went)
        for i in 0..6 {
            let a = get(&proxy.url(&format!("/v1/after/{i}")), &[]).await;
            assert_eq!(a.status, 200, "request {i} after the timeout: {a:?}");
        }
        held.abort();
    }
}

/// A request with a body whose target refuses the connection is sent whole to another target,
/// as a bodiless one is (nginx's `proxy_next_upstream error`): nothing of it reached the first.
/// So is a body still streaming from the client when the connection is refused.
#[tokio::test]
async fn a_request_with_a_body_goes_to_another_target_when_the_first_refuses() {
    let upstream = CountingUpstream::start().await;
    let held = common::DeadPort::new();
    let refusing = format!("http://127.0.0.1:{}", held.port());
    let targets = [refusing, upstream.url()];
    // (a proxy each: round robin starts at the refusing target, which is then left out)
    let proxy = Proxy::start(&config(&targets, "workers: 1", "", "")).await;
    let a = send(
        Request::post(proxy.url("/v1/drain"))
            .body(full("ten bytes!"))
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, "10", "the whole body reached the other target");
    drop(proxy);

    let proxy = Proxy::start(&config(&targets, "workers: 1", "", "")).await;
    let body = pieces(4, Duration::from_millis(100));
    let a = send(Request::post(proxy.url("/v1/drain")).body(body).unwrap()).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, "24", "all four pieces reached the other target");
    assert_eq!(
        upstream.accepted.load(Ordering::SeqCst),
        2,
        "one connection each"
    );
    drop(proxy);

    // an upload to the other target that outlasts `upstream_response` while it moves is
    // answered, as on the first target (the timeout runs from the end of the body)
    let top = "workers: 1\ntimeouts:\n  upstream_response: 1s";
    let proxy = Proxy::start(&config(&targets, top, "", "")).await;
    let body = pieces(8, Duration::from_millis(200));
    let a = send(Request::post(proxy.url("/v1/drain")).body(body).unwrap()).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, "48", "all eight pieces reached the other target");
}

/// `timeouts.upstream_response` is the wait for the response head, and it starts when the
/// request body has been sent. An upload slower than it, but moving, is answered. An upload
/// that stops coming from the client for that long gets 408, not the upstream's 504.
#[tokio::test]
async fn the_response_timeout_starts_when_the_body_has_been_sent() {
    // it answers /v1/drain once it has read the whole body
    let upstream = CountingUpstream::start().await;
    let top = "timeouts:\n  upstream_response: 1s";
    let proxy = Proxy::start(&config(&[upstream.url()], top, "", "")).await;
    // 1.6 s of upload in pieces 200 ms apart, all of it read by the upstream
    let body = pieces(8, Duration::from_millis(200));
    let drained = send(Request::post(proxy.url("/v1/drain")).body(body).unwrap()).await;
    assert_eq!(drained.status, 200, "{drained:?}");
    assert_eq!(drained.body, "48", "all eight pieces reached the upstream");

    // a chunked body that stops half-way
    let started = Instant::now();
    let answer = raw(
        proxy.addr,
        b"POST /v1/drain HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    // the body was not read to its end: the connection ends, and the answer says so
    assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

type BoxErr = Box<dyn std::error::Error + Send + Sync>;

/// A request body streaming from the client: `n` pieces of 6 bytes (`piece `), each sent
/// `every` after the one before.
fn pieces(n: usize, every: Duration) -> TestBody {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxErr>>(1);
    tokio::spawn(async move {
        for _ in 0..n {
            tokio::time::sleep(every).await;
            let piece = Ok(Frame::data(Bytes::from_static(b"piece ")));
            if tx.send(piece).await.is_err() {
                return;
            }
        }
    });
    http_body_util::StreamBody::new(ReceiverStream(rx)).boxed()
}

/// A channel's receiving end as a stream of body frames.
struct ReceiverStream<T>(tokio::sync::mpsc::Receiver<T>);

impl<T> futures_core::Stream for ReceiverStream<T> {
    type Item = T;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.0.poll_recv(cx)
    }
}

/// A body over `max_body_size` announced by Content-Length: 413 with a JSON body, and the
/// upstream is not even contacted; a body at the limit passes.
#[tokio::test]
async fn body_over_max_size_with_content_length_is_413() {
    let upstream = CountingUpstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "max_body_size: 1KiB", "", "")).await;
    let a = send(
        Request::post(proxy.url("/v1/drain"))
            .body(full(vec![b'x'; 64 * 1024]))
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, 413, "{a:?}");
    assert_eq!(json(&a)["error"], "payload_too_large");
    assert_eq!(
        a.header("connection"),
        Some("close"),
        "the body is not read"
    );
    assert_eq!(upstream.accepted(), 0);
    let a = send(
        Request::post(proxy.url("/v1/drain"))
            .body(full(vec![b'x'; 1024]))
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, "1024");
}

/// A chunked body (no length announced) that grows past `max_body_size`: 413 with a JSON body
/// and the upstream never gets the whole body; a chunked body at the limit passes.
#[tokio::test]
async fn chunked_body_over_max_size_is_413() {
    let upstream = CountingUpstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "max_body_size: 1KiB", "", "")).await;
    let a = send(
        Request::post(proxy.url("/v1/drain"))
            .body(Repeat::body(64 * 1024, 256))
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, 413, "{a:?}");
    assert_eq!(json(&a)["error"], "payload_too_large");
    let a = send(
        Request::post(proxy.url("/v1/drain"))
            .body(Repeat::body(1024, 100))
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, "1024");
}

// ---------------------------------------------------------------------------------------------
// 5. streaming

/// Resident set size of this process (the proxy runs in it), in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS in /proc/self/status");
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

/// Samples the RSS every few milliseconds on its own thread until dropped; `peak` is the
/// highest seen.
struct RssSampler {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start() -> RssSampler {
        let peak = Arc::new(AtomicU64::new(rss()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                p.fetch_max(rss(), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        RssSampler {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    fn peak(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.peak.load(Ordering::SeqCst).max(rss())
    }
}

const HUNDRED_MB: u64 = 100 * 1024 * 1024;
/// How much the process may grow while 100 MB pass through it.
const GROWTH_LIMIT: u64 = 40 * 1024 * 1024;

/// A 100 MB chunked upload echoed back and a 100 MB download both arrive whole while the
/// process (proxy, upstream and client together) grows by far less than 100 MB: bodies stream.
/// One test for both, so no other big transfer in this file runs at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_100_mb_both_ways_without_buffering() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", STRIP)).await;
    let client = http_client();
    // warm up: connections, pools, allocator arenas
    let a = get(&proxy.url("/v1/bytes/1048576"), &[]).await;
    assert_eq!(a.body.len(), 1 << 20);

    let before = rss();
    let sampler = RssSampler::start();
    let req = Request::post(proxy.url("/v1/echo"))
        .body(Repeat::body(HUNDRED_MB, 64 * 1024))
        .unwrap();
    let resp = client.request(req).await.expect("upload");
    assert_eq!(resp.status(), 200);
    let echoed = count_body(resp.into_body()).await;
    let upload_peak = sampler.peak();
    assert_eq!(echoed, HUNDRED_MB, "bytes echoed back");

    let sampler = RssSampler::start();
    let req = Request::get(proxy.url(&format!("/v1/bytes/{HUNDRED_MB}")))
        .body(empty())
        .unwrap();
    let resp = client.request(req).await.expect("download");
    assert_eq!(resp.status(), 200);
    let downloaded = count_body(resp.into_body()).await;
    let download_peak = sampler.peak();
    assert_eq!(downloaded, HUNDRED_MB, "bytes downloaded");

    for (what, peak) in [("upload", upload_peak), ("download", download_peak)] {
        let growth = peak.saturating_sub(before);
        assert!(
            growth < GROWTH_LIMIT,
            "{what}: RSS grew by {} MiB (from {} MiB)",
            growth >> 20,
            before >> 20
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 6. HTTP/2 cleartext inbound

/// A request over h2c (prior knowledge) is routed by its `:authority`, forwarded to the
/// HTTP/1.1 upstream with a Host header (and split Cookie fields joined), and answered over
/// HTTP/2, bodies included.
#[tokio::test]
async fn h2c_requests_are_proxied_to_an_http1_upstream() {
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .route_matching(
            "api",
            "{host: api.example.com, path_prefix: /v1}",
            "api",
            STRIP,
        )
        .build();
    let proxy = Proxy::start(&yaml).await;
    let stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2c handshake");
    tokio::spawn(conn);

    let req = Request::get("http://api.example.com/v1/h2?x=1")
        .body(empty())
        .unwrap();
    let resp = sender.send_request(req).await.expect("h2 GET");
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");

    let req = Request::post("http://api.example.com/v1/echo")
        .body(full("hello over h2"))
        .unwrap();
    let resp = sender.send_request(req).await.expect("h2 POST");
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"hello over h2");

    // HTTP/2 may split Cookie into several fields; HTTP/1.1 gets them as one
    let req = Request::get("http://api.example.com/v1/cookies")
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .body(empty())
        .unwrap();
    let resp = sender.send_request(req).await.expect("h2 GET cookies");
    assert_eq!(resp.status(), 200);

    // another authority does not match the route
    let req = Request::get("http://other.example.com/v1/h2")
        .body(empty())
        .unwrap();
    let resp = sender.send_request(req).await.expect("h2 GET other");
    assert_eq!(resp.status(), 404);

    let seen = upstream.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[0].method, "GET");
    assert_eq!(seen[0].uri, "/h2?x=1");
    assert_eq!(seen[0].headers.get("host").unwrap(), "api.example.com");
    assert_eq!(
        seen[0].headers.get("x-forwarded-host").unwrap(),
        "api.example.com"
    );
    assert_eq!(seen[1].headers.get("host").unwrap(), "api.example.com");
    let cookies: Vec<_> = seen[2].headers.get_all("cookie").iter().collect();
    assert_eq!(cookies, ["a=1; b=2"]);
}

// ---------------------------------------------------------------------------------------------
// 7. malformed requests

/// What hyper parses but no route may serve as sent is refused with 400, as nginx refuses it,
/// and reaches no upstream: a method not in upper case (`post` would pass by a `methods:
/// [POST]` route's limit, and most applications serve it as POST), a target with user
/// information, a port out of range or another scheme. An absolute-form target without a path
/// goes on with `/` as its path.
#[tokio::test]
async fn request_lines_no_route_may_serve_get_400() {
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .route_matching(
            "login",
            "{path: /login, methods: [POST]}",
            "api",
            "limits:\n  - {name: tries, algorithm: fixed_window, limit: 1, window: 1h}",
        )
        .route("rest", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    // (the hourly window must not end between the two POSTs)
    clear_of_hour_end(Duration::from_secs(5)).await;
    let post = |method: &str| {
        format!(
            "{method} /login HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
    };
    assert!(raw(proxy.addr, post("POST").as_bytes())
        .await
        .starts_with("HTTP/1.1 200"));
    assert!(raw(proxy.addr, post("POST").as_bytes())
        .await
        .starts_with("HTTP/1.1 429"));
    for refused in [
        post("post"),
        post("Post"),
        "GET http://user:pw@abs.example/x HTTP/1.1\r\nHost: abs.example\r\nConnection: close\r\n\r\n".to_string(),
        "GET http://abs.example:99999/x HTTP/1.1\r\nHost: abs.example\r\nConnection: close\r\n\r\n".to_string(),
        "GET ftp://abs.example/x HTTP/1.1\r\nHost: abs.example\r\nConnection: close\r\n\r\n".to_string(),
    ] {
        let answer = raw(proxy.addr, refused.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{refused:?}: {answer}");
        assert!(answer.contains(r#""error":"bad_request""#), "{answer}");
    }
    assert_eq!(
        upstream.seen().len(),
        1,
        "only the first POST reached the upstream"
    );
    let answer = raw(
        proxy.addr,
        b"GET http://abs.example?x=1 HTTP/1.1\r\nHost: abs.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(upstream.seen()[1].uri, "/?x=1");
}

/// An upstream's 204 that states a length reaches an HTTP/2 client without it (a 204 states
/// none, RFC 9110 §8.6), as it does an HTTP/1.1 one.
#[tokio::test]
async fn a_204_reaches_http2_clients_without_a_length() {
    let upstream = RawUpstream::serving_204().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", "")).await;
    let stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2c handshake");
    tokio::spawn(conn);
    let req = Request::get(proxy.url("/v1/none")).body(empty()).unwrap();
    let resp = sender.send_request(req).await.expect("h2 GET");
    assert_eq!(resp.status(), 204);
    assert_eq!(resp.headers().get("content-length"), None, "{resp:?}");
    let a = get(&proxy.url("/v1/none"), &[]).await;
    assert_eq!((a.status, a.header("content-length")), (204, None));
}

/// A CONNECT is refused with 400 and its connection closed: the bytes sent after it for the
/// tunnel are not read as a request of their own.
#[tokio::test]
async fn connect_is_refused_and_its_connection_closed() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", "")).await;
    let answer = raw(
        proxy.addr,
        b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\nGET /v1/smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert_eq!(answer.matches("HTTP/1.1").count(), 1, "{answer}");
    assert!(upstream.seen().is_empty());
}

/// A malformed request head gets 400 while a request in flight on another connection, and a
/// new connection, are served normally.
#[tokio::test]
async fn malformed_request_gets_400_without_disturbing_others() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", STRIP)).await;
    let slow_url = proxy.url("/v1/slow/800");
    let in_flight = tokio::spawn(async move { get(&slow_url, &[]).await });
    // the slow request is at the upstream
    eventually(Duration::from_secs(5), || async {
        upstream.seen().len() == 1
    })
    .await;

    let response = raw(
        proxy.addr,
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 400"), "{response:?}");

    let a = get(&proxy.url("/v1/after"), &[]).await;
    assert_eq!(a.status, 200, "{a:?}");
    let a = in_flight.await.unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.body, "slow ok");
}

/// A request head far too large gets 431 and does not disturb other connections.
#[tokio::test]
async fn oversized_request_head_gets_431() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", "")).await;
    let mut request = String::from("GET /v1/x HTTP/1.1\r\nHost: x\r\n");
    for i in 0..200 {
        request.push_str(&format!("X-Filler-{i}: {}\r\n", "y".repeat(40)));
    }
    request.push_str("\r\n");
    let response = raw(proxy.addr, request.as_bytes()).await;
    assert!(
        response.starts_with("HTTP/1.1 431"),
        "{:?}",
        &response[..response.len().min(200)]
    );
    let a = get(&proxy.url("/v1/after"), &[]).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(upstream.seen().iter().all(|s| s.uri == "/v1/after"));
}

/// A GET with a body of unknown length (chunked over HTTP/1.1, DATA frames without a
/// content-length over HTTP/2) reaches the upstream whole: it is not taken for a GET without
/// a body and dropped.
#[tokio::test]
async fn a_get_with_a_body_of_unknown_length_keeps_its_body() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", STRIP)).await;
    let answer = raw(
        proxy.addr,
        b"GET /v1/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
          5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // echoed back chunked as it came
    assert!(
        answer.contains("\r\nhello\r\n") && answer.contains("\r\n world\r\n"),
        "{answer}"
    );

    let stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2c handshake");
    tokio::spawn(conn);
    let req = Request::get("http://x/v1/echo")
        .body(Repeat::body(3000, 1000))
        .unwrap();
    let resp = sender.send_request(req).await.expect("h2 GET with a body");
    assert_eq!(resp.status(), 200);
    assert_eq!(count_body(resp.into_body()).await, 3000);
}

/// A response in a transfer coding other than chunked gets 502 with a JSON body (as nginx
/// refuses it): its coding is hop-by-hop, so passed on without it the body would be bytes in a
/// coding nobody undoes. Through tollgate's own client (a GET) and hyper's (a POST).
#[tokio::test]
async fn a_response_in_a_transfer_coding_other_than_chunked_is_a_502() {
    const GZIP: &str =
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n4\r\n\x1f\u{8b}\x08\x00\r\n0\r\n\r\n";
    let upstream = RawUpstream::scripted(vec![(GZIP, true), (GZIP, true)]).await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", "")).await;
    let a = get(&proxy.url("/v1/gz"), &[]).await;
    assert_eq!(a.status, 502, "{a:?}");
    assert_eq!(json(&a)["error"], "upstream_error");
    let a = send(
        Request::post(proxy.url("/v1/gz"))
            .body(full("abc"))
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, 502, "{a:?}");
    assert_eq!(json(&a)["error"], "upstream_error");
}

/// `Expect: 100-continue` is answered by tollgate (the 100 once the request is admitted) and
/// not passed on: the upstream is not asked to continue a second time (as nginx drops it).
#[tokio::test]
async fn expect_continue_is_answered_here_and_not_passed_on() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", STRIP)).await;
    let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(
        b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("the 100 in time")
        .unwrap();
    let interim = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(interim.starts_with("HTTP/1.1 100 Continue"), "{interim}");
    s.write_all(b"hello").await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .expect("the answer in time")
        .unwrap();
    let answer = String::from_utf8_lossy(&rest).to_string();
    assert!(
        answer.contains("200 OK") && answer.contains("hello"),
        "{answer}"
    );
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert!(
        seen[0].headers.get("expect").is_none(),
        "{:?}",
        seen[0].headers
    );
}

/// An HTTP/1.0 client asking for keep-alive is told `Connection: close` when the response has
/// no length (a streamed body ends with the connection), and `keep-alive` when it has one,
/// and then its connection serves the next request.
#[tokio::test]
async fn an_http10_response_without_a_length_says_close() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&[upstream.url()], "", "", STRIP)).await;
    let streamed = raw(
        proxy.addr,
        b"GET /v1/bytes/100 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    )
    .await;
    let (head, body) = streamed.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.0 200"), "{streamed}");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("connection: close"), "{head}");
    assert!(!head.contains("keep-alive"), "{head}");
    assert_eq!(body, "x".repeat(100));
    // a response with a length keeps the connection: two requests on one, then the second
    // asks to close
    let sized = raw(
        proxy.addr,
        b"GET /v1/sized HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /v1/sized HTTP/1.0\r\n\r\n",
    )
    .await;
    assert_eq!(sized.matches("HTTP/1.0 200").count(), 2, "{sized}");
    assert!(
        sized
            .to_ascii_lowercase()
            .contains("connection: keep-alive"),
        "{sized}"
    );
}

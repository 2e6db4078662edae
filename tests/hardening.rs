//! Hardening: malformed requests, request smuggling attempts, HTTP/2
//! misuse, slow and idle clients, thousands of idle connections, key-cardinality floods,
//! X-Forwarded-For spoofing and path tricks. Real sockets, a real upstream, tollgate in process,
//! and a real `redis-server` where Redis matters. Every test also checks that a healthy client
//! on another connection is served right after the abuse.

mod common;
common::both_http1_clients!();

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::raw::{error_code, exchange, one, parse_response, RawConn};
use common::{clear_of_hour_end, eventually, get, Proxy, Redis, Upstream, Yaml};

// ---------------------------------------------------------------------------------------------
// helpers

/// A proxy with one upstream `api` and two routes: `api` on `/v1` (forwarded as is) and `strip`
/// on `/s` (forwarded without `/s`, to reach the harness upstream's `/slow/MS` and `/echo`).
fn config(upstream: &str, top: &str) -> String {
    Yaml::to(&[upstream])
        .top(top)
        .route("api", "/v1", "")
        .route("strip", "/s", "strip_prefix: true")
        .build()
}

/// A healthy client on a fresh connection is served: 200 and the upstream's body.
async fn assert_healthy(proxy: &Proxy, context: &str) {
    let started = Instant::now();
    let a = tokio::time::timeout(Duration::from_secs(5), get(&proxy.url("/v1/healthy"), &[]))
        .await
        .unwrap_or_else(|_| panic!("{context}: a healthy client got no answer within 5 s"));
    assert_eq!(a.status, 200, "{context}: healthy client got {a:?}");
    assert_eq!(a.body, "ok", "{context}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{context}: healthy request took {:?}",
        started.elapsed()
    );
}

/// An HTTP/2 (prior knowledge, cleartext) connection to `addr`, driven by a task of its own.
async fn h2c(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Empty<Bytes>> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2c handshake");
    tokio::spawn(conn);
    sender
}

/// A keep-alive connection opened before the abuse: it must still be served afterwards.
async fn bystander(proxy: &Proxy) -> RawConn {
    let mut conn = RawConn::open(proxy.addr).await;
    assert_eq!(conn.get("/v1/bystander").await, Some(200));
    conn
}

/// Paths the upstream saw, in order.
fn seen_paths(upstream: &Upstream) -> Vec<String> {
    upstream.seen().into_iter().map(|s| s.uri).collect()
}

// ---------------------------------------------------------------------------------------------
// 1. bad input

/// Malformed request lines get 400 and a close, reach no upstream, and disturb no other client.
#[tokio::test]
async fn malformed_request_lines_get_400() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let mut keep = bystander(&proxy).await;
    let cases: &[(&str, &[u8])] = &[
        ("garbage", b"GARBAGE\r\n\r\n"),
        ("HTTP/9.9", b"GET /v1/x HTTP/9.9\r\nHost: x\r\n\r\n"),
        ("HTTP/2.0 in text", b"GET /v1/x HTTP/2.0\r\nHost: x\r\n\r\n"),
        (
            "lowercase version",
            b"GET /v1/x http/1.1\r\nHost: x\r\n\r\n",
        ),
        ("HTTP/0.9 form", b"GET /v1/x\r\n\r\n"),
        (
            "trailing junk",
            b"GET /v1/x HTTP/1.1 junk\r\nHost: x\r\n\r\n",
        ),
        (
            "space in target",
            b"GET /v1/a b HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        (
            "control in target",
            b"GET /v1/\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        ("DEL in target", b"GET /v1/\x7f HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("slash in method", b"GE/T /v1/x HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("NUL bytes", b"\0\0\0\0\0\0\0\0\r\n\r\n"),
        (
            "TLS hello on plain port",
            b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n",
        ),
    ];
    for (name, bytes) in cases {
        let (responses, closed) = exchange(proxy.addr, bytes).await;
        let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
        assert_eq!(statuses, [400], "{name}");
        assert!(closed, "{name}: connection left open after 400");
        assert_eq!(keep.get("/v1/bystander").await, Some(200), "{name}");
        assert_healthy(&proxy, name).await;
    }
    assert!(
        seen_paths(&upstream)
            .iter()
            .all(|p| p == "/v1/bystander" || p == "/v1/healthy"),
        "{:?}",
        seen_paths(&upstream)
    );
}

/// Header lines with invalid bytes or shapes (NUL, controls, bare CR, obs-fold, bad names): 400.
#[tokio::test]
async fn invalid_header_bytes_get_400() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let mut keep = bystander(&proxy).await;
    let lines: &[(&str, &[u8])] = &[
        ("NUL in value", b"X-A: a\0b"),
        ("control in value", b"X-A: a\x01b"),
        ("DEL in value", b"X-A: a\x7fb"),
        ("bare CR in value", b"X-A: a\rb"),
        ("obs-fold", b"X-A: a\r\n b"),
        ("space in name", b"Bad Header: x"),
        ("space before colon", b"X-A : x"),
        ("no colon", b"X-A"),
        ("empty name", b": x"),
        ("separator in name", b"X(A): x"),
        ("UTF-8 in name", "X-\u{e9}: x".as_bytes()),
    ];
    for (name, line) in lines {
        let mut request = b"GET /v1/x HTTP/1.1\r\nHost: x\r\n".to_vec();
        request.extend_from_slice(line);
        request.extend_from_slice(b"\r\n\r\n");
        let (responses, closed) = exchange(proxy.addr, &request).await;
        let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
        assert_eq!(statuses, [400], "{name}");
        assert!(closed, "{name}: connection left open after 400");
        assert_eq!(keep.get("/v1/bystander").await, Some(200), "{name}");
    }
    assert_healthy(&proxy, "after bad headers").await;
    assert!(!seen_paths(&upstream).iter().any(|p| p == "/v1/x"));
}

/// HTTP/1.1 without Host, with two, or with an invalid one gets 400 and a close, as in nginx.
#[tokio::test]
async fn missing_duplicate_or_invalid_host_gets_400() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let mut keep = bystander(&proxy).await;
    let bad: &[(&str, &[u8])] = &[
        ("no Host", b"GET /v1/bad HTTP/1.1\r\n\r\n"),
        (
            "no Host, absolute form",
            b"GET http://api.example/v1/bad HTTP/1.1\r\n\r\n",
        ),
        (
            "two Hosts",
            b"GET /v1/bad HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
        ),
        ("empty Host", b"GET /v1/bad HTTP/1.1\r\nHost:\r\n\r\n"),
        (
            "Host with a space",
            b"GET /v1/bad HTTP/1.1\r\nHost: a b\r\n\r\n",
        ),
        (
            "Host with a slash",
            b"GET /v1/bad HTTP/1.1\r\nHost: a.example/x\r\n\r\n",
        ),
        (
            "Host with userinfo",
            b"GET /v1/bad HTTP/1.1\r\nHost: user@a.example\r\n\r\n",
        ),
    ];
    for (name, bytes) in bad {
        let (responses, closed) = exchange(proxy.addr, bytes).await;
        let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
        assert_eq!(statuses, [400], "{name}");
        assert_eq!(error_code(&responses[0]), "bad_request", "{name}");
        assert!(
            responses[0].head.contains("\r\nconnection: close\r\n"),
            "{name}"
        );
        assert!(closed, "{name}: connection left open after 400");
        assert_eq!(keep.get("/v1/bystander").await, Some(200), "{name}");
    }
    let r = one(proxy.addr, b"GET /v1/http10 HTTP/1.0\r\n\r\n").await;
    assert_eq!(r.status, 200, "HTTP/1.0 without Host");
    let r = one(
        proxy.addr,
        b"GET /v1/ipv6 HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200, "IPv6 Host");
    assert_healthy(&proxy, "after bad Host").await;
    let paths = seen_paths(&upstream);
    assert!(!paths.iter().any(|p| p == "/v1/bad"), "{paths:?}");
    assert!(paths.iter().any(|p| p == "/v1/http10"), "{paths:?}");
}

/// A request head over 64 KiB gets 431 however it is spread; a 48 KiB head is served.
#[tokio::test]
async fn oversized_heads_get_431() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let mut keep = bystander(&proxy).await;
    let long_line = format!("X-Big: {}\r\n", "b".repeat(70 * 1024));
    let many_lines: String = (0..90)
        .map(|i| format!("X-Filler-{i}: {}\r\n", "f".repeat(800)))
        .collect();
    let long_target = format!("/v1/{}", "t".repeat(70 * 1024));
    for (name, target, headers) in [
        ("long header line", "/v1/big".to_string(), long_line),
        ("many lines", "/v1/big".to_string(), many_lines),
        ("long target", long_target, String::new()),
    ] {
        let request = format!("GET {target} HTTP/1.1\r\nHost: x\r\n{headers}\r\n");
        let (responses, closed) = exchange(proxy.addr, request.as_bytes()).await;
        let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
        assert!(
            statuses == [431] || (statuses == [414] && name == "long target"),
            "{name}: {statuses:?}"
        );
        assert!(closed, "{name}: connection left open");
        assert_eq!(keep.get("/v1/bystander").await, Some(200), "{name}");
    }
    let fits = format!(
        "GET /v1/fits HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "b".repeat(48 * 1024)
    );
    assert_eq!(one(proxy.addr, fits.as_bytes()).await.status, 200);
    assert!(!seen_paths(&upstream).iter().any(|p| p == "/v1/big"));
    assert_healthy(&proxy, "after oversized heads").await;
}

/// A head that fits over HTTP/1.1 fits over HTTP/2 too (h2's default header list is 16 KiB).
#[tokio::test]
async fn http2_heads_fit_as_http1_heads_do() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let mut sender = h2c(proxy.addr).await;
    for size in [20 * 1024, 48 * 1024] {
        let req = Request::get("http://x/v1/h2-big")
            .header("x-big", "b".repeat(size))
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = sender.send_request(req).await.expect("h2 response");
        assert_eq!(resp.status(), 200, "a {size}-byte header over h2");
    }
}

/// An absolute-form target routes by its authority (over Host) and normalised path, as forwarded.
#[tokio::test]
async fn absolute_form_is_routed_by_authority_and_normalised_path() {
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .route_matching(
            "api",
            "{host: api.example.com, path_prefix: /v1}",
            "api",
            "",
        )
        .build();
    let proxy = Proxy::start(&yaml).await;
    let cases: &[(&str, u16, Option<&str>)] = &[
        ("http://api.example.com/v1/a/../b//c", 200, Some("/v1/b/c")),
        ("http://API.Example.COM:80/v1/%7Ex", 200, Some("/v1/~x")),
        (
            "https://api.example.com/v1/s?q=%zz",
            200,
            Some("/v1/s?q=%zz"),
        ),
        ("http://other.example/v1/x", 404, None),
        // (user information in a target is refused, as nginx refuses it)
        ("http://user@api.example.com/v1/x", 400, None),
        ("http://api.example.com/v1/%2e%2e/admin", 404, None),
        ("http://api.example.com", 404, None),
        ("http://api.example.com/v1/%zz", 400, None),
    ];
    for (target, status, forwarded) in cases {
        let before = upstream.seen().len();
        let request = format!("GET {target} HTTP/1.1\r\nHost: api.example.com\r\n\r\n");
        let mut conn = RawConn::open(proxy.addr).await;
        conn.send(request.as_bytes()).await;
        let r = conn.response().await.unwrap_or_else(|| panic!("{target}"));
        assert_eq!(r.status, *status, "{target}: {r:?}");
        let seen = upstream.seen();
        match forwarded {
            Some(path) => {
                assert_eq!(seen.len(), before + 1, "{target}");
                let last = &seen[before];
                assert_eq!(last.uri, *path, "{target}");
                let host = last.headers.get("host").and_then(|h| h.to_str().ok());
                let authority = target.split('/').nth(2);
                assert_eq!(host, authority, "{target}: Host sent upstream");
            }
            None => assert_eq!(seen.len(), before, "{target} reached the upstream"),
        }
    }
    // Host alone does not route when the target's authority says otherwise
    let request = b"GET http://other.example/v1/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n";
    assert_eq!(one(proxy.addr, request).await.status, 404);
    let a = get(&proxy.url("/v1/healthy"), &[("host", "api.example.com")]).await;
    assert_eq!(a.status, 200, "{a:?}");
}

/// Bad escapes get 400 anywhere in the path; the query goes on verbatim; an escaped Host is 400.
#[tokio::test]
async fn invalid_percent_encoding_is_refused_or_passed_verbatim() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let mut keep = bystander(&proxy).await;
    for path in [
        "/v1/%zz",
        "/v1/%",
        "/v1/a%2",
        "/v1/%%30",
        "/v1/%G1",
        "/v1/%2%2F",
        "/v1/x/%-1",
        "/%zz/v1",
    ] {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
        let r = one(proxy.addr, request.as_bytes()).await;
        assert_eq!(r.status, 400, "{path}: {r:?}");
        assert_eq!(error_code(&r), "bad_request", "{path}");
        assert_eq!(keep.get("/v1/bystander").await, Some(200), "{path}");
    }
    let request = b"GET /v1/q?a=%zz&b=%&c=%E2%82 HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_eq!(one(proxy.addr, request).await.status, 200);
    assert!(seen_paths(&upstream).contains(&"/v1/q?a=%zz&b=%&c=%E2%82".to_string()));
    // RFC 3986 would allow an escape in a host name; http's parser (and so tollgate) does not
    let request = b"GET /v1/pct-host HTTP/1.1\r\nHost: api%2Eexample.com\r\n\r\n";
    let r = one(proxy.addr, request).await;
    assert_eq!((r.status, error_code(&r).as_str()), (400, "bad_request"));
    // and over HTTP/2, where the path arrives in a HEADERS frame
    let mut sender = h2c(proxy.addr).await;
    for path in ["/v1/%zz", "/v1/%2", "/v1/a%"] {
        let req = Request::get(format!("http://x{path}"))
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = sender.send_request(req).await.expect("h2 response");
        assert_eq!(resp.status(), 400, "h2 {path}");
    }
    assert_healthy(&proxy, "after bad escapes").await;
    assert!(!seen_paths(&upstream).iter().any(|p| p.contains("pct-host")));
}

/// Smuggling attempts are refused or framed one way only; the upstream never sees a hidden request.
#[tokio::test]
async fn smuggling_attempts_never_desync_the_upstream() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let mut keep = bystander(&proxy).await;
    /// a request hidden in a body: if it ever reaches the upstream as a request, framing desynced
    const HIDDEN: &str = "GET /v1/smuggled HTTP/1.1\r\nHost: x\r\n\r\n";
    let len = HIDDEN.len();
    let chunked_hidden = format!("0\r\n\r\n{HIDDEN}");
    struct Case {
        name: &'static str,
        request: String,
        statuses: Vec<u16>,
        closed: bool,
        upstream: Vec<&'static str>,
    }
    let case = |name, request: String, statuses: &[u16], closed, upstream: &[&'static str]| Case {
        name,
        request,
        statuses: statuses.to_vec(),
        closed,
        upstream: upstream.to_vec(),
    };
    // bodies stream: a body found malformed midway may already have had its head forwarded
    // (then aborted); that is one request, never a second one
    const STREAMED: &str = "/echo";
    let post = |path: &str, headers: &str, body: &str| {
        format!("POST {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n{body}")
    };
    let cases = [
        // Content-Length and Transfer-Encoding together: hyper drops the length in either
        // order, frames the body by chunked alone and closes the connection after answering
        // (RFC 9112 §6.1), so what follows the last chunk is never read as a request
        case(
            "CL then TE",
            post(
                "/v1/cl-te",
                &format!("Content-Length: {}\r\nTransfer-Encoding: chunked\r\n", len + 5),
                &chunked_hidden,
            ),
            &[200],
            true,
            &["/v1/cl-te"],
        ),
        case(
            "TE then CL",
            post(
                "/v1/te-cl",
                &format!("Transfer-Encoding: chunked\r\nContent-Length: {}\r\n", len + 5),
                &chunked_hidden,
            ),
            &[200],
            true,
            &["/v1/te-cl"],
        ),
        case(
            "two Content-Lengths",
            post(
                "/v1/cl-cl",
                &format!("Content-Length: 0\r\nContent-Length: {len}\r\n"),
                HIDDEN,
            ),
            &[400],
            true,
            &[],
        ),
        case(
            "Content-Length list",
            post(
                "/v1/cl-list",
                &format!("Content-Length: {len}, {len}\r\n"),
                HIDDEN,
            ),
            &[400],
            true,
            &[],
        ),
        case(
            "Content-Length with a sign",
            post("/v1/cl-sign", &format!("Content-Length: +{len}\r\n"), HIDDEN),
            &[400],
            true,
            &[],
        ),
        case(
            "chunked, identity",
            post(
                "/v1/te-identity",
                "Transfer-Encoding: chunked, identity\r\n",
                &chunked_hidden,
            ),
            &[400],
            true,
            &[],
        ),
        case(
            "gzip, chunked",
            post(
                "/v1/te-gzip",
                "Transfer-Encoding: gzip, chunked\r\n",
                &chunked_hidden,
            ),
            &[501],
            true,
            &[],
        ),
        case(
            "chunked twice",
            post(
                "/v1/te-twice",
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                &chunked_hidden,
            ),
            &[501],
            true,
            &[],
        ),
        case(
            "xchunked",
            post(
                "/v1/te-x",
                &format!("Transfer-Encoding: xchunked\r\nContent-Length: {len}\r\n"),
                HIDDEN,
            ),
            &[400],
            true,
            &[],
        ),
        case(
            "obs-folded TE",
            post(
                "/v1/te-fold",
                &format!("Transfer-Encoding:\r\n chunked\r\nContent-Length: {len}\r\n"),
                HIDDEN,
            ),
            &[400],
            true,
            &[],
        ),
        case(
            "space before colon",
            post(
                "/v1/te-space",
                &format!("Transfer-Encoding : chunked\r\nContent-Length: {len}\r\n"),
                HIDDEN,
            ),
            &[400],
            true,
            &[],
        ),
        case(
            "TE on HTTP/1.0",
            format!(
                "POST /v1/te-10 HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{chunked_hidden}"
            ),
            &[400],
            true,
            &[],
        ),
        case(
            "bad chunk size",
            post(
                "/s/echo",
                "Transfer-Encoding: chunked\r\n",
                &format!("zz\r\n{HIDDEN}"),
            ),
            &[400],
            true,
            &[],
        ),
        case(
            "chunk size overflow",
            post(
                "/s/echo",
                "Transfer-Encoding: chunked\r\n",
                &format!("fffffffffffffffffff\r\n{HIDDEN}"),
            ),
            &[400],
            true,
            &[],
        ),
        // a GET whose body is a request: forwarded as one GET with that body
        case(
            "GET with a body",
            format!("GET /v1/get-body HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n{HIDDEN}"),
            &[200],
            false,
            &["/v1/get-body"],
        ),
    ];
    let mut expected = vec!["/v1/bystander".to_string()];
    for c in &cases {
        let (responses, closed) = exchange(proxy.addr, c.request.as_bytes()).await;
        let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
        assert_eq!(statuses, c.statuses, "{}: {responses:?}", c.name);
        assert_eq!(closed, c.closed, "{}: connection closed?", c.name);
        expected.extend(c.upstream.iter().map(|p| p.to_string()));
        // the pooled upstream connection is still in sync: the next request arrives as itself
        let after = format!("/v1/after/{}", c.name.replace(' ', "-"));
        assert_eq!(keep.get(&after).await, Some(200), "{}", c.name);
        expected.push(after);
        let mut seen = seen_paths(&upstream);
        if c.request.contains("POST /s/echo") {
            let streamed = seen.iter().filter(|p| *p == STREAMED).count();
            assert!(streamed <= 1, "{}: {seen:?}", c.name);
            seen.retain(|p| p != STREAMED);
        }
        assert!(!seen.iter().any(|p| p == STREAMED), "{seen:?}");
        assert_eq!(seen, expected, "{}: what the upstream saw", c.name);
        upstream.seen.lock().unwrap().retain(|s| s.uri != STREAMED);
    }
    let seen = upstream.seen();
    let get_body = seen
        .iter()
        .find(|s| s.uri == "/v1/get-body")
        .expect("get-body");
    assert_eq!(
        get_body.headers.get("content-length").map(|v| v.as_bytes()),
        Some(len.to_string().as_bytes())
    );
    for path in ["/v1/cl-te", "/v1/te-cl"] {
        let s = seen.iter().find(|s| s.uri == path).expect(path);
        assert!(s.headers.get("content-length").is_none(), "{path}: {s:?}");
    }
    assert_healthy(&proxy, "after smuggling attempts").await;
}

// ---------------------------------------------------------------------------------------------
// 1b. HTTP/2 misuse (h2c by prior knowledge, raw frames)

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK block for `GET http://x<path>` without Huffman or indexing (RFC 7541 §6.2.2).
fn get_block(path: &str) -> Vec<u8> {
    // :method GET (static 2), :scheme http (static 6)
    let mut b = vec![0x82, 0x86];
    // :path (static name 4), literal value
    b.push(0x04);
    b.push(path.len() as u8);
    b.extend_from_slice(path.as_bytes());
    // :authority (static name 1) "x"
    b.extend_from_slice(&[0x01, 0x01, b'x']);
    b
}

/// Frames read off a raw HTTP/2 connection until it closes or `limit` passes: (type, stream,
/// first 4 payload bytes), and whether it closed.
async fn read_frames(stream: &mut TcpStream, limit: Duration) -> (Vec<(u8, u32, u32)>, bool) {
    let deadline = Instant::now() + limit;
    let mut buf = Vec::new();
    let mut frames = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        while buf.len() >= 9 {
            let len = (buf[0] as usize) << 16 | (buf[1] as usize) << 8 | buf[2] as usize;
            if buf.len() < 9 + len {
                break;
            }
            let sid = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
            let first = |i: usize| buf.get(9 + i).copied().unwrap_or(0) as u32;
            let word = first(0) << 24 | first(1) << 16 | first(2) << 8 | first(3);
            // for GOAWAY the error code is the second word
            let word = if buf[3] == GOAWAY && len >= 8 {
                u32::from_be_bytes([buf[13], buf[14], buf[15], buf[16]])
            } else {
                word
            };
            frames.push((buf[3], sid, word));
            buf.drain(..9 + len);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (frames, false);
        }
        match tokio::time::timeout(left, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (frames, true),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return (frames, false),
        }
    }
}

/// HTTP/2 protocol violations after the preface end in GOAWAY and a close; others are served.
#[tokio::test]
async fn h2_garbage_after_preface_gets_goaway() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("oversized frame", vec![0xff; 64]),
        ("DATA on stream 0", frame(DATA, 0, 0, b"hello")),
        (
            "bad HPACK",
            frame(HEADERS, END_HEADERS | END_STREAM, 1, &[0xff; 16]),
        ),
        (
            "zero WINDOW_UPDATE",
            frame(WINDOW_UPDATE, 0, 0, &[0, 0, 0, 0]),
        ),
        ("short SETTINGS", frame(SETTINGS, 0, 0, &[0, 1, 0])),
        (
            "stray CONTINUATION",
            frame(CONTINUATION, END_HEADERS, 1, &[0x82]),
        ),
        (
            "even stream id",
            frame(HEADERS, 5, 2, &get_block("/v1/even")),
        ),
        (
            "HTTP/1 after preface",
            b"GET /v1/x HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ),
    ];
    for (name, garbage) in cases {
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(SETTINGS, 0, 0, &[]));
        bytes.extend(garbage);
        s.write_all(&bytes).await.unwrap();
        let (frames, closed) = read_frames(&mut s, Duration::from_secs(5)).await;
        assert!(closed, "{name}: connection still open; frames {frames:?}");
        assert!(
            frames.iter().any(|f| f.0 == GOAWAY && f.2 != 0),
            "{name}: no GOAWAY with an error; frames {frames:?}"
        );
        assert_healthy(&proxy, name).await;
        h2_healthy(&proxy).await;
    }
    assert!(!seen_paths(&upstream).iter().any(|p| p == "/v1/even"));
}

/// The protocol is told from a connection's first bytes however they arrive: an h2c preface
/// split across writes, the whole preface with the first frames, and an HTTP/1 request sent a
/// byte at first are all served (and a request head arriving whole in one read is still
/// bounded: see `oversized_heads_get_431`).
#[tokio::test]
async fn protocol_is_told_however_the_first_bytes_arrive() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let mut request = PREFACE.to_vec();
    request.extend(frame(SETTINGS, 0, 0, &[]));
    request.extend(frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &get_block("/v1/h2-split"),
    ));
    for (name, split) in [("preface split", 5), ("preface whole", request.len())] {
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        s.write_all(&request[..split]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        s.write_all(&request[split..]).await.unwrap();
        let (frames, _) = read_frames(&mut s, Duration::from_millis(1500)).await;
        assert!(
            frames.iter().any(|f| f.0 == HEADERS && f.1 == 1),
            "{name}: no response HEADERS on stream 1; frames {frames:?}"
        );
    }
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(b"G").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.write_all(b"ET /v1/h1-split HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer))
        .await
        .expect("HTTP/1 answer")
        .unwrap();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let seen = seen_paths(&upstream);
    assert_eq!(
        seen.iter().filter(|p| p.as_str() == "/v1/h2-split").count(),
        2,
        "{seen:?}"
    );
    assert!(seen.iter().any(|p| p == "/v1/h1-split"), "{seen:?}");
}

/// A well-behaved HTTP/2 client is served (a fresh h2c connection).
async fn h2_healthy(proxy: &Proxy) {
    let mut sender = h2c(proxy.addr).await;
    let req = Request::get("http://x/v1/h2-healthy")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req))
        .await
        .expect("h2 answer within 5 s")
        .expect("h2 response");
    assert_eq!(resp.status(), 200);
}

/// A rapid-reset flood (HEADERS + RST_STREAM, 5000 times) gets GOAWAY and barely reaches upstream.
#[tokio::test]
async fn h2_rapid_reset_flood_is_cut_off() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(SETTINGS, 0, 0, &[]));
    const FLOOD: u32 = 5000;
    for i in 0..FLOOD {
        let id = 2 * i + 1;
        bytes.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            id,
            &get_block("/v1/rr"),
        ));
        bytes.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
    }
    // the server may close mid-write: that is the point
    let _ = s.write_all(&bytes).await;
    let (frames, closed) = read_frames(&mut s, Duration::from_secs(5)).await;
    let goaway = frames.iter().find(|f| f.0 == GOAWAY);
    assert!(closed, "flooding connection still open");
    assert!(goaway.is_some_and(|g| g.2 != 0), "no GOAWAY with an error");
    assert_healthy(&proxy, "after rapid reset").await;
    h2_healthy(&proxy).await;
    let reached = seen_paths(&upstream)
        .iter()
        .filter(|p| *p == "/v1/rr")
        .count();
    println!("rapid reset: {reached} of {FLOOD} reset streams reached the upstream");
    assert!(
        reached < FLOOD as usize / 10,
        "{reached} reached the upstream"
    );
}

/// Streams past the h2 concurrency limit are refused one by one; others are served meanwhile.
#[tokio::test]
async fn h2_too_many_streams_are_refused() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream.url(), "")).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(SETTINGS, 0, 0, &[]));
    const STREAMS: u32 = 400;
    for i in 0..STREAMS {
        let block = get_block("/s/slow/1500");
        bytes.extend(frame(HEADERS, END_HEADERS | END_STREAM, 2 * i + 1, &block));
    }
    let _ = s.write_all(&bytes).await;
    let started = Instant::now();
    assert_healthy(&proxy, "while streams are held").await;
    let (frames, _) = read_frames(&mut s, Duration::from_secs(1)).await;
    let in_flight = upstream.seen().len();
    let refused = frames.iter().filter(|f| f.0 == RST_STREAM).count();
    let goaway = frames.iter().any(|f| f.0 == GOAWAY);
    println!("too many streams: {refused} refused, {in_flight} at the upstream, goaway {goaway}");
    assert!(
        in_flight <= 201,
        "{in_flight} requests in flight at the upstream"
    );
    assert!(
        refused >= (STREAMS as usize - 200) || goaway,
        "{refused} streams refused"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    h2_healthy(&proxy).await;
}

// ---------------------------------------------------------------------------------------------
// 2. slow and idle clients

/// Sends `prefix` whole, then trickles `bytes` one every 100 ms until the server closes; the
/// time from connect to close, or `None` if it stayed open for `limit`.
async fn trickle_until_closed(
    addr: SocketAddr,
    prefix: &[u8],
    bytes: &[u8],
    limit: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(prefix).await.unwrap();
    let mut sink = [0u8; 4096];
    for byte in bytes.iter().cycle() {
        if started.elapsed() > limit {
            return None;
        }
        if s.write_all(&[*byte]).await.is_err() {
            return Some(started.elapsed());
        }
        match tokio::time::timeout(Duration::from_millis(100), s.read(&mut sink)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            // something was answered (SETTINGS, a GOAWAY): keep reading until the close
            Ok(Ok(_)) | Err(_) => {}
        }
    }
    None
}

/// Trickled heads (HTTP/1.1, h2 preface, h2 HEADERS, a 2nd head) and silent sockets: cut at 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_is_cut_off_after_client_header() {
    let upstream = Upstream::start().await;
    let top = "timeouts:\n  client_header: 1s\n  idle: 30s";
    let proxy = Proxy::start(&config(&upstream.url(), top)).await;
    let addr = proxy.addr;
    let limit = Duration::from_secs(6);
    let mut head = b"GET /v1/slow HTTP/1.1\r\nHost: x\r\nX-Slow: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 200));
    let mut h2_start = PREFACE.to_vec();
    h2_start.extend(frame(SETTINGS, 0, 0, &[]));
    let mut h2_headers = frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &get_block("/v1/slow-h2"),
    );
    // the frame's 9-byte header announces more payload than ever comes
    h2_headers[2] = 200;
    h2_headers.extend(std::iter::repeat_n(0x40u8, 200));
    let trickles: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
        ("http/1.1 head", Vec::new(), head.clone()),
        ("h2 preface", Vec::new(), PREFACE.to_vec()),
        ("h2 HEADERS frame", h2_start.clone(), h2_headers),
    ];
    let mut tasks = Vec::new();
    for (name, prefix, bytes) in trickles {
        let task =
            tokio::spawn(async move { trickle_until_closed(addr, &prefix, &bytes, limit).await });
        tasks.push((name, task));
    }
    let h2_silent = tokio::spawn(async move {
        let started = Instant::now();
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&h2_start).await.unwrap();
        let (_, closed) = read_frames(&mut s, limit).await;
        closed.then(|| started.elapsed())
    });
    tasks.push(("h2 silent after preface", h2_silent));
    let silent = tokio::spawn(async move {
        let started = Instant::now();
        let mut conn = RawConn::open(addr).await;
        conn.closes_within(limit).await.then(|| started.elapsed())
    });
    tasks.push(("silent", silent));
    // a kept-alive connection that trickles its second head: cut about client_header after
    // that head began, although the connection's idle deadline is 30 s away
    let head2 = head.clone();
    let second = tokio::spawn(async move {
        let mut conn = RawConn::open(addr).await;
        assert_eq!(conn.get("/v1/first").await, Some(200));
        let started = Instant::now();
        for byte in head2.iter().cycle() {
            if started.elapsed() > limit || conn.stream.write_all(&[*byte]).await.is_err() {
                break;
            }
            if !conn.fill(Duration::from_millis(100)).await && conn.closed {
                break;
            }
        }
        conn.closed.then(|| started.elapsed())
    });
    tasks.push(("second head on a kept-alive connection", second));
    // 50 more slowloris connections at once
    let crowd: Vec<_> = (0..50)
        .map(|_| {
            let head = head.clone();
            tokio::spawn(async move { trickle_until_closed(addr, &[], &head, limit).await })
        })
        .collect();
    // meanwhile a kept-alive client requests every 200 ms, and fresh clients are served
    let mut keep = RawConn::open(addr).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2600) {
        assert_eq!(keep.get("/v1/steady").await, Some(200), "steady client");
        assert_healthy(&proxy, "during slowloris").await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (name, task) in tasks {
        let took = task.await.unwrap();
        println!("slowloris {name}: closed after {took:?}");
        let took = took.unwrap_or_else(|| panic!("{name}: still open after {limit:?}"));
        assert!(
            took >= Duration::from_millis(900) && took <= Duration::from_millis(2500),
            "{name}: closed after {took:?}, expected about 1 s"
        );
    }
    for task in crowd {
        let took = task.await.unwrap().expect("crowd slowloris still open");
        assert!(
            took <= Duration::from_millis(3000),
            "crowd: closed after {took:?}"
        );
    }
    assert!(!seen_paths(&upstream)
        .iter()
        .any(|p| p.starts_with("/v1/slow")));
}

/// Keep-alive waits end at `idle` (not client_header), for HTTP/1.1 and h2; in-flight ones never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_idle() {
    let upstream = Upstream::start().await;
    let top = "timeouts:\n  client_header: 500ms\n  idle: 2s";
    let proxy = Proxy::start(&config(&upstream.url(), top)).await;
    let addr = proxy.addr;
    // a request longer than idle
    let long = tokio::spawn(async move {
        let mut conn = RawConn::open(addr).await;
        conn.send(b"GET /s/slow/3000 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        let deadline = Instant::now() + Duration::from_secs(6);
        loop {
            if let Some(r) = parse_response(&mut conn.buf) {
                return Some(r);
            }
            if Instant::now() > deadline || !conn.fill(Duration::from_secs(1)).await && conn.closed
            {
                return None;
            }
        }
    });
    // HTTP/2: one request, then idle
    let h2 = tokio::spawn(async move {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .expect("h2c handshake");
        let conn = tokio::spawn(conn);
        let req = Request::get("http://x/v1/h2-idle")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = sender.send_request(req).await.expect("h2 response");
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.expect("h2 body");
        let idle_from = Instant::now();
        tokio::time::timeout(Duration::from_secs(6), conn)
            .await
            .ok()
            .map(|_| idle_from.elapsed())
    });
    // HTTP/2 with control frames (PING, WINDOW_UPDATE) after its response: not a new head,
    // so only idle applies
    let h2_frames = tokio::spawn(async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(SETTINGS, 0, 0, &[]));
        bytes.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            1,
            &get_block("/v1/h2-frames"),
        ));
        s.write_all(&bytes).await.unwrap();
        let idle_from = Instant::now();
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            s.write_all(&frame(PING, 0, 0, &[7; 8])).await.unwrap();
            s.write_all(&frame(WINDOW_UPDATE, 0, 0, &1000u32.to_be_bytes()))
                .await
                .unwrap();
        }
        let (frames, closed) = read_frames(&mut s, Duration::from_secs(6)).await;
        let goaway = frames.iter().any(|f| f.0 == GOAWAY);
        (closed && goaway).then(|| idle_from.elapsed())
    });
    let mut conn = RawConn::open(addr).await;
    assert_eq!(conn.get("/v1/first").await, Some(200));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        conn.get("/v1/after-pause").await,
        Some(200),
        "a keep-alive pause longer than client_header but shorter than idle"
    );
    let idle_from = Instant::now();
    assert!(
        conn.closes_within(Duration::from_secs(6)).await,
        "idle connection never closed"
    );
    let took = idle_from.elapsed();
    println!("http/1.1 idle connection closed after {took:?}");
    assert!(
        took >= Duration::from_millis(1800) && took <= Duration::from_millis(3500),
        "idle connection closed after {took:?}, expected about 2 s"
    );
    let r = long.await.unwrap().expect("long request cut off");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"slow ok"[..]));
    let took = h2.await.unwrap().expect("idle h2 connection never closed");
    println!("h2 idle connection closed after {took:?}");
    assert!(
        took >= Duration::from_millis(1800) && took <= Duration::from_millis(3500),
        "idle h2 connection closed after {took:?}"
    );
    let took = h2_frames
        .await
        .unwrap()
        .expect("h2 connection with PINGs: no GOAWAY and close");
    println!("h2 idle connection with PINGs closed after {took:?}");
    assert!(
        took >= Duration::from_millis(1800) && took <= Duration::from_millis(3500),
        "idle h2 connection with PINGs closed after {took:?}"
    );
    assert!(seen_paths(&upstream).contains(&"/v1/h2-frames".to_string()));
    assert_healthy(&proxy, "after idle").await;
}

/// With `idle` shorter than `client_header`, a keep-alive wait still ends at `idle` (as nginx's
/// `keepalive_timeout`), on a connection's first request and on later ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_shorter_than_client_header_ends_keep_alive_waits() {
    let upstream = Upstream::start().await;
    let top = "timeouts:\n  client_header: 5s\n  idle: 500ms";
    let proxy = Proxy::start(&config(&upstream.url(), top)).await;
    for requests in [1, 3] {
        let mut conn = RawConn::open(proxy.addr).await;
        for i in 0..requests {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(conn.get(&format!("/v1/short-idle/{i}")).await, Some(200));
        }
        let idle_from = Instant::now();
        assert!(
            conn.closes_within(Duration::from_secs(8)).await,
            "idle connection never closed"
        );
        let took = idle_from.elapsed();
        println!("after {requests} request(s): closed after {took:?}");
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_millis(3000),
            "after {requests} request(s) the connection closed after {took:?}: expected about \
             idle (500 ms), well before client_header (5 s)"
        );
    }
    assert_healthy(&proxy, "after idle").await;
}

/// A client that stops reading its response is cut off once it has taken no bytes for `send`
/// (as nginx's `send_timeout`), although its request is still in flight; one that reads slowly,
/// pausing for less than `send`, gets its whole response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stop_reading_are_cut_off_after_send() {
    let upstream = Upstream::start().await;
    let top = "timeouts:\n  send: 2s\n  idle: 30s";
    let proxy = Proxy::start(&config(&upstream.url(), top)).await;
    let addr = proxy.addr;
    // far more than the sockets between here and the upstream can hold
    const HUGE: u64 = 8 << 30;
    const CAP: u64 = 256 << 20;
    let stalled = tokio::spawn(async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let head = format!("GET /s/bytes/{HUGE} HTTP/1.1\r\nHost: x\r\n\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        // reads nothing for more than twice `send`
        tokio::time::sleep(Duration::from_secs(5)).await;
        // then takes what the sockets held, and must find the end of the connection there
        let mut buf = vec![0u8; 1 << 20];
        let mut first = Vec::new();
        let mut total = 0u64;
        while total < CAP {
            match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return Ok((first, total)),
                Ok(Ok(n)) => {
                    if first.len() < 12 {
                        first.extend_from_slice(&buf[..n.min(12)]);
                    }
                    total += n as u64;
                }
                Err(_) => return Err(format!("no end and no bytes for 10 s after {total}")),
            }
        }
        Err(format!("{total} bytes and still open: never cut off"))
    });
    // reads 12 MiB a quarter of a MiB at a time, pausing 50 ms between (a full socket is
    // writable again once a third of its buffer has drained: ~1.3 MiB of a 4 MiB one)
    let slow = tokio::spawn(async move {
        const BODY: u64 = 12 << 20;
        let mut s = TcpStream::connect(addr).await.unwrap();
        // (the connection ends with the response: read to its end)
        let head = format!("GET /s/bytes/{BODY} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let mut total = 0u64;
        let mut since_pause = 0;
        loop {
            match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return total,
                Ok(Ok(n)) => {
                    total += n as u64;
                    since_pause += n;
                }
            }
            if since_pause >= 256 << 10 {
                since_pause = 0;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let stalled = stalled.await.unwrap();
    let (first, total) = stalled.unwrap_or_else(|e| panic!("stalled client: {e}"));
    println!("stalled client: {total} bytes held in the sockets, then the end");
    assert!(
        first.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&first)
    );
    let total = slow.await.unwrap();
    assert!(
        total >= 12 << 20,
        "a client reading slowly got {total} bytes of its 12 MiB"
    );
    assert_healthy(&proxy, "after a client stopped reading").await;
}

/// Resident set size of this process, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

/// The soft limit on open files of this process.
fn open_files_limit() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}

/// Runs the ignored test `name` alone in a fresh process (this test binary), so that its RSS
/// figures see no other test's memory; returns its output.
fn run_alone(name: &str) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .output()
        .expect("run the test binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name} failed:\n{text}");
    assert!(text.contains("1 passed"), "{name} did not run:\n{text}");
    text
}

/// 3000 idle connections cost well under 50 KB each and a new client is still served (run alone).
#[test]
fn thousands_of_idle_connections_are_cheap() {
    // RSS in a process of its own: other tests running alongside would blur the figure
    let out = run_alone("idle_connection_memory");
    for line in out.lines().filter(|l| l.contains("idle connections:")) {
        println!("{line}");
    }
}

/// The measurement behind `thousands_of_idle_connections_are_cheap`, meant to run alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run alone by thousands_of_idle_connections_are_cheap"]
async fn idle_connection_memory() {
    let upstream = Upstream::start().await;
    let top = "timeouts:\n  client_header: 60s\n  idle: 60s";
    let proxy = Proxy::start(&config(&upstream.url(), top)).await;
    // two descriptors per connection (both ends live in this process), plus slack
    let each = ((open_files_limit().saturating_sub(300)) / 4).min(1500);
    assert!(
        each >= 200,
        "open-file limit too low: {}",
        open_files_limit()
    );
    // warm up: pools, allocator arenas, the runtime's timer wheel
    let mut warm = Vec::new();
    for _ in 0..50 {
        let mut c = RawConn::open(proxy.addr).await;
        assert_eq!(c.get("/v1/warm").await, Some(200));
        warm.push(c);
    }
    drop(warm);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let before = rss();
    let used = Arc::new(AtomicUsize::new(0));
    let mut after_request = Vec::with_capacity(each);
    let mut batch = Vec::new();
    for _ in 0..each {
        let addr = proxy.addr;
        let used = used.clone();
        batch.push(tokio::spawn(async move {
            let mut c = RawConn::open(addr).await;
            let status = c.get("/v1/once").await;
            used.fetch_add(1, Ordering::Relaxed);
            c.buf = Vec::new();
            (c, status)
        }));
        if batch.len() == 100 {
            for t in batch.drain(..) {
                let (c, status) = t.await.unwrap();
                assert_eq!(status, Some(200));
                after_request.push(c);
            }
        }
    }
    for t in batch.drain(..) {
        let (c, status) = t.await.unwrap();
        assert_eq!(status, Some(200));
        after_request.push(c);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let middle = rss();
    let mut silent = Vec::with_capacity(each);
    for _ in 0..each {
        silent.push(TcpStream::connect(proxy.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss();
    let per_used = middle.saturating_sub(before) / each as u64;
    let per_silent = after.saturating_sub(middle) / each as u64;
    println!(
        "idle connections: {each} after a request cost {per_used} B each, {each} silent cost \
         {per_silent} B each (RSS {} -> {} -> {} MiB)",
        before >> 20,
        middle >> 20,
        after >> 20
    );
    assert!(per_used < 50 * 1024, "{per_used} B per idle connection");
    assert!(
        per_silent < 50 * 1024,
        "{per_silent} B per silent connection"
    );

    // a normal client is served while they are open, and the idle ones are still usable
    let started = Instant::now();
    assert_healthy(&proxy, "with thousands of idle connections").await;
    println!(
        "idle connections: a new client was served in {:?} with {} open",
        started.elapsed(),
        2 * each
    );
    for c in after_request.iter_mut().step_by(each / 20) {
        assert_eq!(
            c.get("/v1/again").await,
            Some(200),
            "idle connection dropped"
        );
    }
    let mut probe = [0u8; 1];
    for s in silent.iter_mut().step_by(each / 20) {
        let still_open = tokio::time::timeout(Duration::from_millis(20), s.read(&mut probe))
            .await
            .is_err();
        assert!(still_open, "a silent connection was closed early");
    }
}

/// 200 000 distinct keys into a memory store with `max_keys` 10 000 leave it at most 10 000
/// (a million take 20 s in a debug build: `reliability/keyflood` sends a million through the
/// release proxy, on both stores, and watches its RSS and Redis's keys).
#[tokio::test]
async fn memory_store_stays_bounded_under_a_key_flood() {
    use tollgate::limit::{Algorithm, Bucket, Rate};
    let store = tollgate::store::MemoryStore::new(NonZeroUsize::new(10_000).unwrap());
    let bucket = Bucket::new(
        Rate::new(1.0, Duration::from_secs(3600)).unwrap(),
        std::num::NonZeroU32::new(1).unwrap(),
        std::num::NonZeroU32::new(1).unwrap(),
    )
    .unwrap();
    let alg = Algorithm::TokenBucket(bucket);
    let started = Instant::now();
    for i in 0..200_000u32 {
        let d = store.decide(&format!("tollgate:r:l:key-{i}"), &alg, None);
        assert!(d.allowed, "key {i} is new");
        assert!(
            store.len() <= 10_000 || i % 1000 != 0,
            "{} keys",
            store.len()
        );
    }
    let held = store.len();
    println!(
        "memory store: 200000 keys into max_keys 10000 -> {held} held ({:?})",
        started.elapsed()
    );
    assert!(held <= 10_000, "{held} keys held");
    assert!(held >= 9_000, "only {held} keys held: eviction too eager");
    // the newest key is still limited; the oldest was evicted and starts afresh
    assert!(!store.decide("tollgate:r:l:key-199999", &alg, None).allowed);
    assert!(store.decide("tollgate:r:l:key-0", &alg, None).allowed);
}

/// Through the proxy, a key flood past `max_keys` evicts the oldest keys and keeps the recent ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_key_flood_evicts_oldest_keys_from_memory() {
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .top("store:\n  backend: memory\n  max_keys: 500")
        .route(
            "api",
            "/v1",
            "limits:\n  - name: per-key\n    algorithm: token_bucket\n    key: header:x-api-key\n    \
             rate: 1/h\n    burst: 1",
        )
        .build();
    let proxy = Proxy::start(&yaml).await;
    let first = get(&proxy.url("/v1/k"), &[("x-api-key", "first")]).await;
    assert_eq!(first.status, 200);
    let again = get(&proxy.url("/v1/k"), &[("x-api-key", "first")]).await;
    assert_eq!(again.status, 429, "burst 1 then denied");
    flood_keys(&proxy, 1500, "flood").await;
    let last = get(&proxy.url("/v1/k"), &[("x-api-key", "flood-1499")]).await;
    assert_eq!(last.status, 429, "a recent key keeps its state");
    let first = get(&proxy.url("/v1/k"), &[("x-api-key", "first")]).await;
    assert_eq!(first.status, 200, "the oldest key was evicted");
    assert_healthy(&proxy, "after key flood").await;
}

/// Sends one request for each of `count` distinct API keys `PREFIX-i`, 32 at a time; all 200.
async fn flood_keys(proxy: &Proxy, count: usize, prefix: &str) {
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..32)
        .map(|_| {
            let next = next.clone();
            let url = proxy.url("/v1/k");
            let prefix = prefix.to_string();
            tokio::spawn(async move {
                let client = common::http_client();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        return;
                    }
                    let req = Request::get(&url)
                        .header("x-api-key", format!("{prefix}-{i}"))
                        .body(
                            http_body_util::Full::new(Bytes::new())
                                .map_err(|never| match never {})
                                .boxed(),
                        )
                        .unwrap();
                    let resp = client.request(req).await.expect("flood request");
                    assert_eq!(resp.status(), 200, "key {i}");
                    resp.into_body().collect().await.expect("body");
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
}

/// Every Redis key a flood of distinct API keys creates expires, within its algorithm's window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keys_from_a_key_flood_all_expire() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .redis(&redis, "timeout: 1s")
        .route(
            "api",
            "/v1",
            "limits:
  - {name: tb, algorithm: token_bucket, key: header:x-api-key, rate: 10/s, burst: 20}
  - {name: lb, algorithm: leaky_bucket, key: header:x-api-key, rate: 100/s, max_delay: 1s}
  - {name: fw, algorithm: fixed_window, key: header:x-api-key, limit: 100, window: 1h}
  - {name: sw, algorithm: sliding_window, key: header:x-api-key, limit: 100, window: 1m}
  - {name: swc, algorithm: sliding_window_counter, key: header:x-api-key, limit: 100, window: 1m}",
        )
        .build();
    let proxy = Proxy::start(&yaml).await;
    const KEYS: usize = 2000;
    // (the hourly fixed window's keys all end with the hour: not under the flood and count)
    clear_of_hour_end(Duration::from_secs(60)).await;
    flood_keys(&proxy, KEYS, "flood").await;
    // one pass over each limit's keys on the server: how many, how many without an expiry,
    // and the longest time to live
    let script = "local n, none, most = 0, 0, 0 \
        for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
          n = n + 1 \
          local t = redis.call('PTTL', k) \
          if t < 0 then none = none + 1 end \
          if t > most then most = t end \
        end \
        return {n, none, most}";
    // (limit, whether its keys outlive the flood, the longest TTL its window allows)
    let limits = [
        ("tb", false, 2_000),
        ("lb", false, 1_000),
        ("fw", true, 3_600_000),
        ("sw", true, 60_000),
        ("swc", true, 120_000),
    ];
    for (limit, lasting, longest) in limits {
        let pattern = format!("tollgate:api:{limit}:*");
        let out = redis.cli(&["EVAL", script, "0", &pattern]);
        let figures: Vec<i64> = out.lines().map(|l| l.trim().parse().unwrap()).collect();
        let (n, none, most) = (figures[0], figures[1], figures[2]);
        println!("redis flood: {limit}: {n} keys, {none} without expiry, longest PTTL {most} ms");
        assert_eq!(none, 0, "{limit}: keys without expiry");
        assert!(most <= longest, "{limit}: a TTL of {most} ms");
        if lasting {
            assert_eq!(n, KEYS as i64, "{limit}: one key per client");
        }
    }
    // the buckets' keys live only until they would be full (empty) again: soon all gone
    for limit in ["tb", "lb"] {
        let pattern = format!("tollgate:api:{limit}:*");
        eventually(Duration::from_secs(5), || async {
            redis.cli(&["KEYS", &pattern]).is_empty()
        })
        .await;
    }
    assert_healthy(&proxy, "after redis key flood").await;
}

/// X-Forwarded-For never sets the identity from an untrusted peer; behind a trusted one, rightly.
#[tokio::test]
async fn x_forwarded_for_cannot_spoof_identity() {
    // the identity is read back from the limiter key each request creates in Redis
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let yaml = |trusted: &str| {
        Yaml::to(&[upstream.url()])
            .top(&format!("trusted_proxies: [{trusted}]"))
            .redis(&redis, "timeout: 1s")
            .route(
                "xff",
                "/v1",
                "limits:\n  - {name: per-ip, algorithm: token_bucket, key: ip, rate: 1/h, burst: 100}",
            )
            .build()
    };
    let untrusted = Proxy::start(&yaml("10.0.0.0/8")).await;
    let trusted = Proxy::start(&yaml("127.0.0.0/8, 10.0.0.0/8")).await;
    let huge: String = (0..4000)
        .map(|i| format!("198.51.{}.{}, ", i / 250, i % 250))
        .collect::<String>()
        + "203.0.113.8";
    let huge_trusted_tail = format!("{huge}, 10.1.2.3, 127.0.0.1");
    // (XFF lines, identity behind a trusted proxy)
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec![], "127.0.0.1"),
        (vec!["203.0.113.7"], "203.0.113.7"),
        (vec!["198.51.100.1, 203.0.113.7"], "203.0.113.7"),
        (vec!["203.0.113.7, 10.0.0.5"], "203.0.113.7"),
        (vec!["198.51.100.1", "203.0.113.7"], "203.0.113.7"),
        (vec![", ,,203.0.113.7,,"], "203.0.113.7"),
        (vec!["unknown, 203.0.113.7"], "203.0.113.7"),
        (vec!["203.0.113.7, unknown"], "127.0.0.1"),
        (vec!["203.0.113.7, garbage, 10.0.0.5"], "10.0.0.5"),
        (vec!["127.0.0.1"], "127.0.0.1"),
        (vec!["::ffff:203.0.113.9"], "203.0.113.9"),
        (vec!["[2001:DB8::1]:443"], "2001:db8::1"),
        (vec!["2001:db8:0:0:0:0:0:1"], "2001:db8::1"),
        (vec!["203.0.113.7:8080"], "203.0.113.7"),
        (vec!["fe80::1%eth0"], "127.0.0.1"),
        (vec!["203.0.113.7%00"], "127.0.0.1"),
        (vec!["1.2.3"], "127.0.0.1"),
        (vec!["01.02.03.04"], "127.0.0.1"),
        (vec!["999.1.1.1"], "127.0.0.1"),
        (vec!["0x7f.0.0.1"], "127.0.0.1"),
        (vec!["203.0.113.7 198.51.100.1"], "127.0.0.1"),
        (vec!["[203.0.113.7]"], "127.0.0.1"),
        (vec!["203.0.113.7|x"], "127.0.0.1"),
        (vec![huge.as_str()], "203.0.113.8"),
        (vec![huge_trusted_tail.as_str()], "203.0.113.8"),
    ];
    for (lines, behind_trusted) in &cases {
        for (proxy, expected) in [(&untrusted, "127.0.0.1"), (&trusted, *behind_trusted)] {
            redis.cli(&["FLUSHALL"]);
            let mut request = b"GET /v1/who HTTP/1.1\r\nHost: x\r\n".to_vec();
            for line in lines {
                request.extend_from_slice(format!("X-Forwarded-For: {line}\r\n").as_bytes());
            }
            request.extend_from_slice(b"\r\n");
            let what = format!("{:.60?} via {}", lines, proxy.addr);
            assert_eq!(one(proxy.addr, &request).await.status, 200, "{what}");
            let keys = redis.cli(&["KEYS", "tollgate:xff:per-ip:*"]);
            assert_eq!(keys, format!("tollgate:xff:per-ip:{expected}"), "{what}");
        }
    }
    assert_healthy(&untrusted, "after XFF").await;
    assert_healthy(&trusted, "after XFF").await;
}

/// Path tricks reach no route they do not normalise to; the upstream gets the normalised path.
#[tokio::test]
async fn path_tricks_cannot_change_the_route() {
    let public = Upstream::start().await;
    let admin = Upstream::start().await;
    let yaml = Yaml::to(&[public.url()])
        .also_upstream("admin", &[admin.url()], "")
        .route_matching(
            "admin",
            "{path_prefix: /admin, headers: {x-admin-token: s3cret}}",
            "admin",
            "",
        )
        .route("public", "/public", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    // (target, status, path the public upstream receives)
    let cases: &[(&str, u16, Option<&str>)] = &[
        ("/public/../admin", 404, None),
        ("/public/%2e%2e/admin", 404, None),
        ("/public/%2E%2E/admin/x", 404, None),
        ("/public/.%2e/admin", 404, None),
        ("/public/./../admin", 404, None),
        ("/public;/../admin", 404, None),
        ("/public/x/../../admin", 404, None),
        ("/public/../../../../admin", 404, None),
        // encoded slashes and backslashes are refused; `..;` is `..`
        ("/public/..%2fadmin", 400, None),
        ("/public/..%2Fadmin", 400, None),
        ("/public/..;/admin", 404, None),
        ("/public/..;x/admin", 404, None),
        ("/public%2f../admin", 400, None),
        ("/public\\..\\admin", 400, None),
        ("/public/\\..\\admin", 400, None),
        ("/public/%5c..%5cadmin", 400, None),
        ("/public/%00/x", 400, None),
        ("/public/%2500", 200, Some("/public/%2500")),
        ("/public//x", 200, Some("/public/x")),
        ("/public/./x/../y", 200, Some("/public/y")),
        ("/admin/../public/x", 200, Some("/public/x")),
        ("/%70ublic/x", 200, Some("/public/x")),
        ("/public/x?y=/../admin", 200, Some("/public/x?y=/../admin")),
        ("/PUBLIC/x", 404, None),
        ("/admin", 404, None),
        ("/admin%2f", 400, None),
        ("/public/%zz", 400, None),
        ("*", 400, None),
    ];
    for (target, status, forwarded) in cases {
        let before = public.seen().len();
        let request = format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n");
        let r = one(proxy.addr, request.as_bytes()).await;
        assert_eq!(r.status, *status, "{target}: {r:?}");
        let seen = public.seen();
        match forwarded {
            Some(path) => {
                assert_eq!(seen.len(), before + 1, "{target}");
                assert_eq!(seen[before].uri, *path, "{target}");
            }
            None => assert_eq!(seen.len(), before, "{target} reached the public upstream"),
        }
        assert!(
            admin.seen().is_empty(),
            "{target} reached the admin upstream"
        );
    }
    // the guarded route works with its header: the test can tell a reached admin apart
    let a = get(&proxy.url("/admin/x"), &[("x-admin-token", "s3cret")]).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(seen_paths(&admin), ["/admin/x"]);
}

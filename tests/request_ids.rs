//! `X-Request-Id` end to end: kept when usable, replaced when not, made when absent; the same id
//! at the upstream and in the response, the proxy's own answers included, over HTTP/1.1 and
//! HTTP/2. A real upstream and tollgate in process, on the memory store.

mod common;
common::both_http1_clients!();

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};

use common::{get, send, Answer, Proxy, Upstream, Yaml};

/// Route `api` on `/v1` to `upstream`; `/limited` allows one request an hour; `/gone` goes to
/// a target that refuses connections.
fn config(upstream: &Upstream, dead: &common::DeadPort) -> String {
    let gone = [format!("http://127.0.0.1:{}", dead.port())];
    Yaml::to(&[upstream.url()])
        .also_upstream("gone", &gone, "")
        .route("api", "/v1", "")
        .route(
            "limited",
            "/limited",
            "limits:\n  - {name: once, algorithm: token_bucket, rate: 1/h, burst: 1}",
        )
        .route_to("gone", "/gone", "gone", "")
        .build()
}

/// The response's id, which must be there.
fn id(a: &Answer) -> &str {
    a.header("x-request-id")
        .unwrap_or_else(|| panic!("no X-Request-Id: {a:?}"))
}

/// The id the upstream received with its `n`th request.
fn upstream_id(upstream: &Upstream, n: usize) -> String {
    let seen = upstream.seen();
    let ids: Vec<&str> = seen[n]
        .headers
        .get_all("x-request-id")
        .iter()
        .map(|v| v.to_str().expect("ASCII"))
        .collect();
    match ids.as_slice() {
        [one] => one.to_string(),
        other => panic!("the upstream got {other:?}"),
    }
}

/// Whether `id` is a version 4 UUID in its text form.
fn is_uuid_v4(id: &str) -> bool {
    let groups: Vec<&str> = id.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
        && groups[2].starts_with('4')
        && groups[3].starts_with(['8', '9', 'a', 'b'])
}

/// A usable id (visible ASCII, at most 200 bytes) reaches the upstream and comes back as sent.
#[tokio::test]
async fn a_usable_request_id_is_kept() {
    let upstream = Upstream::start().await;
    let dead = common::DeadPort::new();
    let proxy = Proxy::start(&config(&upstream, &dead)).await;
    let long = "x".repeat(200);
    for (n, sent) in ["req-42", "{a:\"b\"}/=~", &long].into_iter().enumerate() {
        let a = get(&proxy.url("/v1/x"), &[("x-request-id", sent)]).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(id(&a), sent);
        assert_eq!(upstream_id(&upstream, n), sent);
    }
}

/// An id too long, or with a space, a tab or bytes beyond ASCII, is replaced by a made one,
/// which both the upstream and the client get; so is a request's second id field.
#[tokio::test]
async fn an_unusable_request_id_is_replaced() {
    let upstream = Upstream::start().await;
    let dead = common::DeadPort::new();
    let proxy = Proxy::start(&config(&upstream, &dead)).await;
    let long = "x".repeat(201);
    let sent: [&[&[u8]]; 5] = [
        &[long.as_bytes()],
        &[b"a b"],
        &[b"a\tb"],
        &[b"caf\xc3\xa9"],
        &[b"one", b"two"],
    ];
    for (n, values) in sent.into_iter().enumerate() {
        let mut req = Request::get(proxy.url("/v1/x"));
        for v in values {
            req = req.header("x-request-id", http::HeaderValue::from_bytes(v).unwrap());
        }
        let a = send(req.body(empty()).unwrap()).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert!(is_uuid_v4(id(&a)), "{values:?}: {a:?}");
        assert_eq!(upstream_id(&upstream, n), id(&a), "{values:?}");
    }
}

/// A request without an id gets a new one, a UUID, each request its own.
#[tokio::test]
async fn a_request_without_an_id_gets_one() {
    let upstream = Upstream::start().await;
    let dead = common::DeadPort::new();
    let proxy = Proxy::start(&config(&upstream, &dead)).await;
    let a = get(&proxy.url("/v1/x"), &[]).await;
    let b = get(&proxy.url("/v1/x"), &[]).await;
    assert!(is_uuid_v4(id(&a)), "{a:?}");
    assert_ne!(id(&a), id(&b));
    assert_eq!(upstream_id(&upstream, 0), id(&a));
    assert_eq!(upstream_id(&upstream, 1), id(&b));
}

/// The proxy's own answers carry the id too: 404 (no route), 429 (a limit), 502 (the target
/// refuses), whether the client sent it or not.
#[tokio::test]
async fn the_proxys_own_answers_carry_the_id() {
    let upstream = Upstream::start().await;
    let dead = common::DeadPort::new();
    let proxy = Proxy::start(&config(&upstream, &dead)).await;
    assert_eq!(get(&proxy.url("/limited"), &[]).await.status, 200);
    for (path, status) in [("/nowhere", 404), ("/limited", 429), ("/gone/x", 502)] {
        let sent = format!("id-{status}");
        let a = get(&proxy.url(path), &[("x-request-id", &sent)]).await;
        assert_eq!(a.status, status, "{a:?}");
        assert_eq!(id(&a), sent);
        let made = get(&proxy.url(path), &[]).await;
        assert_eq!(made.status, status, "{made:?}");
        assert!(is_uuid_v4(id(&made)), "{made:?}");
    }
}

/// A request refused for its framing before any route is looked at (two Host fields) gets its
/// id back too.
#[tokio::test]
async fn a_framing_refusal_carries_the_id() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = Upstream::start().await;
    let dead = common::DeadPort::new();
    let proxy = Proxy::start(&config(&upstream, &dead)).await;
    let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(b"GET /v1/x HTTP/1.1\r\nHost: a\r\nHost: b\r\nX-Request-Id: framed-1\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("x-request-id: framed-1\r\n"),
        "{answer}"
    );
    assert!(upstream.seen().is_empty());
}

/// Over HTTP/2 the id is kept, or made, and forwarded and returned as over HTTP/1.1.
#[tokio::test]
async fn http2_requests_carry_the_id() {
    let upstream = Upstream::start().await;
    let dead = common::DeadPort::new();
    let proxy = Proxy::start(&config(&upstream, &dead)).await;
    let stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2c handshake");
    tokio::spawn(conn);
    let url = proxy.url("/v1/h2");
    let kept = Request::get(&url)
        .header("x-request-id", "over-h2")
        .body(empty())
        .unwrap();
    let resp = sender.send_request(kept).await.expect("h2 GET");
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.headers()["x-request-id"], "over-h2");
    assert_eq!(upstream_id(&upstream, 0), "over-h2");
    let made = Request::get(&url).body(empty()).unwrap();
    let resp = sender.send_request(made).await.expect("h2 GET");
    let id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert!(is_uuid_v4(&id), "{id}");
    assert_eq!(upstream_id(&upstream, 1), id);
}

type TestBody =
    http_body_util::combinators::BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

fn empty() -> TestBody {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

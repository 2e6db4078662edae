//! How tollgate speaks to upstreams: HTTP/2 (h2c with prior knowledge, or chosen by ALPN on
//! `https://`), each upstream's own TLS settings (trusted CA, client certificate, server name,
//! no verification), and trailers passed on to HTTP/1.1 clients that ask for them.
//!
//! Certificates are made by the test; upstreams are real HTTP servers on free ports.

mod common;
common::both_http1_clients!();

use std::time::{Duration, Instant};

use common::pki::Pki;
use common::{get, Proxy, Upstream, Yaml};
use http::Version;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const H2: &[u8] = b"h2";
const HTTP1: &[u8] = b"http/1.1";

/// An upstream that speaks only HTTP/2 in the clear (h2c) gets HTTP/2 with `protocol: http2`,
/// requests with and without bodies, and every request of a burst shares one connection,
/// whichever worker served it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_upstreams_get_one_connection_for_many_streams() {
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .upstream("protocol: http2")
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    let burst = (0..20).map(|_| {
        let url = proxy.url("/version");
        tokio::spawn(async move { get(&url, &[]).await })
    });
    for answer in futures_util::future::join_all(burst).await {
        let answer = answer.unwrap();
        assert_eq!((answer.status, answer.body.as_str()), (200, "HTTP/2.0"));
    }
    let post = http::Request::post(proxy.url("/echo"))
        .header("host", "api.example")
        .body(common::full("hello over h2"))
        .unwrap();
    let echoed = common::send(post).await;
    assert_eq!(
        (echoed.status, echoed.body.as_str()),
        (200, "hello over h2")
    );
    assert_eq!(
        upstream.connections(),
        1,
        "one connection carries every stream"
    );
    let seen = upstream.seen();
    assert!(seen.iter().all(|s| s.version == Version::HTTP_2));
    // the client's host is the request's :authority, as Host is over HTTP/1.1
    let last = seen.last().unwrap();
    assert!(
        last.uri.starts_with("http://api.example/echo"),
        "{}",
        last.uri
    );
    proxy.shutdown().await;
}

/// `auto` takes HTTP/2 when TLS offers it, and HTTP/1.1 when the server offers only that and
/// on `http://`; `http1` never asks for HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_takes_what_tls_negotiates() {
    let pki = Pki::new();
    let cert = pki.issue("server", &["127.0.0.1", "localhost"]);
    let both = Upstream::start_tls(pki.server_config(&cert, &[H2, HTTP1], false)).await;
    let only_http1 = Upstream::start_tls(pki.server_config(&cert, &[HTTP1], false)).await;
    let plain = Upstream::start().await;
    let ca = format!("tls: {{ca: {}}}", pki.ca().display());
    let yaml = Yaml::to(&[both.url()])
        .upstream(&ca)
        .also_upstream("pinned", &[both.url()], &format!("{ca}\nprotocol: http1"))
        .also_upstream("old", &[only_http1.url()], &ca)
        .also_upstream("plain", &[plain.url()], "")
        .route("auto", "/auto", "strip_prefix: true")
        .route_to("pinned", "/pinned", "pinned", "strip_prefix: true")
        .route_to("old", "/old", "old", "strip_prefix: true")
        .route_to("plain", "/plain", "plain", "strip_prefix: true")
        .build();
    let proxy = Proxy::start(&yaml).await;
    for (path, version) in [
        ("/auto/version", "HTTP/2.0"),
        ("/auto/version", "HTTP/2.0"),
        ("/pinned/version", "HTTP/1.1"),
        ("/old/version", "HTTP/1.1"),
        ("/old/version", "HTTP/1.1"),
        ("/plain/version", "HTTP/1.1"),
    ] {
        let answer = get(&proxy.url(path), &[]).await;
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (200, version),
            "{path}"
        );
    }
    proxy.shutdown().await;
}

/// Each upstream's `tls`: its own CA, a client certificate for a server that demands one, a
/// server name other than the target's host, and `verify: false`. Without the setting each
/// needs, the connection fails and the client gets 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_upstream_has_its_own_tls_settings() {
    let pki = Pki::new();
    let cert = pki.issue("server", &["127.0.0.1"]);
    let named = pki.issue("named", &["api.internal"]);
    let client = pki.issue("client", &["tollgate"]);
    let open = Upstream::start_tls(pki.server_config(&cert, &[HTTP1], false)).await;
    let mtls = Upstream::start_tls(pki.server_config(&cert, &[H2, HTTP1], true)).await;
    let elsewhere = Upstream::start_tls(pki.server_config(&named, &[H2], false)).await;
    let ca = pki.ca().display().to_string();
    let identity = format!(
        "cert: {}, key: {}",
        client.cert.display(),
        client.key.display()
    );
    let cases: [(&str, &Upstream, String, u16); 8] = [
        ("untrusted", &open, String::new(), 502),
        ("trusted", &open, format!("tls: {{ca: {ca}}}"), 200),
        ("unchecked", &open, "tls: {verify: false}".into(), 200),
        ("anonymous", &mtls, format!("tls: {{ca: {ca}}}"), 502),
        ("mtls", &mtls, format!("tls: {{ca: {ca}, {identity}}}"), 200),
        ("misnamed", &elsewhere, format!("tls: {{ca: {ca}}}"), 502),
        (
            "renamed",
            &elsewhere,
            format!("tls: {{ca: {ca}, server_name: api.internal}}"),
            200,
        ),
        (
            "renamed-h2",
            &elsewhere,
            format!("tls: {{ca: {ca}, server_name: api.internal}}\nprotocol: http2"),
            200,
        ),
    ];
    let mut yaml = Yaml::to(&[open.url()]);
    for (name, upstream, settings, _) in &cases {
        yaml = yaml
            .also_upstream(name, &[upstream.url()], settings)
            .route_to(name, &format!("/{name}"), name, "");
    }
    let proxy = Proxy::start(&yaml.build()).await;
    for (name, _, _, status) in &cases {
        let answer = get(&proxy.url(&format!("/{name}")), &[]).await;
        assert_eq!(answer.status, *status, "{name}: {}", answer.body);
    }
    proxy.shutdown().await;
}

/// Limits, pacing and the response timeout work over HTTP/2 as over HTTP/1.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_pacing_and_timeouts_hold_over_http2() {
    let upstream = Upstream::start().await;
    let limit = "limits: [{name: per-client, algorithm: token_bucket, key: header:x-client, \
                 rate: 1/h, burst: 3}]";
    let yaml = Yaml::to(&[upstream.url()])
        .top("timeouts: {upstream_response: 300ms}")
        .upstream("protocol: http2\npace: {rate: 10/s, max_delay: 5s}")
        .route("api", "/", limit)
        .build();
    let proxy = Proxy::start(&yaml).await;
    let started = Instant::now();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(
            get(&proxy.url("/version"), &[("x-client", "a")])
                .await
                .status,
        );
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    // three forwarded at 10/s: the third waited about 200 ms for its slot
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
    let slow = get(&proxy.url("/slow/3000"), &[("x-client", "b")]).await;
    assert_eq!(slow.status, 504, "{}", slow.body);
    proxy.shutdown().await;
}

/// Trailers reach an HTTP/1.1 client that sent `TE: trailers`, after the last chunk, from an
/// HTTP/1.1 upstream (with and without a request body, so both HTTP/1 clients carry it) and
/// from an HTTP/2 one. A client that did not ask gets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_reach_http1_clients_that_ask_for_them() {
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .also_upstream("h2", &[upstream.url()], "protocol: http2")
        .route_to("h2", "/h2", "h2", "strip_prefix: true")
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    let fetch = |request: String| async move {
        let mut conn = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let read = conn.read_to_end(&mut got);
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("the proxy closes the connection")
            .unwrap();
        String::from_utf8_lossy(&got).to_ascii_lowercase()
    };
    for path in ["/trailers", "/h2/trailers"] {
        for body in ["", "Content-Length: 1\r\n\r\nx"] {
            let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
            let end = if body.is_empty() { "\r\n" } else { body };
            let asked = fetch(format!("{head}TE: trailers\r\n{end}")).await;
            assert!(
                asked.starts_with("http/1.1 200") && asked.ends_with("0\r\nx-checksum: 2a\r\n\r\n"),
                "{path} {body:?}: {asked}"
            );
            let unasked = fetch(format!("{head}{end}")).await;
            assert!(unasked.ends_with("ok\r\n0\r\n\r\n"), "{path}: {unasked}");
        }
    }
    // the upstream was asked for trailers only when the client asked
    let te: Vec<Option<String>> = upstream
        .seen()
        .iter()
        .map(|s| s.headers.get("te").map(|v| v.to_str().unwrap().to_owned()))
        .collect();
    assert_eq!(
        te.iter()
            .filter(|t| t.as_deref() == Some("trailers"))
            .count(),
        4,
        "{te:?}"
    );
    assert_eq!(te.iter().filter(|t| t.is_none()).count(), 4, "{te:?}");
    proxy.shutdown().await;
}

//! `X-Real-IP` and `Forwarded` end to end: what a real upstream receives of who sent the
//! request, over HTTP/1.1 and HTTP/2 upstreams, from an untrusted client, behind a trusted
//! proxy, from an IPv6 peer, and with `forwarded_headers` turned off. tollgate in process, the
//! memory store.

mod common;
common::both_http1_clients!();

use common::{get, Proxy, Upstream, Yaml};

/// One upstream `api` at `upstream` (with `upstream_keys`), one route on `/v1`, `top` at the
/// top level.
fn config(upstream: &Upstream, top: &str, upstream_keys: &str) -> String {
    Yaml::to(&[upstream.url()])
        .top(top)
        .upstream(upstream_keys)
        .route("api", "/v1", "")
        .build()
}

/// Every value of `name` the upstream received on its request number `i`.
fn received(upstream: &Upstream, i: usize, name: &str) -> Vec<String> {
    let seen = upstream.seen();
    seen[i]
        .headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("ASCII header").to_owned())
        .collect()
}

/// A client that names itself in `X-Real-IP` (two lines) and `Forwarded` is not believed:
/// the upstream gets `X-Real-IP` of the TCP peer, and the client's `Forwarded` element
/// followed by tollgate's. The same over an HTTP/1.1 and an HTTP/2 upstream.
#[tokio::test]
async fn a_spoofed_identity_is_replaced_and_forwarded_is_appended() {
    for protocol in ["http1", "http2"] {
        let upstream = Upstream::start().await;
        let yaml = config(&upstream, "", &format!("protocol: {protocol}"));
        let proxy = Proxy::start(&yaml).await;
        let a = get(
            &proxy.url("/v1/x"),
            &[
                ("host", "api.example.com"),
                ("x-real-ip", "1.2.3.4"),
                ("x-real-ip", "5.6.7.8"),
                ("forwarded", "for=1.2.3.4"),
            ],
        )
        .await;
        assert_eq!(a.status, 200, "{protocol}: {a:?}");
        let b = get(&proxy.url("/v1/y"), &[("host", "api.example.com:8443")]).await;
        assert_eq!(b.status, 200, "{protocol}: {b:?}");

        let version = upstream.seen()[0].version;
        let expected = match protocol {
            "http2" => http::Version::HTTP_2,
            _ => http::Version::HTTP_11,
        };
        assert_eq!(version, expected, "{protocol}");
        assert_eq!(
            received(&upstream, 0, "x-real-ip"),
            ["127.0.0.1"],
            "{protocol}"
        );
        assert_eq!(
            received(&upstream, 0, "forwarded"),
            ["for=1.2.3.4, for=127.0.0.1;proto=http;host=api.example.com"],
            "{protocol}"
        );
        // without a Forwarded of the client's, tollgate's element alone; a host with a port
        // is quoted (`:` is not a token character)
        assert_eq!(received(&upstream, 1, "x-real-ip"), ["127.0.0.1"]);
        assert_eq!(
            received(&upstream, 1, "forwarded"),
            [r#"for=127.0.0.1;proto=http;host="api.example.com:8443""#],
            "{protocol}"
        );
    }
}

/// Behind a trusted proxy, `X-Real-IP` is the client tollgate identified from
/// `X-Forwarded-For`, and tollgate's `Forwarded` element names the hop it heard: the proxy.
#[tokio::test]
async fn behind_a_trusted_proxy_x_real_ip_is_the_identified_client() {
    let upstream = Upstream::start().await;
    let yaml = config(&upstream, "trusted_proxies: [127.0.0.0/8]", "");
    let proxy = Proxy::start(&yaml).await;
    let a = get(
        &proxy.url("/v1/x"),
        &[
            ("host", "api.example.com"),
            ("x-forwarded-for", "198.51.100.9, 203.0.113.7"),
            ("x-real-ip", "198.51.100.9"),
            ("forwarded", "for=203.0.113.7;proto=https"),
        ],
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    // no X-Forwarded-For: the trusted peer is the client
    let b = get(&proxy.url("/v1/y"), &[("x-real-ip", "198.51.100.9")]).await;
    assert_eq!(b.status, 200, "{b:?}");
    assert_eq!(received(&upstream, 0, "x-real-ip"), ["203.0.113.7"]);
    assert_eq!(
        received(&upstream, 0, "forwarded"),
        ["for=203.0.113.7;proto=https, for=127.0.0.1;proto=http;host=api.example.com"]
    );
    assert_eq!(received(&upstream, 1, "x-real-ip"), ["127.0.0.1"]);
}

/// An IPv6 peer is written bracketed and quoted in `Forwarded`, and bare in `X-Real-IP` (as
/// in `X-Forwarded-For`).
#[tokio::test]
async fn an_ipv6_peer_is_quoted_in_forwarded() {
    let upstream = Upstream::start().await;
    let yaml = config(&upstream, "", "").replace("listen: 127.0.0.1:0", "listen: \"[::1]:0\"");
    let proxy = Proxy::start(&yaml).await;
    assert!(proxy.addr.is_ipv6(), "{}", proxy.addr);
    let a = get(&proxy.url("/v1/x"), &[("host", "api.example.com")]).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(received(&upstream, 0, "x-real-ip"), ["::1"]);
    assert_eq!(received(&upstream, 0, "x-forwarded-for"), ["::1"]);
    assert_eq!(
        received(&upstream, 0, "forwarded"),
        [r#"for="[::1]";proto=http;host=api.example.com"#]
    );
}

/// With `forwarded_headers` off, both headers reach the upstream as the client sent them,
/// every line; each setting governs its own header.
#[tokio::test]
async fn turned_off_the_headers_are_left_as_sent() {
    let upstream = Upstream::start().await;
    let top = "forwarded_headers: {x_real_ip: false, forwarded: false}";
    let proxy = Proxy::start(&config(&upstream, top, "")).await;
    let spoofed = [
        ("x-real-ip", "1.2.3.4"),
        ("x-real-ip", "5.6.7.8"),
        ("forwarded", "for=1.2.3.4"),
        ("forwarded", "for=5.6.7.8"),
    ];
    let a = get(&proxy.url("/v1/x"), &spoofed).await;
    assert_eq!(a.status, 200, "{a:?}");
    let b = get(&proxy.url("/v1/y"), &[]).await;
    assert_eq!(b.status, 200, "{b:?}");
    assert_eq!(received(&upstream, 0, "x-real-ip"), ["1.2.3.4", "5.6.7.8"]);
    assert_eq!(
        received(&upstream, 0, "forwarded"),
        ["for=1.2.3.4", "for=5.6.7.8"]
    );
    assert!(received(&upstream, 1, "x-real-ip").is_empty());
    assert!(received(&upstream, 1, "forwarded").is_empty());

    let upstream = Upstream::start().await;
    let top = "forwarded_headers: {forwarded: false}";
    let proxy = Proxy::start(&config(&upstream, top, "")).await;
    let a = get(&proxy.url("/v1/x"), &spoofed).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(received(&upstream, 0, "x-real-ip"), ["127.0.0.1"]);
    assert_eq!(
        received(&upstream, 0, "forwarded"),
        ["for=1.2.3.4", "for=5.6.7.8"]
    );
}

/// A WebSocket handshake goes upstream with the same identity headers as any request: the
/// head a raw upstream reads before it answers 101.
#[tokio::test]
async fn an_upgrade_handshake_carries_the_identity_headers() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = format!("http://{}", listener.local_addr().unwrap());
    let upstream = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let head = read_head(&mut s).await;
        s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n")
            .await
            .unwrap();
        head
    });
    let yaml = Yaml::to(&[target]).route("api", "/v1", "").build();
    let proxy = Proxy::start(&yaml).await;
    let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(
        b"GET /v1/ws HTTP/1.1\r\nHost: api.example.com\r\nConnection: Upgrade\r\n\
          Upgrade: websocket\r\nX-Real-IP: 1.2.3.4\r\nForwarded: for=1.2.3.4\r\n\r\n",
    )
    .await
    .unwrap();
    let answer = read_head(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
    let head = upstream.await.unwrap().to_ascii_lowercase();
    assert!(head.contains("\r\nx-real-ip: 127.0.0.1\r\n"), "{head}");
    assert!(
        head.contains(
            "\r\nforwarded: for=1.2.3.4, for=127.0.0.1;proto=http;host=api.example.com\r\n"
        ),
        "{head}"
    );
    assert_eq!(head.matches("x-real-ip").count(), 1, "{head}");

    /// Reads a message head, byte by byte, up to its blank line.
    async fn read_head(s: &mut tokio::net::TcpStream) -> String {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let read = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut byte));
            let n = read.await.expect("a head in time").unwrap();
            assert_eq!(n, 1, "closed after {:?}", String::from_utf8_lossy(&head));
            head.push(byte[0]);
        }
        String::from_utf8(head).unwrap()
    }
}

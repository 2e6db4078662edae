//! The admin listener without a token answers only hosts a stranger's page cannot name: IP
//! literals, `localhost`, and `admin.hosts`. A DNS-rebinding page sends its own name as `Host`
//! (or HTTP/2 `:authority`) and gets 403 on every path. With a token, the token's rules stand
//! alone. `admin.hosts` reloads at once, and `tollgate check` warns of an open listener
//! without a token.

mod common;
common::both_http1_clients!();

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};

use common::{eventually, get, Answer, Proxy, Upstream, Yaml};

/// Every path of the admin listener.
const PATHS: [&str; 6] = [
    "/",
    "/metrics",
    "/healthz",
    "/readyz",
    "/config",
    "/api/stats",
];

/// A proxy whose admin listener has `admin` as its further keys (`", hosts: [x]"`).
async fn start(upstream: &Upstream, admin: &str) -> Proxy {
    let yaml = Yaml::to(&[upstream.url()])
        .top(&format!("admin: {{listen: 127.0.0.1:0{admin}}}"))
        .route("api", "/v1", "")
        .build();
    Proxy::start(&yaml).await
}

/// GET `path` on the admin listener at `admin` with `headers` (a `host` among them replaces
/// the address the client would send).
async fn admin_get(admin: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    get(&format!("http://{admin}{path}"), headers).await
}

/// Without a token, a foreign `Host` gets 403 on every path, with a message that says how to
/// allow it; malformed and doubled hosts too. The same listener answers IP literals,
/// `localhost` with or without a port, and a listed name in any case.
#[tokio::test]
async fn without_a_token_only_local_and_listed_hosts_are_answered() {
    let upstream = Upstream::start().await;
    let proxy = start(&upstream, ", hosts: [console.example.com]").await;
    let admin = proxy.admin.expect("admin listener");
    for path in PATHS {
        for host in [
            "evil.example",
            "evil.example:9901",
            "localhost.evil.example",
        ] {
            let a = admin_get(admin, path, &[("host", host)]).await;
            assert_eq!(a.status, 403, "{path} as {host}: {a:?}");
            let name = host.split(':').next().unwrap_or_default();
            assert!(
                a.body
                    .contains(&format!("add {name} to admin.hosts or set admin.token")),
                "{path}: {}",
                a.body
            );
        }
        for host in [
            "127.0.0.1",
            "localhost",
            "localhost:9901",
            "[::1]:9901",
            "LocalHost.",
        ] {
            let a = admin_get(admin, path, &[("host", host)]).await;
            assert_ne!(a.status, 403, "{path} as {host}: {a:?}");
        }
    }
    let api = admin_get(admin, "/api/stats", &[("host", "evil.example")]).await;
    assert_eq!(api.header("content-type"), Some("application/json"));
    assert!(
        api.body.contains(r#""error":"forbidden_host""#),
        "{}",
        api.body
    );
    for host in [
        "console.example.com",
        "Console.Example.COM:9901",
        "10.1.2.3:80",
    ] {
        let a = admin_get(admin, "/api/stats", &[("host", host)]).await;
        assert_eq!(a.status, 200, "{host}: {a:?}");
    }
    let no_port = admin_get(admin, "/healthz", &[("host", "[::1")]).await;
    assert_eq!(no_port.status, 403, "{no_port:?}");
    let two = admin_get(
        admin,
        "/healthz",
        &[("host", "localhost"), ("host", "evil.example")],
    )
    .await;
    assert_eq!(two.status, 403, "{two:?}");
}

/// Over HTTP/2 the host is `:authority`: a foreign one is refused, a local one answered.
#[tokio::test]
async fn over_http2_the_authority_is_checked() {
    let upstream = Upstream::start().await;
    let proxy = start(&upstream, "").await;
    let admin = proxy.admin.expect("admin listener");
    let tcp = tokio::net::TcpStream::connect(admin).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    for (authority, expected) in [("evil.example:9901", 403), ("localhost:9901", 200)] {
        let req = http::Request::get(format!("http://{authority}/api/stats"))
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = send.send_request(req).await.expect("h2 response");
        assert_eq!(resp.version(), http::Version::HTTP_2);
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(status, expected, "{authority}: {body:?}");
    }
}

/// With a token, the host is not looked at: the right token is answered under any host, a
/// missing one gets 401 as before, and the open endpoints stay open.
#[tokio::test]
async fn with_a_token_the_host_is_not_checked() {
    let upstream = Upstream::start().await;
    let proxy = start(&upstream, ", token: s3cret").await;
    let admin = proxy.admin.expect("admin listener");
    let foreign = ("host", "evil.example");
    let a = admin_get(
        admin,
        "/api/stats",
        &[foreign, ("authorization", "Bearer s3cret")],
    )
    .await;
    assert_eq!(a.status, 200, "{a:?}");
    let b = admin_get(admin, "/api/stats", &[foreign]).await;
    assert_eq!(b.status, 401, "{b:?}");
    let c = admin_get(admin, "/healthz", &[foreign]).await;
    assert_eq!(c.status, 200, "{c:?}");
}

/// A name added to `admin.hosts` in the file is answered once the file reloads.
#[tokio::test]
async fn a_reload_adds_a_host() {
    let upstream = Upstream::start().await;
    let text = |hosts: &str| {
        Yaml::to(&[upstream.url()])
            .top(&format!("admin: {{listen: 127.0.0.1:0{hosts}}}"))
            .route("api", "/v1", "")
            .build()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.yaml");
    std::fs::write(&path, text("")).unwrap();
    let proxy = Proxy::start_watching(&path).await;
    let admin = proxy.admin.expect("admin listener");
    let named = [("host", "console.example.com:9901")];
    assert_eq!(admin_get(admin, "/healthz", &named).await.status, 403);
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(text(", hosts: [console.example.com]").as_bytes())
        .unwrap();
    drop(file);
    eventually(Duration::from_secs(10), || async {
        admin_get(admin, "/healthz", &named).await.status == 200
    })
    .await;
}

/// `tollgate check` warns, naming the line, column and key, when the admin listener is not
/// on loopback and has no token; on loopback, or with a token, it does not.
#[test]
fn check_warns_of_an_open_listener_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let check = |admin: &str| {
        let path = dir.path().join("p.yaml");
        let yaml = format!(
            "listen: 127.0.0.1:8080\nadmin:\n  {admin}\nupstreams:\n  api:\n    targets: [http://127.0.0.1:1]\nroutes:\n  - name: r\n    upstream: api\n"
        );
        std::fs::write(&path, yaml).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let open = check("listen: 0.0.0.0:9901");
    assert!(
        open.contains(
            "p.yaml:3:11: admin.listen: 0.0.0.0:9901 is not a loopback address and admin.token \
             is not set"
        ),
        "{open}"
    );
    assert!(
        open.contains("set admin.token, or listen on 127.0.0.1"),
        "{open}"
    );
    assert!(!check("listen: 127.0.0.1:9901").contains("admin.listen"));
    assert!(!check("listen: '[::1]:9901'").contains("admin.listen"));
    let tokened = check("listen: 0.0.0.0:9901\n  token: s3cret");
    assert!(!tokened.contains("admin.listen"), "{tokened}");
}

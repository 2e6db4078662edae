//! TLS: inbound termination (ALPN h2 and http/1.1) with a certificate made in the test, an
//! `https://` upstream verified against a root the system bundle ($SSL_CERT_FILE) holds, and
//! `rediss://` to a real TLS redis-server with AUTH from the URL.
//!
//! Its own binary: [`trusted_certs`] sets SSL_CERT_FILE for the process.

mod common;
common::both_http1_clients!();

use common::Yaml;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};

struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    fn new() -> Certs {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cert.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
        Certs { dir }
    }
    fn cert(&self) -> String {
        self.dir.path().join("cert.pem").display().to_string()
    }
    fn key(&self) -> String {
        self.dir.path().join("key.pem").display().to_string()
    }
    fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(self.cert()).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

/// The certificate that SSL_CERT_FILE names, the system bundle, for the whole process: made
/// and set once, so that tests running at once never trust each other's.
fn trusted_certs() -> &'static Certs {
    static CERTS: std::sync::OnceLock<Certs> = std::sync::OnceLock::new();
    CERTS.get_or_init(|| {
        let certs = Certs::new();
        std::env::set_var("SSL_CERT_FILE", certs.cert());
        certs
    })
}

async fn tls_connect(
    addr: SocketAddr,
    certs: &Certs,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(certs.client_config(alpn));
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

/// A TLS redis-server on a free port, plaintext off, requiring a password.
struct TlsRedis {
    port: u16,
    child: std::process::Child,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tls_redis(certs: &Certs) -> TlsRedis {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args([
            "--tls-cert-file",
            &certs.cert(),
            "--tls-key-file",
            &certs.key(),
            "--tls-auth-clients",
            "no",
        ])
        .args([
            "--requirepass",
            "s3cret",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "TLS redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    TlsRedis { port, child }
}

/// HTTPS in, HTTPS to the upstream, TLS to Redis: all verified, all working together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_everywhere() {
    // the test CA as the system bundle, for the upstream client and for rediss://
    let certs = trusted_certs();
    let redis = tls_redis(certs);

    // an HTTPS upstream with the same certificate
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = upstream.local_addr().unwrap();
    let acceptor = tollgate::tls::acceptor(
        tollgate::tls::server_config(
            std::path::Path::new(&certs.cert()),
            std::path::Path::new(&certs.key()),
        )
        .unwrap(),
    );
    tokio::spawn(async move {
        loop {
            let (tcp, _) = upstream.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let body = format!("secure upstream saw {:?}", req.version());
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Full::new(Bytes::from(body)),
                        ))
                    },
                );
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });

    let tls = format!(
        "tls: {{cert: \"{}\", key: \"{}\"}}",
        certs.cert(),
        certs.key()
    );
    let store = format!(
        "store: {{backend: redis, url: \"rediss://:s3cret@localhost:{}/0\", timeout: 1s, \
         on_error: deny}}",
        redis.port
    );
    let secure = format!("https://localhost:{}", upstream_addr.port());
    let yaml = Yaml::to(&[secure])
        .top(&tls)
        .top(&store)
        .upstream("preserve_host: false")
        .route(
            "api",
            "/",
            "limits: [{name: per-client, algorithm: token_bucket, rate: 1/h, burst: 2}]",
        )
        .build();
    let proxy = common::Proxy::start(&yaml).await;

    // HTTP/2 by ALPN
    let tls = tls_connect(proxy.addr, certs, &[b"h2", b"http/1.1"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get("https://localhost/x")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), hyper::Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    // the upstream offers h2 by ALPN, and `protocol: auto` takes it
    assert_eq!(body, "secure upstream saw HTTP/2.0");

    // HTTP/1.1 by ALPN
    let tls = tls_connect(proxy.addr, certs, &[b"http/1.1"]).await;
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get("/y")
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = h1.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), hyper::Version::HTTP_11);
    resp.into_body().collect().await.unwrap();
    // the limit lives in the TLS Redis: its third request is denied
    let req = hyper::Request::get("/z")
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .unwrap();
    // the previous response was read to the end, so the connection is ready again
    h1.ready().await.unwrap();
    assert_eq!(h1.send_request(req).await.unwrap().status(), 429);
    let keys = Command::new("redis-cli")
        .args([
            "-p",
            &redis.port.to_string(),
            "--tls",
            "--cacert",
            &certs.cert(),
            "-h",
            "localhost",
            "-a",
            "s3cret",
            "--no-auth-warning",
            "--scan",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&keys.stdout).contains("tollgate:api:per-client:127.0.0.1"));

    // a plaintext client on the TLS port gets no HTTP answer, and disturbs nobody
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut plain = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), plain.read_to_end(&mut buf)).await;
    assert!(!buf.starts_with(b"HTTP/1.1 200"));
    let tls = tls_connect(proxy.addr, certs, &[b"http/1.1"]).await;
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get("/after")
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .unwrap();
    assert_eq!(
        h1.send_request(req).await.unwrap().status(),
        429,
        "still serving TLS clients"
    );
}

/// A certificate renewed in place (the same files, as certbot or cert-manager writes them) is
/// served from the next connection after a reload, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_is_served_after_a_reload() {
    let upstream = common::Upstream::start().await;
    let certs = Certs::new();
    let config = certs.dir.path().join("proxy.yaml");
    let yaml = tls_listener(&certs, &upstream, "");
    std::fs::write(&config, &yaml).unwrap();
    let proxy = common::Proxy::start_watching(&config).await;
    let old_trust = certs.client_config(&[b"http/1.1"]);
    let connects = |trust: Arc<rustls::ClientConfig>| {
        let addr = proxy.addr;
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            tokio_rustls::TlsConnector::from(trust)
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
                .is_ok()
        }
    };
    assert!(connects(old_trust.clone()).await, "the first certificate");
    // renewed: a new key and certificate written over the same files
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let renewed = params.self_signed(&key).unwrap();
    std::fs::write(certs.cert(), renewed.pem()).unwrap();
    std::fs::write(certs.key(), key.serialize_pem()).unwrap();
    let new_trust = certs.client_config(&[b"http/1.1"]);
    // the config file touched (written again as it was): a reload, as SIGHUP would
    std::fs::write(&config, &yaml).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !connects(new_trust.clone()).await {
        assert!(
            Instant::now() < deadline,
            "the renewed certificate never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !connects(old_trust).await,
        "the old certificate is no longer served"
    );
}

/// A TLS listener with `certs` in front of `upstream`, `top` added at the top level.
fn tls_listener(certs: &Certs, upstream: &common::Upstream, top: &str) -> String {
    let tls = format!(
        "tls: {{cert: \"{}\", key: \"{}\"}}",
        certs.cert(),
        certs.key()
    );
    Yaml::to(&[upstream.url()])
        .top(&tls)
        .top(top)
        .route("api", "/", "")
        .build()
}

/// Shutdown does not wait for a TLS handshake under way: a client that connected and sent
/// nothing is dropped at once (as on a cleartext listener), not after `client_header`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_a_silent_tls_client() {
    let certs = Certs::new();
    let upstream = common::Upstream::start().await;
    let yaml = tls_listener(&certs, &upstream, "timeouts: {client_header: 20s}");
    let proxy = common::Proxy::start(&yaml).await;
    let _silent = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    proxy.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown waited {:?} for a silent TLS client",
        started.elapsed()
    );
}

/// A TLS client that stops reading its response is cut off after `send`, as a cleartext one
/// is: the connection ends after what the sockets and the TLS buffers held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_that_stops_reading_is_cut_off_after_send() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let certs = Certs::new();
    let upstream = common::Upstream::start().await;
    let yaml = tls_listener(&certs, &upstream, "timeouts: {send: 2s}");
    let proxy = common::Proxy::start(&yaml).await;
    let mut tls = tls_connect(proxy.addr, &certs, &[b"http/1.1"]).await;
    let huge: u64 = 8 << 30;
    let head = format!("GET /bytes/{huge} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    tls.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(10), tls.read(&mut buf)).await {
            // (a cut connection sends no close_notify: an error is its end too)
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => total += n as u64,
            Err(_) => break false,
        }
        if total > 256 << 20 {
            break false;
        }
    };
    assert!(ended, "{total} bytes and still open: never cut off");
    println!("stalled TLS client: {total} bytes, then the end");
}

/// A plain HTTP request sent to the TLS listener gets a 400 saying so (as nginx answers), not a
/// TLS alert the client's HTTP parser cannot read; TLS clients are served as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_to_the_tls_port_gets_400() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let certs = Certs::new();
    let upstream = common::Upstream::start().await;
    let yaml = tls_listener(&certs, &upstream, "");
    let proxy = common::Proxy::start(&yaml).await;
    let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer))
        .await
        .expect("answered and closed")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    let (_, body) = answer.split_once("\r\n\r\n").unwrap();
    let body: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(body["error"], "bad_request");
    assert!(upstream.seen().is_empty());
}

/// `rediss://` goes over the store's own connection, with joining and leases, and answers as
/// redis-rs's connection does: the same replay, and checks made at once, decided alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_over_the_own_connection_answers_as_redis_rs_does() {
    use tollgate::limit::{Algorithm, Bucket, Rate};
    use tollgate::store::{Connection, MemoryStore, RedisStore, RedisTarget, Store};

    let certs = trusted_certs();
    let redis = tls_redis(certs);
    let url = format!("rediss://:s3cret@localhost:{}/0", redis.port);
    let target = RedisTarget::Single(url);
    let bucket = |rate: f64, burst: u32| {
        Algorithm::TokenBucket(
            Bucket::new(
                Rate::per_second(rate).unwrap(),
                std::num::NonZeroU32::new(burst).unwrap(),
                std::num::NonZeroU32::new(1).unwrap(),
            )
            .unwrap(),
        )
    };
    let t0 = 1_700_000_040_000.0;
    let times = [t0, t0, t0, t0 + 50.0, t0 + 100.0, t0 + 250.0];
    let memory = MemoryStore::new(std::num::NonZeroUsize::new(100).unwrap());
    let mut expected = Vec::new();
    for t in times {
        expected.push(memory.check("k", &bucket(10.0, 2), Some(t)).await.unwrap());
    }
    for connection in [Connection::Own, Connection::Library] {
        let store = RedisStore::connect_over(&target, Duration::from_secs(2), 1, connection)
            .expect("a rediss:// store");
        let key = format!("replay:{connection:?}");
        let mut got = Vec::new();
        for t in times {
            got.push(store.check(&key, &bucket(10.0, 2), Some(t)).await.unwrap());
        }
        assert_eq!(got, expected, "{connection:?}");
        // 40 checks at once on the server's clock, joined on the own connection: exactly the
        // burst is admitted (it refills once an hour, so however long the 40 take)
        let store = Arc::new(store);
        let key = Arc::new(format!("burst:{connection:?}"));
        let checks: Vec<_> = (0..40)
            .map(|_| {
                let (store, key) = (store.clone(), key.clone());
                tokio::spawn(async move {
                    store
                        .check(&key, &bucket(1.0 / 3600.0, 25), None)
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut admitted = 0;
        for c in checks {
            admitted += usize::from(c.await.unwrap().allowed);
        }
        assert_eq!(admitted, 25, "{connection:?}");
    }
}

//! `store.tls` against real TLS `redis-server` processes, with a CA, a server certificate and a
//! client certificate made by the test: trust by `ca`, a client certificate for a Redis that
//! asks for one, `server_name` for a certificate of another name, and `verify: false`; on one
//! Redis, a Cluster and Sentinels. Without what a Redis needs, the connection is refused and
//! `on_error` (`deny` here) answers.

mod common;
common::both_http1_clients!();

use common::{get, Proxy, Upstream, Yaml};

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate::store::{ClientTls, RedisStore, RedisTarget, Store};
use tollgate::tls::Pem;

/// A CA, a server certificate for `names` and a client certificate, both signed by the CA, and
/// a self-signed certificate nobody trusts; PEM files in a temp dir.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new(names: &[&str]) -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "tollgate test CA");
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
        write("ca.pem", ca.pem());
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        for (name, sans) in [("server", names), ("client", vec!["tollgate".to_owned()])] {
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = rcgen::CertificateParams::new(sans)
                .unwrap()
                .signed_by(&key, &ca)
                .unwrap();
            write(&format!("{name}.pem"), cert.pem());
            write(&format!("{name}.key"), key.serialize_pem());
        }
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        write("untrusted.pem", cert.pem());
        write("untrusted.key", key.serialize_pem());
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn pem(&self, name: &str) -> Pem {
        Pem::read(&PathBuf::from(self.path(name)), "test file").unwrap()
    }
}

/// A redis-server that speaks only TLS, on a free port; killed when dropped.
struct TlsRedis {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TlsRedis {
    /// Serves the certificate `cert` (`server` or `untrusted`); asks clients for a certificate
    /// signed by the test CA when `auth_clients`. `extra` goes on the command line too.
    fn start(pki: &Pki, cert: &str, auth_clients: bool, extra: &[&str]) -> TlsRedis {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--tls-cert-file", &pki.path(&format!("{cert}.pem"))])
            .args(["--tls-key-file", &pki.path(&format!("{cert}.key"))])
            .args(["--tls-ca-cert-file", &pki.path("ca.pem")])
            .args([
                "--tls-auth-clients",
                if auth_clients { "yes" } else { "no" },
            ])
            .arg("--dir")
            .arg(dir.path())
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is not installed: apt-get install redis-server redis-tools");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "TLS redis-server did not start (built without TLS?)"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        TlsRedis {
            port,
            child,
            _dir: dir,
        }
    }

    /// `redis-cli` over TLS with the test CA and the client certificate.
    fn cli(&self, pki: &Pki, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "--tls"])
            .args(["--cacert", &pki.path("ca.pem")])
            .args(["--cert", &pki.path("client.pem")])
            .args(["--key", &pki.path("client.key")])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

/// A proxy on `url` with `tls` (flow-style YAML, or "" for none): a bucket of 2 an hour,
/// `on_error: deny`, so a refused Redis shows as 503.
async fn proxy(upstream: &Upstream, url: &str, tls: &str) -> Proxy {
    let mut store = format!(
        "store: {{backend: redis, url: \"{url}\", timeout: 2s, on_error: deny, key_prefix: tg"
    );
    if !tls.is_empty() {
        store.push_str(&format!(", tls: {tls}"));
    }
    store.push('}');
    let yaml = Yaml::to(&[upstream.url()])
        .top(&store)
        .route(
            "api",
            "/",
            "limits: [{name: two, algorithm: token_bucket, rate: 1/h, burst: 2}]",
        )
        .build();
    Proxy::start(&yaml).await
}

/// Three requests: the statuses. 200, 200, 429 when Redis decides; 503 when it cannot.
async fn three(proxy: &Proxy) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(get(&proxy.url("/"), &[]).await.status);
    }
    statuses
}

/// `ca` makes a certificate of a private CA trusted; without it the connection is refused and
/// `on_error` answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_trusts_a_private_ca_and_without_it_redis_is_refused() {
    let pki = Pki::new(&["localhost"]);
    let redis = TlsRedis::start(&pki, "server", false, &[]);
    let upstream = Upstream::start().await;
    let url = format!("rediss://localhost:{}/0", redis.port);
    let untrusting = proxy(&upstream, &url, "").await;
    assert_eq!(three(&untrusting).await, [503, 503, 503]);
    let trusting = proxy(
        &upstream,
        &url,
        &format!("{{ca: \"{}\"}}", pki.path("ca.pem")),
    )
    .await;
    assert_eq!(three(&trusting).await, [200, 200, 429]);
    assert_eq!(
        redis.cli(&pki, &["--scan", "--pattern", "tg:api:*"]),
        "tg:api:two:127.0.0.1"
    );
}

/// A Redis that asks for a client certificate takes tollgate's `cert` and `key`, and refuses
/// a connection without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_signs_in_where_redis_asks_for_one() {
    let pki = Pki::new(&["localhost"]);
    let redis = TlsRedis::start(&pki, "server", true, &[]);
    let upstream = Upstream::start().await;
    let url = format!("rediss://localhost:{}/0", redis.port);
    let ca = pki.path("ca.pem");
    let without = proxy(&upstream, &url, &format!("{{ca: \"{ca}\"}}")).await;
    assert_eq!(three(&without).await, [503, 503, 503]);
    let tls = format!(
        "{{ca: \"{ca}\", cert: \"{}\", key: \"{}\"}}",
        pki.path("client.pem"),
        pki.path("client.key")
    );
    let with = proxy(&upstream, &url, &tls).await;
    assert_eq!(three(&with).await, [200, 200, 429]);
}

/// `server_name` accepts a certificate made for another name than the address connected to,
/// and only that name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_name_lets_a_certificate_for_another_name_pass() {
    let pki = Pki::new(&["redis.internal"]);
    let redis = TlsRedis::start(&pki, "server", false, &[]);
    let upstream = Upstream::start().await;
    let url = format!("rediss://127.0.0.1:{}/0", redis.port);
    let ca = pki.path("ca.pem");
    let by_address = proxy(&upstream, &url, &format!("{{ca: \"{ca}\"}}")).await;
    assert_eq!(three(&by_address).await, [503, 503, 503]);
    let wrong = format!("{{ca: \"{ca}\", server_name: redis.example.com}}");
    let wrong = proxy(&upstream, &url, &wrong).await;
    assert_eq!(three(&wrong).await, [503, 503, 503]);
    let named = format!("{{ca: \"{ca}\", server_name: redis.internal}}");
    let named = proxy(&upstream, &url, &named).await;
    assert_eq!(three(&named).await, [200, 200, 429]);
}

/// `verify: false` connects to a certificate nobody trusts, and so does a `#insecure` URL;
/// `tollgate check` warns of it and says so in its summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_false_connects_to_an_untrusted_certificate_and_check_warns() {
    let pki = Pki::new(&["localhost"]);
    let redis = TlsRedis::start(&pki, "untrusted", false, &[]);
    let upstream = Upstream::start().await;
    let url = format!("rediss://localhost:{}/0", redis.port);
    let unverified = proxy(&upstream, &url, "{verify: false}").await;
    assert_eq!(three(&unverified).await, [200, 200, 429]);
    let insecure = format!("{url}#insecure");
    let store =
        RedisStore::connect(&RedisTarget::Single(insecure), Duration::from_secs(2), 1).unwrap();
    store.ping().await.expect("#insecure connects unverified");
    let verified =
        RedisStore::connect(&RedisTarget::Single(url.clone()), Duration::from_secs(2), 1).unwrap();
    assert!(verified.ping().await.is_err());

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.yaml");
    let yaml = Yaml::to(&[upstream.url()])
        .top(&format!(
            "store: {{url: \"{url}\", tls: {{verify: false, server_name: redis.internal}}}}"
        ))
        .route("api", "/", "")
        .build();
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("warning: ")
            && stderr.contains("store.tls.verify: the certificate of Redis is not verified"),
        "{stderr}"
    );
    assert!(
        stdout.contains(", tls server_name redis.internal NOT VERIFIED,"),
        "{stdout}"
    );
}

/// A Cluster over TLS takes the CA, the client certificate and `server_name` too: its node's
/// certificate names it only by that name, and without the certificate the node refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_takes_the_ca_the_client_certificate_and_a_name() {
    use tollgate::limit::{Algorithm, Bucket, Rate};

    let pki = Pki::new(&["redis.internal"]);
    let node = TlsRedis::start(
        &pki,
        "server",
        true,
        &["--cluster-enabled", "yes", "--tls-cluster", "yes"],
    );
    // one node holding every slot is a whole Cluster
    node.cli(&pki, &["cluster", "addslotsrange", "0", "16383"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !node
        .cli(&pki, &["cluster", "info"])
        .contains("cluster_state:ok")
    {
        assert!(Instant::now() < deadline, "the cluster did not become ok");
        std::thread::sleep(Duration::from_millis(50));
    }
    let target = RedisTarget::Cluster(vec![format!("rediss://127.0.0.1:{}", node.port)]);
    let bucket = Algorithm::TokenBucket(
        Bucket::new(
            Rate::per_second(1.0 / 3600.0).unwrap(),
            std::num::NonZeroU32::new(2).unwrap(),
            std::num::NonZeroU32::MIN,
        )
        .unwrap(),
    );
    let tls = ClientTls {
        ca: Some(pki.pem("ca.pem")),
        identity: Some((pki.pem("client.pem"), pki.pem("client.key"))),
        server_name: Some("redis.internal".to_owned()),
        ..ClientTls::default()
    };
    let store = RedisStore::connect_with(
        &target,
        &tls,
        Duration::from_secs(2),
        1,
        tollgate::store::Connection::Own,
    )
    .unwrap();
    store.ping().await.expect("the TLS cluster answers");
    let by_address = ClientTls {
        server_name: None,
        ..tls.clone()
    };
    let by_address = RedisStore::connect_with(
        &target,
        &by_address,
        Duration::from_secs(2),
        1,
        tollgate::store::Connection::Own,
    )
    .unwrap();
    assert!(
        by_address.ping().await.is_err(),
        "a certificate of another name"
    );
    let allowed: Vec<bool> = three_checks(&store, &bucket).await;
    assert_eq!(allowed, [true, true, false]);
    // verification off: no ca needed
    let unverified = ClientTls {
        ca: None,
        verify: false,
        ..tls.clone()
    };
    let store = RedisStore::connect_with(
        &target,
        &unverified,
        Duration::from_secs(2),
        1,
        tollgate::store::Connection::Own,
    )
    .unwrap();
    store
        .ping()
        .await
        .expect("an unverified TLS cluster answers");
    let without = ClientTls {
        identity: None,
        ..tls
    };
    let refused = RedisStore::connect_with(
        &target,
        &without,
        Duration::from_secs(2),
        1,
        tollgate::store::Connection::Own,
    )
    .unwrap();
    assert!(refused.ping().await.is_err());
}

async fn three_checks(store: &RedisStore, bucket: &tollgate::limit::Algorithm) -> Vec<bool> {
    let mut allowed = Vec::new();
    for _ in 0..3 {
        allowed.push(store.check("k", bucket, None).await.unwrap().allowed);
    }
    allowed
}

/// Sentinels over `rediss://`: tollgate asks them over TLS and reaches the master they name
/// over TLS too, both verified for `server_name` against `ca`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_over_tls_lead_to_the_master_over_tls() {
    let pki = Pki::new(&["redis.internal"]);
    let master = TlsRedis::start(&pki, "server", false, &[]);
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port 0\ntls-port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {}\n\
             tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients no\n\
             tls-replication yes\nsentinel monitor tls-master 127.0.0.1 {} 1\n",
            dir.path().display(),
            pki.path("server.pem"),
            pki.path("server.key"),
            pki.path("ca.pem"),
            master.port
        ),
    )
    .unwrap();
    let mut sentinel = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server is not installed: apt-get install redis-server redis-tools");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the TLS Sentinel did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let upstream = Upstream::start().await;
    let store = format!(
        "store: {{timeout: 2s, on_error: deny, key_prefix: tg, sentinel: {{master_name: \
         tls-master, nodes: [\"rediss://127.0.0.1:{port}\"]}}, tls: {{ca: \"{}\", \
         server_name: redis.internal}}}}",
        pki.path("ca.pem")
    );
    let yaml = Yaml::to(&[upstream.url()])
        .top(&store)
        .route(
            "api",
            "/",
            "limits: [{name: two, algorithm: token_bucket, rate: 1/h, burst: 2}]",
        )
        .build();
    let proxy = Proxy::start(&yaml).await;
    let statuses = three(&proxy).await;
    let _ = sentinel.kill();
    let _ = sentinel.wait();
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(
        master.cli(&pki, &["--scan", "--pattern", "tg:api:*"]),
        "tg:api:two:127.0.0.1"
    );
}

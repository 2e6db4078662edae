//! Test harness: real `redis-server` processes on free ports (killed when dropped), a Redis
//! Cluster made with `redis-cli --cluster create`, a headless Chromium ([`browser`]) and
//! Firefox ([`firefox`]), and small helpers. No mock Redis: a missing `redis-server` fails the
//! test with a message saying how to install it.
#![allow(dead_code)]

pub mod binary;
pub mod browser;
pub mod docs;
pub mod firefox;
pub mod lenient;
pub mod passes;
pub mod pki;
pub mod raw;
pub mod sentinel;
pub mod yaml;

#[allow(unused_imports)] // (only the files that start a proxy declare the pass)
pub(crate) use passes::{both_http1_clients, http1_client, redis_connection};
#[allow(unused_imports)] // (not every test binary writes a config)
pub use yaml::Yaml;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of this test's own.
pub struct Redis {
    pub port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

pub fn free_port() -> u16 {
    // The cluster bus listens on port + 10000, so stay below 55536 and check that one too.
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let port = l.local_addr().expect("local addr").port();
        if port < 55_536 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

fn require(binary: &str) {
    let found = Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .status();
    assert!(
        found.is_ok_and(|s| s.success()),
        "`{binary}` is not installed: these tests need a real Redis \
         (apt-get install redis-server redis-tools)"
    );
}

impl Redis {
    /// Starts a fresh, empty Redis (no persistence) and waits until it answers PING.
    pub fn start() -> Redis {
        Redis::start_with(&[])
    }

    /// Starts Redis with extra `redis-server` arguments (e.g. `--cluster-enabled yes`).
    pub fn start_with(extra: &[&str]) -> Redis {
        require("redis-server");
        let mut redis = Redis {
            port: free_port(),
            child: None,
            dir: tempfile::tempdir().expect("temp dir"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        redis.spawn(true);
        redis
    }

    /// Starts redis-server on `self.port` and waits until it answers PING. A port another
    /// process took between [`free_port`] and the server's bind makes the server exit: a first
    /// start then moves to another port (`may_move`); a restart, whose clients know the port,
    /// fails saying so. (The PING must come from this server, not from whatever holds the port.)
    fn spawn(&mut self, may_move: bool) {
        loop {
            let mut child = Command::new("redis-server")
                .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
                .arg("--dir")
                .arg(self.dir.path())
                .args(&self.extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start redis-server");
            let deadline = Instant::now() + Duration::from_secs(10);
            let exited = loop {
                if let Some(status) = child.try_wait().expect("redis-server's status") {
                    break Some(status);
                }
                if ping(self.port) {
                    // (a server that could not bind exits at once: still running, it is ours)
                    std::thread::sleep(Duration::from_millis(20));
                    match child.try_wait().expect("redis-server's status") {
                        None => break None,
                        Some(status) => break Some(status),
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "redis-server on port {} did not answer PING",
                    self.port
                );
                std::thread::sleep(Duration::from_millis(10));
            };
            match exited {
                None => {
                    self.child = Some(child);
                    return;
                }
                Some(status) if may_move => {
                    eprintln!(
                        "redis-server on port {} exited ({status}): another port",
                        self.port
                    );
                    self.port = free_port();
                }
                Some(status) => panic!(
                    "redis-server could not start again on port {} ({status}): taken meanwhile?",
                    self.port
                ),
            }
        }
    }

    /// `redis://127.0.0.1:PORT/0`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Whether the server runs (it was not killed).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the server (SIGKILL) and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn(false);
    }

    /// Pauses the server (SIGSTOP) or resumes it (SIGCONT).
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill");
        assert!(ok.success());
    }

    /// Waits until the server is blocked (`DEBUG SLEEP`, a long script): a PING on a new
    /// connection gets no answer within 50 ms.
    pub fn wait_blocked(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            s.write_all(b"PING\r\n").unwrap();
            let mut buf = [0u8; 7];
            if s.read_exact(&mut buf).is_err() {
                return;
            }
            assert!(Instant::now() < deadline, "Redis never blocked");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Runs `redis-cli -p PORT ARGS...` and returns its stdout, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }

    /// The directory the server runs in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `redis-cli -p PORT ARGS...`, stdout trimmed; panics when redis-cli fails.
pub fn cli(port: u16, args: &[&str]) -> String {
    require("redis-cli");
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    assert!(
        out.status.success(),
        "redis-cli {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    // a server with a password answers `-NOAUTH…`: it is up all the same
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok()
        && s.read_exact(&mut buf).is_ok()
        && (&buf == b"+PONG\r\n" || buf.starts_with(b"-NOAUTH"))
}

/// A three-master Redis Cluster, made as a user would: three servers with cluster mode on, then
/// `redis-cli --cluster create`.
pub struct Cluster {
    pub nodes: Vec<Redis>,
}

impl Cluster {
    pub fn start() -> Cluster {
        Cluster::start_with(3, 0, &[])
    }

    /// A cluster of `primaries`, each with `replicas` replicas, its servers started with the
    /// `extra` arguments too. A primary is called down after 2 s without an answer, unless
    /// `extra` sets `--cluster-node-timeout`.
    pub fn start_with(primaries: usize, replicas: usize, extra: &[&str]) -> Cluster {
        // (a replica syncs at once: by default the primary waits 5 s for more replicas)
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            "2000",
            "--repl-diskless-sync-delay",
            "0",
        ];
        args.extend(extra); // (a later setting of the same name wins)
        let nodes: Vec<Redis> = (0..primaries * (1 + replicas))
            .map(|_| Redis::start_with(&args))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let replicas = replicas.to_string();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        // (`--cluster create` waits for the nodes to meet with no bound of its own)
        let mut create = Command::new("redis-cli")
            .arg("-p")
            .arg(nodes[0].port.to_string())
            .args(&args)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-cli");
        let deadline = Instant::now() + Duration::from_secs(60);
        while create.try_wait().expect("redis-cli's status").is_none() {
            if Instant::now() > deadline {
                let _ = create.kill();
                panic!("redis-cli --cluster create did not end in 60 s: {args:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &nodes {
            while !node.cli(&["cluster", "info"]).contains("cluster_state:ok") {
                assert!(Instant::now() < deadline, "cluster did not become ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // a replica that has not synced cannot be promoted
        for node in &nodes {
            loop {
                let info = node.cli(&["info", "replication"]);
                if info.contains("role:master") || info.contains("master_link_status:up") {
                    break;
                }
                assert!(Instant::now() < deadline, "a replica did not sync");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Cluster { nodes }
    }

    /// The node that serves `key` now, as the cluster's first live node says.
    pub fn owner(&self, key: &str) -> usize {
        let live = self
            .nodes
            .iter()
            .position(Redis::running)
            .expect("a live node");
        self.owner_seen_by(key, live)
    }

    /// The node that serves `key` now, as node `by` says.
    pub fn owner_seen_by(&self, key: &str, by: usize) -> usize {
        let by = &self.nodes[by];
        let slot: u16 = by.cli(&["cluster", "keyslot", key]).parse().unwrap();
        // `CLUSTER NODES`: id, ip:port@bus, flags, primary, ping, pong, epoch, link, slots...
        for line in by.cli(&["cluster", "nodes"]).lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let serves = fields[8..].iter().any(|range| {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                match (a.parse::<u16>(), b.parse::<u16>()) {
                    (Ok(a), Ok(b)) => (a..=b).contains(&slot),
                    _ => false, // a slot being moved: [slot->-id]
                }
            });
            if serves {
                let port: u16 = fields[1].split(['@', ':']).nth(1).unwrap().parse().unwrap();
                return self.nodes.iter().position(|n| n.port == port).unwrap();
            }
        }
        panic!("no node serves slot {slot}")
    }

    /// The node id of node `i`.
    pub fn id(&self, i: usize) -> String {
        self.nodes[i].cli(&["cluster", "myid"])
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(Redis::url)
            .map(|u| u.trim_end_matches("/0").to_string())
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// A real upstream and a real proxy, in process, on free ports.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// What the upstream saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub version: http::Version,
    pub method: String,
    pub uri: String,
    pub headers: http::HeaderMap,
}

/// A test upstream. Paths it understands:
/// `/slow/MS` waits MS ms before answering; `/status/CODE?retry_after=S` answers CODE;
/// `/echo` streams the request body back; `/bytes/N` streams N bytes; `/trailers` answers
/// "ok" and the trailer `x-checksum: 2a`, declared in `Trailer`; `/version` answers the HTTP
/// version it was asked in; anything else answers 200 "ok". Every request is recorded in
/// `seen`.
pub struct Upstream {
    pub addr: SocketAddr,
    /// it speaks TLS
    tls: bool,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// connections accepted
    connections: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub type TestBody =
    http_body_util::combinators::BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

pub fn full(text: impl Into<Bytes>) -> TestBody {
    Full::new(text.into())
        .map_err(|never| match never {})
        .boxed()
}

async fn upstream_handle(
    req: Request<Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> Response<TestBody> {
    seen.lock().unwrap().push(Seen {
        at: Instant::now(),
        version: req.version(),
        method: req.method().to_string(),
        uri: req.uri().to_string(),
        headers: req.headers().clone(),
    });
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["slow", ms] => {
            tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
            Response::new(full("slow ok"))
        }
        ["status", code] => {
            let mut resp = Response::new(full("status"));
            *resp.status_mut() = http::StatusCode::from_u16(code.parse().unwrap_or(500)).unwrap();
            if let Some(s) = query.strip_prefix("retry_after=") {
                resp.headers_mut().insert("retry-after", s.parse().unwrap());
            }
            resp
        }
        ["echo"] => Response::new(req.into_body().map_err(|e| e.into()).boxed()),
        ["bytes", n] => {
            let total: u64 = n.parse().unwrap_or(0);
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            let stream = futures_stream(total, chunk);
            Response::new(StreamBody::new(stream).boxed())
        }
        ["trailers"] => {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("x-checksum", http::HeaderValue::from_static("2a"));
            let frames: Vec<Result<Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>>> = vec![
                Ok(Frame::data(Bytes::from_static(b"ok"))),
                Ok(Frame::trailers(trailers)),
            ];
            let mut resp = Response::new(StreamBody::new(iter_stream(frames)).boxed());
            resp.headers_mut()
                .insert("trailer", http::HeaderValue::from_static("x-checksum"));
            resp
        }
        ["version"] => Response::new(full(format!("{:?}", req.version()))),
        _ => Response::new(full("ok")),
    }
}

/// A stream of `items`, one at a time.
pub fn iter_stream<T: Unpin>(items: Vec<T>) -> impl futures_core::Stream<Item = T> {
    struct S<T>(std::collections::VecDeque<T>);
    impl<T: Unpin> futures_core::Stream for S<T> {
        type Item = T;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<T>> {
            std::task::Poll::Ready(self.0.pop_front())
        }
    }
    S(items.into())
}

fn futures_stream(
    total: u64,
    chunk: Bytes,
) -> impl futures_core::Stream<Item = Result<Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>>>
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let mut left = total;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            if tx.send(Ok(Frame::data(chunk.slice(..n)))).await.is_err() {
                return;
            }
            left -= n as u64;
        }
    });
    tokio_stream_from(rx)
}

fn tokio_stream_from<T>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_core::Stream<Item = T> {
    struct S<T>(tokio::sync::mpsc::Receiver<T>);
    impl<T> futures_core::Stream for S<T> {
        type Item = T;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<T>> {
            self.0.poll_recv(cx)
        }
    }
    let _ = &mut rx;
    S(rx)
}

impl Upstream {
    /// Starts the upstream on a free port.
    pub async fn start() -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Upstream::serve(listener).await
    }

    /// Serves on `listener` (to restart an upstream on the same port).
    pub async fn serve(listener: tokio::net::TcpListener) -> Upstream {
        Upstream::serve_over(listener, None).await
    }

    /// Starts the upstream on a free port, speaking TLS as `tls` says: HTTP/2 when it offers
    /// `h2` by ALPN and the client takes it.
    pub async fn start_tls(tls: Arc<rustls::ServerConfig>) -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Upstream::serve_over(listener, Some(tokio_rustls::TlsAcceptor::from(tls))).await
    }

    async fn serve_over(
        listener: tokio::net::TcpListener,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Upstream {
        let addr = listener.local_addr().unwrap();
        let is_tls = tls.is_some();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let accepted = connections.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let seen = seen2.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let seen = seen.clone();
                        async move { Ok::<_, Infallible>(upstream_handle(req, seen).await) }
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let _ = match tls {
                        None => builder.serve_connection(TokioIo::new(stream), svc).await,
                        Some(tls) => match tls.accept(stream).await {
                            Ok(stream) => builder.serve_connection(TokioIo::new(stream), svc).await,
                            // a client that refuses the certificate, or has none to show
                            Err(_) => Ok(()),
                        },
                    };
                });
            }
        });
        Upstream {
            addr,
            tls: is_tls,
            seen,
            connections,
            task,
        }
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The connections it has accepted so far.
    #[allow(dead_code)] // not every test binary counts them
    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A tollgate running in this process with a config given as text.
pub struct Proxy {
    pub addr: SocketAddr,
    /// the admin listener, when the config has one
    pub admin: Option<SocketAddr>,
    /// the refused clients `/api/stats` lists: `skip` moves their clock on
    pub refusals: std::sync::Arc<tollgate::refusals::Refusals>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub done: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Proxy {
    /// Starts tollgate with `yaml` (which should `listen: 127.0.0.1:0`). Without `workers` it
    /// runs two, whatever the machine's cores: the hand-over of connections between threads is
    /// exercised on every machine, and a large one does not start dozens of threads per test.
    pub async fn start(yaml: &str) -> Proxy {
        passes::require_http1_pass();
        let mut loaded = tollgate::config::parse(yaml, "test.yaml", &|_| None)
            .unwrap_or_else(|e| panic!("test config invalid:\n{e}"));
        loaded.config.workers = loaded.config.workers.or(std::num::NonZeroUsize::new(2));
        let server = tollgate::app::Server::bind_over(loaded.config, http1_client())
            .await
            .expect("bind");
        let addr = server.local_addrs()[0];
        let admin = server.admin_addr();
        let refusals = server.refusals();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let done = tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        Proxy {
            addr,
            admin,
            refusals,
            stop: Some(stop),
            done: Some(done),
        }
    }

    /// Starts tollgate from the file at `path`, reloading it when it changes (as the binary does).
    pub async fn start_watching(path: &Path) -> Proxy {
        passes::require_http1_pass();
        let loaded =
            tollgate::config::load(path).unwrap_or_else(|e| panic!("test config invalid:\n{e}"));
        let server = tollgate::app::Server::bind_over(loaded.config, http1_client())
            .await
            .expect("bind");
        let addr = server.local_addrs()[0];
        let admin = server.admin_addr();
        let refusals = server.refusals();
        let watcher = server.reloader().watch(path.to_path_buf());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let done = tokio::spawn(async move {
            let result = server
                .run(async move {
                    let _ = stopped.await;
                })
                .await;
            watcher.abort();
            result
        });
        Proxy {
            addr,
            admin,
            refusals,
            stop: Some(stop),
            done: Some(done),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Triggers the graceful shutdown and waits for it.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            done.await.unwrap().unwrap();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            done.abort();
        }
    }
}

/// A small HTTP/1.1 client: one pooled hyper client for the test.
pub fn http_client(
) -> hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, TestBody>
{
    hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http()
}

/// A finished response: status, headers, body text.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// GET `url` with extra headers; the whole answer.
pub async fn get(url: &str, headers: &[(&str, &str)]) -> Answer {
    let mut req = Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    send(req.body(full("")).unwrap()).await
}

/// Sends a request with a fresh connection-pooled client; the whole answer.
pub async fn send(req: Request<TestBody>) -> Answer {
    let resp = http_client().request(req).await.expect("request");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).to_string(),
    }
}

/// Waits until `probe` holds, polling; panics after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !probe().await {
        assert!(
            Instant::now() < deadline,
            "condition not reached within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Milliseconds left of the current clock hour: what a `fixed_window` of `1h` has left (its
/// windows start on the epoch's hours).
pub fn hour_left_ms() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    3_600_000 - (now.as_millis() % 3_600_000) as u64
}

/// Waits out the end of the clock hour when less than `margin` of it is left, so that a test
/// reading an hourly window's answers cannot see the window end under it. Returns what is left
/// of the hour then, in milliseconds.
pub async fn clear_of_hour_end(margin: Duration) -> u64 {
    let left = hour_left_ms();
    if left < margin.as_millis() as u64 {
        tokio::time::sleep(Duration::from_millis(left + 200)).await;
    }
    hour_left_ms()
}

/// A local port on which nothing listens, held (bound, not listening) while this lives, so no
/// other test's server takes it meanwhile: a connection to it is refused.
pub struct DeadPort(tokio::net::TcpSocket);

impl DeadPort {
    pub fn new() -> DeadPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket
            .bind("127.0.0.1:0".parse().expect("an address"))
            .expect("bind a free port");
        DeadPort(socket)
    }

    pub fn port(&self) -> u16 {
        self.0.local_addr().expect("bound").port()
    }
}

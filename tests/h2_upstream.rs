//! HTTP/2 upstreams that misbehave the way real ones do, and how tollgate heals: a peer that
//! accepts TCP and never sends SETTINGS, a connection that goes silent (a TCP relay in the
//! test stops forwarding on it), streams the peer never processed (GOAWAY below them,
//! REFUSED_STREAM), a peer that allows 2 streams at a time, and real nginx over h2c closing
//! its connections every 50 requests.
//!
//! The servers are real: the `h2` crate's server, a raw-frame server where a precise GOAWAY is
//! needed, and Debian's nginx.

mod common;
common::both_http1_clients!();

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{get, http_client, Proxy, Yaml};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the `h2`-crate upstream does.
#[derive(Clone, Default)]
struct Behaviour {
    /// its SETTINGS_MAX_CONCURRENT_STREAMS
    max_streams: Option<u32>,
    /// how long it takes over each request
    delay: Duration,
    /// the first this many streams of its first connection are refused with REFUSED_STREAM
    refuse_first: usize,
}

/// Counts kept by a test upstream.
#[derive(Default)]
struct Counts {
    /// requests answered
    processed: AtomicUsize,
    /// TCP connections accepted
    connections: AtomicUsize,
    /// streams seen (refused or not)
    streams: AtomicUsize,
    /// streams refused
    refused: AtomicUsize,
    /// most streams being answered at once
    most_at_once: AtomicUsize,
    at_once: AtomicUsize,
}

impl Counts {
    fn get(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }
}

/// An HTTP/2 (h2c) server made with the `h2` crate, answering each request with its body's
/// length.
async fn h2_upstream(behaviour: Behaviour) -> (SocketAddr, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut b = behaviour.clone();
            if c.connections.fetch_add(1, Ordering::SeqCst) > 0 {
                b.refuse_first = 0;
            }
            tokio::spawn(serve_h2(tcp, b, c.clone()));
        }
    });
    (addr, counts)
}

async fn serve_h2(tcp: TcpStream, b: Behaviour, counts: Arc<Counts>) {
    let mut builder = h2::server::Builder::new();
    if let Some(n) = b.max_streams {
        builder.max_concurrent_streams(n);
    }
    let Ok(mut conn) = builder.handshake::<_, Bytes>(tcp).await else {
        return;
    };
    let mut streams = 0;
    while let Some(Ok((req, mut respond))) = conn.accept().await {
        counts.streams.fetch_add(1, Ordering::SeqCst);
        streams += 1;
        if streams <= b.refuse_first {
            counts.refused.fetch_add(1, Ordering::SeqCst);
            respond.send_reset(h2::Reason::REFUSED_STREAM);
            continue;
        }
        let counts = counts.clone();
        tokio::spawn(async move {
            let now = counts.at_once.fetch_add(1, Ordering::SeqCst) + 1;
            counts.most_at_once.fetch_max(now, Ordering::SeqCst);
            let mut body = req.into_body();
            let mut len = 0;
            while let Some(Ok(chunk)) = body.data().await {
                len += chunk.len();
                let _ = body.flow_control().release_capacity(chunk.len());
            }
            tokio::time::sleep(b.delay).await;
            counts.at_once.fetch_sub(1, Ordering::SeqCst);
            counts.processed.fetch_add(1, Ordering::SeqCst);
            let resp = http::Response::builder().status(200).body(()).unwrap();
            if let Ok(mut send) = respond.send_response(resp, false) {
                let _ = send.send_data(Bytes::from(len.to_string()), true);
            }
        });
    }
}

/// A server that accepts TCP connections and never sends a byte on them.
async fn mute_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    addr
}

/// A TCP relay to `to` whose [`Relay::silence`] stops every connection it has from forwarding
/// another byte (the sockets stay open), while new connections are relayed as before: a
/// middlebox dropping a flow.
struct Relay {
    addr: SocketAddr,
    epoch: tokio::sync::watch::Sender<u64>,
}

impl Relay {
    async fn start(to: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (epoch, _) = tokio::sync::watch::channel(0u64);
        let epochs = epoch.clone();
        tokio::spawn(async move {
            while let Ok((mut a, _)) = listener.accept().await {
                let mut rx = epochs.subscribe();
                let mine = *rx.borrow();
                tokio::spawn(async move {
                    let mut b = TcpStream::connect(to).await.unwrap();
                    let silenced = {
                        let copy = tokio::io::copy_bidirectional(&mut a, &mut b);
                        tokio::select! {
                            _ = copy => false,
                            _ = rx.wait_for(|e| *e != mine) => true,
                        }
                    };
                    if silenced {
                        std::future::pending::<()>().await;
                    }
                });
            }
        });
        Relay { addr, epoch }
    }

    fn silence(&self) {
        self.epoch.send_modify(|e| *e += 1);
    }
}

fn url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

/// A target that accepts TCP but never sends its SETTINGS is one that could not be connected
/// to: within `upstream_connect` the request goes to the other target, which answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_settings_fails_the_connect_in_time() {
    let mute = mute_upstream().await;
    let (good, counts) = h2_upstream(Behaviour::default()).await;
    let yaml = Yaml::to(&[url(mute), url(good)])
        .top("timeouts: {upstream_connect: 500ms, upstream_response: 20s}")
        .upstream("protocol: http2")
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    for _ in 0..4 {
        let began = Instant::now();
        let answer = get(&proxy.url("/"), &[]).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "took {:?}: the handshake waited past upstream_connect",
            began.elapsed()
        );
    }
    assert_eq!(Counts::get(&counts.processed), 4);
    proxy.shutdown().await;
}

/// Sends a GET to `url` every `every` for `for_`; each request's send time (from now) and
/// status, in the order sent.
async fn steady_gets(url: String, every: Duration, for_: Duration) -> Vec<(Duration, u16)> {
    let began = Instant::now();
    let mut sent = Vec::new();
    while began.elapsed() < for_ {
        let url = url.clone();
        let at = began.elapsed();
        sent.push(tokio::spawn(
            async move { (at, get(&url, &[]).await.status) },
        ));
        tokio::time::sleep(every).await;
    }
    let mut answers = Vec::new();
    for t in sent {
        answers.push(t.await.unwrap());
    }
    answers
}

/// When the requests succeed again for good: the send time of the first of the last run of
/// 200s, and how many failed before it.
fn healed(answers: &[(Duration, u16)]) -> (Option<Duration>, usize) {
    let tail = answers.iter().rev().take_while(|(_, s)| *s == 200).count();
    let first_ok = answers.len() - tail;
    let failed = answers[..first_ok]
        .iter()
        .filter(|(_, s)| *s != 200)
        .count();
    (answers.get(first_ok).map(|(at, _)| *at), failed)
}

/// A connection that goes silent fails a PING and is replaced: requests fail for about the
/// keepalive interval + timeout (2 s here), then succeed on a fresh connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_replaced_after_a_failed_ping() {
    let (upstream, counts) = h2_upstream(Behaviour::default()).await;
    let relay = Relay::start(upstream).await;
    let yaml = Yaml::to(&[url(relay.addr)])
        .top("timeouts: {upstream_response: 10s}")
        .upstream("protocol: http2\nhttp2: {keepalive_interval: 1s, keepalive_timeout: 1s}")
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    assert_eq!(get(&proxy.url("/"), &[]).await.status, 200);
    relay.silence();
    let answers = steady_gets(
        proxy.url("/"),
        Duration::from_millis(100),
        Duration::from_secs(6),
    )
    .await;
    let (healed, failed) = healed(&answers);
    eprintln!(
        "silent connection: {failed} of {} requests failed; all succeed from {healed:?} on",
        answers.len()
    );
    let healed = healed.unwrap_or_else(|| panic!("never healed: {answers:?}"));
    // interval + timeout is 2 s; a wide margin for a busy machine
    assert!(healed < Duration::from_millis(4500), "{answers:?}");
    assert!(failed <= 45, "{answers:?}");
    assert!(Counts::get(&counts.connections) >= 2);
    proxy.shutdown().await;
}

/// A request that times out on a connection that stayed silent retires the connection, even
/// before a PING would tell: the next request goes over a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_on_a_silent_connection_retires_it() {
    let (upstream, counts) = h2_upstream(Behaviour::default()).await;
    let relay = Relay::start(upstream).await;
    let yaml = Yaml::to(&[url(relay.addr)])
        .top("timeouts: {upstream_response: 2s}")
        .upstream("protocol: http2\nhttp2: {keepalive_interval: 60s, keepalive_timeout: 20s}")
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    assert_eq!(get(&proxy.url("/"), &[]).await.status, 200);
    relay.silence();
    assert_eq!(get(&proxy.url("/"), &[]).await.status, 504);
    // (kept, the connection would answer nothing until the PING in 60 s; a retry or two
    // allows for a loaded machine)
    let mut next = Vec::new();
    for _ in 0..3 {
        next.push(get(&proxy.url("/"), &[]).await.status);
        if next.last() == Some(&200) {
            break;
        }
    }
    assert_eq!(next.last(), Some(&200), "{next:?}");
    assert!(Counts::get(&counts.connections) >= 2);
    proxy.shutdown().await;
}

/// Streams refused with REFUSED_STREAM were not processed: each goes again, once, on another
/// connection, a POST with its body as well as a GET; the upstream processes each request
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_streams_are_sent_again() {
    let (upstream, counts) = h2_upstream(Behaviour {
        refuse_first: 6,
        ..Behaviour::default()
    })
    .await;
    let yaml = Yaml::to(&[url(upstream)])
        .upstream("protocol: http2")
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    let client = http_client();
    let requests = (0..12).map(|i| {
        let body = "x".repeat(i * 1000);
        let req = http::Request::post(proxy.url("/"))
            .body(common::full(body))
            .unwrap();
        let client = client.clone();
        tokio::spawn(async move {
            let resp = client.request(req).await.unwrap();
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).to_string(), i)
        })
    });
    for answer in futures_util::future::join_all(requests).await {
        let (status, body, i) = answer.unwrap();
        assert_eq!((status, body), (200, (i * 1000).to_string()), "request {i}");
    }
    // (the first refusal retires the connection: later requests go over the next one)
    let refused = Counts::get(&counts.refused);
    assert!(refused >= 1, "nothing was refused");
    assert_eq!(Counts::get(&counts.processed), 12);
    assert_eq!(Counts::get(&counts.streams), 12 + refused);
    proxy.shutdown().await;
}

/// A raw HTTP/2 server whose first connection takes `hold` streams, then sends GOAWAY with the
/// `last_stream_id` of the first two, answers those two, and ignores the rest (as nginx does at
/// `keepalive_requests`). Later connections answer every stream.
async fn goaway_upstream(hold: usize) -> (SocketAddr, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let first = c.connections.fetch_add(1, Ordering::SeqCst) == 0;
            tokio::spawn(serve_raw(tcp, first.then_some(hold), c.clone()));
        }
    });
    (addr, counts)
}

/// A frame: 9-byte header and payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// `:status: 200` (HPACK static index 8), END_HEADERS | END_STREAM.
fn ok(stream: u32) -> Vec<u8> {
    frame(0x1, 0x5, stream, &[0x88])
}

async fn serve_raw(mut tcp: TcpStream, hold: Option<usize>, counts: Arc<Counts>) {
    let mut preface = [0u8; 24];
    if tcp.read_exact(&mut preface).await.is_err() {
        return;
    }
    let _ = tcp.write_all(&frame(0x4, 0, 0, &[])).await;
    let mut held = Vec::new();
    let mut gone_away = false;
    loop {
        let mut head = [0u8; 9];
        if tcp.read_exact(&mut head).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        if tcp.read_exact(&mut payload).await.is_err() {
            return;
        }
        let reply = match (kind, flags & 1) {
            (0x4, 0) => frame(0x4, 1, 0, &[]),
            (0x6, 0) => frame(0x6, 1, 0, &payload),
            (0x1, _) if gone_away => continue,
            (0x1, _) => match hold {
                None => {
                    counts.processed.fetch_add(1, Ordering::SeqCst);
                    ok(stream)
                }
                Some(hold) => {
                    held.push(stream);
                    if held.len() < hold {
                        continue;
                    }
                    gone_away = true;
                    let mut goaway = held[1].to_be_bytes().to_vec();
                    goaway.extend_from_slice(&0u32.to_be_bytes());
                    let mut out = frame(0x7, 0, 0, &goaway);
                    for s in &held[..2] {
                        counts.processed.fetch_add(1, Ordering::SeqCst);
                        out.extend(ok(*s));
                    }
                    out
                }
            },
            _ => continue,
        };
        if tcp.write_all(&reply).await.is_err() {
            return;
        }
    }
}

/// Streams above a GOAWAY's `last_stream_id` were not processed: each goes again on a new
/// connection, and every client gets 200; the upstream processes each request once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_above_a_goaway_are_sent_again() {
    let (upstream, counts) = goaway_upstream(6).await;
    let yaml = Yaml::to(&[url(upstream)])
        .upstream("protocol: http2")
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    let burst = (0..20).map(|_| {
        let url = proxy.url("/");
        tokio::spawn(async move { get(&url, &[]).await.status })
    });
    let statuses: Vec<u16> = futures_util::future::join_all(burst)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(Counts::get(&counts.processed), 20);
    assert!(Counts::get(&counts.connections) >= 2);
    proxy.shutdown().await;
}

/// A connection whose streams are all in use is not a slow upstream: against an upstream that
/// allows 2 streams and takes 300 ms over each, 60 requests at once all get 200 within a 2 s
/// `upstream_response`; tollgate opens more connections, up to `max_connections`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_connection_opens_another_and_waits_without_timing_out() {
    let (upstream, counts) = h2_upstream(Behaviour {
        max_streams: Some(2),
        delay: Duration::from_millis(300),
        ..Behaviour::default()
    })
    .await;
    let yaml = Yaml::to(&[url(upstream)])
        .top("timeouts: {upstream_response: 2s}")
        .upstream("protocol: http2\nhttp2: {max_connections: 4}")
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    let burst = (0..60).map(|_| {
        let url = proxy.url("/");
        tokio::spawn(async move { get(&url, &[]).await.status })
    });
    let statuses: Vec<u16> = futures_util::future::join_all(burst)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(Counts::get(&counts.processed), 60);
    let conns = Counts::get(&counts.connections);
    assert!((2..=4).contains(&conns), "{conns} connections");
    assert!(Counts::get(&counts.most_at_once) <= 8);
    proxy.shutdown().await;
}

/// Real nginx over h2c with `keepalive_requests 50` sends GOAWAY on its own every 50 streams:
/// 2 000 requests at 20 concurrent all get 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_closing_connections_costs_no_request() {
    let nginx = Nginx::start();
    let yaml = Yaml::to(&[nginx.url()])
        .upstream("protocol: http2")
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    let client = http_client();
    let began = Instant::now();
    let workers = (0..20).map(|_| {
        let (client, url) = (client.clone(), proxy.url("/"));
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..100 {
                let req = http::Request::get(&url).body(common::full("")).unwrap();
                let resp = client.request(req).await.unwrap();
                statuses.push(resp.status().as_u16());
                let _ = resp.into_body().collect().await;
            }
            statuses
        })
    });
    let mut statuses = Vec::new();
    for w in futures_util::future::join_all(workers).await {
        statuses.extend(w.unwrap());
    }
    let bad: Vec<&u16> = statuses.iter().filter(|s| **s != 200).collect();
    eprintln!(
        "nginx keepalive_requests 50: {} requests in {:?}, {} not 200",
        statuses.len(),
        began.elapsed(),
        bad.len()
    );
    assert_eq!(statuses.len(), 2000);
    assert!(
        bad.is_empty(),
        "{} not 200: {:?}",
        bad.len(),
        &bad[..bad.len().min(20)]
    );
    proxy.shutdown().await;
}

/// Debian's nginx serving h2c on a free port, closing connections every 50 requests.
struct Nginx {
    port: u16,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Nginx {
    fn start() -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let d = dir.path().display();
        let conf = format!(
            // one process, no master: killing it at the end leaves no orphaned worker behind
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d};\n  proxy_temp_path {d};\n\
               fastcgi_temp_path {d};\n  uwsgi_temp_path {d};\n  scgi_temp_path {d};\n\
               server {{\n    listen 127.0.0.1:{port} http2;\n    keepalive_requests 50;\n\
                 location / {{ return 200 \"ok\"; }}\n  }}\n}}\n"
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let child = std::process::Command::new("nginx")
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&path)
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .spawn()
            .expect("nginx is installed (scripts/test installs nginx-light)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nginx did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Nginx {
            port,
            child,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! A client that leaves before a charged response says what it used: tollgate reads the rest
//! of the upstream's answer, discards it, and charges the trailer's number; or `charge.missing`
//! when none comes, the upstream runs past the drain's bound, or ends without one. On real
//! Redis, over HTTP/1 and HTTP/2 to the client and to the upstream.

mod common;
common::both_http1_clients!();

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::yaml::Yaml;
use common::{eventually, get, Proxy, Redis};
use http_body_util::StreamBody;
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

type Sent = Result<Frame<Bytes>, Infallible>;

/// The first chunk of every answer: a client has read it when it holds this.
const FIRST: &[u8] = b"first chunk of the answer;";

/// The pause before an answer's last part: the client hangs up in it.
const PAUSE: Duration = Duration::from_millis(400);

/// An LLM-like upstream that streams its answers. `/used/N`: one chunk, with `x-tokens-used:
/// N` in the head. `/trailer/N`: two chunks, a pause, a chunk and the trailer
/// `x-tokens-used: N`. `/silent`: the same without a trailer. `/endless`: a
/// chunk every 50 ms, for ever. `/flood`: 64 KiB chunks as fast as they are taken, for ever.
/// `cut` counts the answers whose reader went away before their end; `conns` the connections
/// accepted.
struct LlmUpstream {
    url: String,
    cut: Arc<AtomicUsize>,
    conns: Arc<AtomicUsize>,
}

impl LlmUpstream {
    async fn start() -> LlmUpstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let cut = Arc::new(AtomicUsize::new(0));
        let conns = Arc::new(AtomicUsize::new(0));
        let (counter, accepted) = (cut.clone(), conns.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                accepted.fetch_add(1, Ordering::SeqCst);
                let cut = counter.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let cut = cut.clone();
                        async move { Ok::<_, Infallible>(answer(req.uri().path(), cut)) }
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        LlmUpstream { url, cut, conns }
    }

    fn cut(&self) -> usize {
        self.cut.load(Ordering::SeqCst)
    }

    fn conns(&self) -> usize {
        self.conns.load(Ordering::SeqCst)
    }
}

fn answer(path: &str, cut: Arc<AtomicUsize>) -> Response<StreamBody<ReceiverStream<Sent>>> {
    let (tx, rx) = mpsc::channel::<Sent>(2);
    let owned = path.to_owned();
    tokio::spawn(async move {
        let sent = stream(&owned, &tx).await;
        if sent.is_none() {
            cut.fetch_add(1, Ordering::SeqCst);
        }
    });
    let mut resp = Response::builder().header("trailer", "x-tokens-used");
    if let Some(n) = path.strip_prefix("/used/") {
        resp = resp.header("x-tokens-used", n);
    }
    resp.body(StreamBody::new(ReceiverStream::new(rx))).unwrap()
}

/// Sends the answer to `path` into `tx`; `None` when the reader went away first.
async fn stream(path: &str, tx: &mpsc::Sender<Sent>) -> Option<()> {
    let data = |b: &[u8]| Ok(Frame::data(Bytes::copy_from_slice(b)));
    tx.send(data(FIRST)).await.ok()?;
    match path.trim_start_matches('/').split('/').collect::<Vec<_>>()[..] {
        ["trailer", n] | ["silent", n] => {
            tx.send(data(b" more of it;")).await.ok()?;
            tokio::time::sleep(PAUSE).await;
            tx.send(data(b" the end.")).await.ok()?;
            if path.starts_with("/trailer") {
                let mut trailers = http::HeaderMap::new();
                trailers.insert("x-tokens-used", n.parse().unwrap());
                tx.send(Ok(Frame::trailers(trailers))).await.ok()?;
            }
        }
        ["endless"] => loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            tx.send(data(b" and more;")).await.ok()?;
        },
        ["flood"] => {
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            loop {
                tx.send(Ok(Frame::data(chunk.clone()))).await.ok()?;
            }
        }
        _ => {}
    }
    Some(())
}

/// A slow-refilling bucket of 1000 on route `api`, charged `x-tokens-used`, with `charge`'s
/// other keys in `more` (`", missing: 300"`), over `protocol` to the upstream, whose answers
/// may pause for `response_timeout` (the drain's bound).
fn config(redis: &Redis, upstream: &str, protocol: &str, more: &str, timeout: &str) -> String {
    let limits = format!(
        "limits:\n  - name: tokens\n    algorithm: token_bucket\n    rate: 1/h\n    burst: 1000\n    charge: {{response_header: x-tokens-used{more}}}\n"
    );
    // (one worker: one pool of upstream connections, to see which is used again)
    Yaml::to(&[upstream])
        .top("workers: 1")
        .redis(redis, "")
        .upstream(&format!("protocol: {protocol}"))
        .top("admin: {listen: 127.0.0.1:0}")
        .top(&format!("timeouts: {{upstream_response: {timeout}}}"))
        .route("api", "/", &limits)
        .build()
}

/// The tokens left in the bucket, as the `RateLimit` header of a request that used none
/// shows them (its admission takes one, its charge gives it back).
async fn left(proxy: &Proxy) -> u64 {
    let answer = get(&proxy.url("/used/0"), &[]).await;
    let rl = answer.header("ratelimit").expect("a RateLimit header");
    let r = rl.split(';').find_map(|p| p.strip_prefix("r="));
    r.and_then(|r| r.parse::<u64>().ok()).expect(rl) + 1
}

/// Waits up to `limit` for the bucket to hold `want` tokens; panics with what it holds.
async fn holds(proxy: &Proxy, want: u64, limit: Duration) {
    let start = Instant::now();
    loop {
        let now = left(proxy).await;
        if now == want {
            return;
        }
        assert!(start.elapsed() < limit, "{now} tokens left, not {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of `tollgate_charge_unread_total` for `reason`.
async fn unread(proxy: &Proxy, reason: &str) -> u64 {
    let admin = format!("http://{}/metrics", proxy.admin.unwrap());
    let text = get(&admin, &[]).await.body;
    let series = format!(
        "tollgate_charge_unread_total{{route=\"api\",limit=\"tokens\",reason=\"{reason}\"}} "
    );
    let value = text.lines().find_map(|l| l.strip_prefix(&series));
    value
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .parse()
        .unwrap()
}

/// Over HTTP/1: asks for `path`, reads the head and the first chunk, and closes the socket.
async fn hang_up_h1(proxy: SocketAddr, path: &str) {
    let mut tcp = TcpStream::connect(proxy).await.unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nhost: api\r\nte: trailers\r\n\r\n");
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !contains(&got, FIRST) {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the first chunk: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 200"), "{got:?}");
}

/// Over HTTP/2 (h2c): asks for `path`, reads the head and the first chunk, then resets the
/// stream (`reset`) or closes the connection.
async fn hang_up_h2(proxy: SocketAddr, path: &str, reset: bool) {
    let tcp = TcpStream::connect(proxy).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.expect("h2c handshake");
    let conn = tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let req = Request::get(format!("http://api{path}"))
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut send) = client.send_request(req, true).unwrap();
    let response = response.await.expect("a response");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = body.data().await.expect("a chunk").unwrap();
    assert!(contains(&first, FIRST), "{first:?}");
    if reset {
        send.send_reset(h2::Reason::CANCEL);
        // (the reset goes out with the connection's next write: give it a moment to)
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop((body, send, client));
    conn.abort();
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The attack: a client reads the head and the first chunk of a streamed answer, then leaves
/// in the pause before its trailer. tollgate reads on and charges the trailer's 500, whichever
/// protocol the client and the upstream speak; the upstream's answer is not cut, and its
/// connection, read to the end, serves the next request.
#[tokio::test]
async fn a_hang_up_before_the_trailer_is_charged_the_trailer() {
    let redis = Redis::start();
    let upstream = LlmUpstream::start().await;
    for protocol in ["http1", "http2"] {
        for client in ["h1 close", "h2 reset", "h2 close"] {
            redis.cli(&["flushall"]);
            let proxy = Proxy::start(&config(&redis, &upstream.url, protocol, "", "5s")).await;
            let (was_cut, had) = (upstream.cut(), upstream.conns());
            match client {
                "h1 close" => hang_up_h1(proxy.addr, "/trailer/500").await,
                "h2 reset" => hang_up_h2(proxy.addr, "/trailer/500", true).await,
                _ => hang_up_h2(proxy.addr, "/trailer/500", false).await,
            }
            // (past the trailer, so the next request finds the connection idle)
            tokio::time::sleep(PAUSE + Duration::from_millis(500)).await;
            // 1000, less the 500 the trailer reported
            holds(&proxy, 500, Duration::from_secs(5)).await;
            assert_eq!(
                upstream.cut(),
                was_cut,
                "{protocol}, {client}: the upstream was cut"
            );
            assert_eq!(
                upstream.conns(),
                had + 1,
                "{protocol}, {client}: connections"
            );
            assert_eq!(unread(&proxy, "missing").await, 0, "{protocol}, {client}");
            proxy.shutdown().await;
        }
    }
}

/// An answer that ends without the number is charged `missing`, whether its client read it
/// all or left in its pause; without `missing`, it is charged its cost only, as before.
#[tokio::test]
async fn an_answer_without_its_number_is_charged_missing() {
    let redis = Redis::start();
    let upstream = LlmUpstream::start().await;
    let proxy = Proxy::start(&config(
        &redis,
        &upstream.url,
        "http1",
        ", missing: 300",
        "5s",
    ))
    .await;
    let whole = get(&proxy.url("/silent/0"), &[("te", "trailers")]).await;
    assert_eq!(whole.status, 200);
    assert!(whole.body.ends_with("the end."), "{}", whole.body);
    holds(&proxy, 700, Duration::from_secs(5)).await;
    hang_up_h1(proxy.addr, "/silent/0").await;
    holds(&proxy, 400, Duration::from_secs(5)).await;
    assert_eq!(unread(&proxy, "missing").await, 2);
    assert_eq!(unread(&proxy, "drain_bound").await, 0);
    proxy.shutdown().await;

    redis.cli(&["flushall"]);
    let proxy = Proxy::start(&config(&redis, &upstream.url, "http1", "", "5s")).await;
    hang_up_h1(proxy.addr, "/silent/0").await;
    // counted missing once the answer has ended: then one token for it, none more
    eventually(Duration::from_secs(5), || async {
        unread(&proxy, "missing").await == 1
    })
    .await;
    holds(&proxy, 999, Duration::from_secs(5)).await;
}

/// An upstream that never ends, and never reports, is read for `timeouts.upstream_response`
/// after the client leaves; one that floods is read up to 8 MiB, long before that time. Then
/// the drain stops, cuts the upstream's answer, charges `missing` and counts the answer as
/// unread at the bound.
#[tokio::test]
async fn a_drain_stops_at_its_bound_and_charges_missing() {
    let redis = Redis::start();
    let upstream = LlmUpstream::start().await;
    for protocol in ["http1", "http2"] {
        for (path, timeout) in [("/endless", "1s"), ("/flood", "60s")] {
            redis.cli(&["flushall"]);
            let yaml = config(&redis, &upstream.url, protocol, ", missing: 300", timeout);
            let proxy = Proxy::start(&yaml).await;
            let was_cut = upstream.cut();
            let left_at = Instant::now();
            hang_up_h1(proxy.addr, path).await;
            holds(&proxy, 700, Duration::from_secs(20)).await;
            let took = left_at.elapsed();
            // (wide margins for a busy machine: the time bound is 1 s; 8 MiB on loopback takes
            // well under a second, against a bound of a minute)
            match path {
                "/endless" => assert!(took >= Duration::from_millis(900), "{protocol}: {took:?}"),
                _ => assert!(took < Duration::from_secs(15), "{protocol}: {took:?}"),
            }
            assert_eq!(unread(&proxy, "drain_bound").await, 1, "{protocol} {path}");
            assert_eq!(unread(&proxy, "missing").await, 0, "{protocol} {path}");
            let cut = || async { upstream.cut() == was_cut + 1 };
            common::eventually(Duration::from_secs(5), cut).await;
            proxy.shutdown().await;
        }
    }
}

/// A shutdown that begins while a drain reads waits for it, within `timeouts.shutdown`: the
/// trailer's 500 is charged before tollgate exits, as a second instance on the same Redis
/// sees.
#[tokio::test]
async fn shutdown_waits_for_a_drain() {
    let redis = Redis::start();
    let upstream = LlmUpstream::start().await;
    let yaml = config(&redis, &upstream.url, "http1", "", "5s");
    let first = Proxy::start(&yaml).await;
    hang_up_h1(first.addr, "/trailer/500").await;
    let stopping = Instant::now();
    first.shutdown().await;
    // (the drain waits out the upstream's pause; the default `timeouts.shutdown` is 30 s)
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(10), "shutdown took {took:?}");
    let second = Proxy::start(&yaml).await;
    assert_eq!(left(&second).await, 500);
}

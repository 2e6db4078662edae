//! `algorithm: concurrency` and `pace: {concurrency: N}` against a real Redis, real sockets and
//! an upstream that holds each response open until the test lets it finish.

mod common;
common::both_http1_clients!();

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::yaml::Yaml;
use common::{eventually, get, http_client, Proxy, Redis, TestBody};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

/// An upstream whose `/hold` responses stream a byte every 50 ms until the test lets one
/// finish ([`Holding::finish`]); `/slow/MS` answers after MS ms; `/ws` accepts a WebSocket
/// upgrade and keeps the tunnel until the client closes it. It counts what is in flight.
struct Holding {
    addr: std::net::SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

struct State {
    in_flight: AtomicUsize,
    most: AtomicUsize,
    /// a permit lets one `/hold` response end
    finish: Semaphore,
}

impl State {
    fn enter(&self) {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Holding {
    async fn start() -> Holding {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            in_flight: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            finish: Semaphore::new(0),
        });
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = shared.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(answer(req, state).await) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades();
                    let _ = conn.await;
                });
            }
        });
        Holding { addr, state, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Lets `n` of the `/hold` responses end.
    fn finish(&self, n: usize) {
        self.state.finish.add_permits(n);
    }

    fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::SeqCst)
    }

    fn most(&self) -> usize {
        self.state.most.load(Ordering::SeqCst)
    }
}

async fn answer(req: Request<Incoming>, state: Arc<State>) -> Response<TestBody> {
    let path = req.uri().path().to_owned();
    if path == "/ws" {
        state.enter();
        let upgrade = hyper::upgrade::on(req);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                let mut io = TokioIo::new(upgraded);
                let mut buf = [0u8; 64];
                while matches!(io.read(&mut buf).await, Ok(n) if n > 0) {}
            }
            state.leave();
        });
        return Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .body(common::full(""))
            .unwrap();
    }
    if let Some(ms) = path.strip_prefix("/slow/") {
        state.enter();
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
        state.leave();
        return Response::new(common::full("ok"));
    }
    state.enter();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Box<_>>>(1);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                permit = state.finish.acquire() => {
                    permit.unwrap().forget();
                    break;
                }
                () = tokio::time::sleep(Duration::from_millis(50)) => {
                    if tx.send(Ok(Frame::data(Bytes::from_static(b".")))).await.is_err() {
                        break; // the proxy let go of the response
                    }
                }
            }
        }
        drop(tx);
        state.leave();
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Response::new(StreamBody::new(stream).boxed())
}

/// A request whose response head has come, its body still streaming: it holds its slot.
async fn open(url: &str) -> Response<Incoming> {
    let req = Request::get(url).body(common::full("")).unwrap();
    http_client().request(req).await.expect("request")
}

/// [`open`], asked again until a slot is free: a slot is released on a task of its own, a
/// moment after its response ends.
async fn open_when_free(url: &str) -> Response<Incoming> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let resp = open(url).await;
        if resp.status() != StatusCode::TOO_MANY_REQUESTS || Instant::now() > deadline {
            return resp;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads a response's body to its end.
async fn finish_reading(resp: Response<Incoming>) {
    let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect());
    body.await.expect("the body ends in time").expect("body");
}

/// GET `url`, the whole answer; a body that never ends (a `/hold` admitted where it should
/// have been refused) fails the test rather than hanging it.
async fn ask(url: &str) -> common::Answer {
    let answer = tokio::time::timeout(Duration::from_secs(10), get(url, &[]));
    answer.await.expect("answered in time")
}

fn header<'a>(resp: &'a common::Answer, name: &str) -> &'a str {
    resp.header(name)
        .unwrap_or_else(|| panic!("no {name} in {:?}", resp.headers))
}

/// A config for `upstream` with one route `api` whose only limit is `conc`, `limit` slots.
fn conc(upstream: &Holding, redis: Option<&Redis>, limit: &str) -> String {
    let yaml = Yaml::to(&[upstream.url()]);
    let yaml = match redis {
        Some(redis) => yaml.redis(redis, "timeout: 500ms"),
        None => yaml,
    };
    yaml.route(
        "api",
        "/",
        &format!("limits:\n  - {{name: conc, algorithm: concurrency, key: route, {limit}}}"),
    )
    .build()
}

/// With `limit: 2` shared by two instances, the third request in flight on either is refused
/// with 429, `Retry-After` and the headers stating the limit and the slots free; once one
/// response ends, a new request is admitted.
#[tokio::test]
async fn two_instances_share_the_slots() {
    let redis = Redis::start();
    let up = Holding::start().await;
    let yaml = conc(&up, Some(&redis), "limit: 2");
    let (a, b) = (Proxy::start(&yaml).await, Proxy::start(&yaml).await);
    let first = open(&a.url("/hold")).await;
    assert_eq!(first.status(), 200);
    let policy = first.headers()["ratelimit-policy"].to_str().unwrap();
    assert_eq!(policy, r#""conc";q=2"#, "no window is stated");
    assert_eq!(first.headers()["ratelimit"], r#""conc";r=1"#);
    let second = open(&b.url("/hold")).await;
    assert_eq!(second.status(), 200);
    for proxy in [&a, &b] {
        let refused = ask(&proxy.url("/hold")).await;
        assert_eq!(refused.status, 429, "{}", refused.body);
        assert_eq!(header(&refused, "retry-after"), "1");
        assert_eq!(header(&refused, "ratelimit-policy"), r#""conc";q=2"#);
        assert_eq!(header(&refused, "ratelimit"), r#""conc";r=0"#);
        assert!(
            refused.body.contains(r#""limit":"conc""#),
            "{}",
            refused.body
        );
    }
    assert_eq!(up.in_flight(), 2);
    up.finish(1);
    finish_reading(first).await;
    let third = open_when_free(&b.url("/hold")).await;
    assert_eq!(third.status(), 200, "the slot the first held is free");
    up.finish(2);
    finish_reading(second).await;
    finish_reading(third).await;
    assert_eq!(up.most(), 2);
}

/// A client that hangs up while its response streams frees its slot.
#[tokio::test]
async fn a_client_that_hangs_up_frees_its_slot() {
    let redis = Redis::start();
    let up = Holding::start().await;
    let proxy = Proxy::start(&conc(&up, Some(&redis), "limit: 1")).await;
    let held = open(&proxy.url("/hold")).await;
    assert_eq!(ask(&proxy.url("/hold")).await.status, 429);
    drop(held);
    eventually(Duration::from_secs(3), || async {
        let resp = open(&proxy.url("/hold")).await;
        resp.status() == 200
    })
    .await;
}

/// A WebSocket tunnel holds its slot until it closes, then frees it.
#[tokio::test]
async fn a_websocket_tunnel_holds_its_slot_until_it_closes() {
    let redis = Redis::start();
    let up = Holding::start().await;
    let proxy = Proxy::start(&conc(&up, Some(&redis), "limit: 1")).await;
    let mut tunnel = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    tunnel
        .write_all(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        )
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(tunnel.read(&mut byte).await.unwrap(), 1, "the head ends");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    // long after the 101 went out, the tunnel still holds the slot
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(get(&proxy.url("/slow/0"), &[]).await.status, 429);
    drop(tunnel);
    eventually(Duration::from_secs(3), || async {
        get(&proxy.url("/slow/0"), &[]).await.status == 200
    })
    .await;
}

/// A slot whose holder stops renewing it (an instance that died) frees itself when its lease
/// ends; a live holder's renewals keep its slot past the lease.
#[tokio::test]
async fn a_dead_holders_slot_frees_within_the_lease() {
    let redis = Redis::start();
    let up = Holding::start().await;
    let proxy = Proxy::start(&conc(&up, Some(&redis), "limit: 1, lease: 1s")).await;
    // a live request, renewed every third of a second, keeps its slot for 2.5 leases
    let held = open(&proxy.url("/hold")).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(get(&proxy.url("/slow/0"), &[]).await.status, 429);
    up.finish(1);
    finish_reading(held).await;
    eventually(Duration::from_secs(2), || async {
        get(&proxy.url("/slow/0"), &[]).await.status == 200
    })
    .await;
    // a holder that never renews: taken by hand, as a dead instance left it (once the last
    // request's release, sent on a task of its own, has landed)
    let script = include_str!("../lua/concurrency.lua");
    let key = "tollgate:api:conc:api";
    eventually(Duration::from_secs(2), || async {
        redis.cli(&["exists", key]).trim() == "0"
    })
    .await;
    let taken = redis.cli(&["eval", script, "1", key, "acquire", "1", "1000", "ghost:1"]);
    assert!(taken.starts_with('1'), "{taken}");
    let since = Instant::now();
    assert_eq!(get(&proxy.url("/slow/0"), &[]).await.status, 429);
    eventually(Duration::from_secs(3), || async {
        get(&proxy.url("/slow/0"), &[]).await.status == 200
    })
    .await;
    let freed = since.elapsed();
    assert!(
        freed >= Duration::from_millis(700),
        "freed after {freed:?}, before the lease ended"
    );
}

/// The memory store holds slots the same way, for a single instance; the gauge
/// `tollgate_concurrency_held` counts them.
#[tokio::test]
async fn the_memory_store_holds_slots_too() {
    let up = Holding::start().await;
    let yaml = conc(&up, None, "limit: 1");
    let proxy = Proxy::start(&format!("admin: {{listen: 127.0.0.1:0}}\n{yaml}")).await;
    let metrics = format!("http://{}/metrics", proxy.admin.expect("admin listener"));
    let held = open(&proxy.url("/hold")).await;
    assert_eq!(held.status(), 200);
    assert!(ask(&metrics)
        .await
        .body
        .contains("tollgate_concurrency_held 1\n"));
    let refused = ask(&proxy.url("/hold")).await;
    assert_eq!(refused.status, 429);
    assert_eq!(header(&refused, "ratelimit"), r#""conc";r=0"#);
    up.finish(1);
    finish_reading(held).await;
    let again = open_when_free(&proxy.url("/hold")).await;
    assert_eq!(again.status(), 200);
    up.finish(1);
    finish_reading(again).await;
    eventually(Duration::from_secs(3), || async {
        ask(&metrics)
            .await
            .body
            .contains("tollgate_concurrency_held 0\n")
    })
    .await;
}

/// A request that a later limit refuses gives its slot back before the 429 goes out.
#[tokio::test]
async fn a_later_refusal_frees_the_slot() {
    let redis = Redis::start();
    let up = Holding::start().await;
    let yaml = Yaml::to(&[up.url()])
        .redis(&redis, "timeout: 500ms")
        .route(
            "api",
            "/",
            "limits:\n  - {name: conc, algorithm: concurrency, key: route, limit: 1}\n  \
             - {name: once, algorithm: fixed_window, key: 'header:x-k', limit: 1, window: 1h}",
        )
        .build();
    let proxy = Proxy::start(&yaml).await;
    assert_eq!(
        get(&proxy.url("/slow/0"), &[("x-k", "a")]).await.status,
        200
    );
    // (the first request's slot is released on a task of its own)
    eventually(Duration::from_secs(2), || async {
        redis.cli(&["exists", "tollgate:api:conc:api"]).trim() == "0"
    })
    .await;
    let refused = get(&proxy.url("/slow/0"), &[("x-k", "a")]).await;
    assert_eq!(refused.status, 429);
    assert!(refused.body.contains(r#""limit":"once""#));
    assert_eq!(redis.cli(&["exists", "tollgate:api:conc:api"]).trim(), "0");
    assert_eq!(
        get(&proxy.url("/slow/0"), &[("x-k", "b")]).await.status,
        200
    );
}

/// `pace: {concurrency: 1}` on an upstream behind two instances: the upstream never sees two
/// requests at once; a request that waits past `max_delay` for a slot gets 503.
#[tokio::test]
async fn pace_concurrency_serialises_requests_across_instances() {
    let redis = Redis::start();
    let up = Holding::start().await;
    let yaml = Yaml::to(&[up.url()])
        .redis(&redis, "timeout: 500ms")
        .upstream("pace: {concurrency: 1, max_delay: 5s}")
        .route("api", "/", "")
        .build();
    let (a, b) = (Proxy::start(&yaml).await, Proxy::start(&yaml).await);
    let started = Instant::now();
    let mut calls = Vec::new();
    for i in 0..8 {
        let url = if i % 2 == 0 {
            a.url("/slow/100")
        } else {
            b.url("/slow/100")
        };
        calls.push(tokio::spawn(async move { get(&url, &[]).await.status }));
    }
    for call in calls {
        assert_eq!(call.await.unwrap(), 200);
    }
    assert_eq!(up.most(), 1, "one request in flight at a time");
    assert!(
        started.elapsed() >= Duration::from_millis(750),
        "8 x 100 ms, one after another"
    );

    let yaml = Yaml::to(&[up.url()])
        .redis(&redis, "timeout: 500ms\nkey_prefix: short")
        .upstream("pace: {concurrency: 1, max_delay: 300ms}")
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    let held = open(&proxy.url("/hold")).await;
    let asked = Instant::now();
    let refused = get(&proxy.url("/slow/0"), &[]).await;
    let waited = asked.elapsed();
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(header(&refused, "retry-after"), "1");
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(2),
        "refused after {waited:?}"
    );
    up.finish(1);
    finish_reading(held).await;
    assert_eq!(get(&proxy.url("/slow/0"), &[]).await.status, 200);
}

/// With Redis out, `on_error` applies to slots as to any limit: `local` holds them in
/// process, `deny` answers 503.
#[tokio::test]
async fn the_failure_policy_applies_to_slots() {
    let mut redis = Redis::start();
    let up = Holding::start().await;
    let route = "limits:\n  - {name: conc, algorithm: concurrency, key: route, limit: 1}";
    let local = Yaml::to(&[up.url()])
        .redis(&redis, "timeout: 200ms\non_error: local")
        .route("api", "/", route)
        .build();
    let deny = Yaml::to(&[up.url()])
        .redis(&redis, "timeout: 200ms\non_error: deny")
        .route("api", "/", route)
        .build();
    redis.kill();
    let proxy = Proxy::start(&local).await;
    let held = open(&proxy.url("/hold")).await;
    assert_eq!(held.status(), 200);
    let refused = ask(&proxy.url("/hold")).await;
    assert_eq!(refused.status, 429, "the fallback holds the slot");
    up.finish(1);
    finish_reading(held).await;
    let again = open_when_free(&proxy.url("/hold")).await;
    assert_eq!(again.status(), 200, "and frees it");
    up.finish(1);
    finish_reading(again).await;
    let proxy = Proxy::start(&deny).await;
    assert_eq!(ask(&proxy.url("/slow/0")).await.status, 503);
}

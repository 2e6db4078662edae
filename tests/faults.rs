//! Faults under load, the fast and essential ones: Redis flushed, blocked
//! past the store timeout, and killed while concurrent clients keep sending; an upstream target
//! killed and restarted while requests flow. For each: no request waits past its timeouts, the
//! `on_error` policy is honoured, and service recovers by itself. The long runs with figures
//! are `reliability/faults` (see RELIABILITY.md).
//!
//! Real `redis-server` (tests/common), tollgate in process, clients in process. Each test keeps
//! several connections busy at once; clients are told apart by their `x-api-key`.

mod common;
common::both_http1_clients!();

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{get, Proxy, Redis, Yaml};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tollgate::store::policy::COOL_DOWN;

/// The tests measure latencies under load: one at a time, so that they do not eat each
/// other's margins on a small machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The store timeout of these tests.
const STORE_TIMEOUT: Duration = Duration::from_millis(100);

/// No request may take longer than this while Redis misbehaves: two store calls (the limit and
/// the pacing), each bounded by the store timeout, plus wide slack for a busy machine. Far
/// below the faults' own length (Redis blocked or gone for 1.5 s or more).
const MAX_LATENCY: Duration = Duration::from_millis(2 * 100 + 500);

/// How long Redis may take to decide again after it is back: the breaker's cool-down (1 s)
/// and a reconnect, with slack.
const RECOVERY: Duration = Duration::from_secs(5);

/// A proxy config: `/` to `targets`, paced at 5000/s, and a generous token bucket per API key
/// (so that every request is admitted while Redis decides); the store on `redis` with
/// `on_error`, or the memory store when `redis` is `None`.
fn config(redis: Option<&Redis>, targets: &[String], on_error: &str) -> String {
    let mut yaml = Yaml::to(targets)
        .top("admin: {listen: 127.0.0.1:0}")
        .top("timeouts: {upstream_connect: 1s, upstream_response: 5s}")
        .upstream("pace: {rate: 5000/s, max_delay: 1s}")
        .route(
            "api",
            "/",
            "limits: [{name: per-key, algorithm: token_bucket, key: header:x-api-key, \
             rate: 1000/s, burst: 1000}]",
        );
    if let Some(redis) = redis {
        let timeout = STORE_TIMEOUT.as_millis();
        let store = format!("key_prefix: tf\ntimeout: {timeout}ms\non_error: {on_error}");
        yaml = yaml.redis(redis, &store);
    }
    yaml.build()
}

/// One answered (or failed: status 0) request of the load.
#[derive(Debug, Clone, Copy)]
struct Shot {
    start: Instant,
    took: Duration,
    status: u16,
}

/// `clients` concurrent clients, each with its own keep-alive connection and API key
/// `<key>-<n>`, sending GET `/items` back to back to `proxy` for `length`. Every request is
/// bounded by a 10 s client timeout (status 1 past it: a hang).
async fn load(proxy: &Proxy, key: &str, clients: usize, length: Duration) -> Vec<Shot> {
    let url: hyper::Uri = proxy.url("/items").parse().unwrap();
    let until = Instant::now() + length;
    let mut tasks = Vec::new();
    for n in 0..clients {
        let (url, api_key) = (url.clone(), format!("{key}-{n}"));
        tasks.push(tokio::spawn(async move {
            let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
            let mut shots = Vec::new();
            while Instant::now() < until {
                let req = hyper::Request::get(url.clone())
                    .header("x-api-key", &api_key)
                    .body(Empty::new())
                    .unwrap();
                let start = Instant::now();
                let call = async {
                    let resp = client.request(req).await.ok()?;
                    let status = resp.status().as_u16();
                    resp.into_body().collect().await.ok()?;
                    Some(status)
                };
                let status = match tokio::time::timeout(Duration::from_secs(10), call).await {
                    Ok(Some(s)) => s,
                    Ok(None) => 0,
                    Err(_) => 1,
                };
                shots.push(Shot {
                    start,
                    took: start.elapsed(),
                    status,
                });
            }
            shots
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// `status: count`, in status order.
fn statuses(shots: &[Shot]) -> Vec<(u16, usize)> {
    let mut counts = std::collections::BTreeMap::new();
    for s in shots {
        *counts.entry(s.status).or_insert(0) += 1;
    }
    counts.into_iter().collect()
}

fn assert_no_slow(shots: &[Shot], context: &str) {
    let slowest = shots.iter().map(|s| s.took).max().unwrap_or_default();
    assert!(
        slowest < MAX_LATENCY,
        "{context}: a request took {slowest:?} (limit {MAX_LATENCY:?}); statuses {:?}",
        statuses(shots)
    );
}

/// The sum of every sample of `name` (any labels) in the proxy's /metrics.
async fn metric(proxy: &Proxy, name: &str) -> f64 {
    let admin = proxy.admin.expect("admin listener");
    let text = get(&format!("http://{admin}/metrics"), &[]).await.body;
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Store calls that succeeded so far: every call is timed, failed ones are also counted.
async fn store_successes(proxy: &Proxy) -> f64 {
    metric(proxy, "tollgate_store_duration_seconds_count").await
        - metric(proxy, "tollgate_store_errors_total").await
}

/// Sends requests until a store call succeeds again (Redis decides again); returns how long
/// that took. (The buckets of these tests are far from empty, so their keys expire within
/// milliseconds of each request: the metrics tell, not the keys.)
async fn until_redis_decides(proxy: &Proxy) -> Duration {
    let started = Instant::now();
    let before = store_successes(proxy).await;
    loop {
        let sent = Instant::now();
        let a = get(&proxy.url("/items"), &[("x-api-key", "probe")]).await;
        assert!(
            sent.elapsed() < MAX_LATENCY,
            "probe took {:?}",
            sent.elapsed()
        );
        assert!(matches!(a.status, 200 | 503), "{a:?}");
        if store_successes(proxy).await > before {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < RECOVERY,
            "Redis is back but tollgate has not asked it again after {RECOVERY:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `EVALSHA` calls Redis has served, from `INFO commandstats`.
fn evalsha_calls(port: u16) -> u64 {
    common::cli(port, &["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// `SCRIPT FLUSH` and then `FLUSHALL` while 8 clients keep sending: every request is admitted
/// (the scripts are reloaded on NOSCRIPT, the lost buckets start full again), no store call
/// fails, and Redis keeps deciding after each flush (its script calls go on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_and_flushall_mid_load_lose_no_request() {
    let _serial = SERIAL.lock().await;
    let redis = Redis::start();
    let upstream = common::Upstream::start().await;
    let proxy = Proxy::start(&config(Some(&redis), &[upstream.url()], "deny")).await;
    let port = redis.port;
    let flusher = std::thread::spawn(move || {
        let mut calls = Vec::new();
        for flush in [&["SCRIPT", "FLUSH"][..], &["FLUSHALL"][..]] {
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(common::cli(port, flush), "OK");
            let at_flush = evalsha_calls(port);
            std::thread::sleep(Duration::from_millis(300));
            calls.push((at_flush, evalsha_calls(port)));
        }
        calls
    });
    let shots = load(&proxy, "flush", 8, Duration::from_millis(1500)).await;
    let calls = flusher.join().unwrap();
    assert!(shots.len() > 50, "too little load: {}", shots.len());
    assert_eq!(statuses(&shots), vec![(200, shots.len())]);
    assert_no_slow(&shots, "flushes");
    assert_eq!(metric(&proxy, "tollgate_store_errors_total").await, 0.0);
    for (at_flush, later) in &calls {
        assert!(
            later > at_flush,
            "Redis decided nothing after a flush: {calls:?}"
        );
    }
}

/// `DEBUG SLEEP` (Redis blocked, connections open) past the store timeout, under load from 6
/// clients on each of two proxies: with `on_error: deny` every request gets 503 and with
/// `local` every request is admitted, each within the timeout (not after Redis wakes up); the
/// breaker opens (timeouts counted) and, once Redis answers, both decide with Redis again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_sleep_past_the_timeout_applies_on_error_within_the_timeout() {
    let _serial = SERIAL.lock().await;
    let redis = Redis::start_with(&["--enable-debug-command", "local"]);
    let upstream = common::Upstream::start().await;
    let deny = Proxy::start(&config(Some(&redis), &[upstream.url()], "deny")).await;
    let local = Proxy::start(&config(Some(&redis), &[upstream.url()], "local")).await;
    // both proxies have loaded their scripts and connected
    for proxy in [&deny, &local] {
        assert_eq!(get(&proxy.url("/items"), &[]).await.status, 200);
    }

    let port = redis.port;
    let sleeper = std::thread::spawn(move || common::cli(port, &["DEBUG", "SLEEP", "1.8"]));
    redis.wait_blocked();
    let blocked_at = Instant::now();
    let (denied, admitted) = tokio::join!(
        load(&deny, "sleep", 6, Duration::from_millis(1000)),
        load(&local, "sleep", 6, Duration::from_millis(1000)),
    );
    assert!(
        blocked_at.elapsed() < Duration::from_millis(1700),
        "the load outlasted the sleep: the figures below would mix"
    );
    assert!(denied.len() >= 12 && admitted.len() >= 12);
    assert_eq!(
        statuses(&denied),
        vec![(503, denied.len())],
        "on_error deny"
    );
    assert_eq!(
        statuses(&admitted),
        vec![(200, admitted.len())],
        "on_error local"
    );
    assert_no_slow(&denied, "deny during DEBUG SLEEP");
    assert_no_slow(&admitted, "local during DEBUG SLEEP");
    for proxy in [&deny, &local] {
        let timeouts = metric(proxy, "tollgate_store_errors_total{kind=\"timeout\"}").await;
        assert!(timeouts >= 1.0, "no store timeout counted");
    }
    assert_eq!(sleeper.join().unwrap(), "OK");
    for proxy in [&deny, &local] {
        let took = until_redis_decides(proxy).await;
        assert!(took < RECOVERY, "{took:?}");
    }
}

/// Redis killed while 6 clients keep sending to a `deny` and a `local` proxy, then started
/// again (empty) on the same port: no request waits past the timeouts, `deny` answers only
/// 200 or 503 and `local` only 200, and both decide with Redis again by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_honours_on_error_and_recovers() {
    let _serial = SERIAL.lock().await;
    let mut redis = Redis::start();
    let upstream = common::Upstream::start().await;
    let deny = Proxy::start(&config(Some(&redis), &[upstream.url()], "deny")).await;
    let local = Proxy::start(&config(Some(&redis), &[upstream.url()], "local")).await;
    for proxy in [&deny, &local] {
        assert_eq!(get(&proxy.url("/items"), &[]).await.status, 200);
    }

    let killer = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        redis.kill();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        redis.restart();
        Instant::now()
    };
    let (denied, admitted, restarted) = tokio::join!(
        load(&deny, "kill", 6, Duration::from_millis(3400)),
        load(&local, "kill", 6, Duration::from_millis(3400)),
        killer,
    );
    assert_no_slow(&denied, "deny, Redis killed");
    assert_no_slow(&admitted, "local, Redis killed");
    let counts = statuses(&denied);
    assert!(
        counts.iter().all(|(s, _)| *s == 200 || *s == 503),
        "deny: {counts:?}"
    );
    assert!(
        counts.iter().any(|(s, _)| *s == 503),
        "deny never failed closed: {counts:?}"
    );
    assert_eq!(statuses(&admitted), vec![(200, admitted.len())], "local");
    // the breaker's first probe after the restart closes it: a request that starts a
    // cool-down (and some slack) after the restart is decided by Redis, and deny admits it
    let late = restarted + COOL_DOWN + Duration::from_millis(500);
    let tail: Vec<&Shot> = denied.iter().filter(|s| s.start > late).collect();
    assert!(
        !tail.is_empty(),
        "the load ended too early to see the recovery"
    );
    assert!(
        tail.iter().all(|s| s.status == 200),
        "deny still failing {:?} after the restart: {:?}",
        late - restarted,
        statuses(&tail.into_iter().copied().collect::<Vec<_>>())
    );
    for proxy in [&deny, &local] {
        until_redis_decides(proxy).await;
    }
}

/// An upstream that can be killed (listener and every open connection closed at once) and
/// started again on the same address. Counts the requests it answered.
struct Target {
    addr: SocketAddr,
    hits: Arc<AtomicU64>,
    tasks: Arc<Mutex<tokio::task::JoinSet<()>>>,
}

impl Target {
    async fn start(addr: SocketAddr) -> Target {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicU64::new(0));
        let tasks = Arc::new(Mutex::new(tokio::task::JoinSet::new()));
        let (hits2, tasks2) = (hits.clone(), tasks.clone());
        tasks.lock().unwrap().spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let hits = hits2.clone();
                tasks2.lock().unwrap().spawn(async move {
                    let svc = hyper::service::service_fn(move |_req| {
                        hits.fetch_add(1, Ordering::Relaxed);
                        async {
                            Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from("ok"))))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Target { addr, hits, tasks }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn kill(&self) {
        self.tasks.lock().unwrap().abort_all();
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One of two upstream targets killed while 8 clients keep sending, then restarted: requests
/// keep succeeding after at most a few 502s (those in flight on the killed target), none waits
/// long, and the restarted target gets requests again by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_target_killed_with_two_targets_costs_at_most_a_few_502s() {
    let _serial = SERIAL.lock().await;
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = Target::start(any).await;
    let b = Target::start(any).await;
    let proxy = Proxy::start(&config(None, &[a.url(), b.url()], "local")).await;
    let b_addr = b.addr;
    let restarted = Arc::new(Mutex::new(None::<(Target, Instant)>));
    let restarted2 = restarted.clone();
    let killer = async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        b.kill();
        drop(b);
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let b = Target::start(b_addr).await;
        *restarted2.lock().unwrap() = Some((b, Instant::now()));
    };
    let (shots, ()) = tokio::join!(load(&proxy, "up", 8, Duration::from_millis(1800)), killer);
    let counts = statuses(&shots);
    let failed = shots.iter().filter(|s| s.status != 200).count();
    assert!(
        counts.iter().all(|(s, _)| *s == 200 || *s == 502),
        "{counts:?}"
    );
    assert!(
        failed <= 8,
        "{failed} requests failed with one of two targets killed: {counts:?}"
    );
    assert_no_slow(&shots, "a target killed");
    assert!(a.hits.load(Ordering::Relaxed) > 0);

    // the restarted target is back in the rotation within its ejection time, by itself
    let (b, at) = restarted.lock().unwrap().take().expect("restarted");
    let deadline = at + tollgate::proxy::forward::EJECT_FOR + Duration::from_secs(2);
    while b.hits.load(Ordering::Relaxed) == 0 {
        assert!(
            Instant::now() < deadline,
            "the restarted target got no request"
        );
        assert_eq!(get(&proxy.url("/items"), &[]).await.status, 200);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

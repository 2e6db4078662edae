//! The store failure policy end to end: Redis killed, restarted or paused under a running
//! tollgate; `on_error` allow, deny and local (with `instances`); the circuit breaker; and the
//! deny cache under a flood. Real `redis-server`, real upstream, tollgate in process.
//!
//! Clients are told apart by `X-Forwarded-For` (the test connects from 127.0.0.1, a trusted
//! proxy), so each phase of a test uses a client no earlier phase has touched.

mod common;
common::both_http1_clients!();

use std::time::{Duration, Instant};

use common::{get, Answer, Proxy, Redis, Upstream, Yaml};
use tollgate::store::policy::{COOL_DOWN, TRIP_AFTER};

/// The tests measure latencies and flood the proxy: run them one at a time, so that a noisy
/// neighbour in the same binary does not eat the timing margins.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// No request may take longer than this while Redis is down (store timeout plus wide slack).
const MAX_LATENCY: Duration = Duration::from_millis(500);

/// How long Redis may take to decide again after it is back: a reconnect plus the breaker's
/// probe, with slack for a loaded machine.
const RECOVERY: Duration = Duration::from_secs(10);

/// A proxy config: one route `/v1` with a token bucket `per-client` keyed by client ip.
fn config(redis: &Redis, upstream: &Upstream, store: &str, rate: &str, burst: u32) -> String {
    let limit = format!(
        "limits: [{{name: per-client, algorithm: token_bucket, key: ip, rate: {rate}, burst: {burst}}}]"
    );
    Yaml::to(&[upstream.url()])
        .top("trusted_proxies: [127.0.0.1/32]")
        .redis(redis, &format!("key_prefix: tg\n{store}"))
        .route("api", "/v1", &limit)
        .build()
}

/// The Redis key of `client`'s bucket.
fn key(client: &str) -> String {
    format!("tg:api:per-client:{client}")
}

/// Whether `client`'s bucket exists in Redis (that is, Redis decided for it).
fn in_redis(redis: &Redis, client: &str) -> bool {
    let key = key(client);
    redis.cli(&["--scan"]).lines().any(|k| k == key)
}

/// One GET of `/v1/items` as `client`, with how long it took.
async fn request(proxy: &Proxy, client: &str) -> (Answer, Duration) {
    let started = Instant::now();
    let answer = get(&proxy.url("/v1/items"), &[("x-forwarded-for", client)]).await;
    (answer, started.elapsed())
}

/// `n` requests as `client`, one after another: their statuses, each checked against
/// [`MAX_LATENCY`].
async fn statuses(proxy: &Proxy, client: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (a, took) = request(proxy, client).await;
        assert!(
            took < MAX_LATENCY,
            "request {i} of {client} took {took:?} (answer {a:?})"
        );
        out.push(a.status);
    }
    out
}

/// `admitted` times 200, then `denied` times 429.
fn burst_then_429(admitted: usize, denied: usize) -> Vec<u16> {
    let mut v = vec![200; admitted];
    v.extend(vec![429; denied]);
    v
}

/// Sends requests as `client` until Redis holds its key (Redis decides again); returns how long
/// that took. Panics after [`RECOVERY`].
async fn until_redis_decides(proxy: &Proxy, redis: &Redis, client: &str) -> Duration {
    let started = Instant::now();
    loop {
        let (_, took) = request(proxy, client).await;
        assert!(took < MAX_LATENCY, "probe request took {took:?}");
        if in_redis(redis, client) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < RECOVERY,
            "Redis is back but tollgate has not asked it again after {RECOVERY:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Redis decides `client`'s burst: `burst` admitted, then 429, and the key is in Redis.
async fn redis_enforces(proxy: &Proxy, redis: &Redis, client: &str, burst: usize) {
    assert_eq!(
        statuses(proxy, client, burst + 1).await,
        burst_then_429(burst, 1),
        "{client}"
    );
    assert!(in_redis(redis, client), "{client}'s bucket is not in Redis");
}

/// The store failing with Redis killed, and its recovery after a restart on the same port.
async fn outage_then_restart(
    on_error: &str,
    during: impl AsyncFnOnce(&Proxy),
) -> (Redis, Upstream, Proxy) {
    let mut redis = Redis::start();
    let upstream = Upstream::start().await;
    let store = format!("  timeout: 50ms\n  on_error: {on_error}");
    let proxy = Proxy::start(&config(&redis, &upstream, &store, "1/m", 3)).await;
    redis_enforces(&proxy, &redis, "10.0.0.1", 3).await;
    redis.kill();
    during(&proxy).await;
    redis.restart();
    until_redis_decides(&proxy, &redis, "10.0.0.3").await;
    redis_enforces(&proxy, &redis, "10.0.0.4", 3).await;
    (redis, upstream, proxy)
}

/// `on_error: allow`: with Redis killed every request passes, none waits past the timeout;
/// after a restart Redis limits again without restarting tollgate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_admits_during_outage_and_redis_resumes_after_restart() {
    let _serial = SERIAL.lock().await;
    outage_then_restart("allow", async |proxy: &Proxy| {
        assert_eq!(statuses(proxy, "10.0.0.2", 12).await, vec![200; 12]);
    })
    .await;
}

/// `on_error: deny`: with Redis killed every request gets a JSON 503 with Retry-After, none
/// waits past the timeout; after a restart Redis limits again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_answers_503_during_outage_and_redis_resumes_after_restart() {
    let _serial = SERIAL.lock().await;
    outage_then_restart("deny", async |proxy: &Proxy| {
        for i in 0..12 {
            let (a, took) = request(proxy, "10.0.0.2").await;
            assert!(took < MAX_LATENCY, "request {i} took {took:?}");
            assert_eq!(a.status, 503, "{a:?}");
            assert_eq!(a.header("content-type"), Some("application/json"));
            let body: serde_json::Value = serde_json::from_str(&a.body).expect("JSON body");
            assert_eq!(body["error"], "limiter_unavailable", "{a:?}");
            // the store's own error (addresses, Redis replies) stays in the log
            assert_eq!(body["message"], "rate limiter unavailable", "{a:?}");
            let retry: u64 = a
                .header("retry-after")
                .expect("Retry-After on the 503")
                .parse()
                .expect("Retry-After in whole seconds");
            assert!(retry >= 1, "{a:?}");
        }
    })
    .await;
}

/// `on_error: local`: with Redis killed the same bucket is enforced in process (burst, then 429
/// with Retry-After); after a restart Redis limits again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_enforces_in_process_during_outage_and_redis_resumes_after_restart() {
    let _serial = SERIAL.lock().await;
    outage_then_restart("local", async |proxy: &Proxy| {
        assert_eq!(statuses(proxy, "10.0.0.2", 6).await, burst_then_429(3, 3));
        let (a, _) = request(proxy, "10.0.0.2").await;
        assert_eq!(a.status, 429);
        let retry: u64 = a
            .header("retry-after")
            .expect("Retry-After")
            .parse()
            .unwrap();
        // rate 1/m: the next token is up to a minute away
        assert!((1..=60).contains(&retry), "{a:?}");
    })
    .await;
}

/// `on_error: local` with `instances: 2`: Redis enforces the whole burst of 10; during the
/// outage this instance admits its half, 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_with_two_instances_enforces_half_the_burst_during_outage() {
    let _serial = SERIAL.lock().await;
    let mut redis = Redis::start();
    let upstream = Upstream::start().await;
    let store = "  timeout: 50ms\n  on_error: local\n  instances: 2";
    let proxy = Proxy::start(&config(&redis, &upstream, store, "1/m", 10)).await;
    redis_enforces(&proxy, &redis, "10.0.0.1", 10).await;
    let policy = |a: &Answer| a.header("ratelimit-policy").unwrap_or_default().to_string();
    let (a, _) = request(&proxy, "10.0.0.9").await;
    assert_eq!(policy(&a), r#""per-client";q=10;w=600"#);
    redis.kill();
    assert_eq!(statuses(&proxy, "10.0.0.2", 8).await, burst_then_429(5, 3));
    // the headers state the share this instance enforces, not the whole limit
    let (a, _) = request(&proxy, "10.0.0.5").await;
    assert_eq!(policy(&a), r#""per-client";q=5;w=600"#);
    assert_eq!(a.header("ratelimit"), Some(r#""per-client";r=4;t=120"#));
    redis.restart();
    until_redis_decides(&proxy, &redis, "10.0.0.3").await;
    redis_enforces(&proxy, &redis, "10.0.0.4", 10).await;
}

/// With Redis paused (calls hang until the timeout) the breaker opens after a few slow
/// requests and later ones answer at once; after a cool-down one probe waits again; after
/// SIGCONT the breaker closes within a couple of cool-downs and Redis decides again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_skips_paused_redis_and_closes_after_resume() {
    let _serial = SERIAL.lock().await;
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let timeout = Duration::from_millis(200);
    let store = "  timeout: 200ms\n  on_error: allow";
    let proxy = Proxy::start(&config(&redis, &upstream, store, "1/m", 3)).await;
    redis_enforces(&proxy, &redis, "10.0.0.1", 3).await;

    redis.signal("-STOP");
    let mut took = Vec::new();
    for _ in 0..TRIP_AFTER as usize + 8 {
        let (a, t) = request(&proxy, "10.0.0.2").await;
        assert_eq!(a.status, 200, "on_error allow: {a:?}");
        took.push(t);
    }
    let waited = took.iter().filter(|t| **t >= timeout * 3 / 4).count();
    assert!(
        waited >= 1,
        "no request waited for the paused Redis: is it paused? {took:?}"
    );
    assert!(
        waited <= TRIP_AFTER as usize + 1,
        "{waited} requests waited for the timeout: {took:?}"
    );
    for t in &took[TRIP_AFTER as usize + 2..] {
        assert!(
            *t < timeout / 2,
            "breaker open, yet a request took {t:?}: {took:?}"
        );
    }
    assert!(took.iter().all(|t| *t < MAX_LATENCY), "{took:?}");

    // cool-down over, Redis still paused: one probe waits for the timeout, the rest do not
    tokio::time::sleep(COOL_DOWN + Duration::from_millis(100)).await;
    let mut took = Vec::new();
    for _ in 0..5 {
        took.push(request(&proxy, "10.0.0.2").await.1);
    }
    let waited = took.iter().filter(|t| **t >= timeout / 2).count();
    assert!(waited <= 1, "more than one probe per cool-down: {took:?}");

    redis.signal("-CONT");
    let recovered = until_redis_decides(&proxy, &redis, "10.0.0.3").await;
    assert!(
        recovered < COOL_DOWN * 2 + Duration::from_secs(1),
        "breaker took {recovered:?} to close after SIGCONT"
    );
    redis_enforces(&proxy, &redis, "10.0.0.4", 3).await;
}

/// `EVALSHA` (and `EVAL`) calls Redis has served so far, from `INFO commandstats`.
fn script_calls(redis: &Redis) -> u64 {
    let stats = redis.cli(&["info", "commandstats"]);
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .map(|l| {
            let calls = l.split("calls=").nth(1).expect("calls=");
            calls.split(',').next().unwrap().parse::<u64>().unwrap()
        })
        .sum()
}

/// The `r` and `t` of a `RateLimit: "per-client";r=R;t=T` header.
fn ratelimit_r_t(a: &Answer) -> (u64, u64) {
    let v = a.header("ratelimit").expect("RateLimit header");
    let field = |name: &str| -> u64 {
        v.split(';')
            .find_map(|p| p.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} in {v}"))
            .parse()
            .unwrap()
    };
    (field("r="), field("t="))
}

/// A flood of 500 requests from one denied client: every one gets 429 with sane rate-limit
/// headers, Redis serves only a handful of them, and no Retry-After is early: at the earliest
/// time any answer named, the client is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_flood_is_served_from_deny_cache_with_honest_retry_after() {
    let _serial = SERIAL.lock().await;
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let store = "  timeout: 500ms\n  on_error: deny";
    // one token every 10 s: the flood ends long before the next one
    let proxy = Proxy::start(&config(&redis, &upstream, store, "1/10s", 3)).await;
    let client = "10.0.0.1";
    assert_eq!(statuses(&proxy, client, 3).await, vec![200; 3]);
    // so that Redis's own answers name a time well inside their whole second (see below)
    tokio::time::sleep(Duration::from_millis(300)).await;

    let before = script_calls(&redis);
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let url = proxy.url("/v1/items");
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(50);
            for _ in 0..50 {
                let a = get(&url, &[("x-forwarded-for", client)]).await;
                out.push((a, Instant::now()));
            }
            out
        }));
    }
    let mut answers = Vec::with_capacity(500);
    for t in tasks {
        answers.extend(t.await.unwrap());
    }
    let calls = script_calls(&redis) - before;

    assert_eq!(answers.len(), 500);
    let mut earliest = None::<Instant>;
    for (a, received) in &answers {
        assert_eq!(a.status, 429, "{a:?}");
        let retry_secs: u64 = a
            .header("retry-after")
            .expect("Retry-After")
            .parse()
            .unwrap();
        let body: serde_json::Value = serde_json::from_str(&a.body).unwrap();
        let retry_ms = body["retry_after_ms"].as_u64().expect("retry_after_ms");
        assert!((1..=10).contains(&retry_secs), "{a:?}");
        assert_eq!(retry_secs, retry_ms.div_ceil(1000).max(1), "{a:?}");
        let (r, t) = ratelimit_r_t(a);
        assert_eq!(r, 0, "{a:?}");
        assert!(t > 0 && t >= retry_secs && t <= 30, "{a:?}");
        assert_eq!(
            a.header("ratelimit-policy"),
            Some(r#""per-client";q=3;w=30"#)
        );
        // the time this answer names; `received` is no earlier than when it was written
        let named = *received + Duration::from_millis(retry_ms);
        earliest = Some(earliest.map_or(named, |e| e.min(named)));
    }
    assert!(
        calls < 25,
        "{calls} script calls reached Redis for 500 denied requests"
    );

    tokio::time::sleep_until(earliest.expect("answers").into()).await;
    let (a, _) = request(&proxy, client).await;
    assert_eq!(
        a.status, 200,
        "denied at the earliest time a Retry-After named: {a:?}"
    );
}

/// A client denied (and so in the deny cache) does not deny another client: the other one gets
/// its own burst from Redis, and the first stays denied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_does_not_deny_other_clients() {
    let _serial = SERIAL.lock().await;
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let store = "  timeout: 500ms\n  on_error: deny";
    let proxy = Proxy::start(&config(&redis, &upstream, store, "1/m", 2)).await;
    assert_eq!(statuses(&proxy, "10.0.0.1", 10).await, burst_then_429(2, 8));
    assert_eq!(statuses(&proxy, "10.0.0.2", 3).await, burst_then_429(2, 1));
    assert!(in_redis(&redis, "10.0.0.2"));
    assert_eq!(statuses(&proxy, "10.0.0.1", 1).await, vec![429]);
    assert_eq!(statuses(&proxy, "10.0.0.3", 1).await, vec![200]);
}

/// A probe whose client hangs up mid-call (its request future dropped) does not keep the
/// breaker open: once Redis answers again, tollgate asks it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_closes_after_a_probing_client_hangs_up() {
    let _serial = SERIAL.lock().await;
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let store = "  timeout: 400ms\n  on_error: allow";
    let proxy = Proxy::start(&config(&redis, &upstream, store, "1/m", 3)).await;
    redis_enforces(&proxy, &redis, "10.0.0.1", 3).await;

    redis.signal("-STOP");
    for _ in 0..TRIP_AFTER {
        request(&proxy, "10.0.0.2").await;
    }
    tokio::time::sleep(COOL_DOWN + Duration::from_millis(100)).await;
    // this request carries the probe; hang up while it waits for the paused Redis
    let hung_up = tokio::time::timeout(Duration::from_millis(100), request(&proxy, "10.0.0.2"));
    assert!(hung_up.await.is_err(), "the probe did not wait for Redis");
    tokio::time::sleep(Duration::from_millis(100)).await;
    redis.signal("-CONT");
    until_redis_decides(&proxy, &redis, "10.0.0.3").await;
    redis_enforces(&proxy, &redis, "10.0.0.4", 3).await;
}

/// A denial Redis answered late (paused mid-call) is cached from when the answer arrived: the
/// cached Retry-After is not early by the wait, and at the time it names the client is
/// admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_is_not_early_after_a_slow_answer() {
    let _serial = SERIAL.lock().await;
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let store = "  timeout: 3s\n  on_error: deny";
    let proxy = Proxy::start(&config(&redis, &upstream, store, "1/2s", 1)).await;
    let client = "10.0.0.1";
    assert_eq!(statuses(&proxy, client, 1).await, vec![200]);

    redis.signal("-STOP");
    let url = proxy.url("/v1/items");
    let slow = tokio::spawn(async move {
        let a = get(&url, &[("x-forwarded-for", client)]).await;
        (a, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    redis.signal("-CONT");
    let (first, first_at) = slow.await.unwrap();
    let (cached, _) = request(&proxy, client).await;
    let cached_at = Instant::now();

    let retry_ms = |a: &Answer| -> Duration {
        assert_eq!(a.status, 429, "{a:?}");
        let body: serde_json::Value = serde_json::from_str(&a.body).unwrap();
        Duration::from_millis(body["retry_after_ms"].as_u64().expect("retry_after_ms"))
    };
    let named_first = first_at + retry_ms(&first);
    let named_cached = cached_at + retry_ms(&cached);
    // both name the same admit time, give or take the few ms between the two answers (a
    // cache reckoning from when the call was sent would be the pause, a second, early)
    assert!(
        named_cached + Duration::from_millis(300) >= named_first,
        "the cached denial names a time {:?} before Redis's",
        named_first - named_cached
    );
    tokio::time::sleep_until(named_first.min(named_cached).into()).await;
    let (a, _) = request(&proxy, client).await;
    assert_eq!(
        a.status, 200,
        "denied at the time a Retry-After named: {a:?}"
    );
}

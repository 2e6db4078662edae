//! Inbound limits end to end: a real upstream, a real Redis, tollgate in process.

mod common;
common::both_http1_clients!();

use std::time::{Duration, Instant};

use common::{clear_of_hour_end, get, hour_left_ms, Proxy, Redis, Upstream, Yaml};

/// The statuses of `n` sequential GETs of `path` with `headers`.
async fn statuses(proxy: &Proxy, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(get(&proxy.url(path), headers).await.status);
    }
    out
}

/// One route, `/v1` to `upstream` under `limits`, with the store in `redis`.
fn config(redis: &Redis, upstream: &Upstream, limits: &str) -> String {
    route(upstream, limits)
        .redis(redis, "timeout: 500ms")
        .build()
}

/// The route of `config` with the memory store instead of Redis.
fn memory_config(upstream: &Upstream, limits: &str) -> String {
    route(upstream, limits).build()
}

/// One route, `/v1` to `upstream` under `limits`: list items written as they stand in the
/// file, six spaces in.
fn route(upstream: &Upstream, limits: &str) -> Yaml {
    let items: String = limits
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    Yaml::to(&[upstream.url()]).route("api", "/v1", &format!("limits:\n{items}"))
}

const BUCKET: &str = "      - name: per-client
        algorithm: token_bucket
        key: ip
        rate: 1/s
        burst: 3";

/// A full bucket admits `burst` requests, then answers 429 with Retry-After, the IETF headers
/// and the JSON body; the upstream never sees the denied request.
#[tokio::test]
async fn burst_then_429_with_retry_after_and_headers() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&redis, &upstream, BUCKET)).await;
    for left in ["2", "1", "0"] {
        let a = get(&proxy.url("/v1/items"), &[]).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.body, "ok");
        assert_eq!(
            a.header("ratelimit-policy"),
            Some(r#""per-client";q=3;w=3"#)
        );
        assert_eq!(
            a.header("ratelimit"),
            Some(
                format!(
                    r#""per-client";r={left};t={}"#,
                    3 - left.parse::<u64>().unwrap()
                )
                .as_str()
            )
        );
    }
    let denied = get(&proxy.url("/v1/items"), &[]).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert_eq!(denied.header("content-type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_str(&denied.body).unwrap();
    assert_eq!(body["error"], "rate_limited");
    assert_eq!(body["limit"], "per-client");
    let retry = body["retry_after_ms"].as_u64().unwrap();
    // (the next token a second after the first request, less the time the four took)
    assert!((500..=1000).contains(&retry), "{retry}");
    assert_eq!(denied.header("ratelimit"), Some(r#""per-client";r=0;t=3"#));
    assert_eq!(upstream.seen().len(), 3);
}

/// The rate-limit headers are on every response of a limited route, also the ones the proxy
/// makes itself once the limits admitted the request: 502 (no upstream) and 504 (too slow).
#[tokio::test]
async fn proxy_errors_after_the_limits_carry_the_headers() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let held = common::DeadPort::new();
    let dead = format!("http://127.0.0.1:{}", held.port());
    let yaml = config(&redis, &upstream, BUCKET).replace(
        "upstreams:\n",
        &format!(
            "timeouts: {{upstream_response: 300ms}}\nupstreams:\n  gone:\n    targets: [{dead}]\n"
        ),
    ) + &format!(
        "  - name: gone\n    match: {{path_prefix: /gone}}\n    upstream: gone\n    limits:\n{BUCKET}\n\
         \x20 - name: slow\n    match: {{path_prefix: /slow}}\n    upstream: api\n    limits:\n{BUCKET}\n"
    );
    let proxy = Proxy::start(&yaml).await;
    let bad = get(&proxy.url("/gone/x"), &[]).await;
    assert_eq!(bad.status, 502, "{bad:?}");
    assert_eq!(
        bad.header("ratelimit-policy"),
        Some(r#""per-client";q=3;w=3"#)
    );
    assert_eq!(bad.header("ratelimit"), Some(r#""per-client";r=2;t=1"#));
    let slow = get(&proxy.url("/slow/2000"), &[]).await;
    assert_eq!(slow.status, 504, "{slow:?}");
    assert_eq!(slow.header("ratelimit"), Some(r#""per-client";r=2;t=1"#));
}

/// The headers of a limit whose requests cost 3 tokens count requests: `q` and `r` are the
/// requests the tokens pay for (7 tokens left: `r=2`; one left: `r=0`, as the next request is
/// refused), Retry-After runs until the third token; so does the next refusal, which the deny
/// cache answers.
#[tokio::test]
async fn a_costly_limit_counts_requests_in_its_headers() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let limits = "      - name: costly
        algorithm: token_bucket
        rate: 6/m
        burst: 10
        cost: 3";
    let proxy = Proxy::start(&config(&redis, &upstream, limits)).await;
    for left in [2, 1, 0] {
        let a = get(&proxy.url("/v1"), &[]).await;
        assert_eq!(a.status, 200);
        assert_eq!(a.header("ratelimit-policy"), Some(r#""costly";q=3;w=100"#));
        let shown = a.header("ratelimit").unwrap();
        assert!(
            shown.starts_with(&format!(r#""costly";r={left};"#)),
            "{shown}"
        );
    }
    for _ in 0..2 {
        let denied = get(&proxy.url("/v1"), &[]).await;
        assert_eq!(denied.status, 429);
        let shown = denied.header("ratelimit").unwrap();
        assert!(shown.starts_with(r#""costly";r=0;"#), "{shown}");
        // two more tokens at one per 10 s
        let retry: u64 = denied.header("retry-after").unwrap().parse().unwrap();
        assert!((18..=20).contains(&retry), "{retry}");
    }
}

/// Tokens come back at the configured rate: 1.25 s at 2/s refills two tokens (the bucket's
/// size; each group of three requests has half a second before a token comes back).
#[tokio::test]
async fn bucket_refills_at_the_rate() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let limits = "      - name: per-client
        algorithm: token_bucket
        rate: 2/s
        burst: 2";
    let proxy = Proxy::start(&config(&redis, &upstream, limits)).await;
    assert_eq!(statuses(&proxy, "/v1", &[], 3).await, [200, 200, 429]);
    tokio::time::sleep(Duration::from_millis(1250)).await;
    assert_eq!(statuses(&proxy, "/v1", &[], 3).await, [200, 200, 429]);
}

/// `key: header:x-api-key` gives each API key its own bucket; requests without the header
/// fall back to the client address; an override gives one key a bigger bucket.
#[tokio::test]
async fn separate_buckets_per_api_key_with_override() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let limits = r#"      - name: per-key
        algorithm: token_bucket
        key: header:x-api-key
        rate: 1/m
        burst: 2
        overrides:
          "gold-key": {burst: 5}"#;
    let proxy = Proxy::start(&config(&redis, &upstream, limits)).await;
    assert_eq!(
        statuses(&proxy, "/v1", &[("x-api-key", "alice")], 3).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses(&proxy, "/v1", &[("x-api-key", "bob")], 3).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses(&proxy, "/v1", &[], 3).await,
        [200, 200, 429],
        "no key: the ip's bucket"
    );
    assert_eq!(
        statuses(&proxy, "/v1", &[("x-api-key", "gold-key")], 6).await,
        [200, 200, 200, 200, 200, 429]
    );
    let keys = redis.cli(&["--scan", "--pattern", "tollgate:api:per-key:*"]);
    assert_eq!(keys.lines().count(), 4, "{keys}");
    // each bucket's own policy: the override's for its key, the limit's for the others
    // (a new key's first answer; the spent override bucket's 429)
    for (key, want) in [
        ("carol", r#""per-key";q=2;w=120"#),
        ("gold-key", r#""per-key";q=5;w=300"#),
    ] {
        let a = get(&proxy.url("/v1"), &[("x-api-key", key)]).await;
        assert_eq!(a.header("ratelimit-policy"), Some(want), "{key}");
    }
}

/// An override names a client as its requests send the key: a value with a space, `%`, `|`,
/// braces or non-ASCII, and an address in another notation (`::ffff:127.0.0.1` is this test's
/// client), apply to those requests. In Redis the client part is escaped, braces too: no client
/// picks the Cluster slot of its keys with a `{hash tag}`.
#[tokio::test]
async fn overrides_name_clients_as_their_requests_send_them() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let limits = r#"      - name: per-key
        algorithm: fixed_window
        key: header:x-api-key
        limit: 1
        window: 1h
        overrides:
          "a b|c%": {limit: 3}
          "{tag}": {limit: 3}
          "h\u00e9llo": {limit: 3}
      - name: per-ip
        algorithm: fixed_window
        limit: 9
        window: 1h
        overrides:
          "0:0:0:0:0:FFFF:7F00:1": {limit: 12}"#;
    let proxy = Proxy::start(&config(&redis, &upstream, limits)).await;
    clear_of_hour_end(Duration::from_secs(5)).await;
    for key in ["a b|c%", "{tag}", "h\u{e9}llo"] {
        let got = statuses(&proxy, "/v1", &[("x-api-key", key)], 4).await;
        assert_eq!(got, [200, 200, 200, 429], "{key:?}: the override's limit");
    }
    // the ip limit's override: 12, not 9, for this client (9 admitted so far; the refused
    // ones were given back)
    let mut got = Vec::new();
    for key in ["z1", "z2", "z3", "z4"] {
        got.push(get(&proxy.url("/v1"), &[("x-api-key", key)]).await.status);
    }
    assert_eq!(got, [200, 200, 200, 429]);
    let keys = redis.cli(&["--scan", "--pattern", "tollgate:api:per-key:*"]);
    let mut keys: Vec<&str> = keys.lines().collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "tollgate:api:per-key:%7Btag%7D",
            "tollgate:api:per-key:a%20b%7Cc%25",
            "tollgate:api:per-key:h%C3%A9llo",
            "tollgate:api:per-key:z1",
            "tollgate:api:per-key:z2",
            "tollgate:api:per-key:z3",
            "tollgate:api:per-key:z4",
        ]
    );
}

/// X-Forwarded-For from an untrusted peer is ignored: a client cannot pick its own identity.
#[tokio::test]
async fn spoofed_forwarded_for_from_untrusted_peer_is_ignored() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&redis, &upstream, BUCKET)).await;
    let mut seen = Vec::new();
    for i in 0..5 {
        let xff = format!("10.0.0.{i}");
        seen.push(
            get(&proxy.url("/v1"), &[("x-forwarded-for", &xff)])
                .await
                .status,
        );
    }
    assert_eq!(seen, [200, 200, 200, 429, 429]);
}

/// From a trusted proxy, the right-most untrusted X-Forwarded-For address is the client.
#[tokio::test]
async fn forwarded_for_from_trusted_proxy_is_honoured() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let yaml = config(&redis, &upstream, BUCKET).replace(
        "upstreams:",
        "trusted_proxies: [127.0.0.1, 10.9.0.0/16]\nupstreams:",
    );
    let proxy = Proxy::start(&yaml).await;
    let alice = [("x-forwarded-for", "203.0.113.7")];
    assert_eq!(
        statuses(&proxy, "/v1", &alice, 4).await,
        [200, 200, 200, 429]
    );
    // another client, behind a second trusted hop, and with a spoofed left-most entry
    let bob = [("x-forwarded-for", "203.0.113.7, 198.51.100.2, 10.9.1.1")];
    assert_eq!(statuses(&proxy, "/v1", &bob, 4).await, [200, 200, 200, 429]);
    let keys = redis.cli(&["--scan", "--pattern", "tollgate:api:per-client:*"]);
    let mut keys: Vec<&str> = keys.lines().collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "tollgate:api:per-client:198.51.100.2",
            "tollgate:api:per-client:203.0.113.7"
        ]
    );
}

/// Path tricks cannot dodge a limit: every spelling of /v1 shares the /v1 route and bucket,
/// and `/v1/../admin` does not borrow /v1's route.
#[tokio::test]
async fn path_tricks_cannot_dodge_a_limit() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&redis, &upstream, BUCKET)).await;
    let mut seen = Vec::new();
    for path in ["/v1/a", "//v1/a", "/v1/./a", "/x/../v1/a", "/%76%31/a"] {
        seen.push(get(&proxy.url(path), &[]).await.status);
    }
    assert_eq!(seen, [200, 200, 200, 429, 429]);
    let admin = get(&proxy.url("/v1/../admin"), &[]).await;
    assert_eq!(admin.status, 404, "normalised to /admin: no route");
    let forwarded: Vec<String> = upstream.seen().iter().map(|s| s.uri.clone()).collect();
    assert_eq!(forwarded, ["/v1/a", "/v1/a", "/v1/a"]);
}

/// `rate_limit_headers: legacy` sends X-RateLimit-* instead of the IETF fields.
#[tokio::test]
async fn legacy_headers_when_asked() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let yaml = config(&redis, &upstream, BUCKET)
        .replace("upstreams:", "rate_limit_headers: legacy\nupstreams:");
    let proxy = Proxy::start(&yaml).await;
    let a = get(&proxy.url("/v1"), &[]).await;
    assert_eq!(a.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(a.header("x-ratelimit-remaining"), Some("2"));
    assert_eq!(a.header("x-ratelimit-reset"), Some("1"));
    assert!(a.header("ratelimit").is_none());
}

/// A leaky-bucket limit makes the request wait its slot instead of refusing it, and answers
/// 429 only past max_delay.
#[tokio::test]
async fn leaky_bucket_limit_delays_then_refuses() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let limits = "      - name: smooth
        algorithm: leaky_bucket
        rate: 4/s
        max_delay: 600ms";
    let proxy = Proxy::start(&config(&redis, &upstream, limits)).await;
    let started = Instant::now();
    assert_eq!(concurrent(&proxy, 3).await, [200, 200, 200]);
    assert!(
        started.elapsed() >= Duration::from_millis(490),
        "the third waited two slots: {:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut got = concurrent(&proxy, 6).await;
    got.sort();
    // slots at 0, 250, 500 ms fit within max_delay 600 ms; the rest would wait longer
    assert_eq!(got, [200, 200, 200, 429, 429, 429]);
}

/// A leaky bucket states its policy as the token bucket that admits the same at once: at 5/s
/// with max_delay 1 s it takes 6 requests at once, refilled at 5/s — `q=6;w=2`, as a token
/// bucket of burst 6 at 5/s states (not `w=1`, 6 per second, more than it lets through).
#[tokio::test]
async fn a_leaky_bucket_states_the_policy_of_the_token_bucket_it_matches() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    for (limits, expected) in [
        (
            "      - {name: l, algorithm: leaky_bucket, rate: 5/s, max_delay: 1s}",
            r#""l";q=6;w=2"#,
        ),
        (
            "      - {name: l, algorithm: token_bucket, rate: 5/s, burst: 6}",
            r#""l";q=6;w=2"#,
        ),
    ] {
        let proxy = Proxy::start(&config(&redis, &upstream, limits)).await;
        let a = get(&proxy.url("/v1"), &[]).await;
        assert_eq!(a.header("ratelimit-policy"), Some(expected), "{limits}");
    }
}

/// `n` concurrent GETs of /v1; their statuses in completion-independent order.
async fn concurrent(proxy: &Proxy, n: usize) -> Vec<u16> {
    let url = proxy.url("/v1");
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { get(&url, &[]).await.status })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Two and three proxy instances on one Redis enforce one limit together.
#[tokio::test]
async fn instances_on_one_redis_share_the_limit() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let yaml = config(&redis, &upstream, BUCKET);
    let proxies = [
        Proxy::start(&yaml).await,
        Proxy::start(&yaml).await,
        Proxy::start(&yaml).await,
    ];
    let mut admitted = 0;
    for _round in 0..3 {
        for p in &proxies {
            admitted += usize::from(get(&p.url("/v1"), &[]).await.status == 200);
        }
    }
    assert_eq!(admitted, 3, "burst 3 across three instances, not 3 each");
}

/// Each worker checks its limits over its own Redis connection (driven by its own runtime, so a
/// check wakes no other thread), and every worker's checks take from the same bucket.
#[tokio::test]
async fn each_worker_has_its_own_redis_connection_onto_one_bucket() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let bucket =
        "      - {name: per-client, algorithm: token_bucket, key: ip, rate: 1/min, burst: 100}";
    let yaml = config(&redis, &upstream, bucket).replace(
        "upstreams:",
        "workers: 3\nrate_limit_headers: legacy\nupstreams:",
    );
    let proxy = Proxy::start(&yaml).await;
    // twelve connections, handed out in turn: four on each worker, one after another
    for i in 0..12 {
        let answer = get(&proxy.url(&format!("/v1/n{i}")), &[]).await;
        assert_eq!(answer.status, 200, "request {i}: {}", answer.body);
        let remaining = answer.header("x-ratelimit-remaining");
        assert_eq!(
            remaining,
            Some((99 - i).to_string().as_str()),
            "request {i}: one bucket across the workers"
        );
    }
    let clients = redis.cli(&["CLIENT", "LIST"]);
    // (the redis-cli asking is a client too)
    let proxy_clients = clients
        .lines()
        .filter(|l| !l.contains("cmd=client"))
        .count();
    assert_eq!(proxy_clients, 3, "one connection per worker:\n{clients}");
    proxy.shutdown().await;
}

/// A token bucket followed by an hourly window of one request.
const BUCKET_THEN_HOURLY: &str = "      - name: per-client
        algorithm: token_bucket
        key: ip
        rate: 1/m
        burst: 3
      - name: hourly
        algorithm: fixed_window
        key: ip
        limit: 1
        window: 1h";

/// A request that a later limit refuses costs the earlier ones nothing: the bucket before the
/// hourly window is not drained by the requests the window refuses, so each refusal names the
/// window and waits for it (to the clock hour's end, not the bucket's short refill, an early
/// Retry-After); with Redis the bucket's key holds the one token the admitted request took, and
/// on both stores.
#[tokio::test]
async fn a_request_refused_by_a_later_limit_costs_the_earlier_ones_nothing() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    for yaml in [
        config(&redis, &upstream, BUCKET_THEN_HOURLY),
        memory_config(&upstream, BUCKET_THEN_HOURLY),
    ] {
        let proxy = Proxy::start(&yaml).await;
        clear_of_hour_end(Duration::from_secs(10)).await;
        assert_eq!(get(&proxy.url("/v1"), &[]).await.status, 200);
        for i in 0..6 {
            let denied = get(&proxy.url("/v1"), &[]).await;
            assert_eq!(denied.status, 429, "{i}: {denied:?}");
            let body: serde_json::Value = serde_json::from_str(&denied.body).unwrap();
            assert_eq!(body["limit"], "hourly", "{i}: {denied:?}");
            let retry: u64 = denied.header("retry-after").unwrap().parse().unwrap();
            assert_window_end(retry, &format!("{i}"));
        }
        drop(proxy);
    }
    // one token of the three taken (its bucket full again in a minute), not four or more
    let ttl: u64 = redis
        .cli(&["PTTL", "tollgate:api:per-client:127.0.0.1"])
        .trim()
        .parse()
        .unwrap();
    assert!((1..=60_000).contains(&ttl), "PTTL {ttl}");
    assert_eq!(upstream.seen().len(), 2);
}

/// An hourly fixed window's Retry-After (whole seconds, rounded up) is the clock hour's end,
/// within the test's own pace.
fn assert_window_end(retry: u64, what: &str) {
    let left = hour_left_ms().div_ceil(1000);
    assert!(
        retry.abs_diff(left) <= 3,
        "{what}: Retry-After {retry}, the hour ends in {left} s"
    );
}

/// A window's check given back (a later limit refused the request) is taken off the window it
/// counted in, also in the first milliseconds of that window: a flood refused by a later limit
/// just after a window starts does not fill the window (it filled it, and the window then
/// refused requests the later limit would have let through).
#[tokio::test]
async fn a_refusal_just_after_a_window_starts_costs_the_window_nothing() {
    let upstream = Upstream::start().await;
    let limits = "      - name: win
        algorithm: fixed_window
        limit: 3
        window: 2s
      - name: once
        algorithm: token_bucket
        rate: 1/h
        burst: 1";
    let proxy = Proxy::start(&memory_config(&upstream, limits)).await;
    // just after a window of 2 s starts (they start on the epoch's even seconds)
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    tokio::time::sleep(Duration::from_millis(2000 - now % 2000 + 2)).await;
    assert_eq!(get(&proxy.url("/v1"), &[]).await.status, 200);
    for i in 0..5 {
        let denied = get(&proxy.url("/v1"), &[]).await;
        assert_eq!(denied.status, 429, "{i}: {denied:?}");
        let body: serde_json::Value = serde_json::from_str(&denied.body).unwrap();
        assert_eq!(
            body["limit"], "once",
            "{i}: the window counted a refusal: {body}"
        );
    }
}

/// A leaky bucket before a limit that refuses: the refusal is answered at once, not after the
/// leaky bucket's wait (every limit is asked before the request waits).
#[tokio::test]
async fn a_refusal_after_a_leaky_bucket_does_not_wait_its_slot() {
    let upstream = Upstream::start().await;
    let limits = "      - name: smooth
        algorithm: leaky_bucket
        rate: 0.2/s
        max_delay: 10s
      - name: hourly
        algorithm: fixed_window
        limit: 1
        window: 1h";
    let proxy = Proxy::start(&memory_config(&upstream, limits)).await;
    clear_of_hour_end(Duration::from_secs(5)).await;
    assert_eq!(get(&proxy.url("/v1"), &[]).await.status, 200);
    let started = Instant::now();
    let denied = get(&proxy.url("/v1"), &[]).await;
    assert_eq!(denied.status, 429, "{denied:?}");
    // the slot was 5 s away
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
}

/// A leaky bucket in shadow mode counts and logs; it does not hold requests back.
#[tokio::test]
async fn a_shadow_leaky_bucket_does_not_delay() {
    let upstream = Upstream::start().await;
    let limits = "      - name: smooth
        algorithm: leaky_bucket
        rate: 0.2/s
        max_delay: 20s
        mode: shadow";
    let proxy = Proxy::start(&memory_config(&upstream, limits)).await;
    let started = Instant::now();
    for _ in 0..3 {
        assert_eq!(get(&proxy.url("/v1"), &[]).await.status, 200);
    }
    // enforced, the second would have waited 5 s, the third 10
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
}

/// A shadow limit never refuses a request, also when its store is out and `on_error: deny`.
#[tokio::test]
async fn a_shadow_limit_admits_when_the_store_is_out_under_deny() {
    let mut redis = Redis::start();
    let upstream = Upstream::start().await;
    let limits = "      - name: trial
        algorithm: token_bucket
        rate: 1/s
        burst: 1
        mode: shadow";
    let yaml = config(&redis, &upstream, limits)
        .replace("  timeout: 500ms", "  timeout: 200ms\n  on_error: deny");
    let proxy = Proxy::start(&yaml).await;
    redis.kill();
    for _ in 0..3 {
        assert_eq!(get(&proxy.url("/v1"), &[]).await.status, 200);
    }
}

/// A body announced larger than `max_body_size` gets 413 before any limit counts the request
/// (as nginx checks the size first): the one token of the bucket is still there afterwards.
#[tokio::test]
async fn a_body_too_large_is_refused_before_the_limits_count_it() {
    use http_body_util::{BodyExt, Full};
    let upstream = Upstream::start().await;
    let limits = "      - name: one
        algorithm: token_bucket
        rate: 1/h
        burst: 1";
    let proxy = Proxy::start(&route(&upstream, limits).top("max_body_size: 10").build()).await;
    for _ in 0..3 {
        let req = http::Request::post(proxy.url("/v1"))
            .body(
                Full::new(bytes::Bytes::from(vec![b'x'; 100]))
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .unwrap();
        assert_eq!(common::send(req).await.status, 413);
    }
    assert_eq!(get(&proxy.url("/v1"), &[]).await.status, 200);
    assert_eq!(get(&proxy.url("/v1"), &[]).await.status, 429);
}

/// A request waiting for its leaky-bucket slot whose client goes away costs its limits
/// nothing: the slot (the last handed out) and the other limits' tokens are given back, so the
/// next request takes them.
#[tokio::test]
async fn a_client_gone_while_its_request_waits_gives_back_what_it_took() {
    let upstream = Upstream::start().await;
    let limits = "      - name: smooth
        algorithm: leaky_bucket
        rate: 0.5/s
        max_delay: 10s
      - name: two
        algorithm: token_bucket
        rate: 1/h
        burst: 2";
    let proxy = Proxy::start(&memory_config(&upstream, limits)).await;
    assert_eq!(get(&proxy.url("/v1/first"), &[]).await.status, 200);
    let url = proxy.url("/v1/gone");
    let impatient = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_millis(200), get(&url, &[])).await
    });
    assert!(impatient.await.unwrap().is_err(), "the client gave up");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let next = get(&proxy.url("/v1/next"), &[]).await;
    assert_eq!(
        next.status, 200,
        "the second token is there again: {next:?}"
    );
    let seen = upstream.seen();
    let uris: Vec<&str> = seen.iter().map(|s| s.uri.as_str()).collect();
    assert_eq!(uris, ["/v1/first", "/v1/next"]);
    // the slot two seconds after the first, not four
    let gap = seen[1].at.duration_since(seen[0].at);
    assert!(gap < Duration::from_secs(3), "{gap:?}");
}

/// When the first limit refuses, the later ones are asked too: the first answers, but
/// with the longest wait of those refusing, so a client is not told to come back in a second
/// when an hourly quota refuses it for an hour; the rate-limit headers state both refusals.
/// Both stores, the deny cache's answer too.
#[tokio::test]
async fn the_retry_after_of_a_refusal_is_the_longest_of_the_limits_refusing() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let limits = "      - name: per-second
        algorithm: token_bucket
        key: ip
        rate: 1/10s
        burst: 2
      - name: hourly
        algorithm: fixed_window
        key: ip
        limit: 2
        window: 1h";
    for yaml in [
        config(&redis, &upstream, limits),
        memory_config(&upstream, limits),
    ] {
        let proxy = Proxy::start(&yaml).await;
        clear_of_hour_end(Duration::from_secs(10)).await;
        for _ in 0..2 {
            assert_eq!(get(&proxy.url("/v1"), &[]).await.status, 200);
        }
        for i in 0..3 {
            let denied = get(&proxy.url("/v1"), &[]).await;
            assert_eq!(denied.status, 429, "{i}: {denied:?}");
            let body: serde_json::Value = serde_json::from_str(&denied.body).unwrap();
            assert_eq!(
                body["limit"], "per-second",
                "the first refusing limit answers"
            );
            let retry: u64 = denied.header("retry-after").unwrap().parse().unwrap();
            assert_window_end(retry, &format!("{i}: the hourly window's wait"));
            let retry_ms = body["retry_after_ms"].as_u64().unwrap();
            assert!(retry_ms.abs_diff(hour_left_ms()) < 3_000, "{body}");
            // both limits are stated, in order; the hourly window's `t` is the wait
            // Retry-After states (not the per-second bucket's short refill)
            assert_eq!(
                denied.header("ratelimit-policy"),
                Some(r#""per-second";q=2;w=20, "hourly";q=2;w=3600"#),
                "{denied:?}"
            );
            let shown = denied.header("ratelimit").unwrap();
            let (bucket, window) = shown.split_once(", ").expect("two items");
            assert!(bucket.starts_with(r#""per-second";r=0;t="#), "{shown}");
            assert_eq!(window, format!(r#""hourly";r=0;t={retry}"#), "{denied:?}");
        }
        drop(proxy);
        redis.cli(&["flushall"]);
    }
}

/// A per-second and an hourly limit on one route: `RateLimit-Policy` and `RateLimit` state both,
/// in the route's order, each with its own remaining count, and the legacy headers the tighter.
/// The refusal lists both too, the refusing window's `t` equal to `Retry-After`. Both stores.
#[tokio::test]
async fn every_enforced_limit_of_a_route_is_in_the_headers() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let limits = "      - name: per-second
        algorithm: token_bucket
        rate: 1/s
        burst: 10
      - name: hourly
        algorithm: fixed_window
        limit: 3
        window: 1h";
    let both = |yaml: String| yaml.replace("upstreams:", "rate_limit_headers: both\nupstreams:");
    for yaml in [
        both(config(&redis, &upstream, limits)),
        both(memory_config(&upstream, limits)),
    ] {
        let proxy = Proxy::start(&yaml).await;
        clear_of_hour_end(Duration::from_secs(10)).await;
        for taken in 1..=3u64 {
            let a = get(&proxy.url("/v1"), &[]).await;
            assert_eq!(a.status, 200, "{a:?}");
            assert_eq!(
                a.header("ratelimit-policy"),
                Some(r#""per-second";q=10;w=10, "hourly";q=3;w=3600"#)
            );
            let shown = a.header("ratelimit").unwrap();
            let (bucket, window) = shown.split_once(", ").expect("two items");
            // (a bucket of 10 at 1/s is whole again a second per token taken)
            let bucket_left = 10 - taken;
            assert_eq!(bucket, format!(r#""per-second";r={bucket_left};t={taken}"#));
            let hour = window_secs(window, &format!(r#""hourly";r={};t="#, 3 - taken));
            assert_window_end(hour, &format!("request {taken}"));
            // the hourly window has fewer left: the legacy headers state it
            assert_eq!(a.header("x-ratelimit-limit"), Some("3"));
            let left = (3 - taken).to_string();
            assert_eq!(a.header("x-ratelimit-remaining"), Some(left.as_str()));
        }
        let denied = get(&proxy.url("/v1"), &[]).await;
        assert_eq!(denied.status, 429, "{denied:?}");
        assert_eq!(
            denied.header("ratelimit-policy"),
            Some(r#""per-second";q=10;w=10, "hourly";q=3;w=3600"#)
        );
        let retry = denied.header("retry-after").unwrap();
        let shown = denied.header("ratelimit").unwrap();
        let (bucket, window) = shown.split_once(", ").expect("two items");
        assert!(bucket.starts_with(r#""per-second";r="#), "{shown}");
        assert_eq!(window, format!(r#""hourly";r=0;t={retry}"#));
        assert_eq!(denied.header("x-ratelimit-reset"), Some(retry));
        assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
        drop(proxy);
        redis.cli(&["flushall"]);
    }
}

/// The `t` of an item that starts with `prefix` (`"hourly";r=2;t=`).
fn window_secs(item: &str, prefix: &str) -> u64 {
    item.strip_prefix(prefix)
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{item:?} is not {prefix}<seconds>"))
}

//! One value per key: a request that sends the header or query parameter a limit is keyed on
//! more than once gets 400 (or is keyed on the first or last value, as `duplicate_key` says),
//! so a client cannot pick a fresh bucket with a decoy value the upstream never reads.
//! A real upstream, a real Redis, tollgate in process.

mod common;
common::both_http1_clients!();

use common::{get, Proxy, Redis, Upstream, Yaml};

/// Route `api` on `/v1` with `limits` (YAML flow items, one per line), store in `redis`.
fn config(redis: &Redis, upstream: &Upstream, limits: &[&str]) -> String {
    let items: String = limits.iter().map(|l| format!("  - {l}\n")).collect();
    Yaml::to(&[upstream.url()])
        .redis(redis, "timeout: 500ms")
        .route("api", "/v1", &format!("limits:\n{items}"))
        .build()
}

/// One request a minute per value of `key`, with `more` keys.
fn per_key(key: &str, more: &str) -> String {
    format!("{{name: per-key, algorithm: token_bucket, rate: 1/m, burst: 1, key: \"{key}\"{more}}}")
}

/// The status of a GET of `path` with `headers`.
async fn status(proxy: &Proxy, path: &str, headers: &[(&str, &str)]) -> u16 {
    get(&proxy.url(path), headers).await.status
}

/// The attack: once REALKEY is refused, `?key=junk1&key=REALKEY` (which Django, PHP and Rails
/// serve as REALKEY) gets 400 naming the key, in every spelling of the repeat, and never
/// reaches the upstream.
#[tokio::test]
async fn a_repeated_query_key_is_refused() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&redis, &upstream, &[&per_key("query:key", "")])).await;
    assert_eq!(status(&proxy, "/v1/x?key=REALKEY", &[]).await, 200);
    assert_eq!(status(&proxy, "/v1/x?key=REALKEY", &[]).await, 429);
    let refused = get(&proxy.url("/v1/x?key=junk1&key=REALKEY"), &[]).await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(refused.header("content-type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body["error"], "duplicate_key");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("query:key") && message.contains("per-key"),
        "{message}"
    );
    // an encoded name is the same name; an empty or bare occurrence counts
    for repeat in [
        "/v1/x?k%65y=junk2&key=REALKEY",
        "/v1/x?key=&key=REALKEY",
        "/v1/x?key&key=REALKEY",
        "/v1/x?a=1&key=junk3&b=2&key=REALKEY",
    ] {
        assert_eq!(status(&proxy, repeat, &[]).await, 400, "{repeat}");
    }
    // other parameters may repeat
    assert_eq!(status(&proxy, "/v1/x?a=1&a=2&key=fresh", &[]).await, 200);
    assert_eq!(upstream.seen().len(), 2, "only the two admitted requests");
}

/// Two `X-Api-Key` lines get 400 as well; one line holding a comma is one value.
#[tokio::test]
async fn a_repeated_key_header_is_refused() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let limit = per_key("header:X-Api-Key", "");
    let proxy = Proxy::start(&config(&redis, &upstream, &[&limit])).await;
    let real = [("x-api-key", "REALKEY")];
    assert_eq!(status(&proxy, "/v1/x", &real).await, 200);
    assert_eq!(status(&proxy, "/v1/x", &real).await, 429);
    let two = [("x-api-key", "junk1"), ("x-api-key", "REALKEY")];
    let refused = get(&proxy.url("/v1/x"), &two).await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert!(
        refused.body.contains("header:x-api-key"),
        "{}",
        refused.body
    );
    let empty_first = [("x-api-key", ""), ("x-api-key", "REALKEY")];
    assert_eq!(status(&proxy, "/v1/x", &empty_first).await, 400);
    let comma = [("x-api-key", "junk1, REALKEY")];
    assert_eq!(status(&proxy, "/v1/x", &comma).await, 200);
    assert_eq!(upstream.seen().len(), 2);
}

/// `duplicate_key: last` keys on the last value and `first` on the first: the decoy no longer
/// picks a fresh bucket when it comes where the setting does not look.
#[tokio::test]
async fn first_and_last_key_on_their_value() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let last = per_key("query:key", ", duplicate_key: last");
    let proxy = Proxy::start(&config(&redis, &upstream, &[&last])).await;
    assert_eq!(status(&proxy, "/v1/x?key=REALKEY", &[]).await, 200);
    assert_eq!(
        status(&proxy, "/v1/x?key=junk1&key=REALKEY", &[]).await,
        429
    );
    assert_eq!(
        status(&proxy, "/v1/x?key=REALKEY&key=junk1", &[]).await,
        200
    );
    let two = [("x-api-key", "a"), ("x-api-key", "b")];
    let header_last = per_key("header:x-api-key", ", duplicate_key: last");
    let proxy = Proxy::start(&config(&redis, &upstream, &[&header_last])).await;
    assert_eq!(status(&proxy, "/v1/x", &[("x-api-key", "b")]).await, 200);
    assert_eq!(status(&proxy, "/v1/x", &two).await, 429, "keyed on b");

    let redis = Redis::start();
    let first = per_key("query:key", ", duplicate_key: first");
    let proxy = Proxy::start(&config(&redis, &upstream, &[&first])).await;
    assert_eq!(status(&proxy, "/v1/x?key=REALKEY", &[]).await, 200);
    assert_eq!(
        status(&proxy, "/v1/x?key=REALKEY&key=junk1", &[]).await,
        429
    );
    assert_eq!(
        status(&proxy, "/v1/x?key=junk1&key=REALKEY", &[]).await,
        200
    );
}

/// A composite key applies the rule to each part: a repeated header refuses whatever the
/// other parts are.
#[tokio::test]
async fn a_composite_key_refuses_a_repeated_part() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let limit = "{name: per-key, algorithm: token_bucket, rate: 1/m, burst: 1, \
                 key: [ip, \"header:X-Api-Key\", \"query:t\"]}";
    let proxy = Proxy::start(&config(&redis, &upstream, &[limit])).await;
    let two = [("x-api-key", "a"), ("x-api-key", "b")];
    assert_eq!(status(&proxy, "/v1/x?t=1", &two).await, 400);
    assert_eq!(
        status(&proxy, "/v1/x?t=1&t=2", &[("x-api-key", "a")]).await,
        400
    );
    assert_eq!(
        status(&proxy, "/v1/x?t=1", &[("x-api-key", "a")]).await,
        200
    );
    assert_eq!(upstream.seen().len(), 1);
}

/// The 400 takes nothing from the route's other limits (a bucket and a concurrency limit),
/// and a repeat of a name no limit is keyed on is no fault.
#[tokio::test]
async fn the_refusal_charges_no_other_limit() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let per_ip = "{name: per-ip, algorithm: token_bucket, rate: 1/m, burst: 2}";
    let running = "{name: running, algorithm: concurrency, limit: 1}";
    let keyed = per_key("header:x-api-key", "");
    let proxy = Proxy::start(&config(&redis, &upstream, &[per_ip, running, &keyed])).await;
    for _ in 0..3 {
        let two = [("x-api-key", "a"), ("x-api-key", "b")];
        assert_eq!(status(&proxy, "/v1/x", &two).await, 400);
    }
    let admitted = get(&proxy.url("/v1/x?key=1&key=2"), &[("x-api-key", "a")]).await;
    assert_eq!(admitted.status, 200, "{admitted:?}");
    let shown = admitted.header("ratelimit").unwrap_or_default();
    assert!(shown.contains(r#""per-ip";r=1"#), "{shown}");
    let keys = redis.cli(&["--scan", "--pattern", "*per-key*"]);
    assert_eq!(keys.lines().count(), 1, "one per-key bucket: {keys}");
}

/// A shadow limit never refuses, a repeat included.
#[tokio::test]
async fn a_shadow_limit_passes_a_repeat() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let shadow = per_key("query:key", ", mode: shadow");
    let proxy = Proxy::start(&config(&redis, &upstream, &[&shadow])).await;
    assert_eq!(status(&proxy, "/v1/x?key=a&key=b", &[]).await, 200);
    assert_eq!(upstream.seen().len(), 1);
}

/// An exempt client is not asked for one value by the limit it is exempt from.
#[tokio::test]
async fn an_exempt_client_passes_a_repeat() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let exempt = per_key("query:key", ", exempt: [127.0.0.0/8]");
    let proxy = Proxy::start(&config(&redis, &upstream, &[&exempt])).await;
    assert_eq!(status(&proxy, "/v1/x?key=a&key=b", &[]).await, 200);
    assert_eq!(upstream.seen().len(), 1);
}

/// The repeat is refused before the deny cache is asked: a client the cache remembers still
/// gets 400, not the cached 429, and a decoy first value finds no unremembered bucket.
#[tokio::test]
async fn the_repeat_is_refused_before_the_deny_cache() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let per_ip = "{name: per-ip, algorithm: token_bucket, rate: 1/m, burst: 100}";
    let keyed = per_key("query:key", "");
    let proxy = Proxy::start(&config(&redis, &upstream, &[per_ip, &keyed])).await;
    assert_eq!(status(&proxy, "/v1/x?key=REALKEY", &[]).await, 200);
    assert_eq!(status(&proxy, "/v1/x?key=REALKEY", &[]).await, 429);
    assert_eq!(
        status(&proxy, "/v1/x?key=REALKEY&key=REALKEY", &[]).await,
        400
    );
    assert_eq!(status(&proxy, "/v1/x?key=junk&key=REALKEY", &[]).await, 400);
    assert_eq!(upstream.seen().len(), 1);
}

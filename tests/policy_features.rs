//! Per-limit policy features: shadow mode, exempt networks.

mod common;
common::both_http1_clients!();

use std::time::Duration;

use common::{clear_of_hour_end, get, Proxy, Redis, Upstream, Yaml};

/// Route `api` with limit `tight` (2 an hour), and `limit_extra`: more of its keys, or more
/// limits after it, as YAML under the route's `limits` list item.
fn config(redis: &Redis, upstream: &Upstream, limit_extra: &str) -> String {
    let limits = format!(
        "limits:\n  - name: tight\n    algorithm: fixed_window\n    limit: 2\n    window: 1h\n{limit_extra}"
    );
    Yaml::to(&[upstream.url()])
        .redis(redis, "timeout: 500ms")
        .route("api", "/", &limits)
        .build()
}

/// A shadow limit counts (its key fills up in Redis) but never denies.
#[tokio::test]
async fn shadow_limit_counts_but_never_denies() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&redis, &upstream, "    mode: shadow\n")).await;
    // (the hourly window must not end under the count)
    clear_of_hour_end(Duration::from_secs(5)).await;
    // the limit's figures on every response, also once the shadow limit would deny
    for left in [1, 0, 0, 0, 0] {
        let a = get(&proxy.url("/"), &[]).await;
        assert_eq!(a.status, 200);
        assert_eq!(a.header("ratelimit-policy"), Some(r#""tight";q=2;w=3600"#));
        let shown = a
            .header("ratelimit")
            .expect("RateLimit on a shadow denial too");
        assert!(
            shown.starts_with(&format!(r#""tight";r={left};t="#)),
            "{shown}"
        );
    }
    assert_eq!(upstream.seen().len(), 5);
    let key = redis.cli(&["--scan", "--pattern", "tollgate:api:tight:*"]);
    assert_eq!(
        redis.cli(&["hget", key.trim(), "c"]),
        "2",
        "counted up to the limit"
    );
}

/// Beside an enforced limit, a shadow limit stays out of the rate-limit headers, also once it
/// would deny: they show the enforced limit, so that clients following them do not slow down
/// for a trial.
#[tokio::test]
async fn the_headers_show_the_enforced_limit_beside_a_shadow_one() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let enforced = "    mode: shadow
  - name: roomy
    algorithm: token_bucket
    rate: 1/h
    burst: 50
";
    let proxy = Proxy::start(&config(&redis, &upstream, enforced)).await;
    for left in 0..4 {
        let a = get(&proxy.url("/"), &[]).await;
        assert_eq!(a.status, 200);
        assert_eq!(
            a.header("ratelimit-policy"),
            Some(r#""roomy";q=50;w=180000"#)
        );
        let shown = a.header("ratelimit").unwrap();
        assert!(
            shown.starts_with(&format!(r#""roomy";r={};t="#, 49 - left)),
            "{shown}"
        );
    }
}

/// Clients in an exempt network are never limited and cost no store call; others are.
#[tokio::test]
async fn exempt_networks_skip_the_limit() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let exempt = config(&redis, &upstream, "    exempt: [127.0.0.0/8]\n");
    let proxy = Proxy::start(&exempt).await;
    for _ in 0..4 {
        let a = get(&proxy.url("/"), &[]).await;
        assert_eq!(a.status, 200);
        assert!(
            a.header("ratelimit").is_none(),
            "no limit applied, no headers"
        );
    }
    // (the fleet's figures aside)
    assert_eq!(
        redis.cli(&["--scan", "--pattern", "*:api:*"]),
        "",
        "no key written for an exempt client"
    );
    let other = config(&redis, &upstream, "    exempt: [10.0.0.0/8]\n");
    let proxy = Proxy::start(&other).await;
    clear_of_hour_end(Duration::from_secs(5)).await;
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(get(&proxy.url("/"), &[]).await.status);
    }
    assert_eq!(got, [200, 200, 429]);
}

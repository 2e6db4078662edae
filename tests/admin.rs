//! The admin listener: metrics after a known sequence of requests, health, readiness, and the
//! effective config with the Redis password redacted.

mod common;
common::both_http1_clients!();

use std::time::Duration;

use common::{eventually, get, Proxy, Redis, Upstream, Yaml};
use tollgate::store::StoreError;

fn metric_line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.lines().find(|l| l.starts_with(prefix))
}

/// The value of the first sample whose line starts with `prefix` (a missing one fails).
fn metric_value(text: &str, prefix: &str) -> u64 {
    metric_line(text, prefix)
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {prefix} in:\n{text}"))
}

/// After 3 admitted, 2 denied, 1 unrouted and 1 paced request, the metrics say exactly that.
#[tokio::test]
async fn metrics_count_a_known_sequence() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .top("admin: {listen: 127.0.0.1:0}")
        .redis(&redis, "timeout: 500ms")
        .also_upstream("paced", &[upstream.url()], "pace: {rate: 100/s}")
        .route(
            "api",
            "/api",
            "limits: [{name: per-client, algorithm: token_bucket, rate: 1/h, burst: 3}]",
        )
        .route_to("slow", "/slow", "paced", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    for _ in 0..5 {
        get(&proxy.url("/api"), &[]).await;
    }
    assert_eq!(get(&proxy.url("/nowhere"), &[]).await.status, 404);
    assert_eq!(get(&proxy.url("/slow"), &[]).await.status, 200);
    let admin = format!("http://{}", proxy.admin.expect("admin listener"));
    let m = get(&format!("{admin}/metrics"), &[]).await;
    assert_eq!(m.status, 200);
    assert_eq!(
        m.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let t = &m.body;
    for expected in [
        r#"tollgate_requests_total{route="api",status="200"} 3"#,
        r#"tollgate_requests_total{route="api",status="429"} 2"#,
        r#"tollgate_requests_total{route="-",status="404"} 1"#,
        r#"tollgate_requests_total{route="slow",status="200"} 1"#,
        r#"tollgate_limit_decisions_total{route="api",limit="per-client",decision="allowed"} 3"#,
        r#"tollgate_limit_decisions_total{route="api",limit="per-client",decision="denied"}"#,
        r#"tollgate_request_duration_seconds_count{route="api"} 5"#,
        r#"tollgate_pacing_delay_seconds_count{upstream="paced"} 1"#,
        r#"tollgate_config_reloads_total{result="ok"} 0"#,
        // the error series exist at zero before any error, for dashboards and `rate()`
        r#"tollgate_store_errors_total{kind="timeout"} 0"#,
        r#"tollgate_store_errors_total{kind="connection"} 0"#,
        r#"tollgate_upstream_errors_total{upstream="api",kind="connect"} 0"#,
        r#"tollgate_upstream_errors_total{upstream="paced",kind="timeout"} 0"#,
    ] {
        assert!(t.contains(expected), "missing `{expected}` in:\n{t}");
    }
    // the 5th request may be denied from the deny cache: 2 denials split between store and cache
    let denied_by_store: u64 = metric_value(
        t,
        r#"tollgate_limit_decisions_total{route="api",limit="per-client",decision="denied"}"#,
    );
    assert_eq!(denied_by_store, 2);
    let store_calls: u64 = metric_value(t, "tollgate_store_duration_seconds_count");
    let cache_hits: u64 = metric_value(t, "tollgate_deny_cache_hits_total");
    assert_eq!(
        store_calls + cache_hits,
        6,
        "5 limit checks + 1 pacing slot; {t}"
    );
    assert_eq!(cache_hits, 1, "the second denial came from the deny cache");

    assert_eq!(get(&format!("{admin}/healthz"), &[]).await.body, "ok");
    assert_eq!(get(&format!("{admin}/readyz"), &[]).await.status, 200);
}

/// Checks of a busy bucket answered from leased tokens are counted apart from store calls
/// (`tollgate_store_leased_total`), not timed as calls of no time: every admitted request is
/// one or the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_answered_from_leases_are_counted_apart_from_store_calls() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let big =
        "limits: [{name: big, algorithm: token_bucket, rate: 1/h, burst: 1000000, key: route}]";
    let yaml = Yaml::to(&[upstream.url()])
        .top("workers: 1\nadmin: {listen: 127.0.0.1:0}")
        .redis(&redis, "timeout: 2s")
        .route("api", "/", big)
        .build();
    let proxy = Proxy::start(&yaml).await;
    let admin = format!("http://{}/metrics", proxy.admin.expect("admin listener"));
    let (mut sent, mut leased) = (0u64, 0u64);
    // 64 clients at once, so that checks meet on the worker's connection and lease
    for _ in 0..10 {
        let clients: Vec<_> = (0..64)
            .map(|_| {
                let url = proxy.url("/x");
                tokio::spawn(async move {
                    for _ in 0..20 {
                        assert_eq!(get(&url, &[]).await.status, 200);
                    }
                })
            })
            .collect();
        for c in clients {
            c.await.unwrap();
        }
        sent += 64 * 20;
        let t = get(&admin, &[]).await.body;
        leased = metric_value(&t, "tollgate_store_leased_total");
        let calls: u64 = metric_value(&t, "tollgate_store_duration_seconds_count");
        let allowed: u64 = metric_value(
            &t,
            r#"tollgate_limit_decisions_total{route="api",limit="big",decision="allowed"}"#,
        );
        assert_eq!(allowed, sent, "{t}");
        assert_eq!(
            calls + leased,
            sent,
            "a check is a store call or leased: {t}"
        );
        if leased > 0 {
            break;
        }
    }
    assert!(
        leased > 0,
        "no check answered from a lease in {sent} requests"
    );
}

/// One route with a Redis token bucket that never denies, `on_error: deny` (no fallback), an
/// admin listener.
fn deny_on_error(url: &str, timeout: &str, upstream: &Upstream) -> String {
    let store =
        format!("store: {{backend: redis, url: \"{url}\", timeout: {timeout}, on_error: deny}}");
    with_store(&store, upstream)
}

/// [`deny_on_error`] with the `store` section given whole.
fn with_store(store: &str, upstream: &Upstream) -> String {
    Yaml::to(&[upstream.url()])
        .top("admin: {listen: 127.0.0.1:0}")
        .top(store)
        .route(
            "api",
            "/",
            "limits: [{name: l, algorithm: token_bucket, rate: 100/s}]",
        )
        .build()
}

/// `/config` shows the effective configuration with the Redis password redacted, and
/// `/readyz` turns 503 when Redis is out with `on_error: deny` (no fallback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_redacts_secrets_and_readyz_follows_the_store() {
    let mut redis = Redis::start();
    let upstream = Upstream::start().await;
    let url = format!("redis://:s3cret@127.0.0.1:{}/0", redis.port);
    let yaml = deny_on_error(&url, "50ms", &upstream);
    redis.cli(&["config", "set", "requirepass", "s3cret"]);
    let proxy = Proxy::start(&yaml).await;
    let admin = format!("http://{}", proxy.admin.unwrap());
    let config = get(&format!("{admin}/config"), &[]).await;
    assert_eq!(config.status, 200);
    assert!(!config.body.contains("s3cret"), "{}", config.body);
    assert!(config.body.contains("api"), "{}", config.body);
    // the worker threads in force (the harness's two, `workers` being unset in the file)
    let shown: serde_json::Value = serde_json::from_str(&config.body).unwrap();
    assert_eq!(shown["workers"], 2, "{}", config.body);
    assert_eq!(
        get(&proxy.url("/"), &[]).await.status,
        200,
        "AUTH from the URL works"
    );
    redis.kill();
    for _ in 0..8 {
        assert_eq!(get(&proxy.url("/"), &[]).await.status, 503);
    }
    assert_eq!(get(&format!("{admin}/readyz"), &[]).await.status, 503);
    // five failures open the breaker: the calls it keeps from Redis are counted too
    let m = get(&format!("{admin}/metrics"), &[]).await.body;
    let skipped: u64 = metric_value(&m, r#"tollgate_store_errors_total{kind="circuit_open"}"#);
    assert!(skipped >= 1, "{m}");
}

/// On a route with several limits, the denials answered from the deny cache (before any store
/// is asked) are counted in `tollgate_deny_cache_hits_total` like those of a single limit.
#[tokio::test]
async fn deny_cache_hits_are_counted_on_routes_with_several_limits() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let limits = "limits:
  - {name: per-client, algorithm: token_bucket, rate: 1/h, burst: 1}
  - {name: hourly, algorithm: sliding_window, limit: 1000, window: 1h}";
    let yaml = Yaml::to(&[upstream.url()])
        .top("admin: {listen: 127.0.0.1:0}")
        .redis(&redis, "timeout: 500ms")
        .route("api", "/", limits)
        .build();
    let proxy = Proxy::start(&yaml).await;
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..6 {
            v.push(get(&proxy.url("/"), &[]).await.status);
        }
        v
    };
    assert_eq!(statuses, [200, 429, 429, 429, 429, 429]);
    let m = get(&format!("http://{}/metrics", proxy.admin.unwrap()), &[])
        .await
        .body;
    let hits: u64 = metric_value(&m, "tollgate_deny_cache_hits_total");
    // the first refusal is the store's, then remembered
    assert_eq!(hits, 4, "{m}");
}

/// `/readyz` asks Redis itself (with `on_error: deny`, no fallback): it says no as soon as Redis
/// is gone and yes as soon as it is back, with no proxied request in between to find out — a
/// load balancer that stopped sending requests because of the 503 gets the instance back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_asks_redis_without_waiting_for_traffic() {
    let mut redis = Redis::start();
    let upstream = Upstream::start().await;
    let yaml = deny_on_error(&redis.url(), "200ms", &upstream);
    let proxy = Proxy::start(&yaml).await;
    let readyz = format!("http://{}/readyz", proxy.admin.unwrap());
    let status = || async { get(&readyz, &[]).await.status };
    assert_eq!(status().await, 200);
    redis.kill();
    let down = get(&readyz, &[]).await;
    assert_eq!(down.status, 503, "{}", down.body);
    assert!(down.body.starts_with("not ready: "), "{}", down.body);
    // probed again and again while it is out: the breaker opens, and still closes on its own
    for _ in 0..8 {
        assert_eq!(status().await, 503);
    }
    redis.restart();
    eventually(Duration::from_secs(10), || async { status().await == 200 }).await;
    assert!(
        upstream.seen().is_empty(),
        "no request went through the proxy"
    );
    assert_eq!(get(&proxy.url("/"), &[]).await.status, 200);
}

/// A request whose client goes away before it is answered is still counted and logged, with
/// status 499 (nginx's "client closed request"), not lost.
#[tokio::test]
async fn abandoned_requests_are_counted_as_499() {
    use tokio::io::AsyncWriteExt;
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .top("admin: {listen: 127.0.0.1:0}")
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    for sent in 1..=3 {
        let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        s.write_all(b"GET /slow/3000 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        // hang up once the request is under way at the upstream
        eventually(Duration::from_secs(5), || async {
            upstream.seen().len() == sent
        })
        .await;
        drop(s);
    }
    let admin = format!("http://{}/metrics", proxy.admin.expect("admin listener"));
    // three abandoned requests counted as 499
    eventually(Duration::from_secs(5), || async {
        let m = get(&admin, &[]).await;
        metric_line(
            &m.body,
            r#"tollgate_requests_total{route="api",status="499"}"#,
        )
        .is_some_and(|l| l.ends_with(" 3"))
    })
    .await;
}

/// On a Cluster whose state is `fail` (a master gone), with `on_error: deny`, a `/readyz` probe
/// that finds the cluster unready keeps the circuit breaker open (it closed it: the next
/// requests went to the broken cluster again, each waiting for it); and the probes are not
/// counted among the requests' store errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_on_a_failed_cluster_keeps_the_breaker_open() {
    let mut cluster = common::Cluster::start();
    let upstream = Upstream::start().await;
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let store = format!(
        "store: {{backend: redis, cluster: [{}], timeout: 300ms, on_error: deny}}",
        nodes.join(", ")
    );
    let proxy = Proxy::start(&with_store(&store, &upstream)).await;
    let admin = format!("http://{}", proxy.admin.unwrap());
    assert_eq!(get(&proxy.url("/"), &[]).await.status, 200);
    cluster.nodes[2].kill();
    // the cluster notices
    eventually(Duration::from_secs(20), || async {
        cluster.nodes[0]
            .cli(&["cluster", "info"])
            .contains("cluster_state:fail")
    })
    .await;
    let skipped = || async {
        let text = get(&format!("{admin}/metrics"), &[]).await.body;
        metric_value(&text, r#"tollgate_store_errors_total{kind="circuit_open"}"#)
    };
    // the requests' failures open the breaker: then they are answered without the store
    eventually(Duration::from_secs(10), || async {
        assert_eq!(get(&proxy.url("/"), &[]).await.status, 503);
        skipped().await > 0
    })
    .await;
    for _ in 0..3 {
        // Probes within the cool-down are kept from the cluster; past it, one goes to the
        // cluster and finds it unready. Polling for it, not sleeping the cool-down, leaves the
        // test no margin to miss on a busy machine.
        let before = skipped().await;
        let kept = StoreError::CircuitOpen.to_string();
        eventually(Duration::from_secs(10), || async {
            let probe = get(&format!("{admin}/readyz"), &[]).await;
            assert_eq!(probe.status, 503, "{}", probe.body);
            !probe.body.contains(&kept)
        })
        .await;
        assert_eq!(
            skipped().await,
            before,
            "a probe counted as a request's error"
        );
        // the breaker is open again: the next request is not sent to the cluster
        assert_eq!(get(&proxy.url("/"), &[]).await.status, 503);
        assert_eq!(
            skipped().await,
            before + 1,
            "the request after the probe went to the store"
        );
    }
}

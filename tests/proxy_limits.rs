//! Inbound limits end to end: a real upstream, a real Redis, tollgate in process.

mod common;

use common::{get, Proxy, Redis, Upstream};

fn config(redis: &Redis, upstream: &Upstream, limits: &str) -> String {
    format!(
        r#"
listen: 127.0.0.1:0
store:
  backend: redis
  url: {redis}
  timeout: 500ms
upstreams:
  api:
    targets: [{upstream}]
routes:
  - name: api
    match: {{path_prefix: /v1}}
    upstream: api
    limits:
{limits}
"#,
        redis = redis.url(),
        upstream = upstream.url(),
    )
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
    assert!((900..=1000).contains(&retry), "{retry}");
    assert_eq!(denied.header("ratelimit"), Some(r#""per-client";r=0;t=3"#));
    assert_eq!(upstream.seen().len(), 3);
}

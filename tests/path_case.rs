//! Case and NUL in paths: a route with `case_sensitive: false` counts `/API/x` with `/api/x`,
//! as Express, ASP.NET Core and IIS serve them alike; a path holding `%00` gets 400 before any
//! route is picked. A real upstream, a real Redis, tollgate in process.

mod common;
common::both_http1_clients!();

use common::{get, Proxy, Redis, Upstream, Yaml};

/// One request a minute per client, keyed on `key`.
fn limit(key: &str) -> String {
    format!(
        "limits: [{{name: per-client, algorithm: token_bucket, rate: 1/m, burst: 1, key: {key}}}]"
    )
}

/// Route `api` on `/api` (with `matching` after the prefix, and `more` keys) above a catch-all
/// `rest` without limits, both to `upstream`; store in `redis`.
fn config(redis: &Redis, upstream: &Upstream, matching: &str, more: &str) -> String {
    Yaml::to(&[upstream.url()])
        .redis(redis, "timeout: 500ms")
        .route("api", &format!("/api{matching}"), more)
        .route("rest", "/", "")
        .build()
}

async fn status(proxy: &Proxy, path: &str) -> u16 {
    get(&proxy.url(path), &[]).await.status
}

/// With `case_sensitive: false`, `/API/users` spends the `/api` limit: refused once
/// `/api/users` took it. The upstream gets the path as the client spelled it.
#[tokio::test]
async fn any_case_counts_against_the_limit() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let yaml = config(&redis, &upstream, ", case_sensitive: false", &limit("ip"));
    let proxy = Proxy::start(&yaml).await;
    assert_eq!(status(&proxy, "/api/users").await, 200);
    for spelling in ["/API/users", "/Api/users", "/aPI"] {
        assert_eq!(status(&proxy, spelling).await, 429, "{spelling}");
    }
    let seen: Vec<String> = upstream.seen().iter().map(|s| s.uri.clone()).collect();
    assert_eq!(seen, ["/api/users"]);

    let redis = Redis::start();
    let yaml = config(&redis, &upstream, ", case_sensitive: false", &limit("ip"));
    let proxy = Proxy::start(&yaml).await;
    assert_eq!(status(&proxy, "/API/Users").await, 200);
    assert_eq!(
        upstream.seen()[1].uri,
        "/API/Users",
        "the client's spelling"
    );
}

/// By default the match is case-sensitive: `/API/users` goes to the catch-all, uncounted.
#[tokio::test]
async fn by_default_case_matters() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&redis, &upstream, "", &limit("ip"))).await;
    assert_eq!(status(&proxy, "/api/users").await, 200);
    assert_eq!(status(&proxy, "/api/users").await, 429);
    assert_eq!(status(&proxy, "/API/users").await, 200);
}

/// A limit keyed on `path` counts one bucket for every spelling of a path on such a route, and
/// `strip_prefix` strips the prefix in any case.
#[tokio::test]
async fn a_path_key_and_strip_prefix_ignore_case() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let more = format!("strip_prefix: true\n{}", limit("path"));
    let yaml = config(&redis, &upstream, ", case_sensitive: false", &more);
    let proxy = Proxy::start(&yaml).await;
    assert_eq!(status(&proxy, "/API/Users").await, 200);
    assert_eq!(status(&proxy, "/api/users").await, 429);
    assert_eq!(status(&proxy, "/aPi/USERS").await, 429);
    assert_eq!(status(&proxy, "/api/orders").await, 200, "another path");
    let seen: Vec<String> = upstream.seen().iter().map(|s| s.uri.clone()).collect();
    assert_eq!(seen, ["/Users", "/orders"]);
}

/// A path holding `%00` gets 400 before routing, wherever it is, and never reaches the
/// upstream (it used to fall to the catch-all route).
#[tokio::test]
async fn an_encoded_nul_is_refused() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&redis, &upstream, "", &limit("ip"))).await;
    for path in ["/api%00/users", "/api/users%00", "/%00", "/other/%00.json"] {
        let refused = get(&proxy.url(path), &[]).await;
        assert_eq!(refused.status, 400, "{path}: {refused:?}");
        let body: serde_json::Value = serde_json::from_str(&refused.body).unwrap();
        assert_eq!(body["error"], "bad_request");
        assert!(body["message"].as_str().unwrap().contains("%00"), "{body}");
    }
    // (an escape that merely starts with 0 is not NUL)
    assert_eq!(status(&proxy, "/other/%01").await, 200);
    assert_eq!(upstream.seen().len(), 1);
}

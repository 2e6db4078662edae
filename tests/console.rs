//! The operator API on the admin listener, against a real tollgate, a real upstream and a real
//! Redis: `/api/stats` follows the traffic, names the clients a limit refuses most, and needs
//! the admin token when one is set.

mod common;

use std::time::Duration;

use common::{eventually, get, Proxy, Redis, Upstream, Yaml};
use serde_json::Value;

fn admin_url(proxy: &Proxy, path: &str) -> String {
    format!("http://{}{path}", proxy.admin.expect("an admin listener"))
}

async fn stats(proxy: &Proxy, token: &str) -> Value {
    let auth = format!("Bearer {token}");
    let answer = get(&admin_url(proxy, "/api/stats"), &[("authorization", &auth)]).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    serde_json::from_str(&answer.body).unwrap()
}

/// Traffic shows in `/api/stats`: a route's rate and its 429 share, a limit's decisions and
/// the client it refused most, the upstream's forwarded rate, the store's breaker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_follow_the_traffic() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let limit = "limits: [{name: per-client, algorithm: token_bucket, key: header:x-client, \
                 rate: 1/h, burst: 2}]";
    let yaml = Yaml::to(&[upstream.url()])
        .top("admin: {listen: 127.0.0.1:0, token: t0ken}")
        .redis(&redis, "timeout: 500ms")
        .route("api", "/", limit)
        .build();
    let proxy = Proxy::start(&yaml).await;
    // the first ask starts the sampling
    let first = stats(&proxy, "t0ken").await;
    assert_eq!(first["scope"], "this instance");
    for client in ["greedy", "greedy", "greedy", "greedy", "greedy", "calm"] {
        get(&proxy.url("/"), &[("x-client", client)]).await;
    }
    eventually(Duration::from_secs(10), || async {
        let s = stats(&proxy, "t0ken").await;
        s["routes"][0]["rps"].as_f64().unwrap() > 0.0
    })
    .await;
    let s = stats(&proxy, "t0ken").await;
    let route = &s["routes"][0];
    assert_eq!(route["name"], "api");
    assert!(route["status_rps"]["429"].as_f64().unwrap() > 0.0, "{s:#}");
    let share = route["share_429"].as_f64().unwrap();
    assert!((share - 0.5).abs() < 0.01, "3 of 6 refused: {s:#}");
    let limit = &s["limits"][0];
    assert_eq!(
        (&limit["route"], &limit["limit"]),
        (&"api".into(), &"per-client".into())
    );
    assert!(
        limit["per_second"]["denied"].as_f64().unwrap() > 0.0,
        "{s:#}"
    );
    assert_eq!(limit["top_refused"][0]["client"], "greedy", "{s:#}");
    assert_eq!(limit["top_refused"][0]["refused"], 3, "{s:#}");
    assert_eq!(limit["top_refused"].as_array().unwrap().len(), 1, "{s:#}");
    let up = &s["upstreams"][0];
    assert!(up["forwarded_per_second"].as_f64().unwrap() > 0.0, "{s:#}");
    assert_eq!(s["store"]["backend"], "redis");
    assert_eq!(s["store"]["breaker"], "closed");
    proxy.shutdown().await;
}

/// With a token set (here from a file), `/api/` answers 401 without it; `/config` never shows
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_guards_the_api_and_stays_secret() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "from-a-file\n").unwrap();
    let admin = format!(
        "admin: {{listen: 127.0.0.1:0, token_file: {}}}",
        file.display()
    );
    let yaml = Yaml::to(&[upstream.url()])
        .top(&admin)
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    let refused = get(&admin_url(&proxy, "/api/stats"), &[]).await;
    assert_eq!(refused.status, 401);
    assert_eq!(refused.header("www-authenticate"), Some("Bearer"));
    assert!(refused.body.contains("unauthorized"), "{}", refused.body);
    stats(&proxy, "from-a-file").await;
    let config = get(&admin_url(&proxy, "/config"), &[]).await.body;
    assert!(!config.contains("from-a-file"), "{config}");
    assert!(config.contains("<redacted"), "{config}");
    proxy.shutdown().await;
}

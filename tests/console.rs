//! The operator API on the admin listener, against a real tollgate, a real upstream and a real
//! Redis: `/api/stats` follows the traffic, names the clients a limit refuses most, and needs
//! the admin token when one is set.

mod common;
common::both_http1_clients!();

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
    // until a sample taken after all six requests is the window's newest (one taken between
    // them would hold only some)
    eventually(Duration::from_secs(10), || async {
        let s = stats(&proxy, "t0ken").await;
        let seen = s["routes"][0]["rps"].as_f64().unwrap() * s["window_seconds"].as_f64().unwrap();
        seen.round() as u64 == 6
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

/// The refused clients cover the last minute only: a client refused four minutes ago is gone,
/// one refused since is listed with its own count. The summary's clock is moved on, not waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_clients_cover_the_last_minute() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let limit = "limits: [{name: per-client, algorithm: fixed_window, key: header:x-client, \
                 limit: 1, window: 1h}]";
    let yaml = Yaml::to(&[upstream.url()])
        .top("admin: {listen: 127.0.0.1:0, token: t0ken}")
        .redis(&redis, "timeout: 500ms")
        .route("api", "/", limit)
        .build();
    let proxy = Proxy::start(&yaml).await;
    let refused = |s: &Value| -> Vec<(String, u64)> {
        s["limits"][0]["top_refused"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["client"].as_str().unwrap().into(),
                    t["refused"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    for client in ["early", "early", "early"] {
        get(&proxy.url("/"), &[("x-client", client)]).await;
    }
    let s = stats(&proxy, "t0ken").await;
    assert_eq!(refused(&s), [("early".to_owned(), 2)], "{s:#}");
    // (a little over four minutes: off the minute, so no slot is reused by chance)
    proxy.refusals.skip(Duration::from_secs(4 * 60 + 5));
    for client in ["late", "late", "early"] {
        get(&proxy.url("/"), &[("x-client", client)]).await;
    }
    let s = stats(&proxy, "t0ken").await;
    let mut now = refused(&s);
    now.sort();
    assert_eq!(
        now,
        [("early".to_owned(), 1), ("late".to_owned(), 1)],
        "only the last minute's refusals: {s:#}"
    );
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

async fn call(
    proxy: &Proxy,
    method: http::Method,
    path: &str,
    token: Option<&str>,
) -> common::Answer {
    let mut req = http::Request::builder()
        .method(method)
        .uri(admin_url(proxy, path));
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    common::send(req.body(common::full("")).unwrap()).await
}

/// One client's state is read without taking anything, and a reset through one instance lets
/// the client through on another at once: that instance forgets the refusal it remembered.
/// Unknown names are 404s; a change without the token is 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_through_one_instance_holds_on_every_instance() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    // two limits, so that each instance remembers refusals (the deny cache)
    let limits = "limits:\n  - {name: per-client, algorithm: token_bucket, key: header:x-client, \
                  rate: 1/h, burst: 2}\n  - {name: wide, algorithm: fixed_window, key: \
                  header:x-client, limit: 1000, window: 1h}";
    let yaml = Yaml::to(&[upstream.url()])
        .top("admin: {listen: 127.0.0.1:0, token: s3cret}")
        .redis(&redis, "timeout: 500ms")
        .route("api", "/", limits)
        .build();
    let (a, b) = (Proxy::start(&yaml).await, Proxy::start(&yaml).await);
    let greedy = [("x-client", "greedy")];
    let statuses = |proxy: &Proxy| {
        let url = proxy.url("/");
        async move { get(&url, &greedy).await.status }
    };
    assert_eq!(statuses(&a).await, 200);
    assert_eq!(statuses(&b).await, 200);
    assert_eq!(statuses(&b).await, 429);
    assert_eq!(statuses(&b).await, 429, "remembered by b");

    let path = "/api/limits/api/per-client?key=greedy";
    let state = call(&a, http::Method::GET, path, Some("s3cret")).await;
    assert_eq!(state.status, 200, "{}", state.body);
    let json: Value = serde_json::from_str(&state.body).unwrap();
    assert_eq!(json["algorithm"], "token_bucket");
    assert_eq!(json["allowed_now"], false, "{json}");
    assert!(json["retry_after_ms"].as_u64().unwrap() > 1000, "{json}");
    assert_eq!(
        json["deny_cached_here"], false,
        "a never refused it: {json}"
    );
    let again = call(&a, http::Method::GET, path, Some("s3cret")).await;
    let again: Value = serde_json::from_str(&again.body).unwrap();
    assert_eq!(
        again["remaining"], json["remaining"],
        "reading takes nothing"
    );
    assert!(again["retry_after_ms"].as_u64() <= json["retry_after_ms"].as_u64());
    let on_b = call(&b, http::Method::GET, path, Some("s3cret")).await;
    let on_b: Value = serde_json::from_str(&on_b.body).unwrap();
    assert_eq!(on_b["deny_cached_here"], true, "{on_b}");

    let refused = call(&a, http::Method::DELETE, path, None).await;
    assert_eq!(refused.status, 401);
    let reset = call(&a, http::Method::DELETE, path, Some("s3cret")).await;
    assert_eq!(reset.status, 200, "{}", reset.body);
    let json: Value = serde_json::from_str(&reset.body).unwrap();
    assert_eq!(
        (&json["reset"], &json["held_state"]),
        (&true.into(), &true.into())
    );
    // b hears of the reset within its next reading of the count, twice a second
    eventually(Duration::from_secs(5), || async {
        statuses(&b).await == 200
    })
    .await;
    assert_eq!(statuses(&a).await, 200, "the bucket was full again");

    for (path, code) in [
        ("/api/limits/nope/per-client?key=x", "unknown_route"),
        ("/api/limits/api/nope?key=x", "unknown_limit"),
        ("/api/upstreams/nope/hold", "unknown_upstream"),
    ] {
        let method = if path.ends_with("hold") {
            http::Method::DELETE
        } else {
            http::Method::GET
        };
        let answer = call(&a, method, path, Some("s3cret")).await;
        assert_eq!(answer.status, 404, "{path}");
        assert!(answer.body.contains(code), "{path}: {}", answer.body);
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// An upstream's 429 with `Retry-After` holds its pacing on every instance; lifting the hold
/// through one instance sends requests to it again from both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifting_a_hold_lets_requests_go_again_everywhere() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .top("admin: {listen: 127.0.0.1:0, token: s3cret}")
        .redis(&redis, "timeout: 500ms")
        .upstream("pace: {rate: 100/s, max_delay: 2s}")
        .route("api", "/", "")
        .build();
    let (a, b) = (Proxy::start(&yaml).await, Proxy::start(&yaml).await);
    // the upstream asks for an hour's rest
    let held = get(&a.url("/status/429?retry_after=3600"), &[]).await;
    assert_eq!(held.status, 429);
    for proxy in [&a, &b] {
        let refused = get(&proxy.url("/"), &[]).await;
        assert_eq!(refused.status, 503, "held: {}", refused.body);
    }
    let lifted = call(
        &b,
        http::Method::DELETE,
        "/api/upstreams/api/hold",
        Some("s3cret"),
    )
    .await;
    assert_eq!(lifted.status, 200, "{}", lifted.body);
    for proxy in [&b, &a] {
        let url = proxy.url("/");
        eventually(Duration::from_secs(5), || async {
            get(&url, &[]).await.status == 200
        })
        .await;
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// `tollgate limits show|reset`, as a script runs it: JSON on stdout, and an exit status for
/// each outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_reads_and_resets_a_limit() {
    let upstream = Upstream::start().await;
    let limit = "limits: [{name: per-client, algorithm: fixed_window, key: header:x-client, \
                 limit: 1, window: 1h}]";
    let yaml = Yaml::to(&[upstream.url()])
        .top("admin: {listen: 127.0.0.1:0, token: s3cret}")
        .route("api", "/", limit)
        .build();
    let proxy = Proxy::start(&yaml).await;
    let client = [("x-client", "a b")];
    assert_eq!(get(&proxy.url("/"), &client).await.status, 200);
    assert_eq!(get(&proxy.url("/"), &client).await.status, 429);
    let admin = admin_url(&proxy, "");
    let run = |args: &'static [&'static str], token: Option<&'static str>| {
        let admin = admin.clone();
        tokio::task::spawn_blocking(move || {
            let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
            cmd.arg("limits").args(args).args(["--admin", &admin]);
            cmd.env_remove("TOLLGATE_ADMIN_TOKEN");
            if let Some(token) = token {
                cmd.env("TOLLGATE_ADMIN_TOKEN", token);
            }
            let out = cmd.output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            (out.status.code(), stdout)
        })
    };
    const SHOW: &[&str] = &[
        "show",
        "--route",
        "api",
        "--limit",
        "per-client",
        "--key",
        "a b",
    ];
    const RESET: &[&str] = &[
        "reset",
        "--route",
        "api",
        "--limit",
        "per-client",
        "--key",
        "a b",
    ];
    const NOWHERE: &[&str] = &[
        "show",
        "--route",
        "nope",
        "--limit",
        "per-client",
        "--key",
        "x",
    ];
    let (code, out) = run(SHOW, Some("s3cret")).await.unwrap();
    assert_eq!(code, Some(0), "{out}");
    let json: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&json["key"], &json["allowed_now"]),
        (&"a b".into(), &false.into())
    );
    assert_eq!(run(SHOW, None).await.unwrap().0, Some(4), "no token");
    assert_eq!(run(RESET, Some("wrong")).await.unwrap().0, Some(4));
    assert_eq!(run(NOWHERE, Some("s3cret")).await.unwrap().0, Some(3));
    let (code, out) = run(RESET, Some("s3cret")).await.unwrap();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(get(&proxy.url("/"), &client).await.status, 200, "reset");
    proxy.shutdown().await;
    let (code, _) = run(SHOW, Some("s3cret")).await.unwrap();
    assert_eq!(code, Some(1), "nothing listens any more");
}

/// Waits show too: a `leaky_bucket` limit's delayed requests, an upstream's pacing delay, and
/// how far ahead its schedule runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_show_in_the_stats() {
    let upstream = Upstream::start().await;
    let limit = "limits: [{name: steady, algorithm: leaky_bucket, key: ip, rate: 20/s, \
                 max_delay: 5s}]";
    let yaml = Yaml::to(&[upstream.url()])
        .top("admin: {listen: 127.0.0.1:0, token: t}")
        .upstream("pace: {rate: 5/s, max_delay: 5s}")
        .route("api", "/", limit)
        .build();
    let proxy = Proxy::start(&yaml).await;
    stats(&proxy, "t").await;
    let burst: Vec<_> = (0..6)
        .map(|_| {
            let url = proxy.url("/");
            tokio::spawn(async move { get(&url, &[]).await.status })
        })
        .collect();
    // while they wait, the schedule runs ahead
    eventually(Duration::from_secs(5), || async {
        let s = stats(&proxy, "t").await;
        s["upstreams"][0]["schedule_ahead_ms"].as_u64().unwrap() > 100
    })
    .await;
    for status in futures_util::future::join_all(burst).await {
        assert_eq!(status.unwrap(), 200);
    }
    eventually(Duration::from_secs(5), || async {
        let s = stats(&proxy, "t").await;
        s["limits"][0]["per_second"]["delayed"].as_f64().unwrap() > 0.0
            && s["upstreams"][0]["pacing_delay_ms"]["p99"]
                .as_f64()
                .unwrap_or(0.0)
                > 0.0
    })
    .await;
    proxy.shutdown().await;
}

//! Paths spelled another way cannot escape a route's limits: encoded slashes and backslashes
//! are refused (or decoded, or kept, as `paths.escaped_slashes` says), and `;parameters` of a
//! segment do not count when routes are matched (unless `paths.segment_params: keep`).
//!
//! Each test spends the `api` route's limit, then sends every spelling of an `/api` path. The
//! upstream stands for one that decodes paths leniently, as WSGI servers, Go's `r.URL.Path`,
//! Tomcat and Windows servers do: none of those spellings may reach it as an `/api` path.

mod common;
common::both_http1_clients!();

use common::lenient::lenient_reading;
use common::raw::{error_code, one, RawResponse};
use common::{Proxy, Upstream, Yaml};

/// Route `api` on `/api` (1 request a minute, forwarded without `/api` when `strip` is true)
/// above route `rest` on `/` without limits, both to `upstream`, with `paths` at the top.
fn config(upstream: &Upstream, paths: &str, strip: bool) -> String {
    let api = format!(
        "strip_prefix: {strip}\n\
         limits: [{{name: per-client, algorithm: token_bucket, rate: 1/m, burst: 1}}]"
    );
    Yaml::to(&[upstream.url()])
        .top(paths)
        .route("api", "/api", &api)
        .route("rest", "/", "")
        .build()
}

/// How a lenient upstream reads a request target's path: its query and an absolute form's
/// scheme and host left out, then [`lenient_reading`].
fn lenient(target: &str) -> String {
    let path = target.split('?').next().unwrap_or("");
    let path = match path.strip_prefix("http://") {
        Some(rest) => &rest[rest.find('/').unwrap_or(rest.len())..],
        None => path,
    };
    lenient_reading(path)
}

/// Whether a lenient upstream serves `target` from its `/api` handler.
fn reads_as_api(target: &str) -> bool {
    let path = lenient(target);
    path == "/api" || path.starts_with("/api/")
}

async fn send(proxy: &Proxy, target: &str) -> RawResponse {
    let request = format!("GET {target} HTTP/1.1\r\nHost: test\r\n\r\n");
    one(proxy.addr, request.as_bytes()).await
}

/// How many requests reached the upstream as an `/api` path, read leniently.
fn api_requests(upstream: &Upstream) -> usize {
    upstream
        .seen()
        .iter()
        .filter(|s| reads_as_api(&s.uri))
        .count()
}

/// Spellings of `/api/users` with an encoded slash or backslash, or a raw backslash.
const SLASHED: &[&str] = &[
    "/api%2Fusers",
    "/api%2fusers",
    "/%2Fapi",
    "/%2fapi/users",
    "/x/..%2Fapi/users",
    "/x/..%2fapi/users",
    "/api%2f",
    "/api%5Cusers",
    "/api%5cusers",
    "/api\\users",
    "/x\\..\\api/users",
    "/%61pi%2Fusers",
    "/x/%2e%2e%2Fapi/users",
    "/./api%2Fusers",
    "//api%2F/users",
    "http://test/api%2Fusers",
    "http://test/x/..%2Fapi",
];

/// Spellings of `/api/users` with `;parameters` in a segment.
const PARAMS: &[&str] = &[
    "/api;x/users",
    "/api;/users",
    "/api;x=1;y=2/users",
    "/api;x",
    "/api/users;x",
    "/x/..;/api/users",
    "/x/..;x/api/users",
    "/x/.;x/../api/users",
    "/;x/api/users",
    "/x/%2e%2e;/api/users",
    "/%61pi;x/users",
    "/API/../api;x/users",
    "http://test/api;x/users",
    "http://test/x/..;/api/users",
];

/// By default an encoded slash or backslash gets 400 and `;parameters` are ignored when routes
/// are matched: once `/api`'s limit is spent, no spelling of an `/api` path reaches the upstream.
#[tokio::test]
async fn no_spelling_of_a_path_escapes_its_route_by_default() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream, "", false)).await;
    assert_eq!(send(&proxy, "/api/users").await.status, 200);
    assert_eq!(send(&proxy, "/api/users").await.status, 429);
    for target in SLASHED {
        assert!(reads_as_api(target), "{target}: the test's own reading");
        let r = send(&proxy, target).await;
        assert_eq!(
            (r.status, error_code(&r).as_str()),
            (400, "bad_request"),
            "{target}"
        );
    }
    for target in PARAMS {
        assert!(reads_as_api(target), "{target}: the test's own reading");
        assert_eq!(send(&proxy, target).await.status, 429, "{target}");
    }
    assert_eq!(api_requests(&upstream), 1, "{:?}", upstream.seen());
    // other paths still pass, their parameters forwarded as sent
    for (target, forwarded) in [
        ("/apix/users", "/apix/users"),
        ("/api%20x", "/api%20x"),
        ("/other;jsessionid=1/x;y", "/other;jsessionid=1/x;y"),
        ("/a%3Bb/../c", "/c"),
    ] {
        let before = upstream.seen().len();
        assert_eq!(send(&proxy, target).await.status, 200, "{target}");
        assert_eq!(upstream.seen()[before].uri, forwarded, "{target}");
    }
}

/// `escaped_slashes: decode` reads each encoded slash or backslash as `/` and forwards the
/// decoded path: `/api%2Fusers` takes `/api`'s limit and reaches the upstream as `/api/users`.
#[tokio::test]
async fn decoded_slashes_take_the_limits_of_the_path_they_spell() {
    let upstream = Upstream::start().await;
    let paths = "paths: {escaped_slashes: decode}";
    let proxy = Proxy::start(&config(&upstream, paths, false)).await;
    assert_eq!(send(&proxy, "/api%2Fusers").await.status, 200);
    assert_eq!(upstream.seen()[0].uri, "/api/users");
    for target in SLASHED.iter().chain(PARAMS) {
        assert_eq!(send(&proxy, target).await.status, 429, "{target}");
    }
    assert_eq!(api_requests(&upstream), 1, "{:?}", upstream.seen());
}

/// `escaped_slashes: keep` and `segment_params: keep` route as RFC 3986 reads the path: the
/// encoded slash stays inside its segment and `;` is an ordinary character. Both go to `rest`,
/// forwarded as sent: the risk the settings' documentation names.
#[tokio::test]
async fn keep_settings_route_escapes_and_parameters_as_data() {
    let upstream = Upstream::start().await;
    let paths = "paths: {escaped_slashes: keep, segment_params: keep}";
    let proxy = Proxy::start(&config(&upstream, paths, false)).await;
    assert_eq!(send(&proxy, "/api/users").await.status, 200);
    assert_eq!(send(&proxy, "/api/users").await.status, 429);
    for (target, forwarded) in [
        ("/api%2fusers", "/api%2Fusers"),
        ("/api;x/users", "/api;x/users"),
        ("/x/..;/api/users", "/x/..;/api/users"),
    ] {
        let before = upstream.seen().len();
        assert_eq!(send(&proxy, target).await.status, 200, "{target}");
        assert_eq!(upstream.seen()[before].uri, forwarded, "{target}");
    }
}

/// `strip_prefix` removes the prefix's segments with their parameters; the parameters of the
/// rest are forwarded as sent.
#[tokio::test]
async fn strip_prefix_keeps_the_parameters_of_the_rest() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream, "", true)).await;
    let r = send(&proxy, "/api;v=1/users;p=2/x?q=;").await;
    assert_eq!(r.status, 200);
    assert_eq!(upstream.seen()[0].uri, "/users;p=2/x?q=;");
}

//! The admin HTTP server: `/metrics`, `/healthz`, `/readyz`, `/config`, the operator API and
//! its dashboard, on a listener of its own, apart from the proxied traffic.
//!
//! | route | answer |
//! | --- | --- |
//! | `GET /` | 200, the dashboard ([`AdminState::page`]): a static page that calls `/api/` |
//! | `GET /metrics` | 200, the registry in the Prometheus text format ([`metrics::TEXT_CONTENT_TYPE`]), or OpenMetrics ([`metrics::CONTENT_TYPE`]) when the client's `Accept` asks for it |
//! | `GET /healthz` | 200 `ok`: the process is alive and serving |
//! | `GET /readyz` | 200 `ready`, or 503 `not ready: <why>` while [`AdminState::ready`] says no |
//! | `GET /config` | 200, [`AdminState::config_json`] as pretty-printed JSON |
//! | `GET /api/stats` | 200, [`Api::stats`]: this instance's rates over the last minute |
//! | `GET /api/limits/<route>/<limit>?key=<client>` | [`Api::limit`]: that client's state |
//! | `DELETE /api/limits/<route>/<limit>?key=<client>` | [`Api::reset`]: forget that state |
//! | `DELETE /api/upstreams/<name>/hold` | [`Api::lift_hold`]: lift the upstream's hold |
//! | any other path | 404 |
//! | another method on one of the paths above | 405 with `Allow: GET, HEAD` |
//!
//! Every `/api/` call needs `Authorization: Bearer <token>` when [`AdminState::token`] gives
//! one: 401 without it. The token is compared in constant time. Without a token, the calls
//! that change state get 403: nobody may reset limits on an open listener. `/api/` answers
//! and errors are JSON.
//!
//! Without a token, every path answers only a request whose host `hosts` allows (an IP
//! literal, `localhost`, a name of `admin.hosts`), and 403 otherwise: a page on another site
//! that rebinds its name to this address cannot read the console.
//!
//! This module owns only the answers. The connections are the server's
//! (`server::side`): they are bounded as the proxy listener's are, and held to a cap and to
//! the descriptors the proxy needs. It uses nothing else of the crate but [`Metrics`]: what
//! "ready" means and what the effective configuration is (with its secrets redacted) are the
//! caller's, handed in as closures, so a reload is seen on the next request without telling
//! this module anything.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::metrics::{self, Metrics};
use crate::server::{side_accept_loop, SideBounds};

mod api;
mod hosts;

use api::api_error;
pub use api::{Api, ApiAnswer, ApiFuture, LimitCall};

const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";
const HTML: &str = "text/html; charset=utf-8";

/// What the admin endpoints report, supplied by the application.
#[derive(Clone)]
pub struct AdminState {
    /// the registry `/metrics` encodes
    pub metrics: Metrics,
    /// the effective configuration for `/config`, secrets (Redis passwords) already
    /// redacted; called on every request so it can read the config currently in force
    pub config_json: Arc<dyn Fn() -> serde_json::Value + Send + Sync>,
    /// whether `/readyz` answers 200: config loaded and the store reachable (or its fallback
    /// active), else why not; called on every probe, and may ask the store (bounded by its
    /// timeout)
    pub ready: Arc<dyn Fn() -> Readiness + Send + Sync>,
    /// the bearer token `/api/` calls need, if one is set; read on every call, so a reload
    /// that changes it applies at once
    pub token: Arc<dyn Fn() -> Option<Arc<str>> + Send + Sync>,
    /// `admin.hosts`: the names a listener without a token answers besides IP literals and
    /// `localhost`; read on every request without a token, so a reload applies at once
    pub hosts: Arc<dyn Fn() -> Vec<String> + Send + Sync>,
    /// what `/api/` answers
    pub api: Arc<dyn Api>,
    /// the dashboard `GET /` serves; it holds no data, so it needs no token
    pub page: Page,
}

/// A static HTML page and the `Content-Security-Policy` it runs under.
#[derive(Debug, Clone)]
pub struct Page {
    pub html: &'static str,
    pub content_security_policy: HeaderValue,
}

/// The answer of [`AdminState::ready`]: why the instance is not ready, if it is not.
pub type Readiness = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState")
            .field("metrics", &self.metrics)
            .finish_non_exhaustive()
    }
}

/// Serves the admin endpoints on `listener` until `shutdown` completes, then stops accepting
/// and lets in-flight requests finish (for up to a few seconds) before returning.
///
/// The connections are held to `bounds`: the proxy listener's deadlines from the first byte,
/// `admin.max_connections`, and the descriptors kept for the proxy. Accept errors (such as
/// running out of descriptors) pause accepting, never end it, so this only returns on
/// shutdown.
pub(crate) async fn serve(
    listener: TcpListener,
    state: AdminState,
    bounds: SideBounds,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let state = Arc::new(state);
    let (stop, stopped) = watch::channel(false);
    let make = move |peer: SocketAddr| {
        let state = state.clone();
        service_fn(move |req| {
            let state = state.clone();
            async move { Ok::<_, Infallible>(answer(&state, &req, peer).await) }
        })
    };
    let serving = side_accept_loop("admin", listener, bounds, make, stopped);
    let stopping = async move {
        shutdown.await;
        let _ = stop.send(true);
    };
    tokio::join!(serving, stopping);
}

/// Whether the client's `Accept` prefers OpenMetrics (Prometheus's scraper asks for it first)
/// to the Prometheus text format: OpenMetrics named with a quality above 0 and no lower than
/// that of `text/plain` (or `text/*`, `*/*`, which only the text format is served for).
fn asks_for_openmetrics<B>(req: &Request<B>) -> bool {
    let (mut openmetrics, mut text) = (0.0f32, 0.0f32);
    for value in req.headers().get_all(http::header::ACCEPT) {
        let Ok(value) = value.to_str() else { continue };
        for range in value.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim();
            let quality = parts
                .filter_map(|p| p.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
                .map_or(1.0, |(_, q)| q.trim().parse::<f32>().unwrap_or(0.0));
            if media.eq_ignore_ascii_case("application/openmetrics-text") {
                openmetrics = openmetrics.max(quality);
            } else if ["text/plain", "text/*", "*/*"]
                .iter()
                .any(|m| media.eq_ignore_ascii_case(m))
            {
                text = text.max(quality);
            }
        }
    }
    openmetrics > 0.0 && openmetrics >= text
}

/// The answer to one admin request: `/readyz` waits for [`AdminState::ready`], the others are
/// answered at once.
async fn answer<B>(
    state: &AdminState,
    req: &Request<B>,
    peer: SocketAddr,
) -> Response<Full<Bytes>> {
    let token = (state.token)();
    if token.is_none() {
        if let hosts::Verdict::Refused(name) = hosts::check(req, &(state.hosts)()) {
            return foreign_host(req, name);
        }
    }
    if let Some(call) = req.uri().path().strip_prefix("/api/") {
        return api::answer(state, req, call, token, peer).await;
    }
    if req.uri().path() != "/readyz" || !readable(req.method()) {
        return respond(state, req);
    }
    match (state.ready)().await {
        Ok(()) => text(StatusCode::OK, "ready"),
        Err(why) => with_type(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            format!("not ready: {why}").into(),
        ),
    }
}

/// GET, and HEAD (the same answer without its body: hyper leaves it out), which probes and
/// `curl -I` send.
fn readable(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD
}

/// The answer to one admin request but a `GET /readyz`. The body is never read: no endpoint
/// takes one.
fn respond<B>(state: &AdminState, req: &Request<B>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if !matches!(path, "/" | "/metrics" | "/healthz" | "/readyz" | "/config") {
        return text(StatusCode::NOT_FOUND, "not found");
    }
    // 405 only for a path that exists (RFC 9110 §15.5.6), with the methods it does allow
    if !readable(req.method()) {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match path {
        // OpenMetrics to a client that asks for it (Prometheus does), else the classic text
        "/metrics" => {
            let mut response = if asks_for_openmetrics(req) {
                with_type(
                    StatusCode::OK,
                    metrics::CONTENT_TYPE,
                    state.metrics.encode().into(),
                )
            } else {
                with_type(
                    StatusCode::OK,
                    metrics::TEXT_CONTENT_TYPE,
                    state.metrics.encode_text().into(),
                )
            };
            response
                .headers_mut()
                .insert(http::header::VARY, HeaderValue::from_static("accept"));
            response
        }
        "/healthz" => text(StatusCode::OK, "ok"),
        "/config" => config(state),
        "/" => page(&state.page),
        _ => unreachable!("/readyz is answered by `answer`"),
    }
}

/// 403 to a request for a host a listener without a token does not answer ([`hosts`]): JSON
/// under `/api/`, text elsewhere, each saying how to allow the name.
fn foreign_host<B>(req: &Request<B>, name: Option<String>) -> Response<Full<Bytes>> {
    let message = match name {
        Some(name) => format!(
            "this admin listener has no token, so it answers only IP addresses, localhost and \
             the names in admin.hosts; to open it as {name}, add {name} to admin.hosts or set \
             admin.token"
        ),
        None => "this admin listener has no token, so it answers only requests whose Host is \
                 an IP address, localhost or a name in admin.hosts; add the name to \
                 admin.hosts or set admin.token"
            .to_owned(),
    };
    let mut response = if req.uri().path().starts_with("/api/") {
        api_error(ApiAnswer::error(
            StatusCode::FORBIDDEN,
            "forbidden_host",
            message,
        ))
    } else {
        with_type(StatusCode::FORBIDDEN, TEXT, (message + "\n").into())
    };
    response.headers_mut().insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

fn json_answer(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    with_type(status, JSON, body.into())
}

fn config(state: &AdminState) -> Response<Full<Bytes>> {
    match serde_json::to_vec_pretty(&(state.config_json)()) {
        Ok(json) => with_type(StatusCode::OK, JSON, json.into()),
        // a Value always serialises; this arm exists so a bug answers 500, not a panic
        Err(e) => {
            tracing::error!(error = %e, "admin: cannot serialise the config");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot serialise the config",
            )
        }
    }
}

/// The dashboard, with headers that keep it from being framed, sniffed or kept stale after an
/// upgrade.
fn page(page: &Page) -> Response<Full<Bytes>> {
    let body = Bytes::from_static(page.html.as_bytes());
    let mut response = with_type(StatusCode::OK, HTML, body);
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_SECURITY_POLICY,
        page.content_security_policy.clone(),
    );
    headers.insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        http::header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    response
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    with_type(status, TEXT, Bytes::from_static(body.as_bytes()))
}

fn with_type(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;

    /// OpenMetrics when `Accept` prefers it: Prometheus's own header, OpenMetrics alone or
    /// first; the text format when OpenMetrics is refused (`q=0`) or ranked below it.
    #[test]
    fn openmetrics_follows_the_accepted_qualities() {
        let asks = |accept: &[&str]| {
            let mut req = Request::get("/metrics");
            for a in accept {
                req = req.header(http::header::ACCEPT, *a);
            }
            asks_for_openmetrics(&req.body(()).unwrap())
        };
        let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,\
            application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert!(asks(&[prometheus]));
        assert!(asks(&["application/openmetrics-text"]));
        assert!(asks(&[
            "text/plain;q=0.5",
            "Application/OpenMetrics-Text; q=0.9"
        ]));
        assert!(!asks(&[]));
        assert!(!asks(&["*/*"]));
        assert!(!asks(&["application/openmetrics-text;q=0"]));
        assert!(!asks(&[
            "text/plain;version=0.0.4;q=1,application/openmetrics-text;q=0.1"
        ]));
    }

    /// A running admin server on 127.0.0.1:0 and what controls it.
    struct Running {
        addr: SocketAddr,
        ready: Arc<AtomicBool>,
        metrics: Metrics,
        stop: oneshot::Sender<()>,
        task: JoinHandle<()>,
    }

    /// The API's answers in these tests: the HTTP side is what they test.
    struct Figures;

    impl Api for Figures {
        fn stats(&self) -> serde_json::Value {
            serde_json::json!({"scope": "this instance"})
        }

        fn fleet(&self) -> ApiFuture<'_> {
            Box::pin(async { ApiAnswer::ok(serde_json::json!({"scope": "fleet"})) })
        }

        fn limit<'a>(&'a self, call: LimitCall<'a>) -> ApiFuture<'a> {
            let body =
                serde_json::json!({"route": call.route, "limit": call.limit, "key": call.key});
            Box::pin(async move { ApiAnswer::ok(body) })
        }

        fn reset<'a>(&'a self, call: LimitCall<'a>, _peer: SocketAddr) -> ApiFuture<'a> {
            let body = serde_json::json!({"reset": call.key});
            Box::pin(async move { ApiAnswer::ok(body) })
        }

        fn lift_hold<'a>(&'a self, upstream: &'a str, _peer: SocketAddr) -> ApiFuture<'a> {
            let body = serde_json::json!({"lifted": upstream});
            Box::pin(async move { ApiAnswer::ok(body) })
        }
    }

    fn test_page() -> Page {
        Page {
            html: "<!doctype html><title>console</title>",
            content_security_policy: HeaderValue::from_static("default-src 'none'"),
        }
    }

    async fn start() -> Running {
        start_with_token(None).await
    }

    async fn start_with_token(token: Option<&'static str>) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ready = Arc::new(AtomicBool::new(false));
        let metrics = Metrics::new();
        let is_ready = ready.clone();
        let state = AdminState {
            metrics: metrics.clone(),
            config_json: Arc::new(
                || serde_json::json!({"store": {"url": "redis://:***@redis:6379"}, "routes": []}),
            ),
            ready: Arc::new(move || {
                let ready = is_ready.load(Ordering::SeqCst);
                Box::pin(async move {
                    if ready {
                        Ok(())
                    } else {
                        Err("off".into())
                    }
                })
            }),
            token: Arc::new(move || token.map(Arc::from)),
            hosts: Arc::new(Vec::new),
            api: Arc::new(Figures),
            page: test_page(),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let bounds = SideBounds::alone(crate::config::Timeouts::default(), 256);
        let task = tokio::spawn(serve(listener, state, bounds, async move {
            let _ = stopped.await;
        }));
        Running {
            addr,
            ready,
            metrics,
            stop,
            task,
        }
    }

    /// Sends `method path` and returns the status, the content type and the body.
    async fn call(addr: SocketAddr, method: Method, path: &str) -> (StatusCode, String, String) {
        call_with(addr, method, path, None).await
    }

    /// [`call`] with an `Authorization` header when `auth` is given.
    async fn call_with(
        addr: SocketAddr,
        method: Method,
        path: &str,
        auth: Option<&str>,
    ) -> (StatusCode, String, String) {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"));
        if let Some(auth) = auth {
            req = req.header(http::header::AUTHORIZATION, auth);
        }
        let req = req.body(Empty::new()).unwrap();
        let resp = client.request(req).await.unwrap();
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    /// `/metrics` answers the registry's current text: the Prometheus text format 0.0.4 (a
    /// counter's `# TYPE` names it with `_total`, no `# EOF`), or OpenMetrics to a client whose
    /// `Accept` asks for it, as Prometheus's does.
    #[tokio::test]
    async fn metrics_endpoint_serves_the_registry() {
        let s = start().await;
        s.metrics
            .request(&"api".into(), 429, Duration::from_millis(1));
        let (status, content_type, body) = call(s.addr, Method::GET, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
        let sample = "tollgate_requests_total{route=\"api\",status=\"429\"} 1\n";
        assert!(body.contains(sample), "{body}");
        assert!(
            body.contains("# TYPE tollgate_requests_total counter\n"),
            "{body}"
        );
        assert!(body.contains("# HELP tollgate_requests_total "), "{body}");
        assert!(body.contains("# TYPE tollgate_request_duration_seconds histogram\n"));
        assert!(
            !body.contains("# EOF") && !body.contains("# UNIT"),
            "{body}"
        );

        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let req = Request::get(format!("http://{}/metrics", s.addr))
            .header(
                "accept",
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
            )
            .body(Empty::new())
            .unwrap();
        let resp = client.request(req).await.unwrap();
        assert_eq!(
            resp.headers()[CONTENT_TYPE],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(body.contains(sample), "{body}");
        assert!(
            body.contains("# TYPE tollgate_requests counter\n"),
            "{body}"
        );
        assert!(body.ends_with("# EOF\n"), "{body}");
    }

    /// `/healthz` is 200 `ok` whether or not the app is ready.
    #[tokio::test]
    async fn healthz_is_ok_even_when_not_ready() {
        let s = start().await;
        let (status, content_type, body) = call(s.addr, Method::GET, "/healthz").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, "text/plain; charset=utf-8");
        assert_eq!(body, "ok");
    }

    /// `/readyz` follows the `ready` closure on every request: 503 then 200.
    #[tokio::test]
    async fn readyz_follows_the_ready_closure() {
        let s = start().await;
        let (status, content_type, body) = call(s.addr, Method::GET, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(content_type, "text/plain; charset=utf-8");
        assert_eq!(body, "not ready: off");
        s.ready.store(true, Ordering::SeqCst);
        let (status, _, body) = call(s.addr, Method::GET, "/readyz").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "ready");
    }

    /// `/config` answers the closure's JSON.
    #[tokio::test]
    async fn config_serves_the_json_it_is_given() {
        let s = start().await;
        let (status, content_type, body) = call(s.addr, Method::GET, "/config").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type, "application/json");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["store"]["url"], "redis://:***@redis:6379");
        assert_eq!(json["routes"], serde_json::json!([]));
    }

    /// Unknown paths are 404 for any method; known paths answer GET and HEAD and refuse other
    /// methods with 405.
    #[tokio::test]
    async fn unknown_paths_are_404_and_other_methods_405() {
        let s = start().await;
        let (status, _, _) = call(s.addr, Method::GET, "/nope").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _, _) = call(s.addr, Method::GET, "/metrics/extra").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _, _) = call(s.addr, Method::POST, "/nope").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        for path in ["/", "/metrics", "/healthz", "/readyz", "/config"] {
            let (status, _, body) = call(s.addr, Method::POST, path).await;
            assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{path}");
            assert_eq!(body, "method not allowed");
            // HEAD is GET without the body (probes and `curl -I` send it)
            let (got, _, _) = call(s.addr, Method::GET, path).await;
            let (status, _, body) = call(s.addr, Method::HEAD, path).await;
            assert_eq!(status, got, "{path}");
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{path}");
            assert_eq!(body, "", "{path}");
        }
    }

    /// `/api/` answers JSON; with a token set, only to a caller that shows it.
    #[tokio::test]
    async fn api_calls_need_the_token_when_one_is_set() {
        let open = start().await;
        let (status, kind, body) = call(open.addr, Method::GET, "/api/stats").await;
        assert_eq!((status, kind.as_str()), (StatusCode::OK, JSON), "{body}");
        assert_eq!(body, r#"{"scope":"this instance"}"#);
        let (status, _, body) = call(open.addr, Method::GET, "/api/nothing").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains(r#""error":"not_found""#), "{body}");

        let shut = start_with_token(Some("s3cret")).await;
        for auth in [
            None,
            Some("Bearer s3cre"),
            Some("Bearer s3cret2"),
            Some("s3cret"),
        ] {
            let (status, kind, body) = call_with(shut.addr, Method::GET, "/api/stats", auth).await;
            assert_eq!(
                (status, kind.as_str()),
                (StatusCode::UNAUTHORIZED, JSON),
                "{auth:?}"
            );
            assert!(body.contains(r#""error":"unauthorized""#), "{body}");
        }
        let (status, _, body) =
            call_with(shut.addr, Method::GET, "/api/stats", Some("Bearer s3cret")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        // the other endpoints need no token
        let (status, _, _) = call(shut.addr, Method::GET, "/healthz").await;
        assert_eq!(status, StatusCode::OK);
    }

    /// The limit calls take the client from `key`, percent-decoded; a change needs a token,
    /// and each call its own methods.
    #[tokio::test]
    async fn limit_calls_read_their_client_and_changes_need_a_token() {
        let open = start().await;
        let path = "/api/limits/api/per-client?key=192.0.2.7%7Cgold";
        let (status, _, body) = call(open.addr, Method::GET, path).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            body,
            r#"{"key":"192.0.2.7|gold","limit":"per-client","route":"api"}"#
        );
        let (status, _, body) = call(open.addr, Method::GET, "/api/limits/api/l?key=a+b").await;
        assert!(body.contains(r#""key":"a b""#), "{status} {body}");
        for (path, code) in [
            ("/api/limits/api/l", "bad_key"),
            ("/api/limits/api/l?key=%zz", "bad_key"),
        ] {
            let (status, _, body) = call(open.addr, Method::GET, path).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
            assert!(body.contains(code), "{path}: {body}");
        }
        let (status, _, body) = call(open.addr, Method::DELETE, path).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert!(body.contains("admin.token"), "{body}");
        let (status, _, _) = call(open.addr, Method::POST, path).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        let (status, _, _) = call(open.addr, Method::GET, "/api/upstreams/api/hold").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);

        let shut = start_with_token(Some("t")).await;
        let bearer = Some("Bearer t");
        let (status, _, body) = call_with(shut.addr, Method::DELETE, path, bearer).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, r#"{"reset":"192.0.2.7|gold"}"#)
        );
        let hold = "/api/upstreams/api/hold";
        let (status, _, body) = call_with(shut.addr, Method::DELETE, hold, bearer).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, r#"{"lifted":"api"}"#)
        );
    }

    /// `/` serves the dashboard as HTML under its own policy, to anyone: it holds no data, and
    /// its calls to `/api/` carry the token.
    #[tokio::test]
    async fn the_dashboard_needs_no_token_and_carries_its_policy() {
        let s = start_with_token(Some("t")).await;
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let resp = client
            .request(
                Request::get(format!("http://{}/", s.addr))
                    .body(Empty::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let headers = resp.headers();
        assert_eq!(headers[CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(
            headers[http::header::CONTENT_SECURITY_POLICY],
            "default-src 'none'"
        );
        assert_eq!(headers[http::header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, test_page().html.as_bytes());
        let (status, _, _) = call(s.addr, Method::GET, "/index.html").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    /// 405 names the allowed method.
    #[test]
    fn method_not_allowed_says_get() {
        let s = AdminState {
            metrics: Metrics::new(),
            config_json: Arc::new(|| serde_json::Value::Null),
            ready: Arc::new(|| Box::pin(async { Ok(()) })),
            token: Arc::new(|| None),
            hosts: Arc::new(Vec::new),
            api: Arc::new(Figures),
            page: test_page(),
        };
        let req = Request::delete("/config").body(()).unwrap();
        let resp = respond(&s, &req);
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(resp.headers()[ALLOW], "GET, HEAD");
    }

    /// Completing the shutdown future makes `serve` return and the port stop accepting.
    #[tokio::test]
    async fn shutdown_stops_serving() {
        let s = start().await;
        let (status, _, _) = call(s.addr, Method::GET, "/healthz").await;
        assert_eq!(status, StatusCode::OK);
        s.stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), s.task)
            .await
            .expect("serve returns after shutdown")
            .unwrap();
        assert!(tokio::net::TcpStream::connect(s.addr).await.is_err());
    }
}

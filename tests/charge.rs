//! `charge: {response_header: NAME}`: what the upstream reports a request used is charged after
//! the response, into debt if need be, on real Redis (two instances sharing it) and in memory,
//! from a response header or a chunked body's trailer.

mod common;
common::both_http1_clients!();

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::yaml::Yaml;
use common::{eventually, get, Proxy, Redis, TestBody};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// An LLM-like upstream: `/used/N` answers with `x-tokens-used: N`; `/trailer/N` streams a
/// chunked body whose trailer says it; `/bad` reports `lots`; anything else reports nothing.
async fn usage_upstream() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    Ok::<_, Infallible>(answer(req.uri().path()))
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    (url, task)
}

fn answer(path: &str) -> Response<TestBody> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["used", n] => Response::builder()
            .header("x-tokens-used", *n)
            .body(common::full("answer"))
            .unwrap(),
        ["bad"] => Response::builder()
            .header("x-tokens-used", "lots")
            .body(common::full("answer"))
            .unwrap(),
        ["trailer", n] => {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("x-tokens-used", n.parse().unwrap());
            let frames: Vec<Result<Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>>> = vec![
                Ok(Frame::data(Bytes::from_static(b"streamed "))),
                Ok(Frame::data(Bytes::from_static(b"answer"))),
                Ok(Frame::trailers(trailers)),
            ];
            let stream = common::iter_stream(frames);
            Response::builder()
                .header("trailer", "x-tokens-used")
                .body(StreamBody::new(stream).boxed())
                .unwrap()
        }
        _ => Response::new(common::full("answer")),
    }
}

/// A route `api` whose limit `tokens` charges `x-tokens-used`, with `alg` its algorithm and
/// parameters.
fn charged(yaml: Yaml, alg: &str) -> String {
    let limits = format!(
        "limits:\n  - name: tokens\n    {alg}\n    charge: {{response_header: x-tokens-used}}\n"
    );
    yaml.top("admin: {listen: 127.0.0.1:0}")
        .route("api", "/", &limits)
        .build()
}

const BUCKET: &str = "algorithm: token_bucket\n    rate: 100/s\n    burst: 100";

/// The `retry_after_ms` of a 429's JSON body.
fn retry_after_ms(body: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["retry_after_ms"].as_u64().unwrap()
}

/// Waits up to `within` for the admin listener to read this client's `allowed_now` as
/// `allowed`: a spawned charge never delays the response, so the next request may overtake it
/// by a round trip. The reading takes nothing from the limit.
async fn settled(proxy: &Proxy, allowed: bool, within: Duration) {
    let url = format!(
        "http://{}/api/limits/api/tokens?key=127.0.0.1",
        proxy.admin.unwrap()
    );
    eventually(within, || async {
        let state = get(&url, &[]).await;
        assert_eq!(state.status, 200, "{}", state.body);
        let state: serde_json::Value = serde_json::from_str(&state.body).unwrap();
        state["allowed_now"] == allowed
    })
    .await;
}

/// 250 tokens used against 100 at 100/s: 150 of debt, so the next request waits for 151
/// tokens (1.51 s, less the time since); it is admitted once that has passed.
async fn debt_refuses_until_repaid(first: &Proxy, second: &Proxy) {
    let answered = get(&first.url("/used/250"), &[]).await;
    let charged_at = Instant::now();
    assert_eq!(answered.status, 200);
    // the answer that reported the debt shows it: none left, whole again in 2.5 s
    let rl = answered.header("ratelimit").unwrap();
    assert_eq!(rl, "\"tokens\";r=0;t=3");
    settled(second, false, Duration::from_secs(5)).await;
    let refused = get(&second.url("/used/1"), &[]).await;
    assert_eq!(refused.status, 429, "{refused:?}");
    let retry = retry_after_ms(&refused.body);
    let since = charged_at.elapsed().as_millis() as u64;
    // (1510 ms from the charge; a wide margin for a slow machine, never more than the debt)
    assert!(
        retry <= 1510 && retry + since >= 1300,
        "retry {retry} ms, {since} ms after"
    );
    assert_eq!(
        refused.header("retry-after"),
        Some(&*retry.div_ceil(1000).to_string())
    );
    // honest headers while in debt: none left, whole again no sooner than the debt is repaid
    let rl = refused.header("ratelimit").unwrap();
    assert!(rl.starts_with("\"tokens\";r=0;t="), "{rl}");
    let t: u64 = rl.rsplit("t=").next().unwrap().parse().unwrap();
    assert!(t >= 2, "{rl}");
    tokio::time::sleep(Duration::from_millis(retry + 50)).await;
    assert_eq!(get(&second.url("/used/1"), &[]).await.status, 200);
}

/// On Redis: a debt reported by the upstream refuses the next requests until it is repaid at
/// the bucket's rate, with a `Retry-After` that says when.
#[tokio::test]
async fn a_reported_debt_refuses_until_repaid_on_redis() {
    let redis = Redis::start();
    let (upstream, _task) = usage_upstream().await;
    let proxy = Proxy::start(&charged(Yaml::to(&[upstream]).redis(&redis, ""), BUCKET)).await;
    debt_refuses_until_repaid(&proxy, &proxy).await;
}

/// Two instances on one Redis share the debt: a charge made through one refuses the client
/// on the other.
#[tokio::test]
async fn two_instances_share_the_debt() {
    let redis = Redis::start();
    let (upstream, _task) = usage_upstream().await;
    let yaml = charged(Yaml::to(&[upstream]).redis(&redis, ""), BUCKET);
    let (a, b) = (Proxy::start(&yaml).await, Proxy::start(&yaml).await);
    debt_refuses_until_repaid(&a, &b).await;
}

/// In memory, without Redis, the debt works the same.
#[tokio::test]
async fn a_reported_debt_refuses_until_repaid_in_memory() {
    let (upstream, _task) = usage_upstream().await;
    let proxy = Proxy::start(&charged(Yaml::to(&[upstream]), BUCKET)).await;
    debt_refuses_until_repaid(&proxy, &proxy).await;
}

/// A streamed answer that reports its usage in a trailer is charged from it, over HTTP/1.1
/// (chunked) and HTTP/2 to the upstream; the client gets the body and the trailer whole.
#[tokio::test]
async fn a_trailer_charges_a_streamed_answer() {
    let redis = Redis::start();
    let (upstream, _task) = usage_upstream().await;
    for protocol in ["http1", "http2"] {
        redis.cli(&["flushall"]);
        let yaml = Yaml::to(std::slice::from_ref(&upstream))
            .redis(&redis, "")
            .upstream(&format!("protocol: {protocol}"));
        let proxy = Proxy::start(&charged(yaml, BUCKET)).await;
        trailer_charges(&proxy).await;
        proxy.shutdown().await;
    }
}

async fn trailer_charges(proxy: &Proxy) {
    let req = Request::get(proxy.url("/trailer/250"))
        .header("te", "trailers")
        .body(common::full(""))
        .unwrap();
    let resp = common::http_client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap();
    assert_eq!(
        body.trailers().and_then(|t| t.get("x-tokens-used")),
        Some(&http::HeaderValue::from_static("250"))
    );
    assert_eq!(body.to_bytes(), "streamed answer");
    settled(proxy, false, Duration::from_secs(5)).await;
    let refused = get(&proxy.url("/used/1"), &[]).await;
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(retry_after_ms(&refused.body) > 1000, "{}", refused.body);
}

/// The metric line of `tollgate_charge_unread_total` for `reason`, from the admin listener.
async fn unread(proxy: &Proxy, reason: &str) -> String {
    let admin = format!("http://{}/metrics", proxy.admin.unwrap());
    let text = get(&admin, &[]).await.body;
    let series = format!(
        "tollgate_charge_unread_total{{route=\"api\",limit=\"tokens\",reason=\"{reason}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .to_owned()
}

/// A response without the number, or with one that is not a whole number, charges nothing
/// more and is counted by reason; a trailer-less stream is missing too.
#[tokio::test]
async fn missing_and_malformed_values_charge_nothing_and_are_counted() {
    let redis = Redis::start();
    let (upstream, _task) = usage_upstream().await;
    // (slow to refill, so that what was taken shows in the headers)
    let alg = "algorithm: token_bucket\n    rate: 1/h\n    burst: 100";
    let proxy = Proxy::start(&charged(Yaml::to(&[upstream]).redis(&redis, ""), alg)).await;
    assert_eq!(unread(&proxy, "missing").await, "0");
    assert_eq!(unread(&proxy, "malformed").await, "0");
    assert_eq!(get(&proxy.url("/none"), &[]).await.status, 200);
    assert_eq!(get(&proxy.url("/bad"), &[]).await.status, 200);
    assert_eq!(get(&proxy.url("/bad"), &[]).await.status, 200);
    // counted once each response has ended: then exactly these
    eventually(Duration::from_secs(5), || async {
        let counted = |n: String| n.parse::<u64>().unwrap();
        counted(unread(&proxy, "missing").await) >= 1
            && counted(unread(&proxy, "malformed").await) >= 2
    })
    .await;
    assert_eq!(unread(&proxy, "missing").await, "1");
    assert_eq!(unread(&proxy, "malformed").await, "2");
    // three requests took one token each, and nothing more: 96 left after the fourth
    let fourth = get(&proxy.url("/used/1"), &[]).await;
    let rl = fourth.header("ratelimit").unwrap();
    assert!(rl.starts_with("\"tokens\";r=96;"), "{rl}");
}

/// A smaller number than the cost gives back: a bucket of 5 at one token a second whose
/// requests cost all 5 admits the next at once when the answer used none.
#[tokio::test]
async fn a_smaller_report_gives_back() {
    let redis = Redis::start();
    let (upstream, _task) = usage_upstream().await;
    let alg = "algorithm: token_bucket\n    rate: 1/s\n    burst: 5\n    cost: 5";
    let proxy = Proxy::start(&charged(Yaml::to(&[upstream]).redis(&redis, ""), alg)).await;
    assert_eq!(get(&proxy.url("/used/5"), &[]).await.status, 200);
    settled(&proxy, false, Duration::from_secs(5)).await;
    assert_eq!(get(&proxy.url("/used/0"), &[]).await.status, 429);
    // (the refusal above took nothing) wait out one request's worth, then one that used none
    tokio::time::sleep(Duration::from_millis(5100)).await;
    assert_eq!(get(&proxy.url("/used/0"), &[]).await.status, 200);
    // (well before the bucket could refill the 5 by itself)
    settled(&proxy, true, Duration::from_secs(2)).await;
    assert_eq!(get(&proxy.url("/used/5"), &[]).await.status, 200);
}

/// The counting windows are charged too: 30 used in a window of 10 refuses the next request,
/// on the fixed window until the window ends, on the counter into the next window.
#[tokio::test]
async fn windows_are_charged() {
    let redis = Redis::start();
    let (upstream, _task) = usage_upstream().await;
    for alg in ["fixed_window", "sliding_window_counter"] {
        redis.cli(&["flushall"]);
        let params = format!("algorithm: {alg}\n    limit: 10\n    window: 10s");
        let yaml = charged(
            Yaml::to(std::slice::from_ref(&upstream)).redis(&redis, ""),
            &params,
        );
        let proxy = Proxy::start(&yaml).await;
        clear_of_window_end().await;
        assert_eq!(get(&proxy.url("/used/30"), &[]).await.status, 200, "{alg}");
        settled(&proxy, false, Duration::from_secs(5)).await;
        let refused = get(&proxy.url("/used/1"), &[]).await;
        assert_eq!(refused.status, 429, "{alg}: {refused:?}");
        let retry = retry_after_ms(&refused.body);
        assert!((1..=20_000).contains(&retry), "{alg}: {retry}");
        let rl = refused.header("ratelimit").unwrap();
        assert!(rl.starts_with("\"tokens\";r=0;"), "{alg}: {rl}");
        proxy.shutdown().await;
    }
}

/// Waits out the end of the 10 s window under way when less than 2 s of it is left, so that a
/// charge and the check after it fall in one fixed window.
async fn clear_of_window_end() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let left = 10_000 - now % 10_000;
    if left < 2000 {
        tokio::time::sleep(Duration::from_millis(left + 100)).await;
    }
}

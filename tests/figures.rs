//! What tollgate reports against what its clients got, with the real binary, a real Redis and
//! real upstreams: a gRPC call's outcome (HTTP 200 with a `grpc-status`) in the access log, in
//! `tollgate_requests_total` and in `/api/stats`; and every wait for an upstream measured,
//! for `pace.concurrency` too, and for requests that gave up waiting.
//!
//! (The tests block a worker on plain sockets at times: a third keeps the in-process upstream
//! served meanwhile.)

mod common;

use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::binary::{access_fields, run_listening};
use common::{free_port, iter_stream, Redis, TestBody, Upstream};
use http::uri::PathAndQuery;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tonic::{Code, Request, Status};

/// The one message of the test service.
#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    #[prost(string, tag = "1")]
    text: String,
}

type Codec = tonic_prost::ProstCodec<Msg, Msg>;

/// A gRPC server as the wire has it, over h2c: every call is answered with one message, then
/// the status in the trailers: `/test.Echo/Missing` NOT_FOUND (5), any other method OK (0).
/// A request that is not gRPC gets a plain 200 "ok".
async fn grpc_upstream() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: http::Request<Incoming>| async move {
                    Ok::<_, Infallible>(grpc_answer(&req))
                });
                let h2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                let _ = h2.serve_connection(TokioIo::new(tcp), svc).await;
            });
        }
    });
    (addr, task)
}

fn grpc_answer(req: &http::Request<Incoming>) -> http::Response<TestBody> {
    let grpc = req
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if !grpc {
        return http::Response::new(common::full("ok"));
    }
    let status = if req.uri().path() == "/test.Echo/Missing" {
        "5"
    } else {
        "0"
    };
    let message = prost::Message::encode_to_vec(&Msg { text: "hi".into() });
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", status.parse().unwrap());
    let frames: Vec<Result<Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>>> = vec![
        Ok(Frame::data(Bytes::from(framed))),
        Ok(Frame::trailers(trailers)),
    ];
    let mut resp = http::Response::new(StreamBody::new(iter_stream(frames)).boxed());
    resp.headers_mut()
        .insert("content-type", "application/grpc".parse().unwrap());
    resp
}

/// A tonic client of tollgate on `port`, over h2c.
async fn client(port: u16) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .expect("tollgate takes HTTP/2 in the clear");
    tonic::client::Grpc::new(channel)
}

/// Calls `path` as caller `caller`, with `id` as the call's request id.
async fn call(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    path: &'static str,
    caller: &str,
    id: &str,
) -> Result<Msg, Status> {
    let mut req = Request::new(Msg { text: "x".into() });
    req.metadata_mut()
        .insert("x-caller", caller.parse().unwrap());
    req.metadata_mut()
        .insert("x-request-id", id.parse().unwrap());
    grpc.ready().await.unwrap();
    let path = PathAndQuery::from_static(path);
    grpc.unary(req, path, Codec::default())
        .await
        .map(|r| r.into_inner())
}

/// The config of the gRPC tests: route `api` under a limit of one call per caller an hour,
/// route `paced` to an upstream paced at one call in 2 s that refuses past 100 ms, route `plain` with
/// neither; the admin listener on `admin`.
fn grpc_config(port: u16, admin: u16, redis: &Redis, upstream: SocketAddr) -> String {
    format!(
        "listen: 127.0.0.1:{port}
admin: {{listen: 127.0.0.1:{admin}}}
store: {{backend: redis, url: \"{redis}\"}}
upstreams:
  grpc: {{targets: [\"http://{upstream}\"], protocol: http2}}
  slow:
    targets: [\"http://{upstream}\"]
    protocol: http2
    pace: {{rate: 30/min, max_delay: 100ms}}
routes:
  - name: paced
    match: {{path_prefix: /paced}}
    upstream: slow
    strip_prefix: true
  - name: api
    match: {{path_prefix: /test.Echo/}}
    upstream: grpc
    limits:
      - {{name: per-caller, algorithm: token_bucket, key: \"header:x-caller\", rate: 1/h, burst: 1}}
  - name: plain
    match: {{path_prefix: /}}
    upstream: grpc
",
        redis = redis.url()
    )
}

/// A refused gRPC call is logged with `grpc_status` 8, counted under `status="429"` (the
/// documented refusal query) and in its route's 429 share of `/api/stats`; UNAVAILABLE from
/// pacing is logged with 14 and counted with the 5xx; the upstream's own status, sent in the
/// trailers, is logged too; a request that is not gRPC has no `grpc_status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn grpc_outcomes_are_in_every_figure() {
    let redis = Redis::start();
    let (upstream, _task) = grpc_upstream().await;
    let (port, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let yaml = grpc_config(port, admin, &redis, upstream);
    let (_child, lines) = run_listening(&dir, &yaml, port, "json");
    // the console's figures are the change between its first sample and its last
    assert_eq!(admin_get(admin, "/api/stats").0, 200);
    let mut grpc = client(port).await;

    call(&mut grpc, "/test.Echo/Say", "a", "ok").await.unwrap();
    let refused = call(&mut grpc, "/test.Echo/Say", "a", "refused").await;
    assert_eq!(refused.unwrap_err().code(), Code::ResourceExhausted);
    let missing = call(&mut grpc, "/test.Echo/Missing", "b", "missing").await;
    assert_eq!(missing.unwrap_err().code(), Code::NotFound);
    call(&mut grpc, "/paced/test.Echo/Say", "c", "paced")
        .await
        .unwrap();
    let unavailable = call(&mut grpc, "/paced/test.Echo/Say", "c", "unavailable").await;
    assert_eq!(unavailable.unwrap_err().code(), Code::Unavailable);
    let plain = raw_get(port, "/plain", "not-grpc");
    assert!(plain.starts_with("HTTP/1.1 200"), "{plain}");

    let logged = access_fields(&lines, 6);
    for (id, grpc_status) in [
        ("ok", 0),
        ("refused", 8),
        ("missing", 5),
        ("paced", 0),
        ("unavailable", 14),
    ] {
        let line = &logged[id];
        assert_eq!(line["status"], 200, "{id}: {line:#}");
        assert_eq!(line["grpc_status"], grpc_status, "{id}: {line:#}");
    }
    let plain = &logged["not-grpc"];
    assert_eq!(plain["status"], 200, "{plain:#}");
    assert!(plain.get("grpc_status").is_none(), "{plain:#}");

    let metrics = admin_get(admin, "/metrics").1;
    for expected in [
        r#"tollgate_requests_total{route="api",status="200"} 2"#,
        r#"tollgate_requests_total{route="api",status="429"} 1"#,
        r#"tollgate_requests_total{route="paced",status="200"} 1"#,
        r#"tollgate_requests_total{route="paced",status="503"} 1"#,
    ] {
        assert!(metrics.contains(expected), "no `{expected}` in\n{metrics}");
    }

    // the rates need a second sample, a second after the first; the window keeps them
    let stats = || {
        let (status, body) = admin_get(admin, "/api/stats");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()
    };
    common::eventually(Duration::from_secs(10), || async {
        stats()["routes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "api" && r["share_429"].as_f64() > Some(0.0))
    })
    .await;
    let stats = stats();
    let route = |name: &str| {
        stats["routes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no route {name}: {stats:#}"))
            .clone()
    };
    let api = route("api");
    let share = api["share_429"].as_f64().unwrap();
    assert!(
        (share - 1.0 / 3.0).abs() < 0.01,
        "one call of three: {api:#}"
    );
    assert!(api["status_rps"]["429"].as_f64().unwrap() > 0.0, "{api:#}");
    let paced = route("paced");
    assert!(
        paced["status_rps"]["5xx"].as_f64().unwrap() > 0.0,
        "{paced:#}"
    );
    assert_eq!(paced["share_429"], 0.0, "{paced:#}");
}

/// The text access log has the gRPC status of a refused call after its 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn text_access_lines_have_the_grpc_status() {
    let redis = Redis::start();
    let (upstream, _task) = grpc_upstream().await;
    let (port, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let yaml = grpc_config(port, admin, &redis, upstream);
    let (_child, lines) = run_listening(&dir, &yaml, port, "text");
    let mut grpc = client(port).await;
    call(&mut grpc, "/test.Echo/Say", "a", "first")
        .await
        .unwrap();
    let refused = call(&mut grpc, "/test.Echo/Say", "a", "second").await;
    assert_eq!(refused.unwrap_err().code(), Code::ResourceExhausted);
    let line = next_line(&lines, "request_id=second");
    assert!(
        line.contains("\"POST /test.Echo/Say HTTP/2\" 200 0 ") && line.contains(" grpc_status=8 "),
        "{line}"
    );
}

/// Requests wait for a `pace.concurrency` upstream's slot, and the wait is in
/// `tollgate_pacing_delay_seconds`, a series there from the start. A request refused after
/// waiting, and one whose client left while it waited for the upstream or for a `leaky_bucket`
/// limit, are logged with the time they waited;
/// one whose client left while the upstream was answering names the upstream it was sent to.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn waits_are_measured_wherever_they_happen() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let (port, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:{port}
admin: {{listen: 127.0.0.1:{admin}}}
store: {{backend: redis, url: \"{redis}\"}}
upstreams:
  api: {{targets: [\"{url}\"]}}
  one: {{targets: [\"{url}\"], pace: {{concurrency: 1, max_delay: 400ms}}}}
  rated: {{targets: [\"{url}\"], pace: {{rate: 30/min, max_delay: 5s}}}}
routes:
  - {{name: one, match: {{path_prefix: /one}}, upstream: one, strip_prefix: true}}
  - {{name: rated, match: {{path_prefix: /rated}}, upstream: rated, strip_prefix: true}}
  - name: held
    match: {{path_prefix: /held}}
    upstream: api
    strip_prefix: true
    limits: [{{name: steady, algorithm: leaky_bucket, rate: 30/min, max_delay: 5s}}]
  - {{name: api, match: {{path_prefix: /}}, upstream: api}}
",
        redis = redis.url(),
        url = upstream.url()
    );
    let (_child, lines) = run_listening(&dir, &yaml, port, "json");
    let metrics = admin_get(admin, "/metrics").1;
    let series = r#"tollgate_pacing_delay_seconds_count{upstream="one"} 0"#;
    assert!(metrics.contains(series), "no `{series}` in\n{metrics}");

    // the slot is held for 1.5 s: the second request waits 400 ms for it, then is refused
    let holder = std::thread::spawn(move || raw_get(port, "/one/slow/1500", "holder"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream.seen().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the holder did not reach the upstream"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let refused = raw_get(port, "/one/x", "refused");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(holder.join().unwrap().starts_with("HTTP/1.1 200"));

    // the first takes the rate's slot; the second's client leaves 500 ms into its 2 s wait
    assert!(raw_get(port, "/rated/x", "rated").starts_with("HTTP/1.1 200"));
    leave_after(port, "/rated/x", "left-waiting", Duration::from_millis(500));
    // the same held back by a `leaky_bucket` limit rather than by the upstream's pacing
    assert!(raw_get(port, "/held/x", "held").starts_with("HTTP/1.1 200"));
    leave_after(port, "/held/x", "left-held", Duration::from_millis(500));
    // the upstream answers in 3 s: the client leaves after 300 ms
    leave_after(
        port,
        "/slow/3000",
        "left-answering",
        Duration::from_millis(300),
    );

    let logged = access_fields(&lines, 7);
    let waited = |id: &str| logged[id]["pacing_delay_ms"].as_f64().unwrap();
    assert!(waited("holder") < 100.0, "{:#}", logged["holder"]);
    let refused = &logged["refused"];
    assert_eq!(refused["status"], 503, "{refused:#}");
    assert!((300.0..1500.0).contains(&waited("refused")), "{refused:#}");
    let left = &logged["left-waiting"];
    assert_eq!(left["status"], 499, "{left:#}");
    assert!(
        (400.0..1500.0).contains(&waited("left-waiting")),
        "{left:#}"
    );
    assert_eq!(left["upstream_addr"], "-", "never sent: {left:#}");
    let held = &logged["left-held"];
    assert_eq!(held["status"], 499, "{held:#}");
    assert_eq!(held["limit"], "steady", "{held:#}");
    assert!((400.0..1500.0).contains(&waited("left-held")), "{held:#}");
    let gone = &logged["left-answering"];
    assert_eq!(gone["status"], 499, "{gone:#}");
    assert_eq!(gone["upstream_addr"], upstream.addr.to_string(), "{gone:#}");

    let metrics = admin_get(admin, "/metrics").1;
    let count = |upstream: &str| {
        let name = format!("tollgate_pacing_delay_seconds_count{{upstream=\"{upstream}\"}} ");
        let line = metrics.lines().find(|l| l.starts_with(&name));
        line.and_then(|l| l[name.len()..].parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no `{name}` in\n{metrics}"))
    };
    assert_eq!(count("one"), 2.0, "{metrics}");
    assert_eq!(count("rated"), 2.0, "{metrics}");
    // the refused request's 400 ms are in the histogram: one wait past 250 ms
    let bucket = r#"tollgate_pacing_delay_seconds_bucket{le="0.25",upstream="one"} 1"#;
    assert!(metrics.contains(bucket), "no `{bucket}` in\n{metrics}");
}

// ---------------------------------------------------------------------------------------------
// The binary, its log and its admin listener.

/// The next log line that holds `text`.
fn next_line(lines: &Receiver<String>, text: &str) -> String {
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("no log line with {text}"));
        if line.contains(text) {
            return line;
        }
    }
}

/// A GET of `path` over HTTP/1.1 with request id `id`, read to the end.
fn raw_get(port: u16, path: &str, id: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: t\r\nX-Request-Id: {id}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// A GET of `path` whose client closes its connection `after` sending it, unanswered.
fn leave_after(port: u16, path: &str, id: &str, after: Duration) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: t\r\nX-Request-Id: {id}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(after);
    drop(s);
}

/// A GET of the admin listener's `path`: its status and body.
fn admin_get(admin: u16, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", admin)).unwrap();
    let head = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_owned())
}

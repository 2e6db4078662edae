//! gRPC through tollgate, with tonic on both ends: unary, server-streaming, client-streaming
//! and bidirectional calls, over h2c and over TLS; statuses and messages carried in trailers;
//! streams passed on as they come. And the answers tollgate gives a gRPC client itself: a
//! limit's refusal is RESOURCE_EXHAUSTED with the rate-limit headers as metadata, pacing and a
//! store that cannot answer are UNAVAILABLE, no route is UNIMPLEMENTED.

mod common;
common::both_http1_clients!();

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::pki::Pki;
use common::{DeadPort, Proxy, Yaml};
use http::uri::PathAndQuery;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Code, Request, Response, Status, Streaming};

/// The one message of the test service.
#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    #[prost(string, tag = "1")]
    text: String,
}

fn msg(text: impl Into<String>) -> Msg {
    Msg { text: text.into() }
}

type Codec = tonic_prost::ProstCodec<Msg, Msg>;

/// A gRPC method as a closure, in the shape tonic's server runs it.
#[derive(Clone)]
struct Method<F>(F);

impl<F, Req, Res, Fut> tower_service::Service<Request<Req>> for Method<F>
where
    F: FnMut(Request<Req>) -> Fut,
    Fut: Future<Output = Result<Response<Res>, Status>>,
{
    type Response = Response<Res>;
    type Error = Status;
    type Future = Fut;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Req>) -> Fut {
        (self.0)(req)
    }
}

/// The test service `test.Echo`, served by tonic's server side over HTTP/2.
///
/// * `Say`: unary, answers "hello TEXT".
/// * `Count`: server-streaming, answers TEXT messages "0", "1", …, one every 100 ms.
/// * `Join`: client-streaming, answers the texts it got, joined by spaces.
/// * `Chat`: bidirectional, answers each message at once with "re: TEXT".
/// * `Fail`: answers NOT_FOUND "nothing here".
struct EchoServer {
    addr: SocketAddr,
    tls: bool,
    /// calls that came with `te: trailers`, and all calls
    with_te: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn echo(req: http::Request<Incoming>) -> http::Response<tonic::body::Body> {
    let mut grpc = tonic::server::Grpc::new(Codec::default());
    match req.uri().path() {
        "/test.Echo/Say" => {
            let say = |r: Request<Msg>| async move {
                Ok(Response::new(msg(format!("hello {}", r.into_inner().text))))
            };
            grpc.unary(Method(say), req).await
        }
        "/test.Echo/Count" => {
            let count = |r: Request<Msg>| async move {
                let n: usize = r.into_inner().text.parse().unwrap_or(0);
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                tokio::spawn(async move {
                    for i in 0..n {
                        if i > 0 {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        if tx.send(Ok(msg(i.to_string()))).await.is_err() {
                            return;
                        }
                    }
                });
                Ok(Response::new(ReceiverStream::new(rx)))
            };
            grpc.server_streaming(Method(count), req).await
        }
        "/test.Echo/Join" => {
            let join = |r: Request<Streaming<Msg>>| async move {
                let mut incoming = r.into_inner();
                let mut texts = Vec::new();
                while let Some(m) = incoming.message().await? {
                    texts.push(m.text);
                }
                Ok(Response::new(msg(texts.join(" "))))
            };
            grpc.client_streaming(Method(join), req).await
        }
        "/test.Echo/Chat" => {
            let chat = |r: Request<Streaming<Msg>>| async move {
                let replies = r
                    .into_inner()
                    .map(|m| m.map(|m| msg(format!("re: {}", m.text))));
                Ok(Response::new(replies))
            };
            grpc.streaming(Method(chat), req).await
        }
        "/test.Echo/Fail" => {
            let fail = |_: Request<Msg>| async move {
                Err::<Response<Msg>, _>(Status::not_found("nothing here"))
            };
            grpc.unary(Method(fail), req).await
        }
        _ => Status::unimplemented("no such method").into_http(),
    }
}

impl EchoServer {
    /// Serves over HTTP/2 in the clear (h2c), or over TLS as `tls` says.
    async fn start(tls: Option<Arc<rustls::ServerConfig>>) -> EchoServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (with_te, calls) = (Arc::default(), Arc::default());
        let (te, all): (Arc<AtomicUsize>, Arc<AtomicUsize>) =
            (Arc::clone(&with_te), Arc::clone(&calls));
        let acceptor = tls.clone().map(tokio_rustls::TlsAcceptor::from);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (te, all, acceptor) = (te.clone(), all.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                        all.fetch_add(1, Ordering::SeqCst);
                        if req.headers().get("te").is_some_and(|v| v == "trailers") {
                            te.fetch_add(1, Ordering::SeqCst);
                        }
                        async move { Ok::<_, Infallible>(echo(req).await) }
                    });
                    let h2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                    let _ = match acceptor {
                        None => h2.serve_connection(TokioIo::new(tcp), svc).await,
                        Some(acceptor) => match acceptor.accept(tcp).await {
                            Ok(tls) => h2.serve_connection(TokioIo::new(tls), svc).await,
                            Err(_) => return,
                        },
                    };
                });
            }
        });
        EchoServer {
            addr,
            tls: tls.is_some(),
            with_te,
            calls,
            task,
        }
    }

    fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }
}

/// A tonic client of tollgate at `addr`, over h2c.
async fn client(addr: SocketAddr) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("tollgate takes HTTP/2 in the clear");
    tonic::client::Grpc::new(channel)
}

async fn say(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    req: Request<Msg>,
) -> Result<Response<Msg>, Status> {
    grpc.ready().await.unwrap();
    let path = PathAndQuery::from_static("/test.Echo/Say");
    grpc.unary(req, path, Codec::default()).await
}

/// Every kind of call works end to end through tollgate, with statuses intact and streams
/// passed on message by message, over h2c and over TLS (HTTP/2 chosen by ALPN).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_call_goes_through() {
    let pki = Pki::new();
    let cert = pki.issue("grpc", &["127.0.0.1"]);
    let clear = EchoServer::start(None).await;
    let secure = EchoServer::start(Some(pki.server_config(&cert, &[b"h2"], false))).await;
    let ca = format!("tls: {{ca: {}}}", pki.ca().display());
    let yaml = Yaml::to(&[clear.url()])
        .upstream("protocol: http2")
        .also_upstream("secure", &[secure.url()], &ca)
        .route_to("secure", "/test.Echo/Say", "secure", "")
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    let mut grpc = client(proxy.addr).await;

    let answer = say(&mut grpc, Request::new(msg("over tls"))).await.unwrap();
    assert_eq!(answer.into_inner().text, "hello over tls");
    assert_eq!(
        secure.calls.load(Ordering::SeqCst),
        1,
        "the TLS upstream answered"
    );

    // server-streaming: the first message arrives well before the last is sent
    grpc.ready().await.unwrap();
    let started = Instant::now();
    let path = PathAndQuery::from_static("/test.Echo/Count");
    let mut stream = grpc
        .server_streaming(Request::new(msg("5")), path, Codec::default())
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    let mut first_at = None;
    while let Some(m) = stream.message().await.unwrap() {
        first_at.get_or_insert(started.elapsed());
        got.push(m.text);
    }
    assert_eq!(got, ["0", "1", "2", "3", "4"]);
    let (first, all) = (first_at.unwrap(), started.elapsed());
    assert!(all >= Duration::from_millis(400), "{all:?}");
    // (buffered, all five would come together; the margin leaves room for a stalled first)
    assert!(
        all - first >= Duration::from_millis(150),
        "streamed, not buffered: {first:?} of {all:?}"
    );

    // client-streaming
    grpc.ready().await.unwrap();
    let path = PathAndQuery::from_static("/test.Echo/Join");
    let words = tokio_stream::iter(["a", "b", "c"].map(msg));
    let joined = grpc
        .client_streaming(Request::new(words), path, Codec::default())
        .await
        .unwrap();
    assert_eq!(joined.into_inner().text, "a b c");

    // bidirectional: each answer comes before the next message is sent
    grpc.ready().await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let path = PathAndQuery::from_static("/test.Echo/Chat");
    tx.send(msg("0")).await.unwrap();
    let mut replies = grpc
        .streaming(
            Request::new(ReceiverStream::new(rx)),
            path,
            Codec::default(),
        )
        .await
        .unwrap()
        .into_inner();
    for i in 0..3 {
        if i > 0 {
            tx.send(msg(i.to_string())).await.unwrap();
        }
        let reply = tokio::time::timeout(Duration::from_secs(5), replies.message())
            .await
            .expect("an answer before the next message")
            .unwrap()
            .unwrap();
        assert_eq!(reply.text, format!("re: {i}"));
    }
    drop(tx);
    assert!(
        replies.message().await.unwrap().is_none(),
        "the call ends with the client"
    );

    // a status and its message travel in the trailers
    grpc.ready().await.unwrap();
    let path = PathAndQuery::from_static("/test.Echo/Fail");
    let failed = grpc
        .unary(Request::new(msg("x")), path, Codec::default())
        .await
        .unwrap_err();
    assert_eq!(
        (failed.code(), failed.message()),
        (Code::NotFound, "nothing here")
    );

    // gRPC servers need `te: trailers`; every call had it
    let calls = clear.calls.load(Ordering::SeqCst) + secure.calls.load(Ordering::SeqCst);
    let with_te = clear.with_te.load(Ordering::SeqCst) + secure.with_te.load(Ordering::SeqCst);
    assert_eq!((with_te, calls), (5, 5));
    proxy.shutdown().await;
}

/// tollgate's own answers to gRPC calls are gRPC statuses: a limit's refusal is
/// RESOURCE_EXHAUSTED naming the limit, with `retry-after` and the rate-limit headers as
/// metadata; a pacing refusal and a store that cannot answer under `on_error: deny` are
/// UNAVAILABLE; a path no route takes is UNIMPLEMENTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_grpc_statuses() {
    let server = EchoServer::start(None).await;
    let dead = DeadPort::new();
    let limit = "limits: [{name: per-caller, algorithm: token_bucket, key: header:x-caller, \
                 rate: 1/h, burst: 1}]";
    let yaml = Yaml::to(&[server.url()])
        .upstream("protocol: http2")
        .also_upstream(
            "paced",
            &[server.url()],
            "protocol: http2\npace: {rate: 1/s, max_delay: 100ms}",
        )
        .route_to("paced", "/paced", "paced", "strip_prefix: true")
        .route("api", "/test.Echo/", limit)
        .build();
    let proxy = Proxy::start(&yaml).await;
    let mut grpc = client(proxy.addr).await;
    let as_caller = |who: &str| {
        let mut req = Request::new(msg("x"));
        req.metadata_mut().insert("x-caller", who.parse().unwrap());
        req
    };
    say(&mut grpc, as_caller("a")).await.unwrap();
    let refused = say(&mut grpc, as_caller("a")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("per-caller"), "{refused:?}");
    let meta = refused.metadata();
    let retry: u64 = meta
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry > 3000, "an hourly limit's wait: {retry}");
    assert!(meta.get("ratelimit-policy").is_some(), "{meta:?}");
    assert!(meta.get("ratelimit").is_some(), "{meta:?}");

    // pacing: the first takes the slot, the second would wait past max_delay
    let paced = PathAndQuery::from_static("/paced/test.Echo/Say");
    grpc.ready().await.unwrap();
    grpc.unary(Request::new(msg("1")), paced.clone(), Codec::default())
        .await
        .unwrap();
    grpc.ready().await.unwrap();
    let refused = grpc
        .unary(Request::new(msg("2")), paced, Codec::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.metadata().get("retry-after").is_some(),
        "{refused:?}"
    );

    grpc.ready().await.unwrap();
    let nowhere = PathAndQuery::from_static("/other.Service/Call");
    let missing = grpc
        .unary(Request::new(msg("x")), nowhere, Codec::default())
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::Unimplemented, "{missing:?}");
    proxy.shutdown().await;

    // a store that cannot answer, with `on_error: deny`
    let store = format!(
        "store: {{backend: redis, url: \"redis://127.0.0.1:{}\", timeout: 200ms, on_error: deny}}",
        dead.port()
    );
    let yaml = Yaml::to(&[server.url()])
        .top(&store)
        .upstream("protocol: http2")
        .route("api", "/", limit)
        .build();
    let proxy = Proxy::start(&yaml).await;
    let mut grpc = client(proxy.addr).await;
    let refused = say(&mut grpc, as_caller("b")).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    proxy.shutdown().await;
}

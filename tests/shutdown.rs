//! Graceful shutdown: requests in flight when shutdown starts (one waiting on a slow upstream,
//! one sleeping for its pacing slot) complete; new connections are refused.

mod common;
common::both_http1_clients!();

use std::time::{Duration, Instant};

use common::{eventually, get, Proxy, Upstream, Yaml};

/// In-flight requests, including one sleeping in pacing, finish after shutdown begins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_requests_complete_during_drain() {
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .top("timeouts: {shutdown: 5s}")
        .also_upstream(
            "paced",
            &[upstream.url()],
            "pace: {rate: 2/s, max_delay: 5s}",
        )
        .route("slow", "/slow", "")
        .route_to("paced", "/", "paced", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    assert_eq!(
        get(&proxy.url("/p0"), &[]).await.status,
        200,
        "takes the first pacing slot"
    );
    let in_flight = |path: &str| {
        let url = proxy.url(path);
        tokio::spawn(async move { get(&url, &[]).await })
    };
    let (slow, paced) = (in_flight("/slow/600"), in_flight("/p1"));
    // both read by the proxy: the slow one at the upstream, the paced one waiting for its slot
    // (half a second after /p0's)
    eventually(Duration::from_secs(5), || async {
        upstream.seen().iter().any(|s| s.uri == "/slow/600")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let addr = proxy.addr;
    let started = Instant::now();
    let stopping = tokio::spawn(proxy.shutdown());
    eventually(Duration::from_secs(2), || async {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
    assert_eq!(slow.await.unwrap().status, 200);
    assert_eq!(paced.await.unwrap().status, 200);
    stopping.await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "drain ended when the requests did"
    );
    let uris: Vec<String> = upstream.seen().iter().map(|s| s.uri.clone()).collect();
    assert!(uris.contains(&"/p1".to_string()) && uris.contains(&"/slow/600".to_string()));
}

/// A client that stops reading a response that began during the drain is cut off at `send`: it
/// does not hold the shutdown until `timeouts.shutdown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_does_not_hold_the_drain() {
    use tokio::io::AsyncWriteExt;
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .top("timeouts: {shutdown: 20s, send: 1s, client_header: 30s}")
        .upstream("pace: {rate: 2/s, max_delay: 5s}")
        .route("paced", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    assert_eq!(
        get(&proxy.url("/p0"), &[]).await.status,
        200,
        "takes the first pacing slot"
    );
    // the next waits half a second for its slot: its response begins during the drain
    let mut client = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let huge: u64 = 8 << 30;
    let head = format!("GET /bytes/{huge} HTTP/1.1\r\nHost: x\r\n\r\n");
    client.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    proxy.shutdown().await;
    let took = started.elapsed();
    println!("drain with a client that reads nothing: {took:?}");
    assert!(
        took < Duration::from_secs(8),
        "the drain waited {took:?} for a client that reads nothing (send: 1s)"
    );
    assert!(upstream.seen().iter().any(|s| s.uri.starts_with("/bytes/")));
    drop(client);
}

//! Worker threads (`workers`): each serves its share of the connections, requests in flight on
//! every worker finish during the drain, and the threads are gone when the server has stopped.
//! (Its own test binary: it counts the process's threads by name.)

mod common;
common::both_http1_clients!();

use std::time::{Duration, Instant};

use common::{eventually, get, Proxy, Upstream, Yaml};

/// Threads of this process named as tollgate's worker threads (`tollgate-w<k>`).
fn worker_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("tollgate-w"))
        .count()
}

/// The number of worker threads once it is `expected`, or after `limit`.
async fn threads_within(expected: usize, limit: Duration) -> usize {
    let deadline = Instant::now() + limit;
    while worker_threads() != expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker_threads()
}

#[tokio::test]
async fn every_worker_serves_and_drains_and_stops_with_the_server() {
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .top("workers: 3\ntimeouts: {shutdown: 5s}")
        .route("all", "/", "")
        .build();
    assert_eq!(worker_threads(), 0);
    let proxy = Proxy::start(&yaml).await;
    // (a thread takes its name once it runs)
    assert_eq!(
        threads_within(2, Duration::from_secs(5)).await,
        2,
        "workers 1 and 2 (worker 0 is the server's own)"
    );
    // connections are handed out in turn: twelve reach every worker four times, and each is
    // answered by the upstream, over the upstream connections of the worker serving it (one
    // each, kept alive between the requests of that worker: one only, were every client
    // connection served by the same worker)
    for i in 0..12 {
        let answer = get(&proxy.url(&format!("/n{i}")), &[]).await;
        assert_eq!(answer.status, 200, "connection {i}: {}", answer.body);
    }
    let pools = upstream.connections();
    assert!(
        (3..=6).contains(&pools),
        "{pools} upstream connections for three workers' pools"
    );
    // one slow request in flight on each worker when shutdown starts: all of them finish
    let in_flight: Vec<_> = (0..3)
        .map(|i| {
            let url = proxy.url(&format!("/slow/{}", 500 + i));
            tokio::spawn(async move { get(&url, &[]).await })
        })
        .collect();
    eventually(Duration::from_secs(5), || async {
        let seen = upstream.seen();
        (0..3).all(|i| seen.iter().any(|s| s.uri == format!("/slow/{}", 500 + i)))
    })
    .await;
    let started = Instant::now();
    proxy.shutdown().await;
    for (i, answer) in in_flight.into_iter().enumerate() {
        let answer = answer.await.expect("request task");
        assert_eq!(
            answer.status, 200,
            "in flight on worker {i}: {}",
            answer.body
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "drain ended when the requests did: {:?}",
        started.elapsed()
    );
    assert_eq!(
        threads_within(0, Duration::from_secs(5)).await,
        0,
        "the worker threads ended with the server"
    );
    let seen: Vec<String> = upstream.seen().iter().map(|s| s.uri.clone()).collect();
    for i in 0..3 {
        assert!(seen.contains(&format!("/slow/{}", 500 + i)), "{seen:?}");
    }
}

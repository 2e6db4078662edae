//! Upstream back-pressure: a paced upstream's 429/503 with Retry-After holds the shared
//! schedule, so no tollgate instance sends to it before then.

mod common;
common::both_http1_clients!();

use std::time::{Duration, Instant};

use common::{get, Proxy, Redis, Upstream, Yaml};

/// Instance A gets a 503 with Retry-After: 1; a request through instance B then reaches the
/// upstream no earlier than a second later (or is refused at once when that is past max_delay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_from_the_upstream_holds_every_instance() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let yaml = |max_delay: &str| {
        Yaml::to(&[upstream.url()])
            .redis(&redis, "timeout: 500ms")
            .upstream(&format!("pace: {{rate: 50/s, max_delay: {max_delay}}}"))
            .route("api", "/", "")
            .build()
    };
    let a = Proxy::start(&yaml("3s")).await;
    let b = Proxy::start(&yaml("3s")).await;
    let c = Proxy::start(&yaml("200ms")).await;
    let busy = get(&a.url("/status/503?retry_after=1"), &[]).await;
    assert_eq!(busy.status, 503);
    let held_at = Instant::now();
    let refused = get(&c.url("/from-c"), &[]).await;
    assert_eq!(refused.status, 503, "a wait of ~1 s is past c's max_delay");
    assert!(refused.body.contains("upstream_paced"), "{}", refused.body);
    // (at once: well before the hold of 1 s would have ended, however busy the machine)
    assert!(
        held_at.elapsed() < Duration::from_millis(700),
        "refused at once"
    );
    let through_b = get(&b.url("/from-b"), &[]).await;
    assert_eq!(through_b.status, 200);
    let seen = upstream.seen();
    let first = seen
        .iter()
        .find(|s| s.uri.starts_with("/status"))
        .unwrap()
        .at;
    let from_b = seen.iter().find(|s| s.uri == "/from-b").unwrap().at;
    assert!(
        from_b - first >= Duration::from_millis(950),
        "b sent after {:?}",
        from_b - first
    );
    assert!(seen.iter().all(|s| s.uri != "/from-c"));
}

/// An upstream that answers `/busy` after 300 ms with 503 and `Retry-After: 2`, and anything
/// else at once with 200; it notes when each request arrived and when `/busy` was answered.
async fn busy_upstream() -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<(String, Instant)>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 2048];
                loop {
                    let Ok(n) = s.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_string();
                        buf.drain(..end + 4);
                        let path = head.split(' ').nth(1).unwrap_or("").to_string();
                        log.lock().unwrap().push((path.clone(), Instant::now()));
                        let answer: &[u8] = if path == "/busy" {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            log.lock()
                                .unwrap()
                                .push(("answered /busy".into(), Instant::now()));
                            b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 2\r\ncontent-length: 0\r\n\r\n"
                        } else {
                            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                        };
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (url, seen)
}

/// Requests already sleeping on their slots when the upstream asks to back off are held too:
/// none reaches it before the `Retry-After` has passed, and they go on paced after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sleeping_when_the_upstream_backs_off_are_held_too() {
    let redis = Redis::start();
    let (upstream, seen) = busy_upstream().await;
    let yaml = Yaml::to(&[upstream])
        .redis(&redis, "timeout: 500ms")
        .upstream("pace: {rate: 2/s, max_delay: 10s}")
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    let busy_url = proxy.url("/busy");
    let busy = tokio::spawn(async move { get(&busy_url, &[]).await.status });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // slots 500, 1000 … 2500 ms after /busy's: all still sleeping when its 503 comes back
    // (at 300 ms)
    let sleepers: Vec<_> = (0..5)
        .map(|i| {
            let url = proxy.url(&format!("/x{i}"));
            tokio::spawn(async move { get(&url, &[]).await.status })
        })
        .collect();
    assert_eq!(busy.await.unwrap(), 503);
    for s in sleepers {
        assert_eq!(s.await.unwrap(), 200);
    }
    let seen = seen.lock().unwrap().clone();
    let answered = seen.iter().find(|(p, _)| p == "answered /busy").unwrap().1;
    let during: Vec<_> = seen
        .iter()
        .filter(|(p, at)| p.starts_with("/x") && *at > answered)
        .map(|(p, at)| (p, at.duration_since(answered)))
        .collect();
    assert!(!during.is_empty(), "{seen:?}");
    for (path, after) in &during {
        assert!(
            *after >= Duration::from_millis(1900),
            "{path} sent {after:?} after the 503 with Retry-After: 2"
        );
    }
}

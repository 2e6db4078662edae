//! Upstream back-pressure: a paced upstream's 429/503 with Retry-After holds the shared
//! schedule, so no tollgate instance sends to it before then.

mod common;

use std::time::{Duration, Instant};

use common::{get, Proxy, Redis, Upstream};

/// Instance A gets a 503 with Retry-After: 1; a request through instance B then reaches the
/// upstream no earlier than a second later (or is refused at once when that is past max_delay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_from_the_upstream_holds_every_instance() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let yaml = |max_delay: &str| {
        format!(
            r#"listen: 127.0.0.1:0
store: {{backend: redis, url: "{}", timeout: 500ms}}
upstreams:
  api:
    targets: [{}]
    pace: {{rate: 50/s, max_delay: {max_delay}}}
routes:
  - name: api
    upstream: api
"#,
            redis.url(),
            upstream.url()
        )
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
    assert!(
        held_at.elapsed() < Duration::from_millis(300),
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

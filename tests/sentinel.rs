//! `store.sentinel` against real processes: a master, a replica and three Sentinels. tollgate
//! finds the master through the Sentinels, limits there, and follows a failover without a
//! restart, whether the master died or hangs; meanwhile `on_error` answers and no request
//! waits past the store's timeout, and nothing is written to a master that was replaced.

mod common;
common::both_http1_clients!();

use common::sentinel::{debug_sleep, Monitor, SentinelSet};
use common::{get, Proxy, Upstream, Yaml};

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The per-call bound of the test's store.
const TIMEOUT: Duration = Duration::from_millis(200);
/// What a busy 2-core machine may add to a request on top of the store's timeout.
const SLACK: Duration = Duration::from_millis(800);

/// A proxy on the Sentinels' master: a bucket of 3 an hour per `x-client`, `on_error: deny`,
/// so an answer of the policy (503) is told apart from one of Redis (200 or 429).
async fn proxy(set: &SentinelSet, upstream: &Upstream) -> Proxy {
    let nodes = set.urls().join(", ");
    let store = format!(
        "store:\n  key_prefix: tg\n  timeout: {}ms\n  on_error: deny\n  sentinel:\n    \
         master_name: {}\n    nodes: [{nodes}]",
        TIMEOUT.as_millis(),
        common::sentinel::MASTER_NAME
    );
    let yaml = Yaml::to(&[upstream.url()])
        .top(&store)
        .route(
            "api",
            "/",
            "limits: [{name: three, algorithm: token_bucket, key: \"header:x-client\", \
             rate: 1/h, burst: 3}]",
        )
        .build();
    Proxy::start(&yaml).await
}

/// One request as `client`: its status, and how long it took.
async fn request(proxy: &Proxy, client: &str) -> (u16, Duration) {
    let started = Instant::now();
    let answer = get(&proxy.url("/"), &[("x-client", client)]).await;
    (answer.status, started.elapsed())
}

/// Requests are limited on the master the Sentinels name; after the master is killed, the
/// policy answers (never past the timeout) until the Sentinels promote the replica, and then
/// the new master decides again, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_failover_and_answers_by_on_error_meanwhile() {
    let mut set = SentinelSet::start();
    let upstream = Upstream::start().await;
    let proxy = proxy(&set, &upstream).await;
    assert_eq!(set.master_port(), set.master.port);

    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(request(&proxy, "alice").await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(set.master.cli(&["exists", "tg:api:three:alice"]), "1");

    set.master.kill();
    let killed = Instant::now();
    let (mut by_policy, mut slowest) = (0, Duration::ZERO);
    let mut probe = 0;
    let switched = loop {
        probe += 1;
        let client = format!("probe-{probe}");
        let (status, took) = request(&proxy, &client).await;
        slowest = slowest.max(took);
        assert!(
            took <= TIMEOUT + SLACK,
            "a request took {took:?} during the failover"
        );
        match status {
            503 => by_policy += 1,
            200 => {
                let key = format!("tg:api:three:{client}");
                assert_eq!(
                    set.replica.cli(&["exists", &key]),
                    "1",
                    "decided by Redis, yet not on the promoted replica"
                );
                break killed.elapsed();
            }
            other => panic!("status {other} during the failover"),
        }
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "no decision from a new master 15 s after the kill ({by_policy} answered by on_error)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(by_policy > 0, "the outage was never seen");
    assert_eq!(set.master_port(), set.replica.port);
    assert!(set.replica.cli(&["role"]).starts_with("master"));
    // the new master keeps limiting
    for expected in [200, 200, 429] {
        assert_eq!(request(&proxy, &format!("probe-{probe}")).await.0, expected);
    }
    eprintln!(
        "new master deciding {switched:?} after the kill; {by_policy} requests answered by \
         on_error, the slowest in {slowest:?}"
    );
}

/// With no Sentinel that answers, requests are answered by `on_error` within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sentinel_answering_applies_on_error_within_the_timeout() {
    let upstream = Upstream::start().await;
    let dead = [common::DeadPort::new(), common::DeadPort::new()];
    let store = format!(
        "store: {{timeout: {}ms, on_error: deny, sentinel: {{master_name: nobody, nodes: \
         [\"redis://127.0.0.1:{}\", \"redis://127.0.0.1:{}\"]}}}}",
        TIMEOUT.as_millis(),
        dead[0].port(),
        dead[1].port()
    );
    let yaml = Yaml::to(&[upstream.url()])
        .top(&store)
        .route(
            "api",
            "/",
            "limits: [{name: one, algorithm: token_bucket, rate: 1/h, burst: 1}]",
        )
        .build();
    let proxy = Proxy::start(&yaml).await;
    for _ in 0..8 {
        let (status, took) = request(&proxy, "x").await;
        assert_eq!(status, 503);
        assert!(took <= TIMEOUT + SLACK, "{took:?}");
    }
    assert!(upstream.seen().is_empty());
}

/// How long the master hangs in [`leaves_a_hung_master_and_never_writes_to_it_again`]: long
/// enough for the Sentinels to promote the replica (500 ms down-after) and tollgate to follow.
const SLEEP_SECS: u32 = 7;
/// How long requests go on after the old master wakes.
const WOKEN: Duration = Duration::from_secs(2);

/// When a Sentinel first names the replica, polled from a thread of its own.
fn watch_switch(set: &Arc<SentinelSet>) -> Arc<Mutex<Option<Instant>>> {
    let switched = Arc::new(Mutex::new(None));
    let (set, seen) = (set.clone(), switched.clone());
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if set.any_names(set.replica.port) {
                *seen.lock().unwrap() = Some(Instant::now());
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    switched
}

/// A master that hangs (`DEBUG SLEEP`) is left: Redis decides again within a bound after the
/// Sentinels promote the replica, although the old master never breaks its connections; and
/// when it wakes still calling itself master, nothing started after the switch is written to
/// it (its `MONITOR` shows no such key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaves_a_hung_master_and_never_writes_to_it_again() {
    let set = Arc::new(SentinelSet::start());
    let upstream = Upstream::start().await;
    let proxy = proxy(&set, &upstream).await;
    for expected in [200, 200, 200, 429] {
        assert_eq!(request(&proxy, "alice").await.0, expected);
    }
    let monitor = Monitor::start(set.master.port);
    let _sleeping = debug_sleep(set.master.port, SLEEP_SECS);
    set.master.wait_blocked();
    let hung = Instant::now();
    let switched = watch_switch(&set);

    // until Redis decides again: requests named by whether the switch was seen before they
    // started, so that those named `after-` must never reach the old master
    let (mut n, mut slowest) = (0, Duration::ZERO);
    let mut client;
    let decided = loop {
        n += 1;
        let seen = *switched.lock().unwrap();
        client = format!("{}-{n}", if seen.is_some() { "after" } else { "during" });
        let (status, took) = request(&proxy, &client).await;
        slowest = slowest.max(took);
        assert!(
            took <= TIMEOUT + SLACK,
            "a request took {took:?} while the master hung"
        );
        match status {
            503 => {}
            200 => {
                // (the thread polling the Sentinels may not have seen the switch yet)
                let now = Instant::now();
                let seen = seen.or_else(|| set.any_names(set.replica.port).then_some(now));
                break (
                    now,
                    seen.expect("Redis decided before any Sentinel named the replica"),
                );
            }
            other => panic!("status {other} from {client} while the master hung"),
        }
        assert!(
            hung.elapsed() < Duration::from_secs(SLEEP_SECS.into()),
            "Redis did not decide again before the old master woke ({n} requests)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (decided_at, switch_at) = decided;
    let after = decided_at.duration_since(switch_at);
    assert!(
        after < Duration::from_secs(5),
        "decided {after:?} after the switch"
    );
    assert_eq!(
        set.replica
            .cli(&["exists", &format!("tg:api:three:{client}")]),
        "1",
        "{client} decided by Redis, yet not on the new master: {}",
        set.replica.cli(&["keys", "*"])
    );

    // on through the old master's waking, still calling itself master (the Sentinels demote
    // it several seconds later), all decided by the new one
    let woke = hung + Duration::from_secs(SLEEP_SECS.into());
    while Instant::now() < woke + WOKEN {
        n += 1;
        let client = format!("after-{n}");
        assert_eq!(request(&proxy, &client).await.0, 200, "{client}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = monitor.lines();
    assert!(
        seen.iter().any(|l| l.contains("\"INFO\"")),
        "MONITOR saw not even the Sentinels: {seen:?}"
    );
    let written: Vec<_> = seen.iter().filter(|l| l.contains("after-")).collect();
    assert!(
        written.is_empty(),
        "written to the old master after the switch: {written:?}"
    );
    eprintln!(
        "the Sentinels switched {:?} after the hang; Redis decided {after:?} after the switch; \
         {n} requests, the slowest {slowest:?}",
        switch_at.duration_since(hung)
    );
}

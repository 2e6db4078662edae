//! Outbound pacing end to end: the upstream sees requests at least 1/rate apart, across several
//! tollgate instances on one Redis; a burst past max_delay gets fast 503s; max_waiting bounds the
//! sleepers; a client that hangs up while waiting frees its place in the queue and its slot,
//! in the middle of the schedule too.

mod common;
common::both_http1_clients!();

use std::time::{Duration, Instant};

use common::{get, Proxy, Redis, Upstream, Yaml};

/// Upstream `api` at `upstream`, paced by `pace` in Redis, behind one route for every path.
fn config(redis: &Redis, upstream: &Upstream, pace: &str) -> String {
    Yaml::to(&[upstream.url()])
        .redis(redis, "timeout: 500ms")
        .upstream(&format!("pace:\n{}", indent(pace)))
        .route("api", "/", "")
        .build()
}

/// `pace`'s keys, given one per line, under `pace:`.
fn indent(pace: &str) -> String {
    pace.lines().map(|l| format!("  {}\n", l.trim())).collect()
}

/// `n` concurrent GETs of `path` spread over `proxies`; their statuses and how long each took.
async fn burst(proxies: &[&Proxy], path: &str, n: usize) -> Vec<(u16, Duration)> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let url = proxies[i % proxies.len()].url(path);
            tokio::spawn(async move {
                let started = Instant::now();
                let status = get(&url, &[]).await.status;
                (status, started.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Asserts that the upstream saw `n` requests, the k-th (by time) no sooner than `k` intervals
/// after `began`, the moment before the burst was sent, less 10 ms.
///
/// Counted from `began`, not from the arrival before it: a paced request only ever arrives
/// late (its sleep ran long, its task waited for a core), so a late arrival followed by one on
/// time is no fault of the schedule, while a request let through before its slot still fails.
fn assert_paced(upstream: &Upstream, began: Instant, interval: Duration, n: u32) {
    let mut at: Vec<Instant> = upstream.seen().iter().map(|s| s.at).collect();
    at.sort();
    let after: Vec<Duration> = at.iter().map(|t| *t - began).collect();
    assert_eq!(after.len(), n as usize, "{after:?}");
    for (k, took) in (0..n).zip(&after) {
        let slot = (interval * k).saturating_sub(Duration::from_millis(10));
        assert!(
            *took >= slot,
            "request {k} arrived {took:?} after the burst began, before its slot at {:?}: {after:?}",
            interval * k
        );
    }
}

/// The upstream sees paced requests 1/rate apart: none before its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_sees_requests_at_least_one_interval_apart() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(
        &redis,
        &upstream,
        "      rate: 20/s\n      max_delay: 2s",
    ))
    .await;
    let began = Instant::now();
    let got = burst(&[&proxy], "/", 10).await;
    assert!(got.iter().all(|(s, _)| *s == 200), "{got:?}");
    assert_paced(&upstream, began, Duration::from_millis(50), 10);
}

/// A burst past max_delay is refused at once with 503 and Retry-After; refusals reserve nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_past_max_delay_gets_fast_503s() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(
        &redis,
        &upstream,
        "      rate: 2/s\n      max_delay: 750ms",
    ))
    .await;
    let proxies = [&proxy];
    let (got, one) = tokio::join!(burst(&proxies, "/", 10), async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        get(&proxy.url("/"), &[]).await
    });
    let ok = got.iter().filter(|(s, _)| *s == 200).count();
    let refused: Vec<_> = got.iter().filter(|(s, _)| *s == 503).collect();
    // slots at 0 and 500 ms fit within 750 ms; 1000 ms does not
    assert_eq!(ok, 2, "{got:?}");
    assert_eq!(refused.len(), 8);
    assert!(
        refused
            .iter()
            .all(|(_, took)| *took < Duration::from_millis(500)),
        "{refused:?}"
    );
    assert_eq!(one.status, 503, "while the schedule is full");
    assert_eq!(one.header("retry-after"), Some("1"));
    assert!(one.body.contains("upstream_paced"), "{}", one.body);
    // nothing was reserved by the refusals: after the two slots drain, one goes at once
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let started = Instant::now();
    assert_eq!(get(&proxy.url("/"), &[]).await.status, 200);
    assert!(started.elapsed() < Duration::from_millis(400));
}

/// `max_waiting` bounds requests sleeping for a slot in one process: the rest get 503 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_waiting_bounds_the_sleepers() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let pace = "      rate: 2/s\n      max_delay: 10s\n      max_waiting: 2";
    let proxy = Proxy::start(&config(&redis, &upstream, pace)).await;
    assert_eq!(get(&proxy.url("/"), &[]).await.status, 200);
    let got = burst(&[&proxy], "/", 5).await;
    let full: Vec<_> = got.iter().filter(|(s, _)| *s == 503).collect();
    assert_eq!(full.len(), 3, "{got:?}");
    assert!(
        full.iter()
            .all(|(_, took)| *took < Duration::from_millis(300)),
        "{full:?}"
    );
}

/// Only a request that sleeps takes one of `max_waiting`'s places: of three at once (rate one
/// per 2 s, max_waiting 1), the first goes at once, the second sleeps, the third is refused with
/// a `Retry-After` of one interval, when the sleeper will have left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_waiting_counts_only_the_requests_that_sleep() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let pace = "      rate: 1/2s\n      max_delay: 10s\n      max_waiting: 1";
    let proxy = Proxy::start(&config(&redis, &upstream, pace)).await;
    let asks: Vec<_> = (0..3)
        .map(|i| {
            let url = proxy.url(&format!("/{i}"));
            tokio::spawn(async move { get(&url, &[]).await })
        })
        .collect();
    let mut answers = Vec::new();
    for a in asks {
        answers.push(a.await.unwrap());
    }
    let mut statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    statuses.sort();
    assert_eq!(statuses, [200, 200, 503], "{answers:?}");
    let full = answers.iter().find(|a| a.status == 503).unwrap();
    assert!(full.body.contains("upstream_queue_full"), "{}", full.body);
    assert_eq!(full.header("retry-after"), Some("2"));
}

/// The next free slot of upstream `api`'s schedule, in ms from Redis's own clock (negative when
/// the schedule is idle).
fn schedule_ahead_ms(redis: &Redis) -> f64 {
    let next: f64 = match redis.cli(&["get", "tollgate:upstream:api:pace"]).trim() {
        "" => return f64::NEG_INFINITY,
        text => text.parse().expect("a slot time in ms"),
    };
    let time = redis.cli(&["time"]);
    let mut parts = time
        .split_whitespace()
        .map(|p| p.parse::<f64>().expect("TIME"));
    let (secs, micros) = (parts.next().unwrap(), parts.next().unwrap());
    next - (secs * 1000.0 + micros / 1000.0)
}

/// Requests refused for want of a `max_waiting` place leave the shared schedule as if they
/// had never asked: after a burst of 30 (rate 10/s, max_delay 2s, max_waiting 5), the schedule
/// ends about one interval past the last request sent, a lone request then waits no longer
/// than that, and the upstream sees no gap. With one worker, two, and two instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_refused_for_want_of_a_place_take_no_slot() {
    let redis = Redis::start();
    let pace = "      rate: 10/s\n      max_delay: 2s\n      max_waiting: 5";
    for setup in ["workers: 1", "workers: 2", "two instances"] {
        redis.cli(&["flushall"]);
        let upstream = Upstream::start().await;
        let yaml = config(&redis, &upstream, pace);
        let first = match setup {
            "two instances" => Proxy::start(&yaml).await,
            workers => Proxy::start(&format!("{yaml}{workers}\n")).await,
        };
        let second = match setup {
            "two instances" => Some(Proxy::start(&yaml).await),
            _ => None,
        };
        let mut proxies = vec![&first];
        proxies.extend(second.as_ref());
        let began = Instant::now();
        let got = burst(&proxies, "/", 30).await;
        let sent = got.iter().filter(|(s, _)| *s == 200).count();
        let full = got.iter().filter(|(s, _)| *s == 503).count();
        // one at once and five sleepers per instance; a place freed mid-burst may admit more
        assert!(
            sent > 5 * proxies.len() && sent + full == 30,
            "{setup}: {got:?}"
        );
        let ahead = schedule_ahead_ms(&redis);
        assert!(ahead < 600.0, "{setup}: the schedule ends {ahead} ms ahead");
        let started = Instant::now();
        assert_eq!(get(&first.url("/lone"), &[]).await.status, 200);
        let waited = started.elapsed();
        assert!(
            waited < Duration::from_millis(600),
            "{setup}: lone request took {waited:?}"
        );
        assert_paced(
            &upstream,
            began,
            Duration::from_millis(100),
            sent as u32 + 1,
        );
        let mut at: Vec<Instant> = upstream.seen().iter().map(|s| s.at).collect();
        at.sort();
        for pair in at.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(
                gap < Duration::from_millis(700),
                "{setup}: the upstream sat idle {gap:?}, {:?} after the burst began",
                pair[1] - began
            );
        }
    }
}

/// A client that hangs up while waiting for its slot frees its place among the sleepers (its
/// task and permit are dropped) and the upstream never sees its request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hanging_up_while_waiting_frees_its_place() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let pace = "      rate: 1/s\n      max_delay: 10s\n      max_waiting: 1";
    let proxy = Proxy::start(&config(&redis, &upstream, pace)).await;
    assert_eq!(get(&proxy.url("/"), &[]).await.status, 200);
    let url = proxy.url("/gone");
    let impatient = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_millis(200), get(&url, &[])).await
    });
    assert!(
        impatient.await.unwrap().is_err(),
        "the impatient client gave up"
    );
    // (the next slot is still half a second off: the next request must sleep, in the place)
    tokio::time::sleep(Duration::from_millis(300)).await;
    let next = get(&proxy.url("/next"), &[]).await;
    assert_eq!(next.status, 200, "the place was freed: {}", next.body);
    let uris: Vec<String> = upstream.seen().iter().map(|s| s.uri.clone()).collect();
    assert_eq!(uris, ["/", "/next"]);
}

/// The slot of a client that hangs up while waiting for it is given back while it is the last
/// one handed out: the next request takes it, instead of the upstream sitting idle through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_left_by_a_client_that_hung_up_goes_to_the_next_request() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let pace = "      rate: 0.5/s\n      max_delay: 10s";
    let proxy = Proxy::start(&config(&redis, &upstream, pace)).await;
    assert_eq!(get(&proxy.url("/first"), &[]).await.status, 200);
    // the second waits for the slot two seconds later, and gives up
    let url = proxy.url("/gone");
    let impatient = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_millis(200), get(&url, &[])).await
    });
    assert!(impatient.await.unwrap().is_err(), "the client gave up");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(get(&proxy.url("/next"), &[]).await.status, 200);
    let seen = upstream.seen();
    let uris: Vec<&str> = seen.iter().map(|s| s.uri.as_str()).collect();
    assert_eq!(uris, ["/first", "/next"]);
    // the slot two seconds after the first, not the one after it (four)
    let gap = seen[1].at.duration_since(seen[0].at);
    assert!(
        gap < Duration::from_secs(3),
        "{gap:?} between the first and the next"
    );
}

/// Starts a GET of `url` whose client hangs up at `deadline` unless answered first; the task
/// tells whether it was answered.
fn leaving_at(proxy: &Proxy, path: &str, deadline: Instant) -> tokio::task::JoinHandle<bool> {
    let url = proxy.url(path);
    tokio::spawn(async move {
        tokio::time::timeout_at(deadline.into(), get(&url, &[]))
            .await
            .is_ok()
    })
}

/// Five requests queued behind `/first` at rate 5/s, sent 20 ms apart so that the k-th takes
/// the slot k·200 ms after `/first`; `leave[k]` is when its client hangs up (ms after the
/// first was answered). Returns when `/first` was answered and the five tasks.
async fn queue_of_five(
    proxy: &Proxy,
    leave: [u64; 5],
) -> (Instant, Vec<tokio::task::JoinHandle<bool>>) {
    assert_eq!(get(&proxy.url("/first"), &[]).await.status, 200);
    let began = Instant::now();
    let mut queued = Vec::new();
    for (k, ms) in leave.iter().enumerate() {
        let deadline = began + Duration::from_millis(*ms);
        queued.push(leaving_at(proxy, &format!("/r{}", k + 1), deadline));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (began, queued)
}

/// A slot in the middle of the schedule, left by a client that hung up, goes to the next
/// request of the instance: it waits for that slot, not for one after the last, and the
/// upstream still sees requests at least one interval apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_left_in_the_middle_goes_to_the_next_request() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let pace = "      rate: 5/s\n      max_delay: 5s";
    let proxy = Proxy::start(&config(&redis, &upstream, pace)).await;
    // the second and third (slots at 400 and 600 ms) hang up at 300 ms; the rest stay
    let never = 10_000;
    let (began, queued) = queue_of_five(&proxy, [never, 300, 300, never, never]).await;
    tokio::time::sleep_until((began + Duration::from_millis(350)).into()).await;
    let asked = Instant::now();
    assert_eq!(get(&proxy.url("/next"), &[]).await.status, 200);
    let waited = asked.elapsed();
    // the hole at 400 ms, not the slot after the last (1200 ms)
    assert!(
        waited < Duration::from_millis(500),
        "/next waited {waited:?}"
    );
    let answered: Vec<bool> = futures_answered(queued).await;
    assert_eq!(answered, [true, false, false, true, true]);
    // Each request at its slot or later, counted from /first's arrival: none went between
    // two others. (Counted from one base, not pair by pair: a request whose sleep ran long is
    // no fault of the schedule, while one let through early still fails.)
    let mut at: Vec<Instant> = upstream.seen().iter().map(|s| s.at).collect();
    at.sort();
    assert_eq!(at.len(), 5, "/first, /r1, /next, /r4, /r5");
    let after: Vec<Duration> = at.iter().map(|t| *t - at[0]).collect();
    for (slot_ms, took) in [0, 200, 400, 800, 1000].into_iter().zip(&after) {
        assert!(
            *took + Duration::from_millis(30) >= Duration::from_millis(slot_ms),
            "a request before its slot at {slot_ms} ms: {after:?}"
        );
    }
}

/// Clients that hang up together, in any order, leave the schedule as they found it: slots
/// left in the middle go back once the ones after them have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_all_hang_up_leave_the_schedule_as_they_found_it() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let pace = "      rate: 5/s\n      max_delay: 5s";
    let proxy = Proxy::start(&config(&redis, &upstream, pace)).await;
    // slots at 200 … 1000 ms: the middle two leave first, then the last two
    let never = 10_000;
    let (began, queued) = queue_of_five(&proxy, [never, 300, 300, 350, 350]).await;
    let answered: Vec<bool> = futures_answered(queued).await;
    assert_eq!(answered, [true, false, false, false, false]);
    // Every slot from 400 ms on goes back: the schedule's next slot is then 400 ms, already
    // past. Without that it stays at 1200 ms, at least 500 ms ahead until 700 ms: that is how
    // long the give-backs may take on a busy machine.
    let mut ahead = schedule_ahead_ms(&redis);
    while ahead >= 150.0 && began.elapsed() < Duration::from_millis(700) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        ahead = schedule_ahead_ms(&redis);
    }
    assert!(ahead < 150.0, "the schedule ends {ahead} ms ahead");
    let asked = Instant::now();
    assert_eq!(get(&proxy.url("/lone"), &[]).await.status, 200);
    let waited = asked.elapsed();
    assert!(
        waited < Duration::from_millis(300),
        "/lone waited {waited:?}"
    );
}

async fn futures_answered(tasks: Vec<tokio::task::JoinHandle<bool>>) -> Vec<bool> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Three tollgate instances on one Redis follow one pacing schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_follow_one_schedule() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let yaml = config(&redis, &upstream, "      rate: 20/s\n      max_delay: 5s");
    let (a, b, c) = (
        Proxy::start(&yaml).await,
        Proxy::start(&yaml).await,
        Proxy::start(&yaml).await,
    );
    let began = Instant::now();
    let got = burst(&[&a, &b, &c], "/", 12).await;
    assert!(got.iter().all(|(s, _)| *s == 200), "{got:?}");
    assert_paced(&upstream, began, Duration::from_millis(50), 12);
}

/// A request that its limits admitted but that is not sent after all — its client went away
/// while it waited for the upstream's slot, or the schedule refused it (503) — costs its limits
/// nothing: the token it took is there for the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_not_sent_for_its_pacing_gives_back_its_limits() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    for max_delay in ["10s", "0s"] {
        let yaml = Yaml::to(&[upstream.url()])
            .redis(&redis, "timeout: 500ms")
            .upstream(&format!("pace: {{rate: 1/s, max_delay: {max_delay}}}"))
            .route(
                "api",
                "/",
                "limits: [{name: two, algorithm: token_bucket, rate: 1/h, burst: 2}]",
            )
            .build();
        let proxy = Proxy::start(&yaml).await;
        assert_eq!(get(&proxy.url("/first"), &[]).await.status, 200);
        let url = proxy.url("/gone");
        let not_sent = tokio::spawn(async move {
            tokio::time::timeout(Duration::from_millis(200), get(&url, &[])).await
        })
        .await
        .unwrap();
        match max_delay {
            // it waited for the slot a second later, and its client gave up
            "10s" => assert!(not_sent.is_err(), "the client gave up"),
            // its slot was past max_delay
            _ => assert_eq!(not_sent.unwrap().status, 503),
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let next = get(&proxy.url("/next"), &[]).await;
        assert_eq!(
            next.status, 200,
            "{max_delay}: the second token is there: {next:?}"
        );
        drop(proxy);
        redis.cli(&["flushall"]);
    }
}

/// The YAML builder every test file uses puts each part where it belongs.
#[test]
fn the_yaml_builder_indents_parts_to_their_place() {
    let yaml = Yaml::to(&["http://127.0.0.1:1"])
        .top("workers: 1")
        .upstream("pace: {rate: 10/s}")
        .route(
            "api",
            "/v1",
            "limits:\n  - {name: l, algorithm: token_bucket, rate: 1/s, burst: 1}",
        )
        .build();
    assert_eq!(
        yaml,
        "listen: 127.0.0.1:0\nworkers: 1\nupstreams:\n  api:\n    targets: [http://127.0.0.1:1]\n    \
         pace: {rate: 10/s}\nroutes:\n  - name: api\n    match: {path_prefix: /v1}\n    \
         upstream: api\n    limits:\n      - {name: l, algorithm: token_bucket, rate: 1/s, burst: 1}\n"
    );
    tollgate::config::parse(&yaml, "test.yaml", &|_| None).expect("a valid file");
}

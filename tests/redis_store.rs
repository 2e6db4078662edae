//! The Redis store against a real `redis-server`: concurrency on one key, several instances on
//! one Redis, expiry of every key, NOSCRIPT recovery, Redis killed and restarted, Redis Cluster.

mod common;

use std::num::{NonZeroU32, NonZeroU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::limit::{Algorithm, Bucket, Decision, Pace, Rate, Slots, Window};
use tollgate::store::{RedisStore, RedisTarget, Store, StoreError};

fn bucket(rate: f64, burst: u32) -> Algorithm {
    let one = NonZeroU32::new(1).unwrap();
    Algorithm::TokenBucket(
        Bucket::new(
            Rate::per_second(rate).unwrap(),
            NonZeroU32::new(burst).unwrap(),
            one,
        )
        .unwrap(),
    )
}

fn win(limit: u64, ms: u64) -> Window {
    Window::new(NonZeroU64::new(limit).unwrap(), Duration::from_millis(ms))
}

fn all_five() -> [Algorithm; 5] {
    [
        bucket(5.0, 10),
        Algorithm::LeakyBucket(
            Pace::new(Rate::per_second(5.0).unwrap(), Some(Duration::from_secs(1))).unwrap(),
        ),
        Algorithm::FixedWindow(win(10, 60_000)),
        Algorithm::SlidingWindow(win(10, 60_000)),
        Algorithm::SlidingWindowCounter(win(10, 60_000)),
    ]
}

/// A store on one Redis, over the connection of this pass: the own one, or redis-rs's in the
/// second pass.
fn store(url: String, timeout: Duration) -> Arc<RedisStore> {
    let connection = common::redis_connection();
    Arc::new(RedisStore::connect_over(&RedisTarget::Single(url), timeout, 1, connection).unwrap())
}

/// Calls `check` from `tasks` concurrent tasks, `per_task` times each; counts admissions.
async fn hammer(
    stores: &[Arc<RedisStore>],
    key: &str,
    alg: Algorithm,
    tasks: usize,
    per_task: usize,
) -> usize {
    let mut handles = Vec::new();
    for i in 0..tasks {
        let store = stores[i % stores.len()].clone();
        let key = key.to_string();
        handles.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..per_task {
                admitted += usize::from(store.check(&key, &alg, None).await.unwrap().allowed);
            }
            admitted
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    total
}

/// 200 concurrent tasks on one connection and one key never pass its limit, for every
/// counting algorithm (the scripts are atomic; the connection pipelines).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_tasks_never_exceed_the_limit() {
    let redis = common::Redis::start();
    let s = store(redis.url(), Duration::from_secs(5));
    let cases = [
        ("tb", bucket(0.001, 50), 50),
        ("fw", Algorithm::FixedWindow(win(50, 3_600_000)), 50),
        ("sw", Algorithm::SlidingWindow(win(50, 3_600_000)), 50),
        (
            "swc",
            Algorithm::SlidingWindowCounter(win(50, 3_600_000)),
            50,
        ),
    ];
    for (key, alg, limit) in cases {
        let admitted = hammer(std::slice::from_ref(&s), key, alg, 200, 3).await;
        // a fixed window may straddle an hour boundary during the run: then up to 2x
        let bound = if key == "fw" { 2 * limit } else { limit };
        assert!(
            (limit..=bound).contains(&admitted),
            "{key}: {admitted} admitted, limit {limit}"
        );
    }
}

/// Three instances (stores) on one Redis enforce one token bucket together: over a span T at
/// most burst + rate*T requests pass, and no fewer when demand exceeds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_one_token_bucket() {
    let redis = common::Redis::start();
    let stores: Vec<_> = (0..3)
        .map(|_| store(redis.url(), Duration::from_secs(5)))
        .collect();
    let alg = bucket(20.0, 10);
    let started = Instant::now();
    let mut handles = Vec::new();
    for s in &stores {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let mut admitted = 0u32;
            while started.elapsed() < Duration::from_millis(1500) {
                admitted += u32::from(s.check("shared", &alg, None).await.unwrap().allowed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            admitted
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    let span = started.elapsed().as_secs_f64();
    let most = 10.0 + 20.0 * span;
    // "no fewer": demand (~1500 requests) far exceeds supply; allow for the time before the
    // first and after the last call on a noisy machine
    let least = 10.0 + 20.0 * (span - 0.3);
    assert!(
        f64::from(total) <= most + 1.0,
        "{total} admitted in {span:.2}s, at most {most:.0}"
    );
    assert!(
        f64::from(total) >= least,
        "{total} admitted in {span:.2}s, at least {least:.0}"
    );
}

/// Pacing slots handed to three instances, passing their own (skewed, out-of-order) clocks, are
/// still at least 1/rate apart; a refused request reserves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pacing_slots_are_spaced_across_instances() {
    let redis = common::Redis::start();
    let stores: Vec<_> = (0..3)
        .map(|_| store(redis.url(), Duration::from_secs(5)))
        .collect();
    let alg = Algorithm::LeakyBucket(
        Pace::new(
            Rate::per_second(50.0).unwrap(),
            Some(Duration::from_millis(400)),
        )
        .unwrap(),
    );
    let t0 = 1_700_000_000_000.0;
    let mut handles = Vec::new();
    for (i, s) in stores.iter().enumerate() {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let mut slots = Vec::new();
            let mut refused = 0;
            for j in 0..40 {
                // each instance's clock is skewed by up to 3 ms
                let now = t0 + f64::from(j) * 2.0 + i as f64 * 1.5;
                let d = s.check("pace", &alg, Some(now)).await.unwrap();
                if d.allowed {
                    slots.push(now + d.delay_us as f64 / 1000.0);
                } else {
                    refused += 1;
                }
            }
            (slots, refused)
        }));
    }
    let mut slots = Vec::new();
    let mut refused = 0;
    for h in handles {
        let (s, r) = h.await.unwrap();
        slots.extend(s);
        refused += r;
    }
    slots.sort_by(f64::total_cmp);
    for pair in slots.windows(2) {
        assert!(
            pair[1] - pair[0] >= 20.0 - 0.002,
            "slots {pair:?} closer than 20 ms"
        );
    }
    assert!(
        refused > 0,
        "120 requests in ~80 ms at 50/s with 400 ms max_delay must refuse some"
    );
    // the schedule holds only admitted slots: its end is last slot + one interval
    let stored: f64 = redis.cli(&["get", "pace"]).parse().unwrap();
    assert!(
        (stored - (slots.last().unwrap() + 20.0)).abs() < 0.01,
        "refusals reserved nothing"
    );
}

/// Every key any script writes gets an expiry.
#[tokio::test]
async fn every_key_expires() {
    let redis = common::Redis::start();
    let s = store(redis.url(), Duration::from_secs(5));
    for (i, alg) in all_five().iter().enumerate() {
        for _ in 0..12 {
            s.check(&format!("exp:{i}"), alg, None).await.unwrap();
        }
    }
    let keys = redis.cli(&["--scan", "--pattern", "exp:*"]);
    assert_eq!(keys.lines().count(), 5, "{keys}");
    for key in keys.lines() {
        // -1: no expiry (the bug this looks for); -2: already gone, which proves it had one
        let ttl: i64 = redis.cli(&["pttl", key]).parse().unwrap();
        assert!(ttl > 0 || ttl == -2, "{key} has no expiry ({ttl})");
    }
}

/// A key left by another algorithm under the same name (a reload changed a limit's algorithm
/// and kept its name) holds another Redis type: each script starts it afresh, as the memory
/// store does, instead of failing with `WRONGTYPE` until the key expires. The same holds for
/// the pacing schedule, and for a key of a type no script writes (a list).
#[tokio::test]
async fn a_key_left_by_another_algorithm_starts_afresh() {
    let redis = common::Redis::start();
    let s = store(redis.url(), Duration::from_secs(5));
    let memory = tollgate::store::MemoryStore::new(std::num::NonZeroUsize::new(100).unwrap());
    let algs = all_five();
    let mut types = Vec::new();
    for (i, alg) in algs.iter().enumerate() {
        // a pacing key lives a few hundred milliseconds: on a busy machine it may be gone
        // before redis-cli asks, so ask again until the type is seen
        let key = format!("type:{i}");
        let mut seen = String::from("none");
        for _ in 0..20 {
            s.check(&key, alg, None).await.unwrap();
            seen = redis.cli(&["type", &key]);
            if seen != "none" {
                break;
            }
        }
        assert_ne!(seen, "none", "{alg:?} left no key");
        types.push(seen);
    }
    for (i, before) in algs.iter().enumerate() {
        for (j, after) in algs.iter().enumerate() {
            let key = format!("swap:{i}:{j}");
            for _ in 0..3 {
                s.check(&key, before, None).await.unwrap();
            }
            let got = s.check(&key, after, None).await;
            let fresh = memory.check(&key, after, None).await.unwrap();
            let got = got.unwrap_or_else(|e| panic!("{before:?} then {after:?}: {e}"));
            assert!(got.allowed, "{before:?} then {after:?}: {got:?}");
            if types[i] == types[j] {
                continue; // the same type: the state carries over (a type change is what is tested)
            }
            assert_eq!(got.remaining, fresh.remaining, "{before:?} then {after:?}");
        }
        redis.cli(&["rpush", &format!("list:{i}"), "x"]);
        let got = s.check(&format!("list:{i}"), before, None).await;
        assert!(got.is_ok_and(|d| d.allowed), "{before:?} on a list");
    }
    redis.cli(&["rpush", "pace:list", "x"]);
    let pace = Pace::new(Rate::per_second(5.0).unwrap(), None).unwrap();
    s.defer("pace:list", &pace, 100, None).await.unwrap();
    assert_eq!(redis.cli(&["type", "pace:list"]), "string");
}

/// A concurrency key expires with its lease and vanishes with its last slot. A key another
/// algorithm left under its name is left alone by renewals and releases, and starts afresh at
/// the next acquire.
#[tokio::test]
async fn concurrency_keys_expire_and_replace_other_types() {
    let redis = common::Redis::start();
    let s = store(redis.url(), Duration::from_secs(5));
    let slots = Slots::new(
        std::num::NonZeroU32::new(2).unwrap(),
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(
        s.acquire("exp:slots", &slots, "a", None)
            .await
            .unwrap()
            .allowed
    );
    let ttl: i64 = redis.cli(&["pttl", "exp:slots"]).parse().unwrap();
    assert!(ttl > 4000 && ttl <= 5000, "the lease's expiry: {ttl}");
    let one = ["a".to_owned()];
    assert_eq!(s.release("exp:slots", &slots, &one, None).await.unwrap(), 1);
    assert_eq!(redis.cli(&["exists", "exp:slots"]), "0");
    s.check("swap:slots", &bucket(5.0, 10), None).await.unwrap();
    // renewals and releases of requests from before a reload leave the new limit's key alone
    assert_eq!(s.renew("swap:slots", &slots, &one, None).await.unwrap(), 0);
    assert_eq!(
        s.release("swap:slots", &slots, &one, None).await.unwrap(),
        0
    );
    assert_eq!(redis.cli(&["type", "swap:slots"]), "string");
    let got = s.acquire("swap:slots", &slots, "a", None).await.unwrap();
    assert!(got.allowed && got.remaining == 1, "{got:?}");
    assert_eq!(redis.cli(&["type", "swap:slots"]), "zset");
}

/// After `SCRIPT FLUSH` the next call reloads the script and succeeds.
#[tokio::test]
async fn script_flush_is_recovered_transparently() {
    let redis = common::Redis::start();
    let s = store(redis.url(), Duration::from_secs(5));
    for alg in all_five() {
        s.check("flush", &alg, None).await.unwrap();
        assert_eq!(redis.cli(&["script", "flush"]), "OK");
        s.check("flush2", &alg, None)
            .await
            .expect("reloaded after NOSCRIPT");
        redis.cli(&["del", "flush", "flush2"]);
    }
}

/// With Redis killed, calls fail with a StoreError within the timeout; once Redis is back the
/// same store object answers again, with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_fails_fast_then_recovers() {
    let mut redis = common::Redis::start();
    let timeout = Duration::from_millis(100);
    let s = store(redis.url(), timeout);
    let alg = bucket(100.0, 100);
    s.check("k", &alg, None).await.unwrap();
    redis.kill();
    for _ in 0..5 {
        let started = Instant::now();
        let err = s.check("k", &alg, None).await.expect_err("redis is down");
        assert!(
            matches!(err, StoreError::Timeout(_) | StoreError::Redis(_)),
            "{err}"
        );
        assert!(
            started.elapsed() < timeout + Duration::from_millis(150),
            "took {:?}",
            started.elapsed()
        );
    }
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match s.check("k", &alg, None).await {
            Ok(d) => {
                assert!(d.allowed);
                break;
            }
            Err(e) => assert!(
                Instant::now() < deadline,
                "not recovered after restart: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Hundreds of calls in flight on the one connection, each on its own key with its own limit:
/// every caller gets the reply to its own script (replies are matched to calls in order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_replies_reach_their_own_callers() {
    let redis = common::Redis::start();
    let s = store(redis.url(), Duration::from_secs(5));
    let mut handles = Vec::new();
    for i in 0..400u64 {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let alg = Algorithm::FixedWindow(win(1_000 + i, 60_000));
            let d = s.check(&format!("own:{i}"), &alg, None).await.unwrap();
            (i, d.allowed, d.remaining)
        }));
    }
    for h in handles {
        let (i, allowed, remaining) = h.await.unwrap();
        assert!(allowed, "key {i}");
        assert_eq!(remaining, 1_000 + i - 1, "key {i} got another call's reply");
    }
}

/// How many times Redis has run `EVALSHA` since its statistics were last reset.
fn evalsha_calls(redis: &common::Redis) -> u64 {
    let stats = redis.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// Checks `key` from `n` tasks at once; what `seen` picks of each decision, sorted.
async fn decided_at_once<T: Ord + Send + 'static>(
    s: &Arc<RedisStore>,
    key: &str,
    alg: Algorithm,
    n: usize,
    seen: fn(&Decision) -> T,
) -> Vec<T> {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (s, key) = (s.clone(), key.to_string());
            tokio::spawn(async move {
                let d = s.check(&key, &alg, None).await.unwrap();
                if !d.allowed {
                    assert!(d.retry_after_ms > 0, "a refusal says when to come back");
                }
                seen(&d)
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.push(h.await.unwrap());
    }
    all.sort_unstable();
    all
}

/// Checks `key` from `n` tasks at once: (allowed, remaining) of each, sorted.
async fn at_once(s: &Arc<RedisStore>, key: &str, alg: Algorithm, n: usize) -> Vec<(bool, u64)> {
    decided_at_once(s, key, alg, n, |d| (d.allowed, d.remaining)).await
}

/// Pacing checks of `key` from `n` tasks at once: (admitted, delay in µs) of each, sorted.
async fn paced_at_once(
    s: &Arc<RedisStore>,
    key: &str,
    pace: Algorithm,
    n: usize,
) -> Vec<(bool, u64)> {
    decided_at_once(s, key, pace, n, |d| (d.allowed, d.delay_us)).await
}

/// Token-bucket checks of one bucket that are in flight together run as one script in Redis,
/// and each caller still gets the answer it would have got alone: the remaining tokens count
/// down one per check, checks past the burst are refused one by one, other buckets in the same
/// write (other keys, another cost) are not mixed in, and a `NOSCRIPT` still loads the script.
#[tokio::test]
async fn checks_of_one_bucket_in_flight_together_run_as_one_script() {
    let redis = common::Redis::start();
    let s = store(redis.url(), Duration::from_secs(5));
    // connected, and the script loaded (a joined call refused with NOSCRIPT goes alone)
    s.check("warm", &bucket(1.0, 1), None).await.unwrap();
    redis.cli(&["CONFIG", "RESETSTAT"]);

    // 50 checks of a bucket of 60 (refilled once in 1000 s): all admitted, as one script run
    let hot = bucket(0.001, 60);
    let seen = at_once(&s, "hot", hot, 50).await;
    let want: Vec<_> = (10..60).map(|r| (true, r)).collect();
    assert_eq!(seen, want);
    let runs = evalsha_calls(&redis);
    assert!(runs <= 3, "50 checks at once took {runs} script runs");

    // 20 more: the joined call is refused, and the checks decided alone admit the last 10
    let seen = at_once(&s, "hot", hot, 20).await;
    let mut want: Vec<_> = (0..10).map(|r| (true, r)).collect();
    want.splice(0..0, (0..10).map(|_| (false, 0)));
    assert_eq!(seen, want);

    // 30 more at an empty bucket: the joined refusal proves each alone refused, one script run
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let seen = at_once(&s, "hot", hot, 30).await;
    assert_eq!(seen, vec![(false, 0); 30]);
    let runs = evalsha_calls(&redis);
    assert!(runs <= 3, "30 refusals took {runs} script runs");

    // two keys and two costs in one write: each bucket counted on its own
    let three = Algorithm::TokenBucket(
        Bucket::new(
            Rate::per_second(0.001).unwrap(),
            NonZeroU32::new(30).unwrap(),
            NonZeroU32::new(3).unwrap(),
        )
        .unwrap(),
    );
    let (a, b, c) = tokio::join!(
        at_once(&s, "one", bucket(0.001, 30), 10),
        at_once(&s, "two", bucket(0.001, 30), 10),
        at_once(&s, "three", three, 10),
    );
    let want: Vec<_> = (20..30).map(|r| (true, r)).collect();
    assert_eq!(a, want, "key one");
    assert_eq!(b, want, "key two");
    let want: Vec<_> = (0..10).map(|k| (true, 3 * k)).collect();
    assert_eq!(c, want, "key three, cost 3");

    // a joined call that meets NOSCRIPT: each check goes again alone, with the script's body
    redis.cli(&["SCRIPT", "FLUSH"]);
    let seen = at_once(&s, "flushed", bucket(0.001, 10), 10).await;
    assert_eq!(seen, (0..10).map(|r| (true, r)).collect::<Vec<_>>());
}

/// A busy bucket far from empty leases tokens (`src/store/lease.rs`): a joined call takes some
/// ahead, and the next checks of the bucket are answered from them. Redis counted every token
/// before it was handed out (another instance sees the bucket without them while the lease is
/// held), every check got a count of its own, as if run in its turn, and what the lease did not
/// hand out is back in the bucket after its life: then the bucket holds exactly what was
/// admitted. A bucket under 1 000 tokens never leases: Redis holds exactly that at every moment.
#[tokio::test]
async fn busy_buckets_lease_tokens_and_give_back_what_they_do_not_hand_out() {
    let redis = common::Redis::start();
    let s = store(redis.url(), Duration::from_secs(5));
    let other = store(redis.url(), Duration::from_secs(5));
    s.check("warm", &bucket(1.0, 1), None).await.unwrap();
    other.check("warm2", &bucket(1.0, 1), None).await.unwrap();

    // (refilled once in 1000 s: the counts below do not move while the test runs)
    let big = bucket(0.001, 100_000);
    let mut seen = Vec::new();
    let mut probes = 0;
    let (mut held, mut answered) = (false, 0);
    for _ in 0..40 {
        let round = decided_at_once(&s, "big", big, 200, |d| (d.allowed, d.remaining, d.leased));
        for (allowed, remaining, leased) in round.await {
            seen.push((allowed, remaining));
            answered += usize::from(leased);
        }
        // what another instance finds in Redis at once (one check of its own, not joined)
        let probe = other.check("big", &big, None).await.unwrap();
        assert!(!probe.leased, "a check alone is a call: {probe:?}");
        probes += 1;
        let exact = 100_000 - seen.len() as u64 - probes;
        assert!(
            probe.allowed && probe.remaining <= exact,
            "{probe:?}, {exact}"
        );
        held |= probe.remaining < exact;
        if held && answered > 0 {
            break;
        }
    }
    assert!(held, "no lease held after {} checks", seen.len());
    // checks answered from a lease say so (the metrics count them apart from store calls)
    assert!(
        answered > 0,
        "no check answered from a lease of {}",
        seen.len()
    );
    assert!(seen.iter().all(|&(allowed, _)| allowed));
    let mut counts: Vec<u64> = seen.iter().map(|&(_, r)| r).collect();
    counts.sort_unstable();
    counts.dedup();
    assert_eq!(
        counts.len(),
        seen.len(),
        "two checks were told the same count"
    );

    // the lease's life is 20 ms: what it did not hand out is given back
    tokio::time::sleep(Duration::from_millis(300)).await;
    let last = other.check("big", &big, None).await.unwrap();
    probes += 1;
    assert_eq!(last.remaining, 100_000 - seen.len() as u64 - probes);
    assert!(*counts.first().unwrap() > last.remaining);

    // a bucket of 999: never a token held beyond what was admitted
    let small = bucket(0.001, 999);
    let mut admitted = 0;
    for round in 0..4 {
        admitted += at_once(&s, "small", small, 200).await.len() as u64;
        let probe = other.check("small", &small, None).await.unwrap();
        assert_eq!(probe.remaining, 999 - admitted - round - 1, "round {round}");
    }

    // with leases off (`store.leases: false`) a big bucket is exact at every moment too
    let target = RedisTarget::Single(redis.url());
    let exact = RedisStore::connect(&target, Duration::from_secs(5), 1).unwrap();
    let exact = Arc::new(exact.with_leases(false));
    let mut admitted = 0;
    for round in 0..6 {
        let decided = decided_at_once(&exact, "off", big, 200, |d| d.leased).await;
        assert!(decided.iter().all(|&leased| !leased), "round {round}");
        admitted += decided.len() as u64;
        let probe = other.check("off", &big, None).await.unwrap();
        assert_eq!(
            probe.remaining,
            100_000 - admitted - round - 1,
            "round {round}"
        );
    }
}

/// Token-bucket checks of different keys (with the same limit) in flight together run as one
/// script call with all their keys, and each caller gets its own bucket's answer; a key the
/// script fails on (here one holding a hash) fails only its own check, and after `NOSCRIPT`
/// the checks still load the script.
#[tokio::test]
async fn checks_of_different_keys_in_flight_together_run_as_one_script() {
    let redis = common::Redis::start();
    let s = store(redis.url(), Duration::from_secs(5));
    s.check("warm", &bucket(1.0, 1), None).await.unwrap();
    redis.cli(&["CONFIG", "RESETSTAT"]);

    let alg = bucket(0.001, 5);
    let many = |keys: Vec<String>| {
        let handles: Vec<_> = keys
            .into_iter()
            .map(|key| {
                let s = s.clone();
                tokio::spawn(async move {
                    let d = s.check(&key, &alg, None).await;
                    (
                        key,
                        d.map(|d| (d.allowed, d.remaining))
                            .map_err(|e| e.to_string()),
                    )
                })
            })
            .collect();
        async move {
            let mut all = Vec::new();
            for h in handles {
                all.push(h.await.unwrap());
            }
            all
        }
    };
    // 40 clients' first requests: each bucket full, each check takes one token of its own
    let keys: Vec<String> = (0..40).map(|i| format!("client-{i}")).collect();
    for (key, seen) in many(keys.clone()).await {
        assert_eq!(seen, Ok((true, 4)), "{key}");
    }
    let runs = evalsha_calls(&redis);
    assert!(
        runs <= 4,
        "40 checks of 40 keys at once took {runs} script runs"
    );
    // again: each bucket counted on its own, down to 3
    for (key, seen) in many(keys).await {
        assert_eq!(seen, Ok((true, 3)), "{key}");
    }

    // a key holding a hash (left by another algorithm): started afresh within the call, the
    // others in it decided as usual
    redis.cli(&["HSET", "bad", "f", "v"]);
    let keys: Vec<String> = ["x1", "x2", "bad", "x3"].map(String::from).to_vec();
    for (key, seen) in many(keys).await {
        assert_eq!(seen, Ok((true, 4)), "{key}");
    }
    assert_eq!(redis.cli(&["type", "bad"]), "string");

    // NOSCRIPT: the call goes again alone per key, each loading the script
    redis.cli(&["SCRIPT", "FLUSH"]);
    let keys: Vec<String> = (0..10).map(|i| format!("flushed-{i}")).collect();
    for (key, seen) in many(keys).await {
        assert_eq!(seen, Ok((true, 4)), "{key}");
    }
}

/// Leaky-bucket (pacing) checks of one schedule in flight together run as one script, and each
/// gets the slot it would have got in its turn: exactly one interval apart; at the edge of
/// `max_delay` they are decided alone, and past it all are refused by one script run.
#[tokio::test]
async fn pacing_checks_in_flight_together_take_consecutive_slots() {
    let redis = common::Redis::start();
    let s = store(redis.url(), Duration::from_secs(5));
    let pace = |max_ms: Option<u64>| {
        Algorithm::LeakyBucket(
            Pace::new(
                Rate::per_second(10.0).unwrap(),
                max_ms.map(Duration::from_millis),
            )
            .unwrap(),
        )
    };
    s.check("warm", &pace(None), None).await.unwrap();
    redis.cli(&["CONFIG", "RESETSTAT"]);

    // an idle schedule, no bound: slots 0, 100, …, 900 ms, one script run
    let seen = paced_at_once(&s, "idle", pace(None), 10).await;
    let want: Vec<_> = (0..10).map(|k| (true, k * 100_000)).collect();
    assert_eq!(seen, want);
    assert!(
        evalsha_calls(&redis) <= 3,
        "{} script runs",
        evalsha_calls(&redis)
    );

    // max_delay 2 s: 15 fit (0 … 1.4 s); then 10 more reach the bound: decided alone, those
    // that fit are admitted one interval apart, the rest refused
    let bounded = pace(Some(2000));
    let seen = paced_at_once(&s, "bounded", bounded, 15).await;
    assert!(seen.iter().all(|d| d.0), "{seen:?}");
    let delays: Vec<u64> = seen.iter().map(|d| d.1).collect();
    assert_eq!(delays, (0..15).map(|k| k * 100_000).collect::<Vec<_>>());
    let seen = paced_at_once(&s, "bounded", bounded, 10).await;
    let admitted: Vec<u64> = seen.iter().filter(|d| d.0).map(|d| d.1).collect();
    let first = *admitted.first().expect("the next slot is within the bound");
    // however long the machine took between the two rounds, the slots that fit in 2 s
    let fit = (2_000_000 - first) / 100_000 + 1;
    assert_eq!(admitted.len() as u64, fit.min(10), "{seen:?}");
    assert!(admitted.iter().all(|&d| d <= 2_000_000), "{seen:?}");
    // decided alone, in one write: each slot one interval after the one before, less the
    // moments between their script runs
    for pair in admitted.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            (90_000..=100_000).contains(&gap),
            "slots one interval apart: {seen:?}"
        );
    }

    // 2 a second, max_delay 2 s: 5 fit an idle schedule (0, 0.5, … 2 s), so the next ones wait
    // 2.5 s, past the bound by half a second: 4 more are all refused by one script run
    let slow = Algorithm::LeakyBucket(
        Pace::new(Rate::per_second(2.0).unwrap(), Some(Duration::from_secs(2))).unwrap(),
    );
    let seen = paced_at_once(&s, "slow", slow, 5).await;
    let want: Vec<_> = (0..5).map(|k| (true, k * 500_000)).collect();
    assert_eq!(seen, want);
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let seen = paced_at_once(&s, "slow", slow, 4).await;
    assert!(seen.iter().all(|d| !d.0), "{seen:?}");
    let runs = evalsha_calls(&redis);
    assert!(runs <= 2, "4 refusals took {runs} script runs");
}

/// `AUTH` (password alone, or ACL user and password) and the database come from the URL, on
/// every new connection; a wrong password is an error that says so, not a hang.
#[tokio::test]
async fn password_user_and_database_come_from_the_url() {
    let mut redis = common::Redis::start_with(&["--requirepass", "s3cret"]);
    let port = redis.port;
    let dbsize = |redis: &common::Redis, db: &str| {
        redis.cli(&["-a", "s3cret", "--no-auth-warning", "-n", db, "dbsize"])
    };
    // slow to refill, so that no key expires before it is counted
    let alg = bucket(0.001, 10);
    for (i, url) in [
        format!("redis://:s3cret@127.0.0.1:{port}/3"),
        format!("redis://default:s3cret@127.0.0.1:{port}/3"),
    ]
    .into_iter()
    .enumerate()
    {
        let s = store(url.clone(), Duration::from_secs(2));
        s.check(&format!("auth:{i}"), &alg, None).await.expect(&url);
    }
    assert_eq!(dbsize(&redis, "3"), "2", "both keys in database 3");
    assert_eq!(dbsize(&redis, "0"), "0");

    // after a restart the new connection authenticates and selects again
    let s = store(
        format!("redis://:s3cret@127.0.0.1:{port}/3"),
        Duration::from_secs(2),
    );
    s.check("before", &alg, None).await.unwrap();
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = s.check("after", &alg, None).await {
        assert!(Instant::now() < deadline, "not recovered: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        dbsize(&redis, "3"),
        "1",
        "the key after the restart is in database 3"
    );

    let wrong = store(
        format!("redis://:nope@127.0.0.1:{port}/0"),
        Duration::from_secs(2),
    );
    let started = Instant::now();
    let err = wrong
        .check("k", &alg, None)
        .await
        .expect_err("wrong password");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let text = err.to_string();
    // Redis's own words on the own connection; redis-rs says it in its own
    assert!(
        text.contains("WRONGPASS")
            || text.contains("invalid")
            || text.contains("authentication failed"),
        "the error names the refusal: {text}"
    );
}

/// Calls whose callers gave up while the connection was being made (Redis paused mid-`AUTH`)
/// are not run once Redis answers: their requests were already answered by the failure policy,
/// and running them would take tokens a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_given_up_while_connecting_are_not_run_later() {
    let redis = common::Redis::start_with(&["--requirepass", "pw"]);
    let url = format!("redis://:pw@127.0.0.1:{}/0", redis.port);
    let alg = bucket(1.0, 100);
    // the script is loaded (by another connection), so the calls would run, not get NOSCRIPT
    let other = store(url.clone(), Duration::from_secs(2));
    other.check("warm-up", &alg, None).await.unwrap();
    let s = store(url, Duration::from_millis(100));
    redis.signal("-STOP");
    let mut calls = Vec::new();
    for _ in 0..20 {
        let s = s.clone();
        calls.push(tokio::spawn(
            async move { s.check("gave-up", &alg, None).await },
        ));
    }
    for call in calls {
        let err = call.await.unwrap().expect_err("Redis is paused");
        assert!(matches!(err, StoreError::Timeout(_)), "{err}");
    }
    redis.signal("-CONT");
    // A call on another key that succeeds comes after anything the connection sent before it
    // (replies are in order), so by then any given-up call that was sent has run. Retried:
    // 100 ms is short on a loaded machine, and a late call here touches only its own key.
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = s.check("after", &alg, None).await {
        assert!(Instant::now() < deadline, "not answered after resume: {e}");
    }
    assert_eq!(
        redis.cli(&["-a", "pw", "--no-auth-warning", "exists", "gave-up"]),
        "0",
        "no given-up call ran its script"
    );
}

/// A `redis+unix://` URL connects over the unix socket, to the database it names.
#[tokio::test]
async fn unix_socket_urls_connect() {
    let sockets = tempfile::tempdir().unwrap();
    let path = sockets.path().join("redis.sock");
    let redis = common::Redis::start_with(&["--unixsocket", path.to_str().unwrap()]);
    let s = store(
        format!("redis+unix://{}?db=2", path.display()),
        Duration::from_secs(2),
    );
    s.ping().await.unwrap();
    for alg in all_five() {
        s.check("unix", &alg, None).await.unwrap();
        redis.cli(&["-n", "2", "del", "unix"]);
    }
    s.check("unix:kept", &bucket(1.0, 1), None).await.unwrap();
    assert_eq!(redis.cli(&["-n", "2", "exists", "unix:kept"]), "1");
}

/// A three-master Redis Cluster made with `redis-cli --cluster create`: keys over all slots,
/// every algorithm, limited exactly as on one Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_limits_keys_on_every_node() {
    let cluster = common::Cluster::start();
    let s = RedisStore::connect_over(
        &RedisTarget::Cluster(cluster.urls()),
        Duration::from_secs(5),
        1,
        common::redis_connection(),
    )
    .unwrap();
    let algs = [
        bucket(0.001, 2),
        Algorithm::FixedWindow(win(2, 3_600_000)),
        Algorithm::SlidingWindow(win(2, 3_600_000)),
        Algorithm::SlidingWindowCounter(win(2, 3_600_000)),
    ];
    // (the hourly fixed window must not end under the loop)
    common::clear_of_hour_end(Duration::from_secs(30)).await;
    for i in 0..120 {
        let alg = &algs[i % algs.len()];
        let key = format!("tollgate:r:l:client-{i}");
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(s.check(&key, alg, None).await.unwrap().allowed);
        }
        assert_eq!(got, [true, true, false], "{key} ({})", alg.name());
    }
    let pace = Algorithm::LeakyBucket(Pace::new(Rate::per_second(10.0).unwrap(), None).unwrap());
    let second = s.check("tollgate:pace:x", &pace, None).await.unwrap();
    assert!(second.allowed);
    for node in &cluster.nodes {
        let keys: u64 = node.cli(&["dbsize"]).parse().unwrap();
        assert!(
            keys > 20,
            "node {} holds {keys} keys: slots not spread",
            node.port
        );
    }
    // NOSCRIPT on every node is recovered too
    for node in &cluster.nodes {
        node.cli(&["script", "flush"]);
    }
    s.check("tollgate:r:l:after-flush", &algs[0], None)
        .await
        .expect("reloaded on the key's node");
}

/// On a Cluster, readiness is the cluster's: ready while every slot is served; once a master
/// is down and the cluster has noticed (`cluster_state:fail`), not ready, although the other
/// nodes still answer a `PING`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_readiness_follows_the_cluster_state() {
    let mut cluster = common::Cluster::start();
    let s = RedisStore::connect_over(
        &RedisTarget::Cluster(cluster.urls()),
        Duration::from_secs(2),
        1,
        common::redis_connection(),
    )
    .unwrap();
    s.ready().await.expect("a whole cluster is ready");
    cluster.nodes[2].kill();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster.nodes[0]
        .cli(&["cluster", "info"])
        .contains("cluster_state:fail")
    {
        assert!(Instant::now() < deadline, "the cluster never noticed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let err = s
        .ready()
        .await
        .expect_err("a cluster with a slot uncovered");
    assert!(err.to_string().contains("cluster"), "{err}");
}

/// Calls stuck behind a socket Redis does not read (paused, with 32 MB of commands written
/// at it: more than the socket buffers hold) are answered `Timeout` by their deadline, the
/// ones made while the write is stuck too; once Redis reads again the connection serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_behind_a_full_socket_time_out_by_their_deadline() {
    let redis = common::Redis::start();
    let timeout = Duration::from_millis(200);
    let s = store(redis.url(), timeout);
    let alg = bucket(1.0, 100);
    s.check("warm-up", &alg, None).await.unwrap();
    redis.signal("-STOP");
    let mut calls = Vec::new();
    for i in 0..64 {
        let s = s.clone();
        // each command is half a megabyte: the socket is full after a few dozen
        let key = format!("{i:02}{}", "k".repeat(512 * 1024));
        calls.push(tokio::spawn(async move {
            let began = Instant::now();
            let result = s.check(&key, &alg, None).await;
            (result, began.elapsed())
        }));
        if i == 32 {
            // later calls come while the first ones are still being written
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        let mut all = Vec::new();
        for call in calls {
            all.push(call.await.unwrap());
        }
        all
    })
    .await;
    redis.signal("-CONT");
    let answered = answered.expect("calls hung behind the full socket while Redis was paused");
    for (result, took) in answered {
        let err = result.expect_err("Redis is paused");
        assert!(matches!(err, StoreError::Timeout(_)), "{err}");
        // each call by its own deadline; wide: 2 cores, shared
        assert!(
            took < timeout + Duration::from_millis(1500),
            "answered {took:?} after the call"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = s.check("after", &alg, None).await {
        assert!(Instant::now() < deadline, "not served after resume: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// While Redis holds its clients' commands (`CLIENT PAUSE … WRITE`: it reads them and runs
/// none), a call made while a batch is unanswered waits for its reply: one batch in flight.
/// Seen from Redis: the connection blocked on its `EVALSHA` has nothing more in its query
/// buffer. When Redis goes on, the held call is written and each call gets its own reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_made_while_a_batch_is_unanswered_waits_for_its_reply() {
    let redis = common::Redis::start();
    let s = store(redis.url(), Duration::from_secs(10));
    let alg = Algorithm::FixedWindow(win(10, 60_000));
    s.check("warm-up", &alg, None).await.unwrap();
    // the query buffer of the store's connection, once it is blocked on a command
    let blocked_qbuf = || -> Option<usize> {
        let list = redis.cli(&["client", "list"]);
        let line = list.lines().find(|l| l.contains(" flags=b "))?;
        let qbuf = line.split(' ').find_map(|f| f.strip_prefix("qbuf="))?;
        Some(qbuf.parse().unwrap())
    };
    assert_eq!(redis.cli(&["client", "pause", "8000", "write"]), "OK");
    let call = |key: &'static str| {
        let s = s.clone();
        tokio::spawn(async move { s.check(key, &alg, None).await })
    };
    let first = call("first");
    // (the first call reaches Redis)
    let blocked = &blocked_qbuf;
    common::eventually(
        Duration::from_secs(5),
        || async move { blocked().is_some() },
    )
    .await;
    assert_eq!(blocked_qbuf(), Some(0), "only the first command is there");
    let second = call("second");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        blocked_qbuf(),
        Some(0),
        "a second batch was written while the first was unanswered"
    );
    assert_eq!(redis.cli(&["client", "unpause"]), "OK");
    for call in [first, second] {
        let d = call.await.unwrap().expect("answered once Redis goes on");
        assert!(d.allowed);
        assert_eq!(d.remaining, 9, "each key's own window");
    }
}

/// A call answered `Timeout` keeps its place for its reply: when Redis wakes (from `DEBUG
/// SLEEP`), the late reply goes to no one and a call written behind it gets its own (a fixed
/// window of 5 counts 4, 3, 2 down, not a late call's 999). Calls made while it is in flight
/// wait to be written (one batch in flight at a time) until it is past its deadline; then they
/// go behind it, and run when Redis wakes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_replies_are_dropped_and_later_calls_get_their_own() {
    let redis = common::Redis::start_with(&["--enable-debug-command", "local"]);
    // Redis sleeps 1.5 s: calls made at once are late after 1 s, and one made then is
    // answered when Redis wakes, within its own second
    let s = store(redis.url(), Duration::from_secs(1));
    let late = Algorithm::FixedWindow(win(1000, 60_000));
    let fresh = Algorithm::SlidingWindow(win(5, 60_000));
    s.check("warm-up", &late, None).await.unwrap();
    let port = redis.port;
    let sleeper = std::thread::spawn(move || common::cli(port, &["DEBUG", "SLEEP", "1.5"]));
    redis.wait_blocked();
    // a key each, so that no two are joined into one command; the first is written at once.
    // The others are made 200 ms later, so they are written once the first is past its
    // deadline (1 s) with 200 ms left of their own (a call past its deadline is never sent),
    // and are late themselves (1.2 s) about 300 ms before Redis wakes.
    let mut calls = Vec::new();
    for i in 0..20 {
        if i == 1 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let s = s.clone();
        calls.push(tokio::spawn(async move {
            s.check(&format!("late{i}"), &late, None).await
        }));
    }
    for call in calls {
        let err = call.await.unwrap().expect_err("Redis is asleep");
        assert!(matches!(err, StoreError::Timeout(_)), "{err}");
    }
    for left in [4, 3, 2] {
        let d = s.check("fresh", &fresh, None).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, left, "a reply meant for another call");
    }
    assert_eq!(sleeper.join().unwrap(), "OK");
    // the late calls did run: their replies came, to no one
    for key in ["late0", "late19"] {
        assert_eq!(redis.cli(&["exists", key]), "1", "{key}");
    }
}

/// The ids of the clients connected to `redis`, but redis-cli's own.
fn client_ids(redis: &common::Redis) -> Vec<String> {
    redis
        .cli(&["client", "list"])
        .lines()
        .filter(|l| !l.contains("cmd=client"))
        .filter_map(|l| {
            l.split_whitespace()
                .next()?
                .strip_prefix("id=")
                .map(str::to_owned)
        })
        .collect()
}

/// A Redis made a replica under an open connection (a failover that did not close it, a DNS
/// name that moved) answers `READONLY`: the store drops that connection, so the next call
/// makes a new one, which finds the master again once there is one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_drops_the_connection() {
    let redis = common::Redis::start();
    let other = common::Redis::start();
    let s = store(redis.url(), Duration::from_secs(2));
    let alg = bucket(1.0, 10);
    assert!(s.check("k", &alg, None).await.unwrap().allowed);
    let before = client_ids(&redis);
    assert_eq!(before.len(), 1, "{before:?}");
    redis.cli(&["replicaof", "127.0.0.1", &other.port.to_string()]);
    let refused = s.check("k", &alg, None).await.unwrap_err();
    assert!(
        refused.to_string().contains("read only replica"),
        "{refused}"
    );
    redis.cli(&["replicaof", "no", "one"]);
    assert!(s.check("k2", &alg, None).await.unwrap().allowed);
    let after = client_ids(&redis);
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(
        before, after,
        "the connection that met READONLY is still in use"
    );
}

/// `peek` tells what the next check would answer and takes nothing; `forget` makes the key new
/// again. Through Redis and in memory alike, for all five algorithms.
#[tokio::test]
async fn peek_takes_nothing_and_forget_starts_afresh() {
    let redis = common::Redis::start();
    let shared: Arc<dyn Store> = store(redis.url(), Duration::from_secs(2));
    let memory: Arc<dyn Store> = Arc::new(tollgate::store::MemoryStore::new(
        std::num::NonZeroUsize::new(100).unwrap(),
    ));
    for store in [shared, memory] {
        for (i, alg) in all_five().into_iter().enumerate() {
            let key = format!("peek:{i}");
            let fresh = store.peek(&key, &alg).await.unwrap();
            assert!(fresh.allowed, "{alg:?}");
            // (the leaky bucket admits 5 at once within its second of max_delay)
            let taken = if i == 1 { 3 } else { 10 };
            for _ in 0..taken {
                store.check(&key, &alg, None).await.unwrap();
            }
            let before = store.peek(&key, &alg).await.unwrap();
            let again = store.peek(&key, &alg).await.unwrap();
            assert_eq!(before.allowed, again.allowed, "{alg:?}");
            assert_eq!(
                before.remaining, again.remaining,
                "peek takes nothing: {alg:?}"
            );
            let next = store.check(&key, &alg, None).await.unwrap();
            assert_eq!(
                before.allowed, next.allowed,
                "peek foretold the check: {alg:?}"
            );
            if i != 1 {
                assert!(!next.allowed, "the limit is spent: {alg:?}");
                assert_eq!(before.remaining, next.remaining, "{alg:?}");
            }
            assert!(store.forget(&key).await.unwrap(), "{alg:?}");
            assert!(!store.forget(&key).await.unwrap(), "nothing left: {alg:?}");
            let after = store.check(&key, &alg, None).await.unwrap();
            assert!(after.allowed, "a new client again: {alg:?}");
        }
    }
}

/// Every test above again, over redis-rs's connection rather than the store's own: the two
/// behave alike. The tests of what only the own connection does stay on it.
#[test]
fn every_test_again_over_redis_rs() {
    common::passes::again_over_redis_rs(
        "every_test_again_over_redis_rs",
        &[
            // joining checks into one script call is the own connection's
            "checks_of_one_bucket_in_flight_together_run_as_one_script",
            "checks_of_different_keys_in_flight_together_run_as_one_script",
            "pacing_checks_in_flight_together_take_consecutive_slots",
            // so are leases
            "busy_buckets_lease_tokens_and_give_back_what_they_do_not_hand_out",
            // one batch in flight at a time: the own connection's way of writing
            "a_call_made_while_a_batch_is_unanswered_waits_for_its_reply",
            // redis-rs's connection manager keeps its connection after `READONLY`
            "readonly_drops_the_connection",
        ],
    );
}

/// The fleet's figures: each instance's last blob is kept under its id, read back with the
/// server's time; a blob of the bound is taken, one byte more refused with nothing written;
/// both keys share a hash tag and expire; an instance that stops publishing drops out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_keeps_each_instances_last_blob_within_its_bounds() {
    use tollgate::store::{FLEET_MAX_BYTES, FLEET_STALE};
    let redis = common::Redis::start();
    let s = store(redis.url(), Duration::from_secs(2));
    let key = "{tollgate:fleet}";
    assert_eq!(s.publish(key, "a", b"{\"n\":1}").await.unwrap(), 1);
    assert_eq!(s.publish(key, "b", b"{\"n\":2}").await.unwrap(), 2);
    assert_eq!(
        s.publish(key, "a", b"{\"n\":3}").await.unwrap(),
        2,
        "a again"
    );
    let fleet = s.fleet(key).await.unwrap();
    let mut kept: Vec<(String, Vec<u8>)> = fleet
        .instances
        .iter()
        .map(|p| (p.id.clone(), p.blob.clone()))
        .collect();
    kept.sort();
    assert_eq!(
        kept,
        [
            ("a".into(), b"{\"n\":3}".to_vec()),
            ("b".into(), b"{\"n\":2}".to_vec())
        ]
    );
    for p in &fleet.instances {
        assert!(
            p.seen_ms <= fleet.now_ms && p.seen_ms + 2_000 > fleet.now_ms,
            "{p:?}"
        );
    }
    let biggest = vec![b'x'; FLEET_MAX_BYTES];
    assert_eq!(s.publish(key, "big", &biggest).await.unwrap(), 3);
    let over = vec![b'x'; FLEET_MAX_BYTES + 1];
    let refused = s.publish(key, "over", &over).await.unwrap_err();
    assert!(refused.to_string().contains("over the bound"), "{refused}");
    assert!(!refused.is_outage(), "a refused blob is no outage");
    assert_eq!(s.fleet(key).await.unwrap().instances.len(), 3);
    for k in [key, "{tollgate:fleet}:seen"] {
        let ttl: u64 = redis.cli(&["PTTL", k]).trim().parse().unwrap();
        assert!(
            ttl > 0 && ttl <= FLEET_STALE.as_millis() as u64,
            "{k}: {ttl}"
        );
    }
    // "a" goes on publishing, the others stop: they drop out, "a" stays
    let deadline = Instant::now() + FLEET_STALE * 4;
    loop {
        s.publish(key, "a", b"{}").await.unwrap();
        let ids: Vec<String> = s
            .fleet(key)
            .await
            .unwrap()
            .instances
            .into_iter()
            .map(|p| p.id)
            .collect();
        if ids == ["a"] {
            break;
        }
        assert!(Instant::now() < deadline, "still kept: {ids:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        redis.cli(&["HLEN", key]),
        "1",
        "the blobs of the gone dropped too"
    );
}

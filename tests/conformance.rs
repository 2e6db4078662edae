//! One conformance suite, generic over `Store`: the same sequences of (now, request) must get
//! identical decisions from the memory store (Rust) and the Redis store (Lua on a real Redis).

mod common;

use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::limit::{Aimd, Algorithm, Bucket, Decision, Pace, Rate, Report, Slots, Window};
use tollgate::store::{Connection, MemoryStore, RedisStore, RedisTarget, Store};

const T0: f64 = 1_700_000_040_000.0; // a multiple of every window used below

fn bucket(rate: f64, burst: u32, cost: u32) -> Algorithm {
    let nz = |n| NonZeroU32::new(n).unwrap();
    Algorithm::TokenBucket(
        Bucket::new(Rate::per_second(rate).unwrap(), nz(burst), nz(cost)).unwrap(),
    )
}

fn win(limit: u64, ms: u64) -> Window {
    Window::new(NonZeroU64::new(limit).unwrap(), Duration::from_millis(ms))
}

fn pace(rate: f64, max_delay_ms: Option<u64>) -> Algorithm {
    Algorithm::LeakyBucket(
        Pace::new(
            Rate::per_second(rate).unwrap(),
            max_delay_ms.map(Duration::from_millis),
        )
        .unwrap(),
    )
}

/// Replays `times` for one key through any store.
async fn replay(store: &dyn Store, key: &str, alg: &Algorithm, times: &[f64]) -> Vec<Decision> {
    let mut out = Vec::with_capacity(times.len());
    for t in times {
        out.push(
            store
                .check(key, alg, Some(*t))
                .await
                .expect("store answers"),
        );
    }
    out
}

static KEY: AtomicU64 = AtomicU64::new(0);

/// The same sequence through both stores, under a fresh key; both answers, asserted equal.
async fn both(redis: &RedisStore, alg: &Algorithm, times: &[f64]) -> Vec<Decision> {
    let key = format!("conf:{}", KEY.fetch_add(1, Ordering::Relaxed));
    let memory = MemoryStore::new(NonZeroUsize::new(1000).unwrap());
    let from_rust = replay(&memory, &key, alg, times).await;
    let from_lua = replay(redis, &key, alg, times).await;
    for (i, (r, l)) in from_rust.iter().zip(&from_lua).enumerate() {
        assert_eq!(
            r,
            l,
            "{} request {i} at {}: rust {r:?} lua {l:?}",
            alg.name(),
            times[i]
        );
    }
    from_lua
}

/// Both connections to one Redis: every test here runs through each, so the store's own and
/// redis-rs's, which a Cluster uses, are held to the same answers.
const CONNECTIONS: [Connection; 2] = [Connection::Own, Connection::Library];

fn redis_store(redis: &common::Redis, connection: Connection) -> RedisStore {
    let target = RedisTarget::Single(redis.url());
    RedisStore::connect_over(&target, Duration::from_secs(2), 1, connection).unwrap()
}

/// A runtime to drive proptest's cases on, and a Redis store made on it.
fn runtime_with_store(
    server: &common::Redis,
    connection: Connection,
) -> (tokio::runtime::Runtime, RedisStore) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = rt.block_on(async { redis_store(server, connection) });
    (rt, redis)
}

fn allowed(d: &[Decision]) -> Vec<bool> {
    d.iter().map(|d| d.allowed).collect()
}

/// Hand-written edges, identical from Rust and Lua: full and empty buckets, cost > 1, window
/// boundaries, same-millisecond requests, max_delay, fractional times and rates.
#[tokio::test]
async fn hand_written_edges_agree() {
    let server = common::Redis::start();
    for connection in CONNECTIONS {
        server.cli(&["flushall"]);
        let redis = redis_store(&server, connection);
        // token bucket: a full bucket, emptied, refilled one token at a time; cost 3
        let d = both(
            &redis,
            &bucket(10.0, 3, 1),
            &[T0, T0, T0, T0, T0 + 99.0, T0 + 100.0, T0 + 5000.0],
        )
        .await;
        assert_eq!(allowed(&d), [true, true, true, false, false, true, true]);
        let d = both(
            &redis,
            &bucket(2.0, 5, 3),
            &[T0, T0 + 1.0, T0 + 1000.0, T0 + 1000.0],
        )
        .await;
        assert_eq!(allowed(&d), [true, false, true, false]);
        both(
            &redis,
            &bucket(0.05, 3, 1),
            &[
                T0,
                T0 + 0.25,
                T0 + 0.5,
                T0 + 0.75,
                T0 + 19_999.9,
                T0 + 20_000.5,
            ],
        )
        .await;
        both(
            &redis,
            &bucket(1.0 / 3.0, 2, 1),
            &[T0, T0 + 1.5, T0 + 2.5, T0 + 3000.0, T0 + 3333.334],
        )
        .await;
        // fixed window: the last ms of one window and the first of the next
        let d = both(
            &redis,
            &Algorithm::FixedWindow(win(2, 1000)),
            &[
                T0 + 998.0,
                T0 + 999.0,
                T0 + 999.9,
                T0 + 1000.0,
                T0 + 1000.0,
                T0 + 1000.0,
            ],
        )
        .await;
        assert_eq!(allowed(&d), [true, true, false, true, true, false]);
        // sliding window: same millisecond, and the exact moment an entry leaves
        let d = both(
            &redis,
            &Algorithm::SlidingWindow(win(2, 1000)),
            &[
                T0,
                T0,
                T0,
                T0 + 999.999,
                T0 + 1000.0,
                T0 + 1000.0,
                T0 + 1000.0,
            ],
        )
        .await;
        assert_eq!(allowed(&d), [true, true, false, false, true, true, false]);
        // sliding-window counter across two and three windows
        let d = both(
            &redis,
            &Algorithm::SlidingWindowCounter(win(4, 1000)),
            &[
                T0 + 10.0,
                T0 + 20.0,
                T0 + 30.0,
                T0 + 40.0,
                T0 + 50.0,
                T0 + 1250.0,
                T0 + 1250.0,
                T0 + 1600.0,
                T0 + 3100.0,
            ],
        )
        .await;
        assert!(!d[4].allowed && d[5].allowed && d[8].allowed);
        // pacing: unbounded, bounded, refused then admitted, fractional intervals
        let d = both(
            &redis,
            &pace(4.0, Some(500)),
            &[T0, T0, T0, T0, T0 + 250.0, T0 + 10_000.0],
        )
        .await;
        assert_eq!(allowed(&d), [true, true, true, false, true, true]);
        assert_eq!(d[2].delay_us, 500_000);
        both(
            &redis,
            &pace(3.0, None),
            &[T0, T0, T0, T0 + 0.123, T0 + 0.124],
        )
        .await;
        both(
            &redis,
            &pace(1000.0, Some(0)),
            &[T0, T0 + 0.5, T0 + 1.0, T0 + 1.0005],
        )
        .await;
    }
}

/// State written on the caller's clock outlives real time passing the caller's own time to live:
/// Redis times the expiry on its clock, and a caller that is behind (here by the real time the
/// test takes) must still find its count. Each first request leaves a key that the caller's time
/// would keep for a millisecond or two; the second comes 0.5 ms later on that time but 50 ms
/// later in real time, and must be counted against the first.
#[tokio::test]
async fn caller_clock_state_outlives_real_time_drift() {
    let server = common::Redis::start();
    for connection in CONNECTIONS {
        server.cli(&["flushall"]);
        let redis = redis_store(&server, connection);
        let cases = [
            Algorithm::FixedWindow(win(2, 1000)),
            bucket(1000.0, 1, 1),
            pace(1000.0, None),
            Algorithm::SlidingWindow(win(1, 1)),
            Algorithm::SlidingWindowCounter(win(1, 1)),
        ];
        for (i, alg) in cases.iter().enumerate() {
            let key = format!("drift:{i}");
            let first = T0 + 998.0;
            let a = redis.check(&key, alg, Some(first)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            let b = redis.check(&key, alg, Some(first + 0.5)).await.unwrap();
            let memory = MemoryStore::new(NonZeroUsize::new(10).unwrap());
            let expected = replay(&memory, &key, alg, &[first, first + 0.5]).await;
            assert_eq!([a, b], expected[..], "{}", alg.name());
        }
        // a back-pressure hold (`pace_defer.lua`) of 1 ms at 1000/s: its key too
        let p = Pace::new(Rate::per_second(1000.0).unwrap(), None).unwrap();
        let alg = Algorithm::LeakyBucket(p);
        let first = T0 + 998.0;
        let held = redis.defer("drift:hold", &p, 1, Some(first)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let after = redis
            .check("drift:hold", &alg, Some(first + 0.5))
            .await
            .unwrap();
        let memory = MemoryStore::new(NonZeroUsize::new(10).unwrap());
        let expected = (
            memory
                .defer("drift:hold", &p, 1, Some(first))
                .await
                .unwrap(),
            memory
                .check("drift:hold", &alg, Some(first + 0.5))
                .await
                .unwrap(),
        );
        assert_eq!((held, after), expected, "pace_defer");
    }
}

/// Decisions taken with the Redis server clock (no `now` passed) behave like the memory store's.
#[tokio::test]
async fn server_clock_decisions_match_expectations() {
    let server = common::Redis::start();
    for connection in CONNECTIONS {
        server.cli(&["flushall"]);
        let redis = redis_store(&server, connection);
        let alg = bucket(1.0, 3, 1);
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(redis.check("live", &alg, None).await.unwrap());
        }
        assert_eq!(allowed(&seen), [true, true, true, false]);
        // (the next token a second after the first check, less the time the four took)
        assert!(
            (500..=1000).contains(&seen[3].retry_after_ms),
            "{:?}",
            seen[3]
        );
    }
}

fn times(max_gap: u64, n: usize, fractional: bool) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec((0..=max_gap, 0u32..1000), 1..n).prop_map(move |gaps| {
        let mut t = T0;
        gaps.iter()
            .map(|(g, f)| {
                t += *g as f64
                    + if fractional {
                        f64::from(*f) / 1000.0
                    } else {
                        0.0
                    };
                t
            })
            .collect()
    })
}

fn any_algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        (1u32..40, 1u32..12, 1u32..4).prop_map(|(r, b, c)| bucket(f64::from(r) / 2.0, b.max(c), c)),
        (1u32..400, prop::option::of(0u64..1500)).prop_map(|(r, m)| pace(f64::from(r) / 4.0, m)),
        (1u64..8, 50u64..1500).prop_map(|(l, w)| Algorithm::FixedWindow(win(l, w))),
        (1u64..8, 50u64..1500).prop_map(|(l, w)| Algorithm::SlidingWindow(win(l, w))),
        (1u64..8, 50u64..1500).prop_map(|(l, w)| Algorithm::SlidingWindowCounter(win(l, w))),
    ]
}

/// Random sequences for random parameters of all five algorithms get identical answers.
#[test]
fn random_sequences_agree() {
    let server = common::Redis::start();
    for connection in CONNECTIONS {
        server.cli(&["flushall"]);
        let (rt, redis) = runtime_with_store(&server, connection);
        let config = ProptestConfig {
            cases: 96,
            ..ProptestConfig::default()
        };
        proptest!(config, |(alg in any_algorithm(), frac in any::<bool>(), seq in times(120, 60, false), fseq in times(120, 60, true))| {
            let seq = if frac { fseq } else { seq };
            rt.block_on(both(&redis, &alg, &seq));
        });
    }
}

/// Back-pressure holds mixed with pacing agree between Rust and Lua.
#[tokio::test]
async fn back_pressure_holds_agree() {
    let server = common::Redis::start();
    for connection in CONNECTIONS {
        server.cli(&["flushall"]);
        let redis = redis_store(&server, connection);
        let memory = MemoryStore::new(NonZeroUsize::new(100).unwrap());
        let p = Pace::new(
            Rate::per_second(4.0).unwrap(),
            Some(Duration::from_millis(900)),
        )
        .unwrap();
        let alg = Algorithm::LeakyBucket(p);
        let steps: [(f64, Option<u64>); 8] = [
            (T0, None),
            (T0 + 10.0, Some(600)),
            (T0 + 20.0, None),
            (T0 + 30.0, Some(100)),
            (T0 + 40.0, None),
            (T0 + 50.0, None),
            (T0 + 3000.0, Some(0)),
            (T0 + 3000.5, None),
        ];
        let mut answers: Vec<Vec<String>> = Vec::new();
        for store in [&memory as &dyn Store, &redis] {
            let mut seen = Vec::new();
            for (t, hold) in steps {
                seen.push(match hold {
                    Some(ms) => {
                        format!("hold {}", store.defer("bp", &p, ms, Some(t)).await.unwrap())
                    }
                    None => format!("{:?}", store.check("bp", &alg, Some(t)).await.unwrap()),
                });
            }
            answers.push(seen);
        }
        assert_eq!(answers[0], answers[1]);
        assert!(
            answers[0][2].contains("delay_us: 590000"),
            "{:?}",
            answers[0]
        );
    }
}

/// What a step of [`replay_giving_back`] does at its time.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    Check,
    /// gives back the latest admitted check not given back yet
    BackLatest,
    /// gives back the earliest one
    BackEarliest,
}

/// What a step of a replay answered.
#[derive(Debug, PartialEq)]
enum Answer {
    Checked(Decision),
    /// whether the give-back gave anything back
    GaveBack(bool),
}

/// A replay in which some admitted checks are given back (a later limit refused the request).
/// What each step answered.
async fn replay_giving_back(
    store: &dyn Store,
    key: &str,
    alg: &Algorithm,
    steps: &[(f64, Step)],
) -> Vec<Answer> {
    // when each admitted check ran, or for a leaky bucket, when its slot is
    let mut admitted: std::collections::VecDeque<f64> = Default::default();
    let mut out = Vec::new();
    for &(t, step) in steps {
        if step != Step::Check {
            let given = match step {
                Step::BackLatest => admitted.pop_back(),
                _ => admitted.pop_front(),
            };
            if let Some(at) = given {
                let gave = store.give_back(key, alg, t - at, Some(t)).await;
                out.push(Answer::GaveBack(gave.expect("store answers")));
            }
            continue;
        }
        let d = store.check(key, alg, Some(t)).await.expect("store answers");
        if d.allowed {
            admitted.push_back(t + d.delay_us as f64 / 1000.0);
        }
        out.push(Answer::Checked(d));
    }
    out
}

/// The decisions of a replay's checks.
fn decisions(got: &[Answer]) -> Vec<&Decision> {
    got.iter()
        .filter_map(|a| match a {
            Answer::Checked(d) => Some(d),
            Answer::GaveBack(_) => None,
        })
        .collect()
}

/// Whether each give-back of a replay gave anything back.
fn gave_back(got: &[Answer]) -> Vec<bool> {
    got.iter()
        .filter_map(|a| match a {
            Answer::GaveBack(gave) => Some(*gave),
            Answer::Checked(_) => None,
        })
        .collect()
}

/// Give-backs mixed into random sequences: Rust and Lua agree on every decision after them,
/// and on whether each give-back gave anything back.
#[test]
fn give_backs_agree() {
    let server = common::Redis::start();
    for connection in CONNECTIONS {
        server.cli(&["flushall"]);
        let (rt, redis) = runtime_with_store(&server, connection);
        let config = ProptestConfig {
            cases: 64,
            ..ProptestConfig::default()
        };
        let step = prop_oneof![
            3 => Just(Step::Check),
            1 => Just(Step::BackLatest),
            1 => Just(Step::BackEarliest),
        ];
        proptest!(config, |(alg in any_algorithm(), seq in times(120, 60, true), kinds in prop::collection::vec(step, 60))| {
            let steps: Vec<(f64, Step)> = seq.iter().zip(&kinds).map(|(t, k)| (*t, *k)).collect();
            let key = format!("conf:{}", KEY.fetch_add(1, Ordering::Relaxed));
            let memory = MemoryStore::new(NonZeroUsize::new(1000).unwrap());
            let from_rust = rt.block_on(replay_giving_back(&memory, &key, &alg, &steps));
            let from_lua = rt.block_on(replay_giving_back(&redis, &key, &alg, &steps));
            prop_assert_eq!(from_rust, from_lua, "{}", alg.name());
        });
    }
}

/// What a check took and gave back is as if it was never taken: for each algorithm, four
/// checks at one instant fill the limit; each give-back then makes room for exactly one more.
#[tokio::test]
async fn a_check_given_back_is_as_if_never_made() {
    let server = common::Redis::start();
    for connection in CONNECTIONS {
        server.cli(&["flushall"]);
        let redis = redis_store(&server, connection);
        let memory = MemoryStore::new(NonZeroUsize::new(100).unwrap());
        for alg in [
            bucket(1.0, 4, 1),
            pace(1.0, Some(3000)),
            Algorithm::FixedWindow(win(4, 60_000)),
            Algorithm::SlidingWindow(win(4, 60_000)),
            Algorithm::SlidingWindowCounter(win(4, 60_000)),
        ] {
            for store in [&memory as &dyn Store, &redis] {
                let key = format!("back:{}", KEY.fetch_add(1, Ordering::Relaxed));
                // (past the first 50 ms of a window: see `a_window_start_keeps_its_count`)
                let t = T0 + 100.25;
                let mut steps = vec![(t, Step::Check); 4];
                for _ in 0..3 {
                    steps.extend([(t, Step::BackLatest), (t, Step::Check)]);
                }
                steps.extend([(t, Step::Check), (t, Step::Check)]);
                let got = replay_giving_back(store, &key, &alg, &steps).await;
                let admitted: Vec<bool> = decisions(&got).iter().map(|d| d.allowed).collect();
                assert_eq!(
                    admitted,
                    [true, true, true, true, true, true, true, false, false],
                    "{}: {got:?}",
                    alg.name()
                );
                assert_eq!(gave_back(&got), [true; 3], "{}", alg.name());
            }
        }
    }
}

/// A leaky bucket's slot is given back only while it is the last one handed out: a slot in the
/// middle of the schedule stays taken, so no two requests ever go out at once.
#[tokio::test]
async fn a_leaky_slot_in_the_middle_is_not_given_back() {
    let server = common::Redis::start();
    for connection in CONNECTIONS {
        server.cli(&["flushall"]);
        let redis = redis_store(&server, connection);
        let memory = MemoryStore::new(NonZeroUsize::new(100).unwrap());
        let alg = pace(10.0, None);
        for store in [&memory as &dyn Store, &redis] {
            let key = format!("middle:{}", KEY.fetch_add(1, Ordering::Relaxed));
            let t = T0 + 0.5;
            // slots at +0, +100, +200 ms; the first given back, then the last
            let steps = [
                (t, Step::Check),
                (t, Step::Check),
                (t, Step::Check),
                (t + 1.0, Step::BackEarliest),
                (t + 1.0, Step::Check),
                (t + 2.0, Step::BackLatest),
                (t + 2.0, Step::Check),
            ];
            let got = replay_giving_back(store, &key, &alg, &steps).await;
            let delays: Vec<u64> = decisions(&got).iter().map(|d| d.delay_us).collect();
            // the fourth check goes after the third (the first slot stays taken); the fourth, the
            // last, given back, the fifth takes its slot again
            assert_eq!(delays, [0, 100_000, 200_000, 299_000, 298_000]);
            assert_eq!(gave_back(&got), [false, true]);
        }
    }
}

/// A give-back whose check may have been made in the window before (its time within the first
/// 50 ms of a window, or half of it) takes nothing: the check stays counted where it was.
#[tokio::test]
async fn a_window_start_keeps_its_count() {
    let server = common::Redis::start();
    for connection in CONNECTIONS {
        server.cli(&["flushall"]);
        let redis = redis_store(&server, connection);
        let memory = MemoryStore::new(NonZeroUsize::new(100).unwrap());
        for alg in [
            Algorithm::FixedWindow(win(1, 60_000)),
            Algorithm::SlidingWindowCounter(win(1, 60_000)),
        ] {
            for store in [&memory as &dyn Store, &redis] {
                let key = format!("edge:{}", KEY.fetch_add(1, Ordering::Relaxed));
                let t = T0 + 20.0;
                let steps = [
                    (t, Step::Check),
                    (t, Step::BackLatest),
                    (t + 1.0, Step::Check),
                ];
                let got = replay_giving_back(store, &key, &alg, &steps).await;
                let admitted: Vec<bool> = decisions(&got).iter().map(|d| d.allowed).collect();
                assert_eq!(admitted, [true, false], "{}", alg.name());
                assert_eq!(gave_back(&got), [false], "{}", alg.name());
            }
        }
    }
}

/// A chargeable algorithm: a token bucket that keeps its debt, or one of the counting windows.
fn any_chargeable() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        (1u32..40, 1u32..12, 1u32..4)
            .prop_map(|(r, b, c)| bucket(f64::from(r) / 2.0, b.max(c), c).charged()),
        (1u64..8, 50u64..1500).prop_map(|(l, w)| Algorithm::FixedWindow(win(l, w))),
        (1u64..8, 50u64..1500).prop_map(|(l, w)| Algorithm::SlidingWindowCounter(win(l, w))),
    ]
}

/// A replay of checks (`None`) and charges (`Some(amount)`) at their times: what each answered.
async fn replay_charging(
    store: &dyn Store,
    key: &str,
    alg: &Algorithm,
    steps: &[(f64, Option<i64>)],
) -> Vec<String> {
    let mut out = Vec::with_capacity(steps.len());
    for &(t, amount) in steps {
        out.push(match amount {
            None => format!("{:?}", store.check(key, alg, Some(t)).await.unwrap()),
            Some(n) => format!("{:?}", store.charge(key, alg, n, Some(t)).await.unwrap()),
        });
    }
    out
}

/// Charges mixed into random sequences, positive, negative and into debt: Rust and Lua agree
/// on every balance and on every decision after them.
#[test]
fn charges_agree() {
    let server = common::Redis::start();
    for connection in CONNECTIONS {
        server.cli(&["flushall"]);
        let (rt, redis) = runtime_with_store(&server, connection);
        let config = ProptestConfig {
            cases: 64,
            ..ProptestConfig::default()
        };
        let step = prop_oneof![
            3 => Just(None),
            2 => (-6i64..30).prop_map(Some),
        ];
        proptest!(config, |(alg in any_chargeable(), seq in times(120, 60, true), kinds in prop::collection::vec(step, 60))| {
            let steps: Vec<(f64, Option<i64>)> = seq.iter().zip(&kinds).map(|(t, k)| (*t, *k)).collect();
            let key = format!("conf:{}", KEY.fetch_add(1, Ordering::Relaxed));
            let memory = MemoryStore::new(NonZeroUsize::new(1000).unwrap());
            let from_rust = rt.block_on(replay_charging(&memory, &key, &alg, &steps));
            let from_lua = rt.block_on(replay_charging(&redis, &key, &alg, &steps));
            prop_assert_eq!(from_rust, from_lua, "{}", alg.name());
        });
    }
}

/// A debt is repaid at the bucket's rate, the same in Rust and Lua: 100 tokens at 100/s, one
/// request, 149 more charged; the next waits 510 ms (50 of debt and its own token), and a
/// give-back of 20 shortens that by 200 ms. The windows count a charge where `now` is.
#[tokio::test]
async fn a_debt_is_repaid_at_the_rate() {
    let server = common::Redis::start();
    let redis = redis_store(&server, Connection::Own);
    let memory = MemoryStore::new(NonZeroUsize::new(100).unwrap());
    let charged = bucket(100.0, 100, 1).charged();
    let fixed = Algorithm::FixedWindow(win(10, 1000));
    let counter = Algorithm::SlidingWindowCounter(win(10, 1000));
    let steps: [(&Algorithm, f64, Option<i64>); 9] = [
        (&charged, T0, None),
        (&charged, T0, Some(149)),
        (&charged, T0 + 10.0, None),
        (&charged, T0 + 10.0, Some(-20)),
        (&charged, T0 + 310.0, None),
        (&fixed, T0 + 100.0, Some(12)),
        (&fixed, T0 + 999.0, None),
        (&counter, T0 + 500.0, Some(20)),
        (&counter, T0 + 1500.0, None),
    ];
    let mut answers: Vec<Vec<String>> = Vec::new();
    for store in [&memory as &dyn Store, &redis] {
        let mut seen = Vec::new();
        for (alg, t, amount) in steps {
            let key = format!("debt:{}", alg.name());
            seen.extend(replay_charging(store, &key, alg, &[(t, amount)]).await);
        }
        answers.push(seen);
    }
    assert_eq!(answers[0], answers[1]);
    let a = &answers[0];
    assert!(
        a[1].contains("balance: -50") && a[1].contains("reset_ms: 1500"),
        "{a:?}"
    );
    assert!(
        a[2].contains("allowed: false") && a[2].contains("retry_after_ms: 500"),
        "{a:?}"
    );
    assert!(a[3].contains("balance: -29"), "{a:?}");
    assert!(a[4].contains("allowed: true"), "{a:?}");
    assert!(
        a[5].contains("balance: -2") && a[6].contains("retry_after_ms: 1,"),
        "{a:?}"
    );
    assert!(
        a[7].contains("balance: -10") && a[8].contains("retry_after_ms: 50"),
        "{a:?}"
    );
}

/// One call of a concurrency sequence: holders are named by number.
#[derive(Debug, Clone)]
enum SlotOp {
    Acquire(u8),
    Renew(Vec<u8>),
    Release(Vec<u8>),
    Look,
}

/// What a concurrency call answered: a decision, or how many holders it found.
#[derive(Debug, PartialEq)]
enum SlotAnswer {
    Decided(Decision),
    Found(u64),
}

async fn replay_slots(
    store: &dyn Store,
    key: &str,
    slots: &Slots,
    ops: &[(f64, SlotOp)],
) -> Vec<SlotAnswer> {
    let ids = |hs: &[u8]| hs.iter().map(|h| format!("i:{h}")).collect::<Vec<_>>();
    let mut out = Vec::with_capacity(ops.len());
    for (now, op) in ops {
        let now = Some(*now);
        let answer = match op {
            SlotOp::Acquire(h) => SlotAnswer::Decided(
                store
                    .acquire(key, slots, &format!("i:{h}"), now)
                    .await
                    .unwrap(),
            ),
            SlotOp::Renew(hs) => {
                SlotAnswer::Found(store.renew(key, slots, &ids(hs), now).await.unwrap())
            }
            SlotOp::Release(hs) => {
                SlotAnswer::Found(store.release(key, slots, &ids(hs), now).await.unwrap())
            }
            SlotOp::Look => {
                let alg = Algorithm::Concurrency(*slots);
                SlotAnswer::Decided(store.check(key, &alg, now).await.unwrap())
            }
        };
        out.push(answer);
    }
    out
}

/// The same concurrency sequence through both stores under a fresh key, asserted equal.
async fn both_slots(redis: &RedisStore, slots: &Slots, ops: &[(f64, SlotOp)]) -> Vec<SlotAnswer> {
    let key = format!("conf:slots:{}", KEY.fetch_add(1, Ordering::Relaxed));
    let memory = MemoryStore::new(NonZeroUsize::new(1000).unwrap());
    let from_rust = replay_slots(&memory, &key, slots, ops).await;
    let from_lua = replay_slots(redis, &key, slots, ops).await;
    for (i, (r, l)) in from_rust.iter().zip(&from_lua).enumerate() {
        assert_eq!(r, l, "call {i} {:?}: rust {r:?} lua {l:?}", ops[i]);
    }
    from_lua
}

fn slots(limit: u32, lease_ms: u64) -> Slots {
    Slots::new(
        NonZeroU32::new(limit).unwrap(),
        Duration::from_millis(lease_ms),
    )
    .unwrap()
}

/// Acquire up to the limit, refuse, release and acquire again, renew, and a lease that ends
/// at the very millisecond: identical from Rust and Lua, and as the algorithm says.
#[tokio::test]
async fn concurrency_edges_agree() {
    use SlotAnswer::{Decided, Found};
    use SlotOp::*;
    let server = common::Redis::start();
    for connection in CONNECTIONS {
        server.cli(&["flushall"]);
        let redis = redis_store(&server, connection);
        let ops = [
            (T0, Acquire(1)),
            (T0 + 0.5, Acquire(2)),
            (T0 + 1.0, Acquire(3)),
            (T0 + 2.0, Look),
            (T0 + 3.0, Release(vec![1, 9])),
            (T0 + 4.0, Acquire(3)),
            (T0 + 4.0, Acquire(3)),
            (T0 + 600.0, Renew(vec![2, 3, 3])),
            (T0 + 1000.5, Acquire(4)),
            (T0 + 1600.0, Acquire(4)),
            (T0 + 1600.0, Renew(vec![2])),
            (T0 + 5000.0, Release(vec![3, 4])),
            (T0 + 5000.0, Look),
        ];
        let got = both_slots(&redis, &slots(2, 1000), &ops).await;
        let admitted = |a: &SlotAnswer| matches!(a, Decided(d) if d.allowed);
        let seen: Vec<bool> = got.iter().map(admitted).collect();
        assert_eq!(
            seen,
            [true, true, false, false, false, true, true, false, false, true, false, false, true]
        );
        // the earliest lease (holder 1's) ends 1000 ms after T0: sooner than a second
        assert!(matches!(&got[2], Decided(d) if d.retry_after_ms == 999));
        assert_eq!(got[4], Found(1));
        assert_eq!(got[7], Found(3), "2 and 3 (named twice) renewed");
        // holder 2's lease ended at T0 + 1600 exactly: it is gone
        assert_eq!(got[10], Found(0));
        assert_eq!(got[11], Found(0), "both leases had ended");
    }
}

fn any_slot_op() -> impl Strategy<Value = SlotOp> {
    let holders = prop::collection::vec(0u8..6, 1..4);
    prop_oneof![
        4 => (0u8..6).prop_map(SlotOp::Acquire),
        2 => holders.clone().prop_map(SlotOp::Renew),
        2 => holders.prop_map(SlotOp::Release),
        1 => Just(SlotOp::Look),
    ]
}

/// Random acquire, renew, release and look sequences, with leases that end along the way, get
/// identical answers from Rust and Lua.
#[test]
fn random_concurrency_sequences_agree() {
    let server = common::Redis::start();
    for connection in CONNECTIONS {
        server.cli(&["flushall"]);
        let (rt, redis) = runtime_with_store(&server, connection);
        let config = ProptestConfig {
            cases: 64,
            ..ProptestConfig::default()
        };
        proptest!(config, |(limit in 1u32..5, lease in 1000u64..3000, seq in times(700, 40, true), ops in prop::collection::vec(any_slot_op(), 40))| {
            let ops: Vec<(f64, SlotOp)> = seq.into_iter().zip(ops).collect();
            rt.block_on(both_slots(&redis, &slots(limit, lease), &ops));
        });
    }
}

/// Adaptive pacing parameters for the conformance tests: rates as given, per second.
fn aimd(start: f64, min: f64, max: f64, increase: f64, decrease: f64, period_ms: f64) -> Aimd {
    let r = |x| Rate::per_second(x).unwrap();
    Aimd::new(r(start), r(min), r(max), increase, decrease, period_ms).unwrap()
}

/// Replays adaptive-pacing reports at their times through any store; the rate after each.
async fn replay_reports(
    store: &dyn Store,
    key: &str,
    p: &Aimd,
    steps: &[(f64, Report)],
) -> Vec<f64> {
    let mut out = Vec::with_capacity(steps.len());
    for (t, report) in steps {
        out.push(store.adapt(key, p, *report, Some(*t)).await.unwrap());
    }
    out
}

/// Hand-written reports: a decrease per two periods however many instances report the episode,
/// increases a period apart, the floor and the ceiling; Rust and Lua give the very same rates
/// (compared bit for bit).
#[tokio::test]
async fn adaptive_rates_agree() {
    let server = common::Redis::start();
    for connection in CONNECTIONS {
        server.cli(&["flushall"]);
        let redis = redis_store(&server, connection);
        let memory = MemoryStore::new(NonZeroUsize::new(100).unwrap());
        let p = aimd(100.0, 1.0, 200.0, 1.0, 0.7, 500.0);
        use Report::{Healthy as H, Quiet as Q, Trouble as T};
        let mut steps = vec![(T0, Q), (T0, T), (T0 + 1.0, T), (T0 + 999.0, T)];
        steps.extend([(T0 + 1000.0, T), (T0 + 1100.0, H), (T0 + 1500.25, H)]);
        steps.extend([(T0 + 1700.0, T), (T0 + 1800.0, H), (T0 + 2200.0, H)]);
        // far down to the floor, then up to the ceiling
        steps.extend((0..20).map(|i| (T0 + 3000.0 + 1000.0 * f64::from(i), T)));
        steps.extend((0..300).map(|i| (T0 + 30_000.0 + 500.0 * f64::from(i), H)));
        let from_rust = replay_reports(&memory, "ad", &p, &steps).await;
        let from_lua = replay_reports(&redis, "ad", &p, &steps).await;
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&from_rust),
            bits(&from_lua),
            "{from_rust:?}\n{from_lua:?}"
        );
        assert_eq!(&from_lua[..5], &[100.0, 70.0, 70.0, 70.0, 49.0]);
        assert_eq!(
            from_lua[5], 49.0,
            "an increase waits a period after a decrease"
        );
        assert_eq!(from_lua[6], 50.0);
        assert_eq!(
            from_lua[7], 50.0,
            "a decrease waits two periods after a decrease"
        );
        assert_eq!(from_lua[29], 1.0, "the floor");
        assert_eq!(*from_lua.last().unwrap(), 200.0, "the ceiling");
        // parameters changed by a reload: the stored rate is brought within the new bounds
        let narrower = aimd(20.0, 5.0, 20.0, 1.0, 0.5, 500.0);
        let later = [(T0 + 200_000.0, Q), (T0 + 200_000.0, T)];
        let from_rust = replay_reports(&memory, "ad", &narrower, &later).await;
        let from_lua = replay_reports(&redis, "ad", &narrower, &later).await;
        assert_eq!(from_rust, from_lua);
        assert_eq!(from_lua, [20.0, 10.0]);
        // a rate the store lost (an emptied Redis) resumes from the caller's last known one
        let resumed = p.resume_at(21.5);
        let lost = [(T0, Q), (T0, T), (T0 + 250.0, H), (T0 + 500.0, H)];
        let from_rust = replay_reports(&memory, "lost", &resumed, &lost).await;
        let from_lua = replay_reports(&redis, "lost", &resumed, &lost).await;
        assert_eq!(
            bits(&from_rust),
            bits(&from_lua),
            "{from_rust:?}\n{from_lua:?}"
        );
        assert_eq!(from_lua, [21.5, 21.5 * 0.7, 21.5 * 0.7, 21.5 * 0.7 + 1.0]);
    }
}

/// Random reports at random times for random parameters get the same rates from Rust and Lua.
#[test]
fn random_reports_agree() {
    let server = common::Redis::start();
    for connection in CONNECTIONS {
        server.cli(&["flushall"]);
        let (rt, redis) = runtime_with_store(&server, connection);
        let config = ProptestConfig {
            cases: 64,
            ..ProptestConfig::default()
        };
        let params = (
            1u32..50,
            1u32..20,
            1u32..200,
            1u32..100,
            1u32..99,
            1u32..1000,
        )
            .prop_map(|(min, up, span, inc, dec, period)| {
                let min = f64::from(min) / 4.0;
                let start = min + f64::from(up) / 3.0;
                let max = start + f64::from(span) / 7.0;
                aimd(
                    start,
                    min,
                    max,
                    f64::from(inc) / 10.0,
                    f64::from(dec) / 100.0,
                    f64::from(period),
                )
            });
        let report = prop_oneof![
            Just(Report::Trouble),
            Just(Report::Healthy),
            Just(Report::Quiet)
        ];
        proptest!(config, |(p in params, seq in times(700, 60, true), reports in prop::collection::vec(report, 60))| {
            let steps: Vec<(f64, Report)> = seq.iter().copied().zip(reports).collect();
            let key = format!("conf:{}", KEY.fetch_add(1, Ordering::Relaxed));
            let memory = MemoryStore::new(NonZeroUsize::new(10).unwrap());
            let from_rust = rt.block_on(replay_reports(&memory, &key, &p, &steps));
            let from_lua = rt.block_on(replay_reports(&redis, &key, &p, &steps));
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&from_rust), bits(&from_lua));
        });
    }
}

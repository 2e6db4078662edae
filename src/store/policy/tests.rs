//! The breaker's state machine on an injected clock, and the policy around a fake store on
//! tokio's paused clock: the fake's delays, the cool-down and the deny cache's expiry pass by
//! `tokio::time::advance`, or by the runtime's auto-advance while it is idle.

use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::limit::{Bucket, Rate, Slots};

const COOL_MS: u64 = COOL_DOWN.as_millis() as u64;

fn timeout() -> StoreError {
    StoreError::Timeout(Duration::from_millis(50))
}

/// A breaker opened by [`TRIP_AFTER`] failures at `at`.
fn tripped(at: u64) -> Breaker {
    let b = Breaker::default();
    for _ in 0..TRIP_AFTER {
        assert_eq!(b.allow_call(at), Some(Permit::Closed));
        b.failure(Permit::Closed, at, &timeout());
    }
    b
}

/// The error Redis answers for a key holding another type, as the store's connection reads it.
fn wrongtype() -> StoreError {
    let reply = b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";
    let (value, _) = crate::store::parse_reply(reply)
        .expect("a whole reply")
        .expect("parsed");
    StoreError::from(value.checked().expect_err("a server error"))
}

/// A call a Cluster's connection did not send, its primary skipped after failing (one shard
/// down), counts neither way: many in a row do not open the breaker, and they do not reset the
/// count of the failures around them. It is counted under `circuit_open`.
#[test]
fn calls_to_a_skipped_primary_count_neither_way() {
    let skipped = StoreError::from(crate::store::resp::Error::Skipped("primary a:1".into()));
    assert!(skipped.is_skipped());
    assert!(!skipped.is_outage());
    assert_eq!(skipped.kind(), "circuit_open");
    let b = Breaker::default();
    for _ in 0..3 * TRIP_AFTER {
        b.record(Permit::Closed, Some(&skipped));
    }
    assert!(!b.is_open(), "skipped calls alone open it");
    for _ in 0..TRIP_AFTER - 1 {
        b.record(Permit::Closed, Some(&timeout()));
        b.record(Permit::Closed, Some(&skipped));
    }
    assert!(!b.is_open());
    b.record(Permit::Closed, Some(&timeout()));
    assert!(b.is_open(), "skipped calls reset the count of failures");
}

/// Errors of one key or call come from a Redis that answers: however many in a row, they do
/// not open the breaker, and they reset the count of failures as a success does; a probe that
/// gets one closes it. Timeouts and broken connections are outages.
#[test]
fn errors_of_one_key_are_not_outages() {
    let reply = StoreError::Reply {
        script: "token_bucket",
        detail: "not four integers".into(),
    };
    let dropped = StoreError::from(crate::store::resp::Error::from(std::io::Error::from(
        std::io::ErrorKind::ConnectionReset,
    )));
    assert!(!wrongtype().is_outage());
    assert!(!reply.is_outage());
    assert!(timeout().is_outage());
    assert!(dropped.is_outage());
    let b = Breaker::default();
    for _ in 0..3 * TRIP_AFTER {
        b.record(Permit::Closed, Some(&wrongtype()));
        b.record(Permit::Closed, Some(&reply));
    }
    assert!(!b.is_open());
    for _ in 0..TRIP_AFTER - 1 {
        b.record(Permit::Closed, Some(&dropped));
    }
    b.record(Permit::Closed, Some(&wrongtype()));
    b.record(Permit::Closed, Some(&dropped));
    assert!(!b.is_open(), "the key's error broke the run of failures");
    let b = tripped(10);
    let probe = b.allow_call(10 + COOL_MS).expect("probe");
    b.record(probe, Some(&wrongtype()));
    assert!(!b.is_open(), "Redis answered the probe");
}

/// [`TRIP_AFTER`] - 1 failures leave it closed, a success resets the count, and
/// [`TRIP_AFTER`] failures in a row open it.
#[test]
fn breaker_opens_after_trip_after_consecutive_failures() {
    let b = Breaker::default();
    for _ in 0..2 {
        for _ in 1..TRIP_AFTER {
            b.failure(Permit::Closed, 10, &timeout());
        }
        assert_eq!(b.allow_call(10), Some(Permit::Closed));
        assert_eq!(b.allow_now(), Some(Permit::Closed));
        assert!(!b.is_open());
        b.success();
    }
    let b = tripped(10);
    assert!(b.is_open());
    assert_eq!(b.allow_call(10), None);
    // on the real clock, opened at a moment far ahead of it: still cooling down
    assert_eq!(tripped(1 << 40).allow_now(), None);
}

/// While open nothing goes through until the cool-down is over; then exactly one probe.
#[test]
fn open_breaker_lets_one_probe_through_after_cool_down() {
    let b = tripped(10);
    assert_eq!(b.allow_call(10 + COOL_MS - 1), None);
    assert_eq!(b.allow_call(10 + COOL_MS), Some(Permit::Probe));
    assert_eq!(b.allow_call(10 + COOL_MS), None, "a second probe");
    assert_eq!(b.allow_call(10 + 5 * COOL_MS), None, "a second probe");
}

/// A failed probe opens the breaker for another whole cool-down, then probes again.
#[test]
fn failed_probe_reopens_for_another_cool_down() {
    let b = tripped(10);
    let t = 10 + COOL_MS + 7;
    let permit = b.allow_call(t).expect("probe");
    {
        let _in_flight = InFlight {
            breaker: &b,
            permit,
        };
        b.failure(permit, t + 50, &timeout());
    }
    assert!(b.is_open());
    assert_eq!(b.allow_call(t + 50 + COOL_MS - 1), None);
    assert_eq!(b.allow_call(t + 50 + COOL_MS), Some(Permit::Probe));
}

/// A successful probe closes the breaker: every call goes through again.
#[test]
fn successful_probe_closes_the_breaker() {
    let b = tripped(10);
    let permit = b.allow_call(10 + COOL_MS).expect("probe");
    {
        let _in_flight = InFlight {
            breaker: &b,
            permit,
        };
        b.success();
    }
    assert!(!b.is_open());
    assert_eq!(b.allow_call(10 + COOL_MS), Some(Permit::Closed));
    assert_eq!(b.allow_call(10 + COOL_MS), Some(Permit::Closed));
}

/// A probe whose caller gave up (its future dropped) frees the slot, so the breaker can still
/// close; before, `probing` stayed set and Redis was never asked again.
#[test]
fn abandoned_probe_frees_the_probe_slot() {
    let b = tripped(10);
    let permit = b.allow_call(10 + COOL_MS).expect("probe");
    drop(InFlight {
        breaker: &b,
        permit,
    });
    assert_eq!(b.allow_call(10 + COOL_MS), Some(Permit::Probe));
}

/// A call that started while the breaker was closed and fails during a probe does not let a
/// second probe start.
#[test]
fn late_failure_of_an_older_call_starts_no_second_probe() {
    let b = tripped(10);
    let probe = b.allow_call(10 + COOL_MS).expect("probe");
    let _in_flight = InFlight {
        breaker: &b,
        permit: probe,
    };
    b.failure(Permit::Closed, 10 + COOL_MS, &timeout());
    assert_eq!(b.allow_call(10 + 3 * COOL_MS), None);
}

/// What the fake store does on every call.
#[derive(Clone, Copy)]
enum Behaviour {
    Fails,
    /// denies with this `retry_after_ms`, after the delay
    Denies(u64),
}

/// A store that answers after `delay` and counts its calls.
struct Fake {
    behaviour: Behaviour,
    delay: Duration,
    calls: Arc<AtomicUsize>,
}

impl Store for Fake {
    fn check<'a>(
        &'a self,
        _key: &'a str,
        _alg: &'a Algorithm,
        _now: Option<Millis>,
    ) -> StoreFuture<'a> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            match self.behaviour {
                Behaviour::Fails => Err(timeout()),
                Behaviour::Denies(retry) => Ok(Decision::counted(false, 0, retry, retry)),
            }
        })
    }

    fn acquire<'a>(
        &'a self,
        _key: &'a str,
        _slots: &'a Slots,
        _holder: &'a str,
        _now: Option<Millis>,
    ) -> StoreFuture<'a> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            match self.behaviour {
                Behaviour::Fails => Err(timeout()),
                Behaviour::Denies(wait) => Ok(Decision::slots(false, 0, wait)),
            }
        })
    }

    fn defer<'a>(
        &'a self,
        _key: &'a str,
        _pace: &'a Pace,
        _hold_ms: u64,
        _now: Option<Millis>,
    ) -> HoldFuture<'a> {
        Box::pin(async { Err(timeout()) })
    }

    fn charge<'a>(
        &'a self,
        _key: &'a str,
        _alg: &'a Algorithm,
        _amount: i64,
        _now: Option<Millis>,
    ) -> ChargeFuture<'a> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            match self.behaviour {
                Behaviour::Fails => Err(timeout()),
                Behaviour::Denies(_) => Ok(None),
            }
        })
    }

    fn peek<'a>(&'a self, _key: &'a str, _alg: &'a Algorithm) -> StoreFuture<'a> {
        Box::pin(async { Err(timeout()) })
    }

    fn forget<'a>(&'a self, _key: &'a str) -> GiveBackFuture<'a> {
        Box::pin(async { Err(timeout()) })
    }

    fn resets<'a>(&'a self, _key: &'a str, _bump: bool) -> HoldFuture<'a> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err(timeout()) })
    }

    fn publish<'a>(&'a self, _key: &'a str, _id: &'a str, _blob: &'a [u8]) -> HoldFuture<'a> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err(timeout()) })
    }

    fn ready(&self) -> ReadyFuture<'_> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Err(timeout()) })
    }
}

fn guarded(
    behaviour: Behaviour,
    delay: Duration,
    on_error: OnError,
    instances: u32,
) -> (GuardedStore, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let fake = Fake {
        behaviour,
        delay,
        calls: calls.clone(),
    };
    let store = GuardedStore::new(
        Arc::new(fake),
        on_error,
        NonZeroU32::new(instances).unwrap(),
        NonZeroUsize::new(1000).unwrap(),
    );
    (store, calls)
}

fn bucket(burst: u32) -> Algorithm {
    let rate = Rate::per_second(1.0 / 60.0).unwrap();
    Algorithm::TokenBucket(
        Bucket::new(rate, NonZeroU32::new(burst).unwrap(), NonZeroU32::MIN).unwrap(),
    )
}

/// The deny cache counts `retry_after` from when the answer arrived, not from when the call
/// started: a slow answer must not make the cached Retry-After early by the round trip. The
/// store is asked again when that wait is over, not before.
#[tokio::test(start_paused = true)]
async fn deny_cache_counts_retry_after_from_the_answer() {
    let delay = Duration::from_millis(200);
    let (store, calls) = guarded(Behaviour::Denies(1000), delay, OnError::Deny, 1);
    let alg = bucket(1);
    let first = store.check("k", &alg, None).await.unwrap();
    assert_eq!(first.retry_after_ms, 1000);
    let cached = store.check("k", &alg, None).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "second check not cached");
    assert!(!cached.allowed);
    assert_eq!(
        cached.retry_after_ms, 1000,
        "early by the round trip of 200 ms"
    );
    assert_eq!(store.stats().deny_cache_hits.load(Ordering::Relaxed), 1);
    tokio::time::advance(Duration::from_millis(999)).await;
    let last = store.check("k", &alg, None).await.unwrap();
    assert_eq!(last.retry_after_ms, 1, "{last:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "asked before the wait was over"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    store.check("k", &alg, None).await.unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "not asked again when it was"
    );
}

/// Answers to calls in flight together do not push the cached refusal later: a client told to
/// come back at the earliest time one of them named is not refused then by the cache. An
/// answer that must belong to a later spell replaces the entry; a late answer from an earlier
/// spell is ignored.
#[test]
fn deny_cache_keeps_the_earliest_end_of_one_spell() {
    let cache = DenyCache::new();
    let alg = bucket(1);
    let refused = |retry| Decision::counted(false, 0, retry, retry);
    let ms = Duration::from_millis;
    let t0 = Instant::now();
    let retry_at = |now: Instant| cache.get("k", &alg, now).map(|d| d.retry_after_ms);
    // sent together at t0; answered at +10 ms (ends in [1000, 1010]) and at +30 ms, decided a
    // little later ([990, 1020]): one spell, the earlier end stands
    cache.insert("k", &alg, &refused(1000), t0, t0 + ms(10));
    cache.insert("k", &alg, &refused(990), t0, t0 + ms(30));
    assert_eq!(
        retry_at(t0 + ms(30)),
        Some(980),
        "the first answer's end stands"
    );
    assert_eq!(retry_at(t0 + ms(1009)), Some(1));
    assert_eq!(
        retry_at(t0 + ms(1010)),
        None,
        "asked again when the first answer said"
    );
    // a spell that cannot be the cached one ([720, 740] after [500, 510]): it replaces it
    cache.insert("k", &alg, &refused(500), t0, t0 + ms(10));
    cache.insert("k", &alg, &refused(700), t0 + ms(20), t0 + ms(40));
    assert_eq!(retry_at(t0 + ms(40)), Some(700));
    // a late answer of a call sent before the spell ([600, 650]): ignored
    cache.insert("k", &alg, &refused(600), t0, t0 + ms(50));
    assert_eq!(retry_at(t0 + ms(50)), Some(690));
    // an entry already over does not bound a new one, though their ranges meet
    cache.insert("k", &alg, &refused(300), t0, t0 + ms(800));
    assert_eq!(retry_at(t0 + ms(800)), Some(300));
}

/// The deny cache's count of entries follows its shards: a key cached twice counts once, an
/// entry found over is dropped and uncounted, so a cache emptied again is skipped without a lock.
#[test]
fn deny_cache_counts_its_entries() {
    let cache = DenyCache::new();
    let alg = bucket(1);
    let refused = |retry| Decision::counted(false, 0, retry, retry);
    let ms = Duration::from_millis;
    let t0 = Instant::now();
    let count = || cache.entries.load(Ordering::Relaxed);
    assert_eq!(count(), 0);
    cache.insert("a", &alg, &refused(100), t0, t0);
    cache.insert("a", &alg, &refused(100), t0, t0 + ms(1));
    cache.insert("b", &alg, &refused(50), t0, t0);
    assert_eq!(count(), 2, "two keys");
    assert!(cache.get("a", &alg, t0 + ms(60)).is_some());
    assert!(cache.get("b", &alg, t0 + ms(60)).is_none(), "b is over");
    assert_eq!(count(), 1, "b dropped");
    assert!(cache.get("a", &alg, t0 + ms(200)).is_none());
    assert_eq!(count(), 0, "empty again");
    assert!(cache.get("b", &alg, t0 + ms(200)).is_none());
    assert_eq!(count(), 0, "a miss on an empty cache changes nothing");
}

/// The store rounds `retry_after` up to a whole ms, so an answer's spell may end up to 1 ms
/// before `sent + retry_after`: two answers naming the same end from either side of a ms
/// boundary are one spell, not two (a later answer must not push the entry past the earlier
/// one's end and refuse the client it told to come back then — seen in the flood test).
#[test]
fn deny_cache_allows_for_the_stores_rounding_up() {
    let cache = DenyCache::new();
    let alg = bucket(1);
    let refused = |retry| Decision::counted(false, 0, retry, retry);
    let us = Duration::from_micros;
    let t0 = Instant::now();
    // the spell ends at t0 + 1000.1 ms: decided at t0 + 0.1 ms (999.9 ms to go, told 1000),
    // answered at t0 + 0.2 ms
    cache.insert("k", &alg, &refused(1000), t0, t0 + us(200));
    // decided at t0 + 500.95 ms (499.15 ms to go, told 500): sent at t0 + 500.9 ms
    cache.insert("k", &alg, &refused(500), t0 + us(500_900), t0 + us(501_000));
    let retry_at = |now: Instant| cache.get("k", &alg, now).map(|d| d.retry_after_ms);
    assert_eq!(
        retry_at(t0 + us(1_000_300)),
        None,
        "refused when the first answer said to come back"
    );
}

/// A long refusal is answered from the cache for 10 s, then the store is asked again (a bucket
/// reset by hand, an upstream hold lifted, is seen then), with the cached wait true meanwhile.
#[test]
fn deny_cache_asks_again_after_ten_seconds() {
    let cache = DenyCache::new();
    let alg = bucket(1);
    let hour = 3_600_000;
    let t0 = Instant::now();
    cache.insert("k", &alg, &Decision::counted(false, 0, hour, hour), t0, t0);
    let at = |s| cache.get("k", &alg, t0 + Duration::from_secs(s));
    assert_eq!(at(9).map(|d| d.retry_after_ms), Some(hour - 9000));
    assert!(at(10).is_none(), "asked again");
}

/// A caller that passes its own `now` (a replay) is never answered from the real-time cache.
#[tokio::test]
async fn given_now_bypasses_the_deny_cache() {
    let (store, calls) = guarded(Behaviour::Denies(60_000), Duration::ZERO, OnError::Deny, 1);
    let alg = bucket(1);
    for now in [1.0e12, 1.0e12 + 120_000.0] {
        assert!(!store.check("k", &alg, Some(now)).await.unwrap().allowed);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// With a failing store the breaker lets [`TRIP_AFTER`] calls through, then none; `allow`
/// admits every request meanwhile.
#[tokio::test]
async fn breaker_keeps_calls_from_a_failing_store() {
    let (store, calls) = guarded(Behaviour::Fails, Duration::ZERO, OnError::Allow, 1);
    let alg = bucket(2);
    for _ in 0..20 {
        assert!(store.check("k", &alg, None).await.unwrap().allowed);
    }
    assert_eq!(calls.load(Ordering::SeqCst), TRIP_AFTER as usize);
    assert!(store.breaker_open());
    let skipped = store.stats().skipped.load(Ordering::Relaxed);
    assert_eq!(skipped, 20 - u64::from(TRIP_AFTER));
}

/// `deny` passes the store's error up (the proxy answers 503), then `CircuitOpen` once open.
#[tokio::test]
async fn deny_fails_closed() {
    let (store, _) = guarded(Behaviour::Fails, Duration::ZERO, OnError::Deny, 1);
    let alg = bucket(2);
    for _ in 0..TRIP_AFTER {
        let e = store.check("k", &alg, None).await.unwrap_err();
        assert!(matches!(e, StoreError::Timeout(_)), "{e}");
    }
    let e = store.check("k", &alg, None).await.unwrap_err();
    assert!(matches!(e, StoreError::CircuitOpen), "{e}");
}

/// `local` with `instances: 2` decides in process with half of the burst.
#[tokio::test]
async fn local_enforces_this_instances_share() {
    let (store, _) = guarded(Behaviour::Fails, Duration::ZERO, OnError::Local, 2);
    let alg = bucket(10);
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += usize::from(store.check("k", &alg, None).await.unwrap().allowed);
    }
    assert_eq!(admitted, 5);
    let denied = store.check("k", &alg, None).await.unwrap();
    assert!(denied.retry_after_ms > 0, "{denied:?}");
}

fn slots(limit: u32) -> Slots {
    Slots::new(NonZeroU32::new(limit).unwrap(), Duration::from_secs(10)).unwrap()
}

/// A concurrency refusal is never remembered: a slot can free at any moment, so every acquire
/// and every look asks the store.
#[tokio::test]
async fn a_concurrency_refusal_is_never_cached() {
    let (store, calls) = guarded(Behaviour::Denies(900), Duration::ZERO, OnError::Deny, 1);
    let slots = slots(1);
    for holder in ["a", "b"] {
        let refused = store.acquire("k", &slots, holder, None).await.unwrap();
        assert!(!refused.allowed && refused.retry_after_ms == 900);
    }
    let look = Algorithm::Concurrency(slots);
    for _ in 0..2 {
        assert!(store.check("k", &look, None).await.is_ok());
        assert!(store.cached_denial("k", &look).is_none());
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "every call asked the store"
    );
}

/// `local` with `instances: 2` holds half of the slots in process, rounded up, and frees one
/// when it is released.
#[tokio::test]
async fn local_holds_this_instances_share_of_the_slots() {
    let (store, _) = guarded(Behaviour::Fails, Duration::ZERO, OnError::Local, 2);
    let slots = slots(3);
    for holder in ["a", "b"] {
        let taken = store.acquire("k", &slots, holder, None).await.unwrap();
        assert!(taken.allowed && taken.share.is_some(), "{taken:?}");
    }
    assert!(!store.acquire("k", &slots, "c", None).await.unwrap().allowed);
    let a = ["a".to_owned()];
    // (the fallback releases too, whatever the shared store answers)
    store.release("k", &slots, &a, None).await.unwrap();
    assert!(store.acquire("k", &slots, "c", None).await.unwrap().allowed);
}

/// A slow failing store costs at most one timeout per call, and none once the breaker is open.
#[tokio::test(start_paused = true)]
async fn open_breaker_adds_no_latency() {
    let delay = Duration::from_millis(100);
    let (store, _) = guarded(Behaviour::Fails, delay, OnError::Allow, 1);
    let alg = bucket(2);
    for _ in 0..TRIP_AFTER {
        store.check("k", &alg, None).await.unwrap();
    }
    let started = Instant::now();
    for _ in 0..10 {
        store.check("k", &alg, None).await.unwrap();
    }
    // (on the paused clock only the fake's delay moves time)
    assert_eq!(started.elapsed(), Duration::ZERO);
}

/// The open breaker keeps every call from the store for the whole cool-down on the policy's
/// own clock, then lets one probe through; a failed probe starts another cool-down.
#[tokio::test(start_paused = true)]
async fn open_breaker_probes_the_store_after_the_cool_down() {
    let (store, calls) = guarded(Behaviour::Fails, Duration::ZERO, OnError::Allow, 1);
    let alg = bucket(2);
    let calls = || calls.load(Ordering::SeqCst);
    for _ in 0..TRIP_AFTER {
        store.check("k", &alg, None).await.unwrap();
    }
    assert!(store.breaker_open());
    for probes in 1..=2 {
        tokio::time::advance(COOL_DOWN - Duration::from_millis(1)).await;
        store.check("k", &alg, None).await.unwrap();
        let before = TRIP_AFTER as usize + probes - 1;
        assert_eq!(calls(), before, "probed before the cool-down was over");
        tokio::time::advance(Duration::from_millis(1)).await;
        store.check("k", &alg, None).await.unwrap();
        store.check("k", &alg, None).await.unwrap();
        assert_eq!(calls(), before + 1, "not one probe");
        assert!(store.breaker_open(), "the failed probe closed it");
    }
}

/// The console's watch of the reset count never takes a cool-down's one probe: past the
/// cool-down, the probe is still there for `/readyz`, which then finds the store out.
#[tokio::test(start_paused = true)]
async fn a_watch_of_the_reset_count_leaves_the_probe_to_readyz() {
    let (store, calls) = guarded(Behaviour::Fails, Duration::ZERO, OnError::Deny, 1);
    let alg = bucket(2);
    for _ in 0..TRIP_AFTER {
        let _ = store.check("k", &alg, None).await;
    }
    assert!(store.breaker_open());
    tokio::time::advance(COOL_DOWN).await;
    let before = calls.load(Ordering::SeqCst);
    let read = store.resets("resets", false).await;
    assert!(matches!(read, Err(StoreError::CircuitOpen)), "{read:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        before,
        "the watch took the probe"
    );
    let ready = store.ready().await;
    assert!(!matches!(ready, Err(StoreError::CircuitOpen)), "{ready:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        before + 1,
        "readyz did not probe"
    );
}

/// The fleet's publication is a background caller too: while the breaker is open it waits,
/// past the cool-down as well, and leaves the probe to a request. Its failures count towards
/// opening the breaker as any call's.
#[tokio::test(start_paused = true)]
async fn a_publication_to_the_fleet_leaves_the_probe_to_requests() {
    let (store, calls) = guarded(Behaviour::Fails, Duration::ZERO, OnError::Allow, 1);
    for _ in 0..TRIP_AFTER {
        let _ = store.publish("{t:fleet}", "a", b"{}").await;
    }
    assert!(store.breaker_open(), "failed publications count");
    tokio::time::advance(COOL_DOWN).await;
    let before = calls.load(Ordering::SeqCst);
    for _ in 0..3 {
        let published = store.publish("{t:fleet}", "a", b"{}").await;
        assert!(
            matches!(published, Err(StoreError::CircuitOpen)),
            "{published:?}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), before, "took the probe");
    let _ = store.check("k", &bucket(2), None).await;
    assert_eq!(calls.load(Ordering::SeqCst), before + 1, "no probe left");
}

/// A deny-cache entry applies only to the limit that denied: once a reload changes the
/// limit's parameters, the store decides again.
#[tokio::test]
async fn deny_cache_entry_does_not_outlive_a_changed_limit() {
    let (store, calls) = guarded(Behaviour::Denies(60_000), Duration::ZERO, OnError::Deny, 1);
    for alg in [bucket(1), bucket(1), bucket(100)] {
        assert!(!store.check("k", &alg, None).await.unwrap().allowed);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A denial with an absurd wait (a garbled reply) neither panics nor admits.
#[tokio::test]
async fn huge_retry_after_does_not_panic() {
    let (store, _) = guarded(
        Behaviour::Denies(u64::MAX),
        Duration::ZERO,
        OnError::Deny,
        1,
    );
    let alg = bucket(1);
    for _ in 0..2 {
        let d = store.check("k", &alg, None).await.unwrap();
        assert!(!d.allowed && d.retry_after_ms > 0, "{d:?}");
    }
}

/// What `f` logs, as text lines.
fn logged(f: impl FnOnce()) -> String {
    #[derive(Clone)]
    struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Capture {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .expect("not poisoned")
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let capture = Capture(Arc::default());
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let bytes = capture.0.lock().expect("not poisoned").clone();
    String::from_utf8(bytes).expect("UTF-8 log")
}

/// Failed calls that never add up to a trip (each followed by a success: a Cluster node down
/// while the others answer) are logged, but at most once in ten seconds, with how many failed
/// meanwhile; errors of one call (Redis answered) the same way.
#[test]
fn failures_that_do_not_trip_are_logged_at_most_every_ten_seconds() {
    let b = Breaker::default();
    let text = logged(|| {
        for at in [1, 2, 3, 5_000, 10_000, 10_001, 10_002] {
            b.failure(Permit::Closed, at, &timeout());
            b.success();
        }
        b.note_failed(20_001, &wrongtype());
    });
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].contains("store call failed"), "{text}");
    assert!(
        lines[0].contains("kind=\"timeout\"") || lines[0].contains("kind=timeout"),
        "{text}"
    );
    assert!(lines[0].contains("failed_since_last_line=0"), "{text}");
    assert!(lines[1].contains("failed_since_last_line=4"), "{text}");
    assert!(lines[2].contains("WRONGTYPE"), "{text}");
    assert!(!b.is_open());
}

/// A charge forgets the key's remembered refusal: a debt (or a give-back) changes when the key
/// is admitted again, so the next check asks the store, whose answer covers the debt.
#[tokio::test]
async fn a_charge_forgets_the_remembered_refusal() {
    let (store, calls) = guarded(Behaviour::Denies(60_000), Duration::ZERO, OnError::Deny, 1);
    let alg = bucket(1).charged();
    assert!(!store.check("k", &alg, None).await.unwrap().allowed);
    assert!(!store.check("k", &alg, None).await.unwrap().allowed);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the second refusal was remembered"
    );
    store.charge("k", &alg, 40, None).await.unwrap();
    assert!(!store.check("k", &alg, None).await.unwrap().allowed);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "asked again after the charge"
    );
}

/// A charge the store fails is not tried again; with `local` the fallback is charged, so
/// it knows of the debt while the store is out.
#[tokio::test]
async fn a_failed_charge_goes_to_the_local_fallback_once() {
    let (store, calls) = guarded(Behaviour::Fails, Duration::ZERO, OnError::Local, 1);
    let alg = bucket(10).charged();
    assert!(store.check("k", &alg, None).await.unwrap().allowed);
    assert!(store.charge("k", &alg, 20, None).await.is_err());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "one check, one charge: no retry"
    );
    let in_debt = store.check("k", &alg, None).await.unwrap();
    assert!(!in_debt.allowed, "{in_debt:?}");
    // 21 tokens owed of 10 at one a minute: 12 minutes before one is free
    assert!(in_debt.retry_after_ms > 11 * 60_000, "{in_debt:?}");
}

//! What happens when the shared store cannot answer, and the two things that keep Redis off the
//! hot path: the circuit breaker and the deny cache. docs/operations.md describes the failure
//! policy for operators.
//!
//! [`GuardedStore`] wraps the Redis store. A call that fails or passes the timeout applies
//! `on_error`: `allow` (fail open), `deny` (fail closed: the error goes up and the proxy answers
//! 503) or `local` (the same algorithm in process, each instance enforcing 1/`instances` of the
//! limit). After [`TRIP_AFTER`] consecutive failures the breaker opens: Redis is skipped for
//! [`COOL_DOWN`], then one probe is let through; its success closes the breaker. A key that the
//! store denied is denied locally until its `retry_after` (the deny cache), without a Redis call;
//! the entry counts from when the answer arrived (so it is never early) and holds only for the
//! limit that denied (a reload that changes the limit asks the store again). Callers that pass
//! their own `now` (replays) bypass the deny cache, which runs on the real clock.

use std::future::Future;
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lru::LruCache;
// Tokio's clock is std's unless a test pauses it: the cool-down and the deny cache's expiry are
// then driven by `tokio::time::advance` instead of sleeps.
use tokio::time::Instant;

use super::{
    ChargeFuture, FleetFuture, GiveBackFuture, HoldFuture, MemoryStore, RateFuture, ReadyFuture,
    Store, StoreError, StoreFuture, StoreObserver,
};
use crate::limit::{Aimd, Algorithm, Decision, Millis, Pace, Report, Slots};

/// Consecutive failures that open the breaker.
pub const TRIP_AFTER: u32 = 5;
/// How long an open breaker skips the store before probing it again.
pub const COOL_DOWN: Duration = Duration::from_secs(1);
/// Deny-cache capacity: enough for a large flood of distinct denied clients; beyond it the
/// least recently denied are forgotten (they then cost one store call each).
const DENY_CACHE_KEYS: usize = 100_000;

/// What to do when the store fails (`store.on_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// fail open: admit the request
    Allow,
    /// fail closed: the proxy answers 503
    Deny,
    /// decide with the in-process algorithm (1/`instances` of each limit)
    Local,
}

/// Counters the policy keeps; tests read them.
#[derive(Debug, Default)]
pub struct PolicyStats {
    /// denials answered from the deny cache
    pub deny_cache_hits: AtomicU64,
    /// calls the open breaker kept from the store
    pub skipped: AtomicU64,
}

/// The Redis store behind the failure policy, breaker and deny cache.
pub struct GuardedStore {
    primary: Arc<dyn Store>,
    on_error: OnError,
    /// with `local`, each instance enforces 1/instances of every limit
    instances: NonZeroU32,
    local: MemoryStore,
    breaker: Breaker,
    deny_cache: DenyCache,
    stats: Arc<PolicyStats>,
    observer: Option<Arc<dyn StoreObserver>>,
}

impl GuardedStore {
    /// Wraps `primary`; `max_keys` bounds the local fallback's memory.
    pub fn new(
        primary: Arc<dyn Store>,
        on_error: OnError,
        instances: NonZeroU32,
        max_keys: NonZeroUsize,
    ) -> Self {
        GuardedStore {
            primary,
            on_error,
            instances,
            local: MemoryStore::new(max_keys),
            breaker: Breaker::default(),
            deny_cache: DenyCache::new(),
            stats: Arc::default(),
            observer: None,
        }
    }

    /// Reports every store call and deny-cache hit to `observer` (the app's metrics).
    pub fn with_observer(mut self, observer: Arc<dyn StoreObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The counters, shared.
    pub fn stats(&self) -> Arc<PolicyStats> {
        self.stats.clone()
    }

    /// True while the breaker keeps calls from the store.
    pub fn breaker_open(&self) -> bool {
        self.breaker.is_open()
    }

    async fn decide(
        &self,
        key: &str,
        alg: &Algorithm,
        now: Option<Millis>,
    ) -> Result<Decision, StoreError> {
        // The deny cache runs on the real clock: a caller replaying its own times bypasses it.
        // (the clock is read only when there is something cached to compare it with)
        if now.is_none() {
            if let Some(d) = self.remembered(key, alg) {
                return Ok(d);
            }
        }
        let error = match self.breaker.allow_now() {
            Some(permit) => match self.call(key, alg, now, permit).await {
                Ok(d) => return Ok(d),
                Err(e) => e,
            },
            None => self.skipped(),
        };
        match self.on_error {
            OnError::Allow => Ok(Decision::counted(true, alg.policy().0, 0, 0)),
            OnError::Deny => Err(error),
            OnError::Local => {
                let mut d = self.local.decide(key, &alg.share(self.instances), now);
                d.share = (self.instances.get() > 1).then_some(self.instances);
                Ok(d)
            }
        }
    }

    /// One call to the store, reported to the breaker (also when the caller gives up on it).
    async fn call(
        &self,
        key: &str,
        alg: &Algorithm,
        now: Option<Millis>,
        permit: Permit,
    ) -> Result<Decision, StoreError> {
        let _in_flight = InFlight {
            breaker: &self.breaker,
            permit,
        };
        let started = Instant::now();
        let result = self.primary.check(key, alg, now).await;
        if let Some(observer) = &self.observer {
            match &result {
                Ok(d) if d.leased => observer.leased(),
                _ => observer.call(started.elapsed(), result.as_ref().err()),
            }
        }
        self.breaker.record(permit, result.as_ref().err());
        if let Ok(d) = &result {
            // (a concurrency slot can free at any moment: its refusal is never remembered)
            let slots = matches!(alg, Algorithm::Concurrency(_));
            if now.is_none() && !d.allowed && d.retry_after_ms > 0 && !slots {
                // The store counted `retry_after` from the moment it decided, which is no
                // later than now: counting it from now keeps the cached Retry-After from
                // ever being early (counting from before the call would make it early by
                // the round trip, up to the whole timeout).
                self.deny_cache.insert(key, alg, d, started, Instant::now());
            }
        }
        result
    }
}

impl GuardedStore {
    /// The deny cache's answer for `key` under `alg` on the real clock, counted as a hit (the
    /// clock is read only when something is cached to compare it with).
    fn remembered(&self, key: &str, alg: &Algorithm) -> Option<Decision> {
        if self.deny_cache.is_empty() {
            return None;
        }
        let d = self.deny_cache.get(key, alg, Instant::now())?;
        self.stats.deny_cache_hits.fetch_add(1, Ordering::Relaxed);
        if let Some(observer) = &self.observer {
            observer.deny_cache_hit();
        }
        Some(d)
    }

    /// A call the open breaker keeps from the shared store, counted: its error.
    fn skipped(&self) -> StoreError {
        self.stats.skipped.fetch_add(1, Ordering::Relaxed);
        if let Some(observer) = &self.observer {
            observer.skipped();
        }
        StoreError::CircuitOpen
    }

    /// `call` to the shared store when the breaker lets it go in `caller`'s role, its outcome
    /// recorded; [`StoreError::CircuitOpen`] when it does not (counted as skipped for a
    /// request's call).
    async fn through_breaker<T, F: Future<Output = Result<T, StoreError>>>(
        &self,
        call: impl FnOnce() -> F,
        caller: Caller,
    ) -> Result<T, StoreError> {
        // A background caller waits out an open breaker: a cool-down's one probe is for a
        // request or `/readyz`, which act on what it finds.
        if caller == Caller::Background && self.breaker.is_open() {
            return Err(StoreError::CircuitOpen);
        }
        let Some(permit) = self.breaker.allow_now() else {
            return Err(if caller == Caller::Request {
                self.skipped()
            } else {
                StoreError::CircuitOpen
            });
        };
        let _in_flight = InFlight {
            breaker: &self.breaker,
            permit,
        };
        let result = call().await;
        self.breaker.record(permit, result.as_ref().err());
        result
    }
}

/// Who makes a call to the shared store, for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// a request's: one the open breaker keeps back is counted as skipped
    Request,
    /// an operator's, `/readyz`'s, or the upkeep of what requests hold: may be the probe,
    /// and one kept back is not counted
    Uncounted,
    /// a task of the instance's own that runs whatever the traffic (the console's watch of
    /// the reset count, the fleet's publication): never the probe, so while the breaker is
    /// open it waits
    Background,
}

impl Store for GuardedStore {
    fn breaker(&self) -> Option<&'static str> {
        Some(if self.breaker_open() {
            "open"
        } else {
            "closed"
        })
    }

    fn ready(&self) -> ReadyFuture<'_> {
        Box::pin(async move {
            // with a fallback (allow or local) requests are served even while Redis is out
            if self.on_error != OnError::Deny {
                return Ok(());
            }
            // Without one, the store is asked, through the breaker like a request's call: a
            // probe that finds Redis back closes the breaker, so an instance that a load
            // balancer stopped sending requests to (because this said no) still comes back.
            // Not a request's call, a probe kept from the store is not counted in the store's
            // error metrics.
            self.through_breaker(move || self.primary.ready(), Caller::Uncounted)
                .await
        })
    }

    fn check<'a>(
        &'a self,
        key: &'a str,
        alg: &'a Algorithm,
        now: Option<Millis>,
    ) -> StoreFuture<'a> {
        Box::pin(self.decide(key, alg, now))
    }

    fn cached_denial(&self, key: &str, alg: &Algorithm) -> Option<Decision> {
        self.remembered(key, alg)
    }

    fn acquire<'a>(
        &'a self,
        key: &'a str,
        slots: &'a Slots,
        holder: &'a str,
        now: Option<Millis>,
    ) -> StoreFuture<'a> {
        Box::pin(self.take_slot(key, slots, holder, now))
    }

    fn renew<'a>(
        &'a self,
        key: &'a str,
        slots: &'a Slots,
        holders: &'a [String],
        now: Option<Millis>,
    ) -> HoldFuture<'a> {
        Box::pin(self.slots_count(key, slots, holders, now, false))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        slots: &'a Slots,
        holders: &'a [String],
        now: Option<Millis>,
    ) -> HoldFuture<'a> {
        Box::pin(self.slots_count(key, slots, holders, now, true))
    }

    fn peek<'a>(&'a self, key: &'a str, alg: &'a Algorithm) -> StoreFuture<'a> {
        Box::pin(self.through_breaker(move || self.primary.peek(key, alg), Caller::Uncounted))
    }

    fn forget<'a>(&'a self, key: &'a str) -> GiveBackFuture<'a> {
        Box::pin(async move {
            // the fallback's state and this instance's refusal go too, whatever Redis says
            self.deny_cache.remove(key);
            self.local.remove(key);
            self.through_breaker(move || self.primary.forget(key), Caller::Uncounted)
                .await
        })
    }

    fn resets<'a>(&'a self, key: &'a str, bump: bool) -> HoldFuture<'a> {
        // A read of the count is the console's watch, twice a second; a bump, an operator's.
        let caller = if bump {
            Caller::Uncounted
        } else {
            Caller::Background
        };
        Box::pin(self.through_breaker(move || self.primary.resets(key, bump), caller))
    }

    fn publish<'a>(&'a self, key: &'a str, id: &'a str, blob: &'a [u8]) -> HoldFuture<'a> {
        // once a second, whatever the traffic: a background caller
        let call = move || self.primary.publish(key, id, blob);
        Box::pin(self.through_breaker(call, Caller::Background))
    }

    fn fleet<'a>(&'a self, key: &'a str) -> FleetFuture<'a> {
        Box::pin(self.through_breaker(move || self.primary.fleet(key), Caller::Uncounted))
    }

    /// Whatever `on_error` says, a failed call is an error: the caller decides what to pace
    /// at meanwhile (its share of the last rate the fleet agreed on).
    fn adapt<'a>(
        &'a self,
        key: &'a str,
        aimd: &'a Aimd,
        report: Report,
        now: Option<Millis>,
    ) -> RateFuture<'a> {
        Box::pin(self.through_breaker(
            move || self.primary.adapt(key, aimd, report, now),
            Caller::Uncounted,
        ))
    }

    fn forget_local(&self) {
        self.deny_cache.clear();
        self.primary.forget_local();
    }

    fn give_back<'a>(
        &'a self,
        key: &'a str,
        alg: &'a Algorithm,
        age_ms: f64,
        now: Option<Millis>,
    ) -> GiveBackFuture<'a> {
        Box::pin(async move {
            // to the store that decided: the shared one, or (it failing, with `local`) the
            // fallback; with `allow` or `deny` nothing was taken on a failure
            let shared = self
                .through_breaker(
                    move || self.primary.give_back(key, alg, age_ms, now),
                    Caller::Request,
                )
                .await;
            if shared.is_err() && self.on_error == OnError::Local {
                self.local
                    .undo(key, &alg.share(self.instances), age_ms, now);
            }
            shared
        })
    }

    fn charge<'a>(
        &'a self,
        key: &'a str,
        alg: &'a Algorithm,
        amount: i64,
        now: Option<Millis>,
    ) -> ChargeFuture<'a> {
        Box::pin(async move {
            // A remembered refusal may now be too long (a give-back) or too short (more debt):
            // the next check asks the store, whose answer covers the debt.
            self.deny_cache.remove(key);
            let started = Instant::now();
            let shared = self
                .through_breaker(
                    move || self.primary.charge(key, alg, amount, now),
                    Caller::Request,
                )
                .await;
            // (a call the breaker kept back is counted as skipped already)
            let called = !matches!(shared, Err(StoreError::CircuitOpen));
            if let Some(observer) = self.observer.as_ref().filter(|_| called) {
                observer.call(started.elapsed(), shared.as_ref().err());
            }
            // Not tried again: the charge is owed once, and a retry after a timeout could
            // charge it twice. With `local` the fallback is charged too, as it may have
            // decided the check.
            if shared.is_err() && self.on_error == OnError::Local {
                self.local.add(key, &alg.share(self.instances), amount, now);
            }
            shared
        })
    }

    fn defer<'a>(
        &'a self,
        key: &'a str,
        pace: &'a Pace,
        hold_ms: u64,
        now: Option<Millis>,
    ) -> HoldFuture<'a> {
        Box::pin(async move {
            // The local schedule holds too, so the fallback obeys the upstream during an outage.
            let local = self.local.hold(key, pace, hold_ms, now);
            let shared = self.through_breaker(
                move || self.primary.defer(key, pace, hold_ms, now),
                Caller::Request,
            );
            Ok(shared.await.unwrap_or(local))
        })
    }
}

/// Consecutive-failure circuit breaker, lock-free on the hot path.
///
/// Closed: every call goes to the store; [`TRIP_AFTER`] failures in a row open it. Open: no call
/// goes until the cool-down is over; then exactly one call, the probe, goes (half-open). The
/// probe's success closes the breaker, its failure opens it for another cool-down. Times are
/// milliseconds on the breaker's own clock ([`Breaker::now`]), passed in so tests can drive it.
#[derive(Default)]
struct Breaker {
    failures: AtomicU32,
    /// ms on [`Breaker::now`] until which the breaker is open; 0: closed
    open_until: AtomicU64,
    /// the half-open probe is in flight; only the probe's [`InFlight`] clears it
    probing: AtomicBool,
    epoch: OnceInstant,
    /// ms on [`Breaker::now`] of the last failed call logged (0: none yet), and the failed
    /// calls since that were not: see [`Breaker::note_failed`]
    logged_at: AtomicU64,
    unlogged: AtomicU64,
}

/// Failed calls that do not open the breaker (a Cluster node down while the others answer, a
/// key Redis refuses) are logged at most once in this many ms.
const FAILED_CALL_LOG_MS: u64 = 10_000;

/// Why a call may go to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Permit {
    /// the breaker is closed
    Closed,
    /// the breaker is open and this call is its one half-open probe
    Probe,
}

impl Breaker {
    /// The breaker's clock: ms since it was made, never 0.
    fn now(&self) -> u64 {
        self.epoch.ms()
    }

    /// Whether a call made at `now` may go to the store, and in which role.
    fn allow_call(&self, now: u64) -> Option<Permit> {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Some(Permit::Closed);
        }
        // cool-down over: let exactly one probe through
        (now >= until && !self.probing.swap(true, Ordering::AcqRel)).then_some(Permit::Probe)
    }

    /// [`Breaker::allow_call`] now; the clock is read only while the breaker is open.
    fn allow_now(&self) -> Option<Permit> {
        if !self.is_open() {
            return Some(Permit::Closed);
        }
        self.allow_call(self.now())
    }

    fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    fn success(&self) {
        // read first: on the hot path both are already 0, and a read leaves the cache line
        // shared between the workers where a write would take it from the others every call
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Release);
        }
        if self.open_until.load(Ordering::Acquire) != 0
            && self.open_until.swap(0, Ordering::AcqRel) != 0
        {
            tracing::info!("store reachable again: circuit breaker closed");
        }
    }

    /// Records the outcome of a call made with `permit`: an error that says the store is out
    /// counts as a failure; a success, or an error of one key or call (Redis answered), as a
    /// success.
    fn record(&self, permit: Permit, error: Option<&StoreError>) {
        match error {
            Some(e) if e.is_skipped() => self.note_failed(self.now(), e),
            Some(e) if e.is_outage() => self.failure(permit, self.now(), e),
            Some(e) => {
                self.success();
                self.note_failed(self.now(), e);
            }
            None => self.success(),
        }
    }

    fn failure(&self, permit: Permit, now: u64, error: &StoreError) {
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if permit == Permit::Probe || failures >= TRIP_AFTER {
            let until = now + COOL_DOWN.as_millis() as u64;
            if self.open_until.swap(until, Ordering::AcqRel) == 0 {
                tracing::warn!(%error, "store failing: circuit breaker open, applying on_error for {COOL_DOWN:?} at a time");
            }
        } else {
            self.note_failed(now, error);
        }
    }

    /// Logs a failed call that does not open the breaker, at most once in
    /// [`FAILED_CALL_LOG_MS`], with how many failed since the last line: failures that calls
    /// to the rest of the store keep from adding up (each success starts the count again)
    /// are seen in the log too, and one line in that time at most, not one a call.
    fn note_failed(&self, now: u64, error: &StoreError) {
        let last = self.logged_at.load(Ordering::Acquire);
        let due = last == 0 || now >= last + FAILED_CALL_LOG_MS;
        if !due
            || self
                .logged_at
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let since = self.unlogged.swap(0, Ordering::Relaxed);
        tracing::warn!(%error, kind = error.kind(), failed_since_last_line = since, "store call failed; applying on_error (such failures are logged at most every {}s)", FAILED_CALL_LOG_MS / 1000);
    }
}

/// A call in flight. Dropping it frees the probe slot: after the outcome is recorded (so that
/// a failed probe has pushed `open_until` forward before another probe may start), or when the
/// caller gives up on the call (a client that hangs up drops its request future). Without this
/// a dropped probe would leave `probing` set and the breaker open for good.
struct InFlight<'a> {
    breaker: &'a Breaker,
    permit: Permit,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.permit == Permit::Probe {
            self.breaker.probing.store(false, Ordering::Release);
        }
    }
}

/// Milliseconds since the breaker was made (never 0 once read, so 0 can mean "closed").
struct OnceInstant(Instant);

impl Default for OnceInstant {
    fn default() -> Self {
        OnceInstant(Instant::now())
    }
}

impl OnceInstant {
    fn ms(&self) -> u64 {
        self.0.elapsed().as_millis() as u64 + 1
    }
}

/// Keys recently denied by the store, with the instant until which they stay denied.
type DenyShard = Mutex<LruCache<Box<str>, Denied, foldhash::fast::RandomState>>;

struct DenyCache {
    shards: Box<[DenyShard]>,
    hasher: foldhash::fast::RandomState,
    /// entries in all the shards (changed under a shard's lock): with none, which is the case
    /// while no client is denied, a lookup neither hashes the key nor takes a lock
    entries: AtomicUsize,
}

#[derive(Clone, Copy)]
struct Denied {
    /// the latest the denied spell can end: the answer's `retry_after` counted from when it
    /// arrived (the store decided no later)
    until: Instant,
    /// the earliest it can end: `retry_after` counted from when the call was sent (the store
    /// decided no earlier)
    after: Instant,
    reset_at: Instant,
    /// the tokens the refusal said were held (fewer than the cost; 0 for a window): a snapshot,
    /// so later refusals from the cache may under-state them as tokens come back, never over
    remaining: u64,
    /// the limit that denied: after a reload changes it, the entry no longer applies
    alg: Algorithm,
    /// the store is asked again after this ([`TRUSTED_FOR`] after its last answer), also
    /// while the spell lasts
    trusted_until: Instant,
}

/// How long a refusal is answered from the deny cache before the store is asked again, however
/// long its wait: a flood still costs one store call per key per 10 s, and a bucket an operator
/// reset in Redis (or an upstream hold lifted) is seen within that time.
const TRUSTED_FOR: Duration = Duration::from_secs(10);

impl DenyCache {
    const SHARDS: usize = 16;

    fn new() -> DenyCache {
        let per = NonZeroUsize::new(DENY_CACHE_KEYS / Self::SHARDS).expect("non-zero");
        let shards = (0..Self::SHARDS)
            .map(|_| Mutex::new(LruCache::with_hasher(per, Default::default())))
            .collect();
        DenyCache {
            shards,
            hasher: Default::default(),
            entries: AtomicUsize::new(0),
        }
    }

    fn shard(&self, key: &str) -> &DenyShard {
        use std::hash::BuildHasher;
        &self.shards[self.hasher.hash_one(key) as usize % Self::SHARDS]
    }

    /// Forgets `key`'s refusal.
    fn remove(&self, key: &str) {
        let mut shard = self.shard(key).lock().unwrap_or_else(|e| e.into_inner());
        if shard.pop(key).is_some() {
            self.entries.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Forgets every refusal.
    fn clear(&self) {
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            let n = shard.len();
            shard.clear();
            self.entries.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Whether nothing is cached (then [`DenyCache::get`] has nothing to find).
    fn is_empty(&self) -> bool {
        self.entries.load(Ordering::Relaxed) == 0
    }

    fn get(&self, key: &str, alg: &Algorithm, now: Instant) -> Option<Decision> {
        if self.is_empty() {
            return None;
        }
        let mut shard = self.shard(key).lock().unwrap_or_else(|e| e.into_inner());
        let denied = *shard.peek(key)?;
        if denied.until <= now || denied.trusted_until <= now || denied.alg != *alg {
            if shard.pop(key).is_some() {
                self.entries.fetch_sub(1, Ordering::Relaxed);
            }
            return None;
        }
        let ms = |at: Instant| at.saturating_duration_since(now).as_micros().div_ceil(1000) as u64;
        let retry = ms(denied.until).max(1);
        Some(Decision::counted(
            false,
            denied.remaining,
            retry,
            ms(denied.reset_at).max(retry),
        ))
    }

    /// Caches the refusal `d` of a call sent at `sent` and answered at `now`.
    ///
    /// The store decided somewhere between `sent` and `now`, and rounded its wait up to a
    /// whole ms, so the denied spell ends in `[sent + retry_after - 1 ms, now + retry_after]`;
    /// the entry denies until the latter, never early. Calls in flight together may be answered out of order: when a cached entry's
    /// range and the new one overlap they can be the same spell, and the entry keeps the
    /// intersection (its `until` the earlier of the two, so a client told to come back at the
    /// earlier time is not refused then by this cache; early by at most a round trip if they
    /// were in fact two spells); when they do not overlap they are two spells, and the later
    /// one stands (an answer to an old call arriving late does not shorten a newer spell).
    fn insert(&self, key: &str, alg: &Algorithm, d: &Decision, sent: Instant, now: Instant) {
        // `Instant + Duration` panics on overflow (platform dependent): a wait too long to
        // represent is not cached.
        let retry = Duration::from_millis(d.retry_after_ms);
        let rounded = retry.saturating_sub(Duration::from_millis(1));
        let mut remaining = d.remaining;
        let (Some(mut until), Some(mut after), Some(mut reset_at)) = (
            now.checked_add(retry),
            sent.checked_add(rounded),
            now.checked_add(Duration::from_millis(d.reset_ms)),
        ) else {
            return;
        };
        let mut shard = self.shard(key).lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cached) = shard.peek(key) {
            if cached.alg == *alg && cached.until > now {
                if cached.until < after {
                    // an earlier spell, over before this one can end: replaced
                } else if until < cached.after {
                    return; // a late answer from before the cached spell
                } else {
                    until = until.min(cached.until);
                    after = after.max(cached.after);
                    reset_at = reset_at.min(cached.reset_at);
                    remaining = remaining.min(cached.remaining);
                }
            }
        }
        let denied = Denied {
            until,
            after,
            reset_at,
            remaining,
            alg: *alg,
            trusted_until: now.checked_add(TRUSTED_FOR).unwrap_or(until),
        };
        let before = shard.len();
        shard.put(key.into(), denied);
        if shard.len() > before {
            self.entries.fetch_add(1, Ordering::Relaxed);
        }
    }
}

mod slots;

#[cfg(test)]
mod tests;

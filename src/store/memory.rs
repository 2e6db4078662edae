//! The in-process store: the algorithms of [`crate::limit`] over a sharded, bounded map.
//!
//! Used as the `memory` backend and as the `local` fallback when Redis fails. Each shard is a
//! mutex-guarded LRU map: a `std::sync::Mutex` because the critical section is a hash lookup and
//! a few float operations, never held across an `.await`. Sharding by key hash keeps two cores
//! from contending on one lock. The bound (`max_keys`) evicts the least recently used key, and
//! a background task purges expired keys so idle clients cost nothing.

use std::hash::BuildHasher;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lru::LruCache;

use super::{
    ChargeFuture, Fleet, FleetFuture, GiveBackFuture, HoldFuture, Published, RateFuture, Store,
    StoreFuture, FLEET_STALE,
};
use crate::limit::adapt::{adapt, Adapted};
use crate::limit::{
    acquire, apply, charge, defer, give_back, release, renew, Aimd, Algorithm, Balance, Decision,
    Millis, Pace, Report, Slots, State,
};

type Hasher = foldhash::fast::RandomState;
/// One shard: an LRU map under its own lock.
type Shard = Mutex<LruCache<Box<str>, Entry, Hasher>>;

/// How often the background task sweeps every shard for expired keys. It sweeps one shard at
/// a time, spread over the period, so no sweep holds up the worker it runs on for long: with a
/// million keys one sweep of every shard held it up for over 100 ms (it clones and removes each
/// expired key), during which that worker served no one.
const PURGE_EVERY: Duration = Duration::from_secs(5);

/// In-process limiter state. Cheap to share behind an `Arc`.
pub struct MemoryStore {
    shards: Arc<Shards>,
    /// adaptive pacing rates with when each expires: one per adaptive upstream, so a plain
    /// map beside the shards (an expired one is dropped when next read)
    rates: Mutex<std::collections::HashMap<Box<str>, (Adapted, Millis)>>,
    /// the fleet: this instance's last publication, the only one a store in process sees
    published: Mutex<Option<Published>>,
    /// Dropping the store drops this sender, which wakes and ends the purge task at once.
    _stop_purge: tokio::sync::watch::Sender<()>,
}

struct Shards {
    /// the keys a shard holds at most (the least recently used goes)
    per_shard: usize,
    maps: Box<[Shard]>,
    hasher: Hasher,
    clock: Clock,
}

struct Entry {
    /// `None` once expired (until the purge removes the entry)
    state: Option<State>,
    /// clock time (ms) after which the state is equivalent to none
    expires_at: Millis,
}

/// Wall-clock milliseconds, read through a monotonic clock so that they never go backwards.
struct Clock {
    epoch_ms: f64,
    started: Instant,
}

impl Clock {
    fn new() -> Clock {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Clock {
            epoch_ms: since_epoch.as_secs_f64() * 1000.0,
            started: Instant::now(),
        }
    }

    fn now(&self) -> Millis {
        self.epoch_ms + self.started.elapsed().as_secs_f64() * 1000.0
    }
}

impl MemoryStore {
    /// A store holding at most about `max_keys` keys. Inside a Tokio runtime it also starts the
    /// task that purges expired keys; it ends when the store is dropped.
    pub fn new(max_keys: NonZeroUsize) -> MemoryStore {
        // One shard per ~1024 keys up to 64 shards (a power of two): small bounds stay exact
        // LRU, large ones spread the lock.
        let shard_count = (max_keys.get() / 1024)
            .clamp(1, 64)
            .next_power_of_two()
            .min(64);
        let per_shard = NonZeroUsize::new(max_keys.get().div_ceil(shard_count))
            .expect("max_keys >= 1, so each shard holds at least 1");
        // (unbounded maps kept to `per_shard` here: a bounded one would reserve its whole
        // bound up front, 16 GB for `max_keys: 10000000000`, before any key came)
        let maps = (0..shard_count)
            .map(|_| Mutex::new(LruCache::unbounded_with_hasher(Hasher::default())))
            .collect();
        let shards = Arc::new(Shards {
            per_shard: per_shard.get(),
            maps,
            hasher: Hasher::default(),
            clock: Clock::new(),
        });
        let (stop, stopped) = tokio::sync::watch::channel(());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(purge_task(Arc::downgrade(&shards), stopped));
        }
        MemoryStore {
            shards,
            rates: Mutex::default(),
            published: Mutex::default(),
            _stop_purge: stop,
        }
    }

    /// Decides one request at once (the memory store never waits).
    pub fn decide(&self, key: &str, alg: &Algorithm, now: Option<Millis>) -> Decision {
        self.with_state(key, now, |state, now| apply(alg, state, now))
    }

    /// Undoes an admitted check of `key` under `alg` made `age_ms` before `now`
    /// ([`crate::limit::give_back`]); whether anything was given back.
    pub fn undo(&self, key: &str, alg: &Algorithm, age_ms: f64, now: Option<Millis>) -> bool {
        self.with_state(key, now, |state, now| give_back(alg, state, now, age_ms))
    }

    /// Charges `amount` more to `key` under `alg` at `now` ([`crate::limit::charge`]); what
    /// the key holds after it, `None` for an algorithm that takes no charge.
    pub fn add(
        &self,
        key: &str,
        alg: &Algorithm,
        amount: i64,
        now: Option<Millis>,
    ) -> Option<Balance> {
        self.with_state(key, now, |state, now| charge(alg, state, now, amount))
    }

    /// Holds the pacing schedule at `key` until `hold_ms` from now (upstream back-pressure);
    /// returns the ms until its next free slot.
    pub fn hold(&self, key: &str, pace: &Pace, hold_ms: u64, now: Option<Millis>) -> u64 {
        self.with_state(key, now, |state, now| {
            defer(pace, state, now, hold_ms as f64)
        })
    }

    /// Takes a concurrency slot at `key` for `holder` ([`crate::limit::acquire`]).
    pub fn take_slot(&self, key: &str, s: &Slots, holder: &str, now: Option<Millis>) -> Decision {
        self.with_state(key, now, |state, now| acquire(s, state, now, holder))
    }

    /// Renews the leases of `holders` at `key`; how many held a slot.
    pub fn renew_slots(
        &self,
        key: &str,
        s: &Slots,
        holders: &[String],
        now: Option<Millis>,
    ) -> u64 {
        let holders: Vec<&str> = holders.iter().map(String::as_str).collect();
        self.with_state(key, now, |state, now| renew(s, state, now, &holders))
    }

    /// Frees the slots of `holders` at `key`; how many held one.
    pub fn free_slots(&self, key: &str, holders: &[String], now: Option<Millis>) -> u64 {
        let holders: Vec<&str> = holders.iter().map(String::as_str).collect();
        self.with_state(key, now, |state, now| release(state, now, &holders))
    }

    /// Applies `report` to the adaptive rate at `key` ([`crate::limit::adapt::adapt`]); the
    /// current rate.
    pub fn adapt_rate(&self, key: &str, aimd: &Aimd, report: Report, now: Option<Millis>) -> f64 {
        let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        let now = now.unwrap_or_else(|| self.shards.clock.now());
        let mut state = rates
            .get(key)
            .filter(|(_, expires_at)| *expires_at > now)
            .map(|(s, _)| *s);
        let (rate, ttl) = adapt(aimd, &mut state, now, report);
        if let (Some(state), Some(ttl)) = (state, ttl) {
            rates.insert(key.into(), (state, now + ttl as f64));
        }
        rate
    }

    /// What a request for `key` under `alg` would get now; the state stays as it is.
    pub fn look(&self, key: &str, alg: &Algorithm) -> Decision {
        self.with_state(key, None, |state, now| {
            let mut copy = state.clone();
            (apply(alg, &mut copy, now).0, None)
        })
    }

    /// Forgets `key`; whether it held a live state.
    pub fn remove(&self, key: &str) -> bool {
        let shards = &*self.shards;
        let now = shards.clock.now();
        let mut map = shards.shard(key).lock().unwrap_or_else(|e| e.into_inner());
        map.pop(key)
            .is_some_and(|e| e.state.is_some() && e.expires_at > now)
    }

    /// Runs `step` on the key's live state (`None` when new or expired) under its shard's lock;
    /// `step` returns its answer and, when it wrote the state, the state's time to live.
    fn with_state<R>(
        &self,
        key: &str,
        now: Option<Millis>,
        step: impl FnOnce(&mut Option<State>, Millis) -> (R, Option<u64>),
    ) -> R {
        let shards = &*self.shards;
        let mut map = shards.shard(key).lock().unwrap_or_else(|e| e.into_inner());
        // the clock read under the lock: a key's decisions then see time only move forward (a
        // `now` read before waiting for the lock could lag one written since, and a token bucket
        // would take its TAT for one left by other parameters)
        let now = now.unwrap_or_else(|| shards.clock.now());
        if let Some(entry) = map.get_mut(key) {
            if entry.expires_at <= now {
                entry.state = None;
            }
            let (answer, ttl) = step(&mut entry.state, now);
            if let Some(ttl) = ttl {
                entry.expires_at = now + ttl as f64;
            }
            return answer;
        }
        let mut state = None;
        let (answer, ttl) = step(&mut state, now);
        if let Some(ttl) = ttl {
            let expires_at = now + ttl as f64;
            map.push(key.into(), Entry { state, expires_at });
            if map.len() > shards.per_shard {
                map.pop_lru();
            }
        }
        answer
    }

    /// How many keys the store holds (expired ones not yet purged included).
    pub fn len(&self) -> usize {
        self.shards
            .maps
            .iter()
            .map(|m| m.lock().map(|m| m.len()).unwrap_or(0))
            .sum()
    }

    /// True when the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every expired key now (the background task does this every few seconds).
    pub fn purge_expired(&self) -> usize {
        self.shards.purge()
    }
}

impl Shards {
    fn shard(&self, key: &str) -> &Shard {
        let ix = self.hasher.hash_one(key) as usize & (self.maps.len() - 1);
        &self.maps[ix]
    }

    fn purge(&self) -> usize {
        (0..self.maps.len()).map(|ix| self.purge_shard(ix)).sum()
    }

    /// Removes the expired keys of one shard; how many.
    fn purge_shard(&self, ix: usize) -> usize {
        let now = self.clock.now();
        let mut map = self.maps[ix].lock().unwrap_or_else(|e| e.into_inner());
        let expired: Vec<Box<str>> = map
            .iter()
            .filter(|(_, e)| e.expires_at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &expired {
            map.pop(key);
        }
        expired.len()
    }
}

/// Sweeps the shards one after another, one every `PURGE_EVERY / shards`.
async fn purge_task(shards: Weak<Shards>, mut stop: tokio::sync::watch::Receiver<()>) {
    // the shard count is fixed for the store's life
    let Some(count) = shards.upgrade().map(|s| s.maps.len()) else {
        return;
    };
    let pause = PURGE_EVERY / count as u32;
    for ix in (0..count).cycle() {
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => return,
        }
        match shards.upgrade() {
            Some(shards) => {
                shards.purge_shard(ix);
            }
            None => return,
        }
    }
}

impl Store for MemoryStore {
    fn defer<'a>(
        &'a self,
        key: &'a str,
        pace: &'a Pace,
        hold_ms: u64,
        now: Option<Millis>,
    ) -> HoldFuture<'a> {
        Box::pin(std::future::ready(Ok(self.hold(key, pace, hold_ms, now))))
    }

    fn check<'a>(
        &'a self,
        key: &'a str,
        alg: &'a Algorithm,
        now: Option<Millis>,
    ) -> StoreFuture<'a> {
        let decision = self.decide(key, alg, now);
        Box::pin(std::future::ready(Ok(decision)))
    }

    fn give_back<'a>(
        &'a self,
        key: &'a str,
        alg: &'a Algorithm,
        age_ms: f64,
        now: Option<Millis>,
    ) -> GiveBackFuture<'a> {
        Box::pin(std::future::ready(Ok(self.undo(key, alg, age_ms, now))))
    }

    fn charge<'a>(
        &'a self,
        key: &'a str,
        alg: &'a Algorithm,
        amount: i64,
        now: Option<Millis>,
    ) -> ChargeFuture<'a> {
        Box::pin(std::future::ready(Ok(self.add(key, alg, amount, now))))
    }

    fn peek<'a>(&'a self, key: &'a str, alg: &'a Algorithm) -> StoreFuture<'a> {
        Box::pin(std::future::ready(Ok(self.look(key, alg))))
    }

    fn acquire<'a>(
        &'a self,
        key: &'a str,
        slots: &'a Slots,
        holder: &'a str,
        now: Option<Millis>,
    ) -> StoreFuture<'a> {
        let decision = self.take_slot(key, slots, holder, now);
        Box::pin(std::future::ready(Ok(decision)))
    }

    fn renew<'a>(
        &'a self,
        key: &'a str,
        slots: &'a Slots,
        holders: &'a [String],
        now: Option<Millis>,
    ) -> HoldFuture<'a> {
        let renewed = self.renew_slots(key, slots, holders, now);
        Box::pin(std::future::ready(Ok(renewed)))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        _slots: &'a Slots,
        holders: &'a [String],
        now: Option<Millis>,
    ) -> HoldFuture<'a> {
        Box::pin(std::future::ready(Ok(self.free_slots(key, holders, now))))
    }

    fn forget<'a>(&'a self, key: &'a str) -> GiveBackFuture<'a> {
        Box::pin(std::future::ready(Ok(self.remove(key))))
    }

    fn publish<'a>(&'a self, _key: &'a str, id: &'a str, blob: &'a [u8]) -> HoldFuture<'a> {
        if let Some(e) = super::over_fleet_bound(blob) {
            return Box::pin(std::future::ready(Err(e)));
        }
        let published = Published {
            id: id.to_owned(),
            seen_ms: self.shards.clock.now() as u64,
            blob: blob.to_vec(),
        };
        *self.published.lock().unwrap_or_else(|e| e.into_inner()) = Some(published);
        Box::pin(std::future::ready(Ok(1)))
    }

    fn fleet<'a>(&'a self, _key: &'a str) -> FleetFuture<'a> {
        let now_ms = self.shards.clock.now() as u64;
        let published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = published
            .as_ref()
            .filter(|p| now_ms.saturating_sub(p.seen_ms) < FLEET_STALE.as_millis() as u64);
        let fleet = Fleet {
            now_ms,
            instances: fresh.cloned().into_iter().collect(),
        };
        Box::pin(std::future::ready(Ok(fleet)))
    }

    fn adapt<'a>(
        &'a self,
        key: &'a str,
        aimd: &'a Aimd,
        report: Report,
        now: Option<Millis>,
    ) -> RateFuture<'a> {
        Box::pin(std::future::ready(Ok(
            self.adapt_rate(key, aimd, report, now)
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;

    use super::*;
    use crate::limit::Window;

    fn nz(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap()
    }

    fn fixed(limit: u64) -> Algorithm {
        Algorithm::FixedWindow(Window::new(
            NonZeroU64::new(limit).unwrap(),
            Duration::from_secs(60),
        ))
    }

    /// The bound reserves nothing up front: any `max_keys` starts at once (a bounded map
    /// reserved its whole bound: 16 GB for ten billion keys, a panic for more).
    #[test]
    fn a_huge_bound_reserves_nothing() {
        let store = MemoryStore::new(NonZeroUsize::MAX);
        assert!(store.decide("a", &fixed(1), Some(0.0)).allowed);
        assert_eq!(store.len(), 1);
    }

    /// The key bound evicts the least recently used key, not the busiest.
    #[test]
    fn evicts_least_recently_used_past_max_keys() {
        let store = MemoryStore::new(nz(3));
        let alg = fixed(1);
        for key in ["a", "b", "c"] {
            assert!(store.decide(key, &alg, Some(0.0)).allowed);
        }
        assert!(
            !store.decide("a", &alg, Some(1.0)).allowed,
            "a is remembered and touched"
        );
        assert!(store.decide("d", &alg, Some(2.0)).allowed);
        assert_eq!(store.len(), 3);
        assert!(
            !store.decide("a", &alg, Some(3.0)).allowed,
            "a survived: b was least recent"
        );
        assert!(
            store.decide("b", &alg, Some(4.0)).allowed,
            "b was evicted and starts afresh"
        );
    }

    /// Expired keys are purged and then decide as new keys.
    #[test]
    fn purge_removes_expired_keys() {
        let store = MemoryStore::new(nz(10));
        let alg = Algorithm::FixedWindow(Window::new(
            NonZeroU64::new(1).unwrap(),
            Duration::from_millis(1),
        ));
        let now = store.shards.clock.now() - 10.0;
        assert!(store.decide("gone", &alg, Some(now)).allowed);
        assert_eq!(store.purge_expired(), 1);
        assert!(store.is_empty());
    }

    /// The background task sweeps one shard at a time, spread over `PURGE_EVERY`: half-way
    /// through the period about half the expired keys are gone, after a whole period all.
    #[tokio::test(start_paused = true)]
    async fn the_purge_task_sweeps_shard_by_shard_over_its_period() {
        let store = MemoryStore::new(nz(64 * 1024));
        assert_eq!(store.shards.maps.len(), 64);
        let alg = Algorithm::FixedWindow(Window::new(
            NonZeroU64::new(1).unwrap(),
            Duration::from_millis(1),
        ));
        let past = store.shards.clock.now() - 10.0;
        for i in 0..2000 {
            assert!(store.decide(&format!("k{i}"), &alg, Some(past)).allowed);
        }
        assert_eq!(store.len(), 2000);
        // the paused clock moves on to each of the task's pauses while this sleeps
        tokio::time::sleep(PURGE_EVERY / 2).await;
        let half = store.len();
        assert!(half > 0 && half < 2000, "{half} of 2000 left half-way");
        tokio::time::sleep(PURGE_EVERY).await;
        assert_eq!(store.len(), 0);
    }

    /// The purge task ends when the store is dropped.
    #[tokio::test]
    async fn purge_task_stops_with_the_store() {
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        let store = MemoryStore::new(nz(10));
        assert_eq!(metrics.num_alive_tasks(), before + 1, "the purge task runs");
        drop(store);
        for _ in 0..100 {
            tokio::task::yield_now().await;
            if metrics.num_alive_tasks() == before {
                return;
            }
        }
        panic!("the purge task outlived its store");
    }
}

//! Outbound pacing: before a request goes to a paced upstream, ask the store's leaky bucket
//! for a slot shared by every instance, sleep the returned delay, then forward. With
//! `pace.adaptive` the rate is the fleet's current one, which [`super::adapt`] keeps.
//! Past `max_delay` the answer is 503 with `Retry-After`, and nothing was reserved.
//! `max_waiting` bounds how many requests sleep here at once. A request that must wait takes
//! its waiting place before it asks for a later slot, so a refusal for want of a place
//! reserves nothing (see [`Pacer::ask`]).
//!
//! A client that hangs up while waiting drops this future, and with it its place and its task.
//! Its slot is given back to the shared schedule (`lua/give_back.lua`) when it is the last one
//! handed out. A slot in the middle of the schedule cannot go back there: the schedule is one
//! number, the next free slot. So it becomes a hole, which this instance's next request takes
//! before it asks the store ([`Holes`]). When the last slot is given back, the holes just
//! before it follow, so clients that all hang up leave the schedule as they found it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, StatusCode};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ProxyError;
use crate::limit::{Algorithm, Decision, Pace};
use crate::store::Store;

/// One upstream's pacing.
pub struct Pacer {
    /// the upstream's name
    pub upstream: String,
    /// `Algorithm::LeakyBucket` with the upstream's rate and max_delay
    pub alg: Algorithm,
    /// the same with no wait allowed: the check of a request that has no waiting place
    now_only: Algorithm,
    /// the same parameters, for back-pressure
    pub pace: Pace,
    /// `<key_prefix>:upstream:<name>:pace`
    pub key: String,
    /// permits for requests sleeping in this process (`max_waiting`); `None`: unbounded
    pub waiting: Option<Arc<Semaphore>>,
    /// `max_waiting`, or 0 without it
    max_waiting: usize,
    /// until when the upstream asked this instance to back off
    held: Held,
    /// the latest slot this instance was given: how far ahead the shared schedule runs, as far
    /// as this instance saw (for the console)
    last_slot: Held,
    /// slots left by clients that hung up, for the next requests
    holes: Arc<Holes>,
    /// whether this instance's last slot from the store came from its fallback (the
    /// decision's `share`): a change means the schedule changed under it
    fallback: std::sync::atomic::AtomicBool,
    /// with `pace.adaptive`, the fleet's current rate, which replaces `pace.rate`
    pub adapt: Option<super::adapt::Adapter>,
}

/// What pacing did to a request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Paced {
    /// how long it slept
    pub delay: Duration,
    /// the rate its slot was given at, per second
    pub rate: f64,
}

/// What the pace phase leaves for the upstream's answer, as pingora's
/// `upstream_response_filter` reads it: an adaptive pace counts the answer at the rate the
/// request's slot was given, and a 429 or 503 with `Retry-After` holds the schedule.
#[derive(Clone, Copy)]
pub(super) struct Answer<'a> {
    pacer: &'a Pacer,
    /// the rate the request's slot was given at, per second
    rate: f64,
}

impl Answer<'_> {
    /// The rate the request's slot was given at, per second.
    pub(super) fn rate(&self) -> f64 {
        self.rate
    }

    /// Whether the answer needs the time the request was sent: an adaptive pace measures it.
    pub(super) fn timed(&self) -> bool {
        self.pacer.adapt.is_some()
    }

    /// Counts the answer to the request sent at `sent`, for an adaptive pace.
    pub(super) fn observe(
        &self,
        result: Result<&http::Response<super::Body>, &ProxyError>,
        sent: Instant,
    ) {
        if let Some(adapter) = &self.pacer.adapt {
            adapter.observe(self.rate, sent, adapter.met(result, sent.elapsed()));
        }
    }

    /// Holds the schedule when the upstream's response asks to back off
    /// ([`Pacer::back_pressure`]).
    pub(super) async fn back_pressure(
        &self,
        store: &dyn Store,
        resp: &http::Response<super::Body>,
    ) {
        (self.pacer)
            .back_pressure(store, resp.status(), resp.headers())
            .await;
    }
}

/// How many times a request asks for a slot again when back-off holds it (each answer is a
/// slot after the hold, unless the hold grew meanwhile): then it goes at its slot.
const MAX_ASKS: u32 = 3;

impl Pacer {
    /// The pacing of upstream `upstream` at `pace`, its schedule kept at `key`, with at most
    /// `max_waiting` requests sleeping here at once.
    pub fn new(upstream: &str, pace: Pace, key: String, max_waiting: Option<usize>) -> Pacer {
        let now_only = Pace {
            max_delay_ms: Some(0.0),
            ..pace
        };
        Pacer {
            upstream: upstream.to_owned(),
            alg: Algorithm::LeakyBucket(pace),
            now_only: Algorithm::LeakyBucket(now_only),
            pace,
            key,
            waiting: max_waiting.map(|n| Arc::new(Semaphore::new(n))),
            max_waiting: max_waiting.unwrap_or(0),
            held: Held::new(),
            last_slot: Held::new(),
            holes: Arc::new(Holes::default()),
            fallback: std::sync::atomic::AtomicBool::new(false),
            adapt: None,
        }
    }

    /// What the upstream's answer to a request that `paced` let go is read for.
    pub(super) fn answer(&self, paced: Paced) -> Answer<'_> {
        Answer {
            pacer: self,
            rate: paced.rate,
        }
    }

    /// The same pacing at the rate `adapter` keeps, which starts at `pace.rate`.
    pub fn adaptive(mut self, adapter: super::adapt::Adapter) -> Pacer {
        self.adapt = Some(adapter);
        self
    }

    /// The pace in force (at the adaptive rate, for an adaptive pace), as the schedule's
    /// algorithm, and as the check of a request that may not wait.
    fn in_force(&self) -> (Pace, Algorithm, Algorithm) {
        let Some(adapter) = &self.adapt else {
            return (self.pace, self.alg, self.now_only);
        };
        let pace = Pace {
            rate: adapter.rate(),
            ..self.pace
        };
        let now_only = Pace {
            max_delay_ms: Some(0.0),
            ..pace
        };
        (
            pace,
            Algorithm::LeakyBucket(pace),
            Algorithm::LeakyBucket(now_only),
        )
    }

    /// Waits for this request's slot, or refuses it.
    ///
    /// While a back-off the upstream asked for is in force here, a request waits it out before
    /// it asks for a slot (past `max_delay` it is refused with the hold's end as its
    /// `Retry-After`); a request that was already sleeping on a slot from before the hold asks
    /// again when it wakes, and gets one after the hold: the shared schedule was pushed past it
    /// (`back_pressure`). Only a request that sleeps takes one of `max_waiting`'s permits,
    /// and it takes it before its slot: when none is left it is refused with nothing reserved.
    pub async fn wait(&self, store: &Arc<dyn Store>) -> Result<Paced, ProxyError> {
        let mut slept = Duration::ZERO;
        let mut permit = None;
        let mut rate = self.pace.rate.per_sec();
        for asked in 1..=MAX_ASKS {
            if let Some(hold) = self.held.remaining() {
                if self
                    .pace
                    .max_delay_ms
                    .is_some_and(|max| hold.as_secs_f64() * 1000.0 > max)
                {
                    return Err(ProxyError::PacingRefused {
                        upstream: self.upstream.clone(),
                        retry_after_ms: hold.as_millis().max(1) as u64,
                    });
                }
                if !self.may_sleep(&mut permit) {
                    return Err(self.queue_full());
                }
                tokio::time::sleep(hold).await;
                slept += hold;
            }
            let in_force = self.in_force();
            // (what this instance paces at: while the store is away, the fallback's share)
            rate = self
                .adapt
                .as_ref()
                .map_or(in_force.0.rate.per_sec(), |a| a.paced_at());
            let (decision, switched) = self.ask(store, &mut permit, in_force).await?;
            if !decision.allowed {
                return Err(ProxyError::PacingRefused {
                    upstream: self.upstream.clone(),
                    retry_after_ms: decision.retry_after_ms,
                });
            }
            let delay = Duration::from_micros(decision.delay_us);
            // (after a switch of schedule the request asks again once the hold is over)
            if delay.is_zero() && !switched {
                break;
            }
            self.last_slot.hold(delay);
            // (the slot is given back if the client goes away before it)
            let booked = Booked {
                pacer: self,
                store,
                slot: Some(Instant::now() + delay),
                alg: in_force.1,
            };
            tokio::time::sleep(delay).await;
            slept += delay;
            booked.kept();
            // a back-off that began while it slept: its slot came before it
            if asked == MAX_ASKS || self.held.remaining().is_none() {
                break;
            }
        }
        Ok(Paced { delay: slept, rate })
    }

    /// Asks the store for a slot. Under `max_waiting`, a request without a place first asks
    /// for a slot free now; only when there is none does it take a place and ask for a later
    /// slot. So a request refused for want of a place has reserved nothing, and one that need
    /// not wait never needs a place.
    /// Also says whether the schedule changed under this instance (see [`Pacer::switched`]).
    async fn ask(
        &self,
        store: &Arc<dyn Store>,
        permit: &mut Option<OwnedSemaphorePermit>,
        (pace, alg, now_only): (Pace, Algorithm, Algorithm),
    ) -> Result<(Decision, bool), ProxyError> {
        if self.holes.any() && self.may_sleep(permit) {
            let not_before = Instant::now() + self.held.remaining().unwrap_or_default();
            if let Some(slot) = self.holes.take(not_before) {
                let delay = slot.saturating_duration_since(Instant::now()).as_micros() as u64;
                let interval = pace.rate.interval_ms();
                let d = Decision::paced(true, delay, interval, pace.max_delay_ms);
                return Ok((d, false));
            }
        }
        if self.waiting.is_some() && permit.is_none() {
            let now = store
                .check(&self.key, &now_only, None)
                .await
                .map_err(ProxyError::StoreUnavailable)?;
            if now.allowed {
                let switched = self.switched(store, &now, &pace).await;
                if switched && !self.may_sleep(permit) {
                    return Err(self.queue_full());
                }
                return Ok((now, switched));
            }
            if !self.may_sleep(permit) {
                return Err(self.queue_full());
            }
        }
        let d = store
            .check(&self.key, &alg, None)
            .await
            .map_err(ProxyError::StoreUnavailable)?;
        let switched = d.allowed && self.switched(store, &d, &pace).await;
        Ok((d, switched))
    }

    /// Whether `d` came from another schedule than this instance's last slot from the store:
    /// the store's fallback (its `share` says so) or the shared one. A new schedule hands out
    /// slots from now, while requests sleeping on the old one's slots still go (6 503s from
    /// an upstream of 20/s at each switch), so it is held until this instance's last slot.
    async fn switched(&self, store: &Arc<dyn Store>, d: &Decision, pace: &Pace) -> bool {
        let fallback = d.share.is_some();
        if self.fallback.swap(fallback, Ordering::Relaxed) == fallback {
            return false;
        }
        let Some(ahead) = self.last_slot.remaining() else {
            return false;
        };
        self.held.hold(ahead);
        let hold_ms = ahead.as_millis() as u64 + 1;
        if let Err(e) = store.defer(&self.key, pace, hold_ms, None).await {
            tracing::debug!(upstream = %self.upstream, error = %e, "pacing: schedule not held");
        }
        true
    }

    /// Whether the request holds a `max_waiting` permit to sleep with (taking one if it has
    /// none yet).
    fn may_sleep(&self, permit: &mut Option<OwnedSemaphorePermit>) -> bool {
        match &self.waiting {
            None => true,
            Some(_) if permit.is_some() => true,
            Some(sem) => {
                *permit = sem.clone().try_acquire_owned().ok();
                permit.is_some()
            }
        }
    }

    /// The refusal of a request that would sleep while `max_waiting` requests do.
    fn queue_full(&self) -> ProxyError {
        ProxyError::TooManyWaiting {
            upstream: self.upstream.clone(),
            retry_after_ms: self.queue_retry_ms(),
        }
    }

    /// When a request refused for want of a `max_waiting` permit may find one: a sleeper
    /// leaves at each slot, one interval apart, and none before a back-off ends.
    fn queue_retry_ms(&self) -> u64 {
        let interval_ms = self.in_force().0.rate.interval_ms();
        let hold_ms = self
            .held
            .remaining()
            .map_or(0.0, |h| h.as_secs_f64() * 1000.0);
        interval_ms.max(hold_ms).ceil().max(1.0) as u64
    }
}

/// A request's slot while it sleeps on it: left to the schedule, or to the next request, if the
/// request is dropped first (its client went away).
struct Booked<'a> {
    pacer: &'a Pacer,
    store: &'a Arc<dyn Store>,
    /// when the slot is; `None` once the request went at it
    slot: Option<Instant>,
    /// the schedule's algorithm when the slot was given
    alg: Algorithm,
}

impl Booked<'_> {
    /// The request went at its slot.
    fn kept(mut self) {
        self.slot = None;
    }
}

impl Drop for Booked<'_> {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (holes, store) = (self.pacer.holes.clone(), self.store.clone());
        let (key, alg) = (self.pacer.key.clone(), self.alg);
        runtime.spawn(async move { holes.leave(slot, &store, &key, &alg).await });
    }
}

/// Slots of this instance's requests whose clients hung up before them, while the shared
/// schedule still counts them taken. The next request here takes the earliest one instead of
/// asking the store for a slot after the last. Each is a slot the schedule handed out, so the
/// upstream still sees requests at least one interval apart, whichever instance sends them.
#[derive(Default)]
struct Holes {
    /// when each hole's slot is, earliest first
    free: std::sync::Mutex<Vec<Instant>>,
    /// how many there are: the request path reads this, not the lock
    count: std::sync::atomic::AtomicUsize,
    /// one client's leaving at a time, so that holes given back in any order all reach the
    /// store (see [`Holes::leave`]); a tokio mutex, held across the give-backs on purpose, in
    /// a task no request waits for
    leaving: tokio::sync::Mutex<()>,
}

impl Holes {
    fn any(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    fn free(&self) -> std::sync::MutexGuard<'_, Vec<Instant>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds the hole at `slot`.
    fn put(&self, slot: Instant) {
        let mut free = self.free();
        let at = free.partition_point(|s| *s < slot);
        free.insert(at, slot);
        self.count.store(free.len(), Ordering::Relaxed);
    }

    /// Takes the earliest hole not before `not_before`. Holes before it are dropped: their time
    /// has passed, or the upstream asked for a back-off that covers them.
    fn take(&self, not_before: Instant) -> Option<Instant> {
        let mut free = self.free();
        let past = free.partition_point(|s| *s < not_before);
        free.drain(..past);
        let slot = (!free.is_empty()).then(|| free.remove(0));
        self.count.store(free.len(), Ordering::Relaxed);
        slot
    }

    /// Takes the latest hole still ahead.
    fn take_last(&self) -> Option<Instant> {
        let mut free = self.free();
        let slot = free.pop().filter(|s| *s > Instant::now());
        if slot.is_none() {
            free.clear();
        }
        self.count.store(free.len(), Ordering::Relaxed);
        slot
    }

    /// The client whose slot is `slot` hung up. The slot becomes a hole; then the latest holes
    /// go back to the store for as long as each is the schedule's last slot. One leaving at a
    /// time: clients that hang up together, in any order, so give back every slot of theirs
    /// that no later request holds.
    async fn leave(&self, slot: Instant, store: &Arc<dyn Store>, key: &str, alg: &Algorithm) {
        let _one = self.leaving.lock().await;
        self.put(slot);
        while let Some(last) = self.take_last() {
            let ahead_ms = last.saturating_duration_since(Instant::now()).as_secs_f64() * 1000.0;
            match store.give_back(key, alg, -ahead_ms, None).await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => tracing::debug!(key, error = %e, "could not give back a pacing slot"),
            }
            self.put(last);
            break;
        }
    }
}

/// Until when the upstream asked this instance to back off: ms after `base`, 0 for never.
struct Held {
    base: Instant,
    until_ms: AtomicU64,
}

impl Held {
    fn new() -> Held {
        Held {
            base: Instant::now(),
            until_ms: AtomicU64::new(0),
        }
    }

    /// Holds until `hold` from now, unless a longer hold is in force already.
    fn hold(&self, hold: Duration) {
        let until = (self.base.elapsed() + hold).as_millis() as u64;
        self.until_ms.fetch_max(until, Ordering::Relaxed);
    }

    /// What is left of the hold, if one is in force.
    fn remaining(&self) -> Option<Duration> {
        let until = self.until_ms.load(Ordering::Relaxed);
        if until == 0 {
            return None;
        }
        let until = Duration::from_millis(until);
        until
            .checked_sub(self.base.elapsed())
            .filter(|rest| !rest.is_zero())
    }
}

impl Pacer {
    /// What is left of a back-off the upstream asked this instance for, if one holds.
    pub fn hold_remaining(&self) -> Option<Duration> {
        self.held.remaining()
    }

    /// How far ahead of now the latest slot this instance was given lies, if it is ahead.
    pub fn schedule_ahead(&self) -> Option<Duration> {
        self.last_slot.remaining()
    }

    /// Ends the back-off the upstream asked this instance for: an operator lifted it.
    pub fn lift_hold(&self) {
        self.held.until_ms.store(0, Ordering::Relaxed);
        self.last_slot.until_ms.store(0, Ordering::Relaxed);
    }

    /// Requests sleeping for a slot here now, when `max_waiting` counts them.
    pub fn waiting_now(&self) -> Option<usize> {
        let permits = self.waiting.as_ref()?;
        Some(self.max_waiting.saturating_sub(permits.available_permits()))
    }
}

/// Back-pressure is honoured for at most this long, whatever the upstream asks.
const MAX_HOLD: Duration = Duration::from_secs(3600);

impl Pacer {
    /// Upstream back-pressure: a 429 or 503 with `Retry-After` from the upstream
    /// pushes the shared schedule so that no instance sends to it before then.
    pub async fn back_pressure(&self, store: &dyn Store, status: StatusCode, headers: &HeaderMap) {
        if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
            return;
        }
        let Some(hold) = retry_after(headers, SystemTime::now()) else {
            return;
        };
        let hold = hold.min(MAX_HOLD);
        // this instance's requests hold off at once, those already sleeping too (`wait`)
        self.held.hold(hold);
        let hold_ms = hold.as_millis() as u64;
        match store.defer(&self.key, &self.pace, hold_ms, None).await {
            Ok(next) => tracing::info!(upstream = %self.upstream, hold_ms, next_slot_ms = next,
                "upstream asked to back off: schedule held"),
            Err(e) => tracing::warn!(upstream = %self.upstream, error = %e,
                "upstream asked to back off but the store could not hold the schedule"),
        }
    }
}

/// `Retry-After` as a wait from `now`: delay-seconds or an HTTP-date (RFC 9110 §10.2.3).
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Retry-After is read as seconds or as an HTTP-date; garbage is ignored.
    #[test]
    fn retry_after_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h, now), None);
        h.insert(http::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(7)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        h.insert(http::header::RETRY_AFTER, later.parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(90)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(90));
        h.insert(http::header::RETRY_AFTER, past.parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::ZERO));
        h.insert(http::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&h, now), None);
    }
}

//! `pace.concurrency`: at most N requests in flight to an upstream, across every instance that
//! shares the store. A request that finds every slot taken waits for one, as HAProxy's
//! `maxconn` queue does, up to `max_delay`; past it the answer is 503 with `Retry-After`.
//! `max_waiting` bounds how many requests wait here at once.
//!
//! No one is told when a slot frees (it frees when some instance's response ends), so a
//! waiting request asks the store again after a pause that starts at 5 ms and doubles up to
//! 50 ms, each with random jitter of up to half of it, so waiters on many instances do not
//! ask in step. The slot is held as a route limit's concurrency slot is ([`super::slots`]).

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::slots::{Held, Holders};
use super::ProxyError;
use crate::limit::Slots;

/// The first pause of a waiting request before it asks again.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
/// The longest pause between two asks.
const LONGEST_PAUSE: Duration = Duration::from_millis(50);

/// One upstream's bound on requests in flight.
pub struct Inflight {
    /// the upstream's name
    pub upstream: String,
    /// the bound and the lease of each slot
    pub slots: Slots,
    /// `<key_prefix>:upstream:<name>:inflight`
    pub key: String,
    /// the longest a request waits for a slot; `None`: as long as it takes
    max_delay: Option<Duration>,
    /// permits for requests waiting in this process (`max_waiting`); `None`: unbounded
    waiting: Option<Arc<Semaphore>>,
}

impl Inflight {
    /// At most `slots.limit` requests in flight to `upstream`, counted at `key`.
    pub fn new(
        upstream: &str,
        slots: Slots,
        key: String,
        max_delay: Option<Duration>,
        max_waiting: Option<usize>,
    ) -> Inflight {
        Inflight {
            upstream: upstream.to_owned(),
            slots,
            key,
            max_delay,
            waiting: max_waiting.map(|n| Arc::new(Semaphore::new(n))),
        }
    }

    /// Waits for a slot, held in `held` until the response is finished; returns how long it
    /// waited. Refused past `max_delay`, or when `max_waiting` requests wait already.
    pub async fn wait(
        &self,
        holders: &Arc<Holders>,
        held: &mut Held,
    ) -> Result<Duration, ProxyError> {
        let started = Instant::now();
        let mut permit: Option<OwnedSemaphorePermit> = None;
        let mut pause = FIRST_PAUSE;
        loop {
            let decision = holders
                .acquire(&self.key, &self.slots, held)
                .await
                .map_err(ProxyError::StoreUnavailable)?;
            if decision.allowed {
                return Ok(started.elapsed());
            }
            let next = jittered(pause);
            if self
                .max_delay
                .is_some_and(|max| started.elapsed() + next > max)
            {
                return Err(ProxyError::PacingRefused {
                    upstream: self.upstream.clone(),
                    retry_after_ms: decision.retry_after_ms,
                });
            }
            if let (Some(sem), None) = (&self.waiting, &permit) {
                permit = sem.clone().try_acquire_owned().ok();
                if permit.is_none() {
                    return Err(ProxyError::TooManyWaiting {
                        upstream: self.upstream.clone(),
                        retry_after_ms: decision.retry_after_ms,
                    });
                }
            }
            tokio::time::sleep(next).await;
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }
}

/// `pause` plus up to half of it, at random.
fn jittered(pause: Duration) -> Duration {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let half = pause.as_micros() as u64 / 2;
    pause + Duration::from_micros(random % (half + 1))
}

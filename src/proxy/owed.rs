//! What a request took from its limits or its upstream's pacing schedule while it waits to be
//! sent: given back if the request is dropped first (its client went away), so that no limit
//! counts, and no schedule is held back for, a request that never reaches the upstream.

use std::sync::Arc;
use std::time::Instant;

use crate::limit::{Algorithm, Decision};
use crate::store::Store;

/// One check that admitted the request.
pub(super) struct Taken {
    /// the store key it ran on
    key: String,
    alg: Algorithm,
    /// when it admitted the request
    at: Instant,
    /// the delay it set (a leaky bucket's), in µs
    delay_us: u64,
    /// a window's check: the time it said was left of the window it counted in (its reset)
    window_left_ms: Option<u64>,
}

impl Taken {
    /// The check of `alg` on `key` that answered `decision` (admitting the request) `at`.
    pub fn new(key: String, alg: Algorithm, at: Instant, decision: &Decision) -> Taken {
        // a fixed window's reset runs to the end of the window it counted in; a counter's too
        // while it has requests left (with none, it may run on to a later admission)
        let window_left_ms = match alg {
            Algorithm::FixedWindow(_) => Some(decision.reset_ms),
            Algorithm::SlidingWindowCounter(_) if decision.remaining > 0 => Some(decision.reset_ms),
            _ => None,
        };
        Taken {
            key,
            alg,
            at,
            delay_us: decision.delay_us,
            window_left_ms: window_left_ms.filter(|&ms| ms > 0),
        }
    }

    /// The age [`Store::give_back`] takes of this check: how long ago it ran, or for a leaky
    /// bucket, how long ago its slot was (negative while it is ahead). For a window whose
    /// check said where its window ends, the age of that window's middle: the store then
    /// finds the window the check counted in however late the round trips make `now - age`
    /// (measured from when the answer came), where a check just after a window's start could
    /// have been in the window before and would stay counted (`lua/give_back.lua`'s margin).
    fn age_ms(&self) -> f64 {
        let elapsed = self.at.elapsed().as_secs_f64() * 1000.0;
        match (self.window_left_ms, &self.alg) {
            (Some(left), Algorithm::FixedWindow(w) | Algorithm::SlidingWindowCounter(w)) => {
                elapsed - left as f64 + w.window_ms.get() as f64 / 2.0
            }
            _ => elapsed - self.delay_us as f64 / 1000.0,
        }
    }
}

/// Checks given back to `store` when this is dropped, unless [`Owed::paid`] first.
pub(super) struct Owed {
    store: Arc<dyn Store>,
    taken: Vec<Taken>,
}

impl Owed {
    pub fn new(store: Arc<dyn Store>, taken: Vec<Taken>) -> Owed {
        Owed { store, taken }
    }

    /// The request went on: what it took stays taken.
    pub fn paid(mut self) {
        self.taken.clear();
    }

    /// Gives it all back now (rather than when dropped).
    pub async fn give_back(mut self) {
        give_back(&self.store, std::mem::take(&mut self.taken)).await;
    }
}

async fn give_back(store: &Arc<dyn Store>, taken: Vec<Taken>) {
    for t in taken {
        if let Err(e) = store.give_back(&t.key, &t.alg, t.age_ms(), None).await {
            tracing::debug!(key = t.key, error = %e, "could not give back");
        }
    }
}

impl Drop for Owed {
    fn drop(&mut self) {
        if self.taken.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, taken) = (self.store.clone(), std::mem::take(&mut self.taken));
        runtime.spawn(async move { give_back(&store, taken).await });
    }
}

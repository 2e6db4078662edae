//! What a request took from its limits or its upstream's pacing schedule while it waits to be
//! sent: given back if the request is dropped first (its client went away), so that no limit
//! counts, and no schedule is held back for, a request that never reaches the upstream.

use std::sync::Arc;
use std::time::Instant;

use crate::limit::Algorithm;
use crate::store::Store;

/// One check that admitted the request.
pub(super) struct Taken {
    /// the store key it ran on
    pub key: String,
    pub alg: Algorithm,
    /// when it admitted the request
    pub at: Instant,
    /// the delay it set (a leaky bucket's), in µs
    pub delay_us: u64,
}

/// The age [`Store::give_back`] takes of a check made `at` that set `delay_us`: how long ago
/// it ran, or for a leaky bucket, how long ago its slot was (negative while it is ahead).
fn age_ms(at: Instant, delay_us: u64) -> f64 {
    at.elapsed().as_secs_f64() * 1000.0 - delay_us as f64 / 1000.0
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
        if let Err(e) = store
            .give_back(&t.key, &t.alg, age_ms(t.at, t.delay_us), None)
            .await
        {
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

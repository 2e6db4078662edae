//! Outbound pacing (SPEC §3.4): before a request goes to a paced upstream, ask the store's
//! leaky bucket for a slot shared by every instance, sleep the returned delay, then forward.
//! Past `max_delay` the answer is 503 with `Retry-After`, and nothing was reserved.
//! `max_waiting` bounds how many requests sleep here at once; a client that hangs up while
//! waiting drops this future, and with it its permit and its task.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::ProxyError;
use crate::limit::Algorithm;
use crate::store::Store;

/// One upstream's pacing.
pub struct Pacer {
    /// the upstream's name
    pub upstream: String,
    /// `Algorithm::LeakyBucket` with the upstream's rate and max_delay
    pub alg: Algorithm,
    /// `<key_prefix>:upstream:<name>:pace`
    pub key: String,
    /// permits for requests sleeping in this process (`max_waiting`); `None`: unbounded
    pub waiting: Option<Arc<Semaphore>>,
}

/// What pacing did to a request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Paced {
    /// how long it slept
    pub delay: Duration,
}

impl Pacer {
    /// Waits for this request's slot, or refuses it.
    pub async fn wait(&self, store: &dyn Store) -> Result<Paced, ProxyError> {
        let _permit =
            match &self.waiting {
                Some(sem) => Some(sem.clone().try_acquire_owned().map_err(|_| {
                    ProxyError::TooManyWaiting {
                        upstream: self.upstream.clone(),
                    }
                })?),
                None => None,
            };
        let decision = store
            .check(&self.key, &self.alg, None)
            .await
            .map_err(ProxyError::StoreUnavailable)?;
        if !decision.allowed {
            return Err(ProxyError::PacingRefused {
                upstream: self.upstream.clone(),
                retry_after_ms: decision.retry_after_ms,
            });
        }
        let delay = Duration::from_micros(decision.delay_us);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok(Paced { delay })
    }
}

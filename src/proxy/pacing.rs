//! Outbound pacing (SPEC §3.4): before a request goes to a paced upstream, ask the store's
//! leaky bucket for a slot shared by every instance, sleep the returned delay, then forward.
//! Past `max_delay` the answer is 503 with `Retry-After`, and nothing was reserved.
//! `max_waiting` bounds how many requests sleep here at once; a client that hangs up while
//! waiting drops this future, and with it its permit and its task, and its slot is given back
//! (`lua/give_back.lua`) while it is the last one handed out.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, StatusCode};

use tokio::sync::Semaphore;

use super::owed::{Owed, Taken};
use super::ProxyError;
use crate::limit::{Algorithm, Pace};
use crate::store::Store;

/// One upstream's pacing.
pub struct Pacer {
    /// the upstream's name
    pub upstream: String,
    /// `Algorithm::LeakyBucket` with the upstream's rate and max_delay
    pub alg: Algorithm,
    /// the same parameters, for back-pressure
    pub pace: Pace,
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
    pub async fn wait(&self, store: &Arc<dyn Store>) -> Result<Paced, ProxyError> {
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
            // (the slot is given back if the client goes away before it)
            let owed = Owed::new(
                store.clone(),
                vec![Taken {
                    key: self.key.clone(),
                    alg: self.alg,
                    at: Instant::now(),
                    delay_us: decision.delay_us,
                }],
            );
            tokio::time::sleep(delay).await;
            owed.paid();
        }
        Ok(Paced { delay })
    }
}

/// Back-pressure is honoured for at most this long, whatever the upstream asks.
const MAX_HOLD: Duration = Duration::from_secs(3600);

impl Pacer {
    /// Upstream back-pressure (SPEC §3.4): a 429 or 503 with `Retry-After` from the upstream
    /// pushes the shared schedule so that no instance sends to it before then.
    pub async fn back_pressure(&self, store: &dyn Store, status: StatusCode, headers: &HeaderMap) {
        if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE {
            return;
        }
        let Some(hold) = retry_after(headers, SystemTime::now()) else {
            return;
        };
        let hold_ms = hold.min(MAX_HOLD).as_millis() as u64;
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

//! What a limiter answers. Being limited is not an error: a [`Decision`] says allowed or denied
//! with the figures the proxy turns into `Retry-After` and the rate-limit headers.

use std::num::NonZeroU32;

/// The answer of one limiter to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Decision {
    /// admitted (for pacing: a slot was reserved)
    pub allowed: bool,
    /// requests (tokens) left after this one
    pub remaining: u64,
    /// 0 when allowed; else milliseconds until this request would be admitted (rounded up)
    pub retry_after_ms: u64,
    /// milliseconds until the quota is whole again (rounded up)
    pub reset_ms: u64,
    /// pacing only: microseconds to wait before sending (0 for the other algorithms)
    pub delay_us: u64,
    /// decided for a share of the limit, 1/N of it (the `local` fallback with `instances: N`):
    /// the figures are that share's, and so are the rate-limit headers that show them
    pub share: Option<NonZeroU32>,
    /// answered from tokens the worker leased ahead from Redis, without a store call
    /// (`store::lease`)
    pub leased: bool,
}

impl Decision {
    /// A decision of the four counting algorithms, from the script's four integers.
    pub fn counted(allowed: bool, remaining: u64, retry_after_ms: u64, reset_ms: u64) -> Self {
        Decision {
            allowed,
            remaining,
            retry_after_ms,
            reset_ms,
            delay_us: 0,
            share: None,
            leased: false,
        }
    }

    /// A pacing decision from `lua/leaky_bucket.lua`'s `{admitted, delay}`; the other figures
    /// follow from the parameters, so Rust and Lua share this one derivation.
    ///
    /// * refused: it would be admitted once the wait shrinks to `max_delay`, so
    ///   `retry_after = ceil(delay - max_delay)`;
    /// * remaining: how many more slots fit before the wait passes `max_delay`;
    /// * reset: when the schedule is idle again (the wait plus one interval).
    pub fn paced(
        admitted: bool,
        delay_us: u64,
        interval_ms: f64,
        max_delay_ms: Option<f64>,
    ) -> Self {
        let delay_ms = delay_us as f64 / 1000.0;
        let (retry_after_ms, remaining) = match max_delay_ms {
            Some(max) if !admitted => (ceil_ms(delay_ms - max), 0),
            Some(max) => (0, ((max - delay_ms) / interval_ms).floor().max(0.0) as u64),
            None => (0, u64::from(admitted)),
        };
        let reset_ms = if admitted {
            ceil_ms(delay_ms + interval_ms)
        } else {
            ceil_ms(delay_ms)
        };
        Decision {
            allowed: admitted,
            remaining,
            retry_after_ms,
            reset_ms,
            delay_us: if admitted { delay_us } else { 0 },
            share: None,
            leased: false,
        }
    }

    /// A concurrency decision from `lua/concurrency.lua`'s `{admitted, free, wait_ms, held}`:
    /// `remaining` is the slots free after this request. A slot frees when some response
    /// ends, which no one can foresee, so a refusal says to come back in
    /// [`SLOT_RETRY_MS`](Decision::SLOT_RETRY_MS), or when the earliest lease ends if that is
    /// sooner. `reset` is that same time: there is no window.
    pub fn slots(admitted: bool, free: u64, wait_ms: u64) -> Self {
        let retry_after_ms = if admitted {
            0
        } else {
            wait_ms.clamp(1, Decision::SLOT_RETRY_MS)
        };
        Decision::counted(admitted, free, retry_after_ms, retry_after_ms)
    }

    /// The `Retry-After` of a concurrency refusal when no lease ends sooner: 1 s.
    pub const SLOT_RETRY_MS: u64 = 1000;

    /// `retry_after` as whole seconds, rounded up, for the `Retry-After` header.
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after_ms.div_ceil(1000)
    }

    /// `reset` as whole seconds, rounded up.
    pub fn reset_secs(&self) -> u64 {
        self.reset_ms.div_ceil(1000)
    }
}

/// Milliseconds rounded up, at least 1: a positive wait never reads as "now".
pub(crate) fn ceil_ms(ms: f64) -> u64 {
    ms.ceil().max(1.0) as u64
}

//! Typed limiter parameters. Constructors refuse what would make an algorithm meaningless (a
//! zero or negative rate, a zero burst, limit or window), so a built [`Algorithm`] is always valid.

use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

/// Why a parameter was refused; the config layer adds the file position and key path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    /// A rate must be a finite number of events per positive span.
    #[error("rate must be greater than zero, found {0}")]
    Rate(String),
    /// `max_delay` must be a finite duration.
    #[error("max_delay must be a finite duration")]
    MaxDelay,
    /// A concurrency lease outside the bounds a holder can renew in time and a dead
    /// instance's slots come back in.
    #[error("lease must be between 1s and 15s, found {0:?}")]
    Lease(Duration),
    /// A token costing more than the bucket holds could never be admitted.
    #[error("cost {cost} is larger than burst {burst}: no request could ever be admitted")]
    CostOverBurst {
        /// the cost asked for
        cost: u32,
        /// the bucket size
        burst: u32,
    },
}

/// Events per second, finite and greater than zero.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate(f64);

impl Rate {
    /// `count` events per `per`; refuses zero, negative, infinite and NaN rates.
    pub fn new(count: f64, per: Duration) -> Result<Rate, ParamError> {
        Rate::per_second(count / per.as_secs_f64())
    }

    /// A rate given directly in events per second.
    pub fn per_second(rate: f64) -> Result<Rate, ParamError> {
        if rate.is_finite() && rate > 0.0 {
            Ok(Rate(rate))
        } else {
            Err(ParamError::Rate(rate.to_string()))
        }
    }

    /// Events per second, as the scripts take it (ARGV[1]).
    pub fn per_sec(self) -> f64 {
        self.0
    }

    /// Milliseconds between two events: `1000 / rate`, computed exactly as the scripts do.
    pub fn interval_ms(self) -> f64 {
        1000.0 / self.0
    }
}

/// Token bucket parameters: refill `rate`, bucket size `burst`, tokens per request `cost`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    /// tokens added per second
    pub rate: Rate,
    /// bucket size: a full bucket admits exactly `burst` requests at once
    pub burst: NonZeroU32,
    /// tokens one request takes
    pub cost: NonZeroU32,
    /// the limit charges what the upstream reports after the response (`charge`), which may
    /// take the bucket below empty: a TAT past the tolerance is then debt to repay, not a
    /// bucket left by other parameters to clamp (see [`crate::limit::charge`])
    pub debt: bool,
}

impl Bucket {
    /// A bucket; refuses a cost larger than the burst, which could never be admitted.
    pub fn new(rate: Rate, burst: NonZeroU32, cost: NonZeroU32) -> Result<Bucket, ParamError> {
        if cost > burst {
            return Err(ParamError::CostOverBurst {
                cost: cost.get(),
                burst: burst.get(),
            });
        }
        Ok(Bucket {
            rate,
            burst,
            cost,
            debt: false,
        })
    }
}

/// Leaky bucket (pacing) parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    /// slots handed out per second
    pub rate: Rate,
    /// the longest wait a caller accepts, in ms; `None`: unbounded
    pub max_delay_ms: Option<f64>,
}

impl Pace {
    /// Pacing at `rate`, refusing waits longer than `max_delay` (unbounded when `None`).
    pub fn new(rate: Rate, max_delay: Option<Duration>) -> Result<Pace, ParamError> {
        let max_delay_ms = max_delay.map(|d| d.as_secs_f64() * 1000.0);
        if max_delay_ms.is_some_and(|d| !d.is_finite()) {
            return Err(ParamError::MaxDelay);
        }
        Ok(Pace { rate, max_delay_ms })
    }
}

/// Window parameters shared by the fixed window, sliding window and sliding-window counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// requests per window
    pub limit: NonZeroU64,
    /// the window's length in whole milliseconds
    pub window_ms: NonZeroU64,
}

impl Window {
    /// `limit` requests per `window`; a window shorter than 1 ms is rounded up to 1 ms.
    pub fn new(limit: NonZeroU64, window: Duration) -> Window {
        let ms = window.as_nanos().div_ceil(1_000_000).max(1);
        let window_ms = NonZeroU64::new(u64::try_from(ms).unwrap_or(u64::MAX))
            .expect("clamped to at least 1 above");
        Window { limit, window_ms }
    }
}

/// Concurrency parameters: at most `limit` requests hold a slot at once, each slot a lease of
/// `lease_ms` that its holder renews while its request runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    /// slots held at once
    pub limit: NonZeroU32,
    /// how long a slot lasts unless renewed, in whole ms: a dead instance's slots are free
    /// again this long after its last renewal
    pub lease_ms: NonZeroU64,
}

impl Slots {
    /// The lease when none is configured.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
    /// The shortest lease: a holder renews every third of it, which must stay well above a
    /// store round trip.
    pub const MIN_LEASE: Duration = Duration::from_secs(1);
    /// The longest lease: a dead instance's slots must come back within 15 s.
    pub const MAX_LEASE: Duration = Duration::from_secs(15);

    /// `limit` slots, each a lease of `lease`; refuses a lease outside
    /// [`MIN_LEASE`](Slots::MIN_LEASE)..=[`MAX_LEASE`](Slots::MAX_LEASE).
    pub fn new(limit: NonZeroU32, lease: Duration) -> Result<Slots, ParamError> {
        if lease < Slots::MIN_LEASE || lease > Slots::MAX_LEASE {
            return Err(ParamError::Lease(lease));
        }
        let lease_ms = NonZeroU64::new(lease.as_millis() as u64).ok_or(ParamError::Lease(lease))?;
        Ok(Slots { limit, lease_ms })
    }

    /// One instance's share of the slots when `n` decide alone: the limit divided by `n`,
    /// rounded up (at least 1).
    pub fn share(&self, n: NonZeroU32) -> Slots {
        let limit = NonZeroU32::new(self.limit.get().div_ceil(n.get())).unwrap_or(NonZeroU32::MIN);
        Slots { limit, ..*self }
    }

    /// The lease as a duration.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms.get())
    }
}

/// One limiter: which algorithm, with its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Algorithm {
    /// `lua/token_bucket.lua`
    TokenBucket(Bucket),
    /// `lua/leaky_bucket.lua`
    LeakyBucket(Pace),
    /// `lua/fixed_window.lua`
    FixedWindow(Window),
    /// `lua/sliding_window.lua`
    SlidingWindow(Window),
    /// `lua/sliding_window_counter.lua`
    SlidingWindowCounter(Window),
    /// `lua/concurrency.lua`: slots held while requests run, not a rate
    Concurrency(Slots),
}

impl Algorithm {
    /// One instance's share of a limit: rates divided by `n`, sizes divided by `n` rounded up (at
    /// least 1), so that `n` instances deciding alone together stay near the limit.
    pub fn share(&self, n: NonZeroU32) -> Algorithm {
        if n.get() == 1 {
            return *self;
        }
        let nf = f64::from(n.get());
        let rate = |r: Rate| Rate::per_second(r.per_sec() / nf).unwrap_or(r);
        let part32 =
            |v: NonZeroU32| NonZeroU32::new(v.get().div_ceil(n.get())).unwrap_or(NonZeroU32::MIN);
        let window = |w: &Window| Window {
            limit: NonZeroU64::new(w.limit.get().div_ceil(u64::from(n.get())))
                .unwrap_or(NonZeroU64::MIN),
            window_ms: w.window_ms,
        };
        match self {
            Algorithm::TokenBucket(b) => {
                let burst = part32(b.burst).max(b.cost);
                Algorithm::TokenBucket(Bucket {
                    rate: rate(b.rate),
                    burst,
                    ..*b
                })
            }
            Algorithm::LeakyBucket(p) => Algorithm::LeakyBucket(Pace {
                rate: rate(p.rate),
                max_delay_ms: p.max_delay_ms,
            }),
            Algorithm::FixedWindow(w) => Algorithm::FixedWindow(window(w)),
            Algorithm::SlidingWindow(w) => Algorithm::SlidingWindow(window(w)),
            Algorithm::SlidingWindowCounter(w) => Algorithm::SlidingWindowCounter(window(w)),
            Algorithm::Concurrency(s) => Algorithm::Concurrency(s.share(n)),
        }
    }

    /// Whether a limit of this algorithm may charge what the upstream reports after the
    /// response (`charge`): the token bucket and the two counting windows. A sliding log would
    /// need one entry per unit charged, a leaky bucket has sent the request already, and a
    /// concurrency slot counts requests running, not what they used.
    pub fn chargeable(&self) -> bool {
        match self {
            Algorithm::TokenBucket(_)
            | Algorithm::FixedWindow(_)
            | Algorithm::SlidingWindowCounter(_) => true,
            Algorithm::LeakyBucket(_) | Algorithm::SlidingWindow(_) | Algorithm::Concurrency(_) => {
                false
            }
        }
    }

    /// This algorithm for a limit that charges after the response: a token bucket keeps its
    /// debt ([`Bucket::debt`]); the windows need nothing more.
    pub fn charged(self) -> Algorithm {
        match self {
            Algorithm::TokenBucket(b) => Algorithm::TokenBucket(Bucket { debt: true, ..b }),
            other => other,
        }
    }

    /// The name used in `proxy.yaml` and for the script file (`lua/<name>.lua`).
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket(_) => "token_bucket",
            Algorithm::LeakyBucket(_) => "leaky_bucket",
            Algorithm::FixedWindow(_) => "fixed_window",
            Algorithm::SlidingWindow(_) => "sliding_window",
            Algorithm::SlidingWindowCounter(_) => "sliding_window_counter",
            Algorithm::Concurrency(_) => "concurrency",
        }
    }

    /// The quota and its window in seconds, as the IETF `RateLimit-Policy` field states them
    /// (`q` and `w`): a bucket's burst refills in `burst / rate` seconds. Concurrency has no
    /// window: 0, and the headers then state none.
    pub fn policy(&self) -> (u64, f64) {
        match self {
            Algorithm::TokenBucket(b) => (
                u64::from(b.burst.get()),
                f64::from(b.burst.get()) / b.rate.per_sec(),
            ),
            // a leaky bucket admits at once the request it sends now and those it queues within
            // max_delay: q of them, refilled at `rate` (the token bucket's burst and window, so
            // the two state the same policy for the same traffic)
            Algorithm::LeakyBucket(p) => {
                let queued = p
                    .max_delay_ms
                    .map_or(1.0, |d| d / p.rate.interval_ms() + 1.0)
                    .floor()
                    .max(1.0);
                (queued as u64, queued / p.rate.per_sec())
            }
            Algorithm::FixedWindow(w)
            | Algorithm::SlidingWindow(w)
            | Algorithm::SlidingWindowCounter(w) => {
                (w.limit.get(), w.window_ms.get() as f64 / 1000.0)
            }
            Algorithm::Concurrency(s) => (u64::from(s.limit.get()), 0.0),
        }
    }
}

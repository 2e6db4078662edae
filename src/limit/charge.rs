//! Charging after the response: a limit with `charge` admits a request for its `cost`, and
//! when the upstream reports what the request really used, the difference is charged here.
//! The Rust twin of `lua/charge.lua`: the same state, the same `f64` arithmetic in the same
//! order.
//!
//! * token bucket: the TAT moves forward by `amount · interval`, with no upper bound: a TAT
//!   past the tolerance is debt, and the check ([`Bucket::debt`]) refuses until it is repaid
//!   at the bucket's rate. A negative amount moves it back, never before `now` (a full bucket).
//! * fixed window, sliding-window counter: `amount` more in the count of the window that holds
//!   `now`, never below zero. A count past the limit refuses until the window ends (the
//!   counter: until its weight falls under the limit, in the next window at the latest).

use super::algorithms::{ceil0, counter_counts, fixed_count, stored_at, window_start};
use super::decision::ceil_ms;
use super::{Algorithm, Bucket, Millis, State, Window, EPS_MS};

/// What a key holds after a charge: the script's `{balance, reset_ms}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Balance {
    /// tokens (requests) left; negative: the debt
    pub balance: i64,
    /// ms until the key holds its whole quota again (rounded up)
    pub reset_ms: u64,
}

/// Charges `amount` more (negative: gives back) to `state` at `now`. `None` for an algorithm
/// that takes no charge ([`Algorithm::chargeable`]), which leaves the state as it is. With the
/// balance, the state's new time to live when it was written (`Some(0)`: as if none).
pub fn charge(
    alg: &Algorithm,
    state: &mut Option<State>,
    now: Millis,
    amount: i64,
) -> (Option<Balance>, Option<u64>) {
    let (balance, ttl) = match alg {
        Algorithm::TokenBucket(b) => bucket(b, state, now, amount),
        Algorithm::FixedWindow(w) => fixed(w, state, now, amount),
        Algorithm::SlidingWindowCounter(w) => counter(w, state, now, amount),
        Algorithm::LeakyBucket(_) | Algorithm::SlidingWindow(_) | Algorithm::Concurrency(_) => {
            return (None, None)
        }
    };
    (Some(balance), ttl)
}

fn bucket(
    b: &Bucket,
    state: &mut Option<State>,
    now: Millis,
    amount: i64,
) -> (Balance, Option<u64>) {
    let interval = b.rate.interval_ms();
    let tolerance = f64::from(b.burst.get()) * interval;
    let tat = stored_at(state).filter(|t| *t >= now).unwrap_or(now);
    // (no bound above: that is the debt; a give-back stops at a full bucket)
    let tat = (tat + amount as f64 * interval).max(now);
    let held = ((tolerance - (tat - now) + EPS_MS) / interval).floor();
    let balance = Balance {
        balance: held.min(f64::from(b.burst.get())) as i64,
        reset_ms: ceil0(tat - now),
    };
    if tat - now <= EPS_MS {
        // a full bucket is no bucket (the script deletes the key)
        let had = state.take().is_some();
        return (balance, had.then_some(0));
    }
    *state = Some(State::At(tat));
    (balance, Some(ceil_ms(tat - now)))
}

fn fixed(
    w: &Window,
    state: &mut Option<State>,
    now: Millis,
    amount: i64,
) -> (Balance, Option<u64>) {
    let window = w.window_ms.get() as f64;
    let start = window_start(now, window);
    let count = fixed_count(state, start).saturating_add_signed(amount);
    *state = Some(State::Fixed { start, count });
    let reset = ceil_ms(start + window - now);
    let balance = Balance {
        balance: signed(w.limit.get()) - signed(count),
        reset_ms: reset,
    };
    (balance, Some(reset))
}

fn counter(
    w: &Window,
    state: &mut Option<State>,
    now: Millis,
    amount: i64,
) -> (Balance, Option<u64>) {
    let (limit, window) = (w.limit.get() as f64, w.window_ms.get() as f64);
    let start = window_start(now, window);
    let window_end = start + window;
    let (curr, prev) = counter_counts(state, start, window);
    let curr = curr.saturating_add_signed(amount);
    *state = Some(State::Counter { start, curr, prev });
    let estimate = prev as f64 * (window - now + start) / window + curr as f64;
    // this window's count weighs until the next one ends; the previous one's until this ends
    let reset = match curr {
        0 => ceil_ms(window_end - now),
        _ => ceil_ms(window_end + window - now),
    };
    let balance = Balance {
        balance: (limit - estimate).floor() as i64,
        reset_ms: reset,
    };
    (balance, Some(ceil_ms(window_end + window - now)))
}

/// A count as a balance's term (counts past `i64::MAX` cannot be reached by charges).
fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use std::num::{NonZeroU32, NonZeroU64};
    use std::time::Duration;

    use super::*;
    use crate::limit::{apply, Rate};

    const T0: f64 = 1_700_000_040_000.0;

    fn bucket(rate: f64, burst: u32) -> Algorithm {
        let nz = |n| NonZeroU32::new(n).unwrap();
        let b = Bucket::new(Rate::per_second(rate).unwrap(), nz(burst), nz(1)).unwrap();
        Algorithm::TokenBucket(b).charged()
    }

    fn window(limit: u64, ms: u64) -> Window {
        Window::new(NonZeroU64::new(limit).unwrap(), Duration::from_millis(ms))
    }

    /// A charge of 50 into a bucket of 100 at 100/s after one request: 49 left, and after
    /// 150 more in debt the next request waits until the debt and its own token are repaid.
    #[test]
    fn a_debt_refuses_until_repaid_at_the_rate() {
        let alg = bucket(100.0, 100);
        let mut state = None;
        assert!(apply(&alg, &mut state, T0).0.allowed);
        let (b, _) = charge(&alg, &mut state, T0, 50);
        assert_eq!(b.unwrap().balance, 49);
        let (b, _) = charge(&alg, &mut state, T0, 150);
        assert_eq!(b.unwrap().balance, -101);
        let (d, _) = apply(&alg, &mut state, T0);
        assert!(!d.allowed);
        // 102 tokens to come back at 10 ms each: the debt of 101, and the request's own
        assert_eq!(d.retry_after_ms, 1020);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset_ms, 2010);
        assert!(!apply(&alg, &mut state, T0 + 1019.0).0.allowed);
        assert!(apply(&alg, &mut state, T0 + 1020.0).0.allowed);
    }

    /// Without `debt` a TAT past the tolerance is clamped as a bucket of other parameters;
    /// with it the debt stays.
    #[test]
    fn only_a_charged_bucket_keeps_its_debt() {
        let charged = bucket(10.0, 5);
        let Algorithm::TokenBucket(mut plain) = charged else {
            unreachable!()
        };
        plain.debt = false;
        let plain = Algorithm::TokenBucket(plain);
        let far = Some(State::At(T0 + 10_000.0));
        let (mut a, mut b) = (far.clone(), far);
        let kept = apply(&charged, &mut a, T0).0;
        let clamped = apply(&plain, &mut b, T0).0;
        assert_eq!(kept.retry_after_ms, 9600);
        assert_eq!(clamped.retry_after_ms, 100);
    }

    /// A give-back never fills a bucket past full, and a full bucket is no state.
    #[test]
    fn a_give_back_stops_at_a_full_bucket() {
        let alg = bucket(10.0, 5);
        let mut state = None;
        assert!(apply(&alg, &mut state, T0).0.allowed);
        let (b, ttl) = charge(&alg, &mut state, T0, -3);
        assert_eq!(
            b.unwrap(),
            Balance {
                balance: 5,
                reset_ms: 0
            }
        );
        assert_eq!((state, ttl), (None, Some(0)));
        let (_, ttl) = charge(&alg, &mut None, T0, -1);
        assert_eq!(ttl, None, "nothing written for a key that holds nothing");
    }

    /// The windows count the charge in the window that holds `now`, never below zero.
    #[test]
    fn windows_count_the_charge_in_the_current_window() {
        let alg = Algorithm::FixedWindow(window(10, 1000));
        let mut state = None;
        assert!(apply(&alg, &mut state, T0 + 100.0).0.allowed);
        let (b, _) = charge(&alg, &mut state, T0 + 200.0, 14);
        assert_eq!(
            b.unwrap(),
            Balance {
                balance: -5,
                reset_ms: 800
            }
        );
        let d = apply(&alg, &mut state, T0 + 300.0).0;
        assert!(!d.allowed && d.retry_after_ms == 700);
        assert!(apply(&alg, &mut state, T0 + 1000.0).0.allowed);
        let (b, _) = charge(&alg, &mut state, T0 + 1001.0, -5);
        assert_eq!(b.unwrap().balance, 10);

        let alg = Algorithm::SlidingWindowCounter(window(10, 1000));
        let mut state = None;
        assert!(apply(&alg, &mut state, T0 + 500.0).0.allowed);
        let (b, _) = charge(&alg, &mut state, T0 + 500.0, 19);
        assert_eq!(b.unwrap().balance, -10);
        // at 1500 half of the 20 still weighs: refused until it weighs 9
        let d = apply(&alg, &mut state, T0 + 1500.0).0;
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ms, 50);
    }

    /// The leaky bucket and the sliding log take no charge and keep their state.
    #[test]
    fn other_algorithms_take_no_charge() {
        let alg = Algorithm::SlidingWindow(window(3, 1000));
        let mut state = None;
        assert!(apply(&alg, &mut state, T0).0.allowed);
        let before = state.clone();
        assert_eq!(charge(&alg, &mut state, T0, 5), (None, None));
        assert_eq!(state, before);
    }
}

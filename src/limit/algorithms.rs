//! The step function of each algorithm: given the key's state and `now`, decide and update the
//! state. Each mirrors its Lua script line for line; keep them in step (see `lua/`).

use std::collections::VecDeque;

use super::decision::ceil_ms;
use super::{Algorithm, Bucket, Decision, Millis, Pace, Window, EPS_MS};

/// What one key holds between requests.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// token bucket: the theoretical arrival time; leaky bucket: the next free slot
    At(Millis),
    /// fixed window: the aligned window's start and its count
    Fixed {
        /// window start (ms)
        start: Millis,
        /// admitted in this window
        count: u64,
    },
    /// sliding window: times of the admitted requests still in the window, oldest first
    Log(VecDeque<Millis>),
    /// sliding-window counter: the current aligned window's start, its count, the previous count
    Counter {
        /// current window start (ms)
        start: Millis,
        /// admitted in the current window
        curr: u64,
        /// admitted in the previous window
        prev: u64,
    },
    /// concurrency: each holder's id and the end of its lease (ms)
    Held(std::collections::BTreeMap<Box<str>, Millis>),
}

/// Decides one request at `now` against `state` (`None`: the key is new or expired), updating
/// `state` when the request is admitted (or, for a token bucket left by other parameters, when
/// it is found empty). Returns the decision and, when the state was written,
/// its time to live in ms (the `PX` the script sets): after that the state is equivalent to none.
pub fn apply(alg: &Algorithm, state: &mut Option<State>, now: Millis) -> (Decision, Option<u64>) {
    match alg {
        Algorithm::TokenBucket(b) => token_bucket(b, state, now),
        Algorithm::LeakyBucket(p) => leaky_bucket(p, state, now),
        Algorithm::FixedWindow(w) => fixed_window(w, state, now),
        Algorithm::SlidingWindow(w) => sliding_window(w, state, now),
        Algorithm::SlidingWindowCounter(w) => sliding_window_counter(w, state, now),
        // (a look only: slots are taken by `acquire`, which names the holder)
        Algorithm::Concurrency(s) => (super::concurrency::look(s, state, now), None),
    }
}

pub(super) fn stored_at(state: &Option<State>) -> Option<Millis> {
    match state {
        Some(State::At(t)) => Some(*t),
        _ => None,
    }
}

/// GCRA: see `lua/token_bucket.lua` for the derivation.
fn token_bucket(b: &Bucket, state: &mut Option<State>, now: Millis) -> (Decision, Option<u64>) {
    let interval = b.rate.interval_ms();
    let tolerance = f64::from(b.burst.get()) * interval;
    let mut tat = stored_at(state).filter(|t| *t >= now).unwrap_or(now);
    // A bucket written under other parameters (a limit changed by a reload) may lie further
    // ahead than this one holds: it is empty now, written so (also when this request is
    // refused), and refills at this rate from here. A charged bucket's TAT that far ahead is
    // debt, which stays.
    let emptied = !b.debt && tat - now - tolerance > EPS_MS;
    if emptied {
        tat = now + tolerance;
    }
    let after = tat - now + f64::from(b.cost.get()) * interval;
    if after - tolerance > EPS_MS {
        // refused: the tokens the bucket holds (fewer than the cost)
        let held = ((tolerance - (tat - now) + EPS_MS) / interval)
            .floor()
            .max(0.0) as u64;
        let decision = Decision::counted(
            false,
            held.min(u64::from(b.burst.get())),
            ceil_ms(after - tolerance - EPS_MS),
            ceil0(tat - now),
        );
        if emptied {
            *state = Some(State::At(tat));
            return (decision, Some(ceil_ms(tolerance)));
        }
        return (decision, None);
    }
    *state = Some(State::At(now + after));
    // (EPS_MS is worth more than a token past 1 000 000 tokens a second: capped at what a full
    // bucket keeps after this request)
    let full = u64::from(b.burst.get()).saturating_sub(u64::from(b.cost.get()));
    let remaining = (((tolerance - after + EPS_MS) / interval).floor() as u64).min(full);
    let decision = Decision::counted(true, remaining, 0, ceil0(after));
    (decision, Some(ceil_ms(after)))
}

/// Pacing: see `lua/leaky_bucket.lua`.
fn leaky_bucket(p: &Pace, state: &mut Option<State>, now: Millis) -> (Decision, Option<u64>) {
    let interval = p.rate.interval_ms();
    let slot = stored_at(state).filter(|t| *t >= now).unwrap_or(now);
    let delay = slot - now;
    let delay_us = round_micros(delay);
    if p.max_delay_ms.is_some_and(|max| delay - max > EPS_MS) {
        return (
            Decision::paced(false, delay_us, interval, p.max_delay_ms),
            None,
        );
    }
    let ahead = delay + interval;
    *state = Some(State::At(now + ahead));
    let decision = Decision::paced(true, delay_us, interval, p.max_delay_ms);
    (decision, Some(ceil_ms(ahead)))
}

/// Upstream back-pressure (`lua/pace_defer.lua`): no slot of the schedule before `now + hold_ms`.
/// Returns the next free slot in ms from now (rounded up) and, when the state was written, its
/// time to live. The schedule only ever moves later.
pub fn defer(p: &Pace, state: &mut Option<State>, now: Millis, hold_ms: f64) -> (u64, Option<u64>) {
    let held = now + hold_ms;
    match stored_at(state) {
        Some(slot) if slot >= held => (ceil0(slot - now), None),
        _ => {
            *state = Some(State::At(held));
            (
                ceil0(held - now),
                Some(ceil_ms(hold_ms + p.rate.interval_ms())),
            )
        }
    }
}

/// Undoes an admitted check of `alg` made `age_ms` before `now` (a later limit of the request
/// refused it): what the check took goes back, as `lua/give_back.lua` does in Redis. For a
/// leaky bucket `age_ms` is the age of the slot the check took (negative: a slot still ahead).
/// A caller measures the age from when the check's answer arrived, so `now - age_ms` is the
/// check's time (its slot's) or later by the round trips, never earlier: the rules below err
/// on the safe side for that.
/// Returns whether anything was given back, and the state's new time to live when it changes
/// (`Some(0)`: the state is idle, as if none; `None`: it stays).
///
/// * token bucket: the TAT moves back by what the check moved it forward, never before `now`
///   (tokens are all alike: checks made since keep theirs);
/// * leaky bucket: the next free slot moves back by one interval when the slot given back is
///   still the last one handed out (else it stays: a slot in the middle cannot be reused
///   without two requests going out at once) — the last when it lies at `now - age_ms` or
///   up to half an interval before it;
/// * fixed window, sliding-window counter: one less in the window the check counted in (the
///   one holding `now - age_ms`), if that window is still kept, and `now - age_ms` is not in
///   the first 50 ms of it (or half of it): the check may have been in the window before;
/// * sliding window: the newest entry at or before `now - age_ms` leaves the log.
pub fn give_back(
    alg: &Algorithm,
    state: &mut Option<State>,
    now: Millis,
    age_ms: f64,
) -> (bool, Option<u64>) {
    let at = now - age_ms;
    // a TAT or next slot now or past: the bucket is full, the schedule idle, nothing is held
    if let Some(State::At(t)) = state {
        if *t - now <= EPS_MS {
            return (false, None);
        }
    }
    match (alg, state.as_mut()) {
        (Algorithm::TokenBucket(b), Some(State::At(t))) => {
            let t = *t;
            let taken = f64::from(b.cost.get()) * b.rate.interval_ms();
            (true, move_back(state, t, taken, now))
        }
        (Algorithm::LeakyBucket(p), Some(State::At(t))) => {
            // the slot given back is the last one when the schedule's next free slot is one
            // interval after it; `at` is that slot or later (see above)
            let (t, interval) = (*t, p.rate.interval_ms());
            let last = t - interval;
            if last - at > AGE_EPS_MS || at - last > interval / 2.0 {
                return (false, None);
            }
            (true, move_back(state, t, interval, now))
        }
        (Algorithm::FixedWindow(w), Some(State::Fixed { start, count })) => {
            let window = w.window_ms.get() as f64;
            // (a window that is over holds nothing)
            let over = *start + window <= now;
            if over || *start != window_start(at, window) || *count == 0 || near_start(at, window) {
                return (false, None);
            }
            *count -= 1;
            (true, Some(ceil_ms(*start + window - now)))
        }
        (Algorithm::SlidingWindowCounter(w), Some(State::Counter { start, curr, prev })) => {
            let window = w.window_ms.get() as f64;
            let counted = window_start(at, window);
            // (a count two windows old weighs nothing)
            if near_start(at, window) || counted + 2.0 * window <= now {
                return (false, None);
            }
            let held = if *start == counted {
                curr
            } else if *start == counted + window {
                prev
            } else {
                return (false, None);
            };
            if *held == 0 {
                return (false, None);
            }
            *held -= 1;
            (true, Some(ceil_ms(*start + 2.0 * window - now)))
        }
        (Algorithm::SlidingWindow(w), Some(State::Log(log))) => {
            let Some(newest) = log.partition_point(|t| *t <= at).checked_sub(1) else {
                return (false, None);
            };
            // (an entry a window old no longer counts)
            if log[newest] <= now - w.window_ms.get() as f64 {
                return (false, None);
            }
            log.remove(newest);
            (true, None)
        }
        _ => (false, None),
    }
}

/// A TAT (next free slot) `t` moved back by `ms`: no state when that is `now` or before (a full
/// bucket, an idle schedule). The state's time to live, as [`give_back`] returns it.
fn move_back(state: &mut Option<State>, t: Millis, ms: f64, now: Millis) -> Option<u64> {
    let back = t - ms;
    if back - now <= EPS_MS {
        *state = None;
        return Some(0);
    }
    *state = Some(State::At(back));
    Some(ceil_ms(back - now))
}

/// Slack when comparing a slot with `now - age_ms` (µs rounding of the delays).
const AGE_EPS_MS: f64 = 0.01;

/// Whether `at` lies so soon after the start of its window that the check may have been made
/// in the window before: nothing is given back then (the check stays counted in whichever
/// window it was, which errs on the safe side).
fn near_start(at: Millis, window: f64) -> bool {
    at - window_start(at, window) < GIVE_BACK_MARGIN_MS.min(window / 2.0)
}

/// See [`near_start`]: more than the round trips between a check and its give-back take.
const GIVE_BACK_MARGIN_MS: f64 = 50.0;

/// The script's `math.floor(ms * 1000 + 0.5)`: a delay to the nearest microsecond.
fn round_micros(ms: f64) -> u64 {
    (ms * 1000.0 + 0.5).floor().max(0.0) as u64
}

/// `math.ceil` of a span that may be zero or negative, clamped at zero.
pub(super) fn ceil0(ms: f64) -> u64 {
    ms.ceil().max(0.0) as u64
}

/// The aligned window containing `now`: `floor(now / window) * window`, as the scripts compute it.
pub(super) fn window_start(now: Millis, window: f64) -> Millis {
    (now / window).floor() * window
}

/// The count a fixed window's state holds for the window starting at `start` (none when it
/// holds an older window's).
pub(super) fn fixed_count(state: &Option<State>, start: Millis) -> u64 {
    match state {
        Some(State::Fixed { start: s, count }) if *s == start => *count,
        _ => 0,
    }
}

/// The `(current, previous)` counts a sliding-window counter's state holds for the window
/// starting at `start`: the state's own window becomes the previous one when the next has begun.
pub(super) fn counter_counts(state: &Option<State>, start: Millis, window: f64) -> (u64, u64) {
    match state {
        Some(State::Counter {
            start: s,
            curr,
            prev,
        }) if *s == start => (*curr, *prev),
        Some(State::Counter { start: s, curr, .. }) if *s == start - window => (0, *curr),
        _ => (0, 0),
    }
}

/// Aligned windows: see `lua/fixed_window.lua`.
fn fixed_window(w: &Window, state: &mut Option<State>, now: Millis) -> (Decision, Option<u64>) {
    let (limit, window) = (w.limit.get(), w.window_ms.get() as f64);
    let start = window_start(now, window);
    let reset = ceil_ms(start + window - now);
    let count = fixed_count(state, start);
    if count >= limit {
        return (Decision::counted(false, 0, reset, reset), None);
    }
    *state = Some(State::Fixed {
        start,
        count: count + 1,
    });
    (
        Decision::counted(true, limit - count - 1, 0, reset),
        Some(reset),
    )
}

/// A log of admitted requests: see `lua/sliding_window.lua`.
fn sliding_window(w: &Window, state: &mut Option<State>, now: Millis) -> (Decision, Option<u64>) {
    let (limit, window) = (w.limit.get(), w.window_ms.get() as f64);
    if !matches!(state, Some(State::Log(_))) {
        *state = Some(State::Log(VecDeque::new()));
    }
    let Some(State::Log(log)) = state else {
        unreachable!("set to a log just above")
    };
    // ZREMRANGEBYSCORE -inf (now - window): entries at or before the cut-off have left
    let cutoff = now - window;
    log.retain(|t| *t > cutoff);
    let count = log.len() as u64;
    if count >= limit {
        let nth = log[(count - limit) as usize];
        let retry = ceil_ms(nth + window - now);
        return (Decision::counted(false, 0, retry, retry), None);
    }
    // keep the log sorted by time, as the sorted set is, even if clocks hand us an older `now`
    let at = log.partition_point(|t| *t <= now);
    log.insert(at, now);
    let oldest = log[0];
    let decision = Decision::counted(true, limit - count - 1, 0, ceil_ms(oldest + window - now));
    (decision, Some(ceil_ms(window)))
}

/// Two weighted counters: see `lua/sliding_window_counter.lua` for the estimate.
fn sliding_window_counter(
    w: &Window,
    state: &mut Option<State>,
    now: Millis,
) -> (Decision, Option<u64>) {
    let (limit, window) = (w.limit.get() as f64, w.window_ms.get() as f64);
    let start = window_start(now, window);
    let window_end = start + window;
    let (curr, prev) = counter_counts(state, start, window);
    // the time from now until the estimate admits one more, with these counts (see the script)
    let wait_for_one = |curr: f64, prev: f64| {
        if curr + 1.0 <= limit {
            window_end - (limit - 1.0 - curr) * window / prev - now
        } else {
            window_end + window - (limit - 1.0) * window / curr - now
        }
    };
    let (currf, prevf) = (curr as f64, prev as f64);
    let estimate = prevf * (window - now + start) / window + currf;
    if estimate + 1.0 > limit {
        let retry = ceil_ms(wait_for_one(currf, prevf));
        let reset = retry.max(ceil0(window_end - now));
        return (Decision::counted(false, 0, retry, reset), None);
    }
    *state = Some(State::Counter {
        start,
        curr: curr + 1,
        prev,
    });
    let left = (limit - estimate - 1.0).floor();
    let mut reset = ceil0(window_end - now);
    if left <= 0.0 {
        // none left: the quota is back no sooner than the next request is admitted
        reset = reset.max(ceil0(wait_for_one(currf + 1.0, prevf)));
    }
    let decision = Decision::counted(true, left.max(0.0) as u64, 0, reset.max(1));
    (decision, Some(ceil_ms(window_end + window - now)))
}

#[cfg(test)]
mod tests;

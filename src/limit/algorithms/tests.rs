use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::limit::Rate;

const T0: f64 = 1_700_000_000_000.0;

fn bucket(rate: f64, burst: u32, cost: u32) -> Algorithm {
    let nz = |n| NonZeroU32::new(n).unwrap();
    Algorithm::TokenBucket(
        Bucket::new(Rate::per_second(rate).unwrap(), nz(burst), nz(cost)).unwrap(),
    )
}

fn window(limit: u64, ms: u64) -> Window {
    Window::new(NonZeroU64::new(limit).unwrap(), Duration::from_millis(ms))
}

fn pace(rate: f64, max_delay_ms: Option<u64>) -> Algorithm {
    let p = Pace::new(
        Rate::per_second(rate).unwrap(),
        max_delay_ms.map(Duration::from_millis),
    );
    Algorithm::LeakyBucket(p.unwrap())
}

/// Runs requests at the given times; returns the decisions.
fn run(alg: &Algorithm, times: &[f64]) -> Vec<Decision> {
    let mut state = None;
    times.iter().map(|t| apply(alg, &mut state, *t).0).collect()
}

/// A full token bucket admits exactly `burst` at once, then reports the exact wait for one token.
#[test]
fn token_bucket_admits_burst_then_denies_with_exact_retry() {
    let d = run(&bucket(10.0, 20, 1), &[T0; 21]);
    assert!(d[..20].iter().all(|d| d.allowed));
    assert_eq!(d[0].remaining, 19);
    assert_eq!(d[19].remaining, 0);
    assert_eq!(d[20], Decision::counted(false, 0, 100, 2000));
}

/// Past a million tokens a second a token is worth less than the 1 µs the comparisons allow
/// (and than the rounding of a timestamp in ms), so the count is approximate there; it still
/// never exceeds what a full bucket keeps after the request, nor grows within one instant.
#[test]
fn token_bucket_remaining_stays_within_burst_at_huge_rates() {
    let d = run(&bucket(100_000_000.0, 10, 1), &[T0; 5]);
    assert_eq!(d[0].remaining, 9);
    assert!(
        d.windows(2).all(|w| w[1].remaining <= w[0].remaining),
        "{d:?}"
    );
    let d = run(&bucket(5_000_000.0, 100, 3), &[T0]);
    assert_eq!(d[0].remaining, 97);
}

/// Tokens come back at the rate: one every 100 ms at 10/s.
#[test]
fn token_bucket_refills_at_rate() {
    let alg = bucket(10.0, 2, 1);
    let d = run(
        &alg,
        &[T0, T0, T0, T0 + 99.0, T0 + 100.0, T0 + 150.0, T0 + 200.0],
    );
    let allowed: Vec<bool> = d.iter().map(|d| d.allowed).collect();
    assert_eq!(allowed, [true, true, false, false, true, false, true]);
    assert_eq!(d[3].retry_after_ms, 1);
    assert_eq!(d[5].retry_after_ms, 50);
}

/// A request costing several tokens needs all of them.
#[test]
fn token_bucket_cost_takes_several_tokens() {
    let d = run(&bucket(1.0, 5, 3), &[T0, T0, T0 + 1000.0]);
    assert!(d[0].allowed && !d[1].allowed && d[2].allowed);
    assert_eq!(d[0].remaining, 2);
    assert_eq!(d[1].retry_after_ms, 1000);
    assert_eq!(d[2].remaining, 0);
}

/// A bucket left by a slower limit (a reload raised it) is empty under the new one, not in
/// debt for the old one's time: refused for one new interval, then it refills at the new rate;
/// and the refusal that found it so told an honest wait.
#[test]
fn token_bucket_left_by_other_parameters_is_empty_not_in_debt() {
    let mut state = None;
    let slow = bucket(1.0 / 60.0, 2, 2);
    assert!(apply(&slow, &mut state, T0).0.allowed); // two minutes ahead now
    let fast = bucket(100.0, 100, 1);
    let (refused, written) = apply(&fast, &mut state, T0);
    assert!(!refused.allowed);
    assert_eq!((refused.retry_after_ms, refused.reset_ms), (10, 1000));
    assert_eq!(written, Some(1000), "the emptied bucket is written");
    let (later, _) = apply(&fast, &mut state, T0 + 10.0);
    assert!(later.allowed, "admitted when the refusal said: {later:?}");
}

/// A fixed window resets at its aligned end even for a client that never stops.
#[test]
fn fixed_window_resets_at_aligned_end_under_constant_traffic() {
    let alg = Algorithm::FixedWindow(window(3, 1000));
    let start = 1_700_000_000_000.0; // a multiple of 1000
    let times: Vec<f64> = (0..20).map(|i| start + 500.0 + i as f64 * 50.0).collect();
    let d = run(&alg, &times);
    let allowed = d.iter().filter(|d| d.allowed).count();
    assert_eq!(allowed, 6, "3 in each of the two windows touched");
    assert_eq!(d[3].retry_after_ms, 350);
    assert!(
        d[10].allowed,
        "first request of the next window is admitted"
    );
}

/// Requests in the same millisecond are each counted by the sliding window.
#[test]
fn sliding_window_counts_same_millisecond_requests() {
    let alg = Algorithm::SlidingWindow(window(3, 1000));
    let d = run(&alg, &[T0, T0, T0, T0, T0 + 999.0, T0 + 1000.0]);
    let allowed: Vec<bool> = d.iter().map(|d| d.allowed).collect();
    assert_eq!(allowed, [true, true, true, false, false, true]);
    assert_eq!(d[3].retry_after_ms, 1000);
    assert_eq!(d[4].retry_after_ms, 1);
}

/// The counter weighs the previous window by the share still inside the sliding window.
#[test]
fn sliding_window_counter_weighs_previous_window() {
    let alg = Algorithm::SlidingWindowCounter(window(10, 1000));
    let start = 1_700_000_000_000.0;
    let mut state = None;
    for _ in 0..10 {
        assert!(apply(&alg, &mut state, start + 100.0).0.allowed);
    }
    // 300 ms into the next window, 0.7 of the 10 still count: 7 used, 3 left
    let t = start + 1300.0;
    let d: Vec<Decision> = (0..4).map(|_| apply(&alg, &mut state, t).0).collect();
    assert!(d[..3].iter().all(|d| d.allowed));
    assert_eq!(d[0].remaining, 2);
    assert!(!d[3].allowed);
    // estimate 10*(1000-e)/1000 + 3 + 1 <= 10 once e >= 400
    assert_eq!(d[3].retry_after_ms, 100);
    assert!(apply(&alg, &mut state, t + 100.0).0.allowed);
}

/// The counter's last request admitted (none left) states the time until it admits one again
/// as its reset when that is past the window's end: a client waiting out `t` is not refused.
#[test]
fn sliding_window_counter_reset_is_never_early_when_none_is_left() {
    // ten just after a window starts: the tenth leaves none, and the next is admitted 300 ms
    // into the next window (10 * 0.7 + 1 <= 10 ... 0.7 of 10 still count until e >= 300)
    let alg = Algorithm::SlidingWindowCounter(window(10, 3000));
    let start = 1_700_000_001_000.0 - 1_700_000_001_000.0 % 3000.0;
    let mut state = None;
    let d: Vec<Decision> = (0..10)
        .map(|_| apply(&alg, &mut state, start + 10.0).0)
        .collect();
    assert!(d.iter().all(|d| d.allowed));
    assert_eq!(d[8].reset_ms, 2990, "one left: the window's end");
    assert_eq!((d[9].remaining, d[9].reset_ms), (0, 3290));
    assert!(!apply(&alg, &mut state, start + 10.0 + 3289.0).0.allowed);
    assert!(apply(&alg, &mut state, start + 10.0 + 3290.0).0.allowed);
    // a limit of one: the next is admitted once the previous window's one no longer counts
    let alg = Algorithm::SlidingWindowCounter(window(1, 3_600_000));
    let mut state = None;
    let first = apply(&alg, &mut state, start + 10.0).0;
    let end = 3_600_000.0 - (start + 10.0) % 3_600_000.0;
    assert_eq!(first.reset_ms, (end + 3_600_000.0) as u64);
}

/// Pacing hands out slots one interval apart and refuses, reserving nothing, past max_delay.
#[test]
fn leaky_bucket_spaces_slots_and_refuses_past_max_delay() {
    let alg = pace(4.0, Some(500));
    let d = run(&alg, &[T0, T0, T0, T0, T0 + 250.0]);
    let delays: Vec<u64> = d.iter().map(|d| d.delay_us).collect();
    assert_eq!(delays, [0, 250_000, 500_000, 0, 500_000]);
    assert!(!d[3].allowed, "750 ms wait is past 500 ms");
    assert_eq!(d[3].retry_after_ms, 250);
    assert!(d[4].allowed, "the refused request reserved nothing");
}

/// A rate of 1/3 per second still gives whole, exact slots.
#[test]
fn leaky_bucket_fractional_interval_rounds_to_microseconds() {
    let d = run(&pace(3.0, None), &[T0, T0, T0]);
    assert_eq!(d[1].delay_us, 333_333);
    assert_eq!(d[2].delay_us, 666_667);
}

fn sorted_times(max_gap: u64, n: usize) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(0..=max_gap, 1..n).prop_map(|gaps| {
        let mut t = T0;
        gaps.iter()
            .map(|g| {
                t += *g as f64;
                t
            })
            .collect()
    })
}

proptest! {
    /// Token bucket: in any span T, at most burst + rate*T tokens are taken.
    #[test]
    fn token_bucket_never_exceeds_burst_plus_rate(rate in 1u32..50, burst in 1u32..20,
                                                  times in sorted_times(40, 300)) {
        let alg = bucket(f64::from(rate), burst, 1);
        let d = run(&alg, &times);
        let admitted: Vec<f64> = times.iter().zip(&d).filter(|(_, d)| d.allowed).map(|(t, _)| *t).collect();
        for (i, start) in admitted.iter().enumerate() {
            for (j, end) in admitted.iter().enumerate().skip(i) {
                // Each admission's TAT is a timestamp in ms near 1.7e12, rounded to its f64
                // (2.4e-4 ms apart): over a long chain of admissions the bucket may run a few
                // µs ahead, so the span is given 1 µs per admission (the precision the
                // comparisons allow, EPS_MS) — without it a chain of 228 admissions over 5.4 s
                // at 41/s was found to exceed the bound by 0.001 tokens.
                let count = (j - i + 1) as f64;
                let span_s = (end - start + count * EPS_MS) / 1000.0;
                let bound = f64::from(burst) + f64::from(rate) * span_s + 1e-6;
                prop_assert!((j - i + 1) as f64 <= bound, "{} admitted in {span_s}s", j - i + 1);
            }
        }
    }

    /// Every denial's retry_after is exact: denied 1 ms earlier (when > 1), admitted then.
    #[test]
    fn retry_after_is_exact(alg_ix in 0usize..4, times in sorted_times(30, 120)) {
        let algs = [bucket(7.0, 5, 2), Algorithm::FixedWindow(window(5, 700)),
                    Algorithm::SlidingWindow(window(5, 700)), Algorithm::SlidingWindowCounter(window(5, 700))];
        let alg = algs[alg_ix];
        let mut state = None;
        for t in times {
            let before = state.clone();
            let (d, _) = apply(&alg, &mut state, t);
            if !d.allowed {
                prop_assert!(d.retry_after_ms >= 1);
                let at = t + d.retry_after_ms as f64;
                prop_assert!(apply(&alg, &mut before.clone(), at).0.allowed, "not admitted at retry_after");
                if d.retry_after_ms > 1 && !matches!(alg, Algorithm::SlidingWindowCounter(_)) {
                    prop_assert!(!apply(&alg, &mut before.clone(), at - 1.0).0.allowed, "admitted before retry_after");
                }
            }
        }
    }

    /// Fixed window: at most `limit` per aligned window.
    #[test]
    fn fixed_window_at_most_limit_per_window(limit in 1u64..10, times in sorted_times(50, 300)) {
        let alg = Algorithm::FixedWindow(window(limit, 1000));
        let d = run(&alg, &times);
        let mut per = std::collections::HashMap::<i64, u64>::new();
        for (t, d) in times.iter().zip(&d) {
            if d.allowed { *per.entry((t / 1000.0).floor() as i64).or_default() += 1; }
        }
        prop_assert!(per.values().all(|n| *n <= limit));
    }

    /// Sliding window (log and counter): at most `limit` in any span shorter than the window.
    #[test]
    fn sliding_windows_at_most_limit_in_any_window(limit in 1u64..10, counter in any::<bool>(),
                                                   times in sorted_times(50, 300)) {
        let w = window(limit, 1000);
        let alg = if counter { Algorithm::SlidingWindowCounter(w) } else { Algorithm::SlidingWindow(w) };
        let d = run(&alg, &times);
        let admitted: Vec<f64> = times.iter().zip(&d).filter(|(_, d)| d.allowed).map(|(t, _)| *t).collect();
        // the counter is an estimate: it may admit up to one window's worth more across a
        // boundary in the worst case, so hold it to 2x; the log is exact
        let bound = if counter { 2 * limit } else { limit } as usize;
        for (i, start) in admitted.iter().enumerate() {
            let n = admitted[i..].iter().take_while(|t| **t < start + 1000.0).count();
            prop_assert!(n <= bound, "{n} admitted within one window");
        }
    }

    /// Pacing: admitted requests' start times (arrival + delay) are at least 1/rate apart.
    #[test]
    fn leaky_bucket_slots_at_least_interval_apart(rate in 1u32..200, max in prop::option::of(0u64..2000),
                                                   times in sorted_times(20, 300)) {
        let alg = pace(f64::from(rate), max);
        let d = run(&alg, &times);
        let mut starts: Vec<f64> = times.iter().zip(&d).filter(|(_, d)| d.allowed)
            .map(|(t, d)| t + d.delay_us as f64 / 1000.0).collect();
        starts.sort_by(f64::total_cmp);
        let interval = 1000.0 / f64::from(rate);
        for pair in starts.windows(2) {
            prop_assert!(pair[1] - pair[0] >= interval - 0.002, "{:?} closer than {interval}", pair);
        }
        if let Some(max) = max {
            prop_assert!(d.iter().all(|d| d.delay_us <= max * 1000 + 1));
        }
    }
}

/// A leaky slot's give-back allows for `now - age` being late by the round trips (the age is
/// measured from when the answer came): its own slot, up to half an interval before that time,
/// is given back; a slot handed out after it, though nearer that time, is not.
#[test]
fn a_late_leaky_give_back_frees_only_the_last_slot() {
    let alg = pace(200.0, None); // 5 ms apart
    let mut state = None;
    assert!(apply(&alg, &mut state, T0).0.allowed); // slot T0
                                                    // given back 2 ms late (`now - age` = T0 + 2): still T0's
    give_back(&alg, &mut state, T0 + 4.0, 2.0);
    assert_eq!(state, None, "the only slot given back");
    assert!(apply(&alg, &mut state, T0).0.allowed); // slot T0
    assert!(apply(&alg, &mut state, T0).0.allowed); // slot T0 + 5
                                                    // the first slot's give-back, 3 ms late (`now - age` = T0 + 3: 2 ms from the second slot,
                                                    // nearer than the first, but the second lies after it, so it cannot be the one)
    give_back(&alg, &mut state, T0 + 4.0, 1.0);
    assert_eq!(state, Some(State::At(T0 + 10.0)), "the second slot stays");
}

//! Concurrency: at most `limit` holders at once per key, each holding a lease that ends unless
//! renewed. The twin of `lua/concurrency.lua`: the same sorted set (holder, lease end), the same
//! `f64` sums in the same order. A lease that ends frees its slot, so the slots of an instance
//! that died come back by themselves.

use std::collections::BTreeMap;

use super::decision::ceil_ms;
use super::{Decision, Millis, Slots, State};

/// The key's live holders: leases ended at or before `now` dropped (`ZREMRANGEBYSCORE -inf
/// now`); another algorithm's state starts afresh, as the script deletes a key of another type.
fn live(state: &mut Option<State>, now: Millis) -> &mut BTreeMap<Box<str>, Millis> {
    if !matches!(state, Some(State::Held(_))) {
        *state = Some(State::Held(BTreeMap::new()));
    }
    let Some(State::Held(held)) = state else {
        unreachable!("set to holders just above")
    };
    held.retain(|_, end| *end > now);
    held
}

/// An empty set is no key in Redis: the state says so too.
fn tidy(state: &mut Option<State>) {
    if matches!(state, Some(State::Held(h)) if h.is_empty()) {
        *state = None;
    }
}

/// Takes a slot for `holder` at `now`, if one is free. A holder that holds one already keeps
/// it, renewed. Returns the decision and, when the state was written, its time to live.
pub fn acquire(
    s: &Slots,
    state: &mut Option<State>,
    now: Millis,
    holder: &str,
) -> (Decision, Option<u64>) {
    let (decision, take) = decide(s, state, now, Some(holder));
    if take {
        let lease = s.lease_ms.get() as f64;
        live(state, now).insert(holder.into(), now + lease);
        return (decision, Some(s.lease_ms.get()));
    }
    tidy(state);
    (decision, None)
}

/// Whether `state` is another algorithm's: it holds no slot, and renewals and releases leave
/// it alone (the script's `TYPE` check).
fn foreign(state: &Option<State>) -> bool {
    state.as_ref().is_some_and(|s| !matches!(s, State::Held(_)))
}

/// What [`acquire`] would answer, taking nothing (the console's look at a client, and
/// `Store::check`).
pub(super) fn look(s: &Slots, state: &mut Option<State>, now: Millis) -> Decision {
    if foreign(state) {
        return decide(s, &mut None, now, None).0;
    }
    let decision = decide(s, state, now, None).0;
    tidy(state);
    decision
}

/// The decision for a holder (or, with `None`, a new one), and whether a slot is to be
/// written.
fn decide(
    s: &Slots,
    state: &mut Option<State>,
    now: Millis,
    holder: Option<&str>,
) -> (Decision, bool) {
    let limit = u64::from(s.limit.get());
    let held = live(state, now);
    let count = held.len() as u64;
    if holder.is_some_and(|h| held.contains_key(h)) {
        return (Decision::slots(true, limit.saturating_sub(count), 0), true);
    }
    if count >= limit {
        let first = held.values().copied().fold(f64::INFINITY, f64::min);
        return (Decision::slots(false, 0, ceil_ms(first - now)), false);
    }
    (Decision::slots(true, limit - count - 1, 0), true)
}

/// Pushes the lease end of each of `holders` that still holds a slot to `now + lease`. Returns
/// how many did, and the state's time to live when it was written.
pub fn renew(
    s: &Slots,
    state: &mut Option<State>,
    now: Millis,
    holders: &[&str],
) -> (u64, Option<u64>) {
    if foreign(state) {
        return (0, None);
    }
    let lease = s.lease_ms.get() as f64;
    let held = live(state, now);
    let mut renewed = 0;
    for holder in holders {
        if let Some(end) = held.get_mut(*holder) {
            *end = now + lease;
            renewed += 1;
        }
    }
    tidy(state);
    (renewed, (renewed > 0).then_some(s.lease_ms.get()))
}

/// Frees the slots of `holders`. Returns how many held one, and `Some(0)` as the time to live
/// when none is left.
pub fn release(state: &mut Option<State>, now: Millis, holders: &[&str]) -> (u64, Option<u64>) {
    if foreign(state) {
        return (0, None);
    }
    let held = live(state, now);
    let released = holders
        .iter()
        .filter(|h| held.remove(**h).is_some())
        .count() as u64;
    let empty = held.is_empty();
    tidy(state);
    (released, (empty && released > 0).then_some(0))
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::time::Duration;

    use super::*;

    fn slots(limit: u32, lease_ms: u64) -> Slots {
        Slots::new(
            NonZeroU32::new(limit).unwrap(),
            Duration::from_millis(lease_ms),
        )
        .unwrap()
    }

    /// The third holder of two slots is refused until one of the first two releases.
    #[test]
    fn admits_up_to_the_limit_and_again_after_a_release() {
        let s = slots(2, 10_000);
        let mut state = None;
        let a = acquire(&s, &mut state, 0.0, "a").0;
        assert!(a.allowed && a.remaining == 1);
        assert!(acquire(&s, &mut state, 1.0, "b").0.allowed);
        let refused = acquire(&s, &mut state, 2.0, "c").0;
        assert!(!refused.allowed);
        assert_eq!((refused.remaining, refused.retry_after_ms), (0, 1000));
        assert_eq!(release(&mut state, 3.0, &["a", "x"]).0, 1);
        let c = acquire(&s, &mut state, 4.0, "c").0;
        assert!(c.allowed && c.remaining == 0);
    }

    /// A lease that is not renewed ends, and its slot is free; a renewed one stays.
    #[test]
    fn unrenewed_leases_end() {
        let s = slots(1, 1000);
        let mut state = None;
        assert!(acquire(&s, &mut state, 0.0, "a").0.allowed);
        assert_eq!(renew(&s, &mut state, 900.0, &["a"]).0, 1);
        let refused = acquire(&s, &mut state, 1500.0, "b").0;
        assert!(!refused.allowed);
        // the lease ends at 1900: 400 ms on, sooner than the usual second
        assert_eq!(refused.retry_after_ms, 400);
        assert!(acquire(&s, &mut state, 1900.0, "b").0.allowed);
        assert_eq!(
            renew(&s, &mut state, 1901.0, &["a"]).0,
            0,
            "a's lease ended"
        );
    }

    /// Releasing the last holder leaves no state; a holder acquiring again keeps its one slot.
    #[test]
    fn last_release_clears_and_holders_count_once() {
        let s = slots(2, 1000);
        let mut state = None;
        assert!(acquire(&s, &mut state, 0.0, "a").0.allowed);
        let again = acquire(&s, &mut state, 1.0, "a").0;
        assert!(again.allowed && again.remaining == 1);
        assert_eq!(release(&mut state, 2.0, &["a"]), (1, Some(0)));
        assert_eq!(state, None);
    }

    /// Another algorithm's state under the key (a reload kept the limit's name): renewals and
    /// releases leave it, a look sees no slot taken and changes nothing, an acquire replaces it.
    #[test]
    fn another_algorithms_state_is_left_to_it_until_an_acquire() {
        let s = slots(2, 1000);
        let bucket = Some(State::At(5.0));
        let mut state = bucket.clone();
        assert_eq!(renew(&s, &mut state, 1.0, &["a"]), (0, None));
        assert_eq!(release(&mut state, 1.0, &["a"]), (0, None));
        let seen = look(&s, &mut state, 1.0);
        assert!(seen.allowed && seen.remaining == 1, "{seen:?}");
        assert_eq!(state, bucket);
        let (taken, ttl) = acquire(&s, &mut state, 1.0, "a");
        assert!(taken.allowed && taken.remaining == 1 && ttl == Some(1000));
        assert!(matches!(state, Some(State::Held(_))));
    }
}

//! Joining into one script run the checks of one token bucket, or of one leaky-bucket or
//! pacing schedule, that wait on the Redis connection at the same moment.
//!
//! Under load, many requests of one client are checked at once, and so is every request under
//! a limit keyed on the route alone. Each check is a script run in Redis, and Redis's CPU per
//! check is a large part of a request's (BENCHMARKS.md). Checks of one bucket that reach the
//! connection's writer together are sent as one call whose cost is the sum of theirs.
//!
//! Why that is exact: run one after another at one instant, checks of costs c₁…cₙ are all
//! admitted iff the bucket holds Σc then (a check admitted with fewer tokens left would admit
//! every earlier one too), and they leave the bucket's TAT where one check of cost Σc leaves it.
//! So when the joined call is admitted, every check is, and each gets the reply it would have
//! got in its turn: check k leaves `remaining + (Σc − c₁ − … − c_k)` tokens, and its bucket is
//! full again `(Σc − c₁ − … − c_k) · interval` sooner. When the joined call is refused, it took
//! nothing (a refusal writes no state, but for a bucket left by other parameters, which it
//! writes empty as each check alone would first), and each check is sent again alone, so the
//! checks at the edge of the burst are decided one by one as if they had never been joined, at
//! the cost of one more round trip for them — unless the refusal shows that each check alone is
//! refused too (the usual case of a client past its limit): then each gets its own refusal at
//! once.
//!
//! Leaky-bucket checks (pacing) of one schedule are joined the same way: n checks run one after
//! another at one instant get the slots `s, s + i, …, s + (n−1)·i` (i = 1/rate; s the first free
//! slot) and leave the next free slot at `s + n·i`, which is what one call at rate `rate/n` does
//! (it moves the schedule by `1000 / (rate/n)`). All are admitted iff the last fits `max_delay`,
//! so the joined call is given `max_delay − (n−1)·i`; check k is told `delay + k·i`. A refusal
//! whose delay is past `max_delay` itself refuses each alone (the schedule is unchanged); any
//! other refusal sends them again alone.
//!
//! Only checks on the server's clock are joined (`now` absent): a check with its own `now` is a
//! replay that must be run as given. The window scripts take no cost and are not joined.

use super::reply::Reply;
use super::resp::Value;

/// How a check may be joined with others of the same bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Join {
    /// milliseconds per token or slot (`1000 / rate`)
    pub(crate) interval_ms: f64,
    pub(crate) kind: Kind,
}

/// What a joined call adds up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    /// a token bucket: the cost, its last argument; the joined call takes the sum (and may take
    /// tokens ahead, [`super::lease`]); `burst` the bucket's size
    Tokens { cost: u64, burst: u64 },
    /// a leaky bucket: one slot each, at `rate` per second, each waiting at most `max_delay_ms`
    Slots {
        rate: f64,
        max_delay_ms: Option<f64>,
    },
}

impl Join {
    pub(crate) fn new(kind: Kind, interval_ms: f64) -> Join {
        Join { interval_ms, kind }
    }

    pub(crate) fn cost(&self) -> u64 {
        match self.kind {
            Kind::Tokens { cost, .. } => cost,
            Kind::Slots { .. } => 1,
        }
    }
}

/// What the one call of joined checks asks, in place of the first check's own arguments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Joined {
    /// a token bucket's cost
    Cost(u64),
    /// a leaky bucket's rate and `max_delay`
    Slots {
        rate: f64,
        max_delay_ms: Option<f64>,
    },
}

/// What the one call of the checks `joins` (in order) asks, taking `ahead` tokens more than the
/// checks' for a lease (token buckets only); `None` when they cannot be joined (more slots than
/// `max_delay` holds even from an idle schedule).
pub(crate) fn joined(joins: &[Join], ahead: u64) -> Option<Joined> {
    let join = joins.first()?;
    let total: u64 = joins.iter().map(Join::cost).sum();
    match join.kind {
        Kind::Tokens { .. } => Some(Joined::Cost(total + ahead)),
        Kind::Slots { rate, max_delay_ms } => {
            let later = (total - 1) as f64 * join.interval_ms;
            let max_delay_ms = max_delay_ms.map(|max| max - later);
            if max_delay_ms.is_some_and(|max| max < 0.0) {
                return None;
            }
            let rate = rate / total as f64;
            Some(Joined::Slots { rate, max_delay_ms })
        }
    }
}

/// The reply of each joined call in `joins` (in order), from the joined call's `reply` (which
/// took `ahead` tokens more than theirs, after them); `None` when each must be sent again alone
/// (also when the reply is not of the script's shape: each check alone then gets one to
/// report).
pub(crate) fn answer(reply: &Reply, joins: &[Join], ahead: u64) -> Option<Vec<Reply>> {
    let total: u64 = joins.iter().map(Join::cost).sum::<u64>() + ahead;
    match (joins.first()?.kind, reply) {
        (Kind::Tokens { .. }, Reply::Four(n)) if admitted(n) => Some(
            joins
                .iter()
                .scan(total, |after, join| {
                    *after -= join.cost();
                    Some(Reply::Four(share(n, *after, join)))
                })
                .collect(),
        ),
        (Kind::Tokens { .. }, Reply::Four(n)) => joins
            .iter()
            .map(|join| refusal(n, total - join.cost(), join).map(Reply::Four))
            .collect(),
        (Kind::Slots { max_delay_ms, .. }, Reply::Value(value)) => {
            let replies = slots(value, joins, max_delay_ms)?;
            Some(replies.into_iter().map(Reply::Value).collect())
        }
        _ => None,
    }
}

/// Each check's reply from a joined leaky-bucket call: `{1, delay + k·interval}`, or each
/// refused when the delay is past `max_delay` itself.
fn slots(reply: &Value, joins: &[Join], max_delay_ms: Option<f64>) -> Option<Vec<Value>> {
    let Value::Array(items) = reply else {
        return None;
    };
    let [Value::Int(admitted), delay] = items.as_slice() else {
        return None;
    };
    let delay_us = super::reply::micros(delay)?;
    match admitted {
        1 => Some(
            joins
                .iter()
                .enumerate()
                .map(|(k, join)| {
                    let later = (k as f64 * join.interval_ms * 1000.0).round() as u64;
                    let us = delay_us + later;
                    let text = format!("{}.{:03}", us / 1000, us % 1000);
                    Value::Array(vec![Value::Int(1), Value::Bulk(text.into_bytes())])
                })
                .collect(),
        ),
        // refused past max_delay itself (with a microsecond of margin for the rounding of the
        // delay's text): each alone finds the same schedule and is refused with the same delay
        0 if max_delay_ms.is_some_and(|max| delay_us as f64 > (max + 0.001) * 1000.0 + 1.0) => {
            Some(vec![reply.clone(); joins.len()])
        }
        _ => None,
    }
}

/// A cheap hash of a check's key, to find the checks of one bucket among a batch without
/// comparing every pair's keys (they are compared whole when the hashes match).
pub(crate) fn hash(key: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15; // 2^64 / golden ratio: spreads the bits of each word
    let mut h = key.len() as u64;
    let mut words = key.chunks_exact(8);
    for word in &mut words {
        let word = u64::from_le_bytes(word.try_into().expect("chunks of 8 bytes"));
        h = (h ^ word).wrapping_mul(K).rotate_left(29);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(K).rotate_left(29);
    }
    h
}

/// Whether the reply of a joined call admitted it: `{1, remaining, retry_after_ms, reset_ms}`.
fn admitted(reply: &[i64; 4]) -> bool {
    reply[0] == 1
}

/// The reply one check of an admitted joined call would have got alone: `after` is the cost of
/// the checks that took their tokens after it (the joined call's members are in order).
pub(crate) fn share(reply: &[i64; 4], after: u64, join: &Join) -> [i64; 4] {
    let [allowed, remaining, retry_after, reset] = *reply;
    let later = i64::try_from(after).unwrap_or(i64::MAX);
    // remaining = floor((tolerance − tat_after + ε) / interval): moving the TAT back by
    // `after · interval` adds exactly `after` to it.
    let remaining = remaining.saturating_add(later);
    // reset = ceil(tat − now); ceil(x − d) ≤ ceil(x) − floor(d), so subtracting the whole
    // milliseconds of `d` never tells a check its bucket is full sooner than it is (at most
    // 1 ms later). The TAT stays ahead of now by at least this check's cost: reset ≥ 1.
    let earlier = (after as f64 * join.interval_ms).floor();
    let reset = if earlier >= reset as f64 {
        1
    } else {
        (reset - earlier as i64).max(1)
    };
    [allowed, remaining, retry_after, reset]
}

/// The refusal one check of a refused joined call gets alone, when the joined reply proves it:
/// `others` is the cost of the other checks joined with it.
///
/// The script refuses when `y = tat − now + cost · interval − tolerance − ε > 0` and answers
/// `retry_after = max(1, ceil(y))`, so the joined call's `y` lies in `(retry_after − 1,
/// retry_after]`. The check alone has `y' = y − others · interval`: when `retry_after ≥ 1 +
/// others · interval`, `y' > 0` and it is refused too (a refusal writes nothing, or the emptied
/// bucket each would write, so the order of the checks does not matter), with
/// `retry_after' = ceil(retry_after − others · interval)`: never sooner than its own, at most
/// 1 ms later. `None` when the reply does not prove it.
fn refusal(reply: &[i64; 4], others: u64, join: &Join) -> Option<[i64; 4]> {
    let [0, remaining, retry_after, reset] = *reply else {
        return None;
    };
    let freed = others as f64 * join.interval_ms;
    let retry = retry_after as f64;
    // a microsecond of margin against rounding: unproven checks are sent alone
    if retry < 1.0 + freed + 0.001 {
        return None;
    }
    let own = ((retry - freed).ceil() as i64).max(1);
    Some([0, remaining, own, reset])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(allowed: i64, remaining: i64, retry: i64, reset: i64) -> [i64; 4] {
        [allowed, remaining, retry, reset]
    }

    /// Each check of a joined call gets the remaining tokens and reset it would have got in its
    /// turn: computed here from the same GCRA arithmetic as `lua/token_bucket.lua`.
    #[test]
    fn shares_match_the_replies_of_checks_run_in_turn() {
        // rate 3/s (interval 333.33 ms), burst 10, cost 2 each, starting with `tat` ahead
        let interval = 1000.0 / 3.0;
        let tolerance = 10.0 * interval;
        for start in [0.0, 100.0, 1000.0 / 3.0, 1234.5] {
            let costs = [2u64, 1, 3, 1];
            let total: u64 = costs.iter().sum();
            let lua = |after: f64| {
                reply(
                    1,
                    ((tolerance - after + 0.001) / interval).floor() as i64,
                    0,
                    after.ceil() as i64,
                )
            };
            let joined = lua(start + total as f64 * interval);
            let mut taken = 0;
            for &cost in &costs {
                taken += cost;
                let join = Join {
                    kind: Kind::Tokens { cost, burst: 10 },
                    interval_ms: interval,
                };
                let alone = lua(start + taken as f64 * interval);
                let (a, s) = (alone, share(&joined, total - taken, &join));
                assert_eq!(a[..3], s[..3], "start {start}, taken {taken}");
                assert!(
                    s[3] == a[3] || s[3] == a[3] + 1,
                    "reset {} vs {}",
                    s[3],
                    a[3]
                );
            }
        }
        assert!(admitted(&reply(1, 0, 0, 5)));
        assert!(!admitted(&reply(0, 0, 7, 5)));
        // a reply not of the script's shape is not shared out: each check goes alone, and its
        // own reply tells the decoder what is wrong
        let join = Join {
            kind: Kind::Tokens { cost: 1, burst: 10 },
            interval_ms: 1.0,
        };
        assert_eq!(answer(&Reply::Value(Value::Int(1)), &[join; 2], 0), None);
        assert_eq!(
            answer(&Reply::Four(reply(1, 5, 0, 3)), &[join; 2], 0),
            Some(vec![
                Reply::Four(reply(1, 6, 0, 2)),
                Reply::Four(reply(1, 5, 0, 3))
            ])
        );
    }

    /// A refusal is shared out only when it proves each check alone is refused, with a
    /// `retry_after` never sooner than the check's own (computed as the script does).
    #[test]
    fn refusals_are_shared_only_when_proven() {
        let interval = 1000.0 / 3.0;
        let tolerance = 10.0 * interval;
        let eps = 0.001;
        let join = Join {
            kind: Kind::Tokens { cost: 1, burst: 10 },
            interval_ms: interval,
        };
        // `tat − now` from a bucket with half a token to one overdrawn; 5 checks of cost 1
        for ahead in [
            tolerance - 2.5 * interval,
            tolerance - 0.5 * interval,
            tolerance,
            tolerance + 0.2,
        ] {
            // a refusal tells the tokens held, whatever the cost asked
            let held = ((tolerance - ahead + eps) / interval)
                .floor()
                .clamp(0.0, 10.0) as i64;
            let lua = |cost: f64| {
                let y = ahead + cost * interval - tolerance - eps;
                (y > 0.0).then(|| reply(0, held, (y.ceil() as i64).max(1), ahead.ceil() as i64))
            };
            let Some(joined) = lua(5.0) else {
                unreachable!("5 checks never fit")
            };
            match (refusal(&joined, 4, &join), lua(1.0)) {
                (Some(s), Some(a)) => {
                    assert_eq!((&s[..2], &s[3]), (&a[..2], &a[3]), "ahead {ahead}");
                    assert!(
                        s[2] == a[2] || s[2] == a[2] + 1,
                        "retry {} vs {}",
                        s[2],
                        a[2]
                    );
                }
                (Some(_), None) => panic!("ahead {ahead}: a check that fits was refused"),
                (None, _) => assert!(
                    ahead < tolerance,
                    "ahead {ahead}: an empty bucket not proven"
                ),
            }
        }
        assert_eq!(refusal(&reply(1, 3, 0, 9), 0, &join), None);
    }

    /// n pacing checks are written as one call at rate/n whose `max_delay` leaves room for the
    /// last slot; when not even an idle schedule holds them all, they are not joined.
    #[test]
    fn slots_join_as_one_call_at_a_fraction_of_the_rate() {
        let join = |max: Option<f64>| Join {
            interval_ms: 100.0,
            kind: Kind::Slots {
                rate: 10.0,
                max_delay_ms: max,
            },
        };
        assert_eq!(
            joined(&[join(Some(550.0)); 4], 0),
            Some(Joined::Slots {
                rate: 2.5,
                max_delay_ms: Some(250.0)
            })
        );
        assert_eq!(
            joined(&[join(None); 3], 0),
            Some(Joined::Slots {
                rate: 10.0 / 3.0,
                max_delay_ms: None
            })
        );
        assert_eq!(joined(&[join(Some(550.0)); 7], 0), None);
        // admitted: each its own slot; refused past max_delay itself: each refused
        let reply = |admitted: i64, delay: &str| {
            Reply::Value(Value::Array(vec![
                Value::Int(admitted),
                Value::Bulk(delay.as_bytes().to_vec()),
            ]))
        };
        assert_eq!(
            answer(&reply(1, "12.345"), &[join(Some(550.0)); 3], 0),
            Some(vec![
                reply(1, "12.345"),
                reply(1, "112.345"),
                reply(1, "212.345")
            ])
        );
        let past = reply(0, "551.000");
        assert_eq!(
            answer(&past, &[join(Some(550.0)); 2], 0),
            Some(vec![past.clone(), past])
        );
        assert_eq!(
            answer(&reply(0, "400.000"), &[join(Some(550.0)); 2], 0),
            None
        );
    }

    /// Equal keys hash equal; a change anywhere in a key changes the hash.
    #[test]
    fn keys_hash_by_every_byte() {
        let a = b"tenant:acme:client:key:alice:route:/api/v1/orders";
        for i in 0..a.len() {
            let mut b = a.to_vec();
            b[i] ^= 1;
            assert_ne!(hash(a), hash(&b), "byte {i}");
        }
        assert_ne!(hash(&a[..a.len() - 1]), hash(a));
    }
}

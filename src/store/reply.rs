//! Decoding the scripts' replies into [`Decision`]s. Kept apart and pure so it can be fuzzed.

use super::resp::Value;
use super::StoreError;
use crate::limit::{Algorithm, Balance, Decision, Millis, State};

/// A script's reply as the store's own connection reads it: the counting scripts' four integers
/// kept inline (no allocation on the way from the socket to the decision, nor when a joined
/// call's reply is shared out), anything else as a [`Value`]. redis-rs's replies are made one
/// at its boundary (`store/redis.rs`), so both connections' replies are decoded here alike.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reply {
    /// `{allowed, remaining, retry_after_ms, reset_ms}` as read (not checked yet)
    Four([i64; 4]),
    /// the same four, answered from a lease of tokens taken ahead: no call was made
    Leased([i64; 4]),
    Value(Value),
}

/// Decodes a reply as [`decode`] does.
pub(crate) fn decode_reply(alg: &Algorithm, reply: &Reply) -> Result<Decision, StoreError> {
    match (alg, reply) {
        (Algorithm::LeakyBucket(_), Reply::Four(n)) => {
            decode(alg, &Value::Array(n.map(Value::Int).to_vec()))
        }
        (_, Reply::Four(n)) => counted(alg, *n),
        (_, Reply::Leased(n)) => Ok(Decision {
            leased: true,
            ..decode_reply(alg, &Reply::Four(*n))?
        }),
        (_, Reply::Value(value)) => decode(alg, value),
    }
}

/// Decodes `lua/charge.lua`'s `{balance, reset_ms}`.
pub(crate) fn decode_balance(reply: &Reply) -> Result<Balance, StoreError> {
    let bad = |detail: String| StoreError::Reply {
        script: "charge",
        detail,
    };
    let Reply::Value(Value::Array(items)) = reply else {
        return Err(bad(format!("expected an array, got {reply:?}")));
    };
    match items.as_slice() {
        [Value::Int(balance), Value::Int(reset)] => Ok(Balance {
            balance: *balance,
            reset_ms: u64::try_from(*reset).unwrap_or(0),
        }),
        _ => Err(bad(format!("expected two integers, got {items:?}"))),
    }
}

/// The rate `lua/adapt.lua` returns: a positive decimal string.
pub(crate) fn rate(reply: &Reply) -> Option<f64> {
    let text = match reply {
        Reply::Value(value) => value.text()?,
        _ => return None,
    };
    text.parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r > 0.0)
}

/// Decodes a script's reply for `alg`: `{allowed, remaining, retry_after_ms, reset_ms}` for the
/// counting algorithms, `{admitted, "delay_ms"}` for the leaky bucket.
pub fn decode(alg: &Algorithm, value: &Value) -> Result<Decision, StoreError> {
    let script = alg.name();
    let bad = |detail: String| StoreError::Reply { script, detail };
    let Value::Array(items) = value else {
        return Err(bad(format!("expected an array, got {value:?}")));
    };
    match alg {
        Algorithm::LeakyBucket(p) => {
            let [admitted, delay] = items.as_slice() else {
                return Err(bad(format!("expected 2 items, got {}", items.len())));
            };
            let admitted = int(admitted).ok_or_else(|| bad(format!("admitted: {admitted:?}")))?;
            let delay_us = micros(delay).ok_or_else(|| bad(format!("delay: {delay:?}")))?;
            Ok(Decision::paced(
                admitted == 1,
                delay_us,
                p.rate.interval_ms(),
                p.max_delay_ms,
            ))
        }
        _ => {
            let [a, r, t, z] = items.as_slice() else {
                return Err(bad(format!("expected 4 items, got {}", items.len())));
            };
            let mut n = [0i64; 4];
            for (slot, v) in n.iter_mut().zip([a, r, t, z]) {
                let Value::Int(i) = v else {
                    return Err(bad(format!("expected an integer, got {v:?}")));
                };
                *slot = *i;
            }
            counted(alg, n)
        }
    }
}

/// `{allowed, remaining, retry_after_ms, reset_ms}`, none of them negative.
fn counted(alg: &Algorithm, n: [i64; 4]) -> Result<Decision, StoreError> {
    let mut u = [0u64; 4];
    for (slot, i) in u.iter_mut().zip(n) {
        *slot = u64::try_from(i).map_err(|_| StoreError::Reply {
            script: alg.name(),
            detail: format!("expected an integer, got {:?}", Value::Int(i)),
        })?;
    }
    Ok(match alg {
        // `{admitted, free, wait_ms, held}`
        Algorithm::Concurrency(_) => Decision::slots(u[0] == 1, u[1], u[2]),
        _ => Decision::counted(u[0] == 1, u[1], u[2], u[3]),
    })
}

fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

/// A decimal string of milliseconds with at most 3 decimals ("12.500") as whole microseconds.
pub(super) fn micros(v: &Value) -> Option<u64> {
    let Value::Bulk(bytes) = v else {
        return None;
    };
    let text = std::str::from_utf8(bytes).ok()?;
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if frac.len() > 3 || whole.is_empty() || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let frac: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse::<u64>().ok()? * 10u64.pow(3 - frac.len() as u32)
    };
    whole.checked_mul(1000)?.checked_add(frac)
}

/// Decodes `lua/peek.lua`'s reply for a key of `alg`: the server's clock, and the state as the
/// algorithm keeps it (`None`: no key, or one of another type).
pub(crate) fn decode_peek(
    alg: &Algorithm,
    value: &Value,
) -> Result<(Millis, Option<State>), StoreError> {
    let bad = |detail: String| StoreError::Reply {
        script: "peek",
        detail,
    };
    let Value::Array(items) = value else {
        return Err(bad(format!("expected an array, got {value:?}")));
    };
    let text = |v: &Value| v.text().map(str::to_owned);
    let number = |v: &Value| -> Result<Option<f64>, StoreError> {
        match text(v) {
            Some(t) if t.is_empty() => Ok(None),
            Some(t) => t
                .parse()
                .map(Some)
                .map_err(|_| bad(format!("expected a number, got {t:?}"))),
            None => Err(bad(format!("expected a string, got {v:?}"))),
        }
    };
    let (now, kind) = match items.as_slice() {
        [now, kind, ..] => (number(now)?, text(kind)),
        _ => {
            return Err(bad(format!(
                "expected at least 2 items, got {}",
                items.len()
            )))
        }
    };
    let now = now.ok_or_else(|| bad("no clock".to_owned()))?;
    let rest = &items[2..];
    let count = |v: Option<f64>| v.map_or(0, |n| n.max(0.0) as u64);
    let state = match (alg, kind.as_deref(), rest) {
        (Algorithm::TokenBucket(_) | Algorithm::LeakyBucket(_), Some("string"), [at]) => {
            number(at)?.map(State::At)
        }
        (Algorithm::FixedWindow(_), Some("hash"), [w, c, _]) => match number(w)? {
            Some(start) => Some(State::Fixed {
                start,
                count: count(number(c)?),
            }),
            None => None,
        },
        (Algorithm::SlidingWindowCounter(_), Some("hash"), [w, c, p]) => match number(w)? {
            Some(start) => Some(State::Counter {
                start,
                curr: count(number(c)?),
                prev: count(number(p)?),
            }),
            None => None,
        },
        (Algorithm::SlidingWindow(_), Some("zset"), times) => {
            let mut log = std::collections::VecDeque::with_capacity(times.len());
            for t in times {
                log.extend(number(t)?);
            }
            Some(State::Log(log))
        }
        // the holders' ids are not read: only how many there are and when their leases end
        (Algorithm::Concurrency(_), Some("zset"), ends) => {
            let mut held = std::collections::BTreeMap::new();
            for (ix, end) in ends.iter().enumerate() {
                if let Some(end) = number(end)? {
                    held.insert(ix.to_string().into_boxed_str(), end);
                }
            }
            Some(State::Held(held))
        }
        // no key, or one another algorithm wrote: the check would start it afresh
        _ => None,
    };
    Ok((now, state))
}

#[cfg(test)]
mod tests {
    use std::num::{NonZeroU32, NonZeroU64};
    use std::time::Duration;

    use super::*;
    use crate::limit::{Bucket, Pace, Rate, Window};

    /// Four integers read inline decode as the same four in a `Value` do, for every algorithm:
    /// the same decision, or the same error (a negative figure; four integers for the leaky
    /// bucket).
    #[test]
    fn four_inline_decode_as_their_value_does() {
        let rate = Rate::per_second(10.0).expect("positive");
        let one = NonZeroU32::new(1).expect("positive");
        let window = Window::new(
            NonZeroU64::new(10).expect("positive"),
            Duration::from_secs(1),
        );
        let algs = [
            Algorithm::TokenBucket(Bucket::new(rate, one, one).expect("cost <= burst")),
            Algorithm::LeakyBucket(Pace::new(rate, None).expect("no bound")),
            Algorithm::FixedWindow(window),
            Algorithm::SlidingWindowCounter(window),
        ];
        let fours = [
            [1, 9, 0, 1000],
            [0, 0, 250, 1000],
            [1, 0, 0, 0],
            [1, -1, 0, 5],
            [0, 3, 2, -7],
        ];
        for alg in &algs {
            for four in fours {
                let inline = decode_reply(alg, &Reply::Four(four));
                let value = decode(alg, &Value::Array(four.map(Value::Int).to_vec()));
                assert_eq!(format!("{inline:?}"), format!("{value:?}"), "{four:?}");
            }
        }
        let decided = decode_reply(&algs[0], &Reply::Four([0, 0, 250, 1000])).expect("decodes");
        assert_eq!(decided, Decision::counted(false, 0, 250, 1000));
    }

    /// Delay strings become exact microseconds; malformed ones are refused.
    #[test]
    fn delay_strings_decode_to_microseconds() {
        let s = |t: &str| Value::Bulk(t.as_bytes().to_vec());
        assert_eq!(micros(&s("12.500")), Some(12_500));
        assert_eq!(micros(&s("0.000")), Some(0));
        assert_eq!(micros(&s("7")), Some(7_000));
        assert_eq!(micros(&s("1.5")), Some(1_500));
        for bad in ["", "-1.000", "1.2345", "x.000", "1.-1", ".5"] {
            assert_eq!(micros(&s(bad)), None, "{bad}");
        }
    }
}

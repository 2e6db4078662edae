//! Decoding the scripts' replies into [`Decision`]s. Kept apart and pure so it can be fuzzed.

use ::redis::Value;

use super::StoreError;
use crate::limit::{Algorithm, Decision};

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
            let mut n = [0u64; 4];
            for (slot, v) in n.iter_mut().zip([a, r, t, z]) {
                *slot = int(v).ok_or_else(|| bad(format!("expected an integer, got {v:?}")))?;
            }
            Ok(Decision::counted(n[0] == 1, n[1], n[2], n[3]))
        }
    }
}

fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

/// A decimal string of milliseconds with at most 3 decimals ("12.500") as whole microseconds.
pub(super) fn micros(v: &Value) -> Option<u64> {
    let Value::BulkString(bytes) = v else {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Delay strings become exact microseconds; malformed ones are refused.
    #[test]
    fn delay_strings_decode_to_microseconds() {
        let s = |t: &str| Value::BulkString(t.as_bytes().to_vec());
        assert_eq!(micros(&s("12.500")), Some(12_500));
        assert_eq!(micros(&s("0.000")), Some(0));
        assert_eq!(micros(&s("7")), Some(7_000));
        assert_eq!(micros(&s("1.5")), Some(1_500));
        for bad in ["", "-1.000", "1.2345", "x.000", "1.-1", ".5"] {
            assert_eq!(micros(&s(bad)), None, "{bad}");
        }
    }
}

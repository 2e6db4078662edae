//! The value formats of `proxy.yaml`: durations (`250ms`, `2s`, `1.5m`, `1h30m`), rates
//! (`10/s`, `0.5/min`, `3/60s`) and sizes (`1000`, `512KiB`, `10MiB`, `1GB`), and their
//! formatting back for `tollgate check`.
//!
//! Errors are messages for humans, worded as `expected ..., found "..."`; the caller adds the
//! position and the key path. Numbers are read and written exactly (whole nanoseconds, whole
//! bytes), never through an f64, so that what is formatted parses back to the same value.
//! Public so that the fuzz targets (`fuzz/`) and `tests/fuzz_props.rs` can reach them.

use std::time::Duration;

use crate::limit::Rate;

/// What `expected ...` says for a duration.
const DURATION_HELP: &str = "a duration such as 250ms, 2s, 1m or 1h";

/// Parses a duration: one or more `<number><unit>` pairs, units `ms`, `s`, `m` (or `min`), `h`,
/// `d`; the number may have a fraction (`1.5s`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("expected {DURATION_HELP}, found {text:?}");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    // Summed in whole nanoseconds, exactly: through an f64 of seconds, a duration written to the
    // millisecond comes back a nanosecond off beyond 2^53 ns (about 104 days).
    let mut nanos = 0u128;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let unit_end = rest[digits..]
            .find(|c: char| !c.is_ascii_alphabetic())
            .map_or(rest.len(), |n| digits + n);
        let unit = unit_nanos(&rest[digits..unit_end]).ok_or_else(bad)?;
        let amount = scaled(&rest[..digits], unit, true).ok_or_else(bad)?;
        nanos = nanos.saturating_add(amount);
        rest = &rest[unit_end..];
    }
    let secs = u64::try_from(nanos / 1_000_000_000)
        .map_err(|_| format!("duration {text:?} is too large"))?;
    let subsec = u32::try_from(nanos % 1_000_000_000).expect("below 10^9");
    Ok(Duration::new(secs, subsec))
}

/// `number` (digits with at most one `.`: `5`, `1.5`, `.5`, `5.`) times `unit`, exactly, as a
/// whole number rounded to the nearest (`round`) or down; saturates when too large, so that the
/// caller reports that. `None` when `number` is not such a number.
fn scaled(number: &str, unit: u128, round: bool) -> Option<u128> {
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && frac.is_empty()) || frac.contains('.') {
        return None;
    }
    // Only digits remain (the caller cut `number` there), so a parse fails only on overflow.
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().unwrap_or(u128::MAX)
    };
    // Digits past the 20th weigh less than 10^-6 of one (ns or byte) for every unit here (at
    // most 8.64 * 10^13 ns in a day, 2^40 bytes in a TiB), and keep the product below 2^128.
    let frac = &frac[..frac.len().min(20)];
    let scale = 10u128.pow(u32::try_from(frac.len()).expect("at most 20"));
    let frac: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let part = (frac * unit + if round { scale / 2 } else { 0 }) / scale;
    Some(whole.saturating_mul(unit).saturating_add(part))
}

/// Nanoseconds in one duration unit.
fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => return None,
    })
}

/// A parsed rate: the `N` of `N/unit` is kept because a token bucket's default burst is it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParsedRate {
    /// the events of one span (`N`)
    pub count: f64,
    /// the span
    pub per: Duration,
    /// `count / per`
    pub rate: Rate,
}

/// Parses `N/unit` (`10/s`, `0.5/m`, `100/min`, `1000/h`, `5/d`) or `N/DURATION` (`3/60s`).
pub fn parse_rate(text: &str) -> Result<ParsedRate, String> {
    let bad = || format!("expected N/unit such as 10/s, found {text:?}");
    let (count, span) = text.trim().split_once('/').ok_or_else(bad)?;
    let count: f64 = count.trim().parse().map_err(|_| bad())?;
    if !count.is_finite() {
        return Err(bad());
    }
    let span = span.trim();
    let per = if span.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        parse_duration(span).map_err(|_| bad())?
    } else {
        let nanos = unit_nanos(span).ok_or_else(bad)?;
        Duration::from_nanos(u64::try_from(nanos).expect("a day fits in u64 nanoseconds"))
    };
    if count <= 0.0 || per.is_zero() {
        return Err(format!("rate must be greater than zero, found {text:?}"));
    }
    // `Rate` refuses an infinite rate as "not greater than zero, found inf"; say what it is.
    let rate = Rate::new(count, per).map_err(|e| match count / per.as_secs_f64() {
        r if r > 1.0 => format!("rate {text:?} is too large"),
        _ => e.to_string(),
    })?;
    Ok(ParsedRate { count, per, rate })
}

/// Parses a size in bytes: a whole number, or a number with a unit: `KB`, `MB`, `GB`, `TB`
/// (powers of 1000), `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024), `B`; units ignore case.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || format!("expected a size such as 1000, 512KiB or 10MiB, found {text:?}");
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let number = &trimmed[..split];
    let factor: u128 = match trimmed[split..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        // a bare letter is binary, as in nginx (`client_max_body_size 10m`) and HAProxy
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "tib" | "t" => 1 << 40,
        _ => return Err(bad()),
    };
    // Exact, not through an f64 (which holds every whole number only up to 2^53); a fraction
    // of a byte is rounded down.
    let bytes = scaled(number, factor, false).ok_or_else(bad)?;
    u64::try_from(bytes).map_err(|_| format!("size {text:?} is too large"))
}

/// A duration as written in the file: `250ms`, `2s`, `1.5s`, `1m`, `2h`, `1d`; exact to the
/// nanosecond (`1.000000001s`), so that [`parse_duration`] gives back the same duration.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    for (unit, size) in [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
    ] {
        if nanos >= size && nanos.is_multiple_of(size) {
            return format!("{}{unit}", nanos / size);
        }
    }
    if nanos >= 1_000_000_000 {
        format!("{}s", decimal(nanos, 9))
    } else {
        format!("{}ms", decimal(nanos, 6))
    }
}

/// `n / 10^places` in decimal, without trailing zeros in the fraction.
fn decimal(n: u128, places: usize) -> String {
    let scale = 10u128.pow(u32::try_from(places).expect("a few places"));
    let (whole, frac) = (n / scale, n % scale);
    if frac == 0 {
        return whole.to_string();
    }
    let frac = format!("{frac:0places$}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

/// A rate as written in the file: `10/s`, `100/m`, `1000/h`; falls back to a decimal per second.
pub fn format_rate(rate: Rate) -> String {
    let per_sec = rate.per_sec();
    for (unit, secs) in [("s", 1.0), ("m", 60.0), ("h", 3600.0), ("d", 86_400.0)] {
        let count = per_sec * secs;
        // `0.1/s * 60` is 6.000000000000001 in f64: a relative 1e-12 absorbs such noise (a few
        // ulps) and nothing more; 1e-9 let 142857142.86/h be written as 142857143/h.
        if count >= 1.0 && (count - count.round()).abs() <= count * 1e-12 {
            return format!("{}/{unit}", count.round());
        }
    }
    format!("{per_sec}/s")
}

/// A size in the largest binary unit that divides it: `10MiB`, `512KiB`, `1000`.
pub fn format_size(bytes: u64) -> String {
    for (unit, size) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    bytes.to_string()
}

//! The value formats of `proxy.yaml`: durations (`250ms`, `2s`, `1.5m`, `1h30m`), rates
//! (`10/s`, `0.5/min`, `3/60s`) and sizes (`1000`, `512KiB`, `10MiB`, `1GB`), and their
//! formatting back for `tollgate check`.
//!
//! Errors are messages for humans, worded as `expected ..., found "..."`; the caller adds the
//! position and the key path.

use std::time::Duration;

use crate::limit::Rate;

/// What `expected ...` says for a duration.
const DURATION_HELP: &str = "a duration such as 250ms, 2s, 1m or 1h";

/// Parses a duration: one or more `<number><unit>` pairs, units `ms`, `s`, `m` (or `min`), `h`,
/// `d`; the number may have a fraction (`1.5s`).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("expected {DURATION_HELP}, found {text:?}");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0.0_f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..digits].parse().map_err(|_| bad())?;
        let unit_end = rest[digits..]
            .find(|c: char| !c.is_ascii_alphabetic())
            .map_or(rest.len(), |n| digits + n);
        let seconds = unit_seconds(&rest[digits..unit_end]).ok_or_else(bad)?;
        total += number * seconds;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| format!("duration {text:?} is too large"))
}

/// Seconds in one duration unit.
fn unit_seconds(unit: &str) -> Option<f64> {
    Some(match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => return None,
    })
}

/// A parsed rate: the `N` of `N/unit` is kept because a token bucket's default burst is it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ParsedRate {
    /// the events of one span (`N`)
    pub count: f64,
    /// the span
    pub per: Duration,
    /// `count / per`
    pub rate: Rate,
}

/// Parses `N/unit` (`10/s`, `0.5/m`, `100/min`, `1000/h`, `5/d`) or `N/DURATION` (`3/60s`).
pub(crate) fn parse_rate(text: &str) -> Result<ParsedRate, String> {
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
        Duration::from_secs_f64(unit_seconds(span).ok_or_else(bad)?)
    };
    if count <= 0.0 || per.is_zero() {
        return Err(format!("rate must be greater than zero, found {text:?}"));
    }
    let rate = Rate::new(count, per).map_err(|e| e.to_string())?;
    Ok(ParsedRate { count, per, rate })
}

/// Parses a size in bytes: a whole number, or a number with a unit: `KB`, `MB`, `GB`, `TB`
/// (powers of 1000), `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024), `B`; units ignore case.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || format!("expected a size such as 1000, 512KiB or 10MiB, found {text:?}");
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let number: f64 = trimmed[..split].parse().map_err(|_| bad())?;
    let factor: u64 = match trimmed[split..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" | "k" => 1_000,
        "mb" | "m" => 1_000_000,
        "gb" | "g" => 1_000_000_000,
        "tb" | "t" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => return Err(bad()),
    };
    let bytes = number * factor as f64;
    // 2^64 as f64 is the first value that does not fit; a fraction of a byte is rounded down.
    if !(0.0..18_446_744_073_709_551_616.0).contains(&bytes) {
        return Err(format!("size {text:?} is too large"));
    }
    Ok(bytes as u64)
}

/// A duration as written in the file: `250ms`, `2s`, `1.5s`, `1m`, `2h`, `1d`.
pub(crate) fn format_duration(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    for (unit, size) in [("d", 86_400_000.0), ("h", 3_600_000.0), ("m", 60_000.0)] {
        if ms >= size && (ms / size).fract() == 0.0 {
            return format!("{}{unit}", ms / size);
        }
    }
    if ms >= 1000.0 {
        format!("{}s", ms / 1000.0)
    } else {
        format!("{ms}ms")
    }
}

/// A rate as written in the file: `10/s`, `100/m`, `1000/h`; falls back to a decimal per second.
pub(crate) fn format_rate(rate: Rate) -> String {
    let per_sec = rate.per_sec();
    for (unit, secs) in [("s", 1.0), ("m", 60.0), ("h", 3600.0), ("d", 86_400.0)] {
        let count = per_sec * secs;
        // `0.1/s * 60` is 6.000000000000001 in f64; a relative 1e-9 absorbs such noise.
        if count >= 1.0 && (count - count.round()).abs() <= count * 1e-9 {
            return format!("{}/{unit}", count.round());
        }
    }
    format!("{per_sec}/s")
}

/// A size in the largest binary unit that divides it: `10MiB`, `512KiB`, `1000`.
pub(crate) fn format_size(bytes: u64) -> String {
    for (unit, size) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if bytes >= size && bytes % size == 0 {
            return format!("{}{unit}", bytes / size);
        }
    }
    bytes.to_string()
}

//! Durations, rates and sizes, and how they are written back.

use crate::config::units::{
    format_duration, format_rate, format_size, parse_duration, parse_rate, parse_size,
};
use std::time::Duration;

/// Durations take ms, s, m/min, h, d, decimals, and sums such as 1h30m.
#[test]
fn durations_take_every_documented_unit() {
    let cases = [
        ("250ms", 250),
        ("2s", 2_000),
        ("1.5s", 1_500),
        ("1m", 60_000),
        ("2min", 120_000),
        ("1h", 3_600_000),
        ("1d", 86_400_000),
        ("1h30m", 5_400_000),
        ("0s", 0),
    ];
    for (text, ms) in cases {
        assert_eq!(
            parse_duration(text),
            Ok(Duration::from_millis(ms)),
            "{text}"
        );
    }
}

/// A duration without a unit, with an unknown unit, or negative is refused.
#[test]
fn durations_need_a_known_unit() {
    for text in ["50", "5 parsecs", "-1s", "s", "", "1.2.3s"] {
        let err = parse_duration(text).expect_err(text);
        assert_eq!(
            err,
            format!("expected a duration such as 250ms, 2s, 1m or 1h, found {text:?}")
        );
    }
}

/// Rates take N/unit and N/DURATION, with a decimal N, and keep N for the default burst.
#[test]
fn rates_take_units_and_durations() {
    let cases = [
        ("10/s", 10.0, 10.0),
        ("0.5/s", 0.5, 0.5),
        ("120/m", 120.0, 2.0),
        ("30/min", 30.0, 0.5),
        ("7200/h", 7200.0, 2.0),
        ("86400/d", 86400.0, 1.0),
        ("3/60s", 3.0, 0.05),
        ("1.5/500ms", 1.5, 3.0),
    ];
    for (text, count, per_sec) in cases {
        let parsed = parse_rate(text).expect(text);
        assert_eq!(parsed.count, count, "{text}");
        assert!((parsed.rate.per_sec() - per_sec).abs() < 1e-12, "{text}");
    }
}

/// Zero and negative rates are refused with their own message; nonsense gets the format.
#[test]
fn zero_negative_and_malformed_rates_are_refused() {
    for text in ["0/s", "-5/s", "0.0/m", "5/0s"] {
        let err = parse_rate(text).expect_err(text);
        assert_eq!(
            err,
            format!("rate must be greater than zero, found {text:?}")
        );
    }
    for text in ["ten", "10", "10/fortnight", "/s", "inf/s", "NaN/s"] {
        let err = parse_rate(text).expect_err(text);
        assert_eq!(err, format!("expected N/unit such as 10/s, found {text:?}"));
    }
}

/// Sizes take bytes and decimal or binary units, in any case.
#[test]
fn sizes_take_decimal_and_binary_units() {
    let cases = [
        ("1000", 1000),
        ("512KiB", 512 * 1024),
        ("10MiB", 10 << 20),
        ("1GB", 1_000_000_000),
        ("1gib", 1 << 30),
        ("2kb", 2000),
        ("1.5MiB", 3 << 19),
        // a bare letter as nginx reads it: `10m` is 10 MiB
        ("10m", 10 << 20),
        ("10M", 10 << 20),
        ("64k", 64 << 10),
        ("1g", 1 << 30),
        ("0", 0),
    ];
    for (text, bytes) in cases {
        assert_eq!(parse_size(text), Ok(bytes), "{text}");
    }
    let err = parse_size("10 furlongs").expect_err("bad unit");
    assert_eq!(
        err,
        "expected a size such as 1000, 512KiB or 10MiB, found \"10 furlongs\""
    );
}

/// Values are written back in the units a person would write.
#[test]
fn formatting_picks_the_natural_unit() {
    assert_eq!(format_duration(Duration::from_millis(50)), "50ms");
    assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
    assert_eq!(format_duration(Duration::from_secs(90)), "90s");
    assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
    let rate = |t: &str| parse_rate(t).expect("valid").rate;
    assert_eq!(format_rate(rate("10/s")), "10/s");
    assert_eq!(format_rate(rate("30/min")), "30/m");
    assert_eq!(format_rate(rate("3/60s")), "3/m");
    assert_eq!(format_rate(rate("1/d")), "1/d");
    assert_eq!(format_size(10 << 20), "10MiB");
    assert_eq!(format_size(1000), "1000");
}

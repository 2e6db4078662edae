//! The fuzzing properties of `fuzz/` as proptest properties, so that every `cargo test` checks
//! them on a few hundred generated inputs each (`PROPTEST_CASES=100000` for a long local run):
//!
//! * the config loader: any text gives a config or problems placed inside the text, quickly;
//!   a valid skeleton with one value replaced reports that value's line;
//! * rates and durations: what is formatted parses back to the same value; zero, negative, NaN
//!   and infinite values are refused;
//! * X-Forwarded-For: the documented right-to-left walk, and no identity a client can choose;
//! * path normalisation: idempotent, no empty or dot segments, `%2F` never decoded;
//! * route choice: a path takes the route of its lenient reading (every escape decoded,
//!   `;parameters` dropped), or is refused;
//! * Redis reply decoding: no panic on any reply, redis-rs's made the store's own at the
//!   boundary, the documented shapes decode exactly; the store's own RESP parser reads every
//!   RESP2 reply back whole and agrees with redis-rs's.
//!
//! The last section holds one regression test per crash or wrong answer the fuzzers found.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::{NonZeroU32, NonZeroU64};
use std::time::{Duration, Instant};

use http::HeaderValue;
use ipnet::IpNet;
use proptest::prelude::*;
use redis::Value;
use tollgate::config::units::{
    format_duration, format_rate, format_size, parse_duration, parse_rate, parse_size,
};
use tollgate::config::{self, ConfigError, Problem};
use tollgate::identity::{client_ip, is_trusted};
use tollgate::limit::{Algorithm, Bucket, Decision, Pace, Rate, Slots, Window};
use tollgate::routing::{
    normalize_path, EscapedSlashes, PathError, PathMatch, PathPolicy, RequestParts, RouteMatch,
    RouteTable, SegmentParams,
};
use tollgate::store::resp::Value as Own;
use tollgate::store::{decode, parse_counts, parse_reply};

mod common;

use common::lenient::lenient_reading;

// ---------------------------------------------------------------------------------------------
// config

/// What libyaml counts as a line break (CR LF counts once): the YAML 1.1 set.
const BREAKS: [char; 5] = ['\n', '\r', '\u{85}', '\u{2028}', '\u{2029}'];

/// The lines of `text` as YAML counts them, which is how problems are placed: a file with old
/// Mac line ends (a lone CR) has as many lines as breaks, not one.
fn yaml_lines(text: &str) -> usize {
    let breaks = text.replace("\r\n", "\n").matches(BREAKS).count();
    // Like `str::lines`, a last line without a break counts.
    breaks + usize::from(!text.is_empty() && !text.ends_with(BREAKS))
}

/// The environment the config properties expand `${VAR}` from: only `SET` is set.
fn env(name: &str) -> Option<String> {
    (name == "SET").then(|| "value".to_owned())
}

/// Parses `text`, checking what holds for every input: it returns in well under the time a
/// person waits for `tollgate check`, and every problem lies inside the text.
fn check_parse(text: &str) -> Result<config::Loaded, Vec<Problem>> {
    let started = Instant::now();
    let result = config::parse(text, "fuzz.yaml", &env);
    // Generous for a debug build on a busy 2-core machine; a quadratic blow-up is far beyond.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "parse took {:?}: {:?}",
        started.elapsed(),
        short(text)
    );
    let lines = yaml_lines(text);
    let problems = match &result {
        Ok(loaded) => {
            // What `tollgate check` and `/config` print must not fail on any valid config.
            let _ = loaded.config.summary();
            let _ = loaded.config.to_json();
            &loaded.warnings
        }
        Err(ConfigError::Invalid(problems)) => {
            assert!(
                !problems.is_empty(),
                "an error without problems: {:?}",
                short(text)
            );
            problems
        }
        Err(e @ ConfigError::Read { .. }) => panic!("parse read a file: {e}"),
    };
    for p in problems {
        assert!(
            p.line >= 1 && p.line <= lines + 1 && p.column >= 1,
            "{p} is outside the {lines} lines of {:?}",
            short(text)
        );
        assert_eq!(p.file, "fuzz.yaml");
    }
    result.map_err(|e| match e {
        ConfigError::Invalid(problems) => problems,
        ConfigError::Read { .. } => unreachable!("checked above"),
    })
}

/// The start of `text`, for messages: some inputs are hundreds of kilobytes.
fn short(text: &str) -> &str {
    text.char_indices()
        .nth(300)
        .map_or(text, |(at, _)| &text[..at])
}

/// Text made of what YAML gives meaning to, so the parser gets past the first character.
fn yamlish_text() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("\n".to_owned()),
        Just("  ".to_owned()),
        Just("- ".to_owned()),
        Just(": ".to_owned()),
        "[\\[\\]{},:#&*!|>'\"%@?~\\-. \t\n$]".prop_map(String::from),
        "(listen|routes|limits|rate|window|name|store|upstreams|timeouts|match|<<|x-a)"
            .prop_map(String::from),
        "[0-9]{1,3}(\\.[0-9])?(ms|s|m|h|d|/s|/m|KiB)?".prop_map(String::from),
        "\\$\\{(SET|UNSET|1x)?(:-[a-z]*)?\\}?".prop_map(String::from),
        "[a-z\u{e9}\u{1F600}]{1,4}".prop_map(String::from),
    ];
    proptest::collection::vec(token, 0..80).prop_map(|tokens| tokens.concat())
}

/// One value slot of [`SKELETON`]: its placeholder and values that make a valid config.
struct Slot {
    name: &'static str,
    valid: &'static [&'static str],
}

/// A config that is valid with every slot filled from its `valid` list. No two slots share a
/// line, so a problem with one slot's value must be reported on that slot's line.
const SKELETON: &str = "\
listen: {listen}
workers: {workers}
store:
  backend: memory
  timeout: {timeout}
  max_keys: {max_keys}
trusted_proxies: [{trusted}]
timeouts:
  client_header: {duration}
  shutdown: {shutdown}
max_body_size: {size}
upstreams:
  api:
    targets: [{target}]
    pace:
      rate: {rate}
      max_delay: {max_delay}
routes:
  - name: {route}
    match:
      path_prefix: {prefix}
      methods: [{method}]
    upstream: api
    limits:
      - name: per-client
        algorithm: token_bucket
        key: {key}
        rate: {bucket_rate}
        burst: {burst}
      - name: per-window
        algorithm: sliding_window
        limit: {limit}
        window: {window}
";

const SLOTS: &[Slot] = &[
    Slot {
        name: "listen",
        valid: &["0.0.0.0:8080", "'[::1]:9000'", "[127.0.0.1:0, 127.0.0.1:0]"],
    },
    Slot {
        name: "workers",
        valid: &["1", "64", "~"],
    },
    Slot {
        name: "timeout",
        valid: &["50ms", "1.5s", "1h30m"],
    },
    Slot {
        name: "max_keys",
        valid: &["1", "1000000"],
    },
    Slot {
        name: "trusted",
        valid: &["", "10.0.0.0/8", "'::1', 192.0.2.1"],
    },
    Slot {
        name: "duration",
        valid: &["10s", "0.25s", "2min"],
    },
    Slot {
        name: "shutdown",
        valid: &["0s", "30s"],
    },
    Slot {
        name: "size",
        valid: &["1000", "10MiB", "1.5KB"],
    },
    Slot {
        name: "target",
        valid: &["http://127.0.0.1:8000", "'https://api.example.com'"],
    },
    Slot {
        name: "rate",
        valid: &["100/s", "0.5/m", "3/60s"],
    },
    Slot {
        name: "max_delay",
        valid: &["2s", "~"],
    },
    Slot {
        name: "route",
        valid: &["api", "v1.users_2"],
    },
    Slot {
        name: "prefix",
        valid: &["/", "/v1", "/v1/"],
    },
    Slot {
        name: "method",
        valid: &["GET", "get, POST"],
    },
    Slot {
        name: "key",
        valid: &["ip", "header:x-api-key", "[ip, 'query:k']"],
    },
    Slot {
        name: "bucket_rate",
        valid: &["10/s", "1000/h", "'${UNSET:-5}/s'"],
    },
    Slot {
        name: "burst",
        valid: &["20", "~"],
    },
    Slot {
        name: "limit",
        valid: &["1", "1000"],
    },
    Slot {
        name: "window",
        valid: &["1h", "500ms"],
    },
];

/// Values that break things: wrong types, zero, negative, huge, non-finite, YAML syntax,
/// environment references, non-ASCII.
fn hostile_value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "",
            "~",
            "0",
            "-1",
            "0s",
            "-5s",
            "0/s",
            "-1/s",
            "NaN/s",
            "inf/s",
            ".inf",
            ".nan",
            "1e400",
            "1e400/s",
            "1/1e-400s",
            "99999999999999999999999",
            "18446744073709551616",
            "1e308/ms",
            "5e-324/d",
            "1/0.0000000001s",
            "0.0000001ms",
            "1.2.3s",
            "1h1h",
            "ms",
            "1/",
            "/s",
            "[]",
            "{}",
            "[1, 2]",
            "{a: 1}",
            "true",
            "'",
            "\"",
            "[",
            "{",
            ": x",
            "- x",
            "&a x",
            "*a",
            "*nope",
            "!tag x",
            "|",
            ">",
            "? x",
            "#",
            "${UNSET}",
            "${",
            "${SET",
            "${1x}",
            "$$",
            "${SET:-}",
            "x\ty",
            "\u{e9}",
            "\u{1F600}/s",
            "%",
            "\\",
            "0.0.0.0:99999",
            "http://",
            "http://h/p",
            "redis://",
            "*.x",
            "header:",
            "query:",
            "999999999999/s",
        ])
        .prop_map(str::to_owned),
        "[ -~]{0,12}",
        "[0-9.]{1,6}(ms|s|m|min|h|d|/s|/m|/h|/d|/[0-9.]{1,4}s|KiB|GB)?",
        any::<String>(),
    ]
}

/// A value written so that YAML reads it as one plain string, whatever it holds.
fn quoted(value: &str) -> String {
    let mut out = String::from("\"");
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The skeleton with each slot filled: `picks[i]` chooses a valid value, `replaced` puts a
/// hostile one in slot `at` (raw, or quoted so that the YAML structure stays intact).
fn fill(picks: &[usize], replaced: Option<(usize, &str)>) -> String {
    let mut text = SKELETON.to_owned();
    for (i, slot) in SLOTS.iter().enumerate() {
        let value = match replaced {
            Some((at, value)) if at == i => value.to_owned(),
            _ => slot.valid[picks[i] % slot.valid.len()].to_owned(),
        };
        text = text.replace(&format!("{{{}}}", slot.name), &value);
    }
    text
}

/// The 1-based line of slot `at` in the skeleton.
fn slot_line(at: usize) -> usize {
    let placeholder = format!("{{{}}}", SLOTS[at].name);
    SKELETON
        .lines()
        .position(|l| l.contains(&placeholder))
        .expect("every slot is in the skeleton")
        + 1
}

fn picks() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(0usize..8, SLOTS.len())
}

proptest! {
    /// Any text at all: a config or problems inside the text, never a panic or a hang.
    #[test]
    fn config_any_text_gives_config_or_placed_problems(text in any::<String>()) {
        let _ = check_parse(&text);
    }

    /// YAML-looking text: the same, deeper into the loader.
    #[test]
    fn config_yamlish_text_gives_config_or_placed_problems(text in yamlish_text()) {
        let _ = check_parse(&text);
    }

    /// The skeleton with valid values is a valid config, whichever valid values are chosen.
    #[test]
    fn config_skeleton_with_valid_values_loads(picks in picks()) {
        let text = fill(&picks, None);
        let result = check_parse(&text);
        prop_assert!(result.is_ok(), "{text}\n{:?}", result.err());
    }

    /// One slot quoted as a string with a hostile value: if refused, every problem is on that
    /// slot's line.
    #[test]
    fn config_one_bad_value_is_reported_on_its_line(
        picks in picks(),
        at in 0..SLOTS.len(),
        value in hostile_value(),
    ) {
        let text = fill(&picks, Some((at, &quoted(&value))));
        if let Err(problems) = check_parse(&text) {
            let line = slot_line(at);
            for p in &problems {
                prop_assert_eq!(p.line, line, "{} for {:?} in\n{}", p, value, text);
            }
        }
    }

    /// One slot replaced by raw hostile text (which may break the YAML): no panic, placed problems.
    #[test]
    fn config_one_raw_hostile_value_is_handled(
        picks in picks(),
        at in 0..SLOTS.len(),
        value in hostile_value(),
    ) {
        let _ = check_parse(&fill(&picks, Some((at, &value))));
    }
}

// ---------------------------------------------------------------------------------------------
// rates and durations

/// Durations as the file writes them: whole milliseconds up to a year, or any nanoseconds below
/// 100 days (where an f64 of seconds still holds every nanosecond).
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..=365 * 86_400_000).prop_map(Duration::from_millis),
        (0u64..100 * 86_400_000_000_000).prop_map(Duration::from_nanos),
        prop::sample::select(vec![1u64, 60, 3600, 86_400, 5400]).prop_map(Duration::from_secs),
    ]
}

/// Rates from one event a day to ten million a second, as `count` per `per_ms`.
fn rate_parts() -> impl Strategy<Value = (f64, u64)> {
    (
        prop_oneof![(1u32..=10_000_000).prop_map(f64::from), 0.001f64..1e7],
        prop::sample::select(vec![1u64, 10, 1000, 60_000, 3_600_000, 86_400_000]),
    )
}

proptest! {
    /// A formatted duration parses back to the same duration.
    #[test]
    fn duration_format_parses_back(d in duration()) {
        let text = format_duration(d);
        prop_assert_eq!(parse_duration(&text), Ok(d), "{}", text);
    }

    /// Any duration at all, to the nanosecond, formats and parses back to itself.
    #[test]
    fn any_duration_format_parses_back(secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
        let d = Duration::new(secs, nanos);
        let text = format_duration(d);
        prop_assert_eq!(parse_duration(&text), Ok(d), "{}", text);
    }

    /// Any size formats and parses back to itself.
    #[test]
    fn size_format_parses_back(bytes in prop_oneof![any::<u64>(), (0u64..1 << 24).prop_map(|n| n << 40)]) {
        let text = format_size(bytes);
        prop_assert_eq!(parse_size(&text), Ok(bytes), "{}", text);
    }

    /// What parses formats back to the same value: durations, rates and sizes.
    #[test]
    fn parsed_units_format_back(text in "[0-9]{0,22}(\\.[0-9]{0,12})?(ms|s|m|h|d|/s|/m|/h|/[0-9]{1,3}ms|KiB|MB|TiB|)") {
        if let Ok(d) = parse_duration(&text) {
            prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{}", text);
        }
        if let Ok(n) = parse_size(&text) {
            prop_assert_eq!(parse_size(&format_size(n)), Ok(n), "{}", text);
        }
        if let Ok(r) = parse_rate(&text) {
            let back = parse_rate(&format_rate(r.rate)).map_err(TestCaseError::fail)?;
            let (a, b) = (r.rate.per_sec(), back.rate.per_sec());
            prop_assert!((a - b).abs() <= a * 1e-9, "{} -> {} -> {}", text, a, b);
        }
    }

    /// A formatted rate parses back to the same rate (to the formatter's 1e-9 rounding).
    #[test]
    fn rate_format_parses_back((count, per_ms) in rate_parts()) {
        let rate = Rate::new(count, Duration::from_millis(per_ms)).expect("positive and finite");
        let text = format_rate(rate);
        let back = parse_rate(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        let (a, b) = (rate.per_sec(), back.rate.per_sec());
        prop_assert!((a - b).abs() <= a * 1e-9, "{} -> {} -> {}", a, text, b);
    }

    /// A rate written as `N/unit` or `N/DURATION` keeps N and its span.
    #[test]
    fn rate_text_keeps_count_and_span(count in 1u32..1_000_000, d in duration()) {
        prop_assume!(!d.is_zero());
        let text = format!("{count}/{}", format_duration(d));
        let parsed = parse_rate(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        prop_assert_eq!(parsed.count, f64::from(count));
        prop_assert_eq!(parsed.per, d);
    }

    /// A zero span is refused, and so is a rate too small or too large for an f64.
    #[test]
    fn rate_refuses_zero_span_and_out_of_range(count in 0.001f64..1e6) {
        for span in ["0s", "0ms", "0.0000000001s", "0h0m"] {
            let text = format!("{count}/{span}");
            prop_assert!(parse_rate(&text).is_err(), "{} was accepted", text);
        }
        let huge = format!("{}/ms", "9".repeat(400));
        prop_assert!(parse_rate(&huge).is_err());
    }

    /// Durations and rates never panic on any text.
    #[test]
    fn units_never_panic(text in any::<String>()) {
        let _ = parse_duration(&text);
        let _ = parse_rate(&text);
        let _ = parse_size(&text);
    }

}

/// Zero, negative, NaN and infinite counts are refused, whatever the unit (every combination).
#[test]
fn rate_refuses_zero_negative_and_non_finite() {
    let counts = [
        "0", "0.0", "-0", "-1", "-0.5", "NaN", "nan", "inf", "-inf", "infinity", "1e400",
    ];
    for count in counts {
        for unit in ["s", "m", "min", "h", "d", "60s", "1.5s", "1h30m"] {
            let text = format!("{count}/{unit}");
            assert!(parse_rate(&text).is_err(), "{text} was accepted");
        }
    }
}

/// Negative, NaN, infinite and unitless durations are refused; zero is a duration (callers that
/// need more refuse it, see the next test).
#[test]
fn duration_refuses_negative_and_non_finite() {
    for number in [
        "-1",
        "-0",
        "NaN",
        "nan",
        "inf",
        "-inf",
        "+1",
        "1e3",
        &"9".repeat(400),
    ] {
        for unit in ["ms", "s", "m", "min", "h", "d"] {
            let text = format!("{number}{unit}");
            assert!(parse_duration(&text).is_err(), "{text} was accepted");
        }
    }
}

/// Through the loader, a zero timeout, window or rate is refused, at its line (every
/// combination).
#[test]
fn config_refuses_zero_durations_and_rates() {
    let zeros = ["0s", "0ms", "0h0m", "0.0000000001s"];
    let rates = ["0/s", "0.0/m", "5/0s", "-1/s", "NaN/s", "inf/s", "1e308/ms"];
    let durations = [2, 5, 18].into_iter().flat_map(|at| zeros.map(|v| (at, v)));
    let cases = durations.chain([9, 15].into_iter().flat_map(|at| rates.map(|v| (at, v))));
    for (at, value) in cases {
        let text = fill(&vec![0; SLOTS.len()], Some((at, value)));
        let problems = check_parse(&text).expect_err(value);
        for p in problems {
            assert_eq!(p.line, slot_line(at), "{p}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// X-Forwarded-For

/// One X-Forwarded-For entry as written, and the address it stands for (`None`: unparsable).
fn xff_entry() -> impl Strategy<Value = (String, Option<IpAddr>)> {
    let v4 = prop_oneof![
        (0u8..4).prop_map(|n| Ipv4Addr::new(10, 0, 0, n)),
        (0u8..4).prop_map(|n| Ipv4Addr::new(192, 0, 2, n)),
        any::<u32>().prop_map(Ipv4Addr::from),
    ];
    let v6 = prop_oneof![
        (0u16..4).prop_map(|n| Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, n)),
        (0u16..4).prop_map(|n| Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n)),
        any::<u128>().prop_map(Ipv6Addr::from),
    ];
    prop_oneof![
        v4.clone()
            .prop_map(|ip| (ip.to_string(), Some(IpAddr::V4(ip)))),
        (v4.clone(), any::<u16>())
            .prop_map(|(ip, port)| (format!("{ip}:{port}"), Some(IpAddr::V4(ip)))),
        v4.prop_map(|ip| { (ip.to_ipv6_mapped().to_string(), Some(IpAddr::V4(ip))) }),
        v6.clone()
            .prop_map(|ip| (ip.to_string(), Some(IpAddr::V6(ip).to_canonical()))),
        v6.clone()
            .prop_map(|ip| (format!("[{ip}]"), Some(IpAddr::V6(ip).to_canonical()))),
        (v6, any::<u16>()).prop_map(|(ip, port)| (
            format!("[{ip}]:{port}"),
            Some(IpAddr::V6(ip).to_canonical())
        )),
        prop::sample::select(vec![
            "unknown",
            "_hidden",
            "1.2.3",
            "1.2.3.4:",
            "1.2.3.4:65536",
            "1.2.3.4:-1",
            "[1.2.3.4]",
            "[::1",
            "::1]",
            "[::1]x",
            "2001:db8::1:99999",
            "10.0.0.1/8",
            "1.2.3.4 5",
            "\u{e9}",
        ])
        .prop_map(|g| (g.to_owned(), None)),
    ]
}

/// Trusted networks: IPv4 and IPv6, the IPv4-mapped form, and sometimes everything.
fn trusted_nets() -> impl Strategy<Value = Vec<IpNet>> {
    let net = prop::sample::select(vec![
        "10.0.0.0/8",
        "10.0.0.1/32",
        "192.0.2.0/24",
        "2001:db8::/32",
        "fd00::/8",
        "::ffff:10.0.0.0/104",
        "0.0.0.0/0",
        "::/0",
    ]);
    proptest::collection::vec(net, 0..4).prop_map(|nets| {
        nets.iter()
            .map(|n| n.parse().expect("test network"))
            .collect()
    })
}

/// The documented algorithm, written as documented: walk right to left, skip trusted
/// addresses, stop at the first untrusted one or at garbage.
fn reference_client_ip(peer: IpAddr, entries: &[Option<IpAddr>], trusted: &[IpNet]) -> IpAddr {
    let peer = peer.to_canonical();
    if !is_trusted(peer, trusted) {
        return peer;
    }
    let mut last_trusted = None;
    for entry in entries.iter().rev() {
        match entry {
            Some(ip) if is_trusted(*ip, trusted) => last_trusted = Some(*ip),
            Some(ip) => return *ip,
            None => return last_trusted.unwrap_or(peer),
        }
    }
    last_trusted.unwrap_or(peer)
}

/// Splits `entries` over header lines at the given cut points, with varied separators.
fn xff_lines(entries: &[(String, Option<IpAddr>)], cuts: &[bool], pads: &[u8]) -> Vec<HeaderValue> {
    let mut lines = vec![String::new()];
    for (i, (text, _)) in entries.iter().enumerate() {
        let line = lines.last_mut().expect("never empty");
        if !line.is_empty() {
            line.push_str([",", ", ", " ,\t", ",,"][usize::from(pads[i % pads.len()] % 4)]);
        }
        line.push_str(text);
        if cuts[i % cuts.len()] {
            lines.push(String::new());
        }
    }
    lines
        .iter()
        .map(|l| HeaderValue::from_str(l).expect("entries are visible text"))
        .collect()
}

proptest! {
    /// Generated headers get exactly the documented answer; from an untrusted peer it is the
    /// peer; behind a trusted peer it is the peer or an address of the header; a trusted
    /// address only when no untrusted address stands between it and the peer.
    #[test]
    fn xff_follows_the_documented_walk(
        peer in prop_oneof![
            Just(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))),
            Just("::ffff:10.0.0.1".parse::<IpAddr>().expect("literal")),
            Just(IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 9))),
            any::<u32>().prop_map(|n| IpAddr::V4(Ipv4Addr::from(n))),
        ],
        entries in proptest::collection::vec(xff_entry(), 0..8),
        cuts in proptest::collection::vec(any::<bool>(), 1..4),
        pads in proptest::collection::vec(any::<u8>(), 1..4),
        trusted in trusted_nets(),
    ) {
        let lines = xff_lines(&entries, &cuts, &pads);
        let answer = client_ip(peer, lines.iter(), &trusted);
        let ips: Vec<Option<IpAddr>> = entries.iter().map(|(_, ip)| *ip).collect();
        prop_assert_eq!(answer, reference_client_ip(peer, &ips, &trusted), "{:?}", lines);
        let peer = peer.to_canonical();
        if !is_trusted(peer, &trusted) {
            prop_assert_eq!(answer, peer);
        } else {
            prop_assert!(answer == peer || ips.contains(&Some(answer)));
        }
        // Right of the right-most unparsable entry, a trusted answer means all are trusted.
        let tail = ips.iter().rev().take_while(|ip| ip.is_some()).flatten();
        if is_trusted(answer, &trusted) {
            prop_assert!(tail.clone().all(|ip| is_trusted(*ip, &trusted)), "{:?}", lines);
        }
        // An address left of an unparsable entry was written by the client: never believed.
        if let Some(cut) = ips.iter().rposition(Option::is_none) {
            let spoofable = &ips[..cut];
            let right: Vec<_> = ips[cut..].iter().flatten().collect();
            prop_assert!(
                !spoofable.contains(&Some(answer)) || right.contains(&&answer) || answer == peer,
                "{:?}", lines
            );
        }
    }

    /// Any header bytes: never a panic, and an untrusted peer is always the answer.
    #[test]
    fn xff_any_bytes_from_untrusted_peer_is_the_peer(
        peer in any::<u32>(),
        lines in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..4),
        trusted in trusted_nets(),
    ) {
        let values: Vec<HeaderValue> =
            lines.iter().filter_map(|l| HeaderValue::from_bytes(l).ok()).collect();
        let peer = IpAddr::V4(Ipv4Addr::from(peer));
        let answer = client_ip(peer, values.iter(), &trusted);
        let trusted_peer = is_trusted(peer, &trusted);
        prop_assert!(trusted_peer || answer == peer);
        let _ = client_ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), values.iter(), &trusted);
    }
}

// ---------------------------------------------------------------------------------------------
// path normalisation

/// Paths made of what normalisation looks at, including bad escapes and no leading slash.
fn raw_path() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("/"),
        Just("."),
        Just(".."),
        Just("%2e"),
        Just("%2E"),
        Just("%2f"),
        Just("%2F"),
        Just("%25"),
        Just("%41"),
        Just("%7e"),
        Just("%"),
        Just("%g"),
        Just("%4"),
        Just("a"),
        Just("~"),
        Just("-"),
        Just("\u{e9}"),
        Just("?"),
        Just("%c3%a9"),
        Just("%00"),
    ];
    proptest::collection::vec(piece, 0..16).prop_map(|p| p.concat())
}

/// The byte offset of the first `%` not followed by two hex digits.
fn first_bad_escape(path: &str) -> Option<usize> {
    let b = path.as_bytes();
    (0..b.len()).find(|&i| {
        b[i] == b'%'
            && !(b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    })
}

/// Checks every property of one input to `normalize_path`.
fn check_normalize(path: &str) -> Result<(), TestCaseError> {
    let result = normalize_path(path);
    let expected_error = if !path.starts_with('/') {
        Some(PathError::NotAbsolute)
    } else {
        first_bad_escape(path).map(|at| PathError::BadEscape { at })
    };
    let normal = match (result, expected_error) {
        (Err(e), Some(expected)) => {
            prop_assert_eq!(e, expected, "{:?}", path);
            return Ok(());
        }
        (Err(e), None) => return Err(TestCaseError::fail(format!("{path:?} refused: {e}"))),
        (Ok(n), Some(e)) => return Err(TestCaseError::fail(format!("{path:?} -> {n}, not {e}"))),
        (Ok(n), None) => n,
    };
    prop_assert!(normal.starts_with('/'), "{:?} -> {:?}", path, normal);
    prop_assert!(!normal.contains("//"), "{:?} -> {:?}", path, normal);
    for segment in normal.split('/') {
        prop_assert!(
            segment != "." && segment != "..",
            "{:?} -> {:?}",
            path,
            normal
        );
    }
    let again = normalize_path(&normal);
    prop_assert_eq!(again.as_deref(), Ok(&*normal), "not idempotent: {:?}", path);
    // Every escape kept is a reserved one in uppercase: unreserved ones are decoded.
    for (i, _) in normal.match_indices('%') {
        let hex = &normal[i + 1..i + 3];
        prop_assert_eq!(hex, hex.to_ascii_uppercase(), "{:?} -> {:?}", path, normal);
        let byte = u8::from_str_radix(hex, 16).expect("validated above");
        prop_assert!(!(byte.is_ascii_alphanumeric() || b"-._~".contains(&byte)));
    }
    // `%2F` is never decoded into a separator: normalising never adds a `/`.
    let slashes = |s: &str| s.bytes().filter(|&b| b == b'/').count();
    prop_assert!(
        slashes(&normal) <= slashes(path),
        "{:?} -> {:?}",
        path,
        normal
    );
    // Without dot segments nothing is removed, so every `%2F` is still there.
    if !path.contains('.') && !path.to_ascii_lowercase().contains("%2e") {
        let escaped = |s: &str| s.to_ascii_uppercase().matches("%2F").count();
        prop_assert_eq!(
            escaped(&normal),
            escaped(path),
            "{:?} -> {:?}",
            path,
            normal
        );
    }
    Ok(())
}

/// Paths of route names spelled every way an upstream may read as the same path: escaped and
/// raw slashes and backslashes, dot segments, `;parameters`, escaped letters.
fn spelled_path() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("/"),
        Just("."),
        Just(".."),
        Just("%2e"),
        Just("%2E"),
        Just("%2f"),
        Just("%2F"),
        Just("%5c"),
        Just("%5C"),
        Just("\\"),
        Just(";"),
        Just(";x=1"),
        Just("%3B"),
        Just("%3b"),
        Just("%25"),
        Just("%00"),
        Just("%c3%a9"),
        Just("api"),
        Just("v1"),
        Just("a"),
        Just("%61"),
        Just("%70"),
        Just("%69"),
        Just("%41"),
    ];
    proptest::collection::vec(piece, 0..14).prop_map(|p| format!("/{}", p.concat()))
}

/// The route a matched path takes in a table of prefixes, with no catch-all.
fn route_of(path: &str) -> Option<&'static str> {
    let routes = ["/api/a", "/api", "/v1/a", "/v1", "/a"].map(|prefix| {
        let m = RouteMatch {
            host: None,
            path: PathMatch::Prefix(prefix.into()),
            methods: vec![],
            headers: vec![],
            case_sensitive: true,
        };
        (m, prefix)
    });
    let table = RouteTable::new(routes.to_vec());
    let headers = http::HeaderMap::new();
    let parts = RequestParts {
        host: None,
        path,
        method: &http::Method::GET,
        headers: &headers,
    };
    table.find(&parts).copied()
}

proptest! {
    /// Paths built from slashes, dots and escapes: every property of the normal form.
    #[test]
    fn path_normal_form_properties(path in raw_path()) {
        check_normalize(&path)?;
        check_normalize(&format!("/{path}"))?;
    }

    /// Any text: never a panic, and the same properties.
    #[test]
    fn path_any_text(path in any::<String>()) {
        check_normalize(&path)?;
        check_normalize(&format!("/{path}"))?;
    }

    /// A path takes the route of its lenient reading, or is refused: for a `%00` always, and
    /// otherwise by default only for an escaped slash or backslash, never when those are
    /// decoded.
    #[test]
    fn a_path_takes_the_route_of_its_lenient_reading(path in spelled_path()) {
        let expected = route_of(&lenient_reading(&path));
        for escaped_slashes in [EscapedSlashes::Reject, EscapedSlashes::Decode] {
            let policy = PathPolicy { escaped_slashes, segment_params: SegmentParams::Ignore };
            match policy.read(&path) {
                Ok(read) => {
                    prop_assert_eq!(route_of(read.matched()), expected, "{:?} read as {:?}", path, read);
                    let normal = normalize_path(read.forwarded());
                    prop_assert_eq!(normal.as_deref(), Ok(read.forwarded()), "{:?}", path);
                }
                Err(PathError::Nul { .. }) => prop_assert!(path.contains("%00"), "{:?}", path),
                Err(e) => prop_assert!(
                    escaped_slashes == EscapedSlashes::Reject
                        && matches!(e, PathError::EscapedSlash { .. }),
                    "{:?} refused under {:?}: {}", path, escaped_slashes, e
                ),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Redis replies

/// One algorithm of each kind, with and without `max_delay` for the leaky bucket.
fn algorithms() -> Vec<Algorithm> {
    let rate = Rate::per_second(10.0).expect("positive");
    let nz = |n| NonZeroU32::new(n).expect("positive");
    let window = Window::new(
        NonZeroU64::new(10).expect("positive"),
        Duration::from_secs(1),
    );
    vec![
        Algorithm::TokenBucket(Bucket::new(rate, nz(5), nz(1)).expect("cost <= burst")),
        Algorithm::LeakyBucket(Pace::new(rate, Some(Duration::from_secs(2))).expect("finite")),
        Algorithm::LeakyBucket(Pace::new(rate, None).expect("no bound")),
        Algorithm::FixedWindow(window),
        Algorithm::SlidingWindow(window),
        Algorithm::SlidingWindowCounter(window),
        Algorithm::Concurrency(Slots::new(nz(3), Duration::from_secs(10)).expect("in bounds")),
    ]
}

/// Any reply a Redis server could send, a few levels deep.
fn any_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        Just(Value::Okay),
        any::<i64>().prop_map(Value::Int),
        prop_oneof![
            Just(0i64),
            Just(1),
            Just(-1),
            Just(i64::MAX),
            Just(i64::MIN)
        ]
        .prop_map(Value::Int),
        "[0-9]{0,20}(\\.[0-9]{0,5})?".prop_map(|s| Value::BulkString(s.into_bytes())),
        proptest::collection::vec(any::<u8>(), 0..8).prop_map(Value::BulkString),
        "[ -~]{0,8}".prop_map(Value::SimpleString),
        any::<f64>().prop_map(Value::Double),
        any::<bool>().prop_map(Value::Boolean),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Set),
            proptest::collection::vec((inner.clone(), inner.clone()), 0..3).prop_map(Value::Map),
            (
                inner.clone(),
                proptest::collection::vec((inner.clone(), inner), 0..2)
            )
                .prop_map(|(data, attributes)| Value::Attribute {
                    data: Box::new(data),
                    attributes
                }),
        ]
    })
}

/// A delay as `lua/leaky_bucket.lua` writes it: milliseconds with three decimals.
fn delay_text(delay_us: u64) -> Value {
    Value::BulkString(format!("{}.{:03}", delay_us / 1000, delay_us % 1000).into_bytes())
}

/// Any RESP2 reply: what Redis answers a script call with (RESP3 types left out).
fn resp2_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        Just(Value::Okay),
        any::<i64>().prop_map(Value::Int),
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(Value::BulkString),
        "[ -~]{0,8}"
            .prop_filter("OK is Okay", |s| s != "OK")
            .prop_map(Value::SimpleString),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        proptest::collection::vec(inner, 0..6).prop_map(Value::Array)
    })
}

/// `value` as Redis writes it in RESP2.
fn resp2(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Nil => out.extend_from_slice(b"$-1\r\n"),
        Value::Okay => out.extend_from_slice(b"+OK\r\n"),
        Value::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
        Value::SimpleString(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
        Value::BulkString(b) => {
            out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        }
        Value::Array(items) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            items.iter().for_each(|item| resp2(item, out));
        }
        other => unreachable!("not generated: {other:?}"),
    }
}

proptest! {
    /// The store's own reply parser reads back every RESP2 reply whole, with its exact length
    /// (the next reply's bytes untouched), and asks for more bytes at every cut.
    #[test]
    fn resp2_replies_parse_back_exactly(value in resp2_value(), next in resp2_value()) {
        let mut wire = Vec::new();
        resp2(&value, &mut wire);
        let len = wire.len();
        resp2(&next, &mut wire);
        let parsed = parse_reply(&wire).expect("valid RESP2");
        prop_assert_eq!(parsed, Some((Own::from(value), len)));
        for cut in 0..len {
            prop_assert_eq!(parse_reply(&wire[..cut]).expect("a valid prefix"), None);
        }
    }

    /// Any bytes: a reply, a request for more, or an error; never a panic, and a reply read
    /// is what redis-rs's own parser reads from the same bytes.
    #[test]
    fn resp_any_bytes_never_panic(bytes in prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        // lines that look like RESP, so that many parse and the two parsers are compared
        "([-:+$*]-?[0-9]{0,2}[a-z]{0,2}\r?\n?){1,8}".prop_map(String::into_bytes),
        // near the counting scripts' four integers, for the fast path
        "\\*4\r\n(:-?[0-9]{0,20}[a\r]?\r?\n?){0,5}".prop_map(String::into_bytes),
    ]) {
        if let Ok(Some((value, used))) = parse_reply(&bytes) {
            prop_assert!(used <= bytes.len());
            let theirs = redis::parse_redis_value(&bytes[..used]).expect("redis-rs agrees");
            prop_assert_eq!(value, Own::from(theirs));
        }
        // the counting scripts' fast path reads nothing the full parser would not
        if let Some((four, used)) = parse_counts(&bytes) {
            prop_assert_eq!(parse_reply(&bytes).ok(), Some(Some((Own::from(ints(four)), used))));
        }
    }

    /// Four integers, as the counting scripts answer: the fast path reads them back exactly,
    /// with their length, and reads nothing from a cut reply.
    #[test]
    fn four_integer_replies_parse_back_on_the_fast_path(
        four in proptest::array::uniform4(any::<i64>()),
        next in resp2_value(),
    ) {
        let mut wire = Vec::new();
        resp2(&ints(four), &mut wire);
        let len = wire.len();
        resp2(&next, &mut wire);
        prop_assert_eq!(parse_counts(&wire), Some((four, len)));
        for cut in 0..len {
            prop_assert_eq!(parse_counts(&wire[..cut]), None);
        }
    }
}

fn ints(four: [i64; 4]) -> Value {
    Value::Array(four.map(Value::Int).to_vec())
}

proptest! {
    /// Any reply tree: an error or a decision, never a panic.
    #[test]
    fn reply_any_value_never_panics(value in any_value()) {
        for alg in algorithms() {
            let _ = decode(&alg, &Own::from(value.clone()));
            let _ = decode(&alg, &Own::from(Value::Array(vec![value.clone(), delay_text(1)])));
            let _ = decode(&alg, &Own::from(Value::Array(vec![Value::Int(1), value.clone()])));
        }
    }

    /// The counting algorithms' `{allowed, remaining, retry_after_ms, reset_ms}` decodes exactly;
    /// concurrency's four integers as its own.
    #[test]
    fn reply_counted_shape_decodes(
        allowed in 0i64..=1,
        figures in proptest::array::uniform3(0i64..=i64::MAX),
    ) {
        let [remaining, retry, reset] = figures;
        let value = Value::Array(
            [allowed, remaining, retry, reset].into_iter().map(Value::Int).collect(),
        );
        let as_u64 = |n: i64| u64::try_from(n).expect("non-negative");
        let expected =
            Decision::counted(allowed == 1, as_u64(remaining), as_u64(retry), as_u64(reset));
        for alg in algorithms() {
            let decoded = decode(&alg, &Own::from(value.clone()));
            match alg {
                Algorithm::LeakyBucket(_) => prop_assert!(decoded.is_err()),
                // `{admitted, free, wait_ms, held}`: the wait, at most a second, is the reset
                Algorithm::Concurrency(_) => prop_assert_eq!(
                    decoded.ok(),
                    Some(Decision::slots(allowed == 1, as_u64(remaining), as_u64(retry)))
                ),
                _ => prop_assert_eq!(decoded.ok(), Some(expected)),
            }
        }
        let negative = Value::Array(vec![Value::Int(allowed), Value::Int(-1), Value::Int(0), Value::Int(0)]);
        prop_assert!(decode(&algorithms()[0], &Own::from(negative)).is_err());
    }

    /// The leaky bucket's `{admitted, "delay_ms"}` decodes to exactly `Decision::paced`.
    #[test]
    fn reply_paced_shape_decodes(admitted in 0i64..=1, delay_us in 0u64..=u64::MAX / 1000) {
        let value = Value::Array(vec![Value::Int(admitted), delay_text(delay_us)]);
        for alg in algorithms() {
            let decoded = decode(&alg, &Own::from(value.clone()));
            match alg {
                Algorithm::LeakyBucket(p) => {
                    let expected = Decision::paced(
                        admitted == 1, delay_us, p.rate.interval_ms(), p.max_delay_ms,
                    );
                    prop_assert_eq!(decoded.ok(), Some(expected));
                }
                _ => prop_assert!(decoded.is_err()),
            }
        }
    }

    /// Raw RESP bytes through the redis crate's own parser, then decoded: never a panic.
    #[test]
    fn reply_any_resp_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(value) = redis::parse_redis_value(&bytes) {
            for alg in algorithms() {
                let _ = decode(&alg, &Own::from(value.clone()));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// regressions: inputs the fuzzers found

/// Found by `duration_format_parses_back`: durations went through an f64 of seconds, so beyond
/// 2^53 ns (about 104 days) a duration written to the millisecond or the nanosecond came back a
/// nanosecond off, and `format_duration` lost nanoseconds the same way.
#[test]
fn long_durations_parse_and_format_exactly() {
    let cases = [
        ("23866897.253s", Duration::new(23_866_897, 253_000_000)),
        ("13083885.06s", Duration::new(13_083_885, 60_000_000)),
        ("7791502.410058399s", Duration::new(7_791_502, 410_058_399)),
        ("276d", Duration::from_secs(276 * 86_400)),
    ];
    for (text, d) in cases {
        assert_eq!(parse_duration(text), Ok(d), "{text}");
        assert_eq!(format_duration(d), text);
    }
    assert_eq!(
        format_duration(Duration::new(u64::MAX, 999_999_999)),
        "18446744073709551615.999999999s"
    );
    assert_eq!(
        parse_duration("18446744073709551616s"),
        Err("duration \"18446744073709551616s\" is too large".to_owned())
    );
}

/// Found by `units`: sizes went through an f64, so a size above 2^53 bytes, formatted as
/// `3390945601784844KiB`, parsed back as another number of bytes.
#[test]
fn large_sizes_parse_exactly() {
    let bytes = 3_472_328_296_227_680_256;
    assert_eq!(format_size(bytes), "3390945601784844KiB");
    assert_eq!(parse_size("3390945601784844KiB"), Ok(bytes));
    assert_eq!(parse_size("9007199254740993"), Ok(9_007_199_254_740_993));
    assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
    assert_eq!(
        parse_size("1.9999B"),
        Ok(1),
        "a fraction of a byte is rounded down"
    );
    assert!(parse_size("16EiB").is_err() && parse_size("18446744073709551616").is_err());
}

/// Found while writing the rate properties: a rate too large for an f64 was refused as "rate
/// must be greater than zero, found inf".
#[test]
fn huge_rate_is_refused_as_too_large() {
    let text = "1e308/ms";
    assert_eq!(
        parse_rate(text).err(),
        Some(format!("rate {text:?} is too large"))
    );
}

/// Found by `config_refuses_zero_durations_and_rates`: an upstream whose `pace` is invalid was
/// dropped, so every route naming it drew a second, wrong problem, "no upstream named "api": the
/// file defines no upstreams".
#[test]
fn invalid_upstream_is_not_reported_missing_by_its_routes() {
    let text = fill(&vec![0; SLOTS.len()], Some((9, "0/s")));
    let problems = check_parse(&text).expect_err("a zero pace rate");
    let messages: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        ["fuzz.yaml:16:13: upstreams.api.pace.rate: rate must be greater than zero, found \"0/s\""]
    );
}

/// The same, found reading that code: when `upstreams` itself is invalid (`upstreams: 5`),
/// every route drew "no upstream named ...: the file defines no upstreams" as well.
#[test]
fn invalid_upstreams_is_not_reported_again_by_every_route() {
    let text = "listen: 0.0.0.0:1\nupstreams: 5\nroutes: [{name: r, upstream: a}]\n";
    let problems = check_parse(text).expect_err("upstreams is not a mapping");
    let messages: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        ["fuzz.yaml:2:12: upstreams: expected a mapping, found 5"]
    );
}

/// Found reading the loader for what grows with input: a "did you mean" suggestion compared a
/// route's `upstream` with every upstream name in a table of their two lengths, so a 100 KB
/// value against a 1000-character name took 800 MB and a second; this one, 2.4 GB (the time
/// bound of `check_parse` fails it), and a longer one all memory.
#[test]
fn long_unknown_upstream_gets_no_suggestion_and_no_quadratic_table() {
    let (name, wanted) = ("x".repeat(1000), "y".repeat(300_000));
    let text = format!(
        "listen: 0.0.0.0:1\nupstreams:\n  {name}: {{targets: http://h}}\n\
         routes: [{{name: r, upstream: {wanted}}}]\n"
    );
    let problems = check_parse(&text).expect_err("no such upstream");
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].message.starts_with("no upstream named \"yyy"),
        "{}",
        problems[0].message
    );
    assert!(problems[0]
        .message
        .ends_with(&format!("; upstreams defines {name}")));
}

/// Found by `config_text` (a property that was wrong, not the loader): YAML ends a line at a lone
/// CR (and at NEL, LS, PS), so a file with old Mac line ends has problems past its last `\n`
/// line; they are inside the text as YAML reads it, and `yaml_lines` counts that way.
#[test]
fn problems_in_a_file_with_cr_line_ends_are_placed_on_yaml_lines() {
    let text = "listen: 0.0.0.0:1\rworkers: 0\rroutes: [\r";
    let problems = check_parse(text).expect_err("an unclosed list");
    assert_eq!(text.lines().count(), 1);
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].line, 4, "{}", problems[0]);
}

/// Found by timing the loader on large bad files: each problem's position (and each "on line N"
/// in a message) read the whole file again, so 1000 routes naming a missing upstream took 13 s
/// in a release build and 4000 repeated keys a minute. Now the first 100 problems are placed
/// and the rest counted.
#[test]
fn thousands_of_problems_are_counted_not_placed() {
    let routes: String = (0..400)
        .map(|i| format!("  - {{name: r{}, upstream: api}}\n", i % 200))
        .collect();
    let text = format!(
        "listen: 0.0.0.0:8080\nupstreams: {{api: {{targets: http://h}}}}\nroutes:\n{routes}"
    );
    let problems = check_parse(&text).expect_err("duplicate route names");
    assert_eq!(problems.len(), 101);
    let last = problems.last().expect("101 problems");
    assert_eq!(
        last.message,
        "100 more not shown: fix the problems above and check again"
    );
    assert_eq!(
        problems[0].to_string(),
        "fuzz.yaml:204:12: routes[200].name: duplicate route name \"r0\": routes[0] on line 4 has it"
    );
}

/// Found by `units` in CI's smoke run: a rate of 142857142.86 an hour was written as
/// `142857143/h` (whole counts were accepted within a relative 1e-9), which reads back a
/// billionth off.
#[test]
fn rate_near_a_whole_count_is_not_rounded_to_it() {
    let rate = Rate::per_second(39682.53968253968).unwrap();
    let text = format_rate(rate);
    let back = parse_rate(&text).unwrap().rate.per_sec();
    assert!(
        (back - rate.per_sec()).abs() <= rate.per_sec() * 1e-12,
        "{text} -> {back}"
    );
    // and ordinary rates keep their unit
    assert_eq!(format_rate(Rate::per_second(0.1).unwrap()), "6/m");
    assert_eq!(format_rate(Rate::per_second(100.0).unwrap()), "100/s");
}

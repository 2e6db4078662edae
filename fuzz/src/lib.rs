//! The properties the fuzz targets check, one function per target, panicking on a violation
//! (libFuzzer records the input that panicked in `fuzz/artifacts/<target>/`).
//!
//! `tests/fuzz_props.rs` of the main crate checks the same properties with proptest; a crash
//! found here gets a regression test there.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4};
use std::num::{NonZeroU32, NonZeroU64};
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Result as ArbResult, Unstructured};
use http::HeaderValue;
use ipnet::IpNet;
use redis::Value;
use tollgate::config::units::{
    format_duration, format_rate, format_size, parse_duration, parse_rate, parse_size,
};
use tollgate::config::{self, ConfigError};
use tollgate::identity::{client_ip, is_trusted};
use tollgate::limit::{Algorithm, Bucket, Decision, Pace, Rate, Window};
use tollgate::routing::{
    normalize_path, EscapedSlashes, PathError, PathPolicy, SegmentParams,
};
use tollgate::store::resp::Value as Own;
use tollgate::store::{decode, parse_reply};

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

/// Only `SET` is set in the fuzzed environment.
fn env(name: &str) -> Option<String> {
    (name == "SET").then(|| "value".to_owned())
}

/// Any text gives a config or problems inside the text, in well under a second (libFuzzer's
/// `-timeout` catches a true hang; this catches a slow path at the fuzzer's small sizes).
/// Returns the problems' lines, if refused.
pub fn check_config(text: &str) -> Option<Vec<usize>> {
    let parse = || config::parse(text, "fuzz.yaml", &env);
    let started = Instant::now();
    let result = parse();
    // Wall time on a shared machine: slow only if it is slow three times in a row.
    if started.elapsed() > Duration::from_secs(1) {
        let again = Instant::now();
        (0..2).for_each(|_| drop(parse()));
        let took = again.elapsed() / 2;
        assert!(took < Duration::from_secs(1), "took {took:?}");
    }
    let lines = yaml_lines(text);
    let problems = match &result {
        Ok(loaded) => {
            let _ = loaded.config.summary();
            let _ = loaded.config.to_json();
            &loaded.warnings
        }
        Err(ConfigError::Invalid(problems)) => {
            assert!(!problems.is_empty(), "refused without a problem");
            problems
        }
        Err(e @ ConfigError::Read { .. }) => panic!("parse read a file: {e}"),
    };
    for p in problems {
        assert!(
            p.line >= 1 && p.line <= lines + 1 && p.column >= 1,
            "{p} is outside the {lines} lines"
        );
    }
    let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
    result.err().map(|_| lines)
}

/// A config that is valid with every slot filled from its valid values; no two slots share a
/// line (the same skeleton as `tests/fuzz_props.rs`).
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

/// (placeholder, valid values) of each slot of [`SKELETON`].
const SLOTS: &[(&str, &[&str])] = &[
    (
        "listen",
        &["0.0.0.0:8080", "'[::1]:9000'", "[127.0.0.1:0, 127.0.0.1:0]"],
    ),
    ("workers", &["1", "64", "~"]),
    ("timeout", &["50ms", "1.5s", "1h30m"]),
    ("max_keys", &["1", "1000000"]),
    ("trusted", &["", "10.0.0.0/8", "'::1', 192.0.2.1"]),
    ("duration", &["10s", "0.25s", "2min"]),
    ("shutdown", &["0s", "30s"]),
    ("size", &["1000", "10MiB", "1.5KB"]),
    (
        "target",
        &["http://127.0.0.1:8000", "'https://api.example.com'"],
    ),
    ("rate", &["100/s", "0.5/m", "3/60s"]),
    ("max_delay", &["2s", "~"]),
    ("route", &["api", "v1.users_2"]),
    ("prefix", &["/", "/v1", "/v1/"]),
    ("method", &["GET", "get, POST"]),
    ("key", &["ip", "header:x-api-key", "[ip, 'query:k']"]),
    ("bucket_rate", &["10/s", "1000/h", "'${UNSET:-5}/s'"]),
    ("burst", &["20", "~"]),
    ("limit", &["1", "1000"]),
    ("window", &["1h", "500ms"]),
];

/// How one slot of the skeleton is filled.
#[derive(Debug)]
enum Fill<'a> {
    /// one of the slot's valid values
    Valid(usize),
    /// any text, as a double-quoted YAML string: the structure stays intact
    Quoted(&'a str),
    /// any text, as it is: may break the YAML
    Raw(&'a str),
}

impl<'a> Arbitrary<'a> for Fill<'a> {
    fn arbitrary(u: &mut Unstructured<'a>) -> ArbResult<Fill<'a>> {
        // Mostly valid, so that a document has one or two bad values, not nineteen.
        Ok(match u.int_in_range(0..=9u8)? {
            0 => Fill::Quoted(u.arbitrary()?),
            1 => Fill::Raw(u.arbitrary()?),
            n => Fill::Valid(usize::from(n)),
        })
    }
}

/// A value written so that YAML reads it as one string, whatever it holds.
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

/// The skeleton with slots filled from `data`: all valid values load; one quoted bad value is
/// reported on its own line; anything else is at least handled like any text.
pub fn check_config_skeleton(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let mut text = SKELETON.to_owned();
    let mut bad_lines = Vec::new();
    let mut raw = false;
    for (i, (name, valid)) in SLOTS.iter().enumerate() {
        let fill = u.arbitrary::<Fill<'_>>().unwrap_or(Fill::Valid(0));
        let value = match fill {
            Fill::Valid(n) => valid[n % valid.len()].to_owned(),
            Fill::Quoted(v) => {
                bad_lines.push(skeleton_line(i));
                quoted(v)
            }
            Fill::Raw(v) => {
                raw = true;
                v.to_owned()
            }
        };
        text = text.replace(&format!("{{{name}}}"), &value);
    }
    let lines = check_config(&text);
    if raw {
        return;
    }
    match (lines, bad_lines.as_slice()) {
        (Some(lines), []) => panic!("valid values refused at lines {lines:?}:\n{text}"),
        (Some(lines), [bad]) => {
            assert!(
                lines.iter().all(|l| l == bad),
                "{lines:?}, not {bad}:\n{text}"
            );
        }
        _ => {}
    }
}

/// The 1-based line of slot `at` in the skeleton.
fn skeleton_line(at: usize) -> usize {
    let placeholder = format!("{{{}}}", SLOTS[at].0);
    SKELETON
        .lines()
        .position(|l| l.contains(&placeholder))
        .expect("every slot is in the skeleton")
        + 1
}

// ---------------------------------------------------------------------------------------------
// units

/// Any text: no panic; what parses formats back to the same value; no accepted rate is zero,
/// negative, NaN or infinite.
pub fn check_units_text(text: &str) {
    if let Ok(d) = parse_duration(text) {
        let back = format_duration(d);
        assert_eq!(parse_duration(&back), Ok(d), "{text:?} -> {back:?}");
    }
    if let Ok(r) = parse_rate(text) {
        assert!(r.count.is_finite() && r.count > 0.0, "count {}", r.count);
        assert!(!r.per.is_zero());
        check_rate_round_trip(r.rate);
    }
    if let Ok(n) = parse_size(text) {
        assert_eq!(parse_size(&format_size(n)), Ok(n));
    }
}

/// Any duration, rate and size from 28 bytes of fuzz data (shorter data is padded with zeros):
/// formatted, each parses back to itself.
pub fn check_units_values(figures: &[u8]) {
    let mut bytes = [0u8; 28];
    bytes[..figures.len().min(28)].copy_from_slice(&figures[..figures.len().min(28)]);
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let nanos = u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes"));
    let d = Duration::new(word(0), nanos % 1_000_000_000);
    let text = format_duration(d);
    assert_eq!(parse_duration(&text), Ok(d), "{text}");
    if let Ok(rate) = Rate::per_second(f64::from_bits(word(8))) {
        check_rate_round_trip(rate);
    }
    let size = word(16);
    assert_eq!(parse_size(&format_size(size)), Ok(size));
}

fn check_rate_round_trip(rate: Rate) {
    let text = format_rate(rate);
    let (a, b) = match parse_rate(&text) {
        Ok(back) => (rate.per_sec(), back.rate.per_sec()),
        Err(e) => panic!("{} -> {text:?}: {e}", rate.per_sec()),
    };
    assert!((a - b).abs() <= a * 1e-9, "{a} -> {text:?} -> {b}");
}

// ---------------------------------------------------------------------------------------------
// X-Forwarded-For

/// A peer, trusted networks and header lines, from fuzz data.
#[derive(Debug)]
pub struct XffCase {
    peer: IpAddr,
    trusted: Vec<IpNet>,
    lines: Vec<Vec<u8>>,
}

impl<'a> Arbitrary<'a> for XffCase {
    fn arbitrary(u: &mut Unstructured<'a>) -> ArbResult<XffCase> {
        let peer = small_ip(u)?;
        let mut trusted = Vec::new();
        for _ in 0..u.int_in_range(0..=3u8)? {
            let ip = small_ip(u)?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let prefix = u.int_in_range(0..=max)?;
            trusted.push(IpNet::new(ip, prefix).expect("prefix in range"));
        }
        let mut lines = Vec::new();
        for _ in 0..u.int_in_range(0..=3u8)? {
            lines.push(xff_line(u)?);
        }
        Ok(XffCase {
            peer,
            trusted,
            lines,
        })
    }
}

/// One header line: entries written in every form the header takes, or any bytes, joined by
/// commas with or without spaces.
fn xff_line(u: &mut Unstructured<'_>) -> ArbResult<Vec<u8>> {
    let mut line = Vec::new();
    for i in 0..u.int_in_range(0..=6u8)? {
        if i > 0 {
            line.extend_from_slice(u.choose(&[&b","[..], b", ", b" ,\t", b",,"])?);
        }
        let ip = small_ip(u)?;
        let port: u16 = u.arbitrary()?;
        let entry = match (u.int_in_range(0..=4u8)?, ip) {
            (0, _) => ip.to_string(),
            (1, IpAddr::V4(v4)) => format!("{v4}:{port}"),
            (1, IpAddr::V6(v6)) => format!("[{v6}]:{port}"),
            (2, _) => format!("[{ip}]"),
            (3, _) => String::from_utf8_lossy(u.arbitrary::<&[u8]>()?).into_owned(),
            _ => {
                line.extend_from_slice(u.arbitrary::<&[u8]>()?);
                continue;
            }
        };
        line.extend_from_slice(entry.as_bytes());
    }
    Ok(line)
}

/// An address from a small pool, so that the header's text and the trusted networks meet.
fn small_ip(u: &mut Unstructured<'_>) -> ArbResult<IpAddr> {
    let n: u8 = u.int_in_range(0..=3)?;
    Ok(match u.int_in_range(0..=4u8)? {
        0 => IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)),
        1 => IpAddr::V4(Ipv4Addr::new(192, 0, 2, n)),
        2 => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, n.into())),
        3 => IpAddr::V6(Ipv4Addr::new(10, 0, 0, n).to_ipv6_mapped()),
        _ => u.arbitrary()?,
    })
}

/// One entry as the documentation describes it, parsed with std only.
fn reference_entry(entry: &[u8]) -> Option<IpAddr> {
    let entry = std::str::from_utf8(entry).ok()?;
    let ip = if let Ok(ip) = entry.parse::<IpAddr>() {
        ip
    } else if let Some(rest) = entry.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port_ok = after.is_empty()
            || after.strip_prefix(':').is_some_and(|p| {
                !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok()
            });
        if !port_ok {
            return None;
        }
        IpAddr::V6(inside.parse().ok()?)
    } else {
        // `SocketAddrV4` takes a port of digits only, as the header's `1.2.3.4:80` form.
        IpAddr::V4(*entry.parse::<SocketAddrV4>().ok()?.ip())
    };
    Some(ip.to_canonical())
}

/// The documented walk: right to left, skipping trusted addresses, stopping at the first
/// untrusted one or at garbage.
fn reference_walk(peer: IpAddr, entries: &[Option<IpAddr>], trusted: &[IpNet]) -> IpAddr {
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

/// From an untrusted peer the answer is the peer; behind a trusted one, the documented walk's
/// answer, which is the peer or an address of the header, and trusted only if every address
/// right of the last unparsable entry is.
pub fn check_xff(case: &XffCase) {
    let values: Vec<HeaderValue> = case
        .lines
        .iter()
        .filter_map(|l| HeaderValue::from_bytes(l).ok())
        .collect();
    let answer = client_ip(case.peer, values.iter(), &case.trusted);
    let peer = case.peer.to_canonical();
    if !is_trusted(peer, &case.trusted) {
        assert_eq!(answer, peer);
        return;
    }
    let entries: Vec<Option<IpAddr>> = values
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|e| !e.is_empty())
        .map(reference_entry)
        .collect();
    assert_eq!(
        answer,
        reference_walk(peer, &entries, &case.trusted),
        "{values:?}"
    );
    assert!(answer == peer || entries.contains(&Some(answer)));
    if is_trusted(answer, &case.trusted) {
        let mut tail = entries.iter().rev().map_while(|e| e.as_ref());
        assert!(tail.all(|ip| is_trusted(*ip, &case.trusted)), "{values:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// path normalisation

/// The byte offset of the first `%` not followed by two hex digits.
fn first_bad_escape(path: &str) -> Option<usize> {
    let b = path.as_bytes();
    (0..b.len()).find(|&i| {
        b[i] == b'%'
            && !(b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    })
}

/// The exact error for a bad path; for a good one a normal form that starts with `/`, has no
/// empty or dot segment, keeps only reserved escapes in uppercase, never decodes `%2F`, and is
/// its own normal form.
pub fn check_path(path: &str) {
    let expected_error = if !path.starts_with('/') {
        Some(PathError::NotAbsolute)
    } else {
        first_bad_escape(path).map(|at| PathError::BadEscape { at })
    };
    let normal = match (normalize_path(path), expected_error) {
        (Err(e), Some(expected)) => return assert_eq!(e, expected),
        (result, expected) => match result {
            Ok(normal) if expected.is_none() => normal,
            other => panic!("{other:?}, expected {expected:?}"),
        },
    };
    assert!(
        normal.starts_with('/') && !normal.contains("//"),
        "{normal}"
    );
    assert!(normal.split('/').all(|s| s != "." && s != ".."), "{normal}");
    assert_eq!(
        normalize_path(&normal).as_deref(),
        Ok(&*normal),
        "not idempotent"
    );
    for (i, _) in normal.match_indices('%') {
        let hex = &normal[i + 1..i + 3];
        assert_eq!(hex, hex.to_ascii_uppercase(), "{normal}");
        let byte = u8::from_str_radix(hex, 16).expect("validated");
        assert!(
            !(byte.is_ascii_alphanumeric() || b"-._~".contains(&byte)),
            "{normal}"
        );
    }
    let slashes = |s: &str| s.bytes().filter(|&b| b == b'/').count();
    assert!(
        slashes(&normal) <= slashes(path),
        "a `/` appeared: {normal}"
    );
    if !path.contains('.') && !path.to_ascii_lowercase().contains("%2e") {
        let escaped = |s: &str| s.to_ascii_uppercase().matches("%2F").count();
        assert_eq!(escaped(&normal), escaped(path), "{normal}");
    }
}

/// Every `paths` setting reads any path without a panic. What it forwards is a normal path;
/// what routes match is one too, and holds no `;`.
pub fn check_path_policy(path: &str) {
    for escaped_slashes in [
        EscapedSlashes::Reject,
        EscapedSlashes::Decode,
        EscapedSlashes::Keep,
    ] {
        for segment_params in [SegmentParams::Ignore, SegmentParams::Keep] {
            let policy = PathPolicy {
                escaped_slashes,
                segment_params,
            };
            let Ok(read) = policy.read(path) else {
                continue;
            };
            for form in [read.forwarded(), read.matched()] {
                assert_eq!(normalize_path(form).as_deref(), Ok(form), "{policy:?}");
            }
            if segment_params == SegmentParams::Ignore {
                assert!(!read.matched().contains(';'), "{policy:?}: {read:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Redis replies

/// The algorithms a reply is decoded for: fixed ones, and with `fuzzed`, one whose parameters
/// come from `u`.
fn algorithms(u: &mut Unstructured<'_>, fuzzed: bool) -> Vec<Algorithm> {
    let nz32 = |n| NonZeroU32::new(n).expect("positive");
    let rate = Rate::per_second(10.0).expect("positive");
    let window = Window::new(NonZeroU64::MIN, Duration::from_secs(1));
    let mut algs = vec![
        Algorithm::TokenBucket(Bucket::new(rate, nz32(5), nz32(1)).expect("cost <= burst")),
        Algorithm::LeakyBucket(Pace::new(rate, Some(Duration::from_secs(2))).expect("finite")),
        Algorithm::LeakyBucket(Pace::new(rate, None).expect("unbounded")),
        Algorithm::FixedWindow(window),
    ];
    if !fuzzed {
        return algs;
    }
    let fuzzed_rate = u
        .arbitrary::<f64>()
        .ok()
        .and_then(|r| Rate::per_second(r).ok());
    let fuzzed_delay = u
        .arbitrary::<Option<(u64, u32)>>()
        .unwrap_or(None)
        .map(|(s, n)| Duration::new(s, n % 1_000_000_000));
    if let Some(pace) = fuzzed_rate.and_then(|r| Pace::new(r, fuzzed_delay).ok()) {
        algs.push(Algorithm::LeakyBucket(pace));
    }
    algs
}

/// A reply tree from fuzz data, at most `depth` levels deep (the redis parser allows 100).
fn value(u: &mut Unstructured<'_>, depth: u32) -> ArbResult<Value> {
    let max_kind = if depth == 0 { 8 } else { 12 };
    let items = |u: &mut Unstructured<'_>| -> ArbResult<Vec<Value>> {
        let n = u.int_in_range(0..=5u8)?;
        (0..n).map(|_| value(u, depth - 1)).collect()
    };
    Ok(match u.int_in_range(0..=max_kind)? {
        0 => Value::Nil,
        1 => Value::Okay,
        2 | 3 => Value::Int(u.arbitrary()?),
        4 => {
            let (ms, frac): (u64, u16) = u.arbitrary()?;
            Value::BulkString(format!("{ms}.{:03}", frac % 1000).into_bytes())
        }
        5 => Value::BulkString(u.arbitrary()?),
        6 => Value::SimpleString(u.arbitrary()?),
        7 => Value::Double(u.arbitrary()?),
        8 => Value::Boolean(u.arbitrary()?),
        9 | 10 => Value::Array(items(u)?),
        11 => Value::Set(items(u)?),
        _ => {
            let keys = items(u)?;
            Value::Map(keys.into_iter().map(|k| (k, Value::Nil)).collect())
        }
    })
}

/// The first byte picks a mode: RESP bytes through the redis parser, a reply tree, or one of
/// the documented shapes, which must decode exactly.
pub fn check_reply(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut u = Unstructured::new(rest);
    // RESP bytes come first, unchanged, so that seeds are readable (`\0*2\r\n:1\r\n...`).
    let resp = mode % 3 == 0;
    let algs = algorithms(&mut u, !resp);
    match mode % 3 {
        0 => {
            // redis-rs's reply, made the store's own as at the redis-rs boundary
            if let Ok(v) = redis::parse_redis_value(rest) {
                let v = Own::from(v);
                algs.iter().for_each(|a| drop(decode(a, &v)));
            }
            // the store's own parser: a reply it reads is what redis-rs reads from those bytes
            if let Ok(Some((v, used))) = parse_reply(rest) {
                assert!(used <= rest.len());
                let theirs = redis::parse_redis_value(&rest[..used]).map(Own::from);
                assert_eq!(Ok(&v), theirs.as_ref().map_err(|_| ()), "{rest:?}");
                algs.iter().for_each(|a| drop(decode(a, &v)));
            }
        }
        1 => {
            if let Ok(v) = value(&mut u, 4) {
                let v = Own::from(v);
                algs.iter().for_each(|a| drop(decode(a, &v)));
            }
        }
        _ => check_reply_shapes(&algs, &mut u),
    }
}

fn check_reply_shapes(algs: &[Algorithm], u: &mut Unstructured<'_>) {
    let Ok((allowed, figures, delay_us)) = u.arbitrary::<(bool, [u64; 3], u64)>() else {
        return;
    };
    let [remaining, retry, reset] = figures.map(|n| n >> 1); // non-negative as an i64
    let int = |n: u64| Value::Int(i64::try_from(n).expect("shifted into range"));
    let counted = Own::from(Value::Array(vec![
        int(allowed.into()),
        int(remaining),
        int(retry),
        int(reset),
    ]));
    let delay_us = delay_us / 1000; // whole milliseconds fit in u64 microseconds
    let paced = Own::from(Value::Array(vec![
        int(allowed.into()),
        Value::BulkString(format!("{}.{:03}", delay_us / 1000, delay_us % 1000).into_bytes()),
    ]));
    for alg in algs {
        match alg {
            Algorithm::LeakyBucket(p) => {
                let expected =
                    Decision::paced(allowed, delay_us, p.rate.interval_ms(), p.max_delay_ms);
                assert_eq!(decode(alg, &paced).ok(), Some(expected));
                assert!(decode(alg, &counted).is_err());
            }
            _ => {
                let expected = Decision::counted(allowed, remaining, retry, reset);
                assert_eq!(decode(alg, &counted).ok(), Some(expected));
                assert!(decode(alg, &paced).is_err());
            }
        }
    }
}

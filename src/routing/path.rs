//! Request-path normalisation: the one form of a path that routes are matched against and that
//! is forwarded, so that `/v1/../admin` cannot borrow `/v1`'s rules.
//!
//! Owns [`normalize_path`], [`PathPolicy`] (how encoded slashes and `;parameters` are read),
//! [`PathError`] and [`strip_prefix`]. It knows a route's path condition only to strip a prefix. The query is not
//! part of the input: the caller splits it off first.
//!
//! Many upstreams read a path more loosely than RFC 3986 does. Python's WSGI servers, Go's
//! `r.URL.Path` and Node's decoders turn `%2F` into `/`; Windows servers take `\` for `/`; Tomcat
//! and Spring drop `;parameters` from each segment. A route must see the path the way the
//! upstream will, or `/api%2Fusers` and `/api;x/users` slip past the limits of `/api`.
//! [`PathPolicy::read`] gives the path to match and the path to forward.

use std::borrow::Cow;

use super::PathMatch;

/// Why a request path cannot be routed; the proxy answers 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path does not begin with `/`; this includes the `*` of `OPTIONS *` and the empty path.
    #[error("request path must start with '/'")]
    NotAbsolute,
    /// A `%` that is not followed by two hex digits.
    #[error("invalid percent-encoding at byte {at} of the request path")]
    BadEscape {
        /// byte offset of the `%` in the path
        at: usize,
    },
    /// An encoded NUL (`%00`): C-based servers end the path there, others keep it, so the
    /// path means different things to different upstreams (Envoy refuses it too).
    #[error("encoded NUL (%00) at byte {at} of the request path")]
    Nul {
        /// byte offset of the `%` in the path
        at: usize,
    },
    /// An encoded slash or backslash (`%2F`, `%5C`) or a raw `\`, refused by
    /// [`EscapedSlashes::Reject`].
    #[error("encoded slash or backslash at byte {at} of the request path")]
    EscapedSlash {
        /// byte offset of the `%` or `\` in the path
        at: usize,
    },
}

/// `paths.escaped_slashes`: what a path holding `%2F`, `%5C` or a raw `\` gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EscapedSlashes {
    /// 400: the path means different things to different upstreams.
    #[default]
    Reject,
    /// Read each one as `/`, then normalise; the decoded path is matched and forwarded.
    Decode,
    /// Keep it as data inside its segment, as RFC 3986 says. Unsafe in front of an upstream
    /// that decodes it: `/api%2Fusers` then matches `/` but is served as `/api/users`.
    Keep,
}

/// `paths.segment_params`: whether `;parameters` of a segment count when routes are matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SegmentParams {
    /// Match `/api;x/users` as `/api/users`, and read `..;x` as `..`, as Tomcat and Spring do.
    /// An escaped `%3B` starts parameters too. The forwarded path keeps the parameters.
    #[default]
    Ignore,
    /// A `;` is an ordinary character of its segment.
    Keep,
}

/// How request paths are read: the `paths` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathPolicy {
    /// `paths.escaped_slashes`
    pub escaped_slashes: EscapedSlashes,
    /// `paths.segment_params`
    pub segment_params: SegmentParams,
}

/// A request path read by a [`PathPolicy`]: what is forwarded, and what routes match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestPath<'a> {
    forwarded: Cow<'a, str>,
    /// The matched form when it differs from `forwarded`: the parameters dropped.
    matched: Option<String>,
}

impl<'a> RequestPath<'a> {
    /// The normal path that goes to the upstream.
    pub fn forwarded(&self) -> &str {
        &self.forwarded
    }

    /// The path routes are matched against and limits are keyed by: the forwarded one, without
    /// `;parameters` when they are ignored.
    pub fn matched(&self) -> &str {
        self.matched.as_deref().unwrap_or(&self.forwarded)
    }

    /// The forwarded path with `m`'s prefix removed, for `strip_prefix`: `/v1;x/y` becomes `/y`
    /// under `/v1`. `m` must match [`RequestPath::matched`], in any case (see
    /// [`strip_prefix`]).
    pub fn strip(&self, m: &PathMatch) -> Cow<'_, str> {
        let Some(matched) = &self.matched else {
            return strip_prefix(m, &self.forwarded);
        };
        let prefix = match m {
            PathMatch::Prefix(prefix) if m.matches_case(matched, false) => prefix,
            PathMatch::Exact(_) if m.matches_case(matched, false) => return Cow::Borrowed("/"),
            _ => return Cow::Borrowed(&self.forwarded),
        };
        // The forwarded path has the matched one's segments, each perhaps with parameters:
        // skip as many as the prefix has.
        let mut left = prefix.split('/').filter(|s| !s.is_empty()).count();
        let mut rest: &str = &self.forwarded;
        while left > 0 && !rest.is_empty() {
            rest = rest[1..].find('/').map_or("", |i| &rest[i + 1..]);
            left -= 1;
        }
        Cow::Borrowed(if rest.is_empty() { "/" } else { rest })
    }
}

impl PathPolicy {
    /// Reads a request path (without its query): normalises it, applies the settings, and
    /// returns the path to forward and the path to match.
    ///
    /// # Errors
    /// Those of [`normalize_path`], [`PathError::Nul`] for a `%00` whatever the settings, and
    /// [`PathError::EscapedSlash`] under [`EscapedSlashes::Reject`].
    pub fn read<'p>(&self, path: &'p str) -> Result<RequestPath<'p>, PathError> {
        if !path.starts_with('/') {
            return Err(PathError::NotAbsolute);
        }
        let Scan {
            slash_at,
            semicolon,
            nul_at,
        } = scan(path);
        if let Some(at) = nul_at {
            return Err(PathError::Nul { at });
        }
        let params = semicolon && self.segment_params == SegmentParams::Ignore;
        let forwarded = match (slash_at, self.escaped_slashes) {
            (Some(at), EscapedSlashes::Reject) => return Err(PathError::EscapedSlash { at }),
            (Some(_), EscapedSlashes::Decode) => {
                Cow::Owned(normalize(&decode_slashes(path), params)?.into_owned())
            }
            _ => normalize(path, params)?,
        };
        let matched = params.then(|| strip_params(&forwarded));
        Ok(RequestPath { forwarded, matched })
    }
}

/// What [`scan`] finds in a path.
struct Scan {
    /// the first encoded slash or backslash, or raw `\`
    slash_at: Option<usize>,
    /// a `;` or a `%3B`
    semicolon: bool,
    /// the first `%00`
    nul_at: Option<usize>,
}

fn scan(path: &str) -> Scan {
    let bytes = path.as_bytes();
    let mut found = Scan {
        slash_at: None,
        semicolon: false,
        nul_at: None,
    };
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b';' => found.semicolon = true,
            b'\\' => {
                found.slash_at.get_or_insert(i);
            }
            b'%' => match bytes.get(i + 1..i + 3) {
                Some([b'2', b'f' | b'F'] | [b'5', b'c' | b'C']) => {
                    found.slash_at.get_or_insert(i);
                }
                Some([b'3', b'b' | b'B']) => found.semicolon = true,
                Some(b"00") => {
                    found.nul_at.get_or_insert(i);
                }
                _ => {}
            },
            _ => {}
        }
    }
    found
}

/// `path` with every `%2F`, `%5C` and `\` written as `/`.
fn decode_slashes(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(i) = rest.find(['%', '\\']) {
        out.push_str(&rest[..i]);
        let escape = rest.get(i..i + 3).map(str::to_ascii_uppercase);
        if rest.as_bytes()[i] == b'\\' {
            out.push('/');
            rest = &rest[i + 1..];
        } else if matches!(escape.as_deref(), Some("%2F" | "%5C")) {
            out.push('/');
            rest = &rest[i + 3..];
        } else {
            out.push('%');
            rest = &rest[i + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// A segment without its `;parameters`. They begin at a `;` or at its escape `%3B`: an
/// upstream that decodes before it drops them reads `%3B` as `;`.
fn segment_name(segment: &str) -> &str {
    let bytes = segment.as_bytes();
    let end = (0..bytes.len()).find(|&i| match bytes[i] {
        b';' => true,
        b'%' => matches!(bytes.get(i + 1..i + 3), Some([b'3', b'b' | b'B'])),
        _ => false,
    });
    &segment[..end.unwrap_or(segment.len())]
}

/// The matched form of a path that `normalize(_, true)` made: each segment without its
/// parameters.
fn strip_params(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for segment in path[1..].split('/') {
        out.push('/');
        out.push_str(segment_name(segment));
    }
    out
}

/// Normalises a request path (without its query) for routing and forwarding.
///
/// * escapes of unreserved characters (ALPHA, DIGIT, `-`, `.`, `_`, `~`; RFC 3986 §2.3) are
///   decoded, every other escape is kept with its hex in uppercase (`%2f` becomes `%2F`, so
///   `/v1%2F..` stays one segment);
/// * `.` and `..` segments are resolved (RFC 3986 §5.2.4; `..` above the root stays at the root),
///   after decoding, so `/v1/%2e%2e/admin` becomes `/admin`;
/// * repeated `/` are folded into one; a trailing `/` is kept;
/// * anything else is left as it is (the HTTP parser has already refused what a path may not
///   contain).
///
/// Returns the input borrowed when it is already normal, which is the common case.
///
/// # Errors
/// [`PathError::NotAbsolute`] when the path does not start with `/`,
/// [`PathError::BadEscape`] for a `%` not followed by two hex digits.
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    normalize(path, false)
}

/// [`normalize_path`] of a path that starts with `/`. With `params`, a segment is judged by
/// its name before any `;`, as Tomcat reads it: `..;x` is `..`, and `;x` alone is empty. The
/// result is then the normal form of the path without its parameters, with each kept
/// segment's parameters still on it.
fn normalize(path: &str, params: bool) -> Result<Cow<'_, str>, PathError> {
    if is_normal(path, params)? {
        Ok(Cow::Borrowed(path))
    } else {
        rebuild(path, params).map(Cow::Owned)
    }
}

/// Whether `path` (starting with `/`) is its own normal form. May answer `Ok(false)` before it
/// has validated every escape: [`rebuild`] validates them all.
fn is_normal(path: &str, params: bool) -> Result<bool, PathError> {
    let mut segments = path[1..].split('/').peekable();
    let mut offset = 1;
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        let name = if params {
            segment_name(segment)
        } else {
            segment
        };
        // An empty segment is a repeated `/`, except the last one: a trailing slash. With
        // `params`, a segment of parameters alone counts as empty, and goes.
        if (segment.is_empty() && !last)
            || (name.is_empty() && !segment.is_empty())
            || name == "."
            || name == ".."
        {
            return Ok(false);
        }
        if !escapes_are_normal(segment, offset)? {
            return Ok(false);
        }
        offset += segment.len() + 1;
    }
    Ok(true)
}

/// Whether every escape of `segment` is kept as it is: not an unreserved character, uppercase hex.
fn escapes_are_normal(segment: &str, offset: usize) -> Result<bool, PathError> {
    let mut pieces = segment.split('%');
    let mut at = offset + pieces.next().map_or(0, str::len);
    for piece in pieces {
        let (hi, lo) = escape_digits(piece, at)?;
        let bytes = piece.as_bytes();
        if is_unreserved(hi << 4 | lo)
            || bytes[0].is_ascii_lowercase()
            || bytes[1].is_ascii_lowercase()
        {
            return Ok(false);
        }
        at += 1 + piece.len();
    }
    Ok(true)
}

/// Builds the normal form of a path that [`is_normal`] rejected.
fn rebuild(path: &str, params: bool) -> Result<String, PathError> {
    let mut out = String::with_capacity(path.len());
    let mut offset = 1;
    let mut trailing_slash = false;
    for segment in path[1..].split('/') {
        let start = out.len();
        out.push('/');
        decode_segment(segment, offset, &mut out)?;
        offset += segment.len() + 1;
        // Dot segments are recognised after decoding, so `%2e%2e` is `..` (RFC 3986 §2.3, §5.2.4).
        let written = &out[start + 1..];
        let name = if params {
            segment_name(written)
        } else {
            written
        };
        let up = name == "..";
        trailing_slash = name.is_empty() || up || name == ".";
        if up {
            out.truncate(start);
            let parent = out.rfind('/').unwrap_or(0);
            out.truncate(parent);
        } else if trailing_slash {
            out.truncate(start);
        }
    }
    // A path ending in `/`, `/.` or `/..` names a directory: keep its trailing slash.
    if trailing_slash || out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// Appends `segment` to `out` with unreserved escapes decoded and the others in uppercase.
fn decode_segment(segment: &str, offset: usize, out: &mut String) -> Result<(), PathError> {
    let mut pieces = segment.split('%');
    let first = pieces.next().unwrap_or("");
    out.push_str(first);
    let mut at = offset + first.len();
    for piece in pieces {
        let (hi, lo) = escape_digits(piece, at)?;
        let byte = hi << 4 | lo;
        if is_unreserved(byte) {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX_UPPER[usize::from(hi)]));
            out.push(char::from(HEX_UPPER[usize::from(lo)]));
        }
        // Both digits are ASCII, so byte 2 is a char boundary.
        out.push_str(&piece[2..]);
        at += 1 + piece.len();
    }
    Ok(())
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// The two hex digits that start `piece` (the text after a `%` found at byte `at`).
fn escape_digits(piece: &str, at: usize) -> Result<(u8, u8), PathError> {
    let bytes = piece.as_bytes();
    match (
        bytes.first().copied().and_then(hex_value),
        bytes.get(1).copied().and_then(hex_value),
    ) {
        (Some(hi), Some(lo)) => Ok((hi, lo)),
        _ => Err(PathError::BadEscape { at }),
    }
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// RFC 3986 §2.3: `ALPHA / DIGIT / "-" / "." / "_" / "~"`.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// The path to forward when a route has `strip_prefix`: `/v1/x` becomes `/x` and `/v1` becomes
/// `/` under `Prefix("/v1")`. An `Exact` path strips to `/`; `Any` and a path that the match does
/// not cover are returned unchanged. Never allocates.
///
/// The prefix is compared without regard to ASCII case: the route matched the path already, and
/// one with `case_sensitive: false` strips `/V1/x` to `/x` too.
pub fn strip_prefix<'a>(m: &PathMatch, path: &'a str) -> Cow<'a, str> {
    let prefix = match m {
        PathMatch::Any => return Cow::Borrowed(path),
        PathMatch::Prefix(prefix) | PathMatch::Exact(prefix) => prefix,
    };
    if !m.matches_case(path, false) {
        return Cow::Borrowed(path);
    }
    // Keep the `/` that ends a prefix such as `/v1/`, so the rest still starts with one.
    let cut = prefix.strip_suffix('/').map_or(prefix.len(), str::len);
    match path.get(cut..) {
        Some(rest) if rest.starts_with('/') => Cow::Borrowed(rest),
        _ => Cow::Borrowed("/"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A `%00` anywhere gets [`PathError::Nul`] whatever the settings, before an encoded
    /// slash is looked at; other escapes starting with 0 do not.
    #[test]
    fn an_encoded_nul_is_refused() {
        let keep = PathPolicy {
            escaped_slashes: EscapedSlashes::Keep,
            segment_params: SegmentParams::Keep,
        };
        for policy in [PathPolicy::default(), keep] {
            for (path, at) in [("/api%00/users", 4), ("/%00", 1), ("/a/b%2F%00", 7)] {
                assert_eq!(policy.read(path), Err(PathError::Nul { at }), "{path}");
            }
            assert!(policy.read("/a%01%0A").is_ok());
        }
    }

    /// A case-insensitive route strips its prefix in any case.
    #[test]
    fn strip_prefix_ignores_case() {
        let v1 = PathMatch::Prefix("/v1".into());
        assert_eq!(strip_prefix(&v1, "/V1/x"), "/x");
        let read = PathPolicy::default().read("/V1;a/x").unwrap();
        assert_eq!(read.strip(&v1), "/x");
    }

    /// `strip_prefix` forwards `/v1/x` as `/x` and `/v1` as `/`, borrowing.
    #[test]
    fn strip_prefix_keeps_a_leading_slash() {
        let v1 = PathMatch::Prefix("/v1".into());
        assert_eq!(strip_prefix(&v1, "/v1/x"), "/x");
        assert_eq!(strip_prefix(&v1, "/v1"), "/");
        assert_eq!(strip_prefix(&v1, "/v1/"), "/");
        assert_eq!(
            strip_prefix(&PathMatch::Prefix("/v1/".into()), "/v1/x/y"),
            "/x/y"
        );
        assert_eq!(strip_prefix(&PathMatch::Prefix("/".into()), "/x"), "/x");
        assert_eq!(strip_prefix(&PathMatch::Any, "/x"), "/x");
        assert_eq!(
            strip_prefix(&PathMatch::Exact("/health".into()), "/health"),
            "/"
        );
        assert_eq!(strip_prefix(&v1, "/v1x"), "/v1x");
    }

    fn norm(path: &str) -> String {
        normalize_path(path).expect("valid path").into_owned()
    }

    /// Dot segments are resolved, so a path cannot climb out of a prefix it names.
    #[test]
    fn resolves_dot_segments() {
        assert_eq!(norm("/v1/../admin"), "/admin");
        assert_eq!(norm("/v1/./x"), "/v1/x");
        assert_eq!(norm("/v1/a/b/../../c"), "/v1/c");
        assert_eq!(norm("/a/b/.."), "/a/");
        assert_eq!(norm("/v1/."), "/v1/");
        assert_eq!(norm("/v1/.."), "/");
    }

    /// `..` above the root stays at the root.
    #[test]
    fn dot_dot_above_root_stays_at_root() {
        assert_eq!(norm("/.."), "/");
        assert_eq!(norm("/../../etc/passwd"), "/etc/passwd");
        assert_eq!(norm("/a/../../b"), "/b");
    }

    /// Repeated slashes fold into one; a trailing slash is kept.
    #[test]
    fn folds_repeated_slashes() {
        assert_eq!(norm("//v1//x"), "/v1/x");
        assert_eq!(norm("///"), "/");
        assert_eq!(norm("/v1//"), "/v1/");
        assert_eq!(norm("/a//.."), "/");
    }

    /// Encoded dots are dot segments too: `/v1/%2e%2e/admin` is `/admin`.
    #[test]
    fn encoded_dot_segments_are_resolved() {
        assert_eq!(norm("/v1/%2e%2e/admin"), "/admin");
        assert_eq!(norm("/v1/%2E./admin"), "/admin");
        assert_eq!(norm("/v1/%2e/x"), "/v1/x");
        assert_eq!(norm("/v1/.%2e."), "/v1/...");
    }

    /// Unreserved escapes are decoded: `%41` is `A`, `%7e` is `~`.
    #[test]
    fn decodes_unreserved_escapes() {
        assert_eq!(norm("/%41"), "/A");
        assert_eq!(norm("/%7e"), "/~");
        assert_eq!(norm("/%7E%2d%5F%30"), "/~-_0");
    }

    /// Reserved escapes stay encoded with uppercase hex; `%2F` does not split a segment.
    #[test]
    fn keeps_reserved_escapes_in_uppercase() {
        assert_eq!(norm("/v1/a%2fb"), "/v1/a%2Fb");
        assert_eq!(norm("/v1%2F.."), "/v1%2F..");
        assert_eq!(norm("/v1%2F../admin"), "/v1%2F../admin");
        assert_eq!(norm("/%3a%20%25"), "/%3A%20%25");
    }

    /// An already normal path comes back borrowed, without allocating.
    #[test]
    fn normal_path_is_borrowed() {
        for path in [
            "/",
            "/v1",
            "/v1/",
            "/v1/x%2F%20y",
            "/a/.../b",
            "/.hidden/..x",
        ] {
            assert!(
                matches!(normalize_path(path), Ok(Cow::Borrowed(p)) if p == path),
                "{path}"
            );
        }
    }

    /// Bad escapes and paths that do not start with `/` are errors (the proxy answers 400).
    #[test]
    fn rejects_bad_escapes_and_relative_paths() {
        assert_eq!(normalize_path("/%zz"), Err(PathError::BadEscape { at: 1 }));
        assert_eq!(normalize_path("/a/%4"), Err(PathError::BadEscape { at: 3 }));
        assert_eq!(normalize_path("/a%"), Err(PathError::BadEscape { at: 2 }));
        assert_eq!(
            normalize_path("//x/%g0"),
            Err(PathError::BadEscape { at: 4 })
        );
        assert_eq!(
            normalize_path("/%\u{e9}"),
            Err(PathError::BadEscape { at: 1 })
        );
        assert_eq!(normalize_path("*"), Err(PathError::NotAbsolute));
        assert_eq!(normalize_path(""), Err(PathError::NotAbsolute));
        assert_eq!(normalize_path("v1/x"), Err(PathError::NotAbsolute));
    }

    fn read(slashes: EscapedSlashes, params: SegmentParams, path: &str) -> (String, String) {
        let policy = PathPolicy {
            escaped_slashes: slashes,
            segment_params: params,
        };
        let read = policy.read(path).expect("readable");
        (read.forwarded().to_owned(), read.matched().to_owned())
    }

    fn by_default(path: &str) -> (String, String) {
        read(EscapedSlashes::Reject, SegmentParams::Ignore, path)
    }

    /// By default an encoded slash or backslash, or a raw backslash, is refused where it stands.
    #[test]
    fn escaped_slashes_are_refused_by_default() {
        for (path, at) in [
            ("/api%2Fusers", 4),
            ("/api%2fusers", 4),
            ("/a/b%5Cc", 4),
            ("/a/b%5cc", 4),
            ("/a\\b", 2),
            ("/x/..%2Fapi", 5),
        ] {
            assert_eq!(
                PathPolicy::default().read(path),
                Err(PathError::EscapedSlash { at }),
                "{path}"
            );
        }
        // an escaped `%` before `2F` is no slash
        assert_eq!(by_default("/a%252F").0, "/a%252F");
    }

    /// `decode` reads every encoded slash or backslash as `/`, then normalises.
    #[test]
    fn decode_reads_escaped_slashes_as_slashes() {
        let decode = |path| read(EscapedSlashes::Decode, SegmentParams::Ignore, path).0;
        assert_eq!(decode("/api%2Fusers"), "/api/users");
        assert_eq!(decode("/x/..%2fapi%5Cusers"), "/api/users");
        assert_eq!(decode("/api\\users"), "/api/users");
        assert_eq!(decode("/%2F%2Fapi%2f"), "/api/");
        let keep = read(EscapedSlashes::Keep, SegmentParams::Ignore, "/a%2fb");
        assert_eq!(keep, ("/a%2Fb".to_owned(), "/a%2Fb".to_owned()));
    }

    /// Parameters are left out of the matched path and kept in the forwarded one; a dot
    /// segment with parameters is a dot segment, and a segment of parameters alone goes.
    #[test]
    fn parameters_are_ignored_when_matching() {
        let cases = [
            ("/api;x/users", "/api;x/users", "/api/users"),
            ("/api;a=1;b=2/users;c", "/api;a=1;b=2/users;c", "/api/users"),
            ("/x/..;/api", "/api", "/api"),
            ("/x/.;y/../api;z", "/api;z", "/api"),
            ("/;x/api", "/api", "/api"),
            ("/api/;x", "/api/", "/api/"),
            ("/api%3bx/y", "/api%3Bx/y", "/api/y"),
            ("/x/%2e%2e;/api", "/api", "/api"),
        ];
        for (path, forwarded, matched) in cases {
            assert_eq!(
                by_default(path),
                (forwarded.to_owned(), matched.to_owned()),
                "{path}"
            );
        }
        let kept = read(EscapedSlashes::Reject, SegmentParams::Keep, "/x/..;/api;v");
        assert_eq!(kept, ("/x/..;/api;v".to_owned(), "/x/..;/api;v".to_owned()));
    }

    /// `strip_prefix` takes the prefix's segments off the forwarded path, parameters and all.
    #[test]
    fn strip_removes_the_prefix_segments_with_their_parameters() {
        let prefix = |p: &str| PathMatch::Prefix(p.to_owned());
        let policy = PathPolicy::default();
        for (path, m, stripped) in [
            ("/v1;a/x;b/y", prefix("/v1"), "/x;b/y"),
            ("/v1;a", prefix("/v1"), "/"),
            ("/v1/x;b", prefix("/v1/"), "/x;b"),
            ("/v1;a/x;b/y", prefix("/v1/x"), "/y"),
            ("/v1;a/x", prefix("/"), "/v1;a/x"),
            ("/v1;a/x", PathMatch::Any, "/v1;a/x"),
            ("/h;a", PathMatch::Exact("/h".to_owned()), "/"),
            ("/v1/x", prefix("/v1"), "/x"),
        ] {
            let read = policy.read(path).expect("readable");
            assert_eq!(read.strip(&m), stripped, "{path} under {m:?}");
        }
    }

    /// Valid paths made of what matters to normalisation: slashes, dots, escapes of all kinds.
    fn tricky_path() -> impl Strategy<Value = String> {
        "/(/|\\.|%2[eEfF]|%[4-7][0-9a-fA-F]|%[0-9a-fA-F]{2}|[a-zA-Z~_-]|\u{e9})*"
    }

    proptest! {
        /// Normalising twice changes nothing, and the second time borrows.
        #[test]
        fn normalize_is_idempotent(path in tricky_path()) {
            let once = normalize_path(&path);
            prop_assert!(once.is_ok(), "{path}: {once:?}");
            if let Ok(once) = once {
                let twice = normalize_path(&once);
                prop_assert!(matches!(&twice, Ok(Cow::Borrowed(p)) if *p == once), "{path} -> {once} -> {twice:?}");
            }
        }

        /// A path is copied only when its normal form differs from it.
        #[test]
        fn normalize_allocates_only_for_a_change(path in tricky_path()) {
            if let Ok(Cow::Owned(normal)) = normalize_path(&path) {
                prop_assert_ne!(normal, path);
            }
        }

        /// The normal form starts with `/` and has no dot segments and no empty segments.
        #[test]
        fn normal_form_has_no_dot_or_empty_segments(path in tricky_path()) {
            if let Ok(normal) = normalize_path(&path) {
                prop_assert!(normal.starts_with('/'));
                for bad in ["/./", "/../", "//"] {
                    prop_assert!(!normal.contains(bad), "{path} -> {normal}");
                }
                prop_assert!(!normal.ends_with("/.") && !normal.ends_with("/.."), "{path} -> {normal}");
                prop_assert!(!normal.to_ascii_lowercase().contains("%2e"), "{path} -> {normal}");
            }
        }

        /// Arbitrary input never panics.
        #[test]
        fn normalize_never_panics(path in any::<String>()) {
            let _ = normalize_path(&path);
            let _ = normalize_path(&format!("/{path}"));
        }
    }
}

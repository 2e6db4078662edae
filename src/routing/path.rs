//! Request-path normalisation: the one form of a path that routes are matched against and that
//! is forwarded, so that `/v1/../admin` cannot borrow `/v1`'s rules.
//!
//! Owns [`normalize_path`] and [`PathError`]; knows nothing of routes. The query is not part of
//! the input: the caller splits it off first.

use std::borrow::Cow;

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
    if is_normal(path)? {
        Ok(Cow::Borrowed(path))
    } else {
        rebuild(path).map(Cow::Owned)
    }
}

/// Whether `path` (starting with `/`) is its own normal form. May answer `Ok(false)` before it
/// has validated every escape: [`rebuild`] validates them all.
fn is_normal(path: &str) -> Result<bool, PathError> {
    let mut segments = path[1..].split('/').peekable();
    let mut offset = 1;
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        // An empty segment is a repeated `/`, except the last one: a trailing slash.
        if (segment.is_empty() && !last) || segment == "." || segment == ".." {
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
fn rebuild(path: &str) -> Result<String, PathError> {
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
        trailing_slash = matches!(written, "" | "." | "..");
        if written == ".." {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

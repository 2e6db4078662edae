//! Limiter keys: the client key a limit's `key` parts select from a request, and the storage key
//! `<prefix>:<route>:<limit>:<client key>` that the store sees.

use std::fmt::Write;
use std::net::IpAddr;

use http::{HeaderMap, HeaderValue};
use sha1_smol::Sha1;

use super::KeyPart;

/// Client keys longer than this many bytes are stored as their SHA-1 digest (40 hex digits).
pub const MAX_CLIENT_KEY_LEN: usize = 64;

/// Written before the client address when a `header:` or `query:` value is missing.
pub(super) const FALLBACK_MARK: &str = "%ip=";

/// What key parts are read from, borrowed from the request.
#[derive(Debug, Clone, Copy)]
pub struct KeyContext<'a> {
    /// The client address, as found by [`client_ip`](super::client_ip).
    pub ip: IpAddr,
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The raw query string, without the `?`.
    pub query: Option<&'a str>,
    /// `Host` or `:authority`, possibly with a port and in any case.
    pub host: Option<&'a str>,
    /// The normalised path.
    pub path: &'a str,
    /// The route's name.
    pub route: &'a str,
}

/// What a limit does when the header or query parameter of one of its key parts comes more
/// than once in a request (`duplicate_key`). Applications disagree on which one they read:
/// Django, PHP and Rails the last, Go's `Query().Get` and Flask the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DuplicateKey {
    /// refuse the request with 400: the limit cannot know which value the upstream reads
    #[default]
    Reject,
    /// key on the first value
    First,
    /// key on the last value
    Last,
}

/// The first of `parts` whose header or query parameter comes more than once in `ctx`'s
/// request: header lines are counted (two lines, not one line holding a comma), and query
/// parameters by decoded name, an empty one too (`?key=&key=a` has two).
pub fn repeated_part<'p>(parts: &'p [KeyPart], ctx: &KeyContext<'_>) -> Option<&'p KeyPart> {
    parts.iter().find(|part| match part {
        KeyPart::Header(name) => ctx.headers.get_all(name).iter().nth(1).is_some(),
        KeyPart::Query(name) => ctx
            .query
            .is_some_and(|q| query_values(q, name).nth(1).is_some()),
        _ => false,
    })
}

/// Appends the client key that `parts` select from `ctx` to `out` (which it does not clear).
///
/// The format is chosen so that distinct identities can never share a bucket:
/// * parts are joined by `|`;
/// * `ip` is the address as text (`192.0.2.7`, `2001:db8::1`);
/// * every other value (header, decoded query parameter, host, path, route) is written as is,
///   except that bytes outside visible ASCII and the bytes `%`, `|`, `{` and `}` are escaped as
///   `%XX` (uppercase hex), so typical API keys and tenant names appear unchanged, a value cannot
///   forge a `|`, and no client picks its keys' Redis Cluster slot with a `{hash tag}`;
/// * a missing or empty `header:` / `query:` value falls back to the client address, written
///   `%ip=ADDR`. Its `%` is not followed by two hex digits, which no escaped value can contain, so
///   a client cannot send `x-api-key: 192.0.2.7` (or `ip=192.0.2.7`) to drain the bucket of the
///   key-less client at that address.
///
/// Per part:
/// * `header:NAME` takes the header's first line; `query:NAME` the first parameter whose
///   decoded name is NAME, its value decoded as a form value (`%XX` and `+` for space); with
///   [`DuplicateKey::Last`] both take the last one instead. Missing or empty, either falls back
///   to `%ip=ADDR`.
/// * `host` is lowercase without port, brackets or trailing dot; no host writes nothing, so
///   host-less requests share one bucket.
/// * An empty `parts` writes nothing: one bucket for every client.
pub fn client_key(parts: &[KeyPart], pick: DuplicateKey, ctx: &KeyContext<'_>, out: &mut String) {
    let last = pick == DuplicateKey::Last;
    for (index, part) in parts.iter().enumerate() {
        if index > 0 {
            out.push('|');
        }
        match part {
            KeyPart::Ip => push_ip(out, ctx.ip),
            KeyPart::Header(name) => {
                let mut lines = ctx.headers.get_all(name).iter();
                let line = if last {
                    lines.next_back()
                } else {
                    lines.next()
                };
                match line.map(HeaderValue::as_bytes) {
                    Some(value) if !value.is_empty() => escape_key_value(value, out),
                    _ => push_fallback(out, ctx.ip),
                }
            }
            KeyPart::Query(name) => match ctx.query.and_then(|q| {
                let mut values = query_values(q, name);
                if last {
                    values.last()
                } else {
                    values.next()
                }
            }) {
                Some(value) if !value.is_empty() => push_escaped(out, form_decoded(value)),
                _ => push_fallback(out, ctx.ip),
            },
            KeyPart::Host => {
                let host = crate::host::name(ctx.host.unwrap_or(""));
                push_escaped(out, host.bytes().map(|b| b.to_ascii_lowercase()));
            }
            KeyPart::Path => escape_key_value(ctx.path.as_bytes(), out),
            KeyPart::Route => escape_key_value(ctx.route.as_bytes(), out),
        }
    }
}

/// The client key [`client_key`] builds for the request an override names: `written` is the
/// values of `parts` as a request carries them, joined by `|` when there are several (`ip`
/// as an address in any notation, `host` in any case, with or without a port; a header or a
/// query parameter as sent, decoded). An error says why no request has that key.
pub fn override_key(parts: &[KeyPart], written: &str) -> Result<String, String> {
    let values: Vec<&str> = if parts.len() > 1 {
        written.split('|').collect()
    } else {
        vec![written]
    };
    if values.len() != parts.len() {
        return Err(format!(
            "the key has {} parts: write their values joined by `|` (found {})",
            parts.len(),
            values.len()
        ));
    }
    let mut out = String::new();
    for (index, (part, value)) in parts.iter().zip(values).enumerate() {
        if index > 0 {
            out.push('|');
        }
        match part {
            KeyPart::Ip => match value.trim().parse::<IpAddr>() {
                Ok(ip) => push_ip(&mut out, ip.to_canonical()),
                Err(_) => return Err(format!("{value:?} is not an IP address (key part ip)")),
            },
            KeyPart::Header(_) | KeyPart::Query(_) if value.is_empty() => {
                return Err("an empty value: a request without one counts as its address".into())
            }
            KeyPart::Host => {
                let host = crate::host::name(value);
                push_escaped(&mut out, host.bytes().map(|b| b.to_ascii_lowercase()));
            }
            _ => escape_key_value(value.as_bytes(), &mut out),
        }
    }
    Ok(out)
}

/// Appends `value` escaped as [`client_key`] escapes each value.
pub fn escape_key_value(value: &[u8], out: &mut String) {
    match std::str::from_utf8(value) {
        Ok(text) if value.iter().all(|&b| is_key_safe(b)) => out.push_str(text),
        _ => push_escaped(out, value.iter().copied()),
    }
}

/// Appends what a store key has before its client part. The store key is
/// `<prefix>:<route>:<limit>:<client>` (an empty `prefix` is left out with its `:`): the proxy
/// writes the client key right after this, into the same buffer, looks the client up among the
/// limit's overrides, then calls [`shorten_client`].
pub fn push_key_head(out: &mut String, prefix: &str, route: &str, limit: &str) {
    if !prefix.is_empty() {
        out.push_str(prefix);
        out.push(':');
    }
    out.push_str(route);
    out.push(':');
    out.push_str(limit);
    out.push(':');
}

/// The length of what [`push_key_head`] appends: where the client part of a store key starts.
pub fn key_head_len(prefix: &str, route: &str, limit: &str) -> usize {
    let prefix = if prefix.is_empty() {
        0
    } else {
        prefix.len() + 1
    };
    prefix + route.len() + 1 + limit.len() + 1
}

/// Replaces the client part of store key `key` (from byte `start`) by its SHA-1 digest in
/// lowercase hex when it is longer than [`MAX_CLIENT_KEY_LEN`] bytes, so keys stay short
/// whatever clients send.
pub fn shorten_client(key: &mut String, start: usize) {
    if key.len() - start > MAX_CLIENT_KEY_LEN {
        let digest = Sha1::from(&key[start..]).digest();
        key.truncate(start);
        write!(key, "{digest}").expect("writing to a String cannot fail");
    }
}

/// Appends `ip` as text, as `Display` writes it. IPv4, the common case on every request, is
/// written digit by digit: the formatting machinery costs several times as much.
pub fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                if octet >= 100 {
                    out.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    out.push(char::from(b'0' + octet / 10 % 10));
                }
                out.push(char::from(b'0' + octet % 10));
            }
        }
        IpAddr::V6(_) => write!(out, "{ip}").expect("writing to a String cannot fail"),
    }
}

pub(super) fn push_fallback(out: &mut String, ip: IpAddr) {
    out.push_str(FALLBACK_MARK);
    push_ip(out, ip);
}

/// Visible ASCII except `%` (the escape), `|` (the part separator) and the braces of a Redis
/// Cluster hash tag: a client must not choose the slot (the node) its keys go to.
pub(super) fn is_key_safe(byte: u8) -> bool {
    byte.is_ascii_graphic() && !matches!(byte, b'%' | b'|' | b'{' | b'}')
}

fn push_escaped(out: &mut String, bytes: impl Iterator<Item = u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for byte in bytes {
        if is_key_safe(byte) {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
}

/// The raw values of the parameters named `name` (compared after decoding), in order; `""` for
/// a bare `?name`.
fn query_values<'q>(query: &'q str, name: &'q str) -> impl Iterator<Item = &'q str> + 'q {
    query.split('&').filter_map(move |pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        form_decoded(key).eq(name.bytes()).then_some(value)
    })
}

/// The bytes of a query component decoded as `application/x-www-form-urlencoded`: `+` is a
/// space, `%XX` a byte; a `%` without two hex digits stands for itself, as browsers read it.
fn form_decoded(text: &str) -> impl Iterator<Item = u8> + '_ {
    let mut rest = text.as_bytes();
    std::iter::from_fn(move || {
        let (&first, tail) = rest.split_first()?;
        rest = tail;
        Some(match first {
            b'+' => b' ',
            b'%' => match (
                tail.first().copied().and_then(hex_value),
                tail.get(1).copied().and_then(hex_value),
            ) {
                (Some(hi), Some(lo)) => {
                    rest = &tail[2..];
                    hi << 4 | lo
                }
                _ => b'%',
            },
            other => other,
        })
    })
}

pub(super) fn hex_value(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderName;
    use proptest::prelude::*;

    /// The digit-by-digit IPv4 text is exactly `Display`'s, for every octet value.
    #[test]
    fn push_ip_writes_what_display_writes() {
        for o in 0..=255u8 {
            for ip in [
                IpAddr::from([o, 0, 9, 10]),
                IpAddr::from([99, o, 100, 255]),
                IpAddr::from([1, 2, o, o]),
            ] {
                let mut out = String::from("x");
                push_ip(&mut out, ip);
                assert_eq!(out, format!("x{ip}"));
            }
        }
        let v6: IpAddr = "2001:db8::7".parse().unwrap();
        let mut out = String::new();
        push_ip(&mut out, v6);
        assert_eq!(out, "2001:db8::7");
    }

    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));

    fn key_with(
        parts: &[KeyPart],
        headers: &HeaderMap,
        query: Option<&str>,
        host: Option<&str>,
    ) -> String {
        let ctx = KeyContext {
            ip: IP,
            headers,
            query,
            host,
            path: "/v1/x",
            route: "api-v1",
        };
        let mut out = String::new();
        client_key(parts, DuplicateKey::First, &ctx, &mut out);
        out
    }

    fn key(parts: &[KeyPart]) -> String {
        key_with(parts, &HeaderMap::new(), None, None)
    }

    fn api_key() -> KeyPart {
        KeyPart::Header(HeaderName::from_static("x-api-key"))
    }

    fn headers(name: &'static str, values: &[&[u8]]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for value in values {
            map.append(
                name,
                HeaderValue::from_bytes(value).expect("valid header value"),
            );
        }
        map
    }

    /// `ip`, `path` and `route` write the address, normalised path and route name.
    #[test]
    fn simple_parts_write_their_values() {
        assert_eq!(key(&[KeyPart::Ip]), "192.0.2.7");
        assert_eq!(key(&[KeyPart::Path]), "/v1/x");
        assert_eq!(key(&[KeyPart::Route]), "api-v1");
        assert_eq!(key(&[]), "");
    }

    /// A present header is the key as sent; a missing or empty one falls back to `%ip=ADDR`.
    #[test]
    fn header_part_falls_back_to_marked_ip() {
        let present = headers("x-api-key", &[b"k-123", b"second"]);
        assert_eq!(key_with(&[api_key()], &present, None, None), "k-123");
        assert_eq!(key(&[api_key()]), "%ip=192.0.2.7");
        let empty = headers("x-api-key", &[b""]);
        assert_eq!(key_with(&[api_key()], &empty, None, None), "%ip=192.0.2.7");
    }

    /// A header value cannot impersonate the fallback key of a client without one.
    #[test]
    fn header_value_cannot_forge_the_fallback() {
        let fallback = key(&[api_key()]);
        for forged in [&b"192.0.2.7"[..], b"%ip=192.0.2.7", b"ip=192.0.2.7"] {
            let sent = headers("x-api-key", &[forged]);
            assert_ne!(key_with(&[api_key()], &sent, None, None), fallback);
        }
    }

    /// `|`, `%`, spaces and non-ASCII bytes are escaped, so parts cannot run into each other.
    #[test]
    fn separators_and_odd_bytes_are_escaped() {
        let sent = headers("x-api-key", &[b"a|b %\xff"]);
        assert_eq!(key_with(&[api_key()], &sent, None, None), "a%7Cb%20%25%FF");
        let two = [api_key(), KeyPart::Ip];
        assert_eq!(
            key_with(&two, &headers("x-api-key", &[b"a"]), None, None),
            "a|192.0.2.7"
        );
    }

    /// A value's braces are escaped: a `{hash tag}` would let a client choose the Redis Cluster
    /// slot, and so the node, of its keys.
    #[test]
    fn braces_are_escaped() {
        let sent = headers("x-api-key", &[b"{k1}x"]);
        assert_eq!(key_with(&[api_key()], &sent, None, None), "%7Bk1%7Dx");
    }

    /// An override names a client as its request carries the key's values; its key is the one
    /// built from such a request: spaces, `%`, `|`, braces and non-ASCII escaped alike, an
    /// address in any notation, a host in any case or with a port, several parts joined by `|`.
    #[test]
    fn override_keys_are_the_keys_of_their_requests() {
        let same = |parts: &[KeyPart], written: &str, sent: HeaderMap, query, host| {
            assert_eq!(
                override_key(parts, written).unwrap(),
                key_with(parts, &sent, query, host),
                "{written:?}"
            );
        };
        let none = HeaderMap::new;
        let sent = |value: &str| headers("x-api-key", &[value.as_bytes()]);
        same(&[api_key()], "a b|c%{d}", sent("a b|c%{d}"), None, None);
        same(&[api_key()], "h\u{e9}llo", sent("h\u{e9}llo"), None, None);
        let query = [KeyPart::Query("k".into())];
        same(&query, "a b", none(), Some("k=a+b"), None);
        let host = Some("api.example.COM");
        same(&[KeyPart::Host], "API.Example.com:8443", none(), None, host);
        let two = [KeyPart::Ip, api_key()];
        same(&two, "192.0.2.7|gold", sent("gold"), None, None);
        same(&[KeyPart::Ip], " 192.0.2.7", none(), None, None);
        let v6 = |ip: &str| override_key(&[KeyPart::Ip], ip).unwrap();
        assert_eq!(v6("2001:DB8:0::1"), "2001:db8::1");
        assert_eq!(v6("::ffff:192.0.2.7"), "192.0.2.7");
        assert!(override_key(&[KeyPart::Ip], "gold").is_err());
        assert!(override_key(&[KeyPart::Ip, api_key()], "192.0.2.7").is_err());
        assert!(override_key(&[api_key()], "").is_err());
    }

    /// Query values are form-decoded (then escaped); names match after decoding; missing falls back.
    #[test]
    fn query_part_is_decoded() {
        let q = KeyPart::Query("api_key".into());
        let with = |query| {
            key_with(
                std::slice::from_ref(&q),
                &HeaderMap::new(),
                Some(query),
                None,
            )
        };
        assert_eq!(with("a=1&api_key=abc%2Dx"), "abc-x");
        assert_eq!(
            with("api%5Fkey=hello+world%21&api_key=second"),
            "hello%20world!"
        );
        assert_eq!(with("api_key=100%"), "100%25");
        assert_eq!(with("api_keyx=1"), "%ip=192.0.2.7");
        assert_eq!(with("api_key="), "%ip=192.0.2.7");
        assert_eq!(with("api_key"), "%ip=192.0.2.7");
        assert_eq!(key(&[q]), "%ip=192.0.2.7");
    }

    /// A part repeats when its header has two lines (a comma does not count) or its parameter
    /// comes twice by decoded name, empty or bare too; `Last` keys on the last occurrence.
    #[test]
    fn repeats_are_found_and_last_keys_on_the_last() {
        let q = KeyPart::Query("key".into());
        let parts = [KeyPart::Ip, api_key(), q.clone()];
        let ctx = |headers, query| KeyContext {
            ip: IP,
            headers,
            query,
            host: None,
            path: "/",
            route: "r",
        };
        let one = headers("x-api-key", &[b"a, b"]);
        let two = headers("x-api-key", &[b"a", b"b"]);
        assert_eq!(
            repeated_part(&parts, &ctx(&one, Some("key=1&x=2&x=3"))),
            None
        );
        assert_eq!(repeated_part(&parts, &ctx(&two, None)), Some(&api_key()));
        for query in ["key=1&k%65y=2", "key=&key=2", "key&key", "key=1&a=b&key=1"] {
            assert_eq!(
                repeated_part(&parts, &ctx(&one, Some(query))),
                Some(&q),
                "{query}"
            );
        }
        let mut out = String::new();
        client_key(
            &parts[1..],
            DuplicateKey::Last,
            &ctx(&two, Some("key=1&key=2")),
            &mut out,
        );
        assert_eq!(out, "b|2");
    }

    /// The host is lowercase without port; IPv6 hosts lose brackets and port.
    #[test]
    fn host_part_is_lowercase_without_port() {
        let host = |h| key_with(&[KeyPart::Host], &HeaderMap::new(), None, h);
        assert_eq!(host(Some("API.Example.com:8443")), "api.example.com");
        assert_eq!(host(Some("api.example.com.")), "api.example.com");
        assert_eq!(host(Some("[2001:DB8::1]:443")), "2001:db8::1");
        assert_eq!(host(None), "");
    }

    /// Appending keeps what `out` already holds.
    #[test]
    fn client_key_appends() {
        let ctx = KeyContext {
            ip: IP,
            headers: &HeaderMap::new(),
            query: None,
            host: None,
            path: "/",
            route: "r",
        };
        let mut out = String::from("x:");
        client_key(&[KeyPart::Ip], DuplicateKey::First, &ctx, &mut out);
        assert_eq!(out, "x:192.0.2.7");
    }

    /// A store key as the proxy writes it: the head, the client, the client shortened.
    fn storage_key(prefix: &str, route: &str, limit: &str, client: &str) -> String {
        let mut key = String::new();
        push_key_head(&mut key, prefix, route, limit);
        let start = key.len();
        key.push_str(client);
        shorten_client(&mut key, start);
        key
    }

    /// Storage keys are `<prefix>:<route>:<limit>:<client>`; up to 64 bytes the client is kept.
    #[test]
    fn storage_key_layout() {
        assert_eq!(
            storage_key("tollgate", "api", "per-client", "192.0.2.7"),
            "tollgate:api:per-client:192.0.2.7"
        );
        assert_eq!(storage_key("", "api", "l", "c"), "api:l:c");
        let exactly = "b".repeat(MAX_CLIENT_KEY_LEN);
        assert_eq!(
            storage_key("p", "r", "l", &exactly),
            format!("p:r:l:{exactly}")
        );
    }

    /// A client key over 64 bytes becomes its lowercase hex SHA-1 (checked against `sha1sum`).
    #[test]
    fn long_client_key_is_hashed() {
        let long = "a".repeat(65);
        assert_eq!(
            storage_key("p", "r", "l", &long),
            "p:r:l:11655326c708d70319be2610e8a57d9a5b959d3b"
        );
    }

    proptest! {
        /// Distinct header values give distinct keys, none equal to the fallback.
        #[test]
        fn header_keys_are_distinct_and_never_the_fallback(
            a in proptest::collection::vec(0x20u8..=0xff, 1..24),
            b in proptest::collection::vec(0x20u8..=0xff, 1..24),
        ) {
            prop_assume!(a != b && a.iter().all(|&c| c != 0x7f) && b.iter().all(|&c| c != 0x7f));
            prop_assume!(HeaderValue::from_bytes(&a).is_ok() && HeaderValue::from_bytes(&b).is_ok());
            let ka = key_with(&[api_key()], &headers("x-api-key", &[&a]), None, None);
            let kb = key_with(&[api_key()], &headers("x-api-key", &[&b]), None, None);
            prop_assert_ne!(&ka, &kb);
            prop_assert_ne!(ka, key(&[api_key()]));
        }
    }
}

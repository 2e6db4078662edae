//! Limiter keys: the client key a limit's `key` parts select from a request, and the storage key
//! `<prefix>:<route>:<limit>:<client key>` that the store sees.

use std::borrow::Cow;
use std::fmt::Write;
use std::net::IpAddr;

use http::{HeaderMap, HeaderValue};
use sha1_smol::Sha1;

use super::KeyPart;

/// Client keys longer than this many bytes are stored as their SHA-1 digest (40 hex digits).
pub const MAX_CLIENT_KEY_LEN: usize = 64;

/// Written before the client address when a `header:` or `query:` value is missing.
const FALLBACK_MARK: &str = "%ip=";

/// Written before a digest (see [`shorten_client`]) in the form the console shows a client.
const DIGEST_MARK: &str = "%sha1=";

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
///   decoded name is NAME, its value decoded as a form value (`%XX` and `+` for space). Missing
///   or empty, either falls back to `%ip=ADDR`.
/// * `host` is lowercase without port, brackets or trailing dot; no host writes nothing, so
///   host-less requests share one bucket.
/// * An empty `parts` writes nothing: one bucket for every client.
pub fn client_key(parts: &[KeyPart], ctx: &KeyContext<'_>, out: &mut String) {
    for (index, part) in parts.iter().enumerate() {
        if index > 0 {
            out.push('|');
        }
        match part {
            KeyPart::Ip => push_ip(out, ctx.ip),
            KeyPart::Header(name) => match ctx.headers.get(name).map(HeaderValue::as_bytes) {
                Some(value) if !value.is_empty() => escape_key_value(value, out),
                _ => push_fallback(out, ctx.ip),
            },
            KeyPart::Query(name) => match ctx.query.and_then(|q| query_value(q, name)) {
                Some(value) if !value.is_empty() => push_escaped(out, form_decoded(value)),
                _ => push_fallback(out, ctx.ip),
            },
            KeyPart::Host => {
                let host = host_name(ctx.host.unwrap_or(""));
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
                let host = host_name(value);
                push_escaped(&mut out, host.bytes().map(|b| b.to_ascii_lowercase()));
            }
            _ => escape_key_value(value.as_bytes(), &mut out),
        }
    }
    Ok(out)
}

/// A client as its store key holds it: what follows `<prefix>:<route>:<limit>:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredClient {
    /// The client key, or its SHA-1 digest in lowercase hex when the key is longer than
    /// [`MAX_CLIENT_KEY_LEN`] bytes.
    pub key: String,
    /// Whether `key` is a digest.
    pub hashed: bool,
}

impl StoredClient {
    /// Client key `key` as the store keeps it, shortened as [`shorten_client`] does.
    pub fn of(mut key: String) -> StoredClient {
        let hashed = key.len() > MAX_CLIENT_KEY_LEN;
        shorten_client(&mut key, 0);
        StoredClient { key, hashed }
    }

    /// The client's one written form: see [`shown_client`].
    pub fn shown(&self) -> Cow<'_, str> {
        shown_client(&self.key, self.hashed)
    }
}

/// The one written form of a client, which the console shows and [`named_client`] reads back:
/// the stored client key itself (its values escaped, so typical API keys appear unchanged), a
/// digest written `%sha1=HEX`. Like `%ip=`, that mark cannot start an escaped value, so a digest
/// is never taken for a client that sent 40 hex digits itself.
pub fn shown_client(stored: &str, hashed: bool) -> Cow<'_, str> {
    if hashed {
        Cow::Owned(format!("{DIGEST_MARK}{stored}"))
    } else {
        Cow::Borrowed(stored)
    }
}

/// Whether a stored client key may be a digest: 40 lowercase hex digits. Only the key it was
/// made from tells whether it is one, as a client may send such a value itself.
pub fn may_be_digest(stored: &str) -> bool {
    stored.len() == 40
        && stored
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The client an operator names, as the store keeps it. `named` is read in the form the
/// console shows ([`shown_client`]) when it is one for `parts`; otherwise as a request carries
/// the values, the way `overrides` name clients ([`override_key`]). So `%ip=192.0.2.7` is the
/// client that sent no value, and `a%7Cb` the one that sent `a|b`; a plain API key or an
/// address in any notation reads the same either way. An error says why `named` names no client.
pub fn named_client(parts: &[KeyPart], named: &str) -> Result<StoredClient, String> {
    if let Some(digest) = named.strip_prefix(DIGEST_MARK) {
        if !may_be_digest(digest) {
            return Err(format!(
                "`{DIGEST_MARK}` is followed by 40 lowercase hex digits (found {digest:?}); \
                 a client that sent `{DIGEST_MARK}...` itself is shown as `%25sha1=...`"
            ));
        }
        let key = digest.to_owned();
        return Ok(StoredClient { key, hashed: true });
    }
    match shown_key(parts, named)? {
        Some(key) => Ok(StoredClient::of(key)),
        None => override_key(parts, named).map(StoredClient::of),
    }
}

/// `named` read as a client key [`client_key`] writes for `parts`: `None` when it is not one.
/// An address is taken in any notation. A fallback that names no address is an error: read
/// as a value instead, it would name a client that sent `%ip=...` itself.
fn shown_key(parts: &[KeyPart], named: &str) -> Result<Option<String>, String> {
    if parts.is_empty() {
        return Ok(named.is_empty().then(String::new));
    }
    let pieces: Vec<&str> = named.split('|').collect();
    if pieces.len() != parts.len() {
        return Ok(None);
    }
    let mut out = String::with_capacity(named.len());
    for (index, (part, piece)) in parts.iter().zip(pieces).enumerate() {
        if index > 0 {
            out.push('|');
        }
        match (part, piece.strip_prefix(FALLBACK_MARK)) {
            (KeyPart::Ip, _) => match piece.parse::<IpAddr>() {
                Ok(ip) => push_ip(&mut out, ip.to_canonical()),
                Err(_) => return Ok(None),
            },
            (KeyPart::Header(_) | KeyPart::Query(_), Some(addr)) => {
                let Ok(ip) = addr.parse::<IpAddr>() else {
                    return Err(format!(
                        "{addr:?} is not an IP address: `{FALLBACK_MARK}ADDR` names a client \
                         that sent no value; one that sent `{FALLBACK_MARK}...` itself is shown \
                         as `%25ip=...`"
                    ));
                };
                push_fallback(&mut out, ip.to_canonical());
            }
            // only a request without a host writes an empty value
            (KeyPart::Host, _) if is_escaped(piece) && !has_uppercase(piece) => out.push_str(piece),
            (KeyPart::Host, _) => return Ok(None),
            _ if !piece.is_empty() && is_escaped(piece) => out.push_str(piece),
            _ => return Ok(None),
        }
    }
    Ok(Some(out))
}

/// Whether escaped value `text` holds an uppercase letter outside its `%XX` escapes: a host
/// is written in lowercase.
fn has_uppercase(text: &str) -> bool {
    text.split('%').enumerate().any(|(i, piece)| {
        piece
            .bytes()
            .skip(if i == 0 { 0 } else { 2 })
            .any(|b| b.is_ascii_uppercase())
    })
}

/// Whether `text` is a value as [`escape_key_value`] writes one: key-safe bytes, and `%XX` in
/// uppercase hex for exactly the bytes that are not.
fn is_escaped(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            if !is_key_safe(bytes[i]) {
                return false;
            }
            i += 1;
            continue;
        }
        let upper_hex = |b: &u8| matches!(b, b'0'..=b'9' | b'A'..=b'F');
        let escaped = match bytes.get(i + 1..i + 3) {
            Some(&[hi, lo]) if upper_hex(&hi) && upper_hex(&lo) => hex_value(hi)
                .zip(hex_value(lo))
                .map(|(hi, lo)| hi << 4 | lo),
            _ => None,
        };
        match escaped {
            Some(byte) if !is_key_safe(byte) => i += 3,
            _ => return false,
        }
    }
    true
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

fn push_fallback(out: &mut String, ip: IpAddr) {
    out.push_str(FALLBACK_MARK);
    push_ip(out, ip);
}

/// Visible ASCII except `%` (the escape), `|` (the part separator) and the braces of a Redis
/// Cluster hash tag: a client must not choose the slot (the node) its keys go to.
fn is_key_safe(byte: u8) -> bool {
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

/// The raw value of the first parameter named `name` (compared after decoding), `""` for a bare
/// `?name`.
fn query_value<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').find_map(|pair| {
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

fn hex_value(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// A `Host` value without port, IPv6 brackets or the trailing dot of an absolute name.
fn host_name(host: &str) -> &str {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split_once(']').map_or(host, |(inside, _port)| inside)
    } else {
        match host.rsplit_once(':') {
            // More than one `:` without brackets is a bare IPv6 address, not `host:port`.
            Some((name, port))
                if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) =>
            {
                name
            }
            _ => host,
        }
    };
    name.strip_suffix('.').unwrap_or(name)
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
        client_key(parts, &ctx, &mut out);
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
        client_key(&[KeyPart::Ip], &ctx, &mut out);
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

    /// The client an operator names, through the written form and the raw one.
    fn named(parts: &[KeyPart], written: &str) -> Result<String, String> {
        named_client(parts, written).map(|c| c.shown().into_owned())
    }

    /// The written form is the stored key: the fallback, escapes and `|` are read as the
    /// console shows them, and a value sent as `%ip=...` is a different client.
    #[test]
    fn shown_forms_name_the_clients_shown() {
        let one = [api_key()];
        assert_eq!(named(&one, "%ip=192.0.2.7").unwrap(), key(&one));
        assert_eq!(named(&one, "%ip=::ffff:192.0.2.7").unwrap(), key(&one));
        let forged = headers("x-api-key", &[b"%ip=192.0.2.7"]);
        let forger = key_with(&one, &forged, None, None);
        assert_eq!(forger, "%25ip=192.0.2.7");
        assert_eq!(named(&one, &forger).unwrap(), forger);
        assert_ne!(forger, key(&one));
        for shown in ["bad%FF%FEkey", "100%25", "a%7Cb", "a%20b", "k-123"] {
            assert_eq!(named(&one, shown).unwrap(), shown);
        }
        let two = [
            api_key(),
            KeyPart::Header(HeaderName::from_static("x-plan")),
        ];
        assert_eq!(
            named(&two, "a%7Cb|%ip=192.0.2.7").unwrap(),
            "a%7Cb|%ip=192.0.2.7"
        );
        let digest = "11655326c708d70319be2610e8a57d9a5b959d3b";
        let hashed = named_client(&two, &format!("%sha1={digest}")).unwrap();
        assert_eq!((hashed.key.as_str(), hashed.hashed), (digest, true));
        let own = named_client(&one, digest).unwrap();
        assert_eq!((own.key.as_str(), own.hashed), (digest, false));
    }

    /// What is not a written form is read as a request carries it, as `overrides` are: an
    /// address in any notation, a host in any case, a value with spaces, `|` in a one-part key.
    #[test]
    fn other_names_are_read_as_sent() {
        let one = [api_key()];
        assert_eq!(named(&one, "a b").unwrap(), "a%20b");
        assert_eq!(named(&one, "a|b").unwrap(), "a%7Cb");
        assert_eq!(named(&one, "caf\u{e9}").unwrap(), "caf%C3%A9");
        // not escapes as the console writes them: lowercase hex, an escaped safe byte
        assert_eq!(named(&one, "a%7cb").unwrap(), "a%257cb");
        assert_eq!(named(&one, "a%41").unwrap(), "a%2541");
        assert_eq!(
            named(&[KeyPart::Ip], "2001:DB8:0::1").unwrap(),
            "2001:db8::1"
        );
        assert_eq!(
            named(&[KeyPart::Host], "API.example.com:443").unwrap(),
            "api.example.com"
        );
        assert_eq!(
            named(&one, &"k".repeat(65)).unwrap(),
            format!("%sha1={}", shown_digest(&"k".repeat(65)))
        );
        assert!(named(&one, "%ip=nowhere").unwrap_err().contains("%25ip="));
        assert!(named(&one, "%sha1=abc")
            .unwrap_err()
            .contains("40 lowercase hex"));
        assert!(named(&one, "").is_err());
        assert!(named(&[KeyPart::Ip, api_key()], "192.0.2.7").is_err());
    }

    fn shown_digest(client: &str) -> String {
        let mut key = client.to_owned();
        shorten_client(&mut key, 0);
        key
    }

    /// A key part and what a request holds for it.
    fn any_part() -> impl Strategy<Value = (KeyPart, Option<Vec<u8>>)> {
        let value = proptest::option::of(proptest::collection::vec(
            prop_oneof![
                Just(b'%'),
                Just(b'|'),
                Just(b'a'),
                0x20u8..=0x7e,
                0x80u8..=0xff
            ],
            0..48,
        ));
        prop_oneof![
            Just((KeyPart::Ip, None)),
            Just((KeyPart::Path, None)),
            Just((KeyPart::Host, None)),
            value.clone().prop_map(|v| (KeyPart::Query("k".into()), v)),
            value
                .clone()
                .prop_map(|v| (KeyPart::Header(HeaderName::from_static("x-a")), v)),
            value.prop_map(|v| (KeyPart::Header(HeaderName::from_static("x-b")), v)),
        ]
    }

    proptest! {
        /// Every client key the console can show names back the client it was made from,
        /// hashed or not.
        #[test]
        fn shown_clients_name_themselves(
            parts in proptest::collection::vec(any_part(), 1..4),
            v6 in any::<bool>(),
            host in proptest::option::of("[a-zA-Z0-9.:%|{} \u{e9}-]{0,24}"),
        ) {
            let (mut sent, mut query) = (HeaderMap::new(), String::new());
            for (part, value) in &parts {
                match (part, value) {
                    (KeyPart::Header(name), Some(value)) => {
                        if let Ok(value) = HeaderValue::from_bytes(value) {
                            sent.insert(name.clone(), value);
                        }
                    }
                    (KeyPart::Query(name), Some(value)) => {
                        query.push_str(name);
                        query.push('=');
                        value.iter().for_each(|b| query.push_str(&format!("%{b:02x}")));
                        query.push('&');
                    }
                    _ => {}
                }
            }
            let parts: Vec<KeyPart> = parts.into_iter().map(|(p, _)| p).collect();
            let ip = if v6 { "2001:db8::7".parse().unwrap() } else { IP };
            let ctx = KeyContext {
                ip,
                headers: &sent,
                query: Some(&query),
                host: host.as_deref(),
                path: "/a b",
                route: "r",
            };
            let mut key = String::new();
            client_key(&parts, &ctx, &mut key);
            let stored = StoredClient::of(key);
            prop_assert_eq!(named_client(&parts, &stored.shown()), Ok(stored.clone()));
        }

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

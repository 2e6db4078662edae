//! Who sent the request, as tollgate tells the upstream: `X-Real-IP` (the client tollgate
//! identified, as nginx's `proxy_set_header X-Real-IP $remote_addr` behind `set_real_ip_from`)
//! and tollgate's own element of `Forwarded` (RFC 7239). A client's own values never reach the
//! upstream as tollgate's word: `X-Real-IP` is replaced, and `Forwarded` ends with the element
//! tollgate wrote.
//!
//! `X-Forwarded-*` stay in `forward`; this module only builds and sets these two.

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// Which of the two headers tollgate sets (`forwarded_headers`); off leaves the header as the
/// client sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdentityHeaders {
    /// replace `X-Real-IP` with the identified client
    pub x_real_ip: bool,
    /// append tollgate's element to `Forwarded`
    pub forwarded: bool,
}

impl Default for IdentityHeaders {
    fn default() -> IdentityHeaders {
        IdentityHeaders {
            x_real_ip: true,
            forwarded: true,
        }
    }
}

pub(super) static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// Sets `X-Real-IP` to `client`, replacing every line the client sent.
pub(super) fn set_real_ip(headers: &mut HeaderMap, client: HeaderValue) {
    headers.insert(X_REAL_IP.clone(), client);
}

/// Appends tollgate's element, `for=<peer>;proto=<proto>;host=<host>`, to `Forwarded`: the
/// lines there are joined with `", "` (RFC 7239 §4: one list, however many lines), so that an
/// upstream that reads one line sees every hop. `peer` is the TCP peer's address as text, as
/// `X-Forwarded-For` gets it (RFC 7239 §5.2: the hop tollgate heard, not the client it
/// believed). Built in one buffer: a request without `Forwarded` costs one allocation.
pub(super) fn append_forwarded(
    headers: &mut HeaderMap,
    peer: &HeaderValue,
    proto: &str,
    host: Option<&HeaderValue>,
) {
    let host = host.map(HeaderValue::as_bytes).filter(|h| !h.is_empty());
    let mut out = Vec::with_capacity(48 + host.map_or(0, <[u8]>::len));
    for line in headers.get_all(http::header::FORWARDED) {
        let line = line.as_bytes().trim_ascii();
        if !line.is_empty() {
            out.extend_from_slice(line);
            out.extend_from_slice(b", ");
        }
    }
    out.extend_from_slice(b"for=");
    let peer = peer.as_bytes();
    // an IPv6 address is written `"[2001:db8::1]"` (RFC 7239 §6): `:` is not a token character
    if peer.contains(&b':') {
        out.extend_from_slice(b"\"[");
        out.extend_from_slice(peer);
        out.extend_from_slice(b"]\"");
    } else {
        out.extend_from_slice(peer);
    }
    out.extend_from_slice(b";proto=");
    out.extend_from_slice(proto.as_bytes());
    if let Some(host) = host {
        out.extend_from_slice(b";host=");
        push_value(&mut out, host);
    }
    if let Ok(value) = HeaderValue::from_maybe_shared(bytes::Bytes::from(out)) {
        headers.insert(http::header::FORWARDED, value);
    }
}

/// A parameter's value: as it is when it is a token (RFC 9110 §5.6.2), else a quoted string
/// with `"` and `\` escaped (§5.6.4). `example.com` stays bare; `example.com:8080` and
/// `[::1]:8080` are quoted.
fn push_value(out: &mut Vec<u8>, value: &[u8]) {
    if value.iter().all(|&b| is_tchar(b)) {
        out.extend_from_slice(value);
        return;
    }
    out.push(b'"');
    for &b in value {
        if b == b'"' || b == b'\\' {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'"');
}

/// RFC 9110 §5.6.2 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forwarded(lines: &[&str], peer: &'static str, host: Option<&'static str>) -> Vec<String> {
        let mut h = HeaderMap::new();
        for line in lines {
            h.append(
                http::header::FORWARDED,
                HeaderValue::from_str(line).unwrap(),
            );
        }
        let host = host.map(HeaderValue::from_static);
        append_forwarded(
            &mut h,
            &HeaderValue::from_static(peer),
            "http",
            host.as_ref(),
        );
        h.get_all(http::header::FORWARDED)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }

    /// tollgate's element: the peer (IPv6 bracketed and quoted), the scheme, the host (quoted
    /// when it is not a token).
    #[test]
    fn writes_its_element_by_the_rfc() {
        assert_eq!(
            forwarded(&[], "192.0.2.7", Some("example.com")),
            ["for=192.0.2.7;proto=http;host=example.com"]
        );
        assert_eq!(
            forwarded(&[], "2001:db8::1", Some("example.com:8080")),
            [r#"for="[2001:db8::1]";proto=http;host="example.com:8080""#]
        );
        assert_eq!(
            forwarded(&[], "192.0.2.7", Some(r#"[::1]:80"#)),
            [r#"for=192.0.2.7;proto=http;host="[::1]:80""#]
        );
        assert_eq!(
            forwarded(&[], "192.0.2.7", Some(r#"a"b\c"#)),
            [r#"for=192.0.2.7;proto=http;host="a\"b\\c""#]
        );
        assert_eq!(
            forwarded(&[], "192.0.2.7", None),
            ["for=192.0.2.7;proto=http"]
        );
    }

    /// The client's elements stay, in order, on one line before tollgate's.
    #[test]
    fn keeps_the_elements_before_it() {
        assert_eq!(
            forwarded(
                &["for=1.2.3.4", " for=5.6.7.8;proto=https "],
                "10.0.0.1",
                None
            ),
            ["for=1.2.3.4, for=5.6.7.8;proto=https, for=10.0.0.1;proto=http"]
        );
        assert_eq!(
            forwarded(&[""], "10.0.0.1", None),
            ["for=10.0.0.1;proto=http"]
        );
    }

    /// `X-Real-IP` is one line: the address given.
    #[test]
    fn replaces_every_real_ip_line() {
        let mut h = HeaderMap::new();
        h.append(&X_REAL_IP, HeaderValue::from_static("1.2.3.4"));
        h.append(&X_REAL_IP, HeaderValue::from_static("5.6.7.8"));
        set_real_ip(&mut h, HeaderValue::from_static("192.0.2.7"));
        let all: Vec<_> = h.get_all(&X_REAL_IP).iter().collect();
        assert_eq!(all, ["192.0.2.7"]);
    }
}

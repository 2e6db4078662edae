//! The one written form of a client: what the console shows of a stored client key, and what
//! the operator API and `tollgate limits` read back ([`named_client`]), so every client shown can
//! be looked up and reset.

use std::borrow::Cow;
use std::net::IpAddr;

use super::key::{
    hex_value, is_key_safe, override_key, push_fallback, push_ip, shorten_client, FALLBACK_MARK,
    MAX_CLIENT_KEY_LEN,
};
use super::KeyPart;

/// Written before a digest (see [`shorten_client`]) in the form the console shows a client.
const DIGEST_MARK: &str = "%sha1=";

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

/// `named` read as a client key [`client_key`](super::client_key) writes for `parts`: `None` when it is not one.
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

/// Whether `text` is a value as [`escape_key_value`](super::escape_key_value) writes one: key-safe bytes, and `%XX` in
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{client_key, DuplicateKey, KeyContext};
    use http::{HeaderMap, HeaderName, HeaderValue};
    use proptest::prelude::*;

    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));

    fn api_key() -> KeyPart {
        KeyPart::Header(HeaderName::from_static("x-api-key"))
    }

    /// The client key of a request from [`IP`] that sends `x-api-key: value`, or none.
    fn sent_key(value: Option<&[u8]>) -> String {
        let mut headers = HeaderMap::new();
        if let Some(value) = value {
            let value = HeaderValue::from_bytes(value).expect("valid header value");
            headers.insert("x-api-key", value);
        }
        let ctx = KeyContext {
            ip: IP,
            headers: &headers,
            query: None,
            host: None,
            path: "/",
            route: "r",
        };
        let mut out = String::new();
        client_key(&[api_key()], DuplicateKey::Reject, &ctx, &mut out);
        out
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
        assert_eq!(named(&one, "%ip=192.0.2.7").unwrap(), sent_key(None));
        assert_eq!(named(&one, "%ip=::ffff:192.0.2.7").unwrap(), sent_key(None));
        let forger = sent_key(Some(b"%ip=192.0.2.7"));
        assert_eq!(forger, "%25ip=192.0.2.7");
        assert_eq!(named(&one, &forger).unwrap(), forger);
        assert_ne!(forger, sent_key(None));
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
            client_key(&parts, DuplicateKey::Reject, &ctx, &mut key);
            let stored = StoredClient::of(key);
            prop_assert_eq!(named_client(&parts, &stored.shown()), Ok(stored.clone()));
        }
    }
}

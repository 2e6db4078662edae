//! Client identity: who the client is (TCP peer, or the right-most untrusted X-Forwarded-For
//! address behind a trusted proxy), and the limiter key built from a request.
//!
//! Owns the trust decision for `X-Forwarded-For` ([`client_ip`]) and the key layout
//! ([`client_key`], [`push_key_head`], [`shorten_client`]); it does not add `X-Forwarded-For` to forwarded requests
//! (the proxy does) and does not know routes. Uses nothing else of the crate but `host`.
//!
//! Submodule `key`: key building. Submodule `written`: the written form of a client that the
//! console shows and the operator API reads back.

mod key;
mod written;

use std::net::{IpAddr, Ipv6Addr};

use http::{HeaderName, HeaderValue};
use ipnet::IpNet;

pub use key::{
    client_key, escape_key_value, key_head_len, override_key, push_ip, push_key_head,
    repeated_part, shorten_client, DuplicateKey, KeyContext, MAX_CLIENT_KEY_LEN,
};
pub use written::{may_be_digest, named_client, shown_client, StoredClient};

/// One part of a limit's `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// `ip`: the client address
    Ip,
    /// `header:NAME`; a missing header falls back to the client address
    Header(HeaderName),
    /// `query:NAME`; a missing parameter falls back to the client address
    Query(String),
    /// `host`: the request's host, lowercase, without port
    Host,
    /// `path`: the normalised path
    Path,
    /// `route`: the route's name (one bucket shared by every client of the route)
    Route,
}

/// As the config writes it: `ip`, `header:x-api-key`, `query:key`.
impl std::fmt::Display for KeyPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyPart::Ip => f.write_str("ip"),
            KeyPart::Header(name) => write!(f, "header:{name}"),
            KeyPart::Query(name) => write!(f, "query:{name}"),
            KeyPart::Host => f.write_str("host"),
            KeyPart::Path => f.write_str("path"),
            KeyPart::Route => f.write_str("route"),
        }
    }
}

/// Whether `ip` is one of the `trusted` proxies. An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`,
/// as a dual-stack socket reports IPv4 peers) counts as its IPv4 address.
pub fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
    let canonical = ip.to_canonical();
    trusted
        .iter()
        .any(|net| net.contains(&canonical) || net.contains(&ip))
}

/// The client's address: the TCP `peer`, unless the peer is a `trusted` proxy; then the
/// right-most `X-Forwarded-For` address that is not itself trusted.
///
/// `xff` is every `X-Forwarded-For` line in order (`headers.get_all(X_FORWARDED_FOR).iter()`);
/// the lines are read as one comma-separated list. From an untrusted peer the list is ignored, so
/// a client can never choose its identity. Behind a trusted peer the list is walked right to
/// left, skipping trusted addresses:
/// * the first untrusted address is the client;
/// * if every address is trusted, the left-most one is;
/// * an entry that does not parse (`unknown`, garbage) stops the walk: the trusted address just
///   to its right is the client, or the peer when there is none.
///
/// Entries may be IPv4 or IPv6, with a port (`1.2.3.4:5678`, `[2001:db8::1]:443`); empty list
/// elements are skipped (RFC 9110 §5.6.1). The answer is canonical: `::ffff:1.2.3.4` is returned
/// as `1.2.3.4`, for the peer too, so that one client has one key.
pub fn client_ip<'a>(
    peer: IpAddr,
    xff: impl Iterator<Item = &'a HeaderValue>,
    trusted: &[IpNet],
) -> IpAddr {
    let peer = peer.to_canonical();
    if !is_trusted(peer, trusted) {
        return peer;
    }
    forwarded_client(peer, xff, trusted)
}

/// [`client_ip`] for a canonical `peer` already known to be `trusted`: the client that the
/// `X-Forwarded-For` lines name (for a caller that needs the peer's trust for more than this).
pub fn forwarded_client<'a>(
    peer: IpAddr,
    xff: impl Iterator<Item = &'a HeaderValue>,
    trusted: &[IpNet],
) -> IpAddr {
    // One pass left to right that ends in the state a right-to-left walk would stop in, so the
    // lines need not be collected: the right-most entry that is not a trusted address decides.
    let mut leftmost = None;
    let mut decisive = None;
    let entries = xff.flat_map(|line| line.as_bytes().split(|&b| b == b','));
    for entry in entries.map(<[u8]>::trim_ascii).filter(|e| !e.is_empty()) {
        match parse_forwarded_ip(entry) {
            Some(ip) if is_trusted(ip, trusted) => {
                leftmost.get_or_insert(ip);
                if let Some(Decisive::Garbage {
                    next_good: next @ None,
                }) = &mut decisive
                {
                    *next = Some(ip);
                }
            }
            Some(ip) => {
                leftmost.get_or_insert(ip);
                decisive = Some(Decisive::Untrusted(ip));
            }
            None => decisive = Some(Decisive::Garbage { next_good: None }),
        }
    }
    match decisive {
        Some(Decisive::Untrusted(ip)) => ip,
        Some(Decisive::Garbage { next_good }) => next_good.unwrap_or(peer),
        None => leftmost.unwrap_or(peer),
    }
}

/// The right-most `X-Forwarded-For` entry seen so far that is not a trusted address.
enum Decisive {
    /// an untrusted address: the client, unless a later entry is decisive
    Untrusted(IpAddr),
    /// an entry that did not parse; `next_good` is the trusted address to its right, if seen yet
    Garbage { next_good: Option<IpAddr> },
}

/// One `X-Forwarded-For` entry (trimmed): `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:443`; canonical (IPv4-mapped IPv6 becomes IPv4).
fn parse_forwarded_ip(entry: &[u8]) -> Option<IpAddr> {
    let entry = std::str::from_utf8(entry).ok()?;
    let ip = if let Some(rest) = entry.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !after.is_empty() && !is_port(after.strip_prefix(':')?) {
            return None;
        }
        IpAddr::V6(inside.parse::<Ipv6Addr>().ok()?)
    } else if let Ok(ip) = entry.parse::<IpAddr>() {
        ip
    } else {
        // Only IPv4 may carry a port without brackets; `::1:80` parsed above as an address.
        let (host, port) = entry.rsplit_once(':')?;
        if !is_port(port) {
            return None;
        }
        IpAddr::V4(host.parse().ok()?)
    };
    Some(ip.to_canonical())
}

fn is_port(port: &str) -> bool {
    !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test address")
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter()
            .map(|n| n.parse().expect("test network"))
            .collect()
    }

    /// `client_ip` with the given X-Forwarded-For lines, trusting 10.0.0.0/8.
    fn resolve(peer: &str, lines: &[&str]) -> IpAddr {
        let values: Vec<HeaderValue> = lines
            .iter()
            .map(|l| HeaderValue::from_str(l).expect("test header"))
            .collect();
        client_ip(ip(peer), values.iter(), &nets(&["10.0.0.0/8"]))
    }

    /// X-Forwarded-For from an untrusted peer is ignored: the client cannot pick its identity.
    #[test]
    fn spoofed_xff_from_untrusted_peer_is_ignored() {
        assert_eq!(resolve("203.0.113.9", &["1.2.3.4"]), ip("203.0.113.9"));
        assert_eq!(
            resolve("203.0.113.9", &["10.0.0.1, 1.2.3.4"]),
            ip("203.0.113.9")
        );
    }

    /// Behind a trusted peer, the forwarded address is the client.
    #[test]
    fn trusted_peer_is_honoured() {
        assert_eq!(resolve("10.0.0.1", &["1.2.3.4"]), ip("1.2.3.4"));
        assert_eq!(resolve("10.0.0.1", &[]), ip("10.0.0.1"));
    }

    /// A chain of trusted proxies is skipped; addresses left of the first untrusted one (which
    /// the client could have written) are not believed.
    #[test]
    fn chain_of_trusted_proxies_is_walked_right_to_left() {
        assert_eq!(
            resolve("10.0.0.1", &["1.2.3.4, 10.0.0.2, 10.9.9.9"]),
            ip("1.2.3.4")
        );
        assert_eq!(
            resolve("10.0.0.1", &["6.6.6.6, 1.2.3.4, 10.0.0.2"]),
            ip("1.2.3.4")
        );
        assert_eq!(
            resolve("10.0.0.1", &["6.6.6.6", "1.2.3.4", "10.0.0.2"]),
            ip("1.2.3.4")
        );
        assert_eq!(
            resolve("10.0.0.1", &["6.6.6.6, 1.2.3.4", "10.0.0.2"]),
            ip("1.2.3.4")
        );
    }

    /// When every forwarded address is trusted, the left-most one is the client.
    #[test]
    fn all_trusted_gives_leftmost() {
        assert_eq!(resolve("10.0.0.1", &["10.0.0.3, 10.0.0.2"]), ip("10.0.0.3"));
    }

    /// IPv6, ported and bracketed forms parse; IPv4-mapped addresses become IPv4 so CIDRs match.
    #[test]
    fn ipv6_ports_and_mapped_forms() {
        assert_eq!(resolve("10.0.0.1", &["2001:db8::1"]), ip("2001:db8::1"));
        assert_eq!(
            resolve("10.0.0.1", &["[2001:db8::1]:443"]),
            ip("2001:db8::1")
        );
        assert_eq!(resolve("10.0.0.1", &["[2001:db8::1]"]), ip("2001:db8::1"));
        assert_eq!(resolve("10.0.0.1", &["1.2.3.4:5678"]), ip("1.2.3.4"));
        assert_eq!(resolve("10.0.0.1", &["::ffff:1.2.3.4"]), ip("1.2.3.4"));
        assert_eq!(
            resolve("10.0.0.1", &["1.2.3.4, ::ffff:10.0.0.2"]),
            ip("1.2.3.4")
        );
        assert_eq!(resolve("::ffff:10.0.0.1", &["1.2.3.4"]), ip("1.2.3.4"));
        assert_eq!(
            resolve("::ffff:203.0.113.9", &["1.2.3.4"]),
            ip("203.0.113.9")
        );
    }

    /// An unparsable entry stops the walk at the last good address, or the peer.
    #[test]
    fn garbage_stops_the_walk() {
        assert_eq!(
            resolve("10.0.0.1", &["1.2.3.4, garbage, 10.0.0.2"]),
            ip("10.0.0.2")
        );
        assert_eq!(resolve("10.0.0.1", &["1.2.3.4, unknown"]), ip("10.0.0.1"));
        assert_eq!(resolve("10.0.0.1", &["1.2.3.4:notaport"]), ip("10.0.0.1"));
        assert_eq!(resolve("10.0.0.1", &["2001:db8::1:99999"]), ip("10.0.0.1"));
        assert_eq!(resolve("10.0.0.1", &["[2001:db8::1]x"]), ip("10.0.0.1"));
        assert_eq!(resolve("10.0.0.1", &["[1.2.3.4]"]), ip("10.0.0.1"));
        assert_eq!(resolve("10.0.0.1", &["garbage, 1.2.3.4"]), ip("1.2.3.4"));
        let binary = HeaderValue::from_bytes(b"1.2.3.4\xff").expect("obs-text is allowed");
        let trusted = nets(&["10.0.0.0/8"]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), [&binary].into_iter(), &trusted),
            ip("10.0.0.1")
        );
    }

    /// Empty list elements and surrounding whitespace are ignored (RFC 9110 §5.6.1).
    #[test]
    fn empty_elements_are_skipped() {
        assert_eq!(
            resolve("10.0.0.1", &["1.2.3.4,, 10.0.0.2 ,"]),
            ip("1.2.3.4")
        );
        assert_eq!(resolve("10.0.0.1", &["\t1.2.3.4\t"]), ip("1.2.3.4"));
        assert_eq!(resolve("10.0.0.1", &[""]), ip("10.0.0.1"));
    }

    /// Trust is decided on the canonical address, in IPv4 and IPv6 networks.
    #[test]
    fn is_trusted_matches_cidrs() {
        let trusted = nets(&["10.0.0.0/8", "2001:db8::/32"]);
        assert!(is_trusted(ip("10.1.2.3"), &trusted));
        assert!(is_trusted(ip("::ffff:10.1.2.3"), &trusted));
        assert!(is_trusted(ip("2001:db8::5"), &trusted));
        assert!(!is_trusted(ip("11.0.0.1"), &trusted));
        assert!(!is_trusted(ip("2001:db9::5"), &trusted));
        assert!(!is_trusted(ip("10.0.0.1"), &[]));
    }

    proptest! {
        /// From an untrusted peer the answer is always the peer, whatever X-Forwarded-For says.
        #[test]
        fn untrusted_peer_is_always_the_client(
            peer in any::<u32>(),
            lines in proptest::collection::vec("[ -~]{0,40}", 0..4),
        ) {
            let peer = IpAddr::V4(Ipv4Addr::from(peer));
            let trusted = nets(&["10.0.0.0/8", "192.168.0.0/16"]);
            prop_assume!(!is_trusted(peer, &trusted));
            let values: Vec<HeaderValue> =
                lines.iter().filter_map(|l| HeaderValue::from_str(l).ok()).collect();
            prop_assert_eq!(client_ip(peer, values.iter(), &trusted), peer);
        }

        /// Behind a trusted peer the answer is the peer or an address found in the header.
        #[test]
        fn trusted_peer_answer_comes_from_the_header(
            entries in proptest::collection::vec(
                prop_oneof!["10\\.0\\.0\\.[0-9]", "1\\.2\\.3\\.[0-9]", "[a-z:]{0,6}", "\\[::[0-9]\\]:80"],
                0..6,
            ),
        ) {
            let line = entries.join(", ");
            let value = HeaderValue::from_str(&line).expect("printable ASCII");
            let answer = client_ip(ip("10.0.0.1"), [&value].into_iter(), &nets(&["10.0.0.0/8"]));
            let found = entries.iter().filter_map(|e| parse_forwarded_ip(e.as_bytes())).any(|e| e == answer);
            prop_assert!(answer == ip("10.0.0.1") || found, "{line} -> {answer}");
        }
    }
}

//! Which `Host` an admin listener without a token answers: the defence against DNS rebinding.
//!
//! A page on a stranger's site can make the browser's name for that site point at the
//! console's address; the browser then sends the stranger's name as `Host`. So without a token
//! the listener answers only names an attacker cannot point there: IP literals, `localhost`
//! and its subdomains (which browsers resolve to loopback themselves, RFC 6761 §6.3), and the
//! names the operator lists in `admin.hosts`. Vite's `allowedHosts` and Jupyter do the same.
//!
//! This module only decides; `admin` answers.

use std::net::{Ipv4Addr, Ipv6Addr};

use http::{header, Request};

/// The verdict on a request's host.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// answer it
    Allowed,
    /// refuse it; the name, when it is one that could be added to `admin.hosts`
    Refused(Option<String>),
}

/// Whether a listener without a token answers `req`, given the names of `admin.hosts`
/// (lowercase, without a trailing dot).
///
/// The host is the request target's authority when it has one (HTTP/2 `:authority`, or an
/// absolute-form target, which wins over `Host` in RFC 9112 §3.2.2), else the `Host` header.
/// A request with neither is answered: browsers always send a host, and an HTTP/1.0 probe may
/// not. Two `Host` lines are refused.
pub(super) fn check<B>(req: &Request<B>, hosts: &[String]) -> Verdict {
    if let Some(authority) = req.uri().authority() {
        return check_host(authority.as_str().as_bytes(), hosts);
    }
    let mut lines = req.headers().get_all(header::HOST).iter();
    match (lines.next(), lines.next()) {
        (None, _) => Verdict::Allowed,
        (Some(host), None) => check_host(host.as_bytes(), hosts),
        (Some(_), Some(_)) => Verdict::Refused(None),
    }
}

/// [`check`] for one host value: `name`, `name:port`, `1.2.3.4:80`, `[::1]:9901`.
fn check_host(value: &[u8], hosts: &[String]) -> Verdict {
    let Some(name) = std::str::from_utf8(value).ok().and_then(without_port) else {
        return Verdict::Refused(None);
    };
    if let Some(inside) = name.strip_prefix('[') {
        return match inside.strip_suffix(']').map(str::parse::<Ipv6Addr>) {
            Some(Ok(_)) => Verdict::Allowed,
            _ => Verdict::Refused(None),
        };
    }
    // one trailing dot names the same host (`localhost.`); the list is kept without it
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let fits = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_');
    if name.is_empty() || !name.bytes().all(fits) {
        return Verdict::Refused(None);
    }
    let local = name == "localhost" || name.ends_with(".localhost");
    if local || name.parse::<Ipv4Addr>().is_ok() || hosts.contains(&name) {
        Verdict::Allowed
    } else {
        Verdict::Refused(Some(name))
    }
}

/// The host without its `:port`; `None` when the port is not a number.
fn without_port(host: &str) -> Option<&str> {
    let port_at = match host.strip_prefix('[') {
        Some(rest) => rest.find(']').map(|end| end + 2)?,
        None => host.rfind(':').unwrap_or(host.len()),
    };
    let (name, port) = host.split_at(port_at.min(host.len()));
    match port.strip_prefix(':') {
        None if port.is_empty() => Some(name),
        Some(digits) if !digits.is_empty() && digits.parse::<u16>().is_ok() => Some(name),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(host: &str) -> Verdict {
        check_host(host.as_bytes(), &["console.example.com".to_owned()])
    }

    /// IP literals, `localhost` (any case, subdomains, a trailing dot) and listed names are
    /// answered, with or without a port.
    #[test]
    fn answers_addresses_localhost_and_listed_names() {
        for host in [
            "127.0.0.1",
            "127.0.0.1:9901",
            "10.1.2.3",
            "[::1]",
            "[::1]:9901",
            "[2001:db8::1]:80",
            "localhost",
            "LOCALHOST:9901",
            "localhost.",
            "localhost.:9901",
            "app.localhost",
            "console.example.com",
            "Console.Example.COM:9901",
            "console.example.com.",
        ] {
            assert_eq!(verdict(host), Verdict::Allowed, "{host}");
        }
    }

    /// Any other name is refused and named; malformed hosts are refused without a name.
    #[test]
    fn refuses_other_names_and_malformed_hosts() {
        let named = |n: &str| Verdict::Refused(Some(n.to_owned()));
        assert_eq!(verdict("evil.example"), named("evil.example"));
        assert_eq!(verdict("Evil.Example:9901"), named("evil.example"));
        assert_eq!(
            verdict("localhost.evil.example"),
            named("localhost.evil.example")
        );
        assert_eq!(verdict("example.com"), named("example.com"));
        assert_eq!(
            verdict("127.0.0.1.evil.example"),
            named("127.0.0.1.evil.example")
        );
        for host in [
            "",
            ":9901",
            "::1",
            "[::1",
            "[::1]x",
            "[evil]",
            "[::1]:port",
            "localhost:99999",
            "localhost:",
            "a b",
            "evil.example/x",
            "\u{e9}vil",
        ] {
            assert_eq!(verdict(host), Verdict::Refused(None), "{host:?}");
        }
    }

    /// The authority of the target wins over `Host`; no host at all is answered; two `Host`
    /// lines are refused.
    #[test]
    fn reads_the_authority_before_host() {
        let req = |uri: &str, hosts: &[&str]| {
            let mut b = Request::get(uri);
            for h in hosts {
                b = b.header(header::HOST, *h);
            }
            check(&b.body(()).expect("test request"), &[])
        };
        assert_eq!(req("/", &[]), Verdict::Allowed);
        assert_eq!(req("/", &["localhost"]), Verdict::Allowed);
        assert_eq!(
            req("http://evil.example/", &["localhost"]),
            Verdict::Refused(Some("evil.example".to_owned()))
        );
        assert_eq!(
            req("http://127.0.0.1:9901/", &["evil.example"]),
            Verdict::Allowed
        );
        assert_eq!(
            req("/", &["localhost", "localhost"]),
            Verdict::Refused(None)
        );
    }
}

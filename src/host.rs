//! The name in a `Host` value. Routing matches it and limit keys count it, so both read it one
//! way. A leaf: it uses nothing of the crate, so `routing` and `identity` may both use it.

/// A `Host` value without port, IPv6 brackets or the trailing dot of an absolute name.
pub fn name(host: &str) -> &str {
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
    use super::name;

    /// The port, the brackets of an IPv6 literal and a trailing dot go; a bare IPv6 address
    /// keeps its colons.
    #[test]
    fn names_without_port_brackets_or_dot() {
        assert_eq!(name("api.example.com:8080"), "api.example.com");
        assert_eq!(name("api.example.com."), "api.example.com");
        assert_eq!(name("[::1]:8080"), "::1");
        assert_eq!(name("::1"), "::1");
        assert_eq!(name("Example.COM"), "Example.COM");
        assert_eq!(name("host:port"), "host:port");
    }
}

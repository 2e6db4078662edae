//! Hop-by-hop headers (RFC 9110 §7.6.1): the headers a proxy must not pass on, found in one
//! pass over a message's names. Both HTTP/1 clients and the forward phase use them.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// Why a response with a transfer coding other than `chunked` gets 502 (as nginx answers it):
/// its body cannot go on as it is, its coding being hop-by-hop and undone by nobody.
pub(crate) const OTHER_CODING: &str = "a transfer coding other than chunked in the response";

/// The headers that never cross a hop by their name alone (headers named by `Connection` are
/// the others), as bits: which of them a message carries is one pass over its names.
pub(crate) fn hop_by_hop_bit(name: &HeaderName) -> u8 {
    if name == header::CONNECTION {
        1
    } else if name == header::TE {
        2
    } else if name == header::TRAILER {
        4
    } else if name == header::TRANSFER_ENCODING {
        8
    } else if name == header::UPGRADE {
        16
    } else if name == KEEP_ALIVE {
        32
    } else if name.as_str().starts_with("proxy-") {
        64
    } else {
        0
    }
}

/// Which message [`strip_hop_by_hop`] cleans: the two keep different fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// a request: a `TE` that accepts trailers goes on as `te: trailers`, the one value HTTP/2
    /// allows. gRPC servers refuse calls without it.
    Request,
    /// a response: `Trailer` stays. It names the trailer fields that hyper's HTTP/1.1 side
    /// then sends on to a client that asked for them with `TE: trailers`.
    Response,
}

/// Removes hop-by-hop headers (RFC 9110 §7.6.1): `Connection` and every header it names,
/// `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`, but for what
/// `message` keeps.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, message: Message) {
    // Hot path: one pass of cheap name comparisons; most messages carry no hop-by-hop header
    // but `Connection`, and none at all over HTTP/2. Removing by name hashes, so only the
    // names present are removed, and nothing is allocated unless `Connection` has several
    // lines or names a header present, or `Proxy-*` headers came.
    let present = headers
        .keys()
        .fold(0, |bits, name| bits | hop_by_hop_bit(name));
    if present == 0 {
        return;
    }
    let te_trailers = present & 2 != 0
        && message == Message::Request
        && headers
            .get_all(header::TE)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"));
    if present & 1 != 0 {
        strip_connection(headers);
    }
    if present & 8 != 0 {
        // A message with both was framed by Transfer-Encoding (RFC 9112 §6.3), which goes
        // here: its Content-Length would frame the message sent on wrongly, so it goes too.
        headers.remove(header::CONTENT_LENGTH);
    }
    let trailer = match message {
        Message::Request => 4,
        Message::Response => 0,
    };
    let named = [
        (2, &header::TE),
        (trailer, &header::TRAILER),
        (8, &header::TRANSFER_ENCODING),
        (16, &header::UPGRADE),
        (32, &KEEP_ALIVE),
    ];
    for (bit, name) in named {
        if present & bit != 0 {
            headers.remove(name);
        }
    }
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if present & 64 != 0 {
        let proxy: Vec<HeaderName> = headers
            .keys()
            .filter(|k| k.as_str().starts_with("proxy-"))
            .cloned()
            .collect();
        for name in proxy {
            headers.remove(name);
        }
    }
}

/// Removes `Connection` and every header it names (RFC 9110 §7.6.1).
fn strip_connection(headers: &mut HeaderMap) {
    let header::Entry::Occupied(e) = headers.entry(header::CONNECTION) else {
        return;
    };
    let mut lines = e.remove_entry_mult().1;
    let first = lines.next();
    let rest: Vec<HeaderValue> = lines.collect();
    let listed = first
        .iter()
        .chain(&rest)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty());
    // The tokens are compared with the names present (a few), not looked up: a lookup by
    // text parses and hashes a name, and the usual tokens (`keep-alive`, `close`) name
    // nothing here or a header `strip_hop_by_hop` removes by name anyway.
    let mut doomed: Vec<HeaderName> = Vec::new();
    for token in listed {
        let found = headers
            .keys()
            .find(|k| k.as_str().eq_ignore_ascii_case(token));
        if let Some(name) = found {
            doomed.push(name.clone());
        }
    }
    for name in doomed {
        headers.remove(name);
    }
}

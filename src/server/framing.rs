//! Request framing checks that hyper's HTTP/1 parser leaves to the server, answered as nginx
//! answers them.
//!
//! hyper 1.12 itself refuses malformed request lines and header lines with 400, oversized
//! heads with 431, differing `Content-Length`s, and `Transfer-Encoding` on HTTP/1.0 or not
//! ending in `chunked`. A request with both `Content-Length` and `Transfer-Encoding`, the
//! classic smuggling shape, is framed by chunked alone: hyper drops the length and closes the
//! connection after the response (RFC 9112 §6.1, §6.3). So nothing after the last chunk is
//! read as a request. What hyper lets through, and this module refuses:
//!
//! * `Host` (RFC 9112 §3.2): an HTTP/1.1 request without one, with two, or with one that is not
//!   `host[:port]` (http's authority grammar: no userinfo, no escapes) gets 400. HTTP/1.0 may
//!   omit it. An absolute-form target still needs it; its authority, not `Host`, routes.
//! * a `Transfer-Encoding` other than one `chunked` (`gzip, chunked`, `chunked` twice): 501,
//!   since forwarding the body would drop a coding the upstream was never told about.
//! * a `Content-Length` that is not plain digits (`5, 5`, which hyper reads as 5): 400.
//! * `Content-Length` with `Transfer-Encoding`, should a hyper ever keep both: 400.
//!
//! Every refusal closes the connection (`Connection: close`), so nothing that follows an
//! ambiguous request is read as another request. HTTP/2 frames messages itself: not checked.
//!
//! These refusals happen before the proxy's phases, like hyper's own 400s, so they are not in
//! `tollgate_requests_total`.

use http::header::{CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::uri::Authority;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Version};

use crate::proxy::{respond, Body};

/// Why a request's framing or Host is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum FramingError {
    /// HTTP/1.1 without `Host`
    #[error("HTTP/1.1 request without a Host header")]
    MissingHost,
    /// more than one `Host` line
    #[error("more than one Host header")]
    DuplicateHost,
    /// `Host` is not `host[:port]`
    #[error("Host header is not a valid host[:port]")]
    InvalidHost,
    /// both `Content-Length` and `Transfer-Encoding`
    #[error("both Content-Length and Transfer-Encoding")]
    LengthAndTransferEncoding,
    /// `Content-Length` that is not one decimal number
    #[error("Content-Length is not a single decimal number")]
    InvalidLength,
    /// a transfer coding other than one `chunked`
    #[error("unsupported Transfer-Encoding: only a single \"chunked\" is accepted")]
    UnsupportedCoding,
}

impl FramingError {
    /// The status this refusal is answered with.
    pub(super) fn status(&self) -> StatusCode {
        match self {
            FramingError::MissingHost
            | FramingError::DuplicateHost
            | FramingError::InvalidHost
            | FramingError::LengthAndTransferEncoding
            | FramingError::InvalidLength => StatusCode::BAD_REQUEST,
            FramingError::UnsupportedCoding => StatusCode::NOT_IMPLEMENTED,
        }
    }

    /// The `error` field of the JSON body.
    fn code(&self) -> &'static str {
        match self.status() {
            StatusCode::NOT_IMPLEMENTED => "not_implemented",
            _ => "bad_request",
        }
    }
}

/// Checks an HTTP/1.x request's `Host` and body framing.
pub(super) fn check<B>(req: &Request<B>) -> Result<(), FramingError> {
    if req.version() > Version::HTTP_11 {
        return Ok(());
    }
    check_host(req.headers(), req.version() == Version::HTTP_11)?;
    check_length(req.headers())
}

fn check_host(headers: &HeaderMap, required: bool) -> Result<(), FramingError> {
    let mut hosts = headers.get_all(HOST).iter();
    match (hosts.next(), hosts.next()) {
        (None, _) if required => Err(FramingError::MissingHost),
        (None, _) => Ok(()),
        (Some(_), Some(_)) => Err(FramingError::DuplicateHost),
        (Some(host), None) if is_host(host) => Ok(()),
        (Some(_), None) => Err(FramingError::InvalidHost),
    }
}

/// `uri-host [":" port]` (RFC 9110 §7.2): an authority without userinfo. Empty is refused, as
/// nginx refuses it.
fn is_host(value: &HeaderValue) -> bool {
    plain_host(value.as_bytes())
        || Authority::try_from(value.as_bytes()).is_ok_and(|a| !a.as_str().contains('@'))
}

/// The usual host: a name or IPv4 address (letters, digits, `-`, `.`), with a port of at most
/// five digits or none; checked without the copy that parsing an `Authority` makes. Every such
/// value is an authority; whatever else goes to the full parse.
fn plain_host(host: &[u8]) -> bool {
    let (name, port) = match host.iter().rposition(|&b| b == b':') {
        Some(colon) => (&host[..colon], &host[colon + 1..]),
        None => (host, &b"0"[..]),
    };
    !name.is_empty()
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'.')
        && (1..=5).contains(&port.len())
        && port.iter().all(u8::is_ascii_digit)
}

fn check_length(headers: &HeaderMap) -> Result<(), FramingError> {
    let mut codings = headers.get_all(TRANSFER_ENCODING).iter();
    if let Some(first) = codings.next() {
        if headers.contains_key(CONTENT_LENGTH) {
            return Err(FramingError::LengthAndTransferEncoding);
        }
        let chunked = first
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"chunked");
        if !chunked || codings.next().is_some() {
            return Err(FramingError::UnsupportedCoding);
        }
    }
    let plain = |v: &HeaderValue| !v.is_empty() && v.as_bytes().iter().all(u8::is_ascii_digit);
    if headers.get_all(CONTENT_LENGTH).iter().all(plain) {
        Ok(())
    } else {
        Err(FramingError::InvalidLength)
    }
}

/// The refusal: the status, a JSON body like the proxy's own errors, and `Connection: close`.
pub(super) fn refusal(err: &FramingError) -> Response<Body> {
    let body = format!(
        r#"{{"error":"{}","message":{}}}"#,
        err.code(),
        respond::json_string(&err.to_string())
    );
    let mut resp = respond::json(err.status(), body);
    resp.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(version: Version, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::get("/").version(version);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).expect("test request")
    }

    /// Host: required once on HTTP/1.1, optional on HTTP/1.0, never on HTTP/2; must be
    /// `host[:port]`.
    #[test]
    fn host_rules() {
        use FramingError::*;
        let v11 = Version::HTTP_11;
        assert_eq!(check(&request(v11, &[])), Err(MissingHost));
        assert_eq!(check(&request(Version::HTTP_10, &[])), Ok(()));
        assert_eq!(check(&request(Version::HTTP_2, &[])), Ok(()));
        let two = [("host", "a"), ("host", "a")];
        assert_eq!(check(&request(v11, &two)), Err(DuplicateHost));
        for good in [
            "a.example",
            "a.example:8080",
            "[::1]:80",
            "10.0.0.1",
            "xn--bcher-kva.ch",
        ] {
            assert_eq!(check(&request(v11, &[("host", good)])), Ok(()), "{good}");
        }
        for bad in ["", "a b", "a/b", "u@a", "a?b", "a#b", "a\\b", "[::1"] {
            assert_eq!(
                check(&request(v11, &[("host", bad)])),
                Err(InvalidHost),
                "{bad:?}"
            );
        }
    }

    /// The quick check of a plain host never accepts what the full parse refuses, and takes
    /// the usual hosts without it.
    #[test]
    fn plain_hosts_are_authorities() {
        let samples = [
            "a",
            "a.example",
            "a.example:8080",
            "a:",
            "a:1",
            "a:65535",
            "a:99999",
            "a:123456",
            "10.0.0.1",
            "10.0.0.1:80",
            ":80",
            "a-b.c",
            "a_b",
            "a..b",
            "-a",
            "a:b",
            "a::1",
            "",
        ];
        for host in samples {
            if plain_host(host.as_bytes()) {
                assert!(Authority::try_from(host).is_ok(), "{host:?}");
            }
        }
        for usual in ["a.example", "a.example:8080", "10.0.0.1:80", "localhost"] {
            assert!(plain_host(usual.as_bytes()), "{usual}");
        }
    }

    /// Framing: chunked alone or a plain length; anything else refused.
    #[test]
    fn framing_rules() {
        use FramingError::*;
        let req = |h: &[(&str, &str)]| {
            let mut all = vec![("host", "a")];
            all.extend_from_slice(h);
            check(&request(Version::HTTP_11, &all))
        };
        assert_eq!(req(&[("transfer-encoding", "chunked")]), Ok(()));
        assert_eq!(req(&[("transfer-encoding", "Chunked")]), Ok(()));
        assert_eq!(req(&[("content-length", "42")]), Ok(()));
        assert_eq!(
            req(&[("content-length", "4"), ("transfer-encoding", "chunked")]),
            Err(LengthAndTransferEncoding)
        );
        assert_eq!(
            req(&[("transfer-encoding", "gzip, chunked")]),
            Err(UnsupportedCoding)
        );
        let twice = [
            ("transfer-encoding", "chunked"),
            ("transfer-encoding", "chunked"),
        ];
        assert_eq!(req(&twice), Err(UnsupportedCoding));
        for bad in ["5, 5", "+5", "0x5", "", " "] {
            assert_eq!(
                req(&[("content-length", bad)]),
                Err(InvalidLength),
                "{bad:?}"
            );
        }
    }
}

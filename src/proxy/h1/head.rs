//! The response head (RFC 9112 §4–6): parsed with `httparse` into the client's header map,
//! hop-by-hop fields left out as met, and the framing of its body decided (§6.3).

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode, Version};

use super::body::{Chunk, Framing};
use super::{Error, MAX_FIELDS, MAX_HEAD};
use crate::proxy::hop::{hop_by_hop_bit, OTHER_CODING};

pub(super) enum Parsed {
    /// a 1xx head (not 101), consumed: the final one follows
    Interim,
    /// the final head: the response without its body, its framing, and whether the connection
    /// may carry another exchange after it
    Final(Response<()>, Framing, bool),
}

/// Parses the response head at the start of `buf`, consuming it when complete; `None` when more
/// bytes are needed.
pub(super) fn parse_head(buf: &mut BytesMut, head_request: bool) -> Result<Option<Parsed>, Error> {
    // left uninitialised: filling 100 empty fields cost more than parsing a usual head
    let mut fields = [const { MaybeUninit::uninit() }; MAX_FIELDS];
    let mut resp = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut resp,
        buf,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(len)) if len > MAX_HEAD => {
            return Err(Error::Malformed("response head too large"))
        }
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Error::Malformed("too many header fields"))
        }
        Err(_) => return Err(Error::Malformed("invalid response head")),
    };
    let code = resp.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| Error::Malformed("invalid status"))?;
    if status.is_informational() {
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(Error::Malformed(
                "101 to a request that asked for no switch",
            ));
        }
        buf.advance(len);
        return Ok(Some(Parsed::Interim));
    }
    let http10 = resp.version == Some(0);
    // a reason other than the status's usual one goes on to the client as it came (hyper's
    // server writes it from this extension)
    let reason = resp
        .reason
        .filter(|r| Some(*r) != status.canonical_reason())
        .and_then(|r| hyper::ext::ReasonPhrase::try_from(r.as_bytes().to_vec()).ok());
    // the field positions, so that the values can share the head's bytes once it is frozen
    let base = buf.as_ptr() as usize;
    let mut spans = [(0u32, 0u32, 0u32, 0u32); MAX_FIELDS];
    let count = resp.headers.len();
    for (span, field) in spans.iter_mut().zip(resp.headers.iter()) {
        let name = field.name.as_ptr() as usize - base;
        let value = field.value.as_ptr() as usize - base;
        *span = (
            name as u32,
            field.name.len() as u32,
            value as u32,
            field.value.len() as u32,
        );
    }
    let head = buf.split_to(len).freeze();
    let (mut headers, meta) = field_map(&head, &spans[..count])?;
    if http10 && meta.transfer_encoding {
        // RFC 9112 §6.1: faulty framing
        return Err(Error::Malformed(
            "Transfer-Encoding in an HTTP/1.0 response",
        ));
    }
    let no_body =
        head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    let (framing, reusable) = body_framing(&meta, &mut headers, http10, no_body)?;
    if !meta.listed.is_empty() {
        for name in &meta.listed {
            headers.remove(name);
        }
    }
    let resp = response(status, http10, headers, reason);
    Ok(Some(Parsed::Final(resp, framing, reusable)))
}

/// The head's fields, sharing the bytes of `head`, and what they say; the fields that are
/// hop-by-hop are left out.
fn field_map(head: &Bytes, spans: &[(u32, u32, u32, u32)]) -> Result<(HeaderMap, Meta), Error> {
    let mut meta = Meta::default();
    let mut headers = HeaderMap::with_capacity(spans.len());
    for &(n, nl, v, vl) in spans {
        let (n, nl, v, vl) = (n as usize, nl as usize, v as usize, vl as usize);
        let name = HeaderName::from_bytes(&head[n..n + nl])
            .map_err(|_| Error::Malformed("invalid field name"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(v..v + vl))
            .map_err(|_| Error::Malformed("invalid field value"))?;
        if meta.note(&name, &value) {
            headers.append(name, value);
        }
    }
    Ok((headers, meta))
}

/// How the body is framed (RFC 9112 §6.3), with the `Content-Length` fields set right in
/// `headers`, and whether the connection may carry another exchange after it.
fn body_framing(
    meta: &Meta,
    headers: &mut HeaderMap,
    http10: bool,
    no_body: bool,
) -> Result<(Framing, bool), Error> {
    let mut reusable = !meta.close && (!http10 || meta.keep_alive);
    if let (Some(n), true, false) = (meta.length, meta.length_listed, meta.bad_length) {
        // RFC 9110 §8.6: a list of one length goes on as that length
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    if meta.bad_length && no_body {
        // frames nothing here, but is not passed on as it is
        headers.remove(header::CONTENT_LENGTH);
    }
    if meta.other_coding && !no_body {
        // its body cannot go on as it is: hop-by-hop, the coding would be undone by nobody
        return Err(Error::Malformed(OTHER_CODING));
    }
    let framing = if no_body {
        Framing::Done
    } else if meta.transfer_encoding {
        if meta.length.is_some() || meta.bad_length {
            // RFC 9112 §6.3 (3): Transfer-Encoding overrides Content-Length; a proxy removes
            // Content-Length before forwarding, and the connection is not reused
            headers.remove(header::CONTENT_LENGTH);
            reusable = false;
        }
        if meta.chunked {
            Framing::Chunked(Chunk::Size)
        } else {
            reusable = false;
            Framing::UntilClose
        }
    } else if meta.bad_length {
        return Err(Error::Malformed("invalid or conflicting Content-Length"));
    } else if let Some(n) = meta.length {
        if n == 0 {
            Framing::Done
        } else {
            Framing::Length(n)
        }
    } else {
        reusable = false;
        Framing::UntilClose
    };
    Ok((framing, reusable))
}

/// The response without its body, for a head of `status`, HTTP/1.0 or 1.1, with `headers`
/// and the `reason` phrase when it is not the usual one.
fn response(
    status: StatusCode,
    http10: bool,
    headers: HeaderMap,
    reason: Option<hyper::ext::ReasonPhrase>,
) -> Response<()> {
    let mut resp = Response::new(());
    *resp.status_mut() = status;
    *resp.version_mut() = if http10 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    *resp.headers_mut() = headers;
    if let Some(reason) = reason {
        resp.extensions_mut().insert(reason);
    }
    resp
}

/// What a response head's fields say about its framing and its connection.
#[derive(Default)]
struct Meta {
    length: Option<u64>,
    /// a `Content-Length` value was a list (`3, 3`)
    length_listed: bool,
    /// a `Content-Length` value was invalid, or two disagreed: an error if the body is framed
    /// by it (a response without a body may carry any)
    bad_length: bool,
    transfer_encoding: bool,
    /// `chunked` is the last transfer coding
    chunked: bool,
    /// a transfer coding other than `chunked` is named
    other_coding: bool,
    close: bool,
    keep_alive: bool,
    /// other fields `Connection` names: hop-by-hop, removed (RFC 9110 §7.6.1)
    listed: Vec<HeaderName>,
}

impl Meta {
    /// Notes a field; false when it is hop-by-hop and stays out of the forwarded head.
    fn note(&mut self, name: &HeaderName, value: &HeaderValue) -> bool {
        if name == header::CONTENT_LENGTH {
            let bytes = value.as_bytes();
            match content_length(bytes) {
                Some(n) if self.length.is_none_or(|m| m == n) => self.length = Some(n),
                _ => self.bad_length = true,
            }
            self.length_listed |= bytes.contains(&b',');
            return true;
        }
        // `Trailer` stays, as hyper's client keeps it: it names the trailer fields that a
        // client asking for them is sent
        if hop_by_hop_bit(name) == 0 || name == header::TRAILER {
            return true;
        }
        if name == header::TRANSFER_ENCODING {
            self.transfer_encoding = true;
            // the last coding named (empty list elements are allowed, RFC 9110 §5.6.1); a
            // later Transfer-Encoding line names codings applied after this one's
            let codings = value
                .as_bytes()
                .split(|&b| b == b',')
                .map(<[u8]>::trim_ascii);
            for coding in codings.filter(|c| !c.is_empty()) {
                self.chunked = coding.eq_ignore_ascii_case(b"chunked");
                self.other_coding |= !self.chunked;
            }
        } else if name == header::CONNECTION {
            for token in value.as_bytes().split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    self.close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    self.keep_alive = true;
                } else if let Ok(listed) = HeaderName::from_bytes(token) {
                    self.listed.push(listed);
                }
            }
        }
        false
    }
}

/// A `Content-Length` value: digits, or a list of the same digits (RFC 9110 §8.6).
fn content_length(value: &[u8]) -> Option<u64> {
    let mut found: Option<u64> = None;
    for part in value.split(|&b| b == b',') {
        let part = part.trim_ascii();
        if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n = part.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
        if found.is_some_and(|m| m != n) {
            return None;
        }
        found = Some(n);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::body::ends_section;
    use super::*;

    fn parsed(text: &str, head_request: bool) -> (Response<()>, Framing, bool, BytesMut) {
        let mut buf = BytesMut::from(text.as_bytes());
        loop {
            match parse_head(&mut buf, head_request).expect("valid head") {
                Some(Parsed::Final(resp, framing, reusable)) => {
                    return (resp, framing, reusable, buf)
                }
                Some(Parsed::Interim) => continue,
                None => panic!("incomplete head: {text:?}"),
            }
        }
    }

    /// The framing of a response body follows RFC 9112 §6.3, in its order of precedence.
    #[test]
    fn framing_follows_the_rules_in_order() {
        let cases = [
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                false,
                Framing::Length(5),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
                false,
                Framing::Done,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                true,
                Framing::Done,
                true,
            ),
            (
                "HTTP/1.1 204 No Content\r\n\r\n",
                false,
                Framing::Done,
                true,
            ),
            (
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
                false,
                Framing::Done,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
                false,
                Framing::Chunked(Chunk::Size),
                false,
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", false, Framing::UntilClose, false),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n",
                false,
                Framing::Length(2),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n",
                false,
                Framing::Length(2),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n",
                false,
                Framing::Length(2),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n",
                false,
                Framing::Length(3),
                true,
            ),
        ];
        for (text, head_request, framing, reusable) in cases {
            let (resp, got, can_reuse, _) = parsed(text, head_request);
            assert_eq!((got, can_reuse), (framing, reusable), "{text:?}");
            assert!(
                resp.headers().get(header::TRANSFER_ENCODING).is_none(),
                "{text:?}"
            );
            assert!(resp.headers().get(header::CONNECTION).is_none(), "{text:?}");
            if matches!(framing, Framing::Chunked(_)) {
                assert!(
                    resp.headers().get(header::CONTENT_LENGTH).is_none(),
                    "{text:?}"
                );
            }
        }
    }

    /// A head that cannot be framed safely is an error, not a guess.
    #[test]
    fn unframeable_heads_are_errors() {
        for text in [
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 0x10\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "SMTP ready\r\n\r\n",
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            // a coding nobody would undo (as nginx refuses it)
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        ] {
            let mut buf = BytesMut::from(text.as_bytes());
            assert!(parse_head(&mut buf, false).is_err(), "{text:?}");
        }
        // a response without a body may carry any length: it frames nothing (and is dropped)
        let (resp, framing, _, _) = parsed("HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", true);
        assert_eq!(framing, Framing::Done);
        assert!(resp.headers().get(header::CONTENT_LENGTH).is_none());
    }

    /// A list of one length goes on as that length; an empty list element before `chunked`
    /// does not hide it; a reason other than the usual one is kept for the client.
    #[test]
    fn heads_are_normalised_where_rfc_9110_says() {
        let (resp, framing, _, _) =
            parsed("HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n", false);
        assert_eq!(framing, Framing::Length(3));
        assert_eq!(resp.headers()[header::CONTENT_LENGTH], "3");
        let text = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked,\r\n\r\n";
        assert_eq!(parsed(text, false).1, Framing::Chunked(Chunk::Size));
        let (resp, _, _, _) = parsed(
            "HTTP/1.1 299 Weird Thing\r\nContent-Length: 0\r\n\r\n",
            false,
        );
        let reason = resp.extensions().get::<hyper::ext::ReasonPhrase>();
        assert_eq!(reason.map(|r| r.as_bytes()), Some(&b"Weird Thing"[..]));
        let (resp, _, _, _) = parsed("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", false);
        assert!(resp
            .extensions()
            .get::<hyper::ext::ReasonPhrase>()
            .is_none());
    }

    /// A head that arrives a byte at a time is found complete once its empty line has come
    /// (and not parsed again before: `ends_section` keeps the search linear).
    #[test]
    fn section_ends_are_found_across_reads() {
        let text = b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n";
        let mut searched = 0;
        let found: Vec<bool> = (1..=text.len())
            .map(|n| ends_section(&text[..n], &mut searched))
            .collect();
        assert_eq!(found.iter().position(|&f| f), Some(text.len() - 1));
        let mut searched = 0;
        assert!(
            ends_section(b"HTTP/1.1 200 OK\nA: b\n\n", &mut searched),
            "bare LFs"
        );
    }

    /// Interim (1xx) heads are read past; hop-by-hop fields and the ones `Connection` names
    /// stay out; the other fields keep their order and values; the body's first bytes stay in
    /// the buffer.
    #[test]
    fn heads_keep_end_to_end_fields_only() {
        let text = "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n\
                    HTTP/1.1 200 OK\r\nServer: up\r\nConnection: keep-alive, X-Hop\r\n\
                    X-Hop: 1\r\nKeep-Alive: timeout=5\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\
                    Proxy-Authenticate: Basic\r\nContent-Length: 2\r\n\r\nok";
        let (resp, framing, reusable, rest) = parsed(text, false);
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            (framing, reusable, &rest[..]),
            (Framing::Length(2), true, &b"ok"[..])
        );
        // (fields of different names keep no order among them in a HeaderMap)
        let mut names: Vec<&str> = resp.headers().keys().map(|n| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-length", "server", "set-cookie"]);
        let cookies: Vec<&[u8]> = resp
            .headers()
            .get_all(header::SET_COOKIE)
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        assert_eq!(cookies, [b"a=1", b"b=2"]);
        assert!(resp.headers().get("link").is_none());
    }

    /// An incomplete head asks for more bytes and consumes nothing.
    #[test]
    fn incomplete_heads_wait_for_more() {
        let text = b"HTTP/1.1 200 OK\r\nContent-Len";
        let mut buf = BytesMut::from(&text[..]);
        assert!(parse_head(&mut buf, false).expect("no error").is_none());
        assert_eq!(buf.len(), text.len());
    }
}

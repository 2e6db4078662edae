//! A response body's framing and its decoding: a length, the chunked coding (RFC 9112 §7.1,
//! with trailers), or until the connection closes.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::body::Frame;

use super::{Error, MAX_CHUNK_LINE, MAX_FIELDS, MAX_HEAD};

/// Whether the bytes of `buf` past `searched` (less the two before, for a line end split
/// between reads) hold an empty line, the end of a head or trailer section; `searched` moves
/// to the end.
pub(super) fn ends_section(buf: &[u8], searched: &mut usize) -> bool {
    let from = searched.saturating_sub(2);
    *searched = buf.len();
    let mut rest = &buf[from.min(buf.len())..];
    while let Some(lf) = rest.iter().position(|&b| b == b'\n') {
        match rest.get(lf + 1) {
            Some(b'\n') => return true,
            Some(b'\r') if rest.get(lf + 2) == Some(&b'\n') => return true,
            _ => rest = &rest[lf + 1..],
        }
    }
    false
}

/// How the response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// no body (a response to HEAD, 1xx, 204, 304), or its end was reached
    Done,
    /// `Content-Length`: this many bytes still to come
    Length(u64),
    /// `Transfer-Encoding: chunked`, at this point of the coding
    Chunked(Chunk),
    /// neither: the body runs until the upstream closes the connection
    UntilClose,
}

/// Where a chunked body's decoding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Chunk {
    /// before a chunk-size line
    Size,
    /// inside a chunk's data: this many bytes still to come
    Data(u64),
    /// after a chunk's data, before its CRLF
    DataEnd,
    /// after the last chunk: trailer fields, up to an empty line (searched for it this far,
    /// once they came incomplete)
    Trailers(Option<usize>),
}

/// The next frame of the body from the bytes in `buf`, moving `framing` on; `None` when more
/// bytes are needed (or, with `framing` now `Done`, when the body has ended without one).
pub(super) fn decode(
    buf: &mut BytesMut,
    framing: &mut Framing,
) -> Result<Option<Frame<Bytes>>, Error> {
    loop {
        match *framing {
            Framing::Done => return Ok(None),
            Framing::UntilClose => {
                if buf.is_empty() {
                    return Ok(None);
                }
                let data = buf.split().freeze();
                return Ok(Some(Frame::data(data)));
            }
            Framing::Length(left) => {
                if buf.is_empty() {
                    return Ok(None);
                }
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                let data = buf.split_to(n).freeze();
                let left = left - n as u64;
                *framing = if left == 0 {
                    Framing::Done
                } else {
                    Framing::Length(left)
                };
                return Ok(Some(Frame::data(data)));
            }
            Framing::Chunked(chunk) => match decode_chunk(buf, chunk)? {
                Step::More(at) => {
                    *framing = Framing::Chunked(at);
                    return Ok(None);
                }
                Step::To(next) => *framing = Framing::Chunked(next),
                Step::Data(data, next) => {
                    *framing = Framing::Chunked(next);
                    return Ok(Some(Frame::data(data)));
                }
                Step::End(trailers) => {
                    *framing = Framing::Done;
                    return Ok(trailers.map(Frame::trailers));
                }
            },
        }
    }
}

/// One step of the chunked coding (RFC 9112 §7.1).
enum Step {
    /// more bytes are needed, at this point of the coding
    More(Chunk),
    /// moved on, without a frame
    To(Chunk),
    /// chunk data, then on
    Data(Bytes, Chunk),
    /// the body ended, with its trailer fields if any
    End(Option<HeaderMap>),
}

fn decode_chunk(buf: &mut BytesMut, at: Chunk) -> Result<Step, Error> {
    match at {
        Chunk::Size => {
            let Some(lf) = buf.iter().position(|&b| b == b'\n') else {
                if buf.len() > MAX_CHUNK_LINE {
                    return Err(Error::Malformed("chunk-size line too long"));
                }
                return Ok(Step::More(at));
            };
            let size = chunk_size(&buf[..lf])?;
            buf.advance(lf + 1);
            Ok(Step::To(if size == 0 {
                Chunk::Trailers(None)
            } else {
                Chunk::Data(size)
            }))
        }
        Chunk::Data(left) => {
            if buf.is_empty() {
                return Ok(Step::More(at));
            }
            let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
            let data = buf.split_to(n).freeze();
            let left = left - n as u64;
            let next = if left == 0 {
                Chunk::DataEnd
            } else {
                Chunk::Data(left)
            };
            Ok(Step::Data(data, next))
        }
        Chunk::DataEnd => {
            if buf.len() < 2 {
                return Ok(Step::More(at));
            }
            if &buf[..2] != b"\r\n" {
                return Err(Error::Malformed("chunk data not followed by CRLF"));
            }
            buf.advance(2);
            Ok(Step::To(Chunk::Size))
        }
        Chunk::Trailers(searched) => trailers(buf, searched),
    }
}

/// The size of a chunk from its line (up to its LF): hex digits, then extensions, which are
/// ignored (RFC 9112 §7.1.1); the line must end with CRLF and hold no other CR or LF (a bare
/// one is how a chunk extension smuggles a line past one reader and not another).
fn chunk_size(line: &[u8]) -> Result<u64, Error> {
    let Some((b'\r', line)) = line.split_last() else {
        return Err(Error::Malformed("chunk-size line not ended by CRLF"));
    };
    if line.len() > MAX_CHUNK_LINE || line.contains(&b'\r') {
        return Err(Error::Malformed("invalid chunk-size line"));
    }
    let digits = line.split(|&b| b == b';').next().unwrap_or(b"");
    let digits = digits.trim_ascii_end();
    if digits.is_empty() {
        return Err(Error::Malformed("invalid chunk size"));
    }
    digits.iter().try_fold(0u64, |size, &d| {
        let v = (d as char)
            .to_digit(16)
            .ok_or(Error::Malformed("invalid chunk size"))?;
        size.checked_mul(16)
            .and_then(|s| s.checked_add(u64::from(v)))
            .ok_or(Error::Malformed("chunk size too large"))
    })
}

/// The trailer section after the last chunk, up to its empty line; parsed again only once an
/// empty line has come (see [`ends_section`]).
fn trailers(buf: &mut BytesMut, searched: Option<usize>) -> Result<Step, Error> {
    // no trailer fields: the empty line at once (a bare LF too, as httparse takes it below;
    // alone it would never show `ends_section` an empty line)
    for end in [&b"\r\n"[..], b"\n"] {
        if buf.starts_with(end) {
            buf.advance(end.len());
            return Ok(Step::End(None));
        }
    }
    if let Some(mut from) = searched {
        if !ends_section(buf, &mut from) {
            if buf.len() > MAX_HEAD {
                return Err(Error::Malformed("trailer section too large"));
            }
            return Ok(Step::More(Chunk::Trailers(Some(from))));
        }
    }
    let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let (len, parsed) = match httparse::parse_headers(buf, &mut fields) {
        // bounded as a head is, also when one read brought the whole section
        Ok(httparse::Status::Complete((len, _))) if len > MAX_HEAD => {
            return Err(Error::Malformed("trailer section too large"))
        }
        Ok(httparse::Status::Complete((len, parsed))) => (len, parsed),
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(Error::Malformed("trailer section too large"))
        }
        Ok(httparse::Status::Partial) => return Ok(Step::More(Chunk::Trailers(Some(buf.len())))),
        Err(_) => return Err(Error::Malformed("invalid trailer section")),
    };
    let mut trailers = HeaderMap::with_capacity(parsed.len());
    for field in parsed {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| Error::Malformed("invalid trailer name"))?;
        let value = HeaderValue::from_bytes(field.value)
            .map_err(|_| Error::Malformed("invalid trailer value"))?;
        trailers.append(name, value);
    }
    buf.advance(len);
    Ok(Step::End((!trailers.is_empty()).then_some(trailers)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(
        text: &str,
        mut framing: Framing,
    ) -> Result<(Vec<u8>, Option<HeaderMap>, usize), Error> {
        let mut buf = BytesMut::from(text.as_bytes());
        let mut data = Vec::new();
        let mut trailers = None;
        while let Some(frame) = decode(&mut buf, &mut framing)? {
            match frame.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        assert_eq!(framing, Framing::Done, "body not ended: {text:?}");
        Ok((data, trailers, buf.len()))
    }

    /// Chunked bodies decode across chunk boundaries, with extensions and trailers; what
    /// follows the body stays in the buffer.
    #[test]
    fn chunked_bodies_decode_with_trailers() {
        let chunked = Framing::Chunked(Chunk::Size);
        let (data, trailers, rest) = body(
            "5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\n\r\nNEXT",
            chunked,
        )
        .expect("valid");
        assert_eq!(
            (data.as_slice(), trailers, rest),
            (&b"hello 0123456789"[..], None, 4)
        );
        let (data, trailers, _) =
            body("2\r\nok\r\n0\r\nGrpc-Status: 0\r\nX-T: 1\r\n\r\n", chunked).expect("valid");
        let trailers = trailers.expect("trailers");
        assert_eq!(data, b"ok");
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"0"[..])
        );
        assert_eq!(trailers.len(), 2);
    }

    /// A chunked body decodes the same however its bytes are split between reads.
    #[test]
    fn chunked_bodies_decode_byte_by_byte() {
        let text = b"3\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nX: y\r\n\r\n";
        let mut framing = Framing::Chunked(Chunk::Size);
        let mut buf = BytesMut::new();
        let mut data = Vec::new();
        let mut trailers = None;
        for &b in text.iter() {
            buf.extend_from_slice(&[b]);
            while let Some(frame) = decode(&mut buf, &mut framing).expect("valid") {
                match frame.into_data() {
                    Ok(d) => data.extend_from_slice(&d),
                    Err(frame) => trailers = frame.into_trailers().ok(),
                }
            }
        }
        assert_eq!(framing, Framing::Done);
        assert_eq!(data, b"abc0123456789abcdef");
        assert_eq!(trailers.map(|t| t.len()), Some(1));
    }

    /// A chunked body whose last line comes in a read of its own ends, with a bare LF too.
    #[test]
    fn chunked_bodies_end_when_their_last_line_comes_alone() {
        for end in ["\r\n", "\n", "X: 1\r\n\r\n"] {
            let mut framing = Framing::Chunked(Chunk::Size);
            let mut buf = BytesMut::from(&b"2\r\nok\r\n0\r\n"[..]);
            while decode(&mut buf, &mut framing).expect("valid").is_some() {}
            assert_ne!(framing, Framing::Done, "{end:?}: not before its last line");
            buf.extend_from_slice(end.as_bytes());
            while decode(&mut buf, &mut framing).expect("valid").is_some() {}
            assert_eq!(framing, Framing::Done, "{end:?}");
        }
    }

    /// Malformed chunked codings are errors.
    #[test]
    fn malformed_chunked_bodies_are_errors() {
        let chunked = Framing::Chunked(Chunk::Size);
        for text in [
            "zz\r\nab\r\n0\r\n\r\n",
            "2\r\nabXX0\r\n\r\n",
            "\r\nab\r\n",
            "ffffffffffffffffff\r\n",
            // a bare LF ends no chunk-size line, nor may one hide in an extension
            "2\nok\n0\n\n",
            "2;x\nfoo\r\nok\r\n0\r\n\r\n",
            "2;x\rfoo\r\nok\r\n0\r\n\r\n",
        ] {
            assert!(body(text, chunked).is_err(), "{text:?}");
        }
        let (data, _, _) = body("0000000000000000002\r\nok\r\n0\r\n\r\n", chunked).expect("zeros");
        assert_eq!(data, b"ok");
        let mut buf = BytesMut::from(vec![b'1'; MAX_CHUNK_LINE + 1].as_slice());
        let mut framing = chunked;
        assert!(decode(&mut buf, &mut framing).is_err(), "endless size line");
    }

    /// A trailer section larger than a head may be is refused, even when it comes whole in
    /// one read; one just under the bound is taken.
    #[test]
    fn trailer_sections_are_bounded_as_heads() {
        let chunked = Framing::Chunked(Chunk::Size);
        let section = |size: usize| {
            let field = format!("X-Big: {}\r\n", "a".repeat(1000));
            let fields = field.repeat(size / field.len());
            format!("2\r\nok\r\n0\r\n{fields}\r\n")
        };
        let (_, trailers, _) = body(&section(MAX_HEAD - 2048), chunked).expect("under the bound");
        assert!(trailers.is_some_and(|t| t.len() > 50));
        let big = section(80 * 1000);
        assert!(big.len() > MAX_HEAD);
        assert!(matches!(
            body(&big, chunked),
            Err(Error::Malformed("trailer section too large"))
        ));
    }

    /// Content-Length bodies end exactly at their length; what follows stays.
    #[test]
    fn length_bodies_end_at_their_length() {
        let (data, _, rest) = body("hello world", Framing::Length(5)).expect("valid");
        assert_eq!((data.as_slice(), rest), (&b"hello"[..], 6));
    }
}

//! tollgate's own HTTP/1.1 client for the usual exchange: a request without a body, over a
//! cleartext connection. Its head is written in one write; the response head is parsed with
//! `httparse` straight into the `HeaderMap` the client gets (hop-by-hop fields left out as they
//! are met), and the body is read, by whoever polls it, from the connection itself.
//!
//! hyper's client does the same exchange through a connection task: the request and the
//! response head cross between tasks through channels, each body frame through another, and the
//! task is woken and polled once per step. That machinery cost more than the exchange itself
//! (callgrind: ~13 000 instructions per request for hyper's client connection). Requests with a
//! body, protocol switches and TLS targets still go through hyper (`pool`), which has the
//! streaming and flow control they need.
//!
//! Owns the wire format of one exchange (RFC 9112): the request head, the response head and
//! which framing its body has (§6.3), the chunked coding (§7.1), and whether the connection
//! can carry another exchange (§9.3). Does not own pooling, retries or timeouts (`pool`,
//! `forward`).

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use hyper::body::{Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::forward::hop_by_hop_bit;

/// The most bytes a response head may take (nginx's `proxy_buffer_size` is 4 or 8 KiB; hyper's
/// client allows ~400 KiB). A larger head is an error (502).
const MAX_HEAD: usize = 64 * 1024;
/// The most header fields in a response head (hyper's default too).
const MAX_FIELDS: usize = 100;
/// Read a little at a time, as much as a read may bring: the size of a read.
const READ_SIZE: usize = 8 * 1024;
/// The longest chunk-size line (with extensions) accepted in a chunked body.
const MAX_CHUNK_LINE: usize = 4096;

/// Why an exchange failed.
#[derive(Debug)]
pub enum Error {
    /// the connection closed (or was reset) before any byte of the response came: on a
    /// connection reused from the pool, the upstream may have closed it while it idled.
    /// `sent`: the whole request had been written (the upstream may have read it)
    Closed {
        /// the request was written whole before the close was seen
        sent: bool,
        /// the error that showed the close, if not a clean end of stream
        cause: Option<io::Error>,
    },
    /// reading or writing failed
    Io(io::Error),
    /// the upstream sent something that is not HTTP/1.1 as RFC 9112 has it
    Malformed(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Closed { cause: None, .. } => {
                f.write_str("connection closed before the response")
            }
            Error::Closed { cause: Some(e), .. } => {
                write!(f, "connection lost before the response: {e}")
            }
            Error::Io(e) => write!(f, "{e}"),
            Error::Malformed(what) => write!(f, "malformed response: {what}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Closed { cause: Some(e), .. } | Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// One connection to an upstream target.
pub struct Conn {
    io: TcpStream,
    /// bytes read and not yet consumed (the rest of a response, past what was handed on)
    buf: BytesMut,
    /// the request head being written (kept: its allocation serves every request)
    out: Vec<u8>,
}

/// How the response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
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
enum Chunk {
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

impl Conn {
    /// A connection over `io`, already connected.
    pub fn new(io: TcpStream) -> Conn {
        Conn {
            io,
            buf: BytesMut::new(),
            out: Vec::with_capacity(512),
        }
    }

    /// Still open, with nothing unread, as far as can be told without a system call: the
    /// runtime has seen no event on the socket since the last response was read (an upstream
    /// closing an idle connection makes it readable). A readable socket is read to tell
    /// whether it closed (kept only if the read would block).
    pub fn idle_and_open(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        // (with the task's budget spent, readiness reads as pending whatever it is: look)
        let readiness = match tokio::task::coop::has_budget_remaining() {
            true => self.io.poll_read_ready(&mut cx),
            false => Poll::Ready(Ok(())),
        };
        match readiness {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            Poll::Ready(Ok(())) => {
                let mut probe = [0u8; 1];
                matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    /// Sends `req`'s head (its body is empty) and reads the response head; the response's body
    /// reads the rest from this connection, which it hands to `home` once the body has ended
    /// with the connection able to carry another exchange.
    pub async fn exchange<H: Home>(
        mut self,
        req: &Request<impl Sized>,
        home: H,
    ) -> Result<Response<Reading<H>>, Error> {
        encode_head(&mut self.out, req);
        if let Err(e) = self.io.write_all(&self.out).await {
            let cause = Some(e);
            return Err(Error::Closed { sent: false, cause });
        }
        let head_request = req.method() == Method::HEAD;
        let (resp, framing, reusable) = self.read_head(head_request).await?;
        let mut body = Reading {
            conn: Some(self),
            framing,
            reusable,
            home: Some(home),
        };
        body.end_if_done();
        Ok(resp.map(|()| body))
    }

    /// Reads response heads until a final one (1xx heads other than 101 are read past).
    async fn read_head(
        &mut self,
        head_request: bool,
    ) -> Result<(Response<()>, Framing, bool), Error> {
        let mut received = 0usize;
        // After an incomplete head, it is parsed again only once an empty line has come (each
        // byte looked at about once, however slowly the head arrives); `searched` is how far
        // the search for one has gone.
        let mut partial = false;
        let mut searched = 0usize;
        loop {
            if !self.buf.is_empty() && (!partial || ends_section(&self.buf, &mut searched)) {
                match parse_head(&mut self.buf, head_request)? {
                    Some(Parsed::Interim) => {
                        (partial, searched) = (false, 0);
                        continue;
                    }
                    Some(Parsed::Final(resp, framing, reusable)) => {
                        return Ok((resp, framing, reusable));
                    }
                    None => (partial, searched) = (true, self.buf.len()),
                }
            }
            if self.buf.len() >= MAX_HEAD {
                return Err(Error::Malformed("response head too large"));
            }
            self.buf.reserve(READ_SIZE);
            let n = match self.io.read_buf(&mut self.buf).await {
                Ok(n) => n,
                Err(e) if received == 0 => {
                    let cause = Some(e);
                    return Err(Error::Closed { sent: true, cause });
                }
                Err(e) => return Err(Error::Io(e)),
            };
            if n == 0 {
                return Err(if received == 0 {
                    Error::Closed {
                        sent: true,
                        cause: None,
                    }
                } else {
                    Error::Malformed("connection closed within the response head")
                });
            }
            received += n;
        }
    }
}

/// Where a connection goes when its response body has ended and it can carry another exchange.
pub trait Home: Send + Sync + Unpin + 'static {
    /// Takes the connection back.
    fn take_back(self, conn: Conn);
}

/// A response body read from its connection by whoever polls it.
pub struct Reading<H: Home> {
    /// `None` once the body has ended (the connection handed home, or closed)
    conn: Option<Conn>,
    framing: Framing,
    /// the connection may carry another exchange once this body has ended
    reusable: bool,
    home: Option<H>,
}

impl<H: Home> Reading<H> {
    /// At the body's end: the connection goes home, or is closed.
    fn end_if_done(&mut self) {
        if self.framing != Framing::Done {
            return;
        }
        if let (Some(conn), Some(home), true) = (self.conn.take(), self.home.take(), self.reusable)
        {
            if conn.buf.is_empty() {
                home.take_back(conn);
            }
        }
    }
}

impl<H: Home> hyper::body::Body for Reading<H> {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            if this.framing == Framing::Done {
                this.end_if_done();
                return Poll::Ready(None);
            }
            let step = decode(&mut conn.buf, &mut this.framing);
            match step {
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
                Ok(Some(frame)) => {
                    this.end_if_done();
                    return Poll::Ready(Some(Ok(frame)));
                }
                Ok(None) if this.framing == Framing::Done => {
                    this.end_if_done();
                    return Poll::Ready(None);
                }
                Ok(None) => {}
            }
            conn.buf.reserve(READ_SIZE);
            let read = tokio_util::io::poll_read_buf(Pin::new(&mut conn.io), cx, &mut conn.buf);
            match read {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(Error::Io(e))));
                }
                Poll::Ready(Ok(0)) if this.framing == Framing::UntilClose => {
                    this.framing = Framing::Done;
                    this.conn = None;
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(0)) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(Error::Malformed(
                        "connection closed within the body",
                    ))));
                }
                Poll::Ready(Ok(_)) => {}
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.framing == Framing::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Done => SizeHint::with_exact(0),
            Framing::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

/// Writes `req`'s head: request line, fields, empty line.
fn encode_head<B>(out: &mut Vec<u8>, req: &Request<B>) {
    out.clear();
    out.extend_from_slice(req.method().as_str().as_bytes());
    out.push(b' ');
    let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in req.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Whether the bytes of `buf` past `searched` (less the two before, for a line end split
/// between reads) hold an empty line, the end of a head or trailer section; `searched` moves
/// to the end.
fn ends_section(buf: &[u8], searched: &mut usize) -> bool {
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

enum Parsed {
    /// a 1xx head (not 101), consumed: the final one follows
    Interim,
    /// the final head: the response without its body, its framing, and whether the connection
    /// may carry another exchange after it
    Final(Response<()>, Framing, bool),
}

/// Parses the response head at the start of `buf`, consuming it when complete; `None` when more
/// bytes are needed.
fn parse_head(buf: &mut BytesMut, head_request: bool) -> Result<Option<Parsed>, Error> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let mut resp = httparse::Response::new(&mut fields);
    let len = match resp.parse(buf) {
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
    let mut meta = Meta::default();
    let mut headers = HeaderMap::with_capacity(count);
    for &(n, nl, v, vl) in &spans[..count] {
        let (n, nl, v, vl) = (n as usize, nl as usize, v as usize, vl as usize);
        let name = HeaderName::from_bytes(&head[n..n + nl])
            .map_err(|_| Error::Malformed("invalid field name"))?;
        let value = HeaderValue::from_maybe_shared(head.slice(v..v + vl))
            .map_err(|_| Error::Malformed("invalid field value"))?;
        if meta.note(&name, &value) {
            headers.append(name, value);
        }
    }
    if http10 && meta.transfer_encoding {
        // RFC 9112 §6.1: faulty framing
        return Err(Error::Malformed(
            "Transfer-Encoding in an HTTP/1.0 response",
        ));
    }
    let mut reusable = !meta.close && (!http10 || meta.keep_alive);
    let no_body =
        head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    if let (Some(n), true, false) = (meta.length, meta.length_listed, meta.bad_length) {
        // RFC 9110 §8.6: a list of one length goes on as that length
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    if meta.bad_length && no_body {
        // frames nothing here, but is not passed on as it is
        headers.remove(header::CONTENT_LENGTH);
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
    if !meta.listed.is_empty() {
        for name in &meta.listed {
            headers.remove(name);
        }
    }
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
    Ok(Some(Parsed::Final(resp, framing, reusable)))
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
        if hop_by_hop_bit(name) == 0 {
            return true;
        }
        if name == header::TRANSFER_ENCODING {
            self.transfer_encoding = true;
            // the last coding named (empty list elements are allowed, RFC 9110 §5.6.1); a
            // later Transfer-Encoding line names codings applied after this one's
            let mut codings = value
                .as_bytes()
                .split(|&b| b == b',')
                .map(<[u8]>::trim_ascii);
            if let Some(last) = codings.rfind(|c| !c.is_empty()) {
                self.chunked = last.eq_ignore_ascii_case(b"chunked");
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

/// The next frame of the body from the bytes in `buf`, moving `framing` on; `None` when more
/// bytes are needed (or, with `framing` now `Done`, when the body has ended without one).
fn decode(buf: &mut BytesMut, framing: &mut Framing) -> Result<Option<Frame<Bytes>>, Error> {
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
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                false,
                Framing::Chunked(Chunk::Size),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
                false,
                Framing::Chunked(Chunk::Size),
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                false,
                Framing::UntilClose,
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

    /// Content-Length bodies end exactly at their length; what follows stays.
    #[test]
    fn length_bodies_end_at_their_length() {
        let (data, _, rest) = body("hello world", Framing::Length(5)).expect("valid");
        assert_eq!((data.as_slice(), rest), (&b"hello"[..], 6));
    }

    /// The request head is the request line and the fields as given.
    #[test]
    fn request_heads_are_encoded_as_given() {
        let mut req = Request::new(());
        *req.method_mut() = Method::DELETE;
        *req.uri_mut() = "/a/b?c=d".parse().expect("uri");
        req.headers_mut()
            .insert(header::HOST, HeaderValue::from_static("up:80"));
        req.headers_mut()
            .append("x-many", HeaderValue::from_static("1"));
        req.headers_mut()
            .append("x-many", HeaderValue::from_static("2"));
        let mut out = Vec::new();
        encode_head(&mut out, &req);
        assert_eq!(
            String::from_utf8(out).expect("ascii"),
            "DELETE /a/b?c=d HTTP/1.1\r\nhost: up:80\r\nx-many: 1\r\nx-many: 2\r\n\r\n"
        );
    }
}

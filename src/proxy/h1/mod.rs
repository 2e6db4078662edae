//! tollgate's own HTTP/1.1 client for the usual exchange: a request without a body, over a
//! cleartext connection. Its head is written in one write (under load, behind: with the heads of
//! the other requests ready on the worker, see `outbox`); the response head is parsed with
//! `httparse` straight into the `HeaderMap` the client gets (hop-by-hop fields left out as they
//! are met), and the body is read, by whoever polls it, from the connection itself.
//!
//! hyper's client does the same exchange through a connection task: the request and the
//! response head cross between tasks through channels, each body frame through another, and the
//! task is woken and polled once per step. That machinery cost more than the exchange itself
//! (BENCHMARKS.md, "Decisions the figures made"). Requests with a
//! body, protocol switches and TLS targets still go through hyper (`pool`), which has the
//! streaming and flow control they need.
//!
//! Owns the wire format of one exchange (RFC 9112): the request head, the response head and
//! which framing its body has (§6.3), the chunked coding (§7.1), and whether the connection
//! can carry another exchange (§9.3). Does not own pooling, retries or timeouts (`pool`,
//! `forward`).

//!
//! Layout: `head` parses a response head and decides its framing; `body` decodes a body by
//! its framing; `outbox` writes request heads behind, under load; this module owns the
//! connection, the exchange and the body type.

mod body;
mod head;
mod outbox;

use std::cell::Cell;
use std::fmt;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::{Method, Request, Response};
use hyper::body::{Frame, SizeHint};
use tokio::io::Interest;
use tokio::net::TcpStream;

use body::{decode, ends_section, Framing};
use head::{parse_head, Parsed};
use outbox::Socket;

/// The most bytes a response head may take (nginx's `proxy_buffer_size` is 4 or 8 KiB; hyper's
/// client allows ~400 KiB). A larger head is an error (502).
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// The most header fields in a response head (hyper's default too).
const MAX_FIELDS: usize = 100;
/// Size of one socket read.
const READ_SIZE: usize = 8 * 1024;
/// The longest chunk-size line (with extensions) accepted in a chunked body.
const MAX_CHUNK_LINE: usize = 4096;

thread_local! {
    /// Exchanges on this thread that have sent their request and wait for the response head.
    static WAITING: Cell<usize> = const { Cell::new(0) };
}

/// Counts its exchange in [`WAITING`] while it lives.
struct Waiting;

impl Waiting {
    fn start() -> Waiting {
        WAITING.with(|w| w.set(w.get() + 1));
        Waiting
    }

    /// Whether other exchanges on this thread wait for their upstreams.
    fn others() -> bool {
        WAITING.with(Cell::get) > 0
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        // saturating: on a multi-threaded runtime (tests) a task may end on another thread;
        // the count is only a hint
        WAITING.with(|w| w.set(w.get().saturating_sub(1)));
    }
}

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
    /// the socket, and the request head being written (shared with the [`outbox`])
    sock: Arc<Socket>,
    /// bytes read and not yet consumed (the rest of a response, past what was handed on)
    buf: BytesMut,
}

impl Drop for Conn {
    /// A head left behind and not yet written goes no further: its exchange has given up.
    fn drop(&mut self) {
        self.sock.take_back_unsent();
    }
}

impl Conn {
    /// A connection over `io`, already connected.
    pub fn new(io: TcpStream) -> Conn {
        Conn {
            sock: Arc::new(Socket::new(io)),
            buf: BytesMut::new(),
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
            true => self.sock.io.poll_read_ready(&mut cx),
            false => Poll::Ready(Ok(())),
        };
        match readiness {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            Poll::Ready(Ok(())) => {
                let mut probe = [0u8; 1];
                matches!(self.sock.io.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
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
        encode_head(&mut self.sock.next_head().bytes, req);
        // Under load (other exchanges of this thread waiting for their upstreams), the head is
        // written behind, with those of the other requests the runtime has ready (`outbox`);
        // alone, at once.
        let behind = Waiting::others() && crate::turns::on() && outbox::post(&self.sock);
        if !behind {
            if let Err(e) = self.sock.write_head().await {
                let cause = Some(e);
                return Err(Error::Closed { sent: false, cause });
            }
        }
        let _waiting = Waiting::start();
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

    /// The connection ended before any byte of the response: with `sent`, whether the head
    /// had gone out whole (written behind, it may have failed, and the socket been shut).
    fn closed(&self, cause: Option<io::Error>) -> Error {
        match self.sock.take_back_unsent() {
            Some(failed) => Error::Closed {
                sent: false,
                cause: failed.or(cause),
            },
            None => Error::Closed { sent: true, cause },
        }
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
            let n = match poll_fn(|cx| poll_read(&self.sock.io, cx, &mut self.buf)).await {
                Ok(n) => n,
                Err(e) if received == 0 => return Err(self.closed(Some(e))),
                Err(e) => return Err(Error::Io(e)),
            };
            if n == 0 {
                return Err(if received == 0 {
                    self.closed(None)
                } else {
                    Error::Malformed("connection closed within the response head")
                });
            }
            received += n;
        }
    }
}

/// Reads what `io` has into `buf`'s spare room.
///
/// A read that leaves room in `buf` has emptied the socket: its readiness is cleared then, as
/// tokio's own `AsyncRead` does (`try_read_buf` clears it only on a read that would block), so
/// that [`Conn::idle_and_open`] finds an idle connection not readable until an event comes, and
/// asks the kernel nothing. (The readiness it would see otherwise is the one this read used:
/// a probing read per request, one system call in five.) The read runs inside `try_io`, which
/// takes the readiness before the read and clears only that: an event that comes during or
/// after the read (taken in by another thread of a multi-threaded runtime) is kept, and its
/// wake-up not lost.
fn poll_read(io: &TcpStream, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
    loop {
        ready!(io.poll_read_ready(cx))?;
        let room = buf.capacity() - buf.len();
        let mut emptied = None;
        let read = io.try_io(Interest::READABLE, || match io.try_read_buf(buf)? {
            // told to try_io as "would block", so that it clears the readiness it took
            n if n > 0 && n < room => {
                emptied = Some(n);
                Err(io::ErrorKind::WouldBlock.into())
            }
            n => Ok(n),
        });
        match (read, emptied) {
            (_, Some(n)) => return Poll::Ready(Ok(n)),
            (Err(e), None) if e.kind() == io::ErrorKind::WouldBlock => {}
            (result, None) => return Poll::Ready(result),
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
    /// Where the connection goes back to once the body has been read (none after that).
    pub fn home(&self) -> Option<&H> {
        self.home.as_ref()
    }

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
            let read = poll_read(&conn.sock.io, cx, &mut conn.buf);
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{self, HeaderValue};
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    /// A read that empties the socket leaves it not readable, so an idle connection is taken
    /// again without a probing read; a byte that comes afterwards is still seen, and the
    /// connection is no longer taken.
    #[tokio::test]
    async fn a_read_that_empties_the_socket_clears_its_readiness() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut theirs, _) = listener.accept().await.unwrap();
        let mut conn = Conn::new(ours);
        let response = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        theirs.write_all(response).await.unwrap();
        let mut read = BytesMut::with_capacity(1024);
        while read.len() < response.len() {
            poll_fn(|cx| poll_read(&conn.sock.io, cx, &mut read))
                .await
                .unwrap();
        }
        let mut cx = Context::from_waker(Waker::noop());
        assert!(
            conn.sock.io.poll_read_ready(&mut cx).is_pending(),
            "the emptied socket still reads as readable"
        );
        assert!(conn.idle_and_open());
        theirs.write_all(b"x").await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), conn.sock.io.readable())
            .await
            .expect("the later byte is seen")
            .unwrap();
        assert!(
            !conn.idle_and_open(),
            "a connection with an unread byte taken"
        );
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

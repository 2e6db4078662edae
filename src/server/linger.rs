//! The lingering close of an HTTP/1 connection that ends before its request body was read.
//!
//! tollgate may answer before it reads a request's body: a 413 for a body announced over
//! `max_body_size`, a 400 for bad framing, a 408, a 429. hyper then ends the connection. A
//! socket closed while received bytes sit unread in it is not closed with a FIN but reset
//! (RFC 2525 §2.17), and a client still writing its body (Python's `http.client`, Go's
//! `net/http`, Java's clients) gets `EPIPE` or `ECONNRESET` from its write, never reads the
//! answer, and reports a broken pipe.
//!
//! So, as nginx's lingering close does, the connection is shut down for writing (the answer
//! is flushed and a FIN follows it), then what the client still sends is read and discarded
//! until it closes its side, [`MAX_DISCARD`] bytes were read, or `timeouts.linger` passed.
//! Only then is the socket closed. The bounds are the connection's own: lingering holds no
//! request slot and nothing another connection waits for.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The most a lingering connection reads and throws away. With what the kernel's socket
/// buffers hold besides, a client can finish a body a few MiB larger than tollgate read; past
/// that, a fast client would make tollgate copy for nothing for the whole of `linger`.
pub(super) const MAX_DISCARD: u64 = 4 * 1024 * 1024;

/// Size of one discarding read.
const SCRATCH: usize = 16 * 1024;

/// Whether a close after `req` may leave its body unread: an HTTP/1 request that came with a
/// body. Not an upgrade: after one, the bytes that follow are the tunnel's.
pub(super) fn may_leave_body<B: hyper::body::Body>(req: &http::Request<B>) -> bool {
    req.version() < http::Version::HTTP_2
        && !req.body().is_end_stream()
        && !req.headers().contains_key(http::header::UPGRADE)
}

/// Why a lingering close ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// the client closed its side (or the socket failed): nothing was left unread
    Eof,
    /// [`MAX_DISCARD`] bytes were read
    Bytes,
    /// `timeouts.linger` passed
    Time,
}

/// One connection's lingering close, under way.
pub(super) struct Linger {
    until: Pin<Box<Sleep>>,
    began: Instant,
    /// the write side was shut down: the answer and a FIN are on their way
    shut: bool,
    discarded: u64,
}

impl Linger {
    /// A lingering close that may last `limit`.
    pub(super) fn new(limit: Duration) -> Linger {
        let began = Instant::now();
        Linger {
            until: Box::pin(tokio::time::sleep_until(began + limit)),
            began,
            shut: false,
            discarded: 0,
        }
    }

    /// Shuts `io` down for writing, then reads and discards until one bound is reached. Ready
    /// when the socket may be closed; the error of the shutdown, if it failed.
    pub(super) fn poll_close<I>(
        &mut self,
        mut io: Pin<&mut I>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>>
    where
        I: AsyncRead + AsyncWrite,
    {
        if !self.shut {
            ready!(io.as_mut().poll_shutdown(cx))?;
            self.shut = true;
        }
        let ended = ready!(self.poll_discard(io, cx));
        tracing::debug!(
            discarded = self.discarded,
            took = ?self.began.elapsed(),
            ended = ?ended,
            "lingering close done"
        );
        Poll::Ready(Ok(()))
    }

    fn poll_discard<I: AsyncRead>(
        &mut self,
        mut io: Pin<&mut I>,
        cx: &mut Context<'_>,
    ) -> Poll<Ended> {
        let mut scratch = [0u8; SCRATCH];
        loop {
            if self.until.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ended::Time);
            }
            if self.discarded >= MAX_DISCARD {
                return Poll::Ready(Ended::Bytes);
            }
            let mut buf = ReadBuf::new(&mut scratch);
            match ready!(io.as_mut().poll_read(cx, &mut buf)) {
                Ok(()) if buf.filled().is_empty() => return Poll::Ready(Ended::Eof),
                Ok(()) => self.discarded += buf.filled().len() as u64,
                Err(_) => return Poll::Ready(Ended::Eof),
            }
        }
    }

    /// Bytes read and thrown away so far.
    #[cfg(test)]
    pub(super) fn discarded(&self) -> u64 {
        self.discarded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The peer reads the answer and then a clean end (no reset), while it can still send; the
    /// close waits for the peer to end its side and discards what it sent.
    #[tokio::test]
    async fn the_peer_reads_the_answer_and_an_end_then_its_bytes_are_discarded() {
        let (mut server, mut client) = tokio::io::duplex(64 * 1024);
        server.write_all(b"HTTP/1.1 413 x\r\n\r\n").await.unwrap();
        let closing = tokio::spawn(async move {
            let mut linger = Linger::new(Duration::from_secs(30));
            poll_fn(|cx| linger.poll_close(Pin::new(&mut server), cx))
                .await
                .unwrap();
            linger.discarded()
        });
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"HTTP/1.1 413 x\r\n\r\n");
        client.write_all(&[b'x'; 100_000]).await.unwrap();
        client.shutdown().await.unwrap();
        assert_eq!(closing.await.unwrap(), 100_000);
    }

    /// A peer that sends without end is read no further than [`MAX_DISCARD`] bytes.
    #[tokio::test]
    async fn discarding_stops_at_the_byte_bound() {
        let (mut server, mut client) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move { while client.write_all(&[b'x'; SCRATCH]).await.is_ok() {} });
        let mut linger = Linger::new(Duration::from_secs(30));
        poll_fn(|cx| linger.poll_close(Pin::new(&mut server), cx))
            .await
            .unwrap();
        assert!(linger.discarded() >= MAX_DISCARD);
        assert!(linger.discarded() < MAX_DISCARD + SCRATCH as u64);
    }

    /// A peer that sends nothing, or a trickle, is let go when the time bound passes.
    #[tokio::test(start_paused = true)]
    async fn a_silent_or_slow_peer_is_let_go_at_the_time_bound() {
        let (mut server, mut client) = tokio::io::duplex(64 * 1024);
        let trickle = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if client.write_all(b"x").await.is_err() {
                    return;
                }
            }
        });
        let began = Instant::now();
        let mut linger = Linger::new(Duration::from_secs(2));
        poll_fn(|cx| linger.poll_close(Pin::new(&mut server), cx))
            .await
            .unwrap();
        let took = began.elapsed();
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_millis(2100),
            "{took:?}"
        );
        assert!(linger.discarded() > 0, "the trickle was read meanwhile");
        drop(server);
        trickle.await.unwrap();
    }
}

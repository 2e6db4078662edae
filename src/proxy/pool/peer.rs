//! What an upstream HTTP/2 connection's peer has said, read off the bytes on their way to
//! hyper: whether its SETTINGS came (the handshake is not over before they do), how many
//! streams it lets tollgate open, and when it last sent anything.
//!
//! hyper's client returns from its handshake as soon as tollgate's preface is written, and
//! keeps the peer's `SETTINGS_MAX_CONCURRENT_STREAMS` to itself. Only frame headers are
//! parsed (9 bytes per frame); only SETTINGS payloads are looked into.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// The streams a peer is taken to allow until its SETTINGS say (hyper's and h2's own
/// assumption; RFC 9113 §6.5.2 recommends no fewer than 100).
const ASSUMED_STREAMS: usize = 100;

/// HTTP/2 frame types and flags (RFC 9113 §6.5).
const SETTINGS: u8 = 0x4;
const ACK: u8 = 0x1;
const MAX_CONCURRENT_STREAMS: u16 = 0x3;
/// SETTINGS_MAX_FRAME_SIZE's initial value (RFC 9113 §6.5.2)
const MAX_FRAME: usize = 16_384;

/// What the peer of one connection has said so far.
pub(super) struct Peer {
    settled: AtomicBool,
    settled_now: Notify,
    max_streams: AtomicUsize,
    /// ms since `born` of the last byte read, +1 (0: none yet)
    last_read: AtomicU64,
    born: Instant,
}

impl Peer {
    pub(super) fn new() -> Arc<Peer> {
        Arc::new(Peer {
            settled: AtomicBool::new(false),
            settled_now: Notify::new(),
            max_streams: AtomicUsize::new(ASSUMED_STREAMS),
            last_read: AtomicU64::new(0),
            born: Instant::now(),
        })
    }

    /// Returns once the peer's first SETTINGS frame has been read.
    pub(super) async fn settled(&self) {
        loop {
            let notified = self.settled_now.notified();
            if self.settled.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    /// The streams the peer lets tollgate have open at once.
    pub(super) fn max_streams(&self) -> usize {
        self.max_streams.load(Ordering::Relaxed)
    }

    /// Whether the peer sent nothing at all since `since`.
    pub(super) fn silent_since(&self, since: Instant) -> bool {
        let last = self.last_read.load(Ordering::Relaxed);
        let since_ms = since.saturating_duration_since(self.born).as_millis() as u64;
        last == 0 || last - 1 < since_ms
    }

    fn read_now(&self) {
        let ms = self.born.elapsed().as_millis() as u64 + 1;
        self.last_read.store(ms, Ordering::Relaxed);
    }

    fn settings(&self, payload: &[u8]) {
        for entry in payload.chunks_exact(6) {
            if u16::from_be_bytes([entry[0], entry[1]]) == MAX_CONCURRENT_STREAMS {
                let n = u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]);
                self.max_streams.store(n as usize, Ordering::Relaxed);
            }
        }
        if !self.settled.swap(true, Ordering::Release) {
            self.settled_now.notify_waiters();
        }
    }
}

/// Where the reader is in the stream of frames.
#[derive(Default)]
struct Frames {
    head: [u8; 9],
    have: usize,
    /// payload bytes of the current frame still to come
    left: usize,
    /// the payload of a SETTINGS frame (not an ACK) being read
    settings: Option<Vec<u8>>,
}

impl Frames {
    fn feed(&mut self, mut bytes: &[u8], peer: &Peer) {
        while !bytes.is_empty() {
            if self.have < self.head.len() {
                let take = (self.head.len() - self.have).min(bytes.len());
                self.head[self.have..self.have + take].copy_from_slice(&bytes[..take]);
                self.have += take;
                bytes = &bytes[take..];
                if self.have == self.head.len() {
                    self.started(peer);
                }
                continue;
            }
            let take = self.left.min(bytes.len());
            if let Some(payload) = &mut self.settings {
                payload.extend_from_slice(&bytes[..take]);
            }
            self.left -= take;
            bytes = &bytes[take..];
            if self.left == 0 {
                self.ended(peer);
            }
        }
    }

    /// A frame's 9-byte header is in.
    fn started(&mut self, peer: &Peer) {
        let [l0, l1, l2, kind, flags, ..] = self.head;
        self.left = u32::from_be_bytes([0, l0, l1, l2]) as usize;
        // (a SETTINGS frame past the default maximum frame size is h2's to refuse)
        if kind == SETTINGS && flags & ACK == 0 && self.left <= MAX_FRAME {
            self.settings = Some(Vec::with_capacity(self.left.min(64)));
        }
        if self.left == 0 {
            self.ended(peer);
        }
    }

    fn ended(&mut self, peer: &Peer) {
        if let Some(payload) = self.settings.take() {
            peer.settings(&payload);
        }
        self.have = 0;
    }
}

/// A connection whose incoming bytes tell its [`Peer`].
pub(super) struct Heard<S> {
    io: S,
    peer: Arc<Peer>,
    /// (the server's side of the exchange has no preface: its bytes are all frames)
    frames: Frames,
}

impl<S> Heard<S> {
    pub(super) fn new(io: S, peer: Arc<Peer>) -> Heard<S> {
        Heard {
            io,
            peer,
            frames: Frames::default(),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Heard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            let this = &mut *self;
            this.peer.read_now();
            this.frames.feed(&buf.filled()[before..], &this.peer);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Heard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 0];
        f.extend_from_slice(payload);
        f
    }

    /// SETTINGS are found whatever the reads split them into; a SETTINGS ACK and other
    /// frames change nothing.
    #[test]
    fn reads_max_concurrent_streams_across_split_reads() {
        let mut bytes = frame(0x8, 0, &[0, 0, 0, 9]); // WINDOW_UPDATE
        bytes.extend(frame(SETTINGS, 0, &[0, 4, 0, 1, 0, 0, 0, 3, 0, 0, 0, 2]));
        bytes.extend(frame(SETTINGS, ACK, &[]));
        for split in 1..bytes.len() {
            let peer = Peer::new();
            let mut frames = Frames::default();
            frames.feed(&bytes[..split], &peer);
            frames.feed(&bytes[split..], &peer);
            assert!(peer.settled.load(Ordering::Relaxed), "split at {split}");
            assert_eq!(peer.max_streams(), 2, "split at {split}");
        }
        let peer = Peer::new();
        Frames::default().feed(&frame(SETTINGS, ACK, &[]), &peer);
        assert!(!peer.settled.load(Ordering::Relaxed));
        assert_eq!(peer.max_streams(), ASSUMED_STREAMS);
    }
}

//! Request heads written behind, under load: an exchange leaves its head here and goes on to
//! wait for the response; one task per worker thread writes every head left since it last ran.
//!
//! Woken by the first head of a scheduler pass, that task yields once before it writes: it runs
//! after the runtime has polled its I/O again and run what that woke, and after the responses
//! of the pass, which wait for the same turn (`src/server/pass.rs`). So the heads of
//! that pass and of the next go out together, after the responses. An upstream worker asleep
//! in `epoll_wait` is then woken once for them, where one write after another, each while it
//! had just gone back to sleep, could wake it for each; on a virtual machine a wake-up is the
//! costliest part of a write (BENCHMARKS.md: wake-ups per request). Written at the end of the
//! pass instead (one pass, not two, and before the responses), the heads kept the upstream and
//! the client waking more often, and on the proxy's own core, for less throughput
//! (BENCHMARKS.md, "Decisions the figures made"). A task that yielded to let the others write first
//! would be polled again from the top of its connection, which cost more than the wake-ups it
//! saved; writing from here costs a lock and a push.
//!
//! The socket and the head's bytes are shared between the exchange and this task ([`Socket`]).
//! A write that fails shuts the socket down, so the exchange, waiting to read, hears of it.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use socket2::SockRef;
use tokio::net::TcpStream;

/// A connection's socket, and the request head being written on it.
pub(super) struct Socket {
    pub(super) io: TcpStream,
    out: Mutex<Out>,
}

/// A request head and how far it has been written.
#[derive(Default)]
pub(super) struct Out {
    pub(super) bytes: Vec<u8>,
    written: usize,
    failed: Option<io::Error>,
}

impl Socket {
    pub(super) fn new(io: TcpStream) -> Socket {
        Socket {
            io,
            out: Mutex::new(Out {
                bytes: Vec::with_capacity(512),
                ..Out::default()
            }),
        }
    }

    /// The head to write, emptied, for the next exchange to fill.
    pub(super) fn next_head(&self) -> MutexGuard<'_, Out> {
        let mut out = self.out();
        out.bytes.clear();
        out.written = 0;
        out.failed = None;
        out
    }

    fn out(&self) -> MutexGuard<'_, Out> {
        // a panic while holding it leaves nothing half-done that matters here
        self.out
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Writes the head now, waiting for the socket as needed.
    pub(super) async fn write_head(&self) -> io::Result<()> {
        loop {
            match self.try_write_head() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.io.writable().await?,
                done => return done,
            }
        }
    }

    /// Writes what the socket takes of the head: `WouldBlock` if some is left.
    fn try_write_head(&self) -> io::Result<()> {
        let mut out = self.out();
        while out.written < out.bytes.len() {
            match self.io.try_write(&out.bytes[out.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => out.written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Whether the head went out whole; if not, it never will (a head left behind and not yet
    /// written is taken back), and the error that stopped it, if one did.
    pub(super) fn take_back_unsent(&self) -> Option<Option<io::Error>> {
        let mut out = self.out();
        if out.written == out.bytes.len() {
            return None;
        }
        out.bytes.clear();
        out.written = 0;
        Some(out.failed.take())
    }

    /// The rest of a head the writing task found the socket too full for.
    async fn write_behind(self: Arc<Socket>) {
        if let Err(e) = self.write_head().await {
            self.failed(e);
        }
    }

    /// A head written behind failed: the error is kept and the socket shut, so the exchange
    /// waiting to read wakes to an end of stream.
    fn failed(&self, e: io::Error) {
        self.out().failed = Some(e);
        let _ = SockRef::from(&self.io).shutdown(Shutdown::Both);
    }
}

/// The heads left to write on one thread, and the task writing them.
#[derive(Default)]
struct Outbox {
    state: Mutex<State>,
    /// the writing task is alive (it is dropped with its runtime)
    open: AtomicBool,
}

#[derive(Default)]
struct State {
    heads: Vec<Arc<Socket>>,
    /// the writing task, while it waits for heads
    writer: Option<Waker>,
}

impl Outbox {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

thread_local! {
    static OUTBOX: RefCell<Option<Arc<Outbox>>> = const { RefCell::new(None) };
}

/// Leaves `socket`'s head to be written behind; false when it cannot be (no runtime to run
/// the writing task on), and the caller writes it itself.
pub(super) fn post(socket: &Arc<Socket>) -> bool {
    let Some(outbox) = OUTBOX.with(|cell| {
        let mut cell = cell.borrow_mut();
        if let Some(outbox) = cell.as_ref().filter(|o| o.open.load(Ordering::Acquire)) {
            return Some(outbox.clone());
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let outbox = Arc::new(Outbox {
            open: AtomicBool::new(true),
            ..Outbox::default()
        });
        runtime.spawn(write_heads(Writer(outbox.clone())));
        *cell = Some(outbox.clone());
        Some(outbox)
    }) else {
        return false;
    };
    let writer = {
        let mut state = outbox.state();
        state.heads.push(socket.clone());
        state.writer.take()
    };
    if let Some(writer) = writer {
        writer.wake();
    }
    true
}

/// The writing task's hold on its outbox: the outbox is closed when the task is dropped, with
/// its runtime, even if it never ran (the next head then starts another task).
struct Writer(Arc<Outbox>);

impl Drop for Writer {
    fn drop(&mut self) {
        self.0.open.store(false, Ordering::Release);
    }
}

/// The writing task: writes the heads left since it last ran, then waits for more.
async fn write_heads(writer: Writer) {
    let outbox = &writer.0;
    let mut heads = Vec::new();
    loop {
        poll_fn(|cx| {
            let mut state = outbox.state();
            if state.heads.is_empty() {
                state.writer = Some(cx.waker().clone());
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
        // the rest of this pass, the next one's I/O and the pass's responses first
        tokio::task::yield_now().await;
        std::mem::swap(&mut outbox.state().heads, &mut heads);
        for socket in heads.drain(..) {
            match socket.try_write_head() {
                Ok(()) => {}
                // a full socket (rare for a head): finished by a task of its own
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    tokio::spawn(socket.write_behind());
                }
                Err(e) => socket.failed(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::*;

    /// `n` connected pairs: (our socket with a head to write, the peer's end).
    async fn pairs(n: usize) -> Vec<(Arc<Socket>, TcpStream)> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut pairs = Vec::new();
        for i in 0..n {
            let ours = TcpStream::connect(addr).await.unwrap();
            let (theirs, _) = listener.accept().await.unwrap();
            let socket = Arc::new(Socket::new(ours));
            let head = format!("GET /{i} HTTP/1.1\r\n\r\n");
            socket.next_head().bytes.extend_from_slice(head.as_bytes());
            pairs.push((socket, theirs));
        }
        pairs
    }

    /// What the peer has received within `wait` (nothing if nothing came).
    async fn received(peer: &mut TcpStream, wait: Duration) -> String {
        let mut got = Vec::new();
        let _ = tokio::time::timeout(wait, async {
            let mut buf = [0u8; 256];
            while !String::from_utf8_lossy(&got).ends_with("\r\n\r\n") {
                let n = peer.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
        })
        .await;
        String::from_utf8(got).unwrap()
    }

    /// Heads left in one scheduler pass are written after it, all of them, by the writing task:
    /// none before the task that left them yields, each whole after.
    #[tokio::test]
    async fn heads_left_in_one_pass_are_written_together_after_it() {
        let mut pairs = pairs(3).await;
        for (socket, _) in &pairs {
            assert!(post(socket));
        }
        // this task has not yielded: the writing task cannot have run
        for (_, peer) in &mut pairs {
            let mut probe = [0u8; 1];
            let err = peer
                .try_read(&mut probe)
                .expect_err("written before the pass ended");
            assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        }
        for (i, (socket, peer)) in pairs.iter_mut().enumerate() {
            let got = received(peer, Duration::from_secs(5)).await;
            assert_eq!(got, format!("GET /{i} HTTP/1.1\r\n\r\n"));
            assert!(socket.take_back_unsent().is_none(), "sent whole");
        }
    }

    /// The writing task yields once before it writes, so the responses of the pass (which
    /// wait for one turn of their own, `server/pass.rs`) go out first: after one turn of
    /// the task that left the heads nothing is written, after the writing task's turn all is.
    #[tokio::test]
    async fn heads_go_out_after_the_turn_the_responses_wait_for() {
        let mut pairs = pairs(2).await;
        for (socket, _) in &pairs {
            assert!(post(socket));
        }
        tokio::task::yield_now().await;
        for (socket, _) in &pairs {
            assert_eq!(socket.out().written, 0, "written before the turn");
        }
        for (i, (socket, peer)) in pairs.iter_mut().enumerate() {
            let got = received(peer, Duration::from_secs(5)).await;
            assert_eq!(got, format!("GET /{i} HTTP/1.1\r\n\r\n"));
            assert!(socket.take_back_unsent().is_none(), "sent whole");
        }
    }

    /// A head taken back before the writing task ran is never written (its exchange gave up,
    /// and may send the request again elsewhere).
    #[tokio::test]
    async fn a_head_taken_back_is_not_written() {
        let mut pairs = pairs(2).await;
        assert!(post(&pairs[0].0));
        assert!(post(&pairs[1].0));
        let taken = pairs[0].0.take_back_unsent().expect("not written yet");
        assert!(taken.is_none(), "no error: just not written");
        assert_eq!(
            received(&mut pairs[1].1, Duration::from_secs(5)).await,
            "GET /1 HTTP/1.1\r\n\r\n"
        );
        assert_eq!(
            received(&mut pairs[0].1, Duration::from_millis(200)).await,
            ""
        );
    }

    /// A writing task dropped with its runtime before it ever ran closes its outbox: the next
    /// head, on a new runtime on the same thread, starts a new task and is written.
    #[test]
    fn a_runtime_gone_takes_its_outbox_with_it() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let first = runtime();
        first.block_on(async {
            let pairs = pairs(1).await;
            // the task is spawned, and never polled: block_on returns first
            assert!(post(&pairs[0].0));
        });
        drop(first);
        runtime().block_on(async {
            let mut pairs = pairs(1).await;
            assert!(post(&pairs[0].0));
            let got = received(&mut pairs[0].1, Duration::from_secs(5)).await;
            assert_eq!(got, "GET /0 HTTP/1.1\r\n\r\n", "left in a dead outbox");
        });
    }

    /// A head whose write fails (the peer reset the connection) is kept failed with its error,
    /// and the socket is shut: the exchange waiting to read wakes to an end of stream.
    #[tokio::test]
    async fn a_failed_write_is_told_and_ends_the_read() {
        let mut pairs = pairs(1).await;
        let (socket, peer) = pairs.pop().unwrap();
        // close with a reset, and let it arrive
        SockRef::from(&peer)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(peer);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(post(&socket));
        // the read ends (reset or end of stream) once the writing task has run
        let mut buf = [0u8; 64];
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                socket.io.readable().await.unwrap();
                match socket.io.try_read(&mut buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    other => return other,
                }
            }
        })
        .await
        .expect("the read never ended");
        assert!(matches!(ended, Ok(0) | Err(_)), "{ended:?}");
        // give the writing task its turns (it yields once before writing) if the read ended on
        // the reset alone
        tokio::time::timeout(Duration::from_secs(5), async {
            while socket.out().failed.is_none() && socket.out().written == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the writing task never tried the head");
        let failed = socket.take_back_unsent().expect("the head did not go out");
        assert!(failed.is_some(), "the write's error is kept");
    }
}

//! Per-connection deadlines, kept by each connection's own task with one timer:
//!
//! * **`client_header`**: a request head must be complete within this of its first byte, and a
//!   new connection must complete its first head within this of being accepted (as nginx's
//!   `client_header_timeout`). That also bounds the HTTP/2 preface and hyper-util's protocol
//!   sniffing, which has no timeout of its own. An expired head is cut off (the socket closed).
//! * **`idle`**: a connection with no request in flight is closed this long after its last
//!   response finished (as nginx's `keepalive_timeout`), gracefully: HTTP/2 gets a GOAWAY.
//! * **`send`**: a connection whose client takes none of the bytes written to it for this long
//!   (its socket stays full) is cut off, in flight or not (as nginx's `send_timeout`): a client
//!   that stops reading a response cannot hold the connection, and the upstream's, for ever.
//!   Not seen: an HTTP/2 stream the client holds back by flow control while its socket drains,
//!   and a WebSocket tunnel (after the upgrade the connection's timer is gone; the tunnel's own
//!   watch closes one silent for `idle`).
//!
//! hyper's own `header_read_timeout` cannot tell the two apart: it runs from the moment hyper
//! waits for a head, so it would also end every keep-alive pause at `client_header`.
//!
//! Two observers feed [`Activity`]: [`Tracked`], the connection's I/O, notes the first bytes
//! read while no request is in flight (a head begins); an [`InFlight`] guard, held by each
//! request until hyper drops its response body (sent, or the connection gone), counts requests
//! in flight. Only `send` expires while a request is in flight: slow uploads and long responses
//! are bounded by the upstream timeouts instead. [`Tracked`] also notes writes that find the
//! socket full, and the next write that goes through.
//!
//! The close itself may linger ([`super::linger`]): a request that came with a body records how
//! long in [`Activity::linger_after`], and [`Tracked`] lingers when hyper shuts it down.
//!
//! On HTTP/2, bytes between requests are mostly control frames (WINDOW_UPDATE, PING, SETTINGS
//! acknowledgements), not the start of a head, so once a connection has carried an HTTP/2
//! request only `idle` applies between its requests; its first request is still owed within
//! `client_header`.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Version;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::linger::Linger;
use crate::body::{Observed, Observer};

/// The connection's timeouts, from `timeouts`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadlines {
    /// `timeouts.client_header`
    pub(super) client_header: Duration,
    /// `timeouts.idle`
    pub(super) idle: Duration,
    /// `timeouts.send`
    pub(super) send: Duration,
}

/// Which deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expired {
    /// a request head (or a new connection's first) took longer than `client_header`
    Head,
    /// no request for `idle`
    Idle,
    /// the client took no bytes for `send`
    Send,
}

/// What one connection is doing, in milliseconds since it was accepted. Atomics rather than a
/// lock: the I/O side touches it on reads, the request side twice per request.
pub(super) struct Activity {
    origin: Instant,
    limits: Deadlines,
    /// requests whose response body hyper still holds
    in_flight: AtomicUsize,
    /// when the last request in flight finished
    idle_since: AtomicU64,
    /// 1 + when the current request head began; 0 while none is arriving
    head_since: AtomicU64,
    /// set by the first HTTP/2 request: reads between requests no longer start a head
    multiplexed: AtomicBool,
    /// 1 + when a write first found the socket full; 0 while writes go through
    send_blocked: AtomicU64,
    /// when the connection's timer is due; a head whose deadline comes earlier wakes it
    armed: AtomicU64,
    /// how long a close lingers, in ms, should it come before the body of the last request was
    /// read; 0: it closes at once
    linger: AtomicU64,
    /// woken when a head begins, the last request in flight ends, or a write finds the socket
    /// full, with a deadline before `armed`: on a busy keep-alive connection the timer is
    /// usually due sooner, so requests cost no wake-up
    sooner: Notify,
}

impl Activity {
    /// A new connection: it owes its first request head from `began` on (when it was
    /// accepted, or its TLS handshake done). The first deadline is `limits.client_header`
    /// from then: arm the timer for it.
    pub(super) fn new(limits: Deadlines, began: Instant) -> Arc<Activity> {
        let activity = Activity {
            origin: began,
            limits,
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(1),
            multiplexed: AtomicBool::new(false),
            send_blocked: AtomicU64::new(0),
            armed: AtomicU64::new(0),
            linger: AtomicU64::new(0),
            sooner: Notify::new(),
        };
        activity.arm_at(activity.origin + limits.client_header);
        Arc::new(activity)
    }

    fn now_ms(&self) -> u64 {
        ms(self.origin.elapsed())
    }

    fn at(&self, ms: u64) -> Instant {
        self.origin + Duration::from_millis(ms)
    }

    /// Bytes arrived: with no request in flight and no head under way, a head begins.
    fn note_read(&self) {
        if self.in_flight.load(SeqCst) == 0
            && self.head_since.load(SeqCst) == 0
            && !self.multiplexed.load(SeqCst)
        {
            let now = self.now_ms();
            let began = self.head_since.compare_exchange(0, now + 1, SeqCst, SeqCst);
            let due = now + ms(self.limits.client_header);
            if began.is_ok() && self.armed.load(SeqCst) > due {
                self.sooner.notify_one();
            }
        }
    }

    /// A write to the client went through, or (`blocked`) found the socket full: the first
    /// such write starts the `send` deadline, the next that goes through ends it.
    fn note_write(&self, blocked: bool) {
        if !blocked {
            if self.send_blocked.load(SeqCst) != 0 {
                self.send_blocked.store(0, SeqCst);
            }
        } else if self.send_blocked.load(SeqCst) == 0 {
            let now = self.now_ms();
            let began = self
                .send_blocked
                .compare_exchange(0, now + 1, SeqCst, SeqCst);
            if began.is_ok() && self.armed.load(SeqCst) > now + ms(self.limits.send) {
                self.sooner.notify_one();
            }
        }
    }

    /// When to look again, or the deadline that has passed.
    pub(super) fn check(&self) -> Result<Instant, Expired> {
        let limits = self.limits;
        let now = Instant::now();
        let blocked = self.send_blocked.load(SeqCst);
        let send_at = (blocked > 0).then(|| self.at(blocked - 1) + limits.send);
        if send_at.is_some_and(|at| at <= now) {
            return Err(Expired::Send);
        }
        let next = if self.in_flight.load(SeqCst) > 0 {
            // only `send` expires meanwhile; the request's end moves the idle deadline past this
            now + limits.idle
        } else {
            let head = self.head_since.load(SeqCst);
            let (at, what) = if head > 0 {
                (self.at(head - 1) + limits.client_header, Expired::Head)
            } else {
                let idle_since = self.idle_since.load(SeqCst);
                (self.at(idle_since) + limits.idle, Expired::Idle)
            };
            if at <= now {
                return Err(what);
            }
            at
        };
        Ok(send_at.map_or(next, |at| at.min(next)))
    }

    /// [`check`](Self::check), recording the answer as the time the timer is due.
    pub(super) fn arm(&self) -> Result<Instant, Expired> {
        let at = self.check()?;
        self.arm_at(at);
        // A head that began just now may have read the previous arming and not woken us:
        // looking again after the store sees it (both sides store, then load: SeqCst).
        Ok(self.check()?.min(at))
    }

    /// Records that the timer is due at `at`.
    pub(super) fn arm_at(&self, at: Instant) {
        // rounded up: a timer a fraction of a millisecond later than a head's deadline wakes
        let due = ms(at.saturating_duration_since(self.origin)) + 1;
        self.armed.store(due, SeqCst);
    }

    /// The request now in flight came with a body (`limit`), or without (zero): should the
    /// connection close after it with its body unread, the close lingers this long.
    pub(super) fn linger_after(&self, limit: Duration) {
        self.linger.store(ms(limit), SeqCst);
    }

    /// The connection closes with no request in flight (idle, or at shutdown): hyper read the
    /// last request's body to its end before it kept the connection, so no close lingers.
    pub(super) fn owe_nothing(&self) {
        if self.in_flight.load(SeqCst) == 0 {
            self.linger.store(0, SeqCst);
        }
    }

    /// How long this close lingers, if it does; asked once, when the close begins.
    fn take_linger(&self) -> Option<Duration> {
        let ms = self.linger.swap(0, SeqCst);
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// Whether no request is in flight: between requests, or before the first. Such a
    /// connection is the first to close when descriptors run short.
    pub(super) fn idle(&self) -> bool {
        self.in_flight.load(SeqCst) == 0
    }

    /// Completes when a request head begins to arrive, the connection fell idle, or a write
    /// found the socket full, with a deadline before the one the timer is set for.
    pub(super) async fn sooner(&self) {
        self.sooner.notified().await;
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 2)
}

/// Held by a request from the moment hyper hands it over until its response body is dropped.
pub(super) struct InFlight(Arc<Activity>);

impl InFlight {
    /// A request head (of a request of `version`) is complete and in the service.
    pub(super) fn start(activity: &Arc<Activity>, version: Version) -> InFlight {
        if version == Version::HTTP_2 {
            activity.multiplexed.store(true, SeqCst);
        }
        activity.in_flight.fetch_add(1, SeqCst);
        activity.head_since.store(0, SeqCst);
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        // stamped before the count drops, so a check that sees no request in flight never
        // reads a head start or idle time older than this request's end
        a.head_since.store(0, SeqCst);
        let now = a.now_ms();
        a.idle_since.store(now, SeqCst);
        // the last request ended: if the timer is set for later than the idle deadline (for the
        // first head's deadline, when `idle` is the shorter), it must be set sooner
        if a.in_flight.fetch_sub(1, SeqCst) == 1
            && a.armed.load(SeqCst) > now + ms(a.limits.idle) + 1
        {
            a.sooner.notify_one();
        }
    }
}

/// A response body (the proxy's, or the admin's) that keeps its request in flight until hyper
/// drops it.
pub(super) type Guarded<B> = Observed<B, InFlight>;

/// The request stays in flight while its response body is alive: no hook, only the drop.
impl<B: hyper::body::Body> Observer<B> for InFlight {}

/// A connection's I/O, reporting reads, and writes that find the socket full, to its
/// [`Activity`].
pub(super) struct Tracked<I> {
    io: I,
    activity: Arc<Activity>,
    /// the lingering close under way, once hyper began to shut the connection down
    linger: Option<Box<Linger>>,
}

impl<I> Tracked<I> {
    pub(super) fn new(io: I, activity: Arc<Activity>) -> Tracked<I> {
        Tracked {
            io,
            activity,
            linger: None,
        }
    }
}

impl<I: Unpin> Tracked<I> {
    /// `op`, a write (or flush, or close) of the client's socket, noted: pending, it found the
    /// socket full; ready, it went through.
    fn write<T>(self: Pin<&mut Self>, op: impl FnOnce(Pin<&mut I>) -> Poll<T>) -> Poll<T> {
        let this = self.get_mut();
        let polled = op(Pin::new(&mut this.io));
        this.activity.note_write(polled.is_pending());
        polled
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Tracked<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.note_read();
        }
        polled
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Tracked<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.write(|io| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.write(|io| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    // A TLS stream takes the plaintext into its own buffer. It finds the socket full only when
    // it flushes its records or its close_notify, so a flush is a write too. hyper flushes a
    // plain socket only once its writes have gone through.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.write(|io| io.poll_flush(cx))
    }

    // A close that lingers waits on the client's bytes, not on room in the socket: not noted.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.linger.is_none() {
            let limit = this.activity.take_linger();
            this.linger = limit.map(|limit| Box::new(Linger::new(limit)));
        }
        match &mut this.linger {
            Some(linger) => linger.poll_close(Pin::new(&mut this.io), cx),
            None => Pin::new(this).write(|io| io.poll_shutdown(cx)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Deadlines = Deadlines {
        client_header: Duration::from_secs(1),
        idle: Duration::from_secs(5),
        send: Duration::from_secs(3),
    };

    /// A new connection owes a head within client_header; a request in flight suspends both
    /// deadlines; after it, idle runs; a read while idle starts a head's client_header.
    #[tokio::test(start_paused = true)]
    async fn deadlines_follow_the_connection() {
        let a = Activity::new(LIMITS, Instant::now());
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(a.check(), Err(Expired::Head));

        let guard = InFlight::start(&a, Version::HTTP_11);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(a.check().is_ok(), "nothing expires in flight");
        drop(guard);
        tokio::time::advance(Duration::from_millis(4900)).await;
        assert!(a.check().is_ok(), "idle not yet over");
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(a.check(), Err(Expired::Idle));

        drop(InFlight::start(&a, Version::HTTP_11));
        a.note_read();
        tokio::time::advance(Duration::from_millis(900)).await;
        assert!(a.check().is_ok(), "head under way");
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(a.check(), Err(Expired::Head));
    }

    /// A head wakes the timer only when its deadline comes before the one the timer is set for.
    #[tokio::test(start_paused = true)]
    async fn heads_wake_the_timer_only_when_sooner() {
        let a = Activity::new(LIMITS, Instant::now());
        drop(InFlight::start(&a, Version::HTTP_11));
        // the timer is set for the idle deadline (5 s): a head (due in 1 s) must wake it
        assert!(a.arm().is_ok());
        a.note_read();
        let woke = tokio::time::timeout(Duration::from_millis(1), a.sooner()).await;
        assert!(woke.is_ok(), "head sooner than the idle deadline: woken");
        // now set for that head's deadline: the next request's head (due later) does not wake
        assert!(a.arm().is_ok());
        drop(InFlight::start(&a, Version::HTTP_11));
        tokio::time::advance(Duration::from_millis(10)).await;
        a.note_read();
        let woke = tokio::time::timeout(Duration::from_millis(1), a.sooner()).await;
        assert!(woke.is_err(), "head due after the armed time: no wake-up");
        // the timer still fires in time, and looking again finds the head's true deadline
        tokio::time::advance(Duration::from_millis(990)).await;
        assert!(a.check().is_ok(), "the second head has 9 ms left");
        tokio::time::advance(Duration::from_millis(20)).await;
        assert_eq!(a.check(), Err(Expired::Head));
    }

    /// With `idle` shorter than `client_header`, the end of a connection's first request wakes
    /// the timer (set for the first head's deadline), so the keep-alive wait ends at `idle`.
    #[tokio::test(start_paused = true)]
    async fn idle_shorter_than_the_head_deadline_wakes_the_timer() {
        let limits = Deadlines {
            client_header: Duration::from_secs(10),
            idle: Duration::from_secs(2),
            send: Duration::from_secs(60),
        };
        let a = Activity::new(limits, Instant::now());
        let guard = InFlight::start(&a, Version::HTTP_11);
        tokio::time::advance(Duration::from_millis(100)).await;
        drop(guard);
        let woke = tokio::time::timeout(Duration::from_millis(1), a.sooner()).await;
        assert!(
            woke.is_ok(),
            "idle deadline sooner than the armed one: woken"
        );
        let next = a.arm().expect("not yet idle");
        assert!(
            next <= Instant::now() + Duration::from_secs(2),
            "set for the idle deadline"
        );
        // set for it now: the next request's end (idle deadline later) does not wake
        drop(InFlight::start(&a, Version::HTTP_11));
        let woke = tokio::time::timeout(Duration::from_millis(1), a.sooner()).await;
        assert!(
            woke.is_err(),
            "idle deadline after the armed time: no wake-up"
        );
    }

    /// A write that finds the socket full starts `send`, in flight or not; a write that goes
    /// through ends it; a blocked write due before the armed time wakes the timer.
    #[tokio::test(start_paused = true)]
    async fn writes_the_client_does_not_take_expire_at_send() {
        let a = Activity::new(LIMITS, Instant::now());
        let guard = InFlight::start(&a, Version::HTTP_11);
        // In flight, the timer is set for the next look, the idle limit of 5 s. A blocked write,
        // due in 3 s, wakes it.
        assert!(a.arm().is_ok());
        a.note_write(true);
        let woke = tokio::time::timeout(Duration::from_millis(1), a.sooner()).await;
        assert!(
            woke.is_ok(),
            "send deadline sooner than the armed one: woken"
        );
        let next = a.arm().expect("not yet expired");
        assert!(
            next <= Instant::now() + Duration::from_secs(3),
            "set for send"
        );
        // writes still blocked do not move the deadline; one that goes through ends it
        tokio::time::advance(Duration::from_millis(2000)).await;
        a.note_write(true);
        a.note_write(false);
        tokio::time::advance(Duration::from_millis(2000)).await;
        assert!(a.check().is_ok(), "bytes went through: no send deadline");
        // blocked again: expires 3 s later, although a request is in flight
        a.note_write(true);
        tokio::time::advance(Duration::from_millis(2900)).await;
        assert!(a.check().is_ok(), "send not yet over");
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(a.check(), Err(Expired::Send));
        // and with none in flight (the tail of the last response unsent) before idle's end
        drop(guard);
        assert_eq!(a.check(), Err(Expired::Send));
        a.note_write(false);
        assert!(a.check().is_ok(), "idle since the request's end");
    }

    /// A close lingers after a request that came with a body, once; not after one without,
    /// nor when the connection closes idle or at shutdown with no request in flight.
    #[tokio::test]
    async fn a_close_lingers_only_after_a_request_with_a_body() {
        let a = Activity::new(LIMITS, Instant::now());
        let guard = InFlight::start(&a, Version::HTTP_11);
        a.linger_after(Duration::from_secs(2));
        a.owe_nothing();
        assert_eq!(a.take_linger(), Some(Duration::from_secs(2)), "in flight");
        assert_eq!(a.take_linger(), None, "asked once");
        a.linger_after(Duration::from_secs(2));
        drop(guard);
        a.owe_nothing();
        assert_eq!(a.take_linger(), None, "closed idle");
        let _guard = InFlight::start(&a, Version::HTTP_11);
        a.linger_after(Duration::ZERO);
        assert_eq!(a.take_linger(), None, "no body");
    }

    /// After an HTTP/2 request, reads between requests (control frames) leave only `idle`.
    #[tokio::test(start_paused = true)]
    async fn http2_reads_between_requests_are_not_heads() {
        let a = Activity::new(LIMITS, Instant::now());
        drop(InFlight::start(&a, Version::HTTP_2));
        a.note_read();
        tokio::time::advance(Duration::from_millis(4900)).await;
        assert!(a.check().is_ok(), "only idle applies");
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(a.check(), Err(Expired::Idle));
    }
}

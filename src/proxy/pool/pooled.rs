//! The body of an upstream's response as the pool hands it out ([`Pooled`]): it gives its
//! connection back when it has been read to the end, ends a body the upstream leaves waiting
//! too long, and reports a body cut short one poll late.

use std::future::Future;
use std::pin::Pin;
use std::sync::Weak;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Either;
use hyper::body::{Body as _, Incoming};

use super::{h2, Inner, Key, Sender};
use crate::body::{Observed, Observer};
use crate::proxy::h1;
use crate::proxy::BoxError;

/// Where a connection of the own client goes back to when its response has been read.
pub struct Home {
    pub(super) pool: Weak<Inner>,
    pub(super) key: Key,
}

impl h1::Home for Home {
    fn take_back(self, conn: h1::Conn) {
        if let Some(pool) = self.pool.upgrade() {
            pool.put_own(self.key, conn);
        }
    }
}

/// A connection of hyper's client to hand back to its pool.
pub struct Back {
    pub(super) pool: Weak<Inner>,
    pub(super) key: Key,
    pub(super) sender: Sender,
}

impl Back {
    pub(super) fn give(self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.put(self.key, self.sender);
        }
    }
}

/// An upstream response body that hands its connection back to the pool once read to the end
/// (dropped before that, the connection closes with it).
///
/// A body the upstream cuts short (closed within its length, a malformed chunk) ends the
/// client's response early: the client is sent the head and what came, then the connection is
/// cut, as nginx does. The failure is reported to hyper one poll late ([`Cut`] holds it over a
/// `Pending`), because hyper's server drops a connection whose response body fails without
/// writing what it had buffered: a short body's head and first bytes, taken in the same turn
/// as the failure, would be lost, and the client would see the connection close with no
/// response at all (which it may take as leave to send the request again).
pub type Pooled = Observed<Source, Cut>;

/// Where a pooled body comes from: hyper's client, or the own one, which hands its connection
/// back itself.
pub type Source = Either<Observed<Incoming, GiveBack>, h1::Reading<Home>>;

impl Pooled {
    /// The body of a response of the own client.
    pub(super) fn own(body: h1::Reading<Home>) -> Pooled {
        Pooled::new(Either::Right(body), Cut::default())
    }

    /// The body of a response of hyper's client, which hands `back` its connection when it
    /// ends; over HTTP/2, `stream` is the stream given back then.
    pub(super) fn hyper(
        body: Incoming,
        back: Option<Back>,
        stream: Option<h2::StreamSlot>,
    ) -> Pooled {
        let give = GiveBack { back, stream };
        Pooled::new(Either::Left(Observed::new(body, give)), Cut::default())
    }

    /// Ends the body as cut short when the upstream sends nothing of it for `limit` (between
    /// two reads, as nginx's `proxy_read_timeout`): a stalled upstream no longer holds the
    /// client's response and both connections open for ever.
    pub fn stalls_after(mut self, limit: Duration) -> Pooled {
        self.observer_mut().stall = Some(Stall {
            limit,
            timer: None,
            armed: false,
        });
        self
    }
}

/// Gives a connection of hyper's client back when its response body ends.
pub struct GiveBack {
    /// the connection, over HTTP/1; taken when the body fails, so it closes
    back: Option<Back>,
    /// the stream, over HTTP/2
    stream: Option<h2::StreamSlot>,
}

impl GiveBack {
    fn ended(&mut self) {
        if let Some(back) = self.back.take() {
            back.give();
        }
        // the stream is over: another request may have it
        self.stream = None;
    }
}

impl Observer<Incoming> for GiveBack {
    fn data(&mut self, _: &Bytes, body: &Incoming) {
        if body.is_end_stream() {
            self.ended();
        }
    }

    // trailers end a chunked body, whose length never tells (the server side may not poll
    // past them)
    fn trailers(&mut self, _: &http::HeaderMap, _: &Incoming) {
        self.ended();
    }

    fn error(
        &mut self,
        error: hyper::Error,
        _: &mut Incoming,
        _: &mut Context<'_>,
    ) -> Poll<hyper::Error> {
        // (the connection is not handed back: [`Cut`] takes it)
        self.stream = None;
        Poll::Ready(error)
    }

    fn end(&mut self) {
        self.ended();
    }
}

/// Holds a failure of the body over one `Pending` (see [`Pooled`]), and ends a body that stalls.
#[derive(Default)]
pub struct Cut {
    /// the failure to report at the next poll
    cut: Option<BoxError>,
    /// the longest the upstream may leave the body waiting, and its timer: set when a poll
    /// finds nothing to read (so a body read in one go never makes one)
    stall: Option<Stall>,
}

/// See [`Pooled::stalls_after`].
struct Stall {
    limit: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// the timer runs for the wait under way (not one before it)
    armed: bool,
}

impl Cut {
    /// Something came: the next wait has a timer of its own.
    fn read(&mut self) {
        if let Some(stall) = &mut self.stall {
            stall.armed = false;
        }
    }
}

impl Observer<Source> for Cut {
    fn before(&mut self, _: &mut Context<'_>) -> Option<BoxError> {
        self.cut.take()
    }

    /// `Pending` while the body waits within its stall limit; the failure once past it.
    fn pending(&mut self, cx: &mut Context<'_>) -> Poll<BoxError> {
        let Some(stall) = &mut self.stall else {
            return Poll::Pending;
        };
        if !stall.armed {
            let deadline = tokio::time::Instant::now() + stall.limit;
            match &mut stall.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => stall.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            stall.armed = true;
        }
        let timer = stall.timer.as_mut().expect("armed above");
        ready!(timer.as_mut().poll(cx));
        let limit = stall.limit;
        Poll::Ready(format!("the upstream sent nothing of the body for {limit:?}").into())
    }

    fn data(&mut self, _: &Bytes, _: &Source) {
        self.read();
    }

    fn trailers(&mut self, _: &http::HeaderMap, _: &Source) {
        self.read();
    }

    fn end(&mut self) {
        self.read();
    }

    fn error(&mut self, cut: BoxError, body: &mut Source, cx: &mut Context<'_>) -> Poll<BoxError> {
        let target = match body {
            Either::Right(own) => own.home().map(|home| home.key.authority().clone()),
            // (the connection is not handed back)
            Either::Left(hyper) => {
                let back = hyper.observer_mut().back.take();
                back.map(|back| back.key.authority().clone())
            }
        };
        let target = target.as_ref().map_or("-", |a| a.as_str());
        tracing::warn!(target, error = %cut, "upstream response cut short; so is the client's");
        // what hyper holds is written before the failure is told (see above)
        self.cut = Some(cut);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

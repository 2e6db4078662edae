//! A request kept so that it can go again when an HTTP/2 upstream did not process it (a
//! stream above a GOAWAY's `last_stream_id`, or refused with `REFUSED_STREAM`: RFC 9113
//! §8.7).
//!
//! The head is cloned. The body is handed to hyper watched by a [`Keep`] that copies the
//! frames it passes on, up to [`MAX_KEPT`] bytes, and gives them back with the rest of the
//! body when hyper drops it. A body of which more than [`MAX_KEPT`] bytes were already sent
//! cannot go again.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame};
use tokio::sync::Notify;

use crate::body::{Observed, Observer};
use crate::proxy::{Body, BoxError};

/// The most of a request body kept to send again.
pub(super) const MAX_KEPT: usize = 64 * 1024;

/// How long a resend waits for hyper to give a body back after its stream failed (the task
/// that sends the body ends on its own turn).
const GIVE_BACK_WAIT: Duration = Duration::from_secs(1);

/// A request's head and, when it has one, its body, to send it again.
pub(super) struct Again {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    /// `None`: no body
    body: Option<Arc<Shared>>,
}

/// Where the body waits, or comes back to.
struct Shared {
    state: Mutex<State>,
    back: Notify,
}

enum State {
    /// being sent
    Out,
    /// given back: the frames sent and what was not (`None`: the body had ended)
    Back(Vec<Frame<Bytes>>, Option<Body>),
    /// more than [`MAX_KEPT`] was sent, or it failed: it cannot go again
    Spent,
}

impl Again {
    /// Keeps `req`'s head; its body, if any, is swapped for one that can be given back.
    pub(super) fn keep(req: &mut Request<Body>) -> Again {
        let body = (!req.body().is_end_stream()).then(|| {
            let inner = std::mem::take(req.body_mut());
            let shared = Arc::new(Shared {
                state: Mutex::new(State::Out),
                back: Notify::new(),
            });
            *req.body_mut() = Observed::new(inner, Keep::new(&shared)).boxed();
            shared
        });
        Again {
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            headers: req.headers().clone(),
            body,
        }
    }

    /// The request again, unless its body was sent past what is kept.
    pub(super) async fn request(self) -> Option<Request<Body>> {
        let body = match &self.body {
            None => http_body_util::Empty::new().map_err(BoxError::from).boxed(),
            Some(shared) => shared.take().await?,
        };
        let mut req = Request::new(body);
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers;
        Some(req)
    }
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The body to send again: as it came when none of it was sent, or what was sent followed
    /// by the rest.
    async fn take(&self) -> Option<Body> {
        let wait = async {
            loop {
                let back = self.back.notified();
                if !matches!(*self.state(), State::Out) {
                    return;
                }
                back.await;
            }
        };
        let _ = tokio::time::timeout(GIVE_BACK_WAIT, wait).await;
        match std::mem::replace(&mut *self.state(), State::Spent) {
            State::Back(sent, Some(rest)) if sent.is_empty() => Some(rest),
            State::Back(mut sent, rest) => {
                // (popped from the end)
                sent.reverse();
                Some(Replayed { sent, rest }.boxed())
            }
            State::Out | State::Spent => None,
        }
    }
}

/// Copies the body hyper sends while it is small enough to send again, and gives it back when
/// hyper drops it.
struct Keep {
    /// (held strongly: the body goes on being sent after the response head came and the
    /// [`Again`] is gone; with that, the copy stops)
    shared: Arc<Shared>,
    sent: Vec<Frame<Bytes>>,
    kept: usize,
    ended: bool,
}

impl Keep {
    fn new(shared: &Arc<Shared>) -> Keep {
        Keep {
            shared: shared.clone(),
            sent: Vec::new(),
            kept: 0,
            ended: false,
        }
    }

    /// Whether the [`Again`] still is, to send the request again.
    fn wanted(&self) -> bool {
        Arc::strong_count(&self.shared) > 1
    }

    /// Whether frames are still copied: the request can still go again and the copy is small
    /// enough. The copy goes when they no longer are.
    fn copying(&mut self) -> bool {
        if !self.wanted() || self.kept > MAX_KEPT {
            self.sent = Vec::new();
            return false;
        }
        true
    }
}

impl Observer<Body> for Keep {
    fn data(&mut self, data: &Bytes, _: &Body) {
        if !self.copying() {
            return;
        }
        self.kept += data.len();
        if self.kept <= MAX_KEPT {
            self.sent.push(Frame::data(data.clone()));
        } else {
            self.sent = Vec::new();
        }
    }

    fn trailers(&mut self, trailers: &HeaderMap, _: &Body) {
        if self.copying() {
            self.sent.push(Frame::trailers(trailers.clone()));
        }
    }

    fn error(&mut self, error: BoxError, _: &mut Body, _: &mut Context<'_>) -> Poll<BoxError> {
        // (a failed body is not sent again)
        self.kept = usize::MAX;
        Poll::Ready(error)
    }

    fn end(&mut self) {
        self.ended = true;
    }

    fn dropped(&mut self, body: &mut Body) {
        if !self.wanted() {
            return;
        }
        let back = if self.kept > MAX_KEPT {
            State::Spent
        } else {
            let rest = (!self.ended).then(|| std::mem::take(body));
            State::Back(std::mem::take(&mut self.sent), rest)
        };
        *self.shared.state() = back;
        self.shared.back.notify_waiters();
    }
}

/// A body sent again: the frames already sent once (last first), then the rest.
struct Replayed {
    sent: Vec<Frame<Bytes>>,
    rest: Option<Body>,
}

impl HttpBody for Replayed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(frame) = this.sent.pop() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match &mut this.rest {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.sent.is_empty() && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }
}

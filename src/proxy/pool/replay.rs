//! A request kept so that it can go again when an HTTP/2 upstream did not process it (a
//! stream above a GOAWAY's `last_stream_id`, or refused with `REFUSED_STREAM`: RFC 9113
//! §8.7).
//!
//! The head is cloned. The body is handed to hyper inside a [`Kept`] body that copies the
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
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::Notify;

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
    /// not polled yet: the body as it came
    Untouched(Body),
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
            let hint = req.body().size_hint();
            let inner = std::mem::take(req.body_mut());
            let shared = Arc::new(Shared {
                state: Mutex::new(State::Untouched(inner)),
                back: Notify::new(),
            });
            *req.body_mut() = Kept::new(&shared, hint).boxed();
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

    /// The body to send again: as it came, or what was sent followed by the rest.
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
            State::Untouched(body) => Some(body),
            State::Back(mut sent, rest) => {
                // (popped from the end)
                sent.reverse();
                Some(Replayed { sent, rest }.boxed())
            }
            State::Out | State::Spent => None,
        }
    }
}

/// The body hyper sends: the real one, copied while it is small enough to send again.
struct Kept {
    /// (held strongly: the body goes on being sent after the response head came and the
    /// [`Again`] is gone; with that, the copy stops)
    shared: Arc<Shared>,
    inner: Option<Body>,
    sent: Vec<Frame<Bytes>>,
    kept: usize,
    ended: bool,
    hint: SizeHint,
}

impl Kept {
    fn new(shared: &Arc<Shared>, hint: SizeHint) -> Kept {
        Kept {
            shared: shared.clone(),
            inner: None,
            sent: Vec::new(),
            kept: 0,
            ended: false,
            hint,
        }
    }

    /// The body, from the shared place on the first poll.
    fn inner(&mut self) -> Option<&mut Body> {
        if self.inner.is_none() {
            let mut state = self.shared.state();
            if let State::Untouched(body) = std::mem::replace(&mut *state, State::Out) {
                self.inner = Some(body);
            }
        }
        self.inner.as_mut()
    }

    /// Whether the [`Again`] still is, to send the request again.
    fn wanted(&self) -> bool {
        Arc::strong_count(&self.shared) > 1
    }

    /// Copies `frame`, while the request can still go again and the copy is small enough.
    fn keep(&mut self, frame: &Frame<Bytes>) {
        if !self.wanted() || self.kept > MAX_KEPT {
            self.sent = Vec::new();
            return;
        }
        if let Some(data) = frame.data_ref() {
            self.kept += data.len();
            if self.kept <= MAX_KEPT {
                self.sent.push(Frame::data(data.clone()));
            } else {
                self.sent = Vec::new();
            }
        } else if let Some(trailers) = frame.trailers_ref() {
            self.sent.push(Frame::trailers(trailers.clone()));
        }
    }
}

impl HttpBody for Kept {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let Some(inner) = this.inner() else {
            return Poll::Ready(Some(Err("request body already given back".into())));
        };
        let polled = Pin::new(inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => this.keep(frame),
            Poll::Ready(None) => this.ended = true,
            // (a failed body is not sent again)
            Poll::Ready(Some(Err(_))) => this.kept = usize::MAX,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.as_ref().is_some_and(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        if !self.wanted() {
            return;
        }
        let Some(inner) = self.inner.take() else {
            // never polled: the body is still where it was
            return;
        };
        let back = if self.kept > MAX_KEPT {
            State::Spent
        } else {
            let rest = (!self.ended).then_some(inner);
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

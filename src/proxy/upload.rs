//! When the wait for a response head starts, for a request with a body.
//!
//! `timeouts.upstream_response` is the time the upstream has to answer, until the response head
//! arrives. A slow upload is not the upstream's delay. So while a body is being sent, the clock
//! restarts with every piece of it the upstream connection takes. Once the body has ended, the
//! upstream has the whole timeout to answer (nginx's `proxy_send_timeout` between writes, then
//! `proxy_read_timeout`). A body that makes no progress for the timeout is cut: a 408 when it
//! was waiting for the client (nginx's `client_body_timeout`), the upstream's 504 when the
//! upstream stopped taking it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::BodyExt;
use hyper::body::Body as _;
use tokio::time::Instant;

use super::pool::Waits;
use super::{Body, BoxError};
use crate::body::{Observed, Observer};

/// How a request body's upload is going: written by the body as the upstream connection reads
/// it, read by the wait for the response head.
#[derive(Debug)]
pub struct Upload {
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy)]
struct State {
    /// the last progress: the request sent, a piece of the body taken, or its end
    last: Instant,
    /// the body has ended
    done: bool,
    /// the body's last read found nothing from the client yet
    waiting_on_client: bool,
}

impl Upload {
    /// Watches `body`: the body to send instead, and its upload's progress.
    pub fn watch(body: Body) -> (Body, Arc<Upload>) {
        let upload = Arc::new(Upload {
            state: Mutex::new(State {
                last: Instant::now(),
                done: false,
                waiting_on_client: false,
            }),
        });
        let watched = Observed::new(body, Watch(upload.clone()));
        (watched.boxed(), upload)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the upload stalled waiting for the client (rather than for the upstream to take
    /// it, or after it ended).
    pub fn stalled_on_client(&self) -> bool {
        let s = self.state();
        !s.done && s.waiting_on_client
    }

    fn moved(&self, done: bool) {
        let mut s = self.state();
        s.last = Instant::now();
        s.waiting_on_client = false;
        s.done |= done;
    }
}

/// Awaits `head` until `timeout` passes with neither a response head nor progress of the
/// upload (none: from `start`), not counting a wait for an HTTP/2 stream (`waits`). `None`
/// when it passed.
///
/// (`head` is borrowed, pinned where the caller keeps it: taken by value, the request's
/// ~800-byte exchange would be copied into this future and again into its `Timeout`, and held
/// twice in it.)
pub async fn head_in_time<F: Future>(
    mut head: Pin<&mut F>,
    upload: Option<&Upload>,
    waits: &Waits,
    timeout: Duration,
    start: Instant,
) -> Option<F::Output> {
    let mut deadline = start + timeout;
    loop {
        if let Ok(answer) = tokio::time::timeout_at(deadline, head.as_mut()).await {
            return Some(answer);
        }
        let now = Instant::now();
        // a wait for an HTTP/2 stream is not the upstream's time (the pool bounds it)
        let (waited, waiting) = waits.waited();
        let mut next = if waiting {
            now + timeout
        } else {
            start + waited + timeout
        };
        if let Some(upload) = upload {
            next = next.max(upload.state().last + timeout);
        }
        if next <= now {
            return None;
        }
        deadline = next;
    }
}

/// Reports a request body's progress to its [`Upload`].
struct Watch(Arc<Upload>);

impl Observer<Body> for Watch {
    fn pending(&mut self, _: &mut Context<'_>) -> Poll<BoxError> {
        self.0.state().waiting_on_client = true;
        Poll::Pending
    }

    fn data(&mut self, _: &Bytes, body: &Body) {
        self.0.moved(body.is_end_stream());
    }

    fn trailers(&mut self, _: &HeaderMap, body: &Body) {
        self.0.moved(body.is_end_stream());
    }

    fn error(&mut self, error: BoxError, _: &mut Body, _: &mut Context<'_>) -> Poll<BoxError> {
        self.0.moved(true);
        Poll::Ready(error)
    }

    fn end(&mut self) {
        self.0.moved(true);
    }

    fn ends(&self) {
        let mut s = self.0.state();
        if !s.done {
            s.done = true;
            s.last = Instant::now();
        }
    }
}

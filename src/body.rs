//! One way to watch a body as it passes: [`Observed`] polls the body it wraps and tells its
//! [`Observer`] what came. Counting bytes, writing the access line, reading a charge from the
//! trailers, timing an upload, holding slots, keeping a request in flight, handing a connection
//! back to its pool and keeping a request to send again are all observers.
//!
//! The wrapper is generic: each use is its own type, with no `dyn` call, allocation or `Arc` of
//! its own. `is_end_stream` and `size_hint` are the wrapped body's. Bodies that make frames
//! rather than watch them are not observers (see ARCHITECTURE.md).

use std::pin::Pin;
use std::task::{Context, Poll};

use http::HeaderMap;
use hyper::body::{Body, Frame, SizeHint};

/// What watches a body of type `B`. Every hook has a default that does nothing, so an observer
/// writes only the ones it needs. The body's frames pass on unchanged.
pub trait Observer<B: Body> {
    /// Before each poll of the body: an error returned answers the poll in the body's place,
    /// and the body is not polled.
    fn before(&mut self, _cx: &mut Context<'_>) -> Option<B::Error> {
        None
    }

    /// The body had nothing yet. A deadline can end the wait: an error returned goes to
    /// [`Observer::error`] as the body's own would.
    fn pending(&mut self, _cx: &mut Context<'_>) -> Poll<B::Error> {
        Poll::Pending
    }

    /// A data frame passes; `body` is the body after it.
    fn data(&mut self, _data: &B::Data, _body: &B) {}

    /// A trailers frame passes; `body` is the body after it.
    fn trailers(&mut self, _trailers: &HeaderMap, _body: &B) {}

    /// The body failed with `error`. Ready, the error is the poll's answer; pending, it is held
    /// back, and the observer must have arranged a wake-up.
    fn error(&mut self, error: B::Error, _body: &mut B, _cx: &mut Context<'_>) -> Poll<B::Error> {
        Poll::Ready(error)
    }

    /// The body ended: its poll gave `None`.
    fn end(&mut self) {}

    /// The body said it has ended (`is_end_stream`), perhaps before it was ever polled.
    fn ends(&self) {}

    /// The body is dropped, at its end or before it: whoever reads it gave up, or is done.
    fn dropped(&mut self, _body: &mut B) {}
}

/// A body watched by an [`Observer`].
pub struct Observed<B: Body, O: Observer<B>> {
    body: B,
    observer: O,
}

impl<B: Body, O: Observer<B>> Observed<B, O> {
    /// `body`, watched by `observer`.
    pub fn new(body: B, observer: O) -> Observed<B, O> {
        Observed { body, observer }
    }

    /// The body watched.
    pub fn body(&self) -> &B {
        &self.body
    }

    /// The observer.
    pub fn observer_mut(&mut self) -> &mut O {
        &mut self.observer
    }
}

impl<B, O> Body for Observed<B, O>
where
    B: Body + Unpin,
    O: Observer<B> + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = &mut *self;
        if let Some(error) = this.observer.before(cx) {
            return Poll::Ready(Some(Err(error)));
        }
        let error = match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Pending => match this.observer.pending(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(error) => error,
            },
            Poll::Ready(None) => {
                this.observer.end();
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.observer.data(data, &this.body);
                } else if let Some(trailers) = frame.trailers_ref() {
                    this.observer.trailers(trailers, &this.body);
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(Some(Err(error))) => error,
        };
        this.observer
            .error(error, &mut this.body, cx)
            .map(|error| Some(Err(error)))
    }

    fn is_end_stream(&self) -> bool {
        let end = self.body.is_end_stream();
        if end {
            self.observer.ends();
        }
        end
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B: Body, O: Observer<B>> Drop for Observed<B, O> {
    fn drop(&mut self) {
        self.observer.dropped(&mut self.body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full, StreamBody};

    /// What an observer saw, in order.
    #[derive(Default)]
    struct Seen(Vec<String>);

    impl<B: Body<Data = Bytes>> Observer<B> for Seen
    where
        B::Error: std::fmt::Display,
    {
        fn data(&mut self, data: &Bytes, _: &B) {
            self.0.push(format!("data {}", data.len()));
        }
        fn trailers(&mut self, trailers: &HeaderMap, _: &B) {
            self.0.push(format!("trailers {}", trailers.len()));
        }
        fn error(&mut self, error: B::Error, _: &mut B, _: &mut Context<'_>) -> Poll<B::Error> {
            self.0.push(format!("error {error}"));
            Poll::Ready(error)
        }
        fn end(&mut self) {
            self.0.push("end".into());
        }
        fn dropped(&mut self, _: &mut B) {
            self.0.push("dropped".into());
        }
    }

    type Frames = Vec<Result<Frame<Bytes>, String>>;

    fn stream(frames: Frames) -> impl Body<Data = Bytes, Error = String> + Unpin {
        StreamBody::new(futures_util::stream::iter(frames))
    }

    /// Each frame, the end and the drop reach the observer, and the frames pass unchanged.
    #[tokio::test]
    async fn the_observer_sees_every_frame_and_the_end() {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-used", "7".parse().unwrap());
        let frames: Frames = vec![
            Ok(Frame::data(Bytes::from_static(b"abc"))),
            Ok(Frame::data(Bytes::from_static(b"de"))),
            Ok(Frame::trailers(trailers)),
        ];
        let mut body = Observed::new(stream(frames), Seen::default());
        let mut passed = Vec::new();
        while let Some(frame) = body.frame().await {
            passed.push(frame.unwrap().into_data().map_or(0, |d| d.len()));
        }
        assert_eq!(passed, [3, 2, 0]);
        assert_eq!(
            body.observer_mut().0,
            ["data 3", "data 2", "trailers 1", "end"]
        );
    }

    /// An error reaches the observer and the reader; a body dropped unread is told so.
    #[tokio::test]
    async fn the_observer_sees_an_error_and_the_drop() {
        let frames: Frames = vec![Ok(Frame::data(Bytes::from_static(b"x"))), Err("cut".into())];
        let mut body = Observed::new(stream(frames), Seen::default());
        assert!(body.frame().await.unwrap().is_ok());
        assert_eq!(body.frame().await.unwrap().unwrap_err(), "cut");
        assert_eq!(body.observer_mut().0, ["data 1", "error cut"]);

        let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        struct Dropped(std::rc::Rc<std::cell::RefCell<Vec<bool>>>);
        impl Observer<Full<Bytes>> for Dropped {
            fn dropped(&mut self, body: &mut Full<Bytes>) {
                self.0.borrow_mut().push(body.is_end_stream());
            }
        }
        drop(Observed::new(
            Full::new(Bytes::from_static(b"unread")),
            Dropped(log.clone()),
        ));
        assert_eq!(*log.borrow(), [false]);
    }

    /// `before` and `pending` can fail the poll in the body's place; the body's end and size
    /// show through.
    #[tokio::test]
    async fn hooks_can_fail_the_poll() {
        let body = Observed::new(Full::new(Bytes::from_static(b"four")), Seen::default());
        assert_eq!(body.size_hint().exact(), Some(4));
        assert!(!body.is_end_stream());

        struct Late(bool);
        impl<B: Body<Error = String>> Observer<B> for Late {
            fn before(&mut self, _: &mut Context<'_>) -> Option<String> {
                std::mem::take(&mut self.0).then(|| "held".to_string())
            }
            fn pending(&mut self, _: &mut Context<'_>) -> Poll<String> {
                Poll::Ready("stalled".into())
            }
        }
        let never = futures_util::stream::pending::<Result<Frame<Bytes>, String>>();
        let mut body = Observed::new(StreamBody::new(never), Late(true));
        assert_eq!(body.frame().await.unwrap().unwrap_err(), "held");
        assert_eq!(body.frame().await.unwrap().unwrap_err(), "stalled");
    }
}

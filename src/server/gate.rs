//! A future polled only when one of its own wake-ups came.
//!
//! A connection's task is woken for its HTTP work (a request's bytes, an upstream's response,
//! the end of a pass) far more often than for its deadlines and shutdown, yet `select!` polls
//! every branch on every wake. Polling the stop watch, the head `Notify` and the deadline timer
//! on every wake cost a measurable share of a request (BENCHMARKS.md). Behind a [`Gate`] they are polled when their own
//! wakers fired, and not otherwise.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// Gates one future at a time (see [`Gate::poll`]); reused across the futures of a connection.
pub(super) struct Gate {
    shared: Arc<Woken>,
    waker: Waker,
}

/// What the gated future's wakers reach: the flag that lets it be polled, and the task to wake.
struct Woken {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(task) = task.as_ref() {
            task.wake_by_ref();
        }
    }
}

impl Gate {
    pub(super) fn new() -> Gate {
        let shared = Arc::new(Woken {
            woken: AtomicBool::new(true),
            task: Mutex::new(None),
        });
        let waker = Waker::from(shared.clone());
        Gate { shared, waker }
    }

    /// Lets the next [`Gate::poll`] through: for a new future, which has registered no waker.
    pub(super) fn open(&self) {
        self.shared.woken.store(true, Ordering::Release);
    }

    /// Polls `fut` when it was woken since its last poll (or the gate was opened), with a waker
    /// that marks it woken and wakes the task of `cx`; otherwise pending, without polling it.
    pub(super) fn poll<F: Future>(
        &self,
        fut: Pin<&mut F>,
        cx: &mut Context<'_>,
    ) -> Poll<F::Output> {
        {
            // the task is stored before the flag is taken: a wake after this reaches it
            let mut task = self.shared.task.lock().unwrap_or_else(|e| e.into_inner());
            match task.as_ref() {
                Some(known) if known.will_wake(cx.waker()) => {}
                _ => *task = Some(cx.waker().clone()),
            }
        }
        if !self.shared.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        fut.poll(&mut Context::from_waker(&self.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wake-ups of the task.
    struct Task(AtomicUsize);

    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A gated future is polled when new, then not while the task is polled for other reasons,
    /// then again once its own waker fired, which wakes the task.
    #[test]
    fn a_gated_future_is_polled_only_after_its_own_wake_up() {
        let task = Arc::new(Task(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        let notify = tokio::sync::Notify::new();
        let mut notified = std::pin::pin!(notify.notified());
        let polls = std::cell::Cell::new(0);
        let mut counted = std::pin::pin!(poll_fn(|cx| {
            polls.set(polls.get() + 1);
            notified.as_mut().poll(cx)
        }));
        let gate = Gate::new();
        assert!(
            gate.poll(counted.as_mut(), &mut cx).is_pending(),
            "new: polled"
        );
        for _ in 0..3 {
            assert!(
                gate.poll(counted.as_mut(), &mut cx).is_pending(),
                "not woken: skipped"
            );
        }
        assert_eq!(task.0.load(Ordering::SeqCst), 0);
        notify.notify_one();
        assert_eq!(
            task.0.load(Ordering::SeqCst),
            1,
            "its wake-up reaches the task"
        );
        assert!(
            gate.poll(counted.as_mut(), &mut cx).is_ready(),
            "woken: polled, done"
        );
        assert_eq!(
            polls.get(),
            2,
            "polled when new and once woken, not in between"
        );
    }
}

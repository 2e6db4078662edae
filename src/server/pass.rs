//! Responses of one scheduler pass written together.
//!
//! A worker runs its ready connections one after another in a pass of its runtime. Without
//! this, a connection whose upstream answered writes its response at once, so the responses
//! of a pass go out spread between the other connections' reads and sends, and a client
//! waiting on several of them (wrk, a browser, another proxy) is woken for each one. HAProxy
//! orders its pass the other way: every ready read first, then every send. A response whose
//! worker has other requests under way therefore waits for the end of the pass (one
//! [`tokio::task::yield_now`]: the runtime wakes such tasks after it has polled its I/O
//! again), and the responses of a pass leave together. A client waiting on several is then
//! woken once for them, and less often than under HAProxy (BENCHMARKS.md, "Decisions the figures made").
//!
//! A request alone on its worker is answered at once: there is nothing to wait for.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

thread_local! {
    /// Requests being handled by the connections of this thread's runtime. Worker runtimes are
    /// single-threaded; on a multi-threaded one (the tests') a task may end on another thread
    /// than it began, so each request keeps the count it was added to.
    static HANDLING: Arc<AtomicUsize> = Arc::new(AtomicUsize::new(0));
}

/// Held while a request is handled, up to the moment its response is ready.
pub(super) struct Handling(Arc<AtomicUsize>);

impl Handling {
    pub(super) fn start() -> Handling {
        HANDLING.with(|n| {
            n.fetch_add(1, Relaxed);
            Handling(n.clone())
        })
    }

    /// How many other requests of the thread this one began on are being handled.
    fn others(&self) -> usize {
        self.0.load(Relaxed).saturating_sub(1)
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Ends a request's handling; lets the rest of the pass run first when other requests of its
/// thread are under way.
pub(super) async fn end_of_pass(handling: Handling) {
    let others = handling.others();
    drop(handling);
    if others > 0 && crate::turns::on() {
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request alone on its thread is answered at once; one of two waits for the pass; a
    /// request dropped while handled (its client gone) is counted out; a request that ends on
    /// another thread than it began takes itself off its first thread's count.
    #[test]
    fn a_response_waits_only_when_other_requests_are_under_way() {
        let alone = Handling::start();
        assert_eq!(alone.others(), 0, "nothing else is under way");
        drop(alone);
        let first = Handling::start();
        let second = Handling::start();
        assert_eq!(first.others(), 1, "the second request is still under way");
        drop(first);
        assert_eq!(second.others(), 0, "the last one has nothing to wait for");
        drop(second);
        let moved = Handling::start();
        std::thread::spawn(move || drop(moved)).join().unwrap();
        assert_eq!(Handling::start().others(), 0);
    }
}

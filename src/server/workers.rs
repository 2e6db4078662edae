//! Worker threads, one single-threaded tokio runtime each, as nginx's and HAProxy's workers: a
//! connection is accepted once and then lives its whole life on one thread, with the upstream
//! connections that thread's pool keeps ([`crate::proxy::UpstreamClients`]). No work stealing,
//! no cross-thread wake-up between a client connection and its upstream connection.
//!
//! Worker 0 is the runtime that runs the server (the one `main` builds, or a test's); the
//! others are threads started here. Against tokio's multi-thread scheduler, two workers took
//! less CPU per request, and one worker about the same (BENCHMARKS.md).
//!
//! What is process-wide stays on worker 0: the accept loops, the admin server, the reloader.
//! Each worker has its own Redis connection too ([`crate::store::set_worker`]), driven by its
//! own runtime (on a Cluster, one to each primary), and its own slot in the request metrics
//! ([`crate::metrics::set_thread_slot`]). Connections are handed out round robin, worker 0
//! included.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::watch;

/// How long a stopping worker waits for the blocking work its tasks started.
const STOP_BLOCKING: Duration = Duration::from_millis(500);

/// The worker threads of one server.
pub(crate) struct Workers {
    /// workers 1.. (worker 0 is the server's own runtime)
    others: Vec<Handle>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    stop: watch::Sender<bool>,
    next: AtomicUsize,
}

impl Workers {
    /// `count` workers in all: the calling runtime and `count - 1` new threads.
    pub(crate) fn start(count: usize) -> std::io::Result<Workers> {
        let (stop, stopped) = watch::channel(false);
        let mut others = Vec::new();
        let mut threads = Vec::new();
        for k in 1..count.max(1) {
            // The runtime is built on its own thread (a runtime must not be dropped inside
            // another's async context, as it would be here if the thread failed to start).
            let (handle_tx, handle_rx) = std::sync::mpsc::channel();
            let mut stopped = stopped.clone();
            let thread = std::thread::Builder::new()
                .name(format!("tollgate-w{k}"))
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(runtime) => runtime,
                        Err(e) => {
                            let _ = handle_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = handle_tx.send(Ok(runtime.handle().clone()));
                    crate::store::set_worker(k);
                    crate::metrics::set_thread_slot(k);
                    // the runtime runs its connections' tasks while this waits
                    runtime.block_on(async move {
                        let _ = stopped.wait_for(|stop| *stop).await;
                    });
                    // whatever is left after the drain is cancelled; blocking work it started
                    // (a DNS lookup) is not waited for long
                    runtime.shutdown_timeout(STOP_BLOCKING);
                })?;
            threads.push(thread);
            let handle = handle_rx.recv().map_err(|_| {
                std::io::Error::other("a worker thread ended before its runtime started")
            })??;
            others.push(handle);
        }
        Ok(Workers {
            others,
            threads: Mutex::new(threads),
            stop,
            next: AtomicUsize::new(0),
        })
    }

    /// How many workers there are (worker 0 included).
    pub(crate) fn count(&self) -> usize {
        self.others.len() + 1
    }

    /// Runs `serve` for an accepted connection on the next worker in turn, with that worker's
    /// number. Called on worker 0, where the stream was accepted.
    pub(crate) fn spawn<F, Fut>(&self, stream: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream, usize) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let k = self.next.fetch_add(1, Ordering::Relaxed) % self.count();
        if k == 0 {
            tokio::spawn(serve(stream, 0));
            return;
        }
        // the socket moves to the worker's own reactor
        let std = match stream.into_std() {
            Ok(std) => std,
            Err(e) => {
                tracing::debug!(error = %e, "cannot hand a connection to a worker");
                return;
            }
        };
        self.others[k - 1].spawn(async move {
            match TcpStream::from_std(std) {
                Ok(stream) => serve(stream, k).await,
                Err(e) => tracing::debug!(error = %e, "cannot hand a connection to a worker"),
            }
        });
    }

    /// Stops the worker threads, cancelling what is still running on them, and waits for them.
    pub(crate) async fn stop(&self) {
        let _ = self.stop.send(true);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}

//! WebSocket tunnels. Once the upstream accepts an upgrade with 101, the two connections'
//! bytes are copied both ways in a task of their own. The task holds the request's
//! concurrency slots until the tunnel closes.

use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_util::task::TaskTracker;

use super::slots::Held;

/// The two sides of a switch of protocols the upstream accepted, not yet upgraded.
pub(super) struct Tunnel {
    pub(super) client: OnUpgrade,
    pub(super) upstream: OnUpgrade,
}

impl Tunnel {
    /// Runs the tunnel to `upstream` on `tasks`, so that shutdown waits for it, closing it
    /// after `idle` without a byte either way. It holds the request's slots, `held`.
    pub(super) fn open(self, tasks: &TaskTracker, upstream: &str, idle: Duration, held: Held) {
        let name = upstream.to_string();
        tasks.spawn(tunnel(self.client, self.upstream, name, idle, held));
    }
}

/// Copies an upgraded connection's bytes both ways until either side closes, or until no byte
/// has passed either way for `idle` (as nginx closes a WebSocket tunnel after
/// `proxy_read_timeout`: a silent tunnel, which no limit counts after its handshake, must not
/// be held for ever). Runs as its own task: the request handler has already returned the 101.
/// The request's concurrency slots, `_held`, are released when it ends.
async fn tunnel(client: OnUpgrade, upstream: OnUpgrade, name: String, idle: Duration, _held: Held) {
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(both) => both,
        Err(e) => {
            tracing::debug!(upstream = %name, error = %e, "upgrade failed");
            return;
        }
    };
    // (both sides and the watch run in this one task: the counter is borrowed, not shared)
    let moved = std::sync::atomic::AtomicU64::new(0);
    let mut client = Moving {
        io: TokioIo::new(client),
        moved: &moved,
    };
    let mut upstream = Moving {
        io: TokioIo::new(upstream),
        moved: &moved,
    };
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    let watch = async {
        // wakes once per `idle`: closes when no byte moved since the wake before
        let mut seen = moved.load(Ordering::Relaxed);
        loop {
            tokio::time::sleep(idle).await;
            let now = moved.load(Ordering::Relaxed);
            if now == seen {
                return;
            }
            seen = now;
        }
    };
    tokio::select! {
        copied = copy => if let Err(e) = copied {
            tracing::debug!(upstream = %name, error = %e, "upgraded connection ended with an error");
        },
        () = watch => tracing::debug!(upstream = %name, ?idle, "upgraded connection idle: closed"),
    }
}

/// An upgraded connection's side, counting the bytes read from it into a counter the two
/// sides share (every byte copied is read once).
struct Moving<'a, T> {
    io: T,
    moved: &'a std::sync::atomic::AtomicU64,
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Moving<'_, T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if read > 0 {
            self.moved.fetch_add(read as u64, Ordering::Relaxed);
        }
        polled
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Moving<'_, T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

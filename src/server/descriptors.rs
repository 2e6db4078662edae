//! File descriptors kept for the proxy, and running out of them said once.
//!
//! Every open connection holds a descriptor, and the process has `RLIMIT_NOFILE` of them. The
//! admin listener must not spend the ones the proxy needs: it holds connections only while a
//! share of the limit ([`Descriptors::admin_room`]) stays free, and when an `accept` on any
//! listener fails with `EMFILE` or `ENFILE` the descriptors are [short](Descriptors::exhausted):
//! the admin listener stops accepting and closes its idle connections until no accept has
//! failed for [`QUIET`]. One warning says when that starts and one line when it ends, however
//! many accepts fail meanwhile.
//!
//! This module does not own the listeners: the accept loops report to it and ask it.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// How long after the last failed accept the descriptors count as short: long enough that a
/// flood which keeps them near the limit is one episode in the log, not one a second.
pub(crate) const QUIET: Duration = Duration::from_secs(2);

/// How long an accept loop waits after an accept failed for want of descriptors: the failed
/// connection stays in the listen backlog, so retrying at once would spin.
pub(crate) const BACK_OFF: Duration = Duration::from_millis(50);

/// The share of `RLIMIT_NOFILE` the admin listener leaves free: a quarter, and at least 16.
/// With the common limit of 1024 that keeps 256 for the proxy, as many as the admin's default
/// `max_connections` could take.
fn reserve(limit: u64) -> u64 {
    (limit / 4).max(16)
}

/// The process's descriptor budget, shared by the accept loops of one server.
#[derive(Debug)]
pub(crate) struct Descriptors {
    /// the soft `RLIMIT_NOFILE`, when known (read from `/proc/self/limits`)
    limit: Option<u64>,
    origin: Instant,
    /// whether an episode of running short is under way (and was logged)
    short: AtomicBool,
    /// when an accept last failed for want of descriptors, in ms since `origin`
    failed_at: AtomicU64,
    /// bumped at each failed accept: the admin connections that are idle then close
    shed: watch::Sender<u64>,
}

impl Default for Descriptors {
    fn default() -> Self {
        Descriptors::with_limit(soft_limit())
    }
}

impl Descriptors {
    /// A budget for a process whose soft descriptor limit is `limit` (`None`: unknown, so only
    /// failed accepts tell that descriptors ran out).
    pub(crate) fn with_limit(limit: Option<u64>) -> Descriptors {
        Descriptors {
            limit,
            origin: Instant::now(),
            short: AtomicBool::new(false),
            failed_at: AtomicU64::new(0),
            shed: watch::Sender::new(0),
        }
    }

    /// An accept on `listener` failed with `error`. Returns whether it was for want of
    /// descriptors; then the caller backs off for [`BACK_OFF`]. Other failures (a connection
    /// reset before it was accepted) concern one connection and are logged at debug.
    pub(crate) fn accept_failed(&self, listener: &'static str, error: &io::Error) -> bool {
        // EMFILE (the process's limit) and ENFILE (the system's); ENOBUFS and ENOMEM as well,
        // which the same backlog would meet again at once
        if !matches!(error.raw_os_error(), Some(23 | 24 | 12 | 105)) {
            tracing::debug!(listener, error = %error, "accept failed");
            return false;
        }
        self.exhausted(listener, error);
        true
    }

    fn exhausted(&self, listener: &'static str, error: &io::Error) {
        self.failed_at.store(self.now_ms(), Ordering::SeqCst);
        self.shed.send_modify(|n| *n += 1);
        if !self.short.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                listener,
                error = %error,
                limit = self.limit,
                "file descriptors ran out: the admin listener stops accepting and closes its \
                 idle connections until they are back"
            );
        }
    }

    /// Whether descriptors are short now. Ends an episode (and says so) once no accept failed
    /// for [`QUIET`]. Cheap while none is under way: the proxy's accept loop asks it on every
    /// connection.
    pub(crate) fn short(&self) -> bool {
        if !self.short.load(Ordering::Relaxed) {
            return false;
        }
        let since = self
            .now_ms()
            .saturating_sub(self.failed_at.load(Ordering::SeqCst));
        if since < ms(QUIET) {
            return true;
        }
        if self.short.swap(false, Ordering::SeqCst) {
            tracing::info!("file descriptors are available again: the admin listener accepts");
        }
        false
    }

    /// An accept succeeded: ends an episode of running short once it has been quiet.
    pub(crate) fn accepted(&self) {
        let _ = self.short();
    }

    /// Whether the admin listener may hold one more connection: descriptors are not short,
    /// and the open ones leave the proxy its reserve (a quarter of the limit).
    pub(crate) fn admin_room(&self) -> bool {
        if self.short() {
            return false;
        }
        let Some(limit) = self.limit else {
            return true;
        };
        open_count().is_none_or(|open| open + reserve(limit) < limit)
    }

    /// Changes at each failed accept for want of descriptors: the admin connections watch it
    /// and the idle ones close.
    pub(crate) fn shedding(&self) -> watch::Receiver<u64> {
        self.shed.subscribe()
    }

    fn now_ms(&self) -> u64 {
        ms(self.origin.elapsed())
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 2)
}

/// The soft `RLIMIT_NOFILE`, from `/proc/self/limits` (Linux); `None` when unlimited or unknown.
fn soft_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_soft_limit(&limits)
}

/// The soft limit on the `Max open files` line of a `/proc/<pid>/limits` text.
fn parse_soft_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How many descriptors the process has open (Linux: the entries of `/proc/self/fd`, less the
/// one reading it holds).
fn open_count() -> Option<u64> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    let n = u64::try_from(entries.count()).unwrap_or(u64::MAX);
    Some(n.saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The soft limit is the first number of the `Max open files` line; `unlimited` is none.
    #[test]
    fn reads_the_soft_limit() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max cpu time              unlimited            unlimited            seconds   \n\
                    Max open files            1024                 524288               files     \n";
        assert_eq!(parse_soft_limit(text), Some(1024));
        let unlimited = text.replace("1024 ", "unlimited");
        assert_eq!(parse_soft_limit(&unlimited), None);
        assert!(soft_limit().is_some(), "this process's own limit is read");
        assert!(
            open_count().is_some_and(|n| n >= 3),
            "stdin, stdout, stderr"
        );
    }

    /// The admin listener keeps a quarter of the limit free: a limit this process already
    /// uses more than three quarters of leaves it no room; a large one does.
    #[test]
    fn the_admin_leaves_a_quarter_free() {
        let open = open_count().expect("linux");
        assert!(!Descriptors::with_limit(Some(open)).admin_room());
        assert!(Descriptors::with_limit(Some(open * 4 + 100)).admin_room());
        assert!(Descriptors::with_limit(None).admin_room(), "unknown limit");
    }

    /// A failed accept for want of descriptors starts one episode, however many follow; it
    /// ends once none failed for QUIET. Other failures start none.
    #[tokio::test(start_paused = true)]
    async fn running_short_is_one_episode_until_quiet() {
        let d = Descriptors::with_limit(None);
        let mut shed = d.shedding();
        let reset = io::Error::from_raw_os_error(104);
        assert!(!d.accept_failed("proxy", &reset));
        assert!(!d.short());
        let emfile = io::Error::from_raw_os_error(24);
        for _ in 0..5 {
            assert!(d.accept_failed("proxy", &emfile));
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        assert!(
            shed.has_changed().unwrap_or(false),
            "idle admin connections told"
        );
        assert!(shed.borrow_and_update().eq(&5));
        assert!(d.short() && !d.admin_room());
        tokio::time::advance(QUIET - Duration::from_millis(200)).await;
        assert!(d.short(), "not yet quiet");
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(!d.short(), "quiet: over");
        assert!(d.admin_room());
    }
}

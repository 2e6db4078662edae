//! The clients each limit refuses most on this instance, counted as the proxy refuses them, in
//! fixed memory ([`topk`]). The proxy adds to it; the operator console reads it. It uses nothing
//! else of the crate.

pub mod topk;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use topk::Windowed;

/// Clients kept per limit and per slot in its summary of refusals.
const KEPT_CLIENTS: usize = 64;

/// The clients each limit refused most on this instance over the last minute, by route and
/// limit. Kept across reloads; a limit that goes away takes its summary with it at the next
/// reload.
pub struct Refusals {
    /// route, then limit: looked up by the names' text, so a refusal copies no name
    routes: Mutex<HashMap<Arc<str>, ByLimit>>,
    /// the summaries' time: since `started`, plus what [`Refusals::skip`] added
    started: Instant,
    skipped_ms: AtomicU64,
}

/// One route's summaries, by limit name.
type ByLimit = HashMap<Arc<str>, Windowed>;

impl Default for Refusals {
    fn default() -> Refusals {
        Refusals {
            routes: Mutex::default(),
            started: Instant::now(),
            skipped_ms: AtomicU64::new(0),
        }
    }
}

impl Refusals {
    /// Moves the summaries' clock on by `by`, as if that much time had passed: lets a test see
    /// a refusal leave the last minute without waiting for it.
    pub fn skip(&self, by: Duration) {
        self.skipped_ms
            .fetch_add(by.as_millis() as u64, Ordering::Relaxed);
    }

    fn now(&self) -> Duration {
        self.started.elapsed() + Duration::from_millis(self.skipped_ms.load(Ordering::Relaxed))
    }

    /// Counts one refusal of `client`, in its written form ([`crate::identity::shown_client`]),
    /// by limit `limit` of route `route`.
    pub fn add(&self, route: &Arc<str>, limit: &Arc<str>, client: &str) {
        let now = self.now();
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let limits = match routes.get_mut(&**route) {
            Some(limits) => limits,
            None => routes.entry(route.clone()).or_default(),
        };
        match limits.get_mut(&**limit) {
            Some(top) => top.add(now, client),
            None => limits
                .entry(limit.clone())
                .or_insert_with(|| Windowed::new(KEPT_CLIENTS))
                .add(now, client),
        }
    }

    /// The clients limit `limit` of route `route` refused most in the last minute, most first.
    pub fn top(&self, route: &str, limit: &str, n: usize) -> Vec<topk::Entry> {
        let now = self.now();
        let routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        routes
            .get(route)
            .and_then(|limits| limits.get(limit))
            .map(|top| top.top(now, n))
            .unwrap_or_default()
    }

    /// Forgets the limits for which `kept(route, limit)` is false: those a new config no
    /// longer has.
    pub fn keep_only(&self, kept: impl Fn(&str, &str) -> bool) {
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        routes.retain(|route, limits| {
            limits.retain(|limit, _| kept(route, limit));
            !limits.is_empty()
        });
    }
}

//! Adaptive pacing, this instance's side: what the upstream answered in each period, reported
//! to the store, which keeps the fleet's one rate (`lua/adapt.lua`); and that rate, cached for
//! the pacer.
//!
//! Trouble is an answer of 429, 503 or 504, a failed connection, no answer in time (tollgate's
//! own 504), and with `target_latency` a response head slower than that. Any other answer is
//! healthy. An answer to a request whose slot was given at a higher rate than the one now in
//! force counts for nothing: the rate already fell for the trouble it was part of, and
//! counting it again would lower it twice for one episode.
//!
//! One task per process ([`tick`]) reports every adaptive upstream's period once it is over,
//! and reads back the rate in force. When the store fails, the rate stays the last one read.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::StatusCode;

use super::{Body, Proxy, ProxyError};
use crate::limit::{Aimd, Rate, Report};
use crate::store::Store;

/// One upstream's adaptive rate, as this instance last read it, and what it saw since its last
/// report.
pub struct Adapter {
    aimd: Aimd,
    target_latency: Option<Duration>,
    /// `<key_prefix>:upstream:<name>:rate`
    key: String,
    /// the rate in force, per second, as `f64` bits: read by every paced request
    rate: AtomicU64,
    healthy: AtomicU32,
    trouble: AtomicU32,
    /// when the period being counted began; `None` before the first report, which is made
    /// at the first tick so that a new instance (or a reload) learns the fleet's rate at once
    since: Mutex<Option<Instant>>,
}

/// What one forwarded request met at the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Met {
    /// it answered, or could not be reached in a way that is the upstream's doing
    Trouble,
    /// it answered in time, without trouble
    Healthy,
    /// nothing that says how the upstream fares (the client's body failed, say)
    Nothing,
}

impl Adapter {
    /// The adaptive rate kept at `key`, starting at `aimd`'s start until the store is read.
    pub fn new(aimd: Aimd, target_latency: Option<Duration>, key: String) -> Adapter {
        Adapter {
            aimd,
            target_latency,
            key,
            rate: AtomicU64::new(aimd.start().per_sec().to_bits()),
            healthy: AtomicU32::new(0),
            trouble: AtomicU32::new(0),
            since: Mutex::new(None),
        }
    }

    /// The rate in force, as this instance last read it.
    pub fn rate(&self) -> Rate {
        let rate = f64::from_bits(self.rate.load(Ordering::Relaxed));
        Rate::per_second(rate).unwrap_or(self.aimd.start())
    }

    /// The AIMD parameters.
    pub fn aimd(&self) -> &Aimd {
        &self.aimd
    }

    /// What the forward phase's `result` says of the upstream, `waited` after sending.
    pub fn met(&self, result: &Result<http::Response<Body>, ProxyError>, waited: Duration) -> Met {
        match result {
            Ok(resp) if trouble_status(resp.status()) => Met::Trouble,
            Ok(_) if self.target_latency.is_some_and(|t| waited > t) => Met::Trouble,
            Ok(_) => Met::Healthy,
            Err(ProxyError::UpstreamConnect { .. } | ProxyError::UpstreamTimeout { .. }) => {
                Met::Trouble
            }
            Err(_) => Met::Nothing,
        }
    }

    /// Counts what a request whose slot was given at `sent_at` (per second) met.
    pub fn observe(&self, sent_at: f64, met: Met) {
        // (a relative 1e-9: the same rate read back through the store is the same bits, but
        // a rate of the fleet's read on another instance may differ in its last digit)
        if sent_at > self.rate().per_sec() * (1.0 + 1e-9) {
            return;
        }
        match met {
            Met::Trouble => self.trouble.fetch_add(1, Ordering::Relaxed),
            Met::Healthy => self.healthy.fetch_add(1, Ordering::Relaxed),
            Met::Nothing => return,
        };
    }

    /// Reports the period that ended by `now`, if one did, and reads back the rate in force.
    /// Returns the rate read, if the store was asked and answered.
    pub async fn tick(&self, store: &dyn Store, now: Instant) -> Option<f64> {
        let report = {
            let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
            let period = Duration::from_secs_f64(self.aimd.period_ms() / 1000.0);
            match *since {
                Some(start) if now.duration_since(start) < period => return None,
                Some(_) => {}
                // (counts from before the first read are dropped: the rate they were paced at
                // was this instance's guess, not the fleet's)
                None => {
                    self.trouble.store(0, Ordering::Relaxed);
                    self.healthy.store(0, Ordering::Relaxed);
                }
            }
            *since = Some(now);
            let trouble = self.trouble.swap(0, Ordering::Relaxed);
            let healthy = self.healthy.swap(0, Ordering::Relaxed);
            match (trouble, healthy) {
                (0, 0) => Report::Quiet,
                (0, _) => Report::Healthy,
                _ => Report::Trouble,
            }
        };
        match store.adapt(&self.key, &self.aimd, report, None).await {
            Ok(rate) => {
                let was = f64::from_bits(self.rate.swap(rate.to_bits(), Ordering::Relaxed));
                if was != rate {
                    tracing::debug!(key = %self.key, report = report.as_str(), was, rate,
                        "adaptive pacing: rate moved");
                }
                Some(rate)
            }
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e,
                    "adaptive pacing: the store did not answer; the last rate stays");
                None
            }
        }
    }
}

/// The upstream's own answers that say it has more than it can take.
fn trouble_status(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT
    )
}

/// How often the task looks for periods that ended: a period starts up to this late.
pub const TICK: Duration = Duration::from_millis(50);

/// One tick of the task: every adaptive upstream of `proxy` whose period ended reports it,
/// and its rate in force goes to `tollgate_pace_rate`. False when `proxy` paces no upstream
/// adaptively: the task may then look less often.
pub async fn tick(proxy: &Arc<Proxy>) -> bool {
    let now = Instant::now();
    let mut seen: Vec<&str> = Vec::new();
    for (_, route) in proxy.routes.routes() {
        let upstream = &route.upstream;
        let Some(adapter) = upstream.pacer.as_ref().and_then(|p| p.adapt.as_ref()) else {
            continue;
        };
        if seen.contains(&&*upstream.name) {
            continue;
        }
        seen.push(&upstream.name);
        if let Some(rate) = adapter.tick(&*proxy.store, now).await {
            proxy.metrics.pace_rate(&upstream.name, rate);
        }
    }
    !seen.is_empty()
}

/// Each adaptive upstream of `new` starts at the rate its namesake in `old` last read, held
/// within its new bounds: a reload neither resets a rate the fleet has cut nor, while the
/// store is out, forgets it.
pub fn carry_over(old: &Proxy, new: &Proxy) {
    let before = adapters(old);
    for (name, adapter) in adapters(new) {
        let Some((_, was)) = before
            .iter()
            .find(|(n, a)| *n == name && a.key == adapter.key)
        else {
            continue;
        };
        let rate = was.rate().per_sec();
        let held = rate.clamp(adapter.aimd.min().per_sec(), adapter.aimd.max().per_sec());
        adapter.rate.store(held.to_bits(), Ordering::Relaxed);
        new.metrics.pace_rate(name, held);
    }
}

/// The adapters of `proxy`'s upstreams, with their upstream's name.
fn adapters(proxy: &Proxy) -> Vec<(&Arc<str>, &Adapter)> {
    proxy
        .routes
        .routes()
        .iter()
        .filter_map(|(_, route)| {
            let upstream = &route.upstream;
            let adapter = upstream.pacer.as_ref()?.adapt.as_ref()?;
            Some((&upstream.name, adapter))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use super::*;
    use crate::store::MemoryStore;

    fn adapter(target_latency: Option<Duration>) -> Adapter {
        let r = |x| Rate::per_second(x).unwrap();
        let aimd = Aimd::new(r(100.0), r(1.0), r(200.0), 1.0, 0.5, 500.0).unwrap();
        Adapter::new(aimd, target_latency, "t:upstream:api:rate".into())
    }

    fn answer(status: u16) -> Result<http::Response<Body>, ProxyError> {
        let status = StatusCode::from_u16(status).unwrap();
        Ok(super::super::respond::json(status, String::new()))
    }

    /// 429, 503 and 504 answers, connect failures and slow heads are trouble; other answers
    /// are healthy.
    #[test]
    fn what_counts_as_trouble() {
        let a = adapter(Some(Duration::from_millis(300)));
        let fast = Duration::from_millis(10);
        for status in [429, 503, 504] {
            assert_eq!(a.met(&answer(status), fast), Met::Trouble, "{status}");
        }
        for status in [200, 404, 500, 502] {
            assert_eq!(a.met(&answer(status), fast), Met::Healthy, "{status}");
        }
        assert_eq!(
            a.met(&answer(200), Duration::from_millis(301)),
            Met::Trouble
        );
        assert_eq!(
            adapter(None).met(&answer(200), Duration::from_secs(9)),
            Met::Healthy
        );
        let timeout = Err(ProxyError::UpstreamTimeout {
            upstream: "api".into(),
            after: fast,
        });
        assert_eq!(a.met(&timeout, fast), Met::Trouble);
        assert_eq!(a.met(&Err(ProxyError::BadBody), fast), Met::Nothing);
    }

    /// The memory store on a clock the test moves, recording each report.
    struct Recorder {
        inner: MemoryStore,
        clock_ms: std::sync::Mutex<f64>,
        reports: std::sync::Mutex<Vec<Report>>,
    }

    impl Recorder {
        fn at(&self, ms: f64) -> &Self {
            *self.clock_ms.lock().unwrap() = ms;
            self
        }
    }

    impl Store for Recorder {
        fn check<'a>(
            &'a self,
            key: &'a str,
            alg: &'a crate::limit::Algorithm,
            now: Option<f64>,
        ) -> crate::store::StoreFuture<'a> {
            self.inner.check(key, alg, now)
        }

        fn defer<'a>(
            &'a self,
            key: &'a str,
            pace: &'a crate::limit::Pace,
            hold_ms: u64,
            now: Option<f64>,
        ) -> crate::store::HoldFuture<'a> {
            self.inner.defer(key, pace, hold_ms, now)
        }

        fn peek<'a>(
            &'a self,
            key: &'a str,
            alg: &'a crate::limit::Algorithm,
        ) -> crate::store::StoreFuture<'a> {
            self.inner.peek(key, alg)
        }

        fn forget<'a>(&'a self, key: &'a str) -> crate::store::GiveBackFuture<'a> {
            self.inner.forget(key)
        }

        fn adapt<'a>(
            &'a self,
            key: &'a str,
            aimd: &'a Aimd,
            report: Report,
            _now: Option<f64>,
        ) -> crate::store::RateFuture<'a> {
            self.reports.lock().unwrap().push(report);
            let now = Some(*self.clock_ms.lock().unwrap());
            self.inner.adapt(key, aimd, report, now)
        }
    }

    /// The first tick reads the fleet's rate at once; later ones report each period once it
    /// is over; an answer to a request paced faster than the rate now is not counted.
    #[tokio::test]
    async fn reports_once_a_period_and_skips_stale_answers() {
        let store = Recorder {
            inner: MemoryStore::new(NonZeroUsize::new(10).unwrap()),
            clock_ms: Default::default(),
            reports: Default::default(),
        };
        let a = adapter(None);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        a.observe(100.0, Met::Trouble);
        assert_eq!(
            a.tick(store.at(0.0), t0).await,
            Some(100.0),
            "a quiet first read"
        );
        a.observe(100.0, Met::Trouble);
        assert_eq!(a.tick(store.at(100.0), at(100)).await, None);
        assert_eq!(a.tick(store.at(500.0), at(500)).await, Some(50.0));
        assert_eq!(a.rate().per_sec(), 50.0);
        // sent at 100/s, before the rate fell: old news
        a.observe(100.0, Met::Trouble);
        a.observe(50.0, Met::Healthy);
        assert_eq!(a.tick(store.at(1000.0), at(1000)).await, Some(51.0));
        assert_eq!(a.tick(store.at(1500.0), at(1500)).await, Some(51.0));
        use Report::{Healthy, Quiet, Trouble};
        assert_eq!(
            *store.reports.lock().unwrap(),
            [Quiet, Trouble, Healthy, Quiet]
        );
    }
}

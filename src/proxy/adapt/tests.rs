//! The adapter against a memory store on a clock the test moves, and one that can fail.

use std::num::NonZeroUsize;

use super::*;
use crate::store::MemoryStore;

fn adapter(target_latency: Option<Duration>) -> Adapter {
    one_of(target_latency, 1)
}

/// An adapter that shares the fleet's rate with `instances - 1` others.
fn one_of(target_latency: Option<Duration>, instances: u32) -> Adapter {
    let r = |x| Rate::per_second(x).unwrap();
    let aimd = Aimd::new(r(100.0), r(1.0), r(200.0), 1.0, 0.5, 500.0).unwrap();
    let key = "t:upstream:api:rate".into();
    Adapter::new(
        aimd,
        target_latency,
        key,
        NonZeroU32::new(instances).unwrap(),
    )
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
        assert_eq!(
            a.met(answer(status).as_ref(), fast),
            Met::Trouble,
            "{status}"
        );
    }
    for status in [200, 404, 500, 502] {
        assert_eq!(
            a.met(answer(status).as_ref(), fast),
            Met::Healthy,
            "{status}"
        );
    }
    assert_eq!(
        a.met(answer(200).as_ref(), Duration::from_millis(301)),
        Met::Trouble
    );
    assert_eq!(
        adapter(None).met(answer(200).as_ref(), Duration::from_secs(9)),
        Met::Healthy
    );
    let timeout = Err(ProxyError::UpstreamTimeout {
        upstream: "api".into(),
        after: fast,
    });
    assert_eq!(a.met(timeout.as_ref(), fast), Met::Trouble);
    assert_eq!(a.met(Err(&ProxyError::BadBody), fast), Met::Nothing);
}

/// The memory store on a clock the test moves, recording each report it answers; it fails
/// every call while `down`.
struct Recorder {
    inner: MemoryStore,
    clock_ms: std::sync::Mutex<f64>,
    reports: std::sync::Mutex<Vec<Report>>,
    down: AtomicBool,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder {
            inner: MemoryStore::new(NonZeroUsize::new(10).unwrap()),
            clock_ms: Default::default(),
            reports: Default::default(),
            down: AtomicBool::new(false),
        }
    }

    fn reports(&self) -> Vec<Report> {
        self.reports.lock().unwrap().clone()
    }

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
        if self.down.load(Ordering::Relaxed) {
            return Box::pin(async { Err(crate::store::StoreError::CircuitOpen) });
        }
        self.reports.lock().unwrap().push(report);
        let now = Some(*self.clock_ms.lock().unwrap());
        self.inner.adapt(key, aimd, report, now)
    }
}

/// The first tick reads the fleet's rate at once; later ones report each period once it
/// is over; an answer to a request paced faster than the rate now is not counted.
#[tokio::test]
async fn reports_once_a_period_and_skips_stale_answers() {
    let store = Recorder::new();
    let a = adapter(None);
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    a.observe(100.0, Instant::now(), Met::Trouble);
    assert_eq!(
        a.tick(store.at(0.0), t0).await,
        Some(100.0),
        "a quiet first read"
    );
    a.observe(100.0, Instant::now(), Met::Trouble);
    assert_eq!(a.tick(store.at(100.0), at(100)).await, None);
    assert_eq!(a.tick(store.at(500.0), at(500)).await, Some(50.0));
    assert_eq!(a.rate().per_sec(), 50.0);
    // sent at 100/s, before the rate fell: old news
    a.observe(100.0, Instant::now(), Met::Trouble);
    a.observe(50.0, Instant::now(), Met::Healthy);
    assert_eq!(a.tick(store.at(1000.0), at(1000)).await, Some(51.0));
    assert_eq!(a.tick(store.at(1500.0), at(1500)).await, Some(51.0));
    use Report::{Healthy, Quiet, Trouble};
    assert_eq!(store.reports(), [Quiet, Trouble, Healthy, Quiet]);
}

/// While the store is away an instance paces at its share of the last rate and adapts that
/// alone; when the store answers again it is only asked for the rate, resumes an emptied one
/// from what the instance knew, and answers to requests sent before count for nothing.
#[tokio::test]
async fn alone_while_the_store_is_away_then_fresh() {
    let store = Recorder::new();
    let a = one_of(None, 2);
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    assert_eq!(a.tick(store.at(0.0), t0).await, Some(100.0));
    store.down.store(true, Ordering::Relaxed);
    a.observe(100.0, at(100), Met::Trouble);
    // this instance alone cuts 100 to 50, and paces at half of it
    assert_eq!(a.tick(store.at(500.0), at(500)).await, Some(25.0));
    assert!(a.store_away());
    assert_eq!(
        a.rate().per_sec(),
        50.0,
        "the schedule's rate, before the share"
    );
    a.observe(25.0, at(600), Met::Healthy);
    assert_eq!(a.tick(store.at(1000.0), at(1000)).await, Some(25.5));
    // (the store lost the rate meanwhile: it never held one, as the first read was quiet)
    a.observe(25.5, at(1100), Met::Trouble);
    store.down.store(false, Ordering::Relaxed);
    // back: the fleet's 51, of which this instance takes its share for REJOIN
    assert_eq!(a.tick(store.at(1500.0), at(1500)).await, Some(25.5));
    assert!(!a.store_away());
    assert_eq!(a.rate().per_sec(), 25.5, "rejoining at its share");
    // sent while the store was away, answered after: counts for nothing
    a.observe(25.5, at(1400), Met::Trouble);
    assert_eq!(a.tick(store.at(2000.0), at(2000)).await, Some(25.5));
    // health while rejoining does not raise the rate; trouble would lower it
    a.observe(25.5, at(2100), Met::Healthy);
    assert_eq!(a.tick(store.at(2500.0), at(2500)).await, Some(25.5));
    assert_eq!(a.tick(store.at(3500.0), at(3500)).await, Some(51.0));
    assert_eq!(a.rate().per_sec(), 51.0);
    a.observe(51.0, at(3600), Met::Healthy);
    assert_eq!(a.tick(store.at(4000.0), at(4000)).await, Some(52.0));
    use Report::{Healthy, Quiet};
    assert_eq!(
        store.reports(),
        [Quiet, Quiet, Quiet, Quiet, Quiet, Healthy]
    );
}

/// After the process stood still (a SIGSTOP), answers to requests sent before the stop,
/// timed across it, count for nothing: the first report after it is quiet.
#[tokio::test]
async fn answers_timed_across_a_stop_count_for_nothing() {
    let store = Recorder::new();
    let a = adapter(None);
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    assert_eq!(a.tick(store.at(0.0), t0).await, Some(100.0));
    a.observe(100.0, at(100), Met::Trouble);
    assert_eq!(a.tick(store.at(400.0), at(400)).await, None);
    // stopped from 0.4 s to 5.4 s
    assert_eq!(a.tick(store.at(5400.0), at(5400)).await, Some(100.0));
    a.observe(100.0, at(300), Met::Trouble);
    assert_eq!(a.tick(store.at(5900.0), at(5900)).await, Some(100.0));
    a.observe(100.0, at(5950), Met::Trouble);
    assert_eq!(a.tick(store.at(6400.0), at(6400)).await, Some(50.0));
    use Report::{Quiet, Trouble};
    assert_eq!(store.reports(), [Quiet, Quiet, Quiet, Trouble]);
}

//! The registry and the metrics in it: their names, help texts, units and buckets, registered
//! in the order the exposition lists them.

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::labels::{
    ChargeLabels, DecisionLabels, KindLabel, ResultLabel, RouteLabel, RouteStatus, UpstreamKind,
    UpstreamLabel,
};
use super::sharded::{self, Histogram};
use super::{Metrics, NO_ROUTE};

/// Request duration buckets, in seconds: 0.5 ms to 30 s in 1-2.5-5 steps, so a local answer
/// (a 429 from the memory store, well under a millisecond) and a slow upstream both land in
/// a bucket that tells them apart.
const REQUEST_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0,
    30.0,
];

/// Store call buckets, in seconds: 100 µs (a local Redis round trip) to 1 s (far past any
/// sensible `store.timeout`).
const STORE_BUCKETS: [f64; 13] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Pacing delay buckets, in seconds: 1 ms to 30 s (the longest `max_delay` worth waiting).
const PACING_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
];

/// A histogram family whose series all get the same buckets.
pub(super) type Histograms<S> = Family<S, Histogram, fn() -> Histogram>;

/// A function run before each [`Metrics::encode`].
pub(super) type ScrapeHook = Box<dyn Fn(&Metrics) + Send + Sync>;

pub(super) struct Inner {
    /// The metrics below are registered here; the handles below share their state with it.
    pub(super) registry: Registry,
    pub(super) requests: Family<RouteStatus, sharded::Counter>,
    pub(super) request_duration: Histograms<RouteLabel>,
    pub(super) limit_decisions: Family<DecisionLabels, sharded::Counter>,
    pub(super) pacing_delay: Histograms<UpstreamLabel>,
    /// each paced upstream's rate in force, per second
    pub(super) pace_rate: Family<UpstreamLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub(super) store_errors: Family<KindLabel, Counter>,
    pub(super) store_duration: Histogram,
    pub(super) deny_cache_hits: Counter,
    pub(super) store_leased: Counter,
    pub(super) upstream_errors: Family<UpstreamKind, Counter>,
    pub(super) upstream_responses: Family<UpstreamLabel, sharded::Counter>,
    pub(super) config_reloads: Family<ResultLabel, Counter>,
    pub(super) charge_unread: Family<ChargeLabels, Counter>,
    pub(super) concurrency_held: Gauge,
    pub(super) no_route: Arc<str>,
    /// A std mutex: taken once per scrape, never on the request path.
    pub(super) hooks: Mutex<Vec<ScrapeHook>>,
}

impl Inner {
    /// Every metric, registered, with both `tollgate_config_reloads_total` series at zero.
    pub(super) fn new() -> Inner {
        let config_reloads: Family<ResultLabel, Counter> = Family::default();
        // both results exist from the start, so `increase(...{result="error"})` has a series
        for result in ["ok", "error"] {
            drop(config_reloads.get_or_create(&ResultLabel { result }));
        }
        let mut inner = Inner {
            registry: Registry::default(),
            requests: Family::default(),
            request_duration: Histograms::new_with_constructor(request_histogram as fn() -> _),
            limit_decisions: Family::default(),
            pacing_delay: Histograms::new_with_constructor(pacing_histogram as fn() -> _),
            pace_rate: Family::default(),
            store_errors: Family::default(),
            store_duration: Histogram::new(&STORE_BUCKETS),
            deny_cache_hits: Counter::default(),
            store_leased: Counter::default(),
            upstream_errors: Family::default(),
            upstream_responses: Family::default(),
            config_reloads,
            charge_unread: Family::default(),
            concurrency_held: Gauge::default(),
            no_route: Arc::from(NO_ROUTE),
            hooks: Mutex::new(Vec::new()),
        };
        // the exposition lists the families in the order they are registered
        inner.register_requests();
        inner.register_store();
        inner.register_upstreams_and_the_rest();
        inner
    }

    /// The request path's metrics: requests, their time, limit decisions and pacing.
    fn register_requests(&mut self) {
        let r = &mut self.registry;
        r.register(
            "tollgate_requests",
            "Requests answered, by route and status",
            self.requests.clone(),
        );
        r.register_with_unit(
            "tollgate_request_duration",
            "Time from request head to response head, by route",
            Unit::Seconds,
            self.request_duration.clone(),
        );
        r.register(
            "tollgate_limit_decisions",
            "Limit checks, by route, limit and decision",
            self.limit_decisions.clone(),
        );
        r.register_with_unit(
            "tollgate_pacing_delay",
            "Time requests waited for an upstream's pacing and in-flight slots, by upstream",
            Unit::Seconds,
            self.pacing_delay.clone(),
        );
        r.register(
            "tollgate_pace_rate",
            "Each paced upstream's pacing rate in force, requests per second (it moves when the pace is adaptive)",
            self.pace_rate.clone(),
        );
    }

    /// The limit store's metrics.
    fn register_store(&mut self) {
        let r = &mut self.registry;
        r.register(
            "tollgate_store_errors",
            "Failed store calls, by kind",
            self.store_errors.clone(),
        );
        r.register_with_unit(
            "tollgate_store_duration",
            "Time of a call to the limit store",
            Unit::Seconds,
            self.store_duration.clone(),
        );
        r.register(
            "tollgate_deny_cache_hits",
            "Denials answered from the local deny cache without asking the store",
            self.deny_cache_hits.clone(),
        );
        r.register(
            "tollgate_store_leased",
            "Limit checks answered from tokens leased ahead from Redis, without a store call",
            self.store_leased.clone(),
        );
    }

    /// The upstreams' metrics, then reloads, charges and concurrency slots.
    fn register_upstreams_and_the_rest(&mut self) {
        let r = &mut self.registry;
        r.register(
            "tollgate_upstream_errors",
            "Failed forwards, by upstream and kind",
            self.upstream_errors.clone(),
        );
        r.register(
            "tollgate_upstream_responses",
            "Response heads received from upstreams, by upstream",
            self.upstream_responses.clone(),
        );
        r.register(
            "tollgate_config_reloads",
            "Configuration reloads, by result",
            self.config_reloads.clone(),
        );
        r.register(
            "tollgate_charge_unread",
            "Responses of a charged limit without a usable number, by route, limit and reason",
            self.charge_unread.clone(),
        );
        r.register(
            "tollgate_concurrency_held",
            "Concurrency slots this instance holds: requests in flight under a concurrency limit or an upstream's pace.concurrency",
            self.concurrency_held.clone(),
        );
    }
}

fn request_histogram() -> Histogram {
    Histogram::new(&REQUEST_BUCKETS)
}

fn pacing_histogram() -> Histogram {
    Histogram::new(&PACING_BUCKETS)
}

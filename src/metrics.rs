//! The process's one Prometheus registry and [`Metrics`], the cheap cloneable handle to it that
//! is passed down to whoever records something.
//!
//! This module owns the metric names, their labels and their buckets, and the text encoding
//! served at the admin `/metrics` endpoint. Callers record through plain values (`Arc<str>`
//! names, `&'static str` kinds, [`Duration`]s). It uses nothing else of the crate.
//!
//! The exposition is OpenMetrics text as prometheus-client writes it (it ends with `# EOF`),
//! served as [`CONTENT_TYPE`] to a client that asks for it, or the same turned into the
//! Prometheus text format 0.0.4 ([`Metrics::encode_text`], [`TEXT_CONTENT_TYPE`]). Counters are registered by their base name because
//! prometheus-client appends `_total` to the sample name itself, and histograms in seconds carry
//! the OpenMetrics unit, so the sample names are exactly these (docs/operations.md lists them):
//!
//! | metric | labels |
//! | --- | --- |
//! | `tollgate_requests_total` | `route`, `status` |
//! | `tollgate_request_duration_seconds` (histogram) | `route` |
//! | `tollgate_limit_decisions_total` | `route`, `limit`, `decision` (allowed, denied, shadow_denied, delayed) |
//! | `tollgate_pacing_delay_seconds` (histogram) | `upstream` |
//! | `tollgate_pace_rate` (gauge, requests per second) | `upstream` |
//! | `tollgate_store_errors_total` | `kind` |
//! | `tollgate_store_duration_seconds` (histogram) | |
//! | `tollgate_deny_cache_hits_total` | |
//! | `tollgate_store_leased_total` (tollgate's own) | |
//! | `tollgate_upstream_errors_total` | `upstream`, `kind` |
//! | `tollgate_upstream_responses_total` | `upstream` |
//! | `tollgate_config_reloads_total` | `result` (ok, error) |
//! | `tollgate_charge_unread_total` | `route`, `limit`, `reason` (missing, malformed, drain_bound) |
//! | `tollgate_concurrency_held` (gauge, tollgate's own) | |
//!
//! A request that matched no route is recorded with the route label [`NO_ROUTE`] (`-`), which
//! no configured route can be named, so it never mixes with a real route's series.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

mod sharded;

pub use sharded::set_thread_slot;
use sharded::Histogram;

/// The `Content-Type` of [`Metrics::encode`]'s text: OpenMetrics 1.0, which is what
/// prometheus-client writes (`# EOF`, counter families named without `_total`) and what
/// Prometheus parses when a target answers with it.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `Content-Type` of [`Metrics::encode_text`]: the Prometheus text format 0.0.4, what
/// `/metrics` answers a client that does not ask for OpenMetrics (curl, older scrapers).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The route label of a request that matched no route.
pub const NO_ROUTE: &str = "-";

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

/// What one limit decided for one request: the `decision` label of
/// `tollgate_limit_decisions_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// the request was within the limit
    Allowed,
    /// the request was over the limit and was refused
    Denied,
    /// the request was over a limit in shadow mode: counted, but let through
    ShadowDenied,
    /// the request was admitted after a wait for its slot (`leaky_bucket`)
    Delayed,
}

impl Decision {
    /// The label value: `allowed`, `denied`, `shadow_denied` or `delayed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Denied => "denied",
            Decision::ShadowDenied => "shadow_denied",
            Decision::Delayed => "delayed",
        }
    }
}

impl EncodeLabelValue for Decision {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

// Label sets. Names are `Arc<str>` so that recording a known series clones a pointer instead
// of allocating; kinds and results are `&'static str` for the same reason.

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteStatus {
    route: Arc<str>,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    route: Arc<str>,
    limit: Arc<str>,
    decision: Decision,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabel {
    upstream: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamKind {
    upstream: Arc<str>,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChargeLabels {
    route: Arc<str>,
    limit: Arc<str>,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// A histogram family whose series all get the same buckets.
type Histograms<S> = Family<S, Histogram, fn() -> Histogram>;

/// A function run before each [`Metrics::encode`].
type ScrapeHook = Box<dyn Fn(&Metrics) + Send + Sync>;

/// A route's request series, kept by the route and found once: recording into it skips the
/// family's label hashing and lock (a SipHash of the labels and a lock per series, twice per
/// request). Series appear at the first recording, as through [`Metrics::request`].
pub struct RouteSeries {
    route: Arc<str>,
    duration: OnceLock<Histogram>,
    /// `tollgate_requests_total{route,status}` for the statuses seen so far, each in the first
    /// free place when first seen; read on every request without a lock (a lock's read side
    /// is a write to a line every worker shares)
    counts: [OnceLock<(u16, sharded::Counter)>; STATUS_PLACES],
}

/// Statuses a route keeps its own counter for; past them, a status's counter is found in the
/// family (HTTP has fewer than this in use).
const STATUS_PLACES: usize = 64;

impl RouteSeries {
    /// The series of the route named `route`.
    pub fn new(route: Arc<str>) -> RouteSeries {
        RouteSeries {
            route,
            duration: OnceLock::new(),
            counts: [const { OnceLock::new() }; STATUS_PLACES],
        }
    }
}

/// A limit's `tollgate_limit_decisions_total` series, kept by the limit (see [`RouteSeries`]).
pub struct DecisionSeries {
    route: Arc<str>,
    limit: Arc<str>,
    /// by [`Decision`], in its order
    counters: [OnceLock<sharded::Counter>; 4],
}

impl DecisionSeries {
    /// The series of limit `limit` of route `route`.
    pub fn new(route: Arc<str>, limit: Arc<str>) -> DecisionSeries {
        DecisionSeries {
            route,
            limit,
            counters: Default::default(),
        }
    }
}

/// An upstream's `tollgate_upstream_responses_total` series, kept by the upstream (see
/// [`RouteSeries`]).
pub struct UpstreamSeries {
    upstream: Arc<str>,
    responses: OnceLock<sharded::Counter>,
}

impl UpstreamSeries {
    /// The series of upstream `upstream`.
    pub fn new(upstream: Arc<str>) -> UpstreamSeries {
        UpstreamSeries {
            upstream,
            responses: OnceLock::new(),
        }
    }
}

/// A handle to the process's metrics; clones share one registry.
///
/// Every recording method is cheap on the hot path: a read lock and a hash lookup for a
/// series already seen (none through a [`RouteSeries`] or [`DecisionSeries`], which keep
/// theirs), then atomic adds to the calling worker's own slot of the request-path counters
/// and histograms (`sharded`), and no allocation beyond the first time a label combination
/// appears.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    /// The metrics below are registered here; the handles below share their state with it.
    registry: Registry,
    requests: Family<RouteStatus, sharded::Counter>,
    request_duration: Histograms<RouteLabel>,
    limit_decisions: Family<DecisionLabels, sharded::Counter>,
    pacing_delay: Histograms<UpstreamLabel>,
    /// each paced upstream's rate in force, per second
    pace_rate: Family<UpstreamLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    store_errors: Family<KindLabel, Counter>,
    store_duration: Histogram,
    deny_cache_hits: Counter,
    store_leased: Counter,
    upstream_errors: Family<UpstreamKind, Counter>,
    upstream_responses: Family<UpstreamLabel, sharded::Counter>,
    config_reloads: Family<ResultLabel, Counter>,
    charge_unread: Family<ChargeLabels, Counter>,
    concurrency_held: Gauge,
    no_route: Arc<str>,
    /// A std mutex: taken once per scrape, never on the request path.
    hooks: Mutex<Vec<ScrapeHook>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A fresh registry with every metric of the module's table registered. The unlabelled
    /// metrics and both `tollgate_config_reloads_total` series start at zero; a labelled series
    /// appears the first time its labels are recorded (an empty family is not written at all).
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let requests = Family::default();
        let request_duration = Histograms::new_with_constructor(request_histogram as fn() -> _);
        let limit_decisions = Family::default();
        let pacing_delay = Histograms::new_with_constructor(pacing_histogram as fn() -> _);
        let pace_rate = Family::default();
        let store_errors = Family::default();
        let store_duration = Histogram::new(&STORE_BUCKETS);
        let deny_cache_hits = Counter::default();
        let store_leased = Counter::default();
        let upstream_errors = Family::default();
        let upstream_responses = Family::default();
        let config_reloads: Family<ResultLabel, Counter> = Family::default();
        // both results exist from the start, so `increase(...{result="error"})` has a series
        for result in ["ok", "error"] {
            drop(config_reloads.get_or_create(&ResultLabel { result }));
        }

        let r = &mut registry;
        r.register(
            "tollgate_requests",
            "Requests answered, by route and status",
            requests.clone(),
        );
        r.register_with_unit(
            "tollgate_request_duration",
            "Time from request head to response head, by route",
            Unit::Seconds,
            request_duration.clone(),
        );
        r.register(
            "tollgate_limit_decisions",
            "Limit checks, by route, limit and decision",
            limit_decisions.clone(),
        );
        r.register_with_unit(
            "tollgate_pacing_delay",
            "Time requests waited for an upstream's pacing and in-flight slots, by upstream",
            Unit::Seconds,
            pacing_delay.clone(),
        );
        r.register(
            "tollgate_pace_rate",
            "Each paced upstream's pacing rate in force, requests per second (it moves when the pace is adaptive)",
            pace_rate.clone(),
        );
        r.register(
            "tollgate_store_errors",
            "Failed store calls, by kind",
            store_errors.clone(),
        );
        r.register_with_unit(
            "tollgate_store_duration",
            "Time of a call to the limit store",
            Unit::Seconds,
            store_duration.clone(),
        );
        r.register(
            "tollgate_deny_cache_hits",
            "Denials answered from the local deny cache without asking the store",
            deny_cache_hits.clone(),
        );
        r.register(
            "tollgate_store_leased",
            "Limit checks answered from tokens leased ahead from Redis, without a store call",
            store_leased.clone(),
        );
        r.register(
            "tollgate_upstream_errors",
            "Failed forwards, by upstream and kind",
            upstream_errors.clone(),
        );
        r.register(
            "tollgate_upstream_responses",
            "Response heads received from upstreams, by upstream",
            upstream_responses.clone(),
        );
        r.register(
            "tollgate_config_reloads",
            "Configuration reloads, by result",
            config_reloads.clone(),
        );
        let charge_unread = Family::default();
        r.register(
            "tollgate_charge_unread",
            "Responses of a charged limit without a usable number, by route, limit and reason",
            charge_unread.clone(),
        );
        let concurrency_held = Gauge::default();
        r.register(
            "tollgate_concurrency_held",
            "Concurrency slots this instance holds: requests in flight under a concurrency limit or an upstream's pace.concurrency",
            concurrency_held.clone(),
        );

        Metrics {
            inner: Arc::new(Inner {
                registry,
                requests,
                request_duration,
                limit_decisions,
                pacing_delay,
                pace_rate,
                store_errors,
                store_duration,
                deny_cache_hits,
                store_leased,
                upstream_errors,
                upstream_responses,
                config_reloads,
                charge_unread,
                concurrency_held,
                no_route: Arc::from(NO_ROUTE),
                hooks: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The route label for a request that matched no route ([`NO_ROUTE`]), shared so that
    /// recording it does not allocate.
    pub fn no_route(&self) -> &Arc<str> {
        &self.inner.no_route
    }

    /// Records an answered request: one `tollgate_requests_total{route,status}` and its time
    /// in `tollgate_request_duration_seconds{route}`. Use [`Metrics::no_route`] as `route`
    /// when no route matched.
    pub fn request(&self, route: &Arc<str>, status: u16, elapsed: Duration) {
        let labels = RouteStatus {
            route: route.clone(),
            status,
        };
        self.inner.requests.get_or_create(&labels).inc();
        let labels = RouteLabel {
            route: labels.route,
        };
        self.inner
            .request_duration
            .get_or_create(&labels)
            .observe(elapsed);
    }

    /// [`Metrics::request`] for a request of the route whose series `series` are.
    pub fn route_request(&self, series: &RouteSeries, status: u16, elapsed: Duration) {
        self.count_status(series, status);
        let duration = series.duration.get_or_init(|| {
            let labels = RouteLabel {
                route: series.route.clone(),
            };
            self.inner.request_duration.get_or_create(&labels).clone()
        });
        duration.observe(elapsed);
    }

    /// Adds one to `tollgate_requests_total{route,status}` of `series`'s route for `status`,
    /// through the counter kept in the route's first place that is free or holds `status`.
    /// The counter is used where it is kept, not cloned: a clone writes its reference count,
    /// shared by every worker. (A status put in two places by a race has the family's one
    /// counter in both.)
    fn count_status(&self, series: &RouteSeries, status: u16) {
        let find = || {
            let labels = RouteStatus {
                route: series.route.clone(),
                status,
            };
            self.inner.requests.get_or_create(&labels).clone()
        };
        for place in &series.counts {
            let (kept, counter) = place.get_or_init(|| (status, find()));
            if *kept == status {
                counter.inc();
                return;
            }
        }
        find().inc();
    }

    /// Records what one limit decided, `tollgate_limit_decisions_total{route,limit,decision}`,
    /// into the limit's series.
    pub fn limit_decided(&self, series: &DecisionSeries, decision: Decision) {
        let slot = &series.counters[decision as usize];
        let counter = slot.get_or_init(|| {
            let labels = DecisionLabels {
                route: series.route.clone(),
                limit: series.limit.clone(),
                decision,
            };
            self.inner.limit_decisions.get_or_create(&labels).clone()
        });
        counter.inc();
    }

    /// Records a response head from the upstream whose series `series` are.
    pub fn upstream_responded(&self, series: &UpstreamSeries) {
        let counter = series.responses.get_or_init(|| {
            let labels = UpstreamLabel {
                upstream: series.upstream.clone(),
            };
            self.inner.upstream_responses.get_or_create(&labels).clone()
        });
        counter.inc();
    }

    /// Records how long a request waited for `upstream`'s pacing and in-flight slots, however
    /// the wait ended: `tollgate_pacing_delay_seconds{upstream}`.
    pub fn pacing_delay(&self, upstream: &Arc<str>, delay: Duration) {
        let labels = UpstreamLabel {
            upstream: upstream.clone(),
        };
        self.inner
            .pacing_delay
            .get_or_create(&labels)
            .observe(delay);
    }

    /// Sets `tollgate_pace_rate{upstream}`, the rate `upstream` is paced at, per second.
    pub fn pace_rate(&self, upstream: &Arc<str>, rate: f64) {
        let labels = UpstreamLabel {
            upstream: upstream.clone(),
        };
        self.inner.pace_rate.get_or_create(&labels).set(rate);
    }

    /// Makes `tollgate_pacing_delay_seconds{upstream}` exist, empty until a request waits.
    pub fn pacing_known(&self, upstream: &Arc<str>) {
        let labels = UpstreamLabel {
            upstream: upstream.clone(),
        };
        drop(self.inner.pacing_delay.get_or_create(&labels));
    }

    /// Records the time of one store call, failed or not: `tollgate_store_duration_seconds`.
    pub fn store_call(&self, elapsed: Duration) {
        self.inner.store_duration.observe(elapsed);
    }

    /// Records a failed store call: `tollgate_store_errors_total{kind}` (e.g. `timeout`,
    /// `connection`, `redis`).
    pub fn store_error(&self, kind: &'static str) {
        self.inner
            .store_errors
            .get_or_create(&KindLabel { kind })
            .inc();
    }

    /// Makes `tollgate_store_errors_total{kind}` exist, at zero until an error of that kind.
    pub fn store_error_known(&self, kind: &'static str) {
        drop(self.inner.store_errors.get_or_create(&KindLabel { kind }));
    }

    /// Makes `tollgate_upstream_errors_total{upstream,kind}` exist for `upstream`, at zero until
    /// an error of that kind.
    pub fn upstream_error_known(&self, upstream: &Arc<str>, kind: &'static str) {
        let labels = UpstreamKind {
            upstream: upstream.clone(),
            kind,
        };
        drop(self.inner.upstream_errors.get_or_create(&labels));
    }

    /// Records one check answered from a lease of tokens, without a store call:
    /// `tollgate_store_leased_total` (not timed in `tollgate_store_duration_seconds`).
    pub fn store_leased(&self) {
        self.inner.store_leased.inc();
    }

    /// One more concurrency slot held (`tollgate_concurrency_held`), or with `held` false, one
    /// fewer.
    pub fn slot_held(&self, held: bool) {
        if held {
            self.inner.concurrency_held.inc();
        } else {
            self.inner.concurrency_held.dec();
        }
    }

    /// Records one denial answered from the deny cache: `tollgate_deny_cache_hits_total`.
    pub fn deny_cache_hit(&self) {
        self.inner.deny_cache_hits.inc();
    }

    /// Raises `tollgate_deny_cache_hits_total` to `total` when a counter kept elsewhere (the
    /// store's policy statistics) has counted that many; never lowers it. Meant for an
    /// [`Metrics::on_scrape`] hook; use either this or [`Metrics::deny_cache_hit`], not both.
    /// When the outside counter can start again from zero (a store rebuilt on reload), pass
    /// the sum over its lifetimes, or hits are missed until it passes the old total.
    pub fn set_deny_cache_hits(&self, total: u64) {
        // fetch_max keeps the counter monotonic even when two scrapes race
        self.inner
            .deny_cache_hits
            .inner()
            .fetch_max(total, Ordering::Relaxed);
    }

    /// Records a failed forward to `upstream`: `tollgate_upstream_errors_total{upstream,kind}`
    /// (e.g. `connect`, `timeout`).
    pub fn upstream_error(&self, upstream: &Arc<str>, kind: &'static str) {
        let labels = UpstreamKind {
            upstream: upstream.clone(),
            kind,
        };
        self.inner.upstream_errors.get_or_create(&labels).inc();
    }

    /// Every `reason` of [`Metrics::charge_unread`].
    pub const CHARGE_UNREAD_REASONS: [&'static str; 3] = ["missing", "malformed", "drain_bound"];

    /// Records a response to a request under the charged limit `limit` of `route` that
    /// reported no usable number (it was charged `charge.missing`), for `reason` (`missing`:
    /// no number in its header or trailer; `malformed`: not a whole number; `drain_bound`: the
    /// client left and the rest outlasted the drain's bound):
    /// `tollgate_charge_unread_total{route,limit,reason}`.
    pub fn charge_unread(&self, route: &Arc<str>, limit: &Arc<str>, reason: &'static str) {
        let labels = ChargeLabels {
            route: route.clone(),
            limit: limit.clone(),
            reason,
        };
        self.inner.charge_unread.get_or_create(&labels).inc();
    }

    /// Makes `tollgate_charge_unread_total` exist for the charged limit `limit` of `route`,
    /// at zero for each reason.
    pub fn charge_known(&self, route: &Arc<str>, limit: &Arc<str>) {
        for reason in Self::CHARGE_UNREAD_REASONS {
            let labels = ChargeLabels {
                route: route.clone(),
                limit: limit.clone(),
                reason,
            };
            drop(self.inner.charge_unread.get_or_create(&labels));
        }
    }

    /// Records a configuration reload: `tollgate_config_reloads_total{result}`, `ok` or
    /// `error`.
    pub fn config_reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.inner
            .config_reloads
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Runs `hook` before every [`Metrics::encode`], so values counted outside this module
    /// (which this module may not depend on) are brought up to date at scrape time. Hooks run
    /// in the order they were added, under a lock: a hook must not call `on_scrape` or
    /// `encode` itself.
    pub fn on_scrape(&self, hook: impl Fn(&Metrics) + Send + Sync + 'static) {
        self.lock_hooks().push(Box::new(hook));
    }

    /// The whole registry in OpenMetrics text (see [`CONTENT_TYPE`]), ending with `# EOF`.
    pub fn encode(&self) -> String {
        for hook in self.lock_hooks().iter() {
            hook(self);
        }
        let mut text = String::with_capacity(4096);
        // Writing into a String cannot fail, and our label values are plain strings and
        // integers, so an error here would be a bug in the encoder; answer what was written.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.inner.registry) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        text
    }

    /// The whole registry in the Prometheus text format 0.0.4 (see [`TEXT_CONTENT_TYPE`]).
    pub fn encode_text(&self) -> String {
        prometheus_text(&self.encode())
    }

    fn lock_hooks(&self) -> std::sync::MutexGuard<'_, Vec<ScrapeHook>> {
        // a hook that panicked leaves the list intact: keep using it
        self.inner
            .hooks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// OpenMetrics text as the Prometheus text format 0.0.4. The samples are written the same;
/// what differs is the metadata: a counter family is named with its `_total` in `# HELP` and
/// `# TYPE` (OpenMetrics names it without), and there is no `# UNIT` nor `# EOF`.
fn prometheus_text(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len() + 16 * counters.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        // (no family of ours is `unknown`, `info` or `stateset`; 0.0.4 would call the first
        // `untyped` and has no others)
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|tag| Some((tag, line.strip_prefix(tag)?)));
        match meta {
            Some((tag, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(tag);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                if !tail.is_empty() {
                    out.push(' ');
                    out.push_str(tail);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

fn request_histogram() -> Histogram {
    Histogram::new(&REQUEST_BUCKETS)
}

fn pacing_histogram() -> Histogram {
    Histogram::new(&PACING_BUCKETS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[track_caller]
    fn assert_has(text: &str, expected: &[&str]) {
        let have = lines(text);
        for line in expected {
            assert!(have.contains(line), "missing line {line:?} in:\n{text}");
        }
    }

    /// A route's series counts every status, also past the places it keeps counters in, and
    /// a status seen again is counted in the same series.
    #[test]
    fn a_route_counts_more_statuses_than_it_keeps_places_for() {
        let m = Metrics::new();
        let series = RouteSeries::new("api".into());
        let statuses: Vec<u16> = (0..STATUS_PLACES as u16 + 6).map(|k| 200 + k).collect();
        for (k, &status) in statuses.iter().enumerate() {
            for _ in 0..=k % 3 {
                m.route_request(&series, status, Duration::from_millis(1));
            }
        }
        let text = m.encode();
        for (k, status) in statuses.iter().enumerate() {
            let line = format!(
                r#"tollgate_requests_total{{route="api",status="{status}"}} {}"#,
                k % 3 + 1
            );
            assert_has(&text, &[&line]);
        }
    }

    /// Requests count by route and status; their durations land in the route's histogram.
    #[test]
    fn requests_count_by_route_and_status_and_time_by_route() {
        let m = Metrics::new();
        let api: Arc<str> = "api".into();
        // a route's own series and a lookup by its name are one series
        let series = RouteSeries::new(api.clone());
        m.route_request(&series, 200, Duration::from_millis(2));
        m.request(&api, 200, Duration::from_millis(8));
        m.request(&api, 429, Duration::from_micros(250));
        m.request(m.no_route(), 404, Duration::from_secs(40));
        let text = m.encode();
        assert_has(
            &text,
            &[
                "# TYPE tollgate_requests counter",
                r#"tollgate_requests_total{route="api",status="200"} 2"#,
                r#"tollgate_requests_total{route="api",status="429"} 1"#,
                r#"tollgate_requests_total{route="-",status="404"} 1"#,
                "# TYPE tollgate_request_duration_seconds histogram",
                "# UNIT tollgate_request_duration_seconds seconds",
                r#"tollgate_request_duration_seconds_count{route="api"} 3"#,
                r#"tollgate_request_duration_seconds_sum{route="api"} 0.01025"#,
                r#"tollgate_request_duration_seconds_bucket{le="0.0005",route="api"} 1"#,
                r#"tollgate_request_duration_seconds_bucket{le="0.0025",route="api"} 2"#,
                r#"tollgate_request_duration_seconds_bucket{le="0.01",route="api"} 3"#,
                r#"tollgate_request_duration_seconds_bucket{le="30.0",route="api"} 3"#,
                r#"tollgate_request_duration_seconds_bucket{le="+Inf",route="api"} 3"#,
                r#"tollgate_request_duration_seconds_count{route="-"} 1"#,
                r#"tollgate_request_duration_seconds_bucket{le="30.0",route="-"} 0"#,
                r#"tollgate_request_duration_seconds_bucket{le="+Inf",route="-"} 1"#,
            ],
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    /// Limit decisions count per route, limit and decision, with the snake_case values.
    #[test]
    fn limit_decisions_count_per_decision() {
        let m = Metrics::new();
        let (api, per_ip, per_key): (Arc<str>, Arc<str>, Arc<str>) =
            ("api".into(), "per_ip".into(), "per_key".into());
        let (ip_series, key_series) = (
            DecisionSeries::new(api.clone(), per_ip),
            DecisionSeries::new(api, per_key),
        );
        m.limit_decided(&ip_series, Decision::Allowed);
        m.limit_decided(&ip_series, Decision::Allowed);
        m.limit_decided(&ip_series, Decision::Denied);
        m.limit_decided(&key_series, Decision::ShadowDenied);
        assert_has(
            &m.encode(),
            &[
                r#"tollgate_limit_decisions_total{route="api",limit="per_ip",decision="allowed"} 2"#,
                r#"tollgate_limit_decisions_total{route="api",limit="per_ip",decision="denied"} 1"#,
                r#"tollgate_limit_decisions_total{route="api",limit="per_key",decision="shadow_denied"} 1"#,
            ],
        );
    }

    /// A paced upstream's delay histogram is there before its first request, empty.
    #[test]
    fn a_paced_upstream_has_its_delay_histogram_from_the_start() {
        let m = Metrics::new();
        m.pacing_known(&"payments".into());
        assert_has(
            &m.encode(),
            &[
                "# TYPE tollgate_pacing_delay_seconds histogram",
                r#"tollgate_pacing_delay_seconds_count{upstream="payments"} 0"#,
            ],
        );
    }

    /// Pacing delays go to the upstream's histogram with the pacing buckets.
    #[test]
    fn pacing_delays_are_histogrammed_per_upstream() {
        let m = Metrics::new();
        let up: Arc<str> = "payments".into();
        m.pacing_delay(&up, Duration::from_millis(500));
        m.pacing_delay(&up, Duration::from_secs(2));
        assert_has(
            &m.encode(),
            &[
                "# TYPE tollgate_pacing_delay_seconds histogram",
                r#"tollgate_pacing_delay_seconds_count{upstream="payments"} 2"#,
                r#"tollgate_pacing_delay_seconds_sum{upstream="payments"} 2.5"#,
                r#"tollgate_pacing_delay_seconds_bucket{le="0.001",upstream="payments"} 0"#,
                r#"tollgate_pacing_delay_seconds_bucket{le="0.5",upstream="payments"} 1"#,
                r#"tollgate_pacing_delay_seconds_bucket{le="2.5",upstream="payments"} 2"#,
                r#"tollgate_pacing_delay_seconds_bucket{le="+Inf",upstream="payments"} 2"#,
            ],
        );
    }

    /// Store calls, store errors, deny-cache hits, upstream errors and reloads all count.
    #[test]
    fn store_upstream_and_reload_events_count() {
        let m = Metrics::new();
        m.store_call(Duration::from_micros(100));
        m.store_call(Duration::from_millis(300));
        m.store_error("timeout");
        m.store_error("timeout");
        m.store_error("connection");
        m.deny_cache_hit();
        m.deny_cache_hit();
        m.upstream_error(&"backend".into(), "connect");
        m.config_reload(true);
        m.config_reload(false);
        m.config_reload(false);
        assert_has(
            &m.encode(),
            &[
                "tollgate_store_duration_seconds_count 2",
                "tollgate_store_duration_seconds_sum 0.3001",
                r#"tollgate_store_duration_seconds_bucket{le="0.0001"} 1"#,
                r#"tollgate_store_duration_seconds_bucket{le="0.25"} 1"#,
                r#"tollgate_store_duration_seconds_bucket{le="0.5"} 2"#,
                r#"tollgate_store_errors_total{kind="timeout"} 2"#,
                r#"tollgate_store_errors_total{kind="connection"} 1"#,
                "tollgate_deny_cache_hits_total 2",
                r#"tollgate_upstream_errors_total{upstream="backend",kind="connect"} 1"#,
                r#"tollgate_config_reloads_total{result="ok"} 1"#,
                r#"tollgate_config_reloads_total{result="error"} 2"#,
            ],
        );
    }

    /// Unlabelled metrics and both reload results are exposed at zero before anything happens.
    #[test]
    fn fixed_series_start_at_zero() {
        let text = Metrics::new().encode();
        assert_has(
            &text,
            &[
                "tollgate_deny_cache_hits_total 0",
                "tollgate_store_duration_seconds_count 0",
                r#"tollgate_config_reloads_total{result="ok"} 0"#,
                r#"tollgate_config_reloads_total{result="error"} 0"#,
            ],
        );
    }

    /// Every metric of the module's table is declared with its type, histograms with their
    /// unit. The counters' samples carry exactly the names in that table.
    #[test]
    fn every_documented_metric_is_declared_with_its_type() {
        let m = Metrics::new();
        let name: Arc<str> = "x".into();
        m.request(&name, 200, Duration::ZERO);
        m.limit_decided(
            &DecisionSeries::new(name.clone(), name.clone()),
            Decision::Allowed,
        );
        m.pacing_delay(&name, Duration::ZERO);
        m.store_error("timeout");
        m.upstream_error(&name, "connect");
        m.deny_cache_hit();
        m.store_leased();
        m.store_leased();
        let text = m.encode();
        assert_has(
            &text,
            &[
                "# TYPE tollgate_requests counter",
                "# TYPE tollgate_request_duration_seconds histogram",
                "# UNIT tollgate_request_duration_seconds seconds",
                "# TYPE tollgate_limit_decisions counter",
                "# TYPE tollgate_pacing_delay_seconds histogram",
                "# UNIT tollgate_pacing_delay_seconds seconds",
                "# TYPE tollgate_store_errors counter",
                "# TYPE tollgate_store_duration_seconds histogram",
                "# UNIT tollgate_store_duration_seconds seconds",
                "# TYPE tollgate_deny_cache_hits counter",
                "# TYPE tollgate_store_leased counter",
                "# TYPE tollgate_upstream_errors counter",
                "# TYPE tollgate_config_reloads counter",
                "# TYPE tollgate_concurrency_held gauge",
            ],
        );
        // the eleven metrics of the module's table
        assert_eq!(text.matches("# TYPE ").count(), 11, "{text}");
        // prometheus-client appends `_total` itself: once, never twice
        for sample in [
            "tollgate_requests_total{",
            "tollgate_limit_decisions_total{",
            "tollgate_store_errors_total{",
            "tollgate_deny_cache_hits_total 1",
            "tollgate_store_leased_total 2",
            "tollgate_upstream_errors_total{",
            "tollgate_config_reloads_total{",
        ] {
            assert!(text.contains(sample), "no {sample:?} in:\n{text}");
        }
        assert!(!text.contains("_total_total"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    /// Clones share one registry: what one records, the other encodes.
    #[test]
    fn clones_share_the_registry() {
        let m = Metrics::new();
        m.clone().deny_cache_hit();
        assert_has(&m.encode(), &["tollgate_deny_cache_hits_total 1"]);
    }

    /// A scrape hook runs before encoding and `set_deny_cache_hits` never lowers the counter.
    #[test]
    fn scrape_hook_syncs_an_outside_counter_monotonically() {
        use std::sync::atomic::AtomicU64;
        let m = Metrics::new();
        let outside = Arc::new(AtomicU64::new(5));
        let seen = outside.clone();
        m.on_scrape(move |m| m.set_deny_cache_hits(seen.load(Ordering::Relaxed)));
        assert_has(&m.encode(), &["tollgate_deny_cache_hits_total 5"]);
        outside.store(7, Ordering::Relaxed);
        assert_has(&m.encode(), &["tollgate_deny_cache_hits_total 7"]);
        outside.store(3, Ordering::Relaxed);
        assert_has(&m.encode(), &["tollgate_deny_cache_hits_total 7"]);
    }

    /// Label values are escaped, so a route name cannot forge a sample line.
    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new();
        m.upstream_error(&"a\"b\\c\nd".into(), "timeout");
        assert_has(
            &m.encode(),
            &[r#"tollgate_upstream_errors_total{upstream="a\"b\\c\nd",kind="timeout"} 1"#],
        );
    }
}

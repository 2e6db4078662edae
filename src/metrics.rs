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
use std::sync::{Arc, PoisonError};
use std::time::Duration;

mod labels;
mod registry;
mod series;
mod sharded;
mod text;

pub use labels::Decision;
pub use series::{DecisionSeries, RouteSeries, UpstreamSeries};
pub use sharded::set_thread_slot;

use labels::{
    ChargeLabels, DecisionLabels, KindLabel, ResultLabel, RouteLabel, RouteStatus, UpstreamKind,
    UpstreamLabel,
};
use registry::{Inner, ScrapeHook};
use text::prometheus_text;

/// The `Content-Type` of [`Metrics::encode`]'s text: OpenMetrics 1.0, which is what
/// prometheus-client writes (`# EOF`, counter families named without `_total`) and what
/// Prometheus parses when a target answers with it.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `Content-Type` of [`Metrics::encode_text`]: the Prometheus text format 0.0.4, what
/// `/metrics` answers a client that does not ask for OpenMetrics (curl, older scrapers).
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The route label of a request that matched no route.
pub const NO_ROUTE: &str = "-";

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
        Metrics {
            inner: Arc::new(Inner::new()),
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

#[cfg(test)]
mod tests {
    use super::series::STATUS_PLACES;
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

//! The operator console's figures: what `GET /api/stats` on the admin listener answers.
//!
//! Rates come from the registry, sampled once a second while someone asks ([`sample`]). The
//! clients each limit refuses most are counted in fixed memory ([`topk`]), as refusals happen,
//! over the same minute.
//! Everything here is this instance's own: every answer says so. [`page`] is the dashboard
//! that shows these figures in a browser.
//!
//! This module reads the config, the proxy and the metrics in force; it decides nothing and
//! changes no limiter state.

pub mod client;
pub mod page;
pub mod sample;
pub mod topk;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use crate::config::Config;
use crate::proxy::Proxy;
use sample::{Change, Sampler};
use topk::Windowed;

/// Clients kept per limit and per slot in its summary of refusals.
const KEPT_CLIENTS: usize = 64;

/// Clients shown per limit.
const SHOWN_CLIENTS: usize = 10;

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

    /// Forgets the limits `config` no longer has.
    pub fn keep_only(&self, config: &Config) {
        let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        routes.retain(|route, limits| {
            let Some(kept) = config.routes.iter().find(|r| *r.name == **route) else {
                return false;
            };
            limits.retain(|limit, _| kept.limits.iter().any(|l| *l.name == **limit));
            !limits.is_empty()
        });
    }
}

/// What the last reload did.
#[derive(Debug, Clone)]
pub struct Reloaded {
    /// when
    pub at: SystemTime,
    /// why it was refused; `None`: applied
    pub error: Option<String>,
}

/// How the store is doing, as the app sees it.
#[derive(Debug, Clone)]
pub struct StoreView {
    /// `memory`, `redis`, `cluster` or `sentinel`
    pub backend: &'static str,
    /// `closed` or `open`; `None` for the memory store, which has no breaker
    pub breaker: Option<&'static str>,
}

/// What `/api/stats` is made from.
pub struct View<'a> {
    pub config: &'a Config,
    pub proxy: &'a Proxy,
    pub store: StoreView,
    pub reload: Option<Reloaded>,
}

/// The console's state for one process.
pub struct Console {
    sampler: Arc<Sampler>,
    refusals: Arc<Refusals>,
    started: SystemTime,
}

impl Console {
    /// The console over `sampler`'s metrics and the refusals the proxy counts in `refusals`.
    pub fn new(sampler: Arc<Sampler>, refusals: Arc<Refusals>) -> Console {
        Console {
            sampler,
            refusals,
            started: SystemTime::now(),
        }
    }

    /// The `/api/stats` answer.
    pub fn stats(&self, view: &View<'_>) -> Value {
        let (before, after) = self.sampler.window();
        let change = Change {
            before: &before,
            after: &after,
        };
        let secs = change.seconds();
        json!({
            "scope": "this instance",
            "window_seconds": round(secs),
            "started": http_date(self.started),
            "routes": routes(view.config, &change),
            "limits": limits(view.config, &change, &self.refusals),
            "upstreams": upstreams(view, &change),
            "store": store(&view.store, &change),
            "reload": view.reload.as_ref().map(|r| json!({
                "at": http_date(r.at),
                "result": if r.error.is_none() { "ok" } else { "error" },
                "error": r.error,
            })),
        })
    }
}

/// Per route: requests a second and the status mix over the window.
fn routes(config: &Config, change: &Change<'_>) -> Vec<Value> {
    let secs = change.seconds();
    let mut by_route: HashMap<&str, [f64; 6]> = HashMap::new();
    for (series, grown) in change.grown("tollgate_requests_total") {
        let (Some(route), Some(status)) = (series.label("route"), series.label("status")) else {
            continue;
        };
        let class = match status.parse::<u16>().unwrap_or(0) {
            429 => 4,
            s @ 200..=599 => usize::from(s / 100) - 2,
            _ => 5,
        };
        let route = config
            .routes
            .iter()
            .map(|r| r.name.as_str())
            .find(|r| *r == route)
            .unwrap_or(crate::metrics::NO_ROUTE);
        by_route.entry(route).or_default()[class] += grown;
    }
    let mut names: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
    if by_route.contains_key(crate::metrics::NO_ROUTE) {
        names.push(crate::metrics::NO_ROUTE);
    }
    names
        .into_iter()
        .map(|name| {
            let c = by_route.get(name).copied().unwrap_or_default();
            let total: f64 = c.iter().sum();
            json!({
                "name": name,
                "rps": round(total / secs),
                "status_rps": {
                    "2xx": round(c[0] / secs),
                    "3xx": round(c[1] / secs),
                    "4xx": round(c[2] / secs),
                    "429": round(c[4] / secs),
                    "5xx": round(c[3] / secs),
                    "other": round(c[5] / secs),
                },
                "share_429": if total > 0.0 { round(c[4] / total) } else { 0.0 },
            })
        })
        .collect()
}

/// Per limit: decisions a second over the window, and the clients refused most.
fn limits(config: &Config, change: &Change<'_>, refusals: &Refusals) -> Vec<Value> {
    let secs = change.seconds();
    let mut decided: HashMap<(&str, &str, &str), f64> = HashMap::new();
    for (series, grown) in change.grown("tollgate_limit_decisions_total") {
        if let (Some(r), Some(l), Some(d)) = (
            series.label("route"),
            series.label("limit"),
            series.label("decision"),
        ) {
            *decided.entry((r, l, d)).or_default() += grown;
        }
    }
    let mut out = Vec::new();
    for route in &config.routes {
        for limit in &route.limits {
            let per_sec = |decision: &str| {
                let n = decided
                    .get(&(route.name.as_str(), limit.name.as_str(), decision))
                    .copied()
                    .unwrap_or(0.0);
                round(n / secs)
            };
            let top: Vec<Value> = refusals
                .top(&route.name, &limit.name, SHOWN_CLIENTS)
                .into_iter()
                .map(|e| json!({"client": e.client, "refused": e.count, "error": e.error}))
                .collect();
            out.push(json!({
                "route": route.name,
                "limit": limit.name,
                "algorithm": limit.algorithm.name(),
                "mode": if limit.mode == crate::config::Mode::Shadow { "shadow" } else { "enforce" },
                "per_second": {
                    "allowed": per_sec("allowed"),
                    "denied": per_sec("denied"),
                    "shadow_denied": per_sec("shadow_denied"),
                    "delayed": per_sec("delayed"),
                },
                "top_refused": top,
            }));
        }
    }
    out
}

/// Per upstream: requests forwarded a second, the pacing delay, requests waiting, a hold.
fn upstreams(view: &View<'_>, change: &Change<'_>) -> Vec<Value> {
    let secs = change.seconds();
    let mut forwarded: HashMap<&str, f64> = HashMap::new();
    for (series, grown) in change.grown("tollgate_upstream_responses_total") {
        if let Some(u) = series.label("upstream") {
            *forwarded.entry(u).or_default() += grown;
        }
    }
    view.config
        .upstreams
        .iter()
        .map(|u| {
            let pacer = view.proxy.upstream(&u.name).and_then(|up| up.pacer.as_ref());
            let delay = |q| {
                change
                    .quantile("tollgate_pacing_delay_seconds", "upstream", &u.name, q)
                    .map(|s| round(s * 1000.0))
            };
            json!({
                "name": u.name,
                "forwarded_per_second": round(forwarded.get(u.name.as_str()).copied().unwrap_or(0.0) / secs),
                "paced": pacer.is_some(),
                "pace_rate": pacer.map(|p| round(p.adapt.as_ref().map_or(p.pace.rate.per_sec(), |a| a.paced_at()))),
                "adaptive": pacer.is_some_and(|p| p.adapt.is_some()),
                "pacing_delay_ms": {"p50": delay(0.5), "p99": delay(0.99)},
                "waiting": pacer.and_then(|p| p.waiting_now()),
                "hold_ms": pacer.and_then(|p| p.hold_remaining()).map(|d| d.as_millis() as u64),
                "schedule_ahead_ms": pacer.map(|p| p.schedule_ahead().map_or(0, |d| d.as_millis() as u64)),
            })
        })
        .collect()
}

/// The store: its backend, breaker, call latency and errors a second.
fn store(view: &StoreView, change: &Change<'_>) -> Value {
    let secs = change.seconds();
    let mut errors: HashMap<&str, f64> = HashMap::new();
    for (series, grown) in change.grown("tollgate_store_errors_total") {
        if let Some(kind) = series.label("kind") {
            *errors.entry(kind).or_default() += grown / secs;
        }
    }
    let call = |q| {
        change
            .quantile("tollgate_store_duration_seconds", "", "", q)
            .map(|s| round(s * 1000.0))
    };
    let errors: serde_json::Map<String, Value> = errors
        .into_iter()
        .map(|(k, v)| (k.to_owned(), json!(round(v))))
        .collect();
    json!({
        "backend": view.backend,
        "breaker": view.breaker,
        "call_ms": {"p50": call(0.5), "p99": call(0.99)},
        "errors_per_second": errors,
    })
}

/// Three decimals are plenty for a dashboard, and keep the JSON short.
fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn http_date(at: SystemTime) -> String {
    httpdate::fmt_http_date(at)
}

//! The operator console: its figures, what `GET /api/stats` on the admin listener answers, and
//! the operator API's calls ([`api`]).
//!
//! Rates come from the registry, sampled once a second while someone asks ([`sample`]): the
//! fleet's publication asks every second, so a running server always samples. The clients
//! each limit refuses most come from [`Refusals`], which the proxy counts into, over the same
//! minute.
//!
//! These figures are this instance's own, and every answer says so. Each instance also
//! publishes them to the store once a second, and [`fleet`] sums what the instances sharing
//! the store published into the fleet's. [`page`] is the dashboard that shows these figures in
//! a browser.
//!
//! This module reads the config, the proxy and the metrics in force, and decides nothing. Only
//! an operator's call to [`api`] changes limiter state: a reset, or a lifted hold.

pub mod api;
pub mod client;
pub mod fleet;
pub mod page;
pub mod sample;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::{json, Value};

use crate::config::Config;
use crate::proxy::Proxy;
use crate::refusals::Refusals;
use fleet::Instance;
use sample::{Change, Sampler};

/// Clients shown per limit.
const SHOWN_CLIENTS: usize = 10;

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

/// The console's state for one process: cheap to clone, and the clones share it.
#[derive(Clone)]
pub struct Console {
    sampler: Arc<Sampler>,
    refusals: Arc<Refusals>,
    started: SystemTime,
    instance: Arc<Instance>,
}

impl Console {
    /// The console of `instance` over `sampler`'s metrics and the refusals the proxy counts in
    /// `refusals`.
    pub fn new(sampler: Arc<Sampler>, refusals: Arc<Refusals>, instance: Instance) -> Console {
        Console {
            sampler,
            refusals,
            started: SystemTime::now(),
            instance: Arc::new(instance),
        }
    }

    /// The process these figures are of.
    pub fn instance(&self) -> &Instance {
        &self.instance
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
            "instance": {"id": self.instance.id, "address": self.instance.address},
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

//! tollgate: a rate-limiting reverse proxy.
//!
//! # Layout
//! * [`limit`]: the five algorithms, pure (no I/O); the Rust twins of the scripts in `lua/`.
//! * [`store`]: the [`store::Store`] trait, the memory store, the Redis store, and the failure
//!   policy (circuit breaker, deny cache) around it.
//! * [`config`]: `proxy.yaml`: raw serde mirror, validation into typed config with positions.
//! * [`routing`]: the route table: normalised path, host, method, headers to a route.
//! * [`identity`]: client identity (peer, trusted proxies, X-Forwarded-For) and limiter keys.
//! * [`proxy`]: the request path as phases: route, identify, limit, pace, forward, respond.
//! * [`tls`]: rustls configs: inbound termination (ALPN h2, http/1.1), the upstream connector.
//! * [`metrics`]: one Prometheus registry, a cloneable handle passed down.
//! * [`admin`]: the admin listener: `/metrics`, `/healthz`, `/readyz`, `/config`.
//! * [`app`]: the only wiring module: builds stores, routes and listeners from the config; runs.

pub mod admin;
pub mod app;
pub mod config;
mod decimal;
pub mod identity;
pub mod limit;
pub mod metrics;
pub mod proxy;
pub mod routing;
pub mod store;
pub mod tls;

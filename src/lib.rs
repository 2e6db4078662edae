//! tollgate: a rate-limiting reverse proxy.
//!
//! # Layout
//! * [`limit`]: the algorithms, pure (no I/O); the Rust twins of the scripts in `lua/`.
//! * [`store`]: the [`store::Store`] trait, the memory store, the Redis store, and the failure
//!   policy (circuit breaker, deny cache) around it.
//! * [`config`]: `proxy.yaml`: raw serde mirror, validation into typed config with positions.
//! * [`routing`]: the route table: normalised path, host, method, headers to a route.
//! * `host`: the name in a `Host` value, which `routing` and `identity` both read.
//! * [`identity`]: client identity (peer, trusted proxies, X-Forwarded-For) and limiter keys.
//! * [`body`]: one adapter that watches a body's frames and its end, for `proxy` and `server`.
//! * [`proxy`]: the request path as phases: identify, route, limit, pace, forward, respond.
//! * [`tls`]: rustls configs: inbound termination (ALPN h2, http/1.1), and the client config
//!   of the connections tollgate makes.
//! * [`turns`]: the scheduling tricks that exist for throughput, and their one off switch.
//! * [`metrics`]: one Prometheus registry, a cloneable handle passed down.
//! * [`admin`]: the admin listener: `/metrics`, `/healthz`, `/readyz`, `/config`, the operator
//!   API and its dashboard.
//! * [`console`]: the operator console's figures: rates over the last minute, top refused
//!   clients; and the dashboard's page.
//! * [`refusals`]: the clients each limit refuses most, which the proxy counts and the console
//!   shows.
//! * [`logging`]: the text form of log lines, the access log's above all.
//! * `server`: serving connections: accept, TLS, HTTP/1 and HTTP/2, framing checks, deadlines,
//!   the worker threads.
//! * `watch`: noticing a change of the config file, for reload.
//! * [`app`]: the only wiring module: builds stores, routes and listeners from the config; runs.

pub mod admin;
pub mod app;
pub mod body;
pub mod config;
pub mod console;
mod decimal;
mod host;
pub mod identity;
pub mod limit;
pub mod logging;
pub mod metrics;
pub mod proxy;
pub mod refusals;
pub mod routing;
mod server;
pub mod store;
pub mod tls;
pub mod turns;
mod watch;

/// An error and its sources on one line, each once: a source that its error's message already
/// quotes (thiserror's `{source}`) is not repeated. "upstream api: connect failed: tcp connect
/// error: Connection refused (os error 111)". For start-up failures (`anyhow`, through
/// `as_ref`) and the proxy's warnings alike.
pub fn error_line(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line
}

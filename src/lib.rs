//! tollgate: a rate-limiting reverse proxy.
//!
//! # Layout
//! * [`limit`]: the five algorithms, pure (no I/O); the Rust twins of the scripts in `lua/`.
//! * [`store`]: the [`store::Store`] trait, the memory store and the Redis store.
//! * [`config`]: `proxy.yaml`: raw serde mirror, validation into typed config with positions.
//! * [`routing`]: the route table: normalised path, host, method, headers to a route.
//! * [`identity`]: client identity (peer, trusted proxies, X-Forwarded-For) and limiter keys.

pub mod config;
pub mod identity;
pub mod limit;
pub mod routing;
pub mod store;

//! The series a route, a limit or an upstream keeps of its own, so that recording into them
//! on the request path skips the family's lookup.

use std::sync::{Arc, OnceLock};

use super::sharded::{self, Histogram};
#[cfg(doc)]
use super::{Decision, Metrics};

/// A route's request series, kept by the route and found once: recording into it skips the
/// family's label hashing and lock (a SipHash of the labels and a lock per series, twice per
/// request). Series appear at the first recording, as through [`Metrics::request`].
pub struct RouteSeries {
    pub(super) route: Arc<str>,
    pub(super) duration: OnceLock<Histogram>,
    /// `tollgate_requests_total{route,status}` for the statuses seen so far, each in the first
    /// free place when first seen; read on every request without a lock (a lock's read side
    /// is a write to a line every worker shares)
    pub(super) counts: [OnceLock<(u16, sharded::Counter)>; STATUS_PLACES],
}

/// Statuses a route keeps its own counter for; past them, a status's counter is found in the
/// family (HTTP has fewer than this in use).
pub(super) const STATUS_PLACES: usize = 64;

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
    pub(super) route: Arc<str>,
    pub(super) limit: Arc<str>,
    /// by [`Decision`], in its order
    pub(super) counters: [OnceLock<sharded::Counter>; 4],
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
    pub(super) upstream: Arc<str>,
    pub(super) responses: OnceLock<sharded::Counter>,
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

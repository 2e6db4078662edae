//! Route table: a request's host, normalised path, method and headers select the first route
//! that matches, in file order.
//!
//! Owns path normalisation ([`normalize_path`]), the match conditions ([`RouteMatch`]), the
//! first-match table ([`RouteTable`]) and the analysis that finds unreachable routes
//! ([`RouteMatch::shadows`]). It does not own what a route *does* (limits, upstream): the table is
//! generic over that. Uses nothing else of the crate, and only `http` types, not hyper's.

mod path;

use std::borrow::Cow;

pub use path::{normalize_path, PathError};

use http::{HeaderName, HeaderValue, Method};

/// A host pattern: exact (`api.example.com`) or a leading wildcard (`*.example.com`).
/// Compared case-insensitively, without the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// the whole host, lowercase
    Exact(String),
    /// `*.example.com` stored as `.example.com` (lowercase): matches `a.example.com`, not `example.com`
    Suffix(String),
}

/// How the path must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// any path
    Any,
    /// segment-aware prefix: `/v1` matches `/v1` and `/v1/x`, not `/v1x`
    Prefix(String),
    /// exactly this path
    Exact(String),
}

/// What a route matches; every present condition must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteMatch {
    /// `match.host`
    pub host: Option<HostPattern>,
    /// `match.path_prefix` or `match.path`
    pub path: PathMatch,
    /// `match.methods`; empty: any method
    pub methods: Vec<Method>,
    /// `match.headers`: exact values
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

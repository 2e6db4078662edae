//! Client identity: who the client is (TCP peer, or the right-most untrusted X-Forwarded-For
//! address behind a trusted proxy), and the limiter key built from a request.
//!
//! (Types fixed here; the logic is built out in this module.)

use http::HeaderName;

/// One part of a limit's `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// `ip`: the client address
    Ip,
    /// `header:NAME`; a missing header falls back to the client address
    Header(HeaderName),
    /// `query:NAME`; a missing parameter falls back to the client address
    Query(String),
    /// `host`: the request's host, lowercase, without port
    Host,
    /// `path`: the normalised path
    Path,
    /// `route`: the route's name (one bucket shared by every client of the route)
    Route,
}

//! Why tollgate answered instead of the upstream: [`ProxyError`], and the one place its
//! variants become statuses, JSON codes, gRPC statuses and metric labels.

use std::time::Duration;

use http::StatusCode;

use super::pool;
use crate::routing::PathError;
use crate::store::StoreError;

/// Why tollgate answered instead of the upstream. Rate limiting is not an error: the limit
/// phase answers it with a 429.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// the path could not be read: bad percent-encoding, not origin-form, or an encoded
    /// slash that `paths.escaped_slashes` refuses
    #[error("{0}")]
    BadPath(#[source] PathError),
    /// a request line or target tollgate does not serve: a method not in upper case, a target
    /// with user information, another scheme or a port out of range, a CONNECT tunnel
    #[error("{0}")]
    BadRequest(&'static str),
    /// no route matches
    #[error("no route matches this request")]
    NoRoute,
    /// the header or query parameter of a limit's key came more than once, and the limit's
    /// `duplicate_key` is `reject`
    #[error("{part} sent more than once: limit {limit} counts one value per request")]
    DuplicateKey {
        /// the limit
        limit: String,
        /// its key part, as the config writes it (`header:x-api-key`)
        part: String,
    },
    /// the request body is larger than `max_body_size`
    #[error("request body larger than max_body_size")]
    BodyTooLarge,
    /// the client's request body could not be read (malformed chunked coding, cut short):
    /// the client's fault, not the upstream's
    #[error("malformed or truncated request body")]
    BadBody,
    /// the store failed and `on_error` is `deny`
    #[error("rate limiter unavailable: {0}")]
    StoreUnavailable(#[source] StoreError),
    /// the upstream's schedule is full past `max_delay`
    #[error("upstream {upstream} is paced: no slot within max_delay")]
    PacingRefused {
        /// upstream name
        upstream: String,
        /// when a slot would be within max_delay
        retry_after_ms: u64,
    },
    /// `max_waiting` requests are already sleeping for this upstream
    #[error("upstream {upstream}: too many requests waiting for a slot")]
    TooManyWaiting {
        /// upstream name
        upstream: String,
        /// when a sleeper will have left
        retry_after_ms: u64,
    },
    /// the upstream has no usable target
    #[error("upstream {0} has no target")]
    NoTarget(String),
    /// connecting to the upstream failed
    #[error("upstream {upstream}: connect failed: {source}")]
    UpstreamConnect {
        /// upstream name
        upstream: String,
        /// the client's error
        source: pool::UpstreamError,
    },
    /// the upstream connection failed after connecting
    #[error("upstream {upstream}: {source}")]
    Upstream {
        /// upstream name
        upstream: String,
        /// the client's error
        source: pool::UpstreamError,
    },
    /// the request body stalled waiting for the client for `timeouts.upstream_response`
    #[error("the request body stalled: nothing from the client for {after:?}")]
    ClientBodyTimeout {
        /// the timeout
        after: Duration,
    },
    /// no response head within `timeouts.upstream_response`
    #[error("upstream {upstream}: no response within {after:?}")]
    UpstreamTimeout {
        /// upstream name
        upstream: String,
        /// the timeout
        after: Duration,
    },
}

impl ProxyError {
    /// The status code for this error: the one place errors become statuses.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BadPath(_) | ProxyError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ProxyError::DuplicateKey { .. } => StatusCode::BAD_REQUEST,
            ProxyError::NoRoute => StatusCode::NOT_FOUND,
            ProxyError::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BadBody => StatusCode::BAD_REQUEST,
            ProxyError::ClientBodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ProxyError::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::PacingRefused { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::TooManyWaiting { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::NoTarget(_) => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamConnect { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::Upstream { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The `message` field of the JSON body: what a client may be told. The store's and the
    /// upstream connection's own errors (addresses, Redis replies) stay in the log.
    pub fn public_message(&self) -> std::borrow::Cow<'static, str> {
        match self {
            ProxyError::StoreUnavailable(_) => "rate limiter unavailable".into(),
            ProxyError::UpstreamConnect { upstream, .. } => {
                format!("upstream {upstream}: connect failed").into()
            }
            ProxyError::Upstream { upstream, .. } => {
                format!("upstream {upstream}: the connection failed").into()
            }
            ProxyError::BadPath(_)
            | ProxyError::BadRequest(_)
            | ProxyError::NoRoute
            | ProxyError::DuplicateKey { .. }
            | ProxyError::BodyTooLarge
            | ProxyError::BadBody
            | ProxyError::ClientBodyTimeout { .. }
            | ProxyError::PacingRefused { .. }
            | ProxyError::TooManyWaiting { .. }
            | ProxyError::NoTarget(_)
            | ProxyError::UpstreamTimeout { .. } => self.to_string().into(),
        }
    }

    /// The `error` field of the JSON body.
    pub fn code(&self) -> &'static str {
        match self {
            ProxyError::BadPath(_) | ProxyError::BadRequest(_) => "bad_request",
            ProxyError::NoRoute => "no_route",
            ProxyError::DuplicateKey { .. } => "duplicate_key",
            ProxyError::BodyTooLarge => "payload_too_large",
            ProxyError::BadBody => "bad_request",
            ProxyError::ClientBodyTimeout { .. } => "request_timeout",
            ProxyError::StoreUnavailable(_) => "limiter_unavailable",
            ProxyError::PacingRefused { .. } => "upstream_paced",
            ProxyError::TooManyWaiting { .. } => "upstream_queue_full",
            ProxyError::NoTarget(_) => "no_target",
            ProxyError::UpstreamConnect { .. } => "upstream_unreachable",
            ProxyError::Upstream { .. } => "upstream_error",
            ProxyError::UpstreamTimeout { .. } => "upstream_timeout",
        }
    }

    /// The gRPC status a gRPC client is given for this error. Pacing and the store refuse
    /// with UNAVAILABLE (14): the call may be tried again later. The rest follow the status
    /// each maps to, as Envoy maps HTTP statuses: 400 INTERNAL (13), 404 UNIMPLEMENTED (12),
    /// 502, 503 and 504 UNAVAILABLE (14), any other UNKNOWN (2).
    pub fn grpc_status(&self) -> u8 {
        match self.status() {
            StatusCode::BAD_REQUEST => 13,
            StatusCode::NOT_FOUND => 12,
            StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT => 14,
            _ => 2,
        }
    }

    /// Every `kind` that [`ProxyError::upstream_kind`] reports.
    pub const UPSTREAM_KINDS: [&'static str; 3] = ["connect", "timeout", "protocol"];

    /// The `kind` label of `tollgate_upstream_errors_total`, for errors the upstream caused.
    pub fn upstream_kind(&self) -> Option<&'static str> {
        match self {
            ProxyError::UpstreamConnect { .. } | ProxyError::NoTarget(_) => Some("connect"),
            ProxyError::UpstreamTimeout { .. } => Some("timeout"),
            ProxyError::Upstream { .. } => Some("protocol"),
            _ => None,
        }
    }

    /// `Retry-After` for the 503s that a limit, the pacing or the store caused.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            ProxyError::PacingRefused { retry_after_ms, .. }
            | ProxyError::TooManyWaiting { retry_after_ms, .. } => Some(*retry_after_ms),
            ProxyError::StoreUnavailable(_) => Some(1000),
            _ => None,
        }
    }
}

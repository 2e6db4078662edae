//! Every response tollgate writes itself: the JSON errors (mapped from [`ProxyError`] in one
//! place), the 429, and the rate-limit headers added to every response of a limited route:
//! `RateLimit-Policy` and `RateLimit` list every enforced limit that applied, the legacy
//! `X-RateLimit-*` headers state the most restrictive one.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::{Body, ProxyError};
use crate::limit::Decision;

/// Which rate-limit headers to send (`rate_limit_headers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers, rev. 10+)
    #[default]
    Ietf,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`
    Legacy,
    /// both sets
    Both,
    /// none (`Retry-After` is still sent on 429 and 503)
    None,
}

/// One limit's figures on a response: a limit that admitted the request, or one that refused it.
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a> {
    /// the limit's name
    pub name: &'a str,
    /// its quota `q` and window `w` in whole seconds, as the policy header states them
    pub quota: u64,
    /// window in whole seconds (at least 1)
    pub window_secs: u64,
    /// the `RateLimit-Policy` value for these figures, when made already
    pub policy: Option<&'a HeaderValue>,
    /// what the limiter answered
    pub decision: Decision,
}

impl Shown<'_> {
    /// The `RateLimit` item: `r` left and `t` until the reset. A limit with no window
    /// (concurrency) states only `r`, the slots free: when one frees cannot be known.
    fn state(&self) -> Vec<u8> {
        let r = self.decision.remaining;
        match self.window_secs {
            0 => item(self.name, ";r=", r, "", 0),
            _ => item(self.name, ";r=", r, ";t=", self.reset_secs()),
        }
    }

    /// The `t` of `RateLimit` and `X-RateLimit-Reset`: seconds until the quota is whole again,
    /// and never before a refused request would be admitted (its `Retry-After`).
    fn reset_secs(&self) -> u64 {
        let d = &self.decision;
        d.reset_secs().max(d.retry_after_secs())
    }
}

/// The limits a response states: every enforced limit that applied to the request, in the
/// route's order, each in `RateLimit-Policy` and `RateLimit`; and the one the legacy headers
/// (and a 429's `Retry-After`) state.
#[derive(Debug, Clone)]
pub struct Showing<'a> {
    /// the first limit; most routes have only one
    first: Shown<'a>,
    /// the others, in order: empty, and so not allocated, for a route of one limit
    rest: Vec<Shown<'a>>,
    /// the index of the one the legacy headers state
    legacy: usize,
}

impl<'a> Showing<'a> {
    /// `first` alone, which the legacy headers state.
    pub fn one(first: Shown<'a>) -> Showing<'a> {
        Showing {
            first,
            rest: Vec::new(),
            legacy: 0,
        }
    }

    /// Adds the figures of the next limit; returns its index.
    pub fn push(&mut self, shown: Shown<'a>) -> usize {
        self.rest.push(shown);
        self.rest.len()
    }

    /// Makes the limit at `ix` the one the legacy headers state.
    pub fn state_in_legacy(&mut self, ix: usize) {
        if ix <= self.rest.len() {
            self.legacy = ix;
        }
    }

    /// The limit the legacy headers state.
    pub fn legacy(&self) -> &Shown<'a> {
        match self.legacy {
            0 => &self.first,
            n => self.rest.get(n - 1).unwrap_or(&self.first),
        }
    }

    /// Every limit, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Shown<'a>> {
        std::iter::once(&self.first).chain(&self.rest)
    }

    /// Every limit, in order, to correct its figures (a charge made after the response).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Shown<'a>> {
        std::iter::once(&mut self.first).chain(&mut self.rest)
    }
}

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Adds the rate-limit headers of `showing` in `style`: the IETF fields list every limit in
/// it, the legacy ones state the one it picks.
pub fn add_rate_headers(headers: &mut HeaderMap, style: HeaderStyle, showing: &Showing<'_>) {
    if matches!(style, HeaderStyle::Ietf | HeaderStyle::Both) {
        if showing.rest.is_empty() {
            let shown = &showing.first;
            let policy = match shown.policy {
                Some(v) => v.clone(),
                None => policy_value(shown.name, shown.quota, shown.window_secs),
            };
            headers.insert(RATELIMIT_POLICY.clone(), policy);
            insert(headers, &RATELIMIT, shown.state());
        } else {
            // a structured-field list: the items joined by ", "
            let (mut policies, mut states) = (Vec::new(), Vec::new());
            for shown in showing.iter() {
                if !policies.is_empty() {
                    policies.extend_from_slice(b", ");
                    states.extend_from_slice(b", ");
                }
                match shown.policy {
                    Some(v) => policies.extend_from_slice(v.as_bytes()),
                    None => {
                        policies.extend(policy_item(shown.name, shown.quota, shown.window_secs))
                    }
                }
                states.extend(shown.state());
            }
            insert(headers, &RATELIMIT_POLICY, policies);
            insert(headers, &RATELIMIT, states);
        }
    }
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        let shown = showing.legacy();
        headers.insert(X_LIMIT.clone(), HeaderValue::from(shown.quota));
        let remaining = shown.decision.remaining;
        headers.insert(X_REMAINING.clone(), HeaderValue::from(remaining));
        headers.insert(X_RESET.clone(), HeaderValue::from(shown.reset_secs()));
    }
}

/// The `RateLimit-Policy` value of a limit named `name` with `quota` per `window_secs`.
pub fn policy_value(name: &str, quota: u64, window_secs: u64) -> HeaderValue {
    // Structured-field strings: the limit name is quoted; names are validated to be tokens.
    item_value(Bytes::from(policy_item(name, quota, window_secs)))
}

/// `"name";q=N;w=S`; with no window (`window_secs` 0: concurrency, N at once) `"name";q=N`.
fn policy_item(name: &str, quota: u64, window_secs: u64) -> Vec<u8> {
    match window_secs {
        0 => item(name, ";q=", quota, "", 0),
        _ => item(name, ";q=", quota, ";w=", window_secs),
    }
}

/// [`policy_value`] for a limit's own parameters, made once when the config is loaded and put
/// on every response of its route: its bytes are static (kept for the life of the process,
/// one copy of each distinct value), so cloning it onto a response writes no reference count.
/// A value held in shared `Bytes` would: one count, written by every worker for every
/// response, and so a cache line the cores pass back and forth.
pub fn lasting_policy_value(name: &str, quota: u64, window_secs: u64) -> HeaderValue {
    static KEPT: Mutex<BTreeSet<&'static [u8]>> = Mutex::new(BTreeSet::new());
    let text = policy_item(name, quota, window_secs);
    let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
    let bytes: &'static [u8] = match kept.get(text.as_slice()) {
        Some(&b) => b,
        None => {
            let b: &'static [u8] = Vec::leak(text);
            kept.insert(b);
            b
        }
    };
    item_value(Bytes::from_static(bytes))
}

/// An [`item`] as a header value (the empty string item should its bytes not be a valid
/// value; limit names are validated tokens, so they are).
fn item_value(bytes: Bytes) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes).unwrap_or_else(|_| HeaderValue::from_static("\"\""))
}

/// `"name";k1=v1;k2=v2`, written without the formatting machinery: this runs on every
/// response of a limited route, where `write!` cost more than the limiter's own decision.
/// Its length is exact: a `Vec` whose length is its capacity becomes `Bytes` (and so a
/// `HeaderValue`) without a second allocation. An empty `k2` leaves out the second pair.
fn item(name: &str, k1: &str, v1: u64, k2: &str, v2: u64) -> Vec<u8> {
    let (mut b1, mut b2) = ([0; 20], [0; 20]);
    let d1 = crate::decimal::digits(v1, &mut b1);
    let d2 = match k2 {
        "" => &[][..],
        _ => crate::decimal::digits(v2, &mut b2),
    };
    let mut v = Vec::with_capacity(name.len() + 2 + k1.len() + d1.len() + k2.len() + d2.len());
    v.push(b'"');
    v.extend_from_slice(name.as_bytes());
    v.push(b'"');
    v.extend_from_slice(k1.as_bytes());
    v.extend_from_slice(d1);
    v.extend_from_slice(k2.as_bytes());
    v.extend_from_slice(d2);
    v
}

fn insert(headers: &mut HeaderMap, name: &HeaderName, value: Vec<u8>) {
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(value)) {
        headers.insert(name.clone(), v);
    }
}

/// A response with a JSON body.
pub fn json(status: StatusCode, body: String) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// Sets `Retry-After` in whole seconds, rounded up and at least 1 (RFC 9110 §10.2.3).
pub fn set_retry_after(headers: &mut HeaderMap, retry_after_ms: u64) {
    let secs = retry_after_ms.div_ceil(1000).max(1);
    headers.insert(RETRY_AFTER, HeaderValue::from(secs));
}

/// 429 answered by the limit named `answering`: the JSON body naming it, the rate-limit
/// headers of `showing`, and `Retry-After` of the refusal its legacy headers state, the one
/// that waits longest (that limit's own, or a later one's when several refuse).
pub fn rate_limited(style: HeaderStyle, answering: &str, showing: &Showing<'_>) -> Response<Body> {
    let retry = showing.legacy().decision.retry_after_ms;
    let name = json_string(answering);
    let body = format!(r#"{{"error":"rate_limited","limit":{name},"retry_after_ms":{retry}}}"#);
    let mut resp = json(StatusCode::TOO_MANY_REQUESTS, body);
    set_retry_after(resp.headers_mut(), retry);
    add_rate_headers(resp.headers_mut(), style, showing);
    resp
}

/// `resp`, made by tollgate, as a gRPC client reads an answer: HTTP 200, no body, and the
/// status `code` and `message` in `grpc-status` and `grpc-message`. Its other headers, such as
/// the rate-limit headers and `Retry-After`, stay as the call's metadata.
pub fn grpc(resp: Response<Body>, code: u8, message: &str) -> Response<Body> {
    let (mut parts, _) = resp.into_parts();
    parts.status = StatusCode::OK;
    parts.headers.remove(http::header::CONTENT_LENGTH);
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    parts
        .headers
        .insert(GRPC_STATUS.clone(), HeaderValue::from(u16::from(code)));
    let message = HeaderValue::try_from(grpc_message(message))
        .expect("a percent-encoded message is a valid header value");
    parts.headers.insert(GRPC_MESSAGE.clone(), message);
    let empty = http_body_util::Empty::new().map_err(|never| match never {});
    Response::from_parts(parts, empty.boxed())
}

static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// `text` as gRPC writes `grpc-message`: bytes outside printable ASCII, and `%`, percent-encoded.
fn grpc_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The error response for `err`: its status, a JSON body, and `Retry-After` where a wait helps.
pub fn error(err: &ProxyError) -> Response<Body> {
    let body = format!(
        r#"{{"error":"{}","message":{}}}"#,
        err.code(),
        json_string(&err.public_message())
    );
    let mut resp = json(err.status(), body);
    if let Some(ms) = err.retry_after_ms() {
        set_retry_after(resp.headers_mut(), ms);
    }
    resp
}

/// `s` as a JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    /// A gRPC message is percent-encoded where it leaves printable ASCII, and at `%`.
    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(grpc_message("rate limited by a-b"), "rate limited by a-b");
        assert_eq!(grpc_message("100% é\n"), "100%25 %C3%A9%0A");
    }

    use super::*;

    /// A limit's own policy value is kept once: equal values share their bytes (cloning one
    /// onto a response writes no reference count), and the text is `policy_value`'s.
    #[test]
    fn lasting_policy_values_are_kept_once() {
        let a = lasting_policy_value("per-client", 20, 4);
        let b = lasting_policy_value("per-client", 20, 4);
        let c = lasting_policy_value("per-client", 21, 4);
        assert_eq!(a, policy_value("per-client", 20, 4));
        assert_eq!(a.as_bytes(), br#""per-client";q=20;w=4"#);
        assert_eq!(a.as_bytes().as_ptr(), b.as_bytes().as_ptr(), "one copy");
        assert_eq!(c.as_bytes(), br#""per-client";q=21;w=4"#);
        let clone = a.clone();
        assert_eq!(clone.as_bytes().as_ptr(), a.as_bytes().as_ptr());
    }

    /// The hand-written items are exactly what `format!` writes, at every digit count.
    #[test]
    fn items_match_format() {
        let mut values = vec![0u64, 1, 9, 10, 99, 100, u64::MAX, u64::MAX - 1];
        let mut p = 1u64;
        while let Some(next) = p.checked_mul(10) {
            values.extend([p - 1, p, p + 1]);
            p = next;
        }
        for &a in &values {
            for &b in &[0u64, 7, 3600, u64::MAX] {
                assert_eq!(
                    item("per-ip", ";q=", a, ";w=", b),
                    format!("\"per-ip\";q={a};w={b}").into_bytes()
                );
                let v = item("per-ip", ";q=", a, ";w=", b);
                assert_eq!(v.len(), v.capacity(), "sized exactly");
            }
        }
    }

    fn shown<'a>(name: &'a str, policy: Option<&'a HeaderValue>, remaining: u64) -> Shown<'a> {
        Shown {
            name,
            quota: 10,
            window_secs: 60,
            policy,
            decision: Decision::counted(remaining > 0, remaining, 0, 30_000),
        }
    }

    /// Several limits are stated as structured-field lists, in order, whether a limit's policy
    /// value was made already or is made for the response; the legacy headers state the one
    /// picked.
    #[test]
    fn several_limits_are_listed_in_order() {
        let made = lasting_policy_value("b", 10, 60);
        let mut showing = Showing::one(shown("a", None, 7));
        let at = showing.push(shown("b", Some(&made), 2));
        showing.state_in_legacy(at);
        let mut headers = HeaderMap::new();
        add_rate_headers(&mut headers, HeaderStyle::Both, &showing);
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        assert_eq!(
            text("ratelimit-policy"),
            Some(r#""a";q=10;w=60, "b";q=10;w=60"#)
        );
        assert_eq!(text("ratelimit"), Some(r#""a";r=7;t=30, "b";r=2;t=30"#));
        assert_eq!(text("x-ratelimit-remaining"), Some("2"));
    }
}

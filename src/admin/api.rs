//! The operator API behind `/api/`: the [`Api`] the application supplies, and the answer to
//! one call, from its token and method checks to the call itself.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::header::ALLOW;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;

use super::{json_answer, AdminState};

/// The operator API behind `/api/`, supplied by the application.
pub trait Api: Send + Sync {
    /// `GET /api/stats`: this instance's figures
    fn stats(&self) -> serde_json::Value;

    /// `GET /api/stats?scope=fleet`: the figures of every instance sharing the store
    fn fleet(&self) -> ApiFuture<'_>;

    /// `GET /api/limits/<route>/<limit>?key=<client>`
    fn limit<'a>(&'a self, call: LimitCall<'a>) -> ApiFuture<'a>;

    /// `DELETE /api/limits/<route>/<limit>?key=<client>`, asked by `peer`
    fn reset<'a>(&'a self, call: LimitCall<'a>, peer: SocketAddr) -> ApiFuture<'a>;

    /// `DELETE /api/upstreams/<name>/hold`, asked by `peer`
    fn lift_hold<'a>(&'a self, upstream: &'a str, peer: SocketAddr) -> ApiFuture<'a>;
}

/// One client of one limit, as a `/api/limits/` call names it.
#[derive(Debug, Clone, Copy)]
pub struct LimitCall<'a> {
    pub route: &'a str,
    pub limit: &'a str,
    /// the client, as `overrides` name one: `192.0.2.7`, `a b`, `192.0.2.7|gold`
    pub key: &'a str,
}

/// An `/api/` answer: its status and JSON body.
#[derive(Debug)]
pub struct ApiAnswer {
    pub status: StatusCode,
    pub body: serde_json::Value,
}

impl ApiAnswer {
    /// 200 with `body`.
    pub fn ok(body: serde_json::Value) -> ApiAnswer {
        ApiAnswer {
            status: StatusCode::OK,
            body,
        }
    }

    /// An error: `{"error": code, "message": message}`.
    pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> ApiAnswer {
        let body = serde_json::json!({"error": code, "message": message.into()});
        ApiAnswer { status, body }
    }
}

/// The future of an `/api/` call.
pub type ApiFuture<'a> = Pin<Box<dyn Future<Output = ApiAnswer> + Send + 'a>>;

/// One `/api/` call: `call` is the path after `/api/`.
pub(super) async fn answer<B>(
    state: &AdminState,
    req: &Request<B>,
    call: &str,
    token: Option<Arc<str>>,
    peer: SocketAddr,
) -> Response<Full<Bytes>> {
    if let Some(token) = &token {
        if !bearer_matches(req, token) {
            let mut answer = api_error(ApiAnswer::error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this call needs Authorization: Bearer <admin.token>",
            ));
            answer.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
            return answer;
        }
    }
    let parts: Vec<&str> = call.split('/').collect();
    if let Some(refusal) = refusal(req.method(), &parts, token.is_some()) {
        return refusal;
    }
    let writes = *req.method() == Method::DELETE;
    let answer = match parts.as_slice() {
        ["stats"] => match scope(req.uri().query()) {
            Ok(Scope::Instance) => ApiAnswer::ok(state.api.stats()),
            Ok(Scope::Fleet) => state.api.fleet().await,
            Err(why) => ApiAnswer::error(StatusCode::BAD_REQUEST, "bad_scope", why),
        },
        ["limits", route, limit] => limit_call(state, req, (route, limit), writes, peer).await,
        ["upstreams", name, "hold"] => match percent_decoded(name) {
            Some(name) => state.api.lift_hold(&name, peer).await,
            None => ApiAnswer::error(
                StatusCode::BAD_REQUEST,
                "bad_path",
                "the upstream is not valid percent-encoded UTF-8",
            ),
        },
        _ => unreachable!("`refusal` answered every other call"),
    };
    json_answer(answer.status, &answer.body)
}

/// The answer to the call `parts` when it may not go ahead with `method`: 404 for an unknown
/// call, 405 with `Allow` for a method it does not take, 403 for a change without a token set.
fn refusal(method: &Method, parts: &[&str], token: bool) -> Option<Response<Full<Bytes>>> {
    let allowed = match parts {
        ["stats"] => "GET, HEAD",
        ["limits", _, _] => "GET, HEAD, DELETE",
        ["upstreams", _, "hold"] => "DELETE",
        _ => {
            let answer = ApiAnswer::error(StatusCode::NOT_FOUND, "not_found", "no such API call");
            return Some(api_error(answer));
        }
    };
    if !allowed.split(", ").any(|m| m == method.as_str()) {
        let mut answer = api_error(ApiAnswer::error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("use {allowed}"),
        ));
        answer
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static(allowed));
        return Some(answer);
    }
    if *method == Method::DELETE && !token {
        return Some(api_error(ApiAnswer::error(
            StatusCode::FORBIDDEN,
            "forbidden",
            "changes need a token: set admin.token, then send it as Authorization: Bearer",
        )));
    }
    None
}

/// A `/api/limits/<route>/<limit>` call: read that client's state, or with `writes` reset it.
async fn limit_call<B>(
    state: &AdminState,
    req: &Request<B>,
    (route, limit): (&str, &str),
    writes: bool,
    peer: SocketAddr,
) -> ApiAnswer {
    let (Some(route), Some(limit)) = (percent_decoded(route), percent_decoded(limit)) else {
        return ApiAnswer::error(
            StatusCode::BAD_REQUEST,
            "bad_path",
            "the route or limit is not valid percent-encoded UTF-8",
        );
    };
    let key = match client_key(req.uri().query()) {
        Ok(key) => key,
        Err(why) => return ApiAnswer::error(StatusCode::BAD_REQUEST, "bad_key", why),
    };
    let call = LimitCall {
        route: &route,
        limit: &limit,
        key: &key,
    };
    if writes {
        state.api.reset(call, peer).await
    } else {
        state.api.limit(call).await
    }
}

/// Whose figures `/api/stats` answers with.
#[derive(Debug, PartialEq, Eq)]
enum Scope {
    /// this instance's (`scope=instance`, or no scope)
    Instance,
    /// every instance's that shares the store (`scope=fleet`)
    Fleet,
}

/// The `scope` query parameter of `/api/stats`.
fn scope(query: Option<&str>) -> Result<Scope, String> {
    let given = query
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("scope="));
    match given {
        None | Some("instance") => Ok(Scope::Instance),
        Some("fleet") => Ok(Scope::Fleet),
        Some(other) => Err(format!(
            "unknown scope {:?}: use scope=instance (the default) or scope=fleet",
            percent_decoded(other).unwrap_or_else(|| other.to_owned())
        )),
    }
}

/// The `key` query parameter: the client, percent-decoded (`+` a space, as forms write it).
fn client_key(query: Option<&str>) -> Result<String, &'static str> {
    let value = query
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("key="))
        .ok_or("name the client: ?key=<client>, as the console shows it")?;
    // empty names a client too: one whose request had no host, under `key: host`
    percent_decoded(&value.replace('+', " ")).ok_or("the key is not valid percent-encoded UTF-8")
}

/// `text` with its `%XX` escapes decoded; `None` when they are malformed or not UTF-8.
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Whether `req` carries `Authorization: Bearer <token>`, compared in constant time.
fn bearer_matches<B>(req: &Request<B>, token: &str) -> bool {
    let Some(given) = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
    else {
        return false;
    };
    constant_time_eq(given.trim_ascii(), token.as_bytes())
}

/// `a == b`, in a time that depends on their lengths only, so a wrong token's answer tells
/// nothing of how much of it was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// An error of the API as a response.
pub(super) fn api_error(answer: ApiAnswer) -> Response<Full<Bytes>> {
    json_answer(answer.status, &answer.body)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn scopes() {
        assert_eq!(scope(None), Ok(Scope::Instance));
        assert_eq!(scope(Some("scope=instance")), Ok(Scope::Instance));
        assert_eq!(scope(Some("x=1&scope=fleet")), Ok(Scope::Fleet));
        let unknown = scope(Some("scope=world%21")).unwrap_err();
        assert!(unknown.contains("\"world!\""), "{unknown}");
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
    }
}

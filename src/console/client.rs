//! The command line's side of the operator API: `tollgate limits show|reset` asks a running
//! tollgate's admin listener, as a script would with curl.

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// What to ask: the listener (`http://127.0.0.1:9901`), the call and the token.
pub struct Ask<'a> {
    pub admin: &'a str,
    pub method: Method,
    /// `/api/...`, its query included
    pub path: String,
    pub token: Option<&'a str>,
}

/// Sends one request to the admin listener; its status and body, or why it could not be sent.
pub async fn ask(ask: Ask<'_>) -> Result<(StatusCode, String), String> {
    let base = ask.admin.trim_end_matches('/');
    let authority = base
        .strip_prefix("http://")
        .ok_or_else(|| format!("--admin {base}: expected http://HOST:PORT"))?;
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| format!("cannot reach the admin listener at {base}: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("{base}: {e}"))?;
    tokio::spawn(connection);
    let mut req = Request::builder()
        .method(ask.method)
        .uri(&ask.path)
        .header(http::header::HOST, authority);
    if let Some(token) = ask.token {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let req = req
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("{base}: {e}"))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("{base}: {e}"))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{base}: {e}"))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// `text` percent-encoded for a path segment or a query value: all but unreserved characters.
pub fn encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `body` indented for a reader when it is JSON, as it came otherwise.
pub fn pretty(body: String) -> String {
    serde_json::from_str::<serde_json::Value>(&body)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or(body)
}

/// The exit status a script reads from an answer: 0 success, 2 a request the API refused as
/// malformed, 3 no such route, limit or upstream, 4 the token is missing or wrong, 5 the store
/// did not answer, 1 anything else.
pub fn exit_status(status: StatusCode) -> u8 {
    match status.as_u16() {
        200..=299 => 0,
        400 => 2,
        404 => 3,
        401 | 403 => 4,
        503 => 5,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unreserved characters stay; the rest is escaped, UTF-8 byte by byte.
    #[test]
    fn encodes_what_a_query_cannot_hold() {
        assert_eq!(encoded("192.0.2.7|gold"), "192.0.2.7%7Cgold");
        assert_eq!(encoded("a b/é"), "a%20b%2F%C3%A9");
    }
}

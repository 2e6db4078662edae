//! A raw HTTP/1 client for tests that must send bytes no well-behaved client would: the
//! request line and head exactly as written, several requests on one connection.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One HTTP/1 response read off a raw connection.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// the head, lowercased
    pub head: String,
    pub body: Vec<u8>,
}

/// A raw client connection: bytes out, responses parsed one at a time.
pub struct RawConn {
    pub stream: TcpStream,
    pub buf: Vec<u8>,
    pub closed: bool,
}

impl RawConn {
    pub async fn open(addr: SocketAddr) -> RawConn {
        RawConn {
            stream: TcpStream::connect(addr).await.expect("connect"),
            buf: Vec::new(),
            closed: false,
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// Reads more bytes within `limit`; false when the peer closed or nothing came.
    pub async fn fill(&mut self, limit: Duration) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        match tokio::time::timeout(limit, self.stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                self.closed = true;
                false
            }
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            Err(_) => false,
        }
    }

    /// The next response, or `None` when the connection closed or 5 s passed without one.
    pub async fn response(&mut self) -> Option<RawResponse> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(parsed) = parse_response(&mut self.buf) {
                return Some(parsed);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.fill(left).await {
                return None;
            }
        }
    }

    /// Every response until the connection closes or goes quiet for `quiet`.
    pub async fn responses(&mut self, quiet: Duration) -> Vec<RawResponse> {
        let mut all = Vec::new();
        loop {
            while let Some(parsed) = parse_response(&mut self.buf) {
                all.push(parsed);
            }
            if !self.fill(quiet).await {
                return all;
            }
        }
    }

    /// Whether the peer closes the connection within `limit` (reading and discarding).
    pub async fn closes_within(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while !self.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.fill(left).await;
        }
        true
    }

    /// `GET path` on this connection; its status, or `None` when no response came.
    pub async fn get(&mut self, path: &str) -> Option<u16> {
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n");
        if self.stream.write_all(request.as_bytes()).await.is_err() {
            return None;
        }
        self.response().await.map(|r| r.status)
    }
}

/// Takes one complete response off the front of `buf` (Content-Length or chunked bodies).
pub fn parse_response(buf: &mut Vec<u8>) -> Option<RawResponse> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let status = head.get(9..12)?.parse().ok()?;
    let header = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(str::trim))
            .map(str::to_string)
    };
    let (body, used) = if header("transfer-encoding").as_deref() == Some("chunked") {
        dechunk(&buf[end..])?
    } else {
        let len: usize = header("content-length").and_then(|v| v.parse().ok())?;
        if buf.len() < end + len {
            return None;
        }
        (buf[end..end + len].to_vec(), len)
    };
    buf.drain(..end + used);
    Some(RawResponse { status, head, body })
}

/// A whole chunked body from the start of `data`: the body and the bytes it took.
fn dechunk(data: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let line_end = at + data[at..].windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[at..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        at = line_end + 2;
        if size == 0 {
            // no trailers from these servers: just the final CRLF
            return (data.len() >= at + 2).then_some((body, at + 2));
        }
        if data.len() < at + size + 2 {
            return None;
        }
        body.extend_from_slice(&data[at..at + size]);
        at += size + 2;
    }
}

/// Sends `bytes` on a fresh connection; every response until the server closes or goes quiet,
/// and whether it closed.
pub async fn exchange(addr: SocketAddr, bytes: &[u8]) -> (Vec<RawResponse>, bool) {
    let mut conn = RawConn::open(addr).await;
    conn.send(bytes).await;
    let responses = conn.responses(Duration::from_millis(1500)).await;
    (responses, conn.closed)
}

/// Sends `bytes` on a fresh connection and reads the first response (the connection may stay
/// open); panics when none comes.
pub async fn one(addr: SocketAddr, bytes: &[u8]) -> RawResponse {
    let mut conn = RawConn::open(addr).await;
    conn.send(bytes).await;
    conn.response()
        .await
        .unwrap_or_else(|| panic!("no response to {:.80?}", String::from_utf8_lossy(bytes)))
}

/// The `error` field of a JSON body.
pub fn error_code(r: &RawResponse) -> String {
    let v: serde_json::Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&r.body)));
    v["error"].as_str().unwrap_or_default().to_string()
}

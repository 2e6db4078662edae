//! Early answers that clients can read: a 413, 400, 408 or 429 that tollgate sends before it
//! read the request body is followed by a lingering close, so a client that writes its whole
//! body before it reads (Python's `http.client`, Go's `net/http`) gets the answer rather than
//! a broken pipe; and the linger is bounded in time and bytes. Real sockets, a real upstream,
//! tollgate in process, a real `redis-server` for the limit, Python when it is installed.

mod common;
common::both_http1_clients!();

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustls::pki_types::pem::PemObject;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use common::raw::{parse_response, RawResponse};
use common::{Proxy, Redis, Upstream, Yaml};

/// The body the clients send: twice `max_body_size`.
const BODY: usize = 2 * 1024 * 1024;

/// A proxy with `max_body_size: 1MiB`, the route `/v1` to `upstream`, the route `/s` to it
/// without the `/s` (for the upstream's `/slow/MS`), and `top` besides.
async fn proxy(upstream: &Upstream, top: &str) -> Proxy {
    let yaml = Yaml::to(&[upstream.url()])
        .top("max_body_size: 1MiB")
        .top(top)
        .route("api", "/v1", "")
        .route("strip", "/s", "strip_prefix: true")
        .build();
    Proxy::start(&yaml).await
}

/// A request head for `POST path` announcing a body of `len` bytes.
fn head(path: &str, len: usize) -> String {
    format!("POST {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {len}\r\n\r\n")
}

/// What a client that writes first and reads after got: the response, or what went wrong.
async fn read_after_writing<S>(stream: &mut S, bytes: &[u8]) -> Result<RawResponse, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream
        .write_all(bytes)
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(resp) = parse_response(&mut buf) {
            return Ok(resp);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut chunk)).await {
            Err(_) => return Err("no response within 10 s".into()),
            Ok(Err(e)) => return Err(format!("read: {e}")),
            Ok(Ok(0)) => return Err("closed before a whole response".into()),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// On a fresh connection, in a task of its own, writes `head` and then a body of `len` bytes,
/// without waiting for an answer, and only then reads: as Python's `http.client` sends a
/// request, the head in one write and the body in the next.
async fn write_then_read(
    addr: SocketAddr,
    head: String,
    len: usize,
) -> Result<RawResponse, String> {
    let task = tokio::spawn(async move {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(head.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        read_after_writing(&mut stream, &vec![b'x'; len]).await
    });
    task.await.expect("client task")
}

/// Tallies answers: "413" for a status, the error otherwise.
fn tally(results: &[Result<RawResponse, String>]) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for r in results {
        let key = match r {
            Ok(resp) => resp.status.to_string(),
            Err(e) => e.clone(),
        };
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
}

// ---------------------------------------------------------------------------------------------
// the answer reaches the client

/// A client that writes a 2 MiB body over `max_body_size` without waiting reads the 413, 20
/// times in 20, and the upstream is never asked.
#[tokio::test]
async fn a_client_writing_a_large_body_without_waiting_reads_the_413() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream, "").await;
    let mut results = Vec::new();
    for _ in 0..20 {
        results.push(write_then_read(proxy.addr, head("/v1/upload", BODY), BODY).await);
    }
    let counts = tally(&results);
    assert_eq!(counts.get("413"), Some(&20), "{counts:?}");
    let resp = results[0].as_ref().expect("413");
    assert!(resp.head.contains("connection: close"), "{}", resp.head);
    assert_eq!(common::raw::error_code(resp), "payload_too_large");
    assert!(
        upstream.seen().is_empty(),
        "no request reached the upstream"
    );
}

/// The same for the 400 of a request tollgate refuses before the proxy sees it (no Host), and
/// for a 429 of a limit kept in Redis, which leaves the body unread on a keep-alive connection.
#[tokio::test]
async fn early_400_and_429_are_read_too() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream, "").await;
    let no_host = format!("POST /v1/upload HTTP/1.1\r\nContent-Length: {BODY}\r\n\r\n");
    for _ in 0..5 {
        let resp = write_then_read(proxy.addr, no_host.clone(), BODY).await;
        assert_eq!(resp.map(|r| r.status), Ok(400));
    }

    let redis = Redis::start();
    let limit = "limits:
  - name: one
    algorithm: token_bucket
    key: ip
    rate: 1/m
    burst: 1";
    let yaml = Yaml::to(&[upstream.url()])
        .redis(&redis, "")
        .route("api", "/v1", limit)
        .build();
    let limited = Proxy::start(&yaml).await;
    let first = write_then_read(limited.addr, head("/v1/a", 1024), 1024).await;
    assert_eq!(first.map(|r| r.status), Ok(200));
    for _ in 0..5 {
        let resp = write_then_read(limited.addr, head("/v1/a", BODY), BODY).await;
        assert_eq!(resp.map(|r| r.status), Ok(429));
    }
}

/// A body that stalls gets 408; the client, which had not read, sends the rest of its body
/// afterwards and reads the 408.
#[tokio::test]
async fn a_client_that_stalled_reads_its_408_after_sending_the_rest() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream, "timeouts: {upstream_response: 1s, linger: 10s}").await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    // the upstream answers after 5 s without reading: the body waits on the client meanwhile
    let mut first = head("/s/slow/5000", 1_000_000).into_bytes();
    first.resize(first.len() + 1000, b'x');
    stream.write_all(&first).await.unwrap();
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let resp = read_after_writing(&mut stream, &vec![b'y'; 999_000]).await;
    let resp = resp.expect("the 408 is read");
    assert_eq!(resp.status, 408);
    assert_eq!(common::raw::error_code(&resp), "request_timeout");
}

/// Over TLS too: the close_notify and the FIN follow the 413, and the client, which wrote its
/// whole body first, reads the answer.
#[tokio::test]
async fn over_tls_a_client_writing_first_reads_the_413() {
    let pki = common::pki::Pki::new();
    let server = pki.issue("proxy", &["localhost"]);
    let upstream = Upstream::start().await;
    let tls = format!(
        "tls: {{cert: {}, key: {}}}",
        server.cert.display(),
        server.key.display()
    );
    let proxy = proxy(&upstream, &tls).await;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(pki.ca()).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut results = Vec::new();
    for _ in 0..20 {
        let tcp = TcpStream::connect(proxy.addr).await.unwrap();
        let mut stream = connector
            .connect(name.clone(), tcp)
            .await
            .expect("handshake");
        stream
            .write_all(head("/v1/upload", BODY).as_bytes())
            .await
            .unwrap();
        results.push(read_after_writing(&mut stream, &vec![b'x'; BODY]).await);
    }
    let counts = tally(&results);
    assert_eq!(counts.get("413"), Some(&20), "{counts:?}");
}

/// Python's `http.client` (and `requests`, when installed) read the 413 of a 2 MiB POST over
/// `max_body_size`, 20 times in 20.
#[tokio::test]
async fn python_clients_read_the_413() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("python3 is not installed: skipped (scripts/test installs it)");
        return;
    }
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream, "").await;
    let port = proxy.addr.port().to_string();
    let has_requests = Command::new("python3")
        .args(["-c", "import requests"])
        .output()
        .is_ok_and(|o| o.status.success());
    let mut kinds = vec!["http.client"];
    if has_requests {
        kinds.push("requests");
    } else {
        eprintln!("python3 has no requests module: only http.client checked");
    }
    for kind in kinds {
        let args = [port.clone(), "20".into(), kind.to_string()];
        // (blocking: off the runtime that may serve the proxy's listener)
        let run = move || {
            Command::new("python3")
                .arg("-c")
                .arg(PYTHON_CLIENT)
                .args(args)
                .output()
        };
        let out = tokio::task::spawn_blocking(run)
            .await
            .unwrap()
            .expect("python3 runs");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(said.trim(), format!("{kind}: 413 read 20/20 {{}}"));
    }
}

/// POSTs a 2 MiB body N times to 127.0.0.1:PORT/v1/upload with http.client or requests; prints
/// how often the status read was 413, and the other outcomes.
const PYTHON_CLIENT: &str = r#"
import http.client, sys
port, n, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
body = b"x" * (2 * 1024 * 1024)
ok, other = 0, {}
for _ in range(n):
    try:
        if kind == "requests":
            import requests
            status = requests.post(f"http://127.0.0.1:{port}/v1/upload", data=body, timeout=10).status_code
        else:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", "/v1/upload", body=body)
            status = conn.getresponse().status
            conn.close()
        key = "413" if status == 413 else str(status)
    except Exception as e:
        key = type(e).__name__
    if key == "413":
        ok += 1
    else:
        other[key] = other.get(key, 0) + 1
print(f"{kind}: 413 read {ok}/{n}", other)
"#;

// ---------------------------------------------------------------------------------------------
// the linger is bounded

/// Writes to `stream` until a write fails; the bytes written and how long it took. Each write
/// is `chunk` bytes, `pause` apart.
async fn send_until_cut(stream: &mut TcpStream, chunk: usize, pause: Duration) -> (u64, Duration) {
    let began = Instant::now();
    let data = vec![b'x'; chunk];
    let mut sent = 0u64;
    while began.elapsed() < Duration::from_secs(30) {
        match stream.write(&data).await {
            Ok(n) => sent += n as u64,
            Err(_) => break,
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    (sent, began.elapsed())
}

/// A client that keeps sending slowly after its 413 is cut off once `timeouts.linger` passed,
/// although it never stops.
#[tokio::test]
async fn a_client_that_never_stops_sending_is_cut_off_at_the_time_bound() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream, "timeouts: {linger: 1s}").await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(head("/v1/upload", 1 << 30).as_bytes())
        .await
        .unwrap();
    let mut answer = [0u8; 12];
    stream.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 413");
    // 50 KB a second: far from the byte bound in the time it may take
    let (sent, took) = send_until_cut(&mut stream, 1000, Duration::from_millis(20)).await;
    assert!(
        took < Duration::from_secs(5),
        "cut after {took:?}, {sent} bytes"
    );
    assert!(took > Duration::from_millis(500), "lingered only {took:?}");
}

/// A client that sends as fast as it can after its 413 is cut off after a few MiB, long before
/// `timeouts.linger` passed.
#[tokio::test]
async fn a_client_that_never_stops_sending_is_cut_off_at_the_byte_bound() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream, "timeouts: {linger: 60s}").await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(head("/v1/upload", 1 << 30).as_bytes())
        .await
        .unwrap();
    let (sent, took) = send_until_cut(&mut stream, 64 * 1024, Duration::ZERO).await;
    assert!(
        took < Duration::from_secs(20),
        "cut after {took:?}, {sent} bytes"
    );
    // 4 MiB discarded, and what the two sockets' buffers held besides
    assert!(sent < 64 << 20, "{sent} bytes sent before the cut");
    assert!(sent >= 4 << 20, "cut after only {sent} bytes");
}

// ---------------------------------------------------------------------------------------------
// HTTP/2

/// Over HTTP/2 a 413 ends its stream with RST_STREAM(NO_ERROR) after the answer (RFC 9113
/// §8.1), and the connection goes on: the next request on it is served.
#[tokio::test]
async fn an_http2_413_resets_only_its_stream_with_no_error() {
    let upstream = Upstream::start().await;
    let proxy = proxy(&upstream, "").await;
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.expect("h2c handshake");
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let url = proxy.url("/v1/upload");
    let req = http::Request::post(&url)
        .header("content-length", BODY)
        .body(())
        .unwrap();
    let (response, mut body) = client.send_request(req, false).unwrap();
    body.send_data(Bytes::from(vec![b'x'; 16 * 1024]), false)
        .unwrap();
    let response = response.await.expect("a response");
    assert_eq!(response.status(), 413);
    let reset = std::future::poll_fn(|cx| body.poll_reset(cx)).await;
    assert_eq!(reset.expect("the stream is reset"), h2::Reason::NO_ERROR);

    let mut client = client.ready().await.expect("the connection is still open");
    let req = http::Request::get(proxy.url("/v1/next")).body(()).unwrap();
    let (response, _) = client.send_request(req, true).unwrap();
    assert_eq!(response.await.expect("a response").status(), 200);
}

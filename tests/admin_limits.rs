//! The admin listener bounded like the proxy listener: the deadlines from the first byte (a
//! silent connection, the HTTP/2 preface a byte at a time, an idle h2c connection), the cap on
//! its connections, and the descriptors kept for the proxy: the tollgate binary under a low
//! `RLIMIT_NOFILE`, flooded with idle admin connections, and then with proxy connections until
//! accept fails.

mod common;
common::both_http1_clients!();

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{eventually, free_port, get, Proxy, Upstream, Yaml};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A proxy with an admin listener whose deadlines are short: `client_header` 1 s, `idle` 2 s.
async fn short_deadlines(admin: &str) -> (Proxy, Upstream) {
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .top(&format!("admin: {{listen: 127.0.0.1:0{admin}}}"))
        .top("timeouts: {client_header: 1s, idle: 2s}")
        .route("api", "/", "")
        .build();
    (Proxy::start(&yaml).await, upstream)
}

/// How long until the server closes `conn` (reads return end of stream or an error), reading
/// and dropping whatever it sends; `None` when still open after `limit`.
async fn closed_after(conn: &mut tokio::net::TcpStream, limit: Duration) -> Option<Duration> {
    let began = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        let left = limit.checked_sub(began.elapsed())?;
        match tokio::time::timeout(left, conn.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(began.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// A connection to the admin listener that sends nothing is closed at `client_header`, as the
/// proxy listener closes one.
#[tokio::test]
async fn a_silent_admin_connection_is_closed_at_client_header() {
    let (proxy, _upstream) = short_deadlines("").await;
    let admin = proxy.admin.expect("admin listener");
    let mut conn = tokio::net::TcpStream::connect(admin).await.unwrap();
    let took = closed_after(&mut conn, Duration::from_secs(8)).await;
    let took = took.expect("a silent admin connection is closed");
    assert!(
        took >= Duration::from_millis(900),
        "not before client_header: {took:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "about client_header: {took:?}"
    );
}

/// The HTTP/2 preface sent a byte at a time is cut off at `client_header` from the first byte:
/// bytes that keep coming do not keep the connection.
#[tokio::test]
async fn a_preface_sent_a_byte_at_a_time_is_cut_at_client_header() {
    let (proxy, _upstream) = short_deadlines("").await;
    let admin = proxy.admin.expect("admin listener");
    let mut conn = tokio::net::TcpStream::connect(admin).await.unwrap();
    let began = Instant::now();
    let mut cut = None;
    for byte in PREFACE.iter().cycle().take(200) {
        if conn.write_all(&[*byte]).await.is_err() {
            cut = Some(began.elapsed());
            break;
        }
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_millis(200), conn.read(&mut buf)).await;
        if let Ok(Ok(0) | Err(_)) = read {
            cut = Some(began.elapsed());
            break;
        }
    }
    let cut = cut.expect("the trickle is cut off");
    assert!(
        cut >= Duration::from_millis(900),
        "not before client_header: {cut:?}"
    );
    assert!(cut < Duration::from_secs(5), "about client_header: {cut:?}");
}

/// An h2c connection that made a request and then falls silent gets its GOAWAY at `idle` and
/// is closed soon after.
#[tokio::test]
async fn an_idle_h2c_admin_connection_is_closed_at_idle() {
    let (proxy, _upstream) = short_deadlines("").await;
    let admin = proxy.admin.expect("admin listener");
    let tcp = tokio::net::TcpStream::connect(admin).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(tcp);
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .expect("h2c handshake");
    let driven = tokio::spawn(conn);
    let req = http::Request::get(format!("http://{admin}/healthz"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.expect("an answer over h2c");
    assert_eq!(resp.status(), 200);
    drop(resp);
    let answered = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), driven)
        .await
        .expect("the idle h2c connection is closed")
        .unwrap()
        .ok();
    let took = answered.elapsed();
    assert!(
        took >= Duration::from_millis(1800),
        "not before idle: {took:?}"
    );
    assert!(took < Duration::from_secs(6), "about idle: {took:?}");
}

/// Past `admin.max_connections`, a new admin connection is closed at once; once one of the
/// held ones closes, the listener answers again.
#[tokio::test]
async fn connections_past_max_connections_are_closed_at_once() {
    let (proxy, _upstream) = short_deadlines(", max_connections: 3").await;
    let admin = proxy.admin.expect("admin listener");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tokio::net::TcpStream::connect(admin).await.unwrap());
    }
    // the held ones are counted once accepted
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut past = tokio::net::TcpStream::connect(admin).await.unwrap();
    let took = closed_after(&mut past, Duration::from_millis(800)).await;
    assert!(took.is_some(), "the fourth connection is closed at once");
    drop(held.pop());
    let url = format!("http://{admin}/healthz");
    eventually(Duration::from_secs(3), || async {
        get(&url, &[]).await.status == 200
    })
    .await;
    // and the proxy listener is not capped by it
    assert_eq!(get(&proxy.url("/"), &[]).await.status, 200);
}

/// A tollgate binary run under `ulimit -n NOFILE`, logging to a channel.
struct Binary {
    child: Child,
    proxy: u16,
    admin: u16,
    log: mpsc::Receiver<String>,
    _dir: tempfile::TempDir,
}

impl Binary {
    fn start(nofile: u32, upstream: &str, more: &str) -> Binary {
        let (proxy, admin) = (free_port(), free_port());
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("proxy.yaml");
        let text = format!(
            "listen: 127.0.0.1:{proxy}\nworkers: 1\n{more}\
             upstreams:\n  api:\n    targets: [{upstream}]\n\
             routes:\n  - {{name: api, match: {{path_prefix: /}}, upstream: api}}\n"
        );
        let text = text.replace("ADMIN", &format!("127.0.0.1:{admin}"));
        std::fs::write(&config, text).unwrap();
        let script = format!("ulimit -n {nofile} && exec \"$0\" --config \"$1\"");
        let mut child = Command::new("bash")
            .args(["-c", &script, env!("CARGO_BIN_EXE_tollgate")])
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("bash runs tollgate");
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        let binary = Binary {
            child,
            proxy,
            admin,
            log,
            _dir: dir,
        };
        let up = Instant::now();
        while TcpStream::connect(("127.0.0.1", admin)).is_err() {
            assert!(
                up.elapsed() < Duration::from_secs(20),
                "tollgate did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        binary
    }

    /// The log lines so far.
    fn lines(&self) -> Vec<String> {
        self.log.try_iter().collect()
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status of one `GET /` on a new connection, 0 when none came within 3 s.
fn proxy_get(port: u16) -> u16 {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut conn) = TcpStream::connect_timeout(&addr, Duration::from_secs(3)) else {
        return 0;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(3)));
    let head = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if conn.write_all(head.as_bytes()).is_err() {
        return 0;
    }
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Opens `count` connections to `port` that send nothing.
fn idle_connections(port: u16, count: usize) -> Vec<TcpStream> {
    (0..count)
        .map(|_| {
            let conn = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            conn.set_nonblocking(true).unwrap();
            conn
        })
        .collect()
}

/// How many of `conns` the server has closed since the last look (a read finds end of stream
/// or a reset); those are dropped from `conns`.
fn closed(conns: &mut Vec<TcpStream>) -> usize {
    let before = conns.len();
    let mut buf = [0u8; 64];
    conns.retain_mut(|c| match c.read(&mut buf) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
    });
    before - conns.len()
}

/// Under `ulimit -n 256`, 400 idle admin connections (more than the limit) leave the proxy
/// serving: the admin listener holds only what leaves the proxy its reserve, closes the rest
/// at once, says so once, and closes the ones it held at `client_header`.
#[tokio::test]
async fn idle_admin_flood_under_a_low_descriptor_limit_leaves_the_proxy_serving() {
    let upstream = Upstream::start().await;
    let more = "admin: {listen: ADMIN, max_connections: 1000}\n\
                timeouts: {client_header: 4s, idle: 4s}\n";
    let url = upstream.url();
    let bin = tokio::task::spawn_blocking(move || {
        let bin = Binary::start(256, &url, more);
        let mut flood = idle_connections(bin.admin, 400);
        // those past the reserve are closed at once; the held ones at client_header (4 s)
        std::thread::sleep(Duration::from_secs(1));
        let at_once = closed(&mut flood);
        let mut statuses = Vec::new();
        for _ in 0..10 {
            statuses.push(proxy_get(bin.proxy));
            std::thread::sleep(Duration::from_millis(200));
        }
        let waited = Instant::now();
        let mut all = at_once;
        while !flood.is_empty() && waited.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(200));
            all += closed(&mut flood);
        }
        statuses.push(proxy_get(bin.proxy));
        (bin, statuses, at_once, all)
    })
    .await
    .unwrap();
    let (bin, statuses, at_once, all) = bin;
    let lines = bin.lines();
    assert!(
        statuses.iter().all(|s| *s == 200),
        "every proxy request answered: {statuses:?}\n{}",
        lines.join("\n")
    );
    assert!(
        (400 - 192..400).contains(&at_once),
        "past the reserve closed at once, the rest held: {at_once}"
    );
    assert_eq!(all, 400, "every idle admin connection closed");
    let said = |what: &str| lines.iter().filter(|l| l.contains(what)).count();
    assert_eq!(
        said("closing new connections at once"),
        1,
        "said once:\n{}",
        lines.join("\n")
    );
    assert_eq!(said("accept failed"), 0, "{}", lines.join("\n"));
}

/// When the proxy's own accept fails for want of descriptors, the admin listener closes its
/// idle connections (and stops accepting) so the proxy gets them: the proxy's connections are
/// then accepted and served long before the admin ones' `client_header` would have closed them.
#[tokio::test]
async fn proxy_accept_out_of_descriptors_sheds_idle_admin_connections() {
    let upstream = Upstream::start().await;
    let more = "admin: {listen: ADMIN, max_connections: 1000}\n\
                timeouts: {client_header: 60s, idle: 60s}\n";
    let url = upstream.url();
    let outcome = tokio::task::spawn_blocking(move || {
        let bin = Binary::start(160, &url, more);
        // the admin listener holds up to three quarters of the limit, and refuses the rest
        let mut admin = idle_connections(bin.admin, 160);
        std::thread::sleep(Duration::from_millis(500));
        let refused = closed(&mut admin);
        // proxy connections, idle too, until the proxy's accept fails: the admin gives way
        let proxy = idle_connections(bin.proxy, 90);
        let began = Instant::now();
        let mut shed = 0;
        let mut status = 0;
        while began.elapsed() < Duration::from_secs(20) {
            shed += closed(&mut admin);
            status = proxy_get(bin.proxy);
            if status == 200 && shed > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let took = began.elapsed();
        drop(proxy);
        (bin, refused, shed, status, took)
    })
    .await
    .unwrap();
    let (bin, refused, shed, status, took) = outcome;
    let lines = bin.lines();
    let log = lines.join("\n");
    eprintln!("{refused} admin connections refused, {shed} shed; proxy 200 again after {took:?}");
    assert!(
        refused > 0 && refused < 160,
        "some held, some refused: {refused}\n{log}"
    );
    assert!(shed > 0, "idle admin connections shed\n{log}");
    assert_eq!(status, 200, "the proxy serves again\n{log}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    let said = |what: &str| lines.iter().filter(|l| l.contains(what)).count();
    assert_eq!(said("file descriptors ran out"), 1, "said once:\n{log}");
}

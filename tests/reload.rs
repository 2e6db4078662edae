//! Hot reload: a change of the config file swaps routes, limits and upstreams while a client
//! keeps sending requests; an invalid file is rejected and the old config stays in force.

mod common;
common::both_http1_clients!();

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{eventually, get, Proxy, Upstream, Yaml};

/// Upstream `api` behind one limited catch-all route, with `top` keys and, in front of it, a
/// route `new` for `/new` without limits when `new_route` is set.
fn yaml(upstream: &Upstream, burst: u32, top: &str, new_route: bool) -> String {
    let mut yaml = Yaml::to(&[upstream.url()]).top(top);
    if new_route {
        yaml = yaml.route("new", "/new", "");
    }
    let limit = format!(
        "limits:\n  - {{name: per-client, algorithm: token_bucket, key: header:x-client, \
         rate: 1/h, burst: {burst}}}"
    );
    yaml.route("api", "/", &limit).build()
}

/// Writes `text` to `path` the way editors do: a new file renamed over the old one.
fn replace_file(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Writes `text` to `proxy.yaml` in a new temporary directory and starts tollgate on it,
/// reloading it when it changes; the directory lives as long as the returned guard.
async fn start_watching(text: &str) -> (tempfile::TempDir, std::path::PathBuf, Proxy) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.yaml");
    std::fs::write(&path, text).unwrap();
    let proxy = Proxy::start_watching(&path).await;
    (dir, path, proxy)
}

/// A client looping requests sees no error across several reloads (one of them invalid);
/// each valid reload takes effect, the invalid one leaves the old config in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_under_load_drop_nothing() {
    let upstream = Upstream::start().await;
    // (the admin listener counts the reloads)
    let admin = "admin: {listen: 127.0.0.1:0}";
    let (_dir, path, proxy) = start_watching(&yaml(&upstream, 2, admin, false)).await;
    let metrics = format!("http://{}/metrics", proxy.admin.expect("admin listener"));

    // the background client: a fresh identity per request so limits never deny it
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let loop_url = proxy.url("/load");
    let looping = {
        let (stop, sent, failed) = (stop.clone(), sent.clone(), failed.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let a = get(&loop_url, &[("x-client", &format!("loop-{i}"))]).await;
                sent.fetch_add(1, Ordering::Relaxed);
                if a.status != 200 {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    // burst 2 in force
    let statuses = |client: &'static str, n: usize| {
        let url = proxy.url("/x");
        async move {
            let mut s = Vec::new();
            for _ in 0..n {
                s.push(get(&url, &[("x-client", client)]).await.status);
            }
            s
        }
    };
    assert_eq!(statuses("a", 3).await, [200, 200, 429]);

    // reload 1: burst 5 (the key is the same, so the bucket keeps what was taken)
    replace_file(&path, &yaml(&upstream, 5, admin, false));
    eventually(Duration::from_secs(5), || async {
        get(&proxy.url("/x"), &[("x-client", "a")]).await.status == 200
    })
    .await;

    // reload 2: invalid; the old config (burst 5, no /new route) stays
    replace_file(
        &path,
        "listen: 127.0.0.1:0\nroutes: [{name: broken, upstream: nowhere}]\n",
    );
    eventually(Duration::from_secs(5), || async {
        let text = get(&metrics, &[]).await.body;
        text.contains("tollgate_config_reloads_total{result=\"error\"} 1")
    })
    .await;
    assert_eq!(
        statuses("b", 6).await,
        [200, 200, 200, 200, 200, 429],
        "burst 5 still in force"
    );

    // reload 3: a new route in front
    replace_file(&path, &yaml(&upstream, 5, admin, true));
    eventually(Duration::from_secs(5), || async {
        get(&proxy.url("/new"), &[("x-client", "c")])
            .await
            .header("ratelimit")
            .is_none()
    })
    .await;

    stop.store(true, Ordering::Relaxed);
    looping.await.unwrap();
    assert!(sent.load(Ordering::Relaxed) > 20, "the client kept sending");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "no request failed across reloads"
    );
    proxy.shutdown().await;
}

/// A reload cannot move the listeners: `/config` goes on showing the ones in force (not the
/// file's new `listen`), alongside the routes the reload did change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_shows_the_listeners_in_force_after_a_reload() {
    let upstream = Upstream::start().await;
    let first = yaml(&upstream, 5, "admin: {listen: 127.0.0.1:0}", false);
    let (_dir, path, proxy) = start_watching(&first).await;
    let config_url = format!("http://{}/config", proxy.admin.expect("admin listener"));
    let moved = yaml(&upstream, 5, "admin: {listen: 127.0.0.1:2}", true)
        .replace("listen: 127.0.0.1:0", "listen: 127.0.0.1:1");
    replace_file(&path, &moved);
    eventually(Duration::from_secs(5), || async {
        get(&config_url, &[]).await.body.contains("\"new\"")
    })
    .await;
    let json: serde_json::Value = serde_json::from_str(&get(&config_url, &[]).await.body).unwrap();
    assert_eq!(json["listen"][0], "127.0.0.1:0", "{json}");
    assert_eq!(json["admin"]["listen"], "127.0.0.1:0", "{json}");
    proxy.shutdown().await;
}

/// A reload applies to the next request of a connection kept alive across it: the proxy in
/// force is looked up for each request, not once per connection (a connection holds it between
/// requests, and must let it go when a reload swaps it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_sees_a_reload_at_its_next_request() {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::TokioIo;

    let upstream = Upstream::start().await;
    // a burst the test never spends: every answer is a 200
    let (_dir, path, proxy) = start_watching(&yaml(&upstream, 1000, "", false)).await;

    let stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let (mut conn, driver) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let driven = tokio::spawn(driver);
    // one request on the one connection, once it is ready for the next; its `RateLimit`
    // header, if any
    async fn ask(conn: &mut hyper::client::conn::http1::SendRequest<Empty<bytes::Bytes>>) -> bool {
        // the connection may still be finishing the last answer: wait, rather than be refused
        conn.ready()
            .await
            .expect("the kept-alive connection stays open");
        let req = hyper::Request::get("/new")
            .header("host", "localhost")
            .header("x-client", "kept")
            .body(Empty::<bytes::Bytes>::new())
            .unwrap();
        let resp = conn
            .send_request(req)
            .await
            .expect("the kept-alive connection still serves");
        assert_eq!(resp.status(), 200);
        let limited = resp.headers().contains_key("ratelimit");
        resp.into_body().collect().await.unwrap();
        limited
    }
    // `/new` is served by the limited catch-all route
    assert!(ask(&mut conn).await, "the catch-all route's limit shows");

    // a route of its own for `/new`, without limits, in front of the catch-all
    replace_file(&path, &yaml(&upstream, 1000, "", true));
    // (the one connection behind a lock, so that each probe of `eventually` can use it)
    let conn = Arc::new(tokio::sync::Mutex::new(conn));
    eventually(Duration::from_secs(5), || {
        let conn = conn.clone();
        async move { !ask(&mut *conn.lock().await).await }
    })
    .await;
    assert!(!driven.is_finished(), "one connection throughout");
    proxy.shutdown().await;
}

/// A reload's `client_header` and `idle` apply from the next connection (they stayed those of
/// the start while `/config` showed the new ones): a silent new connection and an idle
/// kept-alive one are closed after the new second, not the old ten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloaded_connection_timeouts_apply_to_new_connections() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = Upstream::start().await;
    let with = |burst, secs| {
        let timeouts = format!("timeouts: {{idle: {secs}s, client_header: {secs}s}}");
        yaml(&upstream, burst, &timeouts, false)
    };
    let (_dir, path, proxy) = start_watching(&with(3, 10)).await;
    replace_file(&path, &with(4, 1));
    eventually(Duration::from_secs(10), || async {
        let a = get(&proxy.url("/"), &[("x-client", "probe")]).await;
        a.header("ratelimit-policy") == Some(r#""per-client";q=4;w=14400"#)
    })
    .await;
    // closed: the read ends (0 bytes, or an error) before 5 s
    async fn closed_within(s: &mut tokio::net::TcpStream, limit: Duration) -> bool {
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout(limit, s.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
            }
        }
    }
    let mut silent = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)).await,
        "a silent connection outlived the new client_header"
    );
    let mut kept = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nx-client: kept\r\n\r\n")
        .await
        .unwrap();
    assert!(
        closed_within(&mut kept, Duration::from_secs(5)).await,
        "an idle kept-alive connection outlived the new idle"
    );
}

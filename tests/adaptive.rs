//! Adaptive pacing end to end, with a real Redis, real upstreams and two tollgate instances:
//! the fleet finds an upstream's capacity from its 503s and follows it when it grows; the rate
//! is one for the fleet; a slow answer past `target_latency` lowers it; the memory store adapts
//! too. Through a Redis outage each instance paces at its share, an emptied Redis resumes from
//! the last rate, and answers timed across a stopped process count for nothing.

mod common;
common::both_http1_clients!();

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{eventually, get, Proxy, Redis, Upstream, Yaml};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// An upstream that serves at most `cap` requests in any second (a log of what it served in
/// the last one) and answers 503, with no `Retry-After`, to the rest.
struct Capped {
    addr: std::net::SocketAddr,
    cap: Arc<AtomicU32>,
    /// every request: when it came and whether it was served
    log: Arc<Mutex<Vec<(Instant, bool)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Capped {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Capped {
    async fn start(cap: u32) -> Capped {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cap = Arc::new(AtomicU32::new(cap));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (cap2, log2) = (cap.clone(), log.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (cap, log) = (cap2.clone(), log2.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |_req| {
                        let served = admit(&cap, &log);
                        let status = if served { 200 } else { 503 };
                        let resp = http::Response::builder()
                            .status(status)
                            .body(Full::new(bytes::Bytes::from_static(b"x")))
                            .unwrap();
                        async move { Ok::<_, Infallible>(resp) }
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        Capped {
            addr,
            cap,
            log,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Served per second and the share answered 503, of the requests that came between `from`
    /// and `to` after `t0`.
    fn window(&self, t0: Instant, from: f64, to: f64) -> (f64, f64) {
        let log = self.log.lock().unwrap();
        let inside = log.iter().filter(|(at, _)| {
            let s = at.duration_since(t0).as_secs_f64();
            s >= from && s < to
        });
        let (mut served, mut refused) = (0u32, 0u32);
        for (_, ok) in inside {
            if *ok {
                served += 1;
            } else {
                refused += 1;
            }
        }
        let share = f64::from(refused) / f64::from((served + refused).max(1));
        (f64::from(served) / (to - from), share)
    }
}

/// Whether one more request fits in the last second's `cap`; it is logged either way.
fn admit(cap: &AtomicU32, log: &Mutex<Vec<(Instant, bool)>>) -> bool {
    let now = Instant::now();
    let mut log = log.lock().unwrap();
    let second_ago = now - Duration::from_secs(1);
    let served = log
        .iter()
        .rev()
        .take_while(|(at, _)| *at > second_ago)
        .filter(|(_, ok)| *ok)
        .count();
    let ok = served < cap.load(Ordering::Relaxed) as usize;
    log.push((now, ok));
    ok
}

/// Sends `per_second` GETs a second, round robin over `urls`, until dropped.
fn offer(urls: Vec<String>, per_second: f64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = common::http_client();
        let mut every = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
        for i in 0.. {
            every.tick().await;
            let client = client.clone();
            let url = urls[i % urls.len()].clone();
            tokio::spawn(async move {
                let req = http::Request::get(url).body(common::full("")).unwrap();
                if let Ok(resp) = client.request(req).await {
                    let _ = resp.into_body().collect().await;
                }
            });
        }
    })
}

/// `tollgate_pace_rate{upstream="api"}` on the admin listener at `admin`.
async fn pace_rate(admin: std::net::SocketAddr) -> Option<f64> {
    let text = get(&format!("http://{admin}/metrics"), &[]).await.body;
    text.lines()
        .find(|l| l.starts_with("tollgate_pace_rate{upstream=\"api\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A config for upstream `api` at `target`, paced by `pace`, with an admin listener.
fn config(store: Option<&Redis>, target: &str, pace: &str) -> String {
    let yaml = Yaml::to(&[target]).top("admin:\n  listen: 127.0.0.1:0");
    let yaml = match store {
        Some(redis) => yaml.redis(redis, "timeout: 500ms"),
        None => yaml,
    };
    yaml.upstream(&format!("pace: {pace}"))
        .route("api", "/", "")
        .build()
}

/// The demonstration: an upstream that takes 20 requests a second (503 past that) behind two
/// instances, paced from 100/s, offered 60/s. Within 10 s its 503s fall under a tenth of what
/// it gets while it serves at least 14/s; when it takes 40/s, the rate follows within 10 s:
/// it serves at least 28/s in the two seconds before then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_find_the_capacity_and_follow_it() {
    let redis = Redis::start();
    let upstream = Capped::start(20).await;
    let pace = "{rate: 100/s, max_delay: 250ms, adaptive: {min: 1/s, max: 200/s}}";
    let yaml = config(Some(&redis), &upstream.url(), pace);
    let (a, b) = (Proxy::start(&yaml).await, Proxy::start(&yaml).await);
    let t0 = Instant::now();
    let load = offer(vec![a.url("/"), b.url("/")], 60.0);
    let curve = tokio::spawn(sample_curve(t0, [a.admin.unwrap(), b.admin.unwrap()]));

    tokio::time::sleep_until((t0 + Duration::from_secs(10)).into()).await;
    let (served, refused) = upstream.window(t0, 7.0, 10.0);
    upstream.cap.store(40, Ordering::Relaxed);
    let doubled = t0.elapsed().as_secs_f64();
    tokio::time::sleep_until((t0 + Duration::from_secs(20)).into()).await;
    let (served_after, refused_after) = upstream.window(t0, doubled + 8.0, doubled + 10.0);
    load.abort();
    curve.abort();
    let story = format!(
        "7-10 s: {served:.1}/s served, {:.1} % 503; after doubling, +8-10 s: {served_after:.1}/s \
         served, {:.1} % 503; per second (served, 503):\n{}",
        refused * 100.0,
        refused_after * 100.0,
        (0..20)
            .map(|s| {
                let (ok, share) = upstream.window(t0, f64::from(s), f64::from(s + 1));
                format!("{s}: {ok:.0} {:.0}%", share * 100.0)
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("{story}");
    assert!(
        refused < 0.10,
        "503 share not under 10 % within 10 s: {story}"
    );
    assert!(served >= 14.0, "served under 70 % of capacity: {story}");
    assert!(
        served_after >= 28.0,
        "the rate did not follow the doubling: {story}"
    );
    assert!(refused_after < 0.10, "{story}");
}

/// Reads both instances' rates once a second while the demonstration runs, printed for a
/// reader of the test's output (`--nocapture`).
async fn sample_curve(t0: Instant, admins: [std::net::SocketAddr; 2]) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (ra, rb) = (pace_rate(admins[0]).await, pace_rate(admins[1]).await);
        println!("{:5.1} s: rate {ra:?} / {rb:?}", t0.elapsed().as_secs_f64());
    }
}

/// The rate is the fleet's: trouble seen through one instance lowers the rate the other paces
/// at, which itself sent nothing; the shared key holds that rate.
#[tokio::test]
async fn the_rate_is_shared_by_the_fleet() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let pace = "{rate: 50/s, max_delay: 1s, adaptive: {min: 5/s, max: 100/s, decrease: 0.5}}";
    let yaml = config(Some(&redis), &upstream.url(), pace);
    let (a, b) = (Proxy::start(&yaml).await, Proxy::start(&yaml).await);
    let (admin_a, admin_b) = (a.admin.unwrap(), b.admin.unwrap());
    eventually(Duration::from_secs(5), || async {
        pace_rate(admin_b).await == Some(50.0)
    })
    .await;
    // 503s through `a` only, for a little over one period
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(700) {
        assert_eq!(get(&a.url("/status/503"), &[]).await.status, 503);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // (once `a` has reported its last period, both read the same)
    tokio::time::sleep(Duration::from_millis(700)).await;
    eventually(Duration::from_secs(5), || async {
        let (ra, rb) = (pace_rate(admin_a).await, pace_rate(admin_b).await);
        ra == rb && rb.is_some_and(|r| r <= 25.0)
    })
    .await;
    let rb = pace_rate(admin_b).await;
    let stored: f64 = redis
        .cli(&["hget", "tollgate:upstream:api:rate", "rate"])
        .trim()
        .parse()
        .unwrap();
    assert_eq!(Some(stored), rb);
    // healthy answers raise it again, one step a period
    let low = rb.unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        assert_eq!(get(&b.url("/"), &[]).await.status, 200);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eventually(Duration::from_secs(3), || async {
        pace_rate(admin_a).await.is_some_and(|r| r > low)
    })
    .await;
}

/// With `target_latency`, answers slower than it are trouble: a slow upstream brings the rate
/// down although it answers 200, on the memory store (no Redis), and a fast one does not.
#[tokio::test]
async fn slow_answers_lower_the_rate_in_memory_too() {
    let upstream = Upstream::start().await;
    let pace = "{rate: 40/s, max_delay: 2s, adaptive: {min: 1/s, max: 40/s, \
                target_latency: 100ms}}";
    let proxy = Proxy::start(&config(None, &upstream.url(), pace)).await;
    let admin = proxy.admin.unwrap();
    eventually(Duration::from_secs(5), || async {
        pace_rate(admin).await == Some(40.0)
    })
    .await;
    // fast answers: healthy, and the rate is at its max already
    for _ in 0..10 {
        assert_eq!(get(&proxy.url("/"), &[]).await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(pace_rate(admin).await, Some(40.0));
    // answers after 250 ms: trouble, once a period
    let slow: Vec<_> = (0..6)
        .map(|_| {
            let url = proxy.url("/slow/250");
            tokio::spawn(async move { get(&url, &[]).await.status })
        })
        .collect();
    for s in slow {
        assert_eq!(s.await.unwrap(), 200);
    }
    eventually(Duration::from_secs(3), || async {
        pace_rate(admin).await.is_some_and(|r| r <= 28.0)
    })
    .await;
}

/// Redis killed: each of two instances (`store.instances: 2`) paces at half the fleet's last
/// rate, and says so in `tollgate_pace_rate` and `/api/stats`; what reaches the upstream
/// through one of them is about that half.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_instance_paces_at_its_share_while_redis_is_out() {
    let mut redis = Redis::start();
    let upstream = Upstream::start().await;
    let pace = "{rate: 40/s, max_delay: 1s, adaptive: {min: 5/s, max: 40/s}}";
    let yaml = Yaml::to(&[upstream.url()])
        .top("admin:\n  listen: 127.0.0.1:0")
        .redis(&redis, "timeout: 200ms\ninstances: 2")
        .upstream(&format!("pace: {pace}"))
        .route("api", "/", "")
        .build();
    let (a, b) = (Proxy::start(&yaml).await, Proxy::start(&yaml).await);
    let admins = [a.admin.unwrap(), b.admin.unwrap()];
    for admin in admins {
        eventually(Duration::from_secs(5), || async {
            pace_rate(admin).await == Some(40.0)
        })
        .await;
    }
    redis.kill();
    for admin in admins {
        eventually(Duration::from_secs(5), || async {
            pace_rate(admin).await == Some(20.0)
        })
        .await;
    }
    let stats = get(&format!("http://{}/api/stats", admins[0]), &[])
        .await
        .body;
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(stats["upstreams"][0]["pace_rate"], 20.0, "{stats}");
    // 60/s offered through `a` for 3 s: the upstream gets about 20/s of it
    let before = upstream.seen().len();
    let load = offer(vec![a.url("/")], 60.0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    load.abort();
    let per_second = (upstream.seen().len() - before) as f64 / 3.0;
    assert!(
        (12.0..=26.0).contains(&per_second),
        "{per_second:.1}/s reached the upstream through one of two instances"
    );
}

/// Redis restarted empty: the fleet's rate resumes from the last one the instance knew, not
/// from `rate`.
#[tokio::test]
async fn an_emptied_redis_resumes_from_the_last_known_rate() {
    let mut redis = Redis::start();
    let upstream = Upstream::start().await;
    let pace = "{rate: 50/s, max_delay: 1s, adaptive: {min: 5/s, max: 100/s, decrease: 0.5}}";
    let proxy = Proxy::start(&config(Some(&redis), &upstream.url(), pace)).await;
    let admin = proxy.admin.unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(300) {
        get(&proxy.url("/status/503"), &[]).await;
    }
    eventually(Duration::from_secs(3), || async {
        pace_rate(admin).await == Some(25.0)
    })
    .await;
    redis.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(pace_rate(admin).await, Some(25.0));
    redis.restart();
    let stored = || redis.cli(&["hget", "tollgate:upstream:api:rate", "rate"]);
    assert_eq!(stored(), "", "the restarted Redis is empty");
    // healthy answers write the rate again: a step or a few above 25, not 50
    let started = Instant::now();
    while stored().is_empty() || started.elapsed() < Duration::from_secs(2) {
        assert!(started.elapsed() < Duration::from_secs(10), "never written");
        assert_eq!(get(&proxy.url("/"), &[]).await.status, 200);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stored: f64 = stored().trim().parse().unwrap();
    assert!(
        (25.0..30.0).contains(&stored),
        "the rate restarted at {stored}"
    );
    let shown = pace_rate(admin).await.unwrap();
    assert!((25.0..30.0).contains(&shown), "tollgate_pace_rate {shown}");
}

/// A tollgate process stopped (SIGSTOP) for 3 s while requests were in flight: their answers,
/// timed across the stop, are slower than `target_latency`, but count for nothing once it
/// runs again: the fleet's rate stays where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_timed_across_a_stop_do_not_cut_the_rate() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let pace = "{rate: 50/s, max_delay: 1s, adaptive: {min: 5/s, max: 50/s, \
                target_latency: 300ms}}";
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let yaml = config(Some(&redis), &upstream.url(), pace).replacen(
        "listen: 127.0.0.1:0\n",
        &format!("listen: 127.0.0.1:{port}\n"),
        1,
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("--config")
        .arg(&path)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let url = format!("http://127.0.0.1:{port}/slow/100");
    eventually(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    // four clients, one request each in flight at any time
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                loop {
                    get(&url, &[]).await;
                }
            })
        })
        .collect();
    let stored = || -> Option<f64> {
        let text = redis.cli(&["hget", "tollgate:upstream:api:rate", "rate"]);
        text.trim().parse().ok()
    };
    eventually(Duration::from_secs(5), || async { stored() == Some(50.0) }).await;
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status();
        assert!(ok.unwrap().success());
    };
    signal("-STOP");
    tokio::time::sleep(Duration::from_secs(3)).await;
    signal("-CONT");
    let mut seen = Vec::new();
    let woke = Instant::now();
    while woke.elapsed() < Duration::from_secs(3) {
        seen.push(stored());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for c in clients {
        c.abort();
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.iter().all(|r| *r == Some(50.0)),
        "the rate moved after the stop: {seen:?}"
    );
}

/// A reload's new pacer takes over the rate the store keeps, within the new bounds: the task
/// follows the proxy in force. (The memory store, which a reload that keeps `store` keeps.)
#[tokio::test]
async fn a_reload_keeps_the_rate_within_its_new_bounds() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.yaml");
    let pace = "{rate: 50/s, max_delay: 1s, adaptive: {min: 5/s, max: 100/s, decrease: 0.5}}";
    std::fs::write(&path, config(None, &upstream.url(), pace)).unwrap();
    let proxy = Proxy::start_watching(&path).await;
    let admin = proxy.admin.unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(300) {
        get(&proxy.url("/status/503"), &[]).await;
    }
    eventually(Duration::from_secs(3), || async {
        pace_rate(admin).await == Some(25.0)
    })
    .await;
    // the new file starts at 8/s and caps the rate at 10/s: the kept 25 is brought to 10
    let narrower = "{rate: 8/s, max_delay: 1s, adaptive: {min: 5/s, max: 10/s}}";
    let text = config(None, &upstream.url(), narrower).replace(
        "admin:\n  listen: 127.0.0.1:0",
        &format!("admin:\n  listen: {admin}"),
    );
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    eventually(Duration::from_secs(5), || async {
        pace_rate(admin).await == Some(10.0)
    })
    .await;
}

/// A reload while the store is out keeps the rate the fleet had cut, not the file's `rate`:
/// the new pacer starts where the old one was.
#[tokio::test]
async fn a_reload_while_the_store_is_out_keeps_the_cut_rate() {
    let mut redis = Redis::start();
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.yaml");
    let pace = "{rate: 50/s, max_delay: 1s, adaptive: {min: 5/s, max: 100/s, decrease: 0.5}}";
    std::fs::write(&path, config(Some(&redis), &upstream.url(), pace)).unwrap();
    let proxy = Proxy::start_watching(&path).await;
    let admin = proxy.admin.unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(300) {
        get(&proxy.url("/status/503"), &[]).await;
    }
    eventually(Duration::from_secs(3), || async {
        pace_rate(admin).await == Some(25.0)
    })
    .await;
    redis.kill();
    // the same pace with another max_delay: a new pacer, with the store out
    let text = config(Some(&redis), &upstream.url(), &pace.replace("1s", "2s")).replace(
        "admin:\n  listen: 127.0.0.1:0",
        &format!("admin:\n  listen: {admin}"),
    );
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let max_delay = || async {
        let config = get(&format!("http://{admin}/config"), &[]).await.body;
        let config: serde_json::Value = serde_json::from_str(&config).unwrap();
        config["upstreams"][0]["pace"]["max_delay"].clone()
    };
    assert_eq!(max_delay().await, "1s");
    eventually(Duration::from_secs(5), || async {
        max_delay().await == "2s"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        pace_rate(admin).await,
        Some(25.0),
        "the reload reset the rate"
    );
    let stats = get(&format!("http://{admin}/api/stats"), &[]).await.body;
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(stats["upstreams"][0]["pace_rate"], 25.0, "{stats}");
}

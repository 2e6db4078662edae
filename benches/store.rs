//! Decisions per second of the stores: `cargo bench --bench store`.
//!
//! * `RedisStore`: 64 concurrent callers on one connection, token bucket never denying, against
//!   a `redis-server` this bench starts on a free port (or `TOLLGATE_BENCH_REDIS=redis://...`).
//! * `MemoryStore`: one thread, 1 000 distinct keys; then 1M distinct keys and the process's
//!   resident memory growth.

use std::num::{NonZeroU32, NonZeroUsize};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::limit::{Algorithm, Bucket, Rate};
use tollgate::store::{MemoryStore, RedisStore, RedisTarget, Store};

fn never_denying() -> Algorithm {
    let burst = NonZeroU32::new(1_000_000).unwrap();
    let rate = Rate::per_second(1e9).unwrap();
    Algorithm::TokenBucket(Bucket::new(rate, burst, NonZeroU32::new(1).unwrap()).unwrap())
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> (Option<Server>, String) {
    if let Ok(url) = std::env::var("TOLLGATE_BENCH_REDIS") {
        return (None, url);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (apt-get install redis-server)");
    std::thread::sleep(Duration::from_millis(300));
    (Some(Server(child)), format!("redis://127.0.0.1:{port}/0"))
}

async fn redis_bench(url: &str, callers: usize, secs: f64) -> f64 {
    let store = Arc::new(
        RedisStore::connect(&RedisTarget::Single(url.into()), Duration::from_secs(1), 1).unwrap(),
    );
    store.ping().await.expect("redis answers");
    let alg = never_denying();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let key = format!("bench:{i}");
                let mut n = 0u64;
                while Instant::now() < deadline {
                    store.check(&key, &alg, None).await.expect("redis answers");
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// Decisions per second over `keys` distinct keys, and the store's resident memory (MB).
fn memory_bench(keys: usize, calls: usize) -> (f64, f64) {
    let names: Vec<String> = (0..keys)
        .map(|i| {
            format!(
                "tollgate:api:per-client:10.{}.{}.{}",
                i >> 16,
                (i >> 8) & 255,
                i & 255
            )
        })
        .collect();
    let before = rss_kib();
    let store = MemoryStore::new(NonZeroUsize::new(keys.max(1000)).unwrap());
    let alg = never_denying();
    let started = Instant::now();
    for i in 0..calls {
        std::hint::black_box(store.decide(&names[i % keys], &alg, None));
    }
    let rate = calls as f64 / started.elapsed().as_secs_f64();
    let mb = rss_kib().saturating_sub(before) as f64 / 1024.0;
    // shards fill unevenly, so a few keys go before the total reaches max_keys
    assert!(store.len() >= keys * 99 / 100, "{} keys held", store.len());
    (rate, mb)
}

fn main() {
    let (_server, url) = start_redis();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("| store | setting | decisions/s |");
    println!("| --- | --- | ---: |");
    for callers in [1, 64] {
        let rate = rt.block_on(redis_bench(&url, callers, 3.0));
        println!("| RedisStore | token bucket, {callers} concurrent callers, one connection | {rate:.0} |");
    }
    let (rate, _) = memory_bench(1000, 10_000_000);
    println!("| MemoryStore | token bucket, 1 thread, 1 000 keys | {rate:.0} |");
    let (rate, mb) = memory_bench(1_000_000, 3_000_000);
    println!("| MemoryStore | token bucket, 1 thread, 1 000 000 keys | {rate:.0} |");
    println!();
    println!("MemoryStore resident memory holding 1 000 000 keys: {mb:.0} MB");
}

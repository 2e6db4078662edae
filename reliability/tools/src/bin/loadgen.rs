//! A load generator with per-request accounting, for tollgate's reliability runs.
//!
//! Open loop (`--rate R`): R requests per second in total, each started on schedule in its own
//! task whatever the earlier ones are doing (so a stalled proxy shows up as latency, not as a
//! lower offered rate). Closed loop (`--rate 0 --concurrency C`): C workers, each sending its
//! next request as soon as the previous one is answered.
//!
//! Request i goes to `--url` number i mod (number of urls) and carries the header value number
//! i mod (number of values) of `--header NAME:V1,V2,...` (repeat a value to weight it), or, with
//! `--unique-header NAME:PREFIX`, the value `PREFIX-i`: a new client key on every request.
//! `--requests N` ends a closed loop after N requests (or `--duration`, whichever comes first).
//! Every request ends as an HTTP status, or as 0 (connection error) or 1 (no answer within
//! `--timeout`: a hang). `--out FILE` writes one CSV line per request:
//! `start_us,end_us,status,url_index,value_index` (µs since the Unix epoch).
//! The summary (JSON, one line) goes to stdout; `--progress` prints a line per second to stderr.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

struct Args {
    urls: Vec<String>,
    header: Option<(String, Vec<String>)>,
    unique: Option<(String, String)>,
    requests: u64,
    rate: f64,
    concurrency: usize,
    duration: Duration,
    timeout: Duration,
    out: Option<String>,
    progress: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: loadgen --url URL [--url URL...] --duration SECS [--rate R | --concurrency C]\n\
         \x20              [--header NAME:V1,V2,... | --unique-header NAME:PREFIX] [--requests N]\n\
         \x20              [--timeout SECS] [--out FILE] [--progress]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        urls: Vec::new(),
        header: None,
        unique: None,
        requests: u64::MAX,
        rate: 0.0,
        concurrency: 0,
        duration: Duration::from_secs(10),
        timeout: Duration::from_secs(30),
        out: None,
        progress: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--url" => a.urls.push(value()),
            "--header" => {
                let v = value();
                let (name, values) = v.split_once(':').unwrap_or_else(|| usage());
                let values = values.split(',').map(|s| s.trim().to_string()).collect();
                a.header = Some((name.trim().to_string(), values));
            }
            "--unique-header" => {
                let v = value();
                let (name, prefix) = v.split_once(':').unwrap_or_else(|| usage());
                a.unique = Some((name.trim().to_string(), prefix.trim().to_string()));
            }
            "--requests" => a.requests = value().parse().unwrap_or_else(|_| usage()),
            "--rate" => a.rate = value().parse().unwrap_or_else(|_| usage()),
            "--concurrency" => a.concurrency = value().parse().unwrap_or_else(|_| usage()),
            "--duration" => {
                a.duration = Duration::from_secs_f64(value().parse().unwrap_or_else(|_| usage()))
            }
            "--timeout" => {
                a.timeout = Duration::from_secs_f64(value().parse().unwrap_or_else(|_| usage()))
            }
            "--out" => a.out = Some(value()),
            "--progress" => a.progress = true,
            _ => usage(),
        }
    }
    if a.urls.is_empty() || (a.rate <= 0.0 && a.concurrency == 0) {
        usage();
    }
    a
}

/// One finished request.
#[derive(Clone, Copy)]
struct Rec {
    start_us: u64,
    end_us: u64,
    status: u16,
    url: u16,
    value: u16,
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>;

struct Shared {
    client: HttpClient,
    args: Args,
    uris: Vec<hyper::Uri>,
    header: Option<(http::HeaderName, Vec<http::HeaderValue>)>,
    unique: Option<(http::HeaderName, String)>,
    recs: Mutex<Vec<Rec>>,
    done_count: AtomicU64,
    in_flight: AtomicU64,
}

fn epoch_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

async fn one(shared: &Shared, i: u64) {
    let url = (i % shared.uris.len() as u64) as usize;
    let mut req = Request::get(shared.uris[url].clone());
    let mut value = 0;
    if let Some((name, values)) = &shared.header {
        value = (i % values.len() as u64) as usize;
        req = req.header(name, values[value].clone());
    }
    if let Some((name, prefix)) = &shared.unique {
        req = req.header(name, format!("{prefix}-{i}"));
    }
    let req = req.body(Empty::new()).expect("request");
    shared.in_flight.fetch_add(1, Ordering::Relaxed);
    let start_us = epoch_us();
    let started = Instant::now();
    let call = async {
        let resp = shared.client.request(req).await.ok()?;
        let status = resp.status().as_u16();
        // read the whole body: the request is done when its answer is
        resp.into_body().collect().await.ok()?;
        Some(status)
    };
    let status = match tokio::time::timeout(shared.args.timeout, call).await {
        Ok(Some(s)) => s,
        Ok(None) => 0,
        Err(_) => 1,
    };
    let end_us = start_us + started.elapsed().as_micros() as u64;
    shared.in_flight.fetch_sub(1, Ordering::Relaxed);
    shared.done_count.fetch_add(1, Ordering::Relaxed);
    shared.recs.lock().unwrap().push(Rec {
        start_us,
        end_us,
        status,
        url: url as u16,
        value: value as u16,
    });
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    let uris = args
        .urls
        .iter()
        .map(|u| u.parse().unwrap_or_else(|_| usage()))
        .collect();
    let header = args.header.as_ref().map(|(n, vs)| {
        (
            http::HeaderName::from_bytes(n.as_bytes()).unwrap_or_else(|_| usage()),
            vs.iter()
                .map(|v| http::HeaderValue::from_str(v).unwrap_or_else(|_| usage()))
                .collect(),
        )
    });
    let unique = args.unique.as_ref().map(|(n, prefix)| {
        (
            http::HeaderName::from_bytes(n.as_bytes()).unwrap_or_else(|_| usage()),
            prefix.clone(),
        )
    });
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector);
    let shared = Arc::new(Shared {
        client,
        args,
        uris,
        header,
        unique,
        recs: Mutex::new(Vec::with_capacity(1 << 16)),
        done_count: AtomicU64::new(0),
        in_flight: AtomicU64::new(0),
    });
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));

    let progress = shared.args.progress.then(|| {
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut last = 0;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let done = shared.done_count.load(Ordering::Relaxed);
                eprintln!(
                    "loadgen t={:.0}s done/s={} in_flight={}",
                    started.elapsed().as_secs_f64(),
                    done - last,
                    shared.in_flight.load(Ordering::Relaxed)
                );
                last = done;
            }
        })
    });

    let duration = shared.args.duration;
    if shared.args.rate > 0.0 {
        // open loop: request i starts at i / rate, each in its own task
        let interval = Duration::from_secs_f64(1.0 / shared.args.rate);
        let total = (duration.as_secs_f64() * shared.args.rate).round() as u64;
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..total {
            tokio::time::sleep_until((started + interval.mul_f64(i as f64)).into()).await;
            let shared = shared.clone();
            tasks.spawn(async move { one(&shared, i).await });
            while tasks.try_join_next().is_some() {}
        }
        while tasks.join_next().await.is_some() {}
    } else {
        let next = Arc::new(AtomicU64::new(0));
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..shared.args.concurrency {
            let (shared, next, stop) = (shared.clone(), next.clone(), stop.clone());
            workers.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= shared.args.requests {
                        break;
                    }
                    one(&shared, i).await;
                }
            });
        }
        let _ = tokio::time::timeout(duration, async {
            while workers.join_next().await.is_some() {}
        })
        .await;
        stop.store(true, Ordering::Relaxed);
        while workers.join_next().await.is_some() {}
    }
    if let Some(p) = progress {
        p.abort();
    }
    let elapsed = started.elapsed();

    let mut recs = std::mem::take(&mut *shared.recs.lock().unwrap());
    recs.sort_by_key(|r| r.start_us);
    if let Some(path) = &shared.args.out {
        let file = std::fs::File::create(path).expect("create --out file");
        let mut w = std::io::BufWriter::new(file);
        for r in &recs {
            writeln!(
                w,
                "{},{},{},{},{}",
                r.start_us, r.end_us, r.status, r.url, r.value
            )
            .expect("write --out");
        }
        w.flush().expect("flush --out");
    }
    let mut statuses: BTreeMap<u16, u64> = BTreeMap::new();
    let mut lat: Vec<u64> = Vec::with_capacity(recs.len());
    for r in &recs {
        *statuses.entry(r.status).or_default() += 1;
        lat.push(r.end_us - r.start_us);
    }
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i] as f64 / 1000.0
    };
    let statuses: Vec<String> = statuses
        .iter()
        .map(|(s, n)| format!("\"{s}\":{n}"))
        .collect();
    println!(
        "{{\"requests\":{},\"elapsed_s\":{:.3},\"rps\":{:.1},\"statuses\":{{{}}},\
         \"p50_ms\":{:.3},\"p99_ms\":{:.3},\"p999_ms\":{:.3},\"max_ms\":{:.3}}}",
        recs.len(),
        elapsed.as_secs_f64(),
        recs.len() as f64 / elapsed.as_secs_f64(),
        statuses.join(","),
        pct(0.5),
        pct(0.99),
        pct(0.999),
        pct(1.0),
    );
}

//! A small upstream for tollgate's reliability runs: answers every request `200 ok` (after
//! `--delay-ms`, default 0) and, with `--log FILE`, appends the arrival time of every request
//! (µs since the Unix epoch) to FILE, one per line. The log is flushed every 200 ms and on
//! SIGTERM/SIGINT (a SIGKILL loses at most the last 200 ms).
//!
//! usage: upstream --listen 127.0.0.1:PORT [--log FILE] [--delay-ms N]

use std::convert::Infallible;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use hyper_util::rt::{TokioExecutor, TokioIo};

fn usage() -> ! {
    eprintln!("usage: upstream --listen ADDR [--log FILE] [--delay-ms N]");
    std::process::exit(2)
}

fn epoch_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn flush(pending: &Mutex<Vec<u64>>, file: &Mutex<Option<std::io::BufWriter<std::fs::File>>>) {
    let batch = std::mem::take(&mut *pending.lock().unwrap());
    if let Some(w) = file.lock().unwrap().as_mut() {
        for t in batch {
            let _ = writeln!(w, "{t}");
        }
        let _ = w.flush();
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let mut listen = None;
    let mut log = None;
    let mut delay = Duration::ZERO;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--listen" => listen = Some(value()),
            "--log" => log = Some(value()),
            "--delay-ms" => {
                delay = Duration::from_millis(value().parse().unwrap_or_else(|_| usage()))
            }
            _ => usage(),
        }
    }
    let listen = listen.unwrap_or_else(|| usage());
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .unwrap_or_else(|e| {
            eprintln!("upstream: bind {listen}: {e}");
            std::process::exit(1)
        });
    let pending: Arc<Mutex<Vec<u64>>> = Arc::default();
    let file = Arc::new(Mutex::new(log.map(|p| {
        std::io::BufWriter::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .expect("open --log"),
        )
    })));
    let logging = file.lock().unwrap().is_some();
    {
        let (pending, file) = (pending.clone(), file.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                flush(&pending, &file);
            }
        });
    }
    {
        let (pending, file) = (pending.clone(), file.clone());
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            flush(&pending, &file);
            std::process::exit(0);
        });
    }
    eprintln!("upstream: listening on {listen}");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let pending = pending.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |_req| {
                if logging {
                    pending.lock().unwrap().push(epoch_us());
                }
                async move {
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

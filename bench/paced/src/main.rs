//! paced: a constant-rate HTTP/1.1 load generator, for latency at a fixed offered load.
//!
//! ```sh
//! cargo run --release --manifest-path bench/paced/Cargo.toml -- --rate 30000 http://127.0.0.1:8080/
//! ```
//!
//! wrk sends the next request as soon as the last answer arrives. So a slow server is offered
//! less load, and its slow moments hide. This generator keeps a schedule instead: request `i` is
//! due at `start + i / rate`, whatever happened before. A request waits for a free keep-alive
//! connection when every one is busy, and its latency counts from the moment it was due. So a
//! stall shows in the figures as the users behind it would feel it.
//!
//! A thread of its own keeps the schedule with the operating system's fine sleep. tokio's timer
//! counts whole milliseconds, far coarser than the latencies measured. The connections run on
//! one tokio thread. It prints one line: `PACED` and `key=value` pairs, read by `bench/run`.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

struct Args {
    rate: f64,
    connections: usize,
    duration: Duration,
    warmup: Duration,
    addr: String,
    host: String,
    path: String,
}

const USAGE: &str =
    "usage: paced --rate REQ_PER_S [--connections N] [--duration S] [--warmup S] http://HOST:PORT/PATH";

fn args() -> Result<Args, String> {
    let mut rate = None;
    let mut connections = 64;
    let mut duration = 10.0;
    let mut warmup = 2.0;
    let mut url = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--rate" => rate = Some(number(&value("--rate")?)?),
            "--connections" => connections = number(&value("--connections")?)? as usize,
            "--duration" => duration = number(&value("--duration")?)?,
            "--warmup" => warmup = number(&value("--warmup")?)?,
            _ if arg.starts_with("http://") => url = Some(arg),
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    let rate = rate.ok_or("--rate is required")?;
    let url = url.ok_or("a URL is required")?;
    let rest = &url["http://".len()..];
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    if rate <= 0.0 || connections == 0 {
        return Err("--rate and --connections must be positive".into());
    }
    Ok(Args {
        rate,
        connections,
        duration: Duration::from_secs_f64(duration),
        warmup: Duration::from_secs_f64(warmup),
        addr: authority.to_string(),
        host: authority.to_string(),
        path: path.to_string(),
    })
}

fn number(text: &str) -> Result<f64, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not a number"))
}

/// What the connections share: the requests due and not yet sent, and the idle connections.
struct Shared {
    start: Instant,
    rate: f64,
    /// the first request measured: those before it warm the connections up
    first_measured: u64,
    due: VecDeque<u64>,
    idle: Vec<mpsc::UnboundedSender<u64>>,
    latencies_us: Vec<u32>,
    /// requests sent more than a millisecond after they were due: the generator fell behind
    late: u64,
    errors: u64,
}

impl Shared {
    fn due_at(&self, i: u64) -> Instant {
        self.start + Duration::from_secs_f64(i as f64 / self.rate)
    }
}

fn main() {
    let args = match args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("paced: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, run(args));
}

async fn run(args: Args) {
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: paced\r\n\r\n",
        args.path, args.host
    );
    let request: Rc<[u8]> = request.into_bytes().into();
    // start after the connections are open, so the first requests do not wait for connects
    let start = Instant::now() + Duration::from_millis(200);
    let total = ((args.warmup + args.duration).as_secs_f64() * args.rate) as u64;
    let shared = Rc::new(RefCell::new(Shared {
        start,
        rate: args.rate,
        first_measured: (args.warmup.as_secs_f64() * args.rate) as u64,
        due: VecDeque::new(),
        idle: Vec::new(),
        latencies_us: Vec::with_capacity((args.duration.as_secs_f64() * args.rate) as usize + 1024),
        late: 0,
        errors: 0,
    }));
    for _ in 0..args.connections {
        let (tx, rx) = mpsc::unbounded_channel();
        shared.borrow_mut().idle.push(tx.clone());
        let conn = connection(args.addr.clone(), request.clone(), shared.clone(), tx, rx);
        tokio::task::spawn_local(conn);
    }

    // The schedule's thread: wakes at each due time and says how many requests came due.
    let (ticks_tx, mut ticks) = mpsc::unbounded_channel::<(u64, u64)>();
    let rate = args.rate;
    std::thread::spawn(move || {
        let mut next = 0u64;
        while next < total {
            let due = start + Duration::from_secs_f64(next as f64 / rate);
            let now = Instant::now();
            if now < due {
                std::thread::sleep(due - now);
            }
            let elapsed = Instant::now()
                .saturating_duration_since(start)
                .as_secs_f64();
            let upto = ((elapsed * rate) as u64 + 1).min(total);
            if upto > next {
                if ticks_tx.send((next, upto)).is_err() {
                    return;
                }
                next = upto;
            }
        }
    });

    while let Some((from, upto)) = ticks.recv().await {
        let mut s = shared.borrow_mut();
        for i in from..upto {
            match s.idle.pop() {
                Some(conn) => {
                    let _ = conn.send(i);
                }
                None => s.due.push_back(i),
            }
        }
    }
    // the schedule is over: let the last requests finish, two seconds at most
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        {
            let s = shared.borrow();
            if s.due.is_empty() && s.idle.len() == args.connections {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let measured_end = start + args.warmup + args.duration;
    let s = &mut *shared.borrow_mut();
    let unfinished = s.due.len() as u64 + (args.connections - s.idle.len()) as u64;
    let lat = &mut s.latencies_us;
    lat.sort_unstable();
    let at = |q: f64| -> u32 {
        if lat.is_empty() {
            return 0;
        }
        lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)]
    };
    let wall = measured_end.saturating_duration_since(start + args.warmup);
    println!(
        "PACED offered={:.0} achieved={:.0} requests={} errors={} late={} unfinished={} \
         p50_us={} p90_us={} p99_us={} p999_us={} max_us={}",
        args.rate,
        lat.len() as f64 / wall.as_secs_f64(),
        lat.len(),
        s.errors,
        s.late,
        unfinished,
        at(0.50),
        at(0.90),
        at(0.99),
        at(0.999),
        lat.last().copied().unwrap_or(0),
    );
}

/// One keep-alive connection: sends each request it is given, then takes the next one due or
/// goes back to the idle list. It opens a new connection after an error.
async fn connection(
    addr: String,
    request: Rc<[u8]>,
    shared: Rc<RefCell<Shared>>,
    me: mpsc::UnboundedSender<u64>,
    mut assigned: mpsc::UnboundedReceiver<u64>,
) {
    let mut stream: Option<TcpStream> = None;
    let mut buf = Vec::with_capacity(4096);
    let mut next = assigned.recv().await;
    while let Some(i) = next {
        let due = shared.borrow().due_at(i);
        let sent = Instant::now();
        let ok = exchange(&addr, &mut stream, &request, &mut buf).await;
        let done = Instant::now();
        if !ok {
            stream = None;
        }
        next = finished(&shared, &me, i, ok, due, sent, done);
        if next.is_none() {
            next = assigned.recv().await;
        }
    }
}

/// Counts request `i`, and returns the next request due, or puts the connection on the idle
/// list when none is.
fn finished(
    shared: &RefCell<Shared>,
    me: &mpsc::UnboundedSender<u64>,
    i: u64,
    ok: bool,
    due: Instant,
    sent: Instant,
    done: Instant,
) -> Option<u64> {
    let mut s = shared.borrow_mut();
    if !ok {
        s.errors += 1;
    }
    if i >= s.first_measured {
        if sent.saturating_duration_since(due) > Duration::from_millis(1) {
            s.late += 1;
        }
        let us = done.saturating_duration_since(due).as_micros();
        s.latencies_us.push(us.min(u32::MAX as u128) as u32);
    }
    let next = s.due.pop_front();
    if next.is_none() {
        s.idle.push(me.clone());
    }
    next
}

/// Sends one request and reads its answer (`Content-Length` framing). False on any failure
/// or a status other than 2xx.
async fn exchange(
    addr: &str,
    stream: &mut Option<TcpStream>,
    request: &[u8],
    buf: &mut Vec<u8>,
) -> bool {
    if stream.is_none() {
        match TcpStream::connect(addr).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                *stream = Some(s);
            }
            Err(_) => return false,
        }
    }
    let Some(s) = stream.as_mut() else {
        return false;
    };
    if s.write_all(request).await.is_err() {
        return false;
    }
    buf.clear();
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(buf) {
            Ok(httparse::Status::Complete(head)) => {
                let status = response.code.unwrap_or(0);
                let length: Option<usize> = response
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok());
                let Some(length) = length else {
                    return false;
                };
                let want = head + length;
                while buf.len() < want {
                    if read_more(s, buf).await.is_err() {
                        return false;
                    }
                }
                // one request at a time: nothing follows the body
                return (200..300).contains(&status) && buf.len() == want;
            }
            Ok(httparse::Status::Partial) => {
                if read_more(s, buf).await.is_err() {
                    return false;
                }
            }
            Err(_) => return false,
        }
    }
}

async fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut chunk = [0u8; 4096];
    let n = s.read(&mut chunk).await?;
    if n == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

//! A master, a replica and three Redis Sentinels watching them, as real processes on free
//! ports, ready for a failover: the Sentinels know each other and the replica. Both servers
//! take `DEBUG SLEEP` (a master that hangs), and [`Monitor`] records what one executes.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{cli, free_port, Redis};

/// The name the Sentinels monitor the master by.
pub const MASTER_NAME: &str = "tg-master";

/// One `redis-server --sentinel`; killed when dropped.
pub struct SentinelProcess {
    pub port: u16,
    child: Child,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A master, its replica and three Sentinels with a quorum of two, quick to fail over: the
/// master is down after 500 ms without an answer.
pub struct SentinelSet {
    pub master: Redis,
    pub replica: Redis,
    pub sentinels: Vec<SentinelProcess>,
    dir: tempfile::TempDir,
}

impl SentinelSet {
    pub fn start() -> SentinelSet {
        let debug = ["--enable-debug-command", "local"];
        let master = Redis::start_with(&debug);
        let port = master.port.to_string();
        let replica =
            Redis::start_with(&[&debug[..], &["--replicaof", "127.0.0.1", &port]].concat());
        wait_for(Duration::from_secs(10), "the replica to sync", || {
            replica
                .cli(&["info", "replication"])
                .contains("master_link_status:up")
        });
        let dir = tempfile::tempdir().expect("temp dir");
        let sentinels = (0..3)
            .map(|i| start_sentinel(dir.path(), i, master.port))
            .collect();
        let set = SentinelSet {
            master,
            replica,
            sentinels,
            dir,
        };
        // a failover needs a quorum of Sentinels that know each other, and a known replica
        wait_for(Duration::from_secs(15), "the Sentinels to meet", || {
            set.sentinels.iter().all(|s| {
                let master = cli(s.port, &["sentinel", "master", MASTER_NAME]);
                field(&master, "num-other-sentinels") == Some("2")
                    && field(&master, "num-slaves") == Some("1")
            })
        });
        set
    }

    /// The Sentinels' URLs, for `store.sentinel.nodes`.
    pub fn urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect()
    }

    /// The master's port as the first Sentinel tells it.
    pub fn master_port(&self) -> u16 {
        let addr = cli(
            self.sentinels[0].port,
            &["sentinel", "get-master-addr-by-name", MASTER_NAME],
        );
        addr.lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .expect("a master address")
    }

    /// Whether any Sentinel names the node on `port` as the master.
    pub fn any_names(&self, port: u16) -> bool {
        self.sentinels.iter().any(|s| {
            let addr = cli(
                s.port,
                &["sentinel", "get-master-addr-by-name", MASTER_NAME],
            );
            addr.lines().nth(1).map(str::trim) == Some(&port.to_string())
        })
    }

    /// Where the Sentinels keep their files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn start_sentinel(dir: &Path, i: usize, master_port: u16) -> SentinelProcess {
    let port = free_port();
    let file = dir.join(format!("sentinel-{i}.conf"));
    let conf = format!(
        "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
         sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
         sentinel down-after-milliseconds {MASTER_NAME} 500\n\
         sentinel failover-timeout {MASTER_NAME} 2000\n\
         sentinel parallel-syncs {MASTER_NAME} 1\n",
        dir = dir.display()
    );
    std::fs::write(&file, conf).expect("write sentinel.conf");
    let child = Command::new("redis-server")
        .arg(&file)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server --sentinel (apt-get install redis-server redis-tools)");
    let sentinel = SentinelProcess { port, child };
    wait_for(Duration::from_secs(10), "a Sentinel to answer", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() && cli(port, &["ping"]) == "PONG"
    });
    sentinel
}

/// The value after `name` in a flat `SENTINEL master` reply, as redis-cli prints it.
fn field<'a>(reply: &'a str, name: &str) -> Option<&'a str> {
    let mut lines = reply.lines().map(str::trim);
    lines.find(|l| *l == name)?;
    lines.next()
}

fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `MONITOR` on one server: every command it executes, as lines, from a thread of its own.
pub struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
    stream: TcpStream,
}

impl Monitor {
    /// Starts monitoring the server on `port` (it must answer now).
    pub fn start(port: u16) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect for MONITOR");
        stream.write_all(b"MONITOR\r\n").expect("send MONITOR");
        let mut reader = BufReader::new(stream.try_clone().expect("clone the socket"));
        let mut ok = String::new();
        reader.read_line(&mut ok).expect("MONITOR's answer");
        assert_eq!(ok.trim(), "+OK", "MONITOR refused");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let kept = lines.clone();
        std::thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { return };
                kept.lock().unwrap().push(line);
            }
        });
        Monitor { lines, stream }
    }

    /// The commands seen so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// Sends `DEBUG SLEEP secs` to the server on `port` without waiting for it to wake: the socket
/// returned must be kept until then.
pub fn debug_sleep(port: u16, secs: u32) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect for DEBUG SLEEP");
    let command = format!("DEBUG SLEEP {secs}\r\n");
    stream
        .write_all(command.as_bytes())
        .expect("send DEBUG SLEEP");
    stream
}

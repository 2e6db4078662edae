//! The tollgate binary as a child process: killed when the test ends, its log lines read on a
//! thread so that a test waits for them with a deadline.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// A child process killed when the test ends, also when it fails.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The child's stderr lines, read on a thread: a test waits for them with a deadline, so a
/// line that never comes fails it rather than hanging it.
pub fn log_lines(child: &mut Reaped) -> Receiver<String> {
    let stderr = child.0.stderr.take().expect("stderr piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits up to 10 s for `cond`, failing the test with `what` if it never holds.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// tollgate run with the config at `path`, logging at info in `format`; its log lines.
pub fn run_logging(path: &Path, format: &str) -> (Reaped, Receiver<String>) {
    let mut child = Reaped(
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["--log-format", format, "--config"])
            .arg(path)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tollgate"),
    );
    let lines = log_lines(&mut child);
    (child, lines)
}

/// tollgate run with `yaml` written into `dir` (its `listen` on `port`), logging at info in
/// `format`; its log lines, once it listens.
pub fn run_listening(
    dir: &tempfile::TempDir,
    yaml: &str,
    port: u16,
    format: &str,
) -> (Reaped, Receiver<String>) {
    let path = dir.path().join("proxy.yaml");
    std::fs::write(&path, yaml).expect("write the config");
    let running = run_logging(&path, format);
    wait_for("the listener", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    running
}

/// The next `n` access lines among `lines` (JSON), their fields by request id.
pub fn access_fields(
    lines: &std::sync::mpsc::Receiver<String>,
    n: usize,
) -> std::collections::HashMap<String, serde_json::Value> {
    let mut found = std::collections::HashMap::new();
    while found.len() < n {
        let line = lines
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{} access lines of {n}: {found:#?}", found.len()));
        if !line.contains("tollgate::access") {
            continue;
        }
        let mut parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        let fields = parsed["fields"].take();
        let id = fields["request_id"]
            .as_str()
            .expect("a request id")
            .to_owned();
        found.insert(id, fields);
    }
    found
}

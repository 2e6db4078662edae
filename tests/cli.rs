//! The `tollgate` binary as a user runs it: `check` on good and bad files, exit statuses,
//! a SIGTERM drain that exits 0, and the access log it writes, in JSON and in text.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::binary::{access_fields, log_lines, run_listening, run_logging, wait_for, Reaped};
use common::free_port;

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    path
}

/// `tollgate check` accepts the shipped proxy.yaml, prints a summary and exits 0.
#[test]
fn check_accepts_the_shipped_config() {
    let out = tollgate()
        .args([
            "check",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/proxy.yaml"),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("per-client"), "{stdout}");
    assert!(stdout.trim_end().ends_with("proxy.yaml: ok"), "{stdout}");
}

/// `tollgate check | head -1`: a reader that stops early ends no check in a panic.
#[test]
fn check_into_a_closed_pipe_exits_0() {
    let mut child = tollgate()
        .args([
            "check",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/proxy.yaml"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `tollgate check` on a bad file prints every problem as FILE:LINE:COLUMN: key: message
/// and exits 2.
#[test]
fn check_reports_every_problem_with_position_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "bad.yaml",
        "listen: 127.0.0.1:0
upstreams:
  api:
    targets: [http://127.0.0.1:1]
routes:
  - name: r
    upstream: nowhere
    limits:
      - name: l
        algorithm: token_bucket
        rate: ten
",
    );
    let out = tollgate()
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let file = path.display().to_string();
    assert!(
        stderr.contains(&format!("{file}:7:15: routes[0].upstream:")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{file}:11:15: routes[0].limits[0].rate:")),
        "{stderr}"
    );
}

/// A missing file is a start-up failure (exit 1) naming the file.
#[test]
fn missing_config_file_exits_1() {
    let out = tollgate()
        .args(["check", "--config", "/nonexistent/proxy.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/proxy.yaml"));
}

/// `check` reads the TLS files the configuration names, as `nginx -t` does: a missing or
/// unusable certificate or key is a configuration problem at its line (exit 2), not a
/// start-up failure found only when the proxy runs. Each file is read on its own, so every
/// problem is listed.
#[test]
fn check_reads_the_tls_files() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = write(&dir, "garbage.pem", "not a certificate\n");
    let cases: [(String, Option<String>, &[&str]); 3] = [
        (
            "/nonexistent/cert.pem".to_string(),
            Some("/nonexistent/key.pem".to_string()),
            &[
                ":3:9: tls.cert: cannot read certificate /nonexistent/cert.pem: No such file or directory",
                ":4:8: tls.key: cannot read private key /nonexistent/key.pem: No such file or directory",
            ],
        ),
        (
            garbage.display().to_string(),
            Some(garbage.display().to_string()),
            &[":3:9: tls.cert: no certificate found in"],
        ),
        (
            "/nonexistent/cert.pem".to_string(),
            None,
            &[
                ":3:3: tls: missing required key \"key\"",
                ":3:9: tls.cert: cannot read certificate /nonexistent/cert.pem",
            ],
        ),
    ];
    for (cert, key, expected) in cases {
        let key = key.map_or(String::new(), |key| format!("\n  key: {key}"));
        let yaml = format!(
            "listen: 127.0.0.1:0\ntls:\n  cert: {cert}{key}\nupstreams:\n  api:\n    targets: [http://127.0.0.1:1]\nroutes:\n  - name: r\n    upstream: api\n"
        );
        let path = write(&dir, "tls.yaml", &yaml);
        for args in [vec!["check", "--config"], vec!["--config"]] {
            let out = tollgate().args(&args).arg(&path).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            for expected in expected {
                assert!(
                    stderr.contains(&format!("{}{expected}", path.display())),
                    "{args:?}: {stderr}"
                );
            }
        }
    }
}

/// `--version` and `--help` work.
#[test]
fn version_and_help() {
    let v = tollgate().arg("--version").output().unwrap();
    assert!(v.status.success());
    assert!(String::from_utf8_lossy(&v.stdout).starts_with("tollgate "));
    let h = tollgate().arg("--help").output().unwrap();
    assert!(h.status.success());
    assert!(String::from_utf8_lossy(&h.stdout).contains("check"));
}

/// `tollgate limits --help` (and each of its actions' help) lists only the flags `limits`
/// uses: not `--config` or `--log-format`, which it would ignore. `check` still takes
/// `--config` after it.
#[test]
fn limits_help_lists_only_what_it_uses() {
    for args in [
        vec!["limits", "--help"],
        vec!["limits", "show", "--help"],
        vec!["limits", "reset", "--help"],
    ] {
        let out = tollgate().args(&args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        for flag in ["--config", "--log-format"] {
            assert!(!help.contains(flag), "{args:?} lists {flag}:\n{help}");
        }
    }
    let help = tollgate()
        .args(["limits", "show", "--help"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("--admin"));
    let help = tollgate().args(["check", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("--config"));
}

/// A port already in use is a start-up failure (exit 1) with a one-line cause.
#[test]
fn port_in_use_exits_1() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "listen: {}\nupstreams:\n  api:\n    targets: [http://127.0.0.1:1]\nroutes:\n  - name: r\n    upstream: api\n",
        taken.local_addr().unwrap()
    );
    let path = write(&dir, "p.yaml", &yaml);
    let out = tollgate().arg("--config").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen on"));
}

/// SIGTERM stops the proxy and it exits 0; the config path can come from $TOLLGATE_CONFIG.
#[test]
fn sigterm_drains_and_exits_0() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:{port}\nupstreams:\n  api:\n    targets: [http://127.0.0.1:1]\nroutes:\n  - name: r\n    upstream: api\n"
    );
    let path = write(&dir, "p.yaml", &yaml);
    let mut child = Reaped(
        tollgate()
            .env("TOLLGATE_CONFIG", &path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "tollgate did not start listening"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = child.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tollgate did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// With `--log-format json` every start-up line is JSON, configuration warnings included (they
/// go through the log, not straight to stderr), and the admin address is logged.
#[test]
fn json_logs_carry_the_warnings_and_the_admin_address() {
    let (port, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:{port}\nadmin: {{listen: 127.0.0.1:{admin}}}\nupstreams:\n  api:\n    targets: [http://127.0.0.1:1]\n  unused:\n    targets: [http://127.0.0.1:1]\nroutes:\n  - name: r\n    upstream: api\n"
    );
    let path = write(&dir, "p.yaml", &yaml);
    let (_child, stderr) = run_logging(&path, "json");
    let mut lines = Vec::new();
    while let Ok(line) = stderr.recv_timeout(Duration::from_secs(10)) {
        let done = line.contains("admin listening");
        lines.push(line);
        if done {
            break;
        }
    }
    for line in &lines {
        let parsed: Result<serde_json::Value, _> = serde_json::from_str(line);
        assert!(parsed.is_ok(), "not a JSON line: {line}\nall: {lines:#?}");
    }
    let all = lines.join("\n");
    assert!(
        all.contains("upstream \\\"unused\\\" is not used by any route") && all.contains("WARN"),
        "{all}"
    );
    assert!(all.contains(&format!("127.0.0.1:{port}")), "{all}");
    assert!(all.contains(&format!("127.0.0.1:{admin}")), "{all}");
}

/// The access log names the client of a request no route takes, and counts a `leaky_bucket`
/// limit's wait as the request's pacing delay, naming the limit.
#[test]
fn access_log_has_the_client_of_a_404_and_the_wait_of_a_leaky_bucket() {
    use std::io::Read;
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:{port}\nupstreams:\n  api:\n    targets: [http://127.0.0.1:1]\nroutes:\n  - name: lb\n    match: {{path_prefix: /lb}}\n    upstream: api\n    limits:\n      - {{name: l, algorithm: leaky_bucket, rate: 1/s, max_delay: 5s}}\n"
    );
    let path = write(&dir, "p.yaml", &yaml);
    let (_child, stderr) = run_logging(&path, "json");
    let request = |path: &str| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    wait_for("the listener", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(request("/nowhere").starts_with("HTTP/1.0 404"));
    request("/lb/1");
    request("/lb/2"); // waits for its slot, 1 s after the first's
    let mut access = Vec::new();
    while access.len() < 3 {
        let line = stderr
            .recv_timeout(Duration::from_secs(10))
            .expect("an access log line");
        if line.contains("tollgate::access") {
            access.push(serde_json::from_str::<serde_json::Value>(&line).unwrap());
        }
    }
    let fields: Vec<&serde_json::Value> = access.iter().map(|a| &a["fields"]).collect();
    assert_eq!(fields[0]["status"], 404);
    assert_eq!(fields[0]["client"], "127.0.0.1", "{:?}", fields[0]);
    assert_eq!(fields[0]["client"], fields[1]["client"]);
    let waited = fields[2]["pacing_delay_ms"].as_f64().unwrap();
    assert!((400.0..=1100.0).contains(&waited), "{:?}", fields[2]);
    // the limit that made it wait
    assert_eq!(fields[2]["limit"], "l", "{:?}", fields[2]);
    assert_eq!(fields[2]["decision"], "delayed", "{:?}", fields[2]);
}

/// The access line of a request to a paced upstream gives the rate its slot was given at: an
/// adaptive pace's starts at `rate`.
#[test]
fn access_log_gives_the_pace_rate() {
    use std::io::Read;
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:{port}\nupstreams:\n  api:\n    targets: [http://127.0.0.1:1]\n    pace: {{rate: 10/s, max_delay: 1s, adaptive: {{min: 1/s, max: 20/s}}}}\nroutes:\n  - name: all\n    upstream: api\n"
    );
    let path = write(&dir, "p.yaml", &yaml);
    let (_child, stderr) = run_logging(&path, "json");
    wait_for("the listener", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /x HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.0 502"), "{out}");
    let line = loop {
        let line = stderr
            .recv_timeout(Duration::from_secs(10))
            .expect("an access log line");
        if line.contains("tollgate::access") {
            break serde_json::from_str::<serde_json::Value>(&line).unwrap();
        }
    };
    assert_eq!(line["fields"]["pace_rate"], 10.0, "{line}");
}

/// Reads the admin `/metrics` text over a raw HTTP/1.0 request (no client library needed).
fn scrape(admin: u16) -> String {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", admin)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// SIGHUP reloads the file (counted as ok); an invalid file is rejected with the `check`
/// messages in the log (counted as error) and the proxy keeps serving; logs can be JSON lines.
#[test]
fn sighup_reloads_and_invalid_files_are_rejected() {
    let (port, admin) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let good = format!(
        "listen: 127.0.0.1:{port}\nadmin: {{listen: 127.0.0.1:{admin}}}\nupstreams:\n  api:\n    targets: [http://127.0.0.1:1]\nroutes:\n  - name: r\n    upstream: api\n"
    );
    let path = write(&dir, "p.yaml", &good);
    let log = dir.path().join("log.txt");
    let mut child = Reaped(
        tollgate()
            .arg("--config")
            .arg(&path)
            .args(["--log-format", "json"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_for("admin listener", || {
        std::net::TcpStream::connect(("127.0.0.1", admin)).is_ok()
    });
    let pid = child.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    wait_for("an ok reload", || {
        scrape(admin).contains(r#"tollgate_config_reloads_total{result="ok"} 1"#)
    });
    std::fs::write(&path, good.replace("upstream: api", "upstream: nowhere")).unwrap();
    wait_for("a rejected reload", || {
        scrape(admin).contains(r#"tollgate_config_reloads_total{result="error"} 1"#)
    });
    // still serving the old config: the route answers (502: the target refuses), not 404
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut s, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.0 502"), "{answer}");
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert_eq!(child.0.wait().unwrap().code(), Some(0));
    let text = std::fs::read_to_string(&log).unwrap();
    let file = path.display().to_string();
    assert!(
        text.contains(&format!("{file}:8:15: routes[0].upstream")),
        "{text}"
    );
    for line in text.lines() {
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_ok(),
            "not JSON: {line}"
        );
    }
}

/// With `--log-format json` the proxy's last words are JSON too: a port in use (exit 1) and an
/// invalid configuration (exit 2, each problem a line); `check` still talks plain text.
#[test]
fn json_logs_carry_the_start_up_failures() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let busy = write(
        &dir,
        "busy.yaml",
        &format!("listen: 127.0.0.1:{port}\nupstreams:\n  api:\n    targets: [http://127.0.0.1:1]\nroutes:\n  - name: r\n    upstream: api\n"),
    );
    let bad = write(&dir, "bad.yaml", "listen: 127.0.0.1:1\nlisen: x\n");
    for (path, code, says) in [(&busy, 1, "cannot listen on"), (&bad, 2, "lisen")] {
        let out = tollgate()
            .args(["--log-format", "json", "--config"])
            .arg(path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{path:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{stderr}");
        for line in stderr.lines() {
            let parsed: Result<serde_json::Value, _> = serde_json::from_str(line);
            assert!(parsed.is_ok(), "not a JSON line: {line}\nall: {stderr}");
        }
    }
    let out = tollgate()
        .args(["--log-format", "json", "check", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!("{}:2:1: lisen", bad.display())),
        "{stderr}"
    );
}

/// A second SIGTERM (or SIGINT: Ctrl-C twice) during the drain exits at once, without waiting
/// for the in-flight requests the first one lets finish.
#[test]
fn a_second_signal_ends_the_drain() {
    let port = free_port();
    // an upstream that takes connections and never answers: the request stays in flight
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:{port}\ntimeouts: {{shutdown: 60s, upstream_response: 60s}}\nupstreams:\n  api:\n    targets: [http://{}]\nroutes:\n  - name: r\n    upstream: api\n",
        silent.local_addr().unwrap()
    );
    let path = write(&dir, "p.yaml", &yaml);
    let mut child = Reaped(
        tollgate()
            .arg("--config")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for("the listener", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let mut in_flight = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    use std::io::Write;
    in_flight
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let _held = silent.accept().unwrap();
    let pid = child.0.id().to_string();
    let term = || {
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success())
    };
    term();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "draining: still running"
    );
    term();
    wait_for("the exit after the second signal", || {
        child.0.try_wait().unwrap().is_some()
    });
}

/// A response read whole from a connection the server closes.
struct Exchange {
    head: String,
    body: Vec<u8>,
}

impl Exchange {
    fn status(&self) -> u16 {
        self.head[9..12].parse().unwrap()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// Sends `head` (the request line and fields, without the blank line), with `Connection:
/// close` and `body`, and reads the response to the close.
fn exchange(port: u16, head: &str, body: &[u8]) -> Exchange {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut request = format!("{head}\r\nConnection: close\r\n");
    if !body.is_empty() {
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    s.write_all(request.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    Exchange {
        head: String::from_utf8_lossy(&out[..split]).into_owned(),
        body: out[split + 4..].to_vec(),
    }
}

/// Whether `id` is a version 4 UUID in its text form.
fn is_uuid_v4(id: &str) -> bool {
    let groups: Vec<&str> = id.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups[2].starts_with('4')
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A route `api` on `/v1` to `upstream` (prefix stripped), limited to two requests a minute per
/// client, with the store in `redis`, listening on `port`; `top` adds top-level keys.
fn limited_config(
    port: u16,
    redis: &common::Redis,
    upstream: &common::Upstream,
    top: &str,
) -> String {
    format!(
        "listen: 127.0.0.1:{port}\n{top}store: {{backend: redis, url: {}}}\nupstreams:\n  api:\n    targets: [{}]\nroutes:\n  - name: api\n    match: {{path_prefix: /v1}}\n    strip_prefix: true\n    upstream: api\n    limits:\n      - {{name: per-client, algorithm: token_bucket, rate: 1/m, burst: 2}}\n",
        redis.url(),
        upstream.url()
    )
}

/// The JSON access line of a 200, a 429 and a 404 against a real upstream and Redis: every
/// field, bytes in and out of known bodies, the path without its query, the client's address,
/// and the request id the upstream and the client got: kept when usable, made when too long,
/// holding a tab, or absent.
#[test]
fn json_access_lines_have_every_field() {
    let redis = common::Redis::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(common::Upstream::start());
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let yaml = limited_config(port, &redis, &upstream, "");
    let (_child, lines) = run_listening(&dir, &yaml, port, "json");
    let echoed = exchange(
        port,
        "POST /v1/echo?token=secret HTTP/1.1\r\nHost: api.test\r\nUser-Agent: cli-test/1.0\r\nX-Request-Id: kept-id-1",
        b"hello world",
    );
    assert_eq!(echoed.status(), 200, "{}", echoed.head);
    assert_eq!(echoed.body, b"hello world");
    assert_eq!(echoed.header("x-request-id"), Some("kept-id-1"));
    let long = "x".repeat(201);
    let replaced = exchange(
        port,
        &format!("GET /v1/x HTTP/1.1\r\nHost: api.test\r\nX-Request-Id: {long}"),
        b"",
    );
    assert_eq!(replaced.status(), 200, "{}", replaced.head);
    let denied = exchange(
        port,
        "GET /v1/x HTTP/1.1\r\nHost: api.test\r\nX-Request-Id: a\tb",
        b"",
    );
    assert_eq!(denied.status(), 429, "{}", denied.head);
    let missing = exchange(port, "GET /nowhere HTTP/1.1\r\nHost: api.test", b"");
    assert_eq!(missing.status(), 404, "{}", missing.head);
    let made: Vec<&str> = [&replaced, &denied, &missing]
        .iter()
        .map(|e| e.header("x-request-id").expect("an id"))
        .collect();
    assert!(made.iter().all(|id| is_uuid_v4(id)), "{made:?}");
    let seen = upstream.seen();
    let upstream_ids: Vec<&str> = seen
        .iter()
        .map(|s| s.headers["x-request-id"].to_str().unwrap())
        .collect();
    assert_eq!(upstream_ids, ["kept-id-1", made[0]]);

    let lines = access_fields(&lines, 4);
    let ok = &lines["kept-id-1"];
    for (field, value) in [
        ("method", "POST"),
        ("path", "/v1/echo"),
        ("host", "api.test"),
        ("protocol", "HTTP/1.1"),
        ("route", "api"),
        ("upstream", "api"),
        ("decision", "allowed"),
        ("limit", "-"),
        ("client", "127.0.0.1"),
        ("user_agent", "cli-test/1.0"),
    ] {
        assert_eq!(ok[field], value, "{field}: {ok:#}");
    }
    assert_eq!(ok["upstream_addr"], upstream.addr.to_string(), "{ok:#}");
    assert_eq!(ok["status"], 200);
    assert_eq!(ok["bytes_in"], 11);
    assert_eq!(ok["bytes_out"], 11);
    assert_eq!(ok["complete"], true);
    assert_eq!(ok["pacing_delay_ms"], 0.0);
    let ttfb = ok["upstream_ttfb_ms"]
        .as_f64()
        .expect("a time to first byte");
    let duration = ok["duration_ms"].as_f64().expect("a duration");
    assert!(0.0 < ttfb && ttfb <= duration, "{ok:#}");

    let limited = &lines[made[1]];
    assert_eq!(limited["status"], 429, "{limited:#}");
    assert_eq!(limited["decision"], "denied");
    assert_eq!(limited["limit"], "per-client");
    assert_eq!(limited["upstream_addr"], "-");
    assert!(limited.get("upstream_ttfb_ms").is_none(), "{limited:#}");
    assert_eq!(limited["bytes_out"], denied.body.len());

    let lost = &lines[made[2]];
    assert_eq!(lost["status"], 404, "{lost:#}");
    assert_eq!(lost["route"], "-");
    assert_eq!(lost["decision"], "-");
    assert_eq!(lost["path"], "/nowhere");
    assert_eq!(lost["bytes_out"], missing.body.len());
    assert_eq!(lines[made[0]]["status"], 200);
}

/// A response body the client stops reading is logged with the bytes sent and `complete:
/// false`; a client gone before the answer, with 499 and nothing sent.
#[test]
fn access_lines_of_a_body_cut_short_and_a_client_gone() {
    use std::io::Read;
    let redis = common::Redis::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(common::Upstream::start());
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let yaml = limited_config(port, &redis, &upstream, "");
    let (_child, lines) = run_listening(&dir, &yaml, port, "json");
    let total = 64 * 1024 * 1024;
    let mut cut = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let head = format!("GET /v1/bytes/{total} HTTP/1.1\r\nHost: t\r\nX-Request-Id: cut\r\n\r\n");
    cut.write_all(head.as_bytes()).unwrap();
    let mut some = vec![0; 256 * 1024];
    cut.read_exact(&mut some).unwrap();
    drop(cut);
    let mut gone = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    gone.write_all(b"GET /v1/slow/3000 HTTP/1.1\r\nHost: t\r\nX-Request-Id: gone\r\n\r\n")
        .unwrap();
    wait_for("the request at the upstream", || {
        upstream.seen().iter().any(|s| s.uri == "/slow/3000")
    });
    drop(gone);
    let lines = access_fields(&lines, 2);
    let cut = &lines["cut"];
    assert_eq!(cut["status"], 200, "{cut:#}");
    assert_eq!(cut["complete"], false, "{cut:#}");
    let sent = cut["bytes_out"].as_u64().unwrap();
    assert!(sent > 0 && sent < total, "{cut:#}");
    let gone = &lines["gone"];
    assert_eq!(gone["status"], 499, "{gone:#}");
    assert_eq!(gone["complete"], false);
    assert_eq!(gone["bytes_out"], 0);
}

/// With `--log-format text` an access line reads like nginx's combined format, then the other
/// fields as `key=value`.
#[test]
fn text_access_lines_read_like_combined_then_key_values() {
    let redis = common::Redis::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(common::Upstream::start());
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let yaml = limited_config(port, &redis, &upstream, "");
    let (_child, lines) = run_listening(&dir, &yaml, port, "text");
    let ok = exchange(
        port,
        "GET /v1/x?q=1 HTTP/1.1\r\nHost: api.test\r\nUser-Agent: cli \"test\"\r\nX-Request-Id: text-1",
        b"",
    );
    assert_eq!(ok.status(), 200, "{}", ok.head);
    let line = loop {
        let line = lines
            .recv_timeout(Duration::from_secs(10))
            .expect("an access line");
        if line.contains("tollgate::access") {
            break line;
        }
    };
    let (_, rest) = line.split_once(" INFO tollgate::access: ").expect(&line);
    let head = r#"127.0.0.1 "GET /v1/x HTTP/1.1" 200 2 "cli \"test\"" "#;
    assert!(rest.starts_with(head), "{line}");
    let upstream_addr = format!(" upstream_addr={} ", upstream.addr);
    for part in [
        " host=api.test ",
        " route=api ",
        &upstream_addr,
        " decision=allowed ",
        " limit=- ",
        " bytes_in=0 ",
        " request_id=text-1 ",
        " complete=true",
    ] {
        assert!(rest.contains(part), "{part:?} in {line}");
    }
}

/// `RUST_LOG=info,tollgate::access=off` turns the access log off: a request answered and the
/// drain logged, and no access line among them.
#[test]
fn rust_log_turns_the_access_log_off() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:{port}\nupstreams:\n  api:\n    targets: [http://127.0.0.1:1]\nroutes:\n  - name: r\n    match: {{path_prefix: /v1}}\n    upstream: api\n"
    );
    let path = write(&dir, "p.yaml", &yaml);
    let mut child = Reaped(
        tollgate()
            .args(["--log-format", "json", "--config"])
            .arg(&path)
            .env("RUST_LOG", "info,tollgate::access=off")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let lines = log_lines(&mut child);
    wait_for("the listener", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert_eq!(
        exchange(port, "GET /nowhere HTTP/1.1\r\nHost: t", b"").status(),
        404
    );
    let pid = child.0.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let mut all = Vec::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(10)) {
        all.push(line);
    }
    assert!(all.iter().any(|l| l.contains("drained")), "{all:#?}");
    assert!(
        !all.iter().any(|l| l.contains("tollgate::access")),
        "{all:#?}"
    );
}

/// `access_log: {query: true, client: hash}`: the path keeps its query and the client is a
/// hash of 12 hex digits, not the address; `check` tells both settings.
#[test]
fn access_log_settings_keep_the_query_and_hash_the_client() {
    let redis = common::Redis::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(common::Upstream::start());
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let top = "access_log: {query: true, client: hash}\n";
    let yaml = limited_config(port, &redis, &upstream, top);
    let checked = tollgate()
        .arg("check")
        .arg("--config")
        .arg(write(&dir, "check.yaml", &yaml))
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&checked.stdout);
    assert!(
        summary.contains("access_log: client hash, query kept"),
        "{summary}"
    );
    let (_child, lines) = run_listening(&dir, &yaml, port, "json");
    let head = "GET /v1/x?page=2&sort=a HTTP/1.1\r\nHost: t\r\nX-Request-Id: q-1";
    assert_eq!(exchange(port, head, b"").status(), 200);
    let lines = access_fields(&lines, 1);
    let line = &lines["q-1"];
    assert_eq!(line["path"], "/v1/x?page=2&sort=a", "{line:#}");
    let client = line["client"].as_str().unwrap();
    assert!(
        client.len() == 12 && client.bytes().all(|b| b.is_ascii_hexdigit()),
        "{line:#}"
    );
}

/// A repeated key and a path holding `%00` are logged with the `error` of tollgate's answer,
/// the repeat with the limit that refused it; a request the upstream answered has no `error`.
#[test]
fn access_lines_name_a_repeated_key_and_a_nul_path() {
    let redis = common::Redis::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime.block_on(common::Upstream::start());
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let yaml = limited_config(port, &redis, &upstream, "")
        .replace("burst: 2}", "burst: 2, key: \"query:key\"}");
    let (_child, lines) = run_listening(&dir, &yaml, port, "json");
    let send = |target: &str, id: &str| {
        let head = format!("GET {target} HTTP/1.1\r\nHost: t\r\nX-Request-Id: {id}");
        exchange(port, &head, b"").status()
    };
    assert_eq!(send("/v1/x?key=a&key=b", "repeat-1"), 400);
    assert_eq!(send("/v1%00/x", "nul-1"), 400);
    assert_eq!(send("/v1/x?key=a", "ok-1"), 200);
    let fields = access_fields(&lines, 3);
    assert_eq!(fields["repeat-1"]["error"], "duplicate_key");
    assert_eq!(fields["repeat-1"]["limit"], "per-client");
    assert_eq!(fields["repeat-1"]["status"], 400);
    assert_eq!(fields["nul-1"]["error"], "bad_request");
    assert_eq!(fields["nul-1"]["route"], "-");
    assert!(fields["ok-1"].get("error").is_none(), "{}", fields["ok-1"]);
}

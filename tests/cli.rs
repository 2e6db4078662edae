//! The `tollgate` binary as a user runs it: `check` on good and bad files, exit statuses,
//! and a SIGTERM drain that exits 0.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
/// start-up failure found only when the proxy runs.
#[test]
fn check_reads_the_tls_files() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = write(&dir, "garbage.pem", "not a certificate\n");
    let cases = [
        (
            "/nonexistent/cert.pem".to_string(),
            "/nonexistent/key.pem".to_string(),
            ":3:9: tls.cert: cannot read certificate /nonexistent/cert.pem: No such file or directory",
        ),
        (
            garbage.display().to_string(),
            garbage.display().to_string(),
            ":3:9: tls.cert: no certificate found in",
        ),
    ];
    for (cert, key, expected) in cases {
        let yaml = format!(
            "listen: 127.0.0.1:0\ntls:\n  cert: {cert}\n  key: {key}\nupstreams:\n  api:\n    targets: [http://127.0.0.1:1]\nroutes:\n  - name: r\n    upstream: api\n"
        );
        let path = write(&dir, "tls.yaml", &yaml);
        for args in [vec!["check", "--config"], vec!["--config"]] {
            let out = tollgate().args(&args).arg(&path).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(
                stderr.contains(&format!("{}{expected}", path.display())),
                "{args:?}: {stderr}"
            );
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
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

/// A child process killed when the test ends, also when it fails.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGHUP reloads the file (counted as ok); an invalid file is rejected with the `check`
/// messages in the log (counted as error) and the proxy keeps serving; logs can be JSON lines.
#[test]
fn sighup_reloads_and_invalid_files_are_rejected() {
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (port, admin) = (free(), free());
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

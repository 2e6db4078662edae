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
    let mut child = tollgate()
        .env("TOLLGATE_CONFIG", &path)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "tollgate did not start listening"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
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

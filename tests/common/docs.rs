//! The examples of the Markdown docs, read as tests: a fenced `console` block marked by an
//! HTML comment just before it,
//!
//! ````text
//! <!-- doc-test: setup=lua -->
//! ```console
//! $ redis-cli --eval lua/token_bucket.lua tollgate:demo:alice , 10 20
//! 1) (integer) 1
//! [..]
//! ```
//! ````
//!
//! holds commands (`$ `, a trailing `\` continues one) each followed by what it prints. In the
//! printed lines `[..]` stands for any text within a line and a line `...` for any number of
//! lines. A command ending in `&` runs in the background for the rest of the block. Every `sh`
//! or `console` block must carry a marker: `setup=NAME` (see [`Fixture`]) or `skip: why`.

use std::fmt::Write as _;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, Redis};

/// One command of a block and what the doc says it prints.
#[derive(Debug)]
pub struct Step {
    /// The doc's line of the `$ `.
    pub line: usize,
    pub command: String,
    pub expected: Vec<String>,
}

/// A marked `console` block.
#[derive(Debug)]
pub struct Block {
    /// `file:line` of the opening fence.
    pub at: String,
    pub setup: String,
    /// Runs allowed before it fails (`retry=N`): for a block whose output hangs on when a
    /// token comes back, which no command can pin down.
    pub tries: u32,
    pub steps: Vec<Step>,
}

/// Reads the marked blocks of a Markdown file (relative to the crate root). Errors list each
/// runnable block that carries no marker, or a marker that is malformed.
pub fn blocks(file: &str) -> (Vec<Block>, Vec<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {file}: {e}"));
    let lines: Vec<&str> = text.lines().collect();
    let (mut found, mut problems) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].starts_with("```"))
            .unwrap_or(lines.len());
        let at = format!("{file}:{}", i + 1);
        let marker = (0..i)
            .rev()
            .map(|j| lines[j].trim())
            .find(|l| !l.is_empty())
            .and_then(|l| l.strip_prefix("<!-- doc-test:"))
            .and_then(|l| l.strip_suffix("-->"))
            .map(str::trim);
        let runnable = matches!(info.trim(), "sh" | "console");
        match marker {
            None if runnable => problems.push(format!(
                "{at}: a `{info}` block without a `<!-- doc-test: setup=NAME -->` or \
                 `<!-- doc-test: skip: why -->` line before it"
            )),
            Some(m) if m.starts_with("skip:") && m.len() > "skip:".len() + 3 => {}
            Some(m) => match m.strip_prefix("setup=") {
                Some(setup) if info.trim() == "console" => found.push(Block {
                    at,
                    setup: setup
                        .split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                    tries: setup
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("retry="))
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(1),
                    steps: steps(&lines[i + 1..end], i + 2),
                }),
                _ => problems.push(format!(
                    "{at}: `{m}`: a marker is `setup=NAME` before a `console` block or \
                     `skip: why`"
                )),
            },
            None => {}
        }
        i = end + 1;
    }
    (found, problems)
}

fn steps(body: &[&str], first_line: usize) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut continued = false;
    for (n, line) in body.iter().enumerate() {
        if continued {
            let step = steps.last_mut().expect("a continued command");
            step.command.push('\n');
            step.command.push_str(line);
            continued = line.ends_with('\\');
        } else if let Some(cmd) = line.strip_prefix("$ ") {
            steps.push(Step {
                line: first_line + n,
                command: cmd.to_string(),
                expected: Vec::new(),
            });
            continued = cmd.ends_with('\\');
        } else if let Some(step) = steps.last_mut() {
            step.expected.push(line.to_string());
        }
    }
    steps
}

/// Whether `actual` is what `expected` shows: `[..]` within a line, `...` for lines.
pub fn matches(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((e, rest)) if e == "..." => (0..=actual.len()).any(|k| matches(rest, &actual[k..])),
        Some((e, rest)) => actual
            .split_first()
            .is_some_and(|(a, more)| line_matches(e, a) && matches(rest, more)),
    }
}

fn line_matches(expected: &str, actual: &str) -> bool {
    let parts: Vec<&str> = expected.split("[..]").collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return expected == actual;
    }
    if !actual.starts_with(first) || actual.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &actual[first.len()..actual.len() - last.len()];
    if !actual.ends_with(last) {
        return false;
    }
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Replaces `from` with `to` where it stands as a whole number (no digit either side).
pub fn swap_port(text: &str, from: u16, to: u16) -> String {
    let (from, to) = (from.to_string(), to.to_string());
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&from) {
        let before = rest[..at].chars().last();
        let after = rest[at + from.len()..].chars().next();
        let whole = !before.is_some_and(|c| c.is_ascii_digit())
            && !after.is_some_and(|c| c.is_ascii_digit());
        out.push_str(&rest[..at]);
        out.push_str(if whole { &to } else { &from });
        rest = &rest[at + from.len()..];
    }
    out.push_str(rest);
    out
}

/// What a block runs against, named by its `setup=`:
///
/// * `repo`: the crate root, `tollgate` being the binary under test;
/// * `lua`: and a fresh Redis of its own, which `redis-cli` talks to (its replies formatted
///   as on a terminal, unless the command pipes them on);
/// * `quickstart`: and the ports of the README's quick start, 6379 (that Redis), 8000 and
///   8080, mapped to free ones, with `REDIS_URL`, `UPSTREAM_URL` and `TOLLGATE_LISTEN` pointing
///   the shipped `proxy.yaml` at them;
/// * `admin`: the quick start already running, with `admin` added to its file: listening on
///   9901 (mapped too), its token in `TOLLGATE_ADMIN_TOKEN`;
/// * `open-admin`: the same without a token.
pub struct Fixture {
    _redis: Option<Redis>,
    bin: tempfile::TempDir,
    /// (the port the doc shows, the port used)
    ports: Vec<(u16, u16)>,
    env: Vec<(String, String)>,
    background: Vec<Child>,
}

impl Fixture {
    pub fn new(setup: &str) -> Result<Fixture, String> {
        let redis = match setup {
            "repo" => None,
            "lua" | "quickstart" | "admin" | "open-admin" => Some(Redis::start()),
            other => {
                return Err(format!(
                    "no setup named `{other}` (repo, lua, quickstart, admin, open-admin)"
                ))
            }
        };
        let bin = tempfile::tempdir().expect("temp dir");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tollgate"), bin.path().join("tollgate"))
            .expect("link the binary");
        let mut fixture = Fixture {
            _redis: None,
            bin,
            ports: Vec::new(),
            env: Vec::new(),
            background: Vec::new(),
        };
        if let Some(redis) = redis {
            fixture.wrap_redis_cli(redis.port);
            fixture.ports.push((6379, redis.port));
            fixture.env.push(("REDIS_URL".into(), redis.url()));
            fixture._redis = Some(redis);
        }
        if matches!(setup, "quickstart" | "admin" | "open-admin") {
            let (up, listen) = (free_port(), free_port());
            fixture.ports.extend([(8000, up), (8080, listen)]);
            fixture.env.extend([
                ("UPSTREAM_URL".into(), format!("http://127.0.0.1:{up}")),
                ("TOLLGATE_LISTEN".into(), format!("127.0.0.1:{listen}")),
            ]);
        }
        if setup == "admin" || setup == "open-admin" {
            fixture.start_with_admin(setup == "admin");
        }
        Ok(fixture)
    }

    /// The quick start, run by the fixture, with the shipped `proxy.yaml` and an admin
    /// listener on 9901 that asks for `$TOLLGATE_ADMIN_TOKEN` when `token`.
    fn start_with_admin(&mut self, token: bool) {
        let admin = free_port();
        self.ports.push((9901, admin));
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("proxy.yaml");
        let mut yaml = std::fs::read_to_string(shipped).expect("read proxy.yaml");
        yaml.push_str(&format!("admin:\n  listen: 127.0.0.1:{admin}\n"));
        if token {
            self.env
                .push(("TOLLGATE_ADMIN_TOKEN".into(), "doc-test-token".into()));
            yaml.push_str("  token: ${TOLLGATE_ADMIN_TOKEN}\n");
        }
        let config = self.bin.path().join("admin.yaml");
        std::fs::write(&config, yaml).expect("write the admin setup's config");
        self.run("python3 -m http.server 8000 &");
        self.run(&format!("tollgate --config {} &", config.display()));
    }

    fn wrap_redis_cli(&self, port: u16) {
        let real = which("redis-cli");
        let script = self.bin.path().join("redis-cli");
        let text = format!(
            // formatted as on a terminal, unless the doc pipes the output on (see `run`)
            "#!/bin/sh\n[ -n \"$DOC_TEST_TTY\" ] && set -- --no-raw \"$@\"\nexec {} -p {port} \"$@\"\n",
            real.display()
        );
        std::fs::write(&script, text).expect("write the redis-cli wrapper");
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(&script, mode).expect("make the wrapper runnable");
    }

    /// Runs one command as the doc shows it; its output (stdout, then stderr), ports mapped
    /// back to the doc's.
    pub fn run(&mut self, command: &str) -> Vec<String> {
        let mut command = command.to_string();
        for &(doc, real) in &self.ports {
            command = swap_port(&command, doc, real);
        }
        let mut sh = self.shell();
        if let Some(bg) = background(&command) {
            let child = sh.arg("-c").arg(format!("exec {bg}")).stdin(Stdio::null());
            let child = child.stdout(Stdio::null()).stderr(Stdio::null()).spawn();
            self.background
                .push(child.expect("start a background command"));
            return Vec::new();
        }
        self.wait_for_services();
        if !command.contains('|') {
            // the reader's terminal: redis-cli formats its replies there, raw into a pipe
            sh.env("DOC_TEST_TTY", "1");
        }
        let out = sh.arg("-c").arg(&command).output().expect("run sh");
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        for &(doc, real) in &self.ports {
            text = swap_port(&text, real, doc);
        }
        let mut lines: Vec<String> = text.lines().map(|l| l.trim_end().to_string()).collect();
        while lines.last().is_some_and(|l| l.is_empty()) {
            lines.pop();
        }
        lines
    }

    /// `sh` in the crate root, with the fixture's binaries first on `PATH` and its environment.
    fn shell(&self) -> Command {
        let path = format!(
            "{}:{}",
            self.bin.path().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut sh = Command::new("sh");
        // (the environment of the test run must not change what the shipped file says)
        for var in [
            "REDIS_URL",
            "UPSTREAM_URL",
            "TOLLGATE_LISTEN",
            "TOLLGATE_CONFIG",
        ] {
            sh.env_remove(var);
        }
        sh.current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("PATH", path)
            .envs(self.env.clone());
        sh
    }

    /// Once something runs in the background, every mapped port must answer before the next
    /// command: the doc's reader would wait for the same.
    fn wait_for_services(&self) {
        if self.background.is_empty() {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        for &(_, port) in &self.ports {
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(Instant::now() < deadline, "nothing listens on port {port}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for child in &mut self.background {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The command of `CMD &` or `CMD &   # a comment`.
fn background(command: &str) -> Option<&str> {
    let cut = command.find(" #").unwrap_or(command.len());
    command[..cut].trim_end().strip_suffix('&')
}

fn which(binary: &str) -> PathBuf {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|dir| Path::new(dir).join(binary))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`{binary}` is not installed (apt-get install redis-tools)"))
}

/// Runs a block (again, up to its `tries`, while it differs); what differed, as [`run_once`].
pub fn check(block: &Block) -> Vec<String> {
    let mut problems = run_once(block);
    for _ in 1..block.tries {
        if problems.is_empty() {
            break;
        }
        problems = run_once(block);
    }
    problems
}

/// Runs a block's steps in a fresh fixture; a description of each step whose output differs.
fn run_once(block: &Block) -> Vec<String> {
    let mut fixture = match Fixture::new(&block.setup) {
        Ok(f) => f,
        Err(e) => return vec![format!("{}: {e}", block.at)],
    };
    let mut problems = Vec::new();
    for step in &block.steps {
        let actual = fixture.run(&step.command);
        if !matches(&step.expected, &actual) {
            let file = block.at.split(':').next().unwrap_or_default();
            let mut p = format!("{file}:{}: `{}` printed:\n", step.line, step.command);
            for l in &actual {
                let _ = writeln!(p, "    {l}");
            }
            p.push_str("  the doc shows:\n");
            for l in &step.expected {
                let _ = writeln!(p, "    {l}");
            }
            problems.push(p);
        }
    }
    problems
}

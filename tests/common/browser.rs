//! A headless Chromium, driven through `chromedriver` over W3C WebDriver, for the tests of the
//! dashboard. A missing Chromium fails the test with a message saying how to install it.
//! [`Page`] is what a test does with a page, in Chromium or in Firefox (`super::firefox`).
//!
//! WebDriver is JSON over HTTP, and these tests need a dozen of its calls: this speaks them
//! with the harness's own HTTP client, where a WebDriver crate would bring two dozen crates
//! (among them a second `http` and Unicode segmentation tables) to the build.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How WebDriver marks a DOM element in JSON.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The key WebDriver types for Enter.
pub const ENTER: &str = "\u{E007}";

/// A browser session. `chromedriver` and the Chromium it starts run in a process group of
/// their own, which dropping this kills whole.
pub struct Browser {
    driver: Child,
    /// `http://127.0.0.1:PORT/session/ID`
    session: String,
    /// Chromium's profile and temporary files, removed with the session
    _dir: tempfile::TempDir,
}

/// A DOM element of the page, as WebDriver names it.
#[derive(Debug, Clone)]
pub struct Element(String);

/// What a test does with the page a browser shows; the same steps run in each browser.
#[allow(async_fn_in_trait)] // (the tests await these in place: no `Send` bound is needed)
pub trait Page {
    /// Opens `url` and waits for it to load.
    async fn open(&self, url: &str);

    /// Runs `script` in the page (a function body: `return` gives its value back). An element
    /// comes back as a JSON object.
    async fn run(&self, script: &str) -> Value;

    /// Clicks the element `script` returns, as a user would: at its place on the screen. An
    /// element that the page redraws between the finding and the click is found again.
    async fn click(&self, script: &str);

    /// Types `text` into the element `script` returns, key by key ([`ENTER`] presses Enter).
    async fn type_into(&self, script: &str, text: &str);

    /// The page's messages at the level of errors since the last call: uncaught exceptions,
    /// `console.error`, policy violations, and, in Chromium, failed loads.
    async fn console_errors(&self) -> Vec<String>;

    /// Ends the session: the browser exits and removes its profile.
    async fn quit(self);

    /// Runs `script` until it returns something other than `null`, `false` or `""`, and
    /// returns that; fails after `limit`, saying `what` was awaited.
    async fn wait_for(&self, what: &str, limit: Duration, script: &str) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let value = self.run(script).await;
            if !matches!(&value, Value::Null | Value::Bool(false)) && value != "" {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "the page did not show {what} within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `name` on the `PATH`.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|file| file.is_file())
}

/// Chromium and chromedriver, or a failure that says how to get them.
fn require_browser() -> (PathBuf, PathBuf) {
    let chromium = ["chromium", "chromium-browser"]
        .into_iter()
        .find_map(on_path);
    match (chromium, on_path("chromedriver")) {
        (Some(chromium), Some(driver)) => (chromium, driver),
        _ => panic!(
            "`chromium` or `chromedriver` is not installed: the dashboard tests drive a real \
             browser (apt-get install chromium chromium-driver; scripts/test installs them)"
        ),
    }
}

impl Browser {
    /// Starts chromedriver on a free port and opens a headless Chromium with a 1280x800
    /// window.
    pub async fn start() -> Browser {
        let (chromium, driver_path) = require_browser();
        let dir = tempfile::tempdir().expect("a directory for the browser");
        let (driver, base) = start_driver(&driver_path, dir.path()).await;
        let args = [
            "--headless".to_string(),
            "--no-sandbox".to_string(), // (tests may run as root, where the sandbox cannot)
            "--disable-dev-shm-usage".to_string(),
            "--hide-scrollbars".to_string(),
            "--window-size=1280,800".to_string(),
            format!("--user-data-dir={}", dir.path().join("profile").display()),
        ];
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let mut browser = Browser {
            driver,
            session: String::new(),
            _dir: dir,
        };
        let started = call(
            http::Method::POST,
            &format!("{base}/session"),
            Some(capabilities),
        )
        .await
        .unwrap_or_else(|e| panic!("chromedriver could not start Chromium: {e}"));
        let id = started["sessionId"].as_str().expect("a session id");
        browser.session = format!("{base}/session/{id}");
        browser
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value, String> {
        let url = format!("{}{path}", self.session);
        call(http::Method::POST, &url, Some(body)).await
    }

    /// The element `script` returns; `None` when it returns `null`.
    pub async fn element(&self, script: &str) -> Option<Element> {
        let value = self.run(script).await;
        let id = value.get(ELEMENT)?.as_str()?;
        Some(Element(id.to_string()))
    }

    /// Makes the page's viewport `width` x `height` CSS pixels, one device pixel each.
    pub async fn viewport(&self, width: u32, height: u32) {
        let params =
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false});
        let body = json!({"cmd": "Emulation.setDeviceMetricsOverride", "params": params});
        self.post("/goog/cdp/execute", body)
            .await
            .expect("set the viewport");
    }

    /// Shows the page as a system set to dark mode would (`prefers-color-scheme: dark`), or
    /// light.
    pub async fn color_scheme(&self, dark: bool) {
        let value = if dark { "dark" } else { "light" };
        let features = [json!({"name": "prefers-color-scheme", "value": value})];
        let body = json!({"cmd": "Emulation.setEmulatedMedia", "params": {"features": features}});
        self.post("/goog/cdp/execute", body)
            .await
            .expect("set the colour scheme");
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine as _;
        let url = format!("{}/screenshot", self.session);
        let png = call(http::Method::GET, &url, None)
            .await
            .expect("screenshot");
        base64::engine::general_purpose::STANDARD
            .decode(png.as_str().expect("base64 text"))
            .expect("a PNG in base64")
    }
}

impl Page for Browser {
    async fn open(&self, url: &str) {
        self.post("/url", json!({"url": url})).await.expect("open");
    }

    async fn run(&self, script: &str) -> Value {
        let body = json!({"script": script, "args": []});
        self.post("/execute/sync", body)
            .await
            .unwrap_or_else(|e| panic!("{e}\nin the script: {script}"))
    }

    async fn click(&self, script: &str) {
        for _ in 0..20 {
            let Some(Element(id)) = self.element(script).await else {
                panic!("nothing to click: {script}");
            };
            match self.post(&format!("/element/{id}/click"), json!({})).await {
                Ok(_) => return,
                Err(e) if e.contains("stale element") => continue,
                Err(e) => panic!("click: {e}"),
            }
        }
        panic!("the element kept being redrawn before a click: {script}");
    }

    async fn type_into(&self, script: &str, text: &str) {
        let Some(Element(id)) = self.element(script).await else {
            panic!("nothing to type into: {script}");
        };
        let path = format!("/element/{id}/value");
        self.post(&path, json!({"text": text})).await.expect("type");
    }

    async fn console_errors(&self) -> Vec<String> {
        let log = self
            .post("/se/log", json!({"type": "browser"}))
            .await
            .expect("the browser's log");
        log.as_array()
            .expect("a list of log entries")
            .iter()
            .filter(|entry| entry["level"] == "SEVERE")
            .map(|entry| format!("{}: {}", entry["source"], entry["message"]))
            .collect()
    }

    async fn quit(self) {
        let _ = call(http::Method::DELETE, &self.session, None).await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // the group is chromedriver's own (`process_group(0)`): its id is chromedriver's
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.wait();
    }
}

/// Starts chromedriver on a free port and waits until it is ready; another port when the one
/// it was given was taken meanwhile. It and the browser keep their temporary files in `dir`.
async fn start_driver(path: &Path, dir: &Path) -> (Child, String) {
    for _ in 0..3 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut child = Command::new(path)
            .arg(format!("--port={port}"))
            .env("TMPDIR", dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start chromedriver");
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if child.try_wait().expect("chromedriver's status").is_some() {
                break;
            }
            let status = call(http::Method::GET, &format!("{base}/status"), None).await;
            if status.is_ok_and(|s| s["ready"] == true) {
                return (child, base);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("chromedriver did not start");
}

/// One WebDriver call: its `value`, or the error it answered, in words.
async fn call(method: http::Method, url: &str, body: Option<Value>) -> Result<Value, String> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let request = http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(super::full(body))
        .expect("a request");
    let client = super::http_client();
    let response = tokio::time::timeout(Duration::from_secs(60), client.request(request))
        .await
        .map_err(|_| format!("{url}: no answer within 60 s"))?
        .map_err(|e| format!("{url}: {e}"))?;
    let status = response.status();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .map_err(|e| format!("{url}: {e}"))?
        .to_bytes();
    let json: Value = serde_json::from_slice(&bytes).map_err(|e| format!("{url}: {e}"))?;
    if status.is_success() {
        return Ok(json["value"].clone());
    }
    let error = &json["value"];
    Err(format!("{url}: {}: {}", error["error"], error["message"]))
}

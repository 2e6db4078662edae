//! A headless Firefox, driven over WebDriver BiDi, for the tests of the dashboard. A missing
//! Firefox fails the test with a message saying how to install it.
//!
//! Firefox speaks BiDi itself on `--remote-debugging-port`, so no driver program is needed:
//! only a WebSocket, which this module speaks in its simplest form (text frames, masked as a
//! client must). BiDi also reports the page's errors as events from the first line of script,
//! where a classic WebDriver session can only look after the page has loaded.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use super::browser::{on_path, Page};

/// The answer to one command: its result, or the error in words.
type Answer = Result<Value, String>;

/// A Firefox session. Firefox runs in a process group of its own, which dropping this kills
/// whole.
pub struct Firefox {
    firefox: Child,
    bidi: Bidi,
    /// the browsing context (the tab) the page is in
    context: String,
    /// Firefox's profile, removed with the session
    _dir: tempfile::TempDir,
}

impl Firefox {
    /// Starts a headless Firefox with a 1280x800 viewport and a BiDi session on it.
    pub async fn start() -> Firefox {
        let binary = ["firefox-esr", "firefox"]
            .into_iter()
            .find_map(on_path)
            .expect(
                "`firefox-esr` is not installed: the dashboard tests drive a real browser \
                 (apt-get install firefox-esr; scripts/test installs it)",
            );
        let dir = tempfile::tempdir().expect("a directory for the browser");
        let mut firefox = Command::new(binary)
            .args(["--headless", "--no-remote", "--remote-debugging-port=0"])
            .arg("--profile")
            .arg(dir.path())
            .env("TMPDIR", dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("start firefox");
        let stderr = firefox.stderr.take().expect("firefox's stderr");
        let port = tokio::task::spawn_blocking(move || listening_port(stderr))
            .await
            .expect("read firefox's stderr")
            .expect("firefox did not start its WebDriver BiDi server");
        let bidi = Bidi::connect(port).await;
        bidi.send("session.new", json!({"capabilities": {}}))
            .await
            .expect("a BiDi session");
        let events = json!({"events": ["log.entryAdded"]});
        bidi.send("session.subscribe", events)
            .await
            .expect("subscribe to the page's log");
        let tree = bidi
            .send("browsingContext.getTree", json!({}))
            .await
            .expect("the open tabs");
        let context = tree["contexts"][0]["context"]
            .as_str()
            .expect("a tab")
            .to_string();
        let viewport = json!({"context": context, "viewport": {"width": 1280, "height": 800}});
        bidi.send("browsingContext.setViewport", viewport)
            .await
            .expect("set the viewport");
        Firefox {
            firefox,
            bidi,
            context,
            _dir: dir,
        }
    }

    /// The shared id of the element `script` returns, scrolled into view; `None` when it
    /// returns `null`.
    async fn element(&self, script: &str) -> Option<String> {
        let scrolled = format!(
            "const el = (() => {{ {script} }})();
             if (el) el.scrollIntoView({{block: 'center'}});
             return el;"
        );
        let node = self.run(&scrolled).await;
        Some(node.get("node")?.as_str()?.to_string())
    }

    /// Plays one input source's `actions` in the page.
    async fn act(&self, source: Value) -> Answer {
        let params = json!({"context": self.context, "actions": [source]});
        self.bidi.send("input.performActions", params).await
    }
}

impl Page for Firefox {
    async fn open(&self, url: &str) {
        let params = json!({"context": self.context, "url": url, "wait": "complete"});
        self.bidi
            .send("browsingContext.navigate", params)
            .await
            .expect("open");
    }

    async fn run(&self, script: &str) -> Value {
        let params = json!({
            "functionDeclaration": format!("function () {{ {script} }}"),
            "awaitPromise": false,
            "target": {"context": self.context},
        });
        let answer = self
            .bidi
            .send("script.callFunction", params)
            .await
            .unwrap_or_else(|e| panic!("{e}\nin the script: {script}"));
        if answer["type"] == "exception" {
            let text = &answer["exceptionDetails"]["text"];
            panic!("the script threw {text}\nin the script: {script}");
        }
        plain(&answer["result"])
    }

    async fn click(&self, script: &str) {
        for _ in 0..20 {
            let Some(id) = self.element(script).await else {
                panic!("nothing to click: {script}");
            };
            let at = json!({"type": "element", "element": {"sharedId": id}});
            let mouse = json!({
                "type": "pointer",
                "id": "mouse",
                "parameters": {"pointerType": "mouse"},
                "actions": [
                    {"type": "pointerMove", "x": 0, "y": 0, "origin": at},
                    {"type": "pointerDown", "button": 0},
                    {"type": "pointerUp", "button": 0},
                ],
            });
            match self.act(mouse).await {
                Ok(_) => return,
                // (the page redrew the element between the finding and the click)
                Err(e) if e.contains("no such node") || e.contains("stale") => continue,
                Err(e) => panic!("click: {e}"),
            }
        }
        panic!("the element kept being redrawn before a click: {script}");
    }

    async fn type_into(&self, script: &str, text: &str) {
        self.click(script).await;
        let keys: Vec<Value> = text
            .chars()
            .flat_map(|c| {
                let c = c.to_string();
                [
                    json!({"type": "keyDown", "value": c}),
                    json!({"type": "keyUp", "value": c}),
                ]
            })
            .collect();
        let keyboard = json!({"type": "key", "id": "keyboard", "actions": keys});
        self.act(keyboard).await.expect("type");
    }

    async fn console_errors(&self) -> Vec<String> {
        std::mem::take(&mut *self.bidi.errors.lock().expect("the error list"))
    }

    async fn quit(self) {
        let _ = self.bidi.send("browser.close", json!({})).await;
    }
}

impl Drop for Firefox {
    fn drop(&mut self) {
        self.bidi.reader.abort();
        // the group is Firefox's own (`process_group(0)`): its id is Firefox's
        let group = format!("-{}", self.firefox.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.firefox.wait();
    }
}

/// The port of `ws://127.0.0.1:PORT`, which Firefox prints once its BiDi server listens; the
/// rest of its stderr is read and dropped, so Firefox never blocks writing it.
fn listening_port(stderr: std::process::ChildStderr) -> Option<u16> {
    const SAID: &str = "WebDriver BiDi listening on ws://127.0.0.1:";
    let mut lines = BufReader::new(stderr).lines();
    let port = lines.by_ref().map_while(Result::ok).find_map(|line| {
        let rest = line.split(SAID).nth(1)?;
        rest.trim().parse().ok()
    });
    std::thread::spawn(move || lines.for_each(drop));
    port
}

/// A BiDi connection: commands go out with an id, and a reader task hands each answer to the
/// command waiting for it and keeps the page's errors.
struct Bidi {
    writer: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    waiting: Arc<Mutex<HashMap<u64, oneshot::Sender<Answer>>>>,
    /// the page's log entries at the level of errors, not yet taken
    errors: Arc<Mutex<Vec<String>>>,
    next_id: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
}

impl Bidi {
    /// Opens the WebSocket to `ws://127.0.0.1:port/session`.
    async fn connect(port: u16) -> Bidi {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect to firefox");
        let (mut read, mut write) = stream.into_split();
        // the key is any 16 bytes in base64; the answer's accept value is not checked, as
        // the peer is the browser this test started
        let handshake = format!(
            "GET /session HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dG9sbGdhdGUgdGVzdHMgIQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        );
        write
            .write_all(handshake.as_bytes())
            .await
            .expect("send the handshake");
        let head = read_head(&mut read).await;
        assert!(
            head.starts_with("HTTP/1.1 101"),
            "firefox refused the WebSocket: {head}"
        );
        let writer = Arc::new(tokio::sync::Mutex::new(write));
        let waiting = Arc::new(Mutex::new(HashMap::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let reader = tokio::spawn(read_messages(
            read,
            writer.clone(),
            waiting.clone(),
            errors.clone(),
        ));
        Bidi {
            writer,
            waiting,
            errors,
            next_id: AtomicU64::new(1),
            reader,
        }
    }

    /// Sends one command and waits for its answer.
    async fn send(&self, method: &str, params: Value) -> Answer {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting
            .lock()
            .expect("the waiting list")
            .insert(id, tx);
        let command = json!({"id": id, "method": method, "params": params}).to_string();
        let frame = frame(OP_TEXT, command.as_bytes());
        self.writer
            .lock()
            .await
            .write_all(&frame)
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        match tokio::time::timeout(Duration::from_secs(60), rx).await {
            Ok(Ok(answer)) => answer.map_err(|e| format!("{method}: {e}")),
            Ok(Err(_)) => Err(format!("{method}: the connection closed")),
            Err(_) => Err(format!("{method}: no answer within 60 s")),
        }
    }
}

/// The HTTP head of the handshake's answer, read byte by byte so that no frame after it is
/// taken.
async fn read_head(read: &mut OwnedReadHalf) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let byte = read.read_u8().await.expect("the handshake's answer");
        head.push(byte);
    }
    String::from_utf8_lossy(&head).into_owned()
}

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

/// One whole frame from a client: final, masked (RFC 6455 §5.3), with the length in the
/// shortest form.
fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n if n <= 0xFFFF => {
            out.push(0x80 | 126);
            out.extend((n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend((n as u64).to_be_bytes());
        }
    }
    let mask = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0x5eed_1234, |d| d.subsec_nanos())
        .to_be_bytes();
    out.extend(mask);
    out.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
    out
}

/// Reads messages until the connection closes: answers go to their commands, `log.entryAdded`
/// events at the level of errors to `errors`, pings are answered.
async fn read_messages(
    mut read: OwnedReadHalf,
    writer: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    waiting: Arc<Mutex<HashMap<u64, oneshot::Sender<Answer>>>>,
    errors: Arc<Mutex<Vec<String>>>,
) {
    let mut message = Vec::new();
    loop {
        let Ok((fin, opcode, payload)) = read_frame(&mut read).await else {
            return;
        };
        match opcode {
            OP_TEXT | OP_CONTINUATION => message.extend(payload),
            OP_PING => {
                let pong = frame(OP_PONG, &payload);
                let _ = writer.lock().await.write_all(&pong).await;
                continue;
            }
            OP_CLOSE => return,
            _ => continue,
        }
        if !fin {
            continue;
        }
        let text = std::mem::take(&mut message);
        let Ok(value) = serde_json::from_slice::<Value>(&text) else {
            continue;
        };
        if let Some(id) = value["id"].as_u64() {
            let answer = if value["type"] == "success" {
                Ok(value["result"].clone())
            } else {
                Err(format!("{}: {}", value["error"], value["message"]))
            };
            let sender = waiting.lock().expect("the waiting list").remove(&id);
            if let Some(sender) = sender {
                let _ = sender.send(answer);
            }
        } else if value["method"] == "log.entryAdded" && value["params"]["level"] == "error" {
            let entry = &value["params"];
            let said = format!("{}: {}", entry["type"], entry["text"]);
            errors.lock().expect("the error list").push(said);
        }
    }
}

/// One frame from the server: whether it ends its message, its opcode and its payload.
async fn read_frame(read: &mut OwnedReadHalf) -> std::io::Result<(bool, u8, Vec<u8>)> {
    let [first, second] = {
        let mut two = [0u8; 2];
        read.read_exact(&mut two).await?;
        two
    };
    let len = match second & 0x7F {
        126 => u64::from(read.read_u16().await?),
        127 => read.read_u64().await?,
        n => u64::from(n),
    };
    // (a server never masks, but a mask would come here)
    let mask = if second & 0x80 != 0 {
        let mut mask = [0u8; 4];
        read.read_exact(&mut mask).await?;
        Some(mask)
    } else {
        None
    };
    let mut payload = vec![0u8; usize::try_from(len).expect("a frame that fits in memory")];
    read.read_exact(&mut payload).await?;
    if let Some(mask) = mask {
        payload
            .iter_mut()
            .zip(mask.iter().cycle())
            .for_each(|(b, m)| *b ^= m);
    }
    Ok((first & 0x80 != 0, first & 0x0F, payload))
}

/// A BiDi remote value as plain JSON, as a classic WebDriver session answers: an element
/// becomes `{"node": <shared id>}`.
fn plain(remote: &Value) -> Value {
    let value = &remote["value"];
    match remote["type"].as_str().unwrap_or_default() {
        "string" | "boolean" => value.clone(),
        // (NaN and the infinities come as strings; no test asks for them)
        "number" => value.as_f64().map_or(Value::Null, |_| value.clone()),
        "array" | "set" => value
            .as_array()
            .map_or(Value::Null, |items| items.iter().map(plain).collect()),
        "object" | "map" => {
            let pairs = value.as_array().map(Vec::as_slice).unwrap_or_default();
            let object: Map<String, Value> = pairs
                .iter()
                .filter_map(|pair| {
                    let key = match &pair[0] {
                        Value::String(key) => key.clone(),
                        key => plain(key).to_string(),
                    };
                    Some((key, plain(pair.get(1)?)))
                })
                .collect();
            Value::Object(object)
        }
        "node" => json!({"node": remote["sharedId"]}),
        "undefined" | "null" => Value::Null,
        other => json!({"type": other}),
    }
}

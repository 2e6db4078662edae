//! Every client the console shows can be looked up and reset in the form it is shown, against a
//! real tollgate, a real upstream and a real Redis: a client that sent no key (`%ip=ADDR`), one
//! that sent bytes that are not UTF-8, `|` or `%` in a value, a key long enough to be stored as
//! its digest. `/api/stats`, `DELETE /api/limits/...` and `tollgate limits` agree on one form.

mod common;
common::both_http1_clients!();

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use common::raw::RawConn;
use common::{Proxy, Redis, Upstream, Yaml};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use serde_json::Value;

const TOKEN: &str = "s3cret";

/// One limit of one request an hour per client on each route: `/one` keyed on `X-Api-Key`,
/// `/two` on `X-Tenant` and `X-Api-Key` together.
fn yaml(redis: &Redis, upstream: &Upstream) -> String {
    let limit = |name: &str, key: &str| {
        format!(
            "limits: [{{name: {name}, algorithm: fixed_window, key: {key}, limit: 1, window: 1h}}]"
        )
    };
    Yaml::to(&[upstream.url()])
        .top(&format!(
            "workers: 1\nadmin: {{listen: 127.0.0.1:0, token: {TOKEN}}}"
        ))
        .redis(redis, "timeout: 500ms")
        .route("one", "/one", &limit("per-key", "header:x-api-key"))
        .route(
            "two",
            "/two",
            &limit("per-pair", "[header:x-tenant, header:x-api-key]"),
        )
        .build()
}

/// A client: the address it connects from, the route it calls and the headers it sends, bytes
/// as they go on the wire.
#[derive(Debug, Clone)]
struct Client {
    from: Ipv4Addr,
    route: &'static str,
    headers: Vec<(&'static str, Vec<u8>)>,
}

impl Client {
    fn new(from: [u8; 4], route: &'static str, headers: &[(&'static str, &[u8])]) -> Client {
        let headers = headers.iter().map(|(n, v)| (*n, v.to_vec())).collect();
        Client {
            from: Ipv4Addr::from(from),
            route,
            headers,
        }
    }

    fn limit(&self) -> &'static str {
        if self.route == "one" {
            "per-key"
        } else {
            "per-pair"
        }
    }

    /// The status of one request, sent over a raw connection from the client's address.
    async fn call(&self, proxy: SocketAddr) -> u16 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::new(IpAddr::V4(self.from), 0))
            .unwrap();
        let stream = socket.connect(proxy).await.unwrap();
        let mut conn = RawConn {
            stream,
            buf: Vec::new(),
            closed: false,
        };
        let mut req = format!("GET /{} HTTP/1.1\r\nHost: test\r\n", self.route).into_bytes();
        for (name, value) in &self.headers {
            req.extend_from_slice(format!("{name}: ").as_bytes());
            req.extend_from_slice(value);
            req.extend_from_slice(b"\r\n");
        }
        req.extend_from_slice(b"Connection: close\r\n\r\n");
        conn.send(&req).await;
        conn.response().await.expect("a response").status
    }
}

/// `text` encoded as a query value, as the dashboard's `encodeURIComponent` encodes it.
fn uri_component(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

async fn admin(proxy: &Proxy, method: http::Method, path: &str) -> (u16, Value) {
    let url = format!("http://{}{path}", proxy.admin.expect("an admin listener"));
    let req = http::Request::builder()
        .method(method)
        .uri(url)
        .header("authorization", format!("Bearer {TOKEN}"));
    let answer = common::send(req.body(common::full("")).unwrap()).await;
    let body =
        serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("{e}: {}", answer.body));
    (answer.status, body)
}

/// The clients a route's limit refused, as `/api/stats` shows them.
async fn shown_refused(proxy: &Proxy, client: &Client) -> Vec<String> {
    let (status, stats) = admin(proxy, http::Method::GET, "/api/stats").await;
    assert_eq!(status, 200, "{stats}");
    let limit = stats["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["route"] == client.route)
        .unwrap_or_else(|| panic!("no limit on {}: {stats:#}", client.route));
    let top = limit["top_refused"].as_array().unwrap();
    top.iter()
        .map(|t| t["client"].as_str().unwrap().to_owned())
        .collect()
}

/// The limit call for `client` named `shown`.
fn limit_path(client: &Client, shown: &str) -> String {
    let (route, limit) = (client.route, client.limit());
    format!("/api/limits/{route}/{limit}?key={}", uri_component(shown))
}

/// Looks the client up, then resets it, through the API with `shown`: both answer 200 and name
/// the client in the same form.
async fn reset_through_api(proxy: &Proxy, client: &Client, shown: &str) {
    let path = limit_path(client, shown);
    let (status, state) = admin(proxy, http::Method::GET, &path).await;
    assert_eq!(status, 200, "{shown}: {state}");
    assert_eq!(state["allowed_now"], false, "{shown} is refused: {state}");
    assert_eq!(state["client"], shown, "{state}");
    let (status, reset) = admin(proxy, http::Method::DELETE, &path).await;
    assert_eq!(status, 200, "{shown}: {reset}");
    assert_eq!(reset["client"], shown, "{reset}");
}

/// Runs `tollgate limits ACTION` for `client` named `shown`; its exit code and its JSON.
async fn limits_command(proxy: &Proxy, action: &str, client: &Client, shown: &str) -> Value {
    let admin = format!("http://{}", proxy.admin.expect("an admin listener"));
    let args = [
        "limits",
        action,
        "--route",
        client.route,
        "--limit",
        client.limit(),
        "--key",
        shown,
        "--admin",
        &admin,
    ]
    .map(str::to_owned);
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(args)
            .env("TOLLGATE_ADMIN_TOKEN", TOKEN)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{action} {shown}: {stdout}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// The clients of the sweep, each with the form the console shows it in (`None`: a digest).
fn sweep() -> Vec<(Client, Option<&'static str>)> {
    let long = [b'L'; 80];
    vec![
        (
            Client::new([127, 0, 0, 44], "one", &[]),
            Some("%ip=127.0.0.44"),
        ),
        (
            Client::new([127, 0, 0, 1], "one", &[("x-api-key", b"bad\xff\xfekey")]),
            Some("bad%FF%FEkey"),
        ),
        (
            Client::new([127, 0, 0, 1], "one", &[("x-api-key", b"100%off")]),
            Some("100%25off"),
        ),
        (
            Client::new([127, 0, 0, 1], "one", &[("x-api-key", &long)]),
            None,
        ),
        (
            Client::new(
                [127, 0, 0, 1],
                "two",
                &[("x-tenant", b"a|b"), ("x-api-key", b"k")],
            ),
            Some("a%7Cb|k"),
        ),
        (
            Client::new([127, 0, 0, 45], "two", &[("x-tenant", b"t")]),
            Some("t|%ip=127.0.0.45"),
        ),
        (
            Client::new(
                [127, 0, 0, 1],
                "two",
                &[("x-tenant", &long), ("x-api-key", b"k")],
            ),
            None,
        ),
    ]
}

/// Gets every client refused, then finds each among the refused clients `/api/stats` shows:
/// in the expected form, or as a digest (`%sha1=` and 40 hex digits).
async fn refused_and_shown(proxy: &Proxy, clients: &[(Client, Option<&str>)]) -> Vec<String> {
    for (client, _) in clients {
        assert_eq!(client.call(proxy.addr).await, 200, "{client:?}");
        assert_eq!(client.call(proxy.addr).await, 429, "{client:?}");
    }
    let mut shown = Vec::new();
    for (client, expected) in clients {
        let refused = shown_refused(proxy, client).await;
        let found = match expected {
            Some(form) => refused.iter().find(|c| c == form),
            None => refused.iter().find(|c| {
                c.strip_prefix("%sha1=")
                    .is_some_and(|d| d.len() == 40 && d.bytes().all(|b| b.is_ascii_hexdigit()))
            }),
        };
        let found = found.unwrap_or_else(|| panic!("{client:?} ({expected:?}) in {refused:?}"));
        shown.push(found.clone());
    }
    shown
}

/// Each client the console shows is reset through `DELETE /api/limits/...` with exactly the
/// form `/api/stats` gave, and gets through next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shown_client_is_reset_through_the_api() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&yaml(&redis, &upstream)).await;
    let clients = sweep();
    let shown = refused_and_shown(&proxy, &clients).await;
    for ((client, _), shown) in clients.iter().zip(&shown) {
        reset_through_api(&proxy, client, shown).await;
        assert_eq!(client.call(proxy.addr).await, 200, "reset {shown}");
        assert_eq!(client.call(proxy.addr).await, 429, "{shown}: one an hour");
    }
    proxy.shutdown().await;
}

/// `tollgate limits show|reset` take the form `/api/stats` shows, and the reset lets the
/// client through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shown_client_is_reset_through_the_command_line() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&yaml(&redis, &upstream)).await;
    let clients = sweep();
    let shown = refused_and_shown(&proxy, &clients).await;
    for ((client, _), shown) in clients.iter().zip(&shown) {
        let state = limits_command(&proxy, "show", client, shown).await;
        assert_eq!(
            (&state["allowed_now"], &state["client"]),
            (&false.into(), &shown.as_str().into()),
            "{state}"
        );
        limits_command(&proxy, "reset", client, shown).await;
        assert_eq!(client.call(proxy.addr).await, 200, "reset {shown}");
    }
    proxy.shutdown().await;
}

/// A client that sends `X-Api-Key: %ip=127.0.0.44` is shown apart from the client at that
/// address that sends no key: resetting the key-less client leaves it refused, and the other
/// way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_the_fallback_form_is_not_the_one_reset() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&yaml(&redis, &upstream)).await;
    let keyless = Client::new([127, 0, 0, 44], "one", &[]);
    let forger = Client::new([127, 0, 0, 1], "one", &[("x-api-key", b"%ip=127.0.0.44")]);
    let clients = [
        (keyless.clone(), Some("%ip=127.0.0.44")),
        (forger.clone(), Some("%25ip=127.0.0.44")),
    ];
    let shown = refused_and_shown(&proxy, &clients).await;
    reset_through_api(&proxy, &keyless, &shown[0]).await;
    assert_eq!(forger.call(proxy.addr).await, 429, "not reset");
    assert_eq!(keyless.call(proxy.addr).await, 200, "reset");
    reset_through_api(&proxy, &forger, &shown[1]).await;
    assert_eq!(keyless.call(proxy.addr).await, 429, "not reset again");
    assert_eq!(forger.call(proxy.addr).await, 200, "reset");
    proxy.shutdown().await;
}

/// A header value as it may go on the wire: any byte but controls, with `%`, `|` and spaces
/// often; missing; or long enough to be stored as a digest.
fn wire_value() -> impl Strategy<Value = Option<Vec<u8>>> {
    let byte = prop_oneof![
        Just(b'%'),
        Just(b'|'),
        Just(b' '),
        0x21u8..=0x7e,
        0x80u8..=0xff
    ];
    proptest::option::of(proptest::collection::vec(byte, 1..80))
}

fn any_client() -> impl Strategy<Value = Client> {
    (any::<bool>(), wire_value(), wire_value(), 2u8..250).prop_map(|(two, tenant, key, last)| {
        let mut headers = Vec::new();
        if let Some(tenant) = tenant.filter(|_| two) {
            headers.push(("x-tenant", tenant));
        }
        if let Some(key) = key {
            headers.push(("x-api-key", key));
        }
        Client {
            from: Ipv4Addr::new(127, 0, 0, last),
            route: if two { "two" } else { "one" },
            headers,
        }
    })
}

/// For any client the console can show, a reset through the shown form lets that client
/// through next: each case against a fresh in-process tollgate and an emptied Redis.
#[test]
fn any_shown_client_is_reset_by_its_shown_form() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let redis = Redis::start();
    let upstream = runtime.block_on(Upstream::start());
    let config = yaml(&redis, &upstream);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let outcome = runner.run(&any_client(), |client| {
        redis.cli(&["FLUSHALL"]);
        runtime.block_on(one_case(&config, &client))
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}

async fn one_case(config: &str, client: &Client) -> Result<(), TestCaseError> {
    let proxy = Proxy::start(config).await;
    prop_assert_eq!(client.call(proxy.addr).await, 200);
    prop_assert_eq!(client.call(proxy.addr).await, 429);
    let refused = shown_refused(&proxy, client).await;
    prop_assert_eq!(refused.len(), 1, "{:?}", refused);
    let (status, reset) = admin(
        &proxy,
        http::Method::DELETE,
        &limit_path(client, &refused[0]),
    )
    .await;
    prop_assert_eq!(status, 200, "{}: {}", refused[0], reset);
    prop_assert_eq!(client.call(proxy.addr).await, 200, "reset {}", refused[0]);
    proxy.shutdown().await;
    Ok(())
}

/// An override on a key long enough to be stored as its digest applies to the client the
/// console names by that digest, as to its requests: the lookup reads the override's limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_holds_for_a_client_named_by_its_digest() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let long = "L".repeat(80);
    let limit = format!(
        "limits: [{{name: per-key, algorithm: fixed_window, key: header:x-api-key, limit: 1, \
         window: 1h, overrides: {{{long}: {{limit: 3}}}}}}]"
    );
    let yaml = Yaml::to(&[upstream.url()])
        .top(&format!("admin: {{listen: 127.0.0.1:0, token: {TOKEN}}}"))
        .redis(&redis, "timeout: 500ms")
        .route("one", "/one", &limit)
        .build();
    let proxy = Proxy::start(&yaml).await;
    let client = Client::new([127, 0, 0, 1], "one", &[("x-api-key", long.as_bytes())]);
    for expected in [200, 200, 200, 429] {
        assert_eq!(client.call(proxy.addr).await, expected);
    }
    let refused = shown_refused(&proxy, &client).await;
    assert!(refused[0].starts_with("%sha1="), "{refused:?}");
    reset_through_api(&proxy, &client, &refused[0]).await;
    for named in [refused[0].as_str(), &long] {
        let path = limit_path(&client, named);
        let (status, state) = admin(&proxy, http::Method::GET, &path).await;
        assert_eq!(status, 200, "{state}");
        // what the next request would leave: 2 of the override's 3 (the limit's own: 0)
        assert_eq!(state["remaining"], 2, "the override's limit: {state}");
        assert_eq!(state["client"], refused[0], "{state}");
    }
    proxy.shutdown().await;
}

/// Under `key: host`, requests without a host share one client, shown as the empty string:
/// `?key=` names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_without_a_host_is_named_by_the_empty_key() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let limit = "limits: [{name: per-host, algorithm: fixed_window, key: host, limit: 1, \
                 window: 1h}]";
    let yaml = Yaml::to(&[upstream.url()])
        .top(&format!("admin: {{listen: 127.0.0.1:0, token: {TOKEN}}}"))
        .redis(&redis, "timeout: 500ms")
        .route("one", "/", limit)
        .build();
    let proxy = Proxy::start(&yaml).await;
    // HTTP/1.0 needs no Host
    let hostless = || async {
        common::raw::one(proxy.addr, b"GET /h HTTP/1.0\r\n\r\n")
            .await
            .status
    };
    assert_eq!(hostless().await, 200);
    assert_eq!(hostless().await, 429);
    let (_, stats) = admin(&proxy, http::Method::GET, "/api/stats").await;
    assert_eq!(
        stats["limits"][0]["top_refused"][0]["client"], "",
        "{stats:#}"
    );
    let path = "/api/limits/one/per-host?key=";
    let (status, reset) = admin(&proxy, http::Method::DELETE, path).await;
    assert_eq!(status, 200, "{reset}");
    assert_eq!(hostless().await, 200, "reset");
    let (status, refused) = admin(&proxy, http::Method::GET, "/api/limits/one/per-host").await;
    assert_eq!(status, 400, "no key at all: {refused}");
    proxy.shutdown().await;
}

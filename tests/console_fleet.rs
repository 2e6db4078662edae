//! The fleet view of the operator console, against real tollgates, a real upstream and a real
//! Redis (and a real Redis Cluster): every instance publishes its figures to the store once a
//! second, and `/api/stats?scope=fleet` on any of them sums what they published.

mod common;
common::both_http1_clients!();

use std::time::Duration;

use common::{eventually, get, Proxy, Redis, Upstream, Yaml};
use serde_json::Value;

/// How long an answer may take to show what was published: a publication a second, and a busy
/// machine.
const WITHIN: Duration = Duration::from_secs(20);

/// `GET /api/<call>` on `proxy`'s admin listener: its status and JSON body.
async fn api(proxy: &Proxy, call: &str) -> (u16, Value) {
    let url = format!(
        "http://{}/api/{call}",
        proxy.admin.expect("an admin listener")
    );
    let answer = get(&url, &[]).await;
    let body = serde_json::from_str(&answer.body)
        .unwrap_or_else(|e| panic!("{call}: {e}: {}", answer.body));
    (answer.status, body)
}

async fn fleet(proxy: &Proxy) -> Value {
    let (status, body) = api(proxy, "stats?scope=fleet").await;
    assert_eq!(status, 200, "{body:#}");
    body
}

/// The ids the fleet answer lists.
fn ids(fleet: &Value) -> Vec<String> {
    let list = fleet["instances"].as_array().expect("instances");
    list.iter()
        .map(|i| i["id"].as_str().expect("an id").to_owned())
        .collect()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("a number: {v}"))
}

/// A config with an admin listener, a limit on route `api`, and `store`.
fn yaml(upstream: &Upstream, store: &str) -> String {
    Yaml::to(&[upstream.url()])
        .top("admin: {listen: 127.0.0.1:0}")
        .top(store)
        .route(
            "api",
            "/",
            "limits: [{name: wide, algorithm: fixed_window, key: ip, limit: 100000, window: 1h}]",
        )
        .build()
}

/// Requests to `proxy` every 20 ms, `n` of them.
async fn traffic(proxy: &Proxy, n: usize) {
    for _ in 0..n {
        assert_eq!(get(&proxy.url("/"), &[]).await.status, 200);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two instances on one store, traffic to both: the fleet answer of either lists both, with
/// their ids, addresses and rates, and its routes and limits are their sums.
async fn two_instances_are_summed(store: &str) {
    let upstream = Upstream::start().await;
    let yaml = yaml(&upstream, store);
    let (a, b) = (Proxy::start(&yaml).await, Proxy::start(&yaml).await);
    let (_, own_a) = api(&a, "stats").await;
    let (_, own_b) = api(&b, "stats").await;
    assert_eq!(own_a["scope"], "this instance");
    let (id_a, id_b) = (
        own_a["instance"]["id"].clone(),
        own_b["instance"]["id"].clone(),
    );
    assert_ne!(id_a, id_b);
    assert_eq!(own_a["instance"]["address"], a.addr.to_string());
    tokio::join!(traffic(&a, 10), traffic(&b, 10));
    let deadline = std::time::Instant::now() + WITHIN;
    let answer = loop {
        // either instance answers for the fleet
        let both = [fleet(&a).await, fleet(&b).await];
        let done = both.iter().all(|answer| {
            let list = answer["instances"].as_array().unwrap();
            list.len() == 2 && list.iter().all(|i| f(&i["rps"]) > 0.0)
        });
        if done {
            break both[1].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "both not seen: {:#}",
            both[0]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(answer["scope"], "fleet");
    let mut want = vec![
        id_a.as_str().unwrap().to_owned(),
        id_b.as_str().unwrap().to_owned(),
    ];
    want.sort();
    assert_eq!(ids(&answer), want);
    let list = answer["instances"].as_array().unwrap();
    let of_b = list.iter().find(|i| i["id"] == id_b).unwrap();
    assert_eq!(of_b["address"], b.addr.to_string());
    assert!(
        f(&of_b["last_seen"]) > 1.7e12,
        "ms since the epoch: {answer:#}"
    );
    // the sums: the route's and the limit's rates are the instances' added
    let summed: f64 = list.iter().map(|i| f(&i["rps"])).sum();
    let route = f(&answer["routes"][0]["rps"]);
    assert!(
        (route - summed).abs() < 0.01,
        "{route} != {summed}: {answer:#}"
    );
    let allowed = f(&answer["limits"][0]["per_second"]["allowed"]);
    assert!(
        (allowed - summed).abs() < 0.01,
        "{allowed} != {summed}: {answer:#}"
    );
    let forwarded = f(&answer["upstreams"][0]["forwarded_per_second"]);
    assert!((forwarded - summed).abs() < 0.01, "{forwarded}: {answer:#}");
    // and more than either instance alone
    assert!(list.iter().all(|i| f(&i["rps"]) < route), "{answer:#}");
    assert!(answer.get("note").is_none(), "{answer:#}");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_are_summed() {
    let redis = Redis::start();
    let store = format!(
        "store: {{backend: redis, url: \"{}\", timeout: 500ms}}",
        redis.url()
    );
    two_instances_are_summed(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_a_redis_cluster_are_summed() {
    let cluster = common::Cluster::start();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let store = format!(
        "store: {{backend: redis, cluster: [{}], timeout: 1s}}",
        nodes.join(", ")
    );
    two_instances_are_summed(&store).await;
}

/// An instance that stops drops out of the fleet within seconds; the other stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_instance_drops_out() {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let store = format!(
        "store: {{backend: redis, url: \"{}\", timeout: 500ms}}",
        redis.url()
    );
    let yaml = yaml(&upstream, &store);
    let (a, b) = (Proxy::start(&yaml).await, Proxy::start(&yaml).await);
    eventually(WITHIN, || async { ids(&fleet(&a).await).len() == 2 }).await;
    let (_, own_a) = api(&a, "stats").await;
    b.shutdown().await;
    eventually(WITHIN, || async { ids(&fleet(&a).await).len() == 1 }).await;
    assert_eq!(
        ids(&fleet(&a).await),
        [own_a["instance"]["id"].as_str().unwrap()]
    );
    a.shutdown().await;
}

/// A scope other than `instance` or `fleet` is refused with 400, saying which there are; no
/// scope, and `scope=instance`, answer this instance's figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_scope_is_refused() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&yaml(&upstream, "")).await;
    let (status, body) = api(&proxy, "stats?scope=world").await;
    assert_eq!(status, 400, "{body:#}");
    assert_eq!(body["error"], "bad_scope");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("\"world\"") && message.contains("scope=fleet"),
        "{message}"
    );
    for call in ["stats", "stats?scope=instance"] {
        let (status, body) = api(&proxy, call).await;
        assert_eq!((status, &body["scope"]), (200, &"this instance".into()));
    }
    proxy.shutdown().await;
}

/// On the memory store the fleet is this instance alone, and the answer says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_memory_store_the_fleet_is_this_instance() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&yaml(&upstream, "")).await;
    let (_, own) = api(&proxy, "stats").await;
    traffic(&proxy, 5).await;
    eventually(WITHIN, || async {
        let answer = fleet(&proxy).await;
        f(&answer["routes"][0]["rps"]) > 0.0
    })
    .await;
    let answer = fleet(&proxy).await;
    assert_eq!(ids(&answer), [own["instance"]["id"].as_str().unwrap()]);
    assert_eq!(answer["store"]["backend"], "memory");
    assert!(
        answer["note"]
            .as_str()
            .unwrap()
            .contains("this instance alone"),
        "{answer:#}"
    );
    proxy.shutdown().await;
}

/// With Redis gone the fleet answer says the store did not answer (503), while this
/// instance's figures are still there; with Redis back, the fleet is again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_store_down_the_fleet_answer_says_so() {
    let mut redis = Redis::start();
    let upstream = Upstream::start().await;
    let store = format!(
        "store: {{backend: redis, url: \"{}\", timeout: 300ms, on_error: allow}}",
        redis.url()
    );
    let proxy = Proxy::start(&yaml(&upstream, &store)).await;
    eventually(WITHIN, || async { ids(&fleet(&proxy).await).len() == 1 }).await;
    redis.kill();
    let (status, body) = api(&proxy, "stats?scope=fleet").await;
    assert_eq!(status, 503, "{body:#}");
    assert_eq!(body["error"], "store_unavailable");
    let (status, body) = api(&proxy, "stats").await;
    assert_eq!((status, &body["scope"]), (200, &"this instance".into()));
    redis.restart();
    eventually(WITHIN, || async {
        let (status, body) = api(&proxy, "stats?scope=fleet").await;
        status == 200 && body["instances"].as_array().unwrap().len() == 1
    })
    .await;
    proxy.shutdown().await;
}

//! The fleet view: every instance that shares the store publishes its figures once a second
//! ([`crate::store::Store::publish`]), and `/api/stats?scope=fleet` sums what the instances
//! published lately into one answer of the same shape as one instance's.
//!
//! Rates add up: requests, decisions, forwarded requests and store errors a second, and the
//! requests waiting. A quantile does not: the fleet's pacing delay and store call time are the
//! highest instance's. A hold, a schedule ahead and a pace rate (the fleet's already) are the
//! highest too; the breaker is `open` when any instance's is. The refused clients are merged by
//! client, their counts added. The window, the reload and the store's backend are the
//! answering instance's.

use std::collections::HashMap;
use std::net::SocketAddr;

use serde_json::{json, Map, Value};

use super::{round, SHOWN_CLIENTS};
use crate::store::FLEET_MAX_BYTES;

/// One tollgate process, as the fleet names it.
#[derive(Debug, Clone)]
pub struct Instance {
    /// host name, process id and a random suffix: `web-1-4242-9f3ac2d1`
    pub id: String,
    /// the first proxy listener as bound, an unspecified address named by the host name
    pub address: String,
}

impl Instance {
    /// This process, whose first proxy listener is `listener`.
    pub fn new(listener: Option<SocketAddr>) -> Instance {
        let host = host_name();
        let mut random = [0u8; 4];
        // (without the system's randomness, two instances of one process still differ by time)
        if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random).is_err() {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .subsec_nanos();
            random = nanos.to_be_bytes();
        }
        let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let address = match listener {
            Some(addr) if addr.ip().is_unspecified() => format!("{host}:{}", addr.port()),
            Some(addr) => addr.to_string(),
            None => String::new(),
        };
        Instance {
            id: format!("{host}-{}-{suffix}", std::process::id()),
            address,
        }
    }
}

/// The machine's name: the kernel's, else `$HOSTNAME`, else `localhost`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Where the fleet of the instances using `key_prefix` is kept: one hash tag, so its keys sit
/// on one node of a Cluster.
pub fn key(key_prefix: &str) -> String {
    format!("{{{key_prefix}:fleet}}")
}

/// One instance's figures as the fleet holds them.
#[derive(Debug)]
pub struct Member {
    pub id: String,
    /// when it last published, in ms since the epoch on the store's clock
    pub seen_ms: u64,
    /// its `/api/stats` answer
    pub figures: Value,
}

/// `figures` as published: JSON within [`FLEET_MAX_BYTES`], the refused clients left out when
/// they would pass it; `None` when it passes it even so.
pub fn blob(mut figures: Value) -> Option<Vec<u8>> {
    let text = serde_json::to_vec(&figures).ok()?;
    if text.len() <= FLEET_MAX_BYTES {
        return Some(text);
    }
    for limit in figures["limits"].as_array_mut().into_iter().flatten() {
        limit["top_refused"] = json!([]);
    }
    serde_json::to_vec(&figures)
        .ok()
        .filter(|text| text.len() <= FLEET_MAX_BYTES)
}

/// The requests a second of one instance: its routes' rates added up.
fn rps(figures: &Value) -> f64 {
    let routes = figures["routes"].as_array().map_or(&[][..], Vec::as_slice);
    round(routes.iter().filter_map(|r| r["rps"].as_f64()).sum())
}

/// The fleet's answer: `this`, the answering instance's figures, with every member's added.
/// `members` holds this instance too.
pub fn summed(this: &Value, members: &[Member]) -> Value {
    let mut answer = this.clone();
    let mut routes = Keyed::default();
    let mut limits = Keyed::default();
    let mut upstreams = Keyed::default();
    let mut store = json!({
        "backend": this["store"]["backend"],
        "breaker": this["store"]["breaker"],
        "call_ms": {"p50": null, "p99": null},
    });
    let mut errors: Map<String, Value> = Map::new();
    let mut started: Option<(std::time::SystemTime, Value)> = None;
    for m in members {
        let f = &m.figures;
        for r in f["routes"].as_array().into_iter().flatten() {
            routes.add(r["name"].to_string(), r, add_route);
        }
        for l in f["limits"].as_array().into_iter().flatten() {
            limits.add(format!("{}\n{}", l["route"], l["limit"]), l, add_limit);
        }
        for u in f["upstreams"].as_array().into_iter().flatten() {
            upstreams.add(u["name"].to_string(), u, add_upstream);
        }
        add_store(&mut store, &f["store"]);
        for (kind, n) in f["store"]["errors_per_second"]
            .as_object()
            .into_iter()
            .flatten()
        {
            sum(errors.entry(kind.clone()).or_insert(json!(0.0)), n);
        }
        let at = f["started"]
            .as_str()
            .and_then(|s| httpdate::parse_http_date(s).ok());
        if let Some(at) = at.filter(|at| started.as_ref().is_none_or(|(t, _)| at < t)) {
            started = Some((at, f["started"].clone()));
        }
    }
    for r in &mut routes.values {
        let all = r["rps"].as_f64().unwrap_or(0.0);
        let refused = r["status_rps"]["429"].as_f64().unwrap_or(0.0);
        r["share_429"] = json!(if all > 0.0 { round(refused / all) } else { 0.0 });
    }
    store["errors_per_second"] = Value::Object(errors);
    answer["scope"] = json!("fleet");
    answer["routes"] = Value::Array(routes.values);
    answer["limits"] = Value::Array(limits.values);
    answer["upstreams"] = Value::Array(upstreams.values);
    answer["store"] = store;
    if let Some((_, text)) = started {
        answer["started"] = text;
    }
    let mut instances: Vec<Value> = members
        .iter()
        .map(|m| {
            json!({
                "id": m.id,
                "address": m.figures["instance"]["address"],
                "last_seen": m.seen_ms,
                "rps": rps(&m.figures),
            })
        })
        .collect();
    instances.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    answer["instances"] = Value::Array(instances);
    answer
}

/// Values by key, in the order first seen.
#[derive(Default)]
struct Keyed {
    at: HashMap<String, usize>,
    values: Vec<Value>,
}

impl Keyed {
    /// The first value of `key` kept as it is; each later one added to it by `add`.
    fn add(&mut self, key: String, value: &Value, add: fn(&mut Value, &Value)) {
        match self.at.get(&key) {
            Some(&i) => add(&mut self.values[i], value),
            None => {
                self.at.insert(key, self.values.len());
                self.values.push(value.clone());
            }
        }
    }
}

/// `acc += v`, when `v` is a number (`null` + `null` stays `null`).
fn sum(acc: &mut Value, v: &Value) {
    if let Some(x) = v.as_f64() {
        *acc = json!(round(acc.as_f64().unwrap_or(0.0) + x));
    }
}

/// `acc = max(acc, v)`, when `v` is a number.
fn max(acc: &mut Value, v: &Value) {
    if let Some(x) = v.as_f64() {
        if acc.as_f64().is_none_or(|a| x > a) {
            *acc = v.clone();
        }
    }
}

/// Every field of the object `v` added to `acc`'s, by `how`.
fn each(acc: &mut Value, v: &Value, how: fn(&mut Value, &Value)) {
    for (k, x) in v.as_object().into_iter().flatten() {
        if let Some(obj) = acc.as_object_mut() {
            how(obj.entry(k.clone()).or_insert(Value::Null), x);
        }
    }
}

fn add_route(acc: &mut Value, r: &Value) {
    sum(&mut acc["rps"], &r["rps"]);
    each(&mut acc["status_rps"], &r["status_rps"], sum);
}

fn add_limit(acc: &mut Value, l: &Value) {
    each(&mut acc["per_second"], &l["per_second"], sum);
    let mut clients: Vec<Value> = acc["top_refused"].as_array().cloned().unwrap_or_default();
    for t in l["top_refused"].as_array().into_iter().flatten() {
        match clients.iter_mut().find(|c| c["client"] == t["client"]) {
            Some(c) => {
                sum(&mut c["refused"], &t["refused"]);
                sum(&mut c["error"], &t["error"]);
            }
            None => clients.push(t.clone()),
        }
    }
    let count = |c: &Value| c["refused"].as_f64().unwrap_or(0.0);
    clients.sort_by(|a, b| count(b).total_cmp(&count(a)));
    clients.truncate(SHOWN_CLIENTS);
    acc["top_refused"] = Value::Array(clients);
}

fn add_upstream(acc: &mut Value, u: &Value) {
    sum(&mut acc["forwarded_per_second"], &u["forwarded_per_second"]);
    sum(&mut acc["waiting"], &u["waiting"]);
    for flag in ["paced", "adaptive"] {
        if u[flag] == json!(true) {
            acc[flag] = json!(true);
        }
    }
    for highest in ["pace_rate", "hold_ms", "schedule_ahead_ms"] {
        max(&mut acc[highest], &u[highest]);
    }
    each(&mut acc["pacing_delay_ms"], &u["pacing_delay_ms"], max);
}

/// The breaker open when any is, the call times the highest; errors are added apart.
fn add_store(acc: &mut Value, s: &Value) {
    if s["breaker"] == json!("open") {
        acc["breaker"] = json!("open");
    }
    each(&mut acc["call_ms"], &s["call_ms"], max);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, figures: Value) -> Member {
        Member {
            id: id.into(),
            seen_ms: 1_700_000_000_000,
            figures,
        }
    }

    fn instance(rps: f64, refused: f64, greedy: u64, breaker: &str, started: &str) -> Value {
        json!({
            "scope": "this instance",
            "window_seconds": 10.0,
            "started": started,
            "instance": {"id": "x", "address": format!("h:{rps}")},
            "routes": [{"name": "api", "rps": rps, "share_429": 0.0,
                "status_rps": {"2xx": rps - refused, "3xx": 0.0, "4xx": 0.0, "429": refused,
                    "5xx": 0.0, "other": 0.0}}],
            "limits": [{"route": "api", "limit": "l", "algorithm": "token_bucket",
                "mode": "enforce",
                "per_second": {"allowed": rps - refused, "denied": refused,
                    "shadow_denied": 0.0, "delayed": 0.0},
                "top_refused": [{"client": "greedy", "refused": greedy, "error": 0},
                    {"client": format!("only-{rps}"), "refused": 1, "error": 0}]}],
            "upstreams": [{"name": "u", "forwarded_per_second": rps - refused, "paced": true,
                "pace_rate": 10.0, "adaptive": false,
                "pacing_delay_ms": {"p50": rps, "p99": null},
                "waiting": 1, "hold_ms": null, "schedule_ahead_ms": rps as u64}],
            "store": {"backend": "redis", "breaker": breaker,
                "call_ms": {"p50": 1.0, "p99": rps},
                "errors_per_second": {"timeout": 0.5}},
            "reload": null,
        })
    }

    /// Rates add up, share and quantiles do not; clients merge by name; the earliest start
    /// and every instance are told.
    #[test]
    fn sums_the_fleet() {
        let a = instance(4.0, 1.0, 3, "closed", "Tue, 01 Dec 2026 10:00:00 GMT");
        let b = instance(6.0, 3.0, 2, "open", "Mon, 30 Nov 2026 10:00:00 GMT");
        let members = [member("b-2", b), member("a-1", a.clone())];
        let fleet = summed(&a, &members);
        assert_eq!(fleet["scope"], "fleet");
        let route = &fleet["routes"][0];
        assert_eq!(route["rps"], 10.0);
        assert_eq!(route["status_rps"]["429"], 4.0);
        assert_eq!(route["status_rps"]["2xx"], 6.0);
        assert_eq!(route["share_429"], 0.4);
        let limit = &fleet["limits"][0];
        assert_eq!(limit["per_second"]["denied"], 4.0);
        assert_eq!(limit["top_refused"][0]["client"], "greedy");
        assert_eq!(limit["top_refused"][0]["refused"], 5.0);
        assert_eq!(limit["top_refused"].as_array().unwrap().len(), 3);
        let up = &fleet["upstreams"][0];
        assert_eq!(up["forwarded_per_second"], 6.0);
        assert_eq!(up["waiting"], 2.0);
        assert_eq!(up["pace_rate"], 10.0, "the fleet's rate, not added");
        assert_eq!(up["pacing_delay_ms"]["p50"], 6.0, "the highest");
        assert_eq!(up["pacing_delay_ms"]["p99"], Value::Null);
        assert_eq!(up["hold_ms"], Value::Null);
        assert_eq!(up["schedule_ahead_ms"], 6);
        assert_eq!(fleet["store"]["breaker"], "open");
        assert_eq!(fleet["store"]["call_ms"]["p99"], 6.0);
        assert_eq!(fleet["store"]["errors_per_second"]["timeout"], 1.0);
        assert_eq!(fleet["started"], "Mon, 30 Nov 2026 10:00:00 GMT");
        let ids: Vec<&str> = fleet["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["a-1", "b-2"], "by id");
        assert_eq!(fleet["instances"][0]["rps"], 4.0);
        assert_eq!(fleet["instances"][0]["address"], "h:4");
        assert_eq!(fleet["instances"][0]["last_seen"], 1_700_000_000_000u64);
    }

    /// A route, limit or upstream only some instances have (their configs differ) is listed
    /// with what they count; a fleet of one is that instance with its list.
    #[test]
    fn routes_of_some_instances_and_a_fleet_of_one() {
        let a = instance(4.0, 1.0, 3, "closed", "Tue, 01 Dec 2026 10:00:00 GMT");
        let mut b = instance(6.0, 3.0, 2, "closed", "Tue, 01 Dec 2026 10:00:00 GMT");
        b["routes"][0]["name"] = json!("other");
        let fleet = summed(&a, &[member("a", a.clone()), member("b", b)]);
        let names: Vec<&Value> = fleet["routes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| &r["name"])
            .collect();
        assert_eq!(names, [&json!("api"), &json!("other")]);
        assert_eq!(fleet["routes"][0]["rps"], 4.0);
        assert_eq!(fleet["routes"][0]["share_429"], 0.25);
        let alone = summed(&a, &[member("a", a.clone())]);
        assert_eq!(alone["routes"][0]["rps"], 4.0);
        assert_eq!(alone["limits"], a["limits"]);
        assert_eq!(alone["upstreams"], a["upstreams"]);
        assert_eq!(alone["instances"].as_array().unwrap().len(), 1);
        assert_eq!(alone["store"]["errors_per_second"]["timeout"], 0.5);
        assert_eq!(alone["store"]["call_ms"], a["store"]["call_ms"]);
    }

    /// Figures over the bound are published without their refused clients, and not at all
    /// when they pass it even so.
    #[test]
    fn blobs_keep_within_the_bound() {
        let small = instance(1.0, 0.0, 1, "closed", "");
        assert_eq!(
            blob(small.clone()).unwrap(),
            serde_json::to_vec(&small).unwrap()
        );
        let mut many = small.clone();
        let clients: Vec<Value> = (0..10)
            .map(|i| json!({"client": format!("{i}{}", "x".repeat(FLEET_MAX_BYTES / 8)), "refused": 1}))
            .collect();
        many["limits"][0]["top_refused"] = Value::Array(clients);
        let trimmed: Value = serde_json::from_slice(&blob(many).unwrap()).unwrap();
        assert_eq!(trimmed["limits"][0]["top_refused"], json!([]));
        assert_eq!(trimmed["routes"], small["routes"]);
        let mut huge = small;
        huge["routes"][0]["name"] = json!("r".repeat(FLEET_MAX_BYTES));
        assert!(blob(huge).is_none());
    }

    #[test]
    fn fleet_keys_share_a_hash_tag() {
        assert_eq!(key("tollgate"), "{tollgate:fleet}");
        let one = Instance::new(Some("0.0.0.0:8080".parse().unwrap()));
        let two = Instance::new(Some("127.0.0.1:8080".parse().unwrap()));
        assert_ne!(one.id, two.id, "a random suffix");
        assert!(one.address.ends_with(":8080") && !one.address.starts_with("0.0.0.0"));
        assert_eq!(two.address, "127.0.0.1:8080");
    }
}

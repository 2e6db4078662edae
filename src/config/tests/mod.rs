//! Tests of the config layer: the shipped example, defaults, formats, and every kind of
//! problem with its exact `file:line:column: path: message` text.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

use super::{parse, Backend, ConfigError, HeaderStyle, Loaded, Mode, OnError};
use crate::identity::KeyPart;
use crate::limit::{Algorithm, Bucket, Pace, Rate, Window};
use crate::routing::{HostPattern, PathMatch};

mod adaptive;
mod admin_and_identity;
mod concurrency;
mod defaults;
mod env;
mod errors;
mod formats;
mod keys_case;
mod store;
mod warnings;

/// The documented example `proxy.yaml`, which sets every key (see docs/configuration.md).
const DOCUMENTED_EXAMPLE: &str = include_str!("documented_example.yaml");

/// The smallest useful file: one listener, one upstream, one route; tests add to it.
const MINIMAL: &str = "\
listen: 0.0.0.0:8080
upstreams:
  api:
    targets: [http://127.0.0.1:8000]
routes:
  - name: all
    upstream: api
";

/// [`MINIMAL`] with its `routes` section replaced by `routes` (which starts with `routes:`).
fn with_routes(routes: &str) -> String {
    MINIMAL
        .split("routes:")
        .next()
        .expect("has routes")
        .to_owned()
        + routes
}

/// An environment with nothing set.
fn no_env(_: &str) -> Option<String> {
    None
}

/// Parses `text` as `proxy.yaml` with an empty environment; panics with the problems if invalid.
fn ok(text: &str) -> Loaded {
    match parse(text, "proxy.yaml", &no_env) {
        Ok(loaded) => loaded,
        Err(e) => panic!("expected a valid config, got:\n{e}"),
    }
}

/// The problems of an invalid `text`, each as displayed.
fn problems(text: &str) -> Vec<String> {
    match parse(text, "proxy.yaml", &no_env) {
        Ok(loaded) => panic!("expected problems, got a valid config: {:?}", loaded.config),
        Err(ConfigError::Invalid(problems)) => problems.iter().map(ToString::to_string).collect(),
        Err(e) => panic!("expected ConfigError::Invalid, got {e:?}"),
    }
}

/// The warnings of a valid `text`, each as displayed.
fn warnings(text: &str) -> Vec<String> {
    ok(text).warnings.iter().map(ToString::to_string).collect()
}

fn rate(per_sec: f64) -> Rate {
    Rate::per_second(per_sec).expect("test rates are positive")
}

fn bucket(per_sec: f64, burst: u32, cost: u32) -> Algorithm {
    Algorithm::TokenBucket(
        Bucket::new(
            rate(per_sec),
            NonZeroU32::new(burst).expect("non-zero burst"),
            NonZeroU32::new(cost).expect("non-zero cost"),
        )
        .expect("cost within burst"),
    )
}

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("test addresses are valid")
}

/// Every top-level section of the documented example reads as the comments in it say.
#[test]
fn documented_example_parses_with_every_documented_value() {
    let loaded = ok(DOCUMENTED_EXAMPLE);
    let c = &loaded.config;
    assert_eq!(c.listen, vec![addr("0.0.0.0:8080")]);
    assert_eq!(c.workers.map(|w| w.get()), Some(2));
    let tls = c.tls.as_ref().expect("tls is configured");
    assert_eq!(tls.cert.to_str(), Some("/etc/tollgate/cert.pem"));
    assert_eq!(tls.key.to_str(), Some("/etc/tollgate/key.pem"));
    assert_eq!(
        c.admin.as_ref().map(|a| a.listen),
        Some(addr("127.0.0.1:9901"))
    );
    let url = "redis://127.0.0.1:6379/0".to_owned();
    assert_eq!(c.store.backend, Backend::Redis { url });
    assert_eq!(c.store.key_prefix, "tollgate");
    assert_eq!(c.store.timeout, Duration::from_millis(50));
    assert_eq!(c.store.on_error, OnError::Local);
    assert_eq!(c.store.instances.get(), 3);
    assert_eq!(c.store.max_keys.get(), 1_000_000);
    assert_eq!(c.trusted_proxies, vec!["10.0.0.0/8".parse().expect("cidr")]);
    assert_eq!(c.rate_limit_headers, HeaderStyle::Ietf);
    assert_eq!(c.timeouts.client_header, Duration::from_secs(10));
    assert_eq!(c.timeouts.upstream_connect, Duration::from_secs(2));
    assert_eq!(c.timeouts.upstream_response, Duration::from_secs(30));
    assert_eq!(c.timeouts.idle, Duration::from_secs(60));
    assert_eq!(c.timeouts.shutdown, Duration::from_secs(30));
    assert_eq!(c.max_body_size, Some(10 * 1024 * 1024));
    // (the example's override names an API key under `key: ip`: no request has that key)
    let warned: Vec<String> = loaded.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(
        warned,
        [
            r#"proxy.yaml:56:32: routes[0].limits[0].overrides.gold-customer-key: matches no request: "gold-customer-key" is not an IP address (key part ip)"#
        ]
    );
}

/// The example's upstream: targets in order, preserve_host, and the pace.
#[test]
fn documented_example_upstream_has_targets_and_pace() {
    let c = ok(DOCUMENTED_EXAMPLE).config;
    assert_eq!(c.upstreams.len(), 1);
    let api = &c.upstreams[0];
    assert_eq!(api.name, "api");
    let targets: Vec<String> = api.targets.iter().map(ToString::to_string).collect();
    assert_eq!(
        targets,
        ["http://127.0.0.1:8000/", "http://127.0.0.1:8001/"]
    );
    assert!(api.preserve_host);
    let pace = Pace::new(rate(100.0), Some(Duration::from_secs(2))).expect("valid pace");
    assert_eq!(api.pace, Some(pace));
    assert_eq!(api.max_waiting.map(|n| n.get()), Some(10_000));
}

/// The example's route: match, upstream, and both limits with their parameters.
#[test]
fn documented_example_route_has_match_and_limits() {
    let c = ok(DOCUMENTED_EXAMPLE).config;
    assert_eq!(c.routes.len(), 1);
    let r = &c.routes[0];
    assert_eq!(r.name, "api-v1");
    let host = Some(HostPattern::Exact("api.example.com".into()));
    assert_eq!(r.matcher.host, host);
    assert_eq!(r.matcher.path, PathMatch::Prefix("/v1".into()));
    assert_eq!(r.matcher.methods, [http::Method::GET, http::Method::POST]);
    let header = (
        http::HeaderName::from_static("x-tenant"),
        http::HeaderValue::from_static("gold"),
    );
    assert_eq!(r.matcher.headers, [header]);
    assert!(!r.strip_prefix);
    assert_eq!(r.upstream, "api");

    let per_client = &r.limits[0];
    assert_eq!(per_client.name, "per-client");
    assert_eq!(per_client.algorithm, bucket(10.0, 20, 1));
    assert_eq!(per_client.key, [KeyPart::Ip]);
    assert_eq!(per_client.mode, Mode::Enforce);
    assert_eq!(per_client.exempt, ["10.1.0.0/16".parse().expect("cidr")]);
    let gold = ("gold-customer-key".to_owned(), bucket(100.0, 200, 1));
    assert_eq!(per_client.overrides, [gold]);

    let hourly = &r.limits[1];
    assert_eq!(hourly.name, "per-key-hourly");
    let window = Window::new(
        NonZeroU64::new(1000).expect("non-zero"),
        Duration::from_secs(3600),
    );
    assert_eq!(hourly.algorithm, Algorithm::SlidingWindow(window));
    let header = KeyPart::Header(http::HeaderName::from_static("x-api-key"));
    assert_eq!(hourly.key, [header]);
}

/// `${REDIS_URL:-...}` in the example takes the environment's value when it is set.
#[test]
fn documented_example_takes_redis_url_from_the_environment() {
    let env = |name: &str| (name == "REDIS_URL").then(|| "rediss://cache:6380/2".to_owned());
    let loaded = parse(DOCUMENTED_EXAMPLE, "proxy.yaml", &env).expect("valid");
    let url = "rediss://cache:6380/2".to_owned();
    assert_eq!(loaded.config.store.backend, Backend::Redis { url });
}

/// The `tollgate check` summary of the example names listeners, store, upstreams and routes.
#[test]
fn documented_example_summary_lists_everything_check_promises() {
    let summary = ok(DOCUMENTED_EXAMPLE).config.summary();
    let expected = "\
listen: 0.0.0.0:8080 (tls)
admin: 127.0.0.1:9901
store: redis redis://127.0.0.1:6379/0, key_prefix tollgate, timeout 50ms, on_error local, instances 3, max_keys 1000000
max_body_size: 10MiB
upstreams (1):
  api: http://127.0.0.1:8000, http://127.0.0.1:8001; pace 100/s max_delay 2s max_waiting 10000
routes (1):
  api-v1: host api.example.com, path_prefix /v1, methods GET POST, header x-tenant=gold -> api
    per-client: token_bucket 10/s burst 20 cost 1, key ip, exempt 10.1.0.0/16, 1 override
    per-key-hourly: sliding_window 1000 per 1h, key header:x-api-key";
    assert_eq!(summary, expected);
}

/// A Redis password never reaches the summary or the `/config` JSON.
#[test]
fn summary_and_json_redact_redis_passwords() {
    let text = MINIMAL.replace(
        "listen: 0.0.0.0:8080\n",
        "listen: 0.0.0.0:8080\nstore: {url: \"redis://app:s3cret@cache:6379\"}\n",
    );
    let config = ok(&text).config;
    let summary = config.summary();
    assert!(summary.contains("redis://app:***@cache:6379"), "{summary}");
    let json = config.to_json().to_string();
    assert!(json.contains("redis://app:***@cache:6379"), "{json}");
    assert!(!summary.contains("s3cret") && !json.contains("s3cret"));
    // a unix socket's URL carries it as a query parameter
    let text = MINIMAL.replace(
        "listen: 0.0.0.0:8080\n",
        "listen: 0.0.0.0:8080\nstore: {url: \"redis+unix:///run/redis.sock?db=2&pass=s3cret\"}\n",
    );
    let config = ok(&text).config;
    let (summary, json) = (config.summary(), config.to_json().to_string());
    assert!(
        summary.contains("redis+unix:///run/redis.sock?db=2&pass=***"),
        "{summary}"
    );
    assert!(
        !summary.contains("s3cret") && !json.contains("s3cret"),
        "{json}"
    );
    // a password with `?` and `/` in it (a generated secret) is hidden whole, also in the
    // message about a URL that does not parse
    for url in ["redis://:pa?ss@h:6379/0", "redis://u:p/a?s=s@h:6379/0"] {
        let redacted = super::backend::redact_url(url);
        assert!(redacted.ends_with("***@h:6379/0"), "{url} -> {redacted}");
        assert!(
            !redacted.contains("pa?ss") && !redacted.contains("p/a"),
            "{redacted}"
        );
    }
}

/// The JSON for `/config` has the effective values, defaults included.
#[test]
fn json_shows_effective_values() {
    let json = ok(DOCUMENTED_EXAMPLE).config.to_json();
    assert_eq!(json["listen"][0], "0.0.0.0:8080");
    assert_eq!(json["store"]["backend"], "redis");
    assert_eq!(json["timeouts"]["idle"], "1m");
    assert_eq!(json["upstreams"][0]["pace"]["rate"], "100/s");
    // routes and limits with proxy.yaml's own keys
    let route = &json["routes"][0];
    assert_eq!(route["match"]["host"], "api.example.com");
    assert_eq!(route["match"]["path_prefix"], "/v1");
    assert_eq!(
        route["match"]["methods"],
        serde_json::json!(["GET", "POST"])
    );
    assert_eq!(route["match"]["headers"]["x-tenant"], "gold");
    let limit = &route["limits"][0];
    assert_eq!(limit["algorithm"], "token_bucket");
    assert_eq!(limit["rate"], "10/s");
    assert_eq!(limit["burst"], 20);
    assert_eq!(limit["cost"], 1);
    assert_eq!(limit["key"], "ip");
    assert_eq!(limit["overrides"], 1);
    let limit = &route["limits"][1];
    assert_eq!(limit["algorithm"], "sliding_window");
    assert_eq!(limit["limit"], 1000);
    assert_eq!(limit["window"], "1h");
    assert_eq!(limit["key"], "header:x-api-key");
}

/// `load` reads a file and names it in problems; a missing file is a read error.
#[test]
fn load_reads_the_file_and_names_it_in_problems() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("proxy.yaml");
    std::fs::write(&path, "listen: 0.0.0.0:8080\nworkrs: 2\n").expect("write");
    let Err(ConfigError::Invalid(problems)) = super::load(&path) else {
        panic!("expected problems");
    };
    let expected = format!(
        "{}:2:1: workrs: unknown key \"workrs\" (did you mean \"workers\"?)",
        path.display()
    );
    assert_eq!(
        problems.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [expected]
    );

    let missing = dir.path().join("nope.yaml");
    let err = super::load(&missing).expect_err("missing file");
    assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "cannot read {}: No such file or directory (os error 2)",
            missing.display()
        )
    );
    // a directory: the system's reason, not only "cannot read"
    let err = super::load(dir.path()).expect_err("a directory");
    assert!(err.to_string().contains("directory"), "{err}");
}

/// `load` reads the files an upstream's `tls` names: a missing one is an error at its key, and
/// so is a key that does not go with its certificate.
#[test]
fn load_reads_upstream_tls_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("proxy.yaml");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not pem\n").expect("write");
    let missing = dir.path().join("nope.pem");
    let text = MINIMAL.replace(
        "    targets: [http://127.0.0.1:8000]\n",
        &format!(
            "    targets: [https://10.0.0.1]\n    tls:\n      ca: {}\n      cert: {}\n      key: {}\n",
            missing.display(),
            missing.display(),
            junk.display()
        ),
    );
    std::fs::write(&path, text).expect("write");
    let Err(ConfigError::Invalid(problems)) = super::load(&path) else {
        panic!("expected problems");
    };
    let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
    let at =
        |place: &str, key: &str| format!("{}:{place}: upstreams.api.tls.{key}: ", path.display());
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].starts_with(&at("6:11", "ca")), "{problems:#?}");
    assert!(
        problems[0].contains("cannot read root certificate"),
        "{problems:#?}"
    );
    assert!(
        problems[1].starts_with(&at("7:13", "cert")),
        "{problems:#?}"
    );
    // with the certificate there, the junk key is what is wrong
    let cert = dir.path().join("cert.pem");
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["tollgate".to_owned()]).unwrap();
    std::fs::write(&cert, params.self_signed(&key).unwrap().pem()).expect("write");
    let text = std::fs::read_to_string(&path).unwrap();
    let (ca_line, cert_line) = (
        format!("ca: {}", missing.display()),
        format!("cert: {}", missing.display()),
    );
    let text = text.replace(&cert_line, &format!("cert: {}", cert.display()));
    assert!(text.contains(&ca_line));
    std::fs::write(&path, text).expect("write");
    let Err(ConfigError::Invalid(problems)) = super::load(&path) else {
        panic!("expected problems");
    };
    let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].starts_with(&at("6:11", "ca")), "{problems:#?}");
    assert!(problems[1].starts_with(&at("8:12", "key")), "{problems:#?}");
    assert!(
        problems[1].contains("no private key found"),
        "{problems:#?}"
    );
}

/// A charged limit keeps its header, its token bucket (and each override's) keeps its debt,
/// and `check` and `/config` show it.
#[test]
fn a_charged_limit_keeps_its_debt_and_shows_its_header() {
    let text = format!(
        "{MINIMAL}    limits:\n      - name: tokens\n        algorithm: token_bucket\n        key: header:x-api-key\n        rate: 1000/s\n        burst: 60000\n        overrides: {{gold: {{rate: 2000/s}}}}\n        charge: {{response_header: X-Tokens-Used}}\n"
    );
    let loaded = ok(&text);
    let limit = &loaded.config.routes[0].limits[0];
    assert_eq!(
        limit.charge.as_ref().map(|c| c.response_header.as_str()),
        Some("x-tokens-used")
    );
    for alg in std::iter::once(&limit.algorithm).chain(limit.overrides.iter().map(|(_, a)| a)) {
        assert!(
            matches!(alg, Algorithm::TokenBucket(b) if b.debt),
            "{alg:?}"
        );
    }
    let summary = loaded.config.summary();
    assert!(summary.contains("charge x-tokens-used"), "{summary}");
    let json = loaded.config.to_json();
    assert_eq!(
        json["routes"][0]["limits"][0]["charge"]["response_header"],
        "x-tokens-used"
    );
    // without `missing`, a response that reports nothing charges the cost (nothing more)
    assert_eq!(limit.charge.as_ref().and_then(|c| c.missing), None);
    assert_eq!(
        json["routes"][0]["limits"][0]["charge"]["missing"],
        serde_json::Value::Null
    );
}

/// `charge.missing` is kept, and `check` and `/config` show it beside the header.
#[test]
fn a_charged_limit_shows_its_missing_cost() {
    let text = format!(
        "{MINIMAL}    limits:\n      - name: tokens\n        algorithm: token_bucket\n        rate: 1000/s\n        burst: 60000\n        charge: {{response_header: x-tokens-used, missing: 4000}}\n"
    );
    let loaded = ok(&text);
    let limit = &loaded.config.routes[0].limits[0];
    assert_eq!(
        limit
            .charge
            .as_ref()
            .and_then(|c| c.missing)
            .map(|n| n.get()),
        Some(4000)
    );
    let summary = loaded.config.summary();
    assert!(
        summary.contains("charge x-tokens-used missing 4000"),
        "{summary}"
    );
    let json = loaded.config.to_json();
    assert_eq!(json["routes"][0]["limits"][0]["charge"]["missing"], 4000);
}

//! Every documented default (docs/configuration.md), and the forms a value may take.

use super::*;
use crate::config::{StoreConfig, Timeouts};

/// A file with nothing but `listen` gets every documented default.
#[test]
fn a_file_with_only_listen_gets_every_default() {
    let c = ok("listen: 0.0.0.0:8080\n").config;
    assert_eq!(c.workers, None);
    assert_eq!(c.tls, None);
    assert_eq!(c.admin, None);
    assert_eq!(c.store.backend, Backend::Memory);
    assert_eq!(c.store.key_prefix, "tollgate");
    assert_eq!(c.store.timeout, Duration::from_millis(50));
    assert_eq!(c.store.on_error, OnError::Local);
    assert_eq!(c.store.instances.get(), 1);
    assert_eq!(c.store.max_keys.get(), 1_000_000);
    assert!(c.store.leases);
    assert_eq!(c.store, StoreConfig::default());
    assert!(c.trusted_proxies.is_empty());
    assert_eq!(c.rate_limit_headers, HeaderStyle::Ietf);
    assert_eq!(c.timeouts, Timeouts::default());
    assert_eq!(c.timeouts.client_header, Duration::from_secs(10));
    assert_eq!(c.timeouts.upstream_connect, Duration::from_secs(2));
    assert_eq!(c.timeouts.upstream_response, Duration::from_secs(30));
    assert_eq!(c.timeouts.idle, Duration::from_secs(60));
    assert_eq!(c.timeouts.send, Duration::from_secs(60));
    assert_eq!(c.timeouts.linger, Duration::from_secs(2));
    assert_eq!(c.timeouts.shutdown, Duration::from_secs(30));
    assert_eq!(c.max_body_size, None);
    assert_eq!(c.access_log, crate::config::AccessLog::default());
    assert!(c.upstreams.is_empty() && c.routes.is_empty());
}

/// A partly written `timeouts` keeps the defaults of the keys it leaves out; `linger` and
/// `shutdown` may be zero.
#[test]
fn timeouts_not_written_keep_their_defaults() {
    let text = "listen: 0.0.0.0:8080\ntimeouts: {idle: 5m, send: 15s, linger: 0s, shutdown: 0s}\n";
    let c = ok(text).config;
    assert_eq!(c.timeouts.idle, Duration::from_secs(300));
    assert_eq!(c.timeouts.send, Duration::from_secs(15));
    assert_eq!(c.timeouts.linger, Duration::ZERO);
    assert_eq!(c.timeouts.shutdown, Duration::ZERO);
    assert_eq!(c.timeouts.upstream_connect, Duration::from_secs(2));
}

/// A `store` with only `url` is Redis; its other keys keep their defaults.
#[test]
fn store_with_a_url_and_no_backend_is_redis() {
    let text = "listen: 0.0.0.0:8080\nstore:\n  url: redis+unix:///run/redis.sock\n";
    let store = ok(text).config.store;
    let url = "redis+unix:///run/redis.sock".to_owned();
    assert_eq!(store.backend, Backend::Redis { url });
    assert_eq!(store.key_prefix, "tollgate");
    assert_eq!(store.on_error, OnError::Local);
}

/// `cluster` gives the cluster backend with every node URL in order.
#[test]
fn store_cluster_lists_its_nodes() {
    let text = "listen: 0.0.0.0:8080\nstore:\n  backend: redis\n  cluster: [rediss://a:7000, rediss://b:7001]\n  on_error: deny\n";
    let store = ok(text).config.store;
    let urls = vec!["rediss://a:7000".to_owned(), "rediss://b:7001".to_owned()];
    assert_eq!(store.backend, Backend::Cluster { urls });
    assert_eq!(store.on_error, OnError::Deny);
}

/// `listen` takes one address or a list.
#[test]
fn listen_takes_one_address_or_a_list() {
    let one = ok("listen: 127.0.0.1:80\n").config.listen;
    assert_eq!(one, [addr("127.0.0.1:80")]);
    let many = ok("listen: [\"127.0.0.1:80\", \"[::1]:8443\"]\n")
        .config
        .listen;
    assert_eq!(many, [addr("127.0.0.1:80"), addr("[::1]:8443")]);
}

/// Bare addresses in `trusted_proxies` and `exempt` are single-host networks.
#[test]
fn bare_addresses_become_host_networks() {
    let text = "listen: 0.0.0.0:1\ntrusted_proxies: [192.0.2.7, \"2001:db8::1\", 10.1.2.3/8]\n";
    let nets: Vec<String> = ok(text)
        .config
        .trusted_proxies
        .iter()
        .map(ToString::to_string)
        .collect();
    // A network written with host bits set is kept as its network.
    assert_eq!(nets, ["192.0.2.7/32", "2001:db8::1/128", "10.0.0.0/8"]);
}

/// An upstream without `preserve_host` or `pace` preserves the host and is not paced.
#[test]
fn upstream_defaults_preserve_host_and_no_pace() {
    let api = &ok(MINIMAL).config.upstreams[0];
    assert!(api.preserve_host);
    assert_eq!(api.pace, None);
    assert_eq!(api.max_waiting, None);
}

/// Upstreams keep file order, whatever their names.
#[test]
fn upstreams_keep_file_order() {
    let text = "listen: 0.0.0.0:1\nupstreams:\n  zeta: {targets: http://z}\n  alpha: {targets: https://a:8443}\n";
    let loaded = ok(text);
    let names: Vec<&str> = loaded
        .config
        .upstreams
        .iter()
        .map(|u| u.name.as_str())
        .collect();
    assert_eq!(names, ["zeta", "alpha"]);
}

/// A route without `match` matches every request; without `limits` it has none.
#[test]
fn route_defaults_match_everything_without_limits() {
    let route = &ok(MINIMAL).config.routes[0];
    assert_eq!(route.matcher.host, None);
    assert_eq!(route.matcher.path, PathMatch::Any);
    assert!(route.matcher.methods.is_empty() && route.matcher.headers.is_empty());
    assert!(!route.strip_prefix);
    assert!(route.limits.is_empty());
}

fn with_limit(limit: &str) -> String {
    format!("{MINIMAL}    limits:\n      - {limit}\n")
}

/// A token bucket's burst defaults to the rate's count rounded up, at least 1; cost to 1;
/// key to ip; mode to enforce.
#[test]
fn token_bucket_defaults_burst_cost_key_and_mode() {
    for (rate_text, per_sec, burst) in [
        ("10/s", 10.0, 10),
        ("0.5/s", 0.5, 1),
        ("2.5/m", 2.5 / 60.0, 3),
    ] {
        let text = with_limit(&format!(
            "{{name: l, algorithm: token_bucket, rate: {rate_text}}}"
        ));
        let limit = ok(&text).config.routes[0].limits[0].clone();
        assert_eq!(limit.algorithm, bucket(per_sec, burst, 1), "{rate_text}");
        assert_eq!(limit.key, [KeyPart::Ip]);
        assert_eq!(limit.mode, Mode::Enforce);
        assert!(limit.exempt.is_empty() && limit.overrides.is_empty());
    }
}

/// A whole number may be written with an exponent or a zero fraction (`1e3`, `20.0`); a
/// fraction that is not zero is still refused.
#[test]
fn whole_numbers_may_be_written_as_decimals() {
    let text = with_limit("{name: l, algorithm: fixed_window, limit: 1e3, window: 1m}");
    let window = ok(&text).config.routes[0].limits[0].algorithm;
    let text = with_limit("{name: l, algorithm: fixed_window, limit: 1000.0, window: 1m}");
    assert_eq!(ok(&text).config.routes[0].limits[0].algorithm, window);
    let text = with_limit("{name: l, algorithm: fixed_window, limit: 1000, window: 1m}");
    assert_eq!(ok(&text).config.routes[0].limits[0].algorithm, window);
    let text = with_limit("{name: l, algorithm: fixed_window, limit: 10.5, window: 1m}");
    assert!(
        parse(&text, "proxy.yaml", &no_env).is_err(),
        "a fraction is not a whole number"
    );
}

/// A leaky bucket takes rate and an optional max_delay.
#[test]
fn leaky_bucket_takes_rate_and_optional_max_delay() {
    let text = with_limit("{name: l, algorithm: leaky_bucket, rate: 5/s, max_delay: 250ms}");
    let limit = &ok(&text).config.routes[0].limits[0];
    let pace = Pace::new(rate(5.0), Some(Duration::from_millis(250))).expect("valid");
    assert_eq!(limit.algorithm, Algorithm::LeakyBucket(pace));
    let text = with_limit("{name: l, algorithm: leaky_bucket, rate: 5/s}");
    let unbounded = Pace::new(rate(5.0), None).expect("valid");
    assert_eq!(
        ok(&text).config.routes[0].limits[0].algorithm,
        Algorithm::LeakyBucket(unbounded)
    );
}

/// The three window algorithms take limit and window.
#[test]
fn window_algorithms_take_limit_and_window() {
    let window = Window::new(
        NonZeroU64::new(7).expect("non-zero"),
        Duration::from_secs(90),
    );
    for (name, expected) in [
        ("fixed_window", Algorithm::FixedWindow(window)),
        ("sliding_window", Algorithm::SlidingWindow(window)),
        (
            "sliding_window_counter",
            Algorithm::SlidingWindowCounter(window),
        ),
    ] {
        let text = with_limit(&format!(
            "{{name: l, algorithm: {name}, limit: 7, window: 1m30s}}"
        ));
        assert_eq!(ok(&text).config.routes[0].limits[0].algorithm, expected);
    }
}

/// An override merges over the limit's own parameters: what it leaves out is inherited, and a
/// burst left out everywhere follows the override's rate.
#[test]
fn overrides_merge_over_the_limits_parameters() {
    let text = with_limit(
        "name: l\n        algorithm: token_bucket\n        rate: 10/s\n        cost: 2\n        overrides:\n          vip: {rate: 100/s}\n          \"12345\": {burst: 4}\n",
    );
    let limit = &ok(&text).config.routes[0].limits[0];
    assert_eq!(limit.algorithm, bucket(10.0, 10, 2));
    let expected = vec![
        ("vip".to_owned(), bucket(100.0, 100, 2)),
        ("12345".to_owned(), bucket(10.0, 4, 2)),
    ];
    assert_eq!(limit.overrides, expected);
}

/// `key` takes one part or a list; header names are lowercased.
#[test]
fn key_takes_one_part_or_a_list() {
    let text = with_limit(
        "{name: l, algorithm: fixed_window, limit: 1, window: 1s, mode: shadow, key: [route, \"header:X-Api-Key\", query:token, host, path, ip]}",
    );
    let limit = &ok(&text).config.routes[0].limits[0];
    let expected = [
        KeyPart::Route,
        KeyPart::Header(http::HeaderName::from_static("x-api-key")),
        KeyPart::Query("token".into()),
        KeyPart::Host,
        KeyPart::Path,
        KeyPart::Ip,
    ];
    assert_eq!(limit.key, expected);
    assert_eq!(limit.mode, Mode::Shadow);
}

/// Path prefixes lose a trailing `/` (but `/` stays); hosts are lowercased; `*.` is a suffix.
#[test]
fn match_normalises_prefix_and_host() {
    let text = MINIMAL.replace(
        "    upstream: api\n",
        "    upstream: api\n    strip_prefix: true\n    match: {host: \"*.Example.COM\", path_prefix: /v1/, methods: [get, PATCH]}\n  - name: root\n    upstream: api\n    match: {host: API.example.com, path_prefix: /}\n  - name: exact\n    upstream: api\n    match: {path: /health/}\n",
    );
    let routes = ok(&text).config.routes;
    assert_eq!(
        routes[0].matcher.host,
        Some(HostPattern::Suffix(".example.com".into()))
    );
    assert_eq!(routes[0].matcher.path, PathMatch::Prefix("/v1".into()));
    assert_eq!(
        routes[0].matcher.methods,
        [http::Method::GET, http::Method::PATCH]
    );
    assert!(routes[0].strip_prefix);
    assert_eq!(
        routes[1].matcher.host,
        Some(HostPattern::Exact("api.example.com".into()))
    );
    assert_eq!(routes[1].matcher.path, PathMatch::Prefix("/".into()));
    assert_eq!(routes[2].matcher.path, PathMatch::Exact("/health/".into()));
}

/// Anchors, merge keys (`<<`) and top-level `x-` fields let routes share settings; a key the
/// mapping writes itself wins over a merged one.
#[test]
fn anchors_merge_keys_and_x_fields_share_settings() {
    let text = "\
listen: 0.0.0.0:8080
x-route: &route
  upstream: api
  limits:
    - {name: l, algorithm: token_bucket, rate: 5/s}
upstreams:
  api: {targets: http://a}
  other: {targets: http://b}
routes:
  - name: a
    match: {path_prefix: /a}
    <<: *route
  - name: b
    <<: *route
    upstream: other
";
    let routes = ok(text).config.routes;
    assert_eq!(routes[0].upstream, "api");
    assert_eq!(routes[0].limits[0].algorithm, bucket(5.0, 5, 1));
    assert_eq!(routes[1].upstream, "other");
    assert_eq!(routes[1].limits, routes[0].limits);
}

/// A top-level key that is not `x-` and not known is still an error, even holding an anchor.
#[test]
fn only_x_prefixed_top_level_keys_are_ignored() {
    let found = problems("listen: 0.0.0.0:1\ndefaults: &d {upstream: api}\n");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("proxy.yaml:2:1: defaults: unknown key \"defaults\""),
        "{}",
        found[0]
    );
}

/// Every `rate_limit_headers` and `on_error` name; `none` is the name, not YAML's null.
#[test]
fn enumerated_names_read_as_documented() {
    for (name, style) in [
        ("ietf", HeaderStyle::Ietf),
        ("legacy", HeaderStyle::Legacy),
        ("both", HeaderStyle::Both),
        ("none", HeaderStyle::None),
    ] {
        let text = format!("listen: 0.0.0.0:1\nrate_limit_headers: {name}\n");
        assert_eq!(ok(&text).config.rate_limit_headers, style, "{name}");
    }
    for (name, policy) in [
        ("allow", OnError::Allow),
        ("deny", OnError::Deny),
        ("local", OnError::Local),
    ] {
        let text = format!("listen: 0.0.0.0:1\nstore: {{on_error: {name}}}\n");
        assert_eq!(ok(&text).config.store.on_error, policy, "{name}");
    }
}

/// `paths` reads every documented name; without it, encoded slashes are refused and
/// `;parameters` ignored, and `check` says nothing of it.
#[test]
fn paths_settings_read_as_documented() {
    use crate::routing::{EscapedSlashes, PathPolicy, SegmentParams};
    let default = ok("listen: 0.0.0.0:1\n").config;
    assert_eq!(
        default.paths,
        PathPolicy {
            escaped_slashes: EscapedSlashes::Reject,
            segment_params: SegmentParams::Ignore,
        }
    );
    assert!(!default.summary().contains("paths"));
    assert_eq!(
        default.to_json()["paths"],
        serde_json::json!({"escaped_slashes": "reject", "segment_params": "ignore"})
    );
    for (name, slashes) in [
        ("reject", EscapedSlashes::Reject),
        ("decode", EscapedSlashes::Decode),
        ("keep", EscapedSlashes::Keep),
    ] {
        let text = format!("listen: 0.0.0.0:1\npaths: {{escaped_slashes: {name}}}\n");
        assert_eq!(ok(&text).config.paths.escaped_slashes, slashes, "{name}");
    }
    let text = "listen: 0.0.0.0:1\npaths:\n  segment_params: keep\n";
    let config = ok(text).config;
    assert_eq!(config.paths.segment_params, SegmentParams::Keep);
    assert!(
        config
            .summary()
            .contains("paths: escaped_slashes reject, segment_params keep"),
        "{}",
        config.summary()
    );
}

/// `access_log` reads both documented settings; without it the log keeps no query and writes
/// the client's address, and `check` says nothing of it; `/config` always shows it.
#[test]
fn access_log_settings_read_as_documented() {
    use crate::config::{AccessLog, LogClient};
    let default = ok("listen: 0.0.0.0:1\n").config;
    assert_eq!(
        default.access_log,
        AccessLog {
            query: false,
            client: LogClient::Address,
        }
    );
    assert!(!default.summary().contains("access_log"));
    assert_eq!(
        default.to_json()["access_log"],
        serde_json::json!({"query": false, "client": "address"})
    );
    let text = "listen: 0.0.0.0:1\naccess_log: {query: true, client: hash}\n";
    let config = ok(text).config;
    assert_eq!(
        config.access_log,
        AccessLog {
            query: true,
            client: LogClient::Hash,
        }
    );
    assert!(
        config
            .summary()
            .contains("access_log: client hash, query kept"),
        "{}",
        config.summary()
    );
    assert_eq!(
        config.to_json()["access_log"],
        serde_json::json!({"query": true, "client": "hash"})
    );
    let address = ok("listen: 0.0.0.0:1\naccess_log: {client: address}\n").config;
    assert_eq!(address.access_log, AccessLog::default());
}

/// The summary of a small memory-backed file: one route for every request, no limits.
#[test]
fn summary_of_a_minimal_file() {
    let expected = "\
listen: 0.0.0.0:8080
store: memory, max_keys 1000000
upstreams (1):
  api: http://127.0.0.1:8000
routes (1):
  all: every request -> api";
    assert_eq!(ok(MINIMAL).config.summary(), expected);
}

/// `store.leases: false` turns the leases of busy token buckets off; the summary and `/config`
/// say so; a value that is not a boolean is an error at its place.
#[test]
fn store_leases_may_be_turned_off() {
    let text = "listen: 0.0.0.0:8080\nstore: {url: redis://127.0.0.1:6379/0, leases: false}\n";
    let c = ok(text).config;
    assert!(!c.store.leases);
    assert!(c.summary().contains(", no leases"), "{}", c.summary());
    let on = ok("listen: 0.0.0.0:8080\nstore: {url: redis://127.0.0.1:6379/0}\n").config;
    assert!(on.store.leases);
    assert!(!on.summary().contains("leases"));
    let bad = problems(
        "listen: 0.0.0.0:8080\nstore:\n  url: redis://127.0.0.1:6379/0\n  leases: sometimes\n",
    );
    assert!(
        bad.iter()
            .any(|p| p.contains("proxy.yaml:4:") && p.contains("leases")),
        "{bad:?}"
    );
}

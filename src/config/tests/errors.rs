//! Each kind of problem, with its exact `file:line:column: path: message` text.

use super::*;

/// MINIMAL with `extra` appended to its only route (indented as the route's keys).
fn route_with(extra: &str) -> String {
    format!("{MINIMAL}{extra}")
}

fn assert_problems(text: &str, expected: &[&str]) {
    assert_eq!(problems(text), expected, "for:\n{text}");
}

/// The error example of docs/configuration.md, exactly: a rate that is not N/unit, on line 31,
/// column 15.
#[test]
fn bad_rate_names_file_line_column_path_and_value() {
    let body = "\
listen: 0.0.0.0:8080
upstreams:
  api:
    targets: [http://127.0.0.1:8000]
routes:
  - name: api-v1
    upstream: api
    limits:
      - name: per-client
        algorithm: token_bucket
        rate: 10/s
      - name: per-key
        algorithm: token_bucket
        rate: ten
";
    let text = format!("{}{body}", "# padding\n".repeat(17));
    assert_problems(
        &text,
        &[
            r#"proxy.yaml:31:15: routes[0].limits[1].rate: expected N/unit such as 10/s, found "ten""#,
        ],
    );
}

/// A misspelt key is an error at the key, with the likely intended key.
#[test]
fn misspelt_key_is_an_error_with_a_hint() {
    let text =
        route_with("    limts:\n      - {name: l, algorithm: token_bucket, rate: 1/s, burts: 5}\n");
    assert_problems(
        &text,
        &[r#"proxy.yaml:8:5: routes[0].limts: unknown key "limts" (did you mean "limits"?)"#],
    );
    let text = route_with(
        "    limits:\n      - {name: l, algorithm: token_bucket, rate: 1/s, burts: 5}\n",
    );
    assert_problems(
        &text,
        &[
            r#"proxy.yaml:9:55: routes[0].limits[0].burts: unknown key "burts" (did you mean "burst"?)"#,
        ],
    );
}

/// An unknown key that resembles none lists the keys allowed there.
#[test]
fn unknown_key_without_a_close_match_lists_the_allowed_keys() {
    assert_problems(
        "listen: 0.0.0.0:8080\ncolour: blue\n",
        &[
            "proxy.yaml:2:1: colour: unknown key \"colour\"; expected listen, workers, tls, admin, \
             store, trusted_proxies, rate_limit_headers, timeouts, max_body_size, paths, access_log, \
             forwarded_headers, upstreams or routes",
        ],
    );
}

/// A route naming an upstream that does not exist, with the likely intended one.
#[test]
fn missing_upstream_is_an_error_at_the_reference() {
    let text = MINIMAL.replace("upstream: api", "upstream: apx");
    assert_problems(
        &text,
        &[r#"proxy.yaml:7:15: routes[0].upstream: no upstream named "apx" (did you mean "api"?)"#],
    );
    let text = MINIMAL.replace("upstream: api", "upstream: billing");
    assert_problems(
        &text,
        &[
            r#"proxy.yaml:7:15: routes[0].upstream: no upstream named "billing"; upstreams defines api"#,
        ],
    );
}

/// Two routes with one name: the second is the error, pointing at the first.
#[test]
fn duplicate_route_name_points_at_the_first() {
    let text = format!("{MINIMAL}  - name: all\n    upstream: api\n");
    assert_problems(
        &text,
        &[
            r#"proxy.yaml:8:11: routes[1].name: duplicate route name "all": routes[0] on line 6 has it"#,
        ],
    );
}

/// Two limits with one name in a route.
#[test]
fn duplicate_limit_name_in_a_route_is_an_error() {
    let text = route_with(
        "    limits:\n      - {name: l, algorithm: token_bucket, rate: 1/s}\n      - {name: l, algorithm: token_bucket, rate: 2/s}\n",
    );
    assert_problems(
        &text,
        &[
            r#"proxy.yaml:10:16: routes[0].limits[1].name: duplicate limit name "l" in this route: limits[0] on line 9 has it"#,
        ],
    );
}

/// On a route named `upstream`, a limit named like an upstream would keep its counts at that
/// upstream's pacing key (`<prefix>:upstream:api:pace` for the client key `pace`): refused;
/// another limit name, or another route name, is fine.
#[test]
fn a_limit_key_that_could_be_a_pacing_key_is_an_error() {
    let limits = "    limits:\n      - {name: api, algorithm: fixed_window, key: header:x-user, limit: 9, window: 1h}\n      - {name: other, algorithm: token_bucket, rate: 1/s}\n";
    let text = route_with(limits).replace("name: all", "name: upstream");
    assert_problems(
        &text,
        &[
            r#"proxy.yaml:9:16: routes[0].limits[0].name: a limit named "api" on a route named "upstream" would keep its counts where upstream "api" keeps its pacing schedule (<key_prefix>:upstream:api:pace); rename the route or the limit"#,
        ],
    );
    ok(&route_with(limits));
}

/// A key written twice in one mapping (here two upstreams of one name) is an error at the
/// second, even though YAML parsers usually keep the last silently.
#[test]
fn duplicate_yaml_key_is_an_error_at_the_second() {
    let text = MINIMAL.replace(
        "routes:",
        "  api:\n    targets: [http://127.0.0.1:9000]\nroutes:",
    );
    assert_problems(
        &text,
        &[
            r#"proxy.yaml:5:3: upstreams.api: duplicate key "api": it is already defined on line 3, and YAML keys must be unique"#,
        ],
    );
}

/// Zero rates, bursts, costs, limits and windows are refused where they are written.
#[test]
fn zero_rate_burst_limit_and_window_are_errors() {
    let text = route_with(
        "    limits:\n      - {name: a, algorithm: token_bucket, rate: 0/s}\n      - {name: b, algorithm: token_bucket, rate: 1/s, burst: 0, cost: 0}\n      - {name: c, algorithm: fixed_window, limit: 0, window: 0s}\n",
    );
    assert_problems(
        &text,
        &[
            r#"proxy.yaml:9:50: routes[0].limits[0].rate: rate must be greater than zero, found "0/s""#,
            "proxy.yaml:10:62: routes[0].limits[1].burst: burst must be at least 1, found 0",
            "proxy.yaml:10:71: routes[0].limits[1].cost: cost must be at least 1, found 0",
            "proxy.yaml:11:51: routes[0].limits[2].limit: limit must be at least 1, found 0",
            r#"proxy.yaml:11:62: routes[0].limits[2].window: window must be greater than zero, found "0s""#,
        ],
    );
}

/// Problems in different parts of the file are all reported, in file order.
#[test]
fn every_problem_is_reported_together_in_file_order() {
    let text = "\
listen: 0.0.0.0:8080
workers: many
upstreams:
  api:
    targets: [http://127.0.0.1:8000]
routes:
  - name: all
    upstream: apx
    limits:
      - {name: l, algorithm: token_bucket, rate: ten}
";
    assert_problems(
        text,
        &[
            r#"proxy.yaml:2:10: workers: expected a whole number, found "many""#,
            r#"proxy.yaml:8:15: routes[0].upstream: no upstream named "apx" (did you mean "api"?)"#,
            r#"proxy.yaml:10:50: routes[0].limits[0].rate: expected N/unit such as 10/s, found "ten""#,
        ],
    );
}

/// A parameter of another algorithm is an error, not silently ignored (in a limit and in an
/// override).
#[test]
fn parameter_of_another_algorithm_is_an_error() {
    let text = route_with(
        "    limits:\n      - name: l\n        algorithm: token_bucket\n        rate: 1/s\n        window: 1m\n        overrides:\n          vip: {limit: 5}\n",
    );
    assert_problems(
        &text,
        &[
            "proxy.yaml:12:9: routes[0].limits[0].window: window is not a parameter of token_bucket, which takes rate, burst and cost",
            "proxy.yaml:14:17: routes[0].limits[0].overrides.vip.limit: limit is not a parameter of token_bucket, which takes rate, burst and cost",
        ],
    );
}

/// A cost larger than the burst could never be admitted.
#[test]
fn cost_over_burst_is_an_error_at_the_cost() {
    let text = route_with(
        "    limits:\n      - {name: l, algorithm: token_bucket, rate: 1/s, burst: 2, cost: 5}\n",
    );
    assert_problems(
        &text,
        &["proxy.yaml:9:71: routes[0].limits[0].cost: cost 5 is larger than burst 2: no request could ever be admitted"],
    );
}

/// A missing required key is reported at the mapping that lacks it.
#[test]
fn missing_required_keys_point_at_their_mapping() {
    let text = route_with("    limits:\n      - name: l\n        rate: 1/s\n");
    assert_problems(
        &text,
        &[r#"proxy.yaml:9:9: routes[0].limits[0]: missing required key "algorithm""#],
    );
    let text = route_with("    limits:\n      - {name: w, algorithm: sliding_window, limit: 5}\n");
    assert_problems(
        &text,
        &[
            r#"proxy.yaml:9:9: routes[0].limits[0]: missing required key "window" (sliding_window needs it)"#,
        ],
    );
    assert_problems(
        "workers: 2\n",
        &[r#"proxy.yaml:1:1: missing required key "listen""#],
    );
}

/// Unknown names of algorithms, modes and key parts get the list and a hint.
#[test]
fn unknown_names_list_the_choices_with_a_hint() {
    let text = route_with(
        "    limits:\n      - {name: l, algorithm: tokn_bucket, rate: 1/s, key: [ip, hedaer]}\n",
    );
    assert_problems(
        &text,
        &[
            r#"proxy.yaml:9:30: routes[0].limits[0].algorithm: expected token_bucket, leaky_bucket, fixed_window, sliding_window, sliding_window_counter or concurrency, found "tokn_bucket" (did you mean "token_bucket"?)"#,
            r#"proxy.yaml:9:64: routes[0].limits[0].key[1]: expected ip, header:NAME, query:NAME, host, path or route, found "hedaer""#,
        ],
    );
}

/// Addresses, networks, URLs, methods, header names, hosts and paths are checked.
#[test]
fn malformed_values_are_errors_at_each_value() {
    let text = "\
listen: [0.0.0.0:8080, localhost:80]
trusted_proxies: [10.0.0.0/33]
upstreams:
  api:
    targets: [ftp://files, http://h:1/base]
routes:
  - name: r
    upstream: api
    match:
      host: api.example.com:443
      path_prefix: v1
      methods: [GET, \"BAD METHOD\"]
      headers: {\"bad header\": x}
";
    assert_problems(
        text,
        &[
            r#"proxy.yaml:1:24: listen[1]: expected an address such as 0.0.0.0:8080 or [::]:8080, found "localhost:80""#,
            r#"proxy.yaml:2:19: trusted_proxies[0]: expected an address or network such as 10.0.0.0/8 or 192.0.2.1, found "10.0.0.0/33""#,
            r#"proxy.yaml:5:15: upstreams.api.targets[0]: a target must start with http:// or https://, found "ftp://files""#,
            r#"proxy.yaml:5:28: upstreams.api.targets[1]: a target is scheme://host[:port] with no path or query, found "http://h:1/base""#,
            r#"proxy.yaml:10:13: routes[0].match.host: a host is matched without its port; leave the port out of "api.example.com:443""#,
            r#"proxy.yaml:11:20: routes[0].match.path_prefix: a path must start with "/", found "v1""#,
            r#"proxy.yaml:12:22: routes[0].match.methods[1]: expected an HTTP method such as GET or POST, found "BAD METHOD""#,
            r#"proxy.yaml:13:17: routes[0].match.headers["bad header"]: not a valid header name: "bad header""#,
        ],
    );
}

/// `store` problems: scheme, url with cluster, redis with neither.
#[test]
fn store_backend_problems() {
    assert_problems(
        "listen: 0.0.0.0:1\nstore: {backend: redis, url: \"http://u:pw@h\"}\n",
        &[
            r#"proxy.yaml:2:30: store.url: expected a URL starting with redis://, rediss://, redis+unix:// or unix://, found "http://u:***@h""#,
        ],
    );
    // a URL with the right scheme that the store could not open: refused here, not at start-up
    assert_problems(
        "listen: 0.0.0.0:1\nstore:\n  url: redis://:pw@h:notaport/0\n",
        &[
            r#"proxy.yaml:3:8: store.url: not a Redis URL that can be used (bad host, port or database): "redis://:***@h:notaport/0""#,
        ],
    );
    assert_problems(
        "listen: 0.0.0.0:1\nstore: {cluster: [redis://a:1, \"redis://b:1/x\"]}\n",
        &[
            r#"proxy.yaml:2:32: store.cluster[1]: not a Redis URL that can be used (Invalid database number): "redis://b:1/x""#,
        ],
    );
    assert_problems(
        "listen: 0.0.0.0:1\nstore: {cluster: [redis://a:1/0, redis://b:1/3]}\n",
        &[
            r#"proxy.yaml:2:34: store.cluster[1]: a Redis Cluster has only database 0; leave /3 out of "redis://b:1/3""#,
        ],
    );
    assert_problems(
        "listen: 0.0.0.0:1\nstore:\n  cluster: [\"redis://:a@h:1\", \"redis://u:b@h:2\"]\n",
        &[
            "proxy.yaml:3:12: store.cluster: every node URL must give the same user and password (the Cluster client signs in to all nodes with one): node 1 differs from node 0",
        ],
    );
    assert_problems(
        "listen: 0.0.0.0:1\nstore:\n  cluster: [\"redis://h:1\", \"rediss://h:2\"]\n",
        &[
            "proxy.yaml:3:12: store.cluster: every node URL must be redis:// or every one rediss:// (the Cluster client reaches all nodes the same way): node 1 differs from node 0",
        ],
    );
    assert_problems(
        "listen: 0.0.0.0:1\nstore:\n  url: redis://h:1/0?password=pw\n",
        &[
            r#"proxy.yaml:3:8: store.url: the Redis client does not read the URL's `password` parameter (a password goes in the user-info: redis://:PASSWORD@host:port/db): "redis://h:1/0?password=***""#,
        ],
    );
    assert_problems(
        "listen: 0.0.0.0:1\nstore:\n  url: redis+unix:///tmp/r.sock?db=1&password=pw\n",
        &[
            r#"proxy.yaml:3:8: store.url: the Redis client does not read the URL's `password` parameter (the password parameter is `pass=`): "redis+unix:///tmp/r.sock?db=1&password=***""#,
        ],
    );
    assert_problems(
        "listen: 0.0.0.0:1\nstore:\n  url: redis://a\n  cluster: [redis://b]\n",
        &["proxy.yaml:4:3: store.cluster: give one of url (one server), cluster or sentinel, not url and cluster"],
    );
    assert_problems(
        "listen: 0.0.0.0:1\nstore:\n  backend: redis\n  timeout: 0s\n",
        &[
            "proxy.yaml:3:3: store: backend redis needs url (one server), cluster (a list of nodes) or sentinel (a master watched by Sentinels)",
            "proxy.yaml:4:12: store.timeout: must be greater than zero",
        ],
    );
    assert_problems(
        "listen: 0.0.0.0:1\nstore: {backend: memory, url: redis://a}\n",
        &["proxy.yaml:2:26: store.url: url is only used with backend: redis"],
    );
}

/// Every timeout is at most a year: longer ones are refused where they are written.
#[test]
fn timeouts_over_a_year_are_errors() {
    assert_problems(
        "listen: 0.0.0.0:1\nstore:\n  timeout: 366d\n",
        &["proxy.yaml:3:12: store.timeout: must be at most 365d"],
    );
    // a "never" written as a huge number: refused (it would panic when added to the clock)
    assert_problems(
        "listen: 0.0.0.0:1\ntimeouts:\n  upstream_response: 10000000000000000000s\n  idle: 365d\n",
        &["proxy.yaml:3:22: timeouts.upstream_response: must be at most 365d"],
    );
    // the drain time too (which alone may be zero)
    assert_problems(
        "listen: 0.0.0.0:1\ntimeouts:\n  shutdown: 400d\n",
        &["proxy.yaml:3:13: timeouts.shutdown: must be at most 365d"],
    );
    ok("listen: 0.0.0.0:1\ntimeouts:\n  shutdown: 0s\n");
}

/// Path and path_prefix together, and strip_prefix without a prefix.
#[test]
fn conflicting_match_keys_are_errors() {
    let text = route_with("    strip_prefix: true\n    match: {path: /a, path_prefix: /b}\n");
    assert_problems(
        &text,
        &[
            "proxy.yaml:8:19: routes[0].strip_prefix: strip_prefix needs match.path_prefix (there is no prefix to strip)",
            "proxy.yaml:9:13: routes[0].match.path: give either path_prefix or path, not both",
        ],
    );
}

/// Wrong YAML types: a list where a mapping belongs, a mapping where a string belongs.
#[test]
fn wrong_types_are_errors_at_the_value() {
    assert_problems(
        "listen: 0.0.0.0:1\nupstreams: [api]\ntimeouts:\n  idle: {s: 1}\n",
        &[
            "proxy.yaml:2:12: upstreams: expected a mapping, found a list",
            "proxy.yaml:4:9: timeouts.idle: expected a string, found a mapping",
        ],
    );
    assert_problems(
        "- listen\n",
        &["proxy.yaml:1:1: expected a mapping, found a list"],
    );
}

/// YAML syntax errors carry the parser's position and message, and stop there.
#[test]
fn yaml_syntax_error_has_a_position() {
    assert_problems(
        "listen: [0.0.0.0:8080\nworkers: 2\n",
        &["proxy.yaml:2:8: did not find expected ',' or ']', while parsing a flow sequence at line 1 column 9"],
    );
}

/// An empty file (or one of comments only) lacks `listen`.
#[test]
fn empty_file_lacks_listen() {
    assert_problems("", &[r#"proxy.yaml:1:1: missing required key "listen""#]);
    assert_problems(
        "# nothing yet\n",
        &[r#"proxy.yaml:1:1: missing required key "listen""#],
    );
}

/// A listener given twice, and an admin listener on a proxy port, are errors.
#[test]
fn listeners_must_be_distinct() {
    assert_problems(
        "listen: [0.0.0.0:80, 0.0.0.0:80]\nadmin: {listen: 0.0.0.0:80}\n",
        &[
            "proxy.yaml:1:22: listen[1]: 0.0.0.0:80 is listed twice",
            "proxy.yaml:2:17: admin.listen: 0.0.0.0:80 is also a proxy listener's port; give admin its own port",
        ],
    );
    // a wildcard address covers the others on its port
    assert_problems(
        "listen: [0.0.0.0:80, 127.0.0.1:80, 127.0.0.1:81]\nadmin: {listen: 127.0.0.1:80}\n",
        &[
            "proxy.yaml:1:22: listen[1]: 127.0.0.1:80 and 0.0.0.0:80 are one port: only one can listen",
            "proxy.yaml:2:17: admin.listen: 127.0.0.1:80 is also a proxy listener's port; give admin its own port",
        ],
    );
    assert_problems(
        "listen: [\"[::]:80\", 127.0.0.1:80]\nadmin: {listen: 127.0.0.2:81}\n",
        &["proxy.yaml:1:21: listen[1]: 127.0.0.1:80 and [::]:80 are one port: only one can listen"],
    );
    // port 0 (a free port each) collides with nothing
    let config = ok("listen: [0.0.0.0:0, 127.0.0.1:0]\nadmin: {listen: 127.0.0.1:0}\n");
    assert_eq!(config.config.listen.len(), 2);
}

/// A bad name of a mode, and a `tls` without its key, are errors where they belong.
#[test]
fn bad_mode_and_incomplete_tls_are_errors() {
    let text = route_with(
        "    limits:\n      - {name: l, algorithm: token_bucket, rate: 1/s, mode: Shadow}\n",
    )
    .replace(
        "listen: 0.0.0.0:8080\n",
        "listen: 0.0.0.0:8080\ntls: {cert: /c.pem}\n",
    );
    assert_problems(
        &text,
        &[
            r#"proxy.yaml:2:6: tls: missing required key "key""#,
            r#"proxy.yaml:10:61: routes[0].limits[0].mode: expected enforce or shadow, found "Shadow" (did you mean "shadow"?)"#,
        ],
    );
    // both halves missing: both reported
    assert_problems(
        "listen: 0.0.0.0:8080\ntls: {}\n",
        &[
            r#"proxy.yaml:2:6: tls: missing required key "cert""#,
            r#"proxy.yaml:2:6: tls: missing required key "key""#,
        ],
    );
}

/// Values no process could honour are refused where they are written: a `max_waiting` past
/// what a semaphore holds, a target with credentials (never sent, shown in the clear) or a
/// port out of range.
#[test]
fn values_past_what_can_be_honoured_are_errors() {
    let text = MINIMAL.replace(
        "    targets: [http://127.0.0.1:8000]",
        "    targets: [http://127.0.0.1:8000]\n    pace: {rate: 10/s, max_waiting: 2305843009213693952}",
    );
    let got = problems(&text);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].contains("upstreams.api.pace.max_waiting: max_waiting must be at most 10000000, found 2305843009213693952"),
        "{got:?}"
    );
    for (target, says) in [
        (
            "http://user:s3cret@127.0.0.1:8000",
            "takes no user or password",
        ),
        ("http://127.0.0.1:89800", "port is at most 65535"),
    ] {
        let text = MINIMAL.replace("http://127.0.0.1:8000", target);
        let got = problems(&text);
        assert!(got.len() == 1 && got[0].contains(says), "{target}: {got:?}");
    }
}

/// A file saved with a UTF-8 byte order mark reads as without it.
#[test]
fn a_byte_order_mark_is_skipped() {
    let with_bom = format!("\u{feff}{MINIMAL}");
    assert_eq!(ok(&with_bom).config, ok(MINIMAL).config);
}

/// A `paths` setting that is not one of its names, or a misspelt key under `paths`.
#[test]
fn paths_settings_outside_their_names_are_errors() {
    assert_problems(
        "listen: 0.0.0.0:8080\npaths:\n  escaped_slashes: allow\n  segment_param: keep\n",
        &[
            r#"proxy.yaml:3:20: paths.escaped_slashes: expected reject, decode or keep, found "allow""#,
            r#"proxy.yaml:4:3: paths.segment_param: unknown key "segment_param" (did you mean "segment_params"?)"#,
        ],
    );
}

/// An upstream's `protocol` is one of three names, and its `tls` needs a certificate and its
/// key together and a server name that is a name.
#[test]
fn upstream_protocol_and_tls_are_checked() {
    let text = MINIMAL.replace(
        "    targets: [http://127.0.0.1:8000]\n",
        "    targets: [https://10.0.0.1:8443]\n    protocol: h2\n    tls: {cert: /c.pem, server_name: \"a b\"}\n",
    );
    assert_problems(
        &text,
        &[
            r#"proxy.yaml:5:15: upstreams.api.protocol: expected http1, http2 or auto, found "h2""#,
            r#"proxy.yaml:6:10: upstreams.api.tls: missing required key "key": a client certificate (cert) needs its private key"#,
            r#"proxy.yaml:6:38: upstreams.api.tls.server_name: expected a DNS name or an IP address, found "a b""#,
        ],
    );
}

/// An `access_log.client` that is not one of its names, and a `query` that is not a boolean.
#[test]
fn access_log_settings_outside_their_names_are_errors() {
    assert_problems(
        "listen: 0.0.0.0:8080\naccess_log:\n  client: ip\n  query: sometimes\n",
        &[
            r#"proxy.yaml:3:11: access_log.client: expected address or hash, found "ip""#,
            r#"proxy.yaml:4:10: access_log.query: expected true or false, found "sometimes""#,
        ],
    );
}

/// `charge` on an algorithm that cannot take one is an error at the key, saying which can; a
/// charge needs its header, and a valid one.
#[test]
fn charge_needs_a_chargeable_algorithm_and_a_header() {
    let text = route_with(
        "    limits:\n      - name: l\n        algorithm: sliding_window\n        limit: 5\n        window: 1m\n        charge: {response_header: x-used}\n",
    );
    assert_problems(
        &text,
        &[
            "proxy.yaml:13:9: routes[0].limits[0].charge: charge needs token_bucket, fixed_window or sliding_window_counter, not sliding_window (a sliding log would need one entry per unit charged)",
        ],
    );
    let text = route_with(
        "    limits:\n      - {name: l, algorithm: concurrency, limit: 2, charge: {response_header: x-used}}\n",
    );
    assert_problems(
        &text,
        &[
            "proxy.yaml:9:53: routes[0].limits[0].charge: charge needs token_bucket, fixed_window or sliding_window_counter, not concurrency (a slot counts requests running, not what they used)",
        ],
    );
    let text = route_with(
        "    limits:\n      - {name: l, algorithm: token_bucket, rate: 1/s, charge: {}}\n      - {name: m, algorithm: token_bucket, rate: 1/s, charge: {response_header: \"a b\"}}\n",
    );
    assert_problems(
        &text,
        &[
            r#"proxy.yaml:9:63: routes[0].limits[0].charge: missing required key "response_header""#,
            r#"proxy.yaml:10:81: routes[0].limits[1].charge.response_header: not a valid header name: "a b""#,
        ],
    );
}

/// `charge.missing` is a whole number from 1, as `cost` is: zero, a negative number, text
/// or one past `u32` is an error at the key.
#[test]
fn charge_missing_is_checked_like_cost() {
    let text = route_with(
        "    limits:\n      - {name: a, algorithm: token_bucket, rate: 1/s, charge: {response_header: x-used, missing: 0}}\n      - {name: b, algorithm: token_bucket, rate: 1/s, charge: {response_header: x-used, missing: 4294967296}}\n      - {name: c, algorithm: token_bucket, rate: 1/s, charge: {response_header: x-used, missing: lots}}\n      - {name: d, algorithm: token_bucket, rate: 1/s, charge: {response_header: x-used, missing: -5}}\n",
    );
    assert_problems(
        &text,
        &[
            "proxy.yaml:9:98: routes[0].limits[0].charge.missing: missing must be at least 1, found 0",
            "proxy.yaml:10:98: routes[0].limits[1].charge.missing: missing is too large, found 4294967296",
            r#"proxy.yaml:11:98: routes[0].limits[2].charge.missing: expected a whole number, found "lots""#,
            "proxy.yaml:12:98: routes[0].limits[3].charge.missing: expected a whole number of 0 or more, found -5",
        ],
    );
}

/// `http2` takes its defaults key by key; a zero or unreadable value is an error at its key,
/// and an unknown key is refused.
#[test]
fn upstream_http2_settings_are_checked() {
    let with = |http2: &str| {
        MINIMAL.replace(
            "    targets: [http://127.0.0.1:8000]\n",
            &format!("    targets: [http://127.0.0.1:8000]\n    http2: {http2}\n"),
        )
    };
    let loaded = ok(&with("{keepalive_interval: 2s, max_connections: 8}"));
    let h = loaded.config.upstreams[0].http2;
    assert_eq!(h.keepalive_interval, std::time::Duration::from_secs(2));
    assert_eq!(h.keepalive_timeout, std::time::Duration::from_secs(5));
    assert_eq!(h.max_connections.get(), 8);
    let got = problems(&with(
        "{keepalive_interval: 0s, keepalive_timeout: soon, max_connections: 0}",
    ));
    let expected = [
        "upstreams.api.http2.keepalive_interval: must be greater than zero",
        "upstreams.api.http2.keepalive_timeout: ",
        "upstreams.api.http2.max_connections: max_connections must be at least 1, found 0",
    ];
    for e in expected {
        assert!(got.iter().any(|p| p.contains(e)), "{e:?} not in {got:?}");
    }
    let got = problems(&with("{pings: 1s}"));
    assert!(
        got.iter().any(|p| p.contains("upstreams.api.http2")),
        "{got:?}"
    );
}

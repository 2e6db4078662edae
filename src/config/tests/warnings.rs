//! Warnings: problems that do not stop the proxy.

use super::*;

/// A route after a catch-all (`path_prefix: /`, no other condition) can never match: a
/// warning at the shadowed route, naming the one that shadows it.
#[test]
fn route_after_a_catch_all_is_a_warning() {
    let text = MINIMAL.replace(
        "    upstream: api\n",
        "    upstream: api\n    match: {path_prefix: /}\n",
    )
        + "  - name: v1\n    upstream: api\n    match: {path_prefix: /v1, methods: [GET]}\n";
    assert_eq!(
        warnings(&text),
        [
            r#"proxy.yaml:9:5: routes[1]: route "v1" can never match: route "all" (routes[0], line 6) comes first and matches every request it would"#
        ]
    );
}

/// Shadowing follows the matchers: a wider prefix, a wildcard host, or a method subset
/// shadows; a narrower earlier route or a different host does not.
#[test]
fn shadowing_follows_prefix_host_and_methods() {
    let routes = "\
routes:
  - name: v1-get
    upstream: api
    match: {path_prefix: /v1, methods: [GET]}
  - name: v1-any
    upstream: api
    match: {path_prefix: /v1}
  - name: v1-users
    upstream: api
    match: {path_prefix: /v1/users}
  - name: v1x
    upstream: api
    match: {path_prefix: /v1x}
  - name: wild
    upstream: api
    match: {host: \"*.example.com\"}
  - name: api-host
    upstream: api
    match: {host: api.example.com, path: /status}
  - name: other-host
    upstream: api
    match: {host: example.com}
";
    let text = with_routes(routes);
    let found = warnings(&text);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found[0].contains("route \"v1-users\" can never match: route \"v1-any\""),
        "{}",
        found[0]
    );
    assert!(
        found[1].contains("route \"api-host\" can never match: route \"wild\""),
        "{}",
        found[1]
    );
}

/// No routes at all is valid, with a warning; so is an upstream no route uses.
#[test]
fn no_routes_and_unused_upstreams_are_warnings() {
    assert_eq!(
        warnings("listen: 0.0.0.0:8080\n"),
        ["proxy.yaml:1:1: routes: no routes: every request will be answered 404"]
    );
    let text = MINIMAL.replace(
        "routes:",
        "  spare:\n    targets: http://127.0.0.1:9\nroutes:",
    );
    assert_eq!(
        warnings(&text),
        [r#"proxy.yaml:6:5: upstreams.spare: upstream "spare" is not used by any route"#]
    );
}

/// A match path that normalisation never produces can only match as its normal form: a
/// warning that says which; a leaky bucket or pace with no bound on the wait: a warning.
#[test]
fn unnormalised_match_paths_and_unbounded_waits_are_warnings() {
    let routes = "\
routes:
  - name: dots
    upstream: api
    match: {path: /f/../g}
  - name: escaped
    upstream: api
    match: {path_prefix: /h%41}
  - name: plain
    upstream: api
    match: {path_prefix: /v1/}
    limits:
      - {name: bounded, algorithm: leaky_bucket, rate: 5/s, max_delay: 1s}
      - {name: unbounded, algorithm: leaky_bucket, rate: 5/s}
";
    let text = with_routes(routes);
    assert_eq!(
        warnings(&text),
        [
            r#"proxy.yaml:8:19: routes[0].match.path: never matches as written: requests are matched on their normalised path, and "/f/../g" normalises to "/g"; write that"#,
            r#"proxy.yaml:11:26: routes[1].match.path_prefix: never matches as written: requests are matched on their normalised path, and "/h%41" normalises to "/hA"; write that"#,
            "proxy.yaml:17:9: routes[2].limits[1]: leaky_bucket without max_delay: a request waits for its slot however far off it is; set max_delay to answer 429 past it",
        ]
    );
    let paced = |pace: &str| {
        MINIMAL.replace(
            "    targets:",
            &format!("    pace: {{{pace}}}\n    targets:"),
        )
    };
    let unbounded = warnings(&paced("rate: 5/s"));
    assert_eq!(unbounded.len(), 1, "{unbounded:?}");
    assert!(
        unbounded[0].contains("upstreams.api.pace: pace without max_delay or max_waiting"),
        "{unbounded:?}"
    );
    assert!(warnings(&paced("rate: 5/s, max_delay: 2s")).is_empty());
}

/// Route matches that no request would meet, as written, are warnings that say what to write:
/// a method no client is known to send (a misspelling) or `*`, a path with a query, or with what
/// clients send percent-encoded.
#[test]
fn matches_no_request_would_meet_are_warnings() {
    let routes = "\
routes:
  - name: a
    upstream: api
    match: {methods: [GTE, \"*\", PURGE, get, PROPFIND]}
  - name: b
    upstream: api
    match: {path: /ü}
  - name: c
    upstream: api
    match: {path_prefix: /a b}
  - name: d
    upstream: api
    match: {path: /q?x=1}
";
    assert_eq!(
        warnings(&with_routes(routes)),
        [
            r#"proxy.yaml:8:23: routes[0].match.methods[0]: "GTE" is not a method clients are known to send: only a request with exactly that method matches (a misspelling of another?)"#,
            r#"proxy.yaml:8:28: routes[0].match.methods[1]: "*" is no wildcard here: it matches no request; leave methods out to match every method"#,
            r#"proxy.yaml:11:19: routes[1].match.path: never matches as written: clients send "/ü" percent-encoded; write "/%C3%BC""#,
            r#"proxy.yaml:14:26: routes[2].match.path_prefix: never matches as written: clients send "/a b" percent-encoded; write "/a%20b""#,
            r#"proxy.yaml:17:19: routes[3].match.path: never matches: a request's path does not hold its query or fragment, and "/q?x=1" has '?'; match the path alone"#,
        ]
    );
}

/// An override no request can have is a warning. The documented example has one: an API key
/// under `key: ip`. Two overrides written differently for one client are a warning too, such
/// as one address in two notations.
#[test]
fn overrides_no_request_can_have_are_warnings() {
    let routes = "\
routes:
  - name: a
    upstream: api
    limits:
      - name: l
        algorithm: fixed_window
        limit: 1
        window: 1m
        overrides:
          vip: {limit: 5}
          \"2001:DB8::1\": {limit: 5}
          \"2001:db8:0::1\": {limit: 6}
      - name: m
        algorithm: fixed_window
        key: [ip, header:x-api-key]
        limit: 1
        window: 1m
        overrides:
          \"192.0.2.1\": {limit: 5}
          \"192.0.2.1|gold\": {limit: 5}
";
    assert_eq!(
        warnings(&with_routes(routes)),
        [
            r#"proxy.yaml:14:16: routes[0].limits[0].overrides.vip: matches no request: "vip" is not an IP address (key part ip)"#,
            r#"proxy.yaml:16:28: routes[0].limits[0].overrides["2001:db8:0::1"]: names the same client as "2001:DB8::1"; this one applies"#,
            r#"proxy.yaml:23:24: routes[0].limits[1].overrides["192.0.2.1"]: matches no request: the key has 2 parts: write their values joined by `|` (found 1)"#,
        ]
    );
}

/// Trusting every address (`0.0.0.0/0`, `::/0`) lets any client choose its identity.
#[test]
fn trusting_every_peer_is_a_warning() {
    let text = MINIMAL.replace(
        "listen:",
        "trusted_proxies: [10.0.0.0/8, 0.0.0.0/0, \"::/0\"]\nlisten:",
    );
    assert_eq!(
        warnings(&text),
        [
            r#"proxy.yaml:1:31: trusted_proxies[1]: "0.0.0.0/0" trusts every peer: any client can choose the address it is limited by with X-Forwarded-For; list the proxies in front of tollgate"#,
            r#"proxy.yaml:1:42: trusted_proxies[2]: "::/0" trusts every peer: any client can choose the address it is limited by with X-Forwarded-For; list the proxies in front of tollgate"#,
        ]
    );
}

/// A route path with `;parameters` or an encoded slash never matches under the default `paths`
/// settings, and says so; with the settings that keep them, it matches as written.
#[test]
fn match_paths_the_paths_settings_never_match_are_warnings() {
    let routes = "\
routes:
  - name: params
    upstream: api
    match: {path_prefix: /a;v=1}
  - name: slash
    upstream: api
    match: {path: /b%2Fc}
";
    assert_eq!(
        warnings(&with_routes(routes)),
        [
            r#"proxy.yaml:8:26: routes[0].match.path_prefix: never matches as written: requests are matched on their normalised path, and "/a;v=1" normalises to "/a"; write that"#,
            r#"proxy.yaml:11:19: routes[1].match.path: never matches: requests whose path holds an encoded slash or backslash are refused (paths.escaped_slashes: reject)"#,
        ]
    );
    let kept = format!(
        "paths: {{escaped_slashes: keep, segment_params: keep}}\n{}",
        with_routes(routes)
    );
    assert_eq!(warnings(&kept), Vec::<String>::new());
}

/// `verify: false` is allowed with a warning; so is `tls` on an upstream it cannot apply to.
#[test]
fn unverified_or_unused_upstream_tls_is_a_warning() {
    let text = MINIMAL.replace(
        "    targets: [http://127.0.0.1:8000]\n",
        "    targets: [https://10.0.0.1:8443]\n    tls: {verify: false}\n  plain:\n    targets: [http://10.0.0.2]\n    tls: {server_name: api.internal}\n",
    );
    assert_eq!(
        warnings(&text),
        [
            "proxy.yaml:5:19: upstreams.api.tls.verify: the upstream's certificate is not verified: anyone on the way to it can pose as it and read the traffic; use this only to try things out",
            "proxy.yaml:7:5: upstreams.plain: upstream \"plain\" is not used by any route",
            "proxy.yaml:8:10: upstreams.plain.tls: tls applies to https:// targets only, and this upstream has none",
        ]
    );
}

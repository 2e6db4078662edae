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
    let text = MINIMAL
        .split("routes:")
        .next()
        .expect("has routes")
        .to_owned()
        + routes;
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

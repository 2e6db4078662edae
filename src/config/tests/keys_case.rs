//! `duplicate_key` on a limit and `case_sensitive` on a route's match.

use super::*;
use crate::identity::DuplicateKey;

/// A route on `/v1` with one limit keyed on `key`, with `more` keys.
fn keyed(key: &str, more: &str) -> String {
    with_routes(&format!(
        "routes:\n  - name: r\n    match: {{path_prefix: /v1}}\n    upstream: api\n    limits:\n      - {{name: l, algorithm: token_bucket, rate: 1/s, key: \"{key}\"{more}}}\n"
    ))
}

/// `duplicate_key` is `reject` unless given; `first` and `last` are read.
#[test]
fn duplicate_key_defaults_to_reject() {
    let rule = |more: &str| ok(&keyed("query:key", more)).config.routes[0].limits[0].duplicate_key;
    assert_eq!(rule(""), DuplicateKey::Reject);
    assert_eq!(rule(", duplicate_key: first"), DuplicateKey::First);
    assert_eq!(rule(", duplicate_key: last"), DuplicateKey::Last);
    assert_eq!(rule(", duplicate_key: reject"), DuplicateKey::Reject);
}

/// A bad value names file, line, column and key; a setting on a key without a header or query
/// part is a warning.
#[test]
fn bad_duplicate_key_is_an_error_where_it_stands() {
    assert_eq!(
        problems(&keyed("header:x-api-key", ", duplicate_key: latest")),
        [
            r#"proxy.yaml:10:95: routes[0].limits[0].duplicate_key: expected reject, first or last, found "latest" (did you mean "last"?)"#
        ]
    );
    assert_eq!(
        warnings(&keyed("ip", ", duplicate_key: last")),
        ["proxy.yaml:10:81: routes[0].limits[0].duplicate_key: has no effect: the key reads no header: or query: part"]
    );
    let composite = keyed("ip", ", duplicate_key: last").replace("\"ip\"", "[ip, \"query:k\"]");
    assert_eq!(warnings(&composite), Vec::<String>::new());
}

/// `case_sensitive: false` is read; a case-insensitive prefix makes a later route in another
/// case unreachable; a case-sensitive one does not shadow a later case-insensitive route.
#[test]
fn case_insensitive_prefixes_shadow_other_spellings() {
    let routes = with_routes(
        "routes:\n  - name: api\n    match: {path_prefix: /api/, case_sensitive: false}\n    upstream: api\n  - name: users\n    match: {path_prefix: /API/users}\n    upstream: api\n",
    );
    let loaded = ok(&routes);
    assert!(!loaded.config.routes[0].matcher.case_sensitive);
    assert!(loaded.config.routes[1].matcher.case_sensitive);
    assert_eq!(
        warnings(&routes),
        [
            r#"proxy.yaml:9:5: routes[1]: route "users" can never match: route "api" (routes[0], line 6) comes first and matches every request it would"#
        ]
    );
    let sensitive_first = routes
        .replace("/api/, case_sensitive: false", "/api/")
        .replace("/API/users}", "/api/users, case_sensitive: false}");
    assert_eq!(warnings(&sensitive_first), Vec::<String>::new());
}

/// `case_sensitive` without a path is a warning; so is a prefix holding `%00`, which no
/// request can have.
#[test]
fn case_without_a_path_and_a_nul_prefix_warn() {
    let routes = with_routes(
        "routes:\n  - name: h\n    match: {host: a.example, case_sensitive: false}\n    upstream: api\n  - name: nul\n    match: {path_prefix: /a%00}\n    upstream: api\n",
    );
    assert_eq!(
        warnings(&routes),
        [
            "proxy.yaml:7:46: routes[0].match.case_sensitive: has no effect: the match has no path_prefix or path",
            "proxy.yaml:10:26: routes[1].match.path_prefix: never matches: requests whose path holds %00 are refused",
        ]
    );
}

//! `duplicate_key` on a limit and `case_sensitive` on a route's match.

use super::*;
use crate::identity::DuplicateKey;

/// MINIMAL with `routes` in place of its own.
fn with_routes(routes: &str) -> String {
    MINIMAL
        .split("routes:")
        .next()
        .expect("has routes")
        .to_owned()
        + routes
}

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

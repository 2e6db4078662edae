//! `admin.hosts`, the warning for an open admin listener without a token, and
//! `forwarded_headers`.

use super::*;

/// [`MINIMAL`] with `extra` added at the top level.
fn with(extra: &str) -> String {
    MINIMAL.replace(
        "listen: 0.0.0.0:8080\n",
        &format!("listen: 0.0.0.0:8080\n{extra}"),
    )
}

/// `admin.hosts` takes one name or a list; names are kept lowercase without a trailing dot,
/// and the summary and `/config` show them.
#[test]
fn admin_hosts_are_read_lowercase() {
    let config = ok(&with(
        "admin: {listen: 127.0.0.1:9901, hosts: [Console.Internal., ops.example.com]}\n",
    ))
    .config;
    let admin = config.admin.as_ref().expect("admin");
    assert_eq!(admin.hosts, ["console.internal", "ops.example.com"]);
    assert!(
        config
            .summary()
            .contains("admin: 127.0.0.1:9901, hosts console.internal, ops.example.com"),
        "{}",
        config.summary()
    );
    let json = config.to_json();
    assert_eq!(
        json["admin"]["hosts"],
        serde_json::json!(["console.internal", "ops.example.com"])
    );
    let one = ok(&with(
        "admin: {listen: 127.0.0.1:9901, hosts: console.internal}\n",
    ));
    assert_eq!(one.config.admin.expect("admin").hosts, ["console.internal"]);
}

/// A host with a port, a scheme, a wildcard or nothing at all is an error at its item.
#[test]
fn admin_hosts_must_be_bare_names() {
    let found = problems(&with(
        "admin:\n  listen: 127.0.0.1:9901\n  hosts: [ok.example, \"console:9901\", \"http://x\", \"*.example\", \"\"]\n",
    ));
    let expected = |col: usize, i: usize, text: &str| {
        format!(
            "proxy.yaml:4:{col}: admin.hosts[{i}]: expected a host name such as \
             console.example.com, without port or scheme, found {text:?}"
        )
    };
    assert_eq!(
        found,
        [
            expected(23, 1, "console:9901"),
            expected(39, 2, "http://x"),
            expected(51, 3, "*.example"),
            expected(64, 4, ""),
        ]
    );
}

/// An admin listener off loopback without a token draws a warning at `admin.listen`; on
/// loopback (IPv4 or IPv6), or with a token, it does not.
#[test]
fn an_open_admin_listener_without_a_token_is_a_warning() {
    assert_eq!(
        warnings(&with("admin:\n  listen: 0.0.0.0:9901\n")),
        [
            "proxy.yaml:3:11: admin.listen: 0.0.0.0:9901 is not a loopback address and \
             admin.token is not set: anyone who can reach it can read /api/stats, which names \
             clients; set admin.token, or listen on 127.0.0.1"
        ]
    );
    assert_eq!(warnings(&with("admin: {listen: \"[::]:9901\"}\n")).len(), 1);
    assert_eq!(warnings(&with("admin: {listen: 10.0.0.5:9901}\n")).len(), 1);
    for quiet in [
        "admin: {listen: 127.0.0.1:9901}\n",
        "admin: {listen: 127.0.0.2:9901}\n",
        "admin: {listen: \"[::1]:9901\"}\n",
        "admin: {listen: 0.0.0.0:9901, token: s3cret}\n",
        "admin: {listen: 0.0.0.0:9901, token_file: /run/secrets/t}\n",
    ] {
        assert!(warnings(&with(quiet)).is_empty(), "{quiet}");
    }
}

/// Both identity headers are on by default; each turns off on its own, and the summary
/// says so only when one is off.
#[test]
fn forwarded_headers_default_on_and_turn_off_each() {
    let config = ok(MINIMAL).config;
    assert!(config.forwarded_headers.x_real_ip && config.forwarded_headers.forwarded);
    assert!(!config.summary().contains("forwarded_headers"));
    assert_eq!(
        config.to_json()["forwarded_headers"],
        serde_json::json!({"x_real_ip": true, "forwarded": true})
    );
    let off = ok(&with("forwarded_headers: {x_real_ip: false}\n")).config;
    assert!(!off.forwarded_headers.x_real_ip && off.forwarded_headers.forwarded);
    assert!(
        off.summary()
            .contains("forwarded_headers: x_real_ip left as sent, forwarded set"),
        "{}",
        off.summary()
    );
    assert_eq!(
        problems(&with("forwarded_headers: {real_ip: false}\n")),
        ["proxy.yaml:2:21: forwarded_headers.real_ip: unknown key \"real_ip\" (did you mean \"x_real_ip\"?)"]
    );
}

//! `store.sentinel` and `store.tls`: what they become, their problems, and how they are told
//! back with secrets hidden.

use super::*;
use crate::config::{parse_with, SentinelConfig};

/// [`MINIMAL`] with `store` set to `store` (flow style, one line).
fn with_store(store: &str) -> String {
    MINIMAL.replace(
        "listen: 0.0.0.0:8080\n",
        &format!("listen: 0.0.0.0:8080\nstore: {store}\n"),
    )
}

/// `text` loaded as `load` does: the files it names are read.
fn read(text: &str) -> Result<Loaded, Vec<String>> {
    parse_with(text, "proxy.yaml", &no_env, true).map_err(|e| match e {
        ConfigError::Invalid(problems) => problems.iter().map(ToString::to_string).collect(),
        other => vec![other.to_string()],
    })
}

/// A sentinel section becomes the Sentinel backend with the master's sign-in and database.
#[test]
fn sentinel_reads_master_nodes_and_sign_in() {
    let text = with_store(
        "{sentinel: {master_name: cache, nodes: [\"redis://:sp@10.0.0.1:26379\", \
         redis://10.0.0.2:26379], username: app, password: s3cret, db: 2}}",
    );
    let config = ok(&text).config;
    assert_eq!(
        config.store.backend,
        Backend::Sentinel(SentinelConfig {
            master_name: "cache".into(),
            nodes: vec![
                "redis://:sp@10.0.0.1:26379".into(),
                "redis://10.0.0.2:26379".into()
            ],
            username: Some("app".into()),
            password: Some("s3cret".into()),
            db: 2,
        })
    );
    let summary = config.summary();
    assert!(
        summary.contains(
            "store: redis sentinel cache via redis://:***@10.0.0.1:26379, \
             redis://10.0.0.2:26379, db 2, key_prefix tollgate"
        ),
        "{summary}"
    );
    let json = config.to_json();
    assert_eq!(json["store"]["backend"], "redis");
    assert_eq!(json["store"]["sentinel"]["master_name"], "cache");
    assert_eq!(json["store"]["sentinel"]["password"], "***");
    assert_eq!(json["store"]["sentinel"]["username"], "app");
    let text = json.to_string();
    assert!(!text.contains("s3cret") && !text.contains(":sp@"), "{text}");
}

/// Exactly one of url, cluster and sentinel; a sentinel needs its name and nodes, and nodes
/// that are Sentinels (TCP, no database, one scheme).
#[test]
fn sentinel_problems_are_placed() {
    assert_eq!(
        problems(&with_store(
            "{url: redis://a, sentinel: {master_name: m, nodes: [redis://b:26379]}}"
        )),
        ["proxy.yaml:2:25: store.sentinel: give one of url (one server), cluster or sentinel, not url and sentinel"]
    );
    assert_eq!(
        problems(&with_store("{backend: memory, sentinel: {master_name: m}}")),
        ["proxy.yaml:2:26: store.sentinel: sentinel is only used with backend: redis"]
    );
    assert_eq!(
        problems(&with_store("{sentinel: {db: 1}}")),
        [
            "proxy.yaml:2:19: store.sentinel: missing required key \"master_name\"",
            "proxy.yaml:2:19: store.sentinel: missing required key \"nodes\"",
        ]
    );
    let text = "listen: 0.0.0.0:8080
store:
  sentinel:
    master_name: my master
    nodes:
      - redis://a:26379/3
      - unix:///run/sentinel.sock
      - rediss://c:26379
      - rediss://d:26379#insecure
    username: app
routes: []
";
    assert_eq!(
        problems(text),
        [
            r#"proxy.yaml:4:18: store.sentinel.master_name: expected the name the Sentinels monitor, found "my master""#,
            r#"proxy.yaml:6:9: store.sentinel.nodes[0]: a Sentinel has no databases: give the master's as sentinel.db, and leave /3 out of "redis://a:26379/3""#,
            r#"proxy.yaml:7:9: store.sentinel.nodes[1]: a Sentinel is reached over TCP: expected redis://HOST:PORT or rediss://HOST:PORT, found "unix:///run/sentinel.sock""#,
            r#"proxy.yaml:9:9: store.sentinel.nodes[3]: #insecure does not apply to Sentinels; store.tls.verify: false turns verification off for them and the master: "rediss://d:26379#insecure""#,
            "proxy.yaml:10:15: store.sentinel.username: a username needs a password (Redis's AUTH takes both)",
        ]
    );
    assert_eq!(
        problems(&with_store(
            "{sentinel: {master_name: m, nodes: [redis://a:26379, rediss://b:26379]}}"
        )),
        ["proxy.yaml:2:43: store.sentinel.nodes: every Sentinel URL must use the same scheme: tollgate reaches the master as it reaches them, over TLS with rediss:// or without it with redis://"]
    );
}

/// `store.tls` needs rediss://; cert and key go together.
#[test]
fn tls_problems_are_placed() {
    assert_eq!(
        problems(&with_store(
            "{url: redis://a:6379, tls: {server_name: r.internal}}"
        )),
        [
            r#"proxy.yaml:2:35: store.tls: tls needs rediss:// URLs, and "redis://a:6379" connects without TLS: write rediss:// to connect over TLS, or remove tls"#
        ]
    );
    assert_eq!(
        problems(&with_store(
            "{sentinel: {master_name: m, nodes: [redis://a:26379]}, tls: {verify: false}}"
        )),
        [
            r#"proxy.yaml:2:68: store.tls: tls needs rediss:// URLs, and "redis://a:26379" connects without TLS: write rediss:// to connect over TLS, or remove tls"#
        ]
    );
    assert_eq!(
        problems(&with_store("{tls: {ca: /x.pem}}")),
        ["proxy.yaml:2:9: store.tls: tls is only used with backend: redis"]
    );
    // a Cluster's nodes may share one name
    let named = ok(&with_store(
        "{cluster: [\"rediss://a:7000\"], tls: {server_name: r.internal}}",
    ));
    let tls = named.config.store.tls.expect("tls");
    assert_eq!(tls.server_name.as_deref(), Some("r.internal"));
    assert_eq!(
        problems(&with_store(
            "{url: \"rediss://a:6380\", tls: {cert: /c.pem, server_name: \"no name\"}}"
        )),
        [
            "proxy.yaml:2:38: store.tls: missing required key \"key\": a client certificate (cert) needs its private key",
            r#"proxy.yaml:2:66: store.tls.server_name: expected a DNS name or an IP address, found "no name""#,
        ]
    );
    assert_eq!(
        problems(&with_store("{url: \"rediss://a:6380\", tls: {key: /k.pem}}")),
        ["proxy.yaml:2:38: store.tls: missing required key \"cert\": a private key (key) needs its client certificate"]
    );
}

/// `verify: false` and a `#insecure` URL are allowed, each with a warning at its key; the
/// summary says the certificate is not verified.
#[test]
fn unverified_tls_is_a_warning() {
    let unverified = "the certificate of Redis is not verified: anyone on the way to Redis can \
                      pose as it and read every key; use this only to try things out";
    let text = with_store("{url: \"rediss://a:6380\", tls: {verify: false}}");
    assert_eq!(
        warnings(&text),
        [format!("proxy.yaml:2:47: store.tls.verify: {unverified}")]
    );
    let config = ok(&text).config;
    assert!(
        config.summary().contains(", tls NOT VERIFIED, max_keys"),
        "{}",
        config.summary()
    );
    assert_eq!(config.to_json()["store"]["tls"]["verify"], false);
    let text = with_store("{url: \"rediss://a:6380/0#insecure\"}");
    assert_eq!(
        warnings(&text),
        [format!("proxy.yaml:2:14: store.url: {unverified}")]
    );
}

/// The files are read when the config is loaded: a missing or unusable one is an error at its
/// key, and what was read is kept (a changed file is a changed config).
#[test]
fn tls_files_are_read_and_checked_on_load() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["redis".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_path, key_path) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let missing = dir.path().join("missing.pem");
    let store = |ca: &std::path::Path, cert: &std::path::Path, key: &std::path::Path| {
        with_store(&format!(
            "{{url: \"rediss://a:6380\", tls: {{ca: \"{}\", cert: \"{}\", key: \"{}\"}}}}",
            ca.display(),
            cert.display(),
            key.display()
        ))
    };
    let loaded = read(&store(&cert_path, &cert_path, &key_path)).unwrap();
    let tls = loaded.config.store.tls.unwrap();
    assert_eq!(
        tls.ca.unwrap().contents.unwrap(),
        std::fs::read(&cert_path).unwrap()
    );
    let (cert_file, key_file) = tls.identity.unwrap();
    assert_eq!(cert_file.path, cert_path);
    assert!(key_file.contents.is_some());
    // `parse` reads nothing
    let parsed = ok(&store(&missing, &missing, &missing)).config;
    assert!(parsed.store.tls.unwrap().ca.unwrap().contents.is_none());
    // each problem at its key (the key is looked at once the certificate reads)
    let problems = read(&store(&missing, &key_path, &cert_path)).unwrap_err();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].contains("store.tls.ca: cannot read root certificate")
            && problems[0].contains("missing.pem"),
        "{problems:?}"
    );
    assert!(
        problems[1].contains("store.tls.cert: no certificate found in"),
        "{problems:?}"
    );
    let problems = read(&store(&cert_path, &cert_path, &cert_path)).unwrap_err();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("store.tls.key: no private key found in"),
        "{problems:?}"
    );
    let other = rcgen::KeyPair::generate().unwrap();
    let other_path = dir.path().join("other.pem");
    std::fs::write(&other_path, other.serialize_pem()).unwrap();
    let problems = read(&store(&cert_path, &cert_path, &other_path)).unwrap_err();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("store.tls.key: certificate") && problems[0].contains("do not match"),
        "{problems:?}"
    );
}

/// A reload reads the files again: the same file gives the same store section, a renewed one
/// a different section (so a new store is built with it).
#[test]
fn a_changed_file_changes_the_store_section() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let write_ca = || {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["ca".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(&ca, cert.pem()).unwrap();
    };
    write_ca();
    let text = with_store(&format!(
        "{{url: \"rediss://a:6380\", tls: {{ca: \"{}\"}}}}",
        ca.display()
    ));
    let first = read(&text).unwrap().config.store;
    assert_eq!(read(&text).unwrap().config.store, first);
    write_ca();
    assert_ne!(read(&text).unwrap().config.store, first);
}

//! `algorithm: concurrency` on a limit and `concurrency` on an upstream's `pace`.

use super::*;
use crate::limit::Slots;

fn with_limit(limit: &str) -> String {
    format!("{MINIMAL}    limits:\n      - {limit}\n")
}

fn slots(limit: u32, lease_secs: u64) -> Algorithm {
    let limit = NonZeroU32::new(limit).expect("non-zero");
    Algorithm::Concurrency(Slots::new(limit, Duration::from_secs(lease_secs)).expect("valid"))
}

/// A concurrency limit takes `limit`, and `lease` (10 s by default); `check` and `/config`
/// show both.
#[test]
fn concurrency_takes_limit_and_an_optional_lease() {
    let loaded = ok(&with_limit("{name: c, algorithm: concurrency, limit: 3}"));
    assert_eq!(loaded.config.routes[0].limits[0].algorithm, slots(3, 10));
    assert!(
        loaded
            .config
            .summary()
            .contains("c: concurrency 3 lease 10s"),
        "{}",
        loaded.config.summary()
    );
    let text = with_limit("{name: c, algorithm: concurrency, limit: 3, lease: 2s}");
    let loaded = ok(&text);
    assert_eq!(loaded.config.routes[0].limits[0].algorithm, slots(3, 2));
    let json = loaded.config.to_json();
    let limit = &json["routes"][0]["limits"][0];
    assert_eq!(limit["algorithm"], "concurrency");
    assert_eq!(limit["limit"], 3);
    assert_eq!(limit["lease"], "2s");
    // an override may change the limit and keeps the lease
    let text = with_limit(
        "{name: c, algorithm: concurrency, limit: 3, lease: 2s, overrides: {\"10.0.0.1\": {limit: 9}}}",
    );
    let loaded = ok(&text);
    assert_eq!(
        loaded.config.routes[0].limits[0].overrides[0].1,
        slots(9, 2)
    );
}

/// A lease past 15 s (a dead instance's slots would stay taken too long) or under 1 s is
/// refused where it is written; a rate is not a parameter of concurrency; limit is needed.
#[test]
fn concurrency_refuses_bad_leases_and_foreign_parameters() {
    let text = with_limit("{name: c, algorithm: concurrency, limit: 3, lease: 20s}");
    assert_eq!(
        problems(&text),
        ["proxy.yaml:9:60: routes[0].limits[0].lease: lease must be between 1s and 15s, found 20s"]
    );
    let text = with_limit("{name: c, algorithm: concurrency, limit: 3, lease: 500ms}");
    assert_eq!(problems(&text).len(), 1);
    let text = with_limit("{name: c, algorithm: concurrency, limit: 3, rate: 1/s}");
    let found = problems(&text);
    assert!(
        found[0].contains("rate is not a parameter of concurrency, which takes limit and lease"),
        "{found:?}"
    );
    let text = with_limit("{name: c, algorithm: concurrency}");
    assert!(problems(&text)[0].contains("missing required key \"limit\""));
}

/// `pace: {concurrency: N}` stands alone (no rate needed), with `max_delay`, or beside `rate`.
#[test]
fn pace_concurrency_alone_or_with_a_rate() {
    let upstream = |pace: &str| {
        format!(
            "listen: 0.0.0.0:8080\nupstreams:\n  api:\n    targets: [http://127.0.0.1:8000]\n    \
             pace: {pace}\nroutes:\n  - name: all\n    upstream: api\n"
        )
    };
    let loaded = ok(&upstream("{concurrency: 2, max_delay: 1s}"));
    let u = &loaded.config.upstreams[0];
    assert_eq!(u.pace, None);
    let c = u.concurrency.expect("concurrency");
    assert_eq!(c.slots.limit.get(), 2);
    assert_eq!(c.max_delay, Some(Duration::from_secs(1)));
    assert!(loaded.config.summary().contains("concurrency 2"));
    assert_eq!(
        loaded.config.to_json()["upstreams"][0]["pace"]["concurrency"],
        2
    );
    let loaded = ok(&upstream("{rate: 10/s, max_delay: 1s, concurrency: 4}"));
    let u = &loaded.config.upstreams[0];
    assert!(u.pace.is_some());
    assert_eq!(u.concurrency.expect("concurrency").slots.limit.get(), 4);
    assert!(problems(&upstream("{max_delay: 1s}"))[0].contains("missing required key \"rate\""));
    assert!(problems(&upstream("{concurrency: 0}"))[0].contains("concurrency"));
}

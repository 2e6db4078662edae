//! `upstreams.NAME.pace.adaptive`: defaults, every refusal at its line and column, and the
//! summary and JSON that `check` and `/config` show.

use std::time::Duration;

use super::{ok, problems};

/// An upstream paced adaptively, with `adaptive` written as given (one flow mapping).
fn paced(adaptive: &str) -> String {
    format!(
        "\
listen: 0.0.0.0:8080
upstreams:
  api:
    targets: [http://127.0.0.1:8000]
    pace:
      rate: 100/s
      max_delay: 500ms
      adaptive: {adaptive}
routes:
  - name: all
    upstream: api
"
    )
}

/// Only min and max are needed: the step is 1/200 of max, the factor 0.7, the period 500ms,
/// and no latency target.
#[test]
fn defaults_fill_in_the_steps() {
    let loaded = ok(&paced("{min: 1/s, max: 200/s}"));
    let a = loaded.config.upstreams[0].adaptive.expect("adaptive");
    assert_eq!(a.aimd.start().per_sec(), 100.0);
    assert_eq!(a.aimd.min().per_sec(), 1.0);
    assert_eq!(a.aimd.max().per_sec(), 200.0);
    assert_eq!(a.aimd.increase(), 1.0);
    assert_eq!(a.aimd.decrease(), 0.7);
    assert_eq!(a.aimd.period_ms(), 500.0);
    assert_eq!(a.target_latency, None);
}

/// Every key set; `check` and `/config` show them as written.
#[test]
fn every_key_is_read_and_shown() {
    let text = paced(
        "{min: 5/m, max: 10/m, increase: 1/m, decrease: 0.5, interval: 1s, target_latency: 300ms}",
    )
    .replace("rate: 100/s", "rate: 6/m");
    let loaded = ok(&text);
    let a = loaded.config.upstreams[0].adaptive.expect("adaptive");
    assert_eq!(a.aimd.increase(), 1.0 / 60.0);
    assert_eq!(a.aimd.decrease(), 0.5);
    assert_eq!(a.aimd.period_ms(), 1000.0);
    assert_eq!(a.target_latency, Some(Duration::from_millis(300)));
    let summary = loaded.config.summary();
    assert!(
        summary.contains(
            "pace 6/m max_delay 500ms; adaptive 5/m..10/m +1/m x0.5 per 1s target_latency 300ms"
        ),
        "{summary}"
    );
    let json = loaded.config.to_json();
    let shown = &json["upstreams"][0]["pace"]["adaptive"];
    assert_eq!(shown["min"], "5/m");
    assert_eq!(shown["max"], "10/m");
    assert_eq!(shown["increase"], "1/m");
    assert_eq!(shown["decrease"], 0.5);
    assert_eq!(shown["interval"], "1s");
    assert_eq!(shown["target_latency"], "300ms");
    let plain = ok(&paced("{min: 1/s, max: 200/s}")).config.to_json();
    assert_eq!(
        plain["upstreams"][0]["pace"]["adaptive"]["target_latency"],
        serde_json::Value::Null
    );
}

/// Each mistake is named at its own line and column, with its key path.
#[test]
fn refusals_name_the_key() {
    let cases = [
        (
            "{min: 1/s}",
            "proxy.yaml:8:17: upstreams.api.pace.adaptive: missing required key \"max\"",
        ),
        (
            "{min: 50/s, max: 20/s}",
            "proxy.yaml:8:34: upstreams.api.pace.adaptive.max: max 20/s is below min 50/s",
        ),
        (
            "{min: 1/s, max: 50/s}",
            "proxy.yaml:6:13: upstreams.api.pace.rate: rate 100/s must lie between adaptive.min 1/s and adaptive.max 50/s",
        ),
        (
            "{min: 1/s, max: 200/s, decrease: 1.5}",
            "proxy.yaml:8:50: upstreams.api.pace.adaptive.decrease: decrease must be greater than 0 and less than 1, found 1.5",
        ),
        (
            "{min: 1/s, max: 200/s, decrease: 0}",
            "upstreams.api.pace.adaptive.decrease: decrease must be greater than 0 and less than 1, found 0",
        ),
        (
            "{min: 1/s, max: 200/s, increase: fast}",
            "proxy.yaml:8:50: upstreams.api.pace.adaptive.increase: expected N/unit such as 10/s, found \"fast\"",
        ),
        (
            "{min: 1/s, max: 200/s, interval: 0s}",
            "proxy.yaml:8:50: upstreams.api.pace.adaptive.interval: must be greater than zero",
        ),
        (
            "{min: 1/s, max: 200/s, target_latency: 0ms}",
            "upstreams.api.pace.adaptive.target_latency: must be greater than zero",
        ),
        (
            "{min: 1/s, max: 200/s, step: 2/s}",
            "upstreams.api.pace.adaptive.step: unknown key",
        ),
    ];
    for (adaptive, want) in cases {
        let got = problems(&paced(adaptive));
        assert!(
            got.iter().any(|p| p.contains(want)),
            "{adaptive}: want {want:?}, got {got:?}"
        );
    }
}

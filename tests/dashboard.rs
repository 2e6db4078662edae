//! The dashboard at `/` of the admin listener, in a real headless Chromium and a real headless
//! Firefox, against two tollgates sharing a real Redis: it asks for the token, shows this
//! instance's traffic and the client a limit refuses most, resets that client on every
//! instance, and switches to the fleet's figures, which list both instances.

mod common;
common::both_http1_clients!();

use std::time::Duration;

use common::browser::{Browser, Page, ENTER};
use common::firefox::Firefox;
use common::{eventually, get, Proxy, Redis, Upstream, Yaml};

/// How long the page may take to show something: it asks once a second, and the machine may
/// be busy.
const SHOWN_WITHIN: Duration = Duration::from_secs(10);

/// The text of the requests/s cell of route `api`, or `null`.
const API_RPS: &str = "const row = [...document.querySelectorAll('#routes tbody tr')]
    .find((tr) => tr.dataset.key === 'api');
  return row ? row.querySelector('.rps').textContent : null;";

/// The button of the greedy client among the clients refused most, or `null`.
const GREEDY: &str = "return [...document.querySelectorAll('#limits button.client')]
    .find((b) => b.textContent.startsWith('%ip=127.0.0.1 (')) || null;";

/// The value the lookup shows for `Allowed now`, or `null`.
const ALLOWED_NOW: &str = "const dt = [...document.querySelectorAll('#lookup-result dt')]
    .find((d) => d.textContent === 'Allowed now');
  return dt ? dt.nextElementSibling.textContent : null;";

const LOGIN_SHOWN: &str = "return !document.getElementById('login').hidden;";
const TOKEN_INPUT: &str = "return document.getElementById('token');";

/// A task that is aborted when this is dropped: traffic stops when the test ends, or fails.
struct Background(tokio::task::JoinHandle<()>);

impl Drop for Background {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Requests from new clients, each let through, every 20 ms until aborted: traffic for the
/// rates to show.
async fn visitors(url: String) {
    for i in 0u64.. {
        get(&url, &[("x-client", &format!("visitor-{i}"))]).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// In Chromium, through the page of instance A, as an operator uses it: a wrong token is
/// refused and the right one kept; the route and the refused client show; the rates move;
/// looking the client up and pressing reset lets it through instance B. The browser logs no
/// error on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_the_dashboard_shows_the_traffic_and_resets_a_client_everywhere() {
    an_operator_resets_the_client_refused_most(Browser::start().await).await;
}

/// The same in Firefox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_firefox_the_dashboard_shows_the_traffic_and_resets_a_client_everywhere() {
    an_operator_resets_the_client_refused_most(Firefox::start().await).await;
}

/// The scale beside route api's sparkline, once it is above zero, or `null`.
const SPARK_SCALE: &str = "const row = [...document.querySelectorAll('#routes tbody tr')]
    .find((tr) => tr.dataset.key === 'api');
  const scale = row && row.querySelector('.spark-scale');
  return scale && scale.textContent !== 'max 0/s' ? scale.textContent : null;";

/// Every time the page shows, and the times it would show for another day and for a reload:
/// `[shown, started, updated, other day]`.
const TIMES: &str = "const dd = (name) => [...document.querySelectorAll('#store dt')]
    .find((d) => d.textContent === name).nextElementSibling.textContent;
  const status = document.getElementById('status').textContent;
  return [dd('Started'), status.replace(/^Updated (.*)\\.$/, '$1'),
    clock(new Date('Sun, 06 Nov 1994 08:49:37 GMT'))];";

/// One time format: the operator's local time with its zone (`12:00:50 CET`, `12:00:50
/// UTC+1`), a date first on another day; no `PM`, no `GMT`.
async fn the_page_writes_every_time_one_way(browser: &impl Page) {
    let times = browser.run(TIMES).await;
    let times: Vec<&str> = times
        .as_array()
        .expect("an array")
        .iter()
        .map(|t| t.as_str().expect("a string"))
        .collect();
    let zone = |z: &str| {
        z.strip_prefix("UTC").is_some_and(|off| {
            off.is_empty()
                || (off.starts_with(['+', '-'])
                    && off[1..].chars().all(|c| c.is_ascii_digit() || c == ':'))
        }) || (z.len() >= 2 && z.chars().all(|c| c.is_ascii_alphabetic()) && z != "GMT")
    };
    let hms = |t: &str| {
        t.len() == 8
            && t.char_indices().all(|(i, c)| {
                if i == 2 || i == 5 {
                    c == ':'
                } else {
                    c.is_ascii_digit()
                }
            })
    };
    for (i, time) in times.iter().enumerate() {
        let mut words: Vec<&str> = time.split(' ').collect();
        if i == 2 {
            assert_eq!(words.len(), 3, "another day has its date: {time:?}");
            assert_eq!(words.remove(0), "1994-11-06", "{time:?}");
        }
        assert!(
            words.len() == 2 && hms(words[0]) && zone(words[1]),
            "not HH:MM:SS ZONE: {time:?} in {times:?}"
        );
    }
}

/// The steps both tests above take in their browser.
async fn an_operator_resets_the_client_refused_most(browser: impl Page) {
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    // two limits, so that each instance remembers refusals (the deny cache), as in
    // tests/console.rs
    let limits = "limits:\n  - {name: per-client, algorithm: token_bucket, key: header:x-client, \
                  rate: 1/h, burst: 2}\n  - {name: wide, algorithm: fixed_window, key: \
                  header:x-client, limit: 1000, window: 1h}";
    let yaml = Yaml::to(&[upstream.url()])
        .top("admin: {listen: 127.0.0.1:0, token: s3cret}")
        .redis(&redis, "timeout: 500ms")
        .upstream("pace: {rate: 200/s, max_delay: 1s, adaptive: {min: 1/s, max: 200/s}}")
        .route("api", "/", limits)
        .build();
    let (a, b) = (Proxy::start(&yaml).await, Proxy::start(&yaml).await);
    // sends no key, so it is shown as `%ip=127.0.0.1`: the page must encode the `%` it looks up
    let greedy: [(&str, &str); 0] = [];
    for expected in [200, 200, 429, 429, 429] {
        assert_eq!(get(&a.url("/"), &greedy).await.status, expected);
    }
    assert_eq!(get(&b.url("/"), &greedy).await.status, 429);
    let traffic = Background(tokio::spawn(visitors(a.url("/"))));

    let page = format!("http://{}/", a.admin.expect("an admin listener"));
    browser.open(&page).await;
    browser
        .wait_for("the token prompt", SHOWN_WITHIN, LOGIN_SHOWN)
        .await;
    browser
        .type_into(TOKEN_INPUT, &format!("wrong{ENTER}"))
        .await;
    let refused = "return !document.getElementById('login').hidden
        && document.getElementById('login-note').textContent.includes('refused');";
    browser
        .wait_for("that the wrong token was refused", SHOWN_WITHIN, refused)
        .await;
    browser
        .type_into(TOKEN_INPUT, &format!("s3cret{ENTER}"))
        .await;
    browser.wait_for("route api", SHOWN_WITHIN, API_RPS).await;
    let kept = browser
        .run("return sessionStorage.getItem('tollgate.admin.token');")
        .await;
    assert_eq!(kept, "s3cret");
    assert_eq!(browser.run(LOGIN_SHOWN).await, false);

    let shown = browser
        .wait_for(
            "greedy among the clients refused most",
            SHOWN_WITHIN,
            GREEDY,
        )
        .await;
    assert!(shown.is_object(), "an element: {shown}");
    let text = browser
        .run(&format!("return (() => {{ {GREEDY} }})().textContent;"))
        .await;
    assert_eq!(text, "%ip=127.0.0.1 (3)", "refused 3 times by a");

    // the first ask started the sampling: the rate starts at 0 and moves with the traffic
    let first = browser.run(API_RPS).await;
    let moved = format!(
        "const now = (() => {{ {API_RPS} }})();
         return now !== {first} && now !== '0' ? now : null;"
    );
    browser
        .wait_for("the rate of route api move", SHOWN_WITHIN, &moved)
        .await;
    // the upstream's pace rate, marked adaptive
    let pace = "const row = [...document.querySelectorAll('#upstreams tbody tr')]
        .find((tr) => tr.dataset.key === 'api');
      const cell = row && row.children[2].textContent;
      return cell === '200/s adaptive' ? cell : null;";
    browser
        .wait_for("the adaptive pace rate of upstream api", SHOWN_WITHIN, pace)
        .await;
    let sparkline = "return document.querySelector('#routes tbody svg.spark polyline')
        .getAttribute('points').split(' ').length >= 2;";
    browser
        .wait_for("a sparkline of route api", SHOWN_WITHIN, sparkline)
        .await;
    let scale = browser
        .wait_for(
            "the scale of route api's sparkline",
            SHOWN_WITHIN,
            SPARK_SCALE,
        )
        .await;
    assert!(
        scale
            .as_str()
            .is_some_and(|s| s.starts_with("max ") && s.ends_with("/s")),
        "{scale}"
    );
    the_page_writes_every_time_one_way(&browser).await;

    browser.click(GREEDY).await;
    let state = browser
        .wait_for("greedy's state", SHOWN_WITHIN, ALLOWED_NOW)
        .await;
    assert_eq!(state, "no");
    let filled = browser
        .run(
            "return ['route', 'limit', 'client']
                .map((f) => document.getElementById(`lookup-${f}`).value);",
        )
        .await;
    assert_eq!(
        filled,
        serde_json::json!(["api", "per-client", "%ip=127.0.0.1"])
    );
    browser
        .click("return document.getElementById('lookup-reset');")
        .await;
    browser
        .wait_for(
            "that the reset was made",
            SHOWN_WITHIN,
            "return document.querySelector('#lookup-result .reset-done')?.textContent;",
        )
        .await;
    assert_eq!(browser.run(ALLOWED_NOW).await, "yes");
    // b hears of the reset within its next reading of the count, twice a second
    eventually(Duration::from_secs(5), || async {
        get(&b.url("/"), &greedy).await.status == 200
    })
    .await;
    the_switch_shows_the_fleet(&browser, &a, &b).await;
    drop(traffic);

    // The browser logs each 401 it gets as a failed load: the page asks for the token then.
    let errors: Vec<String> = browser
        .console_errors()
        .await
        .into_iter()
        .filter(|e| !(e.contains("/api/stats") && e.contains("status of 401")))
        .collect();
    assert!(errors.is_empty(), "the browser logged errors: {errors:#?}");
    browser.quit().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// The ids the instances table lists, once it lists two, or `null`.
const TWO_INSTANCES: &str = "const section = document.getElementById('instances');
  const ids = [...section.querySelectorAll('tbody tr')].map((tr) => tr.dataset.key).sort();
  return !section.hidden && ids.length === 2 ? ids : null;";

/// The switch set to "the fleet" lists both instances and says whose the figures are; set
/// back to "this instance", the list goes.
async fn the_switch_shows_the_fleet(browser: &impl Page, a: &Proxy, b: &Proxy) {
    let id = |proxy: &Proxy| {
        let url = format!(
            "http://{}/api/stats",
            proxy.admin.expect("an admin listener")
        );
        async move {
            let answer = get(&url, &[("authorization", "Bearer s3cret")]).await;
            let stats: serde_json::Value = serde_json::from_str(&answer.body).expect("JSON");
            stats["instance"]["id"].as_str().expect("an id").to_owned()
        }
    };
    let mut ids = vec![id(a).await, id(b).await];
    ids.sort();
    assert_eq!(
        browser
            .run("return document.getElementById('instances').hidden;")
            .await,
        true
    );
    browser
        .click("return document.querySelector('#view input[value=fleet]');")
        .await;
    let shown = browser
        .wait_for("the fleet's two instances", SHOWN_WITHIN, TWO_INSTANCES)
        .await;
    assert_eq!(shown, serde_json::json!(ids));
    let scope = browser
        .run("return document.getElementById('scope').textContent;")
        .await;
    assert!(
        scope
            .as_str()
            .is_some_and(|s| s.contains("the fleet's: 2 instance")),
        "{scope}"
    );
    browser
        .wait_for("route api in the fleet", SHOWN_WITHIN, API_RPS)
        .await;
    browser
        .click("return document.querySelector('#view input[value=instance]');")
        .await;
    browser
        .wait_for(
            "this instance's figures again",
            SHOWN_WITHIN,
            "return document.getElementById('instances').hidden
                && document.getElementById('scope').textContent.includes('this instance');",
        )
        .await;
}

/// The route names of the rows the routes table shows, and its position line.
const ROUTES_SHOWN: &str = "return [
    [...document.querySelectorAll('#routes tbody tr')].map((tr) => tr.dataset.key ?? ''),
    document.querySelector('#routes .pager span').textContent,
  ];";

/// At 1 000 routes the routes table shows one page of 25, turns to the next, and finds one
/// route by its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_routes_are_paged_and_searched() {
    let browser = Browser::start().await;
    let upstream = Upstream::start().await;
    let yaml = (0..1000)
        .fold(Yaml::to(&[upstream.url()]), |yaml, i| {
            yaml.route(&format!("route-{i:04}"), &format!("/r{i}"), "")
        })
        .top("admin: {listen: 127.0.0.1:0}")
        .build();
    let proxy = Proxy::start(&yaml).await;
    browser
        .open(&format!(
            "http://{}/",
            proxy.admin.expect("an admin listener")
        ))
        .await;
    let first = browser
        .wait_for(
            "the first page of routes",
            SHOWN_WITHIN,
            &format!("const [rows, at] = (() => {{ {ROUTES_SHOWN} }})(); return rows.length > 1 ? [rows, at] : null;"),
        )
        .await;
    let rows = first[0].as_array().expect("rows");
    assert_eq!(rows.len(), 25, "one page: {rows:?}");
    assert_eq!(first[1], "1–25 of 1000");

    browser
        .click("return document.querySelector('#routes .pager button:last-child');")
        .await;
    let second = browser.run(ROUTES_SHOWN).await;
    assert_eq!(second[1], "26–50 of 1000");
    assert!(
        second[0]
            .as_array()
            .is_some_and(|r| r.len() == 25 && !r.contains(&rows[0])),
        "another page: {second}"
    );

    browser
        .type_into(
            "return document.querySelector('#routes input.filter');",
            "route-0777",
        )
        .await;
    let found = browser.run(ROUTES_SHOWN).await;
    assert_eq!(found, serde_json::json!([["route-0777"], "1–1 of 1"]));
    assert!(browser.console_errors().await.is_empty());
    browser.quit().await;
    proxy.shutdown().await;
}

/// The contrast ratios (WCAG 2: from 1 to 21) of the page's text on its background and of a
/// table heading's muted text on its card, and the background's relative luminance.
const CONTRAST: &str = "const rgb = (css) => css.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const luminance = (css) => {
    const [r, g, b] = rgb(css).map((c) => {
      c /= 255;
      return c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const ratio = (a, b) => {
    const [x, y] = [luminance(a), luminance(b)].sort((p, q) => q - p);
    return (x + 0.05) / (y + 0.05);
  };
  const body = getComputedStyle(document.body);
  const card = getComputedStyle(document.querySelector('section'));
  const th = getComputedStyle(document.querySelector('section th'));
  return [ratio(body.color, body.backgroundColor), ratio(th.color, card.backgroundColor),
    luminance(body.backgroundColor)];";

/// In light and in dark mode the page's text and its muted headings stand out from their
/// background by at least WCAG's 4.5:1, and dark mode is dark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_reads_well_in_light_and_dark_mode() {
    let browser = Browser::start().await;
    let upstream = Upstream::start().await;
    let yaml = Yaml::to(&[upstream.url()])
        .top("admin: {listen: 127.0.0.1:0}")
        .route("api", "/", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    browser
        .open(&format!(
            "http://{}/",
            proxy.admin.expect("an admin listener")
        ))
        .await;
    browser.wait_for("route api", SHOWN_WITHIN, API_RPS).await;
    let mut backgrounds = Vec::new();
    for dark in [false, true] {
        browser.color_scheme(dark).await;
        let got = browser.run(CONTRAST).await;
        let [text, muted, background] = [0, 1, 2].map(|i| got[i].as_f64().expect("a number"));
        assert!(text >= 4.5, "text contrast {text:.1} (dark: {dark})");
        assert!(
            muted >= 4.5,
            "muted text contrast {muted:.1} (dark: {dark})"
        );
        backgrounds.push(background);
    }
    assert!(
        backgrounds[1] < 0.05 && backgrounds[0] > 0.8,
        "light, then dark backgrounds: {backgrounds:?}"
    );
    assert!(browser.console_errors().await.is_empty());
    browser.quit().await;
    proxy.shutdown().await;
}

/// Requests to `url` from `clients` in turn, about `per_second` a second, rising and falling
/// over a few seconds so that the sparklines have a shape, until aborted.
async fn load(url: String, clients: &'static [&'static str], per_second: f64) {
    let start = std::time::Instant::now();
    for i in 0usize.. {
        let swing = 1.0 + 0.6 * (start.elapsed().as_secs_f64() / 5.0).sin();
        let url = url.clone();
        let client = clients[i % clients.len()];
        // not awaited: a paced request's wait must not slow the others
        tokio::spawn(async move { get(&url, &[("x-client", client)]).await });
        tokio::time::sleep(Duration::from_secs_f64(1.0 / (per_second * swing))).await;
    }
}

/// Not a check: makes `docs/console.png`, the dashboard of an instance with a few routes under
/// traffic. `scripts/screenshot` runs it: run that when the page changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "makes docs/console.png; run by hand"]
async fn screenshot_for_the_docs() {
    let browser = Browser::start().await;
    let redis = Redis::start();
    let upstream = Upstream::start().await;
    let per_client = "{name: per-client, algorithm: token_bucket, key: header:x-client, \
                      rate: 5/s, burst: 10}";
    let yaml = Yaml::to(&[upstream.url()])
        .top("admin: {listen: 127.0.0.1:0, token: s3cret}")
        .redis(&redis, "timeout: 500ms")
        .upstream("pace: {rate: 40/s, max_delay: 2s}")
        .also_upstream("search", &[upstream.url()], "")
        .also_upstream(
            "reports",
            &[upstream.url()],
            "pace: {rate: 10/s, max_delay: 1s}",
        )
        .route("checkout", "/checkout", &format!("limits: [{per_client}]"))
        .route_to(
            "search",
            "/search",
            "search",
            "limits:\n  - {name: per-client, algorithm: sliding_window, key: header:x-client, \
             limit: 40, window: 10s}\n  - {name: strict-trial, algorithm: \
             sliding_window_counter, key: header:x-client, limit: 20, window: 10s, mode: shadow}",
        )
        .route(
            "login",
            "/login",
            "limits: [{name: per-client, algorithm: fixed_window, key: header:x-client, \
             limit: 5, window: 1m}]",
        )
        .route_to("reports", "/reports", "reports", "strip_prefix: true")
        .route_to("static", "/", "search", "")
        .build();
    let proxy = Proxy::start(&yaml).await;
    let height = std::env::var("SCREENSHOT_HEIGHT").map_or(800, |h| h.parse().unwrap());
    browser.viewport(1280, height).await;
    browser
        .open(&format!("http://{}/", proxy.admin.expect("admin")))
        .await;
    browser
        .type_into(TOKEN_INPUT, &format!("s3cret{ENTER}"))
        .await;
    const SHOPPERS: &[&str] = &[
        "203.0.113.4",
        "203.0.113.9",
        "198.51.100.23",
        "198.51.100.23",
    ];
    const SEARCHERS: &[&str] = &["203.0.113.4", "acme-batch-7", "acme-batch-7", "192.0.2.55"];
    let traffic = [
        load(proxy.url("/checkout/cart"), SHOPPERS, 24.0),
        load(proxy.url("/search?q=x"), SEARCHERS, 14.0),
        load(proxy.url("/login"), &["203.0.113.66", "192.0.2.10"], 2.0),
        load(proxy.url("/reports/daily"), &["192.0.2.10"], 3.0),
        load(proxy.url("/static/app.js"), &["203.0.113.4"], 8.0),
    ]
    .map(|load| Background(tokio::spawn(load)));
    tokio::time::sleep(Duration::from_secs(30)).await;
    // the reports backend asks for a rest: the page offers to lift the hold
    get(&proxy.url("/reports/status/429?retry_after=120"), &[]).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let refused = "return [...document.querySelectorAll('#limits button.client')]
        .find((b) => b.textContent.startsWith('198.51.100.23')) || null;";
    browser.click(refused).await;
    browser
        .wait_for("the client's state", SHOWN_WITHIN, ALLOWED_NOW)
        .await;
    browser.run("window.scrollTo(0, 0);").await;
    let png = browser.screenshot().await;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/console.png");
    std::fs::write(&path, png).expect("write docs/console.png");
    drop(traffic);
    browser.quit().await;
    proxy.shutdown().await;
}

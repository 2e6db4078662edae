//! Each script in `lua/` run by hand as its header shows it, `redis-cli --eval lua/X.lua KEY ,
//! ARGS`, against a real Redis: the edge cases beyond the docs' examples. The examples that
//! docs/algorithms.md shows run as they are written, in tests/docs_examples.rs.

mod common;

use common::Redis;

/// `redis-cli --eval lua/SCRIPT KEY , ARGS...` from the crate root; the reply's lines.
fn eval(redis: &Redis, script: &str, key: &str, args: &[&str]) -> Vec<String> {
    let path = format!("{}/lua/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut cli_args = vec!["--eval", path.as_str(), key, ","];
    cli_args.extend_from_slice(args);
    redis.cli(&cli_args).lines().map(str::to_string).collect()
}

/// Several keys in one call: each decided as by a call of its own, one reply each, in order; a
/// key holding another type is a new bucket, and the others are decided (and counted once) as
/// usual.
#[test]
fn token_bucket_several_keys_by_hand() {
    let redis = Redis::start();
    redis.cli(&["HSET", "tollgate:demo:hash", "f", "v"]);
    let path = format!("{}/lua/token_bucket.lua", env!("CARGO_MANIFEST_DIR"));
    let now = "1700000000000";
    let run = || -> Vec<String> {
        let keys = [
            "tollgate:demo:erin",
            "tollgate:demo:hash",
            "tollgate:demo:frank",
        ];
        let mut args = vec!["--eval", path.as_str()];
        args.extend(keys);
        args.extend([",", "10", "3", "1", now]);
        redis
            .cli(&args)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    };
    // the hash (left by another algorithm) is a new bucket, like the others
    let first = run();
    assert_eq!(first, ["1", "2", "0", "100"].repeat(3), "{first:?}");
    assert_eq!(redis.cli(&["type", "tollgate:demo:hash"]), "string");
    let second = run();
    assert_eq!(second, ["1", "1", "0", "200"].repeat(3), "{second:?}");
}

/// The token bucket run by hand admits `burst`, then denies with the wait for one token.
#[test]
fn token_bucket_by_hand() {
    let redis = Redis::start();
    let now = "1700000000000";
    for i in 0..3 {
        let remaining = (2 - i).to_string();
        assert_eq!(
            eval(
                &redis,
                "token_bucket.lua",
                "tollgate:demo:alice",
                &["10", "3", "1", now]
            ),
            ["1", remaining.as_str(), "0", &((i + 1) * 100).to_string()]
        );
    }
    assert_eq!(
        eval(
            &redis,
            "token_bucket.lua",
            "tollgate:demo:alice",
            &["10", "3", "1", now]
        ),
        ["0", "0", "100", "300"]
    );
    // a refusal of a costly request tells the tokens still held: a cost of 3 after 10-3-3-3
    // finds one token, and 100 ms later (one more token) two
    for (left, at) in [("7", now), ("4", now), ("1", now)] {
        assert_eq!(
            eval(
                &redis,
                "token_bucket.lua",
                "tollgate:demo:erin",
                &["10", "10", "3", at]
            )[..2],
            ["1", left]
        );
    }
    assert_eq!(
        eval(
            &redis,
            "token_bucket.lua",
            "tollgate:demo:erin",
            &["10", "10", "3", now]
        ),
        ["0", "1", "200", "900"]
    );
    assert_eq!(
        eval(
            &redis,
            "token_bucket.lua",
            "tollgate:demo:erin",
            &["10", "10", "3", "1700000000100"]
        ),
        ["0", "2", "100", "800"]
    );
    // a limit raised by a reload: the bucket written at 1/m (two minutes ahead) is empty
    // under 100/s with a burst of 100, not two minutes in debt
    let frank = |args: &[&str]| eval(&redis, "token_bucket.lua", "tollgate:demo:frank", args);
    assert_eq!(frank(&["0.0166667", "2", "2", now])[..2], ["1", "0"]);
    assert_eq!(frank(&["100", "100", "1", now]), ["0", "0", "10", "1000"]);
    assert_eq!(
        frank(&["100", "100", "1", "1700000000010"])[..2],
        ["1", "0"]
    );
    // the shape of the documented line: no cost, no now (the server clock)
    let live = eval(
        &redis,
        "token_bucket.lua",
        "tollgate:demo:bob",
        &["1", "20"],
    );
    assert_eq!(live, ["1", "19", "0", "1000"]);
    // (read at once: the key lives a second)
    let bob_ttl: i64 = redis.cli(&["pttl", "tollgate:demo:bob"]).parse().unwrap();
    // past a million tokens a second a token is worth less than the script's 1 µs allowance:
    // the count left still stays within the bucket
    let huge = || {
        eval(
            &redis,
            "token_bucket.lua",
            "tollgate:demo:carol",
            &["100000000", "10", "1", now],
        )
    };
    assert_eq!(huge()[..2], ["1", "9"]);
    let second: u64 = huge()[1].parse().unwrap();
    assert!(
        second <= 9,
        "{second} tokens left in a bucket of 10 after two requests"
    );
    // and a cost above the burst, admitted within that allowance, leaves none (not -1)
    let over = eval(
        &redis,
        "token_bucket.lua",
        "tollgate:demo:dave",
        &["100000000", "1", "2", now],
    );
    assert_eq!(over[..2], ["1", "0"]);
    assert!(
        (1..=1000).contains(&bob_ttl),
        "the key expires when the bucket is full again: {bob_ttl}"
    );
    // on the caller's time the key is kept 10 s longer (Redis runs the expiry on its own
    // clock, and a caller's time may lag it): alice's bucket is full again 300 ms after `now`
    let ttl: i64 = redis.cli(&["pttl", "tollgate:demo:alice"]).parse().unwrap();
    assert!(
        (5_000..=10_300).contains(&ttl),
        "a caller-clock key's expiry: {ttl}"
    );
}

/// The leaky bucket run by hand hands out slots 1/rate apart, as decimal strings.
#[test]
fn leaky_bucket_by_hand() {
    let redis = Redis::start();
    let now = "1700000000000.5";
    let d: Vec<Vec<String>> = (0..4)
        .map(|_| {
            eval(
                &redis,
                "leaky_bucket.lua",
                "tollgate:pace:api",
                &["4", "600", now],
            )
        })
        .collect();
    assert_eq!(d[0], ["1", "0.000"]);
    assert_eq!(d[1], ["1", "250.000"]);
    assert_eq!(d[2], ["1", "500.000"]);
    assert_eq!(d[3], ["0", "750.000"], "past max_delay: refused");
    assert_eq!(
        eval(
            &redis,
            "leaky_bucket.lua",
            "tollgate:pace:api",
            &["3", "", "1700000000750.5"]
        ),
        ["1", "0.000"]
    );
    assert_eq!(
        eval(
            &redis,
            "leaky_bucket.lua",
            "tollgate:pace:api",
            &["3", "", "1700000000750.5"]
        ),
        ["1", "333.333"]
    );
    // the documented line: server clock
    assert_eq!(
        eval(
            &redis,
            "leaky_bucket.lua",
            "tollgate:pace:web",
            &["4", "1000"]
        ),
        ["1", "0.000"]
    );
}

/// The fixed window run by hand counts to the limit and reports the aligned window's end.
#[test]
fn fixed_window_by_hand() {
    let redis = Redis::start();
    let at = |ms: u64| (1_700_000_040_000u64 + ms).to_string();
    assert_eq!(
        eval(&redis, "fixed_window.lua", "k", &["3", "60000", &at(0)]),
        ["1", "2", "0", "60000"]
    );
    assert_eq!(
        eval(
            &redis,
            "fixed_window.lua",
            "k",
            &["3", "60000", &at(10_000)]
        ),
        ["1", "1", "0", "50000"]
    );
    assert_eq!(
        eval(
            &redis,
            "fixed_window.lua",
            "k",
            &["3", "60000", &at(20_000)]
        ),
        ["1", "0", "0", "40000"]
    );
    assert_eq!(
        eval(
            &redis,
            "fixed_window.lua",
            "k",
            &["3", "60000", &at(59_999)]
        ),
        ["0", "0", "1", "1"]
    );
    assert_eq!(
        eval(
            &redis,
            "fixed_window.lua",
            "k",
            &["3", "60000", &at(60_000)]
        ),
        ["1", "2", "0", "60000"]
    );
    assert_eq!(
        eval(&redis, "fixed_window.lua", "live", &["3", "60000"])[..3],
        ["1", "2", "0"]
    );
}

/// The sliding window run by hand counts requests of the same millisecond separately.
#[test]
fn sliding_window_by_hand() {
    let redis = Redis::start();
    let now = "1700000000000";
    for left in ["2", "1", "0"] {
        assert_eq!(
            eval(&redis, "sliding_window.lua", "k", &["3", "60000", now]),
            ["1", left, "0", "60000"]
        );
    }
    assert_eq!(
        eval(&redis, "sliding_window.lua", "k", &["3", "60000", now]),
        ["0", "0", "60000", "60000"]
    );
    assert_eq!(
        redis.cli(&["zcard", "k"]),
        "3",
        "three members for three requests in one ms; the denial is not logged"
    );
    assert_eq!(
        eval(
            &redis,
            "sliding_window.lua",
            "k",
            &["3", "60000", "1700000060000"]
        ),
        ["1", "2", "0", "60000"]
    );
}

/// The sliding-window counter run by hand weighs the previous window.
#[test]
fn sliding_window_counter_by_hand() {
    let redis = Redis::start();
    let start = 1_700_000_040_000u64; // a multiple of 60000
    for _ in 0..3 {
        assert_eq!(
            eval(
                &redis,
                "sliding_window_counter.lua",
                "k",
                &["3", "60000", &start.to_string()]
            )[0],
            "1"
        );
    }
    // 30 s into the next window, half of the previous 3 still count: 1.5 + 1 <= 3
    let mid = (start + 90_000).to_string();
    assert_eq!(
        eval(
            &redis,
            "sliding_window_counter.lua",
            "k",
            &["3", "60000", &mid]
        ),
        ["1", "0", "0", "30000"]
    );
    // now 1.5 + 1 + 1 > 3: admitted once 3 * (60000 - e) / 60000 <= 1, at e = 40000
    assert_eq!(
        eval(
            &redis,
            "sliding_window_counter.lua",
            "k",
            &["3", "60000", &mid]
        ),
        ["0", "0", "10000", "30000"]
    );
}

/// The back-pressure script run by hand holds the schedule, and only ever later.
#[test]
fn pace_defer_by_hand() {
    let redis = Redis::start();
    let now = "1700000000000";
    assert_eq!(
        eval(&redis, "pace_defer.lua", "p", &["4", "2000", now]),
        ["2000"]
    );
    assert_eq!(
        eval(&redis, "pace_defer.lua", "p", &["4", "500", now]),
        ["2000"],
        "never earlier"
    );
    // the next leaky-bucket slot starts after the hold
    assert_eq!(
        eval(&redis, "leaky_bucket.lua", "p", &["4", "", now]),
        ["1", "2000.000"]
    );
    assert_eq!(
        eval(&redis, "pace_defer.lua", "q", &["4", "1000"])[0],
        "1000"
    );
}

/// The give-back script run by hand, as its header shows: a token taken and given back is in
/// the bucket again; a window's count goes down by one; bad arguments get the usage line.
#[test]
fn give_back_by_hand() {
    let redis = Redis::start();
    let now = "1700000000000";
    // 10/s, burst 2: two tokens at one instant, the third refused
    for _ in 0..2 {
        assert_eq!(
            eval(&redis, "token_bucket.lua", "b", &["10", "2", "1", now])[0],
            "1"
        );
    }
    assert_eq!(
        eval(&redis, "token_bucket.lua", "b", &["10", "2", "1", now])[0],
        "0"
    );
    assert_eq!(
        eval(
            &redis,
            "give_back.lua",
            "b",
            &["token_bucket", "100", "0", now]
        ),
        ["1"]
    );
    assert_eq!(
        eval(&redis, "token_bucket.lua", "b", &["10", "2", "1", now])[0],
        "1",
        "the token given back is taken again"
    );
    // a fixed window of 1 per minute, full; given back, it admits one more
    assert_eq!(
        eval(&redis, "fixed_window.lua", "w", &["1", "60000", now])[0],
        "1"
    );
    assert_eq!(
        eval(
            &redis,
            "give_back.lua",
            "w",
            &["fixed_window", "60000", "5", now]
        ),
        ["1"]
    );
    assert_eq!(
        eval(&redis, "fixed_window.lua", "w", &["1", "60000", now])[0],
        "1"
    );
    // nothing of a check on a key never written
    assert_eq!(
        eval(
            &redis,
            "give_back.lua",
            "none",
            &["sliding_window", "60000"]
        ),
        ["0"]
    );
    let usage = eval(&redis, "give_back.lua", "b", &["leaky", "100"]).join(" ");
    assert!(usage.contains("usage: give_back.lua"), "{usage}");
}

/// An argument that is not a (finite) number where one is expected, or one argument too many
/// (which would be taken for another: the last is `now`), gets the usage line, not a quiet
/// default.
#[test]
fn stray_arguments_get_the_usage_line() {
    let redis = Redis::start();
    for (script, args) in [
        ("token_bucket.lua", &["10", "20", "abc"][..]),
        ("token_bucket.lua", &["10", "20", "1", "1700000000000", "9"]),
        ("leaky_bucket.lua", &["4", "abc"]),
        ("leaky_bucket.lua", &["4", "1000", "1700000000000", "9"]),
        ("fixed_window.lua", &["3", "60000", "1", "1700000000000"]),
        ("sliding_window.lua", &["3", "60000", "1", "1700000000000"]),
        (
            "sliding_window_counter.lua",
            &["3", "60000", "1", "1700000000000"],
        ),
        ("pace_defer.lua", &["4", "100", "1", "1700000000000"]),
        (
            "give_back.lua",
            &["token_bucket", "100", "0", "1700000000000", "9"],
        ),
        // numbers Lua reads that are not finite
        ("token_bucket.lua", &["10", "inf"]),
        ("token_bucket.lua", &["10", "20", "1", "nan"]),
        ("leaky_bucket.lua", &["4", "1e400"]),
        ("sliding_window.lua", &["3", "nan"]),
        ("pace_defer.lua", &["4", "nan"]),
        ("give_back.lua", &["token_bucket", "nan"]),
        (
            "token_bucket.lua",
            &["10", "20", "1", "debt", "1700000000000", "9"],
        ),
        ("charge.lua", &["token_bucket", "100", "100"]),
        ("charge.lua", &["token_bucket", "100", "100", "1.5"]),
        ("charge.lua", &["leaky_bucket", "100", "100", "5"]),
        ("charge.lua", &["sliding_window", "3", "60000", "5"]),
        (
            "charge.lua",
            &["fixed_window", "3", "60000", "5", "1700000000000", "9"],
        ),
        ("concurrency.lua", &["take", "2", "10000", "i1:1"]),
        ("concurrency.lua", &["acquire", "0", "10000", "i1:1"]),
        ("concurrency.lua", &["acquire", "2", "nan", "i1:1"]),
        ("concurrency.lua", &["acquire", "2", "10000", "i1:1 i1:2"]),
        (
            "concurrency.lua",
            &["acquire", "2", "10000", "i1:1", "1", "9"],
        ),
    ] {
        let out = eval(&redis, script, "stray", args).join(" ");
        assert!(
            out.contains(&format!("usage: {script}")),
            "{script} {args:?}: {out}"
        );
    }
    assert_eq!(redis.cli(&["exists", "stray"]), "0", "nothing written");
}

/// The console's scripts by hand: `peek.lua` reads a bucket without changing it, `forget.lua`
/// deletes it, `resets.lua` counts.
#[test]
fn console_scripts_by_hand() {
    let redis = Redis::start();
    eval(
        &redis,
        "token_bucket.lua",
        "tollgate:demo:alice",
        &["10", "20"],
    );
    let stored = redis.cli(&["GET", "tollgate:demo:alice"]);
    let peeked = eval(&redis, "peek.lua", "tollgate:demo:alice", &[]);
    assert_eq!(peeked[1], "string", "{peeked:?}");
    assert_eq!(peeked[2], stored.trim(), "{peeked:?}");
    assert!(
        peeked[0].parse::<f64>().unwrap() > 1.7e12,
        "the server's clock: {peeked:?}"
    );
    assert_eq!(
        redis.cli(&["GET", "tollgate:demo:alice"]),
        stored,
        "unchanged"
    );
    assert_eq!(
        eval(&redis, "forget.lua", "tollgate:demo:alice", &[]),
        ["1"]
    );
    assert_eq!(
        eval(&redis, "forget.lua", "tollgate:demo:alice", &[]),
        ["0"]
    );
    assert_eq!(
        eval(&redis, "peek.lua", "tollgate:demo:alice", &[])[1],
        "none"
    );
    let counter = "tollgate:console:resets";
    assert_eq!(eval(&redis, "resets.lua", counter, &[""]), ["0"]);
    assert_eq!(eval(&redis, "resets.lua", counter, &["bump"]), ["1"]);
    assert_eq!(eval(&redis, "resets.lua", counter, &["bump"]), ["2"]);
    let ttl: i64 = redis.cli(&["PTTL", counter]).trim().parse().unwrap();
    assert!(ttl > 0, "it expires: {ttl}");
}

/// The fleet's script by hand: two keys of one hash tag; a publication kept with the server's
/// time, a new instance refused once the cap is kept (0, nothing written), a blob over the
/// bound an error, an instance not seen for STALE_MS dropped by the next call, bad arguments
/// refused with the usage before anything is written.
#[test]
fn fleet_by_hand() {
    let redis = Redis::start();
    let path = format!("{}/lua/fleet.lua", env!("CARGO_MANIFEST_DIR"));
    let run = |args: &[&str]| -> Vec<String> {
        let mut cli_args = vec![
            "--eval",
            path.as_str(),
            "{tollgate:fleet}",
            "{tollgate:fleet}:seen",
            ",",
        ];
        cli_args.extend_from_slice(args);
        redis.cli(&cli_args).lines().map(str::to_string).collect()
    };
    assert_eq!(
        run(&["publish", "60000", "16", "2", "a", "{\"rps\":1}"]),
        ["1"]
    );
    assert_eq!(run(&["publish", "60000", "16", "2", "b", "{}"]), ["2"]);
    assert_eq!(
        run(&["publish", "60000", "16", "2", "c", "{}"]),
        ["0"],
        "the cap"
    );
    assert_eq!(
        run(&["publish", "60000", "16", "2", "a", "{}"]),
        ["2"],
        "a kept one"
    );
    let over = run(&["publish", "60000", "1", "2", "a", "{}"]).join(" ");
    assert!(over.contains("over the bound"), "{over}");
    let read = run(&["read", "60000"]);
    assert_eq!(read.len(), 7, "{read:?}");
    assert!(
        read[0].parse::<f64>().unwrap() > 1.7e12,
        "the server's clock: {read:?}"
    );
    // the longest unseen first: b, then a, published again since
    let kept = [read[1].as_str(), read[3].as_str(), read[4].as_str()];
    assert_eq!(kept, ["b", "{}", "a"], "{read:?}");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(
        run(&["publish", "1000", "16", "2", "c", "{}"]),
        ["1"],
        "a and b dropped"
    );
    assert_eq!(redis.cli(&["HKEYS", "{tollgate:fleet}"]), "c");
    let ttl: i64 = redis
        .cli(&["PTTL", "{tollgate:fleet}:seen"])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 0 && ttl <= 1000, "it expires: {ttl}");
    for args in [
        &["write", "1"][..],
        &["read", "0"],
        &["publish", "10", "16", "2", ""],
    ] {
        let out = run(args).join(" ");
        assert!(out.contains("usage: fleet.lua"), "{args:?}: {out}");
    }
}

/// The charge run by hand, on a caller's clock: after a debt of 50, a check without `debt`
/// clamps it as a bucket of other parameters; a window's charge counts past the limit.
#[test]
fn charge_by_hand() {
    let redis = Redis::start();
    let now = "1700000000000";
    let key = "tollgate:demo:bob";
    let check = |debt: bool| {
        let mut args = vec!["100", "100", "1"];
        if debt {
            args.push("debt");
        }
        args.push(now);
        eval(&redis, "token_bucket.lua", key, &args)
    };
    // (the debt-keeping check and the charge are the docs' example, run in docs_examples.rs)
    check(true);
    let charged = ["token_bucket", "100", "100", "149", now];
    eval(&redis, "charge.lua", key, &charged);
    assert_eq!(
        check(false),
        ["0", "0", "10", "1000"],
        "clamped without debt"
    );
    // the windows: a count past the limit until the window ends
    let window = ["fixed_window", "10", "60000", "12", now];
    assert_eq!(eval(&redis, "charge.lua", "w", &window), ["-2", "40000"]);
    let refused = eval(&redis, "fixed_window.lua", "w", &["10", "60000", now]);
    assert_eq!(refused, ["0", "0", "40000", "40000"]);
}

/// The concurrency script by hand, as its header shows it: two slots taken, a third holder
/// refused with the wait for the earliest lease, a renewal, a release that frees a slot, and a
/// lease that ends by itself.
#[test]
fn concurrency_by_hand() {
    let redis = Redis::start();
    let key = "tollgate:demo:alice";
    let at = |ms: u64| (1_700_000_000_000u64 + ms).to_string();
    let run = |args: &[&str]| -> Vec<String> {
        eval(&redis, "concurrency.lua", key, args)
            .into_iter()
            .filter(|l| !l.is_empty())
            .collect()
    };
    assert_eq!(
        run(&["acquire", "2", "10000", "i1:1", &at(0)]),
        ["1", "1", "0", "1"]
    );
    assert_eq!(
        run(&["acquire", "2", "10000", "i1:2", &at(10)]),
        ["1", "0", "0", "2"]
    );
    assert_eq!(
        run(&["acquire", "2", "10000", "i1:3", &at(20)]),
        ["0", "0", "9980", "2"]
    );
    assert_eq!(
        run(&["renew", "2", "10000", "i1:1 i1:2 i1:9", &at(5000)]),
        ["2"]
    );
    assert_eq!(run(&["release", "2", "10000", "i1:1", &at(6000)]), ["1"]);
    assert_eq!(
        run(&["look", "2", "10000", "", &at(6000)]),
        ["1", "0", "0", "1"]
    );
    // i1:2's lease, renewed at 5000, ends at 15000
    assert_eq!(
        run(&["acquire", "1", "10000", "i1:3", &at(14_999)]),
        ["0", "0", "1", "1"]
    );
    assert_eq!(
        run(&["acquire", "1", "10000", "i1:3", &at(15_000)]),
        ["1", "0", "0", "1"]
    );
    let ttl: i64 = redis.cli(&["pttl", key]).trim().parse().unwrap();
    assert!(
        ttl > 10_000 && ttl <= 20_000,
        "the key expires with its lease: {ttl}"
    );
}

/// adapt.lua by hand, as its header shows it: trouble lowers the rate once per period however
/// often it is reported, health raises it a period later, quiet reads it; bad arguments get
/// the usage line.
#[test]
fn adapt_by_hand() {
    let redis = Redis::start();
    let key = "tollgate:upstream:api:rate";
    let at = |ms: u64| (1_700_000_000_000u64 + ms).to_string();
    let run = |report: &str, ms: u64| {
        let now = at(ms);
        let args = ["100", "1", "200", "1", "0.7", report, "500", now.as_str()];
        eval(&redis, "adapt.lua", key, &args)
    };
    assert_eq!(run("quiet", 0), ["100"]);
    assert_eq!(run("trouble", 0), ["70"]);
    assert_eq!(run("trouble", 100), ["70"], "one decrease per period");
    assert_eq!(run("healthy", 400), ["70"], "an increase waits a period");
    assert_eq!(run("healthy", 500), ["71"]);
    assert_eq!(run("quiet", 600), ["71"]);
    let ttl: u64 = redis.cli(&["pttl", key]).trim().parse().unwrap();
    assert!(ttl > 3_600_000 && ttl <= 3_610_000, "kept an hour: {ttl}");
    // the example of the header, on the server's clock
    let header = ["100", "1", "200", "1", "0.7", "trouble", "500"];
    assert_eq!(eval(&redis, "adapt.lua", "fresh", &header), ["70"]);
    for bad in [
        &["100", "1", "200", "1", "1.5", "trouble", "500"][..],
        &["100", "1", "200", "1", "0.7", "sad", "500"],
        &["100", "150", "200", "1", "0.7", "quiet", "500"],
        &["100", "1", "200", "0", "0.7", "quiet", "500"],
    ] {
        let reply = eval(&redis, "adapt.lua", "bad", bad).join(" ");
        assert!(reply.contains("usage: adapt.lua"), "{bad:?}: {reply}");
    }
}

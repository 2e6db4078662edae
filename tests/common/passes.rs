//! Second passes: a test binary runs its tests again in a child process, on the other of two
//! implementations of one concern, so that one suite holds both to the same answers.
//!
//! Every test file that starts a [`Proxy`](super::Proxy) declares
//! [`both_http1_clients!`](crate::common::both_http1_clients): its tests run again with
//! requests without a body carried by hyper's HTTP/1 client rather than tollgate's own, and
//! with the scheduling tricks off ([`tollgate::turns`]). The proxy starter panics in a test
//! binary that lacks that pass, so a new file cannot forget it. `tests/redis_store.rs` runs
//! again over redis-rs's connection in the same way ([`again_over_redis_rs`]).

use std::process::Command;
use std::sync::Once;

/// The environment variable that makes [`Proxy::start`](super::Proxy::start) carry every
/// request over hyper's HTTP/1 client: set to `library` by [`again_through_hypers_client`].
pub const HTTP1_CLIENT_VAR: &str = "TOLLGATE_TEST_HTTP1_CLIENT";

/// The test that [`both_http1_clients!`](crate::common::both_http1_clients) declares.
pub const HTTP1_PASS: &str = "every_test_again_through_hypers_client";

/// The environment variable that makes [`redis_connection`] name redis-rs's connection: set to
/// `library` by [`again_over_redis_rs`].
pub const REDIS_CONNECTION_VAR: &str = "TOLLGATE_TEST_REDIS_CONNECTION";

/// The HTTP/1 client the proxies of this test process use for requests without a body.
pub fn http1_client() -> tollgate::proxy::Http1Client {
    match std::env::var(HTTP1_CLIENT_VAR).as_deref() {
        Ok("library") => tollgate::proxy::Http1Client::Library,
        _ => tollgate::proxy::Http1Client::Own,
    }
}

/// The connection the Redis stores of this test process use to reach one Redis.
pub fn redis_connection() -> tollgate::store::Connection {
    match std::env::var(REDIS_CONNECTION_VAR).as_deref() {
        Ok("library") => tollgate::store::Connection::Library,
        _ => tollgate::store::Connection::Own,
    }
}

/// Declares the test that runs every other test of this file again through hyper's HTTP/1
/// client. Every test file that starts a proxy declares it, after `mod common;`.
#[allow(unused_macros)] // (only the files that start a proxy declare the pass)
macro_rules! both_http1_clients {
    () => {
        /// Every other test of this file again, with requests without a body carried by hyper's HTTP/1
        /// client rather than tollgate's own, and the scheduling tricks off: the two clients
        /// behave alike, and the tricks change no answer.
        #[test]
        fn every_test_again_through_hypers_client() {
            $crate::common::passes::again_through_hypers_client();
        }
    };
}
#[allow(unused_imports)] // (only the files that start a proxy declare the pass)
pub(crate) use both_http1_clients;

/// Runs every other test of this test binary again, in a child process whose proxies carry
/// every request over hyper's HTTP/1 client, with the scheduling tricks off, and fails when one
/// of them fails there.
pub fn again_through_hypers_client() {
    again(
        "through hyper's HTTP/1 client",
        &[
            (HTTP1_CLIENT_VAR, "library"),
            (tollgate::turns::SWITCH, "off"),
        ],
        &[HTTP1_PASS],
    );
}

/// Runs every other test of this test binary again, in a child process whose Redis stores go
/// over redis-rs's connection, and fails when one of them fails there. `me` is the test that
/// calls this; `single` are the tests about the own connection alone, which the child skips.
pub fn again_over_redis_rs(me: &str, single: &[&str]) {
    let mut skip = vec![me];
    skip.extend_from_slice(single);
    again(
        "over redis-rs's connection",
        &[(REDIS_CONNECTION_VAR, "library")],
        &skip,
    );
}

/// Runs this test binary again with `env` set, skipping the tests named in `skip` (the first
/// is the caller), and fails when a test fails there. Does nothing in such a child.
fn again(pass: &str, env: &[(&str, &str)], skip: &[&str]) {
    if env.iter().any(|(var, _)| std::env::var_os(var).is_some()) {
        return;
    }
    let listed = list();
    for name in skip {
        assert!(
            listed.iter().any(|listed| listed == name),
            "`{name}` is to be skipped {pass}, but this file has no such test"
        );
    }
    let mut child = Command::new(std::env::current_exe().expect("the test binary"));
    child.envs(env.iter().copied());
    child.args(["--exact", "--test-threads", "4"]);
    for name in skip {
        child.args(["--skip", name]);
    }
    let out = child.output().expect("the test binary runs again");
    assert!(
        out.status.success(),
        "{pass}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The names of this test binary's tests, ignored ones included.
fn list() -> Vec<String> {
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--list", "--format", "terse"])
        .output()
        .expect("the test binary lists its tests");
    assert!(
        out.status.success(),
        "the test binary could not list its tests"
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.strip_suffix(": test"))
        .map(str::to_owned)
        .collect()
}

/// Panics unless this test binary runs its tests again through hyper's HTTP/1 client. The proxy
/// starters call it, so a file that starts a proxy and lacks the pass fails at once, whichever
/// of its tests runs. Checked once per process; never in the child of a pass.
pub fn require_http1_pass() {
    static CHECKED: Once = Once::new();
    if std::env::var_os(HTTP1_CLIENT_VAR).is_some() {
        return;
    }
    CHECKED.call_once(|| {
        assert!(
            list().iter().any(|name| name == HTTP1_PASS),
            "this test file starts a proxy, so its tests must run through both HTTP/1 clients: \
             declare `common::both_http1_clients!();` after `mod common;`"
        );
    });
}

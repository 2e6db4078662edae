//! The store's own connection to a real Redis Cluster: slots moved under it (`MOVED`, `ASK`),
//! checks of one bucket joined and leased per shard, checks of many keys batched only within a
//! slot, and a primary killed or hung until its replica takes over.

mod common;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::limit::{Algorithm, Bucket, Rate};
use tollgate::store::{RedisStore, RedisTarget, Store};

fn bucket(rate: f64, burst: u32) -> Algorithm {
    let one = NonZeroU32::new(1).unwrap();
    Algorithm::TokenBucket(
        Bucket::new(
            Rate::per_second(rate).unwrap(),
            NonZeroU32::new(burst).unwrap(),
            one,
        )
        .unwrap(),
    )
}

fn store(cluster: &common::Cluster, timeout: Duration) -> Arc<RedisStore> {
    let target = RedisTarget::Cluster(cluster.urls());
    Arc::new(RedisStore::connect(&target, timeout, 1).unwrap())
}

/// `EVALSHA` and `EVAL` calls node `port` has run since its statistics were reset.
fn script_runs(port: u16) -> u64 {
    script_stat(port, "calls")
}

/// `EVALSHA` and `EVAL` calls sent to node `port`: those it ran, and those it refused
/// (`rejected_calls`: redirected, or refused before they ran).
fn scripts_sent(port: u16) -> u64 {
    script_stat(port, "calls") + script_stat(port, "rejected_calls")
}

fn script_stat(port: u16, name: &str) -> u64 {
    let stats = common::cli(port, &["INFO", "commandstats"]);
    stats
        .lines()
        .filter_map(|line| {
            let fields = line
                .strip_prefix("cmdstat_evalsha:")
                .or_else(|| line.strip_prefix("cmdstat_eval:"))?;
            fields.split(',').find_map(|field| {
                let (key, value) = field.split_once('=')?;
                (key == name).then(|| value.parse::<u64>().ok())?
            })
        })
        .sum()
}

/// The errors node `port` has answered, by code, from `INFO errorstats`.
fn error_codes(port: u16) -> String {
    common::cli(port, &["INFO", "errorstats"])
}

/// Moves `key`'s slot from node `from` to node `to`, the key with it. With `finish` false the
/// slot stays half-moved: `from` answers `ASK` for keys it no longer holds.
fn move_slot(cluster: &common::Cluster, key: &str, from: usize, to: usize, finish: bool) {
    let slot = cluster.nodes[from].cli(&["cluster", "keyslot", key]);
    let (from_id, to_id) = (cluster.id(from), cluster.id(to));
    let to_port = cluster.nodes[to].port.to_string();
    cluster.nodes[to].cli(&["cluster", "setslot", &slot, "importing", &from_id]);
    cluster.nodes[from].cli(&["cluster", "setslot", &slot, "migrating", &to_id]);
    let moved = cluster.nodes[from].cli(&[
        "migrate",
        "127.0.0.1",
        &to_port,
        "",
        "0",
        "5000",
        "keys",
        key,
    ]);
    assert_eq!(moved, "OK", "MIGRATE {key}");
    if finish {
        for node in &cluster.nodes {
            node.cli(&["cluster", "setslot", &slot, "node", &to_id]);
        }
    }
}

/// A slot moved to another primary after the store read the map: the next call meets `MOVED`,
/// goes to the new primary, and finds the key's state there; the calls after it go there
/// directly. A slot half-moved: the old primary answers `ASK` for the key it gave away, and the
/// call goes once to the new one after `ASKING`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_and_asked_slots_are_followed() {
    let cluster = common::Cluster::start();
    let s = store(&cluster, Duration::from_secs(5));
    let alg = bucket(0.001, 10);
    let key = "tollgate:r:l:moving";
    assert_eq!(s.check(key, &alg, None).await.unwrap().remaining, 9);
    let from = cluster.owner(key);
    let to = (from + 1) % 3;
    move_slot(&cluster, key, from, to, true);
    assert_eq!(cluster.owner(key), to);
    let d = s.check(key, &alg, None).await.expect("followed MOVED");
    assert_eq!(d.remaining, 8, "the key's state moved with it");
    let before = scripts_sent(cluster.nodes[from].port);
    for want in (0..8).rev() {
        assert_eq!(s.check(key, &alg, None).await.unwrap().remaining, want);
    }
    assert!(!s.check(key, &alg, None).await.unwrap().allowed);
    assert_eq!(
        scripts_sent(cluster.nodes[from].port),
        before,
        "a call went to the old primary after its MOVED"
    );

    // half-moved: ASK, and the map keeps the slot where it was until the move ends
    let key = "tollgate:r:l:asked";
    assert_eq!(s.check(key, &alg, None).await.unwrap().remaining, 9);
    let from = cluster.owner(key);
    let to = (from + 1) % 3;
    move_slot(&cluster, key, from, to, false);
    for want in [8, 7] {
        let d = s.check(key, &alg, None).await.expect("followed ASK");
        assert_eq!(d.remaining, want, "decided on the new primary");
    }
    let exists = |node: usize| cluster.nodes[node].cli(&["exists", key]);
    assert!(exists(from).contains("ASK"), "{}", exists(from));
    // (the new primary answers a plain EXISTS with MOVED until the slot is its own)
    let slot = cluster.nodes[from].cli(&["cluster", "keyslot", key]);
    for node in &cluster.nodes {
        node.cli(&["cluster", "setslot", &slot, "node", &cluster.id(to)]);
    }
    assert_eq!(exists(to), "1");
    assert_eq!(s.check(key, &alg, None).await.unwrap().remaining, 6);
}

/// Checks `key` from `n` tasks at once over `stores` in turn: how many were admitted, and how
/// many answered from a lease.
async fn admitted_at_once(
    stores: &[Arc<RedisStore>],
    key: &str,
    alg: Algorithm,
    n: usize,
) -> (u64, u64) {
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (s, key) = (stores[i % stores.len()].clone(), key.to_string());
            tokio::spawn(async move { s.check(&key, &alg, None).await.unwrap() })
        })
        .collect();
    let (mut admitted, mut leased) = (0, 0);
    for h in handles {
        let d = h.await.unwrap();
        admitted += u64::from(d.allowed);
        leased += u64::from(d.leased);
    }
    (admitted, leased)
}

/// One hot key on one shard, checked by two instances at once: the checks of each instance are
/// joined into few script runs, a busy bucket far from empty is leased, and the limit holds
/// exactly: never more admitted than the burst, and once the leases are given back, the bucket
/// holds what was not admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_is_joined_and_leased_on_its_shard() {
    let cluster = common::Cluster::start();
    let stores = [
        store(&cluster, Duration::from_secs(5)),
        store(&cluster, Duration::from_secs(5)),
    ];
    let key = "tollgate:r:l:hot";
    for s in &stores {
        s.check("tollgate:warm", &bucket(1.0, 1), None)
            .await
            .unwrap();
    }
    let owner = cluster.nodes[cluster.owner(key)].port;
    common::cli(owner, &["CONFIG", "RESETSTAT"]);
    // a bucket of 5 000 (refilled once in 1000 s): 6 000 checks, 400 at a time
    let alg = bucket(0.001, 5_000);
    let (mut admitted, mut leased) = (0, 0);
    for _ in 0..15 {
        let (a, l) = admitted_at_once(&stores, key, alg, 400).await;
        admitted += a;
        leased += l;
    }
    assert_eq!(admitted, 5_000, "the burst, no more and no less");
    assert!(leased > 0, "no check answered from a lease");
    let runs = script_runs(owner);
    assert!(
        runs < 6_000 / 4,
        "6 000 checks of one key took {runs} script runs on its shard"
    );
    // a lease's life is short: what it did not hand out is back in Redis after it
    tokio::time::sleep(Duration::from_millis(300)).await;
    let probe = stores[0].check(key, &alg, None).await.unwrap();
    assert!(!probe.allowed, "{probe:?}");
}

/// Token-bucket checks of many keys with one limit in flight together: keys of one slot go as
/// one call, keys of different slots never do (Redis would refuse the script), and every check
/// gets its own key's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_of_many_keys_go_together_only_within_a_slot() {
    let cluster = common::Cluster::start();
    let s = store(&cluster, Duration::from_secs(5));
    s.check("tollgate:warm", &bucket(1.0, 1), None)
        .await
        .unwrap();
    let alg = bucket(0.001, 2);
    let many = |keys: Vec<String>| {
        let handles: Vec<_> = keys
            .into_iter()
            .map(|key| {
                let s = s.clone();
                tokio::spawn(async move {
                    let d = s.check(&key, &alg, None).await;
                    (key, d.map(|d| d.remaining).map_err(|e| e.to_string()))
                })
            })
            .collect();
        async move {
            let mut all = Vec::new();
            for h in handles {
                all.push(h.await.unwrap());
            }
            all
        }
    };
    // keys all over the slots: never sent together (Redis would answer CROSSSLOT, and each
    // check would go again alone)
    let keys: Vec<String> = (0..300).map(|i| format!("tollgate:r:l:c{i}")).collect();
    for round in [1, 0] {
        for (key, seen) in many(keys.clone()).await {
            assert_eq!(seen, Ok(round), "{key}");
        }
    }
    for node in &cluster.nodes {
        let errors = error_codes(node.port);
        assert!(!errors.contains("CROSSSLOT"), "{errors}");
    }
    // keys of one slot (a prefix with a hash tag): they share calls
    let tagged: Vec<String> = (0..200).map(|i| format!("{{tenant}}:r:l:c{i}")).collect();
    let owner = cluster.nodes[cluster.owner(&tagged[0])].port;
    common::cli(owner, &["CONFIG", "RESETSTAT"]);
    for (key, seen) in many(tagged).await {
        assert_eq!(seen, Ok(1), "{key}");
    }
    let runs = script_runs(owner);
    assert!(runs < 100, "200 checks of one slot's keys took {runs} runs");
}

/// A primary killed: calls for its keys fail at once, not at their deadline, while the other
/// shards decide as before; once the cluster promotes its replica, the store follows and its
/// keys are decided again, with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_followed_to_its_replica() {
    // (by default a cluster refuses every key while a slot is uncovered)
    let mut cluster = common::Cluster::start_with(
        3,
        1,
        &[
            "--cluster-node-timeout",
            "1000",
            "--cluster-require-full-coverage",
            "no",
        ],
    );
    let s = store(&cluster, Duration::from_millis(500));
    let alg = bucket(1_000.0, 1_000);
    let keys: Vec<String> = (0..30).map(|i| format!("tollgate:r:l:k{i}")).collect();
    for key in &keys {
        s.check(key, &alg, None).await.expect("a whole cluster");
    }
    let victim = cluster.owner(&keys[0]);
    let others: Vec<&String> = keys.iter().filter(|k| cluster.owner(k) != victim).collect();
    cluster.nodes[victim].kill();
    let killed = Instant::now();
    let mut failed = 0;
    loop {
        let began = Instant::now();
        match s.check(&keys[0], &alg, None).await {
            Ok(_) => break,
            Err(e) => {
                failed += 1;
                assert!(
                    began.elapsed() < Duration::from_millis(1_500),
                    "a call waited {:?}: {e}",
                    began.elapsed()
                );
            }
        }
        for key in &others {
            s.check(key, &alg, None)
                .await
                .expect("the other shards decide");
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "never followed the promotion ({failed} calls failed)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(failed > 0, "no call failed while the primary was down");
    let promoted = cluster.owner(&keys[0]);
    assert_ne!(promoted, victim);
    for key in &keys {
        s.check(key, &alg, None)
            .await
            .expect("the whole cluster again");
    }
}

/// A primary hung (`DEBUG SLEEP`): calls for its keys are answered by their deadline, and
/// once its replica is promoted, the store follows although the old primary never closed a
/// connection; when the old one wakes as a replica, nothing goes back to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_primary_is_left_for_its_replica() {
    let cluster = common::Cluster::start_with(
        3,
        1,
        &[
            "--cluster-node-timeout",
            "1000",
            "--enable-debug-command",
            "yes",
        ],
    );
    let timeout = Duration::from_millis(200);
    let s = store(&cluster, timeout);
    let alg = bucket(1_000.0, 1_000);
    let key = "tollgate:r:l:sleepy";
    s.check(key, &alg, None).await.unwrap();
    let victim = cluster.owner(key);
    let port = cluster.nodes[victim].port;
    let sleeper = std::thread::spawn(move || {
        // (answers once it wakes)
        let _ = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string(), "debug", "sleep", "12"])
            .output();
    });
    cluster.nodes[victim].wait_blocked();
    let hung = Instant::now();
    let mut late = 0;
    let mut errors = std::collections::BTreeSet::new();
    loop {
        let began = Instant::now();
        match s.check(key, &alg, None).await {
            Ok(_) => break,
            Err(e) => {
                errors.insert(e.to_string());
                late += 1;
                assert!(
                    began.elapsed() < timeout * 4,
                    "a call waited {:?}",
                    began.elapsed()
                );
            }
        }
        assert!(
            hung.elapsed() < Duration::from_secs(11),
            "never followed the promotion while the primary slept ({late} calls failed: {errors:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(late > 0, "no call failed while the primary slept");
    // (asked of a node that is awake)
    assert_ne!(cluster.owner_seen_by(key, (victim + 1) % 6), victim);
    sleeper.join().unwrap();
    let before = scripts_sent(port);
    for _ in 0..20 {
        s.check(key, &alg, None).await.expect("on the new primary");
    }
    assert_eq!(scripts_sent(port), before, "a call went to the old primary");
}

/// A primary hung for less than the cluster takes to call it down: after three late calls its
/// keys' calls fail at once, but for a probe every 200 ms, while the other shards decide as
/// before; once it wakes, the next probe finds it and its keys are decided again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_primary_is_skipped_between_probes() {
    let cluster = common::Cluster::start_with(
        3,
        0,
        &[
            "--cluster-node-timeout",
            "15000",
            "--enable-debug-command",
            "yes",
        ],
    );
    let timeout = Duration::from_millis(200);
    let s = store(&cluster, timeout);
    let alg = bucket(1_000.0, 1_000);
    let keys: Vec<String> = (0..30).map(|i| format!("tollgate:r:l:k{i}")).collect();
    for key in &keys {
        s.check(key, &alg, None).await.unwrap();
    }
    let victim = cluster.owner(&keys[0]);
    let other = keys.iter().find(|k| cluster.owner(k) != victim).unwrap();
    let port = cluster.nodes[victim].port;
    let sleeper = std::thread::spawn(move || {
        let _ = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string(), "debug", "sleep", "8"])
            .output();
    });
    cluster.nodes[victim].wait_blocked();
    let (mut late, mut at_once) = (0, 0);
    for _ in 0..20 {
        let began = Instant::now();
        s.check(&keys[0], &alg, None)
            .await
            .expect_err("the primary sleeps");
        if began.elapsed() < timeout / 2 {
            at_once += 1;
        } else {
            late += 1;
        }
        s.check(other, &alg, None).await.expect("another shard");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // (without the skip every call waits; how many go at once depends on the machine's pace)
    assert!(
        at_once >= 8,
        "{at_once} of 20 calls failed at once, {late} waited"
    );
    sleeper.join().unwrap();
    let woke = Instant::now();
    while s.check(&keys[0], &alg, None).await.is_err() {
        assert!(
            woke.elapsed() < Duration::from_secs(5),
            "never probed again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One primary down for good, and the cluster set to serve the rest (`cluster-require-full-
/// coverage no`): however many calls in a row go to its keys, before and after the cluster
/// calls it failed (its slots then served by no one), the breaker stays closed, so the other
/// shards' keys are still decided by Redis, not by `on_error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shard_down_leaves_the_breaker_closed_for_the_others() {
    use std::num::NonZeroUsize;
    use tollgate::store::{GuardedStore, OnError, StoreError};

    let mut cluster = common::Cluster::start_with(
        3,
        0,
        &[
            "--cluster-node-timeout",
            "1000",
            "--cluster-require-full-coverage",
            "no",
        ],
    );
    let guarded = GuardedStore::new(
        store(&cluster, Duration::from_millis(200)),
        OnError::Deny,
        NonZeroU32::MIN,
        NonZeroUsize::new(1_000).unwrap(),
    );
    let alg = bucket(1_000.0, 1_000);
    let keys: Vec<String> = (0..30).map(|i| format!("tollgate:r:l:k{i}")).collect();
    for key in &keys {
        guarded.check(key, &alg, None).await.unwrap();
    }
    let victim = cluster.owner(&keys[0]);
    let other = keys.iter().find(|k| cluster.owner(k) != victim).unwrap();
    let witness = (victim + 1) % 3;
    cluster.nodes[victim].kill();
    // from before the cluster calls the primary failed until long after (its slots are then
    // served by no one)
    let killed = Instant::now();
    let mut round = 0;
    let mut failed_seen = false;
    while !failed_seen || killed.elapsed() < Duration::from_secs(4) {
        round += 1;
        failed_seen |= cluster.nodes[witness]
            .cli(&["cluster", "nodes"])
            .lines()
            .any(|l| l.contains("master,fail"));
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "the cluster never called the primary failed"
        );
        for _ in 0..20 {
            let e = guarded.check(&keys[0], &alg, None).await.unwrap_err();
            assert!(!matches!(e, StoreError::CircuitOpen), "round {round}: {e}");
        }
        let d = guarded.check(other, &alg, None).await;
        assert!(d.is_ok(), "round {round}: another shard's key: {d:?}");
        assert!(!guarded.breaker_open(), "round {round}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

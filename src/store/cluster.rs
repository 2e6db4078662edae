//! The store's own connection to a Redis Cluster: one [`Pipe`] per primary, so a shard gets
//! what one Redis gets (a connection per worker, joining, leases), and a slot map to find the
//! primary of each key.
//!
//! The map comes from `CLUSTER SHARDS` (`CLUSTER SLOTS` on servers before Redis 7), asked of a
//! few known nodes at once; the first good answer wins. It is read when the first call comes,
//! and again, in the background, after anything that says it may be out of date: a `MOVED`
//! redirect, a call past its deadline, a broken connection, `CLUSTERDOWN`. A failover shows up
//! as timeouts or refused connections until the cluster promotes a replica; tollgate re-reads
//! the map at most every [`REFRESH_GAP`] meanwhile, and goes on reading it while a primary
//! fails, calls or not, so it follows the promotion soon after the cluster makes it. The
//! failure policy decides the calls that fail until then.
//!
//! A primary that fails three calls in a row (late, or its connection broken) is skipped for
//! a short cool-down: its keys' calls fail at once, so a hung primary costs its shard's
//! requests no wait, and the other shards go on as before (see [`Health`]).
//!
//! A `MOVED` answer points its slot at the named node at once and sends the call there; an
//! `ASK` answer sends it there once, after `ASKING`, and leaves the map alone (the slot is
//! being migrated). A call follows at most [`REDIRECTS`] redirects, all within its deadline.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::pipe::{self, Addr, Answer, Command, Endpoint, Failure, Pipe};
use super::reply::Reply;
use super::resp::{encode_command, Error, Value};

pub(crate) mod map;

pub(crate) use map::slot;
use map::{Shard, SLOTS};

/// The redirects one call follows before it fails.
const REDIRECTS: usize = 5;
/// The least time between two reads of the slot map.
const REFRESH_GAP: Duration = Duration::from_millis(100);
/// The most time between two reads of the slot map while something asks for them.
const REFRESH_GAP_MAX: Duration = Duration::from_millis(400);
/// How long reads of the map go on by themselves while it may be about to change.
const FOLLOW_FOR: Duration = Duration::from_secs(30);
/// Seeds asked for the map at once, when no known primary answers.
const ASKED_AT_ONCE: usize = 3;
/// Nodes that `ASK` named, kept for their next calls.
const ASKED_KEPT: usize = 8;
/// A slot no primary serves.
const UNCOVERED: u16 = u16::MAX;

/// A handle on the connections to a cluster's primaries.
pub(crate) struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    /// the nodes the configuration names, asked when no known node answers
    seeds: Vec<(String, u16)>,
    /// how to reach a node: its address aside
    template: Endpoint,
    lanes: usize,
    leases: AtomicBool,
    map: ArcSwap<Map>,
    refreshing: AtomicBool,
    last_refresh: Mutex<Option<Instant>>,
    /// counts finished reads of the map, for the calls that wait for the first one
    refreshed: watch::Sender<u64>,
    /// turns the list of nodes asked, so one that hangs is not always asked first
    turn: AtomicUsize,
    /// ms from one read of the map to the next: see [`Inner::refresh_soon`]
    gap_ms: AtomicU64,
    /// nodes an `ASK` named that the map does not hold, the latest last
    asked: Mutex<Vec<Arc<Node>>>,
}

/// Which primary serves each slot.
struct Map {
    /// an index into `nodes`, or [`UNCOVERED`]
    slots: Box<[u16]>,
    nodes: Vec<Arc<Node>>,
}

/// One primary and the store's connections to it.
struct Node {
    host: String,
    port: u16,
    pipe: Pipe,
    health: Health,
}

/// Whether a primary answers. One that failed [`TRIP_AFTER`] calls in a row (late, or its
/// connection broken) is skipped for [`COOL_DOWN`]: its calls fail at once instead of each
/// waiting out its timeout, while the other shards go on. Then one call goes through as a probe.
/// A promoted replica is a new node, with a clean record.
struct Health {
    failures: AtomicU32,
    /// ms on `epoch` until which the node is skipped; 0: it is not
    skipped_until: AtomicU64,
    epoch: Instant,
}

/// Failed calls in a row that make a primary skipped.
const TRIP_AFTER: u32 = 3;
/// How long a failing primary is skipped before the next probe.
const COOL_DOWN: Duration = Duration::from_millis(200);

impl Health {
    fn new() -> Health {
        Health {
            failures: AtomicU32::new(0),
            skipped_until: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Whether the node failed its last call.
    fn failing(&self) -> bool {
        self.failures.load(Ordering::Relaxed) != 0
    }

    /// ms since the node was made, never 0
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Whether a call may go now: the node is not skipped, or this call is the probe.
    fn admit(&self) -> bool {
        let until = self.skipped_until.load(Ordering::Acquire);
        if until == 0 {
            return true;
        }
        let now = self.now();
        let next = now + COOL_DOWN.as_millis() as u64;
        now >= until
            && self
                .skipped_until
                .compare_exchange(until, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    fn record(&self, answer: &Answer) {
        match answer {
            Err(Failure::Late) | Err(Failure::Redis(Error::Io(_))) => {
                let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
                if failures >= TRIP_AFTER {
                    let until = self.now() + COOL_DOWN.as_millis() as u64;
                    self.skipped_until.store(until, Ordering::Release);
                }
            }
            // (read first: on the hot path both are 0, and a read keeps the line shared)
            _ => {
                if self.failures.load(Ordering::Relaxed) != 0 {
                    self.failures.store(0, Ordering::Release);
                }
                if self.skipped_until.load(Ordering::Relaxed) != 0 {
                    self.skipped_until.store(0, Ordering::Release);
                }
            }
        }
    }
}

impl Node {
    fn is(&self, host: &str, port: u16) -> bool {
        self.host == host && self.port == port
    }

    /// The cluster's shards, as this primary says, asked over the store's connection to it.
    async fn shards(&self, tls: bool, deadline: Instant) -> Result<Vec<Shard>, Error> {
        let ask = |words: &[&[u8]]| {
            let mut command = Vec::new();
            encode_command(&mut command, words);
            self.pipe.call(Command::Bytes(command), deadline)
        };
        let failed = |failure| match failure {
            Failure::Redis(e) => e,
            Failure::Late => Error::io(
                std::io::ErrorKind::TimedOut,
                format!(
                    "{}:{} did not give its slot map in time",
                    self.host, self.port
                ),
            ),
        };
        let shards = match ask(&[b"CLUSTER", b"SHARDS"]).await {
            Ok(Reply::Value(reply)) => map::from_shards(&reply, tls),
            // a server before Redis 7
            Err(Failure::Redis(Error::Server(e))) if e.code() == "ERR" => {
                match ask(&[b"CLUSTER", b"SLOTS"]).await.map_err(failed)? {
                    Reply::Value(reply) => map::from_slots(&reply),
                    _ => Err("CLUSTER SLOTS did not answer a list"),
                }
            }
            Ok(_) => Err("CLUSTER SHARDS did not answer a list"),
            Err(failure) => return Err(failed(failure)),
        };
        known_shards(shards, &self.host)
    }

    /// Sends `command` to the primary, unless it is skipped ([`Health`]).
    async fn send(&self, command: Command, deadline: Instant) -> Answer {
        if !self.health.admit() {
            return Err(Failure::Redis(Error::Skipped(format!(
                "the Cluster's primary {}:{} failed its last calls: skipped for {} ms at a time \
                 while the slot map is read again",
                self.host,
                self.port,
                COOL_DOWN.as_millis()
            ))));
        }
        let answer = self.pipe.call(command, deadline).await;
        self.health.record(&answer);
        answer
    }
}

impl Cluster {
    /// A cluster reached first through `seeds`, each node as `template` says (its address
    /// aside), with `lanes` connections per primary. Nothing connects before the first call.
    pub(crate) fn new(seeds: Vec<(String, u16)>, template: Endpoint, lanes: usize) -> Cluster {
        Cluster {
            inner: Arc::new(Inner {
                seeds,
                template,
                lanes,
                leases: AtomicBool::new(true),
                map: ArcSwap::from_pointee(Map {
                    slots: Box::new([]),
                    nodes: Vec::new(),
                }),
                refreshing: AtomicBool::new(false),
                last_refresh: Mutex::new(None),
                refreshed: watch::Sender::new(0),
                turn: AtomicUsize::new(0),
                gap_ms: AtomicU64::new(REFRESH_GAP.as_millis() as u64),
                asked: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Whether the primaries' lanes take leases ([`super::lease`]).
    pub(crate) fn set_leases(&self, on: bool) {
        self.inner.leases.store(on, Ordering::Relaxed);
        for node in &self.inner.map.load().nodes {
            node.pipe.set_leases(on);
        }
    }

    /// Drops every primary's leases.
    pub(crate) fn forget_leases(&self) {
        for node in &self.inner.map.load().nodes {
            node.pipe.forget_leases();
        }
    }

    /// Sends the command `make` writes for the key in `slot` to its primary, following
    /// redirects, and once more with the script's body (`make(true)`) after `NOSCRIPT`.
    pub(crate) async fn call(
        &self,
        slot: u16,
        make: impl Fn(bool) -> Command,
        deadline: Instant,
    ) -> Answer {
        let mut body = false;
        // where the next try goes when it is not the map's primary, and whether after ASKING
        let mut next: Option<(Arc<Node>, bool)> = None;
        for _ in 0..=REDIRECTS {
            let (node, asking) = match next.take() {
                Some(next) => next,
                None => (self.node_for(slot, deadline).await?, false),
            };
            let command = if asking {
                let mut bytes = Vec::new();
                make(body).write_to(&mut bytes);
                Command::Asking(bytes)
            } else {
                make(body)
            };
            let answer = node.send(command, deadline).await;
            let Err(failure) = &answer else {
                return answer;
            };
            let error = match failure {
                Failure::Redis(error) => error,
                Failure::Late => {
                    self.inner.refresh_soon();
                    return answer;
                }
            };
            match redirect(error, &node) {
                Some(Redirect::Moved(slot, host, port)) => {
                    next = Some((self.inner.moved(slot, host, port), false));
                    self.inner.refresh_soon();
                }
                Some(Redirect::Ask(host, port)) => {
                    next = Some((self.inner.node_at(&host, port), true));
                }
                None if error.is_noscript() && !body => {
                    body = true;
                    next = Some((node, asking));
                }
                None => {
                    if outdated(error) {
                        self.inner.refresh_soon();
                    }
                    return answer;
                }
            }
        }
        Err(Failure::Redis(Error::Protocol(
            "too many Cluster redirects for one call",
        )))
    }

    /// Sends a keyless command to every primary, each bounded by `deadline`: each primary's
    /// `host:port` and answer, in the map's order. Calls that fail ask for a new map.
    pub(crate) async fn each_primary(
        &self,
        words: &[&[u8]],
        deadline: Instant,
    ) -> Vec<(String, Answer)> {
        let map = self.map(deadline).await;
        let mut command = Vec::new();
        encode_command(&mut command, words);
        let calls = map.nodes.iter().map(|node| {
            let command = Command::Bytes(command.clone());
            async move {
                let answer = node.send(command, deadline).await;
                (format!("{}:{}", node.host, node.port), answer)
            }
        });
        let answers = futures_util::future::join_all(calls).await;
        if map.nodes.is_empty() || answers.iter().any(|(_, answer)| answer.is_err()) {
            self.inner.refresh_soon();
        }
        answers
    }

    /// The first slot no primary serves, if the map has one (or there is no map yet).
    pub(crate) fn uncovered(&self) -> Option<u16> {
        let map = self.inner.map.load();
        if map.slots.is_empty() {
            return Some(0);
        }
        map.slots
            .iter()
            .position(|&index| index == UNCOVERED)
            .map(|slot| slot as u16)
    }

    /// The primary of `slot`, waiting for the first map if there is none yet.
    async fn node_for(&self, slot: u16, deadline: Instant) -> Result<Arc<Node>, Failure> {
        {
            // (the usual case: a guard, without touching the map's count of holders)
            let map = self.inner.map.load();
            if let Some(&index) = map.slots.get(usize::from(slot)) {
                if index != UNCOVERED {
                    return Ok(map.nodes[usize::from(index)].clone());
                }
            }
        }
        let map = self.map(deadline).await;
        match map.slots.get(usize::from(slot)) {
            Some(&index) if index != UNCOVERED => Ok(map.nodes[usize::from(index)].clone()),
            // Not the store's outage: the cluster has lost a shard, and the others answer.
            Some(_) => {
                self.inner.refresh_soon();
                Err(Failure::Redis(Error::Skipped(format!(
                    "no primary of the Redis Cluster serves slot {slot}"
                ))))
            }
            None => Err(Failure::Redis(Error::io(
                std::io::ErrorKind::NotConnected,
                "no node of the Redis Cluster answered for its slot map",
            ))),
        }
    }

    /// The slot map; when there is none yet, after the first read of it (or the deadline).
    async fn map(&self, deadline: Instant) -> Arc<Map> {
        let map = self.inner.map.load_full();
        if !map.slots.is_empty() {
            return map;
        }
        let mut refreshed = self.inner.refreshed.subscribe();
        refreshed.mark_unchanged();
        if self.inner.refresh_soon() {
            let _ = tokio::time::timeout_at(deadline, refreshed.changed()).await;
        }
        self.inner.map.load_full()
    }
}

/// A read of the map under way: when it ends, or when its task is dropped unrun (its runtime
/// shutting down), the next read may start and the calls waiting for it are woken.
struct Refreshing(Arc<Inner>);

impl Drop for Refreshing {
    fn drop(&mut self) {
        self.0.refreshing.store(false, Ordering::Release);
        self.0.refreshed.send_modify(|n| *n += 1);
    }
}

impl Inner {
    /// Reads the slot map again in the background, unless a read is under way or the last
    /// began too recently: [`REFRESH_GAP`] after a read that changed the map, up to
    /// [`REFRESH_GAP_MAX`] while reads keep finding it as it was. Whether a read is under way.
    fn refresh_soon(self: &Arc<Self>) -> bool {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return true;
        }
        {
            let mut last = self.last_refresh.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let gap = Duration::from_millis(self.gap_ms.load(Ordering::Relaxed));
            if last.is_some_and(|at| now.duration_since(at) < gap) {
                self.refreshing.store(false, Ordering::Release);
                return false;
            }
            *last = Some(now);
        }
        let refreshing = Refreshing(self.clone());
        tokio::spawn(async move {
            let inner = &refreshing.0;
            let began = Instant::now();
            loop {
                let changed = inner.refresh().await;
                inner.refreshed.send_modify(|n| *n += 1);
                let gap = if changed {
                    REFRESH_GAP
                } else {
                    let gap = Duration::from_millis(inner.gap_ms.load(Ordering::Relaxed));
                    (gap * 2).min(REFRESH_GAP_MAX)
                };
                inner
                    .gap_ms
                    .store(gap.as_millis() as u64, Ordering::Relaxed);
                // While a primary fails or a slot has none, read again without waiting for a
                // call: an open breaker keeps calls away, and its probe should meet the map
                // the promotion made, not fail on the old one.
                if changed || !inner.troubled() || began.elapsed() > FOLLOW_FOR {
                    break;
                }
                tokio::time::sleep(gap).await;
            }
        });
        true
    }

    /// Whether the map may be about to change: a primary failed its last call, or a slot has
    /// no primary.
    fn troubled(&self) -> bool {
        let map = self.map.load();
        map.nodes.iter().any(|node| node.health.failing()) || map.slots.contains(&UNCOVERED)
    }

    /// Asks the known primaries one at a time, over the connections the store holds to them
    /// (those that answer lately first), then the seeds over new connections, for the slot
    /// map, and installs the first answer. Whether the map changed.
    async fn refresh(&self) -> bool {
        let mut known = self.map.load().nodes.clone();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        if !known.is_empty() {
            let len = known.len();
            known.rotate_left(turn % len);
        }
        known.sort_by_key(|node| node.health.failing());
        let tls = self.template.tls.is_some();
        let wait = self.template.connect_timeout / 2;
        let mut last_error = None;
        for node in &known {
            match node.shards(tls, Instant::now() + wait).await {
                Ok(shards) => return self.install(shards),
                Err(e) => last_error = Some(e),
            }
        }
        let seeds = self
            .seeds
            .iter()
            .filter(|(host, port)| !known.iter().any(|n| n.host == *host && n.port == *port));
        let mut answers = JoinSet::new();
        for (host, port) in seeds.take(ASKED_AT_ONCE) {
            answers.spawn(shards_of(host.clone(), *port, self.template.clone()));
        }
        while let Some(answer) = answers.join_next().await {
            match answer {
                Ok(Ok(shards)) => return self.install(shards),
                Ok(Err(e)) => last_error = Some(e),
                Err(_) => {}
            }
        }
        if let Some(e) = last_error {
            tracing::warn!(error = %e, "no node of the Redis Cluster gave its slot map");
        }
        false
    }

    /// Makes `shards` the map, keeping the connections to primaries it knew already. Whether
    /// the map changed.
    fn install(&self, shards: Vec<Shard>) -> bool {
        let mut changed = false;
        self.map.rcu(|old| {
            let mut slots = vec![UNCOVERED; SLOTS].into_boxed_slice();
            let mut nodes: Vec<Arc<Node>> = Vec::with_capacity(shards.len());
            for shard in &shards {
                let index = match nodes
                    .iter()
                    .position(|n| n.host == shard.host && n.port == shard.port)
                {
                    Some(index) => index,
                    None => {
                        nodes.push(self.known_or_new(old, &shard.host, shard.port));
                        nodes.len() - 1
                    }
                };
                for &(first, last) in &shard.ranges {
                    slots[usize::from(first)..=usize::from(last)].fill(index as u16);
                }
            }
            let map = Map { slots, nodes };
            changed = !map.same_as(old);
            map
        });
        changed
    }

    /// `MOVED`: the slot's primary is the node at `host:port` now. The map says so at once
    /// (a map read since may have said so already).
    fn moved(&self, slot: u16, host: String, port: u16) -> Arc<Node> {
        let mut chosen = None;
        self.map.rcu(|old| {
            let node = self.known_or_new(old, &host, port);
            let index = old.nodes.iter().position(|n| Arc::ptr_eq(n, &node));
            chosen = Some(node.clone());
            let mut nodes = old.nodes.clone();
            let index = match index {
                Some(index) if old.slots.get(usize::from(slot)) == Some(&(index as u16)) => {
                    return Arc::clone(old);
                }
                Some(index) => index,
                None => {
                    nodes.push(node);
                    nodes.len() - 1
                }
            };
            let mut slots = if old.slots.is_empty() {
                vec![UNCOVERED; SLOTS].into_boxed_slice()
            } else {
                old.slots.clone()
            };
            slots[usize::from(slot)] = index as u16;
            Arc::new(Map { slots, nodes })
        });
        chosen.expect("rcu runs its closure")
    }

    /// The node at `host:port` that `ASK` names: known already, or kept among the few nodes
    /// asked lately (a slot may be moving to a new primary that serves no slot yet, and its
    /// calls should not each open a connection).
    fn node_at(&self, host: &str, port: u16) -> Arc<Node> {
        self.find_or_make(&self.map.load(), host, port, true)
    }

    /// The node at `host:port` in `map` or among the nodes asked lately, or a new one.
    fn known_or_new(&self, map: &Map, host: &str, port: u16) -> Arc<Node> {
        self.find_or_make(map, host, port, false)
    }

    /// The node at `host:port` in `map` or among the nodes asked lately; else a new one, kept
    /// among those asked lately when `keep`.
    fn find_or_make(&self, map: &Map, host: &str, port: u16, keep: bool) -> Arc<Node> {
        if let Some(node) = map.nodes.iter().find(|n| n.is(host, port)) {
            return node.clone();
        }
        let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(node) = asked.iter().find(|n| n.is(host, port)) {
            return node.clone();
        }
        let node = self.new_node(host, port);
        if keep {
            if asked.len() == ASKED_KEPT {
                asked.remove(0);
            }
            asked.push(node.clone());
        }
        node
    }

    fn new_node(&self, host: &str, port: u16) -> Arc<Node> {
        let endpoint = Endpoint {
            addr: Addr::Tcp(host.to_owned(), port),
            ..self.template.clone()
        };
        let pipe = Pipe::new(endpoint, self.lanes);
        pipe.set_leases(self.leases.load(Ordering::Relaxed));
        Arc::new(Node {
            host: host.to_owned(),
            port,
            pipe,
            health: Health::new(),
        })
    }
}

impl Map {
    /// The same slots on the same nodes.
    fn same_as(&self, other: &Map) -> bool {
        self.slots == other.slots
            && self.nodes.len() == other.nodes.len()
            && self
                .nodes
                .iter()
                .zip(&other.nodes)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

/// The shards a node described, a node with no address of its own taken to be `asked`, the
/// node asked (it has met no other).
fn known_shards(
    shards: Result<Vec<Shard>, &'static str>,
    asked: &str,
) -> Result<Vec<Shard>, Error> {
    let mut shards = shards.map_err(Error::Protocol)?;
    if shards.is_empty() {
        return Err(Error::Protocol("the node knows of no shard"));
    }
    for shard in shards.iter_mut().filter(|s| s.host.is_empty()) {
        shard.host = asked.to_owned();
    }
    Ok(shards)
}

/// Asks the node at `host:port` for the cluster's shards, over a new connection.
async fn shards_of(host: String, port: u16, template: Endpoint) -> Result<Vec<Shard>, Error> {
    let tls = template.tls.as_ref();
    let ask = async {
        let mut stream = pipe::tcp(&host, port, tls).await?;
        let mut commands = pipe::auth(template.username.as_deref(), template.password.as_deref());
        commands.push(pipe::words(&[b"CLUSTER", b"SHARDS"]));
        let shards = match pipe::exchange(&mut stream, &commands).await {
            Ok(replies) => replies.last().map(|r| map::from_shards(r, tls.is_some())),
            // a server before Redis 7
            Err(Error::Server(e)) if e.code() == "ERR" => {
                let slots = pipe::words(&[b"CLUSTER", b"SLOTS"]);
                let replies = pipe::exchange(&mut stream, &[slots]).await?;
                replies.last().map(map::from_slots)
            }
            Err(e) => return Err(e),
        };
        known_shards(shards.unwrap_or(Err("no reply")), &host)
    };
    match tokio::time::timeout(template.connect_timeout, ask).await {
        Ok(answer) => answer,
        Err(_) => Err(Error::io(
            std::io::ErrorKind::TimedOut,
            format!("{host}:{port} did not give its slot map in time"),
        )),
    }
}

enum Redirect {
    /// the slot, and its primary's host and port
    Moved(u16, String, u16),
    Ask(String, u16),
}

/// The redirect `error` is, if it is one. A node that does not know its own address names
/// none (`:7000`): it is then `from`'s host.
fn redirect(error: &Error, from: &Node) -> Option<Redirect> {
    let Error::Server(e) = error else {
        return None;
    };
    let moved = match e.code() {
        "MOVED" => true,
        "ASK" => false,
        _ => return None,
    };
    let mut words = e.detail()?.split_whitespace();
    let slot: u16 = words.next()?.parse().ok()?;
    let (host, port) = words.next()?.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = match host.trim_start_matches('[').trim_end_matches(']') {
        "" | "?" => from.host.clone(),
        host => host.to_owned(),
    };
    if usize::from(slot) >= SLOTS {
        return None;
    }
    Some(if moved {
        Redirect::Moved(slot, host, port)
    } else {
        Redirect::Ask(host, port)
    })
}

/// Whether `error` says the slot map may be out of date: the node is gone or hung, no longer
/// a primary, or the cluster is failing over.
fn outdated(error: &Error) -> bool {
    match error {
        Error::Server(e) => matches!(
            e.code(),
            "CLUSTERDOWN" | "TRYAGAIN" | "MASTERDOWN" | "LOADING"
        ),
        Error::Io(_) | Error::ReadOnly(_) | Error::Protocol(_) | Error::Skipped(_) => true,
        Error::TlsName(_) => false,
    }
}

/// `CLUSTER INFO` text: whether the cluster says it is ok.
pub(crate) fn state_ok(info: &Value) -> bool {
    let text = match info {
        Value::Bulk(bytes) => String::from_utf8_lossy(bytes),
        _ => return false,
    };
    text.lines().any(|l| l.trim() == "cluster_state:ok")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::resp::ServerError;

    fn node() -> Node {
        Node {
            host: "10.0.0.9".into(),
            port: 7000,
            pipe: Pipe::new(
                Endpoint {
                    addr: Addr::Tcp("10.0.0.9".into(), 7000),
                    username: None,
                    password: None,
                    db: 0,
                    connect_timeout: Duration::from_secs(1),
                    tls: None,
                    cluster: true,
                },
                1,
            ),
            health: Health::new(),
        }
    }

    fn error(text: &str) -> Error {
        Error::Server(ServerError::new(text))
    }

    #[test]
    fn redirects_are_read() {
        let from = node();
        match redirect(&error("MOVED 3999 127.0.0.1:6381"), &from) {
            Some(Redirect::Moved(3999, host, 6381)) => assert_eq!(host, "127.0.0.1"),
            _ => panic!("MOVED not read"),
        }
        match redirect(&error("ASK 12 :7002"), &from) {
            Some(Redirect::Ask(host, 7002)) => assert_eq!(host, "10.0.0.9"),
            _ => panic!("ASK not read"),
        }
        match redirect(&error("MOVED 1 [::1]:7000"), &from) {
            Some(Redirect::Moved(1, host, 7000)) => assert_eq!(host, "::1"),
            _ => panic!("an IPv6 address not read"),
        }
        assert!(redirect(&error("MOVED 16384 h:1"), &from).is_none());
        assert!(redirect(&error("MOVED x h:1"), &from).is_none());
        assert!(redirect(&error("NOSCRIPT No matching script"), &from).is_none());
    }

    /// Three failed calls in a row skip a primary; after the cool-down one probe goes, and an
    /// answer clears the record.
    #[test]
    fn a_failing_primary_is_skipped_then_probed() {
        let health = Health::new();
        let late: Answer = Err(Failure::Late);
        for _ in 0..TRIP_AFTER - 1 {
            health.record(&late);
            assert!(health.admit());
        }
        health.record(&late);
        assert!(!health.admit(), "skipped after {TRIP_AFTER} failures");
        std::thread::sleep(COOL_DOWN + Duration::from_millis(20));
        assert!(health.admit(), "the probe");
        assert!(!health.admit(), "one probe only");
        health.record(&Err(Failure::Redis(error("WRONGTYPE wrong kind"))));
        assert!(health.admit(), "Redis answered: the primary is back");
        assert!(health.admit());
    }

    #[test]
    fn outdated_maps_are_told() {
        assert!(outdated(&error("CLUSTERDOWN The cluster is down")));
        assert!(outdated(&Error::io(
            std::io::ErrorKind::ConnectionRefused,
            "x"
        )));
        assert!(!outdated(&error("WRONGTYPE Operation against a key")));
        assert!(!outdated(&error("ERR Error running script")));
    }
}

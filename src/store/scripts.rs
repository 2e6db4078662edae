//! The Lua scripts of `lua/`, compiled in, and the ARGV each algorithm takes. Each script's
//! header comment lists its KEYS and ARGV.
//!
//! A check is described once, as a [`Call`] (script, key, arguments), and then either written
//! straight into a `EVALSHA` command for the store's own connection ([`Call::encode`]) or turned
//! into a redis-rs invocation for the library path ([`Call::invocation`]).

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::LazyLock;

use ::redis::{Script, ScriptInvocation};

mod fleet;

pub(crate) use fleet::FleetOp;

use super::coalesce::{Join, Joined, Kind};
use super::resp::{bulk, push_count};
use crate::limit::{Aimd, Algorithm, Millis, Pace, Report, Slots, Window};

/// One script: its body (for `EVAL` after a `NOSCRIPT`) and its SHA1 (for `EVALSHA`).
pub(crate) struct Lua {
    script: Script,
    body: &'static str,
    /// `EVALSHA sha 1` as RESP bulk strings: the start of every call, encoded once
    evalsha_head: Vec<u8>,
}

impl Lua {
    fn new(body: &'static str) -> Lua {
        let script = Script::new(body);
        let mut evalsha_head = Vec::new();
        bulk(&mut evalsha_head, b"EVALSHA");
        bulk(&mut evalsha_head, script.get_hash().as_bytes());
        bulk(&mut evalsha_head, b"1");
        Lua {
            script,
            body,
            evalsha_head,
        }
    }
}

/// The scripts of the checks that may be joined: static, so a [`Check`] names its script
/// without a reference count.
static TOKEN_BUCKET: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/token_bucket.lua")));
static LEAKY_BUCKET: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/leaky_bucket.lua")));

/// The five scripts and `pace_defer.lua`, hashed once at start-up.
pub(crate) struct Scripts {
    token_bucket: &'static Lua,
    leaky_bucket: &'static Lua,
    fixed_window: Lua,
    sliding_window: Lua,
    sliding_window_counter: Lua,
    pace_defer: Lua,
    give_back: Lua,
    charge: Lua,
    peek: Lua,
    forget: Lua,
    resets: Lua,
    concurrency: Lua,
    adapt: Lua,
    fleet: Lua,
}

/// One argument, written in Rust's shortest round-trip form for numbers, so the script's
/// `tonumber` reads back exactly the `f64` the memory store computes with.
#[derive(Clone, Copy)]
enum Arg {
    Int(u64),
    Num(f64),
    /// an empty string: "not given" (e.g. no `max_delay`)
    Empty,
    /// a word (an algorithm's name)
    Word(&'static str),
}

/// The most ARGV a [`Call`] takes: `lua/adapt.lua`'s seven and `now`. (A charge takes the
/// algorithm, two parameters, the amount and `now`; a charged token bucket its rate, burst,
/// cost, `debt` and `now`.)
const MAX_ARGS: usize = 8;

/// One script call: KEYS[1] = `key`, ARGV in the script's order, and `now` last when given.
pub(crate) struct Call<'a> {
    lua: &'a Lua,
    key: &'a str,
    args: [Arg; MAX_ARGS],
    len: usize,
    /// a token or leaky bucket on the server's clock: its script, rate and join, so it may be
    /// joined with the other checks of its bucket (see [`super::coalesce`])
    joinable: Option<(&'static Lua, f64, Join)>,
    /// the arguments are a limit's own, the same on every check (no `now`, no hold time): worth
    /// keeping written (see [`push_args`])
    same_each_time: bool,
}

impl Scripts {
    pub(crate) fn new() -> Scripts {
        Scripts {
            token_bucket: &TOKEN_BUCKET,
            leaky_bucket: &LEAKY_BUCKET,
            fixed_window: Lua::new(include_str!("../../lua/fixed_window.lua")),
            sliding_window: Lua::new(include_str!("../../lua/sliding_window.lua")),
            sliding_window_counter: Lua::new(include_str!("../../lua/sliding_window_counter.lua")),
            pace_defer: Lua::new(include_str!("../../lua/pace_defer.lua")),
            give_back: Lua::new(include_str!("../../lua/give_back.lua")),
            charge: Lua::new(include_str!("../../lua/charge.lua")),
            peek: Lua::new(include_str!("../../lua/peek.lua")),
            forget: Lua::new(include_str!("../../lua/forget.lua")),
            resets: Lua::new(include_str!("../../lua/resets.lua")),
            concurrency: Lua::new(include_str!("../../lua/concurrency.lua")),
            adapt: Lua::new(include_str!("../../lua/adapt.lua")),
            fleet: Lua::new(include_str!("../../lua/fleet.lua")),
        }
    }

    /// The call deciding one request for `key` under `alg`.
    pub(crate) fn check<'a>(
        &'a self,
        key: &'a str,
        alg: &Algorithm,
        now: Option<Millis>,
    ) -> Call<'a> {
        let mut call = match alg {
            Algorithm::TokenBucket(b) => {
                let call = Call::new(self.token_bucket, key)
                    .arg(Arg::Num(b.rate.per_sec()))
                    .arg(Arg::Int(b.burst.get().into()))
                    .arg(Arg::Int(b.cost.get().into()));
                match b.debt {
                    true => call.arg(Arg::Word("debt")),
                    false => call,
                }
            }
            Algorithm::LeakyBucket(p) => Call::new(self.leaky_bucket, key)
                .arg(Arg::Num(p.rate.per_sec()))
                .arg(p.max_delay_ms.map_or(Arg::Empty, Arg::Num)),
            Algorithm::FixedWindow(w) => window(&self.fixed_window, key, w),
            Algorithm::SlidingWindow(w) => window(&self.sliding_window, key, w),
            Algorithm::SlidingWindowCounter(w) => window(&self.sliding_window_counter, key, w),
            // a check of concurrency takes nothing: slots are taken by `slots` with a holder
            Algorithm::Concurrency(s) => Call::new(&self.concurrency, key)
                .arg(Arg::Word("look"))
                .arg(Arg::Int(s.limit.get().into()))
                .arg(Arg::Int(s.lease_ms.get()))
                .arg(Arg::Empty),
        };
        call.same_each_time = now.is_none();
        match (now, alg) {
            (Some(_), _) => call = call.now(now),
            // (a charged bucket is not joined, so it takes no lease either: a lease handed
            // out after a charge would not know of the debt)
            (None, Algorithm::TokenBucket(b)) if !b.debt => {
                let cost = b.cost.get().into();
                let burst = b.burst.get().into();
                let kind = Kind::Tokens { cost, burst };
                let join = Join::new(kind, b.rate.interval_ms());
                call.joinable = Some((&TOKEN_BUCKET, b.rate.per_sec(), join));
            }
            (None, Algorithm::LeakyBucket(p)) => {
                let kind = Kind::Slots {
                    rate: p.rate.per_sec(),
                    max_delay_ms: p.max_delay_ms,
                };
                let join = Join::new(kind, p.rate.interval_ms());
                call.joinable = Some((&LEAKY_BUCKET, p.rate.per_sec(), join));
            }
            (None, _) => {}
        }
        call
    }

    /// The call of `lua/pace_defer.lua` for upstream back-pressure.
    pub(crate) fn defer<'a>(
        &'a self,
        key: &'a str,
        pace: &Pace,
        hold_ms: u64,
        now: Option<Millis>,
    ) -> Call<'a> {
        Call::new(&self.pace_defer, key)
            .arg(Arg::Num(pace.rate.per_sec()))
            .arg(Arg::Int(hold_ms))
            .now(now)
    }
}

impl Scripts {
    /// The call of `lua/give_back.lua` undoing a check of `alg` on `key` made `age_ms` ago.
    pub(crate) fn give_back<'a>(
        &'a self,
        key: &'a str,
        alg: &Algorithm,
        age_ms: f64,
        now: Option<Millis>,
    ) -> Call<'a> {
        let taken = match alg {
            Algorithm::TokenBucket(b) => f64::from(b.cost.get()) * b.rate.interval_ms(),
            Algorithm::LeakyBucket(p) => p.rate.interval_ms(),
            Algorithm::FixedWindow(w)
            | Algorithm::SlidingWindow(w)
            | Algorithm::SlidingWindowCounter(w) => w.window_ms.get() as f64,
            // (never asked: a slot is released, not given back)
            Algorithm::Concurrency(_) => 0.0,
        };
        Call::new(&self.give_back, key)
            .arg(Arg::Word(alg.name()))
            .arg(Arg::Num(taken))
            .arg(Arg::Num(age_ms))
            .now(now)
    }
}

impl Scripts {
    /// The call of `lua/charge.lua` charging `amount` more to `key` under `alg` (negative:
    /// giving back); `None` for an algorithm that takes no charge.
    pub(crate) fn charge<'a>(
        &'a self,
        key: &'a str,
        alg: &Algorithm,
        amount: i64,
        now: Option<Millis>,
    ) -> Option<Call<'a>> {
        let (a, b) = match alg {
            Algorithm::TokenBucket(b) => (Arg::Num(b.rate.per_sec()), b.burst.get().into()),
            Algorithm::FixedWindow(w) | Algorithm::SlidingWindowCounter(w) => {
                (Arg::Int(w.limit.get()), w.window_ms.get())
            }
            Algorithm::LeakyBucket(_) | Algorithm::SlidingWindow(_) | Algorithm::Concurrency(_) => {
                return None
            }
        };
        let call = Call::new(&self.charge, key)
            .arg(Arg::Word(alg.name()))
            .arg(a)
            .arg(Arg::Int(b))
            .arg(Arg::Num(amount as f64))
            .now(now);
        Some(call)
    }

    /// The call of `lua/peek.lua`, which reads `key` and changes nothing.
    pub(crate) fn peek<'a>(&'a self, key: &'a str) -> Call<'a> {
        Call::new(&self.peek, key)
    }

    /// The call of `lua/forget.lua`, which deletes `key`.
    pub(crate) fn forget<'a>(&'a self, key: &'a str) -> Call<'a> {
        Call::new(&self.forget, key)
    }

    /// The call of `lua/resets.lua` on the counter at `key`, counting one more with `bump`.
    pub(crate) fn resets<'a>(&'a self, key: &'a str, bump: bool) -> Call<'a> {
        Call::new(&self.resets, key).arg(if bump { Arg::Word("bump") } else { Arg::Empty })
    }
}

/// A call of `lua/concurrency.lua` that names holders: their ids make its arguments text of
/// any length, which a [`Call`] does not hold.
pub(crate) struct SlotsCall<'a> {
    lua: &'a Lua,
    key: &'a str,
    args: Vec<String>,
}

/// The concurrency script's operations that name holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotsOp {
    Acquire,
    Renew,
    Release,
}

impl Scripts {
    /// The call of `lua/concurrency.lua` doing `op` for `holders` (one for acquire) on `key`.
    pub(crate) fn slots<'a>(
        &'a self,
        key: &'a str,
        op: SlotsOp,
        s: &Slots,
        holders: &[&str],
        now: Option<Millis>,
    ) -> SlotsCall<'a> {
        let op = match op {
            SlotsOp::Acquire => "acquire",
            SlotsOp::Renew => "renew",
            SlotsOp::Release => "release",
        };
        let mut args = vec![
            op.to_owned(),
            s.limit.to_string(),
            s.lease_ms.to_string(),
            holders.join(" "),
        ];
        if let Some(now) = now {
            // Display's shortest round trip: the script's tonumber reads back this very f64
            args.push(now.to_string());
        }
        SlotsCall {
            lua: &self.concurrency,
            key,
            args,
        }
    }
}

/// A script call the Redis store sends: as RESP bytes on its own connection, or as a redis-rs
/// invocation.
pub(crate) trait ScriptCall<'a> {
    /// The key it runs on (a Cluster sends it to the key's primary).
    fn key(&self) -> &str;
    /// As [`Call::encode`].
    fn encode(&self, out: &mut Vec<u8>, body: bool);
    /// As [`Call::check`].
    fn check(&self) -> Option<Check>;
    /// As [`Call::invocation`].
    fn invocation(&self) -> ScriptInvocation<'a>;
}

impl<'a> ScriptCall<'a> for Call<'a> {
    fn key(&self) -> &str {
        self.key
    }

    fn encode(&self, out: &mut Vec<u8>, body: bool) {
        Call::encode(self, out, body)
    }

    fn check(&self) -> Option<Check> {
        Call::check(self)
    }

    fn invocation(&self) -> ScriptInvocation<'a> {
        Call::invocation(self)
    }
}

/// Never joined.
impl<'a> ScriptCall<'a> for SlotsCall<'a> {
    fn key(&self) -> &str {
        self.key
    }

    fn encode(&self, out: &mut Vec<u8>, body: bool) {
        out.push(b'*');
        push_count(out, 4 + self.args.len() as u64);
        if body {
            bulk(out, b"EVAL");
            bulk(out, self.lua.body.as_bytes());
            bulk(out, b"1");
        } else {
            out.extend_from_slice(&self.lua.evalsha_head);
        }
        bulk(out, self.key.as_bytes());
        for arg in &self.args {
            bulk(out, arg.as_bytes());
        }
    }

    fn check(&self) -> Option<Check> {
        None
    }

    fn invocation(&self) -> ScriptInvocation<'a> {
        let mut inv = self.lua.script.key(self.key);
        for arg in &self.args {
            inv.arg(arg.as_str());
        }
        inv
    }
}

impl Scripts {
    /// The call of `lua/adapt.lua`: `report` applied to the adaptive rate at `key`.
    pub(crate) fn adapt<'a>(
        &'a self,
        key: &'a str,
        aimd: &Aimd,
        report: Report,
        now: Option<Millis>,
    ) -> Call<'a> {
        Call::new(&self.adapt, key)
            .arg(Arg::Num(aimd.start().per_sec()))
            .arg(Arg::Num(aimd.min().per_sec()))
            .arg(Arg::Num(aimd.max().per_sec()))
            .arg(Arg::Num(aimd.increase()))
            .arg(Arg::Num(aimd.decrease()))
            .arg(Arg::Word(report.as_str()))
            .arg(Arg::Num(aimd.period_ms()))
            .now(now)
    }
}

fn window<'a>(lua: &'a Lua, key: &'a str, w: &Window) -> Call<'a> {
    Call::new(lua, key)
        .arg(Arg::Int(w.limit.get()))
        .arg(Arg::Int(w.window_ms.get()))
}

impl<'a> Call<'a> {
    fn new(lua: &'a Lua, key: &'a str) -> Call<'a> {
        Call {
            lua,
            key,
            args: [Arg::Empty; MAX_ARGS],
            len: 0,
            joinable: None,
            same_each_time: false,
        }
    }

    fn arg(mut self, arg: Arg) -> Call<'a> {
        self.args[self.len] = arg;
        self.len += 1;
        self
    }

    /// `now` last, when given: a call on the caller's clock, not the server's.
    fn now(self, now: Option<Millis>) -> Call<'a> {
        match now {
            Some(now) => self.arg(Arg::Num(now)),
            None => self,
        }
    }

    fn args(&self) -> &[Arg] {
        &self.args[..self.len]
    }

    /// The call as a redis-rs invocation (which loads the script itself after `NOSCRIPT`).
    pub(crate) fn invocation(&self) -> ScriptInvocation<'a> {
        let mut inv = self.lua.script.key(self.key);
        for arg in self.args() {
            match *arg {
                Arg::Int(n) => inv.arg(n),
                Arg::Num(x) => inv.arg(x.to_string()),
                Arg::Empty => inv.arg(""),
                Arg::Word(w) => inv.arg(w),
            };
        }
        inv
    }

    /// Appends the call to `out` as one RESP command: `EVALSHA sha 1 key args…`, or with
    /// `body`, `EVAL script 1 key args…` (which also loads the script into Redis's cache).
    pub(crate) fn encode(&self, out: &mut Vec<u8>, body: bool) {
        out.push(b'*');
        push_count(out, 4 + self.len as u64); // EVALSHA sha 1 key args…
        if body {
            bulk(out, b"EVAL");
            bulk(out, self.lua.body.as_bytes());
            bulk(out, b"1");
        } else {
            out.extend_from_slice(&self.lua.evalsha_head);
        }
        bulk(out, self.key.as_bytes());
        if self.same_each_time {
            push_args(self.args(), out);
        } else {
            write_args(self.args(), out);
        }
    }

    /// The call as a check the connection may join with others of its bucket, if it may be:
    /// written by the connection's driver when it writes the batch ([`Check::write`]).
    pub(crate) fn check(&self) -> Option<Check> {
        let (lua, rate, join) = self.joinable?;
        Some(Check {
            lua,
            hash: super::coalesce::hash(self.key.as_bytes()),
            key: self.key.into(),
            rate,
            join,
        })
    }
}

/// A check of a token or leaky bucket on the server's clock, as the store's own connection
/// keeps it until it writes it: alone, joined with others of its bucket, or with the keys of
/// other buckets of the same limit.
#[derive(Clone)]
pub(crate) struct Check {
    lua: &'static Lua,
    key: Box<str>,
    /// the key's hash, to find the checks of one bucket without comparing keys
    pub(crate) hash: u64,
    /// per second
    rate: f64,
    pub(crate) join: Join,
}

impl Check {
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// Whether `other` checks the same bucket the same way: the same script, key and
    /// parameters (a token bucket's cost aside, which a joined call adds up).
    pub(crate) fn same_bucket(&self, other: &Check) -> bool {
        self.hash == other.hash && self.key == other.key && self.same_limit(other, false)
    }

    /// Whether `other` is the same token-bucket check but for its key: the two may go as one
    /// call with both keys.
    pub(crate) fn same_but_key(&self, other: &Check) -> bool {
        self.same_limit(other, true)
    }

    /// The same script and rate, and the same kind's parameters; with `keys`, token buckets
    /// of the same cost only. Numbers are compared by their bits: only then are they written
    /// the same.
    fn same_limit(&self, other: &Check, keys: bool) -> bool {
        let bits = |x: Option<f64>| x.map(f64::to_bits);
        std::ptr::eq(self.lua, other.lua)
            && self.rate.to_bits() == other.rate.to_bits()
            && match (self.join.kind, other.join.kind) {
                (Kind::Tokens { cost: a, burst: x }, Kind::Tokens { cost: b, burst: y }) => {
                    x == y && (!keys || a == b)
                }
                (
                    Kind::Slots {
                        max_delay_ms: a, ..
                    },
                    Kind::Slots {
                        max_delay_ms: b, ..
                    },
                ) => !keys && bits(a) == bits(b),
                _ => false,
            }
    }

    /// The check's arguments: rate, burst and cost, or rate and `max_delay`.
    fn args(&self) -> ([Arg; 3], usize) {
        match self.join.kind {
            Kind::Tokens { cost, burst } => {
                ([Arg::Num(self.rate), Arg::Int(burst), Arg::Int(cost)], 3)
            }
            Kind::Slots { max_delay_ms, .. } => {
                let max = max_delay_ms.map_or(Arg::Empty, Arg::Num);
                ([Arg::Num(self.rate), max, Arg::Empty], 2)
            }
        }
    }

    /// Appends the check alone, as [`Call::encode`] writes it.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let (args, len) = self.args();
        self.write_head(out, len);
        push_args(&args[..len], out);
    }

    /// Appends the one call of this check joined with others of its bucket, asking `joined`.
    pub(crate) fn write_joined(&self, joined: Joined, out: &mut Vec<u8>) {
        let (mut args, len) = self.args();
        match joined {
            Joined::Cost(cost) => args[len - 1] = Arg::Int(cost),
            Joined::Slots { rate, max_delay_ms } => {
                args[0] = Arg::Num(rate);
                args[1] = max_delay_ms.map_or(Arg::Empty, Arg::Num);
            }
        }
        self.write_head(out, len);
        write_args(&args[..len], out);
    }

    /// Appends one call of the script with the keys of the `keys` checks of `checks`, and the
    /// arguments of this one (each [`Check::same_but_key`] as it).
    pub(crate) fn write_keys<'c>(
        &self,
        keys: usize,
        checks: impl Iterator<Item = &'c Check>,
        out: &mut Vec<u8>,
    ) {
        let (args, len) = self.args();
        out.push(b'*');
        push_count(out, (3 + keys + len) as u64); // EVALSHA sha n keys… args…
        bulk(out, b"EVALSHA");
        bulk(out, self.lua.script.get_hash().as_bytes());
        bulk(out, crate::decimal::digits(keys as u64, &mut [0; 20]));
        for check in checks {
            bulk(out, check.key.as_bytes());
        }
        push_args(&args[..len], out);
    }

    /// `*n EVALSHA sha 1 key` of a check with `args` arguments.
    fn write_head(&self, out: &mut Vec<u8>, args: usize) {
        out.push(b'*');
        push_count(out, 4 + args as u64);
        out.extend_from_slice(&self.lua.evalsha_head);
        bulk(out, self.key.as_bytes());
    }
}

thread_local! {
    /// Arguments already written, by their values: a limit's arguments are the same on every
    /// check (only the key changes), and writing numbers as text was most of a command's cost.
    /// Per thread (no lock), and a few dozen limits' worth at most.
    static WRITTEN: RefCell<Vec<Written>> = const { RefCell::new(Vec::new()) };
}

/// Arguments as [`push_args`] writes them.
struct Written {
    args: [Arg; MAX_ARGS],
    len: usize,
    bytes: Vec<u8>,
    /// where the last argument starts in `bytes`
    last: usize,
}

/// How many argument lists a thread keeps written.
const WRITTEN_MAX: usize = 64;

/// Appends `args` as RESP bulk strings, from the thread's written ones when they are there;
/// returns where the last one starts, from where they began.
fn push_args(args: &[Arg], out: &mut Vec<u8>) -> usize {
    WRITTEN.with(|written| {
        let mut written = written.borrow_mut();
        if let Some(w) = written.iter().find(|w| same_args(&w.args[..w.len], args)) {
            out.extend_from_slice(&w.bytes);
            return w.last;
        }
        if written.len() >= WRITTEN_MAX {
            return write_args(args, out);
        }
        let mut bytes = Vec::with_capacity(64);
        let last = write_args(args, &mut bytes);
        out.extend_from_slice(&bytes);
        let mut kept = [Arg::Empty; MAX_ARGS];
        kept[..args.len()].copy_from_slice(args);
        written.push(Written {
            args: kept,
            len: args.len(),
            bytes,
            last,
        });
        last
    })
}

/// The same arguments, written the same: numbers compared by their bits (`-0.0` is not `0.0`
/// here, and no NaN is ever the same).
fn same_args(a: &[Arg], b: &[Arg]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Arg::Int(x), Arg::Int(y)) => x == y,
            (Arg::Num(x), Arg::Num(y)) => x.to_bits() == y.to_bits() && !x.is_nan(),
            (Arg::Empty, Arg::Empty) => true,
            (Arg::Word(x), Arg::Word(y)) => x == y,
            _ => false,
        })
}

/// Appends `args` as RESP bulk strings; returns where the last one starts, from where they
/// began.
fn write_args(args: &[Arg], out: &mut Vec<u8>) -> usize {
    let start = out.len();
    let mut last = 0;
    let mut num = Scratch::default();
    for arg in args {
        last = out.len() - start;
        num.len = 0;
        match *arg {
            Arg::Int(n) => {
                bulk(out, crate::decimal::digits(n, &mut [0; 20]));
                continue;
            }
            // a whole number prints as its digits (Display writes 100.0 as "100"), without
            // the float formatting machinery: rates are usually whole
            Arg::Num(x) if x.fract() == 0.0 && x.is_sign_positive() && x < 1e15 => {
                bulk(out, crate::decimal::digits(x as u64, &mut [0; 20]));
                continue;
            }
            Arg::Num(x) => {
                // Display writes every digit, without an exponent: the rare number longer
                // than the buffer (a rate of one a year, say) goes through a String
                if write!(num, "{x}").is_err() {
                    bulk(out, x.to_string().as_bytes());
                    continue;
                }
            }
            Arg::Empty => {}
            Arg::Word(w) => {
                bulk(out, w.as_bytes());
                continue;
            }
        }
        bulk(out, num.as_bytes());
    }
    last
}

/// A number's text, on the stack.
#[derive(Default)]
struct Scratch {
    buf: [u8; 32],
    len: usize,
}

impl Scratch {
    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for Scratch {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let slot = self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Bucket, Rate};
    use std::num::NonZeroU32;

    /// A limit's arguments kept written give the very command as writing them afresh, on the
    /// first check and the next ones, for every algorithm; and a check the connection writes
    /// alone is that very command too.
    #[test]
    fn kept_arguments_encode_as_written_ones() {
        let scripts = Scripts::new();
        let bucket = |rate: f64, burst: u32| {
            Algorithm::TokenBucket(Bucket {
                rate: Rate::per_second(rate).unwrap(),
                burst: NonZeroU32::new(burst).unwrap(),
                cost: NonZeroU32::new(1).unwrap(),
                debt: false,
            })
        };
        let pace = Algorithm::LeakyBucket(Pace {
            rate: Rate::per_second(2.5).unwrap(),
            max_delay_ms: Some(250.0),
        });
        for alg in [
            bucket(100.0, 20),
            bucket(0.3, 7),
            bucket(1e8, 100_000_000),
            pace,
        ] {
            for key in ["k:1", "another:key"] {
                let call = scripts.check(key, &alg, None);
                assert!(call.same_each_time);
                let mut kept = Vec::new();
                call.encode(&mut kept, false);
                let mut fresh = Vec::new();
                Call {
                    same_each_time: false,
                    ..scripts.check(key, &alg, None)
                }
                .encode(&mut fresh, false);
                assert_eq!(kept, fresh, "{alg:?}");
                let mut written = Vec::new();
                call.check().expect("joinable").write(&mut written);
                assert_eq!(written, kept, "{alg:?}");
            }
        }
    }

    /// A charged bucket's check says `debt` before `now`, and is never joined (so never
    /// leased): tokens handed out ahead would not know of a debt charged since.
    #[test]
    fn a_charged_bucket_says_debt_and_is_not_joined() {
        let scripts = Scripts::new();
        let plain = Bucket {
            rate: Rate::per_second(5000.0).unwrap(),
            burst: NonZeroU32::new(10_000).unwrap(),
            cost: NonZeroU32::new(1).unwrap(),
            debt: false,
        };
        let charged = Algorithm::TokenBucket(plain).charged();
        let mut out = Vec::new();
        scripts.check("k", &charged, None).encode(&mut out, false);
        assert!(scripts.check("k", &charged, None).check().is_none());
        assert!(String::from_utf8_lossy(&out).ends_with("$4\r\ndebt\r\n"));
        let mut out = Vec::new();
        scripts
            .check("k", &charged, Some(7.0))
            .encode(&mut out, false);
        assert!(String::from_utf8_lossy(&out).ends_with("$4\r\ndebt\r\n$1\r\n7\r\n"));
        let plain = Algorithm::TokenBucket(plain);
        assert!(scripts.check("k", &plain, None).check().is_some());
    }

    /// A check is encoded as the RESP array redis-rs would send: EVALSHA, the SHA1, one key,
    /// the arguments as text (the count's `\r\n` excepted), and `now` last.
    #[test]
    fn calls_encode_as_evalsha_commands() {
        let scripts = Scripts::new();
        let alg = Algorithm::TokenBucket(Bucket {
            rate: Rate::per_second(2.5).unwrap(),
            burst: NonZeroU32::new(10).unwrap(),
            cost: NonZeroU32::new(1).unwrap(),
            debt: false,
        });
        let mut out = Vec::new();
        scripts
            .check("k:1", &alg, Some(1e12 + 0.5))
            .encode(&mut out, false);
        let sha = scripts.token_bucket.script.get_hash();
        let want = format!(
            "*8\r\n$7\r\nEVALSHA\r\n$40\r\n{sha}\r\n$1\r\n1\r\n$3\r\nk:1\r\n\
             $3\r\n2.5\r\n$2\r\n10\r\n$1\r\n1\r\n$15\r\n1000000000000.5\r\n"
        );
        assert_eq!(String::from_utf8(out).unwrap(), want);

        let mut out = Vec::new();
        scripts.check("k", &alg, None).encode(&mut out, true);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("*7\r\n$4\r\nEVAL\r\n"), "{text}");
        assert!(
            text.contains(scripts.token_bucket.body),
            "the body is sent whole"
        );
        assert!(
            text.ends_with("$3\r\n2.5\r\n$2\r\n10\r\n$1\r\n1\r\n"),
            "{text}"
        );

        // a token bucket on the server's clock may be joined: joined, its cost is the sum;
        // with its own `now`, or another script, it may not
        let check = scripts.check("k:1", &alg, None).check().expect("joinable");
        assert_eq!(
            (check.join.kind, check.join.interval_ms),
            (Kind::Tokens { cost: 1, burst: 10 }, 400.0)
        );
        let mut out = Vec::new();
        check.write_joined(Joined::Cost(12), &mut out);
        let want = format!(
            "*7\r\n$7\r\nEVALSHA\r\n$40\r\n{sha}\r\n$1\r\n1\r\n$3\r\nk:1\r\n\
             $3\r\n2.5\r\n$2\r\n10\r\n$2\r\n12\r\n"
        );
        assert_eq!(String::from_utf8(out).unwrap(), want);
        // the checks of other keys of the same limit go as one call with all their keys
        let other = scripts.check("k:22", &alg, None).check().unwrap();
        assert!(check.same_but_key(&other) && !check.same_bucket(&other));
        let mut out = Vec::new();
        check.write_keys(2, [&check, &other].into_iter(), &mut out);
        let want = format!(
            "*8\r\n$7\r\nEVALSHA\r\n$40\r\n{sha}\r\n$1\r\n2\r\n$3\r\nk:1\r\n\
             $4\r\nk:22\r\n$3\r\n2.5\r\n$2\r\n10\r\n$1\r\n1\r\n"
        );
        assert_eq!(String::from_utf8(out).unwrap(), want);
        // a leaky bucket: rate and max_delay change when joined, and all of it must be equal
        let pace = |max: u64| {
            Algorithm::LeakyBucket(
                crate::limit::Pace::new(
                    Rate::per_second(4.0).unwrap(),
                    Some(std::time::Duration::from_millis(max)),
                )
                .unwrap(),
            )
        };
        let slots = scripts.check("p", &pace(1000), None).check();
        let slots = slots.expect("joinable");
        assert_eq!(
            slots.join.kind,
            Kind::Slots {
                rate: 4.0,
                max_delay_ms: Some(1000.0)
            }
        );
        let mut out = Vec::new();
        let joined = Joined::Slots {
            rate: 4.0 / 3.0,
            max_delay_ms: None,
        };
        slots.write_joined(joined, &mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("*6\r\n$7\r\nEVALSHA\r\n"), "{text}");
        assert!(text.ends_with("$1\r\np\r\n$18\r\n1.3333333333333333\r\n$0\r\n\r\n"));
        let same = scripts.check("p", &pace(1000), None).check().unwrap();
        assert!(slots.same_bucket(&same) && !slots.same_but_key(&same));
        let longer = scripts.check("p", &pace(1001), None).check().unwrap();
        assert!(!slots.same_bucket(&longer));
        let costly = Algorithm::TokenBucket(Bucket {
            cost: NonZeroU32::new(3).unwrap(),
            ..Bucket::new(
                Rate::per_second(2.5).unwrap(),
                NonZeroU32::new(10).unwrap(),
                NonZeroU32::new(1).unwrap(),
            )
            .unwrap()
        });
        let costly = scripts.check("k:1", &costly, None).check().unwrap();
        assert!(check.same_bucket(&costly) && !check.same_but_key(&costly));
        assert!(!check.same_bucket(&slots));
        assert!(scripts.check("k:1", &alg, Some(5.0)).check().is_none());
        let window = Algorithm::FixedWindow(Window {
            limit: std::num::NonZeroU64::new(5).unwrap(),
            window_ms: std::num::NonZeroU64::new(1000).unwrap(),
        });
        assert!(scripts.check("k:1", &window, None).check().is_none());

        // whole and fractional numbers are written as Display writes them
        for x in [
            0.0f64,
            1.0,
            100.0,
            1e8,
            1e14,
            999_999_999_999_999.0,
            1e15,
            2.5,
            1e-3,
            1.7e12 + 0.25,
        ] {
            let alg = Algorithm::TokenBucket(Bucket {
                rate: Rate::per_second(x.max(1e-9)).unwrap(),
                burst: NonZeroU32::new(1).unwrap(),
                cost: NonZeroU32::new(1).unwrap(),
                debt: false,
            });
            let mut out = Vec::new();
            scripts.check("k", &alg, Some(x)).encode(&mut out, false);
            let text = String::from_utf8(out).unwrap();
            let now = x.to_string();
            assert!(
                text.ends_with(&format!("${}\r\n{now}\r\n", now.len())),
                "{x}: {text}"
            );
        }

        // a number longer than the stack buffer (a rate of one in 100 million years) is written whole
        let slow = Algorithm::TokenBucket(Bucket {
            rate: Rate::per_second(1.0 / 3.0e15).unwrap(),
            burst: NonZeroU32::new(1).unwrap(),
            cost: NonZeroU32::new(1).unwrap(),
            debt: false,
        });
        let mut out = Vec::new();
        scripts.check("k", &slow, None).encode(&mut out, false);
        let rate = (1.0f64 / 3.0e15).to_string();
        assert!(rate.len() > 32);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(&format!("${}\r\n{rate}\r\n", rate.len())),
            "{text}"
        );
    }
}

//! The store's own connection to one Redis (TCP, TLS or a unix socket), built for the hot path.
//!
//! Every check is one `EVALSHA`; thousands run at once from the proxy's tasks. A caller puts
//! its command into a channel, encoded already ([`super::scripts::Call::encode`]) or, for a
//! check that may be joined, as a typed [`Check`], and waits on a oneshot; one driver task
//! owns the socket, writes every command waiting in the channel with one `write` once the
//! batch before is answered (one batch in flight: under load the
//! next gathers while Redis works; see [`drive`] for when that rule is set aside), reads the
//! replies as they come and hands each, in order, to its caller (Redis answers the commands of
//! one connection in order). The replies are parsed as they come, with no intermediate frames,
//! into the store's own reply and error types ([`super::resp`]). redis-rs does the same with
//! more layers, which cost more than the call itself (see BENCHMARKS.md). A Cluster's
//! connection ([`super::cluster`]) is one pipe per primary.
//!
//! The pieces: [`drive`] is the driver task, [`batch`] writes a batch and shares joined
//! replies out, [`alarm`] keeps the deadlines, [`connect`] opens a connection, and
//! [`sentinel`] follows the master that Sentinels name.
//!
//! Every call carries its deadline, and the driver keeps them: one timer for the whole lane,
//! set to the earliest deadline of the calls it holds (late calls are answered
//! [`Failure::Late`]; a written one keeps its place for its reply, which is then dropped). A
//! timer per call, registered and removed in the runtime's timer wheel, cost more than the rest
//! of the call's way through the driver (BENCHMARKS.md). The driver never waits on anything
//! but its socket, its calls and that timer together, so no deadline is missed while it
//! connects or while Redis does not read what it writes.
//!
//! The connection is made when the first call comes and again after it breaks: a call that
//! finds no connection waits for the attempt it started (bounded by its deadline), so after an
//! outage the first call after Redis is back succeeds. When the socket fails, every
//! call waiting on it fails at once with the I/O error; nothing is retried, since a script may
//! have run. `AUTH` and `SELECT` from the URL are sent on every new connection.
//!
//! Checks of one bucket or pacing schedule that are written together are sent as one call
//! (see [`super::coalesce`]), and its reply shared out. Token-bucket checks of different keys
//! with the same limit that are written together go as one call too, with all their keys
//! (`lua/token_bucket.lua` answers one reply per key): most of a check's cost in Redis is the
//! script call, not the bucket (BENCHMARKS.md, distinct client keys). A key the script fails on
//! answers its own error; a call that fails whole (`NOSCRIPT`) ran nothing, and its checks go
//! again alone.
//!
//! A joined call of a busy token bucket far from empty also takes a few tokens ahead, a lease
//! ([`super::lease`]): the next checks of that bucket are answered from it in [`Pipe::call`],
//! before they reach the driver, and what a lease does not hand out the driver gives back.
//!
//! A pipe has one such connection per worker thread (its *lanes*; see [`set_thread_lane`]):
//! the calls of a worker's requests go over a connection whose driver runs on that worker's
//! runtime, so neither the call nor its reply wakes another thread (a cross-thread wake-up is
//! a syscall on each side). Calls made on any other thread use lane 0.

use std::cell::Cell;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::coalesce::{self, Join};
use super::lease::{self, Leases};
use super::reply::Reply;
use super::resp::{parse, parse_four, Error, Value};
use super::scripts::Check;
use alarm::Alarm;
use batch::{answer_joined, answer_keys, queue};
use connect::{asking, connect, Stream};
pub(crate) use connect::{auth, exchange, keepalive, tcp, words, USER_TIMEOUT};
use drive::drive;
use sentinel::Follow;
pub(crate) use sentinel::{Sentinel, Sentinels};

mod alarm;
mod batch;
mod connect;
mod drive;
mod sentinel;

/// Calls taken from the channel at a time.
const BATCH: usize = 256;
/// Scheduler turns a batch waits for more calls under load (see [`drive`]). With one batch in
/// flight and these turns, Redis's CPU per request fell from 2.6–2.9 to 1.1–1.3 µs and its
/// script runs per request from 0.08 to 0.026 at one worker (0.12 to 0.07 at two), against
/// batches written back to back while others were in flight; one batch in flight without the
/// turns ran more scripts than either (0.14 per request at two workers; BENCHMARKS.md).
const GATHER_TURNS: usize = 4;

/// Why a call got no value.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Redis answered with an error, or the connection failed
    Redis(Error),
    /// no reply by the call's deadline
    Late,
}

/// What a caller gets.
pub(crate) type Answer = Result<Reply, Failure>;

/// Where and how to connect.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    pub(crate) addr: Addr,
    /// `AUTH [username] password` on connect
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    /// `SELECT db` on connect, unless 0
    pub(crate) db: i64,
    /// bounds connecting, with `AUTH` and `SELECT` (and asking the Sentinels)
    pub(crate) connect_timeout: Duration,
    /// over TLS (`rediss://`): TCP addresses only, the Sentinels' too
    pub(crate) tls: Option<Tls>,
    /// a Cluster's primary: the keys of one call must share a slot
    pub(crate) cluster: bool,
}

/// A TCP address, a unix socket path, or the master that Sentinels name.
#[derive(Debug, Clone)]
pub(crate) enum Addr {
    Tcp(String, u16),
    Unix(PathBuf),
    Sentinel(Arc<Sentinels>),
}

/// How a TLS connection is made.
#[derive(Debug, Clone)]
pub(crate) struct Tls {
    pub(crate) config: Arc<rustls::ClientConfig>,
    /// the name to verify and send in SNI instead of the host connected to
    pub(crate) server_name: Option<String>,
}

/// A handle on the connections, one per lane; each lane's driver task starts with the lane's
/// first call (so a store can be built outside a runtime), on the calling thread's runtime, and
/// ends when the handle is dropped.
pub(crate) struct Pipe {
    endpoint: Endpoint,
    lanes: Box<[Lane]>,
}

/// One lane: the channel to its driver, and its leases ([`super::lease`]).
struct Lane {
    calls: OnceLock<mpsc::UnboundedSender<Call>>,
    leases: Arc<lease::Lane>,
}

thread_local! {
    /// The lane of every pipe that calls on this thread use.
    static LANE: Cell<usize> = const { Cell::new(0) };
}

/// Makes calls on this thread use lane `lane` of every pipe (modulo its lane count): set once
/// by each worker thread but the first, whose runtime then drives that lane's connection.
/// Every other thread (worker 0, the blocking pool, a test's runtime) uses lane 0.
pub(crate) fn set_thread_lane(lane: usize) {
    LANE.with(|l| l.set(lane));
}

struct Call {
    command: Command,
    slot: Slot,
}

/// What a call sends: its bytes are written once, when its batch is.
pub(crate) enum Command {
    /// a command its caller encoded
    Bytes(Vec<u8>),
    /// a check that may be joined with the others of its bucket
    Check(Check),
    /// a check to be written alone: the joined call it was in was refused
    Alone(Check),
    /// a command sent after `ASKING`: a Cluster's slot on its way to this node
    Asking(Vec<u8>),
}

impl Command {
    /// Appends the command, alone.
    pub(crate) fn write_to(&self, out: &mut Vec<u8>) {
        match self {
            Command::Bytes(bytes) => out.extend_from_slice(bytes),
            Command::Check(check) | Command::Alone(check) => check.write(out),
            Command::Asking(bytes) => {
                out.extend_from_slice(b"*1\r\n$6\r\nASKING\r\n");
                out.extend_from_slice(bytes);
            }
        }
    }
}

impl Call {
    /// The check, if it may be joined.
    fn check(&self) -> Option<&Check> {
        match &self.command {
            Command::Check(check) => Some(check),
            Command::Bytes(_) | Command::Alone(_) | Command::Asking(_) => None,
        }
    }

    /// Appends the call's command, alone, and queues what its replies are answered to.
    fn write(self, out: &mut Vec<u8>, waiting: &mut VecDeque<Waiting>) {
        self.command.write_to(out);
        if let Command::Asking(_) = self.command {
            waiting.push_back(Waiting::Nobody); // `ASKING`'s own `OK`
        }
        waiting.push_back(Waiting::One(self.slot));
    }

    /// The call, to be sent again alone.
    fn alone(self) -> Call {
        let command = match self.command {
            Command::Check(check) => Command::Alone(check),
            command => command,
        };
        Call {
            command,
            slot: self.slot,
        }
    }
}

/// Where a call's answer goes, and by when.
struct Slot {
    /// taken when answered
    reply: Option<oneshot::Sender<Answer>>,
    deadline: Instant,
}

impl Slot {
    fn answer(&mut self, answer: Answer) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(answer);
        }
    }

    fn reply(&mut self, reply: Result<Reply, Error>) {
        self.answer(reply.map_err(Failure::Redis));
    }

    /// Answered already, or its caller gave up (its request went on without it).
    fn done(&self) -> bool {
        self.reply.as_ref().is_none_or(oneshot::Sender::is_closed)
    }

    /// Answers [`Failure::Late`] if the deadline is past; the deadline still waited for.
    fn expire(&mut self, now: Instant) -> Option<Instant> {
        if self.deadline <= now {
            self.answer(Err(Failure::Late));
        }
        (!self.done()).then_some(self.deadline)
    }
}

/// What a command written to Redis is answered to.
enum Waiting {
    One(Slot),
    /// a joined call: its members in order, kept whole to be sent again alone if it is refused,
    /// and the tokens it took ahead for a lease ([`super::lease`])
    Joined(Vec<Call>, u64),
    /// one call for the checks of several keys: one reply each, in order
    Keys(Vec<Call>),
    /// a lease's give-back: its reply is dropped
    Nobody,
}

/// One command of a batch: a call alone, or the calls of one bucket joined, the first first.
enum Entry {
    Alone(Call),
    Joined(Vec<Call>),
}

impl Entry {
    fn first(&self) -> &Call {
        match self {
            Entry::Alone(call) => call,
            Entry::Joined(calls) => &calls[0],
        }
    }

    fn push(&mut self, call: Call) {
        match self {
            Entry::Joined(calls) => calls.push(call),
            Entry::Alone(_) => {
                let Entry::Alone(first) = std::mem::replace(self, Entry::Joined(Vec::new())) else {
                    unreachable!("matched as alone")
                };
                // room for a few more without growing: under load a bucket's checks come in tens
                let mut calls = Vec::with_capacity(8);
                calls.extend([first, call]);
                *self = Entry::Joined(calls);
            }
        }
    }
}

impl Pipe {
    /// A pipe with `lanes` connections (at least one).
    pub(crate) fn new(endpoint: Endpoint, lanes: usize) -> Pipe {
        Pipe {
            endpoint,
            lanes: (0..lanes.max(1))
                .map(|_| Lane {
                    calls: OnceLock::new(),
                    leases: Arc::new(lease::Lane::new()),
                })
                .collect(),
        }
    }

    /// Drops every lane's leases ([`super::lease::Leases::clear`]).
    pub(crate) fn forget_leases(&self) {
        for lane in &self.lanes {
            lane.leases.with(|leases| leases.clear());
        }
    }

    /// Whether the lanes take leases (they do unless told not to).
    pub(crate) fn set_leases(&self, on: bool) {
        for lane in &self.lanes {
            lane.leases.with(|leases| leases.enabled = on);
        }
    }

    /// Sends one command and waits for its reply, until `deadline` at the latest; a server
    /// error reply is a [`Failure::Redis`]. A [`Command::Check`] may be sent joined with others
    /// of its bucket, or be answered from its bucket's lease without being sent.
    pub(crate) async fn call(&self, command: Command, deadline: Instant) -> Answer {
        let lane = &self.lanes[LANE.with(Cell::get) % self.lanes.len()];
        if let Command::Check(check) = &command {
            if let Some(reply) = lane.leases.hand_out(check) {
                return Ok(Reply::Leased(reply));
            }
        }
        let calls = lane.calls.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(drive(self.endpoint.clone(), rx, lane.leases.clone()));
            tx
        });
        let (reply, answer) = oneshot::channel();
        let call = Call {
            command,
            slot: Slot {
                reply: Some(reply),
                deadline,
            },
        };
        let stopped = || Failure::Redis(gone("the Redis connection task has stopped"));
        calls.send(call).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Hands every complete reply in `input` to the call waiting longest, and drops those bytes.
/// The checks of a joined call that was refused go into `again`, to be sent alone. Returns
/// when the first lease taken ends, if one was; or, after handing them all out, an error when
/// one was `READONLY`: the server is a replica now (a failover demoted it, or a DNS name moved
/// on), so the connection is dropped and the next one finds the master.
fn deliver(
    input: &mut Vec<u8>,
    waiting: &mut VecDeque<Waiting>,
    joins: &mut Vec<Join>,
    leases: &mut Leases,
    again: &mut Vec<Call>,
) -> Result<Option<Instant>, Error> {
    let mut at = 0;
    let mut end: Option<Instant> = None;
    let mut readonly = None;
    let result = loop {
        let parsed = match parse_four(&input[at..]) {
            Some((four, used)) => Ok(Some((Reply::Four(four), used))),
            None => parse(&input[at..]).map(|v| v.map(|(value, used)| (Reply::Value(value), used))),
        };
        match parsed {
            Ok(Some((reply, used))) => {
                at += used;
                if readonly.is_none() {
                    readonly = read_only(&reply);
                }
                // the call may be late or given up: its reply is then dropped
                match waiting.pop_front() {
                    Some(Waiting::One(mut slot)) => slot.reply(checked(reply)),
                    Some(Waiting::Joined(calls, ahead)) => {
                        let taken = answer_joined(reply, calls, ahead, joins, leases, again);
                        end = end.or(taken);
                    }
                    Some(Waiting::Keys(calls)) => answer_keys(reply, calls, again),
                    Some(Waiting::Nobody) => {}
                    None => break Err(Error::Protocol("a reply to no command")),
                }
            }
            Ok(None) => break readonly.map_or(Ok(end), Err),
            Err(e) => break Err(e),
        }
    };
    input.drain(..at);
    result
}

/// The `READONLY` error `reply` is, if it is one.
fn read_only(reply: &Reply) -> Option<Error> {
    match reply {
        Reply::Value(Value::Error(e)) if e.code() == "READONLY" => Some(Error::ReadOnly(e.clone())),
        _ => None,
    }
}

/// Fails every waiting call with `error`.
fn fail(waiting: &mut VecDeque<Waiting>, error: &Error) {
    for waiting in waiting.drain(..) {
        match waiting {
            Waiting::One(mut slot) => slot.reply(Err(error.clone())),
            Waiting::Joined(calls, _) | Waiting::Keys(calls) => {
                for mut call in calls {
                    call.slot.reply(Err(error.clone()));
                }
            }
            Waiting::Nobody => {}
        }
    }
}

fn closed() -> Error {
    Error::io(
        io::ErrorKind::ConnectionReset,
        "Redis closed the connection",
    )
}

fn hung() -> Error {
    Error::io(
        io::ErrorKind::TimedOut,
        "the master did not answer in time: asking the Sentinels again",
    )
}

fn moved() -> Error {
    Error::io(
        io::ErrorKind::ConnectionReset,
        "the Sentinels named another master",
    )
}

fn gone(what: &'static str) -> Error {
    Error::io(io::ErrorKind::BrokenPipe, what)
}

/// Whether `error` is Redis saying it does not have the script (restarted, failed over, or
/// `SCRIPT FLUSH`): the call is then sent again as `EVAL` with the script's body.
pub(crate) fn is_noscript(failure: &Failure) -> bool {
    matches!(failure, Failure::Redis(e) if e.is_noscript())
}

/// A reply with the errors inside it made an `Err`.
fn checked(reply: Reply) -> Result<Reply, Error> {
    match reply {
        Reply::Value(value) => value.checked().map(Reply::Value),
        four => Ok(four),
    }
}

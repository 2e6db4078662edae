//! The store's own connection to one Redis (TCP, TLS or a unix socket), built for the hot path.
//!
//! Every check is one `EVALSHA`; thousands run at once from the proxy's tasks. A caller writes
//! its command (already encoded, see [`super::scripts::Call::encode`]) into a channel and waits
//! on a oneshot; one driver task owns the socket, writes every command waiting in the channel
//! with one `write` once the batch before is answered (one batch in flight: under load the
//! next gathers while Redis works; see [`serve`] for when that rule is set aside), reads the
//! replies as they come and hands each, in order, to its caller (Redis answers the commands of
//! one connection in order). The replies are parsed as they come, with no intermediate frames
//! ([`super::resp`]). redis-rs does the same with more layers, which cost more than the call
//! itself (see BENCHMARKS.md); it still serves a Cluster. How a batch is written and its
//! joined replies shared out is in [`batch`].
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
use std::future::{poll_fn, Future};
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use ::redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use rustls_pki_types::ServerName;
use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, Sleep};

use super::coalesce::{self, Join};
use super::lease::{self, Leases};
use super::reply::Reply;
use super::resp::{encode_command, parse, parse_four, protocol};
use batch::{answer_joined, answer_keys, queue};
use sentinel::Follow;
pub(crate) use sentinel::{Sentinel, Sentinels};

mod batch;
mod sentinel;

/// Calls taken from the channel at a time.
const BATCH: usize = 256;
/// Scheduler turns a batch waits for more calls under load (see [`serve`]). With one batch in
/// flight and these turns, Redis's CPU per request fell from 2.6–2.9 to 1.1–1.3 µs and its
/// script runs per request from 0.08 to 0.026 at one worker (0.12 to 0.07 at two), against
/// batches written back to back while others were in flight; one batch in flight without the
/// turns ran more scripts than either (0.14 per request at two workers; BENCHMARKS.md).
const GATHER_TURNS: usize = 4;

/// Why a call got no value.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Redis answered with an error, or the connection failed
    Redis(RedisError),
    /// no reply by the call's deadline
    Late,
}

/// What a caller gets.
pub(crate) type Answer = Result<Reply, Failure>;

/// A Redis that vanishes without resetting the connection (host lost, packets dropped) must
/// still be noticed: unacknowledged writes fail after `TCP_USER_TIMEOUT`, idle connections are
/// probed by keepalive; the I/O error then breaks the connection and the next call makes a new
/// one. Per-call timeouts alone would never do that. The same settings serve redis-rs's
/// connections (TLS, Cluster).
pub(crate) const USER_TIMEOUT: Duration = Duration::from_secs(5);

/// Keepalive probes after 10 s idle, every 2 s (see [`USER_TIMEOUT`]).
pub(crate) fn keepalive() -> TcpKeepalive {
    TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(2))
}

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
    command: Vec<u8>,
    slot: Slot,
    /// a check that may be joined with the others of its bucket
    join: Option<Join>,
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

    fn reply(&mut self, reply: Result<Reply, RedisError>) {
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

/// The lane's one timer: rings at (or before) the earliest deadline of the calls the driver
/// holds. Set later only when it rings, so a steady flow of calls, each due a timeout after
/// the one before, costs the timer wheel nothing per call.
struct Alarm {
    sleep: Pin<Box<Sleep>>,
    at: Option<Instant>,
    /// whether the timer has been polled since it was set: it then holds the driver's waker
    /// (the driver is one task) and only its state need be read on later turns
    polled: bool,
}

impl Alarm {
    fn new() -> Alarm {
        Alarm {
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            at: None,
            polled: false,
        }
    }

    /// Makes the alarm ring by `deadline`.
    fn set(&mut self, deadline: Instant) {
        if self.at.is_none_or(|at| deadline < at) {
            self.sleep.as_mut().reset(deadline);
            self.at = Some(deadline);
            self.polled = false;
        }
    }

    fn set_for(&mut self, calls: &[Call]) {
        for call in calls {
            self.set(call.slot.deadline);
        }
    }

    /// Waits until the alarm rings (for ever when it is not set).
    async fn rung(&mut self) {
        poll_fn(|cx| {
            if self.at.is_none() {
                return Poll::Pending;
            }
            let rang = if self.polled {
                self.sleep.is_elapsed()
            } else {
                // Out of budget, the timer would answer Pending without registering (and
                // wake the task to be polled again): only a poll with budget counts.
                self.polled = tokio::task::coop::has_budget_remaining();
                self.sleep.as_mut().poll(cx).is_ready()
            };
            if rang {
                self.at = None;
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Answers every call past its deadline ([`Failure::Late`]): those not written yet leave
    /// `batch`, written ones keep their place in `waiting`. Sets the alarm for the rest. True
    /// when a written call is past its deadline: Redis is late with its reply.
    fn expire(&mut self, batch: &mut Vec<Call>, waiting: &mut VecDeque<Waiting>) -> bool {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut keep = |slot: &mut Slot| match slot.expire(now) {
            Some(deadline) => {
                next = Some(next.map_or(deadline, |n| n.min(deadline)));
                true
            }
            None => false,
        };
        batch.retain_mut(|call| keep(&mut call.slot));
        let mut overdue = false;
        let mut written = |slot: &mut Slot| {
            overdue |= slot.deadline <= now;
            keep(slot);
        };
        for waiting in waiting.iter_mut() {
            match waiting {
                Waiting::One(slot) => written(slot),
                Waiting::Joined(calls, _) | Waiting::Keys(calls) => {
                    calls.iter_mut().for_each(|c| written(&mut c.slot));
                }
                Waiting::Nobody => {}
            }
        }
        if let Some(next) = next {
            self.set(next);
        }
        overdue
    }
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

    /// Sends one encoded command and waits for its reply, until `deadline` at the latest; a
    /// server error reply is a [`Failure::Redis`]. With `join`, the command may be sent joined
    /// with others of its bucket, or be answered from its bucket's lease without being sent.
    pub(crate) async fn call(
        &self,
        command: Vec<u8>,
        join: Option<Join>,
        deadline: Instant,
    ) -> Answer {
        let lane = &self.lanes[LANE.with(Cell::get) % self.lanes.len()];
        if let Some(reply) = join.and_then(|join| lane.leases.hand_out(&command, join)) {
            return Ok(Reply::Leased(reply));
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
            join,
        };
        let stopped = || Failure::Redis(gone("the Redis connection task has stopped"));
        calls.send(call).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// The driver: connects when calls come, serves them until the connection breaks, repeats.
async fn drive(
    endpoint: Endpoint,
    mut calls: mpsc::UnboundedReceiver<Call>,
    leases: Arc<lease::Lane>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut alarm = Alarm::new();
    let mut follow = match &endpoint.addr {
        Addr::Sentinel(sentinels) => {
            sentinels.listen(endpoint.tls.as_ref(), asking(&endpoint));
            sentinels.follow()
        }
        _ => Follow::fixed(),
    };
    loop {
        if batch.is_empty() {
            tokio::select! {
                biased;
                n = calls.recv_many(&mut batch, BATCH) => if n == 0 {
                    return; // every handle dropped
                },
                () = alarm.rung() => {
                    alarm.expire(&mut batch, &mut VecDeque::new());
                }
            }
            alarm.set_for(&batch);
        }
        // Calls whose callers gave up (their requests went on without them) are not worth a
        // connection attempt, nor a script run once Redis is back: running them would take
        // tokens twice.
        batch.retain(|call| !call.slot.done());
        if batch.is_empty() {
            continue;
        }
        // Calls that come while connecting wait for this attempt if it succeeds, or make the
        // next one: a failed attempt answers only the calls that were there when it started
        // (one started before Redis came back would fail them for nothing).
        let mut later = Vec::new();
        let connecting = tokio::time::timeout(endpoint.connect_timeout, connect(&endpoint));
        tokio::pin!(connecting);
        follow.on(None);
        let connected = loop {
            tokio::select! {
                biased;
                connected = &mut connecting => break Some(connected),
                // a failover while connecting: to the new master at once, not after the
                // attempt on the old one times out
                () = follow.moved() => break None,
                () = alarm.rung() => {
                    alarm.expire(&mut batch, &mut VecDeque::new());
                    alarm.expire(&mut later, &mut VecDeque::new());
                }
                n = calls.recv_many(&mut later, BATCH) => {
                    if n == 0 {
                        return;
                    }
                    alarm.set_for(&later[later.len() - n..]);
                }
            }
        };
        let Some(connected) = connected else {
            batch.append(&mut later);
            continue;
        };
        let connected = connected.unwrap_or_else(|_| {
            Err(RedisError::from(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "connecting to Redis took over {:?}",
                    endpoint.connect_timeout
                ),
            )))
        });
        let open = match connected {
            Err(e) => {
                for mut call in batch.drain(..) {
                    call.slot.reply(Err(copy(&e)));
                }
                batch.append(&mut later);
                continue;
            }
            Ok((stream, named)) => {
                batch.append(&mut later);
                follow.on(named.as_ref());
                let mut lane = Driver {
                    calls: &mut calls,
                    batch: &mut batch,
                    alarm: &mut alarm,
                    leases: &leases,
                    follow: &mut follow,
                };
                match stream {
                    Stream::Tcp(s) => serve(s, &mut lane).await,
                    Stream::Tls(s) => serve(*s, &mut lane).await,
                    Stream::Unix(s) => serve(s, &mut lane).await,
                }
            }
        };
        if !open {
            return;
        }
    }
}

pub(crate) enum Stream {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    Unix(UnixStream),
}

/// Opens the socket and sends `AUTH` and `SELECT` as the URL asks. For a master named by
/// Sentinels, also the master it is on: see [`to_master`].
async fn connect(endpoint: &Endpoint) -> Result<(Stream, Option<sentinel::Named>), RedisError> {
    let commands = handshake(endpoint);
    let mut stream = match &endpoint.addr {
        Addr::Tcp(host, port) => tcp(host, *port, endpoint.tls.as_ref()).await?,
        Addr::Unix(path) => Stream::Unix(UnixStream::connect(path).await?),
        Addr::Sentinel(sentinels) => {
            let (stream, named) = to_master(endpoint, sentinels, commands).await?;
            return Ok((stream, Some(named)));
        }
    };
    exchange(&mut stream, &commands).await?;
    Ok((stream, None))
}

/// The Sentinels' share of the connect timeout, for asking them all at once (twice: before and
/// after `ROLE`); the rest is for the master.
fn asking(endpoint: &Endpoint) -> Duration {
    endpoint.connect_timeout / 3
}

/// Connects to the master the Sentinels name, once it answers `ROLE` as master and the
/// Sentinels, asked again after that answer, still name it (at the newest epoch): a Sentinel
/// that has not yet seen a failover may name a node that is a replica now, and a master that
/// hung may wake up still calling itself master after it was replaced.
async fn to_master(
    endpoint: &Endpoint,
    sentinels: &Sentinels,
    mut commands: Vec<Words>,
) -> Result<(Stream, sentinel::Named), RedisError> {
    let tls = endpoint.tls.as_ref();
    let named = sentinels.master(tls, asking(endpoint)).await?;
    commands.push(words(&[b"ROLE"]));
    let mut stream = tcp(&named.host, named.port, tls).await?;
    let replies = exchange(&mut stream, &commands).await?;
    sentinel::check_role(replies.last(), &named.host, named.port)?;
    let still = sentinels.master(tls, asking(endpoint)).await?;
    if still.host != named.host || still.port != named.port || !sentinels.name(&still) {
        return Err(RedisError::from(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!(
                "{}:{} answered as master, but the Sentinels name another now",
                named.host, named.port
            ),
        )));
    }
    sentinels.connected(&still.host, still.port);
    Ok((stream, still))
}

/// A TCP connection (TLS over it with `tls`), with the socket options of every Redis
/// connection.
pub(crate) async fn tcp(host: &str, port: u16, tls: Option<&Tls>) -> Result<Stream, RedisError> {
    let stream = TcpStream::connect((host, port)).await?;
    stream.set_nodelay(true)?;
    let sock = SockRef::from(&stream);
    sock.set_tcp_keepalive(&keepalive())?;
    sock.set_tcp_user_timeout(Some(USER_TIMEOUT))?;
    let Some(tls) = tls else {
        return Ok(Stream::Tcp(stream));
    };
    let name = tls.server_name.as_deref().unwrap_or(host).to_owned();
    let name = ServerName::try_from(name).map_err(|e| {
        RedisError::from((
            ErrorKind::InvalidClientConfig,
            "not a TLS server name",
            e.to_string(),
        ))
    })?;
    let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
    Ok(Stream::Tls(Box::new(
        connector.connect(name, stream).await?,
    )))
}

/// One command's words, for the exchanges before a connection serves calls.
pub(crate) type Words = Vec<Vec<u8>>;

/// `AUTH` and `SELECT`, as the endpoint asks.
fn handshake(endpoint: &Endpoint) -> Vec<Words> {
    let mut commands = auth(endpoint.username.as_deref(), endpoint.password.as_deref());
    if endpoint.db != 0 {
        commands.push(words(&[b"SELECT", endpoint.db.to_string().as_bytes()]));
    }
    commands
}

/// `AUTH [username] password`, when there is a password.
pub(crate) fn auth(username: Option<&str>, password: Option<&str>) -> Vec<Words> {
    let Some(password) = password else {
        return Vec::new();
    };
    let mut auth = vec![b"AUTH".to_vec()];
    auth.extend(username.map(|u| u.as_bytes().to_vec()));
    auth.push(password.as_bytes().to_vec());
    vec![auth]
}

pub(crate) fn words(words: &[&[u8]]) -> Words {
    words.iter().map(|w| w.to_vec()).collect()
}

/// Sends `commands` and reads a reply to each, before the connection serves calls; an error
/// reply fails the whole exchange.
pub(crate) async fn exchange(
    stream: &mut Stream,
    commands: &[Words],
) -> Result<Vec<Value>, RedisError> {
    match stream {
        Stream::Tcp(s) => exchange_on(s, commands).await,
        Stream::Tls(s) => exchange_on(&mut **s, commands).await,
        Stream::Unix(s) => exchange_on(s, commands).await,
    }
}

async fn exchange_on<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    commands: &[Words],
) -> Result<Vec<Value>, RedisError> {
    if commands.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for command in commands {
        let words: Vec<&[u8]> = command.iter().map(Vec::as_slice).collect();
        encode_command(&mut out, &words);
    }
    stream.write_all(&out).await?;
    let mut input = Vec::with_capacity(256);
    let mut replies = Vec::with_capacity(commands.len());
    while replies.len() < commands.len() {
        if stream.read_buf(&mut input).await? == 0 {
            return Err(closed());
        }
        let mut at = 0;
        while let Some((value, used)) = parse(&input[at..])? {
            at += used;
            replies.push(value.extract_error()?);
        }
        input.drain(..at);
    }
    Ok(replies)
}

/// What a lane's driver keeps from one connection to the next.
struct Driver<'a> {
    calls: &'a mut mpsc::UnboundedReceiver<Call>,
    batch: &'a mut Vec<Call>,
    alarm: &'a mut Alarm,
    leases: &'a lease::Lane,
    follow: &'a mut Follow,
}

/// Serves calls on an open connection until it breaks (returns true: connect again when the
/// next call comes) or every handle is dropped (false). A connection to a master named by
/// Sentinels is also dropped when they name another, and when a call written on it is late:
/// the master may hang, and the next connection asks the Sentinels again.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, lane: &mut Driver<'_>) -> bool {
    let Driver {
        calls,
        batch,
        alarm,
        leases,
        follow,
    } = lane;
    let mut waiting: VecDeque<Waiting> = VecDeque::with_capacity(BATCH);
    let mut entries = Vec::with_capacity(BATCH);
    // the joins of one joined call, for coalesce (kept, so as not to allocate per call)
    let mut joins = Vec::with_capacity(BATCH);
    // the commands being written, and how much of them is
    let mut out = Vec::with_capacity(4096);
    let mut written = 0;
    let mut input = Vec::with_capacity(16 * 1024);
    // whether the last batch held more than one call
    let mut busy = false;
    // whether a call written is past its deadline, unanswered
    let mut overdue = false;
    // the checks of joined calls that were refused, to be sent again alone
    let mut again = Vec::new();
    loop {
        if waiting.is_empty() {
            overdue = false;
        }
        // One batch in flight at a time: calls made while one is answered wait for its replies
        // and go together. Before it is written, a batch waits a few turns of the scheduler
        // when the last one held more than one call (under load): the tasks ready to run, or
        // about to be woken by their sockets, make their calls a moment later. So under load a
        // batch holds what came in a round trip to Redis and a few scheduler passes: more
        // checks of one bucket are joined, fewer scripts run, Redis is woken less often. After
        // a batch of one call (no load), a call goes at once. Once Redis is late with a reply
        // (a written call past its deadline), batches go as they come, as before this rule:
        // a Redis that stopped answering then has data unacknowledged, so `TCP_USER_TIMEOUT`
        // breaks the connection, and calls that came meanwhile are not held for it.
        if written == out.len()
            && (!batch.is_empty() || leases.with(|l| l.returning()))
            && (waiting.is_empty() || overdue)
        {
            if busy && crate::turns::on() {
                for _ in 0..GATHER_TURNS {
                    tokio::task::yield_now().await;
                }
            }
            while batch.len() < BATCH {
                let Ok(call) = calls.try_recv() else { break };
                alarm.set(call.slot.deadline);
                batch.push(call);
            }
            out.clear();
            written = 0;
            busy = batch.len() > 1;
            leases.with(|leases| {
                queue(
                    batch,
                    &mut entries,
                    &mut joins,
                    leases,
                    &mut out,
                    &mut waiting,
                );
                for _ in 0..leases.write_returns(&mut out) {
                    waiting.push_back(Waiting::Nobody);
                }
            });
            // Most often the socket takes it all at once; what it does not take is written as
            // it drains, while replies are read and deadlines kept.
            if !out.is_empty() {
                let tried = poll_fn(|cx| match Pin::new(&mut stream).poll_write(cx, &out) {
                    Poll::Ready(result) => Poll::Ready(Some(result)),
                    Poll::Pending => Poll::Ready(None),
                })
                .await;
                match tried {
                    None => {}
                    Some(Ok(n)) if n > 0 => written = n,
                    Some(Ok(_)) => return broken(&mut waiting, &closed()),
                    Some(Err(e)) => return broken(&mut waiting, &e.into()),
                }
            }
        }
        // the socket: replies first, then what is left to write (one future, since both use it)
        let socket = poll_fn(|cx| {
            if let Poll::Ready(read) =
                tokio_util::io::poll_read_buf(Pin::new(&mut stream), cx, &mut input)
            {
                return Poll::Ready(Io::Read(read));
            }
            if written < out.len() {
                if let Poll::Ready(wrote) = Pin::new(&mut stream).poll_write(cx, &out[written..]) {
                    return Poll::Ready(Io::Wrote(wrote));
                }
            }
            Poll::Pending
        });
        tokio::select! {
            biased;
            io = socket => {
                let error = match io {
                    Io::Read(Ok(0)) | Io::Wrote(Ok(0)) => closed(),
                    Io::Read(Ok(_)) => {
                        let delivered = leases.with(|l| {
                            deliver(&mut input, &mut waiting, &mut joins, l, &mut again)
                        });
                        // sent again before the calls that came after them, on this
                        // connection or the next (they ran nothing)
                        if !again.is_empty() {
                            batch.splice(0..0, again.drain(..));
                        }
                        match delivered {
                            Ok(end) => {
                                if let Some(end) = end {
                                    alarm.set(end);
                                }
                                continue;
                            }
                            Err(e) => e,
                        }
                    }
                    Io::Wrote(Ok(n)) => {
                        written += n;
                        continue;
                    }
                    Io::Read(Err(e)) | Io::Wrote(Err(e)) => e.into(),
                };
                return broken(&mut waiting, &error);
            }
            () = alarm.rung() => {
                overdue |= alarm.expire(batch, &mut waiting);
                if let Some(end) = leases.with(|l| l.expire(Instant::now())) {
                    alarm.set(end);
                }
                if overdue && follow.is_sentinel() {
                    return broken(&mut waiting, &hung());
                }
            }
            n = calls.recv_many(batch, BATCH) => {
                if n == 0 {
                    return false;
                }
                alarm.set_for(&batch[batch.len() - n..]);
            }
            () = follow.moved() => return broken(&mut waiting, &moved()),
        }
    }
}

/// What the socket did.
enum Io {
    Read(io::Result<usize>),
    Wrote(io::Result<usize>),
}

/// Fails every call waiting on a connection that broke; true: connect again.
fn broken(waiting: &mut VecDeque<Waiting>, error: &RedisError) -> bool {
    fail(waiting, error);
    true
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
) -> Result<Option<Instant>, RedisError> {
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
                    None => break Err(protocol("a reply to no command")),
                }
            }
            Ok(None) => break readonly.map_or(Ok(end), Err),
            Err(e) => break Err(e),
        }
    };
    input.drain(..at);
    result
}

/// A copy of the `READONLY` error `reply` is, if it is one.
fn read_only(reply: &Reply) -> Option<RedisError> {
    match reply {
        Reply::Value(Value::ServerError(e)) if e.kind() == Some(ServerErrorKind::ReadOnly) => {
            Some(RedisError::from((
                ErrorKind::Server(ServerErrorKind::ReadOnly),
                "Redis is a read-only replica now",
                e.details().unwrap_or_default().to_owned(),
            )))
        }
        _ => None,
    }
}

/// Fails every waiting call with (a copy of) `error`.
fn fail(waiting: &mut VecDeque<Waiting>, error: &RedisError) {
    for waiting in waiting.drain(..) {
        match waiting {
            Waiting::One(mut slot) => slot.reply(Err(copy(error))),
            Waiting::Joined(calls, _) | Waiting::Keys(calls) => {
                for mut call in calls {
                    call.slot.reply(Err(copy(error)));
                }
            }
            Waiting::Nobody => {}
        }
    }
}

/// The same error again for another caller (a `RedisError` is not `Clone`): I/O errors keep
/// their kind, so `is_connection_refusal` and the error metrics still see what happened.
fn copy(error: &RedisError) -> RedisError {
    if error.is_io_error() {
        let kind = if error.is_connection_refusal() {
            io::ErrorKind::ConnectionRefused
        } else if error.is_timeout() {
            io::ErrorKind::TimedOut
        } else {
            io::ErrorKind::ConnectionReset
        };
        RedisError::from(io::Error::new(kind, error.to_string()))
    } else {
        RedisError::from((error.kind(), "redis", error.to_string()))
    }
}

fn closed() -> RedisError {
    RedisError::from(io::Error::new(
        io::ErrorKind::ConnectionReset,
        "Redis closed the connection",
    ))
}

fn hung() -> RedisError {
    RedisError::from(io::Error::new(
        io::ErrorKind::TimedOut,
        "the master did not answer in time: asking the Sentinels again",
    ))
}

fn moved() -> RedisError {
    RedisError::from(io::Error::new(
        io::ErrorKind::ConnectionReset,
        "the Sentinels named another master",
    ))
}

fn gone(what: &'static str) -> RedisError {
    RedisError::from(io::Error::new(io::ErrorKind::BrokenPipe, what))
}

/// Whether `error` is Redis saying it does not have the script (restarted, failed over, or
/// `SCRIPT FLUSH`): the call is then sent again as `EVAL` with the script's body.
pub(crate) fn is_noscript(failure: &Failure) -> bool {
    matches!(failure, Failure::Redis(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript))
}

/// A reply with the errors inside it (redis-rs's `Value::ServerError`) made an `Err`.
fn checked(reply: Reply) -> Result<Reply, RedisError> {
    match reply {
        Reply::Value(value) => value.extract_error().map(Reply::Value),
        four => Ok(four),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reply type our scripts and commands get is parsed whole, with its length; a cut
    /// anywhere asks for more bytes; garbage is an error, not a panic.
    #[test]
    fn replies_parse_whole_or_wait_for_more() {
        let cases: &[(&[u8], Value)] = &[
            (b":42\r\n", Value::Int(42)),
            (b":-1\r\n", Value::Int(-1)),
            (b":9223372036854775807\r\n", Value::Int(i64::MAX)),
            (b":-9223372036854775808\r\n", Value::Int(i64::MIN)),
            (b"+OK\r\n", Value::Okay),
            (b"+PONG\r\n", Value::SimpleString("PONG".into())),
            (b"$5\r\n12.50\r\n", Value::BulkString(b"12.50".to_vec())),
            (b"$0\r\n\r\n", Value::BulkString(Vec::new())),
            (b"$-1\r\n", Value::Nil),
            (
                b"*4\r\n:1\r\n:9\r\n:0\r\n:1000\r\n",
                Value::Array(vec![
                    Value::Int(1),
                    Value::Int(9),
                    Value::Int(0),
                    Value::Int(1000),
                ]),
            ),
            (
                b"*2\r\n:0\r\n$5\r\n0.000\r\n",
                Value::Array(vec![Value::Int(0), Value::BulkString(b"0.000".to_vec())]),
            ),
        ];
        for (wire, want) in cases {
            let mut buf = wire.to_vec();
            buf.extend_from_slice(b":7\r\n"); // the next reply is not consumed
            assert_eq!(
                parse(&buf).unwrap(),
                Some((want.clone(), wire.len())),
                "{}",
                String::from_utf8_lossy(wire)
            );
            for cut in 0..wire.len() {
                assert_eq!(parse(&wire[..cut]).unwrap(), None, "cut at {cut}");
            }
        }
        // a line that never ends is not buffered without bound
        let endless = vec![b'+'; super::super::resp::MAX_REPLY_BYTES + 2];
        assert!(parse(&endless).is_err());
        assert_eq!(parse(&endless[..1000]).unwrap(), None);
        let (err, used) = parse(b"-NOSCRIPT No matching script.\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(used, 31);
        assert!(is_noscript(&Failure::Redis(
            err.extract_error().unwrap_err()
        )));
        for bad in [
            &b"?x\r\n"[..],
            b":x\r\n",
            b":\r\n",
            b":-\r\n",
            b":1-\r\n",
            b":9223372036854775808\r\n",
            b":1\n",
            b"$2\r\nabcd\r\n",
            b"$-2\r\n",
            b"*-5\r\n",
            b"$9223372036854775807\r\n",
            b"*1\r\n!\r\n",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}

//! Limiter state stores. A [`Store`] decides one request for one key under one algorithm and
//! keeps the key's state; the proxy sees only this trait.
//!
//! * [`memory::MemoryStore`]: in process, sharded, bounded (least recently used evicted).
//! * [`redis::RedisStore`]: the Lua scripts of `lua/` on Redis, Redis Cluster or the master
//!   that Redis Sentinels name, shared by every tollgate instance.
//!
//! Rate limited is not an error (a [`Decision`]); a store that cannot answer is ([`StoreError`]),
//! and the failure policy decides what that means.

mod cluster;
mod coalesce;
mod lease;
pub mod memory;
mod pipe;
pub mod policy;
pub mod redis;
mod reply;
pub mod resp;
mod scripts;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::limit::{Aimd, Algorithm, Balance, Decision, Millis, Pace, Report, Slots};

pub use memory::MemoryStore;
pub use policy::{GuardedStore, OnError};
pub use redis::{ClientTls, Connection, RedisStore, RedisTarget, SentinelTarget};
pub use reply::decode;
pub use resp::{parse as parse_reply, parse_four as parse_counts};

/// Marks the calling thread as worker `worker` (`app::workers`): its Redis calls go over the
/// store's connection for that worker, driven by the worker's own runtime.
pub fn set_worker(worker: usize) {
    pipe::set_thread_lane(worker);
}

/// The future a store call returns.
pub type StoreFuture<'a> = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send + 'a>>;

/// The future of a [`Store::defer`]: ms until the schedule's next free slot.
pub type HoldFuture<'a> = Pin<Box<dyn Future<Output = Result<u64, StoreError>> + Send + 'a>>;

/// The future of a [`Store::give_back`]: whether anything was given back.
pub type GiveBackFuture<'a> = Pin<Box<dyn Future<Output = Result<bool, StoreError>> + Send + 'a>>;

/// The future of a [`Store::charge`]: what the key holds after the charge, `None` when the
/// algorithm takes no charge.
pub type ChargeFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<Balance>, StoreError>> + Send + 'a>>;

/// The future of a [`Store::adapt`]: the current rate, per second.
pub type RateFuture<'a> = Pin<Box<dyn Future<Output = Result<f64, StoreError>> + Send + 'a>>;

/// The future of a [`Store::ready`]: why requests cannot be decided as configured, if so.
pub type ReadyFuture<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

/// The future of a [`Store::fleet`].
pub type FleetFuture<'a> = Pin<Box<dyn Future<Output = Result<Fleet, StoreError>> + Send + 'a>>;

/// The largest figures one instance publishes to the fleet ([`Store::publish`]).
pub const FLEET_MAX_BYTES: usize = 64 * 1024;
/// The most instances a fleet keeps: a new one beyond them is not kept.
pub const FLEET_MAX_INSTANCES: usize = 1000;
/// An instance that has not published for this long drops out of the fleet.
pub const FLEET_STALE: Duration = Duration::from_secs(5);

/// A blob over [`FLEET_MAX_BYTES`], refused before any call: the error of one call, which
/// tells nothing of the store.
fn over_fleet_bound(blob: &[u8]) -> Option<StoreError> {
    (blob.len() > FLEET_MAX_BYTES).then(|| StoreError::Reply {
        script: "fleet",
        detail: format!(
            "a blob of {} bytes is over the bound of {FLEET_MAX_BYTES}",
            blob.len()
        ),
    })
}

/// What the instances sharing a store published lately ([`Store::fleet`]).
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    /// the store's clock when it answered, in ms since the epoch
    pub now_ms: u64,
    /// the instances, the longest unseen first
    pub instances: Vec<Published>,
}

/// One instance's last publication.
#[derive(Debug, Clone)]
pub struct Published {
    /// the instance's id
    pub id: String,
    /// when it published, on the store's clock, in ms since the epoch
    pub seen_ms: u64,
    /// what it published
    pub blob: Vec<u8>,
}

/// Keeps limiter state and decides requests.
pub trait Store: Send + Sync + 'static {
    /// Decides one request for `key` under `alg`. `now` is the time in ms since the epoch;
    /// `None` takes the store's own clock (for Redis, the server's, so that instances with
    /// skewed clocks agree). Tests pass `Some` to replay a sequence.
    fn check<'a>(
        &'a self,
        key: &'a str,
        alg: &'a Algorithm,
        now: Option<Millis>,
    ) -> StoreFuture<'a>;

    /// Upstream back-pressure: holds the pacing schedule at `key` (kept by the leaky bucket
    /// with `pace`) so that no slot is handed out before `hold_ms` from now, for every instance
    /// sharing the store. Returns the ms until the next free slot.
    fn defer<'a>(
        &'a self,
        key: &'a str,
        pace: &'a Pace,
        hold_ms: u64,
        now: Option<Millis>,
    ) -> HoldFuture<'a>;

    /// Undoes an admitted [`check`](Store::check) of `key` under `alg` made `age_ms` ago, when a
    /// later limit of the request refused it: a refused request costs no limit anything
    /// (`lua/give_back.lua`; [`crate::limit::give_back`]). `now` as for `check`. A store that
    /// keeps no state has nothing to give back. True when something was given back: false when
    /// nothing of the check's was left, or a leaky bucket's slot is not the last one.
    fn give_back<'a>(
        &'a self,
        _key: &'a str,
        _alg: &'a Algorithm,
        _age_ms: f64,
        _now: Option<Millis>,
    ) -> GiveBackFuture<'a> {
        Box::pin(std::future::ready(Ok(false)))
    }

    /// Charges `amount` more to `key` under `alg` after the response (negative: gives back):
    /// what the upstream reported a request used, less the cost its check took
    /// (`lua/charge.lua`; [`crate::limit::charge`]). A token bucket may go into debt. `now` as
    /// for `check`. A store that keeps no state charges nothing.
    fn charge<'a>(
        &'a self,
        _key: &'a str,
        _alg: &'a Algorithm,
        _amount: i64,
        _now: Option<Millis>,
    ) -> ChargeFuture<'a> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Takes a concurrency slot at `key` for `holder` (an id unique to the request), when
    /// fewer than `slots.limit` are held (`lua/concurrency.lua`; [`crate::limit::acquire`]).
    /// The holder keeps it until [`release`](Store::release), or until its lease ends
    /// unless [`renew`](Store::renew)ed. `now` as for `check`. A store that keeps no state
    /// admits.
    fn acquire<'a>(
        &'a self,
        _key: &'a str,
        slots: &'a Slots,
        _holder: &'a str,
        _now: Option<Millis>,
    ) -> StoreFuture<'a> {
        let free = u64::from(slots.limit.get()) - 1;
        Box::pin(std::future::ready(Ok(Decision::slots(true, free, 0))))
    }

    /// Renews the leases of `holders` at `key`; how many still held a slot.
    fn renew<'a>(
        &'a self,
        _key: &'a str,
        _slots: &'a Slots,
        _holders: &'a [String],
        _now: Option<Millis>,
    ) -> HoldFuture<'a> {
        Box::pin(std::future::ready(Ok(0)))
    }

    /// Frees the slots of `holders` at `key`; how many held one.
    fn release<'a>(
        &'a self,
        _key: &'a str,
        _slots: &'a Slots,
        _holders: &'a [String],
        _now: Option<Millis>,
    ) -> HoldFuture<'a> {
        Box::pin(std::future::ready(Ok(0)))
    }

    /// Adaptive pacing: applies one instance's `report` for its last period to the rate kept
    /// at `key` under `aimd`, shared by the instances of one store (`lua/adapt.lua`;
    /// [`crate::limit::adapt::adapt`]), and returns the current rate. `now` as for `check`. A
    /// store that keeps no state cannot adapt: the rate stays where it starts.
    fn adapt<'a>(
        &'a self,
        _key: &'a str,
        aimd: &'a Aimd,
        _report: Report,
        _now: Option<Millis>,
    ) -> RateFuture<'a> {
        Box::pin(std::future::ready(Ok(aimd.start().per_sec())))
    }

    /// The refusal of `key` under `alg` that is remembered locally (the deny cache), if any:
    /// no store call is made.
    fn cached_denial(&self, _key: &str, _alg: &Algorithm) -> Option<Decision> {
        None
    }

    /// What a request for `key` under `alg` would get now, without taking anything: the
    /// operator console's look at one client. The decision is the algorithm's on the key's
    /// state as it is.
    fn peek<'a>(&'a self, key: &'a str, alg: &'a Algorithm) -> StoreFuture<'a>;

    /// Forgets `key`, so that its next request is decided as a new client's. True when the
    /// key held something.
    fn forget<'a>(&'a self, key: &'a str) -> GiveBackFuture<'a>;

    /// The count of resets made through the console, shared by the instances of one store;
    /// with `bump`, one more is counted first. A store of one instance counts none.
    fn resets<'a>(&'a self, _key: &'a str, _bump: bool) -> HoldFuture<'a> {
        Box::pin(std::future::ready(Ok(0)))
    }

    /// Publishes `blob`, this instance's figures, under `id` to the fleet kept at `key`
    /// (`lua/fleet.lua`): the store keeps the last blob of each instance seen within
    /// [`FLEET_STALE`], [`FLEET_MAX_INSTANCES`] at most. How many instances are kept; 0 when
    /// this one was not (the fleet is full). A blob over [`FLEET_MAX_BYTES`] is an error. A
    /// store of one instance keeps this one alone; one that keeps no fleet, none.
    fn publish<'a>(&'a self, _key: &'a str, _id: &'a str, _blob: &'a [u8]) -> HoldFuture<'a> {
        Box::pin(std::future::ready(Ok(0)))
    }

    /// The fleet kept at `key`: the instances seen within [`FLEET_STALE`].
    fn fleet<'a>(&'a self, _key: &'a str) -> FleetFuture<'a> {
        Box::pin(std::future::ready(Ok(Fleet::default())))
    }

    /// Forgets every refusal this instance remembers and every token it leased ahead: a
    /// reset made elsewhere is in force here from the next request.
    fn forget_local(&self) {}

    /// The circuit breaker's state, `closed` or `open`, for a store behind one.
    fn breaker(&self) -> Option<&'static str> {
        None
    }

    /// Whether requests can be decided as configured, for `/readyz`: a shared store is asked
    /// (bounded by its timeout), so the answer does not wait for traffic to find out; an error
    /// only when the store is out and no fallback is configured.
    fn ready(&self) -> ReadyFuture<'_> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Told about every call the guarded store makes, for metrics; the store knows no metrics.
pub trait StoreObserver: Send + Sync {
    /// One call to the shared store took `elapsed` and failed with `error`, if any.
    fn call(&self, elapsed: Duration, error: Option<&StoreError>);
    /// A denial was answered from the deny cache, without a store call.
    fn deny_cache_hit(&self);
    /// A check was answered from tokens leased ahead ([`lease`]), without a store call.
    fn leased(&self);
    /// A call was kept from the shared store by the open circuit breaker (a store error of
    /// kind `circuit_open`).
    fn skipped(&self);
}

/// A store that could not answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No answer within the configured per-call timeout.
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    /// Redis answered with an error or the connection failed.
    #[error("redis: {0}")]
    Redis(RedisError),
    /// The circuit breaker is open: the store was not asked.
    #[error("store unavailable: circuit breaker open after repeated failures")]
    CircuitOpen,
    /// Redis answered something the script never returns.
    #[error("unexpected reply from {script}: {detail}")]
    Reply {
        /// the script called
        script: &'static str,
        /// what was wrong with the reply
        detail: String,
    },
}

impl StoreError {
    /// Whether the error says the store cannot be used (so it counts towards the circuit
    /// breaker), rather than that one call could not be: a key holding another type
    /// (`WRONGTYPE`) or a reply of the wrong shape comes from a Redis that is up and answering,
    /// and must not take it away from every client.
    pub fn is_outage(&self) -> bool {
        match self {
            StoreError::Redis(e) => e.code() != Some("WRONGTYPE") && !e.is_skipped(),
            StoreError::Reply { .. } => false,
            StoreError::Timeout(_) | StoreError::CircuitOpen => true,
        }
    }

    /// Whether the call was not sent because the part of the store it needs is skipped for a
    /// while: a Cluster's primary that failed its last calls. The primary's own failures count
    /// towards the breaker; calls it skips count neither way, so one shard that is down does
    /// not open the breaker for the others, and the calls to it do not close it.
    pub fn is_skipped(&self) -> bool {
        matches!(self, StoreError::Redis(e) if e.is_skipped())
    }

    /// Every label [`StoreError::kind`] gives.
    pub const KINDS: [&'static str; 5] =
        ["timeout", "connection", "redis", "circuit_open", "reply"];

    /// A short label for the `kind` of `tollgate_store_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => "timeout",
            // (redis-rs's cluster client times a call out itself)
            StoreError::Redis(e) if e.is_timeout() => "timeout",
            // (a shard's own breaker, in effect)
            StoreError::Redis(e) if e.is_skipped() => "circuit_open",
            StoreError::Redis(e) if e.is_connection() => "connection",
            StoreError::Redis(_) => "redis",
            StoreError::CircuitOpen => "circuit_open",
            StoreError::Reply { .. } => "reply",
        }
    }
}

/// A failure talking to Redis, from whichever connection made the call.
#[derive(thiserror::Error)]
pub enum RedisError {
    /// from the store's own connection
    #[error(transparent)]
    Own(#[from] resp::Error),
    /// from redis-rs (the library path)
    #[error(transparent)]
    Library(#[from] ::redis::RedisError),
}

impl RedisError {
    /// The code of an error reply (`WRONGTYPE`, `NOSCRIPT`…).
    pub fn code(&self) -> Option<&str> {
        match self {
            RedisError::Own(e) => e.code(),
            RedisError::Library(e) => e.code(),
        }
    }

    /// Whether the call timed out at the socket (redis-rs's cluster client times calls out).
    pub fn is_timeout(&self) -> bool {
        match self {
            RedisError::Own(e) => e.as_io().is_some_and(|e| {
                matches!(
                    e.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                )
            }),
            RedisError::Library(e) => e.is_timeout(),
        }
    }

    /// Whether the call was not sent: see [`StoreError::is_skipped`].
    pub fn is_skipped(&self) -> bool {
        matches!(self, RedisError::Own(resp::Error::Skipped(_)))
    }

    /// Whether the connection failed, rather than Redis answering with an error.
    pub fn is_connection(&self) -> bool {
        match self {
            RedisError::Own(e) => e.as_io().is_some(),
            RedisError::Library(e) => e.is_io_error() || e.is_connection_dropped(),
        }
    }
}

/// As the error's text, as redis-rs's errors were.
impl std::fmt::Debug for RedisError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl From<::redis::RedisError> for StoreError {
    fn from(e: ::redis::RedisError) -> StoreError {
        StoreError::Redis(e.into())
    }
}

impl From<resp::Error> for StoreError {
    fn from(e: resp::Error) -> StoreError {
        StoreError::Redis(e.into())
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::StoreError;

    /// An I/O time-out (redis-rs's cluster client times its calls out itself) counts as `timeout`,
    /// like the store's own; other I/O failures as `connection`.
    #[test]
    fn error_kinds() {
        let io =
            |kind| StoreError::from(crate::store::resp::Error::from(io::Error::new(kind, "x")));
        let library = StoreError::from(::redis::RedisError::from(io::Error::new(
            io::ErrorKind::TimedOut,
            "x",
        )));
        let errors = [
            (io(io::ErrorKind::TimedOut), "timeout"),
            (io(io::ErrorKind::ConnectionRefused), "connection"),
            (StoreError::Timeout(std::time::Duration::ZERO), "timeout"),
            (StoreError::CircuitOpen, "circuit_open"),
            (library, "timeout"),
        ];
        for (error, kind) in errors {
            assert_eq!(error.kind(), kind, "{error}");
            // the metric's series are made from KINDS at start-up
            assert!(StoreError::KINDS.contains(&kind), "{kind}");
        }
    }
}

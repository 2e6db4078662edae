//! The Redis store: each check is one `EVALSHA` of the algorithm's script on the key's node.
//!
//! Multiplexed connections, so concurrent checks pipeline on them, reconnected after Redis
//! restarts. On one Redis, over TCP, TLS (`rediss://`) or a unix socket, on the master that
//! Sentinels name, and on each primary of a Cluster ([`super::cluster`]), they are the store's
//! own ([`super::pipe`]), made for this one command, one per worker thread. The conformance
//! tests run through both connections ([`Connection`]; the library's is one
//! `ConnectionManager`, or redis-rs's cluster client, shared by every worker). A `NOSCRIPT` answer (Redis
//! restarted, failed over, or `SCRIPT FLUSH`) sends the call again with the script's body,
//! once. Every call is bounded by `timeout`; past it the caller gets [`StoreError::Timeout`].
//! On the store's own connection it comes from its driver, which keeps every call's deadline;
//! on redis-rs's, from a timer of the call's own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::{ClusterClientBuilder, ClusterConfig};
use ::redis::cluster_async::ClusterConnection;
use ::redis::io::tcp::TcpSettings;
use ::redis::{ClientTlsConfig, ConnectionAddr, IntoConnectionInfo, TlsCertificates, TlsMode};

mod fleet;
mod seeds;
mod slots;

use super::cluster::{self, state_ok, Cluster};
use super::pipe::{self, Addr, Command, Endpoint, Failure, Pipe, Sentinel, Sentinels};
use super::reply::{self, Reply};
use super::resp::{ServerError, Value};
use super::scripts::{ScriptCall, Scripts, SlotsOp};
use super::{
    ChargeFuture, FleetFuture, GiveBackFuture, HoldFuture, RateFuture, ReadyFuture, Store,
    StoreError, StoreFuture,
};
use crate::limit::{Aimd, Algorithm, Millis, Pace, Report, Slots};
pub use crate::tls::ClientTls;

/// Reconnection attempts wait at least this long before their second try (one retry): a refusal
/// that comes back sooner than [`STALE_REFUSAL`] is the answer of an attempt made earlier.
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(10);
/// A refused call that fails sooner than this met a connection attempt that had already failed.
const STALE_REFUSAL: Duration = Duration::from_millis(5);

/// Where the Redis store connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// one Redis: `redis://`, `rediss://` or `redis+unix://` URL
    Single(String),
    /// a Redis Cluster: seed node URLs
    Cluster(Vec<String>),
    /// the master that Redis Sentinels name
    Sentinel(SentinelTarget),
}

/// A master watched by Redis Sentinels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelTarget {
    /// the name the Sentinels monitor it by
    pub master_name: String,
    /// the Sentinels: `redis://` or `rediss://` URLs, whose user and password are the
    /// Sentinels' own; over `rediss://`, the master is reached over TLS too
    pub nodes: Vec<String>,
    /// the master's user, if any
    pub username: Option<String>,
    /// the master's password, if any
    pub password: Option<String>,
    /// the master's database
    pub db: i64,
}

impl SentinelTarget {
    /// The Sentinels, and whether they (and so the master) are reached over TLS.
    fn nodes(&self) -> Result<(Vec<Sentinel>, bool), StoreError> {
        let mut nodes = Vec::with_capacity(self.nodes.len());
        let mut over_tls = false;
        for url in &self.nodes {
            let info = url.as_str().into_connection_info()?;
            let (host, port) = match info.addr() {
                ConnectionAddr::Tcp(host, port) => (host, port),
                ConnectionAddr::TcpTls { host, port, .. } => {
                    over_tls = true;
                    (host, port)
                }
                _ => {
                    return Err(StoreError::from(::redis::RedisError::from((
                        ::redis::ErrorKind::InvalidClientConfig,
                        "a Sentinel is reached over TCP: redis:// or rediss://",
                    ))))
                }
            };
            let settings = info.redis_settings();
            nodes.push(Sentinel {
                host: host.clone(),
                port: *port,
                username: settings.username().map(str::to_owned),
                password: settings.password().map(str::to_owned),
            });
        }
        if nodes.is_empty() {
            return Err(StoreError::from(::redis::RedisError::from((
                ::redis::ErrorKind::InvalidClientConfig,
                "no Sentinel given",
            ))));
        }
        Ok((nodes, over_tls))
    }
}

/// Which connection reaches one Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Connection {
    /// the store's own ([`super::pipe`]), with joining and leases: what tollgate uses
    #[default]
    Own,
    /// redis-rs's `ConnectionManager`, or its cluster client: the library's path. Tests hold
    /// the two equal.
    Library,
}

/// Limiter state in Redis, shared by every tollgate instance that uses the same Redis.
pub struct RedisStore {
    conn: Conn,
    scripts: Scripts,
    timeout: Duration,
}

enum Conn {
    /// the store's own connection: one Redis over TCP, TLS or a unix socket; a Sentinel's master
    Pipe(Pipe),
    /// the store's own connections to a Cluster's primaries
    Cluster(Cluster),
    /// redis-rs: [`Connection::Library`]
    Client(Client),
}

/// Both kinds are cheap handles onto shared multiplexed connections: cloning one per call is
/// how concurrent calls share (and pipeline on) the same socket.
#[derive(Clone)]
enum Client {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RedisStore {
    /// Connects lazily: the store is usable at once, and calls fail with a [`StoreError`]
    /// until Redis answers. `timeout` bounds every call. On one Redis, the store keeps `lanes`
    /// connections of its own: one per worker thread (see [`super::set_worker`]); on a
    /// Cluster, that many to each primary.
    pub fn connect(
        target: &RedisTarget,
        timeout: Duration,
        lanes: usize,
    ) -> Result<RedisStore, StoreError> {
        RedisStore::connect_over(target, timeout, lanes, Connection::Own)
    }

    /// [`RedisStore::connect`], reaching one Redis over `connection`.
    pub fn connect_over(
        target: &RedisTarget,
        timeout: Duration,
        lanes: usize,
        connection: Connection,
    ) -> Result<RedisStore, StoreError> {
        RedisStore::connect_with(target, &ClientTls::default(), timeout, lanes, connection)
    }

    /// [`RedisStore::connect_over`], with `tls` for `rediss://` (`store.tls`). A Sentinel's
    /// master is always reached over the store's own connection.
    pub fn connect_with(
        target: &RedisTarget,
        tls: &ClientTls,
        timeout: Duration,
        lanes: usize,
        connection: Connection,
    ) -> Result<RedisStore, StoreError> {
        // `rediss://` goes through rustls's process-wide provider: make it ring, the only one
        // built in (an error only means a provider was installed already).
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Connecting may take longer than one call may wait; give it at least a second.
        let connect_timeout = timeout.max(Duration::from_secs(1));
        let conn = match target {
            RedisTarget::Single(url) => {
                let info = url.as_str().into_connection_info()?;
                let settings = info.redis_settings();
                let own = |addr, tls| Endpoint {
                    addr,
                    username: settings.username().map(str::to_owned),
                    password: settings.password().map(str::to_owned),
                    db: settings.db(),
                    connect_timeout,
                    tls,
                    cluster: false,
                };
                let endpoint = match info.addr() {
                    _ if connection == Connection::Library => None,
                    ConnectionAddr::Tcp(host, port) => {
                        Some(own(Addr::Tcp(host.clone(), *port), None))
                    }
                    ConnectionAddr::TcpTls {
                        host,
                        port,
                        insecure,
                        ..
                    } => Some(own(
                        Addr::Tcp(host.clone(), *port),
                        Some(own_tls(tls, *insecure)?),
                    )),
                    ConnectionAddr::Unix(path) => Some(own(Addr::Unix(path.clone()), None)),
                    _ => None,
                };
                match endpoint {
                    Some(endpoint) => Conn::Pipe(Pipe::new(endpoint, lanes)),
                    None => Conn::Client(Client::Single(managed(info, tls, connect_timeout)?)),
                }
            }
            RedisTarget::Cluster(urls) if connection == Connection::Own => {
                Conn::Cluster(seeds::own_cluster(urls, tls, connect_timeout, lanes)?)
            }
            RedisTarget::Cluster(urls) => Conn::Client(Client::Cluster(cluster(
                urls,
                tls,
                timeout,
                connect_timeout,
            )?)),
            RedisTarget::Sentinel(sentinel) => {
                let (nodes, over_tls) = sentinel.nodes()?;
                let endpoint = Endpoint {
                    addr: Addr::Sentinel(Arc::new(Sentinels::new(
                        sentinel.master_name.clone(),
                        nodes,
                    ))),
                    username: sentinel.username.clone(),
                    password: sentinel.password.clone(),
                    db: sentinel.db,
                    connect_timeout,
                    tls: over_tls.then(|| own_tls(tls, false)).transpose()?,
                    cluster: false,
                };
                Conn::Pipe(Pipe::new(endpoint, lanes))
            }
        };
        Ok(RedisStore {
            conn,
            scripts: Scripts::new(),
            timeout,
        })
    }

    /// Whether busy token buckets may lease tokens ahead ([`super::lease`]; on by default, and
    /// only on the store's own connection).
    pub fn with_leases(self, on: bool) -> RedisStore {
        match &self.conn {
            Conn::Pipe(pipe) => pipe.set_leases(on),
            Conn::Cluster(cluster) => cluster.set_leases(on),
            Conn::Client(_) => {}
        }
        self
    }

    /// Drops the tokens this instance leased ahead ([`super::lease`]).
    fn forget_leases(&self) {
        match &self.conn {
            Conn::Pipe(pipe) => pipe.forget_leases(),
            Conn::Cluster(cluster) => cluster.forget_leases(),
            Conn::Client(_) => {}
        }
    }

    /// Sends `PING` (bounded by the timeout): for readiness checks and tests.
    pub async fn ping(&self) -> Result<(), StoreError> {
        match &self.conn {
            Conn::Pipe(pipe) => {
                let mut command = Vec::new();
                super::resp::encode_command(&mut command, &[b"PING"]);
                let deadline = tokio::time::Instant::now() + self.timeout;
                let answer = pipe.call(Command::Bytes(command), deadline).await;
                self.answered(answer).map(drop)
            }
            Conn::Cluster(cluster) => {
                // Every primary must answer, and say the cluster is ok: a key on a shard that
                // cannot answer cannot be decided.
                let deadline = tokio::time::Instant::now() + self.timeout;
                let answers = cluster.each_primary(&[b"CLUSTER", b"INFO"], deadline).await;
                if answers.is_empty() {
                    return Err(cluster_down("no node of the cluster gave its slot map"));
                }
                for (node, answer) in answers {
                    let info = self.answered(answer).map_err(|e| {
                        StoreError::from(::redis::RedisError::from((
                            ::redis::ErrorKind::Server(::redis::ServerErrorKind::ClusterDown),
                            "a primary of the cluster did not answer",
                            format!("{node}: {e}"),
                        )))
                    })?;
                    if !matches!(info, Reply::Value(ref info) if state_ok(info)) {
                        return Err(cluster_down(
                            "the cluster's state is not ok (a slot is not covered)",
                        ));
                    }
                }
                // (a cluster that serves the rest, `cluster-require-full-coverage no`, still
                // says ok)
                match cluster.uncovered() {
                    Some(_) => Err(cluster_down("a slot of the cluster has no primary")),
                    None => Ok(()),
                }
            }
            Conn::Client(client @ Client::Single(_)) => {
                let mut client = client.clone();
                let ping = ::redis::cmd("PING");
                let ping = ping.query_async::<String>(&mut client);
                self.bounded(ping).await.map(drop)
            }
            Conn::Client(client @ Client::Cluster(_)) => {
                // A node that answers does not make the cluster usable: with a slot uncovered
                // (a master down, the cluster in `fail`) the keys there cannot be decided, so
                // the cluster's own state is asked.
                let mut client = client.clone();
                let info = ::redis::cmd("CLUSTER").arg("INFO").to_owned();
                let info = info.query_async::<String>(&mut client);
                let info = self.bounded(info).await?;
                if info.lines().any(|l| l.trim() == "cluster_state:ok") {
                    return Ok(());
                }
                Err(cluster_down(
                    "the cluster's state is not ok (a slot is not covered)",
                ))
            }
        }
    }

    /// Runs one script call on the key's connection, bounded by the timeout; sent again with
    /// the script's body after `NOSCRIPT`.
    async fn invoke<'c>(&self, call: impl ScriptCall<'c>) -> Result<Reply, StoreError> {
        match &self.conn {
            Conn::Pipe(pipe) => {
                let deadline = tokio::time::Instant::now() + self.timeout;
                let answer = match pipe.call(command(&call, false), deadline).await {
                    Err(e) if pipe::is_noscript(&e) => {
                        pipe.call(command(&call, true), deadline).await
                    }
                    answer => answer,
                };
                self.answered(answer)
            }
            Conn::Cluster(cluster) => {
                let deadline = tokio::time::Instant::now() + self.timeout;
                let slot = cluster::slot(call.key().as_bytes());
                let answer = cluster
                    .call(slot, |body| command(&call, body), deadline)
                    .await;
                self.answered(answer)
            }
            Conn::Client(client) => self
                .bounded(invoke(client.clone(), call.invocation()))
                .await
                .map(|value| Reply::Value(value.into())),
        }
    }

    /// The store's own connection's answer as the store's.
    fn answered(&self, answer: pipe::Answer) -> Result<Reply, StoreError> {
        answer.map_err(|failure| match failure {
            Failure::Redis(e) => StoreError::from(e),
            Failure::Late => StoreError::Timeout(self.timeout),
        })
    }

    /// A redis-rs call, bounded by the timeout.
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, ::redis::RedisError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

/// The command that runs `call`: a check that may be joined, or its bytes; with its script's
/// `body` after `NOSCRIPT`.
fn command<'c>(call: &impl ScriptCall<'c>, body: bool) -> Command {
    match call.check() {
        Some(check) if !body => Command::Check(check),
        _ => {
            let mut command = Vec::with_capacity(160);
            call.encode(&mut command, body);
            Command::Bytes(command)
        }
    }
}

/// A cluster that cannot decide every key: an outage, as the `CLUSTERDOWN` its keys' calls
/// then get.
fn cluster_down(why: &'static str) -> StoreError {
    StoreError::from(::redis::RedisError::from((
        ::redis::ErrorKind::Server(::redis::ServerErrorKind::ClusterDown),
        why,
    )))
}

/// The store's own TLS settings from `tls`; `insecure` (a `#insecure` URL) turns verification
/// off as `verify: false` does.
pub(super) fn own_tls(tls: &ClientTls, insecure: bool) -> Result<pipe::Tls, StoreError> {
    let config = if insecure && tls.verify {
        ClientTls {
            verify: false,
            ..tls.clone()
        }
        .client_config()
    } else {
        tls.client_config()
    };
    Ok(pipe::Tls {
        config: config.map_err(tls_error)?,
        server_name: tls.server_name.clone(),
    })
}

fn tls_error(e: crate::tls::TlsError) -> StoreError {
    StoreError::from(::redis::RedisError::from((
        ::redis::ErrorKind::InvalidClientConfig,
        "store.tls",
        e.to_string(),
    )))
}

/// `tls` as redis-rs takes it: PEM roots, which replace the system's (so the system bundle is
/// added to `ca`), and the client certificate and key. `None` when there is neither.
fn library_certs(tls: &ClientTls) -> Option<TlsCertificates> {
    let root_cert = tls.ca.as_ref().map(|ca| {
        let mut roots = crate::tls::system_bundle_pem().unwrap_or_default();
        roots.push(b'\n');
        roots.extend_from_slice(&ca.bytes);
        roots
    });
    let client_tls = tls.identity.as_ref().map(|(cert, key)| ClientTlsConfig {
        client_cert: cert.bytes.clone(),
        client_key: key.bytes.clone(),
    });
    (root_cert.is_some() || client_tls.is_some()).then_some(TlsCertificates {
        client_tls,
        root_cert,
    })
}

/// keepalive and TCP_USER_TIMEOUT as on the store's own connection (see `pipe`)
fn tcp_settings() -> TcpSettings {
    TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(pipe::keepalive())
        .set_user_timeout(pipe::USER_TIMEOUT)
}

/// redis-rs's connections to a Cluster. It cannot verify a node's certificate for another name
/// than the node's own (`server_name`); `verify: false` is its `TlsMode::Insecure`.
fn cluster(
    urls: &[String],
    tls: &ClientTls,
    timeout: Duration,
    connect_timeout: Duration,
) -> Result<ClusterConnection, StoreError> {
    if tls.server_name.is_some() {
        return Err(StoreError::from(::redis::RedisError::from((
            ::redis::ErrorKind::InvalidClientConfig,
            "a Redis Cluster's client verifies each node by its own host: it takes no server_name",
        ))));
    }
    let mut builder = ClusterClientBuilder::new(urls.iter().map(String::as_str))
        .tcp_settings(tcp_settings())
        .connection_timeout(connect_timeout)
        .response_timeout(timeout)
        .retries(2);
    if !tls.verify {
        builder = builder.tls(TlsMode::Insecure);
    }
    if let Some(certs) = library_certs(tls) {
        builder = builder.certs(certs);
    }
    let client = builder.build()?;
    let config = ClusterConfig::new()
        .set_connection_timeout(connect_timeout)
        .set_response_timeout(timeout);
    Ok(client.get_pending_async_connection_with_config(config))
}

/// redis-rs's reconnecting connection to one Redis ([`Connection::Library`]).
fn managed(
    info: ::redis::ConnectionInfo,
    tls: &ClientTls,
    connect_timeout: Duration,
) -> Result<ConnectionManager, StoreError> {
    let info = match info.addr().clone() {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            tls_params,
        } => info.set_addr(ConnectionAddr::TcpTls {
            host,
            port,
            insecure: insecure || !tls.verify,
            tls_params,
        }),
        _ => info,
    }
    .set_tcp_settings(tcp_settings());
    let client = match library_certs(tls) {
        Some(certs) => ::redis::Client::build_with_tls(info, certs)?,
        None => ::redis::Client::open(info)?,
    };
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        // `invoke` bounds every call itself; a second timer per call inside the client would
        // only cost time on the hot path
        .set_response_timeout(None)
        // One quick retry, then the call fails: a refused connection fails fast instead of
        // waiting out the timeout, and the next call starts a new reconnection (so recovery
        // needs no restart); the circuit breaker keeps an outage from costing one attempt per
        // request.
        .set_number_of_retries(1)
        .set_min_delay(RECONNECT_MIN_DELAY)
        .set_max_delay(Duration::from_millis(50));
    Ok(ConnectionManager::new_lazy_with_config(client, config)?)
}

/// One script invocation through redis-rs, which loads the script itself after `NOSCRIPT`.
async fn invoke(
    mut conn: Client,
    invocation: ::redis::ScriptInvocation<'_>,
) -> Result<::redis::Value, ::redis::RedisError> {
    let started = Instant::now();
    match invocation.invoke_async::<::redis::Value>(&mut conn).await {
        // After an outage the connection manager answers the next call at once with its last,
        // failed connection attempt, and only then starts a new one: without a second try, the
        // breaker's first probe after Redis is back would fail for nothing and recovery would
        // wait another cool-down. A refused connection sent nothing, so the call may go again,
        // on the new connection, within the same timeout. Only a stale answer is tried again:
        // a fresh attempt that was refused took at least the reconnect delay, and trying it
        // again would only double the wait of the calls made while Redis is going away.
        Err(e) if e.is_connection_refusal() && started.elapsed() < STALE_REFUSAL => {
            invocation.invoke_async(&mut conn).await
        }
        result => result,
    }
}

/// redis-rs's reply as the store's own type, at the one place redis-rs's replies enter the
/// store: the types RESP3 adds never come on our RESP2 connections, and become the RESP2 reply
/// a server sends for them.
impl From<::redis::Value> for Value {
    fn from(value: ::redis::Value) -> Value {
        use ::redis::Value as V;
        let all = |items: Vec<V>| Value::Array(items.into_iter().map(Value::from).collect());
        match value {
            V::Nil => Value::Nil,
            V::Int(n) => Value::Int(n),
            V::BulkString(bytes) => Value::Bulk(bytes),
            V::Okay => Value::Status("OK".to_owned()),
            V::SimpleString(text) => Value::Status(text),
            V::Array(items) | V::Set(items) => all(items),
            V::Push { data, .. } => all(data),
            V::Map(pairs) => all(pairs.into_iter().flat_map(|(k, v)| [k, v]).collect()),
            V::Attribute { data, .. } => Value::from(*data),
            V::Double(x) => Value::Bulk(x.to_string().into_bytes()),
            V::Boolean(b) => Value::Int(b.into()),
            V::VerbatimString { text, .. } => Value::Bulk(text.into_bytes()),
            V::BigNumber(digits) => Value::Bulk(digits),
            V::ServerError(e) => Value::Error(ServerError::new(&match e.details() {
                Some(detail) => format!("{} {detail}", e.code()),
                None => e.code().to_owned(),
            })),
            // (the enum is non-exhaustive: a type of a later RESP)
            other => Value::Bulk(format!("{other:?}").into_bytes()),
        }
    }
}

impl Store for RedisStore {
    fn defer<'a>(
        &'a self,
        key: &'a str,
        pace: &'a Pace,
        hold_ms: u64,
        now: Option<Millis>,
    ) -> HoldFuture<'a> {
        Box::pin(async move {
            match self
                .invoke(self.scripts.defer(key, pace, hold_ms, now))
                .await?
            {
                Reply::Value(Value::Int(ms)) => Ok(u64::try_from(ms).unwrap_or(0)),
                other => Err(StoreError::Reply {
                    script: "pace_defer",
                    detail: format!("expected an integer, got {other:?}"),
                }),
            }
        })
    }

    fn check<'a>(
        &'a self,
        key: &'a str,
        alg: &'a Algorithm,
        now: Option<Millis>,
    ) -> StoreFuture<'a> {
        Box::pin(async move {
            reply::decode_reply(alg, &self.invoke(self.scripts.check(key, alg, now)).await?)
        })
    }

    fn give_back<'a>(
        &'a self,
        key: &'a str,
        alg: &'a Algorithm,
        age_ms: f64,
        now: Option<Millis>,
    ) -> GiveBackFuture<'a> {
        Box::pin(async move {
            match self
                .invoke(self.scripts.give_back(key, alg, age_ms, now))
                .await?
            {
                Reply::Value(Value::Int(n)) => Ok(n == 1),
                other => Err(StoreError::Reply {
                    script: "give_back",
                    detail: format!("expected an integer, got {other:?}"),
                }),
            }
        })
    }

    fn charge<'a>(
        &'a self,
        key: &'a str,
        alg: &'a Algorithm,
        amount: i64,
        now: Option<Millis>,
    ) -> ChargeFuture<'a> {
        Box::pin(async move {
            let Some(call) = self.scripts.charge(key, alg, amount, now) else {
                return Ok(None);
            };
            reply::decode_balance(&self.invoke(call).await?).map(Some)
        })
    }

    fn ready(&self) -> ReadyFuture<'_> {
        Box::pin(self.ping())
    }

    fn acquire<'a>(
        &'a self,
        key: &'a str,
        slots: &'a Slots,
        holder: &'a str,
        now: Option<Millis>,
    ) -> StoreFuture<'a> {
        Box::pin(self.take_slot(key, slots, holder, now))
    }

    fn renew<'a>(
        &'a self,
        key: &'a str,
        slots: &'a Slots,
        holders: &'a [String],
        now: Option<Millis>,
    ) -> HoldFuture<'a> {
        Box::pin(self.slots_count(key, SlotsOp::Renew, slots, holders, now))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        slots: &'a Slots,
        holders: &'a [String],
        now: Option<Millis>,
    ) -> HoldFuture<'a> {
        Box::pin(self.slots_count(key, SlotsOp::Release, slots, holders, now))
    }

    fn peek<'a>(&'a self, key: &'a str, alg: &'a Algorithm) -> StoreFuture<'a> {
        Box::pin(async move {
            let value = match self.invoke(self.scripts.peek(key)).await? {
                Reply::Value(value) => value,
                other => {
                    return Err(StoreError::Reply {
                        script: "peek",
                        detail: format!("expected an array, got {other:?}"),
                    })
                }
            };
            let (now, mut state) = reply::decode_peek(alg, &value)?;
            // the tokens this instance leased ahead are taken already, as the store knows
            Ok(crate::limit::apply(alg, &mut state, now).0)
        })
    }

    fn forget<'a>(&'a self, key: &'a str) -> GiveBackFuture<'a> {
        Box::pin(async move {
            self.forget_leases();
            match self.invoke(self.scripts.forget(key)).await? {
                Reply::Value(Value::Int(n)) => Ok(n > 0),
                other => Err(StoreError::Reply {
                    script: "forget",
                    detail: format!("expected an integer, got {other:?}"),
                }),
            }
        })
    }

    fn resets<'a>(&'a self, key: &'a str, bump: bool) -> HoldFuture<'a> {
        Box::pin(async move {
            match self.invoke(self.scripts.resets(key, bump)).await? {
                Reply::Value(Value::Int(n)) => Ok(u64::try_from(n).unwrap_or(0)),
                other => Err(StoreError::Reply {
                    script: "resets",
                    detail: format!("expected an integer, got {other:?}"),
                }),
            }
        })
    }

    fn forget_local(&self) {
        self.forget_leases();
    }

    fn publish<'a>(&'a self, key: &'a str, id: &'a str, blob: &'a [u8]) -> HoldFuture<'a> {
        Box::pin(self.publish_fleet(key, id, blob))
    }

    fn fleet<'a>(&'a self, key: &'a str) -> FleetFuture<'a> {
        Box::pin(self.read_fleet(key))
    }

    fn adapt<'a>(
        &'a self,
        key: &'a str,
        aimd: &'a Aimd,
        report: Report,
        now: Option<Millis>,
    ) -> RateFuture<'a> {
        Box::pin(async move {
            let reply = self
                .invoke(self.scripts.adapt(key, aimd, report, now))
                .await?;
            reply::rate(&reply).ok_or_else(|| StoreError::Reply {
                script: "adapt",
                detail: format!("expected a rate as a decimal string, got {reply:?}"),
            })
        })
    }
}

impl ConnectionLike for Client {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a ::redis::Cmd,
    ) -> ::redis::RedisFuture<'a, ::redis::Value> {
        match self {
            Client::Single(c) => c.req_packed_command(cmd),
            Client::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a ::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> ::redis::RedisFuture<'a, Vec<::redis::Value>> {
        match self {
            Client::Single(c) => c.req_packed_commands(cmd, offset, count),
            Client::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Client::Single(c) => c.get_db(),
            Client::Cluster(c) => c.get_db(),
        }
    }
}

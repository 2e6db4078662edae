//! The typed configuration that the rest of tollgate sees: every value parsed, every default
//! filled in, every cross reference checked. Nothing here knows about YAML or serde.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

use crate::identity::{DuplicateKey, KeyPart};
use crate::limit::{Algorithm, Pace, Slots};
use crate::routing::{PathPolicy, RouteMatch};

/// A validated `proxy.yaml`.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `listen`: the addresses the proxy accepts clients on (at least one)
    pub listen: Vec<SocketAddr>,
    /// `workers`: worker threads; `None`: one per core
    pub workers: Option<NonZeroUsize>,
    /// `tls`: terminate TLS on every listener
    pub tls: Option<TlsConfig>,
    /// `admin`: the admin listener (`/metrics`, `/healthz`, `/readyz`, `/config`)
    pub admin: Option<AdminConfig>,
    /// `store`: where limiter state lives; the memory store when the file has no `store`
    pub store: StoreConfig,
    /// `trusted_proxies`: peers whose `X-Forwarded-For` is believed (bare addresses become
    /// /32 or /128 networks)
    pub trusted_proxies: Vec<IpNet>,
    /// `rate_limit_headers`: which rate-limit headers responses carry
    pub rate_limit_headers: HeaderStyle,
    /// `timeouts`
    pub timeouts: Timeouts,
    /// `max_body_size` in bytes: larger request bodies get 413; `None`: no bound (absent, or
    /// written 0 as nginx's `client_max_body_size 0`)
    pub max_body_size: Option<u64>,
    /// `paths`: how request paths are read before routes match them
    pub paths: PathPolicy,
    /// `access_log`: what the access log writes of the path and the client
    pub access_log: AccessLog,
    /// `forwarded_headers`: which identity headers tollgate sets on forwarded requests
    pub forwarded_headers: ForwardedHeaders,
    /// `upstreams`, in file order
    pub upstreams: Vec<UpstreamConfig>,
    /// `routes`, in file order (the first that matches wins)
    pub routes: Vec<RouteConfig>,
}

impl Config {
    /// The upstream called `name`. Every route's `upstream` names one (validation checks it).
    pub fn upstream(&self, name: &str) -> Option<&UpstreamConfig> {
        self.upstreams.iter().find(|u| u.name == name)
    }

    /// The number of worker threads: `workers`, or one per core.
    pub fn worker_count(&self) -> usize {
        match self.workers {
            Some(n) => n.get(),
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// `tls`: a certificate chain and its private key, PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// `tls.cert`: the certificate chain
    pub cert: PathBuf,
    /// `tls.key`: the private key
    pub key: PathBuf,
}

/// `admin`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// `admin.listen`: keep it on loopback
    pub listen: SocketAddr,
    /// `admin.token` or `admin.token_file`: the bearer token the `/api/` calls need
    pub token: Option<AdminToken>,
    /// `admin.max_connections`: connections past it are closed at once (default
    /// [`AdminConfig::DEFAULT_MAX_CONNECTIONS`])
    pub max_connections: usize,
    /// `admin.hosts`: the `Host` names a listener without a token answers besides IP
    /// literals and `localhost`; lowercase, without a trailing dot
    pub hosts: Vec<String>,
}

impl AdminConfig {
    /// Scrapers, probes and a few operators need a handful of connections; 256 leave room
    /// for many, and at the common descriptor limit of 1024 three quarters for the proxy.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
}

/// Where the admin token comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum AdminToken {
    /// `admin.token`, written in the file or taken from the environment with `${VAR}`
    Value(String),
    /// `admin.token_file`: the file's first line, read at start and at every reload
    File(PathBuf),
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminToken::Value(_) => f.write_str("Value(<redacted>)"),
            AdminToken::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

impl AdminToken {
    /// The token: the value, or the first line of the file. An empty token is an error.
    pub fn read(&self) -> Result<String, String> {
        let token = match self {
            AdminToken::Value(v) => v.trim().to_owned(),
            AdminToken::File(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned(),
        };
        match token.is_empty() {
            true => Err("the admin token is empty".to_owned()),
            false => Ok(token),
        }
    }
}

/// `store`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// `store.backend` with `url`, `cluster` or `sentinel`
    pub backend: Backend,
    /// `store.key_prefix`: the first part of every key (default `tollgate`)
    pub key_prefix: String,
    /// `store.timeout`: per limiter call; past it the call counts as a store error (default 50ms)
    pub timeout: Duration,
    /// `store.on_error`: what a failed store call means (default `local`)
    pub on_error: OnError,
    /// `store.instances`: with `on_error: local`, each instance enforces 1/instances of every
    /// limit (default 1)
    pub instances: NonZeroU32,
    /// `store.max_keys`: bound of the memory store and of the local fallback (default 1000000)
    pub max_keys: NonZeroUsize,
    /// `store.leases`: busy token buckets of 1 000 tokens or more may lease a few tokens ahead
    /// on each worker (docs/algorithms.md, "Leases"; default true); false: every check is a
    /// Redis call
    pub leases: bool,
    /// `store.tls`: how `rediss://` connections trust Redis and identify themselves
    pub tls: Option<ClientTls>,
}

/// `tls` of a connection tollgate makes, `store.tls` or `upstreams.<name>.tls`: which servers it
/// trusts and how it shows itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// `ca`: certificates to trust beside the bundled and system roots
    pub ca: Option<PemFile>,
    /// `cert` and `key`: a client certificate chain and its private key
    pub identity: Option<(PemFile, PemFile)>,
    /// `server_name`: the name the server's certificate must be valid for, also sent in SNI
    pub server_name: Option<String>,
    /// `verify` (default true); false: no verification of the server's certificate at all
    pub verify: bool,
}

/// A PEM file the configuration names, and what it held when the configuration was loaded.
#[derive(Clone, PartialEq, Eq)]
pub struct PemFile {
    /// as written
    pub path: PathBuf,
    /// the contents, read by [`super::load`]; `None` from [`super::parse`], which reads no
    /// files. So a reload that finds a file changed builds a new store.
    pub contents: Option<Vec<u8>>,
}

impl std::fmt::Debug for PemFile {
    // (a private key's bytes must not reach a log line)
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let read = self.contents.as_ref().map(Vec::len);
        write!(f, "PemFile({}, read: {read:?})", self.path.display())
    }
}

impl Default for StoreConfig {
    /// The store used when the file has no `store`: in memory, with every default.
    fn default() -> StoreConfig {
        StoreConfig {
            backend: Backend::Memory,
            key_prefix: "tollgate".to_owned(),
            timeout: Duration::from_millis(50),
            on_error: OnError::Local,
            instances: NonZeroU32::MIN,
            max_keys: NonZeroUsize::new(1_000_000).expect("a non-zero literal"),
            leases: true,
            tls: None,
        }
    }
}

/// Where limiter state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// in this process only
    Memory,
    /// one Redis server
    Redis {
        /// `redis://`, `rediss://` (TLS) or `redis+unix://` / `unix://`
        url: String,
    },
    /// a Redis Cluster
    Cluster {
        /// the seed nodes
        urls: Vec<String>,
    },
    /// the master that Redis Sentinels name
    Sentinel(SentinelConfig),
}

/// `store.sentinel`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelConfig {
    /// `master_name`: the name the Sentinels monitor the master by
    pub master_name: String,
    /// `nodes`: the Sentinels, `redis://` or `rediss://` (all alike); a URL's user and password
    /// are the Sentinel's own
    pub nodes: Vec<String>,
    /// `username`: the master's user
    pub username: Option<String>,
    /// `password`: the master's password
    pub password: Option<String>,
    /// `db`: the master's database (default 0)
    pub db: i64,
}

/// `store.on_error`: the store's own policy type, so config and store cannot drift apart.
pub use crate::store::OnError;

/// `rate_limit_headers`: the proxy's own type, so config and proxy cannot drift apart.
pub use crate::proxy::HeaderStyle;

/// `access_log`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AccessLog {
    /// `access_log.query`: write the query after the path (default false: queries may hold
    /// tokens)
    pub query: bool,
    /// `access_log.client`: the client's address (the default) or a hash of it
    pub client: LogClient,
}

/// `forwarded_headers`: each on by default, so that an upstream never sees a client's own
/// claim of who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardedHeaders {
    /// `forwarded_headers.x_real_ip`: set `X-Real-IP` to the client tollgate identified
    pub x_real_ip: bool,
    /// `forwarded_headers.forwarded`: append tollgate's element to `Forwarded` (RFC 7239)
    pub forwarded: bool,
}

impl Default for ForwardedHeaders {
    fn default() -> ForwardedHeaders {
        ForwardedHeaders {
            x_real_ip: true,
            forwarded: true,
        }
    }
}

/// `access_log.client`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogClient {
    /// the address
    #[default]
    Address,
    /// the first 12 hex digits of the SHA-1 of the address
    Hash,
}

/// `timeouts`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `client_header`: a client must send its request head within this (default 10s)
    pub client_header: Duration,
    /// `upstream_connect` (default 2s)
    pub upstream_connect: Duration,
    /// `upstream_response`: until the response head arrives (default 30s)
    pub upstream_response: Duration,
    /// `idle`: an idle client connection is closed after this (default 60s)
    pub idle: Duration,
    /// `send`: a client that takes none of its response's bytes for this long is cut off, as
    /// by nginx's `send_timeout` (default 60s)
    pub send: Duration,
    /// `linger`: after an HTTP/1 answer that closes the connection before the request body
    /// was read, how long tollgate keeps reading and discarding it, so the client can read the
    /// answer; zero closes at once (default 2s)
    pub linger: Duration,
    /// `shutdown`: drain time after SIGTERM (default 30s)
    pub shutdown: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            client_header: Duration::from_secs(10),
            upstream_connect: Duration::from_secs(2),
            upstream_response: Duration::from_secs(30),
            idle: Duration::from_secs(60),
            send: Duration::from_secs(60),
            linger: Duration::from_secs(2),
            shutdown: Duration::from_secs(30),
        }
    }
}

/// `upstreams.NAME`
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    /// the key under `upstreams`
    pub name: String,
    /// `targets`: `http://` or `https://` with a host, no path; used round robin (at least one)
    pub targets: Vec<http::Uri>,
    /// `preserve_host`: forward the client's `Host` (default true)
    pub preserve_host: bool,
    /// `pace.rate` and `pace.max_delay`: outbound leaky bucket shared by every instance
    pub pace: Option<Pace>,
    /// `pace.max_waiting`: bound on requests sleeping for a slot in this process
    pub max_waiting: Option<NonZeroUsize>,
    /// `pace.concurrency`: bound on requests in flight to it, across every instance
    pub concurrency: Option<PaceConcurrency>,
    /// `pace.adaptive`: the pace's rate moves with what the upstream answers
    pub adaptive: Option<AdaptiveConfig>,
    /// `protocol`: the HTTP version spoken to the targets
    pub protocol: Protocol,
    /// `http2`: how HTTP/2 connections to the targets are kept
    pub http2: Http2Config,
    /// `tls`: the settings of `https://` targets; `None`: the defaults
    pub tls: Option<ClientTls>,
}

/// `upstreams.NAME.pace.concurrency`, and the `pace.max_delay` a request waits for a slot at
/// most (`None`: as long as it takes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaceConcurrency {
    /// the bound, with the default lease
    pub slots: Slots,
    /// `pace.max_delay`
    pub max_delay: Option<Duration>,
}

/// `upstreams.NAME.http2`: how the HTTP/2 connections to an upstream's targets are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Config {
    /// `keepalive_interval`: a PING goes out after this long without a frame from the target
    pub keepalive_interval: Duration,
    /// `keepalive_timeout`: a PING unanswered this long closes the connection
    pub keepalive_timeout: Duration,
    /// `max_connections`: connections per target when every stream of the open ones is in use
    pub max_connections: NonZeroUsize,
}

impl Default for Http2Config {
    fn default() -> Http2Config {
        Http2Config {
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(5),
            // Envoy opens connections without bound; 4 × a typical 100-128 streams each is
            // 400-500 requests in flight per target, more than one target serves at once
            max_connections: NonZeroUsize::new(4).expect("4 is not zero"),
        }
    }
}

/// `upstreams.NAME.protocol`: the proxy's own type, so config and proxy cannot drift apart.
pub use crate::proxy::Protocol;

/// `routes[N]`
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    /// `name`, unique among routes
    pub name: String,
    /// `match`; no `match`: every request
    pub matcher: RouteMatch,
    /// `strip_prefix`: forward `/v1/x` as `/x` (only with `match.path_prefix`)
    pub strip_prefix: bool,
    /// `upstream`: the name of an entry of [`Config::upstreams`]
    pub upstream: String,
    /// `limits`, checked in order; the first that denies answers the request
    pub limits: Vec<LimitConfig>,
}

/// `routes[N].limits[M]`
#[derive(Debug, Clone, PartialEq)]
pub struct LimitConfig {
    /// `name`, unique within its route
    pub name: String,
    /// `algorithm` with its parameters
    pub algorithm: Algorithm,
    /// `key`: what identifies a client to this limit (default: `ip`)
    pub key: Vec<KeyPart>,
    /// `mode` (default enforce)
    pub mode: Mode,
    /// `exempt`: client networks this limit never applies to
    pub exempt: Vec<IpNet>,
    /// `overrides`: other parameters for particular key values, in file order; each is the
    /// limit's own parameters with the override's merged over them
    pub overrides: Vec<(String, Algorithm)>,
    /// `charge`: what the upstream reports a request used, charged after the response; the
    /// algorithm (and each override's) is then [`Algorithm::charged`]
    pub charge: Option<Charge>,
    /// `duplicate_key`: what a request whose key header or query parameter comes more than
    /// once gets (default: 400)
    pub duplicate_key: DuplicateKey,
}

/// `routes[N].limits[M].charge`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// `response_header`: the response header, or trailer, holding the number used
    pub response_header: http::HeaderName,
    /// `missing`: what a response that never reports a usable number is charged (default:
    /// the limit's `cost`, so such a response charges nothing more)
    pub missing: Option<std::num::NonZeroU32>,
}

/// `routes[N].limits[M].mode`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// deny requests over the limit
    #[default]
    Enforce,
    /// count and log requests over the limit, never deny
    Shadow,
}

/// `upstreams.NAME.pace.adaptive`: the shared rate starts at `pace.rate` and moves within
/// `min` and `max` as AIMD moves it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveConfig {
    /// `pace.rate`, `min`, `max`, `increase`, `decrease` and `interval`
    pub aimd: crate::limit::Aimd,
    /// `target_latency`: a response head slower than this counts as trouble
    pub target_latency: Option<Duration>,
}

//! The only wiring module: builds the store, the routes and the upstream client from a
//! [`Config`], binds the listeners, hands them to the server, and drains on shutdown.
//!
//! Entry points follow mini-redis: [`Server::bind`] binds (so tests can bind `127.0.0.1:0` and
//! read the port), then [`Server::run`] serves until the `shutdown` future completes.

mod adapt;
mod build;
mod reload;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use arc_swap::ArcSwap;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::admin::{self, AdminState};
use crate::config::{Config, StoreConfig};
use crate::console::api::{self as console, InForce};
use crate::console::fleet::Instance;
use crate::console::{Console, Reloaded};
use crate::metrics::Metrics;
use crate::proxy::{Http1Client, Proxy, UpstreamClients};
use crate::refusals::Refusals;
use crate::server::{accept_loop, http_builder, AcceptCtx, Descriptors, Live, SideBounds, Workers};
use crate::store::Store;
use crate::tls;

pub use build::{build_proxy, build_store};
pub use reload::Reloader;

/// A bound, ready-to-run proxy.
pub struct Server {
    shared: Arc<Shared>,
    listeners: Vec<TcpListener>,
    /// the admin listener, when `admin.listen` is set
    admin: Option<TcpListener>,
    /// the threads that serve connections
    workers: Arc<Workers>,
}

/// What the listeners, the reloader and the admin endpoints share.
struct Shared {
    /// What connections read: the proxy, the timeouts and the TLS config in force.
    live: Arc<Live>,
    /// The config in force and the store built from its `store` section: a reload whose
    /// `store` is unchanged keeps the store (and its connections and in-process state).
    /// A std mutex: held only to read or replace, never across an `.await`.
    current: Mutex<(Config, Arc<dyn Store>)>,
    /// The pooled upstream clients (one per worker), kept across reloads so pooled
    /// connections survive.
    clients: UpstreamClients,
    /// One registry for the whole process, across reloads.
    metrics: Metrics,
    /// Set when shutdown starts: `/readyz` then answers 503 so balancers stop sending.
    draining: AtomicBool,
    /// Upgraded (WebSocket) tunnels: hyper's graceful shutdown does not see them.
    tunnels: TaskTracker,
    /// The clients each limit refused most, across reloads.
    refusals: Arc<Refusals>,
    /// The `/api/` token in force, read from the config at start and at each reload.
    token: Mutex<Option<Arc<str>>>,
    /// What the last reload did, if one was tried.
    reloaded: Mutex<Option<Reloaded>>,
    /// The operator console's figures, which the admin listener answers with and the fleet
    /// is sent.
    console: Console,
}

impl Server {
    /// Builds everything from `config` and binds its listeners. Fails when an address cannot
    /// be bound (in use, not local) or the Redis URL is malformed.
    pub async fn bind(config: Config) -> anyhow::Result<Server> {
        Server::bind_over(config, Http1Client::Own).await
    }

    /// [`Server::bind`], with `http1` carrying the requests without a body to `http://`
    /// targets.
    pub async fn bind_over(config: Config, http1: Http1Client) -> anyhow::Result<Server> {
        let metrics = Metrics::new();
        let workers = config.worker_count();
        let store = build_store(&config.store, workers, &metrics).await?;
        let clients = UpstreamClients::new(
            workers,
            config.timeouts.upstream_connect,
            config.timeouts.idle,
            http1,
            (*tls::ClientTls::default().client_config()?).clone(),
        );
        let tunnels = TaskTracker::new();
        let refusals = Arc::new(Refusals::default());
        let token = admin_token(&config)?;
        let proxy = build_proxy(
            &config,
            store.clone(),
            clients.clone(),
            metrics.clone(),
            tunnels.clone(),
            refusals.clone(),
        )?;
        let mut listeners = Vec::with_capacity(config.listen.len());
        for addr in &config.listen {
            let l = bind(*addr).with_context(|| format!("cannot listen on {addr}"))?;
            listeners.push(l);
        }
        let tls = match &config.tls {
            Some(t) => Some(ArcSwap::new(tls::server_config(&t.cert, &t.key)?)),
            None => None,
        };
        let admin = match &config.admin {
            Some(admin) => Some(
                bind(admin.listen)
                    .with_context(|| format!("cannot listen on {} (admin)", admin.listen))?,
            ),
            None => None,
        };
        let workers = Workers::start(workers).context("cannot start the worker threads")?;
        let instance = Instance::new(listeners.first().and_then(|l| l.local_addr().ok()));
        let sampler = crate::console::sample::Sampler::new(metrics.clone());
        let console = Console::new(sampler, refusals.clone(), instance);
        let shared = Arc::new(Shared {
            live: Arc::new(Live {
                proxy: ArcSwap::from_pointee(proxy),
                timeouts: ArcSwap::from_pointee(config.timeouts),
                tls,
            }),
            current: Mutex::new((config, store)),
            clients,
            metrics,
            draining: AtomicBool::new(false),
            tunnels,
            refusals,
            token: Mutex::new(token),
            reloaded: Mutex::new(None),
            console,
        });
        Ok(Server {
            shared,
            listeners,
            admin,
            workers: Arc::new(workers),
        })
    }

    /// The addresses actually bound (a port 0 in the config is resolved here).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// The admin listener's address, when there is one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The refused clients `/api/stats` lists: a test moves their clock with
    /// [`Refusals::skip`].
    pub fn refusals(&self) -> Arc<Refusals> {
        self.shared.refusals.clone()
    }

    /// The process's metrics.
    pub fn metrics(&self) -> Metrics {
        self.shared.metrics.clone()
    }

    /// A handle that applies new configurations to this server while it runs.
    pub fn reloader(&self) -> Reloader {
        Reloader::new(self.shared.clone())
    }

    /// Serves until `shutdown` completes, then stops accepting and lets in-flight requests
    /// finish for up to `timeouts.shutdown`.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let graceful = Arc::new(GracefulShutdown::new());
        let config = self.shared.config();
        let http = Arc::new(http_builder());
        // one budget for every listener: the admin's connections never take the proxy's share
        let descriptors = Arc::new(Descriptors::default());
        // where the fleet's resets stand before the first request: one made from now on is
        // one this instance must hear of
        let counts = console::read_counts(&*self.shared).await;
        let resets = tokio::spawn(console::watch_resets(self.shared.clone(), counts));
        let adapting = tokio::spawn(adapt::adapt_rates(self.shared.clone()));
        let publishing = tokio::spawn(console::publish_figures(
            self.shared.clone(),
            self.shared.console.clone(),
        ));
        let workers = self.workers;
        tracing::info!(workers = workers.count(), "worker threads");
        let mut accepting = Vec::new();
        for listener in self.listeners {
            tracing::info!(addr = %listener.local_addr()?, "listening");
            let ctx = AcceptCtx {
                live: self.shared.live.clone(),
                http: http.clone(),
                descriptors: descriptors.clone(),
            };
            let loop_ = accept_loop(
                listener,
                ctx,
                graceful.clone(),
                workers.clone(),
                stop_rx.clone(),
            );
            accepting.push(tokio::spawn(loop_));
        }
        let (admin_stop, admin_stopped) = watch::channel(false);
        let admin = self.admin.map(|listener| {
            let max = config
                .admin
                .as_ref()
                .map_or(crate::config::AdminConfig::DEFAULT_MAX_CONNECTIONS, |a| {
                    a.max_connections
                });
            let bounds = SideBounds {
                timeouts: {
                    let live = self.shared.live.clone();
                    Arc::new(move || **live.timeouts.load())
                },
                http: http.clone(),
                max_connections: max,
                descriptors: descriptors.clone(),
            };
            serve_admin(listener, &self.shared, bounds, admin_stopped)
        });
        shutdown.await;
        resets.abort();
        adapting.abort();
        publishing.abort();
        tracing::info!("shutting down: draining in-flight requests");
        self.shared.draining.store(true, Ordering::Release);
        let _ = stop_tx.send(true);
        for task in accepting {
            let _ = task.await;
        }
        let graceful =
            Arc::try_unwrap(graceful).map_err(|_| anyhow::anyhow!("accept loops still running"))?;
        drain(&self.shared, graceful).await;
        // what is left on the other workers (after a drain that timed out) ends with them; on
        // worker 0, with the runtime
        workers.stop().await;
        // the admin listener outlives the drain, so /readyz can say "draining" meanwhile
        let _ = admin_stop.send(true);
        if let Some(admin) = admin {
            let _ = admin.await;
        }
        Ok(())
    }
}

/// Serves the admin listener in a task of its own until `stop` changes.
fn serve_admin(
    listener: TcpListener,
    shared: &Arc<Shared>,
    bounds: SideBounds,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(addr = %addr, "admin listening");
    }
    let state = admin_state(shared);
    tokio::spawn(admin::serve(listener, state, bounds, async move {
        let _ = stop.changed().await;
    }))
}

/// Lets in-flight requests and tunnels finish, for `timeouts.shutdown` at most.
async fn drain(shared: &Shared, graceful: GracefulShutdown) {
    let limit = shared.config().timeouts.shutdown;
    shared.tunnels.close();
    let tunnels = shared.tunnels.clone();
    let all_done = async move {
        graceful.shutdown().await;
        tunnels.wait().await;
    };
    tokio::select! {
        _ = all_done => tracing::info!("drained"),
        _ = tokio::time::sleep(limit) => {
            tracing::warn!(after = ?limit, "drain timed out; closing remaining connections");
        }
    }
}

/// A listening socket with a backlog for bursts of new connections: the OS default that
/// `TcpListener::bind` uses (128) overflows when hundreds of clients connect at once, and the
/// overflow costs them a SYN retransmit (a second or more). nginx uses 511; the kernel caps
/// it at `net.core.somaxconn`.
fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Pending connections the kernel may queue per listener.
const LISTEN_BACKLOG: u32 = 4096;

/// What the admin endpoints read: metrics, the config in force, readiness, the console.
fn admin_state(shared: &Arc<Shared>) -> AdminState {
    let for_config = shared.clone();
    let for_ready = shared.clone();
    let for_token = shared.clone();
    let for_hosts = shared.clone();
    AdminState {
        metrics: shared.metrics.clone(),
        config_json: Arc::new(move || for_config.config().to_json()),
        ready: Arc::new(move || {
            let shared = for_ready.clone();
            Box::pin(async move {
                if shared.draining.load(Ordering::Acquire) {
                    return Err("draining".to_string());
                }
                let store = shared.store().1;
                store.ready().await.map_err(|e| e.to_string())
            })
        }),
        token: Arc::new(move || {
            for_token
                .token
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        }),
        hosts: Arc::new(move || {
            let current = for_hosts.current.lock().unwrap_or_else(|e| e.into_inner());
            current
                .0
                .admin
                .as_ref()
                .map_or_else(Vec::new, |a| a.hosts.clone())
        }),
        api: Arc::new(console::ConsoleApi::new(
            shared.clone(),
            shared.console.clone(),
        )),
        page: admin::Page {
            html: crate::console::page::HTML,
            content_security_policy: http::HeaderValue::from_str(
                &crate::console::page::content_security_policy(),
            )
            .expect("the policy is ASCII: keywords and base64"),
        },
    }
}

/// The `/api/` token `config` sets, read from its file when it names one.
fn admin_token(config: &Config) -> anyhow::Result<Option<Arc<str>>> {
    let Some(token) = config.admin.as_ref().and_then(|a| a.token.as_ref()) else {
        return Ok(None);
    };
    let token = token
        .read()
        .map_err(|why| anyhow::anyhow!("admin token: {why}"))?;
    Ok(Some(token.into()))
}

impl InForce for Shared {
    fn in_force(&self) -> (Config, Arc<dyn Store>) {
        Shared::in_force(self)
    }

    fn store(&self) -> (StoreConfig, Arc<dyn Store>) {
        Shared::store(self)
    }

    fn proxy(&self) -> Arc<Proxy> {
        self.live.proxy.load_full()
    }

    fn reloaded(&self) -> Option<Reloaded> {
        self.reloaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

impl Shared {
    /// The config in force (a clone: configs are small and this is not on the request path).
    fn config(&self) -> Config {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }

    /// The config in force and the store built from it, read together.
    fn in_force(&self) -> (Config, Arc<dyn Store>) {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        (current.0.clone(), current.1.clone())
    }

    /// The store in force, and the `store` section it was built from.
    fn store(&self) -> (StoreConfig, Arc<dyn Store>) {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        (current.0.store.clone(), current.1.clone())
    }
}

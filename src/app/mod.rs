//! The only wiring module: builds the store, the routes and the upstream client from a
//! [`Config`], binds the listeners, serves connections, and drains them on shutdown.
//!
//! Entry points follow mini-redis: [`Server::bind`] binds (so tests can bind `127.0.0.1:0` and
//! read the port), then [`Server::run`] serves until the `shutdown` future completes.

mod build;
mod reload;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admin::{self, AdminState};
use crate::config::{Config, StoreConfig};
use crate::metrics::Metrics;
use crate::proxy::{self, Conn, Proxy, UpstreamClient};
use crate::store::Store;

pub use build::{build_proxy, build_store};
pub use reload::Reloader;

/// A bound, ready-to-run proxy.
pub struct Server {
    shared: Arc<Shared>,
    listeners: Vec<TcpListener>,
    /// the admin listener, when `admin.listen` is set
    admin: Option<TcpListener>,
}

/// What the listeners, the reloader and the admin endpoints share.
struct Shared {
    /// The routes, limits and upstreams in force. Swapped whole on reload; each request loads
    /// it once, so a request in flight finishes under the config it started with.
    proxy: ArcSwap<Proxy>,
    /// The config in force and the store built from its `store` section: a reload whose
    /// `store` is unchanged keeps the store (and its connections and in-process state).
    /// A std mutex: held only to read or replace, never across an `.await`.
    current: Mutex<(Config, Arc<dyn Store>)>,
    /// The pooled upstream client, kept across reloads so pooled connections survive.
    client: UpstreamClient,
    /// One registry for the whole process, across reloads.
    metrics: Metrics,
    /// Set when shutdown starts: `/readyz` then answers 503 so balancers stop sending.
    draining: AtomicBool,
}

impl Server {
    /// Builds everything from `config` and binds its listeners. Fails when an address cannot
    /// be bound (in use, not local) or the Redis URL is malformed.
    pub async fn bind(config: Config) -> anyhow::Result<Server> {
        let metrics = Metrics::new();
        let store = build_store(&config.store, &metrics).await?;
        let client = proxy::client(config.timeouts.upstream_connect, config.timeouts.idle);
        let proxy = build_proxy(&config, store.clone(), client.clone(), metrics.clone())?;
        let mut listeners = Vec::with_capacity(config.listen.len());
        for addr in &config.listen {
            let l = TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?;
            listeners.push(l);
        }
        let admin = match &config.admin {
            Some(admin) => Some(
                TcpListener::bind(admin.listen)
                    .await
                    .with_context(|| format!("cannot listen on {} (admin)", admin.listen))?,
            ),
            None => None,
        };
        let shared = Arc::new(Shared {
            proxy: ArcSwap::from_pointee(proxy),
            current: Mutex::new((config, store)),
            client,
            metrics,
            draining: AtomicBool::new(false),
        });
        Ok(Server {
            shared,
            listeners,
            admin,
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
        let builder = Arc::new(http_builder(&config));
        let mut accepting = Vec::new();
        for listener in self.listeners {
            tracing::info!(addr = %listener.local_addr()?, "listening");
            let ctx = AcceptCtx {
                shared: self.shared.clone(),
                builder: builder.clone(),
                graceful: graceful.clone(),
            };
            accepting.push(tokio::spawn(accept_loop(listener, ctx, stop_rx.clone())));
        }
        let (admin_stop, admin_stopped) = watch::channel(false);
        let admin = self.admin.map(|listener| {
            let mut stop = admin_stopped;
            let state = admin_state(&self.shared);
            tokio::spawn(admin::serve(listener, state, async move {
                let _ = stop.changed().await;
            }))
        });
        shutdown.await;
        tracing::info!("shutting down: draining in-flight requests");
        self.shared.draining.store(true, Ordering::Release);
        let _ = stop_tx.send(true);
        for task in accepting {
            let _ = task.await;
        }
        let graceful =
            Arc::try_unwrap(graceful).map_err(|_| anyhow::anyhow!("accept loops still running"))?;
        let drain = self.shared.config().timeouts.shutdown;
        tokio::select! {
            _ = graceful.shutdown() => tracing::info!("drained"),
            _ = tokio::time::sleep(drain) => {
                tracing::warn!(after = ?drain, "drain timed out; closing remaining connections");
            }
        }
        // the admin listener outlives the drain, so /readyz can say "draining" meanwhile
        let _ = admin_stop.send(true);
        if let Some(admin) = admin {
            let _ = admin.await;
        }
        Ok(())
    }
}

/// What the admin endpoints read: metrics, the config in force, readiness.
fn admin_state(shared: &Arc<Shared>) -> AdminState {
    let for_config = shared.clone();
    let for_ready = shared.clone();
    AdminState {
        metrics: shared.metrics.clone(),
        config_json: Arc::new(move || for_config.config().to_json()),
        ready: Arc::new(move || {
            !for_ready.draining.load(Ordering::Acquire) && for_ready.store().1.ready()
        }),
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

    /// The store in force, and the `store` section it was built from.
    fn store(&self) -> (StoreConfig, Arc<dyn Store>) {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        (current.0.store.clone(), current.1.clone())
    }
}

struct AcceptCtx {
    shared: Arc<Shared>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    graceful: Arc<GracefulShutdown>,
}

async fn accept_loop(listener: TcpListener, ctx: AcceptCtx, mut stop: watch::Receiver<bool>) {
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let _ = stream.set_nodelay(true);
        let shared = ctx.shared.clone();
        let conn_info = Conn { peer, tls: false };
        let service = service_fn(move |req| {
            let proxy: Arc<Proxy> = shared.proxy.load_full();
            async move { Ok::<_, Infallible>(proxy.handle(req, conn_info).await) }
        });
        let conn = ctx
            .builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service);
        let conn = ctx.graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

fn http_builder(config: &Config) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.timeouts.client_header)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    builder
}

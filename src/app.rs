//! The only wiring module: builds the store, the routes and the upstream client from a
//! [`Config`], binds the listeners, serves connections, and drains them on shutdown.
//!
//! Entry points follow mini-redis: [`Server::bind`] binds (so tests can bind `127.0.0.1:0` and
//! read the port), then [`Server::run`] serves until the `shutdown` future completes.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::config::{self, Backend, Config};
use crate::limit::Algorithm;
use crate::proxy::{
    self, Conn, HeaderStyle, Limit, Pacer, Proxy, Route, Settings, Targets, Upstream,
};
use crate::routing::{PathMatch, RouteTable};
use crate::store::{GuardedStore, MemoryStore, RedisStore, RedisTarget, Store};

/// A bound, ready-to-run proxy.
pub struct Server {
    proxy: Arc<Proxy>,
    listeners: Vec<TcpListener>,
    config: Config,
}

impl Server {
    /// Builds everything from `config` and binds its listeners. Fails when an address cannot
    /// be bound (in use, not local) or the Redis URL is malformed.
    pub async fn bind(config: Config) -> anyhow::Result<Server> {
        let proxy = Arc::new(build_proxy(&config).await?);
        let mut listeners = Vec::with_capacity(config.listen.len());
        for addr in &config.listen {
            let l = TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?;
            listeners.push(l);
        }
        Ok(Server {
            proxy,
            listeners,
            config,
        })
    }

    /// The addresses actually bound (a port 0 in the config is resolved here).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Serves until `shutdown` completes, then stops accepting and lets in-flight requests
    /// finish for up to `timeouts.shutdown`.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let graceful = Arc::new(GracefulShutdown::new());
        let builder = Arc::new(http_builder(&self.config));
        let mut accepting = Vec::new();
        for listener in self.listeners {
            tracing::info!(addr = %listener.local_addr()?, "listening");
            let ctx = AcceptCtx {
                proxy: self.proxy.clone(),
                builder: builder.clone(),
                graceful: graceful.clone(),
            };
            accepting.push(tokio::spawn(accept_loop(listener, ctx, stop_rx.clone())));
        }
        shutdown.await;
        tracing::info!("shutting down: draining in-flight requests");
        let _ = stop_tx.send(true);
        for task in accepting {
            let _ = task.await;
        }
        let graceful =
            Arc::try_unwrap(graceful).map_err(|_| anyhow::anyhow!("accept loops still running"))?;
        tokio::select! {
            _ = graceful.shutdown() => tracing::info!("drained"),
            _ = tokio::time::sleep(self.config.timeouts.shutdown) => {
                tracing::warn!(after = ?self.config.timeouts.shutdown, "drain timed out; closing remaining connections");
            }
        }
        Ok(())
    }
}

struct AcceptCtx {
    proxy: Arc<Proxy>,
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
        let proxy = ctx.proxy.clone();
        let conn_info = Conn { peer, tls: false };
        let service = service_fn(move |req| {
            let proxy = proxy.clone();
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

/// The store the config asks for: memory, or Redis behind the failure policy.
pub async fn build_store(config: &config::StoreConfig) -> anyhow::Result<Arc<dyn Store>> {
    let target = match &config.backend {
        Backend::Memory => return Ok(Arc::new(MemoryStore::new(config.max_keys))),
        Backend::Redis { url } => RedisTarget::Single(url.clone()),
        Backend::Cluster { urls } => RedisTarget::Cluster(urls.clone()),
    };
    let redis = RedisStore::connect(&target, config.timeout).context("redis store")?;
    if let Err(e) = redis.ping().await {
        tracing::warn!(error = %e, on_error = ?config.on_error,
            "redis is not answering; limiting falls back to on_error until it does");
    }
    Ok(Arc::new(GuardedStore::new(
        Arc::new(redis),
        config.on_error,
        config.instances,
        config.max_keys,
    )))
}

async fn build_proxy(config: &Config) -> anyhow::Result<Proxy> {
    let store = build_store(&config.store).await?;
    let prefix = &config.store.key_prefix;
    let mut upstreams = HashMap::new();
    for u in &config.upstreams {
        let pacer = u.pace.map(|pace| Pacer {
            upstream: u.name.clone(),
            alg: Algorithm::LeakyBucket(pace),
            key: format!("{prefix}:upstream:{}:pace", u.name),
            waiting: u.max_waiting.map(|n| Arc::new(Semaphore::new(n.get()))),
        });
        let upstream = Upstream {
            name: u.name.clone(),
            targets: Targets::new(&u.targets),
            preserve_host: u.preserve_host,
            pacer,
        };
        upstreams.insert(u.name.clone(), Arc::new(upstream));
    }
    let mut routes = Vec::with_capacity(config.routes.len());
    for r in &config.routes {
        let upstream = upstreams
            .get(&r.upstream)
            .with_context(|| format!("route {} names a missing upstream {}", r.name, r.upstream))?
            .clone();
        let limits = r.limits.iter().map(|l| Limit {
            name: l.name.clone(),
            alg: l.algorithm,
            key: l.key.clone(),
            shadow: l.mode == config::Mode::Shadow,
            exempt: l.exempt.clone(),
            overrides: l.overrides.iter().cloned().collect(),
        });
        let strip = match (&r.matcher.path, r.strip_prefix) {
            (m @ PathMatch::Prefix(_), true) => Some(m.clone()),
            _ => None,
        };
        let route = Route {
            name: r.name.clone(),
            strip,
            upstream,
            limits: limits.collect(),
        };
        routes.push((r.matcher.clone(), route));
    }
    let headers = match config.rate_limit_headers {
        config::HeaderStyle::Ietf => HeaderStyle::Ietf,
        config::HeaderStyle::Legacy => HeaderStyle::Legacy,
        config::HeaderStyle::Both => HeaderStyle::Both,
        config::HeaderStyle::None => HeaderStyle::None,
    };
    Ok(Proxy {
        routes: RouteTable::new(routes),
        store,
        client: proxy::client(config.timeouts.upstream_connect, config.timeouts.idle),
        settings: Settings {
            trusted_proxies: config.trusted_proxies.clone(),
            headers,
            key_prefix: prefix.clone(),
            upstream_response: config.timeouts.upstream_response,
            max_body_size: config.max_body_size,
        },
    })
}

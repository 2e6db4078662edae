//! Building the runtime pieces from a validated [`Config`]: the store (memory, or Redis behind
//! its failure policy) and the [`Proxy`] (routes, limits, upstreams, pacers).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::task::TaskTracker;

use crate::config::{self, Backend, Config};
use crate::metrics::{Metrics, RouteSeries};
use crate::proxy::inflight::Inflight;
use crate::proxy::slots::Holders;
use crate::proxy::{
    access, Charge, Dial, H2Settings, Limit, Pacer, Proxy, Route, Settings, Targets, Upstream,
    UpstreamClients,
};
use crate::refusals::Refusals;
use crate::routing::{PathMatch, RouteTable};
use crate::store::{
    Connection, GuardedStore, MemoryStore, RedisStore, RedisTarget, SentinelTarget, Store,
    StoreError, StoreObserver,
};
use crate::tls::{ClientTls, Pem};
use rustls_pki_types::ServerName;

/// Feeds the guarded store's calls into the metrics.
struct StoreMetrics(Metrics);

impl StoreObserver for StoreMetrics {
    fn call(&self, elapsed: Duration, error: Option<&StoreError>) {
        self.0.store_call(elapsed);
        if let Some(e) = error {
            self.0.store_error(e.kind());
        }
    }

    fn deny_cache_hit(&self) {
        self.0.deny_cache_hit();
    }

    fn leased(&self) {
        self.0.store_leased();
    }

    fn skipped(&self) {
        self.0.store_error(StoreError::CircuitOpen.kind());
    }
}

/// The store the config asks for: memory, or Redis behind the failure policy, with a
/// connection for each of `workers` worker threads.
pub async fn build_store(
    config: &config::StoreConfig,
    workers: usize,
    metrics: &Metrics,
) -> anyhow::Result<Arc<dyn Store>> {
    let target = match &config.backend {
        Backend::Memory => return Ok(Arc::new(MemoryStore::new(config.max_keys))),
        Backend::Redis { url } => RedisTarget::Single(url.clone()),
        Backend::Cluster { urls } => RedisTarget::Cluster(urls.clone()),
        Backend::Sentinel(s) => RedisTarget::Sentinel(SentinelTarget {
            master_name: s.master_name.clone(),
            nodes: s.nodes.clone(),
            username: s.username.clone(),
            password: s.password.clone(),
            db: s.db,
        }),
    };
    let tls = match &config.tls {
        Some(tls) => client_tls(tls).context("redis store: store.tls")?,
        None => ClientTls::default(),
    };
    let redis = RedisStore::connect_with(&target, &tls, config.timeout, workers, Connection::Own)
        .context("redis store")?
        .with_leases(config.leases);
    // the error series of a shared store exist from the start, at zero
    for kind in StoreError::KINDS {
        metrics.store_error_known(kind);
    }
    if let Err(e) = redis.ping().await {
        tracing::warn!(error = %e, on_error = ?config.on_error,
            "redis cannot be used (see the error); limiting falls back to on_error until it can");
    }
    let guarded = GuardedStore::new(
        Arc::new(redis),
        config.on_error,
        config.instances,
        config.max_keys,
    )
    .with_observer(Arc::new(StoreMetrics(metrics.clone())));
    Ok(Arc::new(guarded))
}

/// How the connections to `u`'s targets are made. Its `tls` files are read now, so that a
/// reload reads them again.
fn dial(u: &config::UpstreamConfig, clients: &UpstreamClients) -> anyhow::Result<Arc<Dial>> {
    let h2 = H2Settings {
        keepalive_interval: u.http2.keepalive_interval,
        keepalive_timeout: u.http2.keepalive_timeout,
        max_connections: u.http2.max_connections.get(),
    };
    let Some(tls) = &u.tls else {
        if h2 == H2Settings::default() {
            return Ok(clients.default_dial(u.protocol));
        }
        // (a dial of its own: its connections start again on a reload)
        let tls = (*ClientTls::default().client_config()?).clone();
        return Ok(Arc::new(Dial::new(u.protocol, tls, None).with_http2(h2)));
    };
    let config = client_tls(tls)
        .and_then(|tls| Ok(tls.client_config()?))
        .with_context(|| format!("upstream {}: tls", u.name))?;
    let server_name = match &tls.server_name {
        Some(name) => Some(
            ServerName::try_from(name.clone())
                .with_context(|| format!("upstream {}: tls.server_name", u.name))?,
        ),
        None => None,
    };
    Ok(Arc::new(
        Dial::new(u.protocol, (*config).clone(), server_name).with_http2(h2),
    ))
}

/// The access log's settings for the proxy.
fn access_log(log: config::AccessLog) -> access::LogSettings {
    access::LogSettings {
        query: log.query,
        client: match log.client {
            config::LogClient::Address => access::ClientField::Address,
            config::LogClient::Hash => access::ClientField::Hash,
        },
    }
}

/// A `tls` section with its files' contents: as read when the config was loaded, or read now
/// when it was parsed without reading files.
fn client_tls(config: &config::ClientTls) -> anyhow::Result<ClientTls> {
    let pem = |file: &config::PemFile, what| match &file.contents {
        Some(bytes) => Ok(Pem {
            path: file.path.clone(),
            bytes: bytes.clone(),
        }),
        None => Pem::read(&file.path, what),
    };
    let identity = match &config.identity {
        Some((cert, key)) => Some((pem(cert, "certificate")?, pem(key, "private key")?)),
        None => None,
    };
    Ok(ClientTls {
        ca: config
            .ca
            .as_ref()
            .map(|ca| pem(ca, "root certificate"))
            .transpose()?,
        identity,
        server_name: config.server_name.clone(),
        verify: config.verify,
    })
}

/// The proxy for `config`, over an existing store and upstream clients (both survive reloads).
pub fn build_proxy(
    config: &Config,
    store: Arc<dyn Store>,
    clients: UpstreamClients,
    metrics: Metrics,
    tunnels: TaskTracker,
    refusals: Arc<Refusals>,
) -> anyhow::Result<Proxy> {
    let prefix = &config.store.key_prefix;
    let mut upstreams = HashMap::new();
    for u in &config.upstreams {
        let upstream = upstream(u, config, &clients, &metrics)?;
        upstreams.insert(u.name.clone(), Arc::new(upstream));
    }
    let mut routes = Vec::with_capacity(config.routes.len());
    for r in &config.routes {
        let route = route(r, &upstreams, &metrics)?;
        routes.push((r.matcher.clone(), route));
    }
    refusals.keep_only(|route, limit| {
        config
            .routes
            .iter()
            .any(|r| *r.name == *route && r.limits.iter().any(|l| *l.name == *limit))
    });
    let holders = Holders::new(store.clone(), metrics.clone());
    Ok(Proxy {
        metrics,
        tunnels,
        refusals,
        routes: RouteTable::new(routes),
        holders,
        store,
        clients,
        settings: Settings {
            trusted_proxies: config.trusted_proxies.clone(),
            headers: config.rate_limit_headers,
            key_prefix: prefix.clone(),
            upstream_response: config.timeouts.upstream_response,
            tunnel_idle: config.timeouts.idle,
            max_body_size: config.max_body_size,
            paths: config.paths,
            access_log: access_log(config.access_log),
            identity_headers: crate::proxy::IdentityHeaders {
                x_real_ip: config.forwarded_headers.x_real_ip,
                forwarded: config.forwarded_headers.forwarded,
            },
        },
    })
}

/// One upstream of `config`, its metric series known from the start.
fn upstream(
    u: &config::UpstreamConfig,
    config: &Config,
    clients: &UpstreamClients,
    metrics: &Metrics,
) -> anyhow::Result<Upstream> {
    let prefix = &config.store.key_prefix;
    let pacer = u.pace.map(|pace| {
        let key = format!("{prefix}:upstream:{}:pace", u.name);
        let pacer = Pacer::new(&u.name, pace, key, u.max_waiting.map(|n| n.get()));
        match u.adaptive {
            Some(a) => pacer.adaptive(crate::proxy::adapt::Adapter::new(
                a.aimd,
                a.target_latency,
                format!("{prefix}:upstream:{}:rate", u.name),
                config.store.instances,
            )),
            None => pacer,
        }
    });
    let upstream = Upstream {
        name: u.name.as_str().into(),
        targets: Targets::new(&u.targets, dial(u, clients)?),
        preserve_host: u.preserve_host,
        pacer,
        inflight: u.concurrency.map(|c| {
            let key = format!("{prefix}:upstream:{}:inflight", u.name);
            let max_waiting = u.max_waiting.map(|n| n.get());
            Inflight::new(&u.name, c.slots, key, c.max_delay, max_waiting)
        }),
        series: crate::metrics::UpstreamSeries::new(u.name.as_str().into()),
    };
    // its error series (and, if requests may wait for it, its delay histogram) exist from
    // the start, at zero, so `rate(...)` has one to read
    for kind in crate::proxy::ProxyError::UPSTREAM_KINDS {
        metrics.upstream_error_known(&upstream.name, kind);
    }
    if upstream.paced() {
        metrics.pacing_known(&upstream.name);
    }
    if let Some(pacer) = &upstream.pacer {
        // (an adaptive rate is set by the adapting task once it has read the fleet's)
        if pacer.adapt.is_none() {
            metrics.pace_rate(&upstream.name, pacer.pace.rate.per_sec());
        }
    }
    Ok(upstream)
}

/// One route of `config`, over the upstreams built for it.
fn route(
    r: &config::RouteConfig,
    upstreams: &HashMap<String, Arc<Upstream>>,
    metrics: &Metrics,
) -> anyhow::Result<Route> {
    let upstream = upstreams
        .get(&r.upstream)
        .with_context(|| format!("route {} names a missing upstream {}", r.name, r.upstream))?
        .clone();
    let name: Arc<str> = r.name.as_str().into();
    let limits = r.limits.iter().map(|l| {
        Limit::new(
            &name,
            l.name.as_str().into(),
            l.algorithm,
            l.key.clone(),
            l.mode == config::Mode::Shadow,
            l.exempt.clone(),
            l.overrides.iter().cloned().collect(),
        )
        .with_charge(l.charge.as_ref().map(|c| Charge {
            header: c.response_header.clone(),
            missing: c.missing,
        }))
        .with_duplicate_key(l.duplicate_key)
    });
    let strip = match (&r.matcher.path, r.strip_prefix) {
        (m @ PathMatch::Prefix(_), true) => Some(m.clone()),
        _ => None,
    };
    let limits: Vec<Limit> = limits.collect();
    // (a charged limit's unread counts exist from the start, at zero)
    for limit in limits.iter().filter(|l| l.charge.is_some()) {
        metrics.charge_known(&name, &limit.name);
    }
    let route = Route {
        series: RouteSeries::new(name.clone()),
        name,
        strip,
        case_sensitive: r.matcher.case_sensitive,
        upstream,
        limits,
    };
    Ok(route)
}

//! The operator API's calls, over the config, the proxy and the store in force, and the watch
//! that makes a reset made through any instance hold on this one. What is in force comes
//! through [`InForce`], which `app` implements: the console never names the server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use serde_json::json;

use super::fleet::{self, Member};
use super::{Console, Reloaded, StoreView, View};
use crate::admin::{self, ApiAnswer, ApiFuture, LimitCall};
use crate::config::{Backend, Config, StoreConfig};
use crate::identity;
use crate::proxy::Proxy;
use crate::store::Store;

/// What the operator API reads of the server: the config, store and proxy in force.
pub trait InForce: Send + Sync {
    /// The config in force and the store built from it, read together.
    fn in_force(&self) -> (Config, Arc<dyn Store>);
    /// The store in force, and the `store` section it was built from.
    fn store(&self) -> (StoreConfig, Arc<dyn Store>);
    /// The proxy in force.
    fn proxy(&self) -> Arc<Proxy>;
    /// What the last reload did, if one was made.
    fn reloaded(&self) -> Option<Reloaded>;
    /// Whether the server has begun to drain.
    fn draining(&self) -> bool;
}

/// How often an instance reads the fleet's counts of resets and lifted holds.
const WATCH_EVERY: Duration = Duration::from_millis(500);

/// The `/api/` calls.
pub struct ConsoleApi {
    shared: Arc<dyn InForce>,
    console: Console,
}

impl ConsoleApi {
    /// The API over what `shared` has in force, with `console`'s figures.
    pub fn new(shared: Arc<dyn InForce>, console: Console) -> ConsoleApi {
        ConsoleApi { shared, console }
    }
}

/// The counter that counts the console's resets of limits, and the one of lifted holds.
fn counters(prefix: &str) -> [String; 2] {
    [
        format!("{prefix}:console:resets"),
        format!("{prefix}:console:lifts"),
    ]
}

/// A limit's client named by `call`, found in `config`: its algorithm, its store key and its
/// written form.
fn find<'c>(
    config: &'c Config,
    call: &LimitCall<'_>,
) -> Result<(&'c crate::limit::Algorithm, String, String), ApiAnswer> {
    let route = config
        .routes
        .iter()
        .find(|r| r.name == call.route)
        .ok_or_else(|| {
            let message = format!("no route named {:?}", call.route);
            ApiAnswer::error(StatusCode::NOT_FOUND, "unknown_route", message)
        })?;
    let limit = route
        .limits
        .iter()
        .find(|l| l.name == call.limit)
        .ok_or_else(|| {
            let message = format!("route {:?} has no limit named {:?}", call.route, call.limit);
            ApiAnswer::error(StatusCode::NOT_FOUND, "unknown_limit", message)
        })?;
    let client = identity::named_client(&limit.key, call.key)
        .map_err(|why| ApiAnswer::error(StatusCode::BAD_REQUEST, "bad_key", why))?;
    // overrides name clients by their whole key; a digest matches the one it was made from
    let alg = limit
        .overrides
        .iter()
        .find(|(written, _)| identity::StoredClient::of(written.clone()) == client)
        .map_or(&limit.algorithm, |(_, alg)| alg);
    let mut key = String::new();
    identity::push_key_head(&mut key, &config.store.key_prefix, &route.name, &limit.name);
    key.push_str(&client.key);
    Ok((alg, key, client.shown().into_owned()))
}

fn store_failed(e: crate::store::StoreError) -> ApiAnswer {
    ApiAnswer::error(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        format!("the store did not answer: {e}"),
    )
}

/// This instance's `/api/stats` answer, from what `shared` has in force.
fn figures(shared: &dyn InForce, console: &Console) -> serde_json::Value {
    let (config, store) = shared.in_force();
    let proxy = shared.proxy();
    let reload = shared.reloaded();
    console.stats(&View {
        config: &config,
        proxy: &proxy,
        store: StoreView {
            backend: backend(&config.store),
            breaker: store.breaker(),
        },
        reload,
    })
}

fn backend(store: &StoreConfig) -> &'static str {
    match &store.backend {
        Backend::Memory => "memory",
        Backend::Redis { .. } => "redis",
        Backend::Cluster { .. } => "cluster",
        Backend::Sentinel(_) => "sentinel",
    }
}

impl admin::Api for ConsoleApi {
    fn stats(&self) -> serde_json::Value {
        figures(&*self.shared, &self.console)
    }

    fn fleet(&self) -> ApiFuture<'_> {
        Box::pin(async move {
            let (store_config, store) = self.shared.store();
            let this = figures(&*self.shared, &self.console);
            let found = match store.fleet(&fleet::key(&store_config.key_prefix)).await {
                Ok(found) => found,
                Err(e) => return store_failed(e),
            };
            let me = &self.console.instance().id;
            let mut seen = found.now_ms;
            let mut members = Vec::with_capacity(found.instances.len() + 1);
            for p in found.instances {
                if p.id == *me {
                    seen = p.seen_ms;
                    continue;
                }
                match serde_json::from_slice(&p.blob) {
                    Ok(figures) => members.push(Member {
                        id: p.id,
                        seen_ms: p.seen_ms,
                        figures,
                    }),
                    Err(e) => {
                        tracing::debug!(id = p.id, error = %e, "console: an instance's figures do not read as JSON")
                    }
                }
            }
            // this instance's own figures are the freshest, published or not
            members.push(Member {
                id: me.clone(),
                seen_ms: seen,
                figures: this.clone(),
            });
            let mut answer = fleet::summed(&this, &members);
            if store_config.backend == Backend::Memory {
                answer["note"] = json!(
                    "the memory store is this instance's own: the fleet is this instance alone"
                );
            }
            ApiAnswer::ok(answer)
        })
    }

    fn limit<'a>(&'a self, call: LimitCall<'a>) -> ApiFuture<'a> {
        Box::pin(async move {
            let (config, store) = self.shared.in_force();
            let (alg, key, client) = match find(&config, &call) {
                Ok(found) => found,
                Err(answer) => return answer,
            };
            let deny_cached = store.cached_denial(&key, alg).is_some();
            match store.peek(&key, alg).await {
                Ok(d) => ApiAnswer::ok(json!({
                    "route": call.route,
                    "limit": call.limit,
                    "key": call.key,
                    "client": client,
                    "algorithm": alg.name(),
                    "allowed_now": d.allowed,
                    "remaining": d.remaining,
                    "retry_after_ms": d.retry_after_ms,
                    "full_in_ms": d.reset_ms,
                    "deny_cached_here": deny_cached,
                })),
                Err(e) => store_failed(e),
            }
        })
    }

    fn reset<'a>(&'a self, call: LimitCall<'a>, peer: SocketAddr) -> ApiFuture<'a> {
        Box::pin(async move {
            let (config, store) = self.shared.in_force();
            let (_, key, client) = match find(&config, &call) {
                Ok(found) => found,
                Err(answer) => return answer,
            };
            let held = match store.forget(&key).await {
                Ok(held) => held,
                Err(e) => return store_failed(e),
            };
            let [resets, _] = counters(&config.store.key_prefix);
            // the other instances forget their refusals when they see the count move
            if let Err(e) = store.resets(&resets, true).await {
                tracing::warn!(error = %e, "console: the other instances were not told of a reset");
            }
            tracing::info!(target: "tollgate::console", %peer, route = call.route,
                limit = call.limit, client, held, "limit state reset");
            ApiAnswer::ok(json!({
                "reset": true,
                "route": call.route,
                "limit": call.limit,
                "key": call.key,
                "client": client,
                "held_state": held,
            }))
        })
    }

    fn lift_hold<'a>(&'a self, upstream: &'a str, peer: SocketAddr) -> ApiFuture<'a> {
        Box::pin(async move {
            let proxy = self.shared.proxy();
            let store = self.shared.store().1;
            let Some(pacer) = proxy.upstream(upstream).and_then(|u| u.pacer.as_ref()) else {
                let message = format!("no paced upstream named {upstream:?} is in use");
                return ApiAnswer::error(StatusCode::NOT_FOUND, "unknown_upstream", message);
            };
            pacer.lift_hold();
            // the shared schedule, which the hold pushed, starts again from now
            let held = match store.forget(&pacer.key).await {
                Ok(held) => held,
                Err(e) => return store_failed(e),
            };
            let [_, lifts] = counters(&proxy.settings.key_prefix);
            if let Err(e) = store.resets(&lifts, true).await {
                tracing::warn!(error = %e, "console: the other instances were not told of a lifted hold");
            }
            tracing::info!(target: "tollgate::console", %peer, upstream, held, "upstream hold lifted");
            ApiAnswer::ok(json!({"lifted": true, "upstream": upstream}))
        })
    }
}

/// Where the fleet's counts of resets and lifted holds stand, as far as the store answers.
pub async fn read_counts(shared: &dyn InForce) -> [Option<u64>; 2] {
    let (store_config, store) = shared.store();
    let mut counts = [None, None];
    for (count, counter) in counts.iter_mut().zip(counters(&store_config.key_prefix)) {
        *count = store.resets(&counter, false).await.ok();
    }
    counts
}

/// Reads the fleet's counts of resets and lifted holds twice a second while the server runs,
/// from `seen`, where they stood when it started serving: when one moves, this instance forgets
/// the refusals and leases it keeps, or lifts the holds of its upstreams. A count not read yet
/// (the store was out) is taken as it is when first read.
pub async fn watch_resets(shared: Arc<dyn InForce>, mut seen: [Option<u64>; 2]) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        if shared.draining() {
            return;
        }
        let counts = read_counts(&*shared).await;
        for (i, count) in counts.into_iter().enumerate() {
            let Some(count) = count else {
                continue;
            };
            let moved = seen[i].is_some_and(|before| before != count);
            seen[i] = Some(count);
            if !moved {
                continue;
            }
            if i == 0 {
                shared.store().1.forget_local();
                tracing::debug!("console: a reset was made; refusals remembered here forgotten");
            } else {
                let proxy = shared.proxy();
                for (_, route) in proxy.routes.routes() {
                    if let Some(pacer) = &route.upstream.pacer {
                        pacer.lift_hold();
                    }
                }
                tracing::debug!("console: a hold was lifted; this instance's holds lifted");
            }
        }
    }
}

/// How often an instance publishes its figures to the fleet.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// Publishes this instance's figures to the fleet once a second while the server runs, from
/// the console's samples (asking for them keeps the sampling going). A publication that fails
/// is logged at debug and tried again the next second; no request waits for one.
pub async fn publish_figures(shared: Arc<dyn InForce>, console: Console) {
    let mut every = tokio::time::interval(PUBLISH_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if shared.draining() {
            return;
        }
        let Some(blob) = fleet::blob(figures(&*shared, &console)) else {
            tracing::debug!("console: figures not published: over the fleet's bound even without the refused clients");
            continue;
        };
        let (store_config, store) = shared.store();
        let key = fleet::key(&store_config.key_prefix);
        match store.publish(&key, &console.instance().id, &blob).await {
            Ok(0) => tracing::debug!(
                "console: not kept in the fleet: it holds {} instances already",
                crate::store::FLEET_MAX_INSTANCES
            ),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "console: figures not published to the fleet"),
        }
    }
}

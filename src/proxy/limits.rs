//! The limit phase: each of the route's limits in order. The first enforced denial answers 429;
//! shadow denials are counted and logged only; leaky-bucket limits sleep their delay. The most
//! restrictive admitted limit's figures go on the response as rate-limit headers.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response};
use ipnet::IpNet;

use super::respond::{self, Shown};
use super::{Body, Outcome, Proxy, ProxyError, Route};
use crate::identity::{self, KeyContext, KeyPart};
use crate::limit::{Algorithm, Decision};
use crate::metrics::{Decision as Counted, DecisionSeries};

/// One limit of a route, ready to check.
pub struct Limit {
    /// its name (keys, headers, metrics)
    pub name: Arc<str>,
    /// the algorithm and its parameters
    pub alg: Algorithm,
    /// what identifies a client
    pub key: Vec<KeyPart>,
    /// count and log denials, never deny
    pub shadow: bool,
    /// clients this limit never applies to
    pub exempt: Vec<IpNet>,
    /// other parameters for particular client-key values
    pub overrides: HashMap<String, Algorithm>,
    /// its `RateLimit-Policy` value with `alg`, made once (overrides make theirs per response)
    policy: HeaderValue,
    /// its decision metrics, found once
    series: DecisionSeries,
}

impl Limit {
    /// A limit of route `route`; `shadow` ones count and log their denials only.
    pub fn new(
        route: &Arc<str>,
        name: Arc<str>,
        alg: Algorithm,
        key: Vec<KeyPart>,
        shadow: bool,
        exempt: Vec<IpNet>,
        overrides: HashMap<String, Algorithm>,
    ) -> Limit {
        let (quota, window_secs) = figures(&alg);
        let policy = respond::lasting_policy_value(&name, quota, window_secs);
        let series = DecisionSeries::new(route.clone(), name.clone());
        Limit {
            series,
            name,
            alg,
            key,
            shadow,
            exempt,
            overrides,
            policy,
        }
    }

    /// What a response shows of this limit's `decision` under `alg` (its own parameters or an
    /// override's), borrowed from the limit: nothing shared is written per request.
    fn shown<'a>(&'a self, alg: &'a Algorithm, decision: Decision) -> Shown<'a> {
        let (quota, window_secs) = figures(alg);
        // the limit's own parameters (not an override's): its policy value is made already
        let policy = std::ptr::eq(alg, &self.alg).then_some(&self.policy);
        Shown {
            name: &self.name,
            quota,
            window_secs,
            policy,
            decision,
        }
    }
}

/// The quota and window (whole seconds, at least 1) the policy header states for `alg`.
fn figures(alg: &Algorithm) -> (u64, u64) {
    let (quota, window) = alg.policy();
    (quota, window.ceil().max(1.0) as u64)
}

/// The limit phase's outcome.
pub(super) enum Checked<'r> {
    /// a limit denied: send this 429
    Denied(Response<Body>),
    /// go on; the most restrictive limit's figures (none when the route has no limits)
    Admitted(Option<Shown<'r>>),
}

/// Runs the route's limits for a request from `ip`.
pub(super) async fn check<'r, B>(
    proxy: &Proxy,
    route: &'r Route,
    req: &Request<B>,
    ip: IpAddr,
    path: &str,
    outcome: &mut Outcome<'_>,
) -> Result<Checked<'r>, ProxyError> {
    let ctx = KeyContext {
        ip,
        headers: req.headers(),
        query: req.uri().query(),
        host: super::request_host(req),
        path,
        route: &route.name,
    };
    // the store key, its client part written in place (one buffer for all the limits)
    let mut key = String::with_capacity(96);
    let mut tightest: Option<Shown<'r>> = None;
    for limit in &route.limits {
        if identity::is_trusted(ip, &limit.exempt) {
            continue;
        }
        key.clear();
        identity::push_key_head(
            &mut key,
            &proxy.settings.key_prefix,
            &route.name,
            &limit.name,
        );
        let start = key.len();
        identity::client_key(&limit.key, &ctx, &mut key);
        let alg = limit.overrides.get(&key[start..]).unwrap_or(&limit.alg);
        identity::shorten_client(&mut key, start);
        let decision = proxy
            .store
            .check(&key, alg, None)
            .await
            .map_err(ProxyError::StoreUnavailable)?;
        let counted = match (decision.allowed, limit.shadow) {
            (true, _) => Counted::Allowed,
            (false, true) => Counted::ShadowDenied,
            (false, false) => Counted::Denied,
        };
        proxy.metrics.limit_decided(&limit.series, counted);
        if outcome.decision != Some("denied") {
            outcome.decision = Some(counted.as_str());
        }
        if !decision.allowed {
            if !limit.shadow {
                return Ok(Checked::Denied(respond::rate_limited(
                    proxy.settings.headers,
                    &limit.shown(alg, decision),
                )));
            }
            // a shadow denial admits the request, and its figures are shown like any other
            // limit's (what the refusal reported): the headers do not vanish when it is reached
            tracing::info!(route = %route.name, limit = %limit.name, "shadow limit would deny");
        } else if decision.delay_us > 0 {
            let delay = Duration::from_micros(decision.delay_us);
            tokio::time::sleep(delay).await;
            // logged with the upstream's pacing: the time the request was held back
            outcome.pacing_delay += delay;
        }
        if tightest
            .as_ref()
            .is_none_or(|t| decision.remaining < t.decision.remaining)
        {
            tightest = Some(limit.shown(alg, decision));
        }
    }
    Ok(Checked::Admitted(tightest))
}

//! The limit phase: each of the route's limits in order. The first enforced denial answers 429;
//! shadow denials are counted and logged only; leaky-bucket limits sleep their delay. Every
//! enforced limit's figures go on the response as rate-limit headers, in the route's order, and
//! the legacy headers state the most restrictive one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderValue, Response};
use ipnet::IpNet;

use super::owed::{Owed, Taken};
use super::respond::{self, Showing, Shown};
use super::slots::{Held, Holders};
use super::{Body, HeaderStyle, ProxyError, Route};
use crate::identity::{self, DuplicateKey, KeyContext, KeyPart};
use crate::limit::{Algorithm, Decision};
use crate::metrics::{Decision as Counted, DecisionSeries, Metrics};
use crate::store::Store;

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
    /// with `charge`: what is charged after the response ([`super::charge`])
    pub charge: Option<Charge>,
    /// what a request whose key header or parameter comes twice gets (`duplicate_key`)
    pub duplicate_key: DuplicateKey,
}

/// A limit's `charge`: where the response reports what it used, and what a response that never
/// does is charged.
#[derive(Debug, Clone)]
pub struct Charge {
    /// the response header (or trailer) whose number is charged
    pub header: http::HeaderName,
    /// charged when no usable number arrives; `None`: the request's cost (nothing more)
    pub missing: Option<std::num::NonZeroU32>,
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
            charge: None,
            duplicate_key: DuplicateKey::Reject,
        }
    }

    /// This limit, charging what the response reports after the response (`charge`).
    pub fn with_charge(self, charge: Option<Charge>) -> Limit {
        Limit { charge, ..self }
    }

    /// This limit, doing `rule` with a request whose key header or parameter comes twice.
    pub fn with_duplicate_key(self, rule: DuplicateKey) -> Limit {
        Limit {
            duplicate_key: rule,
            ..self
        }
    }

    /// What a response shows of this limit's `decision` under `alg` (its own parameters or an
    /// override's), borrowed from the limit: nothing shared is written per request.
    fn shown<'a>(&'a self, alg: &'a Algorithm, mut decision: Decision) -> Shown<'a> {
        // the headers count requests: a bucket's tokens left, over what one request costs
        decision.remaining /= cost(alg);
        // (decided for this instance's share of the limit, by the `local` fallback: the policy
        // stated is that share, the one enforced)
        let (quota, window_secs) = match decision.share {
            None => figures(alg),
            Some(n) => figures(&alg.share(n)),
        };
        // the limit's own parameters (not an override's): its policy value is made already
        let policy =
            (decision.share.is_none() && std::ptr::eq(alg, &self.alg)).then_some(&self.policy);
        Shown {
            name: &self.name,
            quota,
            window_secs,
            policy,
            decision,
        }
    }
}

/// The quota (in requests) and window (whole seconds, at least 1) the policy header states for
/// `alg`; concurrency has no window (0: none is stated).
fn figures(alg: &Algorithm) -> (u64, u64) {
    let (quota, window) = alg.policy();
    if let Algorithm::Concurrency(_) = alg {
        return (quota, 0);
    }
    (quota / cost(alg), window.ceil().max(1.0) as u64)
}

/// The tokens one request takes of `alg`'s quota: a token bucket's `cost`, else 1.
pub(super) fn cost(alg: &Algorithm) -> u64 {
    match alg {
        Algorithm::TokenBucket(b) => u64::from(b.cost.get()),
        _ => 1,
    }
}

/// What the limit phase uses of the proxy, borrowed for one request.
pub(super) struct Limiter<'a> {
    pub(super) store: &'a Arc<dyn Store>,
    pub(super) metrics: &'a Metrics,
    /// the concurrency slots the instance holds
    pub(super) holders: &'a Arc<Holders>,
    /// the first part of every store key
    pub(super) key_prefix: &'a str,
    /// which rate-limit headers a 429 carries
    pub(super) headers: HeaderStyle,
    /// the clients each limit refused most, for the console
    pub(super) refusals: &'a crate::refusals::Refusals,
}

/// What the limit phase found, for the metrics and the access log. It lives in the request's
/// record, so that a request dropped while a limit holds it back is logged with it too.
#[derive(Default)]
pub(super) struct Verdict<'r> {
    /// the strongest decision: allowed, delayed, denied or shadow_denied; none when no limit
    /// ran
    pub(super) decision: Option<Counted>,
    /// the limit that refused the request, would have (shadow), or made it wait
    pub(super) limit: Option<&'r Arc<str>>,
    /// when a `leaky_bucket` limit began to hold the request back, while it does
    pub(super) held_since: Option<Instant>,
    /// how long the limits held it back
    pub(super) held: Duration,
}

impl Verdict<'_> {
    /// Ends a hold still under way: the client left during it, so it counts up to now.
    pub(super) fn left(&mut self) {
        if let Some(since) = self.held_since.take() {
            self.held += since.elapsed();
        }
    }
}

/// The limit phase's outcome.
pub(super) enum Checked<'r> {
    /// a limit denied: send this 429
    Denied(Response<Body>),
    /// go on; the limits' figures for the headers (none when no limit applied), and for a
    /// paced upstream, what the limits took: given back if the request is dropped or refused
    /// while it waits for its slot (see [`Owed`]); the concurrency slots it holds until its
    /// response is finished
    Admitted(Option<Showing<'r>>, Option<Owed>, Held),
}

/// Writes the store key of `limit` for the request into `key`; the algorithm that applies to
/// it (the limit's own, or an override's for the client key).
pub(super) fn limit_key<'r>(
    key_prefix: &str,
    route: &Route,
    limit: &'r Limit,
    ctx: &KeyContext<'_>,
    key: &mut String,
) -> &'r Algorithm {
    key.clear();
    identity::push_key_head(key, key_prefix, &route.name, &limit.name);
    let start = key.len();
    identity::client_key(&limit.key, limit.duplicate_key, ctx, key);
    let alg = limit.overrides.get(&key[start..]).unwrap_or(&limit.alg);
    identity::shorten_client(key, start);
    alg
}

/// Runs the route's limits for a request from `ip`.
///
/// Every limit is asked before the request waits or is refused. A refusal answers at once: a
/// leaky bucket earlier in the list does not first make it wait. What the limits before the
/// refusing one took is given back, so a refused request costs no limit anything, as nginx
/// charges its `limit_req` zones only when all pass ([`refuse`]). A route with several limits
/// first looks for refusals the instance remembers, the deny cache: such a request is refused
/// without asking any store. Leaky-bucket delays are slept together, the longest, once all
/// limits have admitted ([`wait`]); a shadow limit's delay is not slept.
pub(super) async fn check<'r>(
    lim: &Limiter<'_>,
    route: &'r Route,
    ctx: &KeyContext<'_>,
    verdict: &mut Verdict<'r>,
) -> Result<Checked<'r>, ProxyError> {
    refuse_repeated_key(route, ctx, verdict)?;
    // the store key, its client part written in place (one buffer for all the limits)
    let mut key = String::with_capacity(96);
    let several = route.limits.len() > 1;
    let paced = route.upstream.paced();
    if several {
        if let Some((limit, denied)) = remembered_denial(lim, route, ctx, &mut key) {
            verdict.decision = Some(Counted::Denied);
            verdict.limit = Some(&limit.name);
            return Ok(Checked::Denied(denied));
        }
    }
    let mut admitted = Admitted::default();
    for (ix, limit) in route.limits.iter().enumerate() {
        if identity::is_trusted(ctx.ip, &limit.exempt) {
            continue;
        }
        let alg = limit_key(lim.key_prefix, route, limit, ctx, &mut key);
        let decided = match alg {
            Algorithm::Concurrency(slots) => {
                lim.holders.acquire(&key, slots, &mut admitted.held).await
            }
            _ => lim.store.check(&key, alg, None).await,
        };
        let decision = match decided {
            Ok(decision) => decision,
            // a shadow limit never refuses a request, also when its store cannot answer
            Err(e) if limit.shadow => {
                tracing::debug!(route = %route.name, limit = %limit.name, error = %e, "shadow limit not decided");
                continue;
            }
            Err(e) => {
                admitted.held.release().await;
                give_back(lim, route, ctx, &admitted.taken).await;
                return Err(ProxyError::StoreUnavailable(e));
            }
        };
        count(lim, limit, &decision, verdict);
        match (decision.allowed, limit.shadow) {
            (false, false) => {
                noted_refusal(lim, route, limit, ctx, &key);
                let first = limit.shown(alg, decision);
                let denied = refuse(lim, route, ctx, ix, first, &mut key, admitted);
                return Ok(Checked::Denied(denied.await));
            }
            // a shadow denial admits the request, and its figures are shown like any other
            // limit's: the headers do not vanish when it is reached
            (false, true) => {
                tracing::info!(route = %route.name, limit = %limit.name, "shadow limit would deny")
            }
            (true, shadow) => {
                // kept to be given back if a later limit refuses the request, or it waits and
                // its client goes away (a concurrency slot is released instead)
                let slot = matches!(alg, Algorithm::Concurrency(_));
                if (several || decision.delay_us > 0 || paced) && !slot {
                    admitted.taken.push((ix, Instant::now(), decision));
                }
                if !shadow && decision.delay_us > admitted.delay_us {
                    admitted.delay_us = decision.delay_us;
                    admitted.delaying = Some(&limit.name);
                }
            }
        }
        admitted.show(limit.shadow, limit.shown(alg, decision));
    }
    let owed = wait(lim, route, ctx, &admitted, verdict).await;
    let shown = admitted.shown.or(admitted.shadow);
    Ok(Checked::Admitted(shown, owed, admitted.held))
}

/// Refuses with 400 a request that sends the header or query parameter of an enforced limit's
/// key more than once, when the limit's `duplicate_key` is `reject`: the upstream may read
/// another value than the one counted. Checked before any limit, so the refusal takes nothing
/// from any of them. A shadow limit never refuses: it logs, and counts the first value.
fn refuse_repeated_key<'r>(
    route: &'r Route,
    ctx: &KeyContext<'_>,
    verdict: &mut Verdict<'r>,
) -> Result<(), ProxyError> {
    let rejecting = route
        .limits
        .iter()
        .filter(|l| l.duplicate_key == DuplicateKey::Reject);
    for limit in rejecting {
        // (the exemption only once a part repeats: most requests repeat nothing)
        let Some(part) = identity::repeated_part(&limit.key, ctx)
            .filter(|_| !identity::is_trusted(ctx.ip, &limit.exempt))
        else {
            continue;
        };
        if limit.shadow {
            tracing::info!(route = %route.name, limit = %limit.name, key = %part, "shadow limit would refuse: key sent more than once");
            continue;
        }
        verdict.limit = Some(&limit.name);
        return Err(ProxyError::DuplicateKey {
            limit: limit.name.to_string(),
            part: part.to_string(),
        });
    }
    Ok(())
}

/// What the limits that admitted a request add up to, limit after limit.
#[derive(Default)]
struct Admitted<'r> {
    /// every enforced limit's figures, in order, for the headers
    shown: Option<Showing<'r>>,
    /// the tightest shadow limit's figures: shown only when no enforced limit applied, so that
    /// the headers do not vanish when a trial limit is the route's only one
    shadow: Option<Showing<'r>>,
    /// the longest delay of the enforced leaky-bucket limits, in µs
    delay_us: u64,
    /// the limit of that delay
    delaying: Option<&'r Arc<str>>,
    /// the checks to give back if the request is not sent: the limit's index, when it
    /// admitted the request, its decision
    taken: Vec<(usize, Instant, Decision)>,
    /// the concurrency slots taken
    held: Held,
}

impl<'r> Admitted<'r> {
    /// Offers a limit's figures to the headers. The IETF headers list every enforced limit;
    /// the legacy headers state the tightest. A shadow limit shows only when no enforced one
    /// applies: a trial must not make clients that follow the headers slow down.
    fn show(&mut self, shadow: bool, offered: Shown<'r>) {
        if shadow {
            if self
                .shadow
                .as_ref()
                .is_none_or(|t| tighter(&offered, t.legacy()))
            {
                self.shadow = Some(Showing::one(offered));
            }
            return;
        }
        match &mut self.shown {
            None => self.shown = Some(Showing::one(offered)),
            Some(shown) => {
                let tightest = tighter(&offered, shown.legacy());
                let ix = shown.push(offered);
                if tightest {
                    shown.state_in_legacy(ix);
                }
            }
        }
    }
}

/// Whether `a` is more restrictive than `b`: fewer requests left, or, of two with as many left,
/// the one that takes longer to come back.
fn tighter(a: &Shown<'_>, b: &Shown<'_>) -> bool {
    let (a, b) = (&a.decision, &b.decision);
    (a.remaining, std::cmp::Reverse(a.reset_ms)) < (b.remaining, std::cmp::Reverse(b.reset_ms))
}

/// Counts a limit's decision in the metrics and in the request's verdict, which keeps the
/// strongest, an enforced denial over a shadow one over a wait over an admission, and
/// the limit that gave it.
fn count<'r>(lim: &Limiter<'_>, limit: &'r Limit, decision: &Decision, verdict: &mut Verdict<'r>) {
    let counted = match (decision.allowed, limit.shadow) {
        // (a shadow limit's wait is not slept)
        (true, false) if decision.delay_us > 0 => Counted::Delayed,
        (true, _) => Counted::Allowed,
        (false, true) => Counted::ShadowDenied,
        (false, false) => Counted::Denied,
    };
    lim.metrics.limit_decided(&limit.series, counted);
    let strength = |d: Counted| match d {
        Counted::Allowed => 0,
        Counted::Delayed => 1,
        Counted::ShadowDenied => 2,
        Counted::Denied => 3,
    };
    if verdict
        .decision
        .is_none_or(|was| strength(counted) > strength(was))
    {
        verdict.decision = Some(counted);
        if counted != Counted::Allowed {
            verdict.limit = Some(&limit.name);
        }
    }
}

/// The 429 of a request that the enforced limit at `ix` refused, its figures `first`, after
/// the limits before it `admitted` the request.
///
/// The enforced limits after it are asked too, and what they take is given back at once, with
/// what the limits before it took (`taken`). The request's true wait is the longest of the
/// refusals: a client told the first one's short wait would only be refused again by a later
/// one. So `Retry-After` and the legacy headers state the refusal that waits longest; the IETF
/// headers list every enforced limit, in order.
async fn refuse<'r>(
    lim: &Limiter<'_>,
    route: &'r Route,
    ctx: &KeyContext<'_>,
    ix: usize,
    first: Shown<'r>,
    key: &mut String,
    admitted: Admitted<'r>,
) -> Response<Body> {
    // the limits before it, then its refusal, which the legacy headers state
    let mut shown = match admitted.shown {
        Some(mut shown) => {
            let at = shown.push(first);
            shown.state_in_legacy(at);
            shown
        }
        None => Showing::one(first),
    };
    admitted.held.release().await;
    let mut taken = admitted.taken;
    for (later_ix, later) in route.limits.iter().enumerate().skip(ix + 1) {
        if later.shadow || identity::is_trusted(ctx.ip, &later.exempt) {
            continue;
        }
        let later_alg = limit_key(lim.key_prefix, route, later, ctx, key);
        // (a concurrency limit's check only looks: it takes no slot)
        match lim.store.check(key, later_alg, None).await {
            Ok(d) if d.allowed => {
                if !matches!(later_alg, Algorithm::Concurrency(_)) {
                    taken.push((later_ix, Instant::now(), d));
                }
                shown.push(later.shown(later_alg, d));
            }
            Ok(d) => {
                let longer = d.retry_after_ms > shown.legacy().decision.retry_after_ms;
                let at = shown.push(later.shown(later_alg, d));
                if longer {
                    shown.state_in_legacy(at);
                }
            }
            // no answer: this limit did not apply
            Err(_) => {}
        }
    }
    give_back(lim, route, ctx, &taken).await;
    let name = &route.limits[ix].name;
    respond::rate_limited(lim.headers, name, &shown)
}

/// Sleeps the longest delay of the enforced leaky-bucket limits. Returns what the limits took
/// when the request has its upstream's pacing still to wait for: given back if it is dropped
/// or refused there (see [`Owed`]).
async fn wait<'r>(
    lim: &Limiter<'_>,
    route: &Route,
    ctx: &KeyContext<'_>,
    admitted: &Admitted<'r>,
    verdict: &mut Verdict<'r>,
) -> Option<Owed> {
    let paced = route.upstream.paced();
    let (delay_us, taken) = (admitted.delay_us, &admitted.taken);
    // what the limits took is given back if the client goes away before the waits are over
    let owed = (delay_us > 0 || (paced && !taken.is_empty()))
        .then(|| Owed::new(lim.store.clone(), owed(lim, route, ctx, taken)));
    if delay_us > 0 {
        let delay = Duration::from_micros(delay_us);
        // logged with the upstream's pacing: the time the request was held back, and by
        // which limit unless a shadow one would have refused it; a client that leaves during
        // the sleep is logged with the time it waited (see `Record::done`)
        verdict.limit = verdict.limit.or(admitted.delaying);
        verdict.held_since = Some(Instant::now());
        tokio::time::sleep(delay).await;
        verdict.held_since = None;
        verdict.held += delay;
    }
    match owed {
        Some(owed) if !paced => {
            owed.paid();
            None
        }
        owed => owed,
    }
}

/// The 429 of a refusal the instance remembers among the route's enforced limits for this
/// request, if there is one (no store is asked): the first such limit answers, with the
/// longest of the remembered waits. The headers list the remembered refusals.
fn remembered_denial<'r>(
    lim: &Limiter<'_>,
    route: &'r Route,
    ctx: &KeyContext<'_>,
    key: &mut String,
) -> Option<(&'r Limit, Response<Body>)> {
    let mut found: Option<(&Limit, Showing<'r>)> = None;
    for limit in &route.limits {
        if limit.shadow || identity::is_trusted(ctx.ip, &limit.exempt) {
            continue;
        }
        let alg = limit_key(lim.key_prefix, route, limit, ctx, key);
        if let Some(d) = lim.store.cached_denial(key, alg) {
            match &mut found {
                None => {
                    noted_refusal(lim, route, limit, ctx, key);
                    found = Some((limit, Showing::one(limit.shown(alg, d))));
                }
                Some((_, shown)) => {
                    let longer = d.retry_after_ms > shown.legacy().decision.retry_after_ms;
                    let at = shown.push(limit.shown(alg, d));
                    if longer {
                        shown.state_in_legacy(at);
                    }
                }
            }
        }
    }
    let (first, shown) = found?;
    lim.metrics.limit_decided(&first.series, Counted::Denied);
    let denied = respond::rate_limited(lim.headers, &first.name, &shown);
    Some((first, denied))
}

/// Counts a refusal by `limit` of the client whose store key is `key`, for the console's
/// clients refused most, in the written form its reset takes.
fn noted_refusal(lim: &Limiter<'_>, route: &Route, limit: &Limit, ctx: &KeyContext<'_>, key: &str) {
    let head = identity::key_head_len(lim.key_prefix, &route.name, &limit.name);
    let client = key.get(head..).unwrap_or_default();
    // 40 hex digits are a digest or a client's own value: the whole key tells (rarely built)
    let hashed = identity::may_be_digest(client) && {
        let mut whole = String::new();
        identity::client_key(&limit.key, limit.duplicate_key, ctx, &mut whole);
        whole.len() > identity::MAX_CLIENT_KEY_LEN
    };
    let shown = identity::shown_client(client, hashed);
    lim.refusals.add(&route.name, &limit.name, &shown);
}

/// What the limits in `taken` (index, when they admitted, what they answered) took, with their
/// keys.
fn owed(
    lim: &Limiter<'_>,
    route: &Route,
    ctx: &KeyContext<'_>,
    taken: &[(usize, Instant, Decision)],
) -> Vec<Taken> {
    let mut key = String::new();
    taken
        .iter()
        .map(|(ix, at, decision)| {
            let alg = *limit_key(lim.key_prefix, route, &route.limits[*ix], ctx, &mut key);
            Taken::new(key.clone(), alg, *at, decision)
        })
        .collect()
}

/// Gives back what the limits in `taken` took for a request that is not sent after all, before
/// it is answered (a client retrying at once finds it back). A store that cannot take it back
/// keeps it: the limit then counts one request too many, which errs on the safe side.
async fn give_back(
    lim: &Limiter<'_>,
    route: &Route,
    ctx: &KeyContext<'_>,
    taken: &[(usize, Instant, Decision)],
) {
    Owed::new(lim.store.clone(), owed(lim, route, ctx, taken))
        .give_back()
        .await;
}

//! Charging after the response: a limit with `charge` admitted its request for `cost`; the
//! upstream's response says what the request really used, in a header or, for a streamed
//! body, a trailer of the same name. The difference is charged to the limit's key in the
//! store, in a task of its own, so the response never waits for it.
//!
//! This module reads the number and starts the charge; the arithmetic is the store's
//! ([`crate::limit::charge`], `lua/charge.lua`). A response without a usable number charges
//! the limit's `charge.missing` (by default its `cost`: nothing more) and is counted in
//! `tollgate_charge_unread_total`. A client that leaves before the number arrives does not
//! take the charge with it: the rest of the response is read in the background ([`drain`]).

mod drain;

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Response};
use http_body_util::{BodyExt, Empty};
use hyper::body::Body as _;
use tokio_util::task::TaskTracker;

use super::limits::{cost, limit_key, Limiter};
use super::respond::Showing;
use super::{Body, BoxError, Route};
use crate::body::{Observed, Observer};
use crate::identity::{self, KeyContext};
use crate::limit::Algorithm;
use crate::metrics::Metrics;
use crate::store::Store;

/// The largest number a response may report: more is malformed. A billion units at any
/// sane rate is a debt of days; past it a value is more likely garbage than usage.
pub const MAX_REPORTED: u64 = 1_000_000_000;

/// The charges a request owes once its response says what it used: one per charged limit of
/// its route that applied to it.
pub(super) struct Charges {
    store: Arc<dyn Store>,
    metrics: Metrics,
    route: Arc<str>,
    owed: Vec<Owed>,
    /// where drains and charges run, so that shutdown waits for them (the proxy's tunnels)
    tasks: TaskTracker,
    /// the longest a drain reads (`timeouts.upstream_response`)
    drain_for: Duration,
}

/// One charged limit's part: where to charge, and which header says how much.
struct Owed {
    limit: Arc<str>,
    header: HeaderName,
    key: String,
    alg: Algorithm,
    /// what the check took already, in the limit's units
    cost: u64,
    /// what a response that reports no usable number is charged (`charge.missing`)
    missing: u64,
}

/// Why a response reported no usable number: the `reason` of `tollgate_charge_unread_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unread {
    Missing,
    Malformed,
    /// the client left, and the rest of the response outlasted the drain's bound
    DrainBound,
}

impl Unread {
    fn reason(self) -> &'static str {
        match self {
            Unread::Missing => "missing",
            Unread::Malformed => "malformed",
            Unread::DrainBound => "drain_bound",
        }
    }
}

impl Charges {
    /// What the request owes to the charged limits of `route`, keyed as its checks were;
    /// `None` when the route has none that apply (the usual case: no work at all). Charges
    /// and drains run on `tasks`; a drain reads for `drain_for` at most.
    pub(super) fn of(
        lim: &Limiter<'_>,
        route: &Route,
        ctx: &KeyContext<'_>,
        tasks: &TaskTracker,
        drain_for: Duration,
    ) -> Option<Charges> {
        if route.limits.iter().all(|l| l.charge.is_none()) {
            return None;
        }
        let mut owed = Vec::new();
        let mut key = String::new();
        for limit in &route.limits {
            let Some(charge) = &limit.charge else {
                continue;
            };
            if identity::is_trusted(ctx.ip, &limit.exempt) {
                continue;
            }
            let alg = *limit_key(lim.key_prefix, route, limit, ctx, &mut key);
            let cost = cost(&alg);
            owed.push(Owed {
                limit: limit.name.clone(),
                header: charge.header.clone(),
                key: key.clone(),
                alg,
                cost,
                missing: charge.missing.map_or(cost, |n| u64::from(n.get())),
            });
        }
        (!owed.is_empty()).then(|| Charges {
            store: lim.store.clone(),
            metrics: lim.metrics.clone(),
            route: route.name.clone(),
            owed,
            tasks: tasks.clone(),
            drain_for,
        })
    }

    /// Charges what the response head reports, and shows it in the rate-limit headers the
    /// response will carry (`shown`); what the head does not report is looked for in the
    /// body's trailers, so the body is wrapped to read them.
    pub(super) fn read(
        mut self,
        resp: Response<Body>,
        shown: Option<&mut Showing<'_>>,
    ) -> Response<Body> {
        self.settle(resp.headers(), false, shown);
        if self.owed.is_empty() {
            return resp;
        }
        resp.map(|inner| Observed::new(inner, Charged(Some(self))).boxed())
    }

    /// Charges each owed limit whose header `fields` hold; the others stay owed, unless these
    /// are the last fields the response will have (`last`): they are then missing, and charged
    /// `missing`.
    fn settle(&mut self, fields: &HeaderMap, last: bool, mut shown: Option<&mut Showing<'_>>) {
        let owed = std::mem::take(&mut self.owed);
        for owed in owed {
            match fields.get(&owed.header).map(reported) {
                Some(Ok(used)) => {
                    if let Some(shown) = shown.as_deref_mut() {
                        show(shown, &owed, used);
                    }
                    self.charge(owed, used)
                }
                Some(Err(unread)) => self.unread(owed, unread),
                None if last => self.unread(owed, Unread::Missing),
                None => self.owed.push(owed),
            }
        }
    }

    /// Charges `used - cost` to the owed limit, in a task of its own (none off a runtime: a
    /// worker that stopped).
    fn charge(&self, owed: Owed, used: u64) {
        // (both at most MAX_REPORTED or a u32 cost: no overflow)
        let amount = used as i64 - owed.cost as i64;
        if amount == 0 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.store.clone();
        // (tracked: a shutdown waits for a charge under way as for a request)
        self.tasks.spawn_on(
            async move {
                // the store's failure policy counts and logs a failure; a charge is not retried,
                // as one that timed out may have been made
                if let Err(e) = store.charge(&owed.key, &owed.alg, amount, None).await {
                    tracing::debug!(limit = %owed.limit, error = %e, "charge not made");
                }
            },
            &runtime,
        );
    }

    /// Every limit still owed learns nothing more: each is unread for `why`.
    fn give_up(mut self, why: Unread) {
        for owed in std::mem::take(&mut self.owed) {
            self.unread(owed, why);
        }
    }

    /// Counts the owed limit's response as unread, and charges it `missing`.
    fn unread(&self, owed: Owed, unread: Unread) {
        let (route, limit) = (&self.route, &owed.limit);
        let reason = unread.reason();
        tracing::debug!(%route, %limit, header = %owed.header, reason, missing = owed.missing, "no number reported");
        self.metrics.charge_unread(route, limit, reason);
        let missing = owed.missing;
        self.charge(owed, missing);
    }
}

/// The figures of the owed limit in `shown` after a charge into debt: the response that
/// reported it says that less is left, and that the quota is whole again later. (A give-back
/// is not shown: to state less than is left errs on the safe side.)
fn show(shown: &mut Showing<'_>, owed: &Owed, used: u64) {
    let Some(more) = used.checked_sub(owed.cost).filter(|n| *n > 0) else {
        return;
    };
    for s in shown.iter_mut().filter(|s| s.name == &*owed.limit) {
        let d = &mut s.decision;
        // (the headers count requests of `cost` tokens)
        d.remaining = d.remaining.saturating_sub(more.div_ceil(owed.cost));
        if let Algorithm::TokenBucket(b) = owed.alg {
            let later = (more as f64 * b.rate.interval_ms()).ceil() as u64;
            d.reset_ms = d.reset_ms.saturating_add(later);
        }
    }
}

/// The number a header or trailer reports: decimal digits only, at most [`MAX_REPORTED`].
fn reported(value: &HeaderValue) -> Result<u64, Unread> {
    let digits = value.as_bytes();
    // (ten digits hold MAX_REPORTED; more would overflow before the bound is checked)
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(Unread::Malformed);
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    if n > MAX_REPORTED {
        return Err(Unread::Malformed);
    }
    Ok(n)
}

/// Reads a response body's trailers, which may hold what the head did not, as they pass.
/// The charges are taken once settled: at the trailers, or at the end of the body.
struct Charged(Option<Charges>);

impl Charged {
    /// What is still owed was never reported: counted as missing.
    fn no_trailers(&mut self) {
        if let Some(mut charges) = self.0.take() {
            charges.settle(&HeaderMap::new(), true, None);
        }
    }
}

impl Observer<Body> for Charged {
    fn trailers(&mut self, trailers: &HeaderMap, _: &Body) {
        if let Some(mut charges) = self.0.take() {
            charges.settle(trailers, true, None);
        }
    }

    // a failed body: no trailers came
    fn error(&mut self, error: BoxError, _: &mut Body, _: &mut Context<'_>) -> Poll<BoxError> {
        self.no_trailers();
        Poll::Ready(error)
    }

    fn end(&mut self) {
        self.no_trailers();
    }

    /// A body dropped before its end (the client went away) never got to its trailers: the
    /// rest is read in the background, for them.
    fn dropped(&mut self, body: &mut Body) {
        if self.0.is_none() {
            return;
        }
        if body.is_end_stream() {
            return self.no_trailers();
        }
        let charges = self.0.take().expect("checked just above");
        // (an empty body boxes a zero-sized value: no allocation)
        let empty = Empty::new().map_err(|never| match never {}).boxed();
        drain::start(std::mem::replace(body, empty), charges);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whole numbers up to the bound are read; anything else is malformed.
    #[test]
    fn reads_whole_numbers_only() {
        let read = |s: &str| reported(&HeaderValue::from_str(s).unwrap());
        assert_eq!(read("0"), Ok(0));
        assert_eq!(read("50"), Ok(50));
        assert_eq!(read("1000000000"), Ok(MAX_REPORTED));
        for bad in [
            "",
            "-5",
            "+5",
            "1.5",
            "5 tokens",
            "1000000001",
            "99999999999",
            "0x10",
        ] {
            assert_eq!(read(bad), Err(Unread::Malformed), "{bad:?}");
        }
    }
}

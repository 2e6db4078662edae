//! Adaptive pacing, this instance's side: what the upstream answered in each period, reported
//! to the store, which keeps the fleet's one rate (`lua/adapt.lua`); and that rate, cached for
//! the pacer.
//!
//! Trouble is an answer of 429, 503 or 504, a failed connection, no answer in time (tollgate's
//! own 504), and with `target_latency` a response head slower than that. Any other answer is
//! healthy. An answer to a request whose slot was given at a higher rate than the one now in
//! force counts for nothing: the rate already fell for the trouble it was part of, and
//! counting it again would lower it twice for one episode.
//!
//! One task per process ([`tick`]) reports every adaptive upstream's period once it is over,
//! and reads back the rate in force. While the store does not answer, the instance is alone:
//! it paces at its share of the rate (1/`store.instances`, the share the store's `local`
//! fallback schedules) and moves that rate with the same AIMD on what it alone sees. Each
//! report carries the last rate this instance knew, so a rate lost with an emptied store
//! resumes from it. What was seen before the store came back, or before this process stood
//! still (a stop, a starved runtime), counts for nothing after it: those answers were timed
//! across the gap.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use http::StatusCode;

use super::{Body, Proxy, ProxyError};
use crate::limit::adapt::{adapt, Adapted};
use crate::limit::{Aimd, Rate, Report};
use crate::store::Store;

/// One upstream's adaptive rate, as this instance last read it, and what it saw since its last
/// report.
pub struct Adapter {
    aimd: Aimd,
    target_latency: Option<Duration>,
    /// `<key_prefix>:upstream:<name>:rate`
    key: String,
    /// the fleet's rate in force, per second, as `f64` bits: read by every paced request.
    /// While the store is away, this instance's estimate of it.
    rate: AtomicU64,
    /// `store.instances`: while the store is away this instance paces at `rate / instances`
    instances: NonZeroU32,
    /// the store did not answer the last report
    away: AtomicBool,
    /// the fleet's rate as last read from the store, as `f64` bits: caps what this instance
    /// hands back after an outage
    read: AtomicU64,
    /// µs after `base` until which this instance, back with the store, still paces at its
    /// share (0: not rejoining): see [`REJOIN`]
    rejoin_until_us: AtomicU64,
    /// the origin of `fresh_from_us`
    base: Instant,
    /// µs after `base` before which a sent request's answer counts for nothing
    fresh_from_us: AtomicU64,
    healthy: AtomicU32,
    trouble: AtomicU32,
    /// the task's bookkeeping: only the adapting task takes this lock
    periods: Mutex<Periods>,
}

/// When periods begin and end, and the rate kept alone while the store is away.
struct Periods {
    /// when the period being counted began; `None` before the first report, which is made
    /// at the first tick so that a new instance (or a reload) learns the fleet's rate at once
    since: Option<Instant>,
    /// when the task last looked: a longer gap than [`stall`] means the process stood still
    /// (or a store call took that long, which a stop in the middle of it looks like)
    looked: Option<Instant>,
    /// this instance's own AIMD state while the store is away, in ms after `base`
    alone: Option<Adapted>,
}

/// What one forwarded request met at the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Met {
    /// it answered, or could not be reached in a way that is the upstream's doing
    Trouble,
    /// it answered in time, without trouble
    Healthy,
    /// nothing that says how the upstream fares (the client's body failed, say)
    Nothing,
}

impl Adapter {
    /// The adaptive rate kept at `key`, starting at `aimd`'s start until the store is read;
    /// one of `instances` sharing it while the store is away.
    pub fn new(
        aimd: Aimd,
        target_latency: Option<Duration>,
        key: String,
        instances: NonZeroU32,
    ) -> Adapter {
        Adapter {
            aimd,
            target_latency,
            key,
            rate: AtomicU64::new(aimd.start().per_sec().to_bits()),
            instances,
            away: AtomicBool::new(false),
            read: AtomicU64::new(aimd.start().per_sec().to_bits()),
            rejoin_until_us: AtomicU64::new(0),
            base: Instant::now(),
            fresh_from_us: AtomicU64::new(0),
            healthy: AtomicU32::new(0),
            trouble: AtomicU32::new(0),
            periods: Mutex::new(Periods {
                since: None,
                looked: None,
                alone: None,
            }),
        }
    }

    /// The rate the pacer asks the store's schedule for: the fleet's rate in force, as this
    /// instance last read it (its own estimate while the store is away, of which the store's
    /// fallback takes this instance's share); while rejoining, this instance's share.
    pub fn rate(&self) -> Rate {
        let fleet = self.fleet();
        let rate = if self.rejoining() {
            fleet / f64::from(self.instances.get())
        } else {
            fleet
        };
        Rate::per_second(rate).unwrap_or(self.aimd.start())
    }

    /// The fleet's rate, as this instance last read or estimated it, per second.
    fn fleet(&self) -> f64 {
        f64::from_bits(self.rate.load(Ordering::Relaxed))
    }

    /// The rate this instance paces at, per second: the fleet's, or while the store is away
    /// (or it is rejoining) its share of it.
    pub fn paced_at(&self) -> f64 {
        if self.store_away() || self.rejoining() {
            self.fleet() / f64::from(self.instances.get())
        } else {
            self.fleet()
        }
    }

    /// Whether the store came back less than [`REJOIN`] ago.
    fn rejoining(&self) -> bool {
        self.rejoin_until_us.load(Ordering::Relaxed) != 0
    }

    /// Whether the store failed to answer the last report.
    pub fn store_away(&self) -> bool {
        self.away.load(Ordering::Relaxed)
    }

    /// The AIMD parameters.
    pub fn aimd(&self) -> &Aimd {
        &self.aimd
    }

    /// What the forward phase's `result` says of the upstream, `waited` after sending.
    pub fn met(&self, result: Result<&http::Response<Body>, &ProxyError>, waited: Duration) -> Met {
        match result {
            Ok(resp) if trouble_status(resp.status()) => Met::Trouble,
            Ok(_) if self.target_latency.is_some_and(|t| waited > t) => Met::Trouble,
            Ok(_) => Met::Healthy,
            Err(ProxyError::UpstreamConnect { .. } | ProxyError::UpstreamTimeout { .. }) => {
                Met::Trouble
            }
            Err(_) => Met::Nothing,
        }
    }

    /// Counts what a request sent at `sent`, whose slot was given at `sent_at` (per second,
    /// as [`Adapter::paced_at`] said), met.
    pub fn observe(&self, sent_at: f64, sent: Instant, met: Met) {
        let sent_us = sent.saturating_duration_since(self.base).as_micros() as u64;
        if sent_us < self.fresh_from_us.load(Ordering::Relaxed) {
            return;
        }
        // (a relative 1e-9: the same rate read back through the store is the same bits, but
        // a rate of the fleet's read on another instance may differ in its last digit)
        if sent_at > self.paced_at() * (1.0 + 1e-9) {
            return;
        }
        match met {
            Met::Trouble => self.trouble.fetch_add(1, Ordering::Relaxed),
            Met::Healthy => self.healthy.fetch_add(1, Ordering::Relaxed),
            Met::Nothing => return,
        };
    }

    /// Reports the period that ended by `now`, if one did, and reads back the rate in force.
    /// Returns the rate this instance now paces at, if a period ended.
    pub async fn tick(&self, store: &dyn Store, now: Instant) -> Option<f64> {
        let report = self.period_over(now)?;
        let away = self.store_away();
        // (while away, what this instance saw is its own: the store is only asked for the rate;
        // while rejoining the fleet offers less than its rate, and health says nothing of it)
        let asked = match report {
            _ if away => Report::Quiet,
            Report::Healthy if self.rejoining() => Report::Quiet,
            report => report,
        };
        // (an instance alone may have raised its share past its fair part while another cut
        // its own: what it hands back is at most the rate the fleet last agreed on)
        let known = match away {
            true => self
                .fleet()
                .min(f64::from_bits(self.read.load(Ordering::Relaxed))),
            false => self.fleet(),
        };
        let aimd = self.aimd.resume_at(known);
        let answer = store.adapt(&self.key, &aimd, asked, None).await;
        let mut periods = self.periods();
        match answer {
            Ok(rate) => {
                if away {
                    self.back(&mut periods, now, rate);
                }
                self.read.store(rate.to_bits(), Ordering::Relaxed);
                let was = f64::from_bits(self.rate.swap(rate.to_bits(), Ordering::Relaxed));
                if was != rate {
                    tracing::debug!(key = %self.key, report = asked.as_str(), was, rate,
                        "adaptive pacing: rate moved");
                }
            }
            Err(e) => {
                if !away {
                    self.away.store(true, Ordering::Relaxed);
                    periods.alone = None;
                    tracing::warn!(key = %self.key, error = %e, share = self.paced_at(),
                        "adaptive pacing: the store did not answer; pacing at this instance's \
                         share of the last rate");
                }
                let at_ms = now.saturating_duration_since(self.base).as_secs_f64() * 1000.0;
                let (rate, _) = adapt(&aimd, &mut periods.alone, at_ms, report);
                self.rate.store(rate.to_bits(), Ordering::Relaxed);
            }
        }
        Some(self.paced_at())
    }

    /// The store answered again: what was seen before now counts for nothing, and the
    /// instance rejoins the shared schedule at its share for [`REJOIN`].
    fn back(&self, periods: &mut Periods, now: Instant, rate: f64) {
        self.fresh_from(now);
        let until = (now + REJOIN).saturating_duration_since(self.base);
        self.rejoin_until_us
            .store(until.as_micros().max(1) as u64, Ordering::Relaxed);
        self.away.store(false, Ordering::Relaxed);
        periods.alone = None;
        tracing::info!(key = %self.key, rate, "adaptive pacing: the store answers again");
    }

    /// The report of the period that ended by `now`, if one did; counts dropped, and a quiet
    /// report, after the process stood still.
    fn period_over(&self, now: Instant) -> Option<Report> {
        let mut periods = self.periods();
        let until = self.rejoin_until_us.load(Ordering::Relaxed);
        if until != 0 && now.saturating_duration_since(self.base).as_micros() as u64 >= until {
            self.rejoin_until_us.store(0, Ordering::Relaxed);
        }
        let period = Duration::from_secs_f64(self.aimd.period_ms() / 1000.0);
        let stalled = periods
            .looked
            .is_some_and(|at| now.saturating_duration_since(at) > stall(period));
        periods.looked = Some(now);
        if stalled {
            // (answers to requests sent before now were timed across the stop)
            self.fresh_from(now);
            periods.since = None;
            tracing::warn!(key = %self.key,
                "adaptive pacing: the process stood still; what it saw before counts for nothing");
        }
        match periods.since {
            Some(start) if now.saturating_duration_since(start) < period => return None,
            Some(_) => {}
            // (counts from before the first read are dropped: the rate they were paced at
            // was this instance's guess, not the fleet's)
            None => {
                self.trouble.store(0, Ordering::Relaxed);
                self.healthy.store(0, Ordering::Relaxed);
            }
        }
        periods.since = Some(now);
        let trouble = self.trouble.swap(0, Ordering::Relaxed);
        let healthy = self.healthy.swap(0, Ordering::Relaxed);
        Some(match (trouble, healthy) {
            (0, 0) => Report::Quiet,
            (0, _) => Report::Healthy,
            _ => Report::Trouble,
        })
    }

    /// Answers to requests sent before `now` count for nothing.
    fn fresh_from(&self, now: Instant) {
        let us = now.saturating_duration_since(self.base).as_micros() as u64;
        self.fresh_from_us.fetch_max(us, Ordering::Relaxed);
        self.trouble.store(0, Ordering::Relaxed);
        self.healthy.store(0, Ordering::Relaxed);
    }

    fn periods(&self) -> MutexGuard<'_, Periods> {
        self.periods.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How long an instance back with the store paces at its share of the fleet's rate on the
/// shared schedule. The others find the store back within about a second (the breaker
/// probes once a second) and pace at their share meanwhile; at the whole rate this instance
/// would add that rate to theirs (an upstream of 20/s got 5 503s in that second).
/// Health seen meanwhile does not raise the rate: the fleet offered less than it.
const REJOIN: Duration = Duration::from_secs(2);

/// A gap between two looks of the task longer than this means the process stood still (a
/// SIGSTOP, a starved runtime): two periods, and at least a second, far above the task's tick.
fn stall(period: Duration) -> Duration {
    (period * 2).max(Duration::from_secs(1))
}

/// The upstream's own answers that say it has more than it can take.
fn trouble_status(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT
    )
}

/// How often the task looks for periods that ended: a period starts up to this late.
pub const TICK: Duration = Duration::from_millis(50);

/// One tick of the task: every adaptive upstream of `proxy` whose period ended reports it,
/// and its rate in force goes to `tollgate_pace_rate`. False when `proxy` paces no upstream
/// adaptively: the task may then look less often.
pub async fn tick(proxy: &Arc<Proxy>) -> bool {
    let now = Instant::now();
    let mut seen: Vec<&str> = Vec::new();
    for (_, route) in proxy.routes.routes() {
        let upstream = &route.upstream;
        let Some(adapter) = upstream.pacer.as_ref().and_then(|p| p.adapt.as_ref()) else {
            continue;
        };
        if seen.contains(&&*upstream.name) {
            continue;
        }
        seen.push(&upstream.name);
        if let Some(rate) = adapter.tick(&*proxy.store, now).await {
            proxy.metrics.pace_rate(&upstream.name, rate);
        }
    }
    !seen.is_empty()
}

/// Each adaptive upstream of `new` starts at the rate its namesake in `old` last read, held
/// within its new bounds: a reload neither resets a rate the fleet has cut nor, while the
/// store is out, forgets it.
pub fn carry_over(old: &Proxy, new: &Proxy) {
    let before = adapters(old);
    for (name, adapter) in adapters(new) {
        let Some((_, was)) = before
            .iter()
            .find(|(n, a)| *n == name && a.key == adapter.key)
        else {
            continue;
        };
        let rate = was.fleet();
        let held = rate.clamp(adapter.aimd.min().per_sec(), adapter.aimd.max().per_sec());
        adapter.rate.store(held.to_bits(), Ordering::Relaxed);
        adapter.away.store(was.store_away(), Ordering::Relaxed);
        new.metrics.pace_rate(name, adapter.paced_at());
    }
}

/// The adapters of `proxy`'s upstreams, with their upstream's name.
fn adapters(proxy: &Proxy) -> Vec<(&Arc<str>, &Adapter)> {
    proxy
        .routes
        .routes()
        .iter()
        .filter_map(|(_, route)| {
            let upstream = &route.upstream;
            let adapter = upstream.pacer.as_ref()?.adapt.as_ref()?;
            Some((&upstream.name, adapter))
        })
        .collect()
}

#[cfg(test)]
mod tests;

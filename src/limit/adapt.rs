//! Adaptive pacing: one upstream's current rate, moved as AIMD moves a congestion window.
//! The Rust twin of `lua/adapt.lua`: the same state, the same `f64` arithmetic in the same
//! order.
//!
//! Each instance reports what it saw in its last period: `trouble` (the upstream answered
//! 429, 503 or 504, or could not be reached), `healthy` (it answered, without trouble) or
//! `quiet` (nothing was sent). Trouble multiplies the rate by `decrease`; health adds
//! `increase`. The rate never leaves `[min, max]`.
//!
//! One episode of trouble is seen by every instance, so the state keeps when the rate last
//! fell and when it last changed: at most one increase per period and one decrease per
//! [`FALL_PERIODS`] periods, whatever the number of instances (TCP reacts once per round trip
//! for the same reason). An increase also waits a period after a decrease.

use super::{Millis, Rate, EPS_MS};

/// Periods between two decreases. The answers of the period right after a fall still show the
/// load from before it: requests queued for up to `max_delay` at the old spacing, and an
/// upstream that counts its load over a second or so. Taking them as new trouble cut the rate
/// twice for one episode (an upstream of 20/s was left at 11/s). `lua/adapt.lua` uses the same
/// constant.
pub const FALL_PERIODS: f64 = 2.0;

/// How long an idle rate is kept: an upstream nobody reported on for this long starts again at
/// its start rate. `lua/adapt.lua` uses the same constant (`KEEP_MS`).
pub const KEEP_MS: u64 = 3_600_000;

/// AIMD parameters that cannot be built inconsistent: `min <= start <= max`, `decrease` in
/// (0, 1), a positive `increase` and period.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aimd {
    start: Rate,
    min: Rate,
    max: Rate,
    increase: f64,
    decrease: f64,
    period_ms: f64,
}

/// Why AIMD parameters were refused; the config layer adds the file position and key path.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AimdError {
    /// The start rate lies outside `[min, max]`.
    #[error("rate {start}/s must lie between min {min}/s and max {max}/s")]
    StartOutside {
        /// the start rate, per second
        start: f64,
        /// `min`, per second
        min: f64,
        /// `max`, per second
        max: f64,
    },
    /// `decrease` must shrink the rate, and leave some.
    #[error("decrease must be greater than 0 and less than 1, found {0}")]
    Decrease(f64),
    /// `increase` must grow the rate.
    #[error("increase must be greater than zero, found {0}")]
    Increase(f64),
    /// The period must be positive and finite.
    #[error("interval must be greater than zero")]
    Period,
}

impl Aimd {
    /// Starts at `start`, stays within `[min, max]`, adds `increase` (per second) per healthy
    /// period and multiplies by `decrease` per period of trouble, one increase per `period_ms`
    /// and one decrease per [`FALL_PERIODS`] of them.
    pub fn new(
        start: Rate,
        min: Rate,
        max: Rate,
        increase: f64,
        decrease: f64,
        period_ms: f64,
    ) -> Result<Aimd, AimdError> {
        let (s, lo, hi) = (start.per_sec(), min.per_sec(), max.per_sec());
        if s < lo || s > hi {
            return Err(AimdError::StartOutside {
                start: s,
                min: lo,
                max: hi,
            });
        }
        if !(decrease > 0.0 && decrease < 1.0) {
            return Err(AimdError::Decrease(decrease));
        }
        if !(increase.is_finite() && increase > 0.0) {
            return Err(AimdError::Increase(increase));
        }
        if !(period_ms.is_finite() && period_ms > 0.0) {
            return Err(AimdError::Period);
        }
        Ok(Aimd {
            start,
            min,
            max,
            increase,
            decrease,
            period_ms,
        })
    }

    /// The default step: 1/200 of `max` per period, so a rate crosses its whole range in 200
    /// periods (100 s at the default 500 ms), each step a small part of what the upstream takes.
    pub fn default_increase(max: Rate) -> f64 {
        max.per_sec() / 200.0
    }

    /// Where the rate starts (ARGV[1]).
    pub fn start(&self) -> Rate {
        self.start
    }

    /// The same parameters with the rate starting at `rate`, held within `[min, max]`: the
    /// rate an instance last knew, so that a state lost with an emptied store resumes from it
    /// instead of from the configured start. A `rate` that is not a rate leaves the start.
    pub fn resume_at(self, rate: f64) -> Aimd {
        let held = rate.clamp(self.min.per_sec(), self.max.per_sec());
        match Rate::per_second(held) {
            Ok(start) => Aimd { start, ..self },
            Err(_) => self,
        }
    }

    /// The floor (ARGV[2]).
    pub fn min(&self) -> Rate {
        self.min
    }

    /// The ceiling (ARGV[3]).
    pub fn max(&self) -> Rate {
        self.max
    }

    /// Requests per second added per healthy period (ARGV[4]).
    pub fn increase(&self) -> f64 {
        self.increase
    }

    /// The factor applied per period of trouble (ARGV[5]).
    pub fn decrease(&self) -> f64 {
        self.decrease
    }

    /// At most one increase per this many ms, and one decrease per [`FALL_PERIODS`] times as
    /// many (ARGV[7]).
    pub fn period_ms(&self) -> f64 {
        self.period_ms
    }
}

/// What one instance saw of the upstream in its last period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// some answer was 429, 503 or 504, a connect failure, or slower than `target_latency`
    Trouble,
    /// answers came, none of them trouble
    Healthy,
    /// nothing was sent: no change, only the current rate read
    Quiet,
}

impl Report {
    /// The word the script takes (ARGV[6]).
    pub fn as_str(self) -> &'static str {
        match self {
            Report::Trouble => "trouble",
            Report::Healthy => "healthy",
            Report::Quiet => "quiet",
        }
    }
}

/// The shared state of one upstream's rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adapted {
    /// the current rate, per second
    pub rate: f64,
    /// when the rate last changed (ms)
    pub changed: Millis,
    /// when the rate last fell (ms)
    pub fell: Millis,
}

/// Applies `report`, made at `now`, to `state` (`None`: new or expired). Returns the current
/// rate per second and, when the state was written, its time to live in ms.
pub fn adapt(
    p: &Aimd,
    state: &mut Option<Adapted>,
    now: Millis,
    report: Report,
) -> (f64, Option<u64>) {
    // a new state may change at once: its last changes lie far enough back
    let fall_gap = FALL_PERIODS * p.period_ms;
    let mut s = state.unwrap_or(Adapted {
        rate: p.start.per_sec(),
        changed: now - fall_gap,
        fell: now - fall_gap,
    });
    // (a reload may have moved min or max past the stored rate)
    if s.rate < p.min.per_sec() {
        s.rate = p.min.per_sec();
    }
    if s.rate > p.max.per_sec() {
        s.rate = p.max.per_sec();
    }
    match report {
        Report::Quiet => return (s.rate, None),
        Report::Trouble if now - s.fell >= fall_gap - EPS_MS => {
            s.rate *= p.decrease;
            if s.rate < p.min.per_sec() {
                s.rate = p.min.per_sec();
            }
            s.fell = now;
            s.changed = now;
        }
        Report::Healthy if now - s.changed >= p.period_ms - EPS_MS => {
            s.rate += p.increase;
            if s.rate > p.max.per_sec() {
                s.rate = p.max.per_sec();
            }
            s.changed = now;
        }
        Report::Trouble | Report::Healthy => {}
    }
    *state = Some(s);
    (s.rate, Some(KEEP_MS))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aimd() -> Aimd {
        let r = |x| Rate::per_second(x).unwrap();
        Aimd::new(r(100.0), r(1.0), r(200.0), 1.0, 0.7, 500.0).unwrap()
    }

    /// Trouble multiplies the rate by `decrease`, health adds `increase`, quiet changes
    /// nothing and writes nothing.
    #[test]
    fn trouble_multiplies_health_adds_quiet_reads() {
        let p = aimd();
        let mut s = None;
        assert_eq!(adapt(&p, &mut s, 0.0, Report::Quiet), (100.0, None));
        assert_eq!(s, None);
        assert_eq!(adapt(&p, &mut s, 0.0, Report::Trouble).0, 70.0);
        assert_eq!(adapt(&p, &mut s, 500.0, Report::Healthy).0, 71.0);
        assert_eq!(adapt(&p, &mut s, 1000.0, Report::Quiet).0, 71.0);
    }

    /// Many instances reporting one episode of trouble bring the rate down once; trouble two
    /// periods later may bring it down again.
    #[test]
    fn one_decrease_per_two_periods_whoever_reports() {
        let p = aimd();
        let mut s = None;
        for at in [0.0, 10.0, 200.0, 499.0, 500.0, 999.0] {
            assert_eq!(adapt(&p, &mut s, at, Report::Trouble).0, 70.0, "at {at}");
        }
        assert_eq!(adapt(&p, &mut s, 1000.0, Report::Trouble).0, 70.0 * 0.7);
    }

    /// An increase waits a period after any change; a decrease waits only for the last
    /// decrease, so health reported just before trouble cannot hold the trouble off.
    #[test]
    fn increases_wait_a_period_decreases_do_not_wait_for_them() {
        let p = aimd();
        let mut s = None;
        adapt(&p, &mut s, 0.0, Report::Trouble);
        assert_eq!(adapt(&p, &mut s, 300.0, Report::Healthy).0, 70.0);
        assert_eq!(adapt(&p, &mut s, 500.0, Report::Healthy).0, 71.0);
        assert_eq!(adapt(&p, &mut s, 1000.0, Report::Healthy).0, 72.0);
        assert_eq!(adapt(&p, &mut s, 1200.0, Report::Healthy).0, 72.0);
        assert_eq!(adapt(&p, &mut s, 1200.0, Report::Trouble).0, 72.0 * 0.7);
    }

    /// The rate stays within `[min, max]`, also when a reload moved them past it.
    #[test]
    fn stays_within_min_and_max() {
        let r = |x| Rate::per_second(x).unwrap();
        let p = Aimd::new(r(2.0), r(1.0), r(3.0), 5.0, 0.1, 1.0).unwrap();
        let mut s = None;
        assert_eq!(adapt(&p, &mut s, 0.0, Report::Trouble).0, 1.0);
        assert_eq!(adapt(&p, &mut s, 1.0, Report::Healthy).0, 3.0);
        let narrower = Aimd::new(r(2.0), r(1.0), r(2.0), 5.0, 0.1, 1.0).unwrap();
        assert_eq!(adapt(&narrower, &mut s, 1.5, Report::Quiet).0, 2.0);
    }

    /// A lost state resumes from the rate an instance last knew, held within the bounds.
    #[test]
    fn a_lost_state_resumes_from_the_last_known_rate() {
        let p = aimd();
        let mut s = None;
        assert_eq!(
            adapt(&p.resume_at(21.5), &mut s, 0.0, Report::Quiet).0,
            21.5
        );
        assert_eq!(
            adapt(&p.resume_at(21.5), &mut s, 0.0, Report::Trouble).0,
            21.5 * 0.7
        );
        // a state that exists is not moved by a caller's last known rate
        assert_eq!(
            adapt(&p.resume_at(90.0), &mut s, 1.0, Report::Quiet).0,
            21.5 * 0.7
        );
        assert_eq!(p.resume_at(500.0).start().per_sec(), 200.0);
        assert_eq!(p.resume_at(0.0).start().per_sec(), 1.0);
        assert_eq!(p.resume_at(f64::NAN), p);
    }

    /// Parameters that make no sense cannot be built.
    #[test]
    fn refuses_inconsistent_parameters() {
        let r = |x| Rate::per_second(x).unwrap();
        let new = |start, d, i, period| Aimd::new(r(start), r(1.0), r(10.0), i, d, period);
        assert!(matches!(
            new(20.0, 0.5, 1.0, 1.0),
            Err(AimdError::StartOutside { .. })
        ));
        assert!(matches!(
            new(0.5, 0.5, 1.0, 1.0),
            Err(AimdError::StartOutside { .. })
        ));
        for d in [0.0, 1.0, -0.5, f64::NAN] {
            assert!(matches!(new(5.0, d, 1.0, 1.0), Err(AimdError::Decrease(_))));
        }
        assert!(matches!(
            new(5.0, 0.5, 0.0, 1.0),
            Err(AimdError::Increase(_))
        ));
        assert_eq!(new(5.0, 0.5, 1.0, 0.0), Err(AimdError::Period));
        assert_eq!(Aimd::default_increase(r(200.0)), 1.0);
    }
}

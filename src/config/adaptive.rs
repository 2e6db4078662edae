//! `upstreams.NAME.pace.adaptive`: the bounds and steps of an adaptive pace, checked against
//! the pace's `rate`, where the shared rate starts.

use std::time::Duration;

use super::check::Checker;
use super::problem::Path;
use super::raw::RawAdaptive;
use super::types::AdaptiveConfig;
use super::units::{self, format_rate};
use crate::limit::{Aimd, Rate};

/// The factor applied to the rate after a period of trouble: the multiplicative decrease of
/// TCP CUBIC. Half (Reno's) would leave an upstream at its capacity 25 % idle on average;
/// 0.7 leaves it about 15 % idle.
pub(crate) const DEFAULT_DECREASE: f64 = 0.7;

/// At most one increase in this long, one decrease in twice as long: a few round trips of a
/// typical API, so that each change is seen in the answers before the next one.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_millis(500);

/// The adaptive settings of a pace starting at `start` (`None`: the pace's rate is missing or
/// invalid, already reported). `pace` is the path of the `pace` key.
pub(super) fn adaptive(
    chk: &mut Checker<'_>,
    raw: &RawAdaptive,
    start: Option<Rate>,
    pace: &Path,
) -> Option<AdaptiveConfig> {
    let path = &pace.key("adaptive");
    chk.required(&raw.min, path, "min");
    chk.required(&raw.max, path, "max");
    let min = chk.parse(&raw.min, &path.key("min"), units::parse_rate);
    let max = chk.parse(&raw.max, &path.key("max"), units::parse_rate);
    let increase = chk.parse(&raw.increase, &path.key("increase"), units::parse_rate);
    let decrease = raw.decrease.get().copied();
    if decrease.is_some_and(|d| !(d > 0.0 && d < 1.0)) {
        let found = decrease.unwrap_or_default();
        let message = format!("decrease must be greater than 0 and less than 1, found {found}");
        chk.error(path.key("decrease"), message);
    }
    let interval = chk.duration(&raw.interval, &path.key("interval"), DEFAULT_INTERVAL);
    let target_latency = chk.parse(
        &raw.target_latency,
        &path.key("target_latency"),
        units::parse_duration,
    );
    if target_latency.is_some_and(|d| d.is_zero()) {
        chk.error(path.key("target_latency"), "must be greater than zero");
    }
    let target_latency = chk.at_most_a_year(target_latency, &path.key("target_latency"));
    let (min, max) = (min?.rate, max?.rate);
    if min.per_sec() > max.per_sec() {
        let message = format!("max {} is below min {}", format_rate(max), format_rate(min));
        chk.error(path.key("max"), message);
        return None;
    }
    let start = start?;
    if start.per_sec() < min.per_sec() || start.per_sec() > max.per_sec() {
        let message = format!(
            "rate {} must lie between adaptive.min {} and adaptive.max {}: the rate is where \
             the adaptive rate starts",
            format_rate(start),
            format_rate(min),
            format_rate(max)
        );
        chk.error(pace.key("rate"), message);
        return None;
    }
    let increase = match increase {
        Some(i) => i.rate.per_sec(),
        None if raw.increase.is_given() => return None,
        None => Aimd::default_increase(max),
    };
    let period_ms = interval.as_secs_f64() * 1000.0;
    let aimd = Aimd::new(
        start,
        min,
        max,
        increase,
        decrease.unwrap_or(DEFAULT_DECREASE),
        period_ms,
    )
    .map_err(|e| chk.error(path.clone(), e.to_string()))
    .ok()?;
    Some(AdaptiveConfig {
        aimd,
        target_latency,
    })
}

//! The last minute of the registry, one sample a second, for rates: how many requests a second
//! a route served is the difference of its counter between two samples, over their distance.
//!
//! Samples are read from the registry's own text, so the request path counts nothing more for
//! the console. They are taken only while someone asks: the first ask starts the sampling, and
//! it stops after [`IDLE`] without an ask. A running server asks every second, to publish its
//! figures to the fleet (`api::publish_figures`), so it samples all the time.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

// Tokio's clock is std's unless a test pauses it: the sampling's schedule, the window and the
// idle stop then run on `tokio::time` instead of real seconds.
use tokio::time::Instant;

use crate::metrics::Metrics;

/// How far back the samples reach.
pub const WINDOW: Duration = Duration::from_secs(60);

/// The families the console reads; the others (request durations above all, a histogram per
/// route) are skipped before their lines are parsed.
const READ: [&str; 6] = [
    "tollgate_requests_total",
    "tollgate_limit_decisions_total",
    "tollgate_upstream_responses_total",
    "tollgate_pacing_delay_seconds_bucket",
    "tollgate_store_errors_total",
    "tollgate_store_duration_seconds_bucket",
];

/// How often a sample is taken.
const EVERY: Duration = Duration::from_secs(1);

/// Sampling stops after this long without an ask.
const IDLE: Duration = Duration::from_secs(120);

/// One series of the registry: its name and labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Series {
    /// the sample name, `tollgate_requests_total`
    pub name: String,
    /// its labels in the order written
    pub labels: Vec<(String, String)>,
}

impl Series {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every series' value at one instant.
#[derive(Debug)]
pub struct Sample {
    /// when it was taken
    pub at: Instant,
    /// the values
    pub values: HashMap<Series, f64>,
}

impl Sample {
    /// Reads the samples of the families named `read` from the text format:
    /// `name{label="value",…} number` lines; comments and lines that do not parse are skipped.
    pub fn parse(text: &str, read: &[&str], at: Instant) -> Sample {
        let values = text
            .lines()
            .filter(|l| {
                read.iter().any(|name| {
                    l.strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with(['{', ' ']))
                })
            })
            .filter_map(parse_line)
            .collect();
        Sample { at, values }
    }
}

/// One line of the text format.
fn parse_line(line: &str) -> Option<(Series, f64)> {
    let (head, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let (name, labels) = match head.split_once('{') {
        None => (head, Vec::new()),
        Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}')?)?),
    };
    let name = name.to_owned();
    Some((Series { name, labels }, value))
}

/// `a="x",b="y"`, with `\"`, `\\` and `\n` escapes in values.
fn parse_labels(mut text: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    while !text.is_empty() {
        let (key, rest) = text.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((key.trim_start_matches(',').to_owned(), value));
        text = rest[end + 1..].trim_start_matches(',');
    }
    Some(labels)
}

/// The samples of the last [`WINDOW`], taken while asked for.
pub struct Sampler {
    metrics: Metrics,
    samples: Mutex<VecDeque<Arc<Sample>>>,
    /// ms since `clock` of the last ask
    asked: AtomicU64,
    clock: Instant,
    running: AtomicBool,
}

impl Sampler {
    /// Samples of `metrics`, none yet.
    pub fn new(metrics: Metrics) -> Arc<Sampler> {
        Arc::new(Sampler {
            metrics,
            samples: Mutex::new(VecDeque::new()),
            asked: AtomicU64::new(0),
            clock: Instant::now(),
            running: AtomicBool::new(false),
        })
    }

    /// The oldest and the newest sample of the window. The first ask takes a sample at once
    /// and starts the sampling, so both are the same until the next second.
    pub fn window(self: &Arc<Self>) -> (Arc<Sample>, Arc<Sample>) {
        let now_ms = self.clock.elapsed().as_millis() as u64;
        self.asked.store(now_ms, Ordering::Relaxed);
        if !self.running.swap(true, Ordering::AcqRel) {
            self.take();
            tokio::spawn(run(Arc::downgrade(self)));
        }
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let newest = samples.back().cloned().unwrap_or_else(|| {
            Arc::new(Sample {
                at: Instant::now(),
                values: HashMap::new(),
            })
        });
        let oldest = samples.front().cloned().unwrap_or_else(|| newest.clone());
        (oldest, newest)
    }

    fn take(&self) {
        // (OpenMetrics as the registry writes it: its samples read as the text format's)
        let sample = Arc::new(Sample::parse(&self.metrics.encode(), &READ, Instant::now()));
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.push_back(sample);
        while samples
            .front()
            .is_some_and(|s| s.at.elapsed() > WINDOW + EVERY)
        {
            samples.pop_front();
        }
    }

    fn idle(&self) -> bool {
        let now_ms = self.clock.elapsed().as_millis() as u64;
        now_ms.saturating_sub(self.asked.load(Ordering::Relaxed)) > IDLE.as_millis() as u64
    }
}

/// Samples every second until nobody asked for [`IDLE`]; the samples go with it.
async fn run(sampler: Weak<Sampler>) {
    loop {
        tokio::time::sleep(EVERY).await;
        let Some(sampler) = sampler.upgrade() else {
            return;
        };
        if sampler.idle() {
            sampler
                .samples
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
            sampler.running.store(false, Ordering::Release);
            return;
        }
        sampler.take();
    }
}

/// What a counter did between two samples.
pub struct Change<'a> {
    pub before: &'a Sample,
    pub after: &'a Sample,
}

impl Change<'_> {
    /// Seconds between the samples; at least a millisecond.
    pub fn seconds(&self) -> f64 {
        (self.after.at - self.before.at).as_secs_f64().max(0.001)
    }

    /// How much each series named `name` grew, with its labels. A series that restarted (a
    /// reload made it anew) counts from zero.
    pub fn grown<'s>(&'s self, name: &'s str) -> impl Iterator<Item = (&'s Series, f64)> + 's {
        self.after
            .values
            .iter()
            .filter(move |(s, _)| s.name == name)
            .map(|(s, &after)| {
                let before = self.before.values.get(s).copied().unwrap_or(0.0);
                let grown = if after >= before {
                    after - before
                } else {
                    after
                };
                (s, grown)
            })
    }

    /// The `q` quantile (0 to 1), in the histogram's unit, of what histogram `name` observed
    /// between the samples for the series whose label `key` is `value`, by interpolation
    /// inside its bucket as Prometheus's `histogram_quantile` does. `None` without
    /// observations.
    pub fn quantile(&self, name: &str, key: &str, value: &str, q: f64) -> Option<f64> {
        let bucket = format!("{name}_bucket");
        let mut buckets: Vec<(f64, f64)> = self
            .grown(&bucket)
            .filter(|(s, _)| key.is_empty() || s.label(key) == Some(value))
            .filter_map(|(s, n)| {
                let le = s.label("le")?;
                let bound = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((bound, n))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let mut lower = (0.0, 0.0);
        for &(bound, count) in &buckets {
            if count >= rank {
                if bound.is_infinite() {
                    return Some(lower.0);
                }
                let within = count - lower.1;
                let share = if within > 0.0 {
                    (rank - lower.1) / within
                } else {
                    1.0
                };
                return Some(lower.0 + (bound - lower.0) * share);
            }
            lower = (bound, count);
        }
        Some(lower.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text format is read back: names, labels with escapes, values; families not asked
    /// for are skipped.
    #[test]
    fn reads_the_text_format() {
        let text = "# HELP x y\n\
                    tollgate_requests_total{route=\"api\",status=\"200\"} 12\n\
                    odd{l=\"a\\\"b\"} 1.5\n\
                    plain 3\n\
                    skipped_total 4\n\
                    tollgate_requests_total_extra 5\n";
        let sample = Sample::parse(
            text,
            &["tollgate_requests_total", "odd", "plain"],
            Instant::now(),
        );
        let series = Series {
            name: "tollgate_requests_total".into(),
            labels: vec![
                ("route".into(), "api".into()),
                ("status".into(), "200".into()),
            ],
        };
        assert_eq!(sample.values[&series], 12.0);
        let odd = sample.values.keys().find(|s| s.name == "odd").unwrap();
        assert_eq!(odd.label("l"), Some("a\"b"));
        assert_eq!(sample.values.len(), 3);
    }

    /// Rates and quantiles come from what grew between two samples.
    #[test]
    fn growth_and_quantiles() {
        let t0 = Instant::now();
        let before = Sample::parse(
            "h_bucket{u=\"a\",le=\"0.1\"} 10\nh_bucket{u=\"a\",le=\"1\"} 10\nh_bucket{u=\"a\",le=\"+Inf\"} 10\n",
            &["h_bucket"],
            t0,
        );
        let after = Sample::parse(
            "h_bucket{u=\"a\",le=\"0.1\"} 60\nh_bucket{u=\"a\",le=\"1\"} 110\nh_bucket{u=\"a\",le=\"+Inf\"} 110\n",
            &["h_bucket"],
            t0 + Duration::from_secs(10),
        );
        let change = Change {
            before: &before,
            after: &after,
        };
        assert_eq!(change.seconds(), 10.0);
        // 100 observations: 50 up to 0.1, 50 between 0.1 and 1
        let p50 = change.quantile("h", "u", "a", 0.5).unwrap();
        assert!((p50 - 0.1).abs() < 1e-9, "{p50}");
        let p99 = change.quantile("h", "u", "a", 0.99).unwrap();
        assert!((p99 - (0.1 + 0.9 * 49.0 / 50.0)).abs() < 1e-9, "{p99}");
        assert_eq!(change.quantile("h", "u", "b", 0.5), None);
    }

    /// The samples that `sampler` holds now.
    fn held(sampler: &Sampler) -> usize {
        sampler.samples.lock().expect("not poisoned").len()
    }

    /// The first ask takes a sample and starts the sampling, one a second; the window keeps
    /// a minute and a sample; without an ask for [`IDLE`] the sampling stops, its samples gone.
    #[tokio::test(start_paused = true)]
    async fn samples_every_second_while_asked_and_stops_when_idle() {
        let sampler = Sampler::new(Metrics::new());
        let (oldest, newest) = sampler.window();
        assert!(Arc::ptr_eq(&oldest, &newest), "one sample at once");
        // (the paused clock moves on to each of the sampler's ticks while this sleeps)
        tokio::time::sleep(EVERY * 3 + EVERY / 2).await;
        sampler.window();
        assert_eq!(held(&sampler), 4, "one a second");
        tokio::time::sleep(WINDOW * 2).await;
        let (oldest, newest) = sampler.window();
        let span = newest.at - oldest.at;
        assert!(span >= WINDOW && span <= WINDOW + EVERY, "{span:?}");
        tokio::time::sleep(IDLE - EVERY).await;
        assert!(
            sampler.running.load(Ordering::Acquire),
            "stopped while asked"
        );
        tokio::time::sleep(EVERY * 2).await;
        assert!(!sampler.running.load(Ordering::Acquire), "still sampling");
        assert_eq!(held(&sampler), 0);
    }
}

//! A counter and a histogram that the worker threads write without sharing a cache line.
//!
//! prometheus-client's counter is one atomic and its histogram one mutex: every worker writes
//! the same cache line for every request, and on two cores that line goes back and forth
//! between them (an atomic add on a line the other core holds waited tens of nanoseconds,
//! seen in `perf annotate` of the request path). Here each metric has a slot per worker (see
//! [`set_thread_slot`]), each slot on a cache line of its own, and a scrape adds the slots up.
//! A thread that is not a worker, or a worker past [`SLOTS`], shares a slot: the adds stay
//! atomic, so nothing is lost, only that line is shared again.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Slots per metric.
const SLOTS: usize = 8;

/// Bucket bounds a [`Histogram`] can hold, the `+Inf` bucket not counted.
const MAX_BOUNDS: usize = 16;

thread_local! {
    static SLOT: Cell<usize> = const { Cell::new(0) };
}

/// Marks the calling thread as worker `worker`: its recordings go to that worker's slot.
pub fn set_thread_slot(worker: usize) {
    SLOT.with(|s| s.set(worker % SLOTS));
}

fn slot() -> usize {
    SLOT.with(Cell::get)
}

/// One cache line (two, for the adjacent-line prefetcher) per slot.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Line<T>(T);

/// A monotonic counter (`_total`).
#[derive(Clone, Debug, Default)]
pub struct Counter {
    slots: Arc<[Line<AtomicU64>; SLOTS]>,
}

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.slots[slot()].0.fetch_add(1, Relaxed);
    }

    /// The count so far.
    pub fn get(&self) -> u64 {
        self.slots.iter().map(|s| s.0.load(Relaxed)).sum()
    }
}

impl TypedMetric for Counter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for Counter {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// A histogram of durations, in seconds.
#[derive(Clone, Debug)]
pub struct Histogram {
    /// the buckets' upper bounds, ascending; a last bucket, `+Inf`, follows them
    bounds: &'static [f64],
    slots: Arc<[Line<Counts>; SLOTS]>,
}

#[derive(Debug, Default)]
struct Counts {
    /// observations per bucket (not cumulative); the count is their sum, so a scrape never
    /// shows a `_count` that disagrees with the `+Inf` bucket
    buckets: [AtomicU64; MAX_BOUNDS + 1],
    /// the sum of the observations, in nanoseconds
    sum_ns: AtomicU64,
}

impl Histogram {
    /// A histogram with buckets up to each of `bounds` (seconds, ascending, at most 16) and
    /// `+Inf`.
    pub fn new(bounds: &'static [f64]) -> Histogram {
        assert!(bounds.len() <= MAX_BOUNDS, "at most {MAX_BOUNDS} buckets");
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds ascend");
        Histogram {
            bounds,
            slots: Arc::default(),
        }
    }

    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let bucket = self
            .bounds
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(self.bounds.len());
        let counts = &self.slots[slot()].0;
        counts.buckets[bucket].fetch_add(1, Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        counts.sum_ns.fetch_add(ns, Relaxed);
    }

    /// (upper bound, observations in that bucket alone) for every bucket, `+Inf` last; the sum
    /// in seconds; the count.
    fn totals(&self) -> (Vec<(f64, u64)>, f64, u64) {
        let mut buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .map(|b| (b, 0))
            .collect();
        let mut sum_ns = 0u128;
        for line in self.slots.iter() {
            for (total, n) in buckets.iter_mut().zip(&line.0.buckets) {
                total.1 += n.load(Relaxed);
            }
            sum_ns += u128::from(line.0.sum_ns.load(Relaxed));
        }
        let count = buckets.iter().map(|b| b.1).sum();
        (buckets, sum_ns as f64 / 1e9, count)
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        let (buckets, sum, count) = self.totals();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every slot's counts are added up: each thread records into its own, and none is lost.
    #[test]
    fn slots_add_up() {
        let c = Counter::default();
        let h = Histogram::new(&[0.001, 0.01]);
        let threads: Vec<_> = (0..SLOTS + 3)
            .map(|w| {
                let (c, h) = (c.clone(), h.clone());
                std::thread::spawn(move || {
                    set_thread_slot(w);
                    for _ in 0..1000 {
                        c.inc();
                    }
                    h.observe(Duration::from_micros(500));
                    h.observe(Duration::from_millis(5));
                    h.observe(Duration::from_secs(2));
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let n = (SLOTS + 3) as u64;
        assert_eq!(c.get(), 1000 * n);
        let (buckets, sum, count) = h.totals();
        assert_eq!(
            buckets,
            vec![(0.001, n), (0.01, n), (f64::INFINITY, n)],
            "one observation per bucket per thread"
        );
        assert_eq!(count, 3 * n);
        assert!((sum - 2.0055 * n as f64).abs() < 1e-9, "sum {sum}");
    }

    /// A value on a bound falls in that bound's bucket (`le`: less than or equal).
    #[test]
    fn a_value_on_a_bound_is_in_its_bucket() {
        let h = Histogram::new(&[0.001, 0.01]);
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_millis(10));
        let (buckets, _, _) = h.totals();
        assert_eq!(buckets, vec![(0.001, 1), (0.01, 1), (f64::INFINITY, 0)]);
    }
}

//! The clients a limit refuses most, counted in fixed memory: the space-saving summary of
//! Metwally, Agrawal and El Abbadi ("Efficient Computation of Frequent and Top-k Elements in
//! Data Streams", 2005).
//!
//! It keeps `capacity` clients. A client already kept counts one more. A new client takes the
//! place of the one with the smallest count, and starts from that count plus one: its count may
//! be too high, by at most `error`, never too low. A client refused more often than one request
//! in `capacity` is always kept.
//!
//! [`Windowed`] keeps such a summary per [`SLOT`] of the last minute and merges them when
//! read, so that a refusal leaves the figures once it is a minute old.

use std::collections::HashMap;
use std::time::Duration;

/// One kept client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// the client, as `overrides` name it
    pub client: String,
    /// refusals counted for it: at least the true number, at most `error` more
    pub count: u64,
    /// how much of `count` may belong to the clients it replaced
    pub error: u64,
}

/// The summary: at most `capacity` entries, whatever the number of clients.
#[derive(Debug)]
pub struct TopK {
    capacity: usize,
    entries: Vec<Entry>,
    /// where each kept client's entry is
    index: HashMap<String, usize>,
}

impl TopK {
    /// A summary keeping `capacity` clients (at least one).
    pub fn new(capacity: usize) -> TopK {
        let capacity = capacity.max(1);
        TopK {
            capacity,
            // (grown as clients come: most slots of most limits never fill)
            entries: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Forgets every client, keeping the memory for the next ones.
    fn clear(&mut self) {
        self.entries.clear();
        self.index.clear();
    }

    /// The smallest count while the summary is full, else 0: a client it does not keep was
    /// counted at most this many times. At most N / `capacity` after N adds, as the full
    /// summary's counts add up to N.
    fn floor(&self) -> u64 {
        if self.entries.len() < self.capacity {
            return 0;
        }
        self.entries.iter().map(|e| e.count).min().unwrap_or(0)
    }

    /// Counts one refusal of `client`.
    pub fn add(&mut self, client: &str) {
        if let Some(&i) = self.index.get(client) {
            self.entries[i].count += 1;
            return;
        }
        if self.entries.len() < self.capacity {
            self.index.insert(client.to_owned(), self.entries.len());
            self.entries.push(Entry {
                client: client.to_owned(),
                count: 1,
                error: 0,
            });
            return;
        }
        // (a linear scan: the summary is small, and this runs once per new refused client)
        let (i, least) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.count)
            .map(|(i, e)| (i, e.count))
            .expect("a full summary has entries");
        let old = std::mem::replace(
            &mut self.entries[i],
            Entry {
                client: client.to_owned(),
                count: least + 1,
                error: least,
            },
        );
        self.index.remove(&old.client);
        self.index.insert(client.to_owned(), i);
    }

    /// The `n` clients with the highest counts, highest first.
    pub fn top(&self, n: usize) -> Vec<Entry> {
        let mut top = self.entries.clone();
        top.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.client.cmp(&b.client)));
        top.truncate(n);
        top
    }

    /// The heap memory the summary holds, in bytes: its entries, their names, and the index.
    #[cfg(test)]
    fn heap_bytes(&self) -> usize {
        let names: usize = self.entries.iter().map(|e| 2 * e.client.capacity()).sum();
        let entries = self.entries.capacity() * std::mem::size_of::<Entry>();
        let index = self.index.capacity() * (std::mem::size_of::<(String, usize)>() + 1);
        names + entries + index
    }

    /// How many clients are kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no client was counted.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// How long one slot of a [`Windowed`] summary counts.
pub const SLOT: Duration = Duration::from_secs(5);

/// Slots a [`Windowed`] summary reads: the current one and the 11 before, so a refusal leaves
/// the figures between 55 and 60 seconds after it happened.
pub const SLOTS: u64 = 12;

/// The clients refused most over the last minute: one [`TopK`] per [`SLOT`], in a ring that
/// reuses the oldest slot for the newest. Memory: at most [`SLOTS`] × `capacity` entries.
#[derive(Debug)]
pub struct Windowed {
    capacity: usize,
    /// slot number (time / [`SLOT`]) and its summary, at index slot number % [`SLOTS`]
    ring: Vec<(u64, TopK)>,
}

impl Windowed {
    /// A summary keeping `capacity` clients per slot.
    pub fn new(capacity: usize) -> Windowed {
        Windowed {
            capacity,
            ring: Vec::new(),
        }
    }

    /// Counts one refusal of `client` at `now` (time since any fixed start).
    pub fn add(&mut self, now: Duration, client: &str) {
        let slot = slot_of(now);
        if self.ring.is_empty() {
            self.ring = (0..SLOTS)
                .map(|_| (u64::MAX, TopK::new(self.capacity)))
                .collect();
        }
        let (at, top) = &mut self.ring[(slot % SLOTS) as usize];
        if *at != slot {
            top.clear();
            *at = slot;
        }
        top.add(client);
    }

    /// The `n` clients refused most in the minute up to `now`, most first.
    ///
    /// A slot that does not keep a client counted it at most its floor times, so each client
    /// takes the floor of the slots that lost it: its count is then never too low, and too high
    /// by at most its `error`, the sum of the floors, at most N / `capacity` for N refusals in
    /// the window.
    pub fn top(&self, now: Duration, n: usize) -> Vec<Entry> {
        let first = slot_of(now).saturating_sub(SLOTS - 1);
        let live: Vec<&TopK> = self
            .ring
            .iter()
            .filter(|(at, _)| (first..=slot_of(now)).contains(at))
            .map(|(_, top)| top)
            .collect();
        let floors: u64 = live.iter().map(|top| top.floor()).sum();
        // per client: (counts, errors, floors) of the slots that keep it
        let mut kept: HashMap<&str, (u64, u64, u64)> = HashMap::new();
        for top in &live {
            let floor = top.floor();
            for e in &top.entries {
                let sums = kept.entry(e.client.as_str()).or_default();
                *sums = (sums.0 + e.count, sums.1 + e.error, sums.2 + floor);
            }
        }
        let mut out: Vec<Entry> = kept
            .into_iter()
            .map(|(client, (count, error, floor))| Entry {
                client: client.to_owned(),
                count: count + (floors - floor),
                error: error + (floors - floor),
            })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.client.cmp(&b.client)));
        out.truncate(n);
        out
    }
}

/// The slot `now` falls in.
fn slot_of(now: Duration) -> u64 {
    (now.as_millis() / SLOT.as_millis()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clients refused more often than one time in `capacity` are found among 200 000
    /// distinct others, with counts within the stated error, and the summary never holds
    /// more than its capacity.
    #[test]
    fn heavy_clients_are_found_among_many_light_ones() {
        let mut top = TopK::new(64);
        for i in 0..200_000u32 {
            top.add(&format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255));
            if i % 20 == 0 {
                top.add("192.0.2.7");
            }
            if i % 40 == 0 {
                top.add("198.51.100.9");
            }
        }
        assert_eq!(top.len(), 64);
        let found = top.top(2);
        assert_eq!(found[0].client, "192.0.2.7");
        assert_eq!(found[1].client, "198.51.100.9");
        for (entry, truth) in found.iter().zip([10_000u64, 5_000]) {
            assert!(entry.count >= truth, "{entry:?}");
            assert!(entry.count - entry.error <= truth, "{entry:?}");
        }
    }

    /// A million distinct refused clients leave the summary as small as a few dozen do.
    #[test]
    fn memory_does_not_grow_with_the_clients() {
        let mut top = TopK::new(64);
        for i in 0..64u32 {
            top.add(&format!("2001:db8::{i:x}"));
        }
        let few = top.heap_bytes();
        for i in 0..1_000_000u32 {
            top.add(&format!("2001:db8::{i:x}"));
        }
        assert_eq!(top.len(), 64);
        // (longer names than the first few: a little more, never more per client)
        assert!(
            few < 16 * 1024 && top.heap_bytes() < 16 * 1024,
            "{few}, {}",
            top.heap_bytes()
        );
    }

    /// Until it is full, every client is counted exactly.
    #[test]
    fn counts_are_exact_until_full() {
        let mut top = TopK::new(3);
        for c in ["a", "b", "a", "c", "a", "b"] {
            top.add(c);
        }
        let counts: Vec<(String, u64, u64)> = top
            .top(5)
            .into_iter()
            .map(|e| (e.client, e.count, e.error))
            .collect();
        assert_eq!(
            counts,
            [("a".into(), 3, 0), ("b".into(), 2, 0), ("c".into(), 1, 0)]
        );
        top.add("d");
        let d = top.top(5).into_iter().find(|e| e.client == "d").unwrap();
        assert_eq!((d.count, d.error), (2, 1), "it takes the place of c");
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn clients(top: &[Entry]) -> Vec<&str> {
        top.iter().map(|e| e.client.as_str()).collect()
    }

    /// A client refused four minutes ago is gone; one refused within the minute is listed.
    #[test]
    fn only_the_last_minute_is_listed() {
        let mut top = Windowed::new(8);
        top.add(secs(1000), "old");
        top.add(secs(1000), "old");
        top.add(secs(1230), "recent");
        assert_eq!(clients(&top.top(secs(1240), 5)), ["recent"]);
        assert_eq!(clients(&top.top(secs(1010), 5)), ["old"]);
    }

    /// A refusal stays listed for 55 seconds at least and leaves before 60.
    #[test]
    fn a_refusal_leaves_between_55_and_60_seconds_later() {
        for at_ms in [100_000u64, 102_500, 104_999] {
            let mut top = Windowed::new(8);
            let at = Duration::from_millis(at_ms);
            top.add(at, "c");
            assert_eq!(
                top.top(at + secs(55) - Duration::from_millis(1), 1).len(),
                1
            );
            assert!(top.top(at + secs(60), 1).is_empty(), "{at_ms}");
        }
    }

    /// Counts add up over the slots of the window, and a slot is reused once it is a minute
    /// old.
    #[test]
    fn counts_add_over_slots_and_old_slots_are_reused() {
        let mut top = Windowed::new(4);
        for s in 0..60 {
            top.add(secs(s), "a");
        }
        assert_eq!(top.top(secs(59), 1)[0].count, 60);
        top.add(secs(60), "b");
        let now = top.top(secs(60), 2);
        assert_eq!((now[0].count, now[1].count), (55, 1), "{now:?}");
    }

    proptest::proptest! {
        /// Against exact counts of the last minute: each listed client was refused in it, its
        /// count is never too low, at most `error` too high, and `error` is at most N / k for
        /// N refusals in the window.
        #[test]
        fn counts_hold_their_bound_against_exact_counts(
            // (mostly short gaps, a few that leave slots a minute behind)
            steps in proptest::collection::vec(
                (proptest::prop_oneof![9 => 0u64..3000, 1 => 0u64..90_000], 0usize..12),
                1..600,
            ),
        ) {
            let k = 4;
            let mut top = Windowed::new(k);
            let mut seen: Vec<(Duration, String)> = Vec::new();
            let mut now = Duration::ZERO;
            for (gap_ms, c) in steps {
                now += Duration::from_millis(gap_ms);
                // (a skewed mix: low numbers come far more often)
                let client = format!("c{}", c * c / 12);
                top.add(now, &client);
                seen.push((now, client));
            }
            let from = (slot_of(now).saturating_sub(SLOTS - 1)) * SLOT.as_millis() as u64;
            let window: Vec<&String> = seen
                .iter()
                .filter(|(at, _)| at.as_millis() as u64 >= from)
                .map(|(_, c)| c)
                .collect();
            let n = window.len() as u64;
            for e in top.top(now, usize::MAX) {
                let truth = window.iter().filter(|c| ***c == e.client).count() as u64;
                proptest::prop_assert!(truth >= 1, "{:?} not refused in the window", e);
                proptest::prop_assert!(e.count >= truth, "{:?} < {}", e, truth);
                proptest::prop_assert!(e.count - e.error <= truth, "{:?} > {}", e, truth);
                proptest::prop_assert!(e.error <= n / k as u64, "{:?}, n = {}", e, n);
            }
        }
    }
}

//! The clients a limit refuses most, counted in fixed memory: the space-saving summary of
//! Metwally, Agrawal and El Abbadi ("Efficient Computation of Frequent and Top-k Elements in
//! Data Streams", 2005).
//!
//! It keeps `capacity` clients. A client already kept counts one more. A new client takes the
//! place of the one with the smallest count, and starts from that count plus one: its count may
//! be too high, by at most `error`, never too low. A client refused more often than one request
//! in `capacity` is always kept.

use std::collections::HashMap;

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
            entries: Vec::with_capacity(capacity),
            index: HashMap::with_capacity(capacity),
        }
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
}

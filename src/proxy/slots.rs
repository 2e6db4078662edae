//! Concurrency slots a request holds while it runs: taken by an `algorithm: concurrency`
//! limit or an upstream's `pace.concurrency`, and held until the response is finished — its
//! last body byte sent, its client gone (the body dropped), or its WebSocket tunnel closed.
//!
//! Each slot is a lease in the store. One renewer per instance ([`Holders`]) renews every slot
//! the instance holds, a batch per key, every third of the lease, and stops when none is held.
//! An instance that dies stops renewing, and its slots free themselves when their leases end.
//! Releases are sent on their own task: they never hold up a response.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Body;
use crate::body::{Observed, Observer};
use crate::limit::{Decision, Slots};
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};

/// How often the renewer looks for leases a third of the way through. The shortest lease is
/// 1 s, so a lease is renewed at most a third plus this late: well before it ends.
const RENEW_TICK: Duration = Duration::from_millis(100);

/// Every slot this instance holds, by key, and the renewer that keeps their leases.
pub struct Holders {
    store: Arc<dyn Store>,
    /// `tollgate_concurrency_held`
    metrics: Metrics,
    /// the first part of every holder id: random per instance (and per loaded config), so
    /// two instances never make the same id
    prefix: String,
    next: AtomicU64,
    /// (a std mutex: held only to add, remove or list ids, never across an `.await`)
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    groups: HashMap<String, Group>,
    /// the renewer task runs; it ends when no slot is held
    renewing: bool,
}

/// The slots held at one key.
struct Group {
    slots: Slots,
    holders: Vec<String>,
    renewed: Instant,
}

impl Holders {
    /// No slot held yet; slots are taken, renewed and released at `store`, and counted in
    /// `metrics`.
    pub fn new(store: Arc<dyn Store>, metrics: Metrics) -> Arc<Holders> {
        let mut random = std::collections::hash_map::RandomState::new().build_hasher();
        random.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        Arc::new(Holders {
            store,
            metrics,
            prefix: format!("{:016x}", random.finish()),
            next: AtomicU64::new(0),
            inner: Mutex::default(),
        })
    }

    /// Asks for a slot at `key`. Admitted, the slot is held in `held` until it is dropped.
    pub async fn acquire(
        self: &Arc<Self>,
        key: &str,
        slots: &Slots,
        held: &mut Held,
    ) -> Result<Decision, StoreError> {
        let holder = format!(
            "{}:{}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        // held before the store is asked: a request dropped while it waits for the answer (its
        // client gone) releases whatever the store took, and so does a call that timed out
        let slot = self.hold(key, *slots, holder);
        let decision = self.store.acquire(key, slots, &slot.holder, None).await?;
        if decision.allowed {
            held.slots.push(slot);
        } else {
            // a refusal took nothing: no release to send
            slot.disarm();
        }
        Ok(decision)
    }

    /// Registers `holder`'s slot for renewal, starting the renewer if it is not running.
    fn hold(self: &Arc<Self>, key: &str, slots: Slots, holder: String) -> Slot {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let group = inner.groups.entry(key.to_owned()).or_insert_with(|| Group {
            slots,
            holders: Vec::new(),
            renewed: Instant::now(),
        });
        group.holders.push(holder.clone());
        self.metrics.slot_held(true);
        if !inner.renewing {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                inner.renewing = true;
                runtime.spawn(renewer(self.clone()));
            }
        }
        Slot {
            holders: self.clone(),
            key: key.to_owned(),
            slots,
            holder,
        }
    }

    /// Forgets `holder`'s slot at `key`.
    fn forget(&self, key: &str, holder: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(group) = inner.groups.get_mut(key) {
            let before = group.holders.len();
            group.holders.retain(|h| h != holder);
            if group.holders.len() < before {
                self.metrics.slot_held(false);
            }
            if group.holders.is_empty() {
                inner.groups.remove(key);
            }
        }
    }

    /// The groups whose leases are a third through, marked renewed; `None` when nothing is
    /// held (the renewer then ends).
    fn due(&self) -> Option<Vec<(String, Slots, Vec<String>)>> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.groups.is_empty() {
            inner.renewing = false;
            return None;
        }
        let now = Instant::now();
        let due = inner
            .groups
            .iter_mut()
            .filter(|(_, g)| now.duration_since(g.renewed) >= g.slots.lease() / 3)
            .map(|(key, g)| {
                g.renewed = now;
                (key.clone(), g.slots, g.holders.clone())
            })
            .collect();
        Some(due)
    }
}

impl Holders {
    /// Marks the slots at `key` as due for renewal at the renewer's next tick.
    fn renew_soon(&self, key: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(group) = inner.groups.get_mut(key) {
            if let Some(earlier) = Instant::now().checked_sub(group.slots.lease()) {
                group.renewed = earlier;
            }
        }
    }
}

/// Renews the leases of every slot held, a batch per key, until none is held.
async fn renewer(holders: Arc<Holders>) {
    loop {
        tokio::time::sleep(RENEW_TICK).await;
        let Some(due) = holders.due() else {
            return;
        };
        // all at once: the store pipelines them, and one slow key must not make the others'
        // leases run out
        let holders = &holders;
        let renewals = due.iter().map(|(key, slots, ids)| async move {
            if let Err(e) = holders.store.renew(key, slots, ids, None).await {
                tracing::debug!(key, error = %e, "could not renew concurrency slots");
                // tried again at the next tick, not a third of a lease later
                holders.renew_soon(key);
            }
        });
        futures_util::future::join_all(renewals).await;
    }
}

/// One slot held: released when dropped.
struct Slot {
    holders: Arc<Holders>,
    key: String,
    slots: Slots,
    holder: String,
}

impl Slot {
    /// Forgets a slot the store never gave.
    fn disarm(mut self) {
        self.holders.forget(&self.key, &self.holder);
        self.holder.clear();
    }

    /// Stops renewing the slot; the key and id to release.
    fn let_go(&mut self) -> (Arc<dyn Store>, String, Slots, Vec<String>) {
        self.holders.forget(&self.key, &self.holder);
        let holder = std::mem::take(&mut self.holder);
        let store = self.holders.store.clone();
        (
            store,
            std::mem::take(&mut self.key),
            self.slots,
            vec![holder],
        )
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.holder.is_empty() {
            return;
        }
        let (store, key, slots, ids) = self.let_go();
        // (without a runtime the lease ends by itself)
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { release(&*store, &key, &slots, &ids).await });
        }
    }
}

async fn release(store: &dyn Store, key: &str, slots: &Slots, ids: &[String]) {
    if let Err(e) = store.release(key, slots, ids, None).await {
        tracing::debug!(key, error = %e, "could not release a concurrency slot");
    }
}

/// The slots one request holds; each is released when this is dropped.
#[derive(Default)]
pub struct Held {
    slots: Vec<Slot>,
}

impl Held {
    /// Whether no slot is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Adds the slots of `other`.
    pub fn join(&mut self, mut other: Held) {
        self.slots.append(&mut other.slots);
    }

    /// Releases every slot now and waits for the store: for a request refused by a later
    /// limit, whose client may ask again at once.
    pub async fn release(mut self) {
        for mut slot in std::mem::take(&mut self.slots) {
            let (store, key, slots, ids) = slot.let_go();
            release(&*store, &key, &slots, &ids).await;
        }
    }

    /// `body`, holding these slots until its last frame is read or it is dropped.
    pub fn around(self, body: Body) -> Body {
        if self.is_empty() {
            return body;
        }
        Body::new(Observed::new(body, self))
    }
}

/// A response body holds its request's slots until it ends or is dropped.
impl Observer<Body> for Held {
    fn end(&mut self) {
        // the last byte is out: the slots go now, not when the connection drops the body
        drop(std::mem::take(&mut self.slots));
    }
}

//! Concurrency slots behind the failure policy. An acquire goes through the breaker and
//! applies `on_error` as a check does, but never through the deny cache: a slot can free at
//! any moment, so a refusal must not be remembered. Renewals and releases go to the shared
//! store and to the `local` fallback both: a holder's id is unique, so the one that never saw
//! it finds nothing to do, and no one has to remember which store gave the slot. Releases skip
//! the breaker: one lost would leave its slot taken for a whole lease.

use super::{Caller, GuardedStore, OnError};
use crate::limit::{Decision, Millis, Slots};
use crate::store::StoreError;

impl GuardedStore {
    /// Takes a slot for `holder`, or applies `on_error` when the shared store cannot answer.
    pub(super) async fn take_slot(
        &self,
        key: &str,
        slots: &Slots,
        holder: &str,
        now: Option<Millis>,
    ) -> Result<Decision, StoreError> {
        let started = tokio::time::Instant::now();
        let shared = self
            .through_breaker(
                move || self.primary.acquire(key, slots, holder, now),
                Caller::Request,
            )
            .await;
        // (a call the breaker kept back is counted as skipped already)
        if let (Some(observer), false) = (
            &self.observer,
            matches!(shared, Err(StoreError::CircuitOpen)),
        ) {
            observer.call(started.elapsed(), shared.as_ref().err());
        }
        let error = match shared {
            Ok(d) => return Ok(d),
            Err(e) => e,
        };
        match self.on_error {
            OnError::Allow => {
                let free = u64::from(slots.limit.get()) - 1;
                Ok(Decision::slots(true, free, 0))
            }
            OnError::Deny => Err(error),
            OnError::Local => {
                let share = slots.share(self.instances);
                let mut d = self.local.take_slot(key, &share, holder, now);
                d.share = (self.instances.get() > 1).then_some(self.instances);
                if !d.allowed && matches!(error, StoreError::Timeout(_)) {
                    // Redis may have run the acquire after the time-out: a refused holder
                    // sends no release of its own, so one goes to Redis now
                    self.release_late(key, slots, holder);
                }
                Ok(d)
            }
        }
    }

    /// Renews (or, with `release`, frees) `holders`' slots in both stores: how many the
    /// shared store found, or the fallback when the shared one cannot answer.
    pub(super) async fn slots_count(
        &self,
        key: &str,
        slots: &Slots,
        holders: &[String],
        now: Option<Millis>,
        release: bool,
    ) -> Result<u64, StoreError> {
        let local = if release {
            self.local.free_slots(key, holders, now)
        } else {
            self.local.renew_slots(key, slots, holders, now)
        };
        let shared = if release {
            self.primary.release(key, slots, holders, now)
        } else {
            self.primary.renew(key, slots, holders, now)
        };
        // A release skips the breaker: a slot it leaves in Redis would stay taken, renewed by
        // no one, for a whole lease. The store's timeout still bounds it.
        let shared = if release {
            shared.await
        } else {
            self.through_breaker(move || shared, Caller::Uncounted)
                .await
        };
        match shared {
            Ok(n) => Ok(n),
            Err(_) if self.on_error == OnError::Local => Ok(local),
            Err(e) => Err(e),
        }
    }

    /// Releases `holder`'s slot at `key` in the shared store on a task of its own.
    fn release_late(&self, key: &str, slots: &Slots, holder: &str) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (primary, key, slots, holders) = (
            self.primary.clone(),
            key.to_owned(),
            *slots,
            vec![holder.to_owned()],
        );
        runtime.spawn(async move {
            let _ = primary.release(&key, &slots, &holders, None).await;
        });
    }
}

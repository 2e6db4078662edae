//! The lane's one timer for the deadlines of every call its driver holds.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use super::{Call, Slot, Waiting};

/// The lane's one timer: rings at (or before) the earliest deadline of the calls the driver
/// holds. Set later only when it rings, so a steady flow of calls, each due a timeout after
/// the one before, costs the timer wheel nothing per call.
pub(super) struct Alarm {
    sleep: Pin<Box<Sleep>>,
    at: Option<Instant>,
    /// whether the timer has been polled since it was set: it then holds the driver's waker
    /// (the driver is one task) and only its state need be read on later turns
    polled: bool,
}

impl Alarm {
    pub(super) fn new() -> Alarm {
        Alarm {
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            at: None,
            polled: false,
        }
    }

    /// Makes the alarm ring by `deadline`.
    pub(super) fn set(&mut self, deadline: Instant) {
        if self.at.is_none_or(|at| deadline < at) {
            self.sleep.as_mut().reset(deadline);
            self.at = Some(deadline);
            self.polled = false;
        }
    }

    pub(super) fn set_for(&mut self, calls: &[Call]) {
        for call in calls {
            self.set(call.slot.deadline);
        }
    }

    /// Waits until the alarm rings (for ever when it is not set).
    pub(super) async fn rung(&mut self) {
        poll_fn(|cx| {
            if self.at.is_none() {
                return Poll::Pending;
            }
            let rang = if self.polled {
                self.sleep.is_elapsed()
            } else {
                // Out of budget, the timer would answer Pending without registering (and
                // wake the task to be polled again): only a poll with budget counts.
                self.polled = tokio::task::coop::has_budget_remaining();
                self.sleep.as_mut().poll(cx).is_ready()
            };
            if rang {
                self.at = None;
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Answers every call past its deadline ([`Failure::Late`]): those not written yet leave
    /// `batch`, written ones keep their place in `waiting`. Sets the alarm for the rest. True
    /// when a written call is past its deadline: Redis is late with its reply.
    pub(super) fn expire(
        &mut self,
        batch: &mut Vec<Call>,
        waiting: &mut VecDeque<Waiting>,
    ) -> bool {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut keep = |slot: &mut Slot| match slot.expire(now) {
            Some(deadline) => {
                next = Some(next.map_or(deadline, |n| n.min(deadline)));
                true
            }
            None => false,
        };
        batch.retain_mut(|call| keep(&mut call.slot));
        let mut overdue = false;
        let mut written = |slot: &mut Slot| {
            overdue |= slot.deadline <= now;
            keep(slot);
        };
        for waiting in waiting.iter_mut() {
            match waiting {
                Waiting::One(slot) => written(slot),
                Waiting::Joined(calls, _) | Waiting::Keys(calls) => {
                    calls.iter_mut().for_each(|c| written(&mut c.slot));
                }
                Waiting::Nobody => {}
            }
        }
        if let Some(next) = next {
            self.set(next);
        }
        overdue
    }
}

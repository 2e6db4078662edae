//! Concurrency slots on Redis: the calls of `lua/concurrency.lua` that name holders. Kept
//! apart from the checks: their arguments are text of any length, and they are never joined.

use super::RedisStore;
use crate::limit::{Algorithm, Decision, Millis, Slots};
use crate::store::reply::{self, Reply};
use crate::store::resp::Value;
use crate::store::scripts::SlotsOp;
use crate::store::StoreError;

impl RedisStore {
    /// Takes a slot for `holder`: `{admitted, free, wait_ms, held}` as a decision.
    pub(super) async fn take_slot(
        &self,
        key: &str,
        s: &Slots,
        holder: &str,
        now: Option<Millis>,
    ) -> Result<Decision, StoreError> {
        let call = self.scripts.slots(key, SlotsOp::Acquire, s, &[holder], now);
        reply::decode_reply(&Algorithm::Concurrency(*s), &self.invoke(call).await?)
    }

    /// Renews or releases the slots of `holders`: how many held one.
    pub(super) async fn slots_count(
        &self,
        key: &str,
        op: SlotsOp,
        s: &Slots,
        holders: &[String],
        now: Option<Millis>,
    ) -> Result<u64, StoreError> {
        let holders: Vec<&str> = holders.iter().map(String::as_str).collect();
        let call = self.scripts.slots(key, op, s, &holders, now);
        match self.invoke(call).await? {
            Reply::Value(Value::Int(n)) => Ok(u64::try_from(n).unwrap_or(0)),
            other => Err(StoreError::Reply {
                script: "concurrency",
                detail: format!("expected an integer, got {other:?}"),
            }),
        }
    }
}

//! Concurrency slots on Redis: the calls of `lua/concurrency.lua` that name holders. Kept
//! apart from the checks: their arguments are text of any length, and they are never joined.

use ::redis::Value;

use super::{invoke, Conn, RedisStore};
use crate::limit::{Algorithm, Decision, Millis, Slots};
use crate::store::pipe;
use crate::store::reply::{self, Reply};
use crate::store::scripts::{SlotsCall, SlotsOp};
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
        reply::decode_reply(&Algorithm::Concurrency(*s), &self.invoke_slots(call).await?)
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
        match self.invoke_slots(call).await? {
            Reply::Value(Value::Int(n)) => Ok(u64::try_from(n).unwrap_or(0)),
            other => Err(StoreError::Reply {
                script: "concurrency",
                detail: format!("expected an integer, got {other:?}"),
            }),
        }
    }

    /// One call on the key's connection, bounded by the timeout; sent again with the body
    /// after `NOSCRIPT`, as [`RedisStore::invoke`] does.
    async fn invoke_slots(&self, call: SlotsCall<'_>) -> Result<Reply, StoreError> {
        match &self.conn {
            Conn::Pipe(p) => {
                let deadline = tokio::time::Instant::now() + self.timeout;
                let mut command = Vec::with_capacity(192);
                call.encode(&mut command, false);
                let answer = match p.call(command, None, deadline).await {
                    Err(e) if pipe::is_noscript(&e) => {
                        let mut command = Vec::new();
                        call.encode(&mut command, true);
                        p.call(command, None, deadline).await
                    }
                    answer => answer,
                };
                self.answered(answer)
            }
            Conn::Client(client) => self
                .bounded(invoke(client.clone(), call.invocation()))
                .await
                .map(Reply::Value),
        }
    }
}

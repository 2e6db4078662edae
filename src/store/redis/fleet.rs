//! The fleet's figures on Redis: the calls of `lua/fleet.lua`, which keep every instance's last
//! publication under two keys of one hash tag, so one call works on a Redis Cluster.

use super::RedisStore;
use crate::store::reply::Reply;
use crate::store::resp::Value;
use crate::store::scripts::FleetOp;
use crate::store::{Fleet, Published, StoreError};

impl RedisStore {
    /// Publishes `blob` as instance `id`'s figures: how many instances are kept, 0 when this
    /// one was not (the fleet is full). A blob over the bound is refused here: Redis would
    /// refuse it too, with an error that reads as an outage.
    pub(super) async fn publish_fleet(
        &self,
        key: &str,
        id: &str,
        blob: &[u8],
    ) -> Result<u64, StoreError> {
        if let Some(e) = crate::store::over_fleet_bound(blob) {
            return Err(e);
        }
        let call = self.scripts.fleet(key, FleetOp::Publish { id, blob });
        match self.invoke(call).await? {
            Reply::Value(Value::Int(n)) => Ok(u64::try_from(n).unwrap_or(0)),
            other => Err(bad(format!("expected an integer, got {other:?}"))),
        }
    }

    /// The instances that published within the fleet's bound.
    pub(super) async fn read_fleet(&self, key: &str) -> Result<Fleet, StoreError> {
        match self.invoke(self.scripts.fleet(key, FleetOp::Read)).await? {
            Reply::Value(Value::Array(items)) => decode(items),
            other => Err(bad(format!("expected an array, got {other:?}"))),
        }
    }
}

/// `{now_ms, id, seen_ms, blob, ...}` as a [`Fleet`].
fn decode(items: Vec<Value>) -> Result<Fleet, StoreError> {
    let mut items = items.into_iter();
    let now_ms = number(items.next())?;
    let mut instances = Vec::new();
    while let Some(id) = items.next() {
        let Value::Bulk(id) = id else {
            return Err(bad(format!("expected an id, got {id:?}")));
        };
        let seen_ms = number(items.next())?;
        let Some(Value::Bulk(blob)) = items.next() else {
            return Err(bad("an instance without its blob".to_owned()));
        };
        instances.push(Published {
            id: String::from_utf8_lossy(&id).into_owned(),
            seen_ms,
            blob,
        });
    }
    Ok(Fleet { now_ms, instances })
}

/// A time in ms, sent as text (a sorted set's score may carry a fraction).
fn number(value: Option<Value>) -> Result<u64, StoreError> {
    let text = match &value {
        Some(Value::Bulk(bytes)) => std::str::from_utf8(bytes).ok(),
        _ => None,
    };
    text.and_then(|t| t.parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .map(|ms| ms as u64)
        .ok_or_else(|| bad(format!("expected a time in ms, got {value:?}")))
}

fn bad(detail: String) -> StoreError {
    StoreError::Reply {
        script: "fleet",
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The read's reply becomes the fleet; a malformed one is an error, never a panic.
    #[test]
    fn decodes_the_read() {
        let bulk = |s: &str| Value::Bulk(s.as_bytes().to_vec());
        let fleet = decode(vec![
            bulk("1700000001000"),
            bulk("a"),
            bulk("1700000000500"),
            bulk("{}"),
        ])
        .unwrap();
        assert_eq!(fleet.now_ms, 1_700_000_001_000);
        assert_eq!(fleet.instances.len(), 1);
        assert_eq!(fleet.instances[0].id, "a");
        assert_eq!(fleet.instances[0].seen_ms, 1_700_000_000_500);
        assert_eq!(fleet.instances[0].blob, b"{}");
        assert!(decode(vec![bulk("1"), bulk("a"), bulk("2")]).is_err());
        assert!(decode(vec![bulk("x")]).is_err());
        assert!(decode(Vec::new()).is_err());
        assert_eq!(decode(vec![bulk("5")]).unwrap().instances.len(), 0);
    }
}

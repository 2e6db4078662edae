//! The slot map of a Redis Cluster: which primary serves each of the 16 384 slots, read from
//! `CLUSTER SHARDS` (Redis 7) or `CLUSTER SLOTS` (older servers), and the slot of a key.

use crate::store::resp::Value;

/// The number of hash slots in a Redis Cluster.
pub(crate) const SLOTS: usize = 16_384;

/// The slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag (the first `{...}` with
/// something inside), modulo 16 384. tollgate's keys never carry a client's braces.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS as u16
}

fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0, |crc, &byte| {
        (crc << 8) ^ CRC16[usize::from((crc >> 8) as u8 ^ byte)]
    })
}

/// CRC16 (XMODEM, polynomial 0x1021) of each byte value, a byte at a time.
const CRC16: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// A primary and the slot ranges it serves, as the cluster described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shard {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// inclusive ranges
    pub(crate) ranges: Vec<(u16, u16)>,
}

/// The shards in a `CLUSTER SHARDS` reply: for each shard, its primary that is not failed.
/// `tls` takes a node's `tls-port` instead of its `port`.
pub(crate) fn from_shards(reply: &Value, tls: bool) -> Result<Vec<Shard>, &'static str> {
    let Value::Array(shards) = reply else {
        return Err("CLUSTER SHARDS did not answer a list");
    };
    let mut out = Vec::with_capacity(shards.len());
    for shard in shards {
        let ranges = field(shard, "slots").ok_or("a shard without slots")?;
        let Value::Array(bounds) = ranges else {
            return Err("a shard's slots are not a list");
        };
        let ranges = pairs(bounds)?;
        if ranges.is_empty() {
            continue; // a shard that serves no slot (a new node, or one being emptied)
        }
        let Some(Value::Array(nodes)) = field(shard, "nodes") else {
            return Err("a shard without nodes");
        };
        let primary = nodes.iter().find(|node| {
            text(field(node, "role")) == Some("master")
                && text(field(node, "health")) != Some("fail")
        });
        let Some(node) = primary else {
            continue; // no primary: its slots stay uncovered until one is promoted
        };
        // (a node that has met no other does not know its own address: an empty host, which
        // the caller takes to be the node it asked)
        let host = match text(field(node, "endpoint")) {
            Some(endpoint) if !endpoint.is_empty() && endpoint != "?" => endpoint,
            _ => text(field(node, "ip")).unwrap_or_default(),
        };
        let port = field(node, if tls { "tls-port" } else { "port" })
            .or_else(|| field(node, "port"))
            .and_then(int)
            .and_then(|p| u16::try_from(p).ok())
            .ok_or("a node without a port")?;
        out.push(Shard {
            host: host.to_owned(),
            port,
            ranges,
        });
    }
    Ok(out)
}

/// The shards in a `CLUSTER SLOTS` reply: `[start, end, [host, port, id], replicas...]` per
/// range.
pub(crate) fn from_slots(reply: &Value) -> Result<Vec<Shard>, &'static str> {
    let Value::Array(ranges) = reply else {
        return Err("CLUSTER SLOTS did not answer a list");
    };
    let mut out: Vec<Shard> = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err("a slot range is not a list");
        };
        let (Some(start), Some(end), Some(Value::Array(primary))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            return Err("a slot range without its primary");
        };
        let bounds = pairs(&[start.clone(), end.clone()])?;
        let host = primary.first().and_then(|v| text(Some(v)));
        let port = primary
            .get(1)
            .and_then(int)
            .and_then(|p| u16::try_from(p).ok());
        let (Some(host), Some(port)) = (host, port) else {
            return Err("a primary without an address");
        };
        match out.iter_mut().find(|s| s.host == host && s.port == port) {
            Some(shard) => shard.ranges.extend(bounds),
            None => out.push(Shard {
                host: host.to_owned(),
                port,
                ranges: bounds,
            }),
        }
    }
    Ok(out)
}

/// `[start, end, start, end, ...]` as inclusive ranges inside the slot space.
fn pairs(bounds: &[Value]) -> Result<Vec<(u16, u16)>, &'static str> {
    if !bounds.len().is_multiple_of(2) {
        return Err("slot bounds do not pair up");
    }
    bounds
        .chunks(2)
        .map(|pair| {
            let bound = |v: &Value| {
                int(v)
                    .and_then(|n| u16::try_from(n).ok())
                    .filter(|&n| usize::from(n) < SLOTS)
            };
            match (bound(&pair[0]), bound(&pair[1])) {
                (Some(a), Some(b)) if a <= b => Ok((a, b)),
                _ => Err("a slot range out of bounds"),
            }
        })
        .collect()
}

/// The value after `name` in a flat `[name, value, ...]` list.
fn field<'v>(list: &'v Value, name: &str) -> Option<&'v Value> {
    let Value::Array(items) = list else {
        return None;
    };
    items
        .chunks(2)
        .find(|pair| text(pair.first()) == Some(name))
        .and_then(|pair| pair.get(1))
}

fn text(value: Option<&Value>) -> Option<&str> {
    match value? {
        Value::Bulk(bytes) => std::str::from_utf8(bytes).ok(),
        Value::Status(text) => Some(text),
        _ => None,
    }
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::Bulk(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::Bulk(s.as_bytes().to_vec())
    }

    fn list(items: Vec<Value>) -> Value {
        Value::Array(items)
    }

    /// The values `CLUSTER KEYSLOT` gives for these keys.
    #[test]
    fn slots_are_the_servers() {
        assert_eq!(slot(b"123456789"), 12_739);
        assert_eq!(slot(b"foo"), 12_182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"), "an empty tag is no tag");
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b""), 0);
    }

    fn node(role: &str, health: &str, port: i64) -> Value {
        list(vec![
            bulk("id"),
            bulk("abc"),
            bulk("port"),
            Value::Int(port),
            bulk("tls-port"),
            Value::Int(port + 1000),
            bulk("ip"),
            bulk("10.0.0.1"),
            bulk("endpoint"),
            bulk("10.0.0.1"),
            bulk("role"),
            bulk(role),
            bulk("health"),
            bulk(health),
        ])
    }

    #[test]
    fn shards_name_the_healthy_primary() {
        let reply = list(vec![
            list(vec![
                bulk("slots"),
                list(vec![
                    Value::Int(0),
                    Value::Int(99),
                    Value::Int(200),
                    Value::Int(300),
                ]),
                bulk("nodes"),
                list(vec![
                    node("master", "fail", 7000),
                    node("replica", "online", 7003),
                ]),
            ]),
            list(vec![
                bulk("slots"),
                list(vec![Value::Int(100), Value::Int(199)]),
                bulk("nodes"),
                list(vec![
                    node("replica", "online", 7004),
                    node("master", "online", 7001),
                ]),
            ]),
            list(vec![
                bulk("slots"),
                list(vec![]),
                bulk("nodes"),
                list(vec![node("master", "online", 7002)]),
            ]),
        ]);
        let shards = from_shards(&reply, false).unwrap();
        assert_eq!(
            shards,
            [Shard {
                host: "10.0.0.1".into(),
                port: 7001,
                ranges: vec![(100, 199)],
            }],
            "a failed primary's shard is left uncovered, an empty one out"
        );
        assert_eq!(from_shards(&reply, true).unwrap()[0].port, 8001);
    }

    #[test]
    fn slots_group_ranges_by_primary() {
        let range = |a, b, port| {
            list(vec![
                Value::Int(a),
                Value::Int(b),
                list(vec![bulk("h"), Value::Int(port), bulk("id")]),
                list(vec![bulk("r"), Value::Int(port + 3), bulk("id2")]),
            ])
        };
        let reply = list(vec![
            range(0, 10, 7000),
            range(11, 20, 7001),
            range(21, 30, 7000),
        ]);
        let shards = from_slots(&reply).unwrap();
        assert_eq!(shards.len(), 2);
        assert_eq!(shards[0].ranges, [(0, 10), (21, 30)]);
        assert_eq!(shards[1].port, 7001);
    }

    #[test]
    fn bad_replies_are_errors() {
        assert!(from_shards(&Value::Int(1), false).is_err());
        assert!(from_slots(&list(vec![list(vec![Value::Int(0)])])).is_err());
        let out_of_bounds = list(vec![list(vec![
            Value::Int(0),
            Value::Int(16_384),
            list(vec![bulk("h"), Value::Int(1)]),
        ])]);
        assert!(from_slots(&out_of_bounds).is_err());
    }
}

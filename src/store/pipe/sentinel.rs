//! The master that Redis Sentinels name (`store.sentinel`): asked for each new connection, so
//! a failover is followed by the next connection made after the old one breaks.
//!
//! The Sentinels are asked in turn, starting with the one that answered last, each for a
//! share of the connect timeout, so one that hangs leaves time for the others. The node they
//! name must then answer `ROLE` as master: until every Sentinel has seen a failover, one may
//! still name the old master, restarted as a replica. A connection whose master is demoted
//! without closing it gets `READONLY` to its first write, which breaks it ([`super::serve`]).

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use ::redis::{RedisError, Value};

use super::{auth, exchange, tcp, words, Endpoint, Tls};

/// One Sentinel, with the user and password it asks for, if any.
#[derive(Debug, Clone)]
pub(crate) struct Sentinel {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

/// The Sentinels that watch one master.
#[derive(Debug)]
pub(crate) struct Sentinels {
    master_name: String,
    nodes: Vec<Sentinel>,
    /// the node asked first: the one that answered last
    first: AtomicUsize,
    /// the master last connected to, so that a move is logged once, not once per lane
    master: Mutex<Option<(String, u16)>>,
}

impl Sentinels {
    /// The Sentinels `nodes` (at least one), watching the master called `master_name`.
    pub(crate) fn new(master_name: String, nodes: Vec<Sentinel>) -> Sentinels {
        Sentinels {
            master_name,
            nodes,
            first: AtomicUsize::new(0),
            master: Mutex::new(None),
        }
    }

    /// The master's address, from the first Sentinel that knows it.
    pub(crate) async fn master(&self, endpoint: &Endpoint) -> Result<(String, u16), RedisError> {
        // a share each, and one left for connecting to the master
        let share = endpoint.connect_timeout / (self.nodes.len() as u32 + 1);
        let start = self.first.load(Ordering::Relaxed);
        let mut failures = Vec::with_capacity(self.nodes.len());
        for i in 0..self.nodes.len() {
            let at = (start + i) % self.nodes.len();
            let node = &self.nodes[at];
            let asked = tokio::time::timeout(share, self.ask(node, endpoint.tls.as_ref())).await;
            match asked {
                Ok(Ok(master)) => {
                    self.first.store(at, Ordering::Relaxed);
                    return Ok(master);
                }
                Ok(Err(e)) => failures.push(format!("{}:{}: {e}", node.host, node.port)),
                Err(_) => failures.push(format!(
                    "{}:{}: no answer within {share:?}",
                    node.host, node.port
                )),
            }
        }
        Err(RedisError::from(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!(
                "no Sentinel named the master {:?}: {}",
                self.master_name,
                failures.join("; ")
            ),
        )))
    }

    /// `SENTINEL get-master-addr-by-name` on one Sentinel.
    async fn ask(&self, node: &Sentinel, tls: Option<&Tls>) -> Result<(String, u16), RedisError> {
        let mut stream = tcp(&node.host, node.port, tls).await?;
        let mut commands = auth(node.username.as_deref(), node.password.as_deref());
        commands.push(words(&[
            b"SENTINEL",
            b"get-master-addr-by-name",
            self.master_name.as_bytes(),
        ]));
        let replies = exchange(&mut stream, &commands).await?;
        match replies.last() {
            Some(Value::Array(parts)) if parts.len() == 2 => {
                let host = text(&parts[0]);
                let port = text(&parts[1]).and_then(|p| p.parse().ok());
                match (host, port) {
                    (Some(host), Some(port)) => Ok((host, port)),
                    _ => Err(unexpected(&replies)),
                }
            }
            Some(Value::Nil) => Err(RedisError::from(io::Error::new(
                io::ErrorKind::NotFound,
                format!("it watches no master named {:?}", self.master_name),
            ))),
            _ => Err(unexpected(&replies)),
        }
    }

    /// Notes the master connected to; the first one, and each move, is logged once.
    pub(crate) fn connected(&self, host: &str, port: u16) {
        let mut master = self.master.lock().unwrap_or_else(|e| e.into_inner());
        if master
            .as_ref()
            .is_some_and(|(h, p)| h == host && *p == port)
        {
            return;
        }
        let now = format!("{host}:{port}");
        match master.replace((host.to_owned(), port)) {
            None => tracing::info!(master_name = %self.master_name, master = %now,
                "redis sentinel: connected to the master"),
            Some((h, p)) => tracing::warn!(master_name = %self.master_name,
                was = %format!("{h}:{p}"), master = %now,
                "redis sentinel: the master has moved; the store follows it"),
        }
    }
}

/// An error unless `reply` (to `ROLE`) says the node is a master.
pub(crate) fn check_role(reply: Option<&Value>, host: &str, port: u16) -> Result<(), RedisError> {
    let role = match reply {
        Some(Value::Array(parts)) => parts.first().and_then(text),
        _ => None,
    };
    match role.as_deref() {
        Some("master") => Ok(()),
        other => Err(RedisError::from(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!(
                "the Sentinels named {host}:{port} as master, but it answers ROLE {} \
                 (a failover under way)",
                other.unwrap_or("(none)")
            ),
        ))),
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn unexpected(replies: &[Value]) -> RedisError {
    RedisError::from(io::Error::other(format!(
        "an answer that is no address: {:?}",
        replies.last()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only `ROLE`'s `master` passes; a replica's answer names its role.
    #[test]
    fn only_a_master_passes() {
        let role = |r: &str| Value::Array(vec![Value::BulkString(r.into()), Value::Int(0)]);
        assert!(check_role(Some(&role("master")), "h", 1).is_ok());
        let e = check_role(Some(&role("slave")), "10.0.0.2", 6379).unwrap_err();
        assert!(
            e.to_string().contains("10.0.0.2:6379") && e.to_string().contains("ROLE slave"),
            "{e}"
        );
        assert!(check_role(None, "h", 1).is_err());
    }
}

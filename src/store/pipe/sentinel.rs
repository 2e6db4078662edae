//! The master that Redis Sentinels name (`store.sentinel`), and how the store's lanes follow it
//! when it moves, whether it died or hangs.
//!
//! Every Sentinel is asked at once (`SENTINEL get-master-addr-by-name`, with the master's
//! `config-epoch`); the answer with the highest epoch wins, as it does among the Sentinels
//! themselves, so one that has not yet heard of a failover is outvoted by the one that made it.
//! A node is trusted only when it answers `ROLE` as master **and** the Sentinels, asked again
//! after that answer, still name it: a master that hung (a long fork, `DEBUG SLEEP`, a swapping
//! host) was replaced while it slept, and wakes up still calling itself master.
//!
//! The master last named is shared with every lane ([`Follow`]). It changes when a connection
//! asks, and at once when a Sentinel publishes `+switch-master` ([`listen`]); a lane whose
//! connection is on another node then drops it, so nothing more is written to a demoted master.
//! A lane whose call times out drops its connection too ([`super::serve`]), so the next
//! call asks the Sentinels again rather than wait on a node that hangs.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::store::resp::{Error, Value};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{auth, exchange, tcp, words, Tls};

mod listen;

/// How long an answer from a lower `config-epoch` than the master named last is refused: long
/// enough to outlast a lane that asked just before a failover, short enough that Sentinels whose
/// state was wiped (epochs start again from 0) are followed.
const NEWER_WINS_FOR: Duration = Duration::from_secs(10);

/// One Sentinel, with the user and password it asks for, if any.
#[derive(Debug, Clone)]
pub(crate) struct Sentinel {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

/// A master as the Sentinels name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Named {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// the Sentinels' `config-epoch` for it: a failover raises it
    pub(crate) epoch: u64,
}

impl Named {
    fn is(&self, host: &str, port: u16) -> bool {
        self.host == host && self.port == port
    }
}

/// The Sentinels that watch one master.
#[derive(Debug)]
pub(crate) struct Sentinels {
    master_name: Arc<str>,
    nodes: Vec<Sentinel>,
    /// the master named last, and when; the lanes watch it to leave a master that was replaced
    named: watch::Sender<Option<(Named, Instant)>>,
    /// whether the `+switch-master` listeners run (started by the first lane that connects)
    listening: AtomicBool,
    /// the master last connected to, so that a move is logged once, not once per lane
    master: Mutex<Option<(String, u16)>>,
}

impl Sentinels {
    /// The Sentinels `nodes` (at least one), watching the master called `master_name`.
    pub(crate) fn new(master_name: String, nodes: Vec<Sentinel>) -> Sentinels {
        Sentinels {
            master_name: master_name.into(),
            nodes,
            named: watch::Sender::new(None),
            listening: AtomicBool::new(false),
            master: Mutex::new(None),
        }
    }

    /// The master the Sentinels name now: every Sentinel is asked at once, each for up to
    /// `within`; the highest `config-epoch` among those that answered wins.
    pub(crate) async fn master(&self, tls: Option<&Tls>, within: Duration) -> Result<Named, Error> {
        let mut asking = JoinSet::new();
        for node in &self.nodes {
            let (node, name, tls) = (node.clone(), self.master_name.clone(), tls.cloned());
            asking.spawn(async move {
                let asked = tokio::time::timeout(within, ask(&node, &name, tls.as_ref())).await;
                let asked = asked
                    .unwrap_or_else(|_| Err(format!("no answer within {within:?}").into_error()));
                (node, asked)
            });
        }
        let (mut answers, mut failures) = (Vec::new(), Vec::new());
        while let Some(joined) = asking.join_next().await {
            match joined {
                Ok((_, Ok(named))) => answers.push(named),
                Ok((node, Err(e))) => failures.push(format!("{}:{}: {e}", node.host, node.port)),
                Err(e) => failures.push(e.to_string()),
            }
        }
        agreed(&answers).map_err(|why| {
            let why = if answers.is_empty() {
                failures.join("; ")
            } else {
                why
            };
            format!(
                "no master {:?} from the Sentinels: {why}",
                &*self.master_name
            )
            .into_error()
        })
    }

    /// Asks the Sentinels and makes what they name the master named last (see
    /// [`Sentinels::name`]).
    pub(crate) async fn refresh(&self, tls: Option<&Tls>, within: Duration) {
        match self.master(tls, within).await {
            Ok(named) => {
                self.name(&named);
            }
            Err(e) => tracing::debug!(error = %e, "redis sentinel: asking again failed"),
        }
    }

    /// Makes `named` the master named last, which moves every lane connected elsewhere. False
    /// (and nothing changes) when another node was named at a higher epoch in the last
    /// [`NEWER_WINS_FOR`]: `named` is then an answer from before a failover.
    pub(crate) fn name(&self, named: &Named) -> bool {
        let now = Instant::now();
        let mut taken = true;
        self.named.send_if_modified(|last| match last {
            Some((l, at)) if l.is(&named.host, named.port) => {
                let moved = l.epoch != named.epoch;
                *l = named.clone();
                *at = now;
                moved
            }
            Some((l, at)) if l.epoch > named.epoch && now < *at + NEWER_WINS_FOR => {
                taken = false;
                false
            }
            _ => {
                *last = Some((named.clone(), now));
                true
            }
        });
        taken
    }

    /// A watch on the master named last, for one lane.
    pub(crate) fn follow(&self) -> Follow {
        Follow {
            named: Some(self.named.subscribe()),
            at: None,
        }
    }

    /// Starts listening for `+switch-master` on every Sentinel, once; the listeners stop when
    /// the Sentinels are dropped.
    pub(crate) fn listen(self: &Arc<Self>, tls: Option<&Tls>, timeout: Duration) {
        if self.listening.swap(true, Ordering::AcqRel) {
            return;
        }
        for at in 0..self.nodes.len() {
            let weak = Arc::downgrade(self);
            tokio::spawn(listen::listen(weak, at, tls.cloned(), timeout));
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

/// What one lane watches to leave a master the Sentinels no longer name. A lane on a plain
/// address watches nothing.
pub(crate) struct Follow {
    named: Option<watch::Receiver<Option<(Named, Instant)>>>,
    /// the node the lane is on (or about to connect to)
    at: Option<(String, u16)>,
}

impl Follow {
    /// A watch that never fires, for an address that does not move.
    pub(crate) fn fixed() -> Follow {
        Follow {
            named: None,
            at: None,
        }
    }

    /// Whether the lane follows Sentinels (then a timed-out call drops the connection).
    pub(crate) fn is_sentinel(&self) -> bool {
        self.named.is_some()
    }

    /// The lane is on `at` now (`None`: connecting to whatever is named now).
    pub(crate) fn on(&mut self, at: Option<&Named>) {
        let Some(named) = self.named.as_mut() else {
            return;
        };
        let now = named.borrow_and_update();
        self.at = at
            .or(now.as_ref().map(|(n, _)| n))
            .map(|n| (n.host.clone(), n.port));
        // named anew since the lane's connection was checked: it moves at once
        let behind = match (now.as_ref(), self.at.as_ref()) {
            (Some((n, _)), Some((host, port))) => !n.is(host, *port),
            _ => false,
        };
        drop(now);
        if behind {
            named.mark_changed();
        }
    }

    /// Returns when the Sentinels name another node than the lane's; never for a plain address.
    pub(crate) async fn moved(&mut self) {
        let Some(named) = self.named.as_mut() else {
            return std::future::pending().await;
        };
        loop {
            if named.changed().await.is_err() {
                return std::future::pending().await;
            }
            let now = named.borrow_and_update();
            if let (Some((n, _)), Some((host, port))) = (now.as_ref(), self.at.as_ref()) {
                if !n.is(host, *port) {
                    return;
                }
            }
        }
    }
}

/// `SENTINEL get-master-addr-by-name` and the master's `config-epoch`, on one Sentinel.
async fn ask(node: &Sentinel, name: &str, tls: Option<&Tls>) -> Result<Named, Error> {
    let mut stream = tcp(&node.host, node.port, tls).await?;
    let mut commands = auth(node.username.as_deref(), node.password.as_deref());
    commands.push(words(&[
        b"SENTINEL",
        b"get-master-addr-by-name",
        name.as_bytes(),
    ]));
    commands.push(words(&[b"SENTINEL", b"master", name.as_bytes()]));
    let replies = exchange(&mut stream, &commands).await?;
    let [.., addr, master] = replies.as_slice() else {
        return Err(unexpected(replies.last()));
    };
    let Value::Array(parts) = addr else {
        return Err(format!("it watches no master named {name:?}").into_error());
    };
    let host = parts.first().and_then(text);
    let port = parts.get(1).and_then(text).and_then(|p| p.parse().ok());
    let (Some(host), Some(port)) = (host, port) else {
        return Err(unexpected(Some(addr)));
    };
    let epoch = field(master, "config-epoch")
        .and_then(|e| e.parse().ok())
        .ok_or_else(|| unexpected(Some(master)))?;
    Ok(Named { host, port, epoch })
}

/// The master named in `answers`: the one of the highest epoch, if those of that epoch agree.
fn agreed(answers: &[Named]) -> Result<Named, String> {
    let newest = answers
        .iter()
        .max_by_key(|n| n.epoch)
        .ok_or("no Sentinel answered")?;
    let split = answers
        .iter()
        .filter(|n| n.epoch == newest.epoch)
        .find(|n| !n.is(&newest.host, newest.port));
    match split {
        None => Ok(newest.clone()),
        Some(other) => Err(format!(
            "the Sentinels disagree at epoch {}: {}:{} or {}:{} (a failover under way)",
            newest.epoch, newest.host, newest.port, other.host, other.port
        )),
    }
}

/// An error unless `reply` (to `ROLE`) says the node is a master.
pub(crate) fn check_role(reply: Option<&Value>, host: &str, port: u16) -> Result<(), Error> {
    let role = match reply {
        Some(Value::Array(parts)) => parts.first().and_then(text),
        _ => None,
    };
    match role.as_deref() {
        Some("master") => Ok(()),
        other => Err(format!(
            "the Sentinels named {host}:{port} as master, but it answers ROLE {} \
             (a failover under way)",
            other.unwrap_or("(none)")
        )
        .into_error()),
    }
}

/// The value after `name` in a flat list of names and values (`SENTINEL master`).
fn field(reply: &Value, name: &str) -> Option<String> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let at = parts
        .iter()
        .step_by(2)
        .position(|p| text(p).as_deref() == Some(name))?;
    parts.get(at * 2 + 1).and_then(text)
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::Bulk(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::Status(s) => Some(s.clone()),
        _ => None,
    }
}

fn unexpected(reply: Option<&Value>) -> Error {
    Error::from(io::Error::other(format!(
        "an answer that is no address: {reply:?}"
    )))
}

/// A Sentinel problem as an I/O error of kind `ConnectionRefused`: the store is out, for the
/// breaker and the error metrics, as when Redis refuses a connection.
trait IntoError {
    fn into_error(self) -> Error;
}

impl IntoError for String {
    fn into_error(self) -> Error {
        Error::io(io::ErrorKind::ConnectionRefused, self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(port: u16, epoch: u64) -> Named {
        Named {
            host: "10.0.0.1".into(),
            port,
            epoch,
        }
    }

    /// Only `ROLE`'s `master` passes; a replica's answer names its role.
    #[test]
    fn only_a_master_passes() {
        let role = |r: &str| Value::Array(vec![Value::Bulk(r.into()), Value::Int(0)]);
        assert!(check_role(Some(&role("master")), "h", 1).is_ok());
        let e = check_role(Some(&role("slave")), "10.0.0.2", 6379).unwrap_err();
        assert!(
            e.to_string().contains("10.0.0.2:6379") && e.to_string().contains("ROLE slave"),
            "{e}"
        );
        assert!(check_role(None, "h", 1).is_err());
    }

    /// The highest epoch wins over Sentinels that have not seen the failover; two answers of
    /// the same epoch that name different nodes are no answer.
    #[test]
    fn the_newest_epoch_wins_and_a_split_is_refused() {
        let a = agreed(&[named(1, 3), named(2, 4), named(1, 3)]).unwrap();
        assert_eq!(a, named(2, 4));
        assert!(agreed(&[named(1, 4), named(2, 4)]).is_err());
        assert!(agreed(&[]).is_err());
    }

    /// An answer from before a failover does not move the lanes back; the same node at any
    /// epoch, or a newer one, is taken.
    #[tokio::test]
    async fn an_older_epoch_does_not_undo_a_failover() {
        let s = Sentinels::new("m".into(), Vec::new());
        let mut follow = s.follow();
        assert!(s.name(&named(1, 3)));
        follow.on(None);
        assert!(s.name(&named(2, 4)));
        tokio::time::timeout(Duration::from_secs(1), follow.moved())
            .await
            .expect("the lane on :1 moves");
        assert!(!s.name(&named(1, 3)), "an answer from before the failover");
        assert!(s.name(&named(2, 4)));
        // a lane whose connection was checked just before the move still moves
        follow.on(Some(&named(1, 3)));
        tokio::time::timeout(Duration::from_secs(1), follow.moved())
            .await
            .expect("a lane behind the master named moves at once");
    }

    /// `config-epoch` is read from the flat reply of `SENTINEL master`.
    #[test]
    fn reads_a_field_of_a_flat_reply() {
        let bulk = |s: &str| Value::Bulk(s.as_bytes().to_vec());
        let reply = Value::Array(vec![
            bulk("name"),
            bulk("m"),
            bulk("config-epoch"),
            bulk("7"),
        ]);
        assert_eq!(field(&reply, "config-epoch").as_deref(), Some("7"));
        assert_eq!(field(&reply, "m"), None);
    }
}

//! The `+switch-master` listener on one Sentinel: a long-lived subscription that makes the
//! store move the moment a failover ends, instead of when a call next fails.
//!
//! Every Sentinel has its own listener: the one that led the failover publishes first, and the
//! others only hear of it a moment later. A listener that loses its Sentinel, or hears nothing
//! (not even the answer to its `PING`) for [`SILENT`], connects again after [`AGAIN`]. On each
//! message for our master, and after each (re)subscription (a switch may have been missed
//! meanwhile), all the Sentinels are asked ([`Sentinels::refresh`]); the message itself only
//! says that it is time to ask.

use std::sync::Weak;
use std::time::Duration;

use crate::store::resp::{Error, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::super::{auth, exchange, tcp, words, Stream, Tls};
use super::{text, IntoError, Sentinels};
use crate::store::resp::{encode_command, parse};

/// How often a listener pings its Sentinel (and sees whether the store is still there).
const PING_EVERY: Duration = Duration::from_secs(1);
/// A Sentinel that sends nothing for this long is taken for hung.
const SILENT: Duration = Duration::from_secs(3);
/// The wait before a listener connects again.
const AGAIN: Duration = Duration::from_secs(1);

/// Listens on Sentinel `at` until the Sentinels are dropped.
pub(super) async fn listen(
    sentinels: Weak<Sentinels>,
    at: usize,
    tls: Option<Tls>,
    within: Duration,
) {
    loop {
        let Some(node) = sentinels.upgrade().map(|s| s.nodes[at].clone()) else {
            return;
        };
        let subscribed = async {
            let mut stream = tcp(&node.host, node.port, tls.as_ref()).await?;
            let mut commands = auth(node.username.as_deref(), node.password.as_deref());
            commands.push(words(&[b"SUBSCRIBE", b"+switch-master"]));
            exchange(&mut stream, &commands).await?;
            Ok::<_, Error>(stream)
        };
        let ended = match tokio::time::timeout(within, subscribed).await {
            Ok(Ok(stream)) => match stream {
                Stream::Tcp(s) => heard(s, &sentinels, tls.as_ref(), within).await,
                Stream::Tls(s) => heard(*s, &sentinels, tls.as_ref(), within).await,
                Stream::Unix(s) => heard(s, &sentinels, tls.as_ref(), within).await,
            },
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("no subscription within {within:?}").into_error()),
        };
        match ended {
            Ok(()) => return,
            Err(e) => tracing::debug!(sentinel = %format!("{}:{}", node.host, node.port),
                error = %e, "redis sentinel: +switch-master listener lost; again in {AGAIN:?}"),
        }
        tokio::time::sleep(AGAIN).await;
    }
}

/// Reads the messages of one subscription; `Ok` when the Sentinels are dropped.
async fn heard<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    sentinels: &Weak<Sentinels>,
    tls: Option<&Tls>,
    within: Duration,
) -> Result<(), Error> {
    refresh(sentinels, tls, within).await;
    let mut ping = Vec::new();
    encode_command(&mut ping, &[b"PING"]);
    let mut input = Vec::with_capacity(512);
    let mut last_heard = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(PING_EVERY);
    loop {
        tokio::select! {
            read = stream.read_buf(&mut input) => {
                if read? == 0 {
                    return Err("the Sentinel closed the connection".to_owned().into_error());
                }
                last_heard = tokio::time::Instant::now();
                let mut at = 0;
                while let Some((message, used)) = parse(&input[at..])? {
                    at += used;
                    if switched(&message, sentinels) {
                        refresh(sentinels, tls, within).await;
                    }
                }
                input.drain(..at);
            }
            _ = tick.tick() => {
                if sentinels.strong_count() == 0 {
                    return Ok(());
                }
                if last_heard.elapsed() > SILENT {
                    return Err(format!("the Sentinel sent nothing for {SILENT:?}").into_error());
                }
                stream.write_all(&ping).await?;
            }
        }
    }
}

/// Whether `message` is a `+switch-master` for our master; logs it.
fn switched(message: &Value, sentinels: &Weak<Sentinels>) -> bool {
    let Value::Array(parts) = message else {
        return false;
    };
    let (Some(kind), Some(payload)) = (parts.first().and_then(text), parts.get(2).and_then(text))
    else {
        return false;
    };
    let Some(sentinels) = sentinels.upgrade() else {
        return false;
    };
    // "<master name> <old ip> <old port> <new ip> <new port>"
    let ours = payload.split(' ').next() == Some(&*sentinels.master_name);
    if kind == "message" && ours {
        tracing::info!(switch = %payload, "redis sentinel: +switch-master");
    }
    kind == "message" && ours
}

async fn refresh(sentinels: &Weak<Sentinels>, tls: Option<&Tls>, within: Duration) {
    if let Some(sentinels) = sentinels.upgrade() {
        sentinels.refresh(tls, within).await;
    }
}

//! Opening a connection: the socket with its options, TLS, `AUTH` and `SELECT`, and for a
//! master that Sentinels name, the checks that it is the master.

use std::io;
use std::time::Duration;

use rustls_pki_types::ServerName;
use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use super::sentinel::{self, Sentinels};
use super::{closed, Addr, Endpoint, Tls};
use crate::store::resp::{encode_command, parse, Error, Value};

/// A Redis that vanishes without resetting the connection (host lost, packets dropped) must
/// still be noticed: unacknowledged writes fail after `TCP_USER_TIMEOUT`, idle connections are
/// probed by keepalive; the I/O error then breaks the connection and the next call makes a new
/// one. Per-call timeouts alone would never do that. The same settings serve redis-rs's
/// connections (the library path).
pub(crate) const USER_TIMEOUT: Duration = Duration::from_secs(5);

/// Keepalive probes after 10 s idle, every 2 s (see [`USER_TIMEOUT`]).
pub(crate) fn keepalive() -> TcpKeepalive {
    TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(2))
}

pub(crate) enum Stream {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    Unix(UnixStream),
}

/// Opens the socket and sends `AUTH` and `SELECT` as the URL asks. For a master named by
/// Sentinels, also the master it is on: see [`to_master`].
pub(super) async fn connect(
    endpoint: &Endpoint,
) -> Result<(Stream, Option<sentinel::Named>), Error> {
    let commands = handshake(endpoint);
    let mut stream = match &endpoint.addr {
        Addr::Tcp(host, port) => tcp(host, *port, endpoint.tls.as_ref()).await?,
        Addr::Unix(path) => Stream::Unix(UnixStream::connect(path).await?),
        Addr::Sentinel(sentinels) => {
            let (stream, named) = to_master(endpoint, sentinels, commands).await?;
            return Ok((stream, Some(named)));
        }
    };
    exchange(&mut stream, &commands).await?;
    Ok((stream, None))
}

/// The Sentinels' share of the connect timeout, for asking them all at once (twice: before and
/// after `ROLE`); the rest is for the master.
pub(super) fn asking(endpoint: &Endpoint) -> Duration {
    endpoint.connect_timeout / 3
}

/// Connects to the master the Sentinels name, once it answers `ROLE` as master and the
/// Sentinels, asked again after that answer, still name it (at the newest epoch): a Sentinel
/// that has not yet seen a failover may name a node that is a replica now, and a master that
/// hung may wake up still calling itself master after it was replaced.
async fn to_master(
    endpoint: &Endpoint,
    sentinels: &Sentinels,
    mut commands: Vec<Words>,
) -> Result<(Stream, sentinel::Named), Error> {
    let tls = endpoint.tls.as_ref();
    let named = sentinels.master(tls, asking(endpoint)).await?;
    commands.push(words(&[b"ROLE"]));
    let mut stream = tcp(&named.host, named.port, tls).await?;
    let replies = exchange(&mut stream, &commands).await?;
    sentinel::check_role(replies.last(), &named.host, named.port)?;
    let still = sentinels.master(tls, asking(endpoint)).await?;
    if still.host != named.host || still.port != named.port || !sentinels.name(&still) {
        return Err(Error::io(
            io::ErrorKind::ConnectionRefused,
            format!(
                "{}:{} answered as master, but the Sentinels name another now",
                named.host, named.port
            ),
        ));
    }
    sentinels.connected(&still.host, still.port);
    Ok((stream, still))
}

/// A TCP connection (TLS over it with `tls`), with the socket options of every Redis
/// connection.
pub(crate) async fn tcp(host: &str, port: u16, tls: Option<&Tls>) -> Result<Stream, Error> {
    let stream = TcpStream::connect((host, port)).await?;
    stream.set_nodelay(true)?;
    let sock = SockRef::from(&stream);
    sock.set_tcp_keepalive(&keepalive())?;
    sock.set_tcp_user_timeout(Some(USER_TIMEOUT))?;
    let Some(tls) = tls else {
        return Ok(Stream::Tcp(stream));
    };
    let name = tls.server_name.as_deref().unwrap_or(host).to_owned();
    let name = ServerName::try_from(name).map_err(|e| Error::TlsName(e.to_string()))?;
    let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
    Ok(Stream::Tls(Box::new(
        connector.connect(name, stream).await?,
    )))
}

/// One command's words, for the exchanges before a connection serves calls.
pub(crate) type Words = Vec<Vec<u8>>;

/// `AUTH` and `SELECT`, as the endpoint asks.
fn handshake(endpoint: &Endpoint) -> Vec<Words> {
    let mut commands = auth(endpoint.username.as_deref(), endpoint.password.as_deref());
    if endpoint.db != 0 {
        commands.push(words(&[b"SELECT", endpoint.db.to_string().as_bytes()]));
    }
    commands
}

/// `AUTH [username] password`, when there is a password.
pub(crate) fn auth(username: Option<&str>, password: Option<&str>) -> Vec<Words> {
    let Some(password) = password else {
        return Vec::new();
    };
    let mut auth = vec![b"AUTH".to_vec()];
    auth.extend(username.map(|u| u.as_bytes().to_vec()));
    auth.push(password.as_bytes().to_vec());
    vec![auth]
}

pub(crate) fn words(words: &[&[u8]]) -> Words {
    words.iter().map(|w| w.to_vec()).collect()
}

/// Sends `commands` and reads a reply to each, before the connection serves calls; an error
/// reply fails the whole exchange.
pub(crate) async fn exchange(stream: &mut Stream, commands: &[Words]) -> Result<Vec<Value>, Error> {
    match stream {
        Stream::Tcp(s) => exchange_on(s, commands).await,
        Stream::Tls(s) => exchange_on(&mut **s, commands).await,
        Stream::Unix(s) => exchange_on(s, commands).await,
    }
}

async fn exchange_on<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    commands: &[Words],
) -> Result<Vec<Value>, Error> {
    if commands.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for command in commands {
        let words: Vec<&[u8]> = command.iter().map(Vec::as_slice).collect();
        encode_command(&mut out, &words);
    }
    stream.write_all(&out).await?;
    let mut input = Vec::with_capacity(256);
    let mut replies = Vec::with_capacity(commands.len());
    while replies.len() < commands.len() {
        if stream.read_buf(&mut input).await? == 0 {
            return Err(closed());
        }
        let mut at = 0;
        while let Some((value, used)) = parse(&input[at..])? {
            at += used;
            replies.push(value.checked()?);
        }
        input.drain(..at);
    }
    Ok(replies)
}

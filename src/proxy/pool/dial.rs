//! How a connection to an upstream's target is made: TCP, then TLS for `https://` with the
//! upstream's own trust and client certificate, offering the HTTP versions its `protocol`
//! allows. What TLS negotiated then says whether the connection speaks HTTP/2.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::tls::{ALPN_H2, ALPN_HTTP1};

/// The HTTP version spoken to an upstream (`upstreams.NAME.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// `http1`: HTTP/1.1 only
    Http1,
    /// `http2`: HTTP/2 only; over `http://` with prior knowledge (h2c)
    Http2,
    /// `auto`: what TLS negotiates (ALPN, `h2` preferred) on `https://`, HTTP/1.1 on `http://`
    #[default]
    Auto,
}

impl Protocol {
    /// The name written in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http1 => "http1",
            Protocol::Http2 => "http2",
            Protocol::Auto => "auto",
        }
    }
}

/// How the connections to one upstream's targets are made.
pub struct Dial {
    protocol: Protocol,
    /// TLS offering what `protocol` speaks
    tls: TlsConnector,
    /// TLS offering HTTP/1.1 only, for requests that switch protocols (WebSocket)
    tls_http1: TlsConnector,
    /// the name the server's certificate is checked for, instead of the target's host
    server_name: Option<ServerName<'static>>,
    /// how HTTP/2 connections are kept
    h2: H2Settings,
}

/// How one upstream's HTTP/2 connections are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct H2Settings {
    /// a PING goes out after this long without a frame from the peer
    pub keepalive_interval: Duration,
    /// an unanswered PING closes the connection after this long
    pub keepalive_timeout: Duration,
    /// connections per target, when the open ones have no stream free
    pub max_connections: usize,
}

impl Default for H2Settings {
    fn default() -> H2Settings {
        H2Settings {
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(5),
            max_connections: 4,
        }
    }
}

impl std::fmt::Debug for Dial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dial")
            .field("protocol", &self.protocol)
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl Dial {
    /// Connections speaking `protocol`, over TLS set up as `tls` (its ALPN list is replaced),
    /// checking certificates for `server_name` when one is given.
    pub fn new(
        protocol: Protocol,
        tls: ClientConfig,
        server_name: Option<ServerName<'static>>,
    ) -> Dial {
        let offered: &[&[u8]] = match protocol {
            Protocol::Http1 => &[ALPN_HTTP1],
            Protocol::Http2 => &[ALPN_H2],
            Protocol::Auto => &[ALPN_H2, ALPN_HTTP1],
        };
        let with = |alpn: &[&[u8]]| {
            let mut config = tls.clone();
            config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            TlsConnector::from(Arc::new(config))
        };
        Dial {
            protocol,
            tls: with(offered),
            tls_http1: with(&[ALPN_HTTP1]),
            server_name,
            h2: H2Settings::default(),
        }
    }

    /// The same, keeping HTTP/2 connections as `h2` says.
    pub fn with_http2(mut self, h2: H2Settings) -> Dial {
        self.h2 = h2;
        self
    }

    /// How HTTP/2 connections are kept.
    pub(super) fn h2_settings(&self) -> H2Settings {
        self.h2
    }

    /// `auto` with the default TLS setup, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Arc<Dial> {
        let tls = crate::tls::ClientTls::default()
            .client_config()
            .expect("the defaults read no file");
        Arc::new(Dial::new(Protocol::Auto, (*tls).clone(), None))
    }

    /// The HTTP version spoken.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Whether a request to a `scheme` target goes over HTTP/2 before any connection says so.
    pub(super) fn h2_only(&self) -> bool {
        self.protocol == Protocol::Http2
    }

    /// `tcp` made ready to speak HTTP to the target at `scheme://authority`: TLS for `https`.
    /// With `switching` (a WebSocket handshake) only HTTP/1.1 is offered.
    pub(super) async fn over(
        &self,
        tcp: TcpStream,
        scheme: &Scheme,
        authority: &Authority,
        switching: bool,
    ) -> io::Result<Opened> {
        if *scheme != Scheme::HTTPS {
            let h2 = self.h2_only() && !switching;
            return Ok(Opened {
                stream: Stream::Plain(tcp),
                h2,
            });
        }
        let name = match &self.server_name {
            Some(name) => name.clone(),
            None => {
                let host = authority.host();
                // an IPv6 literal comes in brackets
                let host = host.trim_start_matches('[').trim_end_matches(']');
                ServerName::try_from(host.to_owned())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?
            }
        };
        let tls = if switching {
            &self.tls_http1
        } else {
            &self.tls
        };
        let stream = tls.connect(name, tcp).await?;
        let negotiated_h2 = stream.get_ref().1.alpn_protocol() == Some(ALPN_H2);
        // `http2` speaks HTTP/2 even to a server that chose no protocol by ALPN
        let h2 = !switching && (negotiated_h2 || self.h2_only());
        Ok(Opened {
            stream: Stream::Tls(Box::new(stream)),
            h2,
        })
    }
}

/// A new connection, ready for HTTP.
pub(super) struct Opened {
    pub stream: Stream,
    /// it speaks HTTP/2
    pub h2: bool,
}

/// A connection to a target, in the clear or over TLS.
pub(super) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
